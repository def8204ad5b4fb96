/*
 * targets.c — the one table of `qctrain bench` targets (qc_cli_bench_targets, qc_cli.h), which
 * `qctrain --help` (main.c) and `qctrain bench` (cmd_bench.c) both list. It sits here, beside
 * the benchmarks it points at, so the calls go one way: commands.c -> cmd_bench.c -> this
 * table -> bench_*.c (tests/file_cycles.py).
 */
#include "qc_cli.h"

const struct qc_cli_bench_target qc_cli_bench_targets[] = {
    {"loader", "scene loading, collation and graph building throughput", qc_bench_loader},
    {"alloc", "caching allocator latency and fragmentation vs a PyTorch-like configuration",
     qc_bench_alloc},
    {"offload", "pinned-host and NVMe (io_uring) offload bandwidth, vs fio when installed",
     qc_bench_offload},
    {"ops", "QCNet blocks forward+backward at AV2 size; fused vs unfused attention", qc_bench_ops},
    {"step", "whole training steps: samples/s and peak memory", qc_bench_step},
    {"memory", "training steps under device budgets: peaks (measured, predicted), time, offload",
     qc_bench_memory},
    {"numerics", "fp32 forward and loss against float64 (tools/qcnet_f64.py: python3, NumPy)",
     qc_bench_numerics},
    {"report", "size and writing time of the HTML report of a long synthetic run", qc_bench_report},
    {"dist",
     "data-parallel steps under mpirun/srun: bytes reduced, collective time, overlap, "
     "rank balance",
     qc_bench_dist},
    {NULL, NULL, NULL},
};
