/*
 * qc_oom.h — out-of-memory messages: the figures they carry and the ONE place their hint line
 * is written (qc_oom_hint), so every OOM error, short or long, says the same true things.
 *
 * Who knows what: the caching allocator knows the budget and its bytes and records them when it
 * fails (qc_oom_record, thread-local, one record per failure); a model block knows only what it
 * asked for and which attention implementation it runs, and composes its short message with
 * qc_oom_errorf, which adds the recorded figures (then forgets them) and the hint.
 *
 * The hint names only what exists: a smaller train.batch_size, --attention fused when the
 * failing block runs unfused attention (never when fused already), a larger device.budget.
 * The memory planner, when it lands, extends qc_oom_hint (and only it) with its own advice.
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

/* The figures of one failed allocation. Zero-initialise; have_budget_figures says whether the
 * byte fields were filled (by the allocator). */
struct qc_oom_facts {
    bool have_budget_figures;
    size_t bytes_requested; /* the failed request */
    size_t bytes_budget;    /* 0 = no budget */
    size_t bytes_allocated; /* live bytes at the failure */
    size_t bytes_reserved;  /* mapped bytes at the failure */
    enum qc_oom_attention attention;
};

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

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_OOM_H */
