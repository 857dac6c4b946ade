"""The persistent kernel cache (symgpu.gpu.runtime.compiler): runs nvcc, needs no GPU."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from gpu_helpers import requires_nvcc
from symgpu.config import config
from symgpu.gpu.runtime import compiler
from symgpu.link import diskcache
from symgpu.gpu.runtime.compiler import CompileError, cache_key, compile_to_cubin

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL = 'extern "C" __global__ void twice(float *a, int n)\n' \
         '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] *= 2.0f; }\n'


def unique_kernel() -> str:
    """A kernel no earlier run can have cached."""
    return f"// {uuid.uuid4()}\n{KERNEL}"


@pytest.fixture
def cachedir(tmp_path):
    """A fresh compiledir, and no memory of earlier compiles."""
    root = tmp_path / "cache"
    compiler.clear_memory_cache()
    with config.change_flags(compiledir=str(root), compile_log=False, **{"nvcc.flags": ""}):
        yield root
    compiler.clear_memory_cache()


def entry_files(root, digest):
    base = root / "kernels" / digest[:2] / digest
    return base.with_suffix(".cubin"), root / "kernels" / digest[:2] / (digest + ".cubin.sha256")


@requires_nvcc
def test_key_depends_on_source_options_arch_and_is_stable():
    base = cache_key(KERNEL, ["-O3"], "sm_90")
    assert base == cache_key(KERNEL, ["-O3"], "sm_90")
    assert len(base) == 64
    others = {cache_key(KERNEL + " ", ["-O3"], "sm_90"), cache_key(KERNEL, [], "sm_90"),
              cache_key(KERNEL, ["-O3"], "sm_80")}
    assert base not in others and len(others) == 3
    assert "release" in compiler.nvcc_version()


@requires_nvcc
def test_nvcc_flags_are_part_of_the_key(cachedir):
    _, plain, _ = compile_to_cubin(KERNEL)
    with config.change_flags(**{"nvcc.flags": "--use_fast_math"}):
        path_fast, _, hit = compile_to_cubin(KERNEL)
    assert not hit
    assert path_fast != compile_to_cubin(KERNEL)[0]


@requires_nvcc
def test_miss_then_disk_hit_without_nvcc(cachedir, monkeypatch, capsys):
    src = unique_kernel()
    with config.change_flags(compile_log=True):
        path, cubin, hit = compile_to_cubin(src)
        assert not hit and cubin[:4] == b"\x7fELF"
        digest = cache_key(src, [], "sm_90")
        cubin_path, sum_path = entry_files(cachedir, digest)
        assert path == str(cubin_path) and cubin_path.read_bytes() == cubin
        assert sum_path.read_text().strip() == __import__("hashlib").sha256(cubin).hexdigest()
        # a second process would find it on disk: no nvcc allowed
        compiler.clear_memory_cache()
        monkeypatch.setattr(compiler, "_run_nvcc", lambda *a: pytest.fail("nvcc ran on a hit"))
        path2, cubin2, hit2 = compile_to_cubin(src)
        assert hit2 and cubin2 == cubin and path2 == path
        _, _, hit3 = compile_to_cubin(src)  # now from memory
        assert hit3
    log = capsys.readouterr().err
    assert "miss (absent)" in log and "hit (disk)" in log and "hit (memory)" in log


@requires_nvcc
def test_cache_dir_is_private(cachedir):
    compile_to_cubin(KERNEL)
    for d in (cachedir, cachedir / "kernels"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    leftovers = [p for p in (cachedir / "kernels").rglob("*")
                 if p.name.startswith(".tmp-") or p.name.startswith("build-")]
    assert leftovers == []


@requires_nvcc
def test_interrupted_write_leaves_no_entry(cachedir, monkeypatch):
    src = unique_kernel()
    real_replace = os.replace

    def crash(a, b):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(compiler.os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        compile_to_cubin(src)
    monkeypatch.setattr(compiler.os, "replace", real_replace)
    cubin_path, sum_path = entry_files(cachedir, cache_key(src, [], "sm_90"))
    assert not cubin_path.exists() and not sum_path.exists()
    assert not [p for p in cubin_path.parent.iterdir() if p.name.startswith(".tmp-")]
    _, _, hit = compile_to_cubin(src)
    assert not hit and cubin_path.exists()


@requires_nvcc
@pytest.mark.parametrize("damage", ["truncate", "flip", "sidecar", "missing_sidecar"])
def test_corrupt_entry_is_recompiled(cachedir, capsys, damage):
    src = unique_kernel()
    _, good, _ = compile_to_cubin(src)
    cubin_path, sum_path = entry_files(cachedir, cache_key(src, [], "sm_90"))
    if damage == "truncate":
        cubin_path.write_bytes(good[: len(good) // 2])
    elif damage == "flip":
        cubin_path.write_bytes(good[:100] + bytes([good[100] ^ 0xFF]) + good[101:])
    elif damage == "sidecar":
        sum_path.write_text("0" * 64)
    else:
        sum_path.unlink()
    compiler.clear_memory_cache()
    with config.change_flags(compile_log=True):
        _, again, hit = compile_to_cubin(src)
    assert not hit and again == good
    assert cubin_path.read_bytes() == good
    expected = "absent" if damage == "missing_sidecar" else "checksum mismatch"
    assert f"miss ({expected})" in capsys.readouterr().err


@requires_nvcc
def test_two_processes_compile_once(cachedir, tmp_path):
    src = unique_kernel()
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, sys, time
        from symgpu.gpu.runtime.compiler import compile_to_cubin
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        path, cubin, hit = compile_to_cubin({src!r})
        print("RESULT", hit, len(cubin))
    """)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               SYMGPU_FLAGS=f"compiledir={cachedir},compile_log=True")
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(0.5)  # both are importing / waiting
    go.write_text("")
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "RESULT" in out
    logs = "".join(err for _, err in outs)
    assert logs.count("miss (absent)") == 1, logs
    assert logs.count("hit (disk)") == 1, logs
    sizes = {out.split()[-1] for out, _ in outs}
    assert len(sizes) == 1


@requires_nvcc
def test_world_writable_dir_is_refused(tmp_path):
    root = tmp_path / "shared-cache"
    root.mkdir()
    os.chmod(root, 0o777)
    compiler.clear_memory_cache()
    diskcache._checked_dirs.clear()
    with config.change_flags(compiledir=str(root)):
        with pytest.raises(PermissionError, match="writable by group or others.*chmod 700"):
            compile_to_cubin(KERNEL)
        os.chmod(root, 0o700)
        compile_to_cubin(KERNEL)  # fixed: accepted


@requires_nvcc
@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="only root can give a directory to another user")
def test_dir_of_another_user_is_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 4242, -1)
    compiler.clear_memory_cache()
    diskcache._checked_dirs.clear()
    with config.change_flags(compiledir=str(root)):
        with pytest.raises(PermissionError, match="owned by uid 4242"):
            compile_to_cubin(KERNEL)


@requires_nvcc
def test_compile_error_keeps_source(cachedir):
    bad = 'extern "C" __global__ void broken(float *a) { a[0] = undefined_name; }\n'
    with pytest.raises(CompileError) as info:
        compile_to_cubin(bad)
    err = info.value
    assert err.source_path and os.path.exists(err.source_path)
    assert Path(err.source_path).read_text() == bad
    assert err.source_path in str(err)
    assert "undefined_name" in str(err) and "undefined_name" in err.stderr
    assert "-arch=sm_90" in str(err)
    # a failure is not cached: fixing nothing still fails the same way
    with pytest.raises(CompileError):
        compile_to_cubin(bad)


@requires_nvcc
def test_strided_copy_kernels_compile(cachedir):
    """The codegen layer of CI: every kernel the runtime ships compiles for sm_90."""
    from symgpu.gpu.runtime.copykernel import INC_DTYPES, STRIDED_COPY_SOURCE
    _, cubin, _ = compile_to_cubin(STRIDED_COPY_SOURCE)
    for size in (1, 2, 4, 8):
        assert f"strided_copy_{size}".encode() in cubin
    for dtype in INC_DTYPES:
        assert f"strided_inc_{dtype}".encode() in cubin


def test_missing_nvcc_is_a_clear_error(cachedir, monkeypatch):
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    monkeypatch.setattr(compiler, "_nvcc_version", None)
    with pytest.raises(CompileError, match="nvcc was not found on PATH"):
        compile_to_cubin(KERNEL)


class _FakeFunction:
    def __init__(self, name):
        self.name, self.prepared = name, []

    def prepare(self, signature):
        self.prepared.append(signature)


class _FakeCtx:
    arch = "sm_90"


@pytest.fixture
def fake_loads(cachedir, monkeypatch):
    """compile_module faked (no nvcc, no GPU): each load is recorded and makes new Functions."""
    loads, made = [], []

    class Module:
        def get_function(self, name):
            made.append(_FakeFunction(name))
            return made[-1]

    def fake_compile_module(source, options=(), arch=None, context=None):
        time.sleep(0.001)   # a load takes a while: threads asking at once overlap
        loads.append((source, context))
        return Module()
    monkeypatch.setattr(compiler, "compile_module", fake_compile_module)
    return loads, made


def test_get_prepared_kernel_prepares_once_per_kernel_flags_and_context(fake_loads):
    loads, _ = fake_loads
    renders = []

    def source():
        renders.append(1)
        return "src"

    def get(name="f", signature="PPq", ctx=None, key=("k",)):
        return compiler.get_prepared_kernel(key, source, name, signature, context=ctx or one)
    one, two = _FakeCtx(), _FakeCtx()
    fn = get()
    assert fn.prepared == ["PPq"] and get() is fn and fn.prepared == ["PPq"]
    assert len(renders) == len(loads) == 1   # a hit renders and loads nothing
    g = get("g", "qq")
    assert g is not fn and g.prepared == ["qq"]
    assert get(key=("k2",)) is not fn
    assert get(ctx=two) is not fn and get(ctx=two).prepared == ["PPq"]
    with config.change_flags(**{"nvcc.flags": "--use_fast_math"}):
        fast = get()
        assert fast is not fn and fast.prepared == ["PPq"] and get() is fast
    assert get() is fn and fn.prepared == ["PPq"]
    with pytest.raises(ValueError, match="prepared as 'PPq', not 'PPqq'"):
        get(signature="PPqq")
    assert fn.prepared == ["PPq"]
    compiler.clear_memory_cache()
    again = get()
    assert again is not fn and again.prepared == ["PPq"] and get() is again


def test_get_prepared_kernel_prepares_once_across_threads(fake_loads):
    import concurrent.futures
    _, made = fake_loads
    ctx = _FakeCtx()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: compiler.get_prepared_kernel(
            ("k",), lambda: "src", "f", "PPq", context=ctx), range(16)))
    assert all(fn is got[0] for fn in got)
    assert sum(len(fn.prepared) for fn in made) == 1


class _LaunchingFunction:
    """A prepared Function as PyCUDA's: ``_launch_kernel`` and its own slow call."""

    def __init__(self, texrefs=()):
        self.launched, self.slow, self.texrefs, self.num_regs = [], [], list(texrefs), 17

    def _launch_kernel(self, grid, block, buf, shared, stream):
        self.launched.append((grid, block, bytes(buf), shared, stream))

    def prepared_async_call(self, grid, block, stream, *args):
        self.slow.append((grid, block, stream, args))


def test_prepared_kernel_packs_once_and_launches_directly():
    import struct
    from symgpu.gpu.runtime.codegen.launch import PreparedKernel

    class Ptr:   # a device pointer as symgpu's are: an __index__
        def __index__(self):
            return 0x7000

    fn = _LaunchingFunction()
    k = PreparedKernel(fn, "PPqi")
    k.prepared_async_call((3, 1), (256, 1, 1), "s", 0x1000, Ptr(), 5, 2)
    assert fn.launched == [((3, 1), (256, 1, 1), struct.pack("@PPqi", 0x1000, 0x7000, 5, 2),
                            0, "s")]
    assert not fn.slow
    assert k.num_regs == 17 and k.function is fn             # the rest is the Function's
    odd = object()
    k.prepared_async_call((1, 1), (32, 1, 1), None, odd, 0, 1, 2)   # not packable here
    assert fn.slow == [((1, 1), (32, 1, 1), None, (odd, 0, 1, 2))] and len(fn.launched) == 1
    textured = _LaunchingFunction(texrefs=["t"])             # texrefs: PyCUDA's call sets them
    PreparedKernel(textured, "P").prepared_async_call((1, 1), (1, 1, 1), None, 8)
    assert textured.slow == [((1, 1), (1, 1, 1), None, (8,))] and not textured.launched
