/*
 * eval.c — validation: the training loss (QCNET.md §6.1) and the K = 6 metrics of §6.2
 * (minADE, minFDE, MR, Brier, brier-minFDE, minAHE, minFHE over the focal agents) of a model on a
 * dataset, in eval mode (no dropout, no backward), batches in file order (no shuffling), so with
 * --batch-size N the first batch is the first N scenes. --dump writes that first batch's
 * predictions under QCNet's output names.
 *
 * Next to the model's metrics it reports a constant-velocity baseline (cv_minADE, cv_minFDE,
 * cv_MR): each focal agent keeps its velocity at t = 49 for the 60 future steps, one mode, on
 * the same agents, masks and targets. A model that does not beat it has learned no motion.
 *
 * Backends: the model runs where it was built (device.kind; qc_eval_run sets up the backend as
 * training does, qc_train_backend_create). On a device backend the forward copies each batch in
 * on the model's stream (ctx.batch_dev NULL: evaluation has no step to overlap with), the loss
 * and the metrics' inputs come back through the model's downloads, and --dump downloads the
 * outputs into host buffers before writing them.
 */
#include "qc_train.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qc_alloc.h"
#include "qc_batch.h"
#include "qc_config.h"
#include "qc_exec.h"
#include "qc_json.h"
#include "qc_loader.h"
#include "qc_safetensors.h"

static double eval_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- constant-velocity baseline ----------------------------------------------------------------

#define EVAL_STEPS  110 /* history + future steps per agent row */
#define EVAL_T_HIST 50  /* history steps; t = 49 is the current step */
#define EVAL_DT     0.1 /* seconds per step (10 Hz) */

void qc_eval_cv_predict(const float *heading, const float *velocity, float *loc)
{
    const double th = (double)heading[EVAL_T_HIST - 1];
    const double c = cos(th), sn = sin(th);
    const double vx = (double)velocity[(EVAL_T_HIST - 1) * 3];
    const double vy = (double)velocity[(EVAL_T_HIST - 1) * 3 + 1];
    for (int64_t s = 0; s < QC_BATCH_FUTURE_STEPS; s++) {
        const double dt = (double)(s + 1) * EVAL_DT;
        const double dx = dt * vx, dy = dt * vy;
        /* the rotation by -theta of TargetBuilder (QCNET.md 7.4) */
        loc[s * 2 + 0] = (float)(dx * c + dy * sn);
        loc[s * 2 + 1] = (float)(-dx * sn + dy * c);
    }
}

enum qc_status qc_eval_cv_update(struct qc_qcnet_metrics *mt, const struct qc_batch *b)
{
    const int64_t A = b->num_agents, S = QC_BATCH_FUTURE_STEPS;
    if (A == 0)
        return QC_OK;
    float *loc = malloc((size_t)(A * S * 2) * sizeof(float));
    float *pi = calloc((size_t)A, sizeof(float)); /* one mode: its probability is 1 */
    float *target_own = b->target ? NULL : malloc((size_t)(A * S * 4) * sizeof(float));
    if (!loc || !pi || (!b->target && !target_own)) {
        free(loc);
        free(pi);
        free(target_own);
        return qc_errorf(QC_ERR_NOMEM,
                         "eval: constant-velocity baseline: out of memory (%lld agents)",
                         (long long)A);
    }
    for (int64_t a = 0; a < A; a++)
        qc_eval_cv_predict(b->heading + a * EVAL_STEPS, b->velocity + a * EVAL_STEPS * 3,
                           loc + a * S * 2);
    if (target_own)
        qc_batch_target(b, 0, A, target_own);
    qc_qcnet_metrics_update(mt, loc, pi, b->target ? b->target : target_own, b->predict_mask,
                            b->agent_category, A, 1, EVAL_T_HIST, S);
    free(loc);
    free(pi);
    free(target_own);
    return QC_OK;
}

// ---- dump ---------------------------------------------------------------------------------------

/* Writes the outputs of one forward as QCNet names them (pred dict keys): o's views, host
 * memory (eval_dump downloads them first on a device backend). */
static enum qc_status eval_dump_write(const struct qc_qcnet_output *o,
                                      const struct qc_qcnet_loss *l, const struct qc_batch *b,
                                      const char *path)
{
    struct qc_st_writer *w = NULL;
    QC_TRY(qc_st_writer_create(&w));
    const int64_t traj[4] = {o->A, o->K, o->S, 2};
    const int64_t pis[2] = {o->A, o->K};
    enum qc_status st =
        qc_st_writer_add(w, "loc_propose_pos", QC_ST_F32, 4, traj, o->loc_propose_pos);
    if (st == QC_OK)
        st = qc_st_writer_add(w, "scale_propose_pos", QC_ST_F32, 4, traj, o->scale_propose_pos);
    if (st == QC_OK)
        st = qc_st_writer_add(w, "loc_refine_pos", QC_ST_F32, 4, traj, o->loc_refine_pos);
    if (st == QC_OK)
        st = qc_st_writer_add(w, "scale_refine_pos", QC_ST_F32, 4, traj, o->scale_refine_pos);
    if (st == QC_OK)
        st = qc_st_writer_add(w, "pi", QC_ST_F32, 2, pis, o->pi);
    char buf[64];
    if (st == QC_OK) {
        snprintf(buf, sizeof(buf), "%.9g", (double)l->loss);
        st = qc_st_writer_set_metadata(w, "loss", buf);
    }
    if (st == QC_OK) {
        snprintf(buf, sizeof(buf), "%" PRId64, b->num_scenes);
        st = qc_st_writer_set_metadata(w, "num_scenes", buf);
    }
    if (st == QC_OK && b->scenario_id) {
        /* the scenario ids, JSON list, so the rows can be matched to scenes */
        size_t cap = 16 + (size_t)b->num_scenes * (QC_SCENE_ID_MAX + 4);
        char *ids = malloc(cap);
        if (!ids)
            st = qc_errorf(QC_ERR_NOMEM, "dump: out of memory");
        else {
            size_t n = 0;
            n += (size_t)snprintf(ids + n, cap - n, "[");
            for (int64_t i = 0; i < b->num_scenes; i++)
                n +=
                    (size_t)snprintf(ids + n, cap - n, "%s\"%s\"", i ? "," : "", b->scenario_id[i]);
            snprintf(ids + n, cap - n, "]");
            st = qc_st_writer_set_metadata(w, "scenario_ids", ids);
            free(ids);
        }
    }
    if (st == QC_OK)
        st = qc_st_writer_set_metadata(w, "format", "qctrain eval dump v1");
    if (st == QC_OK)
        st = qc_st_writer_write(w, path);
    qc_st_writer_destroy(w);
    return st;
}

/* --dump of the forward of model m on batch b (host batch). */
static enum qc_status eval_dump(const struct qc_qcnet *m, const struct qc_qcnet_output *o,
                                const struct qc_qcnet_loss *l, const struct qc_batch *b,
                                const char *path)
{
    const struct qc_exec *ex = qc_qcnet_exec(m);
    if (!qc_exec_is_device(ex))
        return eval_dump_write(o, l, b, path);
    /* device views: download the five outputs into one host buffer */
    const size_t ntraj = (size_t)(o->A * o->K * o->S * 2), npi = (size_t)(o->A * o->K);
    float *h = malloc((4 * ntraj + npi + 1) * sizeof(float));
    if (!h)
        return qc_errorf(QC_ERR_NOMEM, "dump: out of memory (%zu floats)", 4 * ntraj + npi);
    struct qc_qcnet_output ho = *o;
    const float *src[5] = {o->loc_propose_pos, o->scale_propose_pos, o->loc_refine_pos,
                           o->scale_refine_pos, o->pi};
    const size_t off[5] = {0, ntraj, 2 * ntraj, 3 * ntraj, 4 * ntraj};
    const size_t num[5] = {ntraj, ntraj, ntraj, ntraj, npi};
    enum qc_status st = QC_OK;
    for (int i = 0; i < 5 && st == QC_OK; i++)
        if (num[i] > 0)
            st = qc_op_download(ex, h + off[i], src[i], num[i] * sizeof(float));
    ho.loc_propose_pos = h + off[0];
    ho.scale_propose_pos = h + off[1];
    ho.loc_refine_pos = h + off[2];
    ho.scale_refine_pos = h + off[3];
    ho.pi = h + off[4];
    ho.x_pt = ho.x_pl = ho.x_a = NULL; /* not dumped */
    if (st == QC_OK)
        st = eval_dump_write(&ho, l, b, path);
    free(h);
    return st;
}

// ---- predictions: the AV2 submission's content -------------------------------------------------

/* Every focal agent's (agent_category 3) refined trajectories rotated back to the world frame
 * and its mode probabilities, as the official test_step computes them (QCNET.md §6.2): p_world
 * = p·Rᵀ + origin with the agent's position and heading at t = 49, probabilities softmax(pi). */
struct eval_pred {
    int64_t n, cap, K, S;
    float *traj;                       /* (n,K,S,2) */
    float *prob;                       /* (n,K) */
    char (*scenario)[QC_SCENE_ID_MAX]; /* (n) */
    char (*track)[QC_AGENT_ID_MAX];    /* (n) */
};

static void eval_pred_free(struct eval_pred *p)
{
    free(p->traj);
    free(p->prob);
    free(p->scenario);
    free(p->track);
    memset(p, 0, sizeof *p);
}

static enum qc_status eval_pred_add(struct eval_pred *p, const struct qc_qcnet *m,
                                    const struct qc_qcnet_output *o, const struct qc_batch *b)
{
    const int64_t A = o->A, K = o->K, S = o->S;
    if (A == 0)
        return QC_OK;
    if (!b->scenario_id || !b->agent_id)
        return qc_errorf(QC_ERR_INVALID, "eval --predictions: the data has no scenario or track "
                                         "ids (generated scenes cannot be submitted)");
    if (p->n > 0 && (p->K != K || p->S != S))
        return qc_errorf(QC_ERR_INVALID, "eval --predictions: K x S changed between batches");
    p->K = K;
    p->S = S;
    /* the outputs in host memory (downloaded on a device backend) */
    const struct qc_exec *ex = qc_qcnet_exec(m);
    const float *loc = o->loc_refine_pos, *pi = o->pi;
    float *h = NULL;
    if (qc_exec_is_device(ex)) {
        h = malloc((size_t)(A * K * S * 2 + A * K) * sizeof(float));
        if (!h)
            return qc_errorf(QC_ERR_NOMEM, "eval --predictions: out of memory");
        enum qc_status st =
            qc_op_download(ex, h, o->loc_refine_pos, (size_t)(A * K * S * 2) * sizeof(float));
        if (st == QC_OK)
            st = qc_op_download(ex, h + A * K * S * 2, o->pi, (size_t)(A * K) * sizeof(float));
        if (st != QC_OK) {
            free(h);
            return st;
        }
        loc = h;
        pi = h + A * K * S * 2;
    }
    enum qc_status st = QC_OK;
    for (int64_t a = 0; a < A && st == QC_OK; a++) {
        if (b->agent_category[a] != 3)
            continue;
        if (p->n == p->cap) {
            const int64_t cap = p->cap ? 2 * p->cap : 64;
            float *t = realloc(p->traj, (size_t)(cap * K * S * 2) * sizeof(float));
            if (t)
                p->traj = t;
            float *q = t ? realloc(p->prob, (size_t)(cap * K) * sizeof(float)) : NULL;
            if (q)
                p->prob = q;
            char(*sc)[QC_SCENE_ID_MAX] = q ? realloc(p->scenario, (size_t)cap * sizeof(*sc)) : NULL;
            if (sc)
                p->scenario = sc;
            char(*tr)[QC_AGENT_ID_MAX] = sc ? realloc(p->track, (size_t)cap * sizeof(*tr)) : NULL;
            if (tr)
                p->track = tr;
            if (!tr) {
                st = qc_errorf(QC_ERR_NOMEM, "eval --predictions: out of memory");
                break;
            }
            p->cap = cap;
        }
        const float *pos = b->position + a * EVAL_STEPS * 3 + (EVAL_T_HIST - 1) * 3;
        const double th = (double)b->heading[a * EVAL_STEPS + EVAL_T_HIST - 1];
        const double c = cos(th), sn = sin(th);
        float *dst = p->traj + p->n * K * S * 2;
        const float *src = loc + a * K * S * 2;
        for (int64_t i = 0; i < K * S; i++) {
            const double x = (double)src[2 * i], y = (double)src[2 * i + 1];
            dst[2 * i] = (float)(x * c - y * sn + (double)pos[0]);
            dst[2 * i + 1] = (float)(x * sn + y * c + (double)pos[1]);
        }
        double mx = -(double)INFINITY, sum = 0;
        for (int64_t k = 0; k < K; k++)
            mx = fmax(mx, (double)pi[a * K + k]);
        for (int64_t k = 0; k < K; k++)
            sum += exp((double)pi[a * K + k] - mx);
        for (int64_t k = 0; k < K; k++)
            p->prob[p->n * K + k] = (float)(exp((double)pi[a * K + k] - mx) / sum);
        snprintf(p->scenario[p->n], QC_SCENE_ID_MAX, "%s", b->scenario_id[b->agent_batch[a]]);
        snprintf(p->track[p->n], QC_AGENT_ID_MAX, "%s", b->agent_id[a]);
        p->n++;
    }
    free(h);
    return st;
}

/* "[\"a\",\"b\"]" of n ids of width w (JSON-escaped); NULL when out of memory. */
static char *ids_json(const char *ids, int64_t n, size_t w)
{
    const size_t cap = 4 + (size_t)n * (6 * w + 3);
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t k = 0;
    out[k++] = '[';
    for (int64_t i = 0; i < n; i++) {
        if (i)
            out[k++] = ',';
        out[k++] = '"';
        for (const unsigned char *c = (const unsigned char *)(ids + (size_t)i * w); *c; c++) {
            if (*c == '"' || *c == '\\') {
                out[k++] = '\\';
                out[k++] = (char)*c;
            } else if (*c < 0x20) {
                k += (size_t)snprintf(out + k, cap - k, "\\u%04x", *c);
            } else {
                out[k++] = (char)*c;
            }
        }
        out[k++] = '"';
    }
    out[k++] = ']';
    out[k] = '\0';
    return out;
}

static enum qc_status eval_pred_write(const struct eval_pred *p, const char *path)
{
    if (p->n == 0)
        return qc_errorf(QC_ERR_INVALID,
                         "eval --predictions %s: no focal agent (agent_category "
                         "3) in the data",
                         path);
    struct qc_st_writer *w = NULL;
    QC_TRY(qc_st_writer_create(&w));
    const int64_t ts[4] = {p->n, p->K, p->S, 2}, ps[2] = {p->n, p->K};
    enum qc_status st = qc_st_writer_add(w, "trajectories", QC_ST_F32, 4, ts, p->traj);
    if (st == QC_OK)
        st = qc_st_writer_add(w, "probabilities", QC_ST_F32, 2, ps, p->prob);
    char *sj = ids_json(&p->scenario[0][0], p->n, QC_SCENE_ID_MAX);
    char *tj = ids_json(&p->track[0][0], p->n, QC_AGENT_ID_MAX);
    if (st == QC_OK && (!sj || !tj))
        st = qc_errorf(QC_ERR_NOMEM, "eval --predictions: out of memory");
    if (st == QC_OK)
        st = qc_st_writer_set_metadata(w, "scenario_ids", sj);
    if (st == QC_OK)
        st = qc_st_writer_set_metadata(w, "track_ids", tj);
    if (st == QC_OK)
        st = qc_st_writer_set_metadata(w, "format", "qctrain predictions v1");
    if (st == QC_OK)
        st = qc_st_writer_write(w, path);
    free(sj);
    free(tj);
    qc_st_writer_destroy(w);
    return st;
}

/* No focal agent was evaluated: the metrics are not available (NAN: null in JSON, "n/a" in
 * text), not a perfect 0. */
static void eval_metrics_na(struct qc_qcnet_metric_values *v)
{
    if (v->count > 0)
        return;
    v->min_ade = v->min_fde = v->miss_rate = v->brier = v->brier_min_fde = (double)NAN;
    v->min_ahe = v->min_fhe = (double)NAN;
}

enum qc_status qc_eval_model(struct qc_qcnet *m, struct qc_alloc *a,
                             const struct qc_eval_opts *opts, struct qc_eval_result *out)
{
    const struct qc_config *cfg = opts->cfg;
    struct qc_eval_result r = {0};
    struct qc_loader_opts lo;
    qc_train_loader_opts(cfg, &lo);
    lo.batch_size = opts->batch_size > 0 ? opts->batch_size : cfg->batch_size;
    lo.shuffle = false; /* file order: the first batch is the first N scenes */
    lo.balance_cost = false;
    lo.synthetic_scenes =
        opts->synthetic_scenes > 0 ? opts->synthetic_scenes : cfg->synthetic_scenes;
    lo.synthetic_seed = opts->synthetic_seed;

    struct qc_loader *ld = NULL;
    QC_TRY(qc_loader_create(opts->data, opts->ndata, &lo, &ld));
    enum qc_status st = qc_loader_start_epoch(ld, 0);
    if (a && st == QC_OK)
        qc_alloc_reset_peak(a);
    struct qc_qcnet_metrics mt, cv;
    qc_qcnet_metrics_reset(&mt);
    qc_qcnet_metrics_reset(&cv);
    double sum_loss = 0, sum_rp = 0, sum_rr = 0, sum_cls = 0;
    struct eval_pred pred = {0};
    const double t0 = eval_now_s();
    while (st == QC_OK && (opts->max_batches <= 0 || r.batches < opts->max_batches)) {
        struct qc_batch *b = NULL;
        st = qc_loader_next(ld, &b);
        if (st != QC_OK || !b)
            break;
        const struct qc_qcnet_ctx ctx = {
            .training = false, .need_backward = false, .seed = (uint64_t)cfg->seed};
        struct qc_qcnet_output o;
        struct qc_qcnet_loss l;
        st = qc_qcnet_forward(m, b, &ctx, &o);
        if (st == QC_OK)
            st = qc_qcnet_loss(m, &l);
        if (st == QC_OK)
            st = qc_qcnet_metrics_update_model(&mt, m);
        if (st == QC_OK)
            st = qc_eval_cv_update(&cv, b);
        if (st == QC_OK && r.batches == 0 && opts->dump)
            st = eval_dump(m, &o, &l, b, opts->dump);
        if (st == QC_OK && opts->predictions)
            st = eval_pred_add(&pred, m, &o, b);
        if (st == QC_OK) {
            sum_loss += (double)l.loss;
            sum_rp += (double)l.reg_loss_propose;
            sum_rr += (double)l.reg_loss_refine;
            sum_cls += (double)l.cls_loss;
            r.batches++;
            r.scenes += b->num_scenes;
        }
        qc_qcnet_release(m);
        qc_loader_release(ld, b);
    }
    if (a) {
        struct qc_alloc_stats as;
        qc_alloc_stats_get(a, &as);
        r.peak_device_bytes = as.bytes_allocated_peak;
    }
    qc_loader_destroy(ld);
    if (st == QC_OK && opts->predictions && r.batches > 0)
        st = eval_pred_write(&pred, opts->predictions);
    eval_pred_free(&pred);
    if (st != QC_OK)
        return st;
    if (r.batches == 0)
        return qc_errorf(QC_ERR_INVALID, "eval: the data gives no batch");
    r.seconds = eval_now_s() - t0;
    r.loss = sum_loss / (double)r.batches;
    r.reg_loss_propose = sum_rp / (double)r.batches;
    r.reg_loss_refine = sum_rr / (double)r.batches;
    r.cls_loss = sum_cls / (double)r.batches;
    qc_qcnet_metrics_compute(&mt, &r.metrics);
    qc_qcnet_metrics_compute(&cv, &r.cv);
    eval_metrics_na(&r.metrics);
    eval_metrics_na(&r.cv);
    QC_ASSERT(r.cv.count == r.metrics.count, "eval: baseline on %lld agents, model on %lld",
              (long long)r.cv.count, (long long)r.metrics.count);
    *out = r;
    return QC_OK;
}

enum qc_status qc_eval_run(const struct qc_eval_opts *opts, struct qc_eval_result *out)
{
    struct qc_train_backend *be = NULL;
    QC_TRY(qc_train_backend_create(opts->cfg, &be));
    struct qc_qcnet *m = NULL;
    enum qc_status st = qc_train_backend_model(be, opts->cfg, &m);
    if (st == QC_OK) {
        if (opts->weights) {
            char p[4096];
            st = qc_checkpoint_weights_path(opts->weights, p, sizeof(p));
            if (st == QC_OK)
                st = qc_qcnet_load(m, p);
        } else {
            qc_qcnet_init_params(m, (uint64_t)opts->cfg->seed);
        }
    }
    if (st == QC_OK)
        st = qc_eval_model(m, qc_train_backend_alloc(be), opts, out);
    qc_qcnet_destroy(m);
    qc_train_backend_destroy(be);
    return st;
}

size_t qc_eval_format_json(const struct qc_eval_result *r, char *buf, size_t cap)
{
    const struct qc_qcnet_metric_values *m = &r->metrics, *cv = &r->cv;
    const int n = snprintf(
        buf, cap,
        "{\"eval\":{\"batches\":%" PRId64 ",\"scenes\":%" PRId64 ",\"agents\":%" PRId64
        ",\"loss\":%s,\"reg_loss_propose\":%s,\"reg_loss_refine\":%s,\"cls_loss\":%s,"
        "\"minADE\":%s,\"minFDE\":%s,\"MR\":%s,\"Brier\":%s,\"brier_minFDE\":%s,"
        "\"minAHE\":%s,\"minFHE\":%s,"
        "\"cv_minADE\":%s,\"cv_minFDE\":%s,\"cv_MR\":%s,"
        "\"seconds\":%s,\"peak_device_bytes\":%" PRIu64 "}}",
        r->batches, r->scenes, m->count, QC_JSON_NUM("%.9g", r->loss),
        QC_JSON_NUM("%.9g", r->reg_loss_propose), QC_JSON_NUM("%.9g", r->reg_loss_refine),
        QC_JSON_NUM("%.9g", r->cls_loss), QC_JSON_NUM("%.9g", m->min_ade),
        QC_JSON_NUM("%.9g", m->min_fde), QC_JSON_NUM("%.9g", m->miss_rate),
        QC_JSON_NUM("%.9g", m->brier), QC_JSON_NUM("%.9g", m->brier_min_fde),
        QC_JSON_NUM("%.9g", m->min_ahe), QC_JSON_NUM("%.9g", m->min_fhe),
        QC_JSON_NUM("%.9g", cv->min_ade), QC_JSON_NUM("%.9g", cv->min_fde),
        QC_JSON_NUM("%.9g", cv->miss_rate), QC_JSON_NUM("%.6g", r->seconds), r->peak_device_bytes);
    return n < 0 ? 0 : (size_t)n;
}

const char *qc_eval_format_metric(double v, char *buf, size_t cap)
{
    if (isfinite(v))
        snprintf(buf, cap, "%.4f", v);
    else
        snprintf(buf, cap, "n/a");
    return buf;
}
