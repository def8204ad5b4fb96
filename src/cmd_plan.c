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
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_batch.h"
#include "qc_config.h"
#include "qc_plan.h"
#include "qc_plan_owners.h"
#include "qc_progress.h" /* qc_format_bytes */
#include "qc_train.h"
#include "qc_train_calib.h"

#include <time.h>

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

/* The figures of a run of W ranks (qc_train_fixed_parts per rank; the gradients' reduction and
 * the parameters' gather per step, over hw.pcie_gbps). */
struct rank_figures {
    int64_t world, zero;
    uint64_t sent; /* bytes a rank sends per optimizer step */
    double comm_s; /* their time at hw.pcie_gbps, not overlapped with compute */
    uint64_t recv; /* host receive buffers of the MPI backend: (W - 1) x dist.bucket_bytes */
};

static void rank_figures(const struct qc_config *cfg, const struct qc_train_fixed *f,
                         struct rank_figures *out)
{
    memset(out, 0, sizeof *out);
    out->world = qc_train_plan_world(cfg);
    out->zero = cfg->zero_stage;
    if (out->world < 2)
        return;
    const double W = (double)out->world, G = (double)f->params, part = (W - 1.0) / W;
    double sent = cfg->zero_stage >= 2 ? part * G : 2.0 * part * G; /* reduce / all-reduce */
    if (cfg->zero_stage >= 1)
        sent += part * G; /* the updated shards' all-gather */
    out->sent = (uint64_t)sent;
    out->comm_s = sent / (cfg->hw_pcie_gbps * 1e9);
    out->recv = (uint64_t)(out->world - 1) * cfg->bucket_bytes;
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

/* What the text and JSON outputs show. */
struct plan_view {
    const struct qc_config *cfg;
    const struct qc_plan_program *prog;
    const struct qc_plan_result *r;
    const struct qc_batch *b;
    int64_t B, max_b, largest[2];
    const char *cost, *data;
    bool times;                       /* the times are for the device (not the CPU's for a GPU) */
    const struct qc_plan_explain *ex; /* the smallest plan's peak, or NULL */
    uint64_t floor_peak;              /* that plan's peak */
    struct qc_train_fixed fixed;
    struct rank_figures rk;
    uint64_t need_one; /* the budget one scene needs (no scene fits), else 0 */
    /* the calibration the times come from: "builtin", "probe", "run", "file", "roofline" */
    const char *calib_source;
    const struct qc_plan_calib *cal; /* probe / run: its record, else NULL */
    const char *calib_text;          /* one line (qc_plan_calib_describe, or why not) */
    const char *calib_cache;         /* probe / run: the cache file, else NULL */
};

/* The edge set of edge context b ("edges.<set>": its name after the dot). */
static const char *edge_set_of(const struct qc_plan_block *b)
{
    const char *dot = strchr(b->name, '.');
    return dot ? dot + 1 : b->name;
}

/* One line: the mode of every edge set that has r to place (qc_plan_edge_mode). */
static void print_edge_modes(FILE *out, const struct plan_view *v)
{
    const struct qc_plan_program *prog = v->prog;
    int n = 0;
    for (int32_t b = 0; b < prog->nblocks; b++) {
        const struct qc_plan_block *k = &prog->blocks[b];
        if (k->kind != QC_PLAN_EDGES || k->edge_mode == QC_PLAN_EDGE_NONE)
            continue;
        fprintf(out, "%s%s %s", n++ ? ", " : "edge modes       ", edge_set_of(k),
                qc_plan_edge_mode_str((enum qc_plan_edge_mode)k->edge_mode));
    }
    if (n)
        fprintf(out, " (model.edge_mode=%s%s)\n",
                v->cfg->edge_mode == QC_EDGE_MODE_TILED          ? "tiled"
                : v->cfg->edge_mode == QC_EDGE_MODE_MATERIALISED ? "materialised"
                                                                 : "auto",
                qc_train_edge_choose(v->cfg) ? ": tiled where the materialised plan does not fit"
                                             : "");
}

static void print_text(FILE *out, const struct plan_view *v)
{
    const struct qc_config *cfg = v->cfg;
    const struct qc_plan_result *r = v->r;
    const struct qc_plan_program *prog = v->prog;
    char s1[32], s2[32], s3[32], s4[32];
    fprintf(out,
            "plan: %" PRId64 " scenes (%s): %" PRId64 " agents, %" PRId64 " polygons; device %s, "
            "%d block applications\n",
            v->B, v->data, v->b->num_agents, v->b->num_polygons, device_name(cfg->device_kind),
            prog->nblocks);
    struct qc_plan_hw hw;
    qc_train_plan_hw(cfg, &hw);
    qc_format_bytes(hw.host_capacity, s1, sizeof s1);
    if (hw.nvme_capacity)
        qc_format_bytes(hw.nvme_capacity, s2, sizeof s2);
    else
        snprintf(s2, sizeof s2, "none");
    fprintf(out, "hardware: copies %.3g GB/s, NVMe %.3g GB/s, host tier %s, NVMe tier %s\n",
            cfg->hw_pcie_gbps, cfg->hw_nvme_gbps, s1, s2);
    if (cfg->hw_device_memory) {
        qc_format_bytes(cfg->hw_device_memory, s1, sizeof s1);
        qc_format_bytes(cfg->hw_device_reserve, s2, sizeof s2);
        fprintf(out, "device memory: %s, of which %s reserved (CUDA context, workspaces)\n", s1,
                s2);
    }
    if (v->times)
        fprintf(out, "times from the cost model: %s\ncalibration: %s%s%s\n\n", v->cost,
                v->calib_text, v->calib_cache ? "; cache " : "",
                v->calib_cache ? v->calib_cache : "");
    else
        fprintf(out, "times: unknown for a GPU without a calibration (plan --cost RUN/"
                     "plan_cost.json) or its roofline figures (hw.tflops, hw.mem_gbps)\n\n");
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
    if (r->prefetch_none) {
        qc_format_bytes(cfg->offload_prefetch_window, s3, sizeof s3);
        fprintf(out,
                "prefetch window  none: each offloaded stash comes back at its own backward "
                "(offload.prefetch_window %s: only this fits)\n",
                s3);
    } else if (r->window < cfg->offload_prefetch_window) {
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
    print_edge_modes(out, v);
    if (v->times)
        fprintf(out,
                "predicted step   %.3f s (everything kept: %.3f s; prefetch stall %.3f s); "
                "planned in %.3f ms\n",
                r->step_s, r->keep_step_s, r->stall_s, 1e3 * r->plan_s);
    else
        fprintf(out, "predicted step   unknown (no time for this GPU); planned in %.3f ms\n",
                1e3 * r->plan_s);
    if (v->rk.world > 1) {
        qc_format_bytes(v->fixed.params, s1, sizeof s1);
        qc_format_bytes(v->fixed.moments, s2, sizeof s2);
        qc_format_bytes(v->rk.sent, s3, sizeof s3);
        qc_format_bytes(v->rk.recv, s4, sizeof s4);
        fprintf(out,
                "per rank         %" PRId64 " ranks, ZeRO %" PRId64
                ": every figure above is one rank's; parameters %s and gradients %s whole, "
                "AdamW moments %s (%s)\n",
                v->rk.world, v->rk.zero, s1, s1, s2,
                v->rk.zero >= 1 ? "its shard" : "whole: dist.zero_stage 1 shards them");
        fprintf(out,
                "communication    %s sent per step by each rank (%s), %s host receive buffers "
                "(buckets in flight: (world - 1) x dist.bucket_bytes)",
                s3,
                v->rk.zero >= 2   ? "gradients reduced to their shard's owner, shards gathered"
                : v->rk.zero == 1 ? "gradients all-reduced, shards gathered"
                                  : "gradients all-reduced",
                s4);
        if (v->times)
            fprintf(out,
                    "; %.3f s at hw.pcie_gbps %.3g GB/s (not overlapped: at most %.3f s per "
                    "step with the compute)",
                    v->rk.comm_s, cfg->hw_pcie_gbps, r->step_s + v->rk.comm_s);
        fprintf(out, "\n");
    }
    print_largest(out, "largest batch    ", v->largest[0], v->max_b);
    print_largest(out, "  kept whole     ", v->largest[1], v->max_b);
    if (v->need_one) {
        qc_format_bytes(v->need_one, s1, sizeof s1);
        fprintf(out, "needed           a budget of about %s (%" PRIu64 " bytes) fits one scene\n",
                s1, v->need_one);
    }
    if (v->ex) {
        qc_format_bytes(v->floor_peak, s1, sizeof s1);
        fprintf(out, "\nfloor: the smallest plan of these %" PRId64 " scenes peaks at %s; ", v->B,
                s1);
        qc_plan_explain_print(out, prog, v->ex, 12);
        qc_format_bytes(v->fixed.params, s1, sizeof s1);
        qc_format_bytes(v->fixed.moments, s2, sizeof s2);
        qc_format_bytes(v->fixed.batch, s3, sizeof s3);
        qc_format_bytes(v->fixed.other, s4, sizeof s4);
        fprintf(out,
                "  fixed: parameters %s, gradients %s, AdamW moments %s, batch %s, other %s "
                "(optimizer segments, workspace)\n",
                s1, s1, s2, s3, s4);
        fprintf(out, "what moves it:\n");
        for (int k = 0; k < QC_PLAN_HOLD_COUNT; k++)
            if (v->ex->by_kind[k])
                fprintf(out, "  %-12s %s\n", qc_plan_hold_str((enum qc_plan_hold)k),
                        qc_plan_hold_knob((enum qc_plan_hold)k));
    }
}

static cJSON *explain_json(const struct plan_view *v)
{
    const struct qc_plan_explain *e = v->ex;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "what", "the smallest plan of this batch");
    cJSON_AddNumberToObject(o, "peak_bytes", (double)e->peak);
    if (e->block >= 0)
        cJSON_AddStringToObject(o, "block", v->prog->blocks[e->block].name);
    else
        cJSON_AddNullToObject(o, "block");
    cJSON_AddStringToObject(o, "phase", e->phase ? "backward" : "forward");
    cJSON_AddBoolToObject(o, "recompute", e->recompute);
    cJSON_AddBoolToObject(o, "fetch", e->fetch);
    cJSON *kinds = cJSON_AddObjectToObject(o, "by_kind");
    cJSON *knobs = cJSON_AddObjectToObject(o, "knobs");
    for (int k = 0; k < QC_PLAN_HOLD_COUNT; k++) {
        const enum qc_plan_hold kind = (enum qc_plan_hold)k;
        cJSON_AddNumberToObject(kinds, qc_plan_hold_key(kind), (double)e->by_kind[k]);
        cJSON_AddStringToObject(knobs, qc_plan_hold_key(kind), qc_plan_hold_knob(kind));
    }
    cJSON *f = cJSON_AddObjectToObject(o, "fixed");
    cJSON_AddNumberToObject(f, "parameters", (double)v->fixed.params);
    cJSON_AddNumberToObject(f, "gradients", (double)v->fixed.grads);
    cJSON_AddNumberToObject(f, "moments", (double)v->fixed.moments);
    cJSON_AddNumberToObject(f, "batch", (double)v->fixed.batch);
    cJSON_AddNumberToObject(f, "other", (double)v->fixed.other);
    cJSON *hs = cJSON_AddArrayToObject(o, "holders");
    for (int32_t i = 0; hs && i < e->n; i++) {
        cJSON *h = cJSON_CreateObject();
        cJSON_AddStringToObject(h, "name", e->h[i].name);
        cJSON_AddStringToObject(h, "kind", qc_plan_hold_key(e->h[i].kind));
        cJSON_AddNumberToObject(h, "bytes", (double)e->h[i].bytes);
        cJSON_AddNumberToObject(h, "count", e->h[i].count);
        cJSON_AddItemToArray(hs, h);
    }
    return o;
}

static enum qc_status print_json(FILE *out, const struct plan_view *v)
{
    const struct qc_config *cfg = v->cfg;
    const struct qc_plan_result *r = v->r;
    const struct qc_plan_program *prog = v->prog;
    cJSON *o = cJSON_CreateObject(), *blocks = cJSON_CreateArray();
    if (!o || !blocks) {
        cJSON_Delete(o);
        cJSON_Delete(blocks);
        return qc_errorf(QC_ERR_NOMEM, "plan: out of memory");
    }
    cJSON_AddStringToObject(o, "device", device_name(cfg->device_kind));
    cJSON_AddNumberToObject(o, "batch_size", (double)v->B);
    cJSON_AddNumberToObject(o, "budget_bytes", (double)cfg->device_budget);
    cJSON_AddNumberToObject(o, "device_memory_bytes", (double)cfg->hw_device_memory);
    cJSON_AddNumberToObject(o, "device_reserve_bytes", (double)cfg->hw_device_reserve);
    cJSON_AddNumberToObject(o, "target_bytes", (double)r->target);
    cJSON_AddNumberToObject(o, "predicted_peak_bytes", (double)r->peak);
    cJSON_AddNumberToObject(o, "keep_peak_bytes", (double)r->keep_peak);
    cJSON_AddNumberToObject(o, "fixed_bytes", (double)prog->fixed_bytes);
    cJSON_AddNumberToObject(o, "prefetch_window_bytes", (double)r->window);
    cJSON_AddBoolToObject(o, "prefetch_none", r->prefetch_none);
    if (r->peak_block >= 0) {
        cJSON_AddStringToObject(o, "peak_block", prog->blocks[r->peak_block].name);
        cJSON_AddStringToObject(o, "peak_phase", r->peak_phase ? "backward" : "forward");
    }
    cJSON_AddBoolToObject(o, "fits", r->fits);
    if (v->times) {
        cJSON_AddNumberToObject(o, "predicted_step_s", r->step_s);
        cJSON_AddNumberToObject(o, "keep_step_s", r->keep_step_s);
        cJSON_AddNumberToObject(o, "prefetch_stall_s", r->stall_s);
    } else { /* no time for this GPU */
        cJSON_AddNullToObject(o, "predicted_step_s");
        cJSON_AddNullToObject(o, "keep_step_s");
        cJSON_AddNullToObject(o, "prefetch_stall_s");
    }
    cJSON_AddNumberToObject(o, "host_bytes", (double)r->host_bytes);
    cJSON_AddNumberToObject(o, "nvme_bytes", (double)r->nvme_bytes);
    cJSON_AddNumberToObject(o, "recompute_bytes", (double)r->recompute_bytes);
    cJSON_AddNumberToObject(o, "largest_batch", (double)v->largest[0]);
    cJSON_AddNumberToObject(o, "largest_batch_kept", (double)v->largest[1]);
    cJSON_AddNumberToObject(o, "largest_batch_searched_to", (double)v->max_b);
    if (v->need_one)
        cJSON_AddNumberToObject(o, "budget_needed_bytes", (double)v->need_one);
    cJSON_AddNumberToObject(o, "plan_ms", 1e3 * r->plan_s);
    cJSON_AddStringToObject(o, "cost_model", v->times ? v->cost : "none for this GPU");
    /* where the times' coefficients come from and how old they are */
    cJSON *cal = cJSON_AddObjectToObject(o, "calibration");
    cJSON_AddStringToObject(cal, "source", v->calib_source);
    cJSON_AddStringToObject(cal, "text", v->calib_text);
    if (v->cal) {
        char date[40] = "?";
        const time_t t = (time_t)v->cal->date;
        struct tm tm;
        if (gmtime_r(&t, &tm))
            strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
        cJSON_AddStringToObject(cal, "date", date);
        cJSON_AddNumberToObject(cal, "age_s", (double)((int64_t)time(NULL) - v->cal->date));
        cJSON_AddStringToObject(cal, "cache", v->calib_cache);
    } else {
        cJSON_AddNullToObject(cal, "date");
        cJSON_AddNullToObject(cal, "age_s");
        cJSON_AddNullToObject(cal, "cache");
    }
    cJSON *rk = cJSON_AddObjectToObject(o, "ranks");
    cJSON_AddNumberToObject(rk, "world_size", (double)v->rk.world);
    cJSON_AddNumberToObject(rk, "zero_stage", (double)cfg->zero_stage);
    cJSON_AddNumberToObject(rk, "parameters_bytes", (double)v->fixed.params);
    cJSON_AddNumberToObject(rk, "gradients_bytes", (double)v->fixed.grads);
    cJSON_AddNumberToObject(rk, "moments_bytes", (double)v->fixed.moments);
    cJSON_AddNumberToObject(rk, "comm_bytes_per_step", (double)v->rk.sent);
    cJSON_AddNumberToObject(rk, "host_recv_bytes", (double)v->rk.recv);
    if (v->times)
        cJSON_AddNumberToObject(rk, "comm_s", v->rk.comm_s);
    else
        cJSON_AddNullToObject(rk, "comm_s");
    /* the mode of every edge set with r to place; who chose it */
    cJSON *em = cJSON_AddObjectToObject(o, "edge_modes");
    for (int32_t b = 0; em && b < prog->nblocks; b++)
        if (prog->blocks[b].kind == QC_PLAN_EDGES && prog->blocks[b].edge_mode != QC_PLAN_EDGE_NONE)
            cJSON_AddStringToObject(
                em, edge_set_of(&prog->blocks[b]),
                qc_plan_edge_mode_str((enum qc_plan_edge_mode)prog->blocks[b].edge_mode));
    cJSON_AddStringToObject(o, "edge_mode_choice",
                            qc_train_edge_choose(cfg) ? "planner" : "configured");
    for (int32_t b = 0; b < prog->nblocks; b++) {
        cJSON *k = cJSON_CreateObject();
        cJSON_AddStringToObject(k, "name", prog->blocks[b].name);
        cJSON_AddStringToObject(k, "kind", qc_plan_kind_str(prog->blocks[b].kind));
        cJSON_AddNumberToObject(k, "bytes", (double)prog->blocks[b].stash_bytes);
        cJSON_AddStringToObject(k, "policy",
                                qc_plan_policy_str((enum qc_stash_policy)r->policy[b]));
        if (v->times) {
            cJSON_AddNumberToObject(k, "predicted_time_s", r->block_s[b]);
            cJSON_AddNumberToObject(k, "added_s", r->added_s[b]);
        }
        cJSON_AddItemToArray(blocks, k);
    }
    cJSON_AddItemToObject(o, "blocks", blocks);
    if (v->ex) {
        cJSON *e = explain_json(v);
        if (e)
            cJSON_AddItemToObject(o, "explain", e);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return qc_errorf(QC_ERR_NOMEM, "plan: out of memory");
    fprintf(out, "%s\n", text);
    cJSON_free(text);
    return QC_OK;
}

/* A file the command reads: refused as bad input (exit 2) when it cannot be opened. */
static enum qc_status check_input(const char *what, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return qc_errorf(QC_ERR_INVALID, "plan: %s %s: cannot open: %s", what, path,
                         strerror(errno));
    fclose(f);
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
    char d_bs[32], d_budget[32], h_bs[160], h_max[160];
    snprintf(d_bs, sizeof d_bs, "%" PRId64, batch_size);
    snprintf(d_budget, sizeof d_budget, "%" PRIu64, budget);
    /* the bound of train.batch_size: a batch the trainer could not be given is not planned */
    const struct qc_config_option *bs_opt = qc_config_option_find("train.batch_size");
    const int64_t bs_max = bs_opt ? bs_opt->imax : 4096;
    snprintf(h_bs, sizeof h_bs,
             "scenes in the planned batch (1 .. %" PRId64 ", as train.batch_size)", bs_max);
    snprintf(h_max, sizeof h_max,
             "largest batch size the search tries (1 .. %" PRId64 ", as train.batch_size)", bs_max);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "",
         "qcshard file(s) whose scenes are planned; none: "
         "generated scenes (data.synthetic_profile)"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, h_bs},
        {"budget", QC_CLI_SIZE, &budget, d_budget,
         "device bytes the step must fit (device.budget; 0: hw.device_memory less "
         "hw.device_reserve on cuda, else none)"},
        {"max-batch", QC_CLI_INT, &max_b, "256", h_max},
        {"cost", QC_CLI_STRING, &cost_path, "",
         "a run's plan_cost.json (calibrated times); default: this machine's calibration "
         "(cpu, emu; built-in coefficients under plan.calibration=builtin), the roofline of "
         "hw.tflops and hw.mem_gbps (cuda)"},
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
    if (batch_size < 1 || batch_size > bs_max)
        return qc_errorf(QC_ERR_INVALID,
                         "plan: --batch-size %" PRId64 ": out of range 1 .. %" PRId64
                         " (train.batch_size's)",
                         batch_size, bs_max);
    if (max_b < 1 || max_b > bs_max)
        return qc_errorf(QC_ERR_INVALID,
                         "plan: --max-batch %" PRId64 ": out of range 1 .. %" PRId64
                         " (train.batch_size's)",
                         max_b, bs_max);
    for (int i = 0; i < data.n; i++)
        QC_TRY(check_input("--data", data.v[i]));
    if (cost_path && cost_path[0])
        QC_TRY(check_input("--cost", cost_path));
    cfg.batch_size = batch_size;
    cfg.device_budget = budget;
    QC_TRY(qc_config_validate(&cfg));
    cfg.device_budget = qc_train_plan_budget(&cfg); /* a GPU preset's card less its reserve */

    struct qc_train_planner *pl = NULL;
    QC_TRY(qc_train_planner_create(&cfg, data.v, data.n,
                                   cost_path && cost_path[0] ? cost_path : NULL, &pl));
    struct plan_view v = {.cfg = &cfg, .B = batch_size, .max_b = max_b};
    /* this machine's calibration (cpu, emu; not with --cost nor plan.calibration=builtin) */
    struct qc_plan_cost *calib = NULL;
    char calib_text[256], calib_cache[4200];
    enum qc_status st = QC_OK;
    if (!(cost_path && cost_path[0])) {
        struct qc_train_fixed fx;
        qc_train_planner_fixed(pl, &fx);
        st = qc_train_calib_get(&cfg, (int64_t)(fx.params / sizeof(float)), &calib);
        if (st == QC_OK && calib)
            qc_train_planner_use_cost(pl, calib);
    }
    v.calib_text = calib_text;
    if (cost_path && cost_path[0]) {
        v.calib_source = "file";
        snprintf(calib_text, sizeof calib_text, "the cost model of %s", cost_path);
    } else if (calib) {
        v.cal = qc_plan_cost_calib(calib);
        v.calib_source = qc_plan_calib_source_str(v.cal->source);
        qc_plan_calib_describe(v.cal, (int64_t)time(NULL), calib_text, sizeof calib_text);
        if (qc_plan_calib_path(v.cal, calib_cache, sizeof calib_cache) == QC_OK)
            v.calib_cache = calib_cache;
    } else if (qc_plan_cost_is_roofline(qc_train_planner_cost(pl))) {
        v.calib_source = "roofline";
        snprintf(calib_text, sizeof calib_text, "none: the roofline of the hw.* figures");
    } else {
        v.calib_source = "builtin";
        snprintf(calib_text, sizeof calib_text, "built-in coefficients (%s)",
                 cfg.plan_calibration == QC_CALIBRATION_BUILTIN
                     ? "plan.calibration=builtin"
                     : "no calibration for a CUDA device: plan --cost RUN/plan_cost.json");
    }
    /* the largest batch under the planner, and kept whole (nothing offloaded or recomputed) */
    if (st == QC_OK)
        st = qc_train_planner_largest(pl, max_b, &v.largest[0]);
    struct qc_plan_params keep, par;
    qc_train_plan_params(&cfg, &keep);
    keep.mode = QC_PLAN_MODE_KEEP;
    if (st == QC_OK)
        st = qc_train_planner_largest_with(pl, max_b, NULL, &keep, &v.largest[1]);
    /* not one scene fits: the budget that would fit one (as train says it) */
    struct qc_plan_result r = {0}, low = {0};
    if (st == QC_OK && cfg.device_budget && v.largest[0] == 0) {
        st = qc_train_planner_plan(pl, 1, &r, NULL);
        if (st == QC_OK)
            v.need_one = (uint64_t)((double)r.peak / (1.0 - cfg.plan_margin)) + 1;
        qc_plan_result_free(&r);
    }
    /* the floor: the smallest plan of the batch (a budget nothing fits makes the search go as
     * far as it can), and what holds its peak */
    qc_train_plan_params(&cfg, &par);
    par.budget = 1;
    par.mode = QC_PLAN_MODE_AUTO;
    struct qc_plan_hw hw;
    qc_train_plan_hw(&cfg, &hw);
    struct qc_plan_explain ex = {0};
    const struct qc_plan_program *prog = NULL;
    if (st == QC_OK)
        st = qc_train_planner_plan_with(pl, 0, batch_size, &hw, &par, &low, &prog);
    if (st == QC_OK)
        st = qc_plan_explain(prog, qc_train_planner_cost(pl), &hw, &par, &low, &ex);
    if (st == QC_OK) {
        v.ex = &ex;
        v.floor_peak = low.peak;
        st = qc_train_planner_plan(pl, batch_size, &r, &prog);
    }
    char cost[160], src[256];
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
        v.prog = prog;
        v.r = &r;
        v.b = qc_train_planner_batch(pl);
        v.cost = cost;
        v.data = src;
        v.times = qc_train_planner_times_known(pl);
        qc_train_planner_fixed(pl, &v.fixed);
        rank_figures(&cfg, &v.fixed, &v.rk);
        if (json)
            st = print_json(stdout, &v);
        else
            print_text(stdout, &v);
    }
    if (st == QC_OK && v.need_one) {
        char b1[32], b2[32];
        qc_format_bytes(cfg.device_budget, b1, sizeof b1);
        qc_format_bytes(v.need_one, b2, sizeof b2);
        fflush(stdout);
        st = qc_errorf(QC_ERR_NOMEM,
                       "plan: not one scene of these fits device.budget %s: the smallest plan of "
                       "one scene needs a budget of about %s (%" PRIu64 " bytes)",
                       b1, b2, v.need_one);
    }
    qc_plan_explain_free(&ex);
    qc_plan_result_free(&low);
    qc_plan_result_free(&r);
    qc_train_planner_destroy(pl);
    qc_plan_cost_destroy(calib);
    return st;
}
