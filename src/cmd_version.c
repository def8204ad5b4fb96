/*
 * cmd_version.c — `qctrain version`.
 */
#include "qc_cli.h"

enum qc_status qc_cmd_version(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain version: not implemented in this build yet");
}
