/*
 * test_alloc_pinned.c — the pinned host arena (jemalloc with our extent hooks) on the CPU
 * backend: alignment and contents, statistics, the budget (QC_ERR_NOMEM and recovery), extents
 * mapped once and reused, and concurrent use (labelled tsan). Through the registration seam
 * (alloc_pinned_create_with, a logging pin/unpin in place of cudaHostRegister): every extent is
 * pinned once, outside the jemalloc hooks, before any of its memory is returned; a failed pin
 * fails the allocation and is retried; destroy unpins what was pinned; every pin and unpin runs
 * with the arena's device selected on the calling thread (the seam's arenas are on device 1;
 * a thread that never selected one is on device 0, as in the CUDA runtime). The EMU backend's
 * arena (qc_pinned_create_emu) registers with its emulated device from any thread.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_internal.h" /* alloc_pinned_create_with, alloc_pinned_in_hook */
#include "qc_emu.h"
#include "qc_pinned.h"
#include "testutil.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static struct qc_pinned_stats pstats(struct qc_pinned *p)
{
    struct qc_pinned_stats s;
    qc_pinned_stats_get(p, &s);
    return s;
}

struct thr {
    struct qc_pinned *p;
    uint64_t seed;
    int bad;
    int err;
};

static void *worker(void *user)
{
    struct thr *t = user;
    uint64_t rng = t->seed;
    enum { K = 16 };
    unsigned char *live[K] = {0};
    size_t size[K] = {0};
    unsigned char val[K] = {0};
    for (int it = 0; it < 3000; it++) {
        int i = (int)(qc_test_rand(&rng) % K);
        if (live[i]) {
            for (size_t j = 0; j < size[i]; j += 61)
                t->bad += live[i][j] != val[i];
            qc_pinned_free(t->p, live[i]);
            live[i] = NULL;
        } else {
            size[i] = 1 + (size_t)(qc_test_rand(&rng) % (300 * KiB));
            val[i] = (unsigned char)qc_test_rand(&rng);
            void *q = NULL;
            if (qc_pinned_malloc(t->p, size[i], 64, "thr", &q) != QC_OK) {
                t->err++;
                continue;
            }
            live[i] = q;
            memset(q, val[i], size[i]);
        }
    }
    for (int i = 0; i < K; i++)
        qc_pinned_free(t->p, live[i]);
    return NULL;
}

// ---- the registration seam, logged ---------------------------------------------------------

enum { PIN_MAX = 512, SEAM_DEVICE = 1 };

/* The calling thread's current device as the seam's select sets it (cudaSetDevice's state): 0
 * on a thread that never selected one. */
static _Thread_local int seam_current;

struct pin_log {
    pthread_mutex_t mu;
    int pins, unpins;
    int wrong_device; /* pins and unpins made while the thread's device was not SEAM_DEVICE */
    int in_hook;      /* pins called from inside a jemalloc hook (must stay 0) */
    int bad_unpin;    /* unpins of a range not pinned */
    int fail_next;    /* the next fail_next pins fail */
    int n;
    struct {
        char *base;
        size_t size;
        bool live;
    } r[PIN_MAX];
};

static enum qc_status log_select(void *ctx, int device)
{
    (void)ctx;
    seam_current = device;
    return QC_OK;
}

static enum qc_status log_pin(void *ctx, void *base, size_t size)
{
    struct pin_log *l = ctx;
    free(malloc(64)); /* as cudaHostRegister may: must not re-enter a hook's locks */
    pthread_mutex_lock(&l->mu);
    l->in_hook += alloc_pinned_in_hook();
    l->wrong_device += seam_current != SEAM_DEVICE;
    if (l->fail_next > 0) {
        l->fail_next--;
        pthread_mutex_unlock(&l->mu);
        return qc_errorf(QC_ERR_NOMEM, "simulated cudaHostRegister failure");
    }
    if (l->n < PIN_MAX) {
        l->r[l->n].base = base;
        l->r[l->n].size = size;
        l->r[l->n].live = true;
        l->n++;
    }
    l->pins++;
    pthread_mutex_unlock(&l->mu);
    return QC_OK;
}

static enum qc_status log_unpin(void *ctx, void *base)
{
    struct pin_log *l = ctx;
    pthread_mutex_lock(&l->mu);
    l->wrong_device += seam_current != SEAM_DEVICE;
    int hit = 0;
    for (int i = 0; i < l->n; i++)
        if (l->r[i].live && l->r[i].base == base) {
            l->r[i].live = false;
            hit = 1;
            break;
        }
    l->bad_unpin += !hit;
    l->unpins++;
    pthread_mutex_unlock(&l->mu);
    return QC_OK;
}

/* [p, p + size) lies inside one pinned range. */
static bool log_covers(struct pin_log *l, const void *p, size_t size)
{
    const char *c = p;
    bool ok = false;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->n && !ok; i++)
        ok = l->r[i].live && c >= l->r[i].base && c + size <= l->r[i].base + l->r[i].size;
    pthread_mutex_unlock(&l->mu);
    return ok;
}

static struct pin_log *log_new(void)
{
    struct pin_log *l = calloc(1, sizeof *l);
    if (!l)
        T_FATAL("out of memory");
    pthread_mutex_init(&l->mu, NULL);
    return l;
}

static void log_free(struct pin_log *l)
{
    pthread_mutex_destroy(&l->mu);
    free(l);
}

/* A pinned arena of device SEAM_DEVICE over the logging seam. */
static struct qc_pinned *seam_arena(struct pin_log *l)
{
    const struct alloc_pin_ops ops = {log_select, log_pin, log_unpin, l, SEAM_DEVICE};
    struct qc_pinned *p = NULL;
    if (alloc_pinned_create_with(&ops, 0, &p) != QC_OK)
        T_FATAL("pinned arena over the seam: %s", qc_error_last());
    return p;
}

/* Destroys p (every pin must be undone, once, on the arena's device) and the log; destroyed
 * from a fresh thread (on device 0) when from_thread. */
static void *destroy_thread(void *p)
{
    qc_pinned_destroy(p);
    return NULL;
}

static void seam_close(struct qc_pinned *p, struct pin_log *l, bool from_thread)
{
    T_EXPECT_EQ_I64(pstats(p).device, SEAM_DEVICE, "the arena's device");
    if (from_thread) {
        pthread_t th;
        T_EXPECT(pthread_create(&th, NULL, destroy_thread, p) == 0, "pthread_create");
        pthread_join(th, NULL);
    } else {
        qc_pinned_destroy(p);
    }
    T_EXPECT_EQ_I64(l->wrong_device, 0, "pins and unpins made on another device than the arena's");
    T_EXPECT_EQ_I64(l->unpins, l->pins, "unpins at destroy");
    T_EXPECT_EQ_I64(l->bad_unpin, 0, "unpins of ranges never pinned");
    log_free(l);
}

struct pin_thr {
    struct qc_pinned *p;
    struct pin_log *log;
    uint64_t seed;
    int uncovered, err;
};

static void *pin_worker(void *user)
{
    struct pin_thr *t = user;
    uint64_t rng = t->seed;
    void *live[8] = {0};
    for (int it = 0; it < 400; it++) {
        int i = (int)(qc_test_rand(&rng) % 8);
        qc_pinned_free(t->p, live[i]);
        live[i] = NULL;
        size_t size = 1 + (size_t)(qc_test_rand(&rng) % (3 * MiB));
        if (qc_pinned_malloc(t->p, size, 64, "thr", &live[i]) != QC_OK) {
            t->err++;
            continue;
        }
        t->uncovered += !log_covers(t->log, live[i], size);
        memset(live[i], it, size < 4096 ? size : 4096);
    }
    for (int i = 0; i < 8; i++)
        qc_pinned_free(t->p, live[i]);
    return NULL;
}

static void test_pin_seam(void)
{
    QC_TEST ("pinned: extents are pinned once, outside the hooks, before their memory is used") {
        struct pin_log *l = log_new();
        struct qc_pinned *p = seam_arena(l);
        const size_t sizes[] = {1, 100, 4096, MiB, 10 * MiB + 3, 64 * MiB, 200, 3 * MiB};
        void *q[8];
        for (int i = 0; i < 8; i++) {
            T_EXPECT(qc_pinned_malloc(p, sizes[i], 0, "seam", &q[i]) == QC_OK, "%s",
                     qc_error_last());
            T_EXPECT(q[i] && log_covers(l, q[i], sizes[i]),
                     "allocation %d (%zu bytes) returned before its extent was pinned", i,
                     sizes[i]);
        }
        struct qc_pinned_stats s = pstats(p);
        T_EXPECT(s.n_extents >= 2, "only %" PRIu64 " extent(s): the hooks never ran", s.n_extents);
        T_EXPECT_EQ_U64(l->pins, s.n_extents, "one pin per extent");
        T_EXPECT_EQ_U64(s.bytes_pinned, s.bytes_reserved, "pinned bytes");
        T_EXPECT_EQ_I64(l->in_hook, 0, "pins made inside a jemalloc extent hook");
        /* reuse: no new extent, no new pin */
        const int pins = l->pins;
        for (int i = 0; i < 8; i++)
            qc_pinned_free(p, q[i]);
        for (int i = 0; i < 8; i++)
            T_EXPECT(qc_pinned_malloc(p, sizes[i], 0, "seam", &q[i]) == QC_OK, "%s",
                     qc_error_last());
        T_EXPECT_EQ_I64(l->pins, pins, "pins when reusing cached extents");
        for (int i = 0; i < 8; i++)
            qc_pinned_free(p, q[i]);
        seam_close(p, l, false);
    }

    QC_TEST ("pinned: a failed pin fails the allocation; the extent is pinned by a later one") {
        struct pin_log *l = log_new();
        struct qc_pinned *p = seam_arena(l);
        void *q = NULL;
        l->fail_next = 1;
        enum qc_status st = qc_pinned_malloc(p, 32 * MiB, 0, "stage", &q);
        T_EXPECT(st == QC_ERR_NOMEM && q == NULL, "got %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "cannot pin a new extent for 32.00 MiB");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "simulated cudaHostRegister failure");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "hint:");
        struct qc_pinned_stats s = pstats(p);
        T_EXPECT_EQ_U64(s.n_pin_failures, 1, "pin failures");
        T_EXPECT_EQ_U64(s.n_live, 0, "live after the failure");
        T_EXPECT(s.bytes_pinned < s.bytes_reserved, "the extent is not counted as pinned");
        st = qc_pinned_malloc(p, 32 * MiB, 0, "stage", &q);
        T_EXPECT(st == QC_OK && log_covers(l, q, 32 * MiB), "retry: %s", qc_error_last());
        s = pstats(p);
        T_EXPECT_EQ_U64(s.bytes_pinned, s.bytes_reserved, "everything pinned after the retry");
        T_EXPECT_EQ_I64(l->in_hook, 0, "pins made inside a hook");
        qc_pinned_free(p, q);
        seam_close(p, l, false);
    }

    QC_TEST ("pinned: concurrent threads only ever get pinned memory, pinned on the arena's "
             "device") {
        struct pin_log *l = log_new();
        struct qc_pinned *p = seam_arena(l);
        enum { NT = 4 };
        pthread_t th[NT];
        struct pin_thr a[NT];
        for (int i = 0; i < NT; i++) {
            a[i] = (struct pin_thr){p, l, qc_test_seed() + 100 + (uint64_t)i, 0, 0};
            pthread_create(&th[i], NULL, pin_worker, &a[i]);
        }
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            T_EXPECT(a[i].uncovered == 0 && a[i].err == 0, "thread %d: %d unpinned, %d errors", i,
                     a[i].uncovered, a[i].err);
        }
        struct qc_pinned_stats s = pstats(p);
        T_EXPECT_EQ_U64(l->pins, s.n_extents, "one pin per extent");
        T_EXPECT(l->pins > 1, "%d pins: none from the threads", l->pins);
        T_EXPECT_EQ_I64(l->in_hook, 0, "pins made inside a hook");
        seam_close(p, l, true); /* unpins from a thread that never selected a device */
    }
}

// ---- the EMU backend's arena ------------------------------------------------------------------

struct emu_thr {
    struct qc_pinned *p;
    int err;
};

static void *emu_worker(void *user)
{
    struct emu_thr *t = user;
    void *q[6] = {0};
    for (int i = 0; i < 6; i++)
        if (qc_pinned_malloc(t->p, (size_t)(i + 1) * 3 * MiB, 64, "emu", &q[i]) != QC_OK)
            t->err++;
    for (int i = 0; i < 6; i++)
        qc_pinned_free(t->p, q[i]);
    return NULL;
}

static void test_emu_arena(void)
{
    QC_TEST ("pinned (emu): the emulated registration refuses a thread on another device") {
        struct qc_emu *e = NULL;
        T_EXPECT(qc_emu_create(MiB, &e) == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(qc_emu_ordinal(e), 0, "default ordinal");
        qc_emu_set_ordinal(e, 3);
        char buf[64];
        qc_emu_device_set(2);
        T_EXPECT_EQ_I64(qc_emu_device_get(), 2, "current device");
        T_EXPECT(qc_emu_host_register(e, buf, sizeof buf) == QC_ERR_CUDA, "registered from 2");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "for device 3 from a thread whose current device "
                                               "is 2");
        qc_emu_device_set(3);
        T_EXPECT(qc_emu_host_register(e, buf, sizeof buf) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_emu_host_register(e, buf, sizeof buf) == QC_ERR_CUDA, "registered twice");
        qc_emu_device_set(0);
        T_EXPECT(qc_emu_host_unregister(e, buf) == QC_ERR_CUDA, "unregistered from device 0");
        qc_emu_device_set(3);
        T_EXPECT(qc_emu_host_unregister(e, buf) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_emu_host_unregister(e, buf) == QC_ERR_CUDA, "unregistered twice");
        struct qc_emu_host_stats hs;
        qc_emu_host_stats_get(e, &hs);
        T_EXPECT(hs.registers == 1 && hs.unregisters == 1 && hs.refused == 2 &&
                     hs.refused_device == 0 && hs.n_registered == 0 && hs.bytes_registered == 0,
                 "registers %" PRIu64 ", unregisters %" PRIu64 ", refused %" PRIu64
                 " (last from %d), %" PRIu64 " ranges of %zu bytes registered",
                 hs.registers, hs.unregisters, hs.refused, hs.refused_device, hs.n_registered,
                 hs.bytes_registered);
        qc_emu_device_set(0);
        qc_emu_destroy(e);
    }

    QC_TEST ("pinned (emu): every extent is registered with the arena's device, from any "
             "thread") {
        struct qc_emu *e = NULL;
        T_EXPECT(qc_emu_create(MiB, &e) == QC_OK, "%s", qc_error_last());
        qc_emu_set_ordinal(e, 1);
        struct qc_pinned *p = NULL;
        T_EXPECT(qc_pinned_create_emu(e, 0, &p) == QC_OK, "%s", qc_error_last());
        enum { NT = 3 };
        pthread_t th[NT];
        struct emu_thr a[NT];
        for (int i = 0; i < NT; i++) {
            a[i] = (struct emu_thr){p, 0};
            pthread_create(&th[i], NULL, emu_worker, &a[i]);
        }
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            T_EXPECT_EQ_I64(a[i].err, 0, "thread %d: failed allocations (%s)", i, qc_error_last());
        }
        struct qc_pinned_stats s = pstats(p);
        struct qc_emu_host_stats hs;
        qc_emu_host_stats_get(e, &hs);
        T_EXPECT_EQ_I64(s.device, 1, "the arena's device");
        T_EXPECT(s.n_extents > 1, "%" PRIu64 " extent(s): the threads mapped none", s.n_extents);
        T_EXPECT_EQ_U64(hs.registers, s.n_extents, "one registration per extent");
        T_EXPECT_EQ_U64(hs.bytes_registered, s.bytes_pinned, "registered bytes");
        T_EXPECT_EQ_U64(hs.refused, 0, "registrations from another device");
        pthread_t d;
        pthread_create(&d, NULL, destroy_thread, p); /* unregisters from a fresh thread */
        pthread_join(d, NULL);
        qc_emu_host_stats_get(e, &hs);
        T_EXPECT(hs.unregisters == hs.registers && hs.n_registered == 0 && hs.refused == 0,
                 "after destroy: %" PRIu64 " of %" PRIu64 " unregistered, %" PRIu64 " refused",
                 hs.unregisters, hs.registers, hs.refused);
        qc_emu_destroy(e);
    }
}

int main(void)
{
    QC_TEST ("pinned: alignment, contents and statistics") {
        struct qc_pinned *p = NULL;
        T_EXPECT(qc_pinned_create(NULL, 0, &p) == QC_OK, "%s", qc_error_last());
        const size_t sizes[] = {0, 1, 100, 4096, MiB, 10 * MiB + 3};
        const size_t aligns[] = {0, 64, 4096, 65536, MiB, 16};
        void *ptr[6];
        size_t total = 0;
        for (int i = 0; i < 6; i++) {
            T_EXPECT(qc_pinned_malloc(p, sizes[i], aligns[i], "t", &ptr[i]) == QC_OK, "%s",
                     qc_error_last());
            if (aligns[i])
                T_EXPECT((uintptr_t)ptr[i] % aligns[i] == 0, "alignment %zu of %p", aligns[i],
                         ptr[i]);
            memset(ptr[i], i + 1, sizes[i]);
            total += sizes[i];
        }
        for (int i = 0; i < 6; i++) {
            const unsigned char *c = ptr[i];
            for (size_t j = 0; j < sizes[i]; j += 97)
                if (c[j] != (unsigned char)(i + 1))
                    T_FATAL("allocation %d overwritten at %zu", i, j);
        }
        struct qc_pinned_stats s = pstats(p);
        T_EXPECT(s.bytes_allocated >= total, "allocated %zu < %zu", s.bytes_allocated, total);
        T_EXPECT(s.bytes_reserved >= s.bytes_allocated, "reserved < allocated");
        T_EXPECT_EQ_U64(s.n_live, 6, "live");
        T_EXPECT(s.n_extents > 0, "no extents mapped by the hooks");
        for (int i = 0; i < 6; i++)
            qc_pinned_free(p, ptr[i]);
        qc_pinned_free(p, NULL);
        s = pstats(p);
        T_EXPECT_EQ_U64(s.bytes_allocated, 0, "allocated after frees");
        T_EXPECT_EQ_U64(s.n_frees, 6, "frees");
        T_EXPECT(s.bytes_allocated_peak >= total, "peak");
        qc_pinned_reset_peak(p);
        T_EXPECT_EQ_U64(pstats(p).bytes_allocated_peak, 0, "peak reset");
        void *bad = NULL;
        T_EXPECT(qc_pinned_malloc(p, 10, 3, "t", &bad) == QC_ERR_INVALID, "alignment 3");
        qc_pinned_destroy(p);
        qc_pinned_destroy(NULL);
    }

    QC_TEST ("pinned: extents are mapped once and reused") {
        struct qc_pinned *p = NULL;
        T_EXPECT(qc_pinned_create(NULL, 0, &p) == QC_OK, "%s", qc_error_last());
        void *q = NULL;
        T_EXPECT(qc_pinned_malloc(p, 8 * MiB, 0, "stage", &q) == QC_OK, "%s", qc_error_last());
        qc_pinned_free(p, q);
        struct qc_pinned_stats s0 = pstats(p);
        for (int i = 0; i < 200; i++) {
            T_EXPECT(qc_pinned_malloc(p, 8 * MiB, 4096, "stage", &q) == QC_OK, "%s",
                     qc_error_last());
            qc_pinned_free(p, q);
        }
        struct qc_pinned_stats s1 = pstats(p);
        T_EXPECT_EQ_U64(s1.n_extents, s0.n_extents, "new extents for a reused size");
        T_EXPECT_EQ_U64(s1.bytes_reserved, s0.bytes_reserved, "reserved grew");
        qc_pinned_destroy(p);
    }

    QC_TEST ("pinned: budget") {
        struct qc_pinned *p = NULL;
        size_t budget = 48 * MiB;
        T_EXPECT(qc_pinned_create(NULL, budget, &p) == QC_OK, "%s", qc_error_last());
        void *q[64];
        int n = 0;
        enum qc_status st = QC_OK;
        while (n < 64 && (st = qc_pinned_malloc(p, 4 * MiB, 0, "chunk", &q[n])) == QC_OK)
            n++;
        T_EXPECT(st == QC_ERR_NOMEM, "never ran out (%d chunks)", n);
        T_EXPECT(n >= 4 && n < 12, "%d chunks of 4 MiB in a 48 MiB budget", n);
        T_EXPECT_STR_CONTAINS(qc_error_last(), "requested 4.00 MiB");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "budget 48.00 MiB");
        struct qc_pinned_stats s = pstats(p);
        T_EXPECT(s.bytes_reserved <= budget, "reserved %zu over budget", s.bytes_reserved);
        T_EXPECT_EQ_U64(s.n_ooms, 1, "ooms");
        for (int i = 0; i < n; i++)
            qc_pinned_free(p, q[i]);
        /* The memory is cached, not lost: the same chunks fit again. */
        int m = 0;
        while (m < n && qc_pinned_malloc(p, 4 * MiB, 0, "chunk", &q[m]) == QC_OK)
            m++;
        T_EXPECT_EQ_U64(m, n, "after freeing, the same number fits");
        for (int i = 0; i < m; i++)
            qc_pinned_free(p, q[i]);
        qc_pinned_destroy(p);
    }

    QC_TEST ("pinned: concurrent threads") {
        struct qc_pinned *p = NULL;
        T_EXPECT(qc_pinned_create(NULL, 0, &p) == QC_OK, "%s", qc_error_last());
        enum { NT = 4 };
        pthread_t th[NT];
        struct thr a[NT];
        for (int i = 0; i < NT; i++) {
            a[i] = (struct thr){p, qc_test_seed() + (uint64_t)i, 0, 0};
            pthread_create(&th[i], NULL, worker, &a[i]);
        }
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            T_EXPECT(a[i].bad == 0 && a[i].err == 0, "thread %d: %d corrupt, %d errors", i,
                     a[i].bad, a[i].err);
        }
        struct qc_pinned_stats s = pstats(p);
        T_EXPECT_EQ_U64(s.bytes_allocated, 0, "allocated after all threads");
        T_EXPECT_EQ_U64(s.n_allocs, s.n_frees, "allocs == frees");
        qc_pinned_destroy(p);
    }

    test_pin_seam();
    test_emu_arena();
    return qc_test_summary();
}
