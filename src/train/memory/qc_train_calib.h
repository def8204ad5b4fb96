/*
 * qc_train_calib.h — this machine's calibration of the planner's cost model for a configuration
 * (calib.c; src/plan/qc_plan_calib.h; src/plan/README.md, "Calibration").
 */
#ifndef QC_MEMORY_QC_TRAIN_CALIB_H
#define QC_MEMORY_QC_TRAIN_CALIB_H

#include <stdint.h>

#include "qc_config.h"
#include "qc_plan_calib.h"

/* The cache key of cfg on this machine and build: machine, build, and the model's device,
 * precision, shape, attention and threads. */
void qc_train_calib_key(const struct qc_config *cfg, struct qc_plan_calib *key);

/* cfg's calibration on this machine (cached, else probed and cached: a fraction of a second),
 * or *out NULL when the built-in coefficients apply: plan.calibration=builtin, or a CUDA device
 * (the host clock does not see device work; its roofline or --cost). nparams prices the
 * optimizer's sweep until a run has measured it. */
enum qc_status qc_train_calib_get(const struct qc_config *cfg, int64_t nparams,
                                  struct qc_plan_cost **out);

/* Folds a training run's measured cost model into cfg's cached calibration (best effort: a
 * warning when it cannot be written). Nothing under plan.calibration=builtin or on CUDA. */
void qc_train_calib_refresh(const struct qc_config *cfg, const struct qc_plan_cost *run);

#endif
