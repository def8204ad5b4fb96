/*
 * main.c — the qctrain entry point: global options, the effective configuration, dispatch.
 *
 *   qctrain [global options] <command> [command options] [global options]
 *
 * Global options are accepted before or after the command (not after "--"). The configuration
 * is built as defaults < --preset (in order, each with its inheritance chain) < --set (in order)
 * < --device / --log-level / --quiet, then validated. Only this file exits: QC_OK -> 0,
 * QC_ERR_INVALID -> 2 (bad usage or input), anything else -> 1, with
 * "qctrain: error: <message>" on stderr ("qctrain: error: rank R of W: ..." when several ranks
 * run); a command stopped gracefully by SIGINT / SIGTERM (train, qc_cleanup.h) -> 128 + the
 * signal (130 / 143). Under mpirun / srun the process then leaves the world of ranks
 * (qc_dist_world_end): MPI_Finalize on success (a graceful stop included), MPI_Abort with the
 * exit code otherwise, so one rank's error stops every rank and the launcher exits non-zero.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "qc_cleanup.h"
#include "qc_cli.h"
#include "qc_config.h"
#include "qc_edit_distance.h"
#include "qc_dist.h" /* qc_dist_world_end */
#include "qc_runtime.h"
#include "qc_status.h"

#define global_opt  qc_cli_global /* the table lives in cli/cli_args.c */
#define global_opts qc_cli_globals

struct globals {
    struct qc_cli_strings presets;
    struct qc_cli_strings sets;
    const char *device;
    const char *log_level;
    bool quiet;
    bool config_dump;
};

static void print_usage(FILE *out)
{
    fprintf(out, "usage: qctrain [global options] <command> [options]\n\n"
                 "Trains QCNet (query-centric trajectory prediction) on Argoverse 2 scenes, with\n"
                 "memory as the first concern: caching allocator, offload, recompute, planner.\n\n"
                 "commands:\n");
    for (const struct qc_cli_command *c = qc_cli_commands; c->name; c++) {
        fprintf(out, "  %-10s %s\n", c->name, c->summary);
        if (strcmp(c->name, "bench") == 0) /* the targets: the table `bench --help` lists */
            for (const struct qc_cli_bench_target *t = qc_cli_bench_targets; t->name; t++)
                fprintf(out, "    %-8s %s\n", t->name, t->summary);
    }
    fprintf(out, "\nglobal options (before or after the command):\n");
    for (int i = 0; global_opts[i].name; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", global_opts[i].name,
                 global_opts[i].value ? " " : "", global_opts[i].value ? global_opts[i].value : "");
        fprintf(out, "  %-20s %s (default: %s)\n", left, global_opts[i].doc, global_opts[i].def);
    }
    fprintf(out, "  %-20s %s\n", "-h, --help", "show this help and exit");
    fprintf(out, "  %-20s %s\n", "--version", "same as `qctrain version`");
    fprintf(out,
            "\nprecedence: built-in defaults < presets < --set < --device/--log-level/--quiet\n"
            "`qctrain <command> --help` shows a command's options; `qctrain config options` every\n"
            "configuration key with its default, range and unit.\n");
}

static const struct global_opt *global_find(const char *arg, size_t len)
{
    if (len < 3 || arg[0] != '-' || arg[1] != '-')
        return NULL;
    for (int i = 0; global_opts[i].name; i++)
        if (strlen(global_opts[i].name) == len - 2 &&
            strncmp(global_opts[i].name, arg + 2, len - 2) == 0)
            return &global_opts[i];
    return NULL;
}

/* Consumes the global option at argv[*i] (and its value); *i ends on the last consumed arg. */
static enum qc_status global_take(const struct global_opt *g, int argc, char **argv, int *i,
                                  struct globals *gl)
{
    const char *arg = argv[*i];
    const char *eq = strchr(arg, '=');
    const char *value = NULL;
    if (g->value) {
        if (eq) {
            value = eq + 1;
        } else {
            if (*i + 1 >= argc)
                return qc_errorf(QC_ERR_INVALID, "option '--%s' needs a value (%s)", g->name,
                                 g->value);
            value = argv[++*i];
        }
    } else if (eq) {
        return qc_errorf(QC_ERR_INVALID, "option '--%s' takes no value, got \"%.80s\"", g->name,
                         eq + 1);
    }
    struct qc_cli_strings *list = NULL;
    if (strcmp(g->name, "preset") == 0)
        list = &gl->presets;
    else if (strcmp(g->name, "set") == 0)
        list = &gl->sets;
    else if (strcmp(g->name, "device") == 0)
        gl->device = value;
    else if (strcmp(g->name, "log-level") == 0)
        gl->log_level = value;
    else if (strcmp(g->name, "quiet") == 0)
        gl->quiet = true;
    else if (strcmp(g->name, "config-dump") == 0)
        gl->config_dump = true;
    if (list) {
        if (list->n >= QC_CLI_STRINGS_MAX)
            return qc_errorf(QC_ERR_INVALID, "option '--%s' given more than %d times", g->name,
                             QC_CLI_STRINGS_MAX);
        list->v[list->n++] = value;
    }
    return QC_OK;
}

static enum qc_status unknown_command(const char *name)
{
    const char *best = NULL;
    int best_d = 3;
    for (const struct qc_cli_command *c = qc_cli_commands; c->name; c++) {
        int d = qc_edit_distance(name, c->name);
        if (d < best_d) {
            best_d = d;
            best = c->name;
        }
    }
    if (best)
        return qc_errorf(QC_ERR_INVALID, "unknown command '%.80s'\nhint: did you mean '%s'?", name,
                         best);
    return qc_errorf(QC_ERR_INVALID,
                     "unknown command '%.80s'\nhint: `qctrain --help` lists the commands", name);
}

static enum qc_status unknown_global(const char *arg)
{
    const char *eq = strchr(arg, '=');
    int len = eq ? (int)(eq - arg) : (int)strlen(arg);
    const char *bare = arg[0] == '-' && arg[1] == '-' ? arg + 2 : arg + 1;
    int bare_len = len - (int)(bare - arg);
    char name[128];
    snprintf(name, sizeof name, "%.*s", bare_len < 127 ? bare_len : 127, bare);
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; global_opts[i].name; i++) {
        int d = qc_edit_distance(name, global_opts[i].name);
        if (d < best_d) {
            best_d = d;
            best = global_opts[i].name;
        }
    }
    if (best)
        return qc_errorf(QC_ERR_INVALID, "unknown option '%.*s'\nhint: did you mean '--%s'?", len,
                         arg, best);
    return qc_errorf(QC_ERR_INVALID,
                     "unknown option '%.*s'\nhint: global options go before or after the "
                     "command; `qctrain --help` lists them",
                     len, arg);
}

/* "gpu", "GPU", "nvidia", "cuda-gpu": a GPU user's word for --device cuda. */
static bool means_gpu(const char *v)
{
    char low[64];
    size_t n = 0;
    for (; v[n] && n + 1 < sizeof low; n++)
        low[n] = (char)(v[n] >= 'A' && v[n] <= 'Z' ? v[n] - 'A' + 'a' : v[n]);
    low[n] = '\0';
    return strcmp(low, "cuda") != 0 && (strstr(low, "gpu") || strstr(low, "nvidia"));
}

/* Whether command cmd (its argv) continues a saved run: train --resume, eval --weights. Its
 * configuration is then the run's with the presets and --set over it, which the command
 * validates (qc_train_cli_rebase); over the defaults alone the same --set may not be valid
 * (model.hidden_dim=64 against the defaults' 8 heads of 16 dimensions), and that error would
 * blame the defaults for what contradicts the run. */
static bool continues_run(const char *cmd, int argc, char *const *argv)
{
    const char *flag = strcmp(cmd, "train") == 0  ? "--resume"
                       : strcmp(cmd, "eval") == 0 ? "--weights"
                                                  : NULL;
    const size_t n = flag ? strlen(flag) : 0;
    for (int i = 1; flag && i < argc; i++)
        if (strncmp(argv[i], flag, n) == 0 && (argv[i][n] == '\0' || argv[i][n] == '='))
            return true;
    return false;
}

/* defaults < presets < --set < --device/--log-level/--quiet, then validation (validate false:
 * the command validates the configuration it builds, continues_run). */
static enum qc_status build_config(const struct globals *gl, bool validate, struct qc_cli *cli)
{
    qc_config_defaults(&cli->cfg);
    for (int i = 0; i < gl->presets.n; i++)
        QC_TRY(qc_config_apply_preset(&cli->cfg, gl->presets.v[i]));
    for (int i = 0; i < gl->sets.n; i++)
        QC_TRY(qc_config_apply_set(&cli->cfg, gl->sets.v[i]));
    if (gl->device && means_gpu(gl->device))
        return qc_errorf(QC_ERR_INVALID,
                         "--device: expected one of cpu, cuda, emu, got \"%.80s\"\nhint: did "
                         "you mean 'cuda'? (an NVIDIA GPU is --device cuda)",
                         gl->device);
    if (gl->device)
        QC_TRY(qc_config_set(&cli->cfg, "device.kind", gl->device, "--device"));
    if (gl->log_level)
        QC_TRY(qc_config_set(&cli->cfg, "log.level", gl->log_level, "--log-level"));
    if (gl->quiet)
        cli->cfg.quiet = true;
    if (validate)
        QC_TRY(qc_config_validate(&cli->cfg));
    cli->preset = gl->presets.n ? gl->presets.v[gl->presets.n - 1] : NULL;
    cli->presets = &gl->presets;
    cli->sets = &gl->sets;
    cli->device = gl->device;
    cli->log_level = gl->log_level;
    cli->quiet = cli->cfg.quiet;
    qc_log_set_level((enum qc_log_level)cli->cfg.log_level);
    return QC_OK;
}

static enum qc_status run(int argc, char **argv)
{
    static struct globals gl;    /* static: two string lists of 256 pointers each */
    static char *cmd_argv[1024]; /* the command's argv: its name, then its own arguments */
    static struct qc_cli cli;
    int cmd_argc = 0;
    const char *cmd_name = NULL;
    bool help = false, version = false, rest_is_cmd = false;

    if (argc > (int)(sizeof cmd_argv / sizeof cmd_argv[0]) - 2)
        return qc_errorf(QC_ERR_INVALID, "too many arguments (%d)", argc);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (rest_is_cmd) {
            cmd_argv[cmd_argc++] = argv[i];
            continue;
        }
        const char *eq = strchr(arg, '=');
        const struct global_opt *g = global_find(arg, eq ? (size_t)(eq - arg) : strlen(arg));
        if (g) {
            QC_TRY(global_take(g, argc, argv, &i, &gl));
            continue;
        }
        if (cmd_name) {
            if (strcmp(arg, "--") == 0)
                rest_is_cmd = true;
            cmd_argv[cmd_argc++] = argv[i];
            continue;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            help = true;
        } else if (strcmp(arg, "--version") == 0) {
            version = true;
        } else if (arg[0] == '-') {
            return unknown_global(arg);
        } else {
            cmd_name = arg;
            cmd_argv[cmd_argc++] = argv[i];
        }
    }
    cmd_argv[cmd_argc] = NULL;

    if (gl.log_level) {
        enum qc_log_level lvl;
        QC_TRY(qc_log_level_parse(gl.log_level, &lvl));
        qc_log_set_level(lvl);
    }
    if (help) {
        print_usage(stdout);
        return QC_OK;
    }
    if (!cmd_name && !version && !gl.config_dump) { /* nothing to do: a usage error */
        print_usage(stderr);
        return qc_errorf(QC_ERR_INVALID, "no command given\nhint: qctrain <command> [options]; "
                                         "`qctrain --help` lists the commands");
    }

    const struct qc_cli_command *cmd = NULL;
    if (version) {
        cmd = qc_cli_command_find("version");
        cmd_argv[0] = (char *)"version"; /* argv strings are never written */
        cmd_argv[1] = NULL;
        cmd_argc = 1;
    } else if (!cmd_name) {
        /* only --config-dump */
    } else if (strcmp(cmd_name, "help") == 0) {
        /* `qctrain help [command]` = `qctrain [command] --help` */
        if (cmd_argc < 2) {
            print_usage(stdout);
            return QC_OK;
        }
        cmd = qc_cli_command_find(cmd_argv[1]);
        if (!cmd)
            return unknown_command(cmd_argv[1]);
        cmd_argv[0] = cmd_argv[1];
        cmd_argv[1] = (char *)"--help";
        cmd_argc = 2;
    } else {
        cmd = qc_cli_command_find(cmd_name);
        if (!cmd)
            return unknown_command(cmd_name);
    }

    QC_TRY(build_config(
        &gl, gl.config_dump || !cmd_name || !continues_run(cmd_name, cmd_argc, cmd_argv), &cli));
    if (gl.config_dump) {
        QC_TRY(qc_config_dump_json(&cli.cfg, stdout));
        return fflush(stdout) == 0 ? QC_OK : qc_errorf(QC_ERR_IO, "writing to stdout failed");
    }
    enum qc_status st = cmd->run(&cli, cmd_argc, cmd_argv);
    if (fflush(stdout) != 0 && st == QC_OK)
        st = qc_errorf(QC_ERR_IO, "writing to stdout failed");
    return st;
}

int main(int argc, char **argv)
{
    qc_runtime_defaults_apply(argv); /* the OpenMP wait policy: may re-execute qctrain once */
    enum qc_status st = run(argc, argv);
    const int sig = qc_cleanup_stop_signal(); /* a graceful stop (train): 130 / 143 */
    if (st == QC_OK) {
        qc_dist_world_end(0);
        return sig ? 128 + sig : 0;
    }
    const char *msg = qc_error_last();
    if (qc_dist_world_size() > 1)
        fprintf(stderr, "qctrain: error: rank %d of %d: %s\n", qc_dist_world_rank(),
                qc_dist_world_size(), msg[0] ? msg : qc_status_str(st));
    else
        fprintf(stderr, "qctrain: error: %s\n", msg[0] ? msg : qc_status_str(st));
    const int code = st == QC_ERR_INVALID ? 2 : 1;
    qc_dist_world_end(code);
    return code;
}
