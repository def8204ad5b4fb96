/*
 * cmd_inspect.c — `qctrain inspect`.
 */
#include "qc_cli.h"

enum qc_status qc_cmd_inspect(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain inspect: not implemented in this build yet");
}
