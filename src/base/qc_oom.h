/*
 * qc_oom.h — out-of-memory messages: the figures they carry and the ONE place their hint line
 * is written (qc_oom_hint), so every OOM error, short or long, says the same true things.
 *
 * Who knows what: the caching allocator knows the budget and its bytes and records them when it
 * fails (qc_oom_record, thread-local, one record per failure); a model block knows only what it
 * asked for and which attention implementation it runs, and composes its short message with
 * qc_oom_errorf, which adds the recorded figures (then forgets them) and the hint.
 *
 * The hint names only what exists and applies: a smaller train.batch_size (not for one scene
 * alone), --attention fused when the failing block runs unfused attention (never when fused
 * already), and what the memory planner (src/plan) can do in this process, which the trainer
 * declares once (qc_oom_set_planner): set device.budget so that it plans (none set), let it
 * choose per block (plan.policy forced), give it an NVMe tier (offload.nvme_dir) or more budget
 * (it plans already), or nothing about it where no planner runs (eval, the benches).
 */
#ifndef QC_BASE_QC_OOM_H
#define QC_BASE_QC_OOM_H

#include <stdbool.h>
#include <stddef.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum qc_oom_attention {
    QC_OOM_ATTENTION_UNKNOWN = 0, /* the failing code does not know */
    QC_OOM_ATTENTION_FUSED,
    QC_OOM_ATTENTION_UNFUSED
};

/* What the memory planner of this process does about device memory (qc_oom_set_planner). */
enum qc_oom_planner {
    QC_OOM_PLANNER_NONE = 0,  /* no planner here (eval, benches, tests of the blocks) */
    QC_OOM_PLANNER_NO_BUDGET, /* plan.policy=auto without device.budget: everything kept */
    QC_OOM_PLANNER_FORCED,    /* plan.policy=keep|offload|recompute: one policy everywhere */
    QC_OOM_PLANNER_AUTO       /* every group planned under device.budget */
};

/* The figures of one failed allocation. Zero-initialise; have_budget_figures says whether the
 * byte fields were filled (by the allocator). */
struct qc_oom_facts {
    bool have_budget_figures;
    size_t bytes_requested; /* the failed request */
    size_t bytes_budget;    /* 0 = no budget */
    size_t bytes_allocated; /* live bytes at the failure */
    size_t bytes_reserved;  /* mapped bytes at the failure */
    enum qc_oom_attention attention;
    enum qc_oom_planner planner; /* qc_oom_errorf fills it from qc_oom_set_planner */
    bool nvme_tier;              /* the planner has an NVMe tier (offload.nvme_dir) */
    bool one_scene;              /* the failure is one scene that does not fit even alone: a
                                    smaller batch cannot help; --skip-oversized can */
};

/* Declares what the planner of this process does (the trainer, at creation; NONE again when
 * it is destroyed); qc_oom_errorf and qc_oom_planner_facts pass it to qc_oom_hint. */
void qc_oom_set_planner(enum qc_oom_planner planner, bool nvme_tier);
/* Declares why the offload.nvme_dir given gave no NVMe tier (the offload engine's reason; NULL
 * or "" when it did or none was given): the hint then names that reason instead of advising an
 * NVMe tier. */
void qc_oom_set_nvme_unusable(const char *why);
/* Fills f's planner and nvme_tier from the declaration. */
void qc_oom_planner_facts(struct qc_oom_facts *f);

/* The hint line for facts f ("hint: ...", no newline) into buf (n bytes); returns buf. */
const char *qc_oom_hint(const struct qc_oom_facts *f, char *buf, size_t n);

/* Records the allocator's figures of a failure on this thread (replacing any earlier record). */
void qc_oom_record(const struct qc_oom_facts *f);
/* Takes this thread's record into *f (zeroed when there is none) and forgets it. */
void qc_oom_take(struct qc_oom_facts *f);

/* Sets the last error (QC_ERR_NOMEM) to the formatted message, then " (budget B, allocated A,
 * reserved R)" when the allocator recorded figures for this failure, then "\n" and the hint;
 * consumes the record. Returns QC_ERR_NOMEM. */
enum qc_status qc_oom_errorf(enum qc_oom_attention attention, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* As qc_oom_errorf, for memory a run holds whatever its batch and its plan (the parameters and
 * their gradients): the message, the allocator's figures, and a hint that names only what can
 * help (device.budget, or the device when none is set; a smaller model), never the batch or the
 * planner. Returns QC_ERR_NOMEM. */
enum qc_status qc_oom_fixed_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_OOM_H */
