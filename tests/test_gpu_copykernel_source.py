"""The strided-copy module's CUDA lives in codegen/strided_copy.cu: its entry points must be
the ones copykernel.py launches (no GPU needed; test_gpu_compiler compiles it with nvcc)."""
from __future__ import annotations

import re

from symgpu.gpu.runtime import copykernel

ENTRY = re.compile(r"^SG_STRIDED\((\w+), ([\w ]+), (\w+)\)$", re.M)


def test_every_launched_kernel_is_in_the_template():
    src = copykernel.STRIDED_COPY_SOURCE
    entries = {name: (ctype, op) for name, ctype, op in ENTRY.findall(src)}
    expected = {f"strided_copy_{n}": (t, "SgAssign") for n, t in
                ((1, "unsigned char"), (2, "unsigned short"), (4, "unsigned int"),
                 (8, "unsigned long long"))}
    expected.update({f"strided_inc_{d}": (t, "SgAdd") for d, t in copykernel.INC_DTYPES.items()})
    assert entries == expected


def test_template_is_filled():
    src = copykernel.STRIDED_COPY_SOURCE
    assert "$" not in src
    assert f"#define MAX_DIMS {copykernel.MAX_DIMS}\n" in src
    assert copykernel.prefetch_request()[1]() == src
