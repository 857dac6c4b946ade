// The NCCL watchdog's progress counters (symgpu/gpu/ops/collectives.py), in page-locked host
// memory mapped into the device: word 0 counts collectives started, word 1 collectives
// finished, word 2 is set by the watchdog when it aborted the communicator.  One thread each;
// launched around every collective, so a CUDA graph's replays count too.
extern "C" __global__ void nccl_started(volatile unsigned long long *counters)
{
    counters[0] = counters[0] + 1ULL;
    __threadfence_system();
}

// The collective before it ran to its end, or was aborted: then report through the node's
// device-check slot, so the call raises the watchdog's error at its next synchronisation.
extern "C" __global__ void nccl_finished(volatile unsigned long long *counters,
                                         unsigned long long *slot)
{
    counters[1] = counters[1] + 1ULL;
    __threadfence_system();
    if (counters[2] != 0ULL)
        report(slot, (long long)counters[2]);
}
