/*
 * nonfinite.c — finding, naming and the policy on non-finite numbers of a step (nonfinite.h).
 */
#include "nonfinite.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum qc_status train_nonfinite_first(struct train_nonfinite *nf, const struct qc_exec *ex,
                                     const float *x, int64_t n, int64_t cap, int64_t *first)
{
    const float *h = x;
    if (qc_exec_is_device(ex)) {
        QC_ASSERT(n <= cap, "train: finiteness check of %" PRId64 " > %" PRId64 " floats", n, cap);
        if (!nf->host) {
            nf->host = malloc((size_t)(cap > 0 ? cap : 1) * sizeof(float));
            if (!nf->host)
                return qc_errorf(QC_ERR_NOMEM, "train: out of host memory (%" PRId64 " floats)",
                                 cap);
        }
        QC_TRY(qc_op_download(ex, nf->host, x, (size_t)n * sizeof(float)));
        h = nf->host;
    }
    *first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(h[i])) {
            *first = i;
            break;
        }
    return QC_OK;
}

void train_nonfinite_describe(const struct train_dist_sums *s, int world, char *bad, size_t n)
{
    bad[0] = '\0';
    const double v[3] = {s->reg_loss_propose, s->reg_loss_refine, s->cls_loss};
    const char *name[3] = {"reg_loss_propose", "reg_loss_refine", "cls_loss"};
    size_t len = 0;
    for (int i = 0; i < 3; i++)
        if (!isfinite(v[i]) && len < n)
            len +=
                (size_t)snprintf(bad + len, n - len, "%s%s = %g", len ? ", " : "", name[i], v[i]);
    if (len > 0) {
        if (len < n)
            snprintf(bad + len, n - len, " (not finite)");
        return;
    }
    if (s->bad_grad >= 0 && world > 1)
        snprintf(bad, n,
                 "the loss is finite but gradient element %" PRId64
                 " is not (summed over the ranks; seen by rank %d)",
                 s->bad_grad, s->bad_grad_rank);
    else if (s->bad_grad >= 0)
        snprintf(bad, n, "the loss is finite but gradient element %" PRId64 " is not", s->bad_grad);
}

enum qc_status train_nonfinite_policy(struct train_nonfinite *nf, const struct qc_config *cfg,
                                      int64_t step, const char *bad, const char *last_ckpt)
{
    if (cfg->nonfinite == QC_NONFINITE_STOP)
        return qc_errorf(QC_ERR_INVALID,
                         "train: step %" PRId64 ": %s; stopped before updating the parameters "
                         "(last checkpoint: %s)\nhint: lower train.lr, check the data (qctrain "
                         "inspect), or set train.nonfinite=skip to step over such batches",
                         step, bad, last_ckpt);
    /* skip: parameters, moments and AdamW's step count stay as they were */
    nf->skipped_in_row++;
    nf->skipped_total++;
    qc_log(QC_LOG_WARN,
           "train: step %" PRId64 ": %s; skipped (%" PRId64 " in a row, %" PRId64
           " in all; train.max_skipped = %" PRId64 ")",
           step, bad, nf->skipped_in_row, nf->skipped_total, cfg->max_skipped);
    return QC_OK;
}

void train_nonfinite_applied(struct train_nonfinite *nf)
{
    nf->skipped_in_row = 0;
}

enum qc_status train_nonfinite_limit(const struct train_nonfinite *nf, const struct qc_config *cfg,
                                     bool skipped, int64_t step, const char *last_ckpt)
{
    if (skipped && nf->skipped_in_row >= cfg->max_skipped)
        return qc_errorf(QC_ERR_INVALID,
                         "train: %" PRId64 " steps in a row had non-finite numbers, the last "
                         "one step %" PRId64 " (train.max_skipped = %" PRId64
                         "); stopped (last checkpoint: %s)\nhint: lower train.lr or check the "
                         "data (qctrain inspect)",
                         nf->skipped_in_row, step, cfg->max_skipped, last_ckpt);
    return QC_OK;
}

void train_nonfinite_deinit(struct train_nonfinite *nf)
{
    free(nf->host);
    nf->host = NULL;
}
