/*
 * metrics.c — DIR/metrics.jsonl: one JSON object per line, one line per optimizer step (and
 * one per evaluation). Losses print with %.9g (enough digits to round-trip an fp32), the
 * learning rate with %.17g (a double). A resumed run first cuts the log back to the
 * checkpoint's step, rewriting it atomically, so the resumed log continues the saved one.
 */
#include "qc_train.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct qc_metrics_log {
    FILE *f;
    char path[4096];
};

size_t qc_metrics_format_step(const struct qc_step_metrics *s, char *buf, size_t cap)
{
    const int n = snprintf(
        buf, cap,
        "{\"step\":%" PRId64 ",\"epoch\":%" PRId64 ",\"samples\":%" PRId64 ",\"loss\":%.9g,"
        "\"reg_loss_propose\":%.9g,\"reg_loss_refine\":%.9g,\"cls_loss\":%.9g,\"lr\":%.17g,"
        "\"step_s\":%.6g,\"samples_per_s\":%.6g,\"bytes_in_use\":%" PRIu64
        ",\"peak_device_bytes\":%" PRIu64 ",\"reserved_bytes\":%" PRIu64
        ",\"predicted_peak_bytes\":%" PRIu64 ",\"peak_active_bytes\":%" PRIu64
        ",\"offload_host_bytes\":%" PRIu64 ",\"offload_nvme_bytes\":%" PRIu64
        ",\"recompute_bytes\":%" PRIu64 ",\"prefetch_stall_s\":%.6g,\"replans\":%" PRId64
        ",\"splits\":%" PRId64 ",\"skipped_scenes\":%" PRId64 ",\"plan_ms\":%.6g}",
        s->step, s->epoch, s->samples, s->loss, s->reg_loss_propose, s->reg_loss_refine,
        s->cls_loss, s->lr, s->step_s, s->samples_per_s, s->bytes_in_use, s->peak_device_bytes,
        s->reserved_bytes, s->predicted_peak_bytes, s->peak_active_bytes, s->offload_host_bytes,
        s->offload_nvme_bytes, s->recompute_bytes, s->prefetch_stall_s, s->replans, s->splits,
        s->skipped_scenes, s->plan_ms);
    return n < 0 ? 0 : (size_t)n;
}

/* The "step" value of a log line, or -1 when it has none (eval lines and the like). */
static int64_t line_step(const char *line)
{
    const char *p = strstr(line, "\"step\":");
    if (!p)
        return -1;
    return strtoll(p + 7, NULL, 10);
}

/* Rewrites path keeping the lines whose step is <= keep (lines without a step are kept when
 * they come before the first dropped line). Atomic: temp file + fsync + rename. */
static enum qc_status metrics_cut(const char *path, int64_t keep)
{
    FILE *in = fopen(path, "r");
    if (!in) {
        if (errno == ENOENT)
            return QC_OK;
        return qc_errorf(QC_ERR_IO, "metrics log %s: cannot read: %s", path, strerror(errno));
    }
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fclose(in);
        return qc_errorf(QC_ERR_IO, "metrics log %s: cannot write: %s", tmp, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    bool dropping = false;
    int werr = 0;
    while (getline(&line, &cap, in) > 0) {
        const int64_t s = line_step(line);
        if (s > keep)
            dropping = true;
        if (dropping)
            continue;
        if (fputs(line, out) < 0)
            werr = errno ? errno : EIO;
    }
    free(line);
    fclose(in);
    if (fflush(out) != 0 || fsync(fileno(out)) != 0)
        werr = errno ? errno : EIO;
    fclose(out);
    if (werr) {
        unlink(tmp);
        return qc_errorf(QC_ERR_IO, "metrics log %s: write failed: %s", tmp, strerror(werr));
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return qc_errorf(QC_ERR_IO, "metrics log %s: rename failed: %s", path, strerror(e));
    }
    return QC_OK;
}

enum qc_status qc_metrics_open(const char *dir, int64_t keep_through_step,
                               struct qc_metrics_log **out)
{
    struct qc_metrics_log *m = calloc(1, sizeof(*m));
    if (!m)
        return qc_errorf(QC_ERR_NOMEM, "metrics log: out of memory");
    const int n = snprintf(m->path, sizeof(m->path), "%s/metrics.jsonl", dir);
    if (n < 0 || (size_t)n >= sizeof(m->path)) {
        free(m);
        return qc_errorf(QC_ERR_INVALID, "metrics log: path too long: %s", dir);
    }
    if (keep_through_step >= 0) {
        const enum qc_status st = metrics_cut(m->path, keep_through_step);
        if (st != QC_OK) {
            free(m);
            return st;
        }
    }
    m->f = fopen(m->path, keep_through_step >= 0 ? "a" : "w");
    if (!m->f) {
        const int e = errno;
        free(m);
        return qc_errorf(QC_ERR_IO,
                         "metrics log %s/metrics.jsonl: cannot open: %s\nhint: is the "
                         "output folder writable?",
                         dir, strerror(e));
    }
    *out = m;
    return QC_OK;
}

enum qc_status qc_metrics_write_raw(struct qc_metrics_log *m, const char *json)
{
    if (fputs(json, m->f) < 0 || fputc('\n', m->f) == EOF || fflush(m->f) != 0)
        return qc_errorf(QC_ERR_IO, "metrics log %s: write failed: %s", m->path,
                         strerror(errno ? errno : EIO));
    return QC_OK;
}

enum qc_status qc_metrics_write_step(struct qc_metrics_log *m, const struct qc_step_metrics *s)
{
    char buf[1024];
    const size_t n = qc_metrics_format_step(s, buf, sizeof(buf));
    QC_ASSERT(n < sizeof(buf), "metrics line of %zu bytes", n);
    return qc_metrics_write_raw(m, buf);
}

void qc_metrics_close(struct qc_metrics_log *m)
{
    if (!m)
        return;
    if (m->f) {
        fflush(m->f);
        fsync(fileno(m->f));
        fclose(m->f);
    }
    free(m);
}
