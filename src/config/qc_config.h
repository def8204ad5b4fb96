/*
 * qc_config.h — the effective configuration of a run: one option table (name, type, default,
 * range or choices, unit, doc) in config_options.c fills struct qc_config.
 *
 * Precedence: built-in defaults < preset chain (profiles/<name>.json, each may "inherit" another)
 * < --set key=value, applied in that order. Keys are dotted ("device.budget"); preset files may
 * write them flat ("device.budget": "24GiB") or nested ({"device": {"budget": "24GiB"}}).
 * Sizes accept units (B, KiB, MiB, GiB, TiB, also written K, M, G, T; KB/MB/GB/TB are powers of
 * 1000; case-insensitive) and are stored and dumped in bytes. Every range stays within 2^53, so
 * a dump applied as a preset gives back the same configuration. Errors (unknown key, wrong type,
 * out of range, inheritance cycle, unreadable/malformed file) are QC_ERR_INVALID with a message
 * naming the file, the key and the value, plus a "did you mean" hint for near-miss keys; the
 * CLI exits 2 on them.
 */
#ifndef QC_CONFIG_QC_CONFIG_H
#define QC_CONFIG_QC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_status.h"
#include "qc_types.h" /* enum qc_precision */

#ifdef __cplusplus
extern "C" {
#endif

#define QC_CONFIG_STR_MAX 1024

enum qc_attention_impl { QC_ATTENTION_FUSED = 0, QC_ATTENTION_UNFUSED };
/* model.edge_mode: = enum qc_attn_edge_mode (src/model/qc_attention.h) */
enum qc_edge_mode { QC_EDGE_MODE_AUTO = 0, QC_EDGE_MODE_MATERIALISED, QC_EDGE_MODE_TILED };
enum qc_scene_profile { QC_SCENE_TYPICAL = 0, QC_SCENE_DENSE, QC_SCENE_MIXED };
enum qc_placement { QC_PLACE_AUTO = 0, QC_PLACE_HOST, QC_PLACE_NVME };
enum qc_plan_policy { QC_PLAN_AUTO = 0, QC_PLAN_KEEP, QC_PLAN_OFFLOAD, QC_PLAN_RECOMPUTE };
/* "auto" / "keep" / "offload" / "recompute": plan.policy's choices, the one table of these
 * names (config_options.c); "?" for another value. */
const char *qc_config_plan_policy_str(enum qc_plan_policy p);
enum qc_balance { QC_BALANCE_NONE = 0, QC_BALANCE_COST, QC_BALANCE_AUTO };
/* plan.calibration: the cost model's coefficients on cpu / emu without --cost: this machine's
 * calibration (probed once, cached, refreshed by training runs: src/plan/qc_plan_calib.h) or
 * the built-in ones (reproducible figures: tests). */
enum qc_calibration { QC_CALIBRATION_AUTO = 0, QC_CALIBRATION_BUILTIN };
/* train.nonfinite: what a step with a non-finite loss term or gradient does. */
enum qc_nonfinite { QC_NONFINITE_STOP = 0, QC_NONFINITE_SKIP };
/* device.kind: the device layer's kinds (qc_types.h: cpu = 0, cuda = 1) plus the emulated
 * device of the tests (kernels/qc_exec.h backend EMU: CPU ops on protected host memory). */
enum qc_config_device {
    QC_CONFIG_DEVICE_CPU = 0,
    QC_CONFIG_DEVICE_CUDA,
    QC_CONFIG_DEVICE_EMU,
    QC_CONFIG_DEVICE_COUNT
};

struct qc_config {
    /* model.* — QCNet hyper-parameters (QCNET.md §1) */
    int64_t hidden_dim;               /* D, 128 */
    int64_t num_heads;                /* H, 8 */
    int64_t head_dim;                 /* Dh, 16; H*Dh must equal D */
    int64_t num_freq_bands;           /* F, 64 */
    int64_t num_historical_steps;     /* T, 50 */
    int64_t num_future_steps;         /* Tf, 60 */
    int64_t num_modes;                /* K, 6 */
    int64_t num_recurrent_steps;      /* R, 3 */
    int64_t num_map_layers;           /* 1 */
    int64_t num_agent_layers;         /* 2 */
    int64_t num_dec_layers;           /* 2 */
    int64_t time_span;                /* 10 steps */
    int64_t num_t2m_steps;            /* 30 steps */
    int64_t max_num_neighbors;        /* 300 */
    double dropout;                   /* 0.1 */
    double pl2pl_radius;              /* m, 150 */
    double pl2a_radius;               /* m, 50 */
    double a2a_radius;                /* m, 50 */
    double pl2m_radius;               /* m, 150 */
    double a2m_radius;                /* m, 150 */
    enum qc_attention_impl attention; /* fused | unfused */
    enum qc_edge_mode edge_mode;      /* auto | materialised | tiled */

    /* train.* */
    double lr;                       /* 5e-4 */
    double weight_decay;             /* 1e-4 */
    int64_t t_max;                   /* cosine schedule period, epochs, 64 */
    int64_t epochs;                  /* 64 */
    int64_t steps;                   /* optimizer steps; 0 = run `epochs` */
    int64_t batch_size;              /* scenes per rank per micro-batch, 4 */
    int64_t grad_accum;              /* micro-batches per optimizer step, 1 */
    int64_t global_batch;            /* scenes per optimizer step over all ranks; 0 = derived */
    int64_t seed;                    /* 2023 */
    int64_t save_every;              /* steps between checkpoints; 0 = only at the end */
    int64_t keep_last;               /* newest checkpoints kept; 0 = all (docs/CHECKPOINTS.md) */
    int64_t keep_best;               /* best checkpoints kept by keep_best_metric; 0 = none */
    int keep_best_metric;            /* index into train.keep_best_metric's choices (minFDE...) */
    int64_t log_every;               /* steps between progress lines, 1 */
    char out_dir[QC_CONFIG_STR_MAX]; /* run directory */
    enum qc_nonfinite nonfinite;     /* stop | skip (docs/RELIABILITY.md) */
    int64_t max_skipped;             /* skip: steps skipped in a row before stopping, 10 */
    enum qc_precision precision;     /* fp32 | bf16 | fp16 */
    int64_t loss_scale_window;       /* fp16: good steps before the loss scale doubles, 2000 */
    int64_t cpu_threads;             /* host ops' OpenMP + OpenBLAS threads; 0 = the process's */

    /* data.* */
    enum qc_scene_profile synthetic_profile; /* typical | dense | mixed */
    int64_t synthetic_scenes; /* scenes per epoch when training on generated scenes */
    int64_t loader_threads;   /* 0 = all cores */
    int64_t prefetch_batches; /* batches built ahead, 2 */
    bool shuffle;             /* true */
    enum qc_balance balance;  /* none | cost | auto (cost with several ranks) */

    /* device.* */
    enum qc_config_device device_kind; /* cpu | cuda | emu */
    int64_t device_ordinal;            /* 0 */
    uint64_t device_budget; /* bytes; hard cap on reserved device memory; 0 = the device's */
    bool tf32;              /* TF32 GEMMs on CUDA, false (QCNet trained fp32 matmuls) */

    /* alloc.* */
    bool alloc_expandable;        /* CUDA virtual-memory expandable segments, true */
    uint64_t alloc_round;         /* bytes, rounding of requests, 512 */
    uint64_t alloc_small_max;     /* bytes, largest request served by the small pool, 1 MiB */
    uint64_t alloc_small_segment; /* bytes, 2 MiB */
    uint64_t alloc_large_segment; /* bytes, 20 MiB */
    uint64_t alloc_split_limit;   /* bytes; blocks larger are never split; 0 = no limit */
    bool alloc_by_lifetime;       /* train: segments by lifetime class, true */
    bool alloc_trace;             /* keep the allocation trace */
    char alloc_trace_file[QC_CONFIG_STR_MAX]; /* "" = ring buffer only */
    int64_t alloc_trace_every;                /* steps; also trace every N-th step, 0 = off */
    uint64_t alloc_trace_max_bytes;           /* bytes; bound on RUN/trace/ */

    /* offload.* */
    enum qc_placement offload_placement;      /* auto | host | nvme */
    uint64_t offload_host_capacity;           /* bytes of pinned host tier */
    char offload_nvme_dir[QC_CONFIG_STR_MAX]; /* spill directory; "" = no NVMe tier */
    uint64_t offload_nvme_capacity;           /* bytes preallocated for the spill file */
    int64_t offload_queue_depth;              /* io_uring queue depth, 16 */
    uint64_t offload_block_size;              /* bytes per I/O, 1 MiB */
    uint64_t offload_max_inflight;            /* bytes in flight, 64 MiB */
    bool offload_direct;                      /* O_DIRECT, true */
    uint64_t offload_prefetch_window;         /* bytes of reads kept in flight ahead of backward */

    /* hw.* — hardware figures for the planner */
    double hw_pcie_gbps;        /* GB/s host<->device, one direction */
    double hw_nvme_gbps;        /* GB/s NVMe */
    int64_t hw_gpus_per_node;   /* 1 */
    uint64_t hw_device_memory;  /* bytes of the device (GPU presets); 0 = unknown */
    uint64_t hw_device_reserve; /* bytes outside the allocator (CUDA context, workspaces) */
    double hw_tflops;           /* peak dense FP32 TFLOP/s; 0 = unknown */
    double hw_mem_gbps;         /* device memory GB/s; 0 = unknown */

    /* dist.* */
    int64_t world_size;    /* ranks; 0 = the launcher's (1 without one) */
    int64_t zero_stage;    /* 0, 1 or 2 */
    uint64_t bucket_bytes; /* bytes, largest piece of the gradient reduction, 8 MiB */
    double dist_timeout;   /* s, silence after which a rank has gone away, 60 */

    /* plan.* */
    enum qc_plan_policy plan_policy;      /* auto | keep | offload | recompute */
    double plan_margin;                   /* fraction of the budget kept free, 0.02 */
    enum qc_calibration plan_calibration; /* auto | builtin */

    /* log.* */
    int64_t log_level; /* enum qc_log_level */
    bool quiet;
    bool log_tensorboard; /* TensorBoard event files under RUN/tb/, true */
    bool log_report;      /* RUN/report.html at the end of train, true */
};

// ---- the option table ------------------------------------------------------------------

enum qc_config_type {
    QC_CONFIG_INT = 0, /* int64_t; text "128", JSON 128 (integral numbers only) */
    QC_CONFIG_FLOAT,   /* double; finite */
    QC_CONFIG_BOOL,    /* bool; JSON true/false, text true|false|yes|no|on|off|1|0 */
    QC_CONFIG_SIZE,    /* uint64_t bytes; "24GiB", "512MiB", "1e9", "4096" or a JSON number */
    QC_CONFIG_STRING,  /* char[QC_CONFIG_STR_MAX] */
    QC_CONFIG_CHOICE,  /* an enum stored as int, or as int64_t when size == 8; index = value */
    QC_CONFIG_TYPE_COUNT
};

/* One row of the option table. Ranges are inclusive; only the pair of the row's type is used. */
struct qc_config_option {
    const char *key; /* dotted: "<section>.<name>", e.g. "device.budget" */
    enum qc_config_type type;
    size_t offset;              /* offsetof(struct qc_config, <field>) */
    size_t size;                /* sizeof the field */
    const char *def;            /* the default, as text (parsed by qc_config_defaults) */
    int64_t imin, imax;         /* QC_CONFIG_INT */
    double fmin, fmax;          /* QC_CONFIG_FLOAT */
    uint64_t smin, smax;        /* QC_CONFIG_SIZE, bytes */
    const char *const *choices; /* QC_CONFIG_CHOICE: NULL-terminated; choices[v] names value v */
    const char *unit;           /* "m", "GB/s", "steps", ...; "" for none */
    const char *doc;            /* one line */
};

/* The table, in its stable order (also the order of the JSON dump). 0 <= i < count. */
int qc_config_option_count(void);
const struct qc_config_option *qc_config_option_at(int i);
/* The row of a dotted key, or NULL. */
const struct qc_config_option *qc_config_option_find(const char *key);
/* The closest key to an unknown one ("did you mean"), or NULL when nothing is close. */
const char *qc_config_option_suggest(const char *unknown_key);
/* "int", "float", "bool", "size", "string", "choice". */
const char *qc_config_type_str(enum qc_config_type type);

/* Sets one key from text, as --set and preset strings do. origin names the source in errors
 * ("--set", "profiles/x.json"): "<origin>: key '<key>': <what>, got \"<value>\"". cfg is
 * modified only on QC_OK. */
enum qc_status qc_config_set(struct qc_config *cfg, const char *key, const char *value,
                             const char *origin);
/* Formats the current value of opt as text the way the dump prints it (sizes in bytes, choices
 * by name, strings unquoted). Truncates to n bytes (NUL included). */
void qc_config_format_value(const struct qc_config *cfg, const struct qc_config_option *opt,
                            char *buf, size_t n);

/* Fills cfg with the built-in defaults (the official AV2 configuration, one CPU rank). */
void qc_config_defaults(struct qc_config *cfg);

/* Applies a preset: NAME (profiles/NAME.json, searched in $QC_PROFILES_DIR, then the source
 * tree's and the install's profiles/ folders) or a path to a .json file. Resolves "inherits"
 * (parents first), detects cycles. */
enum qc_status qc_config_apply_preset(struct qc_config *cfg, const char *name_or_path);
/* Applies a preset held in memory (the text of a .json file; need not be NUL-terminated).
 * origin is the file name used in messages; relative "inherits" paths resolve against its
 * folder. The fuzzer's entry point. cfg is modified only on QC_OK. */
enum qc_status qc_config_apply_preset_json(struct qc_config *cfg, const char *json, size_t len,
                                           const char *origin);
/* Resolves a preset NAME to the path of its file (search order above), or checks that a path
 * exists. Writes out (n bytes) only on QC_OK; QC_ERR_INVALID "preset 'x' not found ..." else. */
enum qc_status qc_config_preset_path(const char *name_or_path, char *out, size_t n);
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

/* Parses "24GiB", "512MiB", "1.5KiB", "1e9", "4096" into bytes (a whole number of them).
 * QC_ERR_INVALID with a message and a hint on anything else; *out written only on QC_OK. */
enum qc_status qc_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif /* QC_CONFIG_QC_CONFIG_H */
