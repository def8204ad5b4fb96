/*
 * device_internal.h — what the device layer's front end (device_common.c) and its backends
 * (device_cpu.c, device_cuda.c) share. Never included outside src/base, except by
 * tests/test_device.c for the fault hook.
 *
 * Every public object starts with a common header (struct qc_device / qc_stream / qc_event
 * below); a backend embeds it as the FIRST member of its own struct and casts back. The front end
 * checks arguments, keeps the per-device stream list and live-object counts, and dispatches
 * through the device's ops table.
 *
 * Invariants:
 *   dev->n_streams == number of streams created on dev and not yet destroyed (compute excluded)
 *   dev->n_events  == number of events created on dev and not yet destroyed
 *   stream id 0 == the device's compute stream; other ids come from one process-wide counter.
 */
#ifndef QC_BASE_DEVICE_INTERNAL_H
#define QC_BASE_DEVICE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_device.h"

struct device_ops {
    void (*device_destroy)(struct qc_device *dev); /* after the compute stream is gone */
    enum qc_status (*props_get)(struct qc_device *dev, struct qc_device_props *out);
    enum qc_status (*stream_create)(struct qc_device *dev, enum qc_stream_kind kind,
                                    bool is_default, struct qc_stream **out);
    void (*stream_destroy)(struct qc_stream *s);
    enum qc_status (*stream_synchronize)(struct qc_stream *s);
    enum qc_status (*stream_wait_event)(struct qc_stream *s, struct qc_event *ev);
    enum qc_status (*stream_host_func)(struct qc_stream *s, void (*fn)(void *user), void *user);
    void *(*stream_native)(struct qc_stream *s);
    enum qc_status (*event_create)(struct qc_device *dev, struct qc_event **out);
    void (*event_destroy)(struct qc_event *ev);
    enum qc_status (*event_record)(struct qc_event *ev, struct qc_stream *s);
    enum qc_status (*event_query)(struct qc_event *ev, bool *done);
    enum qc_status (*event_synchronize)(struct qc_event *ev);
    enum qc_status (*memcpy_async)(struct qc_stream *s, void *dst, const void *src, size_t n,
                                   enum qc_copy_kind kind);
    enum qc_status (*memset_async)(struct qc_stream *s, void *dst, int byte, size_t n);
};

struct qc_device {
    enum qc_device_kind kind;
    int ordinal;
    const struct device_ops *ops;
    struct qc_stream *compute; /* the default compute stream, owned */
    pthread_mutex_t lock;      /* guards streams, n_streams, n_events, streams' sync_refs */
    pthread_cond_t unref;      /* some stream's sync_refs dropped to 0 */
    struct qc_stream *streams; /* live non-default streams, linked by next */
    int n_streams;
    int n_events;
};

struct qc_stream {
    struct qc_device *dev;
    enum qc_stream_kind kind;
    uint32_t id;            /* 0 for the compute stream */
    bool is_default;        /* the device's compute stream */
    struct qc_stream *next; /* in dev->streams */
    struct qc_stream *prev;
    int sync_refs; /* qc_device_synchronize calls holding it; destroy waits for 0 */
};

struct qc_event {
    struct qc_device *dev;
};

/* Fills the common headers (device_header.c); backends call these from their create functions. */
void device_header_init(struct qc_device *dev, enum qc_device_kind kind, int ordinal,
                        const struct device_ops *ops);
void device_header_deinit(struct qc_device *dev);
void device_stream_header_init(struct qc_stream *s, struct qc_device *dev, enum qc_stream_kind kind,
                               bool is_default);
void device_event_header_init(struct qc_event *ev, struct qc_device *dev);

/* Backend entry points. device_cuda_create exists only in CUDA builds (QC_HAVE_CUDA). */
enum qc_status device_cpu_create(int ordinal, struct qc_device **out);
enum qc_status device_cuda_create(int ordinal, struct qc_device **out);
int device_cuda_count(void);
int device_cuda_probe(int *count);
void device_cuda_set_stream_destroy_listener(void (*fn)(void *native));

/* CPU backend fault hook (tests): enqueues a command on s that fails with st and message msg
 * when the stream reaches it, as a failed copy would. On the inline stream the failure is
 * returned at once. The error becomes the stream's sticky error. */
enum qc_status device_cpu_inject_error(struct qc_stream *s, enum qc_status st, const char *msg);

#endif /* QC_BASE_DEVICE_INTERNAL_H */
