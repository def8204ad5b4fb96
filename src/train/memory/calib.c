/*
 * calib.c — this machine's calibration of the planner's cost model for a configuration
 * (src/plan/qc_plan_calib.h; src/plan/README.md, "Calibration"): the key (machine, build, the
 * model's shape and precision, threads), the probe (the CPU ops the cost model prices, at the
 * blocks' shapes) and the refresh from a training run's measured cost model.
 *
 * The probe (well under a second on a 2-core VM at D 128): for N = 2048 rows of D = hidden_dim,
 * the GEMM out = x·Wᵀ (forward) and its backward (dx and dW), LayerNorm forward + backward
 * (memory-bound), a 16 MiB host copy (the CPU's offload tier); each timed over repeats of at
 * least 30 ms after a warm run, the best of 3 rounds counted (the machine is shared).
 */
#define _POSIX_C_SOURCE 200809L
#include "qc_train.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qc_kernels.h"
#include "qc_train_calib.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void qc_train_calib_key(const struct qc_config *cfg, struct qc_plan_calib *key)
{
    memset(key, 0, sizeof *key);
    qc_plan_calib_machine(key->machine, sizeof key->machine);
    qc_plan_calib_build(key->build, sizeof key->build);
    const int threads = cfg->cpu_threads > 0 ? (int)cfg->cpu_threads : omp_get_max_threads();
    snprintf(key->model, sizeof key->model,
             "%s %s; D %lld, %lld heads x %lld, %lld frequency bands; %s attention; %d threads",
             qc_train_device_str(cfg->device_kind), qc_precision_str(cfg->precision),
             (long long)cfg->hidden_dim, (long long)cfg->num_heads, (long long)cfg->head_dim,
             (long long)cfg->num_freq_bands,
             cfg->attention == QC_ATTENTION_FUSED ? "fused" : "unfused", threads);
    key->hidden_dim = cfg->hidden_dim;
    key->freq_bands = cfg->num_freq_bands;
    key->shared_r =
        cfg->attention == QC_ATTENTION_FUSED && cfg->device_kind != QC_CONFIG_DEVICE_CUDA;
}

struct probe_buf {
    float *x, *w, *b, *y, *dx, *dw, *db, *mean, *rstd, *g;
    int64_t N, D;
};

/* Seconds of one run of op k (the best of 3 rounds of repeats >= 30 ms each, after a warm run:
 * the machine may be shared, the best round is the closest to its own speed). */
static double time_op(const struct probe_buf *p, int k)
{
    const int64_t N = p->N, D = p->D;
    double best = 0;
    for (int round = -1; round < 3; round++) {
        int reps = 0;
        const double t0 = now_s();
        double t = 0;
        do {
            switch (k) {
            case 0:
                qc_linear_forward_cpu(p->y, p->x, D, p->w, p->b, N, D, D, false);
                break;
            case 1:
                qc_linear_backward_cpu(p->dx, D, p->dw, p->db, p->y, p->x, D, p->w, N, D, D, false);
                break;
            case 2:
                qc_layernorm_forward_cpu(p->y, p->mean, p->rstd, p->x, p->g, p->b, N, D);
                qc_layernorm_backward_cpu(p->dx, p->dw, p->db, p->y, p->x, p->mean, p->rstd, p->g,
                                          N, D, false);
                break;
            default:
                memcpy(p->dx, p->x, (size_t)(N * D) * sizeof(float));
                break;
            }
            reps++;
            t = now_s() - t0;
        } while (round >= 0 && t < 0.03);
        if (round >= 0 && (best == 0 || t / reps < best))
            best = t / reps;
    }
    return best;
}

static enum qc_status probe(void *user, struct qc_plan_calib *cal)
{
    (void)user;
    const int64_t D = cal->hidden_dim > 0 ? cal->hidden_dim : 128;
    const int64_t N = 2048;
    /* the copy moves 16 MiB: x and dx hold at least that many floats */
    const int64_t nx = N * D > ((int64_t)4 << 20) ? N * D : ((int64_t)4 << 20);
    struct probe_buf p = {.N = N, .D = D};
    p.x = calloc((size_t)nx, sizeof(float));
    p.dx = calloc((size_t)nx, sizeof(float));
    p.y = calloc((size_t)(N * D), sizeof(float));
    p.w = calloc((size_t)(D * D), sizeof(float));
    p.dw = calloc((size_t)(D * D), sizeof(float));
    p.b = calloc((size_t)D, sizeof(float));
    p.db = calloc((size_t)D, sizeof(float));
    p.g = calloc((size_t)D, sizeof(float));
    p.mean = calloc((size_t)N, sizeof(float));
    p.rstd = calloc((size_t)N, sizeof(float));
    enum qc_status st = QC_OK;
    if (!p.x || !p.dx || !p.y || !p.w || !p.dw || !p.b || !p.db || !p.g || !p.mean || !p.rstd)
        st = qc_errorf(QC_ERR_NOMEM, "plan calibration: probe buffers");
    if (st == QC_OK) {
        for (int64_t i = 0; i < nx; i++)
            p.x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (int64_t i = 0; i < D * D; i++)
            p.w[i] = (float)((i * 104729) % 1000) * 1e-4f - 0.05f;
        for (int64_t i = 0; i < D; i++)
            p.g[i] = 1.0f;
        const double nd = (double)N * (double)D;
        cal->gemm_fwd_flops = 2.0 * nd * (double)D / time_op(&p, 0);
        cal->gemm_bwd_flops = 4.0 * nd * (double)D / time_op(&p, 1);
        /* LayerNorm forward reads x, writes y; backward reads dout, x, writes dx: 5 x N x D */
        cal->mem_bps = 5.0 * 4.0 * nd / time_op(&p, 2);
        cal->copy_bps = 2.0 * 4.0 * (double)(N * D) / time_op(&p, 3);
    }
    free(p.x);
    free(p.dx);
    free(p.y);
    free(p.w);
    free(p.dw);
    free(p.b);
    free(p.db);
    free(p.g);
    free(p.mean);
    free(p.rstd);
    return st;
}

enum qc_status qc_train_calib_get(const struct qc_config *cfg, int64_t nparams,
                                  struct qc_plan_cost **out)
{
    *out = NULL;
    if (cfg->plan_calibration == QC_CALIBRATION_BUILTIN ||
        cfg->device_kind == QC_CONFIG_DEVICE_CUDA)
        return QC_OK; /* the built-in coefficients, or a GPU's (the host clock does not see it) */
    struct qc_plan_calib key;
    qc_train_calib_key(cfg, &key);
    key.nparams = nparams;
    return qc_plan_calib_get(&key, probe, NULL, out, NULL);
}

void qc_train_calib_refresh(const struct qc_config *cfg, const struct qc_plan_cost *run)
{
    if (cfg->plan_calibration == QC_CALIBRATION_BUILTIN ||
        cfg->device_kind == QC_CONFIG_DEVICE_CUDA)
        return;
    struct qc_plan_calib key;
    qc_train_calib_key(cfg, &key);
    key.nparams = qc_plan_cost_calib(run)->nparams;
    if (qc_plan_calib_refresh(run, &key) != QC_OK)
        qc_log(QC_LOG_WARN, "plan calibration: not refreshed from this run: %s", qc_error_last());
}
