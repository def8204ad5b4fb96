/*
 * half.cu — the mixed-precision array ops on CUDA: round, pack to 16 bits, unpack. The scalar
 * functions are qc_half.h's (host and device), so the bits equal the CPU op's exactly.
 */
#include "cuda_common.cuh"
#include "qc_half.h"

static __global__ void round_forward_kernel(float *out, const float *inp, int64_t n, int prec)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        out[i] = qc_round_prec(inp[i], prec);
}

static __global__ void pack16_kernel(uint16_t *dst, const float *src, int64_t n, int prec)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        dst[i] = qc_half_from_f32(src[i], prec);
}

static __global__ void unpack16_kernel(float *dst, const uint16_t *src, int64_t n, int prec)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        dst[i] = qc_f32_from_half(src[i], prec);
}

void qc_round_forward_cuda(float *out, const float *inp, int64_t n, int prec, cudaStream_t stream)
{
    QC_ASSERT(n >= 0 && (n == 0 || (out && inp)) && prec >= 0 && prec < QC_PREC_COUNT,
              "round cuda: n %lld prec %d", (long long)n, prec);
    if (n == 0 || (prec == QC_PREC_FP32 && out == inp))
        return;
    round_forward_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, n, prec);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_pack16_cuda(uint16_t *dst, const float *src, int64_t n, int prec, cudaStream_t stream)
{
    QC_ASSERT(n >= 0 && (n == 0 || (dst && src)) && (prec == QC_PREC_BF16 || prec == QC_PREC_FP16),
              "pack16 cuda: n %lld prec %d", (long long)n, prec);
    if (n == 0)
        return;
    pack16_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(dst, src, n, prec);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_unpack16_cuda(float *dst, const uint16_t *src, int64_t n, int prec, cudaStream_t stream)
{
    QC_ASSERT(n >= 0 && (n == 0 || (dst && src)) && (prec == QC_PREC_BF16 || prec == QC_PREC_FP16),
              "unpack16 cuda: n %lld prec %d", (long long)n, prec);
    if (n == 0)
        return;
    unpack16_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(dst, src, n, prec);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void scale_inplace_kernel(float *x, float s, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        x[i] = __fmul_rn(x[i], s);
}

void qc_scale_inplace_cuda(float *x, float s, int64_t n, cudaStream_t stream)
{
    QC_ASSERT(n >= 0 && (n == 0 || x), "scale cuda: n %lld", (long long)n);
    if (n == 0)
        return;
    scale_inplace_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(x, s, n);
    QC_CUDA_LAUNCH_CHECK();
}
