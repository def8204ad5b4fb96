/*
 * test_offload_common.h — helpers shared by the tests/test_offload*.c executables: a CPU device,
 * a private temporary directory (under $TMPDIR or /tmp; tmpfs or not), seeded data, a round trip
 * through the engine, and a log capture for the probe lines.
 *
 * "Device memory" on the CPU backend is host memory, so plain malloc'd buffers stand in for
 * device tensors; the copy stream is a real worker thread, so the copies are asynchronous.
 */
#ifndef QC_TESTS_TEST_OFFLOAD_COMMON_H
#define QC_TESTS_TEST_OFFLOAD_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qc_device.h"
#include "qc_offload.h"
#include "testutil.h"

#define OT_KIB ((size_t)1 << 10)
#define OT_MIB ((size_t)1 << 20)

// ---- temporary directory -------------------------------------------------------------------

static char ot_dir[PATH_MAX];

static inline void ot_dir_make(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(ot_dir, sizeof ot_dir, "%s/qc-offload-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(ot_dir)) {
        printf("cannot create a temporary directory under %s\n", tmp && tmp[0] ? tmp : "/tmp");
        exit(1);
    }
}

/* Entries in dir other than . and .. ; the first one's name goes to first (may be NULL). */
static inline int ot_dir_entries(const char *dir, char *first, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (n++ == 0 && first)
            snprintf(first, cap, "%s", e->d_name);
    }
    closedir(d);
    return n;
}

/* Removes the directory; it must be empty (a spill file left behind is a failure). */
static inline void ot_dir_remove(void)
{
    char name[256] = "";
    int n = ot_dir_entries(ot_dir, name, sizeof name);
    if (n != 0) {
        printf("FAIL: %d file(s) left in %s (first: %s)\n", n, ot_dir, name);
        exit(1);
    }
    rmdir(ot_dir);
}

// ---- log capture ---------------------------------------------------------------------------

static pthread_mutex_t ot_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char ot_log_buf[16384];

static inline void ot_log_sink(enum qc_log_level level, const char *line, void *user)
{
    (void)level;
    (void)user;
    pthread_mutex_lock(&ot_log_mu);
    size_t used = strlen(ot_log_buf);
    snprintf(ot_log_buf + used, sizeof ot_log_buf - used, "%s\n", line);
    pthread_mutex_unlock(&ot_log_mu);
    fputs(line, stdout);
    fputc('\n', stdout);
}

static inline void ot_log_start(void)
{
    pthread_mutex_lock(&ot_log_mu);
    ot_log_buf[0] = '\0';
    pthread_mutex_unlock(&ot_log_mu);
    qc_log_set_sink(ot_log_sink, NULL);
}

/* Stops capturing; returns the captured text (valid until the next ot_log_start). */
static inline const char *ot_log_stop(void)
{
    qc_log_set_sink(NULL, NULL);
    return ot_log_buf;
}

// ---- engine and data -----------------------------------------------------------------------

static inline void ot_params(struct qc_offload_params *p, enum qc_offload_rung rung, int qd,
                             bool registered)
{
    qc_offload_params_default(p);
    p->nvme_dir = ot_dir;
    p->nvme_capacity = 160 * OT_MIB;
    p->host_capacity = 0;
    p->force_rung = rung;
    p->queue_depth = qd;
    p->register_buffers = registered;
    p->direct = rung != QC_OFFLOAD_RUNG_URING_BUFFERED;
    p->block_size = OT_MIB;
    p->max_inflight = 8 * OT_MIB;
    p->prefetch_window = 0;
    /* QC_TEST_SIM_NO_URING=1: behave as a machine without io_uring (the engine's simulation
     * hook), to check what the suite does there (OT_URING_UNAVAILABLE) */
    const char *sim = getenv("QC_TEST_SIM_NO_URING");
    if (sim && strcmp(sim, "1") == 0)
        p->sim_uring_errno = ENOSYS;
    /* QC_TEST_SIM_NO_O_DIRECT=1: as a filesystem that refuses O_DIRECT (EINVAL, a tmpfs before
     * Linux 6.6), for the same check (OT_IO_UNAVAILABLE) */
    sim = getenv("QC_TEST_SIM_NO_O_DIRECT");
    if (sim && strcmp(sim, "1") == 0)
        p->sim_direct_errno = EINVAL;
}

// ---- the rung this machine gives, and io_uring under CI --------------------------------------

/* The rung an AUTO engine picks here (on a spill file in the test's folder); printed with the
 * reason by ot_rung_report. */
static enum qc_offload_rung ot_auto_rung __attribute__((unused)) = QC_OFFLOAD_RUNG_COUNT;

/* Probes the AUTO rung once and prints it ("offload: active rung on this machine: ..."), so
 * every test log says which I/O path its cases ran on. Call after ot_dir_make. */
static inline void ot_rung_report(struct qc_device *dev)
{
    struct qc_offload_params p;
    ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
    p.direct = true;
    struct qc_offload *o = NULL;
    if (qc_offload_create(dev, &p, &o) != QC_OK) {
        printf("offload: active rung on this machine: none (%s)\n", qc_error_last());
        return;
    }
    ot_auto_rung = qc_offload_rung_active(o);
    printf("offload: active rung on this machine: %s%s\n", qc_offload_rung_str(ot_auto_rung),
           qc_offload_registered(o) ? ", registered buffers" : "");
    qc_offload_destroy(o);
    fflush(stdout);
}

/* CI=true (or 1): the run is CI's (.ci/run exports it). */
static inline bool ot_under_ci(void)
{
    const char *ci = getenv("CI");
    return ci && (strcmp(ci, "true") == 0 || strcmp(ci, "1") == 0);
}

/* The opt-out under CI for the I/O path a case needs (QC_CI_NO_URING or QC_CI_NO_O_DIRECT,
 * "1"), or NULL when it is not set. */
static inline const char *ot_ci_opt_out(bool need_direct)
{
    const char *name = need_direct ? "QC_CI_NO_O_DIRECT" : "QC_CI_NO_URING";
    const char *v = getenv(name);
    return v && strcmp(v, "1") == 0 ? name : NULL;
}

/* Whether a refused io_uring rung means io_uring itself is missing here (the AUTO probe fell to
 * the thread pool, or found no NVMe tier) rather than O_DIRECT (io_uring works, the spill
 * folder's filesystem refuses O_DIRECT: a tmpfs). */
static inline bool ot_uring_missing(enum qc_offload_rung rung)
{
    return ot_auto_rung == QC_OFFLOAD_RUNG_THREADS || ot_auto_rung == QC_OFFLOAD_RUNG_COUNT ||
           ot_auto_rung == QC_OFFLOAD_RUNG_HOST_ONLY || rung != QC_OFFLOAD_RUNG_URING_DIRECT;
}

/* A case needs an I/O path this machine refused (why: the engine's message): io_uring
 * (need_direct false) or O_DIRECT (true). Outside CI that is a skip. Under CI=true it is a
 * failure, so that CI cannot pass with the NVMe path never run, unless the runner opts out
 * explicitly for that path: QC_CI_NO_URING=1 (the CI machine has no io_uring: a seccomp
 * profile, an old kernel) or QC_CI_NO_O_DIRECT=1 (its temporary folder cannot do O_DIRECT: a
 * tmpfs); the opt-out is logged in the case's skip line. Use as the last statement of the
 * case. */
#define OT_IO_UNAVAILABLE(need_direct, why)                                                        \
    do {                                                                                           \
        const bool ot_direct_ = (need_direct);                                                     \
        const char *ot_what_ = ot_direct_ ? "O_DIRECT" : "io_uring";                               \
        const char *ot_opt_ = ot_ci_opt_out(ot_direct_);                                           \
        if (ot_under_ci() && !ot_opt_)                                                             \
            T_FAIL_AT("%s is unavailable under CI=true: %s\n    hint: fix the CI machine (or "     \
                      "point TMPDIR at a disk folder), or set %s=1 to accept running without it",  \
                      ot_what_, (why), ot_direct_ ? "QC_CI_NO_O_DIRECT" : "QC_CI_NO_URING");       \
        else if (ot_under_ci())                                                                    \
            T_SKIP("%s unavailable: %s (CI opt-out %s=1: CI accepts running without %s)",          \
                   ot_what_, (why), ot_opt_, ot_what_);                                            \
        else                                                                                       \
            T_SKIP("%s unavailable: %s", ot_what_, (why));                                         \
    } while (0)

/* An io_uring rung was refused: io_uring or O_DIRECT missing (ot_uring_missing). */
#define OT_URING_UNAVAILABLE(rung, why) OT_IO_UNAVAILABLE(!ot_uring_missing(rung), why)

static inline size_t offload_test_round4k(size_t n)
{
    return (n + 4095) / 4096 * 4096;
}

static inline void ot_fill(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = qc_test_rand(&s);
        memcpy(p + i, &r, 8);
    }
    uint64_t r = qc_test_rand(&s);
    for (; i < n; i++, r >>= 8)
        p[i] = (unsigned char)r;
}

/* First differing offset, or n when equal. */
static inline size_t ot_first_diff(const unsigned char *a, const unsigned char *b, size_t n)
{
    if (memcmp(a, b, n) == 0)
        return n;
    size_t i = 0;
    while (a[i] == b[i])
        i++;
    return i;
}

/* put -> (quiesce) -> get -> compare, on the device's compute stream. Returns the status of the
 * first failing call; *diff is the first differing offset (size when byte-exact). */
static inline enum qc_status ot_roundtrip(struct qc_offload *o, struct qc_device *dev, size_t size,
                                          enum qc_offload_place place, uint64_t seed, bool quiesce,
                                          size_t *diff)
{
    struct qc_stream *cs = qc_device_compute_stream(dev);
    unsigned char *src = malloc(size ? size : 1), *dst = malloc(size ? size : 1);
    if (!src || !dst) {
        free(src);
        free(dst);
        return QC_ERR_NOMEM;
    }
    ot_fill(src, size, seed);
    memset(dst, 0xa5, size);
    uint64_t h = 0;
    enum qc_status st = qc_offload_put(o, src, size, cs, place, "roundtrip", &h);
    if (st == QC_OK && quiesce)
        st = qc_offload_quiesce(o);
    if (st == QC_OK)
        st = qc_offload_get(o, h, dst, cs);
    if (st == QC_OK)
        st = qc_stream_synchronize(cs);
    enum qc_status rst = qc_offload_release(o, h);
    if (st == QC_OK)
        st = rst;
    *diff = st == QC_OK ? ot_first_diff(src, dst, size) : 0;
    free(src);
    free(dst);
    return st;
}

static inline struct qc_device *ot_device(void)
{
    struct qc_device *dev = NULL;
    if (qc_device_create(QC_DEVICE_CPU, 0, &dev) != QC_OK) {
        printf("cannot create the CPU device: %s\n", qc_error_last());
        exit(1);
    }
    return dev;
}

#endif /* QC_TESTS_TEST_OFFLOAD_COMMON_H */
