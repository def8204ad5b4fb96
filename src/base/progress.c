/*
 * progress.c — the progress reporter (qc_progress.h) and the byte/duration formatters.
 *
 * Invariants:
 *   samples[] is a ring of at most QC_PROGRESS_WINDOW (t, done) points, oldest at `first`,
 *   one point per >= SAMPLE_GAP_S of clock; rate = (done - oldest.done) / (now - oldest.t).
 *   A line is built whole in a buffer and written with one fputs, then flushed.
 */
#include "qc_progress.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SAMPLE_GAP_S    1.0 /* seconds between kept rate samples */
#define LINE_MAX_BYTES  2048
#define NAME_MAX_BYTES  32
#define VALUE_MAX_BYTES 48

struct progress_sample {
    double t;
    uint64_t done;
};

struct progress_field {
    char name[NAME_MAX_BYTES];
    char value[VALUE_MAX_BYTES];
};

struct qc_progress {
    char label[32];
    char unit[24];
    uint64_t total; /* 0 = unknown */
    FILE *out;      /* not owned */
    bool tty;       /* one updating line */
    bool quiet;
    double interval_s;
    double redraw_s;
    int bar_width;
    double (*clock)(void *user);
    void *clock_user;

    double t_start; /* clock at create */
    double t_now;   /* clock at the latest update */
    uint64_t done;  /* units at the latest update */
    struct progress_sample samples[QC_PROGRESS_WINDOW];
    int first; /* index of the oldest sample */
    int count; /* samples held, 1..QC_PROGRESS_WINDOW */

    double t_printed;      /* clock at the last print (t_start before any) */
    bool printed;          /* anything printed yet */
    uint64_t done_printed; /* units shown by the last print */
    bool need_redraw;      /* tty line was cleared */
    bool dirty;            /* fields or total changed since the last print */
    bool finished;

    struct progress_field fields[QC_PROGRESS_MAX_FIELDS];
    int n_fields;
};

// ---- formatting helpers -------------------------------------------------------------------

size_t qc_format_bytes(uint64_t bytes, char *buf, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    if (bytes < 1024) {
        int len = snprintf(buf, n, "%llu B", (unsigned long long)bytes);
        return len < 0 ? 0 : (size_t)len;
    }
    double v = (double)bytes;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    /* Rounding 999.5..1023.99 to four digits would widen the field: show 0.98 of the next unit. */
    if (v >= 999.5 && u < 6) {
        v /= 1024.0;
        u++;
    }
    int decimals = v < 9.995 ? 2 : v < 99.95 ? 1 : 0; /* three significant digits */
    int len = snprintf(buf, n, "%.*f %s", decimals, v, units[u]);
    return len < 0 ? 0 : (size_t)len;
}

size_t qc_format_duration(double seconds, char *buf, size_t n)
{
    int len;
    if (!isfinite(seconds) || seconds < 0.0 || seconds > 1e12) {
        len = snprintf(buf, n, "--:--");
    } else {
        unsigned long long s = (unsigned long long)llround(seconds);
        unsigned long long d = s / 86400, h = s / 3600 % 24, m = s / 60 % 60, sec = s % 60;
        if (s < 3600)
            len = snprintf(buf, n, "%02llu:%02llu", m, sec);
        else if (s < 86400)
            len = snprintf(buf, n, "%llu:%02llu:%02llu", h, m, sec);
        else
            len = snprintf(buf, n, "%llud %02llu:%02llu:%02llu", d, h, m, sec);
    }
    return len < 0 ? 0 : (size_t)len;
}

// ---- reporter -----------------------------------------------------------------------------

static double clock_monotonic(void *user)
{
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void qc_progress_opts_init(struct qc_progress_opts *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->label = "progress";
    opts->unit = "steps";
    opts->tty = QC_PROGRESS_TTY_AUTO;
    opts->interval_s = 10.0;
    opts->redraw_s = 0.1;
    opts->bar_width = 30;
}

enum qc_status qc_progress_create(const struct qc_progress_opts *opts, struct qc_progress **out)
{
    QC_ASSERT(opts != NULL && out != NULL, "qc_progress_create: NULL argument");
    if (!(opts->interval_s >= 0.0) || !(opts->redraw_s >= 0.0) || opts->bar_width < 0)
        return qc_errorf(
            QC_ERR_INVALID,
            "progress: interval %g s, redraw %g s and bar width %d must not be negative",
            opts->interval_s, opts->redraw_s, opts->bar_width);
    struct qc_progress *p = calloc(1, sizeof *p);
    if (!p)
        return qc_errorf(QC_ERR_NOMEM, "progress: out of host memory");
    snprintf(p->label, sizeof p->label, "%s", opts->label ? opts->label : "progress");
    snprintf(p->unit, sizeof p->unit, "%s", opts->unit ? opts->unit : "steps");
    p->total = opts->total;
    p->out = opts->out ? opts->out : stderr;
    switch (opts->tty) {
    case QC_PROGRESS_TTY_ON:
        p->tty = true;
        break;
    case QC_PROGRESS_TTY_OFF:
        p->tty = false;
        break;
    case QC_PROGRESS_TTY_AUTO:
    default:
        p->tty = isatty(fileno(p->out)) == 1;
        break;
    }
    p->quiet = opts->quiet;
    p->interval_s = opts->interval_s;
    p->redraw_s = opts->redraw_s;
    p->bar_width = opts->bar_width > 200 ? 200 : opts->bar_width;
    p->clock = opts->clock ? opts->clock : clock_monotonic;
    p->clock_user = opts->clock_user;
    p->t_start = p->clock(p->clock_user);
    p->t_now = p->t_start;
    p->t_printed = p->t_start;
    p->samples[0] = (struct progress_sample){p->t_start, opts->start};
    p->done = opts->start;
    p->count = 1;
    *out = p;
    return QC_OK;
}

void qc_progress_destroy(struct qc_progress *p)
{
    free(p);
}

static struct progress_field *field_find_or_add(struct qc_progress *p, const char *name)
{
    for (int i = 0; i < p->n_fields; i++)
        if (strncmp(p->fields[i].name, name, NAME_MAX_BYTES - 1) == 0)
            return &p->fields[i];
    if (p->n_fields == QC_PROGRESS_MAX_FIELDS)
        return NULL;
    struct progress_field *f = &p->fields[p->n_fields++];
    snprintf(f->name, sizeof f->name, "%s", name);
    f->value[0] = '\0';
    return f;
}

enum qc_status qc_progress_set(struct qc_progress *p, const char *name, const char *fmt, ...)
{
    QC_ASSERT(p != NULL && name != NULL && fmt != NULL, "qc_progress_set: NULL argument");
    struct progress_field *f = field_find_or_add(p, name);
    if (!f)
        return qc_errorf(QC_ERR_INVALID,
                         "progress: field '%s': already %d fields, the most allowed", name,
                         QC_PROGRESS_MAX_FIELDS);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->value, sizeof f->value, fmt, ap);
    va_end(ap);
    p->dirty = true;
    return QC_OK;
}

enum qc_status qc_progress_set_bytes(struct qc_progress *p, const char *name, uint64_t bytes)
{
    char buf[VALUE_MAX_BYTES];
    qc_format_bytes(bytes, buf, sizeof buf);
    char *sp = strchr(buf, ' '); /* "3.20 GiB" -> "3.20GiB": a field value has no spaces */
    if (sp)
        memmove(sp, sp + 1, strlen(sp));
    return qc_progress_set(p, name, "%s", buf);
}

void qc_progress_set_total(struct qc_progress *p, uint64_t total)
{
    QC_ASSERT(p != NULL, "qc_progress_set_total: p is NULL");
    p->total = total;
    p->dirty = true;
}

bool qc_progress_rate(const struct qc_progress *p, double *per_s)
{
    QC_ASSERT(p != NULL && per_s != NULL, "qc_progress_rate: NULL argument");
    const struct progress_sample *o = &p->samples[p->first];
    double dt = p->t_now - o->t;
    if (!(dt > 0.0) || p->done < o->done)
        return false;
    *per_s = (double)(p->done - o->done) / dt;
    return true;
}

bool qc_progress_eta(const struct qc_progress *p, double *seconds)
{
    QC_ASSERT(p != NULL && seconds != NULL, "qc_progress_eta: NULL argument");
    if (p->total == 0)
        return false;
    if (p->done >= p->total) {
        *seconds = 0.0;
        return true;
    }
    double rate;
    if (!qc_progress_rate(p, &rate) || !(rate > 0.0))
        return false;
    *seconds = (double)(p->total - p->done) / rate;
    return true;
}

/* Appends printf output to buf at *len, never past cap (keeps *len <= cap - 1). */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < cap - 1 ? *len + (size_t)n : cap - 1;
}

static void put_rate(const struct qc_progress *p, char *buf, size_t cap, size_t *len)
{
    double r;
    if (!qc_progress_rate(p, &r))
        put(buf, cap, len, "? %s/s", p->unit);
    else
        put(buf, cap, len, "%.*f %s/s", r < 9.995 ? 2 : r < 99.95 ? 1 : 0, r, p->unit);
}

static void put_fields(const struct qc_progress *p, char *buf, size_t cap, size_t *len)
{
    for (int i = 0; i < p->n_fields; i++)
        put(buf, cap, len, " %s=%s", p->fields[i].name, p->fields[i].value);
}

static int digits_u64(uint64_t v)
{
    int d = 1;
    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

/* Builds the current line (no trailing newline or clear code) into buf. */
static void format_line(const struct qc_progress *p, char *buf, size_t cap)
{
    size_t len = 0;
    char elapsed[32], eta[32];
    qc_format_duration(p->t_now - p->t_start, elapsed, sizeof elapsed);
    double eta_s = -1.0;
    bool have_eta = qc_progress_eta(p, &eta_s);
    qc_format_duration(have_eta ? eta_s : -1.0, eta, sizeof eta);
    buf[0] = '\0';
    unsigned long long done = (unsigned long long)p->done;
    unsigned long long total = (unsigned long long)p->total;
    unsigned pct = 0;
    if (p->total) {
        uint64_t shown = p->done < p->total ? p->done : p->total;
        pct = (unsigned)((double)shown * 100.0 / (double)p->total);
    }

    if (p->tty) {
        if (p->total) {
            put(buf, cap, &len, "%s %3u%% |", p->label, pct);
            uint64_t shown = p->done < p->total ? p->done : p->total;
            int filled = (int)((double)shown * p->bar_width / (double)p->total);
            for (int i = 0; i < p->bar_width; i++)
                put(buf, cap, &len, "%c", i < filled ? '#' : '-');
            put(buf, cap, &len, "| %*llu/%llu [%s<%s, ", digits_u64(p->total), done, total, elapsed,
                eta);
        } else {
            put(buf, cap, &len, "%s %llu %s [%s, ", p->label, done, p->unit, elapsed);
        }
        put_rate(p, buf, cap, &len);
        put(buf, cap, &len, "]");
    } else {
        if (p->total)
            put(buf, cap, &len, "%s %llu/%llu (%u%%) elapsed %s eta %s ", p->label, done, total,
                pct, elapsed, eta);
        else
            put(buf, cap, &len, "%s %llu %s elapsed %s ", p->label, done, p->unit, elapsed);
        put_rate(p, buf, cap, &len);
    }
    put_fields(p, buf, cap, &len);
}

static void print_now(struct qc_progress *p, bool final)
{
    char line[LINE_MAX_BYTES];
    format_line(p, line, sizeof line);
    if (p->tty)
        fprintf(p->out, "\r%s\x1b[K%s", line, final ? "\n" : "");
    else
        fprintf(p->out, "%s\n", line);
    fflush(p->out);
    p->printed = true;
    p->t_printed = p->t_now;
    p->done_printed = p->done;
    p->need_redraw = false;
    p->dirty = false;
}

bool qc_progress_update(struct qc_progress *p, uint64_t done)
{
    QC_ASSERT(p != NULL, "qc_progress_update: p is NULL");
    if (p->finished)
        return false;
    p->t_now = p->clock(p->clock_user);
    p->done = done;

    int last = (p->first + p->count - 1) % QC_PROGRESS_WINDOW;
    if (p->t_now - p->samples[last].t >= SAMPLE_GAP_S || done < p->samples[last].done) {
        if (done < p->samples[last].done) {
            p->first = 0; /* went backwards (a restart): the old samples mean nothing now */
            p->count = 0;
        }
        if (p->count == QC_PROGRESS_WINDOW) {
            p->first = (p->first + 1) % QC_PROGRESS_WINDOW;
            p->count--;
        }
        int slot = (p->first + p->count) % QC_PROGRESS_WINDOW;
        p->samples[slot] = (struct progress_sample){p->t_now, done};
        p->count++;
    }

    if (p->quiet)
        return false;
    double since = p->t_now - p->t_printed;
    bool due;
    if (p->tty)
        due =
            !p->printed || p->need_redraw || since >= p->redraw_s || (p->total && done >= p->total);
    else
        due = since >= p->interval_s;
    if (due)
        print_now(p, false);
    return due;
}

void qc_progress_finish(struct qc_progress *p)
{
    QC_ASSERT(p != NULL, "qc_progress_finish: p is NULL");
    if (p->finished)
        return;
    p->finished = true;
    if (p->quiet)
        return;
    /* A plain line already showing this exact state is not repeated. */
    if (!p->tty && p->printed && !p->dirty && p->done_printed == p->done &&
        p->t_printed == p->t_now)
        return;
    print_now(p, true);
}

void qc_progress_clear(struct qc_progress *p)
{
    QC_ASSERT(p != NULL, "qc_progress_clear: p is NULL");
    if (p->quiet || !p->tty || !p->printed || p->finished)
        return;
    fputs("\r\x1b[K", p->out);
    fflush(p->out);
    p->need_redraw = true;
}
