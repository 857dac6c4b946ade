"""The CUDA runtime layer: driver, contexts and streams, device and pinned pools, GpuArray,
DLPack, the kernel compiler and its cache, kernel code generation, device-side checks.

It knows nothing of graphs: no module here imports ``symgpu.graph``, ``symgpu.tensor``,
``symgpu.compile`` or the layers above it in ``symgpu.gpu`` (tests/test_gpu_layout.py).
Nothing imports PyCUDA at module level: a context start does.
"""
