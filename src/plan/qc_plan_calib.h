/*
 * qc_plan_calib.h — the cost model's calibration for this machine (README.md, "Calibration"):
 * rates measured by a short probe (GEMM at the blocks' shapes, memory-bound ops, host copies),
 * cached per machine, build and model shape, and refreshed from the per-block times a training
 * run measures.
 *
 * A calibration is a plan cost model (qc_plan.h) with a "calibration" record: where its figures
 * come from (a probe, a run), when, and the keys it was made for. The cache is one file per key
 * (plan-calib-<hash>.json) in the cache folder (qc_plan_calib_dir), written whole or not at all
 * (qc_file_write_atomic). A cache file that does not parse, is not a calibration, or was made
 * for another machine, build or model shape is refused with its reason, and probed again.
 *
 * Pure: this file and calibrate.c run no kernel; the probe is the caller's
 * (src/train/memory/calib.c).
 */
#ifndef QC_PLAN_QC_PLAN_CALIB_H
#define QC_PLAN_QC_PLAN_CALIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_plan.h"

enum qc_plan_calib_source {
    QC_PLAN_CALIB_BUILTIN = 0, /* none: the built-in coefficients */
    QC_PLAN_CALIB_PROBE,       /* the probe's rates */
    QC_PLAN_CALIB_RUN,         /* a training run's per-block times (and the probe's rates) */
};

#define QC_PLAN_CALIB_KEY_MAX 192

struct qc_plan_calib {
    enum qc_plan_calib_source source;
    int64_t date;       /* Unix seconds: when the probe ran or the run refreshed it */
    int64_t probe_date; /* Unix seconds of the probe whose rates these are; 0: none */
    /* the probe's rates (0: not measured) */
    double gemm_fwd_flops; /* FLOP/s of out = x·Wᵀ, N x D x D */
    double gemm_bwd_flops; /* FLOP/s of its backward (dx and dW) */
    double mem_bps;        /* bytes/s of LayerNorm forward + backward over N x D */
    double copy_bps;       /* bytes/s of a host copy (the CPU's offload tier) */
    double probe_s;        /* how long the probe took */
    /* the shape the rates price (roofline_time's formulas, cost.c) */
    int64_t hidden_dim, freq_bands, nparams;
    bool shared_r; /* fused attention off CUDA: the KV context projects its sources only, the
                      attention tiles their edges' k_r, v_r */
    /* what it was made for */
    char machine[QC_PLAN_CALIB_KEY_MAX]; /* host name, CPU model, online CPUs */
    char build[QC_PLAN_CALIB_KEY_MAX];   /* version, compiler, the executable's size and time */
    char model[QC_PLAN_CALIB_KEY_MAX];   /* device, precision, model shape, threads */
};

/* The calibration record of c (source BUILTIN for a cost model without one) and setting it. With
 * rates set, a block the model has not measured is priced from them (cost.c, probe_time). */
const struct qc_plan_calib *qc_plan_cost_calib(const struct qc_plan_cost *c);
void qc_plan_cost_set_calib(struct qc_plan_cost *c, const struct qc_plan_calib *cal);
/* A copy of src (coefficients, glue, step factor, calibration record, a pending warm-up). */
enum qc_status qc_plan_cost_clone(const struct qc_plan_cost *src, struct qc_plan_cost **out);

/* The cache folder: $QC_CACHE_DIR, else $XDG_CACHE_HOME/qctrain, else $HOME/.cache/qctrain. */
enum qc_status qc_plan_calib_dir(char *buf, size_t n);
/* This machine's and this build's keys (qc_plan_calib.machine, .build). */
void qc_plan_calib_machine(char *buf, size_t n);
void qc_plan_calib_build(char *buf, size_t n);
/* The cache file of key's machine, build and model. */
enum qc_status qc_plan_calib_path(const struct qc_plan_calib *key, char *buf, size_t n);

/* Loads the calibration at path into a new cost model when it is one made for key's machine,
 * build and model (QC_ERR_INVALID naming the file and what differs, QC_ERR_IO when it cannot be
 * read). */
enum qc_status qc_plan_calib_load(const char *path, const struct qc_plan_calib *key,
                                  struct qc_plan_cost **out);

/* Measures the rates of key's model into cal (the caller's probe). */
typedef enum qc_status (*qc_plan_calib_probe_fn)(void *user, struct qc_plan_calib *cal);

/* The calibration of key: the cache's when it holds a valid one for key, else probed (probe),
 * cached (best effort: a cache that cannot be written is warned about) and returned. *probed
 * (may be NULL) says which. A refused cache file is warned about with its reason. */
enum qc_status qc_plan_calib_get(const struct qc_plan_calib *key, qc_plan_calib_probe_fn probe,
                                 void *user, struct qc_plan_cost **out, bool *probed);

/* Refreshes key's cache from a training run's cost model (per-block coefficients, glue): the
 * probe's rates of the cache are kept when it holds a valid calibration for key. */
enum qc_status qc_plan_calib_refresh(const struct qc_plan_cost *run,
                                     const struct qc_plan_calib *key);

/* One line: "built-in coefficients", "probed on this machine at 2026-12-05 09:30 UTC (3 min
 * ago)", "refreshed from a training run at ... (...)". now: Unix seconds. */
const char *qc_plan_calib_describe(const struct qc_plan_calib *cal, int64_t now, char *buf,
                                   size_t n);
const char *qc_plan_calib_source_str(enum qc_plan_calib_source s);

#endif
