"""Running compiled GPU functions: whole-function CUDA graphs (planning, capture,
replay, graph parameters), the profiler's node timers and parallel cold compiles.
"""
