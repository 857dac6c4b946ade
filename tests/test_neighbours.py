"""symgpu.tensor.nnet.neighbours: images2neibs in every mode against a direct NumPy loop,
neibs2images as its inverse, gradients with verify_grad (every mode), infer_shape, errors."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet.neighbours import (Images2Neibs, Images2NeibsGrad, images2neibs,
                                           neibs2images)
from symgpu.tensor.rewriting.shape_feature import node_shapes

RNG = np.random.RandomState(11)


def reference(img, neib_shape, neib_step, mode):
    """Theano's definition, one window at a time: row b + gd * (a + gc * (s + S * n)) is the
    window at (a * sx, b * sy) of image (n, s), padded ('half', 'full') or wrapped."""
    (c, d), (sx, sy) = neib_shape, neib_step
    N, S, H, W = img.shape
    pad = {"half": (c // 2, d // 2), "full": (c - 1, d - 1)}.get(mode, (0, 0))
    padded = np.pad(img, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    rows = []
    for n in range(N):
        for s in range(S):
            if mode == "wrap_centered":
                for a in range(-(-H // sx)):
                    for b in range(-(-W // sy)):
                        rows.append([img[n, s, (a * sx + i - c // 2) % H, (b * sy + j - d // 2) % W]
                                     for i in range(c) for j in range(d)])
                continue
            h, w = padded.shape[2:]
            for a in range((h - c) // sx + 1):
                for b in range((w - d) // sy + 1):
                    rows.append(padded[n, s, a * sx:a * sx + c, b * sy:b * sy + d].ravel())
    return np.array(rows).reshape(-1, c * d)


# (mode, image shape, neib_shape, neib_step) that each mode accepts
CASES = [
    ("valid", (2, 3, 6, 6), (2, 2), None),
    ("valid", (1, 2, 7, 9), (3, 3), (2, 3)),
    ("valid", (2, 1, 5, 4), (5, 1), (1, 1)),
    ("ignore_borders", (2, 3, 7, 8), (2, 3), None),
    ("ignore_borders", (1, 2, 7, 9), (3, 2), (2, 4)),
    ("half", (2, 2, 7, 8), (3, 2), (2, 2)),
    ("half", (1, 2, 5, 6), (3, 3), (1, 1)),
    ("full", (1, 2, 7, 9), (2, 2), (1, 3)),
    ("full", (2, 1, 4, 5), (3, 2), (1, 1)),
    ("wrap_centered", (2, 2, 7, 9), (3, 5), (2, 3)),
    ("wrap_centered", (1, 2, 5, 5), (5, 3), (1, 1)),
    ("wrap_centered", (1, 1, 4, 6), (3, 3), None),
]


@pytest.mark.parametrize("mode, shape, neib_shape, neib_step", CASES)
def test_images2neibs_matches_the_loop(mode, shape, neib_shape, neib_step):
    x = T.dtensor4()
    v = RNG.rand(*shape)
    got = function([x], images2neibs(x, neib_shape, neib_step, mode=mode))(v)
    want = reference(v, neib_shape, neib_step or neib_shape, mode)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_theanos_example():
    x = T.dtensor4()
    im = np.arange(100.).reshape((1, 1, 10, 10))
    neibs = function([x], images2neibs(x, neib_shape=(5, 5)))(im)
    assert neibs.shape == (4, 25)
    np.testing.assert_array_equal(neibs[1], im[0, 0, 0:5, 5:10].ravel())
    m = T.dmatrix()
    back = function([m], neibs2images(m, (5, 5), im.shape))(neibs)
    np.testing.assert_array_equal(back, im)


def test_symbolic_shapes_and_steps():
    x, shp, step = T.dtensor4(), T.lvector(), T.ivector()
    f = function([x, shp, step], images2neibs(x, shp, step, mode="half"))
    v = RNG.rand(1, 2, 7, 8)
    np.testing.assert_array_equal(f(v, [3, 2], [2, 2]), reference(v, (3, 2), (2, 2), "half"))


def test_float32():
    x = T.ftensor4()
    v = RNG.rand(1, 2, 4, 4).astype("float32")
    got = function([x], images2neibs(x, (2, 2)))(v)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, reference(v, (2, 2), (2, 2), "valid"))


@pytest.mark.parametrize("mode, shape, neib_shape, neib_step", CASES)
def test_images2neibs_gradient(mode, shape, neib_shape, neib_step):
    verify_grad(lambda a: images2neibs(a, neib_shape, neib_step, mode=mode),
                [RNG.rand(*shape)], rng=np.random.default_rng(0))


def test_gradient_sums_overlapping_windows():
    x = T.dtensor4()
    v = RNG.rand(1, 1, 4, 4)
    g = function([x], T.grad(images2neibs(x, (2, 2), (1, 1)).sum(), x))(v)
    # how many 2x2 windows (stride 1) cover each pixel of a 4x4 image
    counts = np.array([1, 2, 2, 1])
    np.testing.assert_array_equal(g[0, 0], np.outer(counts, counts))
    gw = function([x], T.grad(images2neibs(x, (3, 3), (1, 1), mode="wrap_centered").sum(),
                              x))(v)
    np.testing.assert_array_equal(gw, np.full_like(v, 9.0))  # every pixel in 9 windows


def test_gradient_of_the_gradient():
    mode, shape, ns, st = "half", (1, 2, 5, 7), (3, 3), (2, 2)
    n_rows = reference(RNG.rand(*shape), ns, st, mode).shape[0]
    verify_grad(lambda g: Images2NeibsGrad(mode)(g, T.zeros(shape), ns, st),
                [RNG.rand(n_rows, 9)], rng=np.random.default_rng(0))


@pytest.mark.parametrize("mode", ["valid", "ignore_borders"])
@pytest.mark.parametrize("shape, neib_shape", [((2, 3, 6, 8), (2, 4)), ((1, 2, 7, 9), (3, 2))])
def test_neibs2images_inverts_images2neibs(mode, shape, neib_shape):
    x = T.dtensor4()
    v = RNG.rand(*shape)
    c, d = neib_shape
    fits = shape[2] % c == 0 and shape[3] % d == 0
    neibs = images2neibs(x, neib_shape, mode=mode)
    back = neibs2images(neibs, neib_shape, x.shape, mode=mode)
    f = function([x], back)
    if mode == "valid" and not fits:
        with pytest.raises(ValueError):
            f(v)
        return
    want = v.copy()
    want[:, :, (shape[2] // c) * c:, :] = 0
    want[:, :, :, (shape[3] // d) * d:] = 0
    np.testing.assert_array_equal(f(v), want)


def test_neibs2images_gradient():
    shape = (1, 2, 6, 4)
    n = reference(RNG.rand(*shape), (3, 2), (3, 2), "valid").shape[0]
    for mode in ("valid", "ignore_borders"):
        verify_grad(lambda m: neibs2images(m, (3, 2), shape, mode=mode), [RNG.rand(n, 6)],
                    rng=np.random.default_rng(0))
    verify_grad(lambda m: neibs2images(m, (3, 2), (1, 2, 7, 5), mode="ignore_borders"),
                [RNG.rand(n, 6)], rng=np.random.default_rng(0))


@pytest.mark.parametrize("mode, shape, neib_shape, neib_step", CASES)
def test_infer_shape(mode, shape, neib_shape, neib_step):
    x = T.dtensor4()
    out = images2neibs(x, neib_shape, neib_step, mode=mode)
    (dims,) = node_shapes(out.owner)
    got = function([x], [out] + [T.cast(d, "int64") for d in dims])(RNG.rand(*shape))
    assert tuple(int(d) for d in got[1:]) == got[0].shape
    g = T.grad(out.sum(), x)
    assert isinstance(g.owner.op, Images2NeibsGrad)
    (gdims,) = node_shapes(g.owner)
    assert [int(d) for d in function([x], list(gdims))(RNG.rand(*shape))] == list(shape)


@pytest.mark.parametrize("mode, shape, neib_shape, neib_step, match", [
    ("valid", (1, 1, 7, 6), (2, 2), None, r"neib_shape\[0\] = 2.*length 7"),
    ("valid", (1, 1, 6, 7), (2, 2), None, r"neib_shape\[1\] = 2.*length 7"),
    ("valid", (1, 1, 2, 6), (3, 2), None, "larger than the image"),
    ("ignore_borders", (1, 1, 2, 6), (3, 2), None, "larger than the image"),
    ("half", (1, 1, 6, 6), (3, 3), (2, 2), r"neib_step\[0\] = 2.*'half'"),
    ("full", (1, 1, 5, 6), (2, 2), (2, 2), "'full'"),
    ("wrap_centered", (1, 1, 6, 6), (2, 3), None, "odd window"),
    ("wrap_centered", (1, 1, 2, 6), (3, 3), None, "at least as large"),
    ("valid", (1, 1, 6, 6), (0, 2), None, "neib_shape must be positive"),
    ("valid", (1, 1, 6, 6), (2, 2), (2, -1), "neib_step must be positive"),
    ("valid", (1, 1, 6, 6), (2, 2, 2), None, "two integers"),
])
def test_bad_values(mode, shape, neib_shape, neib_step, match):
    x = T.dtensor4()
    f = function([x], images2neibs(x, neib_shape, neib_step, mode=mode))
    with pytest.raises(ValueError, match=match):
        f(RNG.rand(*shape))


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode must be one of"):
        Images2Neibs("same")
    with pytest.raises(TypeError, match="4-d tensor.*3 dimensions"):
        images2neibs(T.dtensor3(), (2, 2))
    with pytest.raises(TypeError, match="neib_shape must be two integers"):
        images2neibs(T.dtensor4(), T.dvector())
    with pytest.raises(TypeError, match="neib_step must be two integers"):
        images2neibs(T.dtensor4(), (2, 2), T.lmatrix())
    with pytest.raises(ValueError, match="neibs2images: mode must be"):
        neibs2images(T.dmatrix(), (2, 2), (1, 1, 4, 4), mode="half")
    with pytest.raises(TypeError, match="neibs must be a matrix"):
        neibs2images(T.dtensor3(), (2, 2), (1, 1, 4, 4))


def test_import_path():
    import symgpu.tensor.nnet as nnet  # the module is reachable as T.nnet.neighbours too
    from symgpu.tensor.nnet.neighbours import images2neibs as again
    assert again is images2neibs
    assert nnet.neighbours.images2neibs is images2neibs


def test_a_gpu_graph_runs_the_ops_on_the_gpu():
    """(tests/test_gpu_neighbours.py has the GPU ops' own tests.)"""
    from symgpu import config
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.ftensor4("x")
        y = images2neibs(x * 2, (2, 2), mode="half") + 1
        f = function([x], [y, T.grad(y.sum(), x)])
        names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert {"GpuImages2Neibs", "GpuImages2NeibsGrad"} <= names, names
        assert not {"Images2Neibs", "Images2NeibsGrad"} & names, names


def test_functions_and_graphs_pickle():
    import pickle
    x = T.dtensor4("x")
    nb = images2neibs(x, (2, 3), (1, 1), mode="half")
    outs = [nb, T.grad((nb ** 2).sum(), x), neibs2images(images2neibs(x, (2, 3)), (2, 3), x.shape)]
    v = RNG.rand(1, 2, 4, 6)
    f = function([x], outs)
    for got, want in zip(pickle.loads(pickle.dumps(f))(v), f(v)):
        np.testing.assert_array_equal(got, want)
    x2, outs2 = pickle.loads(pickle.dumps((x, outs)))
    for got, want in zip(function([x2], outs2)(v), f(v)):
        np.testing.assert_array_equal(got, want)
