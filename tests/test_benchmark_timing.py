"""benchmarks/timing.py's checkout alternation (cpu_overhead.py and gpu_call_overhead.py
--against): each checkout's children run with its own root on the path, the best of each key
is kept, and a failing child says why."""
import os
import sys
import textwrap

import pytest

# appended, not first: benchmarks/random.py must not shadow the standard library's random
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
from timing import alternate_checkouts, report_checkouts  # noqa: E402


def test_children_run_with_each_checkouts_root_and_the_best_is_kept(tmp_path, capsys):
    roots = []
    for name, base in (("a", 1.0), ("b", 3.0)):
        root = tmp_path / name
        root.mkdir()
        (root / "which.py").write_text(f"BASE = {base}\n")
        roots.append(str(root))
    runs = tmp_path / "runs"
    runs.mkdir()
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        import which                      # found through PYTHONPATH: this checkout's
        n = len(os.listdir({str(runs)!r}))
        open(os.path.join({str(runs)!r}, str(n)), "w").close()
        assert sys.argv[1:] == ["--child", "--x"]
        print("noise")
        print(json.dumps({{"t": which.BASE + n}}))
    """))
    best = alternate_checkouts(str(script), roots[0], roots[1], rounds=3, child_args=["--x"])
    # runs in the order a, b, b, a, a, b: a got n = 0, 3, 4 and b got 1, 2, 5
    assert best == {roots[0]: {"t": 1.0}, roots[1]: {"t": 4.0}}
    report_checkouts(best, roots[0], roots[1], [("t row", "t"), ("missing", "u")], "head")
    out = capsys.readouterr().out
    assert "0.250x" in out and "not measured" in out


def test_a_failing_child_names_the_checkout_and_its_error(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("raise SystemExit('no GPU here')\n")
    with pytest.raises(RuntimeError, match="no GPU here") as info:
        alternate_checkouts(str(script), str(tmp_path), str(tmp_path), 1, [])
    assert str(tmp_path) in str(info.value)


def test_children_keep_the_path_they_were_given_after_their_checkout(tmp_path, monkeypatch):
    """On the GPU machine PyCUDA is installed with --target into a directory on PYTHONPATH:
    a child that lost it found no GPU."""
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "extra_mod.py").write_text("VALUE = 7\n")
    script = tmp_path / "child.py"
    script.write_text("import json, extra_mod\nprint(json.dumps({'v': extra_mod.VALUE}))\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "extra"))
    best = alternate_checkouts(str(script), str(tmp_path), str(tmp_path), 1, [])
    assert best[str(tmp_path)] == {"v": 7}


def test_gpu_test_shards_deal_every_test_once_in_order():
    from shard_tests import deal
    ids = [f"tests/t{f}.py::test_{k}" for f in range(3) for k in range(5)]
    shards = deal(ids, 4)
    assert sorted(t for s in shards for t in s) == sorted(ids)
    assert all(s == sorted(s, key=ids.index) for s in shards)
    assert [len(s) for s in shards] == [4, 4, 4, 3] and deal(ids[:2], 4) == [ids[:1], ids[1:2]]


def test_gpu_test_shards_with_known_seconds_end_together():
    """Longest first onto the least loaded shard; each shard keeps collection order; a test
    without a known time counts as the median."""
    from shard_tests import deal, durations
    ids = [f"tests/t.py::test_{k}" for k in range(6)]
    secs = {ids[0]: 10.0, ids[1]: 1.0, ids[2]: 1.0, ids[3]: 4.0, ids[4]: 5.0}
    shards = deal(ids, 2, secs)
    assert sorted(t for s in shards for t in s) == sorted(ids)
    assert all(s == sorted(s, key=ids.index) for s in shards)
    loads = [sum(secs.get(t, 4.0) for t in s) for s in shards]
    assert sorted(loads) == [12.0, 13.0], (shards, loads)   # {10, 1, 1} against {5, 4, 4}
    log = ["=== slowest durations ===", "3.50s call     tests/t.py::test_0",
           "0.25s setup    tests/t.py::test_0", "1.00s teardown tests/t.py::test_1",
           "(12 durations < 0.005s hidden.)"]
    assert durations(log) == {ids[0]: 3.75, ids[1]: 1.0}


def test_gpu_test_shards_spread_over_the_gpus_unless_the_devices_were_chosen():
    from shard_tests import shard_env
    assert [shard_env(k, 2, {})["CUDA_VISIBLE_DEVICES"] for k in range(4)] == ["0", "1", "0", "1"]
    assert "CUDA_VISIBLE_DEVICES" not in shard_env(3, 1, {"A": "b"})
    assert shard_env(1, 2, {"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"] == "1"
