// The direct filter gradient of a convolution whose filter is small (symgpu/gpu/ops/
// conv_wgrad.py): dW[f, c, taps] = sum over images n and output positions p of
// x[n, group(f) * cg + c, p * stride + tap * dilation - pad] * dy[n, f, p].
// 2-d runs as 3-d with one plane (D = od = kd = 1).  Two passes, no float atomics, so a result
// is the same at every call: blocks (chunk, f) each reduce one chunk of (n, p) into a partial
// dW of f in registers (one accumulator per tap: K = cg * kd * kh * kw <= KMAX), summed over the
// block through shuffles and shared memory in a fixed order; then one thread per dW element
// sums the chunks' partials in order.  Indices are ints: the op only offers this kernel where
// every index fits (conv_wgrad.py's `eligible`).
struct WgradGeo {
    int N, C, O, cg, og, D, H, W, od, oh, ow, kd, kh, kw, s0, s1, s2, d0, d1, d2, p0, p1, p2;
    int K, flip, padded, chunk_len, chunks;
};

enum { WGRAD_THREADS = 256, WGRAD_WARPS = WGRAD_THREADS / 32 };

/* part[(f * K + k) * chunks + chunk]: the chunk's sum of tap k of filter f (A: float for
   float32 and the half dtypes, double for float64) */
template <typename T, typename A, int KMAX>
__device__ void wgrad_partial_body(const T *x, const T *dy, A *part, const WgradGeo g)
{
    /* tap k (C order over (c, a, b, e)) reads x at the output position's corner plus
       (c, a', b', e') * dilation, where (a', b', e') = (a, b, e), flipped for a convolution */
    __shared__ int tap_off[KMAX], tap_d[KMAX], tap_h[KMAX], tap_w[KMAX];
    /* read through volatile in the loop: hoisted into registers, 4 * KMAX values spill */
    const volatile int *toff = tap_off, *td = tap_d, *th = tap_h, *tw = tap_w;
    __shared__ A red[KMAX][WGRAD_WARPS];
    const int f = blockIdx.y, chunk = blockIdx.x, tid = threadIdx.x;
    const int ksp = g.kd * g.kh * g.kw;
    if (tid < g.K) {
        const int c = tid / ksp, r = tid - c * ksp;
        int a = r / (g.kh * g.kw), b = (r / g.kw) % g.kh, e = r % g.kw;
        if (g.flip) { a = g.kd - 1 - a; b = g.kh - 1 - b; e = g.kw - 1 - e; }
        tap_d[tid] = a * g.d0; tap_h[tid] = b * g.d1; tap_w[tid] = e * g.d2;
        tap_off[tid] = ((c * g.D + tap_d[tid]) * g.H + tap_h[tid]) * g.W + tap_w[tid];
    }
    __syncthreads();
    A acc[KMAX];
#pragma unroll
    for (int k = 0; k < KMAX; ++k) acc[k] = A(0);
    const int P = g.od * g.oh * g.ow, HW = g.H * g.W;
    const int cbase = (f / g.og) * g.cg;
    const int lo = chunk * g.chunk_len;
    const int hi = min(lo + g.chunk_len, g.N * P);
    for (int q = lo + tid; q < hi; q += WGRAD_THREADS) {
        const int n = q / P, p = q - n * P;
        const int k3 = p % g.ow, j = (p / g.ow) % g.oh, i = p / (g.ow * g.oh);
        const A gv = (A)sg_load(dy[(n * g.O + f) * P + p]);
        const int id = i * g.s0 - g.p0, ih = j * g.s1 - g.p1, iw = k3 * g.s2 - g.p2;
        const int base = (n * g.C + cbase) * g.D * HW + (id * g.H + ih) * g.W + iw;
#pragma unroll
        for (int k = 0; k < KMAX; ++k) {
            if (k < g.K) {
                if (g.padded) {
                    const int dd = id + td[k], hh = ih + th[k], ww = iw + tw[k];
                    if (dd < 0 || dd >= g.D || hh < 0 || hh >= g.H || ww < 0 || ww >= g.W)
                        continue;
                }
                acc[k] += gv * (A)sg_load(x[base + toff[k]]);
            }
        }
    }
    const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int k = 0; k < KMAX; ++k) {
        if (k < g.K) {
            A v = acc[k];
            for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(0xffffffffu, v, s);
            if (lane == 0) red[k][warp] = v;
        }
    }
    __syncthreads();
    if (tid < g.K) {
        A s = A(0);
        for (int w = 0; w < WGRAD_WARPS; ++w) s += red[tid][w];
        part[(f * g.K + tid) * g.chunks + chunk] = s;
    }
}

/* dw[t] = the sum of its chunks' partials, in chunk order (t = f * K + k: dW's C order) */
template <typename T, typename A>
__device__ void wgrad_sum_body(const A *part, T *dw, const WgradGeo g)
{
    const int total = g.O * g.K;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const A *row = part + t * g.chunks;
        A s = A(0);
        for (int c = 0; c < g.chunks; ++c) s += row[c];
        sg_store(dw[t], s);
    }
}
//@ partial
extern "C" __global__ void __launch_bounds__(WGRAD_THREADS) wgrad_partial_${dt}_k${kmax}(const ${t} *x, const ${t} *dy, ${a} *part, const WgradGeo g) { wgrad_partial_body<${t}, ${a}, ${kmax}>(x, dy, part, g); }
//@ sum
extern "C" __global__ void wgrad_sum_${dt}(const ${a} *part, ${t} *dw, const WgradGeo g) { wgrad_sum_body<${t}, ${a}>(part, dw, g); }
