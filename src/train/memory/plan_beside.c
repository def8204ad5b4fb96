/*
 * plan_beside.c — one plan made on a helper thread beside the trainer's own planning
 * (plan_beside.h).
 */
#include "plan_beside.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PB_IDLE = 0, PB_RUNNING, PB_DONE };

struct plan_beside {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the helper waits for a job or the end; the caller for DONE */
    int state;
    bool quit;
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

static void *beside_main(void *arg)
{
    struct plan_beside *pb = arg;
    pthread_mutex_lock(&pb->mu);
    for (;;) {
        while (!pb->quit && pb->state != PB_RUNNING)
            pthread_cond_wait(&pb->cv, &pb->mu);
        if (pb->quit)
            break;
        pthread_mutex_unlock(&pb->mu);
        /* the job's fields are the caller's to change only after DONE */
        struct qc_plan_result out = {0};
        bool ok = false;
        const enum qc_status st =
            qc_plan_make_room(pb->prog, pb->cost, &pb->hw, &pb->p, &pb->room, &out, &ok);
        pthread_mutex_lock(&pb->mu);
        pb->st = st;
        pb->out = out;
        pb->ok = ok;
        pb->state = PB_DONE;
        pthread_cond_broadcast(&pb->cv);
    }
    pthread_mutex_unlock(&pb->mu);
    return NULL;
}

enum qc_status plan_beside_create(struct plan_beside **out)
{
    *out = NULL;
    struct plan_beside *pb = calloc(1, sizeof *pb);
    if (!pb)
        return qc_errorf(QC_ERR_NOMEM, "train: the planning helper");
    int e = pthread_mutex_init(&pb->mu, NULL);
    if (e == 0) {
        e = pthread_cond_init(&pb->cv, NULL);
        if (e != 0)
            pthread_mutex_destroy(&pb->mu);
    }
    if (e == 0) {
        e = pthread_create(&pb->th, NULL, beside_main, pb);
        if (e != 0) {
            pthread_cond_destroy(&pb->cv);
            pthread_mutex_destroy(&pb->mu);
        }
    }
    if (e != 0) {
        free(pb);
        return qc_errorf(QC_ERR_NOMEM, "train: cannot start the planning helper thread: %s",
                         strerror(e));
    }
    *out = pb;
    return QC_OK;
}

/* Waits (mu held) until no plan runs. */
static void wait_done(struct plan_beside *pb)
{
    while (pb->state == PB_RUNNING)
        pthread_cond_wait(&pb->cv, &pb->mu);
}

/* mu held, not RUNNING: the result given back, IDLE. */
static void clear(struct plan_beside *pb)
{
    if (pb->state == PB_DONE)
        qc_plan_result_free(&pb->out);
    pb->state = PB_IDLE;
}

void plan_beside_destroy(struct plan_beside *pb)
{
    if (!pb)
        return;
    pthread_mutex_lock(&pb->mu);
    wait_done(pb);
    clear(pb);
    pb->quit = true;
    pthread_cond_broadcast(&pb->cv);
    pthread_mutex_unlock(&pb->mu);
    pthread_join(pb->th, NULL);
    pthread_cond_destroy(&pb->cv);
    pthread_mutex_destroy(&pb->mu);
    free(pb);
}

void plan_beside_start(struct plan_beside *pb, const struct qc_plan_program *prog,
                       const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                       const struct qc_plan_params *p, const struct qc_plan_params *room)
{
    pthread_mutex_lock(&pb->mu);
    wait_done(pb);
    clear(pb);
    pb->prog = prog;
    pb->cost = cost;
    pb->hw = *hw;
    pb->p = *p;
    pb->room = room ? *room : *p;
    pb->state = PB_RUNNING;
    pthread_cond_broadcast(&pb->cv);
    pthread_mutex_unlock(&pb->mu);
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
    pthread_mutex_lock(&pb->mu);
    wait_done(pb);
    *waited_s = now_s() - t0;
    const bool made = pb->state == PB_DONE && pb->st == QC_OK && pb->prog == prog &&
                      pb->cost == cost && plan_beside_same_hw(&pb->hw, hw) &&
                      plan_beside_same_params(&pb->p, p) &&
                      plan_beside_same_params(&pb->room, room ? room : p);
    if (made) {
        *out = pb->out;
        *ok = pb->ok;
        pb->out = (struct qc_plan_result){0};
    }
    clear(pb);
    pthread_mutex_unlock(&pb->mu);
    return made;
}

void plan_beside_drop(struct plan_beside *pb)
{
    pthread_mutex_lock(&pb->mu);
    wait_done(pb);
    clear(pb);
    pthread_mutex_unlock(&pb->mu);
}
