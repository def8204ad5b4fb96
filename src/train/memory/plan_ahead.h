/*
 * plan_ahead.h — the next group's planning made on a helper thread while this group runs
 * (stepmem.c): its description (the dry run), its admission plan with the edge modes, and its
 * calibrated plan, so that a group whose batch was known a group ahead starts with no planning
 * on its path.
 *
 * Everything the helper computes is a pure function of its job: the description of the batch
 * with the fixed bytes given, qc_plan_make_edges with the admission's inputs and
 * qc_plan_make_room with the calibrated plan's. A take answers the admission only when the job
 * was made of exactly what the trainer would plan with now (the same batch, the fixed bytes it
 * measures, the admission's hardware figures and parameters): the admission decides the bits
 * (a split, the edge modes) and must be the synchronous one's, bit for bit. The calibrated plan
 * decides no bit; it is made with the cost model as it was when the job started (one group's
 * measurements behind the synchronous plan's) and the caller takes it when the margin and
 * hardware figures it was made with are still in force.
 *
 * The helper owns a dry model and a program of its own; a take swaps them with the caller's
 * (the caller's description becomes the helper's scratch), so nothing is copied.
 *
 * States: IDLE -> RUNNING (start) -> DONE (the helper finished) -> IDLE (take or drop, both
 * waiting for RUNNING to end). One job at a time; start drops the one before. An error inside
 * the helper makes take answer false: the caller then plans itself and meets the error on its
 * own thread.
 */
#ifndef QC_TRAIN_MEMORY_PLAN_AHEAD_H
#define QC_TRAIN_MEMORY_PLAN_AHEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_config.h"
#include "qc_plan.h"
#include "qc_status.h"

struct qc_batch;
struct qc_qcnet;
struct plan_ahead;

/* What to plan. batch, cost0 and cost are the caller's: batch and cost0 unchanged until the job
 * is taken or dropped; cost is copied by start (the caller goes on calibrating its own). */
struct plan_ahead_job {
    const struct qc_batch *batch; /* the next group's host batch */
    uint64_t fixed_bytes;         /* the program's fixed bytes when that group starts */
    /* the admission plan (qc_plan_make_edges) */
    bool choose_edges;
    const struct qc_plan_cost *cost0;
    struct qc_plan_hw hw0;
    struct qc_plan_params par;
    /* the calibrated plan (qc_plan_make_room at cal, with par's room), made when the admission
     * plan fits */
    const struct qc_plan_cost *cost;
    struct qc_plan_hw hw;
    struct qc_plan_params cal;
};

/* What a take gives: the admission plan and its edge modes; the calibrated plan when made, with
 * the margin and hardware figures it was made with; the cost model it was made with (the
 * caller's to destroy; tests plan it again); the helper's time on the job. */
struct plan_ahead_out {
    struct qc_plan_result admit;
    uint32_t tiled;
    bool have_cal;
    struct qc_plan_result cal;
    bool room; /* qc_plan_make_room's ok */
    struct qc_plan_params cal_par;
    struct qc_plan_hw cal_hw;
    struct qc_plan_cost *cost;
    double busy_s;
};

/* The helper thread, waiting, with a dry model of cfg's. QC_ERR_NOMEM (no memory or no
 * thread), the dry model's errors. */
enum qc_status plan_ahead_create(const struct qc_config *cfg, struct plan_ahead **out);
/* Waits for a running job, ends the thread. NULL is a no-op. */
void plan_ahead_destroy(struct plan_ahead *pa);

/* Starts job on the helper (a job started before and not taken is waited for and dropped
 * first). QC_ERR_NOMEM copying the cost model: nothing started. */
enum qc_status plan_ahead_start(struct plan_ahead *pa, const struct plan_ahead_job *job);
/* Waits for the job started last and gives it back (IDLE). True when it planned batch b with
 * these fixed bytes, admission hardware figures and parameters, and succeeded: the caller's
 * *dry and *prog are swapped with the helper's (*prog then describes b, edge modes out->tiled,
 * as qc_plan_make_edges left it) and *out is filled (the caller frees its results and cost).
 * False otherwise (nothing started since the last take or drop, another batch or inputs, a
 * failure): nothing changed. *waited_s: seconds this call blocked. */
bool plan_ahead_take(struct plan_ahead *pa, const struct qc_batch *b, uint64_t fixed_bytes,
                     const struct qc_plan_hw *hw0, const struct qc_plan_params *par,
                     struct qc_qcnet **dry, struct qc_plan_program *prog,
                     struct plan_ahead_out *out, double *waited_s);
/* Waits for a running job and forgets it (the caller may then release its batch). */
void plan_ahead_drop(struct plan_ahead *pa);

/* Frees what a take gave. */
void plan_ahead_out_free(struct plan_ahead_out *o);

#endif /* QC_TRAIN_MEMORY_PLAN_AHEAD_H */
