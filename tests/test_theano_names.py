"""Theano 1.0's documented names (tools/theano_names.py): the data file holds what was extracted
from Theano's doc/library, every name the tool calls present resolves (checked again through
``import theano`` aliased to symgpu, as code written for Theano sees it), every deliberate
absence (tools/theano_absent.py) has a reason and still names something absent, and coverage
does not fall below the floors recorded here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import theano_absent  # noqa: E402
import theano_names  # noqa: E402
from theano_names import Name  # noqa: E402

#: what the data file holds (Theano 1.0.5's doc/library): 450 names the pages name, and 365
#: module-level members of the 36 modules documented by a bare `:members:`
DOCUMENTED_NAMES = 815
FROM_BARE_MEMBERS = 365
DOCUMENTED_MODULES = 74

#: this issue's figures when the members of the bare `:members:` modules were first counted
#: (before them: 98.6% present, 100% covered); they may rise, not fall (raise them then)
PRESENT_FLOOR = 95.9        # per cent of this issue's documented names present (was 74.8)
COVERAGE_FLOOR = 100.0      # per cent present or deliberately absent (was 83.3)
#: the other issue's ("The rest of Theano's library") figures (61.5% -> 99.0%)
OTHER_PRESENT_FLOOR = 99.0
OTHER_COVERAGE_FLOOR = 100.0


@pytest.fixture(scope="module")
def data():
    return theano_names.load()


@pytest.fixture(scope="module")
def rep(data):
    return theano_names.report(data[1])


def test_the_data_file_holds_what_was_extracted(data):
    modules, names = data
    assert len(names) == DOCUMENTED_NAMES and len(set(names)) == len(names)
    assert len(modules) == DOCUMENTED_MODULES and len(set(modules)) == len(modules)
    assert all(n.module == "theano" or n.module.startswith("theano.") for n in names)
    assert all(m == "theano" or m.startswith("theano.") for m in modules)
    assert Name("theano.tensor", "matrix") in names
    assert Name("theano.config", "scan.allow_gc") in names
    assert Name("theano.compile.function", "In.borrow") in names
    members = theano_names.members_of_whole()
    assert len(members) == FROM_BARE_MEMBERS and set(members) <= set(names)
    whole = set(theano_names.documented_whole())
    assert all(n.module in whole for n in members) and len(whole) == 36
    assert Name("theano.gof.graph", "ancestors") in members          # a function
    assert Name("theano.sandbox.rng_mrg", "MRG_RandomStreams") in members   # a class
    assert Name("theano.gof.graph", "np") not in members             # an imported module


def test_every_name_marked_present_resolves_through_the_theano_alias(rep):
    present = [str(n) for n in rep.names if rep.statuses[n][0] == "present"]
    code = """
import importlib, json, sys
import symgpu
sys.modules["theano"] = symgpu
import theano
sys.path.insert(0, sys.argv[1])
import theano_names
failed = []
for entry in json.loads(sys.stdin.read()):
    module, qualname = entry.split(":", 1)
    if module in theano_names.MODULE_ATTRIBUTES:
        obj = theano
        for attr in theano_names.MODULE_ATTRIBUTES[module]:
            obj = getattr(obj, attr)
    else:
        obj = importlib.import_module(module)   # Theano's path, through the alias
    try:
        for attr in qualname.split("."):
            obj = getattr(obj, attr)
    except AttributeError:   # a member set in __init__: the tool looks on an instance
        if "." not in qualname or not theano_names.resolves(theano_names.Name(module, qualname)):
            failed.append(entry)
print(json.dumps(failed))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code, str(ROOT / "tools")],
                         input=json.dumps(present), env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
    assert len(present) > 300


def test_present_members_of_instances_are_really_there():
    assert theano_names.resolves(Name("theano.compile.function", "In.borrow"))  # set in __init__
    assert theano_names.resolves(Name("theano.tensor", "TensorType.broadcastable"))
    assert not theano_names.resolves(Name("theano.compile.function", "In.no_such_member"))
    assert not theano_names.resolves(Name("theano.tensor", "no_such_function"))
    assert not theano_names.resolves(Name("theano.no_such_module", "x"))


def test_every_deliberate_absence_has_a_reason_and_is_still_absent(data, rep):
    modules, names = data
    for key, why in theano_absent.ABSENT.items():
        assert isinstance(why, str) and len(why.split()) >= 5, key  # a reason, in words
        module, _, qualname = key.partition(":")
        covered = [n for n in names if theano_absent.reason(n.module, n.qualname) == why
                   and (n.module == module or n.module.startswith(module + "."))]
        covered_modules = [m for m in modules if theano_names.module_status(m)[1] == why]
        assert covered or covered_modules, f"{key}: names nothing documented"
        assert not any(theano_names.resolves(n) for n in covered), f"{key}: present after all"
        assert all(theano_names.module_status(m)[0] == "absent" for m in covered_modules), key
    for name in rep.names:
        state, why = rep.statuses[name]
        assert (state == "absent") == (why is not None), name


def test_coverage_does_not_fall(rep):
    assert round(rep.present_share(), 1) >= PRESENT_FLOOR, f"{rep.present_share():.1f}% present"
    assert round(rep.coverage(), 1) >= COVERAGE_FLOOR, f"{rep.coverage():.1f}% covered"
    assert round(rep.present_share(True), 1) >= OTHER_PRESENT_FLOOR, \
        f"{rep.present_share(True):.1f}% present (the other issue)"
    assert round(rep.coverage(True), 1) >= OTHER_COVERAGE_FLOOR, \
        f"{rep.coverage(True):.1f}% covered (the other issue)"
    t = rep.totals(False)
    assert sum(t.values()) + sum(rep.totals(True).values()) == DOCUMENTED_NAMES


def test_the_other_issue_is_counted_apart():
    other = theano_names.other_issue
    assert other(Name("theano.tensor.slinalg", "solve"))
    assert other(Name("theano.tensor.nnet", "conv3d")) and other(Name("theano.d3viz.formatting", "X"))
    assert other(Name("theano.tensor.signal.pool", "pool_3d"))
    assert not other(Name("theano.tensor.signal.pool", "pool_2d"))
    assert not other(Name("theano.tensor.nnet", "conv2d")) and not other(Name("theano", "scan"))


def test_extraction(tmp_path):
    """The parser on a page written for this test (module names, short and qualified names,
    several names a directive, braces, class members, the config prefix)."""
    for module in ("__init__.py", "pkg/sub.py"):
        path = tmp_path / "theano" / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    # a module that imports (its members by autodoc's rule) and one that does not (read
    # from its source)
    (tmp_path / "theano" / "pkg" / "other.py").write_text(
        'import os\nfrom math import sqrt\n'
        'def epsilon():\n    "Documented."\n'
        'def undocumented():\n    pass\n'
        'def _private():\n    "Private."\n'
        'class Omega:\n    "A class."\n'
        'ANSWER = 42\n')
    (tmp_path / "theano" / "pkg" / "__init__.py").write_text(
        'import no_such_module_anywhere\n'
        'def kappa():\n    "Documented."\n'
        'def lam():\n    pass\n')
    page = tmp_path / "doc" / "library" / "pkg" / "sub.txt"
    page.parent.mkdir(parents=True)
    page.write_text("""
.. module:: sub

.. function:: alpha(x), beta(x)
.. function:: {gamma,delta}(axis=None)
.. autofunction:: theano.pkg.other.epsilon
.. class:: Thing(Base)

    .. attribute:: size = 3
    .. method:: __{add,sub}__
    .. method:: run() does things, quickly

.. data:: zeta
.. automodule:: theano.pkg.other
   :members:
.. automodule:: theano.pkg
   :members:
.. autoclass:: theano.pkg.other.Omega
   :members: one, two
""")
    (tmp_path / "doc" / "library" / "config.txt").write_text("""
.. module:: config
.. attribute:: config.section.flag
.. attribute:: plain
""")
    modules, names, whole = theano_names.extract(tmp_path)
    assert whole == ["theano.pkg.other", "theano.pkg"]
    assert modules == ["theano.config", "theano.pkg.sub", "theano.pkg.other", "theano.pkg"]
    assert [str(n) for n in names] == [
        "theano.config:section.flag", "theano.config:plain",
        "theano.pkg.sub:alpha", "theano.pkg.sub:beta", "theano.pkg.sub:gamma",
        "theano.pkg.sub:delta", "theano.pkg.other:epsilon", "theano.pkg.sub:Thing",
        "theano.pkg.sub:Thing.size", "theano.pkg.sub:Thing.__add__",
        "theano.pkg.sub:Thing.__sub__", "theano.pkg.sub:Thing.run", "theano.pkg.sub:zeta",
        "theano.pkg.other:Omega", "theano.pkg.other:Omega.one", "theano.pkg.other:Omega.two"]
    found = theano_names.module_members(tmp_path, whole)
    assert found == {"theano.pkg.other": ["Omega", "epsilon"], "theano.pkg": ["kappa"]}
    members = [Name(m, x) for m in whole for x in found[m]]
    data = tmp_path / "names.txt"
    theano_names.write_data(modules, names, whole, data, members=members)
    new = [n for n in members if n not in names]      # epsilon and Omega are named already
    assert new == [Name("theano.pkg", "kappa")]
    assert theano_names.load(data) == (modules, names + new)
    assert theano_names.documented_whole(data) == whole
    assert theano_names.members_of_whole(data) == new


def test_the_tool_prints_the_figures(capsys, rep):
    assert theano_names.main(["--missing", "--absent"]) == 0
    out = capsys.readouterr().out
    assert f"present: {rep.present_share():.1f}%" in out
    assert "theano.tensor " in out and "\nmissing:\n" in out and "\nabsent:\n" in out
    assert "The other issue" in out
    assert "theano.gof.graph" in out and " members: " in out


def test_the_docs_say_how_to_run_it():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text[text.index("## Theano's documented names (tools/theano_names.py)"):]
    assert "python tools/theano_names.py" in section
