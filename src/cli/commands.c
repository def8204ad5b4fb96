/*
 * commands.c — the one command table of qctrain (the bench targets' table: bench/targets.c).
 */
#include "qc_cli.h"

#include <string.h>

const struct qc_cli_command qc_cli_commands[] = {
    {"train", "train QCNet (on generated scenes when no --data is given)", qc_cmd_train},
    {"eval", "evaluate weights: validation loss, minADE, minFDE, MR, Brier-minFDE, minAHE, minFHE",
     qc_cmd_eval},
    {"plan", "plan a step's memory under the budget (policies, peak, time) without training",
     qc_cmd_plan},
    {"tune", "write the fastest preset that fits a memory budget: planned, then measured",
     qc_cmd_tune},
    {"gen", "generate synthetic AV2-like scenes into a qcshard file", qc_cmd_gen},
    {"inspect", "print scene and edge-set statistics of qcshard files", qc_cmd_inspect},
    {"profile", "profile training steps: per-op Chrome trace (Perfetto) and a summary",
     qc_cmd_profile},
    {"report", "write a run's memory-profile report: one self-contained HTML page", qc_cmd_report},
    {"bench", "run a benchmark and print its figures (targets below)", qc_cmd_bench},
    {"config", "show the option table, or check and dump a configuration", qc_cmd_config},
    {"version", "print the version and the build's backends", qc_cmd_version},
    {NULL, NULL, NULL},
};

const struct qc_cli_command *qc_cli_command_find(const char *name)
{
    for (const struct qc_cli_command *c = qc_cli_commands; c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}
