/*
 * qc_trainer_test.h — what only the tests reach into a run for (defined in loop.c): the models'
 * memory context and the offload engine (fault injection, offload statistics), and a hook that
 * may change each group's planned policies. Not for the program: qctrain, the benches and the
 * tuner use qc_train.h alone.
 */
#ifndef QC_TRAIN_QC_TRAINER_TEST_H
#define QC_TRAIN_QC_TRAINER_TEST_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_memctx;
struct qc_offload;
struct qc_plan_program;
struct qc_trainer;

/* The models' memory context (fault injection, offload statistics). */
struct qc_memctx *qc_trainer_memctx(struct qc_trainer *t);
/* The offload engine of the run's tiers; NULL when the run has none (no budget under
 * plan.policy=auto, or keep / recompute). */
struct qc_offload *qc_trainer_offload(struct qc_trainer *t);
/* fn(user, prog, policy) is called after each group is planned and may change its policies
 * (enum qc_stash_policy per block of prog) before the group runs, e.g. seeded random mixes;
 * offload policies need the run's tiers (plan.policy=offload). NULL removes it. */
void qc_trainer_set_plan_hook(struct qc_trainer *t,
                              void (*fn)(void *user, const struct qc_plan_program *prog,
                                         uint8_t *policy),
                              void *user);

/* The calibrated plans made on the planning helper beside admission (src/train/memory/
 * plan_beside.h) so far: *made (groups whose plan came from it), and, with check set, each also
 * planned on the trainer's own thread and compared, policies, peak, time, window and room:
 * *differ counts the ones that did not agree. check also starts the helper in a run of one
 * compute thread (which plans without it), so that a test can run it under ThreadSanitizer
 * without OpenMP's threads; check false stops the comparing. QC_ERR_NOMEM (no thread). */
enum qc_status qc_trainer_plans_beside(struct qc_trainer *t, bool check, int64_t *made,
                                       int64_t *differ);

/* The groups planned ahead on the helper while the group before ran (src/train/memory/
 * plan_ahead.h; runs with a budget) so far: *admitted (groups whose description and admission
 * plan came from it), *calibrated (of those, the ones whose calibrated plan did too), and, with
 * qc_trainer_plans_beside's check set, each admission also made on the trainer's own thread and
 * compared (plan, edge modes) and each calibrated plan made again of the same program with the
 * cost model it was made with: *differ counts the ones that did not agree. */
void qc_trainer_plans_ahead(struct qc_trainer *t, int64_t *admitted, int64_t *calibrated,
                            int64_t *differ);

/* The parts of split groups run with the batch and admission plan admission made of them (not
 * built and admitted again) so far: *kept, and, with qc_trainer_plans_beside's check set, each
 * also admitted again on its run and compared (plan, edge modes): *differ. */
void qc_trainer_parts_admitted(struct qc_trainer *t, int64_t *kept, int64_t *differ);

#ifdef __cplusplus
}
#endif

#endif /* QC_TRAIN_QC_TRAINER_TEST_H */
