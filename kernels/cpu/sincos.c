/*
 * sincos.c — cos θ and sin θ of an fp32 array, vectorized (the Fourier features' hot loop;
 * issue 29). In a standalone loop over arguments of up to a few thousand radians glibc's
 * sincosf took ~17 ns per pair and this loop ~4.7 ns; in the AV2 step, whose arguments are
 * mostly small (glibc's fast path), fourier_features_forward went from 380-395 to 325-355 ms
 * per step (docs/BENCHMARKS.md, "Dropout and Fourier features vectorized").
 *
 * Method, all in double on the fp32 input x (exact in double):
 *   k = x·(2/π) rounded to nearest (the 1.5·2^52 shift: k sits in the low bits of the shifted
 *       value, read as an integer for the quadrant, so no float-to-int conversion is needed),
 *   r = (x − k·P1) − k·P2 with P1 = π/2 to 33 bits and P2 = π/2 − P1: k·P1 is exact for
 *       |k| < 2^20, so r has a relative error near 2^-53 while |x| ≤ SINCOS_MAX,
 *   sin r, cos r by their Taylor series to r^13 and r^14 on |r| ≤ π/4 (truncation below 3e-14),
 *   the quadrant k mod 4 swaps and negates them with bit masks.
 * The double result is rounded once to fp32: every output is the correctly rounded value of the
 * exact cos / sin of the fp32 input, except where the exact value lies within ~1e-13 relative
 * of a rounding boundary (tests/test_kernels_cpu.c, "sincos": at most 0.5 ulp + 1e-5 over a
 * sweep; glibc's sincosf is up to 0.56 ulp). The loop has no branch, so it vectorizes with
 * the baseline x86-64 SSE2; inputs beyond SINCOS_MAX, infinities and NaNs are then redone
 * by libm's double sin / cos in a second pass (NaN in, NaN out, as sinf).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

#define SINCOS_MAX       1.0e6f /* |x| beyond: the second pass (k·P1 exact needs |k| < 2^20) */
#define SINCOS_SIN_TERMS 6      /* sin r = r + r³·Σ_j S_j r^2j (to r^13) */
#define SINCOS_COS_TERMS 7      /* cos r = 1 + r²·Σ_j C_j r^2j (to r^14) */

/* Taylor coefficients: S_j = (−1)^(j+1) / (2j+3)!, C_j = (−1)^(j+1) / (2j+2)! */
static const double sincos_sin_c[SINCOS_SIN_TERMS] = {
    -1.0 / 6.0, 1.0 / 120.0, -1.0 / 5040.0, 1.0 / 362880.0, -1.0 / 39916800.0, 1.0 / 6227020800.0,
};
static const double sincos_cos_c[SINCOS_COS_TERMS] = {
    -1.0 / 2.0,       1.0 / 24.0,        -1.0 / 720.0,         1.0 / 40320.0,
    -1.0 / 3628800.0, 1.0 / 479001600.0, -1.0 / 87178291200.0,
};

static inline uint64_t sincos_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static inline double sincos_double(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

void cpu_sincos(float *restrict co, float *restrict si, const float *restrict th, int64_t n)
{
    const double two_over_pi = 0.63661977236758134308;
    const double shift = 0x1.8p52;
    const double p1 = 1.57079632673412561417e+00; /* π/2, first 33 bits */
    const double p2 = 6.07710050650619224932e-11; /* π/2 − p1 */
    for (int64_t i = 0; i < n; i++) {
        const double x = (double)th[i];
        const double ks = x * two_over_pi + shift;
        const double k = ks - shift;
        const uint64_t q = sincos_bits(ks); /* low bits: k mod 2^m, two's complement */
        const double r = (x - k * p1) - k * p2;
        const double r2 = r * r;
        double ps = sincos_sin_c[SINCOS_SIN_TERMS - 1], pc = sincos_cos_c[SINCOS_COS_TERMS - 1];
        for (int j = SINCOS_SIN_TERMS - 2; j >= 0; j--) /* Horner; the compiler unrolls both */
            ps = ps * r2 + sincos_sin_c[j];
        for (int j = SINCOS_COS_TERMS - 2; j >= 0; j--)
            pc = pc * r2 + sincos_cos_c[j];
        const double s = r + (r * r2) * ps;
        const double c = 1.0 + r2 * pc;
        /* θ = r + k·π/2: odd k swaps cos and sin; cos is negated for k ≡ 1, 2, sin for k ≡ 2, 3
         * (mod 4): the sign bit flipped by XOR */
        const uint64_t odd = (uint64_t)0 - (q & 1u);
        const uint64_t cb = (sincos_bits(s) & odd) | (sincos_bits(c) & ~odd);
        const uint64_t sb = (sincos_bits(c) & odd) | (sincos_bits(s) & ~odd);
        co[i] = (float)sincos_double(cb ^ (((q + 1u) & 2u) << 62));
        si[i] = (float)sincos_double(sb ^ ((q & 2u) << 62));
    }
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(th[i]) <= SINCOS_MAX)) {
            co[i] = (float)cos((double)th[i]);
            si[i] = (float)sin((double)th[i]);
        }
}
