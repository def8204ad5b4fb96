/*
 * test_half.c — the 16-bit formats of kernels/qc_half.h against a reference written another way
 * (double arithmetic: the value's quantum from frexp, rint in the default round-to-nearest-even
 * mode, overflow decided on the rounded value), and the array ops built on them (round, pack,
 * unpack).
 *
 * Coverage by class: every sign and fp32 exponent (denormals, Inf and NaN included) crossed with
 * mantissas that put the dropped bits of every shift the formats use (bf16: 16; fp16: 13 for
 * normals, 14..24 for subnormal results) at 0, 1, just below the tie, the tie, just above it and
 * all ones, with the kept lowest bit even and odd; plus a strided sweep of all 2^32 patterns
 * (stride 4099, ~1 M patterns; QC_TEST_HALF_FULL=1 sweeps all 2^32, about a minute) and every
 * 16-bit pattern widened and narrowed again. Results must match bit for bit (signed zeros too);
 * NaNs must stay NaNs of the same sign, quiet.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_half.h"
#include "qc_kernels.h"
#include "testutil.h"

/* The reference: x rounded to a float format with p significant bits, smallest normal exponent
 * emin and largest finite value maxf, in double (exact: every step is a power-of-2 scaling or
 * an integer rounding). */
static float ref_round(float x, int p, int emin, double maxf)
{
    if (isnan(x) || isinf(x) || x == 0.0f)
        return x;
    const double a = fabs((double)x);
    int e;
    (void)frexp(a, &e); /* a = f 2^e, f in [0.5, 1): leading bit at 2^(e-1) */
    const int lead = e - 1 < emin ? emin : e - 1;
    const double q = ldexp(1.0, lead - (p - 1));
    const double r = rint(a / q) * q;
    const double v = r > maxf ? (double)INFINITY : r;
    return (float)copysign(v, (double)x);
}

static float ref_bf16(float x)
{
    return ref_round(x, 8, -126, ldexp(2.0 - ldexp(1.0, -7), 127));
}

static float ref_f16(float x)
{
    return ref_round(x, 11, -14, 65504.0);
}

static int64_t n_checked, n_bad;

/* One pattern through both formats. */
static void check_bits(uint32_t u)
{
    const float x = qc_f32_from_bits(u);
    const float got[2] = {qc_round_bf16(x), qc_round_f16(x)};
    const float want[2] = {ref_bf16(x), ref_f16(x)};
    static const char *const fmt[2] = {"bf16", "fp16"};
    n_checked++;
    for (int f = 0; f < 2; f++) {
        bool ok;
        if (isnan(x)) {
            const uint16_t h = f == 0 ? qc_bf16_from_f32(x) : qc_f16_from_f32(x);
            const bool quiet = f == 0 ? (h & 0x0040u) != 0 : (h & 0x0200u) != 0;
            ok = isnan(got[f]) && quiet && !signbit(got[f]) == !signbit(x);
        } else {
            ok = qc_f32_bits(got[f]) == qc_f32_bits(want[f]);
        }
        if (!ok && n_bad++ < 10)
            T_EXPECT(false, "%s(0x%08x = %.9g) = %.9g (0x%08x), reference %.9g (0x%08x)", fmt[f], u,
                     (double)x, (double)got[f], qc_f32_bits(got[f]), (double)want[f],
                     qc_f32_bits(want[f]));
        else if (!ok)
            T_EXPECT(false, "more mismatches");
    }
}

int main(void)
{
    QC_TEST ("half: every sign x exponent x dropped-bit class, both formats") {
        n_checked = n_bad = 0;
        for (uint32_t se = 0; se < 512; se++) {
            const uint32_t hi = se << 23;
            for (uint32_t shift = 13; shift <= 24; shift++) {
                const uint32_t half = 1u << (shift - 1), all = (1u << shift) - 1u;
                const uint32_t dropped[] = {0, 1, half - 1, half, half + 1, all};
                for (uint32_t lsb = 0; lsb < 2; lsb++)
                    for (size_t d = 0; d < sizeof dropped / sizeof *dropped; d++) {
                        /* the kept part: its lowest bit lsb, a few higher bits set */
                        const uint32_t m =
                            ((0x2A5u << (shift + 1)) | (lsb << shift) | dropped[d]) & 0x7FFFFFu;
                        check_bits(hi | m);
                    }
            }
            for (uint32_t k = 0; k < 4096; k++) /* plus scattered mantissas */
                check_bits(hi | ((k * 2654435761u) & 0x7FFFFFu));
        }
        T_EXPECT(n_bad == 0, "%lld of %lld patterns differ", (long long)n_bad,
                 (long long)n_checked);
    }

    QC_TEST ("half: strided sweep of all 2^32 fp32 patterns (QC_TEST_HALF_FULL=1: every one)") {
        n_checked = n_bad = 0;
        const char *full = getenv("QC_TEST_HALF_FULL");
        const uint64_t stride = full && *full == '1' ? 1 : 4099;
        for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += stride)
            check_bits((uint32_t)u);
        T_EXPECT(n_bad == 0, "%lld of %lld patterns differ", (long long)n_bad,
                 (long long)n_checked);
    }

    QC_TEST ("half: specials: RNE ties, overflow to Inf, subnormals, signed zeros") {
        T_EXPECT(qc_bf16_from_f32(1.0f) == 0x3F80, "bf16(1)");
        T_EXPECT(qc_f16_from_f32(1.0f) == 0x3C00, "f16(1)");
        /* 1 + 2^-8: the bf16 tie between 1 and 1 + 2^-7, kept bit even: down */
        T_EXPECT(qc_round_bf16(1.0f + 0x1p-8f) == 1.0f, "bf16 tie down");
        T_EXPECT(qc_round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f, "bf16 tie up (odd)");
        T_EXPECT(qc_round_f16(1.0f + 0x1p-11f) == 1.0f, "f16 tie down");
        T_EXPECT(qc_round_f16(65504.0f) == 65504.0f, "f16 max");
        T_EXPECT(qc_round_f16(65519.99f) == 65504.0f, "f16 below the Inf tie");
        T_EXPECT(isinf(qc_round_f16(65520.0f)), "f16 Inf at the tie");
        T_EXPECT(isinf(qc_round_bf16(3.4028235e38f)), "bf16 FLT_MAX -> Inf");
        T_EXPECT(qc_round_f16(0x1p-24f) == 0x1p-24f, "f16 smallest subnormal");
        T_EXPECT(qc_round_f16(0x1p-25f) == 0.0f, "f16 2^-25 ties to 0");
        T_EXPECT(qc_round_f16(0x1.8p-25f) == 0x1p-24f, "f16 1.5*2^-25 up");
        T_EXPECT(qc_f16_from_f32(-0.0f) == 0x8000 && qc_bf16_from_f32(-0.0f) == 0x8000, "-0");
        T_EXPECT(qc_round_bf16(0x1p-133f) == 0x1p-133f && qc_round_bf16(0x1p-149f) == 0.0f,
                 "bf16 subnormals: 2^-133 kept, 2^-149 rounds to 0");
        T_EXPECT(qc_f16_from_f32(-INFINITY) == 0xFC00 && qc_bf16_from_f32(INFINITY) == 0x7F80,
                 "Inf");
        T_EXPECT(isnan(qc_round_f16(NAN)) && isnan(qc_round_bf16(-NAN)) &&
                     signbit(qc_round_bf16(-NAN)),
                 "NaN");
        /* a signalling NaN whose payload sits below the kept bits must not become Inf */
        T_EXPECT(isnan(qc_round_bf16(qc_f32_from_bits(0x7F800001u))), "bf16 sNaN stays NaN");
        T_EXPECT(isnan(qc_round_f16(qc_f32_from_bits(0x7F800001u))), "f16 sNaN stays NaN");
    }

    QC_TEST ("half: every 16-bit pattern widens exactly and narrows back to itself") {
        int bad = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            const float b = qc_f32_from_bf16((uint16_t)h), f = qc_f32_from_f16((uint16_t)h);
            /* fp16 reference value: sign, exponent, mantissa by ldexp */
            const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
            double ref = e == 0    ? ldexp((double)m, -24)
                         : e == 31 ? (m ? (double)NAN : (double)INFINITY)
                                   : ldexp((double)(m | 0x400), (int)e - 25);
            if (h & 0x8000)
                ref = -ref;
            const bool fok =
                isnan(ref) ? isnan(f) : (double)f == ref && !signbit(f) == !signbit(ref);
            const bool bok = qc_f32_bits(b) == h << 16;
            const bool back =
                (isnan(b) || qc_bf16_from_f32(b) == h) && (isnan(f) || qc_f16_from_f32(f) == h);
            if (!(fok && bok && back) && bad++ < 10)
                T_EXPECT(false, "pattern 0x%04x: f16 %.9g (ref %.9g) bf16 %.9g", h, (double)f, ref,
                         (double)b);
        }
        T_EXPECT(bad == 0, "%d patterns", bad);
    }

    QC_TEST ("half: round, pack and unpack over arrays (the ops of every backend)") {
        enum { N = 1031 };
        float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *z = malloc(N * sizeof *z);
        uint16_t *h = malloc(N * sizeof *h);
        uint64_t s = 12345;
        for (int i = 0; i < N; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = ldexpf((float)(int32_t)(s >> 32) / 2147483648.0f, (int)(s % 40) - 20);
        }
        x[0] = NAN;
        x[1] = INFINITY;
        x[2] = 1e6f; /* fp16 overflow */
        for (int p = QC_PREC_BF16; p <= QC_PREC_FP16; p++) {
            qc_round_forward_cpu(y, x, N, p);
            qc_pack16_cpu(h, x, N, p);
            qc_unpack16_cpu(z, h, N, p);
            int bad = 0;
            for (int i = 0; i < N; i++) {
                const float want = qc_round_prec(x[i], p);
                if (!(isnan(want) ? isnan(y[i]) && isnan(z[i])
                                  : qc_f32_bits(y[i]) == qc_f32_bits(want) &&
                                        qc_f32_bits(z[i]) == qc_f32_bits(want)))
                    bad++;
            }
            T_EXPECT(bad == 0, "%s: %d elements", qc_precision_str(p), bad);
            /* in place and idempotent: rounding rounded values changes nothing */
            memcpy(z, y, N * sizeof *z);
            qc_round_forward_cpu(z, z, N, p);
            T_EXPECT(memcmp(z, y, N * sizeof *z) == 0, "%s: idempotent", qc_precision_str(p));
        }
        qc_round_forward_cpu(y, x, N, QC_PREC_FP32);
        T_EXPECT(memcmp(y + 1, x + 1, (N - 1) * sizeof *y) == 0, "fp32 copies");
        free(x);
        free(y);
        free(z);
        free(h);
    }
    return qc_test_summary();
}
