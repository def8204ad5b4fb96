/*
 * bench_ops.c — `qctrain bench ops`.
 */
#include "qc_cli.h"

enum qc_status qc_bench_ops(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain bench ops: not implemented in this build yet");
}
