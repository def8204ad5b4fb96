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
#include <errno.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "qc_alloc.h" /* qc_alloc_round_effective */
#include "qc_batch.h"
#include "qc_config.h"
#include "qc_dist.h" /* qc_dist_shard_range */
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

int64_t qc_train_plan_world(const struct qc_config *cfg)
{
    return cfg->world_size > 0 ? cfg->world_size : 1;
}

uint64_t qc_train_plan_budget(const struct qc_config *cfg)
{
    if (cfg->device_budget)
        return cfg->device_budget;
    if (cfg->device_kind == QC_CONFIG_DEVICE_CUDA && cfg->hw_device_memory > cfg->hw_device_reserve)
        return cfg->hw_device_memory - cfg->hw_device_reserve;
    return 0;
}

uint64_t qc_train_fixed_parts(const struct qc_config *cfg, int64_t nparams, int64_t ntensors,
                              const struct qc_batch *b, struct qc_train_fixed *out)
{
    struct qc_train_fixed f = {0};
    const int64_t W = qc_train_plan_world(cfg);
    f.params = rounded(cfg, (uint64_t)nparams * sizeof(float));
    f.grads = f.params; /* reduced in place: the whole buffer on every rank, every stage */
    /* ZeRO 1 and 2: a rank's AdamW moments cover its shard (the largest, rank 0's or the
     * last's: src/dist/shard.c); ZeRO 0 and one rank: the whole buffer */
    int64_t shard = nparams;
    if (cfg->zero_stage >= 1 && W > 1) {
        shard = 0;
        for (int r = 0; r < (int)W; r++) {
            int64_t lo, hi;
            qc_dist_shard_range(nparams, (int)W, r, &lo, &hi);
            if (hi - lo > shard)
                shard = hi - lo;
        }
    }
    f.moments = 2 * rounded(cfg, (uint64_t)shard * sizeof(float));
    if (cfg->device_kind != QC_CONFIG_DEVICE_CPU) {
        /* the AdamW segments of the model and of the optimizer */
        const uint64_t seg = ((uint64_t)(ntensors + 1) * 8 + 63) / 64 * 64 + (uint64_t)ntensors;
        f.other += rounded(cfg, seg) + rounded(cfg, (uint64_t)(ntensors + 1) * 8) +
                   rounded(cfg, (uint64_t)ntensors);
        if (b) /* the staged batch */
            f.batch = rounded(cfg, b->node_bytes) + rounded(cfg, b->graph_bytes);
    }
    if (cfg->device_kind == QC_CONFIG_DEVICE_CUDA)
        f.other += rounded(cfg, (uint64_t)16 << 20); /* the ops' reduction workspace */
    if (out)
        *out = f;
    return f.params + f.grads + f.moments + f.batch + f.other;
}

uint64_t qc_train_fixed_bytes(const struct qc_config *cfg, int64_t nparams, int64_t ntensors,
                              const struct qc_batch *b)
{
    return qc_train_fixed_parts(cfg, nparams, ntensors, b, NULL);
}

bool qc_train_edge_choose(const struct qc_config *cfg)
{
    return cfg->edge_mode == QC_EDGE_MODE_AUTO && cfg->attention == QC_ATTENTION_FUSED;
}

enum qc_status qc_train_edge_modes_set(struct qc_qcnet *m, const struct qc_config *cfg,
                                       uint32_t tiled)
{
    if (!tiled)
        return qc_qcnet_set_edge_modes(m, NULL);
    enum qc_attn_edge_mode modes[QC_QCNET_EDGE_SETS];
    for (int s = 0; s < QC_QCNET_EDGE_SETS; s++)
        modes[s] = (tiled >> s) & 1u ? QC_ATTN_EDGE_TILED : (enum qc_attn_edge_mode)cfg->edge_mode;
    return qc_qcnet_set_edge_modes(m, modes);
}

// ---- a planning session without a run -----------------------------------------------------------

/* A scene's sizes: what a batch's program and staged bytes depend on. The graph of a batch is
 * the disjoint union of its scenes' graphs (edges never leave a scene; max_num_neighbors is per
 * destination), so a batch's sizes are its scenes' summed: each scene is read or generated and
 * its graph built once, alone, and a batch of any size is described without collating it
 * (tests/test_planner.c checks the sums against collated batches). */
struct scene_size {
    int64_t agents, polygons, points, pl2pl;
    struct {
        int64_t edges, src, dst;
        bool perm, attr, type; /* the set's optional arrays are present */
        int nfeat;
        uint32_t *deg; /* [dst] edges per destination (owned): the blocks' tiles follow them */
    } e[QC_EDGE_SET_COUNT];
    int64_t modes;
    int64_t scene; /* which scene (the cache's key) */
};

/* The scene's nodes a set's destinations number: polygons (pt2pl, pl2pl) or agents. A batch
 * numbers the destinations of pl2a and a2a step-major, t·A + a (src/data/graph_build.c), so
 * their dst_ptr is the scenes' degrees interleaved per step; the other sets number them node-
 * major (t: a·T + t, m2m: a·K + k) or once per node, scene after scene (dst_major). */
static bool dst_step_major(int e)
{
    return e == QC_EDGE_PL2A || e == QC_EDGE_A2A;
}

static int64_t dst_nodes(const struct scene_size *z, int e)
{
    return e == QC_EDGE_PT2PL || e == QC_EDGE_PL2PL ? z->polygons : z->agents;
}

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
    struct scene_size *sizes; /* [nsized] the scenes sized so far, by scene (cached) */
    int64_t nsized, cap_sized;
    int64_t *dst_ptr[QC_EDGE_SET_COUNT]; /* batch's sets' dst_ptr (size_batch) */
    int64_t cap_ptr[QC_EDGE_SET_COUNT];
    struct qc_batch batch; /* the sizes of the last batch planned (no arrays) */
    void *zeros;           /* a read-only mapping of zero pages (no memory behind it): every
                              array of batch points there (the model checks that a batch has
                              its arrays; a dry run reads none) */
    size_t nzeros;
    bool have_batch;
    bool described; /* prog is the program of batch with the edge sets of `tiled` tiled */
    uint32_t tiled;
    int64_t *idx, B; /* B 0: nothing cached */
    int64_t ntensors;
};

void qc_train_planner_destroy(struct qc_train_planner *pl)
{
    if (!pl)
        return;
    qc_graph_builder_destroy(pl->gb);
    for (int i = 0; i < pl->nreaders; i++)
        qc_qcshard_reader_destroy(pl->readers[i]);
    free(pl->readers);
    free(pl->idx);
    for (int64_t i = 0; i < pl->nsized; i++)
        for (int e = 0; e < QC_EDGE_SET_COUNT; e++)
            free(pl->sizes[i].e[e].deg);
    free(pl->sizes);
    for (int e = 0; e < QC_EDGE_SET_COUNT; e++)
        free(pl->dst_ptr[e]);
    if (pl->zeros)
        munmap(pl->zeros, pl->nzeros);
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
    pl->cfg.device_budget = qc_train_plan_budget(cfg);
    qc_plan_program_init(&pl->prog);
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    enum qc_status st = qc_qcnet_create_dry(&mc, &pl->dry);
    if (st == QC_OK)
        st = qc_plan_cost_create(&pl->cost);
    if (st == QC_OK && cost_path)
        st = qc_plan_cost_load(pl->cost, cost_path);
    if (st == QC_OK && !cost_path && cfg->device_kind == QC_CONFIG_DEVICE_CUDA &&
        cfg->hw_tflops > 0 && cfg->hw_mem_gbps > 0) {
        /* a GPU without a calibration: its roofline, never the CPU's coefficients */
        const struct qc_plan_roofline roof = {.flops = cfg->hw_tflops * 1e12,
                                              .mem_bps = cfg->hw_mem_gbps * 1e9,
                                              .hidden_dim = cfg->hidden_dim,
                                              .freq_bands = cfg->num_freq_bands,
                                              .nparams = qc_qcnet_num_params(pl->dry)};
        qc_plan_cost_destroy(pl->cost);
        pl->cost = NULL;
        st = qc_plan_cost_create_roofline(&roof, &pl->cost);
    }
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

/* The sizes of scene i (files cycled: scene i is scene i mod nscenes), measured once. */
static enum qc_status scene_size_of(struct qc_train_planner *pl, int64_t i,
                                    const struct scene_size **out)
{
    const int64_t k = pl->nscenes > 0 ? i % pl->nscenes : i;
    /* the cache is sorted by scene: only the scenes asked for are sized (a tuner weighs a few
     * spread over thousands) */
    int64_t lo = 0, hi = pl->nsized;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (pl->sizes[mid].scene < k)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < pl->nsized && pl->sizes[lo].scene == k) {
        *out = &pl->sizes[lo];
        return QC_OK;
    }
    {
        if (pl->nsized == pl->cap_sized) {
            const int64_t c = pl->cap_sized ? 2 * pl->cap_sized : 64;
            struct scene_size *n = realloc(pl->sizes, (size_t)c * sizeof *n);
            if (!n)
                return qc_errorf(QC_ERR_NOMEM, "plan: sizes of %lld scenes", (long long)c);
            pl->sizes = n;
            pl->cap_sized = c;
        }
        struct qc_scene sc;
        QC_TRY(scene_at(pl, k, &sc));
        const struct qc_scene *ptr = &sc;
        struct qc_batch b;
        enum qc_status st = qc_batch_collate(&ptr, 1, NULL, true, &b);
        qc_scene_free(&sc);
        if (st != QC_OK)
            return st;
        struct qc_graph_params gp;
        qc_train_graph_params(&pl->cfg, &gp);
        struct qc_graph g;
        st = qc_graph_build(pl->gb, &gp, &b, &g); /* arrays in the builder's scratch */
        if (st == QC_OK) {
            struct scene_size tmp, *z = &tmp;
            memset(z, 0, sizeof *z);
            z->scene = k;
            z->agents = b.num_agents;
            z->polygons = b.num_polygons;
            z->points = b.num_points;
            z->pl2pl = b.num_pl2pl;
            z->modes = g.num_modes;
            for (int e = 0; e < QC_EDGE_SET_COUNT && st == QC_OK; e++) {
                const int64_t nd = g.e[e].num_dst, n = dst_nodes(z, e);
                if (nd > 0 && (n == 0 || nd % n != 0)) {
                    st = qc_errorf(QC_ERR_INVALID,
                                   "plan: edge set %s of scene %lld: %lld destinations for "
                                   "%lld nodes",
                                   qc_edge_set_name((enum qc_edge_set)e), (long long)k,
                                   (long long)nd, (long long)n);
                    break;
                }
                z->e[e].deg = malloc((size_t)(nd > 0 ? nd : 1) * sizeof *z->e[e].deg);
                if (!z->e[e].deg) {
                    st = qc_errorf(QC_ERR_NOMEM, "plan: %lld destinations", (long long)nd);
                    break;
                }
                for (int64_t d = 0; d < nd; d++)
                    z->e[e].deg[d] = (uint32_t)(g.e[e].dst_ptr[d + 1] - g.e[e].dst_ptr[d]);
                z->e[e].edges = g.e[e].num_edges;
                z->e[e].src = g.e[e].num_src;
                z->e[e].dst = g.e[e].num_dst;
                z->e[e].nfeat = g.e[e].num_feat;
                z->e[e].perm = g.e[e].perm != NULL;
                z->e[e].attr = g.e[e].attr != NULL;
                z->e[e].type = g.e[e].type != NULL;
            }
            if (st == QC_OK) { /* inserted at lo, the order kept */
                memmove(&pl->sizes[lo + 1], &pl->sizes[lo],
                        (size_t)(pl->nsized - lo) * sizeof *pl->sizes);
                pl->sizes[lo] = tmp;
                pl->nsized++;
            } else
                for (int e = 0; e < QC_EDGE_SET_COUNT; e++)
                    free(z->e[e].deg);
        }
        qc_batch_release(&b);
        QC_TRY(st);
    }
    *out = &pl->sizes[lo];
    return QC_OK;
}

static size_t fmax_sz(size_t a, size_t b)
{
    return a > b ? a : b;
}

static size_t a64(size_t n)
{
    return (n + 63) / 64 * 64;
}

/* The bytes qc_batch_collate (with targets) takes for these counts: src/data/collate.c's
 * layout, every array 64-byte aligned. */
static size_t node_bytes(int64_t B_, int64_t A_, int64_t P_, int64_t Pt_, int64_t Et_)
{
    const size_t B = (size_t)B_, A = (size_t)A_, P = (size_t)P_, Pt = (size_t)Pt_, Et = (size_t)Et_,
                 i8 = sizeof(int64_t), f4 = sizeof(float), S = QC_SCENE_STEPS,
                 T = QC_BATCH_FUTURE_STEPS;
    size_t n = 4 * a64((B + 1) * i8) + 2 * a64(B * i8) + a64(B * QC_SCENE_ID_MAX) +
               a64(B * QC_SCENE_CITY_MAX);
    n += 2 * a64(A * S) + 2 * a64(A) + 2 * a64(A * S * 3 * f4) + a64(A * S * f4) +
         a64(A * T * 4 * f4) + a64(A * i8) + a64(A * QC_AGENT_ID_MAX);
    n += a64(P * 3 * f4) + 2 * a64(P * f4) + 2 * a64(P) + a64(P * i8);
    n += a64(Pt * 3 * f4) + 3 * a64(Pt * f4) + 2 * a64(Pt) + a64(Pt * i8) + a64(2 * Pt * i8);
    n += a64(2 * Et * i8) + a64(Et);
    return n ? n : 64;
}

/* pl->batch = the sizes of scenes idx[0 .. B): counts and edge counts (no arrays), the staged
 * bytes as collating and packing them would take. */
static enum qc_status size_batch(struct qc_train_planner *pl, const int64_t *idx, int64_t B)
{
    struct qc_batch *b = &pl->batch;
    memset(b, 0, sizeof *b);
    pl->have_batch = false;
    b->num_scenes = B;
    struct qc_graph *g = &b->graph;
    bool perm[QC_EDGE_SET_COUNT] = {0}, attr[QC_EDGE_SET_COUNT] = {0},
         type[QC_EDGE_SET_COUNT] = {0};
    for (int64_t i = 0; i < B; i++) {
        const struct scene_size *z;
        QC_TRY(scene_size_of(pl, idx[i], &z));
        b->num_agents += z->agents;
        b->num_polygons += z->polygons;
        b->num_points += z->points;
        b->num_pl2pl += z->pl2pl;
        g->num_modes = z->modes;
        for (int e = 0; e < QC_EDGE_SET_COUNT; e++) {
            g->e[e].num_edges += z->e[e].edges;
            g->e[e].num_src += z->e[e].src;
            g->e[e].num_dst += z->e[e].dst;
            g->e[e].num_feat = z->e[e].nfeat;
            perm[e] |= z->e[e].perm; /* a batch's order is its scenes' in turn */
            attr[e] |= z->e[e].attr;
            type[e] |= z->e[e].type;
        }
    }
    /* every set's dst_ptr: the scenes' degrees interleaved per step / mode (dst_nodes) */
    for (int e = 0; e < QC_EDGE_SET_COUNT; e++) {
        const int64_t nd = g->e[e].num_dst;
        if (nd + 1 > pl->cap_ptr[e]) {
            int64_t *p = realloc(pl->dst_ptr[e], (size_t)(nd + 1) * sizeof *p);
            if (!p)
                return qc_errorf(QC_ERR_NOMEM, "plan: %lld destinations", (long long)nd);
            pl->dst_ptr[e] = p;
            pl->cap_ptr[e] = nd + 1;
        }
        const int64_t N =
            e == QC_EDGE_PT2PL || e == QC_EDGE_PL2PL ? b->num_polygons : b->num_agents;
        const int64_t M = dst_step_major(e) && N > 0 ? nd / N : 1;
        int64_t *ptr = pl->dst_ptr[e], k = 0;
        ptr[0] = 0;
        for (int64_t m = 0; m < M; m++)
            for (int64_t i = 0; i < B; i++) {
                const struct scene_size *z;
                QC_TRY(scene_size_of(pl, idx[i], &z));
                /* step-major: the scene's nodes at step m; else all its destinations */
                const int64_t n = M > 1 ? dst_nodes(z, e) : z->e[e].dst;
                for (int64_t j = 0; j < n; j++, k++)
                    ptr[k + 1] = ptr[k] + z->e[e].deg[m * n + j];
            }
        if (k != nd || ptr[k] != g->e[e].num_edges)
            return qc_errorf(QC_ERR_INVALID,
                             "plan: edge set %s: the scenes' degrees give %lld destinations and "
                             "%lld edges, their counts %lld and %lld",
                             qc_edge_set_name((enum qc_edge_set)e), (long long)k, (long long)ptr[k],
                             (long long)nd, (long long)g->e[e].num_edges);
    }
    g->num_scenes = B;
    g->num_agents = b->num_agents;
    g->num_polygons = b->num_polygons;
    g->num_points = b->num_points;
    size_t gb = 0;
    for (int e = 0; e < QC_EDGE_SET_COUNT; e++) { /* qc_graph_packed_bytes */
        const size_t E = (size_t)g->e[e].num_edges;
        gb += 2 * a64(E * sizeof(int64_t)) + a64((size_t)(g->e[e].num_dst + 1) * sizeof(int64_t));
        if (perm[e])
            gb += a64(E * sizeof(int64_t));
        if (attr[e])
            gb += a64(E * (size_t)g->e[e].num_feat * sizeof(float));
        if (type[e])
            gb += a64(E);
    }
    /* the arrays: every one in the zero mapping, as large as the largest */
    size_t most = (size_t)(B + 1) * QC_SCENE_ID_MAX;
    for (int e = 0; e < QC_EDGE_SET_COUNT; e++) {
        const size_t E = (size_t)g->e[e].num_edges;
        most = fmax_sz(most, E * sizeof(int64_t));
        most = fmax_sz(most, E * (size_t)g->e[e].num_feat * sizeof(float));
    }
    most = fmax_sz(most, (size_t)b->num_agents * QC_SCENE_STEPS * 3 * sizeof(float));
    most = fmax_sz(most, (size_t)b->num_agents * QC_AGENT_ID_MAX);
    most = fmax_sz(most, (size_t)b->num_points * 3 * sizeof(float));
    most = fmax_sz(most, (size_t)(2 * b->num_points + 2 * b->num_pl2pl) * sizeof(int64_t));
    most = fmax_sz(most, (size_t)b->num_polygons * 3 * sizeof(float));
    most = (most + 4095) / 4096 * 4096;
    if (most > pl->nzeros) {
        void *z = mmap(NULL, most, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (z == MAP_FAILED)
            return qc_errorf(QC_ERR_NOMEM, "plan: a mapping of %zu bytes: %s", most,
                             strerror(errno));
        if (pl->zeros)
            munmap(pl->zeros, pl->nzeros);
        pl->zeros = z;
        pl->nzeros = most;
    }
    void *Z = pl->zeros;
    for (int e = 0; e < QC_EDGE_SET_COUNT; e++) {
        struct qc_edges *x = &g->e[e];
        x->src = x->dst = Z;
        x->dst_ptr = pl->dst_ptr[e];
        x->perm = perm[e] ? Z : NULL;
        x->attr = attr[e] ? Z : NULL;
        x->type = type[e] ? Z : NULL;
    }
    b->agent_ptr = b->pl_ptr = b->pt_ptr = b->pl2pl_ptr = b->av_index = b->scene_index = Z;
    b->scenario_id = Z;
    b->city = Z;
    b->valid_mask = b->predict_mask = b->agent_type = b->agent_category = Z;
    b->position = b->heading = b->velocity = b->target = Z;
    b->agent_batch = Z;
    b->agent_id = Z;
    b->pl_position = b->pl_orientation = b->pl_height = Z;
    b->pl_type = b->pl_is_intersection = Z;
    b->pl_batch = Z;
    b->pt_position = b->pt_orientation = b->pt_magnitude = b->pt_height = Z;
    b->pt_type = b->pt_side = Z;
    b->pt_batch = b->pt2pl = b->pl2pl_edge = Z;
    b->pl2pl_type = Z;
    b->node_mem = b->graph_mem = NULL; /* not owned: qc_batch_release is never called on it */
    b->node_bytes = node_bytes(B, b->num_agents, b->num_polygons, b->num_points, b->num_pl2pl);
    b->graph_bytes = gb ? gb : 64;
    b->has_graph = true;
    pl->have_batch = true;
    return QC_OK;
}

/* The describer of the session's batch (qc_plan_describer): the dry model's program with the
 * edge sets of `tiled` tiled, described again only when the mask changes. */
static enum qc_status session_describe(void *user, uint32_t tiled,
                                       const struct qc_plan_program **prog)
{
    struct qc_train_planner *pl = user;
    if (!pl->described || pl->tiled != tiled) {
        pl->described = false;
        QC_TRY(qc_train_edge_modes_set(pl->dry, &pl->cfg, tiled));
        QC_TRY(qc_qcnet_describe(pl->dry, &pl->batch, pl->cfg.device_kind == QC_CONFIG_DEVICE_CUDA,
                                 &pl->prog));
        pl->tiled = tiled;
        pl->described = true;
    }
    pl->prog.fixed_bytes =
        qc_train_fixed_bytes(&pl->cfg, qc_qcnet_num_params(pl->dry), pl->ntensors, &pl->batch);
    *prog = &pl->prog;
    return QC_OK;
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
    /* the batch's sizes depend on its scenes alone: kept from the last call for the same ones */
    if (!pl->have_batch || pl->B != B || memcmp(pl->idx, idx, (size_t)B * sizeof *idx) != 0) {
        pl->B = 0; /* nothing cached until it succeeds */
        pl->described = false;
        int64_t *keep = realloc(pl->idx, (size_t)B * sizeof *keep);
        if (!keep)
            return qc_errorf(QC_ERR_NOMEM, "plan: %lld scenes", (long long)B);
        pl->idx = keep;
        QC_TRY(size_batch(pl, idx, B));
        memcpy(pl->idx, idx, (size_t)B * sizeof *idx);
        pl->B = B;
    }
    struct qc_plan_params pp;
    struct qc_plan_hw hh;
    if (!par)
        qc_train_plan_params(&pl->cfg, &pp);
    if (!hw)
        qc_train_plan_hw(&pl->cfg, &hh);
    /* the edge modes as the trainer chooses them (qc_plan_make_edges) */
    const struct qc_plan_describer d = {session_describe, pl};
    const struct qc_plan_program *p = NULL;
    uint32_t tiled = 0;
    QC_TRY(qc_plan_make_edges(&d, qc_train_edge_choose(&pl->cfg), qc_train_planner_cost(pl),
                              hw ? hw : &hh, par ? par : &pp, &tiled, &p, out));
    if (prog)
        *prog = p;
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

uint64_t qc_train_planner_fixed(const struct qc_train_planner *pl, struct qc_train_fixed *out)
{
    return qc_train_fixed_parts(&pl->cfg, qc_qcnet_num_params(pl->dry), pl->ntensors,
                                pl->have_batch ? &pl->batch : NULL, out);
}

bool qc_train_planner_times_known(const struct qc_train_planner *pl)
{
    const struct qc_plan_cost *c = qc_train_planner_cost(pl);
    return pl->cfg.device_kind != QC_CONFIG_DEVICE_CUDA || qc_plan_cost_is_roofline(c) ||
           qc_plan_cost_steps(c) > 0;
}

enum qc_status qc_train_planner_largest(struct qc_train_planner *pl, int64_t max_b, int64_t *best)
{
    return qc_train_planner_largest_with(pl, max_b, NULL, NULL, best);
}

enum qc_status qc_train_planner_largest_with(struct qc_train_planner *pl, int64_t max_b,
                                             const struct qc_plan_hw *hw,
                                             const struct qc_plan_params *par, int64_t *best)
{
    /* without a budget every batch fits */
    struct qc_plan_params pp;
    if (!par)
        qc_train_plan_params(&pl->cfg, &pp);
    if ((par ? par : &pp)->budget == 0) {
        *best = max_b;
        return QC_OK;
    }
    /* doubling, then bisection, on whether the plan fits; each size costs one description
     * of the batch from its scenes' cached sizes (size_batch) and one plan */
    int64_t lo = 0, hi = 0;
    for (int64_t b = 1; lo < max_b; b = 2 * b < max_b ? 2 * b : max_b) {
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
    if (hi == 0) { /* everything up to max_b fits (max_b itself tried) */
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
