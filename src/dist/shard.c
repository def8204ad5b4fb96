/*
 * shard.c — the arithmetic of sharded data parallelism, free of MPI: which part of the flat
 * buffer a rank owns, how a ready range is cut into pieces, and the rank-order sum that makes
 * every reduction deterministic (README.md, "Invariants").
 */
#include "qc_dist.h"

#define SHARD_ALIGN 16 /* elements: shard boundaries are 64-byte aligned */
#define SUM_BLOCK   1024

void qc_dist_shard_range(int64_t numel, int world, int r, int64_t *lo, int64_t *hi)
{
    QC_ASSERT(world >= 1 && r >= 0 && r < world && numel >= 0, "shard %d of %d, numel %lld", r,
              world, (long long)numel);
    /* boundary k = floor(numel * k / W) rounded down to the alignment; 0 and numel exact */
    const int64_t W = world;
    int64_t b0 = numel / W * r + numel % W * r / W;
    int64_t b1 = numel / W * (r + 1) + numel % W * (r + 1) / W;
    b0 = r == 0 ? 0 : b0 / SHARD_ALIGN * SHARD_ALIGN;
    b1 = r + 1 == world ? numel : b1 / SHARD_ALIGN * SHARD_ALIGN;
    *lo = b0;
    *hi = b1 > b0 ? b1 : b0;
}

int64_t qc_dist_pieces(int64_t numel, const int64_t *cuts, int ncuts, int64_t max_elems,
                       int64_t *out, int64_t cap)
{
    QC_ASSERT(max_elems >= 1 && numel >= 0, "pieces of %lld by %lld", (long long)numel,
              (long long)max_elems);
    int64_t n = 0;
    for (int64_t top = numel; top > 0;) {
        /* the region below top: down to the highest cut under it */
        int64_t floor = 0;
        for (int i = 0; i < ncuts; i++)
            if (cuts[i] < top && cuts[i] > floor)
                floor = cuts[i];
        for (; top > floor; n++) {
            const int64_t bottom = top - floor > max_elems ? top - max_elems : floor;
            if (n < cap) {
                out[2 * n] = bottom;
                out[2 * n + 1] = top;
            }
            top = bottom;
        }
    }
    return n;
}

void qc_dist_sum_rank_order(float *out, const float *const *src, int world, int64_t n)
{
    /* Blocked so the inner loops vectorise, while every element is still summed in rank order:
     * out[i] = ((src[0][i] + src[1][i]) + src[2][i]) + ... (no reassociation: no -ffast-math). */
    float acc[SUM_BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += SUM_BLOCK) {
        const int64_t m = n - i0 < SUM_BLOCK ? n - i0 : SUM_BLOCK;
        const float *s0 = src[0] + i0;
        for (int64_t i = 0; i < m; i++)
            acc[i] = s0[i];
        for (int q = 1; q < world; q++) {
            const float *s = src[q] + i0;
            for (int64_t i = 0; i < m; i++)
                acc[i] += s[i];
        }
        for (int64_t i = 0; i < m; i++)
            out[i0 + i] = acc[i];
    }
}
