/*
 * predict.c — predictions of the search (README.md "Predict"): the planner sessions, the scenes
 * weighed for the heavy tail, and each candidate's heavy-tail peak and typical step time.
 */
#include "tune_internal.h"

#include <stdlib.h>
#include <string.h>

#include "qc_plan.h"
#include "qc_train.h"
#include "qc_train_calib.h"

#define MIB ((uint64_t)1 << 20)

struct weighed {
    int64_t scene;
    uint64_t bytes;
};

static int heavier_first(const void *a, const void *b)
{
    const struct weighed *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->scene < y->scene ? -1 : x->scene > y->scene;
}

/* The session of attention a and precision q (created on first use). */
static enum qc_status session(struct tune_predictor *p, enum qc_attention_impl a, int q,
                              struct qc_train_planner **out)
{
    QC_ASSERT((unsigned)a < 2 && (unsigned)q < QC_PREC_COUNT,
              "tune: attention %d, precision %d out of range", (int)a, q);
    if (!p->session[a][q]) {
        struct qc_config c = p->cfg;
        c.attention = a;
        c.precision = q;
        QC_TRY(qc_train_planner_create(&c, p->data, p->ndata, NULL, &p->session[a][q]));
        /* this machine's calibration of the session's model (plan.calibration) */
        struct qc_train_fixed fx;
        qc_train_planner_fixed(p->session[a][q], &fx);
        QC_TRY(qc_train_calib_get(&c, (int64_t)(fx.params / sizeof(float)), &p->calib[a][q]));
        if (p->calib[a][q])
            qc_train_planner_use_cost(p->session[a][q], p->calib[a][q]);
    }
    *out = p->session[a][q];
    return QC_OK;
}

enum qc_status tune_predictor_init(struct tune_predictor *p, const struct qc_config *cfg,
                                   const char *const *data, int ndata, uint64_t budget,
                                   int64_t tail_scenes)
{
    memset(p, 0, sizeof *p);
    p->cfg = *cfg;
    p->cfg.device_budget = budget;
    p->data = data;
    p->ndata = ndata;
    p->budget = budget;
    p->ranks = cfg->world_size > 0 ? cfg->world_size : 1;
    struct qc_train_planner *pl = NULL;
    QC_TRY(session(p, cfg->attention, cfg->precision, &pl));
    /* the scenes weighed: every one up to tail_scenes, else evenly spread */
    const int64_t total = ndata > 0 ? qc_train_planner_scenes(pl) : cfg->synthetic_scenes;
    const int64_t n = total < tail_scenes ? total : tail_scenes;
    struct weighed *w = calloc((size_t)(n > 0 ? n : 1), sizeof *w);
    p->order = calloc((size_t)(n > 0 ? n : 1), sizeof *p->order);
    if (!w || !p->order) {
        free(w);
        return qc_errorf(QC_ERR_NOMEM, "tune: %lld scenes", (long long)n);
    }
    struct qc_plan_params keep;
    qc_train_plan_params(&p->cfg, &keep);
    keep.mode = QC_PLAN_MODE_KEEP;
    keep.budget = 0;
    enum qc_status st = QC_OK;
    for (int64_t i = 0; i < n && st == QC_OK; i++) {
        w[i].scene = n == total ? i : i * total / n;
        struct qc_plan_result r = {0};
        const struct qc_plan_program *prog = NULL;
        st = qc_train_planner_plan_scenes(pl, &w[i].scene, 1, NULL, &keep, &r, &prog);
        if (st == QC_OK)
            w[i].bytes = r.keep_peak - prog->fixed_bytes;
        qc_plan_result_free(&r);
    }
    if (st == QC_OK) {
        qsort(w, (size_t)n, sizeof *w, heavier_first);
        for (int64_t i = 0; i < n; i++)
            p->order[i] = w[i].scene;
        p->nweighed = n;
    }
    free(w);
    return st;
}

void tune_predictor_deinit(struct tune_predictor *p)
{
    for (int a = 0; a < 2; a++)
        for (int q = 0; q < QC_PREC_COUNT; q++) {
            qc_train_planner_destroy(p->session[a][q]);
            qc_plan_cost_destroy(p->calib[a][q]);
        }
    free(p->order);
    memset(p, 0, sizeof *p);
}

void tune_predictor_use_cost(struct tune_predictor *p, const struct qc_plan_cost *c)
{
    for (int a = 0; a < 2; a++)
        for (int q = 0; q < QC_PREC_COUNT; q++)
            if (p->session[a][q])
                qc_train_planner_use_cost(p->session[a][q], c ? c : p->calib[a][q]);
    p->cost = c;
}

/* The B scenes of a batch: the heaviest (heavy), or those around the median weight (typical);
 * cycled when B exceeds the scenes weighed. */
static void batch_scenes(const struct tune_predictor *p, int64_t B, bool heavy, int64_t *idx)
{
    const int64_t n = p->nweighed;
    const int64_t start = heavy || B >= n ? 0 : (n - B) / 2;
    for (int64_t i = 0; i < B; i++)
        idx[i] = p->order[(start + i) % n];
}

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *s = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static void plan_params(const struct tune_predictor *p, const struct qc_tune_settings *s,
                        struct qc_plan_params *par)
{
    struct qc_config c = p->cfg;
    qc_tune_settings_apply(s, &c);
    qc_train_plan_params(&c, par);
}

enum qc_status tune_predict(struct tune_predictor *p, struct qc_tune_candidate *c)
{
    struct qc_train_planner *pl = NULL;
    QC_TRY(session(p, c->set.attention, c->set.precision, &pl));
    if (p->cost)
        qc_train_planner_use_cost(pl, p->cost);
    const int64_t B = c->set.batch_size;
    int64_t *idx = malloc((size_t)B * sizeof *idx);
    if (!idx)
        return qc_errorf(QC_ERR_NOMEM, "tune: %lld scenes", (long long)B);
    struct qc_plan_params par;
    plan_params(p, &c->set, &par);
    struct qc_plan_result heavy = {0}, typical = {0};
    batch_scenes(p, B, true, idx);
    enum qc_status st = qc_train_planner_plan_scenes(pl, idx, B, NULL, &par, &heavy, NULL);
    if (st == QC_OK) {
        batch_scenes(p, B, false, idx);
        st = qc_train_planner_plan_scenes(pl, idx, B, NULL, &par, &typical, NULL);
    }
    if (st == QC_OK) {
        c->peak = heavy.peak;
        c->offload_bytes = heavy.host_bytes + heavy.nvme_bytes;
        c->nvme_bytes = heavy.nvme_bytes;
        c->recompute_bytes = heavy.recompute_bytes;
        c->step_s = (double)c->set.grad_accum * typical.step_s;
        c->samples_per_s =
            c->step_s > 0 ? (double)(B * c->set.grad_accum * p->ranks) / c->step_s : 0.0;
        uint64_t h = 1469598103934665603ull;
        h = fnv(h, heavy.policy, (size_t)heavy.nblocks);
        h = fnv(h, &c->set.batch_size, sizeof c->set.batch_size);
        h = fnv(h, &c->set.attention, sizeof c->set.attention);
        h = fnv(h, &c->set.precision, sizeof c->set.precision);
        if (c->offload_bytes > 0)
            h = fnv(h, &heavy.window, sizeof heavy.window);
        c->plan_hash = h;
        if (c->state == QC_TUNE_PRUNED || c->state == QC_TUNE_FITS)
            c->state = heavy.fits ? QC_TUNE_FITS : QC_TUNE_PRUNED;
    }
    qc_plan_result_free(&heavy);
    qc_plan_result_free(&typical);
    free(idx);
    return st;
}

enum qc_status tune_min_budget(struct tune_predictor *p, uint64_t *out)
{
    uint64_t best = UINT64_MAX;
    for (int k = 0; k < 2 * QC_PREC_COUNT; k++) {
        const int a = k % 2, q = k / 2;
        if (q != (int)p->cfg.precision && !p->allow_precision)
            continue;
        struct qc_train_planner *pl = NULL;
        QC_TRY(session(p, (enum qc_attention_impl)a, q, &pl));
        struct qc_plan_params par;
        qc_train_plan_params(&p->cfg, &par);
        par.mode = QC_PLAN_MODE_AUTO;
        if (par.margin > 0.02) /* the smallest margin of the space */
            par.margin = 0.02;
        /* a budget nothing fits: the result holds the smallest peak the search found; then
         * the least budget whose target holds it, checked by planning under it */
        par.budget = 1;
        struct qc_plan_result r = {0};
        QC_TRY(qc_train_planner_plan_scenes(pl, &p->order[0], 1, NULL, &par, &r, NULL));
        uint64_t b = (uint64_t)((double)r.peak / (1.0 - par.margin)) + 1;
        qc_plan_result_free(&r);
        b = (b + MIB - 1) / MIB * MIB;
        for (int tries = 0; tries < 64; tries++, b += MIB) {
            par.budget = b;
            QC_TRY(qc_train_planner_plan_scenes(pl, &p->order[0], 1, NULL, &par, &r, NULL));
            const bool fits = r.fits;
            qc_plan_result_free(&r);
            if (fits)
                break;
        }
        if (b < best)
            best = b;
    }
    *out = best;
    return QC_OK;
}
