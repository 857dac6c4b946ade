"""Theano's own tests as a corpus (tools/theano_corpus.py): the tool's bookkeeping, and the
names Theano's tests import that symgpu now supplies (theano.compat, theano.change_flags,
theano.gof.opt.check_stack_trace, theano.compile.pfunc, theano.gof.null_type). Neither needs
Theano nor its checkout."""
from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.graph.fg import FunctionGraph

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import theano_corpus  # noqa: E402


def _theano(code: str) -> str:
    """Runs `code` in a fresh interpreter where ``theano`` is symgpu; its stdout."""
    prog = "import sys, symgpu\nsys.modules['theano'] = symgpu\n" + code
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# --- the tool's bookkeeping -------------------------------------------------------------------

def test_tally_counts_outcomes_and_groups_failures_by_first_line():
    records = [{"id": "", "outcome": "collected", "first": "5"},
               {"id": "f.py::a", "outcome": "passed", "first": ""},
               {"id": "f.py::b", "outcome": "failed", "first": "TypeError: at 0x7f12ab"},
               {"id": "f.py::c", "outcome": "failed", "first": "TypeError: at 0x99"},
               {"id": "f.py::d", "outcome": "skipped", "first": "no GPU"},
               {"id": "f.py::a", "outcome": "error", "first": "teardown broke"}]
    r = theano_corpus.tally("f.py", records)
    assert r["counts"] == {"collected": 5, "passed": 0, "failed": 3, "errors": 1,
                           "skipped": 1}
    # addresses blurred: the two TypeErrors are one group; the fifth test never reported
    assert r["groups"]["TypeError: at 0x…"] == 2
    assert r["groups"]["teardown broke"] == 1
    assert sum(r["groups"].values()) == 4
    assert any(k.startswith("never reported") for k in r["groups"])


def test_tally_counts_a_file_that_does_not_import_as_all_its_tests():
    records = [{"id": "t/test_x.py", "outcome": "error",
                "first": "ImportError: cannot import name 'foo'"},
               {"id": "", "outcome": "collected", "first": "0"}]
    r = theano_corpus.tally("test_x.py", records, expected=12)
    assert r["counts"]["collected"] == 12 and r["counts"]["errors"] == 12
    assert r["groups"] == {"ImportError: cannot import name 'foo'": 12}
    assert theano_corpus.rate(r["counts"]) == 0.0


def test_tally_counts_tests_cut_by_the_time_limit_as_the_timeout_group():
    records = [{"id": "", "outcome": "collected", "first": "3"},
               {"id": "f.py::a", "outcome": "passed", "first": ""}]
    r = theano_corpus.tally("f.py", records, timed_out=True, timeout=60)
    assert r["counts"]["passed"] == 1 and r["counts"]["failed"] == 2
    assert r["groups"] == {"timeout: the file passed its 60 s limit": 2}


def test_internals_groups_are_labelled_with_a_reason():
    assert "C back end" in theano_corpus.internals_reason(
        "AttributeError: module 'theano.gof.cc' has no attribute 'CLinker'")
    assert theano_corpus.internals_reason("AssertionError: arrays differ") is None


def test_without_a_checkout_the_tool_says_so_and_runs_nothing(tmp_path, capsys):
    assert theano_corpus.main(["--mirror", str(tmp_path / "none"), "--no-save"]) == 0
    assert "no checkout of Theano" in capsys.readouterr().out


def test_summary_file_has_a_rate_per_module():
    text = (ROOT / "tools" / "theano_corpus_summary.txt").read_text()
    for module in theano_corpus.MODULES:
        assert any(line.startswith(module + " ") for line in text.splitlines()), module


# --- names Theano's tests import --------------------------------------------------------------

def test_compat_is_theanos_python3_helpers():
    from symgpu import compat
    assert compat.PY3 and compat.izip is zip and compat.imap is map
    assert compat.cmp(1, 2) == -1 and compat.cmp(2, 2) == 0 and compat.b("ab") == b"ab"
    assert compat.decode(b"x") == "x" and list(compat.decode_iter([b"a", b"b"])) == ["a", "b"]
    assert compat.exc_message(ValueError(KeyError("inner"))) == "inner"
    d = compat.DefaultOrderedDict(list)
    d["b"].append(1)
    d["a"].append(2)
    assert list(d) == ["b", "a"] and d["b"] == [1]
    again = pickle.loads(pickle.dumps(d))
    assert again == d and again.default_factory is list and list(again) == ["b", "a"]
    assert copy.copy(d).default_factory is list
    with pytest.raises(TypeError, match="callable"):
        compat.DefaultOrderedDict(3)
    with pytest.raises(KeyError):
        compat.DefaultOrderedDict()["missing"]


def test_theano_paths_the_tests_import():
    out = _theano(
        "from theano.compat import OrderedDict, izip, exc_message, PY3\n"
        "from theano import change_flags, config\n"
        "from theano.gof.opt import check_stack_trace\n"
        "from theano.gof.null_type import NullType\n"
        "from theano.compile.pfunc import pfunc, rebuild_collect_shared\n"
        "from theano.compile import pfunc as p2\n"
        "import theano.compile.pfunc as m\n"
        "print(callable(p2), callable(m), m.rebuild_collect_shared is rebuild_collect_shared)\n"
        "with change_flags(floatX='float32'):\n"
        "    print(config.floatX)\n"
        "print(config.floatX, NullType.__name__)\n")
    assert out.split() == ["True", "True", "True", "float32", "float64", "NullType"]


def test_check_stack_trace():
    from symgpu.graph.rewriting import check_stack_trace
    from symgpu.tensor.elemwise import Elemwise
    x = T.dvector("x")
    f = symgpu.function([x], T.exp(x) * 2)
    assert check_stack_trace(f) and check_stack_trace(f, ops_to_check="all")
    assert check_stack_trace(f, ops_to_check=Elemwise)
    assert check_stack_trace(f, ops_to_check=lambda node: True)
    # a node built without its trace (as a rewrite that forgot copy_stack_trace leaves it)
    y = T.log(x)
    y.owner.tag.trace = []
    for o in y.owner.outputs:
        o.tag.trace = []
    assert not check_stack_trace(FunctionGraph([x], [y], clone=False))
    with pytest.raises(ValueError, match="not in the graph"):
        check_stack_trace(f, ops_to_check=[T.nnet.sigmoid])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_stack_trace(f, ops_to_check=[T.nnet.sigmoid], bug_print="warn")
    assert caught
    with pytest.raises(ValueError, match="neither 'last' nor 'all'"):
        check_stack_trace(f, ops_to_check="first")
    with pytest.raises(ValueError, match="compiled function or a FunctionGraph"):
        check_stack_trace(3)


def test_pfunc_is_function_with_theanos_arguments():
    from symgpu.compile import pfunc
    a, b = T.dscalar("a"), T.dscalar("b")
    s = symgpu.shared(1.0)
    f = pfunc([a], a + s, updates={s: s + 1})
    assert f(1.0) == 2.0 and f(1.0) == 3.0
    # rebuild_strict=False: a given of another type (float32 for float64) goes in
    c = T.fscalar("c")
    g = pfunc([c, b], a * b, givens={a: c}, rebuild_strict=False)
    assert g(np.float32(2), 3.0) == 6.0
    with pytest.raises(TypeError, match="output_keys"):
        pfunc([a], a, output_keys=["x"])


def test_rebuild_collect_shared():
    from symgpu.compile import rebuild_collect_shared
    x, y = T.dvector("x"), T.dvector("y")
    s = symgpu.shared(np.ones(2), name="s")
    t = symgpu.shared(np.zeros(2), name="t")
    t.default_update = t + 1
    out = x * s + t
    ins, new, (clone_d, update_d, update_expr, shared) = rebuild_collect_shared(
        out, [x], replace={x: y}, updates={s: s * 2})
    assert ins == [y] and clone_d[x] is y and new is not out
    assert set(shared) == {s, t}
    assert set(update_d) == {s, t} and [v for v, _ in update_expr] == [s, t]
    value = symgpu.function([y], new)(np.array([1.0, 2.0]))
    assert np.allclose(value, [1.0, 2.0])
    # without default updates, and with the inputs copied
    ins, _, (_, update_d, _, _) = rebuild_collect_shared(out, [x], no_default_updates=True,
                                                         copy_inputs_over=False)
    assert update_d == {} and ins[0] is not x and ins[0].type == x.type
