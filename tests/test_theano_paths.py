"""Theano's module paths (symgpu/theano_paths.py): every path resolves, a path naming one of
our modules is that module, gathered ones take each name from the first module that has it,
nothing loads at `import symgpu`, and code that made `theano` this package imports Theano's
paths unchanged."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import symgpu
from symgpu import theano_paths
from symgpu.theano_paths import PATHS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_resolves(path):
    module = importlib.import_module(path)
    target = PATHS[path]
    if isinstance(target, str):
        own = importlib.import_module(target)
        if isinstance(module, theano_paths._CallableAlias):   # T.var beside tensor.var
            assert module._module is own and callable(module)
        else:
            assert module is own   # the module itself, keeping its own spec
        assert own.__spec__.name == target
    else:
        first = importlib.import_module(target[0])
        name = next(n for n in dir(module) if not n.startswith("_") and hasattr(first, n))
        assert getattr(module, name) is getattr(first, name)


def test_the_gpu_basic_ops_path_of_the_docs_comes_back():
    from symgpu.gpu.basic_ops import (GpuFromHost, HostFromGpu, as_gpuarray_variable,
                                      gpu_contiguous, gpu_from_host, host_from_gpu)
    from symgpu.gpu.placement import basic_ops
    assert GpuFromHost is basic_ops.GpuFromHost and HostFromGpu is basic_ops.HostFromGpu
    assert {f.__module__ for f in (as_gpuarray_variable, gpu_contiguous, gpu_from_host,
                                   host_from_gpu)} == {"symgpu.gpu.placement.basic_ops"}


def test_gathered_paths():
    import symgpu.gof as gof
    from symgpu.graph.basic import Apply, Variable
    from symgpu.graph.fg import FunctionGraph
    assert gof.Variable is Variable and gof.Apply is Apply and gof.FunctionGraph is FunctionGraph
    assert gof.graph.Variable is Variable  # a sub-path (itself gathered: graph.basic and
    assert gof.graph.ancestors is importlib.import_module("symgpu.graph.basic").ancestors
    assert gof.graph.clone is importlib.import_module("symgpu.graph.traversal").clone  # walks)
    assert {"Variable", "FunctionGraph", "graph", "fg"} <= set(dir(gof))
    with pytest.raises(AttributeError, match="gathers symgpu.graph.basic"):
        gof.no_such_name
    from symgpu.scan_module import scan, until
    assert scan is symgpu.scan.scan and until is symgpu.scan.until  # names before sub-paths


def test_paths_cost_nothing_at_import():
    code = ("import sys, symgpu; "
            "print(sorted(m for m in ('symgpu.gpu', 'symgpu.scan', 'symgpu.gof') "
            "if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SYMGPU_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"


def test_nothing_inside_the_package_imports_the_path_layer():
    importers = [p.relative_to(ROOT) for p in (ROOT / "symgpu").rglob("*.py")
                 if "theano_paths" in p.read_text(encoding="utf-8")
                 and p.name not in ("theano_paths.py",)]
    assert [str(p) for p in importers] == [os.path.join("symgpu", "__init__.py")]


def test_code_written_for_theano_imports_unchanged():
    code = """
import sys, symgpu
sys.modules["theano"] = symgpu
import theano
import theano.tensor as T
from theano.gof.graph import Variable
from theano.gpuarray.basic_ops import gpu_from_host
from theano.scan_module import scan
from theano.tensor.nnet import conv2d
import theano.compile.sharedvalue as sv
import theano.tensor.basic as tb
assert T is symgpu.tensor and tb is sys.modules["symgpu.tensor.basic"]
assert Variable is symgpu.Variable and sv.shared is symgpu.shared and scan is symgpu.scan.scan
try:
    import theano.no_such_module
except ImportError:
    print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


def test_every_path_is_documented():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text[text.index("## Theano's module paths"):]
    missing = [p for p in PATHS if f"`{p}`" not in section]
    assert not missing, missing


def test_install_is_idempotent():
    theano_paths.install()
    theano_paths.install()
    assert sum(isinstance(f, type(theano_paths._FINDER)) for f in sys.meta_path) == 1


def test_a_path_named_like_a_function_keeps_the_function_callable():
    """theano.tensor.var (a module path) beside T.var (a function): importing the path makes
    the import system set the package's attribute to the module; the alias stays callable as
    the function and hands out the module's names, under symgpu's path and the theano alias."""
    import subprocess
    import sys
    code = (
        "import sys, symgpu, symgpu.tensor as T\n"
        "import symgpu.tensor.var as tv\n"
        "x = T.vector()\n"
        "assert T.var(x).owner is not None and tv.TensorVariable is type(x)\n"
        "sys.modules['theano'] = symgpu\n"
        "import theano.tensor.var\n"
        "from theano.tensor.var import TensorVariable\n"
        "assert TensorVariable is type(x) and T.var(x).owner is not None\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
