/*
 * test_faults.c — the smaller faults hostile use found (issue 25, "Smaller faults"), each on
 * the qctrain binary (docs/RELIABILITY.md lists them):
 *   - alloc.round 1..32 (its documented range) trains, evaluates and profiles: every block stays
 *     64-byte aligned (the stash's alignment), and the bits equal the default rounding's;
 *   - a file size limit (ulimit -f, SIGXFSZ at its default) is a "File too large" error naming
 *     the file, exit 1, nothing half-written, never a death by SIGXFSZ;
 *   - qctrain gen under a file size limit names the file it was asked for (not its .tmp) and
 *     leaves neither;
 *   - train / eval with a --data file that does not exist: bad input (exit 2) naming it;
 *   - byte sizes: surrounding whitespace ignored, one optional space before the unit;
 *   - report --step: 0 and negatives refused alike, naming the value;
 *   - messages: --weights / --init-from on a folder without a checkpoint says so (not --resume);
 *     device.budget too small for the parameters gives the budget figures and the fixed bytes;
 *     an unusable offload.nvme_dir is named with its reason, not "give the planner an NVMe
 *     tier";
 *   - ranks of one node (mpirun, with MPI): the default host tier is divided among them, and
 *     only rank 0 prints its offload and plan info lines.
 * The runs use cpu-smoke's model on one generated 1-scene shard (a fraction of a second a step).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proc_testlib.h"
#include "qc_config.h"
#include "testutil.h"

static char tmp_root[256];
static char shard[300];
static const char qctrain[] = QC_BINARY_DIR "/qctrain";

/* A fresh path under the temporary root. */
static void tpath(char *out, size_t n, const char *name)
{
    if ((size_t)snprintf(out, n, "%s/%s", tmp_root, name) >= n)
        T_FATAL("path too long: %s/%s", tmp_root, name);
    t_rm_rf(out);
}

/* qctrain with args (NULL-terminated) under `sh -c PREFIX; exec ...` when prefix is not NULL;
 * the exit code (128 + the signal when it died of one) and the output in *out (malloc'd). */
static int run_sh(const char *prefix, const char *const *args, const char *log, char **out)
{
    unlink(log);
    struct t_args a = {{0}, 0};
    char script[256];
    if (prefix) {
        snprintf(script, sizeof script, "%s; exec \"$0\" \"$@\"", prefix);
        t_args_add(&a, "/bin/sh");
        t_args_add(&a, "-c");
        t_args_add(&a, script);
    }
    t_args_add(&a, qctrain);
    for (int i = 0; args[i]; i++)
        t_args_add(&a, args[i]);
    const int st = t_run(&a, log, NULL);
    if (out)
        *out = t_read_file(log, NULL);
    if (st >= 0 && WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run(const char *const *args, const char *log, char **out)
{
    return run_sh(NULL, args, log, out);
}

/* Whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = t_read_file(a, &na), *y = t_read_file(b, &nb);
    const bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* Entries under dir whose name contains ".tmp" (a half-written file or folder). */
static int count_tmp(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.tmp*' | grep -c . ", dir);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f) {
        if (fscanf(f, "%d", &n) != 1)
            n = -1;
        pclose(f);
    }
    return n;
}

// ---- alloc.round -------------------------------------------------------------------------------

static void test_alloc_round(void)
{
    QC_TEST ("alloc.round 8 and 1 (documented range 1..1MiB): train, eval and profile run, and "
             "the weights equal the default rounding's") {
        char r8[400], r512[400], log[400], a[500], b[500], trace[400];
        tpath(r8, sizeof r8, "round8");
        tpath(r512, sizeof r512, "round512");
        tpath(log, sizeof log, "round.log");
        tpath(trace, sizeof trace, "round.trace.json");
        char *out = NULL;
        const char *const t8[] = {"train",     "--preset",
                                  "cpu-smoke", "--quiet",
                                  "--data",    shard,
                                  "--steps",   "2",
                                  "--out",     r8,
                                  "--set",     "alloc.round=8",
                                  "--set",     "device.budget=200MiB",
                                  NULL};
        int rc = run(t8, log, &out);
        T_EXPECT(rc == 0, "train alloc.round=8: exit %d\n%s", rc, out ? out : "");
        free(out);
        const char *const t512[] = {"train",  "--preset", "cpu-smoke", "--quiet",
                                    "--data", shard,      "--steps",   "2",
                                    "--out",  r512,       "--set",     "device.budget=200MiB",
                                    NULL};
        rc = run(t512, log, &out);
        T_EXPECT(rc == 0, "train default rounding: exit %d\n%s", rc, out ? out : "");
        free(out);
        snprintf(a, sizeof a, "%s/ckpt-000002/model.safetensors", r8);
        snprintf(b, sizeof b, "%s/ckpt-000002/model.safetensors", r512);
        T_EXPECT(same_file(a, b), "alloc.round=8 and 512 give different weights");
        const char *const e1[] = {"eval", "--preset", "cpu-smoke",     "--device",
                                  "emu",  "--data",   shard,           "--weights",
                                  r8,     "--set",    "alloc.round=1", NULL};
        rc = run(e1, log, &out);
        T_EXPECT(rc == 0, "eval --device emu alloc.round=1: exit %d\n%s", rc, out ? out : "");
        free(out);
        const char *const p1[] = {"profile",        "--preset", "cpu-smoke", "--data", shard,
                                  "--steps",        "1",        "--warmup",  "0",      "--set",
                                  "alloc.round=16", "--out",    trace,       NULL};
        rc = run(p1, log, &out);
        T_EXPECT(rc == 0, "profile alloc.round=16: exit %d\n%s", rc, out ? out : "");
        free(out);
    }
}

// ---- a file size limit -------------------------------------------------------------------------

static void test_file_size_limit(void)
{
    QC_TEST ("ulimit -f with SIGXFSZ at its default: a 'File too large' error naming the file, "
             "exit 1, nothing half-written") {
        static const struct {
            const char *limit; /* 512-byte blocks (sh's ulimit -f) */
            const char *names; /* in the message */
        } cases[] = {
            {"ulimit -f 4", "run.json"},       /* the run description (a few KB) */
            {"ulimit -f 200", "trace"},        /* step 1's allocation trace */
            {"ulimit -f 2000", "ckpt-000002"}, /* the checkpoint (about 2 MB) */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char r[400], log[400];
            tpath(r, sizeof r, "fsize");
            tpath(log, sizeof log, "fsize.log");
            const char *const args[] = {"train",  "--preset", "cpu-smoke", "--quiet",
                                        "--data", shard,      "--steps",   "2",
                                        "--out",  r,          NULL};
            char *out = NULL;
            const char *prefix = cases[i].limit;
            const int rc = run_sh(prefix, args, log, &out);
            T_EXPECT(rc == 1, "%s: exit %d (153: killed by SIGXFSZ)\n%s", prefix, rc,
                     out ? out : "");
            T_EXPECT(out && strstr(out, "File too large") && strstr(out, cases[i].names),
                     "%s: the error names the file and says 'File too large':\n%s", prefix,
                     out ? out : "");
            T_EXPECT(count_tmp(r) == 0, "%s: %d half-written entries", prefix, count_tmp(r));
            char ck[500];
            snprintf(ck, sizeof ck, "%s/ckpt-000002", r);
            T_EXPECT(!t_exists(ck), "%s: %s exists", prefix, ck);
            free(out);
        }
    }
}

static void test_gen_file_size_limit(void)
{
    QC_TEST ("gen under ulimit -f: 'File too large' naming the output, not its .tmp; nothing "
             "left") {
        char dir[400], g[500], log[400];
        tpath(dir, sizeof dir, "gen-fsize");
        tpath(log, sizeof log, "gen-fsize.log");
        T_EXPECT(mkdir(dir, 0755) == 0, "mkdir %s", dir);
        snprintf(g, sizeof g, "%s/big.qcshard", dir);
        const char *const args[] = {"gen",    "--scenes", "64",    "--profile", "mixed",
                                    "--seed", "1",        "--out", g,           NULL};
        char *out = NULL;
        const int rc = run_sh("ulimit -f 100", args, log, &out);
        char named[600];
        snprintf(named, sizeof named, "%s: write failed: File too large", g);
        T_EXPECT(rc == 1, "exit %d (153: killed by SIGXFSZ)\n%s", rc, out ? out : "");
        T_EXPECT(out && strstr(out, named), "the error starts with '%s':\n%s", named,
                 out ? out : "");
        T_EXPECT(count_tmp(dir) == 0 && !t_exists(g), "%d half-written files, output %s",
                 count_tmp(dir), t_exists(g) ? "exists" : "absent");
        free(out);
    }
}

// ---- a data file that does not exist -----------------------------------------------------------

static void test_missing_data(void)
{
    QC_TEST ("train / eval --data MISSING: exit 2 (bad input), naming the path") {
        char r[400], log[400], missing[400];
        tpath(r, sizeof r, "nodata-run");
        tpath(log, sizeof log, "nodata.log");
        tpath(missing, sizeof missing, "no-such.qcshard");
        const char *const train[] = {"train", "--preset", "cpu-smoke", "--quiet", "--data", shard,
                                     missing, "--steps",  "1",         "--out",   r,        NULL};
        const char *const eval[] = {"eval",   "--preset", "cpu-smoke", "--quiet",
                                    "--data", missing,    NULL};
        const char *const *cmds[] = {train, eval};
        for (int i = 0; i < 2; i++) {
            char *out = NULL;
            const int rc = run(cmds[i], log, &out);
            T_EXPECT(rc == 2 && out && strstr(out, missing) && strstr(out, "No such file"),
                     "%s: exit %d (2: bad input), the message names %s:\n%s", cmds[i][0], rc,
                     missing, out ? out : "");
            free(out);
        }
        T_EXPECT(!t_exists(r), "train left a run folder %s", r);
    }
}

// ---- byte sizes ---------------------------------------------------------------------------------

static void test_sizes(void)
{
    QC_TEST ("sizes: surrounding whitespace ignored, one space before the unit") {
        static const struct {
            const char *text;
            uint64_t bytes;
        } ok[] = {
            {"1GiB", 1ull << 30},  {" 1GiB", 1ull << 30},   {"1GiB ", 1ull << 30},
            {"1 GiB", 1ull << 30}, {" 1 GiB ", 1ull << 30}, {"\t512MiB\n", 512ull << 20},
            {" 4096", 4096},       {"4096 ", 4096},         {"1e9 ", 1000000000ull},
            {"0.5 MiB", 524288},
        };
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
            uint64_t v = 1;
            T_EXPECT(qc_parse_size(ok[i].text, &v) == QC_OK, "'%s': %s", ok[i].text,
                     qc_error_last());
            T_EXPECT_EQ_U64(v, ok[i].bytes, "'%s'", ok[i].text);
        }
        static const char *const bad[] = {"1  GiB",  "1\tGiB", "1 ",  "  ",
                                          "1 GiB x", "1 .GiB", "1 5", "- 1"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            uint64_t v = 7;
            const bool refused = qc_parse_size(bad[i], &v) == QC_ERR_INVALID;
            /* "1 " is "1" once trimmed */
            if (strcmp(bad[i], "1 ") == 0)
                T_EXPECT(!refused && v == 1, "'1 ' is 1");
            else
                T_EXPECT(refused && v == 7, "'%s' should be refused", bad[i]);
        }
        /* the same rule for --set (a config size) */
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_set(&c, "device.budget= 1GiB") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_U64(c.device_budget, 1ull << 30, "--set device.budget= 1GiB");
    }
}

// ---- report --step -----------------------------------------------------------------------------

static void test_report_step(void)
{
    QC_TEST ("report --step: 0 and negatives refused alike (exit 2, naming the value)") {
        char r[400], log[400];
        tpath(r, sizeof r, "rep");
        tpath(log, sizeof log, "rep.log");
        const char *const t[] = {"train",   "--preset", "cpu-smoke", "--quiet", "--data", shard,
                                 "--steps", "1",        "--out",     r,         NULL};
        char *out = NULL;
        int rc = run(t, log, &out);
        T_EXPECT(rc == 0, "train: exit %d\n%s", rc, out ? out : "");
        free(out);
        static const char *const steps[] = {"0", "-1", "-2"};
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            const char *const a[] = {"report", r, "--step", steps[i], NULL};
            rc = run(a, log, &out);
            char want[64];
            snprintf(want, sizeof want, "--step %s: steps count from 1", steps[i]);
            T_EXPECT(rc == 2 && out && strstr(out, want), "--step %s: exit %d\n%s", steps[i], rc,
                     out ? out : "");
            free(out);
        }
        const char *const a1[] = {"report", r, "--step", "1", NULL};
        rc = run(a1, log, &out);
        T_EXPECT(rc == 0, "--step 1: exit %d\n%s", rc, out ? out : "");
        free(out);
        const char *const a0[] = {"report", r, NULL};
        rc = run(a0, log, &out);
        T_EXPECT(rc == 0, "no --step: exit %d\n%s", rc, out ? out : "");
        free(out);
    }
}

// ---- messages
// ------------------------------------------------------------------------------------

static void test_messages(void)
{
    char log[400], empty[400], r[400];
    tpath(log, sizeof log, "msg.log");
    tpath(empty, sizeof empty, "empty");
    tpath(r, sizeof r, "msgrun");
    mkdir(empty, 0755);
    QC_TEST ("messages: --weights / --init-from on a folder without a checkpoint say so, naming "
             "what was looked for, not --resume") {
        const char *const e[] = {"eval", "--preset",  "cpu-smoke", "--data",
                                 shard,  "--weights", empty,       NULL};
        const char *const t[] = {"train", "--preset", "cpu-smoke", "--quiet",     "--data",
                                 shard,   "--steps",  "1",         "--init-from", empty,
                                 "--out", r,          NULL};
        const char *const *cmds[] = {e, t};
        for (int i = 0; i < 2; i++) {
            char *out = NULL;
            const int rc = run(cmds[i], log, &out);
            T_EXPECT(rc == 2, "%s: exit %d\n%s", cmds[i][0], rc, out ? out : "");
            T_EXPECT(out && strstr(out, "the folder holds no checkpoint: looked for") &&
                         strstr(out, "/model.safetensors") && strstr(out, "ckpt-<step>/") &&
                         !strstr(out, "--resume"),
                     "%s:\n%s", cmds[i][0], out ? out : "");
            free(out);
        }
    }
    QC_TEST ("messages: device.budget below the parameters gives the budget and what the fixed "
             "bytes need") {
        const char *const t[] = {"train", "--preset", "cpu-smoke", "--quiet", "--data",
                                 shard,   "--steps",  "1",         "--set",   "device.budget=1",
                                 "--out", r,          NULL};
        char *out = NULL;
        const int rc = run(t, log, &out);
        T_EXPECT(rc == 1, "exit %d\n%s", rc, out ? out : "");
        T_EXPECT(out && strstr(out, "(budget 1 B, allocated 0 B, reserved 0 B)") &&
                     strstr(out, "their gradients need 3.72 MiB") &&
                     strstr(out, "7.45 MiB with AdamW's two moments") &&
                     strstr(out, "hint: raise device.budget") && !strstr(out, "train.batch_size"),
                 "budget figures and the fixed bytes:\n%s", out ? out : "");
        free(out);
        /* room for the parameters and gradients, not for AdamW's moments */
        const char *const t5[] = {"train", "--preset", "cpu-smoke", "--quiet", "--data",
                                  shard,   "--steps",  "1",         "--set",   "device.budget=5MiB",
                                  "--out", r,          NULL};
        const int rc5 = run(t5, log, &out);
        T_EXPECT(rc5 == 1, "5MiB: exit %d\n%s", rc5, out ? out : "");
        T_EXPECT(out && strstr(out, "optimizer: allocation of") &&
                     strstr(out, "AdamW's two moments of 488201 parameters need 3.72 MiB") &&
                     strstr(out, "(budget 5.00 MiB, allocated 3.73 MiB") &&
                     strstr(out, "hint: raise device.budget") && !strstr(out, "train.batch_size"),
                 "5MiB: budget figures and the fixed bytes:\n%s", out ? out : "");
        free(out);
    }
    QC_TEST ("messages: an unusable offload.nvme_dir is named with its reason, never 'give the "
             "planner an NVMe tier'") {
        char notdir[500], missing[500];
        snprintf(notdir, sizeof notdir, "offload.nvme_dir=%s", shard); /* a file, not a folder */
        snprintf(missing, sizeof missing, "offload.nvme_dir=%s/no/such/folder", tmp_root);
        const char *const dirs[] = {notdir, missing};
        for (int i = 0; i < 2; i++) {
            t_rm_rf(r);
            const char *const t[] = {
                "train", "--preset", "cpu-smoke", "--quiet", "--data",
                shard,   "--steps",  "1",         "--set",   "device.budget=30MiB",
                "--set", dirs[i],    "--out",     r,         NULL};
            char *out = NULL;
            const int rc = run(t, log, &out);
            T_EXPECT(rc == 1, "%s: exit %d\n%s", dirs[i], rc, out ? out : "");
            T_EXPECT(out && strstr(out, "does not fit the device budget even alone") &&
                         strstr(out, "make offload.nvme_dir usable (") &&
                         !strstr(out, "give the planner an NVMe tier"),
                     "%s:\n%s", dirs[i], out ? out : "");
            free(out);
        }
    }
}

// ---- ranks of one node ------------------------------------------------------------------------

#ifdef QC_MPIEXEC
/* How often needle occurs in hay. */
static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay ? strstr(hay, needle) : NULL; p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* N of the first "host tier only (N MiB pinned)", or -1. */
static long host_tier_mib(const char *out)
{
    const char *p = out ? strstr(out, "host tier only (") : NULL;
    return p ? strtol(p + strlen("host tier only ("), NULL, 10) : -1;
}

/* [mpirun --oversubscribe -np np] qctrain train <tiny> --steps 1 under a budget (so the offload
 * tier and the planner's probe exist); the exit code and the output in *out. */
static int train_ranks(int np, const char *run_dir, const char *log, char **out)
{
    unlink(log);
    struct t_args a = {{0}, 0};
    char npbuf[16];
    snprintf(npbuf, sizeof npbuf, "%d", np);
    if (np > 1) {
        t_args_add(&a, QC_MPIEXEC);
        t_args_add(&a, "--oversubscribe");
        t_args_add(&a, "-np");
        t_args_add(&a, npbuf);
    }
    t_args_add(&a, qctrain);
    t_args_add(&a, "train");
    for (int i = 0; i < T_TINY_TRAIN_NARGS; i++)
        t_args_add(&a, t_tiny_train_args[i]);
    const char *const more[] = {"--steps", "1",     "--set", "device.budget=200MiB",
                                "--out",   run_dir, NULL};
    for (int i = 0; more[i]; i++)
        t_args_add(&a, more[i]);
    const int st = t_run(&a, log, NULL);
    *out = t_read_file(log, NULL);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_node_ranks(void)
{
    QC_TEST ("ranks of one node: the default host tier is divided among them, and only rank 0 "
             "prints its offload and plan info lines") {
        char r[400], log[400];
        tpath(r, sizeof r, "node1");
        tpath(log, sizeof log, "node.log");
        char *one = NULL, *two = NULL;
        int rc = train_ranks(1, r, log, &one);
        T_EXPECT(rc == 0, "one rank: exit %d\n%s", rc, one ? one : "");
        tpath(r, sizeof r, "node2");
        rc = train_ranks(2, r, log, &two);
        T_EXPECT(rc == 0, "two ranks: exit %d\n%s", rc, two ? two : "");
        /* half the free RAM for one rank; a quarter each for two (the free RAM moves a little
         * between the runs: other processes) */
        const long m1 = host_tier_mib(one), m2 = host_tier_mib(two);
        T_EXPECT(m1 > 0 && m2 > 0 && (double)m1 / (double)m2 > 1.6 && (double)m1 / (double)m2 < 2.5,
                 "host tier: %ld MiB alone, %ld MiB each of 2 ranks on one node", m1, m2);
        static const char *const lines[] = {"qc info: offload: rung:", "qc info: offload: probe:",
                                            "qc info: plan: measured copies"};
        for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
            T_EXPECT(count_of(one, lines[i]) == 1, "one rank prints '%s' once", lines[i]);
            T_EXPECT(count_of(two, lines[i]) == 1, "two ranks print '%s' %d times (rank 0 only)",
                     lines[i], count_of(two, lines[i]));
        }
        free(one);
        free(two);
    }
}
#endif

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-faults-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    snprintf(shard, sizeof shard, "%s/one.qcshard", tmp_root);
    const char *const gen[] = {"gen",    "--scenes", "1",     "--profile", "mixed",
                               "--seed", "9",        "--out", shard,       NULL};
    char log[400];
    snprintf(log, sizeof log, "%s/gen.log", tmp_root);
    char *out = NULL;
    if (run(gen, log, &out) != 0) {
        printf("qctrain gen failed:\n%s\n", out ? out : "");
        return 1;
    }
    free(out);
    test_alloc_round();
    test_file_size_limit();
    test_gen_file_size_limit();
    test_missing_data();
    test_sizes();
    test_report_step();
    test_messages();
#ifdef QC_MPIEXEC
    /* CPU ranks as root (a container): Open MPI refuses without these */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    /* AddressSanitizer builds: the ranks run without leak detection, as in tests/dist_testlib.h
     * (Open MPI's components leak at MPI_Finalize and are unloaded before LeakSanitizer looks;
     * the ranks' own code runs leak-checked in the single-process cases above) */
    const char *asan = getenv("ASAN_OPTIONS");
    char asan_buf[1024];
    snprintf(asan_buf, sizeof asan_buf, "%s%sdetect_leaks=0", asan ? asan : "",
             asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", asan_buf, 1);
    test_node_ranks();
#endif
    const int rc = qc_test_summary();
    if (rc == 0)
        t_rm_rf(tmp_root);
    return rc;
}
