/*
 * loop.c — the training loop: batches from the loader, forward / loss / backward per group,
 * AdamW with the epoch's learning rate, metrics, progress and checkpoints.
 *
 * One optimizer step = G = grad_accum groups (micro-batches) of batch_size scenes, each
 * normalised on its own scenes (QCNET.md §6.1, as one of 8 DDP ranks does); the step's
 * objective is the mean of the group losses, so each backward is seeded with 1/G (1/g for the
 * g < G groups left at the end of an epoch: a step never spans two epochs, as Lightning's
 * epochs end with the loader). The learning rate is the epoch's (qc_lr_cosine).
 *
 * A step, in phases (qc_trainer_step):
 *   step_begin    the epoch planned, the step's groups, the allocator's step window
 *   step_run      this rank's groups (run_group), the reduction, one exchange of the figures
 *   step_decide   fp16 loss scaling (loss_scale.h), the non-finite policy (nonfinite.h), AdamW
 *   step_advance  the loop position, the epoch rollover
 *   step_record   the step's metrics line and its memory
 *
 * Loop position: (epoch, batch_in_epoch) names the next batch; the loader's batches depend
 * only on (seed, epoch), so a resumed run re-plans the epoch and skips the batches already
 * consumed (they are built and dropped: resume costs that much loader time, once). Dropout
 * is keyed by (seed, step, scene) (qc_qcnet.h), so the resumed run draws the same masks, and
 * so does a group however the memory system splits it and whichever rank computes it.
 *
 * Backend (device.kind, backend.c): the model, the AdamW step and their memory live on cpu,
 * cuda or emu. On a device backend each group's batch is staged into allocator memory
 * (train_internal.h: a copy stream on CUDA) and given to the model as ctx.batch_dev; the next
 * batch of the epoch is staged as soon as the current group's work is enqueued, so on CUDA its
 * copy overlaps the backward pass. The host never reads device memory here: the losses come
 * back from the model (qc_qcnet_loss downloads them), and the step ends with one
 * synchronization (qc_op_sync) so step_s is the step's device time and an asynchronous error
 * surfaces at the step that caused it.
 *
 * Ranks (train_dist.h): under mpirun / srun with W ranks, a step is P = W·G groups (G =
 * grad_accum per rank), rank r computing groups r, r + W, ... of the step (the loader plans
 * exactly those for it), each backward seeded with 1/L for the step's L groups; the gradients
 * are summed across ranks while backward runs (the model's grads-ready callback), AdamW updates
 * the whole buffer or the rank's shard (ZeRO), and the losses are combined in global group
 * order. The loop position counts global groups, so a checkpoint resumes on another world size
 * with the same P. Rank 0 alone writes the run folder (metrics, checkpoints, memory report) and
 * prints; validation runs on rank 0. With one rank none of this runs (t->dist is NULL).
 *
 * Memory: parameters, gradients, activations, stashes, staged batches and the AdamW moments go
 * through the model's allocation hook (or the optimizer) to the caching allocator; the
 * allocator's budget (device.budget) caps them. Each step's allocated / reserved peaks are kept
 * in memory, and RUN/memory.json + RUN/memory.txt (qc_memreport.h) are rewritten at every
 * checkpoint and at the end of the run.
 */
#include "qc_train.h"
#include "qc_train_calib.h"
#include "loss_scale.h"
#include "nonfinite.h"
#include "qc_trainer_test.h"
#include "train_dist.h"
#include "train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qc_alloc.h"
#include "qc_cleanup.h"
#include "qc_config.h"
#include "qc_device.h"
#include "qc_dist.h"
#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_loader.h"
#include "qc_memreport.h"
#include "qc_progress.h"
#include "qc_report.h"
#include "qc_steptrace.h"

/* One run. The loop owns the run folder, where the run stands and what it writes; the parts it
 * drives keep their own state: the backend (device, allocator, exec), the memory system
 * (stepmem.c), the ranks (train_dist.c: the communicator, the reduction's wait), the non-finite
 * policy (nonfinite.h: its host buffer and skip counts), fp16 loss scaling (loss_scale.h: the
 * scale is in st, which checkpoints carry). */
/* What the run writes and shows. */
struct train_outputs {
    struct qc_metrics_log *log; /* RUN/metrics.jsonl (rank 0); NULL on the others */
    struct qc_tb *tb;           /* RUN/tb/ TensorBoard events (metrics.jsonl's tee); NULL = off */
    struct qc_steptrace *trace; /* RUN/trace/: chosen steps' allocation traces; NULL = off */
    struct qc_memreport_series mem_steps; /* per-step memory of this process (memory report) */
    struct qc_progress *prog;
    bool quiet;
    FILE *out;
};

/* Validation during the run (--eval-every). */
struct train_validation {
    int64_t every;            /* 0 = no validation */
    struct qc_eval_opts opts; /* validation data (held-out synthetic scenes or files) */
    const char **paths;       /* copy of the caller's list (pointers only) */
};

/* A run that stops on an error: what its report says. Several ranks: a step that failed on some
 * rank, agreed in the step's exchange (every rank knows it and is still in the job). */
struct train_failure {
    bool agreed;       /* the failure was agreed in the step's exchange */
    bool report_alone; /* the memory report without the ranks' exchange (trainer_comm_failed) */
    int rank, ranks;   /* the first failed rank, how many failed */
    char msg[TRAIN_DIST_FAILURE_MESSAGE];    /* its error */
    const struct qc_memreport_stop *stopped; /* set while a stopped run writes its report */
};

/* The loop's own state: what computes a step, where the run stands, and the three parts above. */
struct qc_trainer {
    struct qc_config cfg;
    char out_dir[4096];
    struct qc_run_lock *lock; /* the run folder's one-writer lock (run_dir.c; rank 0) */
    /* what computes a step */
    struct qc_train_backend *be; /* device, allocator, exec */
    struct qc_alloc *alloc;      /* be's allocator */
    struct qc_qcnet *model;
    struct qc_optim *optim;
    struct train_mem *mem;     /* the step's memory system: plans, policies, admission, OOM */
    struct train_dist *dist;   /* data-parallel state; NULL with one rank */
    struct train_nonfinite nf; /* train.nonfinite: finiteness checks, skipped steps */
    int rank, world;           /* this process's rank of world (0 of 1 without a launcher) */
    /* the batches and where the run stands */
    struct qc_loader *loader;
    struct train_stage cur;  /* the batch of the group being computed */
    struct train_stage next; /* the next batch, staged ahead (device backends, planning ahead:
                                the next epoch's first after an epoch's last batch) */
    struct qc_train_state st;
    int64_t nb;              /* groups per epoch over all ranks (batch_in_epoch counts these) */
    int64_t G;               /* groups per rank per step (grad_accum) */
    int64_t P;               /* groups per step over all ranks: G x world */
    int64_t local_in_epoch;  /* this rank's batches of the epoch consumed */
    bool epoch_started;      /* the loader is planned for st.epoch */
    bool epoch_ahead;        /* ... for st.epoch + 1 already, its first batch in next (run_group) */
    int64_t total_steps;     /* the run ends at this step */
    int64_t last_saved;      /* step of the last checkpoint written (or resumed from) */
    int64_t empty_steps;     /* steps in which every scene was skipped as oversized */
    int stop_sig, stop_rank; /* several ranks: the graceful stop agreed on, and whose signal */
    struct train_outputs io;
    struct train_validation val;
    struct train_failure fail;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Loads weights for --init-from: a weights file, or a checkpoint / run folder. */
static enum qc_status load_init_from(struct qc_qcnet *m, const char *path)
{
    char p[4096];
    QC_TRY(qc_checkpoint_weights_path(path, p, sizeof(p)));
    return qc_qcnet_load(m, p);
}

// ---- create / destroy ---------------------------------------------------------------------------

/* The run folder of a run: --out, else for --resume the run the checkpoint belongs to (RUN
 * for RUN/ckpt-000100, which holds model.safetensors; RUN itself for a run folder), else
 * cfg.out_dir. */
static void run_dir_of(const struct qc_train_opts *opts, const char *cfg_out, char *out, size_t n)
{
    if (opts->out_dir) {
        snprintf(out, n, "%s", opts->out_dir);
        return;
    }
    if (!opts->resume) {
        snprintf(out, n, "%s", cfg_out);
        return;
    }
    snprintf(out, n, "%s", opts->resume);
    char model[4200];
    snprintf(model, sizeof model, "%s/model.safetensors", opts->resume);
    struct stat sb;
    if (stat(model, &sb) != 0) /* a run folder */
        return;
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/')
        out[--len] = '\0'; /* "RUN/ckpt-000100/" */
    char *slash = strrchr(out, '/');
    if (slash && slash != out)
        *slash = '\0';
    else
        snprintf(out, n, "%s", slash ? "/" : ".");
}

/* Takes the run folder's lock and recovers what an interrupted writer left there. */
static enum qc_status take_run_dir(struct qc_trainer *t)
{
    QC_TRY(qc_run_lock_acquire(t->out_dir, &t->lock));
    return qc_run_dir_recover(t->out_dir, NULL);
}

static enum qc_status ensure_epoch(struct qc_trainer *t);

static enum qc_status tb_tee(void *ctx, const char *line)
{
    return qc_tb_write_metrics_line(ctx, line);
}

/* What the report and TensorBoard read besides metrics.jsonl: RUN/run.json (configuration,
 * machine, device, versions), the step traces (RUN/trace/, alloc.trace_*) and the TensorBoard
 * event file (RUN/tb/, log.tensorboard), which receives every metrics.jsonl line. */
static enum qc_status trainer_open_logs(struct qc_trainer *t, bool resumed)
{
    char *cfg_json = NULL;
    QC_TRY(qc_config_to_json(&t->cfg, &cfg_json));
    char devname[256] = "";
    struct qc_device *dev = qc_train_backend_device(t->be);
    struct qc_device_props props;
    if (t->cfg.device_kind == QC_CONFIG_DEVICE_CPU)
        snprintf(devname, sizeof devname, "host memory (the CPU backend)");
    else if (dev && qc_device_props_get(dev, &props) == QC_OK)
        snprintf(devname, sizeof devname, "%s", props.name);
    const enum qc_status st = qc_report_write_run_info(
        t->out_dir, cfg_json, qc_train_backend_name(t->be), devname, t->st.step + 1, resumed);
    free(cfg_json);
    QC_TRY(st);
    if (t->cfg.alloc_trace && t->cfg.alloc_trace_max_bytes > 0)
        QC_TRY(qc_steptrace_create(t->alloc, t->out_dir, t->cfg.alloc_trace_every,
                                   t->cfg.alloc_trace_max_bytes, &t->io.trace));
    if (t->cfg.log_tensorboard) {
        QC_TRY(qc_tb_open(t->out_dir, t->st.step + 1, &t->io.tb));
        qc_metrics_set_tee(t->io.log, tb_tee, t->io.tb);
    }
    return QC_OK;
}

enum qc_status qc_trainer_create(const struct qc_train_opts *opts, struct qc_trainer **out)
{
    if (opts->resume && opts->init_from)
        return qc_errorf(QC_ERR_INVALID, "train: --resume and --init-from are exclusive\nhint: "
                                         "--resume continues a run (weights, optimizer, step); "
                                         "--init-from starts a new one from weights");
    struct qc_trainer *t = calloc(1, sizeof(*t));
    if (!t)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    t->cfg = *opts->cfg;
    qc_kernels_cpu_set_threads((int)t->cfg.cpu_threads); /* 0: the process's own counts */
    t->io.quiet = opts->quiet;
    t->io.out = opts->progress_out ? opts->progress_out : stderr;
    t->G = t->cfg.grad_accum > 0 ? t->cfg.grad_accum : 1;
    t->st.seed = (uint64_t)t->cfg.seed;
    t->st.loss_scale = train_loss_scale_initial(&t->cfg);
    t->last_saved = -1;
    t->val.every = opts->eval_every > 0 ? opts->eval_every : 0;
    if (opts->nval > 0) {
        t->val.paths = calloc((size_t)opts->nval, sizeof(*t->val.paths));
        if (!t->val.paths) {
            free(t);
            return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
        }
        for (int i = 0; i < opts->nval; i++)
            t->val.paths[i] = opts->val_data[i];
    }
    t->val.opts = (struct qc_eval_opts){
        .cfg = &t->cfg,
        .data = t->val.paths,
        .ndata = opts->nval,
        .synthetic_seed = (uint64_t)t->cfg.seed + 1,
        .synthetic_scenes = opts->val_scenes > 0 ? opts->val_scenes : 8,
        .quiet = true,
    };
    char *agreement = NULL;
    /* the ranks of the run (one without a launcher): resolves dist.world_size */
    enum qc_status st = train_dist_world(&t->cfg, &t->rank, &t->world);
    if (st != QC_OK)
        goto fail;
    t->P = t->G * t->world;
    if (t->rank != 0)
        t->io.quiet = true; /* rank 0 reports */

    /* the run folder: locked before anything in it is read (one writer per run folder,
     * run_dir.c); a folder that does not exist yet is created, then locked, once the data
     * and the checkpoint have been read, so a failure before leaves nothing behind */
    run_dir_of(opts, t->cfg.out_dir, t->out_dir, sizeof(t->out_dir));
    if (!t->out_dir[0]) {
        st = qc_errorf(QC_ERR_INVALID, "train: no output folder\nhint: --out DIR");
        goto fail;
    }
    /* the configuration records the folder actually written (checkpoint metadata) */
    snprintf(t->cfg.out_dir, sizeof(t->cfg.out_dir), "%s", t->out_dir);
    struct stat sb;
    if (t->rank == 0 && stat(t->out_dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st = take_run_dir(t);
        if (st != QC_OK)
            goto fail;
    }
    st = train_dist_run_dir_barrier(&t->cfg, t->out_dir); /* the others wait for that */
    if (st != QC_OK)
        goto fail;

    /* resume: the checkpoint's folder, state and configuration first */
    char ckpt[4096] = "";
    struct qc_config saved;
    if (opts->resume) {
        struct qc_train_state rs;
        st = qc_checkpoint_resolve(opts->resume, ckpt, sizeof(ckpt));
        if (st == QC_OK)
            st = qc_checkpoint_read_state(ckpt, &rs, &saved);
        if (st == QC_OK)
            st = qc_checkpoint_check_config(&saved, &t->cfg, ckpt);
        if (st != QC_OK)
            goto fail;
    }
    train_dist_resolve(&t->cfg, opts->resume ? &saved : NULL);
    if (t->world > 1) {
        agreement = train_dist_agreement_text(&t->cfg, opts, ckpt);
        if (!agreement) {
            st = qc_errorf(QC_ERR_NOMEM, "train: out of memory");
            goto fail;
        }
    }

    /* backend (device, allocator), model, optimizer */
    st = qc_train_backend_create(&t->cfg, &t->be);
    if (st != QC_OK)
        goto fail;
    t->alloc = qc_train_backend_alloc(t->be);
    st = qc_train_backend_model(t->be, &t->cfg, &t->model);
    if (st == QC_OK && t->world > 1)
        st = train_dist_create(&t->cfg, agreement, t->model, t->be, &t->dist);
    if (st == QC_OK)
        st = train_dist_optim(t->dist, &t->cfg, t->model, t->be, &t->optim);
    if (st != QC_OK)
        goto fail;

    if (opts->resume) {
        st = qc_checkpoint_load(ckpt, t->model, t->optim, &t->st);
        if (st != QC_OK)
            goto fail;
        t->last_saved = t->st.step;
        train_loss_scale_resumed(&t->cfg, &t->st);
    } else if (opts->init_from) {
        st = load_init_from(t->model, opts->init_from);
        if (st != QC_OK)
            goto fail;
    } else {
        qc_qcnet_init_params(t->model, (uint64_t)t->cfg.seed);
    }
    st = train_dist_check_params(t->dist, t->model, -1);
    if (st != QC_OK)
        goto fail;

    /* data: this rank's groups of every step */
    struct qc_loader_opts lo;
    qc_train_backend_loader_opts(t->be, &t->cfg, &lo);
    lo.rank = t->rank;
    lo.world_size = t->world;
    lo.groups_per_rank = t->G;
    st = qc_loader_create(opts->data, opts->ndata, &lo, &t->loader);
    if (st != QC_OK)
        goto fail;
    /* plan the first epoch now (the batch count is known once an epoch is planned; the
     * workers start building ahead while the rest is set up) */
    st = ensure_epoch(t);
    if (st != QC_OK)
        goto fail;
    t->nb = qc_loader_num_groups(t->loader);
    if (t->nb <= 0) {
        st = qc_errorf(QC_ERR_INVALID, "train: the data gives no batch (%" PRId64 " scenes)",
                       qc_loader_num_scenes(t->loader));
        goto fail;
    }
    const int64_t spe = (t->nb + t->P - 1) / t->P;
    t->total_steps = t->cfg.steps > 0 ? t->cfg.steps : t->cfg.epochs * spe;

    /* the memory system: every rank plans its own groups; a resumed run's cost model is read
     * from the run folder (rank 0 writes it) */
    st = train_mem_create(&t->cfg, t->be, t->model, t->out_dir, opts->skip_oversized, &t->mem);
    if (st != QC_OK)
        goto fail;

    if (t->rank == 0) { /* rank 0 writes the run folder */
        st = qc_train_mkdir(t->out_dir);
        if (st == QC_OK && !t->lock)
            st = take_run_dir(t);
        if (st == QC_OK)
            st = qc_metrics_open(t->out_dir, opts->resume ? t->st.step : -1, &t->io.log);
        if (st == QC_OK)
            st = trainer_open_logs(t, opts->resume != NULL);
        if (st != QC_OK)
            goto fail;
    }
    free(agreement);
    *out = t;
    return QC_OK;
fail:
    free(agreement);
    qc_trainer_destroy(t);
    return st;
}

void qc_trainer_destroy(struct qc_trainer *t)
{
    if (!t)
        return;
    qc_progress_destroy(t->io.prog);
    qc_metrics_close(t->io.log);
    qc_run_lock_release(t->lock);
    qc_tb_close(t->io.tb);
    qc_steptrace_destroy(t->io.trace);
    if (t->model)
        qc_qcnet_release(t->model);
    train_mem_ahead_drop(t->mem); /* it may be reading t->next's batch */
    if (t->be) {
        qc_loader_release(t->loader, train_stage_drop(t->be, &t->cur));
        qc_loader_release(t->loader, train_stage_drop(t->be, &t->next));
    }
    train_stage_deinit(&t->cur);
    train_stage_deinit(&t->next);
    qc_loader_destroy(t->loader);
    train_mem_destroy(t->mem);
    train_dist_destroy(t->dist);
    qc_optim_destroy(t->optim);
    qc_qcnet_destroy(t->model);
    qc_train_backend_destroy(t->be); /* the allocator with it: after everything it serves */
    free(t->val.paths);
    qc_memreport_series_free(&t->io.mem_steps);
    train_nonfinite_deinit(&t->nf);
    free(t);
}

// ---- one step -----------------------------------------------------------------------------------

/* Plans the loader for st.epoch (once) and skips the batches a resumed run already used: this
 * rank's batches of the first batch_in_epoch global groups (whole steps of P groups). */
static enum qc_status ensure_epoch(struct qc_trainer *t)
{
    if (t->epoch_started)
        return QC_OK;
    QC_TRY(qc_loader_start_epoch(t->loader, t->st.epoch));
    const int64_t skip = t->st.batch_in_epoch / t->P * t->G +
                         train_dist_local_groups(t->rank, t->world, t->st.batch_in_epoch % t->P);
    t->local_in_epoch = skip;
    for (int64_t i = 0; i < skip; i++) {
        struct qc_batch *b = NULL;
        QC_TRY(qc_loader_next(t->loader, &b));
        if (!b)
            return qc_errorf(QC_ERR_INVALID,
                             "resume: epoch %" PRId64 " has fewer than %" PRId64 " batches",
                             t->st.epoch, t->st.batch_in_epoch);
        qc_loader_release(t->loader, b);
    }
    t->epoch_started = true;
    return QC_OK;
}

/* Takes the loader's next batch of the epoch and stages it into s (left empty at the end of
 * the epoch). */
static enum qc_status stage_next(struct qc_trainer *t, struct train_stage *s)
{
    struct qc_batch *b = NULL;
    QC_TRY(qc_loader_next(t->loader, &b));
    if (!b)
        return QC_OK;
    const enum qc_status st = train_stage_put(t->be, s, b);
    if (st != QC_OK)
        qc_loader_release(t->loader, b);
    return st;
}

/* "RUN/ckpt-<step>" of the last checkpoint written or resumed from, or "none". */
static const char *last_ckpt_str(struct qc_trainer *t)
{
    static _Thread_local char buf[4200];
    if (t->last_saved < 0)
        return "none";
    snprintf(buf, sizeof buf, "%s/ckpt-%06" PRId64, t->out_dir, t->last_saved);
    return buf;
}

/* The first non-finite value of n floats of backend memory, or -1 (nonfinite.h). */
static enum qc_status first_nonfinite(struct qc_trainer *t, const float *x, int64_t n,
                                      int64_t *first)
{
    return train_nonfinite_first(&t->nf, qc_train_backend_exec(t->be), x, n,
                                 qc_qcnet_num_params(t->model), first);
}

/* The first non-finite element of this rank's reduced gradients (all of them, or its shard
 * under ZeRO stage 2), or -1. */
static enum qc_status grads_nonfinite(struct qc_trainer *t, int64_t *first)
{
    int64_t lo, hi;
    train_dist_reduced_range(t->dist, qc_qcnet_num_params(t->model), &lo, &hi);
    QC_TRY(first_nonfinite(t, qc_qcnet_grads(t->model) + lo, hi - lo, first));
    if (*first >= 0)
        *first += lo;
    return QC_OK;
}

/* The next epoch starts with the next batch. */
static void next_epoch(struct qc_trainer *t)
{
    t->st.epoch++;
    t->st.batch_in_epoch = 0;
    t->epoch_started = t->epoch_ahead; /* started by run_group, planning ahead */
    t->epoch_ahead = false;
    if (t->epoch_started)
        t->local_in_epoch = 0;
}

/* One optimizer step as its phases see it. */
struct step {
    int64_t groups;              /* the step's groups over all ranks (P, fewer at an epoch's end) */
    int64_t nlocal;              /* this rank's of them */
    int64_t nb_local;            /* this rank's batches in the epoch */
    int64_t epoch;               /* the epoch it runs in */
    double lr;                   /* the epoch's learning rate */
    double t0;                   /* when it started (now_s) */
    struct train_dist_sums sums; /* its losses, scenes, stop signal and gradients' finiteness
                                    over every rank: the same on every rank */
    double loss_scale;           /* fp16: the scale it ran with (0: none) */
    bool skipped;                /* parameters left as they were (non-finite, fp16 overflow) */
    bool empty; /* no scene ran (all skipped as oversized): no step for the optimizer */
};

/* Starts a step: the epoch planned (the next one when this one is used up), the step's groups,
 * the allocator's step window, the step's trace, zero gradients. */
static enum qc_status step_begin(struct qc_trainer *t, struct step *s)
{
    if (t->st.batch_in_epoch >= t->nb) /* defensive: the epoch is used up */
        next_epoch(t);
    QC_TRY(ensure_epoch(t));
    const int64_t left = t->nb - t->st.batch_in_epoch;
    *s = (struct step){.groups = left < t->P ? left : t->P, .epoch = t->st.epoch};
    s->nlocal = train_dist_local_groups(t->rank, t->world, s->groups);
    s->nb_local = qc_loader_num_batches(t->loader);
    s->lr = qc_lr_cosine(t->cfg.lr, t->cfg.t_max, t->st.epoch);
    s->t0 = now_s();
    /* the step first: the step window's peak snapshot taken by the reset carries it */
    qc_alloc_set_step(t->alloc, t->st.step + 1);
    qc_alloc_reset_peak(t->alloc);
    if (t->io.trace)
        qc_steptrace_begin(t->io.trace, t->st.step + 1);
    qc_qcnet_zero_grad(t->model);
    QC_TRY(train_dist_step_begin(t->dist, t->st.step + 1));
    train_mem_step_begin(t->mem, t->model);
    return QC_OK;
}

/* Runs this rank's group g of the step: its batch (staged ahead, or staged now), planned and
 * run by the memory system (split when it does not fit, rolled back and re-run when the
 * allocator runs out: stepmem.c) with the backward seeded by the loss scale / groups; then the
 * next batch of the epoch is staged while this one's work runs (device backends). Its losses
 * into loss[0..3] (fp32 each), its scenes and graph edges added. */
static enum qc_status run_group(struct qc_trainer *t, const struct step *s, int64_t g,
                                double loss[4], int64_t *scenes, int64_t *edges)
{
    if (t->next.host) { /* staged ahead during the previous group */
        const struct train_stage tmp = t->cur;
        t->cur = t->next;
        t->next = tmp;
    } else {
        QC_TRY(stage_next(t, &t->cur));
        if (!t->cur.host)
            return qc_errorf(QC_ERR_INVALID,
                             "train: epoch %" PRId64 " ended after %" PRId64 " batches of rank "
                             "%d, %" PRId64 " planned",
                             t->st.epoch, t->local_in_epoch + g, t->rank, s->nb_local);
    }
    const struct qc_batch *b = t->cur.host;
    const struct qc_qcnet_ctx ctx = {
        .training = true,
        .need_backward = true,
        .seed = t->st.seed,
        .step = (uint32_t)t->st.step, /* with the scenes, the dropout keys (qc_qcnet.h) */
    };
    enum qc_status st = QC_OK;
    /* the last group's backward makes the gradients final: armed before it */
    if (g + 1 == s->nlocal)
        st = train_dist_arm(t->dist, qc_qcnet_grads(t->model));
    const bool more = t->local_in_epoch + g + 1 < s->nb_local; /* a next batch in the epoch */
    /* planning ahead (a budget): the next batch's host side now, so that the memory system
     * plans it while this group runs (memory/plan_ahead.h); staged after this group. After the
     * epoch's last batch, when steps follow, the loader starts the next epoch now (every batch
     * of this one is taken) and next_epoch finds it started with its first batch in t->next */
    struct qc_batch *next = NULL;
    const bool ahead = st == QC_OK && train_mem_plans_ahead(t->mem);
    if (ahead && more) {
        st = qc_loader_next(t->loader, &next);
    } else if (ahead && g + 1 == s->nlocal && t->st.step + 1 < t->total_steps && !t->epoch_ahead) {
        st = qc_loader_start_epoch(t->loader, t->st.epoch + 1);
        if (st == QC_OK)
            st = qc_loader_next(t->loader, &next);
        t->epoch_ahead = st == QC_OK && next;
    }
    struct train_group_out l = {0};
    if (st == QC_OK)
        st = train_mem_group(t->mem, t->model, t->loader, &t->cur, next, &ctx,
                             train_loss_scale_seed(&t->st) / (float)s->groups, t->dist, &l);
    *scenes += l.scenes;
    *edges += train_dist_batch_edges(b);
    qc_loader_release(t->loader, train_stage_drop(t->be, &t->cur));
    if (next) { /* staged now: on a device its copies may reuse the blocks just freed */
        enum qc_status sn = st;
        if (sn == QC_OK)
            sn = train_stage_put(t->be, &t->next, next);
        if (sn != QC_OK) { /* not taken: the planning of it goes first */
            train_mem_ahead_drop(t->mem);
            qc_loader_release(t->loader, next);
            st = sn;
        }
    } else if (st == QC_OK && qc_exec_is_device(qc_train_backend_exec(t->be)) && more) {
        /* device backends: stage the next batch of the epoch while this one's work runs (its
         * blocks may reuse the ones just freed, in stream order) */
        st = stage_next(t, &t->next);
    }
    if (st != QC_OK) {  /* "train: step S, group G: <why>", the inner "train: " said once */
        char why[4096]; /* qc_error_last holds at most 4095 bytes */
        const char *e = qc_error_last();
        snprintf(why, sizeof why, "%s", strncmp(e, "train: ", 7) == 0 ? e + 7 : e);
        return qc_errorf(st, "train: step %" PRId64 ", group %" PRId64 ": %s", t->st.step + 1,
                         t->rank + g * t->world, why);
    }
    /* a split group's losses are the sums of its parts' (fp32 each, as one would be) */
    loss[0] = (double)(float)l.loss;
    loss[1] = (double)(float)l.reg_loss_propose;
    loss[2] = (double)(float)l.reg_loss_refine;
    loss[3] = (double)(float)l.cls_loss;
    return QC_OK;
}

/* qc_error_last (the error of st) into why (n bytes), once: the first failure of a step. */
static void keep_failure(enum qc_status *first, enum qc_status st, char *why, size_t n)
{
    if (st != QC_OK && *first == QC_OK) {
        *first = st;
        snprintf(why, n, "%s", qc_error_last());
    }
}

/* After a step's exchange said that rank sums->failed_rank failed (this rank too when mine is not
 * QC_OK, its error in why): every rank gets that rank's error (train_dist_failure_gather), the
 * failure is agreed (t->fail.agreed: trainer_failed writes the report collectively) and the
 * step fails on every rank: the failed rank with its own error, rank 0 naming the failed rank and
 * its error, the others naming the failed rank only. */
static enum qc_status step_failed_agreed(struct qc_trainer *t, const struct train_dist_sums *sums,
                                         enum qc_status mine, const char *why)
{
    enum qc_status fst = QC_ERR_IO;
    const enum qc_status gst = train_dist_failure_gather(t->dist, mine, why, sums->failed_rank,
                                                         &fst, t->fail.msg, sizeof t->fail.msg);
    if (gst != QC_OK)
        return mine != QC_OK ? qc_errorf(mine, "%s", why) : gst;
    t->fail.agreed = true;
    t->fail.rank = sums->failed_rank;
    t->fail.ranks = sums->failed_ranks;
    if (mine != QC_OK)
        return qc_errorf(mine, "%s", why);
    const int64_t step = t->st.step + 1;
    char more[64] = "";
    if (sums->failed_ranks > 1)
        snprintf(more, sizeof more, " (the first of %d ranks that failed)", sums->failed_ranks);
    if (t->rank != 0)
        return qc_errorf(fst,
                         "train: step %" PRId64 ": rank %d of %d failed%s; rank 0 prints its "
                         "error and writes the report",
                         step, sums->failed_rank, t->world, more);
    const char *e = t->fail.msg;
    return qc_errorf(fst, "train: step %" PRId64 ": rank %d of %d failed%s: %s", step,
                     sums->failed_rank, t->world, more, strncmp(e, "train: ", 7) == 0 ? e + 7 : e);
}

/* Runs the step's groups of this rank, then: the gradients summed over the ranks (they reduce
 * while backward runs) and the step's device work done (any asynchronous error reported) before
 * they are checked; one exchange gives every rank the step's losses, any rank's graceful-stop
 * signal, any rank's non-finite gradient and any rank's failure (s->sums), so the decisions after
 * it are the same on every rank. With several ranks a rank whose step failed (a scene that fits
 * no budget, an out-of-memory it cannot recover from) still completes the reduction and the
 * exchange, carrying its failure: every rank then fails the step alike and rank 0 writes the
 * report saying which rank failed and why (step_failed_agreed). A failure of the reduction or
 * the exchange itself ends the job as before (main: MPI_Abort). */
static enum qc_status step_run(struct qc_trainer *t, struct step *s)
{
    double *losses = calloc((size_t)(s->nlocal > 0 ? s->nlocal : 1) * 4, sizeof(double));
    if (!losses)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    int64_t scenes = 0, edges = 0, bad_grad = -1, ran = 0;
    enum qc_status st = QC_OK; /* the rank's first failure in the step, its message in why */
    char why[TRAIN_DIST_FAILURE_MESSAGE] = "";
    for (int64_t g = 0; g < s->nlocal && st == QC_OK; g++) {
        const int64_t before = scenes;
        keep_failure(&st, run_group(t, s, g, losses + 4 * g, &scenes, &edges), why, sizeof why);
        ran += scenes > before; /* a group whose every scene was skipped did not run */
    }
    if (st != QC_OK && t->world == 1) {
        free(losses);
        return st;
    }
    const enum qc_status rst = train_dist_reduce(t->dist, qc_qcnet_grads(t->model));
    if (rst != QC_OK) {
        free(losses);
        return st != QC_OK ? qc_errorf(st, "%s", why) : rst;
    }
    keep_failure(&st,
                 train_dist_sync(t->dist, t->be, "its device: the step's backward and reduction"),
                 why, sizeof why);
    if (st == QC_OK)
        keep_failure(&st,
                     train_loss_scale_fault(&t->cfg, &t->st, qc_train_backend_exec(t->be),
                                            qc_qcnet_grads(t->model)),
                     why, sizeof why);
    if (st == QC_OK)
        keep_failure(&st, grads_nonfinite(t, &bad_grad), why, sizeof why);
    if (st != QC_OK && t->world == 1) {
        free(losses);
        return st;
    }
    const struct train_dist_local mine = {
        .nlocal = st == QC_OK ? s->nlocal : 0,
        .loss = losses,
        .scenes = scenes,
        .groups_ran = ran,
        .edges = edges,
        .stop_signal = t->world > 1 ? qc_cleanup_stop_signal() : 0,
        .bad_grad = bad_grad,
        .failed = st,
    };
    const enum qc_status cst = train_dist_combine(t->dist, &mine, &s->sums);
    free(losses);
    if (cst != QC_OK)
        return st != QC_OK ? qc_errorf(st, "%s", why) : cst;
    if (s->sums.failed_rank >= 0)
        return step_failed_agreed(t, &s->sums, st, why);
    if (st != QC_OK) /* (the exchange was left out: QC_FAULT_SKIP_COLLECTIVE) */
        return qc_errorf(st, "%s", why);
    if (s->sums.stop_signal && !t->stop_sig) { /* every rank stops after this step */
        t->stop_sig = s->sums.stop_signal;
        t->stop_rank = s->sums.stop_rank;
    }
    return QC_OK;
}

/* Decides on the step from its exchanged figures: fp16 loss scaling first (an overflow in the
 * scaled gradients skips the step and halves the scale; finite gradients are unscaled), then
 * non-finite loss terms or reduced gradients (train.nonfinite: stop, or skip); otherwise AdamW
 * updates this rank's part and the parameters are gathered (ZeRO). */
static enum qc_status step_decide(struct qc_trainer *t, struct step *s)
{
    int64_t lo, hi;
    train_dist_reduced_range(t->dist, qc_qcnet_num_params(t->model), &lo, &hi);
    s->loss_scale = t->st.loss_scale;
    if (s->sums.scenes == 0) {
        /* every scene was skipped as oversized: a step without a sample is no step (no AdamW
         * update, no weight decay, no loss-scale change); logged with a null loss, counted */
        s->empty = true;
        t->empty_steps++;
        qc_log(QC_LOG_WARN,
               "train: step %" PRId64 ": every scene was skipped as oversized: no update "
               "(%" PRId64 " such steps so far)",
               t->st.step + 1, t->empty_steps);
        QC_TRY(train_dist_sync(t->dist, t->be, "its device: the step's backward"));
        train_dist_step_end(t->dist);
        return QC_OK;
    }
    const bool overflow = train_loss_scale_check(
        &t->cfg, &t->st, &s->sums, qc_train_backend_exec(t->be), qc_qcnet_grads(t->model), lo, hi);
    char bad[160] = "";
    if (!overflow)
        train_nonfinite_describe(&s->sums, t->world, bad, sizeof bad);
    s->skipped = overflow || bad[0] != '\0';
    if (!s->skipped) {
        /* groups whose every scene was skipped: each group's backward was seeded with
         * 1/groups, so the gradients are rescaled to the mean of the groups that ran (exact
         * when the ratio is a power of 2) */
        if (s->sums.groups_ran < s->groups)
            qc_op_scale_inplace(qc_train_backend_exec(t->be), qc_qcnet_grads(t->model) + lo,
                                (float)((double)s->groups / (double)s->sums.groups_ran), hi - lo);
        qc_optim_step(t->optim, qc_qcnet_params(t->model), qc_qcnet_grads(t->model), s->lr);
        QC_TRY(train_dist_update(t->dist, qc_qcnet_params(t->model)));
        train_nonfinite_applied(&t->nf);
        train_loss_scale_applied(&t->cfg, &t->st);
    } else if (!overflow) {
        QC_TRY(train_nonfinite_policy(&t->nf, &t->cfg, t->st.step + 1, bad, last_ckpt_str(t)));
    }
    train_loss_scale_log(&t->cfg, &t->st, t->st.step + 1, t->rank, t->world, s->loss_scale,
                         overflow, s->skipped);
    QC_TRY(train_dist_sync(t->dist, t->be, "its device: the step's update"));
    train_dist_step_end(t->dist);
    return QC_OK;
}

/* The step is done: the loop position moves on (to the next epoch after its last batch). */
static void step_advance(struct qc_trainer *t, const struct step *s)
{
    t->st.step++;
    t->st.adam_step = qc_optim_steps(t->optim);
    t->st.batch_in_epoch += s->groups;
    t->local_in_epoch += s->nlocal;
    t->st.samples += s->sums.scenes;
    if (t->st.batch_in_epoch >= t->nb)
        next_epoch(t);
}

/* The memory figures of a step's line: the allocator's step window and the memory system's. */
static void metrics_memory(struct qc_step_metrics *m, const struct qc_alloc_stats *as,
                           const struct train_mem_step *ms)
{
    m->bytes_in_use = as->bytes_allocated;
    m->peak_device_bytes = as->bytes_allocated_peak;
    m->reserved_bytes = as->bytes_reserved;
    m->predicted_peak_bytes = ms->predicted_peak;
    m->peak_active_bytes = as->bytes_active_peak;
    m->offload_host_bytes = ms->host_bytes;
    m->offload_nvme_bytes = ms->nvme_bytes;
    m->recompute_bytes = ms->recompute_bytes;
    m->prefetch_stall_s = ms->stall_s;
    m->replans = ms->replans;
    m->splits = ms->splits;
    m->skipped_scenes = ms->skipped;
    m->rolled_back = ms->rolled_back;
    m->plan_ms = 1e3 * ms->plan_s;
    m->plan_ahead_ms = 1e3 * ms->plan_ahead_s;
}

/* A mean of the step's group losses over the groups that ran (a group whose every scene was
 * skipped has no loss), rounded to fp32 as a torch scalar would be. */
static double mean_f32(double sum, const struct step *s)
{
    return s->sums.groups_ran > 0 ? (double)(float)(sum / (double)s->sums.groups_ran) : (double)NAN;
}

/* Writes the step down: its allocation trace closed, the memory system's step ended, its
 * figures into *m and metrics.jsonl (rank 0), its memory into the run's series. */
static enum qc_status step_record(struct qc_trainer *t, const struct step *s,
                                  struct qc_step_metrics *m)
{
    struct qc_alloc_stats as;
    qc_alloc_stats_get(t->alloc, &as);
    train_mem_step_end(t->mem, t->model, as.bytes_active_peak, t->st.step);
    if (t->io.trace) { /* a step that ran out of memory and re-planned keeps its trace */
        qc_steptrace_mark_replans(t->io.trace, train_mem_last_step(t->mem)->replans);
        QC_TRY(qc_steptrace_end(t->io.trace, as.bytes_allocated_peak, as.bytes_reserved_peak));
    }
    *m = (struct qc_step_metrics){
        .step = t->st.step,
        .epoch = s->epoch,
        .samples = t->st.samples,
        .loss = mean_f32(s->sums.loss, s),
        .reg_loss_propose = mean_f32(s->sums.reg_loss_propose, s),
        .reg_loss_refine = mean_f32(s->sums.reg_loss_refine, s),
        .cls_loss = mean_f32(s->sums.cls_loss, s),
        .lr = s->lr,
        .skipped = s->skipped,
        .empty = s->empty,
        .loss_scale = s->loss_scale,
    };
    if (s->empty) /* no sample, no loss: null in metrics.jsonl */
        m->loss = m->reg_loss_propose = m->reg_loss_refine = m->cls_loss = (double)NAN;
    m->step_s = now_s() - s->t0;
    m->samples_per_s = m->step_s > 0 ? (double)s->sums.scenes / m->step_s : 0.0;
    train_dist_step_figures(t->dist, &s->sums, m);
    metrics_memory(m, &as, train_mem_last_step(t->mem));
    struct qc_alloc_peak_snapshot snap;
    qc_alloc_peak_snapshot_step(t->alloc, &snap);
    m->peak_reserved_live_bytes = snap.bytes_reserved_live;
    const struct qc_memreport_step mem = {
        .step = m->step,
        .bytes_allocated_peak = as.bytes_allocated_peak,
        .bytes_reserved_peak = as.bytes_reserved_peak,
    };
    QC_TRY(qc_memreport_series_add(&t->io.mem_steps, &mem));
    return t->io.log ? qc_metrics_write_step(t->io.log, m) : QC_OK;
}

enum qc_status qc_trainer_step(struct qc_trainer *t, struct qc_step_metrics *out)
{
    struct step s;
    QC_TRY(step_begin(t, &s));
    QC_TRY(step_run(t, &s));
    QC_TRY(step_decide(t, &s));
    step_advance(t, &s);
    struct qc_step_metrics m;
    QC_TRY(step_record(t, &s, &m));
    if (out)
        *out = m;
    return train_nonfinite_limit(&t->nf, &t->cfg, s.skipped, m.step, last_ckpt_str(t));
}

enum qc_status qc_trainer_save(struct qc_trainer *t, char *path_out, size_t n)
{
    /* never a checkpoint of non-finite weights (train.nonfinite=skip steps over them, so they
     * can only come from the initial weights); the parameters are whole and equal on every
     * rank, so every rank decides alike */
    int64_t bad = -1;
    QC_TRY(first_nonfinite(t, qc_qcnet_params(t->model), qc_qcnet_num_params(t->model), &bad));
    if (bad >= 0)
        return qc_errorf(QC_ERR_INVALID,
                         "train: step %" PRId64 ": parameter element %" PRId64
                         " is not finite; checkpoint not written (last checkpoint: %s)\nhint: "
                         "check the weights given to --init-from / --resume",
                         t->st.step, bad, last_ckpt_str(t));
    /* every rank (the ZeRO moments are gathered); rank 0 writes */
    QC_TRY(train_dist_save(t->dist, t->out_dir, t->model, t->optim, &t->st, &t->cfg, path_out, n));
    if (t->rank == 0) { /* the calibrated cost model rides along, and refreshes this machine's */
        QC_TRY(train_mem_save(t->mem, t->out_dir));
        qc_train_calib_refresh(&t->cfg, train_mem_cost(t->mem));
    }
    if (t->rank == 0) /* train.keep_last / keep_best */
        QC_TRY(qc_checkpoint_retain(t->out_dir, &t->cfg, NULL));
    t->last_saved = t->st.step;
    return t->io.tb ? qc_tb_sync(t->io.tb) : QC_OK;
}

// ---- the run ------------------------------------------------------------------------------------

static uint64_t peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_maxrss * 1024u;
}

enum qc_status qc_trainer_memory_report(struct qc_trainer *t, char *txt_path, size_t n)
{
    struct qc_memreport r = {0};
    r.device = qc_train_backend_name(t->be);
    r.step = t->st.step;
    r.total_steps = t->total_steps;
    qc_memreport_from_alloc(t->alloc, &r);
    struct qc_qcnet_mem mm;
    qc_qcnet_mem_get(t->model, &mm);
    r.bytes_params_grads = mm.bytes_params;
    r.bytes_peak_rss = peak_rss_bytes();
    r.steps = t->io.mem_steps.steps;
    r.nsteps = t->io.mem_steps.n;
    /* data-parallel: every rank's bytes (collective), rank 0 writes */
    struct qc_memreport_rank *ranks = NULL;
    if (!t->fail.report_alone)
        QC_TRY(train_dist_mem_ranks(t->dist, t->model, t->optim, r.stats.bytes_allocated_peak,
                                    &ranks, &r.nranks));
    r.ranks = ranks;
    r.zero_stage = t->cfg.zero_stage;
    r.plan = t->mem ? train_mem_plan_shown(t->mem) : NULL;
    r.stopped = t->fail.stopped;
    const enum qc_status st =
        t->rank == 0 ? qc_memreport_write(t->out_dir, &r, txt_path, n) : QC_OK;
    free(ranks);
    return st;
}

/* Validates the current weights and appends {"step": S, "eval": {...}} to metrics.jsonl. */
static enum qc_status trainer_validate(struct qc_trainer *t)
{
    struct qc_eval_result r;
    QC_TRY(qc_eval_model(t->model, t->alloc, &t->val.opts, &r));
    char ev[1024], line[1100];
    qc_eval_format_json(&r, ev, sizeof(ev));
    /* {"eval":{...}} -> {"step":S,"eval":{...}} */
    snprintf(line, sizeof(line), "{\"step\":%" PRId64 ",%s", t->st.step, ev + 1);
    QC_TRY(qc_metrics_write_raw(t->io.log, line));
    QC_TRY(qc_checkpoint_retain(t->out_dir, &t->cfg, NULL)); /* ranks by this line too */
    if (!t->io.quiet) {
        qc_progress_clear(t->io.prog);
        char b[6][16];
        fprintf(t->io.out,
                "eval @ step %" PRId64 ": val_loss %.4f minADE %s minFDE %s MR %s "
                "brier-minFDE %s minAHE %s minFHE %s (%" PRId64 " scenes)\n",
                t->st.step, r.loss, qc_eval_format_metric(r.metrics.min_ade, b[0], sizeof b[0]),
                qc_eval_format_metric(r.metrics.min_fde, b[1], sizeof b[1]),
                qc_eval_format_metric(r.metrics.miss_rate, b[2], sizeof b[2]),
                qc_eval_format_metric(r.metrics.brier_min_fde, b[3], sizeof b[3]),
                qc_eval_format_metric(r.metrics.min_ahe, b[4], sizeof b[4]),
                qc_eval_format_metric(r.metrics.min_fhe, b[5], sizeof b[5]), r.scenes);
    }
    return QC_OK;
}

static enum qc_status trainer_loop(struct qc_trainer *t);
static void trainer_comm_failed(void *ctx, int peer, const char *message);

enum qc_status qc_trainer_run(struct qc_trainer *t)
{
    /* SIGINT / SIGTERM: the first one finishes the step, saves and returns (qctrain exits
     * 128 + signal); a second one ends the process at once (qc_cleanup.h) */
    qc_cleanup_stop_begin();
    if (t->rank == 0) /* a failure of the communicator: rank 0 writes what it knows */
        train_dist_set_fail_hook(t->dist, trainer_comm_failed, t);
    const enum qc_status st = trainer_loop(t);
    qc_cleanup_stop_end();
    return st;
}

/* Saves, writes the memory report and flushes the log after a graceful stop at sig. With
 * several ranks every rank comes here after the same step (the signal travelled in that step's
 * exchange); none leaves before rank 0 has written everything (a launcher may end the whole job
 * as soon as one rank exits non-zero), and every rank exits 128 + the same signal. */
/* memory.json / memory.txt, then RUN/report.html (rank 0, log.report) of a run that stops,
 * saying why (stop). */
static enum qc_status stopped_report(struct qc_trainer *t, const struct qc_memreport_stop *stop)
{
    t->fail.stopped = stop;
    enum qc_status st = qc_trainer_memory_report(t, NULL, 0);
    t->fail.stopped = NULL;
    if (st == QC_OK && t->cfg.log_report && t->rank == 0) {
        const struct qc_report_opts ro = {.run_dir = t->out_dir, .step = -1};
        struct qc_report_info ri;
        st = qc_report_write(&ro, &ri);
        if (st == QC_OK)
            qc_log(QC_LOG_INFO, "train: the memory report says why the run stopped: %s", ri.path);
    }
    return st;
}

/* A step failed (st, the message in qc_error_last): one rank alone keeps the failed step's
 * trace and writes memory.json and report.html explaining why (the error names the scene and
 * the budget it needs when one does not fit). Several ranks do the same when the failure was
 * agreed in the step's exchange (t->fail.agreed: every rank is here): the report is
 * collective, rank 0 writes it naming the failed rank and its error, then every rank meets at a
 * barrier (none ends the job before rank 0 has written) and the world ends without MPI_Abort
 * (qc_dist_world_failure_agreed), every rank printing its error and exiting non-zero. Any other
 * failure of a rank of several writes nothing more (the others are not in this step any more:
 * main ends the job with MPI_Abort). Returns st with its message. */
static enum qc_status trainer_failed(struct qc_trainer *t, enum qc_status st)
{
    char msg[4096]; /* qc_error_last holds at most 4095 bytes */
    snprintf(msg, sizeof msg, "%s", qc_error_last());
    qc_progress_clear(t->io.prog);
    if (t->world == 1 || t->fail.agreed) {
        struct qc_alloc_stats as;
        qc_alloc_stats_get(t->alloc, &as);
        enum qc_status st2 = QC_OK;
        if (t->io.trace)
            st2 = qc_steptrace_end_failed(t->io.trace, as.bytes_allocated_peak,
                                          as.bytes_reserved_peak);
        struct qc_memreport_stop stop = {.reason = "error", .message = msg, .step = t->st.step + 1};
        if (t->world > 1) {
            stop.message = t->fail.msg;
            stop.rank = t->fail.rank;
            stop.failed_ranks = t->fail.ranks;
            stop.world = t->world;
        }
        /* (several ranks: a trace that failed to close skips no collective) */
        if (st2 == QC_OK || t->world > 1)
            st2 = stopped_report(t, &stop);
        if (st2 != QC_OK)
            qc_log(QC_LOG_WARN, "train: the report of the failed run could not be written: %s",
                   qc_error_last());
        else if (t->world > 1 && train_dist_barrier(t->dist) == QC_OK)
            qc_dist_world_failure_agreed();
    }
    return qc_errorf(st, "%s", msg);
}

/* The communicator ends the job (qc_dist_set_fail_hook: a peer went away, the ranks hung in
 * different collectives, an MPI error): rank 0 writes what it knows first, without waiting on any
 * other rank: memory.json / memory.txt with its own figures (no "dist" object: that needs the
 * others) and stopped naming the rank (peer; -1 when no one rank is to blame) with the error,
 * then report.html. On the communication thread, while the main thread waits on the
 * communicator; the job ends (MPI_Abort) when it returns. */
static void trainer_comm_failed(void *ctx, int peer, const char *message)
{
    struct qc_trainer *t = ctx;
    const struct qc_memreport_stop stop = {
        .reason = "error",
        .message = message,
        .step = t->st.step + 1,
        .rank = peer,
        .failed_ranks = peer >= 0 ? 1 : 0,
        .world = t->world,
    };
    t->fail.report_alone = true;
    if (stopped_report(t, &stop) != QC_OK)
        fprintf(stderr, "qctrain: rank 0: the report of the failed run could not be written: %s\n",
                qc_error_last());
}

static enum qc_status trainer_stop(struct qc_trainer *t, int sig)
{
    qc_progress_clear(t->io.prog);
    if (t->last_saved != t->st.step && t->st.step > 0)
        QC_TRY(qc_trainer_save(t, NULL, 0));
    const struct qc_memreport_stop stop = {
        .reason = sig == SIGINT ? "SIGINT" : "SIGTERM", .message = "", .step = t->st.step};
    if (t->io.mem_steps.n > 0)
        QC_TRY(stopped_report(t, &stop));
    if (t->io.log)
        QC_TRY(qc_metrics_sync(t->io.log));
    QC_TRY(train_dist_barrier(t->dist));
    qc_cleanup_stop_agree(sig);
    const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    if (t->world == 1)
        fprintf(stderr, "train: %s: stopped after step %" PRId64 " of %" PRId64 "; checkpoint %s\n",
                name, t->st.step, t->total_steps, last_ckpt_str(t));
    else if (t->rank == 0)
        fprintf(stderr,
                "train: %s on rank %d: all %d ranks stopped after step %" PRId64 " of %" PRId64
                "; checkpoint %s\n",
                name, t->stop_rank, t->world, t->st.step, t->total_steps, last_ckpt_str(t));
    return QC_OK;
}

static enum qc_status trainer_loop(struct qc_trainer *t)
{
    struct qc_progress_opts po;
    qc_progress_opts_init(&po);
    po.label = "train";
    po.unit = "steps";
    po.total = (uint64_t)(t->total_steps > 0 ? t->total_steps : 0);
    po.start = (uint64_t)(t->st.step > 0 ? t->st.step : 0); /* resumed: the rate from here */
    po.out = t->io.out;
    po.quiet = t->io.quiet;
    if (t->cfg.log_every <= 1)
        po.interval_s = 0;
    qc_progress_destroy(t->io.prog);
    t->io.prog = NULL;
    QC_TRY(qc_progress_create(&po, &t->io.prog));
    if (!t->io.quiet) {
        /* a batch holds at most the epoch's scenes (one scene of a one-scene file) */
        const int64_t nsc = qc_loader_num_scenes(t->loader);
        const int64_t per_batch =
            t->nb == 1 && nsc > 0 && nsc < t->cfg.batch_size ? nsc : t->cfg.batch_size;
        fprintf(t->io.out,
                "train: %" PRId64 " parameters, %" PRId64 " batch%s/epoch of %" PRId64
                " scene%s x %" PRId64 " group%s/step, steps %" PRId64 " -> %" PRId64 ", out %s\n",
                qc_qcnet_num_params(t->model), t->nb, t->nb == 1 ? "" : "es", per_batch,
                per_batch == 1 ? "" : "s", t->P, t->P == 1 ? "" : "s", t->st.step, t->total_steps,
                t->out_dir);
        if (t->world > 1) /* (mpirun kills its ranks 1 s after a signal of its own) */
            fprintf(t->io.out,
                    "dist: %d ranks (%s) x %" PRId64 " groups, ZeRO stage %" PRId64
                    ", data.balance %s, %s backend\n"
                    "dist: to stop gracefully, send SIGINT or SIGTERM to any rank (rank 0 is "
                    "pid %d), not to mpirun\n",
                    t->world, qc_dist_world_launcher(), t->G, t->cfg.zero_stage,
                    t->cfg.balance == QC_BALANCE_COST ? "cost" : "none",
                    t->cfg.device_kind == QC_CONFIG_DEVICE_CUDA ? "NCCL" : "MPI", (int)getpid());
    }
    qc_progress_update(t->io.prog, (uint64_t)t->st.step);
    double first_loss = (double)NAN, last_loss = (double)NAN;
    uint64_t run_peak = 0;
    double sps_sum = 0;
    int64_t sps_n = 0, empty_n = 0;
    while (t->st.step < t->total_steps) {
        struct qc_step_metrics m;
        const enum qc_status sst = qc_trainer_step(t, &m);
        if (sst != QC_OK)
            return trainer_failed(t, sst);
        if (m.empty)
            empty_n++;
        else if (isnan(first_loss))
            first_loss = m.loss;
        if (!m.empty)
            last_loss = m.loss;
        run_peak = m.peak_device_bytes > run_peak ? m.peak_device_bytes : run_peak;
        sps_sum += m.samples_per_s;
        sps_n++;
        qc_progress_set(t->io.prog, "loss", "%.4f", m.loss);
        qc_progress_set(t->io.prog, "lr", "%.2e", m.lr);
        qc_progress_set(t->io.prog, "samples/s", "%.2f", m.samples_per_s);
        qc_progress_set_bytes(t->io.prog, "mem", m.bytes_in_use);
        qc_progress_set_bytes(t->io.prog, "peak", m.peak_device_bytes);
        if (m.offload_host_bytes + m.offload_nvme_bytes > 0 && m.step_s > 0)
            qc_progress_set(t->io.prog, "offload", "%.2f GB/s",
                            (double)(m.offload_host_bytes + m.offload_nvme_bytes) / m.step_s / 1e9);
        const bool log_now =
            t->cfg.log_every <= 1 || m.step % t->cfg.log_every == 0 || m.step == t->total_steps;
        if (log_now)
            qc_progress_update(t->io.prog, (uint64_t)m.step);
        if (t->cfg.save_every > 0 && m.step % t->cfg.save_every == 0) {
            qc_progress_clear(t->io.prog);
            QC_TRY(qc_trainer_save(t, NULL, 0));
            QC_TRY(qc_trainer_memory_report(t, NULL, 0));
        }
        if (t->val.every > 0 && (m.step % t->val.every == 0 || m.step == t->total_steps) &&
            t->rank == 0) /* the others go on (their communicators answer rank 0's meanwhile) */
            QC_TRY(trainer_validate(t));
        /* several ranks stop on the signal agreed in the step's exchange, never on one that
         * arrived since: the others would not know of it */
        const int sig = t->world > 1 ? t->stop_sig : qc_cleanup_stop_signal();
        if (sig)
            return trainer_stop(t, sig);
    }
    qc_progress_finish(t->io.prog);
    if (sps_n > 0 && empty_n == sps_n)
        return qc_errorf(QC_ERR_INVALID,
                         "train: every one of the %" PRId64 " steps run had no scene that fits the "
                         "device budget (all skipped as oversized): nothing was trained\nhint: "
                         "raise device.budget, or give scenes that fit it",
                         sps_n);
    if (!t->io.quiet && sps_n == 0)
        fprintf(t->io.out, "train: already at step %" PRId64 " of %" PRId64 ": nothing to do\n",
                t->st.step, t->total_steps);
    if (t->last_saved != t->st.step && t->st.step > 0)
        QC_TRY(qc_trainer_save(t, NULL, 0));
    /* the memory report of the steps this process ran (a run with nothing to do keeps the
     * previous one) */
    char mem_txt[4200] = "";
    struct qc_report_info ri = {.path = ""};
    if (t->io.mem_steps.n > 0) {
        QC_TRY(qc_trainer_memory_report(t, mem_txt, sizeof(mem_txt)));
        if (t->cfg.log_report && t->rank == 0) { /* rank 0 writes the run folder */
            const struct qc_report_opts ro = {.run_dir = t->out_dir, .step = -1};
            QC_TRY(qc_report_write(&ro, &ri));
        }
    }
    if (!t->io.quiet && sps_n > 0) {
        struct qc_alloc_stats as;
        qc_alloc_stats_get(t->alloc, &as);
        struct qc_qcnet_mem mm;
        qc_qcnet_mem_get(t->model, &mm);
        char b1[32], b2[32], b3[32], b4[32], b5[32] = "none", empty_txt[64] = "";
        if (empty_n > 0)
            snprintf(empty_txt, sizeof empty_txt, " (%" PRId64 " empty: every scene skipped)",
                     empty_n);
        qc_format_bytes(run_peak, b1, sizeof(b1));
        qc_format_bytes(as.bytes_reserved_peak, b2, sizeof(b2));
        qc_format_bytes(mm.bytes_params, b3, sizeof(b3));
        qc_format_bytes(peak_rss_bytes(), b4, sizeof(b4));
        if (as.bytes_budget)
            qc_format_bytes(as.bytes_budget, b5, sizeof(b5));
        fprintf(t->io.out,
                "train: loss %.4f -> %.4f over %" PRId64 " steps%s, %.2f samples/s\n"
                "memory: device peak %s allocated, %s reserved (budget %s); params+grads %s; "
                "peak RSS %s\n"
                "saved %s/ckpt-%06" PRId64 "/, metrics in %s/metrics.jsonl%s%s%s\n"
                "memory report: %s\n",
                first_loss, last_loss, sps_n, empty_txt, sps_sum / (double)sps_n, b1, b2, b5, b3,
                b4, t->out_dir, t->st.step, t->out_dir, t->io.tb ? ", TensorBoard in " : "",
                t->io.tb ? t->out_dir : "", t->io.tb ? "/tb/" : "", mem_txt);
        if (ri.path[0])
            fprintf(t->io.out, "open %s\n", ri.path);
    }
    return QC_OK;
}

// ---- accessors ----------------------------------------------------------------------------------

int64_t qc_trainer_total_steps(const struct qc_trainer *t)
{
    return t->total_steps;
}

int64_t qc_trainer_steps_per_epoch(const struct qc_trainer *t)
{
    return (t->nb + t->P - 1) / t->P;
}

void qc_trainer_dist_stats(struct qc_trainer *t, struct qc_dist_stats *out)
{
    train_dist_stats(t->dist, out);
}

void qc_trainer_dist_stats_reset(struct qc_trainer *t)
{
    train_dist_stats_reset(t->dist);
}

int qc_trainer_rank(const struct qc_trainer *t)
{
    return t->rank;
}

int qc_trainer_world(const struct qc_trainer *t)
{
    return t->world;
}

const struct qc_train_state *qc_trainer_state(const struct qc_trainer *t)
{
    return &t->st;
}

struct qc_qcnet *qc_trainer_model(struct qc_trainer *t)
{
    return t->model;
}

struct qc_optim *qc_trainer_optim(struct qc_trainer *t)
{
    return t->optim;
}

struct qc_alloc *qc_trainer_alloc(struct qc_trainer *t)
{
    return t->alloc;
}

const struct qc_plan_cost *qc_trainer_plan_cost(const struct qc_trainer *t)
{
    return train_mem_cost(t->mem);
}

const char *qc_trainer_out_dir(const struct qc_trainer *t)
{
    return t->out_dir;
}

// ---- what only the tests reach (qc_trainer_test.h) ----------------------------------------------

struct qc_memctx *qc_trainer_memctx(struct qc_trainer *t)
{
    return qc_train_backend_memctx(t->be);
}

struct qc_offload *qc_trainer_offload(struct qc_trainer *t)
{
    return qc_train_backend_offload_engine(t->be);
}

void qc_trainer_set_plan_hook(struct qc_trainer *t,
                              void (*fn)(void *user, const struct qc_plan_program *prog,
                                         uint8_t *policy),
                              void *user)
{
    train_mem_set_hook(t->mem, fn, user);
}

enum qc_status qc_trainer_plans_beside(struct qc_trainer *t, bool check, int64_t *made,
                                       int64_t *differ)
{
    return train_mem_beside(t->mem, check, made, differ);
}

void qc_trainer_plans_ahead(struct qc_trainer *t, int64_t *admitted, int64_t *calibrated,
                            int64_t *differ)
{
    train_mem_ahead(t->mem, admitted, calibrated, differ);
}

void qc_trainer_parts_admitted(struct qc_trainer *t, int64_t *kept, int64_t *differ)
{
    train_mem_parts(t->mem, kept, differ);
}
