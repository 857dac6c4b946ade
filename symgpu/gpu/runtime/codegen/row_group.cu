/* symgpu row-reduction group: ${title}
 *
 * Rendered by symgpu/gpu/runtime/codegen/row_group.py for GpuRowReduceGroup
 * (symgpu/gpu/ops/row_group.py).  K rows (the kept positions, SG_KND kept dims, row k's operand
 * i at element offset koff_i(k)), each reduced by RG_NM members: member q reduces C[q] values
 * j = 0 .. C[q] - 1 of its operands (operand i's value j at koff_i(k) + j * cstride[i]; 0 where
 * it is one value per row) through its own pre-op, stores its result through its own epilogue,
 * and later members may read that stored result (a layer norm's variance reads its mean: the
 * chain), so every lane of the row needs it: the lanes all-reduce with __shfl_xor_sync (and,
 * for a block per row, through shared memory), then lane 0 stores.
 *
 * Kernels:
 *   rg_warp_rows   a warp per row, 8 rows per 256-thread block (rows up to RG_WIDE values)
 *   rg_block_rows  a 256-thread block per row (longer rows)
 * Both stride over the rows (gridDim.x is capped), and read 4 adjacent values a lane at a time
 * where the layout allows (m.vec), else one.  One launch for the whole group: no
 * partials, no atomics, no counters, so a replayed CUDA graph needs nothing reset.
 */
${common}
${apply}
#define SG_KND ${knd}
#define RG_NIN ${nin}
#define RG_NM ${nm}

struct rg_meta {
    long long kshape[SG_KND];
    long long kstride[RG_NIN][SG_KND];   /* in elements, 0 where broadcast */
    long long cstride[RG_NIN];           /* along the row, 0 where one value per row */
    long long C[RG_NM];                  /* each member's row length */${map_meta}
    long long vec;                       /* 1: 4 values a lane at a time (rg_load4) */
};

/* 4 adjacent values of a row operand: one 16-byte (float) or 8-byte (half) load where the host
 * checked that every row operand along the row is unit-stride, every row starts aligned
 * and every member's length is a multiple of 4 (the plan's vec) */
template <typename T> struct __align__(4 * sizeof(T)) rg_v4 { T v[4]; };
template <typename T>
__device__ __forceinline__ rg_v4<T> rg_load4(const T *x, const long long cstride)
{
    if (cstride) return *reinterpret_cast<const rg_v4<T> *>(x);
    rg_v4<T> r;
    r.v[0] = r.v[1] = r.v[2] = r.v[3] = x[0];      /* one value per row */
    return r;
}

${ptrs}

/* v combined over the lanes of a row (a warp; with WIDE, the whole block): every lane gets
 * it.  Called uniformly by all threads sharing the row. */
template <typename T, typename F, bool WIDE>
__device__ __forceinline__ T rg_all(T v, const F f, const T identity)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (!WIDE) return v;
    __shared__ T shared[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    __syncthreads();                    /* the slots' last readers are done */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : identity;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ void rg_koff(const rg_meta &m, long long k, long long *off)
{
    sg_kept_offsets<RG_NIN, SG_KND>(m, k, off);
}

/* the members of row k, in order (a member reads only earlier members' results) */
template <bool WIDE>
__device__ __forceinline__ void rg_row(const rg_meta &m, const rg_ptrs &p, const long long k,
                                       const long long lane, const long long lanes)
{
    long long koff[RG_NIN];
    rg_koff(m, k, koff);
${members}
}

extern "C" __global__ void __launch_bounds__(256) rg_warp_rows(const long long K, const rg_meta m,
                                                               const rg_ptrs p)
{
    const int per_block = blockDim.x >> 5;
    const long long step = (long long)gridDim.x * per_block;
    for (long long k = (long long)blockIdx.x * per_block + (threadIdx.x >> 5); k < K; k += step)
        rg_row<false>(m, p, k, threadIdx.x & 31, 32);
}

extern "C" __global__ void __launch_bounds__(256) rg_block_rows(const long long K, const rg_meta m,
                                                                const rg_ptrs p)
{
    for (long long k = blockIdx.x; k < K; k += gridDim.x)
        rg_row<true>(m, p, k, threadIdx.x, blockDim.x);
}
