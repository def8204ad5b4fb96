/*
 * activation_math.h — the per-element formulas of the activations (ReLU, ELU, sigmoid, tanh)
 * and of the attention layer's gated update u + g⊙(s − u), written once for both backends:
 * kernels/cpu/activation.c and kernels/cuda/activation.cu (and the GRU's gates, gru_math.h) call
 * these. C11 for the CPU, __host__ __device__ under nvcc (QC_KERNELS_HD). Private to kernels/.
 *
 * Backwards take the forward OUTPUT y (what an in-place PyTorch op saves) and the output
 * gradient d. The CPU and CUDA results:
 * - ReLU, ELU, sigmoid, tanh backward: the same bits (tanh writes y·y with qc_fmul_rn, so nvcc
 *   cannot fuse 1 − y·y into one FMA; the others have no product feeding an add).
 * - sigmoid, ELU, tanh forward: expf / expm1f / tanhf are CUDA's on the device (within 2 ulp of
 *   glibc's).
 * - gated update: plain operators, so nvcc contracts u + g·(s − u) and d − d·g into FMAs on the
 *   device (a last-bit difference from the CPU, within test_kernels_cuda's tolerance).
 */
#ifndef QC_KERNELS_ACTIVATION_MATH_H
#define QC_KERNELS_ACTIVATION_MATH_H

#include <math.h>
#include <stdint.h>

#include "qc_kernels.h" /* QC_KERNELS_HD, qc_fmul_rn */

#ifdef __cplusplus
extern "C" {
#endif

QC_KERNELS_HD float qc_relu_fwd(float x)
{
    return x > 0.0f ? x : 0.0f;
}

QC_KERNELS_HD float qc_relu_bwd(float d, float y)
{
    return y > 0.0f ? d : 0.0f;
}

QC_KERNELS_HD float qc_elu_fwd(float x)
{
    return x > 0.0f ? x : expm1f(x);
}

QC_KERNELS_HD float qc_elu_bwd(float d, float y)
{
    return y > 0.0f ? d : d * (y + 1.0f);
}

QC_KERNELS_HD float qc_sigmoid_fwd(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

QC_KERNELS_HD float qc_sigmoid_bwd(float d, float y)
{
    return d * y * (1.0f - y);
}

QC_KERNELS_HD float qc_tanh_fwd(float x)
{
    return tanhf(x);
}

QC_KERNELS_HD float qc_tanh_bwd(float d, float y)
{
    return d * (1.0f - qc_fmul_rn(y, y));
}

/* out = u + g⊙(s − u) */
QC_KERNELS_HD float qc_gate_update_fwd(float u, float g, float s)
{
    return u + g * (s - u);
}

/* Element i of the backward from dout: du = d − d·g, dg = d·(s − u), ds = d·g, each OVERWRITE
 * unless its pointer is NULL. */
QC_KERNELS_HD void qc_gate_update_backward_at(float *du, float *dg, float *ds, const float *dout,
                                              const float *u, const float *g, const float *s,
                                              int64_t i)
{
    float d = dout[i], gi = g[i];
    float dsi = d * gi;
    float dgi = d * (s[i] - u[i]);
    if (du)
        du[i] = d - dsi;
    if (dg)
        dg[i] = dgi;
    if (ds)
        ds[i] = dsi;
}

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_ACTIVATION_MATH_H */
