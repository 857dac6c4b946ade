"""The rewrite machinery: node/graph rewrites, the pass DB and its tags, the equilibrium
driver and its change tracking, merge, stack traces, validation and the modes."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.compile.mode import Mode, get_mode
from symgpu.graph.basic import Apply, Constant
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting import (DestroyHandler, EquilibriumRewriter, InconsistencyError,
                                    MergeRewriter, PassDB, RewriteGroup, graph_rewriter, in2out,
                                    node_rewriter, optdb, replace_validate, settings)
from symgpu.graph.rewriting.basic import apply_node_rewriter
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.rewriting.utils import ELEMWISE, ew_name


@pytest.fixture(autouse=True)
def _raise_on_rewrite_errors():
    old = settings.on_error
    settings.on_error = "raise"
    yield
    settings.on_error = old


def names(fn_or_fg):
    fg = fn_or_fg.maker.fgraph if hasattr(fn_or_fg, "maker") else fn_or_fg
    return [getattr(n.op, "scalar_op", n.op).__str__() if isinstance(n.op, Elemwise) else type(n.op).__name__
            for n in fg.toposort()]


# ----------------------------------------------------------------------------- node rewrites

@node_rewriter([Elemwise])
def exp_to_log(fgraph, node):
    if ew_name(node.outputs[0]) == "exp":
        return [ELEMWISE["log"](node.inputs[0])]
    return None


def test_node_rewriter_tracks_and_replaces():
    x = T.dvector("x")
    fg = FunctionGraph([x], [T.exp(x) + 1])
    assert exp_to_log.tracks_op(fg.outputs[0].owner.op)
    assert not exp_to_log.tracks_op(T.Shape())
    node = [n for n in fg.toposort() if ew_name(n.outputs[0]) == "exp"][0]
    assert apply_node_rewriter(fg, node, exp_to_log)
    assert "log" in names(fg) and "exp" not in names(fg)


def test_node_rewriter_dict_result_and_none_entries():
    x = T.dvector("x")
    fg = FunctionGraph([x], [T.exp(x)])

    @node_rewriter([Elemwise])
    def by_dict(fgraph, node):
        return {node.outputs[0]: ELEMWISE["sin"](node.inputs[0])}

    @node_rewriter([Elemwise])
    def keep(fgraph, node):
        return [None]

    node = fg.outputs[0].owner
    assert not apply_node_rewriter(fg, node, keep)
    assert apply_node_rewriter(fg, node, by_dict)
    assert names(fg) == ["sin"]


def test_type_changing_replacement_is_an_error_naming_the_rewrite():
    x = T.dvector("x")
    fg = FunctionGraph([x], [T.exp(x)])

    @node_rewriter([Elemwise])
    def bad(fgraph, node):
        return [T.cast(node.inputs[0], "float32")]

    with pytest.raises(TypeError, match="rewrite bad"):
        apply_node_rewriter(fg, fg.outputs[0].owner, bad)
    settings.on_error = "warn"
    with pytest.warns(RuntimeWarning, match="rewrite bad failed"):
        assert not apply_node_rewriter(fg, fg.outputs[0].owner, bad)
    assert names(fg) == ["exp"]


def test_replacement_keeps_the_users_creation_trace():
    x = T.dvector("x")
    y = T.log(1 + T.exp(x))  # <- the user's line
    line = y.owner.tag.trace[-1].lineno
    f = function([x], y)
    (node,) = f.maker.fgraph.toposort()
    assert "softplus" in str(node.op)
    assert node.tag.trace and node.tag.trace[-1].lineno == line
    assert node.tag.trace[-1].filename == __file__


def test_runtime_error_points_at_the_users_line():
    x, y = T.dmatrix("x"), T.dvector("y")
    z = T.dot(x, y) * 2  # <- the user's line
    line = z.owner.inputs[0].owner.tag.trace[-1].lineno
    f = function([x, y], z)
    with pytest.raises(ValueError) as info:
        f(np.ones((3, 4)), np.ones(5))
    assert f"line {line}" in str(info.value)


# ----------------------------------------------------------------------------- drivers

def test_equilibrium_reaches_a_fixed_point_and_revisits_only_changes():
    x = T.dvector("x")
    out = x
    for _ in range(30):
        out = T.sin(out)
    out = T.exp(out)
    fg = FunctionGraph([x], [out])
    seen = []

    @node_rewriter([Elemwise])
    def counting_exp_to_log(fgraph, node):
        seen.append(node)
        return exp_to_log.fn(fgraph, node)

    eq = EquilibriumRewriter([counting_exp_to_log])
    assert eq.apply(fg) == 1
    assert names(fg).count("log") == 1
    # first round: every node once (31); second round: only the new node and its clients
    assert len(seen) <= 31 + 3


def test_walking_rewriter_single_sweep():
    x = T.dvector("x")
    fg = FunctionGraph([x], [T.exp(T.exp(x))])
    assert in2out(exp_to_log).apply(fg) == 2
    assert names(fg) == ["log", "log"]


def test_graph_rewriter_decorator():
    calls = []

    @graph_rewriter
    def note(fgraph):
        calls.append(len(fgraph.apply_nodes))

    x = T.dvector("x")
    note(FunctionGraph([x], [x + 1]))
    assert calls == [2] and note.name == "note"  # the constant's DimShuffle and the add


def test_merge_common_subexpressions_and_constants():
    x = T.dvector("x")
    a = T.exp(x) + T.constant(np.float64(2))
    b = T.exp(x) + T.constant(np.float64(2))
    fg = FunctionGraph([x], [a, b])
    MergeRewriter().apply(fg)
    assert fg.outputs[0] is fg.outputs[1]
    assert len(fg.apply_nodes) == 3  # exp, DimShuffle of the constant, add


def test_replace_validate_undoes_a_rejected_replacement():
    x = T.dvector("x")
    y = T.exp(x)
    fg = FunctionGraph([x], [y * 2])
    fg.attach_feature(DestroyHandler())
    mul = fg.outputs[0].owner
    # an in-place exp over the graph input x is forbidden
    bad = Elemwise(ELEMWISE["exp"].scalar_op, {0: 0})(fg.inputs[0])
    with pytest.raises(InconsistencyError, match="input of the function"):
        replace_validate(fg, [(mul.inputs[0], bad)])
    assert fg.outputs[0].owner is mul and ew_name(mul.inputs[0]) == "exp"
    assert not any(n.op.destroy_map for n in fg.apply_nodes)


# ----------------------------------------------------------------------------- the DB

def test_pass_db_positions_tags_and_groups():
    db = PassDB()
    order = []
    db.register("late", lambda fg: order.append("late"), 50, "fast_run")
    db.register("early", lambda fg: order.append("early"), 1, "fast_run", "fast_compile")
    group = RewriteGroup("g")
    group.register(exp_to_log, "fast_run")
    db.register("g", group, 10, "fast_run", "fast_compile")
    assert [n for n, _ in db.query(["fast_run"])] == ["early", "g", "late"]
    assert [n for n, _ in db.query(["fast_compile"])] == ["early"]  # g has no fast_compile member
    assert [n for n, _ in db.query(["fast_run"], ["exp_to_log"])] == ["early", "late"]
    assert [n for n, _ in db.query(["fast_run"], ["late"])] == ["early", "g"]
    x = T.dvector("x")
    fg = FunctionGraph([x], [T.exp(x)])
    for _, p in db.query(["fast_run"]):
        p(fg)
    assert order == ["early", "late"] and names(fg) == ["log"]


def test_documented_positions():
    import symgpu.tensor.rewriting  # noqa: F401
    pos = {e.name: e.position for e in optdb.entries}
    assert pos["merge1"] < pos["canonicalize"] == 1 < pos["stabilize"] == 2 < pos["specialize"] == 3
    assert pos["specialize"] < pos["blas"] < 40 < pos["fusion"] == 49 < pos["inplace"] == 75
    assert pos["merge3"] == 100


def test_optimizer_excluding_flag_and_mode_tags():
    x = T.dvector("x")
    y = T.log(1 + T.exp(x))
    assert names(function([x], y)) == ["softplus"]
    with config.change_flags(optimizer_excluding="local_log1p_exp_to_softplus:local_log1p"):
        assert "softplus" not in names(function([x], y))
    m = Mode("FAST_RUN").excluding_tags("stabilize")
    assert "softplus" not in names(function([x], y, mode=m))


def test_fast_compile_runs_only_merge_and_constant_folding():
    passes = [n for n, _ in get_mode("FAST_COMPILE").passes()]
    assert "merge1" in passes and "canonicalize" in passes
    assert not {"blas", "fusion", "inplace"} & set(passes)
    group = optdb["canonicalize"].query(["fast_compile"])
    chosen = [r.name for r in group.rewriters]
    assert "constant_folding" in chosen
    assert not {"local_mul_canonizer", "local_add_canonizer", "local_fill_sink"} & set(chosen)
    x = T.dvector("x")
    f = function([x], x * (T.constant(2.0) + 3.0) + 0, mode="FAST_COMPILE")
    assert names(f).count("add") == 1 and "mul" in names(f)  # 2+3 folded, +0 kept
    np.testing.assert_allclose(f(np.arange(3.0)), np.arange(3.0) * 5)


def test_fast_compile_is_faster_to_compile_and_gives_the_same_values():
    x, y = T.dmatrix("x"), T.dvector("y")
    out = T.tanh(T.dot(x, y) * 2 + 1).sum()
    a = function([x, y], out)
    b = function([x, y], out, mode="FAST_COMPILE")
    xv, yv = np.random.RandomState(0).randn(3, 4), np.arange(4.0)
    np.testing.assert_allclose(a(xv, yv), b(xv, yv))


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="FAST_RUN"):
        Mode("FASTEST")


def test_optimizer_including_flag_turns_on_an_optional_rewrite():
    from symgpu.graph.rewriting.db import canonicalize

    @node_rewriter([Elemwise])
    def optional_sin_to_cos(fgraph, node):
        if ew_name(node.outputs[0]) == "sin":
            return [ELEMWISE["cos"](node.inputs[0])]
        return None

    canonicalize.register(optional_sin_to_cos, "my_optional_tag")  # not in fast_run
    try:
        x = T.dvector("x")
        assert names(function([x], T.sin(x))) == ["sin"]
        with config.change_flags(optimizer_including="my_optional_tag"):
            assert names(function([x], T.sin(x))) == ["cos"]
        assert names(function([x], T.sin(x), mode=Mode("FAST_RUN").including_tags("my_optional_tag"))) == ["cos"]
    finally:
        canonicalize.remove(optional_sin_to_cos)


def test_sweep_rewrites_each_node_once_and_keeps_its_trace():
    from symgpu.graph.rewriting import sweep
    x = T.dvector("x")
    fg = FunctionGraph([x], [T.exp(-x) + T.exp(x)], clone=True)

    def name(node):
        return ew_name(node.outputs[0])
    for n in fg.apply_nodes:
        if name(n) == "exp":
            n.tag.trace = ["made here"]

    def exp_as_expm1(fgraph, node):
        return [T.expm1(node.inputs[0]) + 1] if name(node) == "exp" else None

    assert sweep(fg, exp_as_expm1, "test") == 2
    names = [name(n) for n in fg.apply_nodes]
    assert "exp" not in names and names.count("expm1") == 2
    new = [n for n in fg.apply_nodes if name(n) == "add"
           and any(i.owner is not None and name(i.owner) == "expm1" for i in n.inputs)]
    assert len(new) == 2 and all(n.tag.trace == ["made here"] for n in new)
    assert sweep(fg, exp_as_expm1, "test") == 0      # nothing left to rewrite


def test_same_typed_outputs_declines_refused_or_retyped_replacements():
    from symgpu.graph.rewriting import same_typed_outputs
    x = T.fvector("x")
    node = T.exp(x).owner
    assert same_typed_outputs(node, lambda: [T.log(x)])[0].type == node.outputs[0].type
    assert same_typed_outputs(node, lambda: [T.cast(x, "float64")]) is None   # retyped

    def refuses():
        raise TypeError("inputs the op does not take")
    assert same_typed_outputs(node, refuses) is None
    with pytest.raises(KeyError):                     # anything else is a bug: it propagates
        same_typed_outputs(node, lambda: {}["missing"])
