/*
 * prof.c — the profiler's recorder (qc_prof.h): per-thread event buffers, the block and pass
 * context, nesting of ops inside ops and parallel teams, interned names, and the readers.
 *
 * Invariants:
 *   - a thread writes only its own buffer (struct prof_thread, found through a thread-local
 *     pointer valid for the current generation); the list of buffers, the track table and
 *     the string table change under prof_mu;
 *   - generation g = number of resets: a thread whose thread-local generation differs
 *     registers a new buffer (the old one was freed by the reset);
 *   - top-level op ids are > 0 and unique within a session; a nested op's parent is one of
 *     them; weight = 1 / (team threads) for ops recorded while a team is open, else 1.
 */
#include "qc_prof.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "prof_internal.h"

#define PROF_CHUNK 4096 /* events per buffer chunk */

int qc_prof_active;

struct prof_chunk {
    struct prof_chunk *next;
    int n;
    struct qc_prof_event ev[PROF_CHUNK];
};

struct prof_thread {
    struct prof_thread *next;
    int32_t track;
    struct prof_chunk *head, *tail;
};

struct prof_str {
    struct prof_str *next;
    uint64_t hash;
    char s[]; /* NUL-terminated */
};

#define PROF_STR_BUCKETS 1024

static pthread_mutex_t prof_mu = PTHREAD_MUTEX_INITIALIZER;
static struct prof_thread *prof_threads;
static struct qc_prof_track_info *prof_track;
static int prof_ntrack, prof_captrack;
static struct prof_str *prof_strs[PROF_STR_BUCKETS];
static void *prof_streams[64]; /* the stream of each device track (index = order of use) */
static int32_t prof_stream_tracks[64];
static int prof_nstream;
static pthread_t prof_main;
static bool prof_main_set;
static atomic_uint_fast64_t prof_gen = 1;
static atomic_int_fast32_t prof_next_id;
static atomic_int_fast64_t prof_lost;

/* the dispatching thread's context, read by every recording thread */
static _Atomic(const char *) prof_block;
static atomic_int prof_pass;
static atomic_int prof_team_n;
static atomic_int_fast32_t prof_team_parent;

/* per thread */
static _Thread_local struct prof_thread *prof_tls;
static _Thread_local uint64_t prof_tls_gen;
static _Thread_local int prof_depth;   /* ops open on this thread */
static _Thread_local int32_t prof_top; /* id of this thread's open top-level op */

int64_t qc_prof_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// ---- tracks and strings (under prof_mu) -----------------------------------------------------

static int32_t track_add_locked(const char *name, bool device)
{
    if (prof_ntrack == prof_captrack) {
        int cap = prof_captrack ? 2 * prof_captrack : 16;
        struct qc_prof_track_info *t = realloc(prof_track, (size_t)cap * sizeof *t);
        if (!t)
            return -1;
        prof_track = t;
        prof_captrack = cap;
    }
    struct qc_prof_track_info *t = &prof_track[prof_ntrack];
    t->id = prof_ntrack;
    t->device = device;
    snprintf(t->name, sizeof t->name, "%s", name);
    return prof_ntrack++;
}

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static const char *intern(const char *s)
{
    if (!s)
        return NULL;
    const uint64_t h = str_hash(s);
    pthread_mutex_lock(&prof_mu);
    struct prof_str **b = &prof_strs[h % PROF_STR_BUCKETS], *p = *b;
    while (p && (p->hash != h || strcmp(p->s, s) != 0))
        p = p->next;
    if (!p) {
        const size_t n = strlen(s) + 1;
        p = malloc(sizeof *p + n);
        if (p) {
            p->hash = h;
            memcpy(p->s, s, n);
            p->next = *b;
            *b = p;
        }
    }
    pthread_mutex_unlock(&prof_mu);
    return p ? p->s : "?";
}

// ---- the calling thread's buffer -----------------------------------------------------------

static struct prof_thread *thread_get(void)
{
    const uint64_t gen = atomic_load_explicit(&prof_gen, memory_order_acquire);
    if (prof_tls && prof_tls_gen == gen)
        return prof_tls;
    struct prof_thread *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    pthread_mutex_lock(&prof_mu);
    char name[48];
    if (prof_main_set && pthread_equal(pthread_self(), prof_main))
        snprintf(name, sizeof name, "main");
    else
        snprintf(name, sizeof name, "thread %d", prof_ntrack);
    t->track = track_add_locked(name, false);
    t->next = prof_threads;
    prof_threads = t;
    pthread_mutex_unlock(&prof_mu);
    prof_tls = t;
    prof_tls_gen = gen;
    return t;
}

struct qc_prof_event *prof_event_new(void)
{
    struct prof_thread *t = thread_get();
    if (!t) {
        atomic_fetch_add(&prof_lost, 1);
        return NULL;
    }
    if (!t->tail || t->tail->n == PROF_CHUNK) {
        struct prof_chunk *c = malloc(sizeof *c);
        if (!c) {
            atomic_fetch_add(&prof_lost, 1);
            return NULL;
        }
        c->next = NULL;
        c->n = 0;
        if (t->tail)
            t->tail->next = c;
        else
            t->head = c;
        t->tail = c;
    }
    struct qc_prof_event *e = &t->tail->ev[t->tail->n++];
    memset(e, 0, sizeof *e);
    e->track = t->track;
    e->block = atomic_load_explicit(&prof_block, memory_order_relaxed);
    e->pass = (uint8_t)atomic_load_explicit(&prof_pass, memory_order_relaxed);
    e->weight = 1.0f;
    return e;
}

struct qc_prof_event *prof_event_last(void)
{
    struct prof_thread *t = thread_get();
    return t && t->tail && t->tail->n > 0 ? &t->tail->ev[t->tail->n - 1] : NULL;
}

// ---- session (the host half; prof_session.c adds the CUDA half) ------------------------------

void prof_host_start(void)
{
    pthread_mutex_lock(&prof_mu);
    prof_main = pthread_self();
    prof_main_set = true;
    pthread_mutex_unlock(&prof_mu);
}

void prof_host_reset(void)
{
    QC_ASSERT(!qc_prof_active, "prof: reset while recording");
    pthread_mutex_lock(&prof_mu);
    for (struct prof_thread *t = prof_threads, *nt; t; t = nt) {
        nt = t->next;
        for (struct prof_chunk *c = t->head, *nc; c; c = nc) {
            nc = c->next;
            free(c);
        }
        free(t);
    }
    prof_threads = NULL;
    free(prof_track);
    prof_track = NULL;
    prof_ntrack = prof_captrack = 0;
    for (int i = 0; i < PROF_STR_BUCKETS; i++)
        for (struct prof_str *p = prof_strs[i], *np; p; p = np) {
            np = p->next;
            free(p);
        }
    memset(prof_strs, 0, sizeof prof_strs);
    prof_nstream = 0;
    atomic_fetch_add_explicit(&prof_gen, 1, memory_order_release);
    pthread_mutex_unlock(&prof_mu);
    atomic_store(&prof_block, NULL);
    atomic_store(&prof_pass, QC_PROF_PASS_NONE);
    atomic_store(&prof_next_id, 0);
    atomic_store(&prof_lost, 0);
}

int32_t prof_stream_track(void *stream)
{
    pthread_mutex_lock(&prof_mu);
    int32_t track = -1;
    for (int i = 0; i < prof_nstream; i++)
        if (prof_streams[i] == stream)
            track = prof_stream_tracks[i];
    if (track < 0 && prof_nstream < (int)(sizeof prof_streams / sizeof *prof_streams)) {
        char name[48];
        snprintf(name, sizeof name, "cuda stream %d", prof_nstream);
        track = track_add_locked(name, true);
        prof_streams[prof_nstream] = stream;
        prof_stream_tracks[prof_nstream++] = track;
    }
    pthread_mutex_unlock(&prof_mu);
    return track < 0 ? 0 : track;
}

// ---- ops ------------------------------------------------------------------------------------

void qc_prof_op_begin(struct qc_prof_mark *m)
{
    const int team = atomic_load_explicit(&prof_team_n, memory_order_relaxed);
    m->id = m->parent = 0;
    m->weight = team > 1 ? 1.0f / (float)team : 1.0f;
    if (prof_depth > 0) {
        m->parent = prof_top;
    } else if (team > 0) {
        m->parent = (int32_t)atomic_load_explicit(&prof_team_parent, memory_order_relaxed);
    } else {
        m->id = (int32_t)atomic_fetch_add(&prof_next_id, 1) + 1;
        prof_top = m->id;
    }
    prof_depth++;
    m->t0 = qc_prof_now_ns();
}

void qc_prof_op_end(const struct qc_prof_mark *m, const struct qc_prof_op *op)
{
    const int64_t t1 = qc_prof_now_ns();
    prof_depth--;
    struct qc_prof_event *e = prof_event_new();
    if (!e)
        return;
    e->t0 = m->t0;
    e->t1 = t1;
    e->cat = QC_PROF_CAT_OP;
    e->name = op->name;
    e->dims = op->dims;
    memcpy(e->d, op->d, sizeof e->d);
    e->bytes = op->bytes;
    e->flops = op->flops;
    e->id = m->id;
    e->parent = m->parent;
    e->weight = m->weight;
}

void qc_prof_team_begin(int n)
{
    atomic_store_explicit(&prof_team_parent, prof_top, memory_order_relaxed);
    atomic_store_explicit(&prof_team_n, n, memory_order_release);
}

void qc_prof_team_end(void)
{
    atomic_store_explicit(&prof_team_n, 0, memory_order_release);
}

// ---- names ----------------------------------------------------------------------------------

const char *qc_prof_cat_str(enum qc_prof_cat cat)
{
    static const char *const names[QC_PROF_CAT_COUNT] = {"op",      "block", "phase", "loader",
                                                         "offload", "alloc", "optim"};
    return (unsigned)cat < QC_PROF_CAT_COUNT ? names[cat] : "?";
}

const char *qc_prof_pass_str(enum qc_prof_pass pass)
{
    static const char *const names[QC_PROF_PASS_COUNT] = {"", "forward", "backward", "recompute"};
    return (unsigned)pass < QC_PROF_PASS_COUNT ? names[pass] : "?";
}

// ---- spans ----------------------------------------------------------------------------------

void qc_prof_span_begin(struct qc_prof_mark *m, enum qc_prof_cat cat, const char *name,
                        enum qc_prof_pass pass)
{
    memset(m, 0, sizeof *m);
    m->name = intern(name);
    m->saved_block = atomic_load_explicit(&prof_block, memory_order_relaxed);
    m->saved_pass = (uint8_t)atomic_load_explicit(&prof_pass, memory_order_relaxed);
    if (cat == QC_PROF_CAT_BLOCK)
        atomic_store_explicit(&prof_block, m->name, memory_order_relaxed);
    /* a block's forward inside a recompute phase stays a recompute */
    const bool keep = pass == QC_PROF_PASS_FORWARD && m->saved_pass == QC_PROF_PASS_RECOMPUTE;
    if ((cat == QC_PROF_CAT_BLOCK || cat == QC_PROF_CAT_PHASE) && pass != QC_PROF_PASS_NONE &&
        !keep)
        atomic_store_explicit(&prof_pass, (int)pass, memory_order_relaxed);
    m->t0 = qc_prof_now_ns();
}

void qc_prof_span_end(const struct qc_prof_mark *m, enum qc_prof_cat cat, const char *detail,
                      double bytes)
{
    const int64_t t1 = qc_prof_now_ns();
    struct qc_prof_event *e = prof_event_new();
    if (e) {
        e->t0 = m->t0;
        e->t1 = t1;
        e->cat = (uint8_t)cat;
        e->name = m->name;
        e->detail = intern(detail);
        e->bytes = bytes;
        if (cat == QC_PROF_CAT_BLOCK)
            e->block = m->name;
    }
    atomic_store_explicit(&prof_block, m->saved_block, memory_order_relaxed);
    atomic_store_explicit(&prof_pass, (int)m->saved_pass, memory_order_relaxed);
}

void qc_prof_instant(enum qc_prof_cat cat, const char *name, const char *detail, double bytes,
                     double value)
{
    struct qc_prof_event *e = prof_event_new();
    if (!e)
        return;
    e->t0 = e->t1 = qc_prof_now_ns();
    e->cat = (uint8_t)cat;
    e->name = name;
    e->detail = intern(detail);
    e->bytes = bytes;
    e->value = value;
    e->instant = 1;
}

// ---- readers --------------------------------------------------------------------------------

const struct qc_prof_track_info *qc_prof_tracks(int *n)
{
    *n = prof_ntrack;
    return prof_track;
}

bool qc_prof_track_is_device(int32_t track)
{
    return track >= 0 && track < prof_ntrack && prof_track[track].device;
}

void qc_prof_foreach(void (*fn)(const struct qc_prof_event *e, void *ctx), void *ctx)
{
    for (struct prof_thread *t = prof_threads; t; t = t->next)
        for (struct prof_chunk *c = t->head; c; c = c->next)
            for (int i = 0; i < c->n; i++)
                fn(&c->ev[i], ctx);
}

void prof_foreach_pending(void (*fn)(struct qc_prof_event *e, void *ctx), void *ctx)
{
    for (struct prof_thread *t = prof_threads; t; t = t->next)
        for (struct prof_chunk *c = t->head; c; c = c->next)
            for (int i = 0; i < c->n; i++)
                if (c->ev[i].pending)
                    fn(&c->ev[i], ctx);
}

int64_t qc_prof_lost(void)
{
    return (int64_t)atomic_load(&prof_lost);
}

int64_t qc_prof_count(void)
{
    int64_t n = 0;
    for (struct prof_thread *t = prof_threads; t; t = t->next)
        for (struct prof_chunk *c = t->head; c; c = c->next)
            n += c->n;
    return n;
}
