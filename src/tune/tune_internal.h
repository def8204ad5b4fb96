/*
 * tune_internal.h — what the files of src/tune share (README.md): the predictor (the planner
 * sessions, the weighed scenes, the cost model in force) and the predictions of candidates.
 */
#ifndef QC_TUNE_TUNE_INTERNAL_H
#define QC_TUNE_TUNE_INTERNAL_H

#include "qc_half.h"
#include "qc_tune.h"

struct qc_plan_cost;
struct qc_train_planner;

/* The planner sessions of one search: one per attention implementation and precision (the
 * dry model depends on both), the scenes weighed, heaviest first, and the cost model in
 * force. */
struct tune_predictor {
    struct qc_config cfg; /* the base, budget and mixed scenes applied */
    struct qc_train_planner *session[2][QC_PREC_COUNT]; /* per enum qc_attention_impl and
                                                           enum qc_precision; NULL until used */
    bool allow_precision;                               /* tune_min_budget tries every precision */
    const char *const *data;
    int ndata;
    int64_t *order; /* the weighed scenes' indices, heaviest first (ties: lower index) */
    int64_t nweighed;
    uint64_t budget;
    int64_t ranks;                   /* dist.world_size, 1 when 0 */
    const struct qc_plan_cost *cost; /* in force (NULL: built-in), borrowed */
    /* each session's calibration of this machine (qc_train_calib_get; NULL: built-in), owned:
     * in force while cost is NULL */
    struct qc_plan_cost *calib[2][QC_PREC_COUNT];
};

/* Opens the session of cfg's attention and precision and weighs up to tail_scenes scenes (each
 * planned alone, kept whole: its bytes above the fixed ones). */
enum qc_status tune_predictor_init(struct tune_predictor *p, const struct qc_config *cfg,
                                   const char *const *data, int ndata, uint64_t budget,
                                   int64_t tail_scenes);
void tune_predictor_deinit(struct tune_predictor *p);
/* Plans with cost model c from now on (NULL: each session's calibration of this machine, or the
 * built-in coefficients under plan.calibration=builtin), in every session. */
void tune_predictor_use_cost(struct tune_predictor *p, const struct qc_plan_cost *c);
/* Predicts c->set: the heavy tail's peak and policies (fits: peak within the budget's target),
 * a typical micro-batch's step time. Sets c's predicted fields and state (PRUNED or FITS;
 * MEASURED and SAME stay). */
enum qc_status tune_predict(struct tune_predictor *p, struct qc_tune_candidate *c);
/* The least budget under which a batch of the heaviest scene alone fits (the planner's
 * smallest plan, either attention, any precision of the space), rounded up to a MiB. */
enum qc_status tune_min_budget(struct tune_predictor *p, uint64_t *out);

/* The search space of cfg for global batch G (README.md "The space"): candidates in
 * enumeration order (malloc'd; *n). Only the predicted keys vary; measured-only keys keep
 * cfg's values. */
enum qc_status tune_space(const struct qc_config *cfg, int64_t G, int64_t ranks,
                          bool allow_precision, struct qc_tune_candidate **out, int64_t *n);

#endif /* QC_TUNE_TUNE_INTERNAL_H */
