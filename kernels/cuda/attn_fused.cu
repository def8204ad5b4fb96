/*
 * attn_fused.cu — the fused edge attention on CUDA (qc_attn_fused_cuda.h): the CUDA twin of the
 * edge part of src/model/attention_fused.c. No per-edge tensor of width D outlives a tile.
 *
 * Per tile (whole CSR rows of base destinations, host plan):
 *   edges:    k̃ = k[src], ṽ = v[src] (gather); with a positional input also
 *             r = FE(feat [+ cat]) (fourier features, per-dim Linear/LN/ReLU/Linear summed in
 *             ascending dim, output LN/ReLU/Linear), r̂ = LN_r(r), k̃ += r̂·W_krᵀ,
 *             ṽ += r̂·W_vrᵀ + b_vr: the op launchers (cuBLAS GEMMs, deterministic LayerNorm and
 *             column sums) into the tile's scratch, the CPU block's exact sequence of ops;
 *   forward:  one thread per (query row, head): max, Σ exp (ascending edge), weighted sum of
 *             dropout(α)·ṽ: the CPU's loops (fused_row_forward) with its fp32 operation order;
 *   backward: one thread per (base destination, head) walks its Q queries in ascending k:
 *             dq (owned), dk̃ and dṽ of the row's edges (owned by the thread: no atomics); then
 *             dk[j], dv[j] += the tile's dk̃, dṽ of source j in ascending edge (one warp per
 *             source with an edge in the tile, found from the tile's edges, over the by-source
 *             CSR; tiles ascending, so the global order is ascending edge id, the CPU's
 *             single-thread order); then the tile's to_k_r / to_v_r /
 *             LN_r / FE backward, parameter gradients accumulated tile by tile.
 * The sums inside a thread use qc_fadd_rn / qc_fmul_rn (__fadd_rn / __fmul_rn on the device) so
 * nvcc cannot contract them into FMAs: the row math then differs from the CPU only through expf
 * (a few ulp) and its inputs.
 *
 * Scratch layout (floats, each piece 256-byte aligned, sized by the largest tile `cap`):
 *   kt, vt (cap,D); with pos: r, rhat, tmp (cap,D), rmean, rrstd (cap), the FE stash (phi
 *   (cap,d,2F+1), per dim z, a (cap,D) and LN statistics (cap), s, o (cap,D) and statistics);
 *   backward adds dkt, dvt, drhat (cap,D) and dphi (cap,d,2F+1). The FE backward reuses kt, vt
 *   and tmp (dead by then) for its (cap,D) temporaries.
 */
#include "qc_attn_fused_cuda.h"

#include <stdlib.h>

#include "attn_fused_internal.h"
#include "cuda_common.cuh"

// ---- scratch layout (attn_fused_internal.h: the same arithmetic sizes a CUDA target's plan) ----

#define fused_layout qc_attn_fused_layout
static_assert(QC_ATTN_FUSED_LAYOUT_MAX_D == QC_FE_MAX_D, "the layout's FE bound");

static struct fused_layout fused_layout_make(const struct qc_attn_fused_layer *l,
                                             const struct qc_attn_fused_edges *ed, bool backward)
{
    const struct qc_fe *fe = l->has_pos ? ed->fe : NULL;
    return qc_attn_fused_layout_make(ed->tiles->cap, l->D, l->has_pos, fe ? fe->d : 0,
                                     fe ? fe->F : 0, backward);
}

/* Shape and pointer preconditions shared by the launchers (programmer errors: abort). */
static void fused_check(const struct qc_attn_fused_layer *l, const struct qc_attn_fused_edges *ed,
                        const char *op)
{
    QC_ASSERT(l && ed && ed->tiles, "%s: NULL layer, edges or tiles", op);
    QC_ASSERT(l->H > 0 && l->Dh > 0 && l->D == l->H * l->Dh && l->Dh <= QC_ATTN_FUSED_CUDA_MAX_DH,
              "%s: D %lld H %lld Dh %lld (Dh <= %d)", op, (long long)l->D, (long long)l->H,
              (long long)l->Dh, QC_ATTN_FUSED_CUDA_MAX_DH);
    QC_ASSERT(ed->n_src >= 0 && ed->n_dst >= 0 && ed->n_bdst >= 0 && ed->n_query >= 1 &&
                  ed->n_edge >= 0 && ed->row_ptr,
              "%s: bad sizes (n_src %lld n_dst %lld n_bdst %lld Q %lld E %lld)", op,
              (long long)ed->n_src, (long long)ed->n_dst, (long long)ed->n_bdst,
              (long long)ed->n_query, (long long)ed->n_edge);
    QC_ASSERT(!ed->r, "%s: precomputed r on CUDA (qc_attn_fused_takes_r is false)", op);
    QC_ASSERT(ed->query_row || ed->n_bdst * ed->n_query <= ed->n_dst,
              "%s: %lld queries but %lld x_dst rows", op, (long long)(ed->n_bdst * ed->n_query),
              (long long)ed->n_dst);
    const struct qc_attn_fused_tiles *t = ed->tiles;
    QC_ASSERT(t->b0 || t->ntile == 0, "%s: tiles not planned", op);
    QC_ASSERT(t->ntile == 0 ? ed->n_bdst == 0
                            : t->b0[t->ntile] == ed->n_bdst && t->e0[t->ntile] == ed->n_edge,
              "%s: tiles planned for another edge set (n_bdst %lld, E %lld)", op,
              (long long)ed->n_bdst, (long long)ed->n_edge);
    QC_ASSERT(l->has_pos == (ed->fe != NULL), "%s: has_pos %d but FE %s", op, (int)l->has_pos,
              ed->fe ? "given" : "missing");
    if (l->has_pos) {
        const struct qc_fe *fe = ed->fe;
        QC_ASSERT(fe->D == l->D && fe->F > 0 && fe->d >= 0 && fe->d <= QC_FE_MAX_D && fe->w,
                  "%s: FE D %lld F %lld d %lld (layer D %lld)", op, (long long)fe->D,
                  (long long)fe->F, (long long)fe->d, (long long)l->D);
        QC_ASSERT(fe->d > 0 || ed->cat_table, "%s: FE(0) needs a categorical table", op);
        QC_ASSERT(fe->d == 0 || ed->feat || ed->n_edge == 0, "%s: FE(%lld) needs edge features", op,
                  (long long)fe->d);
        QC_ASSERT(!ed->cat_table || (ed->cat_idx && ed->ncat > 0),
                  "%s: categorical table without indices (ncat %lld)", op, (long long)ed->ncat);
        QC_ASSERT(l->w_kr && l->w_vr && l->b_vr && l->ln_r_w && l->ln_r_b,
                  "%s: positional parameters missing", op);
    }
    QC_ASSERT(ed->n_edge == 0 || ed->src, "%s: NULL src", op);
}

int64_t qc_attn_fused_cuda_scratch_numel(const struct qc_attn_fused_layer *l,
                                         const struct qc_attn_fused_edges *ed, bool backward)
{
    fused_check(l, ed, "attn fused scratch");
    return fused_layout_make(l, ed, backward).total;
}

// ---- row math (host and device) -----------------------------------------------------------------
/* The per-thread bodies of the tile kernels are __host__ __device__: the kernels run them over
 * a grid-stride loop, and the *_host test seams (qc_attn_fused_cuda.h) run the very same code
 * on the CPU. The explicitly rounded fp32 operations (qc_f*_rn, qc_kernels.h) keep nvcc from
 * contracting a·b + c into an FMA on the device, so both follow the CPU fused path's operation
 * order exactly. */

#define FUSED_HD static inline __host__ __device__
/* unroll on the device (register arrays); the host pass of nvcc hands the loops to g++ as is */
#ifdef __CUDA_ARCH__
#    define FUSED_UNROLL _Pragma("unroll")
#else
#    define FUSED_UNROLL
#endif

/* Attention dropout of one application, by value for the kernels. p == 0: off. */
struct fused_drop {
    float p;       /* drop probability */
    float scale;   /* 1.0f / (1.0f - p), fp32 as the CPU computes it */
    uint64_t seed; /* Philox key */
    uint32_t step, block;
    int64_t base;       /* flat index of element (0, 0) of the site */
    const int64_t *key; /* (E) scene keys of the base edges (device), or NULL: flat indices */
};

static struct fused_drop fused_drop_make(const struct qc_dropout *d)
{
    struct fused_drop f = {0.0f, 1.0f, 0, 0, 0, 0, NULL};
    if (d && d->p > 0.0f) {
        QC_ASSERT(qc_dropout_valid(d), "attn fused cuda: dropout p %g", (double)d->p);
        f.p = d->p;
        f.scale = 1.0f / (1.0f - d->p);
        f.seed = d->seed;
        f.step = d->step;
        f.block = d->block;
        f.base = d->index_base;
        f.key = d->row_key;
    }
    return f;
}

/* α' of element `index`: identity when off, else keep ? a·scale : 0 (CPU fused_drop). */
FUSED_HD float fused_dropf(float a, const struct fused_drop &d, int64_t index)
{
    if (d.p == 0.0f)
        return a;
    return qc_dropout_keep(d.seed, d.step, d.block, index, d.p) ? qc_fmul_rn(a, d.scale) : 0.0f;
}

/* Σ_{c<Dh} x[c]·y[c] in the CPU's order (cpu/attn_fused.c, head_dots): with Dh a multiple of 8,
 * lane l adds the products of c ≡ l (mod 8) in ascending c and the 8 lanes are added in a fixed
 * pairwise tree; other Dh ascending c from +0 (x in registers). */
template <int MAXDH> FUSED_HD float fused_dot(const float (&x)[MAXDH], const float *y, int Dh)
{
    static_assert(MAXDH % 8 == 0, "fused_dot: MAXDH a multiple of the 8 lanes");
    if (Dh % 8 != 0) {
        float acc = 0.0f;
        FUSED_UNROLL
        for (int c = 0; c < MAXDH; c++)
            if (c < Dh)
                acc = qc_fadd_rn(acc, qc_fmul_rn(x[c], y[c]));
        return acc;
    }
    float lane[8];
    FUSED_UNROLL
    for (int l = 0; l < 8; l++)
        lane[l] = qc_fmul_rn(x[l], y[l]);
    FUSED_UNROLL
    for (int c0 = 8; c0 < MAXDH; c0 += 8)
        if (c0 < Dh) {
            FUSED_UNROLL
            for (int l = 0; l < 8; l++)
                lane[l] = qc_fadd_rn(lane[l], qc_fmul_rn(x[c0 + l], y[c0 + l]));
        }
    return qc_fadd_rn(qc_fadd_rn(qc_fadd_rn(lane[0], lane[1]), qc_fadd_rn(lane[2], lane[3])),
                      qc_fadd_rn(qc_fadd_rn(lane[4], lane[5]), qc_fadd_rn(lane[6], lane[7])));
}

/* Loads a head slice (Dh floats) into registers; the rest are 0. */
template <int MAXDH> FUSED_HD void fused_load(float (&x)[MAXDH], const float *p, int Dh)
{
    FUSED_UNROLL
    for (int c = 0; c < MAXDH; c++)
        x[c] = c < Dh ? p[c] : 0.0f;
}

/* Item k of a CSR in segment order (perm NULL = identity). */
FUSED_HD int64_t fused_item(const int64_t *perm, int64_t k)
{
    return perm ? perm[k] : k;
}

/* One tile of rows: base destinations [b0, b0 + nb), their edges from base edge e0 on in the
 * tile's kt, vt (tile edge, D). */
struct fused_tile {
    const int64_t *row_ptr;   /* (n_bdst+1) */
    const int64_t *query_row; /* (n_bdst*Q) or NULL */
    int64_t b0, nb, e0;       /* the tile */
    int64_t Q, E;             /* queries per base destination, base edges of the set */
    int H, Dh;                /* heads, per-head width */
    float scale;              /* score scale */
    struct fused_drop drop;   /* attention dropout */
};

FUSED_HD int64_t fused_qrow(const struct fused_tile &g, int64_t b, int64_t kq)
{
    return g.query_row ? g.query_row[b * g.Q + kq] : b * g.Q + kq;
}

/* The Philox index of α(query kq of base edge `edge`, head h): qc_dropout_index of the site's
 * flat element base + (kq·E + edge)·H + h, as the CPU computes it (keyed: rows E, reps Q, row_len
 * H, base 0, asserted by fused_tile_make). */
FUSED_HD int64_t fused_drop_at(const struct fused_tile &g, int64_t kq, int64_t edge, int h)
{
    if (g.drop.key)
        return qc_dropout_keyed_index(g.drop.key, g.Q, g.H, edge, kq, h);
    return g.drop.base + (kq * g.E + edge) * g.H + h;
}

/* Forward of work item t in [0, nb·Q·H): (b, k, h) = (b0 + t/(Q·H), t/H mod Q, t mod H).
 * u, M, S of query row i, head h OVERWRITE (CPU fused_row_forward, one head). */
template <int MAXDH>
FUSED_HD void fused_row_forward_at(int64_t t, const struct fused_tile &g, float *u, float *smax,
                                   float *ssum, const float *q, const float *kt, const float *vt)
{
    const int H = g.H, Dh = g.Dh;
    const int64_t D = (int64_t)H * Dh;
    const int h = (int)(t % H);
    const int64_t pair = t / H, kq = pair % g.Q, b = g.b0 + pair / g.Q;
    const int64_t eb = g.row_ptr[b], n = g.row_ptr[b + 1] - eb;
    const int64_t i = fused_qrow(g, b, kq);
    float *ui = u + i * D + h * Dh;
    if (n == 0) {
        smax[i * H + h] = 0.0f;
        ssum[i * H + h] = QC_SOFTMAX_EPS;
        for (int c = 0; c < Dh; c++)
            ui[c] = 0.0f;
        return;
    }
    float qh[MAXDH];
    fused_load<MAXDH>(qh, q + i * D + h * Dh, Dh);
    const float *kth = kt + (eb - g.e0) * D + h * Dh;
    const float *vth = vt + (eb - g.e0) * D + h * Dh;
    /* M: max of the scores (CPU: m = s[0]; m = s > m ? s : m) */
    float m = qc_fmul_rn(fused_dot<MAXDH>(qh, kth, Dh), g.scale);
    for (int64_t e = 1; e < n; e++) {
        const float s = qc_fmul_rn(fused_dot<MAXDH>(qh, kth + e * D, Dh), g.scale);
        m = s > m ? s : m;
    }
    /* S = Σ exp(s − M) in ascending edge, + eps */
    float sum = 0.0f;
    for (int64_t e = 0; e < n; e++) {
        const float s = qc_fmul_rn(fused_dot<MAXDH>(qh, kth + e * D, Dh), g.scale);
        sum = qc_fadd_rn(sum, expf(qc_fsub_rn(s, m)));
    }
    const float S = qc_fadd_rn(sum, QC_SOFTMAX_EPS);
    /* u = Σ dropout(exp(s − M)/S)·ṽ in ascending edge */
    float acc[MAXDH];
    FUSED_UNROLL
    for (int c = 0; c < MAXDH; c++)
        acc[c] = 0.0f;
    for (int64_t e = 0; e < n; e++) {
        const float s = qc_fmul_rn(fused_dot<MAXDH>(qh, kth + e * D, Dh), g.scale);
        const float a = fused_dropf(qc_fdiv_rn(expf(qc_fsub_rn(s, m)), S), g.drop,
                                    fused_drop_at(g, kq, eb + e, h));
        const float *ve = vth + e * D;
        FUSED_UNROLL
        for (int c = 0; c < MAXDH; c++)
            if (c < Dh)
                acc[c] = qc_fadd_rn(acc[c], qc_fmul_rn(a, ve[c]));
    }
    smax[i * H + h] = m;
    ssum[i * H + h] = S;
    FUSED_UNROLL
    for (int c = 0; c < MAXDH; c++)
        if (c < Dh)
            ui[c] = acc[c];
}

/* Backward of work item t in [0, nb·H): (b, h) = (b0 + t/H, t mod H) walks the Q queries of b
 * in ascending k (CPU fused_row_backward): dq of each query row (head h) OVERWRITE; dkt, dvt of
 * b's edges (head h's channels) ACCUM. Every written element has exactly one work item. */
template <int MAXDH>
FUSED_HD void fused_row_backward_at(int64_t t, const struct fused_tile &g, float *dq, float *dkt,
                                    float *dvt, const float *du, const float *smax,
                                    const float *ssum, const float *q, const float *kt,
                                    const float *vt)
{
    const int H = g.H, Dh = g.Dh;
    const int64_t D = (int64_t)H * Dh;
    const int h = (int)(t % H);
    const int64_t b = g.b0 + t / H;
    const int64_t eb = g.row_ptr[b], n = g.row_ptr[b + 1] - eb;
    const int64_t off = (eb - g.e0) * D + h * Dh;
    const float *kth = kt + off, *vth = vt + off;
    float *dkth = dkt + off, *dvth = dvt + off;
    for (int64_t kq = 0; kq < g.Q; kq++) {
        const int64_t i = fused_qrow(g, b, kq);
        float *dqi = dq + i * D + h * Dh;
        if (n == 0) {
            for (int c = 0; c < Dh; c++)
                dqi[c] = 0.0f;
            continue;
        }
        float qh[MAXDH], duh[MAXDH];
        fused_load<MAXDH>(qh, q + i * D + h * Dh, Dh);
        fused_load<MAXDH>(duh, du + i * D + h * Dh, Dh);
        const float m = smax[i * H + h], S = ssum[i * H + h];
        /* dot = Σ_e α·dα (ascending e); dα = dropout'(du·ṽ), w.r.t. the pre-dropout α */
        float dot = 0.0f;
        for (int64_t e = 0; e < n; e++) {
            const float s = qc_fmul_rn(fused_dot<MAXDH>(qh, kth + e * D, Dh), g.scale);
            const float alpha = qc_fdiv_rn(expf(qc_fsub_rn(s, m)), S);
            const float da = fused_dropf(fused_dot<MAXDH>(duh, vth + e * D, Dh), g.drop,
                                         fused_drop_at(g, kq, eb + e, h));
            dot = qc_fadd_rn(dot, qc_fmul_rn(alpha, da));
        }
        float dqa[MAXDH];
        FUSED_UNROLL
        for (int c = 0; c < MAXDH; c++)
            dqa[c] = 0.0f;
        for (int64_t e = 0; e < n; e++) {
            const float *ke = kth + e * D;
            const float s = qc_fmul_rn(fused_dot<MAXDH>(qh, ke, Dh), g.scale);
            const float alpha = qc_fdiv_rn(expf(qc_fsub_rn(s, m)), S);
            const float ad = fused_dropf(alpha, g.drop, fused_drop_at(g, kq, eb + e, h));
            const float da = fused_dropf(fused_dot<MAXDH>(duh, vth + e * D, Dh), g.drop,
                                         fused_drop_at(g, kq, eb + e, h));
            const float gs =
                qc_fmul_rn(qc_fmul_rn(alpha, qc_fsub_rn(da, dot)), g.scale); /* dscore·scale */
            float *dke = dkth + e * D, *dve = dvth + e * D;
            FUSED_UNROLL
            for (int c = 0; c < MAXDH; c++) {
                if (c < Dh) {
                    dqa[c] = qc_fadd_rn(dqa[c], qc_fmul_rn(gs, ke[c]));
                    dke[c] = qc_fadd_rn(dke[c], qc_fmul_rn(gs, qh[c]));
                    dve[c] = qc_fadd_rn(dve[c], qc_fmul_rn(ad, duh[c]));
                }
            }
        }
        FUSED_UNROLL
        for (int c = 0; c < MAXDH; c++)
            if (c < Dh)
                dqi[c] = dqa[c];
    }
}

/* First position k in [ptr[j], ptr[j+1]) of source j's list with item >= e0 (binary search;
 * items ascend within a source). */
FUSED_HD int64_t fused_src_first(const int64_t *ptr, const int64_t *perm, int64_t j, int64_t e0)
{
    int64_t lo = ptr[j], hi = ptr[j + 1];
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (fused_item(perm, mid) < e0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Channel c of source j: dk[j,c] += Σ dkt[e − e0, c], dv likewise, over j's edges e in the tile
 * [e0, e1), ascending e, starting at position k0 = fused_src_first(.., j, e0). */
FUSED_HD void fused_scatter_at(int64_t j, int64_t c, int64_t k0, float *dk, float *dv,
                               const float *dkt, const float *dvt, const int64_t *ptr,
                               const int64_t *perm, int64_t e0, int64_t e1, int64_t D)
{
    const int64_t end = ptr[j + 1];
    float ak = dk[j * D + c], av = dv[j * D + c];
    for (int64_t k = k0; k < end; k++) {
        const int64_t e = fused_item(perm, k);
        if (e >= e1)
            break;
        ak = qc_fadd_rn(ak, dkt[(e - e0) * D + c]);
        av = qc_fadd_rn(av, dvt[(e - e0) * D + c]);
    }
    dk[j * D + c] = ak;
    dv[j * D + c] = av;
}

/* Source j of tile edge e in [e0, e1) when e is j's first edge in the tile (the smallest of j's
 * edges >= e0), with *k0 its position in j's list; -1 otherwise. Each source with an edge in
 * the tile then has exactly one owner, found from the tile's own edges: the scatter costs
 * O(tile edges · log degree), not O(all sources) per tile. */
FUSED_HD int64_t fused_scatter_owner(int64_t e, const int64_t *src, const int64_t *ptr,
                                     const int64_t *perm, int64_t e0, int64_t *k0)
{
    const int64_t j = src[e];
    const int64_t k = fused_src_first(ptr, perm, j, e0);
    if (k == ptr[j + 1] || fused_item(perm, k) != e)
        return -1;
    *k0 = k;
    return j;
}

// ---- kernels ------------------------------------------------------------------------------------

/* Empty-row statistics: M = 0, S = QC_SOFTMAX_EPS (n = n_dst·H). */
static __global__ void fused_stats_init_kernel(float *smax, float *ssum, int64_t n)
{
    for (int64_t t = cuda_tid(); t < n; t += cuda_nthreads()) {
        smax[t] = 0.0f;
        ssum[t] = QC_SOFTMAX_EPS;
    }
}

template <int MAXDH>
static __global__ void fused_rows_forward_kernel(struct fused_tile g, float *u, float *smax,
                                                 float *ssum, const float *q, const float *kt,
                                                 const float *vt)
{
    const int64_t total = g.nb * g.Q * g.H;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads())
        fused_row_forward_at<MAXDH>(t, g, u, smax, ssum, q, kt, vt);
}

template <int MAXDH>
static __global__ void fused_rows_backward_kernel(struct fused_tile g, float *dq, float *dkt,
                                                  float *dvt, const float *du, const float *smax,
                                                  const float *ssum, const float *q,
                                                  const float *kt, const float *vt)
{
    const int64_t total = g.nb * g.H;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads())
        fused_row_backward_at<MAXDH>(t, g, dq, dkt, dvt, du, smax, ssum, q, kt, vt);
}

#define SCATTER_WARPS 8 /* tile edges (warps) per block */

/* One warp per tile edge e; the warp of the edge that owns its source (fused_scatter_owner)
 * adds that source's tile rows, lanes over channels. */
static __global__ void fused_scatter_src_kernel(float *dk, float *dv, const float *dkt,
                                                const float *dvt, const int64_t *src,
                                                const int64_t *ptr, const int64_t *perm, int64_t e0,
                                                int64_t e1, int64_t D)
{
    const int lane = threadIdx.x & 31;
    for (int64_t e = e0 + (int64_t)blockIdx.x * SCATTER_WARPS + (threadIdx.x >> 5); e < e1;
         e += (int64_t)gridDim.x * SCATTER_WARPS) {
        int64_t k0 = 0;
        const int64_t j = fused_scatter_owner(e, src, ptr, perm, e0, &k0);
        if (j < 0)
            continue; /* another edge of the tile owns j */
        for (int64_t c = lane; c < D; c += 32)
            fused_scatter_at(j, c, k0, dk, dv, dkt, dvt, ptr, perm, e0, e1, D);
    }
}

/* Launches the row kernel of the right register width for Dh. */
static void fused_rows_forward_launch(const struct fused_tile &g, float *u, float *smax,
                                      float *ssum, const float *q, const float *kt, const float *vt,
                                      cudaStream_t stream)
{
    const int64_t n = g.nb * g.Q * g.H;
    const unsigned int grid = cuda_blocks(n, CUDA_BLOCK);
    if (g.Dh <= 16)
        fused_rows_forward_kernel<16><<<grid, CUDA_BLOCK, 0, stream>>>(g, u, smax, ssum, q, kt, vt);
    else
        fused_rows_forward_kernel<QC_ATTN_FUSED_CUDA_MAX_DH>
            <<<grid, CUDA_BLOCK, 0, stream>>>(g, u, smax, ssum, q, kt, vt);
    QC_CUDA_LAUNCH_CHECK();
}

static void fused_rows_backward_launch(const struct fused_tile &g, float *dq, float *dkt,
                                       float *dvt, const float *du, const float *smax,
                                       const float *ssum, const float *q, const float *kt,
                                       const float *vt, cudaStream_t stream)
{
    const int64_t n = g.nb * g.H;
    const unsigned int grid = cuda_blocks(n, CUDA_BLOCK);
    if (g.Dh <= 16)
        fused_rows_backward_kernel<16>
            <<<grid, CUDA_BLOCK, 0, stream>>>(g, dq, dkt, dvt, du, smax, ssum, q, kt, vt);
    else
        fused_rows_backward_kernel<QC_ATTN_FUSED_CUDA_MAX_DH>
            <<<grid, CUDA_BLOCK, 0, stream>>>(g, dq, dkt, dvt, du, smax, ssum, q, kt, vt);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- test seams: the row bodies on the host ----------------------------------------------------

static struct fused_tile fused_tile_make(const int64_t *row_ptr, const int64_t *query_row,
                                         int64_t b0, int64_t nb, int64_t e0, int64_t Q, int64_t E,
                                         int64_t H, int64_t Dh, float scale,
                                         const struct qc_dropout *drop)
{
    QC_ASSERT(H > 0 && Dh > 0 && Dh <= QC_ATTN_FUSED_CUDA_MAX_DH && Q >= 1 && nb >= 0,
              "attn fused tile: H %lld Dh %lld Q %lld nb %lld", (long long)H, (long long)Dh,
              (long long)Q, (long long)nb);
    struct fused_tile g;
    g.row_ptr = row_ptr;
    g.query_row = query_row;
    g.b0 = b0;
    g.nb = nb;
    g.e0 = e0;
    g.Q = Q;
    g.E = E;
    g.H = (int)H;
    g.Dh = (int)Dh;
    g.scale = scale;
    g.drop = fused_drop_make(drop);
    QC_ASSERT(!g.drop.key || (drop->index_base == 0 && drop->rows == E && drop->reps == Q &&
                              drop->row_len == H),
              "attn fused tile: scene-keyed dropout over %lld x %lld x %lld, not the site's "
              "(%lld, %lld, %lld) from 0",
              (long long)drop->reps, (long long)drop->rows, (long long)drop->row_len, (long long)Q,
              (long long)E, (long long)H);
    return g;
}

void qc_attn_fused_tile_forward_host(float *u, float *smax, float *ssum, const float *q,
                                     const float *kt, const float *vt, const int64_t *row_ptr,
                                     const int64_t *query_row, int64_t b0, int64_t nb, int64_t e0,
                                     int64_t Q, int64_t E, int64_t H, int64_t Dh, float scale,
                                     const struct qc_dropout *drop)
{
    const struct fused_tile g =
        fused_tile_make(row_ptr, query_row, b0, nb, e0, Q, E, H, Dh, scale, drop);
    for (int64_t t = 0; t < nb * Q * H; t++) {
        if (Dh <= 16)
            fused_row_forward_at<16>(t, g, u, smax, ssum, q, kt, vt);
        else
            fused_row_forward_at<QC_ATTN_FUSED_CUDA_MAX_DH>(t, g, u, smax, ssum, q, kt, vt);
    }
}

void qc_attn_fused_tile_backward_host(float *dq, float *dkt, float *dvt, const float *du,
                                      const float *smax, const float *ssum, const float *q,
                                      const float *kt, const float *vt, const int64_t *row_ptr,
                                      const int64_t *query_row, int64_t b0, int64_t nb, int64_t e0,
                                      int64_t Q, int64_t E, int64_t H, int64_t Dh, float scale,
                                      const struct qc_dropout *drop)
{
    const struct fused_tile g =
        fused_tile_make(row_ptr, query_row, b0, nb, e0, Q, E, H, Dh, scale, drop);
    for (int64_t t = 0; t < nb * H; t++) {
        if (Dh <= 16)
            fused_row_backward_at<16>(t, g, dq, dkt, dvt, du, smax, ssum, q, kt, vt);
        else
            fused_row_backward_at<QC_ATTN_FUSED_CUDA_MAX_DH>(t, g, dq, dkt, dvt, du, smax, ssum, q,
                                                             kt, vt);
    }
}

void qc_attn_fused_tile_scatter_host(float *dk, float *dv, const float *dkt, const float *dvt,
                                     struct qc_csr by_src, int64_t e0, int64_t e1, int64_t D)
{
    QC_ASSERT(by_src.seg, "attn fused scatter host: by_src.seg (the source of each edge) missing");
    for (int64_t e = e0; e < e1; e++) { /* the kernel's walk: owners among the tile's edges */
        int64_t k0 = 0;
        const int64_t j = fused_scatter_owner(e, by_src.seg, by_src.ptr, by_src.perm, e0, &k0);
        if (j < 0)
            continue;
        for (int64_t c = 0; c < D; c++)
            fused_scatter_at(j, c, k0, dk, dv, dkt, dvt, by_src.ptr, by_src.perm, e0, e1, D);
    }
}

// ---- per-tile edge work (host)
// -------------------------------------------------------------------

/* r (te,D) = FE(feat [+ cat]) of base edges [e0, e0 + te), filling the FE stash pieces of the
 * layout: qc_fourier_forward's sequence of ops. */
static void fe_tile_forward(float *ws, const struct fused_layout *L,
                            const struct qc_attn_fused_edges *ed, int64_t e0, int64_t te,
                            cudaStream_t stream)
{
    const struct qc_fe *fe = ed->fe;
    const float *w = fe->w;
    const int64_t D = fe->D, F = fe->F, d = fe->d, P = 2 * F + 1;
    float *s = ws + L->s, *tmp = ws + L->tmp, *o = ws + L->o;
    if (d > 0) {
        float *phi = ws + L->phi;
        qc_fourier_features_forward_cuda(phi, ed->feat + e0 * d, w + fe->o_freqs, te, d, F, stream);
        for (int64_t i = 0; i < d; i++) {
            float *z = ws + L->z[i], *a = ws + L->a[i];
            qc_linear_forward_cuda(z, phi + i * P, d * P, w + fe->o_w1[i], w + fe->o_b1[i], te, P,
                                   D, false, stream);
            qc_layernorm_forward_cuda(a, ws + L->mean[i], ws + L->rstd[i], z, w + fe->o_lnw[i],
                                      w + fe->o_lnb[i], te, D, stream);
            qc_relu_forward_cuda(a, a, te * D, stream);
            /* s = h_0 + h_1 + … in ascending i */
            if (i == 0) {
                qc_linear_forward_cuda(s, a, D, w + fe->o_w2[i], w + fe->o_b2[i], te, D, D, false,
                                       stream);
            } else {
                qc_linear_forward_cuda(tmp, a, D, w + fe->o_w2[i], w + fe->o_b2[i], te, D, D, false,
                                       stream);
                qc_add_forward_cuda(s, s, tmp, te * D, stream);
            }
        }
        if (ed->cat_table) {
            qc_embedding_forward_cuda(tmp, ed->cat_idx + e0, ed->cat_table, te, D, ed->ncat,
                                      stream);
            qc_add_forward_cuda(s, s, tmp, te * D, stream);
        }
    } else {
        qc_embedding_forward_cuda(s, ed->cat_idx + e0, ed->cat_table, te, D, ed->ncat, stream);
    }
    qc_layernorm_forward_cuda(o, ws + L->s_mean, ws + L->s_rstd, s, w + fe->o_out_lnw,
                              w + fe->o_out_lnb, te, D, stream);
    qc_relu_forward_cuda(o, o, te * D, stream);
    qc_linear_forward_cuda(ws + L->r, o, D, w + fe->o_out_w, w + fe->o_out_b, te, D, D, false,
                           stream);
}

/* FE backward of the tile from dr (te,D): fe->dw and dcat_table ACCUM; qc_fourier_backward's
 * sequence of ops. dho, ds, da: (te,D) temporaries. */
static void fe_tile_backward(float *ws, const struct fused_layout *L,
                             const struct qc_attn_fused_edges *ed, const float *dr, float *dho,
                             float *ds, float *da, int64_t e0, int64_t te, cudaStream_t stream)
{
    const struct qc_fe *fe = ed->fe;
    const float *w = fe->w;
    float *dw = fe->dw;
    const int64_t D = fe->D, F = fe->F, d = fe->d, P = 2 * F + 1;
    const float *o = ws + L->o;
    qc_linear_backward_cuda(dho, D, dw + fe->o_out_w, dw + fe->o_out_b, dr, o, D, w + fe->o_out_w,
                            te, D, D, false, stream);
    qc_relu_backward_cuda(dho, dho, o, te * D, stream);
    qc_layernorm_backward_cuda(ds, dw + fe->o_out_lnw, dw + fe->o_out_lnb, dho, ws + L->s,
                               ws + L->s_mean, ws + L->s_rstd, w + fe->o_out_lnw, te, D, false,
                               stream);
    if (ed->cat_table && ed->dcat_table)
        qc_embedding_backward_cuda(ed->dcat_table, ds, ed->cat_idx + e0, te, D, ed->ncat, stream);
    if (d == 0)
        return;
    const float *phi = ws + L->phi;
    float *dphi = ws + L->dphi;
    for (int64_t i = 0; i < d; i++) {
        const float *a = ws + L->a[i];
        qc_linear_backward_cuda(da, D, dw + fe->o_w2[i], dw + fe->o_b2[i], ds, a, D,
                                w + fe->o_w2[i], te, D, D, false, stream);
        qc_relu_backward_cuda(da, da, a, te * D, stream);
        qc_layernorm_backward_cuda(dho, dw + fe->o_lnw[i], dw + fe->o_lnb[i], da, ws + L->z[i],
                                   ws + L->mean[i], ws + L->rstd[i], w + fe->o_lnw[i], te, D, false,
                                   stream);
        qc_linear_backward_cuda(dphi + i * P, d * P, dw + fe->o_w1[i], dw + fe->o_b1[i], dho,
                                phi + i * P, d * P, w + fe->o_w1[i], te, P, D, false, stream);
    }
    qc_fourier_features_backward_cuda(NULL, dw + fe->o_freqs, dphi, ed->feat + e0 * d,
                                      w + fe->o_freqs, te, d, F, stream);
}

/* k̃, ṽ (and, with pos, r, r̂ and the FE stash) of base edges [e0, e0 + te) into the scratch.
 * Deterministic: the same call reproduces the same bits (backward relies on it). */
static void fused_tile_edges(float *ws, const struct fused_layout *L, const float *k,
                             const float *v, const struct qc_attn_fused_layer *l,
                             const struct qc_attn_fused_edges *ed, int64_t e0, int64_t te,
                             cudaStream_t stream)
{
    const int64_t D = l->D;
    float *kt = ws + L->kt, *vt = ws + L->vt;
    qc_gather_rows_forward_cuda(kt, k, ed->src + e0, te, D, false, stream);
    qc_gather_rows_forward_cuda(vt, v, ed->src + e0, te, D, false, stream);
    if (!l->has_pos)
        return;
    fe_tile_forward(ws, L, ed, e0, te, stream);
    float *rhat = ws + L->rhat;
    qc_layernorm_forward_cuda(rhat, ws + L->rmean, ws + L->rrstd, ws + L->r, l->ln_r_w, l->ln_r_b,
                              te, D, stream);
    qc_linear_forward_cuda(kt, rhat, D, l->w_kr, NULL, te, D, D, true, stream);
    qc_linear_forward_cuda(vt, rhat, D, l->w_vr, l->b_vr, te, D, D, true, stream);
}

// ---- launchers ----------------------------------------------------------------------------------

void qc_attn_fused_forward_cuda(float *u, float *smax, float *ssum, const float *q, const float *k,
                                const float *v, const struct qc_attn_fused_layer *l,
                                const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                                float *scratch, cudaStream_t stream)
{
    fused_check(l, ed, "attn fused fwd cuda");
    const int64_t Nd = ed->n_dst, D = l->D, H = l->H, Q = ed->n_query, E = ed->n_edge;
    if (Nd == 0)
        return;
    QC_ASSERT(u && smax && ssum && q, "attn fused fwd cuda: NULL output or q");
    /* every row starts empty: rows no query names keep u = 0, M = 0, S = eps */
    QC_CUDA_ASSERT(cudaMemsetAsync(u, 0, (size_t)(Nd * D) * sizeof(float), stream));
    fused_stats_init_kernel<<<cuda_blocks(Nd * H, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(smax, ssum,
                                                                                        Nd * H);
    QC_CUDA_LAUNCH_CHECK();
    if (E == 0)
        return;
    QC_ASSERT(k && v && scratch, "attn fused fwd cuda: NULL k, v or scratch");
    const struct fused_layout L = fused_layout_make(l, ed, false);
    const struct qc_attn_fused_tiles *t = ed->tiles;
    for (int64_t ti = 0; ti < t->ntile; ti++) {
        const int64_t b0 = t->b0[ti], nb = t->b0[ti + 1] - b0;
        const int64_t e0 = t->e0[ti], te = t->e0[ti + 1] - e0;
        if (te == 0)
            continue; /* only empty rows: already initialised */
        fused_tile_edges(scratch, &L, k, v, l, ed, e0, te, stream);
        const struct fused_tile g =
            fused_tile_make(ed->row_ptr, ed->query_row, b0, nb, e0, Q, E, H, l->Dh, l->scale, drop);
        fused_rows_forward_launch(g, u, smax, ssum, q, scratch + L.kt, scratch + L.vt, stream);
    }
}

void qc_attn_fused_backward_cuda(float *dq, float *dk, float *dv, const float *du,
                                 const float *smax, const float *ssum, const float *q,
                                 const float *k, const float *v,
                                 const struct qc_attn_fused_layer *l,
                                 const struct qc_attn_fused_edges *ed,
                                 const struct qc_dropout *drop, float *scratch, cudaStream_t stream)
{
    fused_check(l, ed, "attn fused bwd cuda");
    const int64_t Nd = ed->n_dst, Ns = ed->n_src, D = l->D, H = l->H, Q = ed->n_query;
    const int64_t E = ed->n_edge;
    if (Nd == 0)
        return;
    QC_ASSERT(dq, "attn fused bwd cuda: NULL dq");
    QC_CUDA_ASSERT(cudaMemsetAsync(dq, 0, (size_t)(Nd * D) * sizeof(float), stream));
    if (E == 0)
        return;
    QC_ASSERT(dk && dv && du && smax && ssum && q && k && v && scratch,
              "attn fused bwd cuda: NULL tensor");
    QC_ASSERT(ed->by_src.ptr && ed->by_src.nseg == Ns && ed->by_src.nitem == E,
              "attn fused bwd cuda: by-source CSR missing or of another shape (nseg %lld, "
              "nitem %lld; expected %lld, %lld)",
              (long long)ed->by_src.nseg, (long long)ed->by_src.nitem, (long long)Ns, (long long)E);
    if (l->has_pos) {
        QC_ASSERT(ed->fe->dw, "attn fused bwd cuda: FE gradients not bound");
        QC_ASSERT(l->dw_kr && l->dw_vr && l->db_vr && l->dln_r_w && l->dln_r_b,
                  "attn fused bwd cuda: positional parameter gradients missing");
    }
    const struct fused_layout L = fused_layout_make(l, ed, true);
    const struct qc_attn_fused_tiles *t = ed->tiles;
    float *ws = scratch;
    float *kt = ws + L.kt, *vt = ws + L.vt, *dkt = ws + L.dkt, *dvt = ws + L.dvt;
    for (int64_t ti = 0; ti < t->ntile; ti++) {
        const int64_t b0 = t->b0[ti], nb = t->b0[ti + 1] - b0;
        const int64_t e0 = t->e0[ti], te = t->e0[ti + 1] - e0;
        if (te == 0)
            continue; /* only empty rows: dq already 0, no edge gradient */
        fused_tile_edges(ws, &L, k, v, l, ed, e0, te, stream);
        QC_CUDA_ASSERT(cudaMemsetAsync(dkt, 0, (size_t)(te * D) * sizeof(float), stream));
        QC_CUDA_ASSERT(cudaMemsetAsync(dvt, 0, (size_t)(te * D) * sizeof(float), stream));
        const struct fused_tile g =
            fused_tile_make(ed->row_ptr, ed->query_row, b0, nb, e0, Q, E, H, l->Dh, l->scale, drop);
        fused_rows_backward_launch(g, dq, dkt, dvt, du, smax, ssum, q, kt, vt, stream);
        /* dk[src] += dk̃, dv[src] += dṽ (ascending edge per source) */
        if (Ns > 0) { /* over the tile's edges, not all sources */
            fused_scatter_src_kernel<<<cuda_blocks(te, SCATTER_WARPS), SCATTER_WARPS * 32, 0,
                                       stream>>>(dk, dv, dkt, dvt, ed->src, ed->by_src.ptr,
                                                 ed->by_src.perm, e0, e0 + te, D);
            QC_CUDA_LAUNCH_CHECK();
        }
        if (!l->has_pos)
            continue;
        /* k̃ = k[src] + r̂·W_krᵀ, ṽ = v[src] + r̂·W_vrᵀ + b_vr: dr̂, dW_kr, dW_vr, db_vr */
        float *rhat = ws + L.rhat, *drhat = ws + L.drhat;
        qc_linear_backward_cuda(drhat, D, l->dw_kr, NULL, dkt, rhat, D, l->w_kr, te, D, D, false,
                                stream);
        qc_linear_backward_cuda(drhat, D, l->dw_vr, l->db_vr, dvt, rhat, D, l->w_vr, te, D, D, true,
                                stream);
        /* dr goes into r̂'s buffer: r̂ is dead after the two linears, r is read by LN_r's
         * backward (the CPU's aliasing) */
        float *dr = rhat;
        qc_layernorm_backward_cuda(dr, l->dln_r_w, l->dln_r_b, drhat, ws + L.r, ws + L.rmean,
                                   ws + L.rrstd, l->ln_r_w, te, D, false, stream);
        /* k̃, ṽ and tmp are dead: the FE backward's temporaries */
        fe_tile_backward(ws, &L, ed, dr, kt, vt, ws + L.tmp, e0, te, stream);
    }
}
