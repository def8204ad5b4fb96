/*
 * qcnet_inputs.c — what a forward derives from its batch before the first block runs: the batch
 * as op arguments (tape.dbatch: the host batch on the CPU, a device view on device backends,
 * copied in here unless the caller passed ctx.batch_dev) and the attention graph of every edge
 * set (tape.g), with the index arrays the model computes on the host (pl2a source polygons,
 * mode-major query rows, int64 pl2pl types) uploaded into context memory.
 */
#include <stdlib.h>
#include <string.h>

#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qcnet_internal.h"

// ---- graph views --------------------------------------------------------------------------

static enum qc_status check_set(const struct qc_graph *g, enum qc_edge_set s, int64_t nsrc,
                                int64_t ndst)
{
    const struct qc_edges *e = &g->e[s];
    if (e->num_src != nsrc || e->num_dst != ndst || (!e->dst_ptr && ndst > 0))
        return qc_errorf(QC_ERR_INVALID,
                         "model: edge set %s: %lld sources / %lld destinations, expected %lld / "
                         "%lld",
                         qc_edge_set_name(s), (long long)e->num_src, (long long)e->num_dst,
                         (long long)nsrc, (long long)ndst);
    return QC_OK;
}

/* The attention graph of edge set s: arrays of the device graph (op arguments) and, on device
 * backends, host mirrors from the host graph. src / query_row replace the set's source rows /
 * give the query rows (NULL: the set's own / b*Q + k), with their host copies. */
static void view(const struct qc_qcnet *m, struct qc_attn_graph *v, enum qc_edge_set s,
                 int64_t n_src, int64_t n_dst, int64_t n_bdst, int64_t Q, const int64_t *src,
                 const int64_t *src_host, const int64_t *query_row, const int64_t *query_row_host)
{
    const struct qcnet_tape *t = &m->tape;
    const struct qc_edges *he = &t->batch->graph.e[s], *de = &t->dbatch->graph.e[s];
    memset(v, 0, sizeof *v);
    v->n_src = n_src;
    v->n_dst = n_dst;
    v->n_bdst = n_bdst;
    v->n_query = Q;
    v->n_edge = he->num_edges;
    v->row_ptr = de->dst_ptr;
    v->src = src ? src : de->src;
    v->query_row = query_row;
    if (qc_exec_is_device(m->ex)) {
        v->row_ptr_host = he->dst_ptr;
        v->src_host = src ? src_host : he->src;
        v->query_row_host = query_row ? query_row_host : NULL;
    }
}

/* n int64 the host computes for the ops: on CPU straight into context memory (tag), which is
 * also the host copy; on a device backend a malloc'ed host buffer (*host, the mirror, freed by
 * release) that index_commit uploads into context memory (same tag and bytes). */
static enum qc_status index_host(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **dev,
                                 int64_t **host)
{
    if (m->dry) { /* the allocation only: no host copy, no host work */
        *host = NULL;
        return qcnet_ialloc(m, n, tag, dev);
    }
    if (!qc_exec_is_device(m->ex)) {
        QC_TRY(qcnet_ialloc(m, n, tag, dev));
        *host = *dev;
        return QC_OK;
    }
    *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!*host)
        return qc_errorf(QC_ERR_NOMEM, "model: host copy of %s (%lld entries)", tag, (long long)n);
    return QC_OK;
}

static enum qc_status index_commit(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **dev,
                                   const int64_t *host)
{
    if (!qc_exec_is_device(m->ex) || m->dry)
        return QC_OK;
    void *p = NULL;
    QC_TRY(qcnet_upload(m, host, (size_t)(n > 0 ? n : 0) * sizeof(int64_t), tag, &p));
    *dev = p;
    return QC_OK;
}

enum qc_status qcnet_tape_graphs(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_graph *g = &t->batch->graph; /* host: counts and the arrays read here */
    const int64_t A = t->A, P = t->P, Pt = t->Pt, K = t->K, T = QCNET_T;
    QC_TRY(check_set(g, QC_EDGE_PT2PL, Pt, P));
    QC_TRY(check_set(g, QC_EDGE_PL2PL, P, P));
    QC_TRY(check_set(g, QC_EDGE_T, T * A, T * A));
    QC_TRY(check_set(g, QC_EDGE_PL2A, T * P, T * A));
    QC_TRY(check_set(g, QC_EDGE_A2A, T * A, T * A));
    QC_TRY(check_set(g, QC_EDGE_T2M, T * A, A));
    QC_TRY(check_set(g, QC_EDGE_PL2M, P, A));
    QC_TRY(check_set(g, QC_EDGE_A2M, A, A));
    QC_TRY(check_set(g, QC_EDGE_M2M, K * A, K * A));
    /* pl2a sources are polygon-steps t·P + p whose features are x_pl[p] at every t: read the
     * polygon row directly (QCNET.md §8.8 polygon time-broadcast) */
    const struct qc_edges *pl2a = &g->e[QC_EDGE_PL2A];
    const char *tag = "graph/pl2a.src_polygon";
    QC_TRY(index_host(m, pl2a->num_edges, tag, &t->pl2a_src, &t->pl2a_src_host));
    for (int64_t e = 0; e < pl2a->num_edges && !m->dry; e++)
        t->pl2a_src_host[e] = pl2a->src[e] % P;
    QC_TRY(index_commit(m, pl2a->num_edges, tag, &t->pl2a_src, t->pl2a_src_host));
    /* pl2m and a2m queries are mode-major rows k·A + a */
    tag = "graph/mode_major_query";
    QC_TRY(index_host(m, A * K, tag, &t->pl2m_query, &t->pl2m_query_host));
    for (int64_t a = 0; a < A && !m->dry; a++)
        for (int64_t k = 0; k < K; k++)
            t->pl2m_query_host[a * K + k] = k * A + a;
    QC_TRY(index_commit(m, A * K, tag, &t->pl2m_query, t->pl2m_query_host));
    const struct qc_edges *pl2pl = &g->e[QC_EDGE_PL2PL];
    tag = "graph/pl2pl.type";
    QC_TRY(index_host(m, pl2pl->num_edges, tag, &t->pl2pl_type, &t->pl2pl_type_host));
    for (int64_t e = 0; e < pl2pl->num_edges && !m->dry; e++) {
        const int64_t ty = pl2pl->type ? (int64_t)pl2pl->type[e] : 0;
        if (ty < 0 || ty >= 5) /* the type_pl2pl_emb vocabulary */
            return qc_errorf(QC_ERR_INVALID, "model forward: pl2pl edge %lld: type %lld",
                             (long long)e, (long long)ty);
        t->pl2pl_type_host[e] = ty;
    }
    QC_TRY(index_commit(m, pl2pl->num_edges, tag, &t->pl2pl_type, t->pl2pl_type_host));

    view(m, &t->g[QC_EDGE_PT2PL], QC_EDGE_PT2PL, Pt, P, P, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_PL2PL], QC_EDGE_PL2PL, P, P, P, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_T], QC_EDGE_T, T * A, T * A, T * A, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_PL2A], QC_EDGE_PL2A, P, T * A, T * A, 1, t->pl2a_src, t->pl2a_src_host,
         NULL, NULL);
    view(m, &t->g[QC_EDGE_A2A], QC_EDGE_A2A, T * A, T * A, T * A, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_T2M], QC_EDGE_T2M, T * A, K * A, A, K, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_PL2M], QC_EDGE_PL2M, P, K * A, A, K, NULL, NULL, t->pl2m_query,
         t->pl2m_query_host);
    view(m, &t->g[QC_EDGE_A2M], QC_EDGE_A2M, A, K * A, A, K, NULL, NULL, t->pl2m_query,
         t->pl2m_query_host);
    view(m, &t->g[QC_EDGE_M2M], QC_EDGE_M2M, K * A, K * A, K * A, 1, NULL, NULL, NULL, NULL);
    return QC_OK;
}

/* The batch as op arguments (tape.dbatch): the host batch on CPU; on a device backend the
 * caller's device copy, or copies of the batch's two blocks made here and rebased. */
enum qc_status qcnet_tape_batch(struct qc_qcnet *m, const struct qc_batch *batch,
                                const struct qc_qcnet_ctx *ctx)
{
    struct qcnet_tape *t = &m->tape;
    t->batch = batch;
    if (!qc_exec_is_device(m->ex) || m->dry) { /* dry: the trainer's staged copy, not ours */
        t->dbatch = batch;
        return QC_OK;
    }
    if (ctx && ctx->batch_dev) {
        const struct qc_batch *d = ctx->batch_dev;
        if (d->num_agents != batch->num_agents || d->num_polygons != batch->num_polygons ||
            d->num_points != batch->num_points || d->has_graph != batch->has_graph)
            return qc_errorf(QC_ERR_INVALID,
                             "model forward: ctx.batch_dev is not a copy of the batch (%lld "
                             "agents, %lld polygons vs %lld, %lld)",
                             (long long)d->num_agents, (long long)d->num_polygons,
                             (long long)batch->num_agents, (long long)batch->num_polygons);
        t->dbatch = d;
        return QC_OK;
    }
    void *nodes = NULL, *graph = NULL;
    if (batch->node_mem)
        QC_TRY(qcnet_upload(m, batch->node_mem, batch->node_bytes, "batch/nodes", &nodes));
    t->dbatch_node = nodes;
    if (batch->graph_mem)
        QC_TRY(qcnet_upload(m, batch->graph_mem, batch->graph_bytes, "batch/graph", &graph));
    t->dbatch_graph = graph;
    qc_batch_rebase(batch, nodes, graph, &t->dbatch_view);
    t->dbatch = &t->dbatch_view;
    return QC_OK;
}
