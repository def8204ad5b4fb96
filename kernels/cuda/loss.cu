/*
 * loss.cu — row log_softmax / logsumexp, the Laplace NLL, best-mode selection, the regression
 * loss and the mixture-NLL classification loss (kernels/cpu/loss.c semantics).
 *
 * Scalar losses are reduced in the CPU's order: one block computes per-index terms in parallel,
 * chunk by chunk, and thread 0 adds them in ascending index order into a double. Best mode
 * spells the distance with explicitly rounded intrinsics (no FMA), so the argmin — a discrete
 * choice — is the CPU's bit for bit.
 */
#include "cuda_common.cuh"

#define LOSS_BLOCK 256 /* threads of the single-block reduction kernels */

// ---- row helpers
// ---------------------------------------------------------------------------------

__device__ static inline float row_max_dev(const float *x, int64_t K)
{
    float m = x[0];
    for (int64_t k = 1; k < K; k++)
        m = x[k] > m ? x[k] : m;
    return m;
}

__device__ static inline void log_softmax_row(float *out, const float *x, int64_t K)
{
    float m = row_max_dev(x, K);
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += expf(x[k] - m);
    float ls = logf(s);
    for (int64_t k = 0; k < K; k++)
        out[k] = x[k] - m - ls;
}

__device__ static inline void log_softmax_row_backward(float *dinp, const float *dout,
                                                       const float *out, int64_t K)
{
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += dout[k];
    for (int64_t k = 0; k < K; k++)
        dinp[k] = dout[k] - expf(out[k]) * s;
}

__device__ static inline float logsumexp_row(const float *x, int64_t K)
{
    float m = row_max_dev(x, K);
    if (isinf(m))
        m = 0.0f;
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += expf(x[k] - m);
    return logf(s) + m;
}

// ---- log_softmax / logsumexp
// ---------------------------------------------------------------------

static __global__ void log_softmax_forward_kernel(float *out, const float *inp, int64_t N,
                                                  int64_t K)
{
    for (int64_t n = cuda_tid(); n < N; n += cuda_nthreads())
        log_softmax_row(out + n * K, inp + n * K, K);
}

void qc_log_softmax_forward_cuda(float *out, const float *inp, int64_t N, int64_t K,
                                 cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && K > 0, "log_softmax fwd cuda: N %lld K %lld", (long long)N, (long long)K);
    if (N == 0)
        return;
    log_softmax_forward_kernel<<<cuda_blocks(N, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, N,
                                                                                      K);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void log_softmax_backward_kernel(float *dinp, const float *dout, const float *out,
                                                   int64_t N, int64_t K)
{
    for (int64_t n = cuda_tid(); n < N; n += cuda_nthreads())
        log_softmax_row_backward(dinp + n * K, dout + n * K, out + n * K, K);
}

void qc_log_softmax_backward_cuda(float *dinp, const float *dout, const float *out, int64_t N,
                                  int64_t K, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && K > 0, "log_softmax bwd cuda: N %lld K %lld", (long long)N, (long long)K);
    if (N == 0)
        return;
    log_softmax_backward_kernel<<<cuda_blocks(N, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(dinp, dout,
                                                                                       out, N, K);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void logsumexp_forward_kernel(float *out, const float *inp, int64_t N, int64_t K)
{
    for (int64_t n = cuda_tid(); n < N; n += cuda_nthreads())
        out[n] = logsumexp_row(inp + n * K, K);
}

void qc_logsumexp_forward_cuda(float *out, const float *inp, int64_t N, int64_t K,
                               cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && K > 0, "logsumexp fwd cuda: N %lld K %lld", (long long)N, (long long)K);
    if (N == 0)
        return;
    logsumexp_forward_kernel<<<cuda_blocks(N, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, N, K);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void logsumexp_backward_kernel(float *dinp, const float *dout, const float *inp,
                                                 const float *out, int64_t N, int64_t K)
{
    int64_t total = N * K;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t n = t / K;
        dinp[t] = dout[n] * expf(inp[t] - out[n]);
    }
}

void qc_logsumexp_backward_cuda(float *dinp, const float *dout, const float *inp, const float *out,
                                int64_t N, int64_t K, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && K > 0, "logsumexp bwd cuda: N %lld K %lld", (long long)N, (long long)K);
    if (N == 0)
        return;
    logsumexp_backward_kernel<<<cuda_blocks(N * K, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dinp, dout, inp, out, N, K);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- Laplace NLL
// ---------------------------------------------------------------------------------

__device__ static inline float laplace_nll_dev(float mu, float scale, float y)
{
    float sc = scale > QC_LAPLACE_SCALE_MIN ? scale : QC_LAPLACE_SCALE_MIN;
    return logf(2.0f * sc) + fabsf(y - mu) / sc;
}

/* Gradients at the clamped scale, passed straight through to the raw scale. */
__device__ static inline void laplace_nll_grad_dev(float g, float mu, float scale, float y,
                                                   float *dmu, float *dscale)
{
    float sc = scale > QC_LAPLACE_SCALE_MIN ? scale : QC_LAPLACE_SCALE_MIN;
    float diff = y - mu;
    float sgn = diff > 0.0f ? 1.0f : (diff < 0.0f ? -1.0f : 0.0f);
    *dmu = -g * sgn / sc;
    *dscale = g * (1.0f / sc - fabsf(diff) / (sc * sc));
}

static __global__ void laplace_nll_forward_kernel(float *nll, const float *mu, const float *scale,
                                                  const float *y, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        nll[i] = laplace_nll_dev(mu[i], scale[i], y[i]);
}

void qc_laplace_nll_forward_cuda(float *nll, const float *mu, const float *scale, const float *y,
                                 int64_t n, cudaStream_t stream)
{
    QC_ASSERT(n >= 0, "laplace_nll fwd cuda: n %lld", (long long)n);
    if (n == 0)
        return;
    laplace_nll_forward_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(nll, mu,
                                                                                      scale, y, n);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void laplace_nll_backward_kernel(float *dmu, float *dscale, const float *dnll,
                                                   const float *mu, const float *scale,
                                                   const float *y, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads()) {
        float a, b;
        laplace_nll_grad_dev(dnll[i], mu[i], scale[i], y[i], &a, &b);
        if (dmu)
            dmu[i] = a;
        if (dscale)
            dscale[i] = b;
    }
}

void qc_laplace_nll_backward_cuda(float *dmu, float *dscale, const float *dnll, const float *mu,
                                  const float *scale, const float *y, int64_t n,
                                  cudaStream_t stream)
{
    QC_ASSERT(n >= 0, "laplace_nll bwd cuda: n %lld", (long long)n);
    if (n == 0 || (!dmu && !dscale))
        return;
    laplace_nll_backward_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dmu, dscale, dnll, mu, scale, y, n);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- best mode
// -----------------------------------------------------------------------------------

static __global__ void best_mode_kernel(int64_t *best, const float *loc, const float *gt,
                                        int64_t gt_stride, const uint8_t *mask, int64_t A,
                                        int64_t K, int64_t S)
{
    for (int64_t a = cuda_tid(); a < A; a += cuda_nthreads()) {
        int64_t kb = 0;
        float lb = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float l = 0.0f;
            for (int64_t s = 0; s < S; s++) {
                const float *p = loc + ((a * K + k) * S + s) * 2;
                const float *g = gt + (a * S + s) * gt_stride;
                float dx = p[0] - g[0], dy = p[1] - g[1];
                float d2 = __fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy));
                l = __fadd_rn(l, __fmul_rn(sqrtf(d2), (float)mask[a * S + s]));
            }
            if (k == 0 || l < lb) {
                lb = l;
                kb = k;
            }
        }
        best[a] = kb;
    }
}

void qc_best_mode_cuda(int64_t *best, const float *loc, const float *gt, int64_t gt_stride,
                       const uint8_t *mask, int64_t A, int64_t K, int64_t S, cudaStream_t stream)
{
    QC_ASSERT(A >= 0 && K > 0 && S >= 0 && gt_stride >= 2, "best_mode cuda: A %lld K %lld S %lld",
              (long long)A, (long long)K, (long long)S);
    if (A == 0)
        return;
    best_mode_kernel<<<cuda_blocks(A, 128), 128, 0, stream>>>(best, loc, gt, gt_stride, mask, A, K,
                                                              S);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- regression loss
// -----------------------------------------------------------------------------

/* cnt[s] = max(1, Σ_a mask[a,s]) as float, one thread per s. */
static __global__ void step_counts_kernel(float *cnt, const uint8_t *mask, int64_t A, int64_t S)
{
    for (int64_t s = cuda_tid(); s < S; s += cuda_nthreads()) {
        int64_t c = 0;
        for (int64_t a = 0; a < A; a++)
            c += mask[a * S + s] ? 1 : 0;
        cnt[s] = (float)(c > 1 ? c : 1);
    }
}

/* Single block: term[s] = (Σ_a L[a,s], ascending a, double) / cnt[s] computed per thread, chunk
 * by chunk; thread 0 adds the terms in ascending s. */
static __global__ void reg_loss_forward_kernel(float *loss, const float *loc, const float *scale,
                                               const int64_t *best, const float *gt,
                                               int64_t gt_stride, const uint8_t *mask,
                                               const float *cnt, int64_t A, int64_t K, int64_t S)
{
    __shared__ double term[LOSS_BLOCK];
    double total = 0.0; /* meaningful in thread 0 */
    for (int64_t s0 = 0; s0 < S; s0 += LOSS_BLOCK) {
        int64_t s = s0 + threadIdx.x;
        if (s < S) {
            double sum = 0.0;
            for (int64_t a = 0; a < A; a++) {
                const float *p = loc + ((a * K + best[a]) * S + s) * 2;
                const float *q = scale + ((a * K + best[a]) * S + s) * 2;
                const float *g = gt + (a * S + s) * gt_stride;
                float l = laplace_nll_dev(p[0], q[0], g[0]) + laplace_nll_dev(p[1], q[1], g[1]);
                sum += (double)(l * (float)mask[a * S + s]);
            }
            term[threadIdx.x] = sum / (double)cnt[s];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t m = S - s0 < LOSS_BLOCK ? S - s0 : LOSS_BLOCK;
            for (int64_t j = 0; j < m; j++)
                total += term[j];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *loss = (float)(total / (double)S);
}

/* The per-step denominators into cnt: a copy of count (device) when given, else from the
 * mask. */
static void reg_loss_counts(float *cnt, const float *count, const uint8_t *mask, int64_t A,
                            int64_t S, cudaStream_t stream)
{
    if (count) {
        QC_CUDA_ASSERT(cudaMemcpyAsync(cnt, count, (size_t)S * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream));
        return;
    }
    step_counts_kernel<<<cuda_blocks(S, 64), 64, 0, stream>>>(cnt, mask, A, S);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_reg_loss_forward_cuda(float *loss, const float *loc, const float *scale,
                              const int64_t *best, const float *gt, int64_t gt_stride,
                              const uint8_t *mask, const float *count, int64_t A, int64_t K,
                              int64_t S, float *scratch, cudaStream_t stream)
{
    QC_ASSERT(A >= 0 && K > 0 && S > 0 && gt_stride >= 2 && scratch,
              "reg_loss fwd cuda: A %lld K %lld S %lld", (long long)A, (long long)K, (long long)S);
    reg_loss_counts(scratch, count, mask, A, S, stream);
    reg_loss_forward_kernel<<<1, LOSS_BLOCK, 0, stream>>>(loss, loc, scale, best, gt, gt_stride,
                                                          mask, scratch, A, K, S);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void reg_loss_backward_kernel(float *dloc, float *dscale, const float *dloss,
                                                const float *loc, const float *scale,
                                                const int64_t *best, const float *gt,
                                                int64_t gt_stride, const uint8_t *mask,
                                                const float *cnt, int64_t A, int64_t K, int64_t S)
{
    float gmean = dloss[0] / (float)S;
    int64_t total = A * S;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t a = t / S, s = t % S;
        float g = (gmean / cnt[s]) * (float)mask[t];
        int64_t o = ((a * K + best[a]) * S + s) * 2;
        const float *gg = gt + t * gt_stride;
        for (int64_t d = 0; d < 2; d++) {
            float dm, ds;
            laplace_nll_grad_dev(g, loc[o + d], scale[o + d], gg[d], &dm, &ds);
            if (dloc)
                dloc[o + d] = dm;
            if (dscale)
                dscale[o + d] = ds;
        }
    }
}

void qc_reg_loss_backward_cuda(float *dloc, float *dscale, const float *dloss, const float *loc,
                               const float *scale, const int64_t *best, const float *gt,
                               int64_t gt_stride, const uint8_t *mask, const float *count,
                               int64_t A, int64_t K, int64_t S, float *scratch, cudaStream_t stream)
{
    QC_ASSERT(A >= 0 && K > 0 && S > 0 && gt_stride >= 2 && scratch,
              "reg_loss bwd cuda: A %lld K %lld S %lld", (long long)A, (long long)K, (long long)S);
    size_t bytes = (size_t)(A * K * S * 2) * sizeof(float);
    if (dloc && bytes)
        QC_CUDA_ASSERT(cudaMemsetAsync(dloc, 0, bytes, stream));
    if (dscale && bytes)
        QC_CUDA_ASSERT(cudaMemsetAsync(dscale, 0, bytes, stream));
    if (A == 0 || (!dloc && !dscale))
        return;
    reg_loss_counts(scratch, count, mask, A, S, stream);
    reg_loss_backward_kernel<<<cuda_blocks(A * S, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dloc, dscale, dloss, loc, scale, best, gt, gt_stride, mask, scratch, A, K, S);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- mixture NLL (classification)
// ----------------------------------------------------------------

/* t[k] = log_softmax(pi[a])_k − n[a,k] for one agent; returns lse = logsumexp_k t. */
__device__ static float mixture_terms_dev(float *t, float *logp, const float *pi, const float *loc,
                                          const float *scale, const float *gt, int64_t gt_stride,
                                          const uint8_t *reg_mask, int64_t a, int64_t K, int64_t S)
{
    log_softmax_row(logp, pi + a * K, K);
    float m = (float)reg_mask[a * S + S - 1];
    const float *g = gt + (a * S + S - 1) * gt_stride;
    for (int64_t k = 0; k < K; k++) {
        int64_t o = ((a * K + k) * S + S - 1) * 2;
        float nx = laplace_nll_dev(loc[o], scale[o], g[0]) * m;
        float ny = laplace_nll_dev(loc[o + 1], scale[o + 1], g[1]) * m;
        t[k] = logp[k] - (nx + ny);
    }
    return logsumexp_row(t, K);
}

/* count[0] when given, else max(1, Σ_a cls_mask[a]) as float, reduced over the block
 * (blockDim.x == LOSS_BLOCK): per thread counts, then thread 0 adds them; every thread gets the
 * value. */
__device__ static float cls_count_block(const uint8_t *cls_mask, const float *count, int64_t A)
{
    if (count)
        return count[0];
    __shared__ long long part[LOSS_BLOCK];
    __shared__ long long total;
    long long c = 0;
    for (int64_t a = threadIdx.x; a < A; a += blockDim.x)
        c += cls_mask[a] ? 1 : 0;
    part[threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long t = 0;
        for (int j = 0; j < LOSS_BLOCK; j++)
            t += part[j];
        total = t;
    }
    __syncthreads();
    long long n = total;
    return (float)(n > 1 ? n : 1);
}

static __global__ void mixture_nll_forward_kernel(float *loss, const float *pi, const float *loc,
                                                  const float *scale, const float *gt,
                                                  int64_t gt_stride, const uint8_t *reg_mask,
                                                  const uint8_t *cls_mask, const float *cnt,
                                                  int64_t A, int64_t K, int64_t S)
{
    __shared__ double term[LOSS_BLOCK];
    float count = cls_count_block(cls_mask, cnt, A);
    double sum = 0.0; /* meaningful in thread 0 */
    for (int64_t a0 = 0; a0 < A; a0 += LOSS_BLOCK) {
        int64_t a = a0 + threadIdx.x;
        if (a < A) {
            float t[QC_KERNELS_MAX_MODES], logp[QC_KERNELS_MAX_MODES];
            float lse =
                mixture_terms_dev(t, logp, pi, loc, scale, gt, gt_stride, reg_mask, a, K, S);
            term[threadIdx.x] = (double)(-lse * (float)cls_mask[a]);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t m = A - a0 < LOSS_BLOCK ? A - a0 : LOSS_BLOCK;
            for (int64_t j = 0; j < m; j++)
                sum += term[j];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *loss = (float)(sum / (double)count);
}

void qc_mixture_nll_forward_cuda(float *loss, const float *pi, const float *loc, const float *scale,
                                 const float *gt, int64_t gt_stride, const uint8_t *reg_mask,
                                 const uint8_t *cls_mask, const float *count, int64_t A, int64_t K,
                                 int64_t S, cudaStream_t stream)
{
    QC_ASSERT(A >= 0 && K > 0 && K <= QC_KERNELS_MAX_MODES && S > 0 && gt_stride >= 2,
              "mixture_nll fwd cuda: A %lld K %lld S %lld", (long long)A, (long long)K,
              (long long)S);
    mixture_nll_forward_kernel<<<1, LOSS_BLOCK, 0, stream>>>(loss, pi, loc, scale, gt, gt_stride,
                                                             reg_mask, cls_mask, count, A, K, S);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void mixture_nll_backward_kernel(float *dpi, const float *dloss, const float *pi,
                                                   const float *loc, const float *scale,
                                                   const float *gt, int64_t gt_stride,
                                                   const uint8_t *reg_mask, const uint8_t *cls_mask,
                                                   const float *count, int64_t A, int64_t K,
                                                   int64_t S)
{
    float gcls = dloss[0] / cls_count_block(cls_mask, count, A);
    for (int64_t a = threadIdx.x; a < A; a += blockDim.x) {
        float t[QC_KERNELS_MAX_MODES], logp[QC_KERNELS_MAX_MODES], dt[QC_KERNELS_MAX_MODES];
        float lse = mixture_terms_dev(t, logp, pi, loc, scale, gt, gt_stride, reg_mask, a, K, S);
        float dl = -(gcls * (float)cls_mask[a]); /* cls = −lse */
        for (int64_t k = 0; k < K; k++)
            dt[k] = dl * expf(t[k] - lse);
        /* t = logp − n with n constant: dlogp = dt */
        log_softmax_row_backward(dpi + a * K, dt, logp, K);
    }
}

void qc_mixture_nll_backward_cuda(float *dpi, const float *dloss, const float *pi, const float *loc,
                                  const float *scale, const float *gt, int64_t gt_stride,
                                  const uint8_t *reg_mask, const uint8_t *cls_mask,
                                  const float *count, int64_t A, int64_t K, int64_t S,
                                  cudaStream_t stream)
{
    QC_ASSERT(A >= 0 && K > 0 && K <= QC_KERNELS_MAX_MODES && S > 0 && gt_stride >= 2,
              "mixture_nll bwd cuda: A %lld K %lld S %lld", (long long)A, (long long)K,
              (long long)S);
    if (A == 0)
        return;
    /* one block: the class count must be known before any agent's gradient */
    mixture_nll_backward_kernel<<<1, LOSS_BLOCK, 0, stream>>>(
        dpi, dloss, pi, loc, scale, gt, gt_stride, reg_mask, cls_mask, count, A, K, S);
    QC_CUDA_LAUNCH_CHECK();
}
