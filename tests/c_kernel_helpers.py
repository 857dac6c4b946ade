"""Shared pieces of the C kernel tests (tests/test_c_elemwise.py, tests/test_c_runtime.py):
tolerances, Composite builders, NumPy comparisons, and a stand-in for cuLaunchKernel (the C
runtime's launch_kernel, also tests/test_gpu_codegen.py). Their fixtures, `spy` and
`private_compiledir`, are in tests/conftest.py."""
from __future__ import annotations

import ctypes

import numpy as np

from symgpu.graph.fg import FunctionGraph
from symgpu.link import cc
from symgpu.link.vm import link
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.scalar.composite import Composite, CompositeBuilder
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.type import TensorType

RNG = np.random.RandomState(1234)

#: rows computed by libm/libmvec (or spelt differently from NumPy): compared to a few ulp
TRANSCENDENTAL = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid",
                  "softplus", "sin", "cos", "tan", "arctan", "tanh", "sinh", "cosh", "erf", "pow"}
TRANSCENDENTAL |= {"arcsin", "arccos", "arcsinh", "arccosh", "arctanh", "arctan2"}
TRANSCENDENTAL |= {"xlogx", "xlogy0"}   # x * log(y)
RTOL = {"float32": 2e-6, "float64": 1e-14}

#: rows whose C form is refused for integer (and bool) operands
INT_UNSAFE = {"int_div", "mod", "pow"}

#: the signed zero NumPy's max/min/clip return for equal zeros depends on its SIMD path
SIGNED_ZERO_FREE = {"maximum", "minimum", "clip"}

ROW_DTYPES = ["float32", "float64", "int32", "int64", "uint8", "bool"]


# ----------------------------------------------------------------------------- helpers

def composite(in_dtypes, prog, outs, consts=()):
    """A Composite from (row name, argument indices) steps; indices count inputs, then
    constants, then steps."""
    b = CompositeBuilder()
    refs = [b.add_input(d) for d in in_dtypes]
    refs += [b.add_constant(v, d) for v, d in consts]
    for name, args in prog:
        op = name if isinstance(name, Cast) else SCALAR_OPS[name]
        refs.append(b.add_op(op, [refs[a] for a in args])[0])
    return b.build([refs[o] for o in outs])


def link_composite(comp, values):
    """Link one Elemwise(comp) node over `values` (no rewrites); returns (vm, output cells)."""
    ins = [TensorType(np.asarray(v).dtype.name, (False,) * np.ndim(v))() for v in values]
    outs = Elemwise(comp)(*ins)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    fg = FunctionGraph(ins, outs, clone=False)
    storage = {v: [x] for v, x in zip(ins, values)}
    vm = link(fg, storage)
    return vm, [storage[o] for o in outs]


def fused_thunks(f):
    """(node, thunk) of every Elemwise-of-Composite node of a compiled function."""
    return [(n, t) for n, t in zip(f.vm.nodes, f.vm.thunks)
            if isinstance(n.op, Elemwise) and isinstance(n.op.scalar_op, Composite)]


def c_thunks(f):
    return [t for t in f.vm.thunks if getattr(t, "c_kernel", None)]


def assert_same(got, expected, label="", signed_zeros=True):
    """Exact equality, nan where NumPy has nan, and (for floats) the sign of zeros."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, f"{label}: dtype {got.dtype}, NumPy {expected.dtype}"
    assert got.shape == expected.shape, f"{label}: shape {got.shape}, NumPy {expected.shape}"
    np.testing.assert_array_equal(got, expected, err_msg=label)
    if signed_zeros and got.dtype.kind == "f":
        zero = (expected == 0) & (got == 0)
        bad = np.flatnonzero(zero & (np.signbit(got) != np.signbit(expected)))
        assert not bad.size, f"{label}: sign of zero differs at {bad[:5]}"


def assert_close(got, expected, label="", cancel=False):
    """A few ulp (libmvec is within 4); absolute below the smallest normal, where one
    ulp of a subnormal is relatively huge (e.g. sigmoid(-89) in float32). With `cancel`,
    a few ulp of 1 absolute too: for sums like exp(x) * y + 2 that may cancel."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, f"{label}: dtype {got.dtype}, NumPy {expected.dtype}"
    rtol = RTOL[got.dtype.name]
    atol = 4 * rtol if cancel else float(np.finfo(got.dtype).tiny)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=label)  # nan and +-inf where NumPy has them


#: a stand-in for cuLaunchKernel (its signature) that records what it was given (``got``,
#: the parameter bytes in ``params``) and returns 700 for a grid x of 999
FAKE_LAUNCH = r"""
#include <string.h>
unsigned long long got[12];
char params[64];
int fake_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned shared, void *stream, void **kernel_params, void **extra)
{
    unsigned dims[7] = {gx, gy, gz, bx, by, bz, shared};
    got[0] = (unsigned long long)f;
    for (int i = 0; i < 7; i++) got[1 + i] = dims[i];
    got[8] = (unsigned long long)stream;
    got[9] = (unsigned long long)kernel_params;
    /* extra: {BUFFER_POINTER (1), buffer, BUFFER_SIZE (2), &size, END (0)} */
    got[10] = (unsigned long long)extra[0] + 10 * (unsigned long long)extra[2] +
              100 * (unsigned long long)extra[4];
    got[11] = *(size_t *)extra[3];
    memcpy(params, extra[1], got[11] < 64 ? got[11] : 64);
    return (int)gx == 999 ? 700 : 0;
}
"""


def fake_launch_library() -> tuple[ctypes.CDLL, int]:
    """FAKE_LAUNCH built and loaded, and the address of its fake_launch."""
    lib = cc.load_library(FAKE_LAUNCH)
    return lib, ctypes.cast(lib.fake_launch, ctypes.c_void_p).value


def fake_launch_record(lib: ctypes.CDLL, nbytes: int) -> tuple[list[int], bytes]:
    """What fake_launch last got: its twelve recorded numbers and ``nbytes`` of parameters."""
    got = list((ctypes.c_ulonglong * 12).in_dll(lib, "got"))
    return got, ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, "params")), nbytes)
