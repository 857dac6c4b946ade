"""Theano's flags (Theano 1.0.5, doc/library/config.txt) in symgpu's config.

Every flag of Theano's configuration reference is accepted from SYMGPU_FLAGS, the rc file,
assignment and change_flags, with Theano's default; flags symgpu cannot honour warn once per
flag and process; invalid values and names Theano never had still raise ConfigError; the table
(symgpu/config_theano.py) is what docs/flags.md shows.
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from symgpu.config import Config, ConfigError, IgnoredFlagWarning
from symgpu.config_theano import LEGACY_FLAGS, THEANO_FLAGS, THEANO_SECTIONS

cfgmod = sys.modules["symgpu.config"]  # the module (symgpu.config names the Config object)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the `.. attribute::` entries of Theano 1.0.5's doc/library/config.txt, in its order (the
#: ``config.`` prefix dropped); compile, DebugMode and numpy are sections, the rest flags
THEANO_DOCUMENTED = [
    "device", "force_device", "init_gpu_device", "print_active_device", "floatX",
    "warn_float64", "deterministic", "allow_gc", "scan.allow_output_prealloc", "scan.allow_gc",
    "scan.debug", "cycle_detection", "check_stack_trace", "openmp", "openmp_elemwise_minsize",
    "cast_policy", "int_division", "mode", "profile", "profile_memory", "profile_optimizer",
    "profiling.n_apply", "profiling.n_ops", "profiling.min_memory_size",
    "profiling.min_peak_memory", "profiling.destination", "profiling.debugprint",
    "profiling.ignore_first_call", "lib.amdlibm", "gpuarray.preallocate", "gpuarray.sched",
    "gpuarray.single_stream", "gpuarray.cache_path", "linker", "optimizer", "on_opt_error",
    "assert_no_cpu_op", "on_shape_error", "warn.ignore_bug_before", "base_compiledir",
    "compiledir_format", "compiledir", "blas.ldflags",
    "experimental.local_alloc_elemwise_assert", "dnn.enabled", "dnn.include_path",
    "dnn.library_path", "conv.assert_shape", "dnn.conv.workmem", "dnn.conv.workmem_bwd",
    "dnn.conv.algo_fwd", "dnn.conv.algo_bwd", "dnn.conv.algo_bwd_filter",
    "dnn.conv.algo_bwd_data", "magma.enabled", "magma.include_path", "magma.library_path",
    "ctc.root", "gcc.cxxflags", "cxx", "optimizer_excluding", "optimizer_including",
    "optimizer_requiring", "optimizer_verbose", "nocleanup", "compile", "compile.timeout",
    "compile.wait", "DebugMode", "DebugMode.check_preallocated_output",
    "DebugMode.check_preallocated_output_ndim", "DebugMode.warn_input_not_reused",
    "NanGuardMode.nan_is_error", "NanGuardMode.inf_is_error", "NanGuardMode.big_is_error",
    "numpy", "numpy.seterr_all", "numpy.seterr_divide", "numpy.seterr_over",
    "numpy.seterr_under", "numpy.seterr_invalid", "compute_test_value",
    "compute_test_value_opt", "print_test_value", "reoptimize_unpickled_function",
    "exception_verbosity", "cmodule.warn_no_version", "cmodule.remove_gxx_opt",
    "cmodule.compilation_warning", "cmodule.preload_cache", "cmodule.age_thresh_use",
    "cmodule.debug", "traceback.limit", "traceback.compile_limit", "metaopt.verbose",
    "metaopt.optimizer_excluding", "metaopt.optimizer_including",
]
SECTIONS = ["compile", "DebugMode", "numpy"]
FLAGS = [n for n in THEANO_DOCUMENTED if n not in SECTIONS]

#: Theano's defaults (configdefaults.py); where symgpu had the flag, symgpu's (mode is
#: FAST_RUN for Theano's 'Mode', cxx 'cc' for the path of g++); paths are checked apart
DEFAULTS = {
    "device": "cpu", "force_device": False, "init_gpu_device": "", "print_active_device": True,
    "floatX": "float64", "warn_float64": "ignore", "deterministic": "default",
    "allow_gc": True, "scan.allow_output_prealloc": True, "scan.allow_gc": False,
    "scan.debug": False, "cycle_detection": "regular", "check_stack_trace": "off",
    "openmp": False, "openmp_elemwise_minsize": 200000, "cast_policy": "custom",
    "int_division": "int", "mode": "FAST_RUN", "profile": False, "profile_memory": False,
    "profile_optimizer": False, "profiling.n_apply": 20, "profiling.n_ops": 20,
    "profiling.min_memory_size": 1024, "profiling.min_peak_memory": False,
    "profiling.destination": "stderr", "profiling.debugprint": False,
    "profiling.ignore_first_call": False, "lib.amdlibm": False, "gpuarray.preallocate": 0.0,
    "gpuarray.sched": "default", "gpuarray.single_stream": True, "linker": "cvm",
    "optimizer": "fast_run", "on_opt_error": "warn", "assert_no_cpu_op": "ignore",
    "on_shape_error": "warn", "warn.ignore_bug_before": "0.9",
    "compiledir_format": "compiledir_%(short_platform)s-%(processor)s-%(python_version)s-"
                         "%(python_bitwidth)s",
    "blas.ldflags": "-lblas", "experimental.local_alloc_elemwise_assert": True,
    "dnn.enabled": "auto", "dnn.include_path": "", "dnn.library_path": "",
    "conv.assert_shape": False, "dnn.conv.workmem": "", "dnn.conv.workmem_bwd": "",
    "dnn.conv.algo_fwd": "small", "dnn.conv.algo_bwd": "", "dnn.conv.algo_bwd_filter": "none",
    "dnn.conv.algo_bwd_data": "none", "magma.enabled": False, "magma.include_path": "",
    "magma.library_path": "", "ctc.root": "", "gcc.cxxflags": "", "cxx": "cc",
    "optimizer_excluding": "", "optimizer_including": "", "optimizer_requiring": "",
    "optimizer_verbose": False, "nocleanup": False, "compile.timeout": 120, "compile.wait": 5,
    "DebugMode.check_preallocated_output": "", "DebugMode.check_preallocated_output_ndim": 4,
    "DebugMode.warn_input_not_reused": True, "NanGuardMode.nan_is_error": True,
    "NanGuardMode.inf_is_error": True, "NanGuardMode.big_is_error": True,
    "numpy.seterr_all": "ignore", "numpy.seterr_divide": "None", "numpy.seterr_over": "None",
    "numpy.seterr_under": "None", "numpy.seterr_invalid": "None",
    "compute_test_value": "off", "compute_test_value_opt": "off", "print_test_value": False,
    "reoptimize_unpickled_function": False, "exception_verbosity": "low",
    "cmodule.warn_no_version": False, "cmodule.remove_gxx_opt": False,
    "cmodule.compilation_warning": False, "cmodule.preload_cache": False,
    "cmodule.age_thresh_use": 60 * 60 * 24 * 24, "cmodule.debug": False,
    "traceback.limit": 8, "traceback.compile_limit": 0, "metaopt.verbose": 0,
    "metaopt.optimizer_excluding": "", "metaopt.optimizer_including": "",
}
PATHS = {"compiledir": "", "base_compiledir": "..", "gpuarray.cache_path": "gpuarray_kernels"}


def make(flags: str = "", rc: str | None = None, tmp_path=None) -> Config:
    rc_path = ""
    if rc is not None:
        rc_path = str(tmp_path / "rc")
        with open(rc_path, "w", encoding="utf-8") as fh:
            fh.write(rc)
    env = {"SYMGPU_FLAGS": flags, "XDG_CACHE_HOME": "/cache"}
    return Config(environ=env, rc_path=rc_path)


def read(cfg: Config, name: str):
    """``cfg.a.b.c`` for ``name`` 'a.b.c' (attribute access through the sections)."""
    obj = cfg
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def assign(cfg: Config, name: str, value) -> None:
    """``cfg.a.b.c = value``."""
    *sections, last = name.split(".")
    obj = cfg
    for part in sections:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def expected_default(name: str):
    if name in PATHS:
        base = os.path.join("/cache", "symgpu", make().compiledir.rsplit(os.sep, 1)[-1])
        return os.path.normpath(os.path.join(base, PATHS[name]))
    return DEFAULTS[name]


def as_text(value) -> str:
    return str(value)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test starts as a new process would: no flag has warned yet."""
    monkeypatch.setattr(cfgmod, "_WARNED", set())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredFlagWarning)
        yield


# ----------------------------------------------------------------------------- the list
def test_the_list_is_theanos_reference():
    assert len(THEANO_DOCUMENTED) == 97 and len(set(THEANO_DOCUMENTED)) == 97
    assert len(FLAGS) == 94 and set(DEFAULTS) | set(PATHS) == set(FLAGS)
    assert [r[0] for r in THEANO_FLAGS] == FLAGS  # one row per flag, in the reference's order
    assert list(THEANO_SECTIONS) == SECTIONS


def test_every_documented_name_is_known_and_sections_are_sections():
    c = make()
    for name in SECTIONS:
        assert repr(read(c, name)) == f"<config section {name!r}>"
    known = {r[0] for r in c.describe()}
    assert set(FLAGS) <= known and {r[0] for r in LEGACY_FLAGS} <= known


@pytest.mark.parametrize("name", FLAGS)
def test_each_flag_has_its_default_and_is_accepted_everywhere(name, tmp_path):
    default = expected_default(name)
    c = make()
    assert read(c, name) == default and c.source(name) == "default"
    # SYMGPU_FLAGS (THEANO_FLAGS-style) and the rc file
    text = as_text(default)
    if "," not in text:
        assert read(make(f"{name}={text}"), name) == default
    section, _, key = name.rpartition(".")
    rc = make(rc=f"[{section or 'global'}]\n{key} = {text}\n", tmp_path=tmp_path)
    assert read(rc, name) == default
    # assignment and change_flags, with the default and with another valid value
    other = another_value(c, name, default)
    assign(c, name, other)
    assert read(c, name) == other and c.source(name) == "assignment"
    assign(c, name, default)
    assert read(c, name) == default
    with c.change_flags({name: other}):
        assert read(c, name) == other
    assert read(c, name) == default
    with c.change_flags(**{name.replace(".", "__"): default}):
        assert read(c, name) == default


def another_value(cfg: Config, name: str, default):
    """A valid value other than the default (the default itself where there is none)."""
    param = cfg.live(name).param
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return 0.5
    choices = getattr(param, "choices", None)
    if name == "mode":
        return "FAST_COMPILE"
    if name == "optimizer":
        return "fast_compile"
    if name in ("device", "init_gpu_device", "contexts") or name.startswith("dnn.conv.work") \
            or name == "dnn.conv.algo_bwd":
        return default
    if name == "DebugMode.check_preallocated_output":
        return "c_contiguous:strided"
    if choices:
        return next(ch for ch in choices if ch != default)
    return default + "x" if default else "x"


def test_the_issues_example_string():
    c = make("optimizer=fast_compile,dnn.enabled=False,lib.cnmem=0.5,nvcc.fastmath=True")
    assert c.mode == "FAST_COMPILE" and c.optimizer == "fast_compile"
    assert c.dnn.enabled == "False" and c.lib.cnmem == 0.5
    assert c.nvcc.fastmath is True and c.nvcc.flags == "--use_fast_math"
    assert c.source("lib.cnmem") == "SYMGPU_FLAGS"


def test_rc_file_sections(tmp_path):
    rc = ("[dnn]\nenabled = False\n[dnn.conv]\nalgo_fwd = time_once\n[lib]\ncnmem = 0.5\n"
          "[NanGuardMode]\nnan_is_error = False\n[numpy]\nseterr_all = raise\n"
          "[global]\noptimizer = fast_compile\n")
    c = make(rc=rc, tmp_path=tmp_path)
    assert (c.dnn.enabled, c.dnn.conv.algo_fwd, c.lib.cnmem) == ("False", "time_once", 0.5)
    assert c.NanGuardMode.nan_is_error is False and c.numpy.seterr_all == "raise"
    assert c.mode == "FAST_COMPILE"


def test_legacy_flags():
    c = make()
    assert [read(c, r[0]) for r in LEGACY_FLAGS] == [r[2] for r in LEGACY_FLAGS]
    for name, *_ in LEGACY_FLAGS:
        assert c.source(name) == "default"


def test_old_bug_warnings_are_accepted_and_satisfied():
    # Theano's tutorial sets theano.config.warn.subtensor_merge_bug = False
    c = make()
    assert c.warn.subtensor_merge_bug is False and c.warn.inc_subtensor1_opt is True
    c.warn.subtensor_merge_bug = True
    assert c.warn.subtensor_merge_bug is True and c.source("warn.subtensor_merge_bug") == "assignment"


def test_unittests_rseed_is_theanos_test_seed():
    # Theano's test helpers read it (unittest_tools.fetch_seed: int(config.unittests.rseed))
    c = make()
    assert c.unittests.rseed == "666" and int(c.unittests.rseed) == 666
    c.unittests.rseed = "random"
    assert c.unittests.rseed == "random" and c.source("unittests.rseed") == "assignment"


# ----------------------------------------------------------------------------- mapped flags
def test_optimizer_is_the_modes_rewrite_set():
    c = make()
    assert c.optimizer == "fast_run"
    c.optimizer = "fast_compile"
    assert c.mode == "FAST_COMPILE" and c.source("optimizer") == "assignment"
    with c.change_flags(optimizer="fast_run"):
        assert c.mode == "FAST_RUN" and c.optimizer == "fast_run"
    assert c.mode == "FAST_COMPILE"
    c.mode = "FAST_RUN"
    assert c.optimizer == "fast_run"
    for value, mode in [("o4", "FAST_RUN"), ("unsafe", "FAST_RUN"), ("o1", "FAST_COMPILE"),
                        ("merge", "FAST_COMPILE"), ("None", "FAST_COMPILE")]:
        c.optimizer = value
        assert c.mode == mode, value
    c.mode = "DebugMode"
    c.optimizer = "fast_compile"  # as in Theano: DebugMode keeps its rewrites
    assert c.mode == "DebugMode"


def test_thenos_mode_names():
    assert make("optimizer=fast_compile,mode=Mode").mode == "FAST_COMPILE"
    assert make("mode=Mode,optimizer=fast_compile").mode == "FAST_COMPILE"
    assert make("mode=Mode").mode == "FAST_RUN"
    assert make("mode=DEBUG_MODE").mode == "DebugMode"
    with pytest.warns(IgnoredFlagWarning, match="NanGuardMode"):
        warnings.simplefilter("always", IgnoredFlagWarning)
        assert make("mode=NanGuardMode").mode == "FAST_RUN"


def test_nvcc_fastmath_is_use_fast_math_in_nvcc_flags():
    c = make("nvcc.flags=-lineinfo")
    assert c.nvcc.fastmath is False
    c.nvcc.fastmath = True
    assert c.nvcc.flags == "-lineinfo --use_fast_math" and c.nvcc.fastmath is True
    with c.change_flags(nvcc__fastmath=False):
        assert c.nvcc.flags == "-lineinfo"
    assert c.nvcc.fastmath is True
    c.nvcc.flags = "-use_fast_math"
    assert c.nvcc.fastmath is True
    c.nvcc.fastmath = "false"
    assert c.nvcc.flags == ""


# ----------------------------------------------------------------------------- warnings
NO_EFFECT_SAMPLE = [("lib.cnmem", 0.5, "gpuarray.preallocate is the equivalent"),
                    ("dnn.enabled", "True", "cuDNN"), ("numpy.seterr_all", "raise", "seterr"),
                    ("profiling.n_apply", 5, "profile report"), ("openmp", True, "OpenMP"),
                    ("DebugMode.check_preallocated_output", "ALL", "preallocated"),
                    ("linker", "py", "cxx=''"), ("optimizer", "o3", "FAST_RUN's rewrites")]


@pytest.mark.parametrize("name, value, reason", NO_EFFECT_SAMPLE)
def test_no_effect_flags_warn_once_per_process(name, value, reason):
    c = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assign(c, name, value)  # set twice, through two ways: one warning
        with c.change_flags({name: value}):
            pass
        assign(make(), name, value)  # another Config in the same process: still silent
    mine = [w for w in caught if issubclass(w.category, IgnoredFlagWarning)]
    assert len(mine) == 1, [str(w.message) for w in mine]
    text = str(mine[0].message)
    assert name in text and repr(value) in text and reason in text
    assert mine[0].filename == __file__  # points at the user's line


def test_defaults_and_honoured_values_do_not_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = make("lib.cnmem=0,dnn.enabled=auto,linker=c|py,optimizer=fast_compile,"
                 "warn.ignore_bug_before=all,nvcc.fastmath=True,mode=Mode")
        c.dnn.enabled = "no_check"
        c.linker = "vm"
    assert not [w for w in caught if issubclass(w.category, IgnoredFlagWarning)]


def test_environment_values_warn_at_import(tmp_path):
    code = "from symgpu.config import config; print(config.lib.cnmem)"
    env = dict(os.environ, SYMGPU_FLAGS="lib.cnmem=0.5,lib.cnmem=0.7", SYMGPURC=os.devnull,
               PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, text=True,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0.7"
    assert r.stderr.count("IgnoredFlagWarning") == 1 and "CNMeM" in r.stderr


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("flags, allowed", [
    ("dnn.enabled=maybe", "auto, True, False, no_check"),
    ("profiling.n_apply=0", "an integer > 0"),
    ("compile.timeout=soon", "an integer >= 0"),
    ("numpy.seterr_all=loud", "ignore, warn, raise"),
    ("DebugMode.check_preallocated_output=initial:bogus", "some of initial"),
    ("dnn.conv.workmem=small", "removed: use dnn.conv.algo_fwd"),
    ("init_gpu_device=cpu", "'', cuda, cudaN"),
    ("optimizer=fastest", "o4, o3"),
    ("linker=cpp", "cvm, c|py"),
    ("lib.cnmem=lots", "0, 0.5, 1024 ... (0: off"),
    ("mode=Fast", "FAST_RUN, FAST_COMPILE, DebugMode, Mode"),
])
def test_invalid_values_are_rejected(flags, allowed):
    name = flags.split("=")[0]
    with pytest.raises(ConfigError) as e:
        make(flags)
    assert e.value.flag == name and allowed in e.value.allowed and allowed in str(e.value)
    c = make()
    with pytest.raises(ConfigError):
        assign(c, name, flags.split("=", 1)[1])
    with pytest.raises(ConfigError):
        c.change_flags({name: flags.split("=", 1)[1]})


def test_bools_for_theanos_string_choices():
    c = make()
    c.dnn.enabled = False
    assert c.dnn.enabled == "False"
    c.numpy.seterr_divide = None
    assert c.numpy.seterr_divide == "None"


@pytest.mark.parametrize("name, close", [("dnn.enabld", "dnn.enabled"),
                                          ("lib.cnmen", "lib.cnmem"),
                                          ("optimiser", "optimizer")])
def test_names_theano_never_had_still_raise(name, close):
    with pytest.raises(ConfigError, match=f"unknown flag '{name}'.*did you mean '{close}'"):
        make(f"{name}=1")
    with pytest.raises(ConfigError, match="unknown flag"):
        make().change_flags({name: 1})
    with pytest.raises(ConfigError, match="unknown flag"):
        assign(make(), name, 1)
    with pytest.raises(ConfigError, match="unknown flag 'gpu.fastmath'"):
        make("gpu.fastmath=True")


# ----------------------------------------------------------------------------- the table
def test_the_table_and_its_counts():
    rows = THEANO_FLAGS + LEGACY_FLAGS
    kinds = [r[3] for r in THEANO_FLAGS]
    assert (kinds.count("same"), kinds.count("mapped"), kinds.count("satisfied"),
            kinds.count("removed"), kinds.count("ignored")) == (20, 2, 1, 3, 67)  # conv.assert_shape acts (names-tensor)
    c = make()
    for name, spec, default, kind, text, quiet in rows:
        assert text and "\n" not in text, name
        flag = c.live(name)
        if kind == "same":
            assert spec is None and default is None and text.startswith("symgpu's " + name)
        else:
            assert flag.doc.startswith("Theano's flag") and text in flag.doc, name
        if kind == "ignored":
            assert flag.reason.endswith(text), name


def test_docs_show_every_theano_flag_with_its_reason():
    with open(os.path.join(ROOT, "docs", "flags.md"), encoding="utf-8") as fh:
        doc = fh.read()
    for name, _spec, _default, kind, text, _quiet in THEANO_FLAGS + LEGACY_FLAGS:
        assert f"\n## {name}\n" in doc, name
        if kind != "same":
            assert text in doc, name
