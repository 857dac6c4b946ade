/* symgpu elementwise module: ${title}
 *
 * Rendered by symgpu/gpu/runtime/codegen/elemwise.py from this template and the scalar table.  The
 * renderer supplies: the sg_ptrs struct (one pointer per operand), sg_scalars (operands of
 * size 1, read once per thread), SG_NFULL (operands indexed per element: inputs that are not
 * scalars, then outputs), and the element functions that apply sg_apply at an index
 * (sg_elem_contig, sg_elem_off) or to 4 elements (sg_vec_load, then sg_vec_store).
 *
 * Kernels (all grid-stride loops; grid and block are fixed when the thunk is made: sg_contig
 * gets a grid covering the array, sg_contig_vec at most VEC_BLOCKS_PER_SM blocks per SM
 * (ops/elemwise.py), the strided ones at most one wave):
 *   sg_contig            every full operand C-contiguous with the output's shape
 *   sg_contig_vec        the same through 4-wide aligned vector accesses, four in flight per
 *                        thread, then a scalar tail
 *   sg_strided_<nd>_<w>  any non-negative element strides (0 where broadcast), <nd> dims left
 *                        after collapsing, <w>-bit index arithmetic
 *   sg_rowcol_vec_<w>    (R, C) after collapsing, outputs C-contiguous, each full input
 *                        C-contiguous, a row vector (strides (0, 1): a bias) or a column
 *                        vector (strides (1, 0): a per-row statistic): 4-wide accesses along C
 *                        (C % 4 == 0, aligned), four in flight per thread, no division per
 *                        element; at most VEC_BLOCKS_PER_SM blocks per SM
 *   sg_rowcol_<w>        the same layouts a scalar at a time (C % 4 != 0, or misaligned)
 */
${common}
${apply}
${operands}

/* The vector kernels keep SG_VEC_DEPTH vectors of every operand in flight: 4 for light operand
 * lists, fewer where the operands are many (ElemwiseSignature.vec_depth), and then within launch
 * bounds of 256 threads, 4 blocks a multiprocessor (64 registers: SG_VEC_BOUNDS).  Before, four
 * vectors of every operand of a layer norm's backward (two divisions an element over three
 * float32 operands and five per-row statistics) took 168 registers, one block of 256 a
 * multiprocessor at a time: 82.8 us on the H200 (half.py's GPT step, the node timed alone),
 * 36.3 us at 64 registers.  Light kernels stay unbounded: bounded, nvcc gave a bfloat16 bias add
 * more registers than it needs (22.7 -> 24.8 us, benchmarks/gpu_rowcol.py) */
#define SG_VEC_DEPTH ${vec_depth}
#define SG_VEC_BOUNDS ${vec_bounds}

extern "C" __global__ void sg_contig(const long long n, const sg_ptrs p)
{
    const sg_scalars s = sg_load_scalars(p);
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        sg_elem_contig(p, s, i);
}

/* 4-wide vector accesses in a grid-stride loop that loads SG_VEC_DEPTH vectors before computing
 * and storing them (more loads in flight per thread), then a vector at a time, then the scalar
 * tail.  Launched with at most VEC_BLOCKS_PER_SM blocks per multiprocessor (ops/elemwise.py),
 * four waves at full occupancy: on an H200 the fused chain of benchmarks/gpu_speed.py ran at
 * 3.91 TB/s (four vectors in flight), against 3.39 for one vector per thread over a grid
 * covering the array and 3.57 for torch.compile (benchmarks/gpu_kernels.py --chain,
 * 2026-11-28) */
${contig_loop}

extern "C" __global__ void SG_VEC_BOUNDS sg_contig_vec(const long long n, const sg_ptrs p)
{ sg_contig_run(n, p, blockIdx.x, gridDim.x, true); }

template <int ND, typename I> struct sg_meta {
    I shape[ND];
    I stride[SG_NFULL][ND];   /* in elements */
};

template <int ND, typename I>
__device__ __forceinline__ void sg_strided_body(const I n, const sg_meta<ND, I> &m,
                                                const sg_ptrs &p)
{
    const sg_scalars s = sg_load_scalars(p);
    const I step = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        I off[SG_NFULL];
#pragma unroll
        for (int k = 0; k < SG_NFULL; ++k) off[k] = 0;
        I rest = i;
#pragma unroll
        for (int d = ND - 1; d >= 0; --d) {
            const I c = (d == 0) ? rest : rest % m.shape[d];
            if (d > 0) rest /= m.shape[d];
#pragma unroll
            for (int k = 0; k < SG_NFULL; ++k) off[k] += c * m.stride[k][d];
        }
        sg_elem_off<I>(p, s, off);
    }
}

#define SG_STRIDED(ND, I, NAME)                                                              \
    extern "C" __global__ void NAME(const I n, const sg_meta<ND, I> m, const sg_ptrs p)     \
    { sg_strided_body<ND, I>(n, m, p); }

${instances}

/* Row and column broadcasts (issue 34).  Per full operand k (inputs that are not scalars,
 * then outputs) the element at (r, c) is at r * rs[k] + c * cs[k]:
 *   C-contiguous (rs, cs) = (C, 1)   row vector (0, 1)   column vector (1, 0)   one value (0, 0)
 * A thread walks its positions with (r, c) stepped by the grid's stride (one division per
 * thread, none per element), so a bias add or a layer norm's (x - mean) * rstd does not pay
 * the strided kernel's division per element and dimension. */
template <typename I> struct sg_rcmeta {
    I rs[SG_NFULL];   /* elements between rows */
    I cs[SG_NFULL];   /* elements between columns: 1, or 0 for a column vector */
};

/* (r, c) advanced by (sr, sc) (the grid's stride in rows and columns, sc < C), for c < C */
template <typename I>
__device__ __forceinline__ void sg_rc_step(I &r, I &c, const I sr, const I sc, const I C)
{
    c += sc;
    r += sr;
    if (c >= C) { c -= C; ++r; }
}

/* vectors j of the (R, C / 4) vector array: the outputs' (and C-contiguous inputs') vector j
 * is (r, c); a row vector's is its c, a column vector's value is replicated four times
 * (sg_rc_load).  The plan picks it only where C % 4 == 0 and every vector operand is
 * aligned. */
template <typename I>
__device__ __forceinline__ void sg_rowcol_vec_body(const I R, const I C, const sg_rcmeta<I> &m,
                                                   const sg_ptrs &p)
{
    const sg_scalars s = sg_load_scalars(p);
    const I cv = C >> 2, nvec = R * cv;
    const I step = (I)gridDim.x * blockDim.x;
    I j = (I)blockIdx.x * blockDim.x + threadIdx.x;
    I r = j / cv, c = j - r * cv;
    const I sr = step / cv, sc = step - sr * cv;
#if SG_VEC_DEPTH == 4
    /* (written out: the same loop over arrays took 8-24 more registers for light operand
       lists, which run unbounded) */
    for (; j + 3 * step < nvec; j += 4 * step) {
        I r1 = r, c1 = c;
        sg_rc_step<I>(r1, c1, sr, sc, cv);
        I r2 = r1, c2 = c1;
        sg_rc_step<I>(r2, c2, sr, sc, cv);
        I r3 = r2, c3 = c2;
        sg_rc_step<I>(r3, c3, sr, sc, cv);
        const sg_vin a = sg_rc_load<I>(p, m.rs, m.cs, r, c);
        const sg_vin b = sg_rc_load<I>(p, m.rs, m.cs, r1, c1);
        const sg_vin e = sg_rc_load<I>(p, m.rs, m.cs, r2, c2);
        const sg_vin d = sg_rc_load<I>(p, m.rs, m.cs, r3, c3);
        sg_vec_store(p, s, j, a);
        sg_vec_store(p, s, j + step, b);
        sg_vec_store(p, s, j + 2 * step, e);
        sg_vec_store(p, s, j + 3 * step, d);
        r = r3;
        c = c3;
        sg_rc_step<I>(r, c, sr, sc, cv);
    }
#else
    for (; j + (SG_VEC_DEPTH - 1) * step < nvec; j += SG_VEC_DEPTH * step) {
        sg_vin v[SG_VEC_DEPTH];
#pragma unroll
        for (int u = 0; u < SG_VEC_DEPTH; ++u) {
            v[u] = sg_rc_load<I>(p, m.rs, m.cs, r, c);
            sg_rc_step<I>(r, c, sr, sc, cv);
        }
#pragma unroll
        for (int u = 0; u < SG_VEC_DEPTH; ++u) sg_vec_store(p, s, j + u * step, v[u]);
    }
#endif
    for (; j < nvec; j += step) {
        sg_vec_store(p, s, j, sg_rc_load<I>(p, m.rs, m.cs, r, c));
        sg_rc_step<I>(r, c, sr, sc, cv);
    }
}

template <typename I>
__device__ __forceinline__ void sg_rowcol_body(const I R, const I C, const sg_rcmeta<I> &m,
                                               const sg_ptrs &p)
{
    const sg_scalars s = sg_load_scalars(p);
    const I n = R * C;
    const I step = (I)gridDim.x * blockDim.x;
    I i = (I)blockIdx.x * blockDim.x + threadIdx.x;
    I r = i / C, c = i - r * C;
    const I sr = step / C, sc = step - sr * C;
    for (; i < n; i += step) {
        I off[SG_NFULL];
#pragma unroll
        for (int k = 0; k < SG_NFULL; ++k) off[k] = r * m.rs[k] + c * m.cs[k];
        sg_elem_off<I>(p, s, off);
        sg_rc_step<I>(r, c, sr, sc, C);
    }
}

#define SG_ROWCOL(I, NAME, VEC_NAME)                                                        \
    extern "C" __global__ void SG_VEC_BOUNDS VEC_NAME(const I R, const I C,                 \
                                                      const sg_rcmeta<I> m, const sg_ptrs p) \
    { sg_rowcol_vec_body<I>(R, C, m, p); }                                                  \
    extern "C" __global__ void NAME(const I R, const I C, const sg_rcmeta<I> m,             \
                                    const sg_ptrs p)                                        \
    { sg_rowcol_body<I>(R, C, m, p); }

${rowcol_instances}
