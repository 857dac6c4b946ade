"""wgmma.py: the rendered warpgroup products' inline PTX (operand numbering, shapes) and its
helpers, compiled by nvcc for sm_90a."""
import re

import pytest

from symgpu.gpu.runtime.codegen.wgmma import WGMMA_TYPES, wgmma_source

from gpu_helpers import compile_for_sm90, requires_nvcc


def _asm(src: str, ptx: str, n: int, kind: str) -> str:
    """The asm body of Wg<ptx type>::kind for m64n{n}k16."""
    ctype = next(c for c, p in WGMMA_TYPES.items() if p == ptx)
    struct = src[src.index(f"struct Wg<{ctype}>"):]
    struct = struct[:struct.index("};")]
    i = struct.index(f"void {kind}(float (&d)[{n // 2}]")
    return struct[i:struct.index("}\n", struct.index("asm volatile", i))]


@pytest.mark.parametrize("n", [32, 64, 128])
def test_operands_are_numbered_after_the_accumulators(n):
    src = wgmma_source([n])
    r = n // 2
    ss = _asm(src, "bf16", n, "ss")
    assert f"m64n{n}k16.f32.bf16.bf16" in ss
    assert "{" + ", ".join(f"%{i}" for i in range(r)) + "}" in ss
    assert f"%{r}, %{r + 1}, p, 1, 1, %{r + 3}, %{r + 4}" in ss       # descs, TA, TB
    assert f"setp.ne.b32 p, %{r + 2}, 0" in ss                        # acc
    assert len(re.findall(r'"\+f"\(d\[\d+\]\)', ss)) == r
    rs = _asm(src, "f16", n, "rs")
    assert f"m64n{n}k16.f32.f16.f16" in rs
    assert "{" + ", ".join(f"%{i}" for i in range(r, r + 4)) + "}" in rs   # A registers
    assert f"%{r + 4}, p, 1, 1, %{r + 6}" in rs and f"setp.ne.b32 p, %{r + 5}, 0" in rs


def test_shapes_wgmma_lacks_are_refused():
    for n in (0, 12, 264):
        with pytest.raises(ValueError, match="no m64n"):
            wgmma_source([n])


@requires_nvcc
def test_every_product_compiles_for_sm90a(tmp_path):
    """Each shape and type instantiated in a kernel (member templates compile only when
    used), with the descriptor and fence helpers."""
    calls = []
    for ctype in WGMMA_TYPES:
        for n in (32, 64, 128):
            calls.append(f"""{{ float d[{n // 2}] = {{}}; unsigned a[4] = {{1, 2, 3, 4}};
        Wg<{ctype}>::ss<0, 1>(d, wg_desc(0, 1024, 1024), wg_desc(1024, 16, 1024), 0);
        Wg<{ctype}>::rs<1>(d, a, wg_desc(2048, 1024, 1024), 1);
        wg_commit(); wg_wait<0>(); wg_keep(d); out[{n}] = d[0]; }}""")
    src = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + wgmma_source([32, 64, 128]) +
           'extern "C" __global__ void wg_products(float *out) { wg_proxy_fence(); wg_fence();\n'
           + "\n".join(calls) + "}\n")
    assert b"wg_products" in compile_for_sm90(src, tmp_path, "sm_90a")
