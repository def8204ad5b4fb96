/*
 * test_reliability.c — what docs/RELIABILITY.md promises, tried as a hostile user would (issue
 * 17), mostly through the built qctrain binary:
 *   - one writer per run folder: a second trainer exits at once naming the holder's PID;
 *   - a killed save's leftovers (ckpt-<step>.tmp/ with a writer's temporary file, *.tmp files,
 *     a ckpt-<step>.old/) never block a resume;
 *   - metrics.jsonl: a torn last record is dropped on resume, every line stays valid JSON;
 *   - signals: the first SIGINT / SIGTERM finishes the step, saves, exits 130 / 143; a second
 *     one ends the process at once and the last complete checkpoint stays;
 *   - non-finite numbers: train.nonfinite=stop exits naming the step and the loss term, keeping
 *     the last good checkpoint; skip leaves parameters and moments untouched and stops after
 *     train.max_skipped in a row; never a checkpoint of non-finite weights;
 *   - FIFOs and other non-regular files are refused (inspect, --data, --weights, --init-from,
 *     --resume) instead of blocking;
 *   - a full disk (a file size limit) fails the save with an error; the previous checkpoint stays;
 *   - after a resume, optim.safetensors records the run folder actually written;
 *   - out-of-memory hints and figures; bench offload's offload.direct and --dir.
 * The runs use cpu-smoke's model on 1-scene batches with small radii (a fraction of a second per
 * step).
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nonfinite_fixture.h"
#include "proc_testlib.h"
#include "qc_config.h"
#include "qc_json.h"
#include "qc_oom.h"
#include "qc_qcshard.h"
#include "qc_safetensors.h"
#include "qc_synth.h"
#include "qc_train.h"
#include "testutil.h"

static char tmp_root[256];
static const char qctrain[] = QC_BINARY_DIR "/qctrain";

// ---- helpers -----------------------------------------------------------------------------------

/* A fresh path under the temporary root. */
static void tpath(char *out, size_t n, const char *name)
{
    if ((size_t)snprintf(out, n, "%s/%s", tmp_root, name) >= n)
        T_FATAL("path too long: %s/%s", tmp_root, name);
    t_rm_rf(out);
}

/* qctrain train --preset cpu-smoke, the small settings, then `more` (NULL-terminated). */
static void train_args(struct t_args *a, const char *const *more)
{
    static const char *const small[] = {
        "--set", "train.batch_size=1",      "--set", "data.synthetic_scenes=8",
        "--set", "data.loader_threads=1",   "--set", "model.pl2pl_radius=30",
        "--set", "model.pl2a_radius=15",    "--set", "model.a2a_radius=15",
        "--set", "model.pl2m_radius=30",    "--set", "model.a2m_radius=30",
        "--set", "model.time_span=3",       "--set", "model.num_t2m_steps=6",
        "--set", "train.out_dir=runs/other"};
    a->n = 0;
    t_args_add(a, qctrain);
    t_args_add(a, "train");
    t_args_add(a, "--preset");
    t_args_add(a, "cpu-smoke");
    t_args_add(a, "--quiet");
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        t_args_add(a, small[i]);
    for (int i = 0; more && more[i]; i++)
        t_args_add(a, more[i]);
}

/* Runs qctrain train with `more`; the wait status. Output goes to log (may be NULL). */
static int train(const char *const *more, const char *log, const char *env)
{
    struct t_args a;
    train_args(&a, more);
    return t_run(&a, log, env);
}

/* Every line of RUN/metrics.jsonl is valid JSON; returns the step of the last one (-1 when
 * none) and counts the lines. */
static int64_t metrics_check(const char *run, int *nlines)
{
    char p[600];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    char *text = t_read_file(p, NULL);
    int64_t last = -1;
    *nlines = 0;
    for (char *line = text, *nl; line && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) {
            T_FAIL_AT("%s: last line has no newline: %s", p, line);
            break;
        }
        T_EXPECT(qc_json_valid(line, (size_t)(nl - line)), "%s: not JSON: %.*s", p,
                 (int)(nl - line), line);
        const char *s = strstr(line, "\"step\":");
        if (s && s < nl)
            last = strtoll(s + 7, NULL, 10);
        (*nlines)++;
    }
    free(text);
    return last;
}

/* No *.tmp, *.tmp.XXXXXX or *.old entry anywhere under dir (one level of checkpoints). */
static int count_leftovers(const char *dir)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd,
             "find '%s' \\( -name '*.tmp' -o -name '*.tmp.*' -o -name '*.old' \\) | grep -c . ",
             dir);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f) {
        if (fscanf(f, "%d", &n) != 1)
            n = -1;
        pclose(f);
    }
    return n;
}

static bool ckpt_exists(const char *run, int64_t step)
{
    char p[700];
    snprintf(p, sizeof p, "%s/ckpt-%06" PRId64 "/optim.safetensors", run, step);
    return t_exists(p);
}

struct file_cond {
    const char *path;
    int min_lines; /* 0: the file exists and is not empty */
};

static bool file_ready(void *user)
{
    const struct file_cond *c = user;
    if (c->min_lines > 0)
        return t_count_lines(c->path) >= c->min_lines;
    struct stat sb;
    return stat(c->path, &sb) == 0 && sb.st_size > 0;
}

// ---- one writer per run folder -----------------------------------------------------------------

static void test_lock(void)
{
    QC_TEST ("lock: a second trainer on the same run folder exits at once naming the holder") {
        char run[512], log[512], log2[512], lockp[600];
        tpath(run, sizeof run, "lock-run");
        tpath(log, sizeof log, "lock-a.log");
        tpath(log2, sizeof log2, "lock-b.log");
        snprintf(lockp, sizeof lockp, "%s/.lock", run);
        struct t_args a;
        const char *const more_a[] = {"--steps", "200", "--out", run, NULL};
        train_args(&a, more_a);
        const pid_t pa = t_spawn(&a, log, NULL, 300);
        struct file_cond c = {lockp, 1};
        T_EXPECT(t_poll(file_ready, &c, pa, 60000), "the first trainer never wrote %s", lockp);
        char want[64];
        snprintf(want, sizeof want, "PID %ld", (long)pa);
        /* a new run and a resume of the same folder */
        const char *const more_b[] = {"--steps", "2", "--out", run, NULL};
        const char *const more_c[] = {"--steps", "2", "--resume", run, NULL};
        for (int k = 0; k < 2; k++) {
            unlink(log2);
            const int stb = train(k ? more_c : more_b, log2, NULL);
            char sb[64];
            T_EXPECT(t_exited(stb, 2), "second trainer (%s): %s", k ? "--resume" : "--out",
                     t_status_str(stb, sb, sizeof sb));
            char *err = t_read_file(log2, NULL);
            T_EXPECT_STR_CONTAINS(err, "in use by another trainer");
            T_EXPECT_STR_CONTAINS(err, want);
            T_EXPECT_STR_CONTAINS(err, "hint:");
            free(err);
        }
        kill(pa, SIGTERM);
        const int sta = t_wait(pa);
        char sb[64];
        T_EXPECT(t_exited(sta, 143), "first trainer after SIGTERM: %s",
                 t_status_str(sta, sb, sizeof sb));
        /* the first one's run is whole: its log and checkpoint agree */
        int nl = 0;
        const int64_t last = metrics_check(run, &nl);
        T_EXPECT(last >= 1 && ckpt_exists(run, last), "last step %" PRId64 ", checkpoint %s", last,
                 last >= 1 && ckpt_exists(run, last) ? "present" : "missing");
        /* the lock is free again */
        const char *const more_d[] = {"--steps", "1", "--out", run, "--overwrite", NULL};
        const int std = train(more_d, log2, NULL);
        T_EXPECT(t_exited(std, 0), "a trainer after the first ended: %s",
                 t_status_str(std, sb, sizeof sb));
    }

    QC_TEST ("lock: in one process too (qc_run_lock_acquire), released on destroy") {
        char run[512];
        tpath(run, sizeof run, "lock-inproc");
        T_EXPECT(qc_train_mkdir(run) == QC_OK, "%s", qc_error_last());
        struct qc_run_lock *l1 = NULL, *l2 = NULL;
        T_EXPECT(qc_run_lock_acquire(run, &l1) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_run_lock_acquire(run, &l2) == QC_ERR_INVALID, "second lock taken");
        char want[64];
        snprintf(want, sizeof want, "PID %ld", (long)getpid());
        T_EXPECT_STR_CONTAINS(qc_error_last(), want);
        qc_run_lock_release(l1);
        T_EXPECT(qc_run_lock_acquire(run, &l2) == QC_OK, "after release: %s", qc_error_last());
        qc_run_lock_release(l2);
    }
}

// ---- leftovers of a killed save -----------------------------------------------------------------

static void touch(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        T_FATAL("cannot create %s", path);
    fputs("partial", f);
    fclose(f);
}

static void test_leftovers(void)
{
    QC_TEST ("leftovers: a killed save's ckpt-N.tmp/ (with a writer's temp file) never blocks "
             "that step's save") {
        char run[512], p[700];
        tpath(run, sizeof run, "stale");
        const char *const m3[] = {"--steps", "3", "--out", run, NULL};
        int st = train(m3, NULL, NULL);
        char sb[64];
        T_EXPECT(t_exited(st, 0), "train 3: %s", t_status_str(st, sb, sizeof sb));
        /* the reproduction, and the other writers' temporary files */
        snprintf(p, sizeof p, "%s/ckpt-000004.tmp", run);
        T_EXPECT(mkdir(p, 0777) == 0, "mkdir %s", p);
        snprintf(p, sizeof p, "%s/ckpt-000004.tmp/model.safetensors.tmp.AbC123", run);
        touch(p);
        snprintf(p, sizeof p, "%s/metrics.jsonl.tmp", run);
        touch(p);
        snprintf(p, sizeof p, "%s/memory.json.tmp", run);
        touch(p);
        T_EXPECT(count_leftovers(run) == 4, "%d leftovers planted", count_leftovers(run));
        const char *const r4[] = {"--steps", "4", "--resume", run, NULL};
        st = train(r4, NULL, NULL);
        T_EXPECT(t_exited(st, 0), "resume to 4: %s", t_status_str(st, sb, sizeof sb));
        T_EXPECT(ckpt_exists(run, 4), "ckpt-000004 written");
        T_EXPECT(count_leftovers(run) == 0, "%d leftovers after the resume", count_leftovers(run));
        /* the save itself also clears a leftover folder of its own step (no lock involved) */
        snprintf(p, sizeof p, "%s/ckpt-000005.tmp", run);
        T_EXPECT(mkdir(p, 0777) == 0, "mkdir %s", p);
        snprintf(p, sizeof p, "%s/ckpt-000005.tmp/optim.safetensors.tmp.XyZ789", run);
        touch(p);
        struct qc_config cfg;
        qc_config_defaults(&cfg);
        T_EXPECT(qc_config_apply_preset(&cfg, "cpu-smoke") == QC_OK, "%s", qc_error_last());
        struct qc_qcnet_config mc;
        qc_train_model_config(&cfg, &mc);
        struct qc_qcnet *m = NULL;
        T_EXPECT(qc_qcnet_create(&mc, &m) == QC_OK, "%s", qc_error_last());
        const int64_t *off = NULL;
        const uint8_t *dec = NULL;
        int64_t nt = 0;
        qc_qcnet_param_groups(m, &off, &dec, &nt);
        struct qc_optim_params op;
        qc_optim_params_default(&op);
        struct qc_optim *o = NULL;
        T_EXPECT(qc_optim_create(NULL, qc_qcnet_num_params(m), off, dec, nt, &op, &o) == QC_OK,
                 "%s", qc_error_last());
        const struct qc_train_state s = {.step = 5};
        T_EXPECT(qc_checkpoint_save(run, m, o, &s, &cfg, NULL, 0) == QC_OK, "%s", qc_error_last());
        T_EXPECT(ckpt_exists(run, 5), "ckpt-000005 written over a leftover");
        T_EXPECT(count_leftovers(run) == 0, "%d leftovers", count_leftovers(run));
        qc_optim_destroy(o);
        qc_qcnet_destroy(m);
    }

    QC_TEST ("full disk: a checkpoint that cannot be written is an error; the previous one "
             "stays and the run resumes from it") {
        char run[512], log[512];
        tpath(run, sizeof run, "full");
        tpath(log, sizeof log, "full.log");
        const char *const m1[] = {"--steps", "1", "--out", run, NULL};
        int st = train(m1, NULL, NULL);
        char sb[64];
        T_EXPECT(t_exited(st, 0), "train 1: %s", t_status_str(st, sb, sizeof sb));
        /* a file size limit of ~1 MB (writes fail with EFBIG, as with ENOSPC): SIGXFSZ
         * ignored, so the write returns the error */
        struct t_args a;
        const char *const r2[] = {"--steps", "2", "--resume", run, NULL};
        train_args(&a, r2);
        struct t_args sh = {{0}, 0};
        t_args_add(&sh, "/bin/sh");
        t_args_add(&sh, "-c");
        t_args_add(&sh, "trap '' XFSZ; ulimit -f 2000; exec \"$0\" \"$@\"");
        for (int i = 0; i < a.n; i++)
            t_args_add(&sh, a.v[i]);
        st = t_run(&sh, log, NULL);
        T_EXPECT(t_exited(st, 1), "resume under a size limit: %s", t_status_str(st, sb, sizeof sb));
        char *err = t_read_file(log, NULL);
        T_EXPECT_STR_CONTAINS(err, "ckpt-000002 not written");
        T_EXPECT_STR_CONTAINS(err, "File too large");
        free(err);
        T_EXPECT(ckpt_exists(run, 1) && !ckpt_exists(run, 2), "ckpt-000001 only");
        T_EXPECT(count_leftovers(run) == 0, "%d leftovers", count_leftovers(run));
        st = train(r2, NULL, NULL);
        T_EXPECT(t_exited(st, 0), "resume with room: %s", t_status_str(st, sb, sizeof sb));
        int nl = 0;
        T_EXPECT(metrics_check(run, &nl) == 2 && nl == 2 && ckpt_exists(run, 2),
                 "resumed: %d lines", nl);
    }

    QC_TEST ("leftovers: a ckpt-N.old/ whose replacement never arrived is put back") {
        char run[512], p[700], q[700];
        tpath(run, sizeof run, "old");
        const char *const m2[] = {"--steps", "2", "--save-every", "1", "--out", run, NULL};
        int st = train(m2, NULL, NULL);
        char sb[64];
        T_EXPECT(t_exited(st, 0), "train 2: %s", t_status_str(st, sb, sizeof sb));
        /* killed between moving ckpt-2 aside and renaming its replacement into place */
        snprintf(p, sizeof p, "%s/ckpt-000002", run);
        snprintf(q, sizeof q, "%s/ckpt-000002.old", run);
        T_EXPECT(rename(p, q) == 0, "rename");
        const char *const r3[] = {"--steps", "3", "--resume", run, NULL};
        st = train(r3, NULL, NULL);
        T_EXPECT(t_exited(st, 0), "resume: %s", t_status_str(st, sb, sizeof sb));
        int nl = 0;
        T_EXPECT(metrics_check(run, &nl) == 3 && nl == 3, "resumed from step 2: %d lines", nl);
        T_EXPECT(ckpt_exists(run, 2) && ckpt_exists(run, 3), "checkpoints 2 and 3");
        T_EXPECT(count_leftovers(run) == 0, "%d leftovers", count_leftovers(run));
    }
}

// ---- metrics.jsonl ------------------------------------------------------------------------------

static void append_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "a");
    if (!f)
        T_FATAL("cannot append to %s", path);
    fputs(text, f);
    fclose(f);
}

static void test_metrics_torn(void)
{
    QC_TEST ("metrics: resume drops a torn last record; every line valid JSON, steps once") {
        static const char *const tails[] = {"{\"st", "{\"step\":3", "{\"step\":3,\"loss\":1.5}",
                                            "{\"step\":2,\"loss\":nan}\n"};
        for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) {
            char dir[512], p[700];
            tpath(dir, sizeof dir, "torn");
            T_EXPECT(qc_train_mkdir(dir) == QC_OK, "%s", qc_error_last());
            struct qc_metrics_log *log = NULL;
            T_EXPECT(qc_metrics_open(dir, -1, &log) == QC_OK, "%s", qc_error_last());
            if (!log)
                continue;
            for (int64_t s = 1; s <= 3; s++) {
                const struct qc_step_metrics m = {.step = s, .loss = 2.0 + (double)s, .lr = 1e-3};
                T_EXPECT(qc_metrics_write_step(log, &m) == QC_OK, "%s", qc_error_last());
            }
            qc_metrics_close(log);
            snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
            append_text(p, tails[k]); /* a crash cut the next record */
            T_EXPECT(qc_metrics_open(dir, 3, &log) == QC_OK, "%s", qc_error_last());
            const struct qc_step_metrics m4 = {.step = 4, .loss = (double)NAN, .lr = 1e-3};
            T_EXPECT(qc_metrics_write_step(log, &m4) == QC_OK, "%s", qc_error_last());
            qc_metrics_close(log);
            int nl = 0;
            const int64_t last = metrics_check(dir, &nl);
            T_EXPECT(nl == 4 && last == 4, "tail \"%s\": %d lines, last step %" PRId64, tails[k],
                     nl, last);
            char *text = t_read_file(p, NULL);
            T_EXPECT_STR_CONTAINS(text, "\"step\":4,\"epoch\":0,\"samples\":0,\"loss\":null");
            free(text);
        }
    }
}

// ---- signals ------------------------------------------------------------------------------------

static void test_signals(void)
{
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int k = 0; k < 2; k++) {
        char name[128];
        snprintf(name, sizeof name,
                 "signals: the first %s finishes the step, saves, flushes metrics, exits %d",
                 k ? "SIGTERM" : "SIGINT", 128 + sigs[k]);
        QC_TEST (name) {
            char run[512], log[512], mp[600];
            tpath(run, sizeof run, k ? "sigterm" : "sigint");
            tpath(log, sizeof log, k ? "sigterm.log" : "sigint.log");
            snprintf(mp, sizeof mp, "%s/metrics.jsonl", run);
            struct t_args a;
            const char *const more[] = {"--steps", "200", "--out", run, NULL};
            train_args(&a, more);
            const pid_t pid = t_spawn(&a, log, NULL, 300);
            struct file_cond c = {mp, 2};
            T_EXPECT(t_poll(file_ready, &c, pid, 60000), "no step logged");
            kill(pid, sigs[k]);
            const int st = t_wait(pid);
            char sb[64];
            T_EXPECT(t_exited(st, 128 + sigs[k]), "%s", t_status_str(st, sb, sizeof sb));
            int nl = 0;
            const int64_t last = metrics_check(run, &nl);
            T_EXPECT(last >= 2 && last < 200 && nl == last, "last step %" PRId64 ", %d lines", last,
                     nl);
            T_EXPECT(ckpt_exists(run, last), "checkpoint of the last step %" PRId64, last);
            snprintf(mp, sizeof mp, "%s/memory.json", run);
            T_EXPECT(t_exists(mp), "memory.json written");
            char *err = t_read_file(log, NULL);
            T_EXPECT_STR_CONTAINS(err, k ? "SIGTERM" : "SIGINT");
            free(err);
            T_EXPECT(count_leftovers(run) == 0, "%d leftovers", count_leftovers(run));
            /* it resumes from there */
            char steps[32];
            snprintf(steps, sizeof steps, "%" PRId64, last + 1);
            const char *const r[] = {"--steps", steps, "--resume", run, NULL};
            const int st2 = train(r, NULL, NULL);
            T_EXPECT(t_exited(st2, 0), "resume: %s", t_status_str(st2, sb, sizeof sb));
            T_EXPECT(metrics_check(run, &nl) == last + 1 && nl == last + 1, "resumed log");
        }
    }

    QC_TEST ("signals: a second SIGINT during the save ends the process at once; the last "
             "complete checkpoint stays") {
        char run[512], log[512], tmpd[600];
        tpath(run, sizeof run, "sig2");
        tpath(log, sizeof log, "sig2.log");
        snprintf(tmpd, sizeof tmpd, "%s/ckpt-000002.tmp", run);
        struct t_args a;
        const char *const more[] = {"--steps", "200", "--save-every", "1", "--out", run, NULL};
        train_args(&a, more);
        /* each save stage sleeps 1.5 s: the second save is still going when both signals land */
        const pid_t pid = t_spawn(&a, log, "QC_FAULT_CKPT_DELAY_MS=1500", 300);
        struct file_cond c = {tmpd, 0};
        T_EXPECT(t_poll(file_ready, &c, pid, 60000), "the save of step 2 never started");
        kill(pid, SIGINT);
        t_sleep_ms(200);
        kill(pid, SIGINT);
        const int st = t_wait(pid);
        char sb[64];
        T_EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT,
                 "expected death by SIGINT (not a graceful exit): %s",
                 t_status_str(st, sb, sizeof sb));
        T_EXPECT(ckpt_exists(run, 1), "ckpt-000001 intact");
        T_EXPECT(!ckpt_exists(run, 2), "no ckpt-000002 under its final name");
        const char *const r[] = {"--steps", "2", "--resume", run, NULL};
        const int st2 = train(r, NULL, NULL);
        T_EXPECT(t_exited(st2, 0), "resume: %s", t_status_str(st2, sb, sizeof sb));
        int nl = 0;
        T_EXPECT(metrics_check(run, &nl) == 2 && nl == 2, "resumed log: %d lines", nl);
        T_EXPECT(ckpt_exists(run, 2) && count_leftovers(run) == 0, "ckpt-000002, no leftovers");
    }
}

// ---- non-finite numbers -------------------------------------------------------------------------

/* 3 valid scenes, scene 1's focal agent overflowing (nonfinite_fixture.h): that batch's loss
 * is not finite. */
static bool scene_1(int i)
{
    return i == 1;
}

static void nonfinite_data(const char *path)
{
    t_write_nonfinite_qcshard(path, 11, 3, scene_1);
}

static void nonfinite_config(struct qc_config *cfg, bool skip)
{
    qc_config_defaults(cfg);
    if (qc_config_apply_preset(cfg, "cpu-smoke") != QC_OK)
        T_FATAL("%s", qc_error_last());
    cfg->batch_size = 1;
    cfg->shuffle = false;
    cfg->loader_threads = 1;
    cfg->steps = 3;
    cfg->save_every = 1;
    cfg->nonfinite = skip ? QC_NONFINITE_SKIP : QC_NONFINITE_STOP;
    cfg->max_skipped = 2;
    cfg->alloc_trace = false;
}

static void test_nonfinite(void)
{
    char data[512];
    tpath(data, sizeof data, "nonfinite.qcshard");
    nonfinite_data(data);
    const char *files[1] = {data};

    QC_TEST ("nonfinite=stop: exits at the step naming the loss terms; the last good "
             "checkpoint stays") {
        char run[512];
        tpath(run, sizeof run, "nf-stop");
        struct qc_config cfg;
        nonfinite_config(&cfg, false);
        const struct qc_train_opts to = {
            .cfg = &cfg, .data = files, .ndata = 1, .out_dir = run, .quiet = true};
        struct qc_trainer *t = NULL;
        enum qc_status st = qc_trainer_create(&to, &t);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        if (st == QC_OK)
            st = qc_trainer_run(t);
        qc_trainer_destroy(t);
        T_EXPECT(st == QC_ERR_INVALID, "run: %s", qc_status_str(st));
        const char *e = qc_error_last();
        T_EXPECT_STR_CONTAINS(e, "step 2:");
        T_EXPECT_STR_CONTAINS(e, "reg_loss_propose");
        T_EXPECT_STR_CONTAINS(e, "ckpt-000001");
        T_EXPECT_STR_CONTAINS(e, "train.nonfinite=skip");
        T_EXPECT(ckpt_exists(run, 1) && !ckpt_exists(run, 2), "checkpoints: 1 only");
        int nl = 0;
        T_EXPECT(metrics_check(run, &nl) == 1 && nl == 1, "log: %d lines", nl);
    }

    QC_TEST ("nonfinite=skip: parameters and moments untouched, counted, the run goes on") {
        char run[512];
        tpath(run, sizeof run, "nf-skip");
        struct qc_config cfg;
        nonfinite_config(&cfg, true);
        const struct qc_train_opts to = {
            .cfg = &cfg, .data = files, .ndata = 1, .out_dir = run, .quiet = true};
        struct qc_trainer *t = NULL;
        enum qc_status st = qc_trainer_create(&to, &t);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        if (st != QC_OK) {
            qc_trainer_destroy(t);
            continue;
        }
        const int64_t n = qc_qcnet_num_params(qc_trainer_model(t));
        float *p1 = malloc((size_t)n * 3 * sizeof(float));
        struct qc_step_metrics m[3];
        for (int s = 0; s < 3 && st == QC_OK; s++) {
            st = qc_trainer_step(t, &m[s]);
            if (s == 0) {
                memcpy(p1, qc_qcnet_params(qc_trainer_model(t)), (size_t)n * sizeof(float));
                memcpy(p1 + n, qc_optim_exp_avg(qc_trainer_optim(t)), (size_t)n * sizeof(float));
                memcpy(p1 + 2 * n, qc_optim_exp_avg_sq(qc_trainer_optim(t)),
                       (size_t)n * sizeof(float));
            }
            if (s == 1) {
                T_EXPECT(m[1].skipped && !isfinite(m[1].loss), "step 2 skipped, loss %g",
                         m[1].loss);
                T_EXPECT(memcmp(p1, qc_qcnet_params(qc_trainer_model(t)),
                                (size_t)n * sizeof(float)) == 0,
                         "parameters changed by a skipped step");
                T_EXPECT(memcmp(p1 + n, qc_optim_exp_avg(qc_trainer_optim(t)),
                                (size_t)n * sizeof(float)) == 0 &&
                             memcmp(p1 + 2 * n, qc_optim_exp_avg_sq(qc_trainer_optim(t)),
                                    (size_t)n * sizeof(float)) == 0,
                         "moments changed by a skipped step");
                T_EXPECT_EQ_I64(qc_optim_steps(qc_trainer_optim(t)), 1, "AdamW steps");
            }
        }
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        T_EXPECT(!m[0].skipped && !m[2].skipped && isfinite(m[2].loss), "steps 1 and 3 ran");
        T_EXPECT_EQ_I64(qc_optim_steps(qc_trainer_optim(t)), 2, "AdamW steps after step 3");
        T_EXPECT_EQ_I64(qc_trainer_state(t)->step, 3, "steps");
        free(p1);
        qc_trainer_destroy(t);
        char p[700];
        snprintf(p, sizeof p, "%s/metrics.jsonl", run);
        char *text = t_read_file(p, NULL);
        T_EXPECT_STR_CONTAINS(text, "\"skipped\":true");
        int nl = 0;
        metrics_check(run, &nl);
        T_EXPECT(nl == 3, "%d lines", nl);
        free(text);
    }

    QC_TEST ("nonfinite: NaN initial weights stop at step 1 (stop) or after train.max_skipped "
             "(skip); never a NaN checkpoint") {
        char run[512], w[700];
        tpath(run, sizeof run, "nf-weights");
        struct qc_config cfg;
        nonfinite_config(&cfg, false);
        cfg.steps = 1;
        /* weights: a 1-step run's, one element made NaN */
        const struct qc_train_opts to0 = {.cfg = &cfg, .out_dir = run, .quiet = true};
        struct qc_trainer *t = NULL;
        enum qc_status st = qc_trainer_create(&to0, &t);
        if (st == QC_OK)
            st = qc_trainer_run(t);
        if (st == QC_OK) {
            qc_qcnet_params(qc_trainer_model(t))[123] = (float)NAN;
            snprintf(w, sizeof w, "%s/nan.safetensors", tmp_root);
            st = qc_qcnet_save(qc_trainer_model(t), w);
        }
        qc_trainer_destroy(t);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        for (int skip = 0; skip < 2 && st == QC_OK; skip++) {
            char run2[512];
            tpath(run2, sizeof run2, skip ? "nf-w-skip" : "nf-w-stop");
            nonfinite_config(&cfg, skip != 0);
            cfg.steps = 5;
            cfg.save_every = 0; /* skip: the run reaches train.max_skipped */
            const struct qc_train_opts to = {
                .cfg = &cfg, .init_from = w, .out_dir = run2, .quiet = true};
            t = NULL;
            enum qc_status s2 = qc_trainer_create(&to, &t);
            T_EXPECT(s2 == QC_OK, "%s", qc_error_last());
            if (s2 == QC_OK)
                s2 = qc_trainer_run(t);
            qc_trainer_destroy(t);
            T_EXPECT(s2 == QC_ERR_INVALID, "%s: %s", skip ? "skip" : "stop", qc_status_str(s2));
            T_EXPECT_STR_CONTAINS(qc_error_last(), skip ? "2 steps in a row" : "step 1:");
            T_EXPECT(count_leftovers(run2) == 0 && !ckpt_exists(run2, 1) && !ckpt_exists(run2, 2),
                     "no checkpoint of NaN weights");
        }
        /* an explicit save of them is refused too */
        char run3[512];
        tpath(run3, sizeof run3, "nf-w-save");
        nonfinite_config(&cfg, true);
        const struct qc_train_opts to3 = {
            .cfg = &cfg, .init_from = w, .out_dir = run3, .quiet = true};
        t = NULL;
        T_EXPECT(qc_trainer_create(&to3, &t) == QC_OK, "%s", qc_error_last());
        if (t) {
            T_EXPECT(qc_trainer_save(t, NULL, 0) == QC_ERR_INVALID, "NaN weights saved");
            T_EXPECT_STR_CONTAINS(qc_error_last(), "parameter element 123 is not finite");
            T_EXPECT(!ckpt_exists(run3, 0), "no ckpt-000000");
        }
        qc_trainer_destroy(t);
    }
}

// ---- non-regular files --------------------------------------------------------------------------

static void test_fifo(void)
{
    QC_TEST ("fifo: inspect, --data, --weights, --init-from and --resume refuse a FIFO") {
        char fifo[512], log[512], run[512];
        tpath(fifo, sizeof fifo, "a.fifo");
        tpath(log, sizeof log, "fifo.log");
        tpath(run, sizeof run, "fifo-run");
        T_EXPECT(mkfifo(fifo, 0644) == 0, "mkfifo");
        const char *const cmds[][8] = {
            {"inspect", fifo, NULL},
            {"inspect", "--json", fifo, NULL},
            {"train", "--steps", "1", "--out", run, "--data", fifo, NULL},
            {"train", "--steps", "1", "--out", run, "--init-from", fifo, NULL},
            {"train", "--steps", "1", "--resume", fifo, NULL},
            {"eval", "--weights", fifo, NULL},
            {"eval", "--data", fifo, NULL},
        };
        for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
            struct t_args a = {{0}, 0};
            t_args_add(&a, qctrain);
            t_args_add(&a, "--preset");
            t_args_add(&a, "cpu-smoke");
            for (int j = 0; cmds[i][j]; j++)
                t_args_add(&a, cmds[i][j]);
            unlink(log);
            /* a blocking open would hang: the 20 s watchdog turns that into SIGALRM */
            const pid_t pid = t_spawn(&a, log, NULL, 20);
            const int st = t_wait(pid);
            char sb[64];
            T_EXPECT(t_exited(st, 2), "%s %s: %s", cmds[i][0], cmds[i][1],
                     t_status_str(st, sb, sizeof sb));
            char *err = t_read_file(log, NULL);
            T_EXPECT(err && strstr(err, fifo) && strstr(err, "FIFO"),
                     "%s %s: message names the file and what it is: %s", cmds[i][0], cmds[i][1],
                     err ? err : "(none)");
            free(err);
        }
        unlink(fifo);
    }
}

// ---- out-of-memory messages and the offload bench

static void test_oom_and_bench(void)
{
    QC_TEST ("oom: one hint function: the batch, the attention, what the planner can do; the "
             "short message carries the budget figures") {
        char h[512];
        struct qc_oom_facts f = {.attention = QC_OOM_ATTENTION_FUSED};
        /* no planner in the process (eval, benches): the batch and the budget */
        qc_oom_hint(&f, h, sizeof h);
        T_EXPECT_STR_CONTAINS(h, "hint: lower train.batch_size");
        T_EXPECT_STR_CONTAINS(h, "raise device.budget");
        T_EXPECT(!strstr(h, "planner") && !strstr(h, "--attention fused"), "%s", h);
        /* plan.policy=auto without a budget: set one, the planner then fits the step */
        f.planner = QC_OOM_PLANNER_NO_BUDGET;
        f.attention = QC_OOM_ATTENTION_UNFUSED;
        qc_oom_hint(&f, h, sizeof h);
        T_EXPECT_STR_CONTAINS(h, "set device.budget");
        T_EXPECT_STR_CONTAINS(h, "plan.policy=auto");
        T_EXPECT_STR_CONTAINS(h, "--attention fused");
        /* a forced policy: let the planner choose */
        f.planner = QC_OOM_PLANNER_FORCED;
        qc_oom_hint(&f, h, sizeof h);
        T_EXPECT_STR_CONTAINS(h, "plan.policy=auto");
        T_EXPECT_STR_CONTAINS(h, "raise device.budget");
        /* the planner plans already: more budget, an NVMe tier when it has none */
        f.planner = QC_OOM_PLANNER_AUTO;
        qc_oom_hint(&f, h, sizeof h);
        T_EXPECT_STR_CONTAINS(h, "offload.nvme_dir");
        T_EXPECT(!strstr(h, "plan.policy"), "%s", h);
        f.nvme_tier = true;
        qc_oom_hint(&f, h, sizeof h);
        T_EXPECT(!strstr(h, "offload.nvme_dir"), "an NVMe tier exists: %s", h);
        /* one scene alone: no smaller batch, --skip-oversized */
        f.one_scene = true;
        qc_oom_hint(&f, h, sizeof h);
        T_EXPECT(!strstr(h, "batch_size"), "one scene: %s", h);
        T_EXPECT_STR_CONTAINS(h, "--skip-oversized");
        /* the short message: the allocator's figures, then the process's planner */
        qc_oom_set_planner(QC_OOM_PLANNER_FORCED, false);
        const struct qc_oom_facts rec = {.bytes_requested = 4096,
                                         .bytes_budget = 120u << 20,
                                         .bytes_allocated = 100u << 20,
                                         .bytes_reserved = 110u << 20};
        qc_oom_record(&rec);
        T_EXPECT(qc_oom_errorf(QC_OOM_ATTENTION_FUSED, "block: %d bytes", 4096) == QC_ERR_NOMEM,
                 "NOMEM");
        const char *e = qc_error_last();
        T_EXPECT_STR_CONTAINS(e, "block: 4096 bytes (budget 120 MiB, allocated 100 MiB, reserved "
                                 "110 MiB)\nhint: lower train.batch_size");
        T_EXPECT_STR_CONTAINS(e, "plan.policy=auto");
        qc_oom_set_planner(QC_OOM_PLANNER_NONE, false);
    }

    QC_TEST ("oom: a scene that does not fit the budget alone names itself, the budget it needs "
             "and a hint through the one function; the planner fits the fused step") {
        for (int fused = 0; fused < 2; fused++) {
            char run[512];
            tpath(run, sizeof run, fused ? "oom-fused" : "oom-unfused");
            struct qc_config cfg;
            qc_config_defaults(&cfg);
            T_EXPECT(qc_config_apply_preset(&cfg, "cpu-smoke") == QC_OK, "%s", qc_error_last());
            cfg.attention = fused ? QC_ATTENTION_FUSED : QC_ATTENTION_UNFUSED;
            cfg.device_budget = 120u << 20; /* far below one step of a typical scene kept whole */
            cfg.loader_threads = 1;
            cfg.alloc_trace = false;
            const struct qc_train_opts to = {.cfg = &cfg, .out_dir = run, .quiet = true};
            struct qc_trainer *t = NULL;
            enum qc_status st = qc_trainer_create(&to, &t);
            struct qc_step_metrics m = {0};
            if (st == QC_OK)
                st = qc_trainer_step(t, &m);
            qc_trainer_destroy(t);
            const char *e = qc_error_last();
            printf("  %s: %s\n", fused ? "fused" : "unfused", st == QC_OK ? "fits" : e);
            if (fused) { /* split, offloaded or recomputed, within the budget */
                T_EXPECT(st == QC_OK, "fused: %s", e);
                T_EXPECT(m.peak_device_bytes <= cfg.device_budget, "peak %" PRIu64,
                         m.peak_device_bytes);
                continue;
            }
            T_EXPECT(st == QC_ERR_NOMEM, "unfused: %s", qc_status_str(st));
            T_EXPECT_STR_CONTAINS(e, "does not fit the device budget even alone");
            T_EXPECT_STR_CONTAINS(e, "the budget is 120 MiB");
            T_EXPECT_STR_CONTAINS(e, "hint: use --attention fused");
            T_EXPECT_STR_CONTAINS(e, "offload.nvme_dir");
            T_EXPECT_STR_CONTAINS(e, "--skip-oversized");
            T_EXPECT(!strstr(e, "batch_size"), "one scene, yet: %s", e);
        }
    }

    QC_TEST ("bench offload: honours offload.direct=false; a full folder's hint names --dir") {
        char dir[512], log[512];
        tpath(dir, sizeof dir, "bench-offload");
        tpath(log, sizeof log, "bench-offload.log");
        T_EXPECT(mkdir(dir, 0755) == 0, "mkdir %s", dir);
        static const char *const small[] = {"--size",      "8M", "--tensor",     "1M",
                                            "--sweep",     "1",  "--sweep-size", "4M",
                                            "--roundtrip", "4M", "--no-fio",     "--json"};
        for (int direct = 0; direct < 2; direct++) {
            struct t_args a = {{0}, 0};
            t_args_add(&a, qctrain);
            t_args_add(&a, "--set");
            t_args_add(&a, direct ? "offload.direct=true" : "offload.direct=false");
            t_args_add(&a, "bench");
            t_args_add(&a, "offload");
            t_args_add(&a, "--dir");
            t_args_add(&a, dir);
            for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
                t_args_add(&a, small[i]);
            unlink(log);
            const int st = t_run(&a, log, NULL);
            char sb[64];
            T_EXPECT(t_exited(st, 0), "bench offload: %s", t_status_str(st, sb, sizeof sb));
            char *out = t_read_file(log, NULL);
            const char *j = out ? strstr(out, "{\"bench\": \"offload\"") : NULL;
            T_EXPECT(j != NULL, "no JSON in: %s", out ? out : "(none)");
            /* buffered I/O asked for: never an O_DIRECT rung */
            if (j && !direct)
                T_EXPECT(strstr(j, "O_DIRECT") == NULL, "offload.direct=false ignored: %.200s", j);
            free(out);
        }
        /* a folder without room: the bench's own option in the message, not offload.nvme_dir */
        struct t_args a = {{0}, 0};
        t_args_add(&a, qctrain);
        t_args_add(&a, "bench");
        t_args_add(&a, "offload");
        t_args_add(&a, "--dir");
        t_args_add(&a, dir);
        t_args_add(&a, "--size");
        t_args_add(&a, "1000T");
        t_args_add(&a, "--no-fio");
        unlink(log);
        const int st = t_run(&a, log, NULL);
        char sb[64];
        T_EXPECT(t_exited(st, 1), "full folder: %s", t_status_str(st, sb, sizeof sb));
        char *err = t_read_file(log, NULL);
        T_EXPECT_STR_CONTAINS(err, "--dir");
        T_EXPECT(err && !strstr(err, "offload.nvme_dir"), "names offload.nvme_dir: %s",
                 err ? err : "");
        free(err);
    }
}

// ---- the run folder in the saved configuration
// ----------------------------------------------------

static void test_saved_out_dir(void)
{
    QC_TEST ("resume: optim.safetensors records the run folder actually written") {
        char run[512];
        tpath(run, sizeof run, "outdir");
        const char *const m2[] = {"--steps", "2", "--out", run, NULL};
        int st = train(m2, NULL, NULL);
        char sb[64];
        T_EXPECT(t_exited(st, 0), "train: %s", t_status_str(st, sb, sizeof sb));
        const char *const r3[] = {"--steps", "3", "--resume", run, NULL};
        st = train(r3, NULL, NULL);
        T_EXPECT(t_exited(st, 0), "resume: %s", t_status_str(st, sb, sizeof sb));
        for (int64_t s = 2; s <= 3; s++) {
            struct qc_train_state ts;
            struct qc_config saved;
            char ck[700];
            snprintf(ck, sizeof ck, "%s/ckpt-%06" PRId64, run, s);
            T_EXPECT(qc_checkpoint_read_state(ck, &ts, &saved) == QC_OK, "%s", qc_error_last());
            T_EXPECT(strcmp(saved.out_dir, run) == 0, "step %" PRId64 ": out_dir \"%s\", not %s", s,
                     saved.out_dir, run);
        }
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-reliability-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    test_metrics_torn();
    test_leftovers();
    test_lock();
    test_signals();
    test_nonfinite();
    test_fifo();
    test_saved_out_dir();
    test_oom_and_bench();
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
