/*
 * qc_fourier.h — FourierEmbedding FE(d) (QCNET.md §3.1): d continuous inputs per row, each
 * turned into learnable sinusoidal features and its own 2-layer MLP, summed (plus optional
 * categorical embeddings), then LayerNorm, ReLU and an output Linear.
 *
 *   θ[n,i,f] = ((c[n,i]·W_f[i,f])·2)·π_f ;  φ[n,i] = [cos θ, sin θ, c[n,i]]   (2F+1 features)
 *   h_i = W2_i · ReLU(LN_i(W1_i·φ[n,i] + b1_i)) + b2_i
 *   s   = Σ_i h_i (ascending i) + cat            (cat = e_1 + … + e_m, summed by the caller)
 *   out = W_o · ReLU(LN_o(s)) + b_o
 *
 * d = 0 is allowed (x_pl_emb): then s = cat and only the output part runs.
 * Parameters are named by QCNet's state_dict suffixes (freqs.weight, mlps.i.0.weight, …,
 * to_out.2.bias), in state_dict order. The stash keeps φ, every per-dimension LayerNorm input
 * with its statistics and ReLU output, and the same for the output part: F(d) = 1,548·d + 1,032
 * bytes per row at D = 128, F = 64 (PyTorch also keeps θ: 1,808·d + 1,032, QCNET.md §8.3).
 *
 * Backend: every op and memory move runs on fe->mem.ex (qc_exec.h; NULL = CPU), and every
 * tensor the block is given or binds (w, dw, the stash, c, cat, out and their gradients) is
 * memory of that backend; on a device backend the block never dereferences one on the host.
 * Its scratch comes from fe->mem's hook, which must hand out the same backend's memory. The
 * same calls give the same bits on CPU and on the emulated device (same ops, same order).
 */
#ifndef QC_MODEL_QC_FOURIER_H
#define QC_MODEL_QC_FOURIER_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_memspec.h"
#include "qc_stash.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_FOURIER_MAX_D 8 /* continuous inputs; QCNet uses at most 4 */

struct qc_fourier {
    int64_t D; /* hidden width (128) */
    int64_t F; /* frequency bands (64) */
    int64_t d; /* continuous inputs, 0..QC_FOURIER_MAX_D */
    struct qc_param_table params;
    /* element offsets of each tensor in the parameter buffer (-1 when absent) */
    int64_t o_freqs;                                          /* (d,F) */
    int64_t o_w1[QC_FOURIER_MAX_D], o_b1[QC_FOURIER_MAX_D];   /* (D,2F+1), (D) */
    int64_t o_lnw[QC_FOURIER_MAX_D], o_lnb[QC_FOURIER_MAX_D]; /* (D), (D) */
    int64_t o_w2[QC_FOURIER_MAX_D], o_b2[QC_FOURIER_MAX_D];   /* (D,D), (D) */
    int64_t o_out_lnw, o_out_lnb, o_out_w, o_out_b;           /* (D), (D), (D,D), (D) */
    const float *w;          /* parameters (params.numel), bound by the caller */
    float *dw;               /* gradients, same layout; backward ACCUMULATES into it */
    struct qc_block_mem mem; /* scratch hook, tag prefix and backend (zero after init =
                                malloc + CPU; set mem.ex after qc_fourier_init) */
};

/* Sets the shape and builds the parameter table; w/dw start NULL (bind them before use); mem
 * starts as malloc and CPU (qc_block_mem_set(&fe->mem, hook, name) to route the scratch
 * elsewhere, fe->mem.ex = ex to run on another backend). */
void qc_fourier_init(struct qc_fourier *fe, int64_t d, int64_t F, int64_t D);
/* Points the block at its parameter and gradient buffers (params.numel floats each; dw may be
 * NULL for forward-only use). The caller owns both. */
void qc_fourier_bind(struct qc_fourier *fe, const float *w, float *dw);

/* Plans the stash table of one forward over N rows into st (which must be empty). */
void qc_fourier_stash_plan(const struct qc_fourier *fe, int64_t N, struct qc_stash *st);

/* The memory spec of one forward (backward = false) or backward over N rows (qc_memspec.h): the
 * op's scratch ("fe_forward.h" / "fe_backward.scratch"), none when N is 0. */
void qc_fourier_memspec(const struct qc_fourier *fe, int64_t N, bool backward,
                        struct qc_memspec *s);

/* out (N,D) OVERWRITE. st: planned for N and bound; filled. c (N,d) (NULL when d = 0);
 * cat (N,D) the summed categorical embeddings, or NULL (required when d = 0).
 * Re-running with the same inputs reproduces out and every stash entry bit for bit.
 * QC_ERR_NOMEM when scratch cannot be allocated. */
enum qc_status qc_fourier_forward(const struct qc_fourier *fe, float *out, struct qc_stash *st,
                                  const float *c, const float *cat, int64_t N);
/* dc (N,d) OVERWRITE, may be NULL (edge geometry needs none); dcat (N,D) OVERWRITE, may be NULL;
 * fe->dw ACCUM. dout (N,D); st as filled by forward; c as given to forward. */
enum qc_status qc_fourier_backward(const struct qc_fourier *fe, float *dc, float *dcat,
                                   const float *dout, const struct qc_stash *st, const float *c,
                                   int64_t N);

#ifdef __cplusplus
}
#endif

#endif /* QC_MODEL_QC_FOURIER_H */
