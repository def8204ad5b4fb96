/*
 * loss.c — the loss pieces of QCNET.md §6.1: row log_softmax / logsumexp, the Laplace NLL with
 * its invisible scale clamp, best-mode selection, the per-step-normalised regression loss and
 * the mixture-NLL classification loss. Scalar reductions run in ascending index order with
 * double accumulators (deterministic; a more accurate oracle than fp32 sums).
 */
#include "qc_kernels.h"

#include <math.h>
#include <string.h>

#include "qc_status.h"

/* ---- log_softmax / logsumexp ------------------------------------------------------------- */

static float row_max(const float *x, int64_t K)
{
    float m = x[0];
    for (int64_t k = 1; k < K; k++)
        m = x[k] > m ? x[k] : m;
    return m;
}

/* Row helpers (also used inside the per-agent loss loops, so no nested OpenMP regions). */
static void log_softmax_row(float *out, const float *x, int64_t K)
{
    float m = row_max(x, K);
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += expf(x[k] - m);
    float ls = logf(s);
    for (int64_t k = 0; k < K; k++)
        out[k] = x[k] - m - ls;
}

static void log_softmax_row_backward(float *dinp, const float *dout, const float *out, int64_t K)
{
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += dout[k];
    for (int64_t k = 0; k < K; k++)
        dinp[k] = dout[k] - expf(out[k]) * s;
}

static float logsumexp_row(const float *x, int64_t K)
{
    float m = row_max(x, K);
    if (isinf(m))
        m = 0.0f;
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += expf(x[k] - m);
    return logf(s) + m;
}

static void logsumexp_row_backward(float *dinp, float dout, const float *x, float out, int64_t K)
{
    for (int64_t k = 0; k < K; k++)
        dinp[k] = dout * expf(x[k] - out);
}

void qc_log_softmax_forward_cpu(float *out, const float *inp, int64_t N, int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "log_softmax fwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        log_softmax_row(out + n * K, inp + n * K, K);
}

void qc_log_softmax_backward_cpu(float *dinp, const float *dout, const float *out, int64_t N,
                                 int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "log_softmax bwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        log_softmax_row_backward(dinp + n * K, dout + n * K, out + n * K, K);
}

void qc_logsumexp_forward_cpu(float *out, const float *inp, int64_t N, int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "logsumexp fwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        out[n] = logsumexp_row(inp + n * K, K);
}

void qc_logsumexp_backward_cpu(float *dinp, const float *dout, const float *inp, const float *out,
                               int64_t N, int64_t K)
{
    QC_ASSERT(N >= 0 && K > 0, "logsumexp bwd: N %lld K %lld", (long long)N, (long long)K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        logsumexp_row_backward(dinp + n * K, dout[n], inp + n * K, out[n], K);
}

/* ---- Laplace NLL ------------------------------------------------------------------------- */

static inline float laplace_nll(float mu, float scale, float y)
{
    float sc = scale > QC_LAPLACE_SCALE_MIN ? scale : QC_LAPLACE_SCALE_MIN;
    return logf(2.0f * sc) + fabsf(y - mu) / sc;
}

/* Gradients of laplace_nll at the clamped scale, passed straight through to the raw scale. */
static inline void laplace_nll_grad(float g, float mu, float scale, float y, float *dmu,
                                    float *dscale)
{
    float sc = scale > QC_LAPLACE_SCALE_MIN ? scale : QC_LAPLACE_SCALE_MIN;
    float diff = y - mu;
    float sgn = diff > 0.0f ? 1.0f : (diff < 0.0f ? -1.0f : 0.0f);
    *dmu = -g * sgn / sc;
    *dscale = g * (1.0f / sc - fabsf(diff) / (sc * sc));
}

void qc_laplace_nll_forward_cpu(float *nll, const float *mu, const float *scale, const float *y,
                                int64_t n)
{
    QC_ASSERT(n >= 0, "laplace_nll fwd: n %lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        nll[i] = laplace_nll(mu[i], scale[i], y[i]);
}

void qc_laplace_nll_backward_cpu(float *dmu, float *dscale, const float *dnll, const float *mu,
                                 const float *scale, const float *y, int64_t n)
{
    QC_ASSERT(n >= 0, "laplace_nll bwd: n %lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float a, b;
        laplace_nll_grad(dnll[i], mu[i], scale[i], y[i], &a, &b);
        if (dmu)
            dmu[i] = a;
        if (dscale)
            dscale[i] = b;
    }
}

/* ---- best mode --------------------------------------------------------------------------- */

void qc_best_mode_cpu(int64_t *best, const float *loc, const float *gt, int64_t gt_stride,
                      const uint8_t *mask, int64_t A, int64_t K, int64_t S)
{
    QC_ASSERT(A >= 0 && K > 0 && S >= 0 && gt_stride >= 2, "best_mode: A %lld K %lld S %lld",
              (long long)A, (long long)K, (long long)S);
#pragma omp parallel for schedule(static)
    for (int64_t a = 0; a < A; a++) {
        int64_t kb = 0;
        float lb = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float l = 0.0f;
            for (int64_t s = 0; s < S; s++) {
                const float *p = loc + ((a * K + k) * S + s) * 2;
                const float *g = gt + (a * S + s) * gt_stride;
                float dx = p[0] - g[0], dy = p[1] - g[1];
                l += sqrtf(dx * dx + dy * dy) * (float)mask[a * S + s];
            }
            if (k == 0 || l < lb) {
                lb = l;
                kb = k;
            }
        }
        best[a] = kb;
    }
}

/* ---- regression loss --------------------------------------------------------------------- */

int64_t qc_reg_loss_scratch_numel(int64_t A, int64_t S)
{
    (void)A;
    return S;
}

/* scratch[s] = max(1, Σ_a mask[a,s]) as float. */
static void step_counts(float *cnt, const uint8_t *mask, int64_t A, int64_t S)
{
    for (int64_t s = 0; s < S; s++) {
        int64_t c = 0;
        for (int64_t a = 0; a < A; a++)
            c += mask[a * S + s] ? 1 : 0;
        cnt[s] = (float)(c > 1 ? c : 1);
    }
}

/* The per-step denominators into cnt: count when given, else from the mask. */
static void step_norm(float *cnt, const float *count, const uint8_t *mask, int64_t A, int64_t S)
{
    if (count)
        memcpy(cnt, count, (size_t)S * sizeof *cnt);
    else
        step_counts(cnt, mask, A, S);
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
    for (int64_t s = 0; s < S; s++) {
        double sum = 0.0;
        for (int64_t a = 0; a < A; a++) {
            const float *p = loc + ((a * K + best[a]) * S + s) * 2;
            const float *q = scale + ((a * K + best[a]) * S + s) * 2;
            const float *g = gt + (a * S + s) * gt_stride;
            float l = laplace_nll(p[0], q[0], g[0]) + laplace_nll(p[1], q[1], g[1]);
            sum += (double)(l * (float)mask[a * S + s]);
        }
        total += sum / (double)cnt[s];
    }
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
    for (int64_t a = 0; a < A; a++) {
        for (int64_t s = 0; s < S; s++) {
            float g = (gmean / cnt[s]) * (float)mask[a * S + s];
            int64_t o = ((a * K + best[a]) * S + s) * 2;
            const float *gg = gt + (a * S + s) * gt_stride;
            for (int64_t d = 0; d < 2; d++) {
                float dm, ds;
                laplace_nll_grad(g, loc[o + d], scale[o + d], gg[d], &dm, &ds);
                if (dloc)
                    dloc[o + d] = dm;
                if (dscale)
                    dscale[o + d] = ds;
            }
        }
    }
}

/* ---- mixture NLL (classification) -------------------------------------------------------- */

/* t[k] = log_softmax(pi[a])_k − n[a,k] for one agent; returns lse = logsumexp_k t. */
static float mixture_terms(float *t, float *logp, const float *pi, const float *loc,
                           const float *scale, const float *gt, int64_t gt_stride,
                           const uint8_t *reg_mask, int64_t a, int64_t K, int64_t S)
{
    log_softmax_row(logp, pi + a * K, K);
    float m = (float)reg_mask[a * S + S - 1];
    const float *g = gt + (a * S + S - 1) * gt_stride;
    for (int64_t k = 0; k < K; k++) {
        int64_t o = ((a * K + k) * S + S - 1) * 2;
        float nx = laplace_nll(loc[o], scale[o], g[0]) * m;
        float ny = laplace_nll(loc[o + 1], scale[o + 1], g[1]) * m;
        t[k] = logp[k] - (nx + ny);
    }
    return logsumexp_row(t, K);
}

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
    for (int64_t a = 0; a < A; a++) {
        float t[QC_KERNELS_MAX_MODES], logp[QC_KERNELS_MAX_MODES];
        float lse = mixture_terms(t, logp, pi, loc, scale, gt, gt_stride, reg_mask, a, K, S);
        sum += (double)(-lse * (float)cls_mask[a]);
    }
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
    for (int64_t a = 0; a < A; a++) {
        float t[QC_KERNELS_MAX_MODES], logp[QC_KERNELS_MAX_MODES], dt[QC_KERNELS_MAX_MODES];
        float lse = mixture_terms(t, logp, pi, loc, scale, gt, gt_stride, reg_mask, a, K, S);
        float dlse = -(gcls * (float)cls_mask[a]); /* cls = −lse */
        logsumexp_row_backward(dt, dlse, t, lse, K);
        /* t = logp − n with n constant: dlogp = dt */
        log_softmax_row_backward(dpi + a * K, dt, logp, K);
    }
}
