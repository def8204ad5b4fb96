/*
 * offload.c — the engine: capability probe and fallback ladder, put / get / release, the
 * staging ring's creation and the write and copy completions (the handle table and the slots
 * are staging.c's, the reads prefetch.c's).
 *
 * NVMe put of a handle with n blocks, per block i:
 *   caller:       take a free slot (waits while the ring is full: a put stall), enqueue on the
 *                 copy stream: D2H src[i] -> slot, then write_hand_off(slot)
 *   copy stream:  write_hand_off: xxh3 of the block, zero the O_DIRECT padding, submit the write
 *   backend:      write_done: block ON_DISK (or FAILED with the error), slot back to the ring
 * NVMe get, per block i: issue reads for unread blocks while slots are free (prefetch may have
 * done so already), wait until block i is READY (a stall), enqueue on the caller's stream:
 * H2D slot -> dst[i], then get_copy_done(slot), which gives the slot back. read_done verifies
 * the checksum before a block can become READY, so an unverified byte never reaches dst.
 * Host-tier put/get are one D2H / H2D each; the copy-out is ordered after the caller's stream
 * with an event, the copy-in after the copy-out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload_internal.h"
#include "qc_pinned.h"
#include "qc_prof.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void qc_offload_params_default(struct qc_offload_params *p)
{
    memset(p, 0, sizeof *p);
    p->host_capacity = GIB;
    p->nvme_dir = NULL;
    p->nvme_capacity = 4 * GIB;
    p->nvme_initial = 0;
    p->nvme_grow_step = 64 * MIB;
    p->queue_depth = 16;
    p->block_size = MIB;
    p->max_inflight = 64 * MIB;
    p->prefetch_window = 64 * MIB;
    p->prefetch_count = 0;
    p->direct = true;
    p->register_buffers = true;
    p->spill_visible = false;
    p->force_rung = QC_OFFLOAD_RUNG_AUTO;
}

const char *qc_offload_rung_str(enum qc_offload_rung rung)
{
    switch (rung) {
    case QC_OFFLOAD_RUNG_AUTO:
        return "auto";
    case QC_OFFLOAD_RUNG_URING_DIRECT:
        return "io_uring+O_DIRECT";
    case QC_OFFLOAD_RUNG_URING_BUFFERED:
        return "io_uring buffered";
    case QC_OFFLOAD_RUNG_THREADS:
        return "thread pool pread/pwrite";
    case QC_OFFLOAD_RUNG_HOST_ONLY:
        return "host tier only";
    case QC_OFFLOAD_RUNG_COUNT:
        break;
    }
    return "?";
}

enum qc_offload_rung qc_offload_rung_active(const struct qc_offload *o)
{
    return o->rung;
}

enum qc_status qc_offload_nvme_reserve(struct qc_offload *o, uint64_t bytes)
{
    if (!o || o->nvme.fd < 0 || !o->io)
        return QC_OK;
    pthread_mutex_lock(&o->mu);
    const enum qc_status st = offload_nvme_reserve(&o->nvme, bytes);
    pthread_mutex_unlock(&o->mu);
    return st;
}

uint64_t qc_offload_nvme_limit(struct qc_offload *o)
{
    if (!o || o->nvme.fd < 0 || !o->io)
        return 0;
    pthread_mutex_lock(&o->mu);
    const uint64_t cap = o->nvme.capacity;
    pthread_mutex_unlock(&o->mu);
    return cap;
}

const char *qc_offload_nvme_unusable(const struct qc_offload *o)
{
    return o->nvme_unusable;
}

bool qc_offload_registered(const struct qc_offload *o)
{
    return o->io && o->io->registered;
}

struct qc_stream *qc_offload_copy_stream(struct qc_offload *o)
{
    return o->copy;
}

const char *qc_offload_spill_path(const struct qc_offload *o)
{
    return o->nvme.fd >= 0 ? o->nvme.path : "";
}

// ---- completions ---------------------------------------------------------------------------

static void write_done(struct offload_io *io)
{
    struct offload_slot *s = io->user;
    struct qc_offload *o = s->o;
    pthread_mutex_lock(&o->mu);
    struct offload_chunk *c = s->chunk;
    struct offload_handle *h = c->h;
    if (io->res != 0) {
        offload_chunk_fail_io(o, c, io);
    } else {
        c->state = CHUNK_ON_DISK;
        o->st.bytes_written += c->len;
    }
    offload_slot_give_back(o, c);
    h->writes_left--;
    o->writes_inflight--;
    if (h->writes_left == 0)
        offload_prefetch_wanted(o, h);
    offload_prefetch_pump(o);
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Runs on the copy stream once the block is in the slot. */
static void write_hand_off(void *arg)
{
    struct offload_slot *s = arg;
    struct qc_offload *o = s->o;
    struct offload_chunk *c = s->chunk;
    size_t len = offload_chunk_io_len(o, c);
    c->sum = offload_checksum(s->buf, c->len);
    if (len > c->len)
        memset(s->buf + c->len, 0, len - c->len);
    s->io = (struct offload_io){.op = OFFLOAD_WRITE,
                                .buf = s->buf,
                                .len = len,
                                .off = offload_chunk_file_off(o, c),
                                .complete = write_done,
                                .user = s};
    o->io->submit(o->io, &s->io);
}

/* Runs on the get's stream once the block has been copied out of the slot. */
static void get_copy_done(void *arg)
{
    struct offload_slot *s = arg;
    struct qc_offload *o = s->o;
    pthread_mutex_lock(&o->mu);
    struct offload_chunk *c = s->chunk;
    c->state = CHUNK_ON_DISK;
    offload_slot_give_back(o, c);
    offload_prefetch_pump(o);
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Runs on the get's stream once a host-tier copy-in is done. */
static void host_copy_done(void *arg)
{
    struct offload_handle *h = arg;
    struct qc_offload *o = h->o;
    pthread_mutex_lock(&o->mu);
    h->busy--;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

// ---- create / destroy ----------------------------------------------------------------------

static enum qc_status params_check(const struct qc_offload_params *p)
{
    if (p->block_size == 0 || p->block_size % OFFLOAD_ALIGN != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "offload: block_size %zu is not a positive multiple of 4096\n"
                         "hint: use 1M",
                         p->block_size);
    if (p->queue_depth < 1 || p->queue_depth > 4096)
        return qc_errorf(QC_ERR_INVALID, "offload: queue_depth %d is outside 1..4096",
                         p->queue_depth);
    if (p->max_inflight / p->block_size < 2 || p->max_inflight / p->block_size > (1u << 20))
        return qc_errorf(QC_ERR_INVALID,
                         "offload: max_inflight %zu must hold 2 to 1Mi blocks of %zu bytes\n"
                         "hint: use a max_inflight of at least 2 * block_size",
                         p->max_inflight, p->block_size);
    if ((int)p->force_rung < 0 || p->force_rung >= QC_OFFLOAD_RUNG_COUNT)
        return qc_errorf(QC_ERR_INVALID, "offload: force_rung %d is not a rung",
                         (int)p->force_rung);
    return QC_OK;
}

static enum qc_status staging_create(struct qc_offload *o)
{
    o->nslots = (uint32_t)(o->p.max_inflight / o->p.block_size);
    QC_TRY(qc_pinned_malloc(o->pinned, (size_t)o->nslots * o->p.block_size, OFFLOAD_ALIGN,
                            "offload staging ring", (void **)&o->ring));
    o->slots = calloc(o->nslots, sizeof *o->slots);
    if (!o->slots)
        return qc_errorf(QC_ERR_NOMEM, "offload: staging slots: out of memory");
    for (uint32_t i = o->nslots; i-- > 0;) {
        struct offload_slot *s = &o->slots[i];
        s->o = o;
        s->buf = o->ring + (size_t)i * o->p.block_size;
        s->next_free = o->free_slots;
        o->free_slots = s;
    }
    o->nfree = o->nslots;
    o->reserve = o->nslots / 4 ? o->nslots / 4 : 1;
    return QC_OK;
}

/* Opens the NVMe tier and its backend along the ladder. Returns QC_OK with o->io NULL when
 * auto mode falls to the host tier (why says why). */
static enum qc_status nvme_tier_open(struct qc_offload *o, const char *dir, char *why,
                                     size_t why_cap, char *uring_why, size_t uring_cap)
{
    enum qc_offload_rung f = o->p.force_rung;
    bool forced = f != QC_OFFLOAD_RUNG_AUTO;
    bool want_direct = f == QC_OFFLOAD_RUNG_URING_DIRECT ||
                       ((f == QC_OFFLOAD_RUNG_AUTO || f == QC_OFFLOAD_RUNG_THREADS) && o->p.direct);
    enum qc_status st = offload_nvme_open(&o->nvme, dir, o->p.nvme_capacity, o->p.nvme_initial,
                                          o->p.nvme_grow_step, want_direct, o->p.spill_visible,
                                          o->p.sim_direct_errno, o->p.sim_fallocate_errno);
    o->nvme.sim_grow_errno = o->p.sim_grow_errno;
    if (st != QC_OK) {
        if (forced)
            return st;
        snprintf(why, why_cap, "%s", qc_error_last());
        why[strcspn(why, "\n")] = '\0'; /* the reason only; our caller adds its own hint */
        return QC_OK;
    }
    if (f == QC_OFFLOAD_RUNG_URING_DIRECT && !o->nvme.direct)
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "offload: forced rung io_uring+O_DIRECT is unavailable: %s",
                         o->nvme.direct_why);
    QC_TRY(staging_create(o));
    o->env = (struct offload_io_env){.fd = o->nvme.fd,
                                     .direct = o->nvme.direct,
                                     .path = o->nvme.path,
                                     .ring = o->ring,
                                     .ring_bytes = (size_t)o->nslots * o->p.block_size,
                                     .register_buffers = o->p.register_buffers,
                                     .queue_depth = o->p.queue_depth,
                                     .sim_uring_errno = o->p.sim_uring_errno,
                                     .fault = &o->fault,
                                     .ctr = &o->ctr};
    if (f == QC_OFFLOAD_RUNG_AUTO || f == QC_OFFLOAD_RUNG_URING_DIRECT ||
        f == QC_OFFLOAD_RUNG_URING_BUFFERED) {
        st = offload_uring_create(&o->env, &o->io);
        if (st != QC_OK) {
            if (forced)
                return qc_error_wrap(st, "offload: forced rung %s is unavailable",
                                     qc_offload_rung_str(f));
            snprintf(uring_why, uring_cap, "%s", qc_error_last());
            uring_why[strcspn(uring_why, "\n")] = '\0';
        }
    }
    if (!o->io)
        QC_TRY(offload_threads_create(&o->env, &o->io));
    if (strcmp(o->io->name, "io_uring") == 0)
        o->rung = o->nvme.direct ? QC_OFFLOAD_RUNG_URING_DIRECT : QC_OFFLOAD_RUNG_URING_BUFFERED;
    else
        o->rung = QC_OFFLOAD_RUNG_THREADS;
    return QC_OK;
}

/* n bytes as "4 KiB" below 1 MiB, else "12.5 MiB". */
static const char *mib_str(uint64_t n, char *buf, size_t cap)
{
    if (n < MIB)
        snprintf(buf, cap, "%.0f KiB", (double)n / KIB);
    else
        snprintf(buf, cap, "%.1f MiB", (double)n / MIB);
    return buf;
}

static void log_probe(const struct qc_offload *o, const char *nvme_why, const char *uring_why)
{
    if (o->rung == QC_OFFLOAD_RUNG_HOST_ONLY) {
        qc_log(QC_LOG_INFO, "offload: probe: no NVMe tier (%s)",
               nvme_why[0] ? nvme_why : "no offload.nvme_dir");
        qc_log(QC_LOG_INFO, "offload: rung: host tier only (%zu MiB pinned)",
               o->p.host_capacity / MIB);
        return;
    }
    const char *uring = o->rung == QC_OFFLOAD_RUNG_THREADS ? uring_why : "";
    char sz[32];
    bool tried_direct = o->nvme.direct || o->nvme.direct_why[0];
    qc_log(QC_LOG_INFO,
           "offload: probe: io_uring %s%s%s; O_DIRECT %s%s%s; registered buffers+file %s; "
           "spill file on %s: %s allocated by %s, growing in %.0f MiB steps up to "
           "%.0f MiB as needed%s",
           o->rung == QC_OFFLOAD_RUNG_THREADS ? (uring[0] ? "no (" : "not used") : "yes", uring,
           uring[0] ? ")" : "",
           o->nvme.direct ? "yes"
           : tried_direct ? "no ("
                          : "off",
           o->nvme.direct ? "" : o->nvme.direct_why, !o->nvme.direct && tried_direct ? ")" : "",
           o->io->registered ? "yes" : "no", o->nvme.fs_name, mib_str(o->nvme.size, sz, sizeof sz),
           o->nvme.prealloc, (double)o->nvme.grow_step / MIB, (double)o->nvme.capacity / MIB,
           o->p.spill_visible ? " (visible)" : " (unlinked)");
    qc_log(QC_LOG_INFO,
           "offload: rung: %s (queue depth %d, block %zu KiB, %u staging slots, host tier "
           "%zu MiB)",
           qc_offload_rung_str(o->rung), o->p.queue_depth, o->p.block_size / KIB, o->nslots,
           o->p.host_capacity / MIB);
}

enum qc_status qc_offload_create(struct qc_device *dev, const struct qc_offload_params *params,
                                 struct qc_offload **out)
{
    QC_TRY(params_check(params));
    struct qc_offload *o = calloc(1, sizeof *o);
    if (!o)
        return qc_errorf(QC_ERR_NOMEM, "offload: out of memory");
    o->dev = dev;
    o->p = *params;
    o->p.nvme_dir = NULL; /* not kept: the path lives in o->nvme */
    o->nvme.fd = -1;
    o->nvme.spill_slot = -1;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    offload_fault_init(&o->fault);

    enum qc_status st = qc_stream_create(dev, QC_STREAM_COPY, &o->copy);
    if (st == QC_OK && params->pinned) {
        o->pinned = params->pinned;
    } else if (st == QC_OK) {
        st = qc_pinned_create(dev, 0, &o->pinned);
        o->own_pinned = st == QC_OK;
    }
    char nvme_why[OFFLOAD_ERR_MAX] = "", uring_why[OFFLOAD_ERR_MAX] = "";
    const char *dir = params->nvme_dir;
    bool want_nvme = dir && dir[0] && params->force_rung != QC_OFFLOAD_RUNG_HOST_ONLY;
    if (st == QC_OK && want_nvme)
        st = nvme_tier_open(o, dir, nvme_why, sizeof nvme_why, uring_why, sizeof uring_why);
    if (st == QC_OK && !o->io) {
        if (o->nvme.fd >= 0)
            offload_nvme_close(&o->nvme);
        if (params->force_rung == QC_OFFLOAD_RUNG_HOST_ONLY && dir && dir[0])
            snprintf(nvme_why, sizeof nvme_why, "rung forced to host tier only");
        else if (!want_nvme)
            snprintf(nvme_why, sizeof nvme_why, "no offload.nvme_dir");
        if (params->force_rung != QC_OFFLOAD_RUNG_AUTO &&
            params->force_rung != QC_OFFLOAD_RUNG_HOST_ONLY)
            st = qc_errorf(QC_ERR_INVALID, "offload: forced rung %s needs offload.nvme_dir",
                           qc_offload_rung_str(params->force_rung));
        else if (params->host_capacity == 0)
            st = qc_errorf(QC_ERR_UNSUPPORTED,
                           "offload: no tier to offload to: NVMe: %s; host tier capacity is "
                           "0\nhint: set offload.nvme_dir to a writable directory or "
                           "offload.host_capacity",
                           nvme_why);
        else if (nvme_why[0] && want_nvme) {
            snprintf(o->nvme_unusable, sizeof o->nvme_unusable, "%s", nvme_why);
            qc_log(QC_LOG_WARN,
                   "offload: NVMe tier unavailable, falling back to the host "
                   "tier only: %s",
                   nvme_why);
        }
        o->rung = QC_OFFLOAD_RUNG_HOST_ONLY;
    }
    if (st != QC_OK) {
        char msg[OFFLOAD_ERR_MAX];
        snprintf(msg, sizeof msg, "%s", qc_error_last());
        qc_offload_destroy(o);
        return qc_errorf(st, "%s", msg);
    }
    log_probe(o, nvme_why, uring_why);
    *out = o;
    return QC_OK;
}

void qc_offload_destroy(struct qc_offload *o)
{
    if (!o)
        return;
    if (o->copy)
        qc_stream_synchronize(o->copy);
    for (;;) {
        uint64_t id = 0;
        pthread_mutex_lock(&o->mu);
        for (uint32_t i = 0; i < o->tab_used && !id; i++)
            if (o->tab[i].h && !o->tab[i].h->released)
                id = o->tab[i].h->id;
        pthread_mutex_unlock(&o->mu);
        if (!id)
            break;
        qc_offload_release(o, id);
    }
    QC_ASSERT(o->nfree == o->nslots, "offload: %u of %u staging slots not returned",
              o->nslots - o->nfree, o->nslots);
    if (o->io)
        o->io->destroy(o->io);
    char took[32], peak[32];
    if (o->nvme.fd >= 0)
        qc_log(QC_LOG_INFO,
               "offload: spill file took %s at most (%llu growths, limit %.0f MiB) for a "
               "peak of %s in use; removed",
               mib_str(o->nvme.size_peak, took, sizeof took), (unsigned long long)o->nvme.grows,
               (double)o->nvme.capacity / MIB, mib_str(o->nvme.peak, peak, sizeof peak));
    offload_nvme_close(&o->nvme);
    if (o->ring)
        qc_pinned_free(o->pinned, o->ring);
    free(o->slots);
    offload_prefetch_deinit(&o->pf);
    qc_stream_destroy(o->copy);
    if (o->own_pinned)
        qc_pinned_destroy(o->pinned);
    free(o->tab);
    free(o->tab_free);
    offload_fault_deinit(&o->fault);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

// ---- put -----------------------------------------------------------------------------------

static void handle_free(struct offload_handle *h)
{
    if (!h)
        return;
    qc_event_destroy(h->ev_in);
    qc_event_destroy(h->ev_out);
    free(h->chunks);
    free(h);
}

/* mu held: picks the tier and reserves its space. */
static enum qc_status put_place(struct qc_offload *o, struct offload_handle *h,
                                enum qc_offload_place place)
{
    if (place != QC_OFFLOAD_PLACE_NVME) {
        enum qc_status st =
            h->size == 0 ? QC_OK : offload_host_alloc(o, h->size, h->tag, &h->host_buf);
        if (st == QC_OK) {
            h->where = QC_OFFLOAD_PLACE_HOST;
            o->st.puts_host++;
            return QC_OK;
        }
        if (place == QC_OFFLOAD_PLACE_HOST || st != QC_ERR_NOMEM || !o->io)
            return st;
    }
    if (!o->io)
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "offload: tensor '%s' placed on NVMe but there is no NVMe tier (rung: "
                         "%s)\nhint: set offload.nvme_dir",
                         h->tag, qc_offload_rung_str(o->rung));
    size_t bs = o->p.block_size;
    h->nchunks = (uint32_t)((h->size + bs - 1) / bs);
    h->file_len = offload_round_up(h->size, OFFLOAD_ALIGN);
    h->chunks = calloc(h->nchunks ? h->nchunks : 1, sizeof *h->chunks);
    if (!h->chunks)
        return qc_errorf(QC_ERR_NOMEM, "offload: out of memory");
    if (h->file_len > 0) {
        enum qc_status st = offload_nvme_alloc(&o->nvme, h->file_len, &h->file_off);
        if (st != QC_OK)
            return qc_error_wrap(st, "offload: tensor '%s' (%zu bytes)", h->tag, h->size);
    }
    for (uint32_t i = 0; i < h->nchunks; i++) {
        struct offload_chunk *c = &h->chunks[i];
        c->h = h;
        c->index = i;
        c->len = i + 1 < h->nchunks ? bs : h->size - (size_t)i * bs;
        c->state = CHUNK_WRITING;
    }
    h->where = QC_OFFLOAD_PLACE_NVME;
    h->writes_left = h->nchunks;
    o->writes_inflight += h->nchunks;
    o->st.puts_nvme++;
    return QC_OK;
}

/* Device work failed half-way through a put: blocks from `from` on never started. Waits for
 * the started ones and frees the handle. */
static enum qc_status put_abort(struct qc_offload *o, struct offload_handle *h, uint32_t from,
                                enum qc_status st)
{
    char msg[OFFLOAD_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", qc_error_last());
    qc_stream_synchronize(o->copy);
    pthread_mutex_lock(&o->mu);
    for (uint32_t i = from; i < h->nchunks; i++) {
        struct offload_chunk *c = &h->chunks[i];
        if (c->slot)
            offload_slot_give_back(o, c);
        c->state = CHUNK_FAILED;
        h->writes_left--;
        o->writes_inflight--;
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    qc_offload_release(o, h->id);
    return qc_errorf(st, "%s", msg);
}

static enum qc_status offload_put(struct qc_offload *o, const void *src, size_t size,
                                  struct qc_stream *stream, enum qc_offload_place place,
                                  const char *tag, uint64_t *handle)
{
    if (!o || (!src && size) || !stream || !handle)
        return qc_errorf(QC_ERR_INVALID, "offload: put: NULL argument");
    struct offload_handle *h = calloc(1, sizeof *h);
    if (!h)
        return qc_errorf(QC_ERR_NOMEM, "offload: out of memory");
    h->o = o;
    snprintf(h->tag, sizeof h->tag, "%s", tag && tag[0] ? tag : "(untagged)");
    h->size = size;
    enum qc_status st = qc_event_create(o->dev, &h->ev_in);
    if (st == QC_OK)
        st = qc_event_create(o->dev, &h->ev_out);
    if (st != QC_OK) {
        handle_free(h);
        return st;
    }
    pthread_mutex_lock(&o->mu);
    st = put_place(o, h, place);
    if (st == QC_OK)
        st = offload_handle_insert(o, h);
    if (st != QC_OK) {
        if (h->where == QC_OFFLOAD_PLACE_HOST) {
            offload_host_free(o, h->host_buf, h->size);
            o->st.puts_host--;
        } else if (h->where == QC_OFFLOAD_PLACE_NVME) {
            if (h->file_len)
                offload_nvme_free(&o->nvme, h->file_off, h->file_len);
            o->writes_inflight -= h->nchunks;
            o->st.puts_nvme--;
        }
        pthread_mutex_unlock(&o->mu);
        handle_free(h);
        return st;
    }
    pthread_mutex_unlock(&o->mu);

    st = qc_event_record(h->ev_in, stream);
    if (st == QC_OK)
        st = qc_stream_wait_event(o->copy, h->ev_in);
    if (st != QC_OK)
        return put_abort(o, h, 0, st);
    if (h->where == QC_OFFLOAD_PLACE_HOST) {
        st = qc_memcpy_async(o->copy, h->host_buf, src, size, QC_COPY_D2H);
        if (st != QC_OK)
            return put_abort(o, h, 0, st);
    }
    for (uint32_t i = 0; i < h->nchunks; i++) {
        struct offload_chunk *c = &h->chunks[i];
        pthread_mutex_lock(&o->mu);
        if (o->nfree == 0) {
            uint64_t t0 = now_ns();
            while (o->nfree == 0)
                pthread_cond_wait(&o->cv, &o->mu);
            o->st.put_stall_count++;
            o->st.put_stall_ns += now_ns() - t0;
        }
        struct offload_slot *s = offload_slot_take(o, c);
        pthread_mutex_unlock(&o->mu);
        st = qc_memcpy_async(o->copy, s->buf,
                             (const unsigned char *)src + (size_t)i * o->p.block_size, c->len,
                             QC_COPY_D2H);
        if (st == QC_OK)
            st = qc_stream_host_func(o->copy, write_hand_off, s);
        if (st != QC_OK)
            return put_abort(o, h, i, st);
    }
    st = qc_event_record(h->ev_out, o->copy);
    if (st != QC_OK)
        return put_abort(o, h, h->nchunks, st);
    *handle = h->id;
    return QC_OK;
}

enum qc_status qc_offload_put_done(struct qc_offload *o, uint64_t handle, struct qc_stream *stream)
{
    pthread_mutex_lock(&o->mu);
    struct offload_handle *h = offload_handle_find(o, handle);
    struct qc_event *ev = h ? h->ev_out : NULL;
    pthread_mutex_unlock(&o->mu);
    if (!ev)
        return qc_errorf(QC_ERR_INVALID, "offload: put_done: no such handle 0x%llx",
                         (unsigned long long)handle);
    return qc_stream_wait_event(stream, ev);
}

// ---- get -----------------------------------------------------------------------------------

static enum qc_status handle_error(const struct offload_handle *h)
{
    return qc_errorf(h->err, "%s", h->errmsg);
}

/* mu held: waits for reads of h in flight, then gives back the slots of its READY blocks. */
static void handle_drop_reads(struct qc_offload *o, struct offload_handle *h)
{
    for (;;) {
        bool reading = false;
        for (uint32_t i = 0; i < h->nchunks; i++)
            reading |= h->chunks[i].state == CHUNK_READING;
        if (!reading)
            break;
        pthread_cond_wait(&o->cv, &o->mu);
    }
    for (uint32_t i = 0; i < h->nchunks; i++) {
        struct offload_chunk *c = &h->chunks[i];
        if (c->state == CHUNK_READY) {
            offload_slot_give_back(o, c);
            c->state = CHUNK_ON_DISK;
        }
    }
    offload_prefetch_pump(o);
    pthread_cond_broadcast(&o->cv);
}

/* mu held on entry and exit. */
static enum qc_status get_nvme(struct qc_offload *o, struct offload_handle *h, void *dst,
                               struct qc_stream *stream)
{
    uint64_t waited = 0;
    bool stalled = false;
    enum qc_status st = QC_OK;
    h->getting++;
    while (h->writes_left > 0) {
        uint64_t t0 = now_ns();
        pthread_cond_wait(&o->cv, &o->mu);
        waited += now_ns() - t0;
        stalled = true;
    }
    for (uint32_t i = 0; i < h->nchunks && st == QC_OK; i++) {
        for (uint32_t j = i; j < h->nchunks && o->nfree > 0; j++)
            if (h->chunks[j].state == CHUNK_ON_DISK)
                offload_issue_read(o, &h->chunks[j], false);
        struct offload_chunk *c = &h->chunks[i];
        while (h->err == QC_OK && c->state != CHUNK_READY) {
            if (c->state == CHUNK_ON_DISK && o->nfree > 0) {
                offload_issue_read(o, c, false);
                continue;
            }
            uint64_t t0 = now_ns();
            pthread_cond_wait(&o->cv, &o->mu);
            waited += now_ns() - t0;
            stalled = true;
        }
        if (h->err != QC_OK) {
            st = handle_error(h);
            break;
        }
        offload_prefetch_chunk_done(o, c); /* consumed: no longer prefetch's */
        c->state = CHUNK_COPYING;
        struct offload_slot *s = c->slot;
        pthread_mutex_unlock(&o->mu);
        st = qc_memcpy_async(stream, (unsigned char *)dst + (size_t)i * o->p.block_size, s->buf,
                             c->len, QC_COPY_H2D);
        enum qc_status st2 = qc_stream_host_func(stream, get_copy_done, s);
        if (st2 != QC_OK) {
            /* the slot cannot be handed back by the stream: wait for the copy here */
            char msg[OFFLOAD_ERR_MAX];
            snprintf(msg, sizeof msg, "%s", qc_error_last());
            qc_stream_synchronize(stream);
            get_copy_done(s);
            if (st == QC_OK)
                st = qc_errorf(st2, "%s", msg);
        }
        pthread_mutex_lock(&o->mu);
    }
    h->getting--;
    if (st != QC_OK)
        handle_drop_reads(o, h);
    if (stalled) {
        o->st.stall_count++;
        o->st.stall_ns += waited;
    }
    return st;
}

static enum qc_status offload_get(struct qc_offload *o, uint64_t handle, void *dst,
                                  struct qc_stream *stream)
{
    if (!o || !stream)
        return qc_errorf(QC_ERR_INVALID, "offload: get: NULL argument");
    pthread_mutex_lock(&o->mu);
    struct offload_handle *h = offload_handle_find(o, handle);
    if (!h) {
        pthread_mutex_unlock(&o->mu);
        return qc_errorf(QC_ERR_INVALID, "offload: get: no such handle 0x%llx",
                         (unsigned long long)handle);
    }
    if (h->err != QC_OK) {
        enum qc_status st = handle_error(h);
        pthread_mutex_unlock(&o->mu);
        return st;
    }
    if (!dst && h->size) {
        pthread_mutex_unlock(&o->mu);
        return qc_errorf(QC_ERR_INVALID, "offload: get: NULL destination for '%s'", h->tag);
    }
    enum qc_status st = QC_OK;
    if (h->where == QC_OFFLOAD_PLACE_HOST) {
        if (h->size > 0) {
            h->busy++;
            pthread_mutex_unlock(&o->mu);
            st = qc_stream_wait_event(stream, h->ev_out);
            if (st == QC_OK)
                st = qc_memcpy_async(stream, dst, h->host_buf, h->size, QC_COPY_H2D);
            enum qc_status st2 = qc_stream_host_func(stream, host_copy_done, h);
            if (st2 != QC_OK) {
                qc_stream_synchronize(stream);
                host_copy_done(h);
                if (st == QC_OK)
                    st = st2;
            }
            pthread_mutex_lock(&o->mu);
        }
    } else {
        st = get_nvme(o, h, dst, stream);
    }
    if (st == QC_OK) {
        h->consumed = true;
        o->st.gets++;
    }
    pthread_mutex_unlock(&o->mu);
    return st;
}

// ---- the profiler's spans (qc_prof.h): the host side of a put or get (enqueue, or the wait
// of a synchronous NVMe read) ----------------------------------------------------------------

enum qc_status qc_offload_put(struct qc_offload *o, const void *src, size_t size,
                              struct qc_stream *stream, enum qc_offload_place place,
                              const char *tag, uint64_t *handle)
{
    if (!qc_prof_on())
        return offload_put(o, src, size, stream, place, tag, handle);
    struct qc_prof_mark m;
    qc_prof_span_begin(&m, QC_PROF_CAT_OFFLOAD, "offload_put", QC_PROF_PASS_NONE);
    const enum qc_status st = offload_put(o, src, size, stream, place, tag, handle);
    qc_prof_span_end(&m, QC_PROF_CAT_OFFLOAD, tag, (double)size);
    return st;
}

enum qc_status qc_offload_get(struct qc_offload *o, uint64_t handle, void *dst,
                              struct qc_stream *stream)
{
    if (!qc_prof_on())
        return offload_get(o, handle, dst, stream);
    size_t size = 0;
    enum qc_offload_place where = QC_OFFLOAD_PLACE_HOST;
    (void)qc_offload_handle_info(o, handle, &size, &where);
    struct qc_prof_mark m;
    qc_prof_span_begin(&m, QC_PROF_CAT_OFFLOAD, "offload_get", QC_PROF_PASS_NONE);
    const enum qc_status st = offload_get(o, handle, dst, stream);
    qc_prof_span_end(&m, QC_PROF_CAT_OFFLOAD, where == QC_OFFLOAD_PLACE_HOST ? "host" : "nvme",
                     (double)size);
    return st;
}

// ---- release, quiesce, info, stats ---------------------------------------------------------

enum qc_status qc_offload_release(struct qc_offload *o, uint64_t handle)
{
    if (handle == 0)
        return QC_OK;
    pthread_mutex_lock(&o->mu);
    struct offload_handle *h = offload_handle_find(o, handle);
    if (!h) {
        pthread_mutex_unlock(&o->mu);
        return qc_errorf(QC_ERR_INVALID, "offload: release: no such handle 0x%llx",
                         (unsigned long long)handle);
    }
    h->released = true; /* finds fail from now on; prefetch skips it */
    while (h->writes_left > 0)
        pthread_cond_wait(&o->cv, &o->mu);
    handle_drop_reads(o, h);
    while (h->busy > 0) /* copies to the device still reading from our memory */
        pthread_cond_wait(&o->cv, &o->mu);
    pthread_mutex_unlock(&o->mu);
    qc_event_synchronize(h->ev_out); /* the copy-out into host_buf (or the last hand-off) */
    pthread_mutex_lock(&o->mu);
    if (h->where == QC_OFFLOAD_PLACE_HOST)
        offload_host_free(o, h->host_buf, h->size);
    else if (h->file_len)
        offload_nvme_free(&o->nvme, h->file_off, h->file_len);
    QC_ASSERT(h->pf_chunks == 0 && h->busy == 0, "offload: released '%s' still holds slots",
              h->tag);
    offload_handle_remove(o, h);
    enum qc_status err = h->err;
    char msg[OFFLOAD_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", h->errmsg);
    pthread_mutex_unlock(&o->mu);
    handle_free(h);
    return err == QC_OK ? QC_OK : qc_errorf(err, "%s", msg);
}

enum qc_status qc_offload_quiesce(struct qc_offload *o)
{
    enum qc_status st = qc_stream_synchronize(o->copy);
    if (st != QC_OK)
        return st;
    pthread_mutex_lock(&o->mu);
    while (o->writes_inflight > 0 || o->reads_inflight > 0)
        pthread_cond_wait(&o->cv, &o->mu);
    st = o->first_err;
    char msg[OFFLOAD_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", o->first_errmsg);
    o->first_err = QC_OK;
    o->first_errmsg[0] = '\0';
    pthread_mutex_unlock(&o->mu);
    return st == QC_OK ? QC_OK : qc_errorf(st, "%s", msg);
}

enum qc_status qc_offload_handle_info(struct qc_offload *o, uint64_t handle, size_t *size,
                                      enum qc_offload_place *where)
{
    pthread_mutex_lock(&o->mu);
    struct offload_handle *h = offload_handle_find(o, handle);
    if (h) {
        if (size)
            *size = h->size;
        if (where)
            *where = h->where;
    }
    pthread_mutex_unlock(&o->mu);
    if (!h)
        return qc_errorf(QC_ERR_INVALID, "offload: no such handle 0x%llx",
                         (unsigned long long)handle);
    return QC_OK;
}

void qc_offload_stats_get(struct qc_offload *o, struct qc_offload_stats *out)
{
    pthread_mutex_lock(&o->mu);
    *out = o->st;
    out->bytes_host_used = o->host_used;
    out->bytes_host_peak = o->host_peak;
    out->bytes_nvme_used = o->nvme.used;
    out->bytes_nvme_peak = o->nvme.peak;
    out->bytes_nvme_file = o->nvme.fd >= 0 ? o->nvme.size : 0;
    out->bytes_nvme_file_peak = o->nvme.fd >= 0 ? o->nvme.size_peak : 0;
    out->nvme_grows = o->nvme.grows;
    pthread_mutex_unlock(&o->mu);
    out->ios_submitted = atomic_load(&o->ctr.ios_submitted);
    out->short_ios = atomic_load(&o->ctr.short_ios);
    out->retries = atomic_load(&o->ctr.retries);
}
