// 2-d and 3-d pooling, its gradient and its gradient's gradient with Theano's semantics
// (symgpu/gpu/ops/pooling.py); entry points instantiated per dtype and index type.  The 3-d
// bodies (section body3, pool3_*) follow the 2-d ones axis for axis in a module of their own,
// so the 2-d module stays as it was.
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
/* the epilogue's operands besides the sum and x: arrays of x's shape (e.g. relu's mask),
   read at the stored element's index */
struct PoolEpilogueStore {
${members}
    __device__ __forceinline__ ${t} operator()(const ${t} acc, const ${t} *x, long long t) const
    { ${vt} r; sg_epilogue(${args}, r); return (${t})r; }
};
//@ grad_epi
extern "C" __global__ void pool_grad_epi${sfx}(const ${t} *x, const ${t} *z, const ${t} *gz, ${t} *gx, ${geo}, int mode${params}) { ${make} const PoolEpilogueStore st = {${fields}}; pool_grad_body<${t}, ${i}>(x, z, gz, gx, g, mode, st); }
//@ body3
/* 3-d: (L, D, H, W) input, (L, od, oh, ow) output; axis a has window ws[a], stride st[a] and
   padding p[a]. */
template <typename I>
struct PoolGeo3 { I L, D, H, W, od, oh, ow, ws0, ws1, ws2, st0, st1, st2, p0, p1, p2; };

/* One axis of window i: padded extent [s, e), the part inside the input [a0, a1). */
template <typename I>
__device__ __forceinline__ void pool_span(I i, I st, I p, I ws, I n, I &s, I &e, I &a0, I &a1)
{
    s = i * st - p; e = min(s + ws, n + p); a0 = max(s, (I)0); a1 = min(e, n);
}

/* The first output index along an axis whose window contains input position r, and the
   last: [lo, hi] (empty when lo > hi). */
template <typename I>
__device__ __forceinline__ void pool_cover(I r, I st, I p, I ws, I no, I &lo, I &hi)
{
    lo = r + p - ws >= 0 ? (r + p - ws) / st + 1 : 0;
    hi = min((r + p) / st, no - 1);
}

template <typename T, typename I>
__device__ __forceinline__ T pool3_divisor(int mode, const I s[3], const I e[3], const I a0[3],
    const I a1[3])
{
    if (mode == 2) return (T)((e[0] - s[0]) * (e[1] - s[1]) * (e[2] - s[2]));
    if (mode == 3) return (T)((a1[0] - a0[0]) * (a1[1] - a0[1]) * (a1[2] - a0[2]));
    return T(1);
}

template <typename I>
__device__ __forceinline__ void pool3_window(const PoolGeo3<I> &g, I i, I j, I k, I s[3],
    I e[3], I a0[3], I a1[3])
{
    pool_span(i, g.st0, g.p0, g.ws0, g.D, s[0], e[0], a0[0], a1[0]);
    pool_span(j, g.st1, g.p1, g.ws1, g.H, s[1], e[1], a0[1], a1[1]);
    pool_span(k, g.st2, g.p2, g.ws2, g.W, s[2], e[2], a0[2], a1[2]);
}

/* mode: 0 max, 1 sum, 2 average_inc_pad, 3 average_exc_pad (as in 2-d) */
template <typename T, typename I>
__device__ void pool3_fwd_body(const T *x, T *z, PoolGeo3<I> g, int mode)
{
    const I total = g.L * g.od * g.oh * g.ow, step = (I)gridDim.x * blockDim.x;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const I k = t % g.ow, j = (t / g.ow) % g.oh, i = (t / (g.ow * g.oh)) % g.od;
        const I l = t / (g.ow * g.oh * g.od);
        I s[3], e[3], a0[3], a1[3];
        pool3_window(g, i, j, k, s, e, a0, a1);
        const T *xl = x + l * g.D * g.H * g.W;
        T acc = mode == 0 ? xl[(a0[0] * g.H + a0[1]) * g.W + a0[2]] : T(0);
        for (I d = a0[0]; d < a1[0]; ++d)
            for (I r = a0[1]; r < a1[1]; ++r)
                for (I c = a0[2]; c < a1[2]; ++c) {
                    const T v = xl[(d * g.H + r) * g.W + c];
                    if (mode == 0) { if (v > acc || v != v) acc = (acc != acc) ? acc : v; }
                    else acc += v;
                }
        z[t] = mode >= 2 ? acc / pool3_divisor<T>(mode, s, e, a0, a1) : acc;
    }
}

/* gx[l, d, r, c] = E(sum over the windows containing (d, r, c) of (max: x == z) gz /
   divisor), E as in 2-d */
template <typename T, typename I, typename E>
__device__ void pool3_grad_body(const T *x, const T *z, const T *gz, T *gx, PoolGeo3<I> g,
                                int mode, const E &store)
{
    const I total = g.L * g.D * g.H * g.W, step = (I)gridDim.x * blockDim.x;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const I c = t % g.W, r = (t / g.W) % g.H, d = (t / (g.W * g.H)) % g.D;
        const I l = t / (g.W * g.H * g.D);
        I ilo, ihi, jlo, jhi, klo, khi;
        pool_cover(d, g.st0, g.p0, g.ws0, g.od, ilo, ihi);
        pool_cover(r, g.st1, g.p1, g.ws1, g.oh, jlo, jhi);
        pool_cover(c, g.st2, g.p2, g.ws2, g.ow, klo, khi);
        const T xv = mode == 0 ? x[t] : T(0);
        T acc = T(0);
        for (I i = ilo; i <= ihi; ++i)
            for (I j = jlo; j <= jhi; ++j)
                for (I k = klo; k <= khi; ++k) {
                    const I o = ((l * g.od + i) * g.oh + j) * g.ow + k;
                    if (mode == 0) { if (xv == z[o]) acc += gz[o]; continue; }
                    I s[3], e[3], a0[3], a1[3];
                    pool3_window(g, i, j, k, s, e, a0, a1);
                    acc += gz[o] / pool3_divisor<T>(mode, s, e, a0, a1);
                }
        gx[t] = store(acc, x, t);
    }
}

/* The same gradient where windows do not overlap and nothing is padded (every stride at
   least its window): one thread per window writes its whole tile of gx -- the window's
   elements and the uncovered ones after it up to the next window (the input's end for the
   last), as zeros -- so z and gz are read once per window and no index is divided per input
   element (the per-element kernel above took 34 us a call for the 3-D CNN's pooling
   gradients on the H200, PyTorch's 4.4 us).  E applies to every element of the tile, the
   uncovered ones' zeros included. */
template <typename T, typename I, typename E>
__device__ void pool3_gradt_body(const T *x, const T *z, const T *gz, T *gx, PoolGeo3<I> g,
                                 int mode, const E &store)
{
    const I total = g.L * g.od * g.oh * g.ow, step = (I)gridDim.x * blockDim.x;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const I k = t % g.ow, j = (t / g.ow) % g.oh, i = (t / (g.ow * g.oh)) % g.od;
        const I l = t / (g.ow * g.oh * g.od);
        I s[3], e[3], a0[3], a1[3];
        pool3_window(g, i, j, k, s, e, a0, a1);
        const T zv = mode == 0 ? z[t] : T(0);
        const T v = T(0) + (mode == 0 ? gz[t] : gz[t] / pool3_divisor<T>(mode, s, e, a0, a1));
        const I d1 = i == g.od - 1 ? g.D : (i + 1) * g.st0;
        const I r1 = j == g.oh - 1 ? g.H : (j + 1) * g.st1;
        const I c1 = k == g.ow - 1 ? g.W : (k + 1) * g.st2;
        const I base = l * g.D * g.H * g.W;
        for (I d = a0[0]; d < d1; ++d)
            for (I r = a0[1]; r < r1; ++r) {
                const I row = base + (d * g.H + r) * g.W;
                const bool in_dr = d < a1[0] && r < a1[1];
                for (I c = a0[2]; c < c1; ++c) {
                    T out = T(0);
                    if (in_dr && c < a1[2])
                        out = mode == 0 ? (x[row + c] == zv ? v : T(0)) : v;
                    gx[row + c] = store(out, x, row + c);
                }
            }
    }
}

/* ggz[l, i, j, k] = sum of ggx over window (i, j, k)'s elements equal to its max */
template <typename T, typename I>
__device__ void pool3_ggrad_body(const T *x, const T *z, const T *ggx, T *ggz, PoolGeo3<I> g)
{
    const I total = g.L * g.od * g.oh * g.ow, step = (I)gridDim.x * blockDim.x;
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const I k = t % g.ow, j = (t / g.ow) % g.oh, i = (t / (g.ow * g.oh)) % g.od;
        const I l = t / (g.ow * g.oh * g.od);
        I s[3], e[3], a0[3], a1[3];
        pool3_window(g, i, j, k, s, e, a0, a1);
        const I base = l * g.D * g.H * g.W;
        T acc = T(0);
        for (I d = a0[0]; d < a1[0]; ++d)
            for (I r = a0[1]; r < a1[1]; ++r)
                for (I c = a0[2]; c < a1[2]; ++c) {
                    const I q = base + (d * g.H + r) * g.W + c;
                    if (x[q] == z[t]) acc += ggx[q];
                }
        ggz[t] = acc;
    }
}
//@ fwd3
extern "C" __global__ void pool3_fwd_${dt}${sfx}(const ${t} *x, ${t} *z, ${geo}, int mode) { ${make} pool3_fwd_body<${t}, ${i}>(x, z, g, mode); }
//@ grad3
extern "C" __global__ void pool3_grad_${dt}${sfx}(const ${t} *x, const ${t} *z, const ${t} *gz, ${t} *gx, ${geo}, int mode) { ${make} pool3_grad_body<${t}, ${i}>(x, z, gz, gx, g, mode, PoolPlainStore<${t}>()); }
//@ gradt3
extern "C" __global__ void pool3_gradt_${dt}${sfx}(const ${t} *x, const ${t} *z, const ${t} *gz, ${t} *gx, ${geo}, int mode) { ${make} pool3_gradt_body<${t}, ${i}>(x, z, gz, gx, g, mode, PoolPlainStore<${t}>()); }
//@ ggrad3
extern "C" __global__ void pool3_ggrad_${dt}${sfx}(const ${t} *x, const ${t} *z, const ${t} *ggx, ${t} *ggz, ${geo}) { ${make} pool3_ggrad_body<${t}, ${i}>(x, z, ggx, ggz, g); }
//@ grad3_epi
extern "C" __global__ void pool3_grad_epi${sfx}(const ${t} *x, const ${t} *z, const ${t} *gz, ${t} *gx, ${geo}, int mode${params}) { ${make} const PoolEpilogueStore st = {${fields}}; pool3_grad_body<${t}, ${i}>(x, z, gz, gx, g, mode, st); }
//@ gradt3_epi
extern "C" __global__ void pool3_gradt_epi${sfx}(const ${t} *x, const ${t} *z, const ${t} *gz, ${t} *gx, ${geo}, int mode${params}) { ${make} const PoolEpilogueStore st = {${fields}}; pool3_gradt_body<${t}, ${i}>(x, z, gz, gx, g, mode, st); }
