"""Theano 1.0's documented names, and which of them symgpu has.

The names come from Theano's library reference (``doc/library`` of the Theano repository,
tag rel-1.0.5): every ``.. autofunction::``, ``.. autoclass::``, ``.. function::``,
``.. class::``, ``.. attribute::``, ``.. method::`` and ``.. data::`` directive, with the module
it belongs to (``.. module::``, ``.. currentmodule::`` and ``.. automodule::`` set it; a fully
qualified name gives its own; a directive indented under a class names a member of it), and
the names an ``automodule``/``autoclass`` lists in its ``:members: a, b`` option. A bare
``:members:`` documents the members found in Theano's source: at extraction they are listed by
autodoc's rule (the module's ``__all__`` or attributes, public, defined in that module, with a
docstring of their own; `module_members`, run by a Python that imports Theano), module-level
names only (the methods of the classes are not counted); the data file marks those modules and
their members with ``*``. They were extracted once into tools/theano_library_names.txt
(``module:qualified.name`` a line, names only), so neither this tool nor its test needs Theano
or the network::

    python tools/theano_names.py                 # per module, then the totals
    python tools/theano_names.py --missing       # and every missing name
    python tools/theano_names.py --absent        # and every deliberate absence, with its reason
    python tools/theano_names.py --extract DIR --theano-python PY
        # re-extract from a checkout of Theano (DIR has doc/library and theano/; PY is a Python
        # with Theano 1.0.5 and its dependencies installed)

Each name's status here: *present* (it resolves under ``symgpu.`` in place of ``theano.``,
through the real modules or the path table symgpu/theano_paths.py), *absent* (deliberately:
tools/theano_absent.py gives the reason) or *missing*. The modules of the issue "The rest of
Theano's library" (OTHER_ISSUE) are counted apart, with their status too. Coverage counts a
deliberate absence as covered: (present + absent) / documented.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
DATA = TOOLS / "theano_library_names.txt"

#: the directives whose argument names something documented
NAMING = ("autofunction", "autoclass", "function", "class", "attribute", "method", "data")
#: the directives that set the current module
MODULE = ("module", "currentmodule", "automodule")

#: Theano objects that its reference documents as modules but that are attributes
#: (``theano.config`` is a configuration object): the attribute path under ``symgpu``
MODULE_ATTRIBUTES = {"theano.config": ("config",)}

#: the issue "The rest of Theano's library": modules (a module and what is below it) and single
#: names (``module:name``) it maps; these are counted apart
OTHER_ISSUE = (
    "theano.tensor.slinalg", "theano.tensor.nlinalg", "theano.sandbox.linalg",
    "theano.gpuarray.linalg",
    "theano.sparse",
    "theano.tensor.fft", "theano.gpuarray.fft",
    "theano.tensor.sort",
    "theano.tensor.nnet.blocksparse",
    "theano.tensor.nnet.neighbours", "theano.sandbox.neighbours", "theano.gpuarray.neighbours",
    "theano.compile.builders",
    "theano.tensor.nnet.conv3d2d", "theano.tensor.nnet:conv3d",
    "theano.tensor.signal.pool:pool_3d",
    "theano.tensor.nnet.ctc", "theano.gpuarray.ctc",
    "theano.d3viz",
    "theano.typed_list",
    "theano:sparse_grad",  # the sparse gradient of advanced indexing: part of theano.sparse
)


def _instances() -> dict:
    """Theano classes whose documented members are set on instances (in ``__init__``): how to
    build one of ours, from our class, to look for them on it."""
    import numpy as np  # deferred: only when a member is not found on the class itself
    import symgpu  # deferred: the tool imports the package it checks only when checking
    scalar = symgpu.tensor.dscalar
    return {
        "theano.compile.debugmode:DebugMode": lambda cls: cls(),
        "theano.compile.function:In": lambda cls: cls(scalar()),
        "theano.compile.function:Out": lambda cls: cls(scalar()),
        "theano.compile.io:In": lambda cls: cls(scalar()),
        "theano.compile.mode:Mode": lambda cls: cls(),
        "theano.tensor:TensorType": lambda cls: cls("float64", (False,)),
        "theano.compile.sharedvalue:SharedVariable": lambda cls: symgpu.shared(np.zeros(2)),
        "theano.tensor.shared_randomstreams:RandomVariable": lambda cls: None,
    }


@dataclass(frozen=True)
class Name:
    module: str     # Theano's module, e.g. theano.tensor.nnet
    qualname: str   # the name in it, e.g. sigmoid, or Class.member

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


# ---------------------------------------------------------------------------------------------
# extraction (run once, from a checkout of Theano)

_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+(?:py:)?(\w+)::\s*(.*?)\s*$")


def _is_module(theano_root: Path, dotted: str) -> bool:
    path = theano_root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_of(theano_root: Path, page: Path, arg: str) -> str:
    """The full Theano name of the module `arg` names on `page` (the reference often gives
    short names: ``tensor.nnet.bn``, or ``conv`` on tensor/nnet/conv.txt)."""
    arg = arg.split()[0]
    if arg == "theano" or arg.startswith("theano."):
        return arg
    dirs = list(page.parent.parts)
    candidates = ["theano." + arg] + [".".join(["theano", *dirs[:k], arg])
                                     for k in range(len(dirs), -1, -1)]
    for candidate in candidates:
        if _is_module(theano_root, candidate):
            return candidate
    return ".".join(["theano", *dirs, arg]) if dirs else "theano." + arg


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets and braces."""
    pieces, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            pieces.append(cur)
            cur = ""
        else:
            cur += ch
    return pieces + [cur]


def _names_in(arg: str) -> list[str]:
    """The names a directive's argument gives: ``log(a), log2(a)``, ``{sum,prod}(axis)``,
    ``__{abs,neg}__``, ``x = default``, ``Class(Base)``."""
    names = []
    arg = re.sub(r"\)\s+[A-Za-z].*$", ")", arg)  # `copy() Return a copy, ...`: prose after
    for piece in _split_top(arg):
        m = re.match(r"\s*([\w.{},]+?)\s*(?:[(=:\s]|$)", piece)
        if not m:
            continue
        word = m.group(1)
        brace = re.search(r"\{([^}]*)\}", word)
        variants = ([word[:brace.start()] + v.strip() + word[brace.end():]
                     for v in brace.group(1).split(",")] if brace else [word])
        names += [v for v in variants if re.fullmatch(r"[A-Za-z_][\w.]*", v)]
    return names


def extract(theano_root: Path) -> tuple[list[str], list[Name], list[str]]:
    """(modules, names, modules documented whole) of doc/library under `theano_root` (a
    checkout of Theano): the last are the modules of a bare ``:members:``."""
    library = theano_root / "doc" / "library"
    modules: list[str] = []
    whole: list[str] = []
    names: list[Name] = []
    for path in sorted(library.rglob("*.txt")):
        page = path.relative_to(library)
        module = "theano"
        classes: list[tuple[int, Name]] = []  # (indent, class) of the enclosing classes
        last: Name | None = None  # what an explicit `:members: a, b` option lists names of
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"^\s+:members:\s*$", line) and last is not None and not last.qualname:
                whole.append(last.module)  # every member, from Theano's source: not listed
                continue
            option = re.match(r"^\s+:members:\s*(\S.*)$", line)
            if option and last is not None:
                for word in _names_in(option.group(1)):
                    qualname = f"{last.qualname}.{word}" if last.qualname else word
                    names.append(Name(last.module, qualname))
                continue
            m = _DIRECTIVE.match(line)
            if not m:
                continue
            last = None
            indent, directive, arg = len(m.group(1)), m.group(2), m.group(3)
            while classes and classes[-1][0] >= indent:
                classes.pop()
            if directive in MODULE:
                module = _module_of(theano_root, page, arg)
                modules.append(module)
                last = Name(module, "") if directive == "automodule" else None
                classes = []
                continue
            if directive not in NAMING:
                continue
            for word in _names_in(arg):
                if classes:
                    owner = classes[-1][1]
                    name = Name(owner.module, f"{owner.qualname}.{word}")
                elif word.startswith("theano."):
                    parts = word.split(".")
                    k = max(k for k in range(1, len(parts))
                            if _is_module(theano_root, ".".join(parts[:k])))
                    name = Name(".".join(parts[:k]), ".".join(parts[k:]))
                elif module in MODULE_ATTRIBUTES and word.startswith(module.split(".")[-1] + "."):
                    name = Name(module, word.split(".", 1)[1])  # config.scan.debug
                else:
                    name = Name(module, word)
                names.append(name)
                if directive in ("class", "autoclass"):
                    classes.append((indent, name))
                if directive in ("autoclass", "autofunction"):
                    last = name
    return (list(dict.fromkeys(modules)), list(dict.fromkeys(names)),
            list(dict.fromkeys(whole)))


#: run with Theano importable: prints {module: [member, ...]} of the modules given on stdin,
#: by autodoc's rule for a bare ``:members:`` (the module's ``__all__``, else its attributes;
#: no private names, no modules, nothing defined in another module, only what has a
#: docstring of its own); a module that fails to import maps to its error
_MEMBERS_SCRIPT = r"""
import importlib, inspect, json, sys
out = {}
for name in json.loads(sys.stdin.read()):
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        out[name] = repr(exc)
        continue
    found = []
    for attr in list(getattr(mod, "__all__", None) or dir(mod)):
        obj = getattr(mod, attr, None)
        if attr.startswith("_") or inspect.ismodule(obj):
            continue
        if getattr(obj, "__module__", None) not in (None, name):
            continue
        doc = getattr(obj, "__doc__", None)
        if not inspect.isclass(obj) and doc == getattr(type(obj), "__doc__", None):
            doc = None
        if doc:
            found.append(attr)
    out[name] = found
print(json.dumps(out))
"""


def _static_members(theano_root: Path, module: str) -> list[str]:
    """The members autodoc would list, read from the source where the module does not
    import: its literal ``__all__``, else its top-level undecorated functions and classes
    that have a docstring."""
    path = theano_root.joinpath(*module.split("."))
    path = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined = [node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.decorator_list
               and ast.get_docstring(node) and not node.name.startswith("_")]
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                 for t in node.targets)):
            try:
                return [n for n in ast.literal_eval(node.value) if not n.startswith("_")]
            except ValueError:
                break
    return defined


def module_members(theano_root: Path, modules: list[str], python: str = sys.executable
                   ) -> dict[str, list[str]]:
    """Each module's members as a bare ``:members:`` documents them (`_MEMBERS_SCRIPT`, run by
    `python` with `theano_root` on its path; modules that do not import there: read from
    the source, `_static_members`), sorted."""
    env = dict(os.environ, PYTHONPATH=str(theano_root))
    run = subprocess.run([python, "-c", _MEMBERS_SCRIPT], input=json.dumps(modules), env=env,
                         capture_output=True, text=True, timeout=1200)
    found = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {}
    out = {}
    for module in modules:
        members = found.get(module)
        if not isinstance(members, list):
            members = _static_members(theano_root, module)
        out[module] = sorted(members)
    return out


def write_data(modules: list[str], names: list[Name], whole: list[str] = (),
               path: Path = DATA, members: list[Name] = ()) -> None:
    lines = ["# Theano 1.0.5's documented names: doc/library of the Theano repository (tag",
             "# rel-1.0.5), extracted by `python tools/theano_names.py --extract CHECKOUT`.",
             "# A line `module` is a module the reference documents (`module *`: also all its",
             "# members, by a bare `:members:`); `module:name` a name in it (a class member is",
             "# `module:Class.member`); `module:name *` a member a bare `:members:` documents",
             "# (found in Theano's source by autodoc's rule). Names only.",
             *(m + (" *" if m in whole else "") for m in modules), *map(str, names),
             *(f"{n} *" for n in members if n not in set(names))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def load(path: Path = DATA) -> tuple[list[str], list[Name]]:
    """(modules, names) of the data file."""
    modules, names = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if ":" in line:
            module, qualname = line.split(":", 1)
            names.append(Name(module, qualname.split()[0]))
        else:
            modules.append(line.split()[0])
    return modules, names


def documented_whole(path: Path = DATA) -> list[str]:
    """The modules whose every member Theano's reference documents (a bare ``:members:``)."""
    return [line.split()[0] for line in path.read_text(encoding="utf-8").splitlines()
            if line.endswith(" *") and ":" not in line and not line.startswith("#")]


def members_of_whole(path: Path = DATA) -> list[Name]:
    """The names that come from a bare ``:members:`` (found in Theano's source)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.endswith(" *") and ":" in line and not line.startswith("#"):
            module, qualname = line.split()[0].split(":", 1)
            out.append(Name(module, qualname))
    return out


# ---------------------------------------------------------------------------------------------
# status in symgpu

def ours(module: str) -> str:
    """symgpu's path for Theano's `module`."""
    return "symgpu" + module[len("theano"):]


def resolve_module(module: str):
    """symgpu's module for Theano's `module` (ImportError if none)."""
    if module in MODULE_ATTRIBUTES:
        obj = importlib.import_module("symgpu")
        for attr in MODULE_ATTRIBUTES[module]:
            obj = getattr(obj, attr)
        return obj
    try:
        return importlib.import_module(ours(module))
    except ImportError:
        raise
    except Exception as exc:  # a module that fails on import is not there: reported as missing
        raise ImportError(f"{ours(module)}: {exc!r}") from exc


def resolves(name: Name) -> bool:
    """Whether `name` resolves under ``symgpu.`` in place of ``theano.``."""
    try:
        obj = resolve_module(name.module)
    except (ImportError, AttributeError):
        return False
    parts = name.qualname.split(".")
    for k, attr in enumerate(parts):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            owner = f"{name.module}:{'.'.join(parts[:k])}"
            make = _instances().get(owner) if k and isinstance(obj, type) else None
            if make is None:
                return False
            instance = make(obj)  # a member set in __init__: look on an instance
            return isinstance(instance, obj) and _has(instance, parts[k:])
        except Exception:  # a property that fails here still exists: any error but
            return True    # AttributeError means the name is there
    return True


def _has(obj, attrs: list[str]) -> bool:
    for attr in attrs:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            return False
    return True


def other_issue(name: Name) -> bool:
    """Whether `name` belongs to the issue "The rest of Theano's library"."""
    for entry in OTHER_ISSUE:
        if ":" in entry:
            if str(name) == entry or str(name).startswith(entry + "."):
                return True
        elif name.module == entry or name.module.startswith(entry + "."):
            return True
    return False


def absence(name: Name) -> str | None:
    """The reason `name` is deliberately absent, or None."""
    sys.path.insert(0, str(TOOLS))
    try:
        import theano_absent  # the table beside this file
    finally:
        sys.path.remove(str(TOOLS))
    return theano_absent.reason(name.module, name.qualname)


def status(name: Name) -> tuple[str, str | None]:
    """('present', None), ('absent', reason) or ('missing', None)."""
    if resolves(name):
        return "present", None
    reason = absence(name)
    if reason is not None:
        return "absent", reason
    return "missing", None


def module_status(module: str) -> tuple[str, str | None]:
    """A documented module's status: ('present', None) where it imports under ``symgpu.``,
    ('absent', reason) or ('missing', None)."""
    try:
        resolve_module(module)
        return "present", None
    except (ImportError, AttributeError):
        reason = absence(Name(module, ""))
        return ("absent", reason) if reason is not None else ("missing", None)


@dataclass
class Report:
    names: list[Name]
    statuses: dict[Name, tuple[str, str | None]]

    def rows(self, other: bool) -> dict[str, Counter]:
        """module -> Counter of statuses, for this issue's names (other=False) or the other's."""
        table: dict[str, Counter] = defaultdict(Counter)
        for name in self.names:
            if other_issue(name) == other:
                table[name.module][self.statuses[name][0]] += 1
        return dict(sorted(table.items()))

    def totals(self, other: bool) -> Counter:
        total: Counter = Counter()
        for counts in self.rows(other).values():
            total.update(counts)
        return total

    def coverage(self, other: bool = False) -> float:
        """Per cent of the documented names present or deliberately absent."""
        t = self.totals(other)
        documented = sum(t.values())
        return 100.0 * (t["present"] + t["absent"]) / documented if documented else 100.0

    def present_share(self, other: bool = False) -> float:
        t = self.totals(other)
        documented = sum(t.values())
        return 100.0 * t["present"] / documented if documented else 100.0


def report(names: list[Name] | None = None) -> Report:
    if names is None:
        names = load()[1]
    return Report(names, {name: status(name) for name in names})


def _table(rep: Report, other: bool, out) -> None:
    print(f"{'module':44} {'documented':>10} {'present':>8} {'absent':>7} {'missing':>8}",
          file=out)
    for module, c in rep.rows(other).items():
        print(f"{module:44} {sum(c.values()):>10} {c['present']:>8} {c['absent']:>7} "
              f"{c['missing']:>8}", file=out)
    t = rep.totals(other)
    print(f"{'total':44} {sum(t.values()):>10} {t['present']:>8} {t['absent']:>7} "
          f"{t['missing']:>8}", file=out)
    print(f"present: {rep.present_share(other):.1f}%; present or deliberately absent: "
          f"{rep.coverage(other):.1f}%", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--missing", action="store_true", help="list every missing name")
    parser.add_argument("--absent", action="store_true",
                        help="list every deliberate absence with its reason")
    parser.add_argument("--extract", metavar="CHECKOUT", type=Path,
                        help="re-extract the data file from a checkout of Theano")
    parser.add_argument("--theano-python", metavar="PYTHON", default=sys.executable,
                        help="with --extract: a Python that imports the checkout's Theano (its "
                             "dependencies installed), to list the members of the modules "
                             "documented by a bare :members:")
    args = parser.parse_args(argv)
    out = sys.stdout
    if args.extract:
        modules, names, whole = extract(args.extract)
        found = module_members(args.extract, whole, args.theano_python)
        members = [Name(m, member) for m in whole for member in found[m]]
        write_data(modules, names, whole, members=members)
        print(f"{len(modules)} modules, {len(names)} names, {len(members)} members of "
              f"{len(whole)} modules documented whole -> {DATA.relative_to(ROOT)}", file=out)
        return 0
    sys.path.insert(0, str(ROOT))  # run from anywhere: symgpu is the checkout's
    modules, names = load()
    rep = report(names)
    print("Theano 1.0.5's documented names (doc/library) in symgpu", file=out)
    print("\nThis issue (\"Code written for Theano runs unchanged\"):", file=out)
    _table(rep, False, out)
    print("\nThe other issue (\"The rest of Theano's library\"):", file=out)
    _table(rep, True, out)
    for other in (False, True):
        states = {module: module_status(module) for module in modules
                  if other_issue(Name(module, "")) == other}
        counts = Counter(state for state, _ in states.values())
        print(f"\nmodules documented{' (other issue)' if other else ''}: {len(states)}; "
              f"importable: {counts['present']}; deliberately absent: {counts['absent']}; "
              f"missing: {counts['missing']}", file=out)
        for module, (state, reason) in states.items():
            if state != "present":
                print(f"  {state}: {module}" + (f" — {reason}" if reason else ""), file=out)
    whole = documented_whole()
    from_members = set(members_of_whole())
    print(f"\nmodules whose every member the reference documents (a bare `:members:`; their "
          f"members, found in Theano's source, are counted above): {len(whole)}", file=out)
    for module in whole:
        c = Counter(rep.statuses[n][0] for n in names if n in from_members and n.module == module)
        print(f"  {module:42} {sum(c.values()):>4} members: {c['present']} present, "
              f"{c['absent']} absent, {c['missing']} missing"
              + (" [other issue]" if other_issue(Name(module, "")) else ""), file=out)
    for flag, wanted in ((args.absent, "absent"), (args.missing, "missing")):
        if not flag:
            continue
        print(f"\n{wanted}:", file=out)
        for name in names:
            state, reason = rep.statuses[name]
            if state == wanted:
                tag = " [other issue]" if other_issue(name) else ""
                print(f"  {name}{tag}" + (f" — {reason}" if reason else ""), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
