/*
 * report.c — qc_report_write: the report of one run folder (qc_report.h).
 *
 * The data document (the page draws everything from it):
 *   {"format": "qctrain-report-data", "version": 1, "generated": ISO time, "run_dir": "...",
 *    "notes": [...], "libs": {"dygraphs": {...}, "chartjs": {...}},
 *    "metrics": [the qc_report_metrics table], "groups_of_blocks": {block: group},
 *    "memory": memory.json without its per-step list (the curves carry the steps),
 *    "run": run.json or null, "curves": {...}, "timeline": {...} | null,
 *    "holders": {...} | null (what holds the peak step's peak: report_holders.c)}
 * Size: memory.json's breakdown is bounded (33 blocks, 33 tags), the curves by
 * QC_REPORT_CURVE_POINTS buckets and the timeline by QC_REPORT_TIMELINE_POINTS points, so the
 * page stays around 1 MB whatever the run's length (docs/BENCHMARKS.md).
 */
#include "report_internal.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qc_file.h"

/* Appends cJSON's text of item (or null). */
static void put_json(struct qc_strbuf *b, const cJSON *item)
{
    char *t = item ? cJSON_PrintUnformatted(item) : NULL;
    qc_strbuf_puts(b, t ? t : "null");
    cJSON_free(t);
}

/* Checks the memory.json fields the page relies on. */
static enum qc_status check_memory(const cJSON *m, const char *path)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(m, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "qctrain-memory-report") != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "report: %s is not a qctrain memory report (\"format\" is not "
                         "\"qctrain-memory-report\")",
                         path);
    static const char *const need[] = {"allocator", "peak"};
    for (int i = 0; i < 2; i++)
        if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(m, need[i])))
            return qc_errorf(QC_ERR_INVALID, "report: %s: no \"%s\" object", path, need[i]);
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(m, "plan");
    if (plan && !cJSON_IsNull(plan) &&
        (!cJSON_IsObject(plan) || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(plan, "blocks"))))
        return qc_errorf(QC_ERR_INVALID,
                         "report: %s: \"plan\" is not an object with a \"blocks\" "
                         "array (docs/MEMORY_REPORT.md)",
                         path);
    return QC_OK;
}

static void put_lib(struct qc_strbuf *b, const char *key, const struct report_lib *l)
{
    qc_strbuf_printf(b, "\"%s\": {\"name\": ", key);
    qc_strbuf_json_str(b, l->name);
    qc_strbuf_puts(b, ", \"package\": ");
    qc_strbuf_json_str(b, l->package);
    qc_strbuf_puts(b, ", \"path\": ");
    qc_strbuf_json_str(b, l->path);
    qc_strbuf_printf(b, ", \"found\": %s}", l->text ? "true" : "false");
}

enum qc_status qc_report_write(const struct qc_report_opts *opts, struct qc_report_info *info)
{
    const char *dir = opts->run_dir;
    struct qc_report_info inf;
    memset(&inf, 0, sizeof inf);
    inf.timeline_step = -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/memory.json", dir);
    cJSON *mem = NULL;
    QC_TRY(report_load_json(path, &mem));
    if (!mem)
        return qc_errorf(QC_ERR_INVALID,
                         "report: %s not found\nhint: give the folder `qctrain train --out` "
                         "wrote; its memory report is written at every checkpoint and at the end",
                         path);
    enum qc_status st = check_memory(mem, path);
    cJSON *run = NULL;
    if (st == QC_OK) {
        snprintf(path, sizeof path, "%s/run.json", dir);
        st = report_load_json(path, &run);
    }
    if (st != QC_OK) {
        cJSON_Delete(mem);
        return st;
    }
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(mem, "plan");
    inf.has_plan = cJSON_IsObject(plan);
    cJSON_DeleteItemFromObjectCaseSensitive(mem, "steps"); /* per-step data: the curves */

    struct report_notes notes = {0};
    st = report_plan_measure(dir, mem, &notes);
    if (st != QC_OK) {
        cJSON_Delete(run);
        cJSON_Delete(mem);
        return st;
    }
    struct report_lib libs[2];
    report_libs_load(opts->js_dir, libs);
    inf.dygraphs = libs[0].text != NULL;
    inf.chartjs = libs[1].text != NULL;

    struct qc_strbuf d = {0};
    char when[64];
    const time_t now = time(NULL);
    struct tm tmv;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&now, &tmv));
    qc_strbuf_printf(&d,
                     "{\"format\": \"qctrain-report-data\", \"version\": 1, \"generated\": "
                     "\"%s\", \"run_dir\": ",
                     when);
    qc_strbuf_json_str(&d, dir);
    qc_strbuf_puts(&d, ",\n \"libs\": {");
    put_lib(&d, "dygraphs", &libs[0]);
    qc_strbuf_puts(&d, ", ");
    put_lib(&d, "chartjs", &libs[1]);
    qc_strbuf_puts(&d, "},\n \"metrics\": [");
    int nm = 0;
    const struct qc_report_metric *m = qc_report_metrics(&nm);
    for (int i = 0; i < nm; i++) {
        qc_strbuf_puts(&d, i ? ", {\"key\": " : "{\"key\": ");
        qc_strbuf_json_str(&d, m[i].key);
        qc_strbuf_printf(&d,
                         ", \"eval\": %s, \"tag\": \"%s\", \"chart\": \"%s\", \"unit\": \"%s\"}",
                         m[i].eval ? "true" : "false", m[i].tag, m[i].chart, m[i].unit);
    }
    qc_strbuf_puts(&d, "],\n \"groups_of_blocks\": {");
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(
                              cJSON_GetObjectItemCaseSensitive(mem, "peak"), "by_block"))
    {
        const cJSON *nmj = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (!cJSON_IsString(nmj))
            continue;
        qc_strbuf_puts(&d, k++ ? ", " : "");
        qc_strbuf_json_str(&d, nmj->valuestring);
        qc_strbuf_puts(&d, ": ");
        qc_strbuf_json_str(&d, report_block_group(nmj->valuestring));
    }
    qc_strbuf_puts(&d, "},\n \"memory\": ");
    put_json(&d, mem);
    qc_strbuf_puts(&d, ",\n \"run\": ");
    put_json(&d, run);
    if (!run)
        report_note(&notes, "run.json was not found in the run folder: the run section has no "
                            "configuration, machine or versions.");
    qc_strbuf_puts(&d, ",\n ");
    st = report_curves_json(dir, &d, &notes, &inf.metric_lines, &inf.curve_points);
    if (st == QC_OK) {
        qc_strbuf_puts(&d, ",\n ");
        st = report_timeline_json(dir, opts->step, &d, &notes, &inf.timeline_step);
    }
    if (st == QC_OK) {
        qc_strbuf_puts(&d, ",\n ");
        st = report_holders_json(dir, mem, &d, &notes);
    }
    if (st == QC_OK) {
        qc_strbuf_puts(&d, ",\n \"notes\": [");
        for (int i = 0; i < notes.n; i++) {
            if (i)
                qc_strbuf_puts(&d, ", ");
            qc_strbuf_json_str(&d, notes.text[i]);
        }
        qc_strbuf_puts(&d, "]}\n");
        st = qc_strbuf_status(&d, "report data");
    }
    struct qc_strbuf page = {0};
    if (st == QC_OK) {
        char title[4300];
        snprintf(title, sizeof title, "qctrain report: %s", dir);
        st = report_html_build(d.p, d.len, libs, title, &page);
    }
    if (st == QC_OK) {
        if (opts->out_path)
            snprintf(inf.path, sizeof inf.path, "%s", opts->out_path);
        else
            snprintf(inf.path, sizeof inf.path, "%s/report.html", dir);
        const struct qc_file_part part = {page.p, page.len};
        st = qc_file_write_atomic(inf.path, &part, 1, "report");
        inf.bytes = page.len;
    }
    qc_strbuf_free(&page);
    qc_strbuf_free(&d);
    report_libs_free(libs);
    cJSON_Delete(run);
    cJSON_Delete(mem);
    if (st == QC_OK && info)
        *info = inf;
    return st;
}
