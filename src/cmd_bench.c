/*
 * cmd_bench.c — `qctrain bench <target> [options]`: dispatches to src/bench/bench_<target>.c
 * through qc_cli_bench_targets (cli/commands.c, the table `qctrain --help` lists too).
 * Benchmarks print one JSON object on stdout; they never gate CI.
 */
#include "qc_cli.h"

#include <stdio.h>
#include <string.h>

#include "qc_edit_distance.h"
static void bench_usage(FILE *out)
{
    fprintf(out, "usage: qctrain bench <target> [options] [--json]\n\n"
                 "Runs a benchmark and prints its figures (one JSON object with --json).\n"
                 "`qctrain bench <target> --help` lists the target's options.\n\ntargets:\n");
    for (const struct qc_cli_bench_target *t = qc_cli_bench_targets; t->name; t++)
        fprintf(out, "  %-8s %s\n", t->name, t->summary);
}

enum qc_status qc_cmd_bench(struct qc_cli *cli, int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        bench_usage(stdout);
        if (argc < 2)
            return qc_errorf(QC_ERR_INVALID, "bench: missing target\nhint: qctrain bench --help");
        return QC_OK;
    }
    for (const struct qc_cli_bench_target *t = qc_cli_bench_targets; t->name; t++)
        if (strcmp(argv[1], t->name) == 0)
            return t->run(cli, argc - 1, argv + 1);
    const char *best = NULL;
    int best_d = 3;
    for (const struct qc_cli_bench_target *t = qc_cli_bench_targets; t->name; t++) {
        int d = qc_edit_distance(argv[1], t->name);
        if (d < best_d) {
            best_d = d;
            best = t->name;
        }
    }
    if (best)
        return qc_errorf(QC_ERR_INVALID, "bench: unknown target '%s'\nhint: did you mean '%s'?",
                         argv[1], best);
    return qc_errorf(QC_ERR_INVALID, "bench: unknown target '%s'\nhint: qctrain bench --help",
                     argv[1]);
}
