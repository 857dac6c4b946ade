// CUB's device-wide sorts as a host shared library (symgpu/gpu/ops/sort.py loads it through
// symgpu/gpu/runtime/shared_library.py). Two-phase as CUB itself: a call with temp == NULL
// writes the temporary storage it needs to *bytes and queues nothing; the call with the
// storage (from the context's pool) only queues kernels on `stream`, allocating nothing, so
// it can be captured into a CUDA graph. Every entry point returns a cudaError_t.
//
// Keys (dtype codes): 0 float32, 1 float64, 2 int32, 3 int64, 4 uint32, 5 uint64.
// Values: NULL (keys only) or int64. rows == 1: cub::DeviceRadixSort (onesweep); rows > 1:
// cub::DeviceSegmentedSort's stable sorts over rows of n keys (offsets r * n from a
// counting iterator: no offsets array). Radix sorts are stable.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <cuda_runtime.h>
#include <cstddef>

namespace {

struct RowStart {
    long long len;
    __host__ __device__ long long operator()(long long r) const { return r * len; }
};

template <typename K, bool PAIRS, bool DESC, bool SEGMENTS>
cudaError_t sort_typed(void *temp, size_t *bytes, const void *kin, void *kout,
                       const long long *vin, long long *vout, long long rows, long long n,
                       cudaStream_t s)
{
    const K *ki = static_cast<const K *>(kin);
    K *ko = static_cast<K *>(kout);
    size_t &b = *bytes;
    const int bits = int(sizeof(K) * 8);
    if (rows == 1 || !SEGMENTS) {
        if (!PAIRS)
            return DESC ? cub::DeviceRadixSort::SortKeysDescending(temp, b, ki, ko, n, 0, bits, s)
                        : cub::DeviceRadixSort::SortKeys(temp, b, ki, ko, n, 0, bits, s);
        return DESC
            ? cub::DeviceRadixSort::SortPairsDescending(temp, b, ki, ko, vin, vout, n, 0, bits, s)
            : cub::DeviceRadixSort::SortPairs(temp, b, ki, ko, vin, vout, n, 0, bits, s);
    }
    if constexpr (SEGMENTS) {
        auto begin = thrust::make_transform_iterator(thrust::counting_iterator<long long>(0),
                                                     RowStart{n});
        auto end = begin + 1;
        const long long total = rows * n;
        if constexpr (!PAIRS) {
            return DESC
                ? cub::DeviceSegmentedSort::StableSortKeysDescending(temp, b, ki, ko, total,
                                                                     rows, begin, end, s)
                : cub::DeviceSegmentedSort::StableSortKeys(temp, b, ki, ko, total, rows, begin,
                                                           end, s);
        } else {
            return DESC
                ? cub::DeviceSegmentedSort::StableSortPairsDescending(temp, b, ki, ko, vin, vout,
                                                                      total, rows, begin, end, s)
                : cub::DeviceSegmentedSort::StableSortPairs(temp, b, ki, ko, vin, vout, total,
                                                            rows, begin, end, s);
        }
    }
    return cudaErrorInvalidValue;
}

}  // namespace

// Only the combinations symgpu/gpu/ops/sort.py asks for are instantiated (each costs
// nvcc about half a minute): keys alone ascending for float32/float64 (one row), int32/int64
// and uint32/uint64 (the ordered float keys of many rows); int64 values ascending for
// int32/int64/uint32/uint64 keys (argsort), descending for uint32/uint64 (topk's results).
// Anything else returns cudaErrorInvalidValue.
#define SORT_CALL(K, PAIRS, DESC, SEGMENTS) \
    sort_typed<K, PAIRS, DESC, SEGMENTS>(temp, bytes, keys_in, keys_out, values_in, \
                                         values_out, rows, n, s)

extern "C" int symgpu_sort(int dtype, void *temp, size_t *bytes, const void *keys_in,
                           void *keys_out, const long long *values_in, long long *values_out,
                           long long rows, long long n, int descending, void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool pairs = values_in != nullptr;
    if (!pairs && !descending) {
        switch (dtype) {
        case 0: if (rows == 1) return SORT_CALL(float, false, false, false); break;
        case 1: if (rows == 1) return SORT_CALL(double, false, false, false); break;
        case 2: return SORT_CALL(int, false, false, true);
        case 3: return SORT_CALL(long long, false, false, true);
        case 4: return SORT_CALL(unsigned int, false, false, true);
        case 5: return SORT_CALL(unsigned long long, false, false, true);
        default: break;
        }
    } else if (pairs && !descending) {
        switch (dtype) {
        case 2: return SORT_CALL(int, true, false, true);
        case 3: return SORT_CALL(long long, true, false, true);
        case 4: return SORT_CALL(unsigned int, true, false, true);
        case 5: return SORT_CALL(unsigned long long, true, false, true);
        default: break;
        }
    } else if (pairs) {
        switch (dtype) {
        case 4: return SORT_CALL(unsigned int, true, true, true);
        case 5: return SORT_CALL(unsigned long long, true, true, true);
        default: break;
        }
    }
    return int(cudaErrorInvalidValue);
}

extern "C" const char *symgpu_sort_error_string(int code)
{
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
