"""Run the ported tutorial programs in examples/ and check what they print.

Each example runs in a subprocess, as a user would run it, with
``SYMGPU_FLAGS=device=cpu,floatX=float32`` (short step counts) on every machine; the
GPU-only examples and the device=cuda runs are marked ``gpu`` (they skip without a GPU).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
SKIPPED = 77  # exit status of a GPU-only example that could not run


def run_example(script: str, *args: str, flags: str = "device=cpu,floatX=float32",
                timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``examples/<script>`` with SYMGPU_FLAGS=flags; no rc file is read."""
    environ = dict(os.environ)
    environ.update({"SYMGPU_FLAGS": flags, "SYMGPURC": os.devnull, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": ROOT + os.pathsep + environ.get("PYTHONPATH", "")})
    environ.pop("TRAINING_STEPS", None)
    environ.update(env or {})
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], cwd=ROOT,
                          env=environ, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> str:
    """stdout of a run that must have succeeded (stderr shown otherwise)."""
    assert proc.returncode == 0, (f"exit status {proc.returncode}\n--- stdout\n{proc.stdout}"
                                  f"\n--- stderr\n{proc.stderr}")
    return proc.stdout


def lines(text: str) -> list[str]:
    return text.splitlines()


# ============================================================================ CPU

def test_check1_cpu():
    out = ok(run_example("check1.py"))
    first = lines(out)[0]
    assert first == "[Elemwise{exp,no_inplace}(<TensorType(float32, vector)>)]"
    assert re.search(r"^Looping 1000 times took [0-9.]+ seconds$", out, re.M)
    assert re.search(r"^Result is \[1\.2317803 1\.6187934 1\.5227807 \.\.\. 2\.2077184 2\.2996774 "
                     r"1\.6232328\]$", out, re.M)
    assert lines(out)[-1] == "Used the cpu"


def test_check2_cpu_returns_the_result_on_the_host():
    out = ok(run_example("check2.py", "50"))
    assert "No GPU in use (device=cpu)" in out
    assert "[Elemwise{exp,no_inplace}(<TensorType(float32, vector)>)]" in lines(out)
    assert "Looping 50 times took" in out
    result = re.search(r"^Numpy result is (\[1\.23178.*\])$", out, re.M)
    assert result, out
    assert lines(out)[-1] == "Used the cpu"


def _labels_and_predictions(out: str) -> tuple[list[float], list[str]]:
    text = out.split("target values for D", 1)[1]
    targets, preds = text.split("prediction on D", 1)
    return re.findall(r"[01]\.", targets), re.findall(r"True|False|[01]\.", preds)


def test_logistic_regression_exercise_cpu():
    proc = run_example("logistic_regression.py", "20")
    out = ok(proc)
    assert lines(out)[0] == "Used the cpu"
    assert "target values for D" in lines(out) and "prediction on D" in lines(out)
    targets, preds = _labels_and_predictions(out)
    assert len(targets) == 400 and len(preds) == 400


def test_logistic_regression_steps_from_the_environment():
    # TRAINING_STEPS sets the steps when no argument is given (10000 would take seconds)
    out = ok(run_example("logistic_regression.py", env={"TRAINING_STEPS": "3"}))
    assert lines(out)[0] == "Used the cpu"
    assert "prediction on D" in out


def test_logistic_regression_solution_cpu_with_profile():
    proc = run_example("logistic_regression_solution.py", "20",
                       flags="device=cpu,profile=True")
    out = ok(proc)
    assert lines(out)[0] == "Used the cpu"
    targets, preds = _labels_and_predictions(out)
    assert len(targets) == 400 and len(preds) == 400
    err = proc.stderr
    # one profile per function (train, predict) and their sum, each with every section
    assert err.count("Function profiling") == 3
    assert "Message: train" in err and "Message: predict" in err
    assert "Message: Sum of all(2) printed profiles at exit." in err
    assert "Time in 20 calls to Function.__call__" in err
    assert "Time in 21 calls to Function.__call__" in err  # 20 train + 1 predict
    for section in ("Class\n---", "Ops\n---", "Apply\n------"):
        assert err.count(section) == 3, section
    spent = re.findall(r"^Spent ([0-9.]+)s\(([0-9.]+)%\) in cpu Op, ([0-9.]+)s\(([0-9.]+)%\) "
                       r"in gpu Op and ([0-9.]+)s\(([0-9.]+)%\) in transfer Op$", err, re.M)
    assert len(spent) == 3
    assert all(float(s[1]) == 100.0 and float(s[2]) == 0.0 for s in spent)  # all on the CPU
    assert "Gemv" in err  # the dot is a Gemv on the CPU


def test_logistic_regression_solution_without_profile_prints_no_profile():
    proc = run_example("logistic_regression_solution.py", "2", flags="device=cpu")
    assert lines(ok(proc))[0] == "Used the cpu"
    assert "Function profiling" not in proc.stderr


def test_logistic_regression_solution_keep_on_gpu_needs_a_gpu():
    proc = run_example("logistic_regression_solution.py", "2", "--keep-on-gpu",
                       flags="device=cpu")
    assert proc.returncode == 1
    assert "--keep-on-gpu needs a GPU" in proc.stderr


def test_memory_and_variables_cpu():
    out = ok(run_example("memory_and_variables.py", flags="device=cpu"))
    text = lines(out)
    assert "# No GPU in use (device=cpu)" in out

    def after(statement: str, n: int) -> list[str]:
        i = text.index(">>> " + statement)
        return text[i + 1:i + 1 + n]

    # b = a.transfer(None): an upload to the default context
    assert after("symgpu.printing.debugprint(b)", 2) == [
        "GpuFromHost<None> [id A] ''", " |<TensorType(float32, matrix)> [id B]"]
    # a ** 2 compiled: upload, GPU square, download
    i = text.index(">>> sq = symgpu.function([a], b)")
    graph = text[i + 2:i + 6]
    assert re.fullmatch(r"HostFromGpu\(gpuarray\) \[id A\] ''   2", graph[0])
    assert re.fullmatch(r" \|GpuElemwise\{sqr.* \[id B\] ''   1", graph[1]), graph
    assert graph[2:] == ["   |GpuFromHost<None> [id C] ''   0", "     |a [id D]"]
    # with b.transfer(None) the output stays on the GPU: no HostFromGpu at the end
    i = text.index(">>> b = b.transfer(None)")
    graph = text[i + 3:i + 6]
    assert re.fullmatch(r"GpuElemwise\{sqr.* \[id A\] ''   1", graph[0]), graph
    assert graph[1:] == [" |GpuFromHost<None> [id B] ''   0", "   |a [id C]"]
    # a.transfer('cpu') of a host tensor is the tensor itself
    assert after("b = a.transfer('cpu')", 2) == [">>> symgpu.printing.debugprint(b)", "a [id A]"]
    # shared(0): an int64 scalar on the host, get/set
    assert after("state", 1) == ["<TensorType(int64, scalar)>"]
    assert after("state.get_value()", 1) == ["array(0)"]
    assert after("state.set_value(1)", 2) == [">>> state.get_value()", "array(1)"]
    assert after("shared(numpy.ones((2, 2), dtype='float32'))", 1) == [
        "<TensorType(float32, matrix)>"]


@pytest.mark.parametrize("script", ["pycuda_simple.py", "pycuda_double_op.py"])
def test_gpu_only_examples_exit_clearly_on_the_cpu(script):
    proc = run_example(script, flags="device=cpu,floatX=float32")
    assert proc.returncode == SKIPPED, proc.stderr
    assert f"{script} is a GPU-only example and was not run: it needs device=cuda" in proc.stderr
    assert "SYMGPU_FLAGS=device=cuda" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_gpu_only_examples_say_why_the_gpu_cannot_be_used():
    from symgpu.gpu import gpu_available
    if gpu_available():
        pytest.skip("a GPU is usable here")
    proc = run_example("pycuda_double_op.py", flags="device=cuda,floatX=float32")
    assert proc.returncode == SKIPPED, proc.stderr
    assert "the GPU cannot be used here:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_check1_falls_back_to_the_cpu_with_a_warning():
    from symgpu.gpu import gpu_available
    if gpu_available():
        pytest.skip("a GPU is usable here")
    proc = run_example("check1.py", flags="device=cuda,floatX=float32")
    assert lines(ok(proc))[-1] == "Used the cpu"
    assert "GpuUnavailableWarning" in proc.stderr and "running on the CPU instead" in proc.stderr


# ============================================================================ GPU

GPU = "device=cuda,floatX=float32"


@pytest.mark.gpu
def test_check1_gpu():
    out = ok(run_example("check1.py", flags=GPU))
    assert lines(out)[0].startswith("[GpuElemwise{exp,no_inplace}(")
    assert "HostFromGpu(gpuarray)(GpuElemwise{exp,no_inplace}.0)" in lines(out)[0]
    assert re.search(r"^Result is \[1\.23178", out, re.M)
    assert lines(out)[-1] == "Used the gpu"


@pytest.mark.gpu
def test_check2_gpu_keeps_the_result_on_the_device():
    out = ok(run_example("check2.py", flags=GPU))
    graph = lines(out)[0]
    assert graph.startswith("[GpuElemwise{exp,no_inplace}(") and "HostFromGpu" not in graph
    assert re.search(r"^Numpy result is \[1\.23178", out, re.M)
    assert lines(out)[-1] == "Used the gpu"


@pytest.mark.gpu
def test_logistic_regression_exercise_gpu():
    out = ok(run_example("logistic_regression.py", "20", flags=GPU))
    assert lines(out)[0] == "Used the gpu"
    targets, preds = _labels_and_predictions(out)
    assert len(targets) == 400 and len(preds) == 400


@pytest.mark.gpu
def test_logistic_regression_solution_gpu_profile():
    proc = run_example("logistic_regression_solution.py", "20", flags=GPU + ",profile=True")
    assert lines(ok(proc))[0] == "Used the gpu"
    spent = re.findall(r"^Spent [0-9.]+s\(([0-9.]+)%\) in cpu Op, [0-9.]+s\(([0-9.]+)%\) in gpu "
                       r"Op and", proc.stderr, re.M)
    assert len(spent) == 3
    assert float(spent[-1][1]) > 50.0  # most of the time is spent in GPU ops
    assert "GpuGemv" in proc.stderr


@pytest.mark.gpu
def test_logistic_regression_solution_keep_on_gpu():
    proc = run_example("logistic_regression_solution.py", "20", "--keep-on-gpu", flags=GPU)
    out = ok(proc)
    assert lines(out)[0] == "Used the gpu"
    targets, preds = _labels_and_predictions(out)
    assert len(targets) == 400 and len(preds) == 400


@pytest.mark.gpu
def test_memory_and_variables_gpu():
    out = ok(run_example("memory_and_variables.py", flags="device=cuda,"
                         "contexts=dev0->cuda0;dev1->cuda0"))
    assert "No GPU in use" not in out
    text = lines(out)
    i = text.index(">>> b.eval({a: numpy.ones((2, 2)).astype(symgpu.config.floatX)})")
    assert text[i + 1].startswith("gpuarray.array([[1., 1.],")
    assert "HostFromGpu(gpuarray) [id A] ''   2" in text
    assert any(re.fullmatch(r"GpuElemwise\{sqr.* \[id A\] ''   1", t) for t in text)
    assert "<TensorType(int64, scalar)>" in text  # integer scalars stay on the host
    i = text.index(">>> shared(numpy.ones((2, 2), dtype='float32'))")
    assert "GpuArrayType<None>(float32, (False, False))" in text[i + 1]
    assert "GpuArrayType<dev1>(float32, (False, False))" in text[-1]


@pytest.mark.gpu
def test_pycuda_simple_gpu():
    out = ok(run_example("pycuda_simple.py", flags=GPU))
    assert lines(out)[-1] == "multiply_them on symgpu GpuArrays: OK"


@pytest.mark.gpu
def test_pycuda_double_op_gpu():
    out = ok(run_example("pycuda_double_op.py", flags=GPU))
    assert out.split() == ["[[2.", "2.", "2.", "2.", "2.]"] + ["[2.", "2.", "2.", "2.", "2.]"] * 2 \
        + ["[2.", "2.", "2.", "2.", "2.]]"]
