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
 *
 * The deadline on the waiting phase (deadline_check): live ranks that wait on each other in
 * different collectives (one skipped a collective, or called another) answer every ping, so no
 * one goes silent; but then every rank's main thread waits on the communicator and nothing moves.
 * A pong carries where its rank is (struct dist_state: its collective's number, phase and step,
 * the ranks it still waits on, and how long its main thread has waited with nothing moving, or
 * that it computes). Once this rank's main thread has waited dist.timeout / 2 with nothing moving,
 * its thread pings every peer once per hb_interval; once it has waited dist.timeout and every
 * peer's fresh pong says the same of that peer, no rank computes that could end any wait: it
 * ends the job naming its collective, the ranks that had not arrived, and where every rank waits.
 * A rank whose main thread computes (a long step, validation, a checkpoint) keeps the others from
 * this: the wait is slow, not hung.
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

static const int ping_token = 1; /* never written: safe for freed sends */

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
    /* (set before any job was posted, so read without mu: the caller may hold it) */
    if (d->fail_fn)
        d->fail_fn(d->fail_ctx, d->fail_peer, msg);
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
    d->fail_peer = peer != d->rank ? peer : -1;
    dist_fail(d,
              "dist: MPI error while %s with rank %d (pid %d on %s): %s\nhint: that rank "
              "probably died; its output or the launcher's says why",
              what, peer, d->peers ? d->peers[peer].pid : 0, d->peers ? d->peers[peer].host : "?",
              es);
}

static void fail_gone(struct qc_dist *d, int peer, double silent_s, const char *what)
{
    d->fail_peer = peer;
    dist_fail(d,
              "dist: rank %d (pid %d on %s) went away: nothing from it for %.1f s "
              "(dist.timeout %.3g s) while %s at step %lld; it was killed, ran out of memory, "
              "stopped or hangs\nhint: its own output or the launcher's says why; if it is only "
              "slow, raise dist.timeout",
              peer, d->peers ? d->peers[peer].pid : 0, d->peers ? d->peers[peer].host : "?",
              silent_s, d->o.timeout_s, what, (long long)(d->cur ? d->cur->step : d->step_no));
}

// ---- heartbeats --------------------------------------------------------------------------------

static void hb_post(struct qc_dist *d)
{
    const int rc = MPI_Irecv(&d->hb_buf, (int)sizeof(d->hb_buf), MPI_BYTE, MPI_ANY_SOURCE,
                             MPI_ANY_TAG, d->hb, &d->hb_req);
    if (rc != MPI_SUCCESS)
        fail_mpi(d, rc, d->rank, "posting the heartbeat receive");
    d->hb_posted = true;
}

static void ping(struct qc_dist *d, int p, double t)
{
    MPI_Request r;
    if (MPI_Isend(&ping_token, (int)sizeof(ping_token), MPI_BYTE, p, DIST_TAG_PING, d->hb, &r) ==
        MPI_SUCCESS)
        MPI_Request_free(&r);
    d->pinged[p] = t;
}

/* Where this rank is now (the payload of its pongs; the deadline's own view). */
static void state_now(struct qc_dist *d, double t, struct dist_state *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&d->mu);
    const bool waiting = d->main_waiting;
    const double t0 = d->main_wait_t0;
    const char *wait_what = d->main_wait_what;
    const int64_t wait_step = d->main_wait_step;
    pthread_mutex_unlock(&d->mu);
    out->waited_s = -1;
    if (waiting)
        out->waited_s = t - (t0 > d->moved_t ? t0 : d->moved_t);
    if (d->cur) {
        out->seq = d->cur->seq;
        out->step = d->cur->step;
        snprintf(out->what, sizeof(out->what), "%s", d->cur_what ? d->cur_what : d->cur->what);
        for (int i = 0; i < d->cur_nreq; i++) { /* the peers of its pending requests, once */
            if (d->reqs[i] == MPI_REQUEST_NULL)
                continue;
            bool seen = false;
            for (int k = 0; k < i && !seen; k++)
                seen = d->reqs[k] != MPI_REQUEST_NULL && d->req_peer[k] == d->req_peer[i];
            if (seen)
                continue;
            if (out->nmissing < DIST_STATE_MISSING)
                out->missing[out->nmissing] = d->req_peer[i];
            out->nmissing++;
        }
    } else if (waiting && wait_what) {
        out->step = wait_step;
        snprintf(out->what, sizeof(out->what), "%s", wait_what);
    }
}

/* Answers a ping of p with where this rank is. A pong still on its way to p (never for long:
 * small sends complete at once) is not overwritten: p asks again. */
static void pong(struct qc_dist *d, int p, double t)
{
    if (d->pong_req[p] != MPI_REQUEST_NULL) {
        int done = 0;
        if (MPI_Test(&d->pong_req[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done)
            return;
    }
    state_now(d, t, &d->pong_out[p]);
    if (MPI_Isend(&d->pong_out[p], (int)sizeof(d->pong_out[p]), MPI_BYTE, p, DIST_TAG_PONG, d->hb,
                  &d->pong_req[p]) != MPI_SUCCESS)
        d->pong_req[p] = MPI_REQUEST_NULL;
}

/* Answers pings and notes pongs (and the states they carry), until nothing is pending. */
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
            const double t = dist_now();
            d->heard[src] = t;
            int bytes = 0;
            if (s.MPI_TAG == DIST_TAG_PING) {
                pong(d, src, t);
            } else if (s.MPI_TAG == DIST_TAG_PONG &&
                       MPI_Get_count(&s, MPI_BYTE, &bytes) == MPI_SUCCESS &&
                       bytes == (int)sizeof(d->hb_buf)) {
                d->peer_state[src] = d->hb_buf;
                d->peer_state_t[src] = t;
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
    if (silent > d->hb_interval && t - d->pinged[p] > d->hb_interval)
        ping(d, p, t);
}

// ---- the deadline on the waiting phase ----------------------------------------------------------

/* "ranks 0, 2" of a state's missing ranks, or "" */
static void missing_str(const struct dist_state *s, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    const int k = s->nmissing < DIST_STATE_MISSING ? s->nmissing : DIST_STATE_MISSING;
    for (int i = 0; i < k && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%d", i ? ", " : (k > 1 ? "ranks " : "rank "),
                                s->missing[i]);
    if (s->nmissing > k && len < n)
        snprintf(buf + len, n - len, " and more");
}

/* Where a state says its rank waits: "at step 2 in \"exchanging ...\" (collective 41)". */
static void where_str(const struct dist_state *s, const char *whose, char *buf, size_t n)
{
    if (s->seq > 0)
        snprintf(buf, n, "at step %lld in \"%s\" (%scollective %lld)", (long long)s->step, s->what,
                 whose, (long long)s->seq);
    else if (s->what[0])
        snprintf(buf, n, "at step %lld on %s", (long long)s->step, s->what);
    else
        snprintf(buf, n, "between collectives");
}

_Noreturn static void fail_deadline(struct qc_dist *d, const struct dist_state *me)
{
    char msg[1900], where[160], who[96];
    size_t len = 0;
    where_str(me, "", where, sizeof(where));
    missing_str(me, who, sizeof(who));
    len += (size_t)snprintf(msg + len, sizeof(msg) - len,
                            "dist: no rank can go on: rank %d has waited %.1f s (dist.timeout "
                            "%.3g s) %s",
                            d->rank, me->waited_s, d->o.timeout_s, where);
    if (who[0] && len < sizeof(msg))
        len +=
            (size_t)snprintf(msg + len, sizeof(msg) - len, " for %s, which had not arrived", who);
    int listed = 0;
    for (int p = 0; p < d->size && len < sizeof(msg); p++) {
        if (p == d->rank)
            continue;
        if (listed == 8) {
            len += (size_t)snprintf(msg + len, sizeof(msg) - len, "; ...");
            break;
        }
        const struct dist_state *s = &d->peer_state[p];
        where_str(s, "its ", where, sizeof(where));
        missing_str(s, who, sizeof(who));
        len += (size_t)snprintf(msg + len, sizeof(msg) - len, "; rank %d waits %s%s%s", p, where,
                                who[0] ? " for " : "", who);
        listed++;
    }
    if (len < sizeof(msg))
        snprintf(msg + len, sizeof(msg) - len,
                 "; every rank has waited that long with nothing moving\nhint: the ranks called "
                 "different collectives: a bug of qctrain (report it with the command line), or "
                 "the test hook QC_FAULT_SKIP_COLLECTIVE; if a collective is only slow, raise "
                 "dist.timeout");
    dist_fail(d, "%s", msg);
}

/* The deadline (module comment): from the waiting loop of a job and from the idle loop while the
 * main thread waits on its device. */
static void deadline_check(struct qc_dist *d, double t)
{
    const double T = d->o.timeout_s;
    if (d->size < 2)
        return; /* a world of one waits on no one */
    if (t - d->moved_t < T / 2)
        return; /* something moved recently: cheap way out, no lock */
    struct dist_state me;
    state_now(d, t, &me);
    /* the main thread computes (waited_s < 0), or has not waited long */
    if (me.waited_s < T / 2)
        return;
    /* where is everyone? */
    for (int p = 0; p < d->size; p++)
        if (p != d->rank && t - d->pinged[p] > d->hb_interval)
            ping(d, p, t);
    if (me.waited_s < T)
        return;
    const double fresh = 2 * d->hb_interval + 0.1;
    for (int p = 0; p < d->size; p++) {
        if (p == d->rank)
            continue;
        if (d->peer_state_t[p] <= 0 || t - d->peer_state_t[p] > fresh ||
            d->peer_state[p].waited_s < T)
            return; /* that rank computes (or has not said otherwise lately) */
    }
    fail_deadline(d, &me);
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
    d->cur_what = what;
    d->cur_nreq = n;
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
        if (outcount > 0)
            d->moved_t = t;
        left -= outcount;
        hb_service(d);
        if (left == 0)
            break;
        if (stop_requested(d)) {
            d->cur_nreq = 0;
            return false;
        }
        for (int i = 0; i < n; i++)
            if (d->reqs[i] != MPI_REQUEST_NULL)
                hb_check(d, d->req_peer[i], t, what);
        deadline_check(d, t);
        if (outcount > 0) {
            sleep = 0;
        } else {
            sleep = sleep ? (sleep * 2 > MAX_SLEEP_US ? MAX_SLEEP_US : sleep * 2) : 10;
            sleep_us(sleep);
        }
    }
    d->cur_nreq = 0;
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

static bool run_job_kind(struct qc_dist *d, struct dist_job *j)
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

static bool run_job(struct qc_dist *d, struct dist_job *j)
{
    d->cur = j;
    d->cur_what = j->what;
    d->moved_t = dist_now();
    const bool ok = run_job_kind(d, j);
    d->cur = NULL;
    d->moved_t = dist_now();
    return ok;
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
            const bool waiting = d->main_waiting; /* on its device (qc_dist_wait_begin) */
            pthread_mutex_unlock(&d->mu);
            hb_service(d);
            if (watch)
                watch_tick(d);
            else
                d->watching = false;
            if (waiting)
                deadline_check(d, dist_now());
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
    j->step = d->step_no;
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
    if (d->seq_done < seq) {
        QC_ASSERT(!d->main_waiting, "dist: waiting on a collective inside qc_dist_wait_begin");
        d->main_waiting = true;
        d->main_wait_t0 = dist_now();
        d->main_wait_what = NULL;
        d->main_wait_step = d->step_no;
        while (d->seq_done < seq)
            pthread_cond_wait(&d->cv_done, &d->mu);
        d->main_waiting = false;
    }
    pthread_mutex_unlock(&d->mu);
}

void dist_run(struct qc_dist *d, struct dist_job *j)
{
    dist_wait_seq(d, dist_post(d, j));
}
