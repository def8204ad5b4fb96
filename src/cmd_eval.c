/*
 * cmd_eval.c — `qctrain eval --data FILE... [--weights FILE] [--batch-size N] [--dump FILE]`:
 * the validation loss and the K = 6 metrics (minADE, minFDE, MR, Brier-minFDE, minAHE, minFHE
 * over the focal agents, QCNET.md §6.2) of a model, in eval mode, batches in file order, next to a
 * constant-velocity baseline on the same agents (cv_minADE, cv_minFDE, cv_MR). --dump writes
 * the first batch's outputs (QCNet's names and shapes) as safetensors.
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>

#include "qc_progress.h"
#include "qc_train.h"

static const char eval_usage[] =
    "--data FILE... [--weights FILE] [--batch-size N] [--max-batches N] [--dump FILE] [--json]";
static const char eval_summary[] =
    "Evaluates QCNet: validation loss, minADE, minFDE, MR, Brier-minFDE, minAHE and minFHE at K=6 "
    "over the focal "
    "agents, next to a constant-velocity baseline on the same agents (cv_minADE, cv_minFDE, "
    "cv_MR: each agent keeps its velocity at t = 49). Batches follow the file order (no "
    "shuffling): with --batch-size N the first batch "
    "is the first N scenes, and --dump writes its outputs (loc_propose_pos, scale_propose_pos, "
    "loc_refine_pos, scale_refine_pos, pi). Without --data: synthetic scenes (--scenes, "
    "--synthetic-seed). Without --weights: the untrained model of the seed. Runs on the global "
    "--device: cpu, cuda, or emu (CPU ops on emulated device memory, for tests and debugging).";

enum qc_status qc_cmd_eval(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0};
    const char *weights = NULL, *dump = NULL, *attention = NULL;
    int64_t batch_size = cfg.batch_size, max_batches = 0, scenes = 0;
    int64_t synth_seed = cfg.seed + 1;
    bool json = false;
    char d_bs[32], d_ss[32];
    snprintf(d_bs, sizeof(d_bs), "%" PRId64, batch_size);
    snprintf(d_ss, sizeof(d_ss), "%" PRId64, synth_seed);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "", "qcshard file(s) to evaluate on"},
        {"weights", QC_CLI_STRING, &weights, "",
         "model weights (QCNet state_dict safetensors) or a checkpoint / run folder"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, "scenes per batch"},
        {"max-batches", QC_CLI_INT, &max_batches, "0", "evaluate at most N batches (0: all)"},
        {"dump", QC_CLI_STRING, &dump, "", "write the first batch's outputs to this safetensors"},
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
        {"scenes", QC_CLI_INT, &scenes, "data.synthetic_scenes",
         "synthetic scenes when no --data is given"},
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
    QC_TRY(qc_train_cli_finish("eval", pos, npos, &data, attention, &cfg));
    if (batch_size < 1 || max_batches < 0 || scenes < 0)
        return qc_errorf(QC_ERR_INVALID, "eval: --batch-size must be >= 1, --max-batches and "
                                         "--scenes >= 0");
    const struct qc_eval_opts eo = {
        .cfg = &cfg,
        .data = data.v,
        .ndata = data.n,
        .weights = weights,
        .batch_size = batch_size,
        .max_batches = max_batches,
        .dump = dump,
        .synthetic_seed = (uint64_t)synth_seed,
        .synthetic_scenes = scenes,
        .quiet = cli->quiet,
    };
    struct qc_eval_result r;
    QC_TRY(qc_eval_run(&eo, &r));
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
    return QC_OK;
}
