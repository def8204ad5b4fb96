/*
 * qc_loader.h — the background batch loader: reads scenes (qcshard files, or synthetic scenes
 * generated on the fly), shuffles each epoch from a seed, gives rank r of N its own part,
 * collates B scenes (qc_batch.h) and builds every edge set (qc_graph.h) on worker threads,
 * ahead of the consumer.
 *
 * Determinism: the batches of an epoch (which scenes, in which order, and every byte built from
 * them) depend only on (the data, seed, epoch, rank, world size, groups per rank, batch size,
 * options), never on thread timing; the consumer receives them in plan order.
 *
 * Epoch plan, for N scenes, W ranks, G groups per rank and step (P = W·G groups per step):
 *   1. order = 0..N−1, shuffled (Fisher–Yates from splitmix64 keyed by seed and epoch) when
 *      shuffle is on;
 *   2. the order is cut into steps of P·B scenes (the last step shorter), each step into
 *      ceil(scenes / B) groups of B scenes (the last group of the epoch shorter; dropped with
 *      drop_last);
 *      plain mode: group j of a step is the step's scenes j·B .. j·B + B − 1, in order;
 *      cost mode: the step's scenes are dealt largest cost first to the group with the smallest
 *      total so far that still has room (ties: lower group), so every group of the step, and
 *      every rank, holds a similar number of edges;
 *   3. rank r takes groups r, r + W, r + 2W, ... of every step, as its batches in order.
 * So the groups of an epoch depend on P, never on how P splits into ranks and accumulation:
 * W ranks × 1 group read exactly the groups of 1 rank × W groups (resumable across world
 * sizes), and every scene is read once per epoch (no padding: a rank may get fewer groups in
 * the epoch's last step).
 *
 * Cost of a scene: qc_loader_cost_estimate() from its counts (read from the qcshard index
 * without touching records; for synthetic scenes, from a counting pre-pass).
 *
 * Threading: qc_loader_next()/release()/start_epoch() are for one consumer thread; the workers
 * are internal. Batch memory comes from opts.alloc (e.g. qc_host_alloc_pinned()).
 */
#ifndef QC_DATA_QC_LOADER_H
#define QC_DATA_QC_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_batch.h"
#include "qc_graph.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_pinned;

struct qc_loader_opts {
    int64_t batch_size;       /* B, scenes per batch, ≥ 1 */
    int64_t threads;          /* worker threads; 0 = all online cores */
    int64_t prefetch_batches; /* batches built (or being built) ahead of the consumer, ≥ 1 */
    bool shuffle;             /* shuffle each epoch */
    bool drop_last;           /* drop a rank's last short batch */
    bool balance_cost;        /* cost-balanced grouping across ranks */
    bool with_target;         /* TargetBuilder output in every batch */
    bool build_graph;         /* build every edge set (else node fields only) */
    uint64_t seed;            /* shuffle seed */
    int64_t rank;             /* 0 ≤ rank < world_size */
    int64_t world_size;       /* ≥ 1 */
    int64_t groups_per_rank;  /* G: batches a rank takes per step (gradient accumulation), ≥ 1 */
    struct qc_graph_params graph;
    struct qc_host_alloc alloc; /* batch memory; alloc == NULL means malloc */
    /* synthetic scenes, used when no file is given */
    int64_t synthetic_scenes; /* scenes per epoch */
    int synthetic_profile;    /* enum qc_synth_profile */
    uint64_t synthetic_seed;
};

/* Defaults: B 4, threads 0, prefetch 2, shuffle, no drop_last, no balance, target and graph
 * built, seed 2023, rank 0 of 1, 1 group per rank, official graph parameters, malloc, 1024
 * typical synthetic scenes of seed 2023. */
void qc_loader_opts_default(struct qc_loader_opts *o);

/* Fills a host allocator hook that serves batches from the pinned allocator p. The workers call
 * it: p selects its own device on each of them before pinning (qc_pinned.h), so the batches of
 * a rank are registered with the rank's GPU, never with device 0. */
void qc_host_alloc_pinned(struct qc_pinned *p, struct qc_host_alloc *out);

struct qc_loader;

/* Opens the qcshard files (npaths of them; 0 = synthetic scenes) and starts the workers.
 * Nothing is built until qc_loader_start_epoch. QC_ERR_IO / QC_ERR_INVALID naming the file,
 * QC_ERR_INVALID for bad options, QC_ERR_NOMEM. */
enum qc_status qc_loader_create(const char *const *paths, int npaths,
                                const struct qc_loader_opts *opts, struct qc_loader **out);
/* Stops the workers and frees everything, including unconsumed batches. NULL is a no-op.
 * Batches still held by the caller must be released before. */
void qc_loader_destroy(struct qc_loader *l);

/* Scenes in the dataset (before the rank split). */
int64_t qc_loader_num_scenes(const struct qc_loader *l);
/* Batches this rank gets per epoch (planned by the last qc_loader_start_epoch). */
int64_t qc_loader_num_batches(const struct qc_loader *l);
/* Groups of the whole epoch over all ranks (qc_loader_plan_groups): world-size independent. */
int64_t qc_loader_num_groups(const struct qc_loader *l);

/* Plans epoch `epoch` and lets the workers start building. Any batch of a previous epoch not
 * yet consumed is discarded. */
enum qc_status qc_loader_start_epoch(struct qc_loader *l, int64_t epoch);

/* The next batch of the epoch, in plan order, blocking until it is built. *out = NULL at the
 * end of the epoch. A failure to read or build a batch is returned here (with the worker's
 * message). The batch stays valid until qc_loader_release. */
enum qc_status qc_loader_next(struct qc_loader *l, struct qc_batch **out);
/* Gives a batch back (its memory returns to the allocator). NULL is a no-op. */
void qc_loader_release(struct qc_loader *l, struct qc_batch *batch);
/* Builds a batch of the dataset scenes idx[0 .. n) now, on the calling thread, as the workers
 * build theirs (same allocator, target and graph options; batch->scene_index = idx): the
 * trainer's sub-groups of a batch that does not fit (admission control). Release it with
 * qc_loader_release. QC_ERR_INVALID for an index out of range; read errors name the file. */
enum qc_status qc_loader_build(struct qc_loader *l, const int64_t *idx, int64_t n,
                               struct qc_batch **out);

/* The plan of the current epoch for this rank: batch i holds scenes
 * idx[ptr[i] .. ptr[i+1]). Pointers valid until the next start_epoch. */
void qc_loader_plan(const struct qc_loader *l, const int64_t **ptr, const int64_t **idx);

/* Cost proxy of a scene, in estimated layer edges, from its counts. Calibrated on the AV2
 * sample scenario (QCNET.md §8.1): Pt + P² + 240·A + 11·A·P + 10·A². */
int64_t qc_loader_cost_estimate(int64_t num_agents, int64_t num_polygons, int64_t num_points,
                                int64_t num_pl2pl);

/* Plans one epoch without a loader (pure function, for tests and tools): given N scene costs
 * (NULL: all equal), writes the batches of `rank` into ptr (room for ceil(N/B) + 1 entries) and
 * idx (room for N entries); returns the number of batches. */
int64_t qc_loader_plan_epoch(int64_t n, const int64_t *cost, uint64_t seed, int64_t epoch,
                             bool shuffle, int64_t batch_size, int64_t groups_per_rank,
                             int64_t rank, int64_t world_size, bool balance_cost, bool drop_last,
                             int64_t *ptr, int64_t *idx);
/* Groups of an epoch of n scenes over all ranks: ceil(n / B), or floor with drop_last. */
int64_t qc_loader_plan_groups(int64_t n, int64_t batch_size, bool drop_last);

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_LOADER_H */
