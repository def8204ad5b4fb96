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
 */
#include <string.h>

#include "blocks_internal.h"
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

enum qc_status attn_unfused_kv_forward(struct qc_attn_kv *kv)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_graph *g = kv->ed->g;
    const float *w = l->w;
    const int64_t Ns = g->n_src, E = g->n_edge, D = l->D;
    const struct qc_stash *st = &kv->stash;
    const float *xhat = qc_stash_f32(st, KV_XHAT);
    float *kt = qc_stash_f32(st, qc_stash_find(st, "kt"));
    float *vt = qc_stash_f32(st, qc_stash_find(st, "vt"));
    float *k = blk_falloc(&l->mem, 2 * Ns * D, "kv_forward.k_v");
    if (!k)
        return blk_nomem(&l->mem, "kv_forward.k_v", 2 * Ns * D);
    float *v = k + Ns * D;
    qc_linear_forward_cpu(k, xhat, D, w + l->o_wk, NULL, Ns, D, D, false);
    qc_linear_forward_cpu(v, xhat, D, w + l->o_wv, w + l->o_bv, Ns, D, D, false);
    qc_gather_rows_forward_cpu(kt, k, g->src, E, D, false);
    qc_gather_rows_forward_cpu(vt, v, g->src, E, D, false);
    blk_ffree(&l->mem, k, 2 * Ns * D);
    if (l->has_pos) {
        const float *r = qc_stash_f32(&kv->ed->stash, 0);
        float *rhat = qc_stash_f32(st, qc_stash_find(st, "rhat"));
        qc_layernorm_forward_cpu(rhat, qc_stash_f32(st, qc_stash_find(st, "ln_r.mean")),
                                 qc_stash_f32(st, qc_stash_find(st, "ln_r.rstd")), r,
                                 w + l->o_ln_r_w, w + l->o_ln_r_b, E, D);
        qc_linear_forward_cpu(kt, rhat, D, w + l->o_wkr, NULL, E, D, D, true);
        qc_linear_forward_cpu(vt, rhat, D, w + l->o_wvr, w + l->o_bvr, E, D, D, true);
    }
    return QC_OK;
}

enum qc_status attn_unfused_kv_backward(struct qc_attn_kv *kv, float *dxhat_s)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const float *w = l->w;
    float *dw = l->dw;
    const int64_t Ns = g->n_src, E = g->n_edge, D = l->D;
    const struct qc_stash *st = &kv->stash;
    if (!kv->dkt) { /* no application ran backward: zero gradients */
        kv->dkt = blk_fcalloc(&l->mem, E * D, "kv.dkt");
        if (kv->dkt)
            kv->dvt = blk_fcalloc(&l->mem, E * D, "kv.dvt");
        if (!kv->dvt) {
            blk_ffree(&l->mem, kv->dkt, E * D);
            kv->dkt = NULL;
            return blk_nomem(&l->mem, "kv.dkt_dvt", 2 * E * D);
        }
    }
    if (l->has_pos) {
        const float *rhat = qc_stash_f32(st, qc_stash_find(st, "rhat"));
        if (!ed->dr && !(ed->dr = blk_fcalloc(&ed->mem, E * D, "edges.dr")))
            return blk_nomem(&ed->mem, "edges.dr", E * D);
        float *drhat = blk_falloc(&l->mem, E * D, "kv_backward.drhat");
        if (!drhat)
            return blk_nomem(&l->mem, "kv_backward.drhat", E * D);
        qc_linear_backward_cpu(drhat, D, dw + l->o_wkr, NULL, kv->dkt, rhat, D, w + l->o_wkr, E, D,
                               D, false);
        qc_linear_backward_cpu(drhat, D, dw + l->o_wvr, dw + l->o_bvr, kv->dvt, rhat, D,
                               w + l->o_wvr, E, D, D, true);
        qc_layernorm_backward_cpu(
            ed->dr, dw + l->o_ln_r_w, dw + l->o_ln_r_b, drhat, qc_stash_f32(&ed->stash, 0),
            qc_stash_f32(st, qc_stash_find(st, "ln_r.mean")),
            qc_stash_f32(st, qc_stash_find(st, "ln_r.rstd")), w + l->o_ln_r_w, E, D, true);
        blk_ffree(&l->mem, drhat, E * D);
    }
    /* k̃ and ṽ read k[src], v[src]: sum their gradients per source in CSR-by-source order */
    const size_t ptr_bytes = (size_t)(Ns + 1 + E) * sizeof(int64_t);
    int64_t *ptr = qc_block_alloc(&l->mem, ptr_bytes, "kv_backward.csr_by_src");
    if (!ptr)
        return blk_nomem(&l->mem, "kv_backward.csr_by_src", (int64_t)(ptr_bytes / 4));
    float *dk = blk_falloc(&l->mem, 2 * Ns * D, "kv_backward.dk_dv");
    if (!dk) {
        qc_block_free(&l->mem, ptr, ptr_bytes);
        return blk_nomem(&l->mem, "kv_backward.dk_dv", 2 * Ns * D);
    }
    float *dv = dk + Ns * D;
    int64_t *perm = ptr + Ns + 1;
    qc_csr_build_cpu(ptr, perm, g->src, E, Ns);
    struct qc_csr by_src = {ptr, perm, g->src, Ns, E};
    qc_gather_rows_backward_cpu(dk, kv->dkt, by_src, D, false);
    qc_gather_rows_backward_cpu(dv, kv->dvt, by_src, D, false);
    const float *xhat = qc_stash_f32(st, KV_XHAT);
    qc_linear_backward_cpu(dxhat_s, D, dw + l->o_wk, NULL, dk, xhat, D, w + l->o_wk, Ns, D, D,
                           false);
    qc_linear_backward_cpu(dxhat_s, D, dw + l->o_wv, dw + l->o_bv, dv, xhat, D, w + l->o_wv, Ns, D,
                           D, true);
    blk_ffree(&l->mem, dk, 2 * Ns * D);
    qc_block_free(&l->mem, ptr, ptr_bytes);
    blk_ffree(&l->mem, kv->dvt, E * D);
    blk_ffree(&l->mem, kv->dkt, E * D);
    kv->dkt = kv->dvt = NULL;
    return QC_OK;
}

// ---- application ------------------------------------------------------------------------

enum qc_status attn_unfused_edge_forward(const struct qc_attn_kv *kv, const float *q,
                                         const struct qc_stash *st, const struct attn_app_idx *ix,
                                         const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const int64_t E = g->n_edge, D = l->D, H = l->H, nb = g->n_bdst, Q = g->n_query;
    const float *kt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "kt"));
    const float *vt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "vt"));
    float *u = qc_stash_f32(st, ix->u);
    memset(u, 0, (size_t)(g->n_dst * D) * sizeof *u);
    float *qseg = blk_falloc(&l->mem, 2 * nb * D, "unfused_forward.qseg_useg");
    if (!qseg)
        return blk_nomem(&l->mem, "unfused_forward.qseg_useg", 2 * nb * D);
    float *useg = qseg + nb * D;
    struct qc_csr csr = unfused_csr(ed);
    for (int64_t k = 0; k < Q; k++) {
        for (int64_t b = 0; b < nb; b++)
            memcpy(qseg + b * D, q + attn_query_row(g, b, k) * D, (size_t)D * sizeof *q);
        float *qi = qc_stash_f32(st, ix->qi) + k * E * D;
        float *alpha = qc_stash_f32(st, ix->alpha) + k * E * H;
        qc_gather_rows_forward_cpu(qi, qseg, ed->bdst, E, D, false);
        qc_attn_score_forward_cpu(alpha, qseg, kt, csr, H, l->Dh, l->scale);
        qc_segment_softmax_forward_cpu(alpha, NULL, NULL, alpha, csr, H);
        struct qc_dropout drop = attn_drop(ctx, 0);
        drop.index_base = k * E * H;
        qc_attn_aggregate_forward_cpu(useg, alpha, vt, csr, H, l->Dh, &drop);
        for (int64_t b = 0; b < nb; b++)
            memcpy(u + attn_query_row(g, b, k) * D, useg + b * D, (size_t)D * sizeof *u);
    }
    blk_ffree(&l->mem, qseg, 2 * nb * D);
    return QC_OK;
}

/* dkt[e,h,:] += (dscore[e,h]·scale)·q_i[e,h,:] — the key gradient read from the stashed q_i,
 * accumulated over modes (ascending k). */
static void unfused_dk_accum(float *dkt, const float *dscore, const float *qi, int64_t E, int64_t H,
                             int64_t Dh, float scale)
{
    const int64_t D = H * Dh;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < E; e++)
        for (int64_t h = 0; h < H; h++) {
            float gs = dscore[e * H + h] * scale;
            for (int64_t c = 0; c < Dh; c++)
                dkt[e * D + h * Dh + c] += gs * qi[e * D + h * Dh + c];
        }
}

enum qc_status attn_unfused_edge_backward(struct qc_attn_kv *kv, float *dq, const float *du,
                                          const struct qc_stash *st, const struct attn_app_idx *ix,
                                          const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const int64_t E = g->n_edge, D = l->D, H = l->H, nb = g->n_bdst, Q = g->n_query;
    const float *kt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "kt"));
    const float *vt = qc_stash_f32(&kv->stash, qc_stash_find(&kv->stash, "vt"));
    if (!kv->dkt) { /* first application's backward: the kv gradients start at zero */
        kv->dkt = blk_fcalloc(&l->mem, E * D, "kv.dkt");
        if (kv->dkt)
            kv->dvt = blk_fcalloc(&l->mem, E * D, "kv.dvt");
        if (!kv->dvt) {
            blk_ffree(&l->mem, kv->dkt, E * D);
            kv->dkt = NULL;
            return blk_nomem(&l->mem, "kv.dkt_dvt", 2 * E * D);
        }
    }
    memset(dq, 0, (size_t)(g->n_dst * D) * sizeof *dq);
    int64_t n = 3 * nb * D + E * H + E * D;
    float *t = blk_falloc(&l->mem, n, "unfused_backward.scratch");
    if (!t)
        return blk_nomem(&l->mem, "unfused_backward.scratch", n);
    float *qseg = t, *duseg = t + nb * D, *dqseg = t + 2 * nb * D;
    float *dalpha = t + 3 * nb * D, *dv = t + 3 * nb * D + E * H;
    struct qc_csr csr = unfused_csr(ed);
    for (int64_t k = 0; k < Q; k++) {
        for (int64_t b = 0; b < nb; b++) {
            int64_t i = attn_query_row(g, b, k);
            memcpy(duseg + b * D, du + i * D, (size_t)D * sizeof *du);
            /* q per segment, recovered from the stashed q_i (the score op's q argument) */
            int64_t e0 = g->row_ptr[b];
            if (e0 < g->row_ptr[b + 1])
                memcpy(qseg + b * D, qc_stash_f32(st, ix->qi) + (k * E + e0) * D,
                       (size_t)D * sizeof *qseg);
            else
                memset(qseg + b * D, 0, (size_t)D * sizeof *qseg);
        }
        const float *qi = qc_stash_f32(st, ix->qi) + k * E * D;
        const float *alpha = qc_stash_f32(st, ix->alpha) + k * E * H;
        struct qc_dropout drop = attn_drop(ctx, 0);
        drop.index_base = k * E * H;
        qc_attn_aggregate_backward_cpu(dalpha, dv, duseg, alpha, vt, csr, H, l->Dh, &drop);
        qc_add_forward_cpu(kv->dvt, kv->dvt, dv, E * D);
        qc_segment_softmax_backward_cpu(dalpha, dalpha, alpha, csr, H);
        qc_attn_score_backward_cpu(dqseg, NULL, dalpha, qseg, kt, csr, H, l->Dh, l->scale, false);
        unfused_dk_accum(kv->dkt, dalpha, qi, E, H, l->Dh, l->scale);
        for (int64_t b = 0; b < nb; b++)
            memcpy(dq + attn_query_row(g, b, k) * D, dqseg + b * D, (size_t)D * sizeof *dq);
    }
    blk_ffree(&l->mem, t, n);
    return QC_OK;
}
