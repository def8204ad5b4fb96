/*
 * oom.c — out-of-memory figures and the hint line (qc_oom.h).
 */
#include "qc_oom.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "qc_progress.h" /* qc_format_bytes */

static _Thread_local struct qc_oom_facts oom_last;
/* the process's planner (set by the trainer's thread before any step, read by the thread that
 * fails: the same one, or one started after it) */
static enum qc_oom_planner oom_planner;
static bool oom_nvme_tier;
static char oom_nvme_why[256]; /* why offload.nvme_dir gave no NVMe tier; "" when none */

void qc_oom_set_planner(enum qc_oom_planner planner, bool nvme_tier)
{
    oom_planner = planner;
    oom_nvme_tier = nvme_tier;
}

void qc_oom_set_nvme_unusable(const char *why)
{
    snprintf(oom_nvme_why, sizeof oom_nvme_why, "%s", why ? why : "");
}

void qc_oom_planner_facts(struct qc_oom_facts *f)
{
    f->planner = oom_planner;
    f->nvme_tier = oom_nvme_tier;
}

const char *qc_oom_hint(const struct qc_oom_facts *f, char *buf, size_t n)
{
    /* the advice, in order: the batch, the attention, the planner, the budget (qc_oom.h) */
    const char *items[6];
    char nvme[sizeof oom_nvme_why + 64];
    int k = 0;
    if (!f->one_scene)
        items[k++] = "lower train.batch_size";
    if (f->attention == QC_OOM_ATTENTION_UNFUSED)
        items[k++] = "use --attention fused (its per-layer stash is 7-26x smaller)";
    const bool none_set = f->have_budget_figures && f->bytes_budget == 0;
    switch (f->planner) {
    case QC_OOM_PLANNER_NO_BUDGET:
        items[k++] = "set device.budget to the bytes this process may use, so that the planner "
                     "(plan.policy=auto) offloads or recomputes stashes to fit every step under it";
        break;
    case QC_OOM_PLANNER_FORCED:
        items[k++] = "let the planner choose per block (plan.policy=auto)";
        items[k++] = "raise device.budget";
        break;
    case QC_OOM_PLANNER_AUTO:
        items[k++] = "raise device.budget";
        if (!f->nvme_tier && oom_nvme_why[0]) { /* one was asked for: say why there is none */
            snprintf(nvme, sizeof nvme, "make offload.nvme_dir usable (%s)", oom_nvme_why);
            items[k++] = nvme;
        } else if (!f->nvme_tier) {
            items[k++] = "give the planner an NVMe tier (offload.nvme_dir)";
        }
        break;
    case QC_OOM_PLANNER_NONE:
    default:
        items[k++] = none_set ? "raise device.budget (none is set: the device is full)"
                              : "raise device.budget";
        break;
    }
    if (f->one_scene)
        items[k++] = "--skip-oversized to skip such scenes";
    size_t len = (size_t)snprintf(buf, n, "hint:");
    for (int i = 0; i < k && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s%s", i == 0 ? " " : ", ",
                                i == k - 1 && k > 1 ? "or " : "", items[i]);
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

/* " (budget B, allocated A, reserved R)" when f carries the allocator's figures, else "". */
static void oom_figures(const struct qc_oom_facts *f, char *out, size_t n)
{
    out[0] = '\0';
    if (!f->have_budget_figures)
        return;
    char b[3][32] = {"none", "", ""};
    if (f->bytes_budget)
        qc_format_bytes(f->bytes_budget, b[0], sizeof b[0]);
    qc_format_bytes(f->bytes_allocated, b[1], sizeof b[1]);
    qc_format_bytes(f->bytes_reserved, b[2], sizeof b[2]);
    snprintf(out, n, " (budget %s, allocated %s, reserved %s)", b[0], b[1], b[2]);
}

enum qc_status qc_oom_errorf(enum qc_oom_attention attention, const char *fmt, ...)
{
    struct qc_oom_facts f;
    qc_oom_take(&f);
    f.attention = attention;
    qc_oom_planner_facts(&f);
    char msg[1024], figures[256], hint[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    oom_figures(&f, figures, sizeof figures);
    return qc_errorf(QC_ERR_NOMEM, "%s%s\n%s", msg, figures, qc_oom_hint(&f, hint, sizeof hint));
}

enum qc_status qc_oom_fixed_errorf(const char *fmt, ...)
{
    struct qc_oom_facts f;
    qc_oom_take(&f);
    char msg[1024], figures[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    oom_figures(&f, figures, sizeof figures);
    const bool none_set = f.have_budget_figures && f.bytes_budget == 0;
    return qc_errorf(QC_ERR_NOMEM, "%s%s\nhint: %s", msg, figures,
                     none_set ? "no device.budget is set: the device itself is full; use a "
                                "device with more memory or a smaller model"
                              : "raise device.budget above what these bytes need, or use a "
                                "smaller model (model.hidden_dim)");
}
