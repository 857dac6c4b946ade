"""The package's layers (docs/internals.md, "Layers"), checked on the source.

- import-linter's contracts in pyproject.toml hold (layers, and no import circle between the
  packages or files of one package), counting imports inside functions; the same check fails
  on a copy of the package with one upward import added, naming the line;
- imports of symgpu modules inside function bodies stay few (DEFERRED_LIMIT), each with its
  reason in a ``# deferred: ...`` comment (tools/import_graph.py counts them);
- ops and types are recognised by type or declared property, never by class-name strings;
- a broad ``except`` says in a comment why any error is a fall back and where it is reported
  (test_gpu_layout.py also keeps the GPU package's count of them).
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import import_graph  # noqa: E402

#: at most this many imports of symgpu modules inside function bodies, package-wide
DEFERRED_LIMIT = 60

_LINT = ("import sys; from importlinter.cli import lint_imports_command; "
         "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([sys.executable, "-c", _LINT], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)


def test_import_contracts_hold():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_an_upward_import_breaks_the_contracts(tmp_path):
    shutil.copytree(ROOT / "symgpu", tmp_path / "symgpu",
                    ignore=shutil.ignore_patterns("__pycache__", "*.cu", "*.cuh"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    basic = tmp_path / "symgpu" / "graph" / "basic.py"
    text = basic.read_text(encoding="utf-8").rstrip("\n")
    text += "\n\n\ndef _compile_it():\n    import symgpu.compile.function\n"
    basic.write_text(text, encoding="utf-8")
    line = text.splitlines().index("    import symgpu.compile.function") + 1
    run = _lint(tmp_path)
    assert run.returncode != 0
    assert f"symgpu.graph.basic -> symgpu.compile.function (l.{line})" in run.stdout, run.stdout


def test_no_import_circles_counting_imports_inside_functions():
    assert import_graph.sibling_cycles(import_graph.imports()) == {}


def test_few_deferred_imports_each_with_its_reason():
    deferred = import_graph.deferred_statements(import_graph.imports())
    unexplained = [f"{i.importer}:{i.line} -> {i.imported}" for i in deferred if not i.reason]
    assert not unexplained, "say why with '# deferred: <reason>' (or import at module level)"
    assert len(deferred) <= DEFERRED_LIMIT, [f"{i.importer}:{i.line}" for i in deferred]


def _sources():
    for path in sorted((ROOT / "symgpu").rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def _is_type_name(node: ast.AST) -> bool:
    """`type(x).__name__`, `x.__class__.__qualname__`, `type(x).__module__` and the like."""
    if not (isinstance(node, ast.Attribute) and node.attr in ("__name__", "__qualname__",
                                                             "__module__")):
        return False
    inner = node.value
    if isinstance(inner, ast.Attribute) and inner.attr in ("__call__", "__class__"):
        return True
    return isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "type"


def _strings(node: ast.AST, constants: dict[str, set[str]]) -> set[str]:
    """The string literals `node` stands for (a literal, a tuple/set/list of them, or a
    module-level name bound to one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e, constants) for e in node.elts))
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("frozenset", "set",
                                                                         "tuple"):
        return set().union(*(_strings(a, constants) for a in node.args))
    if isinstance(node, ast.Name):
        return constants.get(node.id, set())
    return set()


def test_no_class_name_string_checks():
    """No comparison of a type's name, and no comparison with a string that names one of
    symgpu's classes (or starts a GPU class name)."""
    trees = list(_sources())
    classes = {n.name for _, t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    found = []
    for path, tree in trees:
        constants = {}
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                constants[stmt.targets[0].id] = _strings(stmt.value, {})
        for node in ast.walk(tree):
            parts, prefix = [], False
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "startswith":
                parts, prefix = [node.func.value, *node.args], True
            named = set().union(*(_strings(p, constants) for p in parts)) if parts else set()
            if any(_is_type_name(p) for p in parts) or named & classes or (
                    prefix and any(s.startswith("Gpu") for s in named)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "recognise ops by type or by a declared property: " + ", ".join(found)


def _is_broad(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return handler.type is None or any(getattr(n, "id", None) in ("Exception", "BaseException")
                                       for n in names)


def _commented(lines: list[str], lineno: int) -> bool:
    """A comment on the line, or a comment block right above it."""
    return "#" in lines[lineno - 1] or lines[lineno - 2].strip().startswith("#")


def test_broad_excepts_say_why():
    unexplained = []
    for path, tree in _sources():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and _is_broad(node):
                if not _commented(lines, node.lineno):
                    unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unexplained, ("name the errors expected, or say in a comment on (or right "
                             "above) the except line why any error falls back and where it is "
                             "reported: "
                             + ", ".join(unexplained))
