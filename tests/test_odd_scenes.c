/*
 * test_odd_scenes.c — scenes the qcshard format allows but real data rarely shows, through the
 * trainer and the evaluator on the cpu and emu backends, both attention implementations
 * (issue 17, item 5 and 6; docs/RELIABILITY.md "Odd but valid scenes"):
 *   - no map (P = 0, Pt = 0): every map edge set (pt2pl, pl2pl, pl2a, pl2m) is empty;
 *   - no predicted agent: the decoder's t2m, pl2m, a2m and m2m edge sets are empty;
 *   - no valid agent step: t, a2a and every decoder edge set are empty;
 *   - extreme coordinates (agents and lanes 10^5..10^7 m apart): every radius edge set empty;
 *   - no focal agent: eval reports the metrics as not available.
 * An attention layer over an empty edge set is the identity plus its residual path (QCNET.md
 * §3.3 step 8: u = 0, steps 9-13 still run), so the losses are finite; a batch with nothing to
 * predict has the loss of QCNET.md §6.1 (every normalisation is max(1, count)): 0 for its
 * regression and classification terms. The emu backend gives the cpu bits.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_config.h"
#include "qc_qcshard.h"
#include "qc_train.h"
#include "testutil.h"

static char tmp_root[256];

// ---- scenes ------------------------------------------------------------------------------------

enum odd_kind {
    ODD_NO_MAP,
    ODD_NO_PREDICTED,
    ODD_NO_VALID_STEPS,
    ODD_EXTREME_COORDS,
    ODD_NO_FOCAL,
    ODD_COUNT
};

static const char *const odd_names[ODD_COUNT] = {"no map polygons (P = 0)", "no predicted agent",
                                                 "no valid agent step", "extreme coordinates",
                                                 "no focal agent"};

/* A scene of 3 agents (a fragment, the focal agent, the AV) and 3 lanes of 2 points each, as
 * tests/qcshard_fixtures.h's tiny scene, changed by kind; scene index i shifts the positions so
 * two scenes of a batch differ. */
static void odd_scene(enum odd_kind kind, int i, struct qc_scene *s)
{
    const int64_t P = kind == ODD_NO_MAP ? 0 : 3;
    struct qc_scene_mut m;
    if (qc_scene_alloc(s, &m, 3, P, 2 * P, P) != QC_OK)
        T_FATAL("scene alloc: %s", qc_error_last());
    snprintf(s->scenario_id, sizeof(s->scenario_id), "odd-%d-%d", (int)kind, i);
    snprintf(s->city, sizeof(s->city), "austin");
    s->av_index = 2;
    const char *ids[3] = {"1001", "1002", "AV"};
    uint8_t cat[3] = {0, 3, 1};
    if (kind == ODD_NO_FOCAL)
        cat[1] = 2;
    /* extreme: 10^7 m from the origin and 10^5 m apart, beyond every radius */
    const float x0 = kind == ODD_EXTREME_COORDS ? 1e7f : 1000.0f + 7.0f * (float)i;
    const float dy = kind == ODD_EXTREME_COORDS ? 1e5f : 3.0f;
    for (int a = 0; a < 3; a++) {
        snprintf(m.agent_id[a], QC_AGENT_ID_MAX, "%s", ids[a]);
        m.agent_type[a] = (uint8_t)a;
        m.agent_category[a] = cat[a];
        const int t0 = a == 0 ? 5 : 0, t1 = a == 0 ? 30 : 109;
        for (int t = 0; t < QC_SCENE_STEPS; t++) {
            int raw = t >= t0 && t <= t1;
            if (kind == ODD_NO_VALID_STEPS)
                raw = 0;
            const int prev = raw && t - 1 >= t0 && t - 1 <= t1;
            const int k = a * QC_SCENE_STEPS + t;
            m.valid_mask[k] = (uint8_t)(t == 0 ? 0 : (t < 50 ? raw && prev : raw));
            m.predict_mask[k] =
                (uint8_t)(kind != ODD_NO_PREDICTED && t >= 50 && raw && (49 >= t0 && 49 <= t1));
            if (!raw)
                continue;
            m.position[3 * k + 0] = x0 + (0.5f + 0.1f * (float)a) * (float)t;
            m.position[3 * k + 1] = 2000.0f + dy * (float)a + 0.02f * (float)(t * t);
            m.heading[k] = 0.1f * (float)a;
            m.velocity[3 * k + 0] = 5.0f;
            m.velocity[3 * k + 1] = 0.4f * (float)t;
        }
    }
    for (int64_t p = 0; p < P; p++) {
        const float px = kind == ODD_EXTREME_COORDS ? -1e7f : 1000.0f;
        m.pl_position[3 * p + 0] = px;
        m.pl_position[3 * p + 1] = 2000.0f + (kind == ODD_EXTREME_COORDS ? 1e5f : 3.5f) * (float)p;
        m.pl_is_intersection[p] = 1;
        for (int j = 0; j < 2; j++) {
            const int64_t q = 2 * p + j;
            m.pt_position[3 * q + 0] = px + 10.0f * (float)j;
            m.pt_position[3 * q + 1] = m.pl_position[3 * p + 1];
            m.pt_magnitude[q] = 10.0f;
            m.pt_type[q] = (uint8_t)(j ? 16 : 2);
            m.pt_side[q] = (uint8_t)(j ? 2 : 0);
            m.pt2pl[q] = q;
            m.pt2pl[2 * P + q] = p;
        }
        m.pl2pl_edge[p] = p;
        m.pl2pl_edge[P + p] = (p + 1) % P;
        m.pl2pl_type[p] = 2;
    }
    if (qc_scene_validate(s, NULL, 0) != QC_OK)
        T_FATAL("%s: the test scene is not valid: %s", odd_names[kind], qc_error_last());
}

/* A qcshard of 2 scenes of this kind. */
static void odd_file(enum odd_kind kind, char *path, size_t n)
{
    snprintf(path, n, "%s/odd-%d.qcshard", tmp_root, (int)kind);
    struct qc_scene sc[2];
    for (int i = 0; i < 2; i++)
        odd_scene(kind, i, &sc[i]);
    if (qc_qcshard_write_file(path, sc, 2) != QC_OK)
        T_FATAL("write %s: %s", path, qc_error_last());
    for (int i = 0; i < 2; i++)
        qc_scene_free(&sc[i]);
}

/* cpu-smoke's model, 2 scenes per batch, small radii. */
static void odd_config(struct qc_config *cfg, enum qc_config_device dev, bool fused)
{
    qc_config_defaults(cfg);
    if (qc_config_apply_preset(cfg, "cpu-smoke") != QC_OK)
        T_FATAL("preset cpu-smoke: %s", qc_error_last());
    cfg->batch_size = 2;
    cfg->grad_accum = 1;
    cfg->steps = 2;
    cfg->save_every = 0;
    cfg->loader_threads = 1;
    cfg->alloc_trace = false;
    cfg->attention = fused ? QC_ATTENTION_FUSED : QC_ATTENTION_UNFUSED;
    cfg->device_kind = dev;
}

// ---- train and eval ----------------------------------------------------------------------------

struct odd_result {
    double loss[2]; /* step losses */
    struct qc_eval_result ev;
};

static bool odd_run(enum odd_kind kind, const char *data, enum qc_config_device dev, bool fused,
                    struct odd_result *out)
{
    struct qc_config cfg;
    odd_config(&cfg, dev, fused);
    char run[512];
    snprintf(run, sizeof(run), "%s/run-%d-%d-%d", tmp_root, (int)kind, (int)dev, (int)fused);
    t_rm_rf(run);
    const char *files[1] = {data};
    const struct qc_train_opts to = {
        .cfg = &cfg, .data = files, .ndata = 1, .out_dir = run, .quiet = true};
    struct qc_trainer *t = NULL;
    enum qc_status st = qc_trainer_create(&to, &t);
    for (int s = 0; s < 2 && st == QC_OK; s++) {
        struct qc_step_metrics m;
        st = qc_trainer_step(t, &m);
        out->loss[s] = m.loss;
    }
    qc_trainer_destroy(t);
    if (st != QC_OK) {
        T_FAIL_AT("%s: train on %s: %s", odd_names[kind], qc_train_device_str(dev),
                  qc_error_last());
        return false;
    }
    const struct qc_eval_opts eo = {
        .cfg = &cfg, .data = files, .ndata = 1, .batch_size = 2, .quiet = true};
    st = qc_eval_run(&eo, &out->ev);
    if (st != QC_OK) {
        T_FAIL_AT("%s: eval on %s: %s", odd_names[kind], qc_train_device_str(dev), qc_error_last());
        return false;
    }
    return true;
}

static void test_odd(enum odd_kind kind)
{
    for (int fused = 0; fused < 2; fused++) {
        char name[160];
        snprintf(name, sizeof(name), "odd scene: %s: train and eval on cpu and emu (%s)",
                 odd_names[kind], fused ? "fused" : "unfused");
        QC_TEST (name) {
            char data[512];
            odd_file(kind, data, sizeof(data));
            struct odd_result r[2];
            if (!odd_run(kind, data, QC_CONFIG_DEVICE_CPU, fused, &r[0]) ||
                !odd_run(kind, data, QC_CONFIG_DEVICE_EMU, fused, &r[1]))
                continue;
            for (int s = 0; s < 2; s++) {
                T_EXPECT(isfinite(r[0].loss[s]), "step %d loss %g", s + 1, r[0].loss[s]);
                T_EXPECT(r[0].loss[s] == r[1].loss[s], "step %d loss: cpu %.9g, emu %.9g", s + 1,
                         r[0].loss[s], r[1].loss[s]);
            }
            T_EXPECT(isfinite(r[0].ev.loss), "eval loss %g", r[0].ev.loss);
            T_EXPECT(r[0].ev.loss == r[1].ev.loss, "eval loss: cpu %.9g, emu %.9g", r[0].ev.loss,
                     r[1].ev.loss);
            const bool nothing = kind == ODD_NO_PREDICTED || kind == ODD_NO_VALID_STEPS;
            if (nothing) /* QCNET.md §6.1: max(1, count) normalisations, nothing to regress */
                T_EXPECT(r[0].loss[0] == 0 && r[0].ev.loss == 0, "loss %g, eval loss %g",
                         r[0].loss[0], r[0].ev.loss);
            else
                T_EXPECT(r[0].loss[0] > 0, "loss %g", r[0].loss[0]);
            const bool no_agents = nothing || kind == ODD_NO_FOCAL;
            T_EXPECT_EQ_I64(r[0].ev.metrics.count, no_agents ? 0 : 2, "evaluated focal agents");
            if (no_agents) /* item 6: not available, not a perfect 0 */
                T_EXPECT(isnan(r[0].ev.metrics.min_ade) && isnan(r[0].ev.metrics.min_fde) &&
                             isnan(r[0].ev.metrics.miss_rate) && isnan(r[0].ev.metrics.brier),
                         "metrics minADE %g minFDE %g MR %g Brier %g", r[0].ev.metrics.min_ade,
                         r[0].ev.metrics.min_fde, r[0].ev.metrics.miss_rate, r[0].ev.metrics.brier);
            else
                T_EXPECT(isfinite(r[0].ev.metrics.min_ade) && r[0].ev.metrics.min_ade > 0,
                         "minADE %g", r[0].ev.metrics.min_ade);
        }
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/qctrain-test-odd-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    for (int k = 0; k < ODD_COUNT; k++)
        test_odd((enum odd_kind)k);
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
