/*
 * gru.c — GRU cell and sequence (PyTorch nn.GRU, gate order r, z, n; b_hn inside r ⊙ (·)).
 * Input projections of the whole sequence are one GEMM (x·W_ihᵀ + b_ih for all L·N rows); the
 * recurrent projection is one GEMM per step and row block (below: each thread runs every step on
 * its own rows). The backward collects the per-step gate gradients and finishes dx, dW_ih, dW_hh
 * with one GEMM each. The elementwise gates are gru_math.h's
 * (shared with the CUDA kernels), in the order of PyTorch's CPU gru_cell: h' = (h − n)·z + n.
 *
 * Saved per (step, row): gates = [r | z | n | hn] (4C) and the input state h (C, in hs).
 */
#include "qc_kernels.h"

#include <omp.h>
#include <string.h>

#include "cpu_internal.h"
#include "gru_math.h"
#include "qc_status.h"

/* Gates of N rows from xg = x·W_ihᵀ + b_ih and hg = h·W_hhᵀ + b_hh (each (N,3C)). A team only
 * for CPU_PAR_MIN elements (a row block of the sequence, below, runs them on its own thread). */
static void gru_gates(float *h_out, float *gates, const float *xg, const float *hg, const float *h,
                      int64_t N, int64_t C)
{
#pragma omp parallel for schedule(static) if (N * C >= CPU_PAR_MIN)
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
#pragma omp parallel for schedule(static) if (N * C >= CPU_PAR_MIN)
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

/* The rows of a sequence are independent recurrences: with more than one thread each thread
 * runs every step on its own contiguous block of rows (its GEMMs on one thread, cpu_team_begin),
 * so a step costs no team wake-up or barrier; below GRU_PAR_ROWS rows a thread, the calling
 * thread runs them all. Each element's arithmetic is the same for any block (the GEMM's sum over
 * C for one row and column does not depend on the other rows): the bits do not depend on the
 * thread count (test_kernels_cpu, "gru: row blocks"). */
#define GRU_PAR_ROWS 64

static int gru_threads(int64_t N)
{
    int t = omp_get_max_threads();
    if ((int64_t)t > N / GRU_PAR_ROWS)
        t = (int)(N / GRU_PAR_ROWS);
    return t < 1 ? 1 : t;
}

/* Rows [*n0, *n1) of N for thread i of T. */
static void gru_rows(int64_t N, int i, int T, int64_t *n0, int64_t *n1)
{
    *n0 = N * i / T;
    *n1 = N * (i + 1) / T;
}

/* Steps 0..L-1 of rows [n0, n1): the recurrent GEMM and the gates. */
static void gru_forward_rows(float *hs, float *gates, const float *xg, float *hg, const float *w_hh,
                             const float *b_hh, int64_t L, int64_t N, int64_t C, int64_t n0,
                             int64_t n1)
{
    const int64_t R = n1 - n0;
    for (int64_t t = 0; t < L; t++) {
        const float *h = hs + (t * N + n0) * C;
        float *hn = hs + ((t + 1) * N + n0) * C;
        for (int64_t n = 0; b_hh && n < R; n++) /* as qc_linear_forward_cpu adds a bias */
            memcpy(hg + n * 3 * C, b_hh, (size_t)(3 * C) * sizeof(float));
        qc_linear_forward_cpu(hg, h, C, w_hh, NULL, R, C, 3 * C, b_hh != NULL);
        gru_gates(hn, gates ? gates + (t * N + n0) * 4 * C : NULL, xg + (t * N + n0) * 3 * C, hg, h,
                  R, C);
    }
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
    float *xg = scratch, *hg = scratch + 3 * L * N * C; /* hg: (N,3C), row block n0.. per thread */
    qc_linear_forward_cpu(xg, x, IC, w_ih, b_ih, L * N, IC, 3 * C, false);
    const int T = gru_threads(N);
    if (T == 1) {
        gru_forward_rows(hs, gates, xg, hg, w_hh, b_hh, L, N, C, 0, N);
        return;
    }
    const struct cpu_team tm = cpu_team_begin(T);
#pragma omp parallel for schedule(static, 1) num_threads(T)
    for (int i = 0; i < T; i++) {
        int64_t n0, n1;
        gru_rows(N, i, T, &n0, &n1);
        gru_forward_rows(hs, gates, xg, hg + n0 * 3 * C, w_hh, b_hh, L, N, C, n0, n1);
    }
    cpu_team_end(tm);
}

/* Steps L-1..0 of rows [n0, n1): the gates' backward and dh += dhg_t·W_hh. */
static void gru_backward_rows(float *dxg, float *dhg, float *dh, const float *hs,
                              const float *gates, const float *w_hh, int64_t L, int64_t N,
                              int64_t C, int64_t n0, int64_t n1)
{
    const int64_t R = n1 - n0;
    for (int64_t t = L - 1; t >= 0; t--) {
        float *dxg_t = dxg + (t * N + n0) * 3 * C, *dhg_t = dhg + (t * N + n0) * 3 * C;
        gru_gates_backward(dxg_t, dhg_t, dh, dh, gates + (t * N + n0) * 4 * C,
                           hs + (t * N + n0) * C, R, C);
        qc_linear_backward_cpu(dh, C, NULL, NULL, dhg_t, NULL, C, w_hh, R, C, 3 * C, true);
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
    const int T = gru_threads(N);
    if (T == 1) {
        gru_backward_rows(dxg, dhg, dh, hs, gates, w_hh, L, N, C, 0, N);
    } else {
        const struct cpu_team tm = cpu_team_begin(T);
#pragma omp parallel for schedule(static, 1) num_threads(T)
        for (int i = 0; i < T; i++) {
            int64_t n0, n1;
            gru_rows(N, i, T, &n0, &n1);
            gru_backward_rows(dxg, dhg, dh + n0 * C, hs, gates, w_hh, L, N, C, n0, n1);
        }
        cpu_team_end(tm);
    }
    if (dh0)
        memcpy(dh0, dh, (size_t)(N * C) * sizeof(float));
    if (L == 0)
        return;
    qc_linear_backward_cpu(dx, IC, dw_ih, db_ih, dxg, x, IC, w_ih, L * N, IC, 3 * C, false);
    /* hs rows 0..L-1 are the input states of steps 0..L-1, contiguous (L·N, C). */
    qc_linear_backward_cpu(NULL, C, dw_hh, db_hh, dhg, hs, C, w_hh, L * N, C, 3 * C, false);
}
