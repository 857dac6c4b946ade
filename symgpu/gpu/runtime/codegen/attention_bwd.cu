// Fused attention's backward (FlashAttention-2 style, mma.sync), pasted after attention.cu's
// device code (its fragments, tile loaders and dropout helpers): the pre pass (Delta, the dq
// accumulator zeroed), the dq pass (the accumulator rounded to dq), and the backward proper.
// Its entry points are attention.cu's (sections "dtype" and "head").
/* 16 bytes of T at dst (16-byte aligned) from 16 / sizeof(T) floats at src (16-byte aligned) */
template <typename T>
__device__ __forceinline__ void at_round16(T *dst, const float *src) {
    const float4 x = *reinterpret_cast<const float4 *>(src);
    if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float4 *>(dst) = x;
    } else {
        const float4 y = *reinterpret_cast<const float4 *>(src + 4);
        *reinterpret_cast<uint4 *>(dst) =
            make_uint4(AtFrag<T>::pack(x.x, x.y), AtFrag<T>::pack(x.z, x.w),
                       AtFrag<T>::pack(y.x, y.y), AtFrag<T>::pack(y.z, y.w));
    }
}

/* Row r of the (batch * head * rows) space: its (batch, head, row) in 32-bit arithmetic where
   the space fits (64-bit division is a long software sequence, once per row here) */
__device__ __forceinline__ void at_row_index(long long r, int heads, int sq, long long rows,
                                             long long &b, long long &h, long long &i) {
    if (rows <= 0x7fffffffLL) {
        const int ri = (int)r, bh = ri / sq;
        i = ri - bh * sq; b = bh / heads; h = bh - (int)b * heads;
    } else {
        const long long bh = r / sq;
        i = r - bh * sq; b = bh / heads; h = bh - b * heads;
    }
}

/* The pre and dq kernels' rows: VEC (the host checked that every row starts 16-byte aligned
   and d fills whole 16-byte accesses of T and of float): 8 lanes a row, 4 rows a warp, one
   16-byte access a lane at a time; else a warp a row, one value a lane. Every lane of a warp
   runs the same iterations (the row sums shuffle over them). */
#define AT_ROWS_LOOP(VEC)                                                                      \
    const int lane = threadIdx.x & 31, per = (VEC) ? 4 : 1, sub = (VEC) ? lane >> 3 : 0;      \
    const int rl = (VEC) ? lane & 7 : lane, rlanes = (VEC) ? 8 : 32;                           \
    const long long w0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;             \
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;                            \
    for (long long r0 = w0 * per; r0 < rows; r0 += nw * per)

/* Delta[row] = sum(dO[row] * O[row]) - dlse[row], and zeros the float dq accumulator row
   (when it is not the output itself it has the same (rows, d) layout). */
template <typename T>
__device__ __forceinline__ void attn_bwd_pre_body(const T *o, long long osb, long long osh,
                                                  long long oss, const T *dout, long long dsb,
                                                  long long dsh, long long dss,
                                                  const float *dlse, float *delta, float *dqacc,
                                                  int heads, int sq, int d, long long rows,
                                                  int vec)
{
    constexpr int V = 16 / sizeof(T);
    AT_ROWS_LOOP(vec) {
        const long long r = r0 + sub;
        float acc = 0.f;
        if (r < rows) {
            long long b, h, i;
            at_row_index(r, heads, sq, rows, b, h, i);
            const T *orow = o + b * osb + h * osh + i * oss;
            const T *drow = dout + b * dsb + h * dsh + i * dss;
            float *qrow = dqacc + r * d;
            if (vec) {
                for (int c = rl * V; c < d; c += 8 * V) {
                    acc += at_dot16(orow + c, drow + c);
#pragma unroll
                    for (int u = 0; u < V; u += 4)
                        *reinterpret_cast<float4 *>(qrow + c + u) = make_float4(0.f, 0.f, 0.f, 0.f);
                }
            } else {
                for (int c = rl; c < d; c += rlanes) {
                    acc += at_f(orow[c]) * at_f(drow[c]);
                    qrow[c] = 0.f;
                }
            }
        }
        for (int off = rlanes >> 1; off > 0; off >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (rl == 0 && r < rows) delta[r] = acc - (dlse ? dlse[r] : 0.f);
    }
}

/* dq (strides sb, sh, ss per batch, head, row) = dqacc ((rows, d), C-contiguous) rounded
   to T */
template <typename T>
__device__ __forceinline__ void attn_bwd_dq_body(const float *dqacc, T *dq, long long rows,
                                                 long long sb, long long sh, long long ss,
                                                 int heads, int sq, int d, int vec)
{
    constexpr int V = 16 / sizeof(T);
    AT_ROWS_LOOP(vec) {
        const long long r = r0 + sub;
        if (r >= rows) continue;
        long long b, h, i;
        at_row_index(r, heads, sq, rows, b, h, i);
        T *out = dq + b * sb + h * sh + i * ss;
        const float *in = dqacc + r * d;
        if (vec) {
            for (int c = rl * V; c < d; c += 8 * V) at_round16(out + c, in + c);
        } else {
            for (int c = rl; c < d; c += rlanes) sg_store(out[c], in[c]);
        }
    }
}
#undef AT_ROWS_LOOP

struct AtBwdArgs {
    const void *q, *k, *v, *dout; const float *mask, *lse, *delta; float *dqacc; void *dk, *dv;
    long long qsb, qsh, qss, ksb, ksh, kss, vsb, vsh, vss, dsb, dsh, dss, msb, msh, msi, msj;
    long long dksb, dksh, dkss, dvsb, dvsh, dvss;   // dk's and dv's strides: any layout
    int heads, sq, sk, d, causal, vec; float scale;
    AT_DROP_FIELDS
};

/* dK (times the scale) and dV at keys key0 and key0 + 8 (keys past sk skipped), columns < d,
   from a warp's accumulators in the C layout: acc(key0 + 8 r, 8 dt + 2 t + e) =
   x[4 dt + 2 r + e] (a float[HD / 8][4] flattened, or wgmma's float[HD / 2]) */
template <typename T, int HD>
__device__ __forceinline__ void at_store_dkdv(const AtBwdArgs &a, int b, int h, const float *dk,
                                              const float *dv, int key0, int t, bool pairs) {
    T *dko = (T *)a.dk + b * a.dksb + h * a.dksh, *dvo = (T *)a.dv + b * a.dvsb + h * a.dvsh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = key0 + 8 * r;
        if (key >= a.sk) continue;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            const int col = dt * 8 + 2 * t, i = 4 * dt + 2 * r;
            if (col >= a.d) continue;
            at_store2<T>(dko + (long long)key * a.dkss + col, dk[i] * a.scale,
                         dk[i + 1] * a.scale, pairs, col + 1 < a.d);
            at_store2<T>(dvo + (long long)key * a.dvss + col, dv[i], dv[i + 1], pairs,
                         col + 1 < a.d);
        }
    }
}

/* The backward: one block per (64 keys, batch * head), 4 warps of 16 keys, looping over the
   query blocks of 64 (STAGES 2: the next block's Q, dO, lse and Delta stream in during this
   one; 1: during its dQ step):
   S^T = K Q^T, P^T = exp(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - Delta);
   dV += P^T dO, dK += dS^T Q (registers); dQ += dS K through shared memory and float atomics,
   32 columns at a time. K and V's operands are read from shared memory at each use (kept in
   registers they would spill). */
template <typename T, int HD, int STAGES, bool DROP>
__device__ __forceinline__ void attn_bwd_body(const AtBwdArgs &a)
{
    constexpr int BM = AT_BM, BN = AT_BN, LD = HD + 8, LDS = BM + 8, THREADS = AT_THREADS;
    typedef typename AtFrag<T>::A FA;
    typedef typename AtFrag<T>::B FB;
    extern __shared__ __align__(16) unsigned char at_smem[];
    T *sK = reinterpret_cast<T *>(at_smem);
    T *sV = sK + BN * LD;
    T *sQ = sV + BN * LD;                // STAGES x (BM x LD)
    T *sD = sQ + STAGES * BM * LD;       // dO, the same
    T *sS = sD + STAGES * BM * LD;       // dS^T (keys x queries)
    float *sL = reinterpret_cast<float *>(sS + BN * LDS);   // lse, STAGES x BM
    float *sDelta = sL + STAGES * BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads, n0 = blockIdx.y * BN;
    const T *q = (const T *)a.q + b * a.qsb + h * a.qsh;
    const T *k = (const T *)a.k + b * a.ksb + h * a.ksh;
    const T *v = (const T *)a.v + b * a.vsb + h * a.vsh;
    const T *dout = (const T *)a.dout + b * a.dsb + h * a.dsh;
    const float *mask = a.mask ? a.mask + b * a.msb + h * a.msh : 0;
    const float *lse = a.lse + (long long)bh * a.sq, *delta = a.delta + (long long)bh * a.sq;
    float *dqacc = a.dqacc + (long long)bh * a.sq * a.d;
    const float sl2 = a.scale * AT_LOG2E;
    const bool prescale = mask != 0 || !(sl2 > 0.f);   // as the forward
    const float mult = prescale ? 1.f : sl2;
    const int m_start = a.causal ? (n0 / BM) * BM : 0;

    at_load_tile<T, HD, LD, BN, THREADS>(sK, k, a.kss, n0, a.sk, a.d, a.vec);
    at_load_tile<T, HD, LD, BN, THREADS>(sV, v, a.vss, n0, a.sk, a.d, a.vec);
    if (m_start < a.sq) {
        at_load_tile<T, HD, LD, BM, THREADS>(sQ, q, a.qss, m_start, a.sq, a.d, a.vec);
        at_load_tile<T, HD, LD, BM, THREADS>(sD, dout, a.dss, m_start, a.sq, a.d, a.vec);
        at_load_row<BM, THREADS>(sL, lse, m_start, a.sq);
        at_load_row<BM, THREADS>(sDelta, delta, m_start, a.sq);
    }
    at_cp_commit();
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; ++i)
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;
    const int key0 = n0 + warp * 16 + g, key1 = key0 + 8;
    const bool pairs = (a.d & 1) == 0;
    const T *wK = sK + (warp * 16) * LD, *wV = sV + (warp * 16) * LD;

    for (int m0 = m_start, it = 0; m0 < a.sq; m0 += BM, ++it) {
        const int st = STAGES == 2 ? (it & 1) : 0;
        const bool more = m0 + BM < a.sq;
        if (STAGES == 2 && more) {
            const int nx = st ^ 1;       // its last readers finished before the last dQ step
            at_load_tile<T, HD, LD, BM, THREADS>(sQ + nx * BM * LD, q, a.qss, m0 + BM, a.sq,
                                                 a.d, a.vec);
            at_load_tile<T, HD, LD, BM, THREADS>(sD + nx * BM * LD, dout, a.dss, m0 + BM, a.sq,
                                                 a.d, a.vec);
            at_load_row<BM, THREADS>(sL + nx * BM, lse, m0 + BM, a.sq);
            at_load_row<BM, THREADS>(sDelta + nx * BM, delta, m0 + BM, a.sq);
            at_cp_commit();
            at_cp_wait_one();
        } else {
            at_cp_wait_all();
        }
        __syncthreads();                 // this block's tiles are in; the last dQ step is done
        const T *cQ = sQ + st * BM * LD, *cD = sD + st * BM * LD;
        const float *cL = sL + st * BM, *cDelta = sDelta + st * BM;
        float s[BM / 8][4], dp[BM / 8][4];
#pragma unroll
        for (int i = 0; i < BM / 8; ++i)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            FA ka, va;
            at_frag_a<T, false>(ka, wK + kk * 16, LD);
            at_frag_a<T, false>(va, wV + kk * 16, LD);
#pragma unroll
            for (int np = 0; np < BM / 16; ++np) {
                FB b0, b1;
                at_frag_b2<T, false>(b0, b1, cQ + (np * 16) * LD + kk * 16, LD);
                AtFrag<T>::mma(s[2 * np], ka, b0);
                AtFrag<T>::mma(s[2 * np + 1], ka, b1);
                at_frag_b2<T, false>(b0, b1, cD + (np * 16) * LD + kk * 16, LD);
                AtFrag<T>::mma(dp[2 * np], va, b0);
                AtFrag<T>::mma(dp[2 * np + 1], va, b1);
            }
        }
        const bool edge = (m0 + BM > a.sq) || (n0 + BN > a.sk) ||
                          (a.causal && n0 + BN - 1 > m0);
        if (prescale) {                  // logits in log2 units first: a mask adds to them
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = e < 2 ? key0 : key1, qr = m0 + nt * 8 + 2 * t + (e & 1);
                    s[nt][e] = at_prescaled(s[nt][e], sl2, mask, a, qr, key);
                }
        }
#pragma unroll
        for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int ql = nt * 8 + 2 * t + (e & 1);
                const float l = cL[ql];      // a fully masked row's -inf: probabilities 0
                const float off = l == -INFINITY ? -INFINITY : -l * AT_LOG2E;
                s[nt][e] = at_exp2(fmaf(s[nt][e], mult, off));
            }
        }
        if (edge) {                      // queries or keys past the ends, keys after the query
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = e < 2 ? key0 : key1, qr = m0 + nt * 8 + 2 * t + (e & 1);
                    if (qr >= a.sq || key >= a.sk || (a.causal && key > qr)) s[nt][e] = 0.f;
                }
        }
        if (DROP) {                      // dS^T from the kept dP / div; dV takes P dropped
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = e < 2 ? key0 : key1, qr = m0 + nt * 8 + 2 * t + (e & 1);
                    const bool kept = at_kept(a, ((unsigned long long)bh * a.sq + qr) *
                                                     (unsigned long long)a.sk + key);
                    const float p = s[nt][e], d = kept ? dp[nt][e] * a.inv_div : 0.f;
                    dp[nt][e] = p * (d - cDelta[nt * 8 + 2 * t + (e & 1)]);
                    s[nt][e] = kept ? p * a.inv_div : 0.f;
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)  // dS^T
                    dp[nt][e] = s[nt][e] * (dp[nt][e] - cDelta[nt * 8 + 2 * t + (e & 1)]);
        }
#pragma unroll
        for (int j = 0; j < BM / 16; ++j) {
            FA pa, sa;
            at_a_from_c<T>(pa, s[2 * j], s[2 * j + 1]);
            at_a_from_c<T>(sa, dp[2 * j], dp[2 * j + 1]);
#pragma unroll
            for (int dt = 0; dt < HD / 16; ++dt) {
                FB b0, b1;
                at_frag_b2<T, true>(b0, b1, cD + (16 * j) * LD + dt * 16, LD);
                AtFrag<T>::mma(dv[2 * dt], pa, b0);
                AtFrag<T>::mma(dv[2 * dt + 1], pa, b1);
                at_frag_b2<T, true>(b0, b1, cQ + (16 * j) * LD + dt * 16, LD);
                AtFrag<T>::mma(dk[2 * dt], sa, b0);
                AtFrag<T>::mma(dk[2 * dt + 1], sa, b1);
            }
        }
        // dS^T to shared memory (rounded to T as the products' operands are)
#pragma unroll
        for (int nt = 0; nt < BM / 8; ++nt) {
            T *p = sS + (warp * 16 + g) * LDS + nt * 8 + 2 * t;
            at_store2<T>(p, dp[nt][0], dp[nt][1], true, true);
            at_store2<T>(p + 8 * LDS, dp[nt][2], dp[nt][3], true, true);
        }
        __syncthreads();                 // dS^T is whole; this block's Q, dO are read
        if (STAGES == 1 && more) {       // the next block streams in during the dQ step
            at_load_tile<T, HD, LD, BM, THREADS>(sQ, q, a.qss, m0 + BM, a.sq, a.d, a.vec);
            at_load_tile<T, HD, LD, BM, THREADS>(sD, dout, a.dss, m0 + BM, a.sq, a.d, a.vec);
            at_load_row<BM, THREADS>(sL, lse, m0 + BM, a.sq);
            at_load_row<BM, THREADS>(sDelta, delta, m0 + BM, a.sq);
            at_cp_commit();
        }
        // dQ rows m0 + 16 warp ..: A(i = query, k = key) = sS[key * LDS + query]
        FA sa[BN / 16];
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            at_frag_a<T, true>(sa[kk], sS + (kk * 16) * LDS + warp * 16, LDS);
        const int q0 = m0 + warp * 16 + g, q1 = q0 + 8;
#pragma unroll
        for (int c = 0; c < HD / 32; ++c) {
            float dq[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
                for (int dt = 0; dt < 2; ++dt) {
                    FB b0, b1;
                    at_frag_b2<T, true>(b0, b1, sK + (kk * 16) * LD + c * 32 + dt * 16, LD);
                    AtFrag<T>::mma(dq[2 * dt], sa[kk], b0);
                    AtFrag<T>::mma(dq[2 * dt + 1], sa[kk], b1);
                }
            }
#pragma unroll
            for (int dt = 0; dt < 4; ++dt) {
                const int col = c * 32 + dt * 8 + 2 * t;
                if (col >= a.d) continue;
                if (q0 < a.sq)
                    at_add2(dqacc + (long long)q0 * a.d + col, dq[dt][0] * a.scale,
                            dq[dt][1] * a.scale, pairs, col + 1 < a.d);
                if (q1 < a.sq)
                    at_add2(dqacc + (long long)q1 * a.d + col, dq[dt][2] * a.scale,
                            dq[dt][3] * a.scale, pairs, col + 1 < a.d);
            }
        }
    }
    at_cp_wait_all();                    // (no query block: K and V were never waited for)
    at_store_dkdv<T, HD>(a, b, h, &dk[0][0], &dv[0][0], key0, t, pairs);
}
