"""Theano 1.0's tutorial run on symgpu: how many of its doctest blocks give the page's output.

The 16 pages of ``doc/tutorial`` that the issue names (PAGES) hold Sphinx doctest blocks: bare
``>>>`` paragraphs, ``.. doctest::``, ``.. testcode::`` followed by ``.. testoutput::``, and
``.. testsetup::``. They were extracted once into tools/theano_tutorial_blocks.json (page order
kept), so neither this tool nor its test needs Theano::

    python tools/theano_tutorial.py                  # per page, then the totals
    python tools/theano_tutorial.py --failures       # and each failure's first line and diff
    python tools/theano_tutorial.py --deliberate     # and each deliberate difference, with why
    python tools/theano_tutorial.py --extract DIR    # re-extract from a checkout of Theano

Each page runs in a subprocess of its own, with ``theano`` aliased to symgpu, as Sphinx's
doctest builder runs it: each group (the directive's argument, ``default`` without one) in a
fresh namespace, its ``testsetup`` blocks first, then its blocks in page order. Output is
compared by doctest's own OutputChecker with Sphinx's default flags (ELLIPSIS,
IGNORE_EXCEPTION_DETAIL, DONT_ACCEPT_TRUE_FOR_1), NORMALIZE_WHITESPACE and the block's own
options; NumPy prints as 1.13 did (``legacy='1.13'``), the NumPy the pages were written for, and
``time.clock`` (removed in Python 3.8; conditions.txt times its functions with it) is
``time.perf_counter``, as the Pythons the pages were written for had it. A
``testcode`` block compiles as a module (``exec``), a ``>>>`` example as one statement
(``single``), as in Sphinx. A block passes when every example in it does; a block whose every
example is ``+SKIP`` is skipped. DELIBERATE lists the blocks whose difference symgpu chose
(docs/from_theano.md): they count as passing, like tools/theano_absent.py's absences.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import doctest
import io
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
DATA = TOOLS / "theano_tutorial_blocks.json"

PAGES = ("adding", "aliasing", "broadcasting", "conditions", "debug_faq", "examples",
         "faq_tutorial", "gradients", "loading_and_saving", "loop", "modes", "nan_tutorial",
         "numpy", "printing_drawing", "shape_info", "symbolic_graphs")

#: Sphinx's ``doctest_default_flags``, plus whitespace-insensitive comparison
FLAGS = (doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1
         | doctest.NORMALIZE_WHITESPACE)

#: ``page:line`` of a block (its first line in the page) whose difference symgpu chose: reason
_PHILOX = ("random numbers come from Philox counter-based streams, not NumPy's RandomState "
           "(docs/from_theano.md): ")
_INT_CONSTANTS = ("a Python int with a float tensor is a constant of the tensor's dtype (NumPy "
                  "2's rule; Theano: the smallest int dtype; docs/from_theano.md) ")
DELIBERATE: dict[str, str] = {
    "examples:310": "Function.copy() of a one-output function returns the output, as the "
                    "original does, not Theano 1.0's one-element list (docs/from_theano.md)",
    "examples:329": "Function.copy() of a one-output function returns the output, as the "
                    "original does, not Theano 1.0's one-element list (docs/from_theano.md)",
    "examples:481": _PHILOX + "the numbers differ from Theano's",
    "examples:493": _PHILOX + "the numbers differ from Theano's (the two graphs agree)",
    "loop:320": _PHILOX + "the binomial mask drawn in the loop differs from Theano's",
    "adding:71": "a class prints its own module: <class 'symgpu.tensor.type.TensorVariable'>; "
                 "theano.tensor.var.TensorVariable is that class (the module-path table), so "
                 "isinstance and `is` checks hold (docs/from_theano.md)",
    "gradients:26": _INT_CONSTANTS + "(x ** 2 and its gradient): TensorConstant{2.0} and "
                                     "the exponent's TensorConstant{1.0} where Theano has "
                                     "TensorConstant{2} and {1}; the rest of pp's text is "
                                     "Theano's",
    "printing_drawing:59": _INT_CONSTANTS + "(1 / (1 + ...)): TensorConstant{1.0} where Theano "
                                            "has TensorConstant{1}; the rest is Theano's text",
    "printing_drawing:69": _INT_CONSTANTS + "(1 / (1 + ...)): TensorConstant{1.0} where Theano "
                                            "has TensorConstant{1}; the rest is Theano's graph "
                                            "and layout",
    "printing_drawing:90": "a compiled graph is what symgpu's rewrites make of it "
                           "(Composite{gt(sigmoid(i0), 0.5)} of one Gemv that adds b, where "
                           "Theano's has Gemv{inplace} into AllocEmpty and a composite of "
                           "neg, sub, sigmoid and GT); the values agree (docs/from_theano.md)",
    "shape_info:66": "Join's axis is a Python int, an op parameter (Join{axis=0}), not a "
                     "symbolic input (Theano's Join with a TensorConstant{0} input) "
                     "(docs/from_theano.md)",
}

# ---------------------------------------------------------------------------------------------
# extraction (run once, from a checkout of Theano)

_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*?)\s*$")
_EXPLICIT = re.compile(r"^(\s*)\.\.(\s|$)")
#: directives whose body is reStructuredText again (a ``>>>`` paragraph in it is tested)
_NESTED = {"note", "warning", "tip", "hint", "important", "attention", "caution", "danger",
           "error", "seealso", "topic", "admonition", "only", "sidebar", "rubric", "versionadded",
           "versionchanged", "deprecated", "container", "glossary"}
_TESTING = {"testcode", "testoutput", "testsetup", "testcleanup", "doctest"}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _body(lines: list[str], start: int, indent: int) -> tuple[dict, str, int]:
    """A directive's options and body from line `start` (after its first line): the lines
    indented deeper than `indent`, dedented; and the index after them."""
    options, i = {}, start
    while i < len(lines) and lines[i].strip().startswith(":") and _indent(lines[i]) > indent:
        key, _, value = lines[i].strip()[1:].partition(":")
        options[key] = value.strip()
        i += 1
    body = []
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        body.append(lines[i])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    while body and not body[0].strip():
        body.pop(0)
    cut = min((_indent(b) for b in body if b.strip()), default=0)
    return options, "\n".join(b[cut:] for b in body) + ("\n" if body else ""), i


def extract_page(text: str) -> list[dict]:
    """The page's doctest blocks in order: kind (doctest, testcode, testoutput, testsetup),
    group, options, text, line."""
    lines = text.splitlines()
    blocks, i, literal = [], 0, None   # literal: the indent whose deeper lines are not parsed
    while i < len(lines):
        line = lines[i]
        if literal is not None:
            if not line.strip() or _indent(line) > literal:
                i += 1
                continue
            literal = None
        m = _DIRECTIVE.match(line)
        if m and m.group(2) in _TESTING:
            options, body, end = _body(lines, i + 1, len(m.group(1)))
            kind = "doctest" if m.group(2) == "doctest" else m.group(2)
            blocks.append({"kind": kind, "group": m.group(3) or "default", "options": options,
                           "text": body, "line": i + 1})
            i = end
            continue
        if m and m.group(2) in _NESTED:
            i += 1
            continue
        if _EXPLICIT.match(line):      # another directive, a comment or a target: not parsed
            literal = _indent(line)
            i += 1
            continue
        if line.lstrip().startswith(">>>") and (i == 0 or not lines[i - 1].strip()):
            start, ind = i, _indent(line)
            while i < len(lines) and lines[i].strip():
                i += 1
            body = "\n".join(ln[ind:] for ln in lines[start:i]) + "\n"
            blocks.append({"kind": "doctest", "group": "default", "options": {}, "text": body,
                           "line": start + 1})
            continue
        if line.rstrip().endswith("::"):   # a literal block follows
            literal = _indent(line)
        i += 1
    return blocks


def extract(checkout: Path) -> dict[str, list[dict]]:
    return {page: extract_page((checkout / "doc" / "tutorial" / f"{page}.txt").read_text())
            for page in PAGES}


def write_data(pages: dict[str, list[dict]], path: Path = DATA) -> None:
    path.write_text(json.dumps(pages, indent=1) + "\n")


def load(path: Path = DATA) -> dict[str, list[dict]]:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------
# running one page (in its own process: the page's code changes global state)

_MODE = {"value": "single"}


def _compile(source, filename, mode, flags=0, dont_inherit=False):
    """doctest's compile, with Sphinx's ``exec`` for a testcode block."""
    return compile(source, filename, _MODE["value"], flags, dont_inherit)


def _flags(options: dict) -> int:
    flags = FLAGS
    for word in options.get("options", "").split():
        name = word[1:]
        if name in doctest.OPTIONFLAGS_BY_NAME:
            bit = doctest.OPTIONFLAGS_BY_NAME[name]
            flags = flags | bit if word[0] == "+" else flags & ~bit
    return flags


def _run_examples(test: doctest.DocTest, flags: int, mode: str) -> tuple[str, int, int]:
    """Runs `test`: (the report of its failures, examples tried, examples skipped)."""
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=flags, verbose=False)
    _MODE["value"] = mode
    skipped = sum(1 for ex in test.examples if ex.options.get(doctest.SKIP))
    runner.run(test, out=out.write, clear_globs=False)
    return out.getvalue(), len(test.examples), skipped


def run_page(page: str, blocks: list[dict]) -> list[dict]:
    """Each tested block's result, in page order: line, first line, status
    (pass, fail, skip), diff."""
    import numpy as np  # deferred: only the page's subprocess imports what the page uses
    import time
    np.set_printoptions(legacy="1.13")
    if not hasattr(time, "clock"):   # the pages' Python (< 3.8) had it; this process only
        time.clock = time.perf_counter
    doctest.compile = _compile
    parser = doctest.DocTestParser()
    setups: dict[str, list[dict]] = {}
    for b in blocks:
        if b["kind"] == "testsetup":
            setups.setdefault(b["group"], []).append(b)
    groups: dict[str, dict] = {}
    results = []
    for k, b in enumerate(blocks):
        if b["kind"] not in ("doctest", "testcode"):
            continue
        group = b["group"]
        if group not in groups:   # a fresh namespace, its setup run first (as Sphinx does)
            groups[group] = globs = {"__name__": "__main__"}
            for s in setups.get(group, []) + setups.get("*", []):
                with contextlib.redirect_stdout(io.StringIO()):
                    try:
                        exec(compile(s["text"], f"{page}.txt", "exec"), globs)
                    except Exception:  # noqa: BLE001 - a page's setup failing is its blocks' failure
                        traceback.print_exc()
        globs = groups[group]
        first = next((ln for ln in b["text"].splitlines() if ln.strip()), "")
        if b["kind"] == "doctest":
            test = parser.get_doctest(b["text"], globs, f"{page}:{b['line']}", f"{page}.txt",
                                      b["line"])
            mode = "single"
        else:
            nxt = blocks[k + 1] if k + 1 < len(blocks) else None
            want, opts = "", b["options"]
            if nxt and nxt["kind"] == "testoutput" and nxt["group"] == group:
                want, opts = nxt["text"], nxt["options"]
            m = doctest.DocTestParser._EXCEPTION_RE.match(want)
            exc_msg = m.group("msg") if m else None
            example = doctest.Example(b["text"], want, exc_msg, lineno=b["line"],
                                      options={})
            test = doctest.DocTest([example], globs, f"{page}:{b['line']}", f"{page}.txt",
                                   b["line"], b["text"])
            b = dict(b, options=opts)
            mode = "exec"
        test.globs = globs   # DocTest copies its globals: the group's namespace carries on
        try:
            report, tried, skipped = _run_examples(test, _flags(b["options"]), mode)
        except Exception:  # noqa: BLE001 - the page's code may raise anything; it is a failure
            report, tried, skipped = traceback.format_exc(), 1, 0
        status = "skip" if tried and skipped == tried else ("fail" if report else "pass")
        results.append({"line": b["line"], "first": first, "status": status,
                        "diff": _short(report)})
    return results


def _short(report: str, keep: int = 16) -> str:
    """doctest's failure report without the failing example's source (its first line is
    reported apart), cut to `keep` lines."""
    lines, source = [], False
    for ln in report.splitlines():
        if ln.startswith("*****") or ln.startswith("File "):
            continue
        if ln == "Failed example:":
            source = True
            continue
        if ln in ("Expected:", "Expected nothing", "Exception raised:") or ln.startswith("Got"):
            source = False
        if not source:
            lines.append(ln)
    return "\n".join(lines[:keep] + (["    ..."] if len(lines) > keep else []))


def run_page_subprocess(page: str, data: Path = DATA, timeout: float = 300) -> list[dict]:
    """Runs `page` in a fresh interpreter, in a scratch directory (pages write files)."""
    import tempfile  # deferred: only when running pages
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.setdefault("MPLBACKEND", "Agg")
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--page", page,
                               "--data", str(data)], cwd=scratch, env=env, capture_output=True,
                              text=True, timeout=timeout)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"page {page} did not run:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_all(pages=PAGES, data: Path = DATA, workers: int = 4) -> dict[str, list[dict]]:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {p: pool.submit(run_page_subprocess, p, data) for p in pages}
        return {p: futures[p].result() for p in pages}


def counts(page: str, results: list[dict]) -> dict[str, int]:
    """Blocks run, passing (deliberate differences included), deliberate, skipped, failing."""
    c = {"run": 0, "pass": 0, "deliberate": 0, "skip": 0, "fail": 0}
    for r in results:
        if r["status"] == "skip":
            c["skip"] += 1
            continue
        c["run"] += 1
        if r["status"] == "pass":
            c["pass"] += 1
        elif f"{page}:{r['line']}" in DELIBERATE:
            c["pass"] += 1
            c["deliberate"] += 1
        else:
            c["fail"] += 1
    return c


def rate(all_results: dict[str, list[dict]]) -> float:
    run = passed = 0
    for page, results in all_results.items():
        c = counts(page, results)
        run, passed = run + c["run"], passed + c["pass"]
    return 100.0 * passed / run if run else 100.0


def _report(all_results: dict[str, list[dict]], failures: bool, deliberate: bool, out) -> None:
    total = {"run": 0, "pass": 0, "deliberate": 0, "skip": 0, "fail": 0}
    print(f"{'page':22} {'run':>5} {'pass':>5} {'delib':>5} {'skip':>5} {'fail':>5} {'rate':>7}",
          file=out)
    for page, results in all_results.items():
        c = counts(page, results)
        for k in total:
            total[k] += c[k]
        share = 100.0 * c["pass"] / c["run"] if c["run"] else 100.0
        print(f"{page:22} {c['run']:5} {c['pass']:5} {c['deliberate']:5} {c['skip']:5} "
              f"{c['fail']:5} {share:6.1f}%", file=out)
    share = 100.0 * total["pass"] / total["run"] if total["run"] else 100.0
    print(f"{'total':22} {total['run']:5} {total['pass']:5} {total['deliberate']:5} "
          f"{total['skip']:5} {total['fail']:5} {share:6.1f}%", file=out)
    for page, results in all_results.items():
        for r in results:
            key = f"{page}:{r['line']}"
            if failures and r["status"] == "fail" and key not in DELIBERATE:
                print(f"\nFAIL {key}: {r['first']}\n{r['diff']}", file=out)
            if deliberate and r["status"] == "fail" and key in DELIBERATE:
                print(f"\nDELIBERATE {key}: {r['first']}\n    {DELIBERATE[key]}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failures", action="store_true", help="each failure with its diff")
    parser.add_argument("--deliberate", action="store_true",
                        help="each deliberate difference with its reason")
    parser.add_argument("--extract", metavar="CHECKOUT", type=Path,
                        help="re-extract the blocks from a checkout of Theano")
    parser.add_argument("--page", help=argparse.SUPPRESS)   # the per-page subprocess
    parser.add_argument("--data", type=Path, default=DATA, help=argparse.SUPPRESS)
    parser.add_argument("pages", nargs="*", help="only these pages")
    args = parser.parse_args(argv)
    if args.extract:
        pages = extract(args.extract)
        write_data(pages)
        print(f"{sum(len(b) for b in pages.values())} blocks from {len(pages)} pages -> {DATA}")
        return 0
    if args.page:
        import symgpu  # deferred: only the page's subprocess runs Theano code
        sys.modules["theano"] = symgpu
        blocks = load(args.data)[args.page]
        with contextlib.redirect_stdout(io.StringIO()):
            results = run_page(args.page, blocks)
        print(json.dumps(results))
        return 0
    _report(run_all(tuple(args.pages) or PAGES, args.data), args.failures, args.deliberate,
            sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
