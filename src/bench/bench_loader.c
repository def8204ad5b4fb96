/*
 * bench_loader.c — `qctrain bench loader`.
 */
#include "qc_cli.h"

enum qc_status qc_bench_loader(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain bench loader: not implemented in this build yet");
}
