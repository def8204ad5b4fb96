/*
 * geometry.cu — wrap_angle and angle_between_2d_vectors over arrays (QCNET.md §3.0).
 * wrap_angle reuses the header's host/device helper (adds and fmodf only: nothing to contract).
 * angle_between_2d must not fuse c0·n1 − c1·n0 into an FMA (nvcc contracts by default), so the
 * device version spells every operation with an explicitly rounded intrinsic.
 */
#include "cuda_common.cuh"

static __global__ void wrap_angle_kernel(float *out, const float *inp, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        out[i] = qc_wrap_anglef(inp[i]);
}

void qc_wrap_angle_forward_cuda(float *out, const float *inp, int64_t n, cudaStream_t stream)
{
    QC_ASSERT(n >= 0 && (n == 0 || (out && inp)), "wrap_angle cuda: n %lld", (long long)n);
    if (n == 0)
        return;
    wrap_angle_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, n);
    QC_CUDA_LAUNCH_CHECK();
}

/* qc_angle_between_2df without contraction: products rounded, then the subtraction; the dot
 * accumulated from +0. */
__device__ static inline float angle_between_2d_rn(float c0, float c1, float n0, float n1)
{
    float cross = __fsub_rn(__fmul_rn(c0, n1), __fmul_rn(c1, n0));
    float dot = __fadd_rn(0.0f, __fmul_rn(c0, n0));
    dot = __fadd_rn(dot, __fmul_rn(c1, n1));
    return atan2f(cross, dot);
}

static __global__ void angle_between_2d_kernel(float *out, const float *ctr, const float *vec,
                                               int64_t N)
{
    for (int64_t i = cuda_tid(); i < N; i += cuda_nthreads())
        out[i] = angle_between_2d_rn(ctr[2 * i], ctr[2 * i + 1], vec[2 * i], vec[2 * i + 1]);
}

void qc_angle_between_2d_forward_cuda(float *out, const float *ctr, const float *vec, int64_t N,
                                      cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && (N == 0 || (out && ctr && vec)), "angle_between_2d cuda: N %lld",
              (long long)N);
    if (N == 0)
        return;
    angle_between_2d_kernel<<<cuda_blocks(N, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, ctr, vec,
                                                                                   N);
    QC_CUDA_LAUNCH_CHECK();
}
