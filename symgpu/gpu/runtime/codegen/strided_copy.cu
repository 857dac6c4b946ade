/* symgpu: the strided device-to-device copy (runtime/copykernel.py).
 * dst[...] = src[...] per item size (strided_copy_N: a copy only needs the item size) and
 * dst[...] += src[...] per dtype (strided_inc_<dtype>, GpuIncSubtensor), one walk over the
 * byte strides (negative for reversed views, 0 for broadcast source axes). */
${common}
#define MAX_DIMS ${max_dims}

struct CopyMeta {
    long long shape[MAX_DIMS];
    long long src_stride[MAX_DIMS];   /* bytes */
    long long dst_stride[MAX_DIMS];   /* bytes */
};

struct SgAssign { template <typename T> __device__ static void apply(T &d, T s) { d = s; } };
/* d += s computed in the value type (float for the half types, one rounding; integers wrap
   as in NumPy) */
struct SgAdd {
    template <typename T> __device__ static void apply(T &d, T s) { sg_store(d, sg_load(d) + sg_load(s)); }
};

template <typename T, typename Op>
__device__ __forceinline__ void strided_body(const char *src, char *dst, long long n,
                                             int ndim, const CopyMeta &m)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long rest = i, s = 0, d = 0;
        for (int k = ndim - 1; k >= 0; --k) {
            const long long idx = rest % m.shape[k];
            rest /= m.shape[k];
            s += idx * m.src_stride[k];
            d += idx * m.dst_stride[k];
        }
        Op::apply(*reinterpret_cast<T *>(dst + d), *reinterpret_cast<const T *>(src + s));
    }
}

/* one entry point: NAME(src, dst, n, ndim, meta) over items of type T */
#define SG_STRIDED(NAME, T, OP)                                                              \
    extern "C" __global__ void NAME(const char *src, char *dst, long long n, long long ndim, \
                                    CopyMeta m)                                              \
    { strided_body<T, OP>(src, dst, n, (int)ndim, m); }

SG_STRIDED(strided_copy_1, unsigned char, SgAssign)
SG_STRIDED(strided_copy_2, unsigned short, SgAssign)
SG_STRIDED(strided_copy_4, unsigned int, SgAssign)
SG_STRIDED(strided_copy_8, unsigned long long, SgAssign)

/* one per copykernel.INC_DTYPES entry (tests/test_gpu_copykernel_source.py checks both agree) */
SG_STRIDED(strided_inc_float16, __half, SgAdd)
SG_STRIDED(strided_inc_bfloat16, __nv_bfloat16, SgAdd)
SG_STRIDED(strided_inc_float32, float, SgAdd)
SG_STRIDED(strided_inc_float64, double, SgAdd)
SG_STRIDED(strided_inc_int8, signed char, SgAdd)
SG_STRIDED(strided_inc_int16, short, SgAdd)
SG_STRIDED(strided_inc_int32, int, SgAdd)
SG_STRIDED(strided_inc_int64, long long, SgAdd)
SG_STRIDED(strided_inc_uint8, unsigned char, SgAdd)
SG_STRIDED(strided_inc_uint16, unsigned short, SgAdd)
SG_STRIDED(strided_inc_uint32, unsigned int, SgAdd)
SG_STRIDED(strided_inc_uint64, unsigned long long, SgAdd)
