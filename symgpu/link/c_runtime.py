"""The one Python extension the CPU kernels need: ``run(address, kinds, *arrays)``.

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
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
from functools import cache
from typing import Callable

from symgpu.link import cc

__all__ = ["runner", "unavailable_reason", "MAX_ARRAYS"]

MODULE = "_symgpu_crt"
MAX_ARRAYS = 128  # the most arrays one call takes (SOURCE's MAX_ARRAYS)

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARRAYS 128
typedef void (*kernel_t)(int64_t, void **);

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "run(address, kinds, *arrays)");
        return NULL;
    }
    kernel_t kernel = (kernel_t)PyLong_AsVoidPtr(args[0]);
    if (kernel == NULL && PyErr_Occurred())
        return NULL;
    const char *kinds = PyBytes_AsString(args[1]);
    if (kinds == NULL)
        return NULL;
    Py_ssize_t count = nargs - 2;
    if (count > MAX_ARRAYS || (Py_ssize_t)strlen(kinds) != 2 * count) {
        PyErr_Format(PyExc_ValueError, "run: %zd arrays for kinds '%s'", count, kinds);
        return NULL;
    }
    Py_buffer views[MAX_ARRAYS];
    void *data[MAX_ARRAYS];
    Py_ssize_t got = 0, n = 1, *shape = NULL;
    int ndim = -1, ok = 1;
    for (; got < count; got++) {
        char kind = kinds[2 * got];
        Py_ssize_t itemsize = kinds[2 * got + 1] - '0';
        int flags = PyBUF_C_CONTIGUOUS | (kind == 'w' || kind == 'o' ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[got + 2], &views[got], flags) != 0) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        Py_buffer *v = &views[got];
        data[got] = v->buf;
        if (v->itemsize != itemsize) { ok = 0; got++; break; }
        if (kind == 's' || kind == 'o') {
            if (v->len != v->itemsize) { ok = 0; got++; break; }
            continue;
        }
        if (ndim < 0) {
            ndim = v->ndim;
            shape = v->shape;
            n = v->itemsize ? v->len / v->itemsize : 0;
        } else if (v->ndim != ndim ||
                   (ndim > 0 && memcmp(v->shape, shape, ndim * sizeof(Py_ssize_t)) != 0)) {
            ok = 0; got++; break;
        }
    }
    if (ok) {
        if (n > 32768) {
            Py_BEGIN_ALLOW_THREADS
            kernel((int64_t)n, data);
            Py_END_ALLOW_THREADS
        } else {
            kernel((int64_t)n, data);
        }
    }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    if (ok)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "run(address, kinds, *arrays)"},
    {NULL, NULL, 0, NULL}
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_symgpu_crt", NULL, -1, methods};
PyMODINIT_FUNC PyInit__symgpu_crt(void) { return PyModule_Create(&module); }
"""


def _python_include() -> str:
    return sysconfig.get_paths()["include"]


@cache
def _load() -> tuple[Callable | None, str]:
    """(run, '') once built and imported, else (None, why not)."""
    if cc.compiler() is None:
        return None, "no C compiler (the cxx flag is empty or names no program on PATH)"
    include = _python_include()
    if not os.path.exists(os.path.join(include, "Python.h")):
        return None, f"Python's C headers are not installed (no Python.h in {include})"
    # the ABI tag keeps interpreters apart even in a shared compiledir
    tag = f"/* {sysconfig.get_config_var('EXT_SUFFIX')} */\n"
    try:
        path = cc.build_library(tag + SOURCE, (*cc.OPTIMIZE_FLAGS, f"-I{include}"))
        loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception as exc:  # compiler broken, compiledir refused...: NumPy does the work
        return None, f"{type(exc).__name__}: {exc}"
    return module.run, ""


def runner() -> Callable | None:
    """The trampoline's ``run``, or None when C kernels cannot be used here (see
    :func:`unavailable_reason`). Built once per process; the flag ``cxx`` is read then."""
    return _load()[0]


def is_loaded() -> bool:
    """Whether this process has already built (or given up on) the runtime."""
    return _load.cache_info().currsize > 0


def unavailable_reason() -> str:
    """Why :func:`runner` is None ('' when it is not)."""
    return _load()[1]
