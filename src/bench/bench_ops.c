/*
 * bench_ops.c — `qctrain bench ops [--json]`: QCNet's blocks forward + backward at the size of a
 * typical AV2 scene (QCNET.md §8.6: A 60 agents → 3,000 agent-steps of which 1,800 valid,
 * P 180 polygons, E_pl2a 63k, E_a2a 27k, E_t 15.3k, A_p 36 predicted agents, E_pl2m 25.9k mode
 * edges), fused vs unfused attention side by side, on the backend of --device:
 *   cpu   (default) the blocks on malloc'ed memory, ops inline: the figures of the CPU backend;
 *   cuda  the run's backend (qc_train_backend_create: the device, its caching allocator, the
 *         ops' context): every tensor is device memory from the allocator (inputs built on the
 *         host and uploaded), the graphs carry host mirrors of their index arrays, stashes are
 *         bound to allocator memory; times are wall clock between stream synchronizations;
 *   emu   the same code path on the emulated device (CPU ops on protected memory): a check
 *         that the device path of the bench never touches device memory from the host. Its
 *         times measure mprotect more than the ops.
 *
 * Each attention figure covers the whole edge set pipeline of one layer application:
 * positional FE(d) of the raw edge features, the source/edge context, the application, and the
 * backward of all three (the unfused path materialises r, r̂, k̃, ṽ, q_i and α; the fused path
 * recomputes them per tile). Stash bytes are everything the blocks keep from forward to
 * backward (qc_stash tables); the caller-owned inputs (x, edge features, indices) are the same
 * for both paths and not counted. On a device the allocator's peak during the pipeline (inputs,
 * parameters and gradients of the set included) is reported too. Times are medians over
 * --repeats runs after one warm-up. A benchmark, never a test: it prints figures and gates
 * nothing.
 */
#include "qc_cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <omp.h>

#include "qc_alloc.h"
#include "qc_attention.h"
#include "qc_config.h"
#include "qc_device.h"
#include "qc_exec.h"
#include "qc_memctx.h"
#include "qc_fourier.h"
#include "qc_mlp.h"
#include "qc_stash.h"
#include "qc_train.h" /* qc_train_backend_*: the backend of --device */

static const char bench_usage[] = "[--json] [--repeats N] [--tile-edges N] [--only NAMES]";
static const char bench_summary[] =
    "QCNet blocks forward+backward at AV2 size; fused vs unfused attention (stash bytes, ms), "
    "on the backend of --device (cpu, cuda; emu checks the device path).";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static uint64_t bo_rng = 0x0b5e55edull;

static double bo_uniform(void)
{
    uint64_t z = (bo_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- the backend: where the blocks' tensors live and their ops run ----------------------------

struct bo_buf {
    void *p;
    size_t bytes;
};

/* cpu: ex NULL, host malloc, no allocator (the bench as it always ran). cuda / emu: the
 * backend's exec and memory context; every tensor is allocator memory, released per edge set. */
struct bo_env {
    struct qc_train_backend *be; /* NULL on cpu */
    const struct qc_exec *ex;    /* NULL = CPU */
    struct qc_memctx *mc;        /* where tensors, scratch and (device) stashes come from (NULL =
                                    host malloc) */
    struct qc_alloc *alloc;      /* device: the allocator (peaks); NULL on cpu */
    struct bo_buf *bufs;         /* live tensors of bo_dev, freed by bo_env_release */
    int nbufs, cap;
    bool nomem; /* an allocation failed since the last bo_env_check */
};

/* bytes of zeroed backend memory, tracked for bo_env_release; NULL (and env->nomem) when the
 * allocation fails. */
static void *bo_dev(struct bo_env *env, size_t bytes, const char *tag)
{
    const size_t n = bytes ? bytes : 1;
    if (env->nbufs == env->cap) {
        int cap = env->cap ? 2 * env->cap : 64;
        struct bo_buf *b = realloc(env->bufs, (size_t)cap * sizeof *b);
        if (!b) {
            env->nomem = true;
            return NULL;
        }
        env->bufs = b;
        env->cap = cap;
    }
    void *p = qc_memctx_alloc(env->mc, QC_MEM_MODEL, n, tag);
    if (!p) {
        env->nomem = true;
        return NULL;
    }
    env->bufs[env->nbufs++] = (struct bo_buf){p, n};
    qc_op_zero(env->ex, p, n);
    return p;
}

/* A backend copy of host[0 .. bytes). */
static void *bo_dev_copy(struct bo_env *env, const void *host, size_t bytes, const char *tag)
{
    void *p = bo_dev(env, bytes, tag);
    if (p && bytes && qc_op_upload(env->ex, p, host, bytes) != QC_OK)
        env->nomem = true; /* reported by bo_env_check with the upload's error */
    return p;
}

static float *bo_falloc(struct bo_env *env, int64_t n, const char *tag)
{
    return bo_dev(env, (size_t)(n > 0 ? n : 1) * sizeof(float), tag);
}

/* QC_ERR_NOMEM when an allocation (or upload) of the setup failed. */
static enum qc_status bo_env_check(struct bo_env *env, const char *what)
{
    if (!env->nomem)
        return QC_OK;
    env->nomem = false;
    return qc_errorf(QC_ERR_NOMEM, "bench ops: setting up %s: %s", what,
                     env->ex ? "out of device memory (or an upload failed)" : "out of host memory");
}

/* Frees every tensor of bo_dev (stream-ordered on a device). */
static void bo_env_release(struct bo_env *env)
{
    for (int i = env->nbufs - 1; i >= 0; i--)
        qc_memctx_free(env->mc, QC_MEM_MODEL, env->bufs[i].p, env->bufs[i].bytes);
    env->nbufs = 0;
}

/* Waits for the backend (a no-op on cpu and emu): a timestamp after it covers the work. */
static enum qc_status bo_sync(const struct bo_env *env)
{
    return qc_op_sync(env->ex);
}

/* A block's mem: the env's memory context under `name`, on the env's backend. */
static void bo_mem(const struct bo_env *env, struct qc_block_mem *bm, const char *name)
{
    memset(bm, 0, sizeof *bm);
    qc_block_mem_set(bm, env->mc, name);
    bm->ex = env->ex;
}

/* Binds a planned stash: qc_stash_alloc on cpu (as always), allocator memory on a device. */
static enum qc_status bo_stash_alloc(struct bo_env *env, struct qc_stash *s)
{
    if (!env->ex)
        return qc_stash_alloc(s);
    const size_t n = qc_stash_arena_bytes(s) ? qc_stash_arena_bytes(s) : 1;
    void *p = qc_memctx_alloc(env->mc, QC_MEM_MODEL, n, s->block);
    if (!p)
        return qc_errorf(QC_ERR_NOMEM, "bench ops: stash %s (%zu bytes): out of device memory",
                         s->block, n);
    qc_stash_bind(s, p);
    return QC_OK;
}

/* Gives a bo_stash_alloc'ed arena back (before qc_stash_deinit, which forgets it). */
static void bo_stash_free(struct bo_env *env, struct qc_stash *s)
{
    if (!env->ex || !s->arena || s->owned)
        return;
    const size_t n = qc_stash_arena_bytes(s) ? qc_stash_arena_bytes(s) : 1;
    qc_memctx_free(env->mc, QC_MEM_MODEL, s->arena, n);
    qc_stash_release(s);
}

/* The allocator's allocated bytes now and its peak since the last bo_peak_reset (0 on cpu). */
static void bo_peak_reset(const struct bo_env *env)
{
    if (env->alloc)
        qc_alloc_reset_peak(env->alloc);
}

static size_t bo_peak(const struct bo_env *env)
{
    if (!env->alloc)
        return 0;
    struct qc_alloc_stats st;
    qc_alloc_stats_get(env->alloc, &st);
    return st.bytes_allocated_peak;
}

// ---- one attention edge set -------------------------------------------------------------------

struct bo_attn {
    const char *name;
    int64_t d;      /* FE(d) of the edge features, 0 = no positional input */
    bool bipartite; /* sources differ from destinations */
    bool cat;       /* categorical edge type (pl2pl) */
    int64_t Q;      /* queries per base destination */
    /* graph, host (built by bo_graph; the graph's host mirrors on a device) */
    int64_t n_src, n_dst, n_bdst, E;
    int64_t *row_ptr, *src, *qrow;
    struct qc_attn_graph g;
    /* blocks; every tensor below is backend memory from bo_dev */
    struct qc_attn l;
    struct qc_fourier fe;
    float *w, *dw, *few, *fedw, *feat, *cat_table, *dcat, *xs, *xd, *dout, *out, *dxs, *dxd;
    int64_t *cat_idx;
};

/* valid: rows b with (b % 5) < 3 get deg_lo..deg_hi edges, the rest none (the 60% valid
 * agent-steps); sources drawn in [0, n_src) and sorted per row (radius order). */
static void bo_graph(struct bo_attn *a, int64_t nb, int64_t n_src, int64_t deg_lo, int64_t deg_hi,
                     bool all_valid)
{
    a->n_bdst = nb;
    a->n_src = n_src;
    a->row_ptr = calloc((size_t)nb + 1, sizeof *a->row_ptr);
    for (int64_t b = 0; b < nb; b++) {
        int64_t deg = 0;
        if (all_valid || b % 5 < 3)
            deg = deg_lo + (int64_t)(bo_uniform() * (double)(deg_hi - deg_lo + 1));
        a->row_ptr[b + 1] = a->row_ptr[b] + deg;
    }
    a->E = a->row_ptr[nb];
    a->src = malloc((size_t)(a->E + 1) * sizeof *a->src);
    for (int64_t b = 0; b < nb; b++) {
        int64_t e0 = a->row_ptr[b], n = a->row_ptr[b + 1] - e0;
        for (int64_t e = 0; e < n; e++)
            a->src[e0 + e] = (int64_t)(bo_uniform() * (double)n_src);
        for (int64_t i = 1; i < n; i++) /* insertion sort: rows are short */
            for (int64_t j = i; j > 0 && a->src[e0 + j - 1] > a->src[e0 + j]; j--) {
                int64_t t = a->src[e0 + j];
                a->src[e0 + j] = a->src[e0 + j - 1];
                a->src[e0 + j - 1] = t;
            }
    }
}

static void bo_fill(float *x, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((double)lo + ((double)hi - (double)lo) * bo_uniform());
}

/* n floats filled on the host in [lo, hi), copied to the backend. */
static float *bo_fill_dev(struct bo_env *env, int64_t n, float lo, float hi, const char *tag)
{
    float *h = calloc((size_t)(n > 0 ? n : 1), sizeof *h);
    if (!h) {
        env->nomem = true;
        return NULL;
    }
    bo_fill(h, n, lo, hi);
    float *d = bo_dev_copy(env, h, (size_t)(n > 0 ? n : 0) * sizeof *h, tag);
    free(h);
    return d;
}

/* The parameters of a table, initialised on the host by QCNet's rules, copied to the backend. */
static float *bo_params_dev(struct bo_env *env, const struct qc_param_table *t, uint64_t seed,
                            const char *tag)
{
    float *h = calloc((size_t)(t->numel > 0 ? t->numel : 1), sizeof *h);
    if (!h) {
        env->nomem = true;
        return NULL;
    }
    qc_param_table_init_qcnet(t, h, seed);
    float *d = bo_dev_copy(env, h, (size_t)t->numel * sizeof *h, tag);
    free(h);
    return d;
}

/* tile_edges > 0 overrides the layer's tile (tile_edges on cpu / emu, tile_edges_cuda on
 * cuda); 0 keeps the layer's default. */
static enum qc_status bo_attn_setup(struct bo_env *env, struct bo_attn *a, int64_t D, int64_t H,
                                    int64_t F, int64_t tile_edges)
{
    a->n_dst = a->bipartite ? a->n_dst : a->n_bdst * a->Q;
    if (!a->bipartite)
        a->n_src = a->n_dst;
    a->g = (struct qc_attn_graph){a->n_src, a->n_dst, a->n_bdst, a->Q, a->E, a->row_ptr,
                                  a->src,   a->qrow,  NULL,      NULL, NULL};
    if (env->ex) { /* device copies of the index arrays; the host ones become the mirrors */
        a->g.row_ptr = bo_dev_copy(env, a->row_ptr, (size_t)(a->n_bdst + 1) * sizeof(int64_t),
                                   "bench/graph.row_ptr");
        a->g.src = bo_dev_copy(env, a->src, (size_t)a->E * sizeof(int64_t), "bench/graph.src");
        a->g.query_row =
            a->qrow ? bo_dev_copy(env, a->qrow, (size_t)(a->n_bdst * a->Q) * sizeof(int64_t),
                                  "bench/graph.query_row")
                    : NULL;
        a->g.row_ptr_host = a->row_ptr;
        a->g.src_host = a->src;
        a->g.query_row_host = a->qrow;
    }
    qc_attn_init(&a->l, D, H, a->bipartite, a->d > 0);
    if (tile_edges > 0) {
        a->l.tile_edges = tile_edges;
        a->l.tile_edges_cuda = tile_edges;
    }
    bo_mem(env, &a->l.mem, a->name);
    a->w = bo_params_dev(env, &a->l.params, 2023, "bench/attn.w");
    a->dw = bo_falloc(env, a->l.params.numel, "bench/attn.dw");
    qc_attn_bind(&a->l, a->w, a->dw);
    if (a->d > 0) {
        qc_fourier_init(&a->fe, a->d, F, D);
        bo_mem(env, &a->fe.mem, a->name);
        a->few = bo_params_dev(env, &a->fe.params, 2024, "bench/fe.w");
        a->fedw = bo_falloc(env, a->fe.params.numel, "bench/fe.dw");
        qc_fourier_bind(&a->fe, a->few, a->fedw);
        float *feat = calloc((size_t)(a->E * a->d + 1), sizeof *feat);
        if (!feat)
            return qc_errorf(QC_ERR_NOMEM, "bench ops: out of host memory");
        for (int64_t e = 0; e < a->E; e++) {
            feat[e * a->d] = (float)(50.0 * bo_uniform()); /* distance */
            for (int64_t i = 1; i < a->d; i++)
                feat[e * a->d + i] = (float)(6.28 * bo_uniform() - 3.14); /* angles */
        }
        a->feat = bo_dev_copy(env, feat, (size_t)(a->E * a->d) * sizeof *feat, "bench/feat");
        free(feat);
        if (a->cat) {
            a->cat_table = bo_fill_dev(env, 5 * D, -0.05f, 0.05f, "bench/cat_table");
            a->dcat = bo_falloc(env, 5 * D, "bench/dcat_table");
            int64_t *ci = malloc((size_t)(a->E + 1) * sizeof *ci);
            if (!ci)
                return qc_errorf(QC_ERR_NOMEM, "bench ops: out of host memory");
            for (int64_t e = 0; e < a->E; e++)
                ci[e] = (int64_t)(5.0 * bo_uniform());
            a->cat_idx = bo_dev_copy(env, ci, (size_t)a->E * sizeof *ci, "bench/cat_idx");
            free(ci);
        }
    }
    a->xd = bo_fill_dev(env, a->n_dst * D, -1.0f, 1.0f, "bench/x_dst");
    a->xs = a->bipartite ? bo_fill_dev(env, a->n_src * D, -1.0f, 1.0f, "bench/x_src") : a->xd;
    a->dout = bo_fill_dev(env, a->n_dst * D, -1.0f, 1.0f, "bench/dout");
    a->out = bo_falloc(env, a->n_dst * D, "bench/out");
    a->dxd = bo_falloc(env, a->n_dst * D, "bench/dx_dst");
    a->dxs = a->bipartite ? bo_falloc(env, a->n_src * D, "bench/dx_src") : a->dxd;
    return bo_env_check(env, a->name);
}

/* Frees the host graph; the backend tensors go with bo_env_release. */
static void bo_attn_free(struct bo_attn *a)
{
    free(a->row_ptr), free(a->src), free(a->qrow);
    a->row_ptr = a->src = a->qrow = NULL;
}

struct bo_attn_result {
    size_t stash_bytes, edge_stash_bytes, kv_stash_bytes, app_stash_bytes;
    size_t peak_device_bytes; /* allocator peak during the pipeline (device backends) */
    double fwd_ms, bwd_ms, total_ms;
};

/* One forward + backward of the whole edge-set pipeline; stash bytes from the tables. */
static enum qc_status bo_attn_once(struct bo_env *env, struct bo_attn *a, enum qc_attn_impl impl,
                                   struct bo_attn_result *r)
{
    struct qc_attn_edges ed;
    struct qc_attn_kv kv;
    struct qc_stash app;
    struct qc_attn_ctx ctx = {true, 0.1f, 2023, 1, 100, NULL, NULL};
    struct qc_block_mem emem;
    bo_mem(env, &emem, a->name);
    qc_stash_init(&app, "app");
    QC_TRY(bo_sync(env));
    bo_peak_reset(env);
    double t0 = now_ms();
    QC_TRY(qc_attn_edges_init_mem(&ed, env->ex ? &emem : NULL, impl, &a->g,
                                  a->d > 0 ? &a->fe : NULL, a->feat, a->cat_table, a->cat_idx,
                                  a->cat ? 5 : 0, a->dcat));
    enum qc_status st = bo_stash_alloc(env, &ed.fe_stash);
    if (st == QC_OK)
        st = bo_stash_alloc(env, &ed.stash);
    if (st == QC_OK)
        st = qc_attn_edges_forward(&ed);
    qc_attn_kv_init(&kv, &a->l, &ed);
    if (st == QC_OK)
        st = bo_stash_alloc(env, &kv.stash);
    if (st == QC_OK)
        st = qc_attn_kv_forward(&kv, a->xs);
    qc_attn_stash_plan(&kv, &app);
    if (st == QC_OK)
        st = bo_stash_alloc(env, &app);
    if (st == QC_OK)
        st = qc_attn_forward(&kv, a->out, &app, a->xd, &ctx);
    if (st == QC_OK)
        st = bo_sync(env);
    double t1 = now_ms();
    if (st == QC_OK)
        st = qc_attn_backward(&kv, a->dxd, a->dout, &app, a->xd, &ctx);
    if (st == QC_OK)
        st = qc_attn_kv_backward(&kv, a->dxs, a->xs, !a->bipartite);
    if (st == QC_OK)
        st = qc_attn_edges_backward(&ed);
    if (st == QC_OK)
        st = bo_sync(env);
    double t2 = now_ms();
    r->edge_stash_bytes = qc_stash_bytes(&ed.fe_stash) + qc_stash_bytes(&ed.stash);
    r->kv_stash_bytes = qc_stash_bytes(&kv.stash);
    r->app_stash_bytes = qc_stash_bytes(&app);
    r->stash_bytes = r->edge_stash_bytes + r->kv_stash_bytes + r->app_stash_bytes;
    r->peak_device_bytes = bo_peak(env);
    r->fwd_ms = t1 - t0;
    r->bwd_ms = t2 - t1;
    r->total_ms = t2 - t0;
    bo_stash_free(env, &app);
    bo_stash_free(env, &kv.stash);
    bo_stash_free(env, &ed.stash);
    bo_stash_free(env, &ed.fe_stash);
    qc_stash_deinit(&app);
    qc_attn_kv_deinit(&kv);
    qc_attn_edges_deinit(&ed);
    return st;
}

/* Warm-up, then repeats alternating unfused / fused (so drift hits both alike); medians. */
static enum qc_status bo_attn_bench(struct bo_env *env, struct bo_attn *a, int repeats,
                                    struct bo_attn_result res[2])
{
    double *t[2][3];
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 3; k++)
            t[f][k] = calloc((size_t)repeats, sizeof(double));
    struct bo_attn_result r;
    enum qc_status st = QC_OK;
    for (int f = 0; f < 2 && st == QC_OK; f++)
        st = bo_attn_once(env, a, f ? QC_ATTN_FUSED : QC_ATTN_UNFUSED, &res[f]);
    for (int i = 0; i < repeats && st == QC_OK; i++)
        for (int f = 0; f < 2 && st == QC_OK; f++) {
            st = bo_attn_once(env, a, f ? QC_ATTN_FUSED : QC_ATTN_UNFUSED, &r);
            t[f][0][i] = r.fwd_ms, t[f][1][i] = r.bwd_ms, t[f][2][i] = r.total_ms;
        }
    for (int f = 0; f < 2; f++) {
        if (st == QC_OK) {
            res[f].fwd_ms = median(t[f][0], repeats);
            res[f].bwd_ms = median(t[f][1], repeats);
            res[f].total_ms = median(t[f][2], repeats);
        }
        for (int k = 0; k < 3; k++)
            free(t[f][k]);
    }
    return st;
}

// ---- node blocks --------------------------------------------------------------------------

struct bo_node_result {
    size_t stash_bytes;
    double fwd_ms, bwd_ms;
};

static enum qc_status bo_fourier_bench(struct bo_env *env, int64_t N, int64_t d, bool with_cat,
                                       int64_t F, int64_t D, int repeats,
                                       struct bo_node_result *res)
{
    struct qc_fourier fe;
    qc_fourier_init(&fe, d, F, D);
    bo_mem(env, &fe.mem, "fourier");
    float *w = bo_params_dev(env, &fe.params, 7, "bench/fe.w");
    float *dw = bo_falloc(env, fe.params.numel, "bench/fe.dw");
    qc_fourier_bind(&fe, w, dw);
    float *c = bo_fill_dev(env, N * d, -5.0f, 5.0f, "bench/c");
    float *cat = with_cat ? bo_fill_dev(env, N * D, -0.05f, 0.05f, "bench/cat") : NULL;
    float *out = bo_falloc(env, N * D, "bench/out");
    float *dout = bo_fill_dev(env, N * D, -1.0f, 1.0f, "bench/dout");
    float *dcat = bo_falloc(env, N * D, "bench/dcat");
    enum qc_status st = bo_env_check(env, "fourier");
    double *tf = calloc((size_t)repeats + 1, sizeof *tf),
           *tb = calloc((size_t)repeats + 1, sizeof *tb);
    for (int i = 0; i <= repeats && st == QC_OK; i++) { /* i = 0 is the warm-up */
        struct qc_stash s;
        qc_stash_init(&s, "fe");
        qc_fourier_stash_plan(&fe, N, &s);
        st = bo_sync(env);
        double t0 = now_ms();
        if (st == QC_OK)
            st = bo_stash_alloc(env, &s);
        if (st == QC_OK)
            st = qc_fourier_forward(&fe, out, &s, c, cat, N);
        if (st == QC_OK)
            st = bo_sync(env);
        double t1 = now_ms();
        if (st == QC_OK)
            st = qc_fourier_backward(&fe, NULL, cat ? dcat : NULL, dout, &s, c, N);
        if (st == QC_OK)
            st = bo_sync(env);
        double t2 = now_ms();
        res->stash_bytes = qc_stash_bytes(&s);
        bo_stash_free(env, &s);
        qc_stash_deinit(&s);
        if (i > 0)
            tf[i - 1] = t1 - t0, tb[i - 1] = t2 - t1;
    }
    if (st == QC_OK) {
        res->fwd_ms = median(tf, repeats);
        res->bwd_ms = median(tb, repeats);
    }
    free(tf), free(tb);
    bo_env_release(env);
    return st;
}

static enum qc_status bo_mlp_bench(struct bo_env *env, int64_t N, int64_t O, int64_t D, int repeats,
                                   struct bo_node_result *res)
{
    struct qc_mlp m;
    qc_mlp_init(&m, D, O);
    bo_mem(env, &m.mem, "mlp");
    float *w = bo_params_dev(env, &m.params, 9, "bench/mlp.w");
    float *dw = bo_falloc(env, m.params.numel, "bench/mlp.dw");
    qc_mlp_bind(&m, w, dw);
    float *x = bo_fill_dev(env, N * D, -1.0f, 1.0f, "bench/x");
    float *dx = bo_falloc(env, N * D, "bench/dx"), *out = bo_falloc(env, N * O, "bench/out");
    float *dout = bo_fill_dev(env, N * O, -1.0f, 1.0f, "bench/dout");
    enum qc_status st = bo_env_check(env, "mlp");
    double *tf = calloc((size_t)repeats + 1, sizeof *tf),
           *tb = calloc((size_t)repeats + 1, sizeof *tb);
    for (int i = 0; i <= repeats && st == QC_OK; i++) {
        struct qc_stash s;
        qc_stash_init(&s, "mlp");
        qc_mlp_stash_plan(&m, N, &s);
        st = bo_sync(env);
        double t0 = now_ms();
        if (st == QC_OK)
            st = bo_stash_alloc(env, &s);
        if (st == QC_OK)
            st = qc_mlp_forward(&m, out, &s, x, N);
        if (st == QC_OK)
            st = bo_sync(env);
        double t1 = now_ms();
        if (st == QC_OK)
            st = qc_mlp_backward(&m, dx, dout, &s, x, N);
        if (st == QC_OK)
            st = bo_sync(env);
        double t2 = now_ms();
        res->stash_bytes = qc_stash_bytes(&s);
        bo_stash_free(env, &s);
        qc_stash_deinit(&s);
        if (i > 0)
            tf[i - 1] = t1 - t0, tb[i - 1] = t2 - t1;
    }
    if (st == QC_OK) {
        res->fwd_ms = median(tf, repeats);
        res->bwd_ms = median(tb, repeats);
    }
    free(tf), free(tb);
    bo_env_release(env);
    return st;
}

// ---- the command --------------------------------------------------------------------------

static bool bo_selected(const char *only, const char *name)
{
    if (!only || !only[0])
        return true;
    size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

static void bo_add_attn(cJSON *arr, const struct bo_env *env, const struct bo_attn *a,
                        const struct bo_attn_result r[2])
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", a->name);
    cJSON_AddNumberToObject(o, "edges", (double)(a->E * a->Q));
    cJSON_AddNumberToObject(o, "base_edges", (double)a->E);
    cJSON_AddNumberToObject(o, "src_rows", (double)a->n_src);
    cJSON_AddNumberToObject(o, "dst_rows", (double)a->n_dst);
    cJSON_AddNumberToObject(o, "fourier_d", (double)a->d);
    cJSON_AddNumberToObject(o, "unfused_stash_bytes", (double)r[0].stash_bytes);
    cJSON_AddNumberToObject(o, "fused_stash_bytes", (double)r[1].stash_bytes);
    cJSON_AddNumberToObject(o, "stash_ratio",
                            (double)r[0].stash_bytes /
                                (double)(r[1].stash_bytes ? r[1].stash_bytes : 1));
    cJSON_AddNumberToObject(o, "unfused_ms", r[0].total_ms);
    cJSON_AddNumberToObject(o, "fused_ms", r[1].total_ms);
    cJSON_AddNumberToObject(o, "time_ratio", r[1].total_ms / r[0].total_ms);
    cJSON_AddNumberToObject(o, "unfused_fwd_ms", r[0].fwd_ms);
    cJSON_AddNumberToObject(o, "unfused_bwd_ms", r[0].bwd_ms);
    cJSON_AddNumberToObject(o, "fused_fwd_ms", r[1].fwd_ms);
    cJSON_AddNumberToObject(o, "fused_bwd_ms", r[1].bwd_ms);
    cJSON_AddNumberToObject(o, "unfused_edge_stash_bytes", (double)r[0].edge_stash_bytes);
    cJSON_AddNumberToObject(o, "unfused_kv_stash_bytes", (double)r[0].kv_stash_bytes);
    cJSON_AddNumberToObject(o, "unfused_app_stash_bytes", (double)r[0].app_stash_bytes);
    cJSON_AddNumberToObject(o, "fused_kv_stash_bytes", (double)r[1].kv_stash_bytes);
    cJSON_AddNumberToObject(o, "fused_app_stash_bytes", (double)r[1].app_stash_bytes);
    if (env->alloc) {
        cJSON_AddNumberToObject(o, "unfused_peak_device_bytes", (double)r[0].peak_device_bytes);
        cJSON_AddNumberToObject(o, "fused_peak_device_bytes", (double)r[1].peak_device_bytes);
    }
    cJSON_AddNumberToObject(o, "tile_edges",
                            (double)(qc_exec_backend_of(env->ex) == QC_EXEC_CUDA
                                         ? a->l.tile_edges_cuda
                                         : a->l.tile_edges));
    cJSON_AddItemToArray(arr, o);
}

static void bo_add_node(cJSON *arr, const char *name, int64_t rows, const struct bo_node_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "rows", (double)rows);
    cJSON_AddNumberToObject(o, "stash_bytes", (double)r->stash_bytes);
    cJSON_AddNumberToObject(o, "fwd_ms", r->fwd_ms);
    cJSON_AddNumberToObject(o, "bwd_ms", r->bwd_ms);
    cJSON_AddItemToArray(arr, o);
}

/* The env of cfg->device_kind: nothing to set up on cpu; the run's backend otherwise. */
static enum qc_status bo_env_init(const struct qc_config *cfg, struct bo_env *env)
{
    memset(env, 0, sizeof *env);
    if (cfg->device_kind == QC_CONFIG_DEVICE_CPU)
        return QC_OK;
    QC_TRY(qc_train_backend_create(cfg, &env->be));
    env->ex = qc_train_backend_exec(env->be);
    env->alloc = qc_train_backend_alloc(env->be);
    env->mc = qc_train_backend_memctx(env->be);
    return QC_OK;
}

static void bo_env_deinit(struct bo_env *env)
{
    bo_env_release(env);
    free(env->bufs);
    qc_train_backend_destroy(env->be);
    memset(env, 0, sizeof *env);
}

enum qc_status qc_bench_ops(struct qc_cli *cli, int argc, char **argv)
{
    bool json = false;
    int64_t repeats = 5, tile_edges = 0;
    const char *only = "";
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "false", "print one JSON object"},
        {"repeats", QC_CLI_INT, &repeats, "5", "timed runs per block (median reported)"},
        {"tile-edges", QC_CLI_INT, &tile_edges, "0: the layer's, 512 (cuda 8192)",
         "fused attention: base edges per tile"},
        {"only", QC_CLI_STRING, &only, "",
         "comma list of blocks: pl2a,a2a,t,pl2m,m2m,fourier,mlp (default all)"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench ops", bench_usage, bench_summary, opts,
                        (int)(sizeof opts / sizeof opts[0]), argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    if (repeats < 1 || tile_edges < 0)
        return qc_errorf(QC_ERR_INVALID,
                         "bench ops: --repeats must be >= 1, --tile-edges >= 0 (0 = default)");
    const int64_t D = cli->cfg.hidden_dim, H = cli->cfg.num_heads, F = cli->cfg.num_freq_bands;
    const int64_t K = cli->cfg.num_modes, Tf = cli->cfg.num_future_steps;
    const int64_t A = 60, T = 50, P = 180, Ap = 36; /* the typical scene of QCNET.md §8.6 */
    const int rep = (int)repeats;
    struct bo_env env;
    QC_TRY(bo_env_init(&cli->cfg, &env));

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "ops");
    cJSON_AddStringToObject(root, "device", qc_train_device_str(cli->cfg.device_kind));
    struct qc_device *dev = env.be ? qc_train_backend_device(env.be) : NULL;
    struct qc_device_props props;
    if (dev && qc_device_kind_of(dev) == QC_DEVICE_CUDA &&
        qc_device_props_get(dev, &props) == QC_OK)
        cJSON_AddStringToObject(root, "gpu", props.name);
    cJSON_AddNumberToObject(root, "threads", (double)omp_get_max_threads());
    cJSON_AddNumberToObject(root, "repeats", (double)repeats);
    cJSON_AddNumberToObject(root, "hidden_dim", (double)D);
    cJSON_AddNumberToObject(root, "tile_edges",
                            (double)(tile_edges > 0 ? tile_edges
                                     : qc_exec_backend_of(env.ex) == QC_EXEC_CUDA
                                         ? QC_ATTN_CUDA_TILE_EDGES
                                         : 512));
    const char *wait = getenv("OMP_WAIT_POLICY");
    cJSON_AddStringToObject(root, "omp_wait_policy", wait ? wait : "");
    if (!wait && !env.ex)
        qc_log(QC_LOG_INFO, "bench ops: OMP_WAIT_POLICY is unset: OpenMP and a pthreads OpenBLAS "
                            "both spin-wait, which distorts times on a busy machine\n"
                            "hint: OMP_WAIT_POLICY=passive qctrain bench ops (docs/BENCHMARKS.md)");
    cJSON *blocks = cJSON_AddArrayToObject(root, "blocks");
    enum qc_status st = QC_OK;
    /* attention edge sets: name, FE(d), bipartite, categorical, Q, graph */
    struct bo_attn sets[5];
    memset(sets, 0, sizeof sets);
    int nset = 0;
    if (bo_selected(only, "pl2a")) { /* 1,800 valid agent-steps × 35 polygons ≈ 63k */
        struct bo_attn *a = &sets[nset++];
        a->name = "pl2a", a->d = 3, a->bipartite = true, a->Q = 1, a->n_dst = A * T;
        bo_graph(a, A * T, P, 25, 45, false); /* sources: P polygons (time broadcast) */
    }
    if (bo_selected(only, "a2a")) { /* 1,800 × 15 ≈ 27k */
        struct bo_attn *a = &sets[nset++];
        a->name = "a2a", a->d = 3, a->bipartite = false, a->Q = 1;
        bo_graph(a, A * T, A * T, 10, 20, false);
    }
    if (bo_selected(only, "t")) { /* 1,800 × 8.5 ≈ 15.3k */
        struct bo_attn *a = &sets[nset++];
        a->name = "t", a->d = 4, a->bipartite = false, a->Q = 1;
        bo_graph(a, A * T, A * T, 7, 10, false);
    }
    if (bo_selected(only, "pl2m")) { /* 36 predicted agents × 120 polygons × 6 modes ≈ 25.9k */
        struct bo_attn *a = &sets[nset++];
        a->name = "pl2m", a->d = 3, a->bipartite = true, a->Q = K, a->n_dst = K * A;
        bo_graph(a, Ap, P, 100, 140, true);
        a->qrow = malloc((size_t)(Ap * K) * sizeof *a->qrow); /* mode-major queries a + k·A */
        for (int64_t b = 0; b < Ap; b++)
            for (int64_t k = 0; k < K; k++)
                a->qrow[b * K + k] = b + k * A;
    }
    if (bo_selected(only, "m2m")) { /* 6A queries, 6 × 6 per predicted agent ≈ 1.3k */
        struct bo_attn *a = &sets[nset++];
        a->name = "m2m", a->d = 0, a->bipartite = false, a->Q = 1;
        bo_graph(a, K * A, K * A, 0, 0, false);
        free(a->src);
        a->src = malloc((size_t)(K * A * K + 1) * sizeof *a->src);
        for (int64_t q = 0, e = 0; q < K * A; q++) { /* agent-major: a·6 + k */
            bool pred = q / K < Ap;
            for (int64_t j = 0; pred && j < K; j++)
                a->src[e++] = (q / K) * K + j;
            a->row_ptr[q + 1] = a->row_ptr[q] + (pred ? K : 0);
        }
        a->E = a->row_ptr[K * A];
    }
    for (int i = 0; i < nset && st == QC_OK; i++) {
        struct bo_attn *a = &sets[i];
        struct bo_attn_result r[2] = {{0}};
        st = bo_attn_setup(&env, a, D, H, F, tile_edges);
        if (st == QC_OK)
            st = bo_attn_bench(&env, a, rep, r);
        bo_env_release(&env);
        if (st != QC_OK)
            break;
        bo_add_attn(blocks, &env, a, r);
        if (strcmp(a->name, "pl2a") == 0) { /* the headline figures */
            cJSON_AddNumberToObject(root, "unfused_stash_bytes", (double)r[0].stash_bytes);
            cJSON_AddNumberToObject(root, "fused_stash_bytes", (double)r[1].stash_bytes);
            cJSON_AddNumberToObject(root, "unfused_ms", r[0].total_ms);
            cJSON_AddNumberToObject(root, "fused_ms", r[1].total_ms);
            cJSON_AddNumberToObject(root, "stash_ratio",
                                    (double)r[0].stash_bytes / (double)r[1].stash_bytes);
            cJSON_AddNumberToObject(root, "time_ratio", r[1].total_ms / r[0].total_ms);
            if (env.alloc) {
                cJSON_AddNumberToObject(root, "unfused_peak_device_bytes",
                                        (double)r[0].peak_device_bytes);
                cJSON_AddNumberToObject(root, "fused_peak_device_bytes",
                                        (double)r[1].peak_device_bytes);
            }
        }
        if (!json)
            printf("%-5s E %7lld  stash unfused %8.1f MiB fused %7.1f MiB (%5.1fx)  ms unfused "
                   "%8.1f fused %8.1f (%.2fx)\n",
                   a->name, (long long)(a->E * a->Q), (double)r[0].stash_bytes / 1048576.0,
                   (double)r[1].stash_bytes / 1048576.0,
                   (double)r[0].stash_bytes / (double)r[1].stash_bytes, r[0].total_ms,
                   r[1].total_ms, r[1].total_ms / r[0].total_ms);
    }
    for (int i = 0; i < nset; i++)
        bo_attn_free(&sets[i]);

    if (st == QC_OK && bo_selected(only, "fourier")) {
        struct bo_node_result r = {0};
        st = bo_fourier_bench(&env, A * T, 4, true, F, D, rep, &r); /* x_a_emb: FE(4) + type */
        if (st == QC_OK) {
            bo_add_node(blocks, "fourier4_x_a", A * T, &r);
            if (!json)
                printf("FE(4) x_a  rows %lld  stash %.1f MiB  fwd %.1f ms  bwd %.1f ms\n",
                       (long long)(A * T), (double)r.stash_bytes / 1048576.0, r.fwd_ms, r.bwd_ms);
        }
        if (st == QC_OK)
            st = bo_fourier_bench(&env, K * Tf * A, 2, false, F, D, rep, &r); /* y_emb: 360A rows */
        if (st == QC_OK) {
            bo_add_node(blocks, "fourier2_y", K * Tf * A, &r);
            if (!json)
                printf("FE(2) y    rows %lld  stash %.1f MiB  fwd %.1f ms  bwd %.1f ms\n",
                       (long long)(K * Tf * A), (double)r.stash_bytes / 1048576.0, r.fwd_ms,
                       r.bwd_ms);
        }
    }
    if (st == QC_OK && bo_selected(only, "mlp")) {
        struct bo_node_result r = {0};
        st = bo_mlp_bench(&env, K * A, 120, D, rep, &r); /* to_loc_refine_pos */
        if (st == QC_OK) {
            bo_add_node(blocks, "mlp120", K * A, &r);
            if (!json)
                printf("MLP(120)   rows %lld  stash %.2f MiB  fwd %.2f ms  bwd %.2f ms\n",
                       (long long)(K * A), (double)r.stash_bytes / 1048576.0, r.fwd_ms, r.bwd_ms);
        }
    }
    if (st == QC_OK && json) {
        char *s = cJSON_Print(root);
        if (s)
            printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(root);
    bo_env_deinit(&env);
    return st;
}
