"""The GPU pooling kernels' own source (symgpu/gpu/ops/pooling.py, pooling_epilogue.py) compiled
as host C++ and run thread by thread on the CPU, against symgpu's NumPy pooling: their index
arithmetic (the int and long long variants) and the gradient epilogue are checked without a
GPU.  CUDA's qualifiers become empty macros, gridDim/blockDim/blockIdx/threadIdx globals, and
a wrapper per kernel loops over the grid's blocks and threads."""
from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.gpu.runtime.codegen import common_source
from symgpu.gpu.ops.pooling import POOL_DTYPES, GpuPool, index_suffix, pooling_source
from symgpu.gpu.ops.pooling_epilogue import epilogue_source
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.tensor.signal import pool_numpy as pn
from symgpu.tensor.signal.pool import pool_2d

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")

_PRELUDE = r"""
#include <algorithm>
#include <cmath>
#define __device__
#define __global__
#define __forceinline__
struct sg_dim3 { unsigned int x, y, z; };
static sg_dim3 gridDim, blockDim, blockIdx, threadIdx;
using std::min; using std::max;
"""
_GEO = ", ".join(f"long long {n}" for n in ("L", "H", "W", "ho", "wo", "ws0", "ws1", "st0",
                                            "st1", "p0", "p1"))
_GEO_ARGS = "L, H, W, ho, wo, ws0, ws1, st0, st1, p0, p1"
_BLOCK = 256


def _wrapper(name: str, params: str, args: str) -> str:
    return (f'extern "C" void host_{name}({params}, int blocks) {{\n'
            f'  gridDim.x = blocks; blockDim.x = {_BLOCK};\n'
            f'  for (unsigned b = 0; b < (unsigned)blocks; ++b)\n'
            f'    for (unsigned t = 0; t < {_BLOCK}; ++t) {{\n'
            f'      blockIdx.x = b; threadIdx.x = t; {name}({args});\n'
            f'    }}\n}}\n')


def _library(tmp_path, source: str, kernels: list[tuple[str, str, str]]) -> ctypes.CDLL:
    src = _PRELUDE + source + "".join(_wrapper(*k) for k in kernels)
    cpp, lib = tmp_path / "k.cpp", tmp_path / "k.so"
    cpp.write_text(src)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(lib), str(cpp)], check=True,
                   capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


def _kernels(dt: str, sfx: str) -> list[tuple[str, str, str]]:
    t = POOL_DTYPES[dt]
    return [(f"pool_fwd_{dt}{sfx}", f"const {t} *x, {t} *z, {_GEO}, int mode",
             f"x, z, {_GEO_ARGS}, mode"),
            (f"pool_grad_{dt}{sfx}", f"const {t} *x, const {t} *z, const {t} *gz, {t} *gx, "
             f"{_GEO}, int mode", f"x, z, gz, gx, {_GEO_ARGS}, mode")]


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _call(lib, name: str, ptrs: list, geo: list[int], mode: int | None, total: int) -> None:
    blocks = max(1, -(-total // _BLOCK))
    args = [_ptr(p) for p in ptrs] + [ctypes.c_longlong(g) for g in geo]
    if mode is not None:
        args.append(ctypes.c_int(mode))
    getattr(lib, f"host_{name}")(*args, ctypes.c_int(blocks))


CASES = [((2, 2), None, (0, 0), True), ((3, 2), (1, 1), (1, 1), True),
         ((2, 3), (2, 3), (0, 0), False), ((3, 3), (3, 1), (2, 1), True)]


@pytest.mark.parametrize("dt,sfx", list(itertools.product(POOL_DTYPES, ("", "_i32"))))
def test_forward_and_gradient_kernels_match_numpy(tmp_path, dt, sfx):
    lib = _library(tmp_path, pooling_source(), _kernels(dt, sfx))
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 7, 8)).astype(dt)
    x[0, 0, :2, :2] = 1.5   # ties: each window's gradient goes to every maximal element
    for (ws, st, pad, ib), mode in itertools.product(CASES, pn.MODES):
        if pad != (0, 0) and not ib:
            continue
        op = GpuPool(ws, st, pad, ib, mode)
        geo = op.geo(x.shape)
        want = pn.pool_forward(x, op.ws, op.stride, op.pad, ib, mode)
        z = np.zeros(want.shape, dt)
        _call(lib, f"pool_fwd_{dt}{sfx}", [x, z], geo, pn.MODES.index(mode), z.size)
        tol = 1e-12 if dt == "float64" else 1e-5
        np.testing.assert_allclose(z, want, rtol=tol, atol=tol,
                                   err_msg=str((ws, st, pad, ib, mode)))
        gz = rng.normal(size=z.shape).astype(dt)
        gx = np.zeros_like(x)
        _call(lib, f"pool_grad_{dt}{sfx}", [x, z, gz, gx], geo, pn.MODES.index(mode), x.size)
        if mode == "max":
            ref = pn.max_pool_grad(x, z, gz, op.ws, op.stride, op.pad, ib)
        else:
            ref = pn.average_pool_grad(x.shape, gz, op.ws, op.stride, op.pad, ib, mode, dt)
        np.testing.assert_allclose(gx, ref, rtol=tol, atol=tol,
                                   err_msg=str((ws, st, pad, ib, mode)))


@pytest.mark.parametrize("mode", ["max", "average_exc_pad"])
@pytest.mark.parametrize("sfx", ["", "_i32"])
def test_gradient_epilogue_kernel_matches_numpy(tmp_path, mode, sfx):
    """The epilogue LeNet gets (tanh's derivative, rendered from the fused graph's
    Composite) applied to the pooling gradient, as NumPy computes it."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        a, gz = T.tensor4("a"), T.tensor4("gz")
        gp = symgpu.grad((pool_2d(a, (2, 2), mode=mode) * gz).sum(), a)
        f = function([a, gz], gp * (1 - a * a))
    node = next(n for n in f.maker.fgraph.toposort()
                if type(n.op).__name__ == "GpuPoolGradEpilogue")
    op = node.op
    t = "float"
    source = epilogue_source(op.scalar_op, op.roles, "float32").replace(common_source(), "")
    lib = _library(tmp_path, source, [(f"pool_grad_epi{sfx}",
                                       f"const {t} *x, const {t} *z, const {t} *gz, {t} *gx, "
                                       f"{_GEO}, int mode", f"x, z, gz, gx, {_GEO_ARGS}, mode")])
    rng = np.random.default_rng(4)
    x = np.tanh(rng.normal(size=(3, 2, 6, 9))).astype("float32")
    geo = op.geo(x.shape)
    z = pn.pool_forward(x, op.ws, op.stride, op.pad, op.ignore_border, mode)
    gzv = rng.normal(size=z.shape).astype("float32")
    gx = np.zeros_like(x)
    _call(lib, f"pool_grad_epi{sfx}", [x, z, gzv, gx], geo, pn.MODES.index(mode), x.size)
    if mode == "max":
        g = pn.max_pool_grad(x, z, gzv, op.ws, op.stride, op.pad, op.ignore_border)
    else:
        g = pn.average_pool_grad(x.shape, gzv, op.ws, op.stride, op.pad, op.ignore_border,
                                 mode, "float32")
    np.testing.assert_allclose(gx, g * (1 - x * x), rtol=1e-5, atol=1e-6)


def test_the_index_width_the_launch_takes():
    assert index_suffix(GpuPool((2, 2)).geo((128, 20, 24, 24))) == "_i32"
