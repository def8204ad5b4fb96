/*
 * config_options.c — the one option table of qctrain: every key of a run, its field in struct
 * qc_config, type, default, range or choices, unit and doc.
 *
 * The defaults are the official QCNet Argoverse 2 configuration (QCNET.md §1) on one CPU rank
 * with no memory budget beyond the device's own. They are written as text and parsed with the
 * same code that parses --set, so the table is the only place a default lives, and `--help`
 * shows exactly what the parser accepts (qc_config_defaults, in config_value.c, parses them: the
 * table itself needs nothing from the files that read it).
 */
#include "qc_config.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "config_internal.h"
#include "qc_edit_distance.h"
#include "qc_device.h"

#define KIB ((uint64_t)1 << 10)
#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)
#define TIB ((uint64_t)1 << 40)
#define PIB ((uint64_t)1 << 50)

/* Every bound stays within 2^53, where JSON numbers (doubles) are exact: a dump read back as a
 * preset gives the same values. */
#define JSON_INT_MAX ((int64_t)9007199254740991) /* 2^53 - 1 */

#define BIG_COUNT ((int64_t)1000000000000) /* 1e12: "effectively unbounded" step counts */

#define FIELD(f) .offset = offsetof(struct qc_config, f), .size = sizeof(((struct qc_config *)0)->f)

#define OPT_INT(k, f, d, lo, hi, u, doc_)                                                          \
    {                                                                                              \
        .key = k, .type = QC_CONFIG_INT, FIELD(f), .def = d, .imin = lo, .imax = hi, .unit = u,    \
        .doc = doc_                                                                                \
    }
#define OPT_FLOAT(k, f, d, lo, hi, u, doc_)                                                        \
    {                                                                                              \
        .key = k, .type = QC_CONFIG_FLOAT, FIELD(f), .def = d, .fmin = lo, .fmax = hi, .unit = u,  \
        .doc = doc_                                                                                \
    }
#define OPT_SIZE(k, f, d, lo, hi, doc_)                                                            \
    {                                                                                              \
        .key = k, .type = QC_CONFIG_SIZE, FIELD(f), .def = d, .smin = lo, .smax = hi, .unit = "B", \
        .doc = doc_                                                                                \
    }
#define OPT_BOOL(k, f, d, doc_)                                                                    \
    {                                                                                              \
        .key = k, .type = QC_CONFIG_BOOL, FIELD(f), .def = d, .unit = "", .doc = doc_              \
    }
#define OPT_STRING(k, f, d, doc_)                                                                  \
    {                                                                                              \
        .key = k, .type = QC_CONFIG_STRING, FIELD(f), .def = d, .unit = "", .doc = doc_            \
    }
#define OPT_CHOICE(k, f, d, names, doc_)                                                           \
    {                                                                                              \
        .key = k, .type = QC_CONFIG_CHOICE, FIELD(f), .def = d, .choices = names, .unit = "",      \
        .doc = doc_                                                                                \
    }

// ---- choices (index = enum value) ----------------------------------------------------------

static const char *const attention_names[] = {"fused", "unfused", NULL};
static const char *const edge_mode_names[] = {"auto", "materialised", "tiled", NULL};
static const char *const scene_profile_names[] = {"typical", "dense", "mixed", NULL};
static const char *const balance_names[] = {"none", "cost", "auto", NULL};
/* the eval metrics a checkpoint can be ranked by (metrics.jsonl "eval" keys; lower is better) */
static const char *const keep_metric_names[] = {
    "minFDE", "minADE", "MR", "brier_minFDE", "Brier", "loss", "minAHE", "minFHE", NULL};
static const char *const nonfinite_names[] = {"stop", "skip", NULL};
static const char *const device_kind_names[] = {"cpu", "cuda", "emu", NULL};
static const char *const placement_names[] = {"auto", "host", "nvme", NULL};
static const char *const plan_policy_names[] = {"auto", "keep", "offload", "recompute", NULL};
static const char *const calibration_names[] = {"auto", "builtin", NULL};
static const char *const log_level_names[] = {"error", "warn", "info", "debug", NULL};

_Static_assert(QC_ATTENTION_FUSED == 0 && QC_ATTENTION_UNFUSED == 1, "attention_names order");
_Static_assert(QC_EDGE_MODE_AUTO == 0 && QC_EDGE_MODE_MATERIALISED == 1 && QC_EDGE_MODE_TILED == 2,
               "edge_mode_names order");
_Static_assert(QC_SCENE_TYPICAL == 0 && QC_SCENE_DENSE == 1 && QC_SCENE_MIXED == 2,
               "scene_profile_names order");
_Static_assert(QC_BALANCE_NONE == 0 && QC_BALANCE_COST == 1 && QC_BALANCE_AUTO == 2,
               "balance_names order");
_Static_assert(QC_DEVICE_CPU == 0 && QC_DEVICE_CUDA == 1, "device_kind_names order");
_Static_assert(QC_CONFIG_DEVICE_CPU == (int)QC_DEVICE_CPU &&
                   QC_CONFIG_DEVICE_CUDA == (int)QC_DEVICE_CUDA && QC_CONFIG_DEVICE_EMU == 2,
               "device.kind values extend enum qc_device_kind");
_Static_assert(QC_PLACE_AUTO == 0 && QC_PLACE_HOST == 1 && QC_PLACE_NVME == 2,
               "placement_names order");
_Static_assert(QC_PLAN_AUTO == 0 && QC_PLAN_KEEP == 1 && QC_PLAN_OFFLOAD == 2 &&
                   QC_PLAN_RECOMPUTE == 3,
               "plan_policy_names order");
_Static_assert(QC_CALIBRATION_AUTO == 0 && QC_CALIBRATION_BUILTIN == 1, "calibration_names order");
_Static_assert(QC_LOG_ERROR == 0 && QC_LOG_WARN == 1 && QC_LOG_INFO == 2 && QC_LOG_DEBUG == 3,
               "log_level_names order");

const char *qc_config_plan_policy_str(enum qc_plan_policy p)
{
    return (unsigned)p <= QC_PLAN_RECOMPUTE ? plan_policy_names[p] : "?";
}

// ---- the table -----------------------------------------------------------------------------

static const struct qc_config_option options[] = {
    /* model.* — QCNET.md §1 */
    OPT_INT("model.hidden_dim", hidden_dim, "128", 1, 4096, "", "hidden width D"),
    OPT_INT("model.num_heads", num_heads, "8", 1, 256, "", "attention heads H"),
    OPT_INT("model.head_dim", head_dim, "16", 1, 1024, "",
            "width per head Dh; num_heads * head_dim must equal hidden_dim"),
    OPT_INT("model.num_freq_bands", num_freq_bands, "64", 1, 1024, "", "Fourier frequency bands F"),
    OPT_INT("model.num_historical_steps", num_historical_steps, "50", 1, 1000, "steps",
            "history steps T (t = T-1 is now)"),
    OPT_INT("model.num_future_steps", num_future_steps, "60", 1, 1000, "steps",
            "predicted future steps Tf"),
    OPT_INT("model.num_modes", num_modes, "6", 1, 64, "", "predicted modes K"),
    OPT_INT("model.num_recurrent_steps", num_recurrent_steps, "3", 1, 1000, "",
            "recurrent proposal steps R; must divide num_future_steps"),
    OPT_INT("model.num_map_layers", num_map_layers, "1", 1, 64, "", "map encoder layers"),
    OPT_INT("model.num_agent_layers", num_agent_layers, "2", 1, 64, "", "agent encoder layers"),
    OPT_INT("model.num_dec_layers", num_dec_layers, "2", 1, 64, "", "decoder layers"),
    OPT_INT("model.time_span", time_span, "10", 1, 1000, "steps",
            "temporal edges connect steps s < t with t - s <= time_span"),
    OPT_INT("model.num_t2m_steps", num_t2m_steps, "30", 1, 1000, "steps",
            "history steps the decoder attends to"),
    OPT_INT("model.max_num_neighbors", max_num_neighbors, "300", 1, 1000000, "",
            "neighbour cap of every radius graph"),
    OPT_FLOAT("model.dropout", dropout, "0.1", 0.0, 1.0, "",
              "dropout on attention weights and in every FFN; < 1"),
    OPT_FLOAT("model.pl2pl_radius", pl2pl_radius, "150", 0.0, 100000.0, "m",
              "polygon-to-polygon edge radius"),
    OPT_FLOAT("model.pl2a_radius", pl2a_radius, "50", 0.0, 100000.0, "m",
              "polygon-to-agent edge radius"),
    OPT_FLOAT("model.a2a_radius", a2a_radius, "50", 0.0, 100000.0, "m",
              "agent-to-agent edge radius"),
    OPT_FLOAT("model.pl2m_radius", pl2m_radius, "150", 0.0, 100000.0, "m",
              "polygon-to-mode edge radius"),
    OPT_FLOAT("model.a2m_radius", a2m_radius, "150", 0.0, 100000.0, "m",
              "agent-to-mode edge radius"),
    OPT_CHOICE("model.attention", attention, "fused", attention_names,
               "edge attention: fused (recompute in tiles) or unfused (materialise)"),
    OPT_CHOICE("model.edge_mode", edge_mode, "auto", edge_mode_names,
               "fused attention: the relative embeddings r of every edge set and dL/dr "
               "materialised (E x D each, fast; cpu/emu) or tiled (computed and pushed back "
               "through the edge MLP per attention tile, nothing of E rows; every backend); "
               "auto = materialised on cpu/emu (under device.budget the planner tiles the "
               "edge sets a materialised plan does not fit, before splitting the batch), "
               "tiled on cuda"),

    /* train.* */
    OPT_FLOAT("train.lr", lr, "5e-4", 0.0, 10.0, "", "AdamW learning rate"),
    OPT_FLOAT("train.weight_decay", weight_decay, "1e-4", 0.0, 10.0, "",
              "AdamW weight decay (decay group only)"),
    OPT_INT("train.t_max", t_max, "64", 1, 1000000, "epochs", "cosine schedule period T_max"),
    OPT_INT("train.epochs", epochs, "64", 1, 1000000, "epochs", "epochs to train"),
    OPT_INT("train.steps", steps, "0", 0, BIG_COUNT, "steps",
            "optimizer steps to run; 0 = run train.epochs"),
    OPT_INT("train.batch_size", batch_size, "4", 1, 4096, "scenes",
            "scenes per rank per micro-batch"),
    OPT_INT("train.grad_accum", grad_accum, "1", 1, 4096, "", "micro-batches per optimizer step"),
    OPT_INT("train.global_batch", global_batch, "0", 0, 1048576, "scenes",
            "scenes per optimizer step over all ranks (batch_size x grad_accum x "
            "dist.world_size, checked); 0 = whatever those give (qctrain tune keeps it)"),
    OPT_INT("train.seed", seed, "2023", 0, JSON_INT_MAX, "", "seed of every random draw"),
    OPT_INT("train.save_every", save_every, "0", 0, BIG_COUNT, "steps",
            "steps between checkpoints; 0 = only at the end"),
    OPT_INT("train.keep_last", keep_last, "0", 0, BIG_COUNT, "checkpoints",
            "keep only the newest N checkpoints (and the train.keep_best ones); 0 = keep all"),
    OPT_INT("train.keep_best", keep_best, "0", 0, BIG_COUNT, "checkpoints",
            "also keep the N checkpoints with the lowest train.keep_best_metric of the validation "
            "at their step (--eval-every); 0 = none kept for their metric"),
    OPT_CHOICE("train.keep_best_metric", keep_best_metric, "minFDE", keep_metric_names,
               "the eval metric train.keep_best ranks by (lower is better; the official run "
               "monitors val_minFDE)"),
    OPT_INT("train.log_every", log_every, "1", 1, BIG_COUNT, "steps",
            "steps between progress lines"),
    OPT_STRING("train.out_dir", out_dir, "runs/latest",
               "run directory: checkpoints, metrics, trace, report"),
    /* train.* reliability (docs/RELIABILITY.md) */
    OPT_CHOICE("train.nonfinite", nonfinite, "stop", nonfinite_names,
               "a step with a non-finite loss or gradient: stop (error, last checkpoint kept) or "
               "skip (parameters untouched)"),
    OPT_INT("train.max_skipped", max_skipped, "10", 1, BIG_COUNT, "steps",
            "train.nonfinite=skip: stop after this many skipped steps in a row"),
    /* train.* mixed precision (docs/PRECISION.md) */
    OPT_CHOICE("train.precision", precision, "fp32", qc_precision_names,
               "activations, GEMM inputs and stashes: fp32, bf16, or fp16 with dynamic loss "
               "scaling; weights, gradients and AdamW moments stay fp32"),
    OPT_INT("train.loss_scale_window", loss_scale_window, "2000", 1, BIG_COUNT, "steps",
            "train.precision=fp16: good steps in a row before the loss scale doubles"),
    OPT_INT("train.cpu_threads", cpu_threads, "0", 0, 1024, "",
            "OpenMP and OpenBLAS threads of the host ops; 0 = OMP_NUM_THREADS, else all cores "
            "(a speed setting: runs with the same count give the same bits)"),

    /* data.* */
    OPT_CHOICE("data.synthetic_profile", synthetic_profile, "typical", scene_profile_names,
               "generated scenes: typical AV2 sizes, dense (busy) or a mix"),
    OPT_INT("data.synthetic_scenes", synthetic_scenes, "199908", 1, 1000000000, "scenes",
            "generated scenes per epoch (199908 = the AV2 train split)"),
    OPT_INT("data.loader_threads", loader_threads, "0", 0, 1024, "",
            "loader threads; 0 = all cores"),
    OPT_INT("data.prefetch_batches", prefetch_batches, "2", 0, 64, "batches",
            "batches built ahead of the step"),
    OPT_BOOL("data.shuffle", shuffle, "true", "shuffle scenes every epoch"),
    OPT_CHOICE("data.balance", balance, "auto", balance_names,
               "groups of a step: none (consecutive scenes), cost (similar edge counts in every "
               "group, so every rank), or auto (cost with several ranks, else none)"),

    /* device.* */
    OPT_CHOICE("device.kind", device_kind, "cpu", device_kind_names,
               "backend: cpu, cuda, or emu (for tests and debugging: CPU ops on emulated device "
               "memory that faults on host access)"),
    OPT_INT("device.ordinal", device_ordinal, "0", 0, 1023, "",
            "device index (CUDA; with MPI, relative to the rank's node share)"),
    OPT_SIZE("device.budget", device_budget, "0", 0, 4 * PIB,
             "hard cap on reserved device memory; 0 = the device's memory"),
    OPT_BOOL("device.tf32", tf32, "false", "TF32 GEMMs on CUDA (QCNet trains in fp32)"),

    /* alloc.* */
    OPT_BOOL("alloc.expandable_segments", alloc_expandable, "true",
             "CUDA virtual-memory expandable segments"),
    OPT_SIZE("alloc.round", alloc_round, "512", 1, 1 * MIB,
             "requests are rounded up to this power of two (below 64 as 64: blocks are "
             "64-byte aligned)"),
    OPT_SIZE("alloc.small_max", alloc_small_max, "1MiB", 512, 1 * GIB,
             "largest request served by the small pool"),
    OPT_SIZE("alloc.small_segment", alloc_small_segment, "2MiB", 4 * KIB, 1 * GIB,
             "segment size of the small pool"),
    OPT_SIZE("alloc.large_segment", alloc_large_segment, "20MiB", 64 * KIB, 64 * GIB,
             "minimum segment size of the large pool"),
    OPT_SIZE("alloc.split_limit", alloc_split_limit, "0", 0, 4 * PIB,
             "cached blocks larger than this are never split; 0 = no limit"),
    OPT_BOOL("alloc.by_lifetime", alloc_by_lifetime, "true",
             "train under device.budget: blocks the step's program frees together share "
             "segments (a block's scratch, what a later span frees, what outlives the step "
             "apart)"),
    OPT_BOOL("alloc.trace", alloc_trace, "true", "record the allocation trace (for the report)"),
    OPT_STRING("alloc.trace_file", alloc_trace_file, "",
               "write the trace to this file; empty = in-memory ring buffer only"),
    OPT_INT("alloc.trace_every", alloc_trace_every, "1000", 0, 1000000000, "steps",
            "train also keeps the trace of every N-th step in RUN/trace/ (besides the first "
            "steps and the peak step); 0 = only those"),
    OPT_SIZE("alloc.trace_max_bytes", alloc_trace_max_bytes, "64MiB", 0, 1 * TIB,
             "bound on RUN/trace/: the oldest periodic steps are dropped first; 0 = no step "
             "traces"),

    /* offload.* */
    OPT_CHOICE("offload.placement", offload_placement, "auto", placement_names,
               "where offloaded tensors go: auto (host, then NVMe), host or nvme"),
    OPT_SIZE("offload.host_capacity", offload_host_capacity, "0", 0, 4 * PIB,
             "pinned host tier capacity; 0 = half the free host memory, divided among the "
             "node's ranks"),
    OPT_STRING("offload.nvme_dir", offload_nvme_dir, "",
               "folder of the NVMe spill file; empty = no NVMe tier"),
    OPT_SIZE("offload.nvme_capacity", offload_nvme_capacity, "0", 0, 4 * PIB,
             "most bytes the spill file may grow to (it starts at the plan's NVMe need plus "
             "1/8 and grows in 64 MiB steps); 0 = half the folder's free space, at most "
             "64 GiB, divided among the node's ranks"),
    OPT_INT("offload.queue_depth", offload_queue_depth, "16", 1, 4096, "", "io_uring queue depth"),
    OPT_SIZE("offload.block_size", offload_block_size, "1MiB", 4 * KIB, 1 * GIB,
             "bytes per NVMe I/O; a multiple of 4096"),
    OPT_SIZE("offload.max_inflight", offload_max_inflight, "64MiB", 4 * KIB, 1 * TIB,
             "bytes of offload I/O in flight at once"),
    OPT_BOOL("offload.direct", offload_direct, "true", "O_DIRECT on the spill file"),
    OPT_SIZE("offload.prefetch_window", offload_prefetch_window, "256MiB", 0, 1 * TIB,
             "stash bytes of upcoming backwards fetched ahead (the next backward's always are)"),

    /* hw.* */
    OPT_FLOAT("hw.pcie_gbps", hw_pcie_gbps, "12", 0.001, 10000.0, "GB/s",
              "host<->device bandwidth, one direction (PCIe 3.0 x16 effective: 12)"),
    OPT_FLOAT("hw.nvme_gbps", hw_nvme_gbps, "2", 0.001, 10000.0, "GB/s", "NVMe bandwidth"),
    OPT_INT("hw.gpus_per_node", hw_gpus_per_node, "1", 1, 1024, "", "GPUs sharing one node"),
    OPT_SIZE("hw.device_memory", hw_device_memory, "0", 0, 4 * PIB,
             "the device's memory (a GPU preset's card); with device.budget 0, plan and tune "
             "plan for it less hw.device_reserve; 0 = unknown"),
    OPT_SIZE("hw.device_reserve", hw_device_reserve, "0", 0, 4 * PIB,
             "device bytes outside the allocator: the CUDA context, cuBLAS / NCCL workspaces"),
    OPT_FLOAT("hw.tflops", hw_tflops, "0", 0.0, 1e6, "TFLOP/s",
              "the device's peak dense FP32 FLOP/s (a roofline for plan without a GPU "
              "calibration); 0 = unknown"),
    OPT_FLOAT("hw.mem_gbps", hw_mem_gbps, "0", 0.0, 1e6, "GB/s",
              "the device's memory bandwidth (the roofline's other side); 0 = unknown"),

    /* dist.* */
    OPT_INT("dist.world_size", world_size, "0", 0, 65536, "ranks",
            "ranks the run is planned for: mpirun -np / srun -n must match; 0 = whatever the "
            "launcher starts (1 without one)"),
    OPT_INT("dist.zero_stage", zero_stage, "0", 0, 2, "",
            "0 = plain data parallel, 1 = AdamW moments sharded (each rank updates 1/N, then "
            "all-gather), 2 = + gradients reduce-scattered"),
    OPT_SIZE("dist.bucket_bytes", bucket_bytes, "8MiB", 4 * KIB, 1 * GIB,
             "largest piece of the gradient reduction; pieces start as backward makes them final"),
    OPT_FLOAT("dist.timeout", dist_timeout, "60", 0.1, 86400.0, "s",
              "a rank waited on that answers nothing for this long has gone away, and ranks that "
              "all waited on each other this long have hung: the job stops"),

    /* plan.* */
    OPT_CHOICE(
        "plan.policy", plan_policy, "auto", plan_policy_names,
        "stash policy: auto (the planner, under device.budget), or keep / offload / recompute "
        "on every block application"),
    OPT_FLOAT("plan.margin", plan_margin, "0.02", 0.0, 0.5, "",
              "fraction of device.budget the planner keeps free (raised for a while after a "
              "rollback)"),
    OPT_CHOICE("plan.calibration", plan_calibration, "auto", calibration_names,
               "the cost model's times on cpu/emu: auto (this machine's calibration: probed once "
               "per machine and build, cached, refreshed by every training run) or builtin (the "
               "built-in coefficients: reproducible figures)"),

    /* log.* */
    OPT_CHOICE("log.level", log_level, "info", log_level_names, "log level"),
    OPT_BOOL("log.quiet", quiet, "false", "no progress output"),
    OPT_BOOL("log.tensorboard", log_tensorboard, "true",
             "train writes TensorBoard event files under RUN/tb/"),
    OPT_BOOL("log.report", log_report, "true",
             "train writes RUN/report.html (qctrain report) at the end of the run"),
};

#define NOPTIONS ((int)(sizeof options / sizeof options[0]))

int qc_config_option_count(void)
{
    return NOPTIONS;
}

const struct qc_config_option *qc_config_option_at(int i)
{
    QC_ASSERT(i >= 0 && i < NOPTIONS, "option index %d of %d", i, NOPTIONS);
    return &options[i];
}

const struct qc_config_option *qc_config_option_find(const char *key)
{
    for (int i = 0; i < NOPTIONS; i++)
        if (strcmp(options[i].key, key) == 0)
            return &options[i];
    return NULL;
}

const char *qc_config_option_suggest(const char *unknown_key)
{
    /* Compare with the whole key, and, for a key written without its section ("budget"), with
     * the part after the dot. Close = at most 2 edits, or 3 for long keys, and fewer edits
     * than half the key's length (so "ab" does not suggest "lr"). */
    const char *best = NULL;
    int best_d = 1 << 30;
    size_t len = strlen(unknown_key);
    for (int i = 0; i < NOPTIONS; i++) {
        int d = qc_edit_distance(unknown_key, options[i].key);
        const char *dot = strchr(options[i].key, '.');
        if (!strchr(unknown_key, '.') && dot) {
            int ds = qc_edit_distance(unknown_key, dot + 1);
            if (ds < d)
                d = ds;
        }
        if (d < best_d) {
            best_d = d;
            best = options[i].key;
        }
    }
    int limit = len >= 12 ? 3 : 2;
    if (best && best_d <= limit && (size_t)best_d * 2 < len)
        return best;
    return NULL;
}

const char *qc_config_type_str(enum qc_config_type type)
{
    static const char *const names[QC_CONFIG_TYPE_COUNT] = {"int",  "float",  "bool",
                                                            "size", "string", "choice"};
    if ((int)type < 0 || type >= QC_CONFIG_TYPE_COUNT)
        return "?";
    return names[type];
}

enum qc_status config_unknown_key(const char *origin, const char *key)
{
    const char *near = qc_config_option_suggest(key);
    if (near)
        return qc_errorf(QC_ERR_INVALID, "%s: key '%s': unknown key\nhint: did you mean '%s'?",
                         origin, key, near);
    return qc_errorf(QC_ERR_INVALID,
                     "%s: key '%s': unknown key\nhint: `qctrain config options` lists every key",
                     origin, key);
}

/* Bytes as the largest exact binary unit: 20971520 -> "20MiB". */
static void format_size(uint64_t v, char *buf, size_t n)
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int i = 0; i < 4; i++) {
        uint64_t m = (uint64_t)1 << (40 - 10 * i);
        if (v != 0 && v % m == 0) {
            snprintf(buf, n, "%llu%s", (unsigned long long)(v / m), units[i]);
            return;
        }
    }
    snprintf(buf, n, "%llu", (unsigned long long)v);
}

void qc_config_print_options(FILE *out)
{
    fprintf(out, "%-32s %-6s %-14s %-26s %s\n", "key", "type", "default", "range/choices",
            "description");
    for (int i = 0; i < NOPTIONS; i++) {
        const struct qc_config_option *o = &options[i];
        char range[160] = "";
        switch (o->type) {
        case QC_CONFIG_INT:
            snprintf(range, sizeof range, "[%lld, %lld]", (long long)o->imin, (long long)o->imax);
            break;
        case QC_CONFIG_FLOAT:
            snprintf(range, sizeof range, "[%g, %g]", o->fmin, o->fmax);
            break;
        case QC_CONFIG_SIZE: {
            char lo[32], hi[32];
            format_size(o->smin, lo, sizeof lo);
            format_size(o->smax, hi, sizeof hi);
            snprintf(range, sizeof range, "[%s, %s]", lo, hi);
            break;
        }
        case QC_CONFIG_BOOL:
            snprintf(range, sizeof range, "true|false");
            break;
        case QC_CONFIG_CHOICE: {
            size_t n = 0;
            for (const char *const *c = o->choices; *c && n < sizeof range; c++) {
                int w =
                    snprintf(range + n, sizeof range - n, "%s%s", c == o->choices ? "" : "|", *c);
                if (w < 0)
                    break;
                n += (size_t)w;
            }
            break;
        }
        case QC_CONFIG_STRING:
        case QC_CONFIG_TYPE_COUNT:
            break;
        }
        const char *def = o->def[0] ? o->def : "\"\"";
        if (o->unit[0] && o->type != QC_CONFIG_SIZE)
            fprintf(out, "%-32s %-6s %-14s %-26s %s (%s)\n", o->key, qc_config_type_str(o->type),
                    def, range, o->doc, o->unit);
        else
            fprintf(out, "%-32s %-6s %-14s %-26s %s\n", o->key, qc_config_type_str(o->type), def,
                    range, o->doc);
    }
    fprintf(out, "\nsizes take units: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB "
                 "(powers of 1000), e.g. 24GiB, 512MiB, 1e9, 4096\n");
}
