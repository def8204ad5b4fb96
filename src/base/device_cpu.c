/*
 * device_cpu.c — the CPU backend of the device layer.
 *
 * The device's compute stream is inline: each command runs in the calling thread before the
 * call returns. Every other stream is a worker thread draining a FIFO of commands (copy,
 * memset, host function, event record, event wait, injected fault) in enqueue order, or, when
 * created after qc_device_cpu_set_inline_streams(dev, true), inline as well.
 *
 * Events carry generations. Recording assigns the next generation (gen_recorded + 1) and the
 * record command, when its stream reaches it, raises gen_done to at least that generation.
 * Query, synchronize and wait capture gen_recorded at call time and wait for
 * gen_done >= captured, so re-recording an event never confuses an earlier waiter, and a
 * never-recorded event (gen_recorded == 0) is complete.
 *
 * Glossary:
 *   enqueued/completed  per-stream command counters; synchronize waits for completed >= the
 *                       enqueued count it saw on entry.
 *   sticky error        the first failing command's status and message; every later
 *                       synchronize of the stream returns it.
 *   refs                an event is freed when its owner destroyed it AND no queued command
 *                       names it (destroying an event with pending work is allowed, as in CUDA).
 */
#include "device_internal.h"
#include "qc_emu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#define CPU_ERR_MSG_MAX 1024

struct cpu_event {
    struct qc_event base; /* must be first */
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* signalled when gen_done grows */
    uint64_t gen_recorded; /* generations handed out by record */
    uint64_t gen_done;     /* highest completed generation; gen_done <= gen_recorded */
    int refs;              /* owner (1 until destroy) + queued commands naming the event */
};

enum cpu_cmd_type { CMD_COPY, CMD_MEMSET, CMD_HOST_FUNC, CMD_RECORD, CMD_WAIT, CMD_FAIL };

struct cpu_cmd {
    struct cpu_cmd *next;
    enum cpu_cmd_type type;
    union {
        struct {
            void *dst;
            const void *src;
            size_t n;
        } copy;
        struct {
            void *dst;
            int byte;
            size_t n;
        } set;
        struct {
            void (*fn)(void *user);
            void *user;
        } host;
        struct {
            struct cpu_event *ev;
            uint64_t gen; /* RECORD: generation to complete; WAIT: generation to wait for */
        } event;
        struct {
            enum qc_status st;
            char *msg; /* malloc'd */
        } fail;
    } u;
};

struct cpu_stream {
    struct qc_stream base; /* must be first */
    bool worker;           /* false: the inline compute stream */
    pthread_t thread;
    pthread_mutex_t mu;     /* guards everything below */
    pthread_cond_t cv_work; /* queue non-empty or stopping */
    pthread_cond_t cv_done; /* completed grew */
    struct cpu_cmd *head;   /* FIFO, popped by the worker */
    struct cpu_cmd *tail;
    struct cpu_cmd *free_cmds; /* recycled command nodes */
    uint64_t enqueued;         /* commands ever enqueued */
    uint64_t completed;        /* commands ever completed; completed <= enqueued */
    bool stopping;
    enum qc_status err; /* sticky first error */
    char err_msg[CPU_ERR_MSG_MAX];
};

struct cpu_device {
    struct qc_device base; /* must be first */
    struct qc_emu *emu;    /* copies and memsets open this arena (qc_device_cpu_set_emu) */
    bool inline_streams;   /* new streams run inline (qc_device_cpu_set_inline_streams) */
};

static const struct device_ops cpu_ops;

static struct cpu_stream *cpu_stream_of(struct qc_stream *s)
{
    return (struct cpu_stream *)s;
}

static struct cpu_event *cpu_event_of(struct qc_event *ev)
{
    return (struct cpu_event *)ev;
}

// ---- events ----------------------------------------------------------------------------------

static void event_unref(struct cpu_event *ev)
{
    pthread_mutex_lock(&ev->mu);
    int left = --ev->refs;
    pthread_mutex_unlock(&ev->mu);
    if (left == 0) {
        pthread_cond_destroy(&ev->cv);
        pthread_mutex_destroy(&ev->mu);
        free(ev);
    }
}

/* Marks generation gen complete (gen_done only grows: an older record finishing after a newer
 * one changes nothing). */
static void event_complete(struct cpu_event *ev, uint64_t gen)
{
    pthread_mutex_lock(&ev->mu);
    if (gen > ev->gen_done) {
        ev->gen_done = gen;
        pthread_cond_broadcast(&ev->cv);
    }
    pthread_mutex_unlock(&ev->mu);
}

static void event_wait_gen(struct cpu_event *ev, uint64_t gen)
{
    pthread_mutex_lock(&ev->mu);
    while (ev->gen_done < gen)
        pthread_cond_wait(&ev->cv, &ev->mu);
    pthread_mutex_unlock(&ev->mu);
}

static enum qc_status cpu_event_create(struct qc_device *dev, struct qc_event **out)
{
    struct cpu_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return qc_errorf(QC_ERR_NOMEM, "cpu event: out of host memory");
    device_event_header_init(&ev->base, dev);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    ev->refs = 1;
    *out = &ev->base;
    return QC_OK;
}

static void cpu_event_destroy(struct qc_event *ev)
{
    event_unref(cpu_event_of(ev));
}

static enum qc_status cpu_event_query(struct qc_event *base, bool *done)
{
    struct cpu_event *ev = cpu_event_of(base);
    pthread_mutex_lock(&ev->mu);
    *done = ev->gen_done >= ev->gen_recorded;
    pthread_mutex_unlock(&ev->mu);
    return QC_OK;
}

static enum qc_status cpu_event_synchronize(struct qc_event *base)
{
    struct cpu_event *ev = cpu_event_of(base);
    pthread_mutex_lock(&ev->mu);
    uint64_t gen = ev->gen_recorded;
    pthread_mutex_unlock(&ev->mu);
    event_wait_gen(ev, gen);
    return QC_OK;
}

// ---- commands ---------------------------------------------------------------------------------

/* Runs one command of stream s in the current thread; a failure records the message
 * (thread-local). Copies and memsets open the device's emulated arena, if it has one. */
static enum qc_status cmd_run(const struct cpu_stream *s, struct cpu_cmd *c)
{
    struct qc_emu *emu = ((const struct cpu_device *)s->base.dev)->emu;
    switch (c->type) {
    case CMD_COPY:
        if (emu)
            qc_emu_enter(emu);
        memcpy(c->u.copy.dst, c->u.copy.src, c->u.copy.n);
        if (emu)
            qc_emu_leave(emu);
        return QC_OK;
    case CMD_MEMSET:
        if (emu)
            qc_emu_enter(emu);
        memset(c->u.set.dst, c->u.set.byte, c->u.set.n);
        if (emu)
            qc_emu_leave(emu);
        return QC_OK;
    case CMD_HOST_FUNC:
        c->u.host.fn(c->u.host.user);
        return QC_OK;
    case CMD_RECORD:
        event_complete(c->u.event.ev, c->u.event.gen);
        return QC_OK;
    case CMD_WAIT:
        event_wait_gen(c->u.event.ev, c->u.event.gen);
        return QC_OK;
    case CMD_FAIL:
        return qc_errorf(c->u.fail.st, "%s", c->u.fail.msg ? c->u.fail.msg : "injected fault");
    }
    return QC_OK;
}

/* Releases what a finished command holds (event references, messages). */
static void cmd_release(struct cpu_cmd *c)
{
    if (c->type == CMD_RECORD || c->type == CMD_WAIT)
        event_unref(c->u.event.ev);
    else if (c->type == CMD_FAIL)
        free(c->u.fail.msg);
}

/* Keeps the first error of s; called with s->mu held. */
static void stream_note_error_locked(struct cpu_stream *s, enum qc_status st, const char *msg)
{
    if (st == QC_OK || s->err != QC_OK)
        return;
    s->err = st;
    snprintf(s->err_msg, sizeof s->err_msg, "stream %u: %s", s->base.id, msg);
}

static void *worker_main(void *arg)
{
    struct cpu_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cv_work, &s->mu);
        if (!s->head)
            break; /* stopping and drained */
        struct cpu_cmd *c = s->head;
        s->head = c->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);

        enum qc_status st = cmd_run(s, c);
        cmd_release(c);

        pthread_mutex_lock(&s->mu);
        stream_note_error_locked(s, st, qc_error_last());
        c->next = s->free_cmds;
        s->free_cmds = c;
        s->completed++;
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* A command node for s (recycled when possible); NULL when out of memory. */
static struct cpu_cmd *cmd_alloc(struct cpu_stream *s)
{
    pthread_mutex_lock(&s->mu);
    struct cpu_cmd *c = s->free_cmds;
    if (c)
        s->free_cmds = c->next;
    pthread_mutex_unlock(&s->mu);
    if (!c)
        c = malloc(sizeof *c);
    if (c)
        memset(c, 0, sizeof *c);
    return c;
}

/* Runs c now (inline stream) or appends it to the worker's FIFO. Takes ownership of c. */
static enum qc_status stream_submit(struct cpu_stream *s, struct cpu_cmd *c)
{
    if (!s->worker) {
        enum qc_status st = cmd_run(s, c);
        cmd_release(c);
        free(c);
        if (st != QC_OK) {
            pthread_mutex_lock(&s->mu);
            stream_note_error_locked(s, st, qc_error_last());
            pthread_mutex_unlock(&s->mu);
        }
        return st;
    }
    pthread_mutex_lock(&s->mu);
    c->next = NULL;
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    s->enqueued++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return QC_OK;
}

static enum qc_status cmd_nomem(const struct cpu_stream *s, const char *what)
{
    return qc_errorf(QC_ERR_NOMEM, "stream %u: out of host memory queueing a %s", s->base.id, what);
}

// ---- streams ----------------------------------------------------------------------------------

static enum qc_status cpu_stream_create(struct qc_device *dev, enum qc_stream_kind kind,
                                        bool is_default, struct qc_stream **out)
{
    struct cpu_stream *s = calloc(1, sizeof *s);
    if (!s)
        return qc_errorf(QC_ERR_NOMEM, "cpu stream: out of host memory");
    device_stream_header_init(&s->base, dev, kind, is_default);
    s->worker = !is_default && !((struct cpu_device *)dev)->inline_streams;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    if (s->worker) {
        int rc = pthread_create(&s->thread, NULL, worker_main, s);
        if (rc != 0) {
            pthread_cond_destroy(&s->cv_done);
            pthread_cond_destroy(&s->cv_work);
            pthread_mutex_destroy(&s->mu);
            free(s);
            return qc_errorf(QC_ERR_NOMEM,
                             "cpu stream: pthread_create failed: %s\n"
                             "hint: too many threads? destroy streams you no longer use",
                             strerror(rc));
        }
        char name[16];
        snprintf(name, sizeof name, "qc-stream-%u", s->base.id);
        pthread_setname_np(s->thread, name);
    }
    *out = &s->base;
    return QC_OK;
}

static void cpu_stream_destroy(struct qc_stream *base)
{
    struct cpu_stream *s = cpu_stream_of(base);
    if (s->worker) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL); /* the worker drains the FIFO before it exits */
    }
    while (s->free_cmds) {
        struct cpu_cmd *c = s->free_cmds;
        s->free_cmds = c->next;
        free(c);
    }
    pthread_cond_destroy(&s->cv_done);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static enum qc_status cpu_stream_synchronize(struct qc_stream *base)
{
    struct cpu_stream *s = cpu_stream_of(base);
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->enqueued;
    while (s->completed < target)
        pthread_cond_wait(&s->cv_done, &s->mu);
    enum qc_status st = s->err;
    char msg[CPU_ERR_MSG_MAX];
    if (st != QC_OK)
        memcpy(msg, s->err_msg, sizeof msg);
    pthread_mutex_unlock(&s->mu);
    if (st != QC_OK)
        return qc_errorf(st, "%s", msg);
    return QC_OK;
}

static enum qc_status cpu_stream_wait_event(struct qc_stream *base, struct qc_event *evb)
{
    struct cpu_stream *s = cpu_stream_of(base);
    struct cpu_event *ev = cpu_event_of(evb);
    pthread_mutex_lock(&ev->mu);
    uint64_t gen = ev->gen_recorded;
    bool done = ev->gen_done >= gen;
    pthread_mutex_unlock(&ev->mu);
    if (done)
        return QC_OK; /* nothing to wait for (also: never recorded) */
    if (!s->worker) {
        event_wait_gen(ev, gen);
        return QC_OK;
    }
    struct cpu_cmd *c = cmd_alloc(s);
    if (!c)
        return cmd_nomem(s, "event wait");
    pthread_mutex_lock(&ev->mu);
    ev->refs++;
    pthread_mutex_unlock(&ev->mu);
    c->type = CMD_WAIT;
    c->u.event.ev = ev;
    c->u.event.gen = gen;
    return stream_submit(s, c);
}

static enum qc_status cpu_stream_host_func(struct qc_stream *base, void (*fn)(void *user),
                                           void *user)
{
    struct cpu_stream *s = cpu_stream_of(base);
    if (!s->worker) {
        fn(user);
        return QC_OK;
    }
    struct cpu_cmd *c = cmd_alloc(s);
    if (!c)
        return cmd_nomem(s, "host function");
    c->type = CMD_HOST_FUNC;
    c->u.host.fn = fn;
    c->u.host.user = user;
    return stream_submit(s, c);
}

static void *cpu_stream_native(struct qc_stream *s)
{
    (void)s;
    return NULL;
}

static enum qc_status cpu_event_record(struct qc_event *evb, struct qc_stream *base)
{
    struct cpu_stream *s = cpu_stream_of(base);
    struct cpu_event *ev = cpu_event_of(evb);
    struct cpu_cmd *c = NULL;
    if (s->worker) {
        /* Allocate first: a generation handed out must always complete, or waiters hang. */
        c = cmd_alloc(s);
        if (!c)
            return cmd_nomem(s, "event record");
    }
    pthread_mutex_lock(&ev->mu);
    uint64_t gen = ++ev->gen_recorded;
    if (c)
        ev->refs++;
    pthread_mutex_unlock(&ev->mu);
    if (!c) {
        event_complete(ev, gen); /* inline: everything enqueued so far has already run */
        return QC_OK;
    }
    c->type = CMD_RECORD;
    c->u.event.ev = ev;
    c->u.event.gen = gen;
    return stream_submit(s, c);
}

// ---- copies -----------------------------------------------------------------------------------

static enum qc_status cpu_memcpy_async(struct qc_stream *base, void *dst, const void *src, size_t n,
                                       enum qc_copy_kind kind)
{
    (void)kind; /* on the CPU every kind is a memcpy */
    struct cpu_stream *s = cpu_stream_of(base);
    uintptr_t d = (uintptr_t)dst, r = (uintptr_t)src;
    if (d < r + n && r < d + n)
        return qc_errorf(QC_ERR_INVALID,
                         "copy of %zu bytes on stream %u: source %p and destination %p overlap", n,
                         s->base.id, src, dst);
    struct cpu_cmd *c = cmd_alloc(s);
    if (!c)
        return cmd_nomem(s, "copy");
    c->type = CMD_COPY;
    c->u.copy.dst = dst;
    c->u.copy.src = src;
    c->u.copy.n = n;
    return stream_submit(s, c);
}

static enum qc_status cpu_memset_async(struct qc_stream *base, void *dst, int byte, size_t n)
{
    struct cpu_stream *s = cpu_stream_of(base);
    struct cpu_cmd *c = cmd_alloc(s);
    if (!c)
        return cmd_nomem(s, "memset");
    c->type = CMD_MEMSET;
    c->u.set.dst = dst;
    c->u.set.byte = byte;
    c->u.set.n = n;
    return stream_submit(s, c);
}

enum qc_status device_cpu_inject_error(struct qc_stream *base, enum qc_status st, const char *msg)
{
    QC_ASSERT(base != NULL && base->dev->kind == QC_DEVICE_CPU,
              "device_cpu_inject_error: needs a CPU stream");
    struct cpu_stream *s = cpu_stream_of(base);
    struct cpu_cmd *c = cmd_alloc(s);
    if (!c)
        return cmd_nomem(s, "fault");
    c->type = CMD_FAIL;
    c->u.fail.st = st;
    c->u.fail.msg = msg ? strdup(msg) : NULL;
    return stream_submit(s, c);
}

// ---- device -----------------------------------------------------------------------------------

void qc_host_cpu_model(char *buf, size_t n)
{
    buf[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0)
                continue;
            const char *colon = strchr(line, ':');
            if (!colon)
                continue;
            colon++;
            while (*colon == ' ' || *colon == '\t')
                colon++;
            snprintf(buf, n, "%s", colon);
            size_t len = strlen(buf);
            while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
                buf[--len] = '\0';
            break;
        }
        fclose(f);
    }
    if (buf[0] == '\0') {
        struct utsname u;
        snprintf(buf, n, "%s", uname(&u) == 0 ? u.machine : "unknown");
    }
}

/* MemAvailable from /proc/meminfo in bytes; 0 when unavailable. */
static size_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    size_t bytes = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kib;
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            bytes = (size_t)kib * 1024;
            break;
        }
    }
    fclose(f);
    return bytes;
}

static enum qc_status cpu_props_get(struct qc_device *dev, struct qc_device_props *out)
{
    (void)dev;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long page = sysconf(_SC_PAGESIZE);
    long pages = sysconf(_SC_PHYS_PAGES);
    char model[160];
    qc_host_cpu_model(model, sizeof model);
    out->multiprocessors = cpus > 0 ? (int)cpus : 1;
    snprintf(out->name, sizeof out->name, "cpu (%s, %d thread%s)", model, out->multiprocessors,
             out->multiprocessors == 1 ? "" : "s");
    out->total_bytes = page > 0 && pages > 0 ? (size_t)page * (size_t)pages : 0;
    out->free_bytes = meminfo_available();
    if (out->free_bytes == 0) {
        long avail = sysconf(_SC_AVPHYS_PAGES);
        out->free_bytes = page > 0 && avail > 0 ? (size_t)page * (size_t)avail : 0;
    }
    out->cc_major = 0;
    out->cc_minor = 0;
    return QC_OK;
}

static void cpu_device_destroy(struct qc_device *dev)
{
    device_header_deinit(dev);
    free((struct cpu_device *)dev);
}

void qc_device_cpu_set_emu(struct qc_device *dev, struct qc_emu *emu)
{
    QC_ASSERT(dev && dev->kind == QC_DEVICE_CPU, "qc_device_cpu_set_emu: not a CPU device");
    ((struct cpu_device *)dev)->emu = emu;
}

void qc_device_cpu_set_inline_streams(struct qc_device *dev, bool on)
{
    QC_ASSERT(dev && dev->kind == QC_DEVICE_CPU,
              "qc_device_cpu_set_inline_streams: not a CPU device");
    ((struct cpu_device *)dev)->inline_streams = on;
}

enum qc_status device_cpu_create(int ordinal, struct qc_device **out)
{
    struct cpu_device *d = calloc(1, sizeof *d);
    if (!d)
        return qc_errorf(QC_ERR_NOMEM, "cpu device: out of host memory");
    device_header_init(&d->base, QC_DEVICE_CPU, ordinal, &cpu_ops);
    *out = &d->base;
    return QC_OK;
}

static const struct device_ops cpu_ops = {
    .device_destroy = cpu_device_destroy,
    .props_get = cpu_props_get,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_synchronize,
    .stream_wait_event = cpu_stream_wait_event,
    .stream_host_func = cpu_stream_host_func,
    .stream_native = cpu_stream_native,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .memcpy_async = cpu_memcpy_async,
    .memset_async = cpu_memset_async,
};
