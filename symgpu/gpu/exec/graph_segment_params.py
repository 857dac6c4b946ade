"""A segment's graph parameters (graph_params.py): the key parts and slot bytes of its
parameter nodes per call, the layouts of the arrays it computes that some of them read, and
the upload into its parameter block.

Why apart from graph_segment.py: the parameter rules (which node reads what, learnt when)
are read together, and the segment's per-call path only asks for a key and an upload.
"""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.gpu.exec.graph_plan import Unkeyable
from symgpu.gpu.runtime.graph_params import layout_stand_in

__all__ = ["SegmentParams", "MAX_LAYOUTS"]

#: layouts a segment keeps (one per key and parameter node reading an array it computes)
MAX_LAYOUTS = 512


class SegmentParams:
    """The parameter half of :class:`~symgpu.gpu.exec.graph_segment.Segment`."""

    runner: Any
    ctx: Any

    def _init_params(self, param_thunks: Sequence[Any], param_inner: Sequence[bool]) -> None:
        #: nodes reading host scalars from the parameter block when captured (graph_params.py)
        self.param_thunks = list(param_thunks)
        self.param_offsets: list[int] = []
        size = 0
        for t in self.param_thunks:
            self.param_offsets.append(size)
            size += int(t.param_nbytes)
        self.param_size = size
        #: parameter nodes reading an array the segment computes (param_layout_input): their
        #: parameters come from a stand-in of its layout, the one seen under the same key
        #: and the same earlier parameters (``layouts``); a key not seen so yet runs plainly
        #: and learns it (``_learn_layouts``)
        self.param_inner = [bool(f) for f in param_inner] or [False] * len(self.param_thunks)
        for t, inner in zip(self.param_thunks, self.param_inner):
            if inner:
                t.keep_layout = True
        if any(self.param_inner):   # the per-call key, chosen once (the common case: none)
            self._param_key = self._layout_param_key
        self.layouts: dict[tuple, Any] = {}
        self.learning: tuple | None = None
        self.param_block: Any = None     # a pool block, taken at the first capture
        self.params = b""                # this call's parameter bytes
        self.uploaded: bytes | None = None  # the bytes the block holds (its last upload)

    def _param_key(self, key: tuple) -> tuple:
        """The parameter nodes' key parts; their bytes go to ``self.params``.  (A segment with
        a node reading an array it computes has ``_layout_param_key`` in this place.)"""
        parts = []
        raws = []
        for t in self.param_thunks:
            part, raw = t.param_values()
            parts.append(part)
            raws.append(raw)
        return self._packed(parts, raws)

    def _layout_param_key(self, key: tuple) -> tuple:
        """``_param_key`` where a node reads an array the segment computes: it takes the
        layout seen under ``key`` and the parts before its own; where one was not seen yet,
        Unkeyable: the run is plain, and ``_learn_layouts`` keeps what its nodes saw
        (``learning``: the parts known before)."""
        parts: list = []
        raws = []
        missing = False
        for t, inner in zip(self.param_thunks, self.param_inner):
            if inner:
                stand_in = None if missing else self.layouts.get((key, tuple(parts)))
                if stand_in is None:
                    missing = True
                    parts.append(None)
                    continue
                part, raw = t.param_values(stand_in)
            else:
                part, raw = t.param_values()
            parts.append(part)
            raws.append(raw)
        if missing:
            self.learning = (key, parts)
            raise Unkeyable("the layout of an array the segment computes")
        return self._packed(parts, raws)

    def _packed(self, parts: list, raws: list) -> tuple:
        params = b"".join(raws)
        if len(params) != self.param_size:
            raise ValueError(f"parameter bytes: {len(params)}, slots: {self.param_size}")
        self.params = params
        return tuple(parts)

    def _learn_layouts(self) -> None:
        """After a plain run that could not key a parameter node reading an array the segment
        computes: keep a stand-in of the layout each such node saw, under the key and the
        parts before its own (all of them in one run: a node's part may follow from an
        earlier one's), so that the next call with that key is keyed."""
        key, parts = self.learning
        self.learning = None
        before: list = []
        for t, inner, part in zip(self.param_thunks, self.param_inner, parts):
            if inner:
                seen, t.seen_layout = t.seen_layout, None
                if seen is None:
                    return      # not run (an error before it)
                memo = (key, tuple(before))
                if memo not in self.layouts:
                    if len(self.layouts) >= MAX_LAYOUTS:
                        self.layouts.clear()
                    self.layouts[memo] = layout_stand_in(*seen[:4])
                part = seen[4]
            before.append(part)

    def _upload_params(self) -> None:
        """One stream-ordered host-to-device copy of this call's parameters, left out when
        the block holds them already (the last upload, earlier on the stream: a step whose
        parameters come from shapes alone uploads once per new set of shapes)."""
        if self.param_thunks and self.params != self.uploaded:
            self.runner.driver.upload(self.param_block.ptr, self.params, self.ctx.stream_handle)
            self.uploaded = self.params

