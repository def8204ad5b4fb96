/*
 * test_plan.c — the memory planner (src/plan/qc_plan.h): the simulation on hand-made programs
 * whose peaks and times are worked out here, the search and forced modes on the dry run's
 * program of a small QCNet at a range of budgets and two margins (every result passes
 * qc_plan_check; its target is budget x (1 - margin) as the test computes it; a result that fits
 * is under that target, and so is its policy simulated again by qc_plan_evaluate; tighter
 * budgets never give lower step times), the cost model's calibration and its JSON round trip,
 * and the edge modes on a hand-made pair of edge sets (the tiled mode's FE work priced from the
 * edge context's times; the sets tiled in order of bytes saved per second added, and only as
 * many as the budget needs: qc_plan_make_edges).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#include "batch_testlib.h"
#include "qc_batch.h"
#include "qc_alloc.h"
#include "qc_graph.h"
#include "qc_memctx.h"
#include "qc_plan.h"
#include "qc_plan_calib.h" /* qc_plan_cost_clone */
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
    /* the same with nothing fetched ahead: b stays out through c's backward (626 MiB there
     * before) and comes back at its own, stalling it; the peak is now c's forward (625 MiB:
     * b's put still in flight) */
    par.prefetch_none = true;
    T_EXPECT(qc_plan_evaluate(&p, cost, &hw, &par, pol, &r) == QC_OK, "%s", qc_error_last());
    T_EXPECT(r.peak == 10 * MB + 15 * MB + 600 * MB && r.peak_phase == 0,
             "nothing fetched ahead: peak %llu in phase %d, want c's forward's",
             (unsigned long long)r.peak, r.peak_phase);
    T_EXPECT(r.prefetch_none && r.stall_s > 0,
             "the result fetches nothing ahead, and b's fetch stalls its backward (%g s)",
             r.stall_s);
    qc_plan_result_free(&r);
    par.prefetch_none = false;
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

/* A small QCNet's step described by the dry model: test_synth_batch2's 5 scenes, the model of
 * cfg with the edge modes of `modes` (NULL: the configuration's), the fixed bytes of its
 * parameters, gradients and AdamW moments, the built-in cost model, and hardware figures. */
struct model_step {
    struct qc_batch batch;
    struct qc_qcnet *dm;
    struct qc_plan_program p;
    struct qc_plan_cost *cost;
    struct qc_plan_hw hw; /* hw_fast with 12 GB/s copies */
};

static void model_step_free(struct model_step *m)
{
    qc_plan_cost_destroy(m->cost);
    qc_plan_program_free(&m->p);
    qc_qcnet_destroy(m->dm);
    qc_batch_release(&m->batch);
}

/* false (the failure reported, m released) when any part fails. */
static bool model_step_make(struct model_step *m, const struct qc_qcnet_config *cfg,
                            const enum qc_attn_edge_mode *modes)
{
    memset(m, 0, sizeof *m);
    qc_plan_program_init(&m->p);
    if (!make_batch(&m->batch)) {
        T_FAIL_AT("batch: %s", qc_error_last());
        qc_plan_program_free(&m->p);
        return false;
    }
    if (qc_qcnet_create_dry(cfg, &m->dm) != QC_OK || qc_plan_cost_create(&m->cost) != QC_OK ||
        (modes && qc_qcnet_set_edge_modes(m->dm, modes) != QC_OK) ||
        qc_qcnet_describe(m->dm, &m->batch, false, &m->p) != QC_OK) {
        T_FAIL_AT("describe: %s", qc_error_last());
        model_step_free(m);
        return false;
    }
    m->p.fixed_bytes = 4 * (uint64_t)qc_qcnet_num_params(m->dm) * sizeof(float);
    hw_fast(&m->hw);
    m->hw.d2h_gbps = m->hw.h2d_gbps = 12;
    return true;
}

static void test_model_budgets(void)
{
    struct qc_qcnet_config cfg;
    qc_qcnet_config_parity_tiny(&cfg);
    struct model_step ms;
    if (!model_step_make(&ms, &cfg, NULL))
        return;
    struct qc_plan_program *const pp = &ms.p;
    struct qc_plan_cost *const cost = ms.cost;
    struct qc_plan_hw hw = ms.hw;
    hw.nvme_write_gbps = hw.nvme_read_gbps = 2;
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    struct qc_plan_result r;
    T_EXPECT(qc_plan_make(pp, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
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
            T_EXPECT(qc_plan_make(pp, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
            T_EXPECT(qc_plan_check(pp, cost, &hw, &par, &r) == QC_OK, "budget %llu: %s",
                     (unsigned long long)par.budget, qc_error_last());
            T_EXPECT_EQ_U64(r.target, target_of(par.budget, par.margin), "budget %llu x (1 - %.2f)",
                            (unsigned long long)par.budget, par.margin);
            if (r.fits) {
                expect_under_target(pp, cost, &hw, &par, &r);
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
        T_EXPECT(qc_plan_make(pp, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
        bool all = true;
        for (int32_t b = 0; b < r.nblocks; b++)
            all = all && r.policy[b] == expect[k];
        T_EXPECT(all, "forced mode %d: every block %s", (int)modes[k],
                 qc_plan_policy_str((enum qc_stash_policy)expect[k]));
        qc_plan_result_free(&r);
    }
    model_step_free(&ms);
}

/* What holds the peak: for every plan of a small QCNet's step (budgets from unlimited down to
 * the smallest plan, and each forced mode), the holders qc_plan_explain names add up to the
 * predicted peak byte for byte (its own replay of the events against the simulation), every
 * allocation there carries its tag, and the fixed bytes are one holder. */
static void test_explain(void)
{
    struct qc_qcnet_config cfg;
    qc_qcnet_config_parity_tiny(&cfg);
    struct model_step ms;
    if (!model_step_make(&ms, &cfg, NULL))
        return;
    struct qc_plan_program *const pp = &ms.p;
    struct qc_plan_cost *const cost = ms.cost;
    struct qc_plan_hw hw = ms.hw;
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    struct qc_plan_result r;
    T_EXPECT(qc_plan_make(pp, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    const uint64_t keep = r.keep_peak;
    qc_plan_result_free(&r);
    int explained = 0, recomputes = 0, working = 0;
    for (int i = 0; i <= 13; i++) {
        par.budget = i <= 10 ? keep - keep * (uint64_t)i / 11 : 0;
        par.mode = i <= 10   ? QC_PLAN_MODE_AUTO
                   : i == 11 ? QC_PLAN_MODE_KEEP
                   : i == 12 ? QC_PLAN_MODE_OFFLOAD
                             : QC_PLAN_MODE_RECOMPUTE;
        if (qc_plan_make(pp, cost, &hw, &par, &r) != QC_OK) {
            T_FAIL_AT("plan: %s", qc_error_last());
            continue;
        }
        struct qc_plan_explain e;
        const enum qc_status st = qc_plan_explain(pp, cost, &hw, &par, &r, &e);
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
            T_EXPECT_EQ_U64(e.by_kind[QC_PLAN_HOLD_FIXED], pp->fixed_bytes, "the fixed bytes");
            T_EXPECT(tagged, "an allocation at the peak has no tag");
            recomputes += e.recompute;
            working += e.by_kind[QC_PLAN_HOLD_WORKING] > 0;
            if (i == 10) { /* the smallest plan of the search */
                printf("  smallest plan (budget %llu, %s):\n", (unsigned long long)par.budget,
                       r.fits ? "fits" : "does not fit");
                qc_plan_explain_print(stdout, pp, &e, 8);
            }
            qc_plan_explain_free(&e);
        }
        qc_plan_result_free(&r);
    }
    T_EXPECT_EQ_I64(explained, 14, "plans explained");
    T_EXPECT(working > 0, "no plan's peak had a working set (the transients are in the program)");
    printf("  %d of 14 peaks made by a recompute, %d with a working set\n", recomputes, working);
    model_step_free(&ms);
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
    /* a warm-up measurement prices until the next update, which folds as if it never came:
     * the same coefficients, bit for bit, as the model updated without it; on a fresh model,
     * on one with history (c), and on a clone taken while the warm-up is pending */
    {
        struct qc_plan_measure slow[3] = {{1.0, 2.0}, {3.0, 6.0}, {5.0, 10.0}};
        struct qc_plan_measure m2[3] = {{0.2, 0.3}, {0.35, 0.7}, {0.45, 0.9}};
        struct qc_plan_cost *w = NULL, *ref = NULL, *wc = NULL, *hist = NULL;
        T_EXPECT(qc_plan_cost_create(&w) == QC_OK && qc_plan_cost_create(&ref) == QC_OK, "create");
        T_EXPECT(qc_plan_cost_update_warmup(w, &p, slow, 30.0, true) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(fabs(qc_plan_cost_time(w, &p, 1, 0) - 3.0) < 1e-12,
                 "the warm-up prices until the next update: %g", qc_plan_cost_time(w, &p, 1, 0));
        T_EXPECT(qc_plan_cost_clone(w, &wc) == QC_OK, "clone");
        qc_plan_cost_update(w, &p, m2, 3.0, true);
        qc_plan_cost_update(wc, &p, m2, 3.0, true);
        qc_plan_cost_update(ref, &p, m2, 3.0, true);
        T_EXPECT(qc_plan_cost_clone(c, &hist) == QC_OK, "clone");
        T_EXPECT(qc_plan_cost_update_warmup(c, &p, slow, 30.0, true) == QC_OK, "%s",
                 qc_error_last());
        qc_plan_cost_update(c, &p, m2, 3.0, true);
        qc_plan_cost_update(hist, &p, m2, 3.0, true);
        for (int32_t b = 0; b < 3; b++)
            for (int ph = 0; ph < 2; ph++) {
                T_EXPECT(qc_plan_cost_time(w, &p, b, ph) == qc_plan_cost_time(ref, &p, b, ph),
                         "fresh: block %d phase %d: %.17g, without the warm-up %.17g", b, ph,
                         qc_plan_cost_time(w, &p, b, ph), qc_plan_cost_time(ref, &p, b, ph));
                T_EXPECT(qc_plan_cost_time(wc, &p, b, ph) == qc_plan_cost_time(ref, &p, b, ph),
                         "clone: block %d phase %d", b, ph);
                T_EXPECT(qc_plan_cost_time(c, &p, b, ph) == qc_plan_cost_time(hist, &p, b, ph),
                         "with history: block %d phase %d: %.17g vs %.17g", b, ph,
                         qc_plan_cost_time(c, &p, b, ph), qc_plan_cost_time(hist, &p, b, ph));
            }
        T_EXPECT_EQ_I64(qc_plan_cost_steps(w), 1, "the warm-up is not a step");
        T_EXPECT_EQ_I64(qc_plan_cost_steps(c), 3, "history: 2 steps and this one");
        qc_plan_cost_destroy(w), qc_plan_cost_destroy(ref), qc_plan_cost_destroy(wc);
        qc_plan_cost_destroy(hist);
    }
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
    T_EXPECT_EQ_I64(qc_plan_cost_steps(d), 3, "steps round trip");
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

// ---- the edge modes (qc_plan_make_edges) ---------------------------------------------------

/* Two edge sets: an edge context each (e0, e1: r a stash of r_mb[s] MiB when materialised,
 * nothing when tiled), then applications reading it, one on set 0 (a0), two on set 1 (a1,
 * a2), each leaving a 1 MiB output; the backward frees r in its context's backward. Nothing
 * can be recomputed and the test gives no tier, so only the edge modes move the peak. */
struct edge_prog {
    struct qc_plan_program p;
    uint64_t r_mb[2];
    uint64_t scratch_mb; /* a transient of a1's backward (0: none) */
    int described;
};

static enum qc_status edge_describe(void *user, uint32_t tiled, const struct qc_plan_program **prog)
{
    struct edge_prog *e = user;
    struct qc_plan_program *p = &e->p;
    qc_plan_program_reset(p);
    static const char *const names[5] = {"edges.s0", "edges.s1", "a0", "a1", "a2"};
    static const int set[5] = {0, 1, 0, 1, 1};
    for (int b = 0; b < 5; b++) {
        qc_plan_program_block(p, names[b], b < 2 ? QC_PLAN_EDGES : QC_PLAN_ATTN);
        struct qc_plan_block *k = &p->blocks[b];
        k->fused = true;
        k->rows = 100;
        k->edges = 10000;
        k->srcs = b < 2 ? 0 : 100;
        k->edge_set = set[b];
        k->edge_mode = (tiled >> set[b]) & 1u ? QC_PLAN_EDGE_TILED : QC_PLAN_EDGE_MATERIALISED;
    }
    int32_t rid[2] = {-1, -1}, out[3];
    for (int b = 0; b < 2; b++) {
        qc_plan_program_event(p, QC_PLAN_OP_FWD, b, -1, 0, 0, 0);
        if (!((tiled >> b) & 1u)) {
            rid[b] = qc_plan_program_event(p, QC_PLAN_OP_ALLOC, -1, -1, e->r_mb[b] * MB, 1, 0);
            qc_plan_program_event(p, QC_PLAN_OP_STASH, b, rid[b], 0, 0, 0);
        }
        qc_plan_program_event(p, QC_PLAN_OP_FWD_END, b, -1, 0, 0, 0);
    }
    for (int b = 2; b < 5; b++) {
        qc_plan_program_event(p, QC_PLAN_OP_FWD, b, -1, 0, 0, 0);
        out[b - 2] = qc_plan_program_event(p, QC_PLAN_OP_ALLOC, -1, -1, MB, 1, 0);
        qc_plan_program_event(p, QC_PLAN_OP_FWD_END, b, -1, 0, 0, 0);
        if (rid[set[b]] >= 0)
            qc_plan_program_use(p, b, set[b]);
    }
    for (int b = 4; b >= 0; b--) {
        qc_plan_program_event(p, QC_PLAN_OP_BWD, b, -1, 0, 0, 1);
        if (b == 3 && e->scratch_mb) {
            const int32_t t =
                qc_plan_program_event(p, QC_PLAN_OP_ALLOC, -1, -1, e->scratch_mb * MB, 2, 0);
            qc_plan_program_event(p, QC_PLAN_OP_FREE, -1, t, 0, 0, 0);
        }
        if (b < 2 && rid[b] >= 0)
            qc_plan_program_event(p, QC_PLAN_OP_FREE, -1, rid[b], 0, 0, 0);
        qc_plan_program_event(p, QC_PLAN_OP_BWD_END, b, -1, 0, 0, 1);
    }
    for (int b = 0; b < 3; b++)
        qc_plan_program_event(p, QC_PLAN_OP_FREE, -1, out[b], 0, 0, 0);
    p->fixed_bytes = 10 * MB;
    e->described++;
    *prog = p;
    return qc_plan_program_finish(p);
}

static void test_edge_modes(void)
{
    struct edge_prog e = {.r_mb = {40, 100}};
    qc_plan_program_init(&e.p);
    struct qc_plan_cost *cost = NULL;
    T_EXPECT(qc_plan_cost_create(&cost) == QC_OK, "%s", qc_error_last());
    struct qc_plan_hw hw;
    hw_fast(&hw);
    hw.host_capacity = hw.nvme_capacity = 0; /* nothing to offload to */
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    par.margin = 0;
    const struct qc_plan_program *p = NULL;
    /* the tiled mode's work: an application adds its context's FE forward to its forward and
     * the FE forward + backward to its backward; the context itself computes no r */
    T_EXPECT(edge_describe(&e, 0, &p) == QC_OK, "%s", qc_error_last());
    double mat[5][2];
    for (int b = 0; b < 5; b++)
        for (int j = 0; j < 2; j++)
            mat[b][j] = qc_plan_cost_time(cost, p, b, j);
    struct qc_plan_result rm = {0}, rt = {0};
    T_EXPECT(qc_plan_make(p, cost, &hw, &par, &rm) == QC_OK, "%s", qc_error_last());
    T_EXPECT(edge_describe(&e, 3, &p) == QC_OK, "%s", qc_error_last());
    for (int b = 0; b < 5; b++) {
        const int s = p->blocks[b].edge_set;
        const double want0 = b < 2 ? 0.0 : mat[b][0] + mat[s][0];
        const double want1 = b < 2 ? 0.0 : mat[b][1] + mat[s][0] + mat[s][1];
        T_EXPECT_NEAR(qc_plan_cost_time(cost, p, b, 0), want0, 1e-12, 1e-9, "%s tiled, forward",
                      p->blocks[b].name);
        T_EXPECT_NEAR(qc_plan_cost_time(cost, p, b, 1), want1, 1e-12, 1e-9, "%s tiled, backward",
                      p->blocks[b].name);
    }
    T_EXPECT(qc_plan_make(p, cost, &hw, &par, &rt) == QC_OK, "%s", qc_error_last());
    printf("  everything kept: materialised %.4f s, %llu MiB; tiled %.4f s, %llu MiB\n",
           rm.keep_step_s, (unsigned long long)(rm.keep_peak / MB), rt.keep_step_s,
           (unsigned long long)(rt.keep_peak / MB));
    T_EXPECT(rt.keep_step_s > rm.keep_step_s && rt.keep_peak < rm.keep_peak,
             "tiled: slower (%.4f vs %.4f s) and smaller (%llu vs %llu)", rt.keep_step_s,
             rm.keep_step_s, (unsigned long long)rt.keep_peak, (unsigned long long)rm.keep_peak);
    qc_plan_result_free(&rm);
    qc_plan_result_free(&rt);
    /* the order: set 0 saves 80 MiB for one application's FE (forward), set 1 200 MiB for two
     * (3 forwards and a backward): set 0 saves more per second */
    T_EXPECT(edge_describe(&e, 0, &p) == QC_OK, "%s", qc_error_last());
    struct qc_plan_edge_gain g[4];
    const int n = qc_plan_edge_order(p, cost, g, 4);
    T_EXPECT(n == 2 && g[0].set == 0 && g[1].set == 1 && g[0].bytes == 80 * MB &&
                 g[1].bytes == 200 * MB,
             "order: %d sets, first %d (%llu bytes)", n, n > 0 ? g[0].set : -1,
             n > 0 ? (unsigned long long)g[0].bytes : 0ull);
    if (n == 2) {
        T_EXPECT_NEAR(g[0].extra_s, mat[0][0], 1e-12, 1e-9, "set 0: one more FE forward");
        T_EXPECT_NEAR(g[1].extra_s, 3 * mat[1][0] + mat[1][1], 1e-12, 1e-9,
                      "set 1: three more FE forwards and one backward");
    }
    /* the choice: kept whole 10 + 140 + 3 MiB; set 0 tiled 113, set 1 tiled 53, both 13 */
    static const struct {
        uint64_t budget_mb;
        bool choose;
        uint32_t tiled;
        bool fits;
        const char *why;
    } cases[] = {
        {0, true, 0, true, "no budget: every set materialised"},
        {200, true, 0, true, "the materialised plan fits: kept"},
        {130, true, 1, true, "set 0 (the most bytes per second) is enough"},
        {100, true, 3, true, "set 0, then set 1"},
        {5, true, 3, false, "nothing fits: every set tiled, the smallest program"},
        {130, false, 0, false, "a configured mode: no choice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        par.budget = cases[i].budget_mb * MB;
        const struct qc_plan_describer d = {edge_describe, &e};
        uint32_t tiled = 99;
        struct qc_plan_result r = {0};
        T_EXPECT(qc_plan_make_edges(&d, cases[i].choose, cost, &hw, &par, &tiled, &p, &r) == QC_OK,
                 "%s", qc_error_last());
        T_EXPECT(tiled == cases[i].tiled && r.fits == cases[i].fits && p == &e.p,
                 "%s: budget %llu MiB: tiled 0x%x (want 0x%x), fits %d, peak %llu MiB",
                 cases[i].why, (unsigned long long)cases[i].budget_mb, tiled, cases[i].tiled,
                 (int)r.fits, (unsigned long long)(r.peak / MB));
        /* the program returned is the mask's */
        for (int s = 0; s < 2; s++)
            T_EXPECT(p->blocks[s].edge_mode ==
                         ((tiled >> s) & 1u ? QC_PLAN_EDGE_TILED : QC_PLAN_EDGE_MATERIALISED),
                     "%s: program of another mask", cases[i].why);
        qc_plan_result_free(&r);
    }
    qc_plan_cost_destroy(cost);
    qc_plan_program_free(&e.p);
}

/* A plan that fits only by fetching nothing ahead decides the edge modes only with room to
 * spare (src/plan/README.md, "The edge modes"): it leaves no room for what the plan does not see
 * (the allocator's rounding and fragmentation) and no smaller window to fall back on, so it is
 * taken only when the program also fits with the margin taken twice (at least 5 % of the budget
 * more); else sets are tiled first, and nothing fetched ahead stays the last resort of the
 * smallest program. The program of test_edge_modes with a host tier, margin 0: budgets are
 * scanned down from the materialised peak; the largest budget where the materialised plan (no
 * choice) fits only with nothing fetched ahead has room (272 MiB: fetched ahead, r0 meets a1's
 * scratch at 273 MiB; nothing fetched ahead 233 MiB), the smallest has none (233 MiB): there,
 * with the choice, a set is tiled and the plan fits fetching ahead. */
static void test_edge_modes_prefetch(void)
{
    /* a1's backward needs 120 MiB of its own: r0, fetched ahead there for a0's backward, meets
     * it unless nothing is fetched ahead */
    struct edge_prog e = {.r_mb = {40, 100}, .scratch_mb = 120};
    qc_plan_program_init(&e.p);
    struct qc_plan_cost *cost = NULL;
    T_EXPECT(qc_plan_cost_create(&cost) == QC_OK, "%s", qc_error_last());
    struct qc_plan_hw hw;
    hw_fast(&hw); /* a host tier the r stashes can go to between their uses */
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    par.margin = 0;
    const struct qc_plan_describer d = {edge_describe, &e};
    const struct qc_plan_program *p = NULL;
    uint64_t first = 0, last = 0; /* budgets (MiB) where it fits only fetching nothing ahead */
    uint64_t none_peak = 0;       /* the materialised plan's peak, nothing fetched ahead */
    for (uint64_t mb = 400; mb >= 1; mb--) {
        par.budget = mb * MB;
        uint32_t tiled = 99;
        struct qc_plan_result r = {0};
        T_EXPECT(qc_plan_make_edges(&d, false, cost, &hw, &par, &tiled, &p, &r) == QC_OK, "%s",
                 qc_error_last());
        const bool fits = r.fits;
        if (r.fits && r.prefetch_none) {
            first = first ? first : mb;
            last = mb;
            none_peak = r.peak;
        }
        qc_plan_result_free(&r);
        if (!fits)
            break;
    }
    T_EXPECT(first > 0 && (double)none_peak <= 0.95 * (double)(first * MB) &&
                 (double)none_peak > 0.95 * (double)(last * MB),
             "budgets %llu .. %llu MiB (nothing ahead, peak %llu B): not one with room and one "
             "without",
             (unsigned long long)first, (unsigned long long)last, (unsigned long long)none_peak);
    for (int k = 0; k < 2 && first; k++) {
        const uint64_t mb = k == 0 ? first : last;
        par.budget = mb * MB;
        uint32_t tiled = 99;
        struct qc_plan_result r = {0};
        /* qc_plan_room on the materialised plan alone: room at the largest budget, none at the
         * smallest (the plan left as it was) */
        T_EXPECT(qc_plan_make_edges(&d, false, cost, &hw, &par, &tiled, &p, &r) == QC_OK, "%s",
                 qc_error_last());
        const uint64_t peak0 = r.peak;
        bool ok = k != 0;
        T_EXPECT(qc_plan_room(p, cost, &hw, &par, &r, &ok) == QC_OK, "%s", qc_error_last());
        T_EXPECT(ok == (k == 0) && r.fits && r.prefetch_none && r.peak == peak0,
                 "%llu MiB: qc_plan_room says %d (peak %llu, was %llu)", (unsigned long long)mb,
                 (int)ok, (unsigned long long)r.peak, (unsigned long long)peak0);
        qc_plan_result_free(&r);
        const int described = e.described;
        T_EXPECT(qc_plan_make_edges(&d, true, cost, &hw, &par, &tiled, &p, &r) == QC_OK, "%s",
                 qc_error_last());
        printf("  %llu MiB: materialised fits only fetching nothing ahead; with the choice: "
               "tiled 0x%x, fits %d, nothing ahead %d, peak %llu MiB\n",
               (unsigned long long)mb, tiled, (int)r.fits, (int)r.prefetch_none,
               (unsigned long long)(r.peak / MB));
        if (k == 0) { /* room: the default modes, one description, and the room is the plan's */
            T_EXPECT_EQ_I64(e.described - described, 1, "descriptions");
            T_EXPECT(tiled == 0 && r.fits && r.prefetch_none &&
                         (double)r.peak <= 0.95 * (double)par.budget,
                     "%llu MiB: tiled 0x%x, fits %d, nothing ahead %d, peak %llu B: the "
                     "materialised plan with room was not taken",
                     (unsigned long long)mb, tiled, (int)r.fits, (int)r.prefetch_none,
                     (unsigned long long)r.peak);
        } else { /* no room: the default modes fit (fetching nothing ahead), so every set tiled
                    is not tried first: two descriptions, the default modes' and set 0 tiled */
            T_EXPECT_EQ_I64(e.described - described, 2, "descriptions");
            T_EXPECT(tiled != 0 && r.fits && !r.prefetch_none,
                     "%llu MiB: tiled 0x%x, fits %d, nothing fetched ahead %d: the sets are not "
                     "tiled before fetching nothing ahead without room",
                     (unsigned long long)mb, tiled, (int)r.fits, (int)r.prefetch_none);
        }
        qc_plan_result_free(&r);
    }
    qc_plan_cost_destroy(cost);
    qc_plan_program_free(&e.p);
}

/* qc_plan_make_room(p, room) gives what qc_plan_make(p) then qc_plan_room(room) gave (r, ok):
 * the same policies, peak, time, window, iterations and target reported, bit for bit. */
static void same_as_make_room(const struct qc_plan_program *pp, const struct qc_plan_cost *cost,
                              const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                              const struct qc_plan_params *room, const struct qc_plan_result *r,
                              bool ok)
{
    struct qc_plan_result m = {0};
    bool mok = !ok;
    T_EXPECT(qc_plan_make_room(pp, cost, hw, p, room, &m, &mok) == QC_OK, "%s", qc_error_last());
    T_EXPECT(mok == ok && m.fits == r->fits && m.peak == r->peak && m.target == r->target &&
                 m.step_s == r->step_s && m.window == r->window &&
                 m.prefetch_none == r->prefetch_none && m.iterations == r->iterations &&
                 m.host_bytes == r->host_bytes && m.recompute_bytes == r->recompute_bytes &&
                 memcmp(m.policy, r->policy, (size_t)pp->nblocks) == 0,
             "budget %llu, margin %.3f: one search (ok %d, peak %llu, target %llu, %d "
             "iterations, %.6f s) differs from planning again (ok %d, peak %llu, target %llu, %d "
             "iterations, %.6f s)",
             (unsigned long long)p->budget, p->margin, (int)mok, (unsigned long long)m.peak,
             (unsigned long long)m.target, m.iterations, m.step_s, (int)ok,
             (unsigned long long)r->peak, (unsigned long long)r->target, r->iterations, r->step_s);
    qc_plan_result_free(&m);
}

/* qc_plan_room over a small QCNet's step, serial copies (the CPU's), 2 % margin: for every
 * budget from the kept peak down (1/400 steps) whose plan fits only fetching nothing ahead,
 * either the room is there (the plan as it was, or the program planned again with the margin
 * taken twice, which then replaces it: under 93 % of the budget, the caller's target kept,
 * and qc_plan_check's re-simulation agrees) or it is not (the plan left as it was). Both the
 * replaced and the refused outcome must occur on the way down. The official widths, fused,
 * every edge set tiled (no r to hold: fetching ahead then makes the floor, as at AV2 size), a
 * host tier that takes every stash. */
static void test_room(void)
{
    struct qc_qcnet_config cfg;
    qc_qcnet_config_default(&cfg);
    cfg.attention = QC_ATTN_FUSED;
    enum qc_attn_edge_mode tiled[QC_QCNET_EDGE_SETS];
    for (int k = 0; k < QC_QCNET_EDGE_SETS; k++)
        tiled[k] = QC_ATTN_EDGE_TILED; /* no r to hold: the prefetch makes the floor */
    struct model_step ms;
    if (!model_step_make(&ms, &cfg, tiled))
        return;
    struct qc_plan_program *const pp = &ms.p;
    struct qc_plan_cost *const cost = ms.cost;
    struct qc_plan_hw hw = ms.hw;
    hw.serial_copies = true;
    hw.host_capacity = (uint64_t)64 << 30;
    struct qc_plan_params par;
    qc_plan_params_default(&par);
    par.margin = 0.02;
    struct qc_plan_result r;
    T_EXPECT(qc_plan_make(pp, cost, &hw, &par, &r) == QC_OK, "%s", qc_error_last());
    const uint64_t keep = r.keep_peak;
    qc_plan_result_free(&r);
    int none = 0, kept = 0, replaced = 0, refused = 0;
    for (int i = 1; i < 400; i++) {
        par.budget = keep - keep * (uint64_t)i / 400;
        { /* a plan at a learned margin over the configured one, its room the configured's */
            struct qc_plan_params learned = par;
            learned.margin = 0.03;
            bool ok2 = false;
            struct qc_plan_result r2 = {0};
            T_EXPECT(qc_plan_make(pp, cost, &hw, &learned, &r2) == QC_OK, "%s", qc_error_last());
            T_EXPECT(qc_plan_room(pp, cost, &hw, &par, &r2, &ok2) == QC_OK, "%s", qc_error_last());
            same_as_make_room(pp, cost, &hw, &learned, &par, &r2, ok2);
            qc_plan_result_free(&r2);
        }
        if (qc_plan_make(pp, cost, &hw, &par, &r) != QC_OK) {
            T_FAIL_AT("plan: %s", qc_error_last());
            break;
        }
        if (!r.fits) {
            qc_plan_result_free(&r);
            break;
        }
        if (!r.prefetch_none) {
            qc_plan_result_free(&r);
            continue;
        }
        none++;
        const uint64_t peak0 = r.peak, target0 = r.target;
        const bool had = qc_plan_has_room(&par, &r);
        bool ok = false;
        T_EXPECT(qc_plan_room(pp, cost, &hw, &par, &r, &ok) == QC_OK, "%s", qc_error_last());
        same_as_make_room(pp, cost, &hw, &par, &par, &r, ok);
        T_EXPECT(had == (ok && r.peak == peak0), "budget %llu: qc_plan_has_room says %d",
                 (unsigned long long)par.budget, (int)had);
        const uint64_t room = target_of(par.budget, 0.07);
        if (!ok) {
            refused++;
            T_EXPECT(r.peak == peak0 && peak0 > room && r.fits,
                     "budget %llu: no room, but the plan changed or had it (%llu, %llu)",
                     (unsigned long long)par.budget, (unsigned long long)r.peak,
                     (unsigned long long)peak0);
        } else {
            if (r.peak == peak0)
                kept++;
            else
                replaced++;
            T_EXPECT(r.fits && r.peak <= room && r.target == target0,
                     "budget %llu: room, but peak %llu over %llu (target %llu, was %llu)",
                     (unsigned long long)par.budget, (unsigned long long)r.peak,
                     (unsigned long long)room, (unsigned long long)r.target,
                     (unsigned long long)target0);
            T_EXPECT(qc_plan_check(pp, cost, &hw, &par, &r) == QC_OK, "budget %llu: %s",
                     (unsigned long long)par.budget, qc_error_last());
        }
        qc_plan_result_free(&r);
    }
    printf("  %d budgets fit only fetching nothing ahead: room kept %d, planned again %d, "
           "none %d\n",
           none, kept, replaced, refused);
    T_EXPECT(replaced > 0 && refused > 0, "not every outcome met: kept %d, replaced %d, none %d",
             kept, replaced, refused);
    model_step_free(&ms);
}

/* Lifetime classes (qc_plan_program_lives) of a hand-made program, and the memory context
 * placing its blocks by them (qc_memctx_set_lives): a stash apart from what outlives the
 * step. */
static void test_lives(void)
{
    struct qc_plan_program p;
    qc_plan_program_init(&p);
    qc_plan_program_block(&p, "b0", QC_PLAN_MLP);
    const char *tags[] = {"glue/tmp", "b0/stash", "b0/scratch", "b0/out", "b0/grad", "opt/tmp"};
    int32_t id[6];
    id[0] = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 1000, 1, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, id[0], 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD, 0, -1, 0, 0, 0);
    id[1] = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 1000, 1, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_STASH, 0, id[1], 0, 0, 0);
    id[2] = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 1000, 2, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, id[2], 0, 0, 0);
    id[3] = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 1000, 1, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD_END, 0, -1, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_BWD, 0, -1, 0, 0, 1);
    id[4] = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 1000, 2, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, id[1], 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_BWD_END, 0, -1, 0, 0, 1);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, id[3], 0, 0, 0);
    id[5] = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 1000, 2, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, id[5], 0, 0, 0);
    for (int i = 0; i < 6; i++)
        T_EXPECT(qc_plan_program_tag(&p, id[i], tags[i]) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_plan_program_finish(&p) == QC_OK, "%s", qc_error_last());
    uint8_t life[6];
    T_EXPECT(qc_plan_program_lives(&p, life) == QC_OK, "%s", qc_error_last());
    /* glue's scratch and the optimizer's after the last marker: no marker between; the stash
     * freed in the backward: a later span; the output freed after the last marker and the
     * gradient never freed: past the step's blocks */
    const uint8_t want[6] = {QC_PLAN_LIFE_SPAN, QC_PLAN_LIFE_PHASE, QC_PLAN_LIFE_SPAN,
                             QC_PLAN_LIFE_LONG, QC_PLAN_LIFE_LONG,  QC_PLAN_LIFE_SPAN};
    for (int i = 0; i < 6; i++)
        T_EXPECT(life[i] == want[i], "%s: class %d, want %d", tags[i], life[i], want[i]);

    /* the context places by tag: the stash in a segment of its own, released whole once it is
     * freed although the output lives on; without the table they share one segment */
    for (int with = 0; with < 2; with++) {
        struct qc_alloc *a = NULL;
        T_EXPECT(qc_alloc_create(NULL, NULL, &a) == QC_OK, "%s", qc_error_last());
        struct qc_memctx_params mp = {.alloc = a};
        struct qc_memctx *mc = NULL;
        T_EXPECT(qc_memctx_create(&mp, &mc) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_memctx_set_lives(mc, with ? &p : NULL) == QC_OK, "%s", qc_error_last());
        void *out = qc_memctx_alloc(mc, QC_MEM_MODEL, 100000, "b0/out");
        void *tmp = qc_memctx_alloc(mc, QC_MEM_MODEL, 100000, "b0/stash");
        T_EXPECT(out && tmp, "allocations");
        qc_memctx_free(mc, QC_MEM_MODEL, tmp, 100000);
        T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "%s", qc_error_last());
        struct qc_alloc_stats st;
        qc_alloc_stats_get(a, &st);
        T_EXPECT_EQ_U64(st.bytes_reserved_small, (uint64_t)2 * MB,
                        "%s: one small segment left once the stash is freed",
                        with ? "lifetimes" : "one class");
        T_EXPECT(with ? (uintptr_t)out / (2 * MB) != (uintptr_t)tmp / (2 * MB)
                      : (uintptr_t)out / (2 * MB) == (uintptr_t)tmp / (2 * MB),
                 "%s: output %p, stash %p", with ? "apart" : "together", out, tmp);
        qc_memctx_free(mc, QC_MEM_MODEL, out, 100000);
        qc_memctx_destroy(mc);
        qc_alloc_destroy(a);
    }
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
    QC_TEST ("plan: the edge modes: the tiled mode's FE priced, the sets ordered by bytes per "
             "second, tiled only as far as the budget needs")
        test_edge_modes();
    QC_TEST ("plan: fitting only by fetching nothing ahead decides the edge modes with room alone")
        test_edge_modes_prefetch();
    QC_TEST ("plan: room for a plan that fetches nothing ahead (qc_plan_room)")
        test_room();
    QC_TEST ("plan: each allocation's lifetime class from the program; the memory context "
             "places blocks by it")
        test_lives();
    return qc_test_summary();
}
