/*
 * qcnet_policy.c — the stash policies of a training step: where each block application's
 * stash lives between its forward and its backward (qc_qcnet_set_plan, qc_qcnet.h).
 *
 *   keep       the stash stays bound (nothing happens here).
 *   offload    after the last forward that reads it (the plan's fwd_last), each stash arena is
 *              put to the tier (qc_memctx_put: the copy runs on the offload engine's copy stream
 *              and the arena goes back to the allocator when the copy's event completes,
 *              stream-ordered). Before a backward, the offloaded stashes of the next backwards
 *              in the plan's order are fetched (qc_memctx_fetch on the copy-in stream), looking
 *              ahead as far as the stashes of those backwards (whatever their policy) fit the
 *              prefetch window (the next backward's always, unless the plan fetches nothing
 *              ahead: then each comes back at its own backward); a backward waits only on the
 *              fetches of the stashes it reads (qc_memctx_wait), and the host time of those
 *              waits is the stall.
 *   recompute  after the last forward use the arenas are freed; before the first backward that
 *              reads the stash, fresh memory is bound and the block's forward runs again from
 *              its inputs (qcnet_entry_redo, qcnet_recompute.c): Philox dropout is keyed by
 *              (seed, step, site, scene, element within the scene; qc_qcnet.h), so every byte
 *              comes back the same.
 *
 * A fetch that fails with QC_ERR_IO (an NVMe read error or a checksum mismatch: the engine
 * never hands out unverified bytes) is repaired by recompute: the stash is rebuilt from its
 * inputs, a warning names the block and the error, and the step goes on (counted in
 * m->repaired). Any other failure (out of memory) fails the step; the trainer re-plans.
 *
 * Invariant (checked at each backward): the entries the backward reads are LIVE when it runs,
 * and fetch_bytes = Σ stash bytes of the entries in state FETCH.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_memctx.h"
#include "qc_plan.h"
#include "qcnet_internal.h"

struct qcnet_plan {
    int n;                                 /* entries the plan covers */
    uint8_t policy[QCNET_MAX_ENTRIES];     /* enum qc_stash_policy */
    int32_t fwd_last[QCNET_MAX_ENTRIES];   /* entry after whose forward the stash can go */
    uint64_t name_hash[QCNET_MAX_ENTRIES]; /* the plan's block names (a check on the tape) */
    int32_t bwd_order[QCNET_MAX_ENTRIES];  /* entries in the order their backward runs */
    int nbwd;
    int bwd_cursor;     /* the next position of bwd_order */
    size_t window;      /* prefetch window, bytes */
    bool none;          /* nothing fetched ahead: each stash at its own backward */
    size_t fetch_bytes; /* stash bytes being fetched (state FETCH) */
    bool warned_full;   /* a tier refused a put this step (logged once) */
};

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

enum qc_status qc_qcnet_set_plan(struct qc_qcnet *m, const struct qc_plan_program *prog,
                                 const uint8_t *policy, size_t prefetch_window, bool prefetch_none)
{
    QC_ASSERT(!m->tape.active, "model: plan changed inside a step");
    if (!prog || !policy) {
        free(m->plan);
        m->plan = NULL;
        return QC_OK;
    }
    if (!prog->finished)
        return qc_errorf(QC_ERR_INVALID, "model plan: the program is not finished");
    if (prog->nblocks > QCNET_MAX_ENTRIES)
        return qc_errorf(QC_ERR_INVALID, "model plan: %d blocks (at most %d)", prog->nblocks,
                         QCNET_MAX_ENTRIES);
    bool offload = false;
    for (int32_t b = 0; b < prog->nblocks; b++) {
        if (policy[b] >= QC_POLICY_COUNT)
            return qc_errorf(QC_ERR_INVALID, "model plan: block %s: policy %d",
                             prog->blocks[b].name, policy[b]);
        offload |= policy[b] == QC_POLICY_OFFLOAD_HOST || policy[b] == QC_POLICY_OFFLOAD_NVME;
    }
    if (offload && !qc_memctx_can_offload(m->mc))
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "model plan: offload policies without an offload engine in the "
                         "model's memory context\nhint: plan.policy=keep or recompute");
    if (!m->plan && !(m->plan = calloc(1, sizeof *m->plan)))
        return qc_errorf(QC_ERR_NOMEM, "model plan: %zu bytes", sizeof *m->plan);
    struct qcnet_plan *p = m->plan;
    p->n = prog->nblocks;
    for (int32_t b = 0; b < prog->nblocks; b++) {
        p->policy[b] = policy[b];
        p->fwd_last[b] = prog->blocks[b].fwd_last;
        p->name_hash[b] = name_hash(prog->blocks[b].name);
    }
    p->nbwd = prog->nbwd;
    memcpy(p->bwd_order, prog->bwd_order, (size_t)prog->nbwd * sizeof *p->bwd_order);
    p->window = prefetch_window;
    p->none = prefetch_none;
    return QC_OK;
}

/* The plan in force for this step (NULL: keep everything). */
static struct qcnet_plan *active_plan(const struct qc_qcnet *m)
{
    return m->plan && m->tape.need_backward && !m->dry ? m->plan : NULL;
}

static size_t entry_bytes(struct qc_qcnet *m, int n)
{
    struct qc_stash *st[3];
    char tag[3][160];
    const int ns = qcnet_entry_stashes(m, n, st, tag);
    size_t b = 0;
    for (int i = 0; i < ns; i++)
        b += qc_stash_arena_bytes(st[i]);
    return b;
}

/* Evicts entry n's stash by its policy (after its last forward use). */
static enum qc_status evict(struct qc_qcnet *m, struct qcnet_plan *p, int n)
{
    struct qcnet_entry *e = &m->tape.e[n];
    struct qc_stash *st[3];
    char tag[3][160];
    const int ns = qcnet_entry_stashes(m, n, st, tag);
    const uint8_t pol = p->policy[n];
    if (pol == QC_POLICY_RECOMPUTE) {
        for (int i = 0; i < ns; i++) {
            qcnet_free(m, st[i]->arena);
            qc_stash_release(st[i]);
        }
        e->res = QCNET_RES_DROPPED;
        return QC_OK;
    }
    const enum qc_memctx_place place =
        pol == QC_POLICY_OFFLOAD_NVME ? QC_MEMCTX_NVME : QC_MEMCTX_HOST;
    for (int i = 0; i < ns; i++) {
        void *a = st[i]->arena;
        const size_t bytes = qc_stash_arena_bytes(st[i]);
        if (!a || bytes == 0)
            continue;
        const size_t nb = qcnet_buf_detach(m, a);
        uint64_t h = 0;
        enum qc_status s = qc_memctx_put(m->mc, QC_MEM_MODEL, a, nb, place, tag[i], &h);
        if (s == QC_ERR_NOMEM) { /* the tier is full: the rest of the entry stays */
            QC_TRY(qcnet_buf_attach(m, a, nb));
            if (!p->warned_full)
                qc_log(QC_LOG_WARN, "stash %s stays on the device: %s", tag[i], qc_error_last());
            p->warned_full = true;
            continue;
        }
        if (s != QC_OK) {
            (void)qcnet_buf_attach(m, a, nb);
            return s;
        }
        e->handle[i] = h;
        qc_stash_release(st[i]);
    }
    e->res = QCNET_RES_OUT;
    return QC_OK;
}

enum qc_status qcnet_policy_after_forward(struct qc_qcnet *m, int n)
{
    struct qcnet_plan *p = active_plan(m);
    if (!p)
        return QC_OK;
    if (n == 0) {
        p->bwd_cursor = 0;
        p->fetch_bytes = 0;
        p->warned_full = false;
    }
    if (n >= p->n || name_hash(m->tape.e[n].name) != p->name_hash[n])
        return qc_errorf(QC_ERR_INVALID,
                         "model plan: block application %d (%s) is not the plan's: the plan "
                         "was made for another batch or model",
                         n, m->tape.e[n].name);
    for (int k = 0; k <= n; k++)
        if (p->fwd_last[k] == n && p->policy[k] != QC_POLICY_KEEP &&
            m->tape.e[k].res == QCNET_RES_LIVE)
            QC_TRY(evict(m, p, k));
    return QC_OK;
}

/* Starts fetching offloaded entry n back; QC_ERR_IO leaves it DROPPED (repaired later by
 * recompute, with a warning), other errors fail. */
static enum qc_status fetch(struct qc_qcnet *m, struct qcnet_plan *p, int n)
{
    struct qcnet_entry *e = &m->tape.e[n];
    struct qc_stash *st[3];
    char tag[3][160];
    const int ns = qcnet_entry_stashes(m, n, st, tag);
    enum qc_status s = QC_OK;
    for (int i = 0; i < ns && s == QC_OK; i++) {
        if (!e->handle[i])
            continue;
        void *a = NULL;
        const size_t bytes = qc_stash_arena_bytes(st[i]);
        s = qc_memctx_fetch(m->mc, QC_MEM_MODEL, e->handle[i], bytes, tag[i], &a);
        if (s == QC_OK) {
            s = qcnet_buf_attach(m, a, bytes);
            if (s != QC_OK)
                qc_memctx_free(m->mc, QC_MEM_MODEL, a, bytes);
            else
                qc_stash_bind(st[i], a);
        }
    }
    if (s == QC_OK) {
        e->res = QCNET_RES_FETCH;
        p->fetch_bytes += entry_bytes(m, n);
        return QC_OK;
    }
    if (s != QC_ERR_IO)
        return s;
    /* repair: drop what came back, recompute before the backward that reads it */
    qc_log(QC_LOG_WARN, "stash of %s could not be read back, recomputing it: %s", e->name,
           qc_error_last());
    for (int i = 0; i < ns; i++) {
        if (st[i]->arena && e->handle[i]) {
            (void)qc_memctx_wait(m->mc, e->handle[i]);
            qcnet_free(m, st[i]->arena);
            qc_stash_release(st[i]);
        }
        qc_memctx_drop(m->mc, e->handle[i]);
        e->handle[i] = 0;
    }
    e->res = QCNET_RES_DROPPED;
    m->repaired++;
    return QC_OK;
}

/* Makes entry n's stash resident for a backward that reads it now. */
static enum qc_status make_resident(struct qc_qcnet *m, struct qcnet_plan *p, int n)
{
    struct qcnet_entry *e = &m->tape.e[n];
    if (e->res == QCNET_RES_OUT)
        QC_TRY(fetch(m, p, n));
    if (e->res == QCNET_RES_FETCH) {
        for (int i = 0; i < 3; i++) {
            if (!e->handle[i])
                continue;
            QC_TRY(qc_memctx_wait(m->mc, e->handle[i]));
            qc_memctx_drop(m->mc, e->handle[i]); /* on the device again: the tier copy goes */
            e->handle[i] = 0;
        }
        p->fetch_bytes -= entry_bytes(m, n);
        e->res = QCNET_RES_LIVE;
    }
    if (e->res == QCNET_RES_DROPPED) {
        /* its inputs first: an application's source context, a source context's edges */
        int need[3];
        const int nn = qcnet_entry_needs(m, n, need);
        for (int i = 1; i < nn; i++)
            QC_TRY(make_resident(m, p, need[i]));
        qc_memctx_mark_recompute(m->mc, e->name, entry_bytes(m, n));
        QC_TRY(qcnet_entry_redo(m, n));
        e->res = QCNET_RES_LIVE;
    }
    return QC_OK;
}

enum qc_status qcnet_policy_before_backward(struct qc_qcnet *m, int n)
{
    struct qcnet_plan *p = active_plan(m);
    if (!p)
        return QC_OK;
    if (p->bwd_cursor >= p->nbwd || p->bwd_order[p->bwd_cursor] != n)
        return qc_errorf(QC_ERR_INVALID,
                         "model plan: backward of %s at position %d, the plan's is another",
                         m->tape.e[n].name, p->bwd_cursor);
    const int pos = p->bwd_cursor++;
    int need[3];
    const int nn = qcnet_entry_needs(m, n, need);
    for (int i = 0; i < nn; i++)
        QC_TRY(make_resident(m, p, need[i]));
    /* prefetch: the offloaded stashes the next backwards read, looking ahead in the backward
     * order as far as their stashes (whatever their policy) fit the window; the next
     * backward's always, unless the plan fetches nothing ahead */
    size_t window_used = 0;
    for (int j = pos + 1; j < p->nbwd && !p->none; j++) {
        int ahead[3];
        const int na = qcnet_entry_needs(m, p->bwd_order[j], ahead);
        for (int i = 0; i < na; i++) {
            window_used += entry_bytes(m, ahead[i]);
            if (window_used > p->window && j > pos + 1)
                return QC_OK;
            if (m->tape.e[ahead[i]].res == QCNET_RES_OUT)
                QC_TRY(fetch(m, p, ahead[i]));
        }
    }
    return QC_OK;
}

void qcnet_policy_release(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    for (int n = 0; n < t->n_entries; n++) {
        struct qcnet_entry *e = &t->e[n];
        for (int i = 0; i < 3; i++) {
            qc_memctx_drop(m->mc, e->handle[i]);
            e->handle[i] = 0;
        }
        e->res = QCNET_RES_LIVE;
    }
    if (m->plan)
        m->plan->fetch_bytes = 0;
}
