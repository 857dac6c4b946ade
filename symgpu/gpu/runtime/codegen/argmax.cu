// argmax / argmin along the last axis, one block per row (symgpu/gpu/ops/nnet.py);
// entry points instantiated per dtype.
/* preferred(a, b): a strictly beats b. NaN beats everything (NumPy's argmax/argmin return
   the first NaN); a != a is false for integers. */
template <typename T, bool MAX>
__device__ __forceinline__ bool preferred(T a, T b)
{
    const bool an = a != a, bn = b != b;
    if (an || bn) return an && !bn;
    return MAX ? (a > b) : (a < b);
}

template <typename T, bool MAX>
__device__ __forceinline__ void arg_body(const T *x, long long *out, long long rows,
                                         long long n, T *sv, long long *si)
{
    const int tid = threadIdx.x;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *r = x + row * n;
        T best = T(0);
        long long bi = -1;
        for (long long j = tid; j < n; j += blockDim.x) {
            const T v = r[j];
            if (bi < 0 || preferred<T, MAX>(v, best)) { best = v; bi = j; }
        }
        sv[tid] = best;
        si[tid] = bi;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) {
                const T v = sv[tid + s];
                const long long i = si[tid + s];
                const T c = sv[tid];
                const long long ci = si[tid];
                if (i >= 0 && (ci < 0 || preferred<T, MAX>(v, c)
                               || (!preferred<T, MAX>(c, v) && i < ci))) {
                    sv[tid] = v;
                    si[tid] = i;
                }
            }
            __syncthreads();
        }
        if (tid == 0) out[row] = si[0];
        __syncthreads();
    }
}
//@ arg

extern "C" __global__ void ${name}(const ${ctype} *x, long long *out,
                                                      long long rows, long long n)
{
    __shared__ ${ctype} sv[${block}];
    __shared__ long long si[${block}];
    arg_body<${ctype}, ${is_max}>(x, out, rows, n, sv, si);
}
