/*
 * device_cuda.c — the CUDA backend of the device layer (compiled only when QC_HAVE_CUDA).
 *
 * Host C code over the CUDA runtime API; every call is checked with QC_CUDA. A qc_stream wraps a
 * cudaStream_t created with cudaStreamNonBlocking (so no stream serialises against the legacy
 * default stream), including the device's compute stream. A qc_event wraps a cudaEvent_t with
 * timing disabled. Copies are cudaMemcpyAsync with the kind given; host functions are
 * cudaLaunchHostFunc. Calls that create resources first make the device current. A destroyed
 * stream is reported to the stream-destroy listener (qc_device.h) once it has drained.
 */
#include "device_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_cuda_check.h"

struct cuda_device {
    struct qc_device base; /* must be first */
};

struct cuda_stream {
    struct qc_stream base; /* must be first */
    cudaStream_t stream;
};

struct cuda_event {
    struct qc_event base; /* must be first */
    cudaEvent_t event;
};

static const struct device_ops cuda_ops;

static cudaStream_t native_stream(struct qc_stream *s)
{
    return ((struct cuda_stream *)s)->stream;
}

static cudaEvent_t native_event(struct qc_event *ev)
{
    return ((struct cuda_event *)ev)->event;
}

static enum qc_status make_current(const struct qc_device *dev)
{
    return QC_CUDA(cudaSetDevice(dev->ordinal));
}

int device_cuda_count(void)
{
    int n = 0;
    (void)device_cuda_probe(&n);
    return n;
}

int device_cuda_probe(int *count)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky; do not leave it for the next check */
        n = 0;
    }
    *count = n;
    return (int)err;
}

// ---- stream-destroy listener ------------------------------------------------------------------

static _Atomic(void (*)(void *)) stream_destroy_listener;

void device_cuda_set_stream_destroy_listener(void (*fn)(void *native))
{
    atomic_store(&stream_destroy_listener, fn);
}

// ---- device ---------------------------------------------------------------------------------

enum qc_status device_cuda_create(int ordinal, struct qc_device **out)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return qc_errorf(
            QC_ERR_UNSUPPORTED,
            "device cuda:%d: no usable CUDA device: cudaGetDeviceCount failed: %s (%s)\n"
            "hint: check the NVIDIA driver with nvidia-smi, or run with --device cpu",
            ordinal, cudaGetErrorString(err), cudaGetErrorName(err));
    }
    if (n == 0)
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "device cuda:%d: no CUDA device is present\n"
                         "hint: check the NVIDIA driver with nvidia-smi, or run with --device cpu",
                         ordinal);
    if (ordinal >= n)
        return qc_errorf(
            QC_ERR_INVALID,
            "device cuda:%d: out of range, %d CUDA device%s visible\n"
            "hint: use an ordinal below %d (CUDA_VISIBLE_DEVICES limits what is visible)",
            ordinal, n, n == 1 ? " is" : "s are", n);
    QC_TRY(QC_CUDA(cudaSetDevice(ordinal)));
    struct cuda_device *d = calloc(1, sizeof *d);
    if (!d)
        return qc_errorf(QC_ERR_NOMEM, "cuda device: out of host memory");
    device_header_init(&d->base, QC_DEVICE_CUDA, ordinal, &cuda_ops);
    *out = &d->base;
    return QC_OK;
}

static void cuda_device_destroy(struct qc_device *dev)
{
    device_header_deinit(dev);
    free((struct cuda_device *)dev);
}

static enum qc_status cuda_props_get(struct qc_device *dev, struct qc_device_props *out)
{
    struct cudaDeviceProp prop;
    QC_TRY(make_current(dev));
    QC_TRY(QC_CUDA(cudaGetDeviceProperties(&prop, dev->ordinal)));
    size_t free_b = 0, total_b = 0;
    QC_TRY(QC_CUDA(cudaMemGetInfo(&free_b, &total_b)));
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->total_bytes = total_b;
    out->free_bytes = free_b;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->multiprocessors = prop.multiProcessorCount;
    return QC_OK;
}

// ---- streams ----------------------------------------------------------------------------------

static enum qc_status cuda_stream_create(struct qc_device *dev, enum qc_stream_kind kind,
                                         bool is_default, struct qc_stream **out)
{
    QC_TRY(make_current(dev));
    struct cuda_stream *s = calloc(1, sizeof *s);
    if (!s)
        return qc_errorf(QC_ERR_NOMEM, "cuda stream: out of host memory");
    enum qc_status st = QC_CUDA(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    if (st != QC_OK) {
        free(s);
        return st;
    }
    device_stream_header_init(&s->base, dev, kind, is_default);
    *out = &s->base;
    return QC_OK;
}

static void cuda_stream_destroy(struct qc_stream *base)
{
    struct cuda_stream *s = (struct cuda_stream *)base;
    /* Drain first (the contract), then release; a sticky error here is logged, not lost. */
    if (QC_CUDA(cudaStreamSynchronize(s->stream)) != QC_OK)
        qc_log(QC_LOG_WARN, "destroying stream %u: %s", base->id, qc_error_last());
    void (*forget)(void *) = atomic_load(&stream_destroy_listener);
    if (forget) /* drained: nothing of it is pending that a cached handle would order after */
        forget((void *)s->stream);
    if (QC_CUDA(cudaStreamDestroy(s->stream)) != QC_OK)
        qc_log(QC_LOG_WARN, "destroying stream %u: %s", base->id, qc_error_last());
    free(s);
}

static enum qc_status cuda_stream_synchronize(struct qc_stream *s)
{
    return QC_CUDA(cudaStreamSynchronize(native_stream(s)));
}

static enum qc_status cuda_stream_wait_event(struct qc_stream *s, struct qc_event *ev)
{
    return QC_CUDA(cudaStreamWaitEvent(native_stream(s), native_event(ev), 0));
}

static enum qc_status cuda_stream_host_func(struct qc_stream *s, void (*fn)(void *user), void *user)
{
    return QC_CUDA(cudaLaunchHostFunc(native_stream(s), fn, user));
}

static void *cuda_stream_native(struct qc_stream *s)
{
    return (void *)native_stream(s);
}

// ---- events -----------------------------------------------------------------------------------

static enum qc_status cuda_event_create(struct qc_device *dev, struct qc_event **out)
{
    QC_TRY(make_current(dev));
    struct cuda_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return qc_errorf(QC_ERR_NOMEM, "cuda event: out of host memory");
    enum qc_status st = QC_CUDA(cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming));
    if (st != QC_OK) {
        free(ev);
        return st;
    }
    device_event_header_init(&ev->base, dev);
    *out = &ev->base;
    return QC_OK;
}

static void cuda_event_destroy(struct qc_event *base)
{
    struct cuda_event *ev = (struct cuda_event *)base;
    if (QC_CUDA(cudaEventDestroy(ev->event)) != QC_OK)
        qc_log(QC_LOG_WARN, "destroying an event: %s", qc_error_last());
    free(ev);
}

static enum qc_status cuda_event_record(struct qc_event *ev, struct qc_stream *s)
{
    return QC_CUDA(cudaEventRecord(native_event(ev), native_stream(s)));
}

static enum qc_status cuda_event_query(struct qc_event *ev, bool *done)
{
    cudaError_t err = cudaEventQuery(native_event(ev));
    if (err == cudaErrorNotReady) {
        /* Not an error; clear it in case the runtime recorded it as the last error, so the
         * launchers' cudaGetLastError() checks do not trip on it (as PyTorch does). */
        (void)cudaGetLastError();
        *done = false;
        return QC_OK;
    }
    QC_TRY(QC_CUDA(err));
    *done = true;
    return QC_OK;
}

static enum qc_status cuda_event_synchronize(struct qc_event *ev)
{
    return QC_CUDA(cudaEventSynchronize(native_event(ev)));
}

// ---- copies -----------------------------------------------------------------------------------

static enum cudaMemcpyKind cuda_copy_kind(enum qc_copy_kind kind)
{
    switch (kind) {
    case QC_COPY_H2D:
        return cudaMemcpyHostToDevice;
    case QC_COPY_D2H:
        return cudaMemcpyDeviceToHost;
    case QC_COPY_D2D:
        return cudaMemcpyDeviceToDevice;
    case QC_COPY_H2H:
        return cudaMemcpyHostToHost;
    }
    return cudaMemcpyDefault;
}

static enum qc_status cuda_memcpy_async(struct qc_stream *s, void *dst, const void *src, size_t n,
                                        enum qc_copy_kind kind)
{
    return QC_CUDA(cudaMemcpyAsync(dst, src, n, cuda_copy_kind(kind), native_stream(s)));
}

static enum qc_status cuda_memset_async(struct qc_stream *s, void *dst, int byte, size_t n)
{
    return QC_CUDA(cudaMemsetAsync(dst, byte, n, native_stream(s)));
}

static const struct device_ops cuda_ops = {
    .device_destroy = cuda_device_destroy,
    .props_get = cuda_props_get,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_wait_event = cuda_stream_wait_event,
    .stream_host_func = cuda_stream_host_func,
    .stream_native = cuda_stream_native,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .memcpy_async = cuda_memcpy_async,
    .memset_async = cuda_memset_async,
};
