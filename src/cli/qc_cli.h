/*
 * qc_cli.h — the qctrain command table and the option parser every subcommand uses.
 *
 * main() strips the global options (--preset, --set, --config-dump, --device, --log-level,
 * --quiet; accepted before or after the command), builds the effective configuration and calls
 * the command's run() with the remaining arguments (argv[0] is the command name). A command
 * declares its own options as a struct qc_cli_opt table and parses them with qc_cli_parse(),
 * which also answers --help. Commands return a status; main maps QC_OK -> 0,
 * QC_ERR_INVALID -> 2 (bad usage, bad input) and anything else -> 1, printing qc_error_last().
 */
#ifndef QC_CLI_QC_CLI_H
#define QC_CLI_QC_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_config.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_cli {
    struct qc_config cfg; /* effective configuration (defaults < presets < --set < --device) */
    const char *preset;   /* last --preset given, or NULL */
    bool quiet;           /* --quiet */
    /* What the user gave, for a command that builds the configuration on another base than
     * the defaults (train --resume, eval --weights RUN: the saved run's configuration <
     * presets < --set < --device / --log-level / --quiet; qc_train_cli_rebase). */
    const struct qc_cli_strings *presets, *sets; /* in order; NULL: none */
    const char *device, *log_level;              /* NULL: not given */
};

enum qc_cli_opt_type {
    QC_CLI_FLAG = 0, /* bool *: present -> true */
    QC_CLI_INT,      /* int64_t * */
    QC_CLI_DOUBLE,   /* double * */
    QC_CLI_SIZE,     /* uint64_t *: bytes, units accepted (qc_parse_size) */
    QC_CLI_STRING,   /* const char **: points into argv */
    QC_CLI_STRINGS,  /* struct qc_cli_strings *: repeatable; each use appends */
};

#define QC_CLI_STRINGS_MAX 256
struct qc_cli_strings {
    int n;
    const char *v[QC_CLI_STRINGS_MAX];
};

/* One command-specific option, "--name VALUE" or "--name=VALUE". The caller initialises *dst
 * to the default; def is the same default as text, shown by --help. --help shows a string
 * option's value as PATH when it names a file or folder (the names out, data, val-data,
 * resume, init-from, weights, dump, cost, keep, dir), else as TEXT. */
struct qc_cli_opt {
    const char *name; /* long name without dashes */
    enum qc_cli_opt_type type;
    void *dst;
    const char *def; /* default shown in help ("" for none) */
    const char *doc;
};

struct qc_cli_command {
    const char *name;
    const char *summary; /* one line for `qctrain --help` */
    enum qc_status (*run)(struct qc_cli *cli, int argc, char **argv);
};

/* The global options (cli/cli_args.c), terminated by a {NULL} entry: main() parses them, and
 * a command's parser names them in its "did you mean" (`train --presett`). */
struct qc_cli_global {
    const char *name;  /* without dashes */
    const char *value; /* placeholder of its value; NULL for a flag */
    const char *def;
    const char *doc;
};
extern const struct qc_cli_global qc_cli_globals[];

/* `qctrain bench` targets (bench/targets.c), terminated by a {NULL} entry: the one table both
 * `qctrain --help` and `qctrain bench --help` list. */
struct qc_cli_bench_target {
    const char *name;
    const char *summary;
    enum qc_status (*run)(struct qc_cli *cli, int argc, char **argv);
};
extern const struct qc_cli_bench_target qc_cli_bench_targets[];

/* The command table (cli/commands.c), terminated by a {NULL} entry. */
extern const struct qc_cli_command qc_cli_commands[];
const struct qc_cli_command *qc_cli_command_find(const char *name);

/* Parses argv[1..argc) against opts. Positional arguments are collected into pos (argv
 * pointers; *npos set) when pos != NULL, else they are an error. "--help"/"-h" prints
 * "usage: qctrain <cmd> <usage>", the summary and every option with its default, to stdout,
 * and sets *help_shown (the command then returns QC_OK). Errors are QC_ERR_INVALID with a
 * message naming the command, the option and the value, with "did you mean" for near misses. */
enum qc_status qc_cli_parse(const char *cmd, const char *usage, const char *summary,
                            const struct qc_cli_opt *opts, int nopts, int argc, char **argv,
                            const char **pos, int max_pos, int *npos, bool *help_shown);

/* The Python scripts of tools/ that commands run (cli/python_tool.c). qc_cli_tool_find: the
 * path of tools/NAME in the source tree, beside the executable (cmake --install) or under the
 * configured prefix, written to buf; NULL when none is readable. qc_cli_tool_run: runs
 * `python3 TOOL ARGS...` (at most 16) and waits for it; QC_OK when it exits 0, else QC_ERR_IO
 * starting with `what` and naming the script and its exit status (the script prints its own
 * message). */
const char *qc_cli_tool_find(const char *name, char *buf, size_t cap);
enum qc_status qc_cli_tool_run(const char *what, const char *name, const char *const *args,
                               int nargs);

/* The command implementations (one file per subcommand, src/cmd_<name>.c). */
enum qc_status qc_cmd_version(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_config(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_plan(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_tune(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_gen(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_inspect(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_train(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_eval(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_bench(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_profile(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_cmd_report(struct qc_cli *cli, int argc, char **argv);

/* `qctrain bench <what>` targets (src/bench/bench_<what>.c); argv[0] is <what>. */
enum qc_status qc_bench_loader(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_bench_alloc(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_bench_offload(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_bench_ops(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_bench_step(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_bench_memory(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_bench_report(struct qc_cli *cli, int argc, char **argv);
enum qc_status qc_bench_numerics(struct qc_cli *cli, int argc, char **argv);
/* The synthetic run folder of `bench report` (src/bench/bench_report.c): `steps` steps of
 * metrics.jsonl, a memory.json with a plan, one step's trace of about `events` events. */
enum qc_status qc_bench_report_make_run(const char *dir, int64_t steps, int64_t events);
enum qc_status qc_bench_dist(struct qc_cli *cli, int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* QC_CLI_QC_CLI_H */
