/*
 * attention_fused.c — the fused AttentionLayer edge part (QCNET.md §8.8): no per-edge hidden
 * tensor outlives a tile.
 *
 * What is kept between forward and backward: per source row k and v (kv stash), per query row
 * q and the softmax statistics M (max) and S (Σ exp + 1e-16) per head (application stash), and
 * the caller's raw edge features and indices. Nothing of width D per edge.
 *
 * The edge part is one op, qc_op_attn_fused_forward / _backward (kernels/qc_attn_fused.h): the
 * tiles, the per-row softmax and aggregation, the recompute in backward and the gradient lanes
 * live there, for every backend. This file plans the tiles from the graph's host copies
 * (tile_edges on CPU/EMU, tile_edges_cuda on CUDA), takes the op's scratch from the layer's
 * hook, and runs the kv half (k, v per source: plain linears on the layer's backend).
 */
#include <stdint.h>
#include <string.h>

#include "blocks_internal.h"
#include "qc_attn_fused.h"
#include "qc_exec.h"
#include "qc_kernels.h"

_Static_assert(QC_ATTN_CUDA_TILE_EDGES == QC_ATTN_FUSED_TILE_EDGES_CUDA,
               "the layer's default CUDA tile is the op's");

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

// ---- the edge op ---------------------------------------------------------------------------

/* One op call's descriptors, tile plan and scratch (from the layer's hook). ed.fe and ed.tiles
 * point into the struct: do not copy it. */
struct fused_call {
    struct qc_fe fe;
    struct qc_attn_fused_layer l;
    struct qc_attn_fused_edges ed;
    struct qc_attn_fused_tiles tiles;
    float *scratch; /* scratch_n floats */
    int64_t scratch_n;
};

static void fused_call_free(struct fused_call *c, const struct qc_attn *l)
{
    blk_ffree(&l->mem, c->scratch, c->scratch_n); /* stream-ordered on CUDA (the hook) */
    qc_attn_fused_tiles_deinit(&c->tiles);
}

static enum qc_status fused_call_make(struct fused_call *c, const struct qc_attn_kv *kv,
                                      bool backward)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const bool pos = l->has_pos && ed->fe;
    memset(c, 0, sizeof *c);
    c->l = (struct qc_attn_fused_layer){
        .D = l->D, .H = l->H, .Dh = l->Dh, .scale = l->scale, .has_pos = l->has_pos};
    if (l->has_pos) {
        c->l.w_kr = l->w + l->o_wkr;
        c->l.w_vr = l->w + l->o_wvr;
        c->l.b_vr = l->w + l->o_bvr;
        c->l.ln_r_w = l->w + l->o_ln_r_w;
        c->l.ln_r_b = l->w + l->o_ln_r_b;
        c->l.dw_kr = l->dw + l->o_wkr;
        c->l.dw_vr = l->dw + l->o_wvr;
        c->l.db_vr = l->dw + l->o_bvr;
        c->l.dln_r_w = l->dw + l->o_ln_r_w;
        c->l.dln_r_b = l->dw + l->o_ln_r_b;
    }
    if (pos)
        fourier_desc(ed->fe, &c->fe);
    c->ed = (struct qc_attn_fused_edges){.n_src = g->n_src,
                                         .n_dst = g->n_dst,
                                         .n_bdst = g->n_bdst,
                                         .n_query = g->n_query,
                                         .n_edge = g->n_edge,
                                         .row_ptr = g->row_ptr,
                                         .src = g->src,
                                         .query_row = g->query_row,
                                         .fe = pos ? &c->fe : NULL,
                                         .feat = ed->feat,
                                         .cat_table = ed->cat_table,
                                         .cat_idx = ed->cat_idx,
                                         .ncat = ed->ncat,
                                         .dcat_table = ed->dcat_table};
    if (backward && qc_attn_fused_wants_by_src(ex)) /* built once per edge context */
        QC_TRY(attn_edges_by_src(ed, &c->ed.by_src));
    if (pos && attn_edges_shares_r(ed)) { /* r from the edge context, dr into it */
        c->ed.r = qc_stash_f32(&ed->stash, 0);
        if (backward && !ed->dr && !(ed->dr = blk_fcalloc(&ed->mem, g->n_edge * l->D, "edges.dr")))
            return blk_nomem(&ed->mem, "edges.dr", g->n_edge * l->D);
        c->ed.dr = backward ? ed->dr : NULL;
    }
    const bool cuda = qc_exec_backend_of(ex) == QC_EXEC_CUDA;
    const int64_t tile =
        cuda ? (l->tile_edges_cuda > 0 ? l->tile_edges_cuda : QC_ATTN_FUSED_TILE_EDGES_CUDA)
             : l->tile_edges;
    QC_TRY(qc_attn_fused_tiles_init(&c->tiles, attn_row_ptr_host(g), g->n_bdst, tile));
    c->ed.tiles = &c->tiles;
    c->scratch_n = qc_attn_fused_scratch_numel(ex, &c->l, &c->ed, backward);
    if (c->scratch_n > 0 &&
        !(c->scratch = blk_falloc(&l->mem, c->scratch_n, "fused_tile.scratch"))) {
        qc_attn_fused_tiles_deinit(&c->tiles);
        return blk_nomem(&l->mem, "fused_tile.scratch", c->scratch_n);
    }
    return QC_OK;
}

enum qc_status attn_fused_edge_forward(const struct qc_attn_kv *kv, const float *q,
                                       const struct qc_stash *st, const struct attn_app_idx *ix,
                                       const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    struct fused_call c;
    QC_TRY(fused_call_make(&c, kv, false));
    const struct qc_dropout drop = attn_drop(ctx, 0);
    qc_op_attn_fused_forward(qc_block_exec(&l->mem), qc_stash_f32(st, ix->u),
                             qc_stash_f32(st, ix->smax), qc_stash_f32(st, ix->ssum), q,
                             qc_stash_f32(&kv->stash, KV_K), qc_stash_f32(&kv->stash, KV_V), &c.l,
                             &c.ed, &drop, c.scratch);
    fused_call_free(&c, l);
    return QC_OK;
}

enum qc_status attn_fused_edge_backward(struct qc_attn_kv *kv, float *dq, const float *du,
                                        const struct qc_stash *st, const struct attn_app_idx *ix,
                                        const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    if (!kv->dk) /* first application's backward: the kv gradients start at zero */
        QC_TRY(kv_grads_alloc(kv));
    struct fused_call c;
    QC_TRY(fused_call_make(&c, kv, true));
    const struct qc_dropout drop = attn_drop(ctx, 0);
    qc_op_attn_fused_backward(qc_block_exec(&l->mem), dq, kv->dk, kv->dv, du,
                              qc_stash_f32(st, ix->smax), qc_stash_f32(st, ix->ssum),
                              qc_stash_f32(st, ix->q), qc_stash_f32(&kv->stash, KV_K),
                              qc_stash_f32(&kv->stash, KV_V), &c.l, &c.ed, &drop, c.scratch);
    fused_call_free(&c, l);
    return QC_OK;
}

// ---- the shared edge embeddings r (attn_edges_shares_r) ---------------------------------------

/* The tiled FE's rows over the edge set. */
static struct qc_fe_rows edges_rows(const struct qc_attn_edges *ed)
{
    return (struct qc_fe_rows){.N = ed->g->n_edge,
                               .tile = QC_ATTN_FUSED_TILE_EDGES_CPU,
                               .c = ed->fe->d > 0 ? ed->feat : NULL,
                               .cat_table = ed->cat_table,
                               .cat_idx = ed->cat_idx,
                               .ncat = ed->ncat,
                               .dcat_table = ed->dcat_table};
}

enum qc_status attn_fused_edges_forward(struct qc_attn_edges *ed)
{
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    struct qc_fe fe;
    fourier_desc(ed->fe, &fe);
    const struct qc_fe_rows rows = edges_rows(ed);
    const int64_t n = qc_fe_tiled_scratch_numel(ex, &fe, &rows, false);
    float *ws = blk_falloc(&ed->mem, n, "edges_forward.fe_tiles");
    if (n > 0 && !ws)
        return blk_nomem(&ed->mem, "edges_forward.fe_tiles", n);
    qc_op_fe_forward_tiled(ex, &fe, qc_stash_f32(&ed->stash, 0), &rows, ws);
    blk_ffree(&ed->mem, ws, n);
    return QC_OK;
}

enum qc_status attn_fused_edges_backward(struct qc_attn_edges *ed)
{
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    struct qc_fe fe;
    fourier_desc(ed->fe, &fe);
    const struct qc_fe_rows rows = edges_rows(ed);
    const int64_t n = qc_fe_tiled_scratch_numel(ex, &fe, &rows, true);
    float *ws = blk_falloc(&ed->mem, n, "edges_backward.fe_tiles");
    if (n > 0 && !ws)
        return blk_nomem(&ed->mem, "edges_backward.fe_tiles", n);
    qc_op_fe_backward_tiled(ex, &fe, ed->dr, &rows, ws);
    blk_ffree(&ed->mem, ws, n);
    blk_ffree(&ed->mem, ed->dr, ed->g->n_edge * ed->fe->D);
    ed->dr = NULL;
    return QC_OK;
}
