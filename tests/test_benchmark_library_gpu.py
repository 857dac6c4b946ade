"""benchmarks/library_gpu.py's smoke run (--quick --peers none --cpu): every row's symgpu
code path builds, runs, matches NumPy and reaches the Markdown table, so the GPU benchmark
cannot rot between runs on the GPU machine."""
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import library_gpu  # noqa: E402


def test_quick_cpu_run_times_and_checks_every_row(capsys):
    results = library_gpu.main(["--quick", "--peers", "none", "--cpu", "--rounds", "1",
                                "--block-ms", "1", "--row-budget", "2"])
    out = capsys.readouterr().out
    assert [r["row"] for r in results] == library_gpu.ROWS
    for r in results:
        assert "symgpu" in r["times"], r
        assert r["check"] == ("not run" if r["row"] == "cnn3d" else "ok (NumPy)"), r
    assert "NOT GPU figures" in out and "| row | symgpu |" in out
    assert "FAILED" not in out and "failed" not in out


def test_subsets_groups_and_peers_parse():
    args = library_gpu.parse(["--subset", "eigh,sort", "--peers", "torch,jax"])
    assert args.rows == ["eigh32", "eigh256", "eigh4096", "sort"]
    assert args.peer_list == ["torch", "jax"]
    assert library_gpu.parse([]).rows == library_gpu.ROWS
    assert library_gpu.parse(["--peers", "none"]).peer_list == []
