"""Pickling and copy.deepcopy of GPU arrays, contexts, and GPU functions and shared variables
that ran (on the host emulator, tests/emulated_gpu.py, with a context that refuses pickling
as PyCUDA's does; twins marked gpu on the real device), loaded again in this process and in a
fresh CPU-only one where PyCUDA cannot be imported. (tests/test_pickle.py: the host cases.)"""
import copy
import os
import pickle

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function, shared

from gpu_helpers import requires_gpu


def roundtrip(obj, protocol=pickle.HIGHEST_PROTOCOL):
    return pickle.loads(pickle.dumps(obj, protocol=protocol))


# ---------------------------------------------------------------- GpuArrays, contexts, and GPU
# functions that ran (host emulator: tests/emulated_gpu.py; twins on the real GPU)

_BLOCK_PYCUDA = (
    "import sys\n"
    "class _NoPycuda:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'pycuda' or name.startswith('pycuda.'):\n"
    "            raise ImportError('pycuda is blocked: a CPU-only process')\n"
    "sys.meta_path.insert(0, _NoPycuda())\n")


def _load_in_a_cpu_only_process(path, check):
    """Run `check` (code using `obj`, the unpickled content of `path`) in a fresh Python with
    device=cpu and PyCUDA unimportable; returns its stdout."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (_BLOCK_PYCUDA + "import pickle\nimport numpy as np\n"
            f"obj = pickle.load(open({str(path)!r}, 'rb'))\n" + check +
            "\nassert 'pycuda' not in sys.modules and 'pycuda.driver' not in sys.modules\n")
    env = dict(os.environ, SYMGPU_FLAGS="device=cpu",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, timeout=300,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


class _PycudaContextStandIn:
    """Pickles as PyCUDA's Context does on a real GPU (the fake driver's objects would not)."""

    def __reduce__(self):
        raise TypeError("Pickling of pycuda._driver.Context is not enabled")

    def __deepcopy__(self, memo):
        raise TypeError("Pickling of pycuda._driver.Context is not enabled")


@pytest.fixture
def emu_gpu(monkeypatch, tmp_path):
    """An emulated device registered as context 'emu_pickle' whose context holds an object
    that refuses pickling and copying, as PyCUDA's Context does."""
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("no g++ here")
    from emulated_gpu import emulated_array_device
    from symgpu.gpu.runtime.context import register_context, unregister_context
    ctx = emulated_array_device(monkeypatch, tmp_path)
    ctx.pycuda_context = _PycudaContextStandIn()
    register_context("emu_pickle", ctx)
    yield ctx
    unregister_context("emu_pickle")


def _emu_training_step(ctx_name):
    """A GPU shared weight, an array constant (a GpuArrayConstant on the device) and an SGD
    update; all on the device."""
    from symgpu.config import config
    from symgpu.gpu.placement.type import gpuarray_shared_constructor
    with config.change_flags(floatX="float32"):
        w = gpuarray_shared_constructor(np.arange(4, dtype="float32"), name="w",
                                        target=ctx_name)
        c = np.array([1, 2, 3, 4], dtype="float32")
        cost = ((w - c) ** 2).sum()
        f = function([], cost, updates=[(w, w - 0.1 * T.grad(cost, w))], name="train")
    return w, c, f


def _sgd(w, c, steps):
    costs = []
    for _ in range(steps):
        costs.append(((w - c) ** 2).sum())
        w = w - 0.1 * 2 * (w - c)
    return w, costs


def test_gpuarray_pickles_as_its_value_and_its_context_name(emu_gpu):
    from emulated_gpu import device_array
    from symgpu.gpu.runtime.array import GpuArray
    from symgpu.gpu.runtime.context import unregister_context, register_context
    host = np.arange(6, dtype="float32").reshape(2, 3)
    a = device_array(emu_gpu, host).T
    b = roundtrip(a)                     # the context is in use here: back on the device
    assert isinstance(b, GpuArray) and b.context is emu_gpu and b.ptr != a.ptr
    np.testing.assert_array_equal(b.get(), host.T)
    for c in (copy.copy(a), copy.deepcopy(a)):
        assert isinstance(c, GpuArray) and c.ptr != a.ptr and c.context is emu_gpu
        np.testing.assert_array_equal(c.get(), host.T)
    blob = pickle.dumps(a)
    unregister_context("emu_pickle")
    try:
        host_again = pickle.loads(blob)  # no such context here: the NumPy array
    finally:
        register_context("emu_pickle", emu_gpu)
    assert type(host_again) is np.ndarray
    np.testing.assert_array_equal(host_again, host.T)


def test_a_gpu_context_copies_as_itself_and_pickles_as_its_name():
    from symgpu.gpu.runtime.context import (ContextNotFound, GpuContext, register_context,
                                            unregister_context)
    ctx = GpuContext("pickle_ctx", "cuda0")
    ctx.pycuda_context = _PycudaContextStandIn()
    register_context("pickle_ctx", ctx)
    try:
        assert copy.copy(ctx) is ctx and copy.deepcopy([ctx])[0] is ctx
        blob = pickle.dumps(ctx)
        assert roundtrip(ctx) is ctx           # looked up again by name
    finally:
        unregister_context("pickle_ctx")
    with pytest.raises(ContextNotFound, match=r"pickled GPU context \('pickle_ctx'.*not in use"):
        pickle.loads(blob)


def test_a_gpu_function_that_ran_pickles_and_loads_in_a_cpu_only_process(emu_gpu, tmp_path):
    w, c, f = _emu_training_step("emu_pickle")
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuElemwise" in names and "GpuCAReduce" in names
    assert any(type(v).__name__ == "GpuArrayConstant" for v in f.maker.fgraph.variables)
    f()                                    # it ran: its nodes carry run-time state now
    f()
    w_now, _ = _sgd(np.arange(4, dtype="float32"), c, 2)
    np.testing.assert_allclose(w.get_value(), w_now, rtol=1e-6)
    path = tmp_path / "model.pkl"
    with open(path, "wb") as fh:
        pickle.dump({"train": f, "w": w}, fh)
    _, costs = _sgd(w_now, c, 2)
    w_next, _ = _sgd(w_now, c, 2)
    out = _load_in_a_cpu_only_process(path, (
        "from symgpu.tensor.sharedvar import TensorSharedVariable\n"
        "f, w = obj['train'], obj['w']\n"
        "assert type(w) is TensorSharedVariable and f.get_shared() == [w]\n"
        "assert not any('Gpu' in type(n.op).__name__ for n in f.maker.fgraph.toposort())\n"
        "print(repr([float(f()), float(f())]), repr(w.get_value().tolist()))\n"))
    got_costs, got_w = out.strip().split("] ")
    np.testing.assert_allclose(eval(got_costs + "]"), costs, rtol=1e-5)
    np.testing.assert_allclose(eval(got_w), w_next, rtol=1e-5)


def test_deepcopy_of_a_model_holding_gpu_shared_variables_and_functions(emu_gpu):
    """Theano's `best = copy.deepcopy(model)`: the copy's function updates the copy's
    weight; training the copy leaves the original alone, and the other way round."""
    from symgpu.gpu.placement.type import GpuArraySharedVariable

    class Model:
        def __init__(self):
            self.w, self.c, self.train = _emu_training_step("emu_pickle")

    model = Model()
    model.train()
    best = copy.deepcopy(model)
    assert isinstance(best.w, GpuArraySharedVariable) and best.w is not model.w
    assert best.train.get_shared() == [best.w] and best.train is not model.train
    assert best.w.container.storage[0].ptr != model.w.container.storage[0].ptr
    w1, _ = _sgd(np.arange(4, dtype="float32"), model.c, 1)
    np.testing.assert_allclose(best.w.get_value(), w1, rtol=1e-6)
    for _ in range(3):
        best.train()
    np.testing.assert_allclose(model.w.get_value(), w1, rtol=1e-6)  # the original: untouched
    np.testing.assert_allclose(best.w.get_value(), _sgd(w1, model.c, 3)[0], rtol=1e-5)
    model.train()
    np.testing.assert_allclose(best.w.get_value(), _sgd(w1, model.c, 3)[0], rtol=1e-5)
    again = roundtrip(vars(best))          # a pickle of the copy, in this process: on the device
    assert isinstance(again["w"], GpuArraySharedVariable)
    np.testing.assert_allclose(again["train"](), _sgd(w1, model.c, 4)[1][3], rtol=1e-5)


@requires_gpu
def test_gpu_function_and_shared_load_in_a_cpu_only_process_on_a_real_gpu(cuda, tmp_path):
    from symgpu.gpu.placement.type import GpuArraySharedVariable
    w = shared(np.arange(4, dtype="float32"), name="w")
    assert isinstance(w, GpuArraySharedVariable) and w.container.storage[0].context is cuda
    x = T.fvector("x")
    c = np.array([1, 2, 3, 4], dtype="float32")
    f = function([x], ((w * x - c) ** 2).sum(), updates=[(w, w - 0.01 * x)], name="step")
    assert any(type(n.op).__name__.startswith("Gpu") for n in f.maker.fgraph.toposort())
    ones = np.ones(4, dtype="float32")
    f(ones)
    path = tmp_path / "gpu_model.pkl"
    with open(path, "wb") as fh:
        pickle.dump((f, w), fh)
    w_now = w.get_value()
    out = _load_in_a_cpu_only_process(path, (
        "f, w = obj\n"
        "x = np.ones(4, dtype='float32')\n"
        "print(float(f(x)), repr(w.get_value().tolist()))\n"))
    cost, w_after = out.strip().split(" ", 1)
    np.testing.assert_allclose(float(cost), ((w_now - c) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(eval(w_after), w_now - 0.01, rtol=1e-6)
    g, w2 = roundtrip((f, w))               # and here, where the GPU is in use: on it
    assert isinstance(w2, GpuArraySharedVariable)
    np.testing.assert_allclose(g(ones), ((w_now - c) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(w.get_value(), w_now)
    a = w.get_value(return_internal_type=True)
    b = pickle.loads(pickle.dumps(a))
    assert b.context is cuda and b.ptr != a.ptr
    np.testing.assert_array_equal(b.get(), a.get())


@requires_gpu
def test_deepcopy_of_a_gpu_model_on_a_real_gpu(cuda):
    from symgpu.gpu.placement.type import GpuArraySharedVariable
    w = shared(np.arange(4, dtype="float32"), name="w")
    c = np.array([1, 2, 3, 4], dtype="float32")
    cost = ((w - c) ** 2).sum()
    train = function([], cost, updates=[(w, w - 0.1 * T.grad(cost, w))])
    assert any(type(n.op).__name__.startswith("Gpu") for n in train.maker.fgraph.toposort())
    model = {"w": w, "train": train}
    train()
    best = copy.deepcopy(model)
    assert isinstance(best["w"], GpuArraySharedVariable)
    assert best["train"].get_shared() == [best["w"]]
    w1 = w.get_value()
    for _ in range(3):
        best["train"]()
    np.testing.assert_allclose(w.get_value(), w1)
    np.testing.assert_allclose(best["w"].get_value(), _sgd(w1, c, 3)[0], rtol=1e-5)
