// Theano's fused classifier ops (symgpu/gpu/ops/xent_softmax.py): the NLL, softmax and argmax
// of x + b in one pass per row, and the NLL's gradient at x. softmax_rows.cu's device code
// (sr_exp, sr_log, sr_max, sr_reduce) and report.cu are pasted before this.

/* The smallest of v over the threads that share a row (a warp, or with WIDE the block). */
template <bool WIDE>
__device__ __forceinline__ long long xs_min(long long v, long long *shared)
{
    for (int o = 16; o > 0; o >>= 1) {
        const long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    if (!WIDE) return v;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : 0x7fffffffffffffffLL;
    for (int o = 16; o > 0; o >>= 1) {
        const long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}

/* Row r of x + b (x through element strides xs0, xs1; b through bs), k long: sm[r, :] =
   exp(v - max) / sum (C-contiguous), am[r] = the first j where v is the max (NaN: the first
   NaN, as NumPy), nll[r] = -v[y[r]] + max + log(sum). A label outside [0, k) is reported
   (the node's slot) and its nll left unwritten. A warp per row, or with WIDE the block. */
template <typename T, typename V, typename I, bool WIDE>
__device__ __forceinline__ void xent_sm_body(const T *x, long long xs0, long long xs1,
    const T *b, long long bs, const I *y, long long ys, T *nll, T *sm, I *am, long long rows,
    long long k, unsigned long long *err)
{
#define XS_V(j) ((V)sg_load(xr[(j) * xs1]) + (V)sg_load(b[(j) * bs]))
    __shared__ V shared[32];
    __shared__ long long shared_i[32];
    const int per_block = WIDE ? 1 : (blockDim.x >> 5);
    const int first = WIDE ? threadIdx.x : (threadIdx.x & 31);
    const int stride = WIDE ? blockDim.x : 32;
    const long long step = (long long)gridDim.x * per_block;
    for (long long r = (long long)blockIdx.x * per_block + (WIDE ? 0 : (threadIdx.x >> 5));
         r < rows; r += step) {
        const T *xr = x + r * xs0;
        T *srow = sm + r * k;
        V m = -INFINITY;
        for (long long j = first; j < k; j += stride) m = sr_max(m, XS_V(j));
        m = sr_reduce<V, false, WIDE>(m, shared);
        long long at = 0x7fffffffffffffffLL;
        for (long long j = first; j < k; j += stride) {
            const V v = XS_V(j);
            if ((v == m || (m != m && v != v)) && j < at) at = j;
        }
        at = xs_min<WIDE>(at, shared_i);
        V s = V(0);
        for (long long j = first; j < k; j += stride) s += sr_exp(XS_V(j) - m);
        s = sr_reduce<V, true, WIDE>(s, shared);
        for (long long j = first; j < k; j += stride) sg_store(srow[j], sr_exp(XS_V(j) - m) / s);
        if (first == 0) {
            am[r] = (I)(at < k ? at : 0);
            const long long label = (long long)y[r * ys];
            if (label < 0 || label >= k) report(err, label);
            else sg_store(nll[r], -XS_V(label) + m + sr_log(s));
        }
    }
#undef XS_V
}

/* dx (n x k, C-contiguous) = dy_r * sm[r, c] - (c == y[r] ? dy_r : 0), computed in W (the
   wider of dy's and sm's value types), dy read with stride dys (0: one value for all rows),
   sm through (ss0, ss1); a label outside [0, k) reported (with k == 0 every row's is). */
template <typename T, typename G, typename W, typename I>
__device__ __forceinline__ void xent_dx_body(const G *dy, long long dys, const T *sm,
    long long ss0, long long ss1, const I *y, long long ys, T *dx, long long n, long long k,
    unsigned long long *err)
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
        const W d = (W)sg_load(dy[r * dys]);
        const W v = d * (W)sg_load(sm[r * ss0 + c * ss1]);
        sg_store(dx[i], c == j ? v - d : v);
    }
}
//@ fwd

extern "C" __global__ void ${name}(const ${t} *x, long long xs0, long long xs1,
    const ${t} *b, long long bs, const ${it} *y, long long ys, ${t} *nll, ${t} *sm,
    ${it} *am, long long rows, long long k, unsigned long long *err)
{ xent_sm_body<${t}, ${vt}, ${it}, ${wide}>(x, xs0, xs1, b, bs, y, ys, nll, sm, am, rows, k, err); }
//@ dx

extern "C" __global__ void ${name}(const ${gt} *dy, long long dys, const ${t} *sm,
    long long ss0, long long ss1, const ${it} *y, long long ys, ${t} *dx, long long n,
    long long k, unsigned long long *err)
{ xent_dx_body<${t}, ${gt}, ${wt}, ${it}>(dy, dys, sm, ss0, ss1, y, ys, dx, n, k, err); }
