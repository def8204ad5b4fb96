/*
 * qc_progress.h — a progress reporter for long work (training steps, scene generation, benches).
 *
 * On a terminal it redraws one line in place (shown here wrapped):
 *   train  42% |############----------------|   420/1000 [00:12<00:17, 35.2 steps/s]
 *     loss=1.234 mem=3.20GiB
 * Elsewhere (a log file, CI) it prints plain lines, at most one every `interval_s` seconds plus
 * the final one (shown here wrapped):
 *   train 420/1000 (42%) elapsed 00:12 eta 00:17 35.2 steps/s
 *     loss=1.234 mem=3.20GiB
 * With an unknown total (0) the bar, percent and ETA are left out. Quiet mode prints nothing.
 *
 * Rate and ETA: the rate is measured over a sliding window of samples (one kept per second of
 * the clock, the last QC_PROGRESS_WINDOW of them) ending at the latest update, so it follows
 * the current speed rather than the whole run's average; ETA = (total - done) / rate.
 *
 * Output goes to a FILE* (default stderr); the "tty" decision and the clock can be forced, so
 * tests check the exact text without sleeping.
 *
 * Thread safety: one reporter is driven by one thread (the training loop); different reporters
 * are independent.
 */
#ifndef QC_BASE_QC_PROGRESS_H
#define QC_BASE_QC_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_PROGRESS_MAX_FIELDS 16 /* named fields per reporter */
#define QC_PROGRESS_WINDOW     32 /* rate samples kept */

enum qc_progress_tty {
    QC_PROGRESS_TTY_AUTO = 0, /* isatty(fileno(out)) */
    QC_PROGRESS_TTY_ON,       /* one updating line */
    QC_PROGRESS_TTY_OFF,      /* plain periodic lines */
};

struct qc_progress_opts {
    const char *label;           /* leading word, "train"; copied */
    const char *unit;            /* counted thing, plural: "steps" -> "steps/s"; copied */
    uint64_t total;              /* units of the whole job; 0 = unknown */
    uint64_t start;              /* units done before this reporter (a resumed run's steps): the
                                    rate counts from there, not from 0 */
    FILE *out;                   /* NULL = stderr; not owned */
    enum qc_progress_tty tty;    /* AUTO */
    bool quiet;                  /* print nothing at all */
    double interval_s;           /* plain lines: seconds between lines (10); 0 = every update */
    double redraw_s;             /* terminal: seconds between redraws (0.1); 0 = every update */
    int bar_width;               /* characters inside |...| (30) */
    double (*clock)(void *user); /* monotonic seconds; NULL = CLOCK_MONOTONIC */
    void *clock_user;
};

struct qc_progress;

/* Fills opts with the defaults above (label "progress", unit "steps"). */
void qc_progress_opts_init(struct qc_progress_opts *opts);

/* Starts a reporter; the clock is read once now (the start of the first rate sample).
 * Returns QC_ERR_NOMEM, or QC_ERR_INVALID for a negative interval or bar width. */
enum qc_status qc_progress_create(const struct qc_progress_opts *opts, struct qc_progress **out);
/* Frees the reporter without printing; call qc_progress_finish first for the final line.
 * NULL is a no-op. */
void qc_progress_destroy(struct qc_progress *p);

/* Sets (or replaces) the named field shown as name=value after the rate; fields keep the order
 * in which they were first set. At most QC_PROGRESS_MAX_FIELDS names (QC_ERR_INVALID beyond);
 * names up to 31 characters, values up to 47 (longer ones are cut). Shown at the next print. */
enum qc_status qc_progress_set(struct qc_progress *p, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sets a byte-count field in compact form: mem=3.20GiB. */
enum qc_status qc_progress_set_bytes(struct qc_progress *p, const char *name, uint64_t bytes);
/* Changes the total (e.g. once the number of steps is known); 0 = unknown. */
void qc_progress_set_total(struct qc_progress *p, uint64_t total);

/* Records that `done` units are complete (absolute, not an increment) and prints when due.
 * Returns whether it printed. */
bool qc_progress_update(struct qc_progress *p, uint64_t done);
/* Prints the final line (on a terminal: the last redraw and a newline) unless quiet. Updates
 * after finish print nothing. Idempotent. */
void qc_progress_finish(struct qc_progress *p);
/* On a terminal, erases the progress line so a log message can be printed; the next update
 * redraws it. A no-op otherwise. */
void qc_progress_clear(struct qc_progress *p);

/* Current rate in units per second over the sliding window; false while unknown (no time has
 * passed yet). */
bool qc_progress_rate(const struct qc_progress *p, double *per_s);
/* Seconds to completion at the current rate; false while the total or the rate is unknown. */
bool qc_progress_eta(const struct qc_progress *p, double *seconds);

/* ---- formatting helpers ------------------------------------------------------------------- */

/* Human-readable bytes with binary units: 0 -> "0 B", 1023 -> "1023 B", 3435973837 ->
 * "3.20 GiB" (three significant digits from KiB up). Writes at most n bytes including the NUL;
 * returns the length snprintf would have written. */
size_t qc_format_bytes(uint64_t bytes, char *buf, size_t n);
/* Durations as "MM:SS" below an hour, "H:MM:SS" from an hour, "Dd HH:MM:SS" from a day;
 * negative or non-finite -> "--:--". Same return convention. */
size_t qc_format_duration(double seconds, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_PROGRESS_H */
