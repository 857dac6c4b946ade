"""0-d integer Composites evaluated with Python ints (symgpu.scalar.int_program): bit for bit
NumPy's generated thunk on random programs and edge values (wrapping, division by zero and
INT_MIN // -1 through the NumPy fallback), which nodes take the fast path, and compiled
functions of fused index arithmetic."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from c_kernel_helpers import composite
import symgpu
import symgpu.tensor as T
from symgpu.scalar import int_program
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.scalar.composite import Composite, CompositeBuilder
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.rewriting.subtensor_merge import merged_index
from symgpu.tensor.type import TensorType

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint32", "bool"]

#: (row, arity) drawn by the random programs; casts to every dtype are drawn too
ROWS = [("add", 2), ("add", 3), ("mul", 2), ("mul", 3), ("sub", 2), ("neg", 1), ("abs", 1),
        ("sqr", 1), ("int_div", 2), ("mod", 2), ("sgn", 1), ("maximum", 2), ("minimum", 2),
        ("clip", 3), ("switch", 3), ("second", 2), ("identity", 1), ("lt", 2), ("le", 2),
        ("gt", 2), ("ge", 2), ("eq", 2), ("neq", 2), ("and_", 2), ("or_", 2), ("xor", 2),
        ("invert", 1), ("floor", 1), ("round", 1), ("isnan", 1)]

I64, I32 = np.iinfo(np.int64), np.iinfo(np.int32)
EDGES = [0, 1, -1, 2, -2, 3, 7, -7, 100, 255, I64.max, I64.min, I64.max - 1, I64.min + 1,
         I32.max, I32.min, 127, -128, 32767, -32768, 2 ** 32 - 1]


def _values(dtype, rng, n):
    """`n` values of `dtype`: mostly edge values it can hold, some random ones."""
    if dtype == "bool":
        return [np.array(v, "bool") for v in rng.random(n) < 0.5]
    info = np.iinfo(dtype)
    edges = [v for v in EDGES if info.min <= v <= info.max] + [int(info.min), int(info.max)]
    out = []
    for _ in range(n):
        if rng.random() < 0.7:
            v = edges[rng.integers(len(edges))]
        else:
            v = int(rng.integers(max(info.min, -1000), min(info.max, 1000), endpoint=True))
        out.append(np.array(v, dtype))
    return out


def _random_composite(rng) -> Composite:
    b = CompositeBuilder()
    refs = [b.add_input(DTYPES[rng.integers(len(DTYPES))]) for _ in range(rng.integers(1, 4))]
    dtypes = [b.in_dtypes[k] for k in range(len(refs))]
    for _ in range(rng.integers(0, 3)):
        d = DTYPES[rng.integers(len(DTYPES))]
        refs.append(b.add_constant(_values(d, rng, 1)[0], d))
        dtypes.append(d)
    steps = []
    while len(steps) < rng.integers(3, 14):
        if rng.random() < 0.12:
            op, nin = Cast(DTYPES[rng.integers(len(DTYPES))]), 1
        else:
            name, nin = ROWS[rng.integers(len(ROWS))]
            op = SCALAR_OPS[name]
        # recent slots more often, so that steps chain
        args = [min(len(refs) - 1, int(len(refs) * rng.random() ** 0.5)) for _ in range(nin)]
        try:
            dtype = op.output_dtype(*[dtypes[a] for a in args])
        except TypeError:   # e.g. neg of a bool, refused as NumPy refuses it
            continue
        if op.name == "sqr" and dtype == "bool":
            continue   # NumPy squares bools in int8: no fast path (test_fast_path_not_taken)
        refs.append(b.add_op(op, [refs[a] for a in args])[0])
        dtypes.append(dtype)
        steps.append(refs[-1])
    outs = [steps[rng.integers(len(steps))] for _ in range(rng.integers(1, 3))]
    return b.build(outs)


def _node(comp: Composite, ndims=None):
    ndims = ndims or [0] * comp.nin
    ins = [TensorType(d, (False,) * n)() for d, n in zip(comp.in_dtypes, ndims)]
    outs = Elemwise(comp)(*ins)
    return (outs if isinstance(outs, (list, tuple)) else [outs])[0].owner


def _numpy_thunk(comp, node, in_cells, out_cells):
    """The generated NumPy thunk, the fallback and the reference."""
    make = comp._kernel(tuple(v.type.broadcastable for v in node.inputs),
                        node.outputs[0].type.broadcastable, (), cells=True)
    return make(in_cells, out_cells)


def _assert_identical(got, expected, label):
    assert got.__class__ is expected.__class__ is np.ndarray, (label, type(got), type(expected))
    assert got.dtype == expected.dtype and got.shape == expected.shape == (), label
    assert got.tobytes() == expected.tobytes(), f"{label}: {got!r}, NumPy {expected!r}"


def _check(comp, inputs, label, fallbacks=None):
    """Run the int program and NumPy's thunk on `inputs`; compare every output exactly."""
    node = _node(comp)
    in_cells = [[v] for v in inputs]
    fast_cells = [[None] for _ in node.outputs]
    ref_cells = [[None] for _ in node.outputs]
    ref = _numpy_thunk(comp, node, in_cells, ref_cells)
    numpy_fallback = _numpy_thunk(comp, node, in_cells, fast_cells)

    def fallback():
        if fallbacks is not None:
            fallbacks.append(label)
        numpy_fallback()
    thunk = int_program.int_thunk(comp, node, in_cells, fast_cells, fallback)
    assert thunk is not None, f"{label}: no fast path for {comp}"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        thunk()
        ref()
    for j, (g, e) in enumerate(zip(fast_cells, ref_cells)):
        _assert_identical(g[0], e[0], f"{label} output {j} of {comp} at {inputs}")


def test_random_programs_match_numpy():
    rng = np.random.default_rng(20240611)
    fallbacks: list = []
    runs = 0
    for p in range(300):
        comp = _random_composite(rng)
        assert int_program.supports(comp), comp
        for _ in range(12):
            inputs = [_values(d, rng, 1)[0] for d in comp.in_dtypes]
            _check(comp, inputs, f"program {p}", fallbacks)
            runs += 1
    # both paths ran: most calls on Python ints, some through NumPy (wrapped, // 0, ...)
    assert 0 < len(fallbacks) < runs / 2, (len(fallbacks), runs)


@pytest.mark.parametrize("in_dtypes, prog, inputs, expect_fallback", [
    # int64 max + 1 wraps in NumPy: the fallback gives its value
    (["int64", "int64"], [("add", [0, 1])], [I64.max, 1], True),
    (["int64", "int64"], [("sub", [0, 1])], [I64.min, 1], True),
    (["int64", "int64"], [("mul", [0, 1])], [I64.max, 2], True),
    (["int32", "int32"], [("add", [0, 1])], [I32.max, 1], True),
    (["int64"], [("neg", [0])], [I64.min], True),
    (["int64"], [("abs", [0])], [I64.min], True),
    (["int64", "int64"], [("int_div", [0, 1])], [I64.min, -1], True),
    (["int8", "int8"], [("int_div", [0, 1])], [-128, -1], True),
    (["int64", "int64"], [("int_div", [0, 1])], [7, 0], True),
    (["int64", "int64"], [("mod", [0, 1])], [7, 0], True),
    (["uint8", "uint8"], [("int_div", [0, 1])], [255, 0], True),
    (["uint8"], [("neg", [0])], [3], True),
    (["uint8", "uint8"], [("sub", [0, 1])], [3, 5], True),
    (["uint8", "uint8"], [("add", [0, 1])], [255, 1], True),
    (["bool", "bool"], [("add", [0, 1])], [True, True], True),   # logical or in NumPy
    (["int64"], [(Cast("int8"), [0])], [300], True),
    (["int64"], [(Cast("uint32"), [0])], [-1], True),
    # in range: no fallback
    (["int64", "int64"], [("add", [0, 1])], [I64.max, 0], False),
    (["int64", "int64"], [("int_div", [0, 1])], [-7, 2], False),
    (["int64", "int64"], [("mod", [0, 1])], [-7, 2], False),
    (["int64", "int64"], [("mod", [0, 1])], [7, -2], False),
    (["int8", "uint8"], [("and_", [0, 1])], [-1, 255], False),
    (["int32", "uint32"], [("xor", [0, 1])], [I32.min, 2 ** 32 - 1], False),
    (["uint8"], [("invert", [0])], [5], False),
    (["bool"], [("invert", [0])], [True], False),
    (["int8"], [("invert", [0])], [-128], False),
    (["uint32"], [("sgn", [0])], [2 ** 32 - 1], False),
    (["bool", "bool"], [("mul", [0, 1])], [True, True], False),
    (["bool", "bool"], [("int_div", [0, 1])], [True, True], False),
    (["int64"], [(Cast("bool"), [0])], [I64.min], False),
    (["bool"], [(Cast("uint8"), [0])], [True], False),
    (["int64", "uint32"], [("lt", [0, 1])], [-1, 2 ** 32 - 1], False),
    (["bool", "int64", "uint8"], [("switch", [0, 1, 2])], [False, I64.min, 255], False),
    (["int64", "int8", "int16"], [("clip", [0, 1, 2])], [I64.max, 5, -3], False),
])
def test_edge_cases(in_dtypes, prog, inputs, expect_fallback):
    comp = composite(in_dtypes, prog, [len(in_dtypes) + len(prog) - 1])
    fallbacks: list = []
    _check(comp, [np.array(v, d) for v, d in zip(inputs, in_dtypes)], "edge", fallbacks)
    assert bool(fallbacks) == expect_fallback


def test_chained_steps_and_constants():
    # steps feeding steps, constants inlined, several outputs of mixed dtypes
    comp = composite(["int64", "int32", "bool"],
                [("mul", [0, 4]), ("int_div", [5, 1]), ("switch", [2, 6, 3]), ("lt", [7, 0]),
                 ("maximum", [7, 1]), (Cast("int16"), [9])],
                [6, 8, 10], consts=[(-3, "int8"), (2, "int64")])
    rng = np.random.default_rng(0)
    for a, b, c in itertools.product(_values("int64", rng, 8), _values("int32", rng, 8),
                                     [np.array(False), np.array(True)]):
        _check(comp, [a, b, c], "chain")


def _elemwise_thunk(comp, ndims=None):
    node = _node(comp, ndims)
    storage = {v: [None] for v in (*node.inputs, *node.outputs)}
    return node, storage, node.op.make_thunk(node, storage, {}, [])


def test_fast_path_taken_for_a_0d_integer_composite():
    comp = composite(["int64", "int64"], [("int_div", [0, 1]), ("add", [2, 0])], [3])
    node, storage, thunk = _elemwise_thunk(comp)
    assert getattr(thunk, "int_program", None), thunk
    assert (thunk.op, thunk.node, thunk.lazy) == (node.op, node, False)
    assert thunk.inputs == [storage[v] for v in node.inputs]
    assert thunk.outputs == [storage[v] for v in node.outputs]
    storage[node.inputs[0]][0], storage[node.inputs[1]][0] = np.array(17), np.array(-5)
    thunk()
    _assert_identical(storage[node.outputs[0]][0], np.array(17 // -5 + 17), "fast")


@pytest.mark.parametrize("in_dtypes, prog, ndims", [
    (["int64", "float64"], [("add", [0, 1]), ("mul", [2, 0])], None),   # a float slot
    (["int64", "uint64"], [("add", [0, 1]), ("int_div", [2, 0])], None),   # -> float64
    (["int64", "int64"], [("add", [0, 1]), ("int_div", [2, 0])], [1, 0]),  # not 0-d
    (["int64", "int64"], [("pow", [0, 1]), ("int_div", [2, 0])], None),    # unsupported row
    (["bool", "int8"], [("sqr", [0]), ("add", [2, 1])], None),   # NumPy's int8, not bool
])
def test_fast_path_not_taken(in_dtypes, prog, ndims):
    comp = composite(in_dtypes, prog, [len(in_dtypes) + len(prog) - 1])
    _, _, thunk = _elemwise_thunk(comp, ndims)
    assert getattr(thunk, "int_program", None) is None


def test_errors_come_from_the_numpy_thunk():
    # an input NumPy cannot take: the fallback raises its own error, not a chained one
    comp = composite(["int64", "int64"], [("int_div", [0, 1]), ("add", [2, 0])], [3])
    node, storage, thunk = _elemwise_thunk(comp)
    storage[node.inputs[0]][0] = np.array(3)
    with pytest.raises(TypeError) as info:
        thunk()
    assert info.value.__context__ is None


def _int_thunks(f):
    return [t for t in f.vm.thunks if getattr(t, "int_program", None)]


def test_compiled_function_matches_numpy():
    a, b, c = T.lscalar("a"), T.lscalar("b"), T.lscalar("c")
    i = T.maximum(T.minimum(a, b) // 2, c) * 3 - T.switch(T.lt(a, c), a, c)
    f = symgpu.function([a, b, c], [i, (a + b) // (c + 1), (a * b) % c])
    assert len(_int_thunks(f)) == 1
    rng = np.random.default_rng(1)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        for x, y, z in itertools.product(*[_values("int64", rng, 6)] * 3):
            x, y, z = np.array(x), np.array(y), np.array(z)
            expect = [np.maximum(np.minimum(x, y) // 2, z) * 3 - np.where(x < z, x, z),
                      (x + y) // (z + 1), (x * y) % z]
            for got, e in zip(f(x, y, z), expect):
                _assert_identical(got, np.asarray(e), f"f({x}, {y}, {z})")


def test_merged_slice_bounds_match_numpy_slicing():
    # the bounds merge_two_slices writes: a few hundred fused 0-d integer steps
    a, b, c, s = (T.lscalar(n) for n in "abcs")
    x = T.vector("x")
    first = merged_index(x, [slice(None, a, s)], [slice(b, None)])
    index = merged_index(x, list(first), [slice(c, None, -1)])
    f = symgpu.function([x, a, b, c, s], x[index])
    (thunk,) = _int_thunks(f)
    assert len(thunk.node.op.scalar_op.steps) > 100
    xv = np.arange(23.0)
    for av, bv, cv, sv in itertools.product([-30, -5, 0, 4, 17, 40], [-9, 0, 2, 30],
                                            [-4, 0, 3, 50], [-3, -1, 1, 2]):
        np.testing.assert_array_equal(f(xv, av, bv, cv, sv), xv[:av:sv][bv:][cv::-1])
