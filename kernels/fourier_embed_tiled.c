/*
 * fourier_embed_tiled.c — the FourierEmbedding over row tiles, keeping nothing (qc_fourier_embed.h:
 * qc_op_fe_forward_tiled / _backward_tiled, the fused attention's edge embeddings): the
 * backend dispatch. CPU and EMU run the parallel tile loop of cpu/fe_tiled.c; CUDA runs the
 * tiles one after another on the stream with the composite op of fourier_embed.c (the
 * sequential loop below is valid on any backend: one tile's buffers, the gradients accumulated
 * tile by tile). Both callees sit below this file: neither calls back into it.
 */
#include "qc_fourier_embed.h"

#include "exec_internal.h"
#include "qc_exec.h"
#include "qc_prof.h"
#include "qc_status.h"

/* Sequential layout: the FE tensors of one tile, its scratch, its categorical rows and the
 * categorical gradient rows. */
struct fet_seq {
    int64_t cap, saved_n, ws_n, total;
};

static struct fet_seq fet_seq_make(const struct qc_fe *fe, const struct qc_fe_rows *rows,
                                   bool backward)
{
    struct fet_seq q;
    const int64_t tile = rows->tile > 0 ? rows->tile : 1;
    q.cap = rows->N < tile ? rows->N : tile;
    q.saved_n = qc_fe_saved_numel(fe, q.cap);
    const int64_t nf = qc_fe_scratch_numel(fe, q.cap, false);
    const int64_t nb = backward ? qc_fe_scratch_numel(fe, q.cap, true) : 0;
    q.ws_n = nf > nb ? nf : nb;
    q.total = q.saved_n + q.ws_n + (backward ? 2 : 1) * q.cap * fe->D;
    return q;
}

int64_t qc_fe_tiled_scratch_numel(const struct qc_exec *ex, const struct qc_fe *fe,
                                  const struct qc_fe_rows *rows, bool backward)
{
    if (qc_exec_target_of(ex) != QC_EXEC_CUDA)
        return qc_fe_tiled_scratch_numel_cpu(fe, rows, backward);
    return fet_seq_make(fe, rows, backward).total;
}

/* Rows [r0, r0+n) forward on ex into out, the tile's tensors in sv. */
static void fet_seq_tile(const struct qc_exec *ex, const struct qc_fe *fe, float *out,
                         const struct qc_fe_rows *rows, const struct fet_seq *q, float *scratch,
                         int64_t r0, int64_t n, struct qc_fe_saved *sv)
{
    float *ws = scratch + q->saved_n, *cat = ws + q->ws_n;
    if (rows->cat_table)
        qc_op_embedding_forward(ex, cat, rows->cat_idx + r0, rows->cat_table, n, fe->D, rows->ncat);
    qc_fe_saved_pack(fe, n, scratch, sv);
    qc_op_fe_forward(ex, fe, out, sv, fe->d > 0 ? rows->c + r0 * fe->d : NULL,
                     rows->cat_table ? cat : NULL, n, ws);
}

static void fet_forward(const struct qc_exec *ex, const struct qc_fe *fe, float *out,
                        const struct qc_fe_rows *rows, float *scratch)
{
    if (qc_exec_backend_of(ex) != QC_EXEC_CUDA) {
        kernels_exec_enter(ex);
        qc_fe_forward_tiled_cpu(fe, out, rows, scratch);
        kernels_exec_leave(ex);
        return;
    }
    const struct fet_seq q = fet_seq_make(fe, rows, false);
    for (int64_t r0 = 0; r0 < rows->N; r0 += q.cap) {
        const int64_t n = rows->N - r0 < q.cap ? rows->N - r0 : q.cap;
        struct qc_fe_saved sv;
        fet_seq_tile(ex, fe, out + r0 * fe->D, rows, &q, scratch, r0, n, &sv);
    }
}

static void fet_backward(const struct qc_exec *ex, const struct qc_fe *fe, const float *dout,
                         const struct qc_fe_rows *rows, float *scratch)
{
    if (qc_exec_backend_of(ex) != QC_EXEC_CUDA) {
        kernels_exec_enter(ex);
        qc_fe_backward_tiled_cpu(fe, dout, rows, scratch);
        kernels_exec_leave(ex);
        return;
    }
    const struct fet_seq q = fet_seq_make(fe, rows, true);
    const int64_t D = fe->D;
    float *dcat = scratch + q.saved_n + q.ws_n + q.cap * D;
    const bool want_dcat = rows->cat_table && rows->dcat_table;
    for (int64_t r0 = 0; r0 < rows->N; r0 += q.cap) {
        const int64_t n = rows->N - r0 < q.cap ? rows->N - r0 : q.cap;
        struct qc_fe_saved sv;
        fet_seq_tile(ex, fe, NULL, rows, &q, scratch, r0, n, &sv);
        qc_op_fe_backward(ex, fe, NULL, want_dcat ? dcat : NULL, dout + r0 * D, &sv,
                          fe->d > 0 ? rows->c + r0 * fe->d : NULL, n, scratch + q.saved_n);
        if (want_dcat)
            qc_op_embedding_backward(ex, rows->dcat_table, dcat, rows->cat_idx + r0, n, D,
                                     rows->ncat);
    }
}

/* The profiler's description: rows, tile, width. */
static struct qc_prof_op fet_prof(const char *name, const struct qc_fe *fe,
                                  const struct qc_fe_rows *rows)
{
    return (struct qc_prof_op){name, "N,tile,D", {rows->N, rows->tile, fe->D, 0}, 0, 0};
}

void qc_op_fe_forward_tiled(const struct qc_exec *ex, const struct qc_fe *fe, float *out,
                            const struct qc_fe_rows *rows, float *scratch)
{
    if (!qc_prof_on()) {
        fet_forward(ex, fe, out, rows, scratch);
        return;
    }
    struct qc_prof_mark m;
    kernels_prof_begin(&m, ex);
    fet_forward(ex, fe, out, rows, scratch);
    const struct qc_prof_op po = fet_prof("fe_forward_tiled", fe, rows);
    kernels_prof_end(&m, ex, &po);
}

void qc_op_fe_backward_tiled(const struct qc_exec *ex, const struct qc_fe *fe, const float *dout,
                             const struct qc_fe_rows *rows, float *scratch)
{
    if (!qc_prof_on()) {
        fet_backward(ex, fe, dout, rows, scratch);
        return;
    }
    struct qc_prof_mark m;
    kernels_prof_begin(&m, ex);
    fet_backward(ex, fe, dout, rows, scratch);
    const struct qc_prof_op po = fet_prof("fe_backward_tiled", fe, rows);
    kernels_prof_end(&m, ex, &po);
}
