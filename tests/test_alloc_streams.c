/*
 * test_alloc_streams.c — stream-ordered reuse with the CPU device layer's copy-stream worker
 * threads (labelled tsan: CI runs it under ThreadSanitizer, which also sees any early reuse as
 * a race between the worker and the next owner). Gates (host functions that block a stream until
 * the test opens them) make the orderings deterministic; nothing is timed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_internal.h" /* alloc_check_invariants */
#include "qc_alloc.h"
#include "qc_device.h"
#include "testutil.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
};

static void gate_wait(void *user)
{
    struct gate *g = user;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_init(struct gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 0;
}

static void gate_open(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_deinit(struct gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static void *must_alloc(struct qc_alloc *a, size_t size, struct qc_stream *s, const char *tag)
{
    void *p = NULL;
    if (qc_alloc_malloc(a, size, s, tag, &p) != QC_OK)
        T_FATAL("qc_alloc_malloc(%zu, %s): %s", size, tag, qc_error_last());
    return p;
}

static bool all_bytes(const void *p, size_t n, unsigned char v)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != v)
            return false;
    return true;
}

static struct qc_alloc_stats stats(struct qc_alloc *a)
{
    struct qc_alloc_stats s;
    qc_alloc_stats_get(a, &s);
    return s;
}

// ---- stress: threads with their own copy streams ---------------------------------------------

struct stress_arg {
    struct qc_alloc *a;
    struct qc_device *dev;
    uint64_t seed;
    int iters;
    int bad;
    enum qc_status err;
};

#define STRESS_RING 4

static void *stress_thread(void *user)
{
    struct stress_arg *arg = user;
    struct qc_stream *copy = NULL;
    arg->err = qc_stream_create(arg->dev, QC_STREAM_COPY, &copy);
    if (arg->err != QC_OK)
        return NULL;
    uint64_t rng = arg->seed;
    unsigned char *dst[STRESS_RING];
    size_t dst_n[STRESS_RING];
    unsigned char dst_v[STRESS_RING];
    for (int i = 0; i < STRESS_RING; i++) {
        dst[i] = malloc(256 * KiB);
        dst_n[i] = 0;
    }
    for (int it = 0; it < arg->iters && arg->err == QC_OK; it++) {
        int slot = it % STRESS_RING;
        if (it >= STRESS_RING && slot == 0) {
            /* Drain the ring: every copy read its source before that source was freed? */
            arg->err = qc_stream_synchronize(copy);
            for (int i = 0; i < STRESS_RING; i++)
                arg->bad += !all_bytes(dst[i], dst_n[i], dst_v[i]);
        }
        size_t n = 1 + (size_t)(qc_test_rand(&rng) % (256 * KiB - 1));
        unsigned char v = (unsigned char)(1 + qc_test_rand(&rng) % 255);
        void *buf = NULL;
        arg->err = qc_alloc_malloc(arg->a, n, NULL, "stress/src", &buf);
        if (arg->err != QC_OK)
            break;
        memset(buf, v, n); /* compute stream (inline): the owner writes */
        /* The copy stream reads buf later; the free must wait for it. */
        arg->err = qc_alloc_record_stream(arg->a, buf, copy);
        if (arg->err == QC_OK)
            arg->err = qc_memcpy_async(copy, dst[slot], buf, n, QC_COPY_D2H);
        dst_n[slot] = n;
        dst_v[slot] = v;
        qc_alloc_free(arg->a, buf, NULL);
    }
    if (arg->err == QC_OK)
        arg->err = qc_stream_synchronize(copy);
    for (int i = 0; i < STRESS_RING; i++) {
        arg->bad += !all_bytes(dst[i], dst_n[i], dst_v[i]);
        free(dst[i]);
    }
    qc_stream_destroy(copy);
    return NULL;
}

int main(void)
{
    uint64_t seed = qc_test_seed();
    struct qc_device *dev = NULL;
    if (qc_device_create(QC_DEVICE_CPU, 0, &dev) != QC_OK) {
        printf("cannot open the CPU device: %s\n", qc_error_last());
        return 1;
    }

    QC_TEST ("streams: record_stream defers reuse until the other stream is done") {
        struct qc_alloc *a = NULL;
        struct qc_stream *copy = NULL;
        T_EXPECT(qc_alloc_create(dev, NULL, &a) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_stream_create(dev, QC_STREAM_COPY, &copy) == QC_OK, "%s", qc_error_last());
        struct gate g;
        gate_init(&g);
        size_t n = 3 * MiB;
        void *x = must_alloc(a, n, NULL, "x");
        T_EXPECT(qc_alloc_record_stream(a, x, copy) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_stream_host_func(copy, gate_wait, &g) == QC_OK, "gate");
        T_EXPECT(qc_memset_async(copy, x, 0xab, n) == QC_OK, "memset");
        qc_alloc_free(a, x, NULL);
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.n_pending, 1, "the free waits on the copy stream");
        T_EXPECT_EQ_U64(s.bytes_active, n, "pending bytes are active");
        T_EXPECT_EQ_U64(s.bytes_allocated, 0, "but not allocated");
        void *y = must_alloc(a, n, NULL, "y");
        T_EXPECT(y != x, "block reused while the copy stream may still write it");
        T_EXPECT(alloc_check_invariants(a) == QC_OK, "%s", qc_error_last());
        gate_open(&g);
        T_EXPECT(qc_stream_synchronize(copy) == QC_OK, "sync");
        void *z = must_alloc(a, n, NULL, "z");
        T_EXPECT(z == x, "after the event the block is reused (%p vs %p)", z, x);
        T_EXPECT(all_bytes(z, n, 0xab), "the copy stream's memset completed before reuse");
        s = stats(a);
        T_EXPECT_EQ_U64(s.n_pending, 0, "pending retired");
        qc_alloc_free(a, y, NULL);
        qc_alloc_free(a, z, NULL);
        T_EXPECT(alloc_check_invariants(a) == QC_OK, "%s", qc_error_last());
        qc_stream_destroy(copy);
        qc_alloc_destroy(a);
        gate_deinit(&g);
    }

    QC_TEST ("streams: a free on another stream is ordered after that stream's work") {
        struct qc_alloc *a = NULL;
        struct qc_stream *copy = NULL;
        T_EXPECT(qc_alloc_create(dev, NULL, &a) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_stream_create(dev, QC_STREAM_COPY, &copy) == QC_OK, "%s", qc_error_last());
        struct gate g;
        gate_init(&g);
        size_t n = 200 * KiB; /* small pool */
        void *x = must_alloc(a, n, NULL, "x");
        T_EXPECT(qc_stream_host_func(copy, gate_wait, &g) == QC_OK, "gate");
        T_EXPECT(qc_memset_async(copy, x, 0x5c, n) == QC_OK, "memset");
        qc_alloc_free(a, x, copy);
        void *y = must_alloc(a, n, NULL, "y");
        T_EXPECT(y != x, "reused before the freeing stream finished");
        gate_open(&g);
        T_EXPECT(qc_stream_synchronize(copy) == QC_OK, "sync");
        void *z = must_alloc(a, n, NULL, "z");
        T_EXPECT(z == x, "reused after the event (%p vs %p)", z, x);
        T_EXPECT(all_bytes(z, n, 0x5c), "memset finished first");
        qc_alloc_free(a, y, NULL);
        qc_alloc_free(a, z, NULL);
        qc_stream_destroy(copy);
        qc_alloc_destroy(a);
        gate_deinit(&g);
    }

    QC_TEST ("streams: blocks of a stream's segments serve only that stream") {
        struct qc_alloc *a = NULL;
        struct qc_stream *copy = NULL;
        T_EXPECT(qc_alloc_create(dev, NULL, &a) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_stream_create(dev, QC_STREAM_COPY, &copy) == QC_OK, "%s", qc_error_last());
        for (int pass = 0; pass < 2; pass++) {
            size_t n = pass ? 5 * MiB : 64 * KiB;
            void *x = must_alloc(a, n, copy, "on-copy");
            qc_alloc_free(a, x, copy); /* own stream: reusable by it at once */
            T_EXPECT_EQ_U64(stats(a).n_pending, 0, "own-stream free is immediate");
            void *y = must_alloc(a, n, NULL, "on-compute");
            T_EXPECT(y != x, "a copy-stream block went to the compute stream");
            void *z = must_alloc(a, n, copy, "on-copy-again");
            T_EXPECT(z == x, "the copy stream did not get its block back");
            qc_alloc_free(a, y, NULL);
            qc_alloc_free(a, z, copy);
        }
        T_EXPECT(alloc_check_invariants(a) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_alloc_empty_cache(a) == QC_OK, "empty");
        T_EXPECT_EQ_U64(stats(a).bytes_reserved, 0, "released");
        qc_stream_destroy(copy);
        qc_alloc_destroy(a);
    }

    QC_TEST ("streams: OOM retry waits for pending frees") {
        struct qc_alloc_params p;
        qc_alloc_params_default(&p);
        p.budget = 16 * MiB;
        struct qc_alloc *a = NULL;
        struct qc_stream *copy = NULL;
        T_EXPECT(qc_alloc_create(dev, &p, &a) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_stream_create(dev, QC_STREAM_COPY, &copy) == QC_OK, "%s", qc_error_last());
        void *x = must_alloc(a, 12 * MiB, NULL, "x");
        T_EXPECT(qc_memset_async(copy, x, 1, 12 * MiB) == QC_OK, "memset");
        T_EXPECT(qc_alloc_record_stream(a, x, copy) == QC_OK, "record");
        qc_alloc_free(a, x, NULL);
        /* Only 4 MiB of budget left unless the pending free is waited for. */
        void *y = must_alloc(a, 12 * MiB, NULL, "y");
        T_EXPECT(y == x, "the retry should wait for the copy and reuse the block");
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.n_retries, 1, "served by the release-and-retry");
        T_EXPECT_EQ_U64(s.n_pending, 0, "the pending free was waited for");
        T_EXPECT(s.bytes_reserved <= 16 * MiB, "budget");
        /* The released granules came back fresh: the copy had finished (else it would have
         * faulted on decommitted memory or left its bytes here). */
        T_EXPECT(all_bytes(y, 12 * MiB, 0), "recommitted memory is fresh");
        qc_alloc_free(a, y, NULL);
        qc_stream_destroy(copy);
        qc_alloc_destroy(a);
    }

    QC_TEST ("streams: threads with copy streams never see a block reused early") {
        struct qc_alloc *a = NULL;
        T_EXPECT(qc_alloc_create(dev, NULL, &a) == QC_OK, "%s", qc_error_last());
        enum { NT = 3 };
        pthread_t th[NT];
        struct stress_arg args[NT];
        for (int i = 0; i < NT; i++) {
            args[i] = (struct stress_arg){a, dev, seed + (uint64_t)i * 7919, 400, 0, QC_OK};
            pthread_create(&th[i], NULL, stress_thread, &args[i]);
        }
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            T_EXPECT(args[i].err == QC_OK, "thread %d: %s", i, qc_status_str(args[i].err));
            T_EXPECT(args[i].bad == 0, "thread %d: %d copies saw a reused source", i, args[i].bad);
        }
        T_EXPECT(alloc_check_invariants(a) == QC_OK, "%s", qc_error_last());
        struct qc_alloc_stats s = stats(a);
        T_EXPECT_EQ_U64(s.bytes_allocated, 0, "all freed");
        T_EXPECT_EQ_U64(s.n_allocs, 3 * 400, "alloc count");
        qc_alloc_destroy(a);
    }

    qc_device_destroy(dev);
    return qc_test_summary();
}
