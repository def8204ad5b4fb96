/*
 * layernorm.c — LayerNorm over the last dim (QCNET.md §3.0): biased variance, eps 1e-5.
 * Row statistics are computed two-pass in double and rounded to fp32 once (mean, rstd are what
 * the forward saves and the backward reads, so store and recompute agree bit for bit).
 * Parameter-gradient column sums loop rows in ascending order (deterministic).
 */
#include "qc_kernels.h"

#include <math.h>

#include "qc_status.h"

#define LN_COL_CHUNK 16

void qc_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int64_t N, int64_t C)
{
    QC_ASSERT(N >= 0 && C > 0, "layernorm fwd: N %lld C %lld", (long long)N, (long long)C);
    QC_ASSERT(N == 0 || (out && inp && weight && bias), "layernorm fwd: NULL tensor");
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        double s = 0.0;
        for (int64_t c = 0; c < C; c++)
            s += (double)x[c];
        double mu = s / (double)C;
        double v = 0.0;
        for (int64_t c = 0; c < C; c++) {
            double d = (double)x[c] - mu;
            v += d * d;
        }
        v /= (double)C;
        float m = (float)mu;
        float r = (float)(1.0 / sqrt(v + (double)QC_LAYERNORM_EPS));
        for (int64_t c = 0; c < C; c++)
            y[c] = (x[c] - m) * r * weight[c] + bias[c];
        if (mean)
            mean[n] = m;
        if (rstd)
            rstd[n] = r;
    }
}

void qc_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *mean, const float *rstd,
                               const float *weight, int64_t N, int64_t C, bool accum)
{
    QC_ASSERT(N >= 0 && C > 0, "layernorm bwd: N %lld C %lld", (long long)N, (long long)C);
    if (N == 0)
        return;
    QC_ASSERT(dout && inp && mean && rstd, "layernorm bwd: NULL saved tensor");
    if (dinp) {
        QC_ASSERT(weight, "layernorm bwd: dinp needs weight");
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C;
            const float *dy = dout + n * C;
            float *dx = dinp + n * C;
            float m = mean[n], r = rstd[n];
            double sd = 0.0, sdn = 0.0;
            for (int64_t c = 0; c < C; c++) {
                float xh = (x[c] - m) * r;
                float dxh = dy[c] * weight[c];
                sd += (double)dxh;
                sdn += (double)dxh * (double)xh;
            }
            float mdxh = (float)(sd / (double)C);
            float mdxhxh = (float)(sdn / (double)C);
            for (int64_t c = 0; c < C; c++) {
                float xh = (x[c] - m) * r;
                float dxh = dy[c] * weight[c];
                float g = (dxh - mdxh - xh * mdxhxh) * r;
                dx[c] = accum ? dx[c] + g : g;
            }
        }
    }
    if (dweight || dbias) {
        int64_t nchunk = (C + LN_COL_CHUNK - 1) / LN_COL_CHUNK;
#pragma omp parallel for schedule(static)
        for (int64_t ch = 0; ch < nchunk; ch++) {
            int64_t c0 = ch * LN_COL_CHUNK;
            int64_t c1 = c0 + LN_COL_CHUNK < C ? c0 + LN_COL_CHUNK : C;
            double aw[LN_COL_CHUNK] = {0}, ab[LN_COL_CHUNK] = {0};
            for (int64_t n = 0; n < N; n++) {
                const float *x = inp + n * C;
                const float *dy = dout + n * C;
                float m = mean[n], r = rstd[n];
                for (int64_t c = c0; c < c1; c++) {
                    float xh = (x[c] - m) * r;
                    aw[c - c0] += (double)(dy[c] * xh);
                    ab[c - c0] += (double)dy[c];
                }
            }
            for (int64_t c = c0; c < c1; c++) {
                if (dweight)
                    dweight[c] += (float)aw[c - c0];
                if (dbias)
                    dbias[c] += (float)ab[c - c0];
            }
        }
    }
}
