/*
 * test_alloc.c — the caching device allocator on the host backend (no streams involved):
 * rounding and reuse, splitting and coalescing, seeded property tests against a reference
 * model with the invariant checker after every operation, adversarial fragmentation sequences,
 * budget + release-and-retry + OOM report, statistics identities, the trace, and the
 * allocator over an emulated-device arena (params.emu). Stream-ordered reuse is in
 * test_alloc_streams.c, the pinned arena in test_alloc_pinned.c.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc_internal.h" /* alloc_check_invariants */
#include "qc_alloc.h"
#include "qc_emu.h"
#include "testutil.h"

#define KiB     ((size_t)1 << 10)
#define MiB     ((size_t)1 << 20)
#define GRANULE (2 * MiB)

static struct qc_alloc *make(bool expandable, size_t budget, size_t split_limit)
{
    struct qc_alloc_params p;
    qc_alloc_params_default(&p);
    p.expandable = expandable;
    p.budget = budget;
    p.split_limit = split_limit;
    struct qc_alloc *a = NULL;
    enum qc_status st = qc_alloc_create(NULL, &p, &a);
    if (st != QC_OK)
        T_FATAL("qc_alloc_create: %s", qc_error_last());
    return a;
}

static void *must_alloc(struct qc_alloc *a, size_t size, const char *tag)
{
    void *p = NULL;
    enum qc_status st = qc_alloc_malloc(a, size, NULL, tag, &p);
    if (st != QC_OK)
        T_FATAL("qc_alloc_malloc(%zu, %s): %s", size, tag, qc_error_last());
    return p;
}

static struct qc_alloc_stats stats(struct qc_alloc *a)
{
    struct qc_alloc_stats s;
    qc_alloc_stats_get(a, &s);
    return s;
}

static void check_inv(struct qc_alloc *a, const char *where)
{
    if (alloc_check_invariants(a) != QC_OK)
        T_FATAL("invariants broken after %s: %s", where, qc_error_last());
}

// ---- address pattern -------------------------------------------------------------------------

/* Word at address x of an allocation with id: x * golden ^ id. Large blocks get the pattern in
 * 4 KiB windows (head, tail, one per MiB), small ones everywhere. */
static uint64_t pat(const void *x, uint64_t id)
{
    return (uint64_t)(uintptr_t)x * 0x9e3779b97f4a7c15ull ^ id;
}

static void window_fill(char *p, size_t n, uint64_t id)
{
    for (size_t i = 0; i + 8 <= n; i += 8)
        *(uint64_t *)(void *)(p + i) = pat(p + i, id);
}

static size_t window_check(const char *p, size_t n, uint64_t id)
{
    size_t bad = 0;
    for (size_t i = 0; i + 8 <= n; i += 8)
        bad += *(const uint64_t *)(const void *)(p + i) != pat(p + i, id);
    return bad;
}

#define WIN (4 * KiB)

static void fill(void *p, size_t size, uint64_t id)
{
    char *c = p;
    if (size <= 256 * KiB) {
        window_fill(c, size, id);
        return;
    }
    for (size_t off = 0; off + WIN <= size; off += MiB)
        window_fill(c + off, WIN, id);
    window_fill(c + ((size - WIN) & ~(size_t)7), WIN, id); /* same word phase as the rest */
}

static size_t check_fill(const void *p, size_t size, uint64_t id)
{
    const char *c = p;
    if (size <= 256 * KiB)
        return window_check(c, size, id);
    size_t bad = 0;
    for (size_t off = 0; off + WIN <= size; off += MiB)
        bad += window_check(c + off, WIN, id);
    return bad + window_check(c + ((size - WIN) & ~(size_t)7), WIN, id);
}

// ---- reference model -------------------------------------------------------------------------

struct live {
    char *p;
    size_t size;   /* requested */
    size_t usable; /* qc_alloc_usable_size */
    uint64_t id;
};

static int live_cmp(const void *x, const void *y)
{
    const struct live *a = x, *b = y;
    return a->p < b->p ? -1 : a->p > b->p;
}

static size_t round512(size_t n)
{
    return n < 512 ? 512 : (n + 511) / 512 * 512;
}

static size_t random_size(uint64_t *rng)
{
    uint64_t r = qc_test_rand(rng);
    uint64_t k = r % 100;
    uint64_t v = qc_test_rand(rng);
    if (k < 45)
        return (size_t)(v % (64 * KiB)); /* small, 0 included */
    if (k < 70)
        return (size_t)(768 * KiB + v % (512 * KiB)); /* straddles the 1 MiB boundary */
    if (k < 95)
        return (size_t)(MiB + v % (23 * MiB));  /* large */
    return (size_t)(24 * MiB + v % (40 * MiB)); /* huge */
}

struct model_cfg {
    const char *name;
    bool expandable;
    size_t budget;
    size_t split_limit;
    int ops;
    bool lives; /* requests of random lifetime classes (else all QC_ALLOC_LIFE_LONG) */
};

static void model_compare(struct qc_alloc *a, struct live *lv, size_t n, const struct model_cfg *c,
                          int op)
{
    struct qc_alloc_stats s = stats(a);
    size_t usable = 0, requested = 0;
    for (size_t i = 0; i < n; i++) {
        usable += lv[i].usable;
        requested += lv[i].size;
    }
    T_EXPECT_EQ_U64(s.bytes_allocated, usable, "%s op %d: allocated == Σ live", c->name, op);
    T_EXPECT_EQ_U64(s.bytes_requested, requested, "%s op %d: requested == Σ live", c->name, op);
    T_EXPECT_EQ_U64(s.n_live, n, "%s op %d: live count", c->name, op);
    T_EXPECT(s.bytes_allocated_peak >= s.bytes_allocated &&
                 s.bytes_reserved_peak >= s.bytes_reserved,
             "%s op %d: peaks below current", c->name, op);
    T_EXPECT(!c->budget || s.bytes_reserved <= c->budget, "%s op %d: reserved %zu > budget",
             c->name, op, s.bytes_reserved);
    T_EXPECT(s.bytes_reserved >= s.bytes_allocated, "%s op %d: reserved < allocated", c->name, op);
    /* No two live blocks overlap. */
    qsort(lv, n, sizeof *lv, live_cmp);
    for (size_t i = 1; i < n; i++)
        if (lv[i - 1].p + lv[i - 1].usable > lv[i].p)
            T_FATAL("%s op %d: blocks %p+%zu and %p overlap", c->name, op, (void *)lv[i - 1].p,
                    lv[i - 1].usable, (void *)lv[i].p);
}

static void run_model(const struct model_cfg *c, uint64_t seed)
{
    struct qc_alloc *a = make(c->expandable, c->budget, c->split_limit);
    uint64_t rng = seed;
    size_t cap = 4096, n = 0;
    struct live *lv = calloc(cap, sizeof *lv);
    uint64_t next_id = 1, ooms = 0, retries_before;
    for (int op = 0; op < c->ops; op++) {
        uint64_t r = qc_test_rand(&rng) % 100;
        if (r < 2) {
            T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "empty_cache");
            struct qc_alloc_stats s = stats(a);
            if (!c->expandable || n == 0) {
                /* Nothing but live blocks' segments/granules may stay reserved. */
                T_EXPECT(n > 0 || s.bytes_reserved == 0, "%s: reserved %zu after emptying", c->name,
                         s.bytes_reserved);
            } else {
                size_t allocated = s.bytes_allocated;
                T_EXPECT(s.bytes_reserved <= allocated + 2 * GRANULE * n,
                         "%s: expandable keeps %zu reserved for %zu allocated in %zu blocks",
                         c->name, s.bytes_reserved, allocated, n);
            }
        } else if (r < 3) {
            qc_alloc_reset_peak(a);
            struct qc_alloc_stats s = stats(a);
            T_EXPECT_EQ_U64(s.bytes_reserved_peak, s.bytes_reserved, "peak reset");
        } else if (n > 0 && (r < 45 || n == cap)) {
            size_t i = (size_t)(qc_test_rand(&rng) % n);
            size_t bad = check_fill(lv[i].p, lv[i].size, lv[i].id);
            if (bad)
                T_FATAL("%s op %d: block %p (%zu bytes) lost its pattern in %zu words", c->name, op,
                        (void *)lv[i].p, lv[i].size, bad);
            qc_alloc_free(a, lv[i].p, NULL);
            lv[i] = lv[--n];
        } else {
            size_t size = random_size(&rng);
            char tag[32];
            snprintf(tag, sizeof tag, "model.%d/t%" PRIu64, op % 7, next_id % 13);
            struct qc_alloc_stats before = stats(a);
            retries_before = before.n_retries;
            void *p = NULL;
            const enum qc_alloc_life life =
                c->lives ? (enum qc_alloc_life)(qc_test_rand(&rng) % QC_ALLOC_LIFE_COUNT)
                         : QC_ALLOC_LIFE_LONG;
            enum qc_status st = qc_alloc_malloc_life(a, size, NULL, life, tag, &p);
            if (st == QC_ERR_NOMEM) {
                ooms++;
                T_EXPECT(c->budget > 0, "%s: OOM without a budget", c->name);
                struct qc_alloc_stats s = stats(a);
                T_EXPECT(s.n_retries == retries_before + 1, "%s: OOM without a retry", c->name);
                T_EXPECT_STR_CONTAINS(qc_error_last(), "requested");
                /* Expandable segments, one stream: after the release, only partial granules
                 * next to live blocks stay reserved, so anything that fits by that bound
                 * must have succeeded. */
                size_t bound = s.bytes_allocated + round512(size) + 2 * GRANULE * (n + 1);
                T_EXPECT(!c->expandable || bound > c->budget,
                         "%s op %d: OOM for %zu bytes with %zu allocated in %zu blocks, budget %zu",
                         c->name, op, size, s.bytes_allocated, n, c->budget);
            } else if (st != QC_OK) {
                T_FATAL("%s op %d: malloc(%zu): %s", c->name, op, size, qc_error_last());
            } else {
                size_t usable = qc_alloc_usable_size(a, p);
                size_t rs = round512(size);
                T_EXPECT((uintptr_t)p % 512 == 0, "alignment of %p", p);
                T_EXPECT(usable >= rs, "usable %zu < rounded %zu", usable, rs);
                if (c->expandable || rs <= MiB)
                    T_EXPECT_EQ_U64(usable, rs, "%s: exact block for %zu", c->name, size);
                else
                    T_EXPECT(usable - rs <= 20 * MiB, "%s: block %zu for %zu", c->name, usable, rs);
                lv[n].p = p;
                lv[n].size = size;
                lv[n].usable = usable;
                lv[n].id = next_id++;
                fill(p, size, lv[n].id);
                n++;
            }
        }
        check_inv(a, c->name);
        model_compare(a, lv, n, c, op);
        if (qc_test_st.failed_in_test)
            break;
    }
    while (n > 0) {
        n--;
        T_EXPECT(check_fill(lv[n].p, lv[n].size, lv[n].id) == 0, "pattern at final free");
        qc_alloc_free(a, lv[n].p, NULL);
    }
    check_inv(a, "final frees");
    T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "final empty_cache");
    struct qc_alloc_stats s = stats(a);
    T_EXPECT_EQ_U64(s.bytes_reserved, 0, "%s: reserved after freeing everything", c->name);
    T_EXPECT_EQ_U64(s.bytes_allocated, 0, "%s: allocated after freeing everything", c->name);
    T_EXPECT_EQ_U64(s.n_segments, 0, "%s: segments after emptying", c->name);
    T_EXPECT(!c->budget || ooms > 0 || c->budget > 1024 * MiB, "%s: the budget never bit", c->name);
    printf("  %s: %d ops, %" PRIu64 " OOMs, %" PRIu64 " retries, fragmentation %.3f\n", c->name,
           c->ops, ooms, s.n_retries, s.fragmentation);
    free(lv);
    qc_alloc_destroy(a);
}

// ---- tests -----------------------------------------------------------------------------------

// ---- emulated device memory --------------------------------------------------------------

/* True when reading the byte at p kills a child process with SIGSEGV (p is PROT_NONE). The
 * child restores the default action first, so a sanitizer's handler does not turn the fault
 * into an exit code. */
static bool touch_faults(const void *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        T_FATAL("fork failed");
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        volatile const unsigned char *q = p;
        unsigned char c = *q;
        _exit(c == 0x5A ? 3 : 2); /* reached only when the read did not fault */
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        T_FATAL("waitpid failed");
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

int main(void)
{
    uint64_t seed = qc_test_seed();

    QC_TEST ("alloc: params are validated") {
        struct qc_alloc_params p;
        qc_alloc_params_default(&p);
        p.round = 500;
        struct qc_alloc *a = NULL;
        T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_ERR_INVALID, "round 500 accepted");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "round 500");
        qc_alloc_params_default(&p);
        p.small_segment = p.small_max / 2;
        T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_ERR_INVALID, "small_segment < small_max");
        T_EXPECT(qc_alloc_create(NULL, NULL, &a) == QC_OK, "defaults: %s", qc_error_last());
        qc_alloc_destroy(a);
        qc_alloc_destroy(NULL);
    }

    QC_TEST ("alloc: rounding, alignment and cached reuse") {
        for (int e = 0; e < 2; e++) {
            struct qc_alloc *a = make(e, 0, 0);
            void *p0 = must_alloc(a, 0, "zero");
            void *p1 = must_alloc(a, 1, "one");
            T_EXPECT(p0 != p1, "size 0 and 1 share %p", p0);
            T_EXPECT_EQ_U64(qc_alloc_usable_size(a, p1), 512, "1 byte rounds to 512");
            T_EXPECT_EQ_U64(qc_alloc_usable_size(a, p0), 512, "0 bytes round to 512");
            void *big = must_alloc(a, 5 * MiB + 3, "big");
            T_EXPECT_EQ_U64(qc_alloc_usable_size(a, big), 5 * MiB + 512, "5 MiB + 3 rounding");
            T_EXPECT((uintptr_t)big % 512 == 0, "alignment");
            struct qc_alloc_stats s1 = stats(a);
            qc_alloc_free(a, big, NULL);
            void *again = must_alloc(a, 5 * MiB + 3, "big");
            struct qc_alloc_stats s2 = stats(a);
            T_EXPECT(again == big, "cached block not reused: %p vs %p", again, big);
            T_EXPECT_EQ_U64(s2.n_maps, s1.n_maps, "a cached request mapped memory");
            T_EXPECT_EQ_U64(qc_alloc_usable_size(a, (char *)again + 512), 0, "interior pointer");
            qc_alloc_free(a, again, NULL);
            qc_alloc_free(a, p0, NULL);
            qc_alloc_free(a, p1, NULL);
            qc_alloc_free(a, NULL, NULL);
            check_inv(a, "reuse");
            qc_alloc_destroy(a);
        }
    }

    QC_TEST ("alloc: splitting and coalescing in a small segment") {
        struct qc_alloc *a = make(true, 0, 0);
        void *b[4];
        for (int i = 0; i < 4; i++)
            b[i] = must_alloc(a, 256 * KiB, "quarter");
        for (int i = 1; i < 4; i++)
            T_EXPECT((char *)b[i] == (char *)b[i - 1] + 256 * KiB, "block %d not adjacent", i);
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_reserved, 2 * MiB, "one small segment");
        T_EXPECT_EQ_U64(s.bytes_largest_free, MiB, "rest of the segment");
        qc_alloc_free(a, b[1], NULL);
        qc_alloc_free(a, b[2], NULL);
        check_inv(a, "free middle");
        T_EXPECT_EQ_U64(stats(a).bytes_largest_free, MiB, "B+C (512 KiB) < rest");
        void *mid = must_alloc(a, 512 * KiB, "mid");
        T_EXPECT(mid == b[1], "best fit should take the coalesced B+C hole");
        qc_alloc_free(a, mid, NULL);
        qc_alloc_free(a, b[3], NULL);
        T_EXPECT_EQ_U64(stats(a).bytes_largest_free, 2 * MiB - 256 * KiB, "B+C+D+rest merged");
        qc_alloc_free(a, b[0], NULL);
        T_EXPECT_EQ_U64(stats(a).bytes_largest_free, 2 * MiB, "whole segment free");
        check_inv(a, "all free");
        T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "empty");
        s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_reserved, 0, "released");
        T_EXPECT_EQ_U64(s.n_segments, 0, "segments");
        T_EXPECT_EQ_U64(s.n_maps, 1, "maps");
        T_EXPECT_EQ_U64(s.n_unmaps, 1, "unmaps");
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: over an emulated-device arena: serves, splits, frees, coalesces") {
        struct qc_emu *emu = NULL;
        if (qc_emu_create(64 * MiB, &emu) != QC_OK)
            T_FATAL("qc_emu_create: %s", qc_error_last());
        struct qc_alloc_params p;
        qc_alloc_params_default(&p); /* expandable on: served as plain segments */
        p.emu = emu;
        struct qc_alloc *a = NULL;
        if (qc_alloc_create(NULL, &p, &a) != QC_OK)
            T_FATAL("qc_alloc_create(emu): %s", qc_error_last());
        /* Four quarters of one small segment, adjacent: the segment is one arena block. */
        void *b[4];
        for (int i = 0; i < 4; i++)
            b[i] = must_alloc(a, 256 * KiB, "emu/quarter");
        for (int i = 1; i < 4; i++)
            T_EXPECT((char *)b[i] == (char *)b[i - 1] + 256 * KiB, "block %d not adjacent", i);
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_reserved, 2 * MiB, "one small segment");
        T_EXPECT_EQ_U64(qc_emu_bytes_live(emu), 2 * MiB, "the segment came from the arena");
        /* A large request: a fixed 20 MiB segment (no expandable reservation on the arena). */
        void *big = must_alloc(a, 5 * MiB, "emu/big");
        s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_reserved - s.bytes_reserved_small, 20 * MiB,
                        "large pool: a plain 20 MiB segment");
        T_EXPECT_EQ_U64(qc_emu_bytes_live(emu), 22 * MiB, "arena bytes = reserved bytes");
        check_inv(a, "emu serve");
        /* Memory is closed outside enter/leave, open inside. */
        T_EXPECT(touch_faults(b[0]), "a read of arena memory outside enter did not fault");
        T_EXPECT(touch_faults((char *)big + 5 * MiB - 1), "large block readable outside enter");
        qc_emu_enter(emu);
        memset(b[0], 0x5A, 256 * KiB);
        T_EXPECT(((unsigned char *)b[1])[0] == 0xFF, "fresh arena memory holds 0xFF");
        qc_emu_leave(emu);
        T_EXPECT(touch_faults(b[0]), "closed again after leave");
        /* Free the middle two: they coalesce and best fit takes the hole. */
        qc_alloc_free(a, b[1], NULL);
        qc_alloc_free(a, b[2], NULL);
        check_inv(a, "emu free middle");
        T_EXPECT_EQ_U64(stats(a).bytes_largest_free, 15 * MiB, "rest of the large segment");
        void *mid = must_alloc(a, 512 * KiB, "emu/mid");
        T_EXPECT(mid == b[1], "best fit should take the coalesced B+C hole");
        qc_alloc_free(a, mid, NULL);
        qc_alloc_free(a, b[3], NULL);
        qc_alloc_free(a, b[0], NULL);
        qc_alloc_free(a, big, NULL);
        check_inv(a, "emu all free");
        T_EXPECT_EQ_U64(qc_emu_bytes_live(emu), 22 * MiB, "freed blocks stay cached");
        T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "empty");
        s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_reserved, 0, "released");
        T_EXPECT_EQ_U64(s.n_segments, 0, "segments");
        T_EXPECT_EQ_U64(qc_emu_bytes_live(emu), 0, "the arena got everything back");
        /* An exhausted arena is a clean QC_ERR_NOMEM with the report, like a full device. */
        void *fill_up[80];
        int n = 0;
        while (n < 80 && qc_alloc_malloc(a, MiB, NULL, "emu/fill", &fill_up[n]) == QC_OK)
            n++;
        T_EXPECT_EQ_U64(n, 64, "the 64 MiB arena holds 32 small segments of two 1 MiB blocks");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "emulated device arena exhausted");
        check_inv(a, "emu exhausted");
        for (int i = 0; i < n; i++)
            qc_alloc_free(a, fill_up[i], NULL);
        qc_alloc_destroy(a);
        T_EXPECT_EQ_U64(qc_emu_bytes_live(emu), 0, "destroy gives the arena everything back");
        /* The arena is host memory: a CUDA device with an arena is refused. */
        struct qc_device *dev = NULL;
        if (qc_device_create(QC_DEVICE_CUDA, 0, &dev) == QC_OK) {
            T_EXPECT(qc_alloc_create(dev, &p, &a) == QC_ERR_INVALID, "CUDA device + arena");
            qc_device_destroy(dev);
        }
        qc_emu_destroy(emu);
    }

    QC_TEST ("alloc: seeded property test against a reference model") {
        const struct model_cfg cfgs[] = {
            {"expandable", true, 0, 0, 2500, false},
            {"expandable+budget", true, 160 * MiB, 0, 2500, false},
            {"pytorch-like", false, 0, 0, 2500, false},
            {"pytorch-like+budget", false, 160 * MiB, 0, 2500, false},
            {"pytorch-like+split-limit", false, 0, 8 * MiB, 2000, false},
            {"expandable+budget+lives", true, 160 * MiB, 0, 2500, true},
            {"pytorch-like+budget+lives", false, 160 * MiB, 0, 2500, true},
        };
        for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0] && !qc_test_st.failed_in_test; i++)
            run_model(&cfgs[i], seed ^ (0x1000 * (i + 1)));
    }

    QC_TEST ("alloc: adversarial: growing sizes (small-then-large)") {
        /* Each step frees a tensor and asks for a slightly bigger one, after a burst of small
         * ones: PyTorch-like segments cannot be reused and pile up; an expandable segment
         * grows in place. */
        size_t peak_reserved[2], retries[2];
        for (int e = 0; e < 2; e++) {
            struct qc_alloc *a = make(e, 96 * MiB, 0);
            for (int i = 0; i < 64; i++) {
                void *s = must_alloc(a, 48 * KiB, "small");
                qc_alloc_free(a, s, NULL);
            }
            for (size_t mb = 21; mb <= 60; mb++) {
                void *p = must_alloc(a, mb * MiB, "growing");
                fill(p, mb * MiB, mb);
                T_EXPECT(check_fill(p, mb * MiB, mb) == 0, "pattern");
                qc_alloc_free(a, p, NULL);
                check_inv(a, "growing");
            }
            struct qc_alloc_stats s = stats(a);
            peak_reserved[e] = s.bytes_reserved_peak;
            retries[e] = s.n_retries;
            qc_alloc_destroy(a);
        }
        T_EXPECT(peak_reserved[1] <= 60 * MiB + 2 * MiB + 2 * MiB,
                 "expandable peak reserved %zu for a 60 MiB max", peak_reserved[1]);
        T_EXPECT_EQ_U64(retries[1], 0, "expandable needed cache releases");
        T_EXPECT(retries[0] > 0, "pytorch-like never had to release (%zu)", retries[0]);
    }

    QC_TEST ("alloc: adversarial: long-lived blocks leave holes") {
        /* One 20 MiB PyTorch-like segment holds A B C D (6, 1.5, 6, 6 MiB); B and D stay live,
         * A and C are freed: two 6 MiB holes. A 12 MiB request cannot use them and the budget
         * (24 MiB) has no room for a new segment: OOM. With an expandable segment the holes'
         * granules are unmapped and the request is mapped elsewhere: success. */
        for (int e = 0; e < 2; e++) {
            struct qc_alloc *a = make(e, 24 * MiB, 0);
            void *A = must_alloc(a, 6 * MiB, "A");
            void *B = must_alloc(a, 3 * MiB / 2, "B.long-lived");
            void *C = must_alloc(a, 6 * MiB, "C");
            void *D = must_alloc(a, 6 * MiB, "D.long-lived");
            qc_alloc_free(a, A, NULL);
            qc_alloc_free(a, C, NULL);
            void *big = NULL;
            enum qc_status st = qc_alloc_malloc(a, 12 * MiB, NULL, "big", &big);
            check_inv(a, "holes");
            if (e) {
                T_EXPECT(st == QC_OK, "expandable: %s", qc_error_last());
                if (st == QC_OK) {
                    fill(big, 12 * MiB, 7);
                    T_EXPECT(check_fill(big, 12 * MiB, 7) == 0, "pattern");
                }
                T_EXPECT(stats(a).bytes_reserved <= 24 * MiB, "budget");
            } else {
                T_EXPECT(st == QC_ERR_NOMEM, "pytorch-like fit 12 MiB in the holes?");
                T_EXPECT_STR_CONTAINS(qc_error_last(), "D.long-lived");
            }
            qc_alloc_free(a, big, NULL);
            qc_alloc_free(a, B, NULL);
            qc_alloc_free(a, D, NULL);
            check_inv(a, "holes freed");
            qc_alloc_destroy(a);
        }
    }

    QC_TEST ("alloc: adversarial: requests straddling the 1 MiB small/large boundary") {
        for (int e = 0; e < 2; e++) {
            struct qc_alloc *a = make(e, 0, 0);
            void *s = must_alloc(a, MiB, "exactly 1 MiB");
            struct qc_alloc_stats st = stats(a);
            T_EXPECT_EQ_U64(st.bytes_reserved_small, 2 * MiB, "1 MiB goes to the small pool");
            void *l = must_alloc(a, MiB + 1, "1 MiB + 1");
            st = stats(a);
            T_EXPECT_EQ_U64(st.bytes_reserved_small, 2 * MiB, "1 MiB + 1 is large");
            T_EXPECT_EQ_U64(st.bytes_reserved - st.bytes_reserved_small, e ? 2 * MiB : 20 * MiB,
                            "large pool reservation (expandable %d)", e);
            void *s2 = must_alloc(a, MiB - 1, "1 MiB - 1");
            st = stats(a);
            T_EXPECT_EQ_U64(st.bytes_reserved_small, 2 * MiB, "the second half of the segment");
            T_EXPECT((char *)s2 == (char *)s + MiB, "small segment split");
            /* Alternating around the boundary never mixes the pools. */
            uint64_t rng = seed;
            void *keep[64];
            for (int i = 0; i < 64; i++) {
                size_t sz = MiB - 4 * KiB + (size_t)(qc_test_rand(&rng) % (8 * KiB));
                keep[i] = must_alloc(a, sz, "straddle");
                check_inv(a, "straddle");
            }
            for (int i = 0; i < 64; i += 2)
                qc_alloc_free(a, keep[i], NULL);
            for (int i = 0; i < 32; i++) {
                void *p = must_alloc(a, MiB + 512, "just large");
                qc_alloc_free(a, p, NULL);
            }
            for (int i = 1; i < 64; i += 2)
                qc_alloc_free(a, keep[i], NULL);
            qc_alloc_free(a, s, NULL);
            qc_alloc_free(a, s2, NULL);
            qc_alloc_free(a, l, NULL);
            check_inv(a, "straddle end");
            T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "empty");
            T_EXPECT_EQ_U64(stats(a).bytes_reserved, 0, "all released");
            qc_alloc_destroy(a);
        }
    }

    QC_TEST ("alloc: split limit keeps oversize blocks whole") {
        struct qc_alloc *a = make(false, 0, 8 * MiB);
        void *big = must_alloc(a, 40 * MiB, "oversize");
        qc_alloc_free(a, big, NULL);
        void *small = must_alloc(a, 2 * MiB, "small-under-limit");
        T_EXPECT(small != big, "a 40 MiB oversize block served a 2 MiB request");
        void *again = must_alloc(a, 36 * MiB, "big-enough");
        T_EXPECT(again == big, "36 MiB should reuse the 40 MiB block (waste < 20 MiB)");
        T_EXPECT_EQ_U64(qc_alloc_usable_size(a, again), 40 * MiB, "oversize blocks are not split");
        check_inv(a, "split limit");
        qc_alloc_free(a, small, NULL);
        qc_alloc_free(a, again, NULL);
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: budget, release-and-retry and the OOM report") {
        struct qc_alloc *a = make(false, 64 * MiB, 0);
        /* Fill the cache with a freed 40 MiB segment, then ask for 50 MiB: no fit, no room
         * (40 + 50 > 64): the cache is released and the retry succeeds. */
        void *p = must_alloc(a, 40 * MiB, "cached");
        qc_alloc_free(a, p, NULL);
        void *q = must_alloc(a, 50 * MiB, "agent_encoder.pl2a.0/k_edge");
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.n_retries, 1, "one release-and-retry");
        T_EXPECT_EQ_U64(s.n_ooms, 0, "no OOM");
        T_EXPECT_EQ_U64(s.bytes_reserved, 50 * MiB, "the 40 MiB segment was released");
        void *r = must_alloc(a, 12 * MiB, "decoder.m2m/v");
        void *t = must_alloc(a, 512 * KiB, "small/param");
        /* Now 50 + 12 + 2 reserved: nothing more fits in 64. */
        void *x = NULL;
        enum qc_status st = qc_alloc_malloc(a, 40 * MiB, NULL, "too/big", &x);
        T_EXPECT(st == QC_ERR_NOMEM, "expected QC_ERR_NOMEM, got %d", st);
        T_EXPECT(x == NULL, "out-param written on failure");
        const char *msg = qc_error_last();
        T_EXPECT_STR_CONTAINS(msg, "out of memory: requested 40.00 MiB (41943040 bytes)");
        T_EXPECT_STR_CONTAINS(msg, "budget 64.00 MiB");
        T_EXPECT_STR_CONTAINS(msg, "reserved 64.00 MiB");
        T_EXPECT_STR_CONTAINS(msg, "allocated 62.50 MiB");
        T_EXPECT_STR_CONTAINS(msg, "largest free block 1.50 MiB");
        T_EXPECT_STR_CONTAINS(msg, "fragmentation");
        T_EXPECT_STR_CONTAINS(msg, "hint:");
        const char *k = strstr(msg, "agent_encoder.pl2a.0/k_edge");
        const char *v = strstr(msg, "decoder.m2m/v");
        const char *w = strstr(msg, "small/param");
        T_EXPECT(k && v && w && k < v && v < w, "tags not listed largest first:\n%s", msg);
        s = stats(a);
        T_EXPECT_EQ_U64(s.n_ooms, 1, "OOM counted");
        T_EXPECT_EQ_U64(s.n_retries, 2, "the OOM retried first");
        /* More than 10 tags: only the 10 largest are listed. */
        void *many[12];
        char tag[32];
        for (int i = 0; i < 12; i++) {
            snprintf(tag, sizeof tag, "many.%02d", i);
            many[i] = must_alloc(a, (size_t)(i + 1) * 4 * KiB, tag);
        }
        char rep[8192];
        size_t need = qc_alloc_report_format(a, 0, rep, sizeof rep);
        T_EXPECT(need < sizeof rep, "report length %zu", need);
        T_EXPECT_STR_CONTAINS(rep, "memory report");
        T_EXPECT_STR_CONTAINS(rep, "10 largest of 15 tags");
        T_EXPECT(strstr(rep, "many.11") && !strstr(rep, "many.00"), "top-10 cut:\n%s", rep);
        char tiny[16];
        size_t need2 = qc_alloc_report_format(a, 0, tiny, sizeof tiny);
        T_EXPECT(need2 == need && strlen(tiny) == sizeof tiny - 1, "truncation");
        for (int i = 0; i < 12; i++)
            qc_alloc_free(a, many[i], NULL);
        qc_alloc_free(a, q, NULL);
        qc_alloc_free(a, r, NULL);
        qc_alloc_free(a, t, NULL);
        /* Now everything is cached: the same 40 MiB request succeeds through the retry. */
        void *y = must_alloc(a, 40 * MiB, "after");
        T_EXPECT(stats(a).bytes_reserved <= 64 * MiB, "budget");
        qc_alloc_free(a, y, NULL);
        check_inv(a, "budget");
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: near the budget a request gets a segment of its own size") {
        /* issue 25: 12 MiB live in a 30 MiB budget; a 6 MiB request would take a whole 20 MiB
         * large segment (over budget), and a 100 KiB one a 2 MiB small segment once only
         * 0.5 MiB is left: each gets a segment of its own (rounded) size instead of failing */
        struct qc_alloc *a = make(false, 30 * MiB, 0);
        void *big = must_alloc(a, 12 * MiB, "big");
        void *mid = must_alloc(a, 6 * MiB, "scratch");
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_reserved, 18 * MiB, "an exact-size 6 MiB segment");
        T_EXPECT_EQ_U64(s.n_ooms, 0, "no OOM");
        void *fill = must_alloc(a, 9 * MiB + 512 * KiB, "fill");
        void *fill2 = must_alloc(a, 1 * MiB + 512 * KiB, "fill2");
        T_EXPECT_EQ_U64(stats(a).bytes_reserved, 29 * MiB, "exact-size 9.5 and 1.5 MiB segments");
        void *small = must_alloc(a, 100 * KiB, "small");
        s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_reserved, 29 * MiB + 100 * KiB, "an exact-size small segment");
        T_EXPECT_EQ_U64(s.n_ooms, 0, "no OOM");
        /* what does not fit the rest of the budget still fails */
        void *x = NULL;
        T_EXPECT(qc_alloc_malloc(a, 1 * MiB, NULL, "too/big", &x) == QC_ERR_NOMEM,
                 "1 MiB with %zu bytes reserved of 30 MiB", stats(a).bytes_reserved);
        check_inv(a, "exact-size segments");
        qc_alloc_free(a, small, NULL);
        qc_alloc_free(a, fill2, NULL);
        qc_alloc_free(a, fill, NULL);
        qc_alloc_free(a, mid, NULL);
        qc_alloc_free(a, big, NULL);
        check_inv(a, "exact-size segments freed");
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: cached free segments of one pool give way to the other pool's request") {
        /* 6 MiB of small segments, all free but cached, and a 4 MiB large request in an 8 MiB
         * budget: the retry releases the small pool's free segments; and back, the large
         * pool's free granules give way to new small segments. */
        struct qc_alloc *a = make(true, 8 * MiB, 0);
        void *s[24];
        for (int i = 0; i < 24; i++)
            s[i] = must_alloc(a, 256 * KiB, "small");
        T_EXPECT_EQ_U64(stats(a).bytes_reserved_small, 6 * MiB, "three small segments");
        for (int i = 0; i < 24; i++)
            qc_alloc_free(a, s[i], NULL);
        void *big = must_alloc(a, 4 * MiB, "large");
        struct qc_alloc_stats st = stats(a);
        T_EXPECT_EQ_U64(st.n_ooms, 0, "no OOM");
        T_EXPECT_EQ_U64(st.bytes_reserved_small, 0, "the small pool's free segments released");
        qc_alloc_free(a, big, NULL);
        for (int i = 0; i < 24; i++)
            s[i] = must_alloc(a, 256 * KiB, "small again");
        st = stats(a);
        T_EXPECT_EQ_U64(st.n_ooms, 0, "no OOM");
        T_EXPECT_EQ_U64(st.bytes_reserved, 6 * MiB, "the large pool's free granules released");
        check_inv(a, "pools give way");
        for (int i = 0; i < 24; i++)
            qc_alloc_free(a, s[i], NULL);
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: blocks of one lifetime class share segments; scratch and, at the budget, "
             "any class take another class's free block") {
        /* an activation beside a long-lived block: with classes it has a segment of its own,
         * wholly free (and released) once the activation is freed, the long-lived block
         * pinning nothing of it */
        struct qc_alloc *a = make(true, 4 * MiB, 0);
        void *p = NULL, *q = NULL, *r = NULL, *x = NULL;
        void *lng = must_alloc(a, 100 * KiB, "long");
        T_EXPECT(qc_alloc_malloc_life(a, 100 * KiB, NULL, QC_ALLOC_LIFE_PHASE, "act", &p) == QC_OK,
                 "phase: %s", qc_error_last());
        T_EXPECT_EQ_U64(stats(a).bytes_reserved_small, 4 * MiB, "two small segments");
        T_EXPECT((uintptr_t)p / (2 * MiB) != (uintptr_t)lng / (2 * MiB), "apart");
        check_inv(a, "two classes");
        qc_alloc_free(a, p, NULL);
        T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "empty cache");
        T_EXPECT_EQ_U64(stats(a).bytes_reserved_small, 2 * MiB, "the phase segment released");
        /* scratch (freed within its span) takes the free room of another class first */
        T_EXPECT(qc_alloc_malloc_life(a, 100 * KiB, NULL, QC_ALLOC_LIFE_SPAN, "tmp", &x) == QC_OK,
                 "span: %s", qc_error_last());
        T_EXPECT_EQ_U64(stats(a).bytes_reserved_small, 2 * MiB, "no segment for the scratch");
        T_EXPECT((uintptr_t)x / (2 * MiB) == (uintptr_t)lng / (2 * MiB), "beside the long block");
        qc_alloc_free(a, x, NULL);
        /* the budget holds two segments: the long class has 512 KiB free, the phase class
         * 1 MiB; a 768 KiB long-lived request takes the phase segment's room, not an OOM */
        void *lng2 = must_alloc(a, 1 * MiB + 400 * KiB, "long2");
        T_EXPECT(qc_alloc_malloc_life(a, 1 * MiB, NULL, QC_ALLOC_LIFE_PHASE, "act", &q) == QC_OK,
                 "phase: %s", qc_error_last());
        struct qc_alloc_stats st = stats(a);
        T_EXPECT_EQ_U64(st.bytes_reserved, 4 * MiB, "long and phase segments: the budget");
        T_EXPECT(qc_alloc_malloc(a, 768 * KiB, NULL, "long3", &r) == QC_OK,
                 "long over the budget: %s", qc_error_last());
        st = stats(a);
        T_EXPECT_EQ_U64(st.n_ooms, 0, "no OOM");
        T_EXPECT_EQ_U64(st.bytes_reserved, 4 * MiB, "no third segment");
        T_EXPECT((uintptr_t)r / (2 * MiB) == (uintptr_t)q / (2 * MiB), "in the phase segment");
        check_inv(a, "two classes in two segments");
        qc_alloc_free(a, r, NULL);
        qc_alloc_free(a, q, NULL);
        qc_alloc_free(a, lng2, NULL);
        qc_alloc_free(a, lng, NULL);
        check_inv(a, "freed");
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: the peak snapshot's reserved bytes holding data leave the cache out") {
        /* a small block (its 2 MiB segment) and a 5 MiB large one (3 granules of the
         * expandable segment): all 8 MiB hold data; the large one freed (its granules stay
         * cached) and a 1.5 MiB one taken from the first granule: 4 of the 8 MiB hold data */
        struct qc_alloc *a = make(true, 0, 0);
        void *p = must_alloc(a, 100 * KiB, "small");
        void *q = must_alloc(a, 5 * MiB, "large");
        qc_alloc_reset_peak(a);
        struct qc_alloc_peak_snapshot snap;
        qc_alloc_peak_snapshot_step(a, &snap);
        T_EXPECT_EQ_U64(snap.bytes_reserved, 8 * MiB, "reserved");
        T_EXPECT_EQ_U64(snap.bytes_reserved_live, 8 * MiB, "every byte reserved holds data");
        qc_alloc_free(a, q, NULL);
        void *r = must_alloc(a, 1 * MiB + 512 * KiB, "large2");
        qc_alloc_reset_peak(a);
        qc_alloc_peak_snapshot_step(a, &snap);
        T_EXPECT_EQ_U64(snap.bytes_reserved, 8 * MiB, "the freed granules cached");
        T_EXPECT_EQ_U64(snap.bytes_reserved_live, 4 * MiB,
                        "the small segment and the large block's granule");
        check_inv(a, "reserved live");
        qc_alloc_free(a, r, NULL);
        qc_alloc_free(a, p, NULL);
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: per-step peaks and statistics identities") {
        struct qc_alloc *a = make(true, 0, 0);
        void *p = must_alloc(a, 10 * MiB, "x");
        void *q = must_alloc(a, 30 * MiB, "y");
        qc_alloc_free(a, q, NULL);
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_allocated, 10 * MiB, "current");
        T_EXPECT_EQ_U64(s.bytes_allocated_peak, 40 * MiB, "peak");
        T_EXPECT_EQ_U64(s.bytes_active, 10 * MiB, "active (no pending frees)");
        T_EXPECT_EQ_U64(s.n_allocs, 2, "allocs");
        T_EXPECT_EQ_U64(s.n_frees, 1, "frees");
        T_EXPECT_NEAR(s.fragmentation, (double)s.bytes_reserved_peak / (double)(40 * MiB), 1e-12, 0,
                      "fragmentation definition");
        qc_alloc_set_step(a, 7);
        qc_alloc_reset_peak(a);
        s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_allocated_peak, 10 * MiB, "peak after reset");
        T_EXPECT_EQ_I64(s.step, 7, "step");
        void *r = must_alloc(a, 5 * MiB, "z");
        T_EXPECT_EQ_U64(stats(a).bytes_allocated_peak, 15 * MiB, "per-step peak");
        qc_alloc_free(a, r, NULL);
        qc_alloc_free(a, p, NULL);
        T_EXPECT_EQ_U64(stats(a).bytes_allocated, 0, "zero at the end");
        check_inv(a, "stats");
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: the peak snapshot names the tags live at the peak with exact bytes") {
        struct qc_alloc *a = make(true, 0, 0);
        struct qc_alloc_peak_snapshot s;
        qc_alloc_peak_snapshot(a, &s);
        T_EXPECT(s.step == -1 && s.n_snapshots == 0 && s.bytes_allocated == 0, "none yet");
        qc_alloc_set_step(a, 1);
        void *k = must_alloc(a, 10 * MiB, "enc.a/k_edge");
        void *v = must_alloc(a, 6 * MiB, "enc.a/v_edge");
        void *x = must_alloc(a, 4 * MiB, "dec.b/x");
        void *u = must_alloc(a, 1 * MiB, NULL);
        const size_t bk = qc_alloc_usable_size(a, k), bv = qc_alloc_usable_size(a, v);
        const size_t bx = qc_alloc_usable_size(a, x), bu = qc_alloc_usable_size(a, u);
        const size_t peak1 = bk + bv + bx + bu;
        qc_alloc_free(a, x, NULL);
        qc_alloc_set_step(a, 2);
        void *y = must_alloc(a, 2 * MiB, "dec.b/y"); /* below the peak: no snapshot */
        qc_alloc_peak_snapshot(a, &s);
        T_EXPECT_EQ_U64(s.bytes_allocated, peak1, "snapshot at the peak");
        T_EXPECT_EQ_U64(s.bytes_allocated_peak, peak1, "the true peak");
        T_EXPECT_EQ_I64(s.step, 1, "step of the peak");
        T_EXPECT_EQ_U64(s.n_snapshots, 4, "one per allocation that grew the peak > 1 %%");
        T_EXPECT_EQ_U64(s.n_tags, 4, "tags live at the peak");
        T_EXPECT_EQ_U64(s.ntop_tags, 4, "all kept by name");
        const char *want_tags[] = {"enc.a/k_edge", "enc.a/v_edge", "dec.b/x", "(untagged)"};
        const size_t want_bytes[] = {bk, bv, bx, bu};
        for (int i = 0; i < 4; i++) {
            T_EXPECT(strcmp(s.tags[i].name, want_tags[i]) == 0, "tag %d: %s, want %s", i,
                     s.tags[i].name, want_tags[i]);
            T_EXPECT_EQ_U64(s.tags[i].bytes, want_bytes[i], "bytes of %s", want_tags[i]);
            T_EXPECT_EQ_U64(s.tags[i].blocks, 1, "blocks of %s", want_tags[i]);
        }
        T_EXPECT_EQ_U64(s.tag_other.bytes, 0, "nothing in other");
        T_EXPECT_EQ_U64(s.n_blocks, 3, "blocks live at the peak");
        T_EXPECT(s.ntop_blocks == 3 && strcmp(s.blocks[0].name, "enc.a") == 0 &&
                     strcmp(s.blocks[1].name, "dec.b") == 0 &&
                     strcmp(s.blocks[2].name, "(untagged)") == 0,
                 "blocks by bytes: %s %s %s", s.blocks[0].name, s.blocks[1].name, s.blocks[2].name);
        T_EXPECT_EQ_U64(s.blocks[0].bytes, bk + bv, "enc.a = k_edge + v_edge");
        T_EXPECT_EQ_U64(s.blocks[0].blocks, 2, "enc.a holds 2 allocations");
        T_EXPECT_EQ_U64(s.blocks[1].bytes, bx, "dec.b");
        check_inv(a, "snapshot at the peak");

        /* A new peak within 1 % of the snapshot takes none: the snapshot still names dec.b/x,
         * and the true peak is within snap + snap / 100. */
        qc_alloc_free(a, y, NULL);
        void *z = must_alloc(a, 4 * MiB + 100 * KiB, "late/z");
        const size_t peak2 = bk + bv + bu + qc_alloc_usable_size(a, z);
        T_EXPECT(peak2 > peak1 && peak2 <= peak1 + peak1 / 100, "setup: %zu vs %zu", peak2, peak1);
        qc_alloc_peak_snapshot(a, &s);
        T_EXPECT_EQ_U64(s.n_snapshots, 4, "no snapshot for a < 1 %% rise");
        T_EXPECT_EQ_U64(s.bytes_allocated, peak1, "the old snapshot stays");
        T_EXPECT_EQ_U64(s.bytes_allocated_peak, peak2, "the true peak moved");
        T_EXPECT(strcmp(s.tags[2].name, "dec.b/x") == 0, "still names dec.b/x: %s", s.tags[2].name);
        check_inv(a, "within 1 %");
        /* Past 1 %: a new snapshot naming late/z and late/w, not dec.b/x. */
        void *w = must_alloc(a, 1 * MiB, "late/w");
        const size_t peak3 = peak2 + qc_alloc_usable_size(a, w);
        qc_alloc_peak_snapshot(a, &s);
        T_EXPECT_EQ_U64(s.n_snapshots, 5, "a snapshot for a > 1 %% rise");
        T_EXPECT_EQ_U64(s.bytes_allocated, peak3, "at the new peak");
        T_EXPECT_EQ_I64(s.step, 2, "step of the new peak");
        T_EXPECT(s.ntop_blocks == 3 && strcmp(s.blocks[1].name, "late") == 0, "blocks: %s %s %s",
                 s.blocks[0].name, s.blocks[1].name, s.blocks[2].name);
        T_EXPECT_EQ_U64(s.blocks[1].bytes, peak3 - bk - bv - bu, "late = z + w");
        for (uint32_t i = 0; i < s.ntop_tags; i++)
            T_EXPECT(strcmp(s.tags[i].name, "dec.b/x") != 0, "dec.b/x is gone");

        /* Per-step window: reset_peak snapshots what is live; the run window is kept. */
        qc_alloc_free(a, w, NULL);
        qc_alloc_free(a, z, NULL);
        qc_alloc_set_step(a, 3);
        qc_alloc_reset_peak(a);
        struct qc_alloc_peak_snapshot ss;
        qc_alloc_peak_snapshot_step(a, &ss);
        T_EXPECT_EQ_U64(ss.bytes_allocated, bk + bv + bu, "step window starts at the live bytes");
        T_EXPECT(ss.step == 3 && ss.n_snapshots == 1, "step %" PRId64 ", %" PRIu64 " snapshots",
                 ss.step, ss.n_snapshots);
        void *t = must_alloc(a, 3 * MiB, "s3/t");
        qc_alloc_peak_snapshot_step(a, &ss);
        T_EXPECT_EQ_U64(ss.bytes_allocated, bk + bv + bu + qc_alloc_usable_size(a, t), "step peak");
        T_EXPECT_EQ_U64(ss.bytes_allocated_peak, ss.bytes_allocated, "step true peak");
        T_EXPECT(ss.n_snapshots == 2 && strcmp(ss.blocks[1].name, "s3") == 0, "names s3: %s",
                 ss.blocks[1].name);
        qc_alloc_peak_snapshot(a, &s);
        T_EXPECT_EQ_U64(s.bytes_allocated, peak3, "run window unchanged by the step");
        T_EXPECT_EQ_U64(s.bytes_allocated_peak, peak3, "run peak kept across reset_peak");
        struct qc_alloc_stats rs;
        qc_alloc_stats_get_run(a, &rs);
        T_EXPECT_EQ_U64(rs.bytes_allocated_peak, peak3, "run-wide stats peak");
        T_EXPECT(stats(a).bytes_allocated_peak < peak3, "the step stats peak is the step's");
        check_inv(a, "step window");
        qc_alloc_free(a, t, NULL);
        qc_alloc_free(a, k, NULL);
        qc_alloc_free(a, v, NULL);
        qc_alloc_free(a, u, NULL);
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: peak snapshot keeps the top 32 tags and sums the rest into other") {
        struct qc_alloc *a = make(true, 0, 0);
        enum { N = 40, NB = 5 };
        void *p[N];
        size_t sz[N], total = 0, block_bytes[NB] = {0};
        for (int i = 0; i < N; i++) {
            char tag[32];
            snprintf(tag, sizeof tag, "blk%d/t%02d", i % NB, i);
            p[i] = must_alloc(a, (size_t)(i + 1) * 4 * KiB, tag);
            sz[i] = qc_alloc_usable_size(a, p[i]);
            total += sz[i];
            block_bytes[i % NB] += sz[i];
        }
        struct qc_alloc_peak_snapshot s;
        qc_alloc_peak_snapshot(a, &s);
        T_EXPECT_EQ_U64(s.bytes_allocated, total, "the last allocation grew the peak > 1 %%");
        T_EXPECT(s.n_tags == N && s.ntop_tags == QC_ALLOC_PEAK_TOP, "%" PRIu64 " tags, %u kept",
                 s.n_tags, s.ntop_tags);
        size_t other = 0;
        for (int i = 0; i < N - QC_ALLOC_PEAK_TOP; i++)
            other += sz[i]; /* the 8 smallest */
        T_EXPECT_EQ_U64(s.tag_other.bytes, other, "other = the smallest tags");
        T_EXPECT_EQ_U64(s.tag_other.blocks, N - QC_ALLOC_PEAK_TOP, "other's allocations");
        T_EXPECT(strcmp(s.tags[0].name, "blk4/t39") == 0 && s.tags[0].bytes == sz[N - 1],
                 "largest first: %s", s.tags[0].name);
        T_EXPECT(strcmp(s.tag_other.name, "other") == 0, "other's name");
        T_EXPECT_EQ_U64(s.n_blocks, NB, "blocks");
        for (uint32_t i = 0; i < s.ntop_blocks; i++) {
            int bi = s.blocks[i].name[3] - '0';
            T_EXPECT(bi >= 0 && bi < NB && s.blocks[i].bytes == block_bytes[bi],
                     "block %s: %zu bytes", s.blocks[i].name, s.blocks[i].bytes);
            T_EXPECT_EQ_U64(s.blocks[i].blocks, N / NB, "allocations of %s", s.blocks[i].name);
        }
        char b[QC_ALLOC_TAG_MAX];
        T_EXPECT(strcmp(qc_alloc_tag_block("agent_encoder.pl2a.0/k_edge", b),
                        "agent_encoder.pl2a.0") == 0,
                 "block of a/b: %s", b);
        T_EXPECT(strcmp(qc_alloc_tag_block("map_encoder.x_pl.stash", b), "map_encoder.x_pl") == 0,
                 "block of x.stash: %s", b);
        T_EXPECT(strcmp(qc_alloc_tag_block("optim/exp_avg", b), "optim") == 0, "optim: %s", b);
        T_EXPECT(strcmp(qc_alloc_tag_block("plain", b), "plain") == 0, "plain: %s", b);
        check_inv(a, "top 32");
        for (int i = 0; i < N; i++)
            qc_alloc_free(a, p[i], NULL);
        qc_alloc_destroy(a);
    }

    QC_TEST ("alloc: trace ring and trace file") {
        char path[256];
        snprintf(path, sizeof path, "%s/test_alloc_trace_%d.bin", QC_BINARY_DIR, (int)getpid());
        struct qc_alloc_params p;
        qc_alloc_params_default(&p);
        p.trace = true;
        p.trace_capacity = 8;
        p.trace_file = path;
        p.budget = 16 * MiB;
        struct qc_alloc *a = NULL;
        T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_OK, "%s", qc_error_last());
        qc_alloc_set_step(a, 3);
        void *x = must_alloc(a, 3 * MiB, "blk/x");
        void *y = must_alloc(a, 1000, "blk/y");
        qc_alloc_free(a, x, NULL);
        void *z = NULL;
        T_EXPECT(qc_alloc_malloc(a, 100 * MiB, NULL, "blk/huge", &z) == QC_ERR_NOMEM, "OOM");
        qc_alloc_set_step(a, 4);
        qc_alloc_free(a, y, NULL);
        struct qc_alloc_event ev[16];
        size_t n = 0;
        uint64_t total = qc_alloc_trace_read(a, ev, 16, &n);
        T_EXPECT(total > 8 && n == 8, "ring: total %" PRIu64 ", read %zu", total, n);
        T_EXPECT(ev[n - 1].kind == QC_ALLOC_EV_FREE && ev[n - 1].step == 4 &&
                     strcmp(ev[n - 1].tag, "blk/y") == 0 && ev[n - 1].size == 1024,
                 "last event: %s %s step %" PRId64,
                 qc_alloc_event_kind_str((enum qc_alloc_event_kind)ev[n - 1].kind), ev[n - 1].tag,
                 ev[n - 1].step);
        for (size_t i = 1; i < n; i++)
            T_EXPECT(ev[i].t_ns >= ev[i - 1].t_ns, "ring order");
        T_EXPECT(qc_alloc_trace_flush(a) == QC_OK, "flush");
        qc_alloc_destroy(a);
        struct qc_alloc_event *fe = NULL;
        size_t fn = 0;
        T_EXPECT(qc_alloc_trace_load(path, &fe, &fn) == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_U64(fn, total, "the file has every event");
        int seen_map = 0, seen_unmap = 0, seen_oom = 0, seen_alloc_x = 0;
        for (size_t i = 0; i < fn; i++) {
            seen_map += fe[i].kind == QC_ALLOC_EV_MAP;
            seen_unmap += fe[i].kind == QC_ALLOC_EV_UNMAP;
            if (fe[i].kind == QC_ALLOC_EV_OOM) {
                seen_oom++;
                T_EXPECT(strcmp(fe[i].tag, "blk/huge") == 0 && fe[i].size == 100 * MiB,
                         "OOM event");
            }
            if (fe[i].kind == QC_ALLOC_EV_ALLOC && strcmp(fe[i].tag, "blk/x") == 0) {
                seen_alloc_x++;
                T_EXPECT(fe[i].step == 3 && fe[i].requested == 3 * MiB &&
                             fe[i].addr == (uint64_t)(uintptr_t)x &&
                             fe[i].bytes_allocated == 3 * MiB,
                         "alloc event fields");
            }
        }
        T_EXPECT(seen_map >= 2 && seen_unmap >= 1 && seen_oom == 1 && seen_alloc_x == 1,
                 "map %d unmap %d oom %d alloc %d", seen_map, seen_unmap, seen_oom, seen_alloc_x);
        if (n == 8 && fn >= 8)
            T_EXPECT(memcmp(&fe[fn - 1], &ev[7], sizeof ev[7]) == 0, "ring == file tail");
        free(fe);
        /* A truncated file is an error with the record number. */
        FILE *f = fopen(path, "r+b");
        if (f) {
            T_EXPECT(ftruncate(fileno(f), 64 + 128 + 100) == 0, "truncate");
            fclose(f);
            T_EXPECT(qc_alloc_trace_load(path, &fe, &fn) == QC_ERR_INVALID, "truncated loads");
            T_EXPECT_STR_CONTAINS(qc_error_last(), "record 1: truncated");
        }
        remove(path);
        p.trace_file = "/nonexistent-dir/trace.bin";
        T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_ERR_IO, "unwritable trace file");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "/nonexistent-dir/trace.bin");
    }

    return qc_test_summary();
}
