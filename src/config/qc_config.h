/*
 * qc_config.h — the effective configuration of a run: one option table (name, type, default,
 * range or choices, unit, doc) in config_options.c fills struct qc_config.
 *
 * Precedence: built-in defaults < preset chain (profiles/<name>.json, each may "inherit" another)
 * < --set key=value, applied in that order. Keys are dotted ("device.budget"); preset files may
 * write them flat ("device.budget": "24GiB") or nested ({"device": {"budget": "24GiB"}}).
 * Sizes accept units (B, KiB, MiB, GiB, TiB, and KB/MB/GB/TB as powers of 1000) and are
 * stored and dumped in bytes. Errors (unknown key, wrong type, out of range, inheritance cycle,
 * unreadable/malformed file) are QC_ERR_INVALID with a message naming the file, the key and the
 * value, plus a "did you mean" hint for near-miss keys; the CLI exits 2 on them.
 */
#ifndef QC_CONFIG_QC_CONFIG_H
#define QC_CONFIG_QC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_CONFIG_STR_MAX 1024

enum qc_attention_impl { QC_ATTENTION_FUSED = 0, QC_ATTENTION_UNFUSED };
enum qc_scene_profile { QC_SCENE_TYPICAL = 0, QC_SCENE_DENSE, QC_SCENE_MIXED };
enum qc_placement { QC_PLACE_AUTO = 0, QC_PLACE_HOST, QC_PLACE_NVME };
enum qc_plan_policy { QC_PLAN_AUTO = 0, QC_PLAN_KEEP, QC_PLAN_OFFLOAD, QC_PLAN_RECOMPUTE };
enum qc_balance { QC_BALANCE_NONE = 0, QC_BALANCE_COST };

struct qc_config {
    /* model.* — QCNet hyper-parameters (QCNET.md §1) */
    int64_t hidden_dim;           /* D, 128 */
    int64_t num_heads;            /* H, 8 */
    int64_t head_dim;             /* Dh, 16; H*Dh must equal D */
    int64_t num_freq_bands;       /* F, 64 */
    int64_t num_historical_steps; /* T, 50 */
    int64_t num_future_steps;     /* Tf, 60 */
    int64_t num_modes;            /* K, 6 */
    int64_t num_recurrent_steps;  /* R, 3 */
    int64_t num_map_layers;       /* 1 */
    int64_t num_agent_layers;     /* 2 */
    int64_t num_dec_layers;       /* 2 */
    int64_t time_span;            /* 10 steps */
    int64_t num_t2m_steps;        /* 30 steps */
    int64_t max_num_neighbors;    /* 300 */
    double dropout;               /* 0.1 */
    double pl2pl_radius;          /* m, 150 */
    double pl2a_radius;           /* m, 50 */
    double a2a_radius;            /* m, 50 */
    double pl2m_radius;           /* m, 150 */
    double a2m_radius;            /* m, 150 */
    enum qc_attention_impl attention; /* fused | unfused */

    /* train.* */
    double lr;                 /* 5e-4 */
    double weight_decay;       /* 1e-4 */
    int64_t t_max;             /* cosine schedule period, epochs, 64 */
    int64_t epochs;            /* 64 */
    int64_t steps;             /* optimizer steps; 0 = run `epochs` */
    int64_t batch_size;        /* scenes per rank per micro-batch, 4 */
    int64_t grad_accum;        /* micro-batches per optimizer step, 1 */
    int64_t seed;              /* 2023 */
    int64_t save_every;        /* steps between checkpoints; 0 = only at the end */
    int64_t log_every;         /* steps between progress lines, 1 */
    char out_dir[QC_CONFIG_STR_MAX]; /* run directory */

    /* data.* */
    enum qc_scene_profile synthetic_profile; /* typical | dense | mixed */
    int64_t synthetic_scenes;  /* scenes per epoch when training on generated scenes */
    int64_t loader_threads;    /* 0 = all cores */
    int64_t prefetch_batches;  /* batches built ahead, 2 */
    bool shuffle;              /* true */
    enum qc_balance balance;   /* none | cost */

    /* device.* */
    int64_t device_kind;       /* enum qc_device_kind: cpu | cuda */
    int64_t device_ordinal;    /* 0 */
    uint64_t device_budget;    /* bytes; hard cap on reserved device memory; 0 = the device's */
    bool tf32;                 /* TF32 GEMMs on CUDA, false (QCNet trained fp32 matmuls) */

    /* alloc.* */
    bool alloc_expandable;     /* CUDA virtual-memory expandable segments, true */
    uint64_t alloc_round;      /* bytes, rounding of requests, 512 */
    uint64_t alloc_small_max;  /* bytes, largest request served by the small pool, 1 MiB */
    uint64_t alloc_small_segment; /* bytes, 2 MiB */
    uint64_t alloc_large_segment; /* bytes, 20 MiB */
    uint64_t alloc_split_limit;   /* bytes; blocks larger are never split; 0 = no limit */
    bool alloc_trace;          /* keep the allocation trace */
    char alloc_trace_file[QC_CONFIG_STR_MAX]; /* "" = ring buffer only */

    /* offload.* */
    enum qc_placement offload_placement; /* auto | host | nvme */
    uint64_t offload_host_capacity; /* bytes of pinned host tier */
    char offload_nvme_dir[QC_CONFIG_STR_MAX]; /* spill directory; "" = no NVMe tier */
    uint64_t offload_nvme_capacity; /* bytes preallocated for the spill file */
    int64_t offload_queue_depth;    /* io_uring queue depth, 16 */
    uint64_t offload_block_size;    /* bytes per I/O, 1 MiB */
    uint64_t offload_max_inflight;  /* bytes in flight, 64 MiB */
    bool offload_direct;            /* O_DIRECT, true */
    uint64_t offload_prefetch_window; /* bytes of reads kept in flight ahead of backward */

    /* hw.* — hardware figures for the planner */
    double hw_pcie_gbps;       /* GB/s host<->device, one direction */
    double hw_nvme_gbps;       /* GB/s NVMe */
    int64_t hw_gpus_per_node;  /* 1 */

    /* dist.* */
    int64_t world_size;        /* ranks, 1 */
    int64_t zero_stage;        /* 0, 1 or 2 */

    /* plan.* */
    enum qc_plan_policy plan_policy; /* auto | keep | offload | recompute */

    /* log.* */
    int64_t log_level;         /* enum qc_log_level */
    bool quiet;
};

/* Fills cfg with the built-in defaults (the official AV2 configuration, one CPU rank). */
void qc_config_defaults(struct qc_config *cfg);

/* Applies a preset: NAME (profiles/NAME.json, searched in $QC_PROFILES_DIR, then the source
 * tree's and the install's profiles/ folders) or a path to a .json file. Resolves "inherits"
 * (parents first), detects cycles. */
enum qc_status qc_config_apply_preset(struct qc_config *cfg, const char *name_or_path);
/* Applies one "key=value" as --set does. */
enum qc_status qc_config_apply_set(struct qc_config *cfg, const char *key_eq_value);
/* Checks cross-field constraints (e.g. num_heads*head_dim == hidden_dim). */
enum qc_status qc_config_validate(const struct qc_config *cfg);
/* Writes the effective configuration as pretty JSON (nested by dotted prefix; sizes in bytes). */
enum qc_status qc_config_dump_json(const struct qc_config *cfg, FILE *out);
/* Same, into a malloc'd string the caller frees (for checkpoint metadata). */
enum qc_status qc_config_to_json(const struct qc_config *cfg, char **out);
/* Prints the option table (name, type, default, range/choices, unit, doc) for --help. */
void qc_config_print_options(FILE *out);

/* Parses "24GiB", "512MiB", "1e9", "4096" into bytes. */
enum qc_status qc_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif /* QC_CONFIG_QC_CONFIG_H */
