/*
 * qcnet_encoder.c — QCNet's map encoder (QCNET.md §5.2) and agent encoder (§5.3), forward and
 * backward, on the tape of qcnet_model.c.
 *
 * Map encoder: x_pt = FE(1)(|v|, type + side), x_pl = FE(0)(type + intersection); per layer
 * x_pl ← pt2pl((x_pt, x_pl)), x_pl ← pl2pl(x_pl). The output x_pl [P,D] stands for the
 * Python's [P,50,D] repeat: the pl2a layers read polygon p for every polygon-step t·P + p.
 * Agent encoder: x_a = FE(4)(agent-step features, type) over all 50A agent-steps
 * (agent-major); per layer t (self, agent-major) → time-major → pl2a (bipartite) → a2a (self)
 * → agent-major. Invalid steps are computed like valid ones (§9.2).
 *
 * Backend (qc_qcnet_create_on): every op runs on m->ex. What the encoders derive from the batch
 * (embedding indices from the uint8 fields, the agent-step features) is computed on the host
 * from the HOST batch (tape.batch) into a temporary and uploaded into hook memory; op arguments
 * taken from the batch itself come from its device view (tape.dbatch).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qc_qcnet.h"
#include "qcnet_internal.h"

/* Categorical values v (n, host) as int64 embedding indices, checked against the vocabulary,
 * in hook memory. */
static enum qc_status to_index(struct qc_qcnet *m, const uint8_t *v, int64_t n, int64_t vocab,
                               const char *field, int64_t **out)
{
    char tag[96];
    snprintf(tag, sizeof tag, "input/%s", field);
    const size_t bytes = (size_t)n * sizeof(int64_t);
    void *host = NULL, *p = NULL;
    QC_TRY(qcnet_input_begin(m, bytes, tag, &host));
    int64_t *h = host;
    for (int64_t i = 0; h && i < n; i++) {
        if (v[i] >= vocab) {
            qcnet_input_drop(m, host);
            return qc_errorf(QC_ERR_INVALID, "model forward: %s[%lld] = %u, not in [0, %lld)",
                             field, (long long)i, (unsigned)v[i], (long long)vocab);
        }
        h[i] = v[i];
    }
    QC_TRY(qcnet_input_end(m, host, bytes, tag, false, &p));
    *out = p;
    return QC_OK;
}

// ---- map encoder ----------------------------------------------------------------------------

enum qc_status qcnet_map_forward(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_batch *b = t->batch, *db = qcnet_op_batch(m);
    const int64_t Pt = t->Pt, P = t->P;
    QC_TRY(to_index(m, b->pt_type, Pt, 17, "map_point.type", &t->idx_pt_type));
    QC_TRY(to_index(m, b->pt_side, Pt, 3, "map_point.side", &t->idx_pt_side));
    QC_TRY(to_index(m, b->pl_type, P, 4, "map_polygon.type", &t->idx_pl_type));
    QC_TRY(to_index(m, b->pl_is_intersection, P, 3, "map_polygon.is_intersection", &t->idx_pl_int));
    /* the pl2pl edge types are checked where the tape's copy is made (qcnet_model.c) */

    /* node embeddings: FE(1)(|v|, type + side), FE(0)(type + intersection) */
    const struct qcnet_cat cat_pt = {2,
                                     {m->o_type_pt, m->o_side_pt},
                                     {17, 3},
                                     {t->idx_pt_type, t->idx_pt_side},
                                     "map/x_pt_emb.cat"};
    QC_TRY(qcnet_fe_forward(m, &m->x_pt_emb, "encoder.map_encoder.x_pt_emb", db->pt_magnitude,
                            &cat_pt, Pt, &t->x_pt));
    const struct qcnet_cat cat_pl = {2,
                                     {m->o_type_pl, m->o_int_pl},
                                     {4, 3},
                                     {t->idx_pl_type, t->idx_pl_int},
                                     "map/x_pl_emb.cat"};
    QC_TRY(qcnet_fe_forward(m, &m->x_pl_emb, "encoder.map_encoder.x_pl_emb", NULL, &cat_pl, P,
                            &t->x_pl0));

    /* edge embeddings, shared by every layer on the set */
    QC_TRY(qcnet_edges_setup(m, QC_EDGE_PT2PL, &m->r_pt2pl_emb, NULL, NULL, 0, NULL));
    QC_TRY(qcnet_edges_setup(m, QC_EDGE_PL2PL, &m->r_pl2pl_emb, m->params + m->o_type_pl2pl,
                             t->pl2pl_type, 5, m->grads + m->o_type_pl2pl));

    float *x = t->x_pl0;
    for (int64_t i = 0; i < m->NL_map; i++) {
        const struct qcnet_layer *L = &m->pt2pl[i];
        int kv;
        QC_TRY(qcnet_kv_setup(m, L, QC_EDGE_PT2PL, t->x_pt, &kv));
        QC_TRY(qcnet_attn_apply(m, L, kv, x, &x));
        QC_TRY(qcnet_attn_self(m, &m->pl2pl[i], QC_EDGE_PL2PL, x, &x));
    }
    t->x_pl = x;
    return QC_OK;
}

enum qc_status qcnet_map_backward(struct qc_qcnet *m, float *dx_pl)
{
    struct qcnet_tape *t = &m->tape;
    const int64_t Pt = t->Pt, P = t->P, D = m->D;
    float *d1, *dx_pt;
    QC_TRY(qcnet_falloc(m, P * D, "grad/map.x_pl", &d1));
    QC_TRY(qcnet_zalloc(m, Pt * D, "grad/map.x_pt", &dx_pt));
    float *dx = dx_pl; /* gradient of the current layer output (P,D) */
    for (int64_t i = m->NL_map - 1; i >= 0; i--) {
        /* pl2pl (self): d1 = d(input) */
        QC_TRY(qcnet_attn_backward(m, &m->pl2pl[i], 0, d1, dx));
        /* pt2pl (bipartite): dx = d(x_pl input), the sources' gradient into dx_pt */
        QC_TRY(qcnet_attn_backward(m, &m->pt2pl[i], 0, dx, d1));
        QC_TRY(qcnet_kv_backward(m, &m->pt2pl[i], dx_pt));
    }
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_PL2PL));
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_PT2PL));
    /* x_pl0 = FE(0)(type_pl + int_pl): dcat → both tables */
    QC_TRY(qcnet_fe_backward(m, &m->x_pl_emb, 0, NULL, d1, dx));
    qc_op_embedding_backward(m->ex, m->grads + m->o_type_pl, d1, t->idx_pl_type, P, D, 4);
    qc_op_embedding_backward(m->ex, m->grads + m->o_int_pl, d1, t->idx_pl_int, P, D, 3);
    qcnet_free(m, d1);
    /* x_pt = FE(1)(magnitude, type_pt + side_pt) */
    float *dcat;
    QC_TRY(qcnet_falloc(m, Pt * D, "grad/map.x_pt_cat", &dcat));
    QC_TRY(qcnet_fe_backward(m, &m->x_pt_emb, 0, NULL, dcat, dx_pt));
    qc_op_embedding_backward(m->ex, m->grads + m->o_type_pt, dcat, t->idx_pt_type, Pt, D, 17);
    qc_op_embedding_backward(m->ex, m->grads + m->o_side_pt, dcat, t->idx_pt_side, Pt, D, 3);
    qcnet_free(m, dcat);
    qcnet_free(m, dx_pt);
    return QC_OK;
}

// ---- agent encoder --------------------------------------------------------------------------

/* ‖v‖ as torch.norm over a 2-vector: sqrt(v0² + v1²). */
static float norm2f(float v0, float v1)
{
    float a = v0 * v0;
    float b = v1 * v1;
    return sqrtf(a + b);
}

/* c_a[(a·T + t)·4 + ·] = [‖d‖, ∠(h, d), ‖v‖, ∠(h, v)], d the motion vector (0 at t = 0).
 * Host code: b is the host batch, c a host buffer. */
static void agent_features(const struct qc_batch *b, float *c, int64_t A)
{
    const int64_t T = QCNET_T, ST = QCNET_STEPS;
    for (int64_t a = 0; a < A; a++) {
        for (int64_t t = 0; t < T; t++) {
            const float *p = b->position + (a * ST + t) * 3;
            const float *v = b->velocity + (a * ST + t) * 3;
            float d0 = 0.0f, d1 = 0.0f;
            if (t > 0) {
                d0 = p[0] - p[-3];
                d1 = p[1] - p[-2];
            }
            const float th = b->heading[a * ST + t];
            const float h0 = cosf(th), h1 = sinf(th);
            float *o = c + (a * T + t) * 4;
            o[0] = norm2f(d0, d1);
            o[1] = qc_angle_between_2df(h0, h1, d0, d1);
            o[2] = norm2f(v[0], v[1]);
            o[3] = qc_angle_between_2df(h0, h1, v[0], v[1]);
        }
    }
}

enum qc_status qcnet_agent_forward(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_batch *b = t->batch;
    const int64_t A = t->A, T = QCNET_T, D = m->D, N = T * A;
    void *host = NULL, *p = NULL;
    const size_t c_bytes = (size_t)(N * 4) * sizeof(float);
    QC_TRY(qcnet_input_begin(m, c_bytes, "agent/x_a_emb.c", &host));
    if (host)
        agent_features(b, host, A);
    QC_TRY(qcnet_input_end(m, host, c_bytes, "agent/x_a_emb.c", false, &p));
    t->c_a = p;
    const size_t i_bytes = (size_t)N * sizeof(int64_t);
    QC_TRY(qcnet_input_begin(m, i_bytes, "agent/type_index", &host));
    int64_t *h = host;
    for (int64_t a = 0; h && a < A; a++) {
        if (b->agent_type[a] >= 10) {
            qcnet_input_drop(m, host);
            return qc_errorf(QC_ERR_INVALID,
                             "model forward: agent.type[%lld] = %u, not in "
                             "[0, 10)",
                             (long long)a, (unsigned)b->agent_type[a]);
        }
        for (int64_t s = 0; s < T; s++)
            h[a * T + s] = b->agent_type[a]; /* repeat_interleave over the steps */
    }
    QC_TRY(qcnet_input_end(m, host, i_bytes, "agent/type_index", false, &p));
    t->idx_a_type = p;
    const struct qcnet_cat cat_a = {
        1, {m->o_type_a, 0}, {10, 0}, {t->idx_a_type, NULL}, "agent/x_a_emb.cat"};
    QC_TRY(qcnet_fe_forward(m, &m->x_a_emb, "encoder.agent_encoder.x_a_emb", t->c_a, &cat_a, N,
                            &t->x_a0));

    QC_TRY(qcnet_edges_setup(m, QC_EDGE_T, &m->r_t_emb, NULL, NULL, 0, NULL));
    QC_TRY(qcnet_edges_setup(m, QC_EDGE_PL2A, &m->r_pl2a_emb, NULL, NULL, 0, NULL));
    QC_TRY(qcnet_edges_setup(m, QC_EDGE_A2A, &m->r_a2a_emb, NULL, NULL, 0, NULL));

    float *x = t->x_a0; /* agent-major */
    char tag[QC_QCNET_KEY_MAX + 32];
    for (int64_t i = 0; i < m->NL_agent; i++) {
        QC_TRY(qcnet_attn_self(m, &m->t_attn[i], QC_EDGE_T, x, &x));
        float *xt;
        snprintf(tag, sizeof tag, "%s/time_major", m->t_attn[i].prefix);
        QC_TRY(qcnet_falloc(m, N * D, tag, &xt));
        qc_op_transpose01_forward(m->ex, xt, x, A, T, D);
        qcnet_free(m, x); /* the t output: no backward reads it */
        const struct qcnet_layer *L = &m->pl2a_attn[i];
        int kv;
        QC_TRY(qcnet_kv_setup(m, L, QC_EDGE_PL2A, t->x_pl, &kv));
        QC_TRY(qcnet_attn_apply(m, L, kv, xt, &x));
        if (!t->need_backward)
            qcnet_kv_drop(m, L);
        QC_TRY(qcnet_attn_self(m, &m->a2a_attn[i], QC_EDGE_A2A, x, &x));
        float *xa;
        snprintf(tag, sizeof tag, "%s/agent_major", m->a2a_attn[i].prefix);
        QC_TRY(qcnet_falloc(m, N * D, tag, &xa));
        qc_op_transpose01_forward(m->ex, xa, x, T, A, D);
        qcnet_free(m, x); /* the a2a output: no backward reads it */
        x = xa;
    }
    t->x_a = x;
    return QC_OK;
}

enum qc_status qcnet_agent_backward(struct qc_qcnet *m, float *dx_a, float *dx_pl)
{
    struct qcnet_tape *t = &m->tape;
    const int64_t A = t->A, T = QCNET_T, D = m->D, N = T * A;
    float *d1, *d2;
    QC_TRY(qcnet_falloc(m, N * D, "grad/agent.1", &d1));
    QC_TRY(qcnet_falloc(m, N * D, "grad/agent.2", &d2));
    float *dx = dx_a; /* gradient of the current layer output, agent-major */
    for (int64_t i = m->NL_agent - 1; i >= 0; i--) {
        qc_op_transpose01_backward(m->ex, d1, dx, T, A, D); /* → time-major */
        QC_TRY(qcnet_attn_backward(m, &m->a2a_attn[i], 0, d2, d1));
        QC_TRY(qcnet_attn_backward(m, &m->pl2a_attn[i], 0, d1, d2));
        QC_TRY(qcnet_kv_backward(m, &m->pl2a_attn[i], dx_pl));
        qc_op_transpose01_backward(m->ex, d2, d1, A, T, D); /* → agent-major */
        QC_TRY(qcnet_attn_backward(m, &m->t_attn[i], 0, dx, d2));
    }
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_A2A));
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_PL2A));
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_T));
    QC_TRY(qcnet_fe_backward(m, &m->x_a_emb, 0, NULL, d1, dx));
    qc_op_embedding_backward(m->ex, m->grads + m->o_type_a, d1, t->idx_a_type, N, D, 10);
    qcnet_free(m, d1);
    qcnet_free(m, d2);
    return QC_OK;
}
