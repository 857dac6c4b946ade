"""Theano's module paths, mapped onto symgpu's modules: the one place that says which Theano
path lives where here (and where symgpu's own moved modules went: their old paths stay).

The top layer (docs/internals.md, "Layers"): nothing inside the package imports it; the façade
installs its import hook (`install`). Each path resolves lazily, when imported or first
reached as an attribute, so the table costs no start-up time and the code stays laid out by
concern. A path that names one module of ours *is* that module (same classes, so `isinstance`
and pickles agree); a path that gathers several makes a module whose names come from the
first of them that has each one.

    from symgpu.gpu.basic_ops import gpu_from_host       # Theano: theano.gpuarray.basic_ops
    import symgpu.gof.graph                               # Theano: theano.gof.graph
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["PATHS", "RENAMES", "install", "resolve"]

#: Theano's path (under ``symgpu.``) -> our module, or the modules whose public names it gathers
PATHS: dict[str, str | tuple[str, ...]] = {
    # the graph core (theano.gof)
    "symgpu.gof": ("symgpu.graph.basic", "symgpu.graph.op", "symgpu.graph.fg",
                   "symgpu.graph.rewriting", "symgpu.graph.sharedvalue",
                   "symgpu.graph.theano_types", "symgpu.graph.params_type"),
    "symgpu.gof.params_type": "symgpu.graph.params_type",
    "symgpu.gof.op": "symgpu.graph.op",
    "symgpu.gof.type": ("symgpu.graph.basic", "symgpu.graph.theano_types"),
    "symgpu.gof.fg": "symgpu.graph.fg",
    "symgpu.gof.toolbox": ("symgpu.graph.fg", "symgpu.graph.rewriting", "symgpu.graph.features"),
    "symgpu.gof.opt": "symgpu.graph.rewriting",
    "symgpu.gof.optdb": "symgpu.graph.rewriting.db",
    "symgpu.gof.destroyhandler": "symgpu.graph.rewriting.destroy",
    "symgpu.gof.vm": "symgpu.link.vm",
    "symgpu.gof.null_type": ("symgpu.gradient.core",),  # NullType
    # compiling (theano.compile)
    "symgpu.compile.function_module": "symgpu.compile.function",
    "symgpu.compile.pfunc": "symgpu.compile.shared_rebuild",  # pfunc, rebuild_collect_shared
    "symgpu.compile.builders": "symgpu.builders",  # OpFromGraph: above gradient and scan
    "symgpu.compile.nanguardmode": "symgpu.compile.monitormode",  # NanGuardMode is a MonitorMode
    # the tensor language (theano.tensor)
    "symgpu.tensor.nnet.nnet": "symgpu.tensor.nnet",
    "symgpu.tensor.opt": ("symgpu.tensor.rewriting.theano_opt", "symgpu.tensor.rewriting.slices",
                          "symgpu.tensor.rewriting.canonizer",
                          "symgpu.tensor.rewriting.basic", "symgpu.tensor.rewriting.math",
                          "symgpu.tensor.rewriting.elemwise", "symgpu.tensor.rewriting.stabilize",
                          "symgpu.tensor.rewriting.shape_feature"),
    "symgpu.tensor.raw_random": ("symgpu.tensor.random.raw", "symgpu.tensor.random.ops",
                                  "symgpu.tensor.random.numpy_state"),
    "symgpu.tensor.var": "symgpu.tensor.type",
    # Theano's test package: only its documented breakpoint op, a debugging tool
    "symgpu.tests": ("symgpu.misc.breakpoint",),  # a package, so that the path below resolves
    "symgpu.tests.breakpoint": "symgpu.misc.breakpoint",
    # loops (theano.scan_module)
    "symgpu.scan_module": ("symgpu.scan",),  # its `scan` is the function, as Theano's
    "symgpu.scan_module.scan_op": "symgpu.scan.op",
    "symgpu.scan_module.scan_checkpoints": "symgpu.scan.checkpoints",
    "symgpu.scan_module.scan_utils": ("symgpu.graph.traversal", "symgpu.scan"),  # equal_computations
    # the GPU package under Theano's names (theano.gpuarray; the old theano.sandbox.cuda)
    # symgpu.gpu, symgpu.gpuarray and symgpu.sandbox.cuda are one module object, so a
    # submodule name under the three is one attribute: each is mapped alike (RENAMES are
    # looked up under the gpuarray spelling, _canonical)
    "symgpu.gpu.basic_ops": ("symgpu.gpu.placement.basic_ops",),
    "symgpu.gpu.type": ("symgpu.gpu.placement.type",),
    "symgpu.gpuarray": "symgpu.gpu",
    "symgpu.gpuarray.basic_ops": ("symgpu.gpu.placement.basic_ops",),  # + RENAMES
    "symgpu.gpuarray.type": ("symgpu.gpu.placement.type",),            # + RENAMES
    "symgpu.gpuarray.blas": ("symgpu.gpu.ops.blas",),                  # + RENAMES
    "symgpu.gpuarray.elemwise": ("symgpu.gpu.ops.elemwise",),          # + RENAMES
    "symgpu.gpuarray.subtensor": ("symgpu.gpu.ops.subtensor", "symgpu.gpu.ops.advanced",
                                  "symgpu.gpu.ops.advanced_general"),
    "symgpu.gpuarray.nnet": ("symgpu.gpu.ops.nnet", "symgpu.gpu.ops.crossentropy",
                             "symgpu.gpu.ops.xent_softmax"),
    "symgpu.gpuarray.dnn": ("symgpu.gpu.ops.cudnn", "symgpu.gpu.ops.conv", "symgpu.gpu.ops.pooling"),
    "symgpu.gpuarray.pool": "symgpu.gpu.ops.pooling",
    "symgpu.gpuarray.ctc": "symgpu.gpu.ops.ctc",
    "symgpu.gpuarray.fft": "symgpu.gpu.ops.fft",
    # --- names-gpu (issue 31): Theano's helpers for writing GPU rewrites and kernels
    "symgpu.gpuarray.opt_util": "symgpu.gpu.ops.rewrite_helpers",
    "symgpu.gpuarray.kernel_codegen": ("symgpu.gpu.runtime.codegen.kernel_text",),
    "symgpu.gpuarray.fp16_help": ("symgpu.gpu.runtime.codegen.kernel_text",),
    # --- end of names-gpu's block
    "symgpu.sandbox.cuda": "symgpu.gpu",
    "symgpu.sandbox.cuda.basic_ops": ("symgpu.gpu.placement.basic_ops",),
    "symgpu.sandbox.cuda.type": ("symgpu.gpu.placement.type",),
    "symgpu.sandbox.cuda.blas": ("symgpu.gpu.ops.blas",),
    "symgpu.sandbox.cuda.dnn": ("symgpu.gpu.ops.cudnn", "symgpu.gpu.ops.conv",
                                "symgpu.gpu.ops.pooling"),
    # --- Theano's documented module members (issue 31, helper names2): graph walking and
    # general helpers of theano.gof
    "symgpu.gof.graph": ("symgpu.graph.basic", "symgpu.graph.traversal"),
    "symgpu.gof.utils": "symgpu.graph.utils",
    # --- end of names2's block
    # -- Theano's test corpus, round 2 (tools/theano_corpus.py): paths its tests import --
    "symgpu.compile.ops": ("symgpu.tensor.shape", "symgpu.compile.deepcopy",
                           "symgpu.compile.python_ops"),
    "symgpu.scalar.sharedvar": "symgpu.tensor.scalar_sharedvar",  # 0-d shared tensors
    # --- Theano's library beyond the core (issue 33, helper names-lib): sparse matrices
    # (theano.sparse.basic is the whole of Theano's sparse package: ours is split by
    # concern, and symgpu.sparse.basic, the old name of symgpu.sparse.construct, gathers it
    # too), its sandbox, the sandbox's neighbours
    "symgpu.sparse.basic": ("symgpu.sparse",),
    "symgpu.sparse.sandbox": ("symgpu.sparse.convolution", "symgpu.sparse.sampling"),
    "symgpu.sparse.sandbox.sp": ("symgpu.sparse.convolution", "symgpu.sparse"),
    "symgpu.sparse.sandbox.sp2": ("symgpu.sparse.sampling", "symgpu.sparse"),
    "symgpu.sparse.sandbox.truedot": ("symgpu.sparse.products",),
    "symgpu.sandbox.neighbours": "symgpu.tensor.nnet.neighbours",
    "symgpu.gpuarray.linalg": ("symgpu.gpu.ops.theano_linalg", "symgpu.gpu.ops.linalg"),
    "symgpu.gpuarray.neighbours": "symgpu.gpu.ops.neighbours",   # GpuImages2Neibs (issue 33)
    # --- end of names-lib's block
    # symgpu's own older paths: modules that moved keep their old path here
    "symgpu.gpu.placement.lifters": "symgpu.gpu.ops.lifters",
    "symgpu.gpu.placement.narrow_outputs": "symgpu.gpu.ops.narrow_outputs",
    "symgpu.gpu.placement.producer_copies": "symgpu.gpu.ops.producer_copies",
}

# --- Theano's names that are ours under other names (issue 31, helper names3) -------------
#: Theano path -> {Theano's name: "our.module:our_name"}: consulted by the gathered path
#: before its modules (resolved lazily, on first use). Only where the object behaves as
#: Theano's for what users do with it; the names Theano has with no meaning here are in
#: tools/theano_absent.py, each with its reason.
RENAMES: dict[str, dict[str, str]] = {
    # --- names-tensor (issue 31): Theano's base of Types without C code is our Type
    "symgpu.gof.type": {"PureType": "symgpu.graph.basic:Type"},
    "symgpu.gpuarray.type": {
        "get_context": "symgpu.gpu.runtime.context:get_context",
        "reg_context": "symgpu.gpu.runtime.context:register_context",
        "list_contexts": "symgpu.gpu.runtime.context:context_names",
    },
    "symgpu.gpuarray.basic_ops": {
        "GpuJoin": "symgpu.gpu.ops.subtensor:GpuJoin",
        "GpuAllocEmpty": "symgpu.gpu.ops.blas:GpuAllocEmpty",
        "infer_context_name": "symgpu.gpu.ops.theano_dnn:infer_context_name",
        **{n: f"symgpu.gpu.ops.constructors:{n}" for n in ("GpuEye", "GpuTri", "GpuSplit")},
    },
    "symgpu.gpuarray.elemwise": {
        "GpuCAReduceCuda": "symgpu.gpu.ops.elemwise:GpuCAReduce",   # our CUDA reduction
        # the scalar ops of the table, whose CUDA rows GpuElemwise renders
        "GpuErfinv": "symgpu.gpu.ops.theano_gpu_names:GpuErfinv",
        "GpuErfcinv": "symgpu.gpu.ops.theano_gpu_names:GpuErfcinv",
    },
    "symgpu.gpuarray.blas": {   # the correlations: our convolutions without the flip
        n: f"symgpu.gpu.ops.theano_gpu_names:{n}" for n in (
            "BaseGpuCorrMM", "GpuCorrMM", "GpuCorrMM_gradWeights", "GpuCorrMM_gradInputs",
            "BaseGpuCorr3dMM", "GpuCorr3dMM", "GpuCorr3dMM_gradWeights",
            "GpuCorr3dMM_gradInputs")},
    "symgpu.gpuarray.subtensor": {
        # the atomicAdd scatter (Theano's "dev20": compute capability 2.0 and up)
        "GpuAdvancedIncSubtensor1_dev20": "symgpu.gpu.ops.advanced:GpuAdvancedIncSubtensor1",
    },
    "symgpu.gpuarray.nnet": {
        "GpuSoftmax": "symgpu.gpu.ops.theano_dnn:GpuSoftmax",
        "GpuSoftmaxWithBias": "symgpu.gpu.ops.theano_dnn:GpuSoftmaxWithBias",
    },
    "symgpu.gpuarray.dnn": {
        # the op classes, for isinstance on lifted graphs (2-d convolution and pooling: 3-d
        # are GpuConv3d*/GpuPool3d); cuDNN or our own kernels are picked when they run
        "GpuDnnConv": "symgpu.gpu.ops.conv:GpuConv2d",
        "GpuDnnConvGradI": "symgpu.gpu.ops.conv:GpuConv2dGradInputs",
        "GpuDnnConvGradW": "symgpu.gpu.ops.conv:GpuConv2dGradWeights",
        "GpuDnnPool": "symgpu.gpu.ops.pooling:GpuPool",
        "version": "symgpu.gpu.ops.cudnn:cudnn_version",
        "RNNBlock": "symgpu.gpu.ops.cudnn_rnn:RNNBlock",
        **{f: f"symgpu.gpu.ops.theano_dnn:{f}" for f in (
            "dnn_available", "dnn_present", "dnn_conv", "dnn_conv3d", "dnn_gradinput", "dnn_gradinput3d", "dnn_gradweight",
            "dnn_gradweight3d", "dnn_pool", "dnn_batch_normalization_train",
            "dnn_batch_normalization_test",
            # --- names-rest: builders of our host graphs, isinstance on the lifted ops
            "GpuDnnSoftmax", "GpuDnnSoftmaxBase", "GpuDnnPoolGrad", "GpuDnnPoolBase")},
    },
}


def _canonical(path: str) -> str:
    """`path` under the gpuarray spelling: symgpu.gpu and symgpu.sandbox.cuda are the same
    module as symgpu.gpuarray, so their submodules share one attribute and one table."""
    for prefix in ("symgpu.sandbox.cuda.", "symgpu.gpu."):
        if path.startswith(prefix):
            return "symgpu.gpuarray." + path[len(prefix):]
    return path


def _renames(path: str) -> dict[str, str]:
    return RENAMES.get(path) or RENAMES.get(_canonical(path), {})


def _renamed(path: str, name: str) -> Any:
    """Theano's `name` of `path` from RENAMES (AttributeError where the table has none)."""
    target = _renames(path).get(name)
    if target is None:
        raise AttributeError(name)
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)  # deferred: resolved on first use
# --- end of names3's block


def _public(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    return list(names) if names is not None else [n for n in vars(module) if not n.startswith("_")]


class _Gathered(types.ModuleType):
    """A Theano module made of several of ours: each name from the first that has it."""

    def __init__(self, name: str, sources: tuple[str, ...]):
        super().__init__(name, f"Theano's {name.replace('symgpu', 'theano', 1)}: the names of "
                               + ", ".join(sources))
        self.__path__: list[str] = []  # a package: Theano's submodule paths resolve below it
        self._sources = sources

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = _renamed(self.__name__, name)   # Theano's name for one of ours
            setattr(self, name, value)
            return value
        except AttributeError:
            pass
        for source in self._sources:  # names first: `from theano.scan_module import scan`
            module = importlib.import_module(source)  # deferred: resolved on first use
            if hasattr(module, name):
                value = getattr(module, name)
                setattr(self, name, value)
                return value
        sub = f"{self.__name__}.{name}"
        if sub in PATHS:
            return importlib.import_module(sub)  # deferred: resolved on first use
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} (it gathers "
                             f"{', '.join(self._sources)})")

    def __dir__(self) -> list[str]:
        # deferred: resolved on first use
        names = {n for s in self._sources for n in _public(importlib.import_module(s))}
        names |= set(_renames(self.__name__))
        prefix = self.__name__ + "."
        names |= {p[len(prefix):] for p in PATHS
                  if p.startswith(prefix) and "." not in p[len(prefix):]}
        return sorted(names)


class _CallableAlias(types.ModuleType):
    """A Theano module path that is also the name of one of our functions on its parent
    package (``theano.tensor.var`` beside ``T.var``): importing the path makes the import
    system set the parent's attribute to the module, so the alias stays callable as that
    function, and its other names are the module's."""

    def __init__(self, name: str, module: types.ModuleType, function: Any):
        super().__init__(name, module.__doc__)
        self._module, self._function = module, function

    def __getattr__(self, name: str) -> Any:
        if name in ("_module", "_function") or (name.startswith("__") and name != "__all__"):
            raise AttributeError(name)
        return getattr(self._module, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._function(*args, **kwargs)

    def __dir__(self) -> list[str]:
        return dir(self._module)


def _shadowed(fullname: str) -> Any:
    """The function or class the parent package of `fullname` already has under the path's
    last name (which importing the path would replace), or None."""
    parent, _, child = fullname.rpartition(".")
    # the parent's own names only: a gathered parent's __getattr__ would import this path
    module = sys.modules.get(parent)
    value = vars(module).get(child) if module is not None else None
    entry = (vars(module).get("_LAZY") or {}).get(child) if module is not None else None
    if value is None and entry is not None and not (isinstance(entry, tuple) and entry[1] is None):
        # a function the package loads on first use (its PEP 562 table, not one of its
        # lazily loaded modules), e.g. theano.compile.pfunc
        value = getattr(module, child)
    if isinstance(value, _CallableAlias):   # the path imported before under another name
        return value._function
    return value if callable(value) and not isinstance(value, types.ModuleType) else None


def resolve(path: str) -> types.ModuleType:
    """The module for Theano path `path` (``symgpu.`` + Theano's path after ``theano.``)."""
    target = PATHS[path]
    if isinstance(target, str):
        return importlib.import_module(target)  # deferred: resolved on first use
    return _Gathered(path, target)


def _ours(fullname: str) -> str | None:
    """The symgpu name of `fullname`: itself, or ``symgpu.X`` for ``theano.X`` where the user
    made ``theano`` this package (``sys.modules['theano'] = symgpu``, code written for Theano
    run unchanged); None for other names."""
    if fullname.startswith("theano.") and sys.modules.get("theano") is sys.modules.get("symgpu"):
        name = "symgpu." + fullname[len("theano."):]
        if name in PATHS or importlib.util.find_spec(name) is not None:
            return name
        return None
    if fullname in PATHS:
        return fullname
    # `from theano.gpuarray import dnn` asks for it under the module's own name (symgpu.gpu)
    return _canonical(fullname) if _canonical(fullname) in PATHS else None


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the paths of PATHS (and, under a ``theano`` alias, every path of ours); a path
    naming one module hands out that module itself."""

    def __init__(self) -> None:
        self._own_specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        name = _ours(fullname)
        if name is None:
            return None
        # a gathered path is a package (Theano's submodules resolve below it); a path naming
        # one module of ours keeps that module as it is
        return importlib.machinery.ModuleSpec(fullname, self,
                                              is_package=isinstance(PATHS.get(name), tuple))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = _ours(spec.name)
        if name in PATHS and isinstance(PATHS[name], tuple):
            return resolve(name)
        # deferred: resolved on first use
        module = resolve(name) if name in PATHS else importlib.import_module(name)
        shadowed = _shadowed(spec.name)
        if shadowed is not None:
            return _CallableAlias(spec.name, module, shadowed)
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module is one of ours, or gathers names on first use. One of
        ours gets its own spec back (the import system gave it the alias's)."""
        own = self._own_specs.pop(module.__spec__.name, None)
        if own is not None:
            module.__spec__ = own


_FINDER = _Finder()


def _child_paths(parent: types.ModuleType) -> Any:
    """A module `__getattr__` for one of our packages: its Theano child paths (`T.opt`) as
    attributes before any import of them, resolved through the table."""
    prefix = parent.__name__ + "."

    def __getattr__(name: str) -> Any:
        if prefix + name in PATHS:
            return importlib.import_module(prefix + name)  # deferred: resolved on first use
        raise AttributeError(f"module {parent.__name__!r} has no attribute {name!r}")
    return __getattr__


def install() -> None:
    """Put the finder first on sys.meta_path (once), and give our loaded packages that have
    Theano child paths and no `__getattr__` of their own one that serves them (`T.opt`):
    the façade calls this, so nothing below this layer knows the table."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for path in PATHS:
        parent = sys.modules.get(path.rpartition(".")[0])
        if parent is not None and not isinstance(parent, _Gathered) and \
                "__getattr__" not in vars(parent):
            parent.__getattr__ = _child_paths(parent)
