/*
 * half.c — the mixed-precision array ops (qc_kernels.h): round, pack to 16 bits, unpack.
 * Elementwise over qc_half.h's scalar functions, so every backend rounds to the same bits.
 */
#include <stdint.h>

#include "qc_half.h"
#include "qc_kernels.h"
#include "qc_status.h"

void qc_round_forward_cpu(float *out, const float *inp, int64_t n, int prec)
{
    QC_ASSERT(n >= 0 && (n == 0 || (out && inp)) && prec >= 0 && prec < QC_PREC_COUNT,
              "round: n %lld prec %d", (long long)n, prec);
    if (prec == QC_PREC_FP32) {
        for (int64_t i = 0; i < n && out != inp; i++)
            out[i] = inp[i];
        return;
    }
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++)
        out[i] = qc_round_prec(inp[i], prec);
}

void qc_pack16_cpu(uint16_t *dst, const float *src, int64_t n, int prec)
{
    QC_ASSERT(n >= 0 && (n == 0 || (dst && src)) && (prec == QC_PREC_BF16 || prec == QC_PREC_FP16),
              "pack16: n %lld prec %d", (long long)n, prec);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++)
        dst[i] = qc_half_from_f32(src[i], prec);
}

void qc_unpack16_cpu(float *dst, const uint16_t *src, int64_t n, int prec)
{
    QC_ASSERT(n >= 0 && (n == 0 || (dst && src)) && (prec == QC_PREC_BF16 || prec == QC_PREC_FP16),
              "unpack16: n %lld prec %d", (long long)n, prec);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++)
        dst[i] = qc_f32_from_half(src[i], prec);
}

void qc_scale_inplace_cpu(float *x, float s, int64_t n)
{
    QC_ASSERT(n >= 0 && (n == 0 || x), "scale: n %lld", (long long)n);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}
