"""Theano's `tensor.nnet.conv3d2d.conv3d`: the 3-d convolution of movies laid out as
(batch, time, channel, row, column), through the N-d `conv3d` (so it lifts to cuDNN's N-d
convolution on the GPU like any 3-d convolution).

Theano built it from a 2-d convolution of every frame and a sum along a diagonal of the
(time, filter time) plane; the result is a true convolution (filters flipped in time, rows
and columns, as `scipy.ndimage.convolve`), summed over the channels. Here the axes are moved
to conv3d's (batch, channel, time, row, column) and back: the same values, one op.
"""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.tensor.nnet.abstract_conv import conv3d as _conv3d
from symgpu.tensor.type import as_tensor_variable

__all__ = ["conv3d"]

_MODES = ("valid", "full", "half")


def _pad(mode: str, k: Any, axis: str) -> int:
    if not isinstance(k, int):
        raise ValueError(f"conv3d2d.conv3d: border modes that differ between axes need the "
                         f"filter's {axis} length as an int in filters_shape, got {k!r}")
    return {"valid": 0, "full": k - 1, "half": k // 2}[mode]


def conv3d(signals: Any, filters: Any, signals_shape: Sequence | None = None,
           filters_shape: Sequence | None = None, border_mode: Any = "valid") -> Any:
    """Convolve spatio-temporal `filters` (Nf, Tf, C, Hf, Wf) with `signals` (Ns, Ts, C, Hs,
    Ws): (Ns, Tout, Nf, Hout, Wout). Filters are flipped (a true convolution).
    border_mode: 'valid', 'full' or 'half', or a (time, height, width) triple of them whose
    height and width agree (as Theano). signals_shape / filters_shape: optional 5-entry
    hints, checked at run time."""
    modes = (border_mode,) * 3 if isinstance(border_mode, str) else tuple(border_mode)
    if len(modes) != 3 or any(m not in _MODES for m in modes):
        raise ValueError(f"conv3d2d.conv3d: border_mode must be one of {_MODES} or a triple "
                         f"of them, got {border_mode!r}")
    if modes[1] != modes[2]:
        raise ValueError(f"conv3d2d.conv3d: height and width border modes must match, got "
                         f"{border_mode!r}")
    s, f = as_tensor_variable(signals), as_tensor_variable(filters)
    for v, what in ((s, "signals"), (f, "filters")):
        if v.ndim != 5:
            raise TypeError(f"conv3d2d.conv3d: {what} must be 5-d (batch/filters, time, "
                            f"channel, row, column), got {v.type}")
    if len(set(modes)) == 1:
        mode: Any = modes[0]
    else:
        kt, kh, kw = (filters_shape[1], filters_shape[3], filters_shape[4]) \
            if filters_shape is not None else (None, None, None)
        mode = (_pad(modes[0], kt, "time"), _pad(modes[1], kh, "height"),
                _pad(modes[2], kw, "width"))
    to_ncthw = (0, 2, 1, 3, 4)
    hint = lambda shp: None if shp is None else tuple(shp[i] for i in to_ncthw)  # noqa: E731
    out = _conv3d(s.dimshuffle(*to_ncthw), f.dimshuffle(*to_ncthw),
                  input_shape=hint(signals_shape), filter_shape=hint(filters_shape),
                  border_mode=mode, filter_flip=True)
    return out.dimshuffle(*to_ncthw)
