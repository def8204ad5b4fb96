/*
 * trace_json.c — the recorded events as Chrome trace-event JSON (qc_profile.h), written
 * atomically. Streams the events (no document tree: a profiled AV2 step records ~10⁵ events).
 *
 * Format (the "JSON Object Format" of the Trace Event Format, which Perfetto imports):
 *   {"displayTimeUnit": "ms", "traceEvents": [ metadata (process and thread names), complete
 *    events {"ph": "X", "ts", "dur"} in µs from the first event, instants {"ph": "i"}, counters
 *    {"ph": "C"} ]}
 */
#include "qc_profile.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "qc_file.h" /* qc_file_fsync_dir_of */
#include "qc_json.h"
#include "qc_prof.h"

struct trace_ctx {
    FILE *f;
    int64_t t_origin; /* ns: the earliest event */
    int64_t n;        /* events written */
};

/* A JSON string (quotes included). */
static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* A JSON number (qc_json.h: non-finite as null): integers whole, others in 6 digits. */
static void put_num(FILE *f, double v)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 9e15)
        fputs(QC_JSON_NUM("%.0f", v), f);
    else
        fputs(QC_JSON_NUM("%.6g", v), f);
}

/* µs from the origin, to the nanosecond. */
static void put_us(FILE *f, int64_t ns)
{
    fprintf(f, "%" PRId64 ".%03" PRId64, ns / 1000, ns % 1000);
}

static void min_t0(const struct qc_prof_event *e, void *ctx)
{
    int64_t *t = ctx;
    if (!e->pending && (*t == 0 || e->t0 < *t))
        *t = e->t0;
}

static void put_shape(FILE *f, const struct qc_prof_event *e)
{
    /* "N=1000,IC=128,OC=128" from the dim names and values */
    char buf[256];
    size_t n = 0;
    const char *p = e->dims;
    for (int i = 0; i < 4 && p && *p; i++) {
        const char *c = strchr(p, ',');
        const size_t len = c ? (size_t)(c - p) : strlen(p);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%.*s=%" PRId64, i ? "," : "", (int)len, p,
                              e->d[i]);
        if (n >= sizeof buf)
            break;
        p = c ? c + 1 : p + len;
    }
    buf[n < sizeof buf ? n : sizeof buf - 1] = '\0';
    put_str(f, buf);
}

static void put_event(const struct qc_prof_event *e, void *vctx)
{
    struct trace_ctx *c = vctx;
    FILE *f = c->f;
    if (e->pending) /* a device event never resolved: no time to show */
        return;
    fputs(c->n++ ? ",\n" : "\n", f);
    const bool device = qc_prof_track_is_device(e->track);
    fputs("{\"name\":", f);
    put_str(f, e->name);
    fprintf(f, ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":",
            qc_prof_cat_str((enum qc_prof_cat)e->cat), device ? 2 : 1, (int)e->track);
    put_us(f, e->t0 - c->t_origin);
    if (e->instant)
        fputs(",\"ph\":\"i\",\"s\":\"t\"", f);
    else {
        fputs(",\"ph\":\"X\",\"dur\":", f);
        put_us(f, e->t1 - e->t0);
    }
    fputs(",\"args\":{", f);
    int na = 0;
    if (e->block) {
        fputs("\"block\":", f);
        put_str(f, e->block);
        na++;
    }
    if (e->pass) {
        fprintf(f, "%s\"pass\":\"%s\"", na++ ? "," : "",
                qc_prof_pass_str((enum qc_prof_pass)e->pass));
    }
    if (e->detail) {
        fprintf(f, "%s\"detail\":", na++ ? "," : "");
        put_str(f, e->detail);
    }
    if (e->dims && e->dims[0]) {
        fprintf(f, "%s\"shape\":", na++ ? "," : "");
        put_shape(f, e);
    }
    if (e->bytes > 0) {
        fprintf(f, "%s\"bytes\":", na++ ? "," : "");
        put_num(f, e->bytes);
    }
    if (e->flops > 0) {
        fprintf(f, "%s\"flops\":", na++ ? "," : "");
        put_num(f, e->flops);
    }
    if (e->parent) {
        fprintf(f, "%s\"nested_in\":%" PRId32 ",\"weight\":", na++ ? "," : "", e->parent);
        put_num(f, (double)e->weight);
    }
    if (e->id)
        fprintf(f, "%s\"op_id\":%" PRId32, na++ ? "," : "", e->id);
    fputs("}}", f);
    if (e->cat == QC_PROF_CAT_ALLOC) { /* the counter track of allocated bytes */
        fputs(",\n{\"name\":\"allocated bytes\",\"ph\":\"C\",\"pid\":", f);
        fprintf(f, "%d,\"ts\":", device ? 2 : 1);
        put_us(f, e->t0 - c->t_origin);
        fputs(",\"args\":{\"bytes\":", f);
        put_num(f, e->value);
        fputs("}}", f);
        c->n++;
    }
}

enum qc_status qc_profile_trace_write(const char *path)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return qc_errorf(QC_ERR_INVALID, "profile: trace path too long: %s", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return qc_errorf(QC_ERR_IO,
                         "profile: cannot write %s: %s\nhint: check the folder exists "
                         "and is writable",
                         tmp, strerror(errno));
    struct trace_ctx c = {f, 0, 0};
    qc_prof_foreach(min_t0, &c.t_origin);
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", f);
    fputs("\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"qctrain "
          "host\"}}",
          f);
    int nt = 0;
    const struct qc_prof_track_info *tr = qc_prof_tracks(&nt);
    bool device = false;
    for (int i = 0; i < nt; i++)
        device = device || tr[i].device;
    if (device)
        fputs(",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"args\":{\"name\":\"qctrain "
              "cuda\"}}",
              f);
    for (int i = 0; i < nt; i++) {
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{",
                tr[i].device ? 2 : 1, (int)tr[i].id);
        fputs("\"name\":", f);
        put_str(f, tr[i].name);
        fprintf(f,
                "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"sort_index\":%d}}",
                tr[i].device ? 2 : 1, (int)tr[i].id, (int)tr[i].id);
    }
    c.n = 1; /* the metadata above precede the events */
    qc_prof_foreach(put_event, &c);
    fputs("\n]}\n", f);
    const bool werr = ferror(f) != 0;
    const bool serr = fflush(f) != 0 || fsync(fileno(f)) != 0;
    if (fclose(f) != 0 || werr || serr) {
        remove(tmp);
        return qc_errorf(QC_ERR_IO, "profile: writing %s failed (disk full?)", tmp);
    }
    if (rename(tmp, path) != 0) {
        const int err = errno;
        remove(tmp);
        return qc_errorf(QC_ERR_IO, "profile: cannot rename %s to %s: %s", tmp, path,
                         strerror(err));
    }
    return qc_file_fsync_dir_of(path, "trace");
}
