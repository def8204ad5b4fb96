/*
 * qc_dist.h — data-parallel training across ranks: how the process was launched, the world of
 * ranks (MPI), and one collective interface for a training run with two backends (README.md in
 * this folder has the glossary and the invariants):
 *
 *   MPI    host buffers (device.kind cpu). Every reduction is ours, in a fixed rank order
 *          (never MPI_Allreduce's choice), on a communication thread that overlaps backward.
 *   NCCL   device buffers (device.kind cuda): NCCL collectives on a dedicated CUDA stream,
 *          bootstrapped through MPI (ncclGetUniqueId broadcast).
 *
 * Launch (qc_dist_launch_detect): mpirun / srun / a PMI launcher set environment variables
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, SLURM_STEP_NUM_TASKS). Without them, or with a
 * size of 1, the process is one rank and MPI is never initialised: nothing of this module runs.
 *
 * Failures: every MPI call of a run is made by the communication thread, which also answers
 * heartbeats. While a rank waits for a peer (a collective, or NCCL work in flight), it pings that
 * peer; a peer that answers nothing for dist.timeout seconds has gone away (killed, out of
 * memory, stopped): the waiting rank prints an error naming it and ends the job (MPI_Abort), so
 * the launcher exits non-zero. Live ranks that wait on each other in different collectives (a
 * rank skipped one) keep answering; the deadline on the waiting phase catches them: when every
 * rank's main thread has waited on the communicator (a collective, or its device's NCCL work:
 * qc_dist_wait_begin) for dist.timeout with nothing moving, no rank computes that could end the
 * wait, and a waiting rank ends the job naming its collective (the phase, qc_dist_set_phase),
 * the ranks that had not arrived and where each of them waits instead. A rank that computes,
 * writes a checkpoint or validates for longer is slow, not hung: it stops no one. A rank that
 * fails with an error of its own ends the job the same way (qc_dist_world_end with a non-zero
 * code, from main), unless every rank agreed on that failure first
 * (qc_dist_world_failure_agreed: every rank then finalises and exits non-zero).
 *
 * Only the files of src/dist include mpi.h or nccl.h.
 */
#ifndef QC_DIST_QC_DIST_H
#define QC_DIST_QC_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- launch and the world of ranks (launch.c) -------------------------------------------------

/* What the launcher's environment says about this process (no MPI call). */
struct qc_dist_launch {
    int rank, size;             /* 0 and 1 without a launcher */
    int local_rank, local_size; /* on this node; 0 and 1 when unknown */
    const char *launcher;       /* "none", "mpirun", "srun" or "pmi" (static string) */
    bool size_known;            /* false: a PMIx launcher that names the rank only (MPI says) */
};

/* Reads the launch from environ (pure: for tests, from any environment via getenv). */
void qc_dist_launch_detect(struct qc_dist_launch *out);

/* Joins the world once per process (idempotent): detects the launch and, when it names more
 * than one rank, initialises MPI (MPI_THREAD_SERIALIZED: one thread at a time; the run's
 * communication thread makes every call after set-up). QC_ERR_UNSUPPORTED (with a hint) when
 * launched with several ranks by a build without MPI, or when MPI lacks the thread level. */
enum qc_status qc_dist_world_init(void);
/* qc_dist_world_init, and MPI even for a world of one rank (a singleton MPI_Init_thread when no
 * launcher started the process): a communicator of one rank can then be made, which NCCL
 * allows. For the one-process tests of both backends (tests/test_dist_nccl.c); a run of one
 * rank never needs it. QC_ERR_UNSUPPORTED in a build without MPI. */
enum qc_status qc_dist_world_init_mpi(void);
/* The world (after qc_dist_world_init; 0 of 1 before, or without a launcher). */
int qc_dist_world_rank(void);
int qc_dist_world_size(void);
/* This rank's index among the ranks of its node, and how many they are (MPI_Comm_split_type
 * MPI_COMM_TYPE_SHARED: the ranks that can share memory; 0 and 1 without MPI). Ranks of one node
 * share its RAM and NVMe: the trainer divides the default host and NVMe tiers among them. */
int qc_dist_world_local_rank(void);
int qc_dist_world_local_size(void);
const char *qc_dist_world_launcher(void);
/* Leaves the world at process exit: with exit_code 0, MPI_Finalize; otherwise MPI_Abort with
 * that code, so every other rank stops and the launcher exits non-zero. No-op when MPI was
 * never initialised. main() calls it once, last. */
void qc_dist_world_end(int exit_code);
/* Every rank has learnt of this failure and ends on it alike (the trainer: a step that failed on
 * some rank, agreed in the step's exchange, after rank 0 wrote its report and a barrier): the
 * next qc_dist_world_end with a non-zero code finalises MPI instead of aborting, so every rank
 * prints its own error and exits with its code (the launcher exits non-zero) instead of the
 * first rank to abort killing the others mid-message. Only after such an agreement: MPI_Finalize
 * waits for every rank. */
void qc_dist_world_failure_agreed(void);
/* A barrier of the whole world at start-up, before any communicator exists (main thread;
 * every rank calls it once at the same point): rank 0 returns once every rank has arrived, the
 * others once rank 0 has. A rank waited on for timeout_s seconds (dist.timeout) fails the call
 * on the waiting rank: QC_ERR_IO naming it and what it was doing (`what`, e.g. "taking the run
 * folder"). No-op in a world of one rank. */
enum qc_status qc_dist_world_barrier(double timeout_s, const char *what);
/* "mpi: yes (Open MPI 4.1.4, MPI 3.1)\nnccl: yes (2.21.5)\n" or the "no" lines, for
 * `qctrain version`. Returns the length needed (snprintf contract). */
size_t qc_dist_build_info(char *buf, size_t n);

// ---- the shards of a flat buffer (shard.c; pure) ----------------------------------------------

/* Rank r of W owns [lo, hi) of a flat buffer of numel floats: contiguous, in rank order,
 * sizes within 17 elements of numel / W, every inner boundary a multiple of 16. */
void qc_dist_shard_range(int64_t numel, int world, int r, int64_t *lo, int64_t *hi);

/* The pieces a flat buffer of numel floats is reduced in, the same on every rank: the buffer is
 * cut at the ncuts offsets of cuts (where backward reports ranges final; any order, 0 < cut <
 * numel) into regions, and each region from its top down into pieces of at most max_elems (the
 * lowest one of a region possibly shorter). Pieces are listed from the top of the buffer down,
 * the order they are reduced in. Writes up to cap pieces as [lo, hi) pairs into out (2 per
 * piece) and returns how many there are. */
int64_t qc_dist_pieces(int64_t numel, const int64_t *cuts, int ncuts, int64_t max_elems,
                       int64_t *out, int64_t cap);

/* Sums W contributions elementwise in rank order: out[i] = ((src[0][i] + src[1][i]) + ...) +
 * src[W-1][i], in float. out may be one of the sources (each element is read before written). */
void qc_dist_sum_rank_order(float *out, const float *const *src, int world, int64_t n);

// ---- a training run's communicator (dist.c) ---------------------------------------------------

enum qc_dist_backend {
    QC_DIST_MPI = 0, /* host buffers; reductions on the communication thread */
    QC_DIST_NCCL,    /* device buffers; NCCL on a dedicated stream (CUDA builds) */
};

struct qc_device;
struct qc_stream;

struct qc_dist_opts {
    enum qc_dist_backend backend;
    int64_t numel;              /* floats in the flat parameter and gradient buffers */
    int zero_stage;             /* 0, 1 or 2 (dist.zero_stage) */
    size_t bucket_bytes;        /* largest piece of one reduction (dist.bucket_bytes) */
    double timeout_s;           /* silence after which a peer has gone away, and the deadline
                                   of every rank waiting at once (dist.timeout) */
    struct qc_device *dev;      /* NCCL: this rank's CUDA device (current on this thread) */
    struct qc_stream *compute;  /* NCCL: the stream the model computes on */
    const int64_t *cuts;        /* where backward reports ranges final (qc_qcnet_grads_cuts): */
    int ncuts;                  /* pieces never straddle them (qc_dist_pieces) */
    const char *agreement;      /* NULL, or text every rank must hold the same, checked first
                                   (qc_dist_check_same) */
    const char *agreement_what; /* what that text is, for the message */
};

struct qc_dist; /* one run's communicator (opaque) */

/* Creates the communicator over the whole world (collective: every rank calls it): starts the
 * communication thread, checks the agreement text (before anything that depends on the options
 * being equal), and for NCCL makes the communicator and its stream. Needs MPI: a world of more
 * than one rank (qc_dist_world_init), or qc_dist_world_init_mpi for a world of one. QC_ERR_INVALID
 * from the agreement check. QC_ERR_UNSUPPORTED for NCCL in a build without it; QC_ERR_NOMEM;
 * QC_ERR_CUDA. */
enum qc_status qc_dist_create(const struct qc_dist_opts *opts, struct qc_dist **out);
/* Stops the communication thread (abandoning a collective in progress: after an error the
 * process ends the job with qc_dist_world_end) and frees everything. NULL is a no-op. */
void qc_dist_destroy(struct qc_dist *d);

/* Called once, before the job ends with MPI_Abort, by a rank that ends it on a failure of the
 * communicator (a peer gone: peer is its rank; the deadline, or an error of this rank: peer -1),
 * with the error as printed: what the rank can still write of its own (rank 0's memory report)
 * without waiting on any other rank. It runs on the communication thread while the main thread
 * waits on the communicator (a collective, or between qc_dist_wait_begin and _end), so it may
 * read what the main thread does not change while it waits; it must not call this module. The
 * other ranks may be ending already: keep it short. */
typedef void (*qc_dist_fail_fn)(void *ctx, int peer, const char *message);
/* Installs the failure hook. Main thread, between collectives. */
void qc_dist_set_fail_hook(struct qc_dist *d, qc_dist_fail_fn fn, void *ctx);

int qc_dist_rank(const struct qc_dist *d);
int qc_dist_size(const struct qc_dist *d);
/* This rank's shard of the flat buffer (qc_dist_shard_range). */
void qc_dist_my_shard(const struct qc_dist *d, int64_t *lo, int64_t *hi);

/* Start-up agreement: every rank passes its canonical text (e.g. "key=value\n" lines of the
 * effective configuration). Hashes are compared; on a difference every rank returns
 * QC_ERR_INVALID naming the first rank that differs from rank 0 and the first differing line
 * (its key before '=' and rank 0's value; that rank's own value in its own message). */
enum qc_status qc_dist_check_same(struct qc_dist *d, const char *what, const char *text);

// ---- one step's gradients and parameters ----

/* Starts the reduction of the step's gradients in grads (numel floats: host memory for MPI,
 * device memory for NCCL; unchanged until qc_dist_grads_end). Nothing moves yet. */
enum qc_status qc_dist_grads_begin(struct qc_dist *d, float *grads);
/* Gradients [lo, hi) are final (on NCCL: all the work producing them is enqueued on the
 * compute stream). Ranges come from the top of the buffer down, each starting where the
 * previous one ended (hi == the previous lo). The pieces (qc_dist_pieces) lying in [lo, numel)
 * that were not started yet start reducing now, in order: every rank reduces the same pieces
 * in the same order, whatever its ranges (a rank without a group reports none). */
enum qc_status qc_dist_grads_ready(struct qc_dist *d, int64_t lo, int64_t hi);
/* Waits until the reduction of every piece started so far is complete and its result is in
 * grads (MPI: on return; NCCL: in stream order, the compute stream waits). Nothing new starts.
 * For a trainer that must roll back a backward that failed after reporting ranges: those
 * ranges belong to the reduction from then on (the trainer keeps their values aside). */
enum qc_status qc_dist_grads_settle(struct qc_dist *d);
/* Reduces whatever was not reported yet and completes the step's reduction. Afterwards grads
 * holds the sum over ranks: everywhere (stages 0 and 1) or in this rank's shard only (stage 2;
 * the rest is stale). MPI: on return. NCCL: in stream order (the compute stream waits). */
enum qc_status qc_dist_grads_end(struct qc_dist *d);
/* Stages 1 and 2, after every rank updated its shard of params: every shard everywhere.
 * MPI: on return; NCCL: in stream order on the compute stream. */
enum qc_status qc_dist_params_allgather(struct qc_dist *d, float *params);
/* The step's device work is complete (after the trainer's synchronization): ends the NCCL
 * watch of in-flight work. A no-op for MPI. */
void qc_dist_step_end(struct qc_dist *d);

// ---- the waiting phase (the deadline: see Failures above) ----

/* Names what the host collectives posted from now on are for, in the deadline's and the
 * watchdog's messages ("exchanging the step's losses"); phase must outlive them (a literal).
 * NULL: the default ("exchanging host values", ...). Main thread. */
void qc_dist_set_phase(struct qc_dist *d, const char *phase);
/* The main thread is about to wait outside this module on work of the communicator (a device
 * synchronisation that waits for the step's NCCL collectives): until qc_dist_wait_end it counts
 * as waiting, as in a collective, for the deadline; `what` (a literal) names the wait in its
 * messages. Not nested; the main thread posts nothing in between. */
void qc_dist_wait_begin(struct qc_dist *d, const char *what);
void qc_dist_wait_end(struct qc_dist *d);

// ---- small host collectives (through MPI on both backends; rank order) ----

/* all[r * bytes ...] = rank r's `mine` (bytes each), for every r. */
enum qc_status qc_dist_allgather(struct qc_dist *d, const void *mine, size_t bytes, void *all);
/* buf (bytes) of rank root to every rank. */
enum qc_status qc_dist_bcast(struct qc_dist *d, void *buf, size_t bytes, int root);
/* Rank 0 receives every rank's shard (host floats, qc_dist_shard_range of numel) into full
 * (numel floats, used on rank 0 only; may be NULL elsewhere); shard is this rank's part. */
enum qc_status qc_dist_gather_shards(struct qc_dist *d, const float *shard, float *full);

// ---- statistics ----

struct qc_dist_stats {
    int64_t steps;          /* qc_dist_grads_end calls */
    uint64_t bytes_reduced; /* gradient bytes reduced (numel * 4 per step) */
    uint64_t bytes_sent;    /* bytes this rank sent (gradients and parameters) */
    double grads_coll_s;    /* time the gradient reductions took (first start to last end) */
    double grads_wait_s;    /* time qc_dist_grads_end waited: the part not hidden */
    double params_s;        /* parameter all-gathers (stages 1, 2) */
    uint64_t scratch_bytes; /* receive buffers of the communication thread (high water) */
};
void qc_dist_stats_get(struct qc_dist *d, struct qc_dist_stats *out);
void qc_dist_stats_reset(struct qc_dist *d);

#ifdef __cplusplus
}
#endif

#endif /* QC_DIST_QC_DIST_H */
