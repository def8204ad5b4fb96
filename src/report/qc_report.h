/*
 * qc_report.h — what a person looks at after a run: the HTML memory-profile report
 * (`qctrain report`, RUN/report.html) and the TensorBoard event files (RUN/tb/). docs/REPORT.md
 * describes both for users; this header is the module's whole public surface.
 *
 * The report is ONE self-contained HTML file (inline CSS and JS, no network, works from file://)
 * with five sections, each an element with a fixed id:
 *   timeline  allocated / reserved bytes over one step (the peak step, or --step), stacked by
 *             block, from the step traces train keeps in RUN/trace/ (qc_steptrace.h);
 *   blocks    the breakdown at the run's peak by block and by tag (memory.json), and the
 *             planner's policy and predicted bytes beside the measured bytes when memory.json
 *             holds a "plan" object;
 *   holders   what holds the peak: every byte live at the peak step's highest point, by owner
 *             (the owners and knobs of qc_plan_owners.h, those `qctrain plan` explains its floor
 *             with), from that step's trace; the rows add up to the step's measured peak;
 *   curves    loss and its terms, lr, samples/s, peak device bytes and the memory fields of
 *             metrics.jsonl against the step, downsampled to at most QC_REPORT_CURVE_POINTS
 *             buckets (each bucket: min, mean, max), and the eval lines;
 *   run       the effective configuration, machine, device, versions and allocator statistics.
 * The data sits once in the page as JSON (<script type="application/json" id="qc-data">) and
 * everything is drawn from it by the page's script with Debian's dygraphs (timeline, curves)
 * and Chart.js (bars), whose minified files are inlined with their license notices. When a
 * library file is missing the page says so at the top and shows tables instead of its charts.
 *
 * TensorBoard: train writes RUN/tb/events.out.tfevents.<unix time>.<host>.<pid>.qctrain, one
 * new file per process run, TFRecord framing around Event protos (formats cited in
 * tb_event.c). Every metrics.jsonl line becomes one Event at its step whose scalars are the
 * line's numbers (the table in metric_keys.c: train/loss, its terms, train/lr,
 * train/samples_per_s, memory/peak_device_bytes, the memory fields when present, eval/<metric>),
 * as float32 simple values, the type TensorBoard's scalar dashboard and PyTorch's SummaryWriter
 * use: value == (float)metrics value. Each file starts with the file version and a
 * SessionLog.START event at the first step the process runs, so TensorBoard discards the
 * older files' events from that step on (a resumed run does not show the steps it redoes
 * twice).
 */
#ifndef QC_REPORT_QC_REPORT_H
#define QC_REPORT_QC_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- the HTML report ---------------------------------------------------------------------------

#define QC_REPORT_CURVE_POINTS    1000 /* buckets per curve at most */
#define QC_REPORT_TIMELINE_POINTS 4000 /* timeline points at most (events merged beyond) */

struct qc_report_opts {
    const char *run_dir;  /* the run folder: memory.json, metrics.jsonl, run.json, trace/ */
    const char *out_path; /* NULL: RUN/report.html */
    int64_t step;         /* timeline step; -1: the peak step of RUN/trace/index.json */
    const char *js_dir;   /* where the libraries are; NULL: $QC_REPORT_JS_DIR, else
                             /usr/share/javascript (Debian's libjs-* packages) */
};

/* What a written report holds (for the caller's summary line and the tests). */
struct qc_report_info {
    char path[4200];       /* the file written */
    size_t bytes;          /* its size */
    int64_t metric_lines;  /* metrics.jsonl step lines read */
    int64_t curve_points;  /* points per curve after downsampling */
    int64_t timeline_step; /* the step the timeline shows; -1: none (no trace) */
    bool has_plan;         /* memory.json held a "plan" object */
    bool dygraphs;         /* dygraphs was found and inlined */
    bool chartjs;          /* Chart.js was found and inlined */
};

/* Writes the report of opts->run_dir atomically (temp file + rename). Needs memory.json;
 * metrics.jsonl, run.json and trace/ are used when present (the page says what is missing).
 * A missing library is not an error: a warning is logged and the page falls back to tables.
 * QC_ERR_INVALID naming the file for a missing or malformed memory.json / index, a --step
 * without a trace (listing the steps that have one); QC_ERR_IO; QC_ERR_NOMEM. info may be NULL. */
enum qc_status qc_report_write(const struct qc_report_opts *opts, struct qc_report_info *info);

// ---- the run description (RUN/run.json) ---------------------------------------------------------

/* Writes RUN/run.json atomically: the effective configuration (config_json, the --config-dump
 * JSON text), the machine (host, CPU, cores, memory, OS), the device (device_name), versions
 * (qctrain, compiler, build) and the process run (first step, resumed). The report's `run`
 * section shows it. QC_ERR_IO naming the file. */
enum qc_status qc_report_write_run_info(const char *run_dir, const char *config_json,
                                        const char *device_kind, const char *device_name,
                                        int64_t first_step, bool resumed);

// ---- TensorBoard --------------------------------------------------------------------------------

struct qc_tb; /* one event file being written (opaque) */

/* Creates RUN/tb/ and a new event file named after every existing one there (so TensorBoard,
 * which reads a folder's files in name order, reads it last), and writes the file-version
 * event and a SessionLog.START at first_step (the first step this process runs: 1 for a new
 * run). QC_ERR_IO naming the file. */
enum qc_status qc_tb_open(const char *run_dir, int64_t first_step, struct qc_tb **out);
/* Writes the scalars of one metrics.jsonl line (a step line or an eval line, as written; keys
 * it does not know are ignored, null values skipped) as one Event, flushed to the file.
 * QC_ERR_INVALID for a line that is not a JSON object with a "step"; QC_ERR_IO. */
enum qc_status qc_tb_write_metrics_line(struct qc_tb *tb, const char *json_line);
/* fsyncs the file (at checkpoints). QC_ERR_IO. */
enum qc_status qc_tb_sync(struct qc_tb *tb);
/* Closes (fsyncs) the file; NULL is a no-op. */
void qc_tb_close(struct qc_tb *tb);
/* The file being written. */
const char *qc_tb_path(const struct qc_tb *tb);

// ---- TensorBoard encoding (tb_event.c; public for the tests)
// -------------------------------------

/* One scalar of an Event. */
struct qc_tb_scalar {
    const char *tag;
    float value;
};

/* CRC-32C (Castagnoli) of n bytes, and its TFRecord mask ((c >> 15 | c << 17) + 0xa282ead8). */
uint32_t qc_tb_crc32c(const void *data, size_t n);
uint32_t qc_tb_masked_crc(uint32_t crc);
/* Frames n bytes of data as one TFRecord into out (n + 16 bytes): u64 length, masked CRC of
 * the length, data, masked CRC of the data (little-endian). Returns n + 16. */
size_t qc_tb_record_frame(const void *data, size_t n, uint8_t *out);
/* Encodes Event protos into out (cap bytes); each returns the length needed (the output is
 * complete only when that is <= cap). Fields at their proto3 default (step 0) are omitted, as
 * protobuf's serializers do. */
size_t qc_tb_event_file_version(double wall_time, uint8_t *out, size_t cap);
size_t qc_tb_event_session_start(double wall_time, int64_t step, uint8_t *out, size_t cap);
size_t qc_tb_event_scalars(double wall_time, int64_t step, const struct qc_tb_scalar *v, int n,
                           uint8_t *out, size_t cap);

// ---- metrics.jsonl keys -----------------------------------------------------------------------

/* One number of metrics.jsonl that the curves and TensorBoard show. */
struct qc_report_metric {
    const char *key;   /* key in a step line, or in the "eval" object of an eval line */
    bool eval;         /* an eval-line key */
    const char *tag;   /* TensorBoard tag ("train/loss", "eval/minADE") */
    const char *chart; /* the report's chart it goes on ("loss", "lr", "speed", "memory", ...) */
    const char *unit;  /* "bytes", "s", "m", "rad", "1/s" or "" */
};

/* The table, in display order; *n receives its length. */
const struct qc_report_metric *qc_report_metrics(int *n);

#ifdef __cplusplus
}
#endif

#endif /* QC_REPORT_QC_REPORT_H */
