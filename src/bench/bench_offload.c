/*
 * bench_offload.c — `qctrain bench offload`.
 */
#include "qc_cli.h"

enum qc_status qc_bench_offload(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain bench offload: not implemented in this build yet");
}
