"""Shared start-up check of the GPU-only examples (pycuda_simple.py, pycuda_double_op.py).

`require_gpu()` returns symgpu's default GPU context, started and current in this thread.
Without a usable GPU it prints why on stderr and exits with status 77 (the usual "skipped"
status of test drivers), instead of failing with a traceback.  The examples then
`import symgpu.misc.pycuda_init`, as the tutorial imports `theano.misc.pycuda_init`, so that
PyCUDA works in symgpu's context (`pycuda.autoinit` would make a second, private one).
"""
import sys

import symgpu
import symgpu.gpu

SKIPPED = 77


def require_gpu(example):
    """The default context, or exit(77) with a clear message when there is none."""
    if symgpu.config.device == "cpu":
        reason = ("it needs device=cuda; run it with "
                  "SYMGPU_FLAGS=device=cuda,floatX=float32 python3 examples/%s" % example)
    elif not symgpu.gpu.gpu_available():
        reason = "the GPU cannot be used here: %s" % symgpu.gpu.why_unavailable()
    else:
        reason = None
    ctx = None
    if reason is None:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the reason is printed below instead
            ctx = symgpu.gpu.init_default_context()
        if ctx is None:
            reason = "the GPU could not be started: %s" % symgpu.gpu.why_unavailable()
    if reason is not None:
        print("%s is a GPU-only example and was not run: %s" % (example, reason),
              file=sys.stderr)
        sys.exit(SKIPPED)
    return ctx.activate()
