/*
 * settings.c — the keys tune changes (struct qc_tune_settings), the search space over them, and
 * the preset a search writes: inherits the base, sets only the keys that differ.
 */
#include "tune_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)

void qc_tune_settings_of(const struct qc_config *cfg, struct qc_tune_settings *s)
{
    memset(s, 0, sizeof *s);
    s->batch_size = cfg->batch_size;
    s->grad_accum = cfg->grad_accum;
    s->margin = cfg->plan_margin;
    s->policy = cfg->plan_policy;
    s->prefetch_window = cfg->offload_prefetch_window;
    s->attention = cfg->attention;
    s->precision = cfg->precision;
    s->loader_threads = cfg->loader_threads;
    s->cpu_threads = cfg->cpu_threads;
    s->queue_depth = cfg->offload_queue_depth;
    s->block_size = cfg->offload_block_size;
}

void qc_tune_settings_apply(const struct qc_tune_settings *s, struct qc_config *cfg)
{
    cfg->batch_size = s->batch_size;
    cfg->grad_accum = s->grad_accum;
    cfg->plan_margin = s->margin;
    cfg->plan_policy = s->policy;
    cfg->offload_prefetch_window = s->prefetch_window;
    cfg->attention = s->attention;
    cfg->precision = s->precision;
    cfg->loader_threads = s->loader_threads;
    cfg->cpu_threads = s->cpu_threads;
    cfg->offload_queue_depth = s->queue_depth;
    cfg->offload_block_size = s->block_size;
}

/* Appends v to vals (n of them) unless present. */
static void add_u64(uint64_t *vals, int *n, uint64_t v)
{
    for (int i = 0; i < *n; i++)
        if (vals[i] == v)
            return;
    vals[(*n)++] = v;
}

static void add_f64(double *vals, int *n, double v)
{
    for (int i = 0; i < *n; i++)
        if (vals[i] == v)
            return;
    vals[(*n)++] = v;
}

enum qc_status tune_space(const struct qc_config *cfg, int64_t G, int64_t ranks,
                          bool allow_precision, struct qc_tune_candidate **out, int64_t *n)
{
    if (G < 1 || ranks < 1 || G % ranks != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "tune: a global batch of %lld scenes does not split over %lld ranks",
                         (long long)G, (long long)ranks);
    const int64_t per_rank = G / ranks;
    /* the base's value of each key first: its ties win */
    double margins[4];
    int nm = 0;
    add_f64(margins, &nm, cfg->plan_margin);
    add_f64(margins, &nm, 0.02);
    add_f64(margins, &nm, 0.05);
    add_f64(margins, &nm, 0.10);
    uint64_t windows[4];
    int nw = 0;
    add_u64(windows, &nw, cfg->offload_prefetch_window);
    add_u64(windows, &nw, 64 * MIB);
    add_u64(windows, &nw, 256 * MIB);
    add_u64(windows, &nw, 1024 * MIB);
    uint64_t policies[4];
    int np = 0;
    add_u64(policies, &np, (uint64_t)cfg->plan_policy);
    for (uint64_t v = QC_PLAN_AUTO; v <= QC_PLAN_RECOMPUTE; v++)
        add_u64(policies, &np, v);
    const enum qc_attention_impl att[2] = {cfg->attention, cfg->attention == QC_ATTENTION_FUSED
                                                               ? QC_ATTENTION_UNFUSED
                                                               : QC_ATTENTION_FUSED};
    uint64_t precs[QC_PREC_COUNT];
    int nprec = 0;
    add_u64(precs, &nprec, (uint64_t)cfg->precision);
    for (uint64_t v = 0; allow_precision && v < QC_PREC_COUNT; v++)
        add_u64(precs, &nprec, v);
    int64_t cap = 0;
    for (int64_t b = 1; b <= per_rank; b++)
        cap += per_rank % b == 0;
    cap *= 2 * nprec * np * nm * nw;
    struct qc_tune_candidate *c = calloc((size_t)cap, sizeof *c);
    if (!c)
        return qc_errorf(QC_ERR_NOMEM, "tune: %lld candidates", (long long)cap);
    int64_t k = 0;
    for (int q = 0; q < nprec; q++)
        for (int a = 0; a < 2; a++)
            for (int64_t b = per_rank; b >= 1; b--) {
                if (per_rank % b != 0)
                    continue;
                for (int p = 0; p < np; p++)
                    for (int m = 0; m < nm; m++)
                        for (int w = 0; w < nw; w++) {
                            const enum qc_plan_policy pol = (enum qc_plan_policy)policies[p];
                            /* the window matters only where stashes may be offloaded */
                            if (w > 0 && (pol == QC_PLAN_KEEP || pol == QC_PLAN_RECOMPUTE))
                                continue;
                            struct qc_tune_candidate *x = &c[k++];
                            qc_tune_settings_of(cfg, &x->set);
                            x->set.attention = att[a];
                            x->set.batch_size = b;
                            x->set.grad_accum = per_rank / b;
                            x->set.policy = pol;
                            x->set.margin = margins[m];
                            x->set.prefetch_window = windows[w];
                            x->set.precision = (int)precs[q];
                        }
            }
    *out = c;
    *n = k;
    return QC_OK;
}

/* Option values that differ between a and b. */
static bool differs(const struct qc_config *a, const struct qc_config *b,
                    const struct qc_config_option *o)
{
    return memcmp((const char *)a + o->offset, (const char *)b + o->offset, o->size) != 0;
}

int qc_tune_preset_keys(const struct qc_config *base, const struct qc_config *tuned,
                        const char **keys, int max)
{
    int n = 0;
    for (int i = 0; i < qc_config_option_count(); i++) {
        const struct qc_config_option *o = qc_config_option_at(i);
        if (o->type == QC_CONFIG_STRING) {
            if (strcmp((const char *)base + o->offset, (const char *)tuned + o->offset) == 0)
                continue;
        } else if (!differs(base, tuned, o)) {
            continue;
        }
        if (n < max && keys)
            keys[n] = o->key;
        n++;
    }
    return n;
}

enum qc_status qc_tune_preset_json(const struct qc_config *base, const char *base_name,
                                   const struct qc_config *tuned, const char *description,
                                   char **out)
{
    cJSON *root = cJSON_CreateObject();
    if (!root || !cJSON_AddStringToObject(root, "description", description) ||
        !cJSON_AddStringToObject(root, "inherits", base_name)) {
        cJSON_Delete(root);
        return qc_errorf(QC_ERR_NOMEM, "tune: out of memory");
    }
    const char *keys[256];
    const int nk = qc_tune_preset_keys(base, tuned, keys, 256);
    bool ok = nk <= 256;
    for (int i = 0; ok && i < nk; i++) {
        const struct qc_config_option *o = qc_config_option_find(keys[i]);
        const void *v = (const char *)tuned + o->offset;
        char text[QC_CONFIG_STR_MAX + 32];
        switch (o->type) {
        case QC_CONFIG_INT:
            ok = cJSON_AddNumberToObject(root, o->key, (double)*(const int64_t *)v) != NULL;
            break;
        case QC_CONFIG_FLOAT:
            ok = cJSON_AddNumberToObject(root, o->key, *(const double *)v) != NULL;
            break;
        case QC_CONFIG_BOOL:
            ok = cJSON_AddBoolToObject(root, o->key, *(const bool *)v) != NULL;
            break;
        case QC_CONFIG_SIZE:
            ok = cJSON_AddNumberToObject(root, o->key, (double)*(const uint64_t *)v) != NULL;
            break;
        default: /* strings and choices: as text */
            qc_config_format_value(tuned, o, text, sizeof text);
            ok = cJSON_AddStringToObject(root, o->key, text) != NULL;
            break;
        }
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    char *copy = text ? strdup(text) : NULL; /* the caller frees with free() */
    cJSON_free(text);
    if (!copy)
        return qc_errorf(QC_ERR_NOMEM, "tune: out of memory");
    *out = copy;
    return QC_OK;
}
