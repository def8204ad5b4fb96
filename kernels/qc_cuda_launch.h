/*
 * qc_cuda_launch.h — the launch arithmetic of the CUDA kernels as plain C (no CUDA header), so
 * that a test on a CPU-only build can prove what a grid covers: the capped 1-D grid size of the
 * grid-stride kernels and the plan of the deterministic column reduction (colsum, in
 * kernels/cuda_common.cuh), which launches with exactly these numbers.
 *
 * Glossary:
 *   grid-stride  a kernel loop `for (i = tid; i < n; i += nthreads)`: any grid covers any n, so
 *                the grid may be capped (QC_CUDA_MAX_BLOCKS) without losing work.
 *   slab         the columns [c0, c0 + cs) one pair of colsum launches handles; the workspace
 *                holds NOUT · nchunk doubles per column of a slab.
 *   chunk        the rows one level-1 block reduces; depends on N only (fixed summation order).
 *
 * Invariants (tests/test_cuda_launch.c):
 *   slabs:   c0 = 0, slab, 2·slab, ... < C; Σ cs = C; NOUT · nchunk · 8 · slab <= workspace bytes
 *   level 1: partial_x · QC_COLSUM_TX >= cs, partial_x <= QC_CUDA_MAX_GRID_X,
 *            partial_y = nchunk <= QC_CUDA_MAX_GRID_Y, nchunk · rows_per_chunk >= N
 *   level 2: final_blocks <= QC_CUDA_MAX_BLOCKS; its grid-stride loop visits every column of the
 *            slab exactly once, also when cs > final_blocks · QC_CUDA_BLOCK (about 4.19 M).
 */
#ifndef QC_KERNELS_QC_CUDA_LAUNCH_H
#define QC_KERNELS_QC_CUDA_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QC_CUDA_BLOCK      256        /* threads of a 1-D elementwise block */
#define QC_CUDA_MAX_BLOCKS 16384      /* cap of 1-D grids; grid-stride loops cover the rest */
#define QC_CUDA_MAX_GRID_X 2147483647 /* CUDA's limits on gridDim.x and gridDim.y */
#define QC_CUDA_MAX_GRID_Y 65535

#define QC_COLSUM_MAX_CHUNKS 128 /* row chunks (level 1); their partials are summed in order */
#define QC_COLSUM_MIN_ROWS   256 /* rows per chunk at least */
#define QC_COLSUM_TX         32  /* columns per level-1 block */
#define QC_COLSUM_TY         8   /* row lanes per level-1 block */

/* Blocks for n work items of `block` threads each, capped at QC_CUDA_MAX_BLOCKS (the kernels
 * are grid-stride); at least 1. */
static inline unsigned int qc_cuda_blocks(int64_t n, int block)
{
    int64_t b = (n + block - 1) / block;
    if (b > QC_CUDA_MAX_BLOCKS)
        b = QC_CUDA_MAX_BLOCKS;
    return (unsigned int)(b > 0 ? b : 1);
}

/* Row chunking for N rows: depends on N only, so the summation order is fixed. */
static inline int64_t qc_colsum_rows_per_chunk(int64_t N)
{
    int64_t r = (N + QC_COLSUM_MAX_CHUNKS - 1) / QC_COLSUM_MAX_CHUNKS;
    return r < QC_COLSUM_MIN_ROWS ? QC_COLSUM_MIN_ROWS : r;
}

struct qc_colsum_plan {
    int64_t rows_per_chunk; /* rows of each level-1 chunk */
    int64_t nchunk;         /* chunks: level 1's grid y */
    int64_t slab;           /* columns per launch pair (the workspace's capacity, at most C) */
};

/* The plan for out_k[c] += Σ_{n<N} f(n, c)[k], c < C, k < nout, with ws_bytes of workspace
 * (N, C > 0). False when the workspace cannot hold one column's partials. */
static inline bool qc_colsum_plan_make(int64_t N, int64_t C, int nout, size_t ws_bytes,
                                       struct qc_colsum_plan *p)
{
    p->rows_per_chunk = qc_colsum_rows_per_chunk(N);
    p->nchunk = (N + p->rows_per_chunk - 1) / p->rows_per_chunk;
    const int64_t per_col = (int64_t)nout * p->nchunk * (int64_t)sizeof(double);
    p->slab = (int64_t)(ws_bytes / (size_t)per_col);
    if (p->slab > C)
        p->slab = C;
    return p->slab >= 1;
}

struct qc_colsum_grid {
    unsigned int partial_x;    /* level 1: blocks of QC_COLSUM_TX columns */
    unsigned int partial_y;    /* level 1: one per row chunk */
    unsigned int final_blocks; /* level 2: blocks of QC_CUDA_BLOCK threads, grid-stride */
};

/* The two grids for a slab of cs columns (cs <= plan->slab). */
static inline struct qc_colsum_grid qc_colsum_grid_of(const struct qc_colsum_plan *p, int64_t cs)
{
    struct qc_colsum_grid g;
    g.partial_x = (unsigned int)((cs + QC_COLSUM_TX - 1) / QC_COLSUM_TX);
    g.partial_y = (unsigned int)p->nchunk;
    g.final_blocks = qc_cuda_blocks(cs, QC_CUDA_BLOCK);
    return g;
}

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_CUDA_LAUNCH_H */
