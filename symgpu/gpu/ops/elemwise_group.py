"""GpuElemwiseGroup: several independent GpuElemwise nodes run by one launch.

Why: a launch of a CUDA graph costs the GPU about 1.5 us however little it does. A training
step's parameter updates are one small elementwise kernel per parameter (SGD's
``W - lr * dW``; AdamW's moments and weight, three outputs), none reading another, and a
mixed-precision step starts with a cast of each parameter to half: the MLP of
benchmarks/half.py spent 7 of its 30 launches so (2 launches grouped: 70 us of device time
a step on the H200, from 75), the GPT block 17 (2 grouped: 1.287 ms, from 1.325). XLA
fuses such kernels horizontally; ``gpu_elemwise_group`` (gpu/ops/elemwise_group_rewrite.py) does it
here. The kernel (codegen/elemwise_group.py) deals its blocks out to the members, each
running elemwise.cu's contiguous vector loop over its own operands.

At run time each member takes its own GpuElemwise plan for the layouts it is given; where
every member's plan is the contiguous one the group launches once, else each member runs
its own kernel (the same values, a launch each). Outputs follow GpuElemwise's rules: a
``write_into`` target (a direct update under capture), the destroyed input of an in-place
member, the output still in its cell when nobody holds it, or a new array.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from symgpu.gpu.ops.elemwise import BLOCK, VEC_BLOCKS_PER_SM, GpuElemwise, _ElemwiseThunk
from symgpu.gpu.ops.kernel_ops import _capturable, _context, _virtual_thunk
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import launch
from symgpu.gpu.runtime.codegen.elemwise_group import GROUP_KERNEL, group_format, render_group
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op

__all__ = ["GpuElemwiseGroup", "MODULE"]

MODULE = "symgpu.elemwise_group"


class GpuElemwiseGroup(Op):
    """The GpuElemwise ``members`` (ops, no two reading what another writes) over
    consecutive slices of the inputs: member k takes ``arity[k][0]`` inputs and gives
    ``arity[k][1]`` outputs, in order."""

    __props__ = ("members", "arity")

    def __init__(self, members: Sequence[GpuElemwise], arity: Sequence[tuple[int, int]]):
        self.members, self.arity = tuple(members), tuple(tuple(a) for a in arity)
        if len(self.members) != len(self.arity) or len(self.members) < 2:
            raise ValueError("GpuElemwiseGroup: two or more members, one arity each")
        self.destroy_map = {}
        i0 = o0 = 0
        for op, (n_in, n_out) in zip(self.members, self.arity):
            for o, i in op.inplace_pattern:
                self.destroy_map[o0 + o] = [i0 + i]
            i0, o0 = i0 + n_in, o0 + n_out

    def __str__(self) -> str:
        return f"GpuElemwiseGroup{{{len(self.members)} kernels}}"

    def slices(self, seq: Sequence[Any], outputs: bool = False) -> list[list[Any]]:
        """``seq`` (a node's inputs, or with ``outputs`` its outputs) cut per member."""
        out, k = [], 0
        for n_in, n_out in self.arity:
            n = n_out if outputs else n_in
            out.append(list(seq[k:k + n]))
            k += n
        return out

    def make_node(self, *inputs: Any) -> Apply:
        if len(inputs) != sum(a for a, _ in self.arity):
            raise TypeError(f"{self}: takes {sum(a for a, _ in self.arity)} inputs, got "
                            f"{len(inputs)}")
        ins, outs = [], []
        for op, sub, (n_in, n_out) in zip(self.members, self.slices(inputs), self.arity):
            node = op.make_node(*sub)     # (uploads host inputs, pads to the member's ndim)
            if len(node.outputs) != n_out or len(node.inputs) != n_in:
                raise TypeError(f"{self}: member {op} does not take {n_in} inputs to {n_out} "
                                f"outputs")
            ins += node.inputs
            outs += [o.type() for o in node.outputs]
        return Apply(self, ins, outs)

    def member_nodes(self, node: Apply) -> list["MemberNode"]:
        """Each member as a node over the group's own variables (its storage cells)."""
        return [MemberNode(op, ins, outs) for op, ins, outs in
                zip(self.members, self.slices(node.inputs), self.slices(node.outputs, True))]

    def infer_shape(self, fgraph, node, input_shapes):
        shapes = []
        for op, sub, ish in zip(self.members, self.member_nodes(node),
                                self.slices(input_shapes)):
            shapes += op.infer_shape(fgraph, sub, ish)
        return shapes

    def signatures(self, node: Apply) -> tuple:
        return tuple(op.signature(sub) for op, sub in zip(self.members, self.member_nodes(node)))

    def kernel_sources(self, node: Apply) -> list[tuple[Any, str]]:
        """(key, CUDA source) of the group's module (CI compiles it)."""
        sigs = self.signatures(node)
        return [((MODULE, sigs), render_group(sigs))]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """The group's module and each member's own (its kernels run a member alone where a
        layout has no contiguous plan; loaded when the thunk is made), for the link-time
        prefetch to compile in parallel."""
        sigs = self.signatures(node)
        out = [((MODULE, sigs), lambda: render_group(sigs), ())]
        for op, sub in zip(self.members, self.member_nodes(node)):
            out += op.prefetch_sources(sub)
        return out

    def make_thunk(self, node: Apply, storage_map: dict, compute_map: dict,
                   no_recycling: Sequence[Variable], impl: str | None = None) -> Callable[[], None]:
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return _GroupThunk(self, node, storage_map, ctx).thunk()


class MemberNode:
    """A member's view of its group node: its op, inputs and outputs (the group's own
    variables; not an Apply, which would claim them as its outputs)."""

    __slots__ = ("op", "inputs", "outputs")

    def __init__(self, op: GpuElemwise, inputs: list, outputs: list):
        self.op, self.inputs, self.outputs = op, inputs, outputs


class _GroupThunk:
    """The members' GpuElemwise thunks (their plans; each runs alone where a layout is not
    contiguous) and the group's one launch."""

    def __init__(self, op: GpuElemwiseGroup, node: Apply, storage_map: dict, ctx: Any):
        self.ctx = ctx
        subs = op.member_nodes(node)
        self.members = [_ElemwiseThunk(m, sub, storage_map, ctx)
                        for m, sub in zip(op.members, subs)]
        sigs = tuple(t.sig for t in self.members)
        kernels = launch.load_kernels(ctx, (MODULE, sigs), lambda: render_group(sigs),
                                      {GROUP_KERNEL: group_format(sigs)})
        self.launch = kernels[GROUP_KERNEL].fast_launcher()
        self.alone = [t.thunk() for t in self.members]
        self.max_blocks = VEC_BLOCKS_PER_SM * launch.sm_count(ctx)

    def thunk(self) -> Callable[[], None]:
        members, alone, ctx = self.members, self.alone, self.ctx
        activate, group_launch, max_blocks = ctx.activate, self.launch, self.max_blocks
        cells = [(t.in_cells, t.out_cells, t.out_dtypes, t.inplace, t.plans, t.plan)
                 for t in members]
        n_outs = [len(t.out_cells) for t in members]
        reuse = [False] * sum(n_outs)   # graph_plan.mark_reusable_outputs sets them
        into = [None] * sum(n_outs)     # graph_segment sets them for one capture (write_into)
        block = (BLOCK, 1, 1)

        def run_alone() -> None:
            o0 = 0
            for t, f, n in zip(members, alone, n_outs):
                f_into = getattr(f, "write_into", None)
                if f_into is not None:
                    f_into[:] = into[o0:o0 + n]
                f_reuse = getattr(f, "reuse_outputs", None)
                if f_reuse is not None:
                    f_reuse[:] = reuse[o0:o0 + n]
                try:
                    f()
                finally:
                    if f_into is not None:
                        f_into[:] = [None] * n
                o0 += n

        def thunk() -> None:
            activate()
            args: list = []
            blocks = 0
            results = []
            o0 = 0
            for in_cells, out_cells, out_dtypes, inplace, plans, plan_for in cells:
                ins = [c[0] for c in in_cells]
                key = tuple([a.shape + a.strides for a in ins])
                p = plans.get(key)
                if p is None:
                    p = plans[key] = plan_for(ins)
                if not p.contig:
                    run_alone()
                    return
                outs = []
                for j, dt in enumerate(out_dtypes):
                    target, cell = into[o0 + j], out_cells[j]
                    if target is not None and target.shape == p.out_shape and \
                            target.dtype == dt and target.is_c_contiguous and p.n:
                        out = target
                    elif j in inplace and p.inplace_ok:
                        out = ins[inplace[j]]
                    elif reuse[o0 + j] and cell[0] is not None and \
                            cell[0].shape == p.out_shape and cell[0].dtype == dt:
                        out = cell[0]
                    else:
                        out = new_array(ctx, p.out_shape, dt)
                    outs.append(out)
                ptrs = [a.ptr for a in ins] + [o.ptr for o in outs]
                vec = 1
                for k in p.checked:
                    if ptrs[k] & p.align_mask:
                        vec = 0
                        break
                n = p.n
                mine = min(max_blocks, -(-n // (4 * BLOCK))) if n else 0
                args += [n, blocks, vec, *ptrs]
                blocks += mine
                results.append((out_cells, outs))
                o0 += len(out_dtypes)
            if blocks:
                group_launch((blocks, 1, 1), block, *args)
            for out_cells, outs in results:
                for cell, out in zip(out_cells, outs):
                    cell[0] = out

        thunk.reuse_outputs = reuse   # type: ignore[attr-defined]
        thunk.write_into = into       # type: ignore[attr-defined]
        return _capturable(thunk)
