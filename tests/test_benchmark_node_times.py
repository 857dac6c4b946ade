"""benchmarks/node_times.py (a step's memory-bound nodes timed alone on the GPU) cannot rot
unseen: its bytes, operand patterns and report are checked here; the timing itself needs
the GPU machine."""
import os
import sys

import numpy as np

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import node_times  # noqa: E402


def test_bytes_count_each_array_once_and_skip_empty_cells():
    arrays = [np.zeros((8, 1024, 768), "float32"), np.zeros((1, 1, 768), "float32"), None,
              np.zeros((8, 1024, 768), np.dtype("float16"))]
    assert node_times.operand_bytes(arrays) == 8 * 1024 * 768 * 6 + 768 * 4


def test_patterns_name_dtype_and_broadcasts():
    import symgpu.tensor as T
    assert node_times.pattern(T.tensor3("x", dtype="float32")) == "f32:nnn"
    row = T.TensorType("float16", (True, True, False))()
    assert node_times.pattern(row) == "f16:11n"


def test_report_sorts_and_totals_each_kind(capsys):
    rows = [{"index": 3, "kind": "GpuElemwise", "us": 10.0, "bytes": 30_000_000,
             "operands": "f32:nnn", "op": "GpuElemwise{add}"},
            {"index": 7, "kind": "GpuCAReduce", "us": 20.0, "bytes": 20_000_000,
             "operands": "bf16:nnn", "op": "GpuCAReduce{add}{0,1}"},
            {"index": 9, "kind": "GpuElemwise", "us": 30.0, "bytes": 90_000_000,
             "operands": "f32:nn1 f32:nnn", "op": "GpuElemwise{mul}"}]
    node_times.report(rows, sort=True)
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split()[0]) for line in lines[1:4]] == [9, 7, 3]    # slowest first
    assert "3.00" in lines[1]                                               # 90 MB in 30 us
    assert "total GpuElemwise: 2 nodes, 40.0 us, 120.0 MB, 3.00 TB/s" in lines
    assert "total GpuCAReduce: 1 nodes, 20.0 us, 20.0 MB, 1.00 TB/s" in lines
