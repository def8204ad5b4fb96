/*
 * cmd_eval.c — `qctrain eval`.
 */
#include "qc_cli.h"

enum qc_status qc_cmd_eval(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain eval: not implemented in this build yet");
}
