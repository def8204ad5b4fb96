/*
 * loss.cu — row log_softmax / logsumexp, the Laplace NLL, best-mode selection, the regression
 * loss and the mixture-NLL classification loss: per row, agent or step the formulas of
 * loss_math.h, which the CPU ops (kernels/cpu/loss.c) run too (that header says where the bits
 * agree).
 *
 * Scalar losses are reduced in the CPU's order: one block computes per-index terms in parallel,
 * chunk by chunk, and thread 0 adds them in ascending index order into a double.
 */
#include "cuda_common.cuh"
#include "loss_math.h"

#define LOSS_BLOCK 256 /* threads of the single-block reduction kernels */

// ---- log_softmax / logsumexp
// ---------------------------------------------------------------------

static __global__ void log_softmax_forward_kernel(float *out, const float *inp, int64_t N,
                                                  int64_t K)
{
    for (int64_t n = cuda_tid(); n < N; n += cuda_nthreads())
        qc_log_softmax_row(out + n * K, inp + n * K, K);
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
        qc_log_softmax_row_backward(dinp + n * K, dout + n * K, out + n * K, K);
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
        out[n] = qc_logsumexp_row(inp + n * K, K);
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
        dinp[t] = qc_logsumexp_grad(dout[n], inp[t], out[n]);
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

static __global__ void laplace_nll_forward_kernel(float *nll, const float *mu, const float *scale,
                                                  const float *y, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        nll[i] = qc_laplace_nll(mu[i], scale[i], y[i]);
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
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        qc_laplace_nll_backward_at(dmu, dscale, dnll, mu, scale, y, i);
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
    for (int64_t a = cuda_tid(); a < A; a += cuda_nthreads())
        best[a] = qc_best_mode_agent(loc, gt, gt_stride, mask, a, K, S);
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
    for (int64_t s = cuda_tid(); s < S; s += cuda_nthreads())
        cnt[s] = qc_reg_loss_step_count(mask, A, S, s);
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
        if (s < S)
            term[threadIdx.x] =
                qc_reg_loss_step_term(loc, scale, best, gt, gt_stride, mask, cnt[s], A, K, S, s);
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
        qc_reg_loss_grad_at(dloc, dscale, gmean, cnt[s], loc, scale, best, gt, gt_stride, mask, a,
                            s, K, S);
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
        if (a < A)
            term[threadIdx.x] =
                qc_mixture_nll_agent(pi, loc, scale, gt, gt_stride, reg_mask, cls_mask, a, K, S);
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
    for (int64_t a = threadIdx.x; a < A; a += blockDim.x)
        qc_mixture_nll_grad_agent(dpi, gcls, pi, loc, scale, gt, gt_stride, reg_mask, cls_mask, a,
                                  K, S);
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
