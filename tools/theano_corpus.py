"""Theano 1.0's own tests run on symgpu through the ``theano`` alias: a pass rate per module.

Issue 31 takes Theano's tests of ``tensor``, ``tensor.nnet``, ``scan_module``, ``compile``,
``gradient`` and ``printing`` as the corpus of the behaviour symgpu promises. This tool copies
those test files (and the helpers beside them: Theano's ``theano/tests/unittest_tools.py``, the
test packages' ``__init__``) out of a checkout of Theano into a scratch directory, and runs
each file with pytest in a subprocess of its own in which ``theano`` is symgpu, as
tools/theano_tutorial.py runs the tutorial (``sys.modules['theano'] = symgpu``; the module-path
table symgpu/theano_paths.py does the rest). The copied test packages themselves
(``theano.tensor.tests`` ...) load from the scratch directory: they are the corpus, not the
library. Nothing is committed from the checkout (CI has none): without it the tool says so and
stops. ::

    python tools/theano_corpus.py                     # every module; writes the summary file
    python tools/theano_corpus.py --module tensor     # one module (repeatable)
    python tools/theano_corpus.py --files test_var.py test_io.py   # only these file names
    python tools/theano_corpus.py --timeout 120 --workers 2 --top 40

Theano's tests are nose-era: they need ``nose`` (``assert_raises``, ``SkipTest``, ``attr``),
``parameterized`` and ``mock``, test-only packages that symgpu does not depend on. Install them
once beside the tool (``pip install --target /tmp/theano-corpus-deps nose parameterized mock``)
or name another directory with ``--deps``; the subprocesses get it on their path.

Each file runs under a wall-clock limit (``--timeout``; pytest-timeout is not used): the tests a
file finished before its limit keep their outcomes, the rest count as failed in the group
``timeout``. A failure's group is its first error line (the exception's type and message, with
addresses and temporary names blurred); INTERNALS labels the groups that test Theano's
internals (its C code, CLinker, its GPU back end, optimizer names of its own) with the reason
they are not behaviour a Theano user relies on. The summary (per module: collected, passed,
failed, errors, skipped, pass rate; then the groups by count) goes to stdout and to
tools/theano_corpus_summary.txt.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_outcomes import OUTCOME_HELPERS, group_key
from pytest_outcomes import internals_reason as _internals_reason

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
SUMMARY = TOOLS / "theano_corpus_summary.txt"
MIRROR = Path("/work/.mirror/Theano+Theano/repo")
DEPS = Path("/tmp/theano-corpus-deps")
ORACLE = Path("/work/shared/tools/theano-oracle.sh")   # the real Theano 1.0.5 (its header)
#: test file (path in the checkout) -> how many tests the real Theano collects from it
COUNTS = TOOLS / "theano_corpus_counts.json"

#: module -> the test files (or test directories) of Theano's that make its corpus
MODULES: dict[str, tuple[str, ...]] = {
    "tensor": ("theano/tensor/tests",),
    "tensor.nnet": ("theano/tensor/nnet/tests",),
    "scan_module": ("theano/scan_module/tests",),
    "compile": ("theano/compile/tests",),
    "gradient": ("theano/tests/test_gradient.py",),
    "printing": ("theano/tests/test_printing.py",),
}
#: test helpers of Theano's that the corpus imports (copied, never run as tests)
HELPERS = ("theano/tests/unittest_tools.py",)

#: a group's first-line pattern -> why it tests Theano's internals, not behaviour of its users
INTERNALS: dict[str, str] = {
    r"theano\.gof\.(cc|cmodule|lazylinker_c|cutils)|CLinker|OpWiseCLinker|c_code|"
    r"DualLinker|cmodule":
        "Theano's C back end (CLinker, generated C code): symgpu runs host ops in NumPy",
    r"theano\.(gpuarray|sandbox\.cuda)|pygpu|GpuArrayType.*context_name":
        "Theano's own GPU back end (pygpu / libgpuarray): symgpu's is PyCUDA",
    r"blas_c|CGemv|CGer|blas_scipy|ScipyGer|Gemm\{|gemm_inplace|_dot22|Dot22Scalar":
        "Theano's BLAS op names and their C/SciPy implementations",
}



def test_files(checkout: Path, modules: tuple[str, ...]) -> dict[str, list[str]]:
    """module -> the paths (in the checkout) of its ``test_*.py`` files."""
    listing = _git(checkout, "ls-tree", "-r", "--name-only", "HEAD").split()
    out: dict[str, list[str]] = {}
    for module in modules:
        paths = []
        for spec in MODULES[module]:
            if spec.endswith(".py"):
                paths.append(spec)
            else:
                paths += [p for p in listing if p.startswith(spec + "/") and p.count("/") ==
                          spec.count("/") + 1 and Path(p).name.startswith("test_")]
        out[module] = sorted(paths)
    return out


def _git(checkout: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True,
                          text=True).stdout


def extract(checkout: Path, scratch: Path, modules: tuple[str, ...]) -> dict[str, list[Path]]:
    """Copies the corpus of `modules` (every ``.py`` of its test directories, and HELPERS) into
    `scratch` under Theano's layout, with the conftest that aliases ``theano``; module -> the
    scratch paths of its test files."""
    listing = _git(checkout, "ls-tree", "-r", "--name-only", "HEAD").split()
    dirs = {spec if not spec.endswith(".py") else str(Path(spec).parent)
            for m in modules for spec in MODULES[m]}
    wanted = set(HELPERS) | {p for p in listing if p.endswith(".py") and str(Path(p).parent) in
                             dirs and not p.endswith("theano/tests/__init__.py")}
    for path in sorted(wanted):
        target = scratch / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_git(checkout, "show", f"HEAD:{path}"))
    # empty packages above the test packages: pytest names a test file by its package path
    for path in list(scratch.rglob("*.py")):
        for parent in path.relative_to(scratch).parents:
            if str(parent) != ".":
                (scratch / parent / "__init__.py").touch(exist_ok=True)
    (scratch / "conftest.py").write_text(CONFTEST)
    (scratch / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no project's ini above
    return {m: [scratch / p for p in ps] for m, ps in test_files(checkout, modules).items()}


# The conftest of the scratch directory: `theano` is symgpu (tools/theano_tutorial.py's way);
# the copied test packages (a path with a `tests` part, e.g. theano.tensor.tests.test_basic,
# theano.tests.unittest_tools) load from the scratch files; each test's outcome is appended to
# $THEANO_CORPUS_LOG as it ends, so that a file stopped at its time limit keeps what it ran.
CONFTEST = r'''
import importlib.abc, importlib.util, json, os, sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if os.environ.get("THEANO_CORPUS_ORACLE"):   # the real Theano, not the scratch packages' stubs
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    import theano
    sys.path.insert(0, str(_HERE))
else:
    import symgpu
    sys.modules["theano"] = symgpu
_LOG = os.environ.get("THEANO_CORPUS_LOG")


class _CorpusFinder(importlib.abc.MetaPathFinder):
    """Theano's test packages, from the copied files (the library is symgpu's alias)."""

    def find_spec(self, fullname, path, target=None):
        # `from theano.tests import unittest_tools` asks for it under the aliased package's
        # own name (symgpu.tests.unittest_tools)
        parts = fullname.split(".")
        if parts[0] not in ("theano", "symgpu") or "tests" not in parts or len(parts) < 3 \
                and parts[1] == "tests":
            return None
        base = _HERE.joinpath("theano", *parts[1:])
        if (base / "__init__.py").exists():
            return importlib.util.spec_from_file_location(
                fullname, base / "__init__.py", submodule_search_locations=[str(base)])
        if base.with_suffix(".py").exists():
            return importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"))
        return None


sys.meta_path.insert(0, _CorpusFinder())

# NumPy < 1.18's numpy.testing.dec, which the tests (written for NumPy 1.13) decorate with: the
# test runner's environment, not the library under test
import numpy.testing, pytest
if not hasattr(numpy.testing, "dec"):
    class _Dec:
        @staticmethod
        def skipif(condition, msg=""):
            return pytest.mark.skipif(bool(condition() if callable(condition) else condition),
                                      reason=msg or "numpy.testing.dec.skipif")

        @staticmethod
        def knownfailureif(condition, msg=""):
            return pytest.mark.xfail(bool(condition() if callable(condition) else condition),
                                     reason=msg or "known failure", strict=False)

        @staticmethod
        def slow(f):
            return f
    numpy.testing.dec = _Dec()


# nose's conventions, which the tests (written for nose) rely on and pytest 8+ dropped: a test
# that yields (func, *args) checks runs each of them (here as one test), and a plain test class's
# setUp/setup and tearDown/teardown run around each of its tests
import inspect, unittest


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    if not (inspect.isgeneratorfunction(obj) and collector.funcnamefilter(name)):
        return None
    if isinstance(collector, pytest.Class) and issubclass(collector.obj, unittest.TestCase):
        return None

    def nose_yield_test(request, _gen=obj):
        checks = _gen(request.instance) if request.instance is not None else _gen()
        for check in checks:
            check[0](*check[1:])
    return pytest.Function.from_parent(collector, name=name, callobj=nose_yield_test)


@pytest.fixture(autouse=True)
def _nose_setup(request):
    inst = request.instance
    if inst is None or isinstance(inst, unittest.TestCase):
        yield
        return
    for name in ("setUp", "setup"):
        if callable(getattr(inst, name, None)) and not hasattr(type(inst), "setup_method"):
            getattr(inst, name)()
            break
    yield
    for name in ("tearDown", "teardown"):
        if callable(getattr(inst, name, None)) and not hasattr(type(inst), "teardown_method"):
            getattr(inst, name)()
            break
''' + OUTCOME_HELPERS + r'''


def pytest_collection_modifyitems(session, config, items):
    _log("", "collected", str(len(items)))


def pytest_collectreport(report):
    if report.failed:
        _log(report.nodeid, "error", _first_line(report))


def pytest_runtest_logreport(report):
    if report.when == "call":
        if report.passed:
            _log(report.nodeid, "xpassed" if hasattr(report, "wasxfail") else "passed")
        elif report.skipped:
            _log(report.nodeid, "skipped", _first_line(report))
        else:
            _log(report.nodeid, "failed", _first_line(report))
    elif report.failed:
        _log(report.nodeid, "error", _first_line(report))
    elif report.skipped and report.when == "setup":
        _log(report.nodeid, "skipped", _first_line(report))
'''


def internals_reason(key: str) -> str | None:
    """Why the group `key` tests Theano's internals (INTERNALS), or None."""
    return _internals_reason(key, INTERNALS)


def run_file(path: Path, scratch: Path, timeout: float, deps: Path | None,
             expected: int | None = None, oracle: bool = False) -> dict:
    """Runs one test file in its own pytest subprocess; its tallies and failure lines. With
    `oracle`, only collects it under the real Theano (ORACLE), to count its tests."""
    fd, log = tempfile.mkstemp(suffix=".jsonl", prefix="corpus-")
    os.close(fd)
    paths = [str(ROOT)] + ([str(deps)] if deps else [])
    env = dict(os.environ, THEANO_CORPUS_LOG=log, MPLBACKEND="Agg",
               **({"THEANO_CORPUS_ORACLE": "1"} if oracle else {}),
               PYTHONPATH=os.pathsep.join(paths + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    python = ["bash", str(ORACLE), "python"] if oracle else [sys.executable]
    cmd = python + ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                    "--rootdir", str(scratch), "-W", "ignore", str(path)]
    cmd += ["--collect-only"] if oracle else []
    start, timed_out = time.monotonic(), False
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=timeout)
        tail = proc.stdout[-2000:] + proc.stderr[-2000:]
    except subprocess.TimeoutExpired:
        timed_out, tail = True, ""
    records = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    os.unlink(log)
    result = tally(path.name, records, timed_out, timeout, tail, time.monotonic() - start,
                   expected)
    result["path"] = str(path.relative_to(scratch))
    return result


def tally(name: str, records: list[dict], timed_out: bool = False, timeout: float = 0,
          tail: str = "", seconds: float = 0.0, expected: int | None = None) -> dict:
    """The counts of one file from its log records (see CONFTEST); a test that never reported
    (the file stopped at its time limit, or pytest died) counts as failed in its group. A file
    that does not import counts its `expected` tests (COUNTS: what Theano itself collects) as
    errors in the import error's group; without a count, as one error."""
    counts = collections.Counter(collected=0, passed=0, failed=0, errors=0, skipped=0)
    groups: collections.Counter = collections.Counter()
    seen: dict[str, str] = {}
    import_failed = False
    for r in records:
        if r["outcome"] == "collected":
            counts["collected"] = max(counts["collected"], int(r["first"]))
            continue
        if r["outcome"] == "error" and r["id"] in seen:   # a teardown error after a call
            if seen[r["id"]] == "passed":
                counts["passed"] -= 1
            elif seen[r["id"]] == "failed":
                continue
            counts["errors"] += 1
            groups[group_key(r["first"])] += 1
            seen[r["id"]] = "error"
            continue
        seen[r["id"]] = r["outcome"]
        if r["outcome"] in ("passed", "xpassed"):
            counts["passed"] += 1
        elif r["outcome"] == "skipped":
            counts["skipped"] += 1
        else:
            n = 1
            if "::" not in r["id"]:   # a collection error: the file (or a class) did not load
                import_failed = True
            if "::" not in r["id"] and not counts["collected"] and expected:
                n = expected   # the file did not import: none of its tests ran
                counts["collected"] = expected
            counts["failed" if r["outcome"] == "failed" else "errors"] += n
            groups[group_key(r["first"])] += n
    ran = counts["passed"] + counts["failed"] + counts["skipped"] + sum(
        1 for i, o in seen.items() if o == "error" and "::" in i)
    missing = 0 if import_failed else max(0, counts["collected"] - ran)
    if missing:
        why = (f"timeout: the file passed its {timeout:g} s limit" if timed_out else
               "never reported: pytest stopped (" + (tail.strip().splitlines() or ["?"])[-1]
               + ")")
        counts["failed"] += missing
        groups[group_key(why)] += missing
    elif timed_out and not counts["collected"]:
        counts["errors"] += 1
        groups[group_key(f"timeout: the file passed its {timeout:g} s limit")] += 1
    return {"file": name, "counts": dict(counts), "groups": dict(groups), "seconds": seconds}


def combine(results: list[dict]) -> dict:
    counts = collections.Counter(collected=0, passed=0, failed=0, errors=0, skipped=0)
    groups: collections.Counter = collections.Counter()
    for r in results:
        counts.update(r["counts"])
        groups.update(r["groups"])
    return {"counts": dict(counts), "groups": dict(groups)}


def rate(counts: dict) -> float:
    """Passed over what ran: collected less skipped, a file's collection error counting one."""
    ran = counts["passed"] + counts["failed"] + counts["errors"]
    return 100.0 * counts["passed"] / ran if ran else 100.0


def report(by_module: dict[str, list[dict]], top: int, per_file: bool) -> str:
    lines = ["Theano 1.0's tests through the `theano` alias (tools/theano_corpus.py)", "",
             f"{'module':14} {'collected':>9} {'passed':>7} {'failed':>7} {'errors':>7} "
             f"{'skipped':>7} {'rate':>7}"]
    total: list[dict] = []
    for module, results in by_module.items():
        c = combine(results)["counts"]
        total += results
        lines.append(f"{module:14} {c['collected']:9} {c['passed']:7} {c['failed']:7} "
                     f"{c['errors']:7} {c['skipped']:7} {rate(c):6.1f}%")
    c = combine(total)["counts"]
    lines.append(f"{'total':14} {c['collected']:9} {c['passed']:7} {c['failed']:7} "
                 f"{c['errors']:7} {c['skipped']:7} {rate(c):6.1f}%")
    if per_file:
        lines += ["", "per file:"]
        for module, results in by_module.items():
            for r in results:
                rc = r["counts"]
                lines.append(f"  {module:12} {r['file']:32} {rc['collected']:5} "
                             f"{rc['passed']:5} {rc['failed']:5} {rc['errors']:5} "
                             f"{rc['skipped']:5} {rate(rc):6.1f}% {r['seconds']:6.0f}s")
    for module, results in by_module.items():
        groups = combine(results)["groups"]
        if not groups:
            continue
        lines += ["", f"{module}: failures and errors by first error line (count; the "
                      f"{top} largest of {len(groups)} groups)"]
        for key, n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
            why = internals_reason(key)
            lines.append(f"  {n:5}  {key}" + (f"\n         [Theano internals: {why}]"
                                              if why else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="a git checkout of Theano")
    parser.add_argument("--module", action="append", choices=tuple(MODULES),
                        help="only this module (repeatable)")
    parser.add_argument("--files", nargs="*", help="only test files with these names")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=25, help="groups listed per module")
    parser.add_argument("--deps", type=Path, default=DEPS,
                        help="directory holding nose, parameterized and mock")
    parser.add_argument("--per-file", action="store_true", help="a line per test file")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--no-save", action="store_true", help=f"do not write {SUMMARY.name}")
    parser.add_argument("--oracle-counts", action="store_true",
                        help=f"collect each file under the real Theano ({ORACLE}) and write "
                             f"{COUNTS.name}")
    args = parser.parse_args(argv)
    if not (args.mirror / "HEAD").exists() and not (args.mirror / ".git").exists():
        print(f"theano_corpus: no checkout of Theano at {args.mirror} (pass --mirror); "
              "nothing run")
        return 0
    deps = args.deps if args.deps and args.deps.is_dir() else None
    probe = subprocess.run([sys.executable, "-c", "import nose.tools, parameterized"],
                           env=dict(os.environ, PYTHONPATH=str(deps or "")), capture_output=True)
    if probe.returncode:
        print("theano_corpus: Theano's tests need nose and parameterized: pip install --target "
              f"{DEPS} nose parameterized mock (or pass --deps DIR); nothing run")
        return 0
    modules = tuple(args.module or MODULES)
    scratch = Path(tempfile.mkdtemp(prefix="theano-corpus-"))
    try:
        files = extract(args.mirror, scratch, modules)
        jobs = [(m, p) for m in modules for p in files[m]
                if not args.files or p.name in args.files]
        expected = json.loads(COUNTS.read_text()) if COUNTS.exists() else {}
        by_module: dict[str, list[dict]] = {m: [] for m in modules}
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            futures = {pool.submit(run_file, p, scratch, args.timeout, deps,
                                   expected.get(str(p.relative_to(scratch))),
                                   args.oracle_counts): (m, p)
                       for m, p in jobs}
            for future in concurrent.futures.as_completed(futures):
                module, path = futures[future]
                result = future.result()
                by_module[module].append(result)
                c = result["counts"]
                print(f"  ran {module}/{path.name}: {c['passed']}/{c['collected']} passed "
                      f"({result['seconds']:.0f} s)", file=sys.stderr, flush=True)
        for results in by_module.values():
            results.sort(key=lambda r: r["file"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.oracle_counts:
        counts = {r["path"]: r["counts"]["collected"]
                  for m, rs in by_module.items() for r in rs}
        COUNTS.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
        print(f"{sum(counts.values())} tests in {len(counts)} files -> {COUNTS}")
        return 0
    text = report({m: r for m, r in by_module.items() if r}, args.top, args.per_file)
    sys.stdout.write(text)
    if args.json:
        args.json.write_text(json.dumps(by_module, indent=1))
    if not args.no_save and not args.files:
        SUMMARY.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
