/*
 * fourier_embed.c — the FourierEmbedding composite op (qc_fourier_embed.h): the same op
 * sequence for the model's block and the fused attention's tiles, on the caller's backend, and
 * its layout and size helpers. The tiled FE (fourier_embed_tiled.c, cpu/fe_tiled.c) calls these;
 * nothing here calls the tiled code.
 */
#include "qc_fourier_embed.h"

#include "qc_exec.h"
#include "qc_status.h"

/* end of the tensor at offset o with n floats (absent tensors have o < 0) */
static int64_t fe_end(int64_t acc, int64_t o, int64_t n)
{
    return o >= 0 && o + n > acc ? o + n : acc;
}

int64_t qc_fe_params_numel(const struct qc_fe *fe)
{
    const int64_t D = fe->D, P = 2 * fe->F + 1;
    int64_t n = fe->d > 0 ? fe_end(0, fe->o_freqs, fe->d * fe->F) : 0;
    for (int64_t i = 0; i < fe->d; i++) {
        n = fe_end(n, fe->o_w1[i], D * P);
        n = fe_end(n, fe->o_b1[i], D);
        n = fe_end(n, fe->o_lnw[i], D);
        n = fe_end(n, fe->o_lnb[i], D);
        n = fe_end(n, fe->o_w2[i], D * D);
        n = fe_end(n, fe->o_b2[i], D);
    }
    n = fe_end(n, fe->o_out_lnw, D);
    n = fe_end(n, fe->o_out_lnb, D);
    n = fe_end(n, fe->o_out_w, D * D);
    return fe_end(n, fe->o_out_b, D);
}

int64_t qc_fe_saved_numel(const struct qc_fe *fe, int64_t N)
{
    const int64_t D = fe->D, P = 2 * fe->F + 1;
    return N * (fe->d * P + fe->d * (2 * D + 2) + 2 * D + 2);
}

void qc_fe_saved_pack(const struct qc_fe *fe, int64_t N, float *mem, struct qc_fe_saved *sv)
{
    const int64_t D = fe->D, P = 2 * fe->F + 1;
    float *p = mem;
    *sv = (struct qc_fe_saved){0};
    if (fe->d > 0)
        sv->phi = p, p += N * fe->d * P;
    for (int64_t i = 0; i < fe->d; i++) {
        sv->z[i] = p, p += N * D;
        sv->mean[i] = p, p += N;
        sv->rstd[i] = p, p += N;
        sv->relu[i] = p, p += N * D;
    }
    sv->s = p, p += N * D;
    sv->s_mean = p, p += N;
    sv->s_rstd = p, p += N;
    sv->o = p;
}

int64_t qc_fe_scratch_numel(const struct qc_fe *fe, int64_t N, bool backward)
{
    if (backward)
        return 3 * N * fe->D + N * fe->d * (2 * fe->F + 1);
    return fe->d > 1 ? N * fe->D : 0;
}

void qc_op_fe_forward(const struct qc_exec *ex, const struct qc_fe *fe, float *out,
                      const struct qc_fe_saved *sv, const float *c, const float *cat, int64_t N,
                      float *ws)
{
    const int64_t D = fe->D, F = fe->F, d = fe->d, P = 2 * fe->F + 1;
    const float *w = fe->w;
    QC_ASSERT(w, "FE: parameters not bound");
    QC_ASSERT(d > 0 || cat, "FE(0) needs categorical embeddings");
    if (N == 0)
        return;
    float *s = sv->s;
    float *h = d > 1 ? ws : NULL; /* (N,D) h_i for i >= 1 */
    if (d > 0) {
        qc_op_fourier_features_forward(ex, sv->phi, c, w + fe->o_freqs, N, d, F);
        for (int64_t i = 0; i < d; i++) {
            float *a = sv->relu[i];
            qc_op_linear_forward(ex, sv->z[i], sv->phi + i * P, d * P, w + fe->o_w1[i],
                                 w + fe->o_b1[i], N, P, D, false);
            qc_op_layernorm_forward(ex, a, sv->mean[i], sv->rstd[i], sv->z[i], w + fe->o_lnw[i],
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
    qc_op_layernorm_forward(ex, sv->o, sv->s_mean, sv->s_rstd, s, w + fe->o_out_lnw,
                            w + fe->o_out_lnb, N, D);
    qc_op_relu_forward(ex, sv->o, sv->o, N * D);
    if (out) /* NULL: a recompute for the backward, which reads sv alone */
        qc_op_linear_forward(ex, out, sv->o, D, w + fe->o_out_w, w + fe->o_out_b, N, D, D, false);
}

void qc_op_fe_backward(const struct qc_exec *ex, const struct qc_fe *fe, float *dc, float *dcat,
                       const float *dout, const struct qc_fe_saved *sv, const float *c, int64_t N,
                       float *ws)
{
    const int64_t D = fe->D, F = fe->F, d = fe->d, P = 2 * fe->F + 1;
    const float *w = fe->w;
    float *dw = fe->dw;
    QC_ASSERT(w && dw, "FE: parameters or gradients not bound");
    if (N == 0)
        return;
    float *dho = ws, *ds = ws + N * D, *da = ws + 2 * N * D, *dphi = ws + 3 * N * D;

    /* out = o·W_oᵀ + b_o, o = ReLU(LN_o(s)) */
    qc_op_linear_backward(ex, dho, D, dw + fe->o_out_w, dw + fe->o_out_b, dout, sv->o, D,
                          w + fe->o_out_w, N, D, D, false);
    qc_op_relu_backward(ex, dho, dho, sv->o, N * D);
    qc_op_layernorm_backward(ex, ds, dw + fe->o_out_lnw, dw + fe->o_out_lnb, dho, sv->s, sv->s_mean,
                             sv->s_rstd, w + fe->o_out_lnw, N, D, false);
    if (dcat)
        qc_op_copy(ex, dcat, ds, (size_t)(N * D) * sizeof *ds);
    if (d == 0)
        return;
    for (int64_t i = 0; i < d; i++) {
        const float *a = sv->relu[i];
        /* h_i = a·W2ᵀ + b2 receives ds; a = ReLU(LN_i(z)) */
        qc_op_linear_backward(ex, da, D, dw + fe->o_w2[i], dw + fe->o_b2[i], ds, a, D,
                              w + fe->o_w2[i], N, D, D, false);
        qc_op_relu_backward(ex, da, da, a, N * D);
        qc_op_layernorm_backward(ex, dho, dw + fe->o_lnw[i], dw + fe->o_lnb[i], da, sv->z[i],
                                 sv->mean[i], sv->rstd[i], w + fe->o_lnw[i], N, D, false);
        /* z = φ_i·W1ᵀ + b1 with φ_i a strided view (row stride d·(2F+1)) */
        qc_op_linear_backward(ex, dphi + i * P, d * P, dw + fe->o_w1[i], dw + fe->o_b1[i], dho,
                              sv->phi + i * P, d * P, w + fe->o_w1[i], N, P, D, false);
    }
    /* cos θ, sin θ from the saved φ (CPU: the bits the recompute would give; CUDA recomputes) */
    qc_op_fourier_features_backward_saved(ex, dc, dw + fe->o_freqs, dphi, sv->phi, c,
                                          w + fe->o_freqs, N, d, F);
}
