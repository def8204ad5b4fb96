/*
 * cmd_report.c — `qctrain report RUN_DIR [--out FILE.html] [--step N]`: writes the run's
 * memory-profile report, one self-contained HTML page (src/report/qc_report.h, docs/REPORT.md).
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>

#include "qc_progress.h" /* qc_format_bytes */
#include "qc_report.h"

static const char report_usage[] = "RUN_DIR [--out FILE.html] [--step N]";
static const char report_summary[] =
    "Writes the memory-profile report of a training run: one self-contained HTML page (no "
    "network; open it from disk) with the allocation timeline of one step stacked by block "
    "(the peak step, or --step), who holds the memory at the peak by block and by tag (and the "
    "plan beside it when the planner made one), the curves of metrics.jsonl, and the run's "
    "configuration, machine and allocator statistics. train writes RUN/report.html itself at "
    "the end of a run (log.report); this command rewrites it or another step's view.";

enum qc_status qc_cmd_report(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    const char *out = NULL;
    int64_t step = INT64_MIN; /* INT64_MIN: not given (the peak step) */
    const struct qc_cli_opt opts[] = {
        {"out", QC_CLI_STRING, &out, "RUN_DIR/report.html", "the HTML file to write"},
        {"step", QC_CLI_INT, &step, "the peak step",
         "the step the timeline shows (one with a trace in RUN_DIR/trace/)"},
    };
    const char *pos[4];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("report", report_usage, report_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, pos, 4, &npos, &help));
    if (help)
        return QC_OK;
    if (npos != 1)
        return qc_errorf(QC_ERR_INVALID,
                         "report: give exactly one run folder (got %d)\nhint: qctrain report "
                         "runs/smoke",
                         npos);
    /* steps count from 1 (metrics.jsonl, trace/step-N); 0 and negatives name no step */
    if (step != INT64_MIN && step < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "report: --step %" PRId64 ": steps count from 1\nhint: leave --step out "
                         "for the peak step, or give a step of RUN_DIR/trace/",
                         step);
    if (step == INT64_MIN)
        step = -1; /* qc_report_opts: -1 = the peak step */
    const struct qc_report_opts ro = {.run_dir = pos[0], .out_path = out, .step = step};
    struct qc_report_info info;
    QC_TRY(qc_report_write(&ro, &info));
    char size[32];
    qc_format_bytes(info.bytes, size, sizeof size);
    printf("report: %s (%s; %" PRId64 " steps of metrics", info.path, size, info.metric_lines);
    if (info.timeline_step >= 0)
        printf(", timeline of step %" PRId64, info.timeline_step);
    printf("%s%s)\n", info.has_plan ? ", with the plan" : "",
           info.dygraphs && info.chartjs ? "" : "; charts missing: tables instead");
    return QC_OK;
}
