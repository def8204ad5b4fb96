/*
 * activation.cu — elementwise activations (ReLU, ELU, sigmoid, tanh), add, add_scalar and the
 * gated update, per element by activation_math.h, the formulas the CPU ops run (that header
 * says where the two backends' bits agree). Grid-stride, in place allowed wherever the CPU op
 * allows it (each element is read before it is written by the same thread).
 */
#include "activation_math.h"
#include "cuda_common.cuh"

#define CHECK_N(n, op) QC_ASSERT((n) >= 0, "%s cuda: n %lld", op, (long long)(n))

/* One elementwise kernel per formula: out[i] = F(inputs at i). */
#define UNARY_KERNEL(name, expr)                                                                   \
    static __global__ void name(float *out, const float *inp, int64_t n)                           \
    {                                                                                              \
        for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads()) {                                \
            float x = inp[i];                                                                      \
            out[i] = (expr);                                                                       \
        }                                                                                          \
    }
/* dinp[i] = F(dout[i] as d, out[i] as y) */
#define BACKWARD_KERNEL(name, expr)                                                                \
    static __global__ void name(float *dinp, const float *dout, const float *outp, int64_t n)      \
    {                                                                                              \
        for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads()) {                                \
            float d = dout[i], y = outp[i];                                                        \
            dinp[i] = (expr);                                                                      \
        }                                                                                          \
    }

UNARY_KERNEL(relu_forward_kernel, qc_relu_fwd(x))
BACKWARD_KERNEL(relu_backward_kernel, qc_relu_bwd(d, y))
UNARY_KERNEL(elu_forward_kernel, qc_elu_fwd(x))
BACKWARD_KERNEL(elu_backward_kernel, qc_elu_bwd(d, y))
UNARY_KERNEL(sigmoid_forward_kernel, qc_sigmoid_fwd(x))
BACKWARD_KERNEL(sigmoid_backward_kernel, qc_sigmoid_bwd(d, y))
UNARY_KERNEL(tanh_forward_kernel, qc_tanh_fwd(x))
BACKWARD_KERNEL(tanh_backward_kernel, qc_tanh_bwd(d, y))

#define UNARY_LAUNCHER(fn, kernel, op)                                                             \
    void fn(float *out, const float *inp, int64_t n, cudaStream_t stream)                          \
    {                                                                                              \
        CHECK_N(n, op);                                                                            \
        if (n == 0)                                                                                \
            return;                                                                                \
        kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, n);                \
        QC_CUDA_LAUNCH_CHECK();                                                                    \
    }
#define BACKWARD_LAUNCHER(fn, kernel, op)                                                          \
    void fn(float *dinp, const float *dout, const float *out, int64_t n, cudaStream_t stream)      \
    {                                                                                              \
        CHECK_N(n, op);                                                                            \
        if (n == 0)                                                                                \
            return;                                                                                \
        kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(dinp, dout, out, n);         \
        QC_CUDA_LAUNCH_CHECK();                                                                    \
    }

UNARY_LAUNCHER(qc_relu_forward_cuda, relu_forward_kernel, "relu fwd")
BACKWARD_LAUNCHER(qc_relu_backward_cuda, relu_backward_kernel, "relu bwd")
UNARY_LAUNCHER(qc_elu_forward_cuda, elu_forward_kernel, "elu fwd")
BACKWARD_LAUNCHER(qc_elu_backward_cuda, elu_backward_kernel, "elu bwd")
UNARY_LAUNCHER(qc_sigmoid_forward_cuda, sigmoid_forward_kernel, "sigmoid fwd")
BACKWARD_LAUNCHER(qc_sigmoid_backward_cuda, sigmoid_backward_kernel, "sigmoid bwd")
UNARY_LAUNCHER(qc_tanh_forward_cuda, tanh_forward_kernel, "tanh fwd")
BACKWARD_LAUNCHER(qc_tanh_backward_cuda, tanh_backward_kernel, "tanh bwd")

// ---- add, add_scalar, gated update
// ---------------------------------------------------------------

static __global__ void add_kernel(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        out[i] = a[i] + b[i];
}

void qc_add_forward_cuda(float *out, const float *a, const float *b, int64_t n, cudaStream_t stream)
{
    CHECK_N(n, "add fwd");
    if (n == 0)
        return;
    add_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, a, b, n);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void add_scalar_kernel(float *out, const float *inp, float s, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        out[i] = inp[i] + s;
}

void qc_add_scalar_forward_cuda(float *out, const float *inp, float s, int64_t n,
                                cudaStream_t stream)
{
    CHECK_N(n, "add_scalar fwd");
    if (n == 0)
        return;
    add_scalar_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, s, n);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void gate_update_forward_kernel(float *out, const float *u, const float *g,
                                                  const float *s, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        out[i] = qc_gate_update_fwd(u[i], g[i], s[i]);
}

void qc_gate_update_forward_cuda(float *out, const float *u, const float *g, const float *s,
                                 int64_t n, cudaStream_t stream)
{
    CHECK_N(n, "gate_update fwd");
    if (n == 0)
        return;
    gate_update_forward_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, u, g, s,
                                                                                      n);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void gate_update_backward_kernel(float *du, float *dg, float *ds,
                                                   const float *dout, const float *u,
                                                   const float *g, const float *s, int64_t n)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        qc_gate_update_backward_at(du, dg, ds, dout, u, g, s, i);
}

void qc_gate_update_backward_cuda(float *du, float *dg, float *ds, const float *dout,
                                  const float *u, const float *g, const float *s, int64_t n,
                                  cudaStream_t stream)
{
    CHECK_N(n, "gate_update bwd");
    if (n == 0 || (!du && !dg && !ds))
        return;
    gate_update_backward_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        du, dg, ds, dout, u, g, s, n);
    QC_CUDA_LAUNCH_CHECK();
}
