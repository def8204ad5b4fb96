/*
 * stepmem.c — the memory system in the training step (train_internal.h, "The step's memory").
 *
 * Each group of a step (a batch of scenes, one micro-batch) is
 *   1. planned: the dry run of the config's model writes the group's program from its batch
 *      (qc_qcnet_describe), the allocator's allocated bytes now are the program's fixed bytes,
 *      and the planner (src/plan) chooses the stash policies under device.budget minus the
 *      margin; the planning time is measured;
 *   2. admitted: when even the smallest peak the planner finds is over the target, the group is
 *      split into two halves of its scenes (recursively), built by the loader and run one after
 *      the other with the whole group's loss denominators (qc_qcnet_ctx.loss_norm) and the
 *      group's weight, so their losses and gradients add up to the group's (within fp32
 *      rounding; with dropout on, the moved scenes draw other, equally valid masks). A scene
 *      that does not fit alone is an error naming it, its sizes and the bytes it needs, or,
 *      with skip_oversized, skipped with a warning;
 *   3. run with its plan (qc_qcnet_set_plan); when the allocator still runs out (a
 *      misprediction, fragmentation), the group is rolled back (its activations released, the
 *      gradients restored from a host copy, or zeroed when the step had none yet: parameters and
 *      optimizer state are untouched until the step's end), the margin is raised and the group
 *      re-planned and re-run, up to 3 times before it is split. Dropout is keyed, so the re-run
 *      gives the bits of a run that never ran out.
 *   with several ranks (train_dist.c), the rank's last group of the step is armed: the
 *      gradient ranges its backward reports start reducing at once. The parts of a split group
 *      before the last run held (their gradients are not final); a rollback after ranges were
 *      reported waits for their reduction and keeps the reduced values aside (they belong to the
 *      reduction; the re-run's reports of them are dropped), restored when the group is done.
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

struct train_mem {
    struct qc_config cfg;
    struct qc_train_backend *be;
    struct qc_qcnet *dry;
    struct qc_plan_program prog;
    struct qc_plan_cost *cost;
    struct qc_plan_params par;
    struct qc_plan_hw hw;
    double margin;    /* in force: par.margin raised by failures and misses, decaying back */
    bool step_missed; /* this step ran out or peaked over its prediction */
    bool cuda;
    bool skip_oversized;
    struct qc_plan_measure *meas;
    int32_t cap_meas;
    float *grads_host; /* the rollback copy of the gradients */
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
    qc_qcnet_destroy(tm->dry);
    qc_plan_program_free(&tm->prog);
    qc_plan_cost_destroy(tm->cost);
    free(tm->meas);
    free(tm->grads_host);
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
    tm->nparams = qc_qcnet_num_params(model);
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    enum qc_status st = qc_qcnet_create_dry(&mc, &tm->dry);
    if (st == QC_OK)
        st = qc_plan_cost_create(&tm->cost);
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
    /* what an out-of-memory hint may advise (qc_oom.h) */
    qc_oom_set_planner(cfg->plan_policy != QC_PLAN_AUTO ? QC_OOM_PLANNER_FORCED
                       : cfg->device_budget > 0         ? QC_OOM_PLANNER_AUTO
                                                        : QC_OOM_PLANNER_NO_BUDGET,
                       tm->hw.nvme_capacity > 0);
    if (st == QC_OK &&
        !(tm->grads_host = malloc((size_t)(tm->nparams ? tm->nparams : 1) * sizeof(float))))
        st = qc_errorf(QC_ERR_NOMEM, "train: gradient copy of %" PRId64 " floats", tm->nparams);
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

/* Plans the batch (host) with the margin in force; the result in r. */
static enum qc_status plan(struct train_mem *tm, const struct qc_batch *host,
                           struct qc_plan_result *r)
{
    const double t0 = now_s();
    QC_TRY(qc_qcnet_describe(tm->dry, host, tm->cuda, &tm->prog));
    struct qc_alloc_stats as;
    qc_alloc_stats_get(qc_train_backend_alloc(tm->be), &as);
    tm->prog.fixed_bytes = as.bytes_allocated;
    struct qc_plan_params par = tm->par;
    par.margin = tm->margin;
    enum qc_status st = qc_plan_make(&tm->prog, tm->cost, &tm->hw, &par, r);
    tm->step.plan_s += now_s() - t0;
    return st;
}

/* Measures the group's blocks into the cost model (before release). */
static void calibrate(struct train_mem *tm, struct qc_qcnet *model, double group_s)
{
    if (tm->cap_meas < tm->prog.nblocks) {
        struct qc_plan_measure *n = realloc(tm->meas, (size_t)tm->prog.nblocks * sizeof *tm->meas);
        if (!n)
            return; /* calibration is best effort */
        tm->meas = n;
        tm->cap_meas = tm->prog.nblocks;
    }
    if (qc_qcnet_measure(model, tm->meas, tm->prog.nblocks) == QC_OK)
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

/* Runs the scenes idx[0 .. n) as a sub-group: built by the loader, staged, run. */
static enum qc_status run_part(struct train_mem *tm, struct qc_qcnet *model,
                               struct qc_loader *loader, const int64_t *idx, int64_t n,
                               const struct qc_qcnet_ctx *ctx, const float *norm, float weight,
                               bool last, struct train_group_out *out)
{
    struct qc_batch *b = NULL;
    QC_TRY(qc_loader_build(loader, idx, n, &b));
    struct train_stage s = {0};
    enum qc_status st = train_stage_put(tm->be, &s, b);
    if (st != QC_OK) {
        qc_loader_release(loader, b);
        return st;
    }
    const struct qc_batch *dev = NULL;
    st = train_stage_use(tm->be, &s, &dev);
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

static enum qc_status run_batch(struct train_mem *tm, struct qc_qcnet *model,
                                struct qc_loader *loader, const struct qc_batch *host,
                                const struct qc_batch *dev, const struct qc_qcnet_ctx *ctx,
                                const float *norm, float weight, bool last,
                                struct train_group_out *out)
{
    struct qc_plan_result r = {0};
    enum qc_status st = QC_OK;
    uint64_t need = 0;    /* the last plan's peak */
    bool ran_out = false; /* the attempts ran out under plans that fit */
    const int attempts = host->num_scenes == 1 ? MAX_ATTEMPTS_1 : MAX_ATTEMPTS;
    int a = 0;
    for (; a < attempts; a++) {
        st = plan(tm, host, &r);
        if (st != QC_OK)
            return st;
        need = r.peak;
        ran_out = r.fits;
        if (!r.fits)
            break;
        if (tm->hook)
            tm->hook(tm->hook_user, &tm->prog, r.policy);
        st = keep_plan(tm, &r);
        if (st == QC_OK)
            st = qc_qcnet_set_plan(model, &tm->prog, r.policy, r.window);
        /* the rollback copy, when earlier groups of the step accumulated gradients */
        const bool dirty = tm->grads_dirty;
        if (st == QC_OK && dirty && tm->par.budget > 0)
            st = qc_qcnet_grads_download(model, tm->grads_host);
        if (st == QC_OK)
            st = attempt(tm, model, host, dev, ctx, norm, weight, last, out);
        /* the plans that ran to the end (a rolled-back attempt's allocations are in the step's
         * measured peak too, up to where it failed: such a step's two peaks do not compare) */
        if (st == QC_OK && r.peak > tm->step.predicted_peak)
            tm->step.predicted_peak = r.peak;
        if (st != QC_ERR_NOMEM || tm->par.budget == 0) {
            qc_plan_result_free(&r);
            return st;
        }
        /* rollback: nothing of this group stays; re-plan with a larger margin */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qc_error_last());
        char *hint = strstr(msg, "\nhint:"); /* recovered here: no advice for the user */
        if (hint)
            *hint = '\0';
        struct qc_alloc_stats as;
        qc_alloc_stats_get(qc_train_backend_alloc(tm->be), &as);
        st = keep_reduced(tm, model);
        if (st == QC_OK && dirty)
            st = qc_qcnet_grads_upload(model, tm->grads_host);
        else if (st == QC_OK)
            qc_qcnet_zero_grad(model);
        /* the re-run starts from an empty cache: what this attempt's pattern left reserved
         * (partly used segments, free blocks between granules) goes back */
        if (st == QC_OK)
            st = qc_alloc_empty_cache(qc_train_backend_alloc(tm->be));
        if (st != QC_OK) {
            qc_plan_result_free(&r);
            return st;
        }
        /* the new margin covers what the prediction missed (an active peak over it) or what
         * fragmentation held when the allocator ran out (reserved − allocated, after its cache
         * release), whichever is larger, by 3 to 10 points more per failure: the fragmentation
         * at a failure belongs to that attempt's allocation pattern, which a new plan changes,
         * so it is approached in steps rather than taken whole */
        const double budget = (double)tm->par.budget;
        const double seen =
            as.bytes_active_peak > r.peak ? (double)(as.bytes_active_peak - r.peak) / budget : 0.0;
        struct qc_memctx_stats ms;
        qc_memctx_stats_get(qc_train_backend_memctx(tm->be), &ms);
        const double frag = ms.fail_reserved > ms.fail_allocated
                                ? (double)(ms.fail_reserved - ms.fail_allocated) / budget
                                : 0.0;
        double up = seen > frag ? seen : frag;
        up = up < MARGIN_STEP ? MARGIN_STEP : up > MARGIN_JUMP ? MARGIN_JUMP : up;
        const double m = tm->margin + up;
        tm->margin = m < MARGIN_MAX ? m : MARGIN_MAX;
        tm->step.replans++;
        tm->step_missed = true;
        qc_log(QC_LOG_WARN,
               "train: out of device memory under the plan (predicted peak %" PRIu64
               " bytes; at the failure %zu bytes allocated, %zu reserved of which %zu small): "
               "rolled back and re-planned with a %.1f %% margin (%s)",
               r.peak, ms.fail_allocated, ms.fail_reserved, ms.fail_reserved_small,
               100.0 * tm->margin, msg);
        qc_plan_result_free(&r);
    }
    /* admission control: even the smallest plan does not fit (or kept running out) */
    qc_plan_result_free(&r);
    if (host->num_scenes == 1) {
        /* the budget whose target (budget × (1 − margin)) holds the plan's peak */
        const uint64_t budget_needed = (uint64_t)((double)need / (1.0 - tm->margin)) + 1;
        char sizes[512], why[160], b1[32], b2[32], b3[32];
        scene_sizes(host, sizes, sizeof sizes);
        qc_format_bytes(need, b1, sizeof b1);
        qc_format_bytes(budget_needed, b2, sizeof b2);
        qc_format_bytes(tm->par.budget, b3, sizeof b3);
        if (ran_out)
            snprintf(why, sizeof why,
                     "it ran out of device memory %d times under plans peaking at %s "
                     "(fragmentation)",
                     a, b1);
        else
            snprintf(why, sizeof why, "its smallest plan peaks at %s", b1);
        if (tm->skip_oversized) {
            qc_log(QC_LOG_WARN,
                   "train: scene %s (dataset index %" PRId64
                   ") does not fit the device budget alone (%s; %s, budget %s): skipped",
                   host->scenario_id[0], host->scene_index[0], sizes, why, b3);
            tm->step.skipped++;
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
                         host->scenario_id[0], host->scene_index[0], sizes, why, b2, budget_needed,
                         b3, qc_oom_hint(&f, hint, sizeof hint));
    }
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
    st = run_part(tm, model, loader, idx, h, ctx, norm, weight, false, out);
    if (st == QC_OK)
        st = run_part(tm, model, loader, idx + h, n - h, ctx, norm, weight, last, out);
    free(idx);
    return st;
}

enum qc_status train_mem_group(struct train_mem *tm, struct qc_qcnet *model,
                               struct qc_loader *loader, struct train_stage *stage,
                               const struct qc_qcnet_ctx *ctx, float weight, struct train_dist *td,
                               struct train_group_out *out)
{
    memset(out, 0, sizeof *out);
    const struct qc_batch *dev = NULL;
    QC_TRY(train_stage_use(tm->be, stage, &dev));
    tm->td = td;
    tm->owned_from = tm->nparams;
    enum qc_status st =
        run_batch(tm, model, loader, stage->host, dev, ctx, NULL, weight, true, out);
    /* the reduced values of ranges reported before a rollback, over the re-run's own */
    if (st == QC_OK && tm->owned_from < tm->nparams)
        st = qc_op_upload(qc_train_backend_exec(tm->be), qc_qcnet_grads(model) + tm->owned_from,
                          tm->aside + tm->owned_from,
                          (size_t)(tm->nparams - tm->owned_from) * sizeof(float));
    tm->td = NULL;
    return st;
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
    /* a peak over the prediction raises the margin by the misprediction; a step without a
     * failure or a miss gives a little back, down to the planner's 2 %, so that one odd scene does
     * not make every later plan conservative */
    if (tm->par.budget > 0 && measured_peak > s->predicted_peak && s->predicted_peak > 0) {
        tm->margin += (double)(measured_peak - s->predicted_peak) / (double)tm->par.budget;
        if (tm->margin > MARGIN_MAX)
            tm->margin = MARGIN_MAX;
        tm->step_missed = true;
    }
    if (!tm->step_missed && tm->margin > tm->par.margin)
        tm->margin =
            tm->margin - MARGIN_DECAY > tm->par.margin ? tm->margin - MARGIN_DECAY : tm->par.margin;
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
