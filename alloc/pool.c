/*
 * pool.c — the caching device allocator: pools, best fit with splitting and coalescing,
 * stream-ordered reuse through events, expandable segments, budget, release-and-retry, OOM.
 *
 * Data structures (alloc_internal.h has the fields and the invariants as equations):
 * - every segment is tiled by blocks in address order (prev/next);
 * - FREE mapped blocks of a pool sit in a treap keyed by (stream id, size, address), so best
 *   fit for stream S is one lower_bound(S, size) in O(log n);
 * - LIVE and PENDING blocks sit in a chained hash map keyed by address (free() finds them);
 * - an expandable segment is one VA reservation per (stream, large pool). Its blocks may be
 *   unmapped (FREE, granule-aligned, not in the treap). A request that no free block fits maps
 *   the missing granules of the best run of free blocks (mapped or not) and merges them, so the
 *   segment grows in place and freed memory always coalesces into one range. Releasing the
 *   cache decommits the whole granules inside free blocks, wherever they are.
 *
 * Stream order: a block is handed only to its segment's stream. Freed on that stream with no
 * other stream recorded, it is reusable at once (the stream's later work runs after its earlier
 * work). Otherwise an event is recorded on every other stream that used it and the block stays
 * PENDING until all of them completed (polled at the next malloc; waited for before releasing
 * the cache).
 */
#include "alloc_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "qc_oom.h"

#define ALLOC_MAP_INITIAL 1024
#define ALLOC_SLOP_LIMIT  ((size_t)1 << 30) /* refuse requests within 1 GiB of 2^48 */

// ---- small helpers ---------------------------------------------------------------------------

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static size_t align_down(size_t x, size_t a)
{
    return x / a * a;
}

static bool is_pow2(size_t x)
{
    return x && !(x & (x - 1));
}

static uint32_t stream_id_of(const struct qc_stream *s)
{
    return s ? qc_stream_id(s) : 0;
}

static uint32_t next_prio(struct qc_alloc *a)
{
    uint32_t x = a->rng; /* xorshift32 */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    a->rng = x;
    return x;
}

static void tag_copy(char *dst, const char *tag)
{
    if (!tag) {
        dst[0] = '\0';
        return;
    }
    size_t n = strnlen(tag, QC_ALLOC_TAG_MAX - 1);
    memcpy(dst, tag, n);
    dst[n] = '\0';
}

// ---- block structs ---------------------------------------------------------------------------

static struct alloc_block *block_get(struct qc_alloc *a)
{
    struct alloc_block *b = a->spare;
    if (b)
        a->spare = b->next;
    else
        b = malloc(sizeof *b);
    if (b)
        memset(b, 0, offsetof(struct alloc_block, tag) + 1);
    return b;
}

static void block_put(struct qc_alloc *a, struct alloc_block *b)
{
    free(b->uses);
    b->uses = NULL;
    b->next = a->spare;
    a->spare = b;
}

// ---- treap of free blocks --------------------------------------------------------------------

/* Key (place, size, address) packed as two words: a place is a stream id (below 2^16) and a
 * lifetime class (2 bits), sizes stay below 2^46 bytes (64 TiB), so (khi, addr) compares like
 * the triple. */
struct alloc_key {
    uint64_t hi;
    uintptr_t addr;
};

#define ALLOC_KEY_SIZE_BITS 46
#define ALLOC_LIFE_BITS     2

/* The free blocks of a segment serve requests of its stream and lifetime class only. */
static uint32_t place_of(uint32_t sid, int life)
{
    return sid << ALLOC_LIFE_BITS | (uint32_t)life;
}

static uint32_t seg_place(const struct alloc_segment *seg)
{
    return place_of(seg->stream_id, seg->life);
}

static uint64_t key_hi(uint32_t place, size_t size)
{
    return (uint64_t)place << ALLOC_KEY_SIZE_BITS | (uint64_t)size;
}

static struct alloc_key key_of(const struct alloc_block *b)
{
    struct alloc_key k = {b->khi, (uintptr_t)b->ptr};
    return k;
}

static bool key_less(struct alloc_key x, struct alloc_key y)
{
    return x.hi != y.hi ? x.hi < y.hi : x.addr < y.addr;
}

/* Splits t into l (keys < k) and r (keys >= k). */
static void treap_split(struct alloc_block *t, struct alloc_key k, struct alloc_block **l,
                        struct alloc_block **r)
{
    while (t) {
        if (key_less(key_of(t), k)) {
            *l = t;
            l = &t->tr;
            t = t->tr;
        } else {
            *r = t;
            r = &t->tl;
            t = t->tl;
        }
    }
    *l = NULL;
    *r = NULL;
}

/* Merges l and r (every key of l < every key of r). */
static struct alloc_block *treap_merge(struct alloc_block *l, struct alloc_block *r)
{
    struct alloc_block *root = NULL, **link = &root;
    while (l && r) {
        if (l->prio >= r->prio) {
            *link = l;
            link = &l->tr;
            l = l->tr;
        } else {
            *link = r;
            link = &r->tl;
            r = r->tl;
        }
    }
    *link = l ? l : r;
    return root;
}

static void treap_insert(struct qc_alloc *a, struct alloc_block *b)
{
    struct alloc_block **t = &a->free_root[b->seg->pool];
    b->khi = key_hi(seg_place(b->seg), b->size);
    struct alloc_key k = key_of(b);
    b->prio = next_prio(a);
    while (*t && (*t)->prio >= b->prio)
        t = key_less(k, key_of(*t)) ? &(*t)->tl : &(*t)->tr;
    treap_split(*t, k, &b->tl, &b->tr);
    *t = b;
}

static void treap_remove(struct qc_alloc *a, struct alloc_block *b)
{
    struct alloc_block **t = &a->free_root[b->seg->pool];
    struct alloc_key k = key_of(b);
    while (*t != b) {
        QC_ASSERT(*t, "free block %p (%zu bytes) missing from its pool", (void *)b->ptr, b->size);
        t = key_less(k, key_of(*t)) ? &(*t)->tl : &(*t)->tr;
    }
    *t = treap_merge(b->tl, b->tr);
    b->tl = b->tr = NULL;
}

/* Smallest free block of place with size >= size, or NULL. *link (when a block is found) is
 * the tree pointer that points at it, valid until the treap next changes. */
static struct alloc_block *treap_lower_bound(struct alloc_block **root, uint32_t place, size_t size,
                                             struct alloc_block ***link)
{
    struct alloc_key k = {key_hi(place, size), 0};
    struct alloc_block *best = NULL, **best_link = NULL, **t = root;
    while (*t) {
        if (!key_less(key_of(*t), k)) {
            best = *t;
            best_link = t;
            t = &(*t)->tl;
        } else {
            t = &(*t)->tr;
        }
    }
    if (!best || seg_place(best->seg) != place)
        return NULL;
    *link = best_link;
    return best;
}

/* Removes b, which *link points at (from treap_lower_bound). */
static void treap_remove_at(struct alloc_block **link, struct alloc_block *b)
{
    *link = treap_merge(b->tl, b->tr);
    b->tl = b->tr = NULL;
}

// ---- pointer map (LIVE and PENDING blocks) ---------------------------------------------------

static size_t map_slot(const struct qc_alloc *a, const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (a->nbuckets - 1);
}

static bool map_grow(struct qc_alloc *a)
{
    size_t n = a->nbuckets * 2;
    struct alloc_block **nb = calloc(n, sizeof *nb);
    if (!nb)
        return false;
    struct alloc_block **old = a->buckets;
    size_t nold = a->nbuckets;
    a->buckets = nb;
    a->nbuckets = n;
    for (size_t i = 0; i < nold; i++) {
        for (struct alloc_block *b = old[i], *nx; b; b = nx) {
            nx = b->hnext;
            size_t s = map_slot(a, b->ptr);
            b->hnext = nb[s];
            nb[s] = b;
        }
    }
    free(old);
    return true;
}

static void map_insert(struct qc_alloc *a, struct alloc_block *b)
{
    if (a->nmapped_blocks >= a->nbuckets)
        (void)map_grow(a); /* on failure the chains only get longer */
    size_t s = map_slot(a, b->ptr);
    b->hnext = a->buckets[s];
    a->buckets[s] = b;
    a->nmapped_blocks++;
}

static struct alloc_block *map_find(const struct qc_alloc *a, const void *p)
{
    for (struct alloc_block *b = a->buckets[map_slot(a, p)]; b; b = b->hnext)
        if (b->ptr == p)
            return b;
    return NULL;
}

static void map_remove(struct qc_alloc *a, struct alloc_block *b)
{
    struct alloc_block **l = &a->buckets[map_slot(a, b->ptr)];
    while (*l != b) {
        QC_ASSERT(*l, "block %p not in the pointer map", (void *)b->ptr);
        l = &(*l)->hnext;
    }
    *l = b->hnext;
    b->hnext = NULL;
    a->nmapped_blocks--;
}

// ---- segments --------------------------------------------------------------------------------

static void segment_link(struct qc_alloc *a, struct alloc_segment *seg)
{
    seg->prev = NULL;
    seg->next = a->segments;
    if (a->segments)
        a->segments->prev = seg;
    a->segments = seg;
    a->st.n_segments++;
}

static void segment_unlink(struct qc_alloc *a, struct alloc_segment *seg)
{
    if (seg->prev)
        seg->prev->next = seg->next;
    else
        a->segments = seg->next;
    if (seg->next)
        seg->next->prev = seg->prev;
    a->st.n_segments--;
}

static void reserved_add(struct qc_alloc *a, struct alloc_segment *seg, size_t n)
{
    seg->mapped += n;
    alloc_stat_add(&a->st.bytes_reserved, &a->st.bytes_reserved_peak, n);
    if (seg->pool == ALLOC_POOL_SMALL)
        a->st.bytes_reserved_small += n;
    a->st.n_maps++;
}

static void reserved_sub(struct qc_alloc *a, struct alloc_segment *seg, size_t n)
{
    seg->mapped -= n;
    alloc_stat_sub(&a->st.bytes_reserved, n);
    if (seg->pool == ALLOC_POOL_SMALL)
        a->st.bytes_reserved_small -= n;
    a->st.n_unmaps++;
}

static bool over_budget(const struct qc_alloc *a, size_t extra)
{
    return a->params.budget &&
           (extra > a->params.budget || a->st.bytes_reserved > a->params.budget - extra);
}

/* The metadata of a new segment: the segment record and its first block struct. */
static enum qc_status segment_meta_get(struct qc_alloc *a, struct alloc_segment **seg,
                                       struct alloc_block **b)
{
    *seg = calloc(1, sizeof **seg);
    *b = block_get(a);
    if (!*seg || !*b) {
        free(*seg);
        if (*b)
            block_put(a, *b);
        return qc_errorf(QC_ERR_NOMEM, "allocator metadata: out of host memory");
    }
    return QC_OK;
}

/* Fills in a new segment of `size` bytes at base whose one block b is FREE (not in the treap),
 * and links it. mapped: the block's memory is mapped (false: an expandable reservation). */
static void segment_init(struct qc_alloc *a, struct alloc_segment *seg, struct alloc_block *b,
                         int pool, struct qc_stream *s, int life, void *base, size_t size,
                         bool mapped)
{
    seg->base = base;
    seg->size = size;
    seg->pool = pool;
    seg->stream = s;
    seg->stream_id = stream_id_of(s);
    seg->life = (uint8_t)life;
    seg->first = b;
    b->ptr = base;
    b->size = size;
    b->seg = seg;
    b->mapped = mapped;
    b->state = ALLOC_BLOCK_FREE;
    segment_link(a, seg);
}

/* A new fixed segment of `size` bytes holding one FREE block (not in the treap); *out = block.
 * QC_ERR_NOMEM when over budget or the backend is out of memory. */
static enum qc_status segment_new_fixed(struct qc_alloc *a, int pool, struct qc_stream *s, int life,
                                        size_t size, struct alloc_block **out)
{
    if (over_budget(a, size))
        return qc_errorf(QC_ERR_NOMEM, "over budget");
    struct alloc_segment *seg = NULL;
    struct alloc_block *b = NULL;
    QC_TRY(segment_meta_get(a, &seg, &b));
    void *p = NULL;
    enum qc_status st = a->raw.ops->map(&a->raw, size, &p);
    if (st != QC_OK) {
        free(seg);
        block_put(a, b);
        return st;
    }
    segment_init(a, seg, b, pool, s, life, p, size, true);
    reserved_add(a, seg, size);
    alloc_trace_event(a, QC_ALLOC_EV_MAP, p, size, 0, seg->stream_id, pool, NULL);
    *out = b;
    return QC_OK;
}

static struct alloc_segment *segment_find_expandable(struct qc_alloc *a, uint32_t place)
{
    for (struct alloc_segment *seg = a->segments; seg; seg = seg->next)
        if (seg->expandable && seg_place(seg) == place)
            return seg;
    return NULL;
}

static enum qc_status segment_new_expandable(struct qc_alloc *a, struct qc_stream *s, int life,
                                             struct alloc_segment **out)
{
    struct alloc_segment *seg = NULL;
    struct alloc_block *b = NULL;
    QC_TRY(segment_meta_get(a, &seg, &b));
    void *base = NULL, *handle = NULL;
    enum qc_status st = a->raw.ops->reserve(&a->raw, a->va_size, &base, &handle);
    if (st != QC_OK) {
        free(seg);
        block_put(a, b);
        return st;
    }
    seg->expandable = true;
    seg->handle = handle;
    segment_init(a, seg, b, ALLOC_POOL_LARGE, s, life, base, a->va_size, false);
    *out = seg;
    return QC_OK;
}

/* Frees a segment's block structs and metadata (its memory is already unmapped). */
static void segment_free(struct qc_alloc *a, struct alloc_segment *seg)
{
    for (struct alloc_block *b = seg->first, *nx; b; b = nx) {
        nx = b->next;
        block_put(a, b);
    }
    free(seg);
}

// ---- splitting and coalescing ----------------------------------------------------------------

/* Cuts b at offset off: b keeps [ptr, ptr + off), the returned block gets the rest with b's
 * state and mapping. Neither is (re)inserted anywhere. NULL when out of host memory. */
static struct alloc_block *block_split(struct qc_alloc *a, struct alloc_block *b, size_t off)
{
    struct alloc_block *r = block_get(a);
    if (!r)
        return NULL;
    r->ptr = b->ptr + off;
    r->size = b->size - off;
    r->seg = b->seg;
    r->mapped = b->mapped;
    r->state = b->state;
    r->prev = b;
    r->next = b->next;
    if (b->next)
        b->next->prev = r;
    b->next = r;
    b->size = off;
    return r;
}

/* Absorbs b->next into b (both FREE with the same mapping, neither in the treap). */
static void block_absorb_next(struct qc_alloc *a, struct alloc_block *b)
{
    struct alloc_block *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    block_put(a, n);
}

static bool mergeable(const struct alloc_block *b, bool mapped)
{
    return b && b->state == ALLOC_BLOCK_FREE && b->mapped == mapped;
}

/* Makes b (out of every index) FREE, coalesces it with FREE neighbours of the same mapping
 * and, if mapped, inserts the result into its pool. Returns the merged block. */
static struct alloc_block *block_release(struct qc_alloc *a, struct alloc_block *b)
{
    b->state = ALLOC_BLOCK_FREE;
    b->requested = 0;
    b->tag[0] = '\0';
    b->nuses = 0;
    if (mergeable(b->prev, b->mapped)) {
        struct alloc_block *p = b->prev;
        if (p->mapped)
            treap_remove(a, p);
        block_absorb_next(a, p);
        b = p;
    }
    if (mergeable(b->next, b->mapped)) {
        if (b->next->mapped)
            treap_remove(a, b->next);
        block_absorb_next(a, b);
    }
    if (b->mapped)
        treap_insert(a, b);
    return b;
}

// ---- events: stream-ordered frees ------------------------------------------------------------

static enum qc_status event_get(struct qc_alloc *a, struct qc_event **out)
{
    if (a->nevent_pool) {
        *out = a->event_pool[--a->nevent_pool];
        return QC_OK;
    }
    return qc_event_create(a->dev, out);
}

static void event_put(struct qc_alloc *a, struct qc_event *ev)
{
    if (a->nevent_pool == a->cap_event_pool) {
        size_t n = a->cap_event_pool ? 2 * a->cap_event_pool : 16;
        struct qc_event **p = realloc(a->event_pool, n * sizeof *p);
        if (!p) {
            qc_event_destroy(ev);
            return;
        }
        a->event_pool = p;
        a->cap_event_pool = n;
    }
    a->event_pool[a->nevent_pool++] = ev;
}

static void pending_done(struct qc_alloc *a, struct alloc_block *b)
{
    if (--b->nevents)
        return;
    map_remove(a, b);
    alloc_stat_sub(&a->st.bytes_active, b->size);
    a->st.n_pending--;
    uint32_t sid = b->seg->stream_id;
    int pool = b->seg->pool;
    alloc_trace_event(a, QC_ALLOC_EV_READY, b->ptr, b->size, 0, sid, pool, b->tag);
    (void)block_release(a, b);
}

/* Retires the pending frees whose events completed (all of them, waiting, when wait). */
static void process_events(struct qc_alloc *a, bool wait)
{
    size_t keep = 0;
    for (size_t i = 0; i < a->npending; i++) {
        struct alloc_pending pe = a->pending[i];
        bool done = false;
        enum qc_status st = wait ? qc_event_synchronize(pe.ev) : qc_event_query(pe.ev, &done);
        if (wait && st == QC_OK)
            done = true;
        if (st != QC_OK) {
            /* A failed stream: its work is over one way or another; the block is reusable. */
            qc_log(QC_LOG_WARN, "alloc: waiting on a free's event: %s", qc_error_last());
            done = true;
        }
        if (done) {
            event_put(a, pe.ev);
            pending_done(a, pe.block);
        } else {
            a->pending[keep++] = pe;
        }
    }
    a->npending = keep;
}

static bool pending_push(struct qc_alloc *a, struct qc_event *ev, struct alloc_block *b)
{
    if (a->npending == a->cap_pending) {
        size_t n = a->cap_pending ? 2 * a->cap_pending : 64;
        struct alloc_pending *p = realloc(a->pending, n * sizeof *p);
        if (!p)
            return false;
        a->pending = p;
        a->cap_pending = n;
    }
    a->pending[a->npending].ev = ev;
    a->pending[a->npending].block = b;
    a->npending++;
    return true;
}

static enum qc_status block_add_use(struct alloc_block *b, struct qc_stream *s)
{
    if (s == b->seg->stream)
        return QC_OK;
    for (uint32_t i = 0; i < b->nuses; i++)
        if (b->uses[i] == s)
            return QC_OK;
    if (b->nuses == b->cap_uses) {
        uint32_t n = b->cap_uses ? 2 * b->cap_uses : 2;
        struct qc_stream **p = realloc(b->uses, n * sizeof *p);
        if (!p)
            return qc_errorf(QC_ERR_NOMEM, "record_stream: out of host memory");
        b->uses = p;
        b->cap_uses = n;
    }
    b->uses[b->nuses++] = s;
    return QC_OK;
}

// ---- finding and making room -----------------------------------------------------------------

/* Sizes are multiples of the rounding and at least QC_ALLOC_ALIGN, so every block of a segment
 * (whose base is page-aligned) starts QC_ALLOC_ALIGN-aligned. */
static size_t round_size(const struct qc_alloc *a, size_t size)
{
    size_t r = qc_alloc_round_effective(a->params.round);
    return size < r ? r : align_up(size, r);
}

static struct alloc_block *find_free(struct qc_alloc *a, int pool, uint32_t place, size_t rsize,
                                     struct alloc_block ***link)
{
    struct alloc_block *b = treap_lower_bound(&a->free_root[pool], place, rsize, link);
    size_t lim = a->params.split_limit;
    if (b && pool == ALLOC_POOL_LARGE && lim) {
        /* Oversize blocks (> split limit) only serve big requests, with bounded waste. */
        if (rsize < lim && b->size > lim)
            return NULL;
        if (rsize >= lim && b->size - rsize >= a->params.large_segment)
            return NULL;
    }
    return b;
}

static bool should_split(const struct qc_alloc *a, const struct alloc_block *b, size_t rsize)
{
    size_t remaining = b->size - rsize;
    if (b->seg->pool == ALLOC_POOL_SMALL || b->seg->expandable)
        return remaining >= a->params.round;
    if (a->params.split_limit && b->size > a->params.split_limit)
        return false;
    return remaining > a->params.small_max;
}

/* Maps granules of expandable segment seg so that a FREE mapped block of >= rsize exists; it is
 * returned (in the treap). The run of FREE blocks (mapped or not) that needs the fewest new
 * bytes is chosen (ties: the smallest run). */
static enum qc_status expand_in(struct qc_alloc *a, struct alloc_segment *seg, size_t rsize,
                                struct alloc_block **out)
{
    const size_t g = a->raw.granularity;
    struct alloc_block *best = NULL;
    size_t best_need = SIZE_MAX, best_total = SIZE_MAX;
    for (struct alloc_block *b = seg->first; b;) {
        if (b->state != ALLOC_BLOCK_FREE) {
            b = b->next;
            continue;
        }
        /* b starts a maximal run of FREE blocks. */
        size_t total = 0, need = 0;
        bool has_unmapped = false;
        struct alloc_block *e = b;
        for (; e && e->state == ALLOC_BLOCK_FREE; e = e->next) {
            if (!e->mapped) {
                has_unmapped = true;
                if (total < rsize)
                    need += align_up((rsize - total < e->size ? rsize - total : e->size), g);
            }
            total += e->size;
        }
        if (has_unmapped && total >= rsize &&
            (need < best_need || (need == best_need && total < best_total))) {
            best = b;
            best_need = need;
            best_total = total;
        }
        b = e;
    }
    if (!best)
        return qc_errorf(QC_ERR_NOMEM, "expandable segment address space exhausted");
    if (over_budget(a, best_need))
        return qc_errorf(QC_ERR_NOMEM, "over budget");

    /* Map the unmapped blocks covering [best, best + rsize). */
    size_t covered = 0;
    for (struct alloc_block *b = best; covered < rsize; b = b->next) {
        if (!b->mapped) {
            size_t len = align_up(rsize - covered < b->size ? rsize - covered : b->size, g);
            size_t off = (size_t)(b->ptr - seg->base);
            QC_TRY(a->raw.ops->commit(&a->raw, seg->handle, off, len));
            if (len < b->size && !block_split(a, b, len)) {
                (void)a->raw.ops->decommit(&a->raw, seg->handle, off, len);
                return qc_errorf(QC_ERR_NOMEM, "allocator metadata: out of host memory");
            }
            b->mapped = true;
            reserved_add(a, seg, len);
            alloc_trace_event(a, QC_ALLOC_EV_MAP, b->ptr, len, 0, seg->stream_id, seg->pool, NULL);
        } else {
            treap_remove(a, b);
        }
        covered += b->size;
    }
    /* Coalesce everything mapped and free from best on. Blocks past the processed range that
     * were already FREE and mapped are in the treap. */
    char *processed_end = best->ptr + covered;
    while (mergeable(best->next, true)) {
        if (best->next->ptr >= processed_end)
            treap_remove(a, best->next);
        block_absorb_next(a, best);
    }
    treap_insert(a, best);
    *out = best;
    return QC_OK;
}

/* The best fit among the free blocks of sid's other lifetime classes (the smallest that fits;
 * ties: the lower class), or NULL: where a request goes when its own class has no room and
 * the budget allows no more. */
static struct alloc_block *find_free_other(struct qc_alloc *a, int pool, uint32_t sid, int life,
                                           size_t rsize, struct alloc_block ***link)
{
    struct alloc_block *best = NULL;
    for (int l = 0; l < QC_ALLOC_LIFE_COUNT; l++) {
        struct alloc_block **lk = NULL;
        struct alloc_block *b = l == life ? NULL : find_free(a, pool, place_of(sid, l), rsize, &lk);
        if (b && (!best || b->size < best->size)) {
            best = b;
            *link = lk;
        }
    }
    return best;
}

/* Makes room for rsize bytes of pool on stream s in lifetime class life: a new fixed segment
 * or an expansion. *out = a FREE mapped block >= rsize. QC_ERR_NOMEM when the budget or the
 * backend says no. exact: near the budget a fixed segment may have the request's own size. */
static enum qc_status grow(struct qc_alloc *a, int pool, struct qc_stream *s, int life,
                           size_t rsize, bool exact, struct alloc_block **out)
{
    const struct qc_alloc_params *p = &a->params;
    if (pool == ALLOC_POOL_LARGE && p->expandable) {
        struct alloc_segment *seg = segment_find_expandable(a, place_of(stream_id_of(s), life));
        if (!seg)
            QC_TRY(segment_new_expandable(a, s, life, &seg));
        return expand_in(a, seg, rsize, out);
    }
    size_t size;
    if (pool == ALLOC_POOL_SMALL)
        size = p->small_segment;
    else if (rsize < p->large_segment / 2)
        size = p->large_segment;
    else
        size = align_up(rsize, p->small_segment);
    /* near the budget: a request that fits what is left but not a whole segment of the usual
     * size gets a segment of its own size (rsize is a multiple of the rounding) rather than
     * failing on the segment size (issue 25) */
    if (exact && size > rsize && over_budget(a, size) && !over_budget(a, rsize))
        size = rsize;
    struct alloc_block *b = NULL;
    QC_TRY(segment_new_fixed(a, pool, s, life, size, &b));
    treap_insert(a, b);
    *out = b;
    return QC_OK;
}

/* Decommits the whole granules inside FREE mapped block b of an expandable segment, leaving
 * [head mapped][middle unmapped][tail mapped]; returns the block after b's original range. */
static struct alloc_block *release_granules(struct qc_alloc *a, struct alloc_block *b)
{
    struct alloc_segment *seg = b->seg;
    const size_t g = a->raw.granularity;
    size_t off = (size_t)(b->ptr - seg->base), end = off + b->size;
    size_t lo = align_up(off, g), hi = align_down(end, g);
    if (hi <= lo)
        return b->next;
    if (a->raw.ops->decommit(&a->raw, seg->handle, lo, hi - lo) != QC_OK) {
        qc_log(QC_LOG_WARN, "alloc: releasing cached memory: %s", qc_error_last());
        return b->next;
    }
    treap_remove(a, b);
    struct alloc_block *mid = b, *tail = NULL;
    bool head = lo > off;
    if (head) {
        mid = block_split(a, b, lo - off);
        QC_ASSERT(mid, "out of host memory while releasing the cache");
        treap_insert(a, b);
    }
    if (hi < end) {
        tail = block_split(a, mid, hi - lo);
        QC_ASSERT(tail, "out of host memory while releasing the cache");
        treap_insert(a, tail);
    }
    mid->mapped = false;
    reserved_sub(a, seg, hi - lo);
    alloc_trace_event(a, QC_ALLOC_EV_UNMAP, mid->ptr, hi - lo, 0, seg->stream_id, seg->pool, NULL);
    struct alloc_block *resume = tail ? tail->next : mid->next;
    if (!tail && mergeable(mid->next, false)) {
        resume = mid->next->next;
        block_absorb_next(a, mid);
    }
    if (!head && mergeable(mid->prev, false))
        block_absorb_next(a, mid->prev);
    return resume;
}

/* Waits for every pending free, synchronizes the device and gives every cached byte back to the
 * raw backend that can be given back. */
static void release_cache(struct qc_alloc *a)
{
    if (a->npending)
        process_events(a, true);
    if (a->dev) {
        enum qc_status st = qc_device_synchronize(a->dev);
        if (st != QC_OK)
            qc_log(QC_LOG_WARN, "alloc: synchronize before releasing the cache: %s",
                   qc_error_last());
    }
    for (struct alloc_segment *seg = a->segments, *nseg; seg; seg = nseg) {
        nseg = seg->next;
        if (!seg->expandable) {
            struct alloc_block *b = seg->first;
            if (b->next || b->state != ALLOC_BLOCK_FREE)
                continue;
            treap_remove(a, b);
            a->raw.ops->unmap(&a->raw, seg->base, seg->size);
            reserved_sub(a, seg, seg->size);
            alloc_trace_event(a, QC_ALLOC_EV_UNMAP, seg->base, seg->size, 0, seg->stream_id,
                              seg->pool, NULL);
            segment_unlink(a, seg);
            segment_free(a, seg);
            continue;
        }
        for (struct alloc_block *b = seg->first; b;) {
            if (b->state == ALLOC_BLOCK_FREE && b->mapped)
                b = release_granules(a, b);
            else
                b = b->next;
        }
        if (seg->mapped == 0) {
            a->raw.ops->release(&a->raw, seg->handle);
            segment_unlink(a, seg);
            segment_free(a, seg);
        }
    }
}

// ---- public API ------------------------------------------------------------------------------

void qc_alloc_params_default(struct qc_alloc_params *p)
{
    memset(p, 0, sizeof *p);
    p->round = 512;
    p->small_max = (size_t)1 << 20;
    p->small_segment = (size_t)2 << 20;
    p->large_segment = (size_t)20 << 20;
    p->expandable = true;
    p->trace_capacity = 65536;
}

void qc_alloc_params_pytorch_like(struct qc_alloc_params *p)
{
    qc_alloc_params_default(p);
    p->expandable = false;
}

static enum qc_status params_check(const struct qc_alloc_params *p)
{
    if (!is_pow2(p->round) || p->round > ((size_t)1 << 20))
        return qc_errorf(QC_ERR_INVALID, "allocator: round %zu is not a power of two <= 1 MiB",
                         p->round);
    if (p->small_max < p->round || p->small_segment < p->small_max || p->small_segment % p->round ||
        p->large_segment < p->small_segment || p->large_segment % p->round)
        return qc_errorf(QC_ERR_INVALID,
                         "allocator: need round <= small_max <= small_segment <= large_segment "
                         "(all multiples of round); got %zu, %zu, %zu, %zu",
                         p->round, p->small_max, p->small_segment, p->large_segment);
    if (p->trace && p->trace_capacity == 0)
        return qc_errorf(QC_ERR_INVALID, "allocator: trace on with trace_capacity 0");
    return QC_OK;
}

enum qc_status qc_alloc_create(struct qc_device *dev, const struct qc_alloc_params *params,
                               struct qc_alloc **out)
{
    struct qc_alloc_params p;
    if (params)
        p = *params;
    else
        qc_alloc_params_default(&p);
    QC_TRY(params_check(&p));
    if (p.emu && dev && qc_device_kind_of(dev) == QC_DEVICE_CUDA)
        return qc_errorf(QC_ERR_INVALID, "allocator: an emulated-device arena is for the host "
                                         "backend, not a CUDA device");
    if (p.emu)
        p.expandable = false; /* the arena has no reserve-and-commit: plain segments */
    struct qc_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return qc_errorf(QC_ERR_NOMEM, "allocator: out of host memory");
    a->dev = dev;
    a->compute = dev ? qc_device_compute_stream(dev) : NULL;
    a->params = p;
    a->params.trace_file = NULL; /* the caller's string is not kept */
    a->rng = 0x2545f491u;
    a->st.bytes_budget = p.budget;
    enum qc_status st = alloc_peak_init(a);
    if (st != QC_OK) {
        free(a);
        return st;
    }
    if (dev && qc_device_kind_of(dev) == QC_DEVICE_CUDA) {
#ifdef QC_HAVE_CUDA
        st = alloc_raw_cuda_init(&a->raw);
#else
        st = qc_errorf(QC_ERR_UNSUPPORTED, "allocator: CUDA device in a CPU-only build");
#endif
    } else if (p.emu) {
        st = alloc_raw_emu_init(&a->raw, p.emu);
    } else {
        st = alloc_raw_host_init(&a->raw);
    }
    if (st != QC_OK) {
        alloc_peak_deinit(a);
        free(a);
        return st;
    }
    size_t g = a->raw.granularity;
    a->va_size = p.budget ? align_up(p.budget, g) * 4 : a->raw.va_default;
    a->nbuckets = ALLOC_MAP_INITIAL;
    a->buckets = calloc(a->nbuckets, sizeof *a->buckets);
    if (!a->buckets)
        st = qc_errorf(QC_ERR_NOMEM, "allocator: out of host memory");
    if (st == QC_OK)
        st = alloc_trace_init(&a->trace, &p);
    if (st == QC_OK && pthread_mutex_init(&a->lock, NULL) != 0)
        st = qc_errorf(QC_ERR_NOMEM, "allocator: pthread_mutex_init failed");
    if (st != QC_OK) {
        alloc_trace_deinit(&a->trace);
        free(a->buckets);
        a->raw.ops->deinit(&a->raw);
        alloc_peak_deinit(a);
        free(a);
        return st;
    }
    *out = a;
    return QC_OK;
}

void qc_alloc_destroy(struct qc_alloc *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->lock);
    if (a->npending)
        process_events(a, true);
    if (a->dev && qc_device_synchronize(a->dev) != QC_OK)
        qc_log(QC_LOG_WARN, "alloc: destroy: %s", qc_error_last());
    for (struct alloc_segment *seg = a->segments, *nseg; seg; seg = nseg) {
        nseg = seg->next;
        if (seg->expandable)
            a->raw.ops->release(&a->raw, seg->handle);
        else
            a->raw.ops->unmap(&a->raw, seg->base, seg->size);
        segment_free(a, seg);
    }
    for (struct alloc_block *b = a->spare, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    for (size_t i = 0; i < a->nevent_pool; i++)
        qc_event_destroy(a->event_pool[i]);
    free(a->event_pool);
    free(a->pending);
    free(a->buckets);
    alloc_peak_deinit(a);
    alloc_trace_deinit(&a->trace);
    a->raw.ops->deinit(&a->raw);
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

/* Hands b (FREE, mapped, in the treap, >= rsize) out as a LIVE block. */
static void block_take(struct qc_alloc *a, struct alloc_block *b, struct alloc_block **link,
                       size_t rsize, size_t size, const char *tag)
{
    if (link)
        treap_remove_at(link, b);
    else
        treap_remove(a, b);
    if (b->size > rsize && should_split(a, b, rsize)) {
        struct alloc_block *rest = block_split(a, b, rsize);
        if (rest) {
            rest->state = ALLOC_BLOCK_FREE;
            treap_insert(a, rest);
        }
    }
    b->state = ALLOC_BLOCK_LIVE;
    b->requested = size;
    b->nevents = 0;
    b->nuses = 0;
    tag_copy(b->tag, tag);
    map_insert(a, b);
    alloc_tag_add(a, b);
    alloc_stat_add(&a->st.bytes_allocated, &a->st.bytes_allocated_peak, b->size);
    alloc_stat_add(&a->st.bytes_requested, &a->st.bytes_requested_peak, size);
    alloc_stat_add(&a->st.bytes_active, &a->st.bytes_active_peak, b->size);
    a->st.n_allocs++;
    a->st.n_live++;
    alloc_peak_note(a);
    alloc_trace_event(a, QC_ALLOC_EV_ALLOC, b->ptr, b->size, size, b->seg->stream_id, b->seg->pool,
                      b->tag);
}

enum qc_status qc_alloc_malloc(struct qc_alloc *a, size_t size, struct qc_stream *stream,
                               const char *tag, void **out)
{
    return qc_alloc_malloc_life(a, size, stream, QC_ALLOC_LIFE_LONG, tag, out);
}

/* Where a request goes: a free block of its own place (for a SPAN request, else of another
 * class); else room made for it there (a new segment or granules); else, over the budget, a
 * free block of another lifetime class; else a segment of the request's own size near the
 * budget. */
static enum qc_status place_block(struct qc_alloc *a, int pool, struct qc_stream *s, int life,
                                  size_t rsize, struct alloc_block **b, struct alloc_block ***link)
{
    uint32_t sid = stream_id_of(s);
    *link = NULL;
    *b = find_free(a, pool, place_of(sid, life), rsize, link);
    if (*b)
        return QC_OK;
    if (life == QC_ALLOC_LIFE_SPAN) {
        /* scratch is freed before its span ends: in another class's free block it pins
         * nothing for long, and the classes' peaks (at different moments) overlap */
        *b = find_free_other(a, pool, sid, life, rsize, link);
        if (*b)
            return QC_OK;
    }
    *link = NULL;
    enum qc_status st = grow(a, pool, s, life, rsize, false, b);
    if (st != QC_ERR_NOMEM)
        return st;
    *b = find_free_other(a, pool, sid, life, rsize, link);
    if (*b)
        return QC_OK;
    *link = NULL;
    return grow(a, pool, s, life, rsize, true, b);
}

enum qc_status qc_alloc_malloc_life(struct qc_alloc *a, size_t size, struct qc_stream *stream,
                                    enum qc_alloc_life life, const char *tag, void **out)
{
    QC_ASSERT((unsigned)life < QC_ALLOC_LIFE_COUNT, "lifetime class %d", (int)life);
    struct qc_stream *s = stream ? stream : a->compute;
    QC_ASSERT(!s || a->dev, "allocator without a device given a stream");
    uint32_t sid = stream_id_of(s);
    QC_ASSERT(sid < (1u << (64 - ALLOC_KEY_SIZE_BITS - ALLOC_LIFE_BITS)), "stream id %u too large",
              sid);
    pthread_mutex_lock(&a->lock);
    if (size > ((size_t)1 << ALLOC_KEY_SIZE_BITS) - ALLOC_SLOP_LIMIT) {
        a->st.n_ooms++;
        char report[4096];
        alloc_report_format_locked(a, size, report, sizeof report);
        pthread_mutex_unlock(&a->lock);
        return qc_errorf(QC_ERR_NOMEM, "%s", report);
    }
    size_t rsize = round_size(a, size);
    int pool = rsize <= a->params.small_max ? ALLOC_POOL_SMALL : ALLOC_POOL_LARGE;
    if (a->npending)
        process_events(a, false);
    struct alloc_block **link = NULL;
    struct alloc_block *b = NULL;
    enum qc_status st = place_block(a, pool, s, (int)life, rsize, &b, &link);
    if (st == QC_ERR_NOMEM) {
        /* Release the cache and retry once. */
        a->st.n_retries++;
        release_cache(a);
        st = place_block(a, pool, s, (int)life, rsize, &b, &link);
    }
    if (st != QC_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", qc_error_last());
        size_t need = 4096 + 256;
        char *report = malloc(need);
        if (st == QC_ERR_NOMEM) {
            a->st.n_ooms++;
            alloc_trace_event(a, QC_ALLOC_EV_OOM, NULL, rsize, size, sid, pool, tag);
        }
        if (report)
            alloc_report_format_locked(a, size, report, need);
        /* the figures for the caller's short message, the hint from its one place (qc_oom.h) */
        const struct qc_oom_facts facts = {.bytes_requested = size,
                                           .bytes_budget = a->st.bytes_budget,
                                           .bytes_allocated = a->st.bytes_allocated,
                                           .bytes_reserved = a->st.bytes_reserved};
        pthread_mutex_unlock(&a->lock);
        if (st == QC_ERR_NOMEM) {
            char hint[256];
            qc_errorf(st, "%s  cause: %s\n%s", report ? report : "qc_alloc: out of memory\n", why,
                      qc_oom_hint(&facts, hint, sizeof hint));
            qc_oom_record(&facts);
        } else
            qc_errorf(st, "allocating %zu bytes (tag %s): %s", size, tag ? tag : "-", why);
        free(report);
        return st;
    }
    block_take(a, b, link, rsize, size, tag);
    void *p = b->ptr;
    pthread_mutex_unlock(&a->lock);
    *out = p;
    return QC_OK;
}

void qc_alloc_free(struct qc_alloc *a, void *p, struct qc_stream *stream)
{
    if (!p)
        return;
    struct qc_stream *s = stream ? stream : a->compute;
    QC_ASSERT(!s || a->dev, "allocator without a device given a stream");
    pthread_mutex_lock(&a->lock);
    struct alloc_block *b = map_find(a, p);
    QC_ASSERT(b && b->state == ALLOC_BLOCK_LIVE, "qc_alloc_free(%p): not a live allocation%s", p,
              b ? " (freed twice)" : "");
    alloc_stat_sub(&a->st.bytes_allocated, b->size);
    alloc_tag_sub(a, b);
    alloc_stat_sub(&a->st.bytes_requested, b->requested);
    a->st.n_frees++;
    a->st.n_live--;
    alloc_trace_event(a, QC_ALLOC_EV_FREE, b->ptr, b->size, 0, stream_id_of(s), b->seg->pool,
                      b->tag);
    if (s != b->seg->stream && block_add_use(b, s) != QC_OK && s) {
        qc_log(QC_LOG_WARN, "alloc: free: %s; synchronizing the stream instead", qc_error_last());
        (void)qc_stream_synchronize(s);
    }
    b->state = ALLOC_BLOCK_PENDING;
    b->nevents = 1; /* held until every event is recorded */
    a->st.n_pending++;
    for (uint32_t i = 0; i < b->nuses; i++) {
        struct qc_event *ev = NULL;
        enum qc_status st = event_get(a, &ev);
        if (st == QC_OK) {
            st = qc_event_record(ev, b->uses[i]);
            if (st == QC_OK && pending_push(a, ev, b)) {
                b->nevents++;
                continue;
            }
            event_put(a, ev);
        }
        qc_log(QC_LOG_WARN, "alloc: free: recording an event failed (%s); synchronizing",
               qc_error_last());
        (void)qc_stream_synchronize(b->uses[i]);
    }
    b->nuses = 0;
    if (b->nevents == 1) {
        /* Only the owner stream used it: reusable by that stream right away. */
        b->nevents = 0;
        a->st.n_pending--;
        map_remove(a, b);
        alloc_stat_sub(&a->st.bytes_active, b->size);
        (void)block_release(a, b);
    } else {
        pending_done(a, b); /* drops the hold */
    }
    pthread_mutex_unlock(&a->lock);
}

enum qc_status qc_alloc_record_stream(struct qc_alloc *a, void *p, struct qc_stream *stream)
{
    if (!stream)
        stream = a->compute;
    pthread_mutex_lock(&a->lock);
    struct alloc_block *b = map_find(a, p);
    enum qc_status st;
    if (!b || b->state != ALLOC_BLOCK_LIVE)
        st = qc_errorf(QC_ERR_INVALID, "qc_alloc_record_stream(%p): not a live allocation", p);
    else
        st = block_add_use(b, stream);
    pthread_mutex_unlock(&a->lock);
    return st;
}

size_t qc_alloc_usable_size(struct qc_alloc *a, const void *p)
{
    pthread_mutex_lock(&a->lock);
    struct alloc_block *b = map_find(a, p);
    size_t n = b && b->state == ALLOC_BLOCK_LIVE ? b->size : 0;
    pthread_mutex_unlock(&a->lock);
    return n;
}

enum qc_status qc_alloc_empty_cache(struct qc_alloc *a)
{
    pthread_mutex_lock(&a->lock);
    release_cache(a);
    pthread_mutex_unlock(&a->lock);
    return QC_OK;
}

void qc_alloc_set_step(struct qc_alloc *a, int64_t step)
{
    pthread_mutex_lock(&a->lock);
    a->st.step = step;
    alloc_trace_event(a, QC_ALLOC_EV_STEP, NULL, 0, 0, 0, 0, NULL);
    pthread_mutex_unlock(&a->lock);
}

// ---- introspection ---------------------------------------------------------------------------

/* Checks the treap under t: BST order within (lo, hi), heap order, membership; counts nodes. */
static enum qc_status check_treap(const struct alloc_block *t, int pool,
                                  const struct alloc_block *lo, const struct alloc_block *hi,
                                  size_t *count)
{
    if (!t)
        return QC_OK;
    if (t->state != ALLOC_BLOCK_FREE || !t->mapped || t->seg->pool != pool ||
        t->khi != key_hi(seg_place(t->seg), t->size))
        return qc_errorf(QC_ERR_INVALID, "treap %d holds block %p (state %d, mapped %d)", pool,
                         (void *)t->ptr, t->state, t->mapped);
    if ((lo && !key_less(key_of(lo), key_of(t))) || (hi && !key_less(key_of(t), key_of(hi))))
        return qc_errorf(QC_ERR_INVALID, "treap %d out of order at %p", pool, (void *)t->ptr);
    if ((t->tl && t->tl->prio > t->prio) || (t->tr && t->tr->prio > t->prio))
        return qc_errorf(QC_ERR_INVALID, "treap %d heap order broken at %p", pool, (void *)t->ptr);
    (*count)++;
    QC_TRY(check_treap(t->tl, pool, lo, t, count));
    return check_treap(t->tr, pool, t, hi, count);
}

static enum qc_status check_locked(struct qc_alloc *a)
{
    const size_t g = a->raw.granularity;
    size_t allocated = 0, requested = 0, pending_bytes = 0, reserved = 0, reserved_small = 0;
    size_t nlive = 0, npend = 0, nfree_mapped = 0, nseg = 0;
    for (struct alloc_segment *seg = a->segments; seg; seg = seg->next) {
        nseg++;
        if (seg->first->prev || seg->first->ptr != seg->base)
            return qc_errorf(QC_ERR_INVALID, "segment %p: first block wrong", (void *)seg->base);
        size_t total = 0, mapped = 0;
        char *mapped_end = seg->base; /* end of the granule union counted so far */
        for (struct alloc_block *b = seg->first; b; b = b->next) {
            if (b->seg != seg || b->ptr != seg->base + total)
                return qc_errorf(QC_ERR_INVALID, "segment %p: block %p not contiguous",
                                 (void *)seg->base, (void *)b->ptr);
            if (b->next && b->next->prev != b)
                return qc_errorf(QC_ERR_INVALID, "block %p: next->prev broken", (void *)b->ptr);
            if (b->size == 0 || b->size % a->params.round)
                return qc_errorf(QC_ERR_INVALID, "block %p: size %zu", (void *)b->ptr, b->size);
            if (b->state == ALLOC_BLOCK_FREE && b->next && b->next->state == ALLOC_BLOCK_FREE &&
                b->next->mapped == b->mapped)
                return qc_errorf(QC_ERR_INVALID, "blocks %p and %p: free neighbours not merged",
                                 (void *)b->ptr, (void *)b->next->ptr);
            if (!seg->expandable && !b->mapped)
                return qc_errorf(QC_ERR_INVALID, "fixed segment block %p unmapped", (void *)b->ptr);
            if (!b->mapped) {
                size_t off = (size_t)(b->ptr - seg->base);
                if (b->state != ALLOC_BLOCK_FREE || off % g || b->size % g)
                    return qc_errorf(QC_ERR_INVALID, "unmapped block %p: state %d, off %zu",
                                     (void *)b->ptr, b->state, off);
            } else if (seg->expandable) {
                char *lo = seg->base + align_down((size_t)(b->ptr - seg->base), g);
                char *hi = seg->base + align_up((size_t)(b->ptr + b->size - seg->base), g);
                if (lo < mapped_end)
                    lo = mapped_end;
                if (hi > lo)
                    mapped += (size_t)(hi - lo);
                if (hi > mapped_end)
                    mapped_end = hi;
            }
            if (b->state == ALLOC_BLOCK_LIVE || b->state == ALLOC_BLOCK_PENDING) {
                if (map_find(a, b->ptr) != b)
                    return qc_errorf(QC_ERR_INVALID, "block %p missing from the pointer map",
                                     (void *)b->ptr);
            }
            if (b->state == ALLOC_BLOCK_LIVE) {
                if (b->tag_id >= a->tags.n)
                    return qc_errorf(QC_ERR_INVALID, "block %p: tag id %u of %u", (void *)b->ptr,
                                     b->tag_id, a->tags.n);
                nlive++;
                allocated += b->size;
                requested += b->requested;
                if (b->requested > b->size)
                    return qc_errorf(QC_ERR_INVALID, "block %p: requested %zu > size %zu",
                                     (void *)b->ptr, b->requested, b->size);
            } else if (b->state == ALLOC_BLOCK_PENDING) {
                npend++;
                pending_bytes += b->size;
            } else if (b->mapped) {
                nfree_mapped++;
            }
            total += b->size;
        }
        if (!seg->expandable)
            mapped = seg->size;
        if (total != seg->size)
            return qc_errorf(QC_ERR_INVALID, "segment %p: blocks cover %zu of %zu bytes",
                             (void *)seg->base, total, seg->size);
        if (mapped != seg->mapped)
            return qc_errorf(QC_ERR_INVALID, "segment %p: mapped %zu, blocks say %zu",
                             (void *)seg->base, seg->mapped, mapped);
        reserved += seg->mapped;
        if (seg->pool == ALLOC_POOL_SMALL)
            reserved_small += seg->mapped;
    }
    size_t ntreap = 0;
    for (int pool = 0; pool < ALLOC_POOL_COUNT; pool++)
        QC_TRY(check_treap(a->free_root[pool], pool, NULL, NULL, &ntreap));
    const struct qc_alloc_stats *st = &a->st;
    if (ntreap != nfree_mapped)
        return qc_errorf(QC_ERR_INVALID, "treaps hold %zu blocks, %zu free mapped blocks exist",
                         ntreap, nfree_mapped);
    if (a->nmapped_blocks != nlive + npend)
        return qc_errorf(QC_ERR_INVALID, "pointer map holds %zu, live+pending = %zu",
                         a->nmapped_blocks, nlive + npend);
    if (allocated != st->bytes_allocated || requested != st->bytes_requested ||
        allocated + pending_bytes != st->bytes_active || reserved != st->bytes_reserved ||
        reserved_small != st->bytes_reserved_small || nlive != st->n_live ||
        npend != st->n_pending || nseg != st->n_segments)
        return qc_errorf(QC_ERR_INVALID,
                         "stats disagree with the blocks: allocated %zu/%zu requested %zu/%zu "
                         "active %zu/%zu reserved %zu/%zu small %zu/%zu live %zu/%" PRIu64
                         " pending %zu/%" PRIu64 " segments %zu/%" PRIu64,
                         st->bytes_allocated, allocated, st->bytes_requested, requested,
                         st->bytes_active, allocated + pending_bytes, st->bytes_reserved, reserved,
                         st->bytes_reserved_small, reserved_small, nlive, st->n_live, npend,
                         st->n_pending, nseg, st->n_segments);
    if (st->bytes_allocated_peak < st->bytes_allocated ||
        st->bytes_requested_peak < st->bytes_requested ||
        st->bytes_active_peak < st->bytes_active || st->bytes_reserved_peak < st->bytes_reserved)
        return qc_errorf(QC_ERR_INVALID, "a peak is below its current value");
    QC_TRY(alloc_peak_check(a));
    if (a->params.budget && st->bytes_reserved > a->params.budget)
        return qc_errorf(QC_ERR_INVALID, "reserved %zu over budget %zu", st->bytes_reserved,
                         a->params.budget);
    if (a->npending > npend * 64 + 64) /* each pending block has at most its streams' events */
        return qc_errorf(QC_ERR_INVALID, "%zu pending events for %zu pending blocks", a->npending,
                         npend);
    return QC_OK;
}

enum qc_status alloc_check_invariants(struct qc_alloc *a)
{
    pthread_mutex_lock(&a->lock);
    enum qc_status st = check_locked(a);
    pthread_mutex_unlock(&a->lock);
    return st;
}

enum qc_status qc_alloc_check(struct qc_alloc *a)
{
    return alloc_check_invariants(a);
}
