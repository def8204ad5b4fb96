/*
 * fourier.c — the elementwise part of QCNet's FourierEmbedding (QCNET.md §3.1 steps 1–2):
 * θ = ((c·W)·2)·π_f, φ = [cos θ, sin θ, c]. θ is PyTorch's (the same three fp32 multiplies);
 * cos and sin come from cpu_sincos (cpu/sincos.c: vectorized, correctly rounded but within ~1e-13
 * of a boundary). The backward recomputes cos θ and sin θ the same way (bit-identical to the
 * forward's) when φ is not saved.
 */
#include "qc_kernels.h"

#include <math.h>

#include "cpu_internal.h"
#include "qc_status.h"

#define FOURIER_F_CHUNK 32 /* bands per call of cpu_sincos, and per work item of dfreqs */

static inline float fourier_theta(float c, float w)
{
    return ((c * w) * 2.0f) * QC_PI_F;
}

/* co[f − f0], si[f − f0] = cos θ, sin θ of bands [f0, f1) of input ci (f1 − f0 ≤ FOURIER_F_CHUNK),
 * w = the input's frequency row. Elementwise: the bits do not depend on how bands are cut. */
static inline void fourier_sincos(float *co, float *si, float ci, const float *w, int64_t f0,
                                  int64_t f1)
{
    float th[FOURIER_F_CHUNK];
    for (int64_t f = f0; f < f1; f++)
        th[f - f0] = fourier_theta(ci, w[f]);
    cpu_sincos(co, si, th, f1 - f0);
}

void qc_fourier_features_forward_cpu(float *phi, const float *c, const float *freqs, int64_t N,
                                     int64_t D, int64_t F)
{
    QC_ASSERT(N >= 0 && D > 0 && F > 0, "fourier fwd: N %lld D %lld F %lld", (long long)N,
              (long long)D, (long long)F);
    int64_t W = 2 * F + 1;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t i = 0; i < D; i++) {
            float ci = c[n * D + i];
            float *p = phi + (n * D + i) * W;
            for (int64_t f0 = 0; f0 < F; f0 += FOURIER_F_CHUNK) {
                int64_t f1 = f0 + FOURIER_F_CHUNK < F ? f0 + FOURIER_F_CHUNK : F;
                fourier_sincos(p + f0, p + F + f0, ci, freqs + i * F, f0, f1);
            }
            p[2 * F] = ci;
        }
    }
}

/* dθ of (n,i,f): d cos = −sin, d sin = cos. co, si: cos θ, sin θ of band f, from the saved φ
 * row when given, else recomputed by fourier_sincos (the same bits: the forward stored these). */
static inline float fourier_dtheta(const float *dp, int64_t F, int64_t f, float co, float si)
{
    return dp[F + f] * co - dp[f] * si;
}

/* cos θ, sin θ of bands [f0, f1) of row p (saved φ) or recomputed into co_buf / si_buf. */
static inline void fourier_row_sincos(const float **co, const float **si, float *co_buf,
                                      float *si_buf, const float *p, int64_t F, float ci,
                                      const float *w, int64_t f0, int64_t f1)
{
    if (p) {
        *co = p + f0;
        *si = p + F + f0;
    } else {
        fourier_sincos(co_buf, si_buf, ci, w, f0, f1);
        *co = co_buf;
        *si = si_buf;
    }
}

static void fourier_backward(float *dc, float *dfreqs, const float *dphi, const float *phi,
                             const float *c, const float *freqs, int64_t N, int64_t D, int64_t F)
{
    QC_ASSERT(N >= 0 && D > 0 && F > 0, "fourier bwd: N %lld D %lld F %lld", (long long)N,
              (long long)D, (long long)F);
    int64_t W = 2 * F + 1;
    /* θ = ((c·w)·2)·π: dθ/dc = w·2·π, dθ/dw = c·2·π (PyTorch's chain: (dθ·π)·2 then ·w). */
    if (dc) {
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            for (int64_t i = 0; i < D; i++) {
                float ci = c[n * D + i];
                const float *dp = dphi + (n * D + i) * W;
                const float *p = phi ? phi + (n * D + i) * W : NULL;
                double acc = 0.0;
                for (int64_t f0 = 0; f0 < F; f0 += FOURIER_F_CHUNK) {
                    int64_t f1 = f0 + FOURIER_F_CHUNK < F ? f0 + FOURIER_F_CHUNK : F;
                    float cb[FOURIER_F_CHUNK], sb[FOURIER_F_CHUNK];
                    const float *co, *si;
                    fourier_row_sincos(&co, &si, cb, sb, p, F, ci, freqs + i * F, f0, f1);
                    for (int64_t f = f0; f < f1; f++) {
                        float w = freqs[i * F + f];
                        float g =
                            (fourier_dtheta(dp, F, f, co[f - f0], si[f - f0]) * QC_PI_F) * 2.0f;
                        acc += (double)(g * w);
                    }
                }
                dc[n * D + i] = dp[2 * F] + (float)acc;
            }
        }
    }
    if (dfreqs) {
        /* one work item per (input i, chunk of FOURIER_F_CHUNK bands); each walks the rows once
         * with a double accumulator per band, rows in ascending order (the order of every sum:
         * deterministic for any thread count) */
        int64_t fchunks = (F + FOURIER_F_CHUNK - 1) / FOURIER_F_CHUNK;
#pragma omp parallel for schedule(static)
        for (int64_t item = 0; item < D * fchunks; item++) {
            int64_t i = item / fchunks;
            int64_t f0 = (item % fchunks) * FOURIER_F_CHUNK;
            int64_t f1 = f0 + FOURIER_F_CHUNK < F ? f0 + FOURIER_F_CHUNK : F;
            double acc[FOURIER_F_CHUNK] = {0};
            for (int64_t n = 0; n < N; n++) {
                float ci = c[n * D + i];
                const float *dp = dphi + (n * D + i) * W;
                const float *p = phi ? phi + (n * D + i) * W : NULL;
                float cb[FOURIER_F_CHUNK], sb[FOURIER_F_CHUNK];
                const float *co, *si;
                fourier_row_sincos(&co, &si, cb, sb, p, F, ci, freqs + i * F, f0, f1);
                for (int64_t f = f0; f < f1; f++) {
                    float g = (fourier_dtheta(dp, F, f, co[f - f0], si[f - f0]) * QC_PI_F) * 2.0f;
                    acc[f - f0] += (double)(g * ci);
                }
            }
            for (int64_t f = f0; f < f1; f++)
                dfreqs[i * F + f] += (float)acc[f - f0];
        }
    }
}

void qc_fourier_features_backward_cpu(float *dc, float *dfreqs, const float *dphi, const float *c,
                                      const float *freqs, int64_t N, int64_t D, int64_t F)
{
    fourier_backward(dc, dfreqs, dphi, NULL, c, freqs, N, D, F);
}

void qc_fourier_features_backward_saved_cpu(float *dc, float *dfreqs, const float *dphi,
                                            const float *phi, const float *c, const float *freqs,
                                            int64_t N, int64_t D, int64_t F)
{
    QC_ASSERT(N == 0 || phi, "fourier bwd (saved): NULL phi");
    fourier_backward(dc, dfreqs, dphi, phi, c, freqs, N, D, F);
}
