"""Render scalar ops (table rows and fused Composites) as typed CUDA C statements.

Every value gets a temporary of the exact value type of its dtype, so the generated kernel has
NumPy's semantics where C's differ: operands are converted to the op's compute dtype first (C
would compute ``int32 + float32`` in float, NumPy in float64), and results are converted to the
output dtype (``int8 + int8`` wraps at 8 bits, as in NumPy).  Half values (float16, bfloat16)
are computed in float between a kernel's loads and stores (issue 34: load, compute, round on
store); an explicit cast to a half dtype rounds where it stands (Cast's CUDA form).  The CUDA spelling of each op comes
from its row of the scalar table (``ScalarOp.cuda``); nothing here knows an op by name.
"""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.gpu.runtime.codegen.types import SUPPORTED, literal, value_ctype
from symgpu.scalar.basic import Cast
from symgpu.scalar.dtypes import upcast

__all__ = ["ScalarRenderer", "output_dtypes", "inner_graph", "render_apply_function",
           "supports_scalar_op"]


def _rule(op: Any) -> str | None:
    return getattr(getattr(op, "spec", None), "dtype_rule", None)


def _is_cast(op: Any) -> bool:
    return isinstance(op, Cast)


def _dtype_of(var: Any) -> str:
    t = getattr(var, "type", None)
    dtype = getattr(t, "dtype", None) or getattr(var, "dtype", None)
    if dtype is None:
        raise TypeError(f"cannot tell the dtype of scalar variable {var!r}")
    return str(dtype)


def inner_graph(op: Any) -> tuple[list, list, list] | None:
    """(inputs, outputs, toposorted nodes) of a Composite's scalar graph, or None.

    Duck-typed so the renderer needs no import of the fusion code: a Composite exposes either
    an ``fgraph`` or ``inputs``/``outputs`` scalar variables with owners."""
    fg = getattr(op, "fgraph", None)
    if fg is not None and hasattr(fg, "toposort"):
        return list(fg.inputs), list(fg.outputs), list(fg.toposort())
    ins, outs = getattr(op, "inputs", None), getattr(op, "outputs", None)
    if isinstance(ins, (list, tuple)) and isinstance(outs, (list, tuple)) and outs \
            and all(hasattr(v, "owner") for v in outs):
        return list(ins), list(outs), _toposort(ins, outs)
    return None


def _toposort(inputs: Sequence[Any], outputs: Sequence[Any]) -> list:
    """The nodes between ``inputs`` and ``outputs``, each after the nodes it reads."""
    stop = {id(v) for v in inputs}
    order: list = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(v.owner, False) for v in reversed(outputs)
                                     if v.owner is not None and id(v) not in stop]
    while stack:
        node, ready = stack.pop()
        if ready:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for v in reversed(node.inputs):
            if v.owner is not None and id(v) not in stop and id(v.owner) not in seen:
                stack.append((v.owner, False))
    return order


def output_dtypes(op: Any, in_dtypes: Sequence[str]) -> list[str]:
    """The output dtypes of scalar op ``op`` (a table row or a Composite) on ``in_dtypes``."""
    fn = getattr(op, "output_dtypes", None)
    if callable(fn):
        return list(fn(*in_dtypes))
    g = inner_graph(op)
    if g is not None and getattr(op, "nout", 1) != 1:
        return [_dtype_of(v) for v in g[1]]
    return [op.output_dtype(*in_dtypes)]


def supports_scalar_op(op: Any, in_dtypes: Sequence[str]) -> bool:
    """Whether kernels can be generated for ``op`` (complex dtypes and table rows without a CUDA
    expression cannot)."""
    try:
        outs = output_dtypes(op, in_dtypes)
    except (TypeError, ValueError, KeyError, NotImplementedError):   # no dtype rule for these
        return False
    if any(d not in SUPPORTED for d in list(in_dtypes) + outs):
        return False
    try:
        r = ScalarRenderer()
        r.apply(op, list(in_dtypes), [f"v{i}" for i in range(len(in_dtypes))])
    except (TypeError, ValueError, KeyError, NotImplementedError):   # no CUDA expression
        return False
    return True


class ScalarRenderer:
    """Accumulates C statements; ``apply`` returns the names holding an op's outputs."""

    def __init__(self, prefix: str = "t") -> None:
        self.lines: list[str] = []
        self.prefix = prefix
        self.count = 0

    def temp(self, dtype: str, expr: str) -> str:
        """Declare a temporary of ``dtype``'s value type initialised from ``expr``."""
        name = f"{self.prefix}{self.count}"
        self.count += 1
        ctype = value_ctype(dtype)
        self.lines.append(f"const {ctype} {name} = ({ctype})({expr});")
        return name

    # -- one table row
    def _row(self, op: Any, in_dtypes: list[str], operands: list[str], out_dtype: str) -> str:
        if _is_cast(op):     # (a cast to a half type rounds: its table row says so)
            return op.cuda(out_dtype, operands)
        rule = _rule(op)
        if rule == "bool":
            compute = upcast(*in_dtypes) if in_dtypes else out_dtype
            targets: list[str | None] = [compute] * len(operands)
        elif rule == "switch":
            compute = out_dtype
            targets = [None, out_dtype, out_dtype]
        elif rule == "second":
            compute = out_dtype
            targets = [None, out_dtype]
        else:
            compute = out_dtype
            targets = [out_dtype] * len(operands)
        conv = []
        for expr, src, dst in zip(operands, in_dtypes, targets):
            if dst is None or value_ctype(src) == value_ctype(dst):
                conv.append(expr)
            else:
                conv.append(f"(({value_ctype(dst)})({expr}))")
        return op.cuda(compute, conv)

    def apply(self, op: Any, in_dtypes: list[str], operands: list[str]) -> list[tuple[str, str]]:
        """Render ``op`` over ``operands`` (value-typed C expressions of ``in_dtypes``);
        returns ``[(name, dtype)]`` for its outputs."""
        outs = output_dtypes(op, in_dtypes)
        graph = inner_graph(op)
        if graph is not None:
            return self._composite(op, graph, in_dtypes, operands, outs)
        if getattr(op, "nout", 1) != 1:
            raise TypeError(f"scalar op {op} has {op.nout} outputs but no inner graph to render")
        if getattr(op, "spec", None) is None and not _is_cast(op):
            # an op that renders itself (e.g. a Composite without an inspectable graph)
            expr = op.cuda(outs[0], list(operands))
        else:
            expr = self._row(op, in_dtypes, list(operands), outs[0])
        return [(self.temp(outs[0], expr), outs[0])]

    def _composite(self, op: Any, graph: tuple[list, list, list], in_dtypes: list[str],
                   operands: list[str], outs: list[str]) -> list[tuple[str, str]]:
        inner_in, inner_out, nodes = graph
        if len(inner_in) != len(operands):
            raise TypeError(f"{op} has {len(inner_in)} inputs, got {len(operands)} operands")
        env: dict[Any, tuple[str, str]] = {}
        for var, expr, dtype in zip(inner_in, operands, in_dtypes):
            inner_dtype = _dtype_of(var)
            if value_ctype(inner_dtype) != value_ctype(dtype):
                expr = self.temp(inner_dtype, expr)
            env[var] = (expr, inner_dtype)

        def lookup(var: Any) -> tuple[str, str]:
            if var in env:
                return env[var]
            if var.owner is None and hasattr(var, "data"):
                dtype = _dtype_of(var)
                env[var] = (literal(var.data, dtype), dtype)
                return env[var]
            raise TypeError(f"{op}: inner variable {var!r} is neither an input, a constant "
                            f"nor computed before its use")

        for node in nodes:
            args = [lookup(v) for v in node.inputs]
            results = self.apply(node.op, [d for _, d in args], [e for e, _ in args])
            for var, (name, dtype) in zip(node.outputs, results):
                want = _dtype_of(var)
                if value_ctype(want) != value_ctype(dtype):
                    name = self.temp(want, name)
                env[var] = (name, want)
        result = []
        for var, dtype in zip(inner_out, outs):
            expr, have = lookup(var)
            if value_ctype(have) != value_ctype(dtype) or have != dtype:
                expr = self.temp(dtype, expr)
            result.append((expr, dtype))
        return result


def render_apply_function(op: Any, in_dtypes: Sequence[str], scalar_inputs: Sequence[bool] = (),
                          name: str = "sg_apply") -> tuple[str, list[str]]:
    """A ``__device__`` function ``name(in0, .., &out0, ..)`` computing ``op`` on values.

    Returns (source, output dtypes).  Parameters are value types (float for float16)."""
    in_dtypes = list(in_dtypes)
    r = ScalarRenderer()
    results = r.apply(op, in_dtypes, [f"v{i}" for i in range(len(in_dtypes))])
    params = [f"const {value_ctype(d)} v{i}" for i, d in enumerate(in_dtypes)]
    params += [f"{value_ctype(d)} &r{j}" for j, (_, d) in enumerate(results)]
    body = ["    " + line for line in r.lines]
    body += [f"    r{j} = {expr};" for j, (expr, _) in enumerate(results)]
    src = (f"__device__ __forceinline__ void {name}({', '.join(params)})\n{{\n"
           + "\n".join(body) + "\n}\n")
    return src, [d for _, d in results]
