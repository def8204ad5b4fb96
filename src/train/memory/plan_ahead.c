/*
 * plan_ahead.c — the next group's planning on a helper thread while this group runs
 * (plan_ahead.h).
 */
#include "plan_ahead.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helper_thread.h"
#include "plan_beside.h"   /* plan_beside_same_hw, plan_beside_same_params */
#include "qc_plan_calib.h" /* qc_plan_cost_clone */
#include "qc_batch.h"
#include "qc_qcnet.h"
#include "qc_train.h"

struct plan_ahead {
    struct helper_thread h;
    struct qc_config cfg;
    bool cuda;
    /* the helper's description: its own while RUNNING, swapped with the caller's by a take */
    struct qc_qcnet *dry;
    struct qc_plan_program prog;
    /* the job (RUNNING), its cost model the copy `cost` (owned until a take hands it out) */
    struct plan_ahead_job job;
    struct qc_plan_cost *cost;
    int64_t *scenes; /* the job's batch's dataset indices (a released batch's address may come
                        back holding others) */
    int64_t nscenes, cap_scenes;
    /* its result (DONE) */
    enum qc_status st;
    struct plan_ahead_out out;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The helper's describer for qc_plan_make_edges: the dry run of the job's batch with the edge
 * sets of `tiled` tiled, and the job's fixed bytes (what the trainer's describe records). */
static enum qc_status ahead_describe(void *user, uint32_t tiled,
                                     const struct qc_plan_program **prog)
{
    struct plan_ahead *pa = user;
    QC_TRY(qc_train_edge_modes_set(pa->dry, &pa->cfg, tiled));
    QC_TRY(qc_qcnet_describe(pa->dry, pa->job.batch, pa->cuda, &pa->prog));
    pa->prog.fixed_bytes = pa->job.fixed_bytes;
    *prog = &pa->prog;
    return QC_OK;
}

/* The job (RUNNING: its fields are the helper's until DONE). */
static enum qc_status run_job(struct plan_ahead *pa, struct plan_ahead_out *o)
{
    const double t0 = now_s();
    const struct plan_ahead_job *j = &pa->job;
    const struct qc_plan_describer d = {ahead_describe, pa};
    const struct qc_plan_program *prog = NULL;
    QC_TRY(qc_plan_make_edges(&d, j->choose_edges, j->cost0, &j->hw0, &j->par, &o->tiled, &prog,
                              &o->admit));
    if (o->admit.fits) {
        QC_TRY(qc_plan_make_room(prog, j->cost, &j->hw, &j->cal, &j->par, &o->cal, &o->room));
        o->have_cal = true;
        o->cal_par = j->cal;
        o->cal_hw = j->hw;
    }
    o->busy_s = now_s() - t0;
    return QC_OK;
}

/* The job, on the helper (helper_thread.h). */
static void ahead_job(void *arg)
{
    struct plan_ahead *pa = arg;
    pa->out = (struct plan_ahead_out){0};
    pa->st = run_job(pa, &pa->out);
}

enum qc_status plan_ahead_create(const struct qc_config *cfg, struct plan_ahead **out)
{
    *out = NULL;
    struct plan_ahead *pa = calloc(1, sizeof *pa);
    if (!pa)
        return qc_errorf(QC_ERR_NOMEM, "train: the planning-ahead helper");
    pa->cfg = *cfg;
    pa->cuda = cfg->device_kind == QC_CONFIG_DEVICE_CUDA;
    qc_plan_program_init(&pa->prog);
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    enum qc_status st = qc_qcnet_create_dry(&mc, &pa->dry);
    if (st != QC_OK) {
        qc_plan_program_free(&pa->prog);
        free(pa);
        return st;
    }
    st = helper_thread_init(&pa->h, ahead_job, pa, "the planning-ahead thread");
    if (st != QC_OK) {
        qc_qcnet_destroy(pa->dry);
        qc_plan_program_free(&pa->prog);
        free(pa);
        return st;
    }
    *out = pa;
    return QC_OK;
}

void plan_ahead_out_free(struct plan_ahead_out *o)
{
    qc_plan_result_free(&o->admit);
    qc_plan_result_free(&o->cal);
    qc_plan_cost_destroy(o->cost);
    memset(o, 0, sizeof *o);
}

/* Locked, not RUNNING: the result and the job's cost copy given back, IDLE. */
static void clear(struct plan_ahead *pa)
{
    if (pa->h.state == HELPER_DONE)
        plan_ahead_out_free(&pa->out);
    qc_plan_cost_destroy(pa->cost);
    pa->cost = NULL;
    memset(&pa->job, 0, sizeof pa->job);
    pa->h.state = HELPER_IDLE;
}

void plan_ahead_destroy(struct plan_ahead *pa)
{
    if (!pa)
        return;
    helper_thread_lock_idle(&pa->h);
    clear(pa);
    helper_thread_unlock(&pa->h);
    helper_thread_deinit(&pa->h);
    qc_qcnet_destroy(pa->dry);
    qc_plan_program_free(&pa->prog);
    free(pa->scenes);
    free(pa);
}

/* Whether batch b holds the scenes of the job's batch (pa->scenes), in order. */
static bool same_scenes(const struct plan_ahead *pa, const struct qc_batch *b)
{
    if (b->num_scenes != pa->nscenes)
        return false;
    for (int64_t i = 0; i < pa->nscenes; i++)
        if ((b->scene_index ? b->scene_index[i] : -1) != pa->scenes[i])
            return false;
    return true;
}

enum qc_status plan_ahead_start(struct plan_ahead *pa, const struct plan_ahead_job *job)
{
    struct qc_plan_cost *cost = NULL;
    enum qc_status st = qc_plan_cost_clone(job->cost, &cost);
    helper_thread_lock_idle(&pa->h);
    clear(pa);
    const int64_t n = job->batch->num_scenes;
    if (st == QC_OK && n > pa->cap_scenes) {
        int64_t *k = realloc(pa->scenes, (size_t)n * sizeof *k);
        if (k) {
            pa->scenes = k;
            pa->cap_scenes = n;
        } else {
            st =
                qc_errorf(QC_ERR_NOMEM, "train: the planning-ahead helper's %" PRId64 " scenes", n);
        }
    }
    if (st == QC_OK) {
        pa->nscenes = n;
        for (int64_t i = 0; i < n; i++)
            pa->scenes[i] = job->batch->scene_index ? job->batch->scene_index[i] : -1;
        pa->job = *job;
        pa->job.cost = cost;
        pa->cost = cost;
        helper_thread_start(&pa->h);
    } else {
        qc_plan_cost_destroy(cost);
    }
    helper_thread_unlock(&pa->h);
    return st;
}

bool plan_ahead_take(struct plan_ahead *pa, const struct qc_batch *b, uint64_t fixed_bytes,
                     const struct qc_plan_hw *hw0, const struct qc_plan_params *par,
                     struct qc_qcnet **dry, struct qc_plan_program *prog,
                     struct plan_ahead_out *out, double *waited_s)
{
    const double t0 = now_s();
    helper_thread_lock_idle(&pa->h);
    *waited_s = now_s() - t0;
    const bool made = pa->h.state == HELPER_DONE && pa->st == QC_OK && pa->job.batch == b &&
                      same_scenes(pa, b) && pa->job.fixed_bytes == fixed_bytes &&
                      plan_beside_same_hw(&pa->job.hw0, hw0) &&
                      plan_beside_same_params(&pa->job.par, par);
    if (made) {
        *out = pa->out;
        out->cost = pa->cost;
        pa->cost = NULL;
        pa->out = (struct plan_ahead_out){0};
        struct qc_qcnet *d = *dry;
        *dry = pa->dry;
        pa->dry = d;
        const struct qc_plan_program p = *prog;
        *prog = pa->prog;
        pa->prog = p;
    }
    clear(pa);
    helper_thread_unlock(&pa->h);
    return made;
}

void plan_ahead_drop(struct plan_ahead *pa)
{
    helper_thread_lock_idle(&pa->h);
    clear(pa);
    helper_thread_unlock(&pa->h);
}
