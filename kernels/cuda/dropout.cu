/*
 * dropout.cu — dropout drawn from Philox-4x32-10 with qc_philox.h's mapping (qc_dropout_index for
 * a scene-keyed site, whose row keys are device memory), the same header-only code the CPU runs, so
 * CPU and CUDA masks are identical bit for bit. Nothing is saved; the backward redraws the mask (it
 * is the forward's map applied to dout).
 */
#include "cuda_common.cuh"

static __global__ void dropout_kernel(float *out, const float *inp, int64_t n, struct qc_dropout d,
                                      float scale)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        out[i] =
            qc_dropout_keep(d.seed, d.step, d.block, qc_dropout_index(&d, d.index_base + i), d.p)
                ? inp[i] * scale
                : 0.0f;
}

void qc_dropout_forward_cuda(float *out, const float *inp, int64_t n, const struct qc_dropout *d,
                             cudaStream_t stream)
{
    QC_ASSERT(n >= 0 && d && qc_dropout_valid(d), "dropout fwd cuda: n %lld", (long long)n);
    if (n == 0)
        return;
    if (d->p == 0.0f) {
        if (out != inp)
            QC_CUDA_ASSERT(cudaMemcpyAsync(out, inp, (size_t)n * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream));
        return;
    }
    float scale = 1.0f / (1.0f - d->p);
    dropout_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, n, *d, scale);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_dropout_backward_cuda(float *dinp, const float *dout, int64_t n, const struct qc_dropout *d,
                              cudaStream_t stream)
{
    /* y = x·mask·scale, so dx = dy·mask·scale: the forward's map */
    qc_dropout_forward_cuda(dinp, dout, n, d, stream);
}
