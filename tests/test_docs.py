"""The user guide's code runs, its links resolve, and docs/flags.md is up to date.

Every ```python block of docs/*.md is executed, in order, in one fresh interpreter per page
(so a block may use what an earlier block of the same page defined), with
``SYMGPU_FLAGS=device=cpu`` and no rc file. Blocks fenced ```python gpu need a GPU: they run,
in order, in a separate interpreter per page with ``SYMGPU_FLAGS=device=cuda`` in tests
marked ``gpu`` (``pytest -m gpu``; skipped where no GPU can be used). A failure names the page
and the line of the block (tracebacks point into the .md file). Other fences (bash, ini, text)
are not run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGES = sorted(f for f in os.listdir(DOCS) if f.endswith(".md"))
FENCE = re.compile(r"^(\s*)```(.*)$")
RUNNABLE = {"python": "cpu", "python gpu": "gpu"}

# Runs the blocks it reads as JSON on stdin; each is compiled with the page's name and padded
# so that tracebacks give the line in the .md file.
RUNNER = r"""
import json, sys, traceback
blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for page, line, code in blocks:
    try:
        exec(compile("\n" * (line - 1) + code, page, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: the block at {page}:{line}", file=sys.stderr)
        sys.exit(1)
"""


def code_blocks(page: str) -> list[tuple[int, str, str]]:
    """(first code line, fence info, code) of every fenced block of docs/<page>."""
    with open(os.path.join(DOCS, page), encoding="utf-8") as fh:
        text = fh.read().splitlines()
    blocks, i = [], 0
    while i < len(text):
        m = FENCE.match(text[i])
        if not m:
            i += 1
            continue
        indent, info = m.group(1), m.group(2).strip()
        body, j = [], i + 1
        while j < len(text) and not re.match(rf"^{indent}```\s*$", text[j]):
            line = text[j]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            j += 1
        assert j < len(text), f"{page}:{i + 1}: unclosed code fence"
        blocks.append((i + 2, info, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def runnable(page: str, kind: str) -> list[tuple[str, int, str]]:
    return [(f"docs/{page}", line, code) for line, info, code in code_blocks(page)
            if RUNNABLE.get(info) == kind]


def run_blocks(blocks: list, flags: str, cwd: str, timeout: float = 120
               ) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update({"SYMGPU_FLAGS": flags, "SYMGPURC": os.devnull, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")})
    return subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks), cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


# ============================================================================ structure

def test_the_guide_has_its_pages():
    for page in ("using_the_gpu.md", "memory_and_variables.md", "profiling.md",
                 "pycuda_interop.md", "multiple_gpus.md", "flags.md", "README.md"):
        assert page in PAGES, page


@pytest.mark.parametrize("page", PAGES)
def test_fences_are_known(page):
    """A ```python fence with another word (```python-gpu, ```python cpu) would silently not
    run: only `python` and `python gpu` are allowed for Python."""
    for line, info, _ in code_blocks(page):
        if info.startswith("python") or info.startswith("py"):
            assert info in RUNNABLE, f"docs/{page}:{line - 1}: unknown fence ```{info}"


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    with open(os.path.join(DOCS, page), encoding="utf-8") as fh:
        text = fh.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # not inside code
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        assert os.path.exists(os.path.normpath(os.path.join(DOCS, path))), \
            f"docs/{page}: broken link {target}"


def test_every_page_is_in_the_index():
    with open(os.path.join(DOCS, "README.md"), encoding="utf-8") as fh:
        index = fh.read()
    for page in PAGES:
        if page != "README.md":
            assert f"({page})" in index, f"docs/README.md does not link {page}"


def test_flags_reference_is_up_to_date():
    env = {k: v for k, v in os.environ.items() if k not in ("SYMGPU_FLAGS",)}
    env["SYMGPURC"] = os.devnull
    proc = subprocess.run([sys.executable, os.path.join(DOCS, "gen_flags.py"), "--check"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + "\n(run: python3 docs/gen_flags.py)"


def test_flags_reference_lists_every_flag():
    from symgpu import config
    with open(os.path.join(DOCS, "flags.md"), encoding="utf-8") as fh:
        text = fh.read()
    for name, *_ in config.describe():
        assert f"\n## {name}\n" in text, name


# ============================================================================ running

CPU_PAGES = [p for p in PAGES if runnable(p, "cpu")]
GPU_PAGES = [p for p in PAGES if runnable(p, "gpu")]


@pytest.mark.parametrize("page", CPU_PAGES)
def test_python_blocks_run_on_the_cpu(page, tmp_path):
    check(run_blocks(runnable(page, "cpu"), "device=cpu", str(tmp_path)))


def _pycuda_utils_missing() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("symgpu.misc.pycuda_utils") is None
    except ImportError:
        return True


@pytest.mark.gpu
@pytest.mark.parametrize("page", GPU_PAGES)
def test_python_gpu_blocks_run_on_the_gpu(page, tmp_path):
    if page == "pycuda_interop.md" and _pycuda_utils_missing():  # being written (interop)
        pytest.xfail("symgpu.misc.pycuda_utils (to_gpuarray/from_gpuarray) is not there yet")
    check(run_blocks(runnable(page, "gpu"), "device=cuda", str(tmp_path), timeout=300))


# ============================================================================ API reference

def _api_sections() -> dict[str, str]:
    """docs/api.md split into its `## <module>` sections (text outside code fences); a
    module with several sections (each engineer appends one) gets them all."""
    with open(os.path.join(DOCS, "api.md"), encoding="utf-8") as fh:
        text = re.sub(r"```.*?```", "", fh.read(), flags=re.S)
    parts = re.split(r"^## (\S+)[^\n]*$", text, flags=re.M)
    sections: dict[str, str] = {}
    for i in range(1, len(parts), 2):
        sections[parts[i]] = sections.get(parts[i], "") + parts[i + 1]
    return sections


def _module_text(sections: dict[str, str], module: str) -> str:
    """The sections of `module` and of its submodules (`## symgpu.tensor.shape` documents
    names that `symgpu.tensor` re-exports)."""
    return "".join(text for name, text in sections.items()
                   if name == module or name.startswith(module + "."))


def _own_public_names(module, prefixes: tuple[str, ...]) -> list[str]:
    """The names a user reaches through `module`: not private, not a module, and defined in
    one of `prefixes` (names a module merely imported, like Apply or np, are documented
    where they are defined)."""
    import types
    names = []
    for name in dir(module):
        obj = getattr(module, name)
        if name.startswith("_") or isinstance(obj, types.ModuleType):
            continue
        if (getattr(obj, "__module__", None) or "").startswith(prefixes):
            names.append(name)
    return names


def _documented(section: str, name: str) -> bool:
    # a code span that starts with the name, maybe qualified: `name`, `name(...)`,
    # `symgpu.name(...)`, `name[...]` or `name ...`
    return re.search(r"`(?:[\w.]+\.)?" + re.escape(name) + r"[`(\[ ]", section) is not None


def test_api_reference_names_every_public_name():
    import symgpu
    import symgpu.gradient
    import symgpu.printing
    import symgpu.tensor
    import symgpu.tensor.nnet
    import symgpu.d3viz
    sections = _api_sections()
    wanted = {
        "symgpu": list(symgpu.__all__),
        "symgpu.tensor": _own_public_names(symgpu.tensor, ("symgpu.tensor", "symgpu.gradient")),
        "symgpu.tensor.nnet": _own_public_names(symgpu.tensor.nnet, ("symgpu.tensor.nnet",)),
        "symgpu.gradient": _own_public_names(symgpu.gradient, ("symgpu.gradient",)),
        "symgpu.printing": list(symgpu.printing.__all__),
        "symgpu.d3viz": list(symgpu.d3viz.__all__),
    }
    missing = []
    for module, names in wanted.items():
        assert module in sections, f"docs/api.md has no '## {module}' section"
        assert len(names) > 5, (module, names)
        text = _module_text(sections, module)
        missing += [f"{module}.{n}" for n in sorted(names) if not _documented(text, n)]
    assert not missing, ("docs/api.md does not document (add a line `name(signature)` — ... to "
                         "the module's section): " + ", ".join(missing))


def test_api_reference_starts_with_its_heading():
    with open(os.path.join(DOCS, "api.md"), encoding="utf-8") as fh:
        assert fh.readline().strip() == "# API reference"


def _project_files() -> list[str]:
    """What a user receives: the package, the docs, the examples and the README."""
    found = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "pyproject.toml")]
    for top in ("symgpu", "docs", "examples"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            found += [os.path.join(dirpath, f) for f in files
                      if f.endswith((".py", ".md", ".cu", ".cuh", ".txt", ".toml"))]
    return found


def test_no_file_points_outside_the_repository():
    """Users have only the repository: no page or docstring may send them to the
    developers' workspace files."""
    outside = re.compile(r"\.\./shared|SPEC\.md|DESIGN\.md")
    offenders = []
    for path in _project_files():
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if outside.search(line):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
