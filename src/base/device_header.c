/*
 * device_header.c — the parts of a device, stream and event every backend shares
 * (device_internal.h): the backends (device_cpu.c, device_cuda.c) fill them from their create
 * functions, and the front end (device_common.c) reads them. Their own file, below both: the
 * front end dispatches to the backends, and the backends call these.
 */
#include "device_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* Stream ids 1, 2, ... in creation order over the whole process; 0 is every compute stream. */
static atomic_uint_fast32_t next_stream_id = 1;

void device_header_init(struct qc_device *dev, enum qc_device_kind kind, int ordinal,
                        const struct device_ops *ops)
{
    memset(dev, 0, sizeof *dev);
    dev->kind = kind;
    dev->ordinal = ordinal;
    dev->ops = ops;
    pthread_mutex_init(&dev->lock, NULL);
    pthread_cond_init(&dev->unref, NULL);
}

void device_header_deinit(struct qc_device *dev)
{
    pthread_cond_destroy(&dev->unref);
    pthread_mutex_destroy(&dev->lock);
}

void device_stream_header_init(struct qc_stream *s, struct qc_device *dev, enum qc_stream_kind kind,
                               bool is_default)
{
    memset(s, 0, sizeof *s);
    s->dev = dev;
    s->kind = kind;
    s->is_default = is_default;
    s->id = is_default ? 0 : (uint32_t)atomic_fetch_add(&next_stream_id, 1);
}

void device_event_header_init(struct qc_event *ev, struct qc_device *dev)
{
    ev->dev = dev;
}
