/*
 * cmd_config.c — `qctrain config`.
 */
#include "qc_cli.h"

enum qc_status qc_cmd_config(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain config: not implemented in this build yet");
}
