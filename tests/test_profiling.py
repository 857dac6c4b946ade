"""The profiler: counts, times that add up, Theano's report sections, memory, GPU timer hook,
functions that raise, and the report printed at exit.

GPU-looking ops are stand-ins (the profiler classifies by class name), so no GPU is needed.
"""
import io
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import Apply, Op, function
from symgpu.compile import profiling
from symgpu.compile.function import Function
from symgpu.compile.mode import Mode
from symgpu.compile.profiling import ProfileStats, print_profiles_at_exit, register_node_timer
from transfer_fakes import GpuElemwise, GpuFromHost, HostFromGpu

NO_REWRITES = Mode("FAST_RUN").excluding_tags("fast_run", "fast_compile")


@pytest.fixture(autouse=True)
def _own_atexit_list(monkeypatch):
    """Profiles made by these tests are not printed when pytest exits."""
    monkeypatch.setattr(profiling, "_atexit_print_list", [])


def summary_text(stats, **kw):
    buf = io.StringIO()
    stats.summary(file=buf, **kw)
    return buf.getvalue()


def table(text, title):
    """The data rows of one table of a summary."""
    lines = text.splitlines()
    start = lines.index(title)
    rows = []
    for line in lines[start + 3:]:
        if not line.strip() or line.lstrip().startswith("..."):
            break
        if not line.startswith("    input") and not line.startswith("    output"):
            rows.append(line)
    return rows


def pct_columns(rows):
    return [(float(r.split()[0].rstrip("%")), float(r.split()[1].rstrip("%"))) for r in rows]


# ----------------------------------------------------------------------------- switching on/off

def test_profiling_off_leaves_function_untouched():
    x = T.dvector("x")
    f = function([x], T.exp(x))
    assert f.profile is None
    assert f.vm.profiler is None
    assert type(f) is Function
    g = function([x], T.exp(x), profile=False)
    assert g.profile is None and type(g) is Function


def test_profile_argument_and_flag():
    x = T.dvector("x")
    f = function([x], T.exp(x), profile=True, name="f")
    assert isinstance(f.profile, ProfileStats)
    assert isinstance(f, Function) and f.vm.profiler is not None
    assert f.profile.message == "f"
    with symgpu.config.change_flags(profile=True):
        g = function([x], T.exp(x))  # <- the message names this line
        h = function([x], T.exp(x), profile=False)
    assert isinstance(g.profile, ProfileStats) and h.profile is None
    assert g.profile.message.endswith(f"{os.path.basename(__file__)}:{_line_of('# <- the message names this line')}")
    assert g.profile in profiling._atexit_print_list and f.profile in profiling._atexit_print_list


def _line_of(snippet):
    with open(__file__) as fh:
        for n, line in enumerate(fh, 1):
            if snippet in line:
                return n
    raise AssertionError(snippet)


# ----------------------------------------------------------------------------- numbers

def test_counts_and_times_add_up():
    x, y = T.dmatrix("x"), T.dvector("y")
    e = T.exp(x) + y
    f = function([x, y], [e * 2, T.sum(x, axis=0)], profile=True, mode=NO_REWRITES)
    xv, yv = np.random.rand(50, 40), np.random.rand(40)
    for _ in range(7):
        f(xv, yv)
    p = f.profile
    assert p.fct_callcount == 7
    nodes = f.maker.fgraph.toposort()
    assert p.nb_nodes == len(nodes) == len(p.apply_callcount)
    assert all(p.apply_callcount[n] == 7 for n in nodes)
    assert all(p.apply_time[n] > 0 for n in nodes)
    assert 0 < p.thunk_time <= p.vm_call_time <= p.fct_call_time
    assert p.compile_time >= p.optimizer_time + p.linker_time > 0
    assert sum(p.class_time().values()) == pytest.approx(p.thunk_time)
    assert sum(p.op_time().values()) == pytest.approx(p.thunk_time)
    assert sum(p.kind_time().values()) == pytest.approx(p.thunk_time)
    assert p.apply_index == {n: i for i, n in enumerate(nodes)}
    # shapes of the last call are kept for the Apply table
    exp_node = next(n for n in nodes if str(n.op) == "Elemwise{exp,no_inplace}")
    assert p.variable_shape[exp_node.inputs[0]] == (50, 40)
    assert str(p.variable_dtype[exp_node.outputs[0]]) == "float64"


def test_summary_sections_and_percentages():
    x, y = T.dmatrix("x"), T.dvector("y")
    f = function([x, y], [(T.exp(x) + y) * 2, T.sum(x, axis=0)], profile=True, mode=NO_REWRITES)
    for _ in range(5):
        f(np.random.rand(30, 20), np.random.rand(20))
    p = f.profile
    text = summary_text(p)
    lines = text.splitlines()
    assert lines[0:2] == ["Function profiling", "=================="]
    assert f"  Time in 5 calls to Function.__call__: {p.fct_call_time:e}s" in lines
    assert re.search(r"^  Time in Function\.fn\.__call__: \S+s \(\d+\.\d{3}%\)$", text, re.M)
    m = re.search(r"^  Time in thunks: (\S+)s \((\d+\.\d{3})%\)$", text, re.M)
    assert float(m.group(1)) == pytest.approx(p.thunk_time, rel=1e-5)
    assert float(m.group(2)) == pytest.approx(100 * p.thunk_time / p.fct_call_time, abs=1e-3)
    assert "  Total compile time: " in text
    assert f"    Number of Apply nodes: {len(f.maker.fgraph.apply_nodes)}" in lines
    assert re.search(r"^    Optimizer time: \S+s$", text, re.M)
    assert re.search(r"^    Linker time \(includes CUDA code generation/compiling\): \S+s$", text, re.M)
    header = ("  <% time> <sum %> <apply time> <time per call> <type> <#call> <#apply> <{}>")
    assert header.format("Class name") in lines and header.format("Op name") in lines
    assert ("  <% time> <sum %> <apply time> <time per call> <#call> <id> <Apply name>"
            in lines)
    assert "symgpu.tensor.elemwise.Elemwise" in text
    assert re.search(r"^Spent \d+\.\d{3}s\(100\.00%\) in cpu Op, 0\.000s\(0\.00%\) in gpu Op "
                     r"and 0\.000s\(0\.00%\) in transfer Op$", text, re.M)
    for title, n_rows in (("Class", 3), ("Ops", 6), ("Apply", len(f.maker.fgraph.apply_nodes))):
        rows = table(text, title)
        assert len(rows) == n_rows, title
        pcts = pct_columns(rows)
        assert sum(a for a, _ in pcts) == pytest.approx(100, abs=0.05 * len(rows) + 0.01)
        assert pcts[-1][1] == pytest.approx(100.0, abs=0.05)
        assert [a for a, _ in pcts] == sorted((a for a, _ in pcts), reverse=True)
    for row in table(text, "Class") + table(text, "Ops"):
        assert row.split()[4] == "Py" and int(row.split()[5]) % 5 == 0
    assert all(int(r.split()[4]) == 5 for r in table(text, "Apply"))  # <#call>
    # input shapes and dtypes under the Apply rows
    assert "    input 0: dtype=float64, shape=(30, 20), strides=(160, 8)" in lines
    assert "    output 0: dtype=float64, shape=(20,), strides=(8,)" in lines
    assert "... (remaining 0 Classes account for" in text


def test_summary_truncates_tables():
    x = T.dvector("x")
    f = function([x], T.exp(T.log(T.sqrt(x) + 1) * 3), profile=True, mode=NO_REWRITES)
    f(np.arange(1.0, 10.0))
    text = summary_text(f.profile, n_ops_to_print=2, n_apply_to_print=1)
    n_nodes = len(f.maker.fgraph.apply_nodes)
    assert len(table(text, "Apply")) == 1
    assert f"... (remaining {n_nodes - 1} Apply instances account for" in text
    assert len(table(text, "Class")) == 2


def test_gpu_and_transfer_split_with_a_registered_timer():
    """A backend timer (deferred, like CUDA events) is used for its nodes; others use
    perf_counter; the cpu/gpu/transfer line and the <type> column follow the class names."""
    made = []

    def factory(node):
        made.append(node)

        def timer(thunk):
            thunk()
            return lambda: 0.25  # resolved after the call, like an event pair
        return timer

    register_node_timer(lambda node: type(node.op).__name__ == "GpuElemwise", factory)
    try:
        x = T.fvector("x")
        f = function([x], HostFromGpu()(GpuElemwise()(GpuFromHost()(x))) * 2,
                     profile=True, mode=NO_REWRITES)
        for _ in range(4):
            f(np.ones(8, dtype="float32"))
    finally:
        profiling.TIMERS.pop(0)
    p = f.profile
    assert [type(n.op).__name__ for n in made] == ["GpuElemwise"]
    gpu_node = made[0]
    assert p.apply_time[gpu_node] == pytest.approx(1.0)
    kinds = p.kind_time()
    assert kinds["gpu"] == pytest.approx(1.0)
    assert kinds["transfer"] > 0 and kinds["cpu"] > 0
    text = summary_text(p)
    tot = p.thunk_time
    m = re.search(r"^Spent (\S+)s\((\S+)%\) in cpu Op, (\S+)s\((\S+)%\) in gpu Op and "
                  r"(\S+)s\((\S+)%\) in transfer Op$", text, re.M)
    assert float(m.group(3)) == pytest.approx(1.0, abs=1e-3)
    assert float(m.group(4)) == pytest.approx(100 / tot, abs=0.01)
    assert sum(float(m.group(k)) for k in (2, 4, 6)) == pytest.approx(100, abs=0.02)
    types = {r.split()[-1]: r.split()[4] for r in table(text, "Ops")}
    assert types["GpuElemwise{exp,no_inplace}"] == "GPU" and types["GpuFromHost"] == "GPU"
    assert types["HostFromGpu"] == "GPU" and types["Elemwise{mul,no_inplace}"] == "Py"
    # the timer registry is consulted at compile time only: a later function is unaffected
    g = function([x], GpuElemwise()(x), profile=True, mode=NO_REWRITES)
    g(np.ones(3, dtype="float32"))
    assert g.profile.thunk_time < 0.25


def test_shared_profile_accumulates_over_functions():
    ps = ProfileStats(atexit_print=False, message="both")
    x = T.dvector("x")
    f = function([x], T.exp(x), profile=ps, mode=NO_REWRITES)
    g = function([x], [T.log(x), x * 3], profile=ps, mode=NO_REWRITES)
    f(np.ones(3)), f(np.ones(3)), g(np.ones(3))
    assert f.profile is ps and g.profile is ps
    assert ps.fct_callcount == 3 and ps.n_functions == 2
    assert ps.nb_nodes == len(f.maker.fgraph.apply_nodes) + len(g.maker.fgraph.apply_nodes)
    assert sorted(ps.apply_callcount.values()) == [1] * len(g.maker.fgraph.apply_nodes) + [2]
    assert "Message: both" in summary_text(ps)


def test_function_that_raises_keeps_a_consistent_profile():
    x, y = T.dmatrix("x"), T.dmatrix("y")
    f = function([x, y], T.exp(T.dot(x, y)).sum(), profile=True, mode=NO_REWRITES)
    f(np.ones((2, 3)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="Apply node that caused the error: dot"):
        f(np.ones((2, 3)), np.ones((2, 3)))
    f(np.ones((2, 3)), np.ones((3, 4)))
    p = f.profile
    nodes = f.maker.fgraph.toposort()
    dot = nodes[0]
    assert p.fct_callcount == 3
    assert p.apply_callcount[dot] == 3                # the failing run counts
    assert all(p.apply_callcount[n] == 2 for n in nodes[1:])  # later nodes did not run
    assert p.variable_shape[dot.inputs[1]] == (3, 4)  # last successful inputs
    assert 0 < p.thunk_time <= p.vm_call_time <= p.fct_call_time
    text = summary_text(p)
    for title in ("Class", "Ops", "Apply"):
        pcts = pct_columns(table(text, title))
        assert pcts[-1][1] == pytest.approx(100.0, abs=0.05)
    # the VM's error semantics are kept: intermediates were cleared after the failure
    f.vm.profiler = None
    with pytest.raises(ValueError, match="Apply node that caused the error: dot"):
        f(np.ones((2, 3)), np.ones((2, 3)))


def test_profiler_keeps_garbage_collection():
    x = T.dvector("x")
    with symgpu.config.change_flags(allow_gc=True):
        f = function([x], T.exp(T.exp(x) + 1), profile=True, mode=NO_REWRITES)
    f(np.ones(4))
    inner = f.maker.fgraph.toposort()[0].outputs[0]
    assert f.vm.storage_map[inner][0] is None
    with symgpu.config.change_flags(allow_gc=False):
        g = function([x], T.exp(T.exp(x) + 1), profile=True, mode=NO_REWRITES)
    g(np.ones(4))
    inner = g.maker.fgraph.toposort()[0].outputs[0]
    assert g.vm.storage_map[inner][0] is not None


def test_results_are_the_same_with_profiling():
    x = T.dmatrix("x")
    out = T.log(T.exp(x) + 1).sum(axis=1)
    a = np.random.rand(5, 6)
    np.testing.assert_allclose(function([x], out, profile=True)(a), function([x], out)(a))


def test_no_calls_summary():
    x = T.dvector("x")
    f = function([x], x * 0 + 1, profile=True)
    text = summary_text(f.profile)
    assert "Time in 0 calls to Function.__call__: 0.000000e+00s" in text
    assert "Class\n" not in text


# ----------------------------------------------------------------------------- memory

def test_memory_profile():
    x = T.dmatrix("x")
    with symgpu.config.change_flags(profile_memory=True, allow_gc=True):
        f = function([x], (T.exp(x) + 1).T.sum(), mode=NO_REWRITES)
    assert f.profile is not None and f.profile.memory  # profile_memory alone switches it on
    f(np.ones((100, 50)))
    p = f.profile
    nodes = f.maker.fgraph.toposort()
    by_name = {str(n.op): n for n in nodes}
    assert p.node_output_bytes[by_name["Elemwise{exp,no_inplace}"]] == 40000
    assert p.node_output_bytes[by_name["InplaceDimShuffle{1,0}"]] == 0  # a view owns nothing
    # exp's and add's outputs are alive together before exp's is collected
    assert p.peak_memory["cpu"] == 80000 and p.peak_memory["gpu"] == 0
    assert p.peak_memory["total"] == 80000
    text = summary_text(p)
    assert "Memory Profile" in text
    assert "        CPU: 78KB" in text and "        GPU: 0B" in text
    assert re.search(r"^ +40000B  \[\(100, 50\)\] c Elemwise\{exp,no_inplace\}\(x\)$", text, re.M)


def test_memory_counts_device_arrays_through_nbytes():
    class FakeDeviceArray:
        __cuda_array_interface__ = {}

        def __init__(self, n):
            self.nbytes = n
            self.shape = (n,)

    class GpuMake(Op):
        __props__ = ()

        def make_node(self, x):
            return Apply(self, [x], [x.type()])

        def perform(self, node, inputs, out):
            out[0][0] = FakeDeviceArray(1000)

    class HostFromGpu(Op):
        __props__ = ()

        def make_node(self, x):
            return Apply(self, [x], [x.type()])

        def perform(self, node, inputs, out):
            out[0][0] = np.zeros(10)

    x = T.dvector("x")
    ps = ProfileStats(atexit_print=False, memory=True)
    f = function([x], HostFromGpu()(GpuMake()(x)), profile=ps, mode=NO_REWRITES)
    f(np.ones(3))
    assert ps.peak_memory == {"cpu": 80, "gpu": 1000, "total": 1080}


# ----------------------------------------------------------------------------- at exit

def test_print_profiles_at_exit_prints_each_and_the_sum():
    x = T.dvector("x")
    f = function([x], T.exp(x), profile=True, name="first")
    g = function([x], T.log(x), profile=True, name="second")
    function([x], T.sin(x), profile=True, name="never_called")
    f(np.ones(2)), f(np.ones(2)), g(np.ones(2))
    buf = io.StringIO()
    print_profiles_at_exit(file=buf)
    text = buf.getvalue()
    assert text.count("Function profiling\n==================") == 3
    assert "Message: first" in text and "Message: second" in text
    assert "never_called" not in text
    assert "Message: Sum of all(2) printed profiles at exit." in text
    total = text.split("Sum of all(2)")[1]
    assert "Time in 3 calls to Function.__call__" in total


def test_profiles_printed_at_process_exit(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import symgpu, symgpu.tensor as T
        x = T.dvector("x")
        f = symgpu.function([x], T.exp(x), name="f_exp")
        g = symgpu.function([x], T.log(x) + 1, name="g_log")
        for _ in range(3):
            f(np.ones(4))
        g(np.ones(4))
        print("done")
    """))
    env = dict(os.environ, SYMGPU_FLAGS="profile=True")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    err = proc.stderr
    assert err.count("Function profiling") == 3
    assert "Message: f_exp" in err and "Message: g_log" in err
    assert "Sum of all(2) printed profiles at exit." in err
    assert "Time in 3 calls to Function.__call__" in err
    assert "Time in 4 calls to Function.__call__" in err
    assert "Spent " in err and " in transfer Op" in err
