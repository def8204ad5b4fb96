/*
 * train_dist.c — data-parallel training on the trainer's side (train_dist.h): the world and
 * its checks, the communicator and the model's grads-ready callback, the sharded optimizer,
 * one step's reduction and the combination of the ranks' figures, checkpoints written by rank 0
 * from gathered moments, and every rank's bytes for the memory report.
 */
#include "train_dist.h"
#include "train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qc_batch.h"
#include "qc_device.h"
#include "qc_dist.h"
#include "qc_exec.h"

/* The step's exchange (train_dist_combine): the record of a rank, in doubles: its head, then its
 * groups' 4 losses each. */
enum {
    REC_NLOCAL = 0, /* groups of the step */
    REC_SCENES,
    REC_GROUPS_RAN, /* its groups in which a scene ran */
    REC_SECONDS,    /* forward + backward time */
    REC_EDGES,
    REC_STOP,     /* the graceful-stop signal it received, or 0 */
    REC_BAD_GRAD, /* its first non-finite reduced gradient element, or -1 */
    REC_FAILED,   /* its step failed (the qc_status), or 0 */
    RECORD_HEAD
};

struct train_dist {
    struct qc_dist *d;
    struct qc_train_backend *be;
    struct qc_qcnet *model;
    int rank, world;
    int64_t G; /* groups per rank per step (train.grad_accum) */
    int zero_stage;
    bool armed;       /* the grads-ready callback forwards to the communicator */
    bool held;        /* ... except while held (a split group's earlier parts) */
    int64_t reported; /* the lowest offset forwarded this step (numel: none) */
    int64_t numel;
    int64_t arms;              /* steps armed so far (the current step's number once armed) */
    int64_t fault_step;        /* QC_FAULT_OOM_AFTER_REPORT: 0 = off */
    enum qc_status cb_status;  /* first failure inside the callback */
    struct qc_stream *compute; /* device backends: where the compute clock is read */
    double t_begin, t_end;     /* the step's compute clock (host functions on CUDA) */
    double *gather;            /* (world * record) the step's combine exchange */
    size_t record;             /* doubles per rank in it */
    int64_t step;              /* the step being computed (1-based) */
    float *grads;              /* the gradients being reduced (armed) */
    struct {                   /* test hook QC_FAULT_NAN_GRAD=R:S:I (fault_nan_parse) */
        bool on, pending;
        int rank;
        int64_t step, elem;
    } nan;
    int64_t skip_combine_step; /* test hook QC_FAULT_SKIP_COLLECTIVE=R:S on rank R: S; else 0 */
    double wait_seen;          /* the gradient reduction's wait already reported in a step's
                                  figures, s (train_dist_step_figures) */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- the world ---------------------------------------------------------------------------------

enum qc_status train_dist_world(struct qc_config *cfg, int *rank, int *world)
{
    QC_TRY(qc_dist_world_init());
    const int W = qc_dist_world_size(), r = qc_dist_world_rank();
    const char *launcher = qc_dist_world_launcher();
    if (cfg->world_size != 0 && cfg->world_size != W) {
        if (W == 1)
            return qc_errorf(QC_ERR_INVALID,
                             "dist.world_size is %lld but qctrain was started as one rank (no "
                             "mpirun or srun)\nhint: mpirun -np %lld build/qctrain train ... (or "
                             "srun -n %lld), or --set dist.world_size=1 (0: whatever the "
                             "launcher starts)",
                             (long long)cfg->world_size, (long long)cfg->world_size,
                             (long long)cfg->world_size);
        return qc_errorf(QC_ERR_INVALID,
                         "dist.world_size is %lld but %s started %d ranks\nhint: launch %lld "
                         "ranks, or --set dist.world_size=%d (0: whatever the launcher starts)",
                         (long long)cfg->world_size, launcher, W, (long long)cfg->world_size, W);
    }
    cfg->world_size = W;
    /* ranks other than 0 stay quiet unless they fail (docs/DISTRIBUTED.md): their info lines
     * (the offload tier, the planner's measured copies) would repeat rank 0's; warnings and
     * errors still show, and log.level=debug shows everything */
    if (r != 0 && qc_log_get_level() == QC_LOG_INFO)
        qc_log_set_level(QC_LOG_WARN);
    if (W > 1 && cfg->device_kind == QC_CONFIG_DEVICE_EMU)
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "device.kind emu runs one rank (the emulated device is a test backend)"
                         "\nhint: --device cpu under mpirun");
    if (W > 1 && cfg->device_kind == QC_CONFIG_DEVICE_CUDA) {
        /* one GPU per rank of the node: device.ordinal + the node-local rank, wrapped over the
         * GPUs this process sees (srun --gpus-per-task=1 shows each rank its own GPU only; more
         * ranks than GPUs share them, which NCCL refuses with a message of its own) */
        const int ngpu = qc_device_cuda_count();
        const int64_t want = cfg->device_ordinal + qc_dist_world_local_rank();
        cfg->device_ordinal = ngpu > 0 ? want % ngpu : want;
    }
    *rank = r;
    *world = W;
    return QC_OK;
}

void train_dist_resolve(struct qc_config *cfg, const struct qc_config *saved)
{
    if (cfg->balance != QC_BALANCE_AUTO)
        return;
    if (saved && saved->balance != QC_BALANCE_AUTO)
        cfg->balance = saved->balance;
    else
        cfg->balance = cfg->world_size > 1 ? QC_BALANCE_COST : QC_BALANCE_NONE;
}

/* Appends "key=value\n" to a growing string. */
static bool text_add(char **buf, size_t *len, size_t *cap, const char *key, const char *value)
{
    const size_t need = strlen(key) + strlen(value) + 3;
    if (*len + need > *cap) {
        size_t nc = *cap ? 2 * *cap : 4096;
        while (nc < *len + need)
            nc *= 2;
        char *p = realloc(*buf, nc);
        if (!p)
            return false;
        *buf = p;
        *cap = nc;
    }
    *len += (size_t)snprintf(*buf + *len, *cap - *len, "%s=%s\n", key, value);
    return true;
}

enum qc_status train_dist_run_dir_barrier(const struct qc_config *cfg, const char *run_dir)
{
    char what[4200];
    snprintf(what, sizeof what, "taking the run folder %s and recovering it", run_dir);
    return qc_dist_world_barrier(cfg->dist_timeout, what);
}

char *train_dist_agreement_text(const struct qc_config *cfg, const struct qc_train_opts *opts,
                                const char *resume_ckpt)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (int i = 0; ok && i < qc_config_option_count(); i++) {
        const struct qc_config_option *o = qc_config_option_at(i);
        if (strcmp(o->key, "train.out_dir") == 0)
            continue; /* rank 0's alone is used (it writes the run folder) */
        char v[QC_CONFIG_STR_MAX + 64];
        qc_config_format_value(cfg, o, v, sizeof(v));
        ok = text_add(&buf, &len, &cap, o->key, v);
    }
    for (int i = 0; ok && i < opts->ndata; i++)
        ok = text_add(&buf, &len, &cap, "--data", opts->data[i]);
    for (int i = 0; ok && i < opts->nval; i++)
        ok = text_add(&buf, &len, &cap, "--val-data", opts->val_data[i]);
    char num[32];
    snprintf(num, sizeof(num), "%" PRId64, opts->eval_every);
    ok = ok && text_add(&buf, &len, &cap, "--eval-every", num);
    ok = ok && text_add(&buf, &len, &cap, "--resume", opts->resume ? opts->resume : "");
    ok = ok && text_add(&buf, &len, &cap, "the resumed checkpoint", resume_ckpt);
    ok = ok && text_add(&buf, &len, &cap, "--init-from", opts->init_from ? opts->init_from : "");
    if (!ok) {
        free(buf);
        return NULL;
    }
    return buf;
}

// ---- the communicator
// ----------------------------------------------------------------------------

/* Test hook (docs/RELIABILITY.md): QC_FAULT_NAN_GRAD=R:S:I makes rank R put a NaN into element
 * I of its own gradients of step S just before they start reducing, so one rank's contribution
 * is non-finite (CPU backend: the gradients are host memory). */
static enum qc_status fault_nan_parse(struct train_dist *td, const struct qc_config *cfg,
                                      int64_t numel)
{
    const char *e = getenv("QC_FAULT_NAN_GRAD");
    if (!e || !*e)
        return QC_OK;
    long long r = -1, s = -1, i = -1;
    char tail = 0;
    if (sscanf(e, "%lld:%lld:%lld%c", &r, &s, &i, &tail) != 3 || r < 0 || s < 1 || i < 0 ||
        i >= numel)
        return qc_errorf(QC_ERR_INVALID,
                         "QC_FAULT_NAN_GRAD=%s: want RANK:STEP:ELEMENT (element < %lld)", e,
                         (long long)numel);
    if (cfg->device_kind != QC_CONFIG_DEVICE_CPU)
        return qc_errorf(QC_ERR_UNSUPPORTED, "QC_FAULT_NAN_GRAD is a test hook of the CPU backend");
    td->nan.on = r == td->rank;
    td->nan.rank = (int)r;
    td->nan.step = s;
    td->nan.elem = i;
    return QC_OK;
}

/* Test hook (docs/RELIABILITY.md): QC_FAULT_SKIP_COLLECTIVE=R:S makes rank R leave out step S's
 * exchange of losses (train_dist_combine: it takes its own figures for the step's) and go on,
 * so the others wait in that exchange while it waits in its next collective: live ranks in
 * different collectives, which the deadline on the waiting phase ends. */
static enum qc_status fault_skip_parse(struct train_dist *td)
{
    const char *e = getenv("QC_FAULT_SKIP_COLLECTIVE");
    if (!e || !*e)
        return QC_OK;
    long long r = -1, s = -1;
    char tail = 0;
    if (sscanf(e, "%lld:%lld%c", &r, &s, &tail) != 2 || r < 0 || r >= td->world || s < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "QC_FAULT_SKIP_COLLECTIVE=%s: want RANK:STEP (rank < %d, step >= 1)", e,
                         td->world);
    td->skip_combine_step = r == td->rank ? s : 0;
    return QC_OK;
}

/* The hook's NaN, when [lo, hi) holds its element and is about to start reducing. */
static void fault_nan_apply(struct train_dist *td, int64_t lo, int64_t hi)
{
    if (td->nan.pending && td->nan.elem >= lo && td->nan.elem < hi) {
        td->grads[td->nan.elem] = NAN;
        td->nan.pending = false;
    }
}

/* The model's grads-ready callback: forwards while armed (the rank's last backward) and not
 * held; a range already forwarded (a backward re-run after a rollback reports it again) stays
 * the communicator's. */
static void grads_ready_cb(void *ctx, int64_t lo, int64_t hi)
{
    struct train_dist *td = ctx;
    if (!td->armed || td->held || td->cb_status != QC_OK || lo >= td->reported)
        return;
    fault_nan_apply(td, lo, hi);
    td->cb_status = qc_dist_grads_ready(td->d, lo, hi);
    td->reported = lo;
    if (td->fault_step == td->arms) { /* the test hook: the next allocation runs out, once */
        td->fault_step = 0;
        qc_memctx_fail_at(qc_train_backend_memctx(td->be), 1, 1);
    }
}

/* QC_FAULT_OOM_AFTER_REPORT=S (tests, docs/RELIABILITY.md): in step S the first allocation
 * after the first range this rank forwards to the reduction fails, as if the device ran out:
 * the memory system rolls the group back with ranges already reducing. Read once; unset or
 * invalid: off. */
static int64_t fault_step_from_env(void)
{
    const char *e = getenv("QC_FAULT_OOM_AFTER_REPORT");
    char *end = NULL;
    const long long v = e ? strtoll(e, &end, 10) : 0;
    return e && end != e && *end == '\0' && v > 0 ? (int64_t)v : 0;
}

enum qc_status train_dist_create(const struct qc_config *cfg, const char *agreement,
                                 struct qc_qcnet *m, struct qc_train_backend *be,
                                 struct train_dist **out)
{
    struct train_dist *td = calloc(1, sizeof(*td));
    if (!td)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    td->be = be;
    td->model = m;
    td->rank = qc_dist_world_rank();
    td->world = qc_dist_world_size();
    td->G = cfg->grad_accum > 0 ? cfg->grad_accum : 1;
    td->numel = qc_qcnet_num_params(m);
    td->fault_step = fault_step_from_env();
    td->zero_stage = (int)cfg->zero_stage;
    td->record = RECORD_HEAD + 4 * (size_t)td->G;
    td->gather = calloc((size_t)td->world * td->record, sizeof(double));
    if (!td->gather) {
        free(td);
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    }
    const bool cuda = cfg->device_kind == QC_CONFIG_DEVICE_CUDA;
    struct qc_device *dev = qc_train_backend_device(be);
    td->compute = dev ? qc_device_compute_stream(dev) : NULL;
    int64_t cuts[4];
    const int ncuts = qc_qcnet_grads_cuts(m, cuts, 4);
    const struct qc_dist_opts o = {
        .backend = cuda ? QC_DIST_NCCL : QC_DIST_MPI,
        .numel = qc_qcnet_num_params(m),
        .zero_stage = (int)cfg->zero_stage,
        .bucket_bytes = (size_t)cfg->bucket_bytes,
        .timeout_s = cfg->dist_timeout,
        .dev = cuda ? dev : NULL,
        .compute = cuda ? td->compute : NULL,
        .cuts = cuts,
        .ncuts = ncuts < 4 ? ncuts : 4,
        .agreement = agreement,
        .agreement_what = "the effective configuration",
    };
    enum qc_status st = fault_nan_parse(td, cfg, o.numel);
    if (st == QC_OK)
        st = fault_skip_parse(td);
    if (st == QC_OK)
        st = qc_dist_create(&o, &td->d);
    if (st != QC_OK) {
        train_dist_destroy(td);
        return st;
    }
    qc_qcnet_set_grads_ready(m, grads_ready_cb, td);
    *out = td;
    return QC_OK;
}

void train_dist_destroy(struct train_dist *td)
{
    if (!td)
        return;
    if (td->model)
        qc_qcnet_set_grads_ready(td->model, NULL, NULL);
    qc_dist_destroy(td->d);
    free(td->gather);
    free(td);
}

void train_dist_set_fail_hook(struct train_dist *td, qc_dist_fail_fn fn, void *ctx)
{
    if (td)
        qc_dist_set_fail_hook(td->d, fn, ctx);
}

int64_t train_dist_local_groups(int rank, int world, int64_t L)
{
    return L > rank ? (L - rank + world - 1) / world : 0;
}

// ---- optimizer and start-up checks -------------------------------------------------------------

enum qc_status train_dist_optim(struct train_dist *td, const struct qc_config *cfg,
                                struct qc_qcnet *m, struct qc_train_backend *be,
                                struct qc_optim **out)
{
    const int64_t *offsets = NULL;
    const uint8_t *decay = NULL;
    int64_t ntensors = 0;
    qc_qcnet_param_groups(m, &offsets, &decay, &ntensors);
    struct qc_optim_params op;
    qc_optim_params_default(&op);
    op.lr = cfg->lr;
    op.weight_decay = cfg->weight_decay;
    const int64_t n = qc_qcnet_num_params(m);
    if (!td || td->zero_stage == 0)
        return qc_optim_create_on(qc_train_backend_alloc(be), qc_train_backend_exec(be), n, offsets,
                                  decay, ntensors, &op, out);
    int64_t lo, hi;
    qc_dist_my_shard(td->d, &lo, &hi);
    return qc_optim_create_shard(qc_train_backend_alloc(be), qc_train_backend_exec(be), n, offsets,
                                 decay, ntensors, lo, hi, &op, out);
}

enum qc_status train_dist_check_params(struct train_dist *td, struct qc_qcnet *m, int64_t step)
{
    if (!td)
        return QC_OK;
    const int64_t n = qc_qcnet_num_params(m);
    float *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!host)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory checking the weights");
    enum qc_status st = qc_qcnet_params_download(m, host);
    if (st == QC_OK) {
        uint64_t h = 0xcbf29ce484222325ull;
        const unsigned char *p = (const unsigned char *)host;
        for (size_t i = 0; i < (size_t)n * sizeof(float); i++) {
            h ^= p[i];
            h *= 0x100000001b3ull;
        }
        uint64_t *all = calloc((size_t)td->world, sizeof(uint64_t));
        if (!all)
            st = qc_errorf(QC_ERR_NOMEM, "train: out of memory");
        qc_dist_set_phase(td->d, "comparing the ranks' weights");
        if (st == QC_OK)
            st = qc_dist_allgather(td->d, &h, sizeof(h), all);
        for (int r = 1; st == QC_OK && r < td->world; r++) {
            if (all[r] == all[0])
                continue;
            if (step < 0)
                st = qc_errorf(QC_ERR_INVALID,
                               "dist: rank %d starts from other weights than rank 0\nhint: every "
                               "rank must read the same checkpoint (a shared folder) or "
                               "initialise from the same train.seed",
                               r);
            else
                st = qc_errorf(QC_ERR_INVALID,
                               "dist: rank %d holds other weights than rank 0 after step %" PRId64
                               ": the replicas drifted apart; checkpoint not written\nhint: this "
                               "is a bug of qctrain; report it with the command line",
                               r, step);
        }
        free(all);
    }
    free(host);
    return st;
}

// ---- one step ----------------------------------------------------------------------------------

static void stamp(void *p)
{
    *(double *)p = now_s();
}

/* *slot = the time the compute stream reaches this point (now on the CPU backend). */
static enum qc_status clock_at(struct train_dist *td, double *slot)
{
    if (!td->compute) {
        *slot = now_s();
        return QC_OK;
    }
    return qc_stream_host_func(td->compute, stamp, slot);
}

enum qc_status train_dist_step_begin(struct train_dist *td, int64_t step)
{
    if (!td)
        return QC_OK;
    td->step = step;
    td->nan.pending = td->nan.on && td->nan.step == step;
    td->t_begin = td->t_end = 0;
    return clock_at(td, &td->t_begin);
}

enum qc_status train_dist_arm(struct train_dist *td, float *grads)
{
    if (!td)
        return QC_OK;
    td->cb_status = QC_OK;
    QC_TRY(qc_dist_grads_begin(td->d, grads));
    td->grads = grads;
    td->armed = true;
    td->held = false;
    td->reported = td->numel;
    td->arms++;
    return QC_OK;
}

void train_dist_hold(struct train_dist *td, bool hold)
{
    if (td)
        td->held = hold;
}

enum qc_status train_dist_settle(struct train_dist *td, int64_t *from)
{
    *from = INT64_MAX;
    if (!td || !td->armed || td->reported == td->numel)
        return QC_OK;
    QC_TRY(td->cb_status);
    QC_TRY(qc_dist_grads_settle(td->d));
    *from = td->reported;
    return QC_OK;
}

enum qc_status train_dist_reduce(struct train_dist *td, float *grads)
{
    if (!td)
        return QC_OK;
    if (!td->armed)
        QC_TRY(train_dist_arm(td, grads)); /* no group this step: zero gradients, still summed */
    td->armed = false;
    QC_TRY(td->cb_status);
    fault_nan_apply(td, 0, td->reported); /* what the model did not report reduces now */
    QC_TRY(clock_at(td, &td->t_end));
    return qc_dist_grads_end(td->d);
}

enum qc_status train_dist_update(struct train_dist *td, float *params)
{
    if (!td)
        return QC_OK;
    return qc_dist_params_allgather(td->d, params);
}

enum qc_status train_dist_sync(struct train_dist *td, struct qc_train_backend *be, const char *what)
{
    if (!td)
        return qc_op_sync(qc_train_backend_exec(be));
    qc_dist_wait_begin(td->d, what);
    const enum qc_status st = qc_op_sync(qc_train_backend_exec(be));
    qc_dist_wait_end(td->d);
    return st;
}

void train_dist_step_end(struct train_dist *td)
{
    if (td)
        qc_dist_step_end(td->d);
}

void train_dist_reduced_range(const struct train_dist *td, int64_t numel, int64_t *lo, int64_t *hi)
{
    *lo = 0;
    *hi = numel;
    if (td && td->zero_stage >= 2)
        qc_dist_my_shard(td->d, lo, hi);
}

int64_t train_dist_batch_edges(const struct qc_batch *b)
{
    int64_t e = 0;
    if (b->has_graph)
        for (int k = 0; k < QC_EDGE_SET_COUNT; k++)
            e += b->graph.e[k].num_edges;
    return e;
}

enum qc_status train_dist_barrier(struct train_dist *td)
{
    if (!td)
        return QC_OK;
    uint8_t *all = calloc((size_t)td->world, 1);
    if (!all)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    const uint8_t here = 1;
    qc_dist_set_phase(td->d, "waiting for every rank to stop");
    const enum qc_status st = qc_dist_allgather(td->d, &here, 1, all);
    free(all);
    return st;
}

/* What one rank brings to train_dist_failure_gather: its status and its error, cut to fit. */
struct failure_record {
    int32_t status;
    char message[TRAIN_DIST_FAILURE_MESSAGE - sizeof(int32_t)];
};

enum qc_status train_dist_failure_gather(struct train_dist *td, enum qc_status mine,
                                         const char *message, int rank, enum qc_status *status,
                                         char *out, size_t n)
{
    *status = mine;
    snprintf(out, n, "%s", mine != QC_OK ? message : "");
    if (!td)
        return QC_OK;
    struct failure_record me = {.status = (int32_t)mine};
    snprintf(me.message, sizeof me.message, "%s", mine != QC_OK ? message : "");
    struct failure_record *all = calloc((size_t)td->world, sizeof(*all));
    if (!all)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    qc_dist_set_phase(td->d, "gathering the error of a failed step");
    const enum qc_status st = qc_dist_allgather(td->d, &me, sizeof(me), all);
    if (st == QC_OK && rank >= 0 && rank < td->world) {
        const struct failure_record *f = &all[rank];
        *status = f->status != 0 ? (enum qc_status)f->status : QC_ERR_IO;
        snprintf(out, n, "%.*s", (int)sizeof f->message, f->message);
    }
    free(all);
    return st;
}

/* The sums of a step of one rank (td NULL). */
static void combine_local(const struct train_dist_local *mine, struct train_dist_sums *out)
{
    for (int64_t g = 0; g < mine->nlocal; g++) {
        out->loss += mine->loss[4 * g];
        out->reg_loss_propose += mine->loss[4 * g + 1];
        out->reg_loss_refine += mine->loss[4 * g + 2];
        out->cls_loss += mine->loss[4 * g + 3];
    }
    out->scenes = mine->scenes;
    out->groups_ran = mine->groups_ran;
    out->stop_signal = mine->stop_signal;
    out->bad_grad = mine->bad_grad;
    out->failed = mine->failed;
}

enum qc_status train_dist_combine(struct train_dist *td, const struct train_dist_local *mine,
                                  struct train_dist_sums *out)
{
    memset(out, 0, sizeof(*out));
    out->bad_grad = -1;
    out->failed_rank = -1;
    out->rank_time_ratio = out->rank_edge_ratio = 1.0;
    if (!td || td->skip_combine_step == td->step) {
        if (td) /* the test hook: the others wait in the exchange this rank left out */
            qc_log(QC_LOG_WARN,
                   "train: rank %d leaves out step %lld's exchange of losses "
                   "(QC_FAULT_SKIP_COLLECTIVE)",
                   td->rank, (long long)td->step);
        combine_local(mine, out);
        return QC_OK;
    }
    const size_t R = td->record;
    double *rec = calloc(R, sizeof(double));
    if (!rec)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    QC_ASSERT(mine->nlocal <= td->G, "train: %lld local groups > %lld", (long long)mine->nlocal,
              (long long)td->G);
    rec[REC_NLOCAL] = (double)mine->nlocal;
    rec[REC_SCENES] = (double)mine->scenes;
    rec[REC_GROUPS_RAN] = (double)mine->groups_ran;
    rec[REC_SECONDS] = td->t_end > td->t_begin ? td->t_end - td->t_begin : 0;
    rec[REC_EDGES] = (double)mine->edges;
    rec[REC_STOP] = (double)mine->stop_signal;
    rec[REC_BAD_GRAD] = (double)mine->bad_grad; /* exact: element indices are < 2^53 */
    rec[REC_FAILED] = (double)mine->failed;
    memcpy(rec + RECORD_HEAD, mine->loss, (size_t)mine->nlocal * 4 * sizeof(double));
    qc_dist_set_phase(td->d, "exchanging the step's losses");
    const enum qc_status st = qc_dist_allgather(td->d, rec, R * sizeof(double), td->gather);
    free(rec);
    QC_TRY(st);
    /* losses in global group order: j = r + g W */
    int64_t L = 0;
    for (int r = 0; r < td->world; r++)
        L += (int64_t)td->gather[(size_t)r * R + REC_NLOCAL];
    for (int64_t j = 0; j < L; j++) {
        const double *l =
            td->gather + (size_t)(j % td->world) * R + RECORD_HEAD + 4 * (size_t)(j / td->world);
        out->loss += l[0];
        out->reg_loss_propose += l[1];
        out->reg_loss_refine += l[2];
        out->cls_loss += l[3];
    }
    double tmax = 0, tsum = 0, emax = 0, esum = 0;
    int busy = 0;
    for (int r = 0; r < td->world; r++) {
        const double *h = td->gather + (size_t)r * R;
        out->scenes += (int64_t)h[REC_SCENES];
        out->groups_ran += (int64_t)h[REC_GROUPS_RAN];
        if (h[REC_STOP] != 0 && out->stop_signal == 0) {
            out->stop_signal = (int)h[REC_STOP];
            out->stop_rank = r;
        }
        if (h[REC_BAD_GRAD] >= 0 && out->bad_grad < 0) {
            out->bad_grad = (int64_t)h[REC_BAD_GRAD];
            out->bad_grad_rank = r;
        }
        if (h[REC_FAILED] != 0) {
            if (out->failed_rank < 0) {
                out->failed = (int)h[REC_FAILED];
                out->failed_rank = r;
            }
            out->failed_ranks++;
        }
        if (h[REC_NLOCAL] > 0) {
            busy++;
            tsum += h[REC_SECONDS];
            tmax = h[REC_SECONDS] > tmax ? h[REC_SECONDS] : tmax;
            esum += h[REC_EDGES];
            emax = h[REC_EDGES] > emax ? h[REC_EDGES] : emax;
        }
    }
    out->rank_time_ratio = busy > 0 && tsum > 0 ? tmax / (tsum / busy) : 1.0;
    out->rank_edge_ratio = busy > 0 && esum > 0 ? emax / (esum / busy) : 1.0;
    return QC_OK;
}

// ---- checkpoints and the memory report
// -----------------------------------------------------------

enum qc_status train_dist_save(struct train_dist *td, const char *run_dir, struct qc_qcnet *m,
                               struct qc_optim *o, const struct qc_train_state *s,
                               const struct qc_config *cfg, char *path_out, size_t n)
{
    QC_TRY(train_dist_check_params(td, m, s->step));
    if (!td || td->zero_stage == 0) {
        if (td && td->rank != 0)
            return QC_OK; /* rank 0 holds the same weights and moments and writes them */
        return qc_checkpoint_save(run_dir, m, o, s, cfg, path_out, n);
    }
    /* ZeRO: each rank's shard of the moments (host copies) to rank 0 */
    const int64_t full = qc_qcnet_num_params(m);
    const int64_t mine = qc_optim_numel(o);
    float *shard = malloc((size_t)(2 * mine > 0 ? 2 * mine : 1) * sizeof(float));
    float *all =
        td->rank == 0 ? malloc((size_t)(2 * full > 0 ? 2 * full : 1) * sizeof(float)) : NULL;
    enum qc_status st = QC_OK;
    if (!shard || (td->rank == 0 && !all))
        st = qc_errorf(QC_ERR_NOMEM, "checkpoint: out of host memory for the AdamW moments");
    if (st == QC_OK)
        st = qc_optim_moments_download(o, shard, shard + mine);
    /* every rank gathers even after a local failure would leave the others waiting: a failure
     * here ends the job (main), so return at once */
    qc_dist_set_phase(td->d, "gathering the AdamW moments for a checkpoint");
    if (st == QC_OK)
        st = qc_dist_gather_shards(td->d, shard, all);
    if (st == QC_OK)
        st = qc_dist_gather_shards(td->d, shard + mine, all ? all + full : NULL);
    if (st == QC_OK && td->rank == 0)
        st = qc_checkpoint_save_moments(run_dir, m, o, all, all + full, s, cfg, path_out, n);
    free(shard);
    free(all);
    return st;
}

enum qc_status train_dist_mem_ranks(struct train_dist *td, struct qc_qcnet *m, struct qc_optim *o,
                                    uint64_t peak_allocated, struct qc_memreport_rank **out,
                                    int64_t *n)
{
    *out = NULL;
    *n = 0;
    if (!td)
        return QC_OK;
    struct qc_dist_stats ds;
    qc_dist_stats_get(td->d, &ds);
    int64_t lo, hi;
    qc_dist_my_shard(td->d, &lo, &hi);
    const uint64_t full = (uint64_t)qc_qcnet_num_params(m) * sizeof(float);
    const struct qc_memreport_rank me = {
        .rank = td->rank,
        .params_bytes = full,
        .grads_bytes = full,
        .grads_reduced_bytes = td->zero_stage >= 2 ? (uint64_t)(hi - lo) * sizeof(float) : full,
        .moments_bytes = 2u * (uint64_t)qc_optim_numel(o) * sizeof(float),
        .comm_bytes = ds.scratch_bytes,
        .peak_allocated_bytes = peak_allocated,
    };
    struct qc_memreport_rank *all = calloc((size_t)td->world, sizeof(*all));
    if (!all)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    qc_dist_set_phase(td->d, "exchanging the memory report's figures");
    const enum qc_status st = qc_dist_allgather(td->d, &me, sizeof(me), all);
    if (st != QC_OK) {
        free(all);
        return st;
    }
    *out = all;
    *n = td->world;
    return QC_OK;
}

void train_dist_stats(struct train_dist *td, struct qc_dist_stats *out)
{
    if (!td) {
        memset(out, 0, sizeof(*out));
        return;
    }
    qc_dist_stats_get(td->d, out);
}

void train_dist_stats_reset(struct train_dist *td)
{
    if (td)
        qc_dist_stats_reset(td->d);
}

void train_dist_step_figures(struct train_dist *td, const struct train_dist_sums *sums,
                             struct qc_step_metrics *m)
{
    if (!td)
        return;
    m->ranks = td->world;
    m->rank_time_ratio = sums->rank_time_ratio;
    m->rank_edge_ratio = sums->rank_edge_ratio;
    struct qc_dist_stats ds;
    train_dist_stats(td, &ds);
    m->comm_wait_s = ds.grads_wait_s - td->wait_seen;
    td->wait_seen = ds.grads_wait_s;
}
