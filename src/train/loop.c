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
 * Loop position: (epoch, batch_in_epoch) names the next batch; the loader's batches depend
 * only on (seed, epoch), so a resumed run re-plans the epoch and skips the batches already
 * consumed (they are built and dropped: resume costs that much loader time, once). Dropout
 * is keyed by (seed, step, group), so the resumed run draws the same masks.
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
#include "train_dist.h"
#include "train_internal.h"

#include "qc_half.h"
#include "qc_kernels.h"

#define LOSS_SCALE_INIT 65536.0    /* 2^16, fp16's first loss scale */
#define LOSS_SCALE_MAX  16777216.0 /* 2^24 */

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
#include "qc_loader.h"
#include "qc_memreport.h"
#include "qc_progress.h"
#include "qc_report.h"
#include "qc_steptrace.h"

struct qc_trainer {
    struct qc_config cfg;
    char out_dir[4096];
    struct qc_train_backend *be; /* device, allocator, exec */
    struct qc_alloc *alloc;      /* be's allocator */
    struct qc_qcnet *model;
    struct qc_optim *optim;
    struct qc_loader *loader;
    struct qc_metrics_log *log;
    struct qc_progress *prog;
    struct train_stage cur;  /* the batch of the group being computed */
    struct train_stage next; /* the next batch of the epoch, staged ahead (device backends) */
    struct qc_train_state st;
    int64_t nb;               /* groups per epoch over all ranks (batch_in_epoch counts these) */
    int64_t G;                /* groups per rank per step (grad_accum) */
    int64_t P;                /* groups per step over all ranks: G x world */
    int rank, world;          /* this process's rank of world (0 of 1 without a launcher) */
    struct train_dist *dist;  /* data-parallel state; NULL with one rank */
    int64_t local_in_epoch;   /* this rank's batches of the epoch consumed */
    double comm_wait_seen;    /* the communicator's reduction wait already logged, s */
    int64_t total_steps;      /* the run ends at this step */
    bool epoch_started;       /* the loader is planned for st.epoch */
    int64_t last_saved;       /* step of the last checkpoint written (or resumed from) */
    struct qc_run_lock *lock; /* the run folder's one-writer lock (run_dir.c; rank 0) */
    int64_t skipped_in_row;   /* train.nonfinite=skip: consecutive skipped steps */
    int64_t skipped_total;    /* ... and all of this process's */
    int stop_sig, stop_rank;  /* several ranks: the graceful stop agreed on, and whose signal */
    float *host_check;        /* device backends: host copy for the finiteness checks */
    bool quiet;
    FILE *out;
    int64_t eval_every;                  /* 0 = no validation */
    struct qc_eval_opts eval;            /* validation data (held-out synthetic scenes or files) */
    const char **val_paths;              /* copy of the caller's list (pointers only) */
    struct qc_memreport_step *mem_steps; /* [nmem_steps] per-step memory of this process */
    int64_t nmem_steps, cap_mem_steps;
    struct qc_steptrace *trace; /* RUN/trace/: chosen steps' allocation traces; NULL = off */
    struct qc_tb *tb;           /* RUN/tb/ TensorBoard events (metrics.jsonl's tee); NULL = off */
    struct train_mem *mem;      /* the step's memory system: plans, policies, admission, OOM */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- helpers shared with eval.c and the bench ---------------------------------------------------

void qc_train_model_config(const struct qc_config *cfg, struct qc_qcnet_config *out)
{
    qc_qcnet_config_default(out);
    out->hidden_dim = cfg->hidden_dim;
    out->num_heads = cfg->num_heads;
    out->head_dim = cfg->head_dim;
    out->num_freq_bands = cfg->num_freq_bands;
    out->num_historical_steps = cfg->num_historical_steps;
    out->num_future_steps = cfg->num_future_steps;
    out->num_modes = cfg->num_modes;
    out->num_recurrent_steps = cfg->num_recurrent_steps;
    out->num_map_layers = cfg->num_map_layers;
    out->num_agent_layers = cfg->num_agent_layers;
    out->num_dec_layers = cfg->num_dec_layers;
    out->dropout = cfg->dropout;
    out->attention = cfg->attention == QC_ATTENTION_FUSED ? QC_ATTN_FUSED : QC_ATTN_UNFUSED;
    out->precision = cfg->precision;
}

void qc_train_graph_params(const struct qc_config *cfg, struct qc_graph_params *p)
{
    qc_graph_params_default(p);
    p->pl2pl_radius = cfg->pl2pl_radius;
    p->pl2a_radius = cfg->pl2a_radius;
    p->a2a_radius = cfg->a2a_radius;
    p->pl2m_radius = cfg->pl2m_radius;
    p->a2m_radius = cfg->a2m_radius;
    p->time_span = cfg->time_span;
    p->num_t2m_steps = cfg->num_t2m_steps;
    p->num_modes = cfg->num_modes;
    p->max_num_neighbors = cfg->max_num_neighbors;
}

void qc_train_loader_opts(const struct qc_config *cfg, struct qc_loader_opts *o)
{
    qc_loader_opts_default(o);
    o->batch_size = cfg->batch_size;
    o->threads = cfg->loader_threads;
    o->prefetch_batches = cfg->prefetch_batches;
    o->shuffle = cfg->shuffle;
    o->balance_cost = cfg->balance == QC_BALANCE_COST;
    o->with_target = true;
    o->build_graph = true;
    o->seed = (uint64_t)cfg->seed;
    qc_train_graph_params(cfg, &o->graph);
    o->synthetic_scenes = cfg->synthetic_scenes;
    o->synthetic_profile = (int)cfg->synthetic_profile;
    o->synthetic_seed = (uint64_t)cfg->seed;
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
                                   t->cfg.alloc_trace_max_bytes, &t->trace));
    if (t->cfg.log_tensorboard) {
        QC_TRY(qc_tb_open(t->out_dir, t->st.step + 1, &t->tb));
        qc_metrics_set_tee(t->log, tb_tee, t->tb);
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
    t->quiet = opts->quiet;
    t->out = opts->progress_out ? opts->progress_out : stderr;
    t->G = t->cfg.grad_accum > 0 ? t->cfg.grad_accum : 1;
    t->st.seed = (uint64_t)t->cfg.seed;
    t->st.loss_scale = t->cfg.precision == QC_PREC_FP16 ? LOSS_SCALE_INIT : 0.0;
    t->last_saved = -1;
    t->eval_every = opts->eval_every > 0 ? opts->eval_every : 0;
    if (opts->nval > 0) {
        t->val_paths = calloc((size_t)opts->nval, sizeof(*t->val_paths));
        if (!t->val_paths) {
            free(t);
            return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
        }
        for (int i = 0; i < opts->nval; i++)
            t->val_paths[i] = opts->val_data[i];
    }
    t->eval = (struct qc_eval_opts){
        .cfg = &t->cfg,
        .data = t->val_paths,
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
        t->quiet = true; /* rank 0 reports */

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
        if (t->cfg.precision == QC_PREC_FP16 && t->st.loss_scale <= 1.0 &&
            t->st.loss_scale_good == 0) /* a checkpoint of another precision: start afresh */
            t->st.loss_scale = LOSS_SCALE_INIT;
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
            st = qc_metrics_open(t->out_dir, opts->resume ? t->st.step : -1, &t->log);
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
    qc_progress_destroy(t->prog);
    qc_metrics_close(t->log);
    qc_run_lock_release(t->lock);
    qc_tb_close(t->tb);
    qc_steptrace_destroy(t->trace);
    if (t->model)
        qc_qcnet_release(t->model);
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
    free(t->val_paths);
    free(t->mem_steps);
    free(t->host_check);
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

/* Index of the first non-finite value of n floats of backend memory (a device buffer is
 * copied into t->host_check first, which holds as many floats as the parameters), or -1. */
static enum qc_status first_nonfinite(struct qc_trainer *t, const float *x, int64_t n,
                                      int64_t *first)
{
    const struct qc_exec *ex = qc_train_backend_exec(t->be);
    const float *h = x;
    if (qc_exec_is_device(ex)) {
        const int64_t cap = qc_qcnet_num_params(t->model);
        QC_ASSERT(n <= cap, "train: finiteness check of %" PRId64 " > %" PRId64 " floats", n, cap);
        if (!t->host_check) {
            t->host_check = malloc((size_t)(cap > 0 ? cap : 1) * sizeof(float));
            if (!t->host_check)
                return qc_errorf(QC_ERR_NOMEM, "train: out of host memory (%" PRId64 " floats)",
                                 cap);
        }
        QC_TRY(qc_op_download(ex, t->host_check, x, (size_t)n * sizeof(float)));
        h = t->host_check;
    }
    *first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(h[i])) {
            *first = i;
            break;
        }
    return QC_OK;
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

/* What went non-finite in this step, into bad ("" when nothing): the loss terms by name (each
 * is summed over the step's groups, on every rank, so one non-finite group shows), else the
 * first non-finite gradient element (found by any rank). */
static void step_nonfinite(const struct qc_trainer *t, const struct train_dist_sums *s, char *bad,
                           size_t n)
{
    bad[0] = '\0';
    const double v[3] = {s->reg_loss_propose, s->reg_loss_refine, s->cls_loss};
    const char *name[3] = {"reg_loss_propose", "reg_loss_refine", "cls_loss"};
    size_t len = 0;
    for (int i = 0; i < 3; i++)
        if (!isfinite(v[i]) && len < n)
            len +=
                (size_t)snprintf(bad + len, n - len, "%s%s = %g", len ? ", " : "", name[i], v[i]);
    if (len > 0) {
        if (len < n)
            snprintf(bad + len, n - len, " (not finite)");
        return;
    }
    if (s->bad_grad >= 0 && t->world > 1)
        snprintf(bad, n,
                 "the loss is finite but gradient element %" PRId64
                 " is not (summed over the ranks; seen by rank %d)",
                 s->bad_grad, s->bad_grad_rank);
    else if (s->bad_grad >= 0)
        snprintf(bad, n, "the loss is finite but gradient element %" PRId64 " is not", s->bad_grad);
}

// ---- fp16 dynamic loss scaling (docs/PRECISION.md) ----------------------------------------

/* QC_FAULT_GRAD_OVERFLOW_STEP=k (tests): fp16 only, +Inf into gradient element 0 at step k, after
 * the reduction and before the finiteness check that decides (grads_nonfinite), as an overflow
 * of the scaled gradients would be. Every rank writes it; under ZeRO stage 2 only rank 0's shard
 * holds element 0, and the step's exchange tells the others. */
static enum qc_status fault_grad_overflow(struct qc_trainer *t)
{
    if (t->cfg.precision != QC_PREC_FP16 || t->st.loss_scale <= 0)
        return QC_OK;
    const char *fault = getenv("QC_FAULT_GRAD_OVERFLOW_STEP");
    if (!fault || strtoll(fault, NULL, 10) != t->st.step + 1)
        return QC_OK;
    const float inf = INFINITY;
    return qc_op_upload(qc_train_backend_exec(t->be), qc_qcnet_grads(t->model), &inf, sizeof inf);
}

/* With train.precision=fp16 the gradient seed of the loss is multiplied by st.loss_scale (a
 * power of 2, from 2^16): small gradients survive fp16, large ones may overflow. After the
 * reduction: a non-finite gradient (with finite loss terms) skips the step, parameters and
 * moments untouched, and halves the scale (not below 1); otherwise the gradients are unscaled
 * exactly (a power of 2) and, after train.loss_scale_window finite steps in a row, the scale
 * doubles (up to 2^24). A non-finite loss term is no overflow: the NaN policy decides.
 * Overflow is decided from sums->bad_grad: each rank's first non-finite element of the part of
 * the gradients it holds reduced (everything, or its shard under ZeRO stage 2, where the rest
 * of its buffer is its own unsummed gradient), combined over the ranks in the step's exchange,
 * so every rank takes the same decision and keeps the same scale. The unscale covers the same
 * reduced part: every gradient AdamW reads (the whole buffer, or the rank's shard). */
static enum qc_status loss_scale_check(struct qc_trainer *t, const struct train_dist_sums *sums,
                                       bool *overflow)
{
    *overflow = false;
    if (t->cfg.precision != QC_PREC_FP16 || t->st.loss_scale <= 0)
        return QC_OK;
    /* a non-finite loss term, or a non-finite gradient at scale 1, is the NaN policy's case */
    if (!isfinite(sums->reg_loss_propose) || !isfinite(sums->reg_loss_refine) ||
        !isfinite(sums->cls_loss))
        return QC_OK;
    if (sums->bad_grad >= 0 && t->st.loss_scale > 1.0) {
        *overflow = true;
        t->st.loss_scale /= 2;
        t->st.loss_scale_good = 0;
        return QC_OK;
    }
    if (sums->bad_grad < 0) {
        int64_t lo, hi;
        train_dist_reduced_range(t->dist, qc_qcnet_num_params(t->model), &lo, &hi);
        qc_op_scale_inplace(qc_train_backend_exec(t->be), qc_qcnet_grads(t->model) + lo,
                            (float)(1.0 / t->st.loss_scale), hi - lo);
    }
    return QC_OK;
}

static void loss_scale_good_step(struct qc_trainer *t)
{
    if (t->cfg.precision != QC_PREC_FP16 || t->st.loss_scale <= 0)
        return;
    if (++t->st.loss_scale_good >= t->cfg.loss_scale_window) {
        if (t->st.loss_scale < LOSS_SCALE_MAX)
            t->st.loss_scale *= 2;
        t->st.loss_scale_good = 0;
    }
}

enum qc_status qc_trainer_step(struct qc_trainer *t, struct qc_step_metrics *out)
{
    if (t->st.batch_in_epoch >= t->nb) { /* defensive: the epoch is used up */
        t->st.epoch++;
        t->st.batch_in_epoch = 0;
        t->epoch_started = false;
    }
    QC_TRY(ensure_epoch(t));
    const int64_t left = t->nb - t->st.batch_in_epoch;
    const int64_t groups = left < t->P ? left : t->P; /* over all ranks */
    const int64_t nlocal = train_dist_local_groups(t->rank, t->world, groups);
    const int64_t nb_local = qc_loader_num_batches(t->loader);
    const double lr = qc_lr_cosine(t->cfg.lr, t->cfg.t_max, t->st.epoch);
    const double t0 = now_s();
    /* the step first: the step window's peak snapshot taken by the reset carries it */
    qc_alloc_set_step(t->alloc, t->st.step + 1);
    qc_alloc_reset_peak(t->alloc);
    if (t->trace)
        qc_steptrace_begin(t->trace, t->st.step + 1);
    qc_qcnet_zero_grad(t->model);
    QC_TRY(train_dist_step_begin(t->dist, t->st.step + 1));
    train_mem_step_begin(t->mem, t->model);

    double *losses = calloc((size_t)(nlocal > 0 ? nlocal : 1) * 4, sizeof(double));
    if (!losses)
        return qc_errorf(QC_ERR_NOMEM, "train: out of memory");
    int64_t scenes = 0, edges = 0;
    enum qc_status st = QC_OK;
    for (int64_t g = 0; g < nlocal && st == QC_OK; g++) {
        if (t->next.host) { /* staged ahead during the previous group */
            const struct train_stage tmp = t->cur;
            t->cur = t->next;
            t->next = tmp;
        } else {
            st = stage_next(t, &t->cur);
            if (st == QC_OK && !t->cur.host)
                st = qc_errorf(QC_ERR_INVALID,
                               "train: epoch %" PRId64 " ended after %" PRId64 " batches of rank "
                               "%d, %" PRId64 " planned",
                               t->st.epoch, t->local_in_epoch + g, t->rank, nb_local);
            if (st != QC_OK)
                break;
        }
        const struct qc_batch *b = t->cur.host;
        const struct qc_qcnet_ctx ctx = {
            .training = true,
            .need_backward = true,
            .seed = t->st.seed,
            .step = (uint32_t)t->st.step,
            .micro = (uint32_t)(t->rank + g * t->world), /* the step's global group index */
        };
        /* the last group's backward makes the gradients final: armed before it */
        if (g + 1 == nlocal)
            st = train_dist_arm(t->dist, qc_qcnet_grads(t->model));
        /* planned, admitted (split when it does not fit), run, rolled back and re-run when the
         * allocator runs out (stepmem.c) */
        struct train_group_out l = {0};
        /* fp16: the loss's gradient seed carries the loss scale (a power of 2) */
        const float seed_scale = t->st.loss_scale > 0 ? (float)t->st.loss_scale : 1.0f;
        if (st == QC_OK)
            st = train_mem_group(t->mem, t->model, t->loader, &t->cur, &ctx,
                                 seed_scale / (float)groups, t->dist, &l);
        scenes += l.scenes;
        edges += train_dist_batch_edges(b);
        qc_loader_release(t->loader, train_stage_drop(t->be, &t->cur));
        /* device backends: stage the next batch of the epoch while this one's work runs (its
         * blocks may reuse the ones just freed, in stream order) */
        if (st == QC_OK && qc_exec_is_device(qc_train_backend_exec(t->be)) &&
            t->local_in_epoch + g + 1 < nb_local)
            st = stage_next(t, &t->next);
        if (st != QC_OK)
            st = qc_error_wrap(st, "train: step %" PRId64 ", group %" PRId64, t->st.step + 1,
                               t->rank + g * t->world);
        /* a split group's losses are the sums of its parts' (fp32 each, as one would be) */
        losses[4 * g] = (double)(float)l.loss;
        losses[4 * g + 1] = (double)(float)l.reg_loss_propose;
        losses[4 * g + 2] = (double)(float)l.reg_loss_refine;
        losses[4 * g + 3] = (double)(float)l.cls_loss;
    }
    /* the gradients summed over ranks (they reduce while backward runs); the step's device
     * work done (and any asynchronous error reported) before they are checked and timed */
    if (st == QC_OK)
        st = train_dist_reduce(t->dist, qc_qcnet_grads(t->model));
    if (st == QC_OK)
        st = train_dist_sync(t->dist, t->be, "its device: the step's backward and reduction");
    int64_t bad_grad = -1;
    if (st == QC_OK)
        st = fault_grad_overflow(t);
    if (st == QC_OK)
        st = grads_nonfinite(t, &bad_grad);
    /* one exchange gives every rank the step's losses, any rank's graceful-stop signal and any
     * rank's non-finite gradient: the decisions below are the same on every rank */
    const struct train_dist_local mine = {
        .nlocal = nlocal,
        .loss = losses,
        .scenes = scenes,
        .edges = edges,
        .stop_signal = t->world > 1 ? qc_cleanup_stop_signal() : 0,
        .bad_grad = bad_grad,
    };
    struct train_dist_sums sums;
    if (st == QC_OK)
        st = train_dist_combine(t->dist, &mine, &sums);
    free(losses);
    QC_TRY(st);
    if (sums.stop_signal && !t->stop_sig) { /* every rank stops after this step */
        t->stop_sig = sums.stop_signal;
        t->stop_rank = sums.stop_rank;
    }

    /* non-finite numbers (train.nonfinite): the step's loss terms (summed over every rank's
     * groups), then its reduced gradients; fp16 loss scaling first: an overflow in the scaled
     * gradients skips the step and halves the scale, finite gradients are unscaled */
    const double step_scale = t->st.loss_scale;
    bool overflow = false;
    QC_TRY(loss_scale_check(t, &sums, &overflow));
    char bad[160];
    bad[0] = '\0';
    if (!overflow)
        step_nonfinite(t, &sums, bad, sizeof bad);
    bool skipped = bad[0] != '\0';
    if (overflow) {
        skipped = true;
    } else if (skipped && t->cfg.nonfinite == QC_NONFINITE_STOP)
        return qc_errorf(QC_ERR_INVALID,
                         "train: step %" PRId64 ": %s; stopped before updating the parameters "
                         "(last checkpoint: %s)\nhint: lower train.lr, check the data (qctrain "
                         "inspect), or set train.nonfinite=skip to step over such batches",
                         t->st.step + 1, bad, last_ckpt_str(t));
    if (!skipped) {
        /* AdamW on this rank's part, the parameters gathered (ZeRO) */
        qc_optim_step(t->optim, qc_qcnet_params(t->model), qc_qcnet_grads(t->model), lr);
        QC_TRY(train_dist_update(t->dist, qc_qcnet_params(t->model)));
        t->skipped_in_row = 0;
        loss_scale_good_step(t);
    } else if (overflow) {
        qc_log(QC_LOG_INFO,
               "train: step %" PRId64 ": fp16 gradients overflowed at loss scale %g; skipped, "
               "scale now %g",
               t->st.step + 1, step_scale, t->st.loss_scale);
    } else {
        /* skip: parameters, moments and AdamW's step count stay as they were */
        t->skipped_in_row++;
        t->skipped_total++;
        qc_log(QC_LOG_WARN,
               "train: step %" PRId64 ": %s; skipped (%" PRId64 " in a row, %" PRId64
               " in all; train.max_skipped = %" PRId64 ")",
               t->st.step + 1, bad, t->skipped_in_row, t->skipped_total, t->cfg.max_skipped);
    }
    /* every rank's loss-scale decision (debug): the ranks must agree on every step */
    if (t->cfg.precision == QC_PREC_FP16 && step_scale > 0)
        qc_log(QC_LOG_DEBUG,
               "train: step %" PRId64 " (rank %d of %d): fp16 loss scale %g: %s; next %g",
               t->st.step + 1, t->rank, t->world, step_scale,
               overflow ? "overflow, skipped" : (skipped ? "skipped" : "applied"),
               t->st.loss_scale);
    QC_TRY(train_dist_sync(t->dist, t->be, "its device: the step's update"));
    train_dist_step_end(t->dist);

    const int64_t epoch_of_step = t->st.epoch;
    t->st.step++;
    t->st.adam_step = qc_optim_steps(t->optim);
    t->st.batch_in_epoch += groups;
    t->local_in_epoch += nlocal;
    t->st.samples += sums.scenes;
    if (t->st.batch_in_epoch >= t->nb) {
        t->st.epoch++;
        t->st.batch_in_epoch = 0;
        t->epoch_started = false;
    }

    struct qc_alloc_stats as;
    qc_alloc_stats_get(t->alloc, &as);
    if (t->trace)
        QC_TRY(qc_steptrace_end(t->trace, as.bytes_allocated_peak, as.bytes_reserved_peak));
    train_mem_step_end(t->mem, t->model, as.bytes_active_peak, t->st.step);
    const struct train_mem_step *ms = train_mem_last_step(t->mem);
    struct qc_step_metrics m = {0};
    m.step = t->st.step;
    m.epoch = epoch_of_step;
    m.samples = t->st.samples;
    /* the mean of the group losses, rounded to fp32 as a torch scalar would be */
    m.loss = (double)(float)(sums.loss / (double)groups);
    m.reg_loss_propose = (double)(float)(sums.reg_loss_propose / (double)groups);
    m.reg_loss_refine = (double)(float)(sums.reg_loss_refine / (double)groups);
    m.cls_loss = (double)(float)(sums.cls_loss / (double)groups);
    m.lr = lr;
    m.step_s = now_s() - t0;
    m.samples_per_s = m.step_s > 0 ? (double)sums.scenes / m.step_s : 0.0;
    if (t->world > 1) {
        m.ranks = t->world;
        m.rank_time_ratio = sums.rank_time_ratio;
        m.rank_edge_ratio = sums.rank_edge_ratio;
        struct qc_dist_stats ds;
        train_dist_stats(t->dist, &ds);
        m.comm_wait_s = ds.grads_wait_s - t->comm_wait_seen;
        t->comm_wait_seen = ds.grads_wait_s;
    }
    m.bytes_in_use = as.bytes_allocated;
    m.peak_device_bytes = as.bytes_allocated_peak;
    m.reserved_bytes = as.bytes_reserved;
    m.predicted_peak_bytes = ms->predicted_peak;
    m.peak_active_bytes = as.bytes_active_peak;
    m.offload_host_bytes = ms->host_bytes;
    m.offload_nvme_bytes = ms->nvme_bytes;
    m.recompute_bytes = ms->recompute_bytes;
    m.prefetch_stall_s = ms->stall_s;
    m.replans = ms->replans;
    m.splits = ms->splits;
    m.skipped_scenes = ms->skipped;
    m.plan_ms = 1e3 * ms->plan_s;
    if (t->nmem_steps == t->cap_mem_steps) {
        const int64_t cap = t->cap_mem_steps ? 2 * t->cap_mem_steps : 64;
        struct qc_memreport_step *ns = realloc(t->mem_steps, (size_t)cap * sizeof(*ns));
        if (!ns)
            return qc_errorf(QC_ERR_NOMEM, "train: out of memory (memory series)");
        t->mem_steps = ns;
        t->cap_mem_steps = cap;
    }
    t->mem_steps[t->nmem_steps++] = (struct qc_memreport_step){
        .step = m.step,
        .bytes_allocated_peak = as.bytes_allocated_peak,
        .bytes_reserved_peak = as.bytes_reserved_peak,
    };
    m.skipped = skipped;
    m.loss_scale = step_scale;
    if (t->log)
        QC_TRY(qc_metrics_write_step(t->log, &m));
    if (out)
        *out = m;
    if (skipped && t->skipped_in_row >= t->cfg.max_skipped)
        return qc_errorf(QC_ERR_INVALID,
                         "train: %" PRId64 " steps in a row had non-finite numbers, the last "
                         "one step %" PRId64 " (train.max_skipped = %" PRId64
                         "); stopped (last checkpoint: %s)\nhint: lower train.lr or check the "
                         "data (qctrain inspect)",
                         t->skipped_in_row, m.step, t->cfg.max_skipped, last_ckpt_str(t));
    return QC_OK;
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
    if (t->rank == 0) /* the calibrated cost model rides along */
        QC_TRY(train_mem_save(t->mem, t->out_dir));
    t->last_saved = t->st.step;
    return t->tb ? qc_tb_sync(t->tb) : QC_OK;
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
    r.steps = t->mem_steps;
    r.nsteps = t->nmem_steps;
    /* data-parallel: every rank's bytes (collective), rank 0 writes */
    struct qc_memreport_rank *ranks = NULL;
    QC_TRY(train_dist_mem_ranks(t->dist, t->model, t->optim, r.stats.bytes_allocated_peak, &ranks,
                                &r.nranks));
    r.ranks = ranks;
    r.zero_stage = t->cfg.zero_stage;
    r.plan = t->mem ? train_mem_plan_shown(t->mem) : NULL;
    const enum qc_status st =
        t->rank == 0 ? qc_memreport_write(t->out_dir, &r, txt_path, n) : QC_OK;
    free(ranks);
    return st;
}

/* Validates the current weights and appends {"step": S, "eval": {...}} to metrics.jsonl. */
static enum qc_status trainer_validate(struct qc_trainer *t)
{
    struct qc_eval_result r;
    QC_TRY(qc_eval_model(t->model, t->alloc, &t->eval, &r));
    char ev[1024], line[1100];
    qc_eval_format_json(&r, ev, sizeof(ev));
    /* {"eval":{...}} -> {"step":S,"eval":{...}} */
    snprintf(line, sizeof(line), "{\"step\":%" PRId64 ",%s", t->st.step, ev + 1);
    QC_TRY(qc_metrics_write_raw(t->log, line));
    if (!t->quiet) {
        qc_progress_clear(t->prog);
        char b[6][16];
        fprintf(t->out,
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

enum qc_status qc_trainer_run(struct qc_trainer *t)
{
    /* SIGINT / SIGTERM: the first one finishes the step, saves and returns (qctrain exits
     * 128 + signal); a second one ends the process at once (qc_cleanup.h) */
    qc_cleanup_stop_begin();
    const enum qc_status st = trainer_loop(t);
    qc_cleanup_stop_end();
    return st;
}

/* Saves, writes the memory report and flushes the log after a graceful stop at sig. With
 * several ranks every rank comes here after the same step (the signal travelled in that step's
 * exchange); none leaves before rank 0 has written everything (a launcher may end the whole job
 * as soon as one rank exits non-zero), and every rank exits 128 + the same signal. */
static enum qc_status trainer_stop(struct qc_trainer *t, int sig)
{
    qc_progress_clear(t->prog);
    if (t->last_saved != t->st.step && t->st.step > 0)
        QC_TRY(qc_trainer_save(t, NULL, 0));
    if (t->nmem_steps > 0)
        QC_TRY(qc_trainer_memory_report(t, NULL, 0));
    if (t->log)
        QC_TRY(qc_metrics_sync(t->log));
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
    po.out = t->out;
    po.quiet = t->quiet;
    if (t->cfg.log_every <= 1)
        po.interval_s = 0;
    qc_progress_destroy(t->prog);
    t->prog = NULL;
    QC_TRY(qc_progress_create(&po, &t->prog));
    if (!t->quiet) {
        fprintf(t->out,
                "train: %" PRId64 " parameters, %" PRId64 " batches/epoch of %" PRId64
                " scenes x %" PRId64 " groups/step, steps %" PRId64 " -> %" PRId64 ", out %s\n",
                qc_qcnet_num_params(t->model), t->nb, t->cfg.batch_size, t->P, t->st.step,
                t->total_steps, t->out_dir);
        if (t->world > 1) /* (mpirun kills its ranks 1 s after a signal of its own) */
            fprintf(t->out,
                    "dist: %d ranks (%s) x %" PRId64 " groups, ZeRO stage %" PRId64
                    ", data.balance %s, %s backend\n"
                    "dist: to stop gracefully, send SIGINT or SIGTERM to any rank (rank 0 is "
                    "pid %d), not to mpirun\n",
                    t->world, qc_dist_world_launcher(), t->G, t->cfg.zero_stage,
                    t->cfg.balance == QC_BALANCE_COST ? "cost" : "none",
                    t->cfg.device_kind == QC_CONFIG_DEVICE_CUDA ? "NCCL" : "MPI", (int)getpid());
    }
    qc_progress_update(t->prog, (uint64_t)t->st.step);
    double first_loss = (double)NAN, last_loss = (double)NAN;
    uint64_t run_peak = 0;
    double sps_sum = 0;
    int64_t sps_n = 0;
    while (t->st.step < t->total_steps) {
        struct qc_step_metrics m;
        QC_TRY(qc_trainer_step(t, &m));
        if (isnan(first_loss))
            first_loss = m.loss;
        last_loss = m.loss;
        run_peak = m.peak_device_bytes > run_peak ? m.peak_device_bytes : run_peak;
        sps_sum += m.samples_per_s;
        sps_n++;
        qc_progress_set(t->prog, "loss", "%.4f", m.loss);
        qc_progress_set(t->prog, "lr", "%.2e", m.lr);
        qc_progress_set(t->prog, "samples/s", "%.2f", m.samples_per_s);
        qc_progress_set_bytes(t->prog, "mem", m.bytes_in_use);
        qc_progress_set_bytes(t->prog, "peak", m.peak_device_bytes);
        if (m.offload_host_bytes + m.offload_nvme_bytes > 0 && m.step_s > 0)
            qc_progress_set(t->prog, "offload", "%.2f GB/s",
                            (double)(m.offload_host_bytes + m.offload_nvme_bytes) / m.step_s / 1e9);
        const bool log_now =
            t->cfg.log_every <= 1 || m.step % t->cfg.log_every == 0 || m.step == t->total_steps;
        if (log_now)
            qc_progress_update(t->prog, (uint64_t)m.step);
        if (t->cfg.save_every > 0 && m.step % t->cfg.save_every == 0) {
            qc_progress_clear(t->prog);
            QC_TRY(qc_trainer_save(t, NULL, 0));
            QC_TRY(qc_trainer_memory_report(t, NULL, 0));
        }
        if (t->eval_every > 0 && (m.step % t->eval_every == 0 || m.step == t->total_steps) &&
            t->rank == 0) /* the others go on (their communicators answer rank 0's meanwhile) */
            QC_TRY(trainer_validate(t));
        /* several ranks stop on the signal agreed in the step's exchange, never on one that
         * arrived since: the others would not know of it */
        const int sig = t->world > 1 ? t->stop_sig : qc_cleanup_stop_signal();
        if (sig)
            return trainer_stop(t, sig);
    }
    qc_progress_finish(t->prog);
    if (!t->quiet && sps_n == 0)
        fprintf(t->out, "train: already at step %" PRId64 " of %" PRId64 ": nothing to do\n",
                t->st.step, t->total_steps);
    if (t->last_saved != t->st.step && t->st.step > 0)
        QC_TRY(qc_trainer_save(t, NULL, 0));
    /* the memory report of the steps this process ran (a run with nothing to do keeps the
     * previous one) */
    char mem_txt[4200] = "";
    struct qc_report_info ri = {.path = ""};
    if (t->nmem_steps > 0) {
        QC_TRY(qc_trainer_memory_report(t, mem_txt, sizeof(mem_txt)));
        if (t->cfg.log_report && t->rank == 0) { /* rank 0 writes the run folder */
            const struct qc_report_opts ro = {.run_dir = t->out_dir, .step = -1};
            QC_TRY(qc_report_write(&ro, &ri));
        }
    }
    if (!t->quiet && sps_n > 0) {
        struct qc_alloc_stats as;
        qc_alloc_stats_get(t->alloc, &as);
        struct qc_qcnet_mem mm;
        qc_qcnet_mem_get(t->model, &mm);
        char b1[32], b2[32], b3[32], b4[32], b5[32] = "none";
        qc_format_bytes(run_peak, b1, sizeof(b1));
        qc_format_bytes(as.bytes_reserved_peak, b2, sizeof(b2));
        qc_format_bytes(mm.bytes_params, b3, sizeof(b3));
        qc_format_bytes(peak_rss_bytes(), b4, sizeof(b4));
        if (as.bytes_budget)
            qc_format_bytes(as.bytes_budget, b5, sizeof(b5));
        fprintf(t->out,
                "train: loss %.4f -> %.4f over %" PRId64 " steps, %.2f samples/s\n"
                "memory: device peak %s allocated, %s reserved (budget %s); params+grads %s; "
                "peak RSS %s\n"
                "saved %s/ckpt-%06" PRId64 "/, metrics in %s/metrics.jsonl%s%s%s\n"
                "memory report: %s\n",
                first_loss, last_loss, sps_n, sps_sum / (double)sps_n, b1, b2, b5, b3, b4,
                t->out_dir, t->st.step, t->out_dir, t->tb ? ", TensorBoard in " : "",
                t->tb ? t->out_dir : "", t->tb ? "/tb/" : "", mem_txt);
        if (ri.path[0])
            fprintf(t->out, "open %s\n", ri.path);
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

struct qc_memctx *qc_trainer_memctx(struct qc_trainer *t)
{
    return qc_train_backend_memctx(t->be);
}

struct qc_offload *qc_trainer_offload(struct qc_trainer *t)
{
    return qc_train_backend_offload_engine(t->be);
}

const struct qc_plan_cost *qc_trainer_plan_cost(const struct qc_trainer *t)
{
    return train_mem_cost(t->mem);
}

void qc_trainer_set_plan_hook(struct qc_trainer *t,
                              void (*fn)(void *user, const struct qc_plan_program *prog,
                                         uint8_t *policy),
                              void *user)
{
    train_mem_set_hook(t->mem, fn, user);
}

const char *qc_trainer_out_dir(const struct qc_trainer *t)
{
    return t->out_dir;
}
