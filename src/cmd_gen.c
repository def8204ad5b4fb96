/*
 * cmd_gen.c — `qctrain gen`.
 */
#include "qc_cli.h"

enum qc_status qc_cmd_gen(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain gen: not implemented in this build yet");
}
