/*
 * activation.c — elementwise activations (ReLU, ELU, sigmoid, tanh), small arithmetic and the
 * attention layer's gated update, per element by the formulas of activation_math.h (shared with
 * the CUDA kernels). Backwards read the forward output (what an in-place PyTorch op saves) and
 * may run in place.
 */
#include "qc_kernels.h"

#include "activation_math.h"
#include "qc_status.h"

#define CHECK_N(n) QC_ASSERT((n) >= 0, "%s: n %lld", __func__, (long long)(n))

void qc_relu_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = qc_relu_fwd(inp[i]);
}

void qc_relu_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = dout[i]; /* loaded unconditionally: the loop vectorizes */
        dinp[i] = qc_relu_bwd(g, out[i]);
    }
}

void qc_elu_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = qc_elu_fwd(inp[i]);
}

void qc_elu_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = dout[i], y = out[i];
        dinp[i] = qc_elu_bwd(g, y);
    }
}

void qc_sigmoid_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = qc_sigmoid_fwd(inp[i]);
}

void qc_sigmoid_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dinp[i] = qc_sigmoid_bwd(dout[i], out[i]);
}

void qc_tanh_forward_cpu(float *out, const float *inp, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = qc_tanh_fwd(inp[i]);
}

void qc_tanh_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dinp[i] = qc_tanh_bwd(dout[i], out[i]);
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
        out[i] = qc_gate_update_fwd(u[i], g[i], s[i]);
}

void qc_gate_update_backward_cpu(float *du, float *dg, float *ds, const float *dout, const float *u,
                                 const float *g, const float *s, int64_t n)
{
    CHECK_N(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        qc_gate_update_backward_at(du, dg, ds, dout, u, g, s, i);
}
