/*
 * attention_fused.c — the fused AttentionLayer edge part (QCNET.md §8.8): no per-edge hidden
 * tensor outlives a tile.
 *
 * What is kept between forward and backward: per source row k and v (kv stash), per query row
 * q and the softmax statistics M (max) and S (Σ exp + 1e-16) per head (application stash), and
 * the caller's raw edge features and indices. Nothing of width D per edge.
 *
 * Tiles. Base destinations are cut into tiles of whole CSR rows holding at least tile_edges
 * base edges (a row is never split, so every softmax row is complete inside its tile). For a
 * tile, r = FE(feat [+ cat]), r̂ = LN_r(r), k̃ = k[src] + r̂·W_krᵀ and ṽ = v[src] + r̂·W_vrᵀ + b
 * are computed once for its base edges and serve all Q queries of each base destination (the
 * decoder's modes). Then, per query row (the rows of a tile run in order on its thread):
 *   forward:  s = (q_i·k̃)·scale, M = max s, S = Σ exp(s − M) + eps, α = exp(s − M)/S,
 *             u_i = Σ dropout(α)·ṽ (dropout index (k·E + e)·H + h, as the unfused path);
 *   backward: the tile is recomputed (same ops, same shapes: the same bits), α from (M, S),
 *             dα' = du_i·ṽ, the softmax backward inside the row, dq_i (owned by the row), and
 *             dk̃, dṽ summed per base edge over the Q queries (ascending k); then dr̂ → LN_r →
 *             FE backward for the tile (parameter gradients accumulate), and dk̃, dṽ are added
 *             to the per-source dk, dv in ascending edge order.
 * Threads. Tiles are spread over OpenMP threads (one parallel region per pass); inside a tile
 * the kernels' ops run serially (nested OpenMP is off) and each thread has its own tile
 * buffers. Forward tiles write disjoint query rows. Backward tiles go round-robin to per-thread
 * gradient lanes (dk, dv, dW_kr, dW_vr, LN_r, FE parameters, categorical table), which are then
 * summed in lane order: the result is bit-reproducible for a given thread count. Transient
 * memory: about (threads × tile_edges × (F(d) + 8·D·4)) bytes plus the lanes.
 *
 * Backends. The kv half (k, v per source) is plain ops on the layer's backend. The edge part
 * above is CPU code that reads the tensors itself inside its OpenMP loops (it IS the op):
 * on the CPU it runs as is, on the emulated device it runs with the arena open
 * (qc_emu_enter/leave around the whole pass: the same bits as the CPU), and on CUDA the
 * launchers of kernels/qc_attn_fused_cuda.h replace it (same stash, same dropout keying, the
 * CPU fused path as their oracle; tiles of tile_edges_cuda base edges, the by-source CSR and
 * the tile plan built on the host from the graph's host copies).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <omp.h>

#include "blocks_internal.h"
#include "qc_emu.h"
#include "qc_exec.h"
#include "qc_kernels.h"

#ifdef QC_HAVE_CUDA
#    include "qc_attn_fused_cuda.h"

_Static_assert(QC_ATTN_CUDA_TILE_EDGES == QC_ATTN_FUSED_CUDA_TILE_EDGES,
               "the layer's default CUDA tile is the launchers' suggested tile");
#endif

enum { KV_XHAT = 0, KV_MEAN, KV_RSTD, KV_K, KV_V };

// ---- source/edge context ----------------------------------------------------------------

enum qc_status attn_fused_kv_forward(struct qc_attn_kv *kv)
{
    const struct qc_attn *l = kv->l;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const int64_t Ns = kv->ed->g->n_src, D = l->D;
    const struct qc_stash *st = &kv->stash;
    const float *xhat = qc_stash_f32(st, KV_XHAT);
    qc_op_linear_forward(ex, qc_stash_f32(st, KV_K), xhat, D, l->w + l->o_wk, NULL, Ns, D, D,
                         false);
    qc_op_linear_forward(ex, qc_stash_f32(st, KV_V), xhat, D, l->w + l->o_wv, l->w + l->o_bv, Ns, D,
                         D, false);
    return QC_OK;
}

/* kv->dk, kv->dv (n_src,D) zeroed, from the layer's hook. */
static enum qc_status kv_grads_alloc(struct qc_attn_kv *kv)
{
    const struct qc_block_mem *bm = &kv->l->mem;
    const int64_t n = kv->ed->g->n_src * kv->l->D;
    kv->dk = blk_fcalloc(bm, n, "kv.dk");
    if (kv->dk)
        kv->dv = blk_fcalloc(bm, n, "kv.dv");
    if (!kv->dv) {
        blk_ffree(bm, kv->dk, n);
        kv->dk = NULL;
        return blk_nomem(bm, "kv.dk_dv", 2 * n);
    }
    return QC_OK;
}

enum qc_status attn_fused_kv_backward(struct qc_attn_kv *kv, float *dxhat_s)
{
    enum qc_status s;
    const struct qc_attn *l = kv->l;
    const int64_t Ns = kv->ed->g->n_src, D = l->D;
    if (!kv->dk && (s = kv_grads_alloc(kv)) != QC_OK) /* no application ran backward */
        return s;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *xhat = qc_stash_f32(&kv->stash, KV_XHAT);
    qc_op_linear_backward(ex, dxhat_s, D, l->dw + l->o_wk, NULL, kv->dk, xhat, D, l->w + l->o_wk,
                          Ns, D, D, false);
    qc_op_linear_backward(ex, dxhat_s, D, l->dw + l->o_wv, l->dw + l->o_bv, kv->dv, xhat, D,
                          l->w + l->o_wv, Ns, D, D, true);
    blk_ffree(&l->mem, kv->dv, Ns * D);
    blk_ffree(&l->mem, kv->dk, Ns * D);
    kv->dk = kv->dv = NULL;
    return QC_OK;
}

// ---- tiles ------------------------------------------------------------------------------

/* One thread's tile buffers (cap base edges). */
struct ftile_ws {
    struct qc_stash fe; /* FE stash of the current tile, bound to fe_mem */
    void *fe_mem;       /* fe_mem_bytes: the FE stash arena for cap rows */
    float *fe_ws;       /* fe_ws_n floats: FE forward / backward scratch for cap rows */
    float *mem;         /* mem_n floats: the per-edge buffers below */
    float *cat, *r, *rhat, *rmean, *rrstd; /* (cap,D), (cap,D), (cap,D), (cap), (cap) */
    float *kt, *vt, *dkt, *dvt, *drhat;    /* (cap,D) each; d* only for backward */
    float *row;                            /* row scratch: 3·max_deg·H */
};

/* One thread's gradient lane (backward): private accumulators, summed over lanes in lane order
 * at the end, so the result is deterministic for a given thread count. */
struct ftile_lane {
    float *dlw;   /* (layer params) only the to_k_r, to_v_r and attn_prenorm_r slices are used */
    float *dfe;   /* (FE params) */
    float *dcat;  /* (ncat,D) */
    float *dk;    /* (n_src,D) */
    float *dv;    /* (n_src,D) */
    float *dcatr; /* (cap,D) the tile's categorical gradient rows */
};

struct ftile {
    const struct qc_block_mem *bm; /* the layer's hook: every buffer below but b0, ws, lane */
    int64_t ntile;                 /* tiles */
    int64_t *b0;                   /* (ntile+1) first base destination of each tile */
    int64_t cap;                   /* most base edges in one tile */
    int64_t max_deg;               /* most base edges of one base destination */
    int nthreads;
    struct ftile_ws *ws;     /* (nthreads) */
    struct ftile_lane *lane; /* (nthreads), backward only */
    /* sizes of the per-thread buffers (for the hook's free) */
    size_t fe_mem_bytes;
    int64_t fe_ws_n, mem_n, row_n, dlw_n, dfe_n, dcat_n, dcatr_n, dk_n;
};

/* Gives every buffer back, in reverse order of ftile_make. */
static void ftile_free(struct ftile *t)
{
    for (int i = t->lane ? t->nthreads - 1 : -1; i >= 0; i--) {
        struct ftile_lane *ln = &t->lane[i];
        blk_ffree(t->bm, ln->dcatr, t->dcatr_n);
        blk_ffree(t->bm, ln->dcat, t->dcat_n);
        blk_ffree(t->bm, ln->dfe, t->dfe_n);
        blk_ffree(t->bm, ln->dlw, t->dlw_n);
        blk_ffree(t->bm, ln->dv, t->dk_n);
        blk_ffree(t->bm, ln->dk, t->dk_n);
    }
    for (int i = t->ws ? t->nthreads - 1 : -1; i >= 0; i--) {
        struct ftile_ws *w = &t->ws[i];
        qc_stash_deinit(&w->fe);
        blk_ffree(t->bm, w->row, t->row_n);
        blk_ffree(t->bm, w->mem, t->mem_n);
        blk_ffree(t->bm, w->fe_ws, t->fe_ws_n);
        qc_block_free(t->bm, w->fe_mem, t->fe_mem_bytes);
    }
    /* host bookkeeping: the tile plan and the per-thread descriptors */
    free(t->lane);
    free(t->ws);
    free(t->b0);
}

static enum qc_status ftile_make(struct ftile *t, const struct qc_attn_kv *kv, bool backward)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const int64_t D = l->D, H = l->H, nb = g->n_bdst, Ns = g->n_src;
    const int64_t want = l->tile_edges > 0 ? l->tile_edges : 1;
    const int64_t *row_ptr = attn_row_ptr_host(g);
    memset(t, 0, sizeof *t);
    t->bm = &l->mem;
    t->b0 = malloc((size_t)(nb + 2) * sizeof *t->b0);
    if (!t->b0)
        return blk_nomem(t->bm, "fused_tile.plan", nb + 2);
    int64_t b = 0;
    while (b < nb) {
        t->b0[t->ntile++] = b;
        int64_t e0 = row_ptr[b];
        while (b < nb && row_ptr[b] - e0 < want) {
            int64_t deg = row_ptr[b + 1] - row_ptr[b];
            t->max_deg = deg > t->max_deg ? deg : t->max_deg;
            b++;
        }
        int64_t te = row_ptr[b] - e0;
        t->cap = te > t->cap ? te : t->cap;
    }
    t->b0[t->ntile] = nb;
    const int64_t cap = t->cap;
    t->nthreads = omp_get_max_threads();
    if (t->nthreads > t->ntile)
        t->nthreads = t->ntile > 0 ? (int)t->ntile : 1;
    t->ws = calloc((size_t)t->nthreads, sizeof *t->ws);
    if (!t->ws)
        return blk_nomem(t->bm, "fused_tile.ws_list", t->nthreads);
    const bool fe_tile = l->has_pos && ed->fe && cap > 0;
    if (fe_tile) {
        struct qc_stash plan;
        qc_stash_init(&plan, "attn_fused.tile.fe");
        qc_fourier_stash_plan(ed->fe, cap, &plan);
        t->fe_mem_bytes = qc_stash_arena_bytes(&plan);
        qc_stash_deinit(&plan);
        const int64_t nf = fourier_scratch_floats(ed->fe, cap, false);
        const int64_t nb2 = backward ? fourier_scratch_floats(ed->fe, cap, true) : 0;
        t->fe_ws_n = nf > nb2 ? nf : nb2;
    }
    t->mem_n = (backward ? 8 : 5) * cap * D + 2 * cap;
    t->row_n = 3 * t->max_deg * H + 1;
    for (int i = 0; i < t->nthreads; i++) {
        struct ftile_ws *w = &t->ws[i];
        qc_stash_init(&w->fe, "attn_fused.tile.fe");
        if (fe_tile) {
            w->fe_mem = qc_block_alloc(t->bm, t->fe_mem_bytes, "fused_tile.fe_stash");
            if (!w->fe_mem)
                return blk_nomem(t->bm, "fused_tile.fe_stash", (int64_t)(t->fe_mem_bytes / 4));
            if (t->fe_ws_n > 0 &&
                !(w->fe_ws = blk_falloc(t->bm, t->fe_ws_n, "fused_tile.fe_scratch")))
                return blk_nomem(t->bm, "fused_tile.fe_scratch", t->fe_ws_n);
        }
        if (!(w->mem = blk_falloc(t->bm, t->mem_n, "fused_tile.edges")))
            return blk_nomem(t->bm, "fused_tile.edges", t->mem_n);
        if (!(w->row = blk_falloc(t->bm, t->row_n, "fused_tile.row")))
            return blk_nomem(t->bm, "fused_tile.row", t->row_n);
        float *p = w->mem;
        w->cat = p, p += cap * D;
        w->r = p, p += cap * D;
        w->rhat = p, p += cap * D;
        w->kt = p, p += cap * D;
        w->vt = p, p += cap * D;
        if (backward) {
            w->dkt = p, p += cap * D;
            w->dvt = p, p += cap * D;
            w->drhat = p, p += cap * D;
        }
        w->rmean = p, p += cap;
        w->rrstd = p;
    }
    if (!backward)
        return QC_OK;
    t->lane = calloc((size_t)t->nthreads, sizeof *t->lane);
    if (!t->lane)
        return blk_nomem(t->bm, "fused_lane.list", t->nthreads);
    t->dk_n = Ns * D;
    t->dlw_n = l->has_pos ? l->params.numel : 0;
    t->dfe_n = l->has_pos ? ed->fe->params.numel : 0;
    const bool lane_cat = ed->cat_table && ed->dcat_table;
    t->dcat_n = lane_cat ? ed->ncat * D : 0;
    t->dcatr_n = lane_cat ? cap * D : 0;
    for (int i = 0; i < t->nthreads; i++) {
        struct ftile_lane *ln = &t->lane[i];
        if (!(ln->dk = blk_fcalloc(t->bm, t->dk_n, "fused_lane.dk")))
            return blk_nomem(t->bm, "fused_lane.dk", t->dk_n);
        if (!(ln->dv = blk_fcalloc(t->bm, t->dk_n, "fused_lane.dv")))
            return blk_nomem(t->bm, "fused_lane.dv", t->dk_n);
        if (l->has_pos) {
            if (!(ln->dlw = blk_fcalloc(t->bm, t->dlw_n, "fused_lane.dparams")))
                return blk_nomem(t->bm, "fused_lane.dparams", t->dlw_n);
            if (!(ln->dfe = blk_fcalloc(t->bm, t->dfe_n, "fused_lane.dfe")))
                return blk_nomem(t->bm, "fused_lane.dfe", t->dfe_n);
        }
        if (lane_cat) {
            if (!(ln->dcat = blk_fcalloc(t->bm, t->dcat_n, "fused_lane.dcat")))
                return blk_nomem(t->bm, "fused_lane.dcat", t->dcat_n);
            if (!(ln->dcatr = blk_falloc(t->bm, t->dcatr_n, "fused_lane.dcat_rows")))
                return blk_nomem(t->bm, "fused_lane.dcat_rows", t->dcatr_n);
        }
    }
    return QC_OK;
}

/* Per-edge work of one tile: base edges [e0, e0+te). Writes r, r̂ (+ stats), k̃, ṽ and fills
 * the tile's FE stash. Called from inside the tile loop's parallel region, so the kernels' own
 * OpenMP loops run serially here. Deterministic: the same call reproduces the same bits. */
static enum qc_status ftile_edges(struct ftile_ws *t, const struct qc_attn_kv *kv, int64_t e0,
                                  int64_t te)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_edges *ed = kv->ed;
    const float *w = l->w;
    const int64_t D = l->D;
    const float *k = qc_stash_f32(&kv->stash, KV_K), *v = qc_stash_f32(&kv->stash, KV_V);
    qc_gather_rows_forward_cpu(t->kt, k, ed->g->src + e0, te, D, false);
    qc_gather_rows_forward_cpu(t->vt, v, ed->g->src + e0, te, D, false);
    if (!l->has_pos || te == 0)
        return QC_OK;
    const struct qc_fourier *fe = ed->fe;
    if (ed->cat_table)
        qc_embedding_forward_cpu(t->cat, ed->cat_idx + e0, ed->cat_table, te, D, ed->ncat);
    qc_stash_deinit(&t->fe);
    qc_stash_init(&t->fe, "attn_fused.tile.fe");
    qc_fourier_stash_plan(fe, te, &t->fe);
    qc_stash_bind(&t->fe, t->fe_mem);
    QC_TRY(fourier_forward_ws(fe, t->r, &t->fe, fe->d > 0 ? ed->feat + e0 * fe->d : NULL,
                              ed->cat_table ? t->cat : NULL, te, t->fe_ws));
    qc_layernorm_forward_cpu(t->rhat, t->rmean, t->rrstd, t->r, w + l->o_ln_r_w, w + l->o_ln_r_b,
                             te, D);
    qc_linear_forward_cpu(t->kt, t->rhat, D, w + l->o_wkr, NULL, te, D, D, true);
    qc_linear_forward_cpu(t->vt, t->rhat, D, w + l->o_wvr, w + l->o_bvr, te, D, D, true);
    return QC_OK;
}

/* Records the first failure of a parallel region (its message stays on the failing thread:
 * copy it into the shared status so the caller's thread reports it). */
static void ftile_fail(enum qc_status *shared, char *msg, size_t nmsg, enum qc_status s)
{
#pragma omp critical(qc_attn_fused_fail)
    if (*shared == QC_OK) {
        *shared = s;
        snprintf(msg, nmsg, "%s", qc_error_last());
    }
}

// ---- one query row ------------------------------------------------------------------------

/* α' from α: identity when dropout is off, else keep ? α·(1/(1−p)) : 0 (qc_philox.h). */
static inline float fused_drop(float a, const struct qc_dropout *d, int64_t index, float dscale)
{
    if (d->p == 0.0f)
        return a;
    return qc_dropout_keep(d->seed, d->step, d->block, index, d->p) ? a * dscale : 0.0f;
}

/* Scores of n edges for one query: s[e*H+h] = (Σ_c q[h,c]·k̃[e,h,c]) · scale. */
static void fused_scores(float *s, const float *q, const float *kt, int64_t n, int64_t H,
                         int64_t Dh, float scale)
{
    const int64_t D = H * Dh;
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < Dh; c++)
                acc += q[h * Dh + c] * kt[e * D + h * Dh + c];
            s[e * H + h] = acc * scale;
        }
}

/* Forward of one query row with n edges: M, S (H) and u (D) OVERWRITE. ibase = flat dropout
 * index of the row's first (edge, head). */
static void fused_row_forward(float *u, float *M, float *S, const float *q, const float *kt,
                              const float *vt, int64_t n, int64_t H, int64_t Dh, float scale,
                              const struct qc_dropout *drop, int64_t ibase, float *s)
{
    const int64_t D = H * Dh;
    const float dscale = drop->p > 0.0f ? 1.0f / (1.0f - drop->p) : 1.0f;
    memset(u, 0, (size_t)D * sizeof *u);
    if (n == 0) {
        for (int64_t h = 0; h < H; h++) {
            M[h] = 0.0f;
            S[h] = QC_SOFTMAX_EPS;
        }
        return;
    }
    fused_scores(s, q, kt, n, H, Dh, scale);
    for (int64_t h = 0; h < H; h++) {
        float m = s[h];
        for (int64_t e = 1; e < n; e++)
            m = s[e * H + h] > m ? s[e * H + h] : m;
        float sum = 0.0f;
        for (int64_t e = 0; e < n; e++) {
            s[e * H + h] = expf(s[e * H + h] - m);
            sum += s[e * H + h];
        }
        M[h] = m;
        S[h] = sum + QC_SOFTMAX_EPS;
    }
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++) {
            float a = fused_drop(s[e * H + h] / S[h], drop, ibase + e * H + h, dscale);
            for (int64_t c = 0; c < Dh; c++)
                u[h * Dh + c] += a * vt[e * D + h * Dh + c];
        }
}

/* Backward of one query row: dq (D) OVERWRITE; dkt, dvt (n,D) ACCUM. */
static void fused_row_backward(float *dq, float *dkt, float *dvt, const float *du, const float *M,
                               const float *S, const float *q, const float *kt, const float *vt,
                               int64_t n, int64_t H, int64_t Dh, float scale,
                               const struct qc_dropout *drop, int64_t ibase, float *sc)
{
    const int64_t D = H * Dh;
    const float dscale = drop->p > 0.0f ? 1.0f / (1.0f - drop->p) : 1.0f;
    memset(dq, 0, (size_t)D * sizeof *dq);
    if (n == 0)
        return;
    float *alpha = sc, *adrop = sc + n * H, *dalpha = sc + 2 * n * H;
    fused_scores(alpha, q, kt, n, H, Dh, scale);
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++) {
            int64_t j = e * H + h;
            alpha[j] = expf(alpha[j] - M[h]) / S[h]; /* the forward's α, bit for bit */
            adrop[j] = fused_drop(alpha[j], drop, ibase + j, dscale);
            float acc = 0.0f;
            for (int64_t c = 0; c < Dh; c++)
                acc += du[h * Dh + c] * vt[e * D + h * Dh + c];
            dalpha[j] = fused_drop(acc, drop, ibase + j, dscale); /* d wrt the pre-dropout α */
        }
    for (int64_t h = 0; h < H; h++) {
        float dot = 0.0f;
        for (int64_t e = 0; e < n; e++)
            dot += alpha[e * H + h] * dalpha[e * H + h];
        for (int64_t e = 0; e < n; e++) {
            int64_t j = e * H + h;
            dalpha[j] = alpha[j] * (dalpha[j] - dot); /* dscore */
        }
    }
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++) {
            int64_t j = e * H + h;
            float gs = dalpha[j] * scale, a = adrop[j];
            for (int64_t c = 0; c < Dh; c++) {
                int64_t x = e * D + h * Dh + c;
                dq[h * Dh + c] += gs * kt[x];
                dkt[x] += gs * q[h * Dh + c];
                dvt[x] += a * du[h * Dh + c];
            }
        }
}

// ---- application ------------------------------------------------------------------------

/* The CPU edge forward (CPU, and EMU with the arena open). */
static enum qc_status fused_forward_cpu(const struct qc_attn_kv *kv, const float *q,
                                        const struct qc_stash *st, const struct attn_app_idx *ix,
                                        const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_graph *g = kv->ed->g;
    const int64_t *row_ptr = attn_row_ptr_host(g);
    const int64_t E = g->n_edge, D = l->D, H = l->H, Dh = l->Dh, Q = g->n_query;
    float *u = qc_stash_f32(st, ix->u), *M = qc_stash_f32(st, ix->smax);
    float *S = qc_stash_f32(st, ix->ssum);
    memset(u, 0, (size_t)(g->n_dst * D) * sizeof *u);
    for (int64_t i = 0; i < g->n_dst * H; i++) {
        M[i] = 0.0f;
        S[i] = QC_SOFTMAX_EPS;
    }
    struct ftile t;
    enum qc_status s = ftile_make(&t, kv, false);
    const struct qc_dropout drop = attn_drop(ctx, 0);
    char msg[512] = "";
    const int blas_threads = qc_kernels_cpu_blas_threads();
    qc_kernels_cpu_set_blas_threads(1);
    if (s == QC_OK) {
        /* tiles write disjoint query rows: any schedule gives the same bits */
#pragma omp parallel for schedule(dynamic, 1) num_threads(t.nthreads)
        for (int64_t ti = 0; ti < t.ntile; ti++) {
            struct ftile_ws *ws = &t.ws[omp_get_thread_num()];
            const int64_t b0 = t.b0[ti], b1 = t.b0[ti + 1], e0 = row_ptr[b0];
            enum qc_status ts = ftile_edges(ws, kv, e0, row_ptr[b1] - e0);
            if (ts != QC_OK) {
                ftile_fail(&s, msg, sizeof msg, ts);
                continue;
            }
            for (int64_t b = b0; b < b1; b++) {
                const int64_t eb = row_ptr[b], n = row_ptr[b + 1] - eb;
                for (int64_t k = 0; k < Q; k++) {
                    const int64_t i = attn_query_row(g, b, k);
                    fused_row_forward(u + i * D, M + i * H, S + i * H, q + i * D,
                                      ws->kt + (eb - e0) * D, ws->vt + (eb - e0) * D, n, H, Dh,
                                      l->scale, &drop, (k * E + eb) * H, ws->row);
                }
            }
        }
    }
    qc_kernels_cpu_set_blas_threads(blas_threads);
    ftile_free(&t);
    if (s != QC_OK && msg[0])
        return qc_errorf(s, "%s", msg);
    return s;
}

/* dst[0..n) += Σ_lanes src_lane[offset .. offset+n), lanes in ascending order (deterministic).
 * pick(lane) names the lane's buffer. */
static void lanes_reduce(float *dst, const struct ftile *t,
                         float *(*pick)(const struct ftile_lane *), int64_t offset, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        float acc = dst[j];
        for (int i = 0; i < t->nthreads; i++)
            acc += pick(&t->lane[i])[offset + j];
        dst[j] = acc;
    }
}

static float *lane_dk(const struct ftile_lane *ln)
{
    return ln->dk;
}
static float *lane_dv(const struct ftile_lane *ln)
{
    return ln->dv;
}
static float *lane_dlw(const struct ftile_lane *ln)
{
    return ln->dlw;
}
static float *lane_dfe(const struct ftile_lane *ln)
{
    return ln->dfe;
}
static float *lane_dcat(const struct ftile_lane *ln)
{
    return ln->dcat;
}

/* The CPU edge backward (CPU, and EMU with the arena open). */
static enum qc_status fused_backward_cpu(struct qc_attn_kv *kv, float *dq, const float *du,
                                         const struct qc_stash *st, const struct attn_app_idx *ix,
                                         const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const int64_t *row_ptr = attn_row_ptr_host(g), *src = attn_src_host(g);
    const float *w = l->w;
    const int64_t E = g->n_edge, D = l->D, H = l->H, Dh = l->Dh, Q = g->n_query;
    const int64_t Ns = g->n_src;
    const float *q = qc_stash_f32(st, ix->q), *M = qc_stash_f32(st, ix->smax);
    const float *S = qc_stash_f32(st, ix->ssum);
    if (!kv->dk) /* first application's backward: the kv gradients start at zero */
        QC_TRY(kv_grads_alloc(kv));
    memset(dq, 0, (size_t)(g->n_dst * D) * sizeof *dq);
    struct ftile t;
    enum qc_status s = ftile_make(&t, kv, true);
    const struct qc_dropout drop = attn_drop(ctx, 0);
    char msg[512] = "";
    const int blas_threads = qc_kernels_cpu_blas_threads();
    qc_kernels_cpu_set_blas_threads(1);
    if (s == QC_OK) {
        /* static round-robin: tile ti always lands in lane ti mod nthreads, in ascending order,
         * so every lane sum has a fixed order */
#pragma omp parallel for schedule(static, 1) num_threads(t.nthreads)
        for (int64_t ti = 0; ti < t.ntile; ti++) {
            const int tid = omp_get_thread_num();
            struct ftile_ws *ws = &t.ws[tid];
            struct ftile_lane *ln = &t.lane[tid];
            const int64_t b0 = t.b0[ti], b1 = t.b0[ti + 1], e0 = row_ptr[b0];
            const int64_t te = row_ptr[b1] - e0;
            enum qc_status ts = ftile_edges(ws, kv, e0, te);
            if (ts != QC_OK) {
                ftile_fail(&s, msg, sizeof msg, ts);
                continue;
            }
            memset(ws->dkt, 0, (size_t)(te * D) * sizeof *ws->dkt);
            memset(ws->dvt, 0, (size_t)(te * D) * sizeof *ws->dvt);
            for (int64_t b = b0; b < b1; b++) {
                const int64_t eb = row_ptr[b], n = row_ptr[b + 1] - eb;
                for (int64_t k = 0; k < Q; k++) {
                    const int64_t i = attn_query_row(g, b, k);
                    fused_row_backward(dq + i * D, ws->dkt + (eb - e0) * D, ws->dvt + (eb - e0) * D,
                                       du + i * D, M + i * H, S + i * H, q + i * D,
                                       ws->kt + (eb - e0) * D, ws->vt + (eb - e0) * D, n, H, Dh,
                                       l->scale, &drop, (k * E + eb) * H, ws->row);
                }
            }
            if (l->has_pos && te > 0) {
                qc_linear_backward_cpu(ws->drhat, D, ln->dlw + l->o_wkr, NULL, ws->dkt, ws->rhat, D,
                                       w + l->o_wkr, te, D, D, false);
                qc_linear_backward_cpu(ws->drhat, D, ln->dlw + l->o_wvr, ln->dlw + l->o_bvr,
                                       ws->dvt, ws->rhat, D, w + l->o_wvr, te, D, D, true);
                /* dr goes into r̂'s buffer: r̂ is dead after the two linears above, and r is
                 * still read by LN_r's backward */
                float *dr = ws->rhat;
                qc_layernorm_backward_cpu(dr, ln->dlw + l->o_ln_r_w, ln->dlw + l->o_ln_r_b,
                                          ws->drhat, ws->r, ws->rmean, ws->rrstd, w + l->o_ln_r_w,
                                          te, D, false);
                struct qc_fourier fe = *ed->fe; /* this lane's gradient buffer */
                fe.dw = ln->dfe;
                ts = fourier_backward_ws(&fe, NULL, ln->dcatr, dr, &ws->fe,
                                         fe.d > 0 ? ed->feat + e0 * fe.d : NULL, te, ws->fe_ws);
                if (ts != QC_OK) {
                    ftile_fail(&s, msg, sizeof msg, ts);
                    continue;
                }
                if (ln->dcatr)
                    qc_embedding_backward_cpu(ln->dcat, ln->dcatr, ed->cat_idx + e0, te, D,
                                              ed->ncat);
            }
            /* dk[src] += dk̃, dv[src] += dṽ in ascending edge order */
            for (int64_t e = 0; e < te; e++) {
                float *dkj = ln->dk + src[e0 + e] * D, *dvj = ln->dv + src[e0 + e] * D;
                const float *a = ws->dkt + e * D, *c = ws->dvt + e * D;
                for (int64_t x = 0; x < D; x++) {
                    dkj[x] += a[x];
                    dvj[x] += c[x];
                }
            }
        }
    }
    qc_kernels_cpu_set_blas_threads(blas_threads);
    if (s == QC_OK) {
        lanes_reduce(kv->dk, &t, lane_dk, 0, Ns * D);
        lanes_reduce(kv->dv, &t, lane_dv, 0, Ns * D);
        if (l->has_pos) {
            float *dw = l->dw;
            lanes_reduce(dw + l->o_wkr, &t, lane_dlw, l->o_wkr, D * D);
            lanes_reduce(dw + l->o_wvr, &t, lane_dlw, l->o_wvr, D * D);
            lanes_reduce(dw + l->o_bvr, &t, lane_dlw, l->o_bvr, D);
            lanes_reduce(dw + l->o_ln_r_w, &t, lane_dlw, l->o_ln_r_w, D);
            lanes_reduce(dw + l->o_ln_r_b, &t, lane_dlw, l->o_ln_r_b, D);
            lanes_reduce(ed->fe->dw, &t, lane_dfe, 0, ed->fe->params.numel);
        }
        if (ed->cat_table && ed->dcat_table)
            lanes_reduce(ed->dcat_table, &t, lane_dcat, 0, ed->ncat * D);
    }
    ftile_free(&t);
    if (s != QC_OK && msg[0])
        return qc_errorf(s, "%s", msg);
    return s;
}

// ---- CUDA -----------------------------------------------------------------------------------

#ifdef QC_HAVE_CUDA
/* One launcher call's descriptors (kernels/qc_attn_fused_cuda.h): the layer slice, FE and edge
 * set with device pointers, the host tile plan and the scratch. ed.fe points into the struct:
 * do not copy it. */
struct fused_cuda {
    struct qc_attn_fused_cuda_layer l;
    struct qc_attn_fused_cuda_fe fe;
    struct qc_attn_fused_cuda_edges ed;
    struct qc_attn_fused_cuda_tiles tiles;
    float *scratch_mem; /* scratch_n floats from the layer's hook */
    int64_t scratch_n;
    float *scratch; /* scratch_mem rounded up to 256 bytes (the launchers' alignment) */
};

static void fused_cuda_free(struct fused_cuda *c, const struct qc_attn *l)
{
    blk_ffree(&l->mem, c->scratch_mem, c->scratch_n);
    qc_attn_fused_cuda_tiles_deinit(&c->tiles);
}

static enum qc_status fused_cuda_make(struct fused_cuda *c, const struct qc_attn_kv *kv,
                                      bool backward)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const struct qc_fourier *fe = l->has_pos ? ed->fe : NULL;
    memset(c, 0, sizeof *c);
    QC_ASSERT(l->Dh <= QC_ATTN_FUSED_CUDA_MAX_DH, "attention %s: Dh %lld > %d on CUDA", l->mem.name,
              (long long)l->Dh, QC_ATTN_FUSED_CUDA_MAX_DH);
    c->l.D = l->D;
    c->l.H = l->H;
    c->l.Dh = l->Dh;
    c->l.scale = l->scale;
    c->l.has_pos = l->has_pos;
    if (l->has_pos) {
        c->l.w_kr = l->w + l->o_wkr;
        c->l.w_vr = l->w + l->o_wvr;
        c->l.b_vr = l->w + l->o_bvr;
        c->l.ln_r_w = l->w + l->o_ln_r_w;
        c->l.ln_r_b = l->w + l->o_ln_r_b;
        if (backward) {
            c->l.dw_kr = l->dw + l->o_wkr;
            c->l.dw_vr = l->dw + l->o_wvr;
            c->l.db_vr = l->dw + l->o_bvr;
            c->l.dln_r_w = l->dw + l->o_ln_r_w;
            c->l.dln_r_b = l->dw + l->o_ln_r_b;
        }
    }
    if (fe) { /* the CPU block's offsets, one to one */
        QC_ASSERT(fe->d <= QC_ATTN_FUSED_CUDA_FE_MAX_D, "attention %s: FE(%lld) on CUDA",
                  l->mem.name, (long long)fe->d);
        c->fe.D = fe->D;
        c->fe.F = fe->F;
        c->fe.d = fe->d;
        c->fe.o_freqs = fe->o_freqs;
        for (int64_t i = 0; i < fe->d; i++) {
            c->fe.o_w1[i] = fe->o_w1[i];
            c->fe.o_b1[i] = fe->o_b1[i];
            c->fe.o_lnw[i] = fe->o_lnw[i];
            c->fe.o_lnb[i] = fe->o_lnb[i];
            c->fe.o_w2[i] = fe->o_w2[i];
            c->fe.o_b2[i] = fe->o_b2[i];
        }
        c->fe.o_out_lnw = fe->o_out_lnw;
        c->fe.o_out_lnb = fe->o_out_lnb;
        c->fe.o_out_w = fe->o_out_w;
        c->fe.o_out_b = fe->o_out_b;
        c->fe.w = fe->w;
        c->fe.dw = backward ? fe->dw : NULL;
    }
    c->ed.n_src = g->n_src;
    c->ed.n_dst = g->n_dst;
    c->ed.n_bdst = g->n_bdst;
    c->ed.n_query = g->n_query;
    c->ed.n_edge = g->n_edge;
    c->ed.row_ptr = g->row_ptr;
    c->ed.src = g->src;
    c->ed.query_row = g->query_row;
    c->ed.fe = fe ? &c->fe : NULL;
    c->ed.feat = fe && fe->d > 0 ? ed->feat : NULL;
    c->ed.cat_table = fe ? ed->cat_table : NULL;
    c->ed.cat_idx = fe && ed->cat_table ? ed->cat_idx : NULL;
    c->ed.ncat = fe && ed->cat_table ? ed->ncat : 0;
    c->ed.dcat_table = backward && fe && ed->cat_table ? ed->dcat_table : NULL;
    if (backward) /* built once per edge context, shared by its layers */
        QC_TRY(attn_edges_by_src(ed, &c->ed.by_src));
    const int64_t tile = l->tile_edges_cuda > 0 ? l->tile_edges_cuda : QC_ATTN_CUDA_TILE_EDGES;
    QC_TRY(qc_attn_fused_cuda_tiles_init(&c->tiles, attn_row_ptr_host(g), g->n_bdst, tile));
    c->ed.tiles = &c->tiles;
    /* + 64 floats: room to round the hook's (64-byte aligned) block up to 256 bytes */
    const int64_t need = qc_attn_fused_cuda_scratch_numel(&c->l, &c->ed, backward);
    c->scratch_n = need + 64;
    c->scratch_mem = blk_falloc(&l->mem, c->scratch_n, "fused_tile.cuda_scratch");
    if (!c->scratch_mem) {
        enum qc_status s = blk_nomem(&l->mem, "fused_tile.cuda_scratch", c->scratch_n);
        qc_attn_fused_cuda_tiles_deinit(&c->tiles);
        c->scratch_n = 0;
        return s;
    }
    c->scratch = (float *)(((uintptr_t)c->scratch_mem + 255) & ~(uintptr_t)255);
    return QC_OK;
}

static enum qc_status fused_forward_cuda(const struct qc_attn_kv *kv, const float *q,
                                         const struct qc_stash *st, const struct attn_app_idx *ix,
                                         const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    struct fused_cuda c;
    QC_TRY(fused_cuda_make(&c, kv, false));
    const struct qc_dropout drop = attn_drop(ctx, 0);
    qc_attn_fused_forward_cuda(qc_stash_f32(st, ix->u), qc_stash_f32(st, ix->smax),
                               qc_stash_f32(st, ix->ssum), q, qc_stash_f32(&kv->stash, KV_K),
                               qc_stash_f32(&kv->stash, KV_V), &c.l, &c.ed, &drop, c.scratch,
                               (cudaStream_t)ex->stream);
    fused_cuda_free(&c, l); /* stream-ordered: the hook frees on the stream */
    return QC_OK;
}

static enum qc_status fused_backward_cuda(struct qc_attn_kv *kv, float *dq, const float *du,
                                          const struct qc_stash *st, const struct attn_app_idx *ix,
                                          const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    if (!kv->dk) /* first application's backward: the kv gradients start at zero */
        QC_TRY(kv_grads_alloc(kv));
    struct fused_cuda c;
    QC_TRY(fused_cuda_make(&c, kv, true));
    const struct qc_dropout drop = attn_drop(ctx, 0);
    qc_attn_fused_backward_cuda(dq, kv->dk, kv->dv, du, qc_stash_f32(st, ix->smax),
                                qc_stash_f32(st, ix->ssum), qc_stash_f32(st, ix->q),
                                qc_stash_f32(&kv->stash, KV_K), qc_stash_f32(&kv->stash, KV_V),
                                &c.l, &c.ed, &drop, c.scratch, (cudaStream_t)ex->stream);
    fused_cuda_free(&c, l);
    return QC_OK;
}
#endif

// ---- dispatch -------------------------------------------------------------------------------

/* The arena of an EMU backend (NULL otherwise): the CPU edge part runs with it open. */
static struct qc_emu *fused_emu(const struct qc_exec *ex)
{
    return qc_exec_backend_of(ex) == QC_EXEC_EMU ? ex->emu : NULL;
}

enum qc_status attn_fused_edge_forward(const struct qc_attn_kv *kv, const float *q,
                                       const struct qc_stash *st, const struct attn_app_idx *ix,
                                       const struct qc_attn_ctx *ctx)
{
    const struct qc_exec *ex = qc_block_exec(&kv->l->mem);
    if (qc_exec_backend_of(ex) == QC_EXEC_CUDA) {
#ifdef QC_HAVE_CUDA
        return fused_forward_cuda(kv, q, st, ix, ctx);
#else
        QC_ASSERT(false, "attention %s: the CUDA backend in a build without CUDA", kv->l->mem.name);
#endif
    }
    struct qc_emu *emu = fused_emu(ex);
    if (emu)
        qc_emu_enter(emu);
    enum qc_status s = fused_forward_cpu(kv, q, st, ix, ctx);
    if (emu)
        qc_emu_leave(emu);
    return s;
}

enum qc_status attn_fused_edge_backward(struct qc_attn_kv *kv, float *dq, const float *du,
                                        const struct qc_stash *st, const struct attn_app_idx *ix,
                                        const struct qc_attn_ctx *ctx)
{
    const struct qc_exec *ex = qc_block_exec(&kv->l->mem);
    if (qc_exec_backend_of(ex) == QC_EXEC_CUDA) {
#ifdef QC_HAVE_CUDA
        return fused_backward_cuda(kv, dq, du, st, ix, ctx);
#else
        QC_ASSERT(false, "attention %s: the CUDA backend in a build without CUDA", kv->l->mem.name);
#endif
    }
    struct qc_emu *emu = fused_emu(ex);
    if (emu)
        qc_emu_enter(emu);
    enum qc_status s = fused_backward_cpu(kv, dq, du, st, ix, ctx);
    if (emu)
        qc_emu_leave(emu);
    return s;
}
