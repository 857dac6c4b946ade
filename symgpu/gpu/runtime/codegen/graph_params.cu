// Kernels that read host scalars from a graph's parameter block
// (symgpu/gpu/runtime/graph_params.py).
//@ dyn_slice

extern "C" __global__ void dyn_slice_copy_${n}(const char *base, const long long *offset,
                                              char *dst, long long n, long long ndim,
                                              CopyMeta m)
{ strided_body<${t}, SgAssign>(base + *offset, dst, n, (int)ndim, m); }
//@ arange_dev

extern "C" __global__ void arange_dev_${d}(${t} *out, const long long *p, long long n)
{
    const long long start = p[0], step = p[1];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (${t})(start + i * step);
}
//@ pad_prefix

// A sequence padded to its bucket: the first n rows of x (rows of `row` items, x's `x_row`
// items apart) into out (`rows` rows, C-contiguous), zeros after them; n is read from the
// parameter block (p) under a capture, else passed (p null): one graph per bucket serves
// every length in it (symgpu/gpu/ops/pad_steps.py, GpuPadPrefix).
extern "C" __global__ void pad_prefix_${n}(${t} *out, const ${t} *x, const long long *p,
                                           long long n_arg, long long rows, long long row,
                                           long long x_row)
{
    const long long n = p ? p[0] : n_arg;
    const long long total = rows * row;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long r = i / row;
        out[i] = r < n ? x[r * x_row + (i - r * row)] : (${t})0;
    }
}
//@ table_copy

// Byte copies whose destination, source and length a graph reads from its parameter block
// at replay (a chunked loop's staging copies and results: scan_graph.py): entry blockIdx.y
// of the table, 16-byte words where the three allow, bytes otherwise; a length of 0 skips.
struct SgTableEntry { char *dst; const char *src; long long n; };

extern "C" __global__ void table_copy(const SgTableEntry *table)
{
    const SgTableEntry e = table[blockIdx.y];
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    if ((((unsigned long long)e.dst | (unsigned long long)e.src | (unsigned long long)e.n)
         & 15ULL) == 0) {
        uint4 *d = (uint4 *)e.dst;
        const uint4 *s = (const uint4 *)e.src;
        const long long words = e.n >> 4;
        for (long long i = first; i < words; i += stride)
            d[i] = s[i];
    } else {
        for (long long i = first; i < e.n; i += stride)
            e.dst[i] = e.src[i];
    }
}
