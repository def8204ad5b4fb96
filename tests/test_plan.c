/*
 * test_plan.c — the memory planner (src/plan/qc_plan.h): the simulation on hand-made programs
 * whose peaks and times are worked out here, the search and forced modes on the dry run's
 * program of a small QCNet at a range of budgets and two margins (every result passes
 * qc_plan_check; its target is budget x (1 - margin) as the test computes it; a result that fits
 * is under that target, and so is its policy simulated again by qc_plan_evaluate; tighter
 * budgets never give lower step times), the cost model's calibration and its JSON round trip.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#include "batch_testlib.h"
#include "qc_batch.h"
#include "qc_graph.h"
#include "qc_plan.h"
#include "qc_qcnet.h"
#include "qc_synth.h"

#define MB ((uint64_t)1 << 20)

/* Three blocks a, b, c in a chain: each allocates an output and a stash in its forward; the
 * backward runs c, b, a, each freeing its stash; outputs are freed at the end. */
static void chain_program(struct qc_plan_program *p, const uint64_t stash[3], uint64_t out)
{
    qc_plan_program_init(p);
    int32_t oid[3];
    for (int b = 0; b < 3; b++) {
        char name[8];
        snprintf(name, sizeof name, "b%d", b);
        qc_plan_program_block(p, name, QC_PLAN_MLP);
        p->blocks[b].rows = 1000;
        p->blocks[b].can_recompute = true;
    }
    int32_t sid[3];
    for (int b = 0; b < 3; b++) {
        qc_plan_program_event(p, QC_PLAN_OP_FWD, b, -1, 0, 0, 0);
        sid[b] = qc_plan_program_event(p, QC_PLAN_OP_ALLOC, -1, -1, stash[b], 1, 0);
        qc_plan_program_event(p, QC_PLAN_OP_STASH, b, sid[b], 0, 0, 0);
        oid[b] = qc_plan_program_event(p, QC_PLAN_OP_ALLOC, -1, -1, out, 1, 0);
        qc_plan_program_event(p, QC_PLAN_OP_FWD_END, b, -1, 0, 0, 0);
    }
    for (int b = 2; b >= 0; b--) {
        qc_plan_program_event(p, QC_PLAN_OP_BWD, b, -1, 0, 0, 1);
        qc_plan_program_event(p, QC_PLAN_OP_PEAK, b, -1, MB, 0, 1);
        qc_plan_program_event(p, QC_PLAN_OP_FREE, -1, sid[b], 0, 0, 0);
        qc_plan_program_event(p, QC_PLAN_OP_BWD_END, b, -1, 0, 0, 1);
    }
    for (int b = 0; b < 3; b++)
        qc_plan_program_event(p, QC_PLAN_OP_FREE, -1, oid[b], 0, 0, 0);
    p->fixed_bytes = 10 * MB;
}

static void hw_fast(struct qc_plan_hw *hw)
{
    memset(hw, 0, sizeof *hw);
    hw->d2h_gbps = hw->h2d_gbps = 1000;
    hw->nvme_write_gbps = hw->nvme_read_gbps = 100;
    hw->host_capacity = 1000 * MB;
    hw->nvme_capacity = 1000 * MB;
}

/* The target of a budget and margin as plan.margin promises it, worked out here. */
static uint64_t target_of(uint64_t budget, double margin)
{
    return (uint64_t)((double)budget * (1.0 - margin));
}

/* r (made under par) fits: its target is the budget less the margin, and its policy simulated
 * again without a budget peaks at or under that target. */
static void expect_under_target(const struct qc_plan_program *p, const struct qc_plan_cost *cost,
                                const struct qc_plan_hw *hw, const struct qc_plan_params *par,
                                const struct qc_plan_result *r)
{
    const uint64_t target = target_of(par->budget, par->margin);
    T_EXPECT_EQ_U64(r->target, target, "budget %llu, margin %.2f", (unsigned long long)par->budget,
                    par->margin);
    T_EXPECT(r->fits && r->peak <= target, "fits %d: peak %llu, budget %llu x (1 - %.2f) = %llu",
             r->fits, (unsigned long long)r->peak, (unsigned long long)par->budget, par->margin,
             (unsigned long long)target);
    struct qc_plan_params free_par = *par;
    free_par.budget = 0;
    free_par.prefetch_window = r->window; /* the search may have narrowed it to fit */
    struct qc_plan_result e;
    T_EXPECT(qc_plan_evaluate(p, cost, hw, &free_par, r->policy, &e) == QC_OK, "%s",
             qc_error_last());
    T_EXPECT(e.peak <= target, "the plan simulated again: peak %llu over the target %llu",
             (unsigned long long)e.peak, (unsigned long long)target);
    qc_plan_result_free(&e);
}

static void test_simulation(void)
{
    struct qc_plan_program p;
    const uint64_t stash[3] = {100 * MB, 200 * MB, 300 * MB};
    chain_program(&p, stash, 5 * MB);
    T_EXPECT(qc_plan_program_finish(&p) == QC_OK, "%s", qc_error_last());
    struct qc_plan_cost *cost = NULL;
    T_EXPECT(qc_plan_cost_create(&cost) == QC_OK, "%s", qc_error_last());
    struct qc_plan_hw hw;
    hw_fast(&hw);
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    par.prefetch_window = 0; /* only the next backward's stash comes back early */
    /* everything kept: the peak is at c's backward: fixed + 3 outputs + all stashes + 1 MiB */
    uint8_t pol[3] = {0, 0, 0};
    struct qc_plan_result r;
    T_EXPECT(qc_plan_evaluate(&p, cost, &hw, &par, pol, &r) == QC_OK, "%s", qc_error_last());
    T_EXPECT_EQ_U64(r.peak, 10 * MB + 15 * MB + 600 * MB + MB, "keep peak");
    T_EXPECT_EQ_U64(r.keep_peak, r.peak, "keep peak is the keep plan's");
    T_EXPECT(r.fits, "no budget: fits");
    const double keep_s = r.step_s;
    qc_plan_result_free(&r);
    /* a recomputed: its stash is gone until its backward (a is last), then back */
    pol[0] = QC_POLICY_RECOMPUTE;
    T_EXPECT(qc_plan_evaluate(&p, cost, &hw, &par, pol, &r) == QC_OK, "%s", qc_error_last());
    T_EXPECT_EQ_U64(r.peak, 10 * MB + 15 * MB + 500 * MB + MB, "a recomputed");
    T_EXPECT_EQ_U64(r.recompute_bytes, 100 * MB, "recomputed bytes");
    T_EXPECT(r.step_s > keep_s && r.added_s[0] > 0, "a recompute costs a's forward");
    qc_plan_result_free(&r);
    /* b offloaded: the next backward's stash is fetched at once (c's backward), so the peak
     * stays; a offloaded: gone at c's backward (window 0: nothing else comes back early) */
    pol[0] = QC_POLICY_KEEP;
    pol[1] = QC_POLICY_OFFLOAD_HOST;
    T_EXPECT(qc_plan_evaluate(&p, cost, &hw, &par, pol, &r) == QC_OK, "%s", qc_error_last());
    T_EXPECT_EQ_U64(r.host_bytes, 200 * MB, "host bytes");
    T_EXPECT_EQ_U64(r.peak, 10 * MB + 15 * MB + 600 * MB + MB, "b comes back for c's backward");
    qc_plan_result_free(&r);
    pol[0] = QC_POLICY_OFFLOAD_HOST;
    pol[1] = QC_POLICY_KEEP;
    T_EXPECT(qc_plan_evaluate(&p, cost, &hw, &par, pol, &r) == QC_OK, "%s", qc_error_last());
    T_EXPECT_EQ_U64(r.peak, 10 * MB + 15 * MB + 500 * MB + MB, "a is out at c's backward");
    qc_plan_result_free(&r);
    /* the host tier cannot take more than it holds */
    hw.host_capacity = 50 * MB;
    T_EXPECT(qc_plan_evaluate(&p, cost, &hw, &par, pol, &r) == QC_ERR_INVALID, "tier too small");
    hw_fast(&hw);
    /* the search under a budget: fits, checked, cheaper actions first */
    par.budget = 400 * MB;
    par.min_stash = 0;
    T_EXPECT(qc_plan_make(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    expect_under_target(&p, cost, &hw, &par, &r);
    T_EXPECT(qc_plan_check(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    qc_plan_result_free(&r);
    /* a margin of 15 % keeps 60 MiB of it free: a peak of at most 340 MiB, which only the
     * floor gives (c's 300 MiB stash alone kept at c's backward, + 26 MiB) */
    par.margin = 0.15;
    T_EXPECT(qc_plan_make(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    expect_under_target(&p, cost, &hw, &par, &r);
    T_EXPECT(qc_plan_check(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    qc_plan_result_free(&r);
    par.margin = 0.02;
    /* a budget under the floor: the smallest peak found, not fitting */
    par.budget = 20 * MB;
    T_EXPECT(qc_plan_make(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    T_EXPECT(!r.fits, "20 MiB cannot fit");
    T_EXPECT(qc_plan_check(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    qc_plan_result_free(&r);
    qc_plan_cost_destroy(cost);
    qc_plan_program_free(&p);
}

static bool make_batch(struct qc_batch *b)
{
    return t_synth_batch2(5, b) == QC_OK;
}

static void test_model_budgets(void)
{
    struct qc_batch batch;
    if (!make_batch(&batch)) {
        T_FAIL_AT("batch: %s", qc_error_last());
        return;
    }
    struct qc_qcnet_config cfg;
    qc_qcnet_config_parity_tiny(&cfg);
    struct qc_qcnet *dm = NULL;
    struct qc_plan_program p;
    qc_plan_program_init(&p);
    struct qc_plan_cost *cost = NULL;
    T_EXPECT(qc_qcnet_create_dry(&cfg, &dm) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_plan_cost_create(&cost) == QC_OK, "%s", qc_error_last());
    if (!dm || !cost || qc_qcnet_describe(dm, &batch, false, &p) != QC_OK) {
        T_FAIL_AT("describe: %s", qc_error_last());
        goto out;
    }
    p.fixed_bytes = 4 * (uint64_t)qc_qcnet_num_params(dm) * sizeof(float);
    struct qc_plan_hw hw;
    hw_fast(&hw);
    hw.d2h_gbps = hw.h2d_gbps = 12;
    hw.nvme_write_gbps = hw.nvme_read_gbps = 2;
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    struct qc_plan_result r;
    T_EXPECT(qc_plan_make(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    const uint64_t keep = r.keep_peak;
    T_EXPECT(r.peak == keep && r.host_bytes + r.nvme_bytes + r.recompute_bytes == 0,
             "no budget: everything kept");
    qc_plan_result_free(&r);
    uint64_t floor = keep;
    /* the default margin, and one of 10 %: large enough that a planner ignoring plan.margin
     * (stopping at the budget itself) stops on plans that do not keep it free */
    const double margins[2] = {0.02, 0.10};
    int fitted = 0;
    for (int mi = 0; mi < 2; mi++) {
        double last_s = 0;
        par.margin = margins[mi];
        for (int i = 1; i <= 8; i++) {
            par.budget = keep - keep * (uint64_t)i / 10;
            T_EXPECT(qc_plan_make(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
            T_EXPECT(qc_plan_check(&p, cost, &hw, &par, &r) == QC_OK, "budget %llu: %s",
                     (unsigned long long)par.budget, qc_error_last());
            T_EXPECT_EQ_U64(r.target, target_of(par.budget, par.margin), "budget %llu x (1 - %.2f)",
                            (unsigned long long)par.budget, par.margin);
            if (r.fits) {
                expect_under_target(&p, cost, &hw, &par, &r);
                T_EXPECT(r.step_s >= last_s - 1e-9, "a tighter budget made the step faster");
                last_s = r.step_s;
                fitted++;
            } else {
                T_EXPECT(r.peak > target_of(par.budget, par.margin),
                         "does not fit, yet peak %llu is under the target",
                         (unsigned long long)r.peak);
            }
            if (r.peak < floor)
                floor = r.peak;
            printf("  margin %2.0f%%, budget %3d%% of %llu: peak %llu (%s), step %.4f s (keep "
                   "%.4f s), host %llu, nvme %llu, recompute %llu, %d search steps, %.3f ms\n",
                   100 * par.margin, 100 - 10 * i, (unsigned long long)keep,
                   (unsigned long long)r.peak, r.fits ? "fits" : "does not fit", r.step_s,
                   r.keep_step_s, (unsigned long long)r.host_bytes,
                   (unsigned long long)r.nvme_bytes, (unsigned long long)r.recompute_bytes,
                   r.iterations, 1e3 * r.plan_s);
            qc_plan_result_free(&r);
        }
    }
    T_EXPECT(fitted >= 4, "plans that fit: %d", fitted);
    par.margin = 0.02;
    T_EXPECT(floor < keep * 3 / 4, "the search lowers the peak by a quarter at least: %llu of %llu",
             (unsigned long long)floor, (unsigned long long)keep);
    /* forced modes */
    const enum qc_plan_mode modes[3] = {QC_PLAN_MODE_KEEP, QC_PLAN_MODE_OFFLOAD,
                                        QC_PLAN_MODE_RECOMPUTE};
    const uint8_t expect[3] = {QC_POLICY_KEEP, QC_POLICY_OFFLOAD_HOST, QC_POLICY_RECOMPUTE};
    for (int k = 0; k < 3; k++) {
        par.mode = modes[k];
        par.budget = 0;
        T_EXPECT(qc_plan_make(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
        bool all = true;
        for (int32_t b = 0; b < r.nblocks; b++)
            all = all && r.policy[b] == expect[k];
        T_EXPECT(all, "forced mode %d: every block %s", (int)modes[k],
                 qc_plan_policy_str((enum qc_stash_policy)expect[k]));
        qc_plan_result_free(&r);
    }
out:
    qc_plan_cost_destroy(cost);
    qc_plan_program_free(&p);
    qc_qcnet_destroy(dm);
    qc_batch_release(&batch);
}

/* What holds the peak: for every plan of a small QCNet's step (budgets from unlimited down to
 * the smallest plan, and each forced mode), the holders qc_plan_explain names add up to the
 * predicted peak byte for byte (its own replay of the events against the simulation), every
 * allocation there carries its tag, and the fixed bytes are one holder. */
static void test_explain(void)
{
    struct qc_batch batch;
    if (!make_batch(&batch)) {
        T_FAIL_AT("batch: %s", qc_error_last());
        return;
    }
    struct qc_qcnet_config cfg;
    qc_qcnet_config_parity_tiny(&cfg);
    struct qc_qcnet *dm = NULL;
    struct qc_plan_program p;
    qc_plan_program_init(&p);
    struct qc_plan_cost *cost = NULL;
    T_EXPECT(qc_qcnet_create_dry(&cfg, &dm) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_plan_cost_create(&cost) == QC_OK, "%s", qc_error_last());
    if (!dm || !cost || qc_qcnet_describe(dm, &batch, false, &p) != QC_OK) {
        T_FAIL_AT("describe: %s", qc_error_last());
        goto out;
    }
    p.fixed_bytes = 4 * (uint64_t)qc_qcnet_num_params(dm) * sizeof(float);
    struct qc_plan_hw hw;
    hw_fast(&hw);
    hw.d2h_gbps = hw.h2d_gbps = 12;
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    struct qc_plan_result r;
    T_EXPECT(qc_plan_make(&p, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    const uint64_t keep = r.keep_peak;
    qc_plan_result_free(&r);
    int explained = 0, recomputes = 0, working = 0;
    for (int i = 0; i <= 13; i++) {
        par.budget = i <= 10 ? keep - keep * (uint64_t)i / 11 : 0;
        par.mode = i <= 10   ? QC_PLAN_MODE_AUTO
                   : i == 11 ? QC_PLAN_MODE_KEEP
                   : i == 12 ? QC_PLAN_MODE_OFFLOAD
                             : QC_PLAN_MODE_RECOMPUTE;
        if (qc_plan_make(&p, cost, &hw, &par, &r) != QC_OK) {
            T_FAIL_AT("plan: %s", qc_error_last());
            continue;
        }
        struct qc_plan_explain e;
        const enum qc_status st = qc_plan_explain(&p, cost, &hw, &par, &r, &e);
        T_EXPECT(st == QC_OK, "explain (budget %llu, mode %d): %s", (unsigned long long)par.budget,
                 (int)par.mode, qc_error_last());
        if (st == QC_OK) {
            explained++;
            T_EXPECT_EQ_U64(e.peak, r.peak, "the explained peak is the plan's");
            uint64_t sum = 0;
            bool tagged = true;
            for (int32_t k = 0; k < e.n; k++) {
                sum += e.h[k].bytes;
                if ((e.h[k].kind == QC_PLAN_HOLD_TENSOR || e.h[k].kind == QC_PLAN_HOLD_WORKING) &&
                    strstr(e.h[k].name, "without a tag"))
                    tagged = false;
                T_EXPECT(k == 0 || e.h[k].bytes <= e.h[k - 1].bytes, "holders sorted by size");
            }
            T_EXPECT_EQ_U64(sum, r.peak, "the holders add up to the peak");
            T_EXPECT_EQ_U64(e.by_kind[QC_PLAN_HOLD_FIXED], p.fixed_bytes, "the fixed bytes");
            T_EXPECT(tagged, "an allocation at the peak has no tag");
            recomputes += e.recompute;
            working += e.by_kind[QC_PLAN_HOLD_WORKING] > 0;
            if (i == 10) { /* the smallest plan of the search */
                printf("  smallest plan (budget %llu, %s):\n", (unsigned long long)par.budget,
                       r.fits ? "fits" : "does not fit");
                qc_plan_explain_print(stdout, &p, &e, 8);
            }
            qc_plan_explain_free(&e);
        }
        qc_plan_result_free(&r);
    }
    T_EXPECT_EQ_I64(explained, 14, "plans explained");
    T_EXPECT(working > 0, "no plan's peak had a working set (the transients are in the program)");
    printf("  %d of 14 peaks made by a recompute, %d with a working set\n", recomputes, working);
out:
    qc_plan_cost_destroy(cost);
    qc_plan_program_free(&p);
    qc_qcnet_destroy(dm);
    qc_batch_release(&batch);
}

static void test_cost_model(void)
{
    struct qc_plan_program p;
    const uint64_t stash[3] = {MB, MB, MB};
    chain_program(&p, stash, MB);
    T_EXPECT(qc_plan_program_finish(&p) == QC_OK, "%s", qc_error_last());
    struct qc_plan_cost *c = NULL, *d = NULL;
    T_EXPECT(qc_plan_cost_create(&c) == QC_OK && qc_plan_cost_create(&d) == QC_OK, "create");
    char src[128];
    T_EXPECT_STR_CONTAINS(qc_plan_cost_source(c, src, sizeof src), "built-in");
    struct qc_plan_measure m[3] = {{0.1, 0.2}, {0.3, 0.6}, {0.5, 1.0}};
    qc_plan_cost_update(c, &p, m, 3.0, true);
    T_EXPECT(fabs(qc_plan_cost_time(c, &p, 1, 0) - 0.3) < 1e-12, "block b1's forward: %g",
             qc_plan_cost_time(c, &p, 1, 0));
    T_EXPECT(fabs(qc_plan_cost_time(c, &p, 2, 1) - 1.0) < 1e-12, "block b2's backward");
    /* a second step folds in with the moving average */
    m[1].t_fwd = 0.4;
    qc_plan_cost_update(c, &p, m, 3.0, true);
    T_EXPECT(fabs(qc_plan_cost_time(c, &p, 1, 0) - 0.33) < 1e-12, "EMA: %g",
             qc_plan_cost_time(c, &p, 1, 0));
    T_EXPECT_STR_CONTAINS(qc_plan_cost_source(c, src, sizeof src), "calibrated over 2 steps");
    char path[512];
    snprintf(path, sizeof path, "%s/plan_cost_test_%d.json", QC_BINARY_DIR, (int)getpid());
    T_EXPECT(qc_plan_cost_save(c, path) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_plan_cost_load(d, path) == QC_OK, "%s", qc_error_last());
    for (int32_t b = 0; b < 3; b++)
        for (int ph = 0; ph < 2; ph++)
            T_EXPECT(fabs(qc_plan_cost_time(c, &p, b, ph) - qc_plan_cost_time(d, &p, b, ph)) <=
                         1e-12 * qc_plan_cost_time(c, &p, b, ph),
                     "round trip (JSON's 15 digits): block %d phase %d: %.17g vs %.17g", b, ph,
                     qc_plan_cost_time(c, &p, b, ph), qc_plan_cost_time(d, &p, b, ph));
    T_EXPECT_EQ_I64(qc_plan_cost_steps(d), 2, "steps round trip");
    /* a broken file names itself */
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"qctrain-plan-cost\", \"version\": 2, \"steps\": -1}", f);
    fclose(f);
    T_EXPECT(qc_plan_cost_load(d, path) == QC_ERR_INVALID, "negative steps");
    T_EXPECT_STR_CONTAINS(qc_error_last(), path);
    T_EXPECT_STR_CONTAINS(qc_error_last(), "steps");
    /* an older qctrain's file (version 1 held transient-memory coefficients) is refused */
    f = fopen(path, "w");
    fputs("{\"format\": \"qctrain-plan-cost\", \"version\": 1, \"steps\": 3, "
          "\"step_factor\": 1, \"glue_s\": 0}",
          f);
    fclose(f);
    T_EXPECT(qc_plan_cost_load(d, path) == QC_ERR_INVALID, "a version-1 file");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "version 1");
    unlink(path);
    T_EXPECT(qc_plan_cost_load(d, path) == QC_ERR_IO, "missing file");
    qc_plan_cost_destroy(c);
    qc_plan_cost_destroy(d);
    qc_plan_program_free(&p);
}

int main(void)
{
    QC_TEST ("plan: the simulation of a hand-made program")
        test_simulation();
    QC_TEST ("plan: a small QCNet's step at budgets from unlimited down")
        test_model_budgets();
    QC_TEST ("plan: what holds the peak adds up to it, every allocation named")
        test_explain();
    QC_TEST ("plan: the cost model's calibration and JSON round trip")
        test_cost_model();
    return qc_test_summary();
}
