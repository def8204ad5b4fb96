/*
 * metric_keys.c — the numbers of metrics.jsonl that the report's curves and TensorBoard show,
 * with their TensorBoard tags (qc_report.h). Step-line keys are written by src/train/metrics.c;
 * the memory fields (predicted_peak_bytes ... plan_ms) by the memory system (stepmem.c)
 * (absent keys mean "not recorded", and nothing is drawn or written for them); eval-line keys
 * by src/train/eval.c (qc_eval_format_json).
 */
#include "qc_report.h"

static const struct qc_report_metric metrics[] = {
    /* step lines */
    {"loss", false, "train/loss", "loss", ""},
    {"reg_loss_propose", false, "train/reg_loss_propose", "loss", ""},
    {"reg_loss_refine", false, "train/reg_loss_refine", "loss", ""},
    {"cls_loss", false, "train/cls_loss", "loss", ""},
    {"lr", false, "train/lr", "lr", ""},
    {"samples_per_s", false, "train/samples_per_s", "speed", "1/s"},
    {"peak_device_bytes", false, "memory/peak_device_bytes", "memory", "bytes"},
    {"reserved_bytes", false, "memory/reserved_bytes", "memory", "bytes"},
    {"peak_reserved_live_bytes", false, "memory/peak_reserved_live_bytes", "memory", "bytes"},
    {"predicted_peak_bytes", false, "memory/predicted_peak_bytes", "memory", "bytes"},
    {"peak_active_bytes", false, "memory/peak_active_bytes", "memory", "bytes"},
    {"offload_host_bytes", false, "memory/offload_host_bytes", "offload", "bytes"},
    {"offload_nvme_bytes", false, "memory/offload_nvme_bytes", "offload", "bytes"},
    {"recompute_bytes", false, "memory/recompute_bytes", "offload", "bytes"},
    {"prefetch_stall_s", false, "memory/prefetch_stall_s", "stall", "s"},
    {"replans", false, "memory/replans", "plan", ""},
    {"splits", false, "memory/splits", "plan", ""},
    {"skipped_scenes", false, "memory/skipped_scenes", "plan", ""},
    {"plan_ms", false, "memory/plan_ms", "plan_time", "ms"},
    {"plan_ahead_ms", false, "memory/plan_ahead_ms", "plan_time", "ms"},
    /* eval lines ({"step": S, "eval": {...}}) */
    {"loss", true, "eval/loss", "eval_loss", ""},
    {"reg_loss_propose", true, "eval/reg_loss_propose", "eval_loss", ""},
    {"reg_loss_refine", true, "eval/reg_loss_refine", "eval_loss", ""},
    {"cls_loss", true, "eval/cls_loss", "eval_loss", ""},
    {"minADE", true, "eval/minADE", "eval_dist", "m"},
    {"minFDE", true, "eval/minFDE", "eval_dist", "m"},
    {"brier_minFDE", true, "eval/brier_minFDE", "eval_dist", "m"},
    {"cv_minADE", true, "eval/cv_minADE", "eval_dist", "m"},
    {"cv_minFDE", true, "eval/cv_minFDE", "eval_dist", "m"},
    {"MR", true, "eval/MR", "eval_rate", ""},
    {"Brier", true, "eval/Brier", "eval_rate", ""},
    {"cv_MR", true, "eval/cv_MR", "eval_rate", ""},
    {"minAHE", true, "eval/minAHE", "eval_heading", "rad"},
    {"minFHE", true, "eval/minFHE", "eval_heading", "rad"},
};

const struct qc_report_metric *qc_report_metrics(int *n)
{
    *n = (int)(sizeof metrics / sizeof metrics[0]);
    return metrics;
}
