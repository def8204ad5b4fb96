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
 * Memory: parameters, gradients, activations, stashes, staged batches and the AdamW moments go
 * through the model's allocation hook (or the optimizer) to the caching allocator; the
 * allocator's budget (device.budget) caps them. Each step's allocated / reserved peaks are kept
 * in memory, and RUN/memory.json + RUN/memory.txt (qc_memreport.h) are rewritten at every
 * checkpoint and at the end of the run.
 */
#include "qc_train.h"
#include "train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "qc_alloc.h"
#include "qc_config.h"
#include "qc_exec.h"
#include "qc_loader.h"
#include "qc_memreport.h"
#include "qc_progress.h"

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
    int64_t nb;            /* batches per epoch */
    int64_t G;             /* groups per step (grad_accum) */
    int64_t total_steps;   /* the run ends at this step */
    bool epoch_started;    /* the loader is planned for st.epoch */
    int64_t last_saved;    /* step of the last checkpoint written (or resumed from) */
    bool warned_nonfinite; /* a non-finite loss was reported */
    bool quiet;
    FILE *out;
    int64_t eval_every;                  /* 0 = no validation */
    struct qc_eval_opts eval;            /* validation data (held-out synthetic scenes or files) */
    const char **val_paths;              /* copy of the caller's list (pointers only) */
    struct qc_memreport_step *mem_steps; /* [nmem_steps] per-step memory of this process */
    int64_t nmem_steps, cap_mem_steps;
    struct train_mem *mem; /* the step's memory system: plans, policies, admission, OOM */
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

static enum qc_status ensure_epoch(struct qc_trainer *t);

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
    t->quiet = opts->quiet;
    t->out = opts->progress_out ? opts->progress_out : stderr;
    t->G = t->cfg.grad_accum > 0 ? t->cfg.grad_accum : 1;
    t->st.seed = (uint64_t)t->cfg.seed;
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
    enum qc_status st = QC_OK;

    /* resume: the checkpoint's folder, state and configuration first */
    char ckpt[4096] = "";
    if (opts->resume) {
        struct qc_config saved;
        struct qc_train_state rs;
        st = qc_checkpoint_resolve(opts->resume, ckpt, sizeof(ckpt));
        if (st == QC_OK)
            st = qc_checkpoint_read_state(ckpt, &rs, &saved);
        if (st == QC_OK)
            st = qc_checkpoint_check_config(&saved, &t->cfg, ckpt);
        if (st != QC_OK)
            goto fail;
    }

    /* backend (device, allocator), model, optimizer */
    st = qc_train_backend_create(&t->cfg, &t->be);
    if (st != QC_OK)
        goto fail;
    t->alloc = qc_train_backend_alloc(t->be);
    st = qc_train_backend_model(t->be, &t->cfg, &t->model);
    if (st != QC_OK)
        goto fail;
    const int64_t *offsets = NULL;
    const uint8_t *decay = NULL;
    int64_t ntensors = 0;
    qc_qcnet_param_groups(t->model, &offsets, &decay, &ntensors);
    struct qc_optim_params op;
    qc_optim_params_default(&op);
    op.lr = t->cfg.lr;
    op.weight_decay = t->cfg.weight_decay;
    st = qc_optim_create_on(t->alloc, qc_train_backend_exec(t->be), qc_qcnet_num_params(t->model),
                            offsets, decay, ntensors, &op, &t->optim);
    if (st != QC_OK)
        goto fail;

    if (opts->resume) {
        st = qc_checkpoint_load(ckpt, t->model, t->optim, &t->st);
        if (st != QC_OK)
            goto fail;
        t->last_saved = t->st.step;
    } else if (opts->init_from) {
        st = load_init_from(t->model, opts->init_from);
        if (st != QC_OK)
            goto fail;
    } else {
        qc_qcnet_init_params(t->model, (uint64_t)t->cfg.seed);
    }

    /* data */
    struct qc_loader_opts lo;
    qc_train_backend_loader_opts(t->be, &t->cfg, &lo);
    st = qc_loader_create(opts->data, opts->ndata, &lo, &t->loader);
    if (st != QC_OK)
        goto fail;
    /* plan the first epoch now (the batch count is known once an epoch is planned; the
     * workers start building ahead while the rest is set up) */
    st = ensure_epoch(t);
    if (st != QC_OK)
        goto fail;
    t->nb = qc_loader_num_batches(t->loader);
    if (t->nb <= 0) {
        st = qc_errorf(QC_ERR_INVALID, "train: the data gives no batch (%" PRId64 " scenes)",
                       qc_loader_num_scenes(t->loader));
        goto fail;
    }
    const int64_t spe = (t->nb + t->G - 1) / t->G;
    t->total_steps = t->cfg.steps > 0 ? t->cfg.steps : t->cfg.epochs * spe;

    /* run folder: created once the data and the checkpoint have been read, so a failure
     * before leaves nothing behind */
    const char *dir = opts->out_dir;
    char parent[4096];
    if (!dir && opts->resume) {
        /* RUN/ckpt-000100 given: the run is its parent; a run folder given: itself */
        snprintf(parent, sizeof(parent), "%s", opts->resume);
        if (strcmp(ckpt, opts->resume) == 0) {
            size_t len = strlen(parent);
            while (len > 1 && parent[len - 1] == '/')
                parent[--len] = '\0'; /* "RUN/ckpt-000100/" */
            char *slash = strrchr(parent, '/');
            if (slash && slash != parent)
                *slash = '\0';
            else
                snprintf(parent, sizeof(parent), "%s", slash ? "/" : ".");
        }
        dir = parent;
    }
    if (!dir)
        dir = t->cfg.out_dir;
    if (!dir[0]) {
        st = qc_errorf(QC_ERR_INVALID, "train: no output folder\nhint: --out DIR");
        goto fail;
    }
    snprintf(t->out_dir, sizeof(t->out_dir), "%s", dir);
    st = qc_train_mkdir(t->out_dir);
    if (st != QC_OK)
        goto fail;

    st = train_mem_create(&t->cfg, t->be, t->model, t->out_dir, opts->skip_oversized, &t->mem);
    if (st != QC_OK)
        goto fail;
    st = qc_metrics_open(t->out_dir, opts->resume ? t->st.step : -1, &t->log);
    if (st != QC_OK)
        goto fail;
    *out = t;
    return QC_OK;
fail:
    qc_trainer_destroy(t);
    return st;
}

void qc_trainer_destroy(struct qc_trainer *t)
{
    if (!t)
        return;
    qc_progress_destroy(t->prog);
    qc_metrics_close(t->log);
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
    qc_optim_destroy(t->optim);
    qc_qcnet_destroy(t->model);
    qc_train_backend_destroy(t->be); /* the allocator with it: after everything it serves */
    free(t->val_paths);
    free(t->mem_steps);
    free(t);
}

// ---- one step -----------------------------------------------------------------------------------

/* Plans the loader for st.epoch (once) and skips the batches a resumed run already used. */
static enum qc_status ensure_epoch(struct qc_trainer *t)
{
    if (t->epoch_started)
        return QC_OK;
    QC_TRY(qc_loader_start_epoch(t->loader, t->st.epoch));
    for (int64_t i = 0; i < t->st.batch_in_epoch; i++) {
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

enum qc_status qc_trainer_step(struct qc_trainer *t, struct qc_step_metrics *out)
{
    if (t->st.batch_in_epoch >= t->nb) { /* defensive: the epoch is used up */
        t->st.epoch++;
        t->st.batch_in_epoch = 0;
        t->epoch_started = false;
    }
    QC_TRY(ensure_epoch(t));
    const int64_t left = t->nb - t->st.batch_in_epoch;
    const int64_t groups = left < t->G ? left : t->G;
    const double lr = qc_lr_cosine(t->cfg.lr, t->cfg.t_max, t->st.epoch);
    const double t0 = now_s();
    /* the step first: the step window's peak snapshot taken by the reset carries it */
    qc_alloc_set_step(t->alloc, t->st.step + 1);
    qc_alloc_reset_peak(t->alloc);
    qc_qcnet_zero_grad(t->model);
    train_mem_step_begin(t->mem, t->model);

    double sum_loss = 0, sum_rp = 0, sum_rr = 0, sum_cls = 0;
    int64_t scenes = 0;
    for (int64_t g = 0; g < groups; g++) {
        if (t->next.host) { /* staged ahead during the previous group */
            const struct train_stage tmp = t->cur;
            t->cur = t->next;
            t->next = tmp;
        } else {
            QC_TRY(stage_next(t, &t->cur));
            if (!t->cur.host)
                return qc_errorf(QC_ERR_INVALID,
                                 "train: epoch %" PRId64 " ended after %" PRId64
                                 " batches, %" PRId64 " planned",
                                 t->st.epoch, t->st.batch_in_epoch + g, t->nb);
        }
        const struct qc_qcnet_ctx ctx = {
            .training = true,
            .need_backward = true,
            .seed = t->st.seed,
            .step = (uint32_t)t->st.step,
            .micro = (uint32_t)g,
        };
        /* planned, admitted (split when it does not fit), run, rolled back and re-run when the
         * allocator runs out (stepmem.c) */
        struct train_group_out l;
        enum qc_status st =
            train_mem_group(t->mem, t->model, t->loader, &t->cur, &ctx, 1.0f / (float)groups, &l);
        scenes += l.scenes;
        qc_loader_release(t->loader, train_stage_drop(t->be, &t->cur));
        /* device backends: stage the next batch of the epoch while this one's work runs (its
         * blocks may reuse the ones just freed, in stream order) */
        if (st == QC_OK && qc_exec_is_device(qc_train_backend_exec(t->be)) &&
            t->st.batch_in_epoch + g + 1 < t->nb)
            st = stage_next(t, &t->next);
        if (st != QC_OK)
            return qc_error_wrap(st, "train: step %" PRId64 ", group %" PRId64, t->st.step + 1, g);
        /* a split group's losses are the sums of its parts' (fp32 each, as one would be) */
        sum_loss += (double)(float)l.loss;
        sum_rp += (double)(float)l.reg_loss_propose;
        sum_rr += (double)(float)l.reg_loss_refine;
        sum_cls += (double)(float)l.cls_loss;
    }
    qc_optim_step(t->optim, qc_qcnet_params(t->model), qc_qcnet_grads(t->model), lr);
    /* the step's device work done (and any asynchronous error reported) before it is timed */
    QC_TRY(qc_op_sync(qc_train_backend_exec(t->be)));

    const int64_t epoch_of_step = t->st.epoch;
    t->st.step++;
    t->st.adam_step = qc_optim_steps(t->optim);
    t->st.batch_in_epoch += groups;
    t->st.samples += scenes;
    if (t->st.batch_in_epoch >= t->nb) {
        t->st.epoch++;
        t->st.batch_in_epoch = 0;
        t->epoch_started = false;
    }

    struct qc_alloc_stats as;
    qc_alloc_stats_get(t->alloc, &as);
    train_mem_step_end(t->mem, t->model, as.bytes_active_peak, t->st.step);
    const struct train_mem_step *ms = train_mem_last_step(t->mem);
    struct qc_step_metrics m = {0};
    m.step = t->st.step;
    m.epoch = epoch_of_step;
    m.samples = t->st.samples;
    /* the mean of the group losses, rounded to fp32 as a torch scalar would be */
    m.loss = (double)(float)(sum_loss / (double)groups);
    m.reg_loss_propose = (double)(float)(sum_rp / (double)groups);
    m.reg_loss_refine = (double)(float)(sum_rr / (double)groups);
    m.cls_loss = (double)(float)(sum_cls / (double)groups);
    m.lr = lr;
    m.step_s = now_s() - t0;
    m.samples_per_s = m.step_s > 0 ? (double)scenes / m.step_s : 0.0;
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
    if (!isfinite(m.loss) && !t->warned_nonfinite) {
        qc_log(QC_LOG_WARN, "train: step %" PRId64 ": the loss is not finite (%g)", m.step, m.loss);
        t->warned_nonfinite = true;
    }
    QC_TRY(qc_metrics_write_step(t->log, &m));
    if (out)
        *out = m;
    return QC_OK;
}

enum qc_status qc_trainer_save(struct qc_trainer *t, char *path_out, size_t n)
{
    QC_TRY(qc_checkpoint_save(t->out_dir, t->model, t->optim, &t->st, &t->cfg, path_out, n));
    QC_TRY(train_mem_save(t->mem, t->out_dir)); /* the calibrated cost model rides along */
    t->last_saved = t->st.step;
    return QC_OK;
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
    r.plan = t->mem ? train_mem_plan_shown(t->mem) : NULL;
    return qc_memreport_write(t->out_dir, &r, txt_path, n);
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
        fprintf(t->out,
                "eval @ step %" PRId64 ": val_loss %.4f minADE %.3f minFDE %.3f MR %.3f "
                "brier-minFDE %.3f (%" PRId64 " scenes)\n",
                t->st.step, r.loss, r.metrics.min_ade, r.metrics.min_fde, r.metrics.miss_rate,
                r.metrics.brier_min_fde, r.scenes);
    }
    return QC_OK;
}

enum qc_status qc_trainer_run(struct qc_trainer *t)
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
                qc_qcnet_num_params(t->model), t->nb, t->cfg.batch_size, t->G, t->st.step,
                t->total_steps, t->out_dir);
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
        if (t->eval_every > 0 && (m.step % t->eval_every == 0 || m.step == t->total_steps))
            QC_TRY(trainer_validate(t));
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
    if (t->nmem_steps > 0)
        QC_TRY(qc_trainer_memory_report(t, mem_txt, sizeof(mem_txt)));
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
                "saved %s/ckpt-%06" PRId64 "/, metrics in %s/metrics.jsonl\n"
                "memory report: %s\n",
                first_loss, last_loss, sps_n, sps_sum / (double)sps_n, b1, b2, b5, b3, b4,
                t->out_dir, t->st.step, t->out_dir, mem_txt);
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
    return (t->nb + t->G - 1) / t->G;
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
