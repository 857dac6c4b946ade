"""symgpu: a symbolic tensor-graph compiler in the tradition of Theano, with a CUDA backend.

Build graphs from symbolic variables (`symgpu.tensor`), compile them with `function`, and run
them on the CPU or, with `device=cuda`, on an NVIDIA GPU. Importing needs no GPU or PyCUDA.
"""
from symgpu.config import config
from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.op import Op
from symgpu.compile.io import In, Out
from symgpu.compile.function import function
from symgpu.compile.sharedvalue import shared
import symgpu.tensor as tensor
from symgpu.compile.mode import Mode  # Theano's theano.Mode
import symgpu.gradient as gradient  # theano.gradient.jacobian, hessian...
from symgpu.gradient import grad
import symgpu.printing as printing
from symgpu.compile.explain import explain
from symgpu.printing import pp  # Theano's theano.pp

__version__ = "0.1.0"

__all__ = ["config", "function", "shared", "grad", "In", "Out", "Apply", "Op", "Variable",
           "Constant", "tensor", "__version__"]
__all__ += ["explain"]
__all__ += ["pp"]

import symgpu.compile.profiling  # noqa: E402,F401  (registers the profiler hook)
__all__ += ["Mode", "printing", "gradient"]
import symgpu.gpu  # noqa: E402,F401  (registers the GPU backend: types, transfers, placement; no PyCUDA)

# loops (scan is a callable module: symgpu.scan(...) and symgpu.scan.until both work)
import symgpu.scan  # noqa: E402
from symgpu.scan import foldl, foldr, map, reduce  # noqa: E402,A004
import symgpu.scan_module  # noqa: E402,F401
scan = symgpu.scan  # noqa: E402
__all__ += ["scan", "map", "reduce", "foldl", "foldr"]
import symgpu.ifelse  # noqa: E402,F401  (symgpu.ifelse.ifelse, the lazy branch)
