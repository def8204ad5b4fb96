/*
 * stats.c — allocator statistics and the memory / OOM report.
 *
 * Identities (checked by alloc_check_invariants): allocated = Σ live block sizes,
 * active = allocated + Σ pending block sizes, reserved = Σ mapped bytes, every peak >= its
 * current value; fragmentation = peak reserved / peak allocated.
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

void qc_alloc_stats_get(struct qc_alloc *a, struct qc_alloc_stats *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->st;
    out->bytes_largest_free = alloc_largest_free(a);
    out->fragmentation = ratio(a->st.bytes_reserved_peak, a->st.bytes_allocated_peak);
    pthread_mutex_unlock(&a->lock);
}

void qc_alloc_reset_peak(struct qc_alloc *a)
{
    pthread_mutex_lock(&a->lock);
    a->st.bytes_allocated_peak = a->st.bytes_allocated;
    a->st.bytes_requested_peak = a->st.bytes_requested;
    a->st.bytes_active_peak = a->st.bytes_active;
    a->st.bytes_reserved_peak = a->st.bytes_reserved;
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
            qc_alloc_bytes_str(alloc_largest_free(a), b1, sizeof b1),
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
