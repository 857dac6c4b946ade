// im2col / col2im for convolutions without cuDNN (symgpu/gpu/ops/conv_gemm.py); entry
// points instantiated per dtype.
/* cols[k, n*P + i*wo + j], k = (c*kh + a)*kw + b: x[n, c0 + c, i*s0 + a'*d0 - pt,
   j*s1 + b'*d1 - pl] (0 outside), with (a', b') = (a, b), or flipped when flip. */
template <typename T>
__device__ void im2col_body(const T *x, T *cols, long long n, long long C, long long H,
                            long long W, long long c0, long long cg, long long kh, long long kw,
                            long long ho, long long wo, long long s0, long long s1, long long d0,
                            long long d1, long long pt, long long pl, int flip)
{
    const long long P = ho * wo, NP = n * P, total = cg * kh * kw * NP;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long k = t / NP, col = t - k * NP;
        const long long img = col / P, p = col - img * P;
        const long long i = p / wo, j = p - i * wo;
        const long long c = k / (kh * kw), ab = k - c * kh * kw;
        long long a = ab / kw, b = ab - a * kw;
        if (flip) { a = kh - 1 - a; b = kw - 1 - b; }
        const long long r = i * s0 + a * d0 - pt, q = j * s1 + b * d1 - pl;
        T v = T(0);
        if (r >= 0 && r < H && q >= 0 && q < W)
            v = x[((img * C + c0 + c) * H + r) * W + q];
        cols[t] = v;
    }
}

/* dx[n, c0 + c, r, q] = sum over taps (a, b) and outputs (i, j) that read (r, q) of
   dcols[k(c, a, b), n*P + i*wo + j]: each thread gathers one input element. */
template <typename T>
__device__ void col2im_body(const T *dcols, T *dx, long long n, long long C, long long H,
                            long long W, long long c0, long long cg, long long kh, long long kw,
                            long long ho, long long wo, long long s0, long long s1, long long d0,
                            long long d1, long long pt, long long pl, int flip)
{
    const long long P = ho * wo, NP = n * P, total = n * cg * H * W;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long q = t % W, r = (t / W) % H, c = (t / (W * H)) % cg, img = t / (W * H * cg);
        T acc = T(0);
        for (long long a = 0; a < kh; ++a) {
            const long long ri = r + pt - a * d0;
            if (ri < 0 || ri % s0) continue;
            const long long i = ri / s0;
            if (i >= ho) continue;
            for (long long b = 0; b < kw; ++b) {
                const long long qj = q + pl - b * d1;
                if (qj < 0 || qj % s1) continue;
                const long long j = qj / s1;
                if (j >= wo) continue;
                const long long ka = flip ? kh - 1 - a : a, kb = flip ? kw - 1 - b : b;
                const long long k = (c * kh + ka) * kw + kb;
                acc += dcols[k * NP + img * P + i * wo + j];
            }
        }
        dx[((img * C + c0 + c) * H + r) * W + q] = acc;
    }
}
//@ im2col
extern "C" __global__ void im2col_${dt}(const ${t} *x, ${t} *cols, ${args}){ im2col_body<${t}>(x, cols, ${call}); }
//@ col2im
extern "C" __global__ void col2im_${dt}(const ${t} *dcols, ${t} *dx, ${args}){ col2im_body<${t}>(dcols, dx, ${call}); }
