/* symgpu: a matrix product's epilogue applied after a classic cuBLAS product
 * (symgpu/gpu/ops/gemm_epilogue.py), where cuBLASLt, which applies it inside the product
 * (CUBLASLT_EPILOGUE_BIAS / RELU_BIAS / GELU_AUX_BIAS / DGELU), is off, missing or declines
 * the problem.  out: rows x cols, C-contiguous, holding the product rounded to its dtype:
 *
 *     ge_bias_act:  out[r, c] = act(out[r, c] + bias[c])         act: identity or relu
 *     ge_gelu:      v = out[r, c] + bias[c]; aux[r, c] = v; out[r, c] = gelu(v)   (grad 0)
 *                   out[r, c] = gelu(out[r, c] + bias[c])                         (grad 2)
 *                   out[r, c] = out[r, c] * gelu'(aux[r, c])                      (grad 1)
 *
 * computed in the value type (float for the half dtypes: loaded, computed, rounded once on
 * store); relu is symgpu's switch(x < 0, 0, x), so NaN stays NaN.  GELU is cuBLASLt's tanh
 * form, with the accurate tanhf / tanh (not the hardware's approximate tanh). */

__device__ __forceinline__ float ge_tanh(const float z) { return tanhf(z); }
__device__ __forceinline__ double ge_tanh(const double z) { return tanh(z); }

/* tanh(k0 (z + k1 z^3)), k0 = sqrt(2 / pi), k1 = 0.044715 */
template <typename V> __device__ __forceinline__ V ge_gelu_t(const V z)
{
    return ge_tanh((V)0.7978845608028654 * (z + (V)0.044715 * z * z * z));
}

/* gelu(z) = 0.5 z (1 + t) */
template <typename V> __device__ __forceinline__ V ge_gelu(const V z)
{
    return (V)0.5 * z * ((V)1 + ge_gelu_t(z));
}

/* gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) k0 (1 + 3 k1 z^2); the second term is 0 where
 * t^2 rounds to 1 (|z| large: there z^2 may overflow, and 0 * inf would be NaN) */
template <typename V> __device__ __forceinline__ V ge_dgelu(const V z)
{
    const V t = ge_gelu_t(z), s = (V)1 - t * t;
    const V d = (V)0.5 * z * s * (V)0.7978845608028654 * ((V)1 + (V)(3 * 0.044715) * z * z);
    return (V)0.5 * ((V)1 + t) + (s != (V)0 ? d : (V)0);
}
//@ entry
extern "C" __global__ void ge_bias_act_${dt}(${t} *out, const ${t} *bias, long long rows,
                                             long long cols, int relu)
{
    const long long total = rows * cols, step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        ${v} v = (${v})sg_load(out[i]) + (${v})sg_load(bias[i % cols]);
        if (relu && v < (${v})0) v = (${v})0;
        sg_store(out[i], v);
    }
}

/* grad 0: GELU_AUX_BIAS (aux written, bias read); grad 1: DGELU (aux read, bias unused);
 * grad 2: GELU_BIAS (bias read, no aux) */
extern "C" __global__ void ge_gelu_${dt}(${t} *out, ${t} *aux, const ${t} *bias,
                                         long long rows, long long cols, int grad)
{
    const long long total = rows * cols, step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const ${v} p = (${v})sg_load(out[i]);
        if (grad == 1) {
            sg_store(out[i], p * ge_dgelu((${v})sg_load(aux[i])));
        } else {
            const ${v} v = p + (${v})sg_load(bias[i % cols]);
            if (grad == 0) sg_store(aux[i], v);
            sg_store(out[i], ge_gelu(v));
        }
    }
}
