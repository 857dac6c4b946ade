/* symgpu: the cuFFT ops' helper kernels (gpu/ops/fft.py), one grid-stride walk each.
 * fft_pack_<dtype>: a strided real array packed C-contiguous (rfft of a view cuFFT cannot
 *   read: not C-contiguous, or not aligned to a complex item).
 * fft_hermitian_<dtype>: irfft's input, (batch, d1.., K) complex values at any byte strides
 *   (imaginary part `im_stride` bytes after the real one), packed as interleaved complex for
 *   cuFFT's C2R (which overwrites its input: the user's array is never handed to it), with
 *   the planes k = 0 and, for an even signal length, k = K - 1 replaced by their Hermitian
 *   parts over the transform axes before the last, (X[j] + conj(X[-j])) / 2: what NumPy's
 *   irfftn computes from any input, and what C2R needs to be defined. */
#define FFT_MAX_DIMS ${max_dims}

struct FftMeta {
    long long shape[FFT_MAX_DIMS];    /* the packed destination's shape (complex items) */
    long long stride[FFT_MAX_DIMS];   /* the source's byte strides */
};

template <typename T>
__device__ __forceinline__ void pack_body(const char *src, T *dst, long long n, int ndim,
                                          const FftMeta &m)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long rest = i, off = 0;
        for (int d = ndim - 1; d >= 0; --d) {
            off += (rest % m.shape[d]) * m.stride[d];
            rest /= m.shape[d];
        }
        dst[i] = *reinterpret_cast<const T *>(src + off);
    }
}

template <typename T>
__device__ __forceinline__ void hermitian_body(const char *src, T *dst, long long n, int ndim,
                                               long long im_stride, long long nyquist,
                                               const FftMeta &m)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long last = m.shape[ndim - 1];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long idx[FFT_MAX_DIMS];
        long long rest = i, off = 0;
        for (int d = ndim - 1; d >= 0; --d) {
            idx[d] = rest % m.shape[d];
            rest /= m.shape[d];
            off += idx[d] * m.stride[d];
        }
        T re = *reinterpret_cast<const T *>(src + off);
        T im = *reinterpret_cast<const T *>(src + off + im_stride);
        const long long k = idx[ndim - 1];
        if (k == 0 || (nyquist && k == last - 1)) {
            long long moff = idx[0] * m.stride[0] + k * m.stride[ndim - 1];
            for (int d = 1; d < ndim - 1; ++d)
                moff += (idx[d] ? m.shape[d] - idx[d] : 0) * m.stride[d];
            const T mre = *reinterpret_cast<const T *>(src + moff);
            const T mim = *reinterpret_cast<const T *>(src + moff + im_stride);
            re = (re + mre) * T(0.5);
            im = (im - mim) * T(0.5);
        }
        dst[2 * i] = re;
        dst[2 * i + 1] = im;
    }
}

#define SG_FFT(DT, T)                                                                        \
    extern "C" __global__ void fft_pack_##DT(const char *src, T *dst, long long n,           \
                                             long long ndim, FftMeta m)                      \
    { pack_body<T>(src, dst, n, (int)ndim, m); }                                             \
    extern "C" __global__ void fft_hermitian_##DT(const char *src, T *dst, long long n,      \
                                                  long long ndim, long long im_stride,       \
                                                  long long nyquist, FftMeta m)              \
    { hermitian_body<T>(src, dst, n, (int)ndim, im_stride, nyquist, m); }

SG_FFT(float32, float)
SG_FFT(float64, double)
