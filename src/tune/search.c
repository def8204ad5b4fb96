/*
 * search.c — the search (README.md "The search"): predict every point, prune what does not fit,
 * measure the best predicted few and the measured-only variants of the fastest, refine the
 * cost model after each run, choose by measurement.
 */
#include "tune_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qc_plan.h"
#include "qc_progress.h" /* qc_format_bytes */
#include "qc_train.h"

void qc_tune_opts_init(struct qc_tune_opts *o)
{
    memset(o, 0, sizeof *o);
    o->time_limit_s = 600;
    o->max_measured = 3;
    o->tail_scenes = 32;
}

void qc_tune_result_free(struct qc_tune_result *r)
{
    free(r->cand);
    memset(r, 0, sizeof *r);
    r->best = -1;
    r->within_noise_of = -1;
}

static double monotonic(void *user)
{
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* a ranks before b by prediction: faster, then smaller peak, then enumeration order. */
static bool predicted_before(const struct qc_tune_candidate *c, int64_t a, int64_t b)
{
    if (c[a].samples_per_s != c[b].samples_per_s)
        return c[a].samples_per_s > c[b].samples_per_s;
    if (c[a].peak != c[b].peak)
        return c[a].peak < c[b].peak;
    return a < b;
}

/* The best predicted candidate in state FITS of precision prec (-1: any), or -1. */
static int64_t best_predicted_of(const struct qc_tune_candidate *c, int64_t n, int prec)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (c[i].state == QC_TUNE_FITS && (prec < 0 || (int)c[i].set.precision == prec) &&
            (best < 0 || predicted_before(c, i, best)))
            best = i;
    return best;
}

static int64_t best_predicted(const struct qc_tune_candidate *c, int64_t n)
{
    return best_predicted_of(c, n, -1);
}

/* The fastest measured candidate that ran without a failure within the budget, or -1. Ties go
 * to the earlier candidate. */
static int64_t best_measured(const struct qc_tune_candidate *c, int64_t n, uint64_t budget)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++) {
        if (c[i].state != QC_TUNE_MEASURED || c[i].m.failed || c[i].m.steps < 1 ||
            c[i].m.peak_bytes > budget)
            continue;
        if (best < 0 || c[i].measured_sps > c[best].measured_sps)
            best = i;
    }
    return best;
}

/* A measured candidate's samples/s range from its fastest and slowest timed step. */
static void sps_range(const struct qc_tune_candidate *c, int64_t ranks, double *lo, double *hi)
{
    const double g = (double)(c->set.batch_size * c->set.grad_accum * ranks);
    const double fast = c->m.step_s_min > 0 ? c->m.step_s_min : c->m.step_s;
    const double slow = c->m.step_s_max > 0 ? c->m.step_s_max : c->m.step_s;
    *lo = slow > 0 ? g / slow : 0.0;
    *hi = fast > 0 ? g / fast : 0.0;
}

/* The fastest other usable measured candidate whose samples/s range overlaps best's, or -1. */
static int64_t within_noise(const struct qc_tune_candidate *c, int64_t n, int64_t best,
                            uint64_t budget, int64_t ranks)
{
    double blo, bhi;
    sps_range(&c[best], ranks, &blo, &bhi);
    int64_t tie = -1;
    for (int64_t i = 0; i < n; i++) {
        if (i == best || c[i].state != QC_TUNE_MEASURED || c[i].m.failed || c[i].m.steps < 1 ||
            c[i].m.peak_bytes > budget)
            continue;
        double lo, hi;
        sps_range(&c[i], ranks, &lo, &hi);
        if (lo <= bhi && blo <= hi && (tie < 0 || c[i].measured_sps > c[tie].measured_sps))
            tie = i;
    }
    return tie;
}

struct search {
    const struct qc_tune_opts *o;
    struct tune_predictor pred;
    struct qc_plan_cost *cost; /* refined by the runs; NULL until the first */
    char cost_path[4200];
    struct qc_tune_candidate *cand;
    int64_t n, cap;
    double t0;
    int64_t runs;
    int64_t planned; /* candidates the search means to measure (the progress bar's total) */
};

static double elapsed(const struct search *s)
{
    return (s->o->clock ? s->o->clock(s->o->clock_user) : monotonic(NULL)) - s->t0;
}

static void progress(const struct search *s, const char *what)
{
    if (s->o->progress)
        s->o->progress(s->o->progress_user, what, s->runs,
                       s->planned > s->runs ? s->planned : s->runs);
}

static enum qc_status predict_all(struct search *s)
{
    for (int64_t i = 0; i < s->n; i++)
        QC_TRY(tune_predict(&s->pred, &s->cand[i]));
    return QC_OK;
}

/* Measures candidate k (predicted to fit: the search's invariant) and folds the run's costs
 * into every prediction. */
static enum qc_status measure(struct search *s, int64_t k)
{
    struct qc_tune_candidate *c = &s->cand[k];
    QC_ASSERT(c->state == QC_TUNE_FITS, "tune: candidate %lld is not predicted to fit",
              (long long)k);
    struct qc_config cfg = s->pred.cfg;
    qc_tune_settings_apply(&c->set, &cfg);
    char what[160];
    snprintf(what, sizeof what, "run %lld: batch %lld x %lld, %s, %s", (long long)s->runs + 1,
             (long long)c->set.batch_size, (long long)c->set.grad_accum,
             c->set.attention == QC_ATTENTION_FUSED ? "fused" : "unfused",
             qc_precision_str((enum qc_precision)c->set.precision));
    progress(s, what);
    bool written = false;
    c->predicted_at_run_s = c->step_s;
    const qc_tune_measure_fn fn = s->o->measure ? s->o->measure : qc_tune_measure_train;
    QC_TRY(fn(s->o->measure_user, &cfg, s->o->data, s->o->ndata, s->cost_path, &written, &c->m));
    c->state = QC_TUNE_MEASURED;
    c->order = ++s->runs;
    c->measured_sps =
        c->m.step_s > 0
            ? (double)(c->set.batch_size * c->set.grad_accum * s->pred.ranks) / c->m.step_s
            : 0.0;
    if (written) {
        if (!s->cost)
            QC_TRY(qc_plan_cost_create(&s->cost));
        QC_TRY(qc_plan_cost_load(s->cost, s->cost_path));
        tune_predictor_use_cost(&s->pred, s->cost);
        QC_TRY(predict_all(s));
    }
    return QC_OK;
}

/* Whether another run may start: not stopped, and (after the first run) its predicted time
 * fits what is left of the time limit. */
static bool may_run(struct search *s, const struct qc_tune_candidate *c, bool *stopped)
{
    if (s->o->stop && s->o->stop(s->o->stop_user)) {
        *stopped = true;
        return false;
    }
    if (s->runs > 0 && elapsed(s) + 3.0 * c->step_s > s->o->time_limit_s) {
        *stopped = true;
        return false;
    }
    return true;
}

/* Appends a copy of candidate k with one measured-only key changed (its prediction is k's). */
static enum qc_status add_variant(struct search *s, int64_t k, const struct qc_tune_settings *set,
                                  int64_t *out)
{
    for (int64_t i = 0; i < s->n; i++)
        if (memcmp(&s->cand[i].set, set, sizeof *set) == 0) {
            *out = -1;
            return QC_OK;
        }
    if (s->n == s->cap) {
        struct qc_tune_candidate *c = realloc(s->cand, (size_t)(s->cap * 2) * sizeof *c);
        if (!c)
            return qc_errorf(QC_ERR_NOMEM, "tune: candidates");
        s->cand = c;
        s->cap *= 2;
    }
    struct qc_tune_candidate *v = &s->cand[s->n];
    *v = s->cand[k];
    memset(&v->m, 0, sizeof v->m);
    v->measured_sps = 0;
    v->order = 0;
    v->set = *set;
    v->state = QC_TUNE_FITS;
    *out = s->n++;
    return QC_OK;
}

/* With --allow-precision: the best predicted candidate of every precision that no run has
 * measured yet. The cost model does not tell the precisions' step times apart (a 16-bit step
 * on the CPU is the fp32 arithmetic plus rounding passes, on a GPU it runs on the tensor
 * cores), so the predictions rank the smaller 16-bit peaks first and only a measurement of
 * each precision decides. */
static enum qc_status precision_runs(struct search *s, bool *stopped)
{
    for (int q = 0; q < QC_PREC_COUNT; q++) {
        bool measured = false;
        for (int64_t i = 0; i < s->n && !measured; i++)
            measured = s->cand[i].state == QC_TUNE_MEASURED && (int)s->cand[i].set.precision == q;
        const int64_t k = measured ? -1 : best_predicted_of(s->cand, s->n, q);
        if (k < 0)
            continue;
        if (!may_run(s, &s->cand[k], stopped))
            break;
        if (s->planned <= s->runs)
            s->planned = s->runs + 1;
        QC_TRY(measure(s, k));
    }
    return QC_OK;
}

/* The measured-only keys, tried on the fastest measured candidate: loader threads and compute
 * threads (each 0 = every core, 1, 2, 4, ... below the core count), and with NVMe traffic the
 * queue depth and block size. */
static enum qc_status variants(struct search *s, uint64_t budget, bool *stopped)
{
    const int64_t best = best_measured(s->cand, s->n, budget);
    if (best < 0)
        return QC_OK;
    struct qc_tune_settings sets[24];
    int ns = 0;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (int64_t t = 0; t < cores && ns < 8; t = t ? t * 2 : 1) {
        sets[ns] = s->cand[best].set;
        sets[ns].loader_threads = t;
        ns++;
    }
    for (int64_t t = 0, n0 = ns; t < cores && ns < n0 + 8; t = t ? t * 2 : 1) {
        sets[ns] = s->cand[best].set;
        sets[ns].cpu_threads = t;
        ns++;
    }
    if (s->cand[best].nvme_bytes > 0) {
        const int64_t depths[2] = {16, 64};
        const uint64_t blocks[2] = {(uint64_t)1 << 20, (uint64_t)4 << 20};
        for (int d = 0; d < 2; d++)
            for (int b = 0; b < 2; b++) {
                sets[ns] = s->cand[best].set;
                sets[ns].queue_depth = depths[d];
                sets[ns].block_size = blocks[b];
                ns++;
            }
    }
    s->planned = s->runs + ns;
    for (int i = 0; i < ns; i++) {
        int64_t k;
        QC_TRY(add_variant(s, best, &sets[i], &k));
        if (k < 0) { /* already measured: one fewer to go */
            s->planned--;
            continue;
        }
        if (!may_run(s, &s->cand[k], stopped))
            break;
        QC_TRY(measure(s, k));
    }
    return QC_OK;
}

static enum qc_status search_run(struct search *s, struct qc_tune_result *r)
{
    const struct qc_tune_opts *o = s->o;
    progress(s, "weighing scenes");
    QC_TRY(tune_predictor_init(&s->pred, o->cfg, o->data, o->ndata, o->budget, o->tail_scenes));
    s->pred.allow_precision = o->allow_precision;
    QC_TRY(tune_space(&s->pred.cfg, o->global_batch, s->pred.ranks, o->allow_precision, &s->cand,
                      &s->n));
    s->cap = s->n;
    progress(s, "predicting");
    QC_TRY(predict_all(s));
    for (int64_t i = 0; i < s->n; i++)
        r->fitting += s->cand[i].state == QC_TUNE_FITS;
    r->weighed = s->pred.nweighed;
    for (int64_t i = 0; i < 8 && i < s->pred.nweighed; i++)
        r->heavy_scenes[i] = s->pred.order[i];
    if (r->fitting == 0) {
        QC_TRY(tune_min_budget(&s->pred, &r->min_budget));
        char b1[32], b2[32];
        qc_format_bytes(o->budget, b1, sizeof b1);
        qc_format_bytes(r->min_budget, b2, sizeof b2);
        return qc_errorf(QC_ERR_INVALID,
                         "tune: no configuration fits a budget of %s on these scenes: the "
                         "heaviest scene alone needs a budget of at least %s (batch 1, "
                         "planned with offload and recompute)\nhint: --budget %lluMiB or more",
                         b1, b2, (unsigned long long)(r->min_budget >> 20));
    }
    if (!o->dry_run) {
        s->planned = o->max_measured < r->fitting ? o->max_measured : r->fitting;
        /* the best predicted few; a candidate with the same plan as one measured is not run */
        for (int64_t done = 0; done < o->max_measured;) {
            const int64_t k = best_predicted(s->cand, s->n);
            if (k < 0)
                break;
            bool same = false;
            for (int64_t i = 0; i < s->n && !same; i++)
                same = s->cand[i].state == QC_TUNE_MEASURED &&
                       s->cand[i].plan_hash == s->cand[k].plan_hash &&
                       s->cand[i].set.grad_accum == s->cand[k].set.grad_accum;
            if (same) {
                s->cand[k].state = QC_TUNE_SAME;
                continue;
            }
            if (!may_run(s, &s->cand[k], &r->stopped))
                break;
            QC_TRY(measure(s, k));
            done++;
        }
        if (o->allow_precision && !r->stopped)
            QC_TRY(precision_runs(s, &r->stopped));
        if (!r->stopped)
            QC_TRY(variants(s, o->budget, &r->stopped));
    }
    r->best = best_measured(s->cand, s->n, o->budget);
    r->best_measured = r->best >= 0;
    if (r->best < 0 && s->runs > 0) {
        const struct qc_tune_candidate *c = NULL;
        for (int64_t i = 0; i < s->n && !c; i++)
            if (s->cand[i].state == QC_TUNE_MEASURED)
                c = &s->cand[i];
        return qc_errorf(QC_ERR_INVALID,
                         "tune: every measured candidate failed or went over the budget (the "
                         "first: %s)",
                         c && c->m.note[0] ? c->m.note : "measured peak over the budget");
    }
    if (r->best < 0)
        r->best = best_predicted(s->cand, s->n);
    else
        r->within_noise_of = within_noise(s->cand, s->n, r->best, o->budget, s->pred.ranks);
    return QC_OK;
}

enum qc_status qc_tune_run(const struct qc_tune_opts *o, struct qc_tune_result *r)
{
    memset(r, 0, sizeof *r);
    r->best = -1;
    r->within_noise_of = -1;
    if (o->budget == 0)
        return qc_errorf(QC_ERR_INVALID,
                         "tune: no memory budget\nhint: --budget SIZE (e.g. --budget 1GiB), or "
                         "a preset with device.budget");
    if (o->global_batch < 1 || o->time_limit_s <= 0 || o->max_measured < 1 || o->tail_scenes < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "tune: global batch %lld, time limit %g s, %lld runs, "
                         "%lld tail scenes: each must be positive",
                         (long long)o->global_batch, o->time_limit_s, (long long)o->max_measured,
                         (long long)o->tail_scenes);
    struct search s = {.o = o};
    s.t0 = o->clock ? o->clock(o->clock_user) : monotonic(NULL);
    const char *tmp = o->scratch ? o->scratch : getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/qctrain-tune-cost-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!o->dry_run && !mkdtemp(dir))
        return qc_errorf(QC_ERR_IO, "tune: cannot create a scratch folder %s", dir);
    snprintf(s.cost_path, sizeof s.cost_path, "%s/plan_cost.json", dir);
    enum qc_status st = search_run(&s, r);
    if (!o->dry_run) {
        remove(s.cost_path);
        rmdir(dir);
    }
    r->cand = s.cand;
    r->ncand = s.n;
    r->runs = s.runs;
    r->seconds = elapsed(&s);
    tune_predictor_deinit(&s.pred);
    qc_plan_cost_destroy(s.cost);
    if (st != QC_OK) {
        const uint64_t min_budget = r->min_budget;
        const int64_t fitting = r->fitting, runs = r->runs;
        qc_tune_result_free(r);
        r->min_budget = min_budget;
        r->fitting = fitting;
        r->runs = runs;
    }
    return st;
}
