/*
 * measure.c — the real measurement of a candidate (qc_tune_measure_train): a few optimizer
 * steps of a quiet trainer in a scratch folder, seeded with the search's cost model and
 * handing back the run's calibrated one.
 */
#include "tune_internal.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qc_cleanup.h"
#include "qc_plan.h"
#include "qc_train.h"

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum qc_status qc_tune_measure_train(void *user, const struct qc_config *cfg,
                                     const char *const *data, int ndata, const char *cost_path,
                                     bool *cost_written, struct qc_tune_measure *out)
{
    const int64_t steps = user ? *(const int64_t *)user : 3;
    memset(out, 0, sizeof *out);
    *cost_written = false;
    if (steps < 1)
        return qc_errorf(QC_ERR_INVALID, "tune: %lld steps per measurement", (long long)steps);
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/qctrain-tune-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return qc_errorf(QC_ERR_IO, "tune: cannot create a scratch folder %s: %s", dir,
                         strerror(errno));
    struct qc_config c = *cfg;
    c.steps = steps;
    c.save_every = 0;
    c.alloc_trace = false;
    c.log_tensorboard = false;
    c.log_report = false;
    c.quiet = true;
    if (strlen(dir) >= sizeof c.out_dir) {
        rmdir(dir);
        return qc_errorf(QC_ERR_INVALID, "tune: scratch folder path too long: %s", dir);
    }
    memcpy(c.out_dir, dir, strlen(dir) + 1);
    enum qc_status st = QC_OK;
    char path[4200];
    struct stat sb;
    if (cost_path && stat(cost_path, &sb) == 0) { /* the run starts from the search's costs */
        struct qc_plan_cost *seed = NULL;
        st = qc_plan_cost_create(&seed);
        if (st == QC_OK)
            st = qc_plan_cost_load(seed, cost_path);
        snprintf(path, sizeof path, "%s/plan_cost.json", dir);
        if (st == QC_OK)
            st = qc_plan_cost_save(seed, path);
        qc_plan_cost_destroy(seed);
    }
    const struct qc_train_opts to = {
        .cfg = &c, .data = data, .ndata = ndata, .out_dir = dir, .quiet = true};
    struct qc_trainer *t = NULL;
    /* the trainer's info lines (offload probe, rungs) would bury tune's own: warnings only */
    const enum qc_log_level level = qc_log_get_level();
    if (level > QC_LOG_WARN)
        qc_log_set_level(QC_LOG_WARN);
    double *times = calloc((size_t)steps, sizeof *times);
    if (st == QC_OK && !times)
        st = qc_errorf(QC_ERR_NOMEM, "tune: %lld steps", (long long)steps);
    if (st == QC_OK && qc_trainer_create(&to, &t) != QC_OK) {
        out->failed = true;
        snprintf(out->note, sizeof out->note, "%s", qc_error_last());
    }
    for (int64_t i = 0; st == QC_OK && t && i < steps; i++) {
        struct qc_step_metrics m = {0};
        if (qc_trainer_step(t, &m) != QC_OK) {
            out->failed = true;
            snprintf(out->note, sizeof out->note, "step %lld: %s", (long long)i + 1,
                     qc_error_last());
            break;
        }
        times[out->steps++] = m.step_s;
        if (m.peak_device_bytes > out->peak_bytes)
            out->peak_bytes = m.peak_device_bytes;
        out->replans += m.replans;
        out->splits += m.splits;
        if (qc_cleanup_stop_signal()) /* Ctrl-C: what ran so far counts */
            break;
    }
    if (out->steps > 0) {
        /* the first step warms the allocator's cache and the loader: left out when others ran */
        const int64_t from = out->steps > 1 ? 1 : 0;
        qsort(times + from, (size_t)(out->steps - from), sizeof *times, by_value);
        const int64_t n = out->steps - from;
        out->step_s =
            n % 2 ? times[from + n / 2] : 0.5 * (times[from + n / 2 - 1] + times[from + n / 2]);
        out->step_s_min = times[from];
        out->step_s_max = times[out->steps - 1];
    }
    if (st == QC_OK && t && out->steps > 0 && !out->failed && cost_path) {
        st = qc_plan_cost_save(qc_trainer_plan_cost(t), cost_path);
        *cost_written = st == QC_OK;
    }
    qc_trainer_destroy(t);
    qc_log_set_level(level);
    free(times);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return st;
}
