/*
 * test_loader.c — the background loader: epoch plans (shuffle, rank split, cost balance, the
 * same groups whatever the split between ranks and accumulation),
 * determinism independent of thread count and timing, qcshard and synthetic sources giving the
 * same batches, the allocator hook, epoch restarts and errors; two ranks on emulated devices 0
 * and 1 whose worker threads pin every batch on their own rank's device.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "qc_batch.h"
#include "qc_emu.h"
#include "qc_loader.h"
#include "qc_pinned.h"
#include "qc_qcshard.h"
#include "qc_synth.h"
#include "testutil.h"

// ---- plans -----------------------------------------------------------------------------------

static void test_plan_plain(void)
{
    enum { N = 10, W = 3, B = 2 };
    int64_t ptr[N + 4], idx[N + 4];
    int seen[N] = {0};
    int64_t total = 0;
    /* steps of W groups of B scenes (6 scenes), group j of a step to rank j mod W: 10 scenes
     * are 5 groups, 3 in the first step and 2 in the second, so rank 2 has one batch */
    const int64_t want_nb[W] = {2, 2, 1};
    for (int64_t r = 0; r < W; r++) {
        int64_t nb = qc_loader_plan_epoch(N, NULL, 7, 0, true, B, 1, r, W, false, false, ptr, idx);
        T_EXPECT_EQ_I64(nb, want_nb[r], "rank %lld batches", (long long)r);
        T_EXPECT_EQ_I64(ptr[nb], 2 * want_nb[r], "rank %lld scenes", (long long)r);
        for (int64_t i = 0; i < ptr[nb]; i++) {
            T_EXPECT(idx[i] >= 0 && idx[i] < N, "index %lld", (long long)idx[i]);
            seen[idx[i]]++;
        }
        total += ptr[nb];
    }
    T_EXPECT_EQ_I64(total, N, "no padding: every scene once");
    for (int i = 0; i < N; i++)
        T_EXPECT_EQ_I64(seen[i], 1, "scene %d seen once", i);
    T_EXPECT_EQ_I64(qc_loader_plan_groups(N, B, false), 5, "groups of the epoch");
    /* no shuffle: rank 1 takes group 1 of each step: scenes 2,3 then 8,9 */
    int64_t nb = qc_loader_plan_epoch(N, NULL, 7, 0, false, B, 1, 1, W, false, false, ptr, idx);
    T_EXPECT(nb == 2 && idx[0] == 2 && idx[1] == 3 && idx[2] == 8 && idx[3] == 9,
             "unshuffled rank 1: %lld %lld %lld %lld", (long long)idx[0], (long long)idx[1],
             (long long)idx[2], (long long)idx[3]);
    /* drop_last on one rank: 10 scenes, B 4 -> 2 full batches + 2 dropped */
    nb = qc_loader_plan_epoch(N, NULL, 7, 0, false, 4, 1, 0, 1, false, true, ptr, idx);
    T_EXPECT_EQ_I64(nb, 2, "drop_last batches");
    T_EXPECT_EQ_I64(ptr[nb], 8, "drop_last scenes");
    T_EXPECT_EQ_I64(qc_loader_plan_groups(N, 4, true), 2, "drop_last groups");
    nb = qc_loader_plan_epoch(N, NULL, 7, 0, false, 4, 1, 0, 1, false, false, ptr, idx);
    T_EXPECT(nb == 3 && ptr[3] - ptr[2] == 2, "last short batch kept");
    /* same seed and epoch: same plan; another epoch: another order */
    int64_t a[N + 4], b[N + 4], c[N + 4];
    qc_loader_plan_epoch(N, NULL, 7, 3, true, 1, 1, 0, 1, false, false, ptr, a);
    qc_loader_plan_epoch(N, NULL, 7, 3, true, 1, 1, 0, 1, false, false, ptr, b);
    qc_loader_plan_epoch(N, NULL, 7, 4, true, 1, 1, 0, 1, false, false, ptr, c);
    T_EXPECT(memcmp(a, b, N * sizeof(int64_t)) == 0, "plan is deterministic");
    T_EXPECT(memcmp(a, c, N * sizeof(int64_t)) != 0, "epochs shuffle differently");
}

/* The groups of an epoch depend on ranks x groups per rank only: W ranks x G groups give the
 * groups of 1 rank x W*G groups, group j of a step on rank j mod W (plain and cost mode). */
static void test_plan_world_independent(void)
{
    enum { N = 37, B = 3, MAXW = 4 };
    int64_t cost[N];
    for (int i = 0; i < N; i++)
        cost[i] = 100 + (i * 7919) % 513;
    for (int bal = 0; bal < 2; bal++) {
        for (int64_t W = 2; W <= MAXW; W++) {
            for (int64_t G = 1; G <= 2; G++) {
                const int64_t P = W * G;
                int64_t rptr[N + 2], ridx[N + 2];
                const int64_t rnb =
                    qc_loader_plan_epoch(N, cost, 5, 1, true, B, P, 0, 1, bal, false, rptr, ridx);
                T_EXPECT_EQ_I64(rnb, qc_loader_plan_groups(N, B, false), "one rank: every group");
                for (int64_t r = 0; r < W; r++) {
                    int64_t ptr[N + 2], idx[N + 2];
                    const int64_t nb =
                        qc_loader_plan_epoch(N, cost, 5, 1, true, B, G, r, W, bal, false, ptr, idx);
                    /* rank r's batch k is global group step*P + r + g*W, k = step*G + g */
                    int64_t k = 0;
                    for (int64_t j = 0; j < rnb; j++) {
                        if ((j % P) % W != r)
                            continue;
                        T_EXPECT(k < nb, "W %lld G %lld rank %lld: batch %lld missing",
                                 (long long)W, (long long)G, (long long)r, (long long)k);
                        if (k >= nb)
                            break;
                        const int64_t n1 = rptr[j + 1] - rptr[j], n2 = ptr[k + 1] - ptr[k];
                        T_EXPECT(n1 == n2 && memcmp(ridx + rptr[j], idx + ptr[k],
                                                    (size_t)n1 * sizeof(int64_t)) == 0,
                                 "balance %d W %lld G %lld rank %lld batch %lld == group %lld", bal,
                                 (long long)W, (long long)G, (long long)r, (long long)k,
                                 (long long)j);
                        k++;
                    }
                    T_EXPECT_EQ_I64(nb, k, "rank %lld batches", (long long)r);
                }
            }
        }
    }
}

static void test_plan_cost(void)
{
    enum { N = 400, W = 4, B = 4 };
    int64_t cost[N];
    uint64_t st = qc_test_seed();
    for (int i = 0; i < N; i++) /* heavy tail: a few scenes 3–5x the rest */
        cost[i] =
            1000 + (int64_t)(qc_test_rand(&st) % 1000) + (qc_test_rand(&st) % 20 == 0 ? 4000 : 0);
    int64_t ptr[W][N], idx[W][N], nb[W];
    for (int64_t r = 0; r < W; r++)
        nb[r] = qc_loader_plan_epoch(N, cost, 11, 0, true, B, 1, r, W, true, false, ptr[r], idx[r]);
    double worst_bal = 0, worst_plain = 0;
    int64_t pptr[W][N], pidx[W][N];
    for (int64_t r = 0; r < W; r++)
        qc_loader_plan_epoch(N, cost, 11, 0, true, B, 1, r, W, false, false, pptr[r], pidx[r]);
    int seen[N] = {0};
    for (int64_t s = 0; s < nb[0]; s++) {
        int64_t lo = INT64_MAX, hi = 0, plo = INT64_MAX, phi = 0;
        for (int64_t r = 0; r < W; r++) {
            T_EXPECT_EQ_I64(nb[r], nb[0], "every rank has the same number of steps");
            T_EXPECT_EQ_I64(ptr[r][s + 1] - ptr[r][s], B, "full batches");
            int64_t sum = 0, psum = 0;
            for (int64_t i = ptr[r][s]; i < ptr[r][s + 1]; i++) {
                sum += cost[idx[r][i]];
                seen[idx[r][i]]++;
            }
            for (int64_t i = pptr[r][s]; i < pptr[r][s + 1]; i++)
                psum += cost[pidx[r][i]];
            lo = sum < lo ? sum : lo;
            hi = sum > hi ? sum : hi;
            plo = psum < plo ? psum : plo;
            phi = psum > phi ? psum : phi;
        }
        worst_bal = (double)hi / (double)lo > worst_bal ? (double)hi / (double)lo : worst_bal;
        worst_plain =
            (double)phi / (double)plo > worst_plain ? (double)phi / (double)plo : worst_plain;
    }
    for (int i = 0; i < N; i++)
        T_EXPECT_EQ_I64(seen[i], 1, "scene %d assigned once", i);
    printf("  worst per-step max/min rank cost: balanced %.3f, plain %.3f\n", worst_bal,
           worst_plain);
    T_EXPECT(worst_bal < worst_plain, "balanced %.3f vs plain %.3f", worst_bal, worst_plain);
    T_EXPECT(worst_bal < 1.6, "balanced worst step ratio %.3f", worst_bal);
}

// ---- loaders -------------------------------------------------------------------------------

/* A digest of everything in a batch that the model reads. */
static uint64_t batch_digest(const struct qc_batch *b)
{
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, b->scene_index, (size_t)b->num_scenes * sizeof(int64_t));
    XXH3_64bits_update(s, b->position, (size_t)b->num_agents * 110 * 3 * sizeof(float));
    XXH3_64bits_update(s, b->valid_mask, (size_t)b->num_agents * 110);
    if (b->target)
        XXH3_64bits_update(s, b->target, (size_t)b->num_agents * 60 * 4 * sizeof(float));
    XXH3_64bits_update(s, b->pt2pl, (size_t)b->num_points * 2 * sizeof(int64_t));
    if (b->has_graph)
        for (int k = 0; k < QC_EDGE_SET_COUNT; k++) {
            const struct qc_edges *e = &b->graph.e[k];
            size_t E = (size_t)e->num_edges;
            XXH3_64bits_update(s, &e->num_edges, sizeof(e->num_edges));
            if (E) {
                XXH3_64bits_update(s, e->src, E * sizeof(int64_t));
                XXH3_64bits_update(s, e->dst, E * sizeof(int64_t));
                if (e->attr)
                    XXH3_64bits_update(s, e->attr, E * (size_t)e->num_feat * sizeof(float));
                if (e->perm)
                    XXH3_64bits_update(s, e->perm, E * sizeof(int64_t));
            }
        }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* Runs one epoch and writes the digest of each batch (up to cap). Returns the batch count. */
static int64_t run_epoch(struct qc_loader *l, int64_t epoch, uint64_t *dig, int64_t cap)
{
    T_EXPECT(qc_loader_start_epoch(l, epoch) == QC_OK, "%s", qc_error_last());
    const int64_t *ptr, *idx;
    qc_loader_plan(l, &ptr, &idx);
    int64_t n = 0;
    for (;;) {
        struct qc_batch *b = NULL;
        enum qc_status rc = qc_loader_next(l, &b);
        T_EXPECT(rc == QC_OK, "next: %s", qc_error_last());
        if (rc != QC_OK || !b)
            break;
        T_EXPECT_EQ_I64(b->num_scenes, ptr[n + 1] - ptr[n], "batch %lld size", (long long)n);
        for (int64_t i = 0; i < b->num_scenes; i++)
            T_EXPECT_EQ_I64(b->scene_index[i], idx[ptr[n] + i], "batch %lld scene %lld",
                            (long long)n, (long long)i);
        T_EXPECT(b->has_graph && b->graph.e[QC_EDGE_A2A].num_edges > 0, "graph built");
        if (n < cap)
            dig[n] = batch_digest(b);
        qc_loader_release(l, b);
        n++;
    }
    return n;
}

struct count_alloc {
    size_t live;
    int64_t n;
};

static void *count_alloc_fn(void *ctx, size_t bytes)
{
    struct count_alloc *c = ctx;
    __atomic_add_fetch(&c->live, bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->n, 1, __ATOMIC_RELAXED);
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void count_free_fn(void *ctx, void *p, size_t bytes)
{
    struct count_alloc *c = ctx;
    __atomic_sub_fetch(&c->live, bytes, __ATOMIC_RELAXED);
    free(p);
}

enum { NSCENES = 10, NB_MAX = 16 };

static void test_synthetic_determinism(uint64_t ref[NB_MAX], int64_t *nref)
{
    struct count_alloc ca = {0, 0};
    uint64_t d1[NB_MAX], d3[NB_MAX];
    int64_t n1 = 0, n3 = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct qc_loader_opts o;
        qc_loader_opts_default(&o);
        o.batch_size = 3;
        o.threads = pass == 0 ? 1 : 3;
        o.prefetch_batches = pass == 0 ? 1 : 4;
        o.synthetic_scenes = NSCENES;
        o.synthetic_seed = 99;
        o.seed = 5;
        o.alloc.alloc = count_alloc_fn;
        o.alloc.free = count_free_fn;
        o.alloc.ctx = &ca;
        struct qc_loader *l = NULL;
        enum qc_status rc = qc_loader_create(NULL, 0, &o, &l);
        T_EXPECT(rc == QC_OK, "create: %s", qc_error_last());
        if (rc != QC_OK)
            return;
        T_EXPECT_EQ_I64(qc_loader_num_scenes(l), NSCENES, "scenes");
        int64_t n = run_epoch(l, 1, pass == 0 ? d1 : d3, NB_MAX);
        T_EXPECT_EQ_I64(n, 4, "10 scenes in batches of 3");
        T_EXPECT_EQ_I64(qc_loader_num_batches(l), 4, "num_batches");
        if (pass == 0)
            n1 = n;
        else
            n3 = n;
        qc_loader_destroy(l);
    }
    T_EXPECT(n1 == n3 && memcmp(d1, d3, (size_t)n1 * sizeof(uint64_t)) == 0,
             "1 thread and 3 threads give the same batches");
    T_EXPECT(ca.n > 0 && ca.live == 0, "hook used (%lld allocations), all returned (%zu live)",
             (long long)ca.n, ca.live);
    memcpy(ref, d1, sizeof(d1));
    *nref = n1;
}

static void test_qcshard_source(const uint64_t ref[NB_MAX], int64_t nref)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/test_loader_%d.qcshard", QC_BINARY_DIR, (int)getpid());
    struct qc_scene sc[NSCENES];
    for (int i = 0; i < NSCENES; i++)
        T_EXPECT(qc_synth_scene(99, i, QC_SYNTH_TYPICAL, &sc[i]) == QC_OK, "%s", qc_error_last());
    enum qc_status rc = qc_qcshard_write_file(path, sc, NSCENES);
    T_EXPECT(rc == QC_OK, "write: %s", qc_error_last());
    for (int i = 0; i < NSCENES; i++)
        qc_scene_free(&sc[i]);
    /* the file split in two, to exercise several readers */
    struct qc_loader_opts o;
    qc_loader_opts_default(&o);
    o.batch_size = 3;
    o.threads = 2;
    o.seed = 5;
    struct qc_pinned *pin = NULL;
    T_EXPECT(qc_pinned_create(NULL, 0, &pin) == QC_OK, "pinned: %s", qc_error_last());
    qc_host_alloc_pinned(pin, &o.alloc);
    const char *paths[1] = {path};
    struct qc_loader *l = NULL;
    rc = qc_loader_create(paths, 1, &o, &l);
    T_EXPECT(rc == QC_OK, "create: %s", qc_error_last());
    if (rc == QC_OK) {
        uint64_t d[NB_MAX];
        int64_t n = run_epoch(l, 1, d, NB_MAX);
        T_EXPECT(n == nref && memcmp(d, ref, (size_t)n * sizeof(uint64_t)) == 0,
                 "qcshard file and on-the-fly synthetic scenes give the same batches");
        /* restart mid-epoch: take one batch, start again, the epoch is whole again */
        T_EXPECT(qc_loader_start_epoch(l, 1) == QC_OK, "%s", qc_error_last());
        struct qc_batch *b = NULL;
        T_EXPECT(qc_loader_next(l, &b) == QC_OK && b, "first batch");
        uint64_t first = b ? batch_digest(b) : 0;
        qc_loader_release(l, b);
        T_EXPECT(first == ref[0], "first batch again");
        n = run_epoch(l, 1, d, NB_MAX);
        T_EXPECT(n == nref && memcmp(d, ref, (size_t)n * sizeof(uint64_t)) == 0,
                 "restarted epoch is whole");
        qc_loader_destroy(l);
    }
    struct qc_pinned_stats ps;
    qc_pinned_stats_get(pin, &ps);
    T_EXPECT(ps.n_allocs > 0 && ps.n_live == 0, "pinned: %llu allocations, %llu live",
             (unsigned long long)ps.n_allocs, (unsigned long long)ps.n_live);
    qc_pinned_destroy(pin);

    /* rank split through the loader: two ranks cover every scene */
    int seen[NSCENES] = {0};
    for (int64_t r = 0; r < 2; r++) {
        qc_loader_opts_default(&o);
        o.batch_size = 2;
        o.threads = 1;
        o.rank = r;
        o.world_size = 2;
        o.balance_cost = true;
        o.build_graph = false;
        rc = qc_loader_create(paths, 1, &o, &l);
        T_EXPECT(rc == QC_OK, "create rank %lld: %s", (long long)r, qc_error_last());
        if (rc != QC_OK)
            continue;
        qc_loader_start_epoch(l, 0);
        struct qc_batch *bb = NULL;
        while (qc_loader_next(l, &bb) == QC_OK && bb) {
            T_EXPECT(!bb->has_graph, "build_graph off");
            for (int64_t i = 0; i < bb->num_scenes; i++)
                seen[bb->scene_index[i]]++;
            qc_loader_release(l, bb);
        }
        qc_loader_destroy(l);
    }
    for (int i = 0; i < NSCENES; i++)
        T_EXPECT_EQ_I64(seen[i], 1, "scene %d read by exactly one rank", i);
    unlink(path);
}

// ---- two ranks, two devices: where the worker threads pin ---------------------------------

enum { RANK_SCENES = 24 };

struct rank_run {
    int rank;              /* also its device ordinal: device.ordinal 0 + local rank */
    struct qc_emu *emu;    /* the rank's emulated device */
    struct qc_pinned *pin; /* its pinned arena (the trainer's loader memory) */
    uint64_t regs_created; /* registrations when the arena was created (on this thread) */
    int64_t batches;
    int seen[RANK_SCENES];
    enum qc_status st;
    char err[512];
};

/* A rank's main thread: selects its device (qc_device_create does on CUDA), creates its pinned
 * arena, and consumes one epoch of its part from a loader whose two workers allocate (and so
 * pin) the batches. */
static void *rank_main(void *user)
{
    struct rank_run *r = user;
    qc_emu_device_set(r->rank);
    r->st = qc_pinned_create_emu(r->emu, 0, &r->pin);
    struct qc_emu_host_stats hs;
    qc_emu_host_stats_get(r->emu, &hs);
    r->regs_created = hs.registers;
    struct qc_loader *l = NULL;
    if (r->st == QC_OK) {
        struct qc_loader_opts o;
        qc_loader_opts_default(&o);
        o.synthetic_scenes = RANK_SCENES;
        o.batch_size = 3;
        o.threads = 2;
        o.prefetch_batches = 2;
        o.rank = r->rank;
        o.world_size = 2;
        qc_host_alloc_pinned(r->pin, &o.alloc);
        r->st = qc_loader_create(NULL, 0, &o, &l);
    }
    if (r->st == QC_OK)
        r->st = qc_loader_start_epoch(l, 0);
    struct qc_batch *b = NULL;
    while (r->st == QC_OK && (r->st = qc_loader_next(l, &b)) == QC_OK && b) {
        r->batches++;
        for (int64_t i = 0; i < b->num_scenes; i++)
            r->seen[b->scene_index[i]]++;
        qc_loader_release(l, b);
    }
    if (r->st != QC_OK)
        snprintf(r->err, sizeof r->err, "%s", qc_error_last());
    qc_loader_destroy(l);
    return NULL;
}

static void test_ranks_pin_on_their_device(void)
{
    struct rank_run r[2];
    memset(r, 0, sizeof r);
    for (int k = 0; k < 2; k++) {
        r[k].rank = k;
        T_EXPECT(qc_emu_create((size_t)1 << 20, &r[k].emu) == QC_OK, "%s", qc_error_last());
        if (!r[k].emu)
            return;
        qc_emu_set_ordinal(r[k].emu, k);
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        T_EXPECT(pthread_create(&th[k], NULL, rank_main, &r[k]) == 0, "pthread_create");
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        T_EXPECT(r[k].st == QC_OK, "rank %d: %s", k, r[k].err);
        T_EXPECT(r[k].batches > 0, "rank %d read no batch", k);
        struct qc_emu_host_stats hs;
        qc_emu_host_stats_get(r[k].emu, &hs);
        struct qc_pinned_stats ps;
        qc_pinned_stats_get(r[k].pin, &ps);
        T_EXPECT_EQ_I64(ps.device, k, "rank %d: the arena's device", k);
        /* the consumer only takes and releases batches: every registration after the arena's
         * creation came from a loader worker */
        T_EXPECT(hs.registers > r[k].regs_created,
                 "rank %d: no extent pinned by a worker thread (%llu registrations, %llu at "
                 "creation)",
                 k, (unsigned long long)hs.registers, (unsigned long long)r[k].regs_created);
        T_EXPECT_EQ_U64(hs.registers, ps.n_extents, "rank %d: one registration per extent", k);
        T_EXPECT(hs.refused == 0,
                 "rank %d: %llu registration(s) from a thread on device %d, not the rank's", k,
                 (unsigned long long)hs.refused, hs.refused_device);
        qc_pinned_destroy(r[k].pin); /* from this thread (device 0): unregisters on device k */
        qc_emu_host_stats_get(r[k].emu, &hs);
        T_EXPECT(hs.n_registered == 0 && hs.refused == 0,
                 "rank %d after destroy: %llu range(s) still registered, %llu refused", k,
                 (unsigned long long)hs.n_registered, (unsigned long long)hs.refused);
        qc_emu_destroy(r[k].emu);
    }
    for (int i = 0; i < RANK_SCENES; i++)
        T_EXPECT_EQ_I64(r[0].seen[i] + r[1].seen[i], 1, "scene %d read by exactly one rank", i);
}

static void test_errors(void)
{
    struct qc_loader_opts o;
    qc_loader_opts_default(&o);
    const char *paths[1] = {"/nonexistent/x.qcshard"};
    struct qc_loader *l = NULL;
    enum qc_status rc = qc_loader_create(paths, 1, &o, &l);
    T_EXPECT(rc != QC_OK && l == NULL, "missing file fails");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "/nonexistent/x.qcshard");
    o.rank = 2;
    o.world_size = 2;
    rc = qc_loader_create(NULL, 0, &o, &l);
    T_EXPECT(rc == QC_ERR_INVALID, "rank out of range");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "rank");
}

int main(void)
{
    uint64_t ref[NB_MAX];
    int64_t nref = 0;
    QC_TEST ("loader: plain plan (shuffle, rank split without padding, drop_last)") {
        test_plan_plain();
    }
    QC_TEST ("loader: the groups of an epoch do not depend on how ranks x accumulation split") {
        test_plan_world_independent();
    }
    QC_TEST ("loader: cost-balanced plan evens out every step") {
        test_plan_cost();
    }
    QC_TEST ("loader: synthetic batches are independent of thread count; hook balanced") {
        test_synthetic_determinism(ref, &nref);
    }
    QC_TEST ("loader: qcshard source, pinned hook, epoch restart, rank split") {
        test_qcshard_source(ref, nref);
    }
    QC_TEST ("loader: two ranks on devices 0 and 1: the workers pin every batch on their rank's "
             "device") {
        test_ranks_pin_on_their_device();
    }
    QC_TEST ("loader: errors name the file and the option") {
        test_errors();
    }
    return qc_test_summary();
}
