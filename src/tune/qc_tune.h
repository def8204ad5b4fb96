/*
 * qc_tune.h — `qctrain tune`: the fastest settings that fit a memory budget, predicted by the
 * planner, measured by short training runs (README.md: glossary, the search as steps,
 * invariants).
 *
 *   space     the settings tried (struct qc_tune_settings): micro-batch × accumulation for the
 *             global batch, plan margin, policy limit (plan.policy), prefetch window, attention,
 *             precision (only when allowed: it changes results); measured only: loader
 *             and compute threads, NVMe queue depth and block size
 *   predict   every point planned on the heavy tail of the data (the B heaviest scenes) under
 *             the budget: fits or pruned; speed from a typical batch's predicted step
 *   measure   the best predicted few, a few real training steps each; the run's calibrated
 *             cost model refines every prediction before the next choice
 *   choose    the highest measured samples/s whose measured peak is under the budget
 *
 * Nothing predicted over the budget is ever measured. A choice within the measurement noise
 * of another candidate is named as such (qc_tune_result.within_noise_of). The choice is a pure
 * function of the configuration, the data and the measurements (qc_tune_opts.measure injects them
 * in tests).
 */
#ifndef QC_TUNE_QC_TUNE_H
#define QC_TUNE_QC_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_config.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One point of the search space: the keys tune may change. */
struct qc_tune_settings {
    int64_t batch_size, grad_accum;   /* train.batch_size, train.grad_accum */
    double margin;                    /* plan.margin */
    enum qc_plan_policy policy;       /* plan.policy */
    uint64_t prefetch_window;         /* offload.prefetch_window */
    enum qc_attention_impl attention; /* model.attention */
    enum qc_precision precision;      /* train.precision; varies only with
                                         qc_tune_opts.allow_precision */
    int64_t loader_threads;           /* data.loader_threads (measured only) */
    int64_t cpu_threads;              /* train.cpu_threads (measured only) */
    int64_t queue_depth;              /* offload.queue_depth (measured only) */
    uint64_t block_size;              /* offload.block_size (measured only) */
};

/* The settings of cfg, and cfg with s applied. */
void qc_tune_settings_of(const struct qc_config *cfg, struct qc_tune_settings *s);
void qc_tune_settings_apply(const struct qc_tune_settings *s, struct qc_config *cfg);

/* What a short training run measured. */
struct qc_tune_measure {
    double step_s;       /* median seconds of an optimizer step after the first */
    double step_s_min;   /* the fastest and the slowest of those steps: the spread that says */
    double step_s_max;   /* how far two candidates' speeds must differ to tell them apart */
    uint64_t peak_bytes; /* highest allocator peak over the steps */
    int64_t steps;       /* optimizer steps run */
    int64_t replans;     /* groups rolled back and re-planned */
    int64_t splits;      /* batches split (admission control) */
    bool failed;         /* a step failed (error in note) */
    char note[200];
};

/* Measures cfg (the candidate's settings applied; device.budget set): fills out, and, when
 * cost_path != NULL, may write the run's calibrated cost model there (qc_plan_cost_save) and
 * set *cost_written. A failed step is out->failed, not an error; an error stops the search. */
typedef enum qc_status (*qc_tune_measure_fn)(void *user, const struct qc_config *cfg,
                                             const char *const *data, int ndata,
                                             const char *cost_path, bool *cost_written,
                                             struct qc_tune_measure *out);

/* The real measurement: `steps` optimizer steps of a quiet trainer in a scratch folder under
 * $TMPDIR (removed after), seeded with the cost model at cost_path when that file exists.
 * user: int64_t * steps (NULL: 3). */
enum qc_status qc_tune_measure_train(void *user, const struct qc_config *cfg,
                                     const char *const *data, int ndata, const char *cost_path,
                                     bool *cost_written, struct qc_tune_measure *out);

enum qc_tune_state {
    QC_TUNE_PRUNED = 0, /* predicted over the budget: never run */
    QC_TUNE_FITS,       /* predicted to fit, not measured */
    QC_TUNE_SAME,       /* predicted to fit, the same plan as a measured candidate */
    QC_TUNE_MEASURED,   /* measured */
};

struct qc_tune_candidate {
    struct qc_tune_settings set;
    enum qc_tune_state state;
    /* predicted (with the cost model in force when last predicted) */
    uint64_t peak;            /* heavy-tail micro-batch peak, bytes */
    double step_s;            /* optimizer step: grad_accum × a typical micro-batch's time */
    double samples_per_s;     /* global batch / step_s */
    uint64_t offload_bytes;   /* heavy tail: stash bytes offloaded (host + NVMe) */
    uint64_t nvme_bytes;      /* of which to NVMe */
    uint64_t recompute_bytes; /* heavy tail: stash bytes recomputed */
    uint64_t plan_hash;       /* the heavy tail's policies, batch and attention */
    /* measured (state MEASURED) */
    double predicted_at_run_s; /* step_s predicted just before it ran */
    struct qc_tune_measure m;
    double measured_sps; /* global batch / m.step_s */
    int64_t order;       /* 1 for the first measured, ... */
};

struct qc_tune_opts {
    const struct qc_config *cfg; /* the base configuration (preset, --set) */
    const char *const *data;     /* qcshard files; ndata 0: generated `mixed` scenes */
    int ndata;
    uint64_t budget;            /* device bytes (> 0) */
    int64_t global_batch;       /* scenes per optimizer step, all ranks (> 0) */
    bool dry_run;               /* predict only */
    bool allow_precision;       /* also search train.precision (fp32, bf16, fp16) */
    double time_limit_s;        /* measurement stops starting new runs past it (> 0) */
    int64_t max_measured;       /* predicted candidates measured (3); variants come after */
    int64_t tail_scenes;        /* scenes weighed for the heavy tail (32) */
    const char *scratch;        /* folder for the cost model file (NULL: $TMPDIR or /tmp) */
    qc_tune_measure_fn measure; /* NULL: qc_tune_measure_train */
    void *measure_user;
    double (*clock)(void *user); /* monotonic seconds (NULL: CLOCK_MONOTONIC) */
    void *clock_user;
    /* progress (may be NULL): what runs now, candidates measured so far (done) of those the
     * search means to measure (total, which grows when variants of the fastest are added) */
    void (*progress)(void *user, const char *what, int64_t done, int64_t total);
    void *progress_user;
    bool (*stop)(void *user); /* polled between runs: true = stop, keep the best so far */
    void *stop_user;
};
void qc_tune_opts_init(struct qc_tune_opts *o);

struct qc_tune_result {
    struct qc_tune_candidate *cand; /* every point, in enumeration order (owned) */
    int64_t ncand;
    int64_t best;            /* the chosen candidate, -1 when none */
    bool best_measured;      /* false: chosen on prediction (dry run, or stopped before a run) */
    int64_t within_noise_of; /* the fastest other measured candidate whose samples/s range (from
                                its step-time spread) overlaps the chosen one's: no clear winner
                                between them; -1: the choice is clear (or not measured) */
    int64_t runs;            /* candidates measured */
    int64_t fitting;         /* candidates predicted to fit */
    int64_t heavy_scenes[8]; /* indices of the heaviest scenes (up to 8), heaviest first */
    int64_t weighed;         /* scenes weighed */
    uint64_t min_budget;     /* nothing fits: the least budget under which something would */
    bool stopped;            /* opts.stop or the time limit ended the measurements */
    double seconds;          /* wall seconds of the search */
};
void qc_tune_result_free(struct qc_tune_result *r);

/* Runs the search (module comment; README.md). Nothing fits: QC_ERR_INVALID naming the budget
 * and the least that would fit (r->min_budget), with a hint. */
enum qc_status qc_tune_run(const struct qc_tune_opts *o, struct qc_tune_result *r);

/* The preset that inherits base_name (a preset name or path; base its configuration) and sets
 * every key where tuned differs from base, after "description" and "inherits", as dotted keys
 * in the option table's order. A malloc'd JSON text (caller frees). QC_ERR_NOMEM. */
enum qc_status qc_tune_preset_json(const struct qc_config *base, const char *base_name,
                                   const struct qc_config *tuned, const char *description,
                                   char **out);
/* The keys of that preset besides description and inherits (for tests and messages): count. */
int qc_tune_preset_keys(const struct qc_config *base, const struct qc_config *tuned,
                        const char **keys, int max);

#ifdef __cplusplus
}
#endif

#endif /* QC_TUNE_QC_TUNE_H */
