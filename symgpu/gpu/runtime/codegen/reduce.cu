/* symgpu reduction module: ${title}
 *
 * Rendered by symgpu/gpu/runtime/codegen/reduce.py.  The problem is always "K kept positions, each
 * reducing R values": position (k, r) of operand i sits at element offset koff_i(k) + roff_i(r),
 * with SG_KND kept and SG_RND reduced dimensions left after collapsing (one each in the common
 * cases: all axes, leading axes, trailing axes).  sg_value applies the fused elementwise pre-op
 * (sum(x**2) reads x once) and converts to the accumulator type acc_t.
 *
 * Kernels:
 *   sg_rows_{final,partial,onepass}
 *                            threads along r (reduced axis contiguous): a warp per row
 *                            (blockDim 32x8) or a block per row (blockDim 256x1)
 *   sg_vrows_{final,onepass} the same when every operand's R values of a row sit at consecutive
 *                            addresses (SG_RND 1, stride 1, one item size): 16-byte loads from
 *                            each row's first 16-byte boundary, four in flight per thread, a
 *                            scalar head and tail (rows whose operands are misaligned with one
 *                            another take the scalar loop); emitted where SG_VW > 0
 *   sg_cols_{final,partial}  threads along k (kept axis contiguous), blockDim 32x8: 32 columns
 *                            per block, 8 lanes down r combined through shared memory
 *   sg_cols_block            the same with blockDim CxY (C of 8, 16 or 32 columns, C * Y = 1024)
 *                            walking the whole of R: each block finishes its columns itself (a
 *                            warp per column combines the Y lanes' values from shared memory),
 *                            so a column reduction of moderate R is one launch, no partials,
 *                            no atomics
 *   sg_cols_tile             tall arrays of many contiguous columns (a bias gradient d.sum(0)
 *                            of an (8192, 2304) activation), blockDim 32x8: a thread owns
 *                            SG_CV adjacent columns, read as one aligned access of every
 *                            operand per row (a scalar loop where the columns are not aligned,
 *                            the last ones of a width that is not a multiple of SG_CV), a
 *                            block a tile of 32 * SG_CV columns by `chunk` rows (gridDim.y
 *                            row tiles); the 8 row lanes combine through shared memory, the
 *                            row tiles' partials (a (G, K) array: coalesced) by the last block
 *                            of each column tile, in a fixed order (one launch, no float
 *                            atomics, the same bits every launch); G == 1 stores directly
 *   sg_finish                reduces the (K, G) partials when R was split over G blocks
 * A *partial* launch splits R over gridDim.y = G blocks, each writing its share to
 * partial[k * G + blockIdx.y], and sg_finish combines them in a second launch.  A *onepass*
 * launch does both in one: after writing its partials a block fences, then bumps
 * counters[blockIdx.x] with atomicInc(.., G - 1); the block that sees G - 1 is the last of its
 * column, combines the column's partials (in a fixed order: deterministic) and stores the
 * results.  atomicInc wraps the counter back to 0 at that moment, so the counters (zeroed once
 * when allocated) are zero between launches, as CUDA-graph replays need.
 * Warp steps use __shfl_down_sync over full warps (never warp-synchronous volatile memory).
 */
${common}
${apply}
typedef ${acc_ctype} acc_t;   /* ${acc_dtype} */
typedef ${out_ctype} out_t;   /* ${out_dtype} */
#define SG_NIN ${nin}
#define SG_KND ${knd}
#define SG_RND ${rnd}
#define SG_VW ${vw}      /* elements per 16-byte vector; 0: no vector kernels */
#define SG_CV ${cv}      /* adjacent columns a thread of sg_cols_tile owns */
#define SG_IDENTITY (${identity})
#define SG_COLS_Y 8
#define SG_FINAL 0
#define SG_PARTIAL 1
#define SG_ONEPASS 2

__device__ __forceinline__ acc_t sg_combine(const acc_t a, const acc_t b) { return ${combine}; }

#if SG_VW
/* element u (a compile-time constant once unrolled) of the SG_VW storage elements that 16 loaded
 * bytes hold, taken out of the four 32-bit words with shifts (a byte array indexed in a loop
 * would go through local memory) */
template <typename T> __device__ __forceinline__ T sg_velem(const uint4 &r, const int u)
{
    T v;
    if (sizeof(T) == 8) {
        const unsigned long long q = u == 0 ? ((unsigned long long)r.y << 32) | r.x
                                            : ((unsigned long long)r.w << 32) | r.z;
        memcpy(&v, &q, 8);
    } else {
        const int word = u * (int)sizeof(T) / 4;
        const unsigned int w = word == 0 ? r.x : word == 1 ? r.y : word == 2 ? r.z : r.w;
        const unsigned int bits = w >> (8 * ((u * (int)sizeof(T)) & 3));
        if (sizeof(T) == 4) memcpy(&v, &w, 4);
        else if (sizeof(T) == 2) { const unsigned short h = (unsigned short)bits; memcpy(&v, &h, 2); }
        else { const unsigned char c = (unsigned char)bits; memcpy(&v, &c, 1); }
    }
    return v;
}
#endif

struct sg_rmeta {
    long long kshape[SG_KND];
    long long rshape[SG_RND];
    long long kstride[SG_NIN][SG_KND];   /* in elements, 0 where broadcast */
    long long rstride[SG_NIN][SG_RND];
};

/* SG_CV adjacent values of one operand (kept stride ks: 1, or 0 for one value repeated) as one
 * aligned access (sg_cols_tile; the caller checked the alignment: sg_cvec_ok) */
template <typename T, int N> struct alignas(N * sizeof(T)) sg_cvec { T v[N]; };
template <typename T>
__device__ __forceinline__ void sg_cvec_load(const T *at, const long long ks, T *x)
{
    if (ks == 0) {
        const T one = *at;
#pragma unroll
        for (int u = 0; u < SG_CV; ++u) x[u] = one;
    } else {
        const sg_cvec<T, SG_CV> w = *reinterpret_cast<const sg_cvec<T, SG_CV> *>(at);
#pragma unroll
        for (int u = 0; u < SG_CV; ++u) x[u] = w.v[u];
    }
}

${operands}

__device__ __forceinline__ void sg_koff(const sg_rmeta &m, long long k, long long *off)
{
    sg_kept_offsets<SG_NIN, SG_KND>(m, k, off);
}

__device__ __forceinline__ acc_t sg_at(const sg_rmeta &m, const sg_rptrs &p,
                                       const long long *koff, long long r)
{
    long long off[SG_NIN];
#pragma unroll
    for (int i = 0; i < SG_NIN; ++i) off[i] = koff[i];
#pragma unroll
    for (int d = SG_RND - 1; d >= 0; --d) {
        const long long c = (d == 0) ? r : r % m.rshape[d];
        if (d > 0) r /= m.rshape[d];
#pragma unroll
        for (int i = 0; i < SG_NIN; ++i) off[i] += c * m.rstride[i][d];
    }
    return sg_value(p, off);
}

/* combine the values at r, r + lanes, ... below r_end, eight loads in flight per thread */
__device__ __forceinline__ acc_t sg_strip(const sg_rmeta &m, const sg_rptrs &p,
                                          const long long *koff, long long r,
                                          const long long r_end, const long long lanes)
{
    acc_t acc = SG_IDENTITY;
    for (; r + 7 * lanes < r_end; r += 8 * lanes) {
        acc_t v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = sg_at(m, p, koff, r + u * lanes);
#pragma unroll
        for (int w = 4; w > 0; w >>= 1)
#pragma unroll
            for (int u = 0; u < w; ++u) v[u] = sg_combine(v[u], v[u + w]);
        acc = sg_combine(acc, v[0]);
    }
    for (; r < r_end; r += lanes) acc = sg_combine(acc, sg_at(m, p, koff, r));
    return acc;
}

__device__ __forceinline__ acc_t sg_warp_reduce(acc_t v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = sg_combine(v, __shfl_down_sync(0xffffffffu, v, off));
    return v;
}

/* reduce over threadIdx.x (a whole warp, or the whole block when blockDim.y == 1); the result
 * is valid in threadIdx.x == 0.  Called uniformly by every thread of the block. */
__device__ __forceinline__ acc_t sg_row_reduce(acc_t v, acc_t *sm)
{
    v = sg_warp_reduce(v);
    if (blockDim.x <= 32) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sm[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x >> 5)) ? sm[lane] : SG_IDENTITY;
    if (warp == 0) v = sg_warp_reduce(v);
    __syncthreads();
    return v;
}

/* (one-pass launches end with common.cuh's sg_last_block) */

/* the last block of a rows-shaped one-pass launch: the same kept positions as the block's own
 * loop, each combining its G partials over threadIdx.x */
__device__ __forceinline__ void sg_rows_gather(const long long K, const sg_rptrs &p, acc_t *sm)
{
    const long long G = gridDim.y;
    const long long k_step = (long long)gridDim.x * blockDim.y;
    for (long long k = (long long)blockIdx.x * blockDim.y + threadIdx.y; k < K; k += k_step) {
        acc_t acc = SG_IDENTITY;
        for (long long g = threadIdx.x; g < G; g += blockDim.x)
            acc = sg_combine(acc, __ldcg(p.partial + k * G + g));
        acc = sg_row_reduce(acc, sm);
        if (threadIdx.x == 0) sg_put_p(p, k, acc);
    }
}

template <int MODE>
__device__ __forceinline__ void sg_rows_body(const long long K, const long long R,
                                             const long long chunk, const sg_rmeta &m,
                                             const sg_rptrs &p)
{
    __shared__ acc_t sm[32];
    const long long r_begin = (long long)blockIdx.y * chunk;
    const long long r_end = min(R, r_begin + chunk);
    const long long k_step = (long long)gridDim.x * blockDim.y;
    for (long long k = (long long)blockIdx.x * blockDim.y + threadIdx.y; k < K; k += k_step) {
        long long koff[SG_NIN];
        sg_koff(m, k, koff);
        acc_t acc = sg_strip(m, p, koff, r_begin + threadIdx.x, r_end, blockDim.x);
        acc = sg_row_reduce(acc, sm);
        if (threadIdx.x == 0) {
            if (MODE == SG_FINAL) sg_put_p(p, k, acc);
            else p.partial[k * gridDim.y + blockIdx.y] = acc;
        }
    }
    if (MODE == SG_ONEPASS && sg_last_block(p.counters)) sg_rows_gather(K, p, sm);
}

#if SG_VW
/* sg_vrows: the rows kernels for operands whose reduced values are contiguous.  The G * blockDim.x
 * lanes of a row (G = gridDim.y) take its 16-byte vectors round-robin, four in flight per thread;
 * lane t < SG_VW also takes head element t (before the first 16-byte boundary) and tail element
 * t (after the last whole vector).  A row whose operands sit at different offsets from a 16-byte
 * boundary has no common vector grid: it takes the scalar loop. */
template <int MODE>
__device__ __forceinline__ void sg_vrows_body(const long long K, const long long R,
                                              const sg_rmeta &m, const sg_rptrs &p)
{
    __shared__ acc_t sm[32];
    const long long lanes = (long long)gridDim.y * blockDim.x;
    const long long lane = (long long)blockIdx.y * blockDim.x + threadIdx.x;
    const long long k_step = (long long)gridDim.x * blockDim.y;
    for (long long k = (long long)blockIdx.x * blockDim.y + threadIdx.y; k < K; k += k_step) {
        long long koff[SG_NIN];
        sg_koff(m, k, koff);
        acc_t acc;
        const unsigned int mis = sg_misalign(p, koff);
        if (mis >= 16u) {
            acc = sg_strip(m, p, koff, lane, R, lanes);
        } else {
            const long long head = min(R, (long long)(((16u - mis) & 15u) / SG_ITEM));
            const long long nvec = (R - head) / SG_VW;
            const long long tail = head + nvec * SG_VW;
            acc = SG_IDENTITY;
            if (lane < head) acc = sg_at(m, p, koff, lane);
            if (lane < R - tail) acc = sg_combine(acc, sg_at(m, p, koff, tail + lane));
            const sg_vbase b = sg_vbase_at(p, koff, head);
            long long j = lane;
            for (; j + 3 * lanes < nvec; j += 4 * lanes) {
                const sg_vraw v0 = sg_vload(b, j), v1 = sg_vload(b, j + lanes);
                const sg_vraw v2 = sg_vload(b, j + 2 * lanes), v3 = sg_vload(b, j + 3 * lanes);
                acc = sg_combine(acc, sg_combine(sg_combine(sg_vreduce(v0), sg_vreduce(v1)),
                                                 sg_combine(sg_vreduce(v2), sg_vreduce(v3))));
            }
            for (; j < nvec; j += lanes) acc = sg_combine(acc, sg_vreduce(sg_vload(b, j)));
        }
        acc = sg_row_reduce(acc, sm);
        if (threadIdx.x == 0) {
            if (MODE == SG_FINAL) sg_put_p(p, k, acc);
            else p.partial[k * gridDim.y + blockIdx.y] = acc;
        }
    }
    if (MODE == SG_ONEPASS && sg_last_block(p.counters)) sg_rows_gather(K, p, sm);
}
#endif
template <bool FINAL>
__device__ __forceinline__ void sg_cols_body(const long long K, const long long R,
                                             const long long chunk, const sg_rmeta &m,
                                             const sg_rptrs &p)
{
    __shared__ acc_t sm[SG_COLS_Y][33];
    const long long r_begin = (long long)blockIdx.y * chunk;
    const long long r_end = min(R, r_begin + chunk);
    for (long long kb = (long long)blockIdx.x * 32; kb < K; kb += (long long)gridDim.x * 32) {
        const long long k = kb + threadIdx.x;
        acc_t acc = SG_IDENTITY;
        if (k < K) {
            long long koff[SG_NIN];
            sg_koff(m, k, koff);
            acc = sg_strip(m, p, koff, r_begin + threadIdx.y, r_end, SG_COLS_Y);
        }
        sm[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && k < K) {
            acc_t a = sm[0][threadIdx.x];
#pragma unroll
            for (int t = 1; t < SG_COLS_Y; ++t) a = sg_combine(a, sm[t][threadIdx.x]);
            if (FINAL) sg_put_p(p, k, a);
            else p.partial[k * gridDim.y + blockIdx.y] = a;
        }
        __syncthreads();
    }
}

/* sg_cols_block: blockDim.x (8, 16 or 32) columns kb + threadIdx.x, each combining rows
 * threadIdx.y + i * blockDim.y over the whole of R (blockDim.x * blockDim.y == 1024: narrow
 * blocks spread few columns over more multiprocessors); then the blockDim.y values of each
 * column are combined by one warp (lane t reads rows t, t + 32, ... of the shared tile, in a
 * fixed order: the same bits every launch) */
#define SG_CB_ROWS 128    /* the most blockDim.y: 1024 threads over 8 columns */
__device__ __forceinline__ void sg_cols_block_body(const long long K, const long long R,
                                                   const sg_rmeta &m, const sg_rptrs &p)
{
    __shared__ acc_t sm[SG_CB_ROWS][33];
    const int cw = blockDim.x, lanes = blockDim.y;
    const int tid = threadIdx.y * cw + threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, nwarps = (cw * lanes) >> 5;
    for (long long kb = (long long)blockIdx.x * cw; kb < K; kb += (long long)gridDim.x * cw) {
        const long long k = kb + threadIdx.x;
        acc_t acc = SG_IDENTITY;
        if (k < K) {
            long long koff[SG_NIN];
            sg_koff(m, k, koff);
            acc = sg_strip(m, p, koff, threadIdx.y, R, lanes);
        }
        sm[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        for (int c = warp; c < cw; c += nwarps) {
            acc_t v = SG_IDENTITY;
            for (int t = lane; t < lanes; t += 32) v = sg_combine(v, sm[t][c]);
            v = sg_warp_reduce(v);
            if (lane == 0 && kb + c < K) sg_put_p(p, kb + c, v);
        }
        __syncthreads();
    }
}

/* sg_cols_tile (see the header) */
#define SG_CT_X 32
#define SG_CT_Y 8
#define SG_CT_COLS (SG_CT_X * SG_CV)
/* combine rows r, r + SG_CT_Y, ... below r_end of columns k0 .. k0 + SG_CV - 1 into acc */
__device__ __forceinline__ void sg_ctile_strip(const sg_rmeta &m, const sg_rptrs &p,
                                               const long long k0, const long long K,
                                               long long r, const long long r_end, acc_t *acc)
{
#if SG_KND == 1 && SG_RND == 1
    long long koff[SG_NIN];
    sg_koff(m, k0, koff);
    if (k0 + SG_CV <= K && sg_cvec_ok(m, p, koff)) {
        for (; r + 3 * SG_CT_Y < r_end; r += 4 * SG_CT_Y) {
            const sg_craw c0 = sg_cload(m, p, koff, r), c1 = sg_cload(m, p, koff, r + SG_CT_Y);
            const sg_craw c2 = sg_cload(m, p, koff, r + 2 * SG_CT_Y);
            const sg_craw c3 = sg_cload(m, p, koff, r + 3 * SG_CT_Y);
            acc_t a[SG_CV], b[SG_CV];
#pragma unroll
            for (int u = 0; u < SG_CV; ++u) { a[u] = SG_IDENTITY; b[u] = SG_IDENTITY; }
            sg_cadd(a, c0); sg_cadd(b, c1); sg_cadd(a, c2); sg_cadd(b, c3);
#pragma unroll
            for (int u = 0; u < SG_CV; ++u) acc[u] = sg_combine(acc[u], sg_combine(a[u], b[u]));
        }
        for (; r < r_end; r += SG_CT_Y) sg_cadd(acc, sg_cload(m, p, koff, r));
        return;
    }
#endif
#pragma unroll
    for (int u = 0; u < SG_CV; ++u) {
        if (k0 + u < K) {
            long long ku[SG_NIN];
            sg_koff(m, k0 + u, ku);
            acc[u] = sg_strip(m, p, ku, r, r_end, SG_CT_Y);
        }
    }
}

__device__ __forceinline__ void sg_cols_tile_body(const long long K, const long long R,
                                                  const long long chunk, const sg_rmeta &m,
                                                  const sg_rptrs &p)
{
    __shared__ acc_t sm[SG_CT_Y][SG_CT_COLS];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * SG_CT_X + tx;
    const long long r_begin = (long long)blockIdx.y * chunk;
    const long long r_end = min(R, r_begin + chunk);
    const long long G = gridDim.y;
    for (long long kb = (long long)blockIdx.x * SG_CT_COLS; kb < K;
         kb += (long long)gridDim.x * SG_CT_COLS) {
        acc_t acc[SG_CV];
#pragma unroll
        for (int u = 0; u < SG_CV; ++u) acc[u] = SG_IDENTITY;
        const long long k0 = kb + (long long)tx * SG_CV;
        if (k0 < K) sg_ctile_strip(m, p, k0, K, r_begin + ty, r_end, acc);
        /* column tx * SG_CV + u of the tile at slot u * 32 + tx: conflict-free stores */
#pragma unroll
        for (int u = 0; u < SG_CV; ++u) sm[ty][u * SG_CT_X + tx] = acc[u];
        __syncthreads();
        for (int c = tid; c < SG_CT_COLS; c += SG_CT_X * SG_CT_Y) {
            const int slot = (c % SG_CV) * SG_CT_X + c / SG_CV;
            acc_t a = sm[0][slot];
#pragma unroll
            for (int t = 1; t < SG_CT_Y; ++t) a = sg_combine(a, sm[t][slot]);
            if (kb + c < K) {
                if (G == 1) sg_put_p(p, kb + c, a);
                else p.partial[blockIdx.y * K + kb + c] = a;
            }
        }
        __syncthreads();
    }
    if (G == 1 || !sg_last_block(p.counters)) return;
    /* the last block of this blockIdx.x: each column's G partials, lane l of the column taking
     * g = l, l + lanes, ... in order, the lanes then combined in order (deterministic) */
    const int lanes = (SG_CT_X * SG_CT_Y) / SG_CT_COLS;
    const int c = tid % SG_CT_COLS, l = tid / SG_CT_COLS;
    acc_t *flat = &sm[0][0];
    for (long long kb = (long long)blockIdx.x * SG_CT_COLS; kb < K;
         kb += (long long)gridDim.x * SG_CT_COLS) {
        acc_t a = SG_IDENTITY;
        if (kb + c < K) {
#pragma unroll 4
            for (long long g = l; g < G; g += lanes) a = sg_combine(a, __ldcg(p.partial + g * K + kb + c));
        }
        flat[l * SG_CT_COLS + c] = a;
        __syncthreads();
        if (l == 0 && kb + c < K) {
            acc_t s = flat[c];
            for (int t = 1; t < lanes; ++t) s = sg_combine(s, flat[t * SG_CT_COLS + c]);
            sg_put_p(p, kb + c, s);
        }
        __syncthreads();
    }
}

#define SG_ARGS const long long K, const long long R, const long long chunk, \
                const sg_rmeta m, const sg_rptrs p
extern "C" __global__ void sg_rows_final(SG_ARGS) { sg_rows_body<SG_FINAL>(K, R, chunk, m, p); }
extern "C" __global__ void sg_rows_partial(SG_ARGS) { sg_rows_body<SG_PARTIAL>(K, R, chunk, m, p); }
extern "C" __global__ void sg_rows_onepass(SG_ARGS) { sg_rows_body<SG_ONEPASS>(K, R, chunk, m, p); }
extern "C" __global__ void sg_cols_final(SG_ARGS) { sg_cols_body<true>(K, R, chunk, m, p); }
extern "C" __global__ void sg_cols_partial(SG_ARGS) { sg_cols_body<false>(K, R, chunk, m, p); }
/* 1024 threads (32x32, 16x64 or 8x128): at most 64 registers */
extern "C" __global__ void __launch_bounds__(1024) sg_cols_block(SG_ARGS)
{ sg_cols_block_body(K, R, m, p); }
/* at most 85 registers (3 blocks of 256 a multiprocessor): a heavy fused pre-op (a layer
   norm's gain gradient: two divisions and a square root a value) over 4 rows in flight took
   226 registers, one block a multiprocessor, 570 GB/s on the H200 */
extern "C" __global__ void __launch_bounds__(256, 3) sg_cols_tile(SG_ARGS)
{ sg_cols_tile_body(K, R, chunk, m, p); }
#if SG_VW
/* 256 threads (256x1 or 32x8), at most 64 registers: 4 blocks (1024 threads) per multiprocessor */
extern "C" __global__ void __launch_bounds__(256, 4) sg_vrows_final(SG_ARGS)
{ sg_vrows_body<SG_FINAL>(K, R, m, p); }
extern "C" __global__ void __launch_bounds__(256, 4) sg_vrows_onepass(SG_ARGS)
{ sg_vrows_body<SG_ONEPASS>(K, R, m, p); }
#endif
extern "C" __global__ void sg_finish(const long long K, const long long G,
                                     const acc_t *partial, out_t *out${finish_params})
{
    const long long k_step = (long long)gridDim.x * blockDim.y;
    for (long long k = (long long)blockIdx.x * blockDim.y + threadIdx.y; k < K; k += k_step) {
        acc_t acc = SG_IDENTITY;
        for (long long g = threadIdx.x; g < G; g += 32) acc = sg_combine(acc, partial[k * G + g]);
        acc = sg_warp_reduce(acc);
        if (threadIdx.x == 0) sg_put(out, k, acc${finish_args});
    }
}
