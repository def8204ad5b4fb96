/*
 * test_cuda_launch.c — the CUDA kernels' launch arithmetic (kernels/qc_cuda_launch.h), on the
 * CPU: the grids the column reduction (colsum, kernels/cuda_common.cuh) launches cover every
 * column and every row, within CUDA's grid limits, also past the 4.19 M columns where a capped
 * grid of one thread per column would stop (the colsum_final_kernel bug this guards against).
 * Each kernel's index walk is replayed here as the kernel writes it: level 1 one column per
 * thread of a QC_COLSUM_TX-wide block, level 2 a grid-stride loop.
 */
#include <stdlib.h>
#include <string.h>

#include "qc_cuda_launch.h"
#include "testutil.h"

/* Replays one colsum (N rows, C columns, nout outputs, ws_bytes of workspace): counts in
 * `seen` how often each column is finished by level 2; checks the slabs, grid limits, the
 * workspace bound and the row chunks. Returns the number of slabs. */
static int64_t replay_colsum(int64_t N, int64_t C, int nout, size_t ws_bytes, unsigned char *seen,
                             bool *beyond_one_pass)
{
    struct qc_colsum_plan p;
    T_EXPECT(qc_colsum_plan_make(N, C, nout, ws_bytes, &p), "plan for N %lld C %lld ws %zu",
             (long long)N, (long long)C, ws_bytes);
    T_EXPECT(p.slab >= 1 && p.slab <= C, "slab %lld of C %lld", (long long)p.slab, (long long)C);
    T_EXPECT((size_t)nout * (size_t)p.nchunk * sizeof(double) * (size_t)p.slab <= ws_bytes,
             "slab %lld overflows the workspace", (long long)p.slab);
    T_EXPECT(p.nchunk * p.rows_per_chunk >= N && (p.nchunk - 1) * p.rows_per_chunk < N,
             "chunks %lld of %lld rows for N %lld", (long long)p.nchunk,
             (long long)p.rows_per_chunk, (long long)N);
    memset(seen, 0, (size_t)C);
    int64_t slabs = 0, c_next = 0;
    for (int64_t c0 = 0; c0 < C; c0 += p.slab) { /* the launch loop of colsum_launch */
        T_EXPECT_EQ_I64(c0, c_next, "slab start");
        const int64_t cs = C - c0 < p.slab ? C - c0 : p.slab;
        const struct qc_colsum_grid g = qc_colsum_grid_of(&p, cs);
        T_EXPECT(g.partial_x >= 1 && g.partial_x <= QC_CUDA_MAX_GRID_X, "level-1 grid x %u",
                 g.partial_x);
        T_EXPECT(g.partial_y >= 1 && g.partial_y <= QC_CUDA_MAX_GRID_Y, "level-1 grid y %u",
                 g.partial_y);
        T_EXPECT((int64_t)g.partial_x * QC_COLSUM_TX >= cs, "level 1 covers %lld of %lld columns",
                 (long long)g.partial_x * QC_COLSUM_TX, (long long)cs);
        T_EXPECT(g.final_blocks >= 1 && g.final_blocks <= QC_CUDA_MAX_BLOCKS, "level-2 blocks %u",
                 g.final_blocks);
        /* level 2, as colsum_final_kernel walks it: cl = tid; cl < cs; cl += nthreads */
        const int64_t nthreads = (int64_t)g.final_blocks * QC_CUDA_BLOCK;
        if (nthreads < cs)
            *beyond_one_pass = true;
        for (int64_t tid = 0; tid < nthreads; tid++)
            for (int64_t cl = tid; cl < cs; cl += nthreads)
                seen[c0 + cl]++;
        c_next = c0 + cs;
        slabs++;
    }
    T_EXPECT_EQ_I64(c_next, C, "slabs end at C");
    int64_t missed = 0, twice = 0;
    for (int64_t c = 0; c < C; c++) {
        missed += seen[c] == 0;
        twice += seen[c] > 1;
    }
    T_EXPECT_EQ_I64(missed, 0, "columns never reduced (N %lld C %lld ws %zu)", (long long)N,
                    (long long)C, ws_bytes);
    T_EXPECT_EQ_I64(twice, 0, "columns reduced twice");
    return slabs;
}

int main(void)
{
    const int64_t one_pass = (int64_t)QC_CUDA_MAX_BLOCKS * QC_CUDA_BLOCK; /* 4,194,304 */
    const int64_t big = one_pass + one_pass / 4 + 77;                     /* 5.2 M columns */
    unsigned char *seen = malloc((size_t)(2 * one_pass + 1));
    if (!seen)
        T_FATAL("out of memory");

    QC_TEST ("cuda launch: 1-D grids are capped and cover n with a grid-stride loop") {
        T_EXPECT_EQ_U64(qc_cuda_blocks(0, 256), 1, "n 0");
        T_EXPECT_EQ_U64(qc_cuda_blocks(1, 256), 1, "n 1");
        T_EXPECT_EQ_U64(qc_cuda_blocks(256, 256), 1, "n 256");
        T_EXPECT_EQ_U64(qc_cuda_blocks(257, 256), 2, "n 257");
        T_EXPECT_EQ_U64(qc_cuda_blocks(one_pass, 256), QC_CUDA_MAX_BLOCKS, "one full pass");
        T_EXPECT_EQ_U64(qc_cuda_blocks(one_pass + 1, 256), QC_CUDA_MAX_BLOCKS, "capped");
        T_EXPECT_EQ_U64(qc_cuda_blocks((int64_t)1 << 40, 64), QC_CUDA_MAX_BLOCKS, "2^40 capped");
    }

    QC_TEST ("cuda launch: colsum covers every column past 4.19 M columns (one slab)") {
        /* 64 MiB of workspace and N <= 256 rows (one chunk): one slab of 8 M columns, so the
         * level-2 grid (capped at 4.19 M threads) must loop. */
        bool beyond = false;
        const int64_t slabs = replay_colsum(100, big, 1, (size_t)64 << 20, seen, &beyond);
        T_EXPECT_EQ_I64(slabs, 1, "slabs");
        T_EXPECT(beyond, "the case never needed a second grid-stride pass (the test is too small)");
        beyond = false;
        replay_colsum(256, 2 * one_pass + 1, 1, (size_t)128 << 20, seen, &beyond);
        T_EXPECT(beyond, "2·4.19 M + 1 columns in one pass");
    }

    QC_TEST ("cuda launch: colsum slabs cover every column with the default workspace") {
        /* 16 MiB (QC_KERNELS_CUDA_WORKSPACE_BYTES), two outputs, many rows: several slabs */
        bool beyond = false;
        int64_t slabs = replay_colsum(1000000, big, 2, (size_t)16 << 20, seen, &beyond);
        T_EXPECT(slabs > 1, "%lld slab(s)", (long long)slabs);
        slabs = replay_colsum(3, 1, 1, (size_t)256 << 10, seen, &beyond); /* the minimum */
        T_EXPECT_EQ_I64(slabs, 1, "one column");
        slabs = replay_colsum(1 << 20, 4099, 2, (size_t)256 << 10, seen, &beyond);
        T_EXPECT(slabs >= 1, "minimum workspace, many rows");
    }

    QC_TEST ("cuda launch: a workspace that cannot hold one column is refused") {
        struct qc_colsum_plan p;
        T_EXPECT(!qc_colsum_plan_make(1 << 20, 10, 2, 8, &p), "8 bytes for 2 x 128 chunks");
        T_EXPECT(qc_colsum_plan_make(1 << 20, 10, 2, 2 * 128 * sizeof(double), &p) && p.slab == 1,
                 "exactly one column's partials");
    }

    free(seen);
    return qc_test_summary();
}
