// Fused attention, FlashAttention-2 style (symgpu/gpu/ops/attention.py): the forward (o and
// the rows' log-sum-exp) and the backward (dq, dk, dv recomputing P from the lse), for
// __half / __nv_bfloat16 (mma.sync m16n8k16, float32 accumulation) and float (3xTF32
// m16n8k8: two TF32 products per pair of operands plus the big*big one, float32 accuracy).
// Tiles live in shared memory (cp.async, zero-filled past the ends); every warp owns 16 rows
// of the block and keeps its accumulators in registers in the mma C layout:
//   lane = 4 * g + t: C[0..3] = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// An A operand (16 x 16) is 8 values: (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1) and the same
// 8 columns on; a B operand (16 x 8) is 4: (2t, g) (2t+1, g) (2t+8, g) (2t+9, g). Two C tiles
// side by side are exactly an A operand (the probabilities feed P @ V without shared memory).
#define AT_BM 64             // query rows per block (4 warps x 16)
#define AT_BN 64             // keys per tile
#define AT_THREADS 128
#define AT_LOG2E 1.4426950408889634f
#define AT_LN2 0.6931471805599453f

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

__device__ __forceinline__ unsigned at_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void at_mma_tf32(float c[4], unsigned a0, unsigned a1, unsigned a2,
                                            unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <> struct AtFrag<float> {
    typedef float A[8];
    typedef float B[4];
    /* 3xTF32 over k = 8 of the 16: A values a[i0..] at k 2t, 2t+1 (TF32 slots t, t+4) */
    static __device__ __forceinline__ void half_step(float c[4], float x0, float x1, float x2,
                                                     float x3, float y0, float y1) {
        const unsigned b0 = at_tf32(x0), b1 = at_tf32(x1), b2 = at_tf32(x2), b3 = at_tf32(x3);
        const unsigned s0 = at_tf32(x0 - __uint_as_float(b0)), s1 = at_tf32(x1 - __uint_as_float(b1));
        const unsigned s2 = at_tf32(x2 - __uint_as_float(b2)), s3 = at_tf32(x3 - __uint_as_float(b3));
        const unsigned e0 = at_tf32(y0), e1 = at_tf32(y1);
        const unsigned f0 = at_tf32(y0 - __uint_as_float(e0)), f1 = at_tf32(y1 - __uint_as_float(e1));
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

/* A operand from shared memory: A(i, k) = s[i * rs + k * cs] (KC: cs == 1, pairs adjacent) */
template <typename T, bool KC>
__device__ __forceinline__ void at_load_a(typename AtFrag<T>::A a, const T *s, int rs, int cs) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const T *p0 = s + g * rs + (2 * t) * cs, *p1 = p0 + 8 * rs;
    if constexpr (sizeof(T) == 4) {
        float *f = reinterpret_cast<float *>(a);
        f[0] = p0[0]; f[1] = p0[cs]; f[2] = p1[0]; f[3] = p1[cs];
        f[4] = p0[8 * cs]; f[5] = p0[9 * cs]; f[6] = p1[8 * cs]; f[7] = p1[9 * cs];
    } else if constexpr (KC) {
        a[0] = *reinterpret_cast<const unsigned *>(p0);
        a[1] = *reinterpret_cast<const unsigned *>(p1);
        a[2] = *reinterpret_cast<const unsigned *>(p0 + 8);
        a[3] = *reinterpret_cast<const unsigned *>(p1 + 8);
    } else {
        a[0] = AtFrag<T>::pack2(p0[0], p0[cs]);
        a[1] = AtFrag<T>::pack2(p1[0], p1[cs]);
        a[2] = AtFrag<T>::pack2(p0[8 * cs], p0[9 * cs]);
        a[3] = AtFrag<T>::pack2(p1[8 * cs], p1[9 * cs]);
    }
}

/* B operand from shared memory: B(k, n) = s[k * ks + n * ns] (KC: ks == 1) */
template <typename T, bool KC>
__device__ __forceinline__ void at_load_b(typename AtFrag<T>::B b, const T *s, int ks, int ns) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const T *p = s + g * ns + (2 * t) * ks;
    if constexpr (sizeof(T) == 4) {
        float *f = reinterpret_cast<float *>(b);
        f[0] = p[0]; f[1] = p[ks]; f[2] = p[8 * ks]; f[3] = p[9 * ks];
    } else if constexpr (KC) {
        b[0] = *reinterpret_cast<const unsigned *>(p);
        b[1] = *reinterpret_cast<const unsigned *>(p + 8);
    } else {
        b[0] = AtFrag<T>::pack2(p[0], p[ks]);
        b[1] = AtFrag<T>::pack2(p[8 * ks], p[9 * ks]);
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

__device__ __forceinline__ void at_cp16(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void at_cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void at_cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void at_cp_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

/* rows [r0, r0 + ROWS) x columns [0, HD) of a (rows, d) matrix with row stride rs into the
   shared tile s (row stride LD), zeros past `rows` and `d`. VEC: d == HD and 16-byte aligned
   rows: cp.async (the caller commits and waits); else plain loads. */
template <typename T, int HD, int LD, int ROWS>
__device__ __forceinline__ void at_load_tile(T *s, const T *g, long long rs, int r0, int rows,
                                             int d, bool vec) {
    if (vec) {
        constexpr int CH = 16 / sizeof(T), PER_ROW = HD / CH;
        for (int c = threadIdx.x; c < ROWS * PER_ROW; c += AT_THREADS) {
            const int r = c / PER_ROW, col = (c % PER_ROW) * CH;
            const bool ok = r0 + r < rows;
            at_cp16(s + r * LD + col, g + (long long)(ok ? r0 + r : 0) * rs + col, ok);
        }
    } else {
        for (int c = threadIdx.x; c < ROWS * HD; c += AT_THREADS) {
            const int r = c / HD, col = c % HD;
            s[r * LD + col] = (r0 + r < rows && col < d) ? g[(long long)(r0 + r) * rs + col]
                                                         : T(0.0f);
        }
    }
}

template <typename T> __device__ __forceinline__ float at_f(T x) { return sg_load(x); }

struct AtArgs {
    const void *q, *k, *v; const float *mask; void *o; float *lse;
    long long qsb, qsh, qss, ksb, ksh, kss, vsb, vsh, vss, msb, msh, msi, msj;
    int heads, sq, sk, d, causal, vec; float scale;
};

/* The forward: one block per (64 query rows, batch * head). */
template <typename T, int HD>
__device__ __forceinline__ void attn_fwd_body(const AtArgs &a)
{
    constexpr int LD = HD + (sizeof(T) == 4 ? 8 : 8);
    extern __shared__ __align__(16) unsigned char at_smem[];
    T *sQ = reinterpret_cast<T *>(at_smem);
    T *sK = sQ + AT_BM * LD;             // two stages of K and V
    T *sV = sK + 2 * AT_BN * LD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, m0 = blockIdx.x * AT_BM;
    const T *q = (const T *)a.q + b * a.qsb + h * a.qsh;
    const T *k = (const T *)a.k + b * a.ksb + h * a.ksh;
    const T *v = (const T *)a.v + b * a.vsb + h * a.vsh;
    const float *mask = a.mask ? a.mask + b * a.msb + h * a.msh : 0;
    const float sl2 = a.scale * AT_LOG2E;
    const int n_end = a.causal ? min(a.sk, m0 + AT_BM) : a.sk;

    at_load_tile<T, HD, LD, AT_BM>(sQ, q, a.qss, m0, a.sq, a.d, a.vec);
    if (n_end > 0) {
        at_load_tile<T, HD, LD, AT_BN>(sK, k, a.kss, 0, a.sk, a.d, a.vec);
        at_load_tile<T, HD, LD, AT_BN>(sV, v, a.vss, 0, a.sk, a.d, a.vec);
    }
    at_cp_commit();
    float oacc[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    typename AtFrag<T>::A qf[HD / 16];
    const int row0 = m0 + warp * 16 + g, row1 = row0 + 8;

    for (int n0 = 0, stage = 0; n0 < n_end; n0 += AT_BN, stage ^= 1) {
        T *cK = sK + stage * AT_BN * LD, *cV = sV + stage * AT_BN * LD;
        if (n0 + AT_BN < n_end) {      // the next tile streams in while this one is used
            at_load_tile<T, HD, LD, AT_BN>(sK + (stage ^ 1) * AT_BN * LD, k, a.kss, n0 + AT_BN,
                                           a.sk, a.d, a.vec);
            at_load_tile<T, HD, LD, AT_BN>(sV + (stage ^ 1) * AT_BN * LD, v, a.vss, n0 + AT_BN,
                                           a.sk, a.d, a.vec);
            at_cp_commit();
            at_cp_wait_one();
        } else {
            at_cp_wait_all();
        }
        __syncthreads();
        if (n0 == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk)
                at_load_a<T, true>(qf[kk], sQ + (warp * 16) * LD + kk * 16, LD, 1);
        }
        float s[AT_BN / 8][4];
#pragma unroll
        for (int i = 0; i < AT_BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
            for (int nt = 0; nt < AT_BN / 8; ++nt) {
                typename AtFrag<T>::B kb;
                at_load_b<T, true>(kb, cK + (nt * 8) * LD + kk * 16, 1, LD);
                AtFrag<T>::mma(s[nt], qf[kk], kb);
            }
        }
        const bool edge = (n0 + AT_BN > a.sk) || (a.causal && n0 + AT_BN - 1 > m0 + warp * 16);
#pragma unroll
        for (int nt = 0; nt < AT_BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = e < 2 ? row0 : row1, col = n0 + nt * 8 + 2 * t + (e & 1);
                float x = s[nt][e] * sl2;
                if (mask && row < a.sq && col < a.sk)
                    x += mask[row * a.msi + col * a.msj] * AT_LOG2E;
                if (edge && (col >= a.sk || (a.causal && col > row))) x = -INFINITY;
                s[nt][e] = x;
            }
        }
        float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
        for (int nt = 0; nt < AT_BN / 8; ++nt) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        float base[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            base[r] = mx[r] == -INFINITY ? 0.f : mx[r];
            alpha[r] = exp2f(mrow[r] - base[r]);
            mrow[r] = mx[r];
            lrow[r] *= alpha[r];
        }
#pragma unroll
        for (int nt = 0; nt < AT_BN / 8; ++nt) {
            s[nt][0] = exp2f(s[nt][0] - base[0]); s[nt][1] = exp2f(s[nt][1] - base[0]);
            s[nt][2] = exp2f(s[nt][2] - base[1]); s[nt][3] = exp2f(s[nt][3] - base[1]);
            lrow[0] += s[nt][0] + s[nt][1];
            lrow[1] += s[nt][2] + s[nt][3];
        }
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) {
            oacc[i][0] *= alpha[0]; oacc[i][1] *= alpha[0];
            oacc[i][2] *= alpha[1]; oacc[i][3] *= alpha[1];
        }
#pragma unroll
        for (int j = 0; j < AT_BN / 16; ++j) {
            typename AtFrag<T>::A pa;
            at_a_from_c<T>(pa, s[2 * j], s[2 * j + 1]);
#pragma unroll
            for (int dt = 0; dt < HD / 8; ++dt) {
                typename AtFrag<T>::B vb;
                at_load_b<T, false>(vb, cV + (16 * j) * LD + dt * 8, LD, 1);
                AtFrag<T>::mma(oacc[dt], pa, vb);
            }
        }
        __syncthreads();                 // this stage is free for the tile after next
    }
    float l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] = lrow[r] + __shfl_xor_sync(0xffffffffu, lrow[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    T *o = (T *)a.o + (long long)bh * a.sq * a.d;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r ? row1 : row0;
        if (row >= a.sq) continue;
        const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            const int col = dt * 8 + 2 * t;
            if (col < a.d) sg_store(o[(long long)row * a.d + col], oacc[dt][2 * r] * inv);
            if (col + 1 < a.d) sg_store(o[(long long)row * a.d + col + 1], oacc[dt][2 * r + 1] * inv);
        }
        if (t == 0)
            a.lse[(long long)bh * a.sq + row] =
                l[r] > 0.f ? ((mrow[r] == -INFINITY ? 0.f : mrow[r]) + log2f(l[r])) * AT_LN2
                           : -INFINITY;
    }
}

/* Delta[row] = sum(dO[row] * O[row]) - dlse[row] (one warp per row), and zeros the float
   dq accumulator row (when it is not the output itself it has the same (rows, d) layout). */
template <typename T>
__device__ __forceinline__ void attn_bwd_pre_body(const T *o, const T *dout, long long dsb,
                                                  long long dsh, long long dss,
                                                  const float *dlse, float *delta, float *dqacc,
                                                  int heads, int sq, int d, long long rows)
{
    const int lane = threadIdx.x & 31;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long bh = r / sq, i = r % sq, b = bh / heads, h = bh % heads;
        const T *orow = o + r * d;
        const T *drow = dout + b * dsb + h * dsh + i * dss;
        float acc = 0.f;
        for (int c = lane; c < d; c += 32) {
            acc += at_f(orow[c]) * at_f(drow[c]);
            dqacc[r * d + c] = 0.f;
        }
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) delta[r] = acc - (dlse ? dlse[r] : 0.f);
    }
}

/* dq (C-contiguous, (rows, d)) = dqacc rounded to T */
template <typename T>
__device__ __forceinline__ void attn_bwd_dq_body(const float *dqacc, T *dq, long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        sg_store(dq[i], dqacc[i]);
}

struct AtBwdArgs {
    const void *q, *k, *v, *dout; const float *mask, *lse, *delta; float *dqacc; void *dk, *dv;
    long long qsb, qsh, qss, ksb, ksh, kss, vsb, vsh, vss, dsb, dsh, dss, msb, msh, msi, msj;
    int heads, sq, sk, d, causal, vec; float scale;
};

/* The backward: one block per (64 keys, batch * head), looping over the query blocks:
   S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - Delta);
   dV += P^T dO, dK += dS^T Q (registers); dQ += dS K through shared memory and float atomics. */
template <typename T, int HD>
__device__ __forceinline__ void attn_bwd_body(const AtBwdArgs &a)
{
    constexpr int LD = HD + 8, LDS = AT_BM + 8;
    extern __shared__ __align__(16) unsigned char at_smem[];
    T *sK = reinterpret_cast<T *>(at_smem);
    T *sV = sK + AT_BN * LD;
    T *sQ = sV + AT_BN * LD;
    T *sD = sQ + AT_BM * LD;             // dO
    T *sS = sD + AT_BM * LD;             // dS^T (keys x queries)
    float *sL = reinterpret_cast<float *>(sS + AT_BN * LDS);   // lse (log2 units)
    float *sDelta = sL + AT_BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads, n0 = blockIdx.x * AT_BN;
    const T *q = (const T *)a.q + b * a.qsb + h * a.qsh;
    const T *k = (const T *)a.k + b * a.ksb + h * a.ksh;
    const T *v = (const T *)a.v + b * a.vsb + h * a.vsh;
    const T *dout = (const T *)a.dout + b * a.dsb + h * a.dsh;
    const float *mask = a.mask ? a.mask + b * a.msb + h * a.msh : 0;
    const float *lse = a.lse + (long long)bh * a.sq, *delta = a.delta + (long long)bh * a.sq;
    float *dqacc = a.dqacc + (long long)bh * a.sq * a.d;
    const float sl2 = a.scale * AT_LOG2E;

    at_load_tile<T, HD, LD, AT_BN>(sK, k, a.kss, n0, a.sk, a.d, a.vec);
    at_load_tile<T, HD, LD, AT_BN>(sV, v, a.vss, n0, a.sk, a.d, a.vec);
    at_cp_commit();
    at_cp_wait_all();
    __syncthreads();
    typename AtFrag<T>::A kf[HD / 16], vf[HD / 16];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        at_load_a<T, true>(kf[kk], sK + (warp * 16) * LD + kk * 16, LD, 1);
        at_load_a<T, true>(vf[kk], sV + (warp * 16) * LD + kk * 16, LD, 1);
    }
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; ++i)
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;
    const int key0 = n0 + warp * 16 + g, key1 = key0 + 8;
    const int m_start = a.causal ? (n0 / AT_BM) * AT_BM : 0;

    for (int m0 = m_start; m0 < a.sq; m0 += AT_BM) {
        __syncthreads();                 // the last block's readers of sQ, sD, sS are done
        at_load_tile<T, HD, LD, AT_BM>(sQ, q, a.qss, m0, a.sq, a.d, a.vec);
        at_load_tile<T, HD, LD, AT_BM>(sD, dout, a.dss, m0, a.sq, a.d, a.vec);
        at_cp_commit();
        for (int i = threadIdx.x; i < AT_BM; i += AT_THREADS) {
            const bool ok = m0 + i < a.sq;
            const float l = ok ? lse[m0 + i] : 0.f;
            sL[i] = l == -INFINITY ? INFINITY : l * AT_LOG2E;   // a fully masked row: P = 0
            sDelta[i] = ok ? delta[m0 + i] : 0.f;
        }
        at_cp_wait_all();
        __syncthreads();
        float st[AT_BM / 8][4], dpt[AT_BM / 8][4];
#pragma unroll
        for (int i = 0; i < AT_BM / 8; ++i)
            st[i][0] = st[i][1] = st[i][2] = st[i][3] = dpt[i][0] = dpt[i][1] = dpt[i][2] = dpt[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
            for (int nt = 0; nt < AT_BM / 8; ++nt) {
                typename AtFrag<T>::B qb, db;
                at_load_b<T, true>(qb, sQ + (nt * 8) * LD + kk * 16, 1, LD);
                AtFrag<T>::mma(st[nt], kf[kk], qb);
                at_load_b<T, true>(db, sD + (nt * 8) * LD + kk * 16, 1, LD);
                AtFrag<T>::mma(dpt[nt], vf[kk], db);
            }
        }
        const bool edge = (m0 + AT_BM > a.sq) || (n0 + AT_BN > a.sk) ||
                          (a.causal && n0 + AT_BN - 1 > m0);
#pragma unroll
        for (int nt = 0; nt < AT_BM / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = e < 2 ? key0 : key1, ql = nt * 8 + 2 * t + (e & 1), qr = m0 + ql;
                float x = st[nt][e] * sl2;
                if (mask && qr < a.sq && key < a.sk)
                    x += mask[qr * a.msi + key * a.msj] * AT_LOG2E;
                float p = exp2f(x - sL[ql]);
                if (edge && (qr >= a.sq || key >= a.sk || (a.causal && key > qr))) p = 0.f;
                st[nt][e] = p;
                dpt[nt][e] = p * (dpt[nt][e] - sDelta[ql]);     // dS^T
            }
        }
#pragma unroll
        for (int j = 0; j < AT_BM / 16; ++j) {
            typename AtFrag<T>::A pa, sa;
            at_a_from_c<T>(pa, st[2 * j], st[2 * j + 1]);
            at_a_from_c<T>(sa, dpt[2 * j], dpt[2 * j + 1]);
#pragma unroll
            for (int dt = 0; dt < HD / 8; ++dt) {
                typename AtFrag<T>::B ob, qb;
                at_load_b<T, false>(ob, sD + (16 * j) * LD + dt * 8, LD, 1);
                AtFrag<T>::mma(dv[dt], pa, ob);
                at_load_b<T, false>(qb, sQ + (16 * j) * LD + dt * 8, LD, 1);
                AtFrag<T>::mma(dk[dt], sa, qb);
            }
        }
        // dS^T to shared memory (rounded to T as the products' operands are)
#pragma unroll
        for (int nt = 0; nt < AT_BM / 8; ++nt) {
            const int ql = nt * 8 + 2 * t, kl = warp * 16 + g;
            sg_store(sS[kl * LDS + ql], dpt[nt][0]);
            sg_store(sS[kl * LDS + ql + 1], dpt[nt][1]);
            sg_store(sS[(kl + 8) * LDS + ql], dpt[nt][2]);
            sg_store(sS[(kl + 8) * LDS + ql + 1], dpt[nt][3]);
        }
        __syncthreads();
        // dQ rows m0 + 16 warp ..: A(i = query, k = key) = sS[key * LDS + query]
        float dq[HD / 8][4];
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < AT_BN / 16; ++kk) {
            typename AtFrag<T>::A sa;
            at_load_a<T, false>(sa, sS + (kk * 16) * LDS + warp * 16, 1, LDS);
#pragma unroll
            for (int dt = 0; dt < HD / 8; ++dt) {
                typename AtFrag<T>::B kb;
                at_load_b<T, false>(kb, sK + (kk * 16) * LD + dt * 8, LD, 1);
                AtFrag<T>::mma(dq[dt], sa, kb);
            }
        }
        const int q0 = m0 + warp * 16 + g, q1 = q0 + 8;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            const int col = dt * 8 + 2 * t;
            if (q0 < a.sq) {
                if (col < a.d) atomicAdd(dqacc + (long long)q0 * a.d + col, dq[dt][0] * a.scale);
                if (col + 1 < a.d) atomicAdd(dqacc + (long long)q0 * a.d + col + 1, dq[dt][1] * a.scale);
            }
            if (q1 < a.sq) {
                if (col < a.d) atomicAdd(dqacc + (long long)q1 * a.d + col, dq[dt][2] * a.scale);
                if (col + 1 < a.d) atomicAdd(dqacc + (long long)q1 * a.d + col + 1, dq[dt][3] * a.scale);
            }
        }
    }
    T *dko = (T *)a.dk + (long long)bh * a.sk * a.d, *dvo = (T *)a.dv + (long long)bh * a.sk * a.d;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = r ? key1 : key0;
        if (key >= a.sk) continue;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            const int col = dt * 8 + 2 * t;
            if (col < a.d) {
                sg_store(dko[(long long)key * a.d + col], dk[dt][2 * r] * a.scale);
                sg_store(dvo[(long long)key * a.d + col], dv[dt][2 * r]);
            }
            if (col + 1 < a.d) {
                sg_store(dko[(long long)key * a.d + col + 1], dk[dt][2 * r + 1] * a.scale);
                sg_store(dvo[(long long)key * a.d + col + 1], dv[dt][2 * r + 1]);
            }
        }
    }
}
//@ dtype

extern "C" __global__ void attn_bwd_pre_${dtype}(const ${ctype} *o, const ${ctype} *dout, long long dsb, long long dsh,
                      long long dss, const float *dlse, float *delta, float *dqacc, int heads,
                      int sq, int d, long long rows)
{ attn_bwd_pre_body<${ctype}>(o, dout, dsb, dsh, dss, dlse, delta, dqacc, heads, sq, d, rows); }

extern "C" __global__ void attn_bwd_dq_${dtype}(const float *dqacc, ${ctype} *dq, long long n)
{ attn_bwd_dq_body<${ctype}>(dqacc, dq, n); }
//@ head

extern "C" __global__ void __launch_bounds__(AT_THREADS)
attn_fwd_${dtype}_${hd}(AtArgs a) { attn_fwd_body<${ctype}, ${hd}>(a); }

extern "C" __global__ void __launch_bounds__(AT_THREADS)
attn_bwd_${dtype}_${hd}(AtBwdArgs a) { attn_bwd_body<${ctype}, ${hd}>(a); }
