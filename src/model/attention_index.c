/*
 * attention_index.c — the index arrays an attention edge context derives from its graph: each is
 * computed on the host from the graph's host copies and uploaded once per edge context, into
 * memory the context's spec names (attn_index_begin / _commit: written in place on the CPU
 * backend, through a malloc'ed staging copy on a device backend).
 *
 *   bdst           (E) the base x_dst row of each edge, built at edges_init
 *   query index    UNFUSED: qidx, qinv, iota (struct attn_query_index), built at edges_init
 *   CSR by source  the base edges grouped by source, built by the first call that needs it
 *
 * Below attention_common.c and both edge parts (attention_unfused.c, attention_fused.c): they
 * read these arrays, and this file calls none of them.
 */
#include <stdlib.h>

#include "blocks_internal.h"
#include "qc_exec.h"
#include "qc_kernels.h"

enum qc_status attn_index_begin(struct qc_memspec *s, int id, int64_t **host)
{
    void *d = NULL;
    QC_TRY(qc_memspec_take(s, id, &d));
    const struct qc_memspec_tensor *t = &s->t[s->id[id]];
    QC_ASSERT(d && t->home.i64, "attention: index array %s is not a home-held spec tensor",
              t->name);
    int64_t *h = d;
    if (qc_exec_is_device(qc_block_exec(t->bm)) && !(h = malloc(t->bytes ? t->bytes : 1))) {
        qc_memspec_give(s, id);
        return qc_errorf(QC_ERR_NOMEM, "%s/%s: host staging of %zu bytes failed",
                         t->bm && t->bm->name[0] ? t->bm->name : "block", t->name, t->bytes);
    }
    *host = h;
    return QC_OK;
}

enum qc_status attn_index_commit(struct qc_memspec *s, int id, int64_t *host)
{
    const struct qc_memspec_tensor *t = &s->t[s->id[id]];
    int64_t *dev = *t->home.i64;
    if (host == dev) /* CPU: written in place */
        return QC_OK;
    enum qc_status st = qc_op_upload(qc_block_exec(t->bm), dev, host, t->bytes);
    free(host);
    if (st != QC_OK)
        qc_memspec_give(s, id);
    return st;
}

enum qc_status attn_edges_bdst_build(struct qc_attn_edges *ed, struct qc_memspec *s)
{
    const struct qc_attn_graph *g = ed->g;
    const int64_t *row_ptr = attn_row_ptr_host(g);
    int64_t *h;
    QC_TRY(attn_index_begin(s, AMS_BDST, &h));
    for (int64_t b = 0; b < g->n_bdst; b++)
        for (int64_t e = row_ptr[b]; e < row_ptr[b + 1]; e++)
            h[e] = b;
    return attn_index_commit(s, AMS_BDST, h);
}

struct attn_query_index attn_edges_query_index(const struct qc_attn_edges *ed)
{
    const struct qc_attn_graph *g = ed->g;
    QC_ASSERT(ed->qindex, "attention edges: no query index (FUSED context, or not initialised)");
    const int64_t QB = g->n_query * g->n_bdst;
    struct attn_query_index x = {ed->qindex, ed->qindex + QB, ed->qindex + QB + g->n_dst};
    return x;
}

enum qc_status attn_edges_query_index_build(struct qc_attn_edges *ed, struct qc_memspec *s)
{
    const struct qc_attn_graph *g = ed->g;
    const int64_t nb = g->n_bdst, Q = g->n_query, QB = Q * nb, Nd = g->n_dst, E = g->n_edge;
    int64_t *h;
    QC_TRY(attn_index_begin(s, AMS_QINDEX, &h));
    int64_t *qidx = h, *qinv = h + QB, *iota = h + QB + Nd;
    for (int64_t i = 0; i < Nd; i++)
        qinv[i] = QB;
    for (int64_t k = 0; k < Q; k++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t r = attn_query_row(g, b, k);
            qidx[k * nb + b] = r;
            qinv[r] = k * nb + b;
        }
    for (int64_t e = 0; e <= E; e++)
        iota[e] = e;
    return attn_index_commit(s, AMS_QINDEX, h);
}

enum qc_status attn_edges_by_src(struct qc_attn_edges *ed, struct qc_memspec *s, struct qc_csr *csr)
{
    const struct qc_attn_graph *g = ed->g;
    const int64_t Ns = g->n_src, E = g->n_edge;
    if (!ed->by_src) {
        int64_t *h;
        QC_TRY(attn_index_begin(s, AMS_BY_SRC, &h));
        qc_csr_build_cpu(h, h + Ns + 1, attn_src_host(g), E, Ns);
        QC_TRY(attn_index_commit(s, AMS_BY_SRC, h));
    }
    struct qc_csr c = {ed->by_src, ed->by_src + Ns + 1, g->src, Ns, E};
    *csr = c;
    return QC_OK;
}
