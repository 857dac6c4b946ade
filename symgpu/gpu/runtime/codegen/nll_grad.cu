// The gradient reaching a softmax's logits from the negative log-likelihood of integer labels
// (symgpu/gpu/ops/nll_grad.py); entry points instantiated per dtype and label dtype.
/* out (rows x cols, C-contiguous) = g - m * s, where g is zero but for g[i, y[i]] = v[i] in
   the first `labelled` rows, and s[i] is g's row sum (v[i] there, 0 below): what
   ``scatter(v at (i, y_i)) - m * rowsum(scatter)`` computes, in one pass. v is read with
   stride vs (0: broadcast), or is the one value vconst where v is null (a loss's -1/n,
   computed on the host from the labels' count), y with ys, m through element strides (ms0, ms1). A label out of
   [-cols, cols) is reported (negative ones count from the end, as the scatter's) and its row
   gets no one-hot term: the host raises at its next sync. With EXP_M, m holds logarithms
   (a log-softmax the loss already computed): m's values are exp(m). T is the storage type,
   V the type computed in (float for the half types: sg_load/sg_store, common.cuh). With a
   `copy` (H not void), each value is stored there too, rounded to H: the half copy a
   mixed-precision step casts the gradient to for its products. */
__device__ __forceinline__ float nll_grad_exp(float x) { return expf(x); }
__device__ __forceinline__ double nll_grad_exp(double x) { return exp(x); }

template <typename T, typename V, typename I, bool EXP_M, typename H = T, bool COPY = false>
__device__ __forceinline__ void nll_grad_body(const T *v, long long vs, double vconst, const T *m,
    long long ms0, long long ms1, const I *y, long long ys, T *out, long long rows,
    long long cols, long long labelled, unsigned long long *err, H *copy = 0)
{
    const long long total = rows * cols;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += step) {
        const long long i = k / cols, j = k - i * cols;
        V g = V(0), s = V(0);
        if (i < labelled) {
            long long label = (long long)y[i * ys];
            if (label < 0) label += cols;
            if (label < 0 || label >= cols) {
                if (j == 0) report(err, (long long)y[i * ys]);
            } else {
                s = v ? (V)sg_load(v[i * vs]) : (V)vconst;
                if (j == label) g = s;
            }
        }
        const V mk = (V)sg_load(m[i * ms0 + j * ms1]);
        const V value = g - (EXP_M ? nll_grad_exp(mk) : mk) * s;
        sg_store(out[k], value);
        if (COPY) sg_store(copy[k], value);
    }
}
//@ grad

extern "C" __global__ void ${name}(const ${t} *v, long long vs, double vconst, const ${t} *m,
    long long ms0, long long ms1, const ${it} *y, long long ys, ${t} *out, long long rows,
    long long cols, long long labelled, unsigned long long *err)
{ nll_grad_body<${t}, ${vt}, ${it}, ${exp_m}>(v, vs, vconst, m, ms0, ms1, y, ys, out, rows, cols,
                                       labelled, err); }
//@ copy

extern "C" __global__ void ${name}(const ${t} *v, long long vs, double vconst, const ${t} *m,
    long long ms0, long long ms1, const ${it} *y, long long ys, ${t} *out, ${h} *copy,
    long long rows, long long cols, long long labelled, unsigned long long *err)
{ nll_grad_body<${t}, ${vt}, ${it}, ${exp_m}, ${h}, true>(v, vs, vconst, m, ms0, ms1, y, ys, out,
                                                     rows, cols, labelled, err, copy); }
