/*
 * test_cli.c — the option parser (in process) and the qctrain binary (as a subprocess): help of
 * every command, global options before and after the command, precedence, exit codes
 * (0 ok, 2 bad usage or input, 1 other failures) and the exact error lines on stderr.
 */
#include <cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qc_cli.h"
#include "qc_config.h"
#include "testutil.h"

extern char **environ;

#define QCTRAIN QC_BINARY_DIR "/qctrain"

struct run_result {
    int rc; /* exit status; -1 when it did not exit normally */
    char *out;
    char *err;
};

static void append(char **buf, size_t *len, const char *data, size_t n)
{
    char *p = realloc(*buf, *len + n + 1);
    if (!p)
        T_FATAL("out of memory");
    memcpy(p + *len, data, n);
    *len += n;
    p[*len] = '\0';
    *buf = p;
}

/* Runs qctrain with args (NULL-terminated), capturing stdout and stderr. */
static struct run_result run_args(const char *const *args)
{
    struct run_result r = {-1, NULL, NULL};
    int out_pipe[2], err_pipe[2];
    if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0)
        T_FATAL("pipe failed");
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)QCTRAIN;
    for (; args[n - 1] && n < 63; n++)
        memcpy(&argv[n], &args[n - 1], sizeof argv[n]); /* argv of exec is char *const[] */
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
    posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
    posix_spawn_file_actions_addclose(&fa, err_pipe[0]);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int st = posix_spawn(&pid, QCTRAIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (st != 0)
        T_FATAL("cannot run %s: %s (build the qctrain target first)", QCTRAIN, strerror(st));
    size_t out_len = 0, err_len = 0;
    append(&r.out, &out_len, "", 0);
    append(&r.err, &err_len, "", 0);
    struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(fds, 2, -1) < 0)
            break;
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[4096];
            ssize_t got = read(fds[i].fd, buf, sizeof buf);
            if (got > 0) {
                append(i == 0 ? &r.out : &r.err, i == 0 ? &out_len : &err_len, buf, (size_t)got);
            } else {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    int status;
    if (waitpid(pid, &status, 0) == pid && WIFEXITED(status))
        r.rc = WEXITSTATUS(status);
    return r;
}

#define RUN(...) run_args((const char *const[]){__VA_ARGS__, NULL})

static void run_free(struct run_result *r)
{
    free(r->out);
    free(r->err);
}

/* Looks up "section.key" in a dump. */
static const cJSON *dump_get(const cJSON *root, const char *key)
{
    char sec[64];
    const char *dot = strchr(key, '.');
    snprintf(sec, sizeof sec, "%.*s", (int)(dot - key), key);
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, sec), dot + 1);
}

static double dump_num(const cJSON *root, const char *key)
{
    const cJSON *v = dump_get(root, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const char *dump_str(const cJSON *root, const char *key)
{
    const cJSON *v = dump_get(root, key);
    return cJSON_IsString(v) ? v->valuestring : "(none)";
}

/* Captures what fn prints on stdout. */
static char *capture_stdout(enum qc_status (*fn)(void *), void *arg, enum qc_status *st)
{
    char path[] = "/tmp/qc_test_cli_out.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        T_FATAL("mkstemp");
    fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    *st = fn(arg);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    char *text = NULL;
    size_t len = 0;
    append(&text, &len, "", 0);
    char buf[4096];
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0)
        append(&text, &len, buf, (size_t)got);
    close(fd);
    unlink(path);
    return text;
}

// ---- the in-process parser fixture ---------------------------------------------------------

struct parse_fixture {
    int64_t steps;
    double lr;
    uint64_t budget;
    const char *name;
    struct qc_cli_strings tags;
    bool verbose;
    const char *pos[4];
    int npos;
    bool help;
};

static struct qc_cli_opt fixture_opts(struct parse_fixture *f, int i)
{
    struct qc_cli_opt opts[] = {
        {"steps", QC_CLI_INT, &f->steps, "10", "steps to run"},
        {"lr", QC_CLI_DOUBLE, &f->lr, "0.001", "learning rate"},
        {"budget", QC_CLI_SIZE, &f->budget, "0", "memory budget"},
        {"name", QC_CLI_STRING, &f->name, "", "run name"},
        {"tag", QC_CLI_STRINGS, &f->tags, "", "a tag"},
        {"verbose", QC_CLI_FLAG, &f->verbose, "off", "say more"},
    };
    return opts[i];
}

static enum qc_status parse_argv(struct parse_fixture *f, int argc, const char *const *argv,
                                 bool with_pos)
{
    struct qc_cli_opt opts[6];
    for (int i = 0; i < 6; i++)
        opts[i] = fixture_opts(f, i);
    memset(f, 0, sizeof *f);
    f->steps = 10;
    qc_error_clear();
    char *args[32];
    memcpy(args, argv, (size_t)argc * sizeof args[0]); /* qc_cli_parse never writes argv */
    return qc_cli_parse("test", "[options] FILE...", "A test command.", opts, 6, argc, args,
                        with_pos ? f->pos : NULL, 4, &f->npos, &f->help);
}

static void expect_parse_error(const char *const *argv, int argc, const char *want)
{
    struct parse_fixture f;
    enum qc_status st = parse_argv(&f, argc, argv, true);
    T_EXPECT(st == QC_ERR_INVALID, "status %d for [%s]", (int)st, want);
    T_EXPECT(strcmp(qc_error_last(), want) == 0, "\n      got  [%s]\n      want [%s]",
             qc_error_last(), want);
}

static enum qc_status help_thunk(void *arg)
{
    static const char *const argv[] = {"test", "--steps", "3", "--help", "--bogus"};
    return parse_argv(arg, 5, argv, true);
}

int main(void)
{
    QC_TEST ("cli: qc_cli_parse accepts every option form") {
        const char *const argv[] = {"test",      "--steps", "5",       "--lr=0.5",
                                    "--budget",  "2GiB",    "--name",  "run1",
                                    "--tag",     "a",       "--tag=b", "in.bin",
                                    "--verbose", "-",       "--",      "--not-an-option"};
        struct parse_fixture f;
        enum qc_status st = parse_argv(&f, 16, argv, true);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(f.steps, 5, "int");
        T_EXPECT(f.lr == 0.5, "double %g", f.lr);
        T_EXPECT_EQ_U64(f.budget, 2ull << 30, "size");
        T_EXPECT(f.name && strcmp(f.name, "run1") == 0, "string");
        T_EXPECT(f.tags.n == 2 && strcmp(f.tags.v[0], "a") == 0 && strcmp(f.tags.v[1], "b") == 0,
                 "strings");
        T_EXPECT(f.verbose, "flag");
        T_EXPECT(!f.help, "no help");
        T_EXPECT_EQ_I64(f.npos, 3, "positionals");
        T_EXPECT(f.npos == 3 && strcmp(f.pos[0], "in.bin") == 0 && strcmp(f.pos[1], "-") == 0 &&
                     strcmp(f.pos[2], "--not-an-option") == 0,
                 "positional order, '-' and after '--'");
        const char *const argv2[] = {"test", "--verbose=false"};
        T_EXPECT(parse_argv(&f, 2, argv2, true) == QC_OK && !f.verbose && f.steps == 10,
                 "--flag=false; untouched defaults");
    }

    QC_TEST ("cli: qc_cli_parse errors name the command, the option and the value") {
        expect_parse_error((const char *const[]){"test", "--stpes", "3"}, 3,
                           "test: unknown option '--stpes'\nhint: did you mean '--steps'?");
        expect_parse_error((const char *const[]){"test", "--stpes=3"}, 2,
                           "test: unknown option '--stpes'\nhint: did you mean '--steps'?");
        expect_parse_error((const char *const[]){"test", "--zzzzzz"}, 2,
                           "test: unknown option '--zzzzzz'\nhint: `qctrain test --help` lists "
                           "the options");
        expect_parse_error((const char *const[]){"test", "-x"}, 2,
                           "test: unknown option '-x'\nhint: `qctrain test --help` lists the "
                           "options");
        expect_parse_error((const char *const[]){"test", "--steps"}, 2,
                           "test: option '--steps' needs a value");
        expect_parse_error((const char *const[]){"test", "--steps", "abc"}, 3,
                           "test: option '--steps': expected an integer, got \"abc\"");
        expect_parse_error((const char *const[]){"test", "--lr=fast"}, 2,
                           "test: option '--lr': expected a number, got \"fast\"");
        expect_parse_error((const char *const[]){"test", "--budget", "24GX"}, 3,
                           "test: option '--budget': expected a size such as 24GiB, 512MiB, 1e9 "
                           "or 4096, got \"24GX\"");
        expect_parse_error((const char *const[]){"test", "--verbose=perhaps"}, 2,
                           "test: option '--verbose': expected true or false, got \"perhaps\"");
        expect_parse_error((const char *const[]){"test", "a", "b", "c", "d", "e"}, 6,
                           "test: unexpected argument 'e'\nhint: usage: qctrain test [options] "
                           "FILE...");
        struct parse_fixture f;
        const char *const argv[] = {"test", "x"};
        T_EXPECT(parse_argv(&f, 2, argv, false) == QC_ERR_INVALID, "positional without pos");
    }

    QC_TEST ("cli: --help prints usage, summary and every option with its default") {
        struct parse_fixture f;
        enum qc_status st;
        char *text = capture_stdout(help_thunk, &f, &st);
        T_EXPECT(st == QC_OK, "help is not an error: %s", qc_error_last());
        T_EXPECT(f.help, "help_shown set");
        T_EXPECT(strncmp(text, "usage: qctrain test [options] FILE...\n", 38) == 0, "[%s]", text);
        T_EXPECT_STR_CONTAINS(text, "A test command.");
        const char *want[] = {"--steps N",     "steps to run (default: 10)",
                              "--lr X",        "(default: 0.001)",
                              "--budget SIZE", "--name TEXT",
                              "--tag TEXT",    "(repeatable)",
                              "--verbose",     "-h, --help",
                              "--preset"};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            T_EXPECT_STR_CONTAINS(text, want[i]);
        free(text);
    }

    QC_TEST ("cli: qctrain --help lists the commands and global options; qctrain alone is a "
             "usage error (exit 2, the usage on stderr)") {
        struct run_result r[2] = {RUN("--help"), run_args((const char *const[]){NULL})};
        for (int k = 0; k < 2; k++) {
            const char *text = k ? r[k].err : r[k].out;
            T_EXPECT_EQ_I64(r[k].rc, k ? 2 : 0, "exit code (%s)", k ? "no args" : "--help");
            T_EXPECT(strncmp(text, "usage: qctrain", 14) == 0, "usage first: [%.60s]", text);
            for (const struct qc_cli_command *c = qc_cli_commands; c->name; c++) {
                char line[128];
                snprintf(line, sizeof line, "  %s ", c->name);
                T_EXPECT_STR_CONTAINS(text, line);
                T_EXPECT_STR_CONTAINS(text, c->summary);
            }
            const char *globals[] = {"--preset NAME|PATH", "--set key=value", "--config-dump",
                                     "--device cpu|cuda",  "--log-level",     "--quiet",
                                     "(default: cpu)",     "(default: info)"};
            for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
                T_EXPECT_STR_CONTAINS(text, globals[i]);
        }
        T_EXPECT(r[1].out[0] == '\0', "no args: nothing on stdout [%s]", r[1].out);
        T_EXPECT_STR_CONTAINS(r[1].err, "qctrain: error: no command given\n");
        /* one table of bench targets: `qctrain --help` and `qctrain bench --help` list the same */
        struct run_result b = RUN("bench", "--help");
        T_EXPECT_EQ_I64(b.rc, 0, "bench --help: %s", b.err);
        int ntargets = 0;
        for (const struct qc_cli_bench_target *t = qc_cli_bench_targets; t->name; t++, ntargets++) {
            char line[256];
            snprintf(line, sizeof line, "    %-8s %s\n", t->name, t->summary);
            T_EXPECT_STR_CONTAINS(r[0].out, line);
            snprintf(line, sizeof line, "  %-8s %s\n", t->name, t->summary);
            T_EXPECT_STR_CONTAINS(b.out, line);
        }
        T_EXPECT(ntargets >= 8, "%d bench targets", ntargets);
        run_free(&b);
        run_free(&r[0]);
        run_free(&r[1]);
    }

    QC_TEST ("cli: help shows paths as PATH, one default per option; near misses of global "
             "options after the command get a did-you-mean") {
        struct run_result r = RUN("train", "--help");
        T_EXPECT_STR_CONTAINS(r.out, "--out PATH");
        T_EXPECT_STR_CONTAINS(r.out, "--data PATH");
        T_EXPECT_STR_CONTAINS(r.out, "--resume PATH");
        T_EXPECT_STR_CONTAINS(r.out, "--attention TEXT");
        run_free(&r);
        r = RUN("tune", "--help");
        const char *gb = strstr(r.out, "--global-batch");
        const char *eol = gb ? strchr(gb, '\n') : NULL;
        int ndef = 0;
        for (const char *p = gb; p && eol && (p = strstr(p, "default")) && p < eol; p++)
            ndef++;
        T_EXPECT(gb && ndef == 1, "tune --help: --global-batch has one default (%d): %.200s", ndef,
                 gb ? gb : "(missing)");
        T_EXPECT_STR_CONTAINS(r.out, "--out PATH");
        run_free(&r);
        r = RUN("train", "--presett", "cpu-smoke");
        T_EXPECT_EQ_I64(r.rc, 2, "train --presett");
        T_EXPECT(strcmp(r.err, "qctrain: error: train: unknown option '--presett'\nhint: did you "
                               "mean '--preset'? (a global option)\n") == 0,
                 "[%s]", r.err);
        run_free(&r);
    }

    QC_TEST ("cli: `qctrain <command> --help` works for every command") {
        for (const struct qc_cli_command *c = qc_cli_commands; c->name; c++) {
            struct run_result r = RUN(c->name, "--help");
            char usage[128];
            snprintf(usage, sizeof usage, "usage: qctrain %s", c->name);
            T_EXPECT_EQ_I64(r.rc, 0, "%s --help: %s", c->name, r.err);
            T_EXPECT(strncmp(r.out, usage, strlen(usage)) == 0,
                     "%s --help starts with usage: %.80s", c->name, r.out);
            T_EXPECT(r.err[0] == '\0', "%s --help writes nothing to stderr: %s", c->name, r.err);
            run_free(&r);
            /* `qctrain help <command>` is the same */
            struct run_result h = RUN("help", c->name);
            T_EXPECT(h.rc == 0 && strncmp(h.out, usage, strlen(usage)) == 0, "help %s", c->name);
            run_free(&h);
        }
        struct run_result r = RUN("config", "--help");
        T_EXPECT_STR_CONTAINS(r.out, "options");
        T_EXPECT_STR_CONTAINS(r.out, "dump");
        T_EXPECT_STR_CONTAINS(r.out, "check FILE");
        T_EXPECT_STR_CONTAINS(r.out, "--preset");
        run_free(&r);
    }

    QC_TEST ("cli: unknown commands and options exit 2 with a hint") {
        struct run_result r = RUN("trian");
        T_EXPECT_EQ_I64(r.rc, 2, "unknown command");
        T_EXPECT(strcmp(r.err, "qctrain: error: unknown command 'trian'\nhint: did you mean "
                               "'train'?\n") == 0,
                 "[%s]", r.err);
        run_free(&r);
        r = RUN("frobnicate");
        T_EXPECT_EQ_I64(r.rc, 2, "unknown command");
        T_EXPECT_STR_CONTAINS(r.err, "hint: `qctrain --help` lists the commands");
        run_free(&r);
        r = RUN("--prset", "x", "version");
        T_EXPECT_EQ_I64(r.rc, 2, "unknown global option");
        T_EXPECT(strcmp(r.err, "qctrain: error: unknown option '--prset'\nhint: did you mean "
                               "'--preset'?\n") == 0,
                 "[%s]", r.err);
        run_free(&r);
        r = RUN("version", "--preset");
        T_EXPECT_EQ_I64(r.rc, 2, "missing value");
        T_EXPECT_STR_CONTAINS(r.err, "option '--preset' needs a value");
        run_free(&r);
        r = RUN("--quiet=yes", "version");
        T_EXPECT_EQ_I64(r.rc, 2, "flag with a value");
        run_free(&r);
        r = RUN("--log-level", "loud", "version");
        T_EXPECT_EQ_I64(r.rc, 2, "bad log level");
        T_EXPECT_STR_CONTAINS(r.err, "log level 'loud' is not one of error, warn, info, debug");
        run_free(&r);
        r = RUN("config", "dump", "--", "--set", "x");
        T_EXPECT_EQ_I64(r.rc, 2, "after --, --set belongs to the command");
        T_EXPECT_STR_CONTAINS(r.err, "config dump: unexpected argument '--set'");
        run_free(&r);
        r = RUN("config", "chek");
        T_EXPECT_EQ_I64(r.rc, 2, "config subcommand typo");
        T_EXPECT_STR_CONTAINS(r.err, "hint: did you mean 'check'?");
        run_free(&r);
    }

    QC_TEST ("cli: --config-dump prints the whole configuration as JSON") {
        struct run_result r = RUN("--config-dump");
        T_EXPECT_EQ_I64(r.rc, 0, "exit code: %s", r.err);
        cJSON *root = cJSON_Parse(r.out);
        T_EXPECT(root != NULL, "valid JSON: %s", r.out);
        for (int i = 0; i < qc_config_option_count() && root; i++)
            T_EXPECT(dump_get(root, qc_config_option_at(i)->key) != NULL, "%s in the dump",
                     qc_config_option_at(i)->key);
        T_EXPECT(dump_num(root, "model.hidden_dim") == 128, "default D");
        cJSON_Delete(root);
        struct run_result d = RUN("config", "dump");
        T_EXPECT(d.rc == 0 && strcmp(d.out, r.out) == 0, "config dump == --config-dump");
        run_free(&d);
        run_free(&r);
    }

    QC_TEST ("cli: --preset rtx3090x8 --config-dump holds 8 ranks and a 23 GiB budget (24 GiB "
             "less the reserve)") {
        struct run_result r = RUN("--preset", "rtx3090x8", "--config-dump");
        T_EXPECT_EQ_I64(r.rc, 0, "exit code: %s", r.err);
        T_EXPECT_STR_CONTAINS(r.out, "24696061952");
        cJSON *root = cJSON_Parse(r.out);
        T_EXPECT(dump_num(root, "dist.world_size") == 8, "world size");
        T_EXPECT(dump_num(root, "device.budget") == 24696061952.0, "budget");
        T_EXPECT(dump_num(root, "hw.device_memory") == 25769803776.0, "the card's bytes");
        T_EXPECT(strcmp(dump_str(root, "device.kind"), "cuda") == 0, "cuda");
        cJSON_Delete(root);
        run_free(&r);
    }

    QC_TEST ("cli: global options after the command, and their precedence") {
        struct run_result r =
            RUN("config", "dump", "--preset", "cpu-smoke", "--set", "train.seed=7",
                "--set=train.steps=3", "--device", "cuda", "--log-level=debug", "--quiet");
        T_EXPECT_EQ_I64(r.rc, 0, "exit code: %s", r.err);
        cJSON *root = cJSON_Parse(r.out);
        T_EXPECT(dump_num(root, "model.hidden_dim") == 32, "preset after the command");
        T_EXPECT(dump_num(root, "train.seed") == 7, "--set after the command");
        T_EXPECT(dump_num(root, "train.steps") == 3, "--set=k=v");
        T_EXPECT(strcmp(dump_str(root, "device.kind"), "cuda") == 0, "--device");
        T_EXPECT(strcmp(dump_str(root, "log.level"), "debug") == 0, "--log-level");
        T_EXPECT(cJSON_IsTrue(dump_get(root, "log.quiet")), "--quiet");
        cJSON_Delete(root);
        run_free(&r);

        /* defaults < presets (in order) < --set (in order) < --device, whatever the argv order */
        r = RUN("--device", "cpu", "--set", "device.kind=cuda", "--set", "dist.world_size=2",
                "--preset", "rtx3090x8", "--set", "dist.world_size=3", "--preset", "cpu-smoke",
                "--config-dump");
        T_EXPECT_EQ_I64(r.rc, 0, "exit code: %s", r.err);
        root = cJSON_Parse(r.out);
        T_EXPECT(strcmp(dump_str(root, "device.kind"), "cpu") == 0, "--device beats --set");
        T_EXPECT(dump_num(root, "dist.world_size") == 3, "the last --set wins over presets");
        T_EXPECT(dump_num(root, "model.hidden_dim") == 32, "the later preset wins");
        T_EXPECT(dump_num(root, "hw.gpus_per_node") == 8, "the earlier preset's other keys stay");
        cJSON_Delete(root);
        run_free(&r);
    }

    QC_TEST ("cli: bad --set, bad presets and invalid configurations exit 2") {
        struct run_result r = RUN("--set", "model.hidden_dim=abc", "--config-dump");
        T_EXPECT_EQ_I64(r.rc, 2, "bad --set");
        T_EXPECT(strcmp(r.err, "qctrain: error: --set: key 'model.hidden_dim': expected an "
                               "integer, got \"abc\"\n") == 0,
                 "[%s]", r.err);
        T_EXPECT(r.out[0] == '\0', "nothing on stdout");
        run_free(&r);
        r = RUN("--set", "nokey", "version");
        T_EXPECT_EQ_I64(r.rc, 2, "--set without =");
        run_free(&r);
        r = RUN("--device", "gpu", "--config-dump");
        T_EXPECT_EQ_I64(r.rc, 2, "bad --device");
        T_EXPECT_STR_CONTAINS(r.err, "expected one of cpu, cuda, emu, got \"gpu\"");
        T_EXPECT_STR_CONTAINS(r.err, "hint: did you mean 'cuda'?"); /* not 'cpu' */
        run_free(&r);
        r = RUN("--set", "model.hidden_dim=64", "--config-dump");
        T_EXPECT_EQ_I64(r.rc, 2, "inconsistent model");
        T_EXPECT_STR_CONTAINS(r.err, "qctrain: error: invalid configuration: model.num_heads");
        run_free(&r);

        char dir[] = "/tmp/qc_test_cli.XXXXXX";
        if (!mkdtemp(dir))
            T_FATAL("mkdtemp");
        char bad[256], cyc_a[256], cyc_b[256];
        snprintf(bad, sizeof bad, "%s/bad.json", dir);
        snprintf(cyc_a, sizeof cyc_a, "%s/a.json", dir);
        snprintf(cyc_b, sizeof cyc_b, "%s/b.json", dir);
        FILE *f = fopen(bad, "w");
        fputs("{\"inherits\": \"qcnet-av2\", \"device\": {\"budgt\": \"24GiB\"}}\n", f);
        fclose(f);
        f = fopen(cyc_a, "w");
        fputs("{\"inherits\": \"b.json\"}", f);
        fclose(f);
        f = fopen(cyc_b, "w");
        fputs("{\"inherits\": \"a.json\"}", f);
        fclose(f);
        char want[512];
        snprintf(want, sizeof want,
                 "qctrain: error: %s: key 'device.budgt': unknown key\nhint: did you mean "
                 "'device.budget'?\n",
                 bad);
        r = RUN("--preset", bad, "--config-dump");
        T_EXPECT_EQ_I64(r.rc, 2, "malformed preset");
        T_EXPECT(strcmp(r.err, want) == 0, "\n      got  [%s]\n      want [%s]", r.err, want);
        run_free(&r);
        r = RUN("config", "check", bad);
        T_EXPECT_EQ_I64(r.rc, 2, "config check of a bad preset");
        T_EXPECT(strcmp(r.err, want) == 0, "[%s]", r.err);
        run_free(&r);
        r = RUN("config", "check", cyc_a);
        T_EXPECT_EQ_I64(r.rc, 2, "cycle");
        snprintf(want, sizeof want,
                 "qctrain: error: preset inheritance cycle: %s -> b.json -> a.json\n", cyc_a);
        T_EXPECT(strcmp(r.err, want) == 0, "\n      got  [%s]\n      want [%s]", r.err, want);
        run_free(&r);
        r = RUN("--preset", "no-such-preset", "version");
        T_EXPECT_EQ_I64(r.rc, 2, "missing preset");
        T_EXPECT_STR_CONTAINS(r.err, "qctrain: error: preset 'no-such-preset' not found");
        run_free(&r);
        unlink(bad);
        unlink(cyc_a);
        unlink(cyc_b);
        rmdir(dir);
    }

    QC_TEST ("cli: bench step reports the step's GEMM FLOPs, their efficiency against the SGEMM "
             "peak and the step over the GEMM floor") {
        struct run_result r =
            RUN("--preset", "cpu-smoke", "bench", "step", "--quick", "--batch-sizes", "1",
                "--profiles", "typical", "--attention", "fused", "--json");
        T_EXPECT_EQ_I64(r.rc, 0, "bench step: %s", r.err);
        cJSON *root = cJSON_Parse(r.out);
        const cJSON *res =
            root ? cJSON_GetArrayItem(cJSON_GetObjectItem(root, "results"), 0) : NULL;
        T_EXPECT(res != NULL, "no results in [%s]", r.out);
        const char *keys[] = {"step_s",      "gemm_flops",        "gemm_s",
                              "gemm_gflops", "sgemm_peak_gflops", "gemm_efficiency",
                              "floor_s",     "floor_ratio"};
        double v[8] = {0};
        for (int i = 0; i < 8 && res; i++) {
            const cJSON *x = cJSON_GetObjectItem(res, keys[i]);
            T_EXPECT(cJSON_IsNumber(x) && x->valuedouble > 0, "%s missing or not > 0", keys[i]);
            v[i] = cJSON_IsNumber(x) ? x->valuedouble : 0;
        }
        /* the figures agree with each other: achieved = FLOPs / GEMM seconds; efficiency =
         * achieved / peak; floor = FLOPs at the peak; ratio = step / floor */
        T_EXPECT(fabs(v[3] - v[1] * 1e-9 / v[2]) <= 1e-9 * v[3], "gemm_gflops %g", v[3]);
        T_EXPECT(fabs(v[5] - v[3] / v[4]) <= 1e-9 * v[5], "gemm_efficiency %g", v[5]);
        T_EXPECT(fabs(v[6] - v[1] * 1e-9 / v[4]) <= 1e-9 * v[6], "floor_s %g", v[6]);
        T_EXPECT(fabs(v[7] - v[0] / v[6]) <= 1e-9 * v[7], "floor_ratio %g", v[7]);
        /* and the world: GEMMs run below the peak (noise allowed), take part of a step, and a
         * step takes longer than its GEMMs would at the peak */
        T_EXPECT(v[5] < 1.5, "GEMM efficiency %.2f of the SGEMM peak", v[5]);
        T_EXPECT(v[2] < 1.5 * v[0], "GEMM %.3f s in a %.3f s step", v[2], v[0]);
        T_EXPECT(v[7] > 1.0, "step %.3f s under its GEMM floor %.3f s", v[0], v[6]);
        T_EXPECT_STR_CONTAINS(r.err, "of the SGEMM peak");
        /* the SGEMM's buffers and the profiled step stay out of the run's memory figures (taken
         * after them, the reserved peak was 2.04x the allocated one; 1.27x before them) */
        const cJSON *pk = res ? cJSON_GetObjectItem(res, "peak_device_bytes") : NULL;
        const cJSON *rs = res ? cJSON_GetObjectItem(res, "reserved_peak_bytes") : NULL;
        T_EXPECT(cJSON_IsNumber(pk) && cJSON_IsNumber(rs) && pk->valuedouble > 0 &&
                     rs->valuedouble < 1.6 * pk->valuedouble,
                 "reserved peak %.0f for an allocated peak %.0f",
                 cJSON_IsNumber(rs) ? rs->valuedouble : 0.0,
                 cJSON_IsNumber(pk) ? pk->valuedouble : 0.0);
        cJSON_Delete(root);
        run_free(&r);
    }

    QC_TEST ("cli: config check, config options and version") {
        struct run_result r = RUN("config", "check", "cpu-smoke", "qcnet-av2", "rtx3090x8",
                                  "rtx3090x1-b32", "h200x1");
        T_EXPECT_EQ_I64(r.rc, 0, "shipped presets check: %s", r.err);
        T_EXPECT_STR_CONTAINS(r.out, "cpu-smoke: ok\n");
        T_EXPECT_STR_CONTAINS(r.out, "h200x1: ok\n");
        run_free(&r);
        r = RUN("config", "check");
        T_EXPECT_EQ_I64(r.rc, 2, "check without a file");
        run_free(&r);
        r = RUN("config", "options");
        T_EXPECT_EQ_I64(r.rc, 0, "options");
        for (int i = 0; i < qc_config_option_count(); i++)
            T_EXPECT_STR_CONTAINS(r.out, qc_config_option_at(i)->key);
        run_free(&r);
        r = RUN("config");
        T_EXPECT_EQ_I64(r.rc, 2, "config without a subcommand");
        run_free(&r);
        struct run_result v[2] = {RUN("version"), RUN("--version")};
        for (int k = 0; k < 2; k++) {
            T_EXPECT_EQ_I64(v[k].rc, 0, "version: %s", v[k].err);
            T_EXPECT(strncmp(v[k].out, "qctrain ", 8) == 0, "[%s]", v[k].out);
            T_EXPECT_STR_CONTAINS(v[k].out, "\nbuild: ");
            T_EXPECT_STR_CONTAINS(v[k].out, "\ncuda: ");
            T_EXPECT_STR_CONTAINS(v[k].out, "\nmpi: ");
            T_EXPECT_STR_CONTAINS(v[k].out, "\ncompiler: ");
        }
        T_EXPECT(strcmp(v[0].out, v[1].out) == 0, "--version == version");
#ifdef QC_HAVE_CUDA
        T_EXPECT_STR_CONTAINS(v[0].out, "cuda: yes");
#else
        T_EXPECT_STR_CONTAINS(v[0].out, "cuda: no");
#endif
        run_free(&v[0]);
        run_free(&v[1]);
        r = RUN("version", "extra");
        T_EXPECT_EQ_I64(r.rc, 2, "version takes no arguments");
        run_free(&r);
    }

    return qc_test_summary();
}
