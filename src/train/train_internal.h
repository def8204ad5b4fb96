/*
 * train_internal.h — shared inside src/train: the backend object (backend.c) and the staging of
 * loader batches into device memory for the training loop.
 *
 * A staged batch is a host batch from the loader plus, on a device backend, byte copies of its
 * two storage blocks (node_mem, graph_mem) in allocator memory and the view of them that
 * qc_batch_rebase gives (what the model takes as ctx.batch_dev):
 *   CUDA  the blocks are allocated on the copy stream and copied there asynchronously
 *         (qc_memcpy_async H2D from the loader's pinned batch), an event marks the end of the
 *         copies; the compute stream waits for it before the model's first op on the batch
 *         (train_stage_use); the blocks are also recorded on the compute stream, so their
 *         stream-ordered free (train_stage_drop, on the copy stream) waits for the model's work.
 *   EMU   the CPU device's copy stream is a worker thread whose plain memcpy would fault on the
 *         protected arena, so the blocks are allocated on the compute stream and filled with
 *         qc_op_upload on the model's exec (immediate); the rest is the CUDA path, so the
 *         trainer's batch_dev path is what the EMU tests run.
 *   CPU   nothing is copied: the model reads the host batch (batch_dev NULL).
 * The host batch stays held (it is what the model's host code reads, and the CUDA copy's
 * source) until the stage is dropped, after qc_qcnet_release.
 */
#ifndef QC_TRAIN_TRAIN_INTERNAL_H
#define QC_TRAIN_TRAIN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "qc_alloc.h"
#include "qc_batch.h"
#include "qc_config.h"
#include "qc_device.h"
#include "qc_emu.h"
#include "qc_exec.h"
#include "qc_memctx.h"
#include "qc_memreport.h"
#include "qc_pinned.h"
#include "qc_train.h"

struct qc_kernels_cuda; /* qc_kernels_cuda.h (CUDA builds only) */

struct qc_train_backend {
    enum qc_config_device kind;   /* device.kind */
    struct qc_device *dev;        /* CUDA device, or a CPU device (cpu, emu) */
    struct qc_stream *copy;       /* CUDA: the batch copy stream; NULL otherwise */
    struct qc_emu *emu;           /* EMU: the arena under the allocator; NULL otherwise */
    struct qc_alloc *alloc;       /* the caching allocator of every model and optimizer byte */
    struct qc_memctx *mc;         /* the models' memory context: alloc on the compute stream */
    struct qc_offload *offload;   /* the offload tier of the stash policies (qc_train_backend_
                                     offload), or NULL */
    struct qc_stream *copy_in;    /* its gets' stream */
    struct qc_pinned *pinned;     /* CUDA, EMU: pinned host memory of the loader's batches */
    void *workspace;              /* CUDA: the ops' reduction workspace (from alloc) */
    void *staging;                /* CUDA: the ops' upload staging ring (from pinned) */
    struct qc_kernels_cuda *kctx; /* CUDA: the op context, current on the creating thread */
    struct qc_exec exec;          /* the backend of every op (backend CPU on CPU) */
};

/* One batch staged for the model (module comment). Zero-initialise; the event is created on
 * first use and kept across stagings (train_stage_deinit destroys it). */
struct train_stage {
    struct qc_batch *host;      /* from the loader; NULL: the stage is empty */
    struct qc_batch view;       /* device view of the copies (device backends) */
    void *node_dev, *graph_dev; /* allocator blocks holding node_mem / graph_mem copies */
    struct qc_event *ev;        /* CUDA: recorded on the copy stream after the copies */
};

/* Stages host batch b (taken over: the stage holds it until train_stage_drop) on backend be.
 * On failure the stage is left empty and b is NOT taken (the caller releases it).
 * QC_ERR_NOMEM from the allocator, QC_ERR_CUDA. */
enum qc_status train_stage_put(struct qc_train_backend *be, struct train_stage *s,
                               struct qc_batch *b);
/* The device view to pass as ctx.batch_dev (NULL on CPU); on CUDA the compute stream waits for
 * the copies first. */
enum qc_status train_stage_use(struct qc_train_backend *be, struct train_stage *s,
                               const struct qc_batch **batch_dev);
/* Frees the device copies (stream-ordered) and returns the host batch, leaving the stage empty
 * (the event is kept). Call after qc_qcnet_release. An empty stage gives NULL. */
struct qc_batch *train_stage_drop(struct qc_train_backend *be, struct train_stage *s);
/* Destroys the stage's event; the stage must be empty. */
void train_stage_deinit(struct train_stage *s);

// ---- the step's memory (memory/stepmem.c) -----------------------------------------------------

struct qc_loader;
struct train_mem; /* the memory system of a run (stepmem.c) */

/* The memory figures of one step (metrics.jsonl's memory fields). */
struct train_mem_step {
    uint64_t predicted_peak;  /* the highest predicted peak of the step's groups */
    uint64_t host_bytes;      /* stash bytes offloaded to the host tier */
    uint64_t nvme_bytes;      /* to the NVMe tier */
    uint64_t recompute_bytes; /* rebuilt by recompute */
    double stall_s;           /* waiting for fetches (host time) */
    double plan_s;            /* describing and planning the step's batches, on its path */
    double plan_ahead_s;      /* the helper's planning of the step's groups made while the group
                                 before ran (memory/plan_ahead.h): off the step's path */
    int64_t replans;          /* groups rolled back after running out and re-planned */
    int64_t splits;           /* batches split into sub-groups */
    int64_t skipped;          /* scenes skipped as oversized (skip_oversized) */
    bool rolled_back;         /* a group ran out and was rolled back: the measured peak holds
                                 the failed attempt's allocations (no planner error figure) */
};

/* The plan kept for memory.json (qc_memreport.h's plan, with its storage). */
struct train_mem_plan {
    struct qc_memreport_plan r;
    struct qc_memreport_plan_block *blocks; /* r.blocks */
    int32_t cap;
};

/* The losses (sums over the group's sub-groups) and scenes a group ran. */
struct train_group_out {
    double loss, reg_loss_propose, reg_loss_refine, cls_loss;
    int64_t scenes;
};

/* The memory system of a run on backend be for model (stepmem.c's module comment): the dry
 * model of cfg, the cost model (RUN/plan_cost.json when it exists: a resumed run starts
 * calibrated), and, when plan.policy may offload (offload, or auto with a budget), the
 * backend's offload tier with its bandwidths measured. */
enum qc_status train_mem_create(const struct qc_config *cfg, struct qc_train_backend *be,
                                const struct qc_qcnet *model, const char *run_dir,
                                bool skip_oversized, struct train_mem **out);
void train_mem_destroy(struct train_mem *tm);
/* Brackets of one optimizer step: step_begin before its first group; step_end after the last
 * (measured_peak: the allocator's active peak of the step). */
void train_mem_step_begin(struct train_mem *tm, struct qc_qcnet *model);
void train_mem_step_end(struct train_mem *tm, struct qc_qcnet *model, uint64_t measured_peak,
                        int64_t step);
struct train_dist;
/* Runs one group (the batch staged in stage): plans, splits when it does not fit, runs forward,
 * loss and backward with ctx and backward scale weight, rolls back and re-plans on running
 * out. The group's losses and scenes in out. QC_ERR_NOMEM for a scene that never fits.
 * td (NULL: one rank), when armed for this group (the rank's last of the step): the parts of a
 * split group before the last run held, and a rollback after reported ranges settles them and
 * keeps their reduced values (train_dist_hold, train_dist_settle). */
enum qc_status train_mem_group(struct train_mem *tm, struct qc_qcnet *model,
                               struct qc_loader *loader, struct train_stage *stage,
                               const struct qc_batch *next, const struct qc_qcnet_ctx *ctx,
                               float weight, struct train_dist *td, struct train_group_out *out);
/* Whether the run plans each group while the one before runs (a budget: memory/plan_ahead.h):
 * then the loop fetches the next group's host batch before running a group and passes it to
 * train_mem_group as next (NULL: none known). */
bool train_mem_plans_ahead(const struct train_mem *tm);
/* Waits for and forgets the next group's planning: call before releasing a batch passed as
 * next that will not run as the next group. NULL is a no-op. */
void train_mem_ahead_drop(struct train_mem *tm);
const struct train_mem_step *train_mem_last_step(const struct train_mem *tm);
/* The plan of the step with the highest measured peak so far (NULL before one ran). */
const struct qc_memreport_plan *train_mem_plan_shown(const struct train_mem *tm);
/* The run's cost model. */
const struct qc_plan_cost *train_mem_cost(const struct train_mem *tm);
/* qc_trainer_set_plan_hook. */
void train_mem_set_hook(struct train_mem *tm,
                        void (*fn)(void *user, const struct qc_plan_program *prog, uint8_t *policy),
                        void *user);
/* qc_trainer_plans_beside. */
enum qc_status train_mem_beside(struct train_mem *tm, bool check, int64_t *made, int64_t *differ);
/* qc_trainer_plans_ahead. */
void train_mem_ahead(const struct train_mem *tm, int64_t *admitted, int64_t *calibrated,
                     int64_t *differ);
/* qc_trainer_parts_admitted. */
void train_mem_parts(const struct train_mem *tm, int64_t *kept, int64_t *differ);
/* Writes the cost model to RUN/plan_cost.json (atomically). */
enum qc_status train_mem_save(const struct train_mem *tm, const char *run_dir);
/* rm -rf path (run_dir.c): a folder of the run that belongs to no one (the caller holds the
 * run lock or created it). Symbolic links are removed, not followed. A missing path is fine.
 * QC_ERR_IO. */
enum qc_status train_remove_tree(const char *path);
/* Test hook (docs/RELIABILITY.md; run_dir.c): QC_FAULT_CKPT_DELAY_MS=N sleeps N ms at each stage of
 * a checkpoint save (folder created, model written, optim written) and before each leftover the
 * run-folder recovery handles, widening the windows the crash and race tests aim at. */
void train_fault_delay(void);

#endif /* QC_TRAIN_TRAIN_INTERNAL_H */
