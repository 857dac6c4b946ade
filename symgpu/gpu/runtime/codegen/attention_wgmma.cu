// Fused attention on Hopper (sm_90a): forward and backward with warpgroup products (wgmma), pasted
// after attention.cu (its AtArgs, cp.async and store helpers) and wgmma.py's Wg<T>.
// float16 / bfloat16, no mask, a positive scale, head dim HD (64 or 128) equal to d, every row
// 16-byte aligned (attention.py picks this kernel only then; the general one runs the rest).
// A block of NWG warpgroups takes 64 * NWG query rows; K and V stream through shared memory in
// BN-key tiles (cp.async, two stages) stored in wgmma's 128-byte swizzle; S = Q K^T reads both
// operands from shared memory, O += P V takes P from registers (the accumulator layout of two
// 8-column blocks is the A fragment's) and V as an MN-major operand.
// Accumulator layout (per warp w of the warpgroup, lane = 4 g + t, column block j):
//   d[4j .. 4j+3] = (16w + g, 8j + 2t), (16w + g, 8j + 2t + 1), (16w + g + 8, 8j + 2t), (.., +1)

/* Byte offset of the 16-byte chunk `ch` (8 values) of row r in a tile of ROWS rows stored in
   the 128-byte swizzle: 64-value panels of ROWS x 128 bytes, the chunk's index XOR row % 8 */
template <int ROWS>
__device__ __forceinline__ unsigned aw_chunk(int r, int ch) {
    return (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
}

/* rows [r0, r0 + ROWS) of a (rows, HD) matrix with row stride rs into the swizzled tile at s
   (cp.async, zeros past `rows`; the caller commits and waits) */
template <typename T, int HD, int ROWS, int THREADS>
__device__ __forceinline__ void aw_load(unsigned char *s, const T *g, long long rs, int r0,
                                        int rows) {
    constexpr int CH = HD / 8;
#pragma unroll 4
    for (int c = threadIdx.x; c < ROWS * CH; c += THREADS) {
        const int r = c / CH, ch = c % CH;
        const bool ok = r0 + r < rows;
        at_cp16(s + aw_chunk<ROWS>(r, ch), g + (long long)(ok ? r0 + r : 0) * rs + ch * 8, ok);
    }
}

/* The K-major operand's descriptor at k step kk (16 values) of a swizzled tile of ROWS rows
   at shared address `at` (+ `row_bytes` for a slice of its rows: a multiple of 1024) */
template <int ROWS>
__device__ __forceinline__ unsigned long long aw_kmajor(unsigned at, int kk, unsigned row_bytes) {
    return wg_desc(at + (kk >> 2) * (ROWS * 128) + row_bytes + (kk & 3) * 32, 16, 1024);
}

/* The MN-major operand's descriptor at k step kk (rows 16 kk ..) of a swizzled tile of ROWS
   rows: its 64-value panels ROWS * 128 bytes apart */
template <int ROWS>
__device__ __forceinline__ unsigned long long aw_mnmajor(unsigned at, int kk) {
    return wg_desc(at + kk * 2048, ROWS * 128, 1024);
}

/* The dynamic shared memory's first 1024-byte aligned byte (the swizzle's atoms are) */
__device__ __forceinline__ unsigned char *aw_smem_base(unsigned char *raw, unsigned &addr) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(raw), pad = (1024 - (a & 1023)) & 1023;
    addr = a + pad;
    return raw + pad;
}

/* The forward: K and V tiles in two cp.async stages (the next streams in during this one).
   Measured against a three-stage version whose next tile's scores overlapped this tile's
   softmax: its extra registers cost more (83 against 72 us on the GPT shape). */
template <typename T, int HD, int NWG, int BN>
__device__ __forceinline__ void attn_fwd_wg_body(const AtArgs &a)
{
    constexpr int BM = 64 * NWG, THREADS = 128 * NWG;
    constexpr unsigned QBYTES = BM * HD * 2, KBYTES = BN * HD * 2;
    extern __shared__ __align__(128) unsigned char aw_smem[];
    unsigned aQ;
    unsigned char *sQ = aw_smem_base(aw_smem, aQ);
    unsigned char *sK = sQ + QBYTES, *sV = sK + 2 * KBYTES;
    const unsigned aK = aQ + QBYTES, aV = aK + 2 * KBYTES;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int m0 = (a.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * BM;
    const T *q = (const T *)a.q + b * a.qsb + h * a.qsh;
    const T *k = (const T *)a.k + b * a.ksb + h * a.ksh;
    const T *v = (const T *)a.v + b * a.vsb + h * a.vsh;
    const float sl2 = a.scale * AT_LOG2E;
    const int n_end = a.causal ? min(a.sk, m0 + BM) : a.sk;
    const int wg0 = m0 + 64 * wg, wrow = wg0 + 16 * warp;
    const int wg_end = a.causal ? min(a.sk, wg0 + 64) : a.sk;   // this warpgroup's keys
    const int row0 = wrow + g, row1 = row0 + 8;

    aw_load<T, HD, BM, THREADS>(sQ, q, a.qss, m0, a.sq);
    if (n_end > 0) {
        aw_load<T, HD, BN, THREADS>(sK, k, a.kss, 0, a.sk);
        aw_load<T, HD, BN, THREADS>(sV, v, a.vss, 0, a.sk);
    }
    at_cp_commit();
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};

    for (int n0 = 0, st = 0; n0 < n_end; n0 += BN, st ^= 1) {
        if (n0 + BN < n_end) {         // the next tile streams in while this one is used
            aw_load<T, HD, BN, THREADS>(sK + (st ^ 1) * KBYTES, k, a.kss, n0 + BN, a.sk);
            aw_load<T, HD, BN, THREADS>(sV + (st ^ 1) * KBYTES, v, a.vss, n0 + BN, a.sk);
            at_cp_commit();
            at_cp_wait_one();
        } else {
            at_cp_wait_all();
        }
        wg_proxy_fence();
        __syncthreads();
        if (n0 < wg_end) {             // (causal: a warpgroup's rows all before the tile skip it)
            float s[BN / 2];
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk)
                Wg<T>::template ss<0, 0>(s, aw_kmajor<BM>(aQ, kk, wg * 64 * 128),
                                         aw_kmajor<BN>(aK + st * KBYTES, kk, 0), kk > 0);
            wg_commit();
            wg_wait<0>();
            wg_keep(s);
            const bool edge = (n0 + BN > a.sk) || (a.causal && n0 + BN - 1 > wrow);
            float base[2], alpha[2];
            at_online_max<BN>(s, n0, row0, t, a.sk, a.causal, edge, sl2, mrow, lrow, base, alpha);
            unsigned p[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {   // one FFMA and one EX2 a probability
                float e[8];
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    e[i] = at_exp2(fmaf(s[8 * kk + i], sl2, -base[(i >> 1) & 1]));
                lrow[0] += (e[0] + e[1]) + (e[4] + e[5]);
                lrow[1] += (e[2] + e[3]) + (e[6] + e[7]);
#pragma unroll
                for (int i = 0; i < 4; ++i) p[kk][i] = AtFrag<T>::pack(e[2 * i], e[2 * i + 1]);
            }
#pragma unroll
            for (int i = 0; i < HD / 8; ++i) {
                o[4 * i] *= alpha[0]; o[4 * i + 1] *= alpha[0];
                o[4 * i + 2] *= alpha[1]; o[4 * i + 3] *= alpha[1];
            }
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                Wg<T>::template rs<1>(o, p[kk], aw_mnmajor<BN>(aV + st * KBYTES, kk), 1);
            wg_commit();
            wg_wait<0>();
            wg_keep(o);
            wg_keep(p);
        }
        __syncthreads();                 // this stage is free for the tile after next
    }
    T *out = (T *)a.o + b * a.osb + h * a.osh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = lrow[r] + __shfl_xor_sync(0xffffffffu, lrow[r], 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = r ? row1 : row0;
        if (row >= a.sq) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt)
            at_store2<T>(out + (long long)row * a.oss + dt * 8 + 2 * t, o[4 * dt + 2 * r] * inv,
                         o[4 * dt + 2 * r + 1] * inv, true, true);
        if (t == 0)
            a.lse[(long long)bh * a.sq + row] =
                l > 0.f ? ((mrow[r] == -INFINITY ? 0.f : mrow[r]) + log2f(l)) * AT_LN2
                        : -INFINITY;
    }
}
/* Two 16-bit values (x, y) at (row r, columns c, c + 1) of a swizzled tile of ROWS rows
   (c even) */
template <typename T, int ROWS>
__device__ __forceinline__ void aw_put2(unsigned char *s, int r, int c, float x, float y) {
    *reinterpret_cast<unsigned *>(s + aw_chunk<ROWS>(r, c >> 3) + (c & 7) * 2) =
        AtFrag<T>::pack(x, y);
}

/* dqacc[q0, c0 ..] and dqacc[q0 + 8, c0 ..] += scale * a warpgroup's dQ accumulator (rows
   past sq skipped; lane = 4 g + t) */
template <int N>
__device__ __forceinline__ void aw_dq_add(float *dqacc, const float (&dq)[N / 2], int q0, int c0,
                                          int t, int sq, int d, float scale) {
    float *p0 = dqacc + (long long)q0 * d + c0 + 2 * t, *p1 = p0 + 8LL * d;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        if (q0 < sq) at_add2(p0 + 8 * j, dq[4 * j] * scale, dq[4 * j + 1] * scale, true, true);
        if (q0 + 8 < sq)
            at_add2(p1 + 8 * j, dq[4 * j + 2] * scale, dq[4 * j + 3] * scale, true, true);
    }
}

/* The backward: a block of NWG warpgroups takes 64 * NWG keys (64 a warpgroup) and loops over
   the query blocks of 64 * QF (the next one's Q, dO, lse and Delta stream in during this one):
   S^T = K Q^T and dP^T = V dO^T (shared-memory operands), P^T = exp(S^T - lse),
   dS^T = P^T (dP^T - Delta); dV += P^T dO and dK += dS^T Q from registers; dS^T goes to
   shared memory (swizzled) and dQ = dS K (both operands MN-major) is added into the float
   accumulator with atomics, the warpgroups splitting its rows (QF == NWG) or else its
   columns. (Measured on the GPT shape: query blocks of 128 with two warpgroups 198 us, of 64
   215; a step's dQ atomics deferred to run during the next step's first products, +8 us.) */
template <typename T, int HD, int NWG, int QF>
__device__ __forceinline__ void attn_bwd_wg_body(const AtBwdArgs &a)
{
    static_assert(QF == 1 || QF == NWG, "dQ's split: by rows (QF == NWG) or by columns");
    constexpr int BM = 64 * QF, BN = 64 * NWG, THREADS = 128 * NWG;
    constexpr bool ROWS_SPLIT = QF == NWG && NWG > 1;
    constexpr int DQN = ROWS_SPLIT ? HD : HD / NWG;
    constexpr unsigned KB = BN * HD * 2, QB = BM * HD * 2, SB = BN * BM * 2;
    extern __shared__ __align__(128) unsigned char aw_smem[];
    unsigned aK;
    unsigned char *sK = aw_smem_base(aw_smem, aK);
    unsigned char *sV = sK + KB, *sQ = sV + KB, *sD = sQ + 2 * QB, *sS = sD + 2 * QB;
    float *sL = reinterpret_cast<float *>(sS + SB), *sDelta = sL + 2 * BM;
    const unsigned aV = aK + KB, aQ = aV + KB, aD = aQ + 2 * QB, aS = aD + 2 * QB;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads, n0 = blockIdx.y * BN;
    const T *q = (const T *)a.q + b * a.qsb + h * a.qsh;
    const T *k = (const T *)a.k + b * a.ksb + h * a.ksh;
    const T *v = (const T *)a.v + b * a.vsb + h * a.vsh;
    const T *dout = (const T *)a.dout + b * a.dsb + h * a.dsh;
    const float *lse = a.lse + (long long)bh * a.sq, *delta = a.delta + (long long)bh * a.sq;
    float *dqacc = a.dqacc + (long long)bh * a.sq * a.d;
    const float sl2 = a.scale * AT_LOG2E;
    const int m_start = a.causal ? (n0 / BM) * BM : 0;
    const int kw0 = n0 + 64 * wg;                 // the warpgroup's first key
    const int key0 = kw0 + 16 * warp + g, key1 = key0 + 8;
    const int srow = 64 * wg + 16 * warp + g;     // its dS^T rows in shared memory: srow, +8

    aw_load<T, HD, BN, THREADS>(sK, k, a.kss, n0, a.sk);
    aw_load<T, HD, BN, THREADS>(sV, v, a.vss, n0, a.sk);
    if (m_start < a.sq) {
        aw_load<T, HD, BM, THREADS>(sQ, q, a.qss, m_start, a.sq);
        aw_load<T, HD, BM, THREADS>(sD, dout, a.dss, m_start, a.sq);
        at_load_row<BM, THREADS>(sL, lse, m_start, a.sq);
        at_load_row<BM, THREADS>(sDelta, delta, m_start, a.sq);
    }
    at_cp_commit();
    float dk[HD / 2], dv[HD / 2], dq[DQN / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) dk[i] = dv[i] = 0.f;
    // the warpgroup's part of dQ: rows r0 .. r0 + 63 of a query block, columns c0 .. c0 + DQN
    const int c0 = ROWS_SPLIT ? 0 : DQN * wg, r0 = ROWS_SPLIT ? 64 * wg : 0;
    const int dq_row = r0 + 16 * warp + g;

    for (int m0 = m_start, st = 0; m0 < a.sq; m0 += BM, st ^= 1) {
        at_cp_wait_all();
        wg_proxy_fence();
        __syncthreads();                 // this block's tiles are in; the last dQ step is done
        if (m0 + BM < a.sq) {
            // The next block goes into the last step's stage only now: each warpgroup waits
            // for its products reading that stage before this barrier, but the other one's
            // dV/dK products may still be reading it until then.
            const int nx = st ^ 1;
            aw_load<T, HD, BM, THREADS>(sQ + nx * QB, q, a.qss, m0 + BM, a.sq);
            aw_load<T, HD, BM, THREADS>(sD + nx * QB, dout, a.dss, m0 + BM, a.sq);
            at_load_row<BM, THREADS>(sL + nx * BM, lse, m0 + BM, a.sq);
            at_load_row<BM, THREADS>(sDelta + nx * BM, delta, m0 + BM, a.sq);
            at_cp_commit();
        }
        const unsigned cQ = aQ + st * QB, cD = aD + st * QB;
        const float *cL = sL + st * BM, *cDelta = sDelta + st * BM;
        unsigned pa[BM / 16][4], sa[BM / 16][4];
        if (a.causal && m0 + BM - 1 < kw0) {      // every key after every query: dS^T = 0
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt) {
                aw_put2<T, BN>(sS, srow, nt * 8 + 2 * t, 0.f, 0.f);
                aw_put2<T, BN>(sS, srow + 8, nt * 8 + 2 * t, 0.f, 0.f);
            }
        } else {
            float s[BM / 2], dp[BM / 2];
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk)
                Wg<T>::template ss<0, 0>(s, aw_kmajor<BN>(aK, kk, wg * 64 * 128),
                                         aw_kmajor<BM>(cQ, kk, 0), kk > 0);
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk)
                Wg<T>::template ss<0, 0>(dp, aw_kmajor<BN>(aV, kk, wg * 64 * 128),
                                         aw_kmajor<BM>(cD, kk, 0), kk > 0);
            wg_commit();
            wg_wait<0>();
            wg_keep(s);
            wg_keep(dp);
            const bool edge = (m0 + BM > a.sq) || (kw0 + 64 > a.sk) ||
                              (a.causal && kw0 + 63 > m0);
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int ql = nt * 8 + 2 * t + (e & 1), i = 4 * nt + e;
                    const float l = cL[ql];  // a fully masked row's -inf: probabilities 0
                    float p = at_exp2(fmaf(s[i], sl2, l == -INFINITY ? -INFINITY : -l * AT_LOG2E));
                    if (edge) {          // queries or keys past the ends, keys after the query
                        const int key = e < 2 ? key0 : key1, qr = m0 + ql;
                        if (qr >= a.sq || key >= a.sk || (a.causal && key > qr)) p = 0.f;
                    }
                    s[i] = p;
                    dp[i] = p * (dp[i] - cDelta[ql]);
                }
            }
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    pa[kk][i] = AtFrag<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
                    sa[kk][i] = AtFrag<T>::pack(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
                }
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk) {
                Wg<T>::template rs<1>(dv, pa[kk], aw_mnmajor<BM>(cD, kk), 1);
                Wg<T>::template rs<1>(dk, sa[kk], aw_mnmajor<BM>(cQ, kk), 1);
            }
            wg_commit();
#pragma unroll
            for (int nt = 0; nt < BM / 8; ++nt) {      // dS^T, rounded as the products' operands
                aw_put2<T, BN>(sS, srow, nt * 8 + 2 * t, dp[4 * nt], dp[4 * nt + 1]);
                aw_put2<T, BN>(sS, srow + 8, nt * 8 + 2 * t, dp[4 * nt + 2], dp[4 * nt + 3]);
            }
        }
        wg_proxy_fence();
        __syncthreads();                 // dS^T is whole
        // dQ: A = dS (queries x keys), stored M-major as dS^T (its 64-query panels BN * 128
        // bytes apart)
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            Wg<T>::template ss<1, 1>(dq, aw_mnmajor<BN>(aS + (r0 >> 6) * (BN * 128), kk),
                                     wg_desc(aK + (c0 >> 6) * (BN * 128) + (c0 & 63) * 2 +
                                             kk * 2048, BN * 128, 1024), kk > 0);
        wg_commit();
        wg_wait<0>();
        wg_keep(dq);
        wg_keep(dv);
        wg_keep(dk);
        wg_keep(pa);
        wg_keep(sa);
        aw_dq_add<DQN>(dqacc, dq, m0 + dq_row, c0, t, a.sq, a.d, a.scale);
    }
    at_cp_wait_all();                    // (no query block: K and V were never waited for)
    at_store_dkdv<T, HD>(a, b, h, dk, dv, key0, t, true);
}
//@ head

extern "C" __global__ void __launch_bounds__(${wg_threads}, ${wg_min_blocks})
attn_fwd_wg_${dtype}_${hd}(AtArgs a)
{ attn_fwd_wg_body<${ctype}, ${hd}, ${wg_fwd}, ${wg_keys}>(a); }

extern "C" __global__ void __launch_bounds__(${wg_bwd_threads}, ${wg_bwd_min_blocks})
attn_bwd_wg_${dtype}_${hd}(AtBwdArgs a)
{ attn_bwd_wg_body<${ctype}, ${hd}, ${wg_bwd}, ${wg_bwd_queries}>(a); }
