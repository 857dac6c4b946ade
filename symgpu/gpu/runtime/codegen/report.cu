// A check kernel's report into its slot (symgpu/gpu/runtime/device_checks.py): the bad
// value, then the flag, then its page's "something was reported" word.
__device__ __forceinline__ void report(volatile unsigned long long *slot, long long raw)
{
    if (slot[0] == 0ULL) {
        slot[1] = (unsigned long long)raw;
        __threadfence_system();
        slot[0] = 1ULL;
        *(volatile unsigned long long *)((unsigned long long)slot & ~4095ULL) = 1ULL;
    }
}
