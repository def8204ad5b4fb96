/*
 * dist_internal.h — the communicator behind qc_dist.h, shared by the files of src/dist (never
 * included from outside this folder). MPI builds only.
 *
 * Files: launch.c (launch, world, the start-up barrier), shard.c (shards, pieces, rank-order sum),
 * comm.c (the communication thread: job queue, collectives, heartbeats, the watchdog), dist.c (the
 * public API on the main thread), nccl.c (the NCCL backend, CUDA builds), dist_stub.c (builds
 * without MPI). Calls go one way, down: dist.c -> comm.c -> nccl.c -> launch.c, shard.c (a
 * helper two of them need lives in the lower one; tests/file_cycles.py fails on a cycle).
 *
 * Threads. The main thread (the trainer's) posts jobs and waits for their sequence numbers;
 * the communication thread runs them in order and is the only thread that calls MPI after
 * qc_dist_create. Under `mu`: the queue, seq_posted, seq_done, stop, watch, the per-step
 * timestamps, the statistics and whether the main thread is waiting (main_wait*); everything
 * MPI (requests, scratch, heard/pinged, the peers' states and the pongs) belongs to the
 * communication thread alone; `phase` and `step_no` to the main thread (a job carries copies).
 *
 * Message tags on `data` (one per kind of exchange, so a rank that fell out of step blocks
 * instead of mixing messages): DIST_TAG_*; heartbeats on `hb`.
 */
#ifndef QC_DIST_DIST_INTERNAL_H
#define QC_DIST_DIST_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "qc_dist.h"

enum {
    DIST_TAG_RS = 11,      /* gradient piece: contributions to the chunk's owner */
    DIST_TAG_AG = 12,      /* gradient piece: the reduced chunk back to every rank */
    DIST_TAG_PARAMS = 13,  /* parameter shards */
    DIST_TAG_SMALL = 14,   /* all-gather and broadcast of host bytes */
    DIST_TAG_GATHER = 15,  /* float shards to rank 0 */
    DIST_TAG_PING = 21,    /* on hb: "are you there?" */
    DIST_TAG_PONG = 22,    /* on hb: "yes" */
    DIST_TAG_BARRIER = 31, /* on MPI_COMM_WORLD: the start-up barrier (launch.c) */
};

enum dist_job_kind {
    DIST_JOB_PIECE,     /* [lo, hi) of the gradients: reduce-scatter, + all-gather below stage 2 */
    DIST_JOB_PARAMS,    /* every rank's shard of the parameters to every rank */
    DIST_JOB_ALLGATHER, /* bytes of every rank to every rank, in rank order */
    DIST_JOB_BCAST,     /* bytes of rank `root` to every rank */
    DIST_JOB_GATHER,    /* the float shards of every rank to rank 0 */
};

struct dist_job {
    enum dist_job_kind kind;
    int64_t seq;       /* posting order, from 1 */
    int64_t lo, hi;    /* PIECE: elements of the gradient buffer */
    float *f;          /* PIECE: gradients; PARAMS: parameters; GATHER: the full buffer (rank 0) */
    const float *fsrc; /* GATHER: this rank's shard */
    const void *src;   /* ALLGATHER: this rank's bytes */
    void *dst;         /* ALLGATHER: size * bytes; BCAST: the buffer */
    size_t bytes;      /* ALLGATHER, BCAST */
    int root;          /* BCAST */
    const char *what;  /* for the watchdog's message */
    int64_t step;      /* the communicator's step when posted (qc_dist_grads_begin's count) */
    struct dist_job *next;
};

/* Where a rank is, as it answers a ping (the pong's payload, plain bytes: every rank runs the same
 * build): for the deadline on the waiting phase (comm.c, "deadline"). */
#define DIST_STATE_MISSING 4
struct dist_state {
    int64_t seq;      /* the collective it is in: its job number (the same order on every rank), or
                         0 (its main thread waits on its device, or it is not in one) */
    int64_t step;     /* the step of that collective or wait */
    double waited_s;  /* how long its main thread has waited on the communicator with nothing
                         moving; < 0: its main thread is not waiting (it computes) */
    int32_t nmissing; /* ranks its collective still waits on */
    int32_t missing[DIST_STATE_MISSING]; /* the first of them */
    char what[56]; /* the collective's phase, or what its main thread waits on */
};

/* Who a rank is, for messages about it. */
struct dist_peer {
    int pid;
    char host[64];
};

struct dist_nccl; /* nccl.c */

struct qc_dist {
    struct qc_dist_opts o;
    int rank, size;
    int64_t shard_lo, shard_hi; /* this rank's shard (qc_dist_shard_range) */
    int64_t piece_elems;        /* bucket_bytes / 4 */
    struct dist_peer *peers;    /* (size) */

    /* the communication thread and its queue (under mu) */
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    struct dist_job *head, *tail;
    int64_t seq_posted, seq_done;
    bool stop;               /* destroy: leave now (a job in progress is abandoned) */
    bool abandoned;          /* the thread left in the middle of a job: MPI state is not clean */
    bool watch;              /* NCCL work in flight: every peer is pinged while it lasts */
    double step_t0, step_t1; /* first piece started, last piece ended (this step) */
    struct qc_dist_stats stats;
    bool main_waiting;          /* the main thread waits (dist_wait_seq, qc_dist_wait_begin) */
    double main_wait_t0;        /* since when (dist_now) */
    const char *main_wait_what; /* qc_dist_wait_begin's what; NULL in dist_wait_seq */
    int64_t main_wait_step;     /* step_no then */

    /* communication thread only */
    MPI_Comm data, hb;
    bool data_ok, hb_ok; /* duplicated (to be freed) */
    MPI_Request hb_req;
    struct dist_state hb_buf; /* a ping's or a pong's bytes */
    bool hb_posted;
    double hb_interval;            /* s between pings of a silent peer */
    double *heard, *pinged;        /* (size) last time anything came from / a ping went to r */
    struct dist_state *peer_state; /* (size) what each peer's last pong said */
    double *peer_state_t;          /* (size) when it came (0: never) */
    struct dist_state *pong_out;   /* (size) the pong on its way to each peer */
    MPI_Request *pong_req;         /* (size) its send, or MPI_REQUEST_NULL */
    const struct dist_job *cur;    /* the job being run, or NULL */
    const char *cur_what;          /* the phase comm_wait waits in (cur's, or a part of it) */
    int cur_nreq;                  /* comm_wait's requests (d->reqs[0, cur_nreq)); 0 outside it */
    double moved_t;                /* the last time communication moved: a job began, a request
                                      completed (the deadline's clock restarts there) */
    float *scratch;                /* receive buffers of a piece */
    size_t scratch_cap;            /* floats */
    MPI_Request *reqs;             /* (2 * size) */
    int *req_peer, *idx;           /* (2 * size) */
    MPI_Status *sts;               /* (2 * size) */
    const float **srcs;            /* (size) */
    int64_t *chunk;                /* (size + 1) chunk boundaries of a piece */
    bool watching;                 /* the thread's view of `watch` (heard[] reset on the edge) */

    /* the failure hook (qc_dist_set_fail_hook: before any job is posted) and the peer dist_fail
     * names */
    qc_dist_fail_fn fail_fn;
    void *fail_ctx;
    int fail_peer; /* -1: none in particular */

    /* one step (main thread) */
    const char *phase; /* qc_dist_set_phase: what the next host collectives are for */
    float *grads;
    int64_t frontier; /* [frontier, numel) of the gradients has been reported final */
    bool in_step;
    int64_t step_no;
    int64_t *layout;         /* (2 npieces) the pieces, top down (qc_dist_pieces) */
    struct dist_job *pieces; /* (npieces) their jobs in this step */
    int64_t npieces;
    int64_t next_piece; /* pieces [0, next_piece) have been started this step */
    int64_t last_piece_seq;

    struct dist_nccl *nccl; /* NCCL backend state; NULL for MPI */
};

// ---- launch.c ----

/* QC_OK, or QC_ERR_IO "dist: <call> failed: <MPI's error string>" for a return code not
 * MPI_SUCCESS (calls made on the main thread). */
enum qc_status dist_mpi_check(int rc, const char *call);
/* Seconds on the monotonic clock. */
double dist_now(void);

// ---- comm.c ----

/* The communication thread's body (arg: the qc_dist). */
void *dist_comm_main(void *arg);
/* Posts a job (the caller keeps it alive until done); returns its sequence number. */
int64_t dist_post(struct qc_dist *d, struct dist_job *j);
/* Waits until job seq (and every earlier one) is done. */
void dist_wait_seq(struct qc_dist *d, int64_t seq);
/* Posts a job and waits for it. */
void dist_run(struct qc_dist *d, struct dist_job *j);
/* Prints "qctrain: error: rank R of W: <message>" and ends the job (MPI_Abort). */
_Noreturn void dist_fail(struct qc_dist *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// ---- nccl.c (CUDA builds; stubs that fail elsewhere) ----

/* ncclUniqueId's size (NCCL_UNIQUE_ID_BYTES; nccl.c checks it): dist.c broadcasts rank 0's id
 * as plain bytes, so nccl.c calls nothing of the files above it. */
#define DIST_NCCL_ID_BYTES 128
/* The backend's state; on rank 0 also a new communicator id, written to id (DIST_NCCL_ID_BYTES
 * bytes; untouched on the other ranks). */
enum qc_status dist_nccl_create(struct qc_dist *d, void *id);
/* Joins the NCCL communicator of id (rank 0's, broadcast by the caller); blocks until every rank
 * joined, watched like a collective. */
enum qc_status dist_nccl_join(struct qc_dist *d, const void *id);
/* abort: ncclCommAbort (a peer is gone or the run failed) instead of ncclCommDestroy. */
void dist_nccl_destroy(struct qc_dist *d, bool abort);
/* Enqueues pieces [first, last) of the layout after the compute stream's work so far. */
enum qc_status dist_nccl_pieces(struct qc_dist *d, int64_t first, int64_t last);
enum qc_status dist_nccl_end(struct qc_dist *d);
/* The compute stream waits for the pieces enqueued so far (qc_dist_grads_settle). */
enum qc_status dist_nccl_settle(struct qc_dist *d);
enum qc_status dist_nccl_params(struct qc_dist *d, float *params);
/* After the step's device work: folds the step's timestamps into the statistics. */
void dist_nccl_step_end(struct qc_dist *d);
/* From the communication thread while watching: the communicator's asynchronous error, as a
 * message, or NULL. */
const char *dist_nccl_async_error(struct qc_dist *d);
/* From the communication thread before ending the job: aborts the communicator so no kernel
 * waits on a gone peer. */
void dist_nccl_abort(struct qc_dist *d);

#endif /* QC_DIST_DIST_INTERNAL_H */
