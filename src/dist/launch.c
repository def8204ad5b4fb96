/*
 * launch.c — how this process was started (the launcher's environment) and the process's world
 * of ranks: MPI is initialised only when a launcher started more than one rank, so a plain
 * `qctrain train` never touches MPI.
 *
 * Environment, first match wins:
 *   mpirun (Open MPI)   OMPI_COMM_WORLD_SIZE / _RANK / _LOCAL_RANK / _LOCAL_SIZE
 *   Hydra / PMI-1/2     PMI_SIZE / PMI_RANK (local: MPI_LOCALRANKID / MPI_LOCALNRANKS)
 *   srun                SLURM_STEP_NUM_TASKS / SLURM_PROCID / SLURM_LOCALID (set for job steps,
 *                       not in the batch script itself, so `qctrain` run by sbatch is one rank)
 *   PMIx                PMIX_RANK without a size: MPI_Init tells the size
 */
#include "qc_dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef QC_HAVE_MPI
#    include "dist_internal.h" /* mpi.h, dist_mpi_check */
#endif
#if defined(QC_HAVE_CUDA) && defined(QC_HAVE_MPI)
#    include <nccl.h> /* NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH */
#endif

// ---- the launcher's environment ----------------------------------------------------------------

/* A non-negative integer environment variable, or -1. */
static int env_int(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return -1;
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1 << 30)
        return -1;
    return (int)x;
}

void qc_dist_launch_detect(struct qc_dist_launch *out)
{
    memset(out, 0, sizeof(*out));
    out->size = 1;
    out->local_size = 1;
    out->launcher = "none";
    out->size_known = true;
    static const struct {
        const char *launcher, *size, *rank, *local_rank, *local_size;
    } kinds[] = {
        {"mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"pmi", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        {"srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", NULL},
    };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        const int size = env_int(kinds[i].size);
        const int rank = env_int(kinds[i].rank);
        if (size < 1 || rank < 0 || rank >= size)
            continue;
        out->launcher = kinds[i].launcher;
        out->size = size;
        out->rank = rank;
        const int lr = env_int(kinds[i].local_rank);
        const int ls = kinds[i].local_size ? env_int(kinds[i].local_size) : -1;
        out->local_rank = lr >= 0 ? lr : 0;
        out->local_size = ls > out->local_rank ? ls : out->local_rank + 1;
        return;
    }
    if (env_int("PMIX_RANK") >= 0) {
        out->launcher = "pmi";
        out->rank = env_int("PMIX_RANK");
        out->size_known = false;
    }
}

// ---- the world ---------------------------------------------------------------------------------

static struct {
    bool init_done;
    bool mpi_up;         /* this module called MPI_Init_thread */
    bool failure_agreed; /* qc_dist_world_failure_agreed: end a failure with MPI_Finalize */
    int rank, size;
    int local_rank, local_size; /* on this node (MPI_COMM_TYPE_SHARED); 0 and 1 without MPI */
    const char *launcher;
} world = {.size = 1, .local_size = 1, .launcher = "none"};

static enum qc_status world_init(bool mpi_for_one)
{
    if (world.init_done)
        return mpi_for_one && !world.mpi_up
                   ? qc_errorf(QC_ERR_INVALID, "dist: qc_dist_world_init_mpi after "
                                               "qc_dist_world_init made a world without MPI")
                   : QC_OK;
    struct qc_dist_launch l;
    qc_dist_launch_detect(&l);
    world.launcher = l.launcher;
    world.rank = 0;
    world.size = 1;
    world.local_rank = 0;
    world.local_size = 1;
    if (l.size_known && l.size <= 1 && !mpi_for_one) {
        world.init_done = true;
        return QC_OK; /* one rank: MPI is not needed, and not initialised */
    }
#ifdef QC_HAVE_MPI
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "dist: MPI_Init_thread failed (error %d) under %s\nhint: is this "
                         "qctrain's MPI (`qctrain version`) the one of the launcher?",
                         rc, l.launcher);
    world.mpi_up = true;
    if (provided < MPI_THREAD_SERIALIZED) {
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "dist: the MPI library gives thread level %d, qctrain needs "
                         "MPI_THREAD_SERIALIZED (%d): a communication thread makes the calls\n"
                         "hint: use an MPI built with thread support (Open MPI is)",
                         provided, MPI_THREAD_SERIALIZED);
    }
    QC_TRY(dist_mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank), "MPI_Comm_rank"));
    QC_TRY(dist_mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &world.size), "MPI_Comm_size"));
    /* the ranks of this node: those that can share memory with this one (MPI's own answer, not
     * the launcher's, which srun and PMIx do not always give); ordered by world rank */
    MPI_Comm node;
    QC_TRY(dist_mpi_check(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)"));
    enum qc_status st = dist_mpi_check(MPI_Comm_rank(node, &world.local_rank), "MPI_Comm_rank");
    if (st == QC_OK)
        st = dist_mpi_check(MPI_Comm_size(node, &world.local_size), "MPI_Comm_size");
    const enum qc_status fst = dist_mpi_check(MPI_Comm_free(&node), "MPI_Comm_free");
    QC_TRY(st);
    QC_TRY(fst);
    world.init_done = true;
    return QC_OK;
#else
    if (mpi_for_one)
        return qc_errorf(QC_ERR_UNSUPPORTED, "dist: a world of one rank with MPI needs a build "
                                             "with MPI (QC_MPI=ON)");
    return qc_errorf(QC_ERR_UNSUPPORTED,
                     "dist: %s started %d ranks, but this qctrain was built without MPI "
                     "(QC_MPI=OFF)\nhint: rebuild with -DQC_MPI=ON (apt-get install "
                     "libopenmpi-dev openmpi-bin), or run one rank without a launcher",
                     l.launcher, l.size);
#endif
}

enum qc_status qc_dist_world_init(void)
{
    return world_init(false);
}

enum qc_status qc_dist_world_init_mpi(void)
{
    return world_init(true);
}

int qc_dist_world_rank(void)
{
    return world.rank;
}

int qc_dist_world_size(void)
{
    return world.size;
}

int qc_dist_world_local_rank(void)
{
    return world.local_rank;
}

int qc_dist_world_local_size(void)
{
    return world.local_size;
}

const char *qc_dist_world_launcher(void)
{
    return world.launcher;
}

void qc_dist_world_failure_agreed(void)
{
    world.failure_agreed = true;
}

void qc_dist_world_end(int exit_code)
{
#ifdef QC_HAVE_MPI
    if (!world.mpi_up)
        return;
    world.mpi_up = false;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return;
    if (exit_code != 0 && !world.failure_agreed) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, exit_code); /* ends every rank; does not return */
    }
    MPI_Finalize();
#else
    (void)exit_code;
#endif
}

#ifdef QC_HAVE_MPI
enum qc_status dist_mpi_check(int rc, const char *call)
{
    if (rc == MPI_SUCCESS)
        return QC_OK;
    char es[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, es, &len);
    return qc_errorf(QC_ERR_IO, "dist: %s failed: %s", call, es);
}

double dist_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polls the n requests until all are done (*late = -1), or until timeout_s has passed (*late:
 * the first one not done). */
static enum qc_status wait_all_until(MPI_Request *reqs, int n, double timeout_s, int *late)
{
    struct timespec t0, ts;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long sleep_us = 10;
    *late = -1;
    for (;;) {
        int done = 0;
        QC_TRY(dist_mpi_check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall"));
        if (done)
            return QC_OK;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if ((double)(ts.tv_sec - t0.tv_sec) + 1e-9 * (double)(ts.tv_nsec - t0.tv_nsec) > timeout_s)
            break;
        const struct timespec nap = {0, sleep_us * 1000};
        nanosleep(&nap, NULL);
        sleep_us = sleep_us * 2 > 1000 ? 1000 : sleep_us * 2;
    }
    for (int i = 0; i < n && *late < 0; i++) {
        int flag = 0;
        QC_TRY(dist_mpi_check(MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE), "MPI_Test"));
        if (!flag)
            *late = i;
    }
    return QC_OK;
}

/* Rank 0's side: hears from every rank, then releases them; a rank late or gone is named. */
static enum qc_status barrier_root(MPI_Request *reqs, int *tokens, double timeout_s,
                                   const char *what)
{
    const int W = world.size;
    int late = -1;
    for (int q = 1; q < W; q++)
        QC_TRY(dist_mpi_check(
            MPI_Irecv(&tokens[q], 1, MPI_INT, q, DIST_TAG_BARRIER, MPI_COMM_WORLD, &reqs[q - 1]),
            "MPI_Irecv"));
    QC_TRY(wait_all_until(reqs, W - 1, timeout_s, &late));
    if (late >= 0)
        return qc_errorf(QC_ERR_IO,
                         "dist: rank %d did not arrive within dist.timeout (%.3g s) while rank "
                         "0 was %s; it was killed, ran out of memory, stopped or hangs\nhint: "
                         "its own output or the launcher's says why; if it is only slow, raise "
                         "dist.timeout",
                         late + 1, timeout_s, what);
    for (int q = 1; q < W; q++)
        QC_TRY(dist_mpi_check(
            MPI_Isend(&tokens[0], 1, MPI_INT, q, DIST_TAG_BARRIER, MPI_COMM_WORLD, &reqs[q - 1]),
            "MPI_Isend"));
    QC_TRY(wait_all_until(reqs, W - 1, timeout_s, &late));
    if (late >= 0)
        return qc_errorf(QC_ERR_IO,
                         "dist: rank %d did not take rank 0's release within dist.timeout "
                         "(%.3g s) after rank 0 was %s",
                         late + 1, timeout_s, what);
    return QC_OK;
}

/* Every other rank's side: tells rank 0 it is here, waits for the release. */
static enum qc_status barrier_leaf(MPI_Request *reqs, int *tokens, double timeout_s,
                                   const char *what)
{
    int late = -1;
    QC_TRY(dist_mpi_check(
        MPI_Isend(&tokens[1], 1, MPI_INT, 0, DIST_TAG_BARRIER, MPI_COMM_WORLD, &reqs[0]),
        "MPI_Isend"));
    QC_TRY(dist_mpi_check(
        MPI_Irecv(&tokens[0], 1, MPI_INT, 0, DIST_TAG_BARRIER, MPI_COMM_WORLD, &reqs[1]),
        "MPI_Irecv"));
    QC_TRY(wait_all_until(reqs, 2, timeout_s, &late));
    if (late >= 0)
        return qc_errorf(QC_ERR_IO,
                         "dist: rank 0 did not answer within dist.timeout (%.3g s) while it "
                         "was %s; it was killed, ran out of memory, stopped or hangs\nhint: its "
                         "own output or the launcher's says why; if it is only slow, raise "
                         "dist.timeout",
                         timeout_s, what);
    return QC_OK;
}
#endif

enum qc_status qc_dist_world_barrier(double timeout_s, const char *what)
{
#ifdef QC_HAVE_MPI
    if (!world.mpi_up || world.size < 2)
        return QC_OK;
    const size_t W = (size_t)world.size;
    MPI_Request *reqs = calloc(W, sizeof(*reqs));
    int *tokens = calloc(W, sizeof(int));
    enum qc_status st = QC_OK;
    if (!reqs || !tokens)
        st = qc_errorf(QC_ERR_NOMEM, "dist: out of memory");
    else if (world.rank == 0)
        st = barrier_root(reqs, tokens, timeout_s, what);
    else
        st = barrier_leaf(reqs, tokens, timeout_s, what);
    if (st == QC_OK || !reqs || !tokens) {
        free(reqs);
        free(tokens);
    } /* else requests may still be pending on them: kept, as the process ends the job */
    return st;
#else
    (void)timeout_s;
    (void)what;
    return QC_OK;
#endif
}

size_t qc_dist_build_info(char *buf, size_t n)
{
    int k = 0;
#if defined(QC_HAVE_MPI) && defined(OMPI_MAJOR_VERSION)
    k = snprintf(buf, n, "mpi: yes (Open MPI %d.%d.%d, MPI %d.%d)\n", OMPI_MAJOR_VERSION,
                 OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION, MPI_VERSION, MPI_SUBVERSION);
#elif defined(QC_HAVE_MPI)
    k = snprintf(buf, n, "mpi: yes (MPI %d.%d)\n", MPI_VERSION, MPI_SUBVERSION);
#else
    k = snprintf(buf, n, "mpi: no\n");
#endif
    if (k < 0)
        return 0;
    const size_t used = (size_t)k < n ? (size_t)k : (n ? n - 1 : 0);
    int k2 = 0;
#if defined(QC_HAVE_CUDA) && defined(QC_HAVE_MPI)
    k2 = snprintf(n ? buf + used : NULL, n ? n - used : 0, "nccl: yes (%d.%d.%d)\n", NCCL_MAJOR,
                  NCCL_MINOR, NCCL_PATCH);
#else
    k2 = snprintf(n ? buf + used : NULL, n ? n - used : 0, "nccl: no\n");
#endif
    return (size_t)k + (k2 > 0 ? (size_t)k2 : 0);
}
