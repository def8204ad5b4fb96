/*
 * blocks_internal.h — helpers shared by the block files of src/model (never included from
 * outside this folder): scratch allocation and the attention layer's node-level half, which
 * both attention implementations run around their edge part (attention_common.c), and the edge
 * context's index arrays they read (attention_index.c).
 */
#ifndef QC_MODEL_BLOCKS_INTERNAL_H
#define QC_MODEL_BLOCKS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "qc_attention.h"
#include "qc_exec.h"
#include "qc_fourier.h"
#include "qc_fourier_embed.h" /* struct qc_fe */
#include "qc_kernels.h"
#include "qc_memspec.h"
#include "qc_prof.h"
#include "qc_stash.h"
#include "qc_status.h"

// ---- scratch ------------------------------------------------------------------------------

/* n floats (n may be 0) from the block's hook (qc_block_alloc, tag "<block>/<tensor>"),
 * 64-byte aligned, uninitialised; NULL on failure. Give back with blk_ffree(bm, p, n). */
float *blk_falloc(const struct qc_block_mem *bm, int64_t n, const char *tensor);
/* Same, zero-filled (with qc_op_zero on the block's backend). */
float *blk_fcalloc(const struct qc_block_mem *bm, int64_t n, const char *tensor);
/* Gives back n floats from blk_falloc / blk_fcalloc (NULL is a no-op). */
void blk_ffree(const struct qc_block_mem *bm, float *p, int64_t n);
/* The status for a failed scratch allocation of n floats in `what` of block bm. */
enum qc_status blk_nomem(const struct qc_block_mem *bm, const char *what, int64_t n);

// ---- profiler ------------------------------------------------------------------------------

/* The profiler's block span (qc_prof.h) of one block call: name = bm's name + suffix; the ops
 * inside carry it and the pass. Call only when qc_prof_on(). */
void blk_prof_begin(struct qc_prof_mark *m, const struct qc_block_mem *bm, const char *suffix,
                    enum qc_prof_pass pass);
static inline void blk_prof_end(const struct qc_prof_mark *m)
{
    qc_prof_span_end(m, QC_PROF_CAT_BLOCK, NULL, 0);
}

// ---- FourierEmbedding as the kernels see it ----------------------------------------------

/* The composite op's descriptor (kernels/qc_fourier_embed.h) of fe: its shape, parameter
 * offsets and bound buffers. */
void fourier_desc(const struct qc_fourier *fe, struct qc_fe *out);
/* Floats of the FE's forward (backward: backward's) scratch over N rows (0 when N is 0). */
int64_t fourier_scratch_floats(const struct qc_fourier *fe, int64_t N, bool backward);

// ---- attention: stash layout of one application ---------------------------------------------

struct attn_app_idx {
    int xhat_d, ln_dst_mean, ln_dst_rstd; /* (Nd,D), (Nd), (Nd) */
    int u, g, sres, a;                    /* (Nd,D) aggregation, gate, to_s(x̂_d), to_out output */
    int post_mean, post_rstd, x1;         /* LN_post stats, x1 = x0 + LN_post(a) */
    int ffpre_mean, ffpre_rstd, y, h1;    /* ff_prenorm stats and output, ReLU output (Nd,FF) */
    int f, ffpost_mean, ffpost_rstd;      /* FFN output (ff_postnorm input) and stats */
    int q;                                /* FUSED: q (Nd,D) */
    int smax, ssum;                       /* FUSED: softmax max and sum (Nd,H) */
    int qi, alpha;                        /* UNFUSED: q_i (Q*E,D), α (Q*E,H) */
};

/* Looks every entry up by name (-1 when absent). */
void attn_app_index(const struct qc_stash *st, struct attn_app_idx *ix);

/* x̂_d = LN_dst(x_dst) into the stash, q = x̂_d·W_qᵀ + b_q into q (Nd,D). */
void attn_node_forward_pre(const struct qc_attn *l, float *q, const struct qc_stash *st,
                           const struct attn_app_idx *ix, const float *x_dst, int64_t Nd);
/* The node-level half (steps 9–13) runs over the destination rows in chunks of
 * attn_post_rows(D, FF) rows, so that its scratch (AMS_POST) is a chunk's, not Nd rows': the
 * backward's 8·D + 2·FF floats per row were the largest working set of an attention backward
 * (59 MiB of the a2a layers' at AV2 size, 4 scenes; docs/BENCHMARKS.md, "The attention's
 * node-level half in row chunks"). A chunk's backward scratch is at most
 * QC_ATTN_POST_CHUNK_BYTES (at least 64 rows); the parameter gradients accumulate chunk by
 * chunk in row order, the same on every backend and under every stash policy. */
#define QC_ATTN_POST_CHUNK_BYTES ((int64_t)16 << 20)
int64_t attn_post_rows(int64_t D, int64_t FF);
/* The layer's rows per chunk: l->post_rows when set, else attn_post_rows(D, FF). */
static inline int64_t attn_post_rows_of(const struct qc_attn *l)
{
    return l->post_rows > 0 ? l->post_rows : attn_post_rows(l->D, l->FF);
}
/* Steps 9–13 of QCNET.md §3.3 from u (in the stash) to out (scratch: ms's AMS_POST). */
enum qc_status attn_node_forward_post(const struct qc_attn *l, float *out,
                                      const struct qc_stash *st, const struct attn_app_idx *ix,
                                      const float *x_dst, int64_t Nd, const struct qc_attn_ctx *ctx,
                                      struct qc_memspec *ms);
/* Backward of steps 9–13: du (Nd,D) OVERWRITE, dxhat (Nd,D) OVERWRITE (the x̂_d gradient from
 * the gate and to_s), dx_dst (Nd,D) OVERWRITE (the residual path). */
enum qc_status attn_node_backward_post(const struct qc_attn *l, float *du, float *dxhat,
                                       float *dx_dst, const float *dout, const struct qc_stash *st,
                                       const struct attn_app_idx *ix, int64_t Nd,
                                       const struct qc_attn_ctx *ctx, struct qc_memspec *ms);
/* Backward of the query projection and LN_dst: dxhat += dq·W_q; dx_dst += LN_dst'(dxhat).
 * dxhat is clobbered. */
void attn_node_backward_pre(const struct qc_attn *l, float *dx_dst, float *dxhat, const float *dq,
                            const struct qc_stash *st, const struct attn_app_idx *ix,
                            const float *x_dst, int64_t Nd);

// ---- attention: the graph on the host -----------------------------------------------------

/* Host copies of the graph's index arrays: the mirror where set, else the array itself (which
 * is then host memory: CPU backend). Host code reads only these. */
static inline const int64_t *attn_row_ptr_host(const struct qc_attn_graph *g)
{
    return g->row_ptr_host ? g->row_ptr_host : g->row_ptr;
}
static inline const int64_t *attn_src_host(const struct qc_attn_graph *g)
{
    return g->src_host ? g->src_host : g->src;
}
static inline const int64_t *attn_query_row_host(const struct qc_attn_graph *g)
{
    return g->query_row_host ? g->query_row_host : g->query_row;
}

/* A graph used on backend ex must have the host mirrors its host side reads (programmer
 * error otherwise: the layers would read device memory on the host). */
static inline void attn_graph_require_host(const struct qc_attn_graph *g, const struct qc_exec *ex)
{
    if (!qc_exec_is_device(ex))
        return;
    QC_ASSERT(g->row_ptr_host && (g->n_edge == 0 || g->src_host) &&
                  (!g->query_row || g->query_row_host),
              "attention graph on the %s backend without its host mirrors (row_ptr_host %s, "
              "src_host %s, query_row_host %s): set them to host copies of the index arrays",
              qc_exec_backend_str(qc_exec_backend_of(ex)), g->row_ptr_host ? "set" : "missing",
              g->src_host ? "set" : "missing",
              g->query_row_host ? "set" : (g->query_row ? "missing" : "not needed"));
}

/* x_dst row of query (b,k), from the host copy. */
static inline int64_t attn_query_row(const struct qc_attn_graph *g, int64_t b, int64_t k)
{
    const int64_t *qr = attn_query_row_host(g);
    return qr ? qr[b * g->n_query + k] : b * g->n_query + k;
}

// ---- attention: memory specs (qc_memspec.h) ------------------------------------------------

/* The ids of the attention blocks' spec tensors (one set for every pass and implementation). */
enum attn_ms_id {
    AMS_BDST = 0, /* edges.bdst (E) int64, home ed->bdst */
    AMS_QINDEX,   /* edges.query_index, home ed->qindex (UNFUSED) */
    AMS_BY_SRC,   /* edges.csr_by_src, home ed->by_src */
    AMS_DR,       /* edges.dr (E,D), home ed->dr */
    AMS_CAT,      /* the edge context's categorical temporary (forward) or its gradient */
    AMS_FE_TILES, /* the tiled FE's scratch of a shared r */
    AMS_DXHAT,    /* kv_backward.dxhat_s (n_src,D) */
    AMS_DK,       /* the kv gradient buffers: FUSED dk (n_src,D), UNFUSED dkt (E,D) */
    AMS_DV,       /* FUSED dv, UNFUSED dvt */
    AMS_TMP,      /* UNFUSED kv: k and v (forward) or their gradients (backward) */
    AMS_DRHAT,    /* UNFUSED kv_backward.drhat (E,D) */
    AMS_Q,        /* UNFUSED forward.q (n_dst,D) */
    AMS_EDGE,     /* the application's edge part: UNFUSED per-query buffers, FUSED tile scratch */
    AMS_POST,     /* the node-level half's scratch (forward_post / backward_post) */
    AMS_T,        /* backward.du_dxhat_dq (3 n_dst,D) */
};

/* Adds the CSR by source (ed->by_src) when the context has none yet. */
void attn_by_src_spec(struct qc_attn_edges *ed, struct qc_memspec *s);
/* Adds dL/dr (ed->dr, zeroed) when the context has none yet. */
void attn_dr_spec(struct qc_attn_edges *ed, struct qc_memspec *s);
/* Adds kv's gradient buffers (zeroed) when it has none yet. */
void attn_kv_grads_spec(struct qc_attn_kv *kv, struct qc_memspec *s);
/* Appends the edge part of an application's backward (its implementation's: the kv gradient
 * buffers the first backward makes, the CSR by source and dL/dr where they are made, the
 * scratch) to s: what attn_*_edge_backward take. */
void attn_edge_backward_spec(struct qc_attn_kv *kv, struct qc_memspec *s);
/* FUSED: floats of the edge op's scratch for one application on kv (the tile plan cached in the
 * edge context); 0 when the tile plan cannot be made (its error is then the real call's). */
int64_t attn_fused_scratch_numel(const struct qc_attn_kv *kv, bool backward);
/* FUSED with shared r: floats of the tiled FE's scratch over the edge set. */
int64_t attn_fused_fe_tiles_numel(const struct qc_attn_edges *ed, bool backward);

/* FUSED: the edge context computes r = FE(feat [+ cat]) once and its layers share it (the
 * backend's op takes r: qc_attn_fused_takes_r); else each tile computes its own. */
static inline bool attn_edges_shares_r(const struct qc_attn_edges *ed)
{
    return ed->impl == QC_ATTN_FUSED && ed->stash.n > 0;
}

/* The dropout of one of the application's sites (p = 0 when not training): site_offset 0 the
 * attention weights α (Q·E, H) over graph g, keyed per base edge; 1 the FFN hidden (Nd, FF),
 * keyed per x_dst row (qc_attention.h "Attention edges"). */
static inline struct qc_dropout attn_drop_site(const struct qc_attn_ctx *ctx, uint32_t site_offset,
                                               const int64_t *key, int64_t rows, int64_t reps,
                                               int64_t row_len)
{
    struct qc_dropout d = {0};
    d.p = ctx && ctx->training ? ctx->dropout : 0.0f;
    d.seed = ctx ? ctx->seed : 0;
    d.step = ctx ? ctx->step : 0;
    d.block = (ctx ? ctx->site : 0) + site_offset;
    d.index_base = 0;
    if (d.p > 0.0f && key && rows > 0) {
        d.row_key = key;
        d.rows = rows;
        d.reps = reps;
        d.row_len = row_len;
        QC_ASSERT(qc_dropout_valid(&d), "attention dropout: %lld x %lld x %lld elements per scene",
                  (long long)reps, (long long)rows, (long long)row_len);
    }
    return d;
}

/* The attention-weight dropout (site ctx->site) of an application on graph g with H heads. */
static inline struct qc_dropout attn_drop_alpha(const struct qc_attn_ctx *ctx,
                                                const struct qc_attn_graph *g, int64_t H)
{
    return attn_drop_site(ctx, 0, ctx ? ctx->edge_key : NULL, g->n_edge, g->n_query, H);
}

/* The FFN dropout (site ctx->site + 1) of Nd x_dst rows of FF hidden units. */
static inline struct qc_dropout attn_drop_ffn(const struct qc_attn_ctx *ctx, int64_t Nd, int64_t FF)
{
    return attn_drop_site(ctx, 1, ctx ? ctx->row_key : NULL, Nd, 1, FF);
}

// ---- attention: the edge context's index arrays (attention_index.c) -------------------------

/* Index array id of spec s (int64, home-held): *host is where the host code writes it (the
 * memory itself on the CPU backend; a malloc'ed staging copy on a device backend). Fill it, then
 * attn_index_commit. QC_ERR_NOMEM (nothing held). */
enum qc_status attn_index_begin(struct qc_memspec *s, int id, int64_t **host);
/* Uploads the staging copy (device backends) and frees it. On failure the array is given back. */
enum qc_status attn_index_commit(struct qc_memspec *s, int id, int64_t *host);

/* Elements of the owned index arrays ed->qindex and ed->by_src (for the hook's free). */
static inline int64_t attn_edges_qindex_n(const struct qc_attn_graph *g)
{
    return g->n_query * g->n_bdst + g->n_dst + g->n_edge + 1;
}
static inline int64_t attn_edges_by_src_n(const struct qc_attn_graph *g)
{
    return g->n_src + 1 + g->n_edge;
}

/* ed->bdst (E): the base x_dst row of each edge, from the host CSR, into s's AMS_BDST.
 * QC_ERR_NOMEM, QC_ERR_CUDA (the array is then given back). */
enum qc_status attn_edges_bdst_build(struct qc_attn_edges *ed, struct qc_memspec *s);

/* UNFUSED: the query index arrays of an edge context (ed->qindex), built at edges_init. */
struct attn_query_index {
    const int64_t *qidx; /* (Q*n_bdst) x_dst row of query (b,k) at k*n_bdst + b (mode-major) */
    const int64_t *qinv; /* (n_dst) k*n_bdst + b for the row of query (b,k); Q*n_bdst (the zero
                            row that follows the per-query buffers) for rows no query names */
    const int64_t *iota; /* (E+1) 0, 1, .., E: ptr and seg of the identity CSR over base edges */
};
struct attn_query_index attn_edges_query_index(const struct qc_attn_edges *ed);
/* Builds them from the graph's host copies into s's AMS_QINDEX. QC_ERR_NOMEM, QC_ERR_CUDA. */
enum qc_status attn_edges_query_index_build(struct qc_attn_edges *ed, struct qc_memspec *s);

/* The base edges grouped by source (csr.seg = g->src, nseg = n_src, nitem = E; device memory
 * on a device backend), built on the host and uploaded by the first call (its memory from s's
 * AMS_BY_SRC, attn_by_src_spec), kept in ed until edges_deinit. QC_ERR_NOMEM, QC_ERR_CUDA. */
enum qc_status attn_edges_by_src(struct qc_attn_edges *ed, struct qc_memspec *s,
                                 struct qc_csr *csr);

// ---- the implementation-specific edge parts ------------------------------------------------

/* u (in the stash) from q, the kv context and the graph; fills the implementation's entries.
 * Memory from the application's spec ms (qc_attn_memspec). */
enum qc_status attn_unfused_edge_forward(const struct qc_attn_kv *kv, const float *q,
                                         const struct qc_stash *st, const struct attn_app_idx *ix,
                                         const struct qc_attn_ctx *ctx, struct qc_memspec *ms);
enum qc_status attn_fused_edge_forward(const struct qc_attn_kv *kv, const float *q,
                                       const struct qc_stash *st, const struct attn_app_idx *ix,
                                       const struct qc_attn_ctx *ctx, struct qc_memspec *ms);
/* dq (Nd,D) OVERWRITE from du; source/edge gradients ACCUM into kv (and fe/dcat for FUSED). */
enum qc_status attn_unfused_edge_backward(struct qc_attn_kv *kv, float *dq, const float *du,
                                          const struct qc_stash *st, const struct attn_app_idx *ix,
                                          const struct qc_attn_ctx *ctx, struct qc_memspec *ms);
enum qc_status attn_fused_edge_backward(struct qc_attn_kv *kv, float *dq, const float *du,
                                        const struct qc_stash *st, const struct attn_app_idx *ix,
                                        const struct qc_attn_ctx *ctx, struct qc_memspec *ms);

/* FUSED with shared r: r = FE(feat [+ cat]) tile by tile into the edge stash; the FE backward
 * from the layers' accumulated dr (fe->dw, dcat_table ACCUM), then dr freed. Memory from the
 * edge context's spec ms. */
enum qc_status attn_fused_edges_forward(struct qc_attn_edges *ed, struct qc_memspec *ms);
enum qc_status attn_fused_edges_backward(struct qc_attn_edges *ed, struct qc_memspec *ms);

/* kv context halves, run after (forward) / before (backward) the shared LN_src:
 * forward reads x̂_s from the kv stash; backward writes dxhat_s (n_src,D) OVERWRITE. Memory
 * from kv's spec ms. */
enum qc_status attn_unfused_kv_forward(struct qc_attn_kv *kv, struct qc_memspec *ms);
enum qc_status attn_unfused_kv_backward(struct qc_attn_kv *kv, float *dxhat_s,
                                        struct qc_memspec *ms);
enum qc_status attn_fused_kv_forward(struct qc_attn_kv *kv);
enum qc_status attn_fused_kv_backward(struct qc_attn_kv *kv, float *dxhat_s, struct qc_memspec *ms);

#endif /* QC_MODEL_BLOCKS_INTERNAL_H */
