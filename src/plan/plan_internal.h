/*
 * plan_internal.h — what the files of src/plan share (never included from outside): the
 * program compiled for simulation (plan.c) and the cost model's internals (cost.c).
 *
 * Glossary (README.md has the full one).
 *   position  one stretch of the program's events: a block's forward span, its backward span,
 *             or the glue between spans (loss, transposes, the host's work). A position has a
 *             duration (the cost model's time of its span; glue: 0, the step's glue time is
 *             added once) and, for the allocations that no policy moves, the change of live
 *             bytes over it (delta) and the most it rises above its start (excursion, with
 *             the blocks' transient scratch).
 *   policy    keep, offload host, offload NVMe, recompute (qc_plan.h).
 *   state     where a block's stash is in the simulation: NONE (before its forward), LIVE,
 *             OUT (in a tier; its device memory pending until the put's copy ends), FETCH
 *             (coming back), DROPPED (to recompute), FREED (after its backward).
 *
 * Invariants of one simulation (plan.c, checked by qc_plan_check):
 *   live(t) = fixed + Σ_{positions < t} delta + Σ_{b counted at t} stash(b)
 *   peak    = max over positions p of (live at p's start + excursion(p)) and over recomputes
 *             of (live + scratch_fwd + redo)
 *   time    = Σ durations + Σ stalls + Σ recompute forwards + glue
 *   host_bytes + nvme_bytes + recompute_bytes = Σ_{b: policy ≠ keep} stash(b)
 */
#ifndef QC_PLAN_PLAN_INTERNAL_H
#define QC_PLAN_PLAN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_plan.h"

/* The margin of qc_plan_room's target (plan.c): p's margin taken twice, at least ROOM_MIN
 * of the budget more, at most half the budget. */
double plan_room_margin(const struct qc_plan_params *p);

/* The step time outside the blocks, from the cost model. */
double plan_cost_glue(const struct qc_plan_cost *c);

enum { POS_FWD = 0, POS_BWD = 1, POS_GLUE = 2 };

struct sim_pos {
    int32_t block;      /* POS_FWD, POS_BWD: the block; -1 for glue */
    int32_t at;         /* the position's number counting every span and glue of the program
                           (explain.c's count): the simulation leaves empty glue out */
    int8_t kind;        /* POS_* */
    int64_t delta;      /* change of unmoved live bytes over the position */
    uint64_t excursion; /* most the unmoved live bytes rise above the start, transients in */
};

/* The program compiled for simulation (plan.c). */
struct sim {
    const struct qc_plan_program *prog;
    int32_t nb, npos;
    struct sim_pos *pos;
    uint64_t *stash;            /* [nb] rounded stash bytes */
    double *tf, *tb;            /* [nb] forward / backward seconds */
    uint64_t *sf;               /* [nb] forward transient bytes (a recompute's scratch) */
    uint64_t *redo;             /* [nb] a recompute's temporary output */
    int32_t *need_off, *need;   /* CSR: the stashes b's backward reads (b first, then uses) */
    int32_t *evict_off, *evict; /* CSR: blocks whose last forward use is b's forward */
    int32_t *rank;              /* [nb] b's position in the backward order (-1: none) */
    /* prefetch: the needs of the backwards, in the backward order, flattened (rank r's from
     * pf_start[r]), their stash bytes summed (pf_cum[i]: before item i); pf_end[r]: where the
     * prefetch of rank r's backward stops under pf_window (the window it was computed for) */
    int32_t *pf_flat, *pf_start, *pf_end, nflat;
    uint64_t *pf_cum, pf_window;
    bool none, pf_none; /* nothing fetched ahead (qc_plan_params.prefetch_none); pf_none: the
                           value pf_end was computed for */
    uint64_t fixed, target, window, host_cap, nvme_cap;
    double d2h, h2d, nvme_w, nvme_r; /* bytes per second */
    bool serial;                     /* copies add to the compute's time (hw.serial_copies) */
    double glue_s;
    /* one run's state */
    uint8_t *state;
    double *free_at, *done, *added;
    int32_t *pending;
    int32_t npending;
};

/* Compiles p for simulating under params (plan.c); release with plan_sim_free. QC_ERR_NOMEM. */
enum qc_status plan_sim_compile(struct sim *s, const struct qc_plan_program *p,
                                const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                                const struct qc_plan_params *par);
void plan_sim_free(struct sim *s);

/* What made a simulation's peak: a position's own bytes (its excursion), a fetch before a
 * backward, or the recompute of a dropped stash before a backward. */
enum plan_peak_cause { PLAN_PEAK_SPAN = 0, PLAN_PEAK_FETCH, PLAN_PEAK_REDO };

/* The peak of one simulation of pol and what stood there (explain.c reads it). */
struct plan_peak {
    uint64_t peak;
    int32_t pos;   /* the position (sim_pos.at: every span and glue of the program counted) */
    int32_t block; /* the block running, or recomputed (REDO); -1 between blocks */
    int phase;     /* 0 forward, 1 backward */
    enum plan_peak_cause cause;
    int32_t *at_peak; /* [nb] (caller's) blocks whose stash was counted */
    int32_t nat_peak;
};
/* Simulates pol on s and fills out (at_peak must hold s->nb entries). */
void plan_sim_peak(struct sim *s, const uint8_t *pol, struct plan_peak *out);

#endif /* QC_PLAN_PLAN_INTERNAL_H */
