/*
 * prof_cuda.c — the profiler's CUDA half (compiled only when QC_HAVE_CUDA): a cudaEvent pair
 * around each op enqueued on a stream, resolved after the step onto the host's monotonic clock.
 *
 * Clock: at start, a reference event is recorded on the legacy stream and synchronized, and the
 * host clock read right after it: t_host(e) = ref_host + elapsed(ref, e). The error is the
 * synchronization latency (microseconds), the same for every event of the session.
 * Events come from a pool that grows on demand and is reused after each resolve.
 */
#include "qc_prof.h"

#include <stdlib.h>

#include <cuda_runtime.h>

#include "prof_internal.h"
#include "qc_cuda_check.h"

static cudaEvent_t *pool;    /* created events */
static int pool_n, pool_cap; /* created, capacity */
static int pool_used;        /* handed out since the last resolve */
static cudaEvent_t ref;
static bool ref_ok;
static int64_t ref_host;

void prof_cuda_start(void)
{
    ref_ok = false;
    if (!ref && cudaEventCreate(&ref) != cudaSuccess) {
        (void)cudaGetLastError();
        ref = NULL;
        return;
    }
    if (cudaEventRecord(ref, 0) == cudaSuccess && cudaEventSynchronize(ref) == cudaSuccess) {
        ref_host = qc_prof_now_ns();
        ref_ok = true;
    } else {
        (void)cudaGetLastError();
    }
}

void prof_cuda_reset(void)
{
    for (int i = 0; i < pool_n; i++)
        (void)cudaEventDestroy(pool[i]);
    free(pool);
    pool = NULL;
    pool_n = pool_cap = pool_used = 0;
}

/* An event recorded on stream now; NULL when none could be made (the op is then timed on the
 * host only). */
static void *event_mark(void *stream)
{
    if (!ref_ok)
        return NULL;
    if (pool_used == pool_n) {
        if (pool_n == pool_cap) {
            const int cap = pool_cap ? 2 * pool_cap : 1024;
            cudaEvent_t *p = realloc(pool, (size_t)cap * sizeof *p);
            if (!p)
                return NULL;
            pool = p;
            pool_cap = cap;
        }
        if (cudaEventCreate(&pool[pool_n]) != cudaSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        pool_n++;
    }
    cudaEvent_t e = pool[pool_used];
    if (cudaEventRecord(e, (cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    pool_used++;
    return (void *)e;
}

void qc_prof_op_begin_stream(struct qc_prof_mark *m, void *stream)
{
    qc_prof_op_begin(m);
    m->stream = stream;
    m->dev0 = event_mark(stream);
}

void qc_prof_op_end_stream(const struct qc_prof_mark *m, const struct qc_prof_op *op)
{
    void *dev1 = m->dev0 ? event_mark(m->stream) : NULL;
    qc_prof_op_end(m, op);
    if (!dev1)
        return;
    /* the event qc_prof_op_end just wrote is the calling thread's newest: move it to the
     * stream's track with the device times pending */
    struct qc_prof_event *e = prof_event_last();
    if (!e)
        return;
    e->dev[0] = m->dev0;
    e->dev[1] = dev1;
    e->pending = 1;
    e->track = prof_stream_track(m->stream);
}

struct resolve_ctx {
    enum qc_status st;
};

static void resolve_one(struct qc_prof_event *e, void *ctx)
{
    struct resolve_ctx *r = ctx;
    float a = 0.0f, b = 0.0f;
    enum qc_status st = QC_CUDA(cudaEventSynchronize((cudaEvent_t)e->dev[1]));
    if (st == QC_OK)
        st = QC_CUDA(cudaEventElapsedTime(&a, ref, (cudaEvent_t)e->dev[0]));
    if (st == QC_OK)
        st = QC_CUDA(cudaEventElapsedTime(&b, ref, (cudaEvent_t)e->dev[1]));
    if (st != QC_OK) {
        if (r->st == QC_OK)
            r->st = st;
        return;
    }
    e->t0 = ref_host + (int64_t)((double)a * 1e6);
    e->t1 = ref_host + (int64_t)((double)b * 1e6);
    e->pending = 0;
    e->dev[0] = e->dev[1] = NULL;
}

enum qc_status qc_prof_resolve(void)
{
    struct resolve_ctx r = {QC_OK};
    prof_foreach_pending(resolve_one, &r);
    pool_used = 0;
    return r.st;
}
