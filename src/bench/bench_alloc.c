/*
 * bench_alloc.c — `qctrain bench alloc [--json] [--steps N] [--seed S] [--batch B]`.
 *
 * Two figures of the caching allocator on the host backend (docs/BENCHMARKS.md, "Allocator"):
 * - alloc_free_ns_median: one qc_alloc_malloc + qc_alloc_free served from the cache, with a
 *   populated cache (hundreds of free blocks in the pools), median over rounds;
 * - fragmentation = peak reserved / peak allocated over --steps training steps of QCNet-like
 *   allocation sequences, through our default configuration (expandable segments) and, on the
 *   very same sequence in the same run, through a PyTorch-like one (512 B rounding, 2 MiB small
 *   and 20 MiB large segments, no expandable segments): fragmentation_pytorch_like.
 *
 * The sequences: each step collates --batch scenes whose node and edge counts follow the
 * statistics of QCNET.md §8.1/§8.6 (a log-normal body around the typical scene plus ~4 % of
 * 3-5x scenes), then replays what autograd saves (§8.2-§8.4): per edge set, the Fourier
 * embedding's tensors, then each attention application's r̂, q_i, k̃, ṽ, per-head scalars and
 * the destination-node tensors, with the transients of the layer allocated and freed in between;
 * the backward pass frees them in reverse while allocating and freeing gradient buffers.
 * Parameters, gradients and Adam state live for the whole run. The host backend never touches
 * the memory, so a 20 GiB batch costs address space, not RAM. Invariants are checked every
 * 100 steps (the benchmark verifies what it measures; it never gates anything).
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qc_alloc.h"
#include "qc_json.h"
#include "qc_rand.h"

#define BENCH_MAX_LIVE 8192

// ---- random numbers --------------------------------------------------------------------------

static double rng_uniform(uint64_t *s)
{
    return (double)(qc_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(uint64_t *s)
{
    double u = rng_uniform(s), v = rng_uniform(s);
    if (u < 1e-300)
        u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// ---- scene statistics (QCNET.md §8.1, §8.6) --------------------------------------------------

struct batch_counts {
    double A, P, V, Ap; /* agents, polygons, valid steps, predicted */
    double pt2pl, pl2pl, t, pl2a, a2a, t2m, pl2m, a2m, m2m; /* edges (decoder: mode-edges) */
};

static void scene_sample(uint64_t *rng, struct batch_counts *b)
{
    double A = 60.0 * exp(0.35 * rng_normal(rng));
    double P = 180.0 * exp(0.35 * rng_normal(rng));
    double dens_pl = 35.0 * exp(0.2 * rng_normal(rng)); /* n̄50^pl */
    double dens_a = 15.0 * exp(0.25 * rng_normal(rng)); /* n̄50^a */
    double scale = 1.0;
    if (rng_uniform(rng) < 0.04) /* the heavy tail: a few percent of 3-5x scenes */
        scale = 3.0 + 2.0 * rng_uniform(rng);
    A = A < 8 ? 8 : A;
    P = P < 20 ? 20 : P;
    double V = 0.6 * 50.0 * A, Ap = 0.6 * A;
    b->A += scale * A;
    b->P += scale * P;
    b->V += scale * V;
    b->Ap += scale * Ap;
    b->pt2pl += scale * 18.0 * P;
    b->pl2pl += scale * 130.0 * P;
    b->t += scale * 8.5 * V;
    b->pl2a += scale * V * dens_pl;
    b->a2a += scale * V * dens_a;
    b->t2m += scale * 6.0 * Ap * 23.0;
    b->pl2m += scale * 6.0 * Ap * 120.0 * dens_pl / 35.0;
    b->a2m += scale * 6.0 * Ap * 30.0 * dens_a / 15.0;
    b->m2m += scale * 36.0 * Ap;
}

// ---- the replay: one op stream applied to several allocators ---------------------------------

#define NALLOC 2

struct replay {
    struct qc_alloc *a[NALLOC];
    void *ptr[NALLOC][BENCH_MAX_LIVE];
    int free_ids[BENCH_MAX_LIVE]; /* stack of unused slot ids */
    int nfree_ids;
    int tape[BENCH_MAX_LIVE]; /* saved tensors in forward order */
    int ntape;
    uint64_t nops;
    enum qc_status err;
};

static int r_alloc(struct replay *r, double bytes, const char *tag)
{
    if (r->err != QC_OK)
        return -1;
    if (r->nfree_ids == 0) {
        r->err =
            qc_errorf(QC_ERR_INVALID, "bench alloc: more than %d live tensors", BENCH_MAX_LIVE);
        return -1;
    }
    size_t n = bytes < 1 ? 1 : (size_t)bytes;
    int id = r->free_ids[--r->nfree_ids];
    for (int k = 0; k < NALLOC; k++) {
        enum qc_status st = qc_alloc_malloc(r->a[k], n, NULL, tag, &r->ptr[k][id]);
        if (st != QC_OK) {
            r->err = st;
            return -1;
        }
    }
    r->nops++;
    return id;
}

static void r_free(struct replay *r, int id)
{
    if (id < 0)
        return;
    for (int k = 0; k < NALLOC; k++)
        qc_alloc_free(r->a[k], r->ptr[k][id], NULL);
    r->free_ids[r->nfree_ids++] = id;
    r->nops++;
}

static void r_save(struct replay *r, double bytes, const char *tag)
{
    int id = r_alloc(r, bytes, tag);
    if (id >= 0)
        r->tape[r->ntape++] = id;
}

/* FourierEmbedding FE(d) over `rows` rows (§8.3): saved c, θ, φ, per-dim LN input and ReLU
 * output, to_out; a transient sum of the dims; the output r is saved by its consumer. */
static void fe_forward(struct replay *r, double rows, int d, const char *tag)
{
    r_save(r, rows * 4.0 * d, tag);
    r_save(r, rows * 256.0 * d, tag);
    r_save(r, rows * 516.0 * d, tag);
    for (int i = 0; i < d; i++) {
        r_save(r, rows * 520.0, tag);
        r_save(r, rows * 512.0, tag);
    }
    int sum = r_alloc(r, rows * 512.0, tag);
    r_save(r, rows * 520.0, tag);
    r_save(r, rows * 512.0, tag);
    r_free(r, sum);
}

/* One attention application over E edges into Nd destination nodes (§8.2). */
static void attn_forward(struct replay *r, double E, double Nd, bool pos, const char *tag)
{
    if (pos) {
        r_save(r, E * 8.0, tag);   /* LN_r statistics */
        r_save(r, E * 512.0, tag); /* r̂ */
    }
    r_save(r, E * 512.0, tag);           /* q_i */
    int kr = r_alloc(r, E * 512.0, tag); /* to_k_r(r̂) */
    int ks = r_alloc(r, E * 512.0, tag); /* k[src] */
    r_save(r, E * 512.0, tag);           /* k̃ */
    r_free(r, kr);
    r_free(r, ks);
    int qk = r_alloc(r, E * 512.0, tag); /* q_i·k̃ */
    r_save(r, E * 32.0, tag);            /* exp */
    r_free(r, qk);
    r_save(r, E * 32.0, tag);            /* Σexp gathered */
    r_save(r, E * 8.0, tag);             /* dropout mask */
    r_save(r, E * 32.0, tag);            /* α' */
    int vr = r_alloc(r, E * 512.0, tag); /* to_v_r(r̂) */
    int vs = r_alloc(r, E * 512.0, tag); /* v[src] */
    r_save(r, E * 512.0, tag);           /* ṽ */
    r_free(r, vr);
    r_free(r, vs);
    int msg = r_alloc(r, E * 512.0, tag); /* message ṽ·α' */
    r_save(r, Nd * 512.0, tag);           /* aggregated */
    r_free(r, msg);
    /* destination-node tensors: 10,272 bytes per node */
    for (int i = 0; i < 10; i++)
        r_save(r, Nd * 512.0, tag);
    r_save(r, Nd * 2048.0, tag); /* ReLU output */
    r_save(r, Nd * 512.0, tag);  /* dropout mask */
    r_save(r, Nd * 2048.0, tag); /* dropout output */
    r_save(r, Nd * 32.0, tag);   /* LN statistics */
}

/* Backward: frees the tape in reverse; every ~6 tensors the gradient of a layer's biggest
 * saved tensor is computed in a transient buffer of the same size. */
static void backward(struct replay *r)
{
    int since = 0;
    while (r->ntape > 0 && r->err == QC_OK) {
        int id = r->tape[--r->ntape];
        if (++since == 6) {
            size_t n = qc_alloc_usable_size(r->a[0], r->ptr[0][id]);
            int g1 = r_alloc(r, (double)n, "backward/grad");
            int g2 = r_alloc(r, (double)n, "backward/grad");
            r_free(r, g1);
            r_free(r, g2);
            since = 0;
        }
        r_free(r, id);
    }
}

static void forward(struct replay *r, const struct batch_counts *b)
{
    double A = b->A, P = b->P;
    /* map encoder */
    fe_forward(r, b->pt2pl, 1, "map_encoder.pt2pl/r_emb"); /* points */
    fe_forward(r, b->pl2pl, 3, "map_encoder.r_pl2pl_emb");
    r_save(r, b->pl2pl * 512.0, "map_encoder.r_pl2pl");
    attn_forward(r, b->pt2pl, P, true, "map_encoder.pt2pl");
    attn_forward(r, b->pl2pl, P, true, "map_encoder.pl2pl");
    /* agent encoder */
    fe_forward(r, b->t, 4, "agent_encoder.r_t_emb");
    r_save(r, b->t * 512.0, "agent_encoder.r_t");
    fe_forward(r, b->pl2a, 3, "agent_encoder.r_pl2a_emb");
    r_save(r, b->pl2a * 512.0, "agent_encoder.r_pl2a");
    fe_forward(r, b->a2a, 3, "agent_encoder.r_a2a_emb");
    r_save(r, b->a2a * 512.0, "agent_encoder.r_a2a");
    fe_forward(r, 50.0 * A, 4, "agent_encoder.x_a_emb");
    for (int l = 0; l < 2; l++) {
        attn_forward(r, b->t, 50.0 * A, true, "agent_encoder.t_attn");
        attn_forward(r, b->pl2a, 50.0 * A, true, "agent_encoder.pl2a_attn");
        attn_forward(r, b->a2a, 50.0 * A, true, "agent_encoder.a2a_attn");
    }
    /* decoder: FE on base edges, r materialised per mode, 8 applications */
    fe_forward(r, b->t2m / 6.0, 4, "decoder.r_t2m_emb");
    r_save(r, b->t2m * 512.0, "decoder.r_t2m");
    fe_forward(r, b->pl2m / 6.0, 3, "decoder.r_pl2m_emb");
    r_save(r, b->pl2m * 512.0, "decoder.r_pl2m");
    fe_forward(r, b->a2m / 6.0, 3, "decoder.r_a2m_emb");
    r_save(r, b->a2m * 512.0, "decoder.r_a2m");
    for (int app = 0; app < 8; app++) {
        attn_forward(r, b->t2m, 6.0 * A, true, "decoder.t2m");
        attn_forward(r, b->pl2m, 6.0 * A, true, "decoder.pl2m");
        attn_forward(r, b->a2m, 6.0 * A, true, "decoder.a2m");
        if (app % 2 == 0)
            attn_forward(r, b->m2m, 6.0 * A, false, "decoder.m2m");
    }
    fe_forward(r, 360.0 * A, 2, "decoder.y_emb");
    r_save(r, 360.0 * A * 4096.0, "decoder.traj_emb.gru_reserve");
    r_save(r, 6.0 * A * 4.0 * 60.0 * 4.0, "decoder.loc");
    r_save(r, 6.0 * A * 4.0, "loss/pi");
}

// ---- measurements ----------------------------------------------------------------------------

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Median ns of one malloc+free pair served from the cache; populated: with ~1,000 free holes of
 * mixed sizes in the pools (a mid-step cache), else with only the reused block cached. */
static enum qc_status measure_latency(uint64_t seed, bool populated, double *median_ns,
                                      double *p90_ns)
{
    struct qc_alloc *a = NULL;
    QC_TRY(qc_alloc_create(NULL, NULL, &a));
    uint64_t rng = seed;
    enum { NKEEP = 2000, ROUNDS = 31, ITERS = 20000 };
    void **keep = calloc(NKEEP, sizeof *keep);
    enum qc_status st = keep ? QC_OK : qc_errorf(QC_ERR_NOMEM, "bench alloc: out of memory");
    /* Populate both pools: alternate live and freed blocks of mixed sizes. */
    for (int i = 0; populated && st == QC_OK && i < NKEEP; i++) {
        size_t n = (size_t)(qc_splitmix64(&rng) % 4 == 0 ? 1 + qc_splitmix64(&rng) % (8u << 20)
                                                         : 1 + qc_splitmix64(&rng) % (256u << 10));
        st = qc_alloc_malloc(a, n, NULL, "bench/populate", &keep[i]);
    }
    for (int i = 0; populated && st == QC_OK && i < NKEEP; i += 2) {
        qc_alloc_free(a, keep[i], NULL);
        keep[i] = NULL;
    }
    static const size_t sizes[4] = {4096, 65536, 300000, 3u << 20};
    double per[ROUNDS];
    for (int round = 0; st == QC_OK && round < ROUNDS; round++) {
        size_t n = sizes[round % 4];
        double t0 = now_s();
        for (int i = 0; i < ITERS; i++) {
            void *p = NULL;
            st = qc_alloc_malloc(a, n, NULL, "bench/hot", &p);
            if (st != QC_OK)
                break;
            qc_alloc_free(a, p, NULL);
        }
        per[round] = (now_s() - t0) * 1e9 / ITERS;
    }
    if (st == QC_OK) {
        qsort(per, ROUNDS, sizeof per[0], cmp_double);
        *median_ns = per[ROUNDS / 2];
        *p90_ns = per[(ROUNDS * 9) / 10];
        st = qc_alloc_check(a);
    }
    for (int i = 0; keep && i < NKEEP; i++)
        qc_alloc_free(a, keep[i], NULL);
    free(keep);
    qc_alloc_destroy(a);
    return st;
}

struct frag_result {
    struct qc_alloc_stats st[NALLOC];
    uint64_t ops;
    double peak_batch_gib; /* the largest step's saved bytes estimate (allocated peak) */
    double seconds;
};

static enum qc_status measure_fragmentation(int64_t steps, int64_t batch, uint64_t seed,
                                            struct frag_result *out)
{
    struct replay *r = calloc(1, sizeof *r);
    if (!r)
        return qc_errorf(QC_ERR_NOMEM, "bench alloc: out of memory");
    struct qc_alloc_params ours, torch;
    qc_alloc_params_default(&ours);
    qc_alloc_params_pytorch_like(&torch);
    /* A budget that never binds (peaks are tens of GiB) but sizes the host reservation of the
     * expandable segment (4 x budget), independent of this machine's RAM. */
    ours.budget = torch.budget = (size_t)512 << 30;
    enum qc_status st = qc_alloc_create(NULL, &ours, &r->a[0]);
    if (st == QC_OK)
        st = qc_alloc_create(NULL, &torch, &r->a[1]);
    for (int i = 0; i < BENCH_MAX_LIVE; i++)
        r->free_ids[i] = BENCH_MAX_LIVE - 1 - i;
    r->nfree_ids = BENCH_MAX_LIVE;
    r->err = st;
    uint64_t rng = seed;
    double t0 = now_s();
    /* Parameters, gradients, Adam m and v: 7.66M floats each, ~60 tensors, whole run. */
    int params[240];
    for (int i = 0; i < 240; i++)
        params[i] = r_alloc(r, 7.66e6 * 4.0 / 60.0 * (0.25 + 1.5 * rng_uniform(&rng)),
                            i < 60    ? "params"
                            : i < 120 ? "grads"
                                      : "adam");
    for (int64_t s = 0; s < steps && r->err == QC_OK; s++) {
        for (int k = 0; k < NALLOC; k++)
            qc_alloc_set_step(r->a[k], s);
        struct batch_counts b;
        memset(&b, 0, sizeof b);
        for (int64_t i = 0; i < batch; i++)
            scene_sample(&rng, &b);
        int batch_ids[4];
        batch_ids[0] = r_alloc(r, (b.A * 50 * 8 + b.P * 20) * 4.0, "batch/nodes");
        batch_ids[1] =
            r_alloc(r, (b.pl2a + b.a2a + b.t + b.pl2pl + b.pt2pl) * 16.0, "batch/edge_index");
        batch_ids[2] =
            r_alloc(r, (b.t2m + b.pl2m + b.a2m + b.m2m) * 16.0 / 6.0, "batch/mode_edge_index");
        batch_ids[3] =
            r_alloc(r, (b.pl2a + b.a2a + b.t + b.pl2pl + b.pt2pl) * 16.0, "batch/edge_features");
        forward(r, &b);
        backward(r);
        for (int i = 0; i < 4; i++)
            r_free(r, batch_ids[i]);
        if (s % 100 == 99)
            for (int k = 0; k < NALLOC && r->err == QC_OK; k++)
                r->err = qc_alloc_check(r->a[k]);
    }
    for (int i = 0; i < 240; i++)
        r_free(r, params[i]);
    st = r->err;
    out->seconds = now_s() - t0;
    out->ops = r->nops;
    for (int k = 0; k < NALLOC; k++) {
        if (st == QC_OK)
            st = qc_alloc_check(r->a[k]);
        if (r->a[k])
            qc_alloc_stats_get(r->a[k], &out->st[k]);
        qc_alloc_destroy(r->a[k]);
    }
    free(r);
    return st;
}

enum qc_status qc_bench_alloc(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    bool json = false;
    int64_t steps = 1000, seed = 2026, batch = 4;
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
        {"steps", QC_CLI_INT, &steps, "1000", "training steps replayed for fragmentation"},
        {"seed", QC_CLI_INT, &seed, "2026", "scene-size sampler seed"},
        {"batch", QC_CLI_INT, &batch, "4", "scenes per step"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench alloc", "[--json] [--steps N] [--seed S] [--batch B]",
                        "Caching allocator: cached malloc+free latency, and fragmentation over "
                        "QCNet-like steps vs a PyTorch-like configuration.",
                        opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, NULL, 0, NULL,
                        &help));
    if (help)
        return QC_OK;
    if (steps < 1)
        return qc_errorf(QC_ERR_INVALID, "bench alloc: --steps %" PRId64 ": expected >= 1", steps);
    if (batch < 1 || batch > 64)
        return qc_errorf(QC_ERR_INVALID, "bench alloc: --batch %" PRId64 ": expected 1..64", batch);
    double med = 0, p90 = 0, med1 = 0, p901 = 0;
    QC_TRY(measure_latency((uint64_t)seed, true, &med, &p90));
    QC_TRY(measure_latency((uint64_t)seed, false, &med1, &p901));
    struct frag_result fr;
    memset(&fr, 0, sizeof fr);
    QC_TRY(measure_fragmentation(steps, batch, (uint64_t)seed, &fr));
    const struct qc_alloc_stats *o = &fr.st[0], *t = &fr.st[1];
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (json) {
        printf("{\"bench\": \"alloc\", \"backend\": \"host\", \"steps\": %" PRId64
               ", \"batch\": %" PRId64 ", \"seed\": %" PRId64 ", "
               "\"alloc_free_ns_median\": %s, \"alloc_free_ns_p90\": %s, "
               "\"alloc_free_ns_median_single_block\": %s, "
               "\"fragmentation\": %s, \"fragmentation_pytorch_like\": %s, "
               "\"peak_allocated_bytes\": %zu, \"peak_reserved_bytes\": %zu, "
               "\"peak_reserved_bytes_pytorch_like\": %zu, \"maps\": %" PRIu64
               ", \"maps_pytorch_like\": %" PRIu64 ", \"ops\": %" PRIu64
               ", \"replay_seconds\": %s, \"check\": \"ok\"}\n",
               steps, batch, seed, QC_JSON_NUM("%.1f", med), QC_JSON_NUM("%.1f", p90),
               QC_JSON_NUM("%.1f", med1), QC_JSON_NUM("%.4f", o->fragmentation),
               QC_JSON_NUM("%.4f", t->fragmentation), o->bytes_allocated_peak,
               o->bytes_reserved_peak, t->bytes_reserved_peak, o->n_maps, t->n_maps, fr.ops,
               QC_JSON_NUM("%.2f", fr.seconds));
    } else {
        printf("allocator benchmark (host backend, %" PRId64 " steps of %" PRId64
               " scenes, seed %" PRId64 ")\n",
               steps, batch, seed);
        printf("  cached malloc+free        %8.1f ns median, %.1f ns p90 (1,000 free holes)\n", med,
               p90);
        printf("  cached malloc+free        %8.1f ns median (only the reused block cached)\n",
               med1);
        printf("  peak allocated            %8.2f GiB\n", (double)o->bytes_allocated_peak / gib);
        printf("  ours (expandable)         %8.2f GiB peak reserved, fragmentation %.4f, %" PRIu64
               " maps\n",
               (double)o->bytes_reserved_peak / gib, o->fragmentation, o->n_maps);
        printf("  pytorch-like              %8.2f GiB peak reserved, fragmentation %.4f, %" PRIu64
               " maps\n",
               (double)t->bytes_reserved_peak / gib, t->fragmentation, t->n_maps);
        printf("  %" PRIu64 " replayed operations in %.2f s; invariants checked every 100 steps\n",
               fr.ops, fr.seconds);
    }
    return QC_OK;
}
