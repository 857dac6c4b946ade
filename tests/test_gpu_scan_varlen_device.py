"""On the GPU machine: a masked recurrent loop called with a new length every call (issue
32) runs as chunk graphs whose copies come from copy tables, replays them for lengths never
seen, and matches NumPy on every call (the fake-driver tests: tests/test_gpu_scan_graph.py)."""
from __future__ import annotations

import numpy as np
import pytest

from gpu_helpers import requires_gpu


@requires_gpu
def test_gpu_a_new_length_every_call_replays_table_chunk_graphs(cuda):
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.exec import scan_graph
    from symgpu.gpu.ops.scan_op import GpuScan
    rng = np.random.RandomState(0)
    H, B = 8, 4
    W = symgpu.shared(rng.randn(H, H).astype("float32") * 0.3, name="W")
    U = symgpu.shared(rng.randn(H, H).astype("float32") * 0.3, name="U")
    x, m = T.tensor3("x"), T.matrix("m")

    def stepf(x_t, m_t, h):
        new = T.tanh(T.dot(x_t, W) + T.dot(h, U))
        return m_t[:, None] * new + (1 - m_t[:, None]) * h
    hs, _ = symgpu.scan(stepf, sequences=[x, m], outputs_info=T.zeros((B, H)))
    f = symgpu.function([x, m], [hs, T.grad(hs[-1].sum(), W)])
    scans = [n for n in f.maker.fgraph.apply_nodes if isinstance(n.op, GpuScan)]
    assert scans, "the loop runs on the GPU"
    Wv, Uv = W.get_value(), U.get_value()
    before = dict(scan_graph.STATS)
    lengths = [7, 19, 33, 12, 50, 3, 41, 26, 9, 60, 17, 38, 5, 22]
    captures_at = {}
    for call, n in enumerate(lengths):
        xv = rng.randn(n, B, H).astype("float32")
        mv = (rng.rand(n, B) < 0.8).astype("float32")
        got_h, got_g = f(xv, mv)
        h, want = np.zeros((B, H), "float32"), []
        for t in range(n):
            new = np.tanh(xv[t] @ Wv + h @ Uv)
            h = mv[t][:, None] * new + (1 - mv[t][:, None]) * h
            want.append(h)
        np.testing.assert_allclose(got_h, np.array(want), rtol=2e-4, atol=2e-5)
        assert np.all(np.isfinite(np.asarray(got_g))) and got_g.shape == (H, H)
        captures_at[call] = scan_graph.STATS["captures"]
    lg = scans[0].op.loop_graphs
    assert lg.chunking and lg.disabled is None
    assert scan_graph.STATS["chunks"] > before.get("chunks", 0)
    tables = [g for g in lg.graphs.values() if g is not None and g.table is not None]
    assert tables, "chunk graphs copy through their tables"
    # the first chunked call (the 4th length) warmed every chunk length up to 33 (32 ... 1):
    # the last calls' new lengths, up to 60, capture nothing
    assert captures_at[len(lengths) - 1] == captures_at[5]


@requires_gpu
def test_gpu_table_copy_kernel_copies_what_the_table_names(cuda):
    from symgpu.gpu.runtime import graph_params as gp
    from symgpu.gpu.runtime.array import GpuArray
    src = (np.arange(5000) % 251).astype(np.uint8)
    s = GpuArray((5000,), "uint8", cuda)
    s.set(src)
    d = GpuArray((5000,), "uint8", cuda)
    d.set(np.full(5000, 7, np.uint8))
    cases = [(0, 0, 2048), (3001, 5, 999), (2100, 16, 0)]
    flat = [v for dd, ss, n in cases for v in (d.ptr + dd, s.ptr + ss, n)]
    raw = np.frombuffer(gp.pack_table(flat), np.uint8).copy()
    t = GpuArray((raw.size,), "uint8", cuda)
    t.set(raw)
    gp.table_copy(cuda, t.ptr, len(cases), 2048)
    want = np.full(5000, 7, np.uint8)
    for dd, ss, n in cases:
        want[dd:dd + n] = src[ss:ss + n]
    np.testing.assert_array_equal(d.get(), want)
