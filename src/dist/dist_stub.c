/*
 * dist_stub.c — the communicator in a build without MPI (QC_MPI=OFF): such a process is always
 * one rank (qc_dist_world_init refuses a launch of several), so no communicator is ever made.
 * Creation fails with a hint; the other entry points cannot be reached without one.
 */
#include "qc_dist.h"

#define UNREACHABLE() QC_ASSERT(false, "dist: no communicator in a build without MPI")

enum qc_status qc_dist_create(const struct qc_dist_opts *opts, struct qc_dist **out)
{
    (void)opts;
    (void)out;
    return qc_errorf(QC_ERR_UNSUPPORTED, "dist: this qctrain was built without MPI\nhint: "
                                         "rebuild with -DQC_MPI=ON for several ranks");
}

void qc_dist_destroy(struct qc_dist *d)
{
    (void)d;
}

void qc_dist_set_fail_hook(struct qc_dist *d, qc_dist_fail_fn fn, void *ctx)
{
    (void)d;
    (void)fn;
    (void)ctx;
}

int qc_dist_rank(const struct qc_dist *d)
{
    (void)d;
    return 0;
}

int qc_dist_size(const struct qc_dist *d)
{
    (void)d;
    return 1;
}

void qc_dist_my_shard(const struct qc_dist *d, int64_t *lo, int64_t *hi)
{
    (void)d;
    *lo = *hi = 0;
    UNREACHABLE();
}

enum qc_status qc_dist_check_same(struct qc_dist *d, const char *what, const char *text)
{
    (void)d;
    (void)what;
    (void)text;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

enum qc_status qc_dist_grads_begin(struct qc_dist *d, float *grads)
{
    (void)d;
    (void)grads;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

enum qc_status qc_dist_grads_ready(struct qc_dist *d, int64_t lo, int64_t hi)
{
    (void)d;
    (void)lo;
    (void)hi;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

enum qc_status qc_dist_grads_settle(struct qc_dist *d)
{
    (void)d;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

enum qc_status qc_dist_grads_end(struct qc_dist *d)
{
    (void)d;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

enum qc_status qc_dist_params_allgather(struct qc_dist *d, float *params)
{
    (void)d;
    (void)params;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

void qc_dist_step_end(struct qc_dist *d)
{
    (void)d;
}

void qc_dist_set_phase(struct qc_dist *d, const char *phase)
{
    (void)d;
    (void)phase;
    UNREACHABLE();
}

void qc_dist_wait_begin(struct qc_dist *d, const char *what)
{
    (void)d;
    (void)what;
    UNREACHABLE();
}

void qc_dist_wait_end(struct qc_dist *d)
{
    (void)d;
    UNREACHABLE();
}

enum qc_status qc_dist_allgather(struct qc_dist *d, const void *mine, size_t bytes, void *all)
{
    (void)d;
    (void)mine;
    (void)bytes;
    (void)all;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

enum qc_status qc_dist_bcast(struct qc_dist *d, void *buf, size_t bytes, int root)
{
    (void)d;
    (void)buf;
    (void)bytes;
    (void)root;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

enum qc_status qc_dist_gather_shards(struct qc_dist *d, const float *shard, float *full)
{
    (void)d;
    (void)shard;
    (void)full;
    UNREACHABLE();
    return QC_ERR_UNSUPPORTED;
}

void qc_dist_stats_get(struct qc_dist *d, struct qc_dist_stats *out)
{
    (void)d;
    *out = (struct qc_dist_stats){0};
}

void qc_dist_stats_reset(struct qc_dist *d)
{
    (void)d;
}
