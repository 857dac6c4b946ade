// The kernels around CUB's sorts (symgpu/gpu/ops/sort.py): NumPy's float order as unsigned
// keys, the NaN fix of a one-row float sort, the radix select of topk, and the gathers and
// scatters along the last axis of the gradients. Arrays are C-contiguous (rows, n).
//
// Ordered keys: a float's bits made an unsigned integer that compares as NumPy orders
// (negative values' bits flipped, positive ones' sign bit set; every NaN the largest key, so
// NaNs come last as in np.sort; with `zero_tie`, -0.0 keys as +0.0 so a stable argsort keeps
// their index order as NumPy's does). Signed integers: the sign bit flipped.
template <typename T> struct Bits;
template <> struct Bits<float> { typedef unsigned int U; };
template <> struct Bits<double> { typedef unsigned long long U; };
template <> struct Bits<int> { typedef unsigned int U; };
template <> struct Bits<long long> { typedef unsigned long long U; };

template <typename T, typename U>
__device__ __forceinline__ U raw_bits(T x) { U b; memcpy(&b, &x, sizeof(U)); return b; }

template <typename T>
__device__ __forceinline__ typename Bits<T>::U ordered_key(T x, bool zero_tie)
{
    typedef typename Bits<T>::U U;
    const U sign = U(1) << (sizeof(U) * 8 - 1);
    if (T(0.5) == T(0))          // integers
        return raw_bits<T, U>(x) ^ sign;
    if (x != x) return ~U(0);
    if (zero_tie && x == T(0)) x = T(0);
    const U b = raw_bits<T, U>(x);
    return (b & sign) ? ~b : (b | sign);
}

template <typename T>
__device__ __forceinline__ T from_ordered_key(typename Bits<T>::U u)
{
    typedef typename Bits<T>::U U;
    const U sign = U(1) << (sizeof(U) * 8 - 1);
    U b = u ^ sign;
    if (T(0.5) != T(0)) {
        if (u == ~U(0)) return T(NAN);
        b = (u & sign) ? (u ^ sign) : ~u;
    }
    T x; memcpy(&x, &b, sizeof(T)); return x;
}

/* The half types (float16, bfloat16): their 16 bits ordered as a float's, zero-extended to
   32 (CUB sorts them as uint32 keys; the radix select's passes read the low 16 bits only),
   NaN and zero told in float (sg_load: common.cuh, pasted before this). Every NaN is 0xffff,
   the largest 16-bit key (the key of a NaN's own bits too). */
template <> struct Bits<__half> { typedef unsigned int U; };
template <> struct Bits<__nv_bfloat16> { typedef unsigned int U; };

template <typename H>
__device__ __forceinline__ unsigned int half_ordered_key(H x, bool zero_tie)
{
    const float f = sg_load(x);
    if (f != f) return 0xffffu;
    unsigned short b;
    memcpy(&b, &x, 2);
    if (zero_tie && f == 0.0f) b = 0;
    return (b & 0x8000u) ? (~(unsigned int)b & 0xffffu) : ((unsigned int)b | 0x8000u);
}

template <typename H>
__device__ __forceinline__ H half_from_ordered_key(unsigned int u)
{
    const unsigned short b = (unsigned short)((u & 0x8000u) ? (u ^ 0x8000u) : (~u & 0xffffu));
    H x;
    memcpy(&x, &b, 2);
    return x;
}

template <> __device__ __forceinline__ unsigned int ordered_key<__half>(__half x, bool zero_tie)
{ return half_ordered_key(x, zero_tie); }
template <> __device__ __forceinline__ unsigned int ordered_key<__nv_bfloat16>(__nv_bfloat16 x,
                                                                             bool zero_tie)
{ return half_ordered_key(x, zero_tie); }
template <> __device__ __forceinline__ __half from_ordered_key<__half>(unsigned int u)
{ return half_from_ordered_key<__half>(u); }
template <> __device__ __forceinline__ __nv_bfloat16 from_ordered_key<__nv_bfloat16>(unsigned int u)
{ return half_from_ordered_key<__nv_bfloat16>(u); }

/* the bits of a key that carry its order (16 for the half types, all of them otherwise):
   the select key of topk's smallest inverts those only */
template <typename T> __device__ __forceinline__ typename Bits<T>::U key_mask()
{ return ~typename Bits<T>::U(0); }
template <> __device__ __forceinline__ unsigned int key_mask<__half>() { return 0xffffu; }
template <> __device__ __forceinline__ unsigned int key_mask<__nv_bfloat16>() { return 0xffffu; }

#define GRID_LOOP(i, total) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (total); \
         i += (long long)gridDim.x * blockDim.x)

// keys[i] = ordered key of x[i] (keys may be NULL: integers sort as they are); idx[i] = i % n
template <typename T>
__device__ __forceinline__ void prep_pairs_body(const T *x, typename Bits<T>::U *keys,
                                                long long *idx, long long total, long long n)
{
    GRID_LOOP(i, total) {
        if (keys) keys[i] = ordered_key<T>(x[i], true);
        idx[i] = i % n;
    }
}

template <typename T>
__device__ __forceinline__ void to_keys_body(const T *x, typename Bits<T>::U *keys,
                                             long long total)
{
    GRID_LOOP(i, total) keys[i] = ordered_key<T>(x[i], false);
}

template <typename T>
__device__ __forceinline__ void from_keys_body(const typename Bits<T>::U *keys, T *out,
                                               long long total)
{
    GRID_LOOP(i, total) out[i] = from_ordered_key<T>(keys[i]);
}

// A one-row float sort by CUB leaves the NaNs with the sign bit set first (CUB orders bits,
// NumPy puts every NaN last): they are a prefix of m NaNs, found by binary search in the
// first pass (which only reads out[]) and handed to the second through *count. The passes
// move out[m:] to the front and NaNs to the end through `scratch`; with m == 0 (the usual
// case) every block returns at once.
template <typename T>
__device__ __forceinline__ void nan_shift_out_body(const T *out, T *scratch, long long *count,
                                                   long long n)
{
    __shared__ long long m;
    if (threadIdx.x == 0) {
        long long lo = 0, hi = n;     // out[:lo] are NaNs, out[hi:] are not
        while (lo < hi) {
            const long long mid = lo + (hi - lo) / 2;
            if (out[mid] != out[mid]) lo = mid + 1; else hi = mid;
        }
        m = lo;
        if (blockIdx.x == 0) *count = lo;
    }
    __syncthreads();
    if (m == 0) return;
    GRID_LOOP(i, n - m) scratch[i] = out[i + m];
}

template <typename T>
__device__ __forceinline__ void nan_shift_back_body(T *out, const T *scratch,
                                                    const long long *count, long long n)
{
    const long long m = *count;
    if (m == 0) return;
    GRID_LOOP(i, n) out[i] = i < n - m ? scratch[i] : T(NAN);
}

// ---------------------------------------------------------------------------- radix select
// topk of rows of n keys: the select key is the ordered key (bitwise-inverted for the
// smallest), and the k largest select keys are chosen. Per row, state[5 r ...] holds the
// prefix found so far, its mask, how many keys equal to the prefix are still needed, and the
// counters of the gather; hist[256 r ...] the digit counts of one pass. Each pass over a
// digit (8 bits, most significant first) counts the keys matching the prefix
// (topk_hist), then topk_pick finds the digit of the k-th key. After the last digit the
// prefix is the k-th key: topk_gather writes the keys above it and enough equal to it.
template <typename T>
__device__ __forceinline__ typename Bits<T>::U select_key(T x, int smallest)
{
    const typename Bits<T>::U u = ordered_key<T>(x, true);
    return smallest ? (u ^ key_mask<T>()) : u;
}

__device__ __forceinline__ void topk_init_body(unsigned long long *state,
                                               unsigned long long *hist, long long rows,
                                               long long k)
{
    GRID_LOOP(i, rows * 256) {
        hist[i] = 0;
        if (i < rows) {
            unsigned long long *st = state + 5 * i;
            st[0] = 0; st[1] = 0; st[2] = (unsigned long long)k; st[3] = 0; st[4] = 0;
        }
    }
}

template <typename T>
__device__ __forceinline__ void topk_hist_body(const T *x, long long rows, long long n,
                                               int smallest, const unsigned long long *state,
                                               unsigned long long *hist, int shift)
{
    typedef typename Bits<T>::U U;
    __shared__ unsigned int counts[256];
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) counts[i] = 0;
        __syncthreads();
        const U prefix = (U)state[5 * r], mask = (U)state[5 * r + 1];
        const T *row = x + r * n;
        GRID_LOOP(i, n) {
            const U u = select_key<T>(row[i], smallest);
            const unsigned int bin = (u & mask) == prefix ? (unsigned int)((u >> shift) & 255)
                                                          : 256u;
#ifdef __CUDA_ARCH__
            // one shared atomic per distinct digit of a warp: the first passes see few
            // digits (floats' exponents), which would otherwise serialise the warp
            const unsigned int same = __match_any_sync(__activemask(), bin);
            if (bin < 256 && (threadIdx.x & 31) == __ffs(same) - 1)
                atomicAdd(&counts[bin], (unsigned int)__popc(same));
#else
            if (bin < 256) atomicAdd(&counts[bin], 1u);
#endif
        }
        __syncthreads();
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            if (counts[i]) atomicAdd(&hist[256 * r + i], (unsigned long long)counts[i]);
        __syncthreads();
    }
}

__device__ __forceinline__ void topk_pick_body(unsigned long long *state,
                                               unsigned long long *hist, long long rows,
                                               int shift)
{
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        unsigned long long *st = state + 5 * r, *h = hist + 256 * r;
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long need = st[2];
            int b = 255;
            for (; b > 0; --b) {
                if (h[b] >= need) break;
                need -= h[b];
            }
            st[0] |= (unsigned long long)b << shift;
            st[1] |= 255ull << shift;
            st[2] = need;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < 256; i += blockDim.x) h[i] = 0;
    }
}

template <typename T>
__device__ __forceinline__ void topk_gather_body(const T *x, long long rows, long long n,
                                                 long long k, int smallest,
                                                 unsigned long long *state,
                                                 typename Bits<T>::U *keys, long long *idx)
{
    typedef typename Bits<T>::U U;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        unsigned long long *st = state + 5 * r;
        const U kth = (U)st[0];
        const unsigned long long need = st[2];
        const T *row = x + r * n;
        GRID_LOOP(i, n) {
            const U u = select_key<T>(row[i], smallest);
            long long slot = -1;
            if (u > kth) {
                slot = (long long)atomicAdd(st + 3, 1ull);
            } else if (u == kth && *(volatile unsigned long long *)(st + 4) < need) {
                const unsigned long long e = atomicAdd(st + 4, 1ull);
                if (e < need) slot = k - (long long)need + (long long)e;
            }
            if (slot >= 0) {
                keys[r * k + slot] = u;
                idx[r * k + slot] = i;
            }
        }
    }
}

// vals[r, j] = x[r, idx[r, j]] and out_idx = idx in the index dtype (either may be NULL)
template <typename T, typename I>
__device__ __forceinline__ void topk_finish_body(const T *x, const long long *idx,
                                                 long long rows, long long n, long long k,
                                                 T *vals, I *out_idx)
{
    GRID_LOOP(i, rows * k) {
        const long long j = idx[i];
        if (vals) vals[i] = x[(i / k) * n + j];
        if (out_idx) out_idx[i] = (I)j;
    }
}

// ------------------------------------------------------------- along the last axis (grads)
// out[r, j] = v[r, idx[r, j]] (n_idx indices a row into rows of n_v), negative indices
// counting from the end
template <typename T, typename I>
__device__ __forceinline__ void take_last_body(const T *v, const I *idx, T *out,
                                               long long rows, long long n_v, long long n_idx)
{
    GRID_LOOP(i, rows * n_idx) {
        long long j = (long long)idx[i];
        if (j < 0) j += n_v;
        out[i] = v[(i / n_idx) * n_v + j];
    }
}

// out[r, idx[r, j]] = g[r, j] into a zeroed out (indices distinct within a row: topk's)
template <typename T, typename I>
__device__ __forceinline__ void put_last_body(const T *g, const I *idx, T *out,
                                              long long rows, long long n_out, long long n_g)
{
    GRID_LOOP(i, rows * n_g) {
        long long j = (long long)idx[i];
        if (j < 0) j += n_out;
        out[(i / n_g) * n_out + j] = g[i];
    }
}
//@ keys

extern "C" __global__ void sort_prep_pairs_${dn}(const ${t} *x, ${u} *keys, long long *idx,
                                                long long total, long long n)
{ prep_pairs_body<${t}>(x, keys, idx, total, n); }

extern "C" __global__ void topk_hist_${dn}(const ${t} *x, long long rows, long long n,
    int smallest, const unsigned long long *state, unsigned long long *hist, int shift)
{ topk_hist_body<${t}>(x, rows, n, smallest, state, hist, shift); }

extern "C" __global__ void topk_gather_${dn}(const ${t} *x, long long rows, long long n,
    long long k, int smallest, unsigned long long *state, ${u} *keys, long long *idx)
{ topk_gather_body<${t}>(x, rows, n, k, smallest, state, keys, idx); }
//@ floats

extern "C" __global__ void sort_to_keys_${dn}(const ${t} *x, ${u} *keys, long long total)
{ to_keys_body<${t}>(x, keys, total); }

extern "C" __global__ void sort_from_keys_${dn}(const ${u} *keys, ${t} *out, long long total)
{ from_keys_body<${t}>(keys, out, total); }
//@ nan_shift

extern "C" __global__ void sort_nan_shift_out_${dn}(const ${t} *out, ${t} *scratch,
                                                   long long *count, long long n)
{ nan_shift_out_body<${t}>(out, scratch, count, n); }

extern "C" __global__ void sort_nan_shift_back_${dn}(${t} *out, const ${t} *scratch,
                                                    const long long *count, long long n)
{ nan_shift_back_body<${t}>(out, scratch, count, n); }
//@ pick

extern "C" __global__ void topk_init(unsigned long long *state, unsigned long long *hist,
                                     long long rows, long long k)
{ topk_init_body(state, hist, rows, k); }

extern "C" __global__ void topk_pick(unsigned long long *state, unsigned long long *hist,
                                     long long rows, int shift)
{ topk_pick_body(state, hist, rows, shift); }
//@ indexed

extern "C" __global__ void topk_finish_${dn}_${idn}(const ${t} *x, const long long *idx,
    long long rows, long long n, long long k, ${t} *vals, ${it} *out_idx)
{ topk_finish_body<${t}, ${it}>(x, idx, rows, n, k, vals, out_idx); }
//@ along

extern "C" __global__ void take_last_${dn}_${idn}(const ${t} *v, const ${it} *idx, ${t} *out,
    long long rows, long long n_v, long long n_idx)
{ take_last_body<${t}, ${it}>(v, idx, out, rows, n_v, n_idx); }

extern "C" __global__ void put_last_${dn}_${idn}(const ${t} *g, const ${it} *idx, ${t} *out,
    long long rows, long long n_out, long long n_g)
{ put_last_body<${t}, ${it}>(g, idx, out, rows, n_out, n_g); }
