/*
 * cpu_internal.h — helpers shared by the CPU ops (kernels/cpu). Private to kernels/cpu.
 *
 * Lanes: a tile loop over T threads (cpu/attn_fused.c, cpu/fe_tiled.c) gives tile t to thread
 * t mod T (static round-robin), each thread accumulates into its own lane, and the lanes are
 * summed in lane order at the end, so a result is bit-reproducible for a given thread count.
 *
 * Dropout keep flags of a range of elements: one Philox-4x32-10 evaluation serves the 4
 * elements of a counter (qc_philox.h: element i uses word i & 3 of counter i >> 2), instead of
 * one evaluation per element; the flags are those of qc_dropout_keep, bit for bit.
 */
#ifndef QC_KERNELS_CPU_CPU_INTERNAL_H
#define QC_KERNELS_CPU_CPU_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_kernels.h"

/* dst[0..n) += Σ_{i < nlanes} lanes0[i·stride + piece + j], lanes in ascending order. */
static inline void cpu_lanes_reduce(float *dst, const float *lanes0, int nlanes, int64_t stride,
                                    int64_t piece, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        float acc = dst[j];
        for (int i = 0; i < nlanes; i++)
            acc += lanes0[(int64_t)i * stride + piece + j];
        dst[j] = acc;
    }
}

/* n rounded up to 16 floats (64 bytes: threads never share a cache line). */
static inline int64_t cpu_round16(int64_t n)
{
    return (n + 15) & ~(int64_t)15;
}

/* keep[j] = qc_dropout_keep(d->seed, d->step, d->block, index0 + j, d->p) for j in [0, n);
 * index0 is the site's flat index (d->index_base not added). */
static inline void cpu_dropout_keep_range(uint8_t *keep, const struct qc_dropout *d, int64_t index0,
                                          int64_t n)
{
    const uint32_t k0 = (uint32_t)d->seed, k1 = (uint32_t)(d->seed >> 32);
    int64_t j = 0;
    while (j < n) {
        const uint64_t q = (uint64_t)(index0 + j), g = q >> 2;
        struct qc_philox_u4 c;
        c.v[0] = (uint32_t)g;
        c.v[1] = (uint32_t)(g >> 32);
        c.v[2] = d->block;
        c.v[3] = d->step;
        const struct qc_philox_u4 x = qc_philox4x32_10(c, k0, k1);
        for (uint64_t w = q & 3u; w < 4 && j < n; w++, j++)
            keep[j] = (float)(x.v[w] >> 8) * 5.9604644775390625e-08f >= d->p; /* 2^-24 */
    }
}

#endif /* QC_KERNELS_CPU_CPU_INTERNAL_H */
