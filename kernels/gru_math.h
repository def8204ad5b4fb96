/*
 * gru_math.h — one element of the GRU's gates (PyTorch nn.GRU: gate order r, z, n; b_hn inside
 * r ⊙ (·); h' = (h − n)·z + n as PyTorch's CPU gru_cell) and of their backward, written once for
 * both backends: kernels/cpu/gru.c loops them over OpenMP rows, kernels/cuda/gru.cu over a
 * grid-stride kernel. C11 for the CPU, __host__ __device__ under nvcc (QC_KERNELS_HD). Private
 * to kernels/.
 *
 * Element (n, c) of a step reads row n of xg = x·W_ihᵀ + b_ih and hg = h·W_hhᵀ + b_hh (3C each:
 * r | z | n parts) and writes row n of the saved gates [r | z | n | hn] (4C). Plain operators:
 * on the device nvcc contracts the products that feed an add ((h − n)·z + n, r·hn + x_n, ...)
 * into FMAs and tanhf / expf are CUDA's, so the CUDA gates agree with the CPU's within
 * test_kernels_cuda's tolerance, not bit for bit.
 */
#ifndef QC_KERNELS_GRU_MATH_H
#define QC_KERNELS_GRU_MATH_H

#include <math.h>
#include <stdint.h>

#include "activation_math.h" /* qc_sigmoid_fwd */
#include "qc_kernels.h"      /* QC_KERNELS_HD */

#ifdef __cplusplus
extern "C" {
#endif

/* *hout = h' of element c from its input state hp, xr / hr the rows of xg / hg; then the gates
 * of element c into the row g (4C) unless g is NULL. */
QC_KERNELS_HD void qc_gru_gate_forward(float *hout, float *g, const float *xr, const float *hr,
                                       float hp, int64_t c, int64_t C)
{
    float r = qc_sigmoid_fwd(xr[c] + hr[c]);
    float z = qc_sigmoid_fwd(xr[C + c] + hr[C + c]);
    float hn = hr[2 * C + c];
    float nn = tanhf(xr[2 * C + c] + r * hn);
    *hout = (hp - nn) * z + nn;
    if (g) {
        g[c] = r;
        g[C + c] = z;
        g[2 * C + c] = nn;
        g[3 * C + c] = hn;
    }
}

/* The backward of element c from d = dL/dh' and the input state hp: writes element c of the
 * rows xo = dxg and ho = dhg (3C each) from the saved gates row g; returns d·z, the gradient of
 * h through the direct path. */
QC_KERNELS_HD float qc_gru_gate_backward(float *xo, float *ho, const float *g, float d, float hp,
                                         int64_t c, int64_t C)
{
    float r = g[c], z = g[C + c], nn = g[2 * C + c], hn = g[3 * C + c];
    float dz = d * (hp - nn);
    float dn = d * (1.0f - z);
    float dpn = dn * (1.0f - nn * nn);
    float dr = dpn * hn;
    float dpr = dr * r * (1.0f - r);
    float dpz = dz * z * (1.0f - z);
    xo[c] = dpr;
    xo[C + c] = dpz;
    xo[2 * C + c] = dpn;
    ho[c] = dpr;
    ho[C + c] = dpz;
    ho[2 * C + c] = dpn * r;
    return d * z;
}

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_GRU_MATH_H */
