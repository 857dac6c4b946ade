// The CTC loss around cuDNN's cudnnCTCLoss_v8 (symgpu/gpu/ops/ctc.py): Theano's padded
// labels packed into cuDNN's concatenated form on the device, and the results fixed up
// where cuDNN is not asked (or may not be asked) to compute. After report.cu's report().
//
// A report's value: (kind << 56) | (batch element << 32) | (unsigned) bad value;
// kind 1: a label outside [1, alphabet); 2: an input length outside [0, time];
// 3: more than ${max_labels} labels (cuDNN's limit).
//
// status[b]: 0 cuDNN's result stands; 1 cost 0, gradient 0 (no input, no label);
// 2 cost +inf, gradient 0 (no alignment: labels + repeats > input length, or no input);
// 3 an input reported as bad (its results are never read: the call raises);
// 4 no label but some input: every step must emit the blank, cost -sum_t log p_t(blank),
// computed here (cuDNN gets an empty label for it, as for 1 and 2).
#define CTC_BLOCK 256

__device__ __forceinline__ long long ctc_code(long long kind, long long b, int v)
{
    return (kind << 56) | (b << 32) | (long long)(unsigned int)v;
}

/* One block. Per batch element: count its labels (entries >= 0, in order), their repeats,
   check them and its input length, choose what cuDNN gets (lab_len, cudnn_in_len) and the
   status; then an exclusive scan of the lengths (offsets) and the compaction into packed.
   Elements cuDNN must not see get label length 0 and an input length >= 1. */
extern "C" __global__ void ctc_pack(const int *labels, long long ls0, long long ls1,
    const int *in_len, long long is0, long long n, long long width, long long t_max,
    long long alphabet, int *packed, int *lab_len, int *cudnn_in_len, int *offsets,
    int *status, unsigned long long *err)
{
    __shared__ long long part[CTC_BLOCK];
    __shared__ long long carry;
    const int tid = threadIdx.x;
    for (long long b = tid; b < n; b += blockDim.x) {
        int count = 0, repeats = 0, prev = -1, bad = 0;
        for (long long j = 0; j < width; ++j) {
            const int v = labels[b * ls0 + j * ls1];
            if (v < 0)
                continue;
            if (v == 0 || v >= alphabet) {
                report(err, ctc_code(1, b, v));
                bad = 1;
            }
            if (count > 0 && v == prev)
                ++repeats;
            prev = v;
            ++count;
        }
        const int len = in_len[b * is0];
        if (len < 0 || len > t_max) {
            report(err, ctc_code(2, b, len));
            bad = 1;
        }
        if (count > ${max_labels}) {
            report(err, ctc_code(3, b, count));
            bad = 1;
        }
        int st = 0;
        if (bad)
            st = 3;
        else if (len == 0)
            st = count ? 2 : 1;
        else if (count + repeats > len)
            st = 2;
        else if (count == 0)
            st = 4;
        status[b] = st;
        lab_len[b] = st ? 0 : count;
        cudnn_in_len[b] = (st == 0 || st == 2 || st == 4) && len > 0 ? len : 1;
    }
    if (tid == 0)
        carry = 0;
    __syncthreads();
    for (long long c = 0; c < n; c += blockDim.x) {
        const long long b = c + tid;
        const long long x = b < n ? lab_len[b] : 0;
        part[tid] = x;
        __syncthreads();
        for (int off = 1; off < (int)blockDim.x; off <<= 1) {
            const long long y = tid >= off ? part[tid - off] : 0;
            __syncthreads();
            part[tid] += y;
            __syncthreads();
        }
        if (b < n)
            offsets[b] = (int)(carry + part[tid] - x);
        __syncthreads();
        if (tid == (int)blockDim.x - 1)
            carry += part[tid];
        __syncthreads();
    }
    for (long long b = tid; b < n; b += blockDim.x) {
        if (lab_len[b] == 0)
            continue;
        int k = offsets[b];
        for (long long j = 0; j < width; ++j) {
            const int v = labels[b * ls0 + j * ls1];
            if (v >= 0)
                packed[k++] = v;
        }
    }
}

/* After cuDNN: costs of the elements it did not compute (status != 0), and the gradient
   (t_max, n, alphabet), C-contiguous, zero at every step t >= that element's input length
   and for every element whose status is not 0 or 4; for status 4 (blanks only) the cost
   and the gradient softmax - onehot(blank) from the activations. grad may be null. */
__device__ __forceinline__ float ctc_lse(const float *row, long long alphabet)
{
    float m = row[0];
    for (long long k = 1; k < alphabet; ++k)
        m = fmaxf(m, row[k]);
    float s = 0.0f;
    for (long long k = 0; k < alphabet; ++k)
        s += expf(row[k] - m);
    return m + logf(s);
}

extern "C" __global__ void ctc_fixup(const int *status, const int *cudnn_in_len, float *costs,
    float *grad, const float *acts, long long n, long long alphabet, long long total)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long upto = total > n ? total : n;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < upto; i += step) {
        if (i < n && status[i] == 4) {
            float c = 0.0f;
            for (long long t = 0; t < cudnn_in_len[i]; ++t) {
                const float *row = acts + (t * n + i) * alphabet;
                c += ctc_lse(row, alphabet) - row[0];
            }
            costs[i] = c;
        } else if (i < n && status[i] != 0) {
            costs[i] = status[i] == 1 ? 0.0f : INFINITY;
        }
        if (i < total) {
            const long long row = i / alphabet, a = i - row * alphabet;
            const long long b = row % n, t = row / n;
            if (t >= cudnn_in_len[b] || (status[b] != 0 && status[b] != 4)) {
                grad[i] = 0.0f;
            } else if (status[b] == 4) {
                const float *x = acts + row * alphabet;
                grad[i] = expf(x[a] - ctc_lse(x, alphabet)) - (a == 0 ? 1.0f : 0.0f);
            }
        }
    }
}
