"""Theano's gof.toolbox features (symgpu.graph.features) on small graphs."""
from __future__ import annotations

import pytest

import symgpu.tensor as T
from symgpu.graph.features import (AlreadyThere, Bookkeeper, History, NodeFinder,
                                   PrintListener, ReplaceValidate, Validator)
from symgpu.graph.fg import Feature, FunctionGraph
from symgpu.graph.rewriting.basic import InconsistencyError


def _graph():
    x, y = T.dvector("x"), T.dvector("y")
    return FunctionGraph([x, y], [T.exp(x) + T.log(y)])


def test_bookkeeper_replays_imports_and_prunes():
    seen = []

    class Recorder(Bookkeeper):
        def on_import(self, fgraph, node, reason):
            seen.append(("import", node, reason))

        def on_prune(self, fgraph, node, reason):
            seen.append(("prune", node, reason))

    fg = _graph()
    rec = Recorder()
    fg.attach_feature(rec)
    assert [s[1] for s in seen] == fg.toposort() and {s[2] for s in seen} == {"on_attach"}
    seen.clear()
    fg.remove_feature(rec)
    assert [s[1] for s in seen] == fg.toposort()
    assert {s[0] for s in seen} == {"prune"} and {s[2] for s in seen} == {"Bookkeeper.detach"}


def test_history_reverts_changes():
    fg = _graph()
    fg.attach_feature(History())
    x, y = fg.inputs
    add = fg.outputs[0].owner
    exp_out = add.inputs[0]
    chk = fg.checkpoint()
    before = [str(n) for n in fg.toposort()]
    fg.replace(exp_out, T.sin(x), reason="test")
    fg.replace(fg.outputs[0], fg.outputs[0] * 2, reason="test")
    assert fg.checkpoint() == chk + 2
    assert [str(n) for n in fg.toposort()] != before
    fg.revert(chk)
    assert fg.checkpoint() == chk
    assert [str(n) for n in fg.toposort()] == before
    assert fg.outputs[0].owner is add and add.inputs[0] is exp_out
    fg.check_integrity()
    with pytest.raises(AlreadyThere):
        fg.attach_feature(History())
    # detaching removes the methods
    h = [f for f in fg.features if isinstance(f, History)][0]
    fg.remove_feature(h)
    assert not hasattr(fg, "revert") and not hasattr(fg, "checkpoint")


class _NoSin(Feature):
    def validate(self, fgraph):
        if any("sin" in str(n.op) for n in fgraph.apply_nodes):
            raise InconsistencyError("no sin allowed")


def test_validator_consistent():
    fg = _graph()
    fg.attach_feature(Validator())
    fg.attach_feature(_NoSin())
    assert fg.consistent() is True
    fg.replace(fg.outputs[0].owner.inputs[0], T.sin(fg.inputs[0]))
    assert fg.consistent() is False


def test_replace_validate_undoes_refused_replacements():
    fg = _graph()
    fg.attach_feature(ReplaceValidate())
    fg.attach_feature(_NoSin())
    x = fg.inputs[0]
    exp_out = fg.outputs[0].owner.inputs[0]
    before = [str(n) for n in fg.toposort()]
    with pytest.raises(InconsistencyError):
        fg.replace_validate(exp_out, T.sin(x), reason="refused")
    assert [str(n) for n in fg.toposort()] == before
    assert fg.outputs[0].owner.inputs[0] is exp_out
    fg.replace_validate(exp_out, T.cos(x), reason="accepted")
    assert "cos" in str(fg.outputs[0].owner.inputs[0].owner.op)
    # several at once, and a remove list
    cos_out = fg.outputs[0].owner.inputs[0]
    fg.replace_all_validate([(cos_out, T.tanh(x))], reason="pair")
    assert "tanh" in str(fg.outputs[0].owner.inputs[0].owner.op)
    tanh_node = fg.outputs[0].owner.inputs[0].owner
    log_node = fg.outputs[0].owner.inputs[1].owner
    with pytest.raises(Exception, match="left"):
        fg.replace_all_validate_remove([(tanh_node.outputs[0], T.exp(x))], [log_node])
    assert fg.outputs[0].owner.inputs[0].owner is tanh_node  # undone
    fg.replace_all_validate_remove([(tanh_node.outputs[0], T.exp(x))], [tanh_node])
    assert tanh_node not in fg.apply_nodes
    fg.check_integrity()


def test_node_finder_tracks_ops():
    fg = _graph()
    nf = NodeFinder()
    fg.attach_feature(nf)
    exp_node = fg.outputs[0].owner.inputs[0].owner
    assert fg.get_nodes(exp_node.op) == [exp_node]
    new = T.exp(fg.inputs[1])
    fg.replace(fg.outputs[0].owner.inputs[1], new)
    found = fg.get_nodes(exp_node.op)
    assert set(found) == {exp_node, new.owner}
    assert all("log" not in str(op) for op in nf.d)  # the pruned log node left the index
    fg.replace(exp_node.outputs[0], fg.inputs[0])
    assert fg.get_nodes(exp_node.op) == [new.owner]
    with pytest.raises(AlreadyThere):
        _graph().attach_feature(nf)
    fg.remove_feature(nf)
    assert not hasattr(fg, "get_nodes") and nf.d == {}


def test_print_listener(capsys):
    fg = _graph()
    fg.attach_feature(PrintListener())
    fg.replace(fg.outputs[0].owner.inputs[0], T.sin(fg.inputs[0]))
    out = capsys.readouterr().out
    assert "-- attaching to: " in out and "-- importing: " in out
    assert "-- changing (" in out and "-- pruning: " in out
    quiet = _graph()
    quiet.attach_feature(PrintListener(active=False))
    quiet.replace(quiet.outputs[0].owner.inputs[0], T.sin(quiet.inputs[0]))
    assert capsys.readouterr().out == ""


def test_theano_path_gathers_the_features():
    import importlib
    import symgpu.theano_paths as tp
    assert "symgpu.graph.features" in tp.PATHS["symgpu.gof.toolbox"]
    mod = importlib.import_module("symgpu.gof.toolbox")
    assert mod.ReplaceValidate is ReplaceValidate and mod.NodeFinder is NodeFinder
