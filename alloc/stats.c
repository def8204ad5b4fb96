/*
 * stats.c — allocator statistics and the memory / OOM report.
 *
 * Identities (checked by alloc_check_invariants): allocated = Σ live block sizes,
 * active = allocated + Σ pending block sizes, reserved = Σ mapped bytes, every peak >= its
 * current value; fragmentation = peak reserved / peak allocated.
 *
 * Live bytes by tag and by block (the tag's prefix before '/') are running totals: each
 * allocation hashes its tag once into an interning table (the block is resolved when a tag is
 * first seen) and adds its size there; a free subtracts through the block's tag id, O(1).
 * Peak snapshot: whenever bytes_allocated passes the last snapshot's bytes_allocated by more
 * than 1 %, the top QC_ALLOC_PEAK_TOP tags and blocks are selected from those totals
 * (O(distinct names), not O(live blocks)) and the rest summed into "other". Growth by 1 % steps
 * bounds the snapshots of a window to ~log(peak/first)/log(1.01) (about 1,400 from 1 MiB to
 * 1 TiB), while the snapshot stays within 1 % of the true peak: snap <= peak <= snap + snap/100.
 */
#include "alloc_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define REPORT_TOP_TAGS 10

const char *qc_alloc_bytes_str(size_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%zu B", bytes);
    else
        snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

static double ratio(size_t num, size_t den)
{
    return den ? (double)num / (double)den : 1.0;
}

/* The largest FREE mapped block (lock held). */
static size_t largest_free(const struct qc_alloc *a)
{
    size_t best = 0;
    for (const struct alloc_segment *seg = a->segments; seg; seg = seg->next)
        for (const struct alloc_block *b = seg->first; b; b = b->next)
            if (b->state == ALLOC_BLOCK_FREE && b->mapped && b->size > best)
                best = b->size;
    return best;
}

void qc_alloc_stats_get(struct qc_alloc *a, struct qc_alloc_stats *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->st;
    out->bytes_largest_free = largest_free(a);
    out->fragmentation = ratio(a->st.bytes_reserved_peak, a->st.bytes_allocated_peak);
    pthread_mutex_unlock(&a->lock);
}

void qc_alloc_reset_peak(struct qc_alloc *a)
{
    pthread_mutex_lock(&a->lock);
    struct alloc_run_peaks *r = &a->run_peaks;
    r->allocated =
        r->allocated > a->st.bytes_allocated_peak ? r->allocated : a->st.bytes_allocated_peak;
    r->requested =
        r->requested > a->st.bytes_requested_peak ? r->requested : a->st.bytes_requested_peak;
    r->active = r->active > a->st.bytes_active_peak ? r->active : a->st.bytes_active_peak;
    r->reserved = r->reserved > a->st.bytes_reserved_peak ? r->reserved : a->st.bytes_reserved_peak;
    a->st.bytes_allocated_peak = a->st.bytes_allocated;
    a->st.bytes_requested_peak = a->st.bytes_requested;
    a->st.bytes_active_peak = a->st.bytes_active;
    a->st.bytes_reserved_peak = a->st.bytes_reserved;
    /* the step window starts over from what is live now */
    memset(&a->snap_step, 0, sizeof a->snap_step);
    a->snap_step.step = -1;
    a->snap_trigger = 0; /* if the snapshot below fails, the next allocation retries */
    alloc_peak_take(a, true);
    pthread_mutex_unlock(&a->lock);
}

// ---- report ----------------------------------------------------------------------------------

struct tag_total {
    const char *tag;
    size_t bytes;
    size_t largest;
    uint64_t blocks;
};

/* Appends to buf at *len (bounded by cap), tracking the length it would need. */
static void __attribute__((format(printf, 4, 5)))
appendf(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = *len < cap ? cap - *len : 0;
    int n = vsnprintf(room ? buf + *len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len += (size_t)n;
}

static int tag_total_cmp(const void *x, const void *y)
{
    const struct tag_total *a = x, *b = y;
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes ? 1 : -1;
    return strcmp(a->tag, b->tag);
}

size_t alloc_report_format_locked(struct qc_alloc *a, size_t requested, char *buf, size_t cap)
{
    char b1[32], b2[32], b3[32], b4[32];
    size_t len = 0;
    if (cap)
        buf[0] = '\0';
    const struct qc_alloc_stats *st = &a->st;
    if (requested)
        appendf(buf, cap, &len, "qc_alloc: out of memory: requested %s (%zu bytes)\n",
                qc_alloc_bytes_str(requested, b1, sizeof b1), requested);
    else
        appendf(buf, cap, &len, "qc_alloc: memory report\n");
    appendf(buf, cap, &len, "  budget %s | reserved %s | allocated %s | active %s\n",
            st->bytes_budget ? qc_alloc_bytes_str(st->bytes_budget, b1, sizeof b1) : "unlimited",
            qc_alloc_bytes_str(st->bytes_reserved, b2, sizeof b2),
            qc_alloc_bytes_str(st->bytes_allocated, b3, sizeof b3),
            qc_alloc_bytes_str(st->bytes_active, b4, sizeof b4));
    appendf(buf, cap, &len,
            "  largest free block %s | fragmentation %.3f (peak reserved %s / peak allocated "
            "%s) | %" PRIu64 " segments, %" PRIu64 " live blocks\n",
            qc_alloc_bytes_str(largest_free(a), b1, sizeof b1),
            ratio(st->bytes_reserved_peak, st->bytes_allocated_peak),
            qc_alloc_bytes_str(st->bytes_reserved_peak, b2, sizeof b2),
            qc_alloc_bytes_str(st->bytes_allocated_peak, b3, sizeof b3), st->n_segments,
            st->n_live);

    /* Live bytes by tag: collect, sort, print the top ones. */
    size_t n = 0, cap_t = 64;
    struct tag_total *t = malloc(cap_t * sizeof *t);
    for (size_t i = 0; t && i < a->nbuckets; i++) {
        for (struct alloc_block *b = a->buckets[i]; b; b = b->hnext) {
            if (b->state != ALLOC_BLOCK_LIVE)
                continue;
            const char *tag = b->tag[0] ? b->tag : "(untagged)";
            size_t j = 0;
            while (j < n && strcmp(t[j].tag, tag) != 0)
                j++;
            if (j == n) {
                if (n == cap_t) {
                    struct tag_total *nt = realloc(t, 2 * cap_t * sizeof *t);
                    if (!nt)
                        continue;
                    t = nt;
                    cap_t *= 2;
                }
                t[n].tag = tag;
                t[n].bytes = t[n].largest = 0;
                t[n].blocks = 0;
                n++;
            }
            t[j].bytes += b->size;
            t[j].blocks++;
            if (b->size > t[j].largest)
                t[j].largest = b->size;
        }
    }
    if (t && n) {
        qsort(t, n, sizeof *t, tag_total_cmp);
        appendf(buf, cap, &len, "  live allocations by tag (%zu largest of %zu tags):\n",
                n < REPORT_TOP_TAGS ? n : (size_t)REPORT_TOP_TAGS, n);
        for (size_t j = 0; j < n && j < REPORT_TOP_TAGS; j++)
            appendf(buf, cap, &len, "    %2zu. %10s in %4" PRIu64 " blocks (largest %s)  %s\n",
                    j + 1, qc_alloc_bytes_str(t[j].bytes, b1, sizeof b1), t[j].blocks,
                    qc_alloc_bytes_str(t[j].largest, b2, sizeof b2), t[j].tag);
    } else {
        appendf(buf, cap, &len, "  no live allocations\n");
    }
    free(t);
    return len;
}

size_t qc_alloc_report_format(struct qc_alloc *a, size_t requested, char *buf, size_t cap)
{
    pthread_mutex_lock(&a->lock);
    size_t n = alloc_report_format_locked(a, requested, buf, cap);
    pthread_mutex_unlock(&a->lock);
    return n;
}

// ---- run-wide peaks and the peak snapshot -----------------------------------------------------

static size_t max_size(size_t x, size_t y)
{
    return x > y ? x : y;
}

void qc_alloc_stats_get_run(struct qc_alloc *a, struct qc_alloc_stats *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->st;
    const struct alloc_run_peaks *r = &a->run_peaks;
    out->bytes_allocated_peak = max_size(r->allocated, a->st.bytes_allocated_peak);
    out->bytes_requested_peak = max_size(r->requested, a->st.bytes_requested_peak);
    out->bytes_active_peak = max_size(r->active, a->st.bytes_active_peak);
    out->bytes_reserved_peak = max_size(r->reserved, a->st.bytes_reserved_peak);
    out->bytes_largest_free = largest_free(a);
    out->fragmentation = ratio(out->bytes_reserved_peak, out->bytes_allocated_peak);
    pthread_mutex_unlock(&a->lock);
}

char *qc_alloc_tag_block(const char *tag, char *out)
{
    size_t n = strnlen(tag, QC_ALLOC_TAG_MAX - 1);
    const char *slash = memchr(tag, '/', n);
    if (slash) {
        n = (size_t)(slash - tag);
    } else {
        static const char *const suffixes[] = {".stash", ".out"};
        for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
            size_t k = strlen(suffixes[i]);
            if (n > k && memcmp(tag + n - k, suffixes[i], k) == 0) {
                n -= k;
                break;
            }
        }
    }
    memcpy(out, tag, n);
    out[n] = '\0';
    return out;
}

static void snapshot_clear(struct qc_alloc_peak_snapshot *s)
{
    memset(s, 0, sizeof *s);
    s->step = -1;
}

static size_t snap_trigger_of(const struct qc_alloc_peak_snapshot *s)
{
    return s->bytes_allocated + s->bytes_allocated / 100;
}

/* FNV-1a over a NUL-terminated string. */
static uint32_t str_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

static void name_copy(char *dst, const char *src)
{
    size_t n = strnlen(src, QC_ALLOC_TAG_MAX - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

// ---- interning tables ------------------------------------------------------------------------

/* The id of name, or UINT32_MAX. */
static uint32_t names_find(const struct alloc_names *t, const char *name, uint32_t h)
{
    const uint32_t mask = t->nslots - 1;
    for (uint32_t j = h & mask; t->slots[j]; j = (j + 1) & mask)
        if (strcmp(t->v[t->slots[j] - 1].name, name) == 0)
            return t->slots[j] - 1;
    return UINT32_MAX;
}

static bool names_grow(struct alloc_names *t)
{
    const uint32_t cap = t->cap ? 2 * t->cap : 64;
    struct alloc_name_total *v = realloc(t->v, cap * sizeof *v);
    if (!v)
        return false;
    t->v = v;
    uint32_t *slots = calloc(2 * (size_t)cap, sizeof *slots);
    if (!slots)
        return false; /* v grew; cap did not: retried next time */
    const uint32_t mask = 2 * cap - 1;
    for (uint32_t id = 0; id < t->n; id++) {
        uint32_t j = str_hash(t->v[id].name) & mask;
        while (slots[j])
            j = (j + 1) & mask;
        slots[j] = id + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->nslots = 2 * cap;
    t->cap = cap;
    return true;
}

/* Adds name (not present; hash h) with zero totals; its id, or UINT32_MAX out of memory. */
static uint32_t names_add(struct alloc_names *t, const char *name, uint32_t h)
{
    if (t->n == t->cap && !names_grow(t))
        return UINT32_MAX;
    const uint32_t mask = t->nslots - 1, id = t->n++;
    uint32_t j = h & mask;
    while (t->slots[j])
        j = (j + 1) & mask;
    t->slots[j] = id + 1;
    struct alloc_name_total *e = &t->v[id];
    name_copy(e->name, name);
    e->bytes = 0;
    e->blocks = 0;
    e->parent = 0;
    return id;
}

static void names_free(struct alloc_names *t)
{
    free(t->v);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

enum qc_status alloc_peak_init(struct qc_alloc *a)
{
    snapshot_clear(&a->snap_run);
    snapshot_clear(&a->snap_step);
    a->snap_trigger = 0; /* the first allocation takes one */
    const char *u = "(untagged)";
    if (names_add(&a->tags, u, str_hash(u)) != 0 || names_add(&a->blocks, u, str_hash(u)) != 0) {
        alloc_peak_deinit(a);
        return qc_errorf(QC_ERR_NOMEM, "allocator: out of host memory");
    }
    return QC_OK;
}

void alloc_peak_deinit(struct qc_alloc *a)
{
    names_free(&a->tags);
    names_free(&a->blocks);
}

/* The tag id of a tag string, interning the tag and its block on first sight (0 when out of
 * host memory: counted as untagged). */
static uint32_t tag_intern(struct qc_alloc *a, const char *tag)
{
    if (!tag[0])
        return 0;
    const uint32_t h = str_hash(tag);
    uint32_t id = names_find(&a->tags, tag, h);
    if (id != UINT32_MAX)
        return id;
    char blk[QC_ALLOC_TAG_MAX];
    qc_alloc_tag_block(tag, blk);
    const uint32_t hb = str_hash(blk);
    uint32_t bid = names_find(&a->blocks, blk, hb);
    if (bid == UINT32_MAX)
        bid = names_add(&a->blocks, blk, hb);
    if (bid == UINT32_MAX)
        return 0;
    id = names_add(&a->tags, tag, h);
    if (id == UINT32_MAX)
        return 0;
    a->tags.v[id].parent = bid;
    return id;
}

void alloc_tag_add(struct qc_alloc *a, struct alloc_block *b)
{
    const uint32_t id = tag_intern(a, b->tag);
    b->tag_id = id;
    struct alloc_name_total *t = &a->tags.v[id], *k = &a->blocks.v[t->parent];
    t->bytes += b->size;
    t->blocks++;
    k->bytes += b->size;
    k->blocks++;
}

void alloc_tag_sub(struct qc_alloc *a, const struct alloc_block *b)
{
    struct alloc_name_total *t = &a->tags.v[b->tag_id], *k = &a->blocks.v[t->parent];
    t->bytes -= b->size;
    t->blocks--;
    k->bytes -= b->size;
    k->blocks--;
}

// ---- snapshots -------------------------------------------------------------------------------

/* x ranks before y: more bytes, then the smaller name. */
static bool ranks_before(const struct alloc_name_total *x, const struct qc_alloc_tag_bytes *y)
{
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes;
    return strcmp(x->name, y->name) < 0;
}

/* The top QC_ALLOC_PEAK_TOP names with live bytes into top[] (largest first), the rest summed
 * into *other (from the totals: allocated bytes and live blocks); returns the count kept and
 * the number of names holding bytes in *nlive. O(names x log-free insertion into 32). */
static uint32_t select_top(const struct alloc_names *t, struct qc_alloc_tag_bytes *top,
                           struct qc_alloc_tag_bytes *other, size_t allocated, uint64_t nblocks,
                           uint64_t *nlive)
{
    uint32_t k = 0;
    uint64_t live = 0;
    for (uint32_t id = 0; id < t->n; id++) {
        const struct alloc_name_total *e = &t->v[id];
        if (!e->blocks)
            continue;
        live++;
        if (k == QC_ALLOC_PEAK_TOP && !ranks_before(e, &top[k - 1]))
            continue;
        uint32_t j = k < QC_ALLOC_PEAK_TOP ? k++ : k - 1; /* the slot it may take */
        while (j > 0 && ranks_before(e, &top[j - 1])) {
            top[j] = top[j - 1];
            j--;
        }
        name_copy(top[j].name, e->name);
        top[j].bytes = e->bytes;
        top[j].blocks = e->blocks;
    }
    memset(other, 0, sizeof *other);
    name_copy(other->name, "other");
    other->bytes = allocated;
    other->blocks = nblocks;
    for (uint32_t i = 0; i < k; i++) {
        other->bytes -= top[i].bytes;
        other->blocks -= top[i].blocks;
    }
    *nlive = live;
    return k;
}

/* The reserved bytes that hold data: every fixed segment with a block not FREE, and every
 * granule of an expandable segment that a block not FREE touches (blocks are in address
 * order, so a granule shared by neighbours is counted once). O(blocks). */
static size_t reserved_live(const struct qc_alloc *a)
{
    const size_t g = a->raw.granularity;
    size_t n = 0;
    for (const struct alloc_segment *seg = a->segments; seg; seg = seg->next) {
        if (!seg->expandable) {
            for (const struct alloc_block *b = seg->first; b; b = b->next)
                if (b->state != ALLOC_BLOCK_FREE) {
                    n += seg->size;
                    break;
                }
            continue;
        }
        size_t next = 0; /* the first granule (offset) not yet counted */
        for (const struct alloc_block *b = seg->first; b; b = b->next) {
            if (b->state == ALLOC_BLOCK_FREE)
                continue;
            const size_t off = (size_t)(b->ptr - seg->base);
            size_t lo = off / g * g;
            const size_t hi = (off + b->size + g - 1) / g * g;
            lo = lo > next ? lo : next;
            if (hi > lo)
                n += hi - lo;
            next = hi > next ? hi : next;
        }
    }
    return n;
}

void alloc_peak_take(struct qc_alloc *a, bool force_step)
{
    const size_t allocated = a->st.bytes_allocated;
    const bool run = allocated > snap_trigger_of(&a->snap_run);
    const bool step = force_step || allocated > snap_trigger_of(&a->snap_step);
    if (!run && !step)
        return;
    struct qc_alloc_peak_snapshot *s = run ? &a->snap_run : &a->snap_step;
    const uint64_t k = s->n_snapshots + 1;
    s->step = a->st.step;
    s->bytes_allocated = allocated;
    s->bytes_reserved = a->st.bytes_reserved;
    s->bytes_reserved_live = reserved_live(a);
    s->bytes_allocated_peak = 0;
    s->n_snapshots = k;
    s->ntop_tags =
        select_top(&a->tags, s->tags, &s->tag_other, allocated, a->st.n_live, &s->n_tags);
    s->ntop_blocks =
        select_top(&a->blocks, s->blocks, &s->block_other, allocated, a->st.n_live, &s->n_blocks);
    if (run && step) {
        const uint64_t ks = a->snap_step.n_snapshots + 1;
        a->snap_step = a->snap_run;
        a->snap_step.n_snapshots = ks;
    }
    size_t tr = snap_trigger_of(&a->snap_run), ts = snap_trigger_of(&a->snap_step);
    a->snap_trigger = tr < ts ? tr : ts;
}

void qc_alloc_peak_snapshot(struct qc_alloc *a, struct qc_alloc_peak_snapshot *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->snap_run;
    out->bytes_allocated_peak = max_size(a->run_peaks.allocated, a->st.bytes_allocated_peak);
    pthread_mutex_unlock(&a->lock);
}

void qc_alloc_peak_snapshot_step(struct qc_alloc *a, struct qc_alloc_peak_snapshot *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->snap_step;
    out->bytes_allocated_peak = a->st.bytes_allocated_peak;
    pthread_mutex_unlock(&a->lock);
}

static enum qc_status snapshot_check(const struct qc_alloc_peak_snapshot *s, size_t peak,
                                     const char *window)
{
    if (s->bytes_allocated > peak || peak > snap_trigger_of(s))
        return qc_errorf(QC_ERR_INVALID,
                         "%s peak snapshot: %zu bytes, peak %zu: not within 1 %% below it", window,
                         s->bytes_allocated, peak);
    if (s->n_snapshots &&
        (s->bytes_reserved_live < s->bytes_allocated || s->bytes_reserved_live > s->bytes_reserved))
        return qc_errorf(QC_ERR_INVALID,
                         "%s peak snapshot: %zu reserved bytes hold data, not within allocated %zu "
                         "and reserved %zu",
                         window, s->bytes_reserved_live, s->bytes_allocated, s->bytes_reserved);
    size_t tags = s->tag_other.bytes, blocks = s->block_other.bytes;
    for (uint32_t i = 0; i < s->ntop_tags; i++)
        tags += s->tags[i].bytes;
    for (uint32_t i = 0; i < s->ntop_blocks; i++)
        blocks += s->blocks[i].bytes;
    if (tags != s->bytes_allocated || blocks != s->bytes_allocated)
        return qc_errorf(QC_ERR_INVALID,
                         "%s peak snapshot: tags sum to %zu, blocks to %zu, allocated %zu", window,
                         tags, blocks, s->bytes_allocated);
    return QC_OK;
}

enum qc_status alloc_peak_check(const struct qc_alloc *a)
{
    size_t tag_bytes = 0, block_bytes = 0;
    uint64_t tag_blocks = 0;
    for (uint32_t id = 0; id < a->tags.n; id++) {
        const struct alloc_name_total *t = &a->tags.v[id];
        if (t->parent >= a->blocks.n)
            return qc_errorf(QC_ERR_INVALID, "tag %s: block id %u of %u", t->name, t->parent,
                             a->blocks.n);
        tag_bytes += t->bytes;
        tag_blocks += t->blocks;
    }
    size_t *sum = calloc(a->blocks.n, sizeof *sum); /* each block = Σ of its tags */
    if (!sum)
        return qc_errorf(QC_ERR_NOMEM, "allocator check: out of host memory");
    for (uint32_t id = 0; id < a->tags.n; id++)
        sum[a->tags.v[id].parent] += a->tags.v[id].bytes;
    for (uint32_t id = 0; id < a->blocks.n; id++) {
        if (sum[id] != a->blocks.v[id].bytes) {
            enum qc_status st = qc_errorf(QC_ERR_INVALID, "block %s: %zu bytes, its tags hold %zu",
                                          a->blocks.v[id].name, a->blocks.v[id].bytes, sum[id]);
            free(sum);
            return st;
        }
        block_bytes += a->blocks.v[id].bytes;
    }
    free(sum);
    if (tag_bytes != a->st.bytes_allocated || block_bytes != a->st.bytes_allocated ||
        tag_blocks != a->st.n_live)
        return qc_errorf(
            QC_ERR_INVALID,
            "live bytes by tag %zu, by block %zu, allocated %zu; blocks by tag %" PRIu64
            ", live %" PRIu64,
            tag_bytes, block_bytes, a->st.bytes_allocated, tag_blocks, a->st.n_live);
    size_t run_peak = max_size(a->run_peaks.allocated, a->st.bytes_allocated_peak);
    QC_TRY(snapshot_check(&a->snap_run, run_peak, "run"));
    return snapshot_check(&a->snap_step, a->st.bytes_allocated_peak, "step");
}
