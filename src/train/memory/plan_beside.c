/*
 * plan_beside.c — one plan made on a helper thread beside the trainer's own planning
 * (plan_beside.h).
 */
#include "plan_beside.h"

#include <stdlib.h>
#include <time.h>

#include "helper_thread.h"

struct plan_beside {
    struct helper_thread h;
    /* the job (RUNNING) */
    const struct qc_plan_program *prog;
    const struct qc_plan_cost *cost;
    struct qc_plan_hw hw;
    struct qc_plan_params p, room;
    /* its result (DONE) */
    enum qc_status st;
    struct qc_plan_result out;
    bool ok;
};

/* The job, on the helper: the job's fields are the caller's to change only after DONE. */
static void beside_job(void *arg)
{
    struct plan_beside *pb = arg;
    pb->out = (struct qc_plan_result){0};
    pb->ok = false;
    pb->st = qc_plan_make_room(pb->prog, pb->cost, &pb->hw, &pb->p, &pb->room, &pb->out, &pb->ok);
}

enum qc_status plan_beside_create(struct plan_beside **out)
{
    *out = NULL;
    struct plan_beside *pb = calloc(1, sizeof *pb);
    if (!pb)
        return qc_errorf(QC_ERR_NOMEM, "train: the planning helper");
    const enum qc_status st =
        helper_thread_init(&pb->h, beside_job, pb, "the planning helper thread");
    if (st != QC_OK) {
        free(pb);
        return st;
    }
    *out = pb;
    return QC_OK;
}

/* Locked, not RUNNING: the result given back, IDLE. */
static void clear(struct plan_beside *pb)
{
    if (pb->h.state == HELPER_DONE)
        qc_plan_result_free(&pb->out);
    pb->h.state = HELPER_IDLE;
}

void plan_beside_destroy(struct plan_beside *pb)
{
    if (!pb)
        return;
    helper_thread_lock_idle(&pb->h);
    clear(pb);
    helper_thread_unlock(&pb->h);
    helper_thread_deinit(&pb->h);
    free(pb);
}

void plan_beside_start(struct plan_beside *pb, const struct qc_plan_program *prog,
                       const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                       const struct qc_plan_params *p, const struct qc_plan_params *room)
{
    helper_thread_lock_idle(&pb->h);
    clear(pb);
    pb->prog = prog;
    pb->cost = cost;
    pb->hw = *hw;
    pb->p = *p;
    pb->room = room ? *room : *p;
    helper_thread_start(&pb->h);
    helper_thread_unlock(&pb->h);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Field by field (the structs have padding); the sizes pin the fields compared. */
_Static_assert(sizeof(struct qc_plan_hw) == 56 && sizeof(struct qc_plan_params) == 56,
               "plan_beside: compare the new fields of qc_plan_hw / qc_plan_params");

bool plan_beside_same_hw(const struct qc_plan_hw *a, const struct qc_plan_hw *b)
{
    return a->d2h_gbps == b->d2h_gbps && a->h2d_gbps == b->h2d_gbps &&
           a->nvme_write_gbps == b->nvme_write_gbps && a->nvme_read_gbps == b->nvme_read_gbps &&
           a->host_capacity == b->host_capacity && a->nvme_capacity == b->nvme_capacity &&
           a->serial_copies == b->serial_copies;
}

bool plan_beside_same_params(const struct qc_plan_params *a, const struct qc_plan_params *b)
{
    return a->budget == b->budget && a->margin == b->margin && a->round == b->round &&
           a->prefetch_window == b->prefetch_window && a->prefetch_none == b->prefetch_none &&
           a->mode == b->mode && a->place == b->place && a->min_stash == b->min_stash;
}

bool plan_beside_take(struct plan_beside *pb, const struct qc_plan_program *prog,
                      const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                      const struct qc_plan_params *p, const struct qc_plan_params *room,
                      struct qc_plan_result *out, bool *ok, double *waited_s)
{
    const double t0 = now_s();
    helper_thread_lock_idle(&pb->h);
    *waited_s = now_s() - t0;
    const bool made = pb->h.state == HELPER_DONE && pb->st == QC_OK && pb->prog == prog &&
                      pb->cost == cost && plan_beside_same_hw(&pb->hw, hw) &&
                      plan_beside_same_params(&pb->p, p) &&
                      plan_beside_same_params(&pb->room, room ? room : p);
    if (made) {
        *out = pb->out;
        *ok = pb->ok;
        pb->out = (struct qc_plan_result){0};
    }
    clear(pb);
    helper_thread_unlock(&pb->h);
    return made;
}

void plan_beside_drop(struct plan_beside *pb)
{
    helper_thread_lock_idle(&pb->h);
    clear(pb);
    helper_thread_unlock(&pb->h);
}
