"""Theano's flags in symgpu: one row per flag of Theano 1.0.5's configuration reference.

``THEANO_FLAGS``-style strings (``optimizer=fast_compile,dnn.enabled=False,lib.cnmem=0.5``)
work in ``SYMGPU_FLAGS``, the rc file, ``config.X`` and ``config.change_flags``: every flag
of Theano's reference (doc/library/config.txt) is accepted with Theano's type, allowed values
and default.  Each row says what the flag does here:

* ``same``: symgpu has the flag under the same name (registered in symgpu/config.py); it
  keeps symgpu's behaviour, and the row says where it differs from Theano;
* ``mapped``: the flag reads and writes a symgpu flag (``optimizer`` is the rewrite set of
  the ``mode`` flag; ``nvcc.fastmath`` is ``--use_fast_math`` in ``nvcc.flags``), or its
  values all mean what symgpu does (``linker``), except those it warns about;
* ``ignored``: symgpu cannot honour it.  Set to a value outside ``quiet`` (by default: other
  than its default) it warns once per flag and process, with the reason below;
* ``satisfied``: nothing to do here whatever its value (``warn.ignore_bug_before``);
* ``removed``: Theano 1.0 removed it too; only the empty default is accepted.

Pure data: symgpu/config.py turns the specs into its params.  This module imports nothing
(config.py is the bottom layer and this is its table); docs/flags.md's Theano section is
generated from it (docs/gen_flags.py) and checked by tests/test_theano_flags.py.

A row is ``(name, spec, default, kind, text, quiet)``:

* spec: ``"bool"``, ``"int"``, ``"int>0"``, ``"int>=0"``, ``"memory"`` (a float: a fraction of
  the GPU's memory or MiB), ``"str"``, ``"path"``,
  ``"initdev"`` ('' or cuda*/opencl*), ``"prealloc"`` (':'-separated kinds of DebugMode's
  preallocated outputs), ``"removed:<replacement>"``, a tuple of allowed strings, or None for
  a ``same`` row (symgpu's param);
* default: Theano's (None for a ``same`` row: symgpu's default, told in text where it
  differs); ``"<compiledir>"`` in a default stands for symgpu's compiledir;
* text: for ``ignored`` rows, the reason (the warning's text); else what the flag does here;
* quiet: values that do not warn besides the default (``"*"``: none warns).
"""
from __future__ import annotations

__all__ = ["THEANO_FLAGS", "THEANO_SECTIONS", "LEGACY_FLAGS"]

_B, _S = "bool", "str"
_SEVERITY = ("ignore", "warn", "raise", "call", "print", "log")
_RUNTIME_ALGOS = ("guess_once", "guess_on_shape_change", "time_once", "time_on_shape_change")
_CUDNN_ALGOS = ("symgpu picks cuDNN's convolution algorithms from its heuristics and times "
                "the candidates once per geometry (like time_once); the choice is not set by "
                "flag")
_PROFILE_LAYOUT = ("symgpu's profile report (symgpu/compile/profiling.py) has a fixed layout "
                   "and destination (stderr at exit, f.profile.summary() on demand)")
_CMODULE = ("symgpu's CPU C kernels are built by symgpu/link/cc.py with fixed flags, keyed on "
            "their source and kept in compiledir")
_SEPARATE_CACHE = ("symgpu's cache directory is compiledir itself "
                   "($XDG_CACHE_HOME/symgpu/<platform>-<python>): set compiledir instead")

_OLD_BUG = "nothing to do: symgpu prints none of Theano's warnings about its old bugs"

# name, spec, default, kind, text, quiet
THEANO_FLAGS: tuple[tuple, ...] = (
    ("device", None, None, "same",
     "symgpu's device flag: cpu, cuda, cudaN (Theano's opencl devices are not supported)", ()),
    ("force_device", None, None, "same", "symgpu's force_device flag", ()),
    ("init_gpu_device", "initdev", "", "ignored",
     "symgpu starts a GPU only for device=cuda* or contexts=...; to use a GPU while device=cpu, "
     "name it in contexts (dev0->cuda0) and place work with target='dev0'", ()),
    ("print_active_device", None, None, "same", "symgpu's print_active_device flag", ()),
    ("floatX", None, None, "same", "symgpu's floatX flag", ()),
    ("warn_float64", None, None, "same", "symgpu's warn_float64 flag", ()),
    ("deterministic", ("default", "more"), "default", "ignored",
     "symgpu's GPU kernels have no slower deterministic variants to switch to", ()),
    ("allow_gc", None, None, "same", "symgpu's allow_gc flag", ()),
    ("scan.allow_output_prealloc", _B, True, "ignored",
     "symgpu's scan manages the buffers of its outputs itself", ()),
    ("scan.allow_gc", _B, False, "ignored",
     "symgpu's scan frees the intermediates of its inner graph as allow_gc says", ()),
    ("scan.debug", _B, False, "ignored",
     "symgpu's scan prints no debug output; symgpu.printing.debugprint shows its inner graph",
     ()),
    ("cycle_detection", ("regular", "fast"), "regular", "ignored",
     "symgpu's in-place rewrites have one cycle check", ()),
    ("check_stack_trace", ("off", "log", "warn", "raise"), "off", "ignored",
     "symgpu's rewrites copy creation traces (tag.trace) onto their replacements; there is no "
     "checker", ()),
    ("openmp", _B, False, "ignored",
     "symgpu's CPU C kernels run on one thread (vectorised, no OpenMP threads)", ()),
    ("openmp_elemwise_minsize", "int", 200000, "ignored",
     "symgpu's CPU C kernels run on one thread (vectorised, no OpenMP threads)", ()),
    ("cast_policy", ("custom", "numpy+floatX"), "custom", "ignored",
     "symgpu's implicit casts follow Theano's 'custom' rules only", ()),
    ("int_division", ("int", "raise", "floatX"), "int", "ignored",
     "symgpu's / between integer tensors has one behaviour (true_div; // is int_div)", ()),
    ("mode", None, None, "same",
     "symgpu's mode flag (Theano's default 'Mode' is FAST_RUN here, with the rewrites the "
     "optimizer flag selects; DEBUG_MODE is DebugMode; NanGuardMode by name runs FAST_RUN with "
     "a warning: pass mode=NanGuardMode(...) to function)", ()),
    ("profile", None, None, "same", "symgpu's profile flag", ()),
    ("profile_memory", None, None, "same", "symgpu's profile_memory flag", ()),
    ("profile_optimizer", _B, False, "ignored",
     "symgpu's profile does not time the rewrite phase of compilation", ()),
    ("profiling.n_apply", "int>0", 20, "ignored", _PROFILE_LAYOUT, ()),
    ("profiling.n_ops", "int>0", 20, "ignored", _PROFILE_LAYOUT, ()),
    ("profiling.min_memory_size", "int>=0", 1024, "ignored", _PROFILE_LAYOUT, ()),
    ("profiling.min_peak_memory", _B, False, "ignored", _PROFILE_LAYOUT, ()),
    ("profiling.destination", _S, "stderr", "ignored", _PROFILE_LAYOUT, ()),
    ("profiling.debugprint", _B, False, "ignored", _PROFILE_LAYOUT, ()),
    ("profiling.ignore_first_call", _B, False, "ignored", _PROFILE_LAYOUT, ()),
    ("lib.amdlibm", _B, False, "ignored",
     "symgpu's CPU C kernels call glibc's vector math (libmvec) where present, not AMD's libm",
     ()),
    ("gpuarray.preallocate", None, None, "same", "symgpu's gpuarray.preallocate flag (its device "
     "pool)", ()),
    ("gpuarray.sched", ("default", "multi", "single"), "default", "ignored",
     "symgpu creates its CUDA contexts with the driver's default scheduling", ()),
    ("gpuarray.single_stream", _B, True, "ignored",
     "each symgpu GPU context runs its work on one stream", ()),
    ("gpuarray.cache_path", "path", "<compiledir>/gpuarray_kernels", "ignored",
     "symgpu caches compiled GPU kernels under compiledir: set compiledir instead", ()),
    ("linker", ("cvm", "c|py", "py", "c", "c|py_nogc", "vm", "vm_nogc", "cvm_nogc"), "cvm",
     "mapped",
     "every linker runs on symgpu's VM, which calls C kernels where cxx names a compiler (as "
     "cvm, vm, c|py and c do); for py set cxx='' (NumPy only), for the *_nogc linkers set "
     "allow_gc=False", ("vm", "c|py", "c")),
    ("optimizer", ("o4", "o3", "o2", "o1", "unsafe", "fast_run", "fast_compile", "merge",
                   "None"), "fast_run", "mapped",
     "the rewrite set of the mode flag: fast_compile is mode=FAST_COMPILE, fast_run is "
     "FAST_RUN (DebugMode keeps its own); o4, o3, o2 and unsafe run FAST_RUN's rewrites, o1, "
     "merge and None FAST_COMPILE's (merge and constant folding), with a warning",
     ("fast_compile",)),
    ("on_opt_error", ("warn", "raise", "pdb", "ignore"), "warn", "ignored",
     "symgpu always warns about a rewrite that crashes and skips it (Theano's 'warn')", ()),
    ("assert_no_cpu_op", None, None, "same", "symgpu's assert_no_cpu_op flag", ()),
    ("on_shape_error", ("warn", "raise"), "warn", "ignored",
     "symgpu's shape inference has one way of handling an op's failure", ()),
    ("warn.ignore_bug_before", ("0.9", "None", "all", "0.3", "0.4", "0.4.1", "0.5", "0.6",
                                "0.7", "0.8", "0.8.1", "0.8.2", "0.10", "1.0", "1.0.1",
                                "1.0.2", "1.0.3", "1.0.4", "1.0.5"), "0.9", "satisfied",
     "nothing to do: symgpu prints none of Theano's warnings about its old bugs", "*"),
    ("base_compiledir", "path", "<compiledir>/..", "ignored", _SEPARATE_CACHE, ()),
    ("compiledir_format", _S, "compiledir_%(short_platform)s-%(processor)s-"
     "%(python_version)s-%(python_bitwidth)s", "ignored", _SEPARATE_CACHE, ()),
    ("compiledir", None, None, "same",
     "symgpu's compiledir flag (its default is $XDG_CACHE_HOME/symgpu/<platform>-<python>, "
     "not Theano's ~/.theano/compiledir_...)", ()),
    ("blas.ldflags", _S, "-lblas", "ignored",
     "symgpu's CPU matrix products call NumPy's BLAS and its GPU ones cuBLAS: nothing is "
     "linked against another BLAS", ()),
    ("experimental.local_alloc_elemwise_assert", _B, True, "ignored",
     "symgpu's rewrites of alloc add no shape asserts", ()),
    ("dnn.enabled", ("auto", "True", "False", "no_check"), "auto", "ignored",
     "symgpu's GPU convolutions use cuDNN when libcudnn loads and its own GEMM kernels "
     "otherwise (symgpu/gpu/ops/conv.py); the flag does not force either yet", ("no_check",)),
    ("dnn.include_path", "path", "", "ignored",
     "symgpu loads cuDNN at run time (libcudnn.so.9 from the system or the nvidia-cudnn "
     "wheel) and compiles nothing against its headers", ()),
    ("dnn.library_path", "path", "", "ignored",
     "symgpu loads cuDNN at run time (libcudnn.so.9 from the system or the nvidia-cudnn "
     "wheel, found by the loader)", ()),
    ("conv.assert_shape", _B, False, "",
     "when True, theano.tensor.nnet.abstract_conv.assert_shape wraps a tensor in an Assert "
     "of its expected shape (False: it returns the tensor as is); symgpu's convolutions "
     "check their operands' shapes when they run either way", ()),
    ("dnn.conv.workmem", "removed:dnn.conv.algo_fwd", "", "removed",
     "removed in Theano too: any value but '' is an error naming dnn.conv.algo_fwd", ()),
    ("dnn.conv.workmem_bwd", "removed:dnn.conv.algo_bwd_filter and dnn.conv.algo_bwd_data", "",
     "removed", "removed in Theano too: any value but '' is an error naming its replacements",
     ()),
    ("dnn.conv.algo_fwd", ("small", "none", "large", "fft", "fft_tiling", "winograd",
                           "winograd_non_fused") + _RUNTIME_ALGOS, "small", "ignored",
     _CUDNN_ALGOS, ()),
    ("dnn.conv.algo_bwd", "removed:dnn.conv.algo_bwd_filter and dnn.conv.algo_bwd_data", "",
     "removed", "removed in Theano too: any value but '' is an error naming its replacements",
     ()),
    ("dnn.conv.algo_bwd_filter", ("none", "deterministic", "fft", "small", "winograd_non_fused",
                                  "fft_tiling") + _RUNTIME_ALGOS, "none", "ignored",
     _CUDNN_ALGOS, ()),
    ("dnn.conv.algo_bwd_data", ("none", "deterministic", "fft", "fft_tiling", "winograd",
                                "winograd_non_fused") + _RUNTIME_ALGOS, "none", "ignored",
     _CUDNN_ALGOS, ()),
    ("magma.enabled", _B, False, "ignored", "symgpu does not use MAGMA", ()),
    ("magma.include_path", "path", "", "ignored", "symgpu does not use MAGMA", ()),
    ("magma.library_path", "path", "", "ignored", "symgpu does not use MAGMA", ()),
    ("ctc.root", "path", "", "ignored", "symgpu needs no warp-ctc: the CTC loss runs on NumPy, or on cuDNN on a GPU", ()),
    ("gcc.cxxflags", _S, "", "ignored", _CMODULE, ()),
    ("cxx", None, None, "same",
     "symgpu's cxx flag (default cc, where Theano's is the path of g++; empty: NumPy only)", ()),
    ("optimizer_excluding", None, None, "same", "symgpu's optimizer_excluding flag", ()),
    ("optimizer_including", None, None, "same", "symgpu's optimizer_including flag", ()),
    ("optimizer_requiring", _S, "", "ignored",
     "no flag for it: Mode.requiring(*tags) runs only the rewrites carrying the tags", ()),
    ("optimizer_verbose", None, None, "same", "symgpu's optimizer_verbose flag", ()),
    ("nocleanup", _B, False, "ignored",
     "a failed C compile keeps its source and names it in the error (CCompileError.source_path)"
     "; successful builds keep only the library", ()),
    ("compile.timeout", "int>=0", 120, "ignored",
     "symgpu's compile-cache locks (symgpu/link/diskcache.py) have no timeout setting", ()),
    ("compile.wait", "int>0", 5, "ignored",
     "symgpu's compile-cache locks (symgpu/link/diskcache.py) have no wait setting", ()),
    ("DebugMode.check_preallocated_output", "prealloc", "", "ignored",
     "symgpu's DebugMode compares outputs with the unrewritten graph and checks destroy maps; "
     "it does not test preallocated outputs", ()),
    ("DebugMode.check_preallocated_output_ndim", "int>0", 4, "ignored",
     "symgpu's DebugMode does not test preallocated outputs", ()),
    ("DebugMode.warn_input_not_reused", _B, True, "ignored",
     "symgpu's DebugMode checks that ops write only where they declare; it does not warn about "
     "unused destroy or view maps", ()),
    ("NanGuardMode.nan_is_error", _B, True, "ignored",
     "NanGuardMode's defaults do not read flags: pass nan_is_error= to NanGuardMode", ()),
    ("NanGuardMode.inf_is_error", _B, True, "ignored",
     "NanGuardMode's defaults do not read flags: pass inf_is_error= to NanGuardMode", ()),
    ("NanGuardMode.big_is_error", _B, True, "ignored",
     "NanGuardMode's defaults do not read flags: pass big_is_error= to NanGuardMode", ()),
    ("numpy.seterr_all", _SEVERITY + ("None",), "ignore", "ignored",
     "symgpu leaves NumPy's error state as it is (at any value: Theano's default called "
     "numpy.seterr(all='ignore')); call numpy.seterr(...) yourself", ()),
    ("numpy.seterr_divide", ("None",) + _SEVERITY, "None", "ignored",
     "symgpu leaves NumPy's error state as it is; call numpy.seterr(divide=...) yourself", ()),
    ("numpy.seterr_over", ("None",) + _SEVERITY, "None", "ignored",
     "symgpu leaves NumPy's error state as it is; call numpy.seterr(over=...) yourself", ()),
    ("numpy.seterr_under", ("None",) + _SEVERITY, "None", "ignored",
     "symgpu leaves NumPy's error state as it is; call numpy.seterr(under=...) yourself", ()),
    ("numpy.seterr_invalid", ("None",) + _SEVERITY, "None", "ignored",
     "symgpu leaves NumPy's error state as it is; call numpy.seterr(invalid=...) yourself", ()),
    ("compute_test_value", None, None, "same", "symgpu's compute_test_value flag", ()),
    ("compute_test_value_opt", None, None, "same", "symgpu's compute_test_value_opt flag", ()),
    ("print_test_value", None, None, "same", "symgpu's print_test_value flag", ()),
    ("reoptimize_unpickled_function", _B, False, "ignored",
     "symgpu does not rewrite an unpickled function again", ()),
    ("exception_verbosity", None, None, "same", "symgpu's exception_verbosity flag", ()),
    ("cmodule.warn_no_version", _B, False, "ignored",
     "every symgpu C kernel is keyed on its source: there are no unversioned ops", ()),
    ("cmodule.remove_gxx_opt", _B, False, "ignored", _CMODULE, ()),
    ("cmodule.compilation_warning", _B, False, "ignored",
     "symgpu shows the compiler's output only when a compile fails", ()),
    ("cmodule.preload_cache", _B, False, "ignored",
     "symgpu loads each compiled kernel from the disk cache on first use", ()),
    ("cmodule.age_thresh_use", "int", 60 * 60 * 24 * 24, "ignored",
     "symgpu's disk cache does not age its entries; delete compiledir to clear it", ()),
    ("cmodule.debug", _B, False, "ignored", _CMODULE, ()),
    ("traceback.limit", "int", 8, "ignored",
     "symgpu keeps 8 of the user's frames in tag.trace (Theano's default); the number is fixed",
     ()),
    ("traceback.compile_limit", "int", 0, "ignored",
     "symgpu's rewrites copy the user's trace onto the nodes they make; the number is fixed",
     ()),
    ("metaopt.verbose", "int", 0, "ignored",
     "symgpu has no meta-optimizer; cuDNN's algorithms are timed per geometry instead", ()),
    ("metaopt.optimizer_excluding", _S, "", "ignored", "symgpu has no meta-optimizer", ()),
    ("metaopt.optimizer_including", _S, "", "ignored", "symgpu has no meta-optimizer", ()),
)

#: entries of Theano's reference that are sections, not flags: ``config.compile`` ...
THEANO_SECTIONS: tuple[str, ...] = ("compile", "DebugMode", "numpy")

#: flags of older Theanos (0.8, 0.9: the old CUDA backend) and undocumented ones of 1.0.5
#: still found in users' THEANO_FLAGS, accepted as the rows above
LEGACY_FLAGS: tuple[tuple, ...] = (
    ("lib.cnmem", "memory", 0.0, "ignored",
     "symgpu's device pool replaces CNMeM; gpuarray.preallocate is the equivalent", ()),
    ("nvcc.fastmath", _B, False, "mapped",
     "--use_fast_math in nvcc.flags: True adds it, False removes it", "*"),
    ("cuda.root", "path", "", "ignored",
     "symgpu finds the CUDA driver and its compiler itself (symgpu/gpu/runtime)", ()),
    ("dnn.conv.precision", ("as_input_f32", "as_input", "float16", "float32", "float64"),
     "as_input_f32", "mapped",
     "the precision cuDNN convolutions compute in, by Theano's rule (fixed when a function "
     "is compiled): as_input_f32 computes float16 in float32 and others in their dtype, "
     "as_input each in its own (bfloat16 always in float32), float16/float32/float64 in that "
     "one; float16 for gradients, or a precision cuDNN lacks for the dtype, is a TypeError",
     "*"),
    ("on_unused_input", ("raise", "warn", "ignore"), "raise", "ignored",
     "symgpu.function's on_unused_input defaults to 'raise' and does not read the flag: pass "
     "on_unused_input= to function", ()),
    # Theano 1.0.5's warnings about its own old bugs (its tutorial sets
    # warn.subtensor_merge_bug): nothing to warn about here, as warn.ignore_bug_before
    ("warn.argmax_pushdown_bug", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.gpusum_01_011_0111_bug", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.sum_sum_bug", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.sum_div_dimshuffle_bug", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.subtensor_merge_bug", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.gpu_set_subtensor1", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.reduce_join", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.inc_set_subtensor1", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.round", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.inc_subtensor1_opt", _B, True, "satisfied", _OLD_BUG, "*"),
    ("warn.vm_gc_bug", _B, False, "satisfied", _OLD_BUG, "*"),
    ("warn.signal_conv2d_interface", _B, True, "satisfied", _OLD_BUG, "*"),
    # undocumented in Theano's reference, read by its test helpers (unittest_tools.fetch_seed)
    ("unittests.rseed", _S, "666", "satisfied",
     "the seed of randomized tests written for Theano (its unittest_tools.fetch_seed reads it; "
     "'random' means no fixed seed): symgpu's own code never reads it", "*"),
)
