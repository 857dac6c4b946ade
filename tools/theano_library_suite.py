"""A Theano-based library's own test suite, run on symgpu (``theano`` aliased) and on Theano.

Issue 31 asks that a library written for Theano pass its own tests on symgpu at least as well
as on Theano 1.0.5 on the same machine. The library is Lasagne: this tool extracts it from a
git checkout (a bare mirror will do) into a scratch directory and runs ``lasagne/tests`` with
pytest, once with ``theano`` aliased to symgpu (``sys.modules['theano'] = symgpu``; the path
table symgpu/theano_paths.py does the rest) and, with ``--oracle``, once under the real Theano
(/work/shared/tools/theano-oracle.sh). Each run is one pytest process under a wall-clock
limit; every test's outcome is logged as it ends, so a run stopped at its limit keeps what it
ran. ::

    python tools/theano_library_suite.py                 # symgpu; compares with the oracle file
    python tools/theano_library_suite.py --oracle        # also Theano; rewrites the oracle file
    python tools/theano_library_suite.py --files test_updates.py   # only these test files
    python tools/theano_library_suite.py --oracle-no-c test_recurrent.py   # Theano without C
    python tools/theano_library_suite.py --device cuda --jobs 8 --mirror .lasagne \
        --summary /tmp/out/lasagne_cuda.txt        # on the GPU machine, files in 8 processes

The oracle's per-test outcomes are kept in tools/theano_library_suite_oracle.json (committed),
so a symgpu run lists the tests that pass with Theano and not with symgpu without Theano being
installed. The summary (per test file: passed / failed / errors / skipped, both runs; those
tests, grouped by their first error line; the tests that assert Theano internals symgpu
deliberately lacks, with the reason) goes to stdout and tools/theano_library_suite_summary.txt.

The tests need ``mock`` (Lasagne's test dependency, not symgpu's): ``pip install --target
/tmp/lasagne-deps mock`` (or ``--deps DIR``). The suite dates from 2019 (pytest 3, NumPy 1.16);
PATCHES lists the few edits that let it run under today's pytest and NumPy at all, applied
alike to both runs: they change the test runner's environment, not what a test asserts.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from pytest_outcomes import OUTCOME_HELPERS, group_key
from pytest_outcomes import internals_reason as _internals_reason

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
SUMMARY = TOOLS / "theano_library_suite_summary.txt"
ORACLE_FILE = TOOLS / "theano_library_suite_oracle.json"
MIRROR = Path("/work/.mirror/Lasagne+Lasagne/repo")
DEPS = Path("/tmp/lasagne-deps")
ORACLE = Path("/work/shared/tools/theano-oracle.sh")   # the real Theano 1.0.5 (its header)

#: (file in the checkout, old text, new text, why): the suite's incompatibilities with today's
#: pytest and NumPy, fixed alike for both runs
PATCHES: tuple[tuple[str, str, str, str], ...] = (
    ("lasagne/conftest.py", "def pytest_ignore_collect(path, config):",
     "def pytest_ignore_collect(collection_path, config):\n    import py\n"
     "    path = py.path.local(str(collection_path))",
     "pytest 9 rejects the `path` argument of this hook (deprecated since pytest 7)"),
    ("lasagne/conftest.py", "return any(path.fnmatch(ignore) for ignore in ignore_test_paths)",
     "return any(path.fnmatch(ignore) for ignore in ignore_test_paths) or None",
     "pytest 9: False would stop other plugins from deciding"),
    ("lasagne/tests/layers/test_conv.py", "output = output[slices]",
     "output = output[tuple(slices)]",
     "NumPy >= 1.23 refuses a list of slices as an index (the test's reference convolution)"),
    ("lasagne/tests/layers/test_conv.py",
     "output[[slice(None, None, factor) for factor in factors]] = input",
     "output[tuple(slice(None, None, factor) for factor in factors)] = input",
     "the same, in the test's reference dilation"),
)

#: a group's first-line pattern -> why the test asserts a Theano internal symgpu lacks on purpose
#: (none of the groups on this machine: each difference found was a behaviour, now fixed)
INTERNALS: dict[str, str] = {}

#: what the summary says beyond the counts
NOTES = (
    "On this machine (no GPU) both runs skip the GPU layers' tests (lasagne.layers.dnn, "
    "corrmm, cuda_convnet): gpuarray.pygpu_activated is False. With device=cuda, symgpu's "
    "pygpu_activated and dnn.dnn_present() are True, so lasagne.layers.dnn builds its layers "
    "on symgpu's dnn_* functions and lasagne.layers.corrmm on gpu.blas.GpuCorrMM (our "
    "convolution without the flip); those tests are not compared here.",
)

#: what a run under device=cuda says beyond the counts (its Theano column is a CPU run)
NOTES_CUDA = (
    "Under device=cuda, lasagne.layers.dnn and corrmm build on symgpu's cuDNN and GpuCorrMM, so "
    "the GPU layers' tests run (Theano's CPU run skipped them). The test_import_without_gpu_* "
    "tests skip themselves where a GPU and cuDNN are present: they check the error raised "
    "without one.",
    "A function whose output is a shared variable itself returns its GpuArray, as Theano's "
    "GpuArrayType does; comparing that with a NumPy array of more than one element fails, as "
    "it does under Theano on a GPU (pygpu's elemwise passes a non-GpuArray operand to its "
    "kernel as a scalar argument): symgpu raises a TypeError that names the fix.",
)


# The scratch directory's conftest: `theano` is symgpu unless the run is the oracle's; every
# test's outcome goes to $LIBRARY_SUITE_LOG as it ends.
CONFTEST = r'''
import json, os, sys
if not os.environ.get("LIBRARY_SUITE_ORACLE"):
    import symgpu
    sys.modules["theano"] = symgpu
import theano   # before the library's conftest imports it

_LOG = os.environ.get("LIBRARY_SUITE_LOG")
''' + OUTCOME_HELPERS + r'''


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        _log(item.nodeid, "collected")


def pytest_collectreport(report):
    if report.failed:
        _log(report.nodeid, "error", _first_line(report))


def pytest_runtest_logreport(report):
    if report.when == "call":
        if report.passed:
            _log(report.nodeid, "passed")
        elif report.skipped:
            _log(report.nodeid, "xfailed" if hasattr(report, "wasxfail") else "skipped",
                 _first_line(report))
        else:
            _log(report.nodeid, "failed", _first_line(report))
    elif report.failed:
        _log(report.nodeid, "error", _first_line(report))
    elif report.skipped and report.when == "setup":
        _log(report.nodeid, "skipped", _first_line(report))
'''


def extract(checkout: Path, scratch: Path) -> None:
    """The library's files at HEAD of `checkout` into `scratch`, patched (PATCHES), with the
    conftest that aliases ``theano`` and an empty pytest.ini (the library's setup.cfg asks for
    coverage and pep8 plugins, which are not the tests)."""
    if (checkout / "lasagne" / "tests").is_dir():   # an extracted tree (a machine without git)
        shutil.copytree(checkout, scratch, dirs_exist_ok=True)
    else:
        archive = subprocess.run(["git", "--git-dir", str(_git_dir(checkout)), "archive",
                                  "HEAD"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    for rel, old, new, _why in PATCHES:
        path = scratch / rel
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"theano_library_suite: patch for {rel} no longer applies: {old!r}")
        path.write_text(text.replace(old, new))
    (scratch / "setup.cfg").unlink(missing_ok=True)
    (scratch / "conftest.py").write_text(CONFTEST)
    (scratch / "pytest.ini").write_text("[pytest]\n")


def _git_dir(checkout: Path) -> Path:
    return checkout / ".git" if (checkout / ".git").exists() else checkout


def test_files(scratch: Path) -> list[str]:
    """The suite's test files, relative to the scratch directory, largest first (so that the
    processes of a parallel run finish together)."""
    found = sorted((scratch / "lasagne/tests").rglob("test_*.py"),
                   key=lambda p: -p.stat().st_size)
    return [p.name for p in found]


def run_parallel(scratch: Path, timeout: float, deps: Path | None, files: list[str] | None,
                 jobs: int, extra_env: dict[str, str]) -> dict[str, dict]:
    """The suite's files dealt over `jobs` pytest processes (each as `run_suite` runs one),
    their outcomes merged: a run that must fit one call on the GPU machine."""
    from concurrent.futures import ThreadPoolExecutor
    names = files or test_files(scratch)
    shares = [names[k::jobs] for k in range(jobs) if names[k::jobs]]
    with ThreadPoolExecutor(len(shares)) as pool:
        parts = pool.map(lambda share: run_suite(scratch, timeout, deps, False, share,
                                                 extra_env), shares)
        merged: dict[str, dict] = {}
        for part in parts:
            merged.update(part)
    return merged


def run_suite(scratch: Path, timeout: float, deps: Path | None, oracle: bool,
              files: list[str] | None, extra_env: dict[str, str] | None = None
              ) -> dict[str, dict]:
    """One pytest run over the suite (or the test files named `files`); test id ->
    {"outcome", "first"}. Tests collected but never reported (the run hit its limit, or
    pytest died) are failed, with the reason."""
    fd, log = tempfile.mkstemp(suffix=".jsonl", prefix="library-suite-")
    os.close(fd)
    paths = [str(ROOT)] + ([str(deps)] if deps else [])
    env = dict(os.environ, LIBRARY_SUITE_LOG=log, MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(paths + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    if oracle:
        env["LIBRARY_SUITE_ORACLE"] = "1"
        env["PYTHONPATH"] = str(deps) if deps else ""
    env.update(extra_env or {})
    python = ["bash", str(ORACLE), "python"] if oracle else [sys.executable]
    targets = ([str(p) for f in files for p in (scratch / "lasagne/tests").rglob(f)]
               if files else ["lasagne/tests"])
    cmd = python + ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                    "-c", str(scratch / "pytest.ini"), "--rootdir", str(scratch), "-W", "ignore",
                    "--continue-on-collection-errors", *targets]
    timed_out, tail = False, ""
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True,
                              timeout=timeout)
        tail = (proc.stdout[-1000:] + proc.stderr[-1000:]).strip()
    except subprocess.TimeoutExpired:
        timed_out = True
    records = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    os.unlink(log)
    return outcomes(records, timed_out, timeout, tail)


def outcomes(records: list[dict], timed_out: bool = False, timeout: float = 0,
             tail: str = "") -> dict[str, dict]:
    """Test id -> its outcome from the log records: a teardown error after a pass makes an
    error; a file that did not import is one error under its own id."""
    result: dict[str, dict] = {}
    for r in records:
        if r["outcome"] == "collected":
            result.setdefault(r["id"], {"outcome": "unreported", "first": ""})
        elif r["outcome"] == "error" and result.get(r["id"], {}).get("outcome") == "failed":
            continue
        else:
            result[r["id"]] = {"outcome": r["outcome"], "first": r["first"]}
    why = (f"timeout: the run passed its {timeout:g} s limit" if timed_out else
           "never reported: pytest stopped (" + (tail.splitlines() or ["?"])[-1] + ")")
    for r in result.values():
        if r["outcome"] == "unreported":
            r.update(outcome="failed", first=why)
    return result


def expand_import_errors(ours: dict[str, dict], theirs: dict[str, dict]) -> dict[str, dict]:
    """`ours` where a test file did not import: its tests (as the oracle collected them) each
    count as an error of that import error, instead of one error for the file."""
    out = dict(ours)
    for test_id, r in ours.items():
        if "::" in test_id or r["outcome"] != "error":
            continue
        tests = [t for t in theirs if t.split("::")[0] == test_id and t not in ours]
        if tests:
            del out[test_id]
            out.update({t: dict(r) for t in tests})
    return out


def file_of(test_id: str) -> str:
    return test_id.split("::")[0].replace("lasagne/tests/", "")


def counts_by_file(results: dict[str, dict]) -> dict[str, collections.Counter]:
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for test_id, r in results.items():
        kind = {"passed": "passed", "failed": "failed", "error": "errors",
                "skipped": "skipped", "xfailed": "skipped"}[r["outcome"]]
        table[file_of(test_id)][kind] += 1
    return table


def internals_reason(key: str) -> str | None:
    """Why the group `key` tests Theano's internals (INTERNALS), or None."""
    return _internals_reason(key, INTERNALS)


def report(ours: dict[str, dict], theirs: dict[str, dict] | None, device: str = "cpu") -> str:
    """The summary text: per-file counts of both runs, then the tests Theano passes and
    symgpu does not, grouped by first error line (largest groups first). With device
    "cuda" the symgpu column ran on the GPU and Theano's is still the oracle's CPU run."""
    if theirs is not None:
        ours, theirs = expand_import_errors(ours, theirs), expand_import_errors(theirs, ours)
    mine, oracle = counts_by_file(ours), counts_by_file(theirs or {})
    where = (" under device=cuda (Theano's column: its CPU run, the oracle file)"
             if device == "cuda" else "")
    lines = ["Lasagne's own test suite (lasagne/tests) on symgpu (`theano` aliased) and on "
             "Theano 1.0.5" + where, "(tools/theano_library_suite.py; columns: passed failed "
             "errors skipped)", "",
             f"{'test file':28} {'symgpu':>23}   {'Theano 1.0.5':>23}"]
    total_m, total_o = collections.Counter(), collections.Counter()
    for name in sorted(set(mine) | set(oracle)):
        m, o = mine.get(name, collections.Counter()), oracle.get(name, collections.Counter())
        total_m.update(m)
        total_o.update(o)
        lines.append(f"{name:28} " + _row(m) + "   " + (_row(o) if theirs else ""))
    lines.append(f"{'total':28} " + _row(total_m) + "   " + (_row(total_o) if theirs else ""))
    no_c = sorted(t for t, r in (theirs or {}).items() if r.get("mode") == "no C")
    if no_c:
        lines.append(f"(Theano's passes include {len(no_c)} from a run without its C code, "
                     "THEANO_ORACLE_SCAN=1: its C scan does not build on Python 3.11; run as "
                     f"is, Theano passes {total_o['passed'] - len(no_c)})")
    lines += ["", "The suite runs with PATCHES applied alike to both runs (today's pytest and "
                  "NumPy):"] + [f"  {rel}: {why}" for rel, _old, _new, why in PATCHES]
    if theirs is None:
        lines += ["", "(no oracle outcomes: run with --oracle once)"]
        return "\n".join(lines) + "\n"
    # a test Theano passes and symgpu does not: failed, an error, or skipped (a library that
    # probes Theano's abilities skips what it finds missing)
    worse = {t: r for t, r in ours.items()
             if r["outcome"] != "passed" and theirs.get(t, {}).get("outcome") == "passed"}
    better = [t for t, r in ours.items() if r["outcome"] == "passed"
              and theirs.get(t, {}).get("outcome") != "passed" and t in theirs]
    lines += ["", f"passed with Theano, not with symgpu: {len(worse)}; passed with symgpu, "
                  f"not with Theano: {len(better)}"]
    if worse and not any(internals_reason(group_key(r["first"])) for r in worse.values()):
        lines.append("  (none of them asserts a Theano internal that symgpu lacks on purpose)")
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for t, r in worse.items():
        groups[group_key(r["first"])].append(t)
    for key, tests in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        why = internals_reason(key)
        lines.append(f"  {len(tests):4}  {key}")
        if why:
            lines.append(f"        [Theano internals: {why}]")
        lines += [f"          {t}" for t in sorted(tests)]
    both = {t: r for t, r in ours.items() if r["outcome"] in ("failed", "error")
            and theirs.get(t, {}).get("outcome") in ("failed", "error")}
    if both:
        lines += ["", f"failed with both: {len(both)}"]
        for t in sorted(both):
            lines.append(f"          {t}  (symgpu: {group_key(both[t]['first'])}; Theano: "
                         f"{group_key(theirs[t]['first'])})")
    unmatched = {t: r for t, r in ours.items() if r["outcome"] in ("failed", "error")
                 and theirs.get(t, {}).get("outcome") not in ("passed", "failed", "error")}
    if unmatched:
        lines += ["", f"failed with symgpu, which Theano skipped or did not run: {len(unmatched)}"]
        lines += [f"          {t}  ({group_key(r['first'])})" for t, r in sorted(unmatched.items())]
    lines += [""] + [textwrap.fill(note, 96) for note in (NOTES if device == "cpu"
                                                            else NOTES_CUDA)]
    if better:
        lines += ["", "passed with symgpu, not with Theano:"]
        lines += [f"          {t}  (Theano: {group_key(theirs[t]['first'])})"
                  for t in sorted(better)]
    return "\n".join(lines) + "\n"


def run_oracle(scratch: Path, args: argparse.Namespace, deps: Path | None,
               known: dict[str, dict]) -> dict[str, dict]:
    """The oracle's outcomes: `known` (the committed file) with the files run now replaced
    (all of them without --files). With --oracle-no-c, those files run once more without
    Theano's C code, and a test that passes there counts as passed (marked ``"mode":
    "no C"``): Theano's best on this machine."""
    theirs = dict(known)
    if args.oracle:
        start = time.monotonic()
        now = run_suite(scratch, args.timeout, deps, True, args.files)
        print(f"  Theano: {len(now)} tests in {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
        ran = {file_of(t) for t in now}
        theirs = {t: r for t, r in theirs.items() if file_of(t) not in ran} | now
    if args.oracle_no_c:
        start = time.monotonic()
        no_c = run_suite(scratch, args.timeout, deps, True, args.oracle_no_c,
                         {"THEANO_ORACLE_SCAN": "1"})
        print(f"  Theano without C: {len(no_c)} tests in {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
        for test_id, r in no_c.items():
            if r["outcome"] == "passed" and theirs.get(test_id, {}).get("outcome") != "passed":
                theirs[test_id] = dict(r, mode="no C")
    return theirs


def _row(c: collections.Counter) -> str:
    return f"{c['passed']:5} {c['failed']:5} {c['errors']:5} {c['skipped']:5}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR,
                        help="a git checkout of Lasagne (bare or not), or an extracted tree")
    parser.add_argument("--files", nargs="*", help="only test files with these names")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--deps", type=Path, default=DEPS, help="directory holding mock")
    parser.add_argument("--oracle", action="store_true",
                        help=f"also run under the real Theano ({ORACLE}) and rewrite "
                             f"{ORACLE_FILE.name}")
    parser.add_argument("--oracle-no-c", nargs="*", metavar="FILE",
                        help="run these test files under Theano again without its C code "
                             "(THEANO_ORACLE_SCAN=1: Theano's C scan does not build on "
                             "Python 3.11); a test passing there passes for Theano")
    parser.add_argument("--json", type=Path, help="also write symgpu's outcomes here")
    parser.add_argument("--no-save", action="store_true", help=f"do not write {SUMMARY.name}")
    parser.add_argument("--summary", type=Path, default=SUMMARY,
                        help="where the summary goes (a run with --device cuda: elsewhere)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="symgpu's device for the suite (SYMGPU_FLAGS device=...); the "
                             "Theano column stays the oracle file's CPU run")
    parser.add_argument("--jobs", type=int, default=1,
                        help="pytest processes, the test files dealt over them")
    args = parser.parse_args(argv)
    if args.device == "cuda" and args.oracle:
        parser.error("--oracle runs Theano on the CPU; with --device cuda use the oracle file")
    device_env = ({"SYMGPU_FLAGS": "device=cuda,floatX=float32"} if args.device == "cuda"
                  else {})
    if not any((args.mirror / p).exists() for p in ("HEAD", ".git", "lasagne/tests")):
        print(f"theano_library_suite: no checkout of Lasagne at {args.mirror} (pass --mirror); "
              "nothing run")
        return 0
    deps = args.deps.resolve() if args.deps and args.deps.is_dir() else None   # pytest runs
    # in the scratch directory: a relative path would not find mock there
    probe = subprocess.run([sys.executable, "-c", "import mock"],
                           env=dict(os.environ, PYTHONPATH=str(deps or "")), capture_output=True)
    if probe.returncode:
        print(f"theano_library_suite: Lasagne's tests need mock: pip install --target {DEPS} "
              "mock (or pass --deps DIR); nothing run")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="library-suite-"))
    try:
        extract(args.mirror, scratch)
        start = time.monotonic()
        ours = (run_parallel(scratch, args.timeout, deps, args.files, args.jobs, device_env)
                if args.jobs > 1 else
                run_suite(scratch, args.timeout, deps, False, args.files, device_env))
        print(f"  symgpu: {len(ours)} tests in {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
        theirs = json.loads(ORACLE_FILE.read_text()) if ORACLE_FILE.exists() else None
        if args.oracle or args.oracle_no_c:
            theirs = run_oracle(scratch, args, deps, theirs or {})
            ORACLE_FILE.write_text(json.dumps(dict(sorted(theirs.items())), indent=0) + "\n")
        if theirs is not None and args.files:
            theirs = {t: r for t, r in theirs.items() if Path(file_of(t)).name in args.files}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = report(ours, theirs, args.device)
    sys.stdout.write(text)
    if args.json:
        args.json.write_text(json.dumps(ours, indent=0))
    if not args.no_save and (not args.files or args.summary != SUMMARY):
        args.summary.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
