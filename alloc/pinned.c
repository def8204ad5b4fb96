/*
 * pinned.c — the pinned host allocator: one jemalloc arena per qc_pinned whose extents come from
 * our hooks. The alloc hook only maps host memory (within the budget) and records the extent;
 * pinning (cudaHostRegister on a CUDA device, through raw_cuda.c, behind the alloc_pin_ops seam)
 * happens in qc_pinned_malloc after jemalloc returned, outside its locks and our hooks: the CUDA
 * runtime may allocate inside cudaHostRegister, which would re-enter jemalloc from a hook.
 * Every pin and unpin first selects the arena's device on the calling thread (ops.select:
 * cudaSetDevice), whichever thread it is: a loader worker allocating a batch has never chosen
 * a device, and registering from it would land in device 0's context on every rank.
 * Extents are never handed back to the OS while the arena lives: the dalloc hook opts out
 * (jemalloc retains the extent), there are no decommit/purge hooks, and decay is off, so a
 * pinned page stays pinned and is reused. Merges are allowed only inside one hook mapping (one
 * registration), so no allocation ever spans two cudaHostRegister ranges. qc_pinned_destroy
 * destroys the arena, then unpins and unmaps.
 *
 * Invariants (lock held):
 *   ext[0 .. pin_next) are pinned, ext[pin_next .. next) are waiting for their pin (extents are
 *   pinned in the order the hook mapped them);
 *   a pointer qc_pinned_malloc returns lies in a pinned extent: before returning, it pins every
 *   extent still waiting (the new pointer's included), or frees the pointer and fails;
 *   bytes_pinned = Σ size of the pinned extents <= bytes_reserved.
 */
#include "qc_pinned.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <jemalloc/jemalloc.h> /* mallocx, dallocx, sallocx, mallctl, extent_hooks_t */

#include "alloc_internal.h"
#include "qc_emu.h"

#define PINNED_MAX_ALIGN ((size_t)1 << 20)

struct pinned_extent {
    char *base;
    size_t size;
};

struct qc_pinned {
    extent_hooks_t hooks;     /* first: the hooks get &hooks and cast back */
    struct alloc_pin_ops ops; /* select / pin / unpin, device (ops.pin NULL: plain memory) */
    unsigned arena;           /* jemalloc arena index */
    bool arena_ok;
    pthread_mutex_t pin_lock; /* serialises pinning (never taken inside a hook) */
    pthread_mutex_t lock;     /* guards everything below */
    struct pinned_extent *ext;
    size_t next, cap_ext;
    size_t pin_next; /* extents [0, pin_next) are pinned */
    struct qc_pinned_stats st;
};

static struct qc_pinned *pinned_of(extent_hooks_t *h)
{
    return (struct qc_pinned *)(void *)h;
}

static _Thread_local bool in_hook; /* this thread runs one of our extent hooks */

bool alloc_pinned_in_hook(void)
{
    return in_hook;
}

// ---- extent hooks ----------------------------------------------------------------------------

static bool ext_record(struct qc_pinned *p, char *base, size_t size)
{
    if (p->next == p->cap_ext) {
        size_t n = p->cap_ext ? 2 * p->cap_ext : 16;
        struct pinned_extent *e = realloc(p->ext, n * sizeof *e);
        if (!e)
            return false;
        p->ext = e;
        p->cap_ext = n;
    }
    p->ext[p->next].base = base;
    p->ext[p->next].size = size;
    p->next++;
    return true;
}

static const struct pinned_extent *ext_find(const struct qc_pinned *p, const char *addr)
{
    for (size_t i = 0; i < p->next; i++)
        if (addr >= p->ext[i].base && addr < p->ext[i].base + p->ext[i].size)
            return &p->ext[i];
    return NULL;
}

static void *hook_alloc_locked(struct qc_pinned *p, size_t size, size_t alignment, bool *zero,
                               bool *commit)
{
    if (p->st.bytes_budget &&
        (size > p->st.bytes_budget || p->st.bytes_reserved > p->st.bytes_budget - size))
        return NULL;
    /* Over-map by the alignment, then trim both ends. */
    size_t span = size + alignment;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)raw + alignment - 1) / alignment * alignment;
    char *base = (char *)a;
    size_t head = (size_t)(base - raw), tail = span - head - size;
    if (head)
        munmap(raw, head);
    if (tail)
        munmap(base + size, tail);
    /* No pinning here: qc_pinned_malloc pins the extent once jemalloc has returned. */
    if (!ext_record(p, base, size)) {
        munmap(base, size);
        return NULL;
    }
    alloc_stat_add(&p->st.bytes_reserved, &p->st.bytes_reserved_peak, size);
    p->st.n_extents++;
    *zero = true; /* fresh anonymous pages */
    *commit = true;
    return base;
}

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
                        bool *zero, bool *commit, unsigned arena_ind)
{
    (void)arena_ind;
    struct qc_pinned *p = pinned_of(h);
    if (new_addr) /* growing in place at a given address is not supported */
        return NULL;
    if (alignment < 4096)
        alignment = 4096;
    in_hook = true;
    pthread_mutex_lock(&p->lock);
    void *base = hook_alloc_locked(p, size, alignment, zero, commit);
    pthread_mutex_unlock(&p->lock);
    in_hook = false;
    return base;
}

/* Opt out of deallocation: jemalloc retains the extent and reuses it; it stays pinned. */
static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed,
                        unsigned arena_ind)
{
    (void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
    return true;
}

/* Arena destruction: the memory is unmapped by qc_pinned_destroy from our own records. */
static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed,
                         unsigned arena_ind)
{
    (void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
                       bool committed, unsigned arena_ind)
{
    (void)h, (void)addr, (void)size, (void)size_a, (void)size_b, (void)committed, (void)arena_ind;
    return false; /* splitting is bookkeeping only */
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                       bool committed, unsigned arena_ind)
{
    (void)size_a, (void)size_b, (void)committed, (void)arena_ind;
    struct qc_pinned *p = pinned_of(h);
    in_hook = true;
    pthread_mutex_lock(&p->lock);
    const struct pinned_extent *ea = ext_find(p, addr_a), *eb = ext_find(p, addr_b);
    bool refuse = !ea || ea != eb;
    pthread_mutex_unlock(&p->lock);
    in_hook = false;
    return refuse;
}

// ---- pinning (outside the hooks) ------------------------------------------------------------

/* Pins one extent from the calling thread, on the arena's device. */
static enum qc_status pin_extent(struct qc_pinned *p, void *base, size_t size)
{
    if (p->ops.select) {
        enum qc_status st = p->ops.select(p->ops.ctx, p->ops.device);
        if (st != QC_OK)
            return qc_error_wrap(st, "pinned: selecting device %d to pin an extent", p->ops.device);
    }
    return p->ops.pin(p->ops.ctx, base, size);
}

/* Unpins one extent from the calling thread, on the arena's device; a failure is logged (the
 * extent is unmapped anyway). */
static void unpin_extent(struct qc_pinned *p, void *base)
{
    enum qc_status st = p->ops.select ? p->ops.select(p->ops.ctx, p->ops.device) : QC_OK;
    if (st == QC_OK)
        st = p->ops.unpin(p->ops.ctx, base);
    if (st != QC_OK)
        qc_log(QC_LOG_ERROR, "pinned: unpinning the extent at %p (device %d): %s", base,
               p->ops.device, qc_error_last());
}

/* Pins every extent still waiting, in mapping order. Called with no lock of ours or jemalloc's
 * held; pin_lock makes one thread pin at a time, the others then find the work done. On a
 * failure the extent stays waiting (a later call tries again) and the error is returned. */
static enum qc_status pin_waiting(struct qc_pinned *p)
{
    if (!p->ops.pin)
        return QC_OK;
    QC_ASSERT(!in_hook, "pinned: pinning from inside a jemalloc hook");
    enum qc_status st = QC_OK;
    pthread_mutex_lock(&p->pin_lock);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        const bool waiting = p->pin_next < p->next;
        const struct pinned_extent e = waiting ? p->ext[p->pin_next] : (struct pinned_extent){0};
        pthread_mutex_unlock(&p->lock);
        if (!waiting)
            break;
        st = pin_extent(p, e.base, e.size);
        if (st != QC_OK)
            break;
        pthread_mutex_lock(&p->lock);
        p->pin_next++;
        p->st.bytes_pinned += e.size;
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->pin_lock);
    return st;
}

// ---- API -------------------------------------------------------------------------------------

static enum qc_status arena_ctl(unsigned arena, const char *name, ssize_t value)
{
    char key[64];
    snprintf(key, sizeof key, "arena.%u.%s", arena, name);
    int rc = mallctl(key, NULL, NULL, &value, sizeof value);
    if (rc != 0)
        return qc_errorf(QC_ERR_NOMEM, "mallctl(%s): %s", key, strerror(rc));
    return QC_OK;
}

#ifdef QC_HAVE_CUDA
static enum qc_status select_cuda(void *ctx, int device)
{
    (void)ctx;
    return alloc_raw_cuda_set_device(device);
}

static enum qc_status pin_cuda(void *ctx, void *base, size_t size)
{
    (void)ctx;
    return alloc_raw_cuda_host_register(base, size);
}

static enum qc_status unpin_cuda(void *ctx, void *base)
{
    (void)ctx;
    return alloc_raw_cuda_host_unregister(base);
}
#endif

enum qc_status qc_pinned_create(struct qc_device *dev, size_t budget, struct qc_pinned **out)
{
    if (dev && qc_device_kind_of(dev) == QC_DEVICE_CUDA) {
#ifdef QC_HAVE_CUDA
        const struct alloc_pin_ops cuda = {select_cuda, pin_cuda, unpin_cuda, NULL,
                                           qc_device_ordinal(dev)};
        return alloc_pinned_create_with(&cuda, budget, out);
#else
        return qc_errorf(QC_ERR_UNSUPPORTED, "pinned allocator: CUDA device in a CPU-only build");
#endif
    }
    return alloc_pinned_create_with(NULL, budget, out);
}

static enum qc_status select_emu(void *ctx, int device)
{
    (void)ctx;
    qc_emu_device_set(device);
    return QC_OK;
}

static enum qc_status pin_emu(void *ctx, void *base, size_t size)
{
    return qc_emu_host_register(ctx, base, size);
}

static enum qc_status unpin_emu(void *ctx, void *base)
{
    return qc_emu_host_unregister(ctx, base);
}

enum qc_status qc_pinned_create_emu(struct qc_emu *emu, size_t budget, struct qc_pinned **out)
{
    QC_ASSERT(emu != NULL, "qc_pinned_create_emu: emu is NULL");
    const struct alloc_pin_ops ops = {select_emu, pin_emu, unpin_emu, emu, qc_emu_ordinal(emu)};
    return alloc_pinned_create_with(&ops, budget, out);
}

enum qc_status alloc_pinned_create_with(const struct alloc_pin_ops *ops, size_t budget,
                                        struct qc_pinned **out)
{
    struct qc_pinned *p = calloc(1, sizeof *p);
    if (!p)
        return qc_errorf(QC_ERR_NOMEM, "pinned allocator: out of host memory");
    if (ops)
        p->ops = *ops;
    QC_ASSERT(!p->ops.pin == !p->ops.unpin, "pinned allocator: pin without unpin or back");
    p->st.bytes_budget = budget;
    p->st.device = p->ops.pin ? p->ops.device : -1;
    p->hooks.alloc = hook_alloc;
    p->hooks.dalloc = hook_dalloc;
    p->hooks.destroy = hook_destroy;
    p->hooks.split = hook_split;
    p->hooks.merge = hook_merge;
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return qc_errorf(QC_ERR_NOMEM, "pinned allocator: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&p->pin_lock, NULL) != 0) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return qc_errorf(QC_ERR_NOMEM, "pinned allocator: pthread_mutex_init failed");
    }
    extent_hooks_t *hp = &p->hooks;
    size_t sz = sizeof p->arena;
    int rc = mallctl("arenas.create", &p->arena, &sz, &hp, sizeof hp);
    enum qc_status st = QC_OK;
    if (rc != 0)
        st = qc_errorf(QC_ERR_NOMEM,
                       "pinned allocator: mallctl(arenas.create) failed: %s (budget %zu bytes)"
                       "\nhint: the arena needs a few MiB of budget for its metadata",
                       strerror(rc), budget);
    else
        p->arena_ok = true;
    /* Never purge: pinned pages stay pinned and cached. */
    if (st == QC_OK)
        st = arena_ctl(p->arena, "dirty_decay_ms", -1);
    if (st == QC_OK)
        st = arena_ctl(p->arena, "muzzy_decay_ms", -1);
    if (st == QC_OK) /* the arena's first extent (its metadata) is pinned at once */
        st = pin_waiting(p);
    if (st != QC_OK) {
        qc_pinned_destroy(p);
        return st;
    }
    *out = p;
    return QC_OK;
}

void qc_pinned_destroy(struct qc_pinned *p)
{
    if (!p)
        return;
    if (p->arena_ok) {
        char key[64];
        snprintf(key, sizeof key, "arena.%u.destroy", p->arena);
        int rc = mallctl(key, NULL, NULL, NULL, 0);
        if (rc != 0)
            qc_log(QC_LOG_WARN, "pinned: mallctl(%s): %s", key, strerror(rc));
    }
    for (size_t i = 0; i < p->next; i++) {
        if (i < p->pin_next)
            unpin_extent(p, p->ext[i].base);
        munmap(p->ext[i].base, p->ext[i].size);
    }
    free(p->ext);
    pthread_mutex_destroy(&p->pin_lock);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

enum qc_status qc_pinned_malloc(struct qc_pinned *p, size_t size, size_t align, const char *tag,
                                void **out)
{
    if (align && ((align & (align - 1)) || align > PINNED_MAX_ALIGN))
        return qc_errorf(QC_ERR_INVALID,
                         "qc_pinned_malloc: alignment %zu is not a power of two <= 1 MiB", align);
    int flags = MALLOCX_ARENA(p->arena) | MALLOCX_TCACHE_NONE;
    if (align)
        flags |= MALLOCX_ALIGN(align);
    void *ptr = mallocx(size ? size : 1, flags);
    if (!ptr) {
        pthread_mutex_lock(&p->lock);
        p->st.n_ooms++;
        struct qc_pinned_stats s = p->st;
        pthread_mutex_unlock(&p->lock);
        char b1[32], b2[32], b3[32], b4[32];
        return qc_errorf(QC_ERR_NOMEM,
                         "pinned host memory exhausted: requested %s (%zu bytes, tag %s); "
                         "reserved %s, allocated %s, budget %s\nhint: raise the pinned host "
                         "budget or lower the offload window",
                         qc_alloc_bytes_str(size, b1, sizeof b1), size, tag ? tag : "-",
                         qc_alloc_bytes_str(s.bytes_reserved, b2, sizeof b2),
                         qc_alloc_bytes_str(s.bytes_allocated, b3, sizeof b3),
                         s.bytes_budget ? qc_alloc_bytes_str(s.bytes_budget, b4, sizeof b4)
                                        : "unlimited");
    }
    /* A new extent may hold ptr: pin it now, with jemalloc's locks released. */
    pthread_mutex_lock(&p->lock);
    const bool waiting = p->pin_next < p->next;
    pthread_mutex_unlock(&p->lock);
    enum qc_status pst = waiting ? pin_waiting(p) : QC_OK;
    if (pst != QC_OK) { /* fatal for ptr only if its own extent is still waiting */
        pthread_mutex_lock(&p->lock);
        const struct pinned_extent *e = ext_find(p, ptr);
        if (e && (size_t)(e - p->ext) < p->pin_next)
            pst = QC_OK;
        pthread_mutex_unlock(&p->lock);
    }
    if (pst != QC_OK) {
        dallocx(ptr, flags);
        pthread_mutex_lock(&p->lock);
        p->st.n_pin_failures++;
        pthread_mutex_unlock(&p->lock);
        char b1[32], cause[512];
        snprintf(cause, sizeof cause, "%s", qc_error_last());
        return qc_errorf(pst,
                         "pinned host memory: cannot pin a new extent for %s (%zu bytes, tag %s): "
                         "%s\nhint: the locked-memory limit (ulimit -l) or the driver refused; "
                         "lower the pinned host budget or the offload window",
                         qc_alloc_bytes_str(size, b1, sizeof b1), size, tag ? tag : "-", cause);
    }
    size_t usable = sallocx(ptr, flags);
    pthread_mutex_lock(&p->lock);
    alloc_stat_add(&p->st.bytes_allocated, &p->st.bytes_allocated_peak, usable);
    p->st.n_allocs++;
    p->st.n_live++;
    pthread_mutex_unlock(&p->lock);
    *out = ptr;
    return QC_OK;
}

void qc_pinned_free(struct qc_pinned *p, void *ptr)
{
    if (!ptr)
        return;
    int flags = MALLOCX_ARENA(p->arena) | MALLOCX_TCACHE_NONE;
    size_t usable = sallocx(ptr, flags);
    dallocx(ptr, flags);
    pthread_mutex_lock(&p->lock);
    alloc_stat_sub(&p->st.bytes_allocated, usable);
    p->st.n_frees++;
    p->st.n_live--;
    pthread_mutex_unlock(&p->lock);
}

void qc_pinned_stats_get(struct qc_pinned *p, struct qc_pinned_stats *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    out->fragmentation = p->st.bytes_allocated_peak ? (double)p->st.bytes_reserved_peak /
                                                          (double)p->st.bytes_allocated_peak
                                                    : 1.0;
    pthread_mutex_unlock(&p->lock);
}

void qc_pinned_reset_peak(struct qc_pinned *p)
{
    pthread_mutex_lock(&p->lock);
    p->st.bytes_allocated_peak = p->st.bytes_allocated;
    p->st.bytes_reserved_peak = p->st.bytes_reserved;
    pthread_mutex_unlock(&p->lock);
}
