"""debugprint (Theano's exact text form), pp formulas and pydotprint files.

GPU-looking ops are stand-ins defined here (the printers go by class name), so these tests
run without a GPU and without importing the GPU backend.
"""
import io
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import Apply, Op, function
from symgpu.compile.mode import Mode
from symgpu.printing import (GraphvizNotFoundWarning, char_from_number, debugprint, op_kind, pp,
                             pydotprint, register_pp)
from transfer_fakes import GpuElemwise, GpuFromHost, HostFromGpu

#: compile without rewrites so the compiled graphs (and their positions) are fixed here
NO_REWRITES = Mode("FAST_RUN").excluding_tags("fast_run", "fast_compile")


class Split2(Op):
    """Two outputs: the first and second halves of a vector."""
    __props__ = ()

    def make_node(self, x):
        return Apply(self, [x], [x.type(), x.type()])

    def perform(self, node, inputs, out):
        h = len(inputs[0]) // 2
        out[0][0], out[1][0] = inputs[0][:h].copy(), inputs[0][h:].copy()


def gpu_chain(x):
    return HostFromGpu()(GpuElemwise()(GpuFromHost()(x)))


# ----------------------------------------------------------------------------- debugprint

def test_char_ids_follow_theano():
    assert [char_from_number(n) for n in (0, 1, 25, 26, 27, 52)] == ["A", "B", "Z", "BA", "BB", "CA"]


def test_debugprint_variable_exact():
    x = T.dmatrix("x")
    assert debugprint(T.exp(x), file="str") == "Elemwise{exp,no_inplace} [id A] ''\n |x [id B]\n"


def test_debugprint_spec_example_for_a_variable():
    # Theano's layout: a last input's column closes, so a chain moves two columns a level
    x = T.fmatrix("x")
    text = debugprint(gpu_chain(x), file="str")
    assert text == ("HostFromGpu [id A] ''\n"
                    " |GpuElemwise{exp,no_inplace} [id B] ''\n"
                    "   |GpuFromHost [id C] ''\n"
                    "     |x [id D]\n")


def test_debugprint_layout_is_theanos():
    # Theano 1.0.5's output for its tutorial's logistic regression (printing_drawing), but
    # for the constants' dtypes (Theano: int8 TensorConstant{1}; symgpu: float64 1.0)
    x, w, b = T.dmatrix("x"), T.dvector("w"), T.dscalar("b")
    prediction = 1 / (1 + T.exp(-T.dot(x, w) - b)) > 0.5
    assert debugprint(prediction, file="str").splitlines() == [
        "Elemwise{gt,no_inplace} [id A] ''",
        " |Elemwise{true_div,no_inplace} [id B] ''",
        " | |InplaceDimShuffle{x} [id C] ''",
        " | | |TensorConstant{1.0} [id D]",
        " | |Elemwise{add,no_inplace} [id E] ''",
        " |   |InplaceDimShuffle{x} [id F] ''",
        " |   | |TensorConstant{1.0} [id D]",
        " |   |Elemwise{exp,no_inplace} [id G] ''",
        " |     |Elemwise{sub,no_inplace} [id H] ''",
        " |       |Elemwise{neg,no_inplace} [id I] ''",
        " |       | |dot [id J] ''",
        " |       |   |x [id K]",
        " |       |   |w [id L]",
        " |       |InplaceDimShuffle{x} [id M] ''",
        " |         |b [id N]",
        " |InplaceDimShuffle{x} [id O] ''",
        "   |TensorConstant{0.5} [id P]"]


def test_debugprint_compiled_function_has_toposort_positions():
    x = T.fmatrix("x")
    f = function([x], gpu_chain(x), mode=NO_REWRITES)
    text = debugprint(f, file="str")
    assert text == ("HostFromGpu [id A] ''   2\n"
                    " |GpuElemwise{exp,no_inplace} [id B] ''   1\n"
                    "   |GpuFromHost [id C] ''   0\n"
                    "     |x [id D]\n")
    # a FunctionGraph prints the same way
    assert debugprint(f.maker.fgraph, file="str") == text


def test_debugprint_repeated_node_printed_once_then_referenced():
    x = T.dmatrix("x")
    e = T.exp(x)
    e.name = "e"
    text = debugprint(e * e, file="str")
    assert text == ("Elemwise{mul,no_inplace} [id A] ''\n"
                    " |Elemwise{exp,no_inplace} [id B] 'e'\n"
                    " | |x [id C]\n"
                    " |Elemwise{exp,no_inplace} [id B] 'e'\n")


def test_debugprint_several_outputs_share_ids():
    x, y = T.dvector("x"), T.dvector("y")
    s = x + y
    text = debugprint([s, s * y], file="str")
    assert text == ("Elemwise{add,no_inplace} [id A] ''\n"
                    " |x [id B]\n"
                    " |y [id C]\n"
                    "Elemwise{mul,no_inplace} [id D] ''\n"
                    " |Elemwise{add,no_inplace} [id A] ''\n"
                    " |y [id C]\n")


def test_debugprint_multi_output_node_and_apply():
    x = T.dvector("x")
    a, b = Split2()(x)
    text = debugprint([a, b], file="str")
    assert text == "Split2.0 [id A] ''\n |x [id B]\nSplit2.1 [id A] ''\n"
    assert debugprint(a.owner, file="str") == text


def test_debugprint_print_type_and_shape():
    x = T.dmatrix("x")
    text = debugprint(T.exp(x), file="str", print_type=True)
    assert text == ("Elemwise{exp,no_inplace} [id A] <TensorType(float64, matrix)> ''\n"
                    " |x [id B] <TensorType(float64, matrix)>\n")
    r = T.drow("r")
    text = debugprint(r, file="str", print_shape=True)
    assert text == "r [id A] shape=(1, None)\n"


def test_debugprint_ids_modes_and_stop_on_name():
    x = T.dvector("x")
    e = T.exp(x)
    e.name = "e"
    out = e + 1
    assert debugprint(out, file="str", ids="int") == (
        "Elemwise{add,no_inplace} [id 0] ''\n |Elemwise{exp,no_inplace} [id 1] 'e'\n"
        " | |x [id 2]\n |InplaceDimShuffle{x} [id 3] ''\n   |TensorConstant{1.0} [id 4]\n")
    # Theano's spacing without an id: two blanks
    assert debugprint(out, file="str", ids="").splitlines()[1] == " |Elemwise{exp,no_inplace}  'e'"
    assert f"[id {id(x)}]" in debugprint(e, file="str", ids="id")
    stopped = debugprint(out, file="str", stop_on_name=True)
    assert " |Elemwise{exp,no_inplace} [id B] 'e'\n |InplaceDimShuffle" in stopped
    assert "x [id" not in stopped
    with pytest.raises(ValueError, match="ids"):
        debugprint(out, ids="hex")


def test_debugprint_depth_limits_levels():
    x = T.fmatrix("x")
    assert debugprint(gpu_chain(x), file="str", depth=2) == (
        "HostFromGpu [id A] ''\n |GpuElemwise{exp,no_inplace} [id B] ''\n")


def test_debugprint_returns_file_and_defaults_to_stdout(capsys):
    x = T.dvector("x")
    buf = io.StringIO()
    assert debugprint(x, file=buf) is buf
    assert buf.getvalue() == "x [id A]\n"
    # Theano returns None by default: an interpreter (or a doctest) echoes nothing after it
    assert debugprint(x) is None
    assert capsys.readouterr().out == "x [id A]\n"


def test_debugprint_rejects_other_objects():
    with pytest.raises(TypeError, match="debugprint"):
        debugprint(42)


def test_debugprint_constant_and_inplace_destroy_map():
    x = T.dvector("x")
    text = debugprint(x * 2, file="str", print_view_map=True)
    assert "TensorConstant{2.0} [id" in text
    assert "InplaceDimShuffle{x} [id C] ''  v={0: [0]}" in text   # Theano's spacing


def test_runtime_error_with_high_verbosity_shows_debugprint():
    x, y = T.dmatrix("x"), T.dmatrix("y")
    f = function([x, y], T.dot(x, y), mode=NO_REWRITES)
    with symgpu.config.change_flags(exception_verbosity="high"):
        with pytest.raises(ValueError) as info:
            f(np.ones((2, 3)), np.ones((2, 3)))
    assert "dot [id A] ''" in str(info.value)


# ----------------------------------------------------------------------------- pp

def test_pp_formulas():
    x, y = T.dmatrix("x"), T.dmatrix("y")
    v = T.dvector("v")
    assert pp(T.exp(x)) == "exp(x)"
    assert pp(x + y) == "(x + y)"
    assert pp(x.sum(axis=0)) == "sum(x, axis=[0])"
    assert pp(x.sum()) == "sum(x)"
    assert pp(x.max(axis=1)) == "max(x, axis=[1])"
    # Theano's text: + * - / // ** infix and parenthesised, other ops by name, constants
    # as TensorConstant{...}
    assert pp(-x) == "(-x)"
    assert pp((x + y) * 2) == "((x + y) * TensorConstant{2.0})"
    assert pp(x / y - x ** 2) == "((x / y) - (x ** TensorConstant{2.0}))"
    assert pp(x // y) == "(x // y)"
    assert pp(x > y) == "gt(x, y)"
    assert pp(x + v) == "(x + v)"          # broadcasting dimshuffle is implicit
    assert pp(x.T) == "x.T"
    assert pp(v.dimshuffle(0, "x")) == "DimShuffle{0, x}(v)"
    assert pp(T.dot(x, y)) == "(x \\dot y)"
    assert pp(T.maximum(x, y)) == "maximum(x, y)"
    assert pp(abs(x)) == "|x|"
    assert pp(T.fill(x, y)) == "fill(x, y)"
    assert pp(T.log(T.exp(x) + 1).sum(axis=1)) == \
        "sum(log((exp(x) + TensorConstant{1.0})), axis=[1])"
    alpha = T.dscalar("alpha")
    assert pp(alpha * x) == "(\\alpha * x)"   # Theano prints five Greek names as TeX


def test_pp_unnamed_inputs_lists_functions_and_custom_printers():
    x = T.dvector()
    assert pp(T.exp(x)) == "exp(<TensorType(float64, vector)>)"
    a, b = T.dvector("a"), T.dvector("b")
    assert pp([a + b, a * b]) == "(a + b)\n(a * b)"
    f = function([a, b], [a + b, T.exp(a)], mode=NO_REWRITES)
    assert pp(f) == "(a + b)\nexp(a)"
    first, second = Split2()(a)
    assert pp(second + first) == "(Split2.1(a) + Split2.0(a))"
    assert pp(gpu_chain(a)) == "HostFromGpu(GpuElemwise{exp,no_inplace}(GpuFromHost(a)))"
    register_pp(GpuFromHost, lambda op, node, args: f"to_gpu({args[0]})")
    try:
        assert pp(GpuFromHost()(a)) == "to_gpu(a)"
    finally:
        from symgpu.printing import PP_PRINTERS
        PP_PRINTERS.pop(GpuFromHost)
    with pytest.raises(TypeError, match="op class"):
        register_pp("GpuFromHost", lambda op, node, args: "")


def test_pp_deep_graph_does_not_recurse():
    x = T.dvector("x")
    y = x
    for _ in range(3000):
        y = -y
    assert pp(y).endswith("x" + ")" * 3000) and pp(y).count("-") == 3000


# ----------------------------------------------------------------------------- pydotprint

def test_op_kind_by_declared_properties():
    x = T.fvector("x")
    up = GpuFromHost()(x)
    assert op_kind(up.owner) == op_kind(HostFromGpu()(up).owner) == "transfer"
    assert op_kind(gpu_chain(x).owner.inputs[0].owner) == "gpu"
    assert op_kind(T.exp(T.dvector()).owner) == "cpu"
    with pytest.raises(TypeError, match="a node"):
        op_kind(GpuFromHost())


def _no_dot(monkeypatch):
    import symgpu.printing as printing
    monkeypatch.setattr(printing.shutil, "which", lambda name: None)


def test_pydotprint_without_graphviz_writes_dot_and_warns(tmp_path, monkeypatch):
    _no_dot(monkeypatch)
    x = T.fmatrix("x")
    f = function([x], gpu_chain(x) * 2, mode=NO_REWRITES)
    target = tmp_path / "graph.png"
    with pytest.warns(GraphvizNotFoundWarning, match="dot.*not found"):
        written = pydotprint(f, outfile=str(target), format="png")
    assert written == str(tmp_path / "graph.dot")
    assert not target.exists()
    src = (tmp_path / "graph.dot").read_text()
    assert src.startswith("digraph G {") and src.rstrip().endswith("}")
    from symgpu.printing import DOT_COLORS

    def fill(label):
        line = next(l for l in src.splitlines() if f'label="{label}' in l)
        return line.split('fillcolor="')[1].split('"')[0]

    assert fill("GpuFromHost id=0") == fill("HostFromGpu id=2") == DOT_COLORS["transfer"]
    assert fill("GpuElemwise{exp,no_inplace} id=1") == DOT_COLORS["gpu"]
    assert fill("Elemwise{mul,no_inplace} id=4") == DOT_COLORS["cpu"]
    assert len({DOT_COLORS["cpu"], DOT_COLORS["gpu"], DOT_COLORS["transfer"]}) == 3
    assert src.count(" -> ") == 7  # 6 node inputs (3 transfers/gpu, mul 2, dimshuffle 1) + output


def test_pydotprint_dot_format_and_variables(tmp_path):
    x = T.dvector("x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # writing .dot never needs graphviz
        out = pydotprint(T.exp(x) + 1, outfile=str(tmp_path / "g.dot"), format="dot",
                         var_with_name_simple=True)
    text = Path(out).read_text()
    assert 'label="Elemwise{exp,no_inplace}"' in text and 'label="x"' in text


def test_pydotprint_default_outfile_in_compiledir(tmp_path, monkeypatch):
    _no_dot(monkeypatch)
    with symgpu.config.change_flags(compiledir=str(tmp_path / "cache")):
        with pytest.warns(GraphvizNotFoundWarning):
            out = pydotprint(T.exp(T.dvector("x")))
    assert out == str(tmp_path / "cache" / f"symgpu.pydotprint.{symgpu.config.device}.dot")
    assert os.path.exists(out)


def test_pydotprint_with_a_dot_program(tmp_path, monkeypatch):
    """The Graphviz path, with a stand-in `dot` that records its arguments."""
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\n" 'out=""; while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; '
                    'shift;; esac; shift; done\n' 'cat > "$out"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    import symgpu.printing as printing
    monkeypatch.setattr(printing.shutil, "which", lambda name: str(fake))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = pydotprint(T.exp(T.dvector("x")), outfile=str(tmp_path / "g.svg"))
    assert out == str(tmp_path / "g.svg")
    assert Path(out).read_text().startswith("digraph G {")
    assert not (tmp_path / "g.dot").exists()


@pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="Graphviz is not installed")
def test_pydotprint_real_graphviz(tmp_path):
    x = T.fmatrix("x")
    out = pydotprint(gpu_chain(x), outfile=str(tmp_path / "g.svg"), format="svg")
    assert "<svg" in open(out).read()
    out = pydotprint(gpu_chain(x), outfile=str(tmp_path / "g.png"), format="png")
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- pydotprint options
from symgpu.printing import (DOT_COLORS, EDGE_COLORS, GraphvizNotFoundError,  # noqa: E402
                             graph_to_dot)


def _node_line(src, label):
    return next(l for l in src.splitlines() if f'label="{label}' in l)


def test_dot_var_with_name_simple_and_theano_labels():
    x = T.dvector("x")
    y = T.exp(x) * 2.0
    full = graph_to_dot(y)
    assert 'label="name=x TensorType(float64, vector)"' in full
    assert 'label="val=2.0 TensorType(float64, scalar)"' in full
    simple = graph_to_dot(y, var_with_name_simple=True)
    assert 'label="x", shape=box' in simple and "name=x" not in simple


def test_dot_compact_keeps_named_intermediates_only():
    x = T.dvector("x")
    h = T.exp(x)
    h.name = "h"
    y = T.sin(T.cos(h))
    compact = graph_to_dot(y, var_with_name_simple=True)
    boxes = [l for l in compact.splitlines()
             if "shape=box" in l and not l.strip().startswith("out")]
    assert sum('label="h"' in l for l in boxes) == 1
    # the unnamed cos output is an edge label, not a box
    assert sum("TensorType(float64, vector)\", shape=box" in l for l in boxes) == 0
    assert 'label="TensorType(float64, vector)"]' in compact
    full = graph_to_dot(y, compact=False, var_with_name_simple=True)
    var_boxes = [l for l in full.splitlines()
                 if 'label="TensorType(float64, vector)", shape=box' in l]
    assert len(var_boxes) == 1  # cos's output now has its own box
    assert full.count(" -> ") == compact.count(" -> ") + 1


def test_dot_with_ids_numbers_a_variable_graph():
    x = T.dvector("x")
    y = T.sin(T.exp(x))
    assert " id=" not in graph_to_dot(y)
    src = graph_to_dot(y, with_ids=True)
    assert 'label="Elemwise{exp,no_inplace} id=0"' in src
    assert 'label="Elemwise{sin,no_inplace} id=1"' in src


def test_dot_high_contrast_and_color_codes():
    x = T.dvector("x")
    y = T.exp(x)
    filled = _node_line(graph_to_dot(y), "Elemwise{exp")
    assert f'style=filled, fillcolor="{DOT_COLORS["cpu"]}"' in filled
    border = graph_to_dot(y, high_contrast=False, colorCodes={"Elem": "yellow"})
    assert 'color="yellow"' in _node_line(border, "Elemwise{exp") and "fillcolor" not in border
    assert "node [fontname=\"Helvetica\", style=solid]" in border


def test_dot_view_and_destroy_edges():
    x = T.dvector("x")
    v = T.dvector("v")
    from symgpu.printing import Print
    from symgpu.tensor.elemwise import Elemwise
    from symgpu.scalar.basic import SCALAR_OPS
    src = graph_to_dot([Print("p")(x), Elemwise(SCALAR_OPS["exp"], {0: 0})(v)],
                       var_with_name_simple=True)
    ids = {l.split()[0]: l for l in src.splitlines() if "[label=" in l}
    xid = next(k for k, l in ids.items() if 'label="x"' in l)
    vid = next(k for k, l in ids.items() if 'label="v"' in l)
    assert any(l.strip().startswith(f"{xid} -> ") and f"color={EDGE_COLORS['view']}" in l
               for l in src.splitlines())
    assert any(l.strip().startswith(f"{vid} -> ") and f"color={EDGE_COLORS['destroy']}" in l
               for l in src.splitlines())


def test_dot_shared_variables_are_cyan():
    w = symgpu.shared(np.ones(2), "w")
    src = graph_to_dot(T.exp(w), var_with_name_simple=True)
    assert f'fillcolor="{DOT_COLORS["shared"]}"' in _node_line(src, "w")


def test_dot_gpu_contexts_get_their_own_colours():
    from symgpu.gpu.placement.rewriting import virtual_context
    with config_f32(), virtual_context("dev0", device="cuda0"), \
            virtual_context("dev1", device="cuda1"):
        x = T.fvector("x")
        f = function([x], [T.exp(x.transfer("dev0")).transfer("cpu"),
                           T.exp(x.transfer("dev1")).transfer("cpu")])
        src = graph_to_dot(f)
    gpu_fills = {l.split('fillcolor="')[1].split('"')[0] for l in src.splitlines()
                 if 'label="GpuElemwise' in l}
    assert len(gpu_fills) == 2 and DOT_COLORS["gpu"] in gpu_fills
    transfer_fills = {l.split('fillcolor="')[1].split('"')[0] for l in src.splitlines()
                      if 'label="GpuFromHost' in l or 'label="HostFromGpu' in l}
    assert transfer_fills == {DOT_COLORS["transfer"]}
    assert 'label="gpu op (dev0)"' in src and 'label="gpu op (dev1)"' in src


def config_f32():
    return symgpu.config.change_flags(floatX="float32")


def test_pydotprint_prints_the_output_file(tmp_path, capsys):
    out = pydotprint(T.exp(T.dvector("x")), outfile=str(tmp_path / "g.dot"))
    assert capsys.readouterr().out == f"The output file is available at {out}\n"
    pydotprint(T.exp(T.dvector("x")), outfile=str(tmp_path / "h.dot"), print_output_file=False)
    assert capsys.readouterr().out == ""


def test_pydotprint_format_from_the_outfile_extension(tmp_path, monkeypatch):
    _no_dot(monkeypatch)
    with pytest.warns(GraphvizNotFoundWarning, match=r"dot -Tpng"):
        written = pydotprint(T.exp(T.dvector("x")), outfile=str(tmp_path / "pic.png"),
                             var_with_name_simple=True, print_output_file=False)
    assert written == str(tmp_path / "pic.dot")


def test_pydotprint_return_image(tmp_path, monkeypatch):
    _no_dot(monkeypatch)
    y = T.exp(T.dvector("x"))
    src = pydotprint(y, format="dot", return_image=True)
    assert src == graph_to_dot(y)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(GraphvizNotFoundError, match="format='dot'"):
        pydotprint(y, format="png", return_image=True)


def test_pydotprint_return_image_with_a_dot_program(tmp_path, monkeypatch):
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho \"$1\"\ncat\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    import symgpu.printing as printing
    monkeypatch.setattr(printing.shutil, "which", lambda name: str(fake))
    img = pydotprint(T.exp(T.dvector("x")), format="svg", return_image=True)
    assert isinstance(img, bytes) and img.startswith(b"-Tsvg\ndigraph G {")


# ----------------------------------------------------------------------------- pp, optimizer_verbose

def test_symgpu_pp_is_printing_pp_and_reads_the_tutorial_example():
    assert symgpu.pp is pp
    x = T.dscalar("x")
    gy = symgpu.grad(x ** 2, x)
    # Theano's text but for the constants' dtypes (Theano: int8 TensorConstant{2}, a
    # Python int taking the smallest dtype; symgpu: x's float64, as NumPy 2)
    assert pp(gy) == ("((fill((x ** TensorConstant{2.0}), TensorConstant{1.0}) * "
                      "TensorConstant{2.0}) * (x ** (TensorConstant{2.0} - TensorConstant{1.0})))")
    f = function([x], gy)
    assert pp(f.maker.fgraph.outputs[0]) == "(TensorConstant{2.0} * x)"


def test_optimizer_verbose_prints_each_replacement(capsys):
    x = T.dvector("x")
    with symgpu.config.change_flags(optimizer_verbose=True):
        function([x], T.log(1 + T.exp(x)))
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(l.startswith("rewriting: rewrite ") for l in lines)
    soft = [l for l in lines if "softplus" in l.split(" with ")[-1]]
    assert soft and " replaces Elemwise{log,no_inplace}.0 of Elemwise{log,no_inplace}(" in soft[0]
    assert soft[0].endswith("of Elemwise{softplus,no_inplace}(x)")
    function([x], T.log(1 + T.exp(x)))
    assert capsys.readouterr().out == ""


def test_pp_indexing_reads_as_python():
    x = T.dmatrix("x")
    i = T.lscalar("i")
    v = T.lvector("v")
    assert pp(x[0]) == "x[0]"
    assert pp(x[1:3, ::2]) == "x[1:3, ::2]"
    assert pp(x[:, i:]) == "x[:, i:]"
    assert pp(x[None, 0]) == "x[None, 0]"
    assert pp(x[..., 0]) == "x[..., 0]"
    assert pp(x[i:i + 2:2]) == "x[i:(i + TensorConstant{2}):2]"
    assert pp(x[v, 1:]) == "x[v, 1:]"
    assert pp(x[[0, 1]]) == "x[TensorConstant{[0 1]}]"
    assert pp(T.set_subtensor(x[0], 1.0)) == "set_subtensor(x[0], TensorConstant{1.0})"
    assert pp(T.inc_subtensor(x[1:, i], 2.0)) == "inc_subtensor(x[1:, i], TensorConstant{2.0})"
    assert pp(x.reshape((3, -1))) == "reshape(x, TensorConstant{[ 3 -1]})"
    assert pp(x.shape) == "shape(x)"
    assert pp(T.join(0, x, x)) == "join(0, x, x)"


def test_dot_of_a_profiled_function_shows_node_times():
    from symgpu.compile.profiling import ProfileStats
    x = T.dvector("x")
    stats = ProfileStats(atexit_print=False)
    f = function([x], T.exp(x), profile=stats, mode=NO_REWRITES)
    f(np.ones(3))
    (node,) = f.maker.fgraph.toposort()
    stats.apply_time[node] = 0.25  # a known time, so the label is exact
    stats.fct_call_time = 1.0
    src = graph_to_dot(f)
    assert 'label="Elemwise{exp,no_inplace} id=0   (0.250s,25.000%)"' in src
    assert "%)" not in graph_to_dot(function([x], T.exp(x), mode=NO_REWRITES))


def test_makevector_and_arange_print_their_dtype_as_theano():
    # Theano's tutorial (shape_info) shows MakeVector{dtype='int64'}: __props__ values repr'd
    x = T.dmatrix("x")
    text = debugprint(function([x], (x ** 2).shape), file="str")
    assert text.startswith("MakeVector{dtype='int64'} [id A]")
    assert str(T.arange(T.lscalar("n")).owner.op) == "ARange{dtype='int64'}"


# ----------------------------------------------------------------------------- Theano's text

def test_constants_print_and_share_as_theano():
    # Theano 1.0.5's TensorConstant.__str__ and constant cache
    assert str(T.constant(2.0)) == "TensorConstant{2.0}"
    assert str(T.constant(np.ones(3))) == "TensorConstant{(3,) of 1.0}"
    assert str(T.constant(np.array([0.5]))) == "TensorConstant{(1,) of 0.5}"
    assert str(T.constant(np.arange(3))) == "TensorConstant{[0 1 2]}"
    assert str(T.constant(np.arange(30.0))) == "TensorConstant{[ 0.  1.  ... 28. 29.]}"
    assert T.constant(1.0) is T.constant(1.0) and T.constant(1) is not T.constant(1.0)
    assert T.constant(11.0) is not T.constant(11.0)          # outside [-10, 10]
    assert T.constant(1.0, name="one") is not T.constant(1.0)
    assert T.constant(1.0).name is None


def test_debugprint_shows_the_copy_of_an_output_as_deepcopyop():
    # Theano's tutorial (shape_info): the shape is a constant, which the function copies
    x = T.dmatrix()
    f = function([x], (T.specify_shape(x, (2, 2)) ** 2).shape)
    assert debugprint(f, file="str") == "DeepCopyOp [id A] ''   0\n |TensorConstant{(2,) of 2} [id B]\n"
    a, b = T.dvector("a"), T.dvector("b")
    g = function([a, b], [a, a + b], mode=NO_REWRITES)
    assert debugprint(g, file="str").splitlines() == [
        "DeepCopyOp [id A] 'a'   1", " |a [id B]",
        "Elemwise{add,no_inplace} [id C] ''   0", " |a [id B]", " |b [id D]"]
    # a variable graph has no copies
    assert "DeepCopyOp" not in debugprint([a, a + b], file="str")
    assert debugprint(g, file="str", depth=0) == ""
