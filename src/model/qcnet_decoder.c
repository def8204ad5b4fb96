/*
 * qcnet_decoder.c — QCNet's decoder (QCNET.md §5.4), forward and backward.
 *
 * Queries: m0 = mode_emb tiled over the agents, agent-major (row a·K + k), for every agent.
 * Proposal: R recurrent steps reuse the same layers (their source/edge contexts are computed
 * once, §8.8); per layer t2m (agent-major queries) → transpose to mode-major → pl2m → a2m →
 * back to agent-major; then the shared m2m_propose layer and the two heads. The R head outputs
 * are concatenated, loc_propose = cumsum, scale_propose = cumsum(ELU + 1) + 0.1.
 * Refinement: y = FE(2)(loc_propose.detach()), time-major GRU from traj_emb_h0, the refine
 * layers and m2m_refine, then loc_refine = head + loc_propose.detach(),
 * scale_refine = (ELU(head) + 1) + 0.1 and pi.
 * Sources: x_t = the agent encoder output (50A rows, agent-major), X_pl = the map encoder
 * output (P rows: the Python's K-fold repeat is the graph's base-edge sharing), X_a = x_a[:,49]
 * (A rows).
 * Backend (qc_qcnet_create_on): every op and every move of rows between tensors runs on m->ex;
 * the decoder reads nothing of the batch and never dereferences a tensor on the host.
 */
#include <stdio.h>

#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qc_qcnet.h"
#include "qcnet_internal.h"

/* One (t2m, pl2m, a2m) layer group on agent-major queries q (KA,D), on the KV entries kv[0..2]
 * of the three layers; *out agent-major. */
static enum qc_status group_forward(struct qc_qcnet *m, const struct qcnet_layer *t2m,
                                    const struct qcnet_layer *pl2m, const struct qcnet_layer *a2m,
                                    const int kv[3], const float *q, float **out)
{
    struct qcnet_tape *t = &m->tape;
    const int64_t A = t->A, K = t->K, D = m->D;
    float *x, *xm, *xa;
    char tag[QC_QCNET_KEY_MAX + 32];
    QC_TRY(qcnet_attn_apply(m, t2m, kv[0], q, &x));
    snprintf(tag, sizeof tag, "%s/mode_major", t2m->prefix);
    QC_TRY(qcnet_falloc(m, K * A * D, tag, &xm));
    qc_op_transpose01_forward(m->ex, xm, x, A, K, D); /* [A,K,D] → [K,A,D] */
    qcnet_free(m, x);                                 /* the t2m output: no backward reads it */
    QC_TRY(qcnet_attn_apply(m, pl2m, kv[1], xm, &x));
    QC_TRY(qcnet_attn_apply(m, a2m, kv[2], x, &x));
    snprintf(tag, sizeof tag, "%s/agent_major", a2m->prefix);
    QC_TRY(qcnet_falloc(m, K * A * D, tag, &xa));
    qc_op_transpose01_forward(m->ex, xa, x, K, A, D); /* [K,A,D] → [A,K,D] */
    qcnet_free(m, x);                                 /* the a2m output: no backward reads it */
    *out = xa;
    return QC_OK;
}

/* Backward of the occ-th application of a group: din (KA,D) OVERWRITE (agent-major) from dout
 * (agent-major; din may be dout). w1, w2: (KA,D) scratch. */
static enum qc_status group_backward(struct qc_qcnet *m, const struct qcnet_layer *t2m,
                                     const struct qcnet_layer *pl2m, const struct qcnet_layer *a2m,
                                     int occ, float *din, const float *dout, float *w1, float *w2)
{
    const int64_t A = m->tape.A, K = m->tape.K, D = m->D;
    qc_op_transpose01_backward(m->ex, w1, dout, K, A, D);
    QC_TRY(qcnet_attn_backward(m, a2m, occ, w2, w1));
    QC_TRY(qcnet_attn_backward(m, pl2m, occ, w1, w2));
    qc_op_transpose01_backward(m->ex, w2, w1, A, K, D);
    return qcnet_attn_backward(m, t2m, occ, din, w2);
}

/* The KV entries of decoder layer i of the proposal or refinement stage: t2m, pl2m, a2m. */
static enum qc_status stage_kv(struct qc_qcnet *m, int i, bool refine, int kv[3])
{
    struct qcnet_tape *t = &m->tape;
    QC_TRY(qcnet_kv_setup(m, refine ? &m->t2m_r[i] : &m->t2m_p[i], QC_EDGE_T2M, t->x_a, &kv[0]));
    QC_TRY(
        qcnet_kv_setup(m, refine ? &m->pl2m_r[i] : &m->pl2m_p[i], QC_EDGE_PL2M, t->x_pl, &kv[1]));
    QC_TRY(qcnet_kv_setup(m, refine ? &m->a2m_r[i] : &m->a2m_p[i], QC_EDGE_A2M, t->xa49, &kv[2]));
    return QC_OK;
}

/* kv backward of the three KV entries of decoder layer i (sources' gradients ACCUM). */
static enum qc_status stage_kv_backward(struct qc_qcnet *m, int i, bool refine, float *dx_a,
                                        float *dx_pl, float *dxa49)
{
    QC_TRY(qcnet_kv_backward(m, refine ? &m->t2m_r[i] : &m->t2m_p[i], dx_a));
    QC_TRY(qcnet_kv_backward(m, refine ? &m->pl2m_r[i] : &m->pl2m_p[i], dx_pl));
    return qcnet_kv_backward(m, refine ? &m->a2m_r[i] : &m->a2m_p[i], dxa49);
}

enum qc_status qcnet_decoder_forward(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    const int64_t A = t->A, K = t->K, D = m->D, T = QCNET_T, S = QCNET_S, R = m->R;
    const int64_t KA = K * A, O = m->head_out, S2 = S * 2;
    t->R = R;
    /* X_a = x_a[:, 49] */
    QC_TRY(qcnet_falloc(m, A * D, "decoder/x_a_last", &t->xa49));
    qc_op_copy2d(m->ex, t->xa49, D, t->x_a + (T - 1) * D, T * D, A, D, false);
    /* m0[a·K + k] = mode_emb[k] */
    QC_TRY(qcnet_falloc(m, KA * D, "decoder/m0", &t->m0));
    qc_op_tile_forward(m->ex, t->m0, m->params + m->o_mode_emb, K, A, D);

    QC_TRY(qcnet_edges_setup(m, QC_EDGE_T2M, &m->r_t2m_emb, NULL, NULL, 0, NULL));
    QC_TRY(qcnet_edges_setup(m, QC_EDGE_PL2M, &m->r_pl2m_emb, NULL, NULL, 0, NULL));
    QC_TRY(qcnet_edges_setup(m, QC_EDGE_A2M, &m->r_a2m_emb, NULL, NULL, 0, NULL));
    QC_TRY(qcnet_edges_setup(m, QC_EDGE_M2M, NULL, NULL, NULL, 0, NULL));

    // ---- proposal
    int kv_p[QCNET_MAX_LAYERS][3], kv_r[QCNET_MAX_LAYERS][3];
    for (int64_t i = 0; i < m->NL_dec; i++)
        QC_TRY(stage_kv(m, (int)i, false, kv_p[i]));
    float *sp_cat;
    QC_TRY(qcnet_falloc(m, KA * S2, "decoder/loc_propose_increments", &t->lp_cat));
    QC_TRY(qcnet_falloc(m, KA * S2, "decoder/scale_propose_elu", &sp_cat));
    t->sp_elu = sp_cat;
    const float *q = t->m0;
    char tag[QC_QCNET_KEY_MAX + 32];
    for (int64_t r = 0; r < R; r++) {
        for (int64_t i = 0; i < m->NL_dec; i++) {
            float *x;
            QC_TRY(group_forward(m, &m->t2m_p[i], &m->pl2m_p[i], &m->a2m_p[i], kv_p[i], q, &x));
            q = x;
        }
        float *x;
        QC_TRY(qcnet_attn_self(m, &m->m2m_p, QC_EDGE_M2M, q, &x));
        q = x;
        float *h;
        snprintf(tag, sizeof tag, "decoder.to_loc_propose_pos/step%lld", (long long)r);
        QC_TRY(qcnet_mlp_forward(m, &m->to_loc_p, tag, q, KA, &h));
        qc_op_copy2d(m->ex, t->lp_cat + r * O, S2, h, O, KA, O, false);
        qcnet_free(m, h);
        snprintf(tag, sizeof tag, "decoder.to_scale_propose_pos/step%lld", (long long)r);
        QC_TRY(qcnet_mlp_forward(m, &m->to_scale_p, tag, q, KA, &h));
        qc_op_copy2d(m->ex, sp_cat + r * O, S2, h, O, KA, O, false);
        qcnet_free(m, h);
    }
    QC_TRY(qcnet_falloc(m, KA * S2, "decoder/loc_propose_pos", &t->loc_propose));
    qc_op_cumsum_forward(m->ex, t->loc_propose, t->lp_cat, KA, S, 2);
    qc_op_elu_forward(m->ex, t->sp_elu, sp_cat, KA * S2);
    QC_TRY(qcnet_falloc(m, KA * S2, "decoder/scale_propose_pos", &t->scale_propose));
    qc_op_add_scalar_forward(m->ex, t->scale_propose, t->sp_elu, 1.0f, KA * S2);
    qc_op_cumsum_forward(m->ex, t->scale_propose, t->scale_propose, KA, S, 2);
    qc_op_add_scalar_forward(m->ex, t->scale_propose, t->scale_propose, 0.1f, KA * S2);

    // ---- refinement: GRU over the embedded (detached) proposal, in chunks of (agent, mode)
    // sequences (qcnet_refine_rows): y_emb and the GRU are row-wise, so each chunk is a y_emb
    // and a GRU application of its own, with its own stash and policy, and the step's peak
    // holds one chunk's working set instead of all of them
    const int64_t CR = qcnet_refine_rows(KA);
    QC_TRY(qcnet_falloc(m, KA * D, "decoder/traj_emb.last", &t->m_ref_in));
    for (int64_t r0 = 0, c = 0; r0 < KA; r0 += CR, c++) {
        const int64_t n = KA - r0 < CR ? KA - r0 : CR;
        float *y, *y_tm;
        snprintf(tag, sizeof tag, "decoder.y_emb/c%lld", (long long)c);
        QC_TRY(qcnet_fe_forward(m, &m->y_emb, tag, t->loc_propose + r0 * S2, NULL, n * S, &y));
        snprintf(tag, sizeof tag, "decoder/traj_emb.input/c%lld", (long long)c);
        QC_TRY(qcnet_falloc(m, S * n * D, tag, &y_tm));
        qc_op_transpose01_forward(m->ex, y_tm, y, n, S, D); /* [n,S,D] → [S,n,D] */
        qcnet_free(m, y); /* no backward reads the y_emb output itself */
        /* the refine queries: the GRU's final state; its input is freed by its backward */
        snprintf(tag, sizeof tag, "decoder.traj_emb/c%lld", (long long)c);
        QC_TRY(qcnet_gru_forward(m, y_tm, S, n, tag, t->m_ref_in + r0 * D));
    }
    for (int64_t i = 0; i < m->NL_dec; i++)
        QC_TRY(stage_kv(m, (int)i, true, kv_r[i]));
    q = t->m_ref_in;
    for (int64_t i = 0; i < m->NL_dec; i++) {
        float *x;
        QC_TRY(group_forward(m, &m->t2m_r[i], &m->pl2m_r[i], &m->a2m_r[i], kv_r[i], q, &x));
        q = x;
    }
    QC_TRY(qcnet_attn_self(m, &m->m2m_r, QC_EDGE_M2M, q, &t->m_ref));

    // ---- refinement heads
    QC_TRY(qcnet_mlp_forward(m, &m->to_loc_r, "decoder.to_loc_refine_pos", t->m_ref, KA,
                             &t->loc_refine));
    qc_op_add_forward(m->ex, t->loc_refine, t->loc_refine, t->loc_propose, KA * S2);
    QC_TRY(qcnet_mlp_forward(m, &m->to_scale_r, "decoder.to_scale_refine_pos", t->m_ref, KA,
                             &t->sr_elu));
    qc_op_elu_forward(m->ex, t->sr_elu, t->sr_elu, KA * S2);
    QC_TRY(qcnet_falloc(m, KA * S2, "decoder/scale_refine_pos", &t->scale_refine));
    qc_op_add_scalar_forward(m->ex, t->scale_refine, t->sr_elu, 1.0f, KA * S2);
    qc_op_add_scalar_forward(m->ex, t->scale_refine, t->scale_refine, 0.1f, KA * S2);
    QC_TRY(qcnet_mlp_forward(m, &m->to_pi, "decoder.to_pi", t->m_ref, KA, &t->pi));
    return QC_OK;
}

/* dq += the input gradient of the occ-th application of head mlp (dout (N,O)); tmp (N,D)
 * scratch. */
static enum qc_status head_backward(struct qc_qcnet *m, const struct qc_mlp *mlp, int occ,
                                    const float *dout, float *dq, float *tmp, int64_t N)
{
    QC_TRY(qcnet_mlp_backward(m, mlp, occ, tmp, dout));
    qc_op_add_forward(m->ex, dq, dq, tmp, N * m->D);
    return QC_OK;
}

enum qc_status qcnet_decoder_backward(struct qc_qcnet *m, const float *dloc_p,
                                      const float *dscale_p, const float *dloc_r,
                                      const float *dscale_r, const float *dpi, float *dx_pl,
                                      float *dx_a)
{
    struct qcnet_tape *t = &m->tape;
    const int64_t A = t->A, K = t->K, D = m->D, T = QCNET_T, S = QCNET_S, R = t->R;
    const int64_t KA = K * A, O = m->head_out, S2 = S * 2;
    float *dq, *w1, *w2, *tmp, *dh, *dxa49;
    QC_TRY(qcnet_falloc(m, KA * D, "grad/decoder.q", &dq));
    QC_TRY(qcnet_falloc(m, KA * D, "grad/decoder.w1", &w1));
    QC_TRY(qcnet_falloc(m, KA * D, "grad/decoder.w2", &w2));
    QC_TRY(qcnet_falloc(m, KA * D, "grad/decoder.tmp", &tmp));
    QC_TRY(qcnet_falloc(m, KA * S2, "grad/decoder.head", &dh));
    QC_TRY(qcnet_zalloc(m, A * D, "grad/decoder.x_a_last", &dxa49));

    // ---- refinement heads → d m_ref
    QC_TRY(qcnet_mlp_backward(m, &m->to_pi, 0, dq, dpi));
    QC_TRY(head_backward(m, &m->to_loc_r, 0, dloc_r, dq, tmp, KA));
    qc_op_elu_backward(m->ex, dh, dscale_r, t->sr_elu, KA * S2); /* +1 and +0.1 pass through */
    QC_TRY(head_backward(m, &m->to_scale_r, 0, dh, dq, tmp, KA));

    // ---- refine layers
    QC_TRY(qcnet_attn_backward(m, &m->m2m_r, 0, tmp, dq));
    for (int64_t i = m->NL_dec - 1; i >= 0; i--)
        QC_TRY(group_backward(m, &m->t2m_r[i], &m->pl2m_r[i], &m->a2m_r[i], 0, tmp, tmp, w1, w2));
    for (int64_t i = 0; i < m->NL_dec; i++)
        QC_TRY(stage_kv_backward(m, (int)i, true, dx_a, dx_pl, dxa49));

    // ---- GRU and y_emb by chunk, last first (the proposal input is detached: no gradient to
    // loc_propose)
    const int64_t CR = qcnet_refine_rows(KA);
    for (int64_t c = (KA + CR - 1) / CR - 1; c >= 0; c--) {
        const int64_t r0 = c * CR;
        const int64_t n = KA - r0 < CR ? KA - r0 : CR;
        float *dy_tm, *dh0;
        QC_TRY(qcnet_falloc(m, S * n * D, "grad/decoder.traj_emb.input", &dy_tm));
        QC_TRY(qcnet_falloc(m, n * D, "grad/decoder.traj_emb.h0", &dh0));
        QC_TRY(qcnet_gru_backward(m, (int)c, S, dy_tm, dh0, tmp + r0 * D));
        qc_op_tile_backward(m->ex, m->grads + m->o_h0, dh0, 1, n, D, true);
        qcnet_free(m, dh0);
        float *dy;
        QC_TRY(qcnet_falloc(m, n * S * D, "grad/decoder.y_emb", &dy));
        qc_op_transpose01_backward(m->ex, dy, dy_tm, n, S, D);
        qcnet_free(m, dy_tm);
        QC_TRY(qcnet_fe_backward(m, &m->y_emb, (int)c, NULL, NULL, dy));
        qcnet_free(m, dy);
    }

    // ---- proposal: cumsum / ELU backward, then the recurrent steps in reverse
    float *dlp, *dsp;
    QC_TRY(qcnet_falloc(m, KA * S2, "grad/decoder.loc_propose_increments", &dlp));
    QC_TRY(qcnet_falloc(m, KA * S2, "grad/decoder.scale_propose", &dsp));
    qc_op_cumsum_backward(m->ex, dlp, dloc_p, KA, S, 2);
    qc_op_cumsum_backward(m->ex, dsp, dscale_p, KA, S, 2);
    qc_op_elu_backward(m->ex, dsp, dsp, t->sp_elu, KA * S2);
    float *dho;
    QC_TRY(qcnet_falloc(m, KA * O, "grad/decoder.propose_head", &dho));
    qc_op_zero(m->ex, dq, (size_t)(KA * D) * sizeof *dq); /* the last proposal state: heads only */
    for (int64_t r = R - 1; r >= 0; r--) {
        qc_op_copy2d(m->ex, dho, O, dlp + r * O, S2, KA, O, false);
        QC_TRY(head_backward(m, &m->to_loc_p, (int)r, dho, dq, tmp, KA));
        qc_op_copy2d(m->ex, dho, O, dsp + r * O, S2, KA, O, false);
        QC_TRY(head_backward(m, &m->to_scale_p, (int)r, dho, dq, tmp, KA));
        QC_TRY(qcnet_attn_backward(m, &m->m2m_p, (int)r, tmp, dq));
        for (int64_t i = m->NL_dec - 1; i >= 0; i--)
            QC_TRY(group_backward(m, &m->t2m_p[i], &m->pl2m_p[i], &m->a2m_p[i], (int)r, tmp, tmp,
                                  w1, w2));
        qc_op_copy(m->ex, dq, tmp, (size_t)(KA * D) * sizeof *dq);
    }
    qcnet_free(m, dho);
    qcnet_free(m, dlp);
    qcnet_free(m, dsp);
    qc_op_tile_backward(m->ex, m->grads + m->o_mode_emb, dq, K, A, D, true);
    for (int64_t i = 0; i < m->NL_dec; i++)
        QC_TRY(stage_kv_backward(m, (int)i, false, dx_a, dx_pl, dxa49));
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_T2M));
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_PL2M));
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_A2M));
    QC_TRY(qcnet_edges_backward(m, QC_EDGE_M2M));
    /* X_a = x_a[:, 49]: dx_a[a, 49] += dxa49[a] */
    qc_op_copy2d(m->ex, dx_a + (T - 1) * D, T * D, dxa49, D, A, D, true);
    qcnet_free(m, dq);
    qcnet_free(m, w1);
    qcnet_free(m, w2);
    qcnet_free(m, tmp);
    qcnet_free(m, dh);
    qcnet_free(m, dxa49);
    return QC_OK;
}
