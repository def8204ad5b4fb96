/*
 * qc_rand.h — splitmix64, the one small seeded generator shared by the modules that need
 * reproducible host-side random numbers (loader shuffles, synthetic-scene seeding, benchmark
 * size samplers). Same seed, same sequence on every machine. Not for device-side draws: those
 * use Philox (kernels/qc_philox.h), keyed by seed, step, block and element.
 */
#ifndef QC_BASE_QC_RAND_H
#define QC_BASE_QC_RAND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Advances *state by the golden-ratio increment and returns its 64-bit mix (Steele, Lea and
 * Flood, "Fast splittable pseudorandom number generators", 2014). */
static inline uint64_t qc_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_RAND_H */
