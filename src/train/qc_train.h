/*
 * qc_train.h — training QCNet: the LR schedule, AdamW over the model's flat buffers, the metrics
 * log, checkpoints (save / resume / init-from), the training loop and evaluation.
 *
 * The pieces, in the order one optimizer step uses them (QCNET.md §1, §2.5, §6):
 *   lr     = qc_lr_cosine(base, T_max, epoch)   PyTorch's CosineAnnealingLR *recursion*, stepped
 *                                               once per epoch (not the closed form)
 *   grads  = mean over the step's groups of d(loss_g)/dθ, each group a micro-batch of
 *            batch_size scenes normalised on its own (8 ranks × 4 scenes, on one rank)
 *   θ      ← AdamW(θ, grads; lr, the decay / no_decay groups)     qc_optim_step
 *   log    one metrics.jsonl line per step                        qc_metrics_*
 *   save   every save_every steps and at the end                  qc_checkpoint_save
 *
 * Determinism: a run is a pure function of (config, data, seed). The loader's batches depend
 * only on (seed, epoch); dropout masks on (seed, micro-step, block, element) through Philox;
 * every reduction has a fixed order. So two runs with the same seed give the same bits, and a
 * run resumed from a checkpoint continues with the same bits as the uninterrupted one.
 *
 * Backends (device.kind, qc_train_backend_create): cpu, cuda, and emu (the emulated device of
 * the tests). The model, its memory and the AdamW step live on the backend; host code here
 * reaches device memory only through downloads and uploads. emu gives the bits of cpu; cuda
 * agrees within fp32 tolerance and is itself deterministic (tests/test_train_device.c).
 *
 * Checkpoints (docs/CHECKPOINTS.md): a folder DIR/ckpt-<step, 6+ digits>/ holding
 *   model.safetensors  the weights, tensor names exactly QCNet's state_dict keys (all 949 of
 *                      the AV2 model, the 14 aliased LayerNorm keys written as copies), so
 *                      PyTorch's model.load_state_dict(safetensors.torch.load_file(p)) loads it;
 *   optim.safetensors  AdamW state: "exp_avg.<key>" and "exp_avg_sq.<key>" per distinct
 *                      parameter; metadata: format, step, epoch, batch position in the epoch,
 *                      seed, samples seen, the effective config (JSON).
 * The same bytes whatever the device (the saved config has device.kind cpu, ordinal 0; its
 * train.out_dir is the run folder written, so runs compared byte for byte share that path). Both
 * files are written atomically (temp + fsync + rename); the folder is assembled as
 * ckpt-<step>.tmp/ and renamed into place, so a crash never leaves a half checkpoint under the
 * final name.
 */
#ifndef QC_TRAIN_QC_TRAIN_H
#define QC_TRAIN_QC_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_qcnet.h" /* struct qc_qcnet, struct qc_qcnet_metric_values */
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_alloc;
struct qc_config;
struct qc_device;
struct qc_exec;
struct qc_loader_opts;

// ---- learning-rate schedule (optim.c) --------------------------------------------------------

/* The learning rate of epoch `epoch` (0-based) under CosineAnnealingLR(T_max = t_max,
 * eta_min = 0) stepped once per epoch, computed exactly as PyTorch 2.0 does: lr_0 = base, then
 * lr_e = (1 + cos(π e / T)) / (1 + cos(π (e−1) / T)) · lr_{e−1}, except when
 * (e − 1 − T) mod 2T == 0, where lr_e = lr_{e−1} + base·(1 − cos(π / T)) / 2. Double
 * precision, Python's operation order, so the result equals PyTorch's bit for bit (it can
 * differ from the closed form in the last bits). t_max >= 1, epoch >= 0. */
double qc_lr_cosine(double base_lr, int64_t t_max, int64_t epoch);

// ---- AdamW over flat buffers (optim.c) -------------------------------------------------------

struct qc_optim_params {
    double lr;           /* base learning rate, 5e-4 */
    double beta1, beta2; /* 0.9, 0.999 */
    double eps;          /* 1e-8 */
    double weight_decay; /* 1e-4, applied to decay segments only */
};

/* Defaults of QCNET.md §1: lr 5e-4, betas (0.9, 0.999), eps 1e-8, weight decay 1e-4. */
void qc_optim_params_default(struct qc_optim_params *p);

struct qc_optim; /* AdamW state over one flat parameter buffer (opaque) */

/* Creates the optimizer for a flat buffer of `numel` floats split into nseg tensors: tensor s
 * covers [offsets[s], offsets[s+1]) and is in the decay group when decay[s] != 0 (QCNET.md
 * §2.5). offsets (nseg+1, ascending, offsets[nseg] == numel) and decay (nseg) are copied. The
 * moments exp_avg and exp_avg_sq (numel floats each, zero) come from `alloc` (tags
 * "optim/exp_avg", "optim/exp_avg_sq") or from malloc when alloc is NULL. The CPU backend;
 * qc_optim_create_on for another. QC_ERR_NOMEM, QC_ERR_INVALID for inconsistent segments. */
enum qc_status qc_optim_create(struct qc_alloc *alloc, int64_t numel, const int64_t *offsets,
                               const uint8_t *decay, int64_t nseg,
                               const struct qc_optim_params *params, struct qc_optim **out);
/* The same with the step on backend ex (qc_exec.h; NULL = CPU, as qc_optim_create). On a
 * device backend (qc_exec_is_device) alloc is required and must hand out that backend's memory
 * (the model's allocator): the moments are device buffers zeroed with qc_op_zero, device copies
 * of offsets and decay are uploaded (tags "optim/offsets", "optim/decay"), and host code reaches
 * the moments only through qc_optim_moments_download / _upload. ex must outlive the optimizer.
 * QC_ERR_INVALID for a device backend without alloc. */
enum qc_status qc_optim_create_on(struct qc_alloc *alloc, const struct qc_exec *ex, int64_t numel,
                                  const int64_t *offsets, const uint8_t *decay, int64_t nseg,
                                  const struct qc_optim_params *params, struct qc_optim **out);
/* A sharded optimizer (ZeRO stages 1 and 2): like qc_optim_create_on over the model's segments
 * (numel, offsets, decay, nseg), but owning only elements [lo, hi) of the flat buffer: segments
 * cut at lo and hi (decay flags kept), moments of hi − lo floats; qc_optim_step still takes the
 * WHOLE param and grad buffers and updates [lo, hi) of param. The shards of several optimizers
 * give the bits of one over the whole buffer. QC_ERR_INVALID for a range outside the buffer. */
enum qc_status qc_optim_create_shard(struct qc_alloc *alloc, const struct qc_exec *ex,
                                     int64_t numel, const int64_t *offsets, const uint8_t *decay,
                                     int64_t nseg, int64_t lo, int64_t hi,
                                     const struct qc_optim_params *params, struct qc_optim **out);
/* The elements [lo, hi) of the flat buffer the optimizer owns ([0, numel) unless sharded). */
void qc_optim_range(const struct qc_optim *o, int64_t *lo, int64_t *hi);
/* Floats of the whole flat buffer (== qc_optim_numel unless sharded). */
int64_t qc_optim_numel_full(const struct qc_optim *o);
/* NULL is a no-op. */
void qc_optim_destroy(struct qc_optim *o);

/* One AdamW step at learning rate lr (PyTorch 2.0 order, QCNET.md §1): increments the step
 * count n, then for every element p ← p·(1 − lr·wd); m, v updated; p ← p − lr/(1−β1ⁿ) ·
 * m / (sqrt(v)/sqrt(1−β2ⁿ) + eps). param and grad hold the whole flat buffer (numel_full
 * floats; a sharded optimizer touches only its range), in the optimizer's backend memory (the
 * model's qc_qcnet_params / qc_qcnet_grads). One op, qc_op_adamw_step_segments, on every
 * backend (asynchronous on CUDA). */
void qc_optim_step(struct qc_optim *o, float *param, const float *grad, double lr);

/* Steps taken so far (PyTorch's state['step']). */
int64_t qc_optim_steps(const struct qc_optim *o);
/* Restores the step count (checkpoint load). */
void qc_optim_set_steps(struct qc_optim *o, int64_t steps);
/* The moments, numel floats each (the owned range: element 0 is the flat buffer's lo);
 * writable. DEVICE pointers on a device backend (host code uses qc_optim_moments_download /
 * _upload there). */
float *qc_optim_exp_avg(struct qc_optim *o);
float *qc_optim_exp_avg_sq(struct qc_optim *o);
/* Host copies of the moments (numel floats each; either may be NULL to skip it): download
 * copies out (synchronizing), upload copies in. Plain copies on CPU. QC_ERR_CUDA. */
enum qc_status qc_optim_moments_download(const struct qc_optim *o, float *exp_avg,
                                         float *exp_avg_sq);
enum qc_status qc_optim_moments_upload(struct qc_optim *o, const float *exp_avg,
                                       const float *exp_avg_sq);
/* The backend the step runs on (NULL = CPU). */
const struct qc_exec *qc_optim_exec(const struct qc_optim *o);
int64_t qc_optim_numel(const struct qc_optim *o);
/* Elements in the decay group (Σ of decay segments' sizes) and number of decay segments. */
int64_t qc_optim_decay_numel(const struct qc_optim *o, int64_t *nseg_decay);

// ---- metrics log (metrics.c) -----------------------------------------------------------------

/* One optimizer step's figures; one metrics.jsonl line. */
struct qc_step_metrics {
    int64_t step;            /* optimizer steps done (1 for the first) */
    int64_t epoch;           /* 0-based epoch the step ran in */
    int64_t samples;         /* scenes seen so far */
    double loss;             /* mean over the step's groups of loss_g (as float: %.9g) */
    double reg_loss_propose; /* the same means of the three parts */
    double reg_loss_refine;
    double cls_loss;
    double lr;                         /* learning rate used by this step */
    double step_s;                     /* wall seconds of the step */
    double samples_per_s;              /* scenes / step_s */
    uint64_t bytes_in_use;             /* allocator: allocated bytes at the end of the step */
    uint64_t peak_device_bytes;        /* allocator: allocated peak during the step */
    uint64_t reserved_bytes;           /* allocator: reserved (mapped) bytes */
    uint64_t peak_reserved_live_bytes; /* allocator, at the step's allocated peak (its snapshot,
                                          within 1 % below it): the reserved bytes holding data
                                          (segments and granules with a live block), so
                                          / peak_device_bytes is the step's fragmentation with
                                          what earlier steps left cached out */
    /* the memory system (stepmem.c): */
    uint64_t predicted_peak_bytes; /* the planner's peak for the step: the highest of the plans
                                      that ran to the end (in a step with re-plans the measured
                                      peak may come from a rolled-back attempt) */
    uint64_t peak_active_bytes;    /* allocator: active peak (allocated + blocks whose
                                      stream-ordered free waits on a copy): what the prediction
                                      models */
    uint64_t offload_host_bytes;   /* stash bytes put to the host tier */
    uint64_t offload_nvme_bytes;   /* to the NVMe tier */
    uint64_t recompute_bytes;      /* stash bytes rebuilt by recompute */
    double prefetch_stall_s;       /* host seconds backward waited for fetches */
    int64_t replans;               /* groups rolled back after running out, re-planned */
    int64_t splits;                /* batches run as sub-groups (admission control) */
    int64_t skipped_scenes;        /* oversized scenes skipped (--skip-oversized) */
    double plan_ms;                /* describing and planning the step's batches, on its path */
    double plan_ahead_ms;          /* the same made by the planning helper while the group
                                      before ran (off the step's path) */
    bool skipped;      /* train.nonfinite=skip left the parameters untouched ("skipped":true) */
    bool rolled_back;  /* a group ran out of device memory and was re-run ("rolled_back":true):
                          peak_active_bytes holds the failed attempt's allocations, so the step
                          is no measure of the planner's error */
    bool empty;        /* every scene of the step was skipped as oversized: no update, loss
                          null ("empty":true) */
    double loss_scale; /* train.precision=fp16: the scale this step ran with ("loss_scale");
                          0 = not written */
    /* data-parallel runs (ranks > 1; the keys are left out of the line otherwise) */
    int64_t ranks;          /* world size */
    double rank_time_ratio; /* slowest / mean compute time (forward + backward) of the ranks that
                               computed a group this step */
    double rank_edge_ratio; /* most / mean graph edges of those ranks' groups: the balance of the
                               work itself, free of timing noise */
    double comm_wait_s;     /* s rank 0 waited for the gradient reduction after its backward */
};

struct qc_metrics_log; /* metrics.jsonl writer (opaque) */

/* Opens DIR/metrics.jsonl for appending. When keep_through_step >= 0 (a resumed run), the
 * file is first rewritten atomically keeping only complete records (a whole line of valid
 * JSON) whose "step" is not greater, so a resumed run's log equals the uninterrupted one's and
 * a torn last line (crash, full disk) is gone; keep_through_step < 0 truncates the file (a new
 * run). QC_ERR_IO naming the path. */
enum qc_status qc_metrics_open(const char *dir, int64_t keep_through_step,
                               struct qc_metrics_log **out);
/* Appends one line, newline included, in one write() (a crash can only cut the last line).
 * QC_ERR_IO (disk full) naming the file. */
enum qc_status qc_metrics_write_step(struct qc_metrics_log *m, const struct qc_step_metrics *s);
/* Appends an arbitrary JSON object line (e.g. {"eval": ...}); `json` is one line, no newline. */
enum qc_status qc_metrics_write_raw(struct qc_metrics_log *m, const char *json);
/* fsyncs the log (a graceful stop flushes it before exiting). QC_ERR_IO. */
enum qc_status qc_metrics_sync(struct qc_metrics_log *m);
/* Every line written from now on is also passed, after it is in the file, to fn(ctx, line)
 * (the TensorBoard writer: its scalars are the log's numbers by construction); a failure of fn
 * is the write's failure. fn NULL removes the tee. */
void qc_metrics_set_tee(struct qc_metrics_log *m, enum qc_status (*fn)(void *ctx, const char *line),
                        void *ctx);
/* Closes (fsyncs) the log; NULL is a no-op. */
void qc_metrics_close(struct qc_metrics_log *m);
/* Formats one step as the JSON line written to the log (no newline) into buf (cap bytes);
 * returns the length needed. "loss" and its parts print with %.9g, "lr" with %.17g; a
 * non-finite value is null (qc_json.h). */
size_t qc_metrics_format_step(const struct qc_step_metrics *s, char *buf, size_t cap);

// ---- checkpoints (checkpoint.c) --------------------------------------------------------------

/* Where the loop stands; saved with every checkpoint. */
struct qc_train_state {
    int64_t step;           /* optimizer steps done */
    int64_t adam_step;      /* AdamW's step count (== step unless started from --init-from) */
    int64_t epoch;          /* epoch of the next batch (0-based) */
    int64_t batch_in_epoch; /* batches of `epoch` already consumed */
    int64_t samples;        /* scenes seen */
    uint64_t seed;          /* run seed (loader shuffle, dropout) */
    /* train.precision=fp16: dynamic loss scaling (docs/PRECISION.md); 1 and 0 otherwise */
    double loss_scale;       /* the loss's gradient seed is multiplied by it, a power of 2 */
    int64_t loss_scale_good; /* finite steps since the scale last changed */
};

/* Creates `path` and its parents (mkdir -p) and checks it is a writable folder. QC_ERR_IO
 * naming the folder, with a hint. */
enum qc_status qc_train_mkdir(const char *path);

/* Saves RUN/ckpt-<step, %06d>/ (model.safetensors + optim.safetensors) atomically (module
 * comment); an existing checkpoint of the same step is replaced. cfg (may be NULL) goes into
 * the metadata. The folder's path is written to path_out (n bytes) when non-NULL. QC_ERR_IO
 * naming the file (disk full, not writable); nothing is left under the final name on error. */
enum qc_status qc_checkpoint_save(const char *run_dir, struct qc_qcnet *m, struct qc_optim *o,
                                  const struct qc_train_state *s, const struct qc_config *cfg,
                                  char *path_out, size_t n);
/* The same with the AdamW moments given as host buffers of the whole flat buffer (exp_avg,
 * exp_avg_sq: qc_qcnet_num_params floats each; e.g. gathered from the shards of a ZeRO run)
 * instead of read from o (o still gives the step count). NULL moments: read from o, which must
 * then own the whole buffer (QC_ERR_INVALID for a sharded one). */
enum qc_status qc_checkpoint_save_moments(const char *run_dir, struct qc_qcnet *m,
                                          struct qc_optim *o, const float *exp_avg,
                                          const float *exp_avg_sq, const struct qc_train_state *s,
                                          const struct qc_config *cfg, char *path_out, size_t n);
/* Resolves --resume DIR: DIR itself when it holds model.safetensors, else its complete
 * ckpt-<step>/ folder of the highest step. QC_ERR_IO / QC_ERR_INVALID naming DIR. */
enum qc_status qc_checkpoint_resolve(const char *dir, char *out, size_t n);
/* The weights file of --init-from / --weights PATH: PATH itself when it is not a folder, else
 * the model.safetensors of the checkpoint qc_checkpoint_resolve finds there. */
enum qc_status qc_checkpoint_weights_path(const char *path, char *out, size_t n);
/* Reads the loop state (and, when saved_cfg != NULL, the saved configuration, applied over
 * the defaults) from CKPT/optim.safetensors. QC_ERR_INVALID naming the file and key. */
enum qc_status qc_checkpoint_read_state(const char *ckpt_dir, struct qc_train_state *s,
                                        struct qc_config *saved_cfg);
/* Loads weights (model.safetensors) and, when o != NULL, the AdamW moments (of o's range: the
 * owned shard of a sharded optimizer) and step count.
 * A checkpoint of another configuration fails naming the first mismatched tensor and both
 * shapes (QC_ERR_INVALID); a corrupt file fails naming the file. */
enum qc_status qc_checkpoint_load(const char *ckpt_dir, struct qc_qcnet *m, struct qc_optim *o,
                                  struct qc_train_state *s);
/* Checks that the options deciding what a resumed run computes (model shape, optimizer,
 * schedule, batch size, seed, synthetic data) are equal in both configs, that the groups per
 * step over all ranks (train.grad_accum × dist.world_size, the resolved world size) are equal
 * (the split between ranks and accumulation may change), and that data.balance agrees unless
 * one of them is auto. QC_ERR_INVALID naming the first differing key and both values, with a
 * hint. */
enum qc_status qc_checkpoint_check_config(const struct qc_config *saved,
                                          const struct qc_config *now, const char *ckpt_dir);
/* The model.* part of qc_checkpoint_check_config (eval --weights RUN). */
enum qc_status qc_checkpoint_check_model_config(const struct qc_config *saved,
                                                const struct qc_config *now, const char *ckpt_dir);
/* Checkpoint retention (train.keep_last, train.keep_best, docs/CHECKPOINTS.md), rank 0 with
 * RUN's lock held, after each save and each validation: keeps the newest checkpoint, the
 * keep_last newest and the keep_best with the lowest train.keep_best_metric among the "eval"
 * lines of RUN/metrics.jsonl at their step; each other ckpt-<step>/ is renamed to
 * ckpt-<step>.del/ and removed. Both keys 0: nothing removed. *removed (may be NULL) counts
 * them. QC_ERR_IO naming the folder. */
enum qc_status qc_checkpoint_retain(const char *run_dir, const struct qc_config *cfg,
                                    int64_t *removed);

// ---- the run folder (run_dir.c) --------------------------------------------------------------

struct qc_run_lock; /* the one-writer lock of a run folder (opaque) */

/* Takes RUN's lock: an exclusive flock on RUN/.lock (created; RUN must exist), the caller's PID
 * written into it, held until qc_run_lock_release or the end of the process (kill -9
 * included). Fails at once when another holder has it, in this process or another:
 * QC_ERR_INVALID naming RUN and the holder's PID, with a hint; QC_ERR_IO when the file cannot
 * be opened or locked. */
enum qc_status qc_run_lock_acquire(const char *run_dir, struct qc_run_lock **out);
/* Drops the lock; NULL is a no-op. */
void qc_run_lock_release(struct qc_run_lock *l);
/* With RUN's lock held: removes what an interrupted writer left (ckpt-<step>.tmp/ folders
 * whole, ckpt-<step>.del/ folders of an interrupted retention, *.tmp and *.tmp.XXXXXX files) and
 * puts back a ckpt-<step>.old/ whose replacement never arrived. *recovered (may be NULL) counts the
 * entries handled. QC_ERR_IO. */
enum qc_status qc_run_dir_recover(const char *run_dir, int64_t *recovered);
/* QC_ERR_INVALID naming `what` and the byte offset when s is not valid UTF-8 (run folders and
 * data paths are written into JSON: run.json, the checkpoint metadata). */
enum qc_status qc_check_utf8(const char *what, const char *s);
/* A new run into RUN: OK when RUN does not exist or holds nothing (a .lock aside);
 * otherwise QC_ERR_INVALID naming it, with the hint --resume / another --out / --overwrite.
 * overwrite: RUN is locked (a running trainer there is refused, naming its PID), renamed to
 * RUN.overwritten-<pid> in one step and that removed; the caller then creates RUN anew. */
enum qc_status qc_run_dir_check_new(const char *run_dir, bool overwrite);

/* The data of a run (RUN/run.json "data", docs/CHECKPOINTS.md): each file's absolute path,
 * size and XXH3-64 of its content; no file: generated scenes. */
struct qc_run_data_file {
    char path[4096]; /* realpath */
    uint64_t bytes;
    uint64_t xxh3; /* XXH3_64bits of the whole file */
};
struct qc_run_data {
    int n;                      /* files; 0: generated scenes */
    struct qc_run_data_file *f; /* (n), owned */
    bool recorded;              /* false: run.json records no data (a run of an older qctrain) */
    /* the validation (RUN/run.json "validation"): train's --eval-every, --val-scenes and
     * --val-data */
    bool val_recorded;  /* false: run.json records none (a run of an older qctrain) */
    int64_t eval_every; /* 0: never */
    int64_t val_scenes; /* generated validation scenes (without files) */
    int nval;           /* validation files; 0: generated scenes */
    char (*val)[4096];  /* (nval) realpaths, owned */
};
/* Hashes the files (read whole). QC_ERR_IO naming a missing or unreadable file; QC_ERR_INVALID
 * for a path that is not UTF-8. */
enum qc_status qc_run_data_describe(const char *const *paths, int n, struct qc_run_data *out);
/* Reads RUN/run.json's record (out->recorded false when there is none). */
enum qc_status qc_run_data_read(const char *run_dir, struct qc_run_data *out);
/* Sets d's validation: eval_every, val_scenes and the files' realpaths (QC_ERR_IO naming a file
 * that does not resolve). */
enum qc_status qc_run_data_set_val(struct qc_run_data *d, int64_t eval_every, int64_t val_scenes,
                                   const char *const *paths, int n);
/* The validation options of a continued run against the run's record: a value given (eval_every
 * or val_scenes >= 0, n > 0 files) that differs from the record is refused (QC_ERR_INVALID naming
 * the option and both values) unless change_data; nothing recorded: OK. */
enum qc_status qc_run_val_check(const char *run_dir, const struct qc_run_data *rec,
                                int64_t eval_every, int64_t val_scenes, const char *const *paths,
                                int n, bool change_data);
/* Writes d (its data and, when val_recorded, its validation) into RUN/run.json (rewritten
 * atomically; the rest kept). */
enum qc_status qc_run_data_record(const char *run_dir, const struct qc_run_data *d);
/* The data of a continued run against the run's record: other files, or a file whose size or
 * hash changed, are refused (QC_ERR_INVALID naming the files, or the file and both hashes)
 * unless change_data; nothing recorded: OK. */
enum qc_status qc_run_data_check(const char *run_dir, const struct qc_run_data *rec,
                                 const struct qc_run_data *now, bool change_data);
void qc_run_data_free(struct qc_run_data *d);

// ---- the training loop (loop.c) ---------------------------------------------------------------

struct qc_train_opts {
    const struct qc_config *cfg; /* effective configuration (copied at create) */
    const char *const *data;     /* qcshard files; ndata == 0: synthetic scenes on the fly */
    int ndata;
    const char *out_dir;         /* run folder; NULL: the resumed checkpoint's run folder, else
                                    cfg->out_dir */
    const char *resume;          /* checkpoint folder or run folder to continue; NULL = new run */
    const char *init_from;       /* weights (model.safetensors / a checkpoint folder); NULL = init
                                    from the seed. Exclusive with resume. */
    bool quiet;                  /* no progress line, no summary */
    FILE *progress_out;          /* NULL = stderr */
    int64_t eval_every;          /* validate every N steps and at the end; 0 = never */
    const char *const *val_data; /* qcshard files to validate on; nval == 0: held-out synthetic
                                    scenes (seed train.seed + 1) */
    int nval;
    int64_t val_scenes;  /* synthetic validation scenes when nval == 0; 0 = 8 */
    bool skip_oversized; /* a scene that does not fit the budget alone is skipped (warned,
                            counted) instead of failing the run */
};

struct qc_trainer; /* one training run (opaque) */

/* Sets up a run: the run folder's lock taken and its leftovers recovered (run_dir.c) before
 * anything in it is read, the backend of device.kind (qc_train_backend_create: the caching
 * allocator under device.budget, from which every parameter, gradient, activation, stash and
 * optimizer byte comes), the model on it (initialised, --init-from or resumed), AdamW, the loader,
 * the run folder and its metrics.jsonl. Errors name the thing at fault (data file, checkpoint, out
 * folder, device) and leave nothing half-written. QC_ERR_UNSUPPORTED (with a hint) for cuda in
 * a CPU-only build or without a GPU. The trainer must then be used from the thread that
 * created it (the CUDA op context is per thread).
 * On a device backend (cuda, emu) each batch is copied into allocator memory and handed to the
 * model as ctx.batch_dev (train_internal.h), the next one while the current one computes; the
 * losses come back from the model; checkpoints go through host buffers and are byte-identical
 * whatever the device. */
enum qc_status qc_trainer_create(const struct qc_train_opts *opts, struct qc_trainer **out);
/* NULL is a no-op. Does not save. */
void qc_trainer_destroy(struct qc_trainer *t);

/* Runs optimizer steps until qc_trainer_total_steps(), writing metrics, progress and
 * checkpoints (every cfg.save_every steps and at the end), and, with eval_every > 0, a
 * validation line {"step": S, "eval": {...}} (qc_eval_format_json) every eval_every steps and
 * at the end. A first SIGINT / SIGTERM during the run (qc_cleanup_stop_begin) finishes the
 * step, saves, writes the memory report, syncs the log and returns QC_OK with
 * qc_cleanup_stop_signal() set (qctrain then exits 128 + signal). A step with a non-finite loss
 * term or gradient follows cfg.nonfinite (qc_trainer_step). */
enum qc_status qc_trainer_run(struct qc_trainer *t);
/* One optimizer step (grad_accum micro-batches of batch_size scenes; fewer at the end of an
 * epoch); fills *out when non-NULL and appends it to metrics.jsonl. A non-finite loss term or
 * gradient: with train.nonfinite=stop, QC_ERR_INVALID naming the step and the terms, nothing
 * updated or logged; with skip, parameters, moments and AdamW's step count stay, the line is
 * logged with "skipped":true, and QC_ERR_INVALID after train.max_skipped in a row. */
enum qc_status qc_trainer_step(struct qc_trainer *t, struct qc_step_metrics *out);
/* Saves a checkpoint of the current state now (RUN/ckpt-<step>/); QC_ERR_INVALID (nothing
 * written) when a parameter is not finite. */
enum qc_status qc_trainer_save(struct qc_trainer *t, char *path_out, size_t n);

/* Data-parallel runs (mpirun / srun): this process's rank and the world size (0 and 1
 * otherwise), and the communicator's statistics (zeros with one rank; struct in qc_dist.h). */
struct qc_dist_stats;
int qc_trainer_rank(const struct qc_trainer *t);
int qc_trainer_world(const struct qc_trainer *t);
void qc_trainer_dist_stats(struct qc_trainer *t, struct qc_dist_stats *out);
void qc_trainer_dist_stats_reset(struct qc_trainer *t);

/* Steps the run goes to: cfg.steps when > 0, else cfg.epochs × steps per epoch. */
int64_t qc_trainer_total_steps(const struct qc_trainer *t);
/* Optimizer steps per epoch: ceil(groups per epoch / (grad_accum × ranks)). */
int64_t qc_trainer_steps_per_epoch(const struct qc_trainer *t);
const struct qc_train_state *qc_trainer_state(const struct qc_trainer *t);
struct qc_qcnet *qc_trainer_model(struct qc_trainer *t);
struct qc_optim *qc_trainer_optim(struct qc_trainer *t);
struct qc_alloc *qc_trainer_alloc(struct qc_trainer *t);
struct qc_plan_cost;
/* The run's cost model, calibrated from its steps (saved as RUN/plan_cost.json with each
 * checkpoint). */
const struct qc_plan_cost *qc_trainer_plan_cost(const struct qc_trainer *t);
/* The run folder in use. */
const char *qc_trainer_out_dir(const struct qc_trainer *t);
/* What only the tests reach into (the memory context, the offload engine, the plan hook) is
 * declared in qc_trainer_test.h. */

// ---- the configuration, translated for the modules (train_config.c) -------------------------

/* The model configuration of an effective configuration (model.* keys). */
void qc_train_model_config(const struct qc_config *cfg, struct qc_qcnet_config *out);
struct qc_qcnet_official;
/* The official QCNet's constructor arguments beyond the model's sizes (radii, time_span,
 * num_t2m_steps, lr, weight_decay, T_max) from cfg; the official values for cfg NULL. */
void qc_train_official_args(const struct qc_config *cfg, struct qc_qcnet_official *o);
struct qc_graph_params;
/* The graph hyper-parameters of cfg (model.* radii, time_span, num_t2m_steps, num_modes,
 * max_num_neighbors). */
void qc_train_graph_params(const struct qc_config *cfg, struct qc_graph_params *p);
/* The loader options of a training run from cfg: batch_size, threads, prefetch, shuffle,
 * balance, the graph parameters (model.* radii, time_span, num_t2m_steps, num_modes,
 * max_num_neighbors), synthetic scenes (profile, count, seeded by train.seed), target and
 * graph built. */
void qc_train_loader_opts(const struct qc_config *cfg, struct qc_loader_opts *o);

// ---- the backend of a run (backend.c) -------------------------------------------------------

struct qc_train_backend; /* where a run's model executes (opaque) */

/* "cpu" / "cuda" / "emu" for a device.kind value (enum qc_config_device); "?" otherwise. */
const char *qc_train_device_str(int64_t kind);
/* Sets up the backend of cfg->device_kind, shared by train, eval and the benches:
 *   cpu   the caching allocator's host backend (device.budget, alloc.*); ops inline;
 *   cuda  device device.ordinal and its caching allocator (device.budget, alloc.* with
 *         expandable segments per alloc.expandable_segments), the ops' context
 *         (qc_kernels_cuda: TF32 per device.tf32, a reduction workspace from the allocator)
 *         made current for the CALLING thread, ops on the device's compute stream, a copy
 *         stream for batches and a pinned host allocator for the loader;
 *   emu   for tests and debugging: a CPU device and an emulated-device arena (qc_emu.h) under
 *         the allocator; ops are the CPU ops with the arena opened around each, so host code
 *         that dereferences device memory faults; results equal cpu bit for bit.
 * Use the backend (and every model on it) from the creating thread. QC_ERR_UNSUPPORTED with a
 * hint for cuda in a CPU-only build or without a GPU; QC_ERR_NOMEM; QC_ERR_CUDA. */
enum qc_status qc_train_backend_create(const struct qc_config *cfg, struct qc_train_backend **out);
/* Frees everything (the allocator with it: destroy models and optimizers first). NULL is a
 * no-op. */
void qc_train_backend_destroy(struct qc_train_backend *b);
/* The exec of the model's ops: NULL on cpu (the model's CPU), else the device backend's. */
const struct qc_exec *qc_train_backend_exec(const struct qc_train_backend *b);
/* The caching allocator (device memory on cuda, the arena on emu, host memory on cpu). */
struct qc_alloc *qc_train_backend_alloc(struct qc_train_backend *b);
/* The memory context of the backend's models (qc_memctx.h): the allocator on the compute
 * stream. */
struct qc_memctx *qc_train_backend_memctx(struct qc_train_backend *b);
/* Gives the backend an offload tier (once): the offload engine of offload.* (host tier of
 * offload.host_capacity, or half the available memory when 0; NVMe tier in offload.nvme_dir;
 * queue depth, block size, bytes in flight, prefetch window, O_DIRECT), a copy stream for its
 * gets, and both in the memory context. The engine logs its probe and chosen rung. Errors name
 * the spill folder (QC_ERR_IO) or what the machine lacks (QC_ERR_UNSUPPORTED). */
enum qc_status qc_train_backend_offload(struct qc_train_backend *b, const struct qc_config *cfg);
struct qc_offload;
/* The offload engine, or NULL before qc_train_backend_offload. */
struct qc_offload *qc_train_backend_offload_engine(struct qc_train_backend *b);
/* The device: a CPU device on cpu and emu (its copy streams are worker threads), the GPU on
 * cuda. */
struct qc_device *qc_train_backend_device(struct qc_train_backend *b);
/* "cpu" / "cuda" / "emu". */
const char *qc_train_backend_name(const struct qc_train_backend *b);
/* The model of cfg (model.*) on b: every allocation from b's memory context, ops on b's exec
 * (qc_qcnet_create_on). Parameters are zero: initialise or load them. */
enum qc_status qc_train_backend_model(struct qc_train_backend *b, const struct qc_config *cfg,
                                      struct qc_qcnet **out);
/* qc_train_loader_opts, with the batches in b's pinned host memory on cuda. */
void qc_train_backend_loader_opts(const struct qc_train_backend *b, const struct qc_config *cfg,
                                  struct qc_loader_opts *o);

// ---- memory planning (memory/plan_run.c) ------------------------------------------------------

struct qc_plan_params;
struct qc_plan_hw;
struct qc_plan_result;
struct qc_plan_program;
struct qc_plan_cost;
struct qc_batch;

/* The planner's parameters of cfg: device.budget, plan.policy (auto searches; keep, offload,
 * recompute force one policy on every block), offload.placement, offload.prefetch_window,
 * alloc.round, plan.margin. */
void qc_train_plan_params(const struct qc_config *cfg, struct qc_plan_params *p);
/* The hardware figures of cfg: hw.pcie_gbps both ways, hw.nvme_gbps both ways, the host tier
 * (offload.host_capacity; 0: half the host's available memory; none with placement nvme) and
 * the NVMe tier (offload.nvme_capacity with offload.nvme_dir: the most the spill file may grow
 * to; 0: half the folder's free space, at most 64 GiB; none without a folder). A default (0) is
 * divided among the ranks of this node (qc_dist_world_local_size); a value given is per rank. */
void qc_train_plan_hw(const struct qc_config *cfg, struct qc_plan_hw *hw);
uint64_t qc_train_host_tier_bytes(const struct qc_config *cfg);
uint64_t qc_train_nvme_tier_bytes(const struct qc_config *cfg);
/* Device bytes a run of cfg holds through every step, as the allocator counts them:
 * parameters, gradients, AdamW moments; on device backends the AdamW segment arrays and the
 * staged batch b (may be NULL); on cuda the ops' workspace. Per rank: under dist.zero_stage 1
 * and 2 with several ranks (dist.world_size) the moments cover the rank's shard (the largest);
 * parameters and gradients stay whole (the reduction runs in place). */
uint64_t qc_train_fixed_bytes(const struct qc_config *cfg, int64_t nparams, int64_t ntensors,
                              const struct qc_batch *b);
/* The same by owner (the sum is returned). */
struct qc_train_fixed {
    uint64_t params, grads, moments; /* the AdamW moments: both, this rank's shard of them */
    uint64_t batch;                  /* the staged batch (device backends) */
    uint64_t other;                  /* the AdamW segment arrays, the ops' workspace (cuda) */
};
uint64_t qc_train_fixed_parts(const struct qc_config *cfg, int64_t nparams, int64_t ntensors,
                              const struct qc_batch *b, struct qc_train_fixed *out);
/* The ranks a plan is for: dist.world_size, 1 when 0 (no launcher). */
int64_t qc_train_plan_world(const struct qc_config *cfg);
/* The budget planning without a run uses (qctrain plan, tune, the planner session):
 * device.budget, or with device.budget 0 on cuda hw.device_memory less hw.device_reserve (a
 * GPU preset's card); 0 = none. */
uint64_t qc_train_plan_budget(const struct qc_config *cfg);

/* Whether the planner chooses the edge mode per edge set (qc_plan_make_edges): model.edge_mode
 * auto with the fused attention (materialised where the backend can, tiled where that is what
 * fits; a forced mode is kept). */
bool qc_train_edge_choose(const struct qc_config *cfg);
/* Sets the edge modes of model m (a dry one or the real one) for a plan's mask of tiled edge
 * sets (bit s: enum qc_edge_set s tiled; the others keep model.edge_mode); mask 0 gives every
 * set model.edge_mode, as a run without a choice has it. Only between steps. */
enum qc_status qc_train_edge_modes_set(struct qc_qcnet *m, const struct qc_config *cfg,
                                       uint32_t tiled);

/* A planning session that needs no run (qctrain plan, bench memory, qctrain tune; qc_plan.h,
 * "Planning without a run"): the dry model of cfg, a cost model (built-in coefficients, or the
 * file cost_path: a run folder's plan_cost.json) and the scenes of the data files (cycled when
 * a batch needs more) or, with ndata 0, generated ones (data.synthetic_profile, seeded by
 * train.seed). Nothing is allocated on a device; cfg's device.kind only decides what the
 * program holds (the CUDA blocks' allocations, the staged batch). The budget is
 * qc_train_plan_budget's. Each scene is read (or generated) and its graph built once, alone:
 * a batch is described from its scenes' summed sizes, never collated. */
struct qc_train_planner;
enum qc_status qc_train_planner_create(const struct qc_config *cfg, const char *const *data,
                                       int ndata, const char *cost_path,
                                       struct qc_train_planner **out);
void qc_train_planner_destroy(struct qc_train_planner *pl);
/* Plans one step of a batch of the first B scenes on cfg's device: the program (valid until
 * the next call, *prog when prog != NULL) and the result (qc_plan_result_free it). */
enum qc_status qc_train_planner_plan(struct qc_train_planner *pl, int64_t B,
                                     struct qc_plan_result *out,
                                     const struct qc_plan_program **prog);
/* The same for the scenes first .. first + B - 1 (an unshuffled run's batch first / B). */
enum qc_status qc_train_planner_plan_at(struct qc_train_planner *pl, int64_t first, int64_t B,
                                        struct qc_plan_result *out,
                                        const struct qc_plan_program **prog);
/* The same with the hardware figures hw (NULL: cfg's, qc_train_plan_hw) and the planner's
 * parameters par (NULL: cfg's, qc_train_plan_params): a tuner tries budgets, forced policies,
 * windows and machines it does not run on without a new session. */
enum qc_status qc_train_planner_plan_with(struct qc_train_planner *pl, int64_t first, int64_t B,
                                          const struct qc_plan_hw *hw,
                                          const struct qc_plan_params *par,
                                          struct qc_plan_result *out,
                                          const struct qc_plan_program **prog);
/* The same for any scenes: idx[0..B) (indices into the session's scenes, as scene_at counts
 * them), e.g. the B heaviest of the data (qctrain tune's heavy tail). */
enum qc_status qc_train_planner_plan_scenes(struct qc_train_planner *pl, const int64_t *idx,
                                            int64_t B, const struct qc_plan_hw *hw,
                                            const struct qc_plan_params *par,
                                            struct qc_plan_result *out,
                                            const struct qc_plan_program **prog);
/* Plans with cost model c from now on (borrowed: it must outlive its use; NULL: the session's
 * own again), e.g. the calibrated one of a short run (qc_trainer_plan_cost). */
void qc_train_planner_use_cost(struct qc_train_planner *pl, const struct qc_plan_cost *c);
/* The largest batch size <= max_b whose plan fits the budget (0: not even one scene); _with:
 * under hw and par as qc_train_planner_plan_with (par->mode QC_PLAN_MODE_KEEP: the largest
 * batch that fits kept whole, nothing offloaded or recomputed). */
enum qc_status qc_train_planner_largest(struct qc_train_planner *pl, int64_t max_b, int64_t *best);
enum qc_status qc_train_planner_largest_with(struct qc_train_planner *pl, int64_t max_b,
                                             const struct qc_plan_hw *hw,
                                             const struct qc_plan_params *par, int64_t *best);
/* The batch of the last plan, the cost model in use, the scenes in the files (0: generated). */
const struct qc_batch *qc_train_planner_batch(const struct qc_train_planner *pl);
const struct qc_plan_cost *qc_train_planner_cost(const struct qc_train_planner *pl);
int64_t qc_train_planner_scenes(const struct qc_train_planner *pl);
/* The fixed bytes of the last batch planned, by owner (qc_train_fixed_parts; the sum). */
uint64_t qc_train_planner_fixed(const struct qc_train_planner *pl, struct qc_train_fixed *out);
/* Whether the session's times are for its device: always off cuda; on cuda a calibrated cost
 * model (cost_path) or the roofline of hw.tflops and hw.mem_gbps, which the session uses on
 * cuda without a cost_path when both are given (false: the CPU's built-in coefficients, which
 * say nothing of a GPU). */
bool qc_train_planner_times_known(const struct qc_train_planner *pl);

// ---- command line (train_cli.c) -------------------------------------------------------------

struct qc_cli_strings; /* qc_cli.h */
struct qc_cli;

/* The configuration of a command that continues a saved run (train --resume, eval --weights
 * RUN): base (the saved run's) < the user's presets < --set < --device / --log-level / --quiet,
 * validated, into out. device.kind, device.ordinal and dist.world_size are this process's
 * (where and on how many ranks the run executes is not part of what it computes). Errors of a
 * preset or --set as main's. ckpt_dir (may be NULL): a model.* key that contradicts base is
 * refused first, naming the key, both values and the checkpoint
 * (qc_checkpoint_check_model_config), before the merged configuration's own checks could
 * blame another key for it. */
enum qc_status qc_train_cli_rebase(const struct qc_cli *cli, const struct qc_config *base,
                                   const char *ckpt_dir, struct qc_config *out);

/* What `qctrain train` and `qctrain eval` do after qc_cli_parse: the data files after the first
 * --data arrive as positionals and are appended to data (a positional without --data is an
 * error); each data file must open for reading (else QC_ERR_INVALID naming cmd and the path: bad
 * input, exit 2); attention ("fused" | "unfused", NULL = unchanged) sets cfg->attention.
 * QC_ERR_INVALID naming cmd, with a hint. */
enum qc_status qc_train_cli_finish(const char *cmd, const char *const *pos, int npos,
                                   struct qc_cli_strings *data, const char *attention,
                                   struct qc_config *cfg);

// ---- evaluation (eval.c) ----------------------------------------------------------------------

struct qc_eval_opts {
    const struct qc_config *cfg; /* model and graph options; batch size when batch_size == 0 */
    const char *const *data;     /* qcshard files, read in order (no shuffling) */
    int ndata;                   /* 0: synthetic scenes (synthetic_seed, cfg's profile) */
    const char *weights;         /* model.safetensors or a checkpoint folder; NULL = the
                                    untrained model initialised from cfg->seed */
    int64_t batch_size;          /* scenes per batch; 0 = cfg->batch_size */
    int64_t max_batches;         /* 0 = every batch */
    const char *dump;            /* NULL, or a safetensors path for the first batch's outputs */
    const char *predictions;     /* NULL, or a safetensors path for every focal agent's K
                                    trajectories in the world frame and their probabilities
                                    (the AV2 submission's content: tools/av2_submission) */
    uint64_t synthetic_seed;     /* scene stream when ndata == 0 */
    int64_t synthetic_scenes;    /* scenes when ndata == 0; 0 = cfg->synthetic_scenes */
    bool quiet;
};

struct qc_eval_result {
    int64_t batches, scenes;
    double loss; /* validation loss: mean over batches (as in training, §6.1) */
    double reg_loss_propose, reg_loss_refine, cls_loss;
    struct qc_qcnet_metric_values metrics; /* minADE, minFDE, MR, Brier, brier-minFDE, minAHE,
                                              minFHE (K = 6); NAN (not available) when
                                              metrics.count == 0 */
    double seconds;
    uint64_t peak_device_bytes;       /* allocator peak during the evaluation */
    struct qc_qcnet_metric_values cv; /* constant-velocity baseline on the same focal agents
                                         (K = 1: min_ade = ADE, min_fde = FDE, miss_rate = MR;
                                         its brier fields are 0) */
};

/* Evaluates model m (eval mode: no dropout, no backward) on the data of opts (opts->weights
 * is ignored). a (may be NULL) is the allocator under the model's memory context: its peak
 * during the evaluation is reported.
 * --dump: loc_propose_pos, scale_propose_pos, loc_refine_pos, scale_refine_pos (A,K,60,2) and
 * pi (A,K) of the first batch, QCNet's names, written atomically. */
enum qc_status qc_eval_model(struct qc_qcnet *m, struct qc_alloc *a,
                             const struct qc_eval_opts *opts, struct qc_eval_result *out);
/* Builds the model from opts->cfg, loads opts->weights (or initialises it), evaluates. */
enum qc_status qc_eval_run(const struct qc_eval_opts *opts, struct qc_eval_result *out);
/* One line of JSON with the result (no newline), for metrics.jsonl and --json. Metrics that
 * are not available (no focal agent evaluated: agents 0) and any non-finite figure are null. */
size_t qc_eval_format_json(const struct qc_eval_result *r, char *buf, size_t cap);
/* A metric for text output: "%.4f", or "n/a" when it is not available (NAN). Returns buf. */
const char *qc_eval_format_metric(double v, char *buf, size_t cap);

/* The constant-velocity baseline of one agent (QCNET.md §6.2 agents, §7.4 frame): for future
 * step s (0..59) the prediction is o + (s+1)·0.1 s·v with o = position[49], v = velocity[49],
 * expressed in the agent frame at t = 49 like the targets: with θ = heading[49] and
 * (dx, dy) = (s+1)·0.1·v, loc[s] = (dx·cosθ + dy·sinθ, −dx·sinθ + dy·cosθ). velocity is the
 * agent's (110,3) row, heading its (110) row; loc receives (60,2). */
void qc_eval_cv_predict(const float *heading, const float *velocity, float *loc);

struct qc_batch;
/* Adds the constant-velocity baseline of batch b's focal agents to mt as a single mode
 * (K = 1, so minADE/minFDE are ADE/FDE), through qc_qcnet_metrics_update: the same agents
 * (category 3 with a valid future step), masks and targets (b->target, or the TargetBuilder
 * output computed here when b->target is NULL) as the model's metrics. QC_ERR_NOMEM. */
enum qc_status qc_eval_cv_update(struct qc_qcnet_metrics *mt, const struct qc_batch *b);

#ifdef __cplusplus
}
#endif

#endif /* QC_TRAIN_QC_TRAIN_H */
