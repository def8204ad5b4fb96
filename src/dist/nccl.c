/*
 * nccl.c — the NCCL backend of the communicator (device.kind cuda): one NCCL communicator over
 * the world, bootstrapped through MPI (rank 0's ncclGetUniqueId broadcast on the communication
 * thread), and a dedicated CUDA stream for every collective.
 *
 * A step: when backward reports a range final, an event is recorded on the compute stream, the
 * NCCL stream waits for it and the pieces now final are enqueued there (stages 0 and 1:
 * ncclAllReduce in place; stage 2: one ncclReduce per rank to that rank's chunk, grouped), so
 * they run while the compute stream goes on with the rest of backward. qc_dist_grads_end
 * records an event on the NCCL stream and makes the compute stream wait for it; the parameter
 * all-gather of stages 1 and 2 is one grouped ncclBroadcast per rank's shard (shards differ in
 * size by a few elements, which ncclAllGather cannot express), in stream order after AdamW.
 *
 * Timing without synchronising: host functions on the streams take timestamps (first piece
 * started, last piece done, backward done on the compute stream, all-gather start and end);
 * qc_dist_step_end folds them into the statistics once the step's work is complete.
 *
 * Failures: NCCL kernels wait forever on a peer that died. From the first collective of a step
 * to qc_dist_step_end the communication thread "watches": it pings every peer and polls
 * ncclCommGetAsyncError; a silent peer or an error ends the job after ncclCommAbort.
 *
 * Determinism: NCCL picks its algorithm (ring, tree) and protocol from the topology, so the
 * summation order is NCCL's, not the rank order of the MPI backend; it is fixed for a given
 * machine, world size, NCCL version and NCCL_ALGO / NCCL_PROTO (docs/DISTRIBUTED.md).
 */
#include "dist_internal.h"

#ifdef QC_HAVE_CUDA

#    include <stdlib.h>
#    include <string.h>

#    include <nccl.h>

#    include "qc_device.h"

struct dist_nccl {
    ncclComm_t comm;
    bool comm_ok;
    struct qc_stream *stream;  /* the collectives' stream */
    struct qc_event *ev_ready; /* compute stream: a range of gradients is final */
    struct qc_event *ev_done;  /* NCCL stream: the step's reduction (or all-gather) is done */
    bool started;              /* a piece was enqueued this step */
    /* host-function timestamps of the step (written by CUDA's callback thread) */
    double t_first, t_last, t_backward, t_params0, t_params1;
};

static enum qc_status nccl_check(struct dist_nccl *n, ncclResult_t r, const char *call)
{
    if (r == ncclSuccess)
        return QC_OK;
    const char *last = n && n->comm_ok ? ncclGetLastError(n->comm) : ncclGetLastError(NULL);
    return qc_errorf(QC_ERR_CUDA, "dist: %s failed: %s%s%s", call, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
}

#    define NCCL_TRY(n, call) QC_TRY(nccl_check((n), (call), #    call))

static cudaStream_t native(struct qc_stream *s)
{
    return (cudaStream_t)qc_stream_native(s);
}

static void stamp(void *p)
{
    *(double *)p = dist_now();
}

_Static_assert(sizeof(ncclUniqueId) == DIST_NCCL_ID_BYTES, "DIST_NCCL_ID_BYTES is not nccl.h's");

enum qc_status dist_nccl_create(struct qc_dist *d, void *id)
{
    struct dist_nccl *n = calloc(1, sizeof(*n));
    if (!n)
        return qc_errorf(QC_ERR_NOMEM, "dist: out of memory");
    d->nccl = n;
    if (!d->o.dev || !d->o.compute)
        return qc_errorf(QC_ERR_INVALID, "dist: the NCCL backend needs the device and its "
                                         "compute stream");
    if (d->rank == 0) {
        ncclUniqueId uid;
        memset(&uid, 0, sizeof(uid));
        NCCL_TRY(n, ncclGetUniqueId(&uid));
        memcpy(id, &uid, sizeof(uid));
    }
    return QC_OK;
}

enum qc_status dist_nccl_join(struct qc_dist *d, const void *id)
{
    struct dist_nccl *n = d->nccl;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof(uid));
    /* ncclCommInitRank blocks until every rank joined: watched like a collective */
    pthread_mutex_lock(&d->mu);
    d->watch = true;
    pthread_mutex_unlock(&d->mu);
    const ncclResult_t r = ncclCommInitRank(&n->comm, d->size, uid, d->rank);
    pthread_mutex_lock(&d->mu);
    d->watch = false;
    pthread_mutex_unlock(&d->mu);
    if (r != ncclSuccess)
        return qc_error_wrap(nccl_check(n, r, "ncclCommInitRank"),
                             "dist: rank %d cannot join the NCCL communicator\nhint: NCCL refuses "
                             "two ranks on one GPU (\"Duplicate GPU\"): one rank per GPU, "
                             "device.ordinal + local rank picks it",
                             d->rank);
    n->comm_ok = true;
    QC_TRY(qc_stream_create(d->o.dev, QC_STREAM_COMPUTE, &n->stream));
    QC_TRY(qc_event_create(d->o.dev, &n->ev_ready));
    QC_TRY(qc_event_create(d->o.dev, &n->ev_done));
    return QC_OK;
}

void dist_nccl_destroy(struct qc_dist *d, bool abort)
{
    struct dist_nccl *n = d->nccl;
    if (!n)
        return;
    if (n->comm_ok) {
        if (abort)
            (void)ncclCommAbort(n->comm);
        else
            (void)ncclCommDestroy(n->comm);
    }
    qc_stream_destroy(n->stream);
    qc_event_destroy(n->ev_ready);
    qc_event_destroy(n->ev_done);
    free(n);
    d->nccl = NULL;
}

/* The NCCL stream continues after the compute stream's work so far. */
static enum qc_status after_compute(struct qc_dist *d)
{
    struct dist_nccl *n = d->nccl;
    QC_TRY(qc_event_record(n->ev_ready, d->o.compute));
    return qc_stream_wait_event(n->stream, n->ev_ready);
}

/* Enqueues the reduction of one piece [lo, hi) of the gradients. */
static enum qc_status piece(struct qc_dist *d, int64_t lo, int64_t hi)
{
    struct dist_nccl *n = d->nccl;
    float *g = d->grads;
    if (d->o.zero_stage < 2) {
        NCCL_TRY(n, ncclAllReduce(g + lo, g + lo, (size_t)(hi - lo), ncclFloat, ncclSum, n->comm,
                                  native(n->stream)));
        return QC_OK;
    }
    NCCL_TRY(n, ncclGroupStart());
    for (int q = 0; q < d->size; q++) {
        int64_t slo, shi;
        qc_dist_shard_range(d->o.numel, d->size, q, &slo, &shi);
        const int64_t a = slo > lo ? slo : lo, b = shi < hi ? shi : hi;
        if (b > a) {
            const ncclResult_t r = ncclReduce(g + a, g + a, (size_t)(b - a), ncclFloat, ncclSum, q,
                                              n->comm, native(n->stream));
            if (r != ncclSuccess) {
                (void)ncclGroupEnd();
                return nccl_check(n, r, "ncclReduce");
            }
        }
    }
    NCCL_TRY(n, ncclGroupEnd());
    return QC_OK;
}

enum qc_status dist_nccl_pieces(struct qc_dist *d, int64_t first, int64_t last)
{
    struct dist_nccl *n = d->nccl;
    QC_TRY(after_compute(d));
    if (!n->started) {
        n->started = true;
        n->t_first = n->t_last = n->t_backward = n->t_params0 = n->t_params1 = 0;
        QC_TRY(qc_stream_host_func(n->stream, stamp, &n->t_first));
    }
    for (int64_t k = first; k < last; k++) {
        const int64_t lo = d->layout[2 * k], hi = d->layout[2 * k + 1];
        QC_TRY(piece(d, lo, hi));
        pthread_mutex_lock(&d->mu);
        d->stats.bytes_sent +=
            (uint64_t)(hi - lo) * sizeof(float) * 2u * (uint64_t)(d->size - 1) / (uint64_t)d->size;
        pthread_mutex_unlock(&d->mu);
    }
    return QC_OK;
}

enum qc_status dist_nccl_settle(struct qc_dist *d)
{
    struct dist_nccl *n = d->nccl;
    QC_TRY(qc_event_record(n->ev_done, n->stream));
    return qc_stream_wait_event(d->o.compute, n->ev_done);
}

enum qc_status dist_nccl_end(struct qc_dist *d)
{
    struct dist_nccl *n = d->nccl;
    QC_TRY(qc_stream_host_func(d->o.compute, stamp, &n->t_backward));
    QC_TRY(qc_stream_host_func(n->stream, stamp, &n->t_last));
    QC_TRY(qc_event_record(n->ev_done, n->stream));
    return qc_stream_wait_event(d->o.compute, n->ev_done);
}

enum qc_status dist_nccl_params(struct qc_dist *d, float *params)
{
    struct dist_nccl *n = d->nccl;
    QC_TRY(after_compute(d));
    QC_TRY(qc_stream_host_func(n->stream, stamp, &n->t_params0));
    NCCL_TRY(n, ncclGroupStart());
    for (int q = 0; q < d->size; q++) {
        int64_t lo, hi;
        qc_dist_shard_range(d->o.numel, d->size, q, &lo, &hi);
        if (hi <= lo)
            continue;
        const ncclResult_t r = ncclBroadcast(params + lo, params + lo, (size_t)(hi - lo), ncclFloat,
                                             q, n->comm, native(n->stream));
        if (r != ncclSuccess) {
            (void)ncclGroupEnd();
            return nccl_check(n, r, "ncclBroadcast");
        }
    }
    NCCL_TRY(n, ncclGroupEnd());
    pthread_mutex_lock(&d->mu);
    /* this rank's shard to each of the W - 1 others (a ring forwards as much: the MPI backend's
     * count) */
    d->stats.bytes_sent +=
        (uint64_t)(d->shard_hi - d->shard_lo) * sizeof(float) * (uint64_t)(d->size - 1);
    pthread_mutex_unlock(&d->mu);
    QC_TRY(qc_stream_host_func(n->stream, stamp, &n->t_params1));
    QC_TRY(qc_event_record(n->ev_done, n->stream));
    return qc_stream_wait_event(d->o.compute, n->ev_done);
}

void dist_nccl_step_end(struct qc_dist *d)
{
    struct dist_nccl *n = d->nccl;
    if (!n->started)
        return;
    n->started = false;
    pthread_mutex_lock(&d->mu);
    if (n->t_last > n->t_first && n->t_first > 0)
        d->stats.grads_coll_s += n->t_last - n->t_first;
    if (n->t_last > n->t_backward && n->t_backward > 0)
        d->stats.grads_wait_s += n->t_last - n->t_backward;
    if (n->t_params1 > n->t_params0 && n->t_params0 > 0)
        d->stats.params_s += n->t_params1 - n->t_params0;
    pthread_mutex_unlock(&d->mu);
}

const char *dist_nccl_async_error(struct qc_dist *d)
{
    struct dist_nccl *n = d->nccl;
    if (!n || !n->comm_ok)
        return NULL;
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(n->comm, &r) != ncclSuccess || r == ncclSuccess)
        return NULL;
    return ncclGetErrorString(r);
}

void dist_nccl_abort(struct qc_dist *d)
{
    struct dist_nccl *n = d->nccl;
    if (n && n->comm_ok) {
        (void)ncclCommAbort(n->comm);
        n->comm_ok = false;
    }
}

#else /* no CUDA: the backend does not exist in this build */

enum qc_status dist_nccl_create(struct qc_dist *d, void *id)
{
    (void)d;
    (void)id;
    return qc_errorf(QC_ERR_UNSUPPORTED, "dist: NCCL needs a CUDA build\nhint: device.kind cpu "
                                         "uses the MPI backend");
}

enum qc_status dist_nccl_join(struct qc_dist *d, const void *id)
{
    (void)d;
    (void)id;
    return qc_errorf(QC_ERR_UNSUPPORTED, "dist: NCCL needs a CUDA build");
}

void dist_nccl_destroy(struct qc_dist *d, bool abort)
{
    (void)d;
    (void)abort;
}

enum qc_status dist_nccl_pieces(struct qc_dist *d, int64_t first, int64_t last)
{
    (void)d;
    (void)first;
    (void)last;
    return qc_errorf(QC_ERR_UNSUPPORTED, "dist: NCCL needs a CUDA build");
}

enum qc_status dist_nccl_end(struct qc_dist *d)
{
    (void)d;
    return qc_errorf(QC_ERR_UNSUPPORTED, "dist: NCCL needs a CUDA build");
}

enum qc_status dist_nccl_settle(struct qc_dist *d)
{
    (void)d;
    return qc_errorf(QC_ERR_UNSUPPORTED, "dist: NCCL needs a CUDA build");
}

enum qc_status dist_nccl_params(struct qc_dist *d, float *params)
{
    (void)d;
    (void)params;
    return qc_errorf(QC_ERR_UNSUPPORTED, "dist: NCCL needs a CUDA build");
}

void dist_nccl_step_end(struct qc_dist *d)
{
    (void)d;
}

const char *dist_nccl_async_error(struct qc_dist *d)
{
    (void)d;
    return NULL;
}

void dist_nccl_abort(struct qc_dist *d)
{
    (void)d;
}

#endif
