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

/* GpuJoin in one launch (copykernel.strided_join): up to MAX_JOIN inputs, each seen as
 * (outer, its length along the joined axis, inner) with byte strides of its own, written into
 * the C-contiguous output (outer, total length, inner) at its offset along the axis. */
#define MAX_JOIN 8

struct JoinMeta {
    long long src[MAX_JOIN];          /* device addresses */
    long long start[MAX_JOIN + 1];    /* offsets along the axis; start[nin] = total length */
    long long so[MAX_JOIN], sa[MAX_JOIN], sc[MAX_JOIN];   /* byte strides: outer, axis, inner */
    long long nin, axis_len, inner;
};

template <typename T>
__device__ __forceinline__ void join_body(T *dst, long long n, const JoinMeta &m)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const long long c = i % m.inner, r = i / m.inner;
        const long long a = r % m.axis_len, o = r / m.axis_len;
        int k = 0;
        while (k + 1 < m.nin && a >= m.start[k + 1])
            ++k;
        const char *s = reinterpret_cast<const char *>(m.src[k])
            + o * m.so[k] + (a - m.start[k]) * m.sa[k] + c * m.sc[k];
        dst[i] = *reinterpret_cast<const T *>(s);
    }
}

#define SG_JOIN(NAME, T)                                                                     \
    extern "C" __global__ void NAME(T *dst, long long n, JoinMeta m) { join_body<T>(dst, n, m); }

SG_JOIN(strided_join_1, unsigned char)
SG_JOIN(strided_join_2, unsigned short)
SG_JOIN(strided_join_4, unsigned int)
SG_JOIN(strided_join_8, unsigned long long)
