/*
 * metrics.c — DIR/metrics.jsonl: one JSON object per line, one line per optimizer step (and
 * one per evaluation). Losses print with %.9g (enough digits to round-trip an fp32), the
 * learning rate with %.17g (a double). A resumed run first cuts the log back to the
 * checkpoint's step, rewriting it atomically, so the resumed log continues the saved one.
 */
#include "qc_train.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct qc_metrics_log {
    FILE *f;
    char path[4096];
};

/* Appends to buf (cap bytes) at *len, which counts the length needed even past cap. */
static void __attribute__((format(printf, 4, 5)))
append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const size_t room = *len < cap ? cap - *len : 0;
    const int n = vsnprintf(room ? buf + *len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len += (size_t)n;
}

size_t qc_metrics_format_step(const struct qc_step_metrics *s, char *buf, size_t cap)
{
    size_t len = 0;
    append(buf, cap, &len,
           "{\"step\":%" PRId64 ",\"epoch\":%" PRId64 ",\"samples\":%" PRId64 ",\"loss\":%.9g,"
           "\"reg_loss_propose\":%.9g,\"reg_loss_refine\":%.9g,\"cls_loss\":%.9g,\"lr\":%.17g,"
           "\"step_s\":%.6g,\"samples_per_s\":%.6g,\"bytes_in_use\":%" PRIu64
           ",\"peak_device_bytes\":%" PRIu64 ",\"reserved_bytes\":%" PRIu64,
           s->step, s->epoch, s->samples, s->loss, s->reg_loss_propose, s->reg_loss_refine,
           s->cls_loss, s->lr, s->step_s, s->samples_per_s, s->bytes_in_use, s->peak_device_bytes,
           s->reserved_bytes);
    if (s->ranks > 1) /* data-parallel runs only */
        append(buf, cap, &len,
               ",\"ranks\":%" PRId64 ",\"rank_time_ratio\":%.6g,\"rank_edge_ratio\":%.6g"
               ",\"comm_wait_s\":%.6g",
               s->ranks, s->rank_time_ratio, s->rank_edge_ratio, s->comm_wait_s);
    append(buf, cap, &len, "}");
    return len;
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
