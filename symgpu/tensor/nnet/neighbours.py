"""Theano's `theano.tensor.nnet.neighbours`: sliding windows of images as rows of a matrix
(`images2neibs`) and back (`neibs2images`).

`images2neibs(ten4, (c, d), (sx, sy), mode)` reads a (N, S, H, W) tensor: for every image
(n, s) and every window position (a, b) (row-major, a over rows), it writes the c x d window
whose top-left corner is (a * sx, b * sy), flattened row by row, as one row of the result:
row `b + gd * (a + gc * (s + S * n))` of a (N * S * gc * gd, c * d) matrix. The modes say
where the windows are:

- 'valid': windows inside the image; (H - c) must be a multiple of sx (and W likewise);
- 'ignore_borders': as 'valid', leaving out what does not fit a whole step;
- 'half': as 'valid' on the image padded with c // 2 (d // 2) zeros on each side;
- 'full': as 'valid' on the image padded with c - 1 (d - 1) zeros on each side;
- 'wrap_centered': a window centred on every step-th pixel (c, d odd), wrapping around the
  image's edges (torus); ceil(H / sx) x ceil(W / sy) windows.

The gradient (every mode) adds each window's gradient back onto the pixels it read
(`Images2NeibsGrad`), so pixels shared by overlapping windows receive the sum.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float, is_int
from symgpu.tensor.basic import concatenate, reshape, stack, zeros
from symgpu.tensor.shape_rules import as_dim, s_add, s_floordiv, s_mul, s_sub
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Images2Neibs", "Images2NeibsGrad", "images2neibs", "neibs2images"]

MODES = ("valid", "ignore_borders", "wrap_centered", "half", "full")


def _check_mode(mode: Any, what: str) -> None:
    if mode not in MODES:
        raise ValueError(f"{what}: mode must be one of {MODES}, got {mode!r}")


def _pair(v: Any, name: str, what: str) -> TensorVariable:
    v = as_tensor_variable(v)
    if v.ndim != 1 or not is_int(v.dtype):
        raise TypeError(f"{what}: {name} must be two integers (an integer vector), got {v} "
                        f"({v.type})")
    return v


def _axis_grid(length: int, c: int, step: int, mode: str, which: str) -> tuple[int, int]:
    """(window positions, leading padding) along an axis of `length` pixels: window w reads
    pixel `w * step + i - padding` at offset i (modulo `length` in 'wrap_centered', a padding
    zero outside the image otherwise). Checks the mode's conditions."""
    if mode == "wrap_centered":
        if c % 2 != 1:
            raise ValueError(f"images2neibs: mode 'wrap_centered' needs odd window shapes, "
                             f"got neib_shape[{which}] = {c}")
        if length < c:
            raise ValueError(f"images2neibs: mode 'wrap_centered' needs images at least as "
                             f"large as the window: neib_shape[{which}] = {c}, image length "
                             f"{length}")
        return -(-length // step), c // 2
    pad = {"valid": 0, "ignore_borders": 0, "half": c // 2, "full": c - 1}[mode]
    span = length + 2 * pad - c
    if length < c or (mode != "ignore_borders" and span % step != 0):
        raise ValueError(f"images2neibs: neib_shape[{which}] = {c}, neib_step[{which}] = "
                         f"{step} and the image length {length} are not consistent in mode "
                         f"{mode!r}: (length + {2 * pad} - {c}) must be a non-negative "
                         f"multiple of the step" + ("" if length >= c else
                                                    " (the window is larger than the image)"))
    return span // step + 1, pad


def _axis_index(length: int, c: int, step: int, mode: str, which: str) -> np.ndarray:
    """(windows, c) indices into an axis of `length` pixels that window w reads at offset i;
    -1 where it reads a padding zero. Checks the mode's conditions."""
    grid, pad = _axis_grid(length, c, step, mode, which)
    pos = np.arange(grid)[:, None] * step + np.arange(c)[None, :] - pad
    if mode == "wrap_centered":
        return pos % length
    return np.where((pos >= 0) & (pos < length), pos, -1)


def _window_pairs(neib_shape: np.ndarray, neib_step: np.ndarray) -> tuple[tuple, tuple]:
    """((c, d), (sx, sy)) as ints, from the runtime values (checked)."""
    for name, v in (("neib_shape", neib_shape), ("neib_step", neib_step)):
        if np.shape(v) != (2,):
            raise ValueError(f"images2neibs: {name} must hold two integers, got {v!r}")
        if v[0] <= 0 or v[1] <= 0:
            raise ValueError(f"images2neibs: {name} must be positive, got {tuple(v)}")
    return tuple(int(v) for v in neib_shape), tuple(int(v) for v in neib_step)


def _indices(shape: tuple, neib_shape: np.ndarray, neib_step: np.ndarray, mode: str) -> tuple:
    """(row index (gc, c), column index (gd, d)) of every window, from the runtime values."""
    (c, d), (sx, sy) = _window_pairs(neib_shape, neib_step)
    return (_axis_index(shape[2], c, sx, mode, "0"), _axis_index(shape[3], d, sy, mode, "1"))


def window_geometry(shape: tuple, neib_shape: Any, neib_step: Any,
                    mode: str) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """Per image axis (rows, columns) of images of `shape` (N, S, H, W): (window positions,
    window length, step, leading padding), from the runtime values of neib_shape and
    neib_step, with the mode's conditions checked (ValueError) as Images2Neibs checks them.
    What a kernel needs to compute images2neibs or its gradient (symgpu.gpu.ops.neighbours)."""
    _check_mode(mode, "window_geometry")
    (c, d), (sx, sy) = _window_pairs(np.asarray(neib_shape), np.asarray(neib_step))
    gc, px = _axis_grid(int(shape[2]), c, sx, mode, "0")
    gd, py = _axis_grid(int(shape[3]), d, sy, mode, "1")
    return (gc, c, sx, px), (gd, d, sy, py)


def _grid_len(length: Any, c: Any, step: Any, mode: str) -> Any:
    """The number of window positions along an axis, symbolically (infer_shape)."""
    if mode == "wrap_centered":  # ceil(length / step)
        return s_floordiv(s_sub(s_add(length, step), 1), step)
    span = {"valid": s_sub(length, c), "ignore_borders": s_sub(length, c),
            "half": s_sub(length, c % 2), "full": s_sub(s_add(length, c), 2)}[mode]
    return s_add(s_floordiv(span, step), 1)


class Images2Neibs(Op):
    """Windows of the last two axes of a 4-d tensor as rows of a matrix (see the module's
    docstring): inputs (ten4, neib_shape, neib_step), both integer pairs."""

    __props__ = ("mode",)

    def __init__(self, mode: str = "valid"):
        _check_mode(mode, "Images2Neibs")
        self.mode = mode

    def __str__(self) -> str:
        return f"Images2Neibs{{{self.mode}}}"

    def make_node(self, ten4: Any, neib_shape: Any, neib_step: Any = None) -> Apply:
        ten4 = as_tensor_variable(ten4)
        if ten4.ndim != 4:
            raise TypeError(f"images2neibs: ten4 must be a 4-d tensor (N, S, rows, columns), "
                            f"got {ten4} with {ten4.ndim} dimensions ({ten4.type})")
        neib_shape = _pair(neib_shape, "neib_shape", "images2neibs")
        neib_step = neib_shape if neib_step is None else _pair(neib_step, "neib_step",
                                                               "images2neibs")
        return Apply(self, [ten4, neib_shape, neib_step],
                     [TensorType(ten4.dtype, (False, False))()])

    def perform(self, node, inputs, output_storage):
        x, neib_shape, neib_step = inputs
        ri, ci = _indices(x.shape, neib_shape, neib_step, self.mode)
        # one zero row and column at the end: index -1 reads a padding zero
        xp = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)))
        win = xp[:, :, ri[:, None, :, None], ci[None, :, None, :]]  # (N, S, gc, gd, c, d)
        output_storage[0][0] = np.ascontiguousarray(
            win.reshape(-1, ri.shape[1] * ci.shape[1]), dtype=x.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        n, s, h, w = input_shapes[0]
        neib_shape, neib_step = node.inputs[1], node.inputs[2]
        c, d = as_dim(neib_shape[0]), as_dim(neib_shape[1])
        sx, sy = as_dim(neib_step[0]), as_dim(neib_step[1])
        gc, gd = _grid_len(h, c, sx, self.mode), _grid_len(w, d, sy, self.mode)
        return [(s_mul(s_mul(n, s), s_mul(gc, gd)), s_mul(c, d))]

    def connection_pattern(self, node):
        return [[True], [False], [False]]

    def grad(self, inputs, output_grads):
        x, neib_shape, neib_step = inputs
        if not is_float(x.dtype):
            return [None, None, None]
        return [Images2NeibsGrad(self.mode)(output_grads[0], x, neib_shape, neib_step),
                None, None]


class Images2NeibsGrad(Op):
    """The gradient of Images2Neibs: inputs (gz, ten4, neib_shape, neib_step); adds each
    row of gz back onto the pixels of ten4's shape that its window read (ten4 gives the
    shape only). Its own gradient is Images2Neibs of the incoming gradient."""

    __props__ = ("mode",)

    def __init__(self, mode: str = "valid"):
        _check_mode(mode, "Images2NeibsGrad")
        self.mode = mode

    def __str__(self) -> str:
        return f"Images2NeibsGrad{{{self.mode}}}"

    def make_node(self, gz: Any, ten4: Any, neib_shape: Any, neib_step: Any) -> Apply:
        gz, ten4 = as_tensor_variable(gz), as_tensor_variable(ten4)
        if gz.ndim != 2 or ten4.ndim != 4:
            raise TypeError(f"Images2NeibsGrad: gz must be a matrix and ten4 a 4-d tensor, "
                            f"got {gz} ({gz.type}) and {ten4} ({ten4.type})")
        neib_shape = _pair(neib_shape, "neib_shape", "Images2NeibsGrad")
        neib_step = _pair(neib_step, "neib_step", "Images2NeibsGrad")
        return Apply(self, [gz, ten4, neib_shape, neib_step],
                     [TensorType(gz.dtype, (False,) * 4)()])

    def perform(self, node, inputs, output_storage):
        gz, x, neib_shape, neib_step = inputs
        ri, ci = _indices(x.shape, neib_shape, neib_step, self.mode)
        n, s, h, w = x.shape
        want = (n * s * ri.shape[0] * ci.shape[0], ri.shape[1] * ci.shape[1])
        if gz.shape != want:
            raise ValueError(f"Images2NeibsGrad: gz has shape {gz.shape} (dtype {gz.dtype}); "
                             f"images of shape {x.shape} give windows of shape {want}")
        out = np.zeros((n, s, h + 1, w + 1), dtype=gz.dtype)
        np.add.at(out, (slice(None), slice(None), ri[:, None, :, None], ci[None, :, None, :]),
                  gz.reshape(n, s, ri.shape[0], ci.shape[0], ri.shape[1], ci.shape[1]))
        output_storage[0][0] = np.ascontiguousarray(out[:, :, :h, :w])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[1])]

    def connection_pattern(self, node):
        return [[True], [False], [False], [False]]

    def grad(self, inputs, output_grads):
        gz, x, neib_shape, neib_step = inputs
        if not is_float(gz.dtype):
            return [None] * 4
        return [Images2Neibs(self.mode)(output_grads[0], neib_shape, neib_step),
                None, None, None]


def images2neibs(ten4: Any, neib_shape: Any, neib_step: Any = None,
                 mode: str = "valid") -> TensorVariable:
    """The (rows, columns) windows of the 4-d tensor `ten4` (N, S, rows, columns) as rows of
    a (N * S * windows, rows * columns) matrix, `neib_step` apart (default `neib_shape`:
    disjoint windows); `mode` 'valid', 'ignore_borders', 'half', 'full' or 'wrap_centered'
    (see the module's docstring)."""
    return Images2Neibs(mode)(ten4, neib_shape, neib_step)


def neibs2images(neibs: Any, neib_shape: Any, original_shape: Any,
                 mode: str = "valid") -> TensorVariable:
    """The inverse of `images2neibs(ten4, neib_shape, mode=mode)` with disjoint windows (the
    default step): the 4-d tensor of shape `original_shape` whose windows are the rows of
    `neibs`. `mode` 'valid' (original_shape's last two lengths multiples of the window's) or
    'ignore_borders' (the pixels no window covered are zeros)."""
    if mode not in ("valid", "ignore_borders"):
        raise ValueError(f"neibs2images: mode must be 'valid' or 'ignore_borders' (the modes "
                         f"with disjoint windows that cover each pixel at most once), got "
                         f"{mode!r}")
    neibs = as_tensor_variable(neibs)
    if neibs.ndim != 2:
        raise TypeError(f"neibs2images: neibs must be a matrix (one window per row), got "
                        f"{neibs} ({neibs.type})")
    neib_shape = _pair(neib_shape, "neib_shape", "neibs2images")
    shp = as_tensor_variable(original_shape)
    if shp.ndim != 1 or not is_int(shp.dtype):
        raise TypeError(f"neibs2images: original_shape must be four integers, got {shp} "
                        f"({shp.type})")
    n, s, h, w = (as_dim(shp[i]) for i in range(4))
    c, d = as_dim(neib_shape[0]), as_dim(neib_shape[1])
    gc, gd = h // c, w // d
    win = reshape(neibs, stack([n, s, gc, gd, c, d]), ndim=6)
    img = reshape(win.dimshuffle(0, 1, 2, 4, 3, 5), stack([n, s, gc * c, gd * d]), ndim=4)
    if mode == "valid":
        return reshape(img, stack([n, s, h, w]), ndim=4)
    img = concatenate([img, zeros(stack([n, s, h - gc * c, gd * d]), dtype=neibs.dtype)],
                      axis=2)
    return concatenate([img, zeros(stack([n, s, h, w - gd * d]), dtype=neibs.dtype)], axis=3)
