/*
 * qc_trainer_test.h — what only the tests reach into a run for (defined in loop.c): the models'
 * memory context and the offload engine (fault injection, offload statistics), and a hook that
 * may change each group's planned policies. Not for the program: qctrain, the benches and the
 * tuner use qc_train.h alone.
 */
#ifndef QC_TRAIN_QC_TRAINER_TEST_H
#define QC_TRAIN_QC_TRAINER_TEST_H

#include <stdint.h>

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

#ifdef __cplusplus
}
#endif

#endif /* QC_TRAIN_QC_TRAINER_TEST_H */
