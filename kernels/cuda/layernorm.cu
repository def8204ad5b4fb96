/*
 * layernorm.cu — LayerNorm over the last dim with the CPU op's interface and formulas
 * (kernels/cpu/layernorm.c: biased variance, eps QC_LAYERNORM_EPS, mean and rstd saved for
 * backward), not its summation order: one warp per row; the two-pass row statistics, and the
 * backward's two row sums (Σ dx̂, Σ dx̂·x̂), are summed in double across the warp's lanes and
 * rounded to fp32 once, where the CPU sums them in fp32 lanes. So mean, rstd and the outputs
 * through them agree with the CPU to fp32 rounding, not bit for bit. The parameter gradients are
 * deterministic column reductions in double (colsum), as the CPU's are.
 */
#include "cuda_common.cuh"

#define LN_WARPS 8 /* rows (warps) per block */

static __global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *weight,
                                                const float *bias, int64_t N, int64_t C)
{
    int lane = threadIdx.x & 31;
    int64_t row0 = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    int64_t stride = (int64_t)gridDim.x * LN_WARPS;
    for (int64_t n = row0; n < N; n += stride) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        double s = 0.0;
        for (int64_t c = lane; c < C; c += 32)
            s += (double)x[c];
        double mu = warp_sum_double(s) / (double)C;
        double v = 0.0;
        for (int64_t c = lane; c < C; c += 32) {
            double d = (double)x[c] - mu;
            v += d * d;
        }
        v = warp_sum_double(v) / (double)C;
        float m = (float)mu;
        float r = (float)(1.0 / sqrt(v + (double)QC_LAYERNORM_EPS));
        /* in place (out == inp) is safe: each lane reads x[c] before writing y[c], same c */
        for (int64_t c = lane; c < C; c += 32)
            y[c] = (x[c] - m) * r * weight[c] + bias[c];
        if (lane == 0) {
            if (mean)
                mean[n] = m;
            if (rstd)
                rstd[n] = r;
        }
    }
}

void qc_layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int64_t N, int64_t C,
                               cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && C > 0, "layernorm fwd cuda: N %lld C %lld", (long long)N, (long long)C);
    QC_ASSERT(N == 0 || (out && inp && weight && bias), "layernorm fwd cuda: NULL tensor");
    if (N == 0)
        return;
    layernorm_forward_kernel<<<cuda_blocks(N, LN_WARPS), LN_WARPS * 32, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void layernorm_backward_kernel(float *dinp, const float *dout, const float *inp,
                                                 const float *mean, const float *rstd,
                                                 const float *weight, int64_t N, int64_t C,
                                                 bool accum)
{
    int lane = threadIdx.x & 31;
    int64_t row0 = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    int64_t stride = (int64_t)gridDim.x * LN_WARPS;
    for (int64_t n = row0; n < N; n += stride) {
        const float *x = inp + n * C;
        const float *dy = dout + n * C;
        float *dx = dinp + n * C;
        float m = mean[n], r = rstd[n];
        double sd = 0.0, sdn = 0.0;
        for (int64_t c = lane; c < C; c += 32) {
            float xh = (x[c] - m) * r;
            float dxh = dy[c] * weight[c];
            sd += (double)dxh;
            sdn += (double)dxh * (double)xh;
        }
        float mdxh = (float)(warp_sum_double(sd) / (double)C);
        float mdxhxh = (float)(warp_sum_double(sdn) / (double)C);
        for (int64_t c = lane; c < C; c += 32) {
            float xh = (x[c] - m) * r;
            float dxh = dy[c] * weight[c];
            float g = (dxh - mdxh - xh * mdxhxh) * r;
            dx[c] = accum ? dx[c] + g : g;
        }
    }
}

/* colsum functor: (dy·x̂, dy) */
struct ln_param_fn {
    const float *dout, *inp, *mean, *rstd;
    int64_t C;
    __device__ void operator()(int64_t n, int64_t c, double *v) const
    {
        float dy = dout[n * C + c];
        float xh = (inp[n * C + c] - mean[n]) * rstd[n];
        v[0] = (double)(dy * xh);
        v[1] = (double)dy;
    }
};

void qc_layernorm_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *mean, const float *rstd,
                                const float *weight, int64_t N, int64_t C, bool accum,
                                cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && C > 0, "layernorm bwd cuda: N %lld C %lld", (long long)N, (long long)C);
    if (N == 0)
        return;
    QC_ASSERT(dout && inp && mean && rstd, "layernorm bwd cuda: NULL saved tensor");
    if (dinp) {
        QC_ASSERT(weight, "layernorm bwd cuda: dinp needs weight");
        layernorm_backward_kernel<<<cuda_blocks(N, LN_WARPS), LN_WARPS * 32, 0, stream>>>(
            dinp, dout, inp, mean, rstd, weight, N, C, accum);
        QC_CUDA_LAUNCH_CHECK();
    }
    if (dweight || dbias) {
        struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "layernorm bwd cuda");
        struct ln_param_fn f = {dout, inp, mean, rstd, C};
        colsum_launch<2>(ctx, dweight, dbias, N, C, f, stream);
    }
}
