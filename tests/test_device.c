/*
 * test_device.c — the device layer: ordering on one stream, events across copy streams,
 * concurrent copies, re-recorded events, inline compute-stream waits, error paths.
 *
 *   test_device          runs the generic suite on the CPU backend plus the CPU-only tests
 *   test_device --cuda   runs the generic suite on CUDA device 0 (exit 77 without a GPU or driver,
 *                        exit 1 on a GPU that does not initialise: tests/cuda_probe.h)
 *
 * No test sleeps or times anything: where work must be "slow", a host function blocks on a
 * gate that the test opens. Run under ThreadSanitizer in CI (label tsan).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "cuda_probe.h"
#include "testutil.h"

#include "device_internal.h" /* device_cpu_inject_error: the CPU fault hook */
#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_pinned.h"

// ---- helpers ----------------------------------------------------------------------------------

/* A test name "<kind>: <what>" that lives until the program ends. */
static const char *tname(enum qc_device_kind kind, const char *what)
{
    static char names[64][128];
    static int next;
    char *n = names[next++ % 64];
    snprintf(n, sizeof names[0], "device %s: %s", qc_device_kind_str(kind), what);
    return n;
}

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        enum qc_status st_ = (expr);                                                               \
        T_EXPECT(st_ == QC_OK, "%s -> %s: %s", #expr, qc_status_str(st_), qc_error_last());        \
    } while (0)

/* Device and pinned host memory come from the allocator module, as everywhere in qctrain (on
 * CPU: the host mmap backend and plain memory; on CUDA: device segments and a pinned arena).
 * run_generic() creates both for its device and destroys them after the suite. Zero-filled. */
static struct {
    struct qc_device *dev;
    struct qc_alloc *alloc;
    struct qc_pinned *pinned;
} mem;

static void mem_init(struct qc_device *dev)
{
    mem.dev = dev;
    if (qc_alloc_create(dev, NULL, &mem.alloc) != QC_OK)
        T_FATAL("qc_alloc_create(%s): %s", qc_device_kind_str(qc_device_kind_of(dev)),
                qc_error_last());
    if (qc_pinned_create(dev, 0, &mem.pinned) != QC_OK)
        T_FATAL("qc_pinned_create(%s): %s", qc_device_kind_str(qc_device_kind_of(dev)),
                qc_error_last());
}

static void mem_deinit(void)
{
    qc_pinned_destroy(mem.pinned);
    qc_alloc_destroy(mem.alloc);
    memset(&mem, 0, sizeof mem);
}

static void *dev_alloc(struct qc_device *dev, size_t n)
{
    QC_ASSERT(dev == mem.dev, "dev_alloc outside run_generic");
    void *p = NULL;
    struct qc_stream *s = qc_device_compute_stream(dev);
    if (qc_alloc_malloc(mem.alloc, n, s, "test_device", &p) != QC_OK ||
        qc_memset_async(s, p, 0, n) != QC_OK || qc_stream_synchronize(s) != QC_OK)
        T_FATAL("device allocation of %zu bytes: %s", n, qc_error_last());
    return p;
}

/* Callers synchronize every stream that used p first, so freeing in compute-stream order is
 * enough. */
static void dev_free(struct qc_device *dev, void *p)
{
    QC_ASSERT(dev == mem.dev, "dev_free outside run_generic");
    qc_alloc_free(mem.alloc, p, NULL);
}

static void *host_alloc(struct qc_device *dev, size_t n)
{
    QC_ASSERT(dev == mem.dev, "host_alloc outside run_generic");
    void *p = NULL;
    if (qc_pinned_malloc(mem.pinned, n, 64, "test_device", &p) != QC_OK)
        T_FATAL("pinned allocation of %zu bytes: %s", n, qc_error_last());
    memset(p, 0, n);
    return p;
}

static void host_free(struct qc_device *dev, void *p)
{
    QC_ASSERT(dev == mem.dev, "host_free outside run_generic");
    qc_pinned_free(mem.pinned, p);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed * 131u + i * 7u + 1u);
}

/* Index of the first byte that differs from fill(seed), or n when all match. */
static size_t check_fill(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed * 131u + i * 7u + 1u))
            return i;
    return n;
}

/* A gate a host function blocks on until the test opens it. */
struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
    int arrived; /* host functions that reached the gate */
};

static void gate_init(struct gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = false;
    g->arrived = 0;
}

static void gate_deinit(struct gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static void gate_wait_fn(void *user)
{
    struct gate *g = user;
    pthread_mutex_lock(&g->mu);
    g->arrived++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(struct gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void *gate_open_thread(void *user)
{
    gate_open(user);
    return NULL;
}

/* Blocks until `n` host functions reached the gate. */
static void gate_wait_arrivals(struct gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->arrived < n)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

// ---- generic suite (CPU and CUDA) -------------------------------------------------------------

enum { ROUNDS = 64, CHUNK = 4096 };

struct order_check {
    unsigned char *back; /* (ROUNDS, CHUNK) host */
    int round;
    int *log; /* rounds in the order their host functions ran */
    int *n_log;
    int bad; /* host functions that saw a wrong copy result */
};

static void order_fn(void *user)
{
    struct order_check *c = user;
    if (check_fill(c->back + (size_t)c->round * CHUNK, CHUNK, (unsigned)c->round) != CHUNK)
        c->bad++;
    c->log[(*c->n_log)++] = c->round;
}

static void test_ordering(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "ordering on one stream")) {
        struct qc_stream *s = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s));
        unsigned char *src = host_alloc(dev, (size_t)ROUNDS * CHUNK);
        unsigned char *back = host_alloc(dev, (size_t)ROUNDS * CHUNK);
        unsigned char *zeros = host_alloc(dev, CHUNK);
        unsigned char *d = dev_alloc(dev, CHUNK); /* one device buffer reused by every round */
        for (int r = 0; r < ROUNDS; r++)
            fill(src + (size_t)r * CHUNK, CHUNK, (unsigned)r);
        int log[ROUNDS], n_log = 0;
        struct order_check checks[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            checks[r] = (struct order_check){back, r, log, &n_log, 0};
            /* Only FIFO order makes back[r] equal src[r]: rounds share d. */
            CHECK_OK(qc_memcpy_async(s, d, src + (size_t)r * CHUNK, CHUNK, QC_COPY_H2D));
            CHECK_OK(qc_memcpy_async(s, back + (size_t)r * CHUNK, d, CHUNK, QC_COPY_D2H));
            CHECK_OK(qc_stream_host_func(s, order_fn, &checks[r]));
            if (r % 8 == 7) /* a memset between rounds must not leak into the next one */
                CHECK_OK(qc_memset_async(s, d, 0, CHUNK));
        }
        CHECK_OK(qc_memcpy_async(s, zeros, d, CHUNK, QC_COPY_D2H));
        CHECK_OK(qc_stream_synchronize(s));
        T_EXPECT_EQ_I64(n_log, ROUNDS, "host functions run");
        int bad = 0, out_of_order = 0;
        for (int r = 0; r < ROUNDS; r++) {
            bad += checks[r].bad;
            out_of_order += log[r] != r;
        }
        T_EXPECT_EQ_I64(bad, 0, "host functions that saw a copy not yet done");
        T_EXPECT_EQ_I64(out_of_order, 0, "host functions out of FIFO order");
        for (int r = 0; r < ROUNDS; r++)
            T_EXPECT(check_fill(back + (size_t)r * CHUNK, CHUNK, (unsigned)r) == CHUNK,
                     "round %d copied back wrong bytes", r);
        size_t nz = 0;
        for (size_t i = 0; i < CHUNK; i++)
            nz += zeros[i] != 0;
        T_EXPECT_EQ_U64(nz, 0, "bytes not cleared by the last memset (round 63 ends with one)");

        CHECK_OK(qc_memset_async(s, d, 0xAB, CHUNK));
        CHECK_OK(qc_memcpy_async(s, back, d, CHUNK, QC_COPY_D2H));
        CHECK_OK(qc_stream_synchronize(s));
        size_t wrong = 0;
        for (size_t i = 0; i < CHUNK; i++)
            wrong += back[i] != 0xAB;
        T_EXPECT_EQ_U64(wrong, 0, "bytes not set to 0xAB by memset");

        qc_stream_destroy(s);
        dev_free(dev, d);
        host_free(dev, zeros);
        host_free(dev, back);
        host_free(dev, src);
    }
}

static void test_events_across_streams(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "events across copy streams")) {
        struct qc_stream *a = NULL, *b = NULL;
        struct qc_event *ev = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &a));
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &b));
        CHECK_OK(qc_event_create(dev, &ev));
        unsigned char *src = host_alloc(dev, CHUNK);
        unsigned char *out = host_alloc(dev, CHUNK);
        unsigned char *d = dev_alloc(dev, CHUNK);
        fill(src, CHUNK, 42);
        struct gate g;
        gate_init(&g);

        /* A: slow (gated) work, then the copy B depends on, then the event. */
        CHECK_OK(qc_stream_host_func(a, gate_wait_fn, &g));
        CHECK_OK(qc_memcpy_async(a, d, src, CHUNK, QC_COPY_H2D));
        CHECK_OK(qc_event_record(ev, a));
        /* B: must not read d before A's copy is done. */
        CHECK_OK(qc_stream_wait_event(b, ev));
        CHECK_OK(qc_memcpy_async(b, out, d, CHUNK, QC_COPY_D2H));

        gate_wait_arrivals(&g, 1); /* A is now parked in the gate */
        bool done = true;
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(!done, "event reported done while its stream is blocked");
        size_t early = 0;
        for (size_t i = 0; i < CHUNK; i++)
            early += out[i] != 0;
        T_EXPECT_EQ_U64(early, 0, "B copied before the event it waits on completed");

        gate_open(&g);
        CHECK_OK(qc_stream_synchronize(b));
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(done, "event not done after the stream waiting on it finished");
        T_EXPECT(check_fill(out, CHUNK, 42) == CHUNK, "B's copy did not see A's data");

        CHECK_OK(qc_stream_synchronize(a));
        qc_event_destroy(ev);
        qc_stream_destroy(b);
        qc_stream_destroy(a);
        gate_deinit(&g);
        dev_free(dev, d);
        host_free(dev, out);
        host_free(dev, src);
    }
}

enum { NSTREAMS = 4, COPIES_PER_STREAM = 32 };

static void test_concurrent_copies(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "concurrent copies on several streams")) {
        struct qc_stream *s[NSTREAMS] = {0};
        const size_t n = (size_t)COPIES_PER_STREAM * CHUNK;
        unsigned char *src[NSTREAMS], *back[NSTREAMS], *d[NSTREAMS];
        for (int k = 0; k < NSTREAMS; k++) {
            CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s[k]));
            src[k] = host_alloc(dev, n);
            back[k] = host_alloc(dev, n);
            d[k] = dev_alloc(dev, n);
            for (int c = 0; c < COPIES_PER_STREAM; c++)
                fill(src[k] + (size_t)c * CHUNK, CHUNK, (unsigned)(k * 1000 + c));
        }
        /* Interleave the enqueues so every stream has work queued at once. */
        for (int c = 0; c < COPIES_PER_STREAM; c++) {
            for (int k = 0; k < NSTREAMS; k++) {
                size_t off = (size_t)c * CHUNK;
                CHECK_OK(qc_memcpy_async(s[k], d[k] + off, src[k] + off, CHUNK, QC_COPY_H2D));
                CHECK_OK(qc_memcpy_async(s[k], back[k] + off, d[k] + off, CHUNK, QC_COPY_D2H));
            }
        }
        CHECK_OK(qc_device_synchronize(dev));
        for (int k = 0; k < NSTREAMS; k++)
            for (int c = 0; c < COPIES_PER_STREAM; c++)
                T_EXPECT(check_fill(back[k] + (size_t)c * CHUNK, CHUNK, (unsigned)(k * 1000 + c)) ==
                             CHUNK,
                         "stream %d chunk %d wrong after device synchronize", k, c);
        uint32_t ids[NSTREAMS];
        for (int k = 0; k < NSTREAMS; k++) {
            ids[k] = qc_stream_id(s[k]);
            T_EXPECT(ids[k] != 0, "stream %d has id 0 (reserved for the compute stream)", k);
            for (int j = 0; j < k; j++)
                T_EXPECT(ids[k] != ids[j], "streams %d and %d share id %u", j, k, ids[k]);
            T_EXPECT(qc_stream_device(s[k]) == dev, "stream %d reports another device", k);
        }
        for (int k = 0; k < NSTREAMS; k++) {
            qc_stream_destroy(s[k]);
            dev_free(dev, d[k]);
            host_free(dev, back[k]);
            host_free(dev, src[k]);
        }
    }
}

static void test_rerecorded_events(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "re-recorded events")) {
        struct qc_stream *a = NULL, *b = NULL, *c = NULL;
        struct qc_event *ev = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &a));
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &b));
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &c));
        CHECK_OK(qc_event_create(dev, &ev));
        struct gate g1, g2;
        gate_init(&g1);
        gate_init(&g2);
        bool done = true;

        /* Capture blocked work on A. */
        CHECK_OK(qc_stream_host_func(a, gate_wait_fn, &g1));
        CHECK_OK(qc_event_record(ev, a));
        gate_wait_arrivals(&g1, 1);
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(!done, "event done while A is blocked");

        /* Re-record on idle B: the event now captures B's (empty) work only. */
        CHECK_OK(qc_event_record(ev, b));
        CHECK_OK(qc_event_synchronize(ev)); /* must not wait for A (the test would hang) */
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(done, "re-recorded event still waits for the old capture");
        /* A waiter now does not depend on A either. */
        unsigned char *h1 = host_alloc(dev, CHUNK), *h2 = host_alloc(dev, CHUNK);
        fill(h1, CHUNK, 7);
        CHECK_OK(qc_stream_wait_event(c, ev));
        CHECK_OK(qc_memcpy_async(c, h2, h1, CHUNK, QC_COPY_H2H));
        CHECK_OK(qc_stream_synchronize(c));
        T_EXPECT(check_fill(h2, CHUNK, 7) == CHUNK, "copy after a wait on the re-recorded event");

        /* The old capture on A completing late must not undo the newer, completed one. */
        gate_open(&g1);
        CHECK_OK(qc_stream_synchronize(a));
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(done, "an older capture finishing after a newer one made the event pending");

        /* Back on A behind a second gate: not done until it opens. */
        CHECK_OK(qc_stream_host_func(a, gate_wait_fn, &g2));
        CHECK_OK(qc_event_record(ev, a));
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(!done, "event done while A is blocked on the second gate");
        gate_wait_arrivals(&g2, 1);
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(!done, "event done while A is blocked on the second gate");
        gate_open(&g2);
        CHECK_OK(qc_event_synchronize(ev));
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(done, "event not done after synchronize");

        CHECK_OK(qc_device_synchronize(dev));
        qc_event_destroy(ev);
        qc_stream_destroy(c);
        qc_stream_destroy(b);
        qc_stream_destroy(a);
        gate_deinit(&g2);
        gate_deinit(&g1);
        host_free(dev, h2);
        host_free(dev, h1);
    }
}

/* Two streams hand a counter back and forth ROUNDS times, ordered only by two re-recorded
 * events: each host function checks it runs exactly at its turn. */
struct pingpong {
    int counter;
    int bad;
};

static void ping_fn(void *user)
{
    struct pingpong *p = user;
    if (p->counter % 2 != 0)
        p->bad++;
    p->counter++;
}

static void pong_fn(void *user)
{
    struct pingpong *p = user;
    if (p->counter % 2 != 1)
        p->bad++;
    p->counter++;
}

static void test_pingpong(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "ping-pong through re-recorded events")) {
        struct qc_stream *a = NULL, *b = NULL;
        struct qc_event *ea = NULL, *eb = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &a));
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COMPUTE, &b));
        CHECK_OK(qc_event_create(dev, &ea));
        CHECK_OK(qc_event_create(dev, &eb));
        struct pingpong p = {0, 0};
        for (int r = 0; r < 200; r++) {
            CHECK_OK(qc_stream_wait_event(a, eb));
            CHECK_OK(qc_stream_host_func(a, ping_fn, &p));
            CHECK_OK(qc_event_record(ea, a));
            CHECK_OK(qc_stream_wait_event(b, ea));
            CHECK_OK(qc_stream_host_func(b, pong_fn, &p));
            CHECK_OK(qc_event_record(eb, b));
        }
        CHECK_OK(qc_event_synchronize(eb));
        T_EXPECT_EQ_I64(p.counter, 400, "host functions run");
        T_EXPECT_EQ_I64(p.bad, 0, "host functions that ran out of turn");
        CHECK_OK(qc_device_synchronize(dev));
        qc_event_destroy(eb);
        qc_event_destroy(ea);
        qc_stream_destroy(b);
        qc_stream_destroy(a);
    }
}

static void test_unrecorded_event(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "a never-recorded event is done")) {
        struct qc_event *ev = NULL;
        struct qc_stream *s = NULL;
        CHECK_OK(qc_event_create(dev, &ev));
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s));
        bool done = false;
        CHECK_OK(qc_event_query(ev, &done));
        T_EXPECT(done, "a never-recorded event must query as done");
        CHECK_OK(qc_event_synchronize(ev));
        CHECK_OK(qc_stream_wait_event(s, ev));
        CHECK_OK(qc_stream_wait_event(qc_device_compute_stream(dev), ev));
        unsigned char *h1 = host_alloc(dev, CHUNK), *h2 = host_alloc(dev, CHUNK);
        fill(h1, CHUNK, 3);
        CHECK_OK(qc_memcpy_async(s, h2, h1, CHUNK, QC_COPY_H2H));
        CHECK_OK(qc_stream_synchronize(s));
        T_EXPECT(check_fill(h2, CHUNK, 3) == CHUNK, "copy after waiting on a never-recorded event");
        qc_stream_destroy(s);
        qc_event_destroy(ev);
        host_free(dev, h2);
        host_free(dev, h1);
    }
}

static void test_compute_waits_copy(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "compute stream waits for a copy-stream event")) {
        bool is_cpu = qc_device_kind_of(dev) == QC_DEVICE_CPU;
        struct qc_stream *cs = qc_device_compute_stream(dev);
        T_EXPECT_EQ_U64(qc_stream_id(cs), 0, "the compute stream's id");
        struct qc_stream *copy = NULL;
        struct qc_event *ev = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &copy));
        CHECK_OK(qc_event_create(dev, &ev));
        unsigned char *src = host_alloc(dev, CHUNK), *out = host_alloc(dev, CHUNK);
        unsigned char *d = dev_alloc(dev, CHUNK);
        fill(src, CHUNK, 99);
        struct gate g;
        gate_init(&g);
        CHECK_OK(qc_stream_host_func(copy, gate_wait_fn, &g));
        CHECK_OK(qc_memcpy_async(copy, d, src, CHUNK, QC_COPY_H2D));
        CHECK_OK(qc_event_record(ev, copy));

        /* On CPU the wait blocks this thread, so another thread opens the gate. */
        pthread_t opener;
        T_EXPECT(pthread_create(&opener, NULL, gate_open_thread, &g) == 0, "pthread_create");
        CHECK_OK(qc_stream_wait_event(cs, ev));
        if (is_cpu) {
            bool done = false;
            CHECK_OK(qc_event_query(ev, &done));
            T_EXPECT(done, "inline wait returned before the event completed");
            T_EXPECT(check_fill(d, CHUNK, 99) == CHUNK, "inline stream sees the copy's data");
        }
        CHECK_OK(qc_memcpy_async(cs, out, d, CHUNK, QC_COPY_D2H));
        CHECK_OK(qc_stream_synchronize(cs));
        T_EXPECT(check_fill(out, CHUNK, 99) == CHUNK, "compute stream read stale data");
        pthread_join(opener, NULL);

        qc_event_destroy(ev);
        qc_stream_destroy(copy);
        gate_deinit(&g);
        dev_free(dev, d);
        host_free(dev, out);
        host_free(dev, src);
    }
}

struct flag_box {
    atomic_int value;
};

static void set_flag_fn(void *user)
{
    atomic_store(&((struct flag_box *)user)->value, 1);
}

/* Work queued behind a gate, the gate opened, then the streams destroyed without a
 * synchronize: destroy must drain. The gated work is host-to-device and device-to-host copies
 * of pinned memory, which run asynchronously on every backend. (Not host-to-host copies: CUDA
 * runs those synchronously with the host, so the enqueue itself would wait for the gate that
 * only this thread opens afterwards, a deadlock.) */
static void test_destroy_drains(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "destroy drains; events may die with work pending")) {
        struct qc_stream *s = NULL, *w = NULL;
        struct qc_event *ev = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s));
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &w));
        CHECK_OK(qc_event_create(dev, &ev));
        const size_t n = (size_t)ROUNDS * CHUNK;
        unsigned char *src = host_alloc(dev, n), *dst = host_alloc(dev, n);
        unsigned char *d = dev_alloc(dev, n);
        fill(src, n, 5);
        struct gate g;
        gate_init(&g);
        struct flag_box flag;
        atomic_init(&flag.value, 0);

        CHECK_OK(qc_stream_host_func(s, gate_wait_fn, &g));
        for (int r = 0; r < ROUNDS; r++) { /* up and back, chunk by chunk, all behind the gate */
            const size_t off = (size_t)r * CHUNK;
            CHECK_OK(qc_memcpy_async(s, d + off, src + off, CHUNK, QC_COPY_H2D));
            CHECK_OK(qc_memcpy_async(s, dst + off, d + off, CHUNK, QC_COPY_D2H));
        }
        CHECK_OK(qc_event_record(ev, s));
        CHECK_OK(qc_stream_wait_event(w, ev));
        CHECK_OK(qc_stream_host_func(w, set_flag_fn, &flag));
        qc_event_destroy(ev);      /* pending record and wait still name it */
        gate_wait_arrivals(&g, 1); /* s is parked in the gate: none of the copies ran */
        size_t early = 0;
        for (size_t i = 0; i < n; i++)
            early += dst[i] != 0;
        T_EXPECT_EQ_U64(early, 0, "bytes copied before the gate opened");
        gate_open(&g);
        qc_stream_destroy(s); /* no synchronize: destroy must drain */
        T_EXPECT(check_fill(dst, n, 5) == n, "stream destroyed before its copies ran");
        qc_stream_destroy(w);
        T_EXPECT(atomic_load(&flag.value) == 1, "waiting stream destroyed before draining");
        gate_deinit(&g);
        dev_free(dev, d);
        host_free(dev, dst);
        host_free(dev, src);
    }
}

static void test_copy_args(struct qc_device *dev)
{
    QC_TEST (tname(qc_device_kind_of(dev), "copy argument errors")) {
        struct qc_stream *s = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s));
        unsigned char *h = host_alloc(dev, CHUNK);
        enum qc_status st = qc_memcpy_async(s, NULL, h, 16, QC_COPY_H2H);
        T_EXPECT(st == QC_ERR_INVALID, "NULL destination: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "destination pointer is NULL");
        st = qc_memcpy_async(s, h, NULL, 16, QC_COPY_H2H);
        T_EXPECT(st == QC_ERR_INVALID, "NULL source: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "source pointer is NULL");
        CHECK_OK(qc_memcpy_async(s, NULL, NULL, 0, QC_COPY_H2D)); /* n == 0: a no-op */
        CHECK_OK(qc_memset_async(s, NULL, 0, 0));
        st = qc_memset_async(s, NULL, 0, 8);
        T_EXPECT(st == QC_ERR_INVALID, "memset of NULL: %s", qc_status_str(st));
        st = qc_memcpy_async(s, h, h + 8, 16, (enum qc_copy_kind)17);
        T_EXPECT(st == QC_ERR_INVALID, "copy kind 17: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "copy kind 17");
        CHECK_OK(qc_stream_synchronize(s));
        qc_stream_destroy(s);
        host_free(dev, h);
    }
}

static void run_generic(struct qc_device *dev)
{
    mem_init(dev);
    test_ordering(dev);
    test_events_across_streams(dev);
    test_concurrent_copies(dev);
    test_rerecorded_events(dev);
    test_pingpong(dev);
    test_unrecorded_event(dev);
    test_compute_waits_copy(dev);
    test_destroy_drains(dev);
    test_copy_args(dev);
    mem_deinit();
}

// ---- CPU-only ---------------------------------------------------------------------------------

/* Every copy stream is its own thread: NSTREAMS host functions meet at one barrier, which
 * returns only if they all run at the same time. */
struct meet {
    pthread_barrier_t barrier;
};

static void meet_fn(void *user)
{
    pthread_barrier_wait(&((struct meet *)user)->barrier);
}

static void test_cpu_threads(void)
{
    QC_TEST ("device cpu: copy streams run concurrently, compute stream inline") {
        struct qc_device *dev = NULL;
        CHECK_OK(qc_device_create(QC_DEVICE_CPU, 0, &dev));
        struct meet m;
        pthread_barrier_init(&m.barrier, NULL, NSTREAMS);
        struct qc_stream *s[NSTREAMS];
        for (int k = 0; k < NSTREAMS; k++)
            CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s[k]));
        for (int k = 0; k < NSTREAMS; k++)
            CHECK_OK(qc_stream_host_func(s[k], meet_fn, &m)); /* hangs if streams serialise */
        CHECK_OK(qc_device_synchronize(dev));
        pthread_barrier_destroy(&m.barrier);

        /* Inline: the work is done when the call returns, in this thread. */
        struct qc_stream *cs = qc_device_compute_stream(dev);
        unsigned char a[64], b[64];
        fill(a, sizeof a, 11);
        memset(b, 0, sizeof b);
        CHECK_OK(qc_memcpy_async(cs, b, a, sizeof a, QC_COPY_D2D));
        T_EXPECT(check_fill(b, sizeof b, 11) == sizeof b, "inline copy not done on return");
        struct flag_box flag;
        atomic_init(&flag.value, 0);
        CHECK_OK(qc_stream_host_func(cs, set_flag_fn, &flag));
        T_EXPECT(atomic_load(&flag.value) == 1, "inline host function not run on return");
        CHECK_OK(qc_memset_async(cs, b, 0x5A, sizeof b));
        T_EXPECT(b[0] == 0x5A && b[63] == 0x5A, "inline memset not done on return");
        T_EXPECT(qc_stream_native(cs) == NULL, "CPU streams have no native handle");
        T_EXPECT(qc_stream_device(cs) == dev, "compute stream's device");

        for (int k = 0; k < NSTREAMS; k++)
            qc_stream_destroy(s[k]);
        qc_device_destroy(dev);
    }
}

struct event_maker {
    struct gate *gate;
    struct qc_device *dev;
    enum qc_status st;
};

static void make_event_fn(void *user)
{
    struct event_maker *m = user;
    gate_wait_fn(m->gate);
    struct qc_event *ev = NULL;
    m->st = qc_event_create(m->dev, &ev);
    qc_event_destroy(ev);
}

static void test_cpu_sync_vs_host_func(void)
{
    QC_TEST ("device cpu: host functions may create events during device synchronize") {
        struct qc_device *dev = NULL;
        CHECK_OK(qc_device_create(QC_DEVICE_CPU, 0, &dev));
        for (int round = 0; round < 20; round++) {
            struct qc_stream *s = NULL;
            CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s));
            struct gate g;
            gate_init(&g);
            struct event_maker m = {&g, dev, QC_ERR_INVALID};
            CHECK_OK(qc_stream_host_func(s, make_event_fn, &m));
            pthread_t opener;
            T_EXPECT(pthread_create(&opener, NULL, gate_open_thread, &g) == 0, "pthread_create");
            /* Usually the gate opens while we wait here: the host function then takes the
             * device lock to count its event, which must not deadlock against us. */
            CHECK_OK(qc_device_synchronize(dev));
            pthread_join(opener, NULL);
            T_EXPECT(m.st == QC_OK, "event create in a host function: %s", qc_status_str(m.st));
            qc_stream_destroy(s);
            gate_deinit(&g);
        }
        qc_device_destroy(dev);
    }
}

static void test_cpu_sticky_error(void)
{
    QC_TEST ("device cpu: a worker's first error is sticky") {
        struct qc_device *dev = NULL;
        CHECK_OK(qc_device_create(QC_DEVICE_CPU, 0, &dev));
        struct qc_stream *s = NULL, *ok = NULL;
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &s));
        CHECK_OK(qc_stream_create(dev, QC_STREAM_COPY, &ok));
        unsigned char a[256], b[256];
        fill(a, sizeof a, 1);
        memset(b, 0, sizeof b);
        CHECK_OK(device_cpu_inject_error(s, QC_ERR_IO, "simulated copy failure"));
        CHECK_OK(device_cpu_inject_error(s, QC_ERR_NOMEM, "second failure"));
        CHECK_OK(qc_memcpy_async(s, b, a, sizeof a, QC_COPY_H2H)); /* still runs */
        enum qc_status st = qc_stream_synchronize(s);
        T_EXPECT(st == QC_ERR_IO, "synchronize returned %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "simulated copy failure");
        T_EXPECT(check_fill(b, sizeof b, 1) == sizeof b, "work after the failure did not run");
        st = qc_stream_synchronize(s);
        T_EXPECT(st == QC_ERR_IO, "second synchronize returned %s", qc_status_str(st));
        st = qc_device_synchronize(dev);
        T_EXPECT(st == QC_ERR_IO, "device synchronize returned %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "simulated copy failure");
        CHECK_OK(qc_stream_synchronize(ok)); /* other streams are unaffected */

        struct qc_stream *cs = qc_device_compute_stream(dev);
        st = device_cpu_inject_error(cs, QC_ERR_IO, "inline failure");
        T_EXPECT(st == QC_ERR_IO, "inline fault returned %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "inline failure");

        qc_stream_destroy(ok);
        qc_stream_destroy(s);
        qc_device_destroy(dev);
    }
}

static void test_error_paths(void)
{
    QC_TEST ("device: kind strings") {
        enum qc_device_kind k = QC_DEVICE_KIND_COUNT;
        CHECK_OK(qc_device_kind_parse("cpu", &k));
        T_EXPECT(k == QC_DEVICE_CPU, "cpu parsed as %d", (int)k);
        CHECK_OK(qc_device_kind_parse("cuda", &k));
        T_EXPECT(k == QC_DEVICE_CUDA, "cuda parsed as %d", (int)k);
        T_EXPECT(strcmp(qc_device_kind_str(QC_DEVICE_CPU), "cpu") == 0, "cpu name");
        T_EXPECT(strcmp(qc_device_kind_str(QC_DEVICE_CUDA), "cuda") == 0, "cuda name");
        k = QC_DEVICE_CUDA;
        enum qc_status st = qc_device_kind_parse("tpu", &k);
        T_EXPECT(st == QC_ERR_INVALID, "tpu -> %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "'tpu' is not one of cpu, cuda");
        T_EXPECT(k == QC_DEVICE_CUDA, "out written on failure");
        st = qc_device_kind_parse("CPU ", &k);
        T_EXPECT(st == QC_ERR_INVALID, "'CPU ' -> %s", qc_status_str(st));
        st = qc_device_kind_parse("", &k);
        T_EXPECT(st == QC_ERR_INVALID, "'' -> %s", qc_status_str(st));
    }
    QC_TEST ("device: CUDA unavailable is UNSUPPORTED with a hint") {
        struct qc_device *dev = NULL;
        enum qc_status st = qc_device_create(QC_DEVICE_CUDA, 0, &dev);
        int n = qc_device_cuda_count();
#ifndef QC_HAVE_CUDA
        T_EXPECT_EQ_I64(n, 0, "CUDA devices in a CPU-only build");
        T_EXPECT(st == QC_ERR_UNSUPPORTED, "got %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "built without CUDA");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "hint: rebuild with -DQC_CUDA=ON");
        T_EXPECT(dev == NULL, "out written on failure");
#else
        if (n == 0) {
            T_EXPECT(st == QC_ERR_UNSUPPORTED, "got %s", qc_status_str(st));
            T_EXPECT_STR_CONTAINS(qc_error_last(), "CUDA device");
            T_EXPECT_STR_CONTAINS(qc_error_last(), "hint:");
            T_EXPECT(dev == NULL, "out written on failure");
        } else {
            T_EXPECT(st == QC_OK, "with %d GPU(s): %s", n, qc_error_last());
            qc_device_destroy(dev);
            dev = NULL;
            st = qc_device_create(QC_DEVICE_CUDA, n, &dev);
            T_EXPECT(st == QC_ERR_INVALID, "ordinal %d of %d: %s", n, n, qc_status_str(st));
            T_EXPECT_STR_CONTAINS(qc_error_last(), "out of range");
        }
#endif
    }
    QC_TEST ("device: bad ordinal and kind") {
        struct qc_device *dev = NULL;
        enum qc_status st = qc_device_create(QC_DEVICE_CPU, -1, &dev);
        T_EXPECT(st == QC_ERR_INVALID, "ordinal -1: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "ordinal must be >= 0");
        st = qc_device_create(QC_DEVICE_KIND_COUNT, 0, &dev);
        T_EXPECT(st == QC_ERR_INVALID, "kind %d: %s", (int)QC_DEVICE_KIND_COUNT, qc_status_str(st));
        T_EXPECT(dev == NULL, "out written on failure");
        qc_device_destroy(NULL); /* a no-op */
        qc_stream_destroy(NULL);
        qc_event_destroy(NULL);
    }
    QC_TEST ("device cpu: overlapping copy is rejected") {
        struct qc_device *dev = NULL;
        CHECK_OK(qc_device_create(QC_DEVICE_CPU, 0, &dev));
        unsigned char buf[128];
        enum qc_status st =
            qc_memcpy_async(qc_device_compute_stream(dev), buf + 8, buf, 64, QC_COPY_D2D);
        T_EXPECT(st == QC_ERR_INVALID, "overlap: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "overlap");
        CHECK_OK(qc_memcpy_async(qc_device_compute_stream(dev), buf + 64, buf, 64, QC_COPY_D2D));
        qc_device_destroy(dev);
    }
}

/* tests/cuda_probe.h: a GPU test skips only where there is no GPU to test. */
static void test_cuda_verdict(void)
{
    QC_TEST ("device: GPU tests skip without a GPU and fail on a GPU that does not work") {
        static const struct {
            int err, count;
            bool driver;
            enum qc_test_cuda_outcome want;
        } cases[] = {
            {QC_TEST_CUDA_NOT_BUILT, 0, false, QC_TEST_CUDA_SKIP},            /* CPU-only build */
            {QC_TEST_CUDA_SUCCESS, 1, true, QC_TEST_CUDA_RUN},                /* one GPU */
            {QC_TEST_CUDA_SUCCESS, 8, true, QC_TEST_CUDA_RUN},                /* eight */
            {QC_TEST_CUDA_SUCCESS, 0, true, QC_TEST_CUDA_SKIP},               /* none visible */
            {QC_TEST_CUDA_ERR_NO_DEVICE, 0, true, QC_TEST_CUDA_SKIP},         /* driver, no GPU */
            {QC_TEST_CUDA_ERR_INSUFFICIENT_DRV, 0, false, QC_TEST_CUDA_SKIP}, /* no driver */
            {QC_TEST_CUDA_ERR_STUB_LIBRARY, 0, false, QC_TEST_CUDA_SKIP},     /* stub libcuda */
            {QC_TEST_CUDA_ERR_INSUFFICIENT_DRV, 0, true, QC_TEST_CUDA_FAIL},  /* driver too old */
            {3, 0, true, QC_TEST_CUDA_FAIL},   /* cudaErrorInitializationError */
            {46, 0, true, QC_TEST_CUDA_FAIL},  /* cudaErrorDevicesUnavailable (exclusive mode) */
            {999, 0, true, QC_TEST_CUDA_FAIL}, /* cudaErrorUnknown */
            {803, 0, true, QC_TEST_CUDA_FAIL}, /* cudaErrorSystemDriverMismatch */
            {2, 1, true, QC_TEST_CUDA_FAIL},   /* cudaErrorMemoryAllocation, count ignored */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const char *why = NULL;
            const enum qc_test_cuda_outcome o =
                qc_test_cuda_verdict(cases[i].err, cases[i].count, cases[i].driver, &why);
            T_EXPECT(o == cases[i].want, "error %d, %d device(s), driver %d: %d, want %d (%s)",
                     cases[i].err, cases[i].count, (int)cases[i].driver, (int)o, (int)cases[i].want,
                     why ? why : "no reason");
            T_EXPECT(why && why[0], "error %d: no reason given", cases[i].err);
        }
        /* this machine: whatever it is, the probe and the device layer agree */
        int count = -1;
        const int err = qc_device_cuda_probe(&count);
        T_EXPECT_EQ_I64(count, qc_device_cuda_count(), "probe and count (error %d)", err);
#ifndef QC_HAVE_CUDA
        T_EXPECT_EQ_I64(err, QC_TEST_CUDA_NOT_BUILT, "a CPU-only build reports not built");
#endif
    }
}

static void test_cpu_props(void)
{
    QC_TEST ("device cpu: properties") {
        struct qc_device *dev = NULL;
        CHECK_OK(qc_device_create(QC_DEVICE_CPU, 0, &dev));
        struct qc_device_props p;
        memset(&p, 0xFF, sizeof p);
        CHECK_OK(qc_device_props_get(dev, &p));
        T_EXPECT(p.kind == QC_DEVICE_CPU, "kind %d", (int)p.kind);
        T_EXPECT(strncmp(p.name, "cpu (", 5) == 0, "name '%s'", p.name);
        T_EXPECT(strstr(p.name, "thread") != NULL, "name '%s' lacks the thread count", p.name);
        T_EXPECT(p.total_bytes > 0, "total %zu", p.total_bytes);
        T_EXPECT(p.free_bytes > 0 && p.free_bytes <= p.total_bytes, "free %zu of %zu", p.free_bytes,
                 p.total_bytes);
        T_EXPECT_EQ_I64(p.multiprocessors, sysconf(_SC_NPROCESSORS_ONLN), "online CPUs");
        T_EXPECT(p.cc_major == 0 && p.cc_minor == 0, "cc %d.%d", p.cc_major, p.cc_minor);
        T_EXPECT(qc_device_kind_of(dev) == QC_DEVICE_CPU, "kind_of");
        printf("  %s, %zu MiB total, %zu MiB free\n", p.name, p.total_bytes >> 20,
               p.free_bytes >> 20);
        qc_device_destroy(dev);
    }
    QC_TEST ("device cpu: stream ids are process-unique") {
        struct qc_device *d1 = NULL, *d2 = NULL;
        CHECK_OK(qc_device_create(QC_DEVICE_CPU, 0, &d1));
        CHECK_OK(qc_device_create(QC_DEVICE_CPU, 1, &d2));
        struct qc_stream *a = NULL, *b = NULL;
        CHECK_OK(qc_stream_create(d1, QC_STREAM_COPY, &a));
        CHECK_OK(qc_stream_create(d2, QC_STREAM_COMPUTE, &b));
        T_EXPECT(qc_stream_id(a) != qc_stream_id(b) && qc_stream_id(a) && qc_stream_id(b),
                 "ids %u and %u", qc_stream_id(a), qc_stream_id(b));
        T_EXPECT(qc_stream_id(qc_device_compute_stream(d2)) == 0, "compute stream id");
        qc_stream_destroy(b);
        qc_stream_destroy(a);
        qc_device_destroy(d2);
        qc_device_destroy(d1);
    }
}

int main(int argc, char **argv)
{
    bool cuda = argc > 1 && strcmp(argv[1], "--cuda") == 0;
    if (cuda) {
        const int probe = qc_test_cuda_probe(); /* skip only without a GPU */
        if (probe != 0)
            return probe;
        struct qc_device *dev = NULL;
        if (qc_device_create(QC_DEVICE_CUDA, 0, &dev) != QC_OK)
            T_FATAL("qc_device_create(cuda): %s", qc_error_last());
        struct qc_device_props p;
        if (qc_device_props_get(dev, &p) == QC_OK)
            printf("  %s, cc %d.%d, %d SMs, %zu MiB\n", p.name, p.cc_major, p.cc_minor,
                   p.multiprocessors, p.total_bytes >> 20);
        run_generic(dev);
        qc_device_destroy(dev);
        return qc_test_summary();
    }

    struct qc_device *dev = NULL;
    if (qc_device_create(QC_DEVICE_CPU, 0, &dev) != QC_OK)
        T_FATAL("qc_device_create(cpu): %s", qc_error_last());
    run_generic(dev);
    qc_device_destroy(dev);
    test_cpu_threads();
    test_cpu_sync_vs_host_func();
    test_cpu_sticky_error();
    test_error_paths();
    test_cuda_verdict();
    test_cpu_props();
    return qc_test_summary();
}
