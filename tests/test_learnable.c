/*
 * test_learnable.c — the constant-velocity baseline of eval (src/train/eval.c) and issue 3's
 * "the motion must be learnable: a model trained on these scenes beats a constant-velocity
 * baseline on minADE".
 *
 * Default run (label cpu):
 *   - the baseline on hand-made agents: one moving at constant velocity (ADE = FDE = 0, with a
 *     heading different from the direction of motion and city-scale coordinates, so a wrong
 *     frame or a heading-for-velocity mix-up shows), one turning (ADE, FDE, MR computed by hand,
 *     also with a truncated future mask), non-focal agents ignored;
 *   - qc_eval_run reports the baseline on exactly the focal agents of the model's metrics, and
 *     the JSON line carries cv_minADE, cv_minFDE and cv_MR.
 * `test_learnable --learn` (labels cpu;slow): trains a small model on generated `typical` scenes
 * and checks that on held-out scenes (another seed) its minADE (K = 6, focal agents) is below
 * the constant-velocity ADE and its minFDE clearly below the constant-velocity FDE. The figures
 * are recorded in docs/BENCHMARKS.md ("Learnability").
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_testlib.h"
#include "qc_batch.h"
#include "qc_config.h"
#include "qc_qcnet.h"
#include "qc_train.h"
#include "testutil.h"

#define STEPS  110 /* history + future */
#define T_HIST 50
#define S_FUT  60

/* The learnability run (--learn), the command of docs/BENCHMARKS.md "Learnability": the
 * cpu-smoke model (D 32) with small radii, one agent-encoder layer instead of 2 and no dropout
 * (the most learning per CPU-second found: the second layer costs ~17 % of the step without
 * helping within these steps, dropout only slows a model this small), 320 steps of 2 scenes over
 * 64 training scenes (10 epochs, cosine LR from 2e-3 annealed to 0 over them), evaluated on 64
 * held-out scenes (seed train.seed + 1): about 2.3 CPU-minutes. Observed (2026-12-03, shared
 * 2-core VM, one thread), as ratios model / constant velocity:
 *   seed 2023 (this test): minADE 0.85, minFDE 0.56;  seed 7: 0.94, 0.60;
 *   seed 2023 with 400 steps: 0.92, 0.60;  after 160 steps: 1.08-1.26, 0.71-0.81.
 * The bars: minADE below constant velocity's (the ADE of the FDE-best mode against a baseline
 * that is nearly exact over the first second: the margin there is small by nature) and minFDE
 * clearly below, < 0.75 x (observed 0.56-0.60). Undertrained, at 160 steps, the model fails the
 * minADE bar; at 80 steps both.
 * The previous configuration (2 agent layers, dropout 0.1, 32 scenes, 480 steps, 8 CPU-minutes)
 * ended at minADE 0.93-0.99 x depending on the build, against a bar of 0.97. */
#define LEARN_BATCH        2
#define LEARN_SCENES       64
#define LEARN_LR           2e-3
#define LEARN_T_MAX        10 /* epochs = 320 x 2 / 64: the LR anneals to 0 at the end */
#define LEARN_STEPS        320
#define LEARN_AGENT_LAYERS 1
#define LEARN_VAL_SCENES   64
#define LEARN_MARGIN       1.00 /* minADE < cv ADE (observed 0.85-0.94) */
#define LEARN_FDE_MARGIN   0.75 /* minFDE < 0.75 x cv FDE (observed 0.56-0.60) */

// ---- helpers -----------------------------------------------------------------------------------

static char tmp_root[256];

/* A hand-made batch of A agents (one scene), zeroed: the fields the baseline and the
 * TargetBuilder read. Freed by hand_free. */
struct hand {
    struct qc_batch b;
};

static void hand_init(struct hand *h, int64_t A)
{
    memset(h, 0, sizeof *h);
    h->b.num_scenes = 1;
    h->b.num_agents = A;
    h->b.position = calloc((size_t)(A * STEPS * 3), sizeof(float));
    h->b.velocity = calloc((size_t)(A * STEPS * 3), sizeof(float));
    h->b.heading = calloc((size_t)(A * STEPS), sizeof(float));
    h->b.predict_mask = calloc((size_t)(A * STEPS), 1);
    h->b.valid_mask = calloc((size_t)(A * STEPS), 1);
    h->b.agent_category = calloc((size_t)A, 1);
    if (!h->b.position || !h->b.velocity || !h->b.heading || !h->b.predict_mask ||
        !h->b.valid_mask || !h->b.agent_category) {
        printf("out of memory\n");
        exit(1);
    }
}

static void hand_free(struct hand *h)
{
    free(h->b.position);
    free(h->b.velocity);
    free(h->b.heading);
    free(h->b.predict_mask);
    free(h->b.valid_mask);
    free(h->b.agent_category);
}

/* Agent a: observed on every step; future steps s < nfut are valid. At t = 49 it stands at the
 * world point o with heading th. Its future position at step s is o + R(rot)·local[s] (local
 * given by the caller in metres; rot the orientation of the local frame in the world), and its
 * velocity at 49 is R(rot)·(vlx, vly). History positions go back along the velocity. */
static void hand_agent(struct hand *h, int64_t a, uint8_t category, double ox, double oy, double th,
                       double rot, double vlx, double vly, double (*local)[2], int nfut)
{
    const double c = cos(rot), s = sin(rot);
    const double vx = c * vlx - s * vly, vy = s * vlx + c * vly;
    h->b.agent_category[a] = category;
    for (int t = 0; t < STEPS; t++) {
        float *p = h->b.position + (a * STEPS + t) * 3;
        float *v = h->b.velocity + (a * STEPS + t) * 3;
        if (t < T_HIST) {
            const double dt = 0.1 * (double)(t - (T_HIST - 1));
            p[0] = (float)(ox + dt * vx);
            p[1] = (float)(oy + dt * vy);
        } else {
            const double *l = local[t - T_HIST];
            p[0] = (float)(ox + c * l[0] - s * l[1]);
            p[1] = (float)(oy + s * l[0] + c * l[1]);
        }
        v[0] = (float)vx;
        v[1] = (float)vy;
        h->b.heading[a * STEPS + t] = (float)th;
        h->b.valid_mask[a * STEPS + t] = 1;
        h->b.predict_mask[a * STEPS + t] = t >= T_HIST && t - T_HIST < nfut;
    }
}

static void cv_metrics(const struct hand *h, struct qc_qcnet_metric_values *v)
{
    struct qc_qcnet_metrics mt;
    qc_qcnet_metrics_reset(&mt);
    const enum qc_status st = qc_eval_cv_update(&mt, &h->b);
    T_EXPECT(st == QC_OK, "%s", qc_error_last());
    qc_qcnet_metrics_compute(&mt, v);
}

// ---- the baseline on hand-made agents ----------------------------------------------------------

/* 1 m per step straight ahead for 30 steps, then 1 m per step to the left (a right-angle turn
 * at s = 29): local[s] = (s+1, 0) for s < 30, (30, s−29) for s >= 30. */
static void turning_path(double (*local)[2])
{
    for (int s = 0; s < S_FUT; s++) {
        local[s][0] = s < 30 ? (double)(s + 1) : 30.0;
        local[s][1] = s < 30 ? 0.0 : (double)(s - 29);
    }
}

static void test_baseline(void)
{
    QC_TEST ("cv: an agent at constant velocity has ADE = FDE = 0 (heading != direction)") {
        /* heading −2.0 rad, motion along −1.6 rad at 7.3 m/s, city-scale coordinates: the
         * prediction must use the velocity for the motion and the heading for the frame */
        double local[S_FUT][2];
        for (int s = 0; s < S_FUT; s++) {
            local[s][0] = 0.73 * (double)(s + 1);
            local[s][1] = 0.0;
        }
        struct hand h;
        hand_init(&h, 1);
        hand_agent(&h, 0, 3, 4521.25, -1873.5, -2.0, -1.6, 7.3, 0.0, local, S_FUT);
        struct qc_qcnet_metric_values v;
        cv_metrics(&h, &v);
        T_EXPECT_EQ_I64(v.count, 1, "one focal agent");
        /* fp32 positions near 5 km carry ~5e-4 m of rounding */
        T_EXPECT_NEAR(v.min_ade, 0.0, 2e-3, 0.0, "ADE");
        T_EXPECT_NEAR(v.min_fde, 0.0, 2e-3, 0.0, "FDE");
        T_EXPECT_NEAR(v.miss_rate, 0.0, 0.0, 0.0, "MR");
        /* the prediction itself, in the agent frame: the velocity rotated by −heading */
        float loc[S_FUT * 2];
        qc_eval_cv_predict(h.b.heading, h.b.velocity, loc);
        const double rel = -1.6 - -2.0; /* direction of motion in the agent frame */
        T_EXPECT_NEAR(loc[0], 0.73 * cos(rel), 1e-6, 1e-6, "x at s = 0");
        T_EXPECT_NEAR(loc[1], 0.73 * sin(rel), 1e-6, 1e-6, "y at s = 0");
        T_EXPECT_NEAR(loc[59 * 2], 60 * 0.73 * cos(rel), 1e-5, 1e-6, "x at s = 59");
        T_EXPECT_NEAR(loc[59 * 2 + 1], 60 * 0.73 * sin(rel), 1e-5, 1e-6, "y at s = 59");
        hand_free(&h);
    }

    QC_TEST ("cv: a turning agent has the ADE, FDE and MR computed by hand") {
        /* 10 m/s = 1 m per step along the heading (0.7 rad), then a right-angle left turn at
         * s = 29. Prediction (s+1, 0); error 0 for s < 30, |(s−29, −(s−29))| = √2·(s−29) for
         * s = 30..59: ADE = √2·(1+…+30)/60 = √2·465/60 = 7.75·√2 ≈ 10.960, FDE = 30·√2 ≈
         * 42.43, MR = 1. */
        double local[S_FUT][2];
        turning_path(local);
        struct hand h;
        hand_init(&h, 1);
        hand_agent(&h, 0, 3, 812.0, 2210.5, 0.7, 0.7, 10.0, 0.0, local, S_FUT);
        struct qc_qcnet_metric_values v;
        cv_metrics(&h, &v);
        T_EXPECT_EQ_I64(v.count, 1, "one focal agent");
        T_EXPECT_NEAR(v.min_ade, 7.75 * sqrt(2.0), 2e-3, 0.0, "ADE");
        T_EXPECT_NEAR(v.min_fde, 30.0 * sqrt(2.0), 2e-3, 0.0, "FDE");
        T_EXPECT_NEAR(v.miss_rate, 1.0, 0.0, 0.0, "MR");
        hand_free(&h);
    }

    QC_TEST ("cv: the future mask: ADE over valid steps, FDE at the last valid one") {
        /* the turning agent, future valid for s < 40 only: errors √2·k for k = 1..10, so ADE =
         * √2·55/40, FDE = 10·√2 (> 2 m: a miss) */
        double local[S_FUT][2];
        turning_path(local);
        struct hand h;
        hand_init(&h, 1);
        hand_agent(&h, 0, 3, -350.0, 95.0, -2.5, -2.5, 10.0, 0.0, local, 40);
        struct qc_qcnet_metric_values v;
        cv_metrics(&h, &v);
        T_EXPECT_EQ_I64(v.count, 1, "one focal agent");
        T_EXPECT_NEAR(v.min_ade, sqrt(2.0) * 55.0 / 40.0, 2e-3, 0.0, "ADE");
        T_EXPECT_NEAR(v.min_fde, 10.0 * sqrt(2.0), 2e-3, 0.0, "FDE");
        T_EXPECT_NEAR(v.miss_rate, 1.0, 0.0, 0.0, "MR");
        hand_free(&h);
    }

    QC_TEST ("cv: only focal agents with a valid future count; the mean is over them") {
        /* agent 0: focal, straight (ADE 0); agent 1: focal, turning (ADE 7.75√2); agent 2:
         * scored (category 2), turning: ignored; agent 3: focal but no valid future: ignored */
        double straight[S_FUT][2], turn[S_FUT][2];
        for (int s = 0; s < S_FUT; s++) {
            straight[s][0] = 1.2 * (double)(s + 1);
            straight[s][1] = 0.0;
        }
        turning_path(turn);
        struct hand h;
        hand_init(&h, 4);
        hand_agent(&h, 0, 3, 10.0, 20.0, 1.0, 1.0, 12.0, 0.0, straight, S_FUT);
        hand_agent(&h, 1, 3, -40.0, 5.0, 3.0, 3.0, 10.0, 0.0, turn, S_FUT);
        hand_agent(&h, 2, 2, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, turn, S_FUT);
        hand_agent(&h, 3, 3, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, turn, 0);
        struct qc_qcnet_metric_values v;
        cv_metrics(&h, &v);
        T_EXPECT_EQ_I64(v.count, 2, "focal agents with a future");
        T_EXPECT_NEAR(v.min_ade, 7.75 * sqrt(2.0) / 2.0, 2e-3, 0.0, "mean ADE");
        T_EXPECT_NEAR(v.min_fde, 30.0 * sqrt(2.0) / 2.0, 2e-3, 0.0, "mean FDE");
        T_EXPECT_NEAR(v.miss_rate, 0.5, 0.0, 0.0, "MR");
        /* a precomputed target (the loader's) gives the same figures */
        float *target = malloc(4 * S_FUT * 4 * sizeof(float));
        if (target) {
            qc_batch_target(&h.b, 0, 4, target);
            h.b.target = target;
            struct qc_qcnet_metric_values v2;
            cv_metrics(&h, &v2);
            T_EXPECT(v2.min_ade == v.min_ade && v2.min_fde == v.min_fde, "%.9g %.9g vs %.9g %.9g",
                     v2.min_ade, v2.min_fde, v.min_ade, v.min_fde);
            h.b.target = NULL;
            free(target);
        }
        hand_free(&h);
    }
}

// ---- eval reports the baseline -----------------------------------------------------------------

/* The cpu-smoke preset with small radii and time spans (as test_train's tiny model). */
static void small_config(struct qc_config *cfg)
{
    t_small_smoke_config(cfg);
    cfg->save_every = 0;
    cfg->loader_threads = 2;
    cfg->prefetch_batches = 2;
}

static void test_eval_reports(void)
{
    QC_TEST ("eval: the baseline covers the model's focal agents; JSON has cv_minADE/FDE/MR") {
        struct qc_config cfg;
        small_config(&cfg);
        const struct qc_eval_opts eo = {.cfg = &cfg,
                                        .batch_size = 2,
                                        .synthetic_seed = 4242,
                                        .synthetic_scenes = 3,
                                        .quiet = true};
        struct qc_eval_result r;
        const enum qc_status st = qc_eval_run(&eo, &r);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        if (st != QC_OK)
            continue;
        T_EXPECT_EQ_I64(r.metrics.count, 3, "one focal agent per scene");
        T_EXPECT_EQ_I64(r.cv.count, r.metrics.count, "same agents");
        /* generated focal agents follow lanes with curvature and speed changes: the baseline
         * is neither perfect nor absurd */
        T_EXPECT(r.cv.min_ade > 0.0 && r.cv.min_ade < 20.0, "cv ADE %g", r.cv.min_ade);
        T_EXPECT(r.cv.min_fde >= 0.0 && r.cv.miss_rate >= 0.0 && r.cv.miss_rate <= 1.0,
                 "cv FDE %g MR %g", r.cv.min_fde, r.cv.miss_rate);
        char buf[2048], key[64];
        qc_eval_format_json(&r, buf, sizeof(buf));
        snprintf(key, sizeof(key), "\"cv_minADE\":%.9g,", r.cv.min_ade);
        T_EXPECT_STR_CONTAINS(buf, key);
        snprintf(key, sizeof(key), "\"cv_minFDE\":%.9g,", r.cv.min_fde);
        T_EXPECT_STR_CONTAINS(buf, key);
        snprintf(key, sizeof(key), "\"cv_MR\":%.9g,", r.cv.miss_rate);
        T_EXPECT_STR_CONTAINS(buf, key);
    }
}

// ---- learnability (slow) -----------------------------------------------------------------------

static void test_learnable(void)
{
    QC_TEST ("learnable: a small model trained on typical scenes beats constant velocity") {
        struct qc_config cfg;
        small_config(&cfg);
        cfg.batch_size = LEARN_BATCH;
        cfg.grad_accum = 1;
        cfg.synthetic_scenes = LEARN_SCENES;
        cfg.lr = LEARN_LR;
        cfg.t_max = LEARN_T_MAX;
        cfg.steps = LEARN_STEPS;
        cfg.num_agent_layers = LEARN_AGENT_LAYERS;
        cfg.dropout = 0.0;
        char dir[512];
        snprintf(dir, sizeof(dir), "%s/learn", tmp_root);
        const struct qc_train_opts to = {.cfg = &cfg, .out_dir = dir, .quiet = true};
        struct qc_trainer *t = NULL;
        enum qc_status st = qc_trainer_create(&to, &t);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        if (!t)
            continue;
        /* held out: another seed than the training scenes (train.seed), the scenes of
         * `train --eval-every` */
        const struct qc_eval_opts eo = {.cfg = &cfg,
                                        .synthetic_seed = (uint64_t)cfg.seed + 1,
                                        .synthetic_scenes = LEARN_VAL_SCENES,
                                        .quiet = true};
        struct qc_eval_result r;
        st = qc_trainer_run(t);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        if (st == QC_OK)
            st = qc_eval_model(qc_trainer_model(t), qc_trainer_alloc(t), &eo, &r);
        T_EXPECT(st == QC_OK, "%s", qc_error_last());
        if (st == QC_OK) {
            printf("  held-out %lld focal agents: model minADE %.3f minFDE %.3f MR %.3f | "
                   "constant velocity ADE %.3f FDE %.3f MR %.3f\n",
                   (long long)r.metrics.count, r.metrics.min_ade, r.metrics.min_fde,
                   r.metrics.miss_rate, r.cv.min_ade, r.cv.min_fde, r.cv.miss_rate);
            T_EXPECT_EQ_I64(r.cv.count, r.metrics.count, "same agents");
            T_EXPECT(r.metrics.min_ade < LEARN_MARGIN * r.cv.min_ade,
                     "model minADE %.3f is not below constant velocity %.3f", r.metrics.min_ade,
                     r.cv.min_ade);
            T_EXPECT(r.metrics.min_fde < LEARN_FDE_MARGIN * r.cv.min_fde,
                     "model minFDE %.3f is not clearly below constant velocity %.3f",
                     r.metrics.min_fde, r.cv.min_fde);
        }
        qc_trainer_destroy(t);
    }
}

int main(int argc, char **argv)
{
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/qctrain-test-learnable-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "--learn") == 0) {
        test_learnable();
    } else {
        test_baseline();
        test_eval_reports();
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
