"""Helpers shared by the tests/test_rewriting_*.py files (no tests of its own)."""
import numpy as np
import pytest

from symgpu import function
from symgpu.compile.mode import Mode
from symgpu.graph.rewriting import settings
from symgpu.tensor.elemwise import Elemwise

#: FAST_RUN without fusion and in-place, so that the rewritten ops stay visible
VISIBLE = Mode("FAST_RUN").excluding_tags("fusion", "inplace")


@pytest.fixture(autouse=True)
def raise_on_rewrite_errors():
    old = settings.on_error
    settings.on_error = "raise"
    yield
    settings.on_error = old


def op_names(fn) -> list[str]:
    """Scalar-op names for Elemwise nodes, class names otherwise, in toposort order."""
    out = []
    for n in fn.maker.fgraph.toposort():
        if isinstance(n.op, Elemwise):
            out.append(str(n.op.scalar_op))
        else:
            out.append(type(n.op).__name__)
    return out


def rewritten(inputs, outputs, mode=VISIBLE):
    return function(inputs, outputs, mode=mode, on_unused_input="ignore")


def same_values(inputs, outputs, *values, rtol=1e-6, atol=1e-7):
    """The rewritten function (FAST_RUN) gives the values of the unrewritten graph."""
    fast = function(inputs, outputs, on_unused_input="ignore")
    plain = function(inputs, outputs, mode=Mode("FAST_COMPILE").excluding_tags("canonicalize"),
                     on_unused_input="ignore")
    a, b = fast(*values), plain(*values)
    for u, v in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
        np.testing.assert_allclose(u, v, rtol=rtol, atol=atol)
    return fast
