/* symgpu elementwise group: several independent elementwise kernels in one launch
 *
 * Rendered by symgpu/gpu/runtime/codegen/elemwise_group.py for GpuElemwiseGroup
 * (symgpu/gpu/ops/elemwise_group.py).  Member k's device code (sg_apply, its operands' struct
 * and element functions: codegen/elemwise.py's, for its own signature) lives in namespace
 * hz<k>.  The launch's blocks are dealt out in order: member k owns blocks first<k> up to the
 * next member's first, and runs elemwise.cu's contiguous loop over them (sg_contig_run,
 * elemwise_contig.cuh: its operands C-contiguous with its output's shape, or of one element;
 * vec<k> 0: a misaligned operand, a scalar at a time).  Why: each launch of a CUDA graph costs about a microsecond and a half
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
