// argmax / argmin along the last axis, one block per row (symgpu/gpu/ops/nnet.py);
// entry points instantiated per dtype: T the storage type, V the type compared in (float for
// the half types: sg_load, common.cuh, pasted before this).
/* preferred(a, b): a strictly beats b. NaN beats everything (NumPy's argmax/argmin return
   the first NaN); a != a is false for integers. */
template <typename T, bool MAX>
__device__ __forceinline__ bool preferred(T a, T b)
{
    const bool an = a != a, bn = b != b;
    if (an || bn) return an && !bn;
    return MAX ? (a > b) : (a < b);
}

template <typename T, typename V, bool MAX>
__device__ __forceinline__ void arg_body(const T *x, long long *out, long long rows,
                                         long long n, V *sv, long long *si)
{
    const int tid = threadIdx.x;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *r = x + row * n;
        V best = V(0);
        long long bi = -1;
        for (long long j = tid; j < n; j += blockDim.x) {
            const V v = (V)sg_load(r[j]);
            if (bi < 0 || preferred<V, MAX>(v, best)) { best = v; bi = j; }
        }
        sv[tid] = best;
        si[tid] = bi;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) {
                const V v = sv[tid + s];
                const long long i = si[tid + s];
                const V c = sv[tid];
                const long long ci = si[tid];
                if (i >= 0 && (ci < 0 || preferred<V, MAX>(v, c)
                               || (!preferred<V, MAX>(c, v) && i < ci))) {
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
    __shared__ ${vtype} sv[${block}];
    __shared__ long long si[${block}];
    arg_body<${ctype}, ${vtype}, ${is_max}>(x, out, rows, n, sv, si);
}
