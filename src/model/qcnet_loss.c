/*
 * qcnet_loss.c — QCNet's training loss (QCNET.md §6.1) and validation metrics (§6.2).
 *
 * Loss: best mode k* on the proposal (summed masked L2), Laplace regression losses of the
 * proposal and the refinement at k* (per-step mean over valid agents, then the mean over the
 * 60 steps), and the mixture NLL of the refined endpoint through pi only (the trajectory is
 * detached). Metrics: focal agents (category 3) with a valid future step; the mode is chosen by
 * FDE at the last valid step.
 *
 * Backend (qc_qcnet_create_on): the loss runs as ops on m->ex. The targets (when the batch has
 * none) and the masks are computed on the host from the HOST batch and uploaded; the best mode
 * stays in device memory; the four loss values are computed into device scalars and come back
 * in one download (one synchronization per qc_qcnet_loss). The metrics download the refined
 * locations, the logits and (when the host batch has none) the targets, then run on the host.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_qcnet.h"
#include "qcnet_internal.h"

enum qc_status qcnet_targets(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    if (t->target)
        return QC_OK;
    const struct qc_batch *b = t->batch;
    if (b->target) {
        t->target = qcnet_op_batch(m)->target;
        return QC_OK;
    }
    /* TargetBuilder on the host batch, uploaded */
    const size_t bytes = (size_t)(t->A * QCNET_S * 4) * sizeof(float);
    void *host = NULL, *p = NULL;
    QC_TRY(qcnet_input_begin(m, bytes, "loss/target", &host));
    if (host)
        qc_batch_target(b, 0, t->A, host);
    QC_TRY(qcnet_input_end(m, host, bytes, "loss/target", false, &p));
    t->target_own = p;
    t->target = t->target_own;
    return QC_OK;
}

void qc_qcnet_loss_norm(const struct qc_batch *b, float *norm)
{
    const int64_t A = b->num_agents, S = QCNET_S;
    _Static_assert(QC_QCNET_LOSS_NORM == QCNET_S + 1, "loss norm layout");
    int64_t cls = 0;
    for (int64_t s = 0; s < S; s++) {
        int64_t c = 0;
        for (int64_t a = 0; a < A; a++)
            c += b->predict_mask[a * QCNET_STEPS + QCNET_T + s] ? 1 : 0;
        norm[s] = (float)(c > 1 ? c : 1);
    }
    for (int64_t a = 0; a < A; a++)
        cls += b->predict_mask[a * QCNET_STEPS + QCNET_STEPS - 1] ? 1 : 0;
    norm[S] = (float)(cls > 1 ? cls : 1);
}

/* The denominators of a larger group this batch is a part of (ctx.loss_norm), uploaded once. */
static enum qc_status loss_norm(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    if (!t->loss_norm_host || t->loss_norm)
        return QC_OK;
    void *p = NULL;
    QC_TRY(qcnet_upload(m, t->loss_norm_host, (QCNET_S + 1) * sizeof(float), "loss/norm", &p));
    t->loss_norm = p;
    return QC_OK;
}

static enum qc_status loss_masks(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    QC_TRY(loss_norm(m));
    if (t->reg_mask)
        return QC_OK;
    const int64_t A = t->A, S = QCNET_S;
    /* reg (A, S) and cls (A), from the host batch's predict_mask */
    void *reg_h = NULL, *cls_h = NULL, *p = NULL;
    QC_TRY(qcnet_input_begin(m, (size_t)(A * S), "loss/reg_mask", &reg_h));
    enum qc_status st = qcnet_input_begin(m, (size_t)A, "loss/cls_mask", &cls_h);
    if (st != QC_OK) {
        qcnet_input_drop(m, reg_h);
        return st;
    }
    uint8_t *reg = reg_h, *cls = cls_h;
    const uint8_t *pm = t->batch->predict_mask;
    for (int64_t a = 0; reg && a < A; a++) {
        for (int64_t s = 0; s < S; s++)
            reg[a * S + s] = pm[a * QCNET_STEPS + QCNET_T + s] ? 1 : 0;
        cls[a] = pm[a * QCNET_STEPS + QCNET_STEPS - 1] ? 1 : 0;
    }
    st = qcnet_input_end(m, reg_h, (size_t)(A * S), "loss/reg_mask", false, &p);
    if (st != QC_OK) {
        qcnet_input_drop(m, cls_h);
        return st;
    }
    t->reg_mask = p;
    st = qcnet_input_end(m, cls_h, (size_t)A, "loss/cls_mask", false, &p);
    if (st == QC_OK)
        t->cls_mask = p;
    else
        t->reg_mask = NULL; /* made again by the next call (the buffer is released with the tape) */
    return st;
}

enum qc_status qc_qcnet_loss(struct qc_qcnet *m, struct qc_qcnet_loss *out)
{
    struct qcnet_tape *t = &m->tape;
    if (!t->active)
        return qc_errorf(QC_ERR_INVALID, "model loss: no forward");
    const int64_t A = t->A, K = t->K, S = QCNET_S;
    QC_TRY(qcnet_targets(m));
    QC_TRY(loss_masks(m));
    if (!t->best_mode)
        QC_TRY(qcnet_ialloc(m, A, "loss/best_mode", &t->best_mode));
    qc_op_best_mode(m->ex, t->best_mode, t->loc_propose, t->target, 4, t->reg_mask, A, K, S);
    /* v = [loss, reg_loss_propose, reg_loss_refine, cls_loss] (device scalars) */
    float *v, *scratch;
    QC_TRY(qcnet_falloc(m, 4, "loss/values", &v));
    QC_TRY(qcnet_falloc(m, qc_reg_loss_scratch_numel(A, S), "scratch/reg_loss", &scratch));
    const float *norm = t->loss_norm, *ncls = norm ? norm + S : NULL;
    qc_op_reg_loss_forward(m->ex, v + 1, t->loc_propose, t->scale_propose, t->best_mode, t->target,
                           4, t->reg_mask, norm, A, K, S, scratch);
    qc_op_reg_loss_forward(m->ex, v + 2, t->loc_refine, t->scale_refine, t->best_mode, t->target, 4,
                           t->reg_mask, norm, A, K, S, scratch);
    qcnet_free(m, scratch);
    qc_op_mixture_nll_forward(m->ex, v + 3, t->pi, t->loc_refine, t->scale_refine, t->target, 4,
                              t->reg_mask, t->cls_mask, ncls, A, K, S);
    qc_op_add_forward(m->ex, v, v + 1, v + 2, 1); /* (propose + refine) + cls, as PyTorch */
    qc_op_add_forward(m->ex, v, v, v + 3, 1);
    float hv[4];
    enum qc_status st = qcnet_download(m, hv, v, sizeof hv);
    qcnet_free(m, v);
    QC_TRY(st);
    struct qc_qcnet_loss *l = &t->loss;
    memset(l, 0, sizeof *l);
    l->loss = hv[0];
    l->reg_loss_propose = hv[1];
    l->reg_loss_refine = hv[2];
    l->cls_loss = hv[3];
    l->best_mode = t->best_mode;
    l->num_agents = A;
    t->has_loss = true;
    if (out)
        *out = *l;
    return QC_OK;
}

enum qc_status qcnet_loss_backward(struct qc_qcnet *m, float dloss_scale, float *dloc_p,
                                   float *dscale_p, float *dloc_r, float *dscale_r, float *dpi)
{
    struct qcnet_tape *t = &m->tape;
    const int64_t A = t->A, K = t->K, S = QCNET_S;
    /* the upstream gradient of the scalar loss, a device scalar */
    const float hdl = dloss_scale;
    void *p = NULL;
    QC_TRY(qcnet_upload(m, &hdl, sizeof hdl, "loss/dloss", &p));
    const float *dl = p;
    float *scratch;
    QC_TRY(qcnet_falloc(m, qc_reg_loss_scratch_numel(A, S), "scratch/reg_loss", &scratch));
    const float *norm = t->loss_norm, *ncls = norm ? norm + S : NULL;
    qc_op_reg_loss_backward(m->ex, dloc_p, dscale_p, dl, t->loc_propose, t->scale_propose,
                            t->best_mode, t->target, 4, t->reg_mask, norm, A, K, S, scratch);
    qc_op_reg_loss_backward(m->ex, dloc_r, dscale_r, dl, t->loc_refine, t->scale_refine,
                            t->best_mode, t->target, 4, t->reg_mask, norm, A, K, S, scratch);
    qcnet_free(m, scratch);
    qc_op_mixture_nll_backward(m->ex, dpi, dl, t->pi, t->loc_refine, t->scale_refine, t->target, 4,
                               t->reg_mask, t->cls_mask, ncls, A, K, S);
    qcnet_free(m, p);
    return QC_OK;
}

// ---- metrics --------------------------------------------------------------------------------

void qc_qcnet_metrics_reset(struct qc_qcnet_metrics *mt)
{
    memset(mt, 0, sizeof *mt);
}

/* QCNet's wrap_angle: into [−π, π) with a floor modulo (Python's %). */
static double wrap_angle(double a)
{
    const double pi = 3.14159265358979323846, two_pi = 2.0 * pi;
    double r = fmod(a + pi, two_pi);
    if (r < 0)
        r += two_pi;
    return r - pi;
}

/* Heading of step s of one mode's trajectory p (S,2): the direction of its motion from step
 * s − 1 (the origin for s = 0). The displacement is formed in fp32 as PyTorch does. */
static double step_heading(const float *p, int64_t s)
{
    const float dx = s ? p[s * 2] - p[(s - 1) * 2] : p[0];
    const float dy = s ? p[s * 2 + 1] - p[(s - 1) * 2 + 1] : p[1];
    return atan2((double)dy, (double)dx);
}

void qc_qcnet_metrics_update(struct qc_qcnet_metrics *mt, const float *loc, const float *pi,
                             const float *target, const uint8_t *predict_mask,
                             const uint8_t *category, int64_t A, int64_t K, int64_t T, int64_t S)
{
    for (int64_t a = 0; a < A; a++) {
        if (category[a] != 3)
            continue;
        const uint8_t *valid = predict_mask + a * (T + S) + T;
        int64_t last = -1, nvalid = 0;
        for (int64_t s = 0; s < S; s++)
            if (valid[s]) {
                last = s;
                nvalid++;
            }
        if (last < 0)
            continue;
        const float *g = target + a * S * 4;
        int64_t kbest = 0;
        double fbest = (double)INFINITY;
        for (int64_t k = 0; k < K; k++) {
            const float *p = loc + ((a * K + k) * S + last) * 2;
            double dx = (double)p[0] - (double)g[last * 4];
            double dy = (double)p[1] - (double)g[last * 4 + 1];
            double f = sqrt(dx * dx + dy * dy);
            if (f < fbest) {
                fbest = f;
                kbest = k;
            }
        }
        double ade = 0.0, ahe = 0.0;
        const float *best = loc + (a * K + kbest) * S * 2;
        for (int64_t s = 0; s < S; s++) {
            if (!valid[s])
                continue;
            const float *p = best + s * 2;
            double dx = (double)p[0] - (double)g[s * 4];
            double dy = (double)p[1] - (double)g[s * 4 + 1];
            ade += sqrt(dx * dx + dy * dy);
            ahe += fabs(wrap_angle(step_heading(best, s) - (double)g[s * 4 + 3]));
        }
        const double fhe = fabs(wrap_angle(step_heading(best, last) - (double)g[last * 4 + 3]));
        double mx = -(double)INFINITY, sum = 0.0;
        for (int64_t k = 0; k < K; k++)
            mx = fmax(mx, (double)pi[a * K + k]);
        for (int64_t k = 0; k < K; k++)
            sum += exp((double)pi[a * K + k] - mx);
        double prob = exp((double)pi[a * K + kbest] - mx) / sum;
        mt->sum_min_ade += ade / (double)nvalid;
        mt->sum_min_fde += fbest;
        mt->sum_miss += fbest > 2.0 ? 1.0 : 0.0;
        mt->sum_brier += (1.0 - prob) * (1.0 - prob);
        mt->sum_ahe += ahe / (double)nvalid;
        mt->sum_fhe += fhe;
        mt->count++;
    }
}

enum qc_status qc_qcnet_metrics_update_model(struct qc_qcnet_metrics *mt, struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    if (!t->active)
        return qc_errorf(QC_ERR_INVALID, "model metrics: no forward");
    QC_TRY(qcnet_targets(m));
    /* host copies of what the host code reads (the targets: the host batch's when it has them) */
    const int64_t A = t->A, K = t->K, S = QCNET_S;
    const size_t loc_bytes = (size_t)(A * K * S * 2) * sizeof(float);
    const size_t pi_bytes = (size_t)(A * K) * sizeof(float);
    const size_t tgt_bytes = t->batch->target ? 0 : (size_t)(A * S * 4) * sizeof(float);
    float *h = malloc(loc_bytes + pi_bytes + tgt_bytes);
    if (!h)
        return qc_errorf(QC_ERR_NOMEM, "model metrics: host buffer of %zu bytes",
                         loc_bytes + pi_bytes + tgt_bytes);
    float *loc = h, *pi = h + A * K * S * 2, *tgt = pi + A * K;
    enum qc_status st = qcnet_download(m, loc, t->loc_refine, loc_bytes);
    if (st == QC_OK)
        st = qcnet_download(m, pi, t->pi, pi_bytes);
    if (st == QC_OK && tgt_bytes)
        st = qcnet_download(m, tgt, t->target, tgt_bytes);
    if (st == QC_OK)
        qc_qcnet_metrics_update(mt, loc, pi, tgt_bytes ? tgt : t->batch->target,
                                t->batch->predict_mask, t->batch->agent_category, A, K, QCNET_T, S);
    free(h);
    return st;
}

void qc_qcnet_metrics_merge(struct qc_qcnet_metrics *dst, const struct qc_qcnet_metrics *src)
{
    dst->sum_min_ade += src->sum_min_ade;
    dst->sum_min_fde += src->sum_min_fde;
    dst->sum_miss += src->sum_miss;
    dst->sum_brier += src->sum_brier;
    dst->sum_ahe += src->sum_ahe;
    dst->sum_fhe += src->sum_fhe;
    dst->count += src->count;
}

void qc_qcnet_metrics_compute(const struct qc_qcnet_metrics *mt, struct qc_qcnet_metric_values *v)
{
    memset(v, 0, sizeof *v);
    v->count = mt->count;
    if (mt->count == 0)
        return;
    const double n = (double)mt->count;
    v->min_ade = mt->sum_min_ade / n;
    v->min_fde = mt->sum_min_fde / n;
    v->miss_rate = mt->sum_miss / n;
    v->brier = mt->sum_brier / n;
    v->brier_min_fde = v->min_fde + v->brier;
    v->min_ahe = mt->sum_ahe / n;
    v->min_fhe = mt->sum_fhe / n;
}
