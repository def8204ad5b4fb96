/*
 * cmd_train.c — `qctrain train [--data FILE...] [--steps N | --epochs N] [--save-every N]
 * [--out DIR] [--resume DIR | --init-from FILE]`: trains QCNet (src/train/qc_train.h).
 *
 * With no --data it trains on synthetic scenes generated on the fly (data.synthetic_scenes
 * per epoch, data.synthetic_profile sizes, seeded by train.seed). DIR receives metrics.jsonl
 * and one checkpoint folder per save, ckpt-<step>/ (docs/CHECKPOINTS.md). The backend is the
 * global --device (device.kind: cpu | cuda | emu), set up by the trainer (src/train/backend.c).
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "qc_config.h"
#include "qc_dist.h" /* qc_dist_launch_detect: the rank before the world is joined */
#include "qc_train.h"

static const char train_usage[] =
    "[--data FILE...] [--steps N | --epochs N] [--save-every N] [--out DIR] [--overwrite] "
    "[--resume DIR [--change-data] | --init-from FILE] [--skip-oversized]";
static const char train_summary[] =
    "Trains QCNet: on qcshard files (--data) or, without them, on synthetic scenes generated on "
    "the fly. Shows progress (loss, samples/s, device memory in use and peak), writes "
    "DIR/metrics.jsonl and checkpoints DIR/ckpt-<step>/ (QCNet state_dict keys, loadable by "
    "PyTorch). A fixed seed gives the same bits; --resume continues bit for bit, with the run's "
    "own configuration and data (RUN/run.json): options that contradict the run are refused. "
    "A new run needs an empty --out folder (--overwrite clears one). Runs on the "
    "global --device: cpu, cuda, or emu (CPU ops on emulated device memory, for tests and "
    "debugging); checkpoints are the same files whatever the device. Under mpirun -np N or srun "
    "-n N it trains on N ranks (docs/DISTRIBUTED.md).";

#define NOT_GIVEN INT64_MIN /* an option left out: the configuration's value */

/* The folder a checkpoint folder belongs to ("RUN/ckpt-000100" -> "RUN"). */
static void parent_dir(const char *ckpt, char *out, size_t n)
{
    snprintf(out, n, "%s", ckpt);
    char *slash = strrchr(out, '/');
    if (slash && slash != out)
        *slash = '\0';
    else
        snprintf(out, n, "%s", slash ? "/" : ".");
}

/* True when a and b name the same existing folder. */
static bool same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

enum qc_status qc_cmd_train(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0}, val = {0};
    int64_t eval_every = NOT_GIVEN, val_scenes = NOT_GIVEN; /* with --resume: the run's */
    bool skip_oversized = false, overwrite = false, change_data = false;
    const char *out = NULL, *resume = NULL, *init_from = NULL, *attention = NULL;
    int64_t steps = NOT_GIVEN, epochs = NOT_GIVEN, save_every = NOT_GIVEN;
    int64_t batch_size = NOT_GIVEN, grad_accum = NOT_GIVEN, seed = NOT_GIVEN;
    char d_steps[32], d_epochs[32], d_save[32], d_bs[32], d_ga[32], d_seed[32];
    snprintf(d_steps, sizeof(d_steps), "%" PRId64, cfg.steps);
    snprintf(d_epochs, sizeof(d_epochs), "%" PRId64, cfg.epochs);
    snprintf(d_save, sizeof(d_save), "%" PRId64, cfg.save_every);
    snprintf(d_bs, sizeof(d_bs), "%" PRId64, cfg.batch_size);
    snprintf(d_ga, sizeof(d_ga), "%" PRId64, cfg.grad_accum);
    snprintf(d_seed, sizeof(d_seed), "%" PRId64, cfg.seed);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "",
         "qcshard file(s) to train on; none: synthetic scenes on the fly (with --resume: the "
         "run's own data)"},
        {"steps", QC_CLI_INT, &steps, d_steps, "optimizer steps to reach (0: run --epochs)"},
        {"epochs", QC_CLI_INT, &epochs, d_epochs, "epochs, when --steps is 0"},
        {"save-every", QC_CLI_INT, &save_every, d_save,
         "steps between checkpoints (0: only at the end)"},
        {"out", QC_CLI_STRING, &out, cfg.out_dir,
         "run folder: metrics.jsonl and ckpt-<step>/ checkpoints; must be empty for a new run"},
        {"overwrite", QC_CLI_FLAG, &overwrite, "",
         "clear a non-empty --out folder first (moved aside in one step, then removed)"},
        {"resume", QC_CLI_STRING, &resume, "",
         "continue a run from a checkpoint folder (or the newest one of a run folder), with its "
         "configuration and data"},
        {"change-data", QC_CLI_FLAG, &change_data, "",
         "with --resume: continue on other --data, or on data files changed since the run "
         "started, or with other --eval-every / --val-data / --val-scenes"},
        {"init-from", QC_CLI_STRING, &init_from, "",
         "start from these weights (QCNet state_dict safetensors, or a checkpoint folder)"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, "scenes per group (micro-batch)"},
        {"grad-accum", QC_CLI_INT, &grad_accum, d_ga,
         "groups per optimizer step; the step's loss is the mean of the group losses"},
        {"seed", QC_CLI_INT, &seed, d_seed, "run seed: initialisation, shuffling, dropout"},
        {"eval-every", QC_CLI_INT, &eval_every, "0",
         "validate every N steps and at the end (metrics.jsonl \"eval\" lines); 0: never "
         "(with --resume: the run's)"},
        {"val-data", QC_CLI_STRINGS, &val, "",
         "qcshard file(s) to validate on; none: held-out synthetic scenes (seed + 1) (with "
         "--resume: the run's)"},
        {"val-scenes", QC_CLI_INT, &val_scenes, "8",
         "synthetic validation scenes (with --resume: the run's)"},
        {"attention", QC_CLI_STRING, &attention,
         cfg.attention == QC_ATTENTION_FUSED ? "fused" : "unfused",
         "attention implementation: fused | unfused"},
        {"skip-oversized", QC_CLI_FLAG, &skip_oversized, "",
         "skip (with a warning) a scene that does not fit device.budget even alone, instead of "
         "stopping with an error naming it"},
    };
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("train", train_usage, train_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, pos, QC_CLI_STRINGS_MAX,
                        &npos, &help));
    if (help)
        return QC_OK;
    QC_TRY(qc_train_cli_finish("train", pos, npos, &data, NULL, &cfg));
    if (out)
        QC_TRY(qc_check_utf8("train: --out", out));
    if (resume)
        QC_TRY(qc_check_utf8("train: --resume", resume));
    if (change_data && !resume)
        return qc_errorf(QC_ERR_INVALID, "train: --change-data goes with --resume\nhint: a new "
                                         "run trains on whatever --data it is given");

    /* --resume: the run's own configuration, with the user's presets and --set over it */
    char ckpt[4096] = "", ckpt_run[4096] = "";
    struct qc_config saved;
    if (resume) {
        /* a trainer running in that run folder is named first (it may not have saved yet) */
        char probe[4200];
        struct stat sb;
        snprintf(probe, sizeof probe, "%s/model.safetensors", resume);
        if (stat(probe, &sb) == 0)
            parent_dir(resume, probe, sizeof probe);
        else
            snprintf(probe, sizeof probe, "%s", resume);
        struct qc_run_lock *lock = NULL;
        /* rank 0 only: the job's other ranks would find rank 0's own lock (the trainer takes
         * it on rank 0 while they are still here) and stop the job as "in use" */
        struct qc_dist_launch launch;
        qc_dist_launch_detect(&launch);
        if (launch.rank == 0 && stat(probe, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            const enum qc_status ls = qc_run_lock_acquire(probe, &lock);
            if (ls == QC_ERR_INVALID) /* in use: the error names the holder's PID */
                return ls;
            if (ls != QC_OK)
                qc_error_clear(); /* not lockable here: the resolve below says what is wrong */
            qc_run_lock_release(lock);
        }
        struct qc_train_state rs;
        QC_TRY(qc_checkpoint_resolve(resume, ckpt, sizeof(ckpt)));
        QC_TRY(qc_checkpoint_read_state(ckpt, &rs, &saved));
        QC_TRY(qc_train_cli_rebase(cli, &saved, ckpt, &cfg));
        parent_dir(ckpt, ckpt_run, sizeof(ckpt_run));
    }
    QC_TRY(qc_train_cli_finish("train", NULL, 0, &data, attention, &cfg));
    if ((steps != NOT_GIVEN && steps < 0) || (epochs != NOT_GIVEN && epochs < 0) ||
        (save_every != NOT_GIVEN && save_every < 0) ||
        (eval_every != NOT_GIVEN && eval_every < 0) ||
        (batch_size != NOT_GIVEN && batch_size < 1) ||
        (grad_accum != NOT_GIVEN && grad_accum < 1) || (val_scenes != NOT_GIVEN && val_scenes < 1))
        return qc_errorf(QC_ERR_INVALID,
                         "train: --steps, --epochs, --save-every and --eval-every must be >= 0, "
                         "--batch-size, --grad-accum and --val-scenes >= 1");
    cfg.steps = steps != NOT_GIVEN ? steps : cfg.steps;
    cfg.epochs = epochs != NOT_GIVEN ? epochs : cfg.epochs;
    cfg.save_every = save_every != NOT_GIVEN ? save_every : cfg.save_every;
    cfg.batch_size = batch_size != NOT_GIVEN ? batch_size : cfg.batch_size;
    cfg.grad_accum = grad_accum != NOT_GIVEN ? grad_accum : cfg.grad_accum;
    cfg.seed = seed != NOT_GIVEN ? seed : cfg.seed;
    if (cfg.steps == 0 && cfg.epochs == 0)
        return qc_errorf(QC_ERR_INVALID, "train: nothing to do (--steps 0 and --epochs 0)");
    if (out)
        snprintf(cfg.out_dir, sizeof(cfg.out_dir), "%s", out);
    QC_TRY(qc_check_utf8("train: train.out_dir", cfg.out_dir));
    QC_TRY(qc_config_validate(&cfg));
    struct qc_dist_launch launch;
    qc_dist_launch_detect(&launch);
    if (resume && grad_accum == NOT_GIVEN && cfg.grad_accum == saved.grad_accum) {
        /* on another number of ranks the run keeps its groups per step (ranks x grad_accum,
         * docs/CHECKPOINTS.md): the accumulation follows unless it was given */
        const int64_t w_now = cfg.world_size > 0  ? cfg.world_size
                              : launch.size_known ? launch.size
                                                  : 0;
        const int64_t w_saved = saved.world_size > 0 ? saved.world_size : 1;
        const int64_t groups = saved.grad_accum * w_saved;
        if (w_now > 0 && w_now != w_saved && groups % w_now == 0)
            cfg.grad_accum = groups / w_now;
    }
    if (resume && (cfg.world_size > 0 || launch.size_known)) {
        /* a contradiction names the key and both values (the trainer checks again once the
         * world is joined) */
        struct qc_config now = cfg;
        now.world_size = cfg.world_size > 0 ? cfg.world_size : launch.size;
        QC_TRY(qc_checkpoint_check_config(&saved, &now, ckpt));
    }

    /* the data: a resumed run's own unless --change-data; rank 0 checks it and the run folder
     * (the others read what they are given) */
    const bool rank0 = launch.rank == 0;
    struct qc_run_data rec = {0}, now = {0};
    const char *rec_paths[QC_CLI_STRINGS_MAX];
    enum qc_status st = QC_OK;
    if (resume) {
        st = qc_run_data_read(ckpt_run, &rec);
        if (st == QC_OK && data.n == 0 && rec.recorded) {
            for (int i = 0; i < rec.n && i < QC_CLI_STRINGS_MAX; i++)
                rec_paths[i] = rec.f[i].path;
            if (rec.n > 0 && rank0 && !cli->quiet)
                qc_log(QC_LOG_INFO, "train: resuming on the run's data (%d file%s, %s%s)", rec.n,
                       rec.n == 1 ? "" : "s", rec.f[0].path, rec.n > 1 ? " ..." : "");
        } else if (st == QC_OK && !rec.recorded && data.n == 0 && !change_data) {
            st = qc_errorf(QC_ERR_INVALID,
                           "train: %s/run.json records no data (a run of an older qctrain, or "
                           "its run.json was lost): which data to continue on is not known\n"
                           "hint: give the run's data with --data FILE..., or add --change-data "
                           "to continue on generated scenes",
                           ckpt_run);
        } else if (st == QC_OK && !rec.recorded && rank0) {
            qc_log(QC_LOG_WARN,
                   "train: %s/run.json records no data: the --data given cannot be checked "
                   "against the run's",
                   ckpt_run);
        }
    }
    /* --change-data without --data: the run's files as they are now */
    const bool use_rec = resume && data.n == 0 && rec.recorded;
    const char *const *dv = use_rec ? rec_paths : data.v;
    const int dn = use_rec ? (rec.n < QC_CLI_STRINGS_MAX ? rec.n : QC_CLI_STRINGS_MAX) : data.n;
    if (st == QC_OK && rank0)
        st = qc_run_data_describe(dv, dn, &now);
    if (st == QC_OK && rank0 && resume)
        st = qc_run_data_check(ckpt_run, &rec, &now, change_data);
    /* the validation: a resumed run's own unless given (a contradiction is refused unless
     * --change-data) */
    if (st == QC_OK && resume)
        st = qc_run_val_check(ckpt_run, &rec, eval_every == NOT_GIVEN ? -1 : eval_every,
                              val_scenes == NOT_GIVEN ? -1 : val_scenes, val.v, val.n, change_data);
    const bool val_rec = resume && rec.val_recorded;
    eval_every = eval_every != NOT_GIVEN ? eval_every : val_rec ? rec.eval_every : 0;
    val_scenes = val_scenes != NOT_GIVEN ? val_scenes : val_rec ? rec.val_scenes : 8;
    const char *rec_val[QC_CLI_STRINGS_MAX];
    const bool use_rec_val = val_rec && val.n == 0 && rec.nval > 0;
    for (int i = 0; use_rec_val && i < rec.nval && i < QC_CLI_STRINGS_MAX; i++)
        rec_val[i] = rec.val[i];
    const char *const *vv = use_rec_val ? rec_val : val.v;
    const int vn =
        use_rec_val ? (rec.nval < QC_CLI_STRINGS_MAX ? rec.nval : QC_CLI_STRINGS_MAX) : val.n;
    if (st == QC_OK && rank0)
        st = qc_run_data_set_val(&now, eval_every, val_scenes, vv, vn);
    if (st == QC_OK && cfg.keep_best > 0 && eval_every == 0)
        st = qc_errorf(QC_ERR_INVALID,
                       "train: train.keep_best = %" PRId64 " ranks checkpoints by their "
                       "validation, and this run does not validate\nhint: add --eval-every N "
                       "(a checkpoint is ranked by the validation at its step)",
                       cfg.keep_best);
    /* a new run never lands among an earlier run's files (a later --resume would pick their
     * checkpoints): its folder must be empty; --overwrite clears it */
    const bool continues_in_place = resume && (!out || same_dir(out, ckpt_run));
    if (st == QC_OK && overwrite && continues_in_place)
        st = qc_errorf(QC_ERR_INVALID,
                       "train: --overwrite would remove the run being resumed "
                       "(%s)\nhint: leave out --overwrite, or --out another "
                       "folder",
                       ckpt_run);
    if (st == QC_OK && rank0 && !continues_in_place)
        st = qc_run_dir_check_new(cfg.out_dir, overwrite);

    const struct qc_train_opts to = {
        .cfg = &cfg,
        .data = dv,
        .ndata = dn,
        .out_dir = out,
        .resume = resume,
        .init_from = init_from,
        .quiet = cli->quiet,
        .eval_every = eval_every,
        .val_data = vv,
        .nval = vn,
        .val_scenes = val_scenes,
        .skip_oversized = skip_oversized,
    };
    struct qc_trainer *t = NULL;
    if (st == QC_OK)
        st = qc_trainer_create(&to, &t);
    if (st == QC_OK && rank0) /* RUN/run.json records the data the run trains on */
        st = qc_run_data_record(qc_trainer_out_dir(t), &now);
    if (st == QC_OK)
        st = qc_trainer_run(t);
    qc_trainer_destroy(t);
    qc_run_data_free(&rec);
    qc_run_data_free(&now);
    return st;
}
