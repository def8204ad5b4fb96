/*
 * attention_common.c — what both AttentionLayer implementations share: the parameter table,
 * the graph check, the edge and source/edge contexts (their LN_src part), the memory specs, the
 * stash plan of an application and its node-level half (QCNET.md §3.3 steps 1, 3 (q) and 9–13),
 * and the dispatch to the implementation's edge part (attention_unfused.c / attention_fused.c).
 *
 * Every op runs through qc_exec.h on the block's backend (the layer's mem, or the edge
 * context's for its own work); index arrays derived from the graph are computed on the host
 * from its host copies and uploaded once per edge context (attention_index.c, which both edge
 * parts read too: calls go common -> edge parts -> index, never back up).
 */
#include "qc_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blocks_internal.h"
#include "qc_attn_fused.h" /* qc_attn_fused_takes_r */
#include "qc_exec.h"
#include "qc_kernels.h"

// ---- parameters -------------------------------------------------------------------------

void qc_attn_init(struct qc_attn *l, int64_t D, int64_t H, bool bipartite, bool has_pos)
{
    QC_ASSERT(D > 0 && H > 0 && D % H == 0, "attention: D %lld, H %lld", (long long)D,
              (long long)H);
    memset(l, 0, sizeof *l);
    l->D = D;
    l->H = H;
    l->Dh = D / H;
    l->FF = 4 * D;
    l->bipartite = bipartite;
    l->has_pos = has_pos;
    l->scale = 1.0f / sqrtf((float)l->Dh);
    l->tile_edges = 512;
    l->tile_edges_cuda = QC_ATTN_CUDA_TILE_EDGES;
    struct qc_param_table *t = &l->params;
    qc_param_table_init(t);
    const enum qc_param_init LW = QC_INIT_LINEAR_W, Z = QC_INIT_ZERO, ONE = QC_INIT_ONE;
    l->o_wq = qc_param_table_add(t, "to_q.weight", 2, D, D, LW);
    l->o_bq = qc_param_table_add(t, "to_q.bias", 1, D, 0, Z);
    l->o_wk = qc_param_table_add(t, "to_k.weight", 2, D, D, LW);
    l->o_wv = qc_param_table_add(t, "to_v.weight", 2, D, D, LW);
    l->o_bv = qc_param_table_add(t, "to_v.bias", 1, D, 0, Z);
    l->o_wkr = l->o_wvr = l->o_bvr = -1;
    if (has_pos) {
        l->o_wkr = qc_param_table_add(t, "to_k_r.weight", 2, D, D, LW);
        l->o_wvr = qc_param_table_add(t, "to_v_r.weight", 2, D, D, LW);
        l->o_bvr = qc_param_table_add(t, "to_v_r.bias", 1, D, 0, Z);
    }
    l->o_ws = qc_param_table_add(t, "to_s.weight", 2, D, D, LW);
    l->o_bs = qc_param_table_add(t, "to_s.bias", 1, D, 0, Z);
    l->o_wg = qc_param_table_add(t, "to_g.weight", 2, D, 2 * D, LW);
    l->o_bg = qc_param_table_add(t, "to_g.bias", 1, D, 0, Z);
    l->o_wo = qc_param_table_add(t, "to_out.weight", 2, D, D, LW);
    l->o_bo = qc_param_table_add(t, "to_out.bias", 1, D, 0, Z);
    l->o_ff0w = qc_param_table_add(t, "ff_mlp.0.weight", 2, l->FF, D, LW);
    l->o_ff0b = qc_param_table_add(t, "ff_mlp.0.bias", 1, l->FF, 0, Z);
    l->o_ff3w = qc_param_table_add(t, "ff_mlp.3.weight", 2, D, l->FF, LW);
    l->o_ff3b = qc_param_table_add(t, "ff_mlp.3.bias", 1, D, 0, Z);
    l->o_ln_src_w = qc_param_table_add(t, "attn_prenorm_x_src.weight", 1, D, 0, ONE);
    l->o_ln_src_b = qc_param_table_add(t, "attn_prenorm_x_src.bias", 1, D, 0, Z);
    if (bipartite) {
        l->o_ln_dst_w = qc_param_table_add(t, "attn_prenorm_x_dst.weight", 1, D, 0, ONE);
        l->o_ln_dst_b = qc_param_table_add(t, "attn_prenorm_x_dst.bias", 1, D, 0, Z);
    } else { /* alias: one LayerNorm module under two names (QCNET.md §2.1 ‡) */
        l->o_ln_dst_w = l->o_ln_src_w;
        l->o_ln_dst_b = l->o_ln_src_b;
    }
    l->o_ln_r_w = l->o_ln_r_b = -1;
    if (has_pos) {
        l->o_ln_r_w = qc_param_table_add(t, "attn_prenorm_r.weight", 1, D, 0, ONE);
        l->o_ln_r_b = qc_param_table_add(t, "attn_prenorm_r.bias", 1, D, 0, Z);
    }
    l->o_ln_post_w = qc_param_table_add(t, "attn_postnorm.weight", 1, D, 0, ONE);
    l->o_ln_post_b = qc_param_table_add(t, "attn_postnorm.bias", 1, D, 0, Z);
    l->o_ln_ffpre_w = qc_param_table_add(t, "ff_prenorm.weight", 1, D, 0, ONE);
    l->o_ln_ffpre_b = qc_param_table_add(t, "ff_prenorm.bias", 1, D, 0, Z);
    l->o_ln_ffpost_w = qc_param_table_add(t, "ff_postnorm.weight", 1, D, 0, ONE);
    l->o_ln_ffpost_b = qc_param_table_add(t, "ff_postnorm.bias", 1, D, 0, Z);
}

void qc_attn_bind(struct qc_attn *l, const float *w, float *dw)
{
    l->w = w;
    l->dw = dw;
}

// ---- graph ------------------------------------------------------------------------------

enum qc_status qc_attn_graph_check(const struct qc_attn_graph *g)
{
    /* host copies only: on a device backend the arrays themselves are device memory */
    const int64_t *row_ptr = attn_row_ptr_host(g), *src = attn_src_host(g);
    const int64_t *query_row = attn_query_row_host(g);
    if (g->n_src < 0 || g->n_dst < 0 || g->n_bdst < 0 || g->n_query < 1 || !row_ptr)
        return qc_errorf(QC_ERR_INVALID,
                         "attention graph: bad sizes (n_src %lld, n_dst %lld, "
                         "n_bdst %lld, Q %lld)",
                         (long long)g->n_src, (long long)g->n_dst, (long long)g->n_bdst,
                         (long long)g->n_query);
    if (row_ptr[0] != 0 || row_ptr[g->n_bdst] != g->n_edge)
        return qc_errorf(QC_ERR_INVALID,
                         "attention graph: row_ptr[0] = %lld, row_ptr[%lld] = "
                         "%lld, expected 0 and n_edge %lld",
                         (long long)row_ptr[0], (long long)g->n_bdst, (long long)row_ptr[g->n_bdst],
                         (long long)g->n_edge);
    for (int64_t b = 0; b < g->n_bdst; b++)
        if (row_ptr[b + 1] < row_ptr[b])
            return qc_errorf(QC_ERR_INVALID, "attention graph: row_ptr decreases at %lld",
                             (long long)b);
    for (int64_t e = 0; e < g->n_edge; e++)
        if (src[e] < 0 || src[e] >= g->n_src)
            return qc_errorf(QC_ERR_INVALID,
                             "attention graph: edge %lld: source %lld not in "
                             "[0, %lld)",
                             (long long)e, (long long)src[e], (long long)g->n_src);
    if (!g->query_row != !query_row)
        return qc_errorf(QC_ERR_INVALID,
                         "attention graph: query_row_host set without query_row (or the "
                         "reverse)");
    int64_t nq = g->n_bdst * g->n_query;
    if (!query_row && nq > g->n_dst)
        return qc_errorf(QC_ERR_INVALID, "attention graph: %lld queries but %lld x_dst rows",
                         (long long)nq, (long long)g->n_dst);
    if (query_row) {
        uint8_t *seen = calloc((size_t)(g->n_dst > 0 ? g->n_dst : 1), 1);
        if (!seen)
            return qc_errorf(QC_ERR_NOMEM, "attention graph check");
        for (int64_t i = 0; i < nq; i++) {
            int64_t r = query_row[i];
            if (r < 0 || r >= g->n_dst || seen[r]) {
                free(seen);
                return qc_errorf(QC_ERR_INVALID,
                                 "attention graph: query %lld: x_dst row %lld "
                                 "out of range or named twice",
                                 (long long)i, (long long)r);
            }
            seen[r] = 1;
        }
        free(seen);
    }
    return QC_OK;
}

// ---- memory specs (qc_memspec.h) ------------------------------------------------------------

static size_t i64_bytes(int64_t n)
{
    return (size_t)(n > 0 ? n : 0) * sizeof(int64_t);
}

void attn_by_src_spec(struct qc_attn_edges *ed, struct qc_memspec *s)
{
    if (!ed->by_src)
        qc_memspec_alloc(s, AMS_BY_SRC, &ed->mem, "edges.csr_by_src",
                         i64_bytes(attn_edges_by_src_n(ed->g)), 0,
                         QC_MEMSPEC_HOME_I64(&ed->by_src));
}

void attn_dr_spec(struct qc_attn_edges *ed, struct qc_memspec *s)
{
    if (!ed->dr)
        qc_memspec_alloc(s, AMS_DR, &ed->mem, "edges.dr",
                         qc_memspec_floats(ed->g->n_edge * ed->fe->D), QC_MEMSPEC_ZERO,
                         QC_MEMSPEC_HOME_F32(&ed->dr));
}

void attn_kv_grads_spec(struct qc_attn_kv *kv, struct qc_memspec *s)
{
    const bool fused = kv->ed->impl == QC_ATTN_FUSED;
    if (fused ? kv->dk != NULL : kv->dkt != NULL)
        return;
    const struct qc_attn_graph *g = kv->ed->g;
    const size_t bytes = qc_memspec_floats((fused ? g->n_src : g->n_edge) * kv->l->D);
    const struct qc_block_mem *bm = &kv->l->mem;
    qc_memspec_alloc(s, AMS_DK, bm, fused ? "kv.dk" : "kv.dkt", bytes, QC_MEMSPEC_ZERO,
                     QC_MEMSPEC_HOME_F32(fused ? &kv->dk : &kv->dkt));
    qc_memspec_alloc(s, AMS_DV, bm, fused ? "kv.dv" : "kv.dvt", bytes, QC_MEMSPEC_ZERO,
                     QC_MEMSPEC_HOME_F32(fused ? &kv->dv : &kv->dvt));
}

/* The kv gradient buffer id freed at the end of kv_backward: allocated in this spec (no
 * application ran backward), or by an earlier application's. */
static void kv_grad_release_spec(struct qc_attn_kv *kv, struct qc_memspec *s, int id)
{
    if (qc_memspec_has(s, id)) {
        qc_memspec_free(s, id);
        return;
    }
    const bool fused = kv->ed->impl == QC_ATTN_FUSED, k = id == AMS_DK;
    const struct qc_attn_graph *g = kv->ed->g;
    const size_t bytes = qc_memspec_floats((fused ? g->n_src : g->n_edge) * kv->l->D);
    float **home = fused ? (k ? &kv->dk : &kv->dv) : (k ? &kv->dkt : &kv->dvt);
    qc_memspec_free_home(s, id, &kv->l->mem,
                         fused ? (k ? "kv.dk" : "kv.dv") : (k ? "kv.dkt" : "kv.dvt"), bytes,
                         QC_MEMSPEC_HOME_F32(home));
}

void qc_attn_edges_memspec(struct qc_attn_edges *ed, enum qc_attn_pass pass, struct qc_memspec *s)
{
    qc_memspec_init(s);
    const struct qc_attn_graph *g = ed->g;
    const int64_t E = g->n_edge;
    if (pass == QC_ATTN_PASS_INIT) {
        qc_memspec_alloc(s, AMS_BDST, &ed->mem, "edges.bdst", i64_bytes(E), 0,
                         QC_MEMSPEC_HOME_I64(&ed->bdst));
        if (ed->impl == QC_ATTN_UNFUSED)
            qc_memspec_alloc(s, AMS_QINDEX, &ed->mem, "edges.query_index",
                             i64_bytes(attn_edges_qindex_n(g)), 0,
                             QC_MEMSPEC_HOME_I64(&ed->qindex));
        return;
    }
    const bool backward = pass == QC_ATTN_PASS_BACKWARD;
    if (!ed->fe || (ed->impl == QC_ATTN_FUSED && !attn_edges_shares_r(ed)))
        return;
    if (backward && !ed->dr) /* no layer produced a gradient */
        return;
    const int64_t D = ed->fe->D;
    if (ed->impl == QC_ATTN_FUSED) {
        qc_memspec_alloc(s, AMS_FE_TILES, &ed->mem,
                         backward ? "edges_backward.fe_tiles" : "edges_forward.fe_tiles",
                         qc_memspec_floats(attn_fused_fe_tiles_numel(ed, backward)), 0,
                         QC_MEMSPEC_LOCAL);
        qc_memspec_free(s, AMS_FE_TILES);
    } else {
        const bool cat = ed->cat_table && (!backward || ed->dcat_table);
        if (cat)
            qc_memspec_alloc(s, AMS_CAT, &ed->mem,
                             backward ? "edges_backward.dcat" : "edges_forward.cat",
                             qc_memspec_floats(E * D), 0, QC_MEMSPEC_LOCAL);
        struct qc_memspec fe;
        qc_fourier_memspec(ed->fe, E, backward, &fe);
        qc_memspec_nest(s, &fe);
        if (cat)
            qc_memspec_free(s, AMS_CAT);
    }
    if (backward)
        qc_memspec_free_home(s, AMS_DR, &ed->mem, "edges.dr", qc_memspec_floats(E * D),
                             QC_MEMSPEC_HOME_F32(&ed->dr));
}

void qc_attn_kv_memspec(struct qc_attn_kv *kv, bool backward, struct qc_memspec *s)
{
    qc_memspec_init(s);
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const int64_t Ns = ed->g->n_src, E = ed->g->n_edge, D = l->D;
    const bool fused = ed->impl == QC_ATTN_FUSED;
    if (!backward) {
        if (!fused) {
            qc_memspec_alloc(s, AMS_TMP, &l->mem, "kv_forward.k_v", qc_memspec_floats(2 * Ns * D),
                             0, QC_MEMSPEC_LOCAL);
            qc_memspec_free(s, AMS_TMP);
        }
        return;
    }
    qc_memspec_alloc(s, AMS_DXHAT, &l->mem, "kv_backward.dxhat_s", qc_memspec_floats(Ns * D), 0,
                     QC_MEMSPEC_LOCAL);
    attn_kv_grads_spec(kv, s); /* no application ran backward */
    if (!fused) {
        if (l->has_pos) {
            attn_dr_spec(ed, s);
            qc_memspec_alloc(s, AMS_DRHAT, &l->mem, "kv_backward.drhat", qc_memspec_floats(E * D),
                             0, QC_MEMSPEC_LOCAL);
            qc_memspec_free(s, AMS_DRHAT);
        }
        attn_by_src_spec(ed, s);
        qc_memspec_alloc(s, AMS_TMP, &l->mem, "kv_backward.dk_dv", qc_memspec_floats(2 * Ns * D), 0,
                         QC_MEMSPEC_LOCAL);
        qc_memspec_free(s, AMS_TMP);
    }
    kv_grad_release_spec(kv, s, AMS_DV);
    kv_grad_release_spec(kv, s, AMS_DK);
    qc_memspec_free(s, AMS_DXHAT);
}

/* An application's forward: it allocates nothing that outlives it. */
static void app_forward_spec(const struct qc_attn_kv *kv, struct qc_memspec *s)
{
    qc_memspec_init(s);
    const struct qc_attn *l = kv->l;
    const struct qc_attn_graph *g = kv->ed->g;
    const int64_t Nd = g->n_dst, D = l->D, FF = l->FF;
    const int64_t QB = g->n_query * g->n_bdst;
    const bool fused = kv->ed->impl == QC_ATTN_FUSED;
    const struct qc_block_mem *bm = &l->mem;
    {
        if (!fused) {
            qc_memspec_alloc(s, AMS_Q, bm, "forward.q", qc_memspec_floats(Nd * D), 0,
                             QC_MEMSPEC_LOCAL);
            qc_memspec_alloc(s, AMS_EDGE, bm, "unfused_forward.qseg_useg",
                             qc_memspec_floats((2 * QB + 1) * D), 0, QC_MEMSPEC_LOCAL);
            qc_memspec_free(s, AMS_EDGE);
            qc_memspec_free(s, AMS_Q);
        } else {
            const int64_t n = attn_fused_scratch_numel(kv, false);
            if (n > 0) {
                qc_memspec_alloc(s, AMS_EDGE, bm, "fused_tile.scratch", qc_memspec_floats(n), 0,
                                 QC_MEMSPEC_LOCAL);
                qc_memspec_free(s, AMS_EDGE);
            }
        }
        if (Nd > 0) {
            const int64_t R = attn_post_rows_of(l), n = Nd < R ? Nd : R;
            qc_memspec_alloc(s, AMS_POST, bm, "forward_post.scratch",
                             qc_memspec_floats(n * (4 * D + FF)), 0, QC_MEMSPEC_LOCAL);
            qc_memspec_free(s, AMS_POST);
        }
    }
}

void qc_attn_memspec(struct qc_attn_kv *kv, bool backward, struct qc_memspec *s)
{
    if (!backward) {
        app_forward_spec(kv, s);
        return;
    }
    qc_memspec_init(s);
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const int64_t Nd = ed->g->n_dst, D = l->D, FF = l->FF;
    const struct qc_block_mem *bm = &l->mem;
    qc_memspec_alloc(s, AMS_T, bm, "backward.du_dxhat_dq", qc_memspec_floats(3 * Nd * D), 0,
                     QC_MEMSPEC_LOCAL);
    if (Nd > 0) {
        const int64_t R = attn_post_rows_of(l), n = Nd < R ? Nd : R;
        qc_memspec_alloc(s, AMS_POST, bm, "backward_post.scratch",
                         qc_memspec_floats(n * (8 * D + 2 * FF)), 0, QC_MEMSPEC_LOCAL);
        qc_memspec_free(s, AMS_POST);
    }
    attn_edge_backward_spec(kv, s);
    qc_memspec_free(s, AMS_T);
}

void attn_edge_backward_spec(struct qc_attn_kv *kv, struct qc_memspec *s)
{
    const struct qc_attn *l = kv->l;
    struct qc_attn_edges *ed = kv->ed;
    const struct qc_attn_graph *g = ed->g;
    const int64_t D = l->D, E = g->n_edge, H = l->H, QB = g->n_query * g->n_bdst;
    const struct qc_block_mem *bm = &l->mem;
    attn_kv_grads_spec(kv, s); /* the first application's backward */
    if (ed->impl == QC_ATTN_UNFUSED) {
        qc_memspec_alloc(s, AMS_EDGE, bm, "unfused_backward.scratch",
                         qc_memspec_floats((2 * QB + 1) * D + E * H + E * D), 0, QC_MEMSPEC_LOCAL);
        qc_memspec_free(s, AMS_EDGE);
        return;
    }
    if (qc_attn_fused_wants_by_src(qc_block_exec(bm)))
        attn_by_src_spec(ed, s);
    if (l->has_pos && ed->fe && attn_edges_shares_r(ed))
        attn_dr_spec(ed, s);
    const int64_t n = attn_fused_scratch_numel(kv, true);
    if (n > 0) {
        qc_memspec_alloc(s, AMS_EDGE, bm, "fused_tile.scratch", qc_memspec_floats(n), 0,
                         QC_MEMSPEC_LOCAL);
        qc_memspec_free(s, AMS_EDGE);
    }
}

// ---- edge context -----------------------------------------------------------------------

enum qc_status qc_attn_edges_init(struct qc_attn_edges *ed, enum qc_attn_impl impl,
                                  const struct qc_attn_graph *g, const struct qc_fourier *fe,
                                  const float *feat, const float *cat_table, const int64_t *cat_idx,
                                  int64_t ncat, float *dcat_table)
{
    return qc_attn_edges_init_mem(ed, NULL, impl, g, fe, feat, cat_table, cat_idx, ncat,
                                  dcat_table);
}

enum qc_status qc_attn_edges_setup(struct qc_attn_edges *ed, const struct qc_block_mem *mem,
                                   enum qc_attn_impl impl, const struct qc_attn_graph *g,
                                   const struct qc_fourier *fe, const float *feat,
                                   const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                   float *dcat_table)
{
    memset(ed, 0, sizeof *ed);
    if (mem)
        ed->mem = *mem;
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    QC_ASSERT(!fe || qc_exec_backend_of(qc_block_exec(&fe->mem)) == qc_exec_backend_of(ex),
              "attention edges %s on the %s backend but its FourierEmbedding on %s",
              ed->mem.name[0] ? ed->mem.name : "block", qc_exec_backend_str(qc_exec_backend_of(ex)),
              qc_exec_backend_str(qc_exec_backend_of(qc_block_exec(&fe->mem))));
    ed->impl = impl;
    ed->g = g;
    ed->fe = fe;
    ed->feat = feat;
    ed->cat_table = cat_table;
    ed->cat_idx = cat_idx;
    ed->ncat = ncat;
    ed->dcat_table = dcat_table;
    const int64_t E = g->n_edge;
    qc_stash_init(&ed->fe_stash, impl == QC_ATTN_FUSED ? "edges.fe(fused: none)" : "edges.fe");
    qc_stash_init(&ed->stash, "edges");
    /* an empty edge set has no features (a zero-byte allocation may be NULL): the layer is
     * then its residual path alone (QCNET.md §3.3 step 8, u = 0) */
    if (fe && fe->d > 0 && !feat && E > 0)
        return qc_errorf(QC_ERR_INVALID, "attention edges: FE(%lld) needs edge features",
                         (long long)fe->d);
    if (cat_table && !cat_idx)
        return qc_errorf(QC_ERR_INVALID, "attention edges: categorical table without indices");
    if (impl == QC_ATTN_UNFUSED && fe)
        qc_fourier_stash_plan(fe, E, &ed->fe_stash);
    /* r = FE(feat [+ cat]): UNFUSED with the FE's stash; FUSED alone, shared by the layers in
     * the backend's default edge mode (MATERIALISED where its op takes r: attention_fused.c) */
    if (fe && impl == QC_ATTN_FUSED)
        ed->mode = qc_attn_fused_takes_r(ex) ? QC_ATTN_EDGE_MATERIALISED : QC_ATTN_EDGE_TILED;
    if (fe && (impl == QC_ATTN_UNFUSED || ed->mode == QC_ATTN_EDGE_MATERIALISED))
        qc_stash_add(&ed->stash, "r", QC_STASH_F32, 2, E, fe->D, 1, 1);
    return QC_OK;
}

const char *qc_attn_edge_mode_str(enum qc_attn_edge_mode mode)
{
    switch (mode) {
    case QC_ATTN_EDGE_AUTO:
        return "auto";
    case QC_ATTN_EDGE_MATERIALISED:
        return "materialised";
    case QC_ATTN_EDGE_TILED:
        return "tiled";
    }
    return "?";
}

enum qc_status qc_attn_edges_set_mode(struct qc_attn_edges *ed, enum qc_attn_edge_mode mode)
{
    const char *name = ed->mem.name[0] ? ed->mem.name : "attention edges";
    QC_ASSERT(!ed->stash.arena && !ed->dr, "%s: edge mode set after its stash was bound", name);
    if (mode != QC_ATTN_EDGE_AUTO && mode != QC_ATTN_EDGE_MATERIALISED &&
        mode != QC_ATTN_EDGE_TILED)
        return qc_errorf(QC_ERR_INVALID, "%s: edge mode %d is not auto|materialised|tiled", name,
                         (int)mode);
    if (ed->impl == QC_ATTN_UNFUSED) {
        if (mode == QC_ATTN_EDGE_TILED)
            return qc_errorf(QC_ERR_UNSUPPORTED,
                             "%s: edge mode tiled needs the fused attention (the unfused one "
                             "materialises r and the FE's tensors)\nhint: --set "
                             "model.attention=fused, or model.edge_mode=auto",
                             name);
        return QC_OK;
    }
    if (!ed->fe)
        return QC_OK;
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    if (mode == QC_ATTN_EDGE_AUTO)
        mode = qc_attn_fused_takes_r(ex) ? QC_ATTN_EDGE_MATERIALISED : QC_ATTN_EDGE_TILED;
    if (mode == QC_ATTN_EDGE_MATERIALISED && !qc_attn_fused_takes_r(ex))
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "%s: edge mode materialised is not available on the %s backend: its "
                         "fused attention computes r in its tiles (tiled)\nhint: --set "
                         "model.edge_mode=tiled (or auto)",
                         name, qc_exec_backend_str(qc_exec_target_of(ex)));
    if (mode == ed->mode)
        return QC_OK;
    qc_stash_deinit(&ed->stash);
    qc_stash_init(&ed->stash, "edges");
    if (mode == QC_ATTN_EDGE_MATERIALISED)
        qc_stash_add(&ed->stash, "r", QC_STASH_F32, 2, ed->g->n_edge, ed->fe->D, 1, 1);
    ed->mode = mode;
    return QC_OK;
}

enum qc_status qc_attn_edges_init_mem(struct qc_attn_edges *ed, const struct qc_block_mem *mem,
                                      enum qc_attn_impl impl, const struct qc_attn_graph *g,
                                      const struct qc_fourier *fe, const float *feat,
                                      const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                      float *dcat_table)
{
    const struct qc_exec *ex = mem ? qc_block_exec(mem) : NULL;
    attn_graph_require_host(g, ex);
    QC_TRY(qc_attn_graph_check(g));
    enum qc_status st =
        qc_attn_edges_setup(ed, mem, impl, g, fe, feat, cat_table, cat_idx, ncat, dcat_table);
    if (st != QC_OK) {
        qc_attn_edges_deinit(ed);
        return st;
    }
    /* bdst from the host CSR, then (UNFUSED) the query index arrays (attention_index.c) */
    struct qc_memspec ms;
    qc_attn_edges_memspec(ed, QC_ATTN_PASS_INIT, &ms);
    st = attn_edges_bdst_build(ed, &ms);
    if (st == QC_OK && impl == QC_ATTN_UNFUSED)
        st = attn_edges_query_index_build(ed, &ms);
    if (st != QC_OK)
        qc_attn_edges_deinit(ed); /* gives back what was built */
    return st;
}

void qc_attn_edges_deinit(struct qc_attn_edges *ed)
{
    if (!ed)
        return;
    const int64_t E = ed->g ? ed->g->n_edge : 0, D = ed->fe ? ed->fe->D : 0;
    blk_ffree(&ed->mem, ed->dr, E * D);
    if (ed->g) {
        qc_block_free(&ed->mem, ed->by_src, (size_t)attn_edges_by_src_n(ed->g) * sizeof(int64_t));
        qc_block_free(&ed->mem, ed->qindex, (size_t)attn_edges_qindex_n(ed->g) * sizeof(int64_t));
    }
    qc_block_free(&ed->mem, ed->bdst, (size_t)E * sizeof *ed->bdst);
    qc_attn_fused_tiles_deinit(ed->tiles);
    free(ed->tiles);
    qc_stash_deinit(&ed->fe_stash);
    qc_stash_deinit(&ed->stash);
    memset(ed, 0, sizeof *ed);
}

static enum qc_status edges_forward(struct qc_attn_edges *ed)
{
    if (!ed->fe || (ed->impl == QC_ATTN_FUSED && !attn_edges_shares_r(ed)))
        return QC_OK;
    struct qc_memspec ms;
    qc_attn_edges_memspec(ed, QC_ATTN_PASS_FORWARD, &ms);
    if (ed->impl == QC_ATTN_FUSED)
        return attn_fused_edges_forward(ed, &ms);
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    const int64_t E = ed->g->n_edge, D = ed->fe->D;
    float *cat = NULL;
    QC_TRY(qc_memspec_take_f32(&ms, AMS_CAT, &cat));
    if (cat)
        qc_op_embedding_forward(ex, cat, ed->cat_idx, ed->cat_table, E, D, ed->ncat);
    enum qc_status st =
        qc_fourier_forward(ed->fe, qc_stash_f32(&ed->stash, 0), &ed->fe_stash, ed->feat, cat, E);
    qc_memspec_give(&ms, AMS_CAT);
    return st;
}

static enum qc_status edges_backward(struct qc_attn_edges *ed)
{
    if (!ed->fe || (ed->impl == QC_ATTN_FUSED && !attn_edges_shares_r(ed)))
        return QC_OK;
    if (!ed->dr) /* no layer produced a gradient */
        return QC_OK;
    struct qc_memspec ms;
    qc_attn_edges_memspec(ed, QC_ATTN_PASS_BACKWARD, &ms);
    if (ed->impl == QC_ATTN_FUSED)
        return attn_fused_edges_backward(ed, &ms);
    const struct qc_exec *ex = qc_block_exec(&ed->mem);
    const int64_t E = ed->g->n_edge, D = ed->fe->D;
    float *dcat = NULL;
    QC_TRY(qc_memspec_take_f32(&ms, AMS_CAT, &dcat));
    enum qc_status st = qc_fourier_backward(ed->fe, NULL, dcat, ed->dr, &ed->fe_stash, ed->feat, E);
    if (st == QC_OK && dcat)
        qc_op_embedding_backward(ex, ed->dcat_table, dcat, ed->cat_idx, E, D, ed->ncat);
    qc_memspec_give(&ms, AMS_CAT);
    qc_memspec_give(&ms, AMS_DR);
    return st;
}

// ---- source/edge context ----------------------------------------------------------------

enum { KV_XHAT = 0, KV_MEAN, KV_RSTD };

void qc_attn_kv_init(struct qc_attn_kv *kv, const struct qc_attn *l, struct qc_attn_edges *ed)
{
    QC_ASSERT(l->has_pos == (ed->fe != NULL), "attention: has_pos %d but edge FE %s",
              (int)l->has_pos, ed->fe ? "given" : "missing");
    QC_ASSERT(!ed->fe || ed->fe->D == l->D, "attention: FE width %lld != D %lld",
              (long long)ed->fe->D, (long long)l->D);
    QC_ASSERT(qc_exec_backend_of(qc_block_exec(&l->mem)) ==
                  qc_exec_backend_of(qc_block_exec(&ed->mem)),
              "attention: layer %s on the %s backend but its edge context on %s",
              l->mem.name[0] ? l->mem.name : "block",
              qc_exec_backend_str(qc_exec_backend_of(qc_block_exec(&l->mem))),
              qc_exec_backend_str(qc_exec_backend_of(qc_block_exec(&ed->mem))));
    memset(kv, 0, sizeof *kv);
    kv->l = l;
    kv->ed = ed;
    const int64_t Ns = ed->g->n_src, E = ed->g->n_edge, D = l->D;
    qc_stash_init(&kv->stash, ed->impl == QC_ATTN_FUSED ? "attn_fused.kv" : "attn_unfused.kv");
    qc_stash_add(&kv->stash, "xhat_s", QC_STASH_F32, 2, Ns, D, 1, 1);
    qc_stash_add(&kv->stash, "ln_src.mean", QC_STASH_F32, 1, Ns, 1, 1, 1);
    qc_stash_add(&kv->stash, "ln_src.rstd", QC_STASH_F32, 1, Ns, 1, 1, 1);
    if (ed->impl == QC_ATTN_FUSED) {
        qc_stash_add(&kv->stash, "k", QC_STASH_F32, 2, Ns, D, 1, 1);
        qc_stash_add(&kv->stash, "v", QC_STASH_F32, 2, Ns, D, 1, 1);
    } else {
        if (l->has_pos) {
            qc_stash_add(&kv->stash, "rhat", QC_STASH_F32, 2, E, D, 1, 1);
            qc_stash_add(&kv->stash, "ln_r.mean", QC_STASH_F32, 1, E, 1, 1, 1);
            qc_stash_add(&kv->stash, "ln_r.rstd", QC_STASH_F32, 1, E, 1, 1, 1);
        }
        qc_stash_add(&kv->stash, "kt", QC_STASH_F32, 2, E, D, 1, 1);
        qc_stash_add(&kv->stash, "vt", QC_STASH_F32, 2, E, D, 1, 1);
    }
}

void qc_attn_kv_deinit(struct qc_attn_kv *kv)
{
    if (!kv)
        return;
    if (kv->l) { /* gradient buffers left by a backward that failed half-way */
        const struct qc_block_mem *bm = &kv->l->mem;
        const int64_t Ns = kv->ed->g->n_src, E = kv->ed->g->n_edge, D = kv->l->D;
        blk_ffree(bm, kv->dvt, E * D);
        blk_ffree(bm, kv->dkt, E * D);
        blk_ffree(bm, kv->dv, Ns * D);
        blk_ffree(bm, kv->dk, Ns * D);
    }
    qc_stash_deinit(&kv->stash);
    memset(kv, 0, sizeof *kv);
}

static enum qc_status kv_forward(struct qc_attn_kv *kv, const float *x_src)
{
    const struct qc_attn *l = kv->l;
    QC_ASSERT(l->w, "attention: parameters not bound");
    const int64_t Ns = kv->ed->g->n_src;
    qc_op_layernorm_forward(qc_block_exec(&l->mem), qc_stash_f32(&kv->stash, KV_XHAT),
                            qc_stash_f32(&kv->stash, KV_MEAN), qc_stash_f32(&kv->stash, KV_RSTD),
                            x_src, l->w + l->o_ln_src_w, l->w + l->o_ln_src_b, Ns, l->D);
    if (kv->ed->impl == QC_ATTN_FUSED)
        return attn_fused_kv_forward(kv);
    struct qc_memspec ms;
    qc_attn_kv_memspec(kv, false, &ms);
    return attn_unfused_kv_forward(kv, &ms);
}

static enum qc_status kv_backward(struct qc_attn_kv *kv, float *dx_src, const float *x_src,
                                  bool accum)
{
    const struct qc_attn *l = kv->l;
    QC_ASSERT(l->w && l->dw, "attention: parameters or gradients not bound");
    const int64_t Ns = kv->ed->g->n_src, D = l->D;
    struct qc_memspec ms;
    qc_attn_kv_memspec(kv, true, &ms);
    float *dxhat;
    QC_TRY(qc_memspec_take_f32(&ms, AMS_DXHAT, &dxhat));
    enum qc_status st = kv->ed->impl == QC_ATTN_FUSED ? attn_fused_kv_backward(kv, dxhat, &ms)
                                                      : attn_unfused_kv_backward(kv, dxhat, &ms);
    if (st == QC_OK)
        qc_op_layernorm_backward(
            qc_block_exec(&l->mem), dx_src, l->dw + l->o_ln_src_w, l->dw + l->o_ln_src_b, dxhat,
            x_src, qc_stash_f32(&kv->stash, KV_MEAN), qc_stash_f32(&kv->stash, KV_RSTD),
            l->w + l->o_ln_src_w, Ns, D, accum);
    qc_memspec_give_all(&ms); /* dxhat, and what a failure left */
    return st;
}

// ---- application: stash -----------------------------------------------------------------

void qc_attn_stash_plan(const struct qc_attn_kv *kv, struct qc_stash *st)
{
    const struct qc_attn *l = kv->l;
    const struct qc_attn_graph *g = kv->ed->g;
    const int64_t Nd = g->n_dst, D = l->D, H = l->H;
    QC_ASSERT(st->n == 0, "attention stash plan into a non-empty table %s", st->block);
    qc_stash_add(st, "xhat_d", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "ln_dst.mean", QC_STASH_F32, 1, Nd, 1, 1, 1);
    qc_stash_add(st, "ln_dst.rstd", QC_STASH_F32, 1, Nd, 1, 1, 1);
    if (kv->ed->impl == QC_ATTN_FUSED) {
        qc_stash_add(st, "q", QC_STASH_F32, 2, Nd, D, 1, 1);
        qc_stash_add(st, "softmax.max", QC_STASH_F32, 2, Nd, H, 1, 1);
        qc_stash_add(st, "softmax.sum", QC_STASH_F32, 2, Nd, H, 1, 1);
    } else {
        const int64_t QE = g->n_query * g->n_edge;
        qc_stash_add(st, "q_i", QC_STASH_F32, 2, QE, D, 1, 1);
        qc_stash_add(st, "alpha", QC_STASH_F32, 2, QE, H, 1, 1);
    }
    qc_stash_add(st, "u", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "g", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "to_s", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "to_out", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "ln_post.mean", QC_STASH_F32, 1, Nd, 1, 1, 1);
    qc_stash_add(st, "ln_post.rstd", QC_STASH_F32, 1, Nd, 1, 1, 1);
    qc_stash_add(st, "x1", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "ff_prenorm.mean", QC_STASH_F32, 1, Nd, 1, 1, 1);
    qc_stash_add(st, "ff_prenorm.rstd", QC_STASH_F32, 1, Nd, 1, 1, 1);
    qc_stash_add(st, "ff_prenorm.out", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "ff_relu", QC_STASH_F32, 2, Nd, l->FF, 1, 1);
    qc_stash_add(st, "ff_out", QC_STASH_F32, 2, Nd, D, 1, 1);
    qc_stash_add(st, "ff_postnorm.mean", QC_STASH_F32, 1, Nd, 1, 1, 1);
    qc_stash_add(st, "ff_postnorm.rstd", QC_STASH_F32, 1, Nd, 1, 1, 1);
}

void attn_app_index(const struct qc_stash *st, struct attn_app_idx *ix)
{
    ix->xhat_d = qc_stash_find(st, "xhat_d");
    ix->ln_dst_mean = qc_stash_find(st, "ln_dst.mean");
    ix->ln_dst_rstd = qc_stash_find(st, "ln_dst.rstd");
    ix->u = qc_stash_find(st, "u");
    ix->g = qc_stash_find(st, "g");
    ix->sres = qc_stash_find(st, "to_s");
    ix->a = qc_stash_find(st, "to_out");
    ix->post_mean = qc_stash_find(st, "ln_post.mean");
    ix->post_rstd = qc_stash_find(st, "ln_post.rstd");
    ix->x1 = qc_stash_find(st, "x1");
    ix->ffpre_mean = qc_stash_find(st, "ff_prenorm.mean");
    ix->ffpre_rstd = qc_stash_find(st, "ff_prenorm.rstd");
    ix->y = qc_stash_find(st, "ff_prenorm.out");
    ix->h1 = qc_stash_find(st, "ff_relu");
    ix->f = qc_stash_find(st, "ff_out");
    ix->ffpost_mean = qc_stash_find(st, "ff_postnorm.mean");
    ix->ffpost_rstd = qc_stash_find(st, "ff_postnorm.rstd");
    ix->q = qc_stash_find(st, "q");
    ix->smax = qc_stash_find(st, "softmax.max");
    ix->ssum = qc_stash_find(st, "softmax.sum");
    ix->qi = qc_stash_find(st, "q_i");
    ix->alpha = qc_stash_find(st, "alpha");
    QC_ASSERT(ix->xhat_d >= 0 && ix->ffpost_rstd >= 0, "stash %s is not an attention stash",
              st->block);
}

// ---- application: node-level half ---------------------------------------------------------

#define SF(i) qc_stash_f32(st, (i))

void attn_node_forward_pre(const struct qc_attn *l, float *q, const struct qc_stash *st,
                           const struct attn_app_idx *ix, const float *x_dst, int64_t Nd)
{
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *w = l->w;
    const int64_t D = l->D;
    qc_op_layernorm_forward(ex, SF(ix->xhat_d), SF(ix->ln_dst_mean), SF(ix->ln_dst_rstd), x_dst,
                            w + l->o_ln_dst_w, w + l->o_ln_dst_b, Nd, D);
    qc_op_linear_forward(ex, q, SF(ix->xhat_d), D, w + l->o_wq, w + l->o_bq, Nd, D, D, false);
}

int64_t attn_post_rows(int64_t D, int64_t FF)
{
    const int64_t per_row = (8 * D + 2 * FF) * (int64_t)sizeof(float);
    int64_t rows = (int64_t)QC_ATTN_POST_CHUNK_BYTES / (per_row > 0 ? per_row : 1);
    rows -= rows % 64;
    return rows > 64 ? rows : 64;
}

/* Rows [r0, r0 + n) of the node-level forward half. */
static void forward_post_rows(const struct qc_attn *l, float *out, const struct qc_stash *st,
                              const struct attn_app_idx *ix, const float *x_dst, int64_t r0,
                              int64_t n, const struct qc_dropout *drop_all, float *t)
{
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *w = l->w;
    const int64_t D = l->D, FF = l->FF, o = r0 * D;
    float *cat = t, *up = t + 2 * n * D, *tmp = t + 3 * n * D, *hd = t + 4 * n * D;
    const float *xhat = SF(ix->xhat_d) + o, *u = SF(ix->u) + o;
    float *g = SF(ix->g) + o, *sres = SF(ix->sres) + o, *a = SF(ix->a) + o, *x1 = SF(ix->x1) + o;
    float *y = SF(ix->y) + o, *h1 = SF(ix->h1) + r0 * FF, *f = SF(ix->f) + o;
    /* 9. g = σ([u ‖ x̂_d]·W_gᵀ + b_g); u' = u + g ⊙ (to_s(x̂_d) − u) */
    qc_op_copy2d(ex, cat, 2 * D, u, D, n, D, false);
    qc_op_copy2d(ex, cat + D, 2 * D, xhat, D, n, D, false);
    qc_op_linear_forward(ex, g, cat, 2 * D, w + l->o_wg, w + l->o_bg, n, 2 * D, D, false);
    qc_op_sigmoid_forward(ex, g, g, n * D);
    qc_op_linear_forward(ex, sres, xhat, D, w + l->o_ws, w + l->o_bs, n, D, D, false);
    qc_op_gate_update_forward(ex, up, u, g, sres, n * D);
    /* 10–11. a = to_out(u'); x1 = x0 + LN_post(a) */
    qc_op_linear_forward(ex, a, up, D, w + l->o_wo, w + l->o_bo, n, D, D, false);
    qc_op_layernorm_forward(ex, tmp, SF(ix->post_mean) + r0, SF(ix->post_rstd) + r0, a,
                            w + l->o_ln_post_w, w + l->o_ln_post_b, n, D);
    qc_op_add_forward(ex, x1, x_dst + o, tmp, n * D);
    /* 12–13. FFN with dropout, out = x1 + LN_ffpost(f) */
    qc_op_layernorm_forward(ex, y, SF(ix->ffpre_mean) + r0, SF(ix->ffpre_rstd) + r0, x1,
                            w + l->o_ln_ffpre_w, w + l->o_ln_ffpre_b, n, D);
    qc_op_linear_forward(ex, h1, y, D, w + l->o_ff0w, w + l->o_ff0b, n, D, FF, false);
    qc_op_relu_forward(ex, h1, h1, n * FF);
    struct qc_dropout drop = *drop_all;
    drop.index_base = drop_all->index_base + r0 * FF; /* the site is the whole (Nd, FF) */
    qc_op_dropout_forward(ex, hd, h1, n * FF, &drop);
    qc_op_linear_forward(ex, f, hd, FF, w + l->o_ff3w, w + l->o_ff3b, n, FF, D, false);
    qc_op_layernorm_forward(ex, tmp, SF(ix->ffpost_mean) + r0, SF(ix->ffpost_rstd) + r0, f,
                            w + l->o_ln_ffpost_w, w + l->o_ln_ffpost_b, n, D);
    qc_op_add_forward(ex, out + o, x1, tmp, n * D);
}

enum qc_status attn_node_forward_post(const struct qc_attn *l, float *out,
                                      const struct qc_stash *st, const struct attn_app_idx *ix,
                                      const float *x_dst, int64_t Nd, const struct qc_attn_ctx *ctx,
                                      struct qc_memspec *ms)
{
    if (Nd == 0)
        return QC_OK;
    float *t;
    QC_TRY(qc_memspec_take_f32(ms, AMS_POST, &t)); /* R·(4·D + FF), R = min(Nd, post rows) */
    const struct qc_dropout drop = attn_drop_ffn(ctx, Nd, l->FF);
    const int64_t R = attn_post_rows_of(l);
    for (int64_t r0 = 0; r0 < Nd; r0 += R)
        forward_post_rows(l, out, st, ix, x_dst, r0, Nd - r0 < R ? Nd - r0 : R, &drop, t);
    qc_memspec_give(ms, AMS_POST);
    return QC_OK;
}

/* Rows [r0, r0 + n) of the node-level backward half; the parameter gradients accumulate. */
static void backward_post_rows(const struct qc_attn *l, float *du, float *dxhat, float *dx_dst,
                               const float *dout, const struct qc_stash *st,
                               const struct attn_app_idx *ix, int64_t r0, int64_t n,
                               const struct qc_dropout *drop_all, float *t)
{
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *w = l->w;
    float *dw = l->dw;
    const int64_t D = l->D, FF = l->FF, o = r0 * D;
    /* dy and da are adjacent so that, once free, they hold the (n,2D) gradient of [u ‖ x̂_d] */
    float *df = t, *dy = t + n * D, *da = t + 2 * n * D, *up = t + 3 * n * D;
    float *dup = t + 4 * n * D, *dg = t + 5 * n * D, *cat = t + 6 * n * D; /* cat (n,2D) */
    float *hd = t + 8 * n * D, *dhd = t + 8 * n * D + n * FF;
    const float *xhat = SF(ix->xhat_d) + o, *u = SF(ix->u) + o, *g = SF(ix->g) + o;
    const float *sres = SF(ix->sres) + o, *a = SF(ix->a) + o, *x1 = SF(ix->x1) + o;
    const float *y = SF(ix->y) + o, *h1 = SF(ix->h1) + r0 * FF, *f = SF(ix->f) + o;
    du += o;
    dxhat += o;
    dx_dst += o;
    dout += o;

    /* 13. out = x1 + LN_ffpost(f): dx1 = dout (residual, kept in dx_dst), df */
    qc_op_copy(ex, dx_dst, dout, (size_t)(n * D) * sizeof *dx_dst);
    qc_op_layernorm_backward(ex, df, dw + l->o_ln_ffpost_w, dw + l->o_ln_ffpost_b, dout, f,
                             SF(ix->ffpost_mean) + r0, SF(ix->ffpost_rstd) + r0,
                             w + l->o_ln_ffpost_w, n, D, false);
    /* 12. f = W3·dropout(ReLU(W0·y + b0)) + b3; the dropout mask is redrawn from Philox */
    struct qc_dropout drop = *drop_all;
    drop.index_base = drop_all->index_base + r0 * FF;
    qc_op_dropout_forward(ex, hd, h1, n * FF, &drop);
    qc_op_linear_backward(ex, dhd, FF, dw + l->o_ff3w, dw + l->o_ff3b, df, hd, FF, w + l->o_ff3w, n,
                          FF, D, false);
    qc_op_dropout_backward(ex, dhd, dhd, n * FF, &drop);
    qc_op_relu_backward(ex, dhd, dhd, h1, n * FF);
    qc_op_linear_backward(ex, dy, D, dw + l->o_ff0w, dw + l->o_ff0b, dhd, y, D, w + l->o_ff0w, n, D,
                          FF, false);
    qc_op_layernorm_backward(ex, dx_dst, dw + l->o_ln_ffpre_w, dw + l->o_ln_ffpre_b, dy, x1,
                             SF(ix->ffpre_mean) + r0, SF(ix->ffpre_rstd) + r0, w + l->o_ln_ffpre_w,
                             n, D, true);
    /* 11. x1 = x0 + LN_post(a): dx0 = dx1 (dx_dst keeps it), da */
    qc_op_layernorm_backward(ex, da, dw + l->o_ln_post_w, dw + l->o_ln_post_b, dx_dst, a,
                             SF(ix->post_mean) + r0, SF(ix->post_rstd) + r0, w + l->o_ln_post_w, n,
                             D, false);
    /* 10. a = u'·W_oᵀ + b_o, u' recomputed from (u, g, to_s) */
    qc_op_gate_update_forward(ex, up, u, g, sres, n * D);
    qc_op_linear_backward(ex, dup, D, dw + l->o_wo, dw + l->o_bo, da, up, D, w + l->o_wo, n, D, D,
                          false);
    /* 9. gate */
    float *dsres = up; /* u' is no longer needed */
    qc_op_gate_update_backward(ex, du, dg, dsres, dup, u, g, sres, n * D);
    qc_op_linear_backward(ex, dxhat, D, dw + l->o_ws, dw + l->o_bs, dsres, xhat, D, w + l->o_ws, n,
                          D, D, false);
    qc_op_sigmoid_backward(ex, dg, dg, g, n * D);
    qc_op_copy2d(ex, cat, 2 * D, u, D, n, D, false);
    qc_op_copy2d(ex, cat + D, 2 * D, xhat, D, n, D, false);
    float *dcat2 = dy; /* dy (n,D) and da (n,D) are adjacent and free: (n,2D) */
    qc_op_linear_backward(ex, dcat2, 2 * D, dw + l->o_wg, dw + l->o_bg, dg, cat, 2 * D, w + l->o_wg,
                          n, 2 * D, D, false);
    qc_op_copy2d(ex, du, D, dcat2, 2 * D, n, D, true);
    qc_op_copy2d(ex, dxhat, D, dcat2 + D, 2 * D, n, D, true);
}

enum qc_status attn_node_backward_post(const struct qc_attn *l, float *du, float *dxhat,
                                       float *dx_dst, const float *dout, const struct qc_stash *st,
                                       const struct attn_app_idx *ix, int64_t Nd,
                                       const struct qc_attn_ctx *ctx, struct qc_memspec *ms)
{
    if (Nd == 0)
        return QC_OK;
    float *t;
    QC_TRY(qc_memspec_take_f32(ms, AMS_POST, &t)); /* R·(8·D + 2·FF), R = min(Nd, post rows) */
    const struct qc_dropout drop = attn_drop_ffn(ctx, Nd, l->FF);
    const int64_t R = attn_post_rows_of(l);
    for (int64_t r0 = 0; r0 < Nd; r0 += R)
        backward_post_rows(l, du, dxhat, dx_dst, dout, st, ix, r0, Nd - r0 < R ? Nd - r0 : R, &drop,
                           t);
    qc_memspec_give(ms, AMS_POST);
    return QC_OK;
}

void attn_node_backward_pre(const struct qc_attn *l, float *dx_dst, float *dxhat, const float *dq,
                            const struct qc_stash *st, const struct attn_app_idx *ix,
                            const float *x_dst, int64_t Nd)
{
    const struct qc_exec *ex = qc_block_exec(&l->mem);
    const float *w = l->w;
    float *dw = l->dw;
    const int64_t D = l->D;
    if (Nd == 0)
        return;
    qc_op_linear_backward(ex, dxhat, D, dw + l->o_wq, dw + l->o_bq, dq, SF(ix->xhat_d), D,
                          w + l->o_wq, Nd, D, D, true);
    qc_op_layernorm_backward(ex, dx_dst, dw + l->o_ln_dst_w, dw + l->o_ln_dst_b, dxhat, x_dst,
                             SF(ix->ln_dst_mean), SF(ix->ln_dst_rstd), w + l->o_ln_dst_w, Nd, D,
                             true);
}

// ---- application: dispatch ----------------------------------------------------------------

static enum qc_status attn_forward(const struct qc_attn_kv *kv, float *out, struct qc_stash *st,
                                   const float *x_dst, const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const int64_t Nd = kv->ed->g->n_dst;
    QC_ASSERT(l->w, "attention: parameters not bound");
    struct attn_app_idx ix;
    attn_app_index(st, &ix);
    QC_ASSERT(st->e[ix.xhat_d].ne[0] == Nd, "attention: stash %s planned for %lld rows, not %lld",
              st->block, (long long)st->e[ix.xhat_d].ne[0], (long long)Nd);
    const bool fused = kv->ed->impl == QC_ATTN_FUSED;
    struct qc_memspec ms;
    app_forward_spec(kv, &ms);
    float *q = NULL;
    if (fused)
        q = SF(ix.q);
    else
        QC_TRY(qc_memspec_take_f32(&ms, AMS_Q, &q));
    attn_node_forward_pre(l, q, st, &ix, x_dst, Nd);
    enum qc_status s = fused ? attn_fused_edge_forward(kv, q, st, &ix, ctx, &ms)
                             : attn_unfused_edge_forward(kv, q, st, &ix, ctx, &ms);
    qc_memspec_give(&ms, AMS_Q);
    if (s == QC_OK)
        s = attn_node_forward_post(l, out, st, &ix, x_dst, Nd, ctx, &ms);
    qc_memspec_give_all(&ms);
    return s;
}

static enum qc_status attn_backward(struct qc_attn_kv *kv, float *dx_dst, const float *dout,
                                    const struct qc_stash *st, const float *x_dst,
                                    const struct qc_attn_ctx *ctx)
{
    const struct qc_attn *l = kv->l;
    const int64_t Nd = kv->ed->g->n_dst, D = l->D;
    QC_ASSERT(l->w && l->dw, "attention: parameters or gradients not bound");
    struct attn_app_idx ix;
    attn_app_index(st, &ix);
    struct qc_memspec ms;
    qc_attn_memspec(kv, true, &ms);
    float *t;
    QC_TRY(qc_memspec_take_f32(&ms, AMS_T, &t)); /* 3·Nd·D */
    float *du = t, *dxhat = t + Nd * D, *dq = t + 2 * Nd * D;
    enum qc_status s = attn_node_backward_post(l, du, dxhat, dx_dst, dout, st, &ix, Nd, ctx, &ms);
    if (s == QC_OK)
        s = kv->ed->impl == QC_ATTN_FUSED
                ? attn_fused_edge_backward(kv, dq, du, st, &ix, ctx, &ms)
                : attn_unfused_edge_backward(kv, dq, du, st, &ix, ctx, &ms);
    if (s == QC_OK)
        attn_node_backward_pre(l, dx_dst, dxhat, dq, st, &ix, x_dst, Nd);
    qc_memspec_give_all(&ms);
    return s;
}

// ---- the profiler's block spans -------------------------------------------------------------

enum qc_status qc_attn_edges_forward(struct qc_attn_edges *ed)
{
    if (!qc_prof_on() || !ed->fe || (ed->impl == QC_ATTN_FUSED && !attn_edges_shares_r(ed)))
        return edges_forward(ed);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &ed->mem, "", QC_PROF_PASS_FORWARD);
    const enum qc_status s = edges_forward(ed);
    blk_prof_end(&m);
    return s;
}

enum qc_status qc_attn_edges_backward(struct qc_attn_edges *ed)
{
    if (!qc_prof_on() || !ed->fe || (ed->impl == QC_ATTN_FUSED && !attn_edges_shares_r(ed)))
        return edges_backward(ed);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &ed->mem, "", QC_PROF_PASS_BACKWARD);
    const enum qc_status s = edges_backward(ed);
    blk_prof_end(&m);
    return s;
}

enum qc_status qc_attn_kv_forward(struct qc_attn_kv *kv, const float *x_src)
{
    if (!qc_prof_on())
        return kv_forward(kv, x_src);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &kv->l->mem, ".kv", QC_PROF_PASS_FORWARD);
    const enum qc_status s = kv_forward(kv, x_src);
    blk_prof_end(&m);
    return s;
}

enum qc_status qc_attn_kv_backward(struct qc_attn_kv *kv, float *dx_src, const float *x_src,
                                   bool accum)
{
    if (!qc_prof_on())
        return kv_backward(kv, dx_src, x_src, accum);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &kv->l->mem, ".kv", QC_PROF_PASS_BACKWARD);
    const enum qc_status s = kv_backward(kv, dx_src, x_src, accum);
    blk_prof_end(&m);
    return s;
}

enum qc_status qc_attn_forward(const struct qc_attn_kv *kv, float *out, struct qc_stash *st,
                               const float *x_dst, const struct qc_attn_ctx *ctx)
{
    if (!qc_prof_on())
        return attn_forward(kv, out, st, x_dst, ctx);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &kv->l->mem, "", QC_PROF_PASS_FORWARD);
    const enum qc_status s = attn_forward(kv, out, st, x_dst, ctx);
    blk_prof_end(&m);
    return s;
}

enum qc_status qc_attn_backward(struct qc_attn_kv *kv, float *dx_dst, const float *dout,
                                const struct qc_stash *st, const float *x_dst,
                                const struct qc_attn_ctx *ctx)
{
    if (!qc_prof_on())
        return attn_backward(kv, dx_dst, dout, st, x_dst, ctx);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &kv->l->mem, "", QC_PROF_PASS_BACKWARD);
    const enum qc_status s = attn_backward(kv, dx_dst, dout, st, x_dst, ctx);
    blk_prof_end(&m);
    return s;
}
