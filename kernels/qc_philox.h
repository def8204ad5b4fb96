/*
 * qc_philox.h — Philox-4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3",
 * SC11) and the dropout mask drawn from it. Header-only so the same code compiles for the CPU
 * reference and (with __host__ __device__ under nvcc) for CUDA kernels: CPU and CUDA draw the
 * same masks bit for bit.
 *
 * Dropout mapping (the contract; change it and every recorded mask changes):
 *   inputs  seed  (uint64, the run's seed), step (uint32, the optimizer step), block (uint32, the
 *           id of one dropout site in the step, assigned by the model), index (int64 >= 0, the
 *           element's flat index within that site, e.g. e*H + h for attention weights [E,H]).
 *   key     k = { (uint32)seed, (uint32)(seed >> 32) }
 *   counter c = { (uint32)(index >> 2), (uint32)(index >> 34), block, step }
 *   word    x = philox4x32_10(c, k)[index & 3]
 *   uniform u = (float)(x >> 8) * 2^-24, exactly representable, in [0, 1)
 *   keep    u >= p  (so P(keep) = 1 - p up to 2^-24); a kept element is scaled by
 *           1.0f / (1.0f - p) computed in fp32, a dropped one is 0.
 * The mask depends on nothing else (no thread count, tile or launch shape), so a recomputed block
 * or tile redraws the same mask.
 *
 * Scene keying (struct qc_dropout.row_key in qc_kernels.h): an element that
 * belongs to scene s (its dataset index) and is element l of that scene's part of the site
 * (l < 2^34, counted within the scene only) has index = s * 2^34 + l, so its counter is
 * { l >> 2, s, block, step }: the mask of a scene's elements is a function of (seed, step, block,
 * s, l) alone, whatever else shares the batch and wherever the scene sits in it.
 */
#ifndef QC_KERNELS_QC_PHILOX_H
#define QC_KERNELS_QC_PHILOX_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#    define QC_PHILOX_FN static inline __host__ __device__
#else
#    define QC_PHILOX_FN static inline
#endif

#define QC_PHILOX_M0 0xD2511F53u /* round multipliers */
#define QC_PHILOX_M1 0xCD9E8D57u
#define QC_PHILOX_W0 0x9E3779B9u /* Weyl key increments (golden ratio, sqrt(3) - 1) */
#define QC_PHILOX_W1 0xBB67AE85u

#define QC_DROPOUT_SCENE_SHIFT 34                                     /* index = s * 2^34 + l */
#define QC_DROPOUT_LOCAL_MAX   ((int64_t)1 << QC_DROPOUT_SCENE_SHIFT) /* l < 2^34 */
#define QC_DROPOUT_SCENE_MAX   ((int64_t)1 << 29)                     /* s < 2^29: index >= 0 */

struct qc_philox_u4 {
    uint32_t v[4];
};

/* One Philox-4x32 evaluation with 10 rounds: out = philox4x32_10(ctr, key). The first round uses
 * the key as given, the key is bumped by (W0, W1) between rounds (Random123's philox4x32_R). */
QC_PHILOX_FN struct qc_philox_u4 qc_philox4x32_10(struct qc_philox_u4 ctr, uint32_t key0,
                                                  uint32_t key1)
{
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)QC_PHILOX_M0 * ctr.v[0];
        uint64_t p1 = (uint64_t)QC_PHILOX_M1 * ctr.v[2];
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        struct qc_philox_u4 n;
        n.v[0] = hi1 ^ ctr.v[1] ^ key0;
        n.v[1] = lo1;
        n.v[2] = hi0 ^ ctr.v[3] ^ key1;
        n.v[3] = lo0;
        ctr = n;
        key0 += QC_PHILOX_W0;
        key1 += QC_PHILOX_W1;
    }
    return ctr;
}

/* The uniform in [0, 1) of element `index` of dropout site `block` at `step` (mapping above). */
QC_PHILOX_FN float qc_philox_uniform(uint64_t seed, uint32_t step, uint32_t block, int64_t index)
{
    uint64_t q = (uint64_t)index;
    struct qc_philox_u4 c;
    c.v[0] = (uint32_t)(q >> 2);
    c.v[1] = (uint32_t)(q >> 34);
    c.v[2] = block;
    c.v[3] = step;
    struct qc_philox_u4 x = qc_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (float)(x.v[q & 3u] >> 8) * 5.9604644775390625e-08f; /* 2^-24 */
}

/* True when element `index` is kept by dropout with drop probability p (0 <= p < 1). */
QC_PHILOX_FN bool qc_dropout_keep(uint64_t seed, uint32_t step, uint32_t block, int64_t index,
                                  float p)
{
    return qc_philox_uniform(seed, step, block, index) >= p;
}

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_PHILOX_H */
