// Fused attention on Hopper (sm_90a): the forward with warpgroup products (wgmma), pasted
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
    const int bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
    const int m0 = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
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
            if (edge) {                // keys past the end or after the row (causal): none
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = e < 2 ? row0 : row1, col = n0 + nt * 8 + 2 * t + (e & 1);
                        if (col >= a.sk || (a.causal && col > row)) s[4 * nt + e] = -INFINITY;
                    }
            }
            float mx[2] = {-INFINITY, -INFINITY}, base[2], alpha[2];
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) {
                mx[0] = fmaxf(mx[0], fmaxf(s[4 * nt], s[4 * nt + 1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[4 * nt + 2], s[4 * nt + 3]));
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                mx[r] = fmaxf(mrow[r], mx[r] * sl2);
                base[r] = mx[r] == -INFINITY ? 0.f : mx[r];
                alpha[r] = at_exp2(mrow[r] - base[r]);
                mrow[r] = mx[r];
                lrow[r] *= alpha[r];
            }
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
//@ head

extern "C" __global__ void __launch_bounds__(${wg_threads}, ${wg_min_blocks})
attn_fwd_wg_${dtype}_${hd}(AtArgs a)
{ attn_fwd_wg_body<${ctype}, ${hd}, ${wg_fwd}, ${wg_keys}>(a); }
