/*
 * cmd_bench.c — `qctrain bench <target> [options]`: dispatches to src/bench/bench_<target>.c.
 * Benchmarks print one JSON object on stdout; they never gate CI.
 */
#include "qc_cli.h"

#include <stdio.h>
#include <string.h>

#include "qc_edit_distance.h"
struct bench_target {
    const char *name;
    const char *summary;
    enum qc_status (*run)(struct qc_cli *cli, int argc, char **argv);
};

static const struct bench_target targets[] = {
    {"loader", "scene loading, collation and graph building throughput", qc_bench_loader},
    {"alloc", "caching allocator latency and fragmentation vs a PyTorch-like configuration",
     qc_bench_alloc},
    {"offload", "pinned-host and NVMe (io_uring) offload bandwidth, vs fio when installed",
     qc_bench_offload},
    {"ops", "QCNet blocks forward+backward at AV2 size; fused vs unfused attention", qc_bench_ops},
    {"step", "whole training steps: samples/s and peak memory", qc_bench_step},
    {"memory", "training steps under device budgets: peaks (measured, predicted), time, offload",
     qc_bench_memory},
    {"report", "size and writing time of the HTML report of a long synthetic run", qc_bench_report},
    {"dist",
     "data-parallel steps under mpirun/srun: bytes reduced, collective time, overlap, "
     "rank balance",
     qc_bench_dist},
};

static void bench_usage(FILE *out)
{
    fprintf(out, "usage: qctrain bench <target> [options] [--json]\n\n"
                 "Runs a benchmark and prints its figures (one JSON object with --json).\n"
                 "`qctrain bench <target> --help` lists the target's options.\n\ntargets:\n");
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        fprintf(out, "  %-8s %s\n", targets[i].name, targets[i].summary);
}

enum qc_status qc_cmd_bench(struct qc_cli *cli, int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        bench_usage(stdout);
        if (argc < 2)
            return qc_errorf(QC_ERR_INVALID, "bench: missing target\nhint: qctrain bench --help");
        return QC_OK;
    }
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        if (strcmp(argv[1], targets[i].name) == 0)
            return targets[i].run(cli, argc - 1, argv + 1);
    const char *best = NULL;
    int best_d = 3;
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        int d = qc_edit_distance(argv[1], targets[i].name);
        if (d < best_d) {
            best_d = d;
            best = targets[i].name;
        }
    }
    if (best)
        return qc_errorf(QC_ERR_INVALID, "bench: unknown target '%s'\nhint: did you mean '%s'?",
                         argv[1], best);
    return qc_errorf(QC_ERR_INVALID, "bench: unknown target '%s'\nhint: qctrain bench --help",
                     argv[1]);
}
