/*
 * test_planner.c — planning without a run (src/train/plan_run.c, qc_train.h's planner session,
 * the API `qctrain plan` and `qctrain tune` use; qc_plan.h, "Planning without a run"):
 *   - the session's plan of a run's first batch predicts that run's measured peak from the
 *     configuration alone: kept whole exactly (the dry run replays every block's memory spec,
 *     src/plan/README.md), under a budget within PLAN_ERR (3 %; the docs state 5 %) and as the
 *     run's own plan predicted it;
 *   - hardware figures and planner parameters given per call: no tiers leaves only recompute,
 *     forced keep gives the peak kept whole, a cost model given by the caller (twice as slow,
 *     the same transients) doubles the predicted time and keeps the bytes; the same batch is
 *     described once;
 *   - the largest batch: kept whole <= under the planner, each one fitting and the next not;
 *   - `qctrain plan --json`: the documented fields, a budget under one scene's smallest plan
 *     ("fits": false, largest 0), bad arguments refused with exit 2.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "config_testlib.h"
#include "proc_testlib.h"
#include "qc_config.h"
#include "qc_plan.h"
#include "qc_train.h"
#include "testutil.h"

static char tmp_root[256];
static const char qctrain[] = QC_BINARY_DIR "/qctrain";

/* cpu-smoke with small radii: a step of one scene in about a second. */
static void small_config(struct qc_config *cfg)
{
    t_small_smoke_config(cfg);
    cfg->batch_size = 1;
    cfg->grad_accum = 1;
    cfg->synthetic_scenes = 4;
    cfg->shuffle = false;
    cfg->save_every = 0;
    cfg->loader_threads = 1;
    cfg->alloc_trace = false;
    cfg->offload_host_capacity = (uint64_t)512 << 20;
}

/* One training step of cfg; its metrics. */
static bool one_step(const struct qc_config *cfg, const char *name, struct qc_step_metrics *m)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, name);
    t_rm_rf(dir);
    const struct qc_train_opts to = {.cfg = cfg, .out_dir = dir, .quiet = true};
    struct qc_trainer *t = NULL;
    enum qc_status st = qc_trainer_create(&to, &t);
    if (st == QC_OK)
        st = qc_trainer_step(t, m);
    qc_trainer_destroy(t);
    T_EXPECT(st == QC_OK, "%s: %s", name, qc_error_last());
    t_rm_rf(dir);
    return st == QC_OK;
}

/* The planner's accuracy as gated: a predicted peak within 3 % of the measured one (the docs
 * promise 5 %; on the CPU the step planned under a budget here is predicted exactly, as every
 * step of the runs in test_train_memory and test_memory_figures is). */
#define PLAN_ERR 0.03

static double rel(double a, double b)
{
    return fabs(a - b) / b;
}

static void test_session(void)
{
    QC_TEST ("planner session: a run's first batch planned from the configuration alone "
             "predicts its measured peak, kept whole exactly and under a budget within 3 %") {
        struct qc_config cfg;
        small_config(&cfg);
        struct qc_step_metrics m = {0};
        if (!one_step(&cfg, "keep", &m))
            continue;
        struct qc_train_planner *pl = NULL;
        T_EXPECT(qc_train_planner_create(&cfg, NULL, 0, NULL, &pl) == QC_OK, "%s", qc_error_last());
        if (!pl)
            continue;
        struct qc_plan_result r = {0};
        const struct qc_plan_program *prog = NULL;
        T_EXPECT(qc_train_planner_plan_at(pl, 0, 1, &r, &prog) == QC_OK, "%s", qc_error_last());
        printf("  kept whole: predicted %" PRIu64 ", measured %" PRIu64 " (%.2f %%)\n", r.peak,
               m.peak_active_bytes, 100.0 * rel((double)r.peak, (double)m.peak_active_bytes));
        T_EXPECT(r.peak == r.keep_peak && r.fits, "no budget: everything kept");
        /* kept whole, the dry run's program is the step's allocations event for event */
        T_EXPECT(r.peak == m.peak_active_bytes,
                 "kept whole: predicted %" PRIu64 " vs measured %" PRIu64 " (%+.2f %%)", r.peak,
                 m.peak_active_bytes, 100.0 * ((double)r.peak / (double)m.peak_active_bytes - 1));
        /* under 70 % of that: the same batch planned under a budget, then run under it. The
         * margin is 10 % (default 2 %): at this tiny model's sizes most tensors sit in the
         * allocator's small pool, whose fragmentation ran the step out at 2 % (re-planned; the
         * step's peak then mixes two plans and does not compare) */
        struct qc_config cb = cfg;
        cb.device_budget = m.peak_active_bytes * 7 / 10;
        cb.plan_margin = 0.10;
        struct qc_plan_params par;
        qc_train_plan_params(&cb, &par);
        struct qc_plan_result rb = {0};
        T_EXPECT(qc_train_planner_plan_with(pl, 0, 1, NULL, &par, &rb, NULL) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(rb.fits && rb.peak <= rb.target && rb.peak < r.peak,
                 "fits %d, peak %" PRIu64 " <= target %" PRIu64, (int)rb.fits, rb.peak, rb.target);
        struct qc_plan_hw hw;
        qc_train_plan_hw(&cb, &hw);
        T_EXPECT(qc_plan_check(prog, qc_train_planner_cost(pl), &hw, &par, &rb) == QC_OK, "%s",
                 qc_error_last());
        struct qc_step_metrics mb = {0};
        if (one_step(&cb, "budget", &mb)) {
            printf("  budget %" PRIu64 ": session %" PRIu64 ", the run's plan %" PRIu64
                   ", measured %" PRIu64 " (%.2f %%), re-plans %" PRId64 "\n",
                   cb.device_budget, rb.peak, mb.predicted_peak_bytes, mb.peak_active_bytes,
                   100.0 * rel((double)rb.peak, (double)mb.peak_active_bytes), mb.replans);
            T_EXPECT(mb.peak_device_bytes <= cb.device_budget, "measured peak over the budget");
            T_EXPECT(mb.replans == 0, "the step ran out and re-planned: its peak does not compare");
            T_EXPECT(mb.predicted_peak_bytes == rb.peak,
                     "the run planned %" PRIu64 ", the session %" PRIu64, mb.predicted_peak_bytes,
                     rb.peak);
            T_EXPECT(rel((double)rb.peak, (double)mb.peak_active_bytes) <= PLAN_ERR,
                     "session %" PRIu64 " vs measured %" PRIu64 " (%+.2f %%, more than %.0f %%)",
                     rb.peak, mb.peak_active_bytes,
                     100.0 * ((double)rb.peak / (double)mb.peak_active_bytes - 1), 100 * PLAN_ERR);
        }
        qc_plan_result_free(&rb);
        qc_plan_result_free(&r);
        qc_train_planner_destroy(pl);
    }

    QC_TEST ("planner session: hardware figures, parameters and a cost model per call; one "
             "description per batch") {
        struct qc_config cfg;
        small_config(&cfg);
        struct qc_train_planner *pl = NULL;
        T_EXPECT(qc_train_planner_create(&cfg, NULL, 0, NULL, &pl) == QC_OK, "%s", qc_error_last());
        if (!pl)
            continue;
        struct qc_plan_result keep = {0}, r = {0};
        const struct qc_plan_program *p1 = NULL, *p2 = NULL;
        T_EXPECT(qc_train_planner_plan_at(pl, 1, 2, &keep, &p1) == QC_OK, "%s", qc_error_last());
        const int32_t nev = p1 ? p1->nev : 0;
        struct qc_plan_params par;
        qc_train_plan_params(&cfg, &par);
        par.budget = keep.keep_peak / 2;
        /* no tier: only recompute can lower the peak */
        struct qc_plan_hw hw;
        qc_train_plan_hw(&cfg, &hw);
        hw.host_capacity = hw.nvme_capacity = 0;
        T_EXPECT(qc_train_planner_plan_with(pl, 1, 2, &hw, &par, &r, &p2) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(p2 == p1 && p2->nev == nev, "the same batch is described once");
        T_EXPECT(r.host_bytes == 0 && r.nvme_bytes == 0 && r.recompute_bytes > 0,
                 "no tier: host %" PRIu64 ", NVMe %" PRIu64 ", recompute %" PRIu64, r.host_bytes,
                 r.nvme_bytes, r.recompute_bytes);
        qc_plan_result_free(&r);
        /* forced keep under the same budget: the peak kept whole, not fitting */
        par.mode = QC_PLAN_MODE_KEEP;
        T_EXPECT(qc_train_planner_plan_with(pl, 1, 2, NULL, &par, &r, NULL) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(r.peak == keep.keep_peak && !r.fits, "forced keep: peak %" PRIu64, r.peak);
        qc_plan_result_free(&r);
        /* a caller's cost model: every block twice as slow -> twice the time, same bytes */
        struct qc_plan_cost *slow = NULL;
        T_EXPECT(qc_plan_cost_create(&slow) == QC_OK, "%s", qc_error_last());
        const int32_t nb = p1 ? p1->nblocks : 0;
        struct qc_plan_measure *meas = calloc((size_t)(nb > 0 ? nb : 1), sizeof *meas);
        double t_blocks = 0;
        for (int32_t b = 0; p1 && meas && b < nb; b++) {
            const struct qc_plan_cost *c0 = qc_train_planner_cost(pl);
            meas[b].t_fwd = 2.0 * qc_plan_cost_time(c0, p1, b, 0);
            meas[b].t_bwd = 2.0 * qc_plan_cost_time(c0, p1, b, 1);
            t_blocks += meas[b].t_fwd + meas[b].t_bwd;
        }
        if (slow && meas && p1) {
            qc_plan_cost_update(slow, p1, meas, t_blocks, true);
            qc_train_planner_use_cost(pl, slow);
            T_EXPECT(qc_train_planner_plan_at(pl, 1, 2, &r, NULL) == QC_OK, "%s", qc_error_last());
            printf("  step kept whole: %.4f s built in, %.4f s with the slow model\n",
                   keep.keep_step_s, r.keep_step_s);
            T_EXPECT(rel((double)r.keep_peak, (double)keep.keep_peak) <= 1e-3,
                     "the same transients, the same bytes: %" PRIu64 " vs %" PRIu64, r.keep_peak,
                     keep.keep_peak);
            T_EXPECT(rel(r.keep_step_s, 2.0 * keep.keep_step_s) <= 0.02,
                     "twice as slow: %.4f vs %.4f", r.keep_step_s, keep.keep_step_s);
            qc_plan_result_free(&r);
            qc_train_planner_use_cost(pl, NULL);
        }
        free(meas);
        qc_plan_cost_destroy(slow);
        /* bad requests */
        T_EXPECT(qc_train_planner_plan_at(pl, 0, 0, &r, NULL) == QC_ERR_INVALID, "batch of 0");
        qc_plan_result_free(&keep);
        qc_train_planner_destroy(pl);
    }

    QC_TEST ("planner session: the largest batch, kept whole and under the planner") {
        struct qc_config cfg;
        small_config(&cfg);
        struct qc_train_planner *pl = NULL;
        T_EXPECT(qc_train_planner_create(&cfg, NULL, 0, NULL, &pl) == QC_OK, "%s", qc_error_last());
        if (!pl)
            continue;
        /* a budget of about 3 scenes kept whole */
        struct qc_plan_result r = {0};
        T_EXPECT(qc_train_planner_plan(pl, 3, &r, NULL) == QC_OK, "%s", qc_error_last());
        struct qc_plan_params par, keep;
        qc_train_plan_params(&cfg, &par);
        par.budget = (uint64_t)((double)r.keep_peak / (1.0 - par.margin)) + 4096;
        keep = par;
        keep.mode = QC_PLAN_MODE_KEEP;
        qc_plan_result_free(&r);
        int64_t lk = -1, la = -1;
        T_EXPECT(qc_train_planner_largest_with(pl, 32, NULL, &keep, &lk) == QC_OK &&
                     qc_train_planner_largest_with(pl, 32, NULL, &par, &la) == QC_OK,
                 "%s", qc_error_last());
        printf("  budget %" PRIu64 ": %" PRId64 " scenes kept whole, %" PRId64
               " under the planner\n",
               par.budget, lk, la);
        T_EXPECT(lk >= 3 && la > lk, "kept %" PRId64 ", planned %" PRId64, lk, la);
        const struct qc_plan_params *modes[2] = {&keep, &par};
        const int64_t best[2] = {lk, la};
        for (int k = 0; k < 2; k++) {
            if (best[k] < 1 || best[k] >= 32)
                continue;
            for (int64_t b = best[k]; b <= best[k] + 1; b++) {
                T_EXPECT(qc_train_planner_plan_with(pl, 0, b, NULL, modes[k], &r, NULL) == QC_OK,
                         "%s", qc_error_last());
                T_EXPECT(r.fits == (b == best[k]), "%s, %" PRId64 " scenes: fits %d",
                         k ? "planner" : "kept whole", b, (int)r.fits);
                qc_plan_result_free(&r);
            }
        }
        qc_train_planner_destroy(pl);
    }
}

/* Runs `qctrain plan` with args; returns the exit code and stdout (malloc'd). */
static int plan_cli(const char *const *args, char **out)
{
    char log[512];
    snprintf(log, sizeof log, "%s/plan.out", tmp_root);
    return t_run_output(qctrain, args, log, out);
}

static void test_cli(void)
{
    QC_TEST ("qctrain plan --json: the documented fields; a budget under one scene; bad "
             "arguments") {
        static const char *const ok[] = {"--preset", "cpu-smoke", "plan",   "--batch-size",
                                         "2",        "--budget",  "200MiB", "--max-batch",
                                         "8",        "--json",    NULL};
        char *out = NULL;
        int rc = plan_cli(ok, &out);
        T_EXPECT(rc == 0, "exit %d: %s", rc, out ? out : "");
        cJSON *j = out ? cJSON_Parse(out) : NULL;
        T_EXPECT(j != NULL, "JSON: %s", out ? out : "");
        static const char *const keys[] = {"device",
                                           "batch_size",
                                           "budget_bytes",
                                           "target_bytes",
                                           "predicted_peak_bytes",
                                           "keep_peak_bytes",
                                           "fixed_bytes",
                                           "fits",
                                           "predicted_step_s",
                                           "keep_step_s",
                                           "host_bytes",
                                           "nvme_bytes",
                                           "recompute_bytes",
                                           "largest_batch",
                                           "largest_batch_kept",
                                           "plan_ms",
                                           "cost_model",
                                           "blocks"};
        for (size_t k = 0; j && k < sizeof keys / sizeof keys[0]; k++)
            T_EXPECT(cJSON_GetObjectItemCaseSensitive(j, keys[k]) != NULL, "field %s", keys[k]);
        const cJSON *fits = j ? cJSON_GetObjectItemCaseSensitive(j, "fits") : NULL;
        const double peak =
            j ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "predicted_peak_bytes"))
              : 0;
        const double lk =
            j ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "largest_batch_kept")) : 0;
        const double la =
            j ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "largest_batch")) : 0;
        T_EXPECT(cJSON_IsTrue(fits) && peak <= 200.0 * 1048576, "fits under 200 MiB: peak %.0f",
                 peak);
        T_EXPECT(la >= lk && la >= 2, "largest %g, kept whole %g", la, lk);
        const cJSON *blocks = j ? cJSON_GetObjectItemCaseSensitive(j, "blocks") : NULL;
        T_EXPECT(cJSON_GetArraySize(blocks) > 20, "every block application");
        cJSON_Delete(j);
        free(out);

        static const char *const tiny[] = {"--preset", "cpu-smoke", "plan", "--budget",
                                           "1MiB",     "--json",    NULL};
        rc = plan_cli(tiny, &out);
        j = out ? cJSON_Parse(out) : NULL;
        T_EXPECT(rc == 0 && j, "exit %d: %s", rc, out ? out : "");
        T_EXPECT(j && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "fits")) &&
                     cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "largest_batch")) ==
                         0,
                 "1 MiB: does not fit, largest 0");
        cJSON_Delete(j);
        free(out);

        static const char *const bad[][7] = {
            {"plan", "--batch-size", "0", NULL},
            {"plan", "--budget", "lots", NULL},
            {"plan", "--data", "/nonexistent.qcshard", NULL},
            {"plan", "--cost", "/nonexistent.json", NULL},
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            rc = plan_cli(bad[k], &out);
            T_EXPECT(rc != 0 && out && strstr(out, "error"), "%s %s: exit %d: %s", bad[k][1],
                     bad[k][2], rc, out ? out : "");
            free(out);
        }
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-planner-%d", (int)getpid());
    t_rm_rf(tmp_root);
    mkdir(tmp_root, 0755);
    test_session();
    test_cli();
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
