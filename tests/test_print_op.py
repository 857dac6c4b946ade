"""symgpu.printing.Print: an identity op that prints its value (Theano's debugging FAQ)."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.compile.mode import Mode
from symgpu.gradient_check import verify_grad
from symgpu.printing import Print, debugprint


def print_nodes(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Print)]


def test_faq_example_prints_message_and_value(capsys):
    x = symgpu.tensor.dvector("x")
    x_printed = symgpu.printing.Print("this is a very important value")(x)
    f = symgpu.function([x], x * 5)
    f_with_print = symgpu.function([x], x_printed * 5)
    assert np.all(f([1, 2, 3]) == [5, 10, 15])
    assert capsys.readouterr().out == ""
    assert np.all(f_with_print([1, 2, 3]) == [5, 10, 15])
    assert capsys.readouterr().out == "this is a very important value __str__ = [1. 2. 3.]\n"


def test_prints_at_every_call(capsys):
    x = T.dvector("x")
    f = function([x], Print("v")(x).sum())
    f(np.zeros(2))
    f(np.ones(2))
    assert capsys.readouterr().out == "v __str__ = [0. 0.]\nv __str__ = [1. 1.]\n"


def test_attrs_in_order_and_callables_called(capsys):
    x = T.dmatrix("x")
    f = function([x], Print("m", attrs=("shape", "__str__", "sum"))(x) + 1)
    out = f(np.arange(6.0).reshape(2, 3))
    assert np.array_equal(out, np.arange(6.0).reshape(2, 3) + 1)
    assert capsys.readouterr().out == ("m shape = (2, 3)\n"
                                       f"m __str__ = {np.arange(6.0).reshape(2, 3)}\n"
                                       "m sum = 15.0\n")


def test_global_fn_replaces_the_printing(capsys):
    seen = []
    x = T.dvector("x")
    op = Print("ignored", global_fn=lambda op_, value: seen.append((op_.message, value.copy())))
    function([x], op(x) * 2)(np.arange(3.0))
    assert capsys.readouterr().out == ""
    assert seen[0][0] == "ignored" and np.array_equal(seen[0][1], np.arange(3.0))


def test_string_attrs_is_a_clear_error():
    with pytest.raises(TypeError, match=r"tuple of attribute names.*\('shape',\)"):
        Print("x", attrs="shape")


def test_output_is_a_view_and_function_output_is_not_the_input():
    x = T.dvector("x")
    node = Print("x")(x).owner
    assert node.op.view_map == {0: [0]}
    f = function([x], Print("x", global_fn=lambda *a: None)(x))
    xv = np.arange(3.0)
    out = f(xv)
    out[0] = 99.0
    assert xv[0] == 0.0  # the function copied the view of its input


@pytest.mark.parametrize("mode", ["FAST_RUN", "FAST_COMPILE"])
def test_not_removed_folded_or_merged_by_rewrites(mode, capsys):
    x = T.dvector("x")
    c = T.constant(np.arange(3.0))
    a = Print("a")(x)
    b = Print("a")(x)  # same message, distinct op: must stay two prints
    folded = Print("const")(c)  # constant input: must not be folded at compile time
    f = function([x], [a * 2, b * 3, folded + 1], mode=mode)
    assert len(print_nodes(f)) == 3
    assert capsys.readouterr().out == ""  # nothing printed while compiling
    f(np.ones(3))
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == sorted(["a __str__ = [1. 1. 1.]"] * 2 + ["const __str__ = [0. 1. 2.]"])


def test_gradient_passes_through():
    x = T.dvector("x")
    g = symgpu.grad((Print("x", global_fn=lambda *a: None)(x) ** 2).sum(), x)
    f = function([x], g)
    np.testing.assert_allclose(f(np.arange(3.0)), 2 * np.arange(3.0))
    rng = np.random.default_rng(0)
    verify_grad(lambda v: T.exp(Print("v", global_fn=lambda *a: None)(v)).sum(),
                [rng.random(4)], rng=rng)


def test_printed_when_computing_test_values(capsys):
    x = T.dvector("x")
    x.tag.test_value = np.arange(2.0)
    with config.change_flags(compute_test_value="raise"):
        y = Print("tv")(x)
    assert np.array_equal(y.tag.test_value, np.arange(2.0))
    assert capsys.readouterr().out == "tv __str__ = [0. 1.]\n"


def test_debugprint_names_the_message():
    x = T.dvector("x")
    text = debugprint(Print("hello")(x), file="str")
    assert text.startswith("Print{message='hello', attrs=('__str__',)} [id A] ''")


def test_device_values_are_printed_from_a_host_copy(capsys):
    """A stand-in device array: only __cuda_array_interface__ and __array__ (no __str__ of
    its own), as symgpu.gpu.GpuArray's printing path sees it."""
    class DeviceArray:
        shape, dtype = (2,), np.dtype("float32")
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False),
                                    "version": 3}

        def __array__(self, dtype=None, copy=None):
            return np.array([1.5, 2.5], dtype="float32")

        def __str__(self):
            raise AssertionError("must not be printed on the device")

    op = Print("g", attrs=("shape", "__str__"))
    out = [[None]]
    value = DeviceArray()
    op.perform(None, [value], out)
    assert out[0][0] is value
    assert capsys.readouterr().out == "g shape = (2,)\ng __str__ = [1.5 2.5]\n"


def test_stays_on_the_gpu_when_lifted():
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.gpu.placement.type import is_gpu_var
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fvector("x")
        f = function([x], T.exp(Print("e")(T.exp(x))) * 2)
        (node,) = print_nodes(f)
        assert is_gpu_var(node.inputs[0]) and is_gpu_var(node.outputs[0])
        names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
        assert names.count("GpuFromHost") == 1 and names.count("HostFromGpu") == 1


# ----------------------------------------------------------------------------- on a real GPU
from gpu_helpers import requires_gpu  # noqa: E402


@requires_gpu
def test_gpu_value_printed_from_the_device(cuda, capsys):
    from symgpu.gpu.placement.type import is_gpu_var
    w = symgpu.shared(np.arange(4, dtype="float32"), "w")
    assert is_gpu_var(w)
    f = function([], T.exp(Print("w", attrs=("shape", "__str__"))(w * 2)) + 1)
    (node,) = print_nodes(f)
    assert is_gpu_var(node.inputs[0])
    out = f()
    np.testing.assert_allclose(out, np.exp(np.arange(4) * 2.0) + 1, rtol=1e-5)
    doubled = np.arange(4.0, dtype="float32") * 2
    assert capsys.readouterr().out == f"w shape = (4,)\nw __str__ = {doubled}\n"
    f()
    assert capsys.readouterr().out.count("w shape = (4,)") == 1


def test_a_function_with_print_pickles(capsys):
    import pickle
    x = T.dvector("x")
    f = function([x], Print("p")(x) * 2)
    g = pickle.loads(pickle.dumps(f))
    assert np.array_equal(g(np.ones(2)), [2.0, 2.0])
    assert capsys.readouterr().out == "p __str__ = [1. 1.]\n"
