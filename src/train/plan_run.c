/*
 * plan_run.c — the memory planner's inputs from a configuration (qc_train.h, "Memory
 * planning"): the planner's parameters (device.budget, plan.policy, offload.placement,
 * offload.prefetch_window, alloc.round), the hardware figures (hw.*, the tiers' capacities),
 * the device bytes a run holds through every step, and a planning session that needs no run
 * (qctrain plan, qctrain bench memory, a tuner): the config's dry model, a cost model and the
 * scenes to batch (files or generated), planning any batch size.
 */
#include "qc_train.h"

#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "qc_alloc.h" /* qc_alloc_round_effective */
#include "qc_batch.h"
#include "qc_config.h"
#include "qc_dist.h" /* qc_dist_world_local_size */
#include "qc_graph.h"
#include "qc_plan.h"
#include "qc_qcshard.h"
#include "qc_synth.h"

#define GIB ((uint64_t)1 << 30)

void qc_train_plan_params(const struct qc_config *cfg, struct qc_plan_params *p)
{
    qc_plan_params_default(p);
    p->budget = cfg->device_budget;
    p->margin = cfg->plan_margin;
    p->round = qc_alloc_round_effective(cfg->alloc_round); /* as the allocator rounds */
    p->prefetch_window = cfg->offload_prefetch_window;
    switch (cfg->plan_policy) {
    case QC_PLAN_KEEP:
        p->mode = QC_PLAN_MODE_KEEP;
        break;
    case QC_PLAN_OFFLOAD:
        p->mode = QC_PLAN_MODE_OFFLOAD;
        break;
    case QC_PLAN_RECOMPUTE:
        p->mode = QC_PLAN_MODE_RECOMPUTE;
        break;
    case QC_PLAN_AUTO:
        p->mode = QC_PLAN_MODE_AUTO;
        break;
    }
    p->place = cfg->offload_placement == QC_PLACE_HOST   ? QC_PLAN_PLACE_HOST
               : cfg->offload_placement == QC_PLACE_NVME ? QC_PLAN_PLACE_NVME
                                                         : QC_PLAN_PLACE_AUTO;
}

/* This rank's share of a node's bytes: the ranks of one node (qc_dist_world_local_size, 1
 * without MPI) share its RAM and its NVMe, so a default tier is divided among them rather than
 * taken first come. */
static uint64_t node_share(uint64_t bytes)
{
    const int n = qc_dist_world_local_size();
    return n > 1 ? bytes / (uint64_t)n : bytes;
}

uint64_t qc_train_host_tier_bytes(const struct qc_config *cfg)
{
    if (cfg->offload_host_capacity > 0)
        return cfg->offload_host_capacity;
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t avail = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 4 * GIB;
    return node_share(avail / 2);
}

uint64_t qc_train_nvme_tier_bytes(const struct qc_config *cfg)
{
    if (!cfg->offload_nvme_dir[0])
        return 0;
    if (cfg->offload_nvme_capacity > 0)
        return cfg->offload_nvme_capacity;
    struct statvfs v;
    if (statvfs(cfg->offload_nvme_dir, &v) != 0)
        return 4 * GIB;
    const uint64_t half = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize / 2;
    return node_share(half < 64 * GIB ? half : 64 * GIB) / 4096 * 4096;
}

void qc_train_plan_hw(const struct qc_config *cfg, struct qc_plan_hw *hw)
{
    memset(hw, 0, sizeof *hw);
    hw->d2h_gbps = hw->h2d_gbps = cfg->hw_pcie_gbps;
    hw->nvme_write_gbps = hw->nvme_read_gbps = cfg->hw_nvme_gbps;
    hw->host_capacity = qc_train_host_tier_bytes(cfg);
    hw->nvme_capacity = qc_train_nvme_tier_bytes(cfg);
    if (cfg->offload_placement == QC_PLACE_NVME)
        hw->host_capacity = 0;
    /* cpu / emu: the copy streams run inline (qc_train_backend_offload) */
    hw->serial_copies = cfg->device_kind != QC_CONFIG_DEVICE_CUDA;
}

/* n bytes as the allocator counts them. */
static uint64_t rounded(const struct qc_config *cfg, uint64_t n)
{
    const uint64_t r = qc_alloc_round_effective(cfg->alloc_round);
    return n ? (n + r - 1) / r * r : r;
}

uint64_t qc_train_fixed_bytes(const struct qc_config *cfg, int64_t nparams, int64_t ntensors,
                              const struct qc_batch *b)
{
    const uint64_t pb = rounded(cfg, (uint64_t)nparams * sizeof(float));
    uint64_t fixed = 4 * pb; /* parameters, gradients, the two AdamW moments */
    if (cfg->device_kind != QC_CONFIG_DEVICE_CPU) {
        /* the AdamW segments of the model and of the optimizer, the staged batch */
        const uint64_t seg = ((uint64_t)(ntensors + 1) * 8 + 63) / 64 * 64 + (uint64_t)ntensors;
        fixed += rounded(cfg, seg) + rounded(cfg, (uint64_t)(ntensors + 1) * 8) +
                 rounded(cfg, (uint64_t)ntensors);
        if (b)
            fixed += rounded(cfg, b->node_bytes) + rounded(cfg, b->graph_bytes);
    }
    if (cfg->device_kind == QC_CONFIG_DEVICE_CUDA)
        fixed += rounded(cfg, (uint64_t)16 << 20); /* the ops' reduction workspace */
    return fixed;
}

// ---- a planning session without a run -----------------------------------------------------------

struct qc_train_planner {
    struct qc_config cfg;
    struct qc_qcnet *dry;
    struct qc_plan_cost *cost;
    const struct qc_plan_cost *use; /* qc_train_planner_use_cost's, or NULL: cost */
    struct qc_plan_program prog;
    struct qc_qcshard_reader **readers;
    int nreaders;
    int64_t nscenes; /* in the files; 0: generated */
    struct qc_graph_builder *gb;
    struct qc_batch batch; /* the last batch planned: scenes idx[0 .. B) */
    bool have_batch;
    int64_t *idx, B; /* B 0: nothing cached */
    int64_t ntensors;
};

void qc_train_planner_destroy(struct qc_train_planner *pl)
{
    if (!pl)
        return;
    if (pl->have_batch)
        qc_batch_release(&pl->batch);
    qc_graph_builder_destroy(pl->gb);
    for (int i = 0; i < pl->nreaders; i++)
        qc_qcshard_reader_destroy(pl->readers[i]);
    free(pl->readers);
    free(pl->idx);
    qc_plan_program_free(&pl->prog);
    qc_plan_cost_destroy(pl->cost);
    qc_qcnet_destroy(pl->dry);
    free(pl);
}

enum qc_status qc_train_planner_create(const struct qc_config *cfg, const char *const *data,
                                       int ndata, const char *cost_path,
                                       struct qc_train_planner **out)
{
    struct qc_train_planner *pl = calloc(1, sizeof *pl);
    if (!pl)
        return qc_errorf(QC_ERR_NOMEM, "plan: out of memory");
    pl->cfg = *cfg;
    qc_plan_program_init(&pl->prog);
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    enum qc_status st = qc_qcnet_create_dry(&mc, &pl->dry);
    if (st == QC_OK)
        st = qc_plan_cost_create(&pl->cost);
    if (st == QC_OK && cost_path)
        st = qc_plan_cost_load(pl->cost, cost_path);
    if (st == QC_OK)
        st = qc_graph_builder_create(&pl->gb);
    if (st == QC_OK && ndata > 0) {
        pl->readers = calloc((size_t)ndata, sizeof *pl->readers);
        if (!pl->readers)
            st = qc_errorf(QC_ERR_NOMEM, "plan: out of memory");
        for (int i = 0; i < ndata && st == QC_OK; i++) {
            st = qc_qcshard_reader_create(data[i], &pl->readers[i]);
            if (st == QC_OK) {
                pl->nreaders++;
                pl->nscenes += qc_qcshard_reader_count(pl->readers[i]);
            }
        }
        if (st == QC_OK && pl->nscenes == 0)
            st = qc_errorf(QC_ERR_INVALID, "plan: the data holds no scene");
    }
    if (st == QC_OK) {
        const int64_t *offsets;
        const uint8_t *decay;
        qc_qcnet_param_groups(pl->dry, &offsets, &decay, &pl->ntensors);
    }
    if (st != QC_OK) {
        qc_train_planner_destroy(pl);
        return st;
    }
    *out = pl;
    return QC_OK;
}

/* Scene i of the session: from the files, cycled, or generated (data.synthetic_profile,
 * train.seed). */
static enum qc_status scene_at(struct qc_train_planner *pl, int64_t i, struct qc_scene *out)
{
    if (pl->nscenes == 0)
        return qc_synth_scene((uint64_t)pl->cfg.seed, i,
                              (enum qc_synth_profile)pl->cfg.synthetic_profile, out);
    int64_t k = i % pl->nscenes;
    for (int r = 0; r < pl->nreaders; r++) {
        const int64_t n = qc_qcshard_reader_count(pl->readers[r]);
        if (k < n)
            return qc_qcshard_reader_scene(pl->readers[r], k, out);
        k -= n;
    }
    return qc_errorf(QC_ERR_INVALID, "plan: scene %lld out of range", (long long)i);
}

/* pl->batch = scenes idx[0 .. B), collated with targets, graph built. */
static enum qc_status make_batch(struct qc_train_planner *pl, const int64_t *idx, int64_t B)
{
    if (pl->have_batch) {
        qc_batch_release(&pl->batch);
        pl->have_batch = false;
    }
    struct qc_scene *sc = calloc((size_t)B, sizeof *sc);
    const struct qc_scene **ptr = calloc((size_t)B, sizeof *ptr);
    enum qc_status st =
        sc && ptr ? QC_OK : qc_errorf(QC_ERR_NOMEM, "plan: %lld scenes", (long long)B);
    int64_t made = 0;
    for (; made < B && st == QC_OK; made++) {
        st = scene_at(pl, idx[made], &sc[made]);
        ptr[made] = &sc[made];
    }
    if (st == QC_OK)
        st = qc_batch_collate(ptr, B, NULL, true, &pl->batch);
    for (int64_t i = 0; i < made; i++)
        qc_scene_free(&sc[i]);
    free(sc);
    free(ptr);
    if (st != QC_OK)
        return st;
    pl->have_batch = true;
    struct qc_graph_params gp;
    qc_train_graph_params(&pl->cfg, &gp);
    return qc_batch_build_graph(&pl->batch, pl->gb, &gp);
}

enum qc_status qc_train_planner_plan(struct qc_train_planner *pl, int64_t B,
                                     struct qc_plan_result *out,
                                     const struct qc_plan_program **prog)
{
    return qc_train_planner_plan_at(pl, 0, B, out, prog);
}

enum qc_status qc_train_planner_plan_at(struct qc_train_planner *pl, int64_t first, int64_t B,
                                        struct qc_plan_result *out,
                                        const struct qc_plan_program **prog)
{
    return qc_train_planner_plan_with(pl, first, B, NULL, NULL, out, prog);
}

enum qc_status qc_train_planner_plan_with(struct qc_train_planner *pl, int64_t first, int64_t B,
                                          const struct qc_plan_hw *hw,
                                          const struct qc_plan_params *par,
                                          struct qc_plan_result *out,
                                          const struct qc_plan_program **prog)
{
    if (B < 1 || first < 0)
        return qc_errorf(QC_ERR_INVALID, "plan: a batch of %lld scenes from scene %lld",
                         (long long)B, (long long)first);
    int64_t *idx = malloc((size_t)B * sizeof *idx);
    if (!idx)
        return qc_errorf(QC_ERR_NOMEM, "plan: %lld scenes", (long long)B);
    for (int64_t i = 0; i < B; i++)
        idx[i] = first + i;
    const enum qc_status st = qc_train_planner_plan_scenes(pl, idx, B, hw, par, out, prog);
    free(idx);
    return st;
}

enum qc_status qc_train_planner_plan_scenes(struct qc_train_planner *pl, const int64_t *idx,
                                            int64_t B, const struct qc_plan_hw *hw,
                                            const struct qc_plan_params *par,
                                            struct qc_plan_result *out,
                                            const struct qc_plan_program **prog)
{
    if (B < 1)
        return qc_errorf(QC_ERR_INVALID, "plan: a batch of %lld scenes", (long long)B);
    for (int64_t i = 0; i < B; i++)
        if (idx[i] < 0)
            return qc_errorf(QC_ERR_INVALID, "plan: scene %lld", (long long)idx[i]);
    /* the program depends on the batch alone: kept from the last call for the same one */
    if (!pl->have_batch || pl->B != B || memcmp(pl->idx, idx, (size_t)B * sizeof *idx) != 0) {
        pl->B = 0; /* nothing cached until both succeed */
        int64_t *keep = realloc(pl->idx, (size_t)B * sizeof *keep);
        if (!keep)
            return qc_errorf(QC_ERR_NOMEM, "plan: %lld scenes", (long long)B);
        pl->idx = keep;
        QC_TRY(make_batch(pl, idx, B));
        QC_TRY(qc_qcnet_describe(pl->dry, &pl->batch, pl->cfg.device_kind == QC_CONFIG_DEVICE_CUDA,
                                 &pl->prog));
        memcpy(pl->idx, idx, (size_t)B * sizeof *idx);
        pl->B = B;
    }
    pl->prog.fixed_bytes =
        qc_train_fixed_bytes(&pl->cfg, qc_qcnet_num_params(pl->dry), pl->ntensors, &pl->batch);
    struct qc_plan_params pp;
    struct qc_plan_hw hh;
    if (!par)
        qc_train_plan_params(&pl->cfg, &pp);
    if (!hw)
        qc_train_plan_hw(&pl->cfg, &hh);
    QC_TRY(qc_plan_make(&pl->prog, qc_train_planner_cost(pl), hw ? hw : &hh, par ? par : &pp, out));
    if (prog)
        *prog = &pl->prog;
    return QC_OK;
}

void qc_train_planner_use_cost(struct qc_train_planner *pl, const struct qc_plan_cost *c)
{
    pl->use = c;
}

const struct qc_batch *qc_train_planner_batch(const struct qc_train_planner *pl)
{
    return pl->have_batch ? &pl->batch : NULL;
}

const struct qc_plan_cost *qc_train_planner_cost(const struct qc_train_planner *pl)
{
    return pl->use ? pl->use : pl->cost;
}

int64_t qc_train_planner_scenes(const struct qc_train_planner *pl)
{
    return pl->nscenes;
}

enum qc_status qc_train_planner_largest(struct qc_train_planner *pl, int64_t max_b, int64_t *best)
{
    return qc_train_planner_largest_with(pl, max_b, NULL, NULL, best);
}

enum qc_status qc_train_planner_largest_with(struct qc_train_planner *pl, int64_t max_b,
                                             const struct qc_plan_hw *hw,
                                             const struct qc_plan_params *par, int64_t *best)
{
    /* doubling, then bisection, on whether the plan fits */
    int64_t lo = 0, hi = 0;
    for (int64_t b = 1; b <= max_b; b *= 2) {
        struct qc_plan_result r;
        QC_TRY(qc_train_planner_plan_with(pl, 0, b, hw, par, &r, NULL));
        const bool fits = r.fits;
        qc_plan_result_free(&r);
        if (!fits) {
            hi = b;
            break;
        }
        lo = b;
    }
    if (hi == 0) { /* everything up to max_b fits */
        *best = lo;
        return QC_OK;
    }
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        struct qc_plan_result r;
        QC_TRY(qc_train_planner_plan_with(pl, 0, mid, hw, par, &r, NULL));
        const bool fits = r.fits;
        qc_plan_result_free(&r);
        if (fits)
            lo = mid;
        else
            hi = mid;
    }
    *best = lo;
    return QC_OK;
}
