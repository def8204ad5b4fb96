/*
 * handles.cu — the per-device op context (cuBLAS handle, lazily created cuDNN handle, TF32
 * switch, reduction workspace), the thread's current context, and cuBLAS / cuDNN error
 * conversion (QC_CUBLAS, QC_CUDNN).
 *
 * Invariant: all work launched through one context is ordered as one sequence, whatever stream
 * each launch names: cuda_ctx_bind makes a new stream wait (event) for the previous one before
 * the shared workspace or handle is used on it.
 */
#include "cuda_common.cuh"

#include <stdlib.h>

// ---- error conversion ---------------------------------------------------------------------------

static const char *cublas_status_name(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_(unknown)";
}

enum qc_status qc_cublas_check(cublasStatus_t st, const char *call, const char *file, int line)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return QC_OK;
    enum qc_status s = st == CUBLAS_STATUS_ALLOC_FAILED ? QC_ERR_NOMEM : QC_ERR_CUDA;
    return qc_errorf(s, "%s failed: %s (%d) | %s:%d", call, cublas_status_name(st), (int)st, file,
                     line);
}

enum qc_status qc_cudnn_check(cudnnStatus_t st, const char *call, const char *file, int line)
{
    if (st == CUDNN_STATUS_SUCCESS)
        return QC_OK;
    enum qc_status s = st == CUDNN_STATUS_ALLOC_FAILED ? QC_ERR_NOMEM : QC_ERR_CUDA;
    return qc_errorf(s, "%s failed: %s (%d) | %s:%d", call, cudnnGetErrorString(st), (int)st, file,
                     line);
}

void qc_cublas_assert(cublasStatus_t st, const char *call, const char *file, int line)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        qc_assert_fail(file, line, call, "%s (%d)", cublas_status_name(st), (int)st);
}

void qc_cudnn_assert(cudnnStatus_t st, const char *call, const char *file, int line)
{
    if (st != CUDNN_STATUS_SUCCESS)
        qc_assert_fail(file, line, call, "%s (%d)", cudnnGetErrorString(st), (int)st);
}

// ---- context ------------------------------------------------------------------------------------

static thread_local struct qc_kernels_cuda *tls_ctx;

static enum qc_status ctx_math_mode(struct qc_kernels_cuda *ctx)
{
    /* Pedantic fp32 unless TF32 is asked for: the CPU oracle is exact fp32 GEMM. */
    cublasMath_t mode = ctx->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
    return QC_CUBLAS(cublasSetMathMode(ctx->cublas, mode));
}

enum qc_status qc_kernels_cuda_create(const struct qc_kernels_cuda_params *params,
                                      struct qc_kernels_cuda **out)
{
    QC_ASSERT(params && out, "qc_kernels_cuda_create: NULL argument");
    if (!params->workspace || params->workspace_bytes < QC_KERNELS_CUDA_WORKSPACE_MIN)
        return qc_errorf(QC_ERR_INVALID,
                         "kernels cuda context: workspace %p of %zu bytes (need >= %zu)\n"
                         "hint: allocate QC_KERNELS_CUDA_WORKSPACE_BYTES from the allocator",
                         params->workspace, params->workspace_bytes, QC_KERNELS_CUDA_WORKSPACE_MIN);
    if (((uintptr_t)params->workspace & 255u) != 0)
        return qc_errorf(QC_ERR_INVALID, "kernels cuda context: workspace %p not 256-byte aligned",
                         params->workspace);
    QC_TRY(QC_CUDA(cudaSetDevice(params->device)));
    struct qc_kernels_cuda *ctx = (struct qc_kernels_cuda *)calloc(1, sizeof(*ctx));
    if (!ctx)
        return qc_errorf(QC_ERR_NOMEM, "kernels cuda context: out of host memory");
    ctx->device = params->device;
    ctx->tf32 = params->tf32;
    ctx->ws = (double *)params->workspace;
    ctx->ws_bytes = params->workspace_bytes;
    enum qc_status st = QC_CUBLAS(cublasCreate(&ctx->cublas));
    if (st == QC_OK)
        st = QC_CUBLAS(cublasSetPointerMode(ctx->cublas, CUBLAS_POINTER_MODE_HOST));
    if (st == QC_OK) /* the default, stated: results must not depend on scheduling */
        st = QC_CUBLAS(cublasSetAtomicsMode(ctx->cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
    if (st == QC_OK)
        st = ctx_math_mode(ctx);
    if (st == QC_OK)
        st = QC_CUDA(cudaEventCreateWithFlags(&ctx->join, cudaEventDisableTiming));
    if (st != QC_OK) {
        if (ctx->cublas)
            (void)cublasDestroy(ctx->cublas);
        free(ctx);
        return st;
    }
    *out = ctx;
    return QC_OK;
}

void qc_kernels_cuda_destroy(struct qc_kernels_cuda *ctx)
{
    if (!ctx)
        return;
    if (tls_ctx == ctx)
        tls_ctx = NULL;
    if (cudaSetDevice(ctx->device) == cudaSuccess)
        (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    if (ctx->cudnn)
        (void)cudnnDestroy(ctx->cudnn);
    (void)cublasDestroy(ctx->cublas);
    (void)cudaEventDestroy(ctx->join);
    free(ctx);
}

void qc_kernels_cuda_set_current(struct qc_kernels_cuda *ctx)
{
    tls_ctx = ctx;
}

struct qc_kernels_cuda *qc_kernels_cuda_current(void)
{
    return tls_ctx;
}

enum qc_status qc_kernels_cuda_set_tf32(struct qc_kernels_cuda *ctx, bool tf32)
{
    QC_ASSERT(ctx, "qc_kernels_cuda_set_tf32: NULL ctx");
    ctx->tf32 = tf32;
    return ctx_math_mode(ctx);
}

bool qc_kernels_cuda_tf32(const struct qc_kernels_cuda *ctx)
{
    return ctx && ctx->tf32;
}

struct qc_kernels_cuda *cuda_ctx_bind(cudaStream_t stream, const char *op)
{
    struct qc_kernels_cuda *ctx = tls_ctx;
    QC_ASSERT(ctx,
              "%s: no CUDA op context on this thread\n"
              "hint: qc_kernels_cuda_create() one per device and qc_kernels_cuda_set_current()"
              " it on the thread that launches ops",
              op);
    if (!ctx->has_last || ctx->last_stream != stream) {
        if (ctx->has_last) {
            QC_CUDA_ASSERT(cudaEventRecord(ctx->join, ctx->last_stream));
            QC_CUDA_ASSERT(cudaStreamWaitEvent(stream, ctx->join, 0));
        }
        QC_CUBLAS_ASSERT(cublasSetStream(ctx->cublas, stream));
        ctx->last_stream = stream;
        ctx->has_last = true;
    }
    return ctx;
}

enum qc_status cuda_ctx_cudnn(struct qc_kernels_cuda *ctx, cudaStream_t stream, cudnnHandle_t *out)
{
    if (!ctx->cudnn)
        QC_TRY(QC_CUDNN(cudnnCreate(&ctx->cudnn)));
    QC_TRY(QC_CUDNN(cudnnSetStream(ctx->cudnn, stream)));
    *out = ctx->cudnn;
    return QC_OK;
}
