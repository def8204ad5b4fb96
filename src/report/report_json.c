/*
 * report_json.c — reading one JSON file of a run folder (report_load_json), for report.c
 * (memory.json, run.json) and report_plan.c (trace/index.json). It sits below both, so the files
 * of src/report call one way (report.c -> report_plan.c -> report_json.c).
 */
#include "report_internal.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

enum qc_status report_load_json(const char *path, cJSON **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? QC_OK
                               : qc_errorf(QC_ERR_IO, "report: %s: %s", path, strerror(errno));
    struct qc_strbuf b = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        qc_strbuf_add(&b, chunk, got);
    const bool bad = ferror(f) != 0;
    fclose(f);
    enum qc_status st = qc_strbuf_status(&b, "report");
    if (st == QC_OK && bad)
        st = qc_errorf(QC_ERR_IO, "report: reading %s failed", path);
    if (st == QC_OK) {
        *out = b.p ? cJSON_ParseWithLength(b.p, b.len) : NULL;
        if (!*out)
            st = qc_errorf(QC_ERR_INVALID, "report: %s is not valid JSON (near byte %zu)", path,
                           b.p && cJSON_GetErrorPtr() ? (size_t)(cJSON_GetErrorPtr() - b.p) : 0);
    }
    qc_strbuf_free(&b);
    return st;
}
