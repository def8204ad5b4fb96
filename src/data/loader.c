/*
 * loader.c — background batch loader (qc_loader.h): epoch plans, worker threads that read,
 * collate and build graphs ahead of the consumer, and hand batches over in plan order.
 *
 * Invariants (under mu): 0 ≤ consumed ≤ next_job ≤ nb; a job j is started only while
 * j < consumed + window; slots[j].done once its worker finished; a worker whose job belongs to
 * an older generation (epoch restarted meanwhile) discards its batch.
 */
#include "qc_loader.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qc_pinned.h"
#include "qc_prof.h"
#include "qc_rand.h"
#include "qc_qcshard.h"
#include "qc_synth.h"

void qc_loader_opts_default(struct qc_loader_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->batch_size = 4;
    o->threads = 0;
    o->prefetch_batches = 2;
    o->shuffle = true;
    o->with_target = true;
    o->build_graph = true;
    o->seed = 2023;
    o->rank = 0;
    o->world_size = 1;
    o->groups_per_rank = 1;
    qc_graph_params_default(&o->graph);
    o->synthetic_scenes = 1024;
    o->synthetic_profile = QC_SYNTH_TYPICAL;
    o->synthetic_seed = 2023;
}

// ---- pinned hook -------------------------------------------------------------------------

static void *pinned_hook_alloc(void *ctx, size_t bytes)
{
    void *p = NULL;
    if (qc_pinned_malloc(ctx, bytes, 64, "loader batch", &p) != QC_OK) {
        /* the hook can only say NULL: the cause (budget, a refused pin) is logged here */
        qc_log(QC_LOG_ERROR, "loader: %s", qc_error_last());
        return NULL;
    }
    return p;
}

static void pinned_hook_free(void *ctx, void *p, size_t bytes)
{
    (void)bytes;
    qc_pinned_free(ctx, p);
}

void qc_host_alloc_pinned(struct qc_pinned *p, struct qc_host_alloc *out)
{
    out->alloc = pinned_hook_alloc;
    out->free = pinned_hook_free;
    out->ctx = p;
}

// ---- planning ------------------------------------------------------------------------------

int64_t qc_loader_cost_estimate(int64_t num_agents, int64_t num_polygons, int64_t num_points,
                                int64_t num_pl2pl)
{
    int64_t A = num_agents, P = num_polygons;
    return num_points + num_pl2pl + P * P + 240 * A + 11 * A * P + 10 * A * A;
}

struct costpos {
    int64_t cost, pos;
};

static int costpos_cmp(const void *a, const void *b)
{
    const struct costpos *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1; /* largest first */
    return (x->pos > y->pos) - (x->pos < y->pos);
}

int64_t qc_loader_plan_epoch(int64_t n, const int64_t *cost, uint64_t seed, int64_t epoch,
                             bool shuffle, int64_t batch_size, int64_t groups_per_rank,
                             int64_t rank, int64_t world_size, bool balance_cost, bool drop_last,
                             int64_t *ptr, int64_t *idx)
{
    const int64_t W = world_size, B = batch_size, P = world_size * groups_per_rank;
    ptr[0] = 0;
    if (n <= 0)
        return 0;
    int64_t *order = malloc((size_t)n * sizeof(int64_t));
    QC_ASSERT(order, "out of memory planning %lld scenes", (long long)n);
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    if (shuffle) {
        uint64_t s = seed ^ (0x632be59bd9b4e019ull * (uint64_t)(epoch + 1));
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(qc_splitmix64(&s) % (uint64_t)(i + 1));
            int64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    /* steps of P groups of B scenes; within a step, group j of the step goes to rank j mod W */
    const int64_t S = P * B;
    struct costpos *cp = malloc((size_t)S * sizeof(*cp));
    int64_t *load = calloc((size_t)P, sizeof(int64_t));
    int64_t *room = calloc((size_t)P, sizeof(int64_t));
    int64_t *own = malloc((size_t)S * sizeof(int64_t));
    QC_ASSERT(cp && load && room && own, "out of memory planning");
    int64_t nb = 0, k = 0;
    for (int64_t s0 = 0; s0 < n; s0 += S) {
        int64_t ws = n - s0 < S ? n - s0 : S;
        if (drop_last)
            ws = ws / B * B; /* the short group of the epoch's last step is dropped */
        const int64_t q = (ws + B - 1) / B; /* groups of this step */
        if (q == 0)
            break;
        for (int64_t j = 0; j < q; j++) {
            room[j] = j + 1 < q ? B : ws - (q - 1) * B;
            load[j] = 0;
        }
        if (!balance_cost) {
            for (int64_t i = 0; i < ws; i++)
                own[i] = i / B;
        } else {
            for (int64_t i = 0; i < ws; i++) {
                cp[i].pos = i;
                cp[i].cost = cost ? cost[order[s0 + i]] : 1;
            }
            qsort(cp, (size_t)ws, sizeof(*cp), costpos_cmp);
            for (int64_t i = 0; i < ws; i++) {
                int64_t best = -1;
                for (int64_t j = 0; j < q; j++)
                    if (room[j] > 0 && (best < 0 || load[j] < load[best]))
                        best = j;
                own[cp[i].pos] = best;
                load[best] += cp[i].cost;
                room[best]--;
            }
        }
        for (int64_t j = rank; j < q; j += W) {
            for (int64_t i = 0; i < ws; i++)
                if (own[i] == j)
                    idx[k++] = order[s0 + i];
            ptr[++nb] = k;
        }
    }
    free(cp);
    free(load);
    free(room);
    free(own);
    free(order);
    return nb;
}

int64_t qc_loader_plan_groups(int64_t n, int64_t batch_size, bool drop_last)
{
    if (n <= 0)
        return 0;
    return drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
}

// ---- the loader ----------------------------------------------------------------------------

struct slot {
    struct qc_batch *batch;
    enum qc_status st;
    char *err;
    bool done;
};

struct worker {
    struct qc_loader *l;
    pthread_t th;
    struct qc_graph_builder *gb;
    struct qc_scene *scenes;    /* (B) */
    const struct qc_scene **sp; /* (B) pointers to scenes */
    bool started;
};

struct qc_loader {
    struct qc_loader_opts o;
    int nfiles;
    struct qc_qcshard_reader **readers;
    int64_t *first; /* (nfiles + 1) global index of each file's first scene */
    int64_t nscenes;
    int64_t *cost; /* (nscenes) */

    int64_t nb;   /* batches of the current epoch */
    int64_t *ptr; /* (nb + 1) */
    int64_t *idx;
    int64_t plan_cap;

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    int64_t next_job, consumed, inflight, window;
    uint64_t generation;
    bool stop;
    struct slot *slots; /* (nb) */
    int nthreads;
    struct worker *w;
};

int64_t qc_loader_num_scenes(const struct qc_loader *l)
{
    return l->nscenes;
}

int64_t qc_loader_num_batches(const struct qc_loader *l)
{
    return l->nb;
}

int64_t qc_loader_num_groups(const struct qc_loader *l)
{
    return qc_loader_plan_groups(l->nscenes, l->o.batch_size, l->o.drop_last);
}

void qc_loader_plan(const struct qc_loader *l, const int64_t **ptr, const int64_t **idx)
{
    *ptr = l->ptr;
    *idx = l->idx;
}

/* Reads the scenes idx[0 .. nbs) into scenes (sp pointing at them), collates and builds with
 * gb; *out owns the batch on QC_OK. */
static enum qc_status build_batch(struct qc_loader *l, struct qc_graph_builder *gb,
                                  struct qc_scene *scenes, const struct qc_scene **sp,
                                  const int64_t *idx, int64_t nbs, struct qc_batch **out)
{
    enum qc_status rc = QC_OK;
    int64_t got = 0;
    for (; got < nbs && rc == QC_OK; got++) {
        int64_t g = idx[got];
        if (g < 0 || g >= l->nscenes) {
            rc = qc_errorf(QC_ERR_INVALID, "loader: scene %lld of %lld", (long long)g,
                           (long long)l->nscenes);
        } else if (l->nfiles == 0) {
            rc = qc_synth_scene(l->o.synthetic_seed, g,
                                (enum qc_synth_profile)l->o.synthetic_profile, &scenes[got]);
        } else {
            int f = 0;
            while (g >= l->first[f + 1])
                f++;
            rc = qc_qcshard_reader_scene(l->readers[f], g - l->first[f], &scenes[got]);
        }
        sp[got] = &scenes[got];
    }
    if (rc != QC_OK)
        got--; /* the failed one holds nothing */
    struct qc_batch *batch = NULL;
    if (rc == QC_OK) {
        batch = calloc(1, sizeof(*batch));
        if (!batch)
            rc = qc_errorf(QC_ERR_NOMEM, "loader: out of memory");
    }
    if (rc == QC_OK)
        rc = qc_batch_collate(sp, nbs, l->o.alloc.alloc ? &l->o.alloc : NULL, l->o.with_target,
                              batch);
    if (rc == QC_OK) {
        for (int64_t i = 0; i < nbs; i++)
            batch->scene_index[i] = idx[i];
        if (l->o.build_graph)
            rc = qc_batch_build_graph(batch, gb, &l->o.graph);
        if (rc != QC_OK)
            qc_batch_release(batch);
    }
    for (int64_t i = 0; i < got; i++)
        qc_scene_free(&scenes[i]);
    if (rc != QC_OK) {
        free(batch);
        return rc;
    }
    *out = batch;
    return QC_OK;
}

/* Reads the scenes of job j, collates and builds; *out owns the batch on QC_OK. */
static enum qc_status build_job(struct worker *w, int64_t j, struct qc_batch **out)
{
    struct qc_loader *l = w->l;
    const int64_t b0 = l->ptr[j];
    return build_batch(l, w->gb, w->scenes, w->sp, l->idx + b0, l->ptr[j + 1] - b0, out);
}

enum qc_status qc_loader_build(struct qc_loader *l, const int64_t *idx, int64_t n,
                               struct qc_batch **out)
{
    if (n < 1)
        return qc_errorf(QC_ERR_INVALID, "loader: a batch of %lld scenes", (long long)n);
    struct qc_scene *scenes = calloc((size_t)n, sizeof *scenes);
    const struct qc_scene **sp = calloc((size_t)n, sizeof *sp);
    struct qc_graph_builder *gb = NULL;
    enum qc_status rc = scenes && sp ? qc_graph_builder_create(&gb)
                                     : qc_errorf(QC_ERR_NOMEM, "loader: out of memory");
    if (rc == QC_OK)
        rc = build_batch(l, gb, scenes, sp, idx, n, out);
    qc_graph_builder_destroy(gb);
    free(scenes);
    free(sp);
    return rc;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct qc_loader *l = w->l;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !(l->next_job < l->nb && l->next_job < l->consumed + l->window))
            pthread_cond_wait(&l->cv_work, &l->mu);
        if (l->stop)
            break;
        int64_t j = l->next_job++;
        uint64_t gen = l->generation;
        l->inflight++;
        pthread_mutex_unlock(&l->mu);

        struct qc_batch *batch = NULL;
        enum qc_status st = build_job(w, j, &batch);
        char *err = st == QC_OK ? NULL : strdup(qc_error_last());

        pthread_mutex_lock(&l->mu);
        l->inflight--;
        if (gen == l->generation) {
            l->slots[j].batch = batch;
            l->slots[j].st = st;
            l->slots[j].err = err;
            l->slots[j].done = true;
        } else {
            if (batch) {
                qc_batch_release(batch);
                free(batch);
            }
            free(err);
        }
        pthread_cond_broadcast(&l->cv_done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void free_slots(struct qc_loader *l, int64_t from)
{
    for (int64_t j = from; l->slots && j < l->nb; j++) {
        if (l->slots[j].batch) {
            qc_batch_release(l->slots[j].batch);
            free(l->slots[j].batch);
        }
        free(l->slots[j].err);
        memset(&l->slots[j], 0, sizeof(l->slots[j]));
    }
}

void qc_loader_destroy(struct qc_loader *l)
{
    if (!l)
        return;
    if (l->w) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
        for (int i = 0; i < l->nthreads; i++) {
            if (l->w[i].started)
                pthread_join(l->w[i].th, NULL);
            qc_graph_builder_destroy(l->w[i].gb);
            free(l->w[i].scenes);
            free(l->w[i].sp);
        }
        free(l->w);
    }
    free_slots(l, l->consumed);
    free(l->slots);
    for (int f = 0; f < l->nfiles; f++)
        qc_qcshard_reader_destroy(l->readers[f]);
    free(l->readers);
    free(l->first);
    free(l->cost);
    free(l->ptr);
    free(l->idx);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_done);
    free(l);
}

static enum qc_status check_opts(const struct qc_loader_opts *o)
{
    if (o->batch_size < 1 || o->prefetch_batches < 1 || o->threads < 0 || o->world_size < 1 ||
        o->rank < 0 || o->rank >= o->world_size || o->groups_per_rank < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "loader: bad options (batch_size %lld >= 1, prefetch_batches %lld >= 1, "
                         "threads %lld >= 0, rank %lld in [0, world_size %lld), groups_per_rank "
                         "%lld >= 1)",
                         (long long)o->batch_size, (long long)o->prefetch_batches,
                         (long long)o->threads, (long long)o->rank, (long long)o->world_size,
                         (long long)o->groups_per_rank);
    if ((o->alloc.alloc == NULL) != (o->alloc.free == NULL))
        return qc_errorf(QC_ERR_INVALID, "loader: allocator hook needs both alloc and free");
    return QC_OK;
}

/* Scene costs: from the qcshard index, or by generating each synthetic scene once. */
static enum qc_status compute_costs(struct qc_loader *l)
{
    l->cost = malloc((size_t)(l->nscenes > 0 ? l->nscenes : 1) * sizeof(int64_t));
    if (!l->cost)
        return qc_errorf(QC_ERR_NOMEM, "loader: out of memory");
    for (int64_t g = 0; g < l->nscenes; g++) {
        if (l->nfiles > 0) {
            int f = 0;
            while (g >= l->first[f + 1])
                f++;
            struct qc_qcshard_entry e;
            QC_TRY(qc_qcshard_reader_entry(l->readers[f], g - l->first[f], &e));
            l->cost[g] =
                qc_loader_cost_estimate(e.num_agents, e.num_polygons, e.num_points, e.num_pl2pl);
        } else if (l->o.balance_cost) {
            struct qc_scene s;
            QC_TRY(qc_synth_scene(l->o.synthetic_seed, g,
                                  (enum qc_synth_profile)l->o.synthetic_profile, &s));
            l->cost[g] =
                qc_loader_cost_estimate(s.num_agents, s.num_polygons, s.num_points, s.num_pl2pl);
            qc_scene_free(&s);
        } else {
            l->cost[g] = 1;
        }
    }
    return QC_OK;
}

enum qc_status qc_loader_create(const char *const *paths, int npaths,
                                const struct qc_loader_opts *opts, struct qc_loader **out)
{
    QC_TRY(check_opts(opts));
    struct qc_loader *l = calloc(1, sizeof(*l));
    if (!l)
        return qc_errorf(QC_ERR_NOMEM, "loader: out of memory");
    l->o = *opts;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_done, NULL);
    enum qc_status rc = QC_OK;
    l->readers = calloc((size_t)npaths + 1, sizeof(*l->readers));
    l->first = calloc((size_t)npaths + 2, sizeof(int64_t));
    if (!l->readers || !l->first)
        rc = qc_errorf(QC_ERR_NOMEM, "loader: out of memory");
    for (int f = 0; rc == QC_OK && f < npaths; f++) {
        rc = qc_qcshard_reader_create(paths[f], &l->readers[f]);
        if (rc == QC_OK) {
            l->nfiles++;
            l->first[f + 1] = l->first[f] + qc_qcshard_reader_count(l->readers[f]);
        }
    }
    if (rc == QC_OK) {
        l->nscenes = npaths > 0 ? l->first[npaths] : opts->synthetic_scenes;
        if (npaths == 0)
            l->first[1] = l->nscenes;
        rc = compute_costs(l);
    }
    if (rc == QC_OK) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        l->nthreads = opts->threads > 0 ? (int)opts->threads : (int)(ncpu > 0 ? ncpu : 1);
        l->window = opts->prefetch_batches;
        l->w = calloc((size_t)l->nthreads, sizeof(*l->w));
        if (!l->w)
            rc = qc_errorf(QC_ERR_NOMEM, "loader: out of memory");
    }
    for (int i = 0; rc == QC_OK && i < l->nthreads; i++) {
        struct worker *w = &l->w[i];
        w->l = l;
        w->scenes = calloc((size_t)opts->batch_size, sizeof(*w->scenes));
        w->sp = calloc((size_t)opts->batch_size, sizeof(*w->sp));
        if (!w->scenes || !w->sp)
            rc = qc_errorf(QC_ERR_NOMEM, "loader: out of memory");
        if (rc == QC_OK)
            rc = qc_graph_builder_create(&w->gb);
        if (rc == QC_OK) {
            int e = pthread_create(&w->th, NULL, worker_main, w);
            if (e != 0)
                rc = qc_errorf(QC_ERR_NOMEM, "loader: cannot start worker thread %d: %s", i,
                               strerror(e));
            else
                w->started = true;
        }
    }
    if (rc != QC_OK) {
        qc_loader_destroy(l);
        return rc;
    }
    *out = l;
    return QC_OK;
}

enum qc_status qc_loader_start_epoch(struct qc_loader *l, int64_t epoch)
{
    pthread_mutex_lock(&l->mu);
    l->generation++;
    /* no new job may start; wait for the running ones (they discard their result) */
    l->next_job = l->nb;
    while (l->inflight > 0)
        pthread_cond_wait(&l->cv_done, &l->mu);
    free_slots(l, l->consumed);
    free(l->slots);
    l->slots = NULL;
    l->nb = 0;
    l->next_job = l->consumed = 0;
    pthread_mutex_unlock(&l->mu);

    /* workers are idle (nb == 0): plan outside the lock */
    int64_t cap = l->nscenes + 2;
    if (cap > l->plan_cap) {
        int64_t *p = realloc(l->ptr, (size_t)cap * sizeof(int64_t));
        if (p)
            l->ptr = p;
        int64_t *x = realloc(l->idx, (size_t)cap * sizeof(int64_t));
        if (x)
            l->idx = x;
        if (!p || !x)
            return qc_errorf(QC_ERR_NOMEM, "loader: out of memory planning epoch %lld",
                             (long long)epoch);
        l->plan_cap = cap;
    }
    int64_t nb = qc_loader_plan_epoch(
        l->nscenes, l->cost, l->o.seed, epoch, l->o.shuffle, l->o.batch_size, l->o.groups_per_rank,
        l->o.rank, l->o.world_size, l->o.balance_cost, l->o.drop_last, l->ptr, l->idx);
    struct slot *slots = calloc((size_t)(nb > 0 ? nb : 1), sizeof(*slots));
    if (!slots)
        return qc_errorf(QC_ERR_NOMEM, "loader: out of memory planning epoch %lld",
                         (long long)epoch);
    pthread_mutex_lock(&l->mu);
    l->slots = slots;
    l->nb = nb;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    return QC_OK;
}

static enum qc_status loader_next(struct qc_loader *l, struct qc_batch **out)
{
    pthread_mutex_lock(&l->mu);
    if (l->consumed >= l->nb) {
        pthread_mutex_unlock(&l->mu);
        *out = NULL;
        return QC_OK;
    }
    int64_t j = l->consumed;
    while (!l->slots[j].done)
        pthread_cond_wait(&l->cv_done, &l->mu);
    struct slot s = l->slots[j];
    memset(&l->slots[j], 0, sizeof(l->slots[j]));
    l->consumed++;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    if (s.st != QC_OK) {
        enum qc_status st =
            qc_errorf(s.st, "loader: batch %lld: %s", (long long)j, s.err ? s.err : "(no message)");
        free(s.err);
        return st;
    }
    *out = s.batch;
    return QC_OK;
}

void qc_loader_release(struct qc_loader *l, struct qc_batch *batch)
{
    (void)l;
    if (!batch)
        return;
    qc_batch_release(batch);
    free(batch);
}

enum qc_status qc_loader_next(struct qc_loader *l, struct qc_batch **out)
{
    if (!qc_prof_on())
        return loader_next(l, out);
    /* the profiler's span: how long the trainer waited for the batch */
    struct qc_prof_mark m;
    qc_prof_span_begin(&m, QC_PROF_CAT_LOADER, "loader_wait", QC_PROF_PASS_NONE);
    const enum qc_status st = loader_next(l, out);
    qc_prof_span_end(&m, QC_PROF_CAT_LOADER, NULL, 0);
    return st;
}
