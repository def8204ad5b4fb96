/*
 * fourier.cu — the elementwise part of the Fourier embedding (kernels/cpu/fourier.c): θ =
 * ((c·W)·2)·π_f (three fp32 multiplies, nothing to contract), φ = [cos θ, sin θ, c]. The
 * backward recomputes θ; dc sums the F frequencies in ascending order in double (one thread
 * per (n, i)), dfreqs is a deterministic column reduction over n (colsum).
 */
#include "cuda_common.cuh"

__device__ static inline float fourier_theta(float c, float w)
{
    return ((c * w) * 2.0f) * QC_PI_F;
}

/* d(loss)/dθ·π·2 for element f of row p (dp = dphi of that (n, i)): the CPU's chain. */
__device__ static inline float fourier_g(const float *dp, int64_t F, int64_t f, float th)
{
    float s, c;
    sincosf(th, &s, &c);
    float dth = dp[F + f] * c - dp[f] * s;
    return (dth * QC_PI_F) * 2.0f;
}

static __global__ void fourier_forward_kernel(float *phi, const float *c, const float *freqs,
                                              int64_t N, int64_t D, int64_t F)
{
    int64_t W = 2 * F + 1, total = N * D * F;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t f = t % F, ni = t / F, i = ni % D; /* ni = n*D + i */
        float ci = c[ni];
        float s, co;
        sincosf(fourier_theta(ci, freqs[i * F + f]), &s, &co);
        float *p = phi + ni * W;
        p[f] = co;
        p[F + f] = s;
        if (f == 0)
            p[2 * F] = ci;
    }
}

void qc_fourier_features_forward_cuda(float *phi, const float *c, const float *freqs, int64_t N,
                                      int64_t D, int64_t F, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && D > 0 && F > 0, "fourier fwd cuda: N %lld D %lld F %lld", (long long)N,
              (long long)D, (long long)F);
    if (N == 0)
        return;
    fourier_forward_kernel<<<cuda_blocks(N * D * F, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        phi, c, freqs, N, D, F);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void fourier_dc_kernel(float *dc, const float *dphi, const float *c,
                                         const float *freqs, int64_t N, int64_t D, int64_t F)
{
    int64_t W = 2 * F + 1, total = N * D;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t i = t % D;
        float ci = c[t];
        const float *dp = dphi + t * W;
        double acc = 0.0;
        for (int64_t f = 0; f < F; f++) {
            float w = freqs[i * F + f];
            float g = fourier_g(dp, F, f, fourier_theta(ci, w));
            acc += (double)(g * w);
        }
        dc[t] = dp[2 * F] + (float)acc;
    }
}

/* colsum functor over rows n, columns (i, f): g·c[n, i] */
struct dfreqs_fn {
    const float *dphi, *c, *freqs;
    int64_t D, F;
    __device__ void operator()(int64_t n, int64_t col, double *v) const
    {
        int64_t i = col / F, f = col % F;
        float ci = c[n * D + i];
        const float *dp = dphi + (n * D + i) * (2 * F + 1);
        float g = fourier_g(dp, F, f, fourier_theta(ci, freqs[col]));
        v[0] = (double)(g * ci);
    }
};

void qc_fourier_features_backward_cuda(float *dc, float *dfreqs, const float *dphi, const float *c,
                                       const float *freqs, int64_t N, int64_t D, int64_t F,
                                       cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && D > 0 && F > 0, "fourier bwd cuda: N %lld D %lld F %lld", (long long)N,
              (long long)D, (long long)F);
    if (N == 0)
        return;
    if (dc) {
        fourier_dc_kernel<<<cuda_blocks(N * D, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
            dc, dphi, c, freqs, N, D, F);
        QC_CUDA_LAUNCH_CHECK();
    }
    if (dfreqs) {
        struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "fourier bwd cuda");
        struct dfreqs_fn f = {dphi, c, freqs, D, F};
        colsum_launch<1>(ctx, dfreqs, NULL, N, D * F, f, stream);
    }
}
