/*
 * steptrace.c — the allocation trace of chosen training steps (qc_steptrace.h; files in
 * docs/TRACE.md).
 *
 * Per step: begin() notes the allocator's event count, the time, and the step snapshot taken
 * by qc_alloc_reset_peak (what is live when the step starts: parameters, gradients, AdamW
 * moments, a staged batch); end() decides whether the step is kept (first / peak / every) and
 * only then reads the step's events from the ring, so a step that is not kept costs one
 * counter read. The index is rewritten (atomically) whenever the set of files changes.
 */
#include "qc_steptrace.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qc_file.h"
#include "qc_strbuf.h"
#include "qc_train.h" /* qc_train_mkdir */

#define REASON_FIRST 1u
#define REASON_PEAK  2u
#define REASON_EVERY 4u
#define REASON_OOM   8u  /* the step ran out of memory (and was re-planned, or failed) */
#define REASON_FAIL  16u /* the step failed: the run stopped there */
#define NREASONS     5

/* One kept step. */
struct kept_step {
    int64_t step;
    unsigned reasons;        /* REASON_* */
    uint64_t events, lost;   /* events in the file; events of the step the ring had dropped */
    uint64_t ooms;           /* allocations of the step that failed (QC_ERR_NOMEM) */
    int64_t replans;         /* the step's groups rolled back and re-planned */
    uint64_t file_bytes;     /* size of the step's file */
    uint64_t t_begin_ns;     /* CLOCK_MONOTONIC at begin (the events' clock) */
    uint64_t t_end_ns;       /* CLOCK_MONOTONIC at end */
    uint64_t allocated_peak; /* the step's allocated peak, bytes */
    uint64_t reserved_peak;  /* the step's reserved peak, bytes */
    uint64_t live_at_begin;  /* bytes allocated when the step began */
    uint64_t reserved_at_begin;
    uint32_t nblocks;                                        /* entries of blocks[] used */
    struct qc_alloc_tag_bytes blocks[QC_ALLOC_PEAK_TOP + 1]; /* live at begin, by block; the
                                                                 last may be "other" */
};

struct qc_steptrace {
    struct qc_alloc *a;
    char dir[4096]; /* RUN/trace */
    int64_t every;
    uint64_t max_bytes;
    bool started;       /* the previous process run's files are gone */
    bool warned_skip;   /* a step that did not fit was reported */
    int64_t nsteps_run; /* steps this process ran */
    uint64_t best_peak; /* largest allocated peak of a step so far */
    /* the step in progress */
    int64_t step;
    uint64_t count0, t0;
    uint64_t ooms0;  /* the allocator's run-wide failed allocations when the step began */
    bool failing;    /* qc_steptrace_end_failed: the step the run stops at */
    int64_t replans; /* qc_steptrace_mark_replans of the step */
    struct qc_alloc_peak_snapshot start;
    /* kept steps, in step order */
    struct kept_step *kept;
    int64_t nkept, capkept;
    struct qc_alloc_event *buf; /* [capbuf] events read from the ring */
    size_t capbuf;
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

enum qc_status qc_steptrace_create(struct qc_alloc *a, const char *run_dir, int64_t every,
                                   uint64_t max_bytes, struct qc_steptrace **out)
{
    struct qc_steptrace *s = calloc(1, sizeof *s);
    if (!s)
        return qc_errorf(QC_ERR_NOMEM, "trace: out of memory");
    const int n = snprintf(s->dir, sizeof s->dir, "%s/trace", run_dir);
    if (n < 0 || (size_t)n >= sizeof s->dir - 32) {
        free(s);
        return qc_errorf(QC_ERR_INVALID, "trace: run folder path too long: %s", run_dir);
    }
    s->a = a;
    s->every = every > 0 ? every : 0;
    s->max_bytes = max_bytes;
    s->step = -1;
    *out = s;
    return QC_OK;
}

void qc_steptrace_destroy(struct qc_steptrace *s)
{
    if (!s)
        return;
    free(s->kept);
    free(s->buf);
    free(s);
}

void qc_steptrace_begin(struct qc_steptrace *s, int64_t step)
{
    size_t n = 0;
    s->step = step;
    s->count0 = qc_alloc_trace_read(s->a, NULL, 0, &n);
    s->t0 = mono_ns();
    struct qc_alloc_stats as;
    qc_alloc_stats_get_run(s->a, &as);
    s->ooms0 = as.n_ooms;
    s->failing = false;
    s->replans = 0;
    qc_alloc_peak_snapshot_step(s->a, &s->start);
}

static void step_path(const struct qc_steptrace *s, int64_t step, char *out, size_t n)
{
    snprintf(out, n, "%s/step-%06" PRId64 ".qctrace", s->dir, step);
}

static const char *reason_names[NREASONS] = {"first", "peak", "every", "oom", "failed"};

/* Rewrites RUN/trace/index.json from the kept steps. */
static enum qc_status write_index(const struct qc_steptrace *s)
{
    struct qc_strbuf b = {0};
    qc_strbuf_printf(&b,
                     "{\n  \"format\": \"qctrain-trace-index\",\n  \"version\": 1,\n"
                     "  \"trace_every\": %" PRId64 ",\n  \"max_bytes\": %" PRIu64
                     ",\n  \"first_steps\": %d,\n  \"steps\": [",
                     s->every, s->max_bytes, QC_STEPTRACE_FIRST);
    for (int64_t i = 0; i < s->nkept; i++) {
        const struct kept_step *k = &s->kept[i];
        qc_strbuf_printf(&b,
                         "%s\n    {\"step\": %" PRId64 ", \"file\": \"step-%06" PRId64
                         ".qctrace\", \"reasons\": [",
                         i ? "," : "", k->step, k->step);
        int nr = 0;
        for (unsigned r = 0; r < NREASONS; r++)
            if (k->reasons & (1u << r))
                qc_strbuf_printf(&b, "%s\"%s\"", nr++ ? ", " : "", reason_names[r]);
        qc_strbuf_printf(
            &b,
            "], \"events\": %" PRIu64 ", \"events_lost\": %" PRIu64 ", \"oom_events\": %" PRIu64
            ", \"replans\": %" PRId64 ", \"file_bytes\": %" PRIu64 ", \"t_begin_ns\": %" PRIu64
            ", \"t_end_ns\": %" PRIu64 ", \"bytes_allocated_peak\": %" PRIu64
            ", \"bytes_reserved_peak\": %" PRIu64 ", \"bytes_allocated_at_begin\": %" PRIu64
            ", \"bytes_reserved_at_begin\": %" PRIu64 ",\n     \"live_at_begin\": [",
            k->events, k->lost, k->ooms, k->replans, k->file_bytes, k->t_begin_ns, k->t_end_ns,
            k->allocated_peak, k->reserved_peak, k->live_at_begin, k->reserved_at_begin);
        for (uint32_t j = 0; j < k->nblocks; j++) {
            qc_strbuf_puts(&b, j ? ", {\"name\": " : "{\"name\": ");
            qc_strbuf_json_str(&b, k->blocks[j].name);
            qc_strbuf_printf(&b, ", \"bytes\": %zu}", k->blocks[j].bytes);
        }
        qc_strbuf_puts(&b, "]}");
    }
    qc_strbuf_puts(&b, s->nkept ? "\n  ]\n}\n" : "]\n}\n");
    enum qc_status st = qc_strbuf_status(&b, "trace index");
    if (st == QC_OK) {
        char path[4200];
        snprintf(path, sizeof path, "%s/index.json", s->dir);
        const struct qc_file_part part = {b.p, b.len};
        st = qc_file_write_atomic(path, &part, 1, "trace index");
    }
    qc_strbuf_free(&b);
    return st;
}

/* Removes the step files and the index a previous process run left in RUN/trace/. */
static enum qc_status clear_previous(const struct qc_steptrace *s)
{
    DIR *d = opendir(s->dir);
    if (!d)
        return errno == ENOENT
                   ? QC_OK
                   : qc_errorf(QC_ERR_IO, "trace: folder %s: %s", s->dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        const size_t len = strlen(nm);
        const bool step_file =
            strncmp(nm, "step-", 5) == 0 && len > 13 && strcmp(nm + len - 8, ".qctrace") == 0;
        if (!step_file && strcmp(nm, "index.json") != 0)
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", s->dir, nm);
        if (unlink(path) != 0 && errno != ENOENT) {
            const int err = errno;
            closedir(d);
            return qc_errorf(QC_ERR_IO, "trace: removing %s: %s", path, strerror(err));
        }
    }
    closedir(d);
    return QC_OK;
}

static uint64_t kept_bytes(const struct qc_steptrace *s)
{
    uint64_t t = 0;
    for (int64_t i = 0; i < s->nkept; i++)
        t += s->kept[i].file_bytes;
    return t;
}

/* Forgets kept step i and removes its file. */
static enum qc_status drop_kept(struct qc_steptrace *s, int64_t i)
{
    char path[4200];
    step_path(s, s->kept[i].step, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        return qc_errorf(QC_ERR_IO, "trace: removing %s: %s", path, strerror(errno));
    memmove(&s->kept[i], &s->kept[i + 1], (size_t)(s->nkept - i - 1) * sizeof *s->kept);
    s->nkept--;
    return QC_OK;
}

/* Drops the oldest "every"-only steps until `need` more bytes fit. True when they fit. */
static bool make_room(struct qc_steptrace *s, uint64_t need, enum qc_status *st)
{
    *st = QC_OK;
    while (kept_bytes(s) + need > s->max_bytes) {
        int64_t victim = -1;
        for (int64_t i = 0; i < s->nkept && victim < 0; i++)
            if (s->kept[i].reasons == REASON_EVERY)
                victim = i;
        if (victim < 0)
            return false;
        *st = drop_kept(s, victim);
        if (*st != QC_OK)
            return false;
    }
    return true;
}

void qc_steptrace_mark_replans(struct qc_steptrace *s, int64_t replans)
{
    if (s && s->step >= 0 && replans > 0)
        s->replans += replans;
}

enum qc_status qc_steptrace_end_failed(struct qc_steptrace *s, uint64_t bytes_allocated_peak,
                                       uint64_t bytes_reserved_peak)
{
    if (s->step < 0)
        return QC_OK;
    s->failing = true;
    return qc_steptrace_end(s, bytes_allocated_peak, bytes_reserved_peak);
}

enum qc_status qc_steptrace_end(struct qc_steptrace *s, uint64_t bytes_allocated_peak,
                                uint64_t bytes_reserved_peak)
{
    if (s->step < 0)
        return QC_OK;
    const int64_t step = s->step;
    s->step = -1;
    unsigned reasons = 0;
    if (s->nsteps_run < QC_STEPTRACE_FIRST)
        reasons |= REASON_FIRST;
    if (s->nsteps_run == 0 || bytes_allocated_peak > s->best_peak)
        reasons |= REASON_PEAK;
    if (s->every > 0 && step % s->every == 0)
        reasons |= REASON_EVERY;
    /* a step that ran out of memory is kept whatever alloc.trace_every says: it is what the
     * report explains first */
    struct qc_alloc_stats as;
    qc_alloc_stats_get_run(s->a, &as);
    const uint64_t ooms = as.n_ooms - s->ooms0;
    if (ooms > 0 || s->replans > 0)
        reasons |= REASON_OOM;
    if (s->failing)
        reasons |= REASON_FAIL;
    s->nsteps_run++;
    if (bytes_allocated_peak > s->best_peak)
        s->best_peak = bytes_allocated_peak;
    if (!reasons || s->max_bytes == 0)
        return QC_OK;

    /* the step's events */
    size_t n = 0;
    const uint64_t count1 = qc_alloc_trace_read(s->a, NULL, 0, &n);
    const uint64_t in_step = count1 - s->count0;
    const uint64_t fit = s->max_bytes / sizeof(struct qc_alloc_event);
    const size_t want = (size_t)(in_step < fit ? in_step : fit);
    if (want > s->capbuf) {
        struct qc_alloc_event *p = realloc(s->buf, want * sizeof *p);
        if (!p)
            return qc_errorf(QC_ERR_NOMEM, "trace: out of memory (%zu events of step %" PRId64 ")",
                             want, step);
        s->buf = p;
        s->capbuf = want;
    }
    qc_alloc_trace_read(s->a, s->buf, want, &n);
    const uint64_t file_bytes = 64 + (uint64_t)n * sizeof(struct qc_alloc_event);

    if (!s->started) {
        QC_TRY(clear_previous(s));
        QC_TRY(qc_train_mkdir(s->dir));
        s->started = true;
    }
    /* a new peak: the previous peak step keeps its file only for another reason */
    if (reasons & REASON_PEAK) {
        for (int64_t i = 0; i < s->nkept; i++) {
            if (!(s->kept[i].reasons & REASON_PEAK))
                continue;
            s->kept[i].reasons &= ~REASON_PEAK;
            if (!s->kept[i].reasons)
                QC_TRY(drop_kept(s, i));
            break;
        }
    }
    enum qc_status st;
    if (!make_room(s, file_bytes, &st)) {
        QC_TRY(st);
        if (!s->warned_skip)
            qc_log(QC_LOG_WARN,
                   "trace: step %" PRId64 " (%" PRIu64 " bytes of trace) does not fit "
                   "alloc.trace_max_bytes (%" PRIu64 "); it is not kept",
                   step, file_bytes, s->max_bytes);
        s->warned_skip = true;
        return write_index(s);
    }
    if (s->nkept == s->capkept) {
        const int64_t cap = s->capkept ? 2 * s->capkept : 8;
        struct kept_step *p = realloc(s->kept, (size_t)cap * sizeof *p);
        if (!p)
            return qc_errorf(QC_ERR_NOMEM, "trace: out of memory");
        s->kept = p;
        s->capkept = cap;
    }
    char path[4200];
    step_path(s, step, path, sizeof path);
    QC_TRY(qc_alloc_trace_write_file(s->a, path, s->buf, n));
    struct kept_step *k = &s->kept[s->nkept++];
    memset(k, 0, sizeof *k);
    k->step = step;
    k->reasons = reasons;
    k->events = n;
    k->lost = in_step - n;
    k->ooms = ooms;
    k->replans = s->replans;
    k->file_bytes = file_bytes;
    k->t_begin_ns = s->t0;
    k->t_end_ns = mono_ns();
    k->allocated_peak = bytes_allocated_peak;
    k->reserved_peak = bytes_reserved_peak;
    k->live_at_begin = s->start.bytes_allocated;
    k->reserved_at_begin = s->start.bytes_reserved;
    for (uint32_t j = 0; j < s->start.ntop_blocks; j++)
        k->blocks[k->nblocks++] = s->start.blocks[j];
    if (s->start.block_other.bytes)
        k->blocks[k->nblocks++] = s->start.block_other;
    return write_index(s);
}
