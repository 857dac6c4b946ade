"""0-d integer Composites evaluated with Python ints: the CPU fast path of host index arithmetic.

Why: a function's shape and index arithmetic (slice bounds merged by `merge_two_slices`, ...)
fuses into Composites of up to a few hundred 0-d integer steps that run on every call. The
generated NumPy code pays about a microsecond of ufunc dispatch per step; a Python int
operation costs tens of nanoseconds. NumPy's integers wrap and Python's do not, so every step
that may leave its slot's dtype is range-checked, and a call where one does, or that divides by
zero, or raises at all, runs the NumPy thunk instead: the results are NumPy's, bit for bit.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from symgpu.scalar.basic import Cast, ScalarOp
from symgpu.scalar.dtypes import is_bool, is_int

if TYPE_CHECKING:
    from symgpu.scalar.composite import Composite

__all__ = ["int_thunk", "supports"]


def _join(symbol: str) -> Callable[[Sequence[str]], str]:
    """A variadic row folded left. NumPy wraps each partial result, that is reduces it
    modulo 2**bits, which commutes with + and *: an exact total within range is NumPy's,
    so one range check of the total suffices (for bools, a total of at most 1 is their
    logical or, a product their logical and)."""
    return lambda a: "(" + f" {symbol} ".join(a) + ")"


def _form(template: str) -> Callable[[Sequence[str]], str]:
    return lambda a: template.format(*a)


#: row name -> (Python expression over argument names, whether it may leave the slot's range).
#: Unchecked rows give one of their arguments (maximum, switch...), a comparison, a value
#: bounded by an argument (mod: |r| < |divisor|), or a bitwise value of two's complement
#: arguments, which stays within the dtype both are promoted to.
_ROWS: dict[str, tuple[Callable[[Sequence[str]], str], bool]] = {
    "add": (_join("+"), True),
    "mul": (_join("*"), True),
    "sub": (_form("({0} - {1})"), True),
    "neg": (_form("(-{0})"), True),
    "abs": (_form("abs({0})"), True),       # abs(INT_MIN) wraps in NumPy
    "sqr": (_form("({0} * {0})"), True),
    "int_div": (_form("({0} // {1})"), True),   # INT_MIN // -1; // 0 raises, NumPy gives 0
    "mod": (_form("({0} % {1})"), False),       # Python's sign convention is NumPy's
    "sgn": (_form("(({0} > 0) - ({0} < 0))"), False),
    "maximum": (_form("({0} if {0} >= {1} else {1})"), False),
    "minimum": (_form("({0} if {0} <= {1} else {1})"), False),
    "clip": (_form("min(max({0}, {1}), {2})"), False),
    "switch": (_form("({1} if {0} else {2})"), False),
    "second": (_form("{1}"), False),
    "identity": (_form("{0}"), False),
    # integers are whole: NumPy's integer loops return them unchanged
    "floor": (_form("{0}"), False),
    "ceil": (_form("{0}"), False),
    "trunc": (_form("{0}"), False),
    "round": (_form("{0}"), False),
    "round_half_away_from_zero": (_form("{0}"), False),
    "isnan": (_form("False"), False),
    "isinf": (_form("False"), False),
    "lt": (_form("({0} < {1})"), False),
    "le": (_form("({0} <= {1})"), False),
    "gt": (_form("({0} > {1})"), False),
    "ge": (_form("({0} >= {1})"), False),
    "eq": (_form("({0} == {1})"), False),
    "neq": (_form("({0} != {1})"), False),
    "and_": (_form("({0} & {1})"), False),
    "or_": (_form("({0} | {1})"), False),
    "xor": (_form("({0} ^ {1})"), False),
}

# `invert` depends on the dtype (below); `pow` is left out: Python's ** of a huge exponent
# never ends, and NumPy refuses negative integer exponents.
_SUPPORTED = frozenset(_ROWS) | {"invert"}


def _bounds(dtype: str) -> tuple[int, int]:
    if dtype == "bool":
        return 0, 1
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def supports(composite: Composite) -> bool:
    """Whether every slot of `composite` is an integer or bool, every step a row this module
    writes, and NumPy computes each step in the slot's own dtype (not so for the square of
    a bool, computed in int8 and cast back: such a program keeps its NumPy thunk)."""
    if not all(is_int(d) or is_bool(d) for d in composite.slot_dtypes):
        return False
    if not all(isinstance(op, Cast) or op.name in _SUPPORTED for op, _ in composite.steps):
        return False
    return tuple(composite._numpy_dtypes()) == composite.slot_dtypes


def _expression(op: ScalarOp, args: list[str], arg_dtypes: list[str],
                dtype: str) -> tuple[str, bool]:
    """The Python expression of one step and whether its value needs a range check."""
    if isinstance(op, Cast):
        if dtype == "bool":
            return f"({args[0]} != 0)", False
        lo, hi = _bounds(dtype)
        src_lo, src_hi = _bounds(arg_dtypes[0])
        return args[0], not lo <= src_lo <= src_hi <= hi
    if op.name == "invert":
        if dtype == "bool":
            return f"(not {args[0]})", False
        lo, hi = _bounds(dtype)
        # two's complement ~x is -x - 1, within a signed range; an unsigned one mirrors
        return (f"(~{args[0]})" if lo < 0 else f"({hi} - {args[0]})"), False
    write, checked = _ROWS[op.name]
    return write(args), checked


def _literal(value: Any, dtype: str) -> str:
    return repr(bool(value)) if dtype == "bool" else f"({int(value)})"


def _generate(c: Composite) -> Callable:
    """Compile `make(in_cells, out_cells, fallback, array, dtypes) -> thunk` for `c`."""
    names = [f"i{k}" for k in range(c.nin)]
    names += [_literal(v, d) for v, d in c.constants]
    body = [f"            i{k} = {'bool' if d == 'bool' else 'int'}(c{k}[0])"
            for k, d in enumerate(c.in_dtypes)]
    for k, (op, args) in enumerate(c.steps):
        slot = c.first_step + k
        dtype = c.slot_dtypes[slot]
        expr, checked = _expression(op, [names[a] for a in args],
                                    [c.slot_dtypes[a] for a in args], dtype)
        t = f"t{slot}"
        names.append(t)
        body.append(f"            {t} = {expr}")
        if checked:
            lo, hi = _bounds(dtype)
            body.append(f"            if not {lo} <= {t} <= {hi}:\n"
                        f"                raise OverflowError")
    src = ["def make(in_cells, out_cells, fallback, array, dtypes):"]
    src += [f"    c{k} = in_cells[{k}]" for k in range(c.nin)]
    src += [f"    o{j} = out_cells[{j}]" for j in range(c.nout)]
    src += [f"    d{j} = dtypes[{j}]" for j in range(c.nout)]
    src += ["    def thunk():", "        try:"]
    src += body
    # any error (a range left, a division by zero, a bad input) is NumPy's to give or report
    src += ["        except Exception:", "            pass", "        else:"]
    src += [f"            o{j}[0] = array({names[o]}, d{j})" for j, o in enumerate(c.out_slots)]
    src += ["            return", "        fallback()", "    return thunk"]
    code = "\n".join(src)
    ns: dict[str, Any] = {}
    exec(compile(code, f"<int program {c.name[:60]}>", "exec"), ns)
    make = ns["make"]
    make.source = code
    return make


#: per Composite: its compiled `make`, or None when `supports` says no
_programs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def int_thunk(c: Composite, node: Any, in_cells: list, out_cells: list,
              fallback: Callable[[], None]) -> Callable[[], None] | None:
    """A thunk computing `node` (an Elemwise of `c`) with Python ints, running `fallback`
    (the NumPy thunk) for any call it cannot do exactly; None unless every input and output
    is 0-d, nothing is computed in place and `supports(c)`."""
    if node.op.inplace_pattern or any(v.type.broadcastable != ()
                                      for v in (*node.inputs, *node.outputs)):
        return None
    if c not in _programs:
        _programs[c] = _generate(c) if supports(c) else None
    make = _programs[c]
    if make is None:
        return None
    thunk = make(in_cells, out_cells, fallback, np.array,
                 [np.dtype(v.dtype) for v in node.outputs])
    thunk.int_program = make.source
    thunk.fallback = fallback
    return thunk
