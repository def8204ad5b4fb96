/*
 * qc_half.h — the 16-bit formats of mixed precision (train.precision, docs/PRECISION.md): bf16
 * and IEEE fp16, their rounding from fp32 and their widening back. Header-only, so the CPU
 * reference and the CUDA kernels (with __host__ __device__ under nvcc) round the same values to
 * the same bits.
 *
 *   bf16  1 sign, 8 exponent, 7 mantissa bits: the top half of an fp32 word. Same range as fp32
 *         (subnormals included); 8 significant bits.
 *   fp16  1 sign, 5 exponent (bias 15), 10 mantissa bits: normals from 2^-14 to 65504,
 *         subnormals down to 2^-24; 11 significant bits.
 *
 * Rounding (every function here): to nearest, ties to even, on the fp32 value's exact bits
 * (no double rounding). Subnormal inputs and outputs are exact (no flush to zero). Values at or
 * past the largest finite value's half step round to ±Inf (fp16: |x| >= 65520). ±Inf stays ±Inf.
 * A NaN stays a NaN of the same sign, made quiet; its payload keeps its top bits where they fit.
 * Widening (16 -> 32 bits) is exact. So qc_round_<fmt>(x) = widen(narrow(x)) is idempotent, and a
 * value that is already representable round-trips through 16 bits unchanged: what makes a
 * stash stored in 16 bits give the same bits as one kept in fp32 after rounding.
 */
#ifndef QC_KERNELS_QC_HALF_H
#define QC_KERNELS_QC_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "qc_types.h" /* enum qc_precision, qc_precision_str, qc_precision_elem_bytes */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#    define QC_HALF_FN static inline __host__ __device__
#else
#    define QC_HALF_FN static inline
#endif

QC_HALF_FN uint32_t qc_f32_bits(float x)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

QC_HALF_FN float qc_f32_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* fp32 -> bf16 bits, round to nearest even. Adding 0x7FFF plus the kept part's lowest bit
 * carries into the kept half exactly when the dropped half is above the tie, or at the tie
 * with an odd kept half; a carry out of the mantissa bumps the exponent (up to Inf). */
QC_HALF_FN uint16_t qc_bf16_from_f32(float x)
{
    uint32_t u = qc_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: quiet it, keep sign and top payload */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

QC_HALF_FN float qc_f32_from_bf16(uint16_t h)
{
    return qc_f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> fp16 bits, round to nearest even. */
QC_HALF_FN uint16_t qc_f16_from_f32(float x)
{
    const uint32_t u = qc_f32_bits(x);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 (half way from 65504 to 2^16; ties to even = 2^16): Inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* >= 2^-14: a normal fp16; rebias the exponent 127 -> 15 */
        uint32_t m = a - 0x38000000u;
        m += 0x0FFFu + ((m >> 13) & 1u);
        return (uint16_t)(sign | (m >> 13));
    }
    if (a <= 0x33000000u) /* <= 2^-25, half the smallest subnormal (a tie goes to even 0) */
        return (uint16_t)sign;
    /* subnormal result: the value in units of 2^-24 is mant * 2^(e - 126), e in [102, 112] */
    const uint32_t e = a >> 23;
    const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e; /* 14 .. 24 */
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u)))
        r++; /* may reach 0x400: the smallest normal, encoded correctly */
    return (uint16_t)(sign | r);
}

QC_HALF_FN float qc_f32_from_f16(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    int32_t e = (h >> 10) & 0x1F;
    uint32_t m = h & 0x3FFu;
    if (e == 0x1F) /* Inf, NaN */
        return qc_f32_from_bits(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return qc_f32_from_bits(sign);
        e = 1; /* subnormal: normalise */
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        m &= 0x3FFu;
    }
    return qc_f32_from_bits(sign | ((uint32_t)(e + 112) << 23) | (m << 13));
}

/* x rounded to the nearest bf16 / fp16 value, as fp32. */
QC_HALF_FN float qc_round_bf16(float x)
{
    return qc_f32_from_bf16(qc_bf16_from_f32(x));
}

QC_HALF_FN float qc_round_f16(float x)
{
    return qc_f32_from_f16(qc_f16_from_f32(x));
}

/* x rounded to precision p (fp32: x itself). */
QC_HALF_FN float qc_round_prec(float x, int p)
{
    return p == QC_PREC_BF16 ? qc_round_bf16(x) : p == QC_PREC_FP16 ? qc_round_f16(x) : x;
}

/* fp32 -> the 16 bits of precision p (bf16 or fp16), and back. */
QC_HALF_FN uint16_t qc_half_from_f32(float x, int p)
{
    return p == QC_PREC_FP16 ? qc_f16_from_f32(x) : qc_bf16_from_f32(x);
}

QC_HALF_FN float qc_f32_from_half(uint16_t h, int p)
{
    return p == QC_PREC_FP16 ? qc_f32_from_f16(h) : qc_f32_from_bf16(h);
}

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_HALF_H */
