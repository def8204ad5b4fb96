/*
 * test_dist_nccl.c — the communicator of src/dist in a world of ONE rank (a singleton MPI, no
 * mpirun), both backends in one process, driven the way the trainer drives them (qc_dist.h:
 * pieces of dist.bucket_bytes between the cuts, ranges reported top down, settle, end, the
 * parameter all-gather, the host collectives, statistics, destroy). One H200 cannot host the
 * two-rank NCCL test (test_dist_mpi_cuda: NCCL refuses two ranks on one GPU); NCCL allows a
 * communicator of one rank, so this is where a lent single-GPU machine runs nccl.c at all.
 *
 *   test_dist_nccl cpu   (ctest test_dist_nccl_cpu, label cpu: CI) the MPI backend: ZeRO 0, 1
 *                        and 2, pieces of 4 KiB, of 20000 B and one per region, ranges reported
 *                        in uneven pieces, a step reporting nothing (the epoch's last), a settle
 *                        in the middle of a step; in a world of one every reduced element is the
 *                        rank's own contribution, bit for bit, and the shard is the whole buffer;
 *                        the host all-gather, broadcast and shard gather; the statistics; option
 *                        errors and a NCCL communicator refused (no device, or no CUDA build)
 *                        come back as statuses naming the problem, and the half-made
 *                        communicator is freed.
 *   test_dist_nccl       (label gpu; exit 77 without a GPU or in a CPU-only build, 1 on a GPU
 *                        that does not work: tests/cuda_probe.h) the same steps first through
 *                        the MPI backend on host memory, then through the NCCL backend on device
 *                        memory (the gradients written range by range on the compute stream
 *                        before each report, as backward does): the results equal the MPI
 *                        backend's bit for bit, and so do the statistics; the host collectives
 *                        over the NCCL communicator; an NCCL error (a gradient buffer NCCL's
 *                        pointer check refuses: NCCL_CHECK_POINTERS=1) comes back from
 *                        qc_dist_grads_ready as QC_ERR_CUDA naming the NCCL call, for
 *                        ncclAllReduce (ZeRO 0) and the grouped ncclReduce (ZeRO 2), the
 *                        communicator is destroyed without hanging and a new one works.
 *
 * With one rank a sum is the identity, and NCCL runs an in-place collective of one rank as no
 * device work at all (ncclLaunchOneRank: nothing to copy): what this checks is that every NCCL
 * call, event, stream wait and host function of nccl.c is valid on a real GPU and leaves the
 * data alone, that the two backends agree on everything observable, and the error paths. The
 * arithmetic of several ranks is test_dist_comm's (MPI) and test_dist_mpi_cuda's (NCCL, 2
 * GPUs). Not reachable in one process through qc_dist.h: the abort path (ncclCommAbort after a
 * peer went away or an asynchronous NCCL error: dist_fail), which needs a second rank.
 *
 * The process that ctest starts runs the worker as a child (`test_dist_nccl worker MODE`)
 * without LeakSanitizer's leak check: Open MPI leaks at MPI_Finalize (dist_testlib.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_probe.h"
#include "dist_testlib.h"
#include "proc_testlib.h"
#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_dist.h"
#include "testutil.h"

#define NUMEL 40009 /* floats: three regions, pieces of 4 KiB, shards not multiples of it */
#define STEPS 3
#define NCONF 9 /* ZeRO 0, 1, 2 x three bucket sizes */
#define TMOUT 30.0

static const int64_t cuts[2] = {13001, 27003};
static const size_t buckets[3] = {4096, 20000, (size_t)NUMEL * 4};

// ---- the scenario: what a step writes and reports -----------------------------------------------

/* The gradient element i of step s (small integers times 0.37, both signs). */
static float contrib(int s, int64_t i)
{
    const uint64_t h = (uint64_t)i * 2654435761u + (uint64_t)s * 977u;
    return (float)((int)(h % 2001) - 1000) * 0.37f;
}

static float param(int s, int64_t i)
{
    return (float)(i % 97) * 0.25f - (float)s;
}

/* The ranges step s reports, top down, each starting where the previous one ended; returns how
 * many (0: the step reports nothing and grads_end reduces everything, as on a rank without a
 * group). Lengths from 0 (an empty range) to 9000, not aligned to pieces or cuts. *settle_after:
 * the count of ranges after which the step settles (-1: never). */
static int step_ranges(int s, int64_t (*r)[2], int *settle_after)
{
    *settle_after = -1;
    if (s == 2)
        return 0;
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(s + 1);
    int n = 0;
    for (int64_t hi = NUMEL; hi > 0; n++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int64_t len = (int64_t)((x >> 33) % 9001);
        if (len > hi)
            len = hi;
        r[n][0] = hi - len;
        r[n][1] = hi;
        hi -= len;
    }
    if (s == 3)
        *settle_after = n / 2;
    return n;
}

#define MAX_RANGES 4096

/* One configuration's results and statistics, from the MPI backend (the reference). */
struct ref {
    float *grads[STEPS + 1]; /* after grads_end of step s (1-based) */
    struct qc_dist_stats stats;
};

static struct qc_dist_opts options(int zero, size_t bucket)
{
    return (struct qc_dist_opts){
        .backend = QC_DIST_MPI,
        .numel = NUMEL,
        .zero_stage = zero,
        .bucket_bytes = bucket,
        .timeout_s = TMOUT,
        .cuts = cuts,
        .ncuts = 2,
        .agreement = "model=tiny\nworld=one\n",
        .agreement_what = "the test set-up",
    };
}

/* The first element of a (n floats) that differs from b bit for bit, or -1. */
static int64_t first_diff(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            return i;
    return -1;
}

static void check_world_of_one(struct qc_dist *d)
{
    int64_t lo = -1, hi = -1;
    qc_dist_my_shard(d, &lo, &hi);
    T_EXPECT(qc_dist_rank(d) == 0 && qc_dist_size(d) == 1, "rank %d of %d", qc_dist_rank(d),
             qc_dist_size(d));
    T_EXPECT(lo == 0 && hi == NUMEL, "the one rank's shard is [%lld, %lld), not the buffer",
             (long long)lo, (long long)hi);
}

static void small_collectives(struct qc_dist *d, int step)
{
    int64_t mine = 1000 + step, all[2] = {-1, -1};
    T_EXPECT(qc_dist_allgather(d, &mine, sizeof mine, all) == QC_OK, "allgather: %s",
             qc_error_last());
    T_EXPECT(all[0] == mine && all[1] == -1, "allgather gave %lld (and wrote past one rank)",
             (long long)all[0]);
    char word[16];
    snprintf(word, sizeof word, "step %d", step);
    T_EXPECT(qc_dist_bcast(d, word, sizeof word, 0) == QC_OK, "bcast: %s", qc_error_last());
    char want[16];
    snprintf(want, sizeof want, "step %d", step);
    T_EXPECT(strcmp(word, want) == 0, "bcast gave \"%s\"", word);
    float *shard = malloc(NUMEL * sizeof(float)), *full = malloc(NUMEL * sizeof(float));
    for (int64_t i = 0; i < NUMEL; i++) {
        shard[i] = param(step + 7, i);
        full[i] = -1.0f;
    }
    T_EXPECT(qc_dist_gather_shards(d, shard, full) == QC_OK, "gather: %s", qc_error_last());
    const int64_t bad = first_diff(full, shard, NUMEL);
    T_EXPECT(bad < 0, "gathered element %lld", (long long)bad);
    free(shard);
    free(full);
}

// ---- the MPI backend (host memory) --------------------------------------------------------------

static void run_mpi(int zero, size_t bucket, struct ref *ref)
{
    const struct qc_dist_opts o = options(zero, bucket);
    struct qc_dist *d = NULL;
    if (qc_dist_create(&o, &d) != QC_OK) {
        T_EXPECT(false, "MPI backend, ZeRO %d, bucket %zu: qc_dist_create: %s", zero, bucket,
                 qc_error_last());
        return;
    }
    check_world_of_one(d);
    float *g = malloc(NUMEL * sizeof(float)), *p = malloc(NUMEL * sizeof(float));
    static int64_t r[MAX_RANGES][2];
    for (int s = 1; s <= STEPS; s++) {
        int settle_after;
        const int n = step_ranges(s, r, &settle_after);
        for (int64_t i = 0; i < NUMEL; i++)
            g[i] = -7.0f; /* not yet produced */
        T_EXPECT(qc_dist_grads_begin(d, g) == QC_OK, "begin: %s", qc_error_last());
        for (int k = 0; k < n; k++) {
            for (int64_t i = r[k][0]; i < r[k][1]; i++)
                g[i] = contrib(s, i);
            T_EXPECT(qc_dist_grads_ready(d, r[k][0], r[k][1]) == QC_OK, "ready: %s",
                     qc_error_last());
            if (k == settle_after) {
                T_EXPECT(qc_dist_grads_settle(d) == QC_OK, "settle: %s", qc_error_last());
                for (int64_t i = r[k][0]; i < NUMEL; i++)
                    if (g[i] != contrib(s, i)) {
                        T_EXPECT(false, "ZeRO %d step %d: after settle, element %lld is %g", zero,
                                 s, (long long)i, (double)g[i]);
                        break;
                    }
            }
        }
        if (n == 0) /* nothing reported: grads_end reduces the whole buffer */
            for (int64_t i = 0; i < NUMEL; i++)
                g[i] = contrib(s, i);
        T_EXPECT(qc_dist_grads_end(d) == QC_OK, "end: %s", qc_error_last());
        for (int64_t i = 0; i < NUMEL; i++)
            if (g[i] != contrib(s, i)) {
                T_EXPECT(false, "MPI, ZeRO %d, bucket %zu, step %d: element %lld is %g, not %g",
                         zero, bucket, s, (long long)i, (double)g[i], (double)contrib(s, i));
                break;
            }
        ref->grads[s] = malloc(NUMEL * sizeof(float));
        memcpy(ref->grads[s], g, NUMEL * sizeof(float));
        for (int64_t i = 0; i < NUMEL; i++)
            p[i] = param(s, i);
        T_EXPECT(qc_dist_params_allgather(d, p) == QC_OK, "params: %s", qc_error_last());
        for (int64_t i = 0; i < NUMEL; i++)
            if (p[i] != param(s, i)) {
                T_EXPECT(false, "ZeRO %d: parameter %lld changed by the all-gather", zero,
                         (long long)i);
                break;
            }
        qc_dist_step_end(d);
        small_collectives(d, s);
    }
    qc_dist_stats_get(d, &ref->stats);
    T_EXPECT(ref->stats.steps == STEPS && ref->stats.bytes_reduced == (uint64_t)STEPS * NUMEL * 4,
             "stats: %lld steps, %llu bytes reduced", (long long)ref->stats.steps,
             (unsigned long long)ref->stats.bytes_reduced);
    T_EXPECT(ref->stats.bytes_sent == 0 && ref->stats.scratch_bytes == 0,
             "one rank sends nothing and receives nothing: %llu bytes sent, %llu of scratch",
             (unsigned long long)ref->stats.bytes_sent,
             (unsigned long long)ref->stats.scratch_bytes);
    qc_dist_stats_reset(d);
    struct qc_dist_stats z;
    qc_dist_stats_get(d, &z);
    T_EXPECT(z.steps == 0 && z.bytes_reduced == 0, "stats after reset: %lld steps",
             (long long)z.steps);
    qc_dist_destroy(d);
    free(g);
    free(p);
}

/* Errors that need no GPU: options, and a NCCL communicator this process cannot have. */
static void errors_without_gpu(void)
{
    struct qc_dist_opts o = options(3, 4096);
    struct qc_dist *d = NULL;
    T_EXPECT(qc_dist_create(&o, &d) == QC_ERR_INVALID && d == NULL, "ZeRO 3 accepted");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "zero stage 3");
    qc_dist_destroy(d);
    d = NULL;
    o = options(0, 4096);
    o.timeout_s = 0;
    T_EXPECT(qc_dist_create(&o, &d) == QC_ERR_INVALID && d == NULL, "timeout 0 accepted");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "timeout 0");
    qc_dist_destroy(d);
    d = NULL;
    /* NCCL without a device (after the communication thread started: the half-made
     * communicator is freed, its thread joined) */
    o = options(1, 4096);
    o.backend = QC_DIST_NCCL;
    const enum qc_status st = qc_dist_create(&o, &d);
#ifdef QC_HAVE_CUDA
    T_EXPECT(st == QC_ERR_INVALID && d == NULL, "NCCL without a device: status %d", (int)st);
    T_EXPECT_STR_CONTAINS(qc_error_last(), "the NCCL backend needs the device and its compute");
#else
    T_EXPECT(st == QC_ERR_UNSUPPORTED && d == NULL, "NCCL in a CPU-only build: status %d", (int)st);
    T_EXPECT_STR_CONTAINS(qc_error_last(), "NCCL needs a CUDA build");
#endif
    qc_dist_destroy(d);
    d = NULL;
    /* and the process still makes a working communicator */
    o = options(2, 4096);
    T_EXPECT(qc_dist_create(&o, &d) == QC_OK, "after the errors: %s", qc_error_last());
    if (d) {
        small_collectives(d, 9);
        qc_dist_destroy(d);
    }
}

// ---- the NCCL backend (device memory) -----------------------------------------------------------

struct gpu {
    struct qc_device *dev;
    struct qc_stream *cs;
    struct qc_alloc *alloc;
    float *g, *p; /* device: NUMEL each */
};

static bool gpu_open(struct gpu *G)
{
    memset(G, 0, sizeof *G);
    if (qc_device_create(QC_DEVICE_CUDA, 0, &G->dev) != QC_OK) {
        T_EXPECT(false, "device: %s", qc_error_last());
        return false;
    }
    G->cs = qc_device_compute_stream(G->dev);
    struct qc_alloc_params ap;
    qc_alloc_params_default(&ap);
    ap.expandable = 0; /* cudaMalloc'd segments: what NCCL's pointer check knows best */
    ap.budget = (size_t)64 << 20;
    if (qc_alloc_create(G->dev, &ap, &G->alloc) != QC_OK ||
        qc_alloc_malloc(G->alloc, NUMEL * sizeof(float), G->cs, "test/grads", (void **)&G->g) !=
            QC_OK ||
        qc_alloc_malloc(G->alloc, NUMEL * sizeof(float), G->cs, "test/params", (void **)&G->p) !=
            QC_OK) {
        T_EXPECT(false, "device memory: %s", qc_error_last());
        return false;
    }
    return true;
}

static void gpu_close(struct gpu *G)
{
    if (G->alloc) {
        if (G->g)
            qc_alloc_free(G->alloc, G->g, G->cs);
        if (G->p)
            qc_alloc_free(G->alloc, G->p, G->cs);
        qc_alloc_destroy(G->alloc);
    }
    qc_device_destroy(G->dev);
}

/* A failed call fails the test and leaves the configuration (to `done`: the communicator is
 * destroyed, never left running beside the next one). */
#define GPU_TRY(call)                                                                              \
    do {                                                                                           \
        if ((call) != QC_OK) {                                                                     \
            T_EXPECT(false, "%s: %s", #call, qc_error_last());                                     \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static void run_nccl(struct gpu *G, int zero, size_t bucket, const struct ref *ref)
{
    struct qc_dist_opts o = options(zero, bucket);
    o.backend = QC_DIST_NCCL;
    o.dev = G->dev;
    o.compute = G->cs;
    struct qc_dist *d = NULL;
    if (qc_dist_create(&o, &d) != QC_OK) {
        T_EXPECT(false, "NCCL backend, ZeRO %d, bucket %zu: qc_dist_create: %s", zero, bucket,
                 qc_error_last());
        return;
    }
    check_world_of_one(d);
    float *src = malloc(NUMEL * sizeof(float)), *out = malloc(NUMEL * sizeof(float));
    static int64_t r[MAX_RANGES][2];
    for (int s = 1; s <= STEPS && qc_test_st.failed_in_test == 0; s++) {
        int settle_after;
        const int n = step_ranges(s, r, &settle_after);
        for (int64_t i = 0; i < NUMEL; i++)
            src[i] = contrib(s, i);
        GPU_TRY(qc_memset_async(G->cs, G->g, 0xff, NUMEL * sizeof(float))); /* NaNs: unwritten */
        GPU_TRY(qc_dist_grads_begin(d, G->g));
        for (int k = 0; k < n; k++) {
            /* backward writes the range on the compute stream, then reports it */
            const size_t off = (size_t)r[k][0], len = (size_t)(r[k][1] - r[k][0]);
            GPU_TRY(
                qc_memcpy_async(G->cs, G->g + off, src + off, len * sizeof(float), QC_COPY_H2D));
            GPU_TRY(qc_dist_grads_ready(d, r[k][0], r[k][1]));
            if (k == settle_after) {
                GPU_TRY(qc_dist_grads_settle(d));
                const size_t top = (size_t)(NUMEL - r[k][0]);
                GPU_TRY(qc_memcpy_async(G->cs, out, G->g + off, top * sizeof(float), QC_COPY_D2H));
                GPU_TRY(qc_stream_synchronize(G->cs));
                const int64_t bad = first_diff(out, src + off, (int64_t)top);
                T_EXPECT(bad < 0, "NCCL, ZeRO %d step %d: after settle, element %lld is %g", zero,
                         s, (long long)(bad + r[k][0]), bad >= 0 ? (double)out[bad] : 0.0);
            }
        }
        if (n == 0)
            GPU_TRY(qc_memcpy_async(G->cs, G->g, src, NUMEL * sizeof(float), QC_COPY_H2D));
        GPU_TRY(qc_dist_grads_end(d));
        GPU_TRY(qc_memcpy_async(G->cs, out, G->g, NUMEL * sizeof(float), QC_COPY_D2H));
        GPU_TRY(qc_stream_synchronize(G->cs));
        int64_t bad = first_diff(out, ref->grads[s], NUMEL);
        T_EXPECT(bad < 0,
                 "NCCL vs MPI, ZeRO %d, bucket %zu, step %d: element %lld is %.9g, the "
                 "MPI backend's %.9g",
                 zero, bucket, s, (long long)bad, bad >= 0 ? (double)out[bad] : 0.0,
                 bad >= 0 ? (double)ref->grads[s][bad] : 0.0);
        for (int64_t i = 0; i < NUMEL; i++)
            src[i] = param(s, i);
        GPU_TRY(qc_memcpy_async(G->cs, G->p, src, NUMEL * sizeof(float), QC_COPY_H2D));
        GPU_TRY(qc_dist_params_allgather(d, G->p));
        GPU_TRY(qc_memcpy_async(G->cs, out, G->p, NUMEL * sizeof(float), QC_COPY_D2H));
        GPU_TRY(qc_stream_synchronize(G->cs));
        qc_dist_step_end(d);
        bad = first_diff(out, src, NUMEL);
        T_EXPECT(bad < 0, "NCCL, ZeRO %d: parameter %lld changed by the all-gather", zero,
                 (long long)bad);
        small_collectives(d, s);
    }
    struct qc_dist_stats st;
done:
    qc_dist_stats_get(d, &st);
    T_EXPECT(st.steps == ref->stats.steps && st.bytes_reduced == ref->stats.bytes_reduced &&
                 st.bytes_sent == ref->stats.bytes_sent &&
                 st.scratch_bytes == ref->stats.scratch_bytes,
             "NCCL vs MPI statistics, ZeRO %d, bucket %zu: steps %lld / %lld, bytes reduced %llu "
             "/ %llu, sent %llu / %llu, scratch %llu / %llu",
             zero, bucket, (long long)st.steps, (long long)ref->stats.steps,
             (unsigned long long)st.bytes_reduced, (unsigned long long)ref->stats.bytes_reduced,
             (unsigned long long)st.bytes_sent, (unsigned long long)ref->stats.bytes_sent,
             (unsigned long long)st.scratch_bytes, (unsigned long long)ref->stats.scratch_bytes);
    qc_dist_destroy(d);
    free(src);
    free(out);
}

/* An address no allocation holds (below any mapping): NCCL's pointer check refuses it before
 * any device work, so the collective fails as a status. */
#define NOT_A_DEVICE_POINTER ((float *)(uintptr_t)0x10000)

static void nccl_error(struct gpu *G, int zero, const char *call)
{
    struct qc_dist_opts o = options(zero, 4096);
    o.backend = QC_DIST_NCCL;
    o.dev = G->dev;
    o.compute = G->cs;
    struct qc_dist *d = NULL;
    if (qc_dist_create(&o, &d) != QC_OK) {
        T_EXPECT(false, "qc_dist_create: %s", qc_error_last());
        return;
    }
    T_EXPECT(qc_dist_grads_begin(d, NOT_A_DEVICE_POINTER) == QC_OK, "begin: %s", qc_error_last());
    const enum qc_status st = qc_dist_grads_ready(d, 0, NUMEL);
    T_EXPECT(st == QC_ERR_CUDA, "ZeRO %d: a gradient buffer NCCL refuses: status %d (%s)", zero,
             (int)st, st == QC_OK ? "no error" : qc_error_last());
    if (st != QC_OK) {
        printf("  ZeRO %d, the refused buffer: %s\n", zero, qc_error_last());
        T_EXPECT_STR_CONTAINS(qc_error_last(), call);
        T_EXPECT_STR_CONTAINS(qc_error_last(), "invalid argument");
    }
    qc_dist_destroy(d); /* must come back (the error left nothing in flight) */
}

static void run_gpu(struct ref refs[NCONF])
{
    struct gpu G;
    if (!gpu_open(&G)) {
        gpu_close(&G);
        return;
    }
    QC_TEST ("dist nccl: world of one on the GPU: the MPI backend's results and statistics, bit "
             "for bit, ZeRO 0/1/2, three bucket sizes, settle, a step without reports") {
        for (int c = 0; c < NCONF && qc_test_st.failed_in_test == 0; c++)
            run_nccl(&G, c / 3, buckets[c % 3], &refs[c]);
    }
    QC_TEST ("dist nccl: an NCCL error comes back as a status naming the call; the communicator "
             "is destroyed and a new one works") {
        nccl_error(&G, 0, "dist: ncclAllReduce");
        nccl_error(&G, 2, "dist: ncclReduce");
        run_nccl(&G, 1, buckets[0], &refs[3]);
    }
    gpu_close(&G);
}

// ---- the worker and the test
// ----------------------------------------------------------------------

/* The world of one with MPI (src/dist: qc_dist_world_init_mpi). Declared weak so that this test
 * builds before src/dist has it: then it skips, naming what it waits for. */
__attribute__((weak)) enum qc_status qc_dist_world_init_mpi(void);

static int worker(bool gpu)
{
    if (gpu) {
        const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
        if (probe != 0)
            return probe;
        /* before the first NCCL communicator: NCCL reads it once per process */
        setenv("NCCL_CHECK_POINTERS", "1", 1);
    }
    if (!qc_dist_world_init_mpi) {
        printf("skip: src/dist cannot make a world of one rank with MPI yet "
               "(qc_dist_world_init_mpi, issue 28)\n");
        return 77;
    }
    if (qc_dist_world_init_mpi() != QC_OK) {
        printf("FATAL: qc_dist_world_init_mpi: %s\n", qc_error_last());
        return 1;
    }
    static struct ref refs[NCONF];
    QC_TEST ("dist nccl: world of one, MPI backend: every element its own contribution, shard = "
             "buffer, ZeRO 0/1/2, three bucket sizes, settle, a step without reports") {
        for (int c = 0; c < NCONF; c++)
            run_mpi(c / 3, buckets[c % 3], &refs[c]);
    }
    if (!gpu) {
        QC_TEST ("dist nccl: bad options and a NCCL communicator without a device are statuses "
                 "naming the problem; the process goes on") {
            errors_without_gpu();
        }
    } else {
        run_gpu(refs);
    }
    for (int c = 0; c < NCONF; c++)
        for (int s = 1; s <= STEPS; s++)
            free(refs[c].grads[s]);
    const int rc = qc_test_summary();
    qc_dist_world_end(0); /* MPI_Finalize (a failure is the test's exit code, not an abort) */
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "worker") == 0)
        return worker(strcmp(argv[2], "gpu") == 0);
    const bool cpu = argc == 2 && strcmp(argv[1], "cpu") == 0;
    if (argc > 2 || (argc == 2 && !cpu)) {
        fprintf(stderr, "usage: test_dist_nccl [cpu]\n");
        return 2;
    }
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        printf("FATAL: cannot read /proc/self/exe\n");
        return 1;
    }
    self[n] = '\0';
    char dir[128], log[256];
    snprintf(dir, sizeof dir, "/tmp/qctrain-test-dist-nccl-%d", (int)getpid());
    t_rm_rf(dir);
    mkdir(dir, 0755);
    snprintf(log, sizeof log, "%s/worker.log", dir);
    t_dist_mpi_env(); /* the worker: Open MPI as root, no leak check (Open MPI's own leaks) */
    struct t_args a = {.n = 0};
    t_args_add(&a, self);
    t_args_add(&a, "worker");
    t_args_add(&a, cpu ? "cpu" : "gpu");
    const int status = t_run(&a, log, NULL);
    char *out = t_read_file(log, NULL);
    fputs(out ? out : "(no output)\n", stdout);
    free(out);
    t_rm_rf(dir);
    if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77))
        return WEXITSTATUS(status);
    char b[64];
    printf("FAIL  the worker ended with %s\n", t_status_str(status, b, sizeof b));
    return 1;
}
