/*
 * dist.c — the communicator of a training run on the main thread (qc_dist.h): set-up, the
 * step's gradient reduction cut into pieces as backward reports ranges final, the parameter
 * all-gather of ZeRO stages 1 and 2, the small host collectives, start-up agreement checks and
 * the statistics. The collectives themselves run on the communication thread (comm.c) for MPI,
 * or on the NCCL stream (nccl.c).
 */
#include "dist_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The NCCL backend: rank 0's communicator id broadcast over MPI, then every rank joins. */
static enum qc_status nccl_start(struct qc_dist *d)
{
    unsigned char id[DIST_NCCL_ID_BYTES];
    memset(id, 0, sizeof(id));
    QC_TRY(dist_nccl_create(d, id));
    QC_TRY(qc_dist_bcast(d, id, sizeof(id), 0));
    return dist_nccl_join(d, id);
}

enum qc_status qc_dist_create(const struct qc_dist_opts *opts, struct qc_dist **out)
{
    int mpi_up = 0;
    if (MPI_Initialized(&mpi_up) != MPI_SUCCESS || !mpi_up)
        return qc_errorf(QC_ERR_INVALID, "dist: a communicator needs MPI: a world of 2 or more "
                                         "ranks (qc_dist_world_init under a launcher), or "
                                         "qc_dist_world_init_mpi");
    if (opts->numel < 0 || opts->zero_stage < 0 || opts->zero_stage > 2 || opts->timeout_s <= 0)
        return qc_errorf(QC_ERR_INVALID,
                         "dist: bad options (numel %lld, zero stage %d, timeout %g)",
                         (long long)opts->numel, opts->zero_stage, opts->timeout_s);
    struct qc_dist *d = calloc(1, sizeof(*d));
    if (!d)
        return qc_errorf(QC_ERR_NOMEM, "dist: out of memory");
    d->o = *opts;
    d->rank = qc_dist_world_rank();
    d->size = qc_dist_world_size();
    qc_dist_shard_range(opts->numel, d->size, d->rank, &d->shard_lo, &d->shard_hi);
    d->piece_elems = (int64_t)(opts->bucket_bytes / sizeof(float));
    if (d->piece_elems < 1)
        d->piece_elems = 1;
    d->hb_interval = opts->timeout_s / 8;
    d->fail_peer = -1;
    d->hb_interval = d->hb_interval < 0.02 ? 0.02 : (d->hb_interval > 2.0 ? 2.0 : d->hb_interval);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_job, NULL);
    pthread_cond_init(&d->cv_done, NULL);
    const size_t W = (size_t)d->size;
    d->peers = calloc(W, sizeof(*d->peers));
    d->heard = calloc(W, sizeof(double));
    d->pinged = calloc(W, sizeof(double));
    d->reqs = calloc(2 * W, sizeof(MPI_Request));
    d->req_peer = calloc(2 * W, sizeof(int));
    d->idx = calloc(2 * W, sizeof(int));
    d->sts = calloc(2 * W, sizeof(MPI_Status));
    d->srcs = calloc(W, sizeof(*d->srcs));
    d->chunk = calloc(W + 1, sizeof(int64_t));
    d->peer_state = calloc(W, sizeof(*d->peer_state));
    d->peer_state_t = calloc(W, sizeof(double));
    d->pong_out = calloc(W, sizeof(*d->pong_out));
    d->pong_req = calloc(W, sizeof(MPI_Request));
    for (size_t p = 0; d->pong_req && p < W; p++)
        d->pong_req[p] = MPI_REQUEST_NULL;
    d->moved_t = dist_now();
    d->npieces = qc_dist_pieces(opts->numel, opts->cuts, opts->ncuts, d->piece_elems, NULL, 0);
    d->layout = calloc((size_t)(2 * d->npieces + 2), sizeof(int64_t));
    d->pieces = calloc((size_t)(d->npieces + 1), sizeof(*d->pieces));
    if (d->layout)
        qc_dist_pieces(opts->numel, opts->cuts, opts->ncuts, d->piece_elems, d->layout, d->npieces);
    if (!d->layout || !d->peers || !d->heard || !d->pinged || !d->reqs || !d->req_peer || !d->idx ||
        !d->sts || !d->srcs || !d->chunk || !d->pieces || !d->peer_state || !d->peer_state_t ||
        !d->pong_out || !d->pong_req) {
        qc_dist_destroy(d);
        return qc_errorf(QC_ERR_NOMEM, "dist: out of memory");
    }
    /* set-up on this thread (serialised with MPI_Init), before the thread starts */
    enum qc_status st = dist_mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &d->data), "MPI_Comm_dup");
    d->data_ok = st == QC_OK;
    if (st == QC_OK) {
        st = dist_mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &d->hb), "MPI_Comm_dup");
        d->hb_ok = st == QC_OK;
    }
    if (st == QC_OK) {
        MPI_Comm_set_errhandler(d->data, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(d->hb, MPI_ERRORS_RETURN);
        st = dist_mpi_check(MPI_Irecv(&d->hb_buf, (int)sizeof(d->hb_buf), MPI_BYTE, MPI_ANY_SOURCE,
                                      MPI_ANY_TAG, d->hb, &d->hb_req),
                            "MPI_Irecv");
        d->hb_posted = st == QC_OK;
    }
    if (st == QC_OK) {
        const int e = pthread_create(&d->th, NULL, dist_comm_main, d);
        if (e != 0)
            st = qc_errorf(QC_ERR_NOMEM, "dist: cannot start the communication thread: %s",
                           strerror(e));
        d->th_started = e == 0;
    }
    if (st == QC_OK) { /* who is who, for messages about a peer */
        struct dist_peer me = {.pid = (int)getpid()};
        if (gethostname(me.host, sizeof(me.host)) != 0)
            snprintf(me.host, sizeof(me.host), "?");
        me.host[sizeof(me.host) - 1] = '\0';
        qc_dist_set_phase(d, "setting up the communicator");
        st = qc_dist_allgather(d, &me, sizeof(me), d->peers);
    }
    if (st == QC_OK && opts->agreement)
        st = qc_dist_check_same(d, opts->agreement_what ? opts->agreement_what : "the set-up",
                                opts->agreement);
    if (st == QC_OK && opts->backend == QC_DIST_NCCL)
        st = nccl_start(d);
    if (st != QC_OK) {
        qc_dist_destroy(d);
        return st;
    }
    *out = d;
    return QC_OK;
}

void qc_dist_destroy(struct qc_dist *d)
{
    if (!d)
        return;
    bool abandoned = true;
    if (d->th_started) {
        pthread_mutex_lock(&d->mu);
        __atomic_store_n(&d->stop, true, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&d->cv_job);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->th, NULL);
        abandoned = d->abandoned || d->head != NULL;
    }
    if (d->nccl)
        dist_nccl_destroy(d, abandoned);
    /* a clean end leaves MPI tidy for MPI_Finalize; after an abandoned job the process ends
     * the job with MPI_Abort (qc_dist_world_end), which needs nothing of this */
    if (!abandoned) {
        if (d->hb_posted) {
            MPI_Cancel(&d->hb_req);
            MPI_Wait(&d->hb_req, MPI_STATUS_IGNORE);
        }
        for (int p = 0; d->pong_req && p < d->size; p++) /* small sends: complete already */
            if (d->pong_req[p] != MPI_REQUEST_NULL)
                MPI_Wait(&d->pong_req[p], MPI_STATUS_IGNORE);
        if (d->hb_ok)
            MPI_Comm_free(&d->hb);
        if (d->data_ok)
            MPI_Comm_free(&d->data);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_job);
    pthread_cond_destroy(&d->cv_done);
    free(d->peers);
    free(d->heard);
    free(d->pinged);
    free(d->reqs);
    free(d->req_peer);
    free(d->idx);
    free(d->sts);
    free(d->srcs);
    free(d->chunk);
    free(d->pieces);
    free(d->layout);
    free(d->scratch);
    free(d->peer_state);
    free(d->peer_state_t);
    free(d->pong_out);
    free(d->pong_req);
    free(d);
}

void qc_dist_set_fail_hook(struct qc_dist *d, qc_dist_fail_fn fn, void *ctx)
{
    d->fail_fn = fn;
    d->fail_ctx = ctx;
}

int qc_dist_rank(const struct qc_dist *d)
{
    return d->rank;
}

int qc_dist_size(const struct qc_dist *d)
{
    return d->size;
}

void qc_dist_my_shard(const struct qc_dist *d, int64_t *lo, int64_t *hi)
{
    *lo = d->shard_lo;
    *hi = d->shard_hi;
}

// ---- the waiting phase ------------------------------------------------------------------------

void qc_dist_set_phase(struct qc_dist *d, const char *phase)
{
    d->phase = phase;
}

void qc_dist_wait_begin(struct qc_dist *d, const char *what)
{
    pthread_mutex_lock(&d->mu);
    QC_ASSERT(!d->main_waiting, "dist: qc_dist_wait_begin twice");
    d->main_waiting = true;
    d->main_wait_t0 = dist_now();
    d->main_wait_what = what;
    d->main_wait_step = d->step_no;
    pthread_mutex_unlock(&d->mu);
}

void qc_dist_wait_end(struct qc_dist *d)
{
    pthread_mutex_lock(&d->mu);
    d->main_waiting = false;
    d->main_wait_what = NULL;
    pthread_mutex_unlock(&d->mu);
}

// ---- host collectives ---------------------------------------------------------------------------

enum qc_status qc_dist_allgather(struct qc_dist *d, const void *mine, size_t bytes, void *all)
{
    struct dist_job j = {.kind = DIST_JOB_ALLGATHER,
                         .src = mine,
                         .dst = all,
                         .bytes = bytes,
                         .what = d->phase ? d->phase : "exchanging host values"};
    dist_run(d, &j);
    return QC_OK;
}

enum qc_status qc_dist_bcast(struct qc_dist *d, void *buf, size_t bytes, int root)
{
    QC_ASSERT(root >= 0 && root < d->size, "dist: broadcast root %d of %d", root, d->size);
    struct dist_job j = {.kind = DIST_JOB_BCAST,
                         .dst = buf,
                         .bytes = bytes,
                         .root = root,
                         .what = d->phase ? d->phase : "broadcasting host values"};
    dist_run(d, &j);
    return QC_OK;
}

enum qc_status qc_dist_gather_shards(struct qc_dist *d, const float *shard, float *full)
{
    QC_ASSERT(d->rank != 0 || full, "dist: gather to rank 0 without a buffer");
    struct dist_job j = {.kind = DIST_JOB_GATHER,
                         .fsrc = shard,
                         .f = full,
                         .what = d->phase ? d->phase : "gathering shards"};
    dist_run(d, &j);
    return QC_OK;
}

// ---- agreement ---------------------------------------------------------------------------------

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The start of line k of text and its length (without the newline); NULL past the end. */
static const char *line_at(const char *text, int64_t k, size_t *len)
{
    const char *p = text;
    for (int64_t i = 0; i < k && p; i++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (!p || !*p)
        return NULL;
    const char *e = strchr(p, '\n');
    *len = e ? (size_t)(e - p) : strlen(p);
    return p;
}

/* Index of the first line where a and b differ, or -1. */
static int64_t first_diff_line(const char *a, const char *b)
{
    for (int64_t k = 0;; k++) {
        size_t la = 0, lb = 0;
        const char *pa = line_at(a, k, &la), *pb = line_at(b, k, &lb);
        if (!pa && !pb)
            return -1;
        if (!pa || !pb || la != lb || memcmp(pa, pb, la) != 0)
            return k;
    }
}

static enum qc_status check_same(struct qc_dist *d, const char *what, const char *text);

enum qc_status qc_dist_check_same(struct qc_dist *d, const char *what, const char *text)
{
    const char *phase = d->phase;
    qc_dist_set_phase(d, "comparing the ranks' set-up");
    const enum qc_status st = check_same(d, what, text);
    qc_dist_set_phase(d, phase);
    return st;
}

static enum qc_status check_same(struct qc_dist *d, const char *what, const char *text)
{
    const size_t W = (size_t)d->size;
    const uint64_t h = fnv1a(text, strlen(text));
    uint64_t *hs = calloc(W, sizeof(uint64_t));
    int64_t *ks = calloc(W, sizeof(int64_t));
    if (!hs || !ks) {
        free(hs);
        free(ks);
        return qc_errorf(QC_ERR_NOMEM, "dist: out of memory");
    }
    qc_dist_allgather(d, &h, sizeof(h), hs);
    bool same = true;
    for (size_t r = 1; r < W; r++)
        same = same && hs[r] == hs[0];
    if (same) {
        free(hs);
        free(ks);
        return QC_OK;
    }
    /* somebody differs: rank 0's text to everyone, and every rank's first differing line */
    uint64_t len = d->rank == 0 ? (uint64_t)strlen(text) : 0;
    qc_dist_bcast(d, &len, sizeof(len), 0);
    char *ref = malloc((size_t)len + 1);
    if (!ref) {
        free(hs);
        free(ks);
        return qc_errorf(QC_ERR_NOMEM, "dist: out of memory");
    }
    if (d->rank == 0)
        memcpy(ref, text, (size_t)len);
    qc_dist_bcast(d, ref, (size_t)len, 0);
    ref[len] = '\0';
    const int64_t k = first_diff_line(ref, text);
    qc_dist_allgather(d, &k, sizeof(k), ks);
    int bad = -1;
    for (size_t r = 1; r < W && bad < 0; r++)
        if (ks[r] >= 0)
            bad = (int)r;
    enum qc_status st = QC_OK;
    if (bad < 0) { /* equal texts with different hashes cannot be */
        st = qc_errorf(QC_ERR_INVALID, "dist: %s differs between ranks", what);
    } else {
        /* that rank's line to everyone, so every rank's message names both values */
        char line[1024] = "";
        size_t lr = 0;
        const char *pr = d->rank == bad ? line_at(text, ks[bad], &lr) : NULL;
        if (pr)
            snprintf(line, sizeof(line), "%.*s", (int)lr, pr);
        qc_dist_bcast(d, line, sizeof(line), bad);
        line[sizeof(line) - 1] = '\0';
        size_t l0 = 0;
        const char *p0 = line_at(ref, ks[bad], &l0);
        char ref_line[1024];
        snprintf(ref_line, sizeof(ref_line), "%.*s", p0 ? (int)l0 : 0, p0 ? p0 : "");
        /* "key=value": name the key once when both lines have the same one */
        const char *eq0 = strchr(ref_line, '='), *eqr = strchr(line, '=');
        if (eq0 && eqr && eq0 - ref_line == eqr - line &&
            strncmp(ref_line, line, (size_t)(eq0 - ref_line)) == 0)
            st = qc_errorf(QC_ERR_INVALID,
                           "dist: %s differs between ranks: %.*s is %s on rank %d, %s on rank 0"
                           "\nhint: start every rank with the same command line (presets, "
                           "--set, data files)",
                           what, (int)(eq0 - ref_line), ref_line, eqr + 1, bad, eq0 + 1);
        else
            st = qc_errorf(QC_ERR_INVALID,
                           "dist: %s differs between ranks: rank %d has \"%s\" where rank 0 has "
                           "\"%s\"\nhint: start every rank with the same command line "
                           "(presets, --set, data files)",
                           what, bad, line, ref_line);
    }
    free(ref);
    free(hs);
    free(ks);
    return st;
}

// ---- one step ----------------------------------------------------------------------------------

enum qc_status qc_dist_grads_begin(struct qc_dist *d, float *grads)
{
    QC_ASSERT(!d->in_step, "dist: grads_begin twice");
    d->grads = grads;
    d->frontier = d->o.numel;
    d->next_piece = 0;
    d->last_piece_seq = 0;
    d->in_step = true;
    d->step_no++;
    pthread_mutex_lock(&d->mu);
    d->step_t0 = d->step_t1 = 0;
    if (d->nccl)
        d->watch = true;
    pthread_mutex_unlock(&d->mu);
    return QC_OK;
}

enum qc_status qc_dist_grads_ready(struct qc_dist *d, int64_t lo, int64_t hi)
{
    QC_ASSERT(d->in_step, "dist: grads_ready outside a step");
    QC_ASSERT(hi == d->frontier && lo >= 0 && lo <= hi,
              "dist: ranges must come from the top down: [%lld, %lld) after %lld", (long long)lo,
              (long long)hi, (long long)d->frontier);
    d->frontier = lo;
    const int64_t first = d->next_piece;
    int64_t last = first;
    while (last < d->npieces && d->layout[2 * last] >= lo)
        last++;
    if (last == first)
        return QC_OK;
    d->next_piece = last;
    if (d->nccl)
        return dist_nccl_pieces(d, first, last);
    for (int64_t k = first; k < last; k++) {
        struct dist_job *j = &d->pieces[k];
        *j = (struct dist_job){.kind = DIST_JOB_PIECE,
                               .lo = d->layout[2 * k],
                               .hi = d->layout[2 * k + 1],
                               .f = d->grads,
                               .what = "reducing gradients"};
        d->last_piece_seq = dist_post(d, j);
    }
    return QC_OK;
}

enum qc_status qc_dist_grads_settle(struct qc_dist *d)
{
    QC_ASSERT(d->in_step, "dist: grads_settle outside a step");
    if (d->nccl)
        return dist_nccl_settle(d);
    dist_wait_seq(d, d->last_piece_seq);
    return QC_OK;
}

enum qc_status qc_dist_grads_end(struct qc_dist *d)
{
    if (d->frontier > 0)
        QC_TRY(qc_dist_grads_ready(d, 0, d->frontier));
    d->in_step = false;
    if (d->nccl) {
        QC_TRY(dist_nccl_end(d));
        pthread_mutex_lock(&d->mu);
        d->stats.steps++;
        d->stats.bytes_reduced += (uint64_t)d->o.numel * sizeof(float);
        pthread_mutex_unlock(&d->mu);
        return QC_OK;
    }
    const double t0 = dist_now();
    dist_wait_seq(d, d->last_piece_seq);
    const double t1 = dist_now();
    pthread_mutex_lock(&d->mu);
    d->stats.steps++;
    d->stats.bytes_reduced += (uint64_t)d->o.numel * sizeof(float);
    d->stats.grads_wait_s += t1 - t0;
    if (d->step_t1 > d->step_t0 && d->step_t0 > 0)
        d->stats.grads_coll_s += d->step_t1 - d->step_t0;
    pthread_mutex_unlock(&d->mu);
    return QC_OK;
}

enum qc_status qc_dist_params_allgather(struct qc_dist *d, float *params)
{
    if (d->o.zero_stage < 1)
        return QC_OK;
    if (d->nccl)
        return dist_nccl_params(d, params);
    const double t0 = dist_now();
    struct dist_job j = {
        .kind = DIST_JOB_PARAMS, .f = params, .what = "gathering parameter shards"};
    dist_run(d, &j);
    const double t1 = dist_now();
    pthread_mutex_lock(&d->mu);
    d->stats.params_s += t1 - t0;
    pthread_mutex_unlock(&d->mu);
    return QC_OK;
}

void qc_dist_step_end(struct qc_dist *d)
{
    if (!d->nccl)
        return;
    dist_nccl_step_end(d);
    pthread_mutex_lock(&d->mu);
    d->watch = false;
    pthread_mutex_unlock(&d->mu);
}

// ---- statistics --------------------------------------------------------------------------------

void qc_dist_stats_get(struct qc_dist *d, struct qc_dist_stats *out)
{
    pthread_mutex_lock(&d->mu);
    *out = d->stats;
    pthread_mutex_unlock(&d->mu);
}

void qc_dist_stats_reset(struct qc_dist *d)
{
    pthread_mutex_lock(&d->mu);
    const uint64_t scratch = d->stats.scratch_bytes;
    memset(&d->stats, 0, sizeof(d->stats));
    d->stats.scratch_bytes = scratch;
    pthread_mutex_unlock(&d->mu);
}
