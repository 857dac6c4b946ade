// General NumPy advanced indexing: gather, set and inc over a region described by AdvMeta
// (symgpu/gpu/ops/advanced_general.py builds it per call from the index's slices, ints,
// newaxis and index arrays). advanced.cu's device code (fix_index, atomic_inc) is pasted
// before this; entry points are instantiated per value dtype.
#define ADV_DIMS ${dims}
#define ADV_ARRAYS ${arrays}

/* The region x[index] as C-order coordinates c over `ndim` dims of `shape`: element
   base + sum_k c[k] * xs[k] + sum_a fix(idx_a[e_a]) * step[a] of x, where the index arrays'
   broadcast block is the dims [block_at, block_at + block_nd) and array a's element is
   e_a = sum_b c[block_at + b] * is[a][b] (0 strides where it broadcasts). ys: the value's
   element strides over the region (set / inc; 0 where it broadcasts). */
struct AdvMeta {
    long long shape[ADV_DIMS];
    long long xs[ADV_DIMS];
    long long ys[ADV_DIMS];
    long long idx[ADV_ARRAYS];      /* device addresses of the index arrays */
    long long wide[ADV_ARRAYS];     /* 1: int64 items, 0: int32 */
    long long len[ADV_ARRAYS];      /* the length of the axis of x each array indexes */
    long long step[ADV_ARRAYS];     /* x's element stride along that axis */
    long long is[ADV_ARRAYS * ADV_DIMS];
    long long ndim, block_at, block_nd, narrays, base;
};

/* MODE 0: dst[i] = src[x offset] (gather into the C-contiguous region); MODE 1:
   dst[x offset] = src[y offset]; MODE 2: the same added atomically (repeated indices
   accumulate, as np.add.at). A bad index is reported (the node's slot) and its element
   skipped: the host raises at its next synchronisation. */
template <typename T, int MODE>
__device__ __forceinline__ void adv_general_body(T *dst, const T *src, long long n,
                                                 const AdvMeta &m, unsigned long long *err)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long c[ADV_DIMS];
        long long rest = i, off = m.base, yoff = 0;
        for (int k = (int)m.ndim - 1; k >= 0; --k) {
            c[k] = rest % m.shape[k];
            rest /= m.shape[k];
            off += c[k] * m.xs[k];
            if (MODE) yoff += c[k] * m.ys[k];
        }
        bool ok = true;
        for (int a = 0; a < (int)m.narrays; ++a) {
            long long e = 0;
            for (int b = 0; b < (int)m.block_nd; ++b) e += c[m.block_at + b] * m.is[a * ADV_DIMS + b];
            const long long raw = m.wide[a] ? ((const long long *)m.idx[a])[e]
                                            : (long long)((const int *)m.idx[a])[e];
            long long j;
            if (!fix_index<long long>(raw, m.len[a], j)) {
                report(err, raw);
                ok = false;
                break;
            }
            off += j * m.step[a];
        }
        if (!ok) continue;
        if (MODE == 0) dst[i] = src[off];
        else if (MODE == 1) dst[off] = src[yoff];
        else atomic_inc(dst + off, src[yoff]);
    }
}
//@ gather

extern "C" __global__ void ${name}(const ${t} *x, ${t} *out, long long n, AdvMeta m,
                                   unsigned long long *err)
{ adv_general_body<${t}, 0>(out, x, n, m, err); }
//@ scatter

extern "C" __global__ void ${name}(${t} *out, const ${t} *y, long long n, AdvMeta m,
                                   unsigned long long *err)
{ adv_general_body<${t}, ${mode}>(out, y, n, m, err); }
