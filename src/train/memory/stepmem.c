/*
 * stepmem.c — the memory system in the training step (train_internal.h, "The step's memory").
 *
 * Each group of a step (a batch of scenes, one micro-batch) is
 *   1. planned: the dry run of the config's model writes the group's program from its batch
 *      (qc_qcnet_describe), the allocator's allocated bytes now are the program's fixed bytes,
 *      and the planner (src/plan) chooses the stash policies under device.budget minus the
 *      margin; the planning time is measured;
 *   2. admitted: the group runs whole when its admission plan fits under device.budget minus
 *      the configured margin; the admission plan is made with the built-in cost coefficients
 *      and the configured hw.* figures, so that this decision (a split changes the bits) is a
 *      function of the data, the configuration and the step only, never of timing, of the
 *      calibration or of the allocator's cache. With model.edge_mode=auto the admission plan
 *      also chooses the edge modes (qc_plan_make_edges: every edge set materialised when that
 *      fits, else sets tiled until one fits, src/plan/README.md "The edge modes"), which the
 *      model is set to before the group runs (qc_train_edge_modes_set; tiling changes the edge
 *      FEs' gradient bits, hence the same rule). Otherwise the group is split into two halves
 *      of its scenes (recursively), built by the loader and run one after the other (each
 *      with the batch and admission plan admission made of it: part_kept) with the
 *      loss denominators (qc_qcnet_ctx.loss_norm) of the scenes that run and the group's
 *      weight, so their losses and gradients add up to the group's (within fp32 rounding;
 *      dropout is keyed by scene, so the parts draw the whole group's masks). A scene that does
 *      not fit alone is an error naming it, its sizes and the budget it needs at the
 *      configured margin, or, with skip_oversized, skipped with a warning: it keeps no share of
 *      the denominators (a group of skipped scenes only runs nothing: loop.c makes a step
 *      without a scene no step; one skipped only after running out beside others of its group
 *      has the group run again without it: run_admitted);
 *   3. run with its plan (qc_qcnet_set_plan): the calibrated plan at the margin in force (else
 *      at the configured margin, else the admission plan from an empty cache; a calibrated plan
 *      that fetches nothing ahead without room, qc_plan_room, gives way to an admission plan
 *      that has it). With two compute threads the calibrated plan of each program admission
 *      describes is searched on a helper thread while admission searches its own
 *      (plan_beside.h: the same plan, about one search on the step's path instead of two).
 *      Under a budget the loop hands each group the next group's host batch (the next epoch's
 *      first after an epoch's last), and once this group is admitted the next one's
 *      description, admission plan and calibrated plan are made on another helper while this
 *      one runs (plan_ahead.h): the next group takes them when they were made of exactly what
 *      it would plan with (its batch, the fixed bytes it measures, the admission's figures; the
 *      calibrated plan: the figures in force and a peak under the margin in force, its cost
 *      model one group's measurements behind), so it starts with no planning on its path.
 *      When the allocator
 * still runs out (a misprediction, fragmentation), the group is rolled back (its activations
 * released, the gradients restored from a host copy, or zeroed when the step had none yet:
 * parameters and optimizer state are untouched until the step's end), the cache emptied, the margin
 * in force raised (it never decays below the largest fragmentation measured so far: learn_frag),
 * and the group re-run whole under built-in plans of larger margins (run_batch),
 * up to 3 times (8 for one scene) before it is split. Dropout is keyed, so the re-run gives the
 * bits of a run that never ran out. A step with a rollback is flagged (rolled_back) and its
 * measured peak is kept out of the margin's misprediction figure. with several ranks
 * (train_dist.c), the rank's last group of the step is armed: the gradient ranges its backward
 * reports start reducing at once. The parts of a split group before the last run held (their
 * gradients are not final); a rollback after ranges were reported waits for their reduction and
 * keeps the reduced values aside (they belong to the reduction; the re-run's reports of them are
 * dropped), restored when the group is done.
 *   4. measured: per block times and transients calibrate the cost model (RUN/plan_cost.json);
 *      the step's predicted peak, offloaded and recomputed bytes, stall, re-plans and splits go
 *      to metrics.jsonl; the plan of the step with the highest measured peak goes to
 *      memory.json.
 */
#include "train_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <omp.h>

#include "plan_ahead.h"
#include "plan_beside.h"
#include "qc_loader.h"
#include "qc_offload.h"
#include "qc_oom.h"
#include "qc_plan.h"
#include "qc_prof.h"
#include "qc_progress.h" /* qc_format_bytes */
#include "train_dist.h"

#define MAX_ATTEMPTS   3     /* runs of a group under plans before it is split */
#define MAX_ATTEMPTS_1 8     /* ... of one scene, which cannot be split */
#define MARGIN_MAX     0.5   /* of the budget */
#define MARGIN_STEP    0.03  /* the least a failure raises the margin by */
#define MARGIN_JUMP    0.10  /* the most */
#define MARGIN_DECAY   0.005 /* a step without a failure or a miss gives back this much */
#define FRAG_SLACK     ((uint64_t)2 << 20) /* a request's commit granule (2 MiB on every backend) */

struct train_mem {
    struct qc_config cfg;
    struct qc_train_backend *be;
    struct qc_qcnet *dry;
    struct qc_plan_program prog;
    struct qc_plan_cost *cost;
    struct qc_plan_params par;
    struct qc_plan_hw hw;
    /* admission (which scenes run together, which are skipped) is decided by these alone, so
     * that it is a function of the data, the configuration and the step, never of timing or
     * of the allocator's cache: the built-in cost coefficients (never calibrated) and the
     * configured hardware figures (never measured), at the configured margin par.margin */
    struct qc_plan_cost *cost0;
    struct qc_plan_hw hw0;
    /* the admission of the whole group that prog describes (admit_parts), for its first run:
     * run_batch takes it instead of describing and planning the same batch again; any new
     * description drops it */
    const struct qc_batch *admitted_batch;
    struct qc_plan_result admitted;
    /* the calibrated plan of each program admission plans, searched on a helper thread while
     * admission searches its own (plan_beside.h): NULL with one compute thread or no budget.
     * Every new description and every calibration drops the plan in flight */
    struct plan_beside *beside;
    bool beside_want;  /* admission is describing: start the calibrated plan of each program */
    bool beside_check; /* tests: plan each on this thread too and compare (train_mem_beside) */
    int64_t beside_made, beside_differ;
    /* the next group's planning, made on a helper thread while this group runs (plan_ahead.h):
     * NULL without a budget. next: the next group's host batch, when the loop fetched it before
     * this group (train_mem_group), started once this group is admitted; ahead_out: what the
     * take of this group's gave (its calibrated plan, for the first run of ahead_batch) */
    struct plan_ahead *ahead;
    const struct qc_batch *next;
    const struct qc_batch *ahead_batch;
    struct plan_ahead_out ahead_out;
    int64_t ahead_made, ahead_cal_made, ahead_differ;
    /* the parts of split groups run with the batch and admission plan admission made of them
     * (part_admitted), and with the beside check the ones whose plan made again differed */
    int64_t parts_kept, parts_differ;
    int64_t fault_step; /* test hook QC_FAULT_OOM_STEP=S[:K]: 0 = off (fault_from_env) */
    int64_t fault_k;
    int64_t fault_scene; /* test hook QC_FAULT_OOM_SCENE=I: -1 = off (fault_from_env) */
    int64_t step_no;     /* the step running (1-based) */
    uint64_t frag_seen; /* the batch's runs: the most reserved-but-unallocated bytes at a failure */
    double margin;      /* in force: par.margin raised by failures and misses, decaying back
                           to frag_floor */
    double frag_floor;  /* the largest fragmentation this run measured (reserved holding data −
                           allocated, at a step's peak or at a failure) plus FRAG_SLACK, of the
                           budget: the margin never decays below it (learn_frag) */
    bool choose_edges;  /* the planner chooses the edge modes (qc_train_edge_choose) */
    uint32_t tiled;     /* the edge sets tiled in prog (the dry model's, and the model's when it
                           runs prog): bit s = enum qc_edge_set s */
    uint32_t tiled_said; /* the mask the log last named */
    bool step_missed;    /* this step ran out or peaked over its prediction */
    bool cuda;
    bool skip_oversized;
    struct qc_plan_measure *meas;
    int32_t cap_meas;
    int64_t groups_measured; /* groups folded into cost by this process (the first: a warm-up) */
    float *grads_host;       /* the rollback copy of the gradients */
    float *grads_group;      /* the gradients before a group of several scenes (run_admitted) */
    int64_t rt_skips;        /* scenes skipped after running out of memory (not by admission) */
    int64_t rt_skipped;      /* the dataset index of the last of them */
    int64_t nparams;
    /* several ranks: the group's reduced ranges [owned_from, nparams) kept aside over a
     * rollback (nparams: none) */
    struct train_dist *td;
    float *aside;
    int64_t owned_from;
    bool grads_dirty; /* a backward of this step has accumulated into the gradients */
    struct train_mem_step step;
    struct qc_memctx_stats mc0;
    uint64_t stall_ns0;
    uint64_t recompute0;
    struct train_mem_plan shown; /* memory.json's plan */
    struct train_mem_plan cur;   /* the step's plan with the highest predicted peak */
    uint64_t shown_measured;
    void (*hook)(void *user, const struct qc_plan_program *prog, uint8_t *policy);
    void *hook_user;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void plan_free(struct train_mem_plan *p)
{
    free(p->blocks);
    memset(p, 0, sizeof *p);
}

void train_mem_destroy(struct train_mem *tm)
{
    if (!tm)
        return;
    qc_oom_set_planner(QC_OOM_PLANNER_NONE, false);
    plan_beside_destroy(tm->beside); /* first: it may be reading prog and cost */
    plan_ahead_destroy(tm->ahead);
    plan_ahead_out_free(&tm->ahead_out);
    qc_qcnet_destroy(tm->dry);
    qc_plan_result_free(&tm->admitted);
    qc_plan_program_free(&tm->prog);
    qc_plan_cost_destroy(tm->cost);
    qc_plan_cost_destroy(tm->cost0);
    free(tm->meas);
    free(tm->grads_host);
    free(tm->grads_group);
    free(tm->aside);
    plan_free(&tm->shown);
    plan_free(&tm->cur);
    free(tm);
}

/* Bandwidth of the offload engine's tiers, measured with one 32 MiB tensor through each, twice:
 * the second, warm round counts (the first pays for the tier's first touch of its pages). */
static void probe(struct train_mem *tm)
{
    struct qc_offload *o = qc_train_backend_offload_engine(tm->be);
    struct qc_memctx *mc = qc_train_backend_memctx(tm->be);
    const size_t n = (size_t)32 << 20;
    void *p = qc_memctx_alloc(mc, QC_MEM_MODEL, n, "probe/offload");
    if (!o || !p) {
        qc_memctx_free(mc, QC_MEM_MODEL, p, n);
        return;
    }
    qc_op_zero(qc_train_backend_exec(tm->be), p, n);
    for (int round = 0; round < 2; round++)
        for (int place = QC_MEMCTX_HOST; place <= QC_MEMCTX_NVME; place++) {
            if ((place == QC_MEMCTX_HOST && tm->hw.host_capacity < n) ||
                (place == QC_MEMCTX_NVME && tm->hw.nvme_capacity < n))
                continue;
            uint64_t h = 0;
            const double t0 = now_s();
            if (qc_offload_put(o, p, n, qc_memctx_compute_stream(mc), (enum qc_offload_place)place,
                               "probe/offload", &h) != QC_OK ||
                qc_offload_quiesce(o) != QC_OK) {
                (void)qc_offload_release(o, h);
                continue;
            }
            const double t1 = now_s();
            struct qc_stream *cs = qc_memctx_compute_stream(mc);
            enum qc_status st = qc_offload_get(o, h, p, cs);
            if (st == QC_OK)
                st = qc_stream_synchronize(cs);
            const double t2 = now_s();
            (void)qc_offload_release(o, h);
            if (st != QC_OK || t1 <= t0 || t2 <= t1)
                continue;
            const double w = (double)n / (t1 - t0) / 1e9, r = (double)n / (t2 - t1) / 1e9;
            if (place == QC_MEMCTX_HOST) {
                tm->hw.d2h_gbps = w;
                tm->hw.h2d_gbps = r;
            } else {
                tm->hw.nvme_write_gbps = w;
                tm->hw.nvme_read_gbps = r;
            }
        }
    qc_memctx_free(mc, QC_MEM_MODEL, p, n);
    qc_log(QC_LOG_INFO,
           "plan: measured copies %.3g / %.3g GB/s out / in, NVMe %.3g / %.3g GB/s (hw.* gives "
           "%.3g, %.3g); the planner uses the measured figures",
           tm->hw.d2h_gbps, tm->hw.h2d_gbps, tm->hw.nvme_write_gbps, tm->hw.nvme_read_gbps,
           tm->cfg.hw_pcie_gbps, tm->cfg.hw_nvme_gbps);
}

/* QC_FAULT_OOM_STEP=S[:K] (tests, docs/RELIABILITY.md): in step S the first group's first
 * attempt runs out of device memory at its K-th allocation (default 50), once, as the cache's
 * history or the timing of stream-ordered frees can make it: the group is rolled back and
 * re-run. QC_FAULT_OOM_SCENE=I: every attempt of a group holding the dataset's scene I runs out
 * at its 50th allocation, as a scene whose plan fits but whose allocations never do (the
 * allocator's fragmentation): the group splits, the scene alone is too big (skipped with
 * --skip-oversized, after running beside others). Unset or invalid: off. */
static void fault_from_env(struct train_mem *tm)
{
    const char *e = getenv("QC_FAULT_OOM_STEP");
    char *end = NULL;
    const long long v = e ? strtoll(e, &end, 10) : 0;
    long long k = 50;
    if (e && end != e && *end == ':') {
        char *end2 = NULL;
        k = strtoll(end + 1, &end2, 10);
        end = end2 != end + 1 ? end2 : end;
    }
    if (e && end != e && *end == '\0' && v > 0 && k > 0) {
        tm->fault_step = (int64_t)v;
        tm->fault_k = (int64_t)k;
    }
    tm->fault_scene = -1;
    const char *sc = getenv("QC_FAULT_OOM_SCENE");
    char *send = NULL;
    const long long i = sc ? strtoll(sc, &send, 10) : -1;
    if (sc && send != sc && *send == '\0' && i >= 0)
        tm->fault_scene = (int64_t)i;
}

/* Whether batch b holds the dataset scene idx. */
static bool batch_holds(const struct qc_batch *b, int64_t idx)
{
    for (int64_t s = 0; b->scene_index && s < b->num_scenes; s++)
        if (b->scene_index[s] == idx)
            return true;
    return false;
}

enum qc_status train_mem_create(const struct qc_config *cfg, struct qc_train_backend *be,
                                const struct qc_qcnet *model, const char *run_dir,
                                bool skip_oversized, struct train_mem **out)
{
    struct train_mem *tm = calloc(1, sizeof *tm);
    if (!tm)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    tm->cfg = *cfg;
    tm->be = be;
    tm->cuda = cfg->device_kind == QC_CONFIG_DEVICE_CUDA;
    tm->skip_oversized = skip_oversized;
    qc_plan_program_init(&tm->prog);
    qc_train_plan_params(cfg, &tm->par);
    qc_train_plan_hw(cfg, &tm->hw);
    tm->margin = tm->par.margin;
    tm->choose_edges = qc_train_edge_choose(cfg);
    tm->nparams = qc_qcnet_num_params(model);
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    enum qc_status st = qc_qcnet_create_dry(&mc, &tm->dry);
    if (st == QC_OK)
        st = qc_plan_cost_create(&tm->cost);
    if (st == QC_OK)
        st = qc_plan_cost_create(&tm->cost0);
    tm->hw0 = tm->hw; /* before the probe measures the copies */
    fault_from_env(tm);
    char path[4200];
    snprintf(path, sizeof path, "%s/plan_cost.json", run_dir ? run_dir : ".");
    struct stat sb;
    if (st == QC_OK && run_dir && stat(path, &sb) == 0) /* a resumed run starts calibrated */
        st = qc_plan_cost_load(tm->cost, path);
    /* the offload tier, when a policy may need it */
    const bool offload = cfg->plan_policy == QC_PLAN_OFFLOAD ||
                         (cfg->plan_policy == QC_PLAN_AUTO && cfg->device_budget > 0);
    if (st == QC_OK && offload) {
        st = qc_train_backend_offload(be, cfg);
        if (st == QC_OK && qc_offload_nvme_unusable(qc_train_backend_offload_engine(be))[0])
            tm->hw.nvme_capacity = 0; /* offload.nvme_dir gave no tier (the engine says why) */
        if (st == QC_OK)
            probe(tm);
    }
    if (!offload) { /* no tier: the planner must not offload */
        tm->hw.host_capacity = 0;
        tm->hw.nvme_capacity = 0;
    }
    tm->hw0.host_capacity = tm->hw.host_capacity;
    tm->hw0.nvme_capacity = tm->hw.nvme_capacity;
    /* what an out-of-memory hint may advise (qc_oom.h) */
    qc_oom_set_planner(cfg->plan_policy != QC_PLAN_AUTO ? QC_OOM_PLANNER_FORCED
                       : cfg->device_budget > 0         ? QC_OOM_PLANNER_AUTO
                                                        : QC_OOM_PLANNER_NO_BUDGET,
                       tm->hw.nvme_capacity > 0);
    if (st == QC_OK &&
        !(tm->grads_host = malloc((size_t)(tm->nparams ? tm->nparams : 1) * sizeof(float))))
        st = qc_errorf(QC_ERR_NOMEM, "train: gradient copy of %" PRId64 " floats", tm->nparams);
    /* a second planning thread where the run has two compute threads (idle while it plans) */
    const int64_t threads = cfg->cpu_threads > 0 ? cfg->cpu_threads : omp_get_max_threads();
    if (st == QC_OK && tm->par.budget > 0 && threads >= 2)
        st = plan_beside_create(&tm->beside);
    /* a helper that plans the next group while this one runs (idle in between) */
    if (st == QC_OK && tm->par.budget > 0)
        st = plan_ahead_create(cfg, &tm->ahead);
    if (st != QC_OK) {
        train_mem_destroy(tm);
        return st;
    }
    *out = tm;
    return QC_OK;
}

const struct qc_plan_cost *train_mem_cost(const struct train_mem *tm)
{
    return tm->cost;
}

enum qc_status train_mem_beside(struct train_mem *tm, bool check, int64_t *made, int64_t *differ)
{
    *made = tm->beside_made;
    *differ = tm->beside_differ;
    tm->beside_check = check;
    if (check && !tm->beside && tm->par.budget > 0)
        return plan_beside_create(&tm->beside);
    return QC_OK;
}

void train_mem_set_hook(struct train_mem *tm,
                        void (*fn)(void *user, const struct qc_plan_program *prog, uint8_t *policy),
                        void *user)
{
    tm->hook = fn;
    tm->hook_user = user;
}

enum qc_status train_mem_save(const struct train_mem *tm, const char *run_dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/plan_cost.json", run_dir);
    return qc_plan_cost_save(tm->cost, path);
}

void train_mem_step_begin(struct train_mem *tm, struct qc_qcnet *model)
{
    memset(&tm->step, 0, sizeof tm->step);
    tm->grads_dirty = false;
    tm->step_missed = false;
    qc_memctx_stats_get(qc_train_backend_memctx(tm->be), &tm->mc0);
    struct qc_offload *o = qc_train_backend_offload_engine(tm->be);
    tm->stall_ns0 = 0;
    if (o) {
        struct qc_offload_stats os;
        qc_offload_stats_get(o, &os);
        tm->stall_ns0 = os.stall_ns;
    }
    struct qc_qcnet_mem mm;
    qc_qcnet_mem_get(model, &mm);
    tm->recompute0 = mm.recompute_bytes;
    tm->cur.r.predicted_peak_bytes = 0;
}

/* Keeps the group's plan as the step's when its predicted peak is the step's highest. */
static enum qc_status keep_plan(struct train_mem *tm, const struct qc_plan_result *r)
{
    if (r->peak < tm->cur.r.predicted_peak_bytes && tm->cur.blocks)
        return QC_OK;
    struct train_mem_plan *p = &tm->cur;
    if (p->cap < tm->prog.nblocks) {
        struct qc_memreport_plan_block *b =
            realloc(p->blocks, (size_t)tm->prog.nblocks * sizeof *b);
        if (!b)
            return qc_errorf(QC_ERR_NOMEM, "train: plan of %d blocks", tm->prog.nblocks);
        p->blocks = b;
        p->cap = tm->prog.nblocks;
    }
    p->r.blocks = p->blocks;
    p->r.nblocks = tm->prog.nblocks;
    p->r.predicted_peak_bytes = r->peak;
    for (int32_t b = 0; b < p->r.nblocks; b++) {
        struct qc_memreport_plan_block *k = &p->blocks[b];
        snprintf(k->name, sizeof k->name, "%s", tm->prog.blocks[b].name);
        k->policy = qc_plan_policy_str((enum qc_stash_policy)r->policy[b]);
        k->bytes = tm->prog.blocks[b].stash_bytes;
        k->predicted_time_s = r->block_s[b];
    }
    return QC_OK;
}

/* The configured planning parameters at margin (the calibrated plan's: the margin in force). */
static struct qc_plan_params params_at(const struct train_mem *tm, double margin)
{
    struct qc_plan_params par = tm->par;
    par.margin = margin;
    return par;
}

/* Describes the batch (host) into tm->prog with the edge sets of `tiled` tiled: its program,
 * and the allocator's allocated bytes now as its fixed bytes. */
static enum qc_status describe_raw(struct train_mem *tm, const struct qc_batch *host,
                                   uint32_t tiled)
{
    if (tm->beside) /* it may be reading prog */
        plan_beside_drop(tm->beside);
    qc_plan_result_free(&tm->admitted);
    tm->admitted_batch = NULL;
    tm->tiled = 0;
    QC_TRY(qc_train_edge_modes_set(tm->dry, &tm->cfg, tiled));
    QC_TRY(qc_qcnet_describe(tm->dry, host, tm->cuda, &tm->prog));
    tm->tiled = tiled;
    struct qc_alloc_stats as;
    qc_alloc_stats_get(qc_train_backend_alloc(tm->be), &as);
    tm->prog.fixed_bytes = as.bytes_allocated;
    if (tm->beside && tm->beside_want) {
        const struct qc_plan_params par = params_at(tm, tm->margin);
        plan_beside_start(tm->beside, &tm->prog, tm->cost, &tm->hw, &par, &tm->par);
    }
    return QC_OK;
}

/* The same, timed (the step's planning time). */
static enum qc_status describe(struct train_mem *tm, const struct qc_batch *host, uint32_t tiled)
{
    const double t0 = now_s();
    const enum qc_status st = describe_raw(tm, host, tiled);
    tm->step.plan_s += now_s() - t0;
    return st;
}

/* A group's describer for qc_plan_make_edges. */
struct group_desc {
    struct train_mem *tm;
    const struct qc_batch *host;
};

static enum qc_status group_describe(void *user, uint32_t tiled,
                                     const struct qc_plan_program **prog)
{
    struct group_desc *g = user;
    QC_TRY(describe_raw(g->tm, g->host, tiled));
    *prog = &g->tm->prog;
    return QC_OK;
}

/* The debug line of a plan made (how: "" or " (planned beside admission)"). */
static void log_plan(const struct train_mem *tm, const struct qc_plan_cost *cost, double margin,
                     const struct qc_plan_result *r, const char *how)
{
    qc_log(QC_LOG_DEBUG,
           "plan: step %" PRId64 ", %s cost model, %.1f %% margin: peak %" PRIu64
           ", target %" PRIu64 "%s%s",
           tm->step_no, cost == tm->cost0 ? "built-in" : "calibrated", 100.0 * margin, r->peak,
           r->target, r->fits ? "" : ": does not fit", how);
}

/* Plans tm->prog (described) with cost and hw at margin; the result in r. With room (NULL:
 * none), qc_plan_make_room: *ok whether r has the room the configured margin asks for. */
static enum qc_status plan_with(struct train_mem *tm, const struct qc_plan_cost *cost,
                                const struct qc_plan_hw *hw, double margin, bool *room,
                                struct qc_plan_result *r)
{
    const double t0 = now_s();
    const struct qc_plan_params par = params_at(tm, margin);
    const enum qc_status st = room ? qc_plan_make_room(&tm->prog, cost, hw, &par, &tm->par, r, room)
                                   : qc_plan_make(&tm->prog, cost, hw, &par, r);
    tm->step.plan_s += now_s() - t0;
    if (st == QC_OK)
        log_plan(tm, cost, margin, r, "");
    return st;
}

/* Whether a and b (plans of one program) agree: policies, peak, time, window, room. */
static bool same_plan(const struct qc_plan_result *a, bool room_a, const struct qc_plan_result *b,
                      bool room_b)
{
    return room_a == room_b && a->nblocks == b->nblocks && a->fits == b->fits &&
           a->peak == b->peak && a->target == b->target && a->step_s == b->step_s &&
           a->window == b->window && a->prefetch_none == b->prefetch_none &&
           a->iterations == b->iterations && memcmp(a->policy, b->policy, (size_t)a->nblocks) == 0;
}

/* The calibrated plan at the margin in force with the configured room (plan_with's), when the
 * helper made it of tm->prog as it is now: true with it in r and its room in *room. The wait
 * counts as planning time. */
static bool plan_beside(struct train_mem *tm, struct qc_plan_result *r, bool *room)
{
    if (!tm->beside)
        return false;
    const struct qc_plan_params par = params_at(tm, tm->margin);
    double waited = 0;
    const bool made = plan_beside_take(tm->beside, &tm->prog, tm->cost, &tm->hw, &par, &tm->par, r,
                                       room, &waited);
    tm->step.plan_s += waited;
    tm->beside_made += made;
    if (made && tm->beside_check) { /* tests: the same plan made here */
        struct qc_plan_result own = {0};
        bool own_room = false;
        if (qc_plan_make_room(&tm->prog, tm->cost, &tm->hw, &par, &tm->par, &own, &own_room) !=
                QC_OK ||
            !same_plan(r, *room, &own, own_room))
            tm->beside_differ++;
        qc_plan_result_free(&own);
    }
    if (made)
        log_plan(tm, tm->cost, tm->margin, r, " (planned beside admission)");
    return made;
}

static enum qc_status admit(struct train_mem *tm, const struct qc_batch *host, bool beside,
                            struct qc_plan_result *r);

/* Batch b's description and admission plan (r) made ahead while the group before ran
 * (plan_ahead.h), when they were made of exactly what admit would plan with now (b, the
 * allocator's allocated bytes as the fixed bytes, the admission's figures): the description
 * becomes tm's (tm->prog, tm->dry, tm->tiled) and its calibrated plan is kept for b's first run
 * (ahead_cal). The wait counts as planning time, the helper's own time as planning ahead. */
static bool ahead_take(struct train_mem *tm, const struct qc_batch *b, struct qc_plan_result *r)
{
    if (!tm->ahead)
        return false;
    if (tm->beside) /* it may be reading tm->prog, which a take swaps */
        plan_beside_drop(tm->beside);
    qc_plan_result_free(&tm->admitted);
    tm->admitted_batch = NULL;
    plan_ahead_out_free(&tm->ahead_out);
    tm->ahead_batch = NULL;
    const double t0 = now_s();
    struct qc_alloc_stats as;
    qc_alloc_stats_get(qc_train_backend_alloc(tm->be), &as);
    double waited = 0;
    const bool made = plan_ahead_take(tm->ahead, b, as.bytes_allocated, &tm->hw0, &tm->par,
                                      &tm->dry, &tm->prog, &tm->ahead_out, &waited);
    if (!made) {
        tm->step.plan_s += now_s() - t0;
        return false;
    }
    tm->tiled = tm->ahead_out.tiled;
    tm->ahead_batch = b;
    tm->ahead_made++;
    tm->step.plan_ahead_s += tm->ahead_out.busy_s;
    *r = tm->ahead_out.admit;
    tm->ahead_out.admit = (struct qc_plan_result){0};
    tm->step.plan_s += now_s() - t0;
    log_plan(tm, tm->cost0, tm->par.margin, r, " (admission planned ahead)");
    if (tm->beside_check) { /* tests: the same admission on this thread, the same calibrated plan */
        struct qc_plan_result own = {0};
        const uint32_t tiled = tm->tiled;
        bool same = admit(tm, b, false, &own) == QC_OK && same_plan(r, false, &own, false) &&
                    tm->tiled == tiled;
        qc_plan_result_free(&own);
        const struct plan_ahead_out *o = &tm->ahead_out;
        if (same && o->have_cal) {
            bool room = false;
            same = qc_plan_make_room(&tm->prog, o->cost, &o->cal_hw, &o->cal_par, &tm->par, &own,
                                     &room) == QC_OK &&
                   same_plan(&o->cal, o->room, &own, room);
            qc_plan_result_free(&own);
        }
        tm->ahead_differ += !same;
    }
    return true;
}

/* The calibrated plan made ahead of batch host (ahead_take), when it was made with the hardware
 * figures and parameters in force but for the margin, and its peak is under the target of the
 * margin in force (a step may have moved the margin since the helper started: a miss raises it
 * by the bytes missed, a step without one lets it decay): true with it in r and its room in
 * *room. Its cost model is the one of the moment the helper started, one group's measurements
 * behind plan_with's (plan_ahead.h). Given once. */
static bool ahead_cal(struct train_mem *tm, const struct qc_batch *host, struct qc_plan_result *r,
                      bool *room)
{
    struct plan_ahead_out *o = &tm->ahead_out;
    const struct qc_plan_params par = params_at(tm, tm->margin);
    struct qc_plan_params made = o->cal_par;
    made.margin = par.margin;
    const uint64_t target = (uint64_t)((double)par.budget * (1.0 - par.margin));
    const bool ok =
        tm->ahead_batch == host && o->have_cal && plan_beside_same_params(&made, &par) &&
        plan_beside_same_hw(&o->cal_hw, &tm->hw) && o->cal.fits && o->cal.peak <= target;
    if (ok) {
        *r = o->cal;
        *room = o->room;
        o->cal = (struct qc_plan_result){0};
        tm->ahead_cal_made++;
        log_plan(tm, tm->cost, o->cal_par.margin, r, " (planned ahead)");
    }
    plan_ahead_out_free(o);
    tm->ahead_batch = NULL;
    return ok;
}

/* Starts the next group's planning (tm->next, when the loop fetched it) on the helper: its
 * description with this group's fixed bytes (the next group starts with the same ones where the
 * batch's storage is not the allocator's, the CPU; on a device the staged batch's bytes differ
 * and the take gives way to planning on the path), its admission plan and its calibrated plan at
 * the margin in force with the cost model as it is now. Best effort: a failure to start plans
 * that group on its path. */
static void ahead_start(struct train_mem *tm)
{
    const struct qc_batch *next = tm->next;
    tm->next = NULL; /* one job per group */
    if (!tm->ahead || !next)
        return;
    const struct plan_ahead_job job = {
        .batch = next,
        .fixed_bytes = tm->prog.fixed_bytes,
        .choose_edges = tm->choose_edges,
        .cost0 = tm->cost0,
        .hw0 = tm->hw0,
        .par = tm->par,
        .cost = tm->cost,
        .hw = tm->hw,
        .cal = params_at(tm, tm->margin),
    };
    if (plan_ahead_start(tm->ahead, &job) != QC_OK)
        qc_log(QC_LOG_DEBUG, "plan: the next group is planned on its path: %s", qc_error_last());
}

/* The admission plan of batch host (r): the built-in coefficients, the configured hardware
 * figures, the configured margin, with the edge modes chosen (qc_plan_make_edges: the default
 * modes when they fit, else edge sets tiled until one fits). Whether it fits decides whether
 * the batch runs whole, and its modes are the ones the batch runs in (tiling changes the bits
 * of the edge FEs' gradients): both a function of the batch and the configuration only
 * (struct train_mem). tm->prog is its program, tm->tiled its tiled sets. beside: the helper
 * searches the calibrated plan of each program meanwhile (for a first run; plan_beside). */
static enum qc_status admit(struct train_mem *tm, const struct qc_batch *host, bool beside,
                            struct qc_plan_result *r)
{
    const double t0 = now_s();
    struct group_desc g = {tm, host};
    const struct qc_plan_describer d = {group_describe, &g};
    const struct qc_plan_program *prog = NULL;
    uint32_t tiled = 0;
    tm->beside_want = beside; /* the calibrated plan of each program, beside */
    const enum qc_status st =
        qc_plan_make_edges(&d, tm->choose_edges, tm->cost0, &tm->hw0, &tm->par, &tiled, &prog, r);
    tm->beside_want = false;
    tm->step.plan_s += now_s() - t0;
    return st;
}

/* Sets the model's edge modes to tm->tiled's (the program about to run); says so when they
 * change. */
static enum qc_status edge_modes_run(struct train_mem *tm, struct qc_qcnet *model)
{
    QC_TRY(qc_train_edge_modes_set(model, &tm->cfg, tm->tiled));
    if (tm->tiled != tm->tiled_said) {
        char sets[256] = "";
        size_t k = 0;
        for (int s = 0; s < QC_EDGE_SET_COUNT && k < sizeof sets; s++)
            if ((tm->tiled >> s) & 1u)
                k += (size_t)snprintf(sets + k, sizeof sets - k, "%s%s", k ? ", " : "",
                                      qc_edge_set_name((enum qc_edge_set)s));
        if (tm->tiled)
            qc_log(QC_LOG_INFO,
                   "plan: step %" PRId64 ": edge sets %s tiled (model.edge_mode=auto: the "
                   "materialised plan does not fit the budget, or only by fetching nothing "
                   "ahead)",
                   tm->step_no, sets);
        else
            qc_log(QC_LOG_INFO, "plan: step %" PRId64 ": every edge set materialised again",
                   tm->step_no);
        tm->tiled_said = tm->tiled;
    }
    return QC_OK;
}

/* Measures the group's blocks into the cost model (before release). */
static void calibrate(struct train_mem *tm, struct qc_qcnet *model, double group_s)
{
    if (tm->beside) /* it may be reading cost */
        plan_beside_drop(tm->beside);
    if (tm->cap_meas < tm->prog.nblocks) {
        struct qc_plan_measure *n = realloc(tm->meas, (size_t)tm->prog.nblocks * sizeof *tm->meas);
        if (!n)
            return; /* calibration is best effort */
        tm->meas = n;
        tm->cap_meas = tm->prog.nblocks;
    }
    if (qc_qcnet_measure(model, tm->meas, tm->prog.nblocks) != QC_OK)
        return;
    /* the process's first group warms up (faults in the allocator's fresh memory, starts the
     * thread pools): it prices the next plans and then gives way (qc_plan_cost_update_warmup) */
    if (tm->groups_measured++ > 0 ||
        qc_plan_cost_update_warmup(tm->cost, &tm->prog, tm->meas, group_s, !tm->cuda) != QC_OK)
        qc_plan_cost_update(tm->cost, &tm->prog, tm->meas, group_s, !tm->cuda);
}

/* The model's three phases of a group, each a phase span of the profiler (qc_prof.h) when it
 * records: the ops inside carry the pass. */
static enum qc_status train_phase_forward(struct qc_qcnet *m, const struct qc_batch *b,
                                          const struct qc_qcnet_ctx *ctx, struct qc_qcnet_output *o)
{
    if (!qc_prof_on())
        return qc_qcnet_forward(m, b, ctx, o);
    struct qc_prof_mark pm;
    qc_prof_span_begin(&pm, QC_PROF_CAT_PHASE, "forward", QC_PROF_PASS_FORWARD);
    const enum qc_status st = qc_qcnet_forward(m, b, ctx, o);
    qc_prof_span_end(&pm, QC_PROF_CAT_PHASE, NULL, 0);
    return st;
}

static enum qc_status train_phase_loss(struct qc_qcnet *m, struct qc_qcnet_loss *l)
{
    if (!qc_prof_on())
        return qc_qcnet_loss(m, l);
    struct qc_prof_mark pm;
    qc_prof_span_begin(&pm, QC_PROF_CAT_PHASE, "loss", QC_PROF_PASS_FORWARD);
    const enum qc_status st = qc_qcnet_loss(m, l);
    qc_prof_span_end(&pm, QC_PROF_CAT_PHASE, NULL, 0);
    return st;
}

static enum qc_status train_phase_backward(struct qc_qcnet *m, float scale)
{
    if (!qc_prof_on())
        return qc_qcnet_backward(m, scale);
    struct qc_prof_mark pm;
    qc_prof_span_begin(&pm, QC_PROF_CAT_PHASE, "backward", QC_PROF_PASS_BACKWARD);
    const enum qc_status st = qc_qcnet_backward(m, scale);
    qc_prof_span_end(&pm, QC_PROF_CAT_PHASE, NULL, 0);
    return st;
}

/* One forward / loss / backward of batch (host, dev) under the plan set on the model; the
 * losses are added into out. last: the group's last backward (its reports are final). */
static enum qc_status attempt(struct train_mem *tm, struct qc_qcnet *model,
                              const struct qc_batch *host, const struct qc_batch *dev,
                              const struct qc_qcnet_ctx *ctx0, const float *norm, float weight,
                              bool last, struct train_group_out *out)
{
    struct qc_qcnet_ctx ctx = *ctx0;
    ctx.batch_dev = dev;
    ctx.loss_norm = norm;
    struct qc_qcnet_output o;
    struct qc_qcnet_loss l;
    const double t0 = now_s();
    enum qc_status st = train_phase_forward(model, host, &ctx, &o);
    if (st == QC_OK)
        st = train_phase_loss(model, &l);
    train_dist_hold(tm->td, !last);
    if (st == QC_OK)
        st = train_phase_backward(model, weight);
    train_dist_hold(tm->td, false);
    if (st == QC_OK) {
        calibrate(tm, model, now_s() - t0);
        out->loss += (double)l.loss;
        out->reg_loss_propose += (double)l.reg_loss_propose;
        out->reg_loss_refine += (double)l.reg_loss_refine;
        out->cls_loss += (double)l.cls_loss;
        out->scenes += host->num_scenes;
        tm->grads_dirty = true;
    }
    qc_qcnet_release(model);
    return st;
}

/* The sizes of batch b (one scene) for the error of a scene that never fits. */
static void scene_sizes(const struct qc_batch *b, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(
        buf, n, "%" PRId64 " agents, %" PRId64 " polygons, %" PRId64 " map points; edges",
        b->num_agents, b->num_polygons, b->num_points);
    for (int s = 0; s < QC_EDGE_SET_COUNT && k < n; s++)
        k += (size_t)snprintf(buf + k, n - k, "%s %s %" PRId64, s ? "," : "",
                              qc_edge_set_name((enum qc_edge_set)s), b->graph.e[s].num_edges);
}

static enum qc_status run_batch(struct train_mem *tm, struct qc_qcnet *model,
                                struct qc_loader *loader, const struct qc_batch *host,
                                const struct qc_batch *dev, const struct qc_qcnet_ctx *ctx,
                                const float *norm, float weight, bool last,
                                struct train_group_out *out);

/* A part of a split group as admission left it (admit_parts), for its run (run_part): its batch
 * built once and its admission plan made once (its edge modes chosen once). have: set. */
struct part_kept {
    bool have;
    struct qc_batch *b;
    struct qc_plan_result r;
    uint32_t tiled;       /* its edge modes */
    uint64_t fixed_bytes; /* the fixed bytes r was made with */
    uint64_t prog_hash;   /* of the program r was made of (prog_hash) */
};

/* FNV-1a of a program's events (they compare bytewise: qc_plan.h) and sizes: what a kept
 * admission plan is checked against before a second description replaces the first. */
static uint64_t prog_hash(const struct qc_plan_program *p)
{
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)p->nblocks ^ ((uint64_t)p->nev << 32);
    const unsigned char *c = (const unsigned char *)p->ev;
    for (size_t i = 0; i < (size_t)p->nev * sizeof *p->ev; i++)
        h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static void part_kept_free(struct qc_loader *loader, struct part_kept *k)
{
    qc_loader_release(loader, k->b);
    qc_plan_result_free(&k->r);
    memset(k, 0, sizeof *k);
}

/* Part batch b's admission from k for its first run (run_batch takes tm->admitted): b described
 * in k's edge modes, and k's plan when that program is the one it was made of (its events, its
 * fixed bytes; else run_batch admits it again). The same plan as admitting it again: a function
 * of the program and the admission's figures (tests: made again and compared, with the beside
 * check). */
static enum qc_status part_admitted(struct train_mem *tm, const struct qc_batch *b,
                                    struct part_kept *k)
{
    QC_TRY(describe(tm, b, k->tiled));
    if (tm->prog.fixed_bytes != k->fixed_bytes || prog_hash(&tm->prog) != k->prog_hash)
        return QC_OK;
    if (tm->beside_check) {
        struct qc_plan_result own = {0};
        const enum qc_status st = admit(tm, b, false, &own);
        tm->parts_differ +=
            st != QC_OK || !same_plan(&k->r, false, &own, false) || tm->tiled != k->tiled;
        qc_plan_result_free(&own);
        QC_TRY(st);
        if (tm->tiled != k->tiled)
            return QC_OK;
    }
    tm->admitted = k->r;
    k->r = (struct qc_plan_result){0};
    tm->admitted_batch = b;
    tm->parts_kept++;
    return QC_OK;
}

/* Runs the scenes idx[0 .. n) as a sub-group: built by the loader (or as admission kept it: k,
 * NULL for none), staged, run. */
static enum qc_status run_part(struct train_mem *tm, struct qc_qcnet *model,
                               struct qc_loader *loader, const int64_t *idx, int64_t n,
                               struct part_kept *k, const struct qc_qcnet_ctx *ctx,
                               const float *norm, float weight, bool last,
                               struct train_group_out *out)
{
    struct qc_batch *b = k && k->have ? k->b : NULL;
    if (b)
        k->b = NULL;
    else
        QC_TRY(qc_loader_build(loader, idx, n, &b));
    struct train_stage s = {0};
    enum qc_status st = train_stage_put(tm->be, &s, b);
    if (st != QC_OK) {
        qc_loader_release(loader, b);
        return st;
    }
    const struct qc_batch *dev = NULL;
    st = train_stage_use(tm->be, &s, &dev);
    if (st == QC_OK && k && k->have)
        st = part_admitted(tm, b, k);
    if (st == QC_OK)
        st = run_batch(tm, model, loader, b, dev, ctx, norm, weight, last, out);
    qc_loader_release(loader, train_stage_drop(tm->be, &s));
    train_stage_deinit(&s);
    return st;
}

/* Several ranks, after a failed attempt: the ranges its backward reported are the
 * reduction's; their reduced values go aside (once each), put back by train_mem_group. */
static enum qc_status keep_reduced(struct train_mem *tm, struct qc_qcnet *model)
{
    int64_t from = INT64_MAX;
    QC_TRY(train_dist_settle(tm->td, &from));
    if (from >= tm->owned_from)
        return QC_OK;
    if (!tm->aside && !(tm->aside = malloc((size_t)tm->nparams * sizeof(float))))
        return qc_errorf(QC_ERR_NOMEM, "train: gradient copy of %" PRId64 " floats", tm->nparams);
    QC_TRY(qc_op_download(qc_train_backend_exec(tm->be), tm->aside + from,
                          qc_qcnet_grads(model) + from,
                          (size_t)(tm->owned_from - from) * sizeof(float)));
    tm->owned_from = from;
    return QC_OK;
}

/* A scene (batch host, one scene) that does not fit the budget alone: the error naming it, its
 * sizes and the budget it needs at the configured margin, or with skip_oversized a warning and
 * QC_OK (*skipped set). need: its smallest plan's peak; ran_out: it ran out of memory `tries`
 * times under plans that fit instead. */
static enum qc_status scene_too_big(struct train_mem *tm, const struct qc_batch *host,
                                    uint64_t need, bool ran_out, int tries, bool *skipped)
{
    *skipped = false;
    /* the budget whose target at the configured margin (budget × (1 − margin)) holds the plan's
     * peak: a margin raised by this run's failures is not the user's to give; a scene that ran
     * out under plans that fit needs at least the budget plus the fragmentation it met */
    uint64_t budget_needed = (uint64_t)((double)need / (1.0 - tm->par.margin)) + 1;
    if (ran_out && budget_needed < tm->par.budget + tm->frag_seen)
        budget_needed = tm->par.budget + tm->frag_seen;
    char sizes[512], why[200], b1[32], b2[32], b3[32];
    scene_sizes(host, sizes, sizeof sizes);
    qc_format_bytes(need, b1, sizeof b1);
    qc_format_bytes(budget_needed, b2, sizeof b2);
    qc_format_bytes(tm->par.budget, b3, sizeof b3);
    if (ran_out)
        snprintf(why, sizeof why,
                 "it ran out of device memory %d times under plans peaking at %s "
                 "(fragmentation)",
                 tries, b1);
    else
        snprintf(why, sizeof why, "its smallest plan peaks at %s", b1);
    if (tm->skip_oversized) {
        qc_log(QC_LOG_WARN,
               "train: scene %s (dataset index %" PRId64
               ") does not fit the device budget alone (%s; %s, budget %s): skipped",
               host->scenario_id[0], host->scene_index[0], sizes, why, b3);
        tm->step.skipped++;
        *skipped = true;
        return QC_OK;
    }
    struct qc_oom_facts f = {.one_scene = true,
                             .attention = tm->cfg.attention == QC_ATTENTION_FUSED
                                              ? QC_OOM_ATTENTION_FUSED
                                              : QC_OOM_ATTENTION_UNFUSED};
    qc_oom_planner_facts(&f);
    char hint[512];
    return qc_errorf(QC_ERR_NOMEM,
                     "train: scene %s (dataset index %" PRId64
                     ") does not fit the device budget even alone: %s; %s: it needs a "
                     "budget of about %s (%" PRIu64 " bytes), the budget is %s\n%s",
                     host->scenario_id[0], host->scene_index[0], sizes, why, b2, budget_needed, b3,
                     qc_oom_hint(&f, hint, sizeof hint));
}

/* Runs the scenes of host in two halves (run_part), each with the denominators norm (NULL:
 * host's own). */
static enum qc_status run_halves(struct train_mem *tm, struct qc_qcnet *model,
                                 struct qc_loader *loader, const struct qc_batch *host,
                                 const struct qc_qcnet_ctx *ctx, const float *norm, float weight,
                                 bool last, struct train_group_out *out)
{
    float group_norm[QC_QCNET_LOSS_NORM];
    if (!norm) { /* the whole group's denominators for every part */
        qc_qcnet_loss_norm(host, group_norm);
        norm = group_norm;
    }
    tm->step.splits++;
    const int64_t n = host->num_scenes, h = n / 2;
    qc_log(QC_LOG_INFO,
           "train: a batch of %" PRId64 " scenes does not fit the budget; running "
           "it as %" PRId64 " + %" PRId64 " scenes",
           n, h, n - h);
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    memcpy(idx, host->scene_index, (size_t)n * sizeof *idx);
    enum qc_status st = run_part(tm, model, loader, idx, h, NULL, ctx, norm, weight, false, out);
    if (st == QC_OK)
        st = run_part(tm, model, loader, idx + h, n - h, NULL, ctx, norm, weight, last, out);
    free(idx);
    return st;
}

/* The allocator holds frag bytes reserved beyond what is allocated (partly used segments and
 * granules) at a step's peak or at a failure: plans under the budget less the margin keep to
 * allocated bytes, so a margin below that fragmentation lets a plan that fits run out (the
 * soak of issue 26: 3 to 5 % of a tight budget at every heavy step, against the planner's 2 %).
 * The margin's floor becomes the largest such figure seen, plus a commit granule, and the margin
 * in force rises to it at once. It steers policies only (the same bits): whether a batch runs
 * whole is decided at the configured margin. */
static void learn_frag(struct train_mem *tm, uint64_t frag)
{
    if (tm->par.budget == 0)
        return;
    double f = (double)(frag + FRAG_SLACK) / (double)tm->par.budget;
    f = f < MARGIN_MAX ? f : MARGIN_MAX;
    if (f > tm->frag_floor)
        tm->frag_floor = f;
    if (tm->margin < tm->frag_floor)
        tm->margin = tm->frag_floor;
}

/* Rolls back a group whose attempt ran out of device memory (msg: the allocator's error):
 * nothing of it stays (the gradients restored from the host copy when dirty, else zeroed), the
 * allocator's cache is emptied (the re-run starts from a cold cache, as a resumed process
 * would), and the margin in force is raised by what the failure suggests. */
static enum qc_status rollback(struct train_mem *tm, struct qc_qcnet *model, bool dirty,
                               uint64_t planned_peak, const char *msg)
{
    struct qc_alloc_stats as;
    qc_alloc_stats_get(qc_train_backend_alloc(tm->be), &as);
    QC_TRY(keep_reduced(tm, model));
    if (dirty)
        QC_TRY(qc_qcnet_grads_upload(model, tm->grads_host));
    else
        qc_qcnet_zero_grad(model);
    /* what this attempt's pattern left reserved (partly used segments, free blocks between
     * granules) goes back */
    QC_TRY(qc_alloc_empty_cache(qc_train_backend_alloc(tm->be)));
    /* the new margin covers what the prediction missed (an active peak over it) or what
     * fragmentation held when the allocator ran out (reserved − allocated, after its cache
     * release), whichever is larger, by 3 to 10 points more per failure: the fragmentation at a
     * failure belongs to that attempt's allocation pattern, which a new plan changes, so it is
     * approached in steps rather than taken whole. It only steers the policies of later plans
     * (which give the same bits): whether a batch runs whole is decided at the configured
     * margin */
    const double budget = (double)tm->par.budget;
    const double seen = as.bytes_active_peak > planned_peak
                            ? (double)(as.bytes_active_peak - planned_peak) / budget
                            : 0.0;
    struct qc_memctx_stats ms;
    qc_memctx_stats_get(qc_train_backend_memctx(tm->be), &ms);
    const uint64_t fail_frag =
        ms.fail_reserved > ms.fail_allocated ? ms.fail_reserved - ms.fail_allocated : 0;
    if (fail_frag > tm->frag_seen)
        tm->frag_seen = fail_frag;
    const double frag = (double)fail_frag / budget;
    double up = seen > frag ? seen : frag;
    up = up < MARGIN_STEP ? MARGIN_STEP : up > MARGIN_JUMP ? MARGIN_JUMP : up;
    const double m = tm->margin + up;
    tm->margin = m < MARGIN_MAX ? m : MARGIN_MAX;
    /* (the floor after the raise: a raise from the floor would count the failure twice) */
    if (fail_frag > 0)
        learn_frag(tm, fail_frag);
    tm->step.replans++;
    tm->step.rolled_back = true;
    tm->step_missed = true;
    qc_log(QC_LOG_WARN,
           "train: out of device memory under the plan (predicted peak %" PRIu64
           " bytes; at the failure %zu bytes allocated, %zu reserved of which %zu small): "
           "rolled back with the cache emptied, re-planned with a %.1f %% margin (%s)",
           planned_peak, ms.fail_allocated, ms.fail_reserved, ms.fail_reserved_small,
           100.0 * tm->margin, msg);
    return QC_OK;
}

/* The spill file grows to the plan's NVMe bytes plus 1/8 (qc_offload_nvme_reserve rounds up to
 * its 64 MiB growth step) before the attempt's puts need them. A disk that refuses is no error
 * here: the tier's limit drops to the file's size (nvme_limit), a put past it runs out of memory
 * and the re-plan after the rollback keeps to the lower limit. */
static void nvme_reserve(struct train_mem *tm, uint64_t plan_nvme_bytes)
{
    struct qc_offload *o = qc_train_backend_offload_engine(tm->be);
    if (!o || plan_nvme_bytes == 0)
        return;
    if (qc_offload_nvme_reserve(o, plan_nvme_bytes + plan_nvme_bytes / 8) != QC_OK)
        qc_log(QC_LOG_WARN, "train: %s", qc_error_last());
}

/* The planners' NVMe tier no larger than the spill file can still become (a full disk lowers
 * it). */
static void nvme_limit(struct train_mem *tm)
{
    struct qc_offload *o = qc_train_backend_offload_engine(tm->be);
    const uint64_t lim = o ? qc_offload_nvme_limit(o) : 0;
    if (o && tm->hw.nvme_capacity > lim)
        tm->hw.nvme_capacity = lim;
    if (o && tm->hw0.nvme_capacity > lim)
        tm->hw0.nvme_capacity = lim;
}

/* Runs batch (host, dev) whole when its admission plan (admit) fits, else in halves; a
 * scene that does not fit alone is too big (scene_too_big). Which of these happens must be a
 * function of the batch and the configuration (a split changes the bits: the parts' gradients
 * add up in another order), never of timing or of the allocator's cache:
 *   - a batch runs first under the calibrated plan at the margin in force (else at the
 *     configured margin, else the admission plan from an empty cache: every policy gives the
 *     same bits);
 *   - when a run runs out of memory the batch is rolled back, the cache emptied, and the batch
 *     re-run whole under built-in plans of ever larger margins (never one over the configured
 *     target), MAX_ATTEMPTS runs in all (MAX_ATTEMPTS_1 for one scene); only then is a batch
 *     split, or a scene too big. */
static enum qc_status run_batch(struct train_mem *tm, struct qc_qcnet *model,
                                struct qc_loader *loader, const struct qc_batch *host,
                                const struct qc_batch *dev, const struct qc_qcnet_ctx *ctx,
                                const float *norm, float weight, bool last,
                                struct train_group_out *out)
{
    struct qc_plan_result r = {0};
    enum qc_status st = QC_OK;
    uint64_t need = 0;    /* the smallest plan's peak, or the last plan's that ran out */
    bool ran_out = false; /* the attempts ran out under plans that fit */
    const int attempts = host->num_scenes == 1 ? MAX_ATTEMPTS_1 : MAX_ATTEMPTS;
    tm->frag_seen = 0;
    int a = 0;
    for (; a < attempts; a++) {
        nvme_limit(tm);
        bool admit_plan = false; /* this attempt runs the admission plan */
        if (tm->par.budget > 0) {
            /* admission: from the batch and the configuration alone (the edge modes too) */
            struct qc_plan_result r0 = {0};
            if (a == 0 && tm->admitted_batch == host) { /* admitted whole just now */
                r0 = tm->admitted;
                tm->admitted = (struct qc_plan_result){0};
                tm->admitted_batch = NULL;
            } else {
                QC_TRY(admit(tm, host, a == 0, &r0)); /* a re-run plans with built-in costs */
            }
            if (!r0.fits) {
                need = r0.peak;
                ran_out = false;
                qc_plan_result_free(&r0);
                break;
            }
            bool cold = false; /* empty the cache first */
            if (a == 0) {
                /* the calibrated plan at the margin in force, else at the configured margin,
                 * else the admission plan (all give the same bits) */
                /* a plan that fetches nothing ahead runs with the room admission asks for
                 * (qc_plan_room at the configured margin: a learned margin over that room
                 * leaves it already), else the admission plan when that one has it */
                bool room = false;
                if (!ahead_cal(tm, host, &r, &room) && !plan_beside(tm, &r, &room))
                    st = plan_with(tm, tm->cost, &tm->hw, tm->margin, &room, &r);
                if (st == QC_OK && !r.fits && tm->margin > tm->par.margin) {
                    qc_plan_result_free(&r);
                    st = plan_with(tm, tm->cost, &tm->hw, tm->par.margin, &room, &r);
                }
                admit_plan = st == QC_OK && (!r.fits || (!room && qc_plan_has_room(&tm->par, &r0)));
            } else {
                /* after a rollback (the cache emptied): the built-in plan at a margin raised
                 * by MARGIN_JUMP per run, or, when none fits there, the smallest peak its
                 * search found if that is under the configured target, else the admission
                 * plan: more room for fragmentation each time, and a function of the batch */
                double m = tm->par.margin + MARGIN_JUMP * (double)a;
                m = m < MARGIN_MAX ? m : MARGIN_MAX;
                st = plan_with(tm, tm->cost0, &tm->hw0, m, NULL, &r);
                admit_plan = st == QC_OK && !r.fits && r.peak > r0.target;
            }
            if (admit_plan) {
                qc_plan_result_free(&r);
                r = r0;
                r0 = (struct qc_plan_result){0};
                cold = a == 0; /* (a re-run starts from the emptied cache) */
            }
            qc_plan_result_free(&r0);
            if (st == QC_OK && cold)
                st = qc_alloc_empty_cache(qc_train_backend_alloc(tm->be));
        } else {
            st = describe(tm, host, 0);
            if (st == QC_OK)
                st = plan_with(tm, tm->cost, &tm->hw, tm->margin, NULL, &r);
        }
        if (st != QC_OK)
            return st;
        nvme_reserve(tm, r.nvme_bytes);
        need = r.peak;
        ran_out = true;
        if (tm->hook)
            tm->hook(tm->hook_user, &tm->prog, r.policy);
        st = keep_plan(tm, &r);
        if (st == QC_OK)
            st = edge_modes_run(tm, model);
        if (st == QC_OK)
            st = qc_qcnet_set_plan(model, &tm->prog, r.policy, r.window, r.prefetch_none);
        if (st == QC_OK && tm->cfg.alloc_by_lifetime && tm->par.budget > 0)
            st = qc_memctx_set_lives(qc_train_backend_memctx(tm->be), &tm->prog);
        /* the rollback copy, when earlier groups of the step accumulated gradients */
        const bool dirty = tm->grads_dirty;
        if (st == QC_OK && dirty && tm->par.budget > 0)
            st = qc_qcnet_grads_download(model, tm->grads_host);
        if (st == QC_OK && tm->fault_step > 0 && tm->fault_step == tm->step_no) {
            tm->fault_step = 0; /* the test hook (fault_from_env): once */
            qc_memctx_fail_at(qc_train_backend_memctx(tm->be), tm->fault_k, 1);
        }
        if (st == QC_OK && tm->fault_scene >= 0 && batch_holds(host, tm->fault_scene))
            qc_memctx_fail_at(qc_train_backend_memctx(tm->be), 50, 1);
        if (st == QC_OK)
            st = attempt(tm, model, host, dev, ctx, norm, weight, last, out);
        qc_memctx_fail_at(qc_train_backend_memctx(tm->be), 0, 0); /* disarm an unused fault */
        /* the plans that ran to the end (a rolled-back attempt's allocations are in the step's
         * measured peak too, up to where it failed: such a step's two peaks do not compare) */
        if (st == QC_OK && r.peak > tm->step.predicted_peak)
            tm->step.predicted_peak = r.peak;
        if (st != QC_ERR_NOMEM || tm->par.budget == 0) {
            qc_plan_result_free(&r);
            return st;
        }
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qc_error_last());
        char *hint = strstr(msg, "\nhint:"); /* recovered here: no advice for the user */
        if (hint)
            *hint = '\0';
        st = rollback(tm, model, dirty, r.peak, msg);
        qc_plan_result_free(&r);
        if (st != QC_OK)
            return st;
    }
    qc_plan_result_free(&r);
    if (host->num_scenes == 1) {
        bool skipped = false;
        st = scene_too_big(tm, host, need, ran_out, a, &skipped);
        if (st == QC_OK && skipped) {
            tm->rt_skips++;
            tm->rt_skipped = host->scene_index[0];
        }
        return st;
    }
    return run_halves(tm, model, loader, host, ctx, norm, weight, last, out);
}

// ---- admission of a group: which scenes run together, which are skipped ---------------------

/* A run of consecutive scenes of the group: [off, off + n) of its scene indices. */
struct part {
    int64_t off, n;
    bool skip;             /* one scene that does not fit alone (skip_oversized) */
    struct part_kept kept; /* a part admission built: its batch and plan for its run */
};

/* Admits the scenes idx[off .. off + n) of the group (batch b when already built, else built
 * here): whole when their admission plan fits, else in halves (recursively); a scene that does
 * not fit alone is skipped (skip_oversized) or the error. The parts appended to parts[*np]
 * (room for 2 × the group's scenes). */
static enum qc_status admit_parts(struct train_mem *tm, struct qc_loader *loader,
                                  const struct qc_batch *b, const int64_t *idx, int64_t off,
                                  int64_t n, struct part *parts, int64_t *np)
{
    struct qc_batch *own = NULL;
    if (!b) {
        QC_TRY(qc_loader_build(loader, idx + off, n, &own));
        b = own;
    }
    struct qc_plan_result r = {0};
    enum qc_status st = !own && ahead_take(tm, b, &r) ? QC_OK : admit(tm, b, true, &r);
    if (!own) /* the group's own batch, admitted: the next group's planning meanwhile */
        ahead_start(tm);
    const bool fits = st == QC_OK && r.fits;
    const uint64_t peak = r.peak;
    struct part_kept k = {0};
    if (fits && !own) { /* the caller's batch: its first run needs this admission again */
        tm->admitted = r;
        tm->admitted_batch = b;
    } else if (fits) { /* a part built here: its batch and plan kept for its run */
        k = (struct part_kept){.have = true,
                               .b = own,
                               .r = r,
                               .tiled = tm->tiled,
                               .fixed_bytes = tm->prog.fixed_bytes,
                               .prog_hash = prog_hash(&tm->prog)};
        own = NULL;
    } else {
        qc_plan_result_free(&r);
    }
    if (st == QC_OK && fits) {
        parts[(*np)++] = (struct part){.off = off, .n = n, .kept = k};
    } else if (st == QC_OK && n == 1) {
        bool skipped = false;
        st = scene_too_big(tm, b, peak, false, 0, &skipped);
        if (st == QC_OK)
            parts[(*np)++] = (struct part){.off = off, .n = 1, .skip = true};
    } else if (st == QC_OK) {
        const int64_t h = n / 2;
        tm->step.splits++;
        qc_log(QC_LOG_INFO,
               "train: a batch of %" PRId64 " scenes does not fit the budget; running "
               "it as %" PRId64 " + %" PRId64 " scenes",
               n, h, n - h);
        st = admit_parts(tm, loader, NULL, idx, off, h, parts, np);
        if (st == QC_OK)
            st = admit_parts(tm, loader, NULL, idx, off + h, n - h, parts, np);
    }
    if (own)
        qc_loader_release(loader, own);
    return st;
}

/* run_scenes' runs of the np parts admission made (st: admission's status). */
static enum qc_status run_parts(struct train_mem *tm, struct qc_qcnet *model,
                                struct qc_loader *loader, const struct qc_batch *host,
                                const struct qc_batch *dev, const int64_t *run, int64_t nrun,
                                struct part *parts, int64_t np, int64_t *idx,
                                const struct qc_qcnet_ctx *ctx, float weight, bool last,
                                struct train_group_out *out, int64_t *kept, enum qc_status st)
{
    const int64_t n = host->num_scenes;
    int64_t k = 0, last_run = -1;
    for (int64_t i = 0; st == QC_OK && i < np; i++)
        if (!parts[i].skip) {
            for (int64_t j = 0; j < parts[i].n; j++) /* the running scenes, in order */
                idx[k + j] = run[parts[i].off + j];
            parts[i].off = k;
            k += parts[i].n;
            last_run = i;
        }
    *kept = k;
    if (st == QC_OK && np == 1 && !parts[0].skip && nrun == n) /* whole: as it came */
        return run_batch(tm, model, loader, host, dev, ctx, NULL, weight, last, out);
    if (st != QC_OK || k == 0)
        return st;
    float norm[QC_QCNET_LOSS_NORM];
    if (k == n) {
        qc_qcnet_loss_norm(host, norm);
    } else { /* the denominators of the scenes that run */
        struct qc_batch *kb = NULL;
        QC_TRY(qc_loader_build(loader, idx, k, &kb));
        qc_qcnet_loss_norm(kb, norm);
        qc_loader_release(loader, kb);
    }
    for (int64_t i = 0; st == QC_OK && i <= last_run; i++)
        if (!parts[i].skip)
            st = run_part(tm, model, loader, idx + parts[i].off, parts[i].n, &parts[i].kept, ctx,
                          norm, weight, last && i == last_run, out);
    return st;
}

/* Runs the scenes run[0 .. nrun) of the group (host, dev; all of them when nrun is its size):
 * admitted into parts, each part run with the denominators of the scenes that run (a scene
 * skipped by admission keeps no share of them). *kept: the scenes that ran. */
static enum qc_status run_scenes(struct train_mem *tm, struct qc_qcnet *model,
                                 struct qc_loader *loader, const struct qc_batch *host,
                                 const struct qc_batch *dev, const int64_t *run, int64_t nrun,
                                 struct part *parts, int64_t *idx, const struct qc_qcnet_ctx *ctx,
                                 float weight, bool last, struct train_group_out *out,
                                 int64_t *kept)
{
    const int64_t n = host->num_scenes;
    memcpy(idx, run, (size_t)nrun * sizeof *idx);
    int64_t np = 0;
    enum qc_status st = admit_parts(tm, loader, nrun == n ? host : NULL, idx, 0, nrun, parts, &np);
    st = run_parts(tm, model, loader, host, dev, run, nrun, parts, np, idx, ctx, weight, last, out,
                   kept, st);
    for (int64_t i = 0; i < np; i++)
        part_kept_free(loader, &parts[i].kept);
    return st;
}

/* The group (host, dev) under a budget (run_scenes). A scene admitted with others that then
 * ran out of memory under every plan and was skipped (skip_oversized) leaves the others run with
 * its share of the loss denominators: the group is run again without it, from the gradients
 * and losses it started with, so that a skipped scene keeps no share whether admission or the
 * allocator skipped it. With several ranks the group's backward may already have reported
 * gradients to the reduction, which cannot be taken back: the others then keep its share, said
 * in a warning. */
static enum qc_status run_admitted(struct train_mem *tm, struct qc_qcnet *model,
                                   struct qc_loader *loader, const struct qc_batch *host,
                                   const struct qc_batch *dev, const struct qc_qcnet_ctx *ctx,
                                   float weight, bool last, struct train_group_out *out)
{
    const int64_t n = host->num_scenes;
    struct part *parts = malloc((size_t)(2 * n + 1) * sizeof *parts);
    int64_t *idx = malloc((size_t)n * sizeof *idx), *run = malloc((size_t)n * sizeof *run);
    enum qc_status st = QC_OK;
    if (!parts || !idx || !run)
        st = qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    const struct train_group_out out0 = *out;
    const bool dirty0 = tm->grads_dirty;
    /* the gradients the group starts from, for running it again without a scene skipped after
     * running out (only with skip_oversized: else such a scene is an error; and on one rank:
     * several ranks do not run the group again) */
    const bool keep = n > 1 && dirty0 && tm->skip_oversized && !tm->td;
    if (st == QC_OK && keep && !tm->grads_group &&
        !(tm->grads_group = malloc((size_t)tm->nparams * sizeof(float))))
        st = qc_errorf(QC_ERR_NOMEM, "train: gradient copy of %" PRId64 " floats", tm->nparams);
    if (st == QC_OK && keep)
        st = qc_qcnet_grads_download(model, tm->grads_group);
    int64_t nrun = n;
    if (st == QC_OK)
        memcpy(run, host->scene_index, (size_t)n * sizeof *run);
    while (st == QC_OK) {
        const int64_t skips0 = tm->rt_skips;
        int64_t kept = 0;
        st = run_scenes(tm, model, loader, host, dev, run, nrun, parts, idx, ctx, weight, last, out,
                        &kept);
        if (st != QC_OK || tm->rt_skips == skips0 || kept <= 1)
            break;
        if (tm->td) {
            qc_log(QC_LOG_WARN,
                   "train: scene (dataset index %" PRId64 ") skipped after running out of memory "
                   "beside other scenes of its group: with several ranks the group is not run "
                   "again, the others keep its share of the loss denominators",
                   tm->rt_skipped);
            break;
        }
        int64_t j = 0;
        for (int64_t i = 0; i < nrun; i++)
            if (run[i] != tm->rt_skipped)
                run[j++] = run[i];
        if (j == nrun) /* not one of this group's: nothing to run again */
            break;
        nrun = j;
        *out = out0;
        tm->grads_dirty = dirty0;
        if (dirty0)
            st = qc_qcnet_grads_upload(model, tm->grads_group);
        else
            qc_qcnet_zero_grad(model);
        qc_log(QC_LOG_INFO,
               "train: scene (dataset index %" PRId64 ") skipped: its group runs again without "
               "it (%" PRId64 " scenes)",
               tm->rt_skipped, nrun);
    }
    free(parts);
    free(idx);
    free(run);
    return st;
}

enum qc_status train_mem_group(struct train_mem *tm, struct qc_qcnet *model,
                               struct qc_loader *loader, struct train_stage *stage,
                               const struct qc_batch *next, const struct qc_qcnet_ctx *ctx,
                               float weight, struct train_dist *td, struct train_group_out *out)
{
    memset(out, 0, sizeof *out);
    tm->next = next;
    const struct qc_batch *dev = NULL;
    QC_TRY(train_stage_use(tm->be, stage, &dev));
    tm->td = td;
    tm->owned_from = tm->nparams;
    tm->step_no = (int64_t)ctx->step + 1;
    enum qc_status st =
        tm->par.budget > 0
            ? run_admitted(tm, model, loader, stage->host, dev, ctx, weight, true, out)
            : run_batch(tm, model, loader, stage->host, dev, ctx, NULL, weight, true, out);
    /* the reduced values of ranges reported before a rollback, over the re-run's own */
    if (st == QC_OK && tm->owned_from < tm->nparams)
        st = qc_op_upload(qc_train_backend_exec(tm->be), qc_qcnet_grads(model) + tm->owned_from,
                          tm->aside + tm->owned_from,
                          (size_t)(tm->nparams - tm->owned_from) * sizeof(float));
    tm->td = NULL;
    tm->next = NULL;
    plan_ahead_out_free(&tm->ahead_out); /* a calibrated plan made ahead and not used */
    tm->ahead_batch = NULL;
    return st;
}

bool train_mem_plans_ahead(const struct train_mem *tm)
{
    return tm && tm->ahead;
}

void train_mem_ahead_drop(struct train_mem *tm)
{
    if (tm && tm->ahead)
        plan_ahead_drop(tm->ahead);
}

void train_mem_ahead(const struct train_mem *tm, int64_t *admitted, int64_t *calibrated,
                     int64_t *differ)
{
    *admitted = tm->ahead_made;
    *calibrated = tm->ahead_cal_made;
    *differ = tm->ahead_differ;
}

void train_mem_parts(const struct train_mem *tm, int64_t *kept, int64_t *differ)
{
    *kept = tm->parts_kept;
    *differ = tm->parts_differ;
}

void train_mem_step_end(struct train_mem *tm, struct qc_qcnet *model, uint64_t measured_peak,
                        int64_t step)
{
    struct train_mem_step *s = &tm->step;
    struct qc_memctx_stats mc;
    qc_memctx_stats_get(qc_train_backend_memctx(tm->be), &mc);
    s->host_bytes = mc.put_host_bytes - tm->mc0.put_host_bytes;
    s->nvme_bytes = mc.put_nvme_bytes - tm->mc0.put_nvme_bytes;
    s->stall_s = mc.stall_s - tm->mc0.stall_s;
    struct qc_offload *o = qc_train_backend_offload_engine(tm->be);
    if (o) {
        struct qc_offload_stats os;
        qc_offload_stats_get(o, &os);
        s->stall_s += 1e-9 * (double)(os.stall_ns - tm->stall_ns0);
    }
    struct qc_qcnet_mem mm;
    qc_qcnet_mem_get(model, &mm);
    s->recompute_bytes = mm.recompute_bytes - tm->recompute0;
    /* a peak over the prediction raises the margin by the misprediction (not after a rollback:
     * the measured peak then holds the failed attempt's allocations, which the rollback's own
     * raise already answered); a step without a
     * failure or a miss gives a little back, down to the planner's 2 %, so that one odd scene does
     * not make every later plan conservative */
    if (tm->par.budget > 0 && measured_peak > s->predicted_peak && s->predicted_peak > 0 &&
        !s->rolled_back) {
        tm->margin += (double)(measured_peak - s->predicted_peak) / (double)tm->par.budget;
        if (tm->margin > MARGIN_MAX)
            tm->margin = MARGIN_MAX;
        tm->step_missed = true;
    }
    /* the fragmentation at this step's peak (the step's snapshot: reserved holding data) */
    struct qc_alloc_peak_snapshot snap;
    qc_alloc_peak_snapshot_step(qc_train_backend_alloc(tm->be), &snap);
    if (snap.step >= 0 && snap.bytes_reserved_live > snap.bytes_allocated)
        learn_frag(tm, snap.bytes_reserved_live - snap.bytes_allocated);
    const double floor = tm->par.margin > tm->frag_floor ? tm->par.margin : tm->frag_floor;
    if (!tm->step_missed && tm->margin > floor)
        tm->margin = tm->margin - MARGIN_DECAY > floor ? tm->margin - MARGIN_DECAY : floor;
    /* memory.json shows the plan of the step with the highest measured peak */
    if (tm->cur.blocks && measured_peak >= tm->shown_measured) {
        struct train_mem_plan t = tm->shown;
        tm->shown = tm->cur;
        tm->cur = t;
        tm->shown.r.step = step;
        tm->shown.r.measured_peak_bytes = measured_peak;
        tm->shown_measured = measured_peak;
    }
}

const struct train_mem_step *train_mem_last_step(const struct train_mem *tm)
{
    return &tm->step;
}

const struct qc_memreport_plan *train_mem_plan_shown(const struct train_mem *tm)
{
    return tm->shown.blocks ? &tm->shown.r : NULL;
}
