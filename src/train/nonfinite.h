/*
 * nonfinite.h — non-finite numbers in a run (train.nonfinite, docs/RELIABILITY.md), private to
 * src/train (nonfinite.c): finding the first non-finite float of backend memory (the reduced
 * gradients of a step, the parameters before a checkpoint), naming what went non-finite in a
 * step, and the policy on such a step: stop (an error, nothing updated) or skip (parameters,
 * moments and AdamW's step count stay; the run stops after train.max_skipped in a row).
 * fp16's overflows are decided first (loss_scale.h) and are no case for the policy.
 */
#ifndef QC_TRAIN_NONFINITE_H
#define QC_TRAIN_NONFINITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_config.h"
#include "qc_exec.h"
#include "train_dist.h"

/* Zero-initialise; train_nonfinite_deinit frees. */
struct train_nonfinite {
    float *host;            /* device backends: host copy of the floats checked (as many as
                               the model's parameters) */
    int64_t skipped_in_row; /* train.nonfinite=skip: consecutive skipped steps */
    int64_t skipped_total;  /* ... and all of this process's */
};

/* The index of the first non-finite of n floats at x in ex's memory, or -1, into *first. A
 * device buffer is copied to nf->host first, allocated on first use with cap floats (the
 * model's parameters: n <= cap, asserted). QC_ERR_NOMEM, QC_ERR_CUDA. */
enum qc_status train_nonfinite_first(struct train_nonfinite *nf, const struct qc_exec *ex,
                                     const float *x, int64_t n, int64_t cap, int64_t *first);
/* What went non-finite in a step, into bad ("" when nothing): the loss terms by name (each
 * summed over the step's groups on every rank, so one non-finite group shows), else the first
 * non-finite gradient element found by any rank (world > 1 names the rank). */
void train_nonfinite_describe(const struct train_dist_sums *s, int world, char *bad, size_t n);
/* The policy on step `step` (1-based) with non-finite numbers (bad, from _describe): stop:
 * QC_ERR_INVALID naming the step, bad and last_ckpt, with a hint; skip: counted and warned. */
enum qc_status train_nonfinite_policy(struct train_nonfinite *nf, const struct qc_config *cfg,
                                      int64_t step, const char *bad, const char *last_ckpt);
/* A step was applied: the run of skipped steps ends. */
void train_nonfinite_applied(struct train_nonfinite *nf);
/* After step `step` (done, its line written): QC_ERR_INVALID once it was skipped and
 * train.max_skipped steps in a row were. */
enum qc_status train_nonfinite_limit(const struct train_nonfinite *nf, const struct qc_config *cfg,
                                     bool skipped, int64_t step, const char *last_ckpt);
void train_nonfinite_deinit(struct train_nonfinite *nf);

#endif /* QC_TRAIN_NONFINITE_H */
