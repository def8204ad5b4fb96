/*
 * memspec.c — memory specs of block calls (qc_memspec.h): filling, taking, replaying, reading.
 */
#include "qc_memspec.h"

#include <string.h>

#include "qc_exec.h" /* qc_op_zero on the block's backend */
#include "qc_oom.h"

// ---- filling ----------------------------------------------------------------------------------

void qc_memspec_init(struct qc_memspec *s)
{
    memset(s, 0, sizeof *s);
    memset(s->id, -1, sizeof s->id);
}

static bool homed(const struct qc_memspec_tensor *x)
{
    return x->home.f32 || x->home.i64;
}

/* What the tensor's home holds (NULL: nothing). */
static void *home_get(const struct qc_memspec_tensor *x)
{
    return x->home.f32 ? (void *)*x->home.f32 : x->home.i64 ? (void *)*x->home.i64 : NULL;
}

static void home_set(const struct qc_memspec_tensor *x, void *p)
{
    if (x->home.f32)
        *x->home.f32 = p;
    else
        *x->home.i64 = p;
}

static int tensor_add(struct qc_memspec *s, int id, const struct qc_block_mem *bm, const char *name,
                      size_t bytes, unsigned flags, struct qc_memspec_home home)
{
    QC_ASSERT(s->nt < QC_MEMSPEC_MAX, "memory spec: more than %d tensors (%s)", QC_MEMSPEC_MAX,
              name);
    QC_ASSERT(id < QC_MEMSPEC_IDS, "memory spec: id %d of %s", id, name);
    const int t = s->nt++;
    s->t[t] = (struct qc_memspec_tensor){bm, name, bytes, flags, home};
    s->p[t] = NULL;
    if (id >= 0) {
        QC_ASSERT(s->id[id] < 0, "memory spec: id %d given twice (%s)", id, name);
        s->id[id] = (int8_t)t;
    }
    return t;
}

static void event_add(struct qc_memspec *s, enum qc_memspec_op op, int t)
{
    QC_ASSERT(s->nev < 2 * QC_MEMSPEC_MAX, "memory spec: more than %d events", 2 * QC_MEMSPEC_MAX);
    s->ev[s->nev++] = (struct qc_memspec_event){(uint8_t)op, (uint8_t)t};
}

void qc_memspec_alloc(struct qc_memspec *s, int id, const struct qc_block_mem *bm, const char *name,
                      size_t bytes, unsigned flags, struct qc_memspec_home home)
{
    event_add(s, QC_MEMSPEC_ALLOC, tensor_add(s, id, bm, name, bytes, flags, home));
}

void qc_memspec_free(struct qc_memspec *s, int id)
{
    QC_ASSERT(id >= 0 && id < QC_MEMSPEC_IDS && s->id[id] >= 0, "memory spec: free of absent id %d",
              id);
    event_add(s, QC_MEMSPEC_FREE, s->id[id]);
}

void qc_memspec_free_home(struct qc_memspec *s, int id, const struct qc_block_mem *bm,
                          const char *name, size_t bytes, struct qc_memspec_home home)
{
    QC_ASSERT(home.f32 || home.i64, "memory spec: %s freed without a home", name);
    event_add(s, QC_MEMSPEC_FREE, tensor_add(s, id, bm, name, bytes, QC_MEMSPEC_HELD, home));
}

void qc_memspec_nest(struct qc_memspec *s, const struct qc_memspec *sub)
{
    const int base = s->nt;
    for (int i = 0; i < sub->nt; i++) {
        const struct qc_memspec_tensor *x = &sub->t[i];
        tensor_add(s, -1, x->bm, x->name, x->bytes, x->flags | QC_MEMSPEC_NESTED, x->home);
    }
    for (int i = 0; i < sub->nev; i++)
        event_add(s, (enum qc_memspec_op)sub->ev[i].op, base + sub->ev[i].t);
}

// ---- allocation -------------------------------------------------------------------------------

/* The memory of tensor t: allocated, zeroed when asked, at its home or in p[t]. */
static enum qc_status tensor_get(struct qc_memspec *s, int t)
{
    const struct qc_memspec_tensor *x = &s->t[t];
    void *p = qc_block_alloc(x->bm, x->bytes, x->name);
    if (!p)
        return qc_oom_errorf(QC_OOM_ATTENTION_UNKNOWN, "%s/%s: allocation of %zu bytes failed",
                             x->bm && x->bm->name[0] ? x->bm->name : "block", x->name, x->bytes);
    if ((x->flags & QC_MEMSPEC_ZERO) && x->bytes > 0)
        qc_op_zero(qc_block_exec(x->bm), p, x->bytes);
    if (homed(x)) {
        QC_ASSERT(!home_get(x), "memory spec: %s/%s allocated while its home holds one",
                  x->bm && x->bm->name[0] ? x->bm->name : "block", x->name);
        home_set(x, p);
    } else {
        s->p[t] = p;
    }
    return QC_OK;
}

static void tensor_put(struct qc_memspec *s, int t)
{
    const struct qc_memspec_tensor *x = &s->t[t];
    void *p = homed(x) ? home_get(x) : s->p[t];
    if (!p)
        return;
    qc_block_free(x->bm, p, x->bytes);
    if (homed(x))
        home_set(x, NULL);
    else
        s->p[t] = NULL;
}

enum qc_status qc_memspec_take(struct qc_memspec *s, int id, void **out)
{
    *out = NULL;
    QC_ASSERT(id >= 0 && id < QC_MEMSPEC_IDS, "memory spec: take of id %d", id);
    const int t = s->id[id];
    if (t < 0)
        return QC_OK;
    if (s->t[t].flags & QC_MEMSPEC_HELD) {
        *out = home_get(&s->t[t]);
        return QC_OK;
    }
    /* the real code allocates in the spec's order: the next ALLOC that is not nested */
    while (s->cursor < s->nev && (s->ev[s->cursor].op != QC_MEMSPEC_ALLOC ||
                                  (s->t[s->ev[s->cursor].t].flags & QC_MEMSPEC_NESTED)))
        s->cursor++;
    QC_ASSERT(s->cursor < s->nev && s->ev[s->cursor].t == t,
              "memory spec: %s/%s taken out of the spec's order (next: %s)",
              s->t[t].bm && s->t[t].bm->name[0] ? s->t[t].bm->name : "block", s->t[t].name,
              s->cursor < s->nev ? s->t[s->ev[s->cursor].t].name : "none");
    s->cursor++;
    QC_TRY(tensor_get(s, t));
    *out = homed(&s->t[t]) ? home_get(&s->t[t]) : s->p[t];
    return QC_OK;
}

void qc_memspec_give(struct qc_memspec *s, int id)
{
    QC_ASSERT(id >= 0 && id < QC_MEMSPEC_IDS, "memory spec: give of id %d", id);
    if (s->id[id] >= 0)
        tensor_put(s, s->id[id]);
}

void qc_memspec_give_all(struct qc_memspec *s)
{
    for (int t = s->nt - 1; t >= 0; t--)
        if (!homed(&s->t[t]) && s->p[t])
            tensor_put(s, t);
}

// ---- replay -----------------------------------------------------------------------------------

enum qc_status qc_memspec_replay(struct qc_memspec *s)
{
    for (int i = 0; i < s->nev; i++) {
        const int t = s->ev[i].t;
        if (s->ev[i].op == QC_MEMSPEC_FREE) {
            tensor_put(s, t);
            continue;
        }
        const enum qc_status st = tensor_get(s, t);
        if (st != QC_OK) {
            qc_memspec_give_all(s);
            return st;
        }
    }
    return QC_OK;
}

// ---- reading ------------------------------------------------------------------------------------

size_t qc_memspec_transient_peak(const struct qc_memspec *s)
{
    size_t live = 0, peak = 0;
    for (int i = 0; i < s->nev; i++) {
        const struct qc_memspec_tensor *x = &s->t[s->ev[i].t];
        if (homed(x))
            continue;
        const size_t b = x->bytes ? x->bytes : 1;
        if (s->ev[i].op == QC_MEMSPEC_ALLOC) {
            live += b;
            peak = live > peak ? live : peak;
        } else {
            live -= b;
        }
    }
    return peak;
}

int64_t qc_memspec_home_delta(const struct qc_memspec *s)
{
    int64_t d = 0;
    for (int i = 0; i < s->nev; i++) {
        const struct qc_memspec_tensor *x = &s->t[s->ev[i].t];
        if (homed(x))
            d += s->ev[i].op == QC_MEMSPEC_ALLOC ? (int64_t)x->bytes : -(int64_t)x->bytes;
    }
    return d;
}
