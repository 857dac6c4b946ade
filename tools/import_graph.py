"""symgpu's import graph, read from the source (ast; nothing is imported).

Counts every import of a symgpu module, at module level and inside function bodies (only
``if TYPE_CHECKING:`` blocks are left out, as import-linter leaves them out; a lazy
``importlib.import_module`` inside a function counts as an import there), and reports:

- ``--deferred``: each import inside a function body, one per statement, with the comment that
  gives its reason (a ``# deferred: ...`` comment on the line or the line above);
- ``--cycles``: circles between the packages and files of one package (each package's
  children, subpackages taken whole, as import-linter's acyclic_siblings contract sees them);
- the default: a summary of both.

The contract test (tests/test_layers.py) uses the same functions, so the figures in the docs
and in CI are one count.
"""
from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "symgpu"

#: the comment that gives a deferred import's reason
DEFERRED_TAG = "deferred:"


@dataclass(frozen=True)
class Import:
    """One imported symgpu module: who imports it, where, and whether inside a function."""

    importer: str
    imported: str
    line: int
    deferred: bool
    reason: str


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for p in sorted(package.rglob("*.py")):
        parts = list(p.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _resolve(importer: str, is_pkg: bool, node: ast.ImportFrom, known: dict) -> list[str]:
    if node.level:
        base = importer.split(".") if is_pkg else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    out = []
    for a in node.names:
        sub = f"{mod}.{a.name}"
        out.append(sub if sub in known else mod)
    return out


def _is_import_module_call(node: ast.AST) -> bool:
    """``importlib.import_module(...)`` (or a bare ``import_module(...)``): a lazy import."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id == "import_module")


def _import_module_target(node: ast.Call, importer: str, known: dict) -> str:
    """The module a lazy import names: its literal, else (a name built at run time, as a
    package's PEP 562 ``__getattr__`` builds it) the importing package itself."""
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return importer if importer in known and known[importer].name == "__init__.py" \
        else importer.rsplit(".", 1)[0]


def _reason(lines: list[str], lineno: int) -> str:
    for ln in (lineno - 1, lineno - 2):
        if 0 <= ln < len(lines) and DEFERRED_TAG in lines[ln]:
            return lines[ln].split(DEFERRED_TAG, 1)[1].strip()
    return ""


def imports(known: dict[str, Path] | None = None) -> list[Import]:
    """Every import of a symgpu module in the package."""
    known = modules() if known is None else known
    found: list[Import] = []
    for name, path in known.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST, deferred: bool) -> None:
            for ch in ast.iter_child_nodes(node):
                d = deferred or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.Lambda))
                if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                    for sub in ch.orelse:
                        visit(sub, d)
                    continue
                targets: list[str] = []
                if d and _is_import_module_call(ch):
                    targets = [_import_module_target(ch, name, known)]
                elif isinstance(ch, ast.Import):
                    targets = [a.name for a in ch.names]
                elif isinstance(ch, ast.ImportFrom):
                    targets = _resolve(name, is_pkg, ch, known)
                targets = [t for t in dict.fromkeys(targets)
                           if t == "symgpu" or t.startswith("symgpu.")]
                if targets:
                    reason = _reason(lines, ch.lineno) if d else ""
                    for t in targets:
                        while t not in known and "." in t:
                            t = t.rsplit(".", 1)[0]
                        found.append(Import(name, t, ch.lineno, d, reason))
                visit(ch, d)

        visit(tree, False)
    return found


def deferred_statements(found: list[Import]) -> list[Import]:
    """Imports inside function bodies, one per statement (importer and line)."""
    seen: dict[tuple[str, int], Import] = {}
    for imp in found:
        if imp.deferred:
            seen.setdefault((imp.importer, imp.line), imp)
    return sorted(seen.values(), key=lambda i: (i.importer, i.line))


def _top(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2])


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
                continue
            if nxt not in index:
                index[nxt] = low[nxt] = counter
                counter += 1
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return out


def sibling_cycles(found: list[Import]) -> dict[str, list[list[str]]]:
    """Circles among the children of each package (import-linter's acyclic_siblings): an
    import from inside one child (a module or a whole subpackage) into another child of the
    same package counts as an arrow between the two. The façade (``symgpu/__init__.py``)
    and a package's own ``__init__`` are left out: every child lives inside them.
    Returns {package: [circle, ...]} for the packages that have any."""
    graphs: dict[str, dict[str, set[str]]] = {}
    for imp in found:
        a, b = imp.importer.split("."), imp.imported.split(".")
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        if common >= len(a) or common >= len(b):
            continue  # one is inside the other (a package and its own module)
        parent = ".".join(a[:common])
        child_a, child_b = ".".join(a[:common + 1]), ".".join(b[:common + 1])
        graphs.setdefault(parent, {}).setdefault(child_a, set()).add(child_b)
    out = {}
    for parent, graph in sorted(graphs.items()):
        cycles = _sccs(graph)
        if cycles:
            out[parent] = cycles
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deferred", action="store_true", help="list imports inside functions")
    ap.add_argument("--cycles", action="store_true", help="list import circles")
    ap.add_argument("--edges", metavar="A:B", help="list imports from package A into B")
    args = ap.parse_args(argv)
    found = imports()
    deferred = deferred_statements(found)
    cycles = sibling_cycles(found)
    if args.deferred:
        for imp in deferred:
            print(f"{imp.importer}:{imp.line} -> {imp.imported}  # {imp.reason or '(no reason)'}")
    if args.cycles:
        for parent, circles in cycles.items():
            for c in circles:
                print(f"in {parent}:", " <-> ".join(m.rsplit(".", 1)[-1] for m in c))
    if args.edges:
        a, b = args.edges.split(":")
        for imp in found:
            if _top(imp.importer) == a and _top(imp.imported) == b:
                kind = "deferred" if imp.deferred else "module"
                print(f"{imp.importer}:{imp.line} -> {imp.imported} ({kind})")
    print(f"{len(deferred)} imports of symgpu modules inside functions "
          f"({sum(1 for i in deferred if not i.reason)} without a reason); "
          f"{sum(len(c) for c in cycles.values())} import circles in {len(cycles)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
