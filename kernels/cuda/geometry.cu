/*
 * geometry.cu — wrap_angle and angle_between_2d_vectors over arrays (QCNET.md §3.0), each element
 * by the CPU's own host/device helper in qc_kernels.h (qc_wrap_anglef: adds and fmodf, nothing
 * to contract; qc_angle_between_2df: every product explicitly rounded, so nvcc cannot fuse
 * c0·n1 − c1·n0 into an FMA). The bits are the CPU's up to atan2f and fmodf.
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

static __global__ void angle_between_2d_kernel(float *out, const float *ctr, const float *vec,
                                               int64_t N)
{
    for (int64_t i = cuda_tid(); i < N; i += cuda_nthreads())
        out[i] = qc_angle_between_2df(ctr[2 * i], ctr[2 * i + 1], vec[2 * i], vec[2 * i + 1]);
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
