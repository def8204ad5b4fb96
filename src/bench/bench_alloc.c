/*
 * bench_alloc.c — `qctrain bench alloc`.
 */
#include "qc_cli.h"

enum qc_status qc_bench_alloc(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain bench alloc: not implemented in this build yet");
}
