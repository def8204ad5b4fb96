/*
 * metrics.c — DIR/metrics.jsonl: one JSON object per line, one line per optimizer step (and
 * one per evaluation). Losses print with %.9g (enough digits to round-trip an fp32), the
 * learning rate with %.17g (a double); a non-finite number is written as null (qc_json.h).
 *
 * Crash consistency (docs/RELIABILITY.md): each record, newline included, goes to the file in
 * ONE write() on an O_APPEND descriptor, so a crash or a full disk can only cut the last record.
 * A resumed run first rewrites the log (temp file + fsync + rename) keeping only the complete
 * records (a whole line that is valid JSON) up to the checkpoint's step, so the resumed log
 * continues the saved one and never glues a new record onto a torn tail.
 */
#include "qc_train.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "qc_json.h"

struct qc_metrics_log {
    int fd; /* O_WRONLY | O_APPEND */
    char path[4096];
    enum qc_status (*tee)(void *ctx, const char *line); /* qc_metrics_set_tee; NULL = none */
    void *tee_ctx;
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
           "{\"step\":%" PRId64 ",\"epoch\":%" PRId64 ",\"samples\":%" PRId64 ",\"loss\":%s,"
           "\"reg_loss_propose\":%s,\"reg_loss_refine\":%s,\"cls_loss\":%s,\"lr\":%s,"
           "\"step_s\":%s,\"samples_per_s\":%s,\"bytes_in_use\":%" PRIu64
           ",\"peak_device_bytes\":%" PRIu64 ",\"reserved_bytes\":%" PRIu64
           ",\"peak_reserved_live_bytes\":%" PRIu64,
           s->step, s->epoch, s->samples, QC_JSON_NUM("%.9g", s->loss),
           QC_JSON_NUM("%.9g", s->reg_loss_propose), QC_JSON_NUM("%.9g", s->reg_loss_refine),
           QC_JSON_NUM("%.9g", s->cls_loss), QC_JSON_NUM("%.17g", s->lr),
           QC_JSON_NUM("%.6g", s->step_s), QC_JSON_NUM("%.6g", s->samples_per_s), s->bytes_in_use,
           s->peak_device_bytes, s->reserved_bytes, s->peak_reserved_live_bytes);
    /* the memory system (stepmem.c) */
    append(buf, cap, &len,
           ",\"predicted_peak_bytes\":%" PRIu64 ",\"peak_active_bytes\":%" PRIu64
           ",\"offload_host_bytes\":%" PRIu64 ",\"offload_nvme_bytes\":%" PRIu64
           ",\"recompute_bytes\":%" PRIu64 ",\"prefetch_stall_s\":%s,\"replans\":%" PRId64
           ",\"splits\":%" PRId64 ",\"skipped_scenes\":%" PRId64 ",\"plan_ms\":%s"
           ",\"plan_ahead_ms\":%s",
           s->predicted_peak_bytes, s->peak_active_bytes, s->offload_host_bytes,
           s->offload_nvme_bytes, s->recompute_bytes, QC_JSON_NUM("%.6g", s->prefetch_stall_s),
           s->replans, s->splits, s->skipped_scenes, QC_JSON_NUM("%.6g", s->plan_ms),
           QC_JSON_NUM("%.6g", s->plan_ahead_ms));
    if (s->skipped)
        append(buf, cap, &len, ",\"skipped\":true");
    if (s->rolled_back)
        append(buf, cap, &len, ",\"rolled_back\":true");
    if (s->empty)
        append(buf, cap, &len, ",\"empty\":true");
    if (s->loss_scale > 0)
        append(buf, cap, &len, ",\"loss_scale\":%s", QC_JSON_NUM("%.17g", s->loss_scale));
    if (s->ranks > 1) /* data-parallel runs only */
        append(buf, cap, &len,
               ",\"ranks\":%" PRId64 ",\"rank_time_ratio\":%s,\"rank_edge_ratio\":%s"
               ",\"comm_wait_s\":%s",
               s->ranks, QC_JSON_NUM("%.6g", s->rank_time_ratio),
               QC_JSON_NUM("%.6g", s->rank_edge_ratio), QC_JSON_NUM("%.6g", s->comm_wait_s));
    append(buf, cap, &len, "}");
    return len;
}

/* 1 when line (n bytes, no newline) is a complete record: valid JSON. *step is its top-level
 * "step" (-1 when it has none). */
static bool record_parse(const char *line, size_t n, int64_t *step)
{
    *step = -1;
    if (!qc_json_valid(line, n))
        return false;
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!j)
        return false;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    if (cJSON_IsNumber(s))
        *step = (int64_t)s->valuedouble;
    cJSON_Delete(j);
    return true;
}

/* Rewrites path keeping the complete records whose step is <= keep (records without a step
 * are kept when they come before the first dropped one); a torn or unparseable line is dropped
 * wherever it is. Atomic: temp file + fsync + rename. *dropped_torn counts the torn lines. */
static enum qc_status metrics_cut(const char *path, int64_t keep, int64_t *dropped_torn)
{
    *dropped_torn = 0;
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
    ssize_t len;
    while ((len = getline(&line, &cap, in)) > 0) {
        const bool complete = line[len - 1] == '\n';
        const size_t n = (size_t)len - (complete ? 1 : 0);
        int64_t s = -1;
        if (!complete || !record_parse(line, n, &s)) {
            (*dropped_torn)++;
            continue;
        }
        if (s > keep)
            dropping = true;
        if (dropping)
            continue;
        if (fwrite(line, 1, n, out) != n || fputc('\n', out) == EOF)
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
    m->fd = -1;
    const int n = snprintf(m->path, sizeof(m->path), "%s/metrics.jsonl", dir);
    if (n < 0 || (size_t)n >= sizeof(m->path)) {
        free(m);
        return qc_errorf(QC_ERR_INVALID, "metrics log: path too long: %s", dir);
    }
    if (keep_through_step >= 0) {
        int64_t torn = 0;
        const enum qc_status st = metrics_cut(m->path, keep_through_step, &torn);
        if (st != QC_OK) {
            free(m);
            return st;
        }
        if (torn > 0)
            qc_log(QC_LOG_WARN, "metrics log %s: dropped %" PRId64 " incomplete line(s)", m->path,
                   torn);
    }
    const int flags =
        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (keep_through_step >= 0 ? 0 : O_TRUNC);
    m->fd = open(m->path, flags, 0666);
    if (m->fd < 0) {
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

/* Appends `json` and a newline in one write() (module comment). */
static enum qc_status metrics_append(struct qc_metrics_log *m, const char *json, size_t n)
{
    char stackbuf[2048];
    char *buf = n + 1 <= sizeof(stackbuf) ? stackbuf : malloc(n + 1);
    if (!buf)
        return qc_errorf(QC_ERR_NOMEM, "metrics log %s: out of memory (%zu bytes)", m->path, n);
    memcpy(buf, json, n);
    buf[n] = '\n';
    ssize_t w;
    do
        w = write(m->fd, buf, n + 1);
    while (w < 0 && errno == EINTR);
    const int e = w < 0 ? errno : ENOSPC; /* a short write on a regular file: the disk is full */
    if (buf != stackbuf)
        free(buf);
    if (w != (ssize_t)(n + 1))
        return qc_errorf(QC_ERR_IO, "metrics log %s: write failed: %s", m->path, strerror(e));
    return QC_OK;
}

enum qc_status qc_metrics_write_raw(struct qc_metrics_log *m, const char *json)
{
    QC_TRY(metrics_append(m, json, strlen(json)));
    return m->tee ? m->tee(m->tee_ctx, json) : QC_OK;
}

void qc_metrics_set_tee(struct qc_metrics_log *m, enum qc_status (*fn)(void *ctx, const char *line),
                        void *ctx)
{
    m->tee = fn;
    m->tee_ctx = ctx;
}

enum qc_status qc_metrics_write_step(struct qc_metrics_log *m, const struct qc_step_metrics *s)
{
    char buf[1024];
    const size_t n = qc_metrics_format_step(s, buf, sizeof(buf));
    QC_ASSERT(n < sizeof(buf), "metrics line of %zu bytes", n);
    return qc_metrics_write_raw(m, buf); /* the tee sees step lines too */
}

enum qc_status qc_metrics_sync(struct qc_metrics_log *m)
{
    if (fsync(m->fd) != 0 && errno != EINVAL)
        return qc_errorf(QC_ERR_IO, "metrics log %s: fsync failed: %s", m->path, strerror(errno));
    return QC_OK;
}

void qc_metrics_close(struct qc_metrics_log *m)
{
    if (!m)
        return;
    if (m->fd >= 0) {
        fsync(m->fd);
        close(m->fd);
    }
    free(m);
}
