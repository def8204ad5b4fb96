/*
 * train_dist.h — the trainer's side of data-parallel training (train_dist.c), private to
 * src/train. loop.c calls these at fixed points of a run; with one rank (the common case) the
 * trainer holds no train_dist and only train_dist_world / train_dist_resolve run, so a
 * single-rank run computes exactly what it did before ranks existed.
 *
 * A step with W ranks and G = train.grad_accum groups per rank (P = W·G groups per step, L ≤ P
 * in the epoch's last step): rank r computes global groups j = r, r + W, ... < L of the step
 * (the loader's plan gives it exactly those), each backward seeded with 1/L, so that the sum
 * over ranks of the gradients is the gradient of the mean of the L group losses, as one rank
 * computing the L groups would. Dropout is keyed by scene (qc_qcnet.h), so rank r draws for
 * group j the masks one rank computing j would.
 *
 *   train_dist_world      joins the world, checks dist.world_size, resolves it in cfg
 *   train_dist_run_dir_barrier  every rank waits for rank 0 to lock and recover the run folder
 *                         before anything in it is read
 *   train_dist_resolve    data.balance auto -> cost (several ranks) or none; the saved run's on
 *                         resume
 *   train_dist_create     the communicator (config agreement first), the model's grads-ready
 *                         callback (world > 1)
 *   train_dist_optim      AdamW: whole, or this rank's shard (ZeRO stage >= 1)
 *   step                  _step_begin, _arm before the last local group, _reduce after the
 *                         local groups, _sync, _combine (losses, the stop signal, the
 *                         finiteness of the gradients: one exchange decides for every rank),
 *                         optimizer, _update, _sync, _step_end; under device.budget
 *                         _hold and _settle around a split or rolled-back group
 *   train_dist_save       rank 0 writes the checkpoint (moments gathered from the shards), after
 *                         checking that every rank holds the same weights
 *   train_dist_barrier    a graceful stop: no rank leaves before rank 0 has written everything
 */
#ifndef QC_TRAIN_TRAIN_DIST_H
#define QC_TRAIN_TRAIN_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_config.h"
#include "qc_dist.h" /* struct qc_dist_stats */
#include "qc_memreport.h"
#include "qc_train.h"

struct train_dist; /* NULL: one rank */

/* Joins the world (qc_dist_world_init) and checks the launch against dist.world_size (0: the
 * launcher's); sets cfg->world_size to the number of ranks. With several ranks: device.kind emu
 * is refused, and on cuda cfg->device_ordinal becomes device.ordinal + the node-local rank
 * (modulo the GPUs this process sees). Ranks other than 0 log at warn (info lines quiet) unless
 * log.level is debug.
 * QC_ERR_INVALID with a hint on a mismatch. */
enum qc_status train_dist_world(struct qc_config *cfg, int *rank, int *world);
/* data.balance auto: the saved run's value when resuming one that resolved it, else cost with
 * several ranks and none with one. saved may be NULL. */
void train_dist_resolve(struct qc_config *cfg, const struct qc_config *saved);
/* With several ranks, before any rank reads the run folder or a checkpoint: rank 0 has taken
 * the run folder's lock and recovered what a killed writer left (ckpt-N.old put back, .tmp
 * removed) when every rank returns, so no rank resolves a checkpoint that is about to change. A
 * rank silent for dist.timeout fails it, named. A no-op with one rank. */
enum qc_status train_dist_run_dir_barrier(const struct qc_config *cfg, const char *run_dir);
/* The rank's canonical text of what every rank must agree on (the effective config, the
 * command's inputs and the checkpoint resume_ckpt resolved to, "" when not resuming; not the run
 * folder: only rank 0's is used), malloc'd. */
char *train_dist_agreement_text(const struct qc_config *cfg, const struct qc_train_opts *opts,
                                const char *resume_ckpt);

/* The communicator of a run of world > 1 ranks on backend be, model m: checks the agreement
 * text across ranks first (a difference fails on every rank naming the rank and the key), and
 * installs the model's grads-ready callback. */
enum qc_status train_dist_create(const struct qc_config *cfg, const char *agreement,
                                 struct qc_qcnet *m, struct qc_train_backend *be,
                                 struct train_dist **out);
/* NULL is a no-op. */
void train_dist_destroy(struct train_dist *td);
/* The communicator's failure hook (qc_dist_set_fail_hook); td NULL: a no-op. */
void train_dist_set_fail_hook(struct train_dist *td, qc_dist_fail_fn fn, void *ctx);

/* The run's AdamW: over the whole buffer (td NULL or stage 0), or over this rank's shard. */
enum qc_status train_dist_optim(struct train_dist *td, const struct qc_config *cfg,
                                struct qc_qcnet *m, struct qc_train_backend *be,
                                struct qc_optim **out);
/* Checks that every rank holds the same weights (a hash of the parameters): at start-up
 * (step < 0: after init or load) and before every checkpoint (the replicas must never drift
 * apart). QC_ERR_INVALID naming the first rank that differs from rank 0. */
enum qc_status train_dist_check_params(struct train_dist *td, struct qc_qcnet *m, int64_t step);

/* Local groups of rank r of W in a step of L global groups: #{ j = r + gW < L }. */
int64_t train_dist_local_groups(int rank, int world, int64_t L);

// ---- one step (td NULL: no-ops) ----

/* Before the first group of step `step` (1-based): the rank's compute clock starts. */
enum qc_status train_dist_step_begin(struct train_dist *td, int64_t step);
/* Before the rank's last local backward of the step: its grads-ready reports start the
 * reduction of grads (the model's flat gradient buffer). */
enum qc_status train_dist_arm(struct train_dist *td, float *grads);
/* The memory system (stepmem.c) around one group's backwards while armed: a split group's parts
 * before the last run held (their reports are not final and are dropped). After a backward that
 * failed (the group is rolled back and re-run), settle waits until the ranges it already
 * reported are reduced and gives in *from the lowest of them: [*from, n) belongs to the
 * reduction from then on, the caller keeps those values aside and puts them back after the
 * group, and later reports of that part are dropped. *from is INT64_MAX when nothing was
 * reported (or td is NULL). */
void train_dist_hold(struct train_dist *td, bool hold);
enum qc_status train_dist_settle(struct train_dist *td, int64_t *from);
/* After the rank's local groups (arms first when it had none): the compute clock stops and the
 * rest of the reduction runs; the summed gradients are then in grads (qc_dist_grads_end). */
enum qc_status train_dist_reduce(struct train_dist *td, float *grads);
/* After the optimizer updated the rank's part: the parameter all-gather (stages 1, 2). */
enum qc_status train_dist_update(struct train_dist *td, float *params);
/* Waits for the backend's work so far (qc_op_sync): on CUDA the NCCL collectives' too, so with
 * several ranks the wait counts for the deadline on the waiting phase (qc_dist_wait_begin; what,
 * a literal, names it). td NULL: the synchronisation alone. */
enum qc_status train_dist_sync(struct train_dist *td, struct qc_train_backend *be,
                               const char *what);
/* After the step's device work completed. */
void train_dist_step_end(struct train_dist *td);
/* The part [*lo, *hi) of the flat gradient buffer that holds reduced sums after
 * train_dist_reduce: everything, or the rank's shard (ZeRO stage 2). */
void train_dist_reduced_range(const struct train_dist *td, int64_t numel, int64_t *lo, int64_t *hi);

/* What a rank brings to the step's combination. */
struct train_dist_local {
    int64_t nlocal;        /* its groups of the step */
    const double *loss;    /* [nlocal][4]: loss, reg_propose, reg_refine, cls */
    int64_t scenes;        /* in its groups */
    int64_t groups_ran;    /* its groups in which a scene ran (the others were all skipped) */
    int64_t edges;         /* graph edges of its groups */
    int stop_signal;       /* SIGINT / SIGTERM this rank received (a graceful stop), or 0 */
    int64_t bad_grad;      /* the first non-finite element of its reduced gradients, or -1 */
    enum qc_status failed; /* its step failed with this status (QC_OK: it did not); a rank
                              whose step failed still takes part in the reduction and the
                              exchange, so every rank learns of it (train_dist_failure_gather) */
};
/* The step's figures over all ranks: the same on every rank, so every decision taken from them
 * (skip the step, stop after it) is taken alike by all. */
struct train_dist_sums {
    double loss, reg_loss_propose, reg_loss_refine, cls_loss; /* sums over the step's groups */
    int64_t scenes;                                           /* over all ranks */
    int64_t groups_ran;     /* the step's groups in which a scene ran, over all ranks */
    double rank_time_ratio; /* slowest / mean compute time */
    double rank_edge_ratio; /* most / mean graph edges of the ranks' groups (the work) */
    int stop_signal;        /* the signal of the first rank (in rank order) that got one, or 0 */
    int stop_rank;          /* that rank */
    int64_t bad_grad;       /* the first rank's first non-finite gradient element, or -1 */
    int bad_grad_rank;      /* that rank */
    int failed;             /* the status of the first rank (in rank order) whose step failed */
    int failed_rank;        /* that rank, or -1: no rank failed */
    int failed_ranks;       /* how many ranks failed the step */
};
/* The base edges of a batch's graph (every edge set): the work a group holds. */
struct qc_batch;
int64_t train_dist_batch_edges(const struct qc_batch *b);
/* Combines the step in one exchange: sums the losses in global group order (j = r + gW),
 * exactly as one rank adding the L groups in order would; the stop signals and the gradients'
 * finiteness of every rank. td NULL: the rank's own figures. */
enum qc_status train_dist_combine(struct train_dist *td, const struct train_dist_local *mine,
                                  struct train_dist_sums *out);
/* The step's data-parallel figures of its metrics.jsonl line: the world size, the ranks' time
 * and edge ratios of sums, and the seconds this rank waited for the gradient reduction since
 * the previous call. td NULL (one rank): m untouched (the keys are left out of the line). */
void train_dist_step_figures(struct train_dist *td, const struct train_dist_sums *sums,
                             struct qc_step_metrics *m);
/* The bytes of one rank's error in train_dist_failure_gather (status included). */
#define TRAIN_DIST_FAILURE_MESSAGE 4096
/* After a step whose exchange says a rank failed (sums.failed_rank): every rank brings its own
 * status (QC_OK when it did not fail) and error message (cut to TRAIN_DIST_FAILURE_MESSAGE
 * bytes), and every rank receives rank `rank`'s: *status and out (n bytes). Collective; td
 * NULL: the rank's own. */
enum qc_status train_dist_failure_gather(struct train_dist *td, enum qc_status mine,
                                         const char *message, int rank, enum qc_status *status,
                                         char *out, size_t n);
/* Every rank waits here for every other (a graceful stop, after rank 0's writes). */
enum qc_status train_dist_barrier(struct train_dist *td);

// ---- checkpoints and the memory report ----

/* Saves a checkpoint: the gathered AdamW moments (stage >= 1) and rank 0 writing the files;
 * every rank calls it. path_out as qc_checkpoint_save (rank 0). */
enum qc_status train_dist_save(struct train_dist *td, const char *run_dir, struct qc_qcnet *m,
                               struct qc_optim *o, const struct qc_train_state *s,
                               const struct qc_config *cfg, char *path_out, size_t n);
/* Every rank's bytes for the memory report (collective). *out (malloc'd, *n of them) on every
 * rank. */
enum qc_status train_dist_mem_ranks(struct train_dist *td, struct qc_qcnet *m, struct qc_optim *o,
                                    uint64_t peak_allocated, struct qc_memreport_rank **out,
                                    int64_t *n);
/* The communicator's statistics (bench dist); zeros for td NULL. */
void train_dist_stats(struct train_dist *td, struct qc_dist_stats *out);
void train_dist_stats_reset(struct train_dist *td);

#endif /* QC_TRAIN_TRAIN_DIST_H */
