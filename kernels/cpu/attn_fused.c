/*
 * attn_fused.c — the fused edge attention on the CPU (qc_attn_fused.h): the tile loop over
 * OpenMP threads, the per-query-row softmax and aggregation, and the gradient lanes.
 *
 * A tile's per-edge work (gathers, LN_r, the k_r/v_r GEMMs and their backward) is a
 * sequence of ops dispatched through qc_exec.h with the CPU backend (ex = NULL: inline on the
 * tile's thread), so the profiler sees each of them on that thread's track. The row math below
 * is this file's own. Operation order is fixed per row and per tile, so forward, the backward's
 * recompute, and repeated runs give the same bits.
 *
 * The positional embeddings r of the edges (qc_attn_fused.h, "edge modes"):
 * - materialised (ed->r given): computed once per edge set and shared by its layers; a tile
 *   starts from r̂ = LN_r(r) and its backward adds dL/dr into ed->dr, rows it alone owns;
 * - tiled (ed->r NULL): each tile computes its own r = FE(feat [+ cat]) (the composite op of
 *   qc_fourier_embed.h, the FE tensors in the thread's workspace), and its backward recomputes
 *   them, takes LN_r's backward into a tile-local dr and pushes it straight through the FE
 *   backward: the FE parameter and categorical table gradients go to the thread's lane. No
 *   tensor of E rows exists.
 *
 * Scratch (one buffer from the caller, cut here): per thread a tile workspace
 *   [tiled: fe_saved (FE tensors of cap rows) | fe_ws (FE scratch)] | edges ([tiled: cat, r,]
 *   r̂, k̃, ṽ [, dk̃, dṽ, dr̂], LN_r mean, rstd) | row (3·max_deg·H floats + keep flags)
 * and, in backward, per thread a gradient lane
 *   dk, dv (n_src,D) | dlw (to_k_r, to_v_r weights, b_vr, LN_r weight and bias)
 *   [tiled: | dfe (FE parameters) | dcat (ncat,D) | dcatr (cap,D)]
 * each piece rounded up to 16 floats (64 bytes) so threads never share a cache line.
 */
#include "qc_attn_fused.h"

#include <string.h>

#include <omp.h>

#include "cpu_internal.h"
#include "qc_exec.h"
#include "qc_fourier_embed.h"
#include "qc_kernels.h"
#include "qc_prof.h"
#include "qc_status.h"

// ---- scratch layout -----------------------------------------------------------------------

struct fcpu_layout {
    int nthreads;
    bool fe_tile;                                /* tiled edge mode: the tiles run the FE */
    int64_t fe_saved_n, fe_ws_n, mem_n, row_n;   /* per-thread workspace pieces */
    int64_t ws_n;                                /* one thread's workspace */
    int64_t dk_n, dlw_n, dfe_n, dcat_n, dcatr_n; /* per-thread lane pieces */
    int64_t lane_n;                              /* one thread's lane (backward) */
    int64_t total;
};

/* Tiled edge mode: a positional layer given no r computes it in its tiles. */
static bool fused_fe_tile(const struct qc_attn_fused_layer *l, const struct qc_attn_fused_edges *ed)
{
    return l->has_pos && !ed->r && ed->n_edge > 0;
}

int qc_attn_fused_cpu_threads(const struct qc_attn_fused_tiles *t)
{
    int n = omp_get_max_threads();
    if (n > t->ntile)
        n = t->ntile > 0 ? (int)t->ntile : 1;
    return n;
}

static struct fcpu_layout fcpu_layout_make(const struct qc_attn_fused_layer *l,
                                           const struct qc_attn_fused_edges *ed, bool backward)
{
    const struct qc_attn_fused_tiles *t = ed->tiles;
    const int64_t D = l->D, H = l->H, cap = t->cap;
    struct fcpu_layout y;
    memset(&y, 0, sizeof y);
    y.nthreads = qc_attn_fused_cpu_threads(t);
    y.fe_tile = fused_fe_tile(l, ed);
    if (y.fe_tile) {
        y.fe_saved_n = cpu_round16(qc_fe_saved_numel(ed->fe, cap));
        const int64_t nf = qc_fe_scratch_numel(ed->fe, cap, false);
        const int64_t nb = backward ? qc_fe_scratch_numel(ed->fe, cap, true) : 0;
        y.fe_ws_n = cpu_round16(nf > nb ? nf : nb);
    }
    y.mem_n = cpu_round16(((backward ? 6 : 3) + (y.fe_tile ? 2 : 0)) * cap * D + 2 * cap);
    /* 3 per (edge, head) of the largest row, and its dropout keep flags (bytes) */
    y.row_n = cpu_round16(3 * t->max_deg * H + (t->max_deg * H + 3) / 4 + 1);
    y.ws_n = y.fe_saved_n + y.fe_ws_n + y.mem_n + y.row_n;
    if (backward) {
        y.dk_n = cpu_round16(ed->n_src * D);
        y.dlw_n = l->has_pos ? cpu_round16(2 * D * D + 3 * D) : 0;
        y.dfe_n = y.fe_tile ? cpu_round16(qc_fe_params_numel(ed->fe)) : 0;
        const bool lane_cat = y.fe_tile && ed->cat_table && ed->dcat_table;
        y.dcat_n = lane_cat ? cpu_round16(ed->ncat * D) : 0;
        y.dcatr_n = lane_cat ? cpu_round16(cap * D) : 0;
        y.lane_n = 2 * y.dk_n + y.dlw_n + y.dfe_n + y.dcat_n + y.dcatr_n;
    }
    y.total = (int64_t)y.nthreads * (y.ws_n + y.lane_n);
    return y;
}

int64_t qc_attn_fused_scratch_numel_cpu(const struct qc_attn_fused_layer *l,
                                        const struct qc_attn_fused_edges *ed, bool backward)
{
    return fcpu_layout_make(l, ed, backward).total;
}

/* One thread's tile buffers (cap base edges). */
struct ftile_ws {
    struct qc_fe_saved fe;              /* tiled: the FE tensors of the current tile */
    float *fe_mem, *fe_ws;              /* tiled: fe_saved_n floats, the FE scratch */
    float *cat, *rbuf;                  /* tiled: (cap,D) categorical rows, the tile's r */
    const float *r;                     /* the tile's r: rows of ed->r, or rbuf */
    float *rhat, *rmean, *rrstd;        /* (cap,D), (cap), (cap) */
    float *kt, *vt, *dkt, *dvt, *drhat; /* (cap,D) each; d* only for backward */
    float *row;                         /* row scratch: 3·max_deg·H floats + keep flags */
};

/* One thread's gradient lane (backward): private accumulators, summed over lanes in lane order
 * at the end, so the result is deterministic for a given thread count. */
struct ftile_lane {
    float *dk, *dv; /* (n_src,D) */
    float *dlw;     /* to_k_r (D,D), to_v_r (D,D), b_vr, LN_r weight, LN_r bias (D each) */
    float *dfe;     /* tiled: FE parameters */
    float *dcat;    /* tiled: (ncat,D) */
    float *dcatr;   /* tiled: (cap,D) the tile's categorical gradient rows */
};

static struct ftile_ws ftile_ws_at(const struct fcpu_layout *y, int64_t cap, int64_t D,
                                   bool backward, float *scratch, int tid)
{
    struct ftile_ws w;
    memset(&w, 0, sizeof w);
    float *p = scratch + (int64_t)tid * y->ws_n;
    w.fe_mem = p, p += y->fe_saved_n;
    w.fe_ws = p, p += y->fe_ws_n;
    float *m = p;
    if (y->fe_tile) {
        w.cat = m, m += cap * D;
        w.rbuf = m, m += cap * D;
    }
    w.rhat = m, m += cap * D;
    w.kt = m, m += cap * D;
    w.vt = m, m += cap * D;
    if (backward) {
        w.dkt = m, m += cap * D;
        w.dvt = m, m += cap * D;
        w.drhat = m, m += cap * D;
    }
    w.rmean = m, m += cap;
    w.rrstd = m;
    w.row = p + y->mem_n;
    return w;
}

static struct ftile_lane ftile_lane_at(const struct fcpu_layout *y, float *scratch, int tid)
{
    struct ftile_lane ln;
    float *p = scratch + (int64_t)y->nthreads * y->ws_n + (int64_t)tid * y->lane_n;
    ln.dk = p, p += y->dk_n;
    ln.dv = p, p += y->dk_n;
    ln.dlw = y->dlw_n ? p : NULL, p += y->dlw_n;
    ln.dfe = y->dfe_n ? p : NULL, p += y->dfe_n;
    ln.dcat = y->dcat_n ? p : NULL, p += y->dcat_n;
    ln.dcatr = y->dcatr_n ? p : NULL;
    return ln;
}

// ---- one tile's edges ---------------------------------------------------------------------

/* Per-edge work of one tile: base edges [e0, e0+te). Writes r̂ (+ stats), k̃, ṽ from the tile's
 * rows of r (tiled: r and the tile's FE tensors first, from feat [+ cat]). Runs inside the tile
 * loop's parallel region, so the ops' own OpenMP loops run serially here. Deterministic: the
 * same call reproduces the same bits. A tiled tile's r runs the op sequence of the materialised
 * r (qc_op_fe_forward_tiled) on the tile's rows; the materialised one groups rows in fixed
 * chunks instead (qc_attention.h, enum qc_attn_edge_mode, on when the bits agree). */
static void ftile_edges(struct ftile_ws *t, const float *k, const float *v,
                        const struct qc_attn_fused_layer *l, const struct qc_attn_fused_edges *ed,
                        int64_t e0, int64_t te)
{
    const int64_t D = l->D;
    qc_op_gather_rows_forward(NULL, t->kt, k, ed->src + e0, te, D, false);
    qc_op_gather_rows_forward(NULL, t->vt, v, ed->src + e0, te, D, false);
    if (!l->has_pos || te == 0)
        return;
    if (ed->r) {
        t->r = ed->r + e0 * D;
    } else {
        const struct qc_fe *fe = ed->fe;
        if (ed->cat_table)
            qc_op_embedding_forward(NULL, t->cat, ed->cat_idx + e0, ed->cat_table, te, D, ed->ncat);
        qc_fe_saved_pack(fe, te, t->fe_mem, &t->fe);
        qc_op_fe_forward(NULL, fe, t->rbuf, &t->fe, fe->d > 0 ? ed->feat + e0 * fe->d : NULL,
                         ed->cat_table ? t->cat : NULL, te, t->fe_ws);
        t->r = t->rbuf;
    }
    qc_op_layernorm_forward(NULL, t->rhat, t->rmean, t->rrstd, t->r, l->ln_r_w, l->ln_r_b, te, D);
    qc_op_linear_forward(NULL, t->kt, t->rhat, D, l->w_kr, NULL, te, D, D, true);
    qc_op_linear_forward(NULL, t->vt, t->rhat, D, l->w_vr, l->b_vr, te, D, D, true);
}

// ---- one query row ------------------------------------------------------------------------

/* α' from α: identity when dropout is off, else keep ? α·(1/(1−p)) : 0 (qc_philox.h); keep is
 * the flag of the element (cpu_dropout_keep_range). */
static inline float fused_drop(float a, const struct qc_dropout *d, uint8_t keep, float dscale)
{
    if (d->p == 0.0f)
        return a;
    return cpu_keep_or_zero(a * dscale, keep);
}

/* The keep flags of a row's n·H (edge, head) elements, from flat index ibase (none without
 * dropout). */
static void fused_row_keep(uint8_t *keep, const struct qc_dropout *d, int64_t ibase, int64_t nh)
{
    if (d->p != 0.0f)
        cpu_dropout_keep_range(keep, d, d->index_base + ibase, nh);
}

/* The row loops below keep one accumulator per head and run the heads innermost: every sum of
 * a (edge, head) or a head still adds its terms in ascending order (the bits of one head at a
 * time), while the H independent sums overlap in the pipeline. The per-head dot products are
 * the exception (head_dots). */
#define ROW_MAX_H 64
#define ROW_LANES 8 /* lanes of a per-head dot product (head_dots) */
_Static_assert(ROW_LANES == 8, "head_dots adds its lanes in a tree of 8");

/* out[h] = Σ_c a[h·Dh + c]·b[h·Dh + c] for h < H. With Dh a multiple of ROW_LANES, lane l of a
 * head adds the products of c ≡ l (mod ROW_LANES) in ascending c and the lanes are added in a
 * fixed pairwise tree: one contiguous loop over all heads' lanes, which vectorizes (one sum per
 * head ran the heads innermost at stride Dh, scalar: the fused rows were 1.8 GFLOP/s; issue 29).
 * Other Dh: one sum per head in ascending c. The order is fixed by the code, so the forward, the
 * backward's recompute of α and repeated runs agree bit for bit. */
static inline void head_dots(float *out, const float *a, const float *b, int64_t H, int64_t Dh)
{
    if (Dh % ROW_LANES != 0) {
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < Dh; c++)
                acc += a[h * Dh + c] * b[h * Dh + c];
            out[h] = acc;
        }
        return;
    }
    float lane[ROW_MAX_H * ROW_LANES];
    for (int64_t h = 0; h < H; h++)
        for (int l = 0; l < ROW_LANES; l++)
            lane[h * ROW_LANES + l] = a[h * Dh + l] * b[h * Dh + l];
    for (int64_t c0 = ROW_LANES; c0 < Dh; c0 += ROW_LANES)
        for (int64_t h = 0; h < H; h++)
            for (int l = 0; l < ROW_LANES; l++)
                lane[h * ROW_LANES + l] += a[h * Dh + c0 + l] * b[h * Dh + c0 + l];
    for (int64_t h = 0; h < H; h++) {
        const float *v = lane + h * ROW_LANES;
        out[h] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
}

/* Scores of n edges for one query: s[e*H+h] = (Σ_c q[h,c]·k̃[e,h,c]) · scale. */
static void fused_scores(float *s, const float *q, const float *kt, int64_t n, int64_t H,
                         int64_t Dh, float scale)
{
    const int64_t D = H * Dh;
    for (int64_t e = 0; e < n; e++) {
        float acc[ROW_MAX_H];
        head_dots(acc, q, kt + e * D, H, Dh);
        for (int64_t h = 0; h < H; h++)
            s[e * H + h] = acc[h] * scale;
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
    uint8_t *keep = (uint8_t *)(s + 3 * n * H);
    fused_row_keep(keep, drop, ibase, n * H);
    fused_scores(s, q, kt, n, H, Dh, scale);
    float m[ROW_MAX_H], sum[ROW_MAX_H];
    for (int64_t h = 0; h < H; h++) {
        m[h] = s[h];
        sum[h] = 0.0f;
    }
    for (int64_t e = 1; e < n; e++)
        for (int64_t h = 0; h < H; h++)
            m[h] = s[e * H + h] > m[h] ? s[e * H + h] : m[h];
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++) {
            s[e * H + h] = expf(s[e * H + h] - m[h]);
            sum[h] += s[e * H + h];
        }
    for (int64_t h = 0; h < H; h++) {
        M[h] = m[h];
        S[h] = sum[h] + QC_SOFTMAX_EPS;
    }
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++) {
            float a = fused_drop(s[e * H + h] / S[h], drop, keep[e * H + h], dscale);
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
    uint8_t *keep = (uint8_t *)(sc + 3 * n * H);
    fused_row_keep(keep, drop, ibase, n * H);
    fused_scores(alpha, q, kt, n, H, Dh, scale);
    for (int64_t e = 0; e < n; e++) {
        float acc[ROW_MAX_H];
        head_dots(acc, du, vt + e * D, H, Dh);
        for (int64_t h = 0; h < H; h++) {
            int64_t j = e * H + h;
            alpha[j] = expf(alpha[j] - M[h]) / S[h]; /* the forward's α, bit for bit */
            adrop[j] = fused_drop(alpha[j], drop, keep[j], dscale);
            dalpha[j] = fused_drop(acc[h], drop, keep[j], dscale); /* d wrt the pre-dropout α */
        }
    }
    float dot[ROW_MAX_H];
    for (int64_t h = 0; h < H; h++)
        dot[h] = 0.0f;
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++)
            dot[h] += alpha[e * H + h] * dalpha[e * H + h];
    for (int64_t e = 0; e < n; e++)
        for (int64_t h = 0; h < H; h++) {
            int64_t j = e * H + h;
            dalpha[j] = alpha[j] * (dalpha[j] - dot[h]); /* dscore */
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

/* x_dst row of query (b,k). */
static inline int64_t fused_query_row(const struct qc_attn_fused_edges *ed, int64_t b, int64_t k)
{
    return ed->query_row ? ed->query_row[b * ed->n_query + k] : b * ed->n_query + k;
}

/* The profiler's nested op for the row math of one tile (b1 − b0 base destinations, te edges,
 * Q queries each): flops per query edge 4·D forward (scores, aggregation), 10·D backward
 * (scores, dα, dq, dk̃, dṽ). */
static void rows_prof_end(const struct qc_prof_mark *m, const char *name, int64_t te, int64_t nrows,
                          int64_t Q, int64_t D, double flops_per)
{
    const struct qc_prof_op po = {name,
                                  "E,Q,D",
                                  {te, Q, D, 0},
                                  4.0 * (2.0 * (double)te * D + 2.0 * (double)nrows * Q * D),
                                  flops_per * (double)te * Q * D};
    qc_prof_op_end(m, &po);
}

// ---- forward ------------------------------------------------------------------------------

void qc_attn_fused_forward_cpu(float *u, float *smax, float *ssum, const float *q, const float *k,
                               const float *v, const struct qc_attn_fused_layer *l,
                               const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                               float *scratch)
{
    const struct qc_attn_fused_tiles *t = ed->tiles;
    const int64_t *row_ptr = ed->row_ptr;
    const int64_t E = ed->n_edge, D = l->D, H = l->H, Dh = l->Dh, Q = ed->n_query;
    QC_ASSERT(t && l->H <= ROW_MAX_H && l->H * l->Dh == l->D && qc_dropout_valid(drop) &&
                  (!l->has_pos || ed->n_edge == 0 || ed->r || ed->fe),
              "attn fused fwd: no tile plan, H·Dh != D, bad dropout, or neither r nor its FE for "
              "a positional layer");
    memset(u, 0, (size_t)(ed->n_dst * D) * sizeof *u);
    for (int64_t i = 0; i < ed->n_dst * H; i++) {
        smax[i] = 0.0f;
        ssum[i] = QC_SOFTMAX_EPS;
    }
    if (t->ntile == 0)
        return;
    const struct fcpu_layout y = fcpu_layout_make(l, ed, false);
    const struct cpu_team tm = cpu_team_begin(y.nthreads);
    /* tiles write disjoint query rows: any schedule gives the same bits */
#pragma omp parallel for schedule(dynamic, 1) num_threads(y.nthreads)
    for (int64_t ti = 0; ti < t->ntile; ti++) {
        struct ftile_ws ws = ftile_ws_at(&y, t->cap, D, false, scratch, omp_get_thread_num());
        const int64_t b0 = t->b0[ti], b1 = t->b0[ti + 1], e0 = row_ptr[b0];
        ftile_edges(&ws, k, v, l, ed, e0, row_ptr[b1] - e0);
        struct qc_prof_mark pm;
        if (tm.prof)
            qc_prof_op_begin(&pm);
        for (int64_t b = b0; b < b1; b++) {
            const int64_t eb = row_ptr[b], n = row_ptr[b + 1] - eb;
            for (int64_t kq = 0; kq < Q; kq++) {
                const int64_t i = fused_query_row(ed, b, kq);
                fused_row_forward(u + i * D, smax + i * H, ssum + i * H, q + i * D,
                                  ws.kt + (eb - e0) * D, ws.vt + (eb - e0) * D, n, H, Dh, l->scale,
                                  drop, (kq * E + eb) * H, ws.row);
            }
        }
        if (tm.prof)
            rows_prof_end(&pm, "attn_fused_rows_forward", row_ptr[b1] - e0, b1 - b0, Q, D, 4.0);
    }
    cpu_team_end(tm);
}

// ---- backward -----------------------------------------------------------------------------

/* dst[0..n) += piece `piece` of every lane, in lane order (cpu_internal.h). */
static void lanes_reduce(float *dst, const struct fcpu_layout *y, const float *lanes0,
                         int64_t piece, int64_t n)
{
    cpu_lanes_reduce(dst, lanes0, y->nthreads, y->lane_n, piece, n);
}

/* One tile's backward on thread lane ln: recompute, the rows, the edge backward into the lane. */
static void ftile_backward(struct ftile_ws *ws, struct ftile_lane *ln, float *dq, const float *du,
                           const float *M, const float *S, const float *q, const float *k,
                           const float *v, const struct qc_attn_fused_layer *l,
                           const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                           int64_t b0, int64_t b1)
{
    const int64_t *row_ptr = ed->row_ptr;
    const int64_t E = ed->n_edge, D = l->D, H = l->H, Dh = l->Dh, Q = ed->n_query;
    const int64_t e0 = row_ptr[b0], te = row_ptr[b1] - e0;
    ftile_edges(ws, k, v, l, ed, e0, te);
    memset(ws->dkt, 0, (size_t)(te * D) * sizeof *ws->dkt);
    memset(ws->dvt, 0, (size_t)(te * D) * sizeof *ws->dvt);
    const bool prof = qc_prof_on();
    struct qc_prof_mark pm;
    if (prof)
        qc_prof_op_begin(&pm);
    for (int64_t b = b0; b < b1; b++) {
        const int64_t eb = row_ptr[b], n = row_ptr[b + 1] - eb;
        for (int64_t kq = 0; kq < Q; kq++) {
            const int64_t i = fused_query_row(ed, b, kq);
            fused_row_backward(dq + i * D, ws->dkt + (eb - e0) * D, ws->dvt + (eb - e0) * D,
                               du + i * D, M + i * H, S + i * H, q + i * D, ws->kt + (eb - e0) * D,
                               ws->vt + (eb - e0) * D, n, H, Dh, l->scale, drop, (kq * E + eb) * H,
                               ws->row);
        }
    }
    if (prof)
        rows_prof_end(&pm, "attn_fused_rows_backward", te, b1 - b0, Q, D, 10.0);
    if (l->has_pos && te > 0) {
        float *dlw = ln->dlw;
        qc_op_linear_backward(NULL, ws->drhat, D, dlw, NULL, ws->dkt, ws->rhat, D, l->w_kr, te, D,
                              D, false);
        qc_op_linear_backward(NULL, ws->drhat, D, dlw + D * D, dlw + 2 * D * D, ws->dvt, ws->rhat,
                              D, l->w_vr, te, D, D, true);
        if (ed->r) { /* dr accumulates into the caller's buffer: the tile's rows are its own */
            qc_op_layernorm_backward(NULL, ed->dr + e0 * D, dlw + 2 * D * D + D,
                                     dlw + 2 * D * D + 2 * D, ws->drhat, ws->r, ws->rmean,
                                     ws->rrstd, l->ln_r_w, te, D, true);
        } else {
            /* tiled: dr goes into r̂'s buffer (r̂ is dead after the two linears above, r is still
             * read by LN_r's backward) and straight through the FE backward into the lane */
            float *dr = ws->rhat;
            qc_op_layernorm_backward(NULL, dr, dlw + 2 * D * D + D, dlw + 2 * D * D + 2 * D,
                                     ws->drhat, ws->r, ws->rmean, ws->rrstd, l->ln_r_w, te, D,
                                     false);
            struct qc_fe fe = *ed->fe; /* this lane's gradient buffer */
            fe.dw = ln->dfe;
            qc_op_fe_backward(NULL, &fe, NULL, ln->dcatr, dr, &ws->fe,
                              fe.d > 0 ? ed->feat + e0 * fe.d : NULL, te, ws->fe_ws);
            if (ln->dcatr)
                qc_op_embedding_backward(NULL, ln->dcat, ln->dcatr, ed->cat_idx + e0, te, D,
                                         ed->ncat);
        }
    }
    /* dk[src] += dk̃, dv[src] += dṽ in ascending edge order */
    if (prof)
        qc_prof_op_begin(&pm);
    for (int64_t e = 0; e < te; e++) {
        float *dkj = ln->dk + ed->src[e0 + e] * D, *dvj = ln->dv + ed->src[e0 + e] * D;
        const float *a = ws->dkt + e * D, *c = ws->dvt + e * D;
        for (int64_t x = 0; x < D; x++) {
            dkj[x] += a[x];
            dvj[x] += c[x];
        }
    }
    if (prof) {
        const struct qc_prof_op po = {
            "attn_fused_scatter", "E,D", {te, D, 0, 0}, 4.0 * 6.0 * (double)te * D, 0};
        qc_prof_op_end(&pm, &po);
    }
}

void qc_attn_fused_backward_cpu(float *dq, float *dk, float *dv, const float *du, const float *smax,
                                const float *ssum, const float *q, const float *k, const float *v,
                                const struct qc_attn_fused_layer *l,
                                const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                                float *scratch)
{
    const struct qc_attn_fused_tiles *t = ed->tiles;
    const int64_t D = l->D;
    QC_ASSERT(t && l->H <= ROW_MAX_H && l->H * l->Dh == l->D && qc_dropout_valid(drop) &&
                  (!l->has_pos || ed->n_edge == 0 || (ed->r && ed->dr) || (!ed->r && ed->fe)),
              "attn fused bwd: no tile plan, H·Dh != D, bad dropout, or neither r, dr nor the FE "
              "for a positional layer");
    memset(dq, 0, (size_t)(ed->n_dst * D) * sizeof *dq);
    if (t->ntile == 0)
        return;
    const struct fcpu_layout y = fcpu_layout_make(l, ed, true);
    float *lanes0 = scratch + (int64_t)y.nthreads * y.ws_n;
    memset(lanes0, 0, (size_t)(y.nthreads * y.lane_n) * sizeof *lanes0);
    const struct cpu_team tm = cpu_team_begin(y.nthreads);
    /* static round-robin: tile ti always lands in lane ti mod nthreads, in ascending order, so
     * every lane sum has a fixed order */
#pragma omp parallel for schedule(static, 1) num_threads(y.nthreads)
    for (int64_t ti = 0; ti < t->ntile; ti++) {
        const int tid = omp_get_thread_num();
        struct ftile_ws ws = ftile_ws_at(&y, t->cap, D, true, scratch, tid);
        struct ftile_lane ln = ftile_lane_at(&y, scratch, tid);
        ftile_backward(&ws, &ln, dq, du, smax, ssum, q, k, v, l, ed, drop, t->b0[ti],
                       t->b0[ti + 1]);
    }
    cpu_team_end(tm);
    lanes_reduce(dk, &y, lanes0, 0, ed->n_src * D);
    lanes_reduce(dv, &y, lanes0, y.dk_n, ed->n_src * D);
    if (l->has_pos) {
        const int64_t o = 2 * y.dk_n;
        lanes_reduce(l->dw_kr, &y, lanes0, o, D * D);
        lanes_reduce(l->dw_vr, &y, lanes0, o + D * D, D * D);
        lanes_reduce(l->db_vr, &y, lanes0, o + 2 * D * D, D);
        lanes_reduce(l->dln_r_w, &y, lanes0, o + 2 * D * D + D, D);
        lanes_reduce(l->dln_r_b, &y, lanes0, o + 2 * D * D + 2 * D, D);
        if (y.dfe_n)
            lanes_reduce(ed->fe->dw, &y, lanes0, o + y.dlw_n, qc_fe_params_numel(ed->fe));
    }
    if (y.dcat_n)
        lanes_reduce(ed->dcat_table, &y, lanes0, 2 * y.dk_n + y.dlw_n + y.dfe_n, ed->ncat * D);
}
