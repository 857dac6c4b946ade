"""The one Python extension symgpu builds, for the CPU kernels: ``run(address, kinds,
*arrays)``, and ``run_sized`` for kernels over arrays of different (broadcast) shapes.

Why a trampoline: a kernel is a plain C function ``void f(int64_t n, void **data)``, built
without Python's headers (so it compiles in a few hundredths of a second). Calling it through
ctypes would cost microseconds per call in argument conversion; this small extension, built
once per machine and Python, takes the arrays' buffers directly (about 0.1 us an array).

``kinds`` has two characters per array: a letter, ``f`` a full input, ``s`` a one-element
input (read as a scalar), ``w`` a full output, ``o`` a one-element output (a reduction's);
then the element size in bytes (1-8). Every
full array must be C-contiguous and of the first full array's shape, and every array of its
element size; ``run`` returns False (and runs nothing) when they are not, so the caller can
take its general path. Arrays of over 32768 elements run with the GIL released.

The GPU runtime uses the same extension for its hottest driver calls, without ctypes:
``call_pp(address, first, second)`` calls ``int f(void *, void *)`` (cuGraphLaunch, once
per CUDA-graph replay), ``launch_kernel`` calls cuLaunchKernel (each plain launch).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import warnings
from functools import cache
from typing import Any, Callable

from symgpu.link import cc

__all__ = ["runner", "sized_runner", "pointer_pair_caller", "kernel_launcher",
           "unavailable_reason", "MAX_ARRAYS"]

MODULE = "_symgpu_crt"
MAX_ARRAYS = 128  # the most arrays one call takes (SOURCE's MAX_ARRAYS)

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARRAYS 128
#define PARALLEL_WORK 32768  /* elements above which the GIL is released */
/* run `call`, without the GIL when there is enough work for other threads to use it */
#define RUN(work, call)                       \
    do {                                      \
        if ((work) > PARALLEL_WORK) {         \
            Py_BEGIN_ALLOW_THREADS call;      \
            Py_END_ALLOW_THREADS              \
        } else {                              \
            call;                             \
        }                                     \
    } while (0)
typedef void (*kernel_t)(int64_t, void **);
typedef int (*sized_kernel_t)(void **, const int64_t *, const int *);

/* The kernel's address, the kinds string and the array count; NULL kinds on a bad call. */
static const char *parse(PyObject *const *args, Py_ssize_t nargs, const char *name,
                         void **address, Py_ssize_t *count)
{
    if (nargs < 2) {
        PyErr_Format(PyExc_TypeError, "%s(address, kinds, *arrays)", name);
        return NULL;
    }
    *address = PyLong_AsVoidPtr(args[0]);
    if (*address == NULL && PyErr_Occurred())
        return NULL;
    const char *kinds = PyBytes_AsString(args[1]);
    if (kinds == NULL)
        return NULL;
    *count = nargs - 2;
    if (*count > MAX_ARRAYS || (Py_ssize_t)strlen(kinds) != 2 * *count) {
        PyErr_Format(PyExc_ValueError, "%s: %zd arrays for kinds '%s'", name, *count, kinds);
        return NULL;
    }
    return kinds;
}

/* Buffer of array i: C-contiguous, writable for outputs ('w', 'o'), of the tagged item
   size. 0 when refused (nothing to release). */
static int take(PyObject *array, const char *kinds, Py_ssize_t i, Py_buffer *view)
{
    char kind = kinds[2 * i];
    int flags = PyBUF_C_CONTIGUOUS | (kind == 'w' || kind == 'o' ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(array, view, flags) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (view->itemsize != kinds[2 * i + 1] - '0') {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

static PyObject *finish(Py_buffer *views, Py_ssize_t got, int ok)
{
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    if (ok)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    void *address;
    Py_ssize_t count, got = 0, n = 1, *shape = NULL;
    const char *kinds = parse(args, nargs, "run", &address, &count);
    if (kinds == NULL)
        return NULL;
    Py_buffer views[MAX_ARRAYS];
    void *data[MAX_ARRAYS];
    int ndim = -1, ok = 1;
    for (; ok && got < count; got++) {
        if (!take(args[got + 2], kinds, got, &views[got])) {
            ok = 0;
            break;
        }
        Py_buffer *v = &views[got];
        data[got] = v->buf;
        char kind = kinds[2 * got];
        if (kind == 's' || kind == 'o') {
            ok = v->len == v->itemsize;
        } else if (ndim < 0) {
            ndim = v->ndim;
            shape = v->shape;
            n = v->itemsize ? v->len / v->itemsize : 0;
        } else {
            ok = v->ndim == ndim &&
                 (ndim == 0 || memcmp(v->shape, shape, ndim * sizeof(Py_ssize_t)) == 0);
        }
    }
    if (ok)
        RUN(n, ((kernel_t)address)((int64_t)n, data));
    return finish(views, got, ok);
}

/* run_sized: arrays of any shapes (C-contiguous, of the tagged item size, at most 4-d); the
   kernel gets their shapes, checks them itself and returns 0, or non-zero for "not mine". */
static PyObject *run_sized(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    void *address;
    Py_ssize_t count, got = 0, work = 0;
    const char *kinds = parse(args, nargs, "run_sized", &address, &count);
    if (kinds == NULL)
        return NULL;
    Py_buffer views[MAX_ARRAYS];
    void *data[MAX_ARRAYS];
    int64_t shapes[MAX_ARRAYS * 4];
    int ndims[MAX_ARRAYS], ok = 1;
    for (; ok && got < count; got++) {
        if (!take(args[got + 2], kinds, got, &views[got])) {
            ok = 0;
            break;
        }
        Py_buffer *v = &views[got];
        data[got] = v->buf;
        ndims[got] = v->ndim;
        ok = v->ndim <= 4;
        for (int d = 0; ok && d < 4; d++)
            shapes[4 * got + d] = d < v->ndim ? (int64_t)v->shape[d] : 1;
        if (v->itemsize && v->len / v->itemsize > work)
            work = v->len / v->itemsize;
    }
    if (ok)
        RUN(work, ok = ((sized_kernel_t)address)(data, shapes, ndims) == 0);
    return finish(views, got, ok);
}

/* call_pp(address, first, second): the status of the C function int f(void *, void *) at
   address, called with two pointers (Python ints; 0 is NULL). A driver entry point called
   per replay (cuGraphLaunch) this way costs a C call, not ctypes' argument handling. */
typedef int (*pointer_pair_t)(void *, void *);
static PyObject *call_pp(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "call_pp(address, first, second)");
        return NULL;
    }
    void *pointers[3];
    for (int i = 0; i < 3; i++) {
        pointers[i] = PyLong_AsVoidPtr(args[i]);
        if (pointers[i] == NULL && PyErr_Occurred())
            return NULL;
    }
    if (pointers[0] == NULL) {
        PyErr_SetString(PyExc_ValueError, "call_pp: the function's address is 0");
        return NULL;
    }
    return PyLong_FromLong(((pointer_pair_t)pointers[0])(pointers[1], pointers[2]));
}

/* launch_kernel(address, function, gx, gy, gz, bx, by, bz, shared, stream, params): the
   status of cuLaunchKernel (at address) of the CUfunction `function` on `stream`, its
   parameters the bytes `params` (packed in the CUDA parameter layout, passed as one buffer:
   CU_LAUNCH_PARAM_BUFFER_POINTER). Eleven arguments cost ctypes microseconds; here, a few
   conversions. */
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
static PyObject *launch_kernel(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11 || !PyBytes_Check(args[10])) {
        PyErr_SetString(PyExc_TypeError, "launch_kernel(address, function, gx, gy, gz, bx, "
                                         "by, bz, shared, stream, params: bytes)");
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(args[0]);
    if (address == NULL && PyErr_Occurred())
        return NULL;
    void *function = PyLong_AsVoidPtr(args[1]);
    if (function == NULL && PyErr_Occurred())
        return NULL;
    void *stream = PyLong_AsVoidPtr(args[9]);
    if (stream == NULL && PyErr_Occurred())
        return NULL;
    if (address == NULL || function == NULL) {
        PyErr_SetString(PyExc_ValueError, "launch_kernel: a null entry point or function");
        return NULL;
    }
    unsigned dims[7];
    for (int i = 0; i < 7; i++) {
        unsigned long d = PyLong_AsUnsignedLong(args[2 + i]);
        if (d == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        if (d > 0xffffffffUL) {
            PyErr_SetString(PyExc_OverflowError, "launch_kernel: a dimension over 32 bits");
            return NULL;
        }
        dims[i] = (unsigned)d;
    }
    size_t size = (size_t)PyBytes_GET_SIZE(args[10]);
    void *extra[5] = {(void *)1, PyBytes_AS_STRING(args[10]), (void *)2, &size, (void *)0};
    int status = ((launch_t)address)(function, dims[0], dims[1], dims[2], dims[3], dims[4],
                                     dims[5], dims[6], stream, NULL, extra);
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "run(address, kinds, *arrays)"},
    {"run_sized", (PyCFunction)(void (*)(void))run_sized, METH_FASTCALL,
     "run_sized(address, kinds, *arrays)"},
    {"call_pp", (PyCFunction)(void (*)(void))call_pp, METH_FASTCALL,
     "call_pp(address, first, second)"},
    {"launch_kernel", (PyCFunction)(void (*)(void))launch_kernel, METH_FASTCALL,
     "launch_kernel(address, function, gx, gy, gz, bx, by, bz, shared, stream, params)"},
    {NULL, NULL, 0, NULL}
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_symgpu_crt", NULL, -1, methods};
PyMODINIT_FUNC PyInit__symgpu_crt(void) { return PyModule_Create(&module); }
"""


def _python_include() -> str:
    return sysconfig.get_paths()["include"]


@cache
def _load() -> tuple[Any, str]:
    """(the module, '') once built and imported, else (None, why not). Where a compiler is
    named and found but the runtime cannot be had, it says so once: a user who has a
    compiler expects the compiled CPU path."""
    if cc.compiler() is None:
        return None, "no C compiler (the cxx flag is empty or names no program on PATH)"
    module, why = _build()
    if module is None:
        warnings.warn(f"symgpu: C kernels are off ({why}); fused elementwise code runs "
                      f"through NumPy on the CPU. Set the cxx flag empty to silence this.",
                      RuntimeWarning, stacklevel=2)
    return module, why


def _build() -> tuple[Any, str]:
    include = _python_include()
    if not os.path.exists(os.path.join(include, "Python.h")):
        return None, f"Python's C headers are not installed (no Python.h in {include})"
    # the ABI tag keeps interpreters apart even in a shared compiledir
    tag = f"/* {sysconfig.get_config_var('EXT_SUFFIX')} */\n"
    try:
        # macOS links an extension's Python symbols when it is loaded, not when it is built
        lazy = ("-undefined", "dynamic_lookup") if sys.platform == "darwin" else ()
        path = cc.build_library(tag + SOURCE, (*cc.OPTIMIZE_FLAGS, f"-I{include}", *lazy))
        loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception as exc:  # compiler broken, compiledir refused...: NumPy does the work
        return None, f"{type(exc).__name__}: {exc}"
    return module, ""


def _function(name: str) -> Callable | None:
    module = _load()[0]
    return None if module is None else getattr(module, name)


def sized_runner() -> Callable | None:
    """The trampoline's ``run_sized``, for kernels ``int f(void **data, const int64_t
    *shapes, const int *ndims)`` over arrays of different shapes (4 shape entries an array,
    padded with 1): the kernel checks the shapes and returns 0, or non-zero to decline (then
    ``run_sized`` returns False). None like :func:`runner`."""
    return _function("run_sized")


def runner() -> Callable | None:
    """The trampoline's ``run``, or None when C kernels cannot be used here (see
    :func:`unavailable_reason`). Built once per process; the flag ``cxx`` is read then."""
    return _function("run")


def pointer_pair_caller() -> Callable | None:
    """``call_pp(address, first, second)``: the int status of the C function ``int f(void *,
    void *)`` at ``address``, called with two pointers given as ints; None like
    :func:`runner`. The CUDA-graph replay calls cuGraphLaunch through it (gpu/exec/
    graph_driver.py): about 0.1 us less than through ctypes."""
    return _function("call_pp")


def kernel_launcher() -> Callable | None:
    """``launch_kernel(address, function, gx, gy, gz, bx, by, bz, shared, stream, params)``:
    the status of cuLaunchKernel (its address) for a CUfunction handle, grid and block
    dimensions, dynamic shared bytes, a stream handle and the packed parameters (bytes);
    None like :func:`runner`. Plain GPU launches go through it (gpu/runtime/codegen/
    launch.py): about a microsecond less than ctypes' eleven conversions."""
    return _function("launch_kernel")


def is_loaded() -> bool:
    """Whether this process has already built (or given up on) the runtime."""
    return _load.cache_info().currsize > 0


def unavailable_reason() -> str:
    """Why :func:`runner` is None ('' when it is not)."""
    return _load()[1]
