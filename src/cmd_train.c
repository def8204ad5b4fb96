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

#include "qc_train.h"

static const char train_usage[] =
    "[--data FILE...] [--steps N | --epochs N] [--save-every N] [--out DIR] "
    "[--resume DIR | --init-from FILE] [--skip-oversized]";
static const char train_summary[] =
    "Trains QCNet: on qcshard files (--data) or, without them, on synthetic scenes generated on "
    "the fly. Shows progress (loss, samples/s, device memory in use and peak), writes "
    "DIR/metrics.jsonl and checkpoints DIR/ckpt-<step>/ (QCNet state_dict keys, loadable by "
    "PyTorch). A fixed seed gives the same bits; --resume continues bit for bit. Runs on the "
    "global --device: cpu, cuda, or emu (CPU ops on emulated device memory, for tests and "
    "debugging); checkpoints are the same files whatever the device. Under mpirun -np N or srun "
    "-n N it trains on N ranks (docs/DISTRIBUTED.md).";

enum qc_status qc_cmd_train(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0}, val = {0};
    int64_t eval_every = 0, val_scenes = 8;
    bool skip_oversized = false;
    const char *out = NULL, *resume = NULL, *init_from = NULL, *attention = NULL;
    int64_t steps = cfg.steps, epochs = cfg.epochs, save_every = cfg.save_every;
    int64_t batch_size = cfg.batch_size, grad_accum = cfg.grad_accum, seed = cfg.seed;
    char d_steps[32], d_epochs[32], d_save[32], d_bs[32], d_ga[32], d_seed[32];
    snprintf(d_steps, sizeof(d_steps), "%" PRId64, steps);
    snprintf(d_epochs, sizeof(d_epochs), "%" PRId64, epochs);
    snprintf(d_save, sizeof(d_save), "%" PRId64, save_every);
    snprintf(d_bs, sizeof(d_bs), "%" PRId64, batch_size);
    snprintf(d_ga, sizeof(d_ga), "%" PRId64, grad_accum);
    snprintf(d_seed, sizeof(d_seed), "%" PRId64, seed);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "",
         "qcshard file(s) to train on; none: synthetic scenes on the fly"},
        {"steps", QC_CLI_INT, &steps, d_steps, "optimizer steps to reach (0: run --epochs)"},
        {"epochs", QC_CLI_INT, &epochs, d_epochs, "epochs, when --steps is 0"},
        {"save-every", QC_CLI_INT, &save_every, d_save,
         "steps between checkpoints (0: only at the end)"},
        {"out", QC_CLI_STRING, &out, cfg.out_dir,
         "run folder: metrics.jsonl and ckpt-<step>/ checkpoints"},
        {"resume", QC_CLI_STRING, &resume, "",
         "continue a run from a checkpoint folder (or the newest one of a run folder)"},
        {"init-from", QC_CLI_STRING, &init_from, "",
         "start from these weights (QCNet state_dict safetensors, or a checkpoint folder)"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, "scenes per group (micro-batch)"},
        {"grad-accum", QC_CLI_INT, &grad_accum, d_ga,
         "groups per optimizer step; the step's loss is the mean of the group losses"},
        {"seed", QC_CLI_INT, &seed, d_seed, "run seed: initialisation, shuffling, dropout"},
        {"eval-every", QC_CLI_INT, &eval_every, "0",
         "validate every N steps and at the end (metrics.jsonl \"eval\" lines); 0: never"},
        {"val-data", QC_CLI_STRINGS, &val, "",
         "qcshard file(s) to validate on; none: held-out synthetic scenes (seed + 1)"},
        {"val-scenes", QC_CLI_INT, &val_scenes, "8", "synthetic validation scenes"},
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
    QC_TRY(qc_train_cli_finish("train", pos, npos, &data, attention, &cfg));
    if (steps < 0 || epochs < 0 || save_every < 0 || eval_every < 0 || batch_size < 1 ||
        grad_accum < 1 || val_scenes < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "train: --steps, --epochs, --save-every and --eval-every must be >= 0, "
                         "--batch-size, --grad-accum and --val-scenes >= 1");
    if (steps == 0 && epochs == 0)
        return qc_errorf(QC_ERR_INVALID, "train: nothing to do (--steps 0 and --epochs 0)");
    cfg.steps = steps;
    cfg.epochs = epochs;
    cfg.save_every = save_every;
    cfg.batch_size = batch_size;
    cfg.grad_accum = grad_accum;
    cfg.seed = seed;
    if (out)
        snprintf(cfg.out_dir, sizeof(cfg.out_dir), "%s", out);
    QC_TRY(qc_config_validate(&cfg));

    const struct qc_train_opts to = {
        .cfg = &cfg,
        .data = data.v,
        .ndata = data.n,
        .out_dir = out,
        .resume = resume,
        .init_from = init_from,
        .quiet = cli->quiet,
        .eval_every = eval_every,
        .val_data = val.v,
        .nval = val.n,
        .val_scenes = val_scenes,
        .skip_oversized = skip_oversized,
    };
    struct qc_trainer *t = NULL;
    QC_TRY(qc_trainer_create(&to, &t));
    const enum qc_status st = qc_trainer_run(t);
    qc_trainer_destroy(t);
    return st;
}
