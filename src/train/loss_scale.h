/*
 * loss_scale.h — fp16 dynamic loss scaling (docs/PRECISION.md), private to src/train
 * (loss_scale.c).
 *
 * With train.precision=fp16 the gradient seed of the loss is multiplied by the loss scale (a
 * power of 2, from 2^16): small gradients survive fp16, large ones may overflow. The scale and
 * its count of finite steps live in struct qc_train_state (loss_scale, loss_scale_good), so
 * checkpoints carry them; under every other precision they are 0 and everything here is a
 * no-op. After the step's reduction and exchange (train_dist_combine):
 *   overflow  a non-finite gradient with finite loss terms at a scale > 1: the step is skipped
 *             (parameters and moments untouched) and the scale halves;
 *   applied   otherwise the reduced gradients are unscaled exactly (a power of 2) and, after
 *             train.loss_scale_window finite steps in a row, the scale doubles (up to 2^24).
 * A non-finite loss term, or a non-finite gradient at scale 1, is no overflow: the non-finite
 * policy (train.nonfinite, nonfinite.h) decides.
 *
 * Ranks: the overflow is decided from sums->bad_grad, each rank's first non-finite element of
 * the part of the gradients it holds reduced (everything, or its shard under ZeRO stage 2, where
 * the rest of its buffer is its own unsummed gradient), combined over the ranks in the step's
 * exchange, so every rank takes the same decision and keeps the same scale. The unscale covers
 * the same reduced part [lo, hi): every gradient AdamW reads.
 */
#ifndef QC_TRAIN_LOSS_SCALE_H
#define QC_TRAIN_LOSS_SCALE_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_config.h"
#include "qc_exec.h"
#include "qc_train.h"
#include "train_dist.h"

/* The scale a run starts with: 2^16 under fp16, else 0 (none). */
double train_loss_scale_initial(const struct qc_config *cfg);
/* After a checkpoint was loaded into st: under fp16, one written by a run of another precision
 * (scale <= 1, no finite steps counted) starts afresh at 2^16. */
void train_loss_scale_resumed(const struct qc_config *cfg, struct qc_train_state *st);
/* The factor of the loss's gradient seed: the scale, or 1 without one. */
float train_loss_scale_seed(const struct qc_train_state *st);

/* Test hook QC_FAULT_GRAD_OVERFLOW_STEP=k: fp16 only, +Inf into gradient element 0 (grads, on
 * ex) at step k, after the reduction and before the finiteness check that decides, as an
 * overflow of the scaled gradients would be. Every rank writes it; under ZeRO stage 2 only rank
 * 0's shard holds element 0, and the step's exchange tells the others. QC_ERR_CUDA. */
enum qc_status train_loss_scale_fault(const struct qc_config *cfg, const struct qc_train_state *st,
                                      const struct qc_exec *ex, float *grads);
/* The decision on the step whose exchanged figures are sums: true for an overflow (the scale
 * halved, logged at info); otherwise, with finite loss terms and gradients, grads[lo, hi) (the
 * reduced part, on ex) are unscaled. */
bool train_loss_scale_check(const struct qc_config *cfg, struct qc_train_state *st,
                            const struct train_dist_sums *sums, const struct qc_exec *ex,
                            float *grads, int64_t lo, int64_t hi);
/* The step was applied: one more finite step toward doubling the scale. */
void train_loss_scale_applied(const struct qc_config *cfg, struct qc_train_state *st);
/* Logs (debug) this rank's decision on step `step` (1-based), which ran at step_scale: the
 * ranks must agree on every step ("train: step S (rank R of W): fp16 loss scale X: applied;
 * next Y"). */
void train_loss_scale_log(const struct qc_config *cfg, const struct qc_train_state *st,
                          int64_t step, int rank, int world, double step_scale, bool overflow,
                          bool skipped);

#endif /* QC_TRAIN_LOSS_SCALE_H */
