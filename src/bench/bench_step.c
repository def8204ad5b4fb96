/*
 * bench_step.c — `qctrain bench step`.
 */
#include "qc_cli.h"

enum qc_status qc_bench_step(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain bench step: not implemented in this build yet");
}
