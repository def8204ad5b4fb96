/*
 * layernorm.c — LayerNorm over the last dim (QCNET.md §3.0): biased variance, eps 1e-5.
 * Row statistics are two-pass (mean, then the mean square of x − mean), each summed in fp32 in
 * LN_LANES lanes: column c goes to lane c mod LN_LANES, each lane adds its columns in ascending
 * order, and the lanes are added pairwise in a fixed tree. The order is fixed by the code, not
 * by the compiler or the thread count, and the lanes are independent sums, so the compiler adds
 * them with packed instructions. mean and rstd are what the forward saves and the backward
 * reads, so store and recompute agree bit for bit. The backward's two row sums are taken the
 * same way. Parameter-gradient column sums loop rows in ascending order in double
 * (deterministic; they run over up to ~10^5 rows).
 *
 * Speed: most calls are the fused attention's tiles (512 rows × 128, one thread each, in
 * cache), where the fp32 lanes run packed (docs/BENCHMARKS.md, "The step after the idle
 * profile", has the measurement). No OpenMP team below CPU_PAR_MIN elements (cpu_internal.h).
 */
#include "qc_kernels.h"

#include <math.h>

#include "cpu_internal.h"
#include "qc_status.h"

#define LN_COL_CHUNK 16
#define LN_LANES     8

/* Σ a[c] over c < C in LN_LANES lanes (file comment). */
static inline float ln_lanes_total(const float *acc)
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* mean and rstd of one row */
static void ln_stats_row(float *m, float *r, const float *x, int64_t C)
{
    const int64_t Cv = C - C % LN_LANES;
    float s[LN_LANES] = {0};
    for (int64_t c0 = 0; c0 < Cv; c0 += LN_LANES)
        for (int j = 0; j < LN_LANES; j++)
            s[j] += x[c0 + j];
    for (int64_t c = Cv; c < C; c++)
        s[c - Cv] += x[c];
    const float mu = ln_lanes_total(s) / (float)C;
    float v[LN_LANES] = {0};
    for (int64_t c0 = 0; c0 < Cv; c0 += LN_LANES)
        for (int j = 0; j < LN_LANES; j++) {
            const float d = x[c0 + j] - mu;
            v[j] += d * d;
        }
    for (int64_t c = Cv; c < C; c++) {
        const float d = x[c] - mu;
        v[c - Cv] += d * d;
    }
    *m = mu;
    *r = 1.0f / sqrtf(ln_lanes_total(v) / (float)C + QC_LAYERNORM_EPS);
}

void qc_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int64_t N, int64_t C)
{
    QC_ASSERT(N >= 0 && C > 0, "layernorm fwd: N %lld C %lld", (long long)N, (long long)C);
    QC_ASSERT(N == 0 || (out && inp && weight && bias), "layernorm fwd: NULL tensor");
#pragma omp parallel for schedule(static) if (N * C >= CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        float m, r;
        ln_stats_row(&m, &r, x, C);
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
#pragma omp parallel for schedule(static) if (N * C >= CPU_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C;
            const float *dy = dout + n * C;
            float *dx = dinp + n * C;
            const float m = mean[n], r = rstd[n];
            /* Σ dx̂ and Σ dx̂·x̂ of the row, in lanes as the forward's statistics */
            const int64_t Cv = C - C % LN_LANES;
            float sd[LN_LANES] = {0}, sdn[LN_LANES] = {0};
            for (int64_t c0 = 0; c0 < Cv; c0 += LN_LANES) /* two loops: each vectorizes */
                for (int j = 0; j < LN_LANES; j++)
                    sd[j] += dy[c0 + j] * weight[c0 + j];
            for (int64_t c0 = 0; c0 < Cv; c0 += LN_LANES)
                for (int j = 0; j < LN_LANES; j++)
                    sdn[j] += (dy[c0 + j] * weight[c0 + j]) * ((x[c0 + j] - m) * r);
            for (int64_t c = Cv; c < C; c++) {
                const float xh = (x[c] - m) * r;
                const float dxh = dy[c] * weight[c];
                sd[c - Cv] += dxh;
                sdn[c - Cv] += dxh * xh;
            }
            const float mdxh = ln_lanes_total(sd) / (float)C;
            const float mdxhxh = ln_lanes_total(sdn) / (float)C;
            if (accum)
                for (int64_t c = 0; c < C; c++)
                    dx[c] += (dy[c] * weight[c] - mdxh - ((x[c] - m) * r) * mdxhxh) * r;
            else
                for (int64_t c = 0; c < C; c++)
                    dx[c] = (dy[c] * weight[c] - mdxh - ((x[c] - m) * r) * mdxhxh) * r;
        }
    }
    if (dweight || dbias) {
        int64_t nchunk = (C + LN_COL_CHUNK - 1) / LN_COL_CHUNK;
#pragma omp parallel for schedule(static) if (N * C >= CPU_PAR_MIN)
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
