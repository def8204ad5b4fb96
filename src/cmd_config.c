/*
 * cmd_config.c — `qctrain config options | dump | check FILE...`.
 *
 * options: the option table (key, type, default, range or choices, unit, doc);
 * dump:    the effective configuration as JSON (same as --config-dump);
 * check:   applies each preset file (or NAME) on top of the defaults and validates the result;
 *          the first bad one fails with QC_ERR_INVALID (exit 2) naming the file and the key.
 */
#include "qc_cli.h"

#include <stdio.h>
#include <string.h>

#include "qc_edit_distance.h"
#define CONFIG_USAGE "options | dump | check FILE|NAME..."

static enum qc_status config_check(int n, const char *const *files)
{
    if (n == 0)
        return qc_errorf(QC_ERR_INVALID,
                         "config check: missing FILE\nhint: qctrain config check profiles/x.json");
    for (int i = 0; i < n; i++) {
        struct qc_config cfg;
        qc_config_defaults(&cfg);
        QC_TRY(qc_config_apply_preset(&cfg, files[i]));
        enum qc_status st = qc_config_validate(&cfg);
        if (st != QC_OK)
            return qc_error_wrap(st, "%s", files[i]);
        printf("%s: ok\n", files[i]);
    }
    return QC_OK;
}

enum qc_status qc_cmd_config(struct qc_cli *cli, int argc, char **argv)
{
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("config", CONFIG_USAGE,
                        "Shows the configuration keys, dumps the effective configuration as JSON, "
                        "or checks preset files.\n"
                        "  options         every key: type, default, range or choices, unit, doc\n"
                        "  dump            the effective configuration (same as --config-dump)\n"
                        "  check FILE...   validate preset files (names or paths); exit 2 on error",
                        NULL, 0, argc, argv, pos, QC_CLI_STRINGS_MAX, &npos, &help));
    if (help)
        return QC_OK;
    if (npos == 0)
        return qc_errorf(QC_ERR_INVALID,
                         "config: missing subcommand\nhint: usage: qctrain config " CONFIG_USAGE);
    const char *sub = pos[0];
    if (strcmp(sub, "options") == 0 && npos == 1) {
        qc_config_print_options(stdout);
        return QC_OK;
    }
    if (strcmp(sub, "dump") == 0 && npos == 1)
        return qc_config_dump_json(&cli->cfg, stdout);
    if (strcmp(sub, "check") == 0)
        return config_check(npos - 1, pos + 1);
    if (strcmp(sub, "options") == 0 || strcmp(sub, "dump") == 0)
        return qc_errorf(QC_ERR_INVALID, "config %s: unexpected argument '%.80s'", sub, pos[1]);
    static const char *const subs[] = {"options", "dump", "check"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        if (qc_edit_distance(sub, subs[i]) <= 2)
            return qc_errorf(QC_ERR_INVALID,
                             "config: unknown subcommand '%.80s'\nhint: did you mean '%s'?", sub,
                             subs[i]);
    return qc_errorf(
        QC_ERR_INVALID,
        "config: unknown subcommand '%.80s'\nhint: usage: qctrain config " CONFIG_USAGE, sub);
}
