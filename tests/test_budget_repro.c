/*
 * test_budget_repro.c — budgets that keep their promises (issue 25, docs/RELIABILITY.md), on the
 * qctrain binary with cpu-smoke's model at the small settings of proc_testlib.h:
 *   - an out-of-memory inside a step (QC_FAULT_OOM_STEP: what the cache's history or timing can
 *     cause) changes no bits: the group is rolled back and re-run whole, never split on it, and
 *     the step is logged "rolled_back":true;
 *   - --skip-oversized: a skipped scene (by admission, or after running out beside another:
 *     QC_FAULT_OOM_SCENE) keeps no share of the loss denominators (the logged loss
 *     and the weights equal those of the other scene trained alone), nor does a group
 *     (train.grad_accum) whose every scene is skipped keep a share of the step;
 *   - a step whose every scene is skipped is no step ("loss":null, "empty":true, no update) and
 *     a run of only such steps fails, naming why;
 *   - the budget the trainer names for a scene that does not fit is enough: 20 steps train
 *     under exactly it;
 *   - the emu backend at fp16 under 120 MiB (the repro) trains 3 steps.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc_testlib.h"
#include "testutil.h"

static char tmp_root[256];
static const char qctrain[] = QC_BINARY_DIR "/qctrain";

/* tmp_root/name into out (removed first). */
static void tpath(char *out, size_t n, const char *name)
{
    if ((size_t)snprintf(out, n, "%s/%s", tmp_root, name) >= n)
        T_FATAL("path too long: %s/%s", tmp_root, name);
    t_rm_rf(out);
}

/* qctrain train with the small settings, then extra (NULL-terminated); env may be NULL. The
 * exit code (-1: died) and the output in *out (malloc'd) when out is not NULL. */
static int train(const char *const *extra, const char *env, const char *log, char **out)
{
    struct t_args a = {{0}, 0};
    t_args_add(&a, qctrain);
    t_args_add(&a, "train");
    for (int i = 0; i < T_TINY_TRAIN_NARGS; i++)
        t_args_add(&a, t_tiny_train_args[i]);
    for (int i = 0; extra[i]; i++)
        t_args_add(&a, extra[i]);
    unlink(log);
    const int st = t_run(&a, log, env);
    if (out)
        *out = t_read_file(log, NULL);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Whether two safetensors files hold the same tensor bytes (their headers differ: the metadata
 * records the step and the run's configuration, --out included). */
static bool same_tensors(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = t_read_file(a, &na), *y = t_read_file(b, &nb);
    bool same = x && y && na >= 8 && nb >= 8;
    if (same) {
        uint64_t ha = 0, hb = 0;
        memcpy(&ha, x, 8); /* little-endian u64 header length */
        memcpy(&hb, y, 8);
        same = ha + 8 <= na && hb + 8 <= nb && na - ha == nb - hb &&
               memcmp(x + 8 + ha, y + 8 + hb, na - 8 - ha) == 0;
    }
    free(x);
    free(y);
    return same;
}

/* The line of step `step` of RUN/metrics.jsonl (malloc'd), or NULL. */
static char *metrics_line(const char *run, int step)
{
    char p[600], key[32];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    snprintf(key, sizeof key, "{\"step\":%d,", step);
    char *text = t_read_file(p, NULL);
    char *line = text ? strstr(text, key) : NULL;
    char *r = NULL;
    if (line) {
        const size_t n = strcspn(line, "\n");
        r = malloc(n + 1);
        memcpy(r, line, n);
        r[n] = '\0';
    }
    free(text);
    return r;
}

/* The text of "key":VALUE in line, up to the next ',' or '}' (into out). */
static const char *field(const char *line, const char *key, char *out, size_t n)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = line ? strstr(line, k) : NULL;
    if (!p) {
        snprintf(out, n, "(none)");
        return out;
    }
    p += strlen(k);
    const size_t len = strcspn(p, ",}");
    snprintf(out, n, "%.*s", (int)len, p);
    return out;
}

/* --skip-oversized on `one` then the dense d1 (unshuffled, dropout 0, budget, 1 step, the
 * settings `batch`: NULL-ended "--set" pairs): d1 is skipped, and step 1's loss, skipped_scenes
 * 1, samples 1 and the weights equal those of `one` trained alone with train.batch_size of
 * `batch` (its first pair) and nothing else of it. after_oom: d1 is skipped only after running
 * out of memory beside `one` (the group runs again without it). what: the skipped thing, for
 * the messages. */
static void skipped_equals_alone(const char *name, const char *budget, const char *env,
                                 bool after_oom, const char *const *batch, const char *one,
                                 const char *d1, const char *log, const char *what)
{
    char budget_set[64];
    snprintf(budget_set, sizeof budget_set, "device.budget=%s", budget);
    char both[300], alone[300], a[400], b[400], tag[64];
    tpath(both, sizeof both, name);
    snprintf(tag, sizeof tag, "%s-alone", name);
    tpath(alone, sizeof alone, tag);
    const char *common[] = {"--set", "data.shuffle=false", "--set",   "model.dropout=0",
                            "--set", budget_set,           "--steps", "1"};
    const int nc = (int)(sizeof common / sizeof common[0]);
    const char *x[40], *y[40];
    int n = 0, k = 0;
    for (int i = 0; batch[i]; i++)
        x[n++] = batch[i];
    y[k++] = batch[0]; /* the batch size alone */
    y[k++] = batch[1];
    for (int i = 0; i < nc; i++)
        x[n++] = y[k++] = common[i];
    const char *tail_x[] = {"--data", one, "--data", d1, "--skip-oversized", "--out", both, NULL};
    const char *tail_y[] = {"--data", one, "--out", alone, NULL};
    for (int i = 0; tail_x[i]; i++)
        x[n++] = tail_x[i];
    for (int i = 0; tail_y[i]; i++)
        y[k++] = tail_y[i];
    x[n] = y[k] = NULL;
    char *out = NULL;
    int rc = train(x, env, log, &out);
    T_EXPECT(rc == 0, "one + dense with --skip-oversized: exit %d\n%s", rc, out ? out : "");
    T_EXPECT(out && strstr(out, "skipped"), "no scene was skipped:\n%s", out ? out : "");
    /* after_oom: skipped only after running out beside `one`, so the group ran again */
    T_EXPECT(out && (strstr(out, "runs again without it") != NULL) == after_oom,
             "%s: the group %s run again:\n%s", what, after_oom ? "was not" : "was",
             out ? out : "");
    free(out);
    rc = train(y, NULL, log, &out);
    T_EXPECT(rc == 0, "one alone: exit %d\n%s", rc, out ? out : "");
    free(out);
    char *l1 = metrics_line(both, 1), *l2 = metrics_line(alone, 1);
    char f1[64], f2[64];
    T_EXPECT(strcmp(field(l1, "loss", f1, sizeof f1), field(l2, "loss", f2, sizeof f2)) == 0,
             "loss %s with %s, %s for the other scene alone", f1, what, f2);
    T_EXPECT(strcmp(field(l1, "skipped_scenes", f1, sizeof f1), "1") == 0 &&
                 strcmp(field(l1, "samples", f2, sizeof f2), "1") == 0,
             "skipped_scenes %s, samples %s: 1 and 1 expected", f1, f2);
    free(l1);
    free(l2);
    snprintf(a, sizeof a, "%s/ckpt-000001/model.safetensors", both);
    snprintf(b, sizeof b, "%s/ckpt-000001/model.safetensors", alone);
    T_EXPECT(same_tensors(a, b),
             "the weights differ from the other scene's alone: %s still "
             "weighs on the gradients",
             what);
}

static void gen(const char *path, const char *scenes, const char *profile, const char *seed)
{
    char log[300];
    snprintf(log, sizeof log, "%s/gen.log", tmp_root);
    const char *args[] = {"gen",    "--scenes", scenes,  "--profile", profile,
                          "--seed", seed,       "--out", path,        NULL};
    char *out = NULL;
    const int rc = t_run_output(qctrain, args, log, &out);
    if (rc != 0)
        T_FATAL("qctrain gen %s: exit %d\n%s", path, rc, out ? out : "");
    free(out);
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-budget-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    char log[300], one[300], d1[300];
    snprintf(log, sizeof log, "%s/log", tmp_root);
    snprintf(one, sizeof one, "%s/one.qcs", tmp_root);
    snprintf(d1, sizeof d1, "%s/d1.qcs", tmp_root);
    gen(one, "1", "mixed", "9"); /* 49 agents: fits 80 MiB */
    /* 192 agents: its smallest plan, 72.3 MiB, does not fit 64 MiB */
    gen(d1, "1", "dense", "4");

    QC_TEST ("budget: an out-of-memory inside a step is rolled back and re-run whole, the "
             "same bits") {
        /* two scenes a group under 100 MiB: the groups run whole; the injected failure in
         * step 2 must not split it (a split adds the parts' gradients in another order) */
        char ref[300], hit[300], a[400], b[400];
        tpath(ref, sizeof ref, "oom-ref");
        tpath(hit, sizeof hit, "oom-hit");
        const char *base[] = {"--set",   "train.batch_size=2",
                              "--set",   "device.budget=100MiB",
                              "--steps", "2",
                              "--out",   ref,
                              NULL};
        char *out = NULL;
        int rc = train(base, NULL, log, &out);
        T_EXPECT(rc == 0, "reference run: exit %d\n%s", rc, out ? out : "");
        free(out);
        base[7] = hit;
        rc = train(base, "QC_FAULT_OOM_STEP=2", log, &out);
        T_EXPECT(rc == 0, "run with an OOM in step 2: exit %d\n%s", rc, out ? out : "");
        free(out);
        char *l1 = metrics_line(ref, 2), *l2 = metrics_line(hit, 2);
        char f1[64], f2[64], f3[64];
        T_EXPECT(l2 && strstr(l2, "\"rolled_back\":true"),
                 "step 2 of the run with the OOM is not flagged rolled_back: %s", l2 ? l2 : "-");
        T_EXPECT(strcmp(field(l1, "splits", f1, sizeof f1), field(l2, "splits", f2, sizeof f2)) ==
                     0,
                 "splits %s without the OOM, %s with it", f1, f2);
        T_EXPECT(strcmp(field(l1, "loss", f1, sizeof f1), field(l2, "loss", f3, sizeof f3)) == 0,
                 "step 2 loss %s without the OOM, %s with it", f1, f3);
        free(l1);
        free(l2);
        for (int i = 0; i < 2; i++) {
            const char *f = i ? "optim.safetensors" : "model.safetensors";
            snprintf(a, sizeof a, "%s/ckpt-000002/%s", ref, f);
            snprintf(b, sizeof b, "%s/ckpt-000002/%s", hit, f);
            T_EXPECT(same_tensors(a, b), "%s differs from the run without the OOM", b);
        }
    }

    QC_TEST ("skip-oversized: a skipped scene keeps no share of the loss") {
        const char *batch[] = {"--set", "train.batch_size=2", NULL};
        /* 64 MiB: d1's smallest plan (72.3 MiB) does not fit, admission skips it */
        skipped_equals_alone("skip", "64MiB", NULL, false, batch, one, d1, log,
                             "the scene skipped by admission");
        /* 256 MiB: both are admitted; every run of a group holding d1 (dataset scene 1) runs
         * out (QC_FAULT_OOM_SCENE: a plan that fits, allocations that never do), so the group
         * splits, `one` runs under the group's denominators, d1 is skipped after running out
         * alone, and the group runs again without it */
        skipped_equals_alone("skip-rt", "256MiB", "QC_FAULT_OOM_SCENE=1", true, batch, one, d1, log,
                             "the scene skipped after running out");
    }

    QC_TEST ("skip-oversized: a group whose every scene is skipped keeps no share of the step "
             "(grad_accum 2)") {
        /* group 1 = the scene that fits, group 2 = the dense one, skipped: the step's loss and
         * update are group 1's alone, as the one-group run of that scene gives (the seed 1/2
         * and the rescale by 2 are exact) */
        const char *accum[] = {"--set", "train.batch_size=1", "--set", "train.grad_accum=2", NULL};
        skipped_equals_alone("skip-accum", "64MiB", NULL, false, accum, one, d1, log,
                             "the skipped group");
    }

    QC_TEST ("skip-oversized: a step without a scene is no step; a run of only such steps "
             "fails") {
        char run[300];
        tpath(run, sizeof run, "skip-all");
        const char *s[] = {"--set",
                           "train.batch_size=2",
                           "--set",
                           "device.budget=64MiB",
                           "--data",
                           d1,
                           "--steps",
                           "2",
                           "--skip-oversized",
                           "--out",
                           run,
                           NULL};
        char *out = NULL;
        const int rc = train(s, NULL, log, &out);
        T_EXPECT(rc != 0 && rc != -1, "every scene skipped: exit %d, non-zero expected\n%s", rc,
                 out ? out : "");
        T_EXPECT(out && strstr(out, "nothing was trained"), "no clear message:\n%s",
                 out ? out : "");
        free(out);
        for (int step = 1; step <= 2; step++) {
            char *l = metrics_line(run, step);
            T_EXPECT(l && strstr(l, "\"loss\":null") && strstr(l, "\"empty\":true") &&
                         strstr(l, "\"samples\":0"),
                     "step %d: %s", step, l ? l : "(no line)");
            free(l);
        }
        /* one scene that fits, then the one that does not: step 2 changes no weight (no AdamW
         * weight decay on zero gradients) */
        char mixed[300], a[400], b[400];
        tpath(mixed, sizeof mixed, "skip-mixed");
        const char *m[] = {"--set",
                           "train.batch_size=1",
                           "--set",
                           "data.shuffle=false",
                           "--set",
                           "device.budget=64MiB",
                           "--data",
                           one,
                           "--data",
                           d1,
                           "--skip-oversized",
                           "--steps",
                           "2",
                           "--save-every",
                           "1",
                           "--out",
                           mixed,
                           NULL};
        const int rc2 = train(m, NULL, log, &out);
        T_EXPECT(rc2 == 0, "one step of each: exit %d\n%s", rc2, out ? out : "");
        free(out);
        char *l = metrics_line(mixed, 2);
        T_EXPECT(l && strstr(l, "\"empty\":true"), "step 2: %s", l ? l : "(no line)");
        free(l);
        snprintf(a, sizeof a, "%s/ckpt-000001/model.safetensors", mixed);
        snprintf(b, sizeof b, "%s/ckpt-000002/model.safetensors", mixed);
        T_EXPECT(same_tensors(a, b), "the empty step 2 changed the weights");
    }

    QC_TEST ("budget: a run given exactly the budget the trainer said a scene needs trains 20 "
             "steps") {
        char run[300];
        tpath(run, sizeof run, "need");
        const char *small[] = {"--set",   "train.batch_size=1",
                               "--set",   "device.budget=30MiB",
                               "--data",  one,
                               "--steps", "1",
                               "--out",   run,
                               NULL};
        char *out = NULL;
        int rc = train(small, NULL, log, &out);
        const char *k = out ? strstr(out, "it needs a budget of about ") : NULL;
        const char *open = k ? strchr(k, '(') : NULL;
        char bytes[32] = "";
        if (open)
            snprintf(bytes, sizeof bytes, "%.*s", (int)strspn(open + 1, "0123456789"), open + 1);
        T_EXPECT(rc != 0 && bytes[0], "30 MiB: exit %d, no needed budget named:\n%s", rc,
                 out ? out : "");
        free(out);
        if (!bytes[0])
            continue;
        char set[64];
        snprintf(set, sizeof set, "device.budget=%s", bytes);
        tpath(run, sizeof run, "need");
        const char *exact[] = {"--set",   "train.batch_size=1",
                               "--set",   set,
                               "--data",  one,
                               "--steps", "20",
                               "--out",   run,
                               NULL};
        rc = train(exact, NULL, log, &out);
        T_EXPECT(rc == 0, "%s bytes, the budget the trainer named: exit %d\n%s", bytes, rc,
                 out ? out : "");
        free(out);
    }

    QC_TEST ("budget: emu, fp16, 120 MiB trains (an exact-size segment near the budget, the "
             "retry at the configured margin)") {
        char run[300];
        tpath(run, sizeof run, "emu120");
        struct t_args a = {{0}, 0};
        const char *v[] = {qctrain,
                           "train",
                           "--preset",
                           "cpu-smoke",
                           "--quiet",
                           "--device",
                           "emu",
                           "--steps",
                           "3",
                           "--set",
                           "train.precision=fp16",
                           "--set",
                           "device.budget=120MiB",
                           "--set",
                           "data.loader_threads=1",
                           "--out",
                           run};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
            t_args_add(&a, v[i]);
        unlink(log);
        const int st = t_run(&a, log, NULL);
        char *out = t_read_file(log, NULL);
        char sb[64];
        T_EXPECT(t_exited(st, 0), "%s\n%s", t_status_str(st, sb, sizeof sb), out ? out : "");
        free(out);
    }
    QC_TEST ("budget: the margin in force covers the fragmentation measured at earlier steps' "
             "peaks") {
        /* at 48 MiB the tiny settings' allocator holds 2 to 9 MiB reserved beyond what is
         * allocated at a step's peak (partly used granules and small segments), over the
         * planner's 2 %: each step's first plan keeps that much (plus a 2 MiB granule) below
         * the budget */
        char run[300];
        tpath(run, sizeof run, "frag");
        const char *s[] = {
            "--set", "device.budget=48MiB", "--steps", "5", "--log-level", "debug", "--out", run,
            NULL};
        char *out = NULL;
        const int rc = train(s, NULL, log, &out);
        T_EXPECT(rc == 0, "exit %d\n%s", rc, out ? out : "");
        const double budget = 48.0 * 1048576.0;
        double need = 0; /* the largest fragmentation so far, with the granule, in % */
        int checked = 0;
        for (int step = 1; step <= 5 && out; step++) {
            char key[80];
            snprintf(key, sizeof key, "plan: step %d, calibrated cost model, ", step);
            const char *p = strstr(out, key);
            double margin = -1;
            if (p)
                margin = strtod(p + strlen(key), NULL);
            if (step > 1) {
                T_EXPECT(p && margin + 0.051 >= need,
                         "step %d planned at a %.1f %% margin, under the %.2f %% fragmentation "
                         "measured before it",
                         step, margin, need);
                checked++;
            }
            char *l = metrics_line(run, step);
            char a[64], b[64];
            const double live = strtod(field(l, "peak_reserved_live_bytes", a, sizeof a), NULL);
            const double peak = strtod(field(l, "peak_device_bytes", b, sizeof b), NULL);
            free(l);
            const double f = live > peak ? 100.0 * (live - peak + 2097152.0) / budget : 0.0;
            printf("  step %d: margin %.1f %%, fragmentation at the peak %.0f bytes (%.2f %% with "
                   "the granule)\n",
                   step, margin, live - peak, f);
            need = f > need ? f : need;
        }
        T_EXPECT(checked == 4 && need > 6.0, "%d steps checked, the fragmentation %.2f %%", checked,
                 need);
        free(out);
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
