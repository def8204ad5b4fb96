/*
 * test_offload.c — the offload engine's API: parameter checks, the host tier, auto placement,
 * every rung of the fallback ladder (forced, and reached by simulated io_uring / O_DIRECT /
 * fallocate failures), prefetch ordering and window, stall counting, and concurrent use.
 * The byte-exact I/O matrix is test_offload_nvme.c; faults are test_offload_faults.c; spill-file
 * removal is test_offload_spill.c.
 */
#include <errno.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "test_offload_common.h"

static struct qc_device *dev;

/* Creates an engine forced onto rung; *skip set (with the reason printed) when this machine
 * cannot do an io_uring rung. */
static struct qc_offload *make_rung(enum qc_offload_rung rung, int qd, bool *skip)
{
    struct qc_offload_params p;
    ot_params(&p, rung, qd, true);
    p.host_capacity = rung == QC_OFFLOAD_RUNG_HOST_ONLY ? 64 * OT_MIB : 0;
    struct qc_offload *o = NULL;
    enum qc_status st = qc_offload_create(dev, &p, &o);
    *skip = false;
    if (st == QC_ERR_UNSUPPORTED &&
        (rung == QC_OFFLOAD_RUNG_URING_DIRECT || rung == QC_OFFLOAD_RUNG_URING_BUFFERED)) {
        *skip = true;
        char why[600];
        snprintf(why, sizeof why, "rung %s unavailable here: %s", qc_offload_rung_str(rung),
                 qc_error_last());
        OT_URING_UNAVAILABLE(rung, why);
        return NULL;
    }
    T_EXPECT(st == QC_OK, "create on rung %s: %s", qc_offload_rung_str(rung), qc_error_last());
    return o;
}

static void test_params(void)
{
    QC_TEST ("offload: parameters are checked") {
        struct qc_offload_params p;
        struct qc_offload *o = NULL;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, false);
        p.block_size = 1000;
        T_EXPECT(qc_offload_create(dev, &p, &o) == QC_ERR_INVALID, "unaligned block accepted");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "block_size");
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, false);
        p.max_inflight = p.block_size;
        T_EXPECT(qc_offload_create(dev, &p, &o) == QC_ERR_INVALID, "1-slot ring accepted");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "max_inflight");
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 0, false);
        T_EXPECT(qc_offload_create(dev, &p, &o) == QC_ERR_INVALID, "queue depth 0 accepted");
        ot_params(&p, QC_OFFLOAD_RUNG_THREADS, 4, false);
        p.nvme_dir = NULL;
        p.host_capacity = OT_MIB;
        T_EXPECT(qc_offload_create(dev, &p, &o) == QC_ERR_INVALID,
                 "forced NVMe rung without a directory accepted");
        T_EXPECT(o == NULL, "out-param written on failure");
    }
}

static void test_host_tier(void)
{
    QC_TEST ("offload: host tier round trips, capacity and accounting") {
        struct qc_offload_params p;
        qc_offload_params_default(&p);
        p.host_capacity = 1 * OT_MIB;
        struct qc_offload *o = NULL;
        ot_log_start();
        enum qc_status st = qc_offload_create(dev, &p, &o);
        const char *log = ot_log_stop();
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        T_EXPECT(qc_offload_rung_active(o) == QC_OFFLOAD_RUNG_HOST_ONLY, "rung %s",
                 qc_offload_rung_str(qc_offload_rung_active(o)));
        T_EXPECT_STR_CONTAINS(log, "offload: rung: host tier only");
        T_EXPECT_STR_CONTAINS(log, "no offload.nvme_dir");
        size_t sizes[] = {0, 1, 4097, 300 * OT_KIB};
        for (size_t i = 0; i < 4; i++) {
            size_t diff = 0;
            st = ot_roundtrip(o, dev, sizes[i], QC_OFFLOAD_PLACE_HOST, 11 + i, false, &diff);
            T_EXPECT(st == QC_OK, "size %zu: %s", sizes[i], qc_error_last());
            T_EXPECT_EQ_U64(diff, sizes[i], "size %zu differs at %zu", sizes[i], diff);
        }
        struct qc_stream *cs = qc_device_compute_stream(dev);
        unsigned char *buf = calloc(1, OT_MIB);
        uint64_t h1 = 0, h2 = 0, h3 = 0;
        T_EXPECT(qc_offload_put(o, buf, 600 * OT_KIB, cs, QC_OFFLOAD_PLACE_HOST, "a", &h1) == QC_OK,
                 "%s", qc_error_last());
        st = qc_offload_put(o, buf, 600 * OT_KIB, cs, QC_OFFLOAD_PLACE_AUTO, "too-big", &h2);
        T_EXPECT(st == QC_ERR_NOMEM, "over capacity: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "host tier full");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "too-big");
        T_EXPECT(h2 == 0, "handle written on failure");
        st = qc_offload_put(o, buf, 10, cs, QC_OFFLOAD_PLACE_NVME, "nvme", &h3);
        T_EXPECT(st == QC_ERR_UNSUPPORTED, "NVMe put without NVMe tier: %s", qc_status_str(st));
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.bytes_host_used, 600 * OT_KIB, "host bytes in use");
        T_EXPECT(s.bytes_host_peak >= 600 * OT_KIB, "peak %llu",
                 (unsigned long long)s.bytes_host_peak);
        T_EXPECT(qc_offload_release(o, h1) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_offload_release(o, h1) == QC_ERR_INVALID, "double release accepted");
        T_EXPECT(qc_offload_get(o, h1, buf, cs) == QC_ERR_INVALID, "get after release");
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.bytes_host_used, 0, "host bytes after release");
        free(buf);
        qc_offload_destroy(o);
    }
}

static void test_put_done_and_streams(void)
{
    QC_TEST ("offload: put_done orders source reuse; get on a worker stream") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.host_capacity = 4 * OT_MIB;
        struct qc_offload *o = NULL;
        if (qc_offload_create(dev, &p, &o) != QC_OK) {
            T_EXPECT(false, "create: %s", qc_error_last());
            continue; /* ends the QC_TEST */
        }
        struct qc_stream *cs = qc_device_compute_stream(dev), *ws = NULL;
        T_EXPECT(qc_stream_create(dev, QC_STREAM_COMPUTE, &ws) == QC_OK, "%s", qc_error_last());
        size_t n = 2 * OT_MIB + 333;
        unsigned char *src = malloc(n), *ref = malloc(n), *dst = malloc(n);
        enum qc_offload_place places[] = {QC_OFFLOAD_PLACE_HOST, QC_OFFLOAD_PLACE_NVME};
        for (int k = 0; k < 2; k++) {
            ot_fill(src, n, 77 + (uint64_t)k);
            memcpy(ref, src, n);
            uint64_t h = 0;
            /* put from the worker stream, reuse the source once put_done says so */
            T_EXPECT(qc_offload_put(o, src, n, ws, places[k], "reuse", &h) == QC_OK, "%s",
                     qc_error_last());
            T_EXPECT(qc_offload_put_done(o, h, cs) == QC_OK, "%s", qc_error_last());
            memset(src, 0, n);
            memset(dst, 0x11, n);
            T_EXPECT(qc_offload_get(o, h, dst, ws) == QC_OK, "%s", qc_error_last());
            T_EXPECT(qc_stream_synchronize(ws) == QC_OK, "%s", qc_error_last());
            size_t d = ot_first_diff(ref, dst, n);
            T_EXPECT_EQ_U64(d, n, "place %d: differs at %zu", k, d);
            /* a second get of the same handle gives the same bytes */
            memset(dst, 0x22, n);
            T_EXPECT(qc_offload_get(o, h, dst, cs) == QC_OK, "%s", qc_error_last());
            d = ot_first_diff(ref, dst, n);
            T_EXPECT_EQ_U64(d, n, "place %d, second get: differs at %zu", k, d);
            size_t sz = 0;
            enum qc_offload_place where = QC_OFFLOAD_PLACE_AUTO;
            T_EXPECT(qc_offload_handle_info(o, h, &sz, &where) == QC_OK, "%s", qc_error_last());
            T_EXPECT(sz == n && where == places[k], "info %zu %d", sz, (int)where);
            T_EXPECT(qc_offload_release(o, h) == QC_OK, "%s", qc_error_last());
        }
        free(src);
        free(ref);
        free(dst);
        qc_stream_destroy(ws);
        qc_offload_destroy(o);
    }
}

static void test_auto_placement(void)
{
    QC_TEST ("offload: auto placement fills the host tier, then spills to NVMe") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 8, true);
        p.host_capacity = 256 * OT_KIB;
        struct qc_offload *o = NULL;
        if (qc_offload_create(dev, &p, &o) != QC_OK) {
            T_EXPECT(false, "create: %s", qc_error_last());
            continue; /* ends the QC_TEST */
        }
        struct qc_stream *cs = qc_device_compute_stream(dev);
        enum { N = 6 };
        size_t n = 100 * OT_KIB;
        unsigned char *src[N], *dst = malloc(n);
        uint64_t h[N];
        for (int i = 0; i < N; i++) {
            src[i] = malloc(n);
            ot_fill(src[i], n, 1000 + (uint64_t)i);
            T_EXPECT(qc_offload_put(o, src[i], n, cs, QC_OFFLOAD_PLACE_AUTO, "auto", &h[i]) ==
                         QC_OK,
                     "%s", qc_error_last());
        }
        int host = 0, nvme = 0;
        for (int i = 0; i < N; i++) {
            enum qc_offload_place where;
            qc_offload_handle_info(o, h[i], NULL, &where);
            host += where == QC_OFFLOAD_PLACE_HOST;
            nvme += where == QC_OFFLOAD_PLACE_NVME;
            T_EXPECT(where == (i < 2 ? QC_OFFLOAD_PLACE_HOST : QC_OFFLOAD_PLACE_NVME),
                     "tensor %d placed %d", i, (int)where);
        }
        T_EXPECT(host == 2 && nvme == 4, "host %d nvme %d", host, nvme);
        for (int i = N; i-- > 0;) {
            memset(dst, 0, n);
            T_EXPECT(qc_offload_get(o, h[i], dst, cs) == QC_OK, "%s", qc_error_last());
            T_EXPECT(memcmp(dst, src[i], n) == 0, "tensor %d differs", i);
            qc_offload_release(o, h[i]);
            free(src[i]);
        }
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.puts_host, 2, "host puts");
        T_EXPECT_EQ_U64(s.puts_nvme, 4, "nvme puts");
        T_EXPECT_EQ_U64(s.bytes_nvme_used, 0, "spill bytes after release");
        T_EXPECT(s.bytes_nvme_peak >= 4 * offload_test_round4k(n), "nvme peak %llu",
                 (unsigned long long)s.bytes_nvme_peak);
        T_EXPECT(s.bytes_written == 4 * n && s.bytes_read == 4 * n, "written %llu read %llu",
                 (unsigned long long)s.bytes_written, (unsigned long long)s.bytes_read);
        free(dst);
        qc_offload_destroy(o);
    }
}

// ---- the ladder ----------------------------------------------------------------------------

static void check_rung_roundtrip(struct qc_offload *o, const char *what)
{
    size_t sizes[] = {1, 3 * OT_MIB + 5};
    for (int i = 0; i < 2; i++) {
        size_t diff = 0;
        enum qc_status st =
            ot_roundtrip(o, dev, sizes[i], QC_OFFLOAD_PLACE_AUTO, 5 + (uint64_t)i, false, &diff);
        T_EXPECT(st == QC_OK, "%s: size %zu: %s", what, sizes[i], qc_error_last());
        T_EXPECT_EQ_U64(diff, sizes[i], "%s: size %zu differs at %zu", what, sizes[i], diff);
    }
}

static void test_ladder_forced(enum qc_offload_rung rung)
{
    char name[96];
    snprintf(name, sizeof name, "offload: ladder: forced rung %s", qc_offload_rung_str(rung));
    QC_TEST (name) {
        bool skip;
        ot_log_start();
        struct qc_offload *o = make_rung(rung, 4, &skip);
        const char *log = ot_log_stop();
        if (!o)
            continue; /* ends the QC_TEST */
        T_EXPECT(qc_offload_rung_active(o) == rung, "active %s",
                 qc_offload_rung_str(qc_offload_rung_active(o)));
        char want[96];
        snprintf(want, sizeof want, "offload: rung: %s", qc_offload_rung_str(rung));
        T_EXPECT_STR_CONTAINS(log, want);
        if (rung != QC_OFFLOAD_RUNG_HOST_ONLY)
            T_EXPECT_STR_CONTAINS(log, "offload: probe:");
        check_rung_roundtrip(o, qc_offload_rung_str(rung));
        qc_offload_destroy(o);
    }
}

static void test_ladder_simulated(void)
{
    int uring_errnos[] = {EPERM, ENOSYS};
    for (int k = 0; k < 2; k++) {
        char name[96];
        snprintf(name, sizeof name, "offload: ladder: io_uring blocked (%s) -> thread pool",
                 k == 0 ? "EPERM" : "ENOSYS");
        QC_TEST (name) {
            struct qc_offload_params p;
            ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
            p.sim_uring_errno = uring_errnos[k];
            struct qc_offload *o = NULL;
            ot_log_start();
            enum qc_status st = qc_offload_create(dev, &p, &o);
            const char *log = ot_log_stop();
            T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
            if (st != QC_OK)
                continue; /* ends the QC_TEST */
            T_EXPECT(qc_offload_rung_active(o) == QC_OFFLOAD_RUNG_THREADS, "active %s",
                     qc_offload_rung_str(qc_offload_rung_active(o)));
            T_EXPECT_STR_CONTAINS(log, "offload: rung: thread pool");
            T_EXPECT_STR_CONTAINS(log, strerror(uring_errnos[k]));
            check_rung_roundtrip(o, "threads after blocked io_uring");
            qc_offload_destroy(o);
            /* forcing the blocked rung is an error that says why */
            p.force_rung = QC_OFFLOAD_RUNG_URING_BUFFERED;
            o = NULL;
            st = qc_offload_create(dev, &p, &o);
            T_EXPECT(st == QC_ERR_UNSUPPORTED, "forced blocked io_uring: %s", qc_status_str(st));
            T_EXPECT_STR_CONTAINS(qc_error_last(), "io_uring_queue_init");
        }
    }

    QC_TEST ("offload: ladder: no O_DIRECT (EINVAL, as tmpfs) -> buffered") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.sim_direct_errno = EINVAL;
        struct qc_offload *o = NULL;
        ot_log_start();
        enum qc_status st = qc_offload_create(dev, &p, &o);
        const char *log = ot_log_stop();
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        enum qc_offload_rung r = qc_offload_rung_active(o);
        T_EXPECT(r == QC_OFFLOAD_RUNG_URING_BUFFERED || r == QC_OFFLOAD_RUNG_THREADS, "active %s",
                 qc_offload_rung_str(r));
        T_EXPECT_STR_CONTAINS(log, "O_DIRECT no (open(O_DIRECT)");
        check_rung_roundtrip(o, "buffered after O_DIRECT refused");
        qc_offload_destroy(o);
        p.force_rung = QC_OFFLOAD_RUNG_URING_DIRECT;
        st = qc_offload_create(dev, &p, &o);
        T_EXPECT(st == QC_ERR_UNSUPPORTED, "forced O_DIRECT rung: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "O_DIRECT");
    }

    QC_TEST ("offload: ladder: io_uring blocked and no O_DIRECT -> thread pool, buffered") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 2, true);
        p.sim_direct_errno = EINVAL;
        p.sim_uring_errno = EPERM;
        struct qc_offload *o = NULL;
        enum qc_status st = qc_offload_create(dev, &p, &o);
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        T_EXPECT(qc_offload_rung_active(o) == QC_OFFLOAD_RUNG_THREADS, "active %s",
                 qc_offload_rung_str(qc_offload_rung_active(o)));
        check_rung_roundtrip(o, "threads, buffered");
        qc_offload_destroy(o);
    }

    QC_TEST ("offload: ladder: unusable spill directory -> host tier only, or an error") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        char bad[PATH_MAX + 16];
        snprintf(bad, sizeof bad, "%s/does-not-exist", ot_dir);
        p.nvme_dir = bad;
        p.host_capacity = 8 * OT_MIB;
        struct qc_offload *o = NULL;
        ot_log_start();
        enum qc_status st = qc_offload_create(dev, &p, &o);
        const char *log = ot_log_stop();
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        T_EXPECT(qc_offload_rung_active(o) == QC_OFFLOAD_RUNG_HOST_ONLY, "active %s",
                 qc_offload_rung_str(qc_offload_rung_active(o)));
        T_EXPECT_STR_CONTAINS(log, "does-not-exist");
        T_EXPECT_STR_CONTAINS(log, "offload: rung: host tier only");
        check_rung_roundtrip(o, "host only after a bad directory");
        qc_offload_destroy(o);
        p.host_capacity = 0;
        o = NULL;
        st = qc_offload_create(dev, &p, &o);
        T_EXPECT(st == QC_ERR_UNSUPPORTED, "no tier at all: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "no tier");
        T_EXPECT(o == NULL, "engine returned on failure");
    }

    QC_TEST ("offload: ladder: real tmpfs (/dev/shm)") {
        struct statfs sfs;
        if (statfs("/dev/shm", &sfs) != 0 || sfs.f_type != 0x01021994) {
            T_SKIP("/dev/shm is not a tmpfs here");
            continue; /* ends the QC_TEST */
        }
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.nvme_dir = "/dev/shm";
        p.nvme_capacity = 16 * OT_MIB;
        struct qc_offload *o = NULL;
        ot_log_start();
        enum qc_status st = qc_offload_create(dev, &p, &o);
        const char *log = ot_log_stop();
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        /* tmpfs takes O_DIRECT since Linux 6.6; before that the ladder must step down */
        T_EXPECT_STR_CONTAINS(log, "spill file on tmpfs");
        printf("  tmpfs rung: %s\n", qc_offload_rung_str(qc_offload_rung_active(o)));
        check_rung_roundtrip(o, "tmpfs");
        qc_offload_destroy(o);
    }

    QC_TEST ("offload: spill file allocation falls back to ftruncate + writes, growth too") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.sim_fallocate_errno = EOPNOTSUPP;
        p.spill_visible = true;
        p.nvme_initial = 8 * OT_MIB + 100; /* rounded up to 4 KiB */
        p.nvme_grow_step = OT_MIB;
        struct qc_offload *o = NULL;
        ot_log_start();
        enum qc_status st = qc_offload_create(dev, &p, &o);
        const char *log = ot_log_stop();
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        T_EXPECT_STR_CONTAINS(log, "8.0 MiB allocated by ftruncate+writes");
        struct stat sb;
        T_EXPECT(stat(qc_offload_spill_path(o), &sb) == 0, "visible spill file %s: %s",
                 qc_offload_spill_path(o), strerror(errno));
        T_EXPECT_EQ_U64(sb.st_size, 8 * OT_MIB + 4096, "spill file size");
        T_EXPECT((uint64_t)sb.st_blocks * 512 >= 8 * OT_MIB + 4096,
                 "spill file not allocated: %llu blocks", (unsigned long long)sb.st_blocks);
        check_rung_roundtrip(o, "after ftruncate+writes");
        /* 10 MiB on NVMe: the free 8 MiB + 4 KiB count, the file grows by writes to 10 MiB */
        size_t diff = 0;
        T_EXPECT(ot_roundtrip(o, dev, 10 * OT_MIB, QC_OFFLOAD_PLACE_NVME, 77, true, &diff) ==
                         QC_OK &&
                     diff == 10 * OT_MIB,
                 "10 MiB round trip after growth by writes: %s (first difference at %zu)",
                 qc_error_last(), diff);
        T_EXPECT(stat(qc_offload_spill_path(o), &sb) == 0, "stat: %s", strerror(errno));
        T_EXPECT_EQ_U64(sb.st_size, 10 * OT_MIB, "spill file size after growth by writes");
        T_EXPECT((uint64_t)sb.st_blocks * 512 >= 10 * OT_MIB,
                 "grown spill file not allocated: %llu blocks", (unsigned long long)sb.st_blocks);
        qc_offload_destroy(o);
    }
}

/* Bytes the visible spill file of o holds (st_size), or 0 when stat fails. */
static uint64_t spill_size(struct qc_offload *o)
{
    struct stat sb;
    if (stat(qc_offload_spill_path(o), &sb) != 0)
        return 0;
    return (uint64_t)sb.st_size;
}

/* A put of n seeded bytes on NVMe; the source in *src (freed by the caller). */
static enum qc_status put_nvme(struct qc_offload *o, size_t n, uint64_t seed, unsigned char **src,
                               uint64_t *h)
{
    *src = malloc(n);
    ot_fill(*src, n, seed);
    enum qc_status st =
        qc_offload_put(o, *src, n, qc_device_compute_stream(dev), QC_OFFLOAD_PLACE_NVME, "grow", h);
    if (st == QC_OK)
        st = qc_offload_quiesce(o);
    return st;
}

/* Whether handle h reads back as src (n bytes). */
static bool reads_back(struct qc_offload *o, uint64_t h, const unsigned char *src, size_t n)
{
    unsigned char *dst = malloc(n);
    memset(dst, 0x5a, n);
    struct qc_stream *cs = qc_device_compute_stream(dev);
    bool ok = qc_offload_get(o, h, dst, cs) == QC_OK && qc_stream_synchronize(cs) == QC_OK &&
              memcmp(dst, src, n) == 0;
    free(dst);
    return ok;
}

static void test_spill_size(void)
{
    QC_TEST ("offload: the spill file takes what is spilled (grown in steps), not its capacity") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.spill_visible = true;
        p.nvme_capacity = 256 * OT_MIB;
        p.nvme_grow_step = OT_MIB;
        struct qc_offload *o = NULL;
        ot_log_start();
        enum qc_status st = qc_offload_create(dev, &p, &o);
        const char *log = ot_log_stop();
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        T_EXPECT_STR_CONTAINS(log, "growing in 1 MiB steps up to 256 MiB as needed");
        T_EXPECT_STR_CONTAINS(log, "4 KiB allocated by fallocate");
        T_EXPECT_EQ_U64(spill_size(o), 4096, "spill file size at create (no put yet)");
        /* X = 3 MiB + 100 bytes spilled: the file holds X rounded up to the step, 4 MiB */
        unsigned char *a = NULL, *b = NULL, *c = NULL;
        uint64_t ha = 0, hb = 0, hc = 0;
        const size_t na = 3 * OT_MIB + 100, nb = 2 * OT_MIB, nc = 3 * OT_MIB;
        T_EXPECT(put_nvme(o, na, 1, &a, &ha) == QC_OK, "put a: %s", qc_error_last());
        T_EXPECT_EQ_U64(spill_size(o), 4 * OT_MIB, "after 3 MiB + 100 bytes spilled");
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.bytes_nvme_file, 4 * OT_MIB, "stats.bytes_nvme_file");
        T_EXPECT_EQ_U64(s.nvme_grows, 1, "growths");
        /* 2 MiB more: the free tail (1 MiB - 4 KiB) is used and the file grows to 6 MiB */
        T_EXPECT(put_nvme(o, nb, 2, &b, &hb) == QC_OK, "put b: %s", qc_error_last());
        T_EXPECT_EQ_U64(spill_size(o), 6 * OT_MIB, "after a growth");
        T_EXPECT(reads_back(o, ha, a, na) && reads_back(o, hb, b, nb),
                 "data across the growth does not read back: %s", qc_error_last());
        /* a freed extent is reused: no growth */
        T_EXPECT(qc_offload_release(o, ha) == QC_OK, "%s", qc_error_last());
        T_EXPECT(put_nvme(o, nc, 3, &c, &hc) == QC_OK, "put c: %s", qc_error_last());
        T_EXPECT(reads_back(o, hc, c, nc), "c does not read back: %s", qc_error_last());
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.nvme_grows, 2, "growths after reuse");
        T_EXPECT_EQ_U64(spill_size(o), 6 * OT_MIB, "after reuse");
        /* the plan's need ahead of the puts */
        T_EXPECT(qc_offload_nvme_reserve(o, 20 * OT_MIB + 1) == QC_OK, "reserve: %s",
                 qc_error_last());
        T_EXPECT_EQ_U64(spill_size(o), 21 * OT_MIB, "after reserving 20 MiB + 1 byte");
        T_EXPECT_EQ_U64(qc_offload_nvme_limit(o), 256 * OT_MIB, "limit");
        qc_offload_release(o, hb);
        qc_offload_release(o, hc);
        ot_log_start();
        qc_offload_destroy(o);
        log = ot_log_stop();
        T_EXPECT_STR_CONTAINS(log, "spill file took 21.0 MiB at most (3 growths, limit 256 MiB)");
        T_EXPECT(ot_dir_entries(ot_dir, NULL, 0) == 0, "spill file left behind");
        free(a);
        free(b);
        free(c);
    }

    QC_TEST ("offload: a spill file the disk will not grow: QC_ERR_NOMEM, data intact") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.spill_visible = true;
        p.nvme_capacity = 64 * OT_MIB;
        p.nvme_initial = 2 * OT_MIB;
        p.nvme_grow_step = OT_MIB;
        p.sim_grow_errno = ENOSPC;
        struct qc_offload *o = NULL;
        enum qc_status st = qc_offload_create(dev, &p, &o);
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        unsigned char *a = NULL, *b = NULL;
        uint64_t ha = 0, hb = 0;
        T_EXPECT(put_nvme(o, OT_MIB, 5, &a, &ha) == QC_OK, "put within the file: %s",
                 qc_error_last());
        st = put_nvme(o, 2 * OT_MIB, 6, &b, &hb);
        T_EXPECT(st == QC_ERR_NOMEM, "put past a full disk: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), qc_offload_spill_path(o));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "growing from 2097152 to 3145728 bytes");
        T_EXPECT_STR_CONTAINS(qc_error_last(), strerror(ENOSPC));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "'grow'");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "hint: free space in");
        T_EXPECT_EQ_U64(spill_size(o), 2 * OT_MIB, "file size after the refused growth");
        T_EXPECT_EQ_U64(qc_offload_nvme_limit(o), 2 * OT_MIB, "limit after the refused growth");
        T_EXPECT(reads_back(o, ha, a, OT_MIB), "data before the refused growth: %s",
                 qc_error_last());
        /* later puts fail at once, saying why; one that fits still works */
        free(b);
        st = put_nvme(o, 2 * OT_MIB, 7, &b, &hb);
        T_EXPECT(st == QC_ERR_NOMEM, "second put past a full disk: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "it cannot grow");
        free(b);
        T_EXPECT(put_nvme(o, 512 * OT_KIB, 8, &b, &hb) == QC_OK, "put in the rest: %s",
                 qc_error_last());
        T_EXPECT(reads_back(o, hb, b, 512 * OT_KIB), "%s", qc_error_last());
        qc_offload_release(o, ha);
        qc_offload_release(o, hb);
        qc_offload_destroy(o);
        free(a);
        free(b);
    }
}

// ---- prefetch and stalls -------------------------------------------------------------------

/* 64 KiB blocks, 16 slots (prefetch may hold 12), one block per tensor. */
static struct qc_offload *make_prefetch_engine(size_t window, int count)
{
    struct qc_offload_params p;
    ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 8, true);
    p.block_size = 64 * OT_KIB;
    p.max_inflight = 16 * p.block_size;
    p.prefetch_window = window;
    p.prefetch_count = count;
    struct qc_offload *o = NULL;
    if (qc_offload_create(dev, &p, &o) != QC_OK)
        T_EXPECT(false, "create: %s", qc_error_last());
    return o;
}

enum { PF_N = 8 };

static void put_tensors(struct qc_offload *o, unsigned char **src, uint64_t *h, size_t n)
{
    struct qc_stream *cs = qc_device_compute_stream(dev);
    for (int i = 0; i < PF_N; i++) {
        src[i] = malloc(n);
        ot_fill(src[i], n, 500 + (uint64_t)i);
        T_EXPECT(qc_offload_put(o, src[i], n, cs, QC_OFFLOAD_PLACE_NVME, "pf", &h[i]) == QC_OK,
                 "%s", qc_error_last());
    }
    T_EXPECT(qc_offload_quiesce(o) == QC_OK, "%s", qc_error_last());
}

static void get_all_reverse(struct qc_offload *o, unsigned char **src, const uint64_t *h, size_t n)
{
    struct qc_stream *cs = qc_device_compute_stream(dev);
    unsigned char *dst = malloc(n);
    for (int i = PF_N; i-- > 0;) {
        memset(dst, 0, n);
        T_EXPECT(qc_offload_get(o, h[i], dst, cs) == QC_OK, "%s", qc_error_last());
        T_EXPECT(memcmp(dst, src[i], n) == 0, "tensor %d differs", i);
        T_EXPECT(qc_offload_release(o, h[i]) == QC_OK, "%s", qc_error_last());
        free(src[i]);
    }
    free(dst);
}

static void test_prefetch(void)
{
    QC_TEST ("offload: prefetch follows the order and keeps to the byte window") {
        size_t n = 64 * OT_KIB;
        struct qc_offload *o = make_prefetch_engine(4 * n, 0);
        if (!o)
            continue; /* ends the QC_TEST */
        unsigned char *src[PF_N];
        uint64_t h[PF_N], order[PF_N];
        put_tensors(o, src, h, n);
        for (int i = 0; i < PF_N; i++)
            order[i] = h[PF_N - 1 - i];
        T_EXPECT(qc_offload_set_order(o, order, PF_N) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_offload_quiesce(o) == QC_OK, "%s", qc_error_last());
        uint64_t log[PF_N * 2];
        size_t nlog = qc_offload_prefetch_log(o, log, PF_N * 2);
        T_EXPECT_EQ_U64(nlog, 4, "handles prefetched before any get (window of 4 blocks)");
        for (size_t i = 0; i < nlog && i < 4; i++)
            T_EXPECT(log[i] == order[i], "prefetch #%zu is not order[%zu]", i, i);
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.prefetch_reads, 4, "blocks read ahead");
        T_EXPECT_EQ_U64(s.prefetch_bytes_peak, 4 * n, "prefetch peak");

        get_all_reverse(o, src, h, n);
        nlog = qc_offload_prefetch_log(o, log, PF_N * 2);
        T_EXPECT(nlog >= 4 && nlog <= PF_N, "prefetched %zu handles", nlog);
        for (size_t i = 0; i < nlog && i < PF_N; i++)
            T_EXPECT(log[i] == order[i], "prefetch #%zu out of order", i);
        qc_offload_stats_get(o, &s);
        T_EXPECT(s.prefetch_bytes_peak <= 4 * n, "window exceeded: peak %llu",
                 (unsigned long long)s.prefetch_bytes_peak);
        T_EXPECT(s.stall_count <= PF_N - 4, "stalls %llu: the first 4 were ready",
                 (unsigned long long)s.stall_count);
        T_EXPECT_EQ_U64(s.gets, PF_N, "gets");
        qc_offload_destroy(o);
    }

    QC_TEST ("offload: prefetch keeps to the handle-count window") {
        size_t n = 64 * OT_KIB;
        struct qc_offload *o = make_prefetch_engine(64 * n, 2);
        if (!o)
            continue; /* ends the QC_TEST */
        unsigned char *src[PF_N];
        uint64_t h[PF_N], order[PF_N];
        put_tensors(o, src, h, n);
        for (int i = 0; i < PF_N; i++)
            order[i] = h[PF_N - 1 - i];
        qc_offload_set_order(o, order, PF_N);
        T_EXPECT(qc_offload_quiesce(o) == QC_OK, "%s", qc_error_last());
        uint64_t log[PF_N];
        size_t nlog = qc_offload_prefetch_log(o, log, PF_N);
        T_EXPECT_EQ_U64(nlog, 2, "handles prefetched with prefetch_count 2");
        get_all_reverse(o, src, h, n);
        qc_offload_destroy(o);
    }

    QC_TEST ("offload: prefetch never takes the slots puts and gets need") {
        /* window far larger than the ring: prefetch stops at nslots - reserve (12 of 16) */
        size_t n = 64 * OT_KIB;
        struct qc_offload *o = make_prefetch_engine(1024 * n, 0);
        if (!o)
            continue; /* ends the QC_TEST */
        enum { M = 20 };
        unsigned char *src[M];
        uint64_t h[M], order[M];
        struct qc_stream *cs = qc_device_compute_stream(dev);
        for (int i = 0; i < M; i++) {
            src[i] = malloc(n);
            ot_fill(src[i], n, 900 + (uint64_t)i);
            qc_offload_put(o, src[i], n, cs, QC_OFFLOAD_PLACE_NVME, "slots", &h[i]);
        }
        for (int i = 0; i < M; i++)
            order[i] = h[M - 1 - i];
        qc_offload_set_order(o, order, M);
        T_EXPECT(qc_offload_quiesce(o) == QC_OK, "%s", qc_error_last());
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.prefetch_bytes_peak, 12 * n, "prefetch held more than 12 slots");
        /* a put and an out-of-order get still go through while prefetch holds its maximum */
        size_t diff = 0;
        enum qc_status st = ot_roundtrip(o, dev, 5 * n + 1, QC_OFFLOAD_PLACE_NVME, 3, false, &diff);
        T_EXPECT(st == QC_OK && diff == 5 * n + 1, "round trip beside prefetch: %s",
                 qc_error_last());
        unsigned char *dst = malloc(n);
        for (int i = 0; i < M; i++) {
            T_EXPECT(qc_offload_get(o, h[i], dst, cs) == QC_OK, "%s", qc_error_last());
            T_EXPECT(memcmp(dst, src[i], n) == 0, "tensor %d differs", i);
        }
        /* releasing handles whose prefetched blocks were never got gives the slots back
         * (destroy asserts that every slot is home) */
        for (int i = 0; i < M; i++) {
            qc_offload_release(o, h[i]);
            free(src[i]);
        }
        free(dst);
        qc_offload_destroy(o);
    }

    QC_TEST ("offload: stalls are counted; prefetched gets do not stall") {
        size_t n = 64 * OT_KIB;
        struct qc_offload *o = make_prefetch_engine(0, 0);
        if (!o)
            continue; /* ends the QC_TEST */
        unsigned char *src[PF_N];
        uint64_t h[PF_N];
        put_tensors(o, src, h, n);
        get_all_reverse(o, src, h, n);
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.stall_count, PF_N, "without prefetch every NVMe get waits");
        T_EXPECT(s.stall_ns > 0, "stall time not measured");
        T_EXPECT_EQ_U64(s.prefetch_reads, 0, "prefetch with window 0");
        qc_offload_destroy(o);

        o = make_prefetch_engine(PF_N * n, 0);
        if (!o)
            continue; /* ends the QC_TEST */
        put_tensors(o, src, h, n);
        uint64_t order[PF_N];
        for (int i = 0; i < PF_N; i++)
            order[i] = h[PF_N - 1 - i];
        qc_offload_set_order(o, order, PF_N);
        T_EXPECT(qc_offload_quiesce(o) == QC_OK, "%s", qc_error_last());
        get_all_reverse(o, src, h, n);
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.stall_count, 0, "all data was read ahead");
        T_EXPECT_EQ_U64(s.prefetch_reads, PF_N, "blocks read ahead");
        qc_offload_destroy(o);

        /* explicit prefetch of one handle */
        o = make_prefetch_engine(0, 0);
        if (!o)
            continue; /* ends the QC_TEST */
        put_tensors(o, src, h, n);
        T_EXPECT(qc_offload_prefetch(o, h[3]) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_offload_quiesce(o) == QC_OK, "%s", qc_error_last());
        unsigned char *dst = malloc(n);
        T_EXPECT(qc_offload_get(o, h[3], dst, qc_device_compute_stream(dev)) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(memcmp(dst, src[3], n) == 0, "prefetched tensor differs");
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.stall_count, 0, "explicitly prefetched get stalled");
        free(dst);
        get_all_reverse(o, src, h, n);
        qc_offload_destroy(o);
    }
}

// ---- concurrency ---------------------------------------------------------------------------

struct worker_arg {
    struct qc_offload *o;
    uint64_t seed;
    int failures;
    int host_full;        /* HOST puts refused because the tier was full */
    char last_error[512]; /* this thread's last failure (qc_error_last is per thread) */
};

static void worker_fail(struct worker_arg *a, const char *what)
{
    a->failures++;
    snprintf(a->last_error, sizeof a->last_error, "%s: %s", what, qc_error_last());
    printf("  worker %llu: %s\n", (unsigned long long)a->seed, a->last_error);
}

static void *worker(void *p)
{
    struct worker_arg *a = p;
    struct qc_stream *s = NULL;
    if (qc_stream_create(dev, QC_STREAM_COMPUTE, &s) != QC_OK) {
        a->failures++;
        return NULL;
    }
    uint64_t r = a->seed;
    size_t cap = 600 * OT_KIB;
    unsigned char *src = malloc(cap), *dst = malloc(cap);
    for (int it = 0; it < 12; it++) {
        size_t n = 1 + (size_t)(qc_test_rand(&r) % cap);
        enum qc_offload_place place = (enum qc_offload_place)(qc_test_rand(&r) % 3);
        if (place == QC_OFFLOAD_PLACE_HOST && n > 200 * OT_KIB)
            place = QC_OFFLOAD_PLACE_AUTO;
        ot_fill(src, n, qc_test_rand(&r));
        uint64_t h = 0;
        enum qc_status st = qc_offload_put(a->o, src, n, s, place, "thread", &h);
        if (st == QC_ERR_NOMEM && place == QC_OFFLOAD_PLACE_HOST) {
            /* AUTO puts of the other threads may fill the 1 MiB host tier: a HOST put then
             * fails by contract (no spill), and the round trip goes through AUTO instead. */
            a->host_full++;
            st = qc_offload_put(a->o, src, n, s, QC_OFFLOAD_PLACE_AUTO, "thread", &h);
        }
        if (st != QC_OK) {
            worker_fail(a, "put");
            continue;
        }
        if (qc_test_rand(&r) % 2)
            qc_offload_prefetch(a->o, h);
        if (qc_offload_get(a->o, h, dst, s) != QC_OK || qc_stream_synchronize(s) != QC_OK ||
            memcmp(src, dst, n) != 0)
            worker_fail(a, "get");
        if (qc_offload_release(a->o, h) != QC_OK)
            worker_fail(a, "release");
    }
    free(src);
    free(dst);
    qc_stream_destroy(s);
    return NULL;
}

static void test_concurrency(void)
{
    QC_TEST ("offload: concurrent put/prefetch/get/release from 4 threads, small ring") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.block_size = 64 * OT_KIB;
        p.max_inflight = 4 * p.block_size; /* puts must wait for slots */
        p.host_capacity = 1 * OT_MIB;
        p.prefetch_window = 2 * p.block_size;
        struct qc_offload *o = NULL;
        if (qc_offload_create(dev, &p, &o) != QC_OK) {
            T_EXPECT(false, "create: %s", qc_error_last());
            continue; /* ends the QC_TEST */
        }
        enum { T = 4 };
        pthread_t th[T];
        struct worker_arg args[T];
        for (int i = 0; i < T; i++) {
            args[i] = (struct worker_arg){.o = o, .seed = qc_test_seed() + (uint64_t)i};
            pthread_create(&th[i], NULL, worker, &args[i]);
        }
        int failures = 0, host_full = 0;
        const char *last_error = "";
        for (int i = 0; i < T; i++) {
            pthread_join(th[i], NULL);
            failures += args[i].failures;
            host_full += args[i].host_full;
            if (args[i].failures)
                last_error = args[i].last_error;
        }
        T_EXPECT(failures == 0, "%d failed round trips (last error: %s)", failures, last_error);
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.gets, T * 12, "gets");
        T_EXPECT_EQ_U64(s.bytes_host_used + s.bytes_nvme_used, 0, "bytes left after release");
        printf("  host puts %llu, nvme puts %llu, put stalls %llu, host-full retries %d\n",
               (unsigned long long)s.puts_host, (unsigned long long)s.puts_nvme,
               (unsigned long long)s.put_stall_count, host_full);
        qc_offload_destroy(o);
    }
}

int main(void)
{
    dev = ot_device();
    ot_dir_make();
    ot_rung_report(dev);
    test_params();
    test_host_tier();
    test_put_done_and_streams();
    test_auto_placement();
    for (int r = QC_OFFLOAD_RUNG_URING_DIRECT; r < QC_OFFLOAD_RUNG_COUNT; r++)
        test_ladder_forced((enum qc_offload_rung)r);
    test_ladder_simulated();
    test_spill_size();
    test_prefetch();
    test_concurrency();
    qc_device_destroy(dev);
    ot_dir_remove();
    return qc_test_summary();
}
