/*
 * qc_kernels_cuda.h — the CUDA backend of the op interface: one launcher per CPU op of
 * qc_kernels.h, qc_<op>_<pass>_cuda(<the CPU op's arguments>, cudaStream_t stream), plus the
 * per-device context (cuBLAS / cuDNN handles, TF32 switch, reduction workspace) and the few
 * launchers that only exist on CUDA (multi-tensor AdamW, the cuDNN GRU).
 *
 * Semantics are the CPU op's, word for word (qc_kernels.h is the contract; this header repeats
 * only what differs):
 * - Every tensor pointer (float / int64_t / uint8_t arrays, the arrays inside struct qc_csr,
 *   `scratch`, a (1)-shaped loss or dloss) is a DEVICE pointer. The small parameter structs
 *   passed by pointer (struct qc_dropout, struct qc_adamw_hparams) are HOST pointers, read
 *   before the launcher returns.
 * - Launchers are asynchronous on `stream`; they never allocate and never synchronize. Shape
 *   preconditions abort (QC_ASSERT) as on CPU; every launch is followed by a launch-error check
 *   that aborts (QC_CUDA_ASSERT: a failed launch is a programmer error or a sticky device error).
 * - Results equal the CPU reference within the tolerances stated in tests/test_kernels_cuda.c.
 *   Copies, gathers, dropout masks, cumsum and every per-segment sum over a CSR are computed in
 *   the CPU's order and are bit-identical (barring contraction to FMA); transcendental functions
 *   (expf, tanhf, sinf, logf, ...) differ from glibc by a few ulp; column reductions (dbias,
 *   LayerNorm dweight/dbias, Fourier dfreqs) use a fixed two-level order with double
 *   accumulators; GEMMs are cuBLAS's.
 * - Deterministic: no atomics. Two runs with the same inputs, dims and device model give the
 *   same bits (cuBLAS is run with atomics disallowed, its default).
 *
 * Ops that call cuBLAS or need the reduction workspace (linear, layernorm backward, Fourier
 * backward, the GRUs) use this thread's current context (qc_kernels_cuda_set_current). Calling
 * them with no current context is a programmer error (abort with a hint).
 */
#ifndef QC_KERNELS_QC_KERNELS_CUDA_H
#define QC_KERNELS_QC_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h> /* cudaStream_t */

#include "qc_kernels.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- per-device context ------------------------------------------------------------------ */

struct qc_kernels_cuda; /* cuBLAS handle, lazily created cuDNN handle, TF32 flag, workspace */

/* Bytes of workspace the ops want (fixed: 16 MiB). It serves the deterministic column
 * reductions and is cuBLAS's workspace (cublasSetWorkspace: no cuBLAS allocation outside qc_alloc,
 * and a fixed workspace keeps cuBLAS's choice of kernels, hence its bits, fixed). Less still
 * works (column reductions then run in several slabs, cuBLAS picks kernels that fit) down to
 * QC_KERNELS_CUDA_WORKSPACE_MIN. */
#define QC_KERNELS_CUDA_WORKSPACE_BYTES ((size_t)16 << 20)
#define QC_KERNELS_CUDA_WORKSPACE_MIN   ((size_t)256 << 10)
/* Pinned host bytes for the upload staging ring (qc_upload_cuda): QC_KERNELS_CUDA_STAGING_SLOTS
 * slots, each upload copied through them in slot-sized chunks. */
#define QC_KERNELS_CUDA_STAGING_BYTES ((size_t)16 << 20)
#define QC_KERNELS_CUDA_STAGING_SLOTS 8

struct qc_kernels_cuda_params {
    int device;             /* CUDA ordinal the context serves */
    bool tf32;              /* cuBLAS GEMMs (and the cuDNN GRU) may use TF32 tensor cores */
    void *workspace;        /* device memory for deterministic column reductions and cuBLAS,
                               256-byte aligned, owned by the caller (from qc_alloc), outlives
                               the ctx */
    size_t workspace_bytes; /* >= QC_KERNELS_CUDA_WORKSPACE_MIN */
    void *staging;          /* optional: pinned host memory (qc_pinned) for the upload ring,
                               owned by the caller, outlives the ctx; NULL: uploads copy straight
                               from the caller's memory */
    size_t staging_bytes;   /* >= QC_KERNELS_CUDA_STAGING_SLOTS * 4096 when staging is set */
};

/* Creates a context on params->device (made current for the calling thread's CUDA runtime).
 * Returns QC_ERR_CUDA (cuBLAS / CUDA failure, message set), QC_ERR_INVALID (workspace missing
 * or too small). *out written only on QC_OK. */
enum qc_status qc_kernels_cuda_create(const struct qc_kernels_cuda_params *params,
                                      struct qc_kernels_cuda **out);
/* Destroys the handles (synchronizing the device first). NULL is a no-op. If ctx is a thread's
 * current context, that thread must clear it (set_current(NULL)) before using ops again. */
void qc_kernels_cuda_destroy(struct qc_kernels_cuda *ctx);
/* This thread's context for the ops (thread-local; NULL clears). A context is used by one host
 * thread at a time. Launches through one context on different streams are ordered by the
 * context itself (an event joins the previous stream whenever the stream changes), because
 * they share the workspace and the cuBLAS handle. */
void qc_kernels_cuda_set_current(struct qc_kernels_cuda *ctx);
struct qc_kernels_cuda *qc_kernels_cuda_current(void);
/* TF32 for later GEMMs of this context (default: params->tf32). Off: CUBLAS_DEFAULT_MATH
 * (fp32 in, fp32 compute, no down-conversion); on: CUBLAS_TF32_TENSOR_OP_MATH. */
enum qc_status qc_kernels_cuda_set_tf32(struct qc_kernels_cuda *ctx, bool tf32);
bool qc_kernels_cuda_tf32(const struct qc_kernels_cuda *ctx);

/* Host-to-device copy of `bytes` on `stream` (what qc_op_upload runs on CUDA). With this thread's
 * context holding a staging ring, a pageable source is copied into a free pinned slot and the
 * device copy runs from there: the call never waits for the stream (a pageable cudaMemcpyAsync
 * synchronizes the stream first), only, when the ring wraps, for the copy that last used the
 * slot. A pinned source (cudaHostRegister'ed, qc_pinned) or no ring: one cudaMemcpyAsync
 * straight from src. src may be reused on return when it is pageable; a pinned src must stay
 * untouched until the stream passes the copy. QC_ERR_CUDA on failure. */
enum qc_status qc_upload_cuda(void *dst, const void *src, size_t bytes, cudaStream_t stream);

/* ---- geometry -------------------------------------------------------------------------- */

void qc_round_forward_cuda(float *out, const float *inp, int64_t n, int prec, cudaStream_t stream);
void qc_pack16_cuda(uint16_t *dst, const float *src, int64_t n, int prec, cudaStream_t stream);
void qc_scale_inplace_cuda(float *x, float s, int64_t n, cudaStream_t stream);
void qc_unpack16_cuda(float *dst, const uint16_t *src, int64_t n, int prec, cudaStream_t stream);
void qc_wrap_angle_forward_cuda(float *out, const float *inp, int64_t n, cudaStream_t stream);
void qc_angle_between_2d_forward_cuda(float *out, const float *ctr, const float *vec, int64_t N,
                                      cudaStream_t stream);

/* ---- linear (cuBLAS) --------------------------------------------------------------------- */

void qc_linear_forward_cuda(float *out, const float *inp, int64_t ldi, const float *weight,
                            const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum,
                            cudaStream_t stream);
void qc_linear_backward_cuda(float *dinp, int64_t lddi, float *dweight, float *dbias,
                             const float *dout, const float *inp, int64_t ldi, const float *weight,
                             int64_t N, int64_t IC, int64_t OC, bool accum, cudaStream_t stream);
/* The same with the GEMMs in precision prec (enum qc_precision): fp32 as above; bf16 / fp16 as
 * the CPU oracle (kernels/exec.c): the launcher rounds inp, weight and (backward) dout to prec
 * with qc_half.h's rounding, into the context's workspace, then runs each GEMM on the tensor
 * cores with fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF / _16F, on operands
 * that are 16-bit values: exact whatever cuBLAS converts them to); dbias sums the fp32 dout.
 * The forward's output is not rounded here (the exec rounds it). Memory (qc_lowp_gemm.h): for
 * the op's duration cuBLAS keeps the first half of the workspace; the second half holds the
 * rounded weight and the activation rows in chunks (the weight gradient then sums the chunks'
 * partials in ascending order); it must fit OC·IC + IC + OC + 128 floats, or the launcher
 * aborts with a hint (QC_KERNELS_CUDA_WORKSPACE_BYTES gives 2 Mi floats). */
void qc_linear_forward_prec_cuda(float *out, const float *inp, int64_t ldi, const float *weight,
                                 const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum,
                                 int prec, cudaStream_t stream);
void qc_linear_backward_prec_cuda(float *dinp, int64_t lddi, float *dweight, float *dbias,
                                  const float *dout, const float *inp, int64_t ldi,
                                  const float *weight, int64_t N, int64_t IC, int64_t OC,
                                  bool accum, int prec, cudaStream_t stream);

/* ---- layernorm --------------------------------------------------------------------------- */

void qc_layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int64_t N, int64_t C,
                               cudaStream_t stream);
void qc_layernorm_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *mean, const float *rstd,
                                const float *weight, int64_t N, int64_t C, bool accum,
                                cudaStream_t stream);

/* ---- elementwise ------------------------------------------------------------------------- */

void qc_relu_forward_cuda(float *out, const float *inp, int64_t n, cudaStream_t stream);
void qc_relu_backward_cuda(float *dinp, const float *dout, const float *out, int64_t n,
                           cudaStream_t stream);
void qc_elu_forward_cuda(float *out, const float *inp, int64_t n, cudaStream_t stream);
void qc_elu_backward_cuda(float *dinp, const float *dout, const float *out, int64_t n,
                          cudaStream_t stream);
void qc_sigmoid_forward_cuda(float *out, const float *inp, int64_t n, cudaStream_t stream);
void qc_sigmoid_backward_cuda(float *dinp, const float *dout, const float *out, int64_t n,
                              cudaStream_t stream);
void qc_tanh_forward_cuda(float *out, const float *inp, int64_t n, cudaStream_t stream);
void qc_tanh_backward_cuda(float *dinp, const float *dout, const float *out, int64_t n,
                           cudaStream_t stream);
void qc_add_forward_cuda(float *out, const float *a, const float *b, int64_t n,
                         cudaStream_t stream);
void qc_add_scalar_forward_cuda(float *out, const float *inp, float s, int64_t n,
                                cudaStream_t stream);
void qc_gate_update_forward_cuda(float *out, const float *u, const float *g, const float *s,
                                 int64_t n, cudaStream_t stream);
void qc_gate_update_backward_cuda(float *du, float *dg, float *ds, const float *dout,
                                  const float *u, const float *g, const float *s, int64_t n,
                                  cudaStream_t stream);

/* ---- dropout ----------------------------------------------------------------------------- */

void qc_dropout_forward_cuda(float *out, const float *inp, int64_t n, const struct qc_dropout *d,
                             cudaStream_t stream);
void qc_dropout_backward_cuda(float *dinp, const float *dout, int64_t n, const struct qc_dropout *d,
                              cudaStream_t stream);

/* ---- embedding --------------------------------------------------------------------------- */

void qc_embedding_forward_cuda(float *out, const int64_t *idx, const float *table, int64_t N,
                               int64_t C, int64_t V, cudaStream_t stream);
/* One thread per table element, walking the N lookups in ascending n: the CPU's order, so the
 * result is bit-identical. Cost O(V·N·C / threads); V is at most a few tens in QCNet. */
void qc_embedding_backward_cuda(float *dtable, const float *dout, const int64_t *idx, int64_t N,
                                int64_t C, int64_t V, cudaStream_t stream);

/* ---- cumsum and layout ------------------------------------------------------------------- */

void qc_cumsum_forward_cuda(float *out, const float *inp, int64_t outer, int64_t L, int64_t inner,
                            cudaStream_t stream);
void qc_cumsum_backward_cuda(float *dinp, const float *dout, int64_t outer, int64_t L,
                             int64_t inner, cudaStream_t stream);
void qc_copy2d_cuda(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                    int64_t cols, bool accum, cudaStream_t stream);
void qc_repeat_interleave_forward_cuda(float *out, const float *inp, int64_t N, int64_t R,
                                       int64_t C, cudaStream_t stream);
void qc_repeat_interleave_backward_cuda(float *dinp, const float *dout, int64_t N, int64_t R,
                                        int64_t C, bool accum, cudaStream_t stream);
void qc_tile_forward_cuda(float *out, const float *inp, int64_t N, int64_t R, int64_t C,
                          cudaStream_t stream);
void qc_tile_backward_cuda(float *dinp, const float *dout, int64_t N, int64_t R, int64_t C,
                           bool accum, cudaStream_t stream);
void qc_transpose01_forward_cuda(float *out, const float *inp, int64_t D0, int64_t D1, int64_t C,
                                 cudaStream_t stream);
void qc_transpose01_backward_cuda(float *dinp, const float *dout, int64_t D0, int64_t D1, int64_t C,
                                  cudaStream_t stream);

/* ---- CSR gather / scatter ---------------------------------------------------------------- */
/* Segment reductions: one warp per segment, lanes over channels, items in CSR order. */

void qc_gather_rows_forward_cuda(float *out, const float *inp, const int64_t *idx, int64_t E,
                                 int64_t C, bool accum, cudaStream_t stream);
void qc_gather_rows_backward_cuda(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                  bool accum, cudaStream_t stream);
void qc_scatter_add_forward_cuda(float *out, const float *inp, struct qc_csr csr, int64_t C,
                                 bool accum, cudaStream_t stream);
void qc_scatter_add_backward_cuda(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                  bool accum, cudaStream_t stream);

/* ---- graph attention pieces -------------------------------------------------------------- */

void qc_attn_score_forward_cuda(float *score, const float *q, const float *k, struct qc_csr csr,
                                int64_t H, int64_t Dh, float scale, cudaStream_t stream);
void qc_attn_score_backward_cuda(float *dq, float *dk, const float *dscore, const float *q,
                                 const float *k, struct qc_csr csr, int64_t H, int64_t Dh,
                                 float scale, bool accum, cudaStream_t stream);
void qc_segment_softmax_forward_cuda(float *out, float *seg_max, float *seg_sum, const float *score,
                                     struct qc_csr csr, int64_t H, cudaStream_t stream);
void qc_segment_softmax_backward_cuda(float *dscore, const float *dout, const float *out,
                                      struct qc_csr csr, int64_t H, cudaStream_t stream);
void qc_attn_aggregate_forward_cuda(float *out, const float *alpha, const float *v,
                                    struct qc_csr csr, int64_t H, int64_t Dh,
                                    const struct qc_dropout *drop, cudaStream_t stream);
void qc_attn_aggregate_backward_cuda(float *dalpha, float *dv, const float *dout,
                                     const float *alpha, const float *v, struct qc_csr csr,
                                     int64_t H, int64_t Dh, const struct qc_dropout *drop,
                                     cudaStream_t stream);

/* ---- Fourier features -------------------------------------------------------------------- */

void qc_fourier_features_forward_cuda(float *phi, const float *c, const float *freqs, int64_t N,
                                      int64_t D, int64_t F, cudaStream_t stream);
void qc_fourier_features_backward_cuda(float *dc, float *dfreqs, const float *dphi, const float *c,
                                       const float *freqs, int64_t N, int64_t D, int64_t F,
                                       cudaStream_t stream);

/* ---- GRU: cuBLAS GEMMs + elementwise kernels, the CPU op's exact interface ---------------- */
/* Scratch sizes are the CPU's (qc_gru_*_scratch_numel), in device floats. */

void qc_gru_cell_forward_cuda(float *h_out, float *gates, const float *x, const float *h,
                              const float *w_ih, const float *b_ih, const float *w_hh,
                              const float *b_hh, int64_t N, int64_t IC, int64_t C, float *scratch,
                              cudaStream_t stream);
void qc_gru_cell_backward_cuda(float *dx, float *dh, float *dw_ih, float *db_ih, float *dw_hh,
                               float *db_hh, const float *dh_out, const float *gates,
                               const float *x, const float *h, const float *w_ih, const float *w_hh,
                               int64_t N, int64_t IC, int64_t C, float *scratch,
                               cudaStream_t stream);
void qc_gru_forward_cuda(float *hs, float *gates, const float *x, const float *h0,
                         const float *w_ih, const float *b_ih, const float *w_hh, const float *b_hh,
                         int64_t L, int64_t N, int64_t IC, int64_t C, float *scratch,
                         cudaStream_t stream);
void qc_gru_backward_cuda(float *dx, float *dh0, float *dw_ih, float *db_ih, float *dw_hh,
                          float *db_hh, const float *dh_last, const float *hs, const float *gates,
                          const float *x, const float *w_ih, const float *w_hh, int64_t L,
                          int64_t N, int64_t IC, int64_t C, float *scratch, cudaStream_t stream);
/* The same in precision prec (enum qc_precision), the CPU oracle's rounding points
 * (kernels/exec.c, docs/PRECISION.md): fp32 is the launcher above; bf16 / fp16 round x, w_ih and
 * w_hh (not h, hs, the biases or any gradient) to prec with qc_half.h's rounding, in the
 * context's workspace (as the 16-bit linear launchers do: it needs a workspace of at least
 * 2·(3C·max(IC, C) + IC + 128) floats); the input projection x·W_ihᵀ then runs on the tensor
 * cores with fp32 accumulation, every other GEMM (an operand of it is fp32 in the oracle) in
 * fp32 on the rounded weights and x; gates, states and stash stay fp32. */
void qc_gru_cell_forward_prec_cuda(float *h_out, float *gates, const float *x, const float *h,
                                   const float *w_ih, const float *b_ih, const float *w_hh,
                                   const float *b_hh, int64_t N, int64_t IC, int64_t C,
                                   float *scratch, int prec, cudaStream_t stream);
void qc_gru_cell_backward_prec_cuda(float *dx, float *dh, float *dw_ih, float *db_ih, float *dw_hh,
                                    float *db_hh, const float *dh_out, const float *gates,
                                    const float *x, const float *h, const float *w_ih,
                                    const float *w_hh, int64_t N, int64_t IC, int64_t C,
                                    float *scratch, int prec, cudaStream_t stream);
void qc_gru_forward_prec_cuda(float *hs, float *gates, const float *x, const float *h0,
                              const float *w_ih, const float *b_ih, const float *w_hh,
                              const float *b_hh, int64_t L, int64_t N, int64_t IC, int64_t C,
                              float *scratch, int prec, cudaStream_t stream);
void qc_gru_backward_prec_cuda(float *dx, float *dh0, float *dw_ih, float *db_ih, float *dw_hh,
                               float *db_hh, const float *dh_last, const float *hs,
                               const float *gates, const float *x, const float *w_ih,
                               const float *w_hh, int64_t L, int64_t N, int64_t IC, int64_t C,
                               float *scratch, int prec, cudaStream_t stream);

/* ---- GRU through cuDNN (CUDNN_GRU, CUDNN_RNN_DOUBLE_BIAS) -------------------------------- */
/* An extra path beside the signature-identical one above: cuDNN keeps its own saved state (the
 * reserve space) instead of hs / gates, so it has its own plan and buffers.
 * Gate mapping: cuDNN's GRU is r = σ(W_r x + b_Wr + R_r h + b_Rr), i(update) = σ(...),
 * h' = tanh(W_h x + b_Wh + r ⊙ (R_h h + b_Rh)), h = (1 − i) ⊙ h' + i ⊙ h_prev: exactly
 * PyTorch's r, z, n with b_hn inside r ⊙ (·). cudnnGetRNNWeightParams linLayerID 0/1/2 are the
 * input matrices of r / z(update) / n(new), 3/4/5 the recurrent ones, each [C, IC] or [C, C]
 * row-major like PyTorch's row blocks; the biases follow the same ids (b_ih blocks for 0..2,
 * b_hh blocks for 3..5). Packing is therefore a copy of each row block.
 * Determinism: as cuDNN's RNN (not guaranteed across cuDNN versions); the default model path
 * is the plain GRU above. TF32 follows the context (CUDNN_DEFAULT_MATH when on, which permits
 * TF32; CUDNN_FMA_MATH when off). */
struct qc_gru_cudnn; /* descriptors of one (L, N, IC, C) problem */

/* Builds the plan on this thread's context (its cuDNN handle, bound to `stream`, the stream the
 * plan's calls will run on). QC_ERR_CUDA on cuDNN errors. */
enum qc_status qc_gru_cudnn_create(int64_t L, int64_t N, int64_t IC, int64_t C, cudaStream_t stream,
                                   struct qc_gru_cudnn **out);
void qc_gru_cudnn_destroy(struct qc_gru_cudnn *g); /* NULL is a no-op */
/* Device bytes the caller provides (256-byte aligned each): packed weights (also the size of
 * the weight-gradient space), work (forward and backward), reserve (training forward ->
 * backward; keep it between the two). */
void qc_gru_cudnn_sizes(const struct qc_gru_cudnn *g, size_t *weight_bytes, size_t *work_bytes,
                        size_t *reserve_bytes);
/* wspace (weight_bytes) OVERWRITE from PyTorch-layout w_ih (3C,IC), b_ih (3C), w_hh (3C,C),
 * b_hh (3C). Call again after every optimizer step. */
enum qc_status qc_gru_cudnn_pack_weights(struct qc_gru_cudnn *g, void *wspace, const float *w_ih,
                                         const float *b_ih, const float *w_hh, const float *b_hh,
                                         cudaStream_t stream);
/* Training forward: y (L,N,C) OVERWRITE = the state after each step (hs[1..L] of the CPU op),
 * h_last (N,C) OVERWRITE; x (L,N,IC); h0 (N,C). reserve is written for the backward (NULL =
 * inference, no backward possible). */
enum qc_status qc_gru_forward_cudnn(struct qc_gru_cudnn *g, float *y, float *h_last, const float *x,
                                    const float *h0, const void *wspace, void *work, void *reserve,
                                    cudaStream_t stream);
/* Backward from the gradient of the final state only: dx (L,N,IC) OVERWRITE, dh0 (N,C)
 * OVERWRITE (may be NULL), dw_ih, db_ih, dw_hh, db_hh ACCUM (each may be NULL); dwspace
 * (weight_bytes) is scratch for cuDNN's packed gradient. y, x, h0, wspace, reserve as in the
 * forward. */
enum qc_status qc_gru_backward_cudnn(struct qc_gru_cudnn *g, float *dx, float *dh0, float *dw_ih,
                                     float *db_ih, float *dw_hh, float *db_hh, const float *dh_last,
                                     const float *y, const float *x, const float *h0,
                                     const void *wspace, void *dwspace, void *work, void *reserve,
                                     cudaStream_t stream);

/* ---- row-wise log_softmax / logsumexp and the loss pieces -------------------------------- */

void qc_log_softmax_forward_cuda(float *out, const float *inp, int64_t N, int64_t K,
                                 cudaStream_t stream);
void qc_log_softmax_backward_cuda(float *dinp, const float *dout, const float *out, int64_t N,
                                  int64_t K, cudaStream_t stream);
void qc_logsumexp_forward_cuda(float *out, const float *inp, int64_t N, int64_t K,
                               cudaStream_t stream);
void qc_logsumexp_backward_cuda(float *dinp, const float *dout, const float *inp, const float *out,
                                int64_t N, int64_t K, cudaStream_t stream);
void qc_laplace_nll_forward_cuda(float *nll, const float *mu, const float *scale, const float *y,
                                 int64_t n, cudaStream_t stream);
void qc_laplace_nll_backward_cuda(float *dmu, float *dscale, const float *dnll, const float *mu,
                                  const float *scale, const float *y, int64_t n,
                                  cudaStream_t stream);
void qc_best_mode_cuda(int64_t *best, const float *loc, const float *gt, int64_t gt_stride,
                       const uint8_t *mask, int64_t A, int64_t K, int64_t S, cudaStream_t stream);
/* loss, dloss: (1) device floats. scratch: qc_reg_loss_scratch_numel(A, S) device floats.
 * count: NULL or the denominators (S for the regression losses, 1 for the mixture NLL) as
 * device floats (qc_kernels.h). */
void qc_reg_loss_forward_cuda(float *loss, const float *loc, const float *scale,
                              const int64_t *best, const float *gt, int64_t gt_stride,
                              const uint8_t *mask, const float *count, int64_t A, int64_t K,
                              int64_t S, float *scratch, cudaStream_t stream);
void qc_reg_loss_backward_cuda(float *dloc, float *dscale, const float *dloss, const float *loc,
                               const float *scale, const int64_t *best, const float *gt,
                               int64_t gt_stride, const uint8_t *mask, const float *count,
                               int64_t A, int64_t K, int64_t S, float *scratch,
                               cudaStream_t stream);
void qc_mixture_nll_forward_cuda(float *loss, const float *pi, const float *loc, const float *scale,
                                 const float *gt, int64_t gt_stride, const uint8_t *reg_mask,
                                 const uint8_t *cls_mask, const float *count, int64_t A, int64_t K,
                                 int64_t S, cudaStream_t stream);
void qc_mixture_nll_backward_cuda(float *dpi, const float *dloss, const float *pi, const float *loc,
                                  const float *scale, const float *gt, int64_t gt_stride,
                                  const uint8_t *reg_mask, const uint8_t *cls_mask,
                                  const float *count, int64_t A, int64_t K, int64_t S,
                                  cudaStream_t stream);

/* ---- AdamW ------------------------------------------------------------------------------- */

/* hp: host pointer. offsets (nseg+1) and decay (nseg): device arrays, offsets sorted. */
void qc_adamw_step_cuda(float *param, float *m, float *v, const float *grad, int64_t n,
                        const struct qc_adamw_hparams *hp, cudaStream_t stream);
void qc_adamw_step_segments_cuda(float *param, float *m, float *v, const float *grad,
                                 const int64_t *offsets, const uint8_t *decay, int64_t nseg,
                                 const struct qc_adamw_hparams *hp, cudaStream_t stream);

/* One tensor of a multi-tensor AdamW step: four device arrays of n elements, not necessarily
 * contiguous with the other tensors'. */
struct qc_adamw_tensor {
    float *param;
    float *m;
    float *v;
    const float *grad;
    int64_t n;
    bool decay; /* weight decay hp->weight_decay (true) or 0 (false) */
};
/* Fused multi-tensor AdamW: the update of qc_adamw_step_cpu on every tensor of list (a HOST
 * array of count entries), in as few launches as the kernel-parameter limit allows (one per
 * QC_ADAMW_MULTI_TENSORS tensors). Same per-element arithmetic as the CPU. */
#define QC_ADAMW_MULTI_TENSORS 32
void qc_adamw_step_multi_cuda(const struct qc_adamw_tensor *list, int64_t count,
                              const struct qc_adamw_hparams *hp, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_KERNELS_CUDA_H */
