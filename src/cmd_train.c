/*
 * cmd_train.c — `qctrain train`.
 */
#include "qc_cli.h"

enum qc_status qc_cmd_train(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    (void)argc;
    (void)argv;
    return qc_errorf(QC_ERR_UNSUPPORTED, "qctrain train: not implemented in this build yet");
}
