/*
 * plan_beside.h — one plan made on a helper thread beside the trainer's own planning
 * (stepmem.c): the group's calibrated plan is searched while the admission plan of the same
 * program is, so a step's planning costs about one search on its path instead of two.
 *
 * The plan is qc_plan_make_room's, a pure function of its inputs: what the helper finds is what
 * the trainer would find planning it itself, bit for bit. The caller keeps the program, the
 * cost model and the hardware figures unchanged from plan_beside_start until the plan is taken
 * or dropped (the parameters are copied).
 *
 * States: IDLE (nothing started) -> RUNNING (start) -> DONE (the helper finished) -> IDLE (take
 * or drop, both waiting for RUNNING to end). One plan at a time; start drops the one before.
 * An error inside the helper (its message is the helper thread's) makes take answer false: the
 * caller then plans itself and meets the error on its own thread.
 */
#ifndef QC_TRAIN_MEMORY_PLAN_BESIDE_H
#define QC_TRAIN_MEMORY_PLAN_BESIDE_H

#include <stdbool.h>

#include "qc_plan.h"
#include "qc_status.h"

struct plan_beside;

/* The helper thread, waiting. QC_ERR_NOMEM (no memory or no thread). */
enum qc_status plan_beside_create(struct plan_beside **out);
/* Waits for a running plan, ends the thread. NULL is a no-op. */
void plan_beside_destroy(struct plan_beside *pb);

/* qc_plan_make_room(prog, cost, hw, p, room) on the helper thread (room NULL: p); a plan
 * started before and not taken is waited for and dropped first. */
void plan_beside_start(struct plan_beside *pb, const struct qc_plan_program *prog,
                       const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                       const struct qc_plan_params *p, const struct qc_plan_params *room);
/* Waits for the plan started last and gives it back (IDLE). True when it is the plan of
 * exactly these inputs (the same program and cost model, every field of hw, p and room equal
 * to the ones it started with) and succeeded: its result in *out (the caller's to free) and
 * qc_plan_make_room's ok in *ok. False otherwise (none started since the last take or drop,
 * other inputs, or it failed): *out untouched. *waited_s: seconds this call blocked. */
bool plan_beside_take(struct plan_beside *pb, const struct qc_plan_program *prog,
                      const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                      const struct qc_plan_params *p, const struct qc_plan_params *room,
                      struct qc_plan_result *out, bool *ok, double *waited_s);
/* Waits for a running plan and frees its result. */
void plan_beside_drop(struct plan_beside *pb);

/* Whether two sets of hardware figures / planning parameters are equal, field by field (the
 * structs have padding): the inputs a plan made off the step's path is taken with. */
bool plan_beside_same_hw(const struct qc_plan_hw *a, const struct qc_plan_hw *b);
bool plan_beside_same_params(const struct qc_plan_params *a, const struct qc_plan_params *b);

#endif /* QC_TRAIN_MEMORY_PLAN_BESIDE_H */
