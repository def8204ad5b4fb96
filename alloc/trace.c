/*
 * trace.c — the allocation trace: a ring of the newest events (always, when tracing is on) and
 * optionally a binary file with every event (format in docs/TRACE.md: a 64-byte header, then
 * 128-byte little-endian records, exactly struct qc_alloc_event).
 */
#include "alloc_internal.h"

#include "qc_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qc_prof.h"

#define TRACE_MAGIC   "QCTRACE1"
#define TRACE_VERSION 1u

_Static_assert(sizeof(struct qc_alloc_event) == 128, "trace record must be 128 bytes");

/* The file header (docs/TRACE.md). */
struct trace_header {
    char magic[8];        /* "QCTRACE1" */
    uint32_t version;     /* 1 */
    uint32_t record_size; /* 128 */
    uint64_t t0_ns;       /* CLOCK_MONOTONIC when the allocator was created */
    uint64_t budget;      /* params.budget */
    uint64_t round;       /* params.round */
    uint32_t expandable;  /* params.expandable */
    uint32_t pad0;
    uint64_t pad1[2];
};
_Static_assert(sizeof(struct trace_header) == 64, "trace header must be 64 bytes");

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *qc_alloc_event_kind_str(enum qc_alloc_event_kind kind)
{
    switch (kind) {
    case QC_ALLOC_EV_ALLOC:
        return "alloc";
    case QC_ALLOC_EV_FREE:
        return "free";
    case QC_ALLOC_EV_READY:
        return "ready";
    case QC_ALLOC_EV_MAP:
        return "map";
    case QC_ALLOC_EV_UNMAP:
        return "unmap";
    case QC_ALLOC_EV_OOM:
        return "oom";
    case QC_ALLOC_EV_STEP:
        return "step";
    case QC_ALLOC_EV_OFFLOAD_PUT:
        return "offload_put";
    case QC_ALLOC_EV_OFFLOAD_GET:
        return "offload_get";
    case QC_ALLOC_EV_RECOMPUTE:
        return "recompute";
    }
    return "?";
}

static void trace_header_fill(struct trace_header *h, uint64_t t0_ns,
                              const struct qc_alloc_params *p)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, TRACE_MAGIC, 8);
    h->version = TRACE_VERSION;
    h->record_size = sizeof(struct qc_alloc_event);
    h->t0_ns = t0_ns;
    h->budget = p->budget;
    h->round = p->round;
    h->expandable = p->expandable;
}

enum qc_status alloc_trace_init(struct alloc_trace *t, const struct qc_alloc_params *p)
{
    memset(t, 0, sizeof *t);
    t->t0_ns = now_ns();
    if (!p->trace)
        return QC_OK;
    t->ring = calloc(p->trace_capacity, sizeof *t->ring);
    if (!t->ring)
        return qc_errorf(QC_ERR_NOMEM, "allocator trace: no host memory for %zu events",
                         p->trace_capacity);
    t->capacity = p->trace_capacity;
    if (!p->trace_file)
        return QC_OK;
    t->file = fopen(p->trace_file, "wb");
    if (!t->file) {
        int e = errno;
        free(t->ring);
        t->ring = NULL;
        return qc_errorf(QC_ERR_IO, "allocator trace file %s: %s\nhint: check the directory",
                         p->trace_file, strerror(e));
    }
    struct trace_header h;
    trace_header_fill(&h, t->t0_ns, p);
    if (fwrite(&h, sizeof h, 1, t->file) != 1) {
        fclose(t->file);
        free(t->ring);
        memset(t, 0, sizeof *t);
        return qc_errorf(QC_ERR_IO, "allocator trace file %s: write failed", p->trace_file);
    }
    return QC_OK;
}

void alloc_trace_deinit(struct alloc_trace *t)
{
    if (t->file && fclose(t->file) != 0)
        qc_log(QC_LOG_WARN, "alloc: closing the trace file: %s", strerror(errno));
    free(t->ring);
    memset(t, 0, sizeof *t);
}

/* The profiler's instant event (qc_prof.h): what happened, the tag, the block's bytes and the
 * bytes allocated after it (a counter track in the trace). */
static void alloc_prof_event(const struct qc_alloc *a, enum qc_alloc_event_kind kind, size_t size,
                             const char *tag)
{
    static const char *const names[] = {"?",         "alloc_malloc", "alloc_free", "alloc_ready",
                                        "alloc_map", "alloc_unmap",  "alloc_oom",  "alloc_step"};
    const char *name = (size_t)kind < sizeof names / sizeof *names ? names[kind] : "alloc_event";
    qc_prof_instant(QC_PROF_CAT_ALLOC, name, tag, (double)size, (double)a->st.bytes_allocated);
}

void alloc_trace_event(struct qc_alloc *a, enum qc_alloc_event_kind kind, const void *addr,
                       size_t size, size_t requested, uint32_t stream, int pool, const char *tag)
{
    if (qc_prof_on())
        alloc_prof_event(a, kind, size, tag);
    struct alloc_trace *t = &a->trace;
    if (!t->ring)
        return;
    struct qc_alloc_event *e = &t->ring[t->count % t->capacity];
    t->count++;
    e->t_ns = now_ns();
    e->addr = (uint64_t)(uintptr_t)addr;
    e->size = size;
    e->requested = requested;
    e->step = a->st.step;
    e->bytes_allocated = a->st.bytes_allocated;
    e->bytes_reserved = a->st.bytes_reserved;
    e->stream = stream;
    e->kind = (uint16_t)kind;
    e->pool = (uint16_t)pool;
    memset(e->tag, 0, sizeof e->tag);
    if (tag)
        memcpy(e->tag, tag, strnlen(tag, sizeof e->tag - 1));
    if (t->file && !t->file_error && fwrite(e, sizeof *e, 1, t->file) != 1) {
        t->file_error = true;
        qc_log(QC_LOG_WARN, "alloc: trace file write failed; the file trace stops here");
    }
}

void qc_alloc_trace_mark(struct qc_alloc *a, enum qc_alloc_event_kind kind, const void *addr,
                         size_t size, uint32_t stream, int tier, const char *tag)
{
    if (!a)
        return;
    QC_ASSERT(kind >= QC_ALLOC_EV_OFFLOAD_PUT && kind <= QC_ALLOC_EV_RECOMPUTE,
              "alloc: trace mark of kind %d", (int)kind);
    pthread_mutex_lock(&a->lock);
    alloc_trace_event(a, kind, addr, size, 0, stream, tier, tag);
    pthread_mutex_unlock(&a->lock);
}

uint64_t qc_alloc_trace_read(struct qc_alloc *a, struct qc_alloc_event *out, size_t max, size_t *n)
{
    pthread_mutex_lock(&a->lock);
    struct alloc_trace *t = &a->trace;
    uint64_t avail = t->count < t->capacity ? t->count : t->capacity;
    size_t k = avail < max ? (size_t)avail : max;
    for (size_t i = 0; i < k; i++)
        out[i] = t->ring[(t->count - k + i) % t->capacity];
    uint64_t count = t->count;
    pthread_mutex_unlock(&a->lock);
    *n = k;
    return count;
}

enum qc_status qc_alloc_trace_flush(struct qc_alloc *a)
{
    pthread_mutex_lock(&a->lock);
    enum qc_status st = QC_OK;
    if (a->trace.file && (fflush(a->trace.file) != 0 || a->trace.file_error))
        st = qc_errorf(QC_ERR_IO, "allocator trace file: write failed");
    pthread_mutex_unlock(&a->lock);
    return st;
}

enum qc_status qc_alloc_trace_write_file(struct qc_alloc *a, const char *path,
                                         const struct qc_alloc_event *ev, size_t n)
{
    struct trace_header h;
    trace_header_fill(&h, a->trace.t0_ns, &a->params);
    const struct qc_file_part parts[2] = {{&h, sizeof h}, {ev, n * sizeof *ev}};
    return qc_file_write_atomic(path, parts, 2, "trace");
}

enum qc_status qc_alloc_trace_load(const char *path, struct qc_alloc_event **events, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return qc_errorf(QC_ERR_IO, "trace %s: %s", path, strerror(errno));
    struct trace_header h;
    enum qc_status st = QC_OK;
    struct qc_alloc_event *ev = NULL;
    size_t count = 0, cap = 0;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, TRACE_MAGIC, 8) != 0)
        st =
            qc_errorf(QC_ERR_INVALID, "trace %s: not a qctrain allocator trace (bad header)", path);
    else if (h.version != TRACE_VERSION || h.record_size != sizeof(struct qc_alloc_event))
        st = qc_errorf(QC_ERR_INVALID, "trace %s: version %u record size %u (want %u, %zu)", path,
                       h.version, h.record_size, TRACE_VERSION, sizeof(struct qc_alloc_event));
    while (st == QC_OK) {
        if (count == cap) {
            size_t ncap = cap ? 2 * cap : 1024;
            struct qc_alloc_event *p = realloc(ev, ncap * sizeof *p);
            if (!p) {
                st = qc_errorf(QC_ERR_NOMEM, "trace %s: out of host memory", path);
                break;
            }
            ev = p;
            cap = ncap;
        }
        size_t got = fread(&ev[count], 1, sizeof *ev, f);
        if (got == 0)
            break;
        if (got != sizeof *ev) {
            st = qc_errorf(QC_ERR_INVALID, "trace %s: record %zu: truncated (%zu of %zu bytes)",
                           path, count, got, sizeof *ev);
            break;
        }
        ev[count].tag[sizeof ev[count].tag - 1] = '\0';
        count++;
    }
    if (st == QC_OK && ferror(f))
        st = qc_errorf(QC_ERR_IO, "trace %s: read error", path);
    fclose(f);
    if (st != QC_OK) {
        free(ev);
        return st;
    }
    *events = ev;
    *n = count;
    return QC_OK;
}
