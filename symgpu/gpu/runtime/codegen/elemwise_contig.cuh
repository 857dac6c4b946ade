/* The contiguous loop over blocks blk of nblk (elemwise.cu's sg_contig_vec: blockIdx.x of
 * gridDim.x; a member of an elementwise group's launch: its own range of the blocks,
 * elemwise_group.cu): with vec, 4-wide vector accesses in a grid-stride loop that loads
 * SG_VEC_DEPTH vectors before computing and storing them, then a vector at a time, then the
 * scalar tail; without (a misaligned operand), a scalar at a time. */
__device__ __forceinline__ void sg_contig_run(const long long n, const sg_ptrs &p,
                                              const long long blk, const long long nblk,
                                              const bool vec)
{
    const sg_scalars s = sg_load_scalars(p);
    const long long step = nblk * blockDim.x;
    const long long tid = blk * blockDim.x + threadIdx.x;
    long long i = tid;
    if (vec) {
        const long long nvec = n >> 2;
        long long j = tid;
        for (; j + (SG_VEC_DEPTH - 1) * step < nvec; j += SG_VEC_DEPTH * step) {
            sg_vin v[SG_VEC_DEPTH];
#pragma unroll
            for (int u = 0; u < SG_VEC_DEPTH; ++u) v[u] = sg_vec_load(p, j + u * step);
#pragma unroll
            for (int u = 0; u < SG_VEC_DEPTH; ++u) sg_vec_store(p, s, j + u * step, v[u]);
        }
        for (; j < nvec; j += step)
            sg_vec_store(p, s, j, sg_vec_load(p, j));
        i = (nvec << 2) + tid;
    }
    for (; i < n; i += step)
        sg_elem_contig(p, s, i);
}
