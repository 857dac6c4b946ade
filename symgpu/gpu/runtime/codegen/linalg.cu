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

template <typename T>
__device__ __forceinline__ void transpose_body(T *dst, const T *src, long long rows,
                                               long long cols, long long batch)
{
    __shared__ T tile[32][33];
    const long long c0 = (long long)blockIdx.x * 32, r0 = (long long)blockIdx.y * 32;
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        const T *s = src + b * rows * cols;
        T *d = dst + b * rows * cols;
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
//@ entries
extern "C" __global__ void linalg_transpose_${name}(${t} *dst, const ${t} *src, long long rows,
                                                  long long cols, long long batch)
{
    transpose_body<${t}>(dst, src, rows, cols, batch);
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
