/*
 * cost.c — the planner's cost model (qc_plan.h): per block name, seconds per unit of work,
 * calibrated from measured steps; per kind fallbacks; JSON persistence.
 *
 * Model: t_fwd(b) = rf(b) · work(b), t_bwd(b) = rb(b) · work(b);
 * predicted step = step_factor · Σ_b (t_fwd + t_bwd) + glue_s. (Memory is not modelled here:
 * the program states every allocation, transients included.) rf(b) is the block's own
 * coefficient once measured (EMA, α = 0.3), else the mean of its kind's measured blocks, else
 * the built-in coefficient of its kind. On a TILED edge set (qc_plan_edge_mode) the blocks' times
 * are derived from the materialised ones (mode_time): the edge context computes no r, each
 * application adds the context's FE forward (forward) and FE forward + backward (backward); such
 * blocks are not folded into the coefficients, which keep pricing the materialised work.
 *
 * A roofline model (qc_plan_cost_create_roofline: a GPU the planner has no measurement of) gives
 * each block max(FLOPs / peak FLOP/s, bytes / memory bandwidth) plus its kernels' launches,
 * with FLOPs and bytes from the block's size drivers and the hidden size (roofline_time), and
 * the optimizer's memory-bound sweep as the glue: a lower bound, said so by
 * qc_plan_cost_source.
 */
#include "qc_plan.h"
#include "plan_internal.h"
#include "qc_plan_calib.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qc_file.h"

#define EMA 0.3

#define NCOEF 2 /* seconds per unit of work: forward, backward */

/* Built-in coefficients per kind (seconds per unit of work forward / backward): QCNet at AV2
 * size on the CPU backend of a 2-core x86-64 VM (one OpenMP thread), fused attention, measured
 * with the recorded step of tests/test_tape-style instrumentation (docs/BENCHMARKS.md,
 * "Memory"). */
static const double builtin[QC_PLAN_KIND_COUNT][NCOEF] = {
    /* fe    */ {2.0e-6, 4.0e-6},
    /* edges */ {1.0e-6, 2.0e-6},
    /* kv    */ {3.0e-7, 6.0e-7},
    /* attn  */ {1.5e-6, 4.0e-6},
    /* mlp   */ {1.0e-6, 2.0e-6},
    /* gru   */ {4.0e-8, 1.0e-7},
};

struct cost_block {
    char name[QC_PLAN_NAME_MAX];
    uint64_t hash; /* of name (name_hash): compared before the name */
    int kind;
    double c[NCOEF]; /* rf, rb */
    int64_t n;       /* measurements folded in */
};

struct qc_plan_cost {
    struct cost_block *b;
    int nb, cap;
    double kind[QC_PLAN_KIND_COUNT][NCOEF]; /* means of measured blocks, or built-in */
    bool kind_measured[QC_PLAN_KIND_COUNT];
    double step_factor; /* measured step / predicted block time (CUDA: the only calibration) */
    double glue_s;      /* step time outside the blocks (CPU, EMU) */
    int64_t steps;
    struct qc_plan_calib cal; /* where the figures come from (qc_plan_calib.h) */
    bool roofline;            /* times from roof (qc_plan_cost_create_roofline), not coefficients */
    struct qc_plan_roofline roof;
    /* after a warm-up update (qc_plan_cost_update_warmup): the model as it was before it, which
     * the next update restores before folding its own measurement; NULL otherwise */
    struct qc_plan_cost *settled;
};

double qc_plan_work(const struct qc_plan_block *b)
{
    switch (b->kind) {
    case QC_PLAN_FE:
    case QC_PLAN_MLP:
        return (double)b->rows;
    case QC_PLAN_GRU:
        return (double)b->rows * (double)(b->edges > 0 ? b->edges : 1);
    case QC_PLAN_EDGES:
    case QC_PLAN_KV:
    case QC_PLAN_ATTN:
        return (double)(b->rows + b->edges + b->srcs);
    case QC_PLAN_KIND_COUNT:
        break;
    }
    return 0.0;
}

enum qc_status qc_plan_cost_create(struct qc_plan_cost **out)
{
    struct qc_plan_cost *c = calloc(1, sizeof *c);
    if (!c)
        return qc_errorf(QC_ERR_NOMEM, "plan: cost model");
    memcpy(c->kind, builtin, sizeof c->kind);
    c->step_factor = 1.0;
    *out = c;
    return QC_OK;
}

void qc_plan_cost_destroy(struct qc_plan_cost *c)
{
    if (!c)
        return;
    qc_plan_cost_destroy(c->settled);
    free(c->b);
    free(c);
}

/* FNV-1a of a block name. */
static uint64_t name_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

static struct cost_block *find(const struct qc_plan_cost *c, const char *name)
{
    const uint64_t h = name_hash(name);
    for (int i = 0; i < c->nb; i++)
        if (c->b[i].hash == h && strcmp(c->b[i].name, name) == 0)
            return &c->b[i];
    return NULL;
}

static struct cost_block *find_or_add(struct qc_plan_cost *c, const char *name, int kind)
{
    struct cost_block *e = find(c, name);
    if (e)
        return e;
    if (c->nb == c->cap) {
        const int cap = c->cap ? 2 * c->cap : 128;
        struct cost_block *n = realloc(c->b, (size_t)cap * sizeof *n);
        if (!n)
            return NULL;
        c->b = n;
        c->cap = cap;
    }
    e = &c->b[c->nb++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->hash = name_hash(e->name);
    e->kind = kind;
    return e;
}

static double roofline_flops(const struct qc_plan_roofline *r, const struct qc_plan_block *k,
                             double *bytes);

/* The probe's time of block k (qc_plan_calib.h): its FLOPs (roofline_flops) at the measured
 * GEMM rate plus its bytes at the measured memory-bound rate, one after the other as the CPU
 * runs them. Backward: twice the FLOPs at the backward's GEMM rate, twice the bytes. 0 without
 * rates. */
static double probe_time(const struct qc_plan_cost *c, const struct qc_plan_block *k, int phase)
{
    const struct qc_plan_calib *cal = &c->cal;
    if (!(cal->gemm_fwd_flops > 0) || !(cal->gemm_bwd_flops > 0) || !(cal->mem_bps > 0) ||
        cal->hidden_dim < 1)
        return 0.0;
    const struct qc_plan_roofline r = {.hidden_dim = cal->hidden_dim,
                                       .freq_bands = cal->freq_bands};
    double bytes = 0;
    double flops = roofline_flops(&r, k, &bytes);
    if (cal->shared_r) { /* the fused path's KV context projects its sources only; each
                            attention tile projects its edges' k_r, v_r itself */
        const double D = (double)cal->hidden_dim, e = (double)k->edges;
        if (k->kind == QC_PLAN_KV) {
            flops -= e * 4.0 * D * D;
            bytes -= 3.0 * 4.0 * 2.0 * e * D;
        } else if (k->kind == QC_PLAN_ATTN) {
            flops += e * 4.0 * D * D;
            bytes += 3.0 * 4.0 * 2.0 * e * D;
        }
    }
    return phase ? 2.0 * flops / cal->gemm_bwd_flops + 2.0 * bytes / cal->mem_bps
                 : flops / cal->gemm_fwd_flops + bytes / cal->mem_bps;
}

/* Seconds of block b's phase j before the step factor: its own coefficient, its kind's mean of
 * measured blocks, the probe's time, or the built-in coefficient. */
static double block_time(const struct qc_plan_cost *c, const struct qc_plan_block *b, int j)
{
    const struct cost_block *e = find(c, b->name);
    if (e && e->n > 0)
        return e->c[j] * qc_plan_work(b);
    if (!c->kind_measured[b->kind]) {
        const double t = probe_time(c, b, j);
        if (t > 0)
            return t;
    }
    return c->kind[b->kind][j] * qc_plan_work(b);
}

enum qc_status qc_plan_cost_create_roofline(const struct qc_plan_roofline *r,
                                            struct qc_plan_cost **out)
{
    if (!(r->flops > 0) || !(r->mem_bps > 0) || r->hidden_dim < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "plan: a roofline needs the FLOP/s, the memory bandwidth and the "
                         "hidden size (got %g FLOP/s, %g B/s, D %lld)",
                         r->flops, r->mem_bps, (long long)r->hidden_dim);
    QC_TRY(qc_plan_cost_create(out));
    (*out)->roofline = true;
    (*out)->roof = *r;
    return QC_OK;
}

bool qc_plan_cost_is_roofline(const struct qc_plan_cost *c)
{
    return c->roofline;
}

/* The roofline time of block k (cost.c's module comment; README.md "The cost model"): its
 * FLOPs over the peak FLOP/s or its bytes over the memory bandwidth, whichever is longer, plus
 * its kernels' launch latency. Backward: twice the FLOPs and bytes, twice the launches. */
static double roofline_flops(const struct qc_plan_roofline *r, const struct qc_plan_block *k,
                             double *bytes)
{
    const double D = (double)r->hidden_dim, F = (double)(r->freq_bands > 0 ? r->freq_bands : 1);
    const double rows = (double)k->rows, edges = (double)k->edges, srcs = (double)k->srcs;
    /* a Fourier embedding of one row: 3 inputs x (Linear(2F+1, D) + Linear(D, D)), the sum's
     * Linear(D, D) */
    const double fe_row = 3.0 * (2.0 * (2.0 * F + 1.0) * D + 2.0 * D * D) + 2.0 * D * D;
    double flops = 0, elems = 0;
    switch (k->kind) {
    case QC_PLAN_FE:
        flops = rows * fe_row;
        elems = rows * D;
        break;
    case QC_PLAN_EDGES:
        flops = (edges > 0 ? edges : rows) * fe_row;
        elems = (edges > 0 ? edges : rows) * D;
        break;
    case QC_PLAN_KV: /* k, v of the sources; k_r, v_r of the edges */
        flops = (srcs + edges) * 4.0 * D * D;
        elems = (srcs + 2.0 * edges) * D;
        break;
    case QC_PLAN_ATTN: /* q, gate, out, the 4D feed-forward per row; scores and sums per edge */
        flops = rows * 24.0 * D * D + edges * 8.0 * D + srcs * 4.0 * D * D;
        elems = (rows * 6.0 + edges * 2.0 + srcs) * D;
        break;
    case QC_PLAN_MLP:
        flops = rows * 4.0 * D * D;
        elems = rows * 2.0 * D;
        break;
    case QC_PLAN_GRU: /* edges: the steps; 3 gates x 2 GEMMs of D x D per step */
        flops = rows * (edges > 0 ? edges : 1.0) * 12.0 * D * D;
        elems = rows * (edges > 0 ? edges : 1.0) * 4.0 * D;
        break;
    case QC_PLAN_KIND_COUNT:
        break;
    }
    *bytes = 3.0 * 4.0 * elems; /* read, written, read again: fp32 */
    return flops;
}

static double roofline_time(const struct qc_plan_roofline *r, const struct qc_plan_block *k,
                            int phase)
{
    double bytes = 0;
    const double flops = roofline_flops(r, k, &bytes);
    const double x = phase ? 2.0 : 1.0;
    const double t = fmax(x * flops / r->flops, x * bytes / r->mem_bps);
    return t + x * QC_PLAN_ROOFLINE_LAUNCHES * QC_PLAN_ROOFLINE_LAUNCH_S;
}

/* Seconds of block k's phase before the step factor, its edge set materialised. */
static double raw_time(const struct qc_plan_cost *c, const struct qc_plan_block *k, int phase)
{
    return c->roofline ? roofline_time(&c->roof, k, phase) : block_time(c, k, phase ? 1 : 0);
}

/* The same with the tiled mode's work (qc_plan_cost_time's contract): an edge context of a
 * TILED set computes no r; an application on one runs the context's FE forward in its forward
 * and the FE forward + backward in its backward. */
static double mode_time(const struct qc_plan_cost *c, const struct qc_plan_program *p,
                        const struct qc_plan_block *k, int phase)
{
    if (k->edge_mode != QC_PLAN_EDGE_TILED)
        return raw_time(c, k, phase);
    if (k->kind == QC_PLAN_EDGES)
        return 0.0;
    double t = raw_time(c, k, phase);
    if (k->kind == QC_PLAN_ATTN && k->edges_block >= 0) {
        const struct qc_plan_block *e = &p->blocks[k->edges_block];
        t += raw_time(c, e, 0) + (phase ? raw_time(c, e, 1) : 0.0);
    }
    return t;
}

double qc_plan_cost_time(const struct qc_plan_cost *c, const struct qc_plan_program *p, int32_t b,
                         int phase)
{
    return c->step_factor * mode_time(c, p, &p->blocks[b], phase);
}

double qc_plan_cost_time_materialised(const struct qc_plan_cost *c, const struct qc_plan_program *p,
                                      int32_t b, int phase)
{
    return c->step_factor * raw_time(c, &p->blocks[b], phase);
}

static void fold(double *x, double v, int64_t n)
{
    *x = n == 0 ? v : (1.0 - EMA) * *x + EMA * v;
}

/* c as it was before its warm-up update (c->settled), keeping where its figures come from. */
static void restore_settled(struct qc_plan_cost *c)
{
    struct qc_plan_cost *s = c->settled;
    const struct qc_plan_calib cal = c->cal;
    free(c->b);
    *c = *s; /* s->settled is NULL; s->b is c's now */
    c->cal = cal;
    free(s);
}

void qc_plan_cost_update(struct qc_plan_cost *c, const struct qc_plan_program *p,
                         const struct qc_plan_measure *m, double step_s, bool per_block)
{
    if (c->settled)
        restore_settled(c);
    double blocks_s = 0.0, predicted = 0.0;
    if (c->roofline) /* a roofline calibrates its step factor only */
        per_block = false;
    for (int32_t b = 0; b < p->nblocks; b++) {
        const struct qc_plan_block *k = &p->blocks[b];
        const double w = qc_plan_work(k);
        /* a tiled set's blocks measured other work than their coefficients price */
        if (per_block && w > 0 && m[b].t_fwd > 0 && k->edge_mode != QC_PLAN_EDGE_TILED) {
            struct cost_block *e = find_or_add(c, k->name, k->kind);
            if (e) {
                const double v[NCOEF] = {m[b].t_fwd / w, m[b].t_bwd / w};
                for (int j = 0; j < NCOEF; j++)
                    fold(&e->c[j], v[j], e->n);
                e->n++;
            }
        }
        blocks_s += m[b].t_fwd + m[b].t_bwd;
        predicted += mode_time(c, p, k, 0) + mode_time(c, p, k, 1);
    }
    /* the kinds' means over their measured blocks */
    for (int kd = 0; kd < QC_PLAN_KIND_COUNT; kd++) {
        double sum[NCOEF] = {0};
        int n = 0;
        for (int i = 0; i < c->nb; i++) {
            if (c->b[i].kind != kd || c->b[i].n == 0)
                continue;
            for (int j = 0; j < NCOEF; j++)
                sum[j] += c->b[i].c[j];
            n++;
        }
        if (n > 0) {
            for (int j = 0; j < NCOEF; j++)
                c->kind[kd][j] = sum[j] / n;
            c->kind_measured[kd] = true;
        }
    }
    if (per_block) {
        fold(&c->glue_s, step_s > blocks_s ? step_s - blocks_s : 0.0, c->steps);
        c->step_factor = 1.0;
    } else if (predicted > 0) {
        fold(&c->step_factor, step_s / predicted, c->steps);
    }
    c->steps++;
}

enum qc_status qc_plan_cost_update_warmup(struct qc_plan_cost *c, const struct qc_plan_program *p,
                                          const struct qc_plan_measure *m, double step_s,
                                          bool per_block)
{
    if (c->settled)
        restore_settled(c);
    struct qc_plan_cost *s = NULL;
    QC_TRY(qc_plan_cost_clone(c, &s));
    qc_plan_cost_update(c, p, m, step_s, per_block);
    c->settled = s;
    return QC_OK;
}

int64_t qc_plan_cost_steps(const struct qc_plan_cost *c)
{
    return c->steps;
}

const struct qc_plan_calib *qc_plan_cost_calib(const struct qc_plan_cost *c)
{
    return &c->cal;
}

void qc_plan_cost_set_calib(struct qc_plan_cost *c, const struct qc_plan_calib *cal)
{
    c->cal = *cal;
}

enum qc_status qc_plan_cost_clone(const struct qc_plan_cost *src, struct qc_plan_cost **out)
{
    struct qc_plan_cost *c = malloc(sizeof *c);
    struct cost_block *b = src->nb > 0 ? malloc((size_t)src->nb * sizeof *b) : NULL;
    if (!c || (src->nb > 0 && !b)) {
        free(c);
        free(b);
        return qc_errorf(QC_ERR_NOMEM, "plan: cost model copy");
    }
    *c = *src;
    if (b)
        memcpy(b, src->b, (size_t)src->nb * sizeof *b);
    c->b = b;
    c->cap = src->nb;
    c->settled = NULL;
    if (src->settled && qc_plan_cost_clone(src->settled, &c->settled) != QC_OK) {
        qc_plan_cost_destroy(c);
        return QC_ERR_NOMEM;
    }
    *out = c;
    return QC_OK;
}

const char *qc_plan_cost_source(const struct qc_plan_cost *c, char *buf, size_t n)
{
    if (c->roofline)
        snprintf(buf, n,
                 "a roofline of hw.tflops %.4g TFLOP/s and hw.mem_gbps %.4g GB/s (no GPU "
                 "calibration yet: a lower bound)",
                 c->roof.flops / 1e12, c->roof.mem_bps / 1e9);
    else if (c->cal.source == QC_PLAN_CALIB_RUN)
        snprintf(buf, n,
                 "this machine's calibration: a training run's per-block times (%lld steps)",
                 (long long)c->steps);
    else if (c->cal.source == QC_PLAN_CALIB_PROBE)
        snprintf(buf, n,
                 "this machine's calibration: probed GEMM %.3g / %.3g GFLOP/s (forward / "
                 "backward), memory-bound ops %.3g GB/s",
                 c->cal.gemm_fwd_flops / 1e9, c->cal.gemm_bwd_flops / 1e9, c->cal.mem_bps / 1e9);
    else if (c->steps == 0)
        snprintf(buf, n, "built-in coefficients (CPU backend, AV2 size)");
    else
        snprintf(buf, n, "calibrated over %lld steps", (long long)c->steps);
    return buf;
}

double plan_cost_glue(const struct qc_plan_cost *c)
{
    if (c->roofline) /* AdamW: parameters, gradients and both moments read, three written */
        return c->step_factor * 28.0 * (double)c->roof.nparams / c->roof.mem_bps;
    if (c->steps == 0 && c->cal.mem_bps > 0) /* probed, no step measured: AdamW's sweep */
        return 28.0 * (double)c->cal.nparams / c->cal.mem_bps;
    return c->glue_s;
}

// ---- persistence --------------------------------------------------------------------------

static const char *const kind_key[QC_PLAN_KIND_COUNT] = {"fe", "edges", "kv", "attn", "mlp", "gru"};
static const char *const coef_key[NCOEF] = {"fwd_s", "bwd_s"};
/* Version 2: the time coefficients only (version 1 also held transient-memory coefficients,
 * which the planner no longer uses: the program states the transients). */
#define COST_VERSION 2

enum qc_status qc_plan_cost_save(const struct qc_plan_cost *c, const char *path)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *kinds = cJSON_CreateObject(), *blocks = cJSON_CreateArray();
    if (!root || !kinds || !blocks) {
        cJSON_Delete(root);
        cJSON_Delete(kinds);
        cJSON_Delete(blocks);
        return qc_errorf(QC_ERR_NOMEM, "plan cost %s: out of memory", path);
    }
    cJSON_AddStringToObject(root, "format", "qctrain-plan-cost");
    cJSON_AddNumberToObject(root, "version", COST_VERSION);
    cJSON_AddNumberToObject(root, "steps", (double)c->steps);
    cJSON_AddNumberToObject(root, "step_factor", c->step_factor);
    cJSON_AddNumberToObject(root, "glue_s", c->glue_s);
    for (int k = 0; k < QC_PLAN_KIND_COUNT; k++) {
        cJSON *o = cJSON_CreateObject();
        for (int j = 0; j < NCOEF; j++)
            cJSON_AddNumberToObject(o, coef_key[j], c->kind[k][j]);
        cJSON_AddBoolToObject(o, "measured", c->kind_measured[k]);
        cJSON_AddItemToObject(kinds, kind_key[k], o);
    }
    cJSON_AddItemToObject(root, "kinds", kinds);
    for (int i = 0; i < c->nb; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", c->b[i].name);
        cJSON_AddStringToObject(o, "kind", kind_key[c->b[i].kind]);
        for (int j = 0; j < NCOEF; j++)
            cJSON_AddNumberToObject(o, coef_key[j], c->b[i].c[j]);
        cJSON_AddNumberToObject(o, "samples", (double)c->b[i].n);
        cJSON_AddItemToArray(blocks, o);
    }
    cJSON_AddItemToObject(root, "blocks", blocks);
    if (c->cal.source != QC_PLAN_CALIB_BUILTIN) {
        const struct qc_plan_calib *k = &c->cal;
        cJSON *o = cJSON_AddObjectToObject(root, "calibration");
        if (o) {
            cJSON_AddStringToObject(o, "source", qc_plan_calib_source_str(k->source));
            cJSON_AddNumberToObject(o, "date", (double)k->date);
            cJSON_AddNumberToObject(o, "probe_date", (double)k->probe_date);
            cJSON_AddNumberToObject(o, "gemm_fwd_flops", k->gemm_fwd_flops);
            cJSON_AddNumberToObject(o, "gemm_bwd_flops", k->gemm_bwd_flops);
            cJSON_AddNumberToObject(o, "mem_bps", k->mem_bps);
            cJSON_AddNumberToObject(o, "copy_bps", k->copy_bps);
            cJSON_AddNumberToObject(o, "probe_s", k->probe_s);
            cJSON_AddNumberToObject(o, "hidden_dim", (double)k->hidden_dim);
            cJSON_AddNumberToObject(o, "freq_bands", (double)k->freq_bands);
            cJSON_AddNumberToObject(o, "nparams", (double)k->nparams);
            cJSON_AddBoolToObject(o, "shared_r", k->shared_r);
            cJSON_AddStringToObject(o, "machine", k->machine);
            cJSON_AddStringToObject(o, "build", k->build);
            cJSON_AddStringToObject(o, "model", k->model);
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return qc_errorf(QC_ERR_NOMEM, "plan cost %s: out of memory", path);
    /* whole or not at all (a cost model is also read by qctrain plan --cost; JSON numbers
     * through cJSON's printer, non-finite ones as null: qc_json.h) */
    const struct qc_file_part part = {text, strlen(text)};
    const enum qc_status st = qc_file_write_atomic(path, &part, 1, "plan cost");
    cJSON_free(text);
    return st;
}

static bool num(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return false;
    *out = v->valuedouble;
    return true;
}

enum qc_status qc_plan_cost_load(struct qc_plan_cost *c, const char *path)
{
    qc_plan_cost_destroy(c->settled); /* a load replaces a pending warm-up */
    c->settled = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return qc_errorf(QC_ERR_IO, "plan cost %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *n = realloc(text, cap);
            if (!n) {
                free(text);
                fclose(f);
                return qc_errorf(QC_ERR_NOMEM, "plan cost %s: out of memory", path);
            }
            text = n;
        }
        const size_t r = fread(text + len, 1, 4096, f);
        len += r;
        if (r < 4096)
            break;
    }
    fclose(f);
    text[len] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    enum qc_status st = QC_OK;
    const cJSON *fmt = root ? cJSON_GetObjectItemCaseSensitive(root, "format") : NULL;
    double steps = 0, factor = 1, glue = 0;
    if (!root || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "qctrain-plan-cost") != 0) {
        st = qc_errorf(QC_ERR_INVALID, "plan cost %s: not a qctrain plan cost file", path);
        goto out;
    }
    double version = 0;
    if (!num(root, "version", &version) || version != COST_VERSION) {
        st = qc_errorf(QC_ERR_INVALID,
                       "plan cost %s: version %g, this qctrain reads version %d (an older "
                       "qctrain's file: delete it, the next training run writes a new one)",
                       path, version, COST_VERSION);
        goto out;
    }
    if (!num(root, "steps", &steps) || !num(root, "step_factor", &factor) ||
        !num(root, "glue_s", &glue)) {
        st = qc_errorf(QC_ERR_INVALID,
                       "plan cost %s: steps, step_factor or glue_s missing or "
                       "negative",
                       path);
        goto out;
    }
    const cJSON *kinds = cJSON_GetObjectItemCaseSensitive(root, "kinds");
    for (int k = 0; k < QC_PLAN_KIND_COUNT; k++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(kinds, kind_key[k]);
        for (int j = 0; j < NCOEF && o; j++)
            if (!num(o, coef_key[j], &c->kind[k][j])) {
                st = qc_errorf(QC_ERR_INVALID, "plan cost %s: kinds.%s.%s is not a number >= 0",
                               path, kind_key[k], coef_key[j]);
                goto out;
            }
        const cJSON *m = o ? cJSON_GetObjectItemCaseSensitive(o, "measured") : NULL;
        c->kind_measured[k] = cJSON_IsTrue(m);
    }
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(root, "blocks");
    const cJSON *o;
    cJSON_ArrayForEach(o, blocks)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
        int kd = -1;
        for (int k = 0; cJSON_IsString(kind) && k < QC_PLAN_KIND_COUNT; k++)
            if (strcmp(kind->valuestring, kind_key[k]) == 0)
                kd = k;
        double v[NCOEF], n = 0;
        bool ok = cJSON_IsString(name) && kd >= 0 && num(o, "samples", &n);
        for (int j = 0; j < NCOEF && ok; j++)
            ok = num(o, coef_key[j], &v[j]);
        if (!ok) {
            st = qc_errorf(QC_ERR_INVALID,
                           "plan cost %s: a block entry without name, kind, "
                           "samples or coefficients",
                           path);
            goto out;
        }
        struct cost_block *e = find_or_add(c, name->valuestring, kd);
        if (!e) {
            st = qc_errorf(QC_ERR_NOMEM, "plan cost %s: out of memory", path);
            goto out;
        }
        memcpy(e->c, v, sizeof v);
        e->n = (int64_t)n;
    }
    const cJSON *cal = cJSON_GetObjectItemCaseSensitive(root, "calibration");
    if (cal) { /* optional: a cost model of this machine (qc_plan_calib.h) */
        struct qc_plan_calib k = {0};
        const cJSON *src = cJSON_GetObjectItemCaseSensitive(cal, "source");
        const char *sv = cJSON_GetStringValue(src);
        double v[10] = {0};
        static const char *const nk[10] = {
            "date",     "probe_date", "gemm_fwd_flops", "gemm_bwd_flops", "mem_bps",
            "copy_bps", "probe_s",    "hidden_dim",     "freq_bands",     "nparams"};
        bool ok = sv && (strcmp(sv, "probe") == 0 || strcmp(sv, "run") == 0);
        for (int i = 0; i < 10 && ok; i++)
            ok = num(cal, nk[i], &v[i]);
        const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cal, "machine"));
        const char *b = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cal, "build"));
        const char *md = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cal, "model"));
        if (!ok || !m || !b || !md) {
            st = qc_errorf(QC_ERR_INVALID,
                           "plan cost %s: its calibration record lacks the source (probe or "
                           "run), a rate, the shape or the keys",
                           path);
            goto out;
        }
        k.source = strcmp(sv, "probe") == 0 ? QC_PLAN_CALIB_PROBE : QC_PLAN_CALIB_RUN;
        k.date = (int64_t)v[0];
        k.probe_date = (int64_t)v[1];
        k.gemm_fwd_flops = v[2];
        k.gemm_bwd_flops = v[3];
        k.mem_bps = v[4];
        k.copy_bps = v[5];
        k.probe_s = v[6];
        k.hidden_dim = (int64_t)v[7];
        k.freq_bands = (int64_t)v[8];
        k.nparams = (int64_t)v[9];
        k.shared_r = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cal, "shared_r"));
        snprintf(k.machine, sizeof k.machine, "%s", m);
        snprintf(k.build, sizeof k.build, "%s", b);
        snprintf(k.model, sizeof k.model, "%s", md);
        c->cal = k;
    }
    c->steps = (int64_t)steps;
    c->step_factor = factor > 0 ? factor : 1.0;
    c->glue_s = glue;
out:
    cJSON_Delete(root);
    return st;
}

/* Here, not in calibrate.c: the cost model's JSON names its calibration's source, and
 * calibrate.c calls the cost model (files of a folder call one way: test_file_cycles). */
const char *qc_plan_calib_source_str(enum qc_plan_calib_source s)
{
    switch (s) {
    case QC_PLAN_CALIB_PROBE:
        return "probe";
    case QC_PLAN_CALIB_RUN:
        return "run";
    case QC_PLAN_CALIB_BUILTIN:
        break;
    }
    return "builtin";
}
