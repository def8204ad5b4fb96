/*
 * loss_math.h — the loss formulas of QCNET.md §6.1 written once for both backends: row
 * log_softmax / logsumexp, the Laplace NLL with its invisible scale clamp, one agent's best
 * mode, one step's regression term and gradient, and one agent's mixture-NLL term and gradient.
 * kernels/cpu/loss.c and kernels/cuda/loss.cu run these; only the parallel loops around them
 * and the final reductions are each backend's own. C11 for the CPU, __host__ __device__ under
 * nvcc (QC_KERNELS_HD). Private to kernels/.
 *
 * CPU and CUDA results: the best mode's distance sum writes every operation explicitly rounded
 * (qc_f*_rn), so the argmin — a discrete choice — is the CPU's bit for bit. The other formulas
 * use plain operators: nvcc contracts a product that feeds an add into an FMA on the device
 * (exp(out)·s in the log_softmax backward, n_x + n_y of the mixture terms), and expf / logf
 * are CUDA's, so those results agree with the CPU within test_kernels_cuda's tolerances.
 */
#ifndef QC_KERNELS_LOSS_MATH_H
#define QC_KERNELS_LOSS_MATH_H

#include <math.h>
#include <stdint.h>

#include "qc_kernels.h" /* QC_KERNELS_HD, qc_f*_rn, QC_LAPLACE_SCALE_MIN, QC_KERNELS_MAX_MODES */

#ifdef __cplusplus
extern "C" {
#endif

// ---- rows ------------------------------------------------------------------------------------

QC_KERNELS_HD float qc_loss_row_max(const float *x, int64_t K)
{
    float m = x[0];
    for (int64_t k = 1; k < K; k++)
        m = x[k] > m ? x[k] : m;
    return m;
}

/* out[k] = x[k] − max − log Σ exp(x − max), over one row of K. */
QC_KERNELS_HD void qc_log_softmax_row(float *out, const float *x, int64_t K)
{
    float m = qc_loss_row_max(x, K);
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += expf(x[k] - m);
    float ls = logf(s);
    for (int64_t k = 0; k < K; k++)
        out[k] = x[k] - m - ls;
}

/* dinp[k] = dout[k] − exp(out[k])·Σ dout, from the forward's output. */
QC_KERNELS_HD void qc_log_softmax_row_backward(float *dinp, const float *dout, const float *out,
                                               int64_t K)
{
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += dout[k];
    for (int64_t k = 0; k < K; k++)
        dinp[k] = dout[k] - expf(out[k]) * s;
}

/* log Σ exp(x) over one row (a row of −inf gives −inf, not NaN). */
QC_KERNELS_HD float qc_logsumexp_row(const float *x, int64_t K)
{
    float m = qc_loss_row_max(x, K);
    if (isinf(m))
        m = 0.0f;
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++)
        s += expf(x[k] - m);
    return logf(s) + m;
}

/* d logsumexp / d x of one element: dout·exp(x − out). */
QC_KERNELS_HD float qc_logsumexp_grad(float dout, float x, float out)
{
    return dout * expf(x - out);
}

QC_KERNELS_HD void qc_logsumexp_row_backward(float *dinp, float dout, const float *x, float out,
                                             int64_t K)
{
    for (int64_t k = 0; k < K; k++)
        dinp[k] = qc_logsumexp_grad(dout, x[k], out);
}

// ---- Laplace NLL -----------------------------------------------------------------------------

QC_KERNELS_HD float qc_laplace_nll(float mu, float scale, float y)
{
    float sc = scale > QC_LAPLACE_SCALE_MIN ? scale : QC_LAPLACE_SCALE_MIN;
    return logf(2.0f * sc) + fabsf(y - mu) / sc;
}

/* Gradients of qc_laplace_nll at the clamped scale, passed straight through to the raw scale. */
QC_KERNELS_HD void qc_laplace_nll_grad(float g, float mu, float scale, float y, float *dmu,
                                       float *dscale)
{
    float sc = scale > QC_LAPLACE_SCALE_MIN ? scale : QC_LAPLACE_SCALE_MIN;
    float diff = y - mu;
    float sgn = diff > 0.0f ? 1.0f : (diff < 0.0f ? -1.0f : 0.0f);
    *dmu = -g * sgn / sc;
    *dscale = g * (1.0f / sc - fabsf(diff) / (sc * sc));
}

/* Element i of the Laplace NLL backward from dnll: dmu[i], dscale[i] OVERWRITE, each unless
 * its pointer is NULL. */
QC_KERNELS_HD void qc_laplace_nll_backward_at(float *dmu, float *dscale, const float *dnll,
                                              const float *mu, const float *scale, const float *y,
                                              int64_t i)
{
    float a, b;
    qc_laplace_nll_grad(dnll[i], mu[i], scale[i], y[i], &a, &b);
    if (dmu)
        dmu[i] = a;
    if (dscale)
        dscale[i] = b;
}

// ---- best mode -------------------------------------------------------------------------------

/* The mode k of agent a with the smallest masked sum of step distances to gt (ties: the first,
 * no valid step: 0). Every operation explicitly rounded: the device's argmin is the CPU's. */
QC_KERNELS_HD int64_t qc_best_mode_agent(const float *loc, const float *gt, int64_t gt_stride,
                                         const uint8_t *mask, int64_t a, int64_t K, int64_t S)
{
    int64_t kb = 0;
    float lb = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        float l = 0.0f;
        for (int64_t s = 0; s < S; s++) {
            const float *p = loc + ((a * K + k) * S + s) * 2;
            const float *g = gt + (a * S + s) * gt_stride;
            float dx = p[0] - g[0], dy = p[1] - g[1];
            float d2 = qc_fadd_rn(qc_fmul_rn(dx, dx), qc_fmul_rn(dy, dy));
            l = qc_fadd_rn(l, qc_fmul_rn(sqrtf(d2), (float)mask[a * S + s]));
        }
        if (k == 0 || l < lb) {
            lb = l;
            kb = k;
        }
    }
    return kb;
}

// ---- regression loss -------------------------------------------------------------------------

/* max(1, Σ_a mask[a,s]) as float: the denominator of step s. */
QC_KERNELS_HD float qc_reg_loss_step_count(const uint8_t *mask, int64_t A, int64_t S, int64_t s)
{
    int64_t c = 0;
    for (int64_t a = 0; a < A; a++)
        c += mask[a * S + s] ? 1 : 0;
    return (float)(c > 1 ? c : 1);
}

/* Step s's term of the regression loss: (Σ_a masked NLL of the best mode, ascending a, in
 * double) / cnt_s. */
QC_KERNELS_HD double qc_reg_loss_step_term(const float *loc, const float *scale,
                                           const int64_t *best, const float *gt, int64_t gt_stride,
                                           const uint8_t *mask, float cnt_s, int64_t A, int64_t K,
                                           int64_t S, int64_t s)
{
    double sum = 0.0;
    for (int64_t a = 0; a < A; a++) {
        const float *p = loc + ((a * K + best[a]) * S + s) * 2;
        const float *q = scale + ((a * K + best[a]) * S + s) * 2;
        const float *g = gt + (a * S + s) * gt_stride;
        float l = qc_laplace_nll(p[0], q[0], g[0]) + qc_laplace_nll(p[1], q[1], g[1]);
        sum += (double)(l * (float)mask[a * S + s]);
    }
    return sum / (double)cnt_s;
}

/* The gradients of agent a's best mode at step s (both coordinates): dloc, dscale (each may be
 * NULL) OVERWRITE at that mode; gmean = dloss / S, cnt_s the step's denominator. */
QC_KERNELS_HD void qc_reg_loss_grad_at(float *dloc, float *dscale, float gmean, float cnt_s,
                                       const float *loc, const float *scale, const int64_t *best,
                                       const float *gt, int64_t gt_stride, const uint8_t *mask,
                                       int64_t a, int64_t s, int64_t K, int64_t S)
{
    float g = (gmean / cnt_s) * (float)mask[a * S + s];
    int64_t o = ((a * K + best[a]) * S + s) * 2;
    const float *gg = gt + (a * S + s) * gt_stride;
    for (int64_t d = 0; d < 2; d++) {
        float dm, ds;
        qc_laplace_nll_grad(g, loc[o + d], scale[o + d], gg[d], &dm, &ds);
        if (dloc)
            dloc[o + d] = dm;
        if (dscale)
            dscale[o + d] = ds;
    }
}

// ---- mixture NLL (classification) ------------------------------------------------------------

/* t[k] = log_softmax(pi[a])_k − n[a,k] for one agent (n: the masked NLL of mode k's last step);
 * returns lse = logsumexp_k t. logp receives log_softmax(pi[a]). */
QC_KERNELS_HD float qc_mixture_terms(float *t, float *logp, const float *pi, const float *loc,
                                     const float *scale, const float *gt, int64_t gt_stride,
                                     const uint8_t *reg_mask, int64_t a, int64_t K, int64_t S)
{
    qc_log_softmax_row(logp, pi + a * K, K);
    float m = (float)reg_mask[a * S + S - 1];
    const float *g = gt + (a * S + S - 1) * gt_stride;
    for (int64_t k = 0; k < K; k++) {
        int64_t o = ((a * K + k) * S + S - 1) * 2;
        float nx = qc_laplace_nll(loc[o], scale[o], g[0]) * m;
        float ny = qc_laplace_nll(loc[o + 1], scale[o + 1], g[1]) * m;
        t[k] = logp[k] - (nx + ny);
    }
    return qc_logsumexp_row(t, K);
}

/* Agent a's term of the classification loss before the division by the count: −lse·cls_mask[a]
 * in double. K <= QC_KERNELS_MAX_MODES. */
QC_KERNELS_HD double qc_mixture_nll_agent(const float *pi, const float *loc, const float *scale,
                                          const float *gt, int64_t gt_stride,
                                          const uint8_t *reg_mask, const uint8_t *cls_mask,
                                          int64_t a, int64_t K, int64_t S)
{
    float t[QC_KERNELS_MAX_MODES], logp[QC_KERNELS_MAX_MODES];
    if (K < 1) /* never (the launchers assert K >= 1); tells the compiler t[0] is written */
        return 0.0;
    float lse = qc_mixture_terms(t, logp, pi, loc, scale, gt, gt_stride, reg_mask, a, K, S);
    return (double)(-lse * (float)cls_mask[a]);
}

/* dpi[a,:] OVERWRITE: the gradient of agent a's term, gcls = dloss / count. */
QC_KERNELS_HD void qc_mixture_nll_grad_agent(float *dpi, float gcls, const float *pi,
                                             const float *loc, const float *scale, const float *gt,
                                             int64_t gt_stride, const uint8_t *reg_mask,
                                             const uint8_t *cls_mask, int64_t a, int64_t K,
                                             int64_t S)
{
    float t[QC_KERNELS_MAX_MODES], logp[QC_KERNELS_MAX_MODES], dt[QC_KERNELS_MAX_MODES];
    float lse = qc_mixture_terms(t, logp, pi, loc, scale, gt, gt_stride, reg_mask, a, K, S);
    float dlse = -(gcls * (float)cls_mask[a]); /* cls = −lse */
    qc_logsumexp_row_backward(dt, dlse, t, lse, K);
    /* t = logp − n with n constant: dlogp = dt */
    qc_log_softmax_row_backward(dpi + a * K, dt, logp, K);
}

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_LOSS_MATH_H */
