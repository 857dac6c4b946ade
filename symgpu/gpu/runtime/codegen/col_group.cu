/* symgpu column group: ${title}
 *
 * Rendered by symgpu/gpu/runtime/codegen/col_group.py for GpuColumnReduceGroup
 * (symgpu/gpu/ops/col_group.py).  One pass over an iteration space of R rows (the leading
 * dims, CG_RND of them, collapsed on the host to m.rnd) by K columns (the last axis): an
 * elementwise map (optional) writes its kept outputs at every position, and the members each
 * reduce the leading dims of their own values (a pre-op of the operands, or a map output as
 * stored) into one value per column: a bias gradient summed in the same pass that computes
 * the gradient (XLA's multi-output fusion), or sibling column sums of one operand.
 *
 * Operand i's value at (r, k) sits at rowoff_i(r) + k * cstride[i] (strides in elements, 0
 * where broadcast); written outputs are C-contiguous (r * K + k).
 *
 * The map's outputs and the members' values come from one function (cg_all), so a member
 * recomputing the map's expression (a bias gradient's pre-op) shares its arithmetic.
 *
 * Kernel cg_cols: blockDim 32x8, a thread owning CG_CV adjacent columns (one aligned access
 * of every operand and output per row where the host found the layout allows it: m.vec; the
 * last columns of a ragged width and other layouts take scalar accesses), a block a tile of
 * 32 * CG_CV columns by m.chunk rows (gridDim.y row tiles, gridDim.x strides over the column
 * tiles).  Operands with one value per column (every leading dim broadcast) are read once,
 * those with one value per row (the last dim broadcast) once a row: the arithmetic of per-row
 * values (a layer norm's 1 / sqrt(var / n + eps)) is then shared by a thread's columns.
 * Tuning on the H200 (the GPT block's four groups): more rows in flight a thread (2-8, as
 * loads first) was slower at every register budget; 12 or 16 rows a lane beat 8 and 32.
 * Each member's 8 row lanes combine through shared memory; with gridDim.y > 1 the row tiles'
 * partials (a (G, K) array per member) are combined by the last block of each blockIdx.x (a
 * counter per blockIdx.x, atomicInc wrapping it back to 0: zero between launches, as graph
 * replays need) in a fixed order: the same bits every launch.
 */
${common}
${apply}
#define CG_NIN ${nin}
#define CG_RND ${rnd}
#define CG_CV ${cv}
#define CG_X 32
#define CG_Y 8
#define CG_COLS (CG_X * CG_CV)

struct cg_meta {
    long long K, R, chunk;
    long long rnd;                        /* leading dims in use after collapsing (1..CG_RND) */
    long long rshape[CG_RND];
    long long rstride[CG_NIN][CG_RND];    /* in elements, 0 where broadcast */
    long long cstride[CG_NIN];            /* along the columns, 0 where one value per row */
    long long vec;                        /* 1: CG_CV columns as one access (see the header) */
};

${ptrs}

/* the element offsets of row r (row-major over the m.rnd leading dims in use) */
__device__ __forceinline__ void cg_row_offsets(const cg_meta &m, long long r, long long *off)
{
    if (m.rnd == 1) {
#pragma unroll
        for (int i = 0; i < CG_NIN; ++i) off[i] = r * m.rstride[i][0];
        return;
    }
#pragma unroll
    for (int i = 0; i < CG_NIN; ++i) off[i] = 0;
#pragma unroll
    for (int d = CG_RND - 1; d >= 0; --d) {
        if (d >= m.rnd) continue;
        const long long c = d == 0 ? r : r % m.rshape[d];
        if (d > 0) r /= m.rshape[d];
#pragma unroll
        for (int i = 0; i < CG_NIN; ++i) off[i] += c * m.rstride[i][d];
    }
}

template <typename T, int N> struct alignas(N * sizeof(T)) cg_vec { T v[N]; };

/* CG_CV values from at (column stride cs): one value repeated (cs == 0), one aligned access
 * (vec), or scalar loads of the first `valid` (>= 1) columns */
template <typename T>
__device__ __forceinline__ void cg_load(const T *at, const long long cs, const bool vec,
                                        const int valid, T *x)
{
    if (cs == 0) {
        const T one = *at;
#pragma unroll
        for (int u = 0; u < CG_CV; ++u) x[u] = one;
    } else if (vec) {
        const cg_vec<T, CG_CV> w = *reinterpret_cast<const cg_vec<T, CG_CV> *>(at);
#pragma unroll
        for (int u = 0; u < CG_CV; ++u) x[u] = w.v[u];
    } else {
#pragma unroll
        for (int u = 0; u < CG_CV; ++u) x[u] = at[(u < valid ? u : 0) * cs];
    }
}

template <typename T>
__device__ __forceinline__ void cg_put(T *at, const bool vec, const int valid, const T *x)
{
    if (vec) {
        cg_vec<T, CG_CV> w;
#pragma unroll
        for (int u = 0; u < CG_CV; ++u) w.v[u] = x[u];
        *reinterpret_cast<cg_vec<T, CG_CV> *>(at) = w;
    } else {
#pragma unroll
        for (int u = 0; u < CG_CV; ++u) if (u < valid) at[u] = x[u];
    }
}

/* member q's 8 row lanes of the tile at kb combined (column tx * CG_CV + u of the tile sits at
 * slot u * 32 + tx: conflict-free stores), then stored: the result (one row tile) or the
 * block's partial */
template <typename A, typename Op>
__device__ __forceinline__ void cg_tile_combine(A *sm, const A *acc, const long long kb,
                                                const long long K, Op op, A *partial)
{
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * CG_X + tx;
#pragma unroll
    for (int u = 0; u < CG_CV; ++u) sm[ty * CG_COLS + u * CG_X + tx] = acc[u];
    __syncthreads();
    for (int c = tid; c < CG_COLS; c += CG_X * CG_Y) {
        const int slot = (c % CG_CV) * CG_X + c / CG_CV;
        A a = sm[slot];
#pragma unroll
        for (int t = 1; t < CG_Y; ++t) a = op(a, sm[t * CG_COLS + slot]);
        if (kb + c < K) {
            if (gridDim.y == 1) op.put(kb + c, a);
            else partial[blockIdx.y * K + kb + c] = a;
        }
    }
    __syncthreads();
}

/* the last block: member q's G partials of each column of the tile at kb, lane l of a column
 * taking g = l, l + lanes, ... in order, the lanes then combined in order */
template <typename A, typename Op>
__device__ __forceinline__ void cg_gather(A *sm, const long long kb, const long long K, Op op,
                                          const A *partial, const A identity)
{
    const int tid = threadIdx.y * CG_X + threadIdx.x;
    const int lanes = (CG_X * CG_Y) / CG_COLS;
    const int c = tid % CG_COLS, l = tid / CG_COLS;
    const long long G = gridDim.y;
    A a = identity;
    if (kb + c < K) {
#pragma unroll 16
        for (long long g = l; g < G; g += lanes) a = op(a, __ldcg(partial + g * K + kb + c));
    }
    sm[l * CG_COLS + c] = a;
    __syncthreads();
    if (l == 0 && kb + c < K) {
        A s = sm[c];
        for (int t = 1; t < lanes; ++t) s = op(s, sm[t * CG_COLS + c]);
        op.put(kb + c, s);
    }
    __syncthreads();
}

/* ${min_blocks} blocks of 256 threads a multiprocessor at least (the registers that leaves
   hold a row of every operand without spilling) */
extern "C" __global__ void __launch_bounds__(256, ${min_blocks}) cg_cols(const cg_meta m, const cg_ptrs p)
{
    __shared__ double cg_sm[CG_Y * CG_COLS];   /* any member's accumulators */
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long K = m.K;
    const long long r_begin = (long long)blockIdx.y * m.chunk;
    const long long r_end = min(m.R, r_begin + m.chunk);
    for (long long kb = (long long)blockIdx.x * CG_COLS; kb < K;
         kb += (long long)gridDim.x * CG_COLS) {
        const long long k0 = kb + (long long)tx * CG_CV;
${acc_init}
        if (k0 < K) {
            const bool vec = m.vec && k0 + CG_CV <= K;
            const int valid = (int)min((long long)CG_CV, K - k0);
${hoisted}
            for (long long r = r_begin + ty; r < r_end; r += CG_Y) {
                long long off[CG_NIN];
                cg_row_offsets(m, r, off);
${row_body}
            }
        }
${combine}
    }
    if (gridDim.y == 1 || !sg_last_block(p.counters)) return;
    for (long long kb = (long long)blockIdx.x * CG_COLS; kb < K;
         kb += (long long)gridDim.x * CG_COLS) {
${gather}
    }
}
