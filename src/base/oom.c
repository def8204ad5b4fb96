/*
 * oom.c — out-of-memory figures and the hint line (qc_oom.h).
 */
#include "qc_oom.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "qc_progress.h" /* qc_format_bytes */

static _Thread_local struct qc_oom_facts oom_last;

const char *qc_oom_hint(const struct qc_oom_facts *f, char *buf, size_t n)
{
    /* what exists today: the batch, the fused attention, the budget (qc_oom.h) */
    snprintf(buf, n, "hint: lower train.batch_size%s, or raise device.budget%s",
             f->attention == QC_OOM_ATTENTION_UNFUSED
                 ? ", use --attention fused (its per-layer stash is 7-26x smaller)"
                 : "",
             f->have_budget_figures && f->bytes_budget == 0 ? " (none is set: the device is full)"
                                                            : "");
    return buf;
}

void qc_oom_record(const struct qc_oom_facts *f)
{
    oom_last = *f;
    oom_last.have_budget_figures = true;
}

void qc_oom_take(struct qc_oom_facts *f)
{
    *f = oom_last;
    memset(&oom_last, 0, sizeof oom_last);
}

enum qc_status qc_oom_errorf(enum qc_oom_attention attention, const char *fmt, ...)
{
    struct qc_oom_facts f;
    qc_oom_take(&f);
    f.attention = attention;
    char msg[1024], figures[256] = "", hint[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (f.have_budget_figures) {
        char b[3][32] = {"none", "", ""};
        if (f.bytes_budget)
            qc_format_bytes(f.bytes_budget, b[0], sizeof b[0]);
        qc_format_bytes(f.bytes_allocated, b[1], sizeof b[1]);
        qc_format_bytes(f.bytes_reserved, b[2], sizeof b[2]);
        snprintf(figures, sizeof figures, " (budget %s, allocated %s, reserved %s)", b[0], b[1],
                 b[2]);
    }
    return qc_errorf(QC_ERR_NOMEM, "%s%s\n%s", msg, figures, qc_oom_hint(&f, hint, sizeof hint));
}
