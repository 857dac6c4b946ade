// Fused attention, FlashAttention-2 style (symgpu/gpu/ops/attention.py): the forward (o and
// the rows' log-sum-exp) and the backward (dq, dk, dv recomputing P from the lse), for
// __half / __nv_bfloat16 (mma.sync m16n8k16, float32 accumulation) and float (3xTF32
// m16n8k8: two TF32 products per pair of operands plus the big*big one, float32 accuracy;
// 1xTF32 where the module is built with AT_FAST_TF32, gpuarray.allow_tf32). The backward's
// device code is attention_bwd.cu, pasted after this file's; the entry points are here.
// Tiles live in shared memory (cp.async, zero-filled past the ends, rows padded by 16 bytes so
// that ldmatrix's eight row addresses fall in distinct banks); every warp owns 16 (or 16 * MT)
// rows of the block and keeps its accumulators in registers in the mma C layout:
//   lane = 4 * g + t: C[0..3] = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// An A operand (16 x 16) is 8 values: (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1) and the same
// 8 columns on; a B operand (16 x 8) is 4: (2t, g) (2t+1, g) (2t+8, g) (2t+9, g). Two C tiles
// side by side are exactly an A operand (the probabilities feed P @ V without shared memory).
// 16-bit operands come from shared memory by ldmatrix (.trans where the tile is stored k-major).
#define AT_BM 64             // backward: query rows per step; keys per block
#define AT_BN 64             // keys per tile (backward; the forward's is its template's BN)
#define AT_THREADS 128       // backward: 4 warps x 16 keys
#define AT_LOG2E 1.4426950408889634f
#define AT_LN2 0.6931471805599453f

/* 2^x in one MUFU.EX2 (exp2f keeps denormal results with extra instructions: a probability
   under 2^-126 is 0 here) */
__device__ __forceinline__ float at_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <typename T> struct AtFrag;

template <> struct AtFrag<__half> {
    typedef unsigned A[4];
    typedef unsigned B[2];
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned *>(&h);
    }
    static __device__ __forceinline__ unsigned pack2(__half lo, __half hi) {
        __half2 h = __halves2half2(lo, hi);
        return *reinterpret_cast<unsigned *>(&h);
    }
    static __device__ __forceinline__ void mma(float c[4], const A a, const B b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

template <> struct AtFrag<__nv_bfloat16> {
    typedef unsigned A[4];
    typedef unsigned B[2];
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned *>(&h);
    }
    static __device__ __forceinline__ unsigned pack2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
        __nv_bfloat162 h = __halves2bfloat162(lo, hi);
        return *reinterpret_cast<unsigned *>(&h);
    }
    static __device__ __forceinline__ void mma(float c[4], const A a, const B b) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

/* x rounded to TF32 (to nearest, ties away from zero: cvt.rna.tf32.f32's result for finite
   x) with two integer operations: cvt.rna is slow on sm_90 (the float32 backward 1.17 against
   0.92 ms on the GPT shape) */
__device__ __forceinline__ unsigned at_tf32(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

__device__ __forceinline__ void at_mma_tf32(float c[4], unsigned a0, unsigned a1, unsigned a2,
                                            unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* x = big + small: big its TF32 rounding, small the exact rest, left as float bits (the
   tensor cores read a TF32 operand's top 19 bits: small is truncated, an error under 2^-10
   of small's, 2^-21 of x's). Rounding small as well cost 28% of the float32 backward's time
   (1.61 against 1.16 ms on the GPT shape, with cvt.rna) for no change in its error. */
__device__ __forceinline__ void at_split(float x, unsigned &big, unsigned &small) {
    big = at_tf32(x);
    small = __float_as_uint(x - __uint_as_float(big));
}

template <> struct AtFrag<float> {
    typedef float A[8];
    typedef float B[4];
    /* 3xTF32 over k = 8 of the 16: A values a[i0..] at k 2t, 2t+1 (TF32 slots t, t+4) */
    static __device__ __forceinline__ void half_step(float c[4], float x0, float x1, float x2,
                                                     float x3, float y0, float y1) {
#ifdef AT_FAST_TF32
        at_mma_tf32(c, at_tf32(x0), at_tf32(x1), at_tf32(x2), at_tf32(x3), at_tf32(y0),
                    at_tf32(y1));
        return;
#endif
        unsigned b0, b1, b2, b3, s0, s1, s2, s3, e0, e1, f0, f1;
        at_split(x0, b0, s0);
        at_split(x1, b1, s1);
        at_split(x2, b2, s2);
        at_split(x3, b3, s3);
        at_split(y0, e0, f0);
        at_split(y1, e1, f1);
        at_mma_tf32(c, s0, s1, s2, s3, e0, e1);
        at_mma_tf32(c, b0, b1, b2, b3, f0, f1);
        at_mma_tf32(c, b0, b1, b2, b3, e0, e1);
    }
    static __device__ __forceinline__ void mma(float c[4], const A a, const B b) {
        // slots: a0 (g, t) <- (g, 2t); a1 (g+8, t) <- (g+8, 2t); a2 (g, t+4) <- (g, 2t+1) ...
        half_step(c, a[0], a[2], a[1], a[3], b[0], b[1]);
        half_step(c, a[4], a[6], a[5], a[7], b[2], b[3]);
    }
};

__device__ __forceinline__ void at_ldsm4(unsigned r[4], const void *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void at_ldsm4t(unsigned r[4], const void *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* The A operand (16 x 16) at s: A(i, k) = s[i * ld + k], or s[k * ld + i] (TR). */
template <typename T, bool TR>
__device__ __forceinline__ void at_frag_a(typename AtFrag<T>::A a, const T *s, int ld) {
    const int lane = threadIdx.x & 31;
    if constexpr (sizeof(T) == 4) {
        const int g = lane >> 2, t = lane & 3, rs = TR ? 1 : ld, cs = TR ? ld : 1;
        const T *p0 = s + g * rs + (2 * t) * cs, *p1 = p0 + 8 * rs;
        a[0] = p0[0]; a[1] = p0[cs]; a[2] = p1[0]; a[3] = p1[cs];
        a[4] = p0[8 * cs]; a[5] = p0[9 * cs]; a[6] = p1[8 * cs]; a[7] = p1[9 * cs];
    } else {
        // lanes 8m .. 8m+7 address the rows of 8 x 8 matrix m: a[m] = (i 8(m&1).., k 8(m>>1)..)
        const int m = lane >> 3, r = lane & 7;
        if constexpr (TR)
            at_ldsm4t(a, s + (8 * (m >> 1) + r) * ld + 8 * (m & 1));
        else
            at_ldsm4(a, s + (8 * (m & 1) + r) * ld + 8 * (m >> 1));
    }
}

/* Two B operands (k 16 x n 8, n tiles 0-7 and 8-15) at s: B(k, n) = s[n * ld + k], or
   s[k * ld + n] (TR: the tile stored k-major). */
template <typename T, bool TR>
__device__ __forceinline__ void at_frag_b2(typename AtFrag<T>::B b0, typename AtFrag<T>::B b1,
                                           const T *s, int ld) {
    const int lane = threadIdx.x & 31;
    if constexpr (sizeof(T) == 4) {
        const int g = lane >> 2, t = lane & 3, ks = TR ? ld : 1, ns = TR ? 1 : ld;
        const T *p = s + g * ns + (2 * t) * ks, *q = p + 8 * ns;
        b0[0] = p[0]; b0[1] = p[ks]; b0[2] = p[8 * ks]; b0[3] = p[9 * ks];
        b1[0] = q[0]; b1[1] = q[ks]; b1[2] = q[8 * ks]; b1[3] = q[9 * ks];
    } else {
        // matrix m: n 8(m>>1).., k 8(m&1)..; b0 = {r0, r1}, b1 = {r2, r3}
        const int m = lane >> 3, r = lane & 7;
        unsigned x[4];
        if constexpr (TR)
            at_ldsm4t(x, s + (8 * (m & 1) + r) * ld + 8 * (m >> 1));
        else
            at_ldsm4(x, s + (8 * (m >> 1) + r) * ld + 8 * (m & 1));
        b0[0] = x[0]; b0[1] = x[1]; b1[0] = x[2]; b1[1] = x[3];
    }
}

/* The A operand made of two C tiles (columns 0-7 and 8-15 of a k = 16 chunk) */
template <typename T>
__device__ __forceinline__ void at_a_from_c(typename AtFrag<T>::A a, const float c0[4],
                                            const float c1[4]) {
    if constexpr (sizeof(T) == 4) {
        float *f = reinterpret_cast<float *>(a);
        f[0] = c0[0]; f[1] = c0[1]; f[2] = c0[2]; f[3] = c0[3];
        f[4] = c1[0]; f[5] = c1[1]; f[6] = c1[2]; f[7] = c1[3];
    } else {
        a[0] = AtFrag<T>::pack(c0[0], c0[1]);
        a[1] = AtFrag<T>::pack(c0[2], c0[3]);
        a[2] = AtFrag<T>::pack(c1[0], c1[1]);
        a[3] = AtFrag<T>::pack(c1[2], c1[3]);
    }
}

/* dst[0], dst[1] = x, y (one 4- or 8-byte store where the pair is aligned: PAIR) */
template <typename T>
__device__ __forceinline__ void at_store2(T *dst, float x, float y, bool pair, bool second) {
    if (pair) {
        if constexpr (sizeof(T) == 4)
            *reinterpret_cast<float2 *>(dst) = make_float2(x, y);
        else
            *reinterpret_cast<unsigned *>(dst) = AtFrag<T>::pack(x, y);
    } else {
        sg_store(dst[0], x);
        if (second) sg_store(dst[1], y);
    }
}

/* dst[0] += x, dst[1] += y (one 8-byte atomic where the pair is aligned: PAIR) */
__device__ __forceinline__ void at_add2(float *dst, float x, float y, bool pair, bool second) {
    if (pair) {
        atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(x, y));
    } else {
        atomicAdd(dst, x);
        if (second) atomicAdd(dst + 1, y);
    }
}

__device__ __forceinline__ void at_cp16(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void at_cp4(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(d), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void at_cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void at_cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void at_cp_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

/* rows [r0, r0 + ROWS) x columns [0, HD) of a (rows, d) matrix with row stride rs into the
   shared tile s (row stride LD), zeros past `rows` and `d`. VEC: d == HD and 16-byte aligned
   rows: cp.async (the caller commits and waits); else plain loads. */
template <typename T, int HD, int LD, int ROWS, int THREADS>
__device__ __forceinline__ void at_load_tile(T *s, const T *g, long long rs, int r0, int rows,
                                             int d, bool vec) {
    if (vec) {
        constexpr int CH = 16 / sizeof(T), PER_ROW = HD / CH;
#pragma unroll
        for (int c = threadIdx.x; c < ROWS * PER_ROW; c += THREADS) {
            const int r = c / PER_ROW, col = (c % PER_ROW) * CH;
            const bool ok = r0 + r < rows;
            at_cp16(s + r * LD + col, g + (long long)(ok ? r0 + r : 0) * rs + col, ok);
        }
    } else {
        for (int c = threadIdx.x; c < ROWS * HD; c += THREADS) {
            const int r = c / HD, col = c % HD;
            s[r * LD + col] = (r0 + r < rows && col < d) ? g[(long long)(r0 + r) * rs + col]
                                                         : T(0.0f);
        }
    }
}

/* n floats of g from i0 on into s (cp.async, 4 bytes each; zeros past n_all) */
template <int N, int THREADS>
__device__ __forceinline__ void at_load_row(float *s, const float *g, int i0, int n_all) {
    for (int i = threadIdx.x; i < N; i += THREADS) {
        const bool ok = i0 + i < n_all;
        at_cp4(s + i, g + (ok ? i0 + i : 0), ok);
    }
}

template <typename T> __device__ __forceinline__ float at_f(T x) { return sg_load(x); }

/* a score in log2 units with the mask's value at (query q, key k) added: the prescaled logits
   of the forward and of the backward (AtArgs or AtBwdArgs) */
template <typename A>
__device__ __forceinline__ float at_prescaled(const float s, const float sl2, const float *mask,
                                              const A &a, const int q, const int k)
{
    float x = s * sl2;
    if (mask && q < a.sq && k < a.sk) x += mask[q * a.msi + k * a.msj] * AT_LOG2E;
    return x;
}

/* Dropout on the probabilities (both kernels' arguments end with these): drop 0 none, else
   the draw's dtype (AT_DRAW_*); the generator state {key0, key1, ctr_lo, ctr_hi} on the
   device; an element is kept where its uniform, as tensor/random/philox.py lays a draw of the
   scores' shape out, is below keep (keep_f: keep in the draw's type, as a float); kept
   probabilities are multiplied by inv_div. */
#define AT_DRAW_F32 1
#define AT_DRAW_F64 2
#define AT_DRAW_F16 3
#define AT_DRAW_BF16 4
#define AT_DROP_FIELDS int drop; const unsigned *dstate; double keep_d; float keep_f, inv_div;

struct AtArgs {
    const void *q, *k, *v; const float *mask; void *o; float *lse;
    long long qsb, qsh, qss, ksb, ksh, kss, vsb, vsh, vss, msb, msh, msi, msj;
    long long osb, osh, oss;             // o's (batch, head, row) strides: any layout
    int heads, sq, sk, d, causal, vec; float scale;
    AT_DROP_FIELDS
};

/* Whether the dropout keeps element e (flat index in the scores, (batch * head, row, key) in
   C order): the uniform binomial(size=scores.shape) compares, bit for bit. */
template <typename A>
__device__ __forceinline__ bool at_kept(const A &a, unsigned long long e) {
    unsigned w[4];
    if (a.drop == AT_DRAW_F64) {         // two words an element
        sg_philox_block(a.dstate, e >> 1, w);
        const bool hi = e & 1;
        return sg_u01_f64(hi ? w[2] : w[0], hi ? w[3] : w[1]) < a.keep_d;
    }
    sg_philox_block(a.dstate, e >> 2, w);
    const unsigned j = (unsigned)(e & 3);
    float u = sg_u01_f32(j == 0 ? w[0] : j == 1 ? w[1] : j == 2 ? w[2] : w[3]);
    if (a.drop == AT_DRAW_F16)           // the half draw: rounded, kept below 1
        u = fminf(__half2float(__float2half_rn(u)), SG_BELOW_ONE_F16);
    else if (a.drop == AT_DRAW_BF16)
        u = fminf(__bfloat162float(__float2bfloat16_rn(u)), SG_BELOW_ONE_BF16);
    return u < a.keep_f;
}

/* x (a key tile's probabilities in the C layout of rows row0 and row0 + 8, columns n0 ..)
   dropped: the kept ones times inv_div, the rest zero */
template <int BN>
__device__ __forceinline__ void at_drop_tile(float *x, const AtArgs &a, int bh, int row0, int n0,
                                             int t) {
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = row0 + (e < 2 ? 0 : 8), col = n0 + nt * 8 + 2 * t + (e & 1);
            const unsigned long long i =
                ((unsigned long long)bh * a.sq + row) * (unsigned long long)a.sk + col;
            x[4 * nt + e] = at_kept(a, i) ? x[4 * nt + e] * a.inv_div : 0.f;
        }
}

/* One key tile of the online softmax for a warp's rows row0 and row0 + 8, its scores x in the
   C layout (x[4 nt + e]: column n0 + 8 nt + 2 t + (e & 1) of row e < 2 ? row0 : row0 + 8):
   where EDGE, keys past sk or after the row (causal) become -inf; the rows' maxima in log2
   units (a raw max times mult > 0, which keeps the order) go into mrow, the exponents' bases
   into base, the old sums' factors into alpha, and lrow is rescaled by them. */
template <int BN>
__device__ __forceinline__ void at_online_max(float *x, int n0, int row0, int t, int sk,
                                              int causal, bool edge, float mult,
                                              float (&mrow)[2], float (&lrow)[2],
                                              float (&base)[2], float (&alpha)[2]) {
    if (edge) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + (e < 2 ? 0 : 8), col = n0 + nt * 8 + 2 * t + (e & 1);
                if (col >= sk || (causal && col > row)) x[4 * nt + e] = -INFINITY;
            }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
        mx[0] = fmaxf(mx[0], fmaxf(x[4 * nt], x[4 * nt + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(x[4 * nt + 2], x[4 * nt + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mx[r] = fmaxf(mrow[r], mx[r] * mult);
        base[r] = mx[r] == -INFINITY ? 0.f : mx[r];
        alpha[r] = at_exp2(mrow[r] - base[r]);
        mrow[r] = mx[r];
        lrow[r] *= alpha[r];
    }
}

/* The forward: one block of WARPS warps per (16 * MT * WARPS query rows, batch * head), the
   blocks with the most keys (causal) first; BN-key tiles of K and V in two cp.async stages. */
template <typename T, int HD, int WARPS, int MT, int BN, bool DROP>
__device__ __forceinline__ void attn_fwd_body(const AtArgs &a)
{
    constexpr int BM = 16 * MT * WARPS, LD = HD + 8, THREADS = 32 * WARPS;
    typedef typename AtFrag<T>::A FA;
    typedef typename AtFrag<T>::B FB;
    extern __shared__ __align__(16) unsigned char at_smem[];
    T *sQ = reinterpret_cast<T *>(at_smem);
    T *sK = sQ + BM * LD;                // two stages of K and V
    T *sV = sK + 2 * BN * LD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;   // (attention.py: _grid)
    const int m0 = (a.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * BM;
    const T *q = (const T *)a.q + b * a.qsb + h * a.qsh;
    const T *k = (const T *)a.k + b * a.ksb + h * a.ksh;
    const T *v = (const T *)a.v + b * a.vsb + h * a.vsh;
    const float *mask = a.mask ? a.mask + b * a.msb + h * a.msh : 0;
    const float sl2 = a.scale * AT_LOG2E;
    // Without a mask (and with a positive scale) the logits stay raw until the exponent,
    // exp2(s * sl2 - max), one FFMA; a mask is added to logits scaled first (mult 1 then)
    const bool prescale = mask != 0 || !(sl2 > 0.f);
    const float mult = prescale ? 1.f : sl2;
    const int n_end = a.causal ? min(a.sk, m0 + BM) : a.sk;
    const int wrow = m0 + warp * MT * 16;          // the warp's first row

    at_load_tile<T, HD, LD, BM, THREADS>(sQ, q, a.qss, m0, a.sq, a.d, a.vec);
    if (n_end > 0) {
        at_load_tile<T, HD, LD, BN, THREADS>(sK, k, a.kss, 0, a.sk, a.d, a.vec);
        at_load_tile<T, HD, LD, BN, THREADS>(sV, v, a.vss, 0, a.sk, a.d, a.vec);
    }
    at_cp_commit();
    float oacc[MT][HD / 8][4];
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < HD / 8; ++i)
            oacc[mt][i][0] = oacc[mt][i][1] = oacc[mt][i][2] = oacc[mt][i][3] = 0.f;
        mrow[mt][0] = mrow[mt][1] = -INFINITY;
        lrow[mt][0] = lrow[mt][1] = 0.f;
    }
    FA qf[MT][HD / 16];

    for (int n0 = 0, stage = 0; n0 < n_end; n0 += BN, stage ^= 1) {
        T *cK = sK + stage * BN * LD, *cV = sV + stage * BN * LD;
        if (n0 + BN < n_end) {         // the next tile streams in while this one is used
            at_load_tile<T, HD, LD, BN, THREADS>(sK + (stage ^ 1) * BN * LD, k, a.kss, n0 + BN,
                                                 a.sk, a.d, a.vec);
            at_load_tile<T, HD, LD, BN, THREADS>(sV + (stage ^ 1) * BN * LD, v, a.vss, n0 + BN,
                                                 a.sk, a.d, a.vec);
            at_cp_commit();
            at_cp_wait_one();
        } else {
            at_cp_wait_all();
        }
        __syncthreads();
        if (n0 == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < HD / 16; ++kk)
                    at_frag_a<T, false>(qf[mt][kk], sQ + (warp * MT + mt) * 16 * LD + kk * 16, LD);
        }
        float s[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < BN / 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                FB k0, k1;
                at_frag_b2<T, false>(k0, k1, cK + (np * 16) * LD + kk * 16, LD);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    AtFrag<T>::mma(s[mt][2 * np], qf[mt][kk], k0);
                    AtFrag<T>::mma(s[mt][2 * np + 1], qf[mt][kk], k1);
                }
            }
        }
        const bool edge = (n0 + BN > a.sk) || (a.causal && n0 + BN - 1 > wrow);
        float alpha[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int row0 = wrow + mt * 16 + g, row1 = row0 + 8;
            if (prescale) {        // logits in log2 units first: a mask adds to them
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = e < 2 ? row0 : row1, col = n0 + nt * 8 + 2 * t + (e & 1);
                        s[mt][nt][e] = at_prescaled(s[mt][nt][e], sl2, mask, a, row, col);
                    }
            }
            float base[2];
            at_online_max<BN>(&s[mt][0][0], n0, row0, t, a.sk, a.causal, edge, mult, mrow[mt],
                              lrow[mt], base, alpha[mt]);
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {   // one FFMA and one EX2 a probability
                s[mt][nt][0] = at_exp2(fmaf(s[mt][nt][0], mult, -base[0]));
                s[mt][nt][1] = at_exp2(fmaf(s[mt][nt][1], mult, -base[0]));
                s[mt][nt][2] = at_exp2(fmaf(s[mt][nt][2], mult, -base[1]));
                s[mt][nt][3] = at_exp2(fmaf(s[mt][nt][3], mult, -base[1]));
                lrow[mt][0] += s[mt][nt][0] + s[mt][nt][1];
                lrow[mt][1] += s[mt][nt][2] + s[mt][nt][3];
            }
            if (DROP)                      // (the row sums are the undropped ones')
                at_drop_tile<BN>(&s[mt][0][0], a, bh, row0, n0, t);
#pragma unroll
            for (int i = 0; i < HD / 8; ++i) {
                oacc[mt][i][0] *= alpha[mt][0]; oacc[mt][i][1] *= alpha[mt][0];
                oacc[mt][i][2] *= alpha[mt][1]; oacc[mt][i][3] *= alpha[mt][1];
            }
        }
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) {
            FA pa[MT];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) at_a_from_c<T>(pa[mt], s[mt][2 * j], s[mt][2 * j + 1]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; ++dp) {
                FB v0, v1;
                at_frag_b2<T, true>(v0, v1, cV + (16 * j) * LD + dp * 16, LD);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    AtFrag<T>::mma(oacc[mt][2 * dp], pa[mt], v0);
                    AtFrag<T>::mma(oacc[mt][2 * dp + 1], pa[mt], v1);
                }
            }
        }
        __syncthreads();                 // this stage is free for the tile after next
    }
    T *o = (T *)a.o + b * a.osb + h * a.osh;
    const bool pairs = (a.d & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = lrow[mt][r] + __shfl_xor_sync(0xffffffffu, lrow[mt][r], 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = wrow + mt * 16 + g + 8 * r;
            if (row >= a.sq) continue;
            const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
            for (int dt = 0; dt < HD / 8; ++dt) {
                const int col = dt * 8 + 2 * t;
                if (col < a.d)
                    at_store2<T>(o + (long long)row * a.oss + col, oacc[mt][dt][2 * r] * inv,
                                 oacc[mt][dt][2 * r + 1] * inv, pairs, col + 1 < a.d);
            }
            if (t == 0)
                a.lse[(long long)bh * a.sq + row] =
                    l > 0.f ? ((mrow[mt][r] == -INFINITY ? 0.f : mrow[mt][r]) + log2f(l)) * AT_LN2
                            : -INFINITY;
        }
    }
}

/* The two values of a 32-bit word of T as floats (T float: one value, y unused) */
__device__ __forceinline__ float2 at_unpack2(unsigned w, const __nv_bfloat16 *) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 at_unpack2(unsigned w, const __half *) {
    return __half22float2(__halves2half2(__ushort_as_half((unsigned short)(w & 0xffffu)),
                                         __ushort_as_half((unsigned short)(w >> 16))));
}

/* sum(x[i] * y[i]) over the 16 bytes at x and y (16-byte aligned) */
template <typename T>
__device__ __forceinline__ float at_dot16(const T *x, const T *y) {
    const uint4 a = *reinterpret_cast<const uint4 *>(x), b = *reinterpret_cast<const uint4 *>(y);
    const unsigned wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (sizeof(T) == 4) {
            acc += __uint_as_float(wa[i]) * __uint_as_float(wb[i]);
        } else {
            const float2 u = at_unpack2(wa[i], x), v = at_unpack2(wb[i], y);
            acc += u.x * v.x + u.y * v.y;
        }
    }
    return acc;
}

//@ dtype

extern "C" __global__ void attn_bwd_pre_${dtype}(const ${ctype} *o, long long osb, long long osh,
                      long long oss, const ${ctype} *dout, long long dsb, long long dsh,
                      long long dss, const float *dlse, float *delta, float *dqacc, int heads,
                      int sq, int d, long long rows, int vec)
{ attn_bwd_pre_body<${ctype}>(o, osb, osh, oss, dout, dsb, dsh, dss, dlse, delta, dqacc, heads,
                              sq, d, rows, vec); }

extern "C" __global__ void attn_bwd_dq_${dtype}(const float *dqacc, ${ctype} *dq, long long rows,
                      long long sb, long long sh, long long ss, int heads, int sq, int d,
                      int vec)
{ attn_bwd_dq_body<${ctype}>(dqacc, dq, rows, sb, sh, ss, heads, sq, d, vec); }
//@ head

// (the dropout's kernels apart: its Philox code in the others cost the 16-bit head dim 64
// forward 56 more bytes of spill)
extern "C" __global__ void __launch_bounds__(${fwd_threads}, ${fwd_min_blocks})
attn_fwd_${dtype}_${hd}(AtArgs a)
{ attn_fwd_body<${ctype}, ${hd}, ${fwd_warps}, ${fwd_mt}, ${fwd_bn}, false>(a); }

extern "C" __global__ void __launch_bounds__(${fwd_threads}, ${fwd_min_blocks})
attn_fwd_drop_${dtype}_${hd}(AtArgs a)
{ attn_fwd_body<${ctype}, ${hd}, ${fwd_warps}, ${fwd_mt}, ${fwd_bn}, true>(a); }

extern "C" __global__ void __launch_bounds__(AT_THREADS, ${bwd_min_blocks})
attn_bwd_${dtype}_${hd}(AtBwdArgs a) { attn_bwd_body<${ctype}, ${hd}, ${bwd_stages}, false>(a); }

extern "C" __global__ void __launch_bounds__(AT_THREADS, ${bwd_min_blocks})
attn_bwd_drop_${dtype}_${hd}(AtBwdArgs a)
{ attn_bwd_body<${ctype}, ${hd}, ${bwd_stages}, true>(a); }
