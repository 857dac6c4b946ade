// images2neibs and its gradient (symgpu/gpu/ops/neighbours.py), Theano's theano.gpuarray
// .neighbours.GpuImages2Neibs: entry points instantiated per dtype.
//
// Geometry (symgpu/tensor/nnet/neighbours.py, window_geometry): images (N, S, H, W); along the
// rows, gc window positions of c pixels, `sx` apart, window a reading pixel a * sx + i - px at
// offset i (px the leading padding: 0 valid/ignore_borders, c / 2 half and wrap_centered,
// c - 1 full); the columns likewise (gd, d, sy, py). Outside the image a window reads a zero,
// except in wrap_centered, where the position wraps around the image (a torus). Window (a, b)
// of image (n, s) is row b + gd * (a + gc * (s + S * n)) of the (N*S*gc*gd, c*d) output, its
// pixel (i, j) column i * d + j.

/* One image axis: `grid` windows of `c` pixels, `step` apart, `pad` leading padding, over
   `len` pixels. */
struct NeibAxis { long long len, grid, c, step, pad; };

/* The pixel window `w` reads at offset `i`, or -1 for a padding zero. */
__device__ __forceinline__ long long neib_pixel(const NeibAxis &ax, long long w, long long i,
                                                bool wrap)
{
    long long p = w * ax.step + i - ax.pad;
    if (wrap) {          /* p lies in (-len, 2 len): grid * step < len + step, c <= len */
        if (p < 0) p += ax.len;
        else if (p >= ax.len) p -= ax.len;
        return p;
    }
    return (p < 0 || p >= ax.len) ? -1 : p;
}

/* The windows [lo, hi] that read unwrapped position p at some offset 0 <= p + pad - w * step
   < c (empty when lo > hi). */
__device__ __forceinline__ void neib_windows(const NeibAxis &ax, long long p, long long &lo,
                                             long long &hi)
{
    const long long top = p + ax.pad, bot = top - ax.c + 1;
    hi = top < 0 ? -1 : min(top / ax.step, ax.grid - 1);
    lo = bot <= 0 ? 0 : (bot + ax.step - 1) / ax.step;
}

/* z[t] for every element t of the C-contiguous output: a copy of the pixel its window reads
   (the element itself, bits and all: no arithmetic), zero for a padding pixel. x is read
   through its element strides. */
template <typename T>
__device__ void neibs_fwd_body(const T *x, T *z, long long N, long long S, NeibAxis R,
                               NeibAxis C, long long xs0, long long xs1, long long xs2,
                               long long xs3, bool wrap)
{
    const long long cd = R.c * C.c;
    const long long total = N * S * R.grid * C.grid * cd;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long col = t % cd, row = t / cd;
        const long long i = col / C.c, j = col % C.c;
        const long long b = row % C.grid, a = (row / C.grid) % R.grid;
        const long long ns = row / (C.grid * R.grid);
        const long long s = ns % S, n = ns / S;
        const long long r = neib_pixel(R, a, i, wrap), q = neib_pixel(C, b, j, wrap);
        if (r < 0 || q < 0)
            sg_store(z[t], 0);
        else
            z[t] = x[n * xs0 + s * xs1 + r * xs2 + q * xs3];
    }
}

/* gx[t] for every pixel t of the C-contiguous (N, S, H, W) gradient: the sum, in A, of the
   gradient of every window element that read it (a gather: deterministic, no atomics). In
   wrap_centered a window element at unwrapped position p reads pixel p mod len, so pixel r
   gathers from the positions r - len, r and r + len. gz is read through its element strides. */
template <typename T, typename A>
__device__ void neibs_grad_body(const T *gz, T *gx, long long N, long long S, NeibAxis R,
                                NeibAxis C, long long gs0, long long gs1, bool wrap)
{
    const long long total = N * S * R.len * C.len;
    const long long step = (long long)gridDim.x * blockDim.x;
    const int shifts = wrap ? 1 : 0;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long q = t % C.len, r = (t / C.len) % R.len, ns = t / (C.len * R.len);
        A acc = 0;
        for (int kr = -shifts; kr <= shifts; ++kr) {
            const long long pr = r + kr * R.len;
            long long alo, ahi;
            neib_windows(R, pr, alo, ahi);
            for (long long a = alo; a <= ahi; ++a) {
                const long long i = pr + R.pad - a * R.step;
                for (int kq = -shifts; kq <= shifts; ++kq) {
                    const long long pq = q + kq * C.len;
                    long long blo, bhi;
                    neib_windows(C, pq, blo, bhi);
                    for (long long b = blo; b <= bhi; ++b) {
                        const long long j = pq + C.pad - b * C.step;
                        const long long row = b + C.grid * (a + R.grid * ns);
                        acc += (A)sg_load(gz[row * gs0 + (i * C.c + j) * gs1]);
                    }
                }
            }
        }
        sg_store(gx[t], acc);
    }
}
//@ fwd

extern "C" __global__ void neibs_fwd_${dtype}(const ${t} *x, ${t} *z, long long N, long long S,
    long long H, long long W, long long gc, long long gd, long long c, long long d,
    long long sx, long long sy, long long px, long long py, long long xs0, long long xs1,
    long long xs2, long long xs3, int wrap)
{
    const NeibAxis R = {H, gc, c, sx, px}, C = {W, gd, d, sy, py};
    neibs_fwd_body<${t}>(x, z, N, S, R, C, xs0, xs1, xs2, xs3, wrap != 0);
}
//@ grad

extern "C" __global__ void neibs_grad_${dtype}(const ${t} *gz, ${t} *gx, long long N,
    long long S, long long H, long long W, long long gc, long long gd, long long c,
    long long d, long long sx, long long sy, long long px, long long py, long long gs0,
    long long gs1, int wrap)
{
    const NeibAxis R = {H, gc, c, sx, px}, C = {W, gd, d, sy, py};
    neibs_grad_body<${t}, ${acc}>(gz, gx, N, S, R, C, gs0, gs1, wrap != 0);
}
