/*
 * layout.c — cumsum, strided 2-D copies (concat / split), repeat_interleave, tile and the
 * (D0,D1,C) <-> (D1,D0,C) transpose. Reductions in the backwards sum in ascending repeat order.
 */
#include "qc_kernels.h"

#include <string.h>

#include "qc_status.h"

void qc_cumsum_forward_cpu(float *out, const float *inp, int64_t outer, int64_t L, int64_t inner)
{
    QC_ASSERT(outer >= 0 && L >= 0 && inner >= 0, "cumsum fwd: bad dims");
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            double acc = 0.0;
            for (int64_t l = 0; l < L; l++) {
                int64_t k = (o * L + l) * inner + i;
                acc += (double)inp[k];
                out[k] = (float)acc;
            }
        }
    }
}

void qc_cumsum_backward_cpu(float *dinp, const float *dout, int64_t outer, int64_t L, int64_t inner)
{
    QC_ASSERT(outer >= 0 && L >= 0 && inner >= 0, "cumsum bwd: bad dims");
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            double acc = 0.0;
            for (int64_t l = L - 1; l >= 0; l--) {
                int64_t k = (o * L + l) * inner + i;
                acc += (double)dout[k];
                dinp[k] = (float)acc;
            }
        }
    }
}

void qc_copy2d_cpu(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                   int64_t cols, bool accum)
{
    QC_ASSERT(rows >= 0 && cols >= 0 && ld_dst >= cols && ld_src >= cols,
              "copy2d: rows %lld cols %lld ld %lld/%lld", (long long)rows, (long long)cols,
              (long long)ld_dst, (long long)ld_src);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * ld_dst;
        const float *s = src + r * ld_src;
        if (accum) {
            for (int64_t c = 0; c < cols; c++)
                d[c] += s[c];
        } else {
            memcpy(d, s, (size_t)cols * sizeof(float));
        }
    }
}

void qc_repeat_interleave_forward_cpu(float *out, const float *inp, int64_t N, int64_t R, int64_t C)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "repeat_interleave fwd: bad dims");
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < R; r++)
            memcpy(out + (n * R + r) * C, inp + n * C, (size_t)C * sizeof(float));
}

void qc_repeat_interleave_backward_cpu(float *dinp, const float *dout, int64_t N, int64_t R,
                                       int64_t C, bool accum)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "repeat_interleave bwd: bad dims");
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int64_t r = 0; r < R; r++)
                acc += dout[(n * R + r) * C + c];
            dinp[n * C + c] = accum ? dinp[n * C + c] + acc : acc;
        }
    }
}

void qc_tile_forward_cpu(float *out, const float *inp, int64_t N, int64_t R, int64_t C)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "tile fwd: bad dims");
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++)
        if (N > 0)
            memcpy(out + r * N * C, inp, (size_t)(N * C) * sizeof(float));
}

void qc_tile_backward_cpu(float *dinp, const float *dout, int64_t N, int64_t R, int64_t C,
                          bool accum)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "tile bwd: bad dims");
    int64_t total = N * C;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < total; k++) {
        float acc = 0.0f;
        for (int64_t r = 0; r < R; r++)
            acc += dout[r * total + k];
        dinp[k] = accum ? dinp[k] + acc : acc;
    }
}

void qc_transpose01_forward_cpu(float *out, const float *inp, int64_t D0, int64_t D1, int64_t C)
{
    QC_ASSERT(D0 >= 0 && D1 >= 0 && C >= 0 && (out != inp || D0 * D1 * C == 0),
              "transpose01: bad dims or aliasing");
#pragma omp parallel for schedule(static)
    for (int64_t a = 0; a < D0; a++)
        for (int64_t b = 0; b < D1; b++)
            memcpy(out + (b * D0 + a) * C, inp + (a * D1 + b) * C, (size_t)C * sizeof(float));
}

void qc_transpose01_backward_cpu(float *dinp, const float *dout, int64_t D0, int64_t D1, int64_t C)
{
    qc_transpose01_forward_cpu(dinp, dout, D1, D0, C);
}
