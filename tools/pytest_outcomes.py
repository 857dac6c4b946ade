"""What the tools that run other projects' test suites (theano_corpus.py,
theano_library_suite.py) put in their scratch conftest to log each test's outcome as it
ends: the helpers' source text, pasted after the conftest's own `_LOG = ...` line (the
conftest runs in another process, from a scratch directory, so it gets text, not an import).

`_first_line(report)` is a failure's first error line; `_log(nodeid, outcome, first)` appends
one JSON record to the file named by `_LOG` (nothing where it is unset).

Beside it, what both tools do with the records: `group_key` (a failure's group) and
`internals_reason` (why a group tests an internal symgpu lacks on purpose, from a tool's
own table)."""
from __future__ import annotations

import re
from pathlib import Path

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_TMP = re.compile(r"/tmp/[^\s'\"]+")
_ROOT = str(Path(__file__).resolve().parent.parent)


def group_key(first: str) -> str:
    """A failure's group: its first error line with addresses, temp paths and this checkout's
    path blurred, cut to 160 characters."""
    first = _TMP.sub("/tmp/…", _ADDRESS.sub("0x…", first.strip())).replace(_ROOT, "…")
    return first if len(first) <= 160 else first[:157] + "..."


def internals_reason(key: str, table: dict[str, str]) -> str | None:
    """Why the group `key` tests Theano's internals (the first pattern of `table` it
    matches), or None."""
    for pattern, why in table.items():
        if re.search(pattern, key):
            return why
    return None


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
