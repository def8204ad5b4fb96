/*
 * owners.c — who holds bytes at a peak and what moves them (qc_plan_owners.h): the one table
 * `qctrain plan` (its floor) and the HTML report (the measured peak step) both print.
 *
 * The knobs are written once, as pieces, and the kinds' sentences are made of the same pieces
 * as the owners' (the fixed kind's sentence is the parameters', moments' and batch's knobs),
 * so the plan's wording and the report's cannot drift apart.
 */
#include "qc_plan_owners.h"

#include <stdio.h>
#include <string.h>

// ---- the knobs ------------------------------------------------------------------------------

#define KNOB_MODEL "the model's size (model.*)"
#define KNOB_ZERO  "dist.zero_stage 1 or 2 with several ranks (a 1/world shard each)"
#define KNOB_BATCH "train.batch_size"
#define KNOB_EDGES "the edge counts (model.*_radius, model.max_num_neighbors)"
#define KNOB_TIER  "a larger tier (offload.host_capacity, offload.nvme_dir)"
#define KNOB_POLICY                                                                                \
    "device.budget (the planner offloads or recomputes the stashes a budget needs) or "            \
    "plan.policy=offload|recompute"
#define KNOB_TILED                                                                                 \
    "model.edge_mode=tiled (model.attention=fused: each attention tile computes its own r and "    \
    "pushes its dL/dr straight back, so neither exists for all edges at once)"

static const char *const hold_keys[QC_PLAN_HOLD_COUNT] = {"fixed",  "stash_read",  "stash",
                                                          "tensor", "working_set", "recompute"};

static const char *const hold_knobs[QC_PLAN_HOLD_COUNT] = {
    /* fixed */ "parameters and gradients: " KNOB_MODEL "; AdamW moments: " KNOB_ZERO
                "; the staged batch: " KNOB_BATCH,
    /* stash read */
    KNOB_BATCH " (fewer scenes per group): no policy moves a stash while its block reads it",
    /* stash */ KNOB_TIER ", a smaller offload.prefetch_window",
    /* tensor */
    KNOB_BATCH ", " KNOB_EDGES ": no policy moves these; the edge sets' dL/dr: " KNOB_TILED,
    /* working set */ KNOB_BATCH ", " KNOB_EDGES ": the block's own working memory",
    /* recompute */
    "an offload tier instead of recomputing (offload.host_capacity, offload.nvme_dir)",
};

static const struct qc_plan_owner_info owners[QC_PLAN_OWNER_COUNT] = {
    [QC_PLAN_OWNER_PARAMS] = {"parameters", "parameters", QC_PLAN_HOLD_FIXED, false, KNOB_MODEL},
    [QC_PLAN_OWNER_GRADS] = {"gradients", "gradients", QC_PLAN_HOLD_FIXED, false, KNOB_MODEL},
    [QC_PLAN_OWNER_MOMENTS] = {"moments", "AdamW moments", QC_PLAN_HOLD_FIXED, false, KNOB_ZERO},
    [QC_PLAN_OWNER_BATCH] = {"batch", "staged batch", QC_PLAN_HOLD_FIXED, false, KNOB_BATCH},
    [QC_PLAN_OWNER_STASH] = {"stash", "stash of a block application", QC_PLAN_HOLD_STASH, true,
                             KNOB_POLICY "; " KNOB_TIER},
    [QC_PLAN_OWNER_EDGE_R] = {"edge_r", "r of an edge set", QC_PLAN_HOLD_STASH, true,
                              KNOB_TILED
                              "; materialised, a stash policy between its uses: " KNOB_POLICY},
    [QC_PLAN_OWNER_EDGE_DR] = {"edge_dr", "dL/dr of an edge set", QC_PLAN_HOLD_TENSOR, false,
                               KNOB_TILED "; no policy moves it"},
    [QC_PLAN_OWNER_ACT_GRAD] = {"activation_gradients", "activation gradients", QC_PLAN_HOLD_TENSOR,
                                false, KNOB_BATCH ", " KNOB_EDGES ": no policy moves these"},
    [QC_PLAN_OWNER_TENSOR] = {"tensor", "tensor", QC_PLAN_HOLD_TENSOR, false,
                              KNOB_BATCH ", " KNOB_EDGES ": no policy moves these"},
    [QC_PLAN_OWNER_WORKING] = {"working_set", "working set", QC_PLAN_HOLD_WORKING, false,
                               KNOB_BATCH ", " KNOB_EDGES ": the op's own working memory"},
    [QC_PLAN_OWNER_RECOMPUTE] = {"recompute", "recompute", QC_PLAN_HOLD_RECOMPUTE, false,
                                 "an offload tier instead of recomputing "
                                 "(offload.host_capacity, offload.nvme_dir)"},
};

const char *qc_plan_hold_key(enum qc_plan_hold k)
{
    return (int)k >= 0 && k < QC_PLAN_HOLD_COUNT ? hold_keys[k] : "?";
}

const char *qc_plan_hold_knob(enum qc_plan_hold k)
{
    return (int)k >= 0 && k < QC_PLAN_HOLD_COUNT ? hold_knobs[k] : "?";
}

const struct qc_plan_owner_info *qc_plan_owner_info(enum qc_plan_owner o)
{
    return (int)o >= 0 && o < QC_PLAN_OWNER_COUNT ? &owners[o] : NULL;
}

// ---- reading a tag --------------------------------------------------------------------------

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* The length of s's stem when it ends with suffix, or with a prefix of it (at least the
 * separator and one letter) and s was cut at the allocator's 63 bytes; 0 otherwise. */
static size_t stem_of(const char *s, const char *suffix)
{
    const size_t n = strlen(s), k = strlen(suffix);
    if (n > k && strcmp(s + n - k, suffix) == 0)
        return n - k;
    if (n == 63)
        for (size_t j = k - 1; j >= 2; j--)
            if (strncmp(s + n - j, suffix, j) == 0)
                return n - j;
    return 0;
}

enum qc_plan_owner qc_plan_owner_of_tag(const char *tag, char *name, size_t n)
{
    const char *slash = strchr(tag, '/');
    const size_t blen = slash ? (size_t)(slash - tag) : strlen(tag);
    const char *rest = slash ? slash + 1 : "";
    char blk[128];
    snprintf(blk, sizeof blk, "%.*s", (int)(blen < sizeof blk ? blen : sizeof blk - 1), tag);
    size_t k;
    if (!tag[0]) {
        snprintf(name, n, "(untagged)");
        return QC_PLAN_OWNER_TENSOR;
    }
    if (strcmp(blk, "params") == 0) {
        snprintf(name, n, "parameters");
        return QC_PLAN_OWNER_PARAMS;
    }
    if (strcmp(blk, "grads") == 0) {
        snprintf(name, n, "gradients");
        return QC_PLAN_OWNER_GRADS;
    }
    if (starts(blk, "optim")) {
        snprintf(name, n, "AdamW moments");
        return QC_PLAN_OWNER_MOMENTS;
    }
    if (starts(blk, "batch")) {
        snprintf(name, n, "staged batch");
        return QC_PLAN_OWNER_BATCH;
    }
    if (strcmp(blk, "edges") == 0) { /* the edge contexts' stash: "edges/<set>.r", ".fe" */
        if ((k = stem_of(rest, ".r")) > 0) {
            snprintf(name, n, "r of edge set %.*s", (int)k, rest);
            return QC_PLAN_OWNER_EDGE_R;
        }
        if ((k = stem_of(rest, ".fe")) > 0) {
            snprintf(name, n, "stash of edges.%.*s", (int)k, rest);
            return QC_PLAN_OWNER_STASH;
        }
    }
    if (starts(blk, "edges.") && strcmp(rest, "edges.dr") == 0) {
        snprintf(name, n, "dL/dr of edge set %s", blk + 6);
        return QC_PLAN_OWNER_EDGE_DR;
    }
    if (strcmp(blk, "grad") == 0) {
        snprintf(name, n, "%s", tag);
        return QC_PLAN_OWNER_ACT_GRAD;
    }
    if (starts(blk, "scratch")) {
        snprintf(name, n, "%s", tag);
        return QC_PLAN_OWNER_WORKING;
    }
    /* a block application's stash, named as the plan names the application */
    k = stem_of(tag, ".stash");
    if (k == 0)
        k = stem_of(tag, "/stash");
    if (slash && k >= blen) { /* ".../app4.stash", "decoder.y_emb/c0/stash", "x_a_emb/stash" */
        snprintf(name, n, "stash of %.*s", (int)k, tag);
        return QC_PLAN_OWNER_STASH;
    }
    if (slash && strcmp(rest, "kv") == 0) { /* a source context's keys and values */
        snprintf(name, n, "stash of %s", tag);
        return QC_PLAN_OWNER_STASH;
    }
    snprintf(name, n, "%s", tag);
    return QC_PLAN_OWNER_TENSOR;
}
