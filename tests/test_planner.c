/*
 * test_planner.c — planning without a run (src/train/memory/plan_run.c, qc_train.h's planner
 * session, the API `qctrain plan` and `qctrain tune` use; qc_plan.h, "Planning without a run"):
 *   - the session's plan of a run's first batch predicts that run's measured peak from the
 *     configuration alone: kept whole exactly (the dry run replays every block's memory spec,
 *     src/plan/README.md), under a budget within PLAN_ERR (3 %; the docs state 5 %) and as the
 *     run's own plan predicted it;
 *   - hardware figures and planner parameters given per call: no tiers leaves only recompute,
 *     forced keep gives the peak kept whole, a cost model given by the caller (twice as slow,
 *     the same transients) doubles the predicted time and keeps the bytes; the same batch is
 *     described once;
 *   - the largest batch: kept whole <= under the planner, each one fitting and the next not;
 *   - a batch is described from its scenes' sizes, never collated (issue 25: the search is
 *     incremental): the program, the counts and the staged bytes equal a collated batch's on
 *     cpu and cuda, on typical, dense and mixed scenes;
 *   - `qctrain plan --json`: the documented fields, the floor explained ("explain": its holders
 *     sum to its peak, the fixed bytes by owner), a budget under one scene's smallest plan
 *     (the budget one scene needs, exit 1; that budget then fits one), batch sizes bounded as
 *     train.batch_size, bad arguments and missing files refused with exit 2;
 *   - GPU presets (issue 30): the card's bytes less the reserve, roofline times (never the
 *     CPU's), per-rank moments under ZeRO 1 and 0, no time without figures.
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
#include "qc_batch.h"
#include "qc_config.h"
#include "qc_graph.h"
#include "qc_qcnet.h"
#include "qc_synth.h"
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
        /* forced keep under the same budget: the peak kept whole, not fitting (model.edge_mode
         * auto: with every edge set tiled, the smallest kept-whole program, so at most the
         * materialised one's) */
        par.mode = QC_PLAN_MODE_KEEP;
        T_EXPECT(qc_train_planner_plan_with(pl, 1, 2, NULL, &par, &r, NULL) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(r.peak == r.keep_peak && r.peak <= keep.keep_peak && !r.fits,
                 "forced keep: peak %" PRIu64 " (kept whole %" PRIu64 ", materialised %" PRIu64 ")",
                 r.peak, r.keep_peak, keep.keep_peak);
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

/* Edge contexts of prog in mode m (qc_plan_edge_mode), and those with r to place. */
static int edge_sets_in(const struct qc_plan_program *prog, int m, int *placed)
{
    int n = 0;
    *placed = 0;
    for (int32_t b = 0; b < prog->nblocks; b++)
        if (prog->blocks[b].kind == QC_PLAN_EDGES && prog->blocks[b].edge_mode != 0) {
            ++*placed;
            n += prog->blocks[b].edge_mode == m;
        }
    return n;
}

/* The session's plan of scene 0 under cfg with budget (0: none), policy forced by keep. */
static bool plan_one(const struct qc_config *cfg, uint64_t budget, bool keep,
                     struct qc_plan_result *r, int *tiled, int *placed)
{
    struct qc_train_planner *pl = NULL;
    T_EXPECT(qc_train_planner_create(cfg, NULL, 0, NULL, &pl) == QC_OK, "%s", qc_error_last());
    if (!pl)
        return false;
    struct qc_plan_params par;
    qc_train_plan_params(cfg, &par);
    par.budget = budget;
    if (keep)
        par.mode = QC_PLAN_MODE_KEEP;
    const struct qc_plan_program *prog = NULL;
    const enum qc_status st = qc_train_planner_plan_with(pl, 0, 1, NULL, &par, r, &prog);
    T_EXPECT(st == QC_OK, "%s", qc_error_last());
    if (st == QC_OK)
        *tiled = edge_sets_in(prog, QC_PLAN_EDGE_TILED, placed);
    qc_train_planner_destroy(pl);
    return st == QC_OK;
}

static void test_edge_modes(void)
{
    QC_TEST ("planner and trainer: model.edge_mode=auto tiles edge sets only where the "
             "materialised plan does not fit (unsplit, the run's peak as predicted, within the "
             "budget); a configured mode is kept; the tiled mode predicts a slower step") {
        struct qc_config cfg, cm, ct;
        small_config(&cfg);
        cfg.attention = QC_ATTENTION_FUSED;
        cfg.edge_mode = QC_EDGE_MODE_AUTO;
        cfg.plan_margin = 0.10; /* the small pool's fragmentation (test_session) */
        cm = ct = cfg;
        cm.edge_mode = QC_EDGE_MODE_MATERIALISED;
        ct.edge_mode = QC_EDGE_MODE_TILED;
        struct qc_plan_result rm = {0}, rt = {0}, ra = {0};
        int tm = -1, tt = -1, ta = -1, nm = 0, nt = 0, na = 0;
        if (!plan_one(&cm, 0, true, &rm, &tm, &nm) || !plan_one(&ct, 0, true, &rt, &tt, &nt) ||
            !plan_one(&cfg, 0, true, &ra, &ta, &na))
            continue;
        printf("  kept whole: materialised %" PRIu64 " B, %.4f s; tiled %" PRIu64
               " B, %.4f s (%d of %d edge sets)\n",
               rm.keep_peak, rm.keep_step_s, rt.keep_peak, rt.keep_step_s, tt, nt);
        T_EXPECT(nm > 0 && tm == 0 && tt == nt,
                 "forced modes: %d of %d tiled (materialised), %d "
                 "of %d (tiled)",
                 tm, nm, tt, nt);
        T_EXPECT(ta == 0 && ra.keep_peak == rm.keep_peak,
                 "no budget: auto keeps every set "
                 "materialised (%d tiled)",
                 ta);
        T_EXPECT(rt.keep_step_s > rm.keep_step_s && rt.keep_peak < rm.keep_peak,
                 "the tiled mode: slower (%.4f vs %.4f s), smaller (%" PRIu64 " vs %" PRIu64 ")",
                 rt.keep_step_s, rm.keep_step_s, rt.keep_peak, rm.keep_peak);
        /* a budget whose target lies between the two (everything kept: plan.policy=keep) */
        const uint64_t target = rt.keep_peak + (rm.keep_peak - rt.keep_peak) / 2;
        const uint64_t budget = (uint64_t)((double)target / (1.0 - cfg.plan_margin)) + 1;
        qc_plan_result_free(&ra);
        qc_plan_result_free(&rm);
        T_EXPECT(plan_one(&cfg, budget, true, &ra, &ta, &na), "auto under the budget");
        T_EXPECT(plan_one(&cm, budget, true, &rm, &tm, &nm), "materialised under the budget");
        printf("  budget %" PRIu64 ": auto tiles %d of %d edge sets, peak %" PRIu64 " (fits %d); "
               "materialised peak %" PRIu64 " (fits %d)\n",
               budget, ta, na, ra.peak, (int)ra.fits, rm.peak, (int)rm.fits);
        T_EXPECT(ra.fits && ta > 0, "auto: fits %d with %d sets tiled", (int)ra.fits, ta);
        T_EXPECT(!rm.fits && tm == 0, "forced materialised: fits %d, %d tiled", (int)rm.fits, tm);
        /* the trainer runs the batch whole in the modes the session chose */
        struct qc_config cb = cfg;
        cb.device_budget = budget;
        cb.plan_policy = QC_PLAN_KEEP;
        struct qc_step_metrics mb = {0};
        if (one_step(&cb, "edge-auto", &mb)) {
            printf("  run: predicted %" PRIu64 ", measured %" PRIu64 " (device %" PRIu64
                   "), splits %" PRId64 ", re-plans %" PRId64 "\n",
                   mb.predicted_peak_bytes, mb.peak_active_bytes, mb.peak_device_bytes, mb.splits,
                   mb.replans);
            T_EXPECT(mb.splits == 0 && mb.replans == 0, "splits %" PRId64 ", re-plans %" PRId64,
                     mb.splits, mb.replans);
            T_EXPECT(mb.peak_device_bytes <= budget, "measured peak %" PRIu64 " over the budget",
                     mb.peak_device_bytes);
            T_EXPECT(mb.predicted_peak_bytes == ra.peak && mb.peak_active_bytes == ra.peak,
                     "the run's plan %" PRIu64 ", measured %" PRIu64 ", the session's %" PRIu64,
                     mb.predicted_peak_bytes, mb.peak_active_bytes, ra.peak);
        }
        qc_plan_result_free(&ra);
        qc_plan_result_free(&rm);
        qc_plan_result_free(&rt);
    }
}

/* The program and staged bytes of a collated batch of generated scenes first .. first + B - 1
 * against the session's, which sums the scenes' sizes. */
static void compare_sized(const struct qc_config *cfg, int64_t first, int64_t B)
{
    struct qc_train_planner *pl = NULL;
    T_EXPECT(qc_train_planner_create(cfg, NULL, 0, NULL, &pl) == QC_OK, "%s", qc_error_last());
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    struct qc_qcnet *dry = NULL;
    T_EXPECT(qc_qcnet_create_dry(&mc, &dry) == QC_OK, "%s", qc_error_last());
    struct qc_graph_builder *gb = NULL;
    T_EXPECT(qc_graph_builder_create(&gb) == QC_OK, "builder");
    struct qc_scene *sc = calloc((size_t)B, sizeof *sc);
    const struct qc_scene **ptr = calloc((size_t)B, sizeof *ptr);
    if (!pl || !dry || !gb || !sc || !ptr)
        goto out;
    for (int64_t i = 0; i < B; i++) {
        T_EXPECT(qc_synth_scene((uint64_t)cfg->seed, first + i,
                                (enum qc_synth_profile)cfg->synthetic_profile, &sc[i]) == QC_OK,
                 "scene");
        ptr[i] = &sc[i];
    }
    struct qc_batch b;
    T_EXPECT(qc_batch_collate(ptr, B, NULL, true, &b) == QC_OK, "%s", qc_error_last());
    struct qc_graph_params gp;
    qc_train_graph_params(cfg, &gp);
    T_EXPECT(qc_batch_build_graph(&b, gb, &gp) == QC_OK, "%s", qc_error_last());
    struct qc_plan_program full;
    qc_plan_program_init(&full);
    T_EXPECT(qc_qcnet_describe(dry, &b, cfg->device_kind == QC_CONFIG_DEVICE_CUDA, &full) == QC_OK,
             "%s", qc_error_last());
    struct qc_plan_result r = {0};
    const struct qc_plan_program *sized = NULL;
    T_EXPECT(qc_train_planner_plan_at(pl, first, B, &r, &sized) == QC_OK, "%s", qc_error_last());
    const struct qc_batch *sb = qc_train_planner_batch(pl);
    if (sized && sb) {
        T_EXPECT(sb->num_agents == b.num_agents && sb->num_polygons == b.num_polygons &&
                     sb->num_points == b.num_points && sb->num_pl2pl == b.num_pl2pl,
                 "B %" PRId64 ": counts", B);
        for (int e = 0; e < QC_EDGE_SET_COUNT; e++)
            T_EXPECT(sb->graph.e[e].num_edges == b.graph.e[e].num_edges &&
                         sb->graph.e[e].num_src == b.graph.e[e].num_src &&
                         sb->graph.e[e].num_dst == b.graph.e[e].num_dst,
                     "B %" PRId64 ", %s: %" PRId64 " edges summed, %" PRId64 " built", B,
                     qc_edge_set_name((enum qc_edge_set)e), sb->graph.e[e].num_edges,
                     b.graph.e[e].num_edges);
        T_EXPECT(sb->node_bytes == b.node_bytes && sb->graph_bytes == b.graph_bytes,
                 "B %" PRId64 ": staged bytes %zu + %zu summed, %zu + %zu collated", B,
                 sb->node_bytes, sb->graph_bytes, b.node_bytes, b.graph_bytes);
        T_EXPECT(sized->nev == full.nev && sized->nblocks == full.nblocks &&
                     memcmp(sized->ev, full.ev, (size_t)full.nev * sizeof *full.ev) == 0,
                 "B %" PRId64 ": the program (%d / %d events)", B, sized->nev, full.nev);
        for (int32_t i = 0; i < full.nev && i < sized->nev; i++) {
            const struct qc_plan_event *x = &sized->ev[i], *y = &full.ev[i];
            if (memcmp(x, y, sizeof *x) == 0)
                continue;
            T_EXPECT(false,
                     "B %" PRId64 ": event %d (op %d, block %d, id %d): %" PRIu64
                     " bytes summed, %" PRIu64 " collated (op %d, block %d, id %d, %s)",
                     B, i, x->op, x->block, x->id, x->bytes, y->bytes, y->op, y->block, y->id,
                     qc_plan_program_tag_of(&full, y->id));
            break;
        }
        for (int32_t k = 0; k < full.nblocks && k < sized->nblocks; k++)
            T_EXPECT(sized->blocks[k].rows == full.blocks[k].rows &&
                         sized->blocks[k].edges == full.blocks[k].edges &&
                         sized->blocks[k].srcs == full.blocks[k].srcs,
                     "B %" PRId64 ", block %s: size drivers", B, full.blocks[k].name);
    }
    qc_plan_result_free(&r);
    qc_plan_program_free(&full);
    qc_batch_release(&b);
out:
    for (int64_t i = 0; sc && i < B; i++)
        qc_scene_free(&sc[i]);
    free(sc);
    free(ptr);
    qc_graph_builder_destroy(gb);
    qc_qcnet_destroy(dry);
    qc_train_planner_destroy(pl);
}

static void test_sizes(void)
{
    QC_TEST ("planner session: a batch described from its scenes' sizes is the collated batch "
             "(program, counts, staged bytes; cpu and cuda; typical, dense, mixed)") {
        struct qc_config cfg;
        small_config(&cfg);
        const int profiles[3] = {QC_SCENE_TYPICAL, QC_SCENE_DENSE, QC_SCENE_MIXED};
        for (int k = 0; k < 3; k++) {
            cfg.synthetic_profile = (enum qc_scene_profile)profiles[k];
            for (int64_t B = 1; B <= 3; B++) {
                cfg.device_kind = QC_CONFIG_DEVICE_CPU;
                compare_sized(&cfg, 2 * k, B);
                cfg.device_kind = QC_CONFIG_DEVICE_CUDA;
                compare_sized(&cfg, 2 * k + 1, B);
            }
        }
    }
}

/* args after "--set plan.calibration=builtin": the figures these tests pin come from the
 * built-in coefficients, never from this machine's calibration (test_calib.c tests that). */
static void builtin_args(const char *const *args, const char **out, int cap)
{
    int n = 0;
    out[n++] = "--set";
    out[n++] = "plan.calibration=builtin";
    for (int i = 0; args[i] && n < cap - 1; i++)
        out[n++] = args[i];
    out[n] = NULL;
}

/* Runs `qctrain plan` with args (the built-in coefficients); returns the exit code and stdout
 * (malloc'd). */
static int plan_cli(const char *const *args, char **out)
{
    char log[512];
    snprintf(log, sizeof log, "%s/plan.out", tmp_root);
    const char *a[64];
    builtin_args(args, a, 64);
    return t_run_output(qctrain, a, log, out);
}

/* The same for a command that must end at once (refused input): a 30 s watchdog, so that an
 * unbounded batch (before issue 25's bound: 22 GB and minutes) fails the test, not the host. */
static int plan_cli_quick(const char *const *args, char **out)
{
    char log[512];
    snprintf(log, sizeof log, "%s/plan.out", tmp_root);
    unlink(log);
    struct t_args a = {{0}, 0};
    t_args_add(&a, qctrain);
    const char *b[64];
    builtin_args(args, b, 64);
    for (int i = 0; b[i]; i++)
        t_args_add(&a, b[i]);
    const pid_t pid = t_spawn(&a, log, NULL, 30);
    const int st = pid < 0 ? -1 : t_wait(pid);
    *out = t_read_file(log, NULL);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 128;
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

        /* a budget under one scene's smallest plan: the budget one scene needs, exit 1 */
        static const char *const tiny[] = {"--preset", "cpu-smoke", "plan", "--budget",
                                           "1MiB",     "--json",    NULL};
        rc = plan_cli(tiny, &out);
        const char *brace = out ? strchr(out, '{') : NULL;
        j = brace ? cJSON_Parse(brace) : NULL;
        T_EXPECT(rc == 1 && j && strstr(out, "needs a budget of about"), "exit %d: %s", rc,
                 out ? out : "");
        T_EXPECT(j && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "fits")) &&
                     cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "largest_batch")) ==
                         0,
                 "1 MiB: does not fit, largest 0");
        const double need =
            j ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "budget_needed_bytes"))
              : 0;
        T_EXPECT(need > 1048576.0, "the budget one scene needs: %.0f", need);
        cJSON_Delete(j);
        free(out);
        if (need > 0) { /* that budget fits one scene */
            char b[64];
            snprintf(b, sizeof b, "%.0f", need);
            const char *const enough[] = {"--preset", "cpu-smoke",   "plan", "--budget", b,
                                          "--json",   "--max-batch", "2",    NULL};
            rc = plan_cli(enough, &out);
            j = out ? cJSON_Parse(out) : NULL;
            T_EXPECT(
                rc == 0 && j &&
                    cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "largest_batch")) >= 1,
                "--budget %s: exit %d: %s", b, rc, out ? out : "");
            cJSON_Delete(j);
            free(out);
        }

        /* bad input: exit 2 (usage and input errors), quickly */
        static const char *const bad[][7] = {
            {"plan", "--batch-size", "0", NULL},
            {"plan", "--batch-size", "100000", NULL},
            {"plan", "--batch-size", "4097", NULL},
            {"plan", "--max-batch", "1000000", NULL},
            {"plan", "--max-batch", "4097", NULL},
            {"plan", "--budget", "lots", NULL},
            {"plan", "--data", "/nonexistent.qcshard", NULL},
            {"plan", "--cost", "/nonexistent.json", NULL},
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            rc = plan_cli_quick(bad[k], &out);
            T_EXPECT(rc == 2 && out && strstr(out, "error"), "%s %s: exit %d: %s", bad[k][1],
                     bad[k][2], rc, out ? out : "");
            free(out);
        }
    }

    QC_TEST ("qctrain plan: the floor explained (text and the JSON's \"explain\": holders sum "
             "to its peak, fixed bytes by owner, a knob per kind)") {
        static const char *const args[] = {"--preset", "cpu-smoke",   "plan", "--batch-size",
                                           "2",        "--max-batch", "4",    "--json",
                                           NULL};
        char *out = NULL;
        int rc = plan_cli(args, &out);
        cJSON *j = out ? cJSON_Parse(out) : NULL;
        T_EXPECT(rc == 0 && j, "exit %d: %s", rc, out ? out : "");
        const cJSON *ex = j ? cJSON_GetObjectItemCaseSensitive(j, "explain") : NULL;
        T_EXPECT(ex != NULL, "an explain object");
        if (ex) {
            const double peak =
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(ex, "peak_bytes"));
            const double planned =
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "predicted_peak_bytes"));
            T_EXPECT(peak > 0 && peak <= planned, "floor %.0f <= the plan's peak %.0f", peak,
                     planned);
            double kinds = 0, holders = 0, fixed = 0;
            const cJSON *it;
            cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(ex, "by_kind")) kinds +=
                cJSON_GetNumberValue(it);
            cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(ex, "fixed")) fixed +=
                cJSON_GetNumberValue(it);
            int tensors = 0;
            cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(ex, "holders"))
            {
                holders += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(it, "bytes"));
                const char *kind =
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "kind"));
                const char *name =
                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "name"));
                T_EXPECT(kind && name && name[0], "a holder has a kind and a name");
                tensors +=
                    kind && (strcmp(kind, "tensor") == 0 || strcmp(kind, "working_set") == 0 ||
                             strcmp(kind, "stash_read") == 0);
            }
            T_EXPECT(kinds == peak && holders == peak, "by kind %.0f, holders %.0f, peak %.0f",
                     kinds, holders, peak);
            const double fx = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(ex, "by_kind"), "fixed"));
            T_EXPECT(fixed == fx && fixed > 0, "fixed by owner %.0f, fixed held %.0f", fixed, fx);
            T_EXPECT(tensors > 0, "unmovable tensors named at the floor");
            const cJSON *knobs = cJSON_GetObjectItemCaseSensitive(ex, "knobs");
            T_EXPECT(cJSON_GetArraySize(knobs) == 6, "a knob per kind");
        }
        cJSON_Delete(j);
        free(out);
        static const char *const text[] = {"--preset",    "cpu-smoke", "plan",
                                           "--max-batch", "2",         NULL};
        rc = plan_cli(text, &out);
        T_EXPECT(rc == 0 && out && strstr(out, "floor: the smallest plan") &&
                     strstr(out, "what moves it:") && strstr(out, "fixed: parameters"),
                 "exit %d: %s", rc, out ? out : "");
        free(out);
    }

    QC_TEST ("qctrain plan for GPU presets: the card less its reserve, roofline times (never the "
             "CPU's), per-rank AdamW moments under ZeRO 1, no time without figures") {
        static const char *const z1[] = {"--preset", "rtx3090x8",   "plan", "--batch-size",
                                         "1",        "--max-batch", "2",    "--json",
                                         NULL};
        static const char *const z0[] = {"--preset", "rtx3090x8",    "--set", "dist.zero_stage=0",
                                         "plan",     "--batch-size", "1",     "--max-batch",
                                         "2",        "--json",       NULL};
        char *out = NULL;
        double moments[2] = {0, 0}, params = 0;
        for (int k = 0; k < 2; k++) {
            int rc = plan_cli(k ? z0 : z1, &out);
            cJSON *j = out ? cJSON_Parse(out) : NULL;
            T_EXPECT(rc == 0 && j, "exit %d: %s", rc, out ? out : "");
            const char *cost =
                j ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "cost_model")) : NULL;
            T_EXPECT(cost && strstr(cost, "roofline") && !strstr(cost, "CPU"), "cost model %s",
                     cost ? cost : "(none)");
            T_EXPECT(j &&
                         cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                             j, "budget_bytes")) == (double)(23ull << 30) &&
                         cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                             j, "device_memory_bytes")) == (double)(24ull << 30),
                     "24 GiB card, 23 GiB budget");
            const double step =
                j ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "predicted_step_s"))
                  : 0;
            T_EXPECT(step > 0 && step < 1.0, "a GPU's step of one AV2 scene: %g s", step);
            const cJSON *rk = j ? cJSON_GetObjectItemCaseSensitive(j, "ranks") : NULL;
            T_EXPECT(
                rk && cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rk, "world_size")) == 8,
                "8 ranks");
            moments[k] =
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rk, "moments_bytes"));
            params = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rk, "parameters_bytes"));
            T_EXPECT(cJSON_GetNumberValue(
                         cJSON_GetObjectItemCaseSensitive(rk, "comm_bytes_per_step")) > params,
                     "the gradients' reduction sends more than the parameters' bytes");
            cJSON_Delete(j);
            free(out);
        }
        T_EXPECT(params > 0 && moments[1] >= 2 * params && moments[0] <= 2 * params / 8 + 4096,
                 "moments: ZeRO 1 %.0f (a shard), ZeRO 0 %.0f (whole), parameters %.0f", moments[0],
                 moments[1], params);
        /* the text says where the times come from, never the CPU's coefficients */
        static const char *const h200[] = {"--preset", "h200x1",      "plan", "--batch-size",
                                           "1",        "--max-batch", "1",    NULL};
        int rc = plan_cli(h200, &out);
        T_EXPECT(rc == 0 && out && strstr(out, "roofline") && !strstr(out, "CPU backend") &&
                     strstr(out, "device memory:") && !strstr(out, "budget           none"),
                 "exit %d: %s", rc, out ? out : "");
        free(out);
        /* cuda without a calibration or figures: no time at all */
        static const char *const bare[] = {"--preset",    "cpu-smoke", "--device", "cuda", "plan",
                                           "--max-batch", "1",         "--json",   NULL};
        rc = plan_cli(bare, &out);
        cJSON *j = out ? cJSON_Parse(out) : NULL;
        T_EXPECT(rc == 0 && j &&
                     cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "predicted_step_s")),
                 "no time for a GPU without figures: exit %d: %s", rc, out ? out : "");
        cJSON_Delete(j);
        free(out);
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-planner-%d", (int)getpid());
    t_rm_rf(tmp_root);
    mkdir(tmp_root, 0755);
    test_session();
    test_edge_modes();
    test_sizes();
    test_cli();
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
