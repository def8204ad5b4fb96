/*
 * bench_common.h — what the training benches (bench step, bench dist) and `qctrain profile`
 * share: a quiet trainer in a scratch run folder of its own, warmed up, and the folder removed
 * with everything the trainer wrote into it.
 */
#ifndef QC_BENCH_BENCH_COMMON_H
#define QC_BENCH_BENCH_COMMON_H

#include <stdint.h>

#include "qc_config.h"
#include "qc_status.h"
#include "qc_train.h"

struct qc_bench_run {
    char dir[64];         /* /tmp/qctrain-bench-<name>-XXXXXX */
    struct qc_trainer *t; /* NULL when creation failed */
};

/* Creates the scratch folder and a quiet trainer of cfg in it (out_dir there), on the scenes
 * of the ndata qcshard files data (none: synthetic scenes), then runs `warmup` untimed steps.
 * On failure the folder is removed again. QC_ERR_IO naming /tmp. */
enum qc_status qc_bench_run_start(const struct qc_config *cfg, const char *name,
                                  const char *const *data, int ndata, int64_t warmup,
                                  struct qc_bench_run *r);
/* Destroys the trainer and removes the folder, deepest first (checkpoints included). */
void qc_bench_run_end(struct qc_bench_run *r);

#endif /* QC_BENCH_BENCH_COMMON_H */
