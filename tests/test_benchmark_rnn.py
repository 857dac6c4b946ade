"""benchmarks/rnn.py (issue 32's RNN matrix) runs, so that it cannot rot: the quick CPU run
of a few rows (symgpu alone where PyTensor, PyTorch and JAX are missing) whose losses match
the float64 reference, the row keys and seeded lengths every contender shares, and the
PASS/FAIL verdicts of the issue's criteria."""
import os
import sys

import numpy as np
import pytest

# appended, not first: benchmarks/random.py must not shadow the standard library's random
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import rnn  # noqa: E402
import rnn_cells as rc  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_flags():
    """The benchmark sets floatX for its run, as a script may: put it back for the tests
    that follow."""
    import symgpu
    with symgpu.config.change_flags(floatX=symgpu.config.floatX):
        yield


def test_quick_cpu_run_checks_every_row_against_the_reference(capsys):
    rows = ("lstm-masked-last-b16-h128-fixed,lstm-masked-last-b16-h128-var,"
            "gru-unmasked-all-*-h128-fixed")
    results = rnn.main(["--quick", "--device", "cpu", "--skip", "pytensor", "--subset", rows])
    out = capsys.readouterr().out
    keys = ["lstm-masked-last-b4-h8-fixed", "lstm-masked-last-b4-h8-var",
            "gru-unmasked-all-b4-h8-fixed"]
    assert list(results) == keys
    for key in keys:
        assert results[key]["check"] == "ok", out
        assert results[key]["times"]["symgpu"] > 0
    assert "| lstm-masked-last-b4-h8-var |" in out and "x | ok |" in out   # var/fixed ratio
    var = results["lstm-masked-last-b4-h8-var"]["times"]     # length 50 in the row's rounds
    assert set(var) == {"symgpu", "symgpu@fixed"}
    assert "symgpu scan (cpu), length 5 " in out and "4 blocks" in out
    assert "every contender's losses match the reference" in out and "PASS every" in out


def test_dropout_cell_draws_in_the_step_and_moves_its_generator_on():
    import symgpu
    import symgpu.tensor as T
    spec = rc.parse_key("droplstm-unmasked-all-b16-h128-fixed").shrunk()
    params, arrays = rc.init_params(spec), rc.data(spec)
    call, _, fn = rc.build_symbolic(symgpu, T, spec, params, arrays)
    clean = rc.numpy_loss(spec, params, *arrays, rc.calls(spec, 1)[0])
    first = float(call(spec.fixed, None))
    assert np.isfinite(first) and abs(first - clean) > 1e-7       # the draw changed the loss
    assert len(fn.maker.fgraph.outputs) > 1 + len(params)          # the generator's update too


def test_row_keys_globs_and_seeded_lengths():
    specs = rc.select("lstm-masked-*-b16-h128-var,gru-unmasked-last-b64-h512-fixed")
    assert [s.key for s in specs] == ["lstm-masked-last-b16-h128-var",
                                      "lstm-masked-all-b16-h128-var",
                                      "gru-unmasked-last-b64-h512-fixed"]
    assert len(rc.all_specs()) == 192
    with pytest.raises(SystemExit):
        rc.select("lstn-*")
    spec = specs[0]
    a, b = rc.calls(spec, 40), rc.calls(spec, 40)
    lengths = [L for L, _, _ in a]
    assert lengths == [L for L, _, _ in b] and len(set(lengths)) > 10
    assert min(lengths) >= 10 and max(lengths) <= 90
    for L, mask, lens in a:
        assert mask.shape == (L, 16) and lens.max() == L and lens.min() >= (L + 1) // 2
        assert (mask.sum(0) == lens).all()
    fixed = rc.calls(rc.parse_key("lstm-unmasked-last-b16-h128-fixed"), 3)
    assert all(L == 50 and m is None for L, m, _ in fixed)


def test_cudnn_gate_order_moves_the_candidate_block():
    spec = rc.parse_key("lstm-masked-last-b16-h128-fixed").shrunk()
    import rnn_peers
    H = spec.hidden
    row = np.repeat(np.arange(4.0), H)                     # blocks i, f, o, c of the tutorial
    assert list(rnn_peers._cudnn_order(spec, row)[::H]) == [0, 1, 3, 2]   # PyTorch: i, f, g, o


def _result(key, **times):
    return {"spec": rc.parse_key(key), "check": "ok", "times": times}


def test_criteria_pass_and_fail_per_row():
    results = {r["spec"].key: r for r in (
        _result("lstm-masked-last-b16-h128-fixed", **{"symgpu-tf32": 1.4, "cudnn": 1.0,
                                                       "jax": 1.5}),
        _result("lstm-masked-last-b16-h128-var", **{"symgpu-tf32": 1.6, "cudnn": 1.0,
                                                     "jax": 1.5}),
        _result("peephole-masked-last-b16-h128-fixed", **{"symgpu-tf32": 1.0, "jax": 2.0}),
        _result("elman-unmasked-all-b64-h512-fixed", **{"symgpu-tf32": 2.0, "jax": 2.0}))}
    lines = rnn.criteria(results, "cuda", quick=False)
    by = {ln.split(" ", 2)[2].split(":")[0]: ln.split(" ", 2)[1] for ln in lines}
    assert by["LSTM and GRU rows within 1.5x of cuDNN"] == "FAIL"      # the var row: 1.6x
    assert by["LSTM and GRU rows at or under JAX"] == "FAIL"
    assert by["peephole, layer-norm and dropout cells at or under JAX"] == "PASS"
    assert by["Elman ahead of JAX"] == "FAIL"                          # equal is not ahead
    assert by["a new length every call within 1.1x of length 50"] == "FAIL"   # 1.6 / 1.4
    table = rnn.table(results, "cuda")
    assert ("| lstm-masked-last-b16-h128-var | 1600.00 | 1000.00 | 1500.00 | 1.60x | 1.07x "
            "| 1.14x | ok |") in table
    side = dict(results)         # the var row's own length-50 calls, timed in its rounds
    side["lstm-masked-last-b16-h128-var"]["times"]["symgpu-tf32@fixed"] = 1.5
    lines = rnn.criteria(side, "cuda", quick=False)
    assert "- PASS a new length every call within 1.1x of length 50: worst 1.07x over 1 rows" \
        in lines                                                       # 1.6 / 1.5
    assert "  (against the fixed row's time, timed apart: lstm-masked-last-b16-h128-var 1.14x)" \
        in lines
    assert "| 1.07x | ok |" in rnn.table(side, "cuda")[-3]
    cpu = {CPU: _result(CPU, symgpu=0.5, pytensor=1.0) for CPU in [rnn.CPU_GOAL_ROW]}
    assert any(ln.startswith("- PASS CPU") for ln in rnn.criteria(cpu, "cpu", quick=False))


def test_the_cudnn_ratio_takes_the_faster_of_eager_and_the_graphed_step():
    """A peer written as its experts write it: the whole-step CUDA graph counts where it is
    faster than eager cuDNN (and eager where the graph could not be built)."""
    fast = _result("lstm-masked-last-b16-h128-fixed",
                   **{"symgpu-tf32": 1.2, "cudnn": 4.0, "cudnn-graph": 0.5, "jax": 2.0})
    eager_only = _result("gru-masked-last-b16-h128-fixed",
                         **{"symgpu-tf32": 1.2, "cudnn": 1.0, "jax": 2.0})
    assert rnn._ratio(fast["times"], "symgpu-tf32", rnn.CUDNN) == 1.2 / 0.5
    assert rnn._ratio(eager_only["times"], "symgpu-tf32", rnn.CUDNN) == 1.2
    lines = rnn.criteria({r["spec"].key: r for r in (fast, eager_only)}, "cuda", quick=False)
    assert any(ln.startswith("- FAIL LSTM and GRU rows within 1.5x of cuDNN") and "2.40x" in ln
               for ln in lines), lines
    assert any("cuDNN graph ms" in ln for ln in rnn.table({"k": fast}, "cuda"))


def test_per_call_times_say_where_a_block_spends(capsys):
    """--per-call: each timed call apart, its percentiles and the median by position in a
    block (the first call after another contender's block against the rest)."""
    summary = rnn.per_call_summary([0.004, 0.001, 0.001, 0.006, 0.001, 0.002], 3)
    assert summary.startswith("calls p10 1.000 p50 2.000 p90 6.000 ms")
    assert summary.endswith("by position in a block (median) 6.000, 1.000, 2.000 ms")
    rnn.main(["--quick", "--device", "cpu", "--skip", "pytensor", "--per-call",
              "--subset", "gru-unmasked-all-b16-h128-fixed"])
    assert "calls p10" in capsys.readouterr().out


def test_a_rows_time_is_the_mean_of_its_blocks_without_the_extremes():
    """A new length every call makes a block's time vary by design: the row's time is the
    mean of the blocks, the fastest and the slowest dropped (a stray slow block stays out),
    not their median (a draw of the lengths); with two blocks or fewer, their mean."""
    from timing import interleaved, trimmed_mean
    assert trimmed_mean([5.0, 1.0, 2.0, 3.0, 100.0]) == pytest.approx(10.0 / 3)
    assert trimmed_mean([2.0, 4.0]) == 3.0
    blocks: list = []
    ticks = iter(range(1000))
    interleaved([lambda: next(ticks)], 2, 4, blocks_out=blocks)
    assert len(blocks) == 1 and len(blocks[0]) == 4 and all(t > 0 for t in blocks[0])
