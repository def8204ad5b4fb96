/*
 * tb_writer.c — the TensorBoard event file of one process run (qc_report.h).
 *
 * Robustness: records are only appended; each Event is framed in memory and written with one
 * fwrite + fflush, so a crash can cut at most the last record (TensorBoard's reader stops at a
 * truncated record and keeps every earlier one), never an earlier one. The file is fsynced at
 * checkpoints (qc_tb_sync) and at close. A resumed or restarted run never appends to an old
 * file: it opens a new one whose name sorts after every file in RUN/tb/ and begins with a
 * SessionLog.START at its first step; TensorBoard's EventAccumulator (purge_orphaned_data, on
 * by default) then drops the older files' events at steps >= that step, so the steps a resumed
 * run redoes (those after its checkpoint) appear once, with the resumed run's values.
 */
#include "qc_report.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TB_MAX_SCALARS 64

struct qc_tb {
    FILE *f;
    char path[4400];
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Frames an encoded event and appends it, flushed. */
static enum qc_status tb_append(struct qc_tb *tb, const uint8_t *data, size_t n)
{
    uint8_t stack[4096];
    uint8_t *rec = n + 16 <= sizeof stack ? stack : malloc(n + 16);
    if (!rec)
        return qc_errorf(QC_ERR_NOMEM, "tensorboard: out of memory (%zu bytes)", n + 16);
    const size_t len = qc_tb_record_frame(data, n, rec);
    const bool ok = fwrite(rec, 1, len, tb->f) == len && fflush(tb->f) == 0;
    const int e = errno;
    if (rec != stack)
        free(rec);
    if (!ok)
        return qc_errorf(QC_ERR_IO, "tensorboard %s: write failed: %s\nhint: is the disk full?",
                         tb->path, strerror(e ? e : EIO));
    return QC_OK;
}

/* Encodes with enc into a buffer (grown when needed) and appends the record. */
static enum qc_status tb_append_event(struct qc_tb *tb, size_t need, uint8_t *buf, size_t cap,
                                      size_t (*redo)(void *, uint8_t *, size_t), void *ctx)
{
    if (need <= cap)
        return tb_append(tb, buf, need);
    uint8_t *big = malloc(need);
    if (!big)
        return qc_errorf(QC_ERR_NOMEM, "tensorboard: out of memory (%zu bytes)", need);
    redo(ctx, big, need);
    const enum qc_status st = tb_append(tb, big, need);
    free(big);
    return st;
}

/* The largest <unix time> among RUN/tb/events.out.tfevents.<unix time>.* names (0 if none). */
static uint64_t newest_stamp(const char *dir)
{
    uint64_t best = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    static const char prefix[] = "events.out.tfevents.";
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0)
            continue;
        const uint64_t t = strtoull(e->d_name + sizeof prefix - 1, NULL, 10);
        best = t > best ? t : best;
    }
    closedir(d);
    return best;
}

enum qc_status qc_tb_open(const char *run_dir, int64_t first_step, struct qc_tb **out)
{
    char dir[4200];
    const int dn = snprintf(dir, sizeof dir, "%s/tb", run_dir);
    if (dn < 0 || (size_t)dn >= sizeof dir)
        return qc_errorf(QC_ERR_INVALID, "tensorboard: run folder path too long: %s", run_dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return qc_errorf(QC_ERR_IO, "tensorboard: cannot create %s: %s\nhint: check the run folder",
                         dir, strerror(errno));
    struct qc_tb *tb = calloc(1, sizeof *tb);
    if (!tb)
        return qc_errorf(QC_ERR_NOMEM, "tensorboard: out of memory");
    /* TensorBoard reads a folder's files in name order and assumes older files are done: the
     * new name must sort after every existing one (same digit count until the year 2286) */
    uint64_t stamp = (uint64_t)time(NULL);
    const uint64_t newest = newest_stamp(dir);
    if (stamp <= newest)
        stamp = newest + 1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        if (*p == '/')
            *p = '_';
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010" PRIu64 ".%s.%ld.qctrain", dir,
             stamp, host, (long)getpid());
    tb->f = fopen(tb->path, "wbx");
    if (!tb->f) {
        const int e = errno;
        const enum qc_status st =
            qc_errorf(QC_ERR_IO, "tensorboard %s: cannot create: %s", tb->path, strerror(e));
        free(tb);
        return st;
    }
    uint8_t buf[128];
    const double now = wall_now();
    size_t n = qc_tb_event_file_version(now, buf, sizeof buf);
    enum qc_status st = tb_append(tb, buf, n);
    if (st == QC_OK) {
        n = qc_tb_event_session_start(now, first_step, buf, sizeof buf);
        st = tb_append(tb, buf, n);
    }
    if (st != QC_OK) {
        qc_tb_close(tb);
        return st;
    }
    *out = tb;
    return QC_OK;
}

struct scalars_ctx {
    double wall_time;
    int64_t step;
    const struct qc_tb_scalar *v;
    int n;
};

static size_t redo_scalars(void *ctx, uint8_t *out, size_t cap)
{
    const struct scalars_ctx *c = ctx;
    return qc_tb_event_scalars(c->wall_time, c->step, c->v, c->n, out, cap);
}

enum qc_status qc_tb_write_metrics_line(struct qc_tb *tb, const char *json_line)
{
    cJSON *root = cJSON_Parse(json_line);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(root, "step");
    if (!cJSON_IsObject(root) || !cJSON_IsNumber(step)) {
        cJSON_Delete(root);
        return qc_errorf(QC_ERR_INVALID, "tensorboard: not a metrics line with a step: %.80s",
                         json_line);
    }
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "eval");
    const bool is_eval = cJSON_IsObject(ev);
    const cJSON *src = is_eval ? ev : root;
    int nm = 0;
    const struct qc_report_metric *m = qc_report_metrics(&nm);
    struct qc_tb_scalar v[TB_MAX_SCALARS];
    int n = 0;
    for (int i = 0; i < nm && n < TB_MAX_SCALARS; i++) {
        if (m[i].eval != is_eval)
            continue;
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(src, m[i].key);
        if (cJSON_IsNumber(x)) /* null ("not available") and absent keys are skipped */
            v[n++] = (struct qc_tb_scalar){m[i].tag, (float)x->valuedouble};
    }
    enum qc_status st = QC_OK;
    if (n > 0) {
        struct scalars_ctx c = {wall_now(), (int64_t)step->valuedouble, v, n};
        uint8_t buf[2048];
        const size_t need = redo_scalars(&c, buf, sizeof buf);
        st = tb_append_event(tb, need, buf, sizeof buf, redo_scalars, &c);
    }
    cJSON_Delete(root);
    return st;
}

enum qc_status qc_tb_sync(struct qc_tb *tb)
{
    if (fflush(tb->f) != 0 || fsync(fileno(tb->f)) != 0)
        return qc_errorf(QC_ERR_IO, "tensorboard %s: sync failed: %s", tb->path, strerror(errno));
    return QC_OK;
}

void qc_tb_close(struct qc_tb *tb)
{
    if (!tb)
        return;
    if (tb->f) {
        if (fflush(tb->f) != 0 || fsync(fileno(tb->f)) != 0)
            qc_log(QC_LOG_WARN, "tensorboard %s: sync at close failed: %s", tb->path,
                   strerror(errno));
        fclose(tb->f);
    }
    free(tb);
}

const char *qc_tb_path(const struct qc_tb *tb)
{
    return tb->path;
}
