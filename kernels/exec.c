/*
 * exec.c — the op dispatch of qc_exec.h: one wrapper per op of qc_kernels.h, and the memory
 * moves. The wrappers are mechanical (generated once from qc_kernels.h's prototypes, then kept
 * by hand like any source): CUDA calls the _cuda launcher with x->stream, EMU opens the
 * emulated device around the _cpu op, CPU calls the _cpu op, DRY does nothing.
 */
#include "qc_exec.h"

#include <stdlib.h>
#include <string.h>

#include "exec_internal.h"
#include "qc_emu.h"
#include "qc_half.h"
#include "qc_kernels.h"
#include "qc_prof.h"
#include "qc_status.h"

#ifdef QC_HAVE_CUDA
#    include <cuda_runtime.h>

#    include "qc_cuda_check.h"
#    define EXEC_STREAM(x) ((cudaStream_t)(x)->stream)
#endif

const char *qc_exec_backend_str(enum qc_exec_backend b)
{
    switch (b) {
    case QC_EXEC_CPU:
        return "cpu";
    case QC_EXEC_CUDA:
        return "cuda";
    case QC_EXEC_EMU:
        return "emu";
    case QC_EXEC_DRY:
        return "dry";
    default:
        return "?";
    }
}

bool qc_exec_backend_built(enum qc_exec_backend b)
{
#ifdef QC_HAVE_CUDA
    return b >= QC_EXEC_CPU && b < QC_EXEC_BACKEND_COUNT;
#else
    return b == QC_EXEC_CPU || b == QC_EXEC_EMU || b == QC_EXEC_DRY;
#endif
}

void kernels_exec_enter(const struct qc_exec *x)
{
    if (x && x->backend == QC_EXEC_EMU) {
        QC_ASSERT(x->emu, "exec: EMU backend without an arena");
        qc_emu_enter(x->emu);
    }
}

void kernels_exec_leave(const struct qc_exec *x)
{
    if (x && x->backend == QC_EXEC_EMU)
        qc_emu_leave(x->emu);
}

/* CUDA requested in a build without it: programmer error (the trainer refuses it earlier). */
static void exec_no_cuda(const char *op)
{
    QC_ASSERT(false, "exec: %s on the CUDA backend in a build without CUDA", op);
}

void kernels_prof_begin(struct qc_prof_mark *m, const struct qc_exec *x)
{
#ifdef QC_HAVE_CUDA
    if (x && x->backend == QC_EXEC_CUDA) {
        qc_prof_op_begin_stream(m, x->stream);
        return;
    }
#endif
    (void)x;
    qc_prof_op_begin(m);
}

void kernels_prof_end(const struct qc_prof_mark *m, const struct qc_exec *x,
                      const struct qc_prof_op *op)
{
#ifdef QC_HAVE_CUDA
    if (x && x->backend == QC_EXEC_CUDA) {
        qc_prof_op_end_stream(m, op);
        return;
    }
#endif
    (void)x;
    qc_prof_op_end(m, op);
}

/* One op's description for the profiler: name, dim names, 4 dims, bytes moved, FLOPs (0 = not
 * defined). Evaluated only while profiling. */
#define EXEC_P(name, dims, d0, d1, d2, d3, bytes, flops)                                           \
    ((struct qc_prof_op){                                                                          \
        (name), (dims), {(d0), (d1), (d2), (d3)}, (double)(bytes), (double)(flops)})

/* cpu_call runs on CPU (and EMU, with the arena open); cuda_call on CUDA; DRY runs nothing. */
#ifdef QC_HAVE_CUDA
#    define EXEC_RUN(x, cpu_call, cuda_call)                                                       \
        do {                                                                                       \
            if ((x) && (x)->backend == QC_EXEC_DRY) {                                              \
            } else if ((x) && (x)->backend == QC_EXEC_CUDA) {                                      \
                cuda_call;                                                                         \
            } else {                                                                               \
                kernels_exec_enter(x);                                                             \
                cpu_call;                                                                          \
                kernels_exec_leave(x);                                                             \
            }                                                                                      \
        } while (0)
#else
#    define EXEC_RUN(x, cpu_call, cuda_call)                                                       \
        do {                                                                                       \
            if ((x) && (x)->backend == QC_EXEC_DRY) {                                              \
            } else if ((x) && (x)->backend == QC_EXEC_CUDA) {                                      \
                exec_no_cuda(#cpu_call);                                                           \
            } else {                                                                               \
                kernels_exec_enter(x);                                                             \
                cpu_call;                                                                          \
                kernels_exec_leave(x);                                                             \
            }                                                                                      \
        } while (0)
#endif
/* With profiling off this is one branch on a global and EXEC_RUN. */
#define QC_EXEC_OP_SPLIT(x, prof, cpu_call, cuda_call)                                             \
    do {                                                                                           \
        if (qc_prof_on()) {                                                                        \
            struct qc_prof_mark m_;                                                                \
            kernels_prof_begin(&m_, x);                                                            \
            EXEC_RUN(x, cpu_call, cuda_call);                                                      \
            const struct qc_prof_op po_ = prof;                                                    \
            kernels_prof_end(&m_, x, &po_);                                                        \
        } else {                                                                                   \
            EXEC_RUN(x, cpu_call, cuda_call);                                                      \
        }                                                                                          \
    } while (0)
#define QC_EXEC_OP(x, op, prof, ...)                                                               \
    QC_EXEC_OP_SPLIT(x, prof, op##_cpu(__VA_ARGS__), op##_cuda(__VA_ARGS__, EXEC_STREAM(x)))

// ---- mixed precision (docs/PRECISION.md) --------------------------------------------------
/* The single place where the ops of a 16-bit run round: an op's activation output is rounded
 * to the exec's precision after the op (on every backend, by the round op), and the GEMM ops
 * (linear, the GRUs) read their weights and activation inputs rounded (on CPU and EMU through
 * rounded host copies; the values CUDA's 16-bit GEMM inputs hold). LayerNorm statistics, the
 * softmax max and sum, the GRU's gates, the losses and the geometry stay fp32. */

static bool exec_lowp(const struct qc_exec *x)
{
    return x && x->precision != 0 && x->backend != QC_EXEC_DRY;
}

/* p[0 .. n) rounded in place to x's precision (a no-op in fp32). */
static void exec_round(const struct qc_exec *x, float *p, int64_t n)
{
    if (exec_lowp(x) && p && n > 0)
        qc_op_round(x, p, p, n, x->precision);
}

/* A malloc'ed (rows, cols) contiguous copy of src (leading dimension ld) rounded to prec; NULL
 * src gives NULL. Host code: runs inside an op (EMU arena open). Aborts when out of host memory
 * (a few hundred KiB at most for QCNet's weights and tiles; an op cannot fail). */
static float *exec_rounded_copy(const float *src, int64_t rows, int64_t cols, int64_t ld, int prec)
{
    if (!src)
        return NULL;
    float *d = malloc((size_t)(rows * cols > 0 ? rows * cols : 1) * sizeof *d);
    QC_ASSERT(d, "exec: %lld x %lld rounded copy: out of host memory", (long long)rows,
              (long long)cols);
    for (int64_t r = 0; r < rows; r++)
        qc_round_forward_cpu(d + r * cols, src + r * ld, cols, prec);
    return d;
}

// ---- memory moves -------------------------------------------------------------------------

void qc_op_zero(const struct qc_exec *x, void *dst, size_t bytes)
{
    if (bytes == 0)
        return;
    QC_EXEC_OP_SPLIT(x, EXEC_P("zero", "bytes", (int64_t)bytes, 0, 0, 0, bytes, 0),
                     memset(dst, 0, bytes),
                     QC_CUDA_ASSERT(cudaMemsetAsync(dst, 0, bytes, EXEC_STREAM(x))));
}

void qc_op_copy(const struct qc_exec *x, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0 || dst == src)
        return;
    QC_EXEC_OP_SPLIT(
        x, EXEC_P("copy", "bytes", (int64_t)bytes, 0, 0, 0, 2.0 * (double)bytes, 0),
        memcpy(dst, src, bytes),
        QC_CUDA_ASSERT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, EXEC_STREAM(x))));
}

static enum qc_status exec_upload(const struct qc_exec *x, void *dst, const void *src, size_t bytes)
{
    if (x && x->backend == QC_EXEC_DRY)
        return QC_OK;
#ifdef QC_HAVE_CUDA
    if (x && x->backend == QC_EXEC_CUDA) /* staged through the context's pinned ring */
        return qc_upload_cuda(dst, src, bytes, EXEC_STREAM(x));
#endif
    if (x && x->backend == QC_EXEC_CUDA)
        exec_no_cuda("upload");
    kernels_exec_enter(x);
    memcpy(dst, src, bytes);
    kernels_exec_leave(x);
    return QC_OK;
}

enum qc_status qc_op_upload(const struct qc_exec *x, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return QC_OK;
    if (!qc_prof_on())
        return exec_upload(x, dst, src, bytes);
    struct qc_prof_mark m;
    kernels_prof_begin(&m, x);
    const enum qc_status st = exec_upload(x, dst, src, bytes);
    const struct qc_prof_op po = EXEC_P("upload", "bytes", (int64_t)bytes, 0, 0, 0, bytes, 0);
    kernels_prof_end(&m, x, &po);
    return st;
}

static enum qc_status exec_download(const struct qc_exec *x, void *dst, const void *src,
                                    size_t bytes)
{
    if (x && x->backend == QC_EXEC_DRY) {
        if (bytes > 0)
            memset(dst, 0, bytes);
        return QC_OK;
    }
#ifdef QC_HAVE_CUDA
    if (x && x->backend == QC_EXEC_CUDA) {
        if (bytes > 0)
            QC_TRY(
                QC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, EXEC_STREAM(x))));
        return QC_CUDA(cudaStreamSynchronize(EXEC_STREAM(x)));
    }
#endif
    if (x && x->backend == QC_EXEC_CUDA)
        exec_no_cuda("download");
    if (bytes == 0)
        return QC_OK;
    kernels_exec_enter(x);
    memcpy(dst, src, bytes);
    kernels_exec_leave(x);
    return QC_OK;
}

enum qc_status qc_op_download(const struct qc_exec *x, void *dst, const void *src, size_t bytes)
{
    if (!qc_prof_on())
        return exec_download(x, dst, src, bytes);
    struct qc_prof_mark m;
    kernels_prof_begin(&m, x);
    const enum qc_status st = exec_download(x, dst, src, bytes);
    const struct qc_prof_op po = EXEC_P("download", "bytes", (int64_t)bytes, 0, 0, 0, bytes, 0);
    kernels_prof_end(&m, x, &po);
    return st;
}

enum qc_status qc_op_sync(const struct qc_exec *x)
{
#ifdef QC_HAVE_CUDA
    if (x && x->backend == QC_EXEC_CUDA)
        return QC_CUDA(cudaStreamSynchronize(EXEC_STREAM(x)));
#endif
    if (x && x->backend == QC_EXEC_CUDA)
        exec_no_cuda("sync");
    return QC_OK;
}

// ---- ops ----------------------------------------------------------------------------------

void qc_op_wrap_angle_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n)
{
    QC_EXEC_OP(ex, qc_wrap_angle_forward, EXEC_P("wrap_angle_forward", "n", n, 0, 0, 0, 8.0 * n, 0),
               out, inp, n);
}

void qc_op_angle_between_2d_forward(const struct qc_exec *ex, float *out, const float *ctr,
                                    const float *vec, int64_t N)
{
    QC_EXEC_OP(ex, qc_angle_between_2d_forward,
               EXEC_P("angle_between_2d_forward", "N", N, 0, 0, 0, 20.0 * N, 0), out, ctr, vec, N);
}

void qc_op_linear_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t ldi,
                          const float *weight, const float *bias, int64_t N, int64_t IC, int64_t OC,
                          bool accum)
{
    const int prec = exec_lowp(ex) ? ex->precision : QC_PREC_FP32;
    if (prec != QC_PREC_FP32 && ex->backend != QC_EXEC_CUDA) {
        kernels_exec_enter(ex);
        float *ir = exec_rounded_copy(inp, N, IC, ldi, prec);
        float *wr = exec_rounded_copy(weight, OC, IC, IC, prec);
        qc_linear_forward_cpu(out, ir, IC, wr, bias, N, IC, OC, accum);
        free(ir);
        free(wr);
        kernels_exec_leave(ex);
        exec_round(ex, out, N * OC);
        return;
    }
    /* CUDA in 16 bits: the GEMM on the tensor cores, its operands converted by cuBLAS */
    QC_EXEC_OP_SPLIT(ex,
                     EXEC_P("linear_forward", "N,IC,OC", N, IC, OC, 0,
                            4.0 * ((double)N * IC + (double)IC * OC +
                                   (double)N * OC * (accum ? 2 : 1) + (bias ? OC : 0)),
                            2.0 * N * IC * OC),
                     qc_linear_forward_cpu(out, inp, ldi, weight, bias, N, IC, OC, accum),
                     qc_linear_forward_prec_cuda(out, inp, ldi, weight, bias, N, IC, OC, accum,
                                                 prec, EXEC_STREAM(ex)));
    exec_round(ex, out, N * OC);
}

void qc_op_linear_backward(const struct qc_exec *ex, float *dinp, int64_t lddi, float *dweight,
                           float *dbias, const float *dout, const float *inp, int64_t ldi,
                           const float *weight, int64_t N, int64_t IC, int64_t OC, bool accum)
{
    const int prec = exec_lowp(ex) ? ex->precision : QC_PREC_FP32;
    if (prec != QC_PREC_FP32 && ex->backend != QC_EXEC_CUDA) {
        /* the forward's rounded operands, and dout rounded: every GEMM input in 16 bits (the
         * bias gradient reads dout as it is, in fp32) */
        kernels_exec_enter(ex);
        float *ir = exec_rounded_copy(inp, N, IC, ldi, prec);
        float *wr = exec_rounded_copy(weight, OC, IC, IC, prec);
        float *dr = exec_rounded_copy(dout, N, OC, OC, prec);
        qc_linear_backward_cpu(dinp, lddi, dweight, NULL, dr, ir, IC, wr, N, IC, OC, accum);
        if (dbias)
            qc_linear_backward_cpu(NULL, 0, NULL, dbias, dout, NULL, IC, NULL, N, IC, OC, accum);
        free(ir);
        free(wr);
        free(dr);
        kernels_exec_leave(ex);
        return;
    }
    QC_EXEC_OP_SPLIT(ex,
                     EXEC_P("linear_backward", "N,IC,OC", N, IC, OC, 0,
                            4.0 * ((double)N * OC + (dweight ? (double)N * IC + 2.0 * IC * OC : 0) +
                                   (dinp ? (double)IC * OC + (double)N * IC * (accum ? 2 : 1) : 0) +
                                   (dbias ? 2.0 * OC : 0)),
                            2.0 * N * IC * OC * ((dinp ? 1 : 0) + (dweight ? 1 : 0))),
                     qc_linear_backward_cpu(dinp, lddi, dweight, dbias, dout, inp, ldi, weight, N,
                                            IC, OC, accum),
                     qc_linear_backward_prec_cuda(dinp, lddi, dweight, dbias, dout, inp, ldi,
                                                  weight, N, IC, OC, accum, prec, EXEC_STREAM(ex)));
}

void qc_op_layernorm_forward(const struct qc_exec *ex, float *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int64_t N,
                             int64_t C)
{
    QC_EXEC_OP(
        ex, qc_layernorm_forward,
        EXEC_P("layernorm_forward", "N,C", N, C, 0, 0, 4.0 * (2.0 * N * C + 2.0 * N + 2.0 * C), 0),
        out, mean, rstd, inp, weight, bias, N, C);
    exec_round(ex, out, N * C); /* mean, rstd stay fp32 */
}

void qc_op_layernorm_backward(const struct qc_exec *ex, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *mean,
                              const float *rstd, const float *weight, int64_t N, int64_t C,
                              bool accum)
{
    QC_EXEC_OP(ex, qc_layernorm_backward,
               EXEC_P("layernorm_backward", "N,C", N, C, 0, 0,
                      4.0 * ((double)N * C * (accum ? 4 : 3) + 2.0 * N + 3.0 * C), 0),
               dinp, dweight, dbias, dout, inp, mean, rstd, weight, N, C, accum);
}

void qc_op_relu_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n)
{
    QC_EXEC_OP(ex, qc_relu_forward, EXEC_P("relu_forward", "n", n, 0, 0, 0, 8.0 * n, 0), out, inp,
               n);
    exec_round(ex, out, n);
}

void qc_op_relu_backward(const struct qc_exec *ex, float *dinp, const float *dout, const float *out,
                         int64_t n)
{
    QC_EXEC_OP(ex, qc_relu_backward, EXEC_P("relu_backward", "n", n, 0, 0, 0, 12.0 * n, 0), dinp,
               dout, out, n);
}

void qc_op_elu_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n)
{
    QC_EXEC_OP(ex, qc_elu_forward, EXEC_P("elu_forward", "n", n, 0, 0, 0, 8.0 * n, 0), out, inp, n);
    exec_round(ex, out, n);
}

void qc_op_elu_backward(const struct qc_exec *ex, float *dinp, const float *dout, const float *out,
                        int64_t n)
{
    QC_EXEC_OP(ex, qc_elu_backward, EXEC_P("elu_backward", "n", n, 0, 0, 0, 12.0 * n, 0), dinp,
               dout, out, n);
}

void qc_op_sigmoid_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n)
{
    QC_EXEC_OP(ex, qc_sigmoid_forward, EXEC_P("sigmoid_forward", "n", n, 0, 0, 0, 8.0 * n, 0), out,
               inp, n);
    exec_round(ex, out, n);
}

void qc_op_sigmoid_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                            const float *out, int64_t n)
{
    QC_EXEC_OP(ex, qc_sigmoid_backward, EXEC_P("sigmoid_backward", "n", n, 0, 0, 0, 12.0 * n, 0),
               dinp, dout, out, n);
}

void qc_op_tanh_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n)
{
    QC_EXEC_OP(ex, qc_tanh_forward, EXEC_P("tanh_forward", "n", n, 0, 0, 0, 8.0 * n, 0), out, inp,
               n);
    exec_round(ex, out, n);
}

void qc_op_tanh_backward(const struct qc_exec *ex, float *dinp, const float *dout, const float *out,
                         int64_t n)
{
    QC_EXEC_OP(ex, qc_tanh_backward, EXEC_P("tanh_backward", "n", n, 0, 0, 0, 12.0 * n, 0), dinp,
               dout, out, n);
}

void qc_op_add_forward(const struct qc_exec *ex, float *out, const float *a, const float *b,
                       int64_t n)
{
    QC_EXEC_OP(ex, qc_add_forward, EXEC_P("add_forward", "n", n, 0, 0, 0, 12.0 * n, 0), out, a, b,
               n);
}

void qc_op_add_scalar_forward(const struct qc_exec *ex, float *out, const float *inp, float s,
                              int64_t n)
{
    QC_EXEC_OP(ex, qc_add_scalar_forward, EXEC_P("add_scalar_forward", "n", n, 0, 0, 0, 8.0 * n, 0),
               out, inp, s, n);
}

void qc_op_gate_update_forward(const struct qc_exec *ex, float *out, const float *u, const float *g,
                               const float *s, int64_t n)
{
    QC_EXEC_OP(ex, qc_gate_update_forward,
               EXEC_P("gate_update_forward", "n", n, 0, 0, 0, 16.0 * n, 0), out, u, g, s, n);
}

void qc_op_gate_update_backward(const struct qc_exec *ex, float *du, float *dg, float *ds,
                                const float *dout, const float *u, const float *g, const float *s,
                                int64_t n)
{
    QC_EXEC_OP(ex, qc_gate_update_backward,
               EXEC_P("gate_update_backward", "n", n, 0, 0, 0, 28.0 * n, 0), du, dg, ds, dout, u, g,
               s, n);
}

void qc_op_dropout_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t n,
                           const struct qc_dropout *d)
{
    QC_EXEC_OP(ex, qc_dropout_forward, EXEC_P("dropout_forward", "n", n, 0, 0, 0, 8.0 * n, 0), out,
               inp, n, d);
    exec_round(ex, out, n);
}

void qc_op_dropout_backward(const struct qc_exec *ex, float *dinp, const float *dout, int64_t n,
                            const struct qc_dropout *d)
{
    QC_EXEC_OP(ex, qc_dropout_backward, EXEC_P("dropout_backward", "n", n, 0, 0, 0, 8.0 * n, 0),
               dinp, dout, n, d);
}

void qc_op_embedding_forward(const struct qc_exec *ex, float *out, const int64_t *idx,
                             const float *table, int64_t N, int64_t C, int64_t V)
{
    QC_EXEC_OP(ex, qc_embedding_forward,
               EXEC_P("embedding_forward", "N,C,V", N, C, V, 0, 8.0 * N * C + 8.0 * N, 0), out, idx,
               table, N, C, V);
    exec_round(ex, out, N * C);
}

void qc_op_embedding_backward(const struct qc_exec *ex, float *dtable, const float *dout,
                              const int64_t *idx, int64_t N, int64_t C, int64_t V)
{
    QC_EXEC_OP(ex, qc_embedding_backward,
               EXEC_P("embedding_backward", "N,C,V", N, C, V, 0, 12.0 * N * C + 8.0 * N, 0), dtable,
               dout, idx, N, C, V);
}

void qc_op_cumsum_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t outer,
                          int64_t L, int64_t inner)
{
    QC_EXEC_OP(
        ex, qc_cumsum_forward,
        EXEC_P("cumsum_forward", "outer,L,inner", outer, L, inner, 0, 8.0 * outer * L * inner, 0),
        out, inp, outer, L, inner);
}

void qc_op_cumsum_backward(const struct qc_exec *ex, float *dinp, const float *dout, int64_t outer,
                           int64_t L, int64_t inner)
{
    QC_EXEC_OP(
        ex, qc_cumsum_backward,
        EXEC_P("cumsum_backward", "outer,L,inner", outer, L, inner, 0, 8.0 * outer * L * inner, 0),
        dinp, dout, outer, L, inner);
}

void qc_op_copy2d(const struct qc_exec *ex, float *dst, int64_t ld_dst, const float *src,
                  int64_t ld_src, int64_t rows, int64_t cols, bool accum)
{
    QC_EXEC_OP(
        ex, qc_copy2d,
        EXEC_P("copy2d", "rows,cols", rows, cols, 0, 0, 4.0 * rows * cols * (accum ? 3 : 2), 0),
        dst, ld_dst, src, ld_src, rows, cols, accum);
}

void qc_op_repeat_interleave_forward(const struct qc_exec *ex, float *out, const float *inp,
                                     int64_t N, int64_t R, int64_t C)
{
    QC_EXEC_OP(ex, qc_repeat_interleave_forward,
               EXEC_P("repeat_interleave_forward", "N,R,C", N, R, C, 0,
                      4.0 * ((double)N * C + (double)N * R * C), 0),
               out, inp, N, R, C);
}

void qc_op_repeat_interleave_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                      int64_t N, int64_t R, int64_t C, bool accum)
{
    QC_EXEC_OP(ex, qc_repeat_interleave_backward,
               EXEC_P("repeat_interleave_backward", "N,R,C", N, R, C, 0,
                      4.0 * ((double)N * R * C + (double)N * C * (accum ? 2 : 1)), 0),
               dinp, dout, N, R, C, accum);
}

void qc_op_tile_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t N,
                        int64_t R, int64_t C)
{
    QC_EXEC_OP(
        ex, qc_tile_forward,
        EXEC_P("tile_forward", "N,R,C", N, R, C, 0, 4.0 * ((double)N * C + (double)N * R * C), 0),
        out, inp, N, R, C);
}

void qc_op_tile_backward(const struct qc_exec *ex, float *dinp, const float *dout, int64_t N,
                         int64_t R, int64_t C, bool accum)
{
    QC_EXEC_OP(ex, qc_tile_backward,
               EXEC_P("tile_backward", "N,R,C", N, R, C, 0,
                      4.0 * ((double)N * R * C + (double)N * C * (accum ? 2 : 1)), 0),
               dinp, dout, N, R, C, accum);
}

void qc_op_transpose01_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t D0,
                               int64_t D1, int64_t C)
{
    QC_EXEC_OP(ex, qc_transpose01_forward,
               EXEC_P("transpose01_forward", "D0,D1,C", D0, D1, C, 0, 8.0 * D0 * D1 * C, 0), out,
               inp, D0, D1, C);
}

void qc_op_transpose01_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                int64_t D0, int64_t D1, int64_t C)
{
    QC_EXEC_OP(ex, qc_transpose01_backward,
               EXEC_P("transpose01_backward", "D0,D1,C", D0, D1, C, 0, 8.0 * D0 * D1 * C, 0), dinp,
               dout, D0, D1, C);
}

/* Bytes a sum of CSR items into their segments moves (gather_rows backward, scatter_add
 * forward): the items' rows read, the segments' rows written (and read with accum), the CSR's
 * ptr and perm (16 bytes an item). */
static double csr_sum_bytes(struct qc_csr csr, int64_t C, bool accum)
{
    return 4.0 * ((double)csr.nitem * C + (double)csr.nseg * C * (accum ? 2 : 1)) +
           16.0 * csr.nitem;
}

void qc_op_gather_rows_forward(const struct qc_exec *ex, float *out, const float *inp,
                               const int64_t *idx, int64_t E, int64_t C, bool accum)
{
    QC_EXEC_OP(ex, qc_gather_rows_forward,
               EXEC_P("gather_rows_forward", "E,C", E, C, 0, 0,
                      4.0 * E * C * (accum ? 3 : 2) + 8.0 * E, 0),
               out, inp, idx, E, C, accum);
}

void qc_op_gather_rows_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                struct qc_csr csr, int64_t C, bool accum)
{
    QC_EXEC_OP(ex, qc_gather_rows_backward,
               EXEC_P("gather_rows_backward", "rows,items,C", csr.nseg, csr.nitem, C, 0,
                      csr_sum_bytes(csr, C, accum), 0),
               dinp, dout, csr, C, accum);
}

void qc_op_scatter_add_forward(const struct qc_exec *ex, float *out, const float *inp,
                               struct qc_csr csr, int64_t C, bool accum)
{
    QC_EXEC_OP(ex, qc_scatter_add_forward,
               EXEC_P("scatter_add_forward", "rows,items,C", csr.nseg, csr.nitem, C, 0,
                      csr_sum_bytes(csr, C, accum), 0),
               out, inp, csr, C, accum);
}

void qc_op_scatter_add_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                struct qc_csr csr, int64_t C, bool accum)
{
    QC_EXEC_OP(ex, qc_scatter_add_backward,
               EXEC_P("scatter_add_backward", "rows,items,C", csr.nseg, csr.nitem, C, 0,
                      4.0 * csr.nitem * C * (accum ? 3 : 2) + 16.0 * csr.nitem, 0),
               dinp, dout, csr, C, accum);
}

void qc_op_attn_score_forward(const struct qc_exec *ex, float *score, const float *q,
                              const float *k, struct qc_csr csr, int64_t H, int64_t Dh, float scale)
{
    QC_EXEC_OP(ex, qc_attn_score_forward,
               EXEC_P("attn_score_forward", "E,H,Dh", csr.nitem, H, Dh, 0,
                      4.0 * ((double)csr.nitem * H * Dh + (double)csr.nseg * H * Dh +
                             (double)csr.nitem * H) +
                          16.0 * csr.nitem,
                      2.0 * csr.nitem * H * Dh),
               score, q, k, csr, H, Dh, scale);
    exec_round(ex, score, csr.nitem * H);
}

void qc_op_attn_score_backward(const struct qc_exec *ex, float *dq, float *dk, const float *dscore,
                               const float *q, const float *k, struct qc_csr csr, int64_t H,
                               int64_t Dh, float scale, bool accum)
{
    QC_EXEC_OP(
        ex, qc_attn_score_backward,
        EXEC_P("attn_score_backward", "E,H,Dh", csr.nitem, H, Dh, 0,
               4.0 * (2.0 * csr.nitem * H * Dh + 2.0 * csr.nseg * H * Dh + (double)csr.nitem * H) +
                   16.0 * csr.nitem,
               4.0 * csr.nitem * H * Dh),
        dq, dk, dscore, q, k, csr, H, Dh, scale, accum);
}

void qc_op_segment_softmax_forward(const struct qc_exec *ex, float *out, float *seg_max,
                                   float *seg_sum, const float *score, struct qc_csr csr, int64_t H)
{
    QC_EXEC_OP(ex, qc_segment_softmax_forward,
               EXEC_P("segment_softmax_forward", "E,H", csr.nitem, H, 0, 0,
                      4.0 * (2.0 * csr.nitem * H + 2.0 * csr.nseg * H) + 16.0 * csr.nitem, 0),
               out, seg_max, seg_sum, score, csr, H);
    exec_round(ex, out, csr.nitem * H); /* seg_max, seg_sum stay fp32 */
}

void qc_op_segment_softmax_backward(const struct qc_exec *ex, float *dscore, const float *dout,
                                    const float *out, struct qc_csr csr, int64_t H)
{
    QC_EXEC_OP(ex, qc_segment_softmax_backward,
               EXEC_P("segment_softmax_backward", "E,H", csr.nitem, H, 0, 0,
                      12.0 * csr.nitem * H + 16.0 * csr.nitem, 0),
               dscore, dout, out, csr, H);
}

void qc_op_attn_aggregate_forward(const struct qc_exec *ex, float *out, const float *alpha,
                                  const float *v, struct qc_csr csr, int64_t H, int64_t Dh,
                                  const struct qc_dropout *drop)
{
    QC_EXEC_OP(ex, qc_attn_aggregate_forward,
               EXEC_P("attn_aggregate_forward", "E,H,Dh", csr.nitem, H, Dh, 0,
                      4.0 * ((double)csr.nitem * H + (double)csr.nitem * H * Dh +
                             (double)csr.nseg * H * Dh) +
                          16.0 * csr.nitem,
                      2.0 * csr.nitem * H * Dh),
               out, alpha, v, csr, H, Dh, drop);
    exec_round(ex, out, csr.nseg * H * Dh);
}

void qc_op_attn_aggregate_backward(const struct qc_exec *ex, float *dalpha, float *dv,
                                   const float *dout, const float *alpha, const float *v,
                                   struct qc_csr csr, int64_t H, int64_t Dh,
                                   const struct qc_dropout *drop)
{
    QC_EXEC_OP(
        ex, qc_attn_aggregate_backward,
        EXEC_P("attn_aggregate_backward", "E,H,Dh", csr.nitem, H, Dh, 0,
               4.0 * (2.0 * csr.nitem * H + 2.0 * csr.nitem * H * Dh + (double)csr.nseg * H * Dh) +
                   16.0 * csr.nitem,
               4.0 * csr.nitem * H * Dh),
        dalpha, dv, dout, alpha, v, csr, H, Dh, drop);
}

void qc_op_fourier_features_forward(const struct qc_exec *ex, float *phi, const float *c,
                                    const float *freqs, int64_t N, int64_t D, int64_t F)
{
    QC_EXEC_OP(ex, qc_fourier_features_forward,
               EXEC_P("fourier_features_forward", "N,d,F", N, D, F, 0,
                      4.0 * ((double)N * D * (2 * F + 1) + (double)N * D + (double)D * F), 0),
               phi, c, freqs, N, D, F);
    exec_round(ex, phi, N * D * (2 * F + 1));
}

void qc_op_fourier_features_backward(const struct qc_exec *ex, float *dc, float *dfreqs,
                                     const float *dphi, const float *c, const float *freqs,
                                     int64_t N, int64_t D, int64_t F)
{
    QC_EXEC_OP(ex, qc_fourier_features_backward,
               EXEC_P("fourier_features_backward", "N,d,F", N, D, F, 0,
                      4.0 * ((double)N * D * (2 * F + 1) + 2.0 * N * D + 2.0 * D * F), 0),
               dc, dfreqs, dphi, c, freqs, N, D, F);
}

void qc_op_fourier_features_backward_saved(const struct qc_exec *ex, float *dc, float *dfreqs,
                                           const float *dphi, const float *phi, const float *c,
                                           const float *freqs, int64_t N, int64_t D, int64_t F)
{
    /* CUDA recomputes cos/sin instead of reading phi (same values up to sinf/cosf ulp). */
    QC_EXEC_OP_SPLIT(
        ex,
        EXEC_P("fourier_features_backward", "N,d,F", N, D, F, 0,
               4.0 * ((double)N * D * (2 * F + 1) + 2.0 * N * D + 2.0 * D * F), 0),
        qc_fourier_features_backward_saved_cpu(dc, dfreqs, dphi, phi, c, freqs, N, D, F),
        qc_fourier_features_backward_cuda(dc, dfreqs, dphi, c, freqs, N, D, F, EXEC_STREAM(ex)));
}

/* The GRUs in a 16-bit run (docs/PRECISION.md): x and both weight matrices rounded (CPU, EMU:
 * rounded host copies; CUDA: the _prec launchers round the same operands on the device); the
 * hidden state, the gates, the biases and every gradient stay fp32. The cell rounds as one step
 * of the sequence does. fp32 takes the plain op on every backend. */

/* The GRU's operands as the CPU oracle of a 16-bit run reads them (CPU, EMU): rounded host
 * copies of x (rows, IC), W_ih (3C, IC) and W_hh (3C, C), made with ex's arena open; the arena
 * stays open until gru_lowp_end frees them. */
struct gru_lowp {
    float *x, *w_ih, *w_hh;
};

static struct gru_lowp gru_lowp_begin(const struct qc_exec *ex, const float *x, int64_t rows,
                                      const float *w_ih, const float *w_hh, int64_t IC, int64_t C)
{
    kernels_exec_enter(ex);
    struct gru_lowp r;
    r.x = exec_rounded_copy(x, rows, IC, IC, ex->precision);
    r.w_ih = exec_rounded_copy(w_ih, 3 * C, IC, IC, ex->precision);
    r.w_hh = exec_rounded_copy(w_hh, 3 * C, C, C, ex->precision);
    return r;
}

static void gru_lowp_end(const struct qc_exec *ex, struct gru_lowp *r)
{
    free(r->x);
    free(r->w_ih);
    free(r->w_hh);
    kernels_exec_leave(ex);
}

#define GRU_CELL_FWD_P                                                                             \
    EXEC_P("gru_cell_forward", "N,IC,C", N, IC, C, 0,                                              \
           4.0 * ((double)N * IC + 2.0 * N * C + 3.0 * C * (IC + C) + 4.0 * N * C),                \
           6.0 * N * C * (IC + C))
#define GRU_CELL_BWD_P                                                                             \
    EXEC_P("gru_cell_backward", "N,IC,C", N, IC, C, 0,                                             \
           4.0 * (2.0 * N * IC + 3.0 * N * C + 6.0 * C * (IC + C) + 4.0 * N * C),                  \
           12.0 * N * C * (IC + C))
#define GRU_FWD_P                                                                                  \
    EXEC_P("gru_forward", "L,N,IC,C", L, N, IC, C,                                                 \
           4.0 * ((double)L * N * IC + 5.0 * L * N * C + 3.0 * C * (IC + C)),                      \
           6.0 * L * N * C * (IC + C))
#define GRU_BWD_P                                                                                  \
    EXEC_P("gru_backward", "L,N,IC,C", L, N, IC, C,                                                \
           4.0 * (2.0 * L * N * IC + 6.0 * L * N * C + 6.0 * C * (IC + C)),                        \
           12.0 * L * N * C * (IC + C))

void qc_op_gru_cell_forward(const struct qc_exec *ex, float *h_out, float *gates, const float *x,
                            const float *h, const float *w_ih, const float *b_ih, const float *w_hh,
                            const float *b_hh, int64_t N, int64_t IC, int64_t C, float *scratch)
{
    if (exec_lowp(ex) && ex->backend != QC_EXEC_CUDA) {
        struct gru_lowp r = gru_lowp_begin(ex, x, N, w_ih, w_hh, IC, C);
        qc_gru_cell_forward_cpu(h_out, gates, r.x, h, r.w_ih, b_ih, r.w_hh, b_hh, N, IC, C,
                                scratch);
        gru_lowp_end(ex, &r);
        return;
    }
    if (exec_lowp(ex)) { /* CUDA (the CPU call is only named: CPU and EMU returned above) */
        QC_EXEC_OP_SPLIT(
            ex, GRU_CELL_FWD_P,
            qc_gru_cell_forward_cpu(h_out, gates, x, h, w_ih, b_ih, w_hh, b_hh, N, IC, C, scratch),
            qc_gru_cell_forward_prec_cuda(h_out, gates, x, h, w_ih, b_ih, w_hh, b_hh, N, IC, C,
                                          scratch, ex->precision, EXEC_STREAM(ex)));
        return;
    }
    QC_EXEC_OP(ex, qc_gru_cell_forward, GRU_CELL_FWD_P, h_out, gates, x, h, w_ih, b_ih, w_hh, b_hh,
               N, IC, C, scratch);
}

void qc_op_gru_cell_backward(const struct qc_exec *ex, float *dx, float *dh, float *dw_ih,
                             float *db_ih, float *dw_hh, float *db_hh, const float *dh_out,
                             const float *gates, const float *x, const float *h, const float *w_ih,
                             const float *w_hh, int64_t N, int64_t IC, int64_t C, float *scratch)
{
    if (exec_lowp(ex) && ex->backend != QC_EXEC_CUDA) {
        struct gru_lowp r = gru_lowp_begin(ex, x, N, w_ih, w_hh, IC, C);
        qc_gru_cell_backward_cpu(dx, dh, dw_ih, db_ih, dw_hh, db_hh, dh_out, gates, r.x, h, r.w_ih,
                                 r.w_hh, N, IC, C, scratch);
        gru_lowp_end(ex, &r);
        return;
    }
    if (exec_lowp(ex)) { /* CUDA */
        QC_EXEC_OP_SPLIT(ex, GRU_CELL_BWD_P,
                         qc_gru_cell_backward_cpu(dx, dh, dw_ih, db_ih, dw_hh, db_hh, dh_out, gates,
                                                  x, h, w_ih, w_hh, N, IC, C, scratch),
                         qc_gru_cell_backward_prec_cuda(dx, dh, dw_ih, db_ih, dw_hh, db_hh, dh_out,
                                                        gates, x, h, w_ih, w_hh, N, IC, C, scratch,
                                                        ex->precision, EXEC_STREAM(ex)));
        return;
    }
    QC_EXEC_OP(ex, qc_gru_cell_backward, GRU_CELL_BWD_P, dx, dh, dw_ih, db_ih, dw_hh, db_hh, dh_out,
               gates, x, h, w_ih, w_hh, N, IC, C, scratch);
}

void qc_op_gru_forward(const struct qc_exec *ex, float *hs, float *gates, const float *x,
                       const float *h0, const float *w_ih, const float *b_ih, const float *w_hh,
                       const float *b_hh, int64_t L, int64_t N, int64_t IC, int64_t C,
                       float *scratch)
{
    if (exec_lowp(ex) && ex->backend != QC_EXEC_CUDA) {
        struct gru_lowp r = gru_lowp_begin(ex, x, L * N, w_ih, w_hh, IC, C);
        qc_gru_forward_cpu(hs, gates, r.x, h0, r.w_ih, b_ih, r.w_hh, b_hh, L, N, IC, C, scratch);
        gru_lowp_end(ex, &r);
        return;
    }
    if (exec_lowp(ex)) { /* CUDA */
        QC_EXEC_OP_SPLIT(
            ex, GRU_FWD_P,
            qc_gru_forward_cpu(hs, gates, x, h0, w_ih, b_ih, w_hh, b_hh, L, N, IC, C, scratch),
            qc_gru_forward_prec_cuda(hs, gates, x, h0, w_ih, b_ih, w_hh, b_hh, L, N, IC, C, scratch,
                                     ex->precision, EXEC_STREAM(ex)));
        return;
    }
    QC_EXEC_OP(ex, qc_gru_forward, GRU_FWD_P, hs, gates, x, h0, w_ih, b_ih, w_hh, b_hh, L, N, IC, C,
               scratch);
}

void qc_op_gru_backward(const struct qc_exec *ex, float *dx, float *dh0, float *dw_ih, float *db_ih,
                        float *dw_hh, float *db_hh, const float *dh_last, const float *hs,
                        const float *gates, const float *x, const float *w_ih, const float *w_hh,
                        int64_t L, int64_t N, int64_t IC, int64_t C, float *scratch)
{
    if (exec_lowp(ex) && ex->backend != QC_EXEC_CUDA) {
        struct gru_lowp r = gru_lowp_begin(ex, x, L * N, w_ih, w_hh, IC, C);
        qc_gru_backward_cpu(dx, dh0, dw_ih, db_ih, dw_hh, db_hh, dh_last, hs, gates, r.x, r.w_ih,
                            r.w_hh, L, N, IC, C, scratch);
        gru_lowp_end(ex, &r);
        return;
    }
    if (exec_lowp(ex)) { /* CUDA */
        QC_EXEC_OP_SPLIT(ex, GRU_BWD_P,
                         qc_gru_backward_cpu(dx, dh0, dw_ih, db_ih, dw_hh, db_hh, dh_last, hs,
                                             gates, x, w_ih, w_hh, L, N, IC, C, scratch),
                         qc_gru_backward_prec_cuda(dx, dh0, dw_ih, db_ih, dw_hh, db_hh, dh_last, hs,
                                                   gates, x, w_ih, w_hh, L, N, IC, C, scratch,
                                                   ex->precision, EXEC_STREAM(ex)));
        return;
    }
    QC_EXEC_OP(ex, qc_gru_backward, GRU_BWD_P, dx, dh0, dw_ih, db_ih, dw_hh, db_hh, dh_last, hs,
               gates, x, w_ih, w_hh, L, N, IC, C, scratch);
}

void qc_op_log_softmax_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t N,
                               int64_t K)
{
    QC_EXEC_OP(ex, qc_log_softmax_forward,
               EXEC_P("log_softmax_forward", "N,K", N, K, 0, 0, 8.0 * N * K, 0), out, inp, N, K);
}

void qc_op_log_softmax_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                                const float *out, int64_t N, int64_t K)
{
    QC_EXEC_OP(ex, qc_log_softmax_backward,
               EXEC_P("log_softmax_backward", "N,K", N, K, 0, 0, 12.0 * N * K, 0), dinp, dout, out,
               N, K);
}

void qc_op_logsumexp_forward(const struct qc_exec *ex, float *out, const float *inp, int64_t N,
                             int64_t K)
{
    QC_EXEC_OP(ex, qc_logsumexp_forward,
               EXEC_P("logsumexp_forward", "N,K", N, K, 0, 0, 4.0 * ((double)N * K + N), 0), out,
               inp, N, K);
}

void qc_op_logsumexp_backward(const struct qc_exec *ex, float *dinp, const float *dout,
                              const float *inp, const float *out, int64_t N, int64_t K)
{
    QC_EXEC_OP(ex, qc_logsumexp_backward,
               EXEC_P("logsumexp_backward", "N,K", N, K, 0, 0, 4.0 * (2.0 * N * K + 2.0 * N), 0),
               dinp, dout, inp, out, N, K);
}

void qc_op_laplace_nll_forward(const struct qc_exec *ex, float *nll, const float *mu,
                               const float *scale, const float *y, int64_t n)
{
    QC_EXEC_OP(ex, qc_laplace_nll_forward,
               EXEC_P("laplace_nll_forward", "n", n, 0, 0, 0, 16.0 * n, 0), nll, mu, scale, y, n);
}

void qc_op_laplace_nll_backward(const struct qc_exec *ex, float *dmu, float *dscale,
                                const float *dnll, const float *mu, const float *scale,
                                const float *y, int64_t n)
{
    QC_EXEC_OP(ex, qc_laplace_nll_backward,
               EXEC_P("laplace_nll_backward", "n", n, 0, 0, 0, 28.0 * n, 0), dmu, dscale, dnll, mu,
               scale, y, n);
}

void qc_op_best_mode(const struct qc_exec *ex, int64_t *best, const float *loc, const float *gt,
                     int64_t gt_stride, const uint8_t *mask, int64_t A, int64_t K, int64_t S)
{
    QC_EXEC_OP(ex, qc_best_mode,
               EXEC_P("best_mode", "A,K,S", A, K, S, 0, 4.0 * (2.0 * A * K * S + 3.0 * A * S), 0),
               best, loc, gt, gt_stride, mask, A, K, S);
}

void qc_op_reg_loss_forward(const struct qc_exec *ex, float *loss, const float *loc,
                            const float *scale, const int64_t *best, const float *gt,
                            int64_t gt_stride, const uint8_t *mask, const float *count, int64_t A,
                            int64_t K, int64_t S, float *scratch)
{
    QC_EXEC_OP(
        ex, qc_reg_loss_forward,
        EXEC_P("reg_loss_forward", "A,K,S", A, K, S, 0, 4.0 * (4.0 * A * S + 3.0 * A * S), 0), loss,
        loc, scale, best, gt, gt_stride, mask, count, A, K, S, scratch);
}

void qc_op_reg_loss_backward(const struct qc_exec *ex, float *dloc, float *dscale,
                             const float *dloss, const float *loc, const float *scale,
                             const int64_t *best, const float *gt, int64_t gt_stride,
                             const uint8_t *mask, const float *count, int64_t A, int64_t K,
                             int64_t S, float *scratch)
{
    QC_EXEC_OP(
        ex, qc_reg_loss_backward,
        EXEC_P("reg_loss_backward", "A,K,S", A, K, S, 0, 4.0 * (8.0 * A * S + 3.0 * A * S), 0),
        dloc, dscale, dloss, loc, scale, best, gt, gt_stride, mask, count, A, K, S, scratch);
}

void qc_op_mixture_nll_forward(const struct qc_exec *ex, float *loss, const float *pi,
                               const float *loc, const float *scale, const float *gt,
                               int64_t gt_stride, const uint8_t *reg_mask, const uint8_t *cls_mask,
                               const float *count, int64_t A, int64_t K, int64_t S)
{
    QC_EXEC_OP(ex, qc_mixture_nll_forward,
               EXEC_P("mixture_nll_forward", "A,K,S", A, K, S, 0,
                      4.0 * (4.0 * A * K * S + 2.0 * A * S + A * K), 0),
               loss, pi, loc, scale, gt, gt_stride, reg_mask, cls_mask, count, A, K, S);
}

void qc_op_mixture_nll_backward(const struct qc_exec *ex, float *dpi, const float *dloss,
                                const float *pi, const float *loc, const float *scale,
                                const float *gt, int64_t gt_stride, const uint8_t *reg_mask,
                                const uint8_t *cls_mask, const float *count, int64_t A, int64_t K,
                                int64_t S)
{
    QC_EXEC_OP(ex, qc_mixture_nll_backward,
               EXEC_P("mixture_nll_backward", "A,K,S", A, K, S, 0,
                      4.0 * (4.0 * A * K * S + 2.0 * A * S + 2.0 * A * K), 0),
               dpi, dloss, pi, loc, scale, gt, gt_stride, reg_mask, cls_mask, count, A, K, S);
}

void qc_op_adamw_step(const struct qc_exec *ex, float *param, float *m, float *v, const float *grad,
                      int64_t n, const struct qc_adamw_hparams *hp)
{
    QC_EXEC_OP(ex, qc_adamw_step, EXEC_P("adamw_step", "n", n, 0, 0, 0, 28.0 * n, 0), param, m, v,
               grad, n, hp);
}

void qc_op_adamw_step_segments(const struct qc_exec *ex, float *param, float *m, float *v,
                               const float *grad, const int64_t *offsets, const uint8_t *decay,
                               int64_t nseg, const struct qc_adamw_hparams *hp)
{
    QC_EXEC_OP(ex, qc_adamw_step_segments,
               EXEC_P("adamw_step_segments", "segments", nseg, 0, 0, 0, 0, 0), param, m, v, grad,
               offsets, decay, nseg, hp);
}

// ---- mixed precision ops ------------------------------------------------------------------

void qc_op_round(const struct qc_exec *ex, float *out, const float *inp, int64_t n, int prec)
{
    QC_EXEC_OP(ex, qc_round_forward, EXEC_P("round_forward", "n", n, 0, 0, 0, 8.0 * n, 0), out, inp,
               n, prec);
}

void qc_op_pack16(const struct qc_exec *ex, uint16_t *dst, const float *src, int64_t n, int prec)
{
    QC_EXEC_OP(ex, qc_pack16, EXEC_P("pack16", "n", n, 0, 0, 0, 6.0 * n, 0), dst, src, n, prec);
}

void qc_op_unpack16(const struct qc_exec *ex, float *dst, const uint16_t *src, int64_t n, int prec)
{
    QC_EXEC_OP(ex, qc_unpack16, EXEC_P("unpack16", "n", n, 0, 0, 0, 6.0 * n, 0), dst, src, n, prec);
}

void qc_op_scale_inplace(const struct qc_exec *ex, float *x, float s, int64_t n)
{
    QC_EXEC_OP(ex, qc_scale_inplace, EXEC_P("scale_inplace", "n", n, 0, 0, 0, 8.0 * n, 0), x, s, n);
}
