/*
 * cmd_plan.c — `qctrain plan [--data FILE...] [--batch-size N] [--budget SIZE] [--json]`: plans
 * one training step without training (src/plan/qc_plan.h through qc_train_planner): the stash
 * policy of every block application under the budget, the predicted peak of device bytes and
 * step time, and the largest batch of these scenes that fits, kept whole and under the planner.
 *
 * Plans for the configuration's device and hardware figures (hw.*, device.budget, dist.*): with
 * --preset rtx3090x8 (or rtx3090x1-b32) it answers, on paper, whether a batch of 4 AV2 scenes
 * fits each 24 GiB RTX 3090 and how large a batch fits one. Scenes come from the data files
 * (cycled when a batch needs more) or are generated (data.synthetic_profile). Memory is planned
 * exactly from the batch's sizes; times come from the cost model, built in or a run's
 * plan_cost.json (--cost), and the output says which.
 */
#include "qc_cli.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "qc_batch.h"
#include "qc_plan.h"
#include "qc_progress.h" /* qc_format_bytes */
#include "qc_train.h"

static const char plan_usage[] =
    "[--data FILE...] [--batch-size N] [--budget SIZE] [--max-batch N] [--cost FILE] [--json]";
static const char plan_summary[] =
    "Plans one training step without training: the stash policy of every block application "
    "(keep, offload to host or NVMe, recompute) under the device budget, the predicted peak of "
    "device bytes and step time, and the largest batch of these scenes that fits. Uses the "
    "configuration's device and hw.* figures (e.g. --preset rtx3090x8) and generated scenes "
    "when no --data is given.";

static const char *device_name(int64_t kind)
{
    return qc_train_device_str(kind);
}

/* "N scenes of these fit" / ">= N scenes fit (searched up to M)". */
static void print_largest(FILE *out, const char *what, int64_t largest, int64_t max_b)
{
    if (largest >= max_b)
        fprintf(out, "%s>= %" PRId64 " scenes fit (searched up to %" PRId64 ")\n", what, largest,
                max_b);
    else
        fprintf(out, "%s%" PRId64 " scene%s of these fit%s\n", what, largest,
                largest == 1 ? "" : "s", largest == 0 ? " (not one)" : "");
}

static void print_text(FILE *out, const struct qc_config *cfg, const struct qc_plan_program *prog,
                       const struct qc_plan_result *r, const struct qc_batch *b, int64_t B,
                       const int64_t largest[2], int64_t max_b, const char *cost, const char *data)
{
    char s1[32], s2[32], s3[32], s4[32];
    fprintf(out,
            "plan: %" PRId64 " scenes (%s): %" PRId64 " agents, %" PRId64 " polygons; device %s, "
            "%d block applications\n",
            B, data, b->num_agents, b->num_polygons, device_name(cfg->device_kind), prog->nblocks);
    struct qc_plan_hw hw;
    qc_train_plan_hw(cfg, &hw);
    qc_format_bytes(hw.host_capacity, s1, sizeof s1);
    if (hw.nvme_capacity)
        qc_format_bytes(hw.nvme_capacity, s2, sizeof s2);
    else
        snprintf(s2, sizeof s2, "none");
    fprintf(out, "hardware: copies %.3g GB/s, NVMe %.3g GB/s, host tier %s, NVMe tier %s\n",
            cfg->hw_pcie_gbps, cfg->hw_nvme_gbps, s1, s2);
    fprintf(out, "times from the cost model: %s\n\n", cost);
    qc_plan_print(out, prog, r);
    qc_format_bytes(r->peak, s1, sizeof s1);
    qc_format_bytes(r->keep_peak, s2, sizeof s2);
    qc_format_bytes(prog->fixed_bytes, s4, sizeof s4);
    fprintf(out,
            "\npredicted peak   %s (everything kept: %s; parameters, gradients, optimizer "
            "and batch: %s)\n",
            s1, s2, s4);
    if (r->peak_block >= 0)
        fprintf(out, "peak during      %s's %s\n", prog->blocks[r->peak_block].name,
                r->peak_phase ? "backward" : "forward");
    if (r->window < cfg->offload_prefetch_window) {
        qc_format_bytes(r->window, s2, sizeof s2);
        qc_format_bytes(cfg->offload_prefetch_window, s3, sizeof s3);
        fprintf(out, "prefetch window  %s (offload.prefetch_window %s: a smaller one fits)\n", s2,
                s3);
    }
    if (cfg->device_budget) {
        qc_format_bytes(cfg->device_budget, s3, sizeof s3);
        qc_format_bytes(r->target, s4, sizeof s4);
        fprintf(out, "budget           %s (planned to %s, a %.0f %% margin): %s\n", s3, s4,
                100.0 * (1.0 - (double)r->target / (double)cfg->device_budget),
                r->fits ? "fits" : "DOES NOT FIT (the trainer splits such a batch)");
    } else {
        fprintf(out, "budget           none (device.budget 0)\n");
    }
    qc_format_bytes(r->host_bytes, s1, sizeof s1);
    qc_format_bytes(r->nvme_bytes, s2, sizeof s2);
    qc_format_bytes(r->recompute_bytes, s3, sizeof s3);
    fprintf(out, "stash moved      %s to host, %s to NVMe, %s recomputed\n", s1, s2, s3);
    fprintf(out,
            "predicted step   %.3f s (everything kept: %.3f s; prefetch stall %.3f s); planned "
            "in %.3f ms\n",
            r->step_s, r->keep_step_s, r->stall_s, 1e3 * r->plan_s);
    print_largest(out, "largest batch    ", largest[0], max_b);
    print_largest(out, "  kept whole     ", largest[1], max_b);
}

static enum qc_status print_json(FILE *out, const struct qc_config *cfg,
                                 const struct qc_plan_program *prog, const struct qc_plan_result *r,
                                 int64_t B, const int64_t largest[2], int64_t max_b,
                                 const char *cost)
{
    cJSON *o = cJSON_CreateObject(), *blocks = cJSON_CreateArray();
    if (!o || !blocks) {
        cJSON_Delete(o);
        cJSON_Delete(blocks);
        return qc_errorf(QC_ERR_NOMEM, "plan: out of memory");
    }
    cJSON_AddStringToObject(o, "device", device_name(cfg->device_kind));
    cJSON_AddNumberToObject(o, "batch_size", (double)B);
    cJSON_AddNumberToObject(o, "budget_bytes", (double)cfg->device_budget);
    cJSON_AddNumberToObject(o, "target_bytes", (double)r->target);
    cJSON_AddNumberToObject(o, "predicted_peak_bytes", (double)r->peak);
    cJSON_AddNumberToObject(o, "keep_peak_bytes", (double)r->keep_peak);
    cJSON_AddNumberToObject(o, "fixed_bytes", (double)prog->fixed_bytes);
    cJSON_AddNumberToObject(o, "prefetch_window_bytes", (double)r->window);
    if (r->peak_block >= 0) {
        cJSON_AddStringToObject(o, "peak_block", prog->blocks[r->peak_block].name);
        cJSON_AddStringToObject(o, "peak_phase", r->peak_phase ? "backward" : "forward");
    }
    cJSON_AddBoolToObject(o, "fits", r->fits);
    cJSON_AddNumberToObject(o, "predicted_step_s", r->step_s);
    cJSON_AddNumberToObject(o, "keep_step_s", r->keep_step_s);
    cJSON_AddNumberToObject(o, "prefetch_stall_s", r->stall_s);
    cJSON_AddNumberToObject(o, "host_bytes", (double)r->host_bytes);
    cJSON_AddNumberToObject(o, "nvme_bytes", (double)r->nvme_bytes);
    cJSON_AddNumberToObject(o, "recompute_bytes", (double)r->recompute_bytes);
    cJSON_AddNumberToObject(o, "largest_batch", (double)largest[0]);
    cJSON_AddNumberToObject(o, "largest_batch_kept", (double)largest[1]);
    cJSON_AddNumberToObject(o, "largest_batch_searched_to", (double)max_b);
    cJSON_AddNumberToObject(o, "plan_ms", 1e3 * r->plan_s);
    cJSON_AddStringToObject(o, "cost_model", cost);
    for (int32_t b = 0; b < prog->nblocks; b++) {
        cJSON *k = cJSON_CreateObject();
        cJSON_AddStringToObject(k, "name", prog->blocks[b].name);
        cJSON_AddStringToObject(k, "kind", qc_plan_kind_str(prog->blocks[b].kind));
        cJSON_AddNumberToObject(k, "bytes", (double)prog->blocks[b].stash_bytes);
        cJSON_AddStringToObject(k, "policy",
                                qc_plan_policy_str((enum qc_stash_policy)r->policy[b]));
        cJSON_AddNumberToObject(k, "predicted_time_s", r->block_s[b]);
        cJSON_AddNumberToObject(k, "added_s", r->added_s[b]);
        cJSON_AddItemToArray(blocks, k);
    }
    cJSON_AddItemToObject(o, "blocks", blocks);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return qc_errorf(QC_ERR_NOMEM, "plan: out of memory");
    fprintf(out, "%s\n", text);
    cJSON_free(text);
    return QC_OK;
}

enum qc_status qc_cmd_plan(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0};
    bool json = false;
    int64_t batch_size = cfg.batch_size, max_b = 256;
    uint64_t budget = cfg.device_budget;
    const char *cost_path = NULL;
    char d_bs[32], d_budget[32];
    snprintf(d_bs, sizeof d_bs, "%" PRId64, batch_size);
    snprintf(d_budget, sizeof d_budget, "%" PRIu64, budget);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "",
         "qcshard file(s) whose scenes are planned; none: "
         "generated scenes (data.synthetic_profile)"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, "scenes in the planned batch"},
        {"budget", QC_CLI_SIZE, &budget, d_budget,
         "device bytes the step must fit (device.budget; 0: none)"},
        {"max-batch", QC_CLI_INT, &max_b, "256", "largest batch size the search tries"},
        {"cost", QC_CLI_STRING, &cost_path, "",
         "a run's plan_cost.json (calibrated times); default: built-in coefficients"},
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
    };
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("plan", plan_usage, plan_summary, opts, (int)(sizeof opts / sizeof opts[0]),
                        argc, argv, pos, QC_CLI_STRINGS_MAX, &npos, &help));
    if (help)
        return QC_OK;
    QC_TRY(qc_train_cli_finish("plan", pos, npos, &data, NULL, &cfg));
    if (batch_size < 1 || max_b < 1)
        return qc_errorf(QC_ERR_INVALID, "plan: --batch-size and --max-batch must be >= 1");
    cfg.batch_size = batch_size;
    cfg.device_budget = budget;
    QC_TRY(qc_config_validate(&cfg));

    struct qc_train_planner *pl = NULL;
    QC_TRY(qc_train_planner_create(&cfg, data.v, data.n,
                                   cost_path && cost_path[0] ? cost_path : NULL, &pl));
    /* the largest batch under the planner, and kept whole (nothing offloaded or recomputed) */
    int64_t largest[2] = {0, 0};
    enum qc_status st = qc_train_planner_largest(pl, max_b, &largest[0]);
    struct qc_plan_params keep;
    qc_train_plan_params(&cfg, &keep);
    keep.mode = QC_PLAN_MODE_KEEP;
    if (st == QC_OK)
        st = qc_train_planner_largest_with(pl, max_b, NULL, &keep, &largest[1]);
    struct qc_plan_result r = {0};
    const struct qc_plan_program *prog = NULL;
    if (st == QC_OK)
        st = qc_train_planner_plan(pl, batch_size, &r, &prog);
    char cost[128], src[256];
    qc_plan_cost_source(qc_train_planner_cost(pl), cost, sizeof cost);
    if (data.n > 0)
        snprintf(src, sizeof src, "%s%s, %" PRId64 " scenes in the files", data.v[0],
                 data.n > 1 ? " and more" : "", qc_train_planner_scenes(pl));
    else
        snprintf(src, sizeof src, "generated, %s",
                 cfg.synthetic_profile == QC_SCENE_DENSE   ? "dense"
                 : cfg.synthetic_profile == QC_SCENE_MIXED ? "mixed"
                                                           : "typical");
    if (st == QC_OK) {
        if (json)
            st = print_json(stdout, &cfg, prog, &r, batch_size, largest, max_b, cost);
        else
            print_text(stdout, &cfg, prog, &r, qc_train_planner_batch(pl), batch_size, largest,
                       max_b, cost, src);
    }
    qc_plan_result_free(&r);
    qc_train_planner_destroy(pl);
    return st;
}
