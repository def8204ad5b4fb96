/*
 * test_memory_figures.c — the memory figures docs/BENCHMARKS.md states, held as tests (issue 17):
 * they are structural, so deterministic for a fixed input, unlike times.
 *   - the fused attention's training step: its caching-allocator peak is at least 2.5x below the
 *     unfused one's, on a fixed scene (the first synthetic typical scene of seed 2023, batch 1,
 *     cpu-smoke's model, the official radii). Measured 2.58x: 2.83x before the fused path on
 *     the CPU kept one E x D tensor per edge set (the shared r = FE(feat), issue 16: +14.5 MB
 *     here); a fused attention run as one tile over the whole edge set gives about 2x;
 *   - fragmentation (peak reserved / peak allocated) of the allocator replay of
 *     `qctrain bench alloc` (1,000 QCNet-like steps, seed 2026) stays <= 1.05;
 * and the same figures of real runs of the qctrain binary (the cases named "run:", ctest's
 * test_memory_figures_run, label slow: a few minutes of training):
 *   - the README's first command, `qctrain train --preset cpu-smoke` (5 of its 20 steps): every
 *     step's predicted peak (metrics.jsonl predicted_peak_bytes) is the measured one
 *     (peak_active_bytes), step 1 included. Nothing is planned under a budget, so the dry run's
 *     program is the step's allocations event for event (src/plan/README.md) and the prediction
 *     is exact; the stated accuracy (within 3 %: docs/MEMORY_REPORT.md) is checked too, by
 *     name. Before c27d850 step 1 was predicted 16 % high (327 MB for 281 MB);
 *   - cpu-smoke on mixed scenes (`qctrain gen --profile mixed`), 50 steps: the fragmentation of
 *     the run (memory.json: peak reserved / peak allocated, run-wide) is <= 1.05, as the replay's,
 *     and every step is predicted exactly. Measured 1.0445 with one OpenMP thread, as ctest
 *     runs it (1.0415 with two); the heavy-tail steps peak at 2x the median, so the
 *     allocator's cache is reused across sizes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "proc_testlib.h"
#include "qc_config.h"
#include "qc_train.h"
#include "testutil.h"

static char tmp_root[256];

/* The planner's accuracy as the docs state and the tests gate it (docs/MEMORY_REPORT.md): a
 * predicted peak within 3 % of the measured one (the README promised 5 %). */
#define PLAN_ERR 0.03

/* The allocator peak of one training step of cpu-smoke's model on the fixed scene. */
static bool step_peak(bool fused, uint64_t *peak)
{
    struct qc_config cfg;
    qc_config_defaults(&cfg);
    if (qc_config_apply_preset(&cfg, "cpu-smoke") != QC_OK)
        T_FATAL("%s", qc_error_last());
    cfg.batch_size = 1;
    cfg.synthetic_scenes = 1;
    cfg.shuffle = false;
    cfg.loader_threads = 1;
    cfg.seed = 2023;
    cfg.steps = 1;
    cfg.alloc_trace = false;
    cfg.attention = fused ? QC_ATTENTION_FUSED : QC_ATTENTION_UNFUSED;
    char run[512];
    snprintf(run, sizeof run, "%s/%s", tmp_root, fused ? "fused" : "unfused");
    const struct qc_train_opts to = {.cfg = &cfg, .out_dir = run, .quiet = true};
    struct qc_trainer *t = NULL;
    struct qc_step_metrics m;
    enum qc_status st = qc_trainer_create(&to, &t);
    if (st == QC_OK)
        st = qc_trainer_step(t, &m);
    qc_trainer_destroy(t);
    if (st != QC_OK) {
        T_FAIL_AT("%s step: %s", fused ? "fused" : "unfused", qc_error_last());
        return false;
    }
    *peak = m.peak_device_bytes;
    return true;
}

// ---- real runs ------------------------------------------------------------------------------

/* `qctrain train` with args (NULL-ended) into tmp_root/name; false (reported) when it fails. */
static bool train_run(const char *name, const char *const *args, char *dir, size_t n)
{
    snprintf(dir, n, "%s/%s", tmp_root, name);
    char log[600];
    snprintf(log, sizeof log, "%s/%s.log", tmp_root, name);
    struct t_args a = {{0}, 0};
    t_args_add(&a, QC_BINARY_DIR "/qctrain");
    t_args_add(&a, "train");
    for (int i = 0; args[i]; i++)
        t_args_add(&a, args[i]);
    t_args_add(&a, "--out");
    t_args_add(&a, dir);
    const int st = t_run(&a, log, NULL);
    char sb[64];
    if (!t_exited(st, 0)) {
        char *text = t_read_file(log, NULL);
        T_FAIL_AT("%s: qctrain train: %s\n%s", name, t_status_str(st, sb, sizeof sb),
                  text ? text : "");
        free(text);
        return false;
    }
    return true;
}

static double jnum(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : (double)NAN;
}

/* Every step line of DIR/metrics.jsonl: predicted_peak_bytes == peak_active_bytes (and within
 * PLAN_ERR), no re-plan; the number of step lines. */
static int expect_predicted(const char *what, const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *text = t_read_file(path, NULL);
    T_EXPECT(text != NULL, "%s: no %s", what, path);
    int steps = 0;
    double worst = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        cJSON *j = cJSON_Parse(line);
        if (j && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "loss"))) {
            steps++;
            const double step = jnum(j, "step"), pred = jnum(j, "predicted_peak_bytes"),
                         meas = jnum(j, "peak_active_bytes"), replans = jnum(j, "replans");
            const double err = (pred - meas) / meas;
            worst = fmax(worst, fabs(err));
            T_EXPECT(step == steps, "%s: step %g logged as line %d", what, step, steps);
            T_EXPECT(pred > 0 && meas > 0 && replans == 0,
                     "%s: step %g: predicted %g, measured "
                     "%g, re-plans %g",
                     what, step, pred, meas, replans);
            T_EXPECT(fabs(err) <= PLAN_ERR,
                     "%s: step %g: predicted %.0f vs measured %.0f "
                     "(%+.2f %%): more than the stated %.0f %%",
                     what, step, pred, meas, 100 * err, 100 * PLAN_ERR);
            /* kept whole: the dry run's program is the step's allocations, event for event */
            T_EXPECT(pred == meas,
                     "%s: step %g kept whole: predicted %.0f vs measured %.0f "
                     "(%+.2f %%)",
                     what, step, pred, meas, 100 * err);
        }
        cJSON_Delete(j);
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    printf("  %s: %d steps, largest |predicted - measured| / measured %.2f %%\n", what, steps,
           100 * worst);
    return steps;
}

static void test_runs(void)
{
    QC_TEST ("run: the README's cpu-smoke run predicts every step's peak, step 1 included") {
        const char *args[] = {"--preset", "cpu-smoke", "--steps", "5", "--quiet", NULL};
        char dir[512];
        if (!train_run("readme", args, dir, sizeof dir))
            continue;
        T_EXPECT(expect_predicted("cpu-smoke", dir) == 5, "5 steps logged");
    }

    QC_TEST ("run: cpu-smoke on mixed scenes, 50 steps: fragmentation <= 1.05, every step "
             "predicted") {
        char data[512], log[600];
        snprintf(data, sizeof data, "%s/mixed.qcshard", tmp_root);
        snprintf(log, sizeof log, "%s/gen.log", tmp_root);
        /* 100 scenes: one epoch of 50 batches of cpu-smoke's 2 */
        struct t_args g = {{0}, 0};
        const char *gen[] = {QC_BINARY_DIR "/qctrain",
                             "gen",
                             "--profile",
                             "mixed",
                             "--scenes",
                             "100",
                             "--seed",
                             "7",
                             "--out",
                             data};
        for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++)
            t_args_add(&g, gen[i]);
        char sb[64];
        const int st = t_run(&g, log, NULL);
        T_EXPECT(t_exited(st, 0), "qctrain gen: %s", t_status_str(st, sb, sizeof sb));
        if (!t_exited(st, 0))
            continue;
        const char *args[] = {"--preset", "cpu-smoke", "--data",  data,
                              "--steps",  "50",        "--quiet", NULL};
        char dir[512];
        if (!train_run("mixed", args, dir, sizeof dir))
            continue;
        T_EXPECT(expect_predicted("mixed", dir) == 50, "50 steps logged");
        char path[600];
        snprintf(path, sizeof path, "%s/memory.json", dir);
        char *text = t_read_file(path, NULL);
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        const cJSON *al = cJSON_GetObjectItemCaseSensitive(j, "allocator");
        const double res = jnum(al, "bytes_reserved_peak"),
                     alloc = jnum(al, "bytes_allocated_peak"), fr = jnum(al, "fragmentation");
        T_EXPECT(res > 0 && alloc > 0, "memory.json: allocator peaks: %s", text ? text : "none");
        if (res > 0 && alloc > 0) {
            printf("  mixed, 50 steps: peak reserved %.0f B, peak allocated %.0f B: fragmentation "
                   "%.4f\n",
                   res, alloc, res / alloc);
            T_EXPECT(fabs(fr - res / alloc) < 1e-5, "memory.json's fragmentation %g is not %g", fr,
                     res / alloc);
            T_EXPECT(res / alloc <= 1.05,
                     "fragmentation of the run %.4f (peak reserved %.0f / allocated %.0f): "
                     "docs/BENCHMARKS.md states <= 1.05",
                     res / alloc, res, alloc);
        }
        cJSON_Delete(j);
        free(text);
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-memfig-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }

    QC_TEST ("memory: the fused step's allocator peak is >= 2.5x below the unfused one's") {
        uint64_t pf = 0, pu = 0;
        if (!step_peak(true, &pf) || !step_peak(false, &pu))
            continue;
        const double ratio = pf ? (double)pu / (double)pf : 0.0;
        printf("  step peak: unfused %llu B, fused %llu B (%.2fx)\n", (unsigned long long)pu,
               (unsigned long long)pf, ratio);
        T_EXPECT(pf > 0 && ratio >= 2.5, "ratio %.3f, docs/BENCHMARKS.md states >= 2.5", ratio);
    }

    QC_TEST ("memory: fragmentation of the fixed-seed allocator replay stays <= 1.05") {
        char out[600];
        snprintf(out, sizeof out, "%s/alloc.json", tmp_root);
        struct t_args a = {{0}, 0};
        t_args_add(&a, QC_BINARY_DIR "/qctrain");
        t_args_add(&a, "bench");
        t_args_add(&a, "alloc");
        t_args_add(&a, "--json");
        t_args_add(&a, "--steps");
        t_args_add(&a, "1000");
        t_args_add(&a, "--seed");
        t_args_add(&a, "2026");
        /* stdout (the JSON) and stderr into one file: the JSON is the last line */
        const int st = t_run(&a, out, NULL);
        char sb[64];
        T_EXPECT(t_exited(st, 0), "bench alloc: %s", t_status_str(st, sb, sizeof sb));
        char *text = t_read_file(out, NULL);
        const char *json = text ? strstr(text, "{\"bench\"") : NULL;
        cJSON *j = json ? cJSON_Parse(json) : NULL;
        const cJSON *fr = j ? cJSON_GetObjectItemCaseSensitive(j, "fragmentation") : NULL;
        const cJSON *ck = j ? cJSON_GetObjectItemCaseSensitive(j, "check") : NULL;
        T_EXPECT(cJSON_IsNumber(fr), "no fragmentation in: %s", text ? text : "(no output)");
        if (cJSON_IsNumber(fr)) {
            printf("  fragmentation %.4f\n", fr->valuedouble);
            T_EXPECT(fr->valuedouble >= 1.0 && fr->valuedouble <= 1.05,
                     "fragmentation %.4f, docs/BENCHMARKS.md states <= 1.05", fr->valuedouble);
        }
        T_EXPECT(cJSON_IsString(ck) && strcmp(ck->valuestring, "ok") == 0, "allocator check");
        cJSON_Delete(j);
        free(text);
    }
    test_runs();
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
