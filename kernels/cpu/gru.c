/*
 * gru.c — GRU cell and sequence (PyTorch nn.GRU, gate order r, z, n; b_hn inside r ⊙ (·)).
 * Input projections of the whole sequence are one GEMM (x·W_ihᵀ + b_ih for all L·N rows); the
 * recurrent projection is one GEMM per step. The backward collects the per-step gate gradients
 * and finishes dx, dW_ih, dW_hh with one GEMM each. The elementwise gates are gru_math.h's
 * (shared with the CUDA kernels), in the order of PyTorch's CPU gru_cell: h' = (h − n)·z + n.
 *
 * Saved per (step, row): gates = [r | z | n | hn] (4C) and the input state h (C, in hs).
 */
#include "qc_kernels.h"

#include <string.h>

#include "gru_math.h"
#include "qc_status.h"

/* Gates of N rows from xg = x·W_ihᵀ + b_ih and hg = h·W_hhᵀ + b_hh (each (N,3C)). */
static void gru_gates(float *h_out, float *gates, const float *xg, const float *hg, const float *h,
                      int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = xg + n * 3 * C, *hr = hg + n * 3 * C;
        float *g = gates ? gates + n * 4 * C : NULL;
        for (int64_t c = 0; c < C; c++)
            qc_gru_gate_forward(h_out + n * C + c, g, xr, hr, h[n * C + c], c, C);
    }
}

/* Elementwise backward of one step: from dh' (N,C) to dxg, dhg (N,3C); dh_direct = dh'·z is
 * written to dh_direct when not NULL (may alias dh_out: each element is read before it is
 * written). */
static void gru_gates_backward(float *dxg, float *dhg, float *dh_direct, const float *dh_out,
                               const float *gates, const float *h, int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *g = gates + n * 4 * C;
        float *xo = dxg + n * 3 * C, *ho = dhg + n * 3 * C;
        for (int64_t c = 0; c < C; c++) {
            const float dd = qc_gru_gate_backward(xo, ho, g, dh_out[n * C + c], h[n * C + c], c, C);
            if (dh_direct)
                dh_direct[n * C + c] = dd;
        }
    }
}

int64_t qc_gru_cell_scratch_numel(int64_t N, int64_t C)
{
    return 6 * N * C;
}

void qc_gru_cell_forward_cpu(float *h_out, float *gates, const float *x, const float *h,
                             const float *w_ih, const float *b_ih, const float *w_hh,
                             const float *b_hh, int64_t N, int64_t IC, int64_t C, float *scratch)
{
    QC_ASSERT(N >= 0 && IC > 0 && C > 0 && (N == 0 || (scratch && h_out != h)),
              "gru_cell fwd: N %lld IC %lld C %lld", (long long)N, (long long)IC, (long long)C);
    if (N == 0)
        return;
    float *xg = scratch, *hg = scratch + 3 * N * C;
    qc_linear_forward_cpu(xg, x, IC, w_ih, b_ih, N, IC, 3 * C, false);
    qc_linear_forward_cpu(hg, h, C, w_hh, b_hh, N, C, 3 * C, false);
    gru_gates(h_out, gates, xg, hg, h, N, C);
}

void qc_gru_cell_backward_cpu(float *dx, float *dh, float *dw_ih, float *db_ih, float *dw_hh,
                              float *db_hh, const float *dh_out, const float *gates, const float *x,
                              const float *h, const float *w_ih, const float *w_hh, int64_t N,
                              int64_t IC, int64_t C, float *scratch)
{
    QC_ASSERT(N >= 0 && IC > 0 && C > 0 && (N == 0 || scratch), "gru_cell bwd: N %lld",
              (long long)N);
    if (N == 0)
        return;
    float *dxg = scratch, *dhg = scratch + 3 * N * C;
    /* dh = dh'·z (direct path) + dhg·W_hh (through the gates) */
    gru_gates_backward(dxg, dhg, dh, dh_out, gates, h, N, C);
    if (dh)
        qc_linear_backward_cpu(dh, C, NULL, NULL, dhg, NULL, C, w_hh, N, C, 3 * C, true);
    qc_linear_backward_cpu(dx, IC, dw_ih, db_ih, dxg, x, IC, w_ih, N, IC, 3 * C, false);
    qc_linear_backward_cpu(NULL, C, dw_hh, db_hh, dhg, h, C, w_hh, N, C, 3 * C, false);
}

int64_t qc_gru_forward_scratch_numel(int64_t L, int64_t N, int64_t C)
{
    return 3 * L * N * C + 3 * N * C;
}

int64_t qc_gru_backward_scratch_numel(int64_t L, int64_t N, int64_t C)
{
    return 6 * L * N * C + N * C;
}

void qc_gru_forward_cpu(float *hs, float *gates, const float *x, const float *h0, const float *w_ih,
                        const float *b_ih, const float *w_hh, const float *b_hh, int64_t L,
                        int64_t N, int64_t IC, int64_t C, float *scratch)
{
    QC_ASSERT(L >= 0 && N >= 0 && IC > 0 && C > 0 && (L * N == 0 || scratch),
              "gru fwd: L %lld N %lld IC %lld C %lld", (long long)L, (long long)N, (long long)IC,
              (long long)C);
    if (N == 0)
        return;
    memcpy(hs, h0, (size_t)(N * C) * sizeof(float));
    if (L == 0)
        return;
    float *xg = scratch, *hg = scratch + 3 * L * N * C;
    qc_linear_forward_cpu(xg, x, IC, w_ih, b_ih, L * N, IC, 3 * C, false);
    for (int64_t t = 0; t < L; t++) {
        const float *h = hs + t * N * C;
        qc_linear_forward_cpu(hg, h, C, w_hh, b_hh, N, C, 3 * C, false);
        gru_gates(hs + (t + 1) * N * C, gates ? gates + t * N * 4 * C : NULL, xg + t * N * 3 * C,
                  hg, h, N, C);
    }
}

void qc_gru_backward_cpu(float *dx, float *dh0, float *dw_ih, float *db_ih, float *dw_hh,
                         float *db_hh, const float *dh_last, const float *hs, const float *gates,
                         const float *x, const float *w_ih, const float *w_hh, int64_t L, int64_t N,
                         int64_t IC, int64_t C, float *scratch)
{
    QC_ASSERT(L >= 0 && N >= 0 && IC > 0 && C > 0 && (N == 0 || scratch),
              "gru bwd: L %lld N %lld IC %lld C %lld", (long long)L, (long long)N, (long long)IC,
              (long long)C);
    if (N == 0)
        return;
    float *dxg = scratch;                 /* (L,N,3C) */
    float *dhg = scratch + 3 * L * N * C; /* (L,N,3C) */
    float *dh = scratch + 6 * L * N * C;  /* (N,C) running gradient of the state */
    memcpy(dh, dh_last, (size_t)(N * C) * sizeof(float));
    for (int64_t t = L - 1; t >= 0; t--) {
        float *dxg_t = dxg + t * N * 3 * C, *dhg_t = dhg + t * N * 3 * C;
        gru_gates_backward(dxg_t, dhg_t, dh, dh, gates + t * N * 4 * C, hs + t * N * C, N, C);
        qc_linear_backward_cpu(dh, C, NULL, NULL, dhg_t, NULL, C, w_hh, N, C, 3 * C, true);
    }
    if (dh0)
        memcpy(dh0, dh, (size_t)(N * C) * sizeof(float));
    if (L == 0)
        return;
    qc_linear_backward_cpu(dx, IC, dw_ih, db_ih, dxg, x, IC, w_ih, L * N, IC, 3 * C, false);
    /* hs rows 0..L-1 are the input states of steps 0..L-1, contiguous (L·N, C). */
    qc_linear_backward_cpu(NULL, C, dw_hh, db_hh, dhg, hs, C, w_hh, L * N, C, 3 * C, false);
}
