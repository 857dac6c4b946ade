"""What the tools that run other projects' test suites (theano_corpus.py,
theano_library_suite.py) put in their scratch conftest to log each test's outcome as it
ends: the helpers' source text, pasted after the conftest's own `_LOG = ...` line (the
conftest runs in another process, from a scratch directory, so it gets text, not an import).

`_first_line(report)` is a failure's first error line; `_log(nodeid, outcome, first)` appends
one JSON record to the file named by `_LOG` (nothing where it is unset)."""

OUTCOME_HELPERS = r'''
def _first_line(report):
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0]
    text = getattr(report, "longreprtext", "") or str(getattr(report, "longrepr", ""))
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1].strip() if lines else "(no message)"


def _log(nodeid, outcome, first=""):
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(json.dumps({"id": nodeid, "outcome": outcome, "first": first}) + "\n")
'''
