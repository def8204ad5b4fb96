/*
 * qcnet_inputs.c — what a forward derives from its batch before the first block runs: the batch
 * as op arguments (tape.dbatch: the host batch on the CPU, a device view on device backends,
 * copied in here unless the caller passed ctx.batch_dev) and the attention graph of every edge
 * set (tape.g), with the index arrays the model computes on the host (pl2a source polygons,
 * mode-major query rows, int64 pl2pl types, and in training with dropout the dropout keys of
 * every set's edges and x_dst rows) uploaded into context memory.
 */
#include <stdio.h>
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

/* n int64 the host computes for the ops (qcnet_input_begin: *host NULL on the dry backend); on a
 * device backend the host buffer stays as the index array's host mirror (freed by release), on
 * CPU the context memory is its own mirror. */
static enum qc_status index_host(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **host)
{
    void *h = NULL;
    QC_TRY(qcnet_input_begin(m, (size_t)(n > 0 ? n : 0) * sizeof(int64_t), tag, &h));
    *host = h;
    return QC_OK;
}

static enum qc_status index_commit(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **dev,
                                   int64_t *host)
{
    void *p = NULL;
    QC_TRY(qcnet_input_end(m, host, (size_t)(n > 0 ? n : 0) * sizeof(int64_t), tag, true, &p));
    *dev = p;
    return QC_OK;
}

// ---- dropout keys ---------------------------------------------------------------------------

/* A row space: rows whose node (agent or polygon) is (r / inner) mod n, a node of scene
 * batch[node] (its position in the batch). Rows of one scene keep their relative order in every
 * batch that holds it (scenes' nodes are contiguous and every layout is t·A + a, a·T + t, k·A + a
 * or a·K + k), and so do a set's edges of one scene in CSR order (by destination, then source). */
struct drop_space {
    int64_t rows, inner, n;
    const int64_t *batch;
};

/* key[r] (edge_ptr NULL), else key[e] of the edges [edge_ptr[r], edge_ptr[r+1]) of each row r:
 * sk[s] + the element's rank among the rows (edges) of its scene s. count: B scratch. */
static void drop_keys_fill(int64_t *key, const struct drop_space *sp, const int64_t *edge_ptr,
                           const int64_t *sk, int64_t *count, int64_t B)
{
    memset(count, 0, (size_t)B * sizeof *count);
    for (int64_t r = 0; r < sp->rows; r++) {
        const int64_t s = sp->batch[(r / sp->inner) % sp->n];
        if (!edge_ptr) {
            key[r] = sk[s] + count[s]++;
            continue;
        }
        for (int64_t e = edge_ptr[r]; e < edge_ptr[r + 1]; e++)
            key[e] = sk[s] + count[s]++;
    }
}

/* One key array of n entries (rows of sp, or the edges of edge_ptr over sp) in context memory. */
static enum qc_status drop_keys(struct qc_qcnet *m, int64_t n, const struct drop_space *sp,
                                const int64_t *edge_ptr, const int64_t *sk, int64_t *count,
                                const char *tag, int64_t **out)
{
    const size_t bytes = (size_t)(n > 0 ? n : 0) * sizeof(int64_t);
    void *host = NULL, *p = NULL;
    QC_TRY(qcnet_input_begin(m, bytes, tag, &host));
    if (host)
        drop_keys_fill(host, sp, edge_ptr, sk, count, m->tape.batch->num_scenes);
    QC_TRY(qcnet_input_end(m, host, bytes, tag, false, &p));
    *out = p;
    return QC_OK;
}

/* The dropout keys of every edge set (qc_qcnet.h "Dropout"): scene s of the batch is keyed by
 * its dataset index (scene_index, or s where that is -1). sk and count: B scratch. */
static enum qc_status drop_keys_all(struct qc_qcnet *m, int64_t *sk, int64_t *count)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_batch *b = t->batch;
    const int64_t A = t->A, P = t->P, K = t->K, T = QCNET_T;
    for (int64_t s = 0; s < b->num_scenes; s++) {
        const int64_t idx = b->scene_index ? b->scene_index[s] : -1;
        const int64_t v = idx >= 0 ? idx : s;
        if (v >= QC_DROPOUT_SCENE_MAX)
            return qc_errorf(QC_ERR_INVALID,
                             "model forward: scene %lld of the batch has dataset index %lld; "
                             "dropout keys take indices below %lld",
                             (long long)s, (long long)v, (long long)QC_DROPOUT_SCENE_MAX);
        sk[s] = v << QC_DROPOUT_SCENE_SHIFT;
    }
    /* the x_dst rows of each set's applications, and each set's base destinations */
    const struct drop_space pl = {P, 1, P, b->pl_batch};
    const struct drop_space agent_major = {T * A, T, A, b->agent_batch}; /* a·T + t */
    const struct drop_space time_major = {T * A, 1, A, b->agent_batch};  /* t·A + a */
    const struct drop_space modes_agent = {K * A, K, A, b->agent_batch}; /* a·K + k */
    const struct drop_space modes_mode = {K * A, 1, A, b->agent_batch};  /* k·A + a */
    const struct drop_space agents = {A, 1, A, b->agent_batch};
    static const char *const row_tag[5] = {"graph/polygon.drop_key", "graph/agent_step.drop_key",
                                           "graph/step_agent.drop_key", "graph/agent_mode.drop_key",
                                           "graph/mode_agent.drop_key"};
    const struct drop_space *row_space[5] = {&pl, &agent_major, &time_major, &modes_agent,
                                             &modes_mode};
    int64_t *rows[5];
    for (int i = 0; i < 5; i++)
        QC_TRY(
            drop_keys(m, row_space[i]->rows, row_space[i], NULL, sk, count, row_tag[i], &rows[i]));
    static const int set_rows[NSET] = {[QC_EDGE_PT2PL] = 0, [QC_EDGE_PL2PL] = 0, [QC_EDGE_T] = 1,
                                       [QC_EDGE_PL2A] = 2,  [QC_EDGE_A2A] = 2,   [QC_EDGE_T2M] = 3,
                                       [QC_EDGE_PL2M] = 4,  [QC_EDGE_A2M] = 4,   [QC_EDGE_M2M] = 3};
    const struct drop_space *set_dst[NSET] = {
        [QC_EDGE_PT2PL] = &pl,        [QC_EDGE_PL2PL] = &pl,       [QC_EDGE_T] = &agent_major,
        [QC_EDGE_PL2A] = &time_major, [QC_EDGE_A2A] = &time_major, [QC_EDGE_T2M] = &agents,
        [QC_EDGE_PL2M] = &agents,     [QC_EDGE_A2M] = &agents,     [QC_EDGE_M2M] = &modes_agent};
    for (int set = 0; set < NSET; set++) {
        const struct qc_edges *e = &b->graph.e[set];
        char tag[48];
        snprintf(tag, sizeof tag, "graph/%s.drop_key", qc_edge_set_name((enum qc_edge_set)set));
        QC_ASSERT(row_space[set_rows[set]]->rows == t->g[set].n_dst &&
                      set_dst[set]->rows == t->g[set].n_bdst,
                  "model: dropout keys of %s: %lld rows / %lld destinations, the graph has %lld / "
                  "%lld",
                  tag, (long long)row_space[set_rows[set]]->rows, (long long)set_dst[set]->rows,
                  (long long)t->g[set].n_dst, (long long)t->g[set].n_bdst);
        t->drop_row_key[set] = rows[set_rows[set]];
        QC_TRY(drop_keys(m, e->num_edges, set_dst[set], e->dst_ptr, sk, count, tag,
                         &t->drop_edge_key[set]));
    }
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
    QC_TRY(index_host(m, pl2a->num_edges, tag, &t->pl2a_src_host));
    for (int64_t e = 0; e < pl2a->num_edges && t->pl2a_src_host; e++)
        t->pl2a_src_host[e] = pl2a->src[e] % P;
    QC_TRY(index_commit(m, pl2a->num_edges, tag, &t->pl2a_src, t->pl2a_src_host));
    /* pl2m and a2m queries are mode-major rows k·A + a */
    tag = "graph/mode_major_query";
    QC_TRY(index_host(m, A * K, tag, &t->pl2m_query_host));
    for (int64_t a = 0; a < A && t->pl2m_query_host; a++)
        for (int64_t k = 0; k < K; k++)
            t->pl2m_query_host[a * K + k] = k * A + a;
    QC_TRY(index_commit(m, A * K, tag, &t->pl2m_query, t->pl2m_query_host));
    const struct qc_edges *pl2pl = &g->e[QC_EDGE_PL2PL];
    tag = "graph/pl2pl.type";
    QC_TRY(index_host(m, pl2pl->num_edges, tag, &t->pl2pl_type_host));
    for (int64_t e = 0; e < pl2pl->num_edges && t->pl2pl_type_host; e++) {
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
    if (!t->training || !(m->cfg.dropout > 0.0))
        return QC_OK;
    /* dropout keys: two B-entry host scratch arrays */
    const int64_t B = t->batch->num_scenes;
    int64_t *sk = qcnet_host_tmp((size_t)(2 * B) * sizeof *sk, "the dropout keys' scene table");
    if (!sk)
        return QC_ERR_NOMEM;
    const enum qc_status st = drop_keys_all(m, sk, sk + B);
    free(sk);
    return st;
}

// ---- the batch as op arguments --------------------------------------------------------------

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

const struct qc_batch *qcnet_op_batch(const struct qc_qcnet *m)
{
    const struct qcnet_tape *t = &m->tape;
    QC_ASSERT(t->dbatch || !qc_exec_is_device(m->ex), "model: no device view of the batch");
    return t->dbatch ? t->dbatch : t->batch;
}
