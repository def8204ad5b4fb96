/*
 * cpu_internal.h — helpers shared by the CPU ops (kernels/cpu). Private to kernels/cpu.
 *
 * Lanes: a tile loop over T threads (cpu/attn_fused.c, cpu/fe_tiled.c) gives tile t to thread
 * t mod T (static round-robin), each thread accumulates into its own lane, and the lanes are
 * summed in lane order at the end, so a result is bit-reproducible for a given thread count.
 *
 * Dropout keep flags of a range of elements: one Philox-4x32-10 evaluation serves the 4
 * elements of a counter (qc_philox.h: element i uses word i & 3 of counter i >> 2), instead of
 * one evaluation per element, and up to 64 counters are evaluated side by side (vectorized);
 * the flags are those of qc_dropout_keep, bit for bit.
 */
#ifndef QC_KERNELS_CPU_CPU_INTERNAL_H
#define QC_KERNELS_CPU_CPU_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "qc_kernels.h"
#include "qc_prof.h"

/* Fewest elements worth an OpenMP team in a cheap per-element loop: waking a passive team costs
 * tens of µs, about what one thread takes for 2^18 elements of LayerNorm; below, the calling
 * thread does the loop alone (`#pragma omp parallel for if (n >= CPU_PAR_MIN)`; the work items
 * are independent, so the bits are the same either way). */
#define CPU_PAR_MIN (1 << 18)

/* The bracket of a tile loop over nthreads OpenMP threads (cpu/attn_fused.c, cpu/fe_tiled.c):
 * the sub-ops' GEMMs run on the tile's thread (OpenBLAS set to one thread, restored by
 * cpu_team_end), and the profiler, when on, is told of the team. */
struct cpu_team {
    int blas_threads; /* OpenBLAS's count before the loop */
    bool prof;        /* qc_prof_on() at the start */
};

static inline struct cpu_team cpu_team_begin(int nthreads)
{
    struct cpu_team tm = {qc_kernels_cpu_blas_threads(), qc_prof_on()};
    qc_kernels_cpu_set_blas_threads(1);
    if (tm.prof)
        qc_prof_team_begin(nthreads);
    return tm;
}

static inline void cpu_team_end(struct cpu_team tm)
{
    if (tm.prof)
        qc_prof_team_end();
    qc_kernels_cpu_set_blas_threads(tm.blas_threads);
}

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

/* co[i] = cos th[i], si[i] = sin th[i] for i < n: the correctly rounded values but within
 * ~1e-13 of a rounding boundary, vectorized (cpu/sincos.c). */
void cpu_sincos(float *restrict co, float *restrict si, const float *restrict th, int64_t n);

/* keep ? x : +0.0f without a branch (the dropout flags are random: a branch mispredicts on every
 * dropped element; as a mask the loop vectorizes). The same bits as the conditional. */
static inline float cpu_keep_or_zero(float x, uint8_t keep)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    b &= 0u - (uint32_t)keep;
    memcpy(&x, &b, sizeof b);
    return x;
}

/* n rounded up to 16 floats (64 bytes: threads never share a cache line). */
static inline int64_t cpu_round16(int64_t n)
{
    return (n + 15) & ~(int64_t)15;
}

#define CPU_PHILOX_LANES 64 /* counters per cpu_philox4x32_10_lanes call (256 dropout flags) */

/* Philox-4x32-10 of `count` (<= CPU_PHILOX_LANES) consecutive counters g .. g+count−1 (block,
 * step as given) at once: the same rounds as qc_philox4x32_10 (qc_philox.h) on independent
 * lanes, one loop over the lanes per round, which the compiler vectorizes (the widening
 * multiplies 4 lanes at a time); one evaluation alone is a chain of dependent multiplies.
 * x[w][l] = word w of counter g + l. 64 lanes: the dropout op 2.7 ns per element on one thread
 * against 5.8 ns with 4 lanes (issue 29, docs/BENCHMARKS.md "Dropout and Fourier features
 * vectorized"). */
static inline void cpu_philox4x32_10_lanes(uint32_t x[4][CPU_PHILOX_LANES], uint64_t g, int count,
                                           uint32_t block, uint32_t step, uint32_t key0,
                                           uint32_t key1)
{
    uint32_t *c0 = x[0], *c1 = x[1], *c2 = x[2], *c3 = x[3];
    for (int l = 0; l < count; l++) {
        const uint64_t q = g + (uint64_t)l;
        c0[l] = (uint32_t)q;
        c1[l] = (uint32_t)(q >> 32);
        c2[l] = block;
        c3[l] = step;
    }
    for (int r = 0; r < 10; r++) {
        for (int l = 0; l < count; l++) {
            const uint64_t p0 = (uint64_t)QC_PHILOX_M0 * c0[l];
            const uint64_t p1 = (uint64_t)QC_PHILOX_M1 * c2[l];
            const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ key0;
            const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ key1;
            c0[l] = n0;
            c1[l] = (uint32_t)p1;
            c2[l] = n2;
            c3[l] = (uint32_t)p0;
        }
        key0 += QC_PHILOX_W0;
        key1 += QC_PHILOX_W1;
    }
}

/* keep[j] = qc_dropout_keep(d->seed, d->step, d->block, index0 + j, d->p) for j in [0, n),
 * index0 a Philox index. The test u >= p, with u = (word >> 8)·2^-24 exact in fp32, is done on
 * the integer: word >> 8 >= ceil(p·2^24) (p·2^24 is exact in double), the same flag without a
 * conversion per element. */
static inline void cpu_dropout_keep_run(uint8_t *keep, const struct qc_dropout *d, int64_t index0,
                                        int64_t n)
{
    const uint32_t k0 = (uint32_t)d->seed, k1 = (uint32_t)(d->seed >> 32);
    const uint32_t thr = (uint32_t)ceil((double)d->p * 16777216.0); /* p < 1: thr <= 2^24 */
    int64_t j = 0;
    /* whole counters (4 elements each), up to CPU_PHILOX_LANES at a time, from an index aligned
     * to 4; a partial counter at either end alone */
    while (j < n) {
        const uint64_t q = (uint64_t)(index0 + j);
        if ((q & 3u) == 0 && n - j >= 4) {
            const int64_t whole = (n - j) / 4;
            const int count = whole < CPU_PHILOX_LANES ? (int)whole : CPU_PHILOX_LANES;
            uint32_t x[4][CPU_PHILOX_LANES];
            cpu_philox4x32_10_lanes(x, q >> 2, count, d->block, d->step, k0, k1);
            for (int l = 0; l < count; l++)
                for (int w = 0; w < 4; w++)
                    keep[j + 4 * l + w] = (x[w][l] >> 8) >= thr;
            j += 4 * (int64_t)count;
            continue;
        }
        const uint64_t g = q >> 2;
        struct qc_philox_u4 c;
        c.v[0] = (uint32_t)g;
        c.v[1] = (uint32_t)(g >> 32);
        c.v[2] = d->block;
        c.v[3] = d->step;
        const struct qc_philox_u4 x = qc_philox4x32_10(c, k0, k1);
        for (uint64_t w = q & 3u; w < 4 && j < n; w++, j++)
            keep[j] = (x.v[w] >> 8) >= thr;
    }
}

/* keep[j] = qc_dropout_keep(d->seed, d->step, d->block, qc_dropout_index(d, g0 + j), d->p) for j
 * in [0, n); g0 is the site's flat index (d->index_base not added). Scene-keyed: one run of
 * consecutive Philox indices per stretch of rows whose indices continue each other. */
static inline void cpu_dropout_keep_range(uint8_t *keep, const struct qc_dropout *d, int64_t g0,
                                          int64_t n)
{
    if (!d->row_key) {
        cpu_dropout_keep_run(keep, d, g0, n);
        return;
    }
    int64_t i0 = n > 0 ? qc_dropout_index(d, g0) : 0; /* the index of element j */
    for (int64_t j = 0; j < n;) {
        const int64_t c = (g0 + j) % d->row_len;
        int64_t m = d->row_len - c < n - j ? d->row_len - c : n - j, next = 0;
        /* the next rows continue the run while their indices do (consecutive rows of one scene
         * with reps 1): one run of Philox blocks instead of a partial block per row; the index
         * that breaks the run starts the next one */
        while (j + m < n && (next = qc_dropout_index(d, g0 + j + m)) == i0 + m)
            m += d->row_len < n - j - m ? d->row_len : n - j - m;
        cpu_dropout_keep_run(keep + j, d, i0, m);
        j += m;
        i0 = next;
    }
}

#endif /* QC_KERNELS_CPU_CPU_INTERNAL_H */
