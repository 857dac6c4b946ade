"""The tutorial's "Memory and variables" session, as a script.

    SYMGPU_FLAGS=device=cuda python3 examples/memory_and_variables.py
    SYMGPU_FLAGS=device=cpu python3 examples/memory_and_variables.py

Each step prints the statement (``>>> ...``) and what it shows.  On the GPU the transfers run
for real.  Without a GPU (device=cpu, or a GPU that cannot be used) the graphs are compiled for
a *virtual* GPU context (``symgpu.gpu.virtual_context``): debugprint shows the same GPU graphs,
but nothing can run on the device, so the ``b.eval`` step is skipped.

With several contexts (``SYMGPU_FLAGS="contexts=dev0->cuda0;dev1->cuda1"``, names may share one
GPU) the last step creates a shared variable on the last context, as the tutorial does.
"""
import contextlib

import numpy

import symgpu
import symgpu.gpu
import symgpu.tensor as T
from symgpu import shared


def step(statement):
    print(">>> " + statement)


# It is good practice to always cast float arrays to symgpu.config.floatX: the GPU is fastest
# with float32.
symgpu.config.floatX = 'float32'
step("symgpu.config.floatX = 'float32'")

on_gpu = symgpu.gpu.init_default_context() is not None
if on_gpu:
    where = contextlib.nullcontext()
else:
    print("# No GPU in use (device=%s): the graphs are compiled for a virtual GPU context; "
          "they print but cannot run" % symgpu.config.device)
    where = symgpu.gpu.virtual_context(None)

with where:
    # Transfer data to the GPU by hand; the default context is None.
    step("a = T.matrix()")
    a = T.matrix()
    step("b = a.transfer(None)")
    b = a.transfer(None)
    step("b.eval({a: numpy.ones((2, 2)).astype(symgpu.config.floatX)})")
    if on_gpu:
        print(repr(b.eval({a: numpy.ones((2, 2)).astype(symgpu.config.floatX)})))
    else:
        print("# (skipped: needs a GPU)")
    step("symgpu.printing.debugprint(b)")
    symgpu.printing.debugprint(b)

    # Otherwise, symgpu adds the transfers to the GPU automatically when it compiles:
    step("a = T.matrix('a')")
    a = T.matrix('a')
    step("b = a ** 2")
    b = a ** 2
    step("sq = symgpu.function([a], b)")
    sq = symgpu.function([a], b)
    step("symgpu.printing.debugprint(sq)")
    symgpu.printing.debugprint(sq)

    # With the transfer written explicitly, the transfer back to the CPU is removed: the output
    # stays on the GPU, which saves a costly copy.
    step("b = b.transfer(None)")
    b = b.transfer(None)
    step("sq = symgpu.function([a], b)")
    sq = symgpu.function([a], b)
    step("symgpu.printing.debugprint(sq)")
    symgpu.printing.debugprint(sq)
    if on_gpu:
        step("sq(numpy.ones((2, 2), dtype='float32'))")
        print(repr(sq(numpy.ones((2, 2), dtype='float32'))))

    # The default context for the CPU is 'cpu':
    step("b = a.transfer('cpu')")
    b = a.transfer('cpu')
    step("symgpu.printing.debugprint(b)")
    symgpu.printing.debugprint(b)

# Shared variables: a hybrid of numerical values and symbolic variables.
step("state = shared(0)")
state = shared(0)
step("state")
print(repr(state))
step("state.get_value()")
print(repr(state.get_value()))
step("state.set_value(1)")
state.set_value(1)
step("state.get_value()")
print(repr(state.get_value()))

# Shared variables are created on the default device, except scalar integers (as above);
# target='cpu' (or a context name) chooses the place.
step("shared(numpy.ones((2, 2), dtype='float32'))")
print(repr(shared(numpy.ones((2, 2), dtype='float32'))))
step("shared(numpy.ones((2, 2), dtype='float32'), target='cpu')")
print(repr(shared(numpy.ones((2, 2), dtype='float32'), target='cpu')))

contexts = list(symgpu.config.context_map())
if contexts:
    name = contexts[-1]
    step("shared(numpy.random.random((1024, 1024)).astype('float32'), target=%r)" % name)
    print(repr(shared(numpy.random.random((1024, 1024)).astype('float32'), target=name)))
else:
    print("# Several GPUs: name contexts with the contexts flag, e.g. "
          "SYMGPU_FLAGS=\"contexts=dev0->cuda0;dev1->cuda1\", and create shared variables "
          "with target='dev1' (see docs/multiple_gpus.md)")
