"""C for a Composite: one loop that computes every output of a fused elementwise chain.

The kernel is ``void symgpu_elemwise(int64_t n, void **data)``: ``data`` holds one pointer per
input (a full C-contiguous array of ``n`` elements, or a one-element array read once as a
scalar, as ``kinds`` says), then one per output. Run it through
``symgpu.link.c_runtime``.

The expressions come from the scalar table's C expressions (the same rows the CUDA code
generator reads), with every operand converted to the dtype NumPy computes the step in, so
values match the NumPy path; no fused multiply-add, wrapping integers. Two rows are spelt
for vector units instead: ``sigmoid`` and ``softplus`` share one ``exp(-|x|)`` (it never
overflows, so libmvec's fast path always applies; sigmoid still underflows to 0 as
``1 / (1 + exp(-x))`` does on NumPy and the GPU). Rows whose C form can trap or differ
from NumPy (integer ``//``, ``%`` and ``**``) keep the node on NumPy.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from symgpu.scalar.basic import Cast, ScalarOp
from symgpu.scalar.composite import Composite, _cuda_literal
from symgpu.scalar.dtypes import C_TYPES, upcast

__all__ = ["C_DTYPES", "SYMBOL", "MAX_BROADCAST_NDIM", "supports", "elemwise_source",
           "broadcast_source", "sum_source", "VECTOR_MATH"]

SYMBOL = "symgpu_elemwise"

#: the most dimensions a kernel with partly broadcast inputs handles (the trampoline's 4)
MAX_BROADCAST_NDIM = 4

#: dtypes the C kernels handle (float16 and complex stay on NumPy)
C_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                      "uint64", "float32", "float64"])

#: rows whose integer C form could trap (INT_MIN // -1) or differs from NumPy (x ** -1)
_INT_UNSAFE = frozenset(["int_div", "mod", "pow"])

#: libm functions declared `simd` (glibc's libmvec) when it is linked: float and double
VECTOR_MATH = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
               "atan", "tanh", "sinh", "cosh", "erf", "pow")

_PRELUDE = r"""#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#define max(a, b) ((a) > (b) ? (a) : (b))
#define min(a, b) ((a) < (b) ? (a) : (b))
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
"""


def _vector_math_declarations() -> str:
    lines = ["#ifdef SYMGPU_MVEC"]
    for name in VECTOR_MATH:
        args = ", ".join(["float"] * (2 if name == "pow" else 1))
        dargs = args.replace("float", "double")
        lines.append(f'float {name}f({args}) __attribute__((simd("notinbranch")));')
        lines.append(f'double {name}({dargs}) __attribute__((simd("notinbranch")));')
    lines.append("#endif")
    return "\n".join(lines) + "\n"


_DECLARATIONS = _PRELUDE + _vector_math_declarations()


def _rule(op: ScalarOp) -> str | None:
    return getattr(getattr(op, "spec", None), "dtype_rule", None)


def _compute_dtype(op: ScalarOp, arg_dtypes: Sequence[str], out_dtype: str) -> str | None:
    """The dtype NumPy computes this step in (operands are converted to it); None: as is."""
    if isinstance(op, Cast) or _rule(op) == "second" or op.name == "identity":
        return None
    if _rule(op) in ("float", "true_div"):
        return out_dtype
    if op.name == "switch":
        return upcast(*arg_dtypes[1:])
    return upcast(*arg_dtypes)


def supports(c: Composite) -> bool:
    """Whether every dtype and row of `c` has a C form that matches NumPy."""
    if any(d not in C_DTYPES for d in c.slot_dtypes):
        return False
    for k, (op, args) in enumerate(c.steps):
        if isinstance(op, Cast):
            continue
        if not isinstance(op, ScalarOp) or op.spec.cuda is None or op.spec.cuda_only:
            return False
        dtype = _compute_dtype(op, [c.slot_dtypes[a] for a in args],
                               c.slot_dtypes[c.first_step + k])
        if op.name in _INT_UNSAFE and (dtype is None or not dtype.startswith("float")):
            return False
        arg_dtypes = [c.slot_dtypes[a] for a in args]
        if (_rule(op) == "bool" and dtype == "float64"
                and not any(d.startswith("float") for d in arg_dtypes)):
            return False  # uint64 vs a signed integer: NumPy compares exactly, not as doubles
    return True


def _ctype(dtype: str) -> str:
    return C_TYPES[dtype]


def _body(c: Composite, operands: list[str]) -> tuple[list[str], list[str]]:
    """Statements computing every step; returns (lines, the expression of every slot)."""
    exprs = list(operands) + [_cuda_literal(v, d) for v, d in c.constants]
    lines: list[str] = []
    shared: dict[tuple[str, str], str] = {}  # (what, operand) -> temporary

    def exp_neg_abs(x: str, dtype: str) -> str:
        key = ("exp_neg_abs", x)
        if key not in shared:
            f = "" if dtype == "float64" else "f"
            shared[key] = name = f"e{len(shared)}"
            lines.append(f"const {_ctype(dtype)} {name} = exp{f}(-fabs{f}({x}));")
        return shared[key]

    for k, (op, args) in enumerate(c.steps):
        slot = c.first_step + k
        out_dtype = c.slot_dtypes[slot]
        arg_dtypes = [c.slot_dtypes[a] for a in args]
        dtype = _compute_dtype(op, arg_dtypes, out_dtype)
        ops = []
        for j, (a, d) in enumerate(zip(args, arg_dtypes)):
            keep = dtype is None or d == dtype or (op.name == "switch" and j == 0)
            ops.append(exprs[a] if keep else f"(({_ctype(dtype)}){exprs[a]})")
        if op.name == "sigmoid":
            e = exp_neg_abs(ops[0], dtype)
            # 1 / (1 + exp(-x)) as the table has it: exp(-x) is e or 1/e, never a fresh exp
            expr = f"(1 / (1 + (({ops[0]}) >= 0 ? {e} : 1 / {e})))"
        elif op.name == "softplus":
            e = exp_neg_abs(ops[0], dtype)
            f = "" if dtype == "float64" else "f"
            expr = f"((({ops[0]}) > 0 ? ({ops[0]}) : 0) + log1p{f}({e}))"
        else:
            expr = op.cuda(dtype or arg_dtypes[0], ops)
        name = f"t{k}"
        lines.append(f"const {_ctype(out_dtype)} {name} = {expr};")
        exprs.append(name)
    return lines, exprs


@lru_cache(maxsize=1024)  # asked by the link-time prefetch, then by the thunk
def elemwise_source(c: Composite, kinds: str) -> str:
    """The C source of `c`'s kernel; ``kinds[k]`` is 'f' (full) or 's' (scalar) for input k."""
    if len(kinds) != c.nin:
        raise ValueError(f"{len(kinds)} input kinds for a Composite of {c.nin} inputs")
    head, loads = [], []
    for k, (kind, dtype) in enumerate(zip(kinds, c.in_dtypes)):
        t = _ctype(dtype)
        if kind == "s":
            head.append(f"    const {t} i{k} = ((const {t} *)data[{k}])[0];")
        else:
            head.append(f"    const {t} *p{k} = data[{k}];")
            loads.append(f"        const {t} i{k} = p{k}[i];")
    for j, o in enumerate(c.out_slots):
        head.append(f"    {_ctype(c.slot_dtypes[o])} *q{j} = data[{c.nin + j}];")
    lines, exprs = _body(c, [f"i{k}" for k in range(c.nin)])
    stores = [f"        q{j}[i] = {exprs[o]};" for j, o in enumerate(c.out_slots)]
    return "".join([
        f"/* {c.name[:200].replace('*/', '* /')} */\n", _DECLARATIONS,
        f"void {SYMBOL}(int64_t n, void **data)\n{{\n", "\n".join(head), "\n",
        "    #pragma omp simd\n    for (int64_t i = 0; i < n; i++) {\n",
        "\n".join(loads + ["        " + line for line in lines] + stores),
        "\n    }\n}\n"])


@lru_cache(maxsize=1024)
def broadcast_source(c: Composite, patterns: tuple[tuple[bool, ...], ...]) -> str:
    """The C source of `c`'s kernel for inputs of these broadcast patterns (any mix of full,
    partly and wholly broadcast, 2 to MAX_BROADCAST_NDIM dimensions): ``int
    symgpu_elemwise(void **data, const int64_t *shape, const int *ndim)``, run through
    ``run_sized``. Output 0 gives the shape; every array is checked against it (an input's
    broadcast dimensions must be 1, the others equal) and a mismatch returns 1, so the caller
    takes the NumPy path and its errors. Loops go over the outer dimensions; the innermost
    is one vectorised loop, where an input broadcast along it is read once."""
    n = len(patterns[0]) if patterns else 0
    if not 2 <= n <= MAX_BROADCAST_NDIM or len(patterns) != c.nin:
        raise ValueError(f"broadcast_source: {len(patterns)} patterns of {n} dimensions for a "
                         f"Composite of {c.nin} inputs")
    nin, nout = c.nin, c.nout
    head = [f"    const int64_t *os = shape + {4 * nin};",
            f"    for (int j = {nin}; j < {nin + nout}; j++) {{",
            f"        if (ndim[j] != {n}) return 1;",
            f"        for (int d = 0; d < {n}; d++) if (shape[4 * j + d] != os[d]) return 1;",
            "    }"]
    for k, pat in enumerate(patterns):
        head.append(f"    if (ndim[{k}] != {n}) return 1;")
        for d, b in enumerate(pat):
            want = "1" if b else f"os[{d}]"
            head.append(f"    if (shape[{4 * k + d}] != {want}) return 1;")
    for k, pat in enumerate(patterns):
        t = _ctype(c.in_dtypes[k])
        head.append(f"    const {t} *p{k} = data[{k}];")
        for d in range(n - 1):  # element strides of input k (C-contiguous, length 1 if broadcast)
            after = " * ".join(f"os[{e}]" for e in range(d + 1, n) if not pat[e]) or "1"
            head.append(f"    const int64_t st{k}_{d} = {'0' if pat[d] else after};")
    for j, slot in enumerate(c.out_slots):
        head.append(f"    {_ctype(c.slot_dtypes[slot])} *q{j} = data[{nin + j}];")
    lines, exprs = _body(c, [f"i{k}" for k in range(nin)])
    loops, indent = [], "    "
    for d in range(n - 1):
        loops.append(f"{indent}for (int64_t x{d} = 0; x{d} < os[{d}]; x{d}++) {{")
        indent += "    "
    out_base = "x0"
    for d in range(1, n - 1):
        out_base = f"({out_base} * os[{d}] + x{d})"
    loops.append(f"{indent}const int64_t ob = {out_base} * os[{n - 1}];")
    for k in range(nin):
        offset = " + ".join(f"x{d} * st{k}_{d}" for d in range(n - 1))
        loops.append(f"{indent}const {_ctype(c.in_dtypes[k])} *b{k} = p{k} + {offset};")
    loops.append(f"{indent}#pragma omp simd")
    loops.append(f"{indent}for (int64_t i = 0; i < os[{n - 1}]; i++) {{")
    inner = indent + "    "
    for k, pat in enumerate(patterns):
        loops.append(f"{inner}const {_ctype(c.in_dtypes[k])} i{k} = b{k}[{'0' if pat[-1] else 'i'}];")
    loops += [inner + line for line in lines]
    loops += [f"{inner}q{j}[ob + i] = {exprs[slot]};" for j, slot in enumerate(c.out_slots)]
    for d in range(n, 0, -1):
        indent = "    " * d
        loops.append(f"{indent}}}")
    return "".join([
        f"/* {c.name[:200].replace('*/', '* /')} {patterns} */\n", _DECLARATIONS,
        f"int {SYMBOL}(void **data, const int64_t *shape, const int *ndim)\n{{\n",
        "\n".join(head + loops), "\n    return 0;\n}\n"])


@lru_cache(maxsize=None)
def sum_source(dtype: str) -> str:
    """The C source of a full sum of a contiguous float array: pairwise summation as NumPy's
    (eight running sums over blocks of at most 128 elements, halves added), so the error
    stays O(log n) ulp; the order differs from NumPy 2's, so the last bits may too.
    ``data``: the input (n elements), then the one-element output."""
    if dtype not in ("float32", "float64"):
        raise ValueError(f"sum_source: {dtype} sums stay on NumPy")
    t = _ctype(dtype)
    return f"""/* sum {dtype} */
#include <stdint.h>
static {t} pairwise(const {t} *a, int64_t n)
{{
    if (n < 8) {{
        {t} res = 0;
        for (int64_t i = 0; i < n; i++)
            res += a[i];
        return res;
    }}
    if (n <= 128) {{
        {t} r[8];
        int64_t i;
        for (int j = 0; j < 8; j++)
            r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++)
                r[j] += a[i + j];
        {t} res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i];
        return res;
    }}
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise(a, n2) + pairwise(a + n2, n - n2);
}}
void {SYMBOL}(int64_t n, void **data)
{{
    const {t} *a = data[0];
    {t} *out = data[1];
    out[0] = pairwise(a, n);
}}
"""
