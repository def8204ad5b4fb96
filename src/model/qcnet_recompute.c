/*
 * qcnet_recompute.c — an entry's forward run again (the recompute stash policy, qcnet_policy.c):
 * its stash tables are bound to fresh memory, not counted in bytes_stash, and its block runs
 * from its inputs, which must be resident, into a temporary output. Dropout masks are redrawn
 * from the same keys and a 16-bit stash is rounded as the first forward's was (stash_pack,
 * qcnet_tape.c), so every byte comes back the same.
 *
 * Also the FE entries' categorical sum (qcnet_cat_sum), which the tape's FE forward runs too.
 * Below qcnet_policy.c and qcnet_tape.c: it calls neither.
 */
#include <stdio.h>

#include "qc_exec.h"
#include "qc_kernels.h"
#include "qcnet_internal.h"

enum qc_status qcnet_cat_sum(struct qc_qcnet *m, float *out, const struct qcnet_cat *cat, int64_t N)
{
    const int64_t D = m->D;
    qc_op_embedding_forward(m->ex, out, cat->idx[0], m->params + cat->off[0], N, D, cat->vocab[0]);
    if (cat->n == 1)
        return QC_OK;
    float *tmp;
    QC_TRY(qcnet_falloc(m, N * D, "scratch/embedding", &tmp));
    for (int j = 1; j < cat->n; j++) {
        qc_op_embedding_forward(m->ex, tmp, cat->idx[j], m->params + cat->off[j], N, D,
                                cat->vocab[j]);
        qc_op_add_forward(m->ex, out, out, tmp, N * D);
    }
    qcnet_free(m, tmp);
    return QC_OK;
}

/* The FE of entry e over its rows into out, with its categorical embeddings summed into a
 * temporary first. */
static enum qc_status fe_run(struct qc_qcnet *m, struct qcnet_entry *e, float *out)
{
    const struct qc_fourier *fe = e->block;
    float *cat = NULL;
    if (e->cat.n > 0) {
        QC_TRY(qcnet_falloc(m, e->rows * fe->D, e->cat.tag, &cat));
        QC_TRY(qcnet_cat_sum(m, cat, &e->cat, e->rows));
    }
    const enum qc_status s = qc_fourier_forward(fe, out, &e->st, e->x, cat, e->rows);
    qcnet_free(m, cat);
    return s;
}

/* Rebinds st to fresh memory (tag); the recompute's, so not counted in bytes_stash. */
static enum qc_status rebind(struct qc_qcnet *m, struct qc_stash *st, const char *tag)
{
    void *p = NULL;
    qc_stash_unpacked_reset(st); /* a recompute rebuilds the fp32 layout (rounded below) */
    QC_TRY(qcnet_balloc(m, qc_stash_arena_bytes(st), tag, &p));
    qc_stash_bind(st, p);
    return QC_OK;
}

enum qc_status qcnet_entry_redo(struct qc_qcnet *m, int n)
{
    struct qcnet_tape *t = &m->tape;
    struct qcnet_entry *e = &t->e[n];
    struct qc_stash *st[3];
    char tag[3][160];
    const int ns = qcnet_entry_stashes(m, n, st, tag);
    for (int i = 0; i < ns; i++)
        QC_TRY(rebind(m, st[i], tag[i]));
    float *out = NULL;
    enum qc_status s = QC_OK;
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/recompute.out", e->name);
    switch (e->kind) {
    case QCNET_FE: {
        const struct qc_fourier *fe = e->block;
        QC_TRY(qcnet_falloc(m, e->rows * fe->D, name, &out));
        s = fe_run(m, e, out);
        break;
    }
    case QCNET_MLP: {
        const struct qc_mlp *mlp = e->block;
        QC_TRY(qcnet_falloc(m, e->rows * mlp->O, name, &out));
        s = qc_mlp_forward(mlp, out, &e->st, e->x, e->rows);
        break;
    }
    case QCNET_GRU: {
        const int64_t D = m->D, N = e->rows, L = e->steps;
        float *h0, *scratch;
        QC_TRY(qcnet_falloc(m, N * D, name, &h0));
        s = qcnet_falloc(m, qc_gru_forward_scratch_numel(L, N, D), "scratch/gru", &scratch);
        if (s != QC_OK) {
            qcnet_free(m, h0);
            return s;
        }
        qc_op_tile_forward(m->ex, h0, m->params + m->o_h0, 1, N, D);
        const float *w = qcnet_params_compute(m);
        qc_op_gru_forward(m->ex, qc_stash_f32(&e->st, 0), qc_stash_f32(&e->st, 1), e->x, h0,
                          w + m->o_gru_wih, w + m->o_gru_bih, w + m->o_gru_whh, w + m->o_gru_bhh, L,
                          N, D, D, scratch);
        qcnet_free(m, scratch);
        qcnet_free(m, h0);
        break;
    }
    case QCNET_KV:
        s = qc_attn_kv_forward(&e->kvc, e->x_src);
        break;
    case QCNET_ATTN: {
        const struct qc_attn_kv *kv = e->kv >= 0 ? &t->e[e->kv].kvc : &e->kvc;
        if (e->kv < 0)
            QC_TRY(qc_attn_kv_forward(&e->kvc, e->x_src));
        QC_TRY(qcnet_falloc(m, kv->ed->g->n_dst * m->D, name, &out));
        s = qc_attn_forward(kv, out, &e->st, e->x, &e->ctx);
        break;
    }
    case QCNET_EDGES:
        s = qc_attn_edges_forward(&t->ed[e->set]);
        break;
    }
    qcnet_free(m, out);
    if (s == QC_OK && e->st.precision && e->st.arena)
        qc_stash_round(&e->st, m->ex); /* as stash_pack rounds the first forward's */
    if (s == QC_OK) {
        for (int i = 0; i < ns; i++)
            m->recompute_bytes += qc_stash_bytes(st[i]);
        m->recomputes++;
    }
    return s;
}
