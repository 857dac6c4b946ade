"""Linking: the VM that runs a rewritten graph's thunks (vm.py), and the C toolchain the CPU
kernels are built with (cc.py, c_runtime.py, diskcache.py). Knows graphs, not tensors."""
