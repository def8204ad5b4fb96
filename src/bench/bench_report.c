/*
 * bench_report.c — `qctrain bench report [--steps N] [--events N] [--keep DIR] [--json]`: the
 * size of the HTML report and the time to write it for a long run, on a synthetic run folder:
 * N steps of metrics.jsonl (every field of the metrics contract, an eval line every 1000
 * steps), a memory.json with the planner's "plan" object and one entry per step, and the
 * allocation trace of one step with about --events allocator events (recorded by the real
 * trace recorder from a host allocator). Prints the figures (docs/BENCHMARKS.md); gates
 * nothing. The folder is made by qc_bench_report_make_run, which tests/test_report.c also uses
 * to hold the report of a 100,000-step run under 5 MB.
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qc_alloc.h"
#include "qc_report.h"
#include "qc_steptrace.h"
#include "qc_strbuf.h"
#include "qc_train.h" /* qc_train_mkdir */

static const char report_usage[] = "[--steps N] [--events N] [--keep DIR] [--json]";
static const char report_summary[] =
    "Writes the HTML report of a synthetic long run (N steps of metrics with every memory "
    "field, eval lines, a plan, one step's allocation trace) and prints its size and the time "
    "qc_report_write took.";

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static enum qc_status write_text(const char *dir, const char *name, const struct qc_strbuf *b)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return qc_errorf(QC_ERR_IO, "bench report: cannot write %s", path);
    const bool ok = fwrite(b->p, 1, b->len, f) == b->len;
    if (fclose(f) != 0 || !ok)
        return qc_errorf(QC_ERR_IO, "bench report: writing %s failed", path);
    return QC_OK;
}

/* metrics.jsonl: a falling loss, a cosine lr, memory fields that move. */
static enum qc_status make_metrics(const char *dir, int64_t steps)
{
    struct qc_strbuf b = {0};
    for (int64_t s = 1; s <= steps; s++) {
        const double x = (double)s / (double)steps;
        const uint64_t peak = (uint64_t)30000000000 + (uint64_t)(s % 97) * (uint64_t)1048576;
        qc_strbuf_printf(
            &b,
            "{\"step\":%" PRId64 ",\"epoch\":%" PRId64 ",\"samples\":%" PRId64 ",\"loss\":%.9g,"
            "\"reg_loss_propose\":%.9g,\"reg_loss_refine\":%.9g,\"cls_loss\":%.9g,\"lr\":%.17g,"
            "\"step_s\":%.6g,\"samples_per_s\":%.6g,\"bytes_in_use\":%" PRIu64
            ",\"peak_device_bytes\":%" PRIu64 ",\"reserved_bytes\":%" PRIu64
            ",\"predicted_peak_bytes\":%" PRIu64 ",\"offload_host_bytes\":%" PRIu64
            ",\"offload_nvme_bytes\":%" PRIu64 ",\"recompute_bytes\":%" PRIu64
            ",\"prefetch_stall_s\":%.6g,\"replans\":%" PRId64 ",\"splits\":%" PRId64 "}\n",
            s, s / 6248, s * 32, 6.0 * (1.0 - 0.8 * x) + 0.01 * (double)(s % 13),
            2.0 * (1.0 - 0.7 * x), 1.5 * (1.0 - 0.7 * x), 2.5 * (1.0 - 0.9 * x),
            5e-4 * 0.5 * (1.0 + cos(3.14159265358979 * x)), 0.61 + 0.001 * (double)(s % 7),
            52.1 + 0.1 * (double)(s % 11), (uint64_t)4000000000, peak, peak + (uint64_t)2000000000,
            (uint64_t)30100000000, (uint64_t)8000000000 + (uint64_t)(s % 5) * (uint64_t)1000000,
            (uint64_t)0, (uint64_t)3000000000, 0.002 * (double)(s % 3), s / 20000,
            (int64_t)(s % 4));
        if (s % 1000 == 0)
            qc_strbuf_printf(&b,
                             "{\"step\":%" PRId64 ",\"eval\":{\"batches\":6247,\"scenes\":24988,"
                             "\"agents\":24988,\"loss\":%.9g,\"minADE\":%.9g,\"minFDE\":%.9g,"
                             "\"MR\":%.9g,\"Brier\":%.9g,\"brier_minFDE\":%.9g,\"minAHE\":%.9g,"
                             "\"minFHE\":%.9g,\"seconds\":900,\"peak_device_bytes\":9000000000}}\n",
                             s, 5.0 * (1.0 - 0.7 * x), 0.9 - 0.2 * x, 1.6 - 0.35 * x,
                             0.3 - 0.15 * x, 0.6, 2.2 - 0.35 * x, 0.2 - 0.1 * x, 0.3 - 0.1 * x);
    }
    enum qc_status st = qc_strbuf_status(&b, "bench report");
    if (st == QC_OK)
        st = write_text(dir, "metrics.jsonl", &b);
    qc_strbuf_free(&b);
    return st;
}

/* memory.json: the trainer's fields, a plan, and one entry per step. */
static enum qc_status make_memory(const char *dir, int64_t steps)
{
    struct qc_strbuf b = {0};
    qc_strbuf_printf(
        &b,
        "{\"format\": \"qctrain-memory-report\", \"version\": 1, \"device\": \"cuda\", "
        "\"step\": %" PRId64 ", \"total_steps\": %" PRId64 ", \"budget_bytes\": 34359738368, "
        "\"params_grads_bytes\": 61612032, \"peak_rss_bytes\": 9000000000,\n"
        "\"allocator\": {\"bytes_allocated\": 4000000000, \"bytes_allocated_peak\": 30101662720, "
        "\"bytes_reserved\": 32000000000, \"bytes_reserved_peak\": 32101662720, "
        "\"bytes_budget\": 34359738368, \"n_allocs\": 900000000, \"n_maps\": 812, \"n_unmaps\": 3, "
        "\"n_retries\": 1, \"n_ooms\": 0, \"fragmentation\": 1.066442, \"step\": %" PRId64 "},\n"
        "\"peak\": {\"step\": 77, \"bytes_allocated_peak\": 30101662720, "
        "\"snapshot_bytes_allocated\": 30101662720, \"snapshot_bytes_reserved\": 32101662720, "
        "\"snapshots\": 40, \"tags\": 400, \"blocks\": 60, \"by_block\": [",
        steps, steps, steps);
    static const char *const blocks[] = {"decoder.y_emb",
                                         "decoder",
                                         "scratch",
                                         "encoder.agent_encoder.a2a_attn_layers.0",
                                         "encoder.agent_encoder.t_attn_layers.0",
                                         "optim"};
    for (int i = 0; i < 6; i++)
        qc_strbuf_printf(&b,
                         "%s{\"name\": \"%s\", \"bytes\": %d000000000, \"allocations\": 3, "
                         "\"share\": 0.16, \"other\": false}",
                         i ? ", " : "", blocks[i], 5 - i % 5);
    qc_strbuf_puts(&b, "], \"by_tag\": [{\"name\": \"decoder.y_emb/stash\", \"bytes\": "
                       "5000000000, \"allocations\": 1, \"share\": 0.16, \"other\": false}]},\n"
                       "\"plan\": {\"step\": 77, \"predicted_peak_bytes\": 30100000000, "
                       "\"measured_peak_bytes\": 30101662720, \"blocks\": [");
    static const char *const policy[] = {"keep",         "offload_host", "recompute",
                                         "offload_nvme", "keep",         "keep"};
    for (int i = 0; i < 6; i++)
        qc_strbuf_printf(&b,
                         "%s{\"name\": \"%s\", \"policy\": \"%s\", \"bytes\": %d000000000, "
                         "\"predicted_time_s\": 0.0%d}",
                         i ? ", " : "", blocks[i], policy[i], 5 - i % 5, i + 1);
    qc_strbuf_puts(&b, "]},\n\"steps\": [");
    for (int64_t s = 1; s <= steps; s++)
        qc_strbuf_printf(&b,
                         "%s{\"step\": %" PRId64 ", \"bytes_allocated_peak\": 30000000000, "
                         "\"bytes_reserved_peak\": 32000000000}",
                         s > 1 ? ",\n" : "\n", s);
    qc_strbuf_puts(&b, "]}\n");
    enum qc_status st = qc_strbuf_status(&b, "bench report");
    if (st == QC_OK)
        st = write_text(dir, "memory.json", &b);
    qc_strbuf_free(&b);
    return st;
}

/* One step's trace: allocations of QCNet-like tags growing to a peak, then freed. */
static enum qc_status make_trace(const char *dir, int64_t events)
{
    struct qc_alloc_params p;
    qc_alloc_params_default(&p);
    p.trace = true;
    p.trace_capacity = (size_t)(events + 1024);
    struct qc_alloc *a = NULL;
    QC_TRY(qc_alloc_create(NULL, &p, &a));
    struct qc_steptrace *tr = NULL;
    enum qc_status st = qc_steptrace_create(a, dir, 0, 64ull << 20, &tr);
    static const char *const tags[] = {"encoder.map_encoder.pt2pl_layers.0/kv",
                                       "encoder.agent_encoder.t_attn_layers.0/stash",
                                       "encoder.agent_encoder.pl2a_attn_layers.1/kv",
                                       "encoder.agent_encoder.a2a_attn_layers.0/stash",
                                       "decoder.y_emb/stash",
                                       "loss/reg",
                                       "grad/decoder.x",
                                       "scratch/gru_backward"};
    const int64_t n = events / 2 > 0 ? events / 2 : 1;
    void **ptr = calloc((size_t)n, sizeof *ptr);
    if (st == QC_OK && !ptr)
        st = qc_errorf(QC_ERR_NOMEM, "bench report: out of memory");
    if (st == QC_OK) {
        qc_alloc_set_step(a, 1);
        qc_alloc_reset_peak(a);
        qc_steptrace_begin(tr, 1);
    }
    for (int64_t i = 0; i < n && st == QC_OK; i++)
        st = qc_alloc_malloc(a, 4096 + (size_t)(i % 17) * 512, NULL, tags[i % 8], &ptr[i]);
    for (int64_t i = n - 1; i >= 0 && st == QC_OK; i--)
        qc_alloc_free(a, ptr[i], NULL);
    if (st == QC_OK) {
        struct qc_alloc_stats s;
        qc_alloc_stats_get(a, &s);
        st = qc_steptrace_end(tr, s.bytes_allocated_peak, s.bytes_reserved_peak);
    }
    free(ptr);
    qc_steptrace_destroy(tr);
    qc_alloc_destroy(a);
    return st;
}

enum qc_status qc_bench_report_make_run(const char *dir, int64_t steps, int64_t events)
{
    QC_TRY(qc_train_mkdir(dir));
    QC_TRY(make_metrics(dir, steps));
    QC_TRY(make_memory(dir, steps));
    return make_trace(dir, events);
}

enum qc_status qc_bench_report(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    int64_t steps = 100000, events = 40000;
    const char *keep = NULL;
    bool json = false;
    const struct qc_cli_opt opts[] = {
        {"steps", QC_CLI_INT, &steps, "100000", "steps of metrics"},
        {"events", QC_CLI_INT, &events, "40000", "allocator events of the traced step"},
        {"keep", QC_CLI_STRING, &keep, "", "make the run in this folder and keep it"},
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench report", report_usage, report_summary, opts,
                        (int)(sizeof opts / sizeof opts[0]), argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    if (steps < 1 || events < 2)
        return qc_errorf(QC_ERR_INVALID, "bench report: --steps >= 1 and --events >= 2");
    char dir[4096];
    if (keep) {
        snprintf(dir, sizeof dir, "%s", keep);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/qctrain-bench-report-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(dir))
            return qc_errorf(QC_ERR_IO, "bench report: cannot create a folder in %s",
                             tmp && tmp[0] ? tmp : "/tmp");
    }
    const double t0 = mono_s();
    enum qc_status st = qc_bench_report_make_run(dir, steps, events);
    const double t1 = mono_s();
    struct qc_report_info info;
    const struct qc_report_opts ro = {.run_dir = dir, .step = -1};
    if (st == QC_OK)
        st = qc_report_write(&ro, &info);
    const double t2 = mono_s();
    if (st == QC_OK) {
        if (json)
            printf("{\"steps\": %" PRId64 ", \"trace_events\": %" PRId64
                   ", \"report_bytes\": %zu, \"curve_points\": %" PRId64
                   ", \"seconds_make_run\": %.3f, \"seconds_report\": %.3f, \"charts\": %s}\n",
                   steps, events, info.bytes, info.curve_points, t1 - t0, t2 - t1,
                   info.dygraphs && info.chartjs ? "true" : "false");
        else
            printf("report of a %" PRId64 "-step run (%" PRId64
                   " trace events): %zu bytes (%.2f MB), %" PRId64
                   " points per curve, written in %.3f s (making the run: %.1f s)\n",
                   steps, events, info.bytes, (double)info.bytes / 1e6, info.curve_points, t2 - t1,
                   t1 - t0);
    }
    if (!keep) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "%s/trace", dir);
        static const char *const files[] = {"metrics.jsonl", "memory.json", "report.html",
                                            "trace/index.json", "trace/step-000001.qctrace"};
        for (int i = 0; i < 5; i++) {
            char f[4300];
            snprintf(f, sizeof f, "%s/%s", dir, files[i]);
            unlink(f);
        }
        rmdir(cmd);
        rmdir(dir);
    }
    return st;
}
