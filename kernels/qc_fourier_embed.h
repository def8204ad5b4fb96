/*
 * qc_fourier_embed.h — the FourierEmbedding FE(d) of QCNET.md §3.1 as one composite op on any
 * backend (qc_exec.h): the op sequence that both the model's block (src/model/fourier.c, with
 * its stash table) and the fused attention's CPU tiles (kernels/cpu/attn_fused.c, per tile)
 * run, so the two give the same bits by construction.
 *
 *   θ[n,i,f] = ((c[n,i]·W_f[i,f])·2)·π_f ;  φ[n,i] = [cos θ, sin θ, c[n,i]]   (P = 2F+1)
 *   z_i = φ_i·W1_iᵀ + b1_i ;  a_i = ReLU(LN_i(z_i)) ;  h_i = a_i·W2_iᵀ + b2_i
 *   s   = h_0 + h_1 + … (ascending i) + cat ;  o = ReLU(LN_o(s)) ;  out = o·W_oᵀ + b_o
 *
 * d = 0 is allowed: then s = cat and only the output part runs. Every op runs on `ex` (NULL =
 * CPU, inline on the calling thread); every tensor is memory of that backend.
 */
#ifndef QC_KERNELS_QC_FOURIER_EMBED_H
#define QC_KERNELS_QC_FOURIER_EMBED_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct qc_exec;

#define QC_FE_MAX_D 8 /* continuous inputs (QCNet uses at most 4) */

/* The parameter layout: element offsets of each tensor in the flat buffers w and dw (QCNet
 * state_dict order, as the model's struct qc_fourier builds them). Linear weights are (out,in). */
struct qc_fe {
    int64_t D, F, d;                                /* hidden width, bands, inputs 0..8 */
    int64_t o_freqs;                                /* (d,F) */
    int64_t o_w1[QC_FE_MAX_D], o_b1[QC_FE_MAX_D];   /* (D,P), (D) */
    int64_t o_lnw[QC_FE_MAX_D], o_lnb[QC_FE_MAX_D]; /* (D), (D) */
    int64_t o_w2[QC_FE_MAX_D], o_b2[QC_FE_MAX_D];   /* (D,D), (D) */
    int64_t o_out_lnw, o_out_lnb, o_out_w, o_out_b; /* (D), (D), (D,D), (D) */
    const float *w;                                 /* parameters */
    float *dw; /* gradients, same layout, ACCUM (backward only) */
};

/* What forward keeps for backward, N rows each (the model's FE stash entries, one to one). */
struct qc_fe_saved {
    float *phi;                                   /* (N,d,P), d > 0 */
    float *z[QC_FE_MAX_D], *mean[QC_FE_MAX_D];    /* (N,D), (N) */
    float *rstd[QC_FE_MAX_D], *relu[QC_FE_MAX_D]; /* (N), (N,D) */
    float *s, *s_mean, *s_rstd, *o;               /* (N,D), (N), (N), (N,D) */
};

/* Floats of the parameter (and gradient) buffer of this layout. */
int64_t qc_fe_params_numel(const struct qc_fe *fe);
/* Floats of the saved tensors over N rows, packed (qc_fe_saved_pack). */
int64_t qc_fe_saved_numel(const struct qc_fe *fe, int64_t N);
/* Points sv into mem (qc_fe_saved_numel floats), tensors one after the other. */
void qc_fe_saved_pack(const struct qc_fe *fe, int64_t N, float *mem, struct qc_fe_saved *sv);
/* Floats of scratch forward (backward = false) or backward needs over N rows. */
int64_t qc_fe_scratch_numel(const struct qc_fe *fe, int64_t N, bool backward);

/* out (N,D) OVERWRITE, or NULL to skip the output Linear (a recompute for the backward, which
 * reads sv alone); sv filled. c (N,d) (NULL when d = 0); cat (N,D) the summed categorical
 * embeddings or NULL (required when d = 0). ws: qc_fe_scratch_numel(fe, N, false) floats.
 * Re-running with the same inputs reproduces out and sv bit for bit. */
void qc_op_fe_forward(const struct qc_exec *ex, const struct qc_fe *fe, float *out,
                      const struct qc_fe_saved *sv, const float *c, const float *cat, int64_t N,
                      float *ws);
/* dc (N,d) OVERWRITE, may be NULL; dcat (N,D) OVERWRITE, may be NULL; fe->dw ACCUM.
 * dout (N,D); sv as filled by forward; c as given to it. ws: qc_fe_scratch_numel(fe, N, true). */
void qc_op_fe_backward(const struct qc_exec *ex, const struct qc_fe *fe, float *dc, float *dcat,
                       const float *dout, const struct qc_fe_saved *sv, const float *c, int64_t N,
                       float *ws);

// ---- over row tiles, keeping nothing (the fused attention's edge embeddings) ----------------

/* The rows of a tiled FE: continuous inputs and the categorical embedding added to each row
 * (cat_table[cat_idx[n]], or none). */
struct qc_fe_rows {
    int64_t N;              /* rows */
    int64_t tile;           /* rows per tile (>= 1) */
    const float *c;         /* (N,d) continuous inputs; NULL when d = 0 */
    const float *cat_table; /* (ncat,D) or NULL */
    const int64_t *cat_idx; /* (N) categories in [0,ncat) */
    int64_t ncat;
    float *dcat_table; /* (ncat,D) ACCUM (backward), may be NULL */
};

/* Floats of scratch a tiled forward or backward on ex needs. */
int64_t qc_fe_tiled_scratch_numel(const struct qc_exec *ex, const struct qc_fe *fe,
                                  const struct qc_fe_rows *rows, bool backward);
/* out (N,D) OVERWRITE = FE(c [+ cat]) tile by tile; no FE tensor outlives its tile. The same
 * bits as one qc_op_fe_forward per tile of rows. */
void qc_op_fe_forward_tiled(const struct qc_exec *ex, const struct qc_fe *fe, float *out,
                            const struct qc_fe_rows *rows, float *scratch);
/* fe->dw and rows->dcat_table ACCUM from dout (N,D): each tile's forward is recomputed (same
 * bits as the forward), then its backward runs. CPU (and EMU): tiles over OpenMP threads, the
 * gradients in per-thread lanes summed in lane order (deterministic for a thread count). CUDA:
 * the tiles one after another on the stream. */
void qc_op_fe_backward_tiled(const struct qc_exec *ex, const struct qc_fe *fe, const float *dout,
                             const struct qc_fe_rows *rows, float *scratch);

/* The CPU backend of the two (kernels/cpu/fe_tiled.c). */
int64_t qc_fe_tiled_scratch_numel_cpu(const struct qc_fe *fe, const struct qc_fe_rows *rows,
                                      bool backward);
void qc_fe_forward_tiled_cpu(const struct qc_fe *fe, float *out, const struct qc_fe_rows *rows,
                             float *scratch);
void qc_fe_backward_tiled_cpu(const struct qc_fe *fe, const float *dout,
                              const struct qc_fe_rows *rows, float *scratch);

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_FOURIER_EMBED_H */
