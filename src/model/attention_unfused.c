/*
 * attention_unfused.c — the reference AttentionLayer edge part: materialises the per-edge
 * tensors as PyTorch does (QCNET.md §8.2), built from the kernels' ops.
 *
 * Source/edge context (once per layer and forward): r̂ = LN_r(r), k̃ = k[src] + r̂·W_krᵀ,
 * ṽ = v[src] + (r̂·W_vrᵀ + b_vr), one row per BASE edge, so the decoder's K modes and its
 * recurrent steps share them (QCNET.md §8.8); their gradients accumulate over every use.
 * Application, per mode k (attention edges (k, e), e in base-edge order):
 *   q_i = q[query(bdst(e), k)]          stashed (Q·E, D), as PyTorch's index_select keeps it
 *   s   = (q_i · k̃) · Dh^-0.5, α = segment softmax over each query's edges   α stashed (Q·E, H)
 *   u   = Σ_e dropout(α)·ṽ               the dropout mask is redrawn from Philox in backward
 *
 * Every step is an op of qc_exec.h on the layer's backend, so the same code runs on the CPU,
 * on CUDA and on the emulated device. Rows move between x_dst order and the per-mode buffers
 * (row k·n_bdst + b for query (b,k)) by row gathers over the edge context's query index
 * arrays (attn_edges_query_index): the gathers copy rows exactly, so the results are those
 * of the former per-row copies bit for bit.
 */
#include "blocks_internal.h"
#include "qc_exec.h"
#include "qc_kernels.h"

enum { KV_XHAT = 0 };

static struct qc_csr unfused_csr(const struct qc_attn_edges *ed)
{
    struct qc_csr c;
    c.ptr = ed->g->row_ptr;
    c.perm = NULL;
    c.seg = ed->bdst;
    c.nseg = ed->g->n_bdst;
    c.nitem = ed->g->n_edge;
    return c;
}

// ---- source/edge context ----------------------------------------------------------------

enum qc_status attn_unfused_kv_forward(struct qc_attn_kv *kv, struct qc_memspec *ms)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_graph *g = kv->ed->g;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *w = l->w;
    const int64_t Ns = g->n_src, E = g->n_edge, D = l->D;
    const struct qc_stash *st = &kv->stash;
    const float *xhat = qc_stash_f32(st, KV_XHAT);
    float *kt = qc_stash_f32(st, qc_stash_find(st, "kt"));
    float *vt = qc_stash_f32(st, qc_stash_find(st, "vt"));
    float *k;
    QC_TRY(qc_memspec_take_f32(ms, AMS_TMP, &k)); /* k, v (n_src,D) */
    float *v = k + Ns * D;
    qc_op_linear_forward(ex, k, xhat, D, w + l->o_wk, NULL, Ns, D, D, false);
    qc_op_linear_forward(ex, v, xhat, D, w + l->o_wv, w + l->o_bv, Ns, D, D, false);
    qc_op_gather_rows_forward(ex, kt, k, g->src, E, D, false);
    qc_op_gather_rows_forward(ex, vt, v, g->src, E, D, false);
    qc_memspec_give(ms, AMS_TMP);
    if (l->has_pos) {
        const float *r = qc_stash_f32(&kv->ed->stash, 0);
        float *rhat = qc_stash_f32(st, qc_stash_find(st, "rhat"));
        qc_op_layernorm_forward(ex, rhat, qc_stash_f32(st, qc_stash_find(st, "ln_r.mean")),
                                qc_stash_f32(st, qc_stash_find(st, "ln_r.rstd")), r,
                                w + l->o_ln_r_w, w + l->o_ln_r_b, E, D);
        qc_op_linear_forward(ex, kt, rhat, D, w + l->o_wkr, NULL, E, D, D, true);
        qc_op_linear_forward(ex, vt, rhat, D, w + l->o_wvr, w + l->o_bvr, E, D, D, true);
    }
    return QC_OK;
}

enum qc_status attn_unfused_kv_backward(struct qc_attn_kv *kv, float *dxhat_s,
                                        struct qc_memspec *ms)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *w = l->w;
    float *dw = l->dw;
    const int64_t Ns = g->n_src, E = g->n_edge, D = l->D;
    const struct qc_stash *st = &kv->stash;
    float *tmp;
    /* no application ran backward: the kv gradients start at zero (spec: absent otherwise) */
    QC_TRY(qc_memspec_take_f32(ms, AMS_DK, &tmp));
    QC_TRY(qc_memspec_take_f32(ms, AMS_DV, &tmp));
    if (l->has_pos) {
        const float *rhat = qc_stash_f32(st, qc_stash_find(st, "rhat"));
        QC_TRY(qc_memspec_take_f32(ms, AMS_DR, &tmp)); /* the first layer's: ed->dr zeroed */
        float *drhat;
        QC_TRY(qc_memspec_take_f32(ms, AMS_DRHAT, &drhat));
        qc_op_linear_backward(ex, drhat, D, dw + l->o_wkr, NULL, kv->dkt, rhat, D, w + l->o_wkr, E,
                              D, D, false);
        qc_op_linear_backward(ex, drhat, D, dw + l->o_wvr, dw + l->o_bvr, kv->dvt, rhat, D,
                              w + l->o_wvr, E, D, D, true);
        qc_op_layernorm_backward(
            ex, ed->dr, dw + l->o_ln_r_w, dw + l->o_ln_r_b, drhat, qc_stash_f32(&ed->stash, 0),
            qc_stash_f32(st, qc_stash_find(st, "ln_r.mean")),
            qc_stash_f32(st, qc_stash_find(st, "ln_r.rstd")), w + l->o_ln_r_w, E, D, true);
        qc_memspec_give(ms, AMS_DRHAT);
    }
    /* k̃ and ṽ read k[src], v[src]: sum their gradients per source in CSR-by-source order */
    struct qc_csr by_src;
    QC_TRY(attn_edges_by_src(ed, ms, &by_src));
    float *dk;
    QC_TRY(qc_memspec_take_f32(ms, AMS_TMP, &dk)); /* dk, dv (n_src,D) */
    float *dv = dk + Ns * D;
    qc_op_gather_rows_backward(ex, dk, kv->dkt, by_src, D, false);
    qc_op_gather_rows_backward(ex, dv, kv->dvt, by_src, D, false);
    const float *xhat = qc_stash_f32(st, KV_XHAT);
    qc_op_linear_backward(ex, dxhat_s, D, dw + l->o_wk, NULL, dk, xhat, D, w + l->o_wk, Ns, D, D,
                          false);
    qc_op_linear_backward(ex, dxhat_s, D, dw + l->o_wv, dw + l->o_bv, dv, xhat, D, w + l->o_wv, Ns,
                          D, D, true);
    qc_memspec_give(ms, AMS_TMP);
    qc_memspec_give(ms, AMS_DV);
    qc_memspec_give(ms, AMS_DK);
    return QC_OK;
}

// ---- application ------------------------------------------------------------------------

enum qc_status attn_unfused_edge_forward(const struct qc_attn_kv *kv, const float *q,
                                         const struct qc_stash *st, const struct attn_app_idx *ix,
                                         const struct qc_attn_ctx *ctx, struct qc_memspec *ms)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const int64_t E = g->n_edge, D = l->D, H = l->H, nb = g->n_bdst, Q = g->n_query;
    const int64_t QB = Q * nb;
    const float *kt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "kt"));
    const float *vt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "vt"));
    const struct attn_query_index qx = attn_edges_query_index(ed);
    /* qseg (QB,D): q of query (b,k) at row k·nb + b; useg (QB+1,D): its aggregation, and a
     * last row of zeros for the x_dst rows no query names */
    float *qseg;
    QC_TRY(qc_memspec_take_f32(ms, AMS_EDGE, &qseg)); /* (2·QB + 1)·D */
    float *useg = qseg + QB * D;
    qc_op_gather_rows_forward(ex, qseg, q, qx.qidx, QB, D, false);
    qc_op_zero(ex, useg + QB * D, (size_t)D * sizeof *useg);
    struct qc_csr csr = unfused_csr(ed);
    for (int64_t k = 0; k < Q; k++) {
        const float *qk = qseg + k * nb * D;
        float *qi = qc_stash_f32(st, ix->qi) + k * E * D;
        float *alpha = qc_stash_f32(st, ix->alpha) + k * E * H;
        qc_op_gather_rows_forward(ex, qi, qk, ed->bdst, E, D, false);
        qc_op_attn_score_forward(ex, alpha, qk, kt, csr, H, l->Dh, l->scale);
        qc_op_segment_softmax_forward(ex, alpha, NULL, NULL, alpha, csr, H);
        struct qc_dropout drop = attn_drop_alpha(ctx, g, H);
        drop.index_base = k * E * H;
        qc_op_attn_aggregate_forward(ex, useg + k * nb * D, alpha, vt, csr, H, l->Dh, &drop);
    }
    /* u (n_dst,D) OVERWRITE: every row, from its query's aggregation or the zero row */
    qc_op_gather_rows_forward(ex, qc_stash_f32(st, ix->u), useg, qx.qinv, g->n_dst, D, false);
    qc_memspec_give(ms, AMS_EDGE);
    return QC_OK;
}

enum qc_status attn_unfused_edge_backward(struct qc_attn_kv *kv, float *dq, const float *du,
                                          const struct qc_stash *st, const struct attn_app_idx *ix,
                                          const struct qc_attn_ctx *ctx, struct qc_memspec *ms)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const int64_t E = g->n_edge, D = l->D, H = l->H, nb = g->n_bdst, Q = g->n_query;
    const int64_t QB = Q * nb;
    const float *kt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "kt"));
    const float *vt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "vt"));
    /* first application's backward: the kv gradients start at zero (spec: absent otherwise) */
    float *t;
    QC_TRY(qc_memspec_take_f32(ms, AMS_DK, &t));
    QC_TRY(qc_memspec_take_f32(ms, AMS_DV, &t));
    const struct attn_query_index qx = attn_edges_query_index(ed);
    /* duseg (QB,D), dqseg (QB+1,D) per query as in forward (last row: zeros), dalpha (E,H),
     * dtmp (E,D) one mode's dṽ, then its dk̃: (2·QB + 1)·D + E·H + E·D */
    QC_TRY(qc_memspec_take_f32(ms, AMS_EDGE, &t));
    float *duseg = t, *dqseg = t + QB * D, *dalpha = t + (2 * QB + 1) * D;
    float *dtmp = dalpha + E * H;
    qc_op_gather_rows_forward(ex, duseg, du, qx.qidx, QB, D, false);
    qc_op_zero(ex, dqseg + QB * D, (size_t)D * sizeof *dqseg);
    struct qc_csr csr = unfused_csr(ed);
    /* the identity CSR over base edges: the score backward's dk with q_i per edge */
    const struct qc_csr by_edge = {qx.iota, NULL, qx.iota, E, E};
    for (int64_t k = 0; k < Q; k++) {
        const float *qi = qc_stash_f32(st, ix->qi) + k * E * D;
        const float *alpha = qc_stash_f32(st, ix->alpha) + k * E * H;
        struct qc_dropout drop = attn_drop_alpha(ctx, g, H);
        drop.index_base = k * E * H;
        qc_op_attn_aggregate_backward(ex, dalpha, dtmp, duseg + k * nb * D, alpha, vt, csr, H,
                                      l->Dh, &drop);
        qc_op_add_forward(ex, kv->dvt, kv->dvt, dtmp, E * D);
        qc_op_segment_softmax_backward(ex, dalpha, dalpha, alpha, csr, H);
        /* dq of the mode's queries (the score op reads q only for dk) */
        qc_op_attn_score_backward(ex, dqseg + k * nb * D, NULL, dalpha, NULL, kt, csr, H, l->Dh,
                                  l->scale, false);
        /* dk̃ += (dscore·scale)·q_i, accumulated over modes in ascending k */
        qc_op_attn_score_backward(ex, NULL, dtmp, dalpha, qi, kt, by_edge, H, l->Dh, l->scale,
                                  false);
        qc_op_add_forward(ex, kv->dkt, kv->dkt, dtmp, E * D);
    }
    /* dq (n_dst,D) OVERWRITE: every row, from its query or the zero row */
    qc_op_gather_rows_forward(ex, dq, dqseg, qx.qinv, g->n_dst, D, false);
    qc_memspec_give(ms, AMS_EDGE);
    return QC_OK;
}
