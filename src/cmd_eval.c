/*
 * cmd_eval.c — `qctrain eval --data FILE... [--weights FILE] [--batch-size N] [--dump FILE]`:
 * the validation loss and the K = 6 metrics (minADE, minFDE, MR, Brier-minFDE, minAHE, minFHE
 * over the focal agents, QCNET.md §6.2) of a model, in eval mode, batches in file order, next to a
 * constant-velocity baseline on the same agents (cv_minADE, cv_minFDE, cv_MR). --dump writes
 * the first batch's outputs (QCNet's names and shapes) as safetensors. --predictions writes every
 * focal agent's trajectories; --submission turns them into the AV2 challenge parquet by running
 * tools/av2_submission (Python with pyarrow: parquet has no C writer among our dependencies).
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qc_file.h"
#include "qc_progress.h"
#include "qc_train.h"

#define NOT_GIVEN INT64_MIN /* an option left out: the configuration's value */

/* --submission OUT: the folder OUT goes into must exist before the evaluation runs. */
static enum qc_status check_submission_path(const char *out)
{
    char dir[4096];
    qc_file_dir_of(out, dir, sizeof dir);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return qc_errorf(QC_ERR_INVALID, "eval --submission %s: the folder %s does not exist", out,
                         dir);
    if (access(dir, W_OK) != 0)
        return qc_errorf(QC_ERR_INVALID, "eval --submission %s: the folder %s is not writable", out,
                         dir);
    if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode))
        return qc_errorf(QC_ERR_INVALID, "eval --submission %s: a folder, not a file name", out);
    return QC_OK;
}

/* Runs `python3 tools/av2_submission PRED OUT` and waits for it; the tool writes OUT whole or
 * not at all (a .tmp renamed) and prints its own error. */
static enum qc_status write_submission(const char *pred, const char *out)
{
    const char *args[] = {pred, out};
    char what[4200];
    snprintf(what, sizeof what, "eval --submission %s", out);
    return qc_cli_tool_run(what, "av2_submission", args, 2);
}

static const char eval_usage[] = "--data FILE... [--weights FILE|RUN] [--batch-size N] "
                                 "[--max-batches N] [--dump FILE] [--predictions FILE] "
                                 "[--submission FILE] [--json]";
static const char eval_summary[] =
    "Evaluates QCNet: validation loss, minADE, minFDE, MR, Brier-minFDE, minAHE and minFHE at K=6 "
    "over the focal "
    "agents, next to a constant-velocity baseline on the same agents (cv_minADE, cv_minFDE, "
    "cv_MR: each agent keeps its velocity at t = 49). Batches follow the file order (no "
    "shuffling): with --batch-size N the first batch "
    "is the first N scenes, and --dump writes its outputs (loc_propose_pos, scale_propose_pos, "
    "loc_refine_pos, scale_refine_pos, pi). Without --data: the validation files of the run "
    "--weights names (its --val-data); else, unless that run trained on data files, synthetic "
    "scenes (--scenes, "
    "--synthetic-seed). Without --weights: the untrained model of the seed. Runs on the global "
    "--device: cpu, cuda, or emu (CPU ops on emulated device memory, for tests and debugging).";

enum qc_status qc_cmd_eval(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0};
    const char *weights = NULL, *dump = NULL, *attention = NULL, *predictions = NULL;
    const char *submission = NULL;
    int64_t batch_size = NOT_GIVEN, max_batches = 0, scenes = 0;
    int64_t synth_seed = NOT_GIVEN;
    bool json = false, synthetic = false;
    char d_bs[32], d_ss[32];
    snprintf(d_bs, sizeof(d_bs), "%" PRId64, cfg.batch_size);
    snprintf(d_ss, sizeof(d_ss), "%" PRId64, cfg.seed + 1);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "", "qcshard file(s) to evaluate on"},
        {"weights", QC_CLI_STRING, &weights, "",
         "model weights (QCNet state_dict safetensors) or a checkpoint / run folder (whose "
         "configuration is then used: no --preset needed)"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, "scenes per batch"},
        {"max-batches", QC_CLI_INT, &max_batches, "0", "evaluate at most N batches (0: all)"},
        {"dump", QC_CLI_STRING, &dump, "", "write the first batch's outputs to this safetensors"},
        {"predictions", QC_CLI_STRING, &predictions, "",
         "write every focal agent's K trajectories (world frame) and probabilities to this "
         "safetensors; tools/av2_submission turns it into the AV2 challenge parquet"},
        {"submission", QC_CLI_STRING, &submission, "",
         "write the AV2 motion-forecasting challenge submission (parquet: K=6 trajectories and "
         "probabilities per focal agent) to this file; runs tools/av2_submission (python3 with "
         "pyarrow)"},
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
        {"scenes", QC_CLI_INT, &scenes, "data.synthetic_scenes",
         "synthetic scenes when no --data is given"},
        {"synthetic", QC_CLI_FLAG, &synthetic, "",
         "evaluate on generated scenes although --weights is a run trained on data files"},
        {"synthetic-seed", QC_CLI_INT, &synth_seed, d_ss,
         "seed of the synthetic scenes (train.seed + 1: held out from training)"},
        {"attention", QC_CLI_STRING, &attention,
         cfg.attention == QC_ATTENTION_FUSED ? "fused" : "unfused",
         "attention implementation: fused | unfused"},
    };
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("eval", eval_usage, eval_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, pos, QC_CLI_STRINGS_MAX,
                        &npos, &help));
    if (help)
        return QC_OK;
    QC_TRY(qc_train_cli_finish("eval", pos, npos, &data, NULL, &cfg));
    /* --weights RUN (a run or checkpoint folder): the run's configuration, with the user's
     * presets and --set over it; a model.* option that contradicts it is refused */
    struct stat sb;
    if (weights && stat(weights, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char ckpt[4096], run[4096];
        struct qc_train_state rs;
        struct qc_config saved;
        QC_TRY(qc_checkpoint_resolve(weights, ckpt, sizeof(ckpt)));
        QC_TRY(qc_checkpoint_read_state(ckpt, &rs, &saved));
        QC_TRY(qc_train_cli_rebase(cli, &saved, ckpt, &cfg));
        QC_TRY(qc_train_cli_finish("eval", NULL, 0, &data, attention, &cfg));
        /* a model trained on data files is not evaluated on generated scenes unasked */
        snprintf(run, sizeof(run), "%s", ckpt);
        char *slash = strrchr(run, '/');
        if (slash && slash != run)
            *slash = '\0';
        struct qc_run_data rec = {0};
        QC_TRY(qc_run_data_read(run, &rec));
        const bool trained_on_files = rec.recorded && rec.n > 0;
        /* without --data: the run's validation files (--val-data), as it validated */
        static char val[QC_CLI_STRINGS_MAX][4096];
        if (data.n == 0 && !synthetic && rec.val_recorded && rec.nval > 0) {
            for (int i = 0; i < rec.nval && i < QC_CLI_STRINGS_MAX; i++) {
                snprintf(val[i], sizeof val[i], "%s", rec.val[i]);
                data.v[data.n++] = val[i];
            }
            qc_log(QC_LOG_INFO, "eval: the run's validation data (--val-data): %d file%s, %s%s",
                   data.n, data.n == 1 ? "" : "s", val[0], data.n > 1 ? ", ..." : "");
        }
        qc_run_data_free(&rec);
        if (trained_on_files && data.n == 0 && !synthetic)
            return qc_errorf(QC_ERR_INVALID,
                             "eval: the run of %s was trained on data files, validated on none "
                             "(no --val-data), and no --data is given: eval would use generated "
                             "scenes\nhint: give --data VAL.qcshard..., or --synthetic to "
                             "evaluate on generated scenes",
                             weights);
    } else {
        QC_TRY(qc_train_cli_finish("eval", NULL, 0, &data, attention, &cfg));
        QC_TRY(qc_config_validate(&cfg)); /* main left it to eval (--weights FILE) */
    }
    if (synthetic && data.n > 0)
        return qc_errorf(QC_ERR_INVALID, "eval: --synthetic and --data are exclusive");
    batch_size = batch_size != NOT_GIVEN ? batch_size : cfg.batch_size;
    synth_seed = synth_seed != NOT_GIVEN ? synth_seed : cfg.seed + 1;
    if (batch_size < 1 || max_batches < 0 || scenes < 0)
        return qc_errorf(QC_ERR_INVALID, "eval: --batch-size must be >= 1, --max-batches and "
                                         "--scenes >= 0");
    /* --submission without --predictions: the predictions go to a file beside it, removed after */
    char pred_tmp[4096];
    if (submission) {
        QC_TRY(check_submission_path(submission));
        if (!predictions) {
            if (snprintf(pred_tmp, sizeof pred_tmp, "%s.predictions.tmp", submission) >=
                (int)sizeof pred_tmp)
                return qc_errorf(QC_ERR_INVALID, "eval --submission: the path is too long");
            predictions = pred_tmp;
        }
    }
    const struct qc_eval_opts eo = {
        .cfg = &cfg,
        .data = data.v,
        .ndata = data.n,
        .weights = weights,
        .batch_size = batch_size,
        .max_batches = max_batches,
        .dump = dump,
        .predictions = predictions,
        .synthetic_seed = (uint64_t)synth_seed,
        .synthetic_scenes = scenes,
        .quiet = cli->quiet,
    };
    struct qc_eval_result r;
    enum qc_status st = qc_eval_run(&eo, &r);
    if (st == QC_OK && submission && r.batches == 0)
        st = qc_errorf(QC_ERR_INVALID, "eval --submission: no scene was evaluated");
    if (st == QC_OK && submission)
        st = write_submission(predictions, submission);
    if (submission && predictions == pred_tmp)
        unlink(pred_tmp);
    QC_TRY(st);
    if (json) {
        char buf[1024];
        qc_eval_format_json(&r, buf, sizeof(buf));
        printf("%s\n", buf);
        return QC_OK;
    }
    char peak[32];
    qc_format_bytes(r.peak_device_bytes, peak, sizeof(peak));
    printf("eval: %" PRId64 " scenes in %" PRId64 " batches, %" PRId64 " focal agents, %.1f s, "
           "device peak %s\n",
           r.scenes, r.batches, r.metrics.count, r.seconds, peak);
    printf("val_loss        %.6f  (reg_propose %.6f, reg_refine %.6f, cls %.6f)\n", r.loss,
           r.reg_loss_propose, r.reg_loss_refine, r.cls_loss);
    char b[11][16];
    printf("minADE (K=6)    %s\n", qc_eval_format_metric(r.metrics.min_ade, b[0], sizeof b[0]));
    printf("minFDE (K=6)    %s\n", qc_eval_format_metric(r.metrics.min_fde, b[1], sizeof b[1]));
    printf("MR (K=6)        %s\n", qc_eval_format_metric(r.metrics.miss_rate, b[2], sizeof b[2]));
    printf("Brier (K=6)     %s\n", qc_eval_format_metric(r.metrics.brier, b[3], sizeof b[3]));
    printf("brier-minFDE    %s\n",
           qc_eval_format_metric(r.metrics.brier_min_fde, b[4], sizeof b[4]));
    printf("minAHE (K=6)    %s rad  (heading error of the FDE-best mode, mean over steps)\n",
           qc_eval_format_metric(r.metrics.min_ahe, b[8], sizeof b[8]));
    printf("minFHE (K=6)    %s rad  (its heading error at the last valid step)\n",
           qc_eval_format_metric(r.metrics.min_fhe, b[9], sizeof b[9]));
    printf("cv_minADE       %s  (constant-velocity baseline, 1 mode, same focal agents)\n",
           qc_eval_format_metric(r.cv.min_ade, b[5], sizeof b[5]));
    printf("cv_minFDE       %s\n", qc_eval_format_metric(r.cv.min_fde, b[6], sizeof b[6]));
    printf("cv_MR           %s\n", qc_eval_format_metric(r.cv.miss_rate, b[7], sizeof b[7]));
    if (dump)
        printf("dump: %s (outputs of the first batch)\n", dump);
    if (predictions && predictions != pred_tmp)
        printf("predictions: %s (every focal agent; tools/av2_submission %s OUT.parquet)\n",
               predictions, predictions);
    if (submission)
        printf("submission: %s (the AV2 challenge parquet)\n", submission);
    return QC_OK;
}
