"""Composite: one scalar op made of table ops, the unit of elementwise fusion.

A Composite is a straight-line program over *slots*: its inputs, then its scalar constants,
then one slot per step `(table op, argument slots)`. Several slots may be outputs. Because it
only holds table rows, everything else follows from the table: the NumPy evaluation (CPU), the
CUDA expression or statement list (GPU code generator), and the printed form
`Composite{sub(mul(i0, softplus(i1)), i2)}`.

On the CPU, `make_elemwise_thunk` turns the program into generated Python that calls one
ufunc per step and computes each step into the buffer of an intermediate that just died
(same dtype and broadcast pattern), so a fused chain of k ops allocates about one array,
not k, and pays one VM dispatch, not k.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.scalar.basic import SCALAR_OPS, Cast, ScalarOp
from symgpu.scalar.dtypes import C_TYPES, HALF_DTYPES, dtype_kind, upcast, value_dtype
from symgpu.scalar.int_program import int_thunk

__all__ = ["Composite", "CompositeBuilder", "ScalarVariable", "ScalarNode"]

Ref = tuple  # ('i', k) input, ('c', k) constant, ('s', k) step


def _softplus(x, out=None):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), computed with reused buffers."""
    m = np.maximum(x, 0)
    a = np.abs(x, out=out) if out is not None and out is not x else np.abs(x)
    np.negative(a, out=a)
    np.exp(a, out=a)
    np.log1p(a, out=a)
    np.add(a, m, out=a)
    return a


def _round(x, out=None):
    """Round half to even; integers are already whole (np.rint would round them through
    float64, losing those above 2**53)."""
    if np.asarray(x).dtype.kind in "biu":
        if out is None:
            return np.array(x)
        np.copyto(out, x)
        return out
    return np.rint(x) if out is None else np.rint(x, out=out)


#: faster or out=-capable NumPy spellings of table rows, by row name: (function, takes out=)
FAST_IMPLS: dict[str, tuple[Callable, bool]] = {
    "sqr": (np.square, True),
    "true_div": (np.true_divide, True),
    "round": (_round, True),
    "softplus": (_softplus, True),
    "int_div": (np.floor_divide, True),
}

#: ufuncs whose `out` must be passed by keyword
_KEYWORD_OUT = (np.maximum, np.minimum)

#: rows whose NumPy value may be (a view of) an argument rather than a fresh array
_ALIASING = {"second", "identity"}


def _impl_of(op: ScalarOp) -> tuple[Callable, bool]:
    fast = FAST_IMPLS.get(op.name)
    if fast is not None:
        return fast
    impl = op.impl
    return impl, isinstance(impl, np.ufunc) and impl.nout == 1


def _arg_casts(op: ScalarOp, arg_dtypes: Sequence[str], dtype: str) -> list[str | None]:
    """Which arguments to convert first, as Elemwise does: variadic rows (add, mul) fold in
    the output dtype, float-valued rows (exp, log...) compute in the output dtype."""
    rule = getattr(getattr(op, "spec", None), "dtype_rule", None)
    if op.nin < 0:
        return [None if d == dtype else dtype for d in arg_dtypes]
    if rule == "float" and any(dtype_kind(d) not in "fc" for d in arg_dtypes):
        return [None if dtype_kind(d) in "fc" else dtype for d in arg_dtypes]
    return [None] * len(arg_dtypes)


class Composite:
    """A scalar op defined by a small program of table ops (see the module docstring).

    `in_dtypes`: the dtype of each input; `constants`: (value, dtype) pairs; `steps`:
    (ScalarOp, argument slot indices); `outputs`: the slot index of each output.
    """

    commutative = False
    associative = False

    def __init__(self, in_dtypes: Sequence[str], constants: Sequence[tuple[Any, str]],
                 steps: Sequence[tuple[ScalarOp, Sequence[int]]], outputs: Sequence[int]):
        self.in_dtypes = tuple(in_dtypes)
        self.constants = tuple((np.asarray(v, dtype=d)[()], d) for v, d in constants)
        self.steps = tuple((op, tuple(args)) for op, args in steps)
        self.out_slots = tuple(outputs)
        self.nin = len(self.in_dtypes)
        self.nout = len(self.out_slots)
        self.n_const = len(self.constants)
        self.first_step = self.nin + self.n_const
        dtypes = list(self.in_dtypes) + [d for _, d in self.constants]
        for op, args in self.steps:
            if any(a >= len(dtypes) for a in args):
                raise ValueError(f"Composite step {op} reads a slot that is not computed yet")
            dtypes.append(op.output_dtype(*[dtypes[a] for a in args]))
        self.slot_dtypes = tuple(dtypes)
        for o in self.out_slots:
            if o < self.first_step:
                raise ValueError("a Composite output must be computed by a step")
        self.out_dtypes = tuple(dtypes[o] for o in self.out_slots)
        self._key = (self.in_dtypes,
                     tuple((d, np.asarray(v, dtype=d).tobytes()) for v, d in self.constants),
                     self.steps, self.out_slots)
        self._hash = hash((Composite, self._key))
        self.name = str(self)
        self._kernels: dict[tuple, Callable] = {}

    # -- identity -------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return type(other) is Composite and other._key == self._key

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # the kernel caches hold generated functions: pickle the program, rebuild on load
        return (Composite, (self.in_dtypes, self.constants, self.steps, self.out_slots))

    def __str__(self) -> str:
        """The program as expressions of i0, i1...; a step whose text passes _LONG_TEXT is
        named (t0=...; ...) and read by its name, so the text grows with the steps, not
        with the paths through them (shared subexpressions doubled at every level)."""
        names = [f"i{k}" for k in range(self.nin)]
        names += [_const_text(v) for v, _ in self.constants]
        named: list[str] = []
        for op, args in self.steps:
            a = [names[k] for k in args]
            sym = _INFIX.get(str(op))
            if sym is not None and len(a) >= 2:
                text = "(" + f" {sym} ".join(a) + ")"
            elif str(op) == "neg" and len(a) == 1:
                text = f"(-{a[0]})"
            else:
                text = f"{op}({', '.join(a)})"
            if len(text) > _LONG_TEXT:
                named.append(f"t{len(named)}={text}")
                text = f"t{len(named) - 1}"
            names.append(text)
        return "Composite{" + "; ".join(
            named + [", ".join(names[o] for o in self.out_slots)]) + "}"

    __repr__ = __str__

    # -- the inner graph, for renderers that walk nodes -----------------------------------
    @property
    def inputs(self) -> list["ScalarVariable"]:
        """The inner graph's input variables (built on first use, like `outputs`)."""
        return self._graph()[0]

    @property
    def outputs(self) -> list["ScalarVariable"]:
        """The inner graph's output variables: each has `.owner` (`.op`, `.inputs`,
        `.outputs`) and `.dtype`; constants have `.data` and no owner."""
        return self._graph()[1]

    def _graph(self):
        g = self.__dict__.get("_inner")
        if g is None:
            slots = [ScalarVariable(d, name=f"i{k}") for k, d in enumerate(self.in_dtypes)]
            slots += [ScalarVariable(d, data=v) for v, d in self.constants]
            for k, (op, args) in enumerate(self.steps):
                out = ScalarVariable(self.slot_dtypes[self.first_step + k])
                ScalarNode(op, [slots[a] for a in args], [out])
                slots.append(out)
            g = self._inner = (slots[: self.nin], [slots[o] for o in self.out_slots])
        return g

    # -- the scalar-op protocol -----------------------------------------------------------
    def output_dtype(self, *in_dtypes: str) -> str:
        if self.nout != 1:
            raise TypeError(f"{self} has {self.nout} outputs; use output_dtypes")
        return self.output_dtypes(*in_dtypes)[0]

    def output_dtypes(self, *in_dtypes: str) -> tuple[str, ...]:
        if tuple(in_dtypes) != self.in_dtypes:
            raise TypeError(f"{self} was built for inputs {self.in_dtypes}, got {tuple(in_dtypes)}")
        return self.out_dtypes

    def grad(self, T, inputs, output, gz):
        raise NotImplementedError("Composite ops come from fusion, after differentiation; "
                                  "take gradients of the unfused graph")

    def impl(self, *inputs: Any) -> Any:
        """NumPy evaluation over broadcastable arrays (one array, or a tuple if several)."""
        fn = self._kernel(None, None, ())
        res = fn(*inputs)
        return res[0] if self.nout == 1 else res

    # -- CUDA -----------------------------------------------------------------------------
    def _step_compute_dtype(self, args: Sequence[int]) -> str:
        d = upcast(*[self.slot_dtypes[a] for a in args]) if args else "float32"
        return value_dtype(d)

    def cuda(self, compute_dtype: str, operands: list[str]) -> str:
        """One CUDA C expression for a single-output Composite over operand expressions."""
        if self.nout != 1:
            raise TypeError(f"{self} has {self.nout} outputs; use cuda_lines")
        exprs = list(operands) + [_cuda_literal(v, d) for v, d in self.constants]
        for op, args in self.steps:
            exprs.append(op.cuda(self._step_compute_dtype(args), [exprs[a] for a in args]))
        return exprs[self.out_slots[0]]

    def cuda_lines(self, operands: list[str], outputs: list[str], prefix: str = "t") -> list[str]:
        """CUDA statements computing every output: one typed temporary per step, then
        `outputs[k] = <temporary>;` (the caller declares and stores the outputs)."""
        exprs = list(operands) + [_cuda_literal(v, d) for v, d in self.constants]
        lines = []
        for k, (op, args) in enumerate(self.steps):
            slot = self.first_step + k
            dtype = self.slot_dtypes[slot]
            ctype = C_TYPES[value_dtype(dtype)]
            expr = op.cuda(self._step_compute_dtype(args), [exprs[a] for a in args])
            name = f"{prefix}{k}"
            lines.append(f"const {ctype} {name} = {expr};")
            exprs.append(name)
        for name, o in zip(outputs, self.out_slots):
            lines.append(f"{name} = {exprs[o]};")
        return lines

    # -- CPU: generated NumPy code --------------------------------------------------------
    def _numpy_dtypes(self) -> list[str]:
        """The dtype NumPy actually gives for each step (to cast only where it differs)."""
        vals: list[Any] = [np.ones(1, dtype=d) for d in self.in_dtypes]
        vals += [np.asarray(v, dtype=d).reshape(1) for v, d in self.constants]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for op, args in self.steps:
                fn, _ = _impl_of(op)
                dtype = self.slot_dtypes[len(vals)]
                casts = _arg_casts(op, [self.slot_dtypes[a] for a in args], dtype)
                xs = [vals[a] if c is None else vals[a].astype(c) for a, c in zip(args, casts)]
                try:
                    acc = fn(xs[0], xs[1]) if op.nin < 0 and len(xs) > 1 else fn(*xs)
                    for x in xs[2:] if op.nin < 0 else ():
                        acc = fn(acc, x)
                    vals.append(np.asarray(acc))
                except Exception:  # a step NumPy refuses on sample values: its dtype rule decides
                    vals.append(np.ones(1, dtype=dtype))
        return [np.asarray(v).dtype.name for v in vals]

    def _kernel(self, in_bcast: tuple | None, out_bcast: tuple | None,
                inplace: tuple[tuple[int, int], ...], cells: bool = False):
        """Generated evaluation code for inputs of these broadcast patterns (None: unknown,
        no buffer reuse). With `cells`, returns `make(in_cells, out_cells) -> thunk`."""
        key = (in_bcast, out_bcast, inplace, cells)
        fn = self._kernels.get(key)
        if fn is None:
            fn = _generate(self, in_bcast, out_bcast, dict(inplace), cells)
            self._kernels[key] = fn
        return fn

    def make_elemwise_thunk(self, node, storage_map: dict, compute_map: dict):
        """The Elemwise hook: a thunk running this program over the node's storage cells."""
        op = node.op
        in_bcast = tuple(v.type.broadcastable for v in node.inputs)
        out_bcast = node.outputs[0].type.broadcastable
        make = self._kernel(in_bcast, out_bcast, tuple(op.inplace_pattern), cells=True)
        in_cells = [storage_map[v] for v in node.inputs]
        out_cells = [storage_map[v] for v in node.outputs]
        thunk = make(in_cells, out_cells)
        # 0-d integer programs run on Python ints, with this thunk for what they cannot do
        thunk = int_thunk(self, node, in_cells, out_cells, thunk) or thunk
        thunk.op, thunk.node = op, node
        thunk.inputs, thunk.outputs = in_cells, out_cells
        thunk.lazy = False
        return thunk

    def elemwise_perform(self, node, inputs: Sequence[Any], out: list[list]) -> None:
        """The Elemwise hook for `perform` (constant folding, reference runs)."""
        in_bcast = tuple(v.type.broadcastable for v in node.inputs)
        out_bcast = node.outputs[0].type.broadcastable
        fn = self._kernel(in_bcast, out_bcast, tuple(node.op.inplace_pattern))
        for cell, value in zip(out, fn(*inputs)):
            cell[0] = value


#: scalar ops a Composite's name writes infix, as Theano's (``Composite{(log(i0) * i0)}``)
#: a step's text past this many characters is named in ``str(Composite)`` (t0=...)
_LONG_TEXT = 160
_INFIX = {"add": "+", "sub": "-", "mul": "*", "true_div": "/", "int_div": "//", "pow": "**",
          "mod": "%"}


def _const_text(v: Any) -> str:
    if isinstance(v, (np.floating, float)) or dtype_kind(np.asarray(v).dtype) == "f":
        return repr(float(v)) if math.isfinite(v) else str(float(v))
    if isinstance(v, (np.bool_, bool)):
        return str(bool(v))
    return str(int(v))


def _cuda_literal(v: Any, dtype: str) -> str:
    if dtype == "bool":
        return "true" if v else "false"
    if dtype_kind(dtype) == "f":   # a half constant is a float: kernels compute in float
        f = float(v)
        double = dtype == "float64"
        if math.isnan(f):
            return "__longlong_as_double(0x7ff8000000000000LL)" if double else "__int_as_float(0x7fc00000)"
        if math.isinf(f):
            sign = "-" if f < 0 else ""
            if double:
                return f"({sign}__longlong_as_double(0x7ff0000000000000LL))"
            return f"({sign}__int_as_float(0x7f800000))"
        return f"((double){f!r})" if double else f"((float){f!r})"
    return f"(({C_TYPES[dtype]}){int(v)})"


def _lowered(c: Composite) -> Composite:
    """The program with softplus spelled out in table ops, so that softplus(x) and
    softplus(-x) share |x|, exp(-|x|) and log1p (the costly part) after step merging."""
    if not any(op.name == "softplus" for op, _ in c.steps):
        return c
    S = SCALAR_OPS
    b = CompositeBuilder()
    slots: list[Ref] = [b.add_input(d) for d in c.in_dtypes]
    slots += [b.add_constant(v, d) for v, d in c.constants]
    neg_of: dict[Ref, Ref] = {}
    for op, args in c.steps:
        refs = [slots[a] for a in args]
        dtype = c.slot_dtypes[len(slots)]
        if op.name == "softplus" and c.slot_dtypes[args[0]] == dtype:
            x = refs[0]
            a = b.add_op(S["abs"], [neg_of.get(x, x)])[0]
            e = b.add_op(S["exp"], [b.add_op(S["neg"], [a])[0]])[0]
            m = b.add_op(S["maximum"], [x, b.add_constant(0, dtype)])[0]
            r = b.add_op(S["add"], [m, b.add_op(S["log1p"], [e])[0]])[0]
        else:
            r = b.add_op(op, refs)[0]
            if op.name == "neg":
                neg_of[r] = refs[0]
        slots.append(r)
    return b.build([slots[o] for o in c.out_slots])


def _widened(c: Composite) -> Composite:
    """The program with its half-precision (float16, bfloat16) values held in float32: half
    inputs and constants converted once, every step computed in float32, half outputs
    rounded once at the end. Why: that is what the GPU's fused kernels do (load, compute in
    float, round on store), and rounding each intermediate to bfloat16's 8 bits would make
    the fused CPU result depend on the chain's length. A cast to a half type inside the
    program still rounds (and the program goes on in float32)."""
    if not any(d in HALF_DTYPES for d in c.slot_dtypes):
        return c
    b = CompositeBuilder()
    wide = Cast("float32")
    slots: list[Ref] = []
    for d in c.in_dtypes:
        r = b.add_input(d)
        slots.append(b.add_op(wide, [r])[0] if d in HALF_DTYPES else r)
    slots += [b.add_constant(v, value_dtype(d)) for v, d in c.constants]
    for op, args in c.steps:
        r = b.add_op(op, [slots[a] for a in args])[0]
        if isinstance(op, Cast) and op.dtype in HALF_DTYPES:
            r = b.add_op(wide, [r])[0]
        slots.append(r)
    outs = [b.add_op(Cast(d), [slots[o]])[0] if d in HALF_DTYPES else slots[o]
            for o, d in zip(c.out_slots, c.out_dtypes)]
    w = b.build(outs)
    # every dtype rule maps half operands as it maps float32 ones (value_dtype commutes with
    # upcast), so the outputs keep their dtypes; were one not to, keep the program as it is
    return w if w.out_dtypes == c.out_dtypes else c


def _generate(c: Composite, in_bcast, out_bcast, inplace: dict[int, int], cells: bool):
    """Write and compile the Python evaluation code (see Composite._kernel)."""
    c = _widened(_lowered(c))
    nin, first = c.nin, c.first_step
    ns: dict[str, Any] = {"np": np, "_asarray": np.asarray, "_array": np.array,
                          "_cast": lambda a, d: np.asarray(a, dtype=d),
                          "_broadcast_to": np.broadcast_to, "_bshapes": np.broadcast_shapes}
    names = [f"i{k}" for k in range(nin)] + [f"k{k}" for k in range(c.n_const)]
    for k, (v, d) in enumerate(c.constants):
        ns[f"k{k}"] = np.asarray(v, dtype=d)
    known = in_bcast is not None
    ndim = len(out_bcast) if known else None
    scalar = known and ndim == 0
    np_dtypes = c._numpy_dtypes()
    # static broadcast pattern of each slot (known only with in_bcast)
    bc: list[tuple | None] = list(in_bcast) if known else [None] * nin
    bc += [(True,) * ndim if known else None] * c.n_const
    last_use = [-1] * len(c.slot_dtypes)
    for k, (_op, args) in enumerate(c.steps):
        for a in args:
            last_use[a] = first + k
    outputs = set(c.out_slots)
    out_of_slot = {}
    for j, o in enumerate(c.out_slots):
        out_of_slot.setdefault(o, j)
    owned: dict[int, bool] = {}  # a fresh ndarray this kernel may overwrite once dead
    fresh: dict[int, bool] = {}  # a new object (not an input, a constant or another slot)
    free: list[int] = []  # dead intermediate slots whose buffers may be reused
    body: list[str] = []
    for k, (op, args) in enumerate(c.steps):
        slot = first + k
        dtype = c.slot_dtypes[slot]
        if known and op.name in _ALIASING:
            # the value is its last argument itself, not broadcast against the others
            bc.append(bc[args[-1]])
        elif known:
            bc.append(tuple(all(bc[a][d] for a in args) for d in range(ndim)))
        else:
            bc.append(None)
        fn, takes_out = _impl_of(op)
        fname = f"f{k}"
        ns[fname] = fn
        casts = _arg_casts(op, [c.slot_dtypes[a] for a in args], dtype)
        argnames = [names[a] if cd is None else f"_cast({names[a]}, '{cd}')"
                    for a, cd in zip(args, casts)]
        fold = op.nin < 0 and len(args) > 2
        argtext = ", ".join(argnames[:2] if fold else argnames)
        t = f"t{slot}"
        names.append(t)
        # buffers of arguments that die here may receive this step's result
        for a in args:
            if (a >= first and last_use[a] == slot and a not in outputs and owned.get(a)
                    and a not in free):
                free.append(a)
        target = None
        j = out_of_slot.get(slot)
        if j is not None and j in inplace and takes_out and not scalar and known:
            i = inplace[j]
            if last_use[i] <= slot and c.slot_dtypes[i] == dtype and bc[i] == bc[slot] \
                    and not (fold and i in args[2:]):
                target = names[i]
        if target is None and takes_out and known and not scalar:
            for a in free:
                if fold and a in args[2:]:
                    continue  # a folded add/mul still reads it after the first call
                if c.slot_dtypes[a] == dtype and bc[a] == bc[slot]:
                    free.remove(a)
                    target = names[a]
                    break
        fresh[slot] = op.name not in _ALIASING
        if op.name in _ALIASING:
            body.append(f"    {t} = {names[args[-1]]}")
            owned[slot] = False
        elif target is not None:
            # positional `out` is faster, but deprecated for np.maximum/np.minimum
            out_kw = "" if isinstance(fn, np.ufunc) and fn not in _KEYWORD_OUT else "out="
            body.append(f"    try:\n        {t} = {fname}({argtext}, {out_kw}{target})\n"
                        f"    except ValueError:\n        {t} = {fname}({argtext})")
            owned[slot] = True
        else:
            body.append(f"    {t} = {fname}({argtext})")
            owned[slot] = not scalar
        if fold and op.name not in _ALIASING:
            for extra in argnames[2:]:
                tail = "" if target is None else f", out={t}" if fn in _KEYWORD_OUT else f", {t}"
                body.append(f"    {t} = {fname}({t}, {extra}{tail})")
        if np_dtypes[slot] != dtype and op.name not in _ALIASING:
            body.append(f"    {t} = _asarray({t}).astype('{dtype}')")
    # outputs: fresh ndarrays of the full broadcast shape, in place where asked
    results = []
    need_shape = False
    seen_out: set[int] = set()
    for j, o in enumerate(c.out_slots):
        t = names[o]
        expr = t
        full = known and bc[o] == tuple(out_bcast)
        if scalar:
            expr = f"_array({t})" if not fresh.get(o) or o in seen_out else f"_asarray({t})"
        elif not fresh.get(o) or o in seen_out:
            expr = f"_array(_broadcast_to({t}, _shape))"
            need_shape = True
        elif not full:
            expr = f"({t} if {t}.shape == _shape else _array(_broadcast_to({t}, _shape)))"
            need_shape = True
        seen_out.add(o)
        if j in inplace:
            i = inplace[j]
            body.append(f"    r{j} = {expr}\n    if r{j} is not {names[i]}:\n"
                        f"        {names[i]}[...] = r{j}\n        r{j} = {names[i]}")
        else:
            body.append(f"    r{j} = {expr}")
        results.append(f"r{j}")
    if need_shape:
        body.insert(0, f"    _shape = _bshapes({', '.join(n + '.shape' for n in names[:nin])})")
    if cells:
        src = ["def make(in_cells, out_cells):"]
        src += [f"    c{k} = in_cells[{k}]" for k in range(nin)]
        src += [f"    o{j} = out_cells[{j}]" for j in range(c.nout)]
        src += ["    def thunk():"]
        src += [f"        i{k} = c{k}[0]" for k in range(nin)]
        src += ["    " + line.replace("\n", "\n    ") for line in body]
        src += [f"        o{j}[0] = r{j}" for j in range(c.nout)]
        src += ["    return thunk"]
        entry = "make"
    else:
        src = [f"def kernel({', '.join(names[:nin])}):"] + body
        src += [f"    return ({', '.join(results)},)"]
        entry = "kernel"
    code = "\n".join(src)
    exec(compile(code, f"<Composite {c.name[:60]}>", "exec"), ns)
    fn = ns[entry]
    fn.source = code
    return fn


class ScalarVariable:
    """A value of a Composite's inner graph (a dtype, maybe an owner or constant data)."""

    def __init__(self, dtype: str, owner: "ScalarNode | None" = None, data: Any = None,
                 name: str | None = None):
        self.dtype = dtype
        self.owner = owner
        self.index = 0
        self.name = name
        if data is not None:
            self.data = np.asarray(data, dtype=dtype)

    @property
    def type(self) -> "ScalarVariable":
        return self  # `.type.dtype` works as for tensor variables

    def __repr__(self) -> str:
        if self.name:
            return self.name
        return _const_text(self.data[()]) if hasattr(self, "data") else f"<{self.dtype}>"


class ScalarNode:
    """A step of a Composite's inner graph: `op` (a table row) over `inputs`."""

    def __init__(self, op: ScalarOp, inputs: list[ScalarVariable], outputs: list[ScalarVariable]):
        self.op, self.inputs, self.outputs = op, inputs, outputs
        for i, o in enumerate(outputs):
            o.owner, o.index = self, i


class CompositeBuilder:
    """Builds a Composite step by step (fusion uses it); nested Composites are inlined.

    Refs returned by `add_*` are opaque handles to pass back as arguments or outputs."""

    def __init__(self) -> None:
        self.in_dtypes: list[str] = []
        self.consts: list[tuple[Any, str]] = []
        self._const_index: dict[tuple, int] = {}
        self.steps: list[tuple[ScalarOp, list[Ref]]] = []
        self._step_index: dict[tuple, int] = {}

    def add_input(self, dtype: str) -> Ref:
        self.in_dtypes.append(dtype)
        return ("i", len(self.in_dtypes) - 1)

    def add_constant(self, value: Any, dtype: str) -> Ref:
        key = (dtype, np.asarray(value, dtype=dtype).tobytes())
        k = self._const_index.get(key)
        if k is None:
            self.consts.append((value, dtype))
            k = self._const_index[key] = len(self.consts) - 1
        return ("c", k)

    def add_op(self, op: Any, args: Sequence[Ref]) -> list[Ref]:
        """Append `op(args)`; returns the refs of its outputs (one unless a Composite)."""
        if isinstance(op, Composite):
            slots: list[Ref] = list(args)
            slots += [self.add_constant(v, d) for v, d in op.constants]
            for sop, sargs in op.steps:
                slots.append(self.add_op(sop, [slots[a] for a in sargs])[0])
            return [slots[o] for o in op.out_slots]
        key = (op, tuple(args))
        k = self._step_index.get(key)
        if k is None:
            self.steps.append((op, list(args)))
            k = self._step_index[key] = len(self.steps) - 1
        return [("s", k)]

    def build(self, outputs: Sequence[Ref]) -> Composite:
        nin, nc = len(self.in_dtypes), len(self.consts)

        def slot(r: Ref) -> int:
            kind, k = r
            return k if kind == "i" else nin + k if kind == "c" else nin + nc + k

        steps = [(op, [slot(a) for a in args]) for op, args in self.steps]
        return Composite(self.in_dtypes, self.consts, steps, [slot(o) for o in outputs])
