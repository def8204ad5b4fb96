/*
 * loss.c — the loss pieces of QCNET.md §6.1: row log_softmax / logsumexp, the Laplace NLL with
 * its invisible scale clamp, best-mode selection, the per-step-normalised regression loss and
 * the mixture-NLL classification loss, by the formulas of loss_math.h (shared with the CUDA
 * kernels). Scalar reductions run in ascending index order with double accumulators
 * (deterministic; a more accurate oracle than fp32 sums).
 */
#include "qc_kernels.h"

#include <string.h>

#include "loss_math.h"
#include "qc_status.h"

/* ---- log_softmax / logsumexp ------------------------------------------------------------- */
/* (the row helpers of loss_math.h also run inside the per-agent loss loops: no nested OpenMP) */

void qc_log_softmax_forward_cpu(float *out, const float *inp, int64_t N, int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "log_softmax fwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        qc_log_softmax_row(out + n * K, inp + n * K, K);
}

void qc_log_softmax_backward_cpu(float *dinp, const float *dout, const float *out, int64_t N,
                                 int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "log_softmax bwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        qc_log_softmax_row_backward(dinp + n * K, dout + n * K, out + n * K, K);
}

void qc_logsumexp_forward_cpu(float *out, const float *inp, int64_t N, int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "logsumexp fwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        out[n] = qc_logsumexp_row(inp + n * K, K);
}

void qc_logsumexp_backward_cpu(float *dinp, const float *dout, const float *inp, const float *out,
                               int64_t N, int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "logsumexp bwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        qc_logsumexp_row_backward(dinp + n * K, dout[n], inp + n * K, out[n], K);
}

/* ---- Laplace NLL ------------------------------------------------------------------------- */

void qc_laplace_nll_forward_cpu(float *nll, const float *mu, const float *scale, const float *y,
                                int64_t n)
{
    QC_ASSERT(n >= 0, "laplace_nll fwd: n %lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        nll[i] = qc_laplace_nll(mu[i], scale[i], y[i]);
}

void qc_laplace_nll_backward_cpu(float *dmu, float *dscale, const float *dnll, const float *mu,
                                 const float *scale, const float *y, int64_t n)
{
    QC_ASSERT(n >= 0, "laplace_nll bwd: n %lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        qc_laplace_nll_backward_at(dmu, dscale, dnll, mu, scale, y, i);
}

/* ---- best mode --------------------------------------------------------------------------- */

void qc_best_mode_cpu(int64_t *best, const float *loc, const float *gt, int64_t gt_stride,
                      const uint8_t *mask, int64_t A, int64_t K, int64_t S)
{
    QC_ASSERT(A >= 0 && K > 0 && S >= 0 && gt_stride >= 2, "best_mode: A %lld K %lld S %lld",
              (long long)A, (long long)K, (long long)S);
#pragma omp parallel for schedule(static)
    for (int64_t a = 0; a < A; a++)
        best[a] = qc_best_mode_agent(loc, gt, gt_stride, mask, a, K, S);
}

/* ---- regression loss --------------------------------------------------------------------- */

int64_t qc_reg_loss_scratch_numel(int64_t A, int64_t S)
{
    (void)A;
    return S;
}

/* The per-step denominators into cnt: count when given, else from the mask. */
static void step_norm(float *cnt, const float *count, const uint8_t *mask, int64_t A, int64_t S)
{
    if (count)
        memcpy(cnt, count, (size_t)S * sizeof *cnt);
    else
        for (int64_t s = 0; s < S; s++)
            cnt[s] = qc_reg_loss_step_count(mask, A, S, s);
}

void qc_reg_loss_forward_cpu(float *loss, const float *loc, const float *scale, const int64_t *best,
                             const float *gt, int64_t gt_stride, const uint8_t *mask,
                             const float *count, int64_t A, int64_t K, int64_t S, float *scratch)
{
    QC_ASSERT(A >= 0 && K > 0 && S > 0 && gt_stride >= 2 && scratch,
              "reg_loss fwd: A %lld K %lld S %lld", (long long)A, (long long)K, (long long)S);
    float *cnt = scratch;
    step_norm(cnt, count, mask, A, S);
    double total = 0.0;
    for (int64_t s = 0; s < S; s++)
        total += qc_reg_loss_step_term(loc, scale, best, gt, gt_stride, mask, cnt[s], A, K, S, s);
    *loss = (float)(total / (double)S);
}

void qc_reg_loss_backward_cpu(float *dloc, float *dscale, const float *dloss, const float *loc,
                              const float *scale, const int64_t *best, const float *gt,
                              int64_t gt_stride, const uint8_t *mask, const float *count, int64_t A,
                              int64_t K, int64_t S, float *scratch)
{
    QC_ASSERT(A >= 0 && K > 0 && S > 0 && gt_stride >= 2 && scratch,
              "reg_loss bwd: A %lld K %lld S %lld", (long long)A, (long long)K, (long long)S);
    float *cnt = scratch;
    step_norm(cnt, count, mask, A, S);
    float gmean = dloss[0] / (float)S;
    int64_t total = A * K * S * 2;
    if (dloc)
        memset(dloc, 0, (size_t)total * sizeof(float));
    if (dscale)
        memset(dscale, 0, (size_t)total * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t a = 0; a < A; a++)
        for (int64_t s = 0; s < S; s++)
            qc_reg_loss_grad_at(dloc, dscale, gmean, cnt[s], loc, scale, best, gt, gt_stride, mask,
                                a, s, K, S);
}

/* ---- mixture NLL (classification) -------------------------------------------------------- */

static float cls_count(const uint8_t *cls_mask, int64_t A)
{
    int64_t c = 0;
    for (int64_t a = 0; a < A; a++)
        c += cls_mask[a] ? 1 : 0;
    return (float)(c > 1 ? c : 1);
}

void qc_mixture_nll_forward_cpu(float *loss, const float *pi, const float *loc, const float *scale,
                                const float *gt, int64_t gt_stride, const uint8_t *reg_mask,
                                const uint8_t *cls_mask, const float *count, int64_t A, int64_t K,
                                int64_t S)
{
    QC_ASSERT(A >= 0 && K > 0 && K <= QC_KERNELS_MAX_MODES && S > 0 && gt_stride >= 2,
              "mixture_nll fwd: A %lld K %lld S %lld", (long long)A, (long long)K, (long long)S);
    double sum = 0.0;
    for (int64_t a = 0; a < A; a++)
        sum += qc_mixture_nll_agent(pi, loc, scale, gt, gt_stride, reg_mask, cls_mask, a, K, S);
    *loss = (float)(sum / (double)(count ? count[0] : cls_count(cls_mask, A)));
}

void qc_mixture_nll_backward_cpu(float *dpi, const float *dloss, const float *pi, const float *loc,
                                 const float *scale, const float *gt, int64_t gt_stride,
                                 const uint8_t *reg_mask, const uint8_t *cls_mask,
                                 const float *count, int64_t A, int64_t K, int64_t S)
{
    QC_ASSERT(A >= 0 && K > 0 && K <= QC_KERNELS_MAX_MODES && S > 0 && gt_stride >= 2,
              "mixture_nll bwd: A %lld K %lld S %lld", (long long)A, (long long)K, (long long)S);
    float gcls = dloss[0] / (count ? count[0] : cls_count(cls_mask, A));
#pragma omp parallel for schedule(static)
    for (int64_t a = 0; a < A; a++)
        qc_mixture_nll_grad_agent(dpi, gcls, pi, loc, scale, gt, gt_stride, reg_mask, cls_mask, a,
                                  K, S);
}
