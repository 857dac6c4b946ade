// 2-d pooling, its gradient and its gradient's gradient with Theano's semantics
// (symgpu/gpu/ops/pooling.py); entry points instantiated per dtype and index type.
/* I: the index type, int where every index of the call fits (32-bit division and modulo are
   several times cheaper than 64-bit ones, which the compiler emulates), else long long. */
template <typename I>
struct PoolGeo { I L, H, W, ho, wo, ws0, ws1, st0, st1, p0, p1; };

/* Window (i, j) in input coordinates: the padded extent [rs, re) x [cs, ce) and the part
   inside the image [r0, r1) x [c0, c1) (Theano's region for the non-inc_pad modes). */
template <typename I>
__device__ __forceinline__ void pool_window(const PoolGeo<I> &g, I i, I j, I &rs, I &re, I &cs,
    I &ce, I &r0, I &r1, I &c0, I &c1)
{
    rs = i * g.st0 - g.p0; re = min(rs + g.ws0, g.H + g.p0);
    cs = j * g.st1 - g.p1; ce = min(cs + g.ws1, g.W + g.p1);
    r0 = max(rs, (I)0); r1 = min(re, g.H); c0 = max(cs, (I)0); c1 = min(ce, g.W);
}

template <typename T, typename I>
__device__ __forceinline__ T pool_divisor(int mode, I rs, I re, I cs, I ce, I r0, I r1, I c0,
    I c1)
{
    if (mode == 2) return (T)((re - rs) * (ce - cs));
    if (mode == 3) return (T)((r1 - r0) * (c1 - c0));
    return T(1);
}

/* mode: 0 max, 1 sum, 2 average_inc_pad, 3 average_exc_pad */
template <typename T, typename I>
__device__ void pool_fwd_body(const T *x, T *z, PoolGeo<I> g, int mode)
{
    const I total = g.L * g.ho * g.wo, step = (I)gridDim.x * blockDim.x;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const I j = t % g.wo, i = (t / g.wo) % g.ho, l = t / (g.wo * g.ho);
        I rs, re, cs, ce, r0, r1, c0, c1;
        pool_window(g, i, j, rs, re, cs, ce, r0, r1, c0, c1);
        const T *xl = x + l * g.H * g.W;
        T acc = mode == 0 ? xl[r0 * g.W + c0] : T(0);
        for (I r = r0; r < r1; ++r)
            for (I c = c0; c < c1; ++c) {
                const T v = xl[r * g.W + c];
                if (mode == 0) { if (v > acc || v != v) acc = (acc != acc) ? acc : v; }
                else acc += v;
            }
        z[t] = mode >= 2 ? acc / pool_divisor<T>(mode, rs, re, cs, ce, r0, r1, c0, c1) : acc;
    }
}

/* What a gradient kernel stores: the sum itself, or an elementwise op of it and x (E,
   symgpu/gpu/ops/pooling_epilogue.py) */
template <typename T>
struct PoolPlainStore {
    __device__ __forceinline__ T operator()(const T acc, const T *x, long long t) const
    { return acc; }
};

/* gx[l, r, c] = E(sum over the windows containing (r, c) of (max: x == z) gz / divisor) */
template <typename T, typename I, typename E>
__device__ void pool_grad_body(const T *x, const T *z, const T *gz, T *gx, PoolGeo<I> g,
                               int mode, const E &store)
{
    const I total = g.L * g.H * g.W, step = (I)gridDim.x * blockDim.x;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const I c = t % g.W, r = (t / g.W) % g.H, l = t / (g.W * g.H);
        const I ilo = r + g.p0 - g.ws0 >= 0 ? (r + g.p0 - g.ws0) / g.st0 + 1 : 0;
        const I ihi = min((r + g.p0) / g.st0, g.ho - 1);
        const I jlo = c + g.p1 - g.ws1 >= 0 ? (c + g.p1 - g.ws1) / g.st1 + 1 : 0;
        const I jhi = min((c + g.p1) / g.st1, g.wo - 1);
        const T xv = mode == 0 ? x[t] : T(0);
        T acc = T(0);
        for (I i = ilo; i <= ihi; ++i)
            for (I j = jlo; j <= jhi; ++j) {
                const I o = (l * g.ho + i) * g.wo + j;
                if (mode == 0) { if (xv == z[o]) acc += gz[o]; continue; }
                I rs, re, cs, ce, r0, r1, c0, c1;
                pool_window(g, i, j, rs, re, cs, ce, r0, r1, c0, c1);
                acc += gz[o] / pool_divisor<T>(mode, rs, re, cs, ce, r0, r1, c0, c1);
            }
        gx[t] = store(acc, x, t);
    }
}

/* ggz[l, i, j] = sum of ggx over window (i, j)'s elements equal to its max */
template <typename T, typename I>
__device__ void pool_ggrad_body(const T *x, const T *z, const T *ggx, T *ggz, PoolGeo<I> g)
{
    const I total = g.L * g.ho * g.wo, step = (I)gridDim.x * blockDim.x;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const I j = t % g.wo, i = (t / g.wo) % g.ho, l = t / (g.wo * g.ho);
        I rs, re, cs, ce, r0, r1, c0, c1;
        pool_window(g, i, j, rs, re, cs, ce, r0, r1, c0, c1);
        const I base = l * g.H * g.W;
        T acc = T(0);
        for (I r = r0; r < r1; ++r)
            for (I c = c0; c < c1; ++c)
                if (x[base + r * g.W + c] == z[t]) acc += ggx[base + r * g.W + c];
        ggz[t] = acc;
    }
}
//@ fwd
extern "C" __global__ void pool_fwd_${dt}${sfx}(const ${t} *x, ${t} *z, ${geo}, int mode) { ${make} pool_fwd_body<${t}, ${i}>(x, z, g, mode); }
//@ grad
extern "C" __global__ void pool_grad_${dt}${sfx}(const ${t} *x, const ${t} *z, const ${t} *gz, ${t} *gx, ${geo}, int mode) { ${make} pool_grad_body<${t}, ${i}>(x, z, gz, gx, g, mode, PoolPlainStore<${t}>()); }
//@ ggrad
extern "C" __global__ void pool_ggrad_${dt}${sfx}(const ${t} *x, const ${t} *z, const ${t} *ggx, ${t} *ggz, ${geo}) { ${make} pool_ggrad_body<${t}, ${i}>(x, z, ggx, ggz, g); }
//@ epilogue_store

struct PoolEpilogueStore {
    __device__ __forceinline__ ${t} operator()(const ${t} acc, const ${t} *x, long long t) const
    { ${vt} r; sg_epilogue(${args}, r); return (${t})r; }
};
//@ grad_epi
extern "C" __global__ void pool_grad_epi${sfx}(const ${t} *x, const ${t} *z, const ${t} *gz, ${t} *gx, ${geo}, int mode) { ${make} pool_grad_body<${t}, ${i}>(x, z, gz, gx, g, mode, PoolEpilogueStore()); }
