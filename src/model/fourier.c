/*
 * fourier.c — FourierEmbedding FE(d): forward, backward, stash plan (qc_fourier.h), and the
 * scratch helpers shared by the block files (blocks_internal.h).
 */
#include "qc_fourier.h"

#include <stdio.h>
#include <string.h>

#include "blocks_internal.h"
#include "qc_exec.h" /* every op and memory move on the block's backend (fe->mem.ex) */
#include "qc_kernels.h"
#include "qc_oom.h"

// ---- scratch helpers (blocks_internal.h) ---------------------------------------------------

static size_t blk_bytes(int64_t n)
{
    return (size_t)(n > 0 ? n : 0) * sizeof(float);
}

float *blk_falloc(const struct qc_block_mem *bm, int64_t n, const char *tensor)
{
    return qc_block_alloc(bm, blk_bytes(n), tensor);
}

float *blk_fcalloc(const struct qc_block_mem *bm, int64_t n, const char *tensor)
{
    float *p = blk_falloc(bm, n, tensor);
    if (p)
        qc_op_zero(qc_block_exec(bm), p, blk_bytes(n)); /* hook memory: the block's backend */
    return p;
}

void blk_ffree(const struct qc_block_mem *bm, float *p, int64_t n)
{
    qc_block_free(bm, p, blk_bytes(n));
}

enum qc_status blk_nomem(const struct qc_block_mem *bm, const char *what, int64_t n)
{
    return qc_oom_errorf(QC_OOM_ATTENTION_UNKNOWN, "%s/%s: allocation of %lld floats failed",
                         bm && bm->name[0] ? bm->name : "block", what, (long long)n);
}

// ---- parameters -------------------------------------------------------------------------

void qc_fourier_init(struct qc_fourier *fe, int64_t d, int64_t F, int64_t D)
{
    QC_ASSERT(d >= 0 && d <= QC_FOURIER_MAX_D, "FE(d): d = %lld", (long long)d);
    QC_ASSERT(F > 0 && D > 0, "FE: F %lld, D %lld", (long long)F, (long long)D);
    memset(fe, 0, sizeof *fe);
    fe->D = D;
    fe->F = F;
    fe->d = d;
    struct qc_param_table *t = &fe->params;
    qc_param_table_init(t);
    char name[QC_PARAM_NAME_MAX];
    fe->o_freqs = d > 0 ? qc_param_table_add(t, "freqs.weight", 2, d, F, QC_INIT_EMBEDDING) : -1;
    for (int64_t i = 0; i < d; i++) {
        snprintf(name, sizeof name, "mlps.%lld.0.weight", (long long)i);
        fe->o_w1[i] = qc_param_table_add(t, name, 2, D, 2 * F + 1, QC_INIT_LINEAR_W);
        snprintf(name, sizeof name, "mlps.%lld.0.bias", (long long)i);
        fe->o_b1[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ZERO);
        snprintf(name, sizeof name, "mlps.%lld.1.weight", (long long)i);
        fe->o_lnw[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ONE);
        snprintf(name, sizeof name, "mlps.%lld.1.bias", (long long)i);
        fe->o_lnb[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ZERO);
        snprintf(name, sizeof name, "mlps.%lld.3.weight", (long long)i);
        fe->o_w2[i] = qc_param_table_add(t, name, 2, D, D, QC_INIT_LINEAR_W);
        snprintf(name, sizeof name, "mlps.%lld.3.bias", (long long)i);
        fe->o_b2[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ZERO);
    }
    fe->o_out_lnw = qc_param_table_add(t, "to_out.0.weight", 1, D, 0, QC_INIT_ONE);
    fe->o_out_lnb = qc_param_table_add(t, "to_out.0.bias", 1, D, 0, QC_INIT_ZERO);
    fe->o_out_w = qc_param_table_add(t, "to_out.2.weight", 2, D, D, QC_INIT_LINEAR_W);
    fe->o_out_b = qc_param_table_add(t, "to_out.2.bias", 1, D, 0, QC_INIT_ZERO);
}

void qc_fourier_bind(struct qc_fourier *fe, const float *w, float *dw)
{
    fe->w = w;
    fe->dw = dw;
}

// ---- stash ------------------------------------------------------------------------------

/* Entry order (indices are positional): [phi], per dim i: z, mean, rstd, relu; then s, mean,
 * rstd, relu of the output part. */
struct fe_idx {
    int phi;
    int z[QC_FOURIER_MAX_D], mean[QC_FOURIER_MAX_D], rstd[QC_FOURIER_MAX_D], relu[QC_FOURIER_MAX_D];
    int s, s_mean, s_rstd, o;
};

static struct fe_idx fe_index(const struct qc_fourier *fe)
{
    struct fe_idx ix;
    int n = 0;
    ix.phi = fe->d > 0 ? n++ : -1;
    for (int64_t i = 0; i < fe->d; i++) {
        ix.z[i] = n++;
        ix.mean[i] = n++;
        ix.rstd[i] = n++;
        ix.relu[i] = n++;
    }
    ix.s = n++;
    ix.s_mean = n++;
    ix.s_rstd = n++;
    ix.o = n++;
    return ix;
}

void qc_fourier_stash_plan(const struct qc_fourier *fe, int64_t N, struct qc_stash *st)
{
    QC_ASSERT(st->n == 0, "FE stash plan into a non-empty table %s", st->block);
    char name[QC_STASH_NAME_MAX];
    if (fe->d > 0)
        qc_stash_add(st, "phi", QC_STASH_F32, 3, N, fe->d, 2 * fe->F + 1, 1);
    for (int64_t i = 0; i < fe->d; i++) {
        snprintf(name, sizeof name, "mlps.%lld.ln_in", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 2, N, fe->D, 1, 1);
        snprintf(name, sizeof name, "mlps.%lld.ln_mean", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 1, N, 1, 1, 1);
        snprintf(name, sizeof name, "mlps.%lld.ln_rstd", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 1, N, 1, 1, 1);
        snprintf(name, sizeof name, "mlps.%lld.relu", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 2, N, fe->D, 1, 1);
    }
    qc_stash_add(st, "to_out.ln_in", QC_STASH_F32, 2, N, fe->D, 1, 1);
    qc_stash_add(st, "to_out.ln_mean", QC_STASH_F32, 1, N, 1, 1, 1);
    qc_stash_add(st, "to_out.ln_rstd", QC_STASH_F32, 1, N, 1, 1, 1);
    qc_stash_add(st, "to_out.relu", QC_STASH_F32, 2, N, fe->D, 1, 1);
}

// ---- forward / backward -------------------------------------------------------------------

int64_t fourier_scratch_floats(const struct qc_fourier *fe, int64_t N, bool backward)
{
    if (backward)
        return 3 * N * fe->D + N * fe->d * (2 * fe->F + 1);
    return fe->d > 1 ? N * fe->D : 0;
}

enum qc_status qc_fourier_forward(const struct qc_fourier *fe, float *out, struct qc_stash *st,
                                  const float *c, const float *cat, int64_t N)
{
    const int64_t n = N > 0 ? fourier_scratch_floats(fe, N, false) : 0;
    float *ws = NULL;
    if (n > 0 && !(ws = blk_falloc(&fe->mem, n, "fe_forward.h")))
        return blk_nomem(&fe->mem, "fe_forward.h", n);
    enum qc_status s = fourier_forward_ws(fe, out, st, c, cat, N, ws);
    blk_ffree(&fe->mem, ws, n);
    return s;
}

enum qc_status fourier_forward_ws(const struct qc_fourier *fe, float *out, struct qc_stash *st,
                                  const float *c, const float *cat, int64_t N, float *ws)
{
    const int64_t D = fe->D, F = fe->F, d = fe->d, P = 2 * fe->F + 1;
    const float *w = fe->w;
    const struct qc_exec *ex = qc_block_exec(&fe->mem);
    QC_ASSERT(w, "FE: parameters not bound");
    QC_ASSERT(d > 0 || cat, "FE(0) needs categorical embeddings");
    struct fe_idx ix = fe_index(fe);
    QC_ASSERT(st->n == ix.o + 1 && st->e[ix.o].ne[0] == N, "FE: stash %s not planned for %lld rows",
              st->block, (long long)N);
    if (N == 0)
        return QC_OK;
    float *s = qc_stash_f32(st, ix.s);
    float *h = d > 1 ? ws : NULL; /* (N,D) h_i for i >= 1 */
    if (d > 0) {
        float *phi = qc_stash_f32(st, ix.phi);
        qc_op_fourier_features_forward(ex, phi, c, w + fe->o_freqs, N, d, F);
        for (int64_t i = 0; i < d; i++) {
            float *z = qc_stash_f32(st, ix.z[i]);
            float *a = qc_stash_f32(st, ix.relu[i]);
            qc_op_linear_forward(ex, z, phi + i * P, d * P, w + fe->o_w1[i], w + fe->o_b1[i], N, P,
                                 D, false);
            qc_op_layernorm_forward(ex, a, qc_stash_f32(st, ix.mean[i]),
                                    qc_stash_f32(st, ix.rstd[i]), z, w + fe->o_lnw[i],
                                    w + fe->o_lnb[i], N, D);
            qc_op_relu_forward(ex, a, a, N * D);
            /* s = h_0 + h_1 + … in ascending i (PyTorch: stack + sum over dim 0) */
            if (i == 0) {
                qc_op_linear_forward(ex, s, a, D, w + fe->o_w2[i], w + fe->o_b2[i], N, D, D, false);
            } else {
                qc_op_linear_forward(ex, h, a, D, w + fe->o_w2[i], w + fe->o_b2[i], N, D, D, false);
                qc_op_add_forward(ex, s, s, h, N * D);
            }
        }
        if (cat)
            qc_op_add_forward(ex, s, s, cat, N * D);
    } else {
        qc_op_copy(ex, s, cat, (size_t)(N * D) * sizeof *s);
    }
    float *o = qc_stash_f32(st, ix.o);
    qc_op_layernorm_forward(ex, o, qc_stash_f32(st, ix.s_mean), qc_stash_f32(st, ix.s_rstd), s,
                            w + fe->o_out_lnw, w + fe->o_out_lnb, N, D);
    qc_op_relu_forward(ex, o, o, N * D);
    qc_op_linear_forward(ex, out, o, D, w + fe->o_out_w, w + fe->o_out_b, N, D, D, false);
    return QC_OK;
}

enum qc_status qc_fourier_backward(const struct qc_fourier *fe, float *dc, float *dcat,
                                   const float *dout, const struct qc_stash *st, const float *c,
                                   int64_t N)
{
    const int64_t n = N > 0 ? fourier_scratch_floats(fe, N, true) : 0;
    float *ws = NULL;
    if (n > 0 && !(ws = blk_falloc(&fe->mem, n, "fe_backward.scratch")))
        return blk_nomem(&fe->mem, "fe_backward.scratch", n);
    enum qc_status s = fourier_backward_ws(fe, dc, dcat, dout, st, c, N, ws);
    blk_ffree(&fe->mem, ws, n);
    return s;
}

enum qc_status fourier_backward_ws(const struct qc_fourier *fe, float *dc, float *dcat,
                                   const float *dout, const struct qc_stash *st, const float *c,
                                   int64_t N, float *ws)
{
    const int64_t D = fe->D, F = fe->F, d = fe->d, P = 2 * fe->F + 1;
    const float *w = fe->w;
    float *dw = fe->dw;
    const struct qc_exec *ex = qc_block_exec(&fe->mem);
    QC_ASSERT(w && dw, "FE: parameters or gradients not bound");
    struct fe_idx ix = fe_index(fe);
    QC_ASSERT(st->n == ix.o + 1 && st->e[ix.o].ne[0] == N, "FE: stash %s not planned for %lld rows",
              st->block, (long long)N);
    if (N == 0)
        return QC_OK;
    float *t = ws; /* fourier_scratch_floats(fe, N, true) */
    float *dho = t, *ds = t + N * D, *da = t + 2 * N * D, *dphi = t + 3 * N * D;

    /* out = o·W_oᵀ + b_o, o = ReLU(LN_o(s)) */
    const float *o = qc_stash_f32(st, ix.o);
    qc_op_linear_backward(ex, dho, D, dw + fe->o_out_w, dw + fe->o_out_b, dout, o, D,
                          w + fe->o_out_w, N, D, D, false);
    qc_op_relu_backward(ex, dho, dho, o, N * D);
    qc_op_layernorm_backward(ex, ds, dw + fe->o_out_lnw, dw + fe->o_out_lnb, dho,
                             qc_stash_f32(st, ix.s), qc_stash_f32(st, ix.s_mean),
                             qc_stash_f32(st, ix.s_rstd), w + fe->o_out_lnw, N, D, false);
    if (dcat)
        qc_op_copy(ex, dcat, ds, (size_t)(N * D) * sizeof *ds);

    if (d > 0) {
        const float *phi = qc_stash_f32(st, ix.phi);
        for (int64_t i = 0; i < d; i++) {
            const float *a = qc_stash_f32(st, ix.relu[i]);
            /* h_i = a·W2ᵀ + b2 receives ds; a = ReLU(LN_i(z)) */
            qc_op_linear_backward(ex, da, D, dw + fe->o_w2[i], dw + fe->o_b2[i], ds, a, D,
                                  w + fe->o_w2[i], N, D, D, false);
            qc_op_relu_backward(ex, da, da, a, N * D);
            qc_op_layernorm_backward(ex, dho, dw + fe->o_lnw[i], dw + fe->o_lnb[i], da,
                                     qc_stash_f32(st, ix.z[i]), qc_stash_f32(st, ix.mean[i]),
                                     qc_stash_f32(st, ix.rstd[i]), w + fe->o_lnw[i], N, D, false);
            /* z = φ_i·W1ᵀ + b1 with φ_i a strided view (row stride d·(2F+1)) */
            qc_op_linear_backward(ex, dphi + i * P, d * P, dw + fe->o_w1[i], dw + fe->o_b1[i], dho,
                                  phi + i * P, d * P, w + fe->o_w1[i], N, P, D, false);
        }
        qc_op_fourier_features_backward(ex, dc, dw + fe->o_freqs, dphi, c, w + fe->o_freqs, N, d,
                                        F);
    }
    return QC_OK;
}
