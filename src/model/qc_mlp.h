/*
 * qc_mlp.h — MLPLayer MLP(o) (QCNET.md §3.2): out = W2 · ReLU(LN(W1·x + b1)) + b2, with
 * W1: D→D and W2: D→O. Parameters mlp.0.weight/bias, mlp.1.weight/bias (LayerNorm),
 * mlp.3.weight/bias. The decoder heads (to_loc_*, to_scale_*, to_pi) are MLP layers.
 * Stash per row: the LayerNorm input and statistics and the ReLU output (1,032 B at D = 128).
 *
 * Backend: every op runs on m->mem.ex (qc_exec.h; NULL = CPU), and w, dw, the stash, x, out
 * and the gradients are memory of that backend (never dereferenced on the host); the scratch
 * hook of m->mem must hand out the same backend's memory. CPU and the emulated device give the
 * same bits.
 */
#ifndef QC_MODEL_QC_MLP_H
#define QC_MODEL_QC_MLP_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_memspec.h"
#include "qc_stash.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_mlp {
    int64_t D; /* input and hidden width (128) */
    int64_t O; /* output width */
    struct qc_param_table params;
    int64_t o_w1, o_b1, o_lnw, o_lnb, o_w2, o_b2; /* element offsets */
    const float *w;                               /* parameters, bound by the caller */
    float *dw;                                    /* gradients; backward ACCUMULATES */
    struct qc_block_mem mem; /* scratch hook, tag prefix and backend (zero after init =
                                malloc + CPU; set mem.ex after qc_mlp_init) */
};

void qc_mlp_init(struct qc_mlp *m, int64_t D, int64_t O);
void qc_mlp_bind(struct qc_mlp *m, const float *w, float *dw);
/* Plans the stash of one forward over N rows into the empty table st. */
void qc_mlp_stash_plan(const struct qc_mlp *m, int64_t N, struct qc_stash *st);
/* The memory spec of one forward (backward = false) or backward over N rows (qc_memspec.h):
 * backward's scratch (2·N·D floats, "mlp_backward.scratch"); forward allocates nothing. */
void qc_mlp_memspec(const struct qc_mlp *m, int64_t N, bool backward, struct qc_memspec *s);
/* out (N,O) OVERWRITE; st planned and bound, filled; x (N,D). */
enum qc_status qc_mlp_forward(const struct qc_mlp *m, float *out, struct qc_stash *st,
                              const float *x, int64_t N);
/* dx (N,D) OVERWRITE, may be NULL; m->dw ACCUM; dout (N,O); st as filled; x the input. */
enum qc_status qc_mlp_backward(const struct qc_mlp *m, float *dx, const float *dout,
                               const struct qc_stash *st, const float *x, int64_t N);

#ifdef __cplusplus
}
#endif

#endif /* QC_MODEL_QC_MLP_H */
