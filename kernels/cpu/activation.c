/*
 * activation.c — elementwise activations (ReLU, ELU, sigmoid, tanh), small arithmetic and the
 * attention layer's gated update. Backwards read the forward output (what an in-place PyTorch
 * op saves) and may run in place.
 */
#include "qc_kernels.h"

#include <math.h>

#include "qc_status.h"

#define CHECK_N(n) QC_ASSERT((n) >= 0, "%s: n %lld", __func__, (long long)(n))

void qc_relu_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void qc_relu_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = dout[i]; /* loaded unconditionally: the loop vectorizes */
        dinp[i] = out[i] > 0.0f ? g : 0.0f;
    }
}

void qc_elu_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : expm1f(inp[i]);
}

void qc_elu_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = dout[i], y = out[i];
        dinp[i] = y > 0.0f ? g : g * (y + 1.0f);
    }
}

void qc_sigmoid_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = 1.0f / (1.0f + expf(-inp[i]));
}

void qc_sigmoid_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dinp[i] = dout[i] * out[i] * (1.0f - out[i]);
}

void qc_tanh_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = tanhf(inp[i]);
}

void qc_tanh_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dinp[i] = dout[i] * (1.0f - out[i] * out[i]);
}

void qc_add_forward_cpu(float *out, const float *a, const float *b, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void qc_add_scalar_forward_cpu(float *out, const float *inp, float s, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = inp[i] + s;
}

void qc_gate_update_forward_cpu(float *out, const float *u, const float *g, const float *s,
                                int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = u[i] + g[i] * (s[i] - u[i]);
}

void qc_gate_update_backward_cpu(float *du, float *dg, float *ds, const float *dout, const float *u,
                                 const float *g, const float *s, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
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
}
