/* symgpu elementwise group: several independent elementwise kernels in one launch
 *
 * Rendered by symgpu/gpu/runtime/codegen/elemwise_group.py for GpuElemwiseGroup
 * (symgpu/gpu/ops/elemwise_group.py).  Member k's device code (sg_apply, its operands' struct
 * and element functions: codegen/elemwise.py's, for its own signature) lives in namespace
 * hz<k>.  The launch's blocks are dealt out in order: member k owns blocks first<k> up to the
 * next member's first, and runs elemwise.cu's sg_contig_vec loop over them (its operands
 * C-contiguous with its output's shape, or of one element; vec<k> 0: a misaligned operand,
 * a scalar at a time).  Why: each launch of a CUDA graph costs about a microsecond and a half
 * of the GPU's time however little it does, and a training step's parameter updates (one
 * small kernel per parameter: an optimizer's, at the end of the step) and the casts of its
 * parameters to half (at its start) do not depend on one another: XLA's horizontal fusion.
 */
${common}
${members}

extern "C" __global__ void ${bounds} hz_run(${params})
{
    const long long b = blockIdx.x;
${branches}
}
//@ member
/* elemwise.cu's sg_contig_vec over blocks blk of nblk (or its scalar loop where vec is 0) */
__device__ __forceinline__ void run(const long long n, const sg_ptrs &p, const long long blk,
                                    const long long nblk, const long long vec)
{
    const sg_scalars s = sg_load_scalars(p);
    const long long step = nblk * blockDim.x;
    const long long tid = blk * blockDim.x + threadIdx.x;
    long long i = tid;
    if (vec) {
        const long long nvec = n >> 2;
        long long j = tid;
        for (; j + (depth - 1) * step < nvec; j += depth * step) {
            sg_vin v[depth];
#pragma unroll
            for (int u = 0; u < depth; ++u) v[u] = sg_vec_load(p, j + u * step);
#pragma unroll
            for (int u = 0; u < depth; ++u) sg_vec_store(p, s, j + u * step, v[u]);
        }
        for (; j < nvec; j += step)
            sg_vec_store(p, s, j, sg_vec_load(p, j));
        i = (nvec << 2) + tid;
    }
    for (; i < n; i += step)
        sg_elem_contig(p, s, i);
}
