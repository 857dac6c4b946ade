"""Tests for symgpu.config: sources, precedence, validation, change_flags, registration."""
import os
import subprocess
import sys
import textwrap

import pytest

from symgpu.config import (BoolParam, Config, ConfigError, ContextsParam, DeviceParam, EnumParam,
                           FloatParam, PathParam, StrParam, parse_contexts)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make(flags: str = "", rc: str | None = None, tmp_path=None, **kw) -> Config:
    """A Config from an explicit SYMGPU_FLAGS string and optional rc file text."""
    rc_path = ""
    if rc is not None:
        rc_path = str(tmp_path / "symgpurc")
        with open(rc_path, "w") as f:
            f.write(textwrap.dedent(rc))
    return Config(environ={"SYMGPU_FLAGS": flags}, rc_path=rc_path, **kw)


# ----------------------------------------------------------------------------- defaults
def test_defaults():
    c = Config(environ={}, rc_path="")
    assert c.device == "cpu" and c.force_device is False
    assert c.floatX == "float64" and c.warn_float64 == "ignore" and c.mode == "FAST_RUN"
    assert c.optimizer_including == "" and c.optimizer_excluding == ""
    assert c.profile is False and c.profile_memory is False and c.allow_gc is True
    assert c.assert_no_cpu_op == "ignore" and c.contexts == "" and c.context_map() == {}
    assert c.gpuarray.preallocate == 0.0 and c.gpuarray.cuda_graphs is True
    assert c.nvcc.flags == "" and c.compile_log is False
    assert c.exception_verbosity == "low" and c.print_active_device is True
    assert c.source("floatX") == "default"


def test_default_compiledir(tmp_path, monkeypatch):
    c = Config(environ={"XDG_CACHE_HOME": str(tmp_path)}, rc_path="")
    assert c.compiledir.startswith(os.path.join(str(tmp_path), "symgpu") + os.sep)
    tag = os.path.basename(c.compiledir)
    assert sys.implementation.cache_tag in tag
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    c = Config(environ={}, rc_path="")
    assert c.compiledir.startswith(os.path.join(str(tmp_path / "home"), ".cache", "symgpu"))


# ----------------------------------------------------------------------------- rc file
RC = """
    [global]
    floatX = float32
    device = cuda1
    profile = True
    optimizer_excluding = fusion:inplace
    contexts = dev0->cuda0;dev1->cuda1

    [gpuarray]
    preallocate = 0.8
    cuda_graphs = false

    [nvcc]
    flags = --use_fast_math -lineinfo
"""


def test_rc_file_sections(tmp_path):
    c = make(rc=RC, tmp_path=tmp_path)
    assert c.floatX == "float32" and c.device == "cuda1" and c.profile is True
    assert c.tags("optimizer_excluding") == ["fusion", "inplace"]
    assert c.context_map() == {"dev0": "cuda0", "dev1": "cuda1"}
    assert c.gpuarray.preallocate == 0.8 and c.gpuarray.cuda_graphs is False
    assert c.nvcc.flags == "--use_fast_math -lineinfo"
    assert c.source("floatX").startswith("rc file ")


def test_rc_path_from_symgpurc_and_home(tmp_path, monkeypatch):
    rc = tmp_path / "custom.ini"
    rc.write_text("[global]\nfloatX = float16\n")
    assert Config(environ={"SYMGPURC": str(rc)}).floatX == "float16"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".symgpurc").write_text("[global]\nmode = FAST_COMPILE\n")
    monkeypatch.setenv("HOME", str(home))
    assert Config(environ={}).mode == "FAST_COMPILE"
    assert Config(environ={}, rc_path=str(tmp_path / "missing")).mode == "FAST_RUN"


def test_rc_errors_name_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        make(rc="[global]\nfloatX = float8\n", tmp_path=tmp_path)
    msg = str(e.value)
    assert "floatX" in msg and "float8" in msg and str(tmp_path / "symgpurc") in msg
    assert "float64, float32, float16" in msg
    with pytest.raises(ConfigError, match="unknown flag 'gpuarray.prealloc'"):
        make(rc="[gpuarray]\nprealloc = 0.5\n", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="cannot parse rc file"):
        make(rc="floatX = float32\n", tmp_path=tmp_path)


# ----------------------------------------------------------------------------- SYMGPU_FLAGS
def test_env_flags_and_precedence_over_rc(tmp_path):
    c = make("floatX=float16, gpuarray.preallocate=0.5,nvcc__flags=-O3", rc=RC, tmp_path=tmp_path)
    assert c.floatX == "float16" and c.gpuarray.preallocate == 0.5 and c.nvcc.flags == "-O3"
    assert c.device == "cuda1"  # from rc, untouched by env
    assert c.source("floatX") == "SYMGPU_FLAGS"


def test_env_contexts_with_semicolon_and_arrow():
    c = make("device=cuda0,contexts=dev0->cuda0;dev1->cuda1,floatX=float32")
    assert c.contexts == "dev0->cuda0;dev1->cuda1"
    assert c.context_map() == {"dev0": "cuda0", "dev1": "cuda1"}
    assert c.device == "cuda0" and c.floatX == "float32"


def test_env_value_with_comma_continues():
    c = make("nvcc.flags=-Xcompiler -O3,-fPIC,-DA=1,floatX=float32")
    assert c.nvcc.flags == "-Xcompiler -O3,-fPIC,-DA=1" and c.floatX == "float32"


def test_env_errors():
    with pytest.raises(ConfigError) as e:
        make("profile=maybe")
    msg = str(e.value)
    assert "'profile'" in msg and "'maybe'" in msg and "SYMGPU_FLAGS" in msg and "True" in msg
    assert e.value.flag == "profile" and e.value.source == "SYMGPU_FLAGS"
    with pytest.raises(ConfigError) as e:
        make("flotX=float32")
    assert "unknown flag 'flotX'" in str(e.value) and "did you mean 'floatX'" in str(e.value)
    assert "device" in e.value.allowed
    with pytest.raises(ConfigError, match="malformed"):
        make("floatX")
    with pytest.raises(ConfigError, match="contexts"):
        make("contexts=dev0=>cuda0")


# ----------------------------------------------------------------------------- change_flags
def test_change_flags_context_manager_precedence_and_restore():
    c = make("floatX=float32")
    with c.change_flags(floatX="float16", gpuarray__preallocate=0.5):
        assert c.floatX == "float16" and c.gpuarray.preallocate == 0.5
        assert c.source("floatX") == "change_flags"
    assert c.floatX == "float32" and c.gpuarray.preallocate == 0.0
    assert c.source("floatX") == "SYMGPU_FLAGS"
    with c.change_flags({"gpuarray.preallocate": 0.25, "profile": "1"}):
        assert c.gpuarray.preallocate == 0.25 and c.profile is True
    assert c.profile is False


def test_change_flags_decorator_and_exception():
    c = make()

    @c.change_flags(floatX="float32")
    def f(x):
        if x:
            raise RuntimeError("boom")
        return c.floatX

    assert f.__name__ == "f"
    assert f(0) == "float32" and c.floatX == "float64"
    with pytest.raises(RuntimeError):
        f(1)
    assert c.floatX == "float64"
    with pytest.raises(KeyError):
        with c.change_flags(mode="DebugMode"):
            raise KeyError
    assert c.mode == "FAST_RUN"


def test_change_flags_nested_and_reentrant():
    c = make()
    outer = c.change_flags(floatX="float32", profile=True)
    with outer:
        with c.change_flags(floatX="float16"):
            assert c.floatX == "float16" and c.profile is True
            with outer:  # re-entering the same object
                assert c.floatX == "float32"
            assert c.floatX == "float16"
        assert c.floatX == "float32"
        c.floatX = "float16"  # assignment inside is undone on exit too
    assert c.floatX == "float64" and c.profile is False


def test_change_flags_validates_up_front():
    c = make()
    with pytest.raises(ConfigError) as e:
        c.change_flags(floatX="float32", device="gpu")
    assert "'device'" in str(e.value) and "'gpu'" in str(e.value)
    assert "change_flags" in str(e.value) and "cpu, cuda, cudaN" in str(e.value)
    with pytest.raises(ConfigError, match="unknown flag 'nope'.*change_flags"):
        c.change_flags(nope=1)
    assert c.floatX == "float64"


# ----------------------------------------------------------------------------- assignment
def test_attribute_assignment_validated():
    c = make()
    c.floatX = "float32"
    c.gpuarray.preallocate = "0.9"
    c.allow_gc = "false"
    assert c.floatX == "float32" and c.gpuarray.preallocate == 0.9 and c.allow_gc is False
    assert c.source("floatX") == "assignment"
    with pytest.raises(ConfigError) as e:
        c.floatX = "float128"
    assert "floatX" in str(e.value) and "assignment" in str(e.value)
    assert "float64, float32, float16" in str(e.value)
    assert c.floatX == "float32"
    with pytest.raises(ConfigError, match="unknown flag 'floatx'"):
        c.floatx = "float32"
    with pytest.raises(ConfigError, match="unknown flag 'gpuarray.nothing'"):
        c.gpuarray.nothing = 1
    with pytest.raises(ConfigError):
        c.gpuarray = 1
    with pytest.raises(AttributeError):
        c.no_such_flag
    assert not hasattr(c.gpuarray, "no_such_flag")


# ----------------------------------------------------------------------------- params
@pytest.mark.parametrize("raw,val", [(True, True), (False, False), ("True", True),
                                     ("False", False), ("true", True), ("1", True), ("0", False),
                                     (1, True), (0, False), (" YES ", True), ("off", False)])
def test_bool_param(raw, val):
    assert BoolParam().parse(raw, "b", "test") is val


@pytest.mark.parametrize("param,bad", [
    (BoolParam(), "2"), (BoolParam(), 2), (BoolParam(), None), (EnumParam("a", "b"), "c"),
    (FloatParam(), "x"), (FloatParam(), True), (FloatParam(), "nan"), (StrParam(), 3),
    (DeviceParam(), "gpu"), (DeviceParam(), "cuda-1"), (ContextsParam(), "dev0->cpu"),
    (FloatParam(lambda x: x >= 0, "at least 0"), -1)])
def test_params_reject(param, bad):
    with pytest.raises(ConfigError) as e:
        param.parse(bad, "someflag", "test")
    assert "someflag" in str(e.value) and param.allowed in str(e.value)


def test_params_accept():
    assert DeviceParam().parse("cuda", "d", "t") == "cuda"
    assert DeviceParam().parse("cuda12", "d", "t") == "cuda12"
    assert FloatParam().parse("-1", "f", "t") == -1.0 and FloatParam().parse(512, "f", "t") == 512.0
    assert PathParam().parse("~/x", "p", "t") == os.path.expanduser("~/x")


def test_parse_contexts():
    assert parse_contexts("") == {}
    assert parse_contexts(" a -> cuda0 ; b->cuda1;") == {"a": "cuda0", "b": "cuda1"}
    for bad in ["a->cuda0;a->cuda1", "cuda0->cuda0", "a-cuda0", "a->", "->cuda0"]:
        with pytest.raises(ValueError):
            parse_contexts(bad)


# ----------------------------------------------------------------------------- registration
def test_add_after_env_read(tmp_path):
    c = make("myfeature.level=3,myfeature.on=yes", rc="[myfeature]\nlevel = 1\nmode = x\n",
             tmp_path=tmp_path, strict=False)
    with pytest.raises(ConfigError, match="unknown flag 'myfeature.level'"):
        c.check_unknown()
    c.add("myfeature.level", "how hard", FloatParam(), 0)
    c.add("myfeature.on", "switch", BoolParam(), False)
    assert c.myfeature.level == 3.0 and c.myfeature.on is True  # env beats rc
    with pytest.raises(ConfigError, match="unknown flag 'myfeature.mode'"):
        c.check_unknown()
    with pytest.raises(ConfigError, match="'x' for flag 'myfeature.mode'.*allowed: a, b"):
        c.add("myfeature.mode", "m", EnumParam("a", "b"), "a")
    c.add("myfeature.mode", "m", StrParam(), "a")
    c.check_unknown()
    assert c.myfeature.mode == "x"
    with c.change_flags(myfeature__level=5):
        assert c.myfeature.level == 5.0


def test_add_errors():
    c = make()
    with pytest.raises(ConfigError, match="already"):
        c.add("floatX", "again", StrParam(), "")
    with pytest.raises(ConfigError):
        c.add("gpuarray", "clashes with the section", StrParam(), "")
    with pytest.raises(ConfigError):
        c.add("floatX.sub", "under a flag", StrParam(), "")
    with pytest.raises(ConfigError):
        c.add("describe", "clashes with a method", StrParam(), "")
    with pytest.raises(ConfigError, match="default"):
        c.add("newflag", "bad default", BoolParam(), "perhaps")
    assert not hasattr(c, "newflag")


def test_strict_rejects_unknown_at_construction():
    with pytest.raises(ConfigError):
        make("myfeature.level=3")


# ----------------------------------------------------------------------------- describe / dump
def test_describe_and_dump():
    c = make("floatX=float32")
    rows = {r[0]: r for r in c.describe()}
    names = ["device", "force_device", "floatX", "warn_float64", "mode", "optimizer_including",
             "optimizer_excluding", "profile", "profile_memory", "allow_gc", "assert_no_cpu_op",
             "contexts", "gpuarray.preallocate", "gpuarray.cuda_graphs", "gpuarray.sync_checks",
             "gpuarray.allow_tf32", "gpuarray.cublaslt", "gpuarray.gemm_epilogue",
             "distributed.timeout", "distributed.check_shapes", "distributed.comm_stream",
             "nvcc.flags",
             "compiledir", "cxx", "compile_log", "exception_verbosity", "print_active_device",
             "compute_test_value", "compute_test_value_opt", "print_test_value",
             "optimizer_verbose", "mixed_precision"]
    assert list(rows)[:len(names)] == names  # then Theano's flags (tests/test_theano_flags.py)
    assert rows["floatX"][1:] == (rows["floatX"][1], "float64, float32, float16, bfloat16", "float64",
                                  "float32")
    assert all(doc and "\n" not in doc for _, doc, *_ in c.describe())
    text = str(c)
    assert "floatX" in text and "'float32'" in text and "SYMGPU_FLAGS" in text
    assert c.dump() == text and len(text.splitlines()) == len(rows)
    assert c.tags("optimizer_including") == []
    assert "gpuarray" in dir(c) and "preallocate" in dir(c.gpuarray)


# ----------------------------------------------------------------------------- subprocess
def _run(code: str, flags: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SYMGPURC", "SYMGPU_FLAGS")}
    env.update(PYTHONPATH=REPO, SYMGPU_FLAGS=flags, HOME=str(tmp_path),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_subprocess_env_flag(tmp_path):
    code = ("import symgpu.config as m\nfrom symgpu.config import config\n"
            "assert config.floatX == 'float32', config.floatX\n"
            "assert config.context_map() == {'d0': 'cuda0', 'd1': 'cuda1'}\n"
            "m.floatX = 'float16'\nassert config.floatX == 'float16' and m.floatX == 'float16'\n"
            "try:\n    m.floatX = 'int8'\nexcept ValueError: pass\nelse: raise SystemExit(3)\n"
            "print('OK', config.compiledir)")
    r = _run(code, "floatX=float32,contexts=d0->cuda0;d1->cuda1", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK " + str(tmp_path / "cache"))


def test_subprocess_bad_flag(tmp_path):
    r = _run("import symgpu.config", "floatX=float8", tmp_path)
    assert r.returncode != 0
    assert "ConfigError" in r.stderr and "floatX" in r.stderr and "float8" in r.stderr
    assert "float64, float32, float16" in r.stderr and "SYMGPU_FLAGS" in r.stderr
    r = _run("import symgpu.config", "no_such_flag=1", tmp_path)
    assert r.returncode != 0 and "unknown flag 'no_such_flag'" in r.stderr


def test_subprocess_rc_file(tmp_path):
    (tmp_path / ".symgpurc").write_text("[global]\nexception_verbosity = high\n"
                                        "[gpuarray]\npreallocate = -1\n")
    r = _run("from symgpu.config import config\n"
             "print(config.exception_verbosity, config.gpuarray.preallocate)", "", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["high", "-1.0"]


def test_live_record_follows_assignment_and_change_flags():
    c = make("nvcc.flags=-O2")
    rec = c.live("nvcc.flags")
    assert rec.value == "-O2"
    with c.change_flags(**{"nvcc.flags": "-O3"}):
        assert rec.value == "-O3"
    assert rec.value == "-O2"
    c.nvcc.flags = "-lineinfo"
    assert rec.value == "-lineinfo" and c.live("nvcc.flags") is rec
    with pytest.raises(ConfigError, match="unknown flag 'nvcc.flagz'"):
        c.live("nvcc.flagz")
