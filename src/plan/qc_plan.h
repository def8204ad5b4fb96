/*
 * qc_plan.h — the memory planner: given one training step's program (its block applications
 * and every allocation, from the model's dry run), a cost model and the hardware's figures, it
 * chooses a stash policy per block application (keep, offload to the host or NVMe tier,
 * recompute) that minimises the predicted step time with the predicted peak of device bytes
 * at or under the budget minus a margin. src/plan/README.md has the glossary, the invariants as
 * equations and the algorithm (docs/design/PLANNER.md is the design).
 *
 *   program   what one step allocates, in order, with markers where each block's forward and
 *             backward begin and end (struct qc_plan_program). The model writes it
 *             (qc_qcnet_describe, src/model/qc_qcnet.h) from the batch's sizes alone.
 *   cost      per block kind, linear models of forward / backward time in their size
 *             drivers, calibrated from measured steps (struct qc_plan_cost, cost.c),
 *             persisted as JSON in the run folder. The blocks' transient memory is not a
 *             model: the program states it (the blocks' memory specs, src/mem/qc_memspec.h).
 *   hw        bandwidths of the copy paths and the tiers' capacities (struct qc_plan_hw).
 *   plan      qc_plan_make: the policy vector, the predicted peak and step time, the predicted
 *             per-block costs (struct qc_plan_result).
 *
 * Nothing here touches a device: `qctrain plan` and a tuner call it with figures of a machine
 * they do not run on. Thread safety: none needed (plain data); one result per call.
 */
#ifndef QC_PLAN_QC_PLAN_H
#define QC_PLAN_QC_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_PLAN_NAME_MAX  128 /* bytes of a block name, NUL included */
#define QC_PLAN_STASH_MAX 3   /* stash arenas of one block application */

/* Where the fused attention's relative embeddings r of an edge set and dL/dr live (= enum
 * qc_attn_edge_mode of src/model/qc_attention.h, which the model records per block):
 *   MATERIALISED  the edge context computes r (E,D) once and keeps it; the applications sum
 *                 dL/dr (E,D), the context's backward runs the FE backward once;
 *   TILED         no tensor of E rows: every application computes its r tiles (an FE forward
 *                 over the set's edges) in its forward and again in its backward, where it
 *                 also pushes dL/dr back through the FE (an FE backward). */
enum qc_plan_edge_mode { QC_PLAN_EDGE_NONE = 0, QC_PLAN_EDGE_MATERIALISED, QC_PLAN_EDGE_TILED };
/* "none", "materialised", "tiled" ("?" out of range). */
const char *qc_plan_edge_mode_str(enum qc_plan_edge_mode m);

/* What a block application is (the model's tape kinds). */
enum qc_plan_kind {
    QC_PLAN_FE = 0, /* FourierEmbedding over rows */
    QC_PLAN_EDGES,  /* edge context of an edge set (stash: unfused only) */
    QC_PLAN_KV,     /* source/edge context of a bipartite attention layer */
    QC_PLAN_ATTN,   /* one application of an attention layer (self: with its own context) */
    QC_PLAN_MLP,    /* an MLP head */
    QC_PLAN_GRU,    /* the trajectory GRU */
    QC_PLAN_KIND_COUNT
};

/* Where a block application's stash lives between its forward and its backward. */
enum qc_stash_policy {
    QC_POLICY_KEEP = 0,     /* on the device */
    QC_POLICY_OFFLOAD_HOST, /* copied to the pinned host tier after the last forward use */
    QC_POLICY_OFFLOAD_NVME, /* ... to the NVMe tier */
    QC_POLICY_RECOMPUTE,    /* freed after the last forward use, the forward re-run before the
                               first backward use */
    QC_POLICY_COUNT
};

const char *qc_plan_kind_str(enum qc_plan_kind k);
/* "keep", "offload_host", "offload_nvme", "recompute". */
const char *qc_plan_policy_str(enum qc_stash_policy p);

// ---- the program of one step -----------------------------------------------------------------

enum qc_plan_op {
    QC_PLAN_OP_FWD = 0, /* block's forward begins */
    QC_PLAN_OP_FWD_END, /* ... ends */
    QC_PLAN_OP_BWD,     /* block's backward begins */
    QC_PLAN_OP_BWD_END, /* ... ends */
    QC_PLAN_OP_ALLOC,   /* allocation id of bytes (class cls) */
    QC_PLAN_OP_FREE,    /* allocation id is given back */
    QC_PLAN_OP_STASH,   /* allocation id is a stash arena of block */
    QC_PLAN_OP_PEAK,    /* a transient of bytes at this point of the block's span that the
                           program does not state as ALLOC/FREE (hand-made programs; the
                           model's dry run states every allocation) */
    QC_PLAN_OP_COUNT
};

/* Allocation classes (= qc_memctx.h's). */
enum { QC_PLAN_CLS_PARAM = 0, QC_PLAN_CLS_MODEL, QC_PLAN_CLS_BLOCK };

struct qc_plan_event {
    uint8_t op;    /* enum qc_plan_op */
    uint8_t cls;   /* ALLOC: allocation class */
    uint8_t phase; /* PEAK: 0 forward, 1 backward */
    uint8_t pad;
    int32_t block;  /* FWD*, BWD*, STASH, PEAK: the block index; else -1 */
    int32_t id;     /* ALLOC, FREE, STASH: the allocation id (0, 1, 2, ... in ALLOC order) */
    uint32_t pad2;  /* 0: the struct has no padding bytes, so programs compare with memcmp */
    uint64_t bytes; /* ALLOC: bytes asked for; PEAK: transient bytes */
};

/* One block application. The first group is set by the program's writer; the rest by
 * qc_plan_program_finish. */
struct qc_plan_block {
    char name[QC_PLAN_NAME_MAX];
    enum qc_plan_kind kind;
    bool fused;          /* ATTN, KV, EDGES: the fused attention implementation */
    int64_t rows;        /* size drivers: rows computed (destinations, FE / MLP rows, ...) */
    int64_t edges;       /* base edges (ATTN, KV, EDGES) */
    int64_t srcs;        /* source rows (ATTN, KV) */
    bool can_recompute;  /* its forward can run again from kept inputs */
    uint64_t redo_bytes; /* transient of a recompute beyond its scratch: the output it rewrites */
    int32_t edge_set;    /* EDGES, KV, ATTN: the model's edge set (enum qc_edge_set); else -1 */
    uint8_t edge_mode;   /* EDGES, ATTN: enum qc_plan_edge_mode of its edge set (NONE: the set
                            has no r to place: unfused, or no positional input) */
    /* finish: */
    uint32_t nstash;
    int32_t stash_id[QC_PLAN_STASH_MAX]; /* allocation ids of its arenas */
    uint64_t stash_bytes;                /* Σ their bytes asked for */
    int32_t fwd_ev, fwd_end_ev;          /* event indices of its forward markers */
    int32_t bwd_ev, bwd_end_ev;          /* of its backward markers (-1: no backward) */
    int32_t fwd_last;                    /* block whose forward is the last to read its stash */
    int32_t bwd_first;                   /* block whose backward is the first to read it */
    int32_t edges_block;                 /* edge_set >= 0: the EDGES block of its set (-1: none) */
};

/* A use: user's forward and backward read used's stash (an attention application reads its
 * layer's source context; an unfused source context reads its edge context). A block always
 * uses its own stash. */
struct qc_plan_use {
    int32_t user, used;
};

struct qc_plan_program {
    struct qc_plan_block *blocks;
    int32_t nblocks, cap_blocks;
    struct qc_plan_event *ev;
    int32_t nev, cap_ev;
    struct qc_plan_use *uses;
    int32_t nuses, cap_uses;
    int32_t nalloc; /* allocation ids handed out */
    /* the allocations' tags ("<block>/<tensor>", qc_plan_program_tag): tag_off[id] into tags,
     * -1 when none; what qc_plan_explain names the bytes at the peak with */
    int64_t *tag_off;
    int32_t cap_tag_off;
    char *tags;
    int64_t tags_len, tags_cap;
    int32_t *bwd_order; /* finish: the blocks in the order their backward runs */
    int32_t nbwd;
    uint64_t fixed_bytes; /* what lives through the step outside the program (parameters,
                             gradients, optimizer state, the staged batch): the caller's */
    bool finished;
};

void qc_plan_program_init(struct qc_plan_program *p);
void qc_plan_program_free(struct qc_plan_program *p);
/* Empties it for the next step (keeps the memory). */
void qc_plan_program_reset(struct qc_plan_program *p);
/* Appends a block named name of kind; its index. QC_ERR_NOMEM as -1. */
int32_t qc_plan_program_block(struct qc_plan_program *p, const char *name, enum qc_plan_kind kind);
/* Appends an event: for ALLOC, id is assigned and returned; for the others, the event's index
 * is. -1 (QC_ERR_NOMEM set) when out of memory. */
int32_t qc_plan_program_event(struct qc_plan_program *p, enum qc_plan_op op, int32_t block,
                              int32_t id, uint64_t bytes, int cls, int phase);
/* Names allocation id (its tag; truncated to 127 bytes). QC_ERR_NOMEM. */
enum qc_status qc_plan_program_tag(struct qc_plan_program *p, int32_t id, const char *tag);
/* The tag of allocation id, or "" when it has none. */
const char *qc_plan_program_tag_of(const struct qc_plan_program *p, int32_t id);
/* How long each allocation of the program lives (= qc_alloc.h's enum qc_alloc_life): LONG when
 * it is freed after the program's last block marker or not at all, SPAN when no block marker
 * lies between its ALLOC and its FREE (a block's scratch, or glue's; this first), PHASE
 * otherwise. */
enum { QC_PLAN_LIFE_LONG = 0, QC_PLAN_LIFE_PHASE, QC_PLAN_LIFE_SPAN };
/* life[id] for every allocation id (p->nalloc entries; the caller's array). QC_ERR_NOMEM. */
enum qc_status qc_plan_program_lives(const struct qc_plan_program *p, uint8_t *life);
/* Records that user's forward and backward read used's stash (once per pair). */
enum qc_status qc_plan_program_use(struct qc_plan_program *p, int32_t user, int32_t used);
/* Derives the per-block fields (stash ids and bytes, marker positions, fwd_last, bwd_first,
 * the backward order) and checks the program's invariants (README.md): every FREE follows its
 * ALLOC, markers nest, a block's stash arenas are freed in its own backward. QC_ERR_INVALID
 * naming the first violation. */
enum qc_status qc_plan_program_finish(struct qc_plan_program *p);

// ---- the cost model -------------------------------------------------------------------------

/* Per block application, how long its forward and backward take, as linear models in the
 * block's work (its size drivers: qc_plan_work): t = coefficient × work. Calibrated per block name
 * from measured steps with an exponential moving average, falling back to the mean over the
 * measured blocks of the same kind, then to built-in per-kind coefficients (measured once on a
 * 2-core x86-64 CPU backend at AV2 size); a step-level factor scales every time to the measured
 * step time. */
struct qc_plan_cost;

/* The work of block b for the cost model: rows for FE and MLP, rows × steps for the GRU,
 * rows + edges (+ sources) for the attention kinds. */
double qc_plan_work(const struct qc_plan_block *b);

/* A cost model with the built-in coefficients. QC_ERR_NOMEM. */
enum qc_status qc_plan_cost_create(struct qc_plan_cost **out);
void qc_plan_cost_destroy(struct qc_plan_cost *c); /* NULL is a no-op */
/* A device the planner has no measurement of (a GPU preset without a calibrated run): times
 * from a roofline of its figures. Each block takes max(FLOPs / flops, bytes / mem_bps) plus
 * QC_PLAN_ROOFLINE_LAUNCHES kernel launches of QC_PLAN_ROOFLINE_LAUNCH_S (backward: twice
 * each), FLOPs and bytes estimated from its size drivers and the model's sizes; the glue is the
 * optimizer's sweep over nparams (28 bytes each) at mem_bps. A lower bound on a real step. */
struct qc_plan_roofline {
    double flops;       /* peak FLOP/s (hw.tflops x 1e12) */
    double mem_bps;     /* device memory bytes/s (hw.mem_gbps x 1e9) */
    int64_t hidden_dim; /* model.hidden_dim */
    int64_t freq_bands; /* model.num_freq_bands */
    int64_t nparams;    /* parameters (the optimizer's sweep) */
};
#define QC_PLAN_ROOFLINE_LAUNCHES 10   /* kernels per block forward */
#define QC_PLAN_ROOFLINE_LAUNCH_S 5e-6 /* s per kernel launch */
/* QC_ERR_INVALID when a figure is missing (0), QC_ERR_NOMEM. */
enum qc_status qc_plan_cost_create_roofline(const struct qc_plan_roofline *r,
                                            struct qc_plan_cost **out);
/* Whether c's times come from a roofline (qc_plan_cost_create_roofline). */
bool qc_plan_cost_is_roofline(const struct qc_plan_cost *c);
/* Reads a cost model saved by qc_plan_cost_save (the run folder's plan_cost.json) over c.
 * QC_ERR_IO (missing file), QC_ERR_INVALID (naming the file and what is wrong). */
enum qc_status qc_plan_cost_load(struct qc_plan_cost *c, const char *path);
/* Writes c to path atomically (temp + fsync + rename). QC_ERR_IO naming the file. */
enum qc_status qc_plan_cost_save(const struct qc_plan_cost *c, const char *path);

/* One block application as measured in a step (host seconds). */
struct qc_plan_measure {
    double t_fwd, t_bwd;
};
/* Folds one measured step into c: per-block coefficients (blocks whose time is 0 are skipped,
 * and so are the blocks of a TILED edge set: their coefficients price the materialised work,
 * from which the tiled mode's is derived), and the step factor (step_s over the predicted
 * compute time). per_block false: only the step factor (a backend whose host clock does not
 * see the device's work, CUDA). */
void qc_plan_cost_update(struct qc_plan_cost *c, const struct qc_plan_program *p,
                         const struct qc_plan_measure *m, double step_s, bool per_block);
/* qc_plan_cost_update of a warm-up measurement (a process's first measured group: memory to
 * fault in, cold caches, thread pools starting): it prices the plans until the next update,
 * which first puts the model back as it was before it and then folds its own measurement, so
 * the warm-up weighs in no coefficient (folded like any step, the EMA would keep (1 − α)^k of
 * it after k more steps: 34 % after 3). QC_ERR_NOMEM: nothing changed. */
enum qc_status qc_plan_cost_update_warmup(struct qc_plan_cost *c, const struct qc_plan_program *p,
                                          const struct qc_plan_measure *m, double step_s,
                                          bool per_block);
/* Predicted forward (phase 0) / backward (1) seconds of block b of p. On a TILED edge set
 * (edge_mode) the tiled mode's FE work is priced from the set's edge context (edges_block)
 * as if it materialised r: an application adds the context's forward to its forward and the
 * context's forward + backward to its backward; the context itself computes no r (0 s). */
double qc_plan_cost_time(const struct qc_plan_cost *c, const struct qc_plan_program *p, int32_t b,
                         int phase);
/* The same for block b as if its edge set were MATERIALISED (what the coefficients price). */
double qc_plan_cost_time_materialised(const struct qc_plan_cost *c, const struct qc_plan_program *p,
                                      int32_t b, int phase);
/* Steps folded in (0: the built-in coefficients only), and a phrase for users: "built-in
 * coefficients" or "calibrated over N steps". */
int64_t qc_plan_cost_steps(const struct qc_plan_cost *c);
const char *qc_plan_cost_source(const struct qc_plan_cost *c, char *buf, size_t n);

// ---- planning -------------------------------------------------------------------------------

/* The copy paths and the tiers (bandwidths in GB/s = 1e9 bytes/s). */
struct qc_plan_hw {
    double d2h_gbps, h2d_gbps;              /* device <-> pinned host copies */
    double nvme_write_gbps, nvme_read_gbps; /* the NVMe leg (in series with the copy) */
    uint64_t host_capacity;                 /* host tier bytes; 0 = no host tier */
    uint64_t nvme_capacity;                 /* NVMe tier bytes; 0 = no NVMe tier */
    bool serial_copies; /* copies run in the compute's thread (the CPU backend's inline copy
                           streams): their time adds to the step's, nothing overlaps */
};

enum qc_plan_mode {
    QC_PLAN_MODE_AUTO = 0,
    QC_PLAN_MODE_KEEP,
    QC_PLAN_MODE_OFFLOAD,
    QC_PLAN_MODE_RECOMPUTE
};
enum qc_plan_place { QC_PLAN_PLACE_AUTO = 0, QC_PLAN_PLACE_HOST, QC_PLAN_PLACE_NVME };

struct qc_plan_params {
    uint64_t budget;          /* device bytes the step must fit (0 = unlimited) */
    double margin;            /* fraction of the budget kept free (0.02) */
    uint64_t round;           /* the allocator's request rounding (512) */
    uint64_t prefetch_window; /* bytes fetched back ahead of backward */
    bool prefetch_none;       /* not even the next backward's stashes are fetched ahead: each
                                 offloaded stash comes back at its own backward (a stall);
                                 the search sets it when nothing else fits */
    enum qc_plan_mode mode;   /* auto = search; the others force one policy on every block */
    enum qc_plan_place place; /* where offloaded stashes go (auto: host, NVMe when it is full) */
    uint64_t min_stash;       /* auto: smaller stashes are always kept (64 KiB) */
};
/* budget 0, margin 0.02, round 512, window 256 MiB, auto, auto, 64 KiB. */
void qc_plan_params_default(struct qc_plan_params *p);

struct qc_plan_result {
    int32_t nblocks;
    uint8_t *policy;    /* [nblocks] enum qc_stash_policy (owned) */
    double *block_s;    /* [nblocks] predicted forward + backward seconds, with what the
                           policy adds (a recompute, the stall waiting for its fetch) */
    double *added_s;    /* [nblocks] of which the policy adds */
    uint64_t peak;      /* predicted peak of device bytes, fixed bytes included */
    uint64_t keep_peak; /* the peak with every stash kept */
    uint64_t target;    /* budget × (1 − margin); 0 without a budget */
    double step_s;      /* predicted step time */
    double keep_step_s; /* with every stash kept */
    double stall_s;     /* predicted prefetch stall */
    uint64_t host_bytes, nvme_bytes, recompute_bytes; /* stash bytes per policy */
    bool fits;                                        /* peak <= target (true without a budget) */
    int32_t peak_block; /* the block running at the peak, its phase (0 fwd, 1 bwd) */
    int peak_phase;
    int iterations;     /* search steps */
    double plan_s;      /* host seconds spent in qc_plan_make */
    uint64_t window;    /* the prefetch window the plan assumes: params.prefetch_window, or less
                           when only a smaller one fits (the runtime must fetch within it) */
    bool prefetch_none; /* the plan fetches nothing ahead, not even the next backward's stashes
                           (params.prefetch_none, or the search's last resort when window 0
                           does not fit): the runtime must not either */
};

/* Chooses the policies (module comment; README.md "The search"). prog must be finished; its
 * fixed_bytes are part of every peak. Without a fit the result holds the smallest peak found
 * (fits false): the caller splits the batch (admission control). QC_ERR_NOMEM. */
enum qc_status qc_plan_make(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                            const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                            struct qc_plan_result *out);
/* Predicts the peak and time of the given policies (no search); fills out like qc_plan_make.
 * QC_ERR_INVALID for a policy the tiers cannot take (naming the block). */
enum qc_status qc_plan_evaluate(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                                const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                                const uint8_t *policy, struct qc_plan_result *out);
/* The checker (README.md, invariants): re-simulates r's policies and checks peak, time and
 * the per-policy byte sums, fits ⇔ peak <= target, offload only to tiers that exist.
 * QC_ERR_INVALID naming the first violation. */
enum qc_status qc_plan_check(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                             const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                             const struct qc_plan_result *r);
void qc_plan_result_free(struct qc_plan_result *r);

// ---- the edge modes: materialised (fast) or tiled (small) per edge set -----------------------

#define QC_PLAN_EDGE_SETS_MAX 32 /* edge sets a mask of tiled sets names (bit s: set s) */

/* What tiling one materialised edge set saves and costs (qc_plan_edge_order). */
struct qc_plan_edge_gain {
    int32_t set;    /* the model's edge set */
    int32_t block;  /* its EDGES block */
    uint64_t bytes; /* r and dL/dr, E x D each: twice the context's stash bytes */
    double extra_s; /* seconds the tiled mode adds: per application an FE forward in its forward
                       and an FE forward + backward in its backward, less the context's own FE
                       forward and backward */
};
/* The MATERIALISED edge sets of p (finished) with what tiling each saves and costs under c, the
 * most bytes per extra second first (ties: the lower set first), in out[0 .. cap); their
 * number. */
int qc_plan_edge_order(const struct qc_plan_program *p, const struct qc_plan_cost *c,
                       struct qc_plan_edge_gain *out, int cap);

/* Room for a plan that fetches nothing ahead. Such a plan (prefetch_none) has no room left for
 * what the plan does not see (the allocator's rounding and fragmentation) nor a smaller window
 * to fall back on when the step runs out: at AV2 size under 0.48 GiB a materialised plan at 481
 * of 482 MiB ran out in 4 of 6 steps and split. *ok: r fits fetching something ahead, or fits
 * with the margin taken twice (at least 5 % of the budget more) — r itself when its peak is
 * under that target, else pr planned again there, and that plan (its target reported as r's)
 * replaces r. *ok false: r is left as it was. Without a budget, *ok = r->fits. */
enum qc_status qc_plan_room(const struct qc_plan_program *pr, const struct qc_plan_cost *cost,
                            const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                            struct qc_plan_result *r, bool *ok);
/* qc_plan_make under p, then qc_plan_room under room (NULL: p; only the margins may differ)
 * in one search — what the trainer and qc_plan_make_edges call; qc_plan_room, planning again
 * from everything kept, stays as the reference tests/test_plan.c holds it to: the same result (ok,
 * policies, peak, window, iterations, target reported), for about one search instead of two — the
 * second plan's moves are the first's and then more, since no move of the search depends on its
 * target. */
enum qc_status qc_plan_make_room(const struct qc_plan_program *prog,
                                 const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                                 const struct qc_plan_params *p, const struct qc_plan_params *room,
                                 struct qc_plan_result *out, bool *ok);
/* Whether r (planned under p) has that room as it is: it fits fetching something ahead, or
 * fetching nothing ahead under the doubled margin's target. */
bool qc_plan_has_room(const struct qc_plan_params *p, const struct qc_plan_result *r);

/* Describes the step with the edge sets of mask `tiled` tiled and the others in their default
 * mode: *prog (finished, fixed_bytes set) stays valid until the next call. */
struct qc_plan_describer {
    enum qc_status (*describe)(void *user, uint32_t tiled, const struct qc_plan_program **prog);
    void *user;
};
/* Plans the step choosing the edge modes (README.md, "The edge modes"): the default modes
 * first (choose false, no budget, or a plan that fits: that one); else every materialised set
 * tiled (no fit there: that plan, fits false, and the caller splits the batch); else the sets
 * go tiled one at a time in qc_plan_edge_order's order of the first program, each new program
 * planned (qc_plan_make: its policies), until one fits — a plan that fits only by fetching
 * nothing ahead fits here only with room (qc_plan_room, whose plan is returned). *tiled: the
 * mask of the program returned, *prog: that program (the describer's last), out: its plan.
 * QC_ERR_NOMEM, the describer's errors. */
enum qc_status qc_plan_make_edges(const struct qc_plan_describer *d, bool choose,
                                  const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                                  const struct qc_plan_params *p, uint32_t *tiled,
                                  const struct qc_plan_program **prog, struct qc_plan_result *out);

// ---- what holds the memory at the peak ------------------------------------------------------

/* Who holds bytes at a plan's peak. */
enum qc_plan_hold {
    QC_PLAN_HOLD_FIXED = 0,  /* parameters, gradients, optimizer state, the staged batch */
    QC_PLAN_HOLD_STASH_READ, /* a stash the running block reads there: no policy moves it */
    QC_PLAN_HOLD_STASH,      /* a stash resident there that the running block does not read
                                (kept by its policy, or its copy out still in flight) */
    QC_PLAN_HOLD_TENSOR,     /* an allocation live across spans that no policy moves (a
                                context's index arrays or gradient buffers, dL/dr, outputs) */
    QC_PLAN_HOLD_WORKING,    /* the running block's own working set at its high point */
    QC_PLAN_HOLD_RECOMPUTE,  /* a recompute's scratch and output (when one makes the peak) */
    QC_PLAN_HOLD_COUNT
};

struct qc_plan_holder {
    char name[QC_PLAN_NAME_MAX + 48]; /* the allocation's tag, "stash of <block>", ... */
    enum qc_plan_hold kind;
    uint64_t bytes; /* as the simulation counts them (rounded to params.round) */
    int32_t count;  /* allocations of this name (a tag can repeat) */
};

/* The bytes at a plan's peak, by holder: Σ holders = peak exactly (the simulation's own
 * accounting, replayed). */
struct qc_plan_explain {
    uint64_t peak;
    int32_t block; /* the block running at the peak (recomputed, for a recompute), -1: none */
    int phase;     /* 0 forward, 1 backward */
    bool recompute, fetch;    /* the peak is a recompute, a fetch, before the block's backward */
    struct qc_plan_holder *h; /* sorted by bytes, largest first (owned) */
    int32_t n;
    uint64_t by_kind[QC_PLAN_HOLD_COUNT];
};

/* Explains r (made for prog under cost, hw, p by qc_plan_make or _evaluate): replays its
 * policies and names what holds every byte at its peak. QC_ERR_NOMEM; QC_ERR_INVALID when the
 * holders do not add up to the peak (a planner bug, named). */
enum qc_status qc_plan_explain(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                               const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                               const struct qc_plan_result *r, struct qc_plan_explain *out);
void qc_plan_explain_free(struct qc_plan_explain *e);
/* "fixed", "stash", "tensor", "working set", "recompute". */
const char *qc_plan_hold_str(enum qc_plan_hold k);
/* The explanation as text: where the peak is, the bytes by kind, and the top largest holders
 * (the rest summed). */
void qc_plan_explain_print(FILE *out, const struct qc_plan_program *prog,
                           const struct qc_plan_explain *e, int top);

/* The plan as a table: one line per block (name, kind, stash bytes, policy, predicted
 * seconds, added seconds), then the predicted peak and step time. */
void qc_plan_print(FILE *out, const struct qc_plan_program *prog, const struct qc_plan_result *r);

#ifdef __cplusplus
}
#endif

#endif /* QC_PLAN_QC_PLAN_H */
