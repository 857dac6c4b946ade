// The small kernels around cuSOLVER/cuBLAS of GPU linear algebra (symgpu/gpu/ops/linalg.py):
// pointer arrays for the batched library calls, LAPACK info checks reported through a
// device-check slot (device_checks.py's report(), pasted before this text), layout
// transposes, the Cholesky factor's clean-up, symmetrisation, the determinant from an LU
// factorisation and the eigh gradient's middle matrix and fold. Matrices are row-major
// (C order), `batch` of them one after the other. Entry points instantiated per dtype.
__device__ __forceinline__ float lin_nan(float) { return __int_as_float(0x7fffffff); }
__device__ __forceinline__ double lin_nan(double)
{
    return __longlong_as_double(0x7ff8000000000000LL);
}

#define LIN_LOOP(i, total) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (total); \
         i += (long long)gridDim.x * blockDim.x)

/* out[i] = base + i * stride (bytes): the pointer array of a batched library call, built on
   the device so that it is captured with the call and costs no host work per matrix. */
extern "C" __global__ void linalg_ptrs(unsigned long long *out, unsigned long long base,
                                       long long stride, long long count)
{
    LIN_LOOP(i, count) out[i] = base + (unsigned long long)(i * stride);
}

/* A nonzero LAPACK info of matrix i is reported as (i << 32) | (info & 0xffffffff). */
extern "C" __global__ void linalg_check_info(const int *info, long long count,
                                             unsigned long long *slot)
{
    LIN_LOOP(i, count) {
        const int v = info[i];
        if (v != 0)
            report(slot, (long long)((i << 32) | (long long)(unsigned int)v));
    }
}

/* dst (cols x rows) = src^T (rows x cols) for each matrix; a matrix starts every src_stride
   (dst_stride) elements, so a leading block of a larger buffer can be read (written). */
template <typename T>
__device__ __forceinline__ void transpose_body(T *dst, const T *src, long long rows,
                                               long long cols, long long batch,
                                               long long dst_stride, long long src_stride,
                                               bool lower_only = false)
{
    __shared__ T tile[32][33];
    const long long c0 = (long long)blockIdx.x * 32, r0 = (long long)blockIdx.y * 32;
    if (lower_only && r0 + 31 < c0)     /* a tile wholly above src's diagonal: not wanted */
        return;
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        const T *s = src + b * src_stride;
        T *d = dst + b * dst_stride;
        for (int k = threadIdx.y; k < 32; k += blockDim.y) {
            const long long r = r0 + k, c = c0 + threadIdx.x;
            if (r < rows && c < cols)
                tile[k][threadIdx.x] = s[r * cols + c];
        }
        __syncthreads();
        for (int k = threadIdx.y; k < 32; k += blockDim.y) {
            const long long c = c0 + k, r = r0 + threadIdx.x;
            if (r < rows && c < cols)
                d[c * rows + r] = tile[threadIdx.x][k];
        }
        __syncthreads();
    }
}

/* Zero the triangle a Cholesky factor does not use (cuSOLVER leaves the input there; SciPy
   returns zeros); matrices whose info is nonzero become NaN when nan_fill is set. */
template <typename T>
__device__ __forceinline__ void tri_body(T *a, long long n, long long batch, int keep_lower,
                                         const int *info, int nan_fill)
{
    LIN_LOOP(idx, n * n * batch) {
        const long long b = idx / (n * n), r = idx % (n * n), i = r / n, j = r % n;
        if (nan_fill && info[b] != 0)
            a[idx] = lin_nan(T(0));
        else if (keep_lower ? j > i : j < i)
            a[idx] = T(0);
    }
}

/* dst = the symmetric matrix whose lower (from_lower) or upper triangle is src's. */
template <typename T>
__device__ __forceinline__ void symm_body(T *dst, const T *src, long long n, long long batch,
                                          int from_lower)
{
    LIN_LOOP(idx, n * n * batch) {
        const long long b = idx / (n * n), r = idx % (n * n), i = r / n, j = r % n;
        const bool own = from_lower ? i >= j : i <= j;
        dst[idx] = own ? src[idx] : src[b * n * n + j * n + i];
    }
}

template <typename T>
__device__ __forceinline__ void eye_body(T *a, long long n, long long batch)
{
    LIN_LOOP(idx, n * n * batch) {
        const long long r = idx % (n * n);
        a[idx] = (r / n == r % n) ? T(1) : T(0);
    }
}

/* A zero on the diagonal of a triangular matrix (SciPy's solve_triangular raises for it) is
   reported as (matrix << 32) | (row + 1). */
template <typename T>
__device__ __forceinline__ void diag_body(const T *a, long long n, long long batch,
                                          unsigned long long *slot)
{
    LIN_LOOP(idx, n * batch) {
        const long long b = idx / n, i = idx % n;
        if (a[b * n * n + i * n + i] == T(0))
            report(slot, (long long)((b << 32) | (i + 1)));
    }
}

/* det = prod(diag(LU)) * (-1)^(rows swapped): one block of 256 threads per matrix. */
template <typename T>
__device__ __forceinline__ void det_body(T *out, const T *lu, const int *ipiv, long long n,
                                         long long batch)
{
    __shared__ T prod[256];
    __shared__ int swaps[256];
    for (long long b = blockIdx.x; b < batch; b += gridDim.x) {
        T p = T(1);
        int s = 0;
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            p *= lu[b * n * n + i * (n + 1)];
            s += ipiv[b * n + i] != (int)(i + 1);
        }
        prod[threadIdx.x] = p;
        swaps[threadIdx.x] = s;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) {
                prod[threadIdx.x] *= prod[threadIdx.x + k];
                swaps[threadIdx.x] += swaps[threadIdx.x + k];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0)
            out[b] = (swaps[0] & 1) ? -prod[0] : prod[0];
        __syncthreads();
    }
}

/* The eigh gradient's middle matrix: m[a, c] = p[c, a] / (w[a] - w[c]) off the diagonal,
   gw[a] on it (p = V^T gv), as EighGrad.perform computes it. */
template <typename T>
__device__ __forceinline__ void eighgrad_mid_body(T *m, const T *p, const T *w, const T *gw,
                                                  long long n, long long batch)
{
    LIN_LOOP(idx, n * n * batch) {
        const long long b = idx / (n * n), r = idx % (n * n), a = r / n, c = r % n;
        m[idx] = a == c ? gw[b * n + a]
                        : p[b * n * n + c * n + a] / (w[b * n + a] - w[b * n + c]);
    }
}

/* The opposite triangle folded onto the one eigh reads: lower, out[i, j] = g[i, j] + g[j, i]
   below the diagonal, g[i, i] on it, 0 above (upper: the mirror image). */
template <typename T>
__device__ __forceinline__ void fold_body(T *out, const T *g, long long n, long long batch,
                                          int lower)
{
    LIN_LOOP(idx, n * n * batch) {
        const long long b = idx / (n * n), r = idx % (n * n), i = r / n, j = r % n;
        const bool own = lower ? i > j : i < j;
        if (i == j)
            out[idx] = g[idx];
        else
            out[idx] = own ? g[idx] + g[b * n * n + j * n + i] : T(0);
    }
}
/* dst[b][i] = src[b * src_stride + i], i < per: the leading part of each matrix's buffer. */
template <typename T>
__device__ __forceinline__ void take_body(T *dst, const T *src, long long per,
                                          long long src_stride, long long batch)
{
    LIN_LOOP(idx, per * batch) {
        const long long b = idx / per, i = idx % per;
        dst[idx] = src[b * src_stride + i];
    }
}

/* QR's R from geqrf's column-major m x n result a (a matrix every `stride` elements):
   r[b][i][j] = a[j * m + i] on and above the diagonal, 0 below, rows i < rows_out. */
template <typename T>
__device__ __forceinline__ void qr_r_body(T *r, const T *a, long long m, long long n,
                                          long long rows_out, long long stride,
                                          long long batch)
{
    LIN_LOOP(idx, rows_out * n * batch) {
        const long long b = idx / (rows_out * n), e = idx % (rows_out * n);
        const long long i = e / n, j = e % n;
        r[idx] = (i <= j && i < m) ? a[b * stride + j * m + i] : T(0);
    }
}

/* dst (row-major) = the factor cuSOLVER's lower potrf left in w's column-major lower
   triangle, read row-major as L: dst[i][j] = w[j * n + i] for j <= i, 0 above the diagonal
   (tiles wholly above it are written without reading w), NaN everywhere in a failed matrix
   with nan_fill: the transpose back and the clean-up in one pass, reading half of w. */
template <typename T>
__device__ __forceinline__ void factor_out_body(T *dst, const T *w, long long n,
                                                long long batch, const int *info,
                                                int nan_fill)
{
    __shared__ T tile[32][33];
    const long long c0 = (long long)blockIdx.x * 32, r0 = (long long)blockIdx.y * 32;
    const bool zeros = c0 > r0 + 31;    /* every j > i in this tile */
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        const bool failed = nan_fill && info[b] != 0;
        const T *s = w + b * n * n;
        T *d = dst + b * n * n;
        if (!zeros && !failed)
            for (int k = threadIdx.y; k < 32; k += blockDim.y) {
                const long long j = c0 + k, i = r0 + threadIdx.x;
                if (i < n && j < n)
                    tile[k][threadIdx.x] = s[j * n + i];
            }
        __syncthreads();
        for (int k = threadIdx.y; k < 32; k += blockDim.y) {
            const long long i = r0 + k, j = c0 + threadIdx.x;
            if (i < n && j < n)
                d[i * n + j] = failed ? lin_nan(T(0)) : (j > i ? T(0) : tile[threadIdx.x][k]);
        }
        __syncthreads();
    }
}

/* Cholesky of small matrices (n <= N), one thread block of N threads per matrix held in
   shared memory: the lower triangle of the symmetric matrix (the row-major lower triangle
   of x, or the transpose of its upper one) is loaded, factored right-looking (thread t owns
   row t: at step k it scales its entry of column k, then updates its row), and written as
   L (lower) or U = L^T with the other triangle zero; info[b] = k + 1 when the pivot of step
   k is not positive (LAPACK's), and the matrix becomes NaN with nan_fill. */
template <typename T, int N>
__device__ __forceinline__ void potrf_small_body(T *out, const T *x, long long n,
                                                 long long batch, int lower, int *info,
                                                 int nan_fill)
{
    __shared__ T s[N][N + 1];
    __shared__ int failed;
    const int t = threadIdx.x;
    for (long long b = blockIdx.x; b < batch; b += gridDim.x) {
        const T *xb = x + b * n * n;
        T *ob = out + b * n * n;
        for (long long e = t; e < n * n; e += blockDim.x) {
            const int i = (int)(e / n), j = (int)(e % n);
            if (lower) {
                if (j <= i)
                    s[i][j] = xb[e];
            } else if (j >= i) {
                s[j][i] = xb[e];
            }
        }
        if (t == 0)
            failed = 0;
        __syncthreads();
        for (int k = 0; k < n; ++k) {
            const T d = s[k][k];
            if (!(d > T(0))) {          /* not positive, or NaN: every thread stops here */
                if (t == 0)
                    failed = k + 1;
                break;
            }
            const T root = sqrt(d);
            __syncthreads();            /* every thread has read the pivot */
            if (t == k)
                s[k][k] = root;
            else if (t > k && t < n)
                s[t][k] /= root;
            __syncthreads();
            if (t > k && t < n) {
                const T l = s[t][k];
                for (int j = k + 1; j <= t; ++j)
                    s[t][j] -= l * s[j][k];
            }
            __syncthreads();
        }
        __syncthreads();
        const int f = failed;
        if (t == 0)
            info[b] = f;
        for (long long e = t; e < n * n; e += blockDim.x) {
            const int i = (int)(e / n), j = (int)(e % n);
            T v;
            if (f && nan_fill)
                v = lin_nan(T(0));
            else if (lower)
                v = j <= i ? s[i][j] : T(0);
            else
                v = j >= i ? s[j][i] : T(0);
            ob[e] = v;
        }
        __syncthreads();                /* before the next matrix overwrites s */
    }
}
//@ entries
extern "C" __global__ void linalg_transpose_${name}(${t} *dst, const ${t} *src, long long rows,
                                                  long long cols, long long batch,
                                                  long long dst_stride, long long src_stride)
{
    transpose_body<${t}>(dst, src, rows, cols, batch, dst_stride, src_stride);
}

extern "C" __global__ void linalg_transpose_lower_${name}(${t} *dst, const ${t} *src,
                                                        long long n, long long batch)
{
    transpose_body<${t}>(dst, src, n, n, batch, n * n, n * n, true);
}

extern "C" __global__ void linalg_factor_out_${name}(${t} *dst, const ${t} *w, long long n,
                                                   long long batch, const int *info,
                                                   int nan_fill)
{
    factor_out_body<${t}>(dst, w, n, batch, info, nan_fill);
}

extern "C" __global__ void linalg_take_${name}(${t} *dst, const ${t} *src, long long per,
                                             long long src_stride, long long batch)
{
    take_body<${t}>(dst, src, per, src_stride, batch);
}

extern "C" __global__ void linalg_qr_r_${name}(${t} *r, const ${t} *a, long long m, long long n,
                                             long long rows_out, long long stride,
                                             long long batch)
{
    qr_r_body<${t}>(r, a, m, n, rows_out, stride, batch);
}

extern "C" __global__ void linalg_potrf32_${name}(${t} *out, const ${t} *x, long long n,
                                                long long batch, int lower, int *info,
                                                int nan_fill)
{
    potrf_small_body<${t}, 32>(out, x, n, batch, lower, info, nan_fill);
}

extern "C" __global__ void linalg_potrf64_${name}(${t} *out, const ${t} *x, long long n,
                                                long long batch, int lower, int *info,
                                                int nan_fill)
{
    potrf_small_body<${t}, 64>(out, x, n, batch, lower, info, nan_fill);
}

extern "C" __global__ void linalg_tri_${name}(${t} *a, long long n, long long batch,
                                            int keep_lower, const int *info, int nan_fill)
{
    tri_body<${t}>(a, n, batch, keep_lower, info, nan_fill);
}

extern "C" __global__ void linalg_symm_${name}(${t} *dst, const ${t} *src, long long n,
                                             long long batch, int from_lower)
{
    symm_body<${t}>(dst, src, n, batch, from_lower);
}

extern "C" __global__ void linalg_eye_${name}(${t} *a, long long n, long long batch)
{
    eye_body<${t}>(a, n, batch);
}

extern "C" __global__ void linalg_check_diag_${name}(const ${t} *a, long long n,
                                                   long long batch, unsigned long long *slot)
{
    diag_body<${t}>(a, n, batch, slot);
}

extern "C" __global__ void linalg_det_${name}(${t} *out, const ${t} *lu, const int *ipiv,
                                            long long n, long long batch)
{
    det_body<${t}>(out, lu, ipiv, n, batch);
}

extern "C" __global__ void linalg_eighgrad_mid_${name}(${t} *m, const ${t} *p, const ${t} *w,
                                                     const ${t} *gw, long long n,
                                                     long long batch)
{
    eighgrad_mid_body<${t}>(m, p, w, gw, n, batch);
}

extern "C" __global__ void linalg_fold_${name}(${t} *out, const ${t} *g, long long n,
                                             long long batch, int lower)
{
    fold_body<${t}>(out, g, n, batch, lower);
}
