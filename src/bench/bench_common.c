/*
 * bench_common.c — the scratch training run of the benches, and steps under the profiler
 * (bench_common.h).
 */
#include "bench_common.h"

#include <errno.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_exec.h"
#include "qc_prof.h"

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

enum qc_status qc_bench_run_folder(const char *name, struct qc_bench_run *r)
{
    r->t = NULL;
    snprintf(r->dir, sizeof(r->dir), "/tmp/qctrain-bench-%s-XXXXXX", name);
    if (!mkdtemp(r->dir)) {
        r->dir[0] = '\0';
        return qc_errorf(QC_ERR_IO, "bench %s: cannot create a temporary folder in /tmp", name);
    }
    return QC_OK;
}

enum qc_status qc_bench_run_trainer(struct qc_bench_run *r, const struct qc_train_opts *to,
                                    int64_t warmup)
{
    struct qc_train_opts o = *to;
    o.out_dir = r->dir;
    o.quiet = true;
    enum qc_status st = qc_trainer_create(&o, &r->t);
    for (int64_t i = 0; st == QC_OK && i < warmup; i++)
        st = qc_trainer_step(r->t, NULL);
    if (st != QC_OK)
        qc_bench_run_end(r);
    return st;
}

enum qc_status qc_bench_run_start(const struct qc_config *cfg, const char *name,
                                  const char *const *data, int ndata, int64_t warmup,
                                  struct qc_bench_run *r)
{
    QC_TRY(qc_bench_run_folder(name, r));
    const struct qc_train_opts to = {.cfg = cfg, .data = data, .ndata = ndata};
    return qc_bench_run_trainer(r, &to, warmup);
}

void qc_bench_run_end(struct qc_bench_run *r)
{
    qc_trainer_destroy(r->t);
    r->t = NULL;
    if (r->dir[0])
        nftw(r->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    r->dir[0] = '\0';
}

enum qc_status qc_bench_copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (!in)
        return qc_errorf(QC_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        const int e = errno;
        fclose(in);
        return qc_errorf(QC_ERR_IO, "%s: cannot create: %s", dst, strerror(e));
    }
    char buf[1 << 16];
    size_t n;
    bool ok = true;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = ok && fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0 || !ok)
        return qc_errorf(QC_ERR_IO, "copying %s to %s failed", src, dst);
    return QC_OK;
}

enum qc_status qc_bench_profiled_steps(struct qc_trainer *t, int64_t warmup, int64_t steps)
{
    const struct qc_exec *ex = qc_qcnet_exec(qc_trainer_model(t));
    for (int64_t i = 0; i < warmup; i++)
        QC_TRY(qc_trainer_step(t, NULL));
    QC_TRY(qc_op_sync(ex));
    qc_prof_reset();
    qc_prof_start();
    enum qc_status st = QC_OK;
    for (int64_t i = 0; st == QC_OK && i < steps; i++) {
        struct qc_prof_mark m;
        qc_prof_span_begin(&m, QC_PROF_CAT_PHASE, "step", QC_PROF_PASS_NONE);
        st = qc_trainer_step(t, NULL);
        if (st == QC_OK)
            st = qc_op_sync(ex);
        qc_prof_span_end(&m, QC_PROF_CAT_PHASE, NULL, 0);
        if (st == QC_OK)
            st = qc_prof_resolve();
    }
    qc_prof_stop();
    return st;
}
