// Integer-label categorical cross-entropy and its gradient with checked labels
// (symgpu/gpu/ops/crossentropy.py); entry points instantiated per dtype. Values are read with
// sg_load and written with sg_store (common.cuh, pasted before this): the half types are
// computed in float.
__device__ __forceinline__ float ce_log(float v) { return logf(v); }
__device__ __forceinline__ double ce_log(double v) { return log(v); }

/* out[i] = -log(p[i, y[i]]) for n rows of k classes; p read through element strides
   (ps0, ps1), y through ys. A label outside [0, k) is reported (report(): the node's slot,
   device_checks.py) and its row left unwritten: the host raises at its next sync. */
template <typename T, typename V, typename I>
__device__ __forceinline__ void ce1hot_body(const T *p, long long ps0, long long ps1,
                                            const I *y, long long ys, T *out, long long n,
                                            long long k, unsigned long long *err)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const long long j = (long long)y[i * ys];
        if (j < 0 || j >= k) {
            report(err, j);
            continue;
        }
        sg_store(out[i], -ce_log((V)sg_load(p[i * ps0 + j * ps1])));
    }
}

/* out (n x k, C-contiguous) = -g[i] / p[i, y[i]] at (i, y[i]) and 0 elsewhere, the quotient
   computed in W (the wider of T's and G's value types, as NumPy), rounded to T on the store;
   g read with stride gs (0: broadcast).
   With k == 0 every row is still checked (its labels are all out of range). */
template <typename T, typename G, typename W, typename I>
__device__ __forceinline__ void ce1hot_grad_body(const G *g, long long gs, const T *p,
                                                 long long ps0, long long ps1, const I *y,
                                                 long long ys, T *out, long long n,
                                                 long long k, unsigned long long *err)
{
    const long long rr = k ? k : 1;
    const long long total = n * rr;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const long long r = i / rr, c = i - r * rr;
        const long long j = (long long)y[r * ys];
        if (j < 0 || j >= k) {
            if (c == 0) report(err, j);
            continue;
        }
        sg_store(out[i], (c == j) ? -(W)sg_load(g[r * gs]) / (W)sg_load(p[r * ps0 + j * ps1])
                                  : W(0));
    }
}
//@ fwd

extern "C" __global__ void ${name}(const ${t} *p, long long ps0, long long ps1,
    const ${it} *y, long long ys, ${t} *out, long long n, long long k, unsigned long long *err)
{ ce1hot_body<${t}, ${vt}, ${it}>(p, ps0, ps1, y, ys, out, n, k, err); }
//@ grad

extern "C" __global__ void ${name}(const ${gt} *g, long long gs,
    const ${t} *p, long long ps0, long long ps1, const ${it} *y, long long ys, ${t} *out,
    long long n, long long k, unsigned long long *err)
{ ce1hot_grad_body<${t}, ${gt}, ${wt}, ${it}>(g, gs, p, ps0, ps1, y, ys, out, n, k, err); }
