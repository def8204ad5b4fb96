/*
 * cli_args.c — the option parser every subcommand uses (qc_cli_parse), with "did you mean"
 * hints from qc_edit_distance (src/base).
 *
 * Accepted forms: --name VALUE, --name=VALUE, --flag (and --flag=true|false), positionals, and
 * "--" after which everything is positional. --help / -h prints the command's help and stops.
 */
#include "qc_cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qc_edit_distance.h"

const struct qc_cli_global qc_cli_globals[] = {
    {"preset", "NAME|PATH", "none", "apply profiles/NAME.json or a .json file; repeatable"},
    {"set", "key=value", "none", "set a configuration key; repeatable, after presets"},
    {"config-dump", NULL, "off", "print the effective configuration as JSON, exit"},
    {"device", "cpu|cuda|emu", "cpu",
     "backend: sets device.kind over presets and --set (emu: CPU ops on emulated device memory, "
     "for tests and debugging)"},
    {"log-level", "LEVEL", "info", "error, warn, info or debug: sets log.level"},
    {"quiet", NULL, "off", "no progress output: sets log.quiet"},
    {NULL, NULL, NULL, NULL},
};

// ---- help ----------------------------------------------------------------------------------

/* Options whose value names a file or a folder: shown as PATH. */
static bool is_path_option(const char *name)
{
    static const char *const names[] = {"out",     "data", "val-data", "resume", "init-from",
                                        "weights", "dump", "cost",     "keep",   "dir"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return true;
    return false;
}

static const char *value_placeholder(const struct qc_cli_opt *o)
{
    if ((o->type == QC_CLI_STRING || o->type == QC_CLI_STRINGS) && is_path_option(o->name))
        return " PATH";
    switch (o->type) {
    case QC_CLI_FLAG:
        return "";
    case QC_CLI_INT:
        return " N";
    case QC_CLI_DOUBLE:
        return " X";
    case QC_CLI_SIZE:
        return " SIZE";
    case QC_CLI_STRING:
        return " TEXT";
    case QC_CLI_STRINGS:
        return " TEXT";
    }
    return "";
}

static void print_help(FILE *out, const char *cmd, const char *usage, const char *summary,
                       const struct qc_cli_opt *opts, int nopts)
{
    fprintf(out, "usage: qctrain %s%s%s\n", cmd, usage && usage[0] ? " " : "", usage ? usage : "");
    if (summary && summary[0])
        fprintf(out, "\n%s\n", summary);
    fprintf(out, "\noptions:\n");
    for (int i = 0; i < nopts; i++) {
        char left[96];
        snprintf(left, sizeof left, "--%s%s", opts[i].name, value_placeholder(&opts[i]));
        fprintf(out, "  %-26s %s", left, opts[i].doc ? opts[i].doc : "");
        if (opts[i].type == QC_CLI_STRINGS)
            fprintf(out, " (repeatable)");
        if (opts[i].def && opts[i].def[0])
            fprintf(out, " (default: %s)", opts[i].def);
        fputc('\n', out);
    }
    fprintf(out, "  %-26s %s\n", "-h, --help", "show this help and exit");
    fprintf(out, "\nglobal options, before or after the command (see `qctrain --help`):\n ");
    int col = 1;
    for (const struct qc_cli_global *g = qc_cli_globals; g->name; g++) {
        char item[96];
        const int n = snprintf(item, sizeof item, " --%s%s%s%s", g->name, g->value ? " " : "",
                               g->value ? g->value : "", g[1].name ? "," : "");
        if (col + n > 90) {
            fprintf(out, "\n ");
            col = 1;
        }
        fputs(item, out);
        col += n;
    }
    fputc('\n', out);
}

// ---- values --------------------------------------------------------------------------------

static enum qc_status bad_value(const char *cmd, const char *name, const char *what,
                                const char *value)
{
    return qc_errorf(QC_ERR_INVALID, "%s: option '--%s': expected %s, got \"%.80s\"", cmd, name,
                     what, value);
}

static enum qc_status store_value(const char *cmd, const struct qc_cli_opt *o, const char *value)
{
    char *end;
    switch (o->type) {
    case QC_CLI_FLAG: {
        static const char *const yes[] = {"true", "yes", "on", "1"};
        static const char *const no[] = {"false", "no", "off", "0"};
        for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
            if (strcasecmp(value, yes[i]) == 0) {
                *(bool *)o->dst = true;
                return QC_OK;
            }
            if (strcasecmp(value, no[i]) == 0) {
                *(bool *)o->dst = false;
                return QC_OK;
            }
        }
        return bad_value(cmd, o->name, "true or false", value);
    }
    case QC_CLI_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (value[0] == '\0' || *end != '\0' || errno == ERANGE)
            return bad_value(cmd, o->name, "an integer", value);
        *(int64_t *)o->dst = v;
        return QC_OK;
    }
    case QC_CLI_DOUBLE: {
        errno = 0;
        double v = strtod(value, &end);
        if (value[0] == '\0' || *end != '\0' || errno == ERANGE || !isfinite(v))
            return bad_value(cmd, o->name, "a number", value);
        *(double *)o->dst = v;
        return QC_OK;
    }
    case QC_CLI_SIZE: {
        uint64_t v;
        if (qc_parse_size(value, &v) != QC_OK)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: option '--%s': expected a size such as 24GiB, 512MiB, 1e9 or "
                             "4096, got \"%.80s\"",
                             cmd, o->name, value);
        *(uint64_t *)o->dst = v;
        return QC_OK;
    }
    case QC_CLI_STRING:
        *(const char **)o->dst = value;
        return QC_OK;
    case QC_CLI_STRINGS: {
        struct qc_cli_strings *s = o->dst;
        if (s->n >= QC_CLI_STRINGS_MAX)
            return qc_errorf(QC_ERR_INVALID, "%s: option '--%s' given more than %d times", cmd,
                             o->name, QC_CLI_STRINGS_MAX);
        s->v[s->n++] = value;
        return QC_OK;
    }
    }
    return qc_errorf(QC_ERR_INVALID, "%s: option '--%s' has an unknown type", cmd, o->name);
}

static enum qc_status unknown_option(const char *cmd, const char *arg, size_t name_len,
                                     const struct qc_cli_opt *opts, int nopts)
{
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(name_len < 127 ? name_len : 127), arg);
    const char *bare = name[0] == '-' && name[1] == '-' ? name + 2 : name + 1;
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; i < nopts; i++) {
        int d = qc_edit_distance(bare, opts[i].name);
        if (d < best_d && (size_t)d * 2 < strlen(opts[i].name)) {
            best_d = d;
            best = opts[i].name;
        }
    }
    /* a global option misspelt after the command (`train --presett`) */
    const char *best_global = NULL;
    for (const struct qc_cli_global *g = qc_cli_globals; g->name; g++) {
        int d = qc_edit_distance(bare, g->name);
        if (d < best_d && (size_t)d * 2 < strlen(g->name)) {
            best_d = d;
            best_global = g->name;
        }
    }
    if (best_global)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: unknown option '%s'\nhint: did you mean '--%s'? (a global option)",
                         cmd, name, best_global);
    if (best)
        return qc_errorf(QC_ERR_INVALID, "%s: unknown option '%s'\nhint: did you mean '--%s'?", cmd,
                         name, best);
    return qc_errorf(QC_ERR_INVALID,
                     "%s: unknown option '%s'\nhint: `qctrain %s --help` lists the options", cmd,
                     name, cmd);
}

// ---- the parser ----------------------------------------------------------------------------

enum qc_status qc_cli_parse(const char *cmd, const char *usage, const char *summary,
                            const struct qc_cli_opt *opts, int nopts, int argc, char **argv,
                            const char **pos, int max_pos, int *npos, bool *help_shown)
{
    int np = 0;
    bool only_pos = false;
    if (help_shown)
        *help_shown = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_pos && (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)) {
            print_help(stdout, cmd, usage, summary, opts, nopts);
            fflush(stdout);
            if (help_shown)
                *help_shown = true;
            if (npos)
                *npos = np;
            return QC_OK;
        }
        if (!only_pos && strcmp(arg, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (only_pos || arg[0] != '-' || arg[1] == '\0') {
            if (!pos || np >= max_pos) {
                if (usage && usage[0])
                    return qc_errorf(QC_ERR_INVALID,
                                     "%s: unexpected argument '%.80s'\nhint: usage: qctrain %s %s",
                                     cmd, arg, cmd, usage);
                return qc_errorf(QC_ERR_INVALID, "%s: unexpected argument '%.80s'", cmd, arg);
            }
            pos[np++] = arg;
            continue;
        }
        /* An option: "--name", "--name=value"; a single dash is only -h. */
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const struct qc_cli_opt *o = NULL;
        if (arg[1] == '-') {
            for (int k = 0; k < nopts && !o; k++)
                if (strlen(opts[k].name) == len - 2 && strncmp(opts[k].name, arg + 2, len - 2) == 0)
                    o = &opts[k];
        }
        if (!o)
            return unknown_option(cmd, arg, len, opts, nopts);
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (o->type == QC_CLI_FLAG) {
            value = "true";
        } else {
            if (i + 1 >= argc)
                return qc_errorf(QC_ERR_INVALID, "%s: option '--%s' needs a value", cmd, o->name);
            value = argv[++i];
        }
        QC_TRY(store_value(cmd, o, value));
    }
    if (npos)
        *npos = np;
    return QC_OK;
}
