/*
 * test_dist_comm.c — the communicator of src/dist with real ranks and its communication thread,
 * without the trainer, small and fast enough to run under ThreadSanitizer (label tsan; CI's tsan
 * step builds it with -fsanitize=thread). The test starts itself under mpirun
 * (`mpirun -np N test_dist_comm worker MODE`); each worker drives qc_dist.h the way the trainer
 * does, its main thread producing the gradients top down while the communication thread reduces
 * the pieces already reported:
 *   reduce   2 and 3 ranks, ZeRO 0, 1, 2, pieces of 4 KiB and one piece per region: every
 *            reduced element equals the rank-order float sum of the ranks' contributions, bit
 *            for bit; the parameter all-gather, the host all-gather, broadcast, shard gather
 *            and the agreement check give what every rank sent;
 *   busy     a rank whose main thread stays away for 2.5 dist.timeout while a peer waits on it
 *            is not taken for gone (its communication thread answers the heartbeats), nor for
 *            hung (the deadline on the waiting phase: one rank computes, so the wait may end);
 *   gone     a rank that stops (SIGSTOP) in the middle of a reduction is named by the waiting
 *            rank's watchdog ("dist: rank 1 (pid ...) went away") and the job ends non-zero;
 *   skip     a rank leaves out one all-gather and goes on to the step's reduction: both ranks
 *            live, each waiting on the other in another collective; the deadline ends the job
 *            within dist.timeout, naming the phase and the rank that had not arrived;
 *   device   a rank's main thread waits on its "device" (qc_dist_wait_begin, as the trainer's
 *            synchronisation waits for NCCL work) while the other waits on it in an all-gather:
 *            the deadline counts that wait too;
 *   one      a world of one rank (qc_dist_world_init_mpi): a wait of 5 dist.timeout on its
 *            device is no hang (no peer to wait on), and a step reduces to itself;
 *   barrier  the start-up barrier (qc_dist_world_barrier) passes with every rank, and names the
 *            rank that never arrives.
 * Open MPI's own TCP transport trips ThreadSanitizer (a lock-order report inside mca_btl_tcp);
 * the test runs the ranks over shared memory (OMPI_MCA_btl=self,vader), which is all one node
 * needs.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist_testlib.h"
#include "proc_testlib.h"
#include "qc_dist.h"
#include "testutil.h"

/* The deadline tests' bound on a whole job: dist.timeout (1 s) + 10 s, plus 20 s for mpirun to
 * start its ranks (seconds under ThreadSanitizer on a loaded 2-core machine). */
#define DEADLINE_LIMIT_S 31.0

#define NUMEL 40009 /* floats: three regions, pieces of 4 KiB, shards not multiples of it */

static const int64_t cuts[2] = {13001, 27003};

// ---- the worker (one rank) ----------------------------------------------------------------------

static int W, R; /* world size and this rank */

/* Rank r's gradient element i at step s: small integers times a power of two, of both signs,
 * so sums in float are exact only in a fixed order for some of them (the sum is checked bit for
 * bit against the rank-order sum). */
static float contrib(int r, int s, int64_t i)
{
    const uint64_t h = (uint64_t)i * 2654435761u + (uint64_t)r * 40503u + (uint64_t)s * 977u;
    return (float)((int)(h % 2001) - 1000) * 0.37f + (float)r * 1e-3f;
}

static float param(int s, int64_t i)
{
    return (float)(i % 97) * 0.25f - (float)s;
}

static int fails;

#define W_EXPECT(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: ", R);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

static void nap_us(long us)
{
    const struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static struct qc_dist *make(int zero, size_t bucket, double timeout_s)
{
    const struct qc_dist_opts o = {
        .backend = QC_DIST_MPI,
        .numel = NUMEL,
        .zero_stage = zero,
        .bucket_bytes = bucket,
        .timeout_s = timeout_s,
        .cuts = cuts,
        .ncuts = 2,
        .agreement = "model=tiny\nranks=same\n",
        .agreement_what = "the test set-up",
    };
    struct qc_dist *d = NULL;
    if (qc_dist_create(&o, &d) != QC_OK) {
        fprintf(stderr, "rank %d: qc_dist_create: %s\n", R, qc_error_last());
        exit(1);
    }
    return d;
}

/* One step's gradients: the main thread writes each region top down in two halves, reporting
 * each half as soon as it is written (with a pause now and then), while the communication
 * thread reduces what was reported. stall_s > 0: this rank stays away that long first. */
static void produce(struct qc_dist *d, float *g, int step, double stall_s)
{
    if (qc_dist_grads_begin(d, g) != QC_OK)
        exit(1);
    if (stall_s > 0)
        nap_us((long)(stall_s * 1e6));
    const int64_t bounds[4] = {0, cuts[0], cuts[1], NUMEL};
    for (int k = 3; k > 0; k--) {
        const int64_t lo = bounds[k - 1], hi = bounds[k], mid = lo + (hi - lo) / 2;
        const int64_t halves[3] = {lo, mid, hi};
        for (int h = 1; h >= 0; h--) {
            for (int64_t i = halves[h]; i < halves[h + 1]; i++)
                g[i] = contrib(R, step, i);
            if ((step + k + h + R) % 3 == 0)
                nap_us(300);
            if (qc_dist_grads_ready(d, halves[h], halves[h + 1]) != QC_OK)
                exit(1);
        }
    }
    if (qc_dist_grads_end(d) != QC_OK)
        exit(1);
}

static void check_reduced(struct qc_dist *d, const float *g, int zero, int step)
{
    int64_t lo = 0, hi = NUMEL;
    if (zero >= 2)
        qc_dist_my_shard(d, &lo, &hi);
    int64_t bad = -1;
    for (int64_t i = lo; i < hi && bad < 0; i++) {
        float e = contrib(0, step, i);
        for (int r = 1; r < W; r++)
            e = e + contrib(r, step, i);
        if (memcmp(&e, &g[i], sizeof e) != 0)
            bad = i;
    }
    W_EXPECT(bad < 0, "ZeRO %d step %d: element %lld is %.9g, the rank-order sum %.9g", zero, step,
             (long long)bad, bad >= 0 ? (double)g[bad] : 0.0,
             bad >= 0 ? (double)contrib(0, step, bad) : 0.0);
}

static void small_collectives(struct qc_dist *d, int step)
{
    int64_t mine = (int64_t)R * 1000 + step, all[8] = {0};
    W_EXPECT(qc_dist_allgather(d, &mine, sizeof mine, all) == QC_OK, "allgather");
    for (int r = 0; r < W; r++)
        W_EXPECT(all[r] == (int64_t)r * 1000 + step, "allgather slot %d: %lld", r,
                 (long long)all[r]);
    char word[16] = "";
    if (R == step % W)
        snprintf(word, sizeof word, "from %d", R);
    W_EXPECT(qc_dist_bcast(d, word, sizeof word, step % W) == QC_OK, "bcast");
    char want[16];
    snprintf(want, sizeof want, "from %d", step % W);
    W_EXPECT(strcmp(word, want) == 0, "bcast gave \"%s\"", word);
    /* every rank's shard of a buffer to rank 0 */
    int64_t lo, hi;
    qc_dist_my_shard(d, &lo, &hi);
    float *shard = malloc((size_t)(hi - lo + 1) * sizeof(float));
    float *full = R == 0 ? malloc(NUMEL * sizeof(float)) : NULL;
    for (int64_t i = lo; i < hi; i++)
        shard[i - lo] = param(step + 7, i);
    W_EXPECT(qc_dist_gather_shards(d, shard, full) == QC_OK, "gather");
    for (int64_t i = 0; full && i < NUMEL; i++)
        if (full[i] != param(step + 7, i)) {
            W_EXPECT(false, "gathered element %lld", (long long)i);
            break;
        }
    free(shard);
    free(full);
}

static void worker_reduce(void)
{
    float *g = malloc(NUMEL * sizeof(float));
    float *p = malloc(NUMEL * sizeof(float));
    const size_t buckets[2] = {4096, (size_t)NUMEL * 4};
    for (int zero = 0; zero <= 2; zero++)
        for (int b = 0; b < 2; b++) {
            struct qc_dist *d = make(zero, buckets[b], 20.0);
            for (int step = 1; step <= 6; step++) {
                produce(d, g, step, 0);
                check_reduced(d, g, zero, step);
                if (zero >= 1) { /* each rank's shard of new parameters, gathered everywhere */
                    int64_t lo, hi;
                    qc_dist_my_shard(d, &lo, &hi);
                    for (int64_t i = 0; i < NUMEL; i++)
                        p[i] = i >= lo && i < hi ? param(step, i) : -1.0f;
                    W_EXPECT(qc_dist_params_allgather(d, p) == QC_OK, "params");
                    for (int64_t i = 0; i < NUMEL; i++)
                        if (p[i] != param(step, i)) {
                            W_EXPECT(false, "ZeRO %d: parameter %lld not gathered", zero,
                                     (long long)i);
                            break;
                        }
                }
                qc_dist_step_end(d);
                small_collectives(d, step);
            }
            struct qc_dist_stats s;
            qc_dist_stats_get(d, &s);
            W_EXPECT(s.steps == 6 && s.bytes_reduced == 6u * NUMEL * 4, "stats: %lld steps",
                     (long long)s.steps);
            qc_dist_destroy(d);
        }
    free(g);
    free(p);
}

/* Rank 1 stays away 2.5 timeouts inside a step while the others wait on it. */
static void worker_busy(void)
{
    float *g = malloc(NUMEL * sizeof(float));
    const double timeout = 2.0;
    struct qc_dist *d = make(1, 4096, timeout);
    for (int step = 1; step <= 3; step++) {
        produce(d, g, step, R == 1 && step == 2 ? 2.5 * timeout : 0);
        check_reduced(d, g, 1, step);
        qc_dist_step_end(d);
    }
    qc_dist_destroy(d);
    free(g);
}

/* Rank 1 stops itself in the middle of step 2's reduction; the others' watchdog ends the job. */
static void worker_gone(void)
{
    float *g = malloc(NUMEL * sizeof(float));
    struct qc_dist *d = make(0, 4096, 1.0);
    for (int step = 1; step <= 3; step++) {
        if (R == 1 && step == 2) {
            if (qc_dist_grads_begin(d, g) != QC_OK ||
                qc_dist_grads_ready(d, cuts[1], NUMEL) != QC_OK)
                exit(1);
            raise(SIGSTOP); /* mpirun kills it once the job is aborted (SIGCONT first) */
            _exit(1);
        }
        produce(d, g, step, 0);
        qc_dist_step_end(d);
    }
    fprintf(stderr, "rank %d: the job went on without rank 1\n", R);
    exit(1);
}

/* Rank 1 leaves out the second all-gather and goes on to the step's reduction. */
static void worker_skip(void)
{
    float *g = malloc(NUMEL * sizeof(float));
    struct qc_dist *d = make(0, 4096, 1.0);
    int64_t mine = R, all[8] = {0};
    produce(d, g, 1, 0);
    qc_dist_set_phase(d, "the test's exchange");
    for (int k = 0; k < 2; k++)
        if (R != 1 || k != 1)
            W_EXPECT(qc_dist_allgather(d, &mine, sizeof mine, all) == QC_OK, "allgather");
    produce(d, g, 2, 0); /* rank 0 never gets here */
    fprintf(stderr, "rank %d: the job went on past the skipped collective\n", R);
    exit(1);
}

/* Rank 0's main thread "waits on its device" and never comes back; rank 1 waits on it. */
static void worker_device(void)
{
    struct qc_dist *d = make(0, 4096, 1.0);
    int64_t mine = R, all[8] = {0};
    if (R == 0) {
        qc_dist_wait_begin(d, "the test's device");
        for (;;)
            nap_us(100000); /* the deadline ends the job */
    }
    qc_dist_set_phase(d, "the test's exchange");
    W_EXPECT(qc_dist_allgather(d, &mine, sizeof mine, all) == QC_OK, "allgather");
    fprintf(stderr, "rank %d: the job went on without rank 0\n", R);
    exit(1);
}

/* Rank 1 never arrives at the start-up barrier. */
static void worker_barrier(void)
{
    if (R == 1)
        raise(SIGSTOP);
    const enum qc_status st = qc_dist_world_barrier(1.0, "waiting in the test");
    W_EXPECT(st != QC_OK, "the barrier passed without rank 1");
    fprintf(stderr, "rank %d: %s\n", R, qc_error_last());
    qc_dist_world_end(1);
}

/* A world of one (qc_dist_world_init_mpi): the main thread waits on its "device" for 5
 * dist.timeout; with no peer to wait on that is never a hang. Then a step reduces to itself. */
static int worker_one(void)
{
    if (qc_dist_world_init_mpi() != QC_OK) {
        fprintf(stderr, "qc_dist_world_init_mpi: %s\n", qc_error_last());
        return 1;
    }
    W = qc_dist_world_size();
    R = qc_dist_world_rank();
    W_EXPECT(W == 1, "a world of %d", W);
    float *g = malloc(NUMEL * sizeof(float));
    struct qc_dist *d = make(0, 4096, 0.2);
    qc_dist_wait_begin(d, "the test's device");
    nap_us(1000000);
    qc_dist_wait_end(d);
    produce(d, g, 1, 0);
    check_reduced(d, g, 0, 1);
    qc_dist_step_end(d);
    qc_dist_destroy(d);
    free(g);
    if (fails == 0)
        fprintf(stderr, "worker one: 1 rank ok\n");
    qc_dist_world_end(fails ? 1 : 0);
    return fails ? 1 : 0;
}

static int worker(const char *mode)
{
    if (strcmp(mode, "one") == 0)
        return worker_one();
    if (qc_dist_world_init() != QC_OK) {
        fprintf(stderr, "qc_dist_world_init: %s\n", qc_error_last());
        return 1;
    }
    W = qc_dist_world_size();
    R = qc_dist_world_rank();
    if (W < 2 || W > 8) {
        fprintf(stderr, "worker: %d ranks\n", W);
        return 1;
    }
    if (strcmp(mode, "barrier") == 0) {
        worker_barrier();
        return 1;
    }
    W_EXPECT(qc_dist_world_barrier(60, "starting") == QC_OK, "barrier: %s", qc_error_last());
    if (strcmp(mode, "reduce") == 0)
        worker_reduce();
    else if (strcmp(mode, "busy") == 0)
        worker_busy();
    else if (strcmp(mode, "gone") == 0)
        worker_gone();
    else if (strcmp(mode, "skip") == 0)
        worker_skip();
    else if (strcmp(mode, "device") == 0)
        worker_device();
    else
        W_EXPECT(false, "unknown mode %s", mode);
    if (fails == 0 && R == 0)
        fprintf(stderr, "worker %s: %d ranks ok\n", mode, W);
    qc_dist_world_end(fails ? 1 : 0);
    return fails ? 1 : 0;
}

// ---- the test -----------------------------------------------------------------------------------

static char self[4096];
static char tmp_root[256];

static bool ended(void *job)
{
    return t_ended(*(pid_t *)job);
}

/* mpirun -np N self worker MODE; its wait status (-1: not ended within limit_s, killed) and
 * output (malloc'd). */
static int job(int np, const char *mode, double limit_s, char **out)
{
    char npbuf[16], log[512];
    snprintf(npbuf, sizeof npbuf, "%d", np);
    snprintf(log, sizeof log, "%s/%s-%d.log", tmp_root, mode, np);
    unlink(log);
    struct t_args a = {.n = 0};
    const char *argv[] = {QC_MPIEXEC, "--oversubscribe", "-np", npbuf, self, "worker", mode};
    for (size_t i = 0; i < sizeof argv / sizeof argv[0]; i++)
        t_args_add(&a, argv[i]);
    pid_t pid = t_spawn(&a, log, NULL, 600);
    int status = -1;
    if (t_poll(ended, &pid, -1, (long)(limit_s * 1000))) {
        status = t_wait(pid);
    } else {
        for (int r = 0; r < np; r++) {
            const pid_t p = t_rank_pid(pid, r);
            if (p > 0)
                kill(p, SIGKILL);
        }
        kill(pid, SIGKILL);
        t_wait(pid);
    }
    for (int r = 0; r < np; r++) { /* a stopped rank mpirun left behind */
        const pid_t p = t_rank_pid(pid, r);
        if (p > 0)
            kill(p, SIGKILL);
    }
    *out = t_read_file(log, NULL);
    if (!*out)
        *out = calloc(1, 1);
    char b[64];
    printf("  %s, %d ranks: %s\n", mode, np,
           status < 0 ? "hung" : t_status_str(status, b, sizeof b));
    return status;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "worker") == 0)
        return worker(argv[2]);
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        T_FATAL("cannot read /proc/self/exe");
    self[n] = '\0';
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-dist-comm-%d", (int)getpid());
    t_rm_rf(tmp_root);
    mkdir(tmp_root, 0755);
    t_dist_mpi_env();
    setenv("OMPI_MCA_btl", "self,vader", 0);
    char *out = NULL;

    QC_TEST ("comm: bucket reductions in rank order while the main thread produces the "
             "gradients, ZeRO 0/1/2, 2 and 3 ranks") {
        for (int np = 2; np <= 3; np++) {
            const int st = job(np, "reduce", 400, &out);
            T_EXPECT(t_exited(st, 0), "%d ranks:\n%s", np, out);
            T_EXPECT_STR_CONTAINS(out, "worker reduce");
            free(out);
        }
    }
    QC_TEST ("comm: a rank away for 2.5 x dist.timeout is not taken for gone (heartbeats) nor "
             "for hung (the deadline)") {
        const int st = job(2, "busy", 400, &out);
        T_EXPECT(t_exited(st, 0), "busy:\n%s", out);
        T_EXPECT(strstr(out, "went away") == NULL, "a busy rank was taken for gone:\n%s", out);
        T_EXPECT(strstr(out, "no rank can go on") == NULL, "a busy rank was taken for hung:\n%s",
                 out);
        free(out);
    }
    QC_TEST ("comm: live ranks waiting in different collectives: the deadline ends the job, "
             "naming the phase and the rank that had not arrived") {
        /* within dist.timeout (1 s) + 10 s, plus the start of mpirun and its ranks */
        const int st = job(2, "skip", DEADLINE_LIMIT_S, &out);
        T_EXPECT(st >= 0 && !t_exited(st, 0), "skip: the job did not fail (or hung):\n%s", out);
        T_EXPECT(strstr(out, "went on") == NULL, "%s", out);
        /* whichever rank's deadline fires first: rank 0 waits in the exchange for rank 1, which
         * waits in the reduction for rank 0 */
        const char *m0 = strstr(out, "rank 0 of 2: dist: no rank can go on: rank 0 has waited");
        const char *m1 = strstr(out, "rank 1 of 2: dist: no rank can go on: rank 1 has waited");
        T_EXPECT(m0 || m1, "no deadline message:\n%s", out);
        const char *m = m0 ? m0 : m1;
        if (m) {
            T_EXPECT(strstr(m, m0 ? "at step 1 in \"the test's exchange\""
                                  : "at step 2 in \"reducing gradients\"") != NULL &&
                         strstr(m, m0 ? "for rank 1, which had not arrived; rank 1 waits at step 2 "
                                        "in \"reducing gradients\""
                                      : "for rank 0, which had not arrived; rank 0 waits at step 1 "
                                        "in \"the test's exchange\"") != NULL &&
                         strstr(m, "hint: ") != NULL,
                     "the message names the wrong phase or rank:\n%s", out);
        }
        free(out);
    }
    QC_TEST ("comm: a rank waiting on its device counts for the deadline") {
        const int st = job(2, "device", DEADLINE_LIMIT_S, &out);
        T_EXPECT(st >= 0 && !t_exited(st, 0), "device: the job did not fail (or hung):\n%s", out);
        T_EXPECT(strstr(out, "went on") == NULL, "%s", out);
        const char *m0 = strstr(out, "rank 0 of 2: dist: no rank can go on: rank 0 has waited");
        const char *m1 = strstr(out, "rank 1 of 2: dist: no rank can go on: rank 1 has waited");
        T_EXPECT(m0 || m1, "no deadline message:\n%s", out);
        const char *m = m0 ? m0 : m1;
        if (m)
            T_EXPECT(strstr(m, m0 ? "at step 0 on the test's device; rank 1 waits at step 0 in "
                                    "\"the test's exchange\""
                                  : "at step 0 in \"the test's exchange\"") != NULL &&
                         (m0 || strstr(m, "for rank 0, which had not arrived; rank 0 waits at "
                                          "step 0 on the test's device") != NULL),
                     "the message names the wrong wait or rank:\n%s", out);
        free(out);
    }
    QC_TEST ("comm: a world of one: a long wait on its device is no hang") {
        const int st = job(1, "one", DEADLINE_LIMIT_S, &out);
        T_EXPECT(t_exited(st, 0), "one:\n%s", out);
        T_EXPECT_STR_CONTAINS(out, "worker one: 1 rank ok");
        free(out);
    }
    QC_TEST ("comm: a rank stopped inside a reduction is named by the watchdog; the job ends") {
        const int st = job(2, "gone", 400, &out);
        T_EXPECT(st >= 0 && !t_exited(st, 0), "gone: the job did not fail");
        T_EXPECT(strstr(out, "dist: rank 1 (pid") && strstr(out, "went away"),
                 "no 'dist: rank 1 (pid ...) went away':\n%s", out);
        T_EXPECT(strstr(out, "the job went on") == NULL, "%s", out);
        free(out);
    }
    QC_TEST ("comm: the start-up barrier names a rank that never arrives") {
        const int st = job(2, "barrier", 400, &out);
        T_EXPECT(st >= 0 && !t_exited(st, 0), "barrier: the job did not fail");
        T_EXPECT_STR_CONTAINS(out, "dist: rank 1 did not arrive within dist.timeout (1 s) while "
                                   "rank 0 was waiting in the test");
        free(out);
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
