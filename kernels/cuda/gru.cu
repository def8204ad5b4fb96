/*
 * gru.cu — GRU cell and sequence with the CPU op's exact interface (kernels/cpu/gru.c): the
 * input projection of the whole sequence is one cuBLAS GEMM, the recurrent projection one GEMM
 * per step, the gates one elementwise kernel per step; the backward gathers the per-step gate
 * gradients in scratch and finishes dx, dW_ih, dW_hh (and the biases) with one GEMM each.
 * The elementwise gates are gru_math.h's, the CPU op's own formulas (gate order r, z, n as
 * PyTorch, b_hn inside r ⊙ (·), h' = (h − n)·z + n).
 * Saved per (step, row): gates = [r | z | n | hn] (4C) and the input state (hs).
 *
 * 16-bit runs (the _prec launchers, docs/PRECISION.md): the CPU oracle (kernels/exec.c) rounds x,
 * W_ih and W_hh and nothing else. So the input projection x·W_ihᵀ has two 16-bit operands and
 * runs on the tensor cores (fp32 accumulation); every other GEMM has an operand the oracle keeps
 * in fp32 (the hidden state h, the gate gradients) and stays fp32 (cublasSgemm) on the rounded
 * weight or x; the gates, the hidden state and the stash stay fp32. The rounded operands are
 * made by the linear launchers' 16-bit path (cuda_linear_*_lowp, linear.cu) in the workspace.
 */
#include "cuda_common.cuh"
#include "gru_math.h"
#include "qc_half.h"

/* Gates of N rows from xg = x·W_ihᵀ + b_ih and hg = h·W_hhᵀ + b_hh (each (N,3C)). */
static __global__ void gru_gates_kernel(float *h_out, float *gates, const float *xg,
                                        const float *hg, const float *h, int64_t N, int64_t C)
{
    int64_t total = N * C;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t n = t / C, c = t % C;
        float *g = gates ? gates + n * 4 * C : NULL;
        qc_gru_gate_forward(h_out + t, g, xg + n * 3 * C, hg + n * 3 * C, h[t], c, C);
    }
}

/* Elementwise backward of one step: dh' (N,C) -> dxg, dhg (N,3C); dh_direct = dh'·z when not
 * NULL (may alias dh_out: each element is read before it is written, by the same thread). */
static __global__ void gru_gates_backward_kernel(float *dxg, float *dhg, float *dh_direct,
                                                 const float *dh_out, const float *gates,
                                                 const float *h, int64_t N, int64_t C)
{
    int64_t total = N * C;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t n = t / C, c = t % C;
        const float dd = qc_gru_gate_backward(dxg + n * 3 * C, dhg + n * 3 * C, gates + n * 4 * C,
                                              dh_out[t], h[t], c, C);
        if (dh_direct)
            dh_direct[t] = dd;
    }
}

static void gru_gates(float *h_out, float *gates, const float *xg, const float *hg, const float *h,
                      int64_t N, int64_t C, cudaStream_t stream)
{
    gru_gates_kernel<<<cuda_blocks(N * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(h_out, gates, xg,
                                                                                hg, h, N, C);
    QC_CUDA_LAUNCH_CHECK();
}

static void gru_gates_backward(float *dxg, float *dhg, float *dh_direct, const float *dh_out,
                               const float *gates, const float *h, int64_t N, int64_t C,
                               cudaStream_t stream)
{
    gru_gates_backward_kernel<<<cuda_blocks(N * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dxg, dhg, dh_direct, dh_out, gates, h, N, C);
    QC_CUDA_LAUNCH_CHECK();
}

static void copy_d2d(float *dst, const float *src, int64_t n, cudaStream_t stream)
{
    QC_CUDA_ASSERT(
        cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

/* One GEMM of the GRU in precision prec: fp32 (or no operand to round) is the fp32 linear
 * launcher itself; bf16 / fp16 round the operands named by rnd (CUDA_LOWP_*) first. */
static void gru_linear_forward(float *out, const float *inp, int64_t ldi, const float *w,
                               const float *b, int64_t N, int64_t IC, int64_t OC, int prec,
                               unsigned rnd, cudaStream_t stream)
{
    if (prec == QC_PREC_FP32 || rnd == 0)
        qc_linear_forward_cuda(out, inp, ldi, w, b, N, IC, OC, false, stream);
    else
        cuda_linear_forward_lowp(out, inp, ldi, w, b, N, IC, OC, false, prec, rnd, stream);
}

static void gru_linear_backward(float *dinp, int64_t lddi, float *dw, float *db, const float *dout,
                                const float *inp, int64_t ldi, const float *w, int64_t N,
                                int64_t IC, int64_t OC, bool accum, int prec, unsigned rnd,
                                cudaStream_t stream)
{
    if (prec == QC_PREC_FP32 || rnd == 0)
        qc_linear_backward_cuda(dinp, lddi, dw, db, dout, inp, ldi, w, N, IC, OC, accum, stream);
    else
        cuda_linear_backward_lowp(dinp, lddi, dw, db, dout, inp, ldi, w, N, IC, OC, accum, prec,
                                  rnd, stream);
}

static void gru_check_prec(int prec, const char *op)
{
    QC_ASSERT(prec == QC_PREC_FP32 || prec == QC_PREC_BF16 || prec == QC_PREC_FP16,
              "%s: precision %d", op, prec);
}

void qc_gru_cell_forward_cuda(float *h_out, float *gates, const float *x, const float *h,
                              const float *w_ih, const float *b_ih, const float *w_hh,
                              const float *b_hh, int64_t N, int64_t IC, int64_t C, float *scratch,
                              cudaStream_t stream)
{
    qc_gru_cell_forward_prec_cuda(h_out, gates, x, h, w_ih, b_ih, w_hh, b_hh, N, IC, C, scratch,
                                  QC_PREC_FP32, stream);
}

void qc_gru_cell_forward_prec_cuda(float *h_out, float *gates, const float *x, const float *h,
                                   const float *w_ih, const float *b_ih, const float *w_hh,
                                   const float *b_hh, int64_t N, int64_t IC, int64_t C,
                                   float *scratch, int prec, cudaStream_t stream)
{
    gru_check_prec(prec, "gru_cell fwd cuda");
    QC_ASSERT(N >= 0 && IC > 0 && C > 0 && (N == 0 || (scratch && h_out != h)),
              "gru_cell fwd cuda: N %lld IC %lld C %lld", (long long)N, (long long)IC,
              (long long)C);
    if (N == 0)
        return;
    float *xg = scratch, *hg = scratch + 3 * N * C;
    gru_linear_forward(xg, x, IC, w_ih, b_ih, N, IC, 3 * C, prec, CUDA_LOWP_INP | CUDA_LOWP_W,
                       stream);
    gru_linear_forward(hg, h, C, w_hh, b_hh, N, C, 3 * C, prec, CUDA_LOWP_W, stream);
    gru_gates(h_out, gates, xg, hg, h, N, C, stream);
}

void qc_gru_cell_backward_cuda(float *dx, float *dh, float *dw_ih, float *db_ih, float *dw_hh,
                               float *db_hh, const float *dh_out, const float *gates,
                               const float *x, const float *h, const float *w_ih, const float *w_hh,
                               int64_t N, int64_t IC, int64_t C, float *scratch,
                               cudaStream_t stream)
{
    qc_gru_cell_backward_prec_cuda(dx, dh, dw_ih, db_ih, dw_hh, db_hh, dh_out, gates, x, h, w_ih,
                                   w_hh, N, IC, C, scratch, QC_PREC_FP32, stream);
}

void qc_gru_cell_backward_prec_cuda(float *dx, float *dh, float *dw_ih, float *db_ih, float *dw_hh,
                                    float *db_hh, const float *dh_out, const float *gates,
                                    const float *x, const float *h, const float *w_ih,
                                    const float *w_hh, int64_t N, int64_t IC, int64_t C,
                                    float *scratch, int prec, cudaStream_t stream)
{
    gru_check_prec(prec, "gru_cell bwd cuda");
    QC_ASSERT(N >= 0 && IC > 0 && C > 0 && (N == 0 || scratch), "gru_cell bwd cuda: N %lld",
              (long long)N);
    if (N == 0)
        return;
    float *dxg = scratch, *dhg = scratch + 3 * N * C;
    /* dh = dh'·z (direct path) + dhg·W_hh (through the gates) */
    gru_gates_backward(dxg, dhg, dh, dh_out, gates, h, N, C, stream);
    if (dh)
        gru_linear_backward(dh, C, NULL, NULL, dhg, NULL, C, w_hh, N, C, 3 * C, true, prec,
                            CUDA_LOWP_W, stream);
    gru_linear_backward(dx, IC, dw_ih, db_ih, dxg, x, IC, w_ih, N, IC, 3 * C, false, prec,
                        CUDA_LOWP_INP | CUDA_LOWP_W, stream);
    gru_linear_backward(NULL, C, dw_hh, db_hh, dhg, h, C, w_hh, N, C, 3 * C, false, prec, 0,
                        stream);
}

void qc_gru_forward_cuda(float *hs, float *gates, const float *x, const float *h0,
                         const float *w_ih, const float *b_ih, const float *w_hh, const float *b_hh,
                         int64_t L, int64_t N, int64_t IC, int64_t C, float *scratch,
                         cudaStream_t stream)
{
    qc_gru_forward_prec_cuda(hs, gates, x, h0, w_ih, b_ih, w_hh, b_hh, L, N, IC, C, scratch,
                             QC_PREC_FP32, stream);
}

void qc_gru_forward_prec_cuda(float *hs, float *gates, const float *x, const float *h0,
                              const float *w_ih, const float *b_ih, const float *w_hh,
                              const float *b_hh, int64_t L, int64_t N, int64_t IC, int64_t C,
                              float *scratch, int prec, cudaStream_t stream)
{
    gru_check_prec(prec, "gru fwd cuda");
    QC_ASSERT(L >= 0 && N >= 0 && IC > 0 && C > 0 && (L * N == 0 || scratch),
              "gru fwd cuda: L %lld N %lld IC %lld C %lld", (long long)L, (long long)N,
              (long long)IC, (long long)C);
    if (N == 0)
        return;
    copy_d2d(hs, h0, N * C, stream);
    if (L == 0)
        return;
    float *xg = scratch, *hg = scratch + 3 * L * N * C;
    gru_linear_forward(xg, x, IC, w_ih, b_ih, L * N, IC, 3 * C, prec, CUDA_LOWP_INP | CUDA_LOWP_W,
                       stream);
    for (int64_t t = 0; t < L; t++) {
        const float *h = hs + t * N * C;
        gru_linear_forward(hg, h, C, w_hh, b_hh, N, C, 3 * C, prec, CUDA_LOWP_W, stream);
        gru_gates(hs + (t + 1) * N * C, gates ? gates + t * N * 4 * C : NULL, xg + t * N * 3 * C,
                  hg, h, N, C, stream);
    }
}

void qc_gru_backward_cuda(float *dx, float *dh0, float *dw_ih, float *db_ih, float *dw_hh,
                          float *db_hh, const float *dh_last, const float *hs, const float *gates,
                          const float *x, const float *w_ih, const float *w_hh, int64_t L,
                          int64_t N, int64_t IC, int64_t C, float *scratch, cudaStream_t stream)
{
    qc_gru_backward_prec_cuda(dx, dh0, dw_ih, db_ih, dw_hh, db_hh, dh_last, hs, gates, x, w_ih,
                              w_hh, L, N, IC, C, scratch, QC_PREC_FP32, stream);
}

void qc_gru_backward_prec_cuda(float *dx, float *dh0, float *dw_ih, float *db_ih, float *dw_hh,
                               float *db_hh, const float *dh_last, const float *hs,
                               const float *gates, const float *x, const float *w_ih,
                               const float *w_hh, int64_t L, int64_t N, int64_t IC, int64_t C,
                               float *scratch, int prec, cudaStream_t stream)
{
    gru_check_prec(prec, "gru bwd cuda");
    QC_ASSERT(L >= 0 && N >= 0 && IC > 0 && C > 0 && (N == 0 || scratch),
              "gru bwd cuda: L %lld N %lld IC %lld C %lld", (long long)L, (long long)N,
              (long long)IC, (long long)C);
    if (N == 0)
        return;
    float *dxg = scratch;                 /* (L,N,3C) */
    float *dhg = scratch + 3 * L * N * C; /* (L,N,3C) */
    float *dh = scratch + 6 * L * N * C;  /* (N,C) running gradient of the state */
    copy_d2d(dh, dh_last, N * C, stream);
    for (int64_t t = L - 1; t >= 0; t--) {
        float *dxg_t = dxg + t * N * 3 * C, *dhg_t = dhg + t * N * 3 * C;
        gru_gates_backward(dxg_t, dhg_t, dh, dh, gates + t * N * 4 * C, hs + t * N * C, N, C,
                           stream);
        gru_linear_backward(dh, C, NULL, NULL, dhg_t, NULL, C, w_hh, N, C, 3 * C, true, prec,
                            CUDA_LOWP_W, stream);
    }
    if (dh0)
        copy_d2d(dh0, dh, N * C, stream);
    if (L == 0)
        return;
    gru_linear_backward(dx, IC, dw_ih, db_ih, dxg, x, IC, w_ih, L * N, IC, 3 * C, false, prec,
                        CUDA_LOWP_INP | CUDA_LOWP_W, stream);
    /* hs rows 0..L-1 are the input states of steps 0..L-1, contiguous (L·N, C); no operand of
     * this GEMM is rounded (the oracle's hs and gate gradients are fp32) */
    gru_linear_backward(NULL, C, dw_hh, db_hh, dhg, hs, C, w_hh, L * N, C, 3 * C, false, prec, 0,
                        stream);
}
