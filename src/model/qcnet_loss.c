/*
 * qcnet_loss.c — QCNet's training loss (QCNET.md §6.1) and validation metrics (§6.2).
 *
 * Loss: best mode k* on the proposal (summed masked L2), Laplace regression losses of the
 * proposal and the refinement at k* (per-step mean over valid agents, then the mean over the
 * 60 steps), and the mixture NLL of the refined endpoint through pi only (the trajectory is
 * detached). Metrics: focal agents (category 3) with a valid future step; the mode is chosen by
 * FDE at the last valid step.
 */
#include <math.h>
#include <string.h>

#include "qc_batch.h"
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
        t->target = b->target;
        return QC_OK;
    }
    QC_TRY(qcnet_falloc(m, t->A * QCNET_S * 4, "loss/target", &t->target_own));
    qc_batch_target(b, 0, t->A, t->target_own);
    t->target = t->target_own;
    return QC_OK;
}

static enum qc_status loss_masks(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    if (t->reg_mask)
        return QC_OK;
    const int64_t A = t->A, S = QCNET_S;
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, (size_t)(A * S), "loss/reg_mask", &p));
    t->reg_mask = p;
    QC_TRY(qcnet_balloc(m, (size_t)A, "loss/cls_mask", &p));
    t->cls_mask = p;
    const uint8_t *pm = t->batch->predict_mask;
    for (int64_t a = 0; a < A; a++) {
        for (int64_t s = 0; s < S; s++)
            t->reg_mask[a * S + s] = pm[a * QCNET_STEPS + QCNET_T + s] ? 1 : 0;
        t->cls_mask[a] = pm[a * QCNET_STEPS + QCNET_STEPS - 1] ? 1 : 0;
    }
    return QC_OK;
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
    qc_best_mode_cpu(t->best_mode, t->loc_propose, t->target, 4, t->reg_mask, A, K, S);
    float *scratch;
    QC_TRY(qcnet_falloc(m, qc_reg_loss_scratch_numel(A, S), "scratch/reg_loss", &scratch));
    struct qc_qcnet_loss *l = &t->loss;
    memset(l, 0, sizeof *l);
    qc_reg_loss_forward_cpu(&l->reg_loss_propose, t->loc_propose, t->scale_propose, t->best_mode,
                            t->target, 4, t->reg_mask, A, K, S, scratch);
    qc_reg_loss_forward_cpu(&l->reg_loss_refine, t->loc_refine, t->scale_refine, t->best_mode,
                            t->target, 4, t->reg_mask, A, K, S, scratch);
    qcnet_free(m, scratch);
    qc_mixture_nll_forward_cpu(&l->cls_loss, t->pi, t->loc_refine, t->scale_refine, t->target, 4,
                               t->reg_mask, t->cls_mask, A, K, S);
    l->loss = l->reg_loss_propose + l->reg_loss_refine;
    l->loss = l->loss + l->cls_loss;
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
    float *scratch;
    QC_TRY(qcnet_falloc(m, qc_reg_loss_scratch_numel(A, S), "scratch/reg_loss", &scratch));
    const float dl = dloss_scale;
    qc_reg_loss_backward_cpu(dloc_p, dscale_p, &dl, t->loc_propose, t->scale_propose, t->best_mode,
                             t->target, 4, t->reg_mask, A, K, S, scratch);
    qc_reg_loss_backward_cpu(dloc_r, dscale_r, &dl, t->loc_refine, t->scale_refine, t->best_mode,
                             t->target, 4, t->reg_mask, A, K, S, scratch);
    qcnet_free(m, scratch);
    qc_mixture_nll_backward_cpu(dpi, &dl, t->pi, t->loc_refine, t->scale_refine, t->target, 4,
                                t->reg_mask, t->cls_mask, A, K, S);
    return QC_OK;
}

// ---- metrics --------------------------------------------------------------------------------

void qc_qcnet_metrics_reset(struct qc_qcnet_metrics *mt)
{
    memset(mt, 0, sizeof *mt);
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
        double ade = 0.0;
        for (int64_t s = 0; s < S; s++) {
            if (!valid[s])
                continue;
            const float *p = loc + ((a * K + kbest) * S + s) * 2;
            double dx = (double)p[0] - (double)g[s * 4];
            double dy = (double)p[1] - (double)g[s * 4 + 1];
            ade += sqrt(dx * dx + dy * dy);
        }
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
        mt->count++;
    }
}

enum qc_status qc_qcnet_metrics_update_model(struct qc_qcnet_metrics *mt, struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    if (!t->active)
        return qc_errorf(QC_ERR_INVALID, "model metrics: no forward");
    QC_TRY(qcnet_targets(m));
    qc_qcnet_metrics_update(mt, t->loc_refine, t->pi, t->target, t->batch->predict_mask,
                            t->batch->agent_category, t->A, t->K, QCNET_T, QCNET_S);
    return QC_OK;
}

void qc_qcnet_metrics_merge(struct qc_qcnet_metrics *dst, const struct qc_qcnet_metrics *src)
{
    dst->sum_min_ade += src->sum_min_ade;
    dst->sum_min_fde += src->sum_min_fde;
    dst->sum_miss += src->sum_miss;
    dst->sum_brier += src->sum_brier;
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
}
