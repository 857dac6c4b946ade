/* symgpu: a matrix product's bias and activation applied after a classic cuBLAS product
 * (symgpu/gpu/ops/gemm_epilogue.py), where cuBLASLt, which applies them inside the product
 * (CUBLASLT_EPILOGUE_BIAS / RELU_BIAS), is off, missing or declines the problem:
 *
 *     out[r, c] = act(out[r, c] + bias[c])     out: rows x cols, C-contiguous
 *
 * computed in the value type (float for the half dtypes: loaded, added, rounded once on
 * store); relu is symgpu's switch(x < 0, 0, x), so NaN stays NaN. */
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
