/*
 * device_common.c — the device layer's front end: kind names, argument checks, the per-device
 * stream list and live-object counts, and dispatch to the CPU or CUDA backend through the
 * device's ops table (device_internal.h).
 *
 * Programmer errors (NULL objects, a stream of another device) abort with QC_ASSERT; bad values
 * a caller may pass from user input (kind strings, ordinals, NULL buffers with n > 0) return
 * QC_ERR_INVALID with a message.
 */
#include "device_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[QC_DEVICE_KIND_COUNT] = {
    [QC_DEVICE_CPU] = "cpu",
    [QC_DEVICE_CUDA] = "cuda",
};

const char *qc_device_kind_str(enum qc_device_kind kind)
{
    if ((int)kind < 0 || kind >= QC_DEVICE_KIND_COUNT)
        return "?";
    return kind_names[kind];
}

enum qc_status qc_device_kind_parse(const char *s, enum qc_device_kind *out)
{
    QC_ASSERT(out != NULL, "qc_device_kind_parse: out is NULL");
    if (s) {
        for (int i = 0; i < QC_DEVICE_KIND_COUNT; i++) {
            if (strcmp(s, kind_names[i]) == 0) {
                *out = (enum qc_device_kind)i;
                return QC_OK;
            }
        }
    }
    return qc_errorf(QC_ERR_INVALID,
                     "device '%s' is not one of cpu, cuda\nhint: use --device cpu or --device cuda",
                     s ? s : "(null)");
}

// ---- devices ----------------------------------------------------------------------------------

int qc_device_cuda_count(void)
{
#ifdef QC_HAVE_CUDA
    return device_cuda_count();
#else
    return 0;
#endif
}

int qc_device_cuda_probe(int *count)
{
    QC_ASSERT(count != NULL, "qc_device_cuda_probe: count is NULL");
#ifdef QC_HAVE_CUDA
    return device_cuda_probe(count);
#else
    *count = 0;
    return -1;
#endif
}

void qc_device_set_stream_destroy_listener(void (*fn)(void *native))
{
#ifdef QC_HAVE_CUDA
    device_cuda_set_stream_destroy_listener(fn);
#else
    (void)fn; /* no CUDA streams to report */
#endif
}

enum qc_status qc_device_create(enum qc_device_kind kind, int ordinal, struct qc_device **out)
{
    QC_ASSERT(out != NULL, "qc_device_create: out is NULL");
    if (ordinal < 0)
        return qc_errorf(QC_ERR_INVALID, "device %s:%d: the ordinal must be >= 0",
                         qc_device_kind_str(kind), ordinal);
    struct qc_device *dev = NULL;
    switch (kind) {
    case QC_DEVICE_CPU:
        QC_TRY(device_cpu_create(ordinal, &dev));
        break;
    case QC_DEVICE_CUDA:
#ifdef QC_HAVE_CUDA
        QC_TRY(device_cuda_create(ordinal, &dev));
        break;
#else
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "device cuda: this qctrain was built without CUDA support\n"
                         "hint: rebuild with -DQC_CUDA=ON (needs the CUDA toolkit, cuDNN and "
                         "NCCL), or run with --device cpu");
#endif
    default:
        return qc_errorf(QC_ERR_INVALID, "device kind %d is not one of cpu, cuda", (int)kind);
    }
    enum qc_status st = dev->ops->stream_create(dev, QC_STREAM_COMPUTE, true, &dev->compute);
    if (st != QC_OK) {
        dev->ops->device_destroy(dev);
        return st;
    }
    *out = dev;
    return QC_OK;
}

void qc_device_destroy(struct qc_device *dev)
{
    if (!dev)
        return;
    pthread_mutex_lock(&dev->lock);
    int n_streams = dev->n_streams, n_events = dev->n_events;
    pthread_mutex_unlock(&dev->lock);
    QC_ASSERT(n_streams == 0 && n_events == 0,
              "qc_device_destroy(%s:%d): %d stream(s) and %d event(s) still alive",
              qc_device_kind_str(dev->kind), dev->ordinal, n_streams, n_events);
    dev->ops->stream_destroy(dev->compute);
    dev->compute = NULL;
    dev->ops->device_destroy(dev);
}

enum qc_device_kind qc_device_kind_of(const struct qc_device *dev)
{
    QC_ASSERT(dev != NULL, "qc_device_kind_of: dev is NULL");
    return dev->kind;
}

int qc_device_ordinal(const struct qc_device *dev)
{
    QC_ASSERT(dev != NULL, "qc_device_ordinal: dev is NULL");
    return dev->ordinal;
}

enum qc_status qc_device_props_get(struct qc_device *dev, struct qc_device_props *out)
{
    QC_ASSERT(dev != NULL && out != NULL, "qc_device_props_get: NULL argument");
    struct qc_device_props props;
    memset(&props, 0, sizeof props);
    QC_TRY(dev->ops->props_get(dev, &props));
    props.kind = dev->kind;
    *out = props;
    return QC_OK;
}

enum qc_status qc_device_synchronize(struct qc_device *dev)
{
    QC_ASSERT(dev != NULL, "qc_device_synchronize: dev is NULL");
    char first_msg[1024] = "";
    enum qc_status first = dev->ops->stream_synchronize(dev->compute);
    if (first != QC_OK)
        snprintf(first_msg, sizeof first_msg, "%s", qc_error_last());
    /* Snapshot the live streams with a reference each, then wait without the lock: a host
     * function that creates an event must not deadlock against us, and a stream destroyed
     * meanwhile stays allocated until we are done with it. */
    pthread_mutex_lock(&dev->lock);
    int n = dev->n_streams;
    struct qc_stream **snap = n > 0 ? malloc((size_t)n * sizeof *snap) : NULL;
    if (n > 0 && !snap) {
        pthread_mutex_unlock(&dev->lock);
        return qc_errorf(QC_ERR_NOMEM, "device synchronize: out of host memory");
    }
    int k = 0;
    for (struct qc_stream *s = dev->streams; s && k < n; s = s->next) {
        s->sync_refs++;
        snap[k++] = s;
    }
    pthread_mutex_unlock(&dev->lock);
    for (int i = 0; i < k; i++) {
        enum qc_status st = dev->ops->stream_synchronize(snap[i]);
        if (first == QC_OK && st != QC_OK) {
            first = st;
            snprintf(first_msg, sizeof first_msg, "%s", qc_error_last());
        }
    }
    pthread_mutex_lock(&dev->lock);
    for (int i = 0; i < k; i++)
        if (--snap[i]->sync_refs == 0)
            pthread_cond_broadcast(&dev->unref);
    pthread_mutex_unlock(&dev->lock);
    free(snap);
    if (first != QC_OK) /* a later stream's failure must not replace the first message */
        return qc_errorf(first, "%s", first_msg);
    return QC_OK;
}

// ---- streams ----------------------------------------------------------------------------------

struct qc_stream *qc_device_compute_stream(struct qc_device *dev)
{
    QC_ASSERT(dev != NULL, "qc_device_compute_stream: dev is NULL");
    return dev->compute;
}

enum qc_status qc_stream_create(struct qc_device *dev, enum qc_stream_kind kind,
                                struct qc_stream **out)
{
    QC_ASSERT(dev != NULL && out != NULL, "qc_stream_create: NULL argument");
    if (kind != QC_STREAM_COMPUTE && kind != QC_STREAM_COPY)
        return qc_errorf(QC_ERR_INVALID, "stream kind %d is not compute or copy", (int)kind);
    struct qc_stream *s = NULL;
    QC_TRY(dev->ops->stream_create(dev, kind, false, &s));
    pthread_mutex_lock(&dev->lock);
    s->next = dev->streams;
    if (dev->streams)
        dev->streams->prev = s;
    dev->streams = s;
    dev->n_streams++;
    pthread_mutex_unlock(&dev->lock);
    *out = s;
    return QC_OK;
}

void qc_stream_destroy(struct qc_stream *s)
{
    if (!s)
        return;
    QC_ASSERT(!s->is_default, "qc_stream_destroy: the compute stream belongs to its device");
    struct qc_device *dev = s->dev;
    pthread_mutex_lock(&dev->lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        dev->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    dev->n_streams--;
    while (s->sync_refs > 0) /* a qc_device_synchronize still waits on it */
        pthread_cond_wait(&dev->unref, &dev->lock);
    pthread_mutex_unlock(&dev->lock);
    dev->ops->stream_destroy(s);
}

struct qc_device *qc_stream_device(const struct qc_stream *s)
{
    QC_ASSERT(s != NULL, "qc_stream_device: s is NULL");
    return s->dev;
}

enum qc_status qc_stream_synchronize(struct qc_stream *s)
{
    QC_ASSERT(s != NULL, "qc_stream_synchronize: s is NULL");
    return s->dev->ops->stream_synchronize(s);
}

enum qc_status qc_stream_wait_event(struct qc_stream *s, struct qc_event *ev)
{
    QC_ASSERT(s != NULL && ev != NULL, "qc_stream_wait_event: NULL argument");
    QC_ASSERT(s->dev->kind == ev->dev->kind,
              "qc_stream_wait_event: a %s stream cannot wait on a %s event",
              qc_device_kind_str(s->dev->kind), qc_device_kind_str(ev->dev->kind));
    return s->dev->ops->stream_wait_event(s, ev);
}

enum qc_status qc_stream_host_func(struct qc_stream *s, void (*fn)(void *user), void *user)
{
    QC_ASSERT(s != NULL && fn != NULL, "qc_stream_host_func: NULL argument");
    return s->dev->ops->stream_host_func(s, fn, user);
}

void *qc_stream_native(struct qc_stream *s)
{
    QC_ASSERT(s != NULL, "qc_stream_native: s is NULL");
    return s->dev->ops->stream_native(s);
}

uint32_t qc_stream_id(const struct qc_stream *s)
{
    QC_ASSERT(s != NULL, "qc_stream_id: s is NULL");
    return s->id;
}

// ---- events -----------------------------------------------------------------------------------

enum qc_status qc_event_create(struct qc_device *dev, struct qc_event **out)
{
    QC_ASSERT(dev != NULL && out != NULL, "qc_event_create: NULL argument");
    struct qc_event *ev = NULL;
    QC_TRY(dev->ops->event_create(dev, &ev));
    pthread_mutex_lock(&dev->lock);
    dev->n_events++;
    pthread_mutex_unlock(&dev->lock);
    *out = ev;
    return QC_OK;
}

void qc_event_destroy(struct qc_event *ev)
{
    if (!ev)
        return;
    struct qc_device *dev = ev->dev;
    pthread_mutex_lock(&dev->lock);
    dev->n_events--;
    pthread_mutex_unlock(&dev->lock);
    dev->ops->event_destroy(ev);
}

enum qc_status qc_event_record(struct qc_event *ev, struct qc_stream *s)
{
    QC_ASSERT(ev != NULL && s != NULL, "qc_event_record: NULL argument");
    QC_ASSERT(ev->dev == s->dev,
              "qc_event_record: the event and the stream are on different devices");
    return s->dev->ops->event_record(ev, s);
}

enum qc_status qc_event_query(struct qc_event *ev, bool *done)
{
    QC_ASSERT(ev != NULL && done != NULL, "qc_event_query: NULL argument");
    return ev->dev->ops->event_query(ev, done);
}

enum qc_status qc_event_synchronize(struct qc_event *ev)
{
    QC_ASSERT(ev != NULL, "qc_event_synchronize: ev is NULL");
    return ev->dev->ops->event_synchronize(ev);
}

// ---- copies -----------------------------------------------------------------------------------

static const char *copy_kind_str(enum qc_copy_kind kind)
{
    switch (kind) {
    case QC_COPY_H2D:
        return "H2D";
    case QC_COPY_D2H:
        return "D2H";
    case QC_COPY_D2D:
        return "D2D";
    case QC_COPY_H2H:
        return "H2H";
    }
    return "?";
}

enum qc_status qc_memcpy_async(struct qc_stream *s, void *dst, const void *src, size_t n,
                               enum qc_copy_kind kind)
{
    QC_ASSERT(s != NULL, "qc_memcpy_async: s is NULL");
    if ((int)kind < QC_COPY_H2D || kind > QC_COPY_H2H)
        return qc_errorf(QC_ERR_INVALID,
                         "copy of %zu bytes: copy kind %d is not H2D, D2H, D2D or H2H", n,
                         (int)kind);
    if (n == 0)
        return QC_OK;
    if (!dst || !src)
        return qc_errorf(QC_ERR_INVALID, "%s copy of %zu bytes on stream %u: %s pointer is NULL",
                         copy_kind_str(kind), n, s->id, !dst ? "destination" : "source");
    return s->dev->ops->memcpy_async(s, dst, src, n, kind);
}

enum qc_status qc_memset_async(struct qc_stream *s, void *dst, int byte, size_t n)
{
    QC_ASSERT(s != NULL, "qc_memset_async: s is NULL");
    if (n == 0)
        return QC_OK;
    if (!dst)
        return qc_errorf(QC_ERR_INVALID, "memset of %zu bytes on stream %u: destination is NULL", n,
                         s->id);
    return s->dev->ops->memset_async(s, dst, byte, n);
}
