/*
 * handles.cu — the per-device op context (cuBLAS handle, lazily created cuDNN handle, TF32
 * switch, workspace, upload staging ring), the thread's current context, and cuBLAS / cuDNN
 * error conversion (QC_CUBLAS, QC_CUDNN).
 *
 * Invariants:
 *   - all work launched through one context is ordered as one sequence, whatever stream each
 *     launch names: cuda_ctx_bind makes a new stream wait (event) for the previous one before
 *     the shared workspace or handle is used on it;
 *   - last_stream names a live stream or has_last is false: every live context is in one list,
 *     and the device layer's stream-destroy listener (qc_device.h) clears last_stream in each
 *     context that names a stream being destroyed (the stream has drained: nothing to wait for);
 *   - the cuBLAS handle is bound to the stream of the last bind, with the context's workspace
 *     (cublasSetStream resets the workspace to cuBLAS's own pool, so it is set again each time);
 *     the cuDNN handle is bound to the caller's stream by every call that may run work.
 */
#include "cuda_common.cuh"

#include <stdlib.h>
#include <string.h>

#include "qc_device.h" /* qc_device_set_stream_destroy_listener */

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

/* Every live context, for the stream-destroy listener. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct qc_kernels_cuda *live_head;

static void ctx_forget_stream(void *native)
{
    cudaStream_t dead = (cudaStream_t)native;
    pthread_mutex_lock(&live_mu);
    for (struct qc_kernels_cuda *c = live_head; c; c = c->next_live) {
        pthread_mutex_lock(&c->mu);
        if (c->has_last && c->last_stream == dead) {
            c->has_last = false;
            c->last_stream = (cudaStream_t)0;
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&live_mu);
}

static void ctx_live_add(struct qc_kernels_cuda *ctx)
{
    pthread_mutex_lock(&live_mu);
    ctx->next_live = live_head;
    live_head = ctx;
    qc_device_set_stream_destroy_listener(ctx_forget_stream);
    pthread_mutex_unlock(&live_mu);
}

static void ctx_live_remove(struct qc_kernels_cuda *ctx)
{
    pthread_mutex_lock(&live_mu);
    for (struct qc_kernels_cuda **pp = &live_head; *pp; pp = &(*pp)->next_live)
        if (*pp == ctx) {
            *pp = ctx->next_live;
            break;
        }
    if (!live_head)
        qc_device_set_stream_destroy_listener(NULL);
    pthread_mutex_unlock(&live_mu);
}

static enum qc_status ctx_math_mode(struct qc_kernels_cuda *ctx)
{
    /* fp32 GEMMs without down-conversion unless TF32 is asked for (the CPU oracle is fp32):
     * CUBLAS_DEFAULT_MATH never uses TF32 for fp32 data; PEDANTIC would also forbid the faster
     * fp32 kernels for no accuracy gain. */
    cublasMath_t mode = ctx->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    return QC_CUBLAS(cublasSetMathMode(ctx->cublas, mode));
}

/* Binds the cuBLAS handle to `stream` with the context's workspace. */
static enum qc_status ctx_cublas_bind(struct qc_kernels_cuda *ctx, cudaStream_t stream)
{
    QC_TRY(QC_CUBLAS(cublasSetStream(ctx->cublas, stream)));
    return QC_CUBLAS(cublasSetWorkspace(ctx->cublas, ctx->ws, ctx->ws_bytes));
}

static void ctx_free(struct qc_kernels_cuda *ctx)
{
    for (int i = 0; i < QC_KERNELS_CUDA_STAGING_SLOTS; i++)
        if (ctx->stage_done[i])
            (void)cudaEventDestroy(ctx->stage_done[i]);
    if (ctx->join)
        (void)cudaEventDestroy(ctx->join);
    if (ctx->cudnn)
        (void)cudnnDestroy(ctx->cudnn);
    if (ctx->cublas)
        (void)cublasDestroy(ctx->cublas);
    pthread_mutex_destroy(&ctx->mu);
    free(ctx);
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
    const size_t slot = params->staging_bytes / QC_KERNELS_CUDA_STAGING_SLOTS / 4096 * 4096;
    if (params->staging && slot == 0)
        return qc_errorf(QC_ERR_INVALID,
                         "kernels cuda context: staging ring of %zu bytes (need >= %d pages)\n"
                         "hint: allocate QC_KERNELS_CUDA_STAGING_BYTES from the pinned arena",
                         params->staging_bytes, QC_KERNELS_CUDA_STAGING_SLOTS);
    QC_TRY(QC_CUDA(cudaSetDevice(params->device)));
    struct qc_kernels_cuda *ctx = (struct qc_kernels_cuda *)calloc(1, sizeof(*ctx));
    if (!ctx)
        return qc_errorf(QC_ERR_NOMEM, "kernels cuda context: out of host memory");
    if (pthread_mutex_init(&ctx->mu, NULL) != 0) {
        free(ctx);
        return qc_errorf(QC_ERR_NOMEM, "kernels cuda context: pthread_mutex_init failed");
    }
    ctx->device = params->device;
    ctx->tf32 = params->tf32;
    ctx->ws = (double *)params->workspace;
    ctx->ws_bytes = params->workspace_bytes;
    ctx->stage = params->staging ? (unsigned char *)params->staging : NULL;
    ctx->stage_slot = params->staging ? slot : 0;
    enum qc_status st = QC_CUBLAS(cublasCreate(&ctx->cublas));
    if (st == QC_OK)
        st = QC_CUBLAS(cublasSetPointerMode(ctx->cublas, CUBLAS_POINTER_MODE_HOST));
    if (st == QC_OK) /* the default, stated: results must not depend on scheduling */
        st = QC_CUBLAS(cublasSetAtomicsMode(ctx->cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
    if (st == QC_OK)
        st = ctx_math_mode(ctx);
    if (st == QC_OK) /* no stream yet: the legacy stream, with our workspace from the start */
        st = ctx_cublas_bind(ctx, (cudaStream_t)0);
    if (st == QC_OK)
        st = QC_CUDA(cudaEventCreateWithFlags(&ctx->join, cudaEventDisableTiming));
    for (int i = 0; st == QC_OK && ctx->stage && i < QC_KERNELS_CUDA_STAGING_SLOTS; i++)
        st = QC_CUDA(cudaEventCreateWithFlags(&ctx->stage_done[i], cudaEventDisableTiming));
    if (st != QC_OK) {
        ctx_free(ctx);
        return st;
    }
    ctx_live_add(ctx);
    *out = ctx;
    return QC_OK;
}

void qc_kernels_cuda_destroy(struct qc_kernels_cuda *ctx)
{
    if (!ctx)
        return;
    if (tls_ctx == ctx)
        tls_ctx = NULL;
    ctx_live_remove(ctx);
    if (cudaSetDevice(ctx->device) == cudaSuccess)
        (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    /* the handles' streams may be gone by now: rebind them to the legacy stream to be safe */
    (void)cublasSetStream(ctx->cublas, (cudaStream_t)0);
    if (ctx->cudnn)
        (void)cudnnSetStream(ctx->cudnn, (cudaStream_t)0);
    ctx_free(ctx);
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
    pthread_mutex_lock(&ctx->mu);
    if (!ctx->has_last || ctx->last_stream != stream) {
        if (ctx->has_last) {
            QC_CUDA_ASSERT(cudaEventRecord(ctx->join, ctx->last_stream));
            QC_CUDA_ASSERT(cudaStreamWaitEvent(stream, ctx->join, 0));
        }
        enum qc_status st = ctx_cublas_bind(ctx, stream);
        QC_ASSERT(st == QC_OK, "%s: binding cuBLAS to stream %p: %s", op, (void *)stream,
                  qc_error_last());
        ctx->last_stream = stream;
        ctx->has_last = true;
    }
    pthread_mutex_unlock(&ctx->mu);
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

// ---- uploads ------------------------------------------------------------------------------------

enum qc_status qc_upload_cuda(void *dst, const void *src, size_t bytes, cudaStream_t stream)
{
    if (bytes == 0)
        return QC_OK;
    struct qc_kernels_cuda *ctx = tls_ctx;
    bool staged = ctx && ctx->stage;
    if (staged) {
        struct cudaPointerAttributes attr;
        QC_TRY(QC_CUDA(cudaPointerGetAttributes(&attr, src)));
        staged = attr.type == cudaMemoryTypeUnregistered; /* pageable: stage it */
    }
    if (!staged)
        return QC_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    /* Chunks through the ring: a slot is reused once the copy that last read it is done. */
    for (size_t off = 0; off < bytes;) {
        const size_t n = bytes - off < ctx->stage_slot ? bytes - off : ctx->stage_slot;
        const unsigned int k = ctx->stage_next;
        ctx->stage_next = (k + 1) % QC_KERNELS_CUDA_STAGING_SLOTS;
        unsigned char *slot = ctx->stage + (size_t)k * ctx->stage_slot;
        QC_TRY(QC_CUDA(cudaEventSynchronize(ctx->stage_done[k]))); /* never recorded: no wait */
        memcpy(slot, (const unsigned char *)src + off, n);
        QC_TRY(QC_CUDA(
            cudaMemcpyAsync((unsigned char *)dst + off, slot, n, cudaMemcpyHostToDevice, stream)));
        QC_TRY(QC_CUDA(cudaEventRecord(ctx->stage_done[k], stream)));
        off += n;
    }
    return QC_OK;
}
