/*
 * memctx.c — the memory context (qc_memctx.h): allocation and stream-ordered frees through the
 * caching allocator or host malloc, per-class accounting, fault injection for tests.
 */
#include "qc_memctx.h"

#include <stdlib.h>
#include <string.h>

#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_emu.h"
#include "qc_offload.h"
#include "qc_plan.h"

#include <time.h>

/* Live allocations of the recording: pointer -> program id, open addressing (linear probing,
 * tombstones), capacity a power of two kept at most half full. */
struct id_map {
    uintptr_t *key; /* 0 empty, 1 tombstone */
    int32_t *id;
    size_t cap, used; /* used counts tombstones too */
};

#define MAP_EMPTY ((uintptr_t)0)
#define MAP_TOMB  ((uintptr_t)1)

/* Fibonacci hashing: the product's top log2(cap) bits. (Its low bits are no hash for keys with
 * zero low bits: the dry run's addresses are multiples of 2^36, and `(x >> 17) & (cap - 1)`
 * put every one of them in slot 0, every lookup a walk of the whole table.) */
static size_t map_hash(uintptr_t k, size_t cap)
{
    const uint64_t x = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    const int bits = __builtin_ctzll((unsigned long long)cap);
    return bits ? (size_t)(x >> (64 - bits)) : 0;
}

static bool map_rehash(struct id_map *m, size_t cap)
{
    uintptr_t *key = calloc(cap, sizeof *key);
    int32_t *id = malloc(cap * sizeof *id);
    if (!key || !id) {
        free(key);
        free(id);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->key[i] <= MAP_TOMB)
            continue;
        size_t j = map_hash(m->key[i], cap);
        while (key[j] != MAP_EMPTY)
            j = (j + 1) & (cap - 1);
        key[j] = m->key[i];
        id[j] = m->id[i];
    }
    size_t live = 0;
    for (size_t i = 0; i < cap; i++)
        live += key[i] > MAP_TOMB;
    free(m->key);
    free(m->id);
    m->key = key;
    m->id = id;
    m->cap = cap;
    m->used = live;
    return true;
}

static bool map_put(struct id_map *m, uintptr_t k, int32_t id)
{
    if (2 * (m->used + 1) > m->cap && !map_rehash(m, m->cap ? 2 * m->cap : 1024))
        return false;
    size_t j = map_hash(k, m->cap);
    while (m->key[j] > MAP_TOMB && m->key[j] != k)
        j = (j + 1) & (m->cap - 1);
    if (m->key[j] == MAP_EMPTY)
        m->used++;
    m->key[j] = k;
    m->id[j] = id;
    return true;
}

/* The slot of k, or cap when absent. */
static size_t map_find(const struct id_map *m, uintptr_t k)
{
    if (!m->cap)
        return 0;
    size_t j = map_hash(k, m->cap);
    while (m->key[j] != MAP_EMPTY) {
        if (m->key[j] == k)
            return j;
        j = (j + 1) & (m->cap - 1);
    }
    return m->cap;
}

/* The id of k and its removal; -1 if absent. */
static int32_t map_take(struct id_map *m, uintptr_t k)
{
    const size_t j = map_find(m, k);
    if (j >= m->cap)
        return -1;
    m->key[j] = MAP_TOMB;
    return m->id[j];
}

static void map_clear(struct id_map *m)
{
    free(m->key);
    free(m->id);
    memset(m, 0, sizeof *m);
}

/* Tag -> lifetime class (qc_memctx_set_lives): open addressing by the tag's 64-bit hash (0:
 * empty), capacity a power of two at least twice the tags. Two tags with one hash share a class
 * (the longer); a placement hint, never a correctness matter. */
struct life_map {
    uint64_t *key;
    uint8_t *life;
    size_t cap;
};

_Static_assert(QC_PLAN_LIFE_LONG == (int)QC_ALLOC_LIFE_LONG &&
                   QC_PLAN_LIFE_PHASE == (int)QC_ALLOC_LIFE_PHASE &&
                   QC_PLAN_LIFE_SPAN == (int)QC_ALLOC_LIFE_SPAN,
               "the program's lifetime classes are the allocator's");

/* FNV-1a of the tag's first 127 bytes (what a program keeps of a tag), never 0. */
static uint64_t tag_hash(const char *tag)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; tag[i] && i < 127; i++)
        h = (h ^ (uint8_t)tag[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

static uint8_t *life_slot(const struct life_map *m, uint64_t h)
{
    size_t j = (size_t)(h * 0x9e3779b97f4a7c15ull >> 20) & (m->cap - 1);
    while (m->key[j] && m->key[j] != h)
        j = (j + 1) & (m->cap - 1);
    return &m->life[j];
}

/* A fetch in flight: its handle, and the events bracketing its copy. */
struct fetch {
    uint64_t handle;        /* 0: a free slot */
    struct qc_event *ready; /* compute stream's work before the copy */
    struct qc_event *done;  /* the copy */
};

#define MEMCTX_FETCHES 512 /* stash arenas of one step, at most (3 per tape entry) */

struct qc_memctx {
    bool dry;
    uint64_t dry_seq; /* dry: allocations handed out (their fake addresses) */
    struct qc_alloc *alloc;
    struct qc_emu *emu;
    struct qc_stream *compute;
    struct qc_memctx_stats st;
    int64_t fail_k, fail_count; /* next failing allocation (1-based from arming), run length */
    int64_t seen;               /* allocation calls since arming */
    void (*observe)(void *user, const char *tag, enum qc_mem_class cls, size_t bytes, bool alloc);
    void *observe_user;
    struct qc_offload *offload;
    struct qc_stream *copy_in;
    struct fetch *fetch;         /* [MEMCTX_FETCHES], with an offload engine */
    struct qc_plan_program *rec; /* recording into this program, or NULL */
    struct id_map ids;           /* while recording: live pointer -> program id */
    struct life_map lives;       /* where the allocator places blocks by tag (empty: LONG) */
};

enum qc_status qc_memctx_create(const struct qc_memctx_params *p, struct qc_memctx **out)
{
    struct qc_memctx *mc = calloc(1, sizeof *mc);
    if (!mc)
        return qc_errorf(QC_ERR_NOMEM, "memory context: %zu bytes", sizeof *mc);
    if (p) {
        mc->dry = p->dry;
        mc->alloc = p->dry ? NULL : p->alloc;
        mc->emu = p->dry || p->alloc ? NULL : p->emu;
        mc->compute = p->compute;
        if (p->offload) {
            enum qc_status st = qc_memctx_set_offload(mc, p->offload, p->copy_in);
            if (st != QC_OK) {
                free(mc);
                return st;
            }
        }
    }
    *out = mc;
    return QC_OK;
}

void qc_memctx_destroy(struct qc_memctx *mc)
{
    if (!mc)
        return;
    for (int c = 0; c < QC_MEM_CLASS_COUNT; c++)
        QC_ASSERT(mc->st.nlive[c] == 0, "memory context destroyed with %lld live allocations",
                  (long long)mc->st.nlive[c]);
    map_clear(&mc->ids);
    free(mc->lives.key);
    free(mc->lives.life);
    if (mc->fetch) {
        for (int i = 0; i < MEMCTX_FETCHES; i++) {
            qc_event_destroy(mc->fetch[i].ready);
            qc_event_destroy(mc->fetch[i].done);
        }
        free(mc->fetch);
    }
    free(mc);
}

static void *host_alloc(size_t bytes)
{
    const size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

/* Whether this allocation call is one the armed fault makes fail. */
static bool injected_failure(struct qc_memctx *mc)
{
    if (mc->fail_k <= 0)
        return false;
    mc->seen++;
    if (mc->seen < mc->fail_k)
        return false;
    if (mc->seen - mc->fail_k >= mc->fail_count) {
        mc->fail_k = 0; /* the run of failures is over */
        return false;
    }
    return true;
}

void *qc_memctx_alloc(struct qc_memctx *mc, enum qc_mem_class cls, size_t bytes, const char *tag)
{
    if (bytes == 0)
        bytes = 1;
    if (!mc) {
        void *p = host_alloc(bytes);
        if (!p)
            (void)qc_errorf(QC_ERR_NOMEM, "host allocation of %zu bytes for %s failed", bytes,
                            tag ? tag : "(untagged)");
        return p;
    }
    QC_ASSERT(cls >= 0 && cls < QC_MEM_CLASS_COUNT, "memory context: class %d", (int)cls);
    void *p = NULL;
    if (injected_failure(mc)) {
        mc->st.n_fail++;
        mc->st.fail_bytes = bytes;
        mc->st.fail_allocated = mc->st.fail_reserved = mc->st.fail_reserved_small = 0;
        (void)qc_errorf(QC_ERR_NOMEM, "allocation of %zu bytes for %s failed (injected)", bytes,
                        tag ? tag : "(untagged)");
        return NULL;
    }
    if (mc->dry) {
        /* a distinct, never-dereferenced address with room for offsets into the block */
        p = (void *)(uintptr_t)(++mc->dry_seq << 36);
    } else if (mc->alloc) {
        enum qc_alloc_life life = QC_ALLOC_LIFE_LONG;
        if (mc->lives.cap && tag)
            life = (enum qc_alloc_life) * life_slot(&mc->lives, tag_hash(tag));
        if (qc_alloc_malloc_life(mc->alloc, bytes, mc->compute, life, tag, &p) != QC_OK)
            p = NULL; /* the allocator's OOM report is the error */
    } else if (mc->emu) {
        p = qc_emu_alloc(mc->emu, bytes);
        if (!p)
            (void)qc_errorf(QC_ERR_NOMEM, "emulated-device allocation of %zu bytes for %s failed",
                            bytes, tag ? tag : "(untagged)");
    } else {
        p = host_alloc(bytes);
        if (!p)
            (void)qc_errorf(QC_ERR_NOMEM, "host allocation of %zu bytes for %s failed", bytes,
                            tag ? tag : "(untagged)");
    }
    if (!p) {
        mc->st.n_fail++;
        mc->st.fail_bytes = bytes;
        if (mc->alloc) {
            struct qc_alloc_stats as;
            qc_alloc_stats_get(mc->alloc, &as);
            mc->st.fail_allocated = as.bytes_allocated;
            mc->st.fail_reserved = as.bytes_reserved;
            mc->st.fail_reserved_small = as.bytes_reserved_small;
        }
        return NULL;
    }
    mc->st.live[cls] += bytes;
    mc->st.nlive[cls]++;
    mc->st.n_allocs[cls]++;
    const size_t work = mc->st.live[QC_MEM_MODEL] + mc->st.live[QC_MEM_BLOCK];
    if (work > mc->st.work_peak)
        mc->st.work_peak = work;
    if (mc->observe)
        mc->observe(mc->observe_user, tag, cls, bytes, true);
    if (mc->rec) {
        const int32_t id =
            qc_plan_program_event(mc->rec, QC_PLAN_OP_ALLOC, -1, -1, bytes, (int)cls, 0);
        QC_ASSERT(id >= 0 && map_put(&mc->ids, (uintptr_t)p, id) &&
                      qc_plan_program_tag(mc->rec, id, tag ? tag : "") == QC_OK,
                  "memory context: recording out of memory");
    }
    return p;
}

enum qc_status qc_memctx_set_lives(struct qc_memctx *mc, const struct qc_plan_program *prog)
{
    free(mc->lives.key);
    free(mc->lives.life);
    memset(&mc->lives, 0, sizeof mc->lives);
    if (!prog || prog->nalloc == 0 || !mc->alloc)
        return QC_OK;
    size_t cap = 16;
    while (cap < 2 * (size_t)prog->nalloc)
        cap *= 2;
    uint8_t *of_id = malloc((size_t)prog->nalloc);
    struct life_map m = {calloc(cap, sizeof *m.key), calloc(cap, 1), cap};
    enum qc_status st =
        of_id && m.key && m.life
            ? qc_plan_program_lives(prog, of_id)
            : qc_errorf(QC_ERR_NOMEM, "memory context: lifetimes of %d tags", prog->nalloc);
    for (int32_t id = 0; st == QC_OK && id < prog->nalloc; id++) {
        const uint64_t h = tag_hash(qc_plan_program_tag_of(prog, id));
        uint8_t *l = life_slot(&m, h);
        const size_t j = (size_t)(l - m.life);
        /* the longer class of the tag's allocations (LONG < PHASE < SPAN in the enum) */
        if (!m.key[j] || of_id[id] < *l)
            *l = of_id[id];
        m.key[j] = h;
    }
    free(of_id);
    if (st != QC_OK) {
        free(m.key);
        free(m.life);
        return st;
    }
    mc->lives = m;
    return QC_OK;
}

void qc_memctx_free(struct qc_memctx *mc, enum qc_mem_class cls, void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes == 0)
        bytes = 1;
    if (!mc) {
        free(p);
        return;
    }
    QC_ASSERT(mc->st.live[cls] >= bytes && mc->st.nlive[cls] > 0,
              "memory context: freeing %zu bytes of class %d with %zu live", bytes, (int)cls,
              mc->st.live[cls]);
    if (mc->observe)
        mc->observe(mc->observe_user, NULL, cls, bytes, false);
    mc->st.live[cls] -= bytes;
    mc->st.nlive[cls]--;
    if (mc->rec) {
        const int32_t id = map_take(&mc->ids, (uintptr_t)p);
        if (id >= 0)
            QC_ASSERT(qc_plan_program_event(mc->rec, QC_PLAN_OP_FREE, -1, id, 0, 0, 0) >= 0,
                      "memory context: recording out of memory");
    }
    if (mc->dry)
        return;
    if (mc->alloc)
        qc_alloc_free(mc->alloc, p, mc->compute);
    else if (mc->emu)
        qc_emu_free(mc->emu, p, bytes);
    else
        free(p);
}

struct qc_alloc *qc_memctx_allocator(const struct qc_memctx *mc)
{
    return mc ? mc->alloc : NULL;
}

bool qc_memctx_is_device(const struct qc_memctx *mc)
{
    return mc && (mc->dry || mc->alloc || mc->emu);
}

// ---- offload ------------------------------------------------------------------------------

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum qc_status qc_memctx_set_offload(struct qc_memctx *mc, struct qc_offload *offload,
                                     struct qc_stream *copy_in)
{
    if (!offload) {
        mc->offload = NULL;
        mc->copy_in = NULL;
        return QC_OK;
    }
    if (!mc->alloc || !mc->compute || !copy_in)
        return qc_errorf(QC_ERR_INVALID, "memory context: an offload engine needs an allocator "
                                         "and the compute and copy-in streams");
    if (!mc->fetch && !(mc->fetch = calloc(MEMCTX_FETCHES, sizeof *mc->fetch)))
        return qc_errorf(QC_ERR_NOMEM, "memory context: fetch table");
    mc->offload = offload;
    mc->copy_in = copy_in;
    return QC_OK;
}

bool qc_memctx_can_offload(const struct qc_memctx *mc)
{
    return mc && mc->offload;
}

enum qc_status qc_memctx_put(struct qc_memctx *mc, enum qc_mem_class cls, void *p, size_t bytes,
                             enum qc_memctx_place place, const char *tag, uint64_t *handle)
{
    if (!qc_memctx_can_offload(mc))
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "memory context: no offload tier for %s\n"
                         "hint: plan.policy=keep or recompute",
                         tag);
    QC_TRY(qc_offload_put(mc->offload, p, bytes, mc->compute, (enum qc_offload_place)place, tag,
                          handle));
    enum qc_offload_place where = QC_OFFLOAD_PLACE_HOST;
    size_t sz = 0;
    (void)qc_offload_handle_info(mc->offload, *handle, &sz, &where);
    /* the copy stream reads p: its stream-ordered free waits for the copy */
    struct qc_stream *cs = qc_offload_copy_stream(mc->offload);
    qc_alloc_trace_mark(mc->alloc, QC_ALLOC_EV_OFFLOAD_PUT, p, bytes, qc_stream_id(cs),
                        where == QC_OFFLOAD_PLACE_NVME ? QC_ALLOC_TIER_NVME : QC_ALLOC_TIER_HOST,
                        tag);
    enum qc_status st = qc_alloc_record_stream(mc->alloc, p, cs);
    if (st != QC_OK) {
        (void)qc_stream_synchronize(qc_offload_copy_stream(mc->offload));
        (void)qc_offload_release(mc->offload, *handle);
        *handle = 0;
        return st;
    }
    qc_memctx_free(mc, cls, p, bytes);
    if (where == QC_OFFLOAD_PLACE_NVME)
        mc->st.put_nvme_bytes += bytes;
    else
        mc->st.put_host_bytes += bytes;
    mc->st.puts++;
    return QC_OK;
}

/* The fetch slot of handle, or (handle 0) a free one; NULL when none. */
static struct fetch *fetch_slot(struct qc_memctx *mc, uint64_t handle)
{
    for (int i = 0; i < MEMCTX_FETCHES; i++)
        if (mc->fetch[i].handle == handle)
            return &mc->fetch[i];
    return NULL;
}

enum qc_status qc_memctx_fetch(struct qc_memctx *mc, enum qc_mem_class cls, uint64_t handle,
                               size_t bytes, const char *tag, void **out)
{
    QC_ASSERT(qc_memctx_can_offload(mc) && handle, "memory context: fetch without offload");
    struct fetch *f = fetch_slot(mc, 0);
    if (!f)
        return qc_errorf(QC_ERR_NOMEM, "memory context: more than %d fetches in flight",
                         MEMCTX_FETCHES);
    struct qc_device *dev = qc_stream_device(mc->compute);
    if (!f->ready)
        QC_TRY(qc_event_create(dev, &f->ready));
    if (!f->done)
        QC_TRY(qc_event_create(dev, &f->done));
    void *p = qc_memctx_alloc(mc, cls, bytes, tag);
    if (!p)
        return QC_ERR_NOMEM;
    /* the copy must not write p before the compute stream's earlier work on it is done */
    enum qc_status st = qc_event_record(f->ready, mc->compute);
    if (st == QC_OK)
        st = qc_stream_wait_event(mc->copy_in, f->ready);
    if (st == QC_OK)
        st = qc_offload_get(mc->offload, handle, p, mc->copy_in);
    if (st == QC_OK)
        st = qc_event_record(f->done, mc->copy_in);
    if (st == QC_OK)
        st = qc_alloc_record_stream(mc->alloc, p, mc->copy_in);
    if (st != QC_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qc_error_last());
        (void)qc_stream_synchronize(mc->copy_in);
        qc_memctx_free(mc, cls, p, bytes);
        return qc_errorf(st, "%s", msg);
    }
    enum qc_offload_place where = QC_OFFLOAD_PLACE_HOST;
    size_t sz = 0;
    (void)qc_offload_handle_info(mc->offload, handle, &sz, &where);
    qc_alloc_trace_mark(mc->alloc, QC_ALLOC_EV_OFFLOAD_GET, p, bytes, qc_stream_id(mc->copy_in),
                        where == QC_OFFLOAD_PLACE_NVME ? QC_ALLOC_TIER_NVME : QC_ALLOC_TIER_HOST,
                        tag);
    f->handle = handle;
    mc->st.fetch_bytes += bytes;
    mc->st.fetches++;
    *out = p;
    return QC_OK;
}

enum qc_status qc_memctx_wait(struct qc_memctx *mc, uint64_t handle)
{
    if (!qc_memctx_can_offload(mc) || !handle)
        return QC_OK;
    struct fetch *f = fetch_slot(mc, handle);
    if (!f)
        return QC_OK;
    const double t0 = now_s();
    const enum qc_status st = qc_stream_wait_event(mc->compute, f->done);
    mc->st.stall_s += now_s() - t0;
    f->handle = 0;
    return st;
}

void qc_memctx_mark_recompute(struct qc_memctx *mc, const char *name, size_t bytes)
{
    if (mc && mc->alloc)
        qc_alloc_trace_mark(mc->alloc, QC_ALLOC_EV_RECOMPUTE, NULL, bytes,
                            qc_stream_id(mc->compute), 0, name);
}

void qc_memctx_drop(struct qc_memctx *mc, uint64_t handle)
{
    if (!qc_memctx_can_offload(mc) || !handle)
        return;
    struct fetch *f = fetch_slot(mc, handle);
    if (f) { /* fetched but never waited for: the copy must be done before the data goes */
        (void)qc_event_synchronize(f->done);
        f->handle = 0;
    }
    (void)qc_offload_release(mc->offload, handle);
}

enum qc_status qc_memctx_record(struct qc_memctx *mc, struct qc_plan_program *prog)
{
    map_clear(&mc->ids);
    mc->rec = prog;
    if (prog && !map_rehash(&mc->ids, 1024)) {
        mc->rec = NULL;
        return qc_errorf(QC_ERR_NOMEM, "memory context: recording table");
    }
    return QC_OK;
}

struct qc_plan_program *qc_memctx_recording(const struct qc_memctx *mc)
{
    return mc ? mc->rec : NULL;
}

int32_t qc_memctx_alloc_id(const struct qc_memctx *mc, const void *p)
{
    if (!mc || !mc->rec)
        return -1;
    const size_t j = map_find(&mc->ids, (uintptr_t)p);
    return j < mc->ids.cap ? mc->ids.id[j] : -1;
}

struct qc_stream *qc_memctx_compute_stream(const struct qc_memctx *mc)
{
    return mc ? mc->compute : NULL;
}

void qc_memctx_stats_get(const struct qc_memctx *mc, struct qc_memctx_stats *out)
{
    if (!mc) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = mc->st;
}

void qc_memctx_reset_peak(struct qc_memctx *mc)
{
    if (mc)
        mc->st.work_peak = mc->st.live[QC_MEM_MODEL] + mc->st.live[QC_MEM_BLOCK];
}

void qc_memctx_fail_at(struct qc_memctx *mc, int64_t k, int64_t count)
{
    mc->fail_k = k > 0 ? k : 0;
    mc->fail_count = count > 0 ? count : 1;
    mc->seen = 0;
}

void qc_memctx_set_observer(struct qc_memctx *mc,
                            void (*fn)(void *user, const char *tag, enum qc_mem_class cls,
                                       size_t bytes, bool alloc),
                            void *user)
{
    mc->observe = fn;
    mc->observe_user = user;
}
