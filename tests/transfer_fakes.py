"""Host ops that declare what the GPU backend's declare (GpuFromHost and HostFromGpu are
transfers, GpuElemwise makes values of a device type), for tests of what classifies nodes
(printing, the profiler's cpu/gpu/transfer classes) without a GPU. Values stay NumPy arrays."""
from __future__ import annotations

import numpy as np

from symgpu import Apply, Op
from symgpu.tensor.type import TensorType


class FakeDeviceType(TensorType):
    """A tensor type that says its values live on a device context (graph/devices.py)."""

    context_name = None

    def __str__(self):
        return "GpuArrayType" + super().__str__()[len("TensorType"):]


def _on_device(t):
    return FakeDeviceType(t.dtype, t.broadcastable)


def _on_host(t):
    return TensorType(t.dtype, t.broadcastable)


class _Copy(Op):
    __props__ = ()
    out_type = staticmethod(lambda t: t)

    def make_node(self, x):
        return Apply(self, [x], [self.out_type(x.type)()])

    def perform(self, node, inputs, out):
        out[0][0] = np.array(inputs[0], copy=True)


class GpuFromHost(_Copy):
    transfer = "upload"
    out_type = staticmethod(_on_device)


class HostFromGpu(_Copy):
    transfer = "download"
    out_type = staticmethod(_on_host)


class GpuElemwise(_Copy):
    out_type = staticmethod(_on_device)

    def __str__(self):
        return "GpuElemwise{exp,no_inplace}"

    def perform(self, node, inputs, out):
        out[0][0] = np.exp(inputs[0])
