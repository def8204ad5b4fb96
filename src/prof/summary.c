/*
 * summary.c — the summary of a profile (qc_profile.h): the recorded events aggregated by op,
 * block, GEMM shape and category, with the time attribution of qc_profile.h.
 *
 * Tables (each a hash of key string → totals):
 *   ops     key "name": calls, wall (attributed), thread time, bytes, FLOPs
 *   blocks  key "name|pass": calls, inclusive time
 *   gemms   key "name|IC|OC|threads|N bucket (power of two)": calls, time, FLOPs, N range
 * Per-step figures divide by the number of profiled steps.
 */
#include "qc_profile.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qc_prof.h"

struct agg {
    char key[200];
    const char *name; /* op or block name (recorder-owned) */
    int pass;
    int64_t calls;
    double wall;   /* s, attributed (ops) or inclusive (blocks, spans) */
    double thread; /* s, Σ durations */
    double bytes, flops;
    int64_t d[4];   /* gemms: N min, IC, OC, threads */
    int64_t n_max;  /* gemms: N max */
    bool top_level; /* gemms: dispatched by the main thread (all BLAS threads) */
};

struct table {
    struct agg *v; /* open addressing, cap slots, key[0] == 0 = empty */
    int64_t cap, n;
};

struct qc_profile_summary {
    struct qc_profile_peaks peaks;
    int64_t steps;
    double step_s;     /* Σ step spans */
    double phase_s[4]; /* forward, loss, backward, other phase names */
    double loader_s, optim_s, offload_s, offload_bytes;
    int64_t alloc_events, offload_calls, events, lost;
    double op_wall_s;               /* Σ attributed op time */
    double gemm_wall_s, gemm_flops; /* linear_* ops */
    struct table ops, blocks, gemms;
    double *child_wall; /* per top-level op id: Σ weighted nested durations */
    int64_t nid;
    bool nomem;
};

static uint64_t key_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The slot of key (created empty); NULL on allocation failure. */
static struct agg *table_get(struct table *t, const char *key)
{
    if (2 * (t->n + 1) > t->cap) {
        const int64_t cap = t->cap ? 2 * t->cap : 256;
        struct agg *v = calloc((size_t)cap, sizeof *v);
        if (!v)
            return NULL;
        for (int64_t i = 0; i < t->cap; i++) {
            if (!t->v[i].key[0])
                continue;
            int64_t j = (int64_t)(key_hash(t->v[i].key) % (uint64_t)cap);
            while (v[j].key[0])
                j = (j + 1) % cap;
            v[j] = t->v[i];
        }
        free(t->v);
        t->v = v;
        t->cap = cap;
    }
    int64_t j = (int64_t)(key_hash(key) % (uint64_t)t->cap);
    while (t->v[j].key[0] && strcmp(t->v[j].key, key) != 0)
        j = (j + 1) % t->cap;
    if (!t->v[j].key[0]) {
        snprintf(t->v[j].key, sizeof t->v[j].key, "%s", key);
        t->n++;
    }
    return &t->v[j];
}

static double dur_s(const struct qc_prof_event *e)
{
    return 1e-9 * (double)(e->t1 - e->t0);
}

static bool is_gemm(const char *name)
{
    return strcmp(name, "linear_forward") == 0 || strcmp(name, "linear_backward") == 0;
}

// ---- pass 1: the nested time of every top-level op ------------------------------------------

static void max_id(const struct qc_prof_event *e, void *ctx)
{
    int64_t *n = ctx;
    const int64_t id = e->id > e->parent ? e->id : e->parent;
    *n = id + 1 > *n ? id + 1 : *n;
}

static void add_child(const struct qc_prof_event *e, void *ctx)
{
    struct qc_profile_summary *s = ctx;
    if (e->cat == QC_PROF_CAT_OP && e->parent > 0 && e->parent < s->nid && !e->pending)
        s->child_wall[e->parent] += dur_s(e) * (double)e->weight;
}

// ---- pass 2: the tables ---------------------------------------------------------------------

static void add_op(struct qc_profile_summary *s, const struct qc_prof_event *e)
{
    double wall = e->parent ? dur_s(e) * (double)e->weight : dur_s(e);
    if (e->id > 0 && e->id < s->nid)
        wall -= s->child_wall[e->id];
    wall = wall > 0 ? wall : 0;
    struct agg *a = table_get(&s->ops, e->name);
    if (!a) {
        s->nomem = true;
        return;
    }
    a->name = e->name;
    a->calls++;
    a->wall += wall;
    a->thread += dur_s(e);
    a->bytes += e->bytes;
    a->flops += e->flops;
    s->op_wall_s += wall;
    if (!is_gemm(e->name))
        return;
    s->gemm_wall_s += wall;
    s->gemm_flops += e->flops;
    const bool top = e->parent == 0;
    const int64_t threads = top ? s->peaks.threads : 1;
    int64_t bucket = 1;
    while (bucket < e->d[0])
        bucket *= 2;
    char key[200];
    snprintf(key, sizeof key, "%s|%" PRId64 "|%" PRId64 "|%" PRId64 "|%" PRId64, e->name, e->d[1],
             e->d[2], threads, bucket);
    struct agg *g = table_get(&s->gemms, key);
    if (!g) {
        s->nomem = true;
        return;
    }
    if (g->calls == 0 || e->d[0] < g->d[0])
        g->d[0] = e->d[0];
    g->n_max = e->d[0] > g->n_max ? e->d[0] : g->n_max;
    g->name = e->name;
    g->d[1] = e->d[1];
    g->d[2] = e->d[2];
    g->d[3] = threads;
    g->top_level = top;
    g->calls++;
    g->wall += wall;
    g->thread += dur_s(e);
    g->flops += e->flops;
}

static void add_event(const struct qc_prof_event *e, void *ctx)
{
    struct qc_profile_summary *s = ctx;
    s->events++;
    if (e->pending)
        return;
    switch (e->cat) {
    case QC_PROF_CAT_OP:
        add_op(s, e);
        break;
    case QC_PROF_CAT_BLOCK: {
        char key[200];
        snprintf(key, sizeof key, "%s|%d", e->name, (int)e->pass);
        struct agg *a = table_get(&s->blocks, key);
        if (!a) {
            s->nomem = true;
            break;
        }
        a->name = e->name;
        a->pass = e->pass;
        a->calls++;
        a->wall += dur_s(e);
        break;
    }
    case QC_PROF_CAT_PHASE:
        if (strcmp(e->name, "step") == 0)
            s->step_s += dur_s(e);
        else if (strcmp(e->name, "forward") == 0)
            s->phase_s[0] += dur_s(e);
        else if (strcmp(e->name, "loss") == 0)
            s->phase_s[1] += dur_s(e);
        else if (strcmp(e->name, "backward") == 0)
            s->phase_s[2] += dur_s(e);
        else
            s->phase_s[3] += dur_s(e);
        break;
    case QC_PROF_CAT_LOADER:
        s->loader_s += dur_s(e);
        break;
    case QC_PROF_CAT_OFFLOAD:
        s->offload_s += dur_s(e);
        s->offload_bytes += e->bytes;
        s->offload_calls++;
        break;
    case QC_PROF_CAT_ALLOC:
        s->alloc_events++;
        break;
    case QC_PROF_CAT_OPTIM:
        s->optim_s += dur_s(e);
        break;
    default:
        break;
    }
}

enum qc_status qc_profile_summary_create(const struct qc_profile_peaks *peaks, int64_t steps,
                                         struct qc_profile_summary **out)
{
    struct qc_profile_summary *s = calloc(1, sizeof *s);
    if (!s)
        return qc_errorf(QC_ERR_NOMEM, "profile: summary");
    s->peaks = *peaks;
    s->steps = steps > 0 ? steps : 1;
    s->lost = qc_prof_lost();
    qc_prof_foreach(max_id, &s->nid);
    s->child_wall = calloc((size_t)(s->nid + 1), sizeof *s->child_wall);
    if (!s->child_wall) {
        const int64_t nid = s->nid;
        qc_profile_summary_destroy(s);
        return qc_errorf(QC_ERR_NOMEM, "profile: summary of %" PRId64 " ops", nid);
    }
    qc_prof_foreach(add_child, s);
    qc_prof_foreach(add_event, s);
    if (s->nomem) {
        qc_profile_summary_destroy(s);
        return qc_errorf(QC_ERR_NOMEM, "profile: summary tables");
    }
    *out = s;
    return QC_OK;
}

void qc_profile_summary_gemm(const struct qc_profile_summary *s, double *flops, double *wall_s)
{
    const double st = s->steps > 0 ? (double)s->steps : 1.0;
    *flops = s->gemm_flops / st;
    *wall_s = s->gemm_wall_s / st;
}

void qc_profile_summary_destroy(struct qc_profile_summary *s)
{
    if (!s)
        return;
    free(s->ops.v);
    free(s->blocks.v);
    free(s->gemms.v);
    free(s->child_wall);
    free(s);
}

// ---- output ---------------------------------------------------------------------------------

/* The filled slots of t sorted by wall time, descending; *n set. Caller frees. */
static struct agg **table_sorted(const struct table *t, int64_t *n)
{
    struct agg **v = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *v);
    *n = 0;
    if (!v)
        return NULL;
    for (int64_t i = 0; i < t->cap; i++)
        if (t->v[i].key[0])
            v[(*n)++] = &t->v[i];
    for (int64_t i = 1; i < *n; i++) /* insertion sort: tables hold hundreds of rows */
        for (int64_t j = i; j > 0 && v[j]->wall > v[j - 1]->wall; j--) {
            struct agg *x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return v;
}

static double gemm_peak(const struct qc_profile_summary *s, const struct agg *g)
{
    return g->top_level || s->peaks.device ? s->peaks.gemm_gflops_n : s->peaks.gemm_gflops_1;
}

static double pct(double a, double b)
{
    return b > 0 ? 100.0 * a / b : 0;
}

void qc_profile_summary_print(const struct qc_profile_summary *s, FILE *f, int top)
{
    const double st = (double)s->steps, step = s->step_s / st;
    fprintf(f, "profile: %" PRId64 " step(s), %.3f s per step; %" PRId64 " events%s\n", s->steps,
            step, s->events, s->lost ? " (some lost: out of memory)" : "");
    fprintf(f,
            "  phases per step: forward %.3f s, loss %.3f s, backward %.3f s, optimizer %.3f s, "
            "loader wait %.3f s\n",
            s->phase_s[0] / st, s->phase_s[1] / st, s->phase_s[2] / st, s->optim_s / st,
            s->loader_s / st);
    fprintf(f, "  inside ops %.3f s (%.1f %%), outside ops (host code) %.3f s\n", s->op_wall_s / st,
            pct(s->op_wall_s, s->step_s), (s->step_s - s->op_wall_s) / st);
    fprintf(f, "  GEMM (linear_*): %.3f s per step = %.1f %% of the step, %.1f GFLOP per step\n",
            s->gemm_wall_s / st, pct(s->gemm_wall_s, s->step_s), s->gemm_flops / st * 1e-9);
    if (s->peaks.device)
        fprintf(f, "  peaks: SGEMM %" PRId64 "^3 %.0f GFLOP/s (device); copy %.1f GB/s\n",
                s->peaks.gemm_n, s->peaks.gemm_gflops_n, s->peaks.copy_gbs);
    else
        fprintf(f,
                "  peaks: SGEMM %" PRId64 "^3 %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d; "
                "copy %.1f GB/s (read + write)\n",
                s->peaks.gemm_n, s->peaks.gemm_gflops_1, s->peaks.gemm_gflops_n, s->peaks.threads,
                s->peaks.copy_gbs);
    if (s->offload_calls)
        fprintf(f, "  offload: %" PRId64 " puts/gets, %.1f MB, %.3f s per step on the host\n",
                s->offload_calls, s->offload_bytes * 1e-6, s->offload_s / st);
    fprintf(f, "  allocator events: %" PRId64 " per step\n",
            (int64_t)((double)s->alloc_events / st));

    int64_t n = 0;
    struct agg **v = table_sorted(&s->ops, &n);
    if (v) {
        fprintf(f, "\ntop ops (wall per step, attributed; thread time counts every thread)\n");
        fprintf(f, "  %-28s %8s %9s %6s %9s %9s %9s\n", "op", "calls", "wall ms", "%step",
                "thread ms", "GFLOP/s", "GB/s");
        for (int64_t i = 0; i < n && i < top; i++) {
            const struct agg *a = v[i];
            fprintf(f, "  %-28s %8" PRId64 " %9.1f %6.1f %9.1f", a->name,
                    (int64_t)((double)a->calls / st), 1e3 * a->wall / st, pct(a->wall, s->step_s),
                    1e3 * a->thread / st);
            if (a->flops > 0 && a->thread > 0)
                fprintf(f, " %9.1f", a->flops / a->thread * 1e-9);
            else
                fprintf(f, " %9s", "-");
            if (a->bytes > 0 && a->thread > 0)
                fprintf(f, " %9.1f\n", a->bytes / a->thread * 1e-9);
            else
                fprintf(f, " %9s\n", "-");
        }
        free(v);
    }
    v = table_sorted(&s->blocks, &n);
    if (v) {
        fprintf(f, "\ntop blocks (inclusive wall per step)\n");
        for (int64_t i = 0; i < n && i < top; i++)
            fprintf(f, "  %-60s %-9s %6" PRId64 " calls %9.1f ms %6.1f %%\n", v[i]->name,
                    qc_prof_pass_str((enum qc_prof_pass)v[i]->pass),
                    (int64_t)((double)v[i]->calls / st), 1e3 * v[i]->wall / st,
                    pct(v[i]->wall, s->step_s));
        free(v);
    }
    v = table_sorted(&s->gemms, &n);
    if (v) {
        fprintf(f, "\nGEMM shapes (N×IC×OC; achieved = FLOPs / the op's own duration)\n");
        fprintf(f, "  %-16s %-13s %5s %5s %3s %7s %9s %9s %7s\n", "op", "N", "IC", "OC", "thr",
                "calls", "wall ms", "GFLOP/s", "%peak");
        for (int64_t i = 0; i < n && i < top; i++) {
            const struct agg *g = v[i];
            char nr[32];
            if (g->d[0] == g->n_max)
                snprintf(nr, sizeof nr, "%" PRId64, g->d[0]);
            else
                snprintf(nr, sizeof nr, "%" PRId64 "-%" PRId64, g->d[0], g->n_max);
            const double gf = g->thread > 0 ? g->flops / g->thread * 1e-9 : 0;
            fprintf(f,
                    "  %-16s %-13s %5" PRId64 " %5" PRId64 " %3" PRId64 " %7" PRId64
                    " %9.1f %9.1f %6.1f%%\n",
                    g->name, nr, g->d[1], g->d[2], g->d[3], (int64_t)((double)g->calls / st),
                    1e3 * g->wall / st, gf, pct(gf, gemm_peak(s, g)));
        }
        free(v);
    }
    v = table_sorted(&s->ops, &n);
    if (v) {
        fprintf(f, "\nmemory-bound ops (no FLOPs counted): GB/s against the copy rate %.1f GB/s\n",
                s->peaks.copy_gbs);
        int shown = 0;
        for (int64_t i = 0; i < n && shown < top; i++) {
            const struct agg *a = v[i];
            if (a->flops > 0 || a->bytes <= 0 || a->thread <= 0)
                continue;
            const double gbs = a->bytes / a->thread * 1e-9;
            fprintf(f, "  %-28s %9.1f ms %9.1f GB/s %6.1f %%\n", a->name, 1e3 * a->wall / st, gbs,
                    pct(gbs, s->peaks.copy_gbs));
            shown++;
        }
        free(v);
    }
}

cJSON *qc_profile_summary_json(const struct qc_profile_summary *s, int top)
{
    const double st = (double)s->steps;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "steps", (double)s->steps);
    cJSON_AddNumberToObject(o, "step_s", s->step_s / st);
    cJSON_AddNumberToObject(o, "forward_s", s->phase_s[0] / st);
    cJSON_AddNumberToObject(o, "loss_s", s->phase_s[1] / st);
    cJSON_AddNumberToObject(o, "backward_s", s->phase_s[2] / st);
    cJSON_AddNumberToObject(o, "optimizer_s", s->optim_s / st);
    cJSON_AddNumberToObject(o, "loader_wait_s", s->loader_s / st);
    cJSON_AddNumberToObject(o, "ops_s", s->op_wall_s / st);
    cJSON_AddNumberToObject(o, "gemm_s", s->gemm_wall_s / st);
    cJSON_AddNumberToObject(o, "gemm_share", s->step_s > 0 ? s->gemm_wall_s / s->step_s : 0);
    cJSON_AddNumberToObject(o, "gemm_flops", s->gemm_flops / st);
    cJSON_AddNumberToObject(o, "events", (double)s->events);
    cJSON *pk = cJSON_AddObjectToObject(o, "peaks");
    if (pk) {
        cJSON_AddBoolToObject(pk, "device", s->peaks.device);
        cJSON_AddNumberToObject(pk, "threads", s->peaks.threads);
        cJSON_AddNumberToObject(pk, "gemm_n", (double)s->peaks.gemm_n);
        cJSON_AddNumberToObject(pk, "sgemm_gflops_1", s->peaks.gemm_gflops_1);
        cJSON_AddNumberToObject(pk, "sgemm_gflops", s->peaks.gemm_gflops_n);
        cJSON_AddNumberToObject(pk, "copy_gbs", s->peaks.copy_gbs);
    }
    int64_t n = 0;
    struct agg **v = table_sorted(&s->ops, &n);
    cJSON *arr = cJSON_AddArrayToObject(o, "ops");
    for (int64_t i = 0; v && arr && i < n && i < top; i++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "op", v[i]->name);
        cJSON_AddNumberToObject(j, "calls", (double)v[i]->calls / st);
        cJSON_AddNumberToObject(j, "wall_s", v[i]->wall / st);
        cJSON_AddNumberToObject(j, "thread_s", v[i]->thread / st);
        cJSON_AddNumberToObject(j, "bytes", v[i]->bytes / st);
        cJSON_AddNumberToObject(j, "flops", v[i]->flops / st);
        cJSON_AddItemToArray(arr, j);
    }
    free(v);
    v = table_sorted(&s->blocks, &n);
    arr = cJSON_AddArrayToObject(o, "blocks");
    for (int64_t i = 0; v && arr && i < n && i < top; i++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "block", v[i]->name);
        cJSON_AddStringToObject(j, "pass", qc_prof_pass_str((enum qc_prof_pass)v[i]->pass));
        cJSON_AddNumberToObject(j, "calls", (double)v[i]->calls / st);
        cJSON_AddNumberToObject(j, "wall_s", v[i]->wall / st);
        cJSON_AddItemToArray(arr, j);
    }
    free(v);
    v = table_sorted(&s->gemms, &n);
    arr = cJSON_AddArrayToObject(o, "gemm_shapes");
    for (int64_t i = 0; v && arr && i < n && i < top; i++) {
        const struct agg *g = v[i];
        const double gf = g->thread > 0 ? g->flops / g->thread * 1e-9 : 0;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "op", g->name);
        cJSON_AddNumberToObject(j, "n_min", (double)g->d[0]);
        cJSON_AddNumberToObject(j, "n_max", (double)g->n_max);
        cJSON_AddNumberToObject(j, "ic", (double)g->d[1]);
        cJSON_AddNumberToObject(j, "oc", (double)g->d[2]);
        cJSON_AddNumberToObject(j, "threads", (double)g->d[3]);
        cJSON_AddNumberToObject(j, "calls", (double)g->calls / st);
        cJSON_AddNumberToObject(j, "wall_s", g->wall / st);
        cJSON_AddNumberToObject(j, "gflops", gf);
        cJSON_AddNumberToObject(j, "peak_fraction", gemm_peak(s, g) > 0 ? gf / gemm_peak(s, g) : 0);
        cJSON_AddItemToArray(arr, j);
    }
    free(v);
    return o;
}
