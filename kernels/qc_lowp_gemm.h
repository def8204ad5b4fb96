/*
 * qc_lowp_gemm.h — the plan of a 16-bit GEMM op on CUDA (train.precision bf16 / fp16,
 * docs/PRECISION.md): where its operands, rounded to 16 bits, live while its GEMMs run. Plain C
 * and header-only, so tests/test_half_cuda.c checks the arithmetic on machines without a GPU.
 *
 * The CPU oracle (kernels/exec.c) rounds a GEMM's operands into host copies. The CUDA launchers
 * (kernels/cuda/linear.cu, gru.cu) round them into the op context's workspace instead: for the
 * duration of one 16-bit op, cuBLAS is given the first part of the workspace
 * (qc_lowp_blas_bytes) and the rounded operands take the rest (the "area"):
 *
 *   area = [ weight (OC·IC) | input rows (rows·IC) | output-gradient rows (rows·OC) ]
 *
 * each piece present only when that operand is rounded, each starting on a 256-byte boundary.
 * The weight is rounded whole; the activation operands (N rows) are rounded and multiplied in
 * chunks of `rows` rows (the last chunk shorter). Row chunks leave every element of the forward
 * and of the input gradient the same dot product; the weight gradient's sum over the N rows
 * becomes a sum of chunk partials (fp32, in ascending chunk order). The chunk size depends only
 * on the workspace size and the dims, so a step's results do not depend on anything else.
 */
#ifndef QC_KERNELS_QC_LOWP_GEMM_H
#define QC_KERNELS_QC_LOWP_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QC_LOWP_ALIGN 64 /* floats: 256 bytes, cuBLAS's pointer alignment */

/* Bytes of the workspace cuBLAS keeps during a 16-bit op: half, rounded down to 256 bytes. */
static inline size_t qc_lowp_blas_bytes(size_t ws_bytes)
{
    return (ws_bytes / 2) & ~(size_t)255;
}

/* Floats of the area: the workspace after cuBLAS's part. */
static inline int64_t qc_lowp_area_numel(size_t ws_bytes)
{
    return (int64_t)((ws_bytes - qc_lowp_blas_bytes(ws_bytes)) / sizeof(float));
}

static inline int64_t qc_lowp_align(int64_t n)
{
    return (n + QC_LOWP_ALIGN - 1) / QC_LOWP_ALIGN * QC_LOWP_ALIGN;
}

struct qc_lowp_plan {
    int64_t w_off;    /* floats into the area of the rounded weight (OC·IC); -1: not rounded */
    int64_t inp_off;  /* ... of a chunk of rounded input rows (rows·IC); -1: not rounded */
    int64_t dout_off; /* ... of a chunk of rounded output-gradient rows (rows·OC); -1: not */
    int64_t rows;     /* rows per chunk: 1 <= rows <= N; N when no activation is rounded */
    int64_t nchunk;   /* chunks: ceil(N / rows) (0 when N = 0) */
    int64_t used;     /* floats of the area the plan touches: <= the area */
};

/* Plans an op over N rows (input rows of IC, output rows of OC) in an area of `area` floats,
 * rounding the weight (w), the input rows (inp) and the output-gradient rows (dout) as asked.
 * False when the rounded weight and one row of each rounded activation do not fit (p is then
 * left unspecified). */
static inline bool qc_lowp_plan_make(int64_t area, int64_t N, int64_t IC, int64_t OC, bool w,
                                     bool inp, bool dout, struct qc_lowp_plan *p)
{
    if (area < 0 || N < 0 || IC < 1 || OC < 1)
        return false;
    const int64_t wn = w ? OC * IC : 0;
    const int64_t per_row = (inp ? IC : 0) + (dout ? OC : 0);
    p->w_off = w ? 0 : -1;
    const int64_t a0 = qc_lowp_align(wn); /* where the activation chunks start */
    if (per_row == 0 || N == 0) {
        p->rows = N;
    } else {
        /* two pieces, each aligned: at most QC_LOWP_ALIGN - 1 floats lost between them */
        const int64_t avail = area - a0 - QC_LOWP_ALIGN;
        p->rows = avail > 0 ? avail / per_row : 0;
        if (p->rows > N)
            p->rows = N;
        if (p->rows < 1)
            return false;
    }
    int64_t end = wn;
    p->inp_off = -1;
    p->dout_off = -1;
    if (inp) {
        p->inp_off = a0;
        end = p->inp_off + p->rows * IC;
    }
    if (dout) {
        p->dout_off = qc_lowp_align(end);
        end = p->dout_off + p->rows * OC;
    }
    p->used = end;
    p->nchunk = N == 0 ? 0 : (N + p->rows - 1) / p->rows;
    return end <= area;
}

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_LOWP_GEMM_H */
