/*
 * geometry.c — wrap_angle and angle_between_2d_vectors over arrays (QCNET.md §3.0). The scalar
 * definitions (exact fp32 operation order) are the inline helpers in qc_kernels.h, shared with
 * the loader and, under nvcc, with CUDA kernels.
 */
#include "qc_kernels.h"

#include "qc_status.h"

void qc_wrap_angle_forward_cpu(float *out, const float *inp, int64_t n)
{
    QC_ASSERT(n >= 0 && (n == 0 || (out && inp)), "wrap_angle: n %lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = qc_wrap_anglef(inp[i]);
}

void qc_angle_between_2d_forward_cpu(float *out, const float *ctr, const float *vec, int64_t N)
{
    QC_ASSERT(N >= 0 && (N == 0 || (out && ctr && vec)), "angle_between_2d: N %lld", (long long)N);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++)
        out[i] = qc_angle_between_2df(ctr[2 * i], ctr[2 * i + 1], vec[2 * i], vec[2 * i + 1]);
}
