/*
 * loss_scale.c — fp16 dynamic loss scaling: the scale's start, its halving on an overflow and
 * doubling after a window of finite steps, the unscale of the reduced gradients, the overflow
 * test hook and the per-rank decision log (loss_scale.h).
 */
#include "loss_scale.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "qc_half.h" /* QC_PREC_FP16 */

#define LOSS_SCALE_INIT 65536.0    /* 2^16, fp16's first loss scale */
#define LOSS_SCALE_MAX  16777216.0 /* 2^24 */

static bool scaling(const struct qc_config *cfg, const struct qc_train_state *st)
{
    return cfg->precision == QC_PREC_FP16 && st->loss_scale > 0;
}

double train_loss_scale_initial(const struct qc_config *cfg)
{
    return cfg->precision == QC_PREC_FP16 ? LOSS_SCALE_INIT : 0.0;
}

void train_loss_scale_resumed(const struct qc_config *cfg, struct qc_train_state *st)
{
    if (cfg->precision == QC_PREC_FP16 && st->loss_scale <= 1.0 && st->loss_scale_good == 0)
        st->loss_scale = LOSS_SCALE_INIT; /* a checkpoint of another precision: start afresh */
}

float train_loss_scale_seed(const struct qc_train_state *st)
{
    return st->loss_scale > 0 ? (float)st->loss_scale : 1.0f;
}

enum qc_status train_loss_scale_fault(const struct qc_config *cfg, const struct qc_train_state *st,
                                      const struct qc_exec *ex, float *grads)
{
    if (!scaling(cfg, st))
        return QC_OK;
    const char *fault = getenv("QC_FAULT_GRAD_OVERFLOW_STEP");
    if (!fault || strtoll(fault, NULL, 10) != st->step + 1)
        return QC_OK;
    const float inf = INFINITY;
    return qc_op_upload(ex, grads, &inf, sizeof inf);
}

bool train_loss_scale_check(const struct qc_config *cfg, struct qc_train_state *st,
                            const struct train_dist_sums *sums, const struct qc_exec *ex,
                            float *grads, int64_t lo, int64_t hi)
{
    if (!scaling(cfg, st))
        return false;
    /* a non-finite loss term, or a non-finite gradient at scale 1, is the NaN policy's case */
    if (!isfinite(sums->reg_loss_propose) || !isfinite(sums->reg_loss_refine) ||
        !isfinite(sums->cls_loss))
        return false;
    if (sums->bad_grad >= 0 && st->loss_scale > 1.0) {
        const double ran = st->loss_scale;
        st->loss_scale /= 2;
        st->loss_scale_good = 0;
        qc_log(QC_LOG_INFO,
               "train: step %" PRId64 ": fp16 gradients overflowed at loss scale %g; skipped, "
               "scale now %g",
               st->step + 1, ran, st->loss_scale);
        return true;
    }
    if (sums->bad_grad < 0)
        qc_op_scale_inplace(ex, grads + lo, (float)(1.0 / st->loss_scale), hi - lo);
    return false;
}

void train_loss_scale_applied(const struct qc_config *cfg, struct qc_train_state *st)
{
    if (!scaling(cfg, st))
        return;
    if (++st->loss_scale_good >= cfg->loss_scale_window) {
        if (st->loss_scale < LOSS_SCALE_MAX)
            st->loss_scale *= 2;
        st->loss_scale_good = 0;
    }
}

void train_loss_scale_log(const struct qc_config *cfg, const struct qc_train_state *st,
                          int64_t step, int rank, int world, double step_scale, bool overflow,
                          bool skipped)
{
    if (cfg->precision != QC_PREC_FP16 || step_scale <= 0)
        return;
    qc_log(QC_LOG_DEBUG, "train: step %" PRId64 " (rank %d of %d): fp16 loss scale %g: %s; next %g",
           step, rank, world, step_scale,
           overflow ? "overflow, skipped" : (skipped ? "skipped" : "applied"), st->loss_scale);
}
