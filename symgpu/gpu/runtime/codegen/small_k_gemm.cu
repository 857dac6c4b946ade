// D (m x n, column-major, leading dimension ldd) = alpha * A' B' + beta * D for a small inner
// dimension k (symgpu/gpu/ops/small_k_gemm.py): cuBLAS tiles such a product (the input
// gradient of a 10-class output layer: 512 x 1024 from k = 10) as a deep one and spends most
// of its time on the tiles' setup; here one thread per element of D sums its k products in
// a register.  A'(i, l) = a[i * sai + l * sal], B'(l, j) = b[l * sbl + j * sbj]: any
// transpose and leading dimension.  Consecutive threads take consecutive rows i of one
// column j, so D is written coalesced and B' read as a broadcast.  beta == 0 never reads D
// (it may hold anything, NaN included, as BLAS allows).
template <typename T>
__device__ __forceinline__ void small_k_body(const T *__restrict__ a, const T *__restrict__ b,
                                             T *d, long long m, long long n, int k,
                                             long long sai, long long sal, long long sbl,
                                             long long sbj, long long ldd, T alpha, T beta)
{
    const long long total = m * n;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += step) {
        const long long j = e / m, i = e - j * m;
        const T *ar = a + i * sai;
        const T *bc = b + j * sbj;
        T acc = T(0);
        for (int l = 0; l < k; ++l)
            acc += ar[l * sal] * bc[l * sbl];
        T *dp = d + i + j * ldd;
        *dp = beta == T(0) ? alpha * acc : alpha * acc + beta * *dp;
    }
}
//@ gemm

extern "C" __global__ void ${name}(const ${ctype} *a, const ${ctype} *b, ${ctype} *d,
                                   long long m, long long n, int k, long long sai,
                                   long long sal, long long sbl, long long sbj,
                                   long long ldd, ${ctype} alpha, ${ctype} beta)
{
    small_k_body<${ctype}>(a, b, d, m, n, k, sai, sal, sbl, sbj, ldd, alpha, beta);
}
