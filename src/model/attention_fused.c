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

enum qc_status attn_fused_kv_backward(struct qc_attn_kv *kv, float *dxhat_s, struct qc_memspec *ms)
{
    const struct qc_attn *l = kv->l;
    const int64_t Ns = kv->ed->g->n_src, D = l->D;
    float *tmp;
    /* no application ran backward: the kv gradients start at zero (spec: absent otherwise) */
    QC_TRY(qc_memspec_take_f32(ms, AMS_DK, &tmp));
    QC_TRY(qc_memspec_take_f32(ms, AMS_DV, &tmp));
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *xhat = qc_stash_f32(&kv->stash, KV_XHAT);
    qc_op_linear_backward(ex, dxhat_s, D, l->dw + l->o_wk, NULL, kv->dk, xhat, D, l->w + l->o_wk,
                          Ns, D, D, false);
    qc_op_linear_backward(ex, dxhat_s, D, l->dw + l->o_wv, l->dw + l->o_bv, kv->dv, xhat, D,
                          l->w + l->o_wv, Ns, D, D, true);
    qc_memspec_give(ms, AMS_DV);
    qc_memspec_give(ms, AMS_DK);
    return QC_OK;
}

// ---- the edge op ---------------------------------------------------------------------------

/* The edge context's tile plan for the layer's backend, made once per context and tile size
 * (the tiles depend only on row_ptr): every application on the set, forward and backward, and
 * their memory specs read it. */
static enum qc_status edges_tiles(const struct qc_attn_kv *kv,
                                  const struct qc_attn_fused_tiles **out)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const bool cuda = qc_exec_target_of(qc_block_exec(&l->mem)) == QC_EXEC_CUDA;
    const int64_t tile =
        cuda ? (l->tile_edges_cuda > 0 ? l->tile_edges_cuda : QC_ATTN_FUSED_TILE_EDGES_CUDA)
             : l->tile_edges;
    if (!ed->tiles || ed->tiles_edges != tile) {
        if (!ed->tiles && !(ed->tiles = calloc(1, sizeof *ed->tiles)))
            return qc_errorf(QC_ERR_NOMEM, "attention: tile plan of %s",
                             ed->mem.name[0] ? ed->mem.name : "an edge set");
        qc_attn_fused_tiles_deinit(ed->tiles);
        ed->tiles_edges = 0;
        QC_TRY(qc_attn_fused_tiles_init(ed->tiles, attn_row_ptr_host(ed->g), ed->g->n_bdst, tile));
        ed->tiles_edges = tile;
    }
    *out = ed->tiles;
    return QC_OK;
}

/* One op call's descriptors over the cached tile plan. ed.fe points into the struct: do not
 * copy it. The CSR by source, dL/dr and the scratch come from the application's spec. */
struct fused_call {
    struct qc_fe fe;
    struct qc_attn_fused_layer l;
    struct qc_attn_fused_edges ed;
};

static enum qc_status fused_call_make(struct fused_call *c, const struct qc_attn_kv *kv)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
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
        if (l->dw) { /* NULL for a layer without gradients (forward only): no offsets from NULL */
            c->l.dw_kr = l->dw + l->o_wkr;
            c->l.dw_vr = l->dw + l->o_wvr;
            c->l.db_vr = l->dw + l->o_bvr;
            c->l.dln_r_w = l->dw + l->o_ln_r_w;
            c->l.dln_r_b = l->dw + l->o_ln_r_b;
        }
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
    if (pos && attn_edges_shares_r(ed)) /* r from the edge context, dr into it */
        c->ed.r = qc_stash_f32(&ed->stash, 0);
    return edges_tiles(kv, &c->ed.tiles);
}

int64_t attn_fused_scratch_numel(const struct qc_attn_kv *kv, bool backward)
{
    struct fused_call c;
    if (fused_call_make(&c, kv) != QC_OK)
        return 0;
    return qc_attn_fused_scratch_numel(qc_block_exec(&kv->l->mem), &c.l, &c.ed, backward);
}

enum qc_status attn_fused_edge_forward(const struct qc_attn_kv *kv, const float *q,
                                       const struct qc_stash *st, const struct attn_app_idx *ix,
                                       const struct qc_attn_ctx *ctx, struct qc_memspec *ms)
{
    const struct qc_attn *l = kv->l;
    struct fused_call c;
    QC_TRY(fused_call_make(&c, kv));
    float *scratch;
    QC_TRY(qc_memspec_take_f32(ms, AMS_EDGE, &scratch));
    const struct qc_dropout drop = attn_drop_alpha(ctx, kv->ed->g, l->H);
    qc_op_attn_fused_forward(qc_block_exec(&l->mem), qc_stash_f32(st, ix->u),
                             qc_stash_f32(st, ix->smax), qc_stash_f32(st, ix->ssum), q,
                             qc_stash_f32(&kv->stash, KV_K), qc_stash_f32(&kv->stash, KV_V), &c.l,
                             &c.ed, &drop, scratch);
    qc_memspec_give(ms, AMS_EDGE); /* stream-ordered on CUDA (the hook) */
    return QC_OK;
}

enum qc_status attn_fused_edge_backward(struct qc_attn_kv *kv, float *dq, const float *du,
                                        const struct qc_stash *st, const struct attn_app_idx *ix,
                                        const struct qc_attn_ctx *ctx, struct qc_memspec *ms)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    float *tmp;
    /* first application's backward: the kv gradients start at zero (spec: absent otherwise) */
    QC_TRY(qc_memspec_take_f32(ms, AMS_DK, &tmp));
    QC_TRY(qc_memspec_take_f32(ms, AMS_DV, &tmp));
    struct fused_call c;
    QC_TRY(fused_call_make(&c, kv));
    if (qc_attn_fused_wants_by_src(qc_block_exec(&l->mem))) /* built once per edge context */
        QC_TRY(attn_edges_by_src(ed, ms, &c.ed.by_src));
    if (c.ed.r) { /* the first layer's backward on the set: dL/dr zeroed */
        QC_TRY(qc_memspec_take_f32(ms, AMS_DR, &tmp));
        c.ed.dr = ed->dr;
    }
    float *scratch;
    QC_TRY(qc_memspec_take_f32(ms, AMS_EDGE, &scratch));
    const struct qc_dropout drop = attn_drop_alpha(ctx, kv->ed->g, l->H);
    qc_op_attn_fused_backward(qc_block_exec(&l->mem), dq, kv->dk, kv->dv, du,
                              qc_stash_f32(st, ix->smax), qc_stash_f32(st, ix->ssum),
                              qc_stash_f32(st, ix->q), qc_stash_f32(&kv->stash, KV_K),
                              qc_stash_f32(&kv->stash, KV_V), &c.l, &c.ed, &drop, scratch);
    qc_memspec_give(ms, AMS_EDGE);
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

int64_t attn_fused_fe_tiles_numel(const struct qc_attn_edges *ed, bool backward)
{
    struct qc_fe fe;
    fourier_desc(ed->fe, &fe);
    const struct qc_fe_rows rows = edges_rows(ed);
    return qc_fe_tiled_scratch_numel(qc_block_exec(&ed->mem), &fe, &rows, backward);
}

enum qc_status attn_fused_edges_forward(struct qc_attn_edges *ed, struct qc_memspec *ms)
{
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    struct qc_fe fe;
    fourier_desc(ed->fe, &fe);
    const struct qc_fe_rows rows = edges_rows(ed);
    float *ws;
    QC_TRY(qc_memspec_take_f32(ms, AMS_FE_TILES, &ws));
    qc_op_fe_forward_tiled(ex, &fe, qc_stash_f32(&ed->stash, 0), &rows, ws);
    qc_memspec_give(ms, AMS_FE_TILES);
    return QC_OK;
}

enum qc_status attn_fused_edges_backward(struct qc_attn_edges *ed, struct qc_memspec *ms)
{
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    struct qc_fe fe;
    fourier_desc(ed->fe, &fe);
    const struct qc_fe_rows rows = edges_rows(ed);
    float *ws;
    QC_TRY(qc_memspec_take_f32(ms, AMS_FE_TILES, &ws));
    qc_op_fe_backward_tiled(ex, &fe, ed->dr, &rows, ws);
    qc_memspec_give(ms, AMS_FE_TILES);
    qc_memspec_give(ms, AMS_DR);
    return QC_OK;
}
