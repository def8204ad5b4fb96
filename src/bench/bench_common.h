/*
 * bench_common.h — what the training benches (bench step, bench dist, bench memory) and
 * `qctrain profile` share: a quiet trainer in a scratch run folder of its own, warmed up, and the
 * folder removed with everything the trainer wrote into it (bench memory seeds the folder before
 * its trainer starts); and steps run under the profiler (profile's, bench step's GEMM figures).
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
/* The two halves of qc_bench_run_start, for a bench that puts files into the folder before its
 * trainer starts (a cost model to start from): the folder alone (r->t NULL), then a quiet
 * trainer of *to with out_dir set to the folder and `warmup` untimed steps. On failure the
 * folder is removed again. */
enum qc_status qc_bench_run_folder(const char *name, struct qc_bench_run *r);
enum qc_status qc_bench_run_trainer(struct qc_bench_run *r, const struct qc_train_opts *to,
                                    int64_t warmup);
/* Destroys the trainer and removes the folder, deepest first (checkpoints included). */
void qc_bench_run_end(struct qc_bench_run *r);

/* Runs `warmup` steps of an open trainer, then `steps` steps with the profiler on, each inside a
 * "step" phase span and resolved (device times) after it: the recorder holds their events after
 * (the profiler is stopped, not reset). `qctrain profile`, and bench step's GEMM figures. */
enum qc_status qc_bench_profiled_steps(struct qc_trainer *t, int64_t warmup, int64_t steps);

/* Copies the file src to dst (created or truncated). QC_ERR_IO naming the file. */
enum qc_status qc_bench_copy_file(const char *src, const char *dst);

#endif /* QC_BENCH_BENCH_COMMON_H */
