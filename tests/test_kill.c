/*
 * test_kill.c — crash consistency of a training run (issue 17, docs/RELIABILITY.md): the qctrain
 * binary trains a cpu-smoke model (small settings, --save-every 1) and is killed with SIGKILL at
 * least KILLS times, at moments drawn from a fixed seed (QC_TEST_SEED), half of them aimed at a
 * checkpoint being written (QC_FAULT_CKPT_DELAY_MS widens each save stage to 100 ms); after each
 * kill it resumes (--resume RUN). Then it runs to step STEPS and requires:
 *   - the final checkpoint byte-identical to an uninterrupted run's (the same folder path: the
 *     saved configuration records it);
 *   - every metrics.jsonl line valid JSON, the steps 1..STEPS once each, in order;
 *   - no *.tmp, *.tmp.XXXXXX or *.old leftover, and at least MIN_IN_SAVE kills that left a
 *     checkpoint half-written (ckpt-<step>.tmp/) behind.
 * The kills follow a schedule of steps (during the start of the process, inside the save of
 * step s, or just after step s's metrics line, s rising with the kill's number), so the run
 * progresses between kills and cannot finish before they are done.
 * The second case does the same under a device budget in fp16 (issue 25): 2 scenes per group,
 * train.precision=fp16, device.budget=110MiB, where the planner recomputes (the uninterrupted
 * run must show recomputed or offloaded bytes) and the loss scale is part of the state: a
 * resumed process starts with an empty allocator cache and no raised margin, and the bits must
 * not care.
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc_testlib.h"
#include "qc_json.h"
#include "testutil.h"

#define STEPS       12 /* the run's length: > KILLS + 1, so the kills all land */
#define KILLS       10
#define MIN_IN_SAVE 3
#define STR_(x)     #x
#define STR(x)      STR_(x)

static char tmp_root[256];
static char run[512];
static const char qctrain[] = QC_BINARY_DIR "/qctrain";

/* The arguments a case adds to the small settings (NULL-terminated), on every command. */
static const char *const *extra_args;

/* qctrain train on the small settings; `resume`: --resume RUN, else --out RUN --overwrite. */
static void args(struct t_args *a, bool resume)
{
    static const char *const base[] = {"--steps", STR(STEPS), "--save-every", "1"};
    a->n = 0;
    t_args_add(a, qctrain);
    t_args_add(a, "train");
    for (int i = 0; i < T_TINY_TRAIN_NARGS; i++)
        t_args_add(a, t_tiny_train_args[i]);
    for (int i = 0; extra_args && extra_args[i]; i++)
        t_args_add(a, extra_args[i]);
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        t_args_add(a, base[i]);
    t_args_add(a, resume ? "--resume" : "--out");
    t_args_add(a, run);
    if (!resume) /* a run killed before its first checkpoint left files there */
        t_args_add(a, "--overwrite");
}

/* The highest step with a complete checkpoint (optim.safetensors is written last), or 0. */
static int64_t last_ckpt(void)
{
    int64_t best = 0;
    DIR *d = opendir(run);
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end = NULL;
        if (strncmp(de->d_name, "ckpt-", 5) != 0)
            continue;
        const long long s = strtoll(de->d_name + 5, &end, 10);
        if (!end || *end != '\0')
            continue;
        char p[800];
        snprintf(p, sizeof p, "%s/%s/optim.safetensors", run, de->d_name);
        if (s > best && t_exists(p))
            best = s;
    }
    closedir(d);
    return best;
}

/* Entries of the run folder (and its checkpoints) a crash may leave: ckpt-*.tmp/ folders
 * (*tmp_dirs) and all *.tmp, *.tmp.*, *.old names (the return value). */
static int leftovers(int *tmp_dirs)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd,
             "find '%s' \\( -name '*.tmp' -o -name '*.tmp.*' -o -name '*.old' \\) -printf '%%y "
             "%%f\\n'",
             run);
    FILE *f = popen(cmd, "r");
    int n = 0;
    *tmp_dirs = 0;
    char line[600];
    while (f && fgets(line, sizeof line, f)) {
        n++;
        if (line[0] == 'd' && strncmp(line + 2, "ckpt-", 5) == 0 && strstr(line, ".tmp\n"))
            (*tmp_dirs)++;
    }
    if (f)
        pclose(f);
    return n;
}

struct wait_for {
    int64_t step;   /* the checkpoint save of this step has begun (ckpt-<step>.tmp/ exists) */
    int metrics;    /* or: metrics.jsonl holds this many lines */
    bool want_save; /* which of the two */
};

static bool reached(void *user)
{
    const struct wait_for *w = user;
    char p[700];
    if (w->want_save) {
        snprintf(p, sizeof p, "%s/ckpt-%06" PRId64 ".tmp", run, w->step);
        return t_exists(p);
    }
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    return t_count_lines(p) >= w->metrics;
}

/* The uninterrupted run, then KILLS killed and resumed ones in the same folder; `budgeted`: the
 * uninterrupted run must have recomputed or offloaded something (the budget bites). */
static void kill_and_resume(bool budgeted)
{
    /* the uninterrupted run, in the same folder path */
    struct t_args a;
    args(&a, false);
    char sb[64];
    int st = t_run(&a, NULL, NULL);
    if (!t_exited(st, 0)) {
        T_FAIL_AT("uninterrupted run: %s", t_status_str(st, sb, sizeof sb));
        return;
    }
    static const char *const files[2] = {"model.safetensors", "optim.safetensors"};
    char *ref[2];
    size_t nref[2];
    for (int i = 0; i < 2; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/ckpt-%06d/%s", run, STEPS, files[i]);
        ref[i] = t_read_file(p, &nref[i]);
        T_EXPECT(ref[i] != NULL, "cannot read %s", p);
    }
    if (budgeted) { /* the budget made the planner move something */
        char p[700];
        snprintf(p, sizeof p, "%s/metrics.jsonl", run);
        char *text = t_read_file(p, NULL);
        static const char *const keys[] = {
            "\"recompute_bytes\":", "\"offload_host_bytes\":", "\"offload_nvme_bytes\":"};
        bool moved = false;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            for (const char *q = text; q && (q = strstr(q, keys[k])) != NULL; q++)
                moved |= strtoll(q + strlen(keys[k]), NULL, 10) > 0;
        T_EXPECT(moved,
                 "under the budget the uninterrupted run recomputed and offloaded nothing "
                 "(%s)",
                 p);
        free(text);
    }
    t_rm_rf(run);

    uint64_t rng = qc_test_seed();
    int kills = 0, in_save = 0, early_exits = 0;
    while (kills < KILLS && early_exits < 3) {
        const int64_t last = last_ckpt();
        if (last >= STEPS)
            break;
        args(&a, last > 0);
        const pid_t pid = t_spawn(&a, NULL, "QC_FAULT_CKPT_DELAY_MS=100", 300);
        /* three kinds of moment: during the start (loading, the resume's batch
         * skipping), inside the save of a step (its ckpt-<step>.tmp/ exists), or after a
         * step's metrics line (the save, or the next step). The step follows a schedule,
         * kill i at step 1 + i (STEPS - 2) / KILLS or later, so the run progresses between
         * kills yet cannot finish before they are done. */
        const uint64_t r = qc_test_rand(&rng);
        const int kind = (int)(r % 3);
        int64_t at_step = 1 + (int64_t)kills * (STEPS - 2) / KILLS;
        if (at_step < last + 1)
            at_step = last + 1;
        struct wait_for w = {.step = at_step, .metrics = (int)at_step, .want_save = kind == 1};
        bool ok = true;
        if (kind != 0)
            ok = t_poll(reached, &w, pid, 600000);
        t_sleep_ms(kind == 0 ? (long)((r >> 8) % 600) : (long)((r >> 8) % 250));
        kill(pid, SIGKILL);
        st = t_wait(pid);
        if (!WIFSIGNALED(st)) { /* ended by itself before the kill: not counted */
            T_EXPECT(ok && t_exited(st, 0), "run %d: %s", kills + 1,
                     t_status_str(st, sb, sizeof sb));
            early_exits++;
            continue;
        }
        kills++;
        int tmp_dirs = 0;
        leftovers(&tmp_dirs);
        in_save += tmp_dirs > 0;
        static const char *const kinds[3] = {"during the start of the run", "in the save of step",
                                             "after the log of step"};
        char at[32] = "";
        if (kind)
            snprintf(at, sizeof at, " %" PRId64, at_step);
        printf("  kill %d (%s%s): last checkpoint %" PRId64 " -> %" PRId64 "%s\n", kills,
               kinds[kind], at, last, last_ckpt(), tmp_dirs ? ", a checkpoint half-written" : "");
    }
    T_EXPECT(kills >= KILLS, "%d kills, %d expected", kills, KILLS);
    T_EXPECT(in_save >= MIN_IN_SAVE, "%d kills inside checkpoint writes, %d expected", in_save,
             MIN_IN_SAVE);

    /* resume to the end */
    args(&a, last_ckpt() > 0);
    st = t_run(&a, NULL, NULL);
    T_EXPECT(t_exited(st, 0), "final resume: %s", t_status_str(st, sb, sizeof sb));
    for (int i = 0; i < 2; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/ckpt-%06d/%s", run, STEPS, files[i]);
        size_t n = 0;
        char *got = t_read_file(p, &n);
        T_EXPECT(got && ref[i] && n == nref[i] && memcmp(got, ref[i], n) == 0,
                 "%s (%zu bytes) differs from the uninterrupted run's (%zu bytes)", p, n, nref[i]);
        free(got);
        free(ref[i]);
    }
    char p[700];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    char *text = t_read_file(p, NULL);
    int64_t want = 1;
    for (char *line = text, *nl; line && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) {
            T_FAIL_AT("metrics.jsonl: a last line without newline: %s", line);
            break;
        }
        T_EXPECT(qc_json_valid(line, (size_t)(nl - line)), "not JSON: %.*s", (int)(nl - line),
                 line);
        const int64_t s = strncmp(line, "{\"step\":", 8) == 0 ? strtoll(line + 8, NULL, 10) : -1;
        T_EXPECT(s == want, "metrics line of step %" PRId64 ", %" PRId64 " expected", s, want);
        want++;
    }
    T_EXPECT(want == STEPS + 1, "metrics.jsonl has %" PRId64 " step lines, %d expected", want - 1,
             STEPS);
    free(text);
    int tmp_dirs = 0;
    const int left = leftovers(&tmp_dirs);
    T_EXPECT(left == 0, "%d leftovers (*.tmp, *.tmp.*, *.old) in %s", left, run);
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-kill-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    snprintf(run, sizeof run, "%s/run", tmp_root);

    QC_TEST ("kill -9 at random moments (some inside checkpoint writes), resume: the final "
             "checkpoint equals the uninterrupted run's, metrics valid, no leftovers") {
        extra_args = NULL;
        kill_and_resume(false);
    }
    QC_TEST ("the same under device.budget in fp16 (2 scenes a group, the planner recomputing): "
             "the final checkpoint equals the uninterrupted run's") {
        static const char *const budget[] = {
            "--set", "train.batch_size=2",   "--set", "train.precision=fp16",
            "--set", "device.budget=110MiB", NULL};
        extra_args = budget;
        kill_and_resume(true);
        t_rm_rf(run);
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
