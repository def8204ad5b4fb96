/*
 * qc_exec.h — where an op runs: the backend dispatch the blocks and the model call instead of
 * a backend's launcher, so one model code path serves the CPU reference, a CUDA device and
 * the emulated device of the tests.
 *
 *   struct qc_exec   a backend and (CUDA) the stream ops are enqueued on. NULL or zeroed = CPU.
 *   qc_op_<op>_<pass>(x, <the CPU op's arguments>)   one op of qc_kernels.h, on x's backend:
 *                    CPU: qc_<op>_<pass>_cpu; CUDA: qc_<op>_<pass>_cuda(..., stream) with this
 *                    thread's op context (qc_kernels_cuda_set_current); EMU: the CPU op with
 *                    the emulated device memory opened for the duration of the call.
 *   qc_op_zero / copy / upload / download / sync   the memory moves the model needs.
 *
 * Backends:
 * - CPU: tensors are host memory; everything runs inline in the calling thread.
 * - CUDA: tensors are device memory; ops and copies are asynchronous on x->stream.
 * - EMU (tests): "device memory" is host memory from an arena (qc_emu.h) that is PROT_NONE
 *   except while an op or a memory move of this header runs. The model then runs the CUDA
 *   backend's host logic (uploads, host mirrors of index arrays, downloads of results) on the
 *   CPU ops, and any host code that dereferences device memory outside an op faults at once:
 *   what a CUDA build would do silently wrong (or crash on) is caught by a CPU test. Results
 *   are bit-identical to CPU (same ops, same order).
 *
 * - DRY (planning): every op and memory move returns at once without touching memory (a
 *   download fills its host buffer with zeros). The model's dry run uses it to list a step's
 *   block applications and allocations from the batch's sizes (qc_qcnet_describe).
 *
 * A backend with device memory (CUDA, EMU, DRY) is one for which qc_exec_is_device() is true:
 * host code must then reach tensors only through these calls.
 *
 * Thread safety: an exec is used by one host thread at a time (the op context is per thread).
 * EMU opens the arena process-wide (a nesting count, so ops called from ops are fine); run one
 * EMU model at a time.
 */
#ifndef QC_KERNELS_QC_EXEC_H
#define QC_KERNELS_QC_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_kernels.h"
#include "qc_status.h"
#include "qc_types.h" /* enum qc_precision */

#ifdef __cplusplus
extern "C" {
#endif

enum qc_exec_backend {
    QC_EXEC_CPU = 0, /* host memory, CPU ops */
    QC_EXEC_CUDA,    /* device memory, CUDA ops on `stream` */
    QC_EXEC_EMU,     /* protected host arena, CPU ops (tests) */
    QC_EXEC_DRY,     /* planning: ops and memory moves do nothing; "device" pointers are never
                        dereferenced (the model's dry run, qc_qcnet_describe) */
    QC_EXEC_BACKEND_COUNT
};

struct qc_emu; /* qc_emu.h: the protected arena of the EMU backend */

struct qc_exec {
    enum qc_exec_backend backend;
    void *stream;                /* CUDA: the cudaStream_t of every op and copy; NULL = legacy */
    struct qc_emu *emu;          /* EMU: the arena (required) */
    enum qc_precision precision; /* what the ops round their activation
                           outputs and GEMM inputs to; 0 = fp32 (docs/PRECISION.md) */
    enum qc_exec_backend target; /* DRY: the backend whose memory a plan describes (CPU, CUDA
                                    or EMU): what the ops would allocate there */
};

/* "cpu" / "cuda" / "emu" / "dry". */
const char *qc_exec_backend_str(enum qc_exec_backend b);
/* True when this build runs backend b (CUDA only with QC_HAVE_CUDA; CPU, EMU and DRY always). */
bool qc_exec_backend_built(enum qc_exec_backend b);
/* x NULL counts as CPU. */
static inline enum qc_exec_backend qc_exec_backend_of(const struct qc_exec *x)
{
    return x ? x->backend : QC_EXEC_CPU;
}
/* The backend whose memory use a call has: the backend itself, or a DRY exec's target. What an
 * op allocates (its scratch, whether it takes precomputed inputs) depends on this. */
static inline enum qc_exec_backend qc_exec_target_of(const struct qc_exec *x)
{
    const enum qc_exec_backend b = qc_exec_backend_of(x);
    return b == QC_EXEC_DRY ? x->target : b;
}
/* True when tensors live in device memory (CUDA, EMU, DRY): host code must not dereference
 * them. */
static inline bool qc_exec_is_device(const struct qc_exec *x)
{
    return qc_exec_backend_of(x) != QC_EXEC_CPU;
}

// ---- memory moves -------------------------------------------------------------------------
/* Asynchronous on CUDA (stream order); immediate on CPU and EMU. Launch failures abort (a
 * failed enqueue is a sticky device error), as the op launchers do. */

/* dst[0 .. bytes) = 0 (device memory). */
void qc_op_zero(const struct qc_exec *ex, void *dst, size_t bytes);
/* Device-to-device copy of bytes (no overlap). */
void qc_op_copy(const struct qc_exec *ex, void *dst, const void *src, size_t bytes);
/* Host-to-device copy. src may be reused when this returns if it is pageable host memory (CUDA:
 * staged through the op context's pinned ring, qc_upload_cuda, so the stream is not
 * synchronized); pinned memory must stay untouched until the stream passes the copy
 * (qc_op_sync). QC_ERR_CUDA with the CUDA error on failure. */
enum qc_status qc_op_upload(const struct qc_exec *ex, void *dst, const void *src, size_t bytes);
/* Device-to-host copy, synchronous: dst holds the data when this returns (the stream is
 * synchronized). QC_ERR_CUDA on failure (also reports an earlier asynchronous error). */
enum qc_status qc_op_download(const struct qc_exec *ex, void *dst, const void *src, size_t bytes);
/* Waits for everything enqueued on x's stream. QC_ERR_CUDA on a (sticky) device error. */
enum qc_status qc_op_sync(const struct qc_exec *x);

// ---- mixed precision (qc_half.h) ------------------------------------------------------------
/* The exec's precision; fp32 for ex NULL. */
static inline enum qc_precision qc_exec_precision(const struct qc_exec *x)
{
    return x ? x->precision : QC_PREC_FP32;
}
/* out = inp rounded to precision prec (in place allowed); pack to / unpack from 16 bits. */
void qc_op_round(const struct qc_exec *ex, float *out, const float *inp, int64_t n, int prec);
void qc_op_pack16(const struct qc_exec *ex, uint16_t *dst, const float *src, int64_t n, int prec);
void qc_op_scale_inplace(const struct qc_exec *ex, float *x, float s, int64_t n);
void qc_op_unpack16(const struct qc_exec *ex, float *dst, const uint16_t *src, int64_t n, int prec);

// ---- ops (one per CPU op of qc_kernels.h; contracts there) ----------------------------------
/* fourier_features_backward_saved runs qc_fourier_features_backward_cuda on CUDA (recomputing
 * θ instead of reading phi). qc_csr_build_cpu is a host helper and has no dispatch. */

void qc_op_wrap_angle_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n);
void qc_op_angle_between_2d_forward(const struct qc_exec *ex, float *out, const float *ctr,
                                    const float *vec, int64_t N);
void qc_op_linear_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t ldi,
                          const float *weight, const float *bias, int64_t N, int64_t IC, int64_t OC,
                          bool accum);
void qc_op_linear_backward(const struct qc_exec *ex, float *dinp, int64_t lddi, float *dweight,
                           float *dbias, const float *dout, const float *inp, int64_t ldi,
                           const float *weight, int64_t N, int64_t IC, int64_t OC, bool accum);
void qc_op_layernorm_forward(const struct qc_exec *ex, float *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int64_t N,
                             int64_t C);
void qc_op_layernorm_backward(const struct qc_exec *ex, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *mean,
                              const float *rstd, const float *weight, int64_t N, int64_t C,
                              bool accum);
void qc_op_relu_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n);
void qc_op_relu_backward(const struct qc_exec *ex, float *dinp, const float *dout, const float *out,
                         int64_t n);
void qc_op_elu_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n);
void qc_op_elu_backward(const struct qc_exec *ex, float *dinp, const float *dout, const float *out,
                        int64_t n);
void qc_op_sigmoid_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n);
void qc_op_sigmoid_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                            const float *out, int64_t n);
void qc_op_tanh_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n);
void qc_op_tanh_backward(const struct qc_exec *ex, float *dinp, const float *dout, const float *out,
                         int64_t n);
void qc_op_add_forward(const struct qc_exec *ex, float *out, const float *a, const float *b,
                       int64_t n);
void qc_op_add_scalar_forward(const struct qc_exec *ex, float *out, const float *inp, float s,
                              int64_t n);
void qc_op_gate_update_forward(const struct qc_exec *ex, float *out, const float *u, const float *g,
                               const float *s, int64_t n);
void qc_op_gate_update_backward(const struct qc_exec *ex, float *du, float *dg, float *ds,
                                const float *dout, const float *u, const float *g, const float *s,
                                int64_t n);
void qc_op_dropout_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n,
                           const struct qc_dropout *d);
void qc_op_dropout_backward(const struct qc_exec *ex, float *dinp, const float *dout, int64_t n,
                            const struct qc_dropout *d);
void qc_op_embedding_forward(const struct qc_exec *ex, float *out, const int64_t *idx,
                             const float *table, int64_t N, int64_t C, int64_t V);
void qc_op_embedding_backward(const struct qc_exec *ex, float *dtable, const float *dout,
                              const int64_t *idx, int64_t N, int64_t C, int64_t V);
void qc_op_cumsum_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t outer,
                          int64_t L, int64_t inner);
void qc_op_cumsum_backward(const struct qc_exec *ex, float *dinp, const float *dout, int64_t outer,
                           int64_t L, int64_t inner);
void qc_op_copy2d(const struct qc_exec *ex, float *dst, int64_t ld_dst, const float *src,
                  int64_t ld_src, int64_t rows, int64_t cols, bool accum);
void qc_op_repeat_interleave_forward(const struct qc_exec *ex, float *out, const float *inp,
                                     int64_t N, int64_t R, int64_t C);
void qc_op_repeat_interleave_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                      int64_t N, int64_t R, int64_t C, bool accum);
void qc_op_tile_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t N,
                        int64_t R, int64_t C);
void qc_op_tile_backward(const struct qc_exec *ex, float *dinp, const float *dout, int64_t N,
                         int64_t R, int64_t C, bool accum);
void qc_op_transpose01_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t D0,
                               int64_t D1, int64_t C);
void qc_op_transpose01_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                int64_t D0, int64_t D1, int64_t C);
void qc_op_gather_rows_forward(const struct qc_exec *ex, float *out, const float *inp,
                               const int64_t *idx, int64_t E, int64_t C, bool accum);
void qc_op_gather_rows_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                struct qc_csr csr, int64_t C, bool accum);
void qc_op_scatter_add_forward(const struct qc_exec *ex, float *out, const float *inp,
                               struct qc_csr csr, int64_t C, bool accum);
void qc_op_scatter_add_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                struct qc_csr csr, int64_t C, bool accum);
void qc_op_attn_score_forward(const struct qc_exec *ex, float *score, const float *q,
                              const float *k, struct qc_csr csr, int64_t H, int64_t Dh,
                              float scale);
void qc_op_attn_score_backward(const struct qc_exec *ex, float *dq, float *dk, const float *dscore,
                               const float *q, const float *k, struct qc_csr csr, int64_t H,
                               int64_t Dh, float scale, bool accum);
void qc_op_segment_softmax_forward(const struct qc_exec *ex, float *out, float *seg_max,
                                   float *seg_sum, const float *score, struct qc_csr csr,
                                   int64_t H);
void qc_op_segment_softmax_backward(const struct qc_exec *ex, float *dscore, const float *dout,
                                    const float *out, struct qc_csr csr, int64_t H);
void qc_op_attn_aggregate_forward(const struct qc_exec *ex, float *out, const float *alpha,
                                  const float *v, struct qc_csr csr, int64_t H, int64_t Dh,
                                  const struct qc_dropout *drop);
void qc_op_attn_aggregate_backward(const struct qc_exec *ex, float *dalpha, float *dv,
                                   const float *dout, const float *alpha, const float *v,
                                   struct qc_csr csr, int64_t H, int64_t Dh,
                                   const struct qc_dropout *drop);
void qc_op_fourier_features_forward(const struct qc_exec *ex, float *phi, const float *c,
                                    const float *freqs, int64_t N, int64_t D, int64_t F);
void qc_op_fourier_features_backward(const struct qc_exec *ex, float *dc, float *dfreqs,
                                     const float *dphi, const float *c, const float *freqs,
                                     int64_t N, int64_t D, int64_t F);
void qc_op_fourier_features_backward_saved(const struct qc_exec *ex, float *dc, float *dfreqs,
                                           const float *dphi, const float *phi, const float *c,
                                           const float *freqs, int64_t N, int64_t D, int64_t F);
void qc_op_gru_cell_forward(const struct qc_exec *ex, float *h_out, float *gates, const float *x,
                            const float *h, const float *w_ih, const float *b_ih, const float *w_hh,
                            const float *b_hh, int64_t N, int64_t IC, int64_t C, float *scratch);
void qc_op_gru_cell_backward(const struct qc_exec *ex, float *dx, float *dh, float *dw_ih,
                             float *db_ih, float *dw_hh, float *db_hh, const float *dh_out,
                             const float *gates, const float *x, const float *h, const float *w_ih,
                             const float *w_hh, int64_t N, int64_t IC, int64_t C, float *scratch);
void qc_op_gru_forward(const struct qc_exec *ex, float *hs, float *gates, const float *x,
                       const float *h0, const float *w_ih, const float *b_ih, const float *w_hh,
                       const float *b_hh, int64_t L, int64_t N, int64_t IC, int64_t C,
                       float *scratch);
void qc_op_gru_backward(const struct qc_exec *ex, float *dx, float *dh0, float *dw_ih, float *db_ih,
                        float *dw_hh, float *db_hh, const float *dh_last, const float *hs,
                        const float *gates, const float *x, const float *w_ih, const float *w_hh,
                        int64_t L, int64_t N, int64_t IC, int64_t C, float *scratch);
void qc_op_log_softmax_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t N,
                               int64_t K);
void qc_op_log_softmax_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                const float *out, int64_t N, int64_t K);
void qc_op_logsumexp_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t N,
                             int64_t K);
void qc_op_logsumexp_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                              const float *inp, const float *out, int64_t N, int64_t K);
void qc_op_laplace_nll_forward(const struct qc_exec *ex, float *nll, const float *mu,
                               const float *scale, const float *y, int64_t n);
void qc_op_laplace_nll_backward(const struct qc_exec *ex, float *dmu, float *dscale,
                                const float *dnll, const float *mu, const float *scale,
                                const float *y, int64_t n);
void qc_op_best_mode(const struct qc_exec *ex, int64_t *best, const float *loc, const float *gt,
                     int64_t gt_stride, const uint8_t *mask, int64_t A, int64_t K, int64_t S);
void qc_op_reg_loss_forward(const struct qc_exec *ex, float *loss, const float *loc,
                            const float *scale, const int64_t *best, const float *gt,
                            int64_t gt_stride, const uint8_t *mask, const float *count, int64_t A,
                            int64_t K, int64_t S, float *scratch);
void qc_op_reg_loss_backward(const struct qc_exec *ex, float *dloc, float *dscale,
                             const float *dloss, const float *loc, const float *scale,
                             const int64_t *best, const float *gt, int64_t gt_stride,
                             const uint8_t *mask, const float *count, int64_t A, int64_t K,
                             int64_t S, float *scratch);
void qc_op_mixture_nll_forward(const struct qc_exec *ex, float *loss, const float *pi,
                               const float *loc, const float *scale, const float *gt,
                               int64_t gt_stride, const uint8_t *reg_mask, const uint8_t *cls_mask,
                               const float *count, int64_t A, int64_t K, int64_t S);
void qc_op_mixture_nll_backward(const struct qc_exec *ex, float *dpi, const float *dloss,
                                const float *pi, const float *loc, const float *scale,
                                const float *gt, int64_t gt_stride, const uint8_t *reg_mask,
                                const uint8_t *cls_mask, const float *count, int64_t A, int64_t K,
                                int64_t S);
void qc_op_adamw_step(const struct qc_exec *ex, float *param, float *m, float *v, const float *grad,
                      int64_t n, const struct qc_adamw_hparams *hp);
void qc_op_adamw_step_segments(const struct qc_exec *ex, float *param, float *m, float *v,
                               const float *grad, const int64_t *offsets, const uint8_t *decay,
                               int64_t nseg, const struct qc_adamw_hparams *hp);

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_EXEC_H */
