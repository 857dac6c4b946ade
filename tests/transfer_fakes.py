"""Host ops named like the GPU backend's (GpuFromHost, GpuElemwise, HostFromGpu), for tests of
what reads op names (printing, the profiler's cpu/gpu/transfer classes) without a GPU."""
from __future__ import annotations

import numpy as np

from symgpu import Apply, Op


class _Copy(Op):
    __props__ = ()

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = np.array(inputs[0], copy=True)


class GpuFromHost(_Copy):
    pass


class HostFromGpu(_Copy):
    pass


class GpuElemwise(_Copy):
    def __str__(self):
        return "GpuElemwise{exp,no_inplace}"

    def perform(self, node, inputs, out):
        out[0][0] = np.exp(inputs[0])
