/*
 * test_train_device.c — training and evaluation on the device backends (device.kind; the
 * trainer's backend.c), through the library API `qctrain train|eval` uses, on a tiny model (the
 * cpu-smoke preset's sizes, 1 scene per group, 2 groups per step, 3 scenes per epoch so the
 * 3-step runs cross an epoch and stage batches across steps).
 *
 * test_train_device (label cpu): the emulated device (emu: CPU ops on device memory that faults
 * on any host access) against cpu, fused and unfused attention:
 *   - 3 steps: identical metrics.jsonl figures (losses, lr, positions) and byte-identical
 *     checkpoint files (model.safetensors, optim.safetensors);
 *   - a cpu checkpoint resumed on emu ends with the files of the uninterrupted cpu run;
 *   - eval on emu equals eval on cpu (loss, metrics, --dump bytes);
 *   - --device cuda without a GPU (a CPU-only build, or no device) fails with a hint, through
 *     the API and through the qctrain binary (non-zero exit).
 * test_train_device_cuda (label gpu, argument "cuda"; exit 77 in a CPU-only build or without a
 * GPU): cpu vs cuda losses over 3 steps within a stated tolerance, and two cuda runs
 * bit-identical (losses and checkpoint bytes).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config_testlib.h"
#include "qc_config.h"
#include "qc_device.h"
#include "qc_train.h"
#include "cuda_probe.h"
#include "testutil.h"

#define STEPS 3

// ---- helpers -----------------------------------------------------------------------------------

static char tmp_root[256];

/* A fresh folder path under the test's temporary root. */
static void tmp_dir(char *out, size_t n, const char *name)
{
    if ((size_t)snprintf(out, n, "%s/%.64s", tmp_root, name) >= n)
        T_FATAL("path too long: %s/%s", tmp_root, name);
    t_rm_rf(out);
}

/* The tiny configuration of test_train.c: cpu-smoke's model sizes, 1 scene per group, 2 groups
 * per step, 3 synthetic scenes per epoch, small radii; STEPS steps. */
static void tiny_config(struct qc_config *cfg, enum qc_config_device dev, bool fused)
{
    t_small_smoke_config(cfg);
    cfg->batch_size = 1;
    cfg->grad_accum = 2;
    cfg->synthetic_scenes = 3;
    cfg->t_max = 2;
    cfg->steps = STEPS;
    cfg->save_every = 0;
    cfg->loader_threads = 2;
    cfg->prefetch_batches = 2;
    cfg->alloc_trace = false;
    cfg->attention = fused ? QC_ATTENTION_FUSED : QC_ATTENTION_UNFUSED;
    cfg->device_kind = dev;
}

/* Trains cfg into dir (a new run, or a resume of `resume`); false (test failed) on error. */
static bool train_run(const struct qc_config *cfg, const char *dir, const char *resume)
{
    const struct qc_train_opts to = {.cfg = cfg, .out_dir = dir, .resume = resume, .quiet = true};
    struct qc_trainer *t = NULL;
    enum qc_status st = qc_trainer_create(&to, &t);
    if (st == QC_OK)
        st = qc_trainer_run(t);
    qc_trainer_destroy(t);
    if (st != QC_OK) {
        T_FAIL_AT("train (%s, %s) into %s: %s", qc_train_device_str(cfg->device_kind),
                  cfg->attention == QC_ATTENTION_FUSED ? "fused" : "unfused", dir ? dir : resume,
                  qc_error_last());
        return false;
    }
    return true;
}

/* The whole file in a malloc'ed buffer (NUL-terminated), or NULL. */
static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        const size_t k = fread(buf + len, 1, 4096, f);
        len += k;
        if (k < 4096)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    if (n)
        *n = len;
    return buf;
}

/* Expects files a and b to hold the same bytes. */
static void expect_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    T_EXPECT(x != NULL, "cannot read %s", a);
    T_EXPECT(y != NULL, "cannot read %s", b);
    if (x && y) {
        T_EXPECT(na == nb && memcmp(x, y, na) == 0, "%s (%zu bytes) differs from %s (%zu bytes)", a,
                 na, b, nb);
    }
    free(x);
    free(y);
}

/* Expects the checkpoint of step `step` of runs a and b to be the same bytes. */
static void expect_same_ckpt(const char *run_a, const char *run_b, int64_t step)
{
    static const char *const files[] = {"model.safetensors", "optim.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[512], pb[512];
        snprintf(pa, sizeof(pa), "%s/ckpt-%06" PRId64 "/%s", run_a, step, files[i]);
        snprintf(pb, sizeof(pb), "%s/ckpt-%06" PRId64 "/%s", run_b, step, files[i]);
        expect_same_file(pa, pb);
    }
}

/* The text of "key":<value> in a JSON line (up to ',' or '}') into out; false when absent. */
static bool json_field(const char *line, const char *key, char *out, size_t n)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p)
        return false;
    p += strlen(pat);
    size_t k = strcspn(p, ",}");
    if (k >= n)
        k = n - 1;
    memcpy(out, p, k);
    out[k] = '\0';
    return true;
}

/* The reproducible figures of a metrics.jsonl step line (every field but wall time and bytes,
 * which depend on the backend's allocations). */
static const char *const step_keys[] = {
    "step", "epoch", "samples", "loss", "reg_loss_propose", "reg_loss_refine", "cls_loss", "lr"};
#define NSTEP_KEYS ((int)(sizeof(step_keys) / sizeof(step_keys[0])))

/* Step lines of RUN/metrics.jsonl: values[i][k] for step line i, key k; returns the count. */
struct step_values {
    char v[NSTEP_KEYS][48];
};

static int read_steps(const char *run, struct step_values *out, int max)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", run);
    char *text = read_file(path, NULL);
    if (!text)
        return -1;
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        if (strstr(line, "\"eval\""))
            continue;
        for (int k = 0; k < NSTEP_KEYS; k++)
            if (!json_field(line, step_keys[k], out[n].v[k], sizeof(out[n].v[k])))
                snprintf(out[n].v[k], sizeof(out[n].v[k]), "(missing)");
        n++;
    }
    free(text);
    return n;
}

/* Expects equal reproducible figures in two runs' metrics.jsonl. */
static void expect_same_metrics(const char *run_a, const char *run_b)
{
    struct step_values a[16], b[16];
    const int na = read_steps(run_a, a, 16), nb = read_steps(run_b, b, 16);
    T_EXPECT(na == STEPS && nb == STEPS, "metrics lines: %d and %d, %d expected", na, nb, STEPS);
    for (int i = 0; i < na && i < nb; i++)
        for (int k = 0; k < NSTEP_KEYS; k++)
            T_EXPECT(strcmp(a[i].v[k], b[i].v[k]) == 0, "step line %d, %s: %s vs %s", i + 1,
                     step_keys[k], a[i].v[k], b[i].v[k]);
}

/* The loss of step line i of a run (NAN when absent). */
static double step_loss(const struct step_values *s)
{
    return strtod(s->v[3], NULL);
}

/* Moves run folder dir aside to <dir>.first (aside, n bytes). Runs compared byte for byte train
 * in the same folder path: a checkpoint records the run folder it was written to
 * (train.out_dir in its saved configuration). */
static void move_aside(const char *dir, char *aside, size_t n)
{
    if ((size_t)snprintf(aside, n, "%s.first", dir) >= n)
        T_FATAL("path too long: %s", dir);
    t_rm_rf(aside);
    if (rename(dir, aside) != 0)
        T_FATAL("cannot move %s aside", dir);
}

// ---- emu vs cpu --------------------------------------------------------------------------------

static void test_emu_train(void)
{
    for (int fused = 0; fused < 2; fused++) {
        char name[128];
        snprintf(name, sizeof(name),
                 "train: %d steps on emu == cpu (%s): metrics and checkpoint bytes", STEPS,
                 fused ? "fused" : "unfused");
        QC_TEST (name) {
            char dir[256], dcpu[300];
            tmp_dir(dir, sizeof(dir), fused ? "emu-vs-cpu-fused" : "emu-vs-cpu-unfused");
            struct qc_config ccpu, cemu;
            tiny_config(&ccpu, QC_CONFIG_DEVICE_CPU, fused);
            tiny_config(&cemu, QC_CONFIG_DEVICE_EMU, fused);
            if (!train_run(&ccpu, dir, NULL))
                continue; /* QC_TEST is a for loop: continue ends the test */
            move_aside(dir, dcpu, sizeof(dcpu));
            if (!train_run(&cemu, dir, NULL))
                continue;
            expect_same_metrics(dcpu, dir);
            expect_same_ckpt(dcpu, dir, STEPS);
        }
    }

    QC_TEST ("train: a cpu checkpoint resumed on emu ends with the uninterrupted cpu run's files") {
        char dpart[256], dfull[300];
        tmp_dir(dpart, sizeof(dpart), "cpu-then-emu");
        struct qc_config c;
        tiny_config(&c, QC_CONFIG_DEVICE_CPU, false);
        if (!train_run(&c, dpart, NULL))
            continue;
        move_aside(dpart, dfull, sizeof(dfull));
        c.steps = 2;
        if (!train_run(&c, dpart, NULL))
            continue;
        tiny_config(&c, QC_CONFIG_DEVICE_EMU, false); /* steps = 3 */
        if (!train_run(&c, NULL, dpart))
            continue;
        expect_same_metrics(dfull, dpart);
        expect_same_ckpt(dfull, dpart, STEPS);
    }
}

static void test_emu_eval(void)
{
    QC_TEST ("eval: emu == cpu (loss, metrics, --dump bytes), weights from a checkpoint") {
        char dcpu[256], weights[512];
        tmp_dir(dcpu, sizeof(dcpu), "eval-weights");
        struct qc_config c;
        tiny_config(&c, QC_CONFIG_DEVICE_CPU, true);
        c.steps = 1;
        if (!train_run(&c, dcpu, NULL))
            continue;
        snprintf(weights, sizeof(weights), "%s/ckpt-000001", dcpu);
        struct qc_eval_result r[2];
        char dump[2][512];
        bool ok = true;
        for (int k = 0; k < 2 && ok; k++) {
            struct qc_config ce;
            tiny_config(&ce, k ? QC_CONFIG_DEVICE_EMU : QC_CONFIG_DEVICE_CPU, true);
            snprintf(dump[k], sizeof(dump[k]), "%s/dump-%s.safetensors", tmp_root,
                     k ? "emu" : "cpu");
            const struct qc_eval_opts eo = {
                .cfg = &ce,
                .weights = weights,
                .batch_size = 2,
                .dump = dump[k],
                .synthetic_seed = 7,
                .synthetic_scenes = 3,
                .quiet = true,
            };
            if (qc_eval_run(&eo, &r[k]) != QC_OK) {
                T_FAIL_AT("eval on %s: %s", k ? "emu" : "cpu", qc_error_last());
                ok = false;
            }
        }
        if (!ok)
            continue;
        T_EXPECT_EQ_I64(r[1].batches, r[0].batches, "batches");
        T_EXPECT_EQ_I64(r[1].scenes, r[0].scenes, "scenes");
        T_EXPECT_EQ_I64(r[1].metrics.count, r[0].metrics.count, "agents");
        T_EXPECT(r[1].loss == r[0].loss && r[1].reg_loss_propose == r[0].reg_loss_propose &&
                     r[1].reg_loss_refine == r[0].reg_loss_refine && r[1].cls_loss == r[0].cls_loss,
                 "losses: emu %.9g (%.9g, %.9g, %.9g) vs cpu %.9g (%.9g, %.9g, %.9g)", r[1].loss,
                 r[1].reg_loss_propose, r[1].reg_loss_refine, r[1].cls_loss, r[0].loss,
                 r[0].reg_loss_propose, r[0].reg_loss_refine, r[0].cls_loss);
        T_EXPECT(r[1].metrics.min_ade == r[0].metrics.min_ade &&
                     r[1].metrics.min_fde == r[0].metrics.min_fde &&
                     r[1].metrics.miss_rate == r[0].metrics.miss_rate &&
                     r[1].metrics.brier == r[0].metrics.brier,
                 "metrics: emu minADE %.9g minFDE %.9g MR %.9g Brier %.9g vs cpu %.9g %.9g %.9g "
                 "%.9g",
                 r[1].metrics.min_ade, r[1].metrics.min_fde, r[1].metrics.miss_rate,
                 r[1].metrics.brier, r[0].metrics.min_ade, r[0].metrics.min_fde,
                 r[0].metrics.miss_rate, r[0].metrics.brier);
        T_EXPECT(r[1].cv.min_ade == r[0].cv.min_ade, "baseline");
        expect_same_file(dump[0], dump[1]);
    }
}

// ---- cuda without a GPU ------------------------------------------------------------------------

static void test_cuda_unavailable(void)
{
    QC_TEST ("train/eval: --device cuda without a GPU fails with a hint (API and binary)") {
        if (qc_device_cuda_count() > 0) {
            T_SKIP("a GPU is present (test_train_device_cuda covers it)");
            continue;
        }
        char dir[256];
        tmp_dir(dir, sizeof(dir), "cuda-missing");
        struct qc_config c;
        tiny_config(&c, QC_CONFIG_DEVICE_CUDA, true);
        const struct qc_train_opts to = {.cfg = &c, .out_dir = dir, .quiet = true};
        struct qc_trainer *t = NULL;
        const enum qc_status st = qc_trainer_create(&to, &t);
        T_EXPECT(st == QC_ERR_UNSUPPORTED, "trainer on cuda: %s (%s)", qc_status_str(st),
                 qc_error_last());
        T_EXPECT_STR_CONTAINS(qc_error_last(), "hint:");
        qc_trainer_destroy(t);
        struct stat sb;
        T_EXPECT(stat(dir, &sb) != 0, "nothing written to %s", dir);
        struct qc_eval_result r;
        const struct qc_eval_opts eo = {.cfg = &c, .synthetic_seed = 7, .quiet = true};
        T_EXPECT(qc_eval_run(&eo, &r) == QC_ERR_UNSUPPORTED, "eval on cuda: %s", qc_error_last());

        /* the binary: non-zero exit, the hint on stderr */
        char cmd[2048], err[512];
        snprintf(err, sizeof(err), "%s/cuda-missing.err", tmp_root);
        snprintf(cmd, sizeof(cmd),
                 "'%s/qctrain' train --preset cpu-smoke --device cuda --steps 1 --out '%s' "
                 ">/dev/null 2>'%s'",
                 QC_BINARY_DIR, dir, err);
        const int rc = system(cmd);
        T_EXPECT(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 0, "qctrain exit status %d", rc);
        char *text = read_file(err, NULL);
        T_EXPECT_STR_CONTAINS(text, "cuda");
        T_EXPECT_STR_CONTAINS(text, "hint:");
        free(text);
    }
}

// ---- cuda vs cpu (label gpu) -------------------------------------------------------------------

static void test_cuda(void)
{
    for (int fused = 0; fused < 2; fused++) {
        char name[128];
        snprintf(name, sizeof(name),
                 "train: cuda vs cpu losses within tolerance, two cuda runs bit-identical (%s)",
                 fused ? "fused" : "unfused");
        QC_TEST (name) {
            if (qc_device_cuda_count() == 0) {
                T_SKIP("no CUDA device (or a CPU-only build)");
                continue;
            }
            char dcpu[256], dc2[256], dc1[300];
            tmp_dir(dcpu, sizeof(dcpu), fused ? "ref-cpu-fused" : "ref-cpu-unfused");
            tmp_dir(dc2, sizeof(dc2), fused ? "cuda-fused" : "cuda-unfused");
            struct qc_config ccpu, ccuda;
            tiny_config(&ccpu, QC_CONFIG_DEVICE_CPU, fused);
            tiny_config(&ccuda, QC_CONFIG_DEVICE_CUDA, fused); /* device.tf32 off: fp32 GEMMs */
            if (!train_run(&ccpu, dcpu, NULL) || !train_run(&ccuda, dc2, NULL))
                continue;
            move_aside(dc2, dc1, sizeof(dc1)); /* the second cuda run in the same folder path */
            if (!train_run(&ccuda, dc2, NULL))
                continue;
            /* deterministic kernels (no atomics, fixed reduction orders): the same bits twice */
            expect_same_metrics(dc1, dc2);
            expect_same_ckpt(dc1, dc2, STEPS);
            /* Tolerances. Step 1 runs the initial weights on both: the losses differ only by
             * cuBLAS's fp32 summation order and the few-ulp transcendental functions (expf,
             * logf, sinf, ...), ~1e-6 relative on a loss of ~30: 1e-4 relative. Steps 2 and 3
             * run on weights after AdamW steps, which amplify tiny gradient differences:
             * m / (sqrt(v) + eps) is ~±1 for an element whose gradient is near zero, so a sign
             * flip moves that weight by ~lr (2e-3) instead of a tiny amount: 1e-2 relative. */
            struct step_values a[16], b[16];
            const int na = read_steps(dcpu, a, 16), nb = read_steps(dc1, b, 16);
            T_EXPECT(na == STEPS && nb == STEPS, "metrics lines %d, %d", na, nb);
            for (int i = 0; i < na && i < nb; i++) {
                const double rtol = i == 0 ? 1e-4 : 1e-2;
                T_EXPECT_NEAR(step_loss(&b[i]), step_loss(&a[i]), 0.0, rtol,
                              "step %d loss, cuda vs cpu (rtol %g)", i + 1, rtol);
            }
        }
    }
}

int main(int argc, char **argv)
{
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/qctrain-test-train-device-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
        const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
        if (probe != 0) {
            t_rm_rf(tmp_root);
            return probe;
        }
        test_cuda();
    } else {
        test_cuda_unavailable();
        test_emu_train();
        test_emu_eval();
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
