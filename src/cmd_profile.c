/*
 * cmd_profile.c — `qctrain profile [--data FILE...] [--batch-size N] [--steps N] [--warmup N]
 * [--attention fused|unfused] [--top N] [--json] --out trace.json`: runs training steps with the
 * profiler on (src/base/qc_prof.h) and writes a Chrome trace (Perfetto, chrome://tracing) and a
 * summary (src/prof/qc_profile.h).
 *
 * The run is the code path of `qctrain train` (qc_trainer, on the backend of --device) in a
 * temporary run folder, removed at the end. Before the steps it times one large SGEMM and one
 * large copy on the backend (the reference rates of the summary). Then `--warmup` steps run
 * unprofiled (first-touch page faults, the allocator's cache, BLAS thread start-up), and
 * `--steps` steps run profiled; on CUDA each step's device times are resolved after it.
 * Profiling changes no bits: the recorder only reads clocks around the work.
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench_common.h" /* the scratch training run */
#include "qc_config.h"
#include "qc_exec.h"
#include "qc_prof.h"
#include "qc_profile.h"
#include "qc_train.h"

static const char profile_usage[] =
    "[--data FILE...] [--batch-size N] [--steps N] [--warmup N] [--attention fused|unfused] "
    "[--top N] [--json] --out trace.json";
static const char profile_summary[] =
    "Runs training steps with the profiler on: every op dispatch (name, block, pass, shape, "
    "bytes, FLOPs), block, step phase, loader wait, offload put/get, allocator event and the "
    "optimizer, timed on each thread (CUDA: on each stream). Writes Chrome trace JSON that "
    "Perfetto (ui.perfetto.dev) and chrome://tracing open as they are, and prints a summary: top "
    "ops and blocks, GEMM's share of the step, GFLOP/s per GEMM shape against a measured SGEMM "
    "peak, memory-bound ops' GB/s against a measured copy rate. Scenes: --data, or synthetic "
    "ones (data.synthetic_profile) when none is given.";

enum qc_status qc_cmd_profile(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0};
    const char *out = NULL, *attention = NULL;
    int64_t steps = 1, warmup = 1, top = 20, batch_size = cfg.batch_size;
    bool json = false;
    char d_bs[32];
    snprintf(d_bs, sizeof d_bs, "%" PRId64, batch_size);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "", "qcshard file(s); none: synthetic scenes"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, "scenes per step"},
        {"steps", QC_CLI_INT, &steps, "1", "profiled steps"},
        {"warmup", QC_CLI_INT, &warmup, "1", "unprofiled steps first"},
        {"attention", QC_CLI_STRING, &attention,
         cfg.attention == QC_ATTENTION_FUSED ? "fused" : "unfused",
         "attention implementation: fused | unfused"},
        {"top", QC_CLI_INT, &top, "20", "rows per summary table"},
        {"json", QC_CLI_FLAG, &json, "", "print the summary as one JSON object"},
        {"out", QC_CLI_STRING, &out, "", "the trace file to write (Chrome trace JSON)"},
    };
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("profile", profile_usage, profile_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, pos, QC_CLI_STRINGS_MAX,
                        &npos, &help));
    if (help)
        return QC_OK;
    QC_TRY(qc_train_cli_finish("profile", pos, npos, &data, attention, &cfg));
    if (!out || !out[0])
        return qc_errorf(QC_ERR_INVALID, "profile: --out is required\n"
                                         "hint: qctrain profile --out trace.json");
    if (steps < 1 || warmup < 0 || batch_size < 1 || top < 1)
        return qc_errorf(QC_ERR_INVALID, "profile: --steps, --batch-size and --top must be >= 1, "
                                         "--warmup >= 0");
    cfg.batch_size = batch_size;
    cfg.grad_accum = 1;
    cfg.steps = warmup + steps;
    cfg.save_every = 0;
    if (data.n == 0)
        cfg.synthetic_scenes = batch_size * (warmup + steps);
    QC_TRY(qc_config_validate(&cfg));

    struct qc_bench_run run;
    struct qc_profile_peaks peaks;
    struct qc_profile_summary *sum = NULL;
    enum qc_status st = qc_bench_run_start(&cfg, "profile", data.v, data.n, 0, &run);
    struct qc_trainer *t = run.t;
    if (st == QC_OK)
        st = qc_profile_peaks_measure(qc_qcnet_exec(qc_trainer_model(t)), qc_trainer_alloc(t), 2048,
                                      &peaks);
    if (st == QC_OK)
        st = qc_bench_profiled_steps(t, warmup, steps);
    if (st == QC_OK)
        st = qc_profile_trace_write(out);
    if (st == QC_OK)
        st = qc_profile_summary_create(&peaks, steps, &sum);
    if (st == QC_OK && json) {
        cJSON *j = qc_profile_summary_json(sum, (int)top);
        cJSON_AddStringToObject(j, "trace", out);
        char *s = j ? cJSON_PrintUnformatted(j) : NULL;
        if (s)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else if (st == QC_OK) {
        qc_profile_summary_print(sum, stdout, (int)top);
        printf("\ntrace: %s (%" PRId64 " events; open in ui.perfetto.dev or chrome://tracing)\n",
               out, qc_prof_count());
    }
    qc_profile_summary_destroy(sum);
    qc_prof_reset();
    qc_bench_run_end(&run);
    return st;
}
