/*
 * comm.c — the communication thread: it runs the posted jobs in order with non-blocking MPI,
 * sums every gradient chunk in rank order, answers heartbeats, and is the watchdog that ends
 * the job when a peer goes away.
 *
 * A gradient piece [lo, hi) is reduced in two rounds, "direct" (every rank talks to every
 * rank): the piece is cut into one chunk per rank (stages 0 and 1: equal parts; stage 2: the
 * piece's intersection with each rank's shard); each rank sends every other rank that rank's
 * chunk of its own gradients and sums the W contributions of its own chunk in rank order
 * (qc_dist_sum_rank_order); below stage 2 each rank then sends its summed chunk to every rank.
 * Per rank that is 2 (W−1)/W of the piece sent and received, as a ring, but the summation order
 * is rank 0, 1, ..., W−1 for every element whatever W, the piece size or the timing: the bits
 * are those of one rank accumulating the W contributions in that order.
 *
 * Waiting (comm_wait): MPI_Testsome over the job's requests, a short sleep that doubles up to
 * 1 ms when nothing moves, and heartbeats: every peer the job still waits on is pinged once per
 * hb_interval after it has been silent that long; a peer silent for dist.timeout has gone away.
 * Anything a peer sends (data, ping, pong) counts as hearing from it, so a rank that is only
 * slow (busy computing, writing a checkpoint) keeps answering from its own communication
 * thread and is never declared gone. The thread polls heartbeats while idle too (every 20 ms).
 */
#include "dist_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_POLL_S  0.02
#define MAX_SLEEP_US 1000

static const int ping_token = 1, pong_token = 2; /* never written: safe for freed sends */

double dist_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// ---- failure -----------------------------------------------------------------------------------

_Noreturn void dist_fail(struct qc_dist *d, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "qctrain: error: rank %d of %d: %s\n", d->rank, d->size, msg);
    fflush(stderr);
    if (d->nccl)
        dist_nccl_abort(d);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort(); /* MPI_Abort does not return */
}

static void fail_mpi(struct qc_dist *d, int rc, int peer, const char *what)
{
    char es[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, es, &len);
    dist_fail(d,
              "dist: MPI error while %s with rank %d (pid %d on %s): %s\nhint: that rank "
              "probably died; its output or the launcher's says why",
              what, peer, d->peers ? d->peers[peer].pid : 0, d->peers ? d->peers[peer].host : "?",
              es);
}

static void fail_gone(struct qc_dist *d, int peer, double silent_s, const char *what)
{
    dist_fail(d,
              "dist: rank %d (pid %d on %s) went away: nothing from it for %.1f s "
              "(dist.timeout %.3g s) while %s at step %lld; it was killed, ran out of memory, "
              "stopped or hangs\nhint: its own output or the launcher's says why; if it is only "
              "slow, raise dist.timeout",
              peer, d->peers ? d->peers[peer].pid : 0, d->peers ? d->peers[peer].host : "?",
              silent_s, d->o.timeout_s, what, (long long)d->step_no);
}

// ---- heartbeats --------------------------------------------------------------------------------

static void hb_post(struct qc_dist *d)
{
    const int rc =
        MPI_Irecv(&d->hb_buf, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, d->hb, &d->hb_req);
    if (rc != MPI_SUCCESS)
        fail_mpi(d, rc, d->rank, "posting the heartbeat receive");
    d->hb_posted = true;
}

/* Answers pings and notes pongs, until nothing is pending. */
static void hb_service(struct qc_dist *d)
{
    for (;;) {
        int flag = 0;
        MPI_Status s;
        const int rc = MPI_Test(&d->hb_req, &flag, &s);
        if (rc != MPI_SUCCESS)
            fail_mpi(d, rc, d->rank, "receiving heartbeats");
        if (!flag)
            return;
        const int src = s.MPI_SOURCE;
        if (src >= 0 && src < d->size) {
            d->heard[src] = dist_now();
            if (s.MPI_TAG == DIST_TAG_PING) {
                MPI_Request r;
                if (MPI_Isend(&pong_token, 1, MPI_INT, src, DIST_TAG_PONG, d->hb, &r) ==
                    MPI_SUCCESS)
                    MPI_Request_free(&r);
            }
        }
        hb_post(d);
    }
}

/* Pings peer p when it has been silent for hb_interval (once per interval); fails when it has
 * been silent for the timeout. */
static void hb_check(struct qc_dist *d, int p, double t, const char *what)
{
    const double silent = t - d->heard[p];
    if (silent > d->o.timeout_s)
        fail_gone(d, p, silent, what);
    if (silent > d->hb_interval && t - d->pinged[p] > d->hb_interval) {
        MPI_Request r;
        if (MPI_Isend(&ping_token, 1, MPI_INT, p, DIST_TAG_PING, d->hb, &r) == MPI_SUCCESS)
            MPI_Request_free(&r);
        d->pinged[p] = t;
    }
}

static bool stop_requested(struct qc_dist *d)
{
    return __atomic_load_n(&d->stop, __ATOMIC_ACQUIRE);
}

/* Waits for the n requests of d->reqs (peer of each in d->req_peer). Returns false when the
 * process is stopping (the job is abandoned); never returns when a peer has gone away. */
static bool comm_wait(struct qc_dist *d, int n, const char *what)
{
    const double t0 = dist_now();
    int left = 0;
    for (int i = 0; i < n; i++) {
        if (d->reqs[i] == MPI_REQUEST_NULL)
            continue;
        left++;
        if (d->heard[d->req_peer[i]] < t0)
            d->heard[d->req_peer[i]] = t0; /* silence counts from the start of the wait */
    }
    long sleep = 0;
    while (left > 0) {
        int outcount = 0;
        const int rc = MPI_Testsome(n, d->reqs, &outcount, d->idx, d->sts);
        if (rc != MPI_SUCCESS) {
            for (int k = 0; k < outcount && k < n; k++)
                if (d->sts[k].MPI_ERROR != MPI_SUCCESS)
                    fail_mpi(d, d->sts[k].MPI_ERROR, d->req_peer[d->idx[k]], what);
            fail_mpi(d, rc, d->req_peer[0], what);
        }
        if (outcount == MPI_UNDEFINED)
            break;
        const double t = dist_now();
        for (int k = 0; k < outcount; k++)
            d->heard[d->req_peer[d->idx[k]]] = t;
        left -= outcount;
        hb_service(d);
        if (left == 0)
            break;
        if (stop_requested(d))
            return false;
        for (int i = 0; i < n; i++)
            if (d->reqs[i] != MPI_REQUEST_NULL)
                hb_check(d, d->req_peer[i], t, what);
        if (outcount > 0) {
            sleep = 0;
        } else {
            sleep = sleep ? (sleep * 2 > MAX_SLEEP_US ? MAX_SLEEP_US : sleep * 2) : 10;
            sleep_us(sleep);
        }
    }
    return true;
}

// ---- requests
// ------------------------------------------------------------------------------------

static int mpi_count(struct qc_dist *d, int64_t n)
{
    if (n > INT_MAX)
        dist_fail(d, "dist: message of %lld elements exceeds MPI's int count", (long long)n);
    return (int)n;
}

static void add_recv(struct qc_dist *d, int *n, void *buf, int64_t count, MPI_Datatype t, int peer,
                     int tag)
{
    const int rc = MPI_Irecv(buf, mpi_count(d, count), t, peer, tag, d->data, &d->reqs[*n]);
    if (rc != MPI_SUCCESS)
        fail_mpi(d, rc, peer, "posting a receive");
    d->req_peer[(*n)++] = peer;
}

static void add_send(struct qc_dist *d, int *n, const void *buf, int64_t count, MPI_Datatype t,
                     int peer, int tag, size_t elem_bytes)
{
    const int rc = MPI_Isend(buf, mpi_count(d, count), t, peer, tag, d->data, &d->reqs[*n]);
    if (rc != MPI_SUCCESS)
        fail_mpi(d, rc, peer, "posting a send");
    d->req_peer[(*n)++] = peer;
    pthread_mutex_lock(&d->mu);
    d->stats.bytes_sent += (uint64_t)count * elem_bytes;
    pthread_mutex_unlock(&d->mu);
}

static void scratch_reserve(struct qc_dist *d, size_t floats)
{
    if (floats <= d->scratch_cap)
        return;
    float *p = realloc(d->scratch, floats * sizeof(float));
    if (!p)
        dist_fail(d, "dist: out of memory for %zu bytes of receive buffers",
                  floats * sizeof(float));
    d->scratch = p;
    d->scratch_cap = floats;
    pthread_mutex_lock(&d->mu);
    if (floats * sizeof(float) > d->stats.scratch_bytes)
        d->stats.scratch_bytes = floats * sizeof(float);
    pthread_mutex_unlock(&d->mu);
}

// ---- jobs --------------------------------------------------------------------------------------

/* Chunk boundaries of a piece: c[q] .. c[q+1] is rank q's chunk (module comment). */
static void piece_chunks(const struct qc_dist *d, int64_t lo, int64_t hi, int64_t *c)
{
    const int W = d->size;
    for (int q = 0; q < W; q++) {
        if (d->o.zero_stage < 2) {
            c[q] = lo + (hi - lo) * q / W;
        } else {
            int64_t slo, shi;
            qc_dist_shard_range(d->o.numel, W, q, &slo, &shi);
            c[q] = slo < lo ? lo : (slo > hi ? hi : slo);
        }
    }
    c[W] = hi;
}

static bool run_piece(struct qc_dist *d, struct dist_job *j)
{
    const int W = d->size, r = d->rank;
    int64_t *c = d->chunk;
    piece_chunks(d, j->lo, j->hi, c);
    const int64_t m = c[r + 1] - c[r];
    scratch_reserve(d, (size_t)(W - 1) * (size_t)m);
    float *g = j->f;
    /* round 1: every rank's chunk of my gradients to it; my chunk of everyone's to me (peer q's
     * in receive slot q, or q - 1 past my own rank) */
    int n = 0;
    for (int q = 0; q < W; q++)
        if (q != r && m > 0)
            add_recv(d, &n, d->scratch + (size_t)(q < r ? q : q - 1) * (size_t)m, m, MPI_FLOAT, q,
                     DIST_TAG_RS);
    for (int q = 0; q < W; q++)
        if (q != r && c[q + 1] > c[q])
            add_send(d, &n, g + c[q], c[q + 1] - c[q], MPI_FLOAT, q, DIST_TAG_RS, sizeof(float));
    if (!comm_wait(d, n, "reducing gradients"))
        return false;
    if (m > 0) {
        for (int q = 0; q < W; q++)
            d->srcs[q] = q == r ? g + c[r] : d->scratch + (size_t)(q < r ? q : q - 1) * (size_t)m;
        qc_dist_sum_rank_order(g + c[r], d->srcs, W, m);
    }
    if (d->o.zero_stage >= 2)
        return true;
    /* round 2: my summed chunk to every rank; theirs into my gradients */
    n = 0;
    for (int q = 0; q < W; q++)
        if (q != r && c[q + 1] > c[q])
            add_recv(d, &n, g + c[q], c[q + 1] - c[q], MPI_FLOAT, q, DIST_TAG_AG);
    for (int q = 0; q < W; q++)
        if (q != r && m > 0)
            add_send(d, &n, g + c[r], m, MPI_FLOAT, q, DIST_TAG_AG, sizeof(float));
    return comm_wait(d, n, "gathering reduced gradients");
}

static bool run_params(struct qc_dist *d, struct dist_job *j)
{
    const int W = d->size, r = d->rank;
    const int64_t m = d->shard_hi - d->shard_lo;
    int n = 0;
    for (int q = 0; q < W; q++) {
        if (q == r)
            continue;
        int64_t lo, hi;
        qc_dist_shard_range(d->o.numel, W, q, &lo, &hi);
        if (hi > lo)
            add_recv(d, &n, j->f + lo, hi - lo, MPI_FLOAT, q, DIST_TAG_PARAMS);
    }
    for (int q = 0; q < W; q++)
        if (q != r && m > 0)
            add_send(d, &n, j->f + d->shard_lo, m, MPI_FLOAT, q, DIST_TAG_PARAMS, sizeof(float));
    return comm_wait(d, n, "gathering parameter shards");
}

static bool run_allgather(struct qc_dist *d, struct dist_job *j)
{
    const int W = d->size, r = d->rank;
    char *dst = j->dst;
    if (j->bytes)
        memcpy(dst + (size_t)r * j->bytes, j->src, j->bytes);
    int n = 0;
    for (int q = 0; q < W; q++)
        if (q != r)
            add_recv(d, &n, dst + (size_t)q * j->bytes, (int64_t)j->bytes, MPI_BYTE, q,
                     DIST_TAG_SMALL);
    for (int q = 0; q < W; q++)
        if (q != r)
            add_send(d, &n, j->src, (int64_t)j->bytes, MPI_BYTE, q, DIST_TAG_SMALL, 1);
    return comm_wait(d, n, j->what);
}

static bool run_bcast(struct qc_dist *d, struct dist_job *j)
{
    int n = 0;
    if (d->rank == j->root) {
        for (int q = 0; q < d->size; q++)
            if (q != j->root)
                add_send(d, &n, j->dst, (int64_t)j->bytes, MPI_BYTE, q, DIST_TAG_SMALL, 1);
    } else {
        add_recv(d, &n, j->dst, (int64_t)j->bytes, MPI_BYTE, j->root, DIST_TAG_SMALL);
    }
    return comm_wait(d, n, j->what);
}

static bool run_gather(struct qc_dist *d, struct dist_job *j)
{
    const int W = d->size, r = d->rank;
    const int64_t m = d->shard_hi - d->shard_lo;
    int n = 0;
    if (r == 0) {
        if (m > 0)
            memcpy(j->f + d->shard_lo, j->fsrc, (size_t)m * sizeof(float));
        for (int q = 1; q < W; q++) {
            int64_t lo, hi;
            qc_dist_shard_range(d->o.numel, W, q, &lo, &hi);
            if (hi > lo)
                add_recv(d, &n, j->f + lo, hi - lo, MPI_FLOAT, q, DIST_TAG_GATHER);
        }
    } else if (m > 0) {
        add_send(d, &n, j->fsrc, m, MPI_FLOAT, 0, DIST_TAG_GATHER, sizeof(float));
    }
    return comm_wait(d, n, j->what);
}

static bool run_job(struct qc_dist *d, struct dist_job *j)
{
    switch (j->kind) {
    case DIST_JOB_PIECE: {
        const double t0 = dist_now();
        pthread_mutex_lock(&d->mu);
        if (d->step_t0 <= 0)
            d->step_t0 = t0;
        pthread_mutex_unlock(&d->mu);
        const bool ok = run_piece(d, j);
        const double t1 = dist_now();
        pthread_mutex_lock(&d->mu);
        d->step_t1 = t1;
        pthread_mutex_unlock(&d->mu);
        return ok;
    }
    case DIST_JOB_PARAMS:
        return run_params(d, j);
    case DIST_JOB_ALLGATHER:
        return run_allgather(d, j);
    case DIST_JOB_BCAST:
        return run_bcast(d, j);
    case DIST_JOB_GATHER:
        return run_gather(d, j);
    }
    QC_ASSERT(false, "dist: job kind %d", (int)j->kind);
    return false;
}

// ---- the thread
// ----------------------------------------------------------------------------------

/* While NCCL work is in flight: every peer must keep answering. */
static void watch_tick(struct qc_dist *d)
{
    const double t = dist_now();
    if (!d->watching) {
        d->watching = true;
        for (int p = 0; p < d->size; p++)
            if (d->heard[p] < t)
                d->heard[p] = t;
    }
    const char *err = d->nccl ? dist_nccl_async_error(d) : NULL;
    if (err)
        dist_fail(d,
                  "dist: NCCL reported an error at step %lld: %s\nhint: a peer probably died; "
                  "its output or the launcher's says why",
                  (long long)d->step_no, err);
    for (int p = 0; p < d->size; p++)
        if (p != d->rank)
            hb_check(d, p, t, "NCCL collectives were in flight");
}

void *dist_comm_main(void *arg)
{
    struct qc_dist *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->head && !d->stop) {
            const bool watch = d->watch;
            pthread_mutex_unlock(&d->mu);
            hb_service(d);
            if (watch)
                watch_tick(d);
            else
                d->watching = false;
            pthread_mutex_lock(&d->mu);
            if (d->head || d->stop)
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            const double wait =
                watch && d->hb_interval < IDLE_POLL_S ? d->hb_interval : IDLE_POLL_S;
            ts.tv_nsec += (long)(wait * 1e9);
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&d->cv_job, &d->mu, &ts);
        }
        if (d->stop)
            break;
        struct dist_job *j = d->head;
        d->head = j->next;
        if (!d->head)
            d->tail = NULL;
        pthread_mutex_unlock(&d->mu);
        const bool ok = run_job(d, j);
        pthread_mutex_lock(&d->mu);
        if (!ok) {
            d->abandoned = true;
            break;
        }
        d->seq_done = j->seq;
        pthread_cond_broadcast(&d->cv_done);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int64_t dist_post(struct qc_dist *d, struct dist_job *j)
{
    pthread_mutex_lock(&d->mu);
    j->seq = ++d->seq_posted;
    j->next = NULL;
    if (d->tail)
        d->tail->next = j;
    else
        d->head = j;
    d->tail = j;
    pthread_cond_signal(&d->cv_job);
    pthread_mutex_unlock(&d->mu);
    return j->seq;
}

void dist_wait_seq(struct qc_dist *d, int64_t seq)
{
    pthread_mutex_lock(&d->mu);
    while (d->seq_done < seq)
        pthread_cond_wait(&d->cv_done, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void dist_run(struct qc_dist *d, struct dist_job *j)
{
    dist_wait_seq(d, dist_post(d, j));
}
