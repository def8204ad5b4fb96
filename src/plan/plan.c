/*
 * plan.c — the planner (qc_plan.h): the program compiled into positions, one simulation of a
 * policy vector (peak of device bytes, step time), and the greedy of PLANNER.md.
 *
 * The simulation follows what the model does at run time (src/model/qcnet_policy.c): a stash
 * is allocated when its block's forward begins; after the last forward that reads it, an
 * offloaded stash is put on the device-to-host queue and its device memory is given back when
 * the copy ends (counted until the next span begins after that), a recomputed one is freed at
 * once; before a backward, the stashes it reads are made resident (fetched and waited for, or
 * recomputed after their own inputs), then the next offloaded stashes in the backward order
 * are fetched while they fit the prefetch window; a stash is freed at the end of its own
 * backward. The copy queues are simulated, so offloaded blocks compete for bandwidth.
 *
 * The search: everything kept; while the peak is over the target, for the largest stashes
 * live at the peak and each action (offload host, offload NVMe, recompute), simulate, and
 * apply the action with the best bytes removed from the peak per second added (a free action,
 * whose copies hide behind compute, on the largest stash that has one, at once; scores within
 * TIE are equal and the larger stash wins). When no action lowers the peak, the prefetch window
 * shrinks (a quarter at a time, down to the next backward's stashes alone) and the search goes
 * on. With serial copies an action's score has a bound known without simulating it (bytes over
 * its copies' or its forward's time): actions are simulated by decreasing bound and the rest
 * skipped once none can beat the best, which chooses what simulating them all would.
 *
 * Cost (AV2 size, batch 4, 88 block applications, 0.48 GiB): about 130 simulations of about
 * 3 µs; the prefetch of each backward reads only the needs its window newly covers
 * (prefetch_limits), so a simulation is linear in the program.
 */
#include "qc_plan.h"
#include "plan_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ST_NONE = 0, ST_LIVE, ST_OUT, ST_FETCH, ST_DROPPED, ST_FREED };

#define CANDIDATES 12   /* stashes tried per search step */
#define TIE        1e-6 /* relative: scores this close are equal (the candidates' order decides) */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void qc_plan_params_default(struct qc_plan_params *p)
{
    memset(p, 0, sizeof *p);
    p->margin = 0.02;
    p->round = 512;
    p->prefetch_window = (uint64_t)256 << 20;
    p->min_stash = (uint64_t)64 << 10;
}

static uint64_t round_up(uint64_t bytes, uint64_t r)
{
    if (r <= 1)
        return bytes ? bytes : 1;
    const uint64_t v = (bytes + r - 1) / r * r;
    return v ? v : r;
}

// ---- compiling the program ------------------------------------------------------------------

void plan_sim_free(struct sim *s)
{
    free(s->pos);
    free(s->stash);
    free(s->tf);
    free(s->tb);
    free(s->sf);
    free(s->redo);
    free(s->need_off);
    free(s->need);
    free(s->evict_off);
    free(s->evict);
    free(s->rank);
    free(s->pf_flat);
    free(s->pf_start);
    free(s->pf_end);
    free(s->pf_cum);
    free(s->state);
    free(s->free_at);
    free(s->done);
    free(s->added);
    free(s->pending);
    memset(s, 0, sizeof *s);
}

enum qc_status plan_sim_compile(struct sim *s, const struct qc_plan_program *p,
                                const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                                const struct qc_plan_params *par)
{
    memset(s, 0, sizeof *s);
    if (!p->finished)
        return qc_errorf(QC_ERR_INVALID, "plan: the program is not finished");
    const int32_t nb = p->nblocks;
    const size_t n1 = (size_t)(nb > 0 ? nb : 1);
    s->prog = p;
    s->nb = nb;
    s->pos = malloc(((size_t)p->nev + 1) * sizeof *s->pos);
    s->stash = calloc(n1, sizeof *s->stash);
    s->tf = calloc(n1, sizeof *s->tf);
    s->tb = calloc(n1, sizeof *s->tb);
    s->sf = calloc(n1, sizeof *s->sf);
    s->redo = calloc(n1, sizeof *s->redo);
    s->need_off = calloc(n1 + 1, sizeof *s->need_off);
    s->need = malloc(((size_t)nb + (size_t)p->nuses + 1) * sizeof *s->need);
    s->evict_off = calloc(n1 + 1, sizeof *s->evict_off);
    s->evict = malloc(n1 * sizeof *s->evict);
    s->rank = malloc(n1 * sizeof *s->rank);
    s->state = calloc(n1, sizeof *s->state);
    s->free_at = calloc(n1, sizeof *s->free_at);
    s->done = calloc(n1, sizeof *s->done);
    s->added = calloc(n1, sizeof *s->added);
    s->pending = malloc(n1 * sizeof *s->pending);
    int32_t *owner = malloc(((size_t)p->nalloc + 1) * sizeof *owner);
    uint64_t *abytes = calloc((size_t)p->nalloc + 1, sizeof *abytes);
    /* per allocation: a block allocation given back inside the span that made it (a block
     * call's transient, as the blocks' memory specs state them) */
    bool *transient = calloc((size_t)p->nalloc + 1, sizeof *transient);
    if (!s->pos || !s->stash || !s->tf || !s->tb || !s->sf || !s->redo || !s->need_off ||
        !s->need || !s->evict_off || !s->evict || !s->rank || !s->state || !s->free_at ||
        !s->done || !s->added || !s->pending || !owner || !abytes || !transient) {
        free(owner);
        free(abytes);
        free(transient);
        plan_sim_free(s);
        return qc_errorf(QC_ERR_NOMEM, "plan: simulation of %d blocks", nb);
    }
    {
        int32_t span = -1;
        for (int32_t i = 0; i < p->nev; i++) {
            const struct qc_plan_event *e = &p->ev[i];
            if (e->op == QC_PLAN_OP_FWD || e->op == QC_PLAN_OP_BWD)
                span = i;
            else if (e->op == QC_PLAN_OP_FWD_END || e->op == QC_PLAN_OP_BWD_END)
                span = -1;
            else if (e->op == QC_PLAN_OP_ALLOC) /* owner[] is the span here, for a moment */
                owner[e->id] = e->cls == QC_PLAN_CLS_BLOCK ? span : -1;
            else if (e->op == QC_PLAN_OP_FREE)
                transient[e->id] = span >= 0 && owner[e->id] == span;
        }
    }
    const uint64_t r = par->round ? par->round : 1;
    for (int32_t i = 0; i < p->nalloc; i++)
        owner[i] = -1;
    for (int32_t b = 0; b < nb; b++) {
        const struct qc_plan_block *k = &p->blocks[b];
        s->rank[b] = -1;
        for (uint32_t j = 0; j < k->nstash; j++)
            owner[k->stash_id[j]] = b;
        s->tf[b] = qc_plan_cost_time(cost, p, b, 0);
        s->tb[b] = qc_plan_cost_time(cost, p, b, 1);
        s->redo[b] = round_up(k->redo_bytes, r);
    }
    for (int32_t i = 0; i < p->nbwd; i++)
        s->rank[p->bwd_order[i]] = i;
    /* positions */
    int32_t cur = -1;
    int64_t rel = 0;
    uint64_t tlive = 0; /* a forward span's live transients (its recompute's scratch: sf) */
    for (int32_t i = 0; i < p->nev; i++) {
        const struct qc_plan_event *e = &p->ev[i];
        const bool begin = e->op == QC_PLAN_OP_FWD || e->op == QC_PLAN_OP_BWD;
        const bool end = e->op == QC_PLAN_OP_FWD_END || e->op == QC_PLAN_OP_BWD_END;
        if (begin || cur < 0) { /* a new position: a span, or the glue after one */
            if (cur >= 0)
                s->pos[cur].delta = rel;
            cur++;
            rel = 0;
            s->pos[cur] = (struct sim_pos){
                .block = begin ? e->block : -1,
                .kind = (int8_t)(begin ? (e->op == QC_PLAN_OP_FWD ? POS_FWD : POS_BWD) : POS_GLUE),
                .delta = 0,
                .excursion = 0};
        }
        struct sim_pos *ps = &s->pos[cur];
        if (begin)
            tlive = 0;
        switch ((enum qc_plan_op)e->op) {
        case QC_PLAN_OP_ALLOC:
            abytes[e->id] = round_up(e->bytes, r);
            if (owner[e->id] >= 0) {
                s->stash[owner[e->id]] += abytes[e->id];
                break;
            }
            rel += (int64_t)abytes[e->id];
            if (rel > 0 && (uint64_t)rel > ps->excursion)
                ps->excursion = (uint64_t)rel;
            if (transient[e->id] && ps->kind == POS_FWD) {
                tlive += abytes[e->id];
                if (tlive > s->sf[ps->block])
                    s->sf[ps->block] = tlive;
            }
            break;
        case QC_PLAN_OP_FREE:
            if (owner[e->id] < 0)
                rel -= (int64_t)abytes[e->id];
            if (transient[e->id] && ps->kind == POS_FWD)
                tlive -= abytes[e->id];
            break;
        case QC_PLAN_OP_PEAK: {
            const uint64_t t = round_up(e->bytes, r);
            const int64_t v = rel + (int64_t)t;
            if (v > 0 && (uint64_t)v > ps->excursion)
                ps->excursion = (uint64_t)v;
            if (e->phase == 0 && tlive + t > s->sf[e->block])
                s->sf[e->block] = tlive + t;
            break;
        }
        default:
            break;
        }
        if (end) { /* the glue after the span begins with the next event */
            ps->delta = rel;
            cur++;
            rel = 0;
            s->pos[cur] = (struct sim_pos){.block = -1, .kind = POS_GLUE};
        }
    }
    if (cur >= 0)
        s->pos[cur].delta = rel;
    /* glue with no event (between two spans) is left out: live bytes there are at most the
     * span's before it (its base plus its delta under the span's excursion; stashes only freed
     * or still pending since), so it never makes a new peak, and it moves nothing. About a third
     * of the positions of a QCNet step */
    int32_t npos = 0;
    for (int32_t i = 0; i <= cur; i++) {
        struct sim_pos ps = s->pos[i];
        if (ps.kind == POS_GLUE && ps.delta == 0 && ps.excursion == 0 && i > 0)
            continue;
        ps.at = i;
        s->pos[npos++] = ps;
    }
    s->npos = npos;
    /* needs (b, then what b uses) and evictions (by fwd_last) as CSR */
    for (int32_t i = 0; i < p->nuses; i++)
        s->need_off[p->uses[i].user + 1]++;
    for (int32_t b = 0; b < nb; b++)
        s->need_off[b + 1] += s->need_off[b] + 1;
    int32_t *fill = calloc(n1, sizeof *fill);
    if (!fill) {
        free(owner);
        free(abytes);
        free(transient);
        plan_sim_free(s);
        return qc_errorf(QC_ERR_NOMEM, "plan: simulation of %d blocks", nb);
    }
    for (int32_t b = 0; b < nb; b++)
        s->need[s->need_off[b] + fill[b]++] = b;
    for (int32_t i = 0; i < p->nuses; i++) {
        const int32_t u = p->uses[i].user;
        s->need[s->need_off[u] + fill[u]++] = p->uses[i].used;
    }
    memset(fill, 0, n1 * sizeof *fill);
    for (int32_t b = 0; b < nb; b++)
        s->evict_off[p->blocks[b].fwd_last + 1]++;
    for (int32_t b = 0; b < nb; b++)
        s->evict_off[b + 1] += s->evict_off[b];
    for (int32_t b = 0; b < nb; b++) {
        const int32_t f = p->blocks[b].fwd_last;
        s->evict[s->evict_off[f] + fill[f]++] = b;
    }
    free(fill);
    free(owner);
    free(abytes);
    free(transient);
    /* the backwards' needs in the backward order, with their bytes summed (prefetch) */
    s->nflat = 0;
    for (int32_t j = 0; j < p->nbwd; j++)
        s->nflat += s->need_off[p->bwd_order[j] + 1] - s->need_off[p->bwd_order[j]];
    s->pf_flat = malloc(((size_t)s->nflat + 1) * sizeof *s->pf_flat);
    s->pf_start = malloc(((size_t)p->nbwd + 2) * sizeof *s->pf_start);
    s->pf_end = malloc(((size_t)p->nbwd + 1) * sizeof *s->pf_end);
    s->pf_cum = malloc(((size_t)s->nflat + 1) * sizeof *s->pf_cum);
    if (!s->pf_flat || !s->pf_start || !s->pf_end || !s->pf_cum) {
        plan_sim_free(s);
        return qc_errorf(QC_ERR_NOMEM, "plan: simulation of %d blocks", nb);
    }
    int32_t f = 0;
    s->pf_cum[0] = 0;
    for (int32_t j = 0; j < p->nbwd; j++) {
        const int32_t u = p->bwd_order[j];
        s->pf_start[j] = f;
        for (int32_t i = s->need_off[u]; i < s->need_off[u + 1]; i++, f++) {
            s->pf_flat[f] = s->need[i];
            /* as the model counts them: not rounded */
            s->pf_cum[f + 1] = s->pf_cum[f] + p->blocks[s->need[i]].stash_bytes;
        }
    }
    s->pf_start[p->nbwd] = s->pf_start[p->nbwd + 1] = f;
    s->pf_window = UINT64_MAX - 1; /* none computed yet */
    s->fixed = p->fixed_bytes;
    s->target = par->budget ? (uint64_t)((double)par->budget * (1.0 - par->margin)) : UINT64_MAX;
    s->window = par->prefetch_window;
    s->none = par->prefetch_none;
    s->host_cap = hw->host_capacity;
    s->nvme_cap = hw->nvme_capacity;
    s->d2h = hw->d2h_gbps > 0 ? hw->d2h_gbps * 1e9 : 1e12;
    s->h2d = hw->h2d_gbps > 0 ? hw->h2d_gbps * 1e9 : 1e12;
    s->nvme_w = hw->nvme_write_gbps > 0 ? hw->nvme_write_gbps * 1e9 : 1e12;
    s->nvme_r = hw->nvme_read_gbps > 0 ? hw->nvme_read_gbps * 1e9 : 1e12;
    s->serial = hw->serial_copies;
    s->glue_s = plan_cost_glue(cost);
    return QC_OK;
}

// ---- one simulation ---------------------------------------------------------------------------

struct run {
    uint64_t peak;
    int32_t peak_pos;
    int32_t peak_block;
    int peak_phase;
    enum plan_peak_cause peak_cause;
    double time, stall;
    bool valid;
    uint64_t host_bytes, nvme_bytes, rec_bytes;
    /* snapshot at the peak (when asked): blocks whose stash was counted */
    int32_t *at_peak;
    int32_t nat_peak;
};

struct ctx {
    struct sim *s;
    const uint8_t *pol;
    struct run *r;
    uint64_t base;     /* fixed + Σ deltas so far */
    uint64_t pol_live; /* stash bytes counted */
    double now, d2h_free, h2d_free;
    uint64_t host_used, nvme_used, fetch_bytes;
    int32_t pos;
    int32_t pf;         /* the prefetch's next item (pf_flat) */
    uint64_t snap_from; /* snapshot a new peak of at least this (UINT64_MAX: none) */
};

static void snapshot(struct ctx *c)
{
    struct sim *s = c->s;
    c->r->nat_peak = 0;
    for (int32_t b = 0; b < s->nb; b++) {
        const uint8_t st = s->state[b];
        if (st == ST_LIVE || st == ST_FETCH || (st == ST_OUT && s->free_at[b] > c->now))
            c->r->at_peak[c->r->nat_peak++] = b;
    }
}

static void new_peak(struct ctx *c, uint64_t v, int32_t block, int phase,
                     enum plan_peak_cause cause)
{
    c->r->peak = v;
    c->r->peak_pos = c->s->pos[c->pos].at;
    c->r->peak_block = block;
    c->r->peak_phase = phase;
    c->r->peak_cause = cause;
    if (v >= c->snap_from)
        snapshot(c);
}

/* v is the live bytes at a point of the run: a new peak when over the last (inlined: this runs
 * at every position of every simulation, the planner's inner loop). */
static inline void candidate(struct ctx *c, uint64_t v, int32_t block, int phase,
                             enum plan_peak_cause cause)
{
    if (v > c->r->peak)
        new_peak(c, v, block, phase, cause);
}

/* Device memory of offloaded stashes whose put has ended comes back. */
static void settle(struct ctx *c)
{
    struct sim *s = c->s;
    for (int32_t i = 0; i < s->npending;) {
        const int32_t k = s->pending[i];
        if (s->free_at[k] <= c->now) {
            c->pol_live -= s->stash[k];
            s->pending[i] = s->pending[--s->npending];
        } else {
            i++;
        }
    }
}

static void evict(struct ctx *c, int32_t k)
{
    struct sim *s = c->s;
    const uint8_t pol = c->pol[k];
    const uint64_t b = s->stash[k];
    if (pol == QC_POLICY_RECOMPUTE) {
        c->pol_live -= b;
        s->state[k] = ST_DROPPED;
        return;
    }
    const bool nvme = pol == QC_POLICY_OFFLOAD_NVME;
    if (nvme) {
        c->nvme_used += round_up(b, 4096);
        c->r->nvme_bytes += b;
        if (c->nvme_used > s->nvme_cap)
            c->r->valid = false;
    } else {
        c->host_used += b;
        c->r->host_bytes += b;
        if (c->host_used > s->host_cap)
            c->r->valid = false;
    }
    const double bw = nvme ? fmin(s->d2h, s->nvme_w) : s->d2h;
    if (s->serial) { /* the copy runs now, in the compute's time; then the memory is free */
        const double w = (double)b / bw;
        c->now += w;
        s->added[k] += w;
        c->r->stall += w;
        s->free_at[k] = c->now;
        s->pending[s->npending++] = k;
        s->state[k] = ST_OUT;
        return;
    }
    const double start = fmax(c->now, c->d2h_free);
    c->d2h_free = start + (double)b / bw;
    s->free_at[k] = c->d2h_free;
    s->pending[s->npending++] = k;
    s->state[k] = ST_OUT;
}

static void fetch(struct ctx *c, int32_t k)
{
    struct sim *s = c->s;
    const uint64_t b = s->stash[k];
    const bool nvme = c->pol[k] == QC_POLICY_OFFLOAD_NVME;
    const double bw = nvme ? fmin(s->h2d, s->nvme_r) : s->h2d;
    if (s->serial) { /* fetched now, in the compute's time */
        const double w = (double)b / bw;
        c->now += w;
        s->added[k] += w;
        c->r->stall += w;
        s->done[k] = c->now;
    } else {
        const double start = fmax(fmax(c->now, c->h2d_free), s->free_at[k]);
        c->h2d_free = start + (double)b / bw;
        s->done[k] = c->h2d_free;
    }
    c->pol_live += b;
    c->fetch_bytes += b;
    s->state[k] = ST_FETCH;
    candidate(c, c->base + c->pol_live, -1, 1, PLAN_PEAK_FETCH);
}

static void make_resident(struct ctx *c, int32_t k, int depth)
{
    struct sim *s = c->s;
    if (s->state[k] == ST_OUT)
        fetch(c, k);
    if (s->state[k] == ST_FETCH) {
        const uint64_t b = s->stash[k];
        if (s->done[k] > c->now) {
            const double w = s->done[k] - c->now;
            c->r->stall += w;
            s->added[k] += w;
            c->now = s->done[k];
        }
        c->fetch_bytes -= b;
        if (c->pol[k] == QC_POLICY_OFFLOAD_NVME)
            c->nvme_used -= round_up(b, 4096);
        else
            c->host_used -= b;
        s->state[k] = ST_LIVE;
    }
    if (s->state[k] == ST_DROPPED && depth < 4) {
        for (int32_t i = s->need_off[k] + 1; i < s->need_off[k + 1]; i++)
            make_resident(c, s->need[i], depth + 1);
        c->pol_live += s->stash[k];
        candidate(c, c->base + c->pol_live + s->sf[k] + s->redo[k], k, 1, PLAN_PEAK_REDO);
        c->now += s->tf[k];
        s->added[k] += s->tf[k];
        c->r->rec_bytes += s->stash[k];
        s->state[k] = ST_LIVE;
    }
}

/* pf_end for the window in force: the prefetch at rank r's backward reads the needs of the
 * backwards after it, in order, while their stashes (whatever their policy) fit the window,
 * the next backward's always — or, with none, nothing (each stash is fetched at its own
 * backward). The end only moves forward as r grows. */
static void prefetch_limits(struct sim *s)
{
    const int32_t nbwd = s->prog->nbwd;
    int32_t e = 0;
    for (int32_t r = 0; r < nbwd; r++) {
        const int32_t s0 = s->pf_start[r + 1], end1 = s->pf_start[r + 2 <= nbwd ? r + 2 : nbwd];
        if (s->none) {
            s->pf_end[r] = e > s0 ? e : s0;
            e = s->pf_end[r];
            continue;
        }
        if (e < end1)
            e = end1;
        while (e < s->nflat && s->pf_cum[e + 1] - s->pf_cum[s0] <= s->window)
            e++;
        s->pf_end[r] = e;
    }
    s->pf_window = s->window;
    s->pf_none = s->none;
}

/* Fetches the offloaded stashes the next backwards read (prefetch_limits). What an earlier
 * backward's prefetch already passed is not read again: a stash that was not in a tier then
 * never goes there later (puts happen in the forward). */
static void prefetch(struct ctx *c, int32_t b)
{
    struct sim *s = c->s;
    const int32_t e = s->pf_end[s->rank[b]];
    for (; c->pf < e; c->pf++) {
        const int32_t k = s->pf_flat[c->pf];
        if (s->state[k] == ST_OUT)
            fetch(c, k);
    }
}

/* Simulates policy vector pol; snap_from (UINT64_MAX: none): record the stashes counted at the
 * peak, from the first new peak of at least snap_from on (the search knows the peak a run will
 * have from the simulation that chose its last move: one snapshot then, not one per new peak). */
static void sim_run(struct sim *s, const uint8_t *pol, uint64_t snap_from, struct run *r)
{
    int32_t *keep_at_peak = r->at_peak;
    memset(r, 0, sizeof *r);
    r->at_peak = keep_at_peak;
    r->valid = true;
    r->peak_block = -1;
    memset(s->state, 0, (size_t)s->nb * sizeof *s->state);
    memset(s->added, 0, (size_t)s->nb * sizeof *s->added);
    memset(s->free_at, 0, (size_t)s->nb * sizeof *s->free_at);
    s->npending = 0;
    if (s->pf_window != s->window || s->pf_none != s->none)
        prefetch_limits(s);
    struct ctx c = {.s = s,
                    .pol = pol,
                    .r = r,
                    .base = s->fixed,
                    .snap_from = r->at_peak ? snap_from : UINT64_MAX};
    for (int32_t i = 0; i < s->npos; i++) {
        const struct sim_pos *ps = &s->pos[i];
        const int32_t b = ps->block;
        c.pos = i;
        if (ps->kind == POS_FWD) {
            if (s->npending)
                settle(&c);
            s->state[b] = ST_LIVE;
            c.pol_live += s->stash[b];
        } else if (ps->kind == POS_BWD) {
            if (s->npending)
                settle(&c);
            for (int32_t j = s->need_off[b]; j < s->need_off[b + 1]; j++)
                if (s->state[s->need[j]] != ST_LIVE) /* kept: nothing to do */
                    make_resident(&c, s->need[j], 0);
            prefetch(&c, b);
        }
        candidate(&c, c.base + c.pol_live + ps->excursion, b, ps->kind == POS_BWD, PLAN_PEAK_SPAN);
        c.base = (uint64_t)((int64_t)c.base + ps->delta);
        if (ps->kind == POS_FWD) {
            c.now += s->tf[b];
            for (int32_t j = s->evict_off[b]; j < s->evict_off[b + 1]; j++) {
                const int32_t k = s->evict[j];
                if (pol[k] != QC_POLICY_KEEP && s->state[k] == ST_LIVE)
                    evict(&c, k);
            }
        } else if (ps->kind == POS_BWD) {
            c.now += s->tb[b];
            if (s->state[b] == ST_LIVE) {
                c.pol_live -= s->stash[b];
                s->state[b] = ST_FREED;
            }
        }
    }
    r->time = c.now + s->glue_s;
}

void plan_sim_peak(struct sim *s, const uint8_t *pol, struct plan_peak *out)
{
    struct run r = {.at_peak = out->at_peak};
    sim_run(s, pol, 0, &r);
    out->peak = r.peak;
    out->pos = r.peak_pos;
    out->block = r.peak_block;
    out->phase = r.peak_phase;
    out->cause = r.peak_cause;
    out->nat_peak = r.nat_peak;
}

// ---- results ----------------------------------------------------------------------------------

static enum qc_status result_alloc(struct qc_plan_result *out, int32_t nb)
{
    memset(out, 0, sizeof *out);
    const size_t n = (size_t)(nb > 0 ? nb : 1);
    out->nblocks = nb;
    out->policy = calloc(n, 1);
    out->block_s = calloc(n, sizeof *out->block_s);
    out->added_s = calloc(n, sizeof *out->added_s);
    if (!out->policy || !out->block_s || !out->added_s) {
        qc_plan_result_free(out);
        return qc_errorf(QC_ERR_NOMEM, "plan: result of %d blocks", nb);
    }
    return QC_OK;
}

void qc_plan_result_free(struct qc_plan_result *r)
{
    free(r->policy);
    free(r->block_s);
    free(r->added_s);
    memset(r, 0, sizeof *r);
}

/* Fills out from the last run r of policy pol. */
static void result_fill(struct qc_plan_result *out, const struct sim *s, const uint8_t *pol,
                        const struct run *r, const struct run *keep)
{
    memcpy(out->policy, pol, (size_t)s->nb);
    for (int32_t b = 0; b < s->nb; b++) {
        out->added_s[b] = s->added[b];
        out->block_s[b] = s->tf[b] + s->tb[b] + s->added[b];
    }
    out->peak = r->peak;
    out->keep_peak = keep->peak;
    out->target = s->target == UINT64_MAX ? 0 : s->target;
    out->step_s = r->time;
    out->keep_step_s = keep->time;
    out->stall_s = r->stall;
    out->host_bytes = r->host_bytes;
    out->nvme_bytes = r->nvme_bytes;
    out->recompute_bytes = 0;
    for (int32_t b = 0; b < s->nb; b++)
        if (pol[b] == QC_POLICY_RECOMPUTE)
            out->recompute_bytes += s->stash[b];
    out->fits = r->valid && r->peak <= s->target;
    out->peak_block = r->peak_block;
    out->peak_phase = r->peak_phase;
}

/* Forced offload: host while the tier holds the stashes offloaded at once, then NVMe. */
static void forced_offload(const struct sim *s, const struct qc_plan_hw *hw,
                           enum qc_plan_place place, uint8_t *pol)
{
    uint64_t host = 0;
    for (int32_t b = 0; b < s->nb; b++) {
        bool to_host = place == QC_PLAN_PLACE_HOST ||
                       (place == QC_PLAN_PLACE_AUTO && host + s->stash[b] <= hw->host_capacity);
        if (place == QC_PLAN_PLACE_AUTO && hw->nvme_capacity == 0)
            to_host = true;
        if (to_host)
            host += s->stash[b];
        pol[b] = to_host ? QC_POLICY_OFFLOAD_HOST : QC_POLICY_OFFLOAD_NVME;
    }
}

enum qc_status qc_plan_evaluate(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                                const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                                const uint8_t *policy, struct qc_plan_result *out)
{
    const double t0 = now_s();
    struct sim s;
    QC_TRY(plan_sim_compile(&s, prog, cost, hw, p));
    enum qc_status st = result_alloc(out, s.nb);
    if (st != QC_OK) {
        plan_sim_free(&s);
        return st;
    }
    uint8_t *keep = calloc((size_t)(s.nb > 0 ? s.nb : 1), 1);
    if (!keep) {
        plan_sim_free(&s);
        qc_plan_result_free(out);
        return qc_errorf(QC_ERR_NOMEM, "plan: policies");
    }
    struct run rk = {0}, r = {0};
    sim_run(&s, keep, UINT64_MAX, &rk);
    sim_run(&s, policy, UINT64_MAX, &r);
    result_fill(out, &s, policy, &r, &rk);
    out->window = s.window;
    out->prefetch_none = s.none;
    free(keep);
    if (!r.valid) {
        st =
            qc_errorf(QC_ERR_INVALID,
                      "plan: the policies need more than the tiers hold (host %llu "
                      "bytes, NVMe %llu bytes)",
                      (unsigned long long)hw->host_capacity, (unsigned long long)hw->nvme_capacity);
        qc_plan_result_free(out);
    }
    for (int32_t b = 0; b < s.nb && st == QC_OK; b++) {
        if ((policy[b] == QC_POLICY_OFFLOAD_HOST && hw->host_capacity == 0) ||
            (policy[b] == QC_POLICY_OFFLOAD_NVME && hw->nvme_capacity == 0) ||
            policy[b] >= QC_POLICY_COUNT) {
            st = qc_errorf(QC_ERR_INVALID,
                           "plan: block %s: policy %s, but that tier does not "
                           "exist",
                           prog->blocks[b].name,
                           qc_plan_policy_str((enum qc_stash_policy)policy[b]));
            qc_plan_result_free(out);
        }
    }
    if (st == QC_OK)
        out->plan_s = now_s() - t0;
    plan_sim_free(&s);
    return st;
}

/* The search's place: its iterations so far and the peak its next run will have (known from
 * the last move's simulation; the all-keep peak at the start). A search carried on from its
 * place to a lower target makes the moves a fresh search to that target makes after it: no move
 * depends on the target, only where the search stops. */
struct search_at {
    int it;
    uint64_t expect;
};

/* The search (module comment). */
static void search(struct sim *s, const struct qc_plan_program *prog, const struct qc_plan_hw *hw,
                   const struct qc_plan_params *p, struct search_at *at, uint8_t *pol,
                   struct run *r, int *iters)
{
    struct run t = {0};
    int32_t cand[CANDIDATES];
    uint64_t expect = at->expect;
    for (; at->it < 4 * s->nb + 4; at->it++) {
        at->expect = expect;
        sim_run(s, pol, expect, r);
        if (r->valid && r->peak <= s->target)
            return;
        /* the largest movable stashes counted at the peak */
        int32_t nc = 0;
        for (int32_t i = 0; i < r->nat_peak; i++) {
            const int32_t b = r->at_peak[i];
            if (pol[b] != QC_POLICY_KEEP || s->stash[b] < p->min_stash)
                continue;
            int32_t j = nc < CANDIDATES ? nc++ : CANDIDATES;
            if (j == CANDIDATES && s->stash[b] <= s->stash[cand[CANDIDATES - 1]])
                continue;
            if (j == CANDIDATES)
                j = CANDIDATES - 1;
            while (j > 0 && s->stash[cand[j - 1]] < s->stash[b]) {
                cand[j] = cand[j - 1];
                j--;
            }
            cand[j] = b;
        }
        /* the actions to try, each with a bound on its score: with serial copies (hw.
         * serial_copies) a move lowers the peak by at most the stash's bytes (the memory
         * accounting does not depend on time then) and adds at least its copies' time, or its
         * forward's (recompute); with overlapped copies the bound is infinite. Tried by
         * decreasing bound, stopping once the best score found beats the next bound: the same
         * choice as trying them all, for a fraction of the simulations */
        struct try_ {
            int32_t b, order;
            uint8_t a;
            double bound;
        } tries[CANDIDATES * 3];
        int32_t nt = 0;
        for (int32_t i = 0; i < nc; i++) {
            const int32_t b = cand[i];
            const double bytes = (double)s->stash[b];
            for (uint8_t a = QC_POLICY_OFFLOAD_HOST; a < QC_POLICY_COUNT; a++) {
                if (a == QC_POLICY_OFFLOAD_HOST &&
                    (hw->host_capacity == 0 || p->place == QC_PLAN_PLACE_NVME))
                    continue;
                if (a == QC_POLICY_OFFLOAD_NVME &&
                    (hw->nvme_capacity == 0 || p->place == QC_PLAN_PLACE_HOST))
                    continue;
                if (a == QC_POLICY_RECOMPUTE && !prog->blocks[b].can_recompute)
                    continue;
                double lb = 0;
                if (s->serial)
                    lb = a == QC_POLICY_RECOMPUTE ? s->tf[b]
                         : a == QC_POLICY_OFFLOAD_HOST
                             ? bytes / s->d2h + bytes / s->h2d
                             : bytes / fmin(s->d2h, s->nvme_w) + bytes / fmin(s->h2d, s->nvme_r);
                tries[nt] = (struct try_){b, nt, a, lb > 1e-9 ? bytes / lb : (double)INFINITY};
                nt++;
            }
        }
        for (int32_t i = 1; i < nt; i++) { /* by bound, then in the candidates' order */
            const struct try_ x = tries[i];
            int32_t j = i;
            for (; j > 0 && (tries[j - 1].bound < x.bound ||
                             (tries[j - 1].bound == x.bound && tries[j - 1].order > x.order));
                 j--)
                tries[j] = tries[j - 1];
            tries[j] = x;
        }
        int32_t best = -1, best_order = INT32_MAX, host_ok_b = -1;
        uint64_t best_peak = 0;
        uint8_t best_a = 0;
        double best_score = 0;
        for (int32_t i = 0; i < nt; i++) {
            const int32_t b = tries[i].b;
            const uint8_t a = tries[i].a;
            /* scores within TIE of each other are equal, and the candidates' order (larger
             * stash first) decides; a try whose bound cannot beat the best, or only tie it
             * from later in that order, is not simulated */
            if (best >= 0 && tries[i].bound < best_score * (1.0 - TIE))
                break;
            if (best >= 0 && tries[i].bound <= best_score * (1.0 + TIE) &&
                tries[i].order > best_order)
                continue;
            /* NVMe only for a stash the host tier cannot take (auto placement) */
            if (a == QC_POLICY_OFFLOAD_NVME && p->place == QC_PLAN_PLACE_AUTO && host_ok_b == b)
                continue;
            pol[b] = a;
            sim_run(s, pol, UINT64_MAX, &t);
            pol[b] = QC_POLICY_KEEP;
            if (!t.valid)
                continue;
            if (a == QC_POLICY_OFFLOAD_HOST)
                host_ok_b = b;
            if (t.peak >= r->peak)
                continue;
            const double gain = (double)(r->peak - t.peak), cost = t.time - r->time;
            const double score = cost <= 1e-9 ? 1e30 + gain : gain / cost;
            if (score > best_score * (1.0 + TIE) ||
                (score >= best_score * (1.0 - TIE) && tries[i].order < best_order)) {
                best_score = score;
                best = b;
                best_a = a;
                best_order = tries[i].order;
                best_peak = t.peak;
            }
            /* a free action (its copies hidden behind compute) is taken at once, on the
             * largest candidate that has one: the search then costs about one simulation
             * per move while the copies hide */
            if (best_score >= 1e30)
                break;
        }
        /* one more action: fetch less far ahead (a quarter of the window at a time, down to
         * the next backward's stashes alone, then not even those), scored like the others */
        const uint64_t window = s->window;
        const bool none = s->none;
        bool shrink = false;
        if ((window > 0 || !none) && best_score < 1e30) {
            if (window > 0)
                s->window = window >= ((uint64_t)4 << 20) ? window / 4 : 0;
            else
                s->none = true;
            sim_run(s, pol, UINT64_MAX, &t);
            if (t.valid && t.peak < r->peak) {
                const double gain = (double)(r->peak - t.peak), cost = t.time - r->time;
                const double score = cost <= 1e-9 ? 1e30 + gain : gain / cost;
                shrink = score > best_score || best < 0;
            }
            if (!shrink && best < 0) /* nothing else lowers the peak: shrink and go on */
                shrink = true;
            if (!shrink) {
                s->window = window;
                s->none = none;
            }
        }
        if (shrink) {
            expect = t.peak; /* t ran this window */
            (*iters)++;
            continue;
        }
        if (best < 0)
            return; /* nothing lowers the peak: the batch does not fit */
        pol[best] = best_a;
        expect = best_peak;
        (*iters)++;
    }
}

// ---- room for a plan that fetches nothing ahead (qc_plan.h; qc_plan_room in edge_mode.c) ---

/* The least room qc_plan_room asks for beyond the margin, of the budget: the fragmentation at
 * a step's peak reached 1.076 in issue 26's soak (2,000 steps of mixed scenes under 60 % of the
 * largest peak), 7 % of that budget, where a 2 % margin and a 2 % room (2c913f7) let a step run
 * out twice in 3,000 (docs/BENCHMARKS.md, "Nothing ahead with room, and the soak") */
#define ROOM_MIN 0.05

double plan_room_margin(const struct qc_plan_params *p)
{
    const double m = p->margin + (p->margin > ROOM_MIN ? p->margin : ROOM_MIN);
    return m < 0.5 ? m : 0.5;
}

/* The room's target: the budget less plan_room_margin; UINT64_MAX without a budget. */
static uint64_t room_target(const struct qc_plan_params *p)
{
    return p->budget ? (uint64_t)((double)p->budget * (1.0 - plan_room_margin(p))) : UINT64_MAX;
}

bool qc_plan_has_room(const struct qc_plan_params *p, const struct qc_plan_result *r)
{
    if (!r->fits || !r->prefetch_none || p->budget == 0)
        return r->fits;
    return r->peak <= room_target(p);
}

/* out from the search's last run r of pol (s's window and nothing-ahead state, iters). */
static void plan_fill(struct qc_plan_result *out, const struct sim *s, const uint8_t *pol,
                      const struct run *r, const struct run *keep, int iters)
{
    result_fill(out, s, pol, r, keep);
    out->window = s->window;
    out->prefetch_none = s->none;
    out->iterations = iters;
}

/* qc_plan_make, and with room (NULL: none) qc_plan_room's second plan in the same search
 * (qc_plan_make_room). */
static enum qc_status plan_make(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                                const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                                const struct qc_plan_params *room, struct qc_plan_result *out,
                                bool *ok)
{
    const double t0 = now_s();
    struct sim s;
    QC_TRY(plan_sim_compile(&s, prog, cost, hw, p));
    enum qc_status st = result_alloc(out, s.nb);
    uint8_t *pol = calloc((size_t)(s.nb > 0 ? s.nb : 1), 1);
    int32_t *snap = malloc((size_t)(s.nb > 0 ? s.nb : 1) * sizeof *snap);
    if (st != QC_OK || !pol || !snap) {
        free(pol);
        free(snap);
        plan_sim_free(&s);
        if (st == QC_OK) {
            qc_plan_result_free(out);
            st = qc_errorf(QC_ERR_NOMEM, "plan: policies");
        }
        return st;
    }
    struct run keep = {0}, r = {.at_peak = snap};
    sim_run(&s, pol, UINT64_MAX, &keep);
    int iters = 0;
    struct search_at at = {0, keep.peak};
    switch (p->mode) {
    case QC_PLAN_MODE_KEEP:
        break;
    case QC_PLAN_MODE_RECOMPUTE:
        memset(pol, QC_POLICY_RECOMPUTE, (size_t)s.nb);
        break;
    case QC_PLAN_MODE_OFFLOAD:
        forced_offload(&s, hw, p->place, pol);
        break;
    case QC_PLAN_MODE_AUTO:
        search(&s, prog, hw, p, &at, pol, &r, &iters);
        break;
    }
    sim_run(&s, pol, UINT64_MAX, &r);
    plan_fill(out, &s, pol, &r, &keep, iters);
    if (room) {
        /* without room: the search carried on to the room's target (the same moves as planning
         * again there, fewer simulations); that plan when it fits, its target reported as the
         * first's */
        *ok = qc_plan_has_room(room, out);
        const uint64_t target = room_target(room);
        if (!*ok && out->fits && target < s.target) {
            const uint64_t target1 = out->target;
            s.target = target;
            if (p->mode == QC_PLAN_MODE_AUTO)
                search(&s, prog, hw, p, &at, pol, &r, &iters);
            sim_run(&s, pol, UINT64_MAX, &r);
            if (r.valid && r.peak <= s.target) {
                plan_fill(out, &s, pol, &r, &keep, iters);
                out->target = target1;
                *ok = true;
            }
        }
    }
    out->plan_s = now_s() - t0;
    free(pol);
    free(snap);
    plan_sim_free(&s);
    return QC_OK;
}

enum qc_status qc_plan_make(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                            const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                            struct qc_plan_result *out)
{
    return plan_make(prog, cost, hw, p, NULL, out, NULL);
}

enum qc_status qc_plan_make_room(const struct qc_plan_program *prog,
                                 const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                                 const struct qc_plan_params *p, const struct qc_plan_params *room,
                                 struct qc_plan_result *out, bool *ok)
{
    return plan_make(prog, cost, hw, p, room ? room : p, out, ok);
}

enum qc_status qc_plan_check(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                             const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                             const struct qc_plan_result *r)
{
    struct qc_plan_result e;
    struct qc_plan_params pw = *p;
    pw.prefetch_window = r->window; /* the window the plan chose */
    pw.prefetch_none = r->prefetch_none;
    QC_TRY(qc_plan_evaluate(prog, cost, hw, &pw, r->policy, &e));
    enum qc_status st = QC_OK;
    uint64_t planned = 0;
    for (int32_t b = 0; b < prog->nblocks; b++)
        if (r->policy[b] != QC_POLICY_KEEP)
            planned += prog->blocks[b].stash_bytes;
    const uint64_t moved = r->host_bytes + r->nvme_bytes + r->recompute_bytes;
    if (e.peak != r->peak || fabs(e.step_s - r->step_s) > 1e-9 * (1 + r->step_s))
        st =
            qc_errorf(QC_ERR_INVALID, "plan check: peak %llu / time %.9g, re-simulated %llu / %.9g",
                      (unsigned long long)r->peak, r->step_s, (unsigned long long)e.peak, e.step_s);
    else if (r->fits != (r->peak <= (r->target ? r->target : UINT64_MAX)))
        st = qc_errorf(QC_ERR_INVALID, "plan check: fits %d but peak %llu, target %llu",
                       (int)r->fits, (unsigned long long)r->peak, (unsigned long long)r->target);
    else if (e.host_bytes != r->host_bytes || e.nvme_bytes != r->nvme_bytes ||
             e.recompute_bytes != r->recompute_bytes || moved < planned)
        st = qc_errorf(QC_ERR_INVALID,
                       "plan check: host %llu, NVMe %llu, recompute %llu bytes for %llu planned "
                       "stash bytes (re-simulated %llu, %llu, %llu)",
                       (unsigned long long)r->host_bytes, (unsigned long long)r->nvme_bytes,
                       (unsigned long long)r->recompute_bytes, (unsigned long long)planned,
                       (unsigned long long)e.host_bytes, (unsigned long long)e.nvme_bytes,
                       (unsigned long long)e.recompute_bytes);
    qc_plan_result_free(&e);
    return st;
}

void qc_plan_print(FILE *out, const struct qc_plan_program *prog, const struct qc_plan_result *r)
{
    fprintf(out, "%-58s %-5s %12s %-12s %9s %9s\n", "block application", "kind", "stash bytes",
            "policy", "time s", "added s");
    for (int32_t b = 0; b < prog->nblocks; b++) {
        const struct qc_plan_block *k = &prog->blocks[b];
        fprintf(out, "%-58.58s %-5s %12llu %-12s %9.4f %9.4f\n", k->name, qc_plan_kind_str(k->kind),
                (unsigned long long)k->stash_bytes,
                qc_plan_policy_str((enum qc_stash_policy)r->policy[b]), r->block_s[b],
                r->added_s[b]);
    }
}
