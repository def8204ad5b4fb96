/*
 * report_curves.c — the "curves" object of the report from RUN/metrics.jsonl.
 *
 * Each metric of qc_report_metrics becomes one series against the step. Long runs are
 * downsampled so the page stays small: the lines are cut into buckets of
 * B = ceil(lines / QC_REPORT_CURVE_POINTS) consecutive lines, and each bucket gives its first
 * step and [min, mean, max] of every metric (dygraphs draws the mean with a min-max band, so a
 * spike inside a bucket stays visible). B = 1 gives every value exactly as logged (%.9g keeps an
 * fp32 loss exact). A line that is not a JSON object (a crash can cut the last one) is skipped
 * and counted. Output:
 *   "curves": {"lines": N, "bucket": B, "skipped": K, "x": [step...],
 *              "series": {"<key>": [[min, mean, max] | null, ...], ...},
 *              "eval": {"lines": E, "bucket": B2, "x": [...], "series": {...}}}
 * Only metrics present in at least one line appear in "series".
 */
#include "report_internal.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Values of one kind of line (step or eval): rows of nm doubles (NaN = absent). */
struct table {
    int nm;        /* metrics of this kind */
    int idx[64];   /* their indexes in qc_report_metrics */
    double *v;     /* [n][nm] */
    int64_t *step; /* [n] */
    int64_t n, cap;
    bool present[64]; /* a metric had a value somewhere */
};

static void table_init(struct table *t, bool eval)
{
    memset(t, 0, sizeof *t);
    int nm = 0;
    const struct qc_report_metric *m = qc_report_metrics(&nm);
    for (int i = 0; i < nm && t->nm < 64; i++)
        if (m[i].eval == eval)
            t->idx[t->nm++] = i;
}

static bool table_add(struct table *t, int64_t step, const cJSON *src)
{
    if (t->n == t->cap) {
        const int64_t cap = t->cap ? 2 * t->cap : 1024;
        double *v = realloc(t->v, (size_t)(cap * t->nm) * sizeof *v);
        if (!v)
            return false;
        t->v = v;
        int64_t *s = realloc(t->step, (size_t)cap * sizeof *s);
        if (!s)
            return false;
        t->step = s;
        t->cap = cap;
    }
    int nm = 0;
    const struct qc_report_metric *m = qc_report_metrics(&nm);
    double *row = t->v + t->n * t->nm;
    for (int j = 0; j < t->nm; j++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(src, m[t->idx[j]].key);
        row[j] = cJSON_IsNumber(x) ? x->valuedouble : (double)NAN;
        if (cJSON_IsNumber(x))
            t->present[j] = true;
    }
    t->step[t->n++] = step;
    return true;
}

static void table_free(struct table *t)
{
    free(t->v);
    free(t->step);
}

/* Appends "lines", "bucket", "x", "series" of t (inside an open object). */
static int64_t table_json(const struct table *t, struct qc_strbuf *b)
{
    const int64_t B = t->n > QC_REPORT_CURVE_POINTS
                          ? (t->n + QC_REPORT_CURVE_POINTS - 1) / QC_REPORT_CURVE_POINTS
                          : 1;
    const int64_t nb = (t->n + B - 1) / B;
    qc_strbuf_printf(b, "\"lines\": %" PRId64 ", \"bucket\": %" PRId64 ", \"x\": [", t->n, B);
    for (int64_t k = 0; k < nb; k++)
        qc_strbuf_printf(b, k ? ",%" PRId64 : "%" PRId64, t->step[k * B]);
    qc_strbuf_puts(b, "], \"series\": {");
    int nm = 0, written = 0;
    const struct qc_report_metric *m = qc_report_metrics(&nm);
    for (int j = 0; j < t->nm; j++) {
        if (!t->present[j])
            continue;
        qc_strbuf_puts(b, written++ ? ",\n    " : "\n    ");
        qc_strbuf_json_str(b, m[t->idx[j]].key);
        qc_strbuf_puts(b, ": [");
        for (int64_t k = 0; k < nb; k++) {
            double lo = (double)INFINITY, hi = -(double)INFINITY, sum = 0;
            int64_t cnt = 0;
            for (int64_t i = k * B; i < (k + 1) * B && i < t->n; i++) {
                const double x = t->v[i * t->nm + j];
                if (!isfinite(x))
                    continue;
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
                sum += x;
                cnt++;
            }
            if (k)
                qc_strbuf_puts(b, ",");
            if (!cnt) {
                qc_strbuf_puts(b, "null");
                continue;
            }
            if (B == 1) {
                qc_strbuf_puts(b, "[");
                qc_strbuf_json_num(b, lo, 9);
                qc_strbuf_puts(b, ",");
                qc_strbuf_json_num(b, lo, 9);
                qc_strbuf_puts(b, ",");
                qc_strbuf_json_num(b, lo, 9);
                qc_strbuf_puts(b, "]");
                continue;
            }
            qc_strbuf_puts(b, "[");
            qc_strbuf_json_num(b, lo, 7);
            qc_strbuf_puts(b, ",");
            qc_strbuf_json_num(b, sum / (double)cnt, 7);
            qc_strbuf_puts(b, ",");
            qc_strbuf_json_num(b, hi, 7);
            qc_strbuf_puts(b, "]");
        }
        qc_strbuf_puts(b, "]");
    }
    qc_strbuf_puts(b, "}");
    return nb;
}

enum qc_status report_curves_json(const char *run_dir, struct qc_strbuf *b,
                                  struct report_notes *notes, int64_t *lines, int64_t *points)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    struct table steps, evals;
    table_init(&steps, false);
    table_init(&evals, true);
    int64_t skipped = 0;
    enum qc_status st = QC_OK;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno != ENOENT)
            return qc_errorf(QC_ERR_IO, "report: %s: %s", path, strerror(errno));
        report_note(notes, "metrics.jsonl was not found in the run folder: no curves.");
    } else {
        char *line = NULL;
        size_t cap = 0;
        while (st == QC_OK && getline(&line, &cap, f) > 0) {
            cJSON *o = cJSON_Parse(line);
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
            const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "eval");
            if (!cJSON_IsObject(o) || !cJSON_IsNumber(s)) {
                skipped++;
            } else if (!(cJSON_IsObject(ev) ? table_add(&evals, (int64_t)s->valuedouble, ev)
                                            : table_add(&steps, (int64_t)s->valuedouble, o))) {
                st = qc_errorf(QC_ERR_NOMEM, "report: out of memory reading %s", path);
            }
            cJSON_Delete(o);
        }
        free(line);
        if (st == QC_OK && ferror(f))
            st = qc_errorf(QC_ERR_IO, "report: reading %s failed", path);
        fclose(f);
        if (skipped)
            report_note(notes,
                        "metrics.jsonl: %" PRId64 " line(s) were not JSON objects with "
                        "a step and were skipped.",
                        skipped);
    }
    if (st == QC_OK) {
        qc_strbuf_printf(b, "\"curves\": {\"skipped\": %" PRId64 ", ", skipped);
        *points = table_json(&steps, b);
        qc_strbuf_puts(b, ",\n  \"eval\": {");
        table_json(&evals, b);
        qc_strbuf_puts(b, "}}");
        *lines = steps.n;
    }
    table_free(&steps);
    table_free(&evals);
    return st;
}
