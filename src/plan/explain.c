/*
 * explain.c — what holds the memory at a plan's peak (qc_plan.h, qc_plan_explain).
 *
 * The simulation (plan.c) counts bytes, not tensors: at the peak it knows the fixed bytes, the
 * stash bytes it counts (and which blocks'), and the unmoved live bytes — the position's base
 * plus its excursion. This file replays the program's events up to the peak position with the
 * same segmentation and rounding, keeps the set of live allocations that are not stash arenas,
 * and takes it at the point of the position where the simulation's excursion is reached (or at
 * the position's start for a peak made by a fetch or a recompute before a backward). Every
 * allocation is then named by its tag (qc_plan_program_tag: the memory context records them),
 * so that the sum of the holders is the peak, byte for byte.
 */
#include "qc_plan.h"
#include "plan_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *qc_plan_hold_str(enum qc_plan_hold k)
{
    static const char *const names[QC_PLAN_HOLD_COUNT] = {"fixed",  "stash read",  "stash",
                                                          "tensor", "working set", "recompute"};
    return (int)k >= 0 && k < QC_PLAN_HOLD_COUNT ? names[k] : "?";
}

void qc_plan_explain_free(struct qc_plan_explain *e)
{
    free(e->h);
    memset(e, 0, sizeof *e);
}

/* Adds bytes to the holder of kind and name (one per name and kind). */
static enum qc_status hold(struct qc_plan_explain *e, int32_t *cap, enum qc_plan_hold kind,
                           const char *name, uint64_t bytes)
{
    for (int32_t i = 0; i < e->n; i++)
        if (e->h[i].kind == kind && strcmp(e->h[i].name, name) == 0) {
            e->h[i].bytes += bytes;
            e->h[i].count++;
            e->by_kind[kind] += bytes;
            return QC_OK;
        }
    if (e->n == *cap) {
        const int32_t c = *cap ? 2 * *cap : 64;
        struct qc_plan_holder *h = realloc(e->h, (size_t)c * sizeof *h);
        if (!h)
            return qc_errorf(QC_ERR_NOMEM, "plan explain: %d holders", c);
        e->h = h;
        *cap = c;
    }
    struct qc_plan_holder *x = &e->h[e->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name[0] ? name : "(an allocation without a tag)");
    x->kind = kind;
    x->bytes = bytes;
    x->count = 1;
    e->by_kind[kind] += bytes;
    return QC_OK;
}

static int holder_cmp(const void *a, const void *b)
{
    const struct qc_plan_holder *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The live allocations at the peak: alive[id] = 1 (made before the peak position) or 2 (made
 * in it), ab[id] their bytes rounded to rd as the simulation rounds them, from the events
 * replayed with the simulation's segmentation (plan.c, plan_sim_compile). A PEAK event that
 * makes the high point: *peak_bytes (rounded) and its block. */
static void live_at_peak(const struct qc_plan_program *p, const struct plan_peak *pk,
                         const int32_t *owner, uint64_t rd, uint8_t *cur_live, uint8_t *alive,
                         uint64_t *ab, uint64_t *peak_bytes, int32_t *peak_block)
{
    int32_t pos = -1;
    bool in_peak = false;
    int64_t rel = 0, best = 0;
    *peak_bytes = 0;
    *peak_block = -1;
    const size_t na = (size_t)p->nalloc;
    for (int32_t i = 0; i < p->nev; i++) {
        const struct qc_plan_event *e = &p->ev[i];
        const bool begin = e->op == QC_PLAN_OP_FWD || e->op == QC_PLAN_OP_BWD;
        const bool end = e->op == QC_PLAN_OP_FWD_END || e->op == QC_PLAN_OP_BWD_END;
        if (begin || pos < 0) {
            if (in_peak) /* the peak position is over */
                return;
            pos++;
            rel = 0;
            if (pos == pk->pos) { /* its start */
                in_peak = true;
                best = 0;
                memcpy(alive, cur_live, na);
                if (pk->cause != PLAN_PEAK_SPAN)
                    return;
            }
        }
        switch ((enum qc_plan_op)e->op) {
        case QC_PLAN_OP_ALLOC:
            ab[e->id] = rd > 1 ? (e->bytes + rd - 1) / rd * rd : e->bytes;
            if (owner[e->id] >= 0)
                break;
            cur_live[e->id] = in_peak ? 2 : 1;
            rel += (int64_t)ab[e->id];
            if (in_peak && rel > best) {
                best = rel;
                memcpy(alive, cur_live, na);
                *peak_bytes = 0;
            }
            break;
        case QC_PLAN_OP_FREE:
            if (owner[e->id] < 0) {
                cur_live[e->id] = 0;
                rel -= (int64_t)ab[e->id];
            }
            break;
        case QC_PLAN_OP_PEAK: {
            const uint64_t t = rd > 1 ? (e->bytes + rd - 1) / rd * rd : e->bytes;
            if (in_peak && rel + (int64_t)t > best) {
                best = rel + (int64_t)t;
                memcpy(alive, cur_live, na);
                *peak_bytes = t;
                *peak_block = e->block;
            }
            break;
        }
        default:
            break;
        }
        if (end) {
            if (in_peak)
                return;
            pos++; /* the glue after the span begins with the next event */
            rel = 0;
            if (pos == pk->pos) {
                in_peak = true;
                best = 0;
                memcpy(alive, cur_live, na);
                if (pk->cause != PLAN_PEAK_SPAN)
                    return;
            }
        }
    }
    if (!in_peak) /* the peak position holds no event (an empty glue at the end) */
        memcpy(alive, cur_live, na);
}

enum qc_status qc_plan_explain(const struct qc_plan_program *prog, const struct qc_plan_cost *cost,
                               const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                               const struct qc_plan_result *r, struct qc_plan_explain *out)
{
    memset(out, 0, sizeof *out);
    struct qc_plan_params pw = *p;
    pw.prefetch_window = r->window; /* the window the plan chose */
    pw.prefetch_none = r->prefetch_none;
    struct sim s;
    QC_TRY(plan_sim_compile(&s, prog, cost, hw, &pw));
    const size_t na = (size_t)prog->nalloc + 1, nb = (size_t)(s.nb > 0 ? s.nb : 1);
    int32_t *owner = malloc(na * sizeof *owner);
    uint8_t *alive = calloc(na, 1), *cur_live = calloc(na, 1);
    uint64_t *ab = calloc(na, sizeof *ab);
    uint8_t *counted = calloc(2 * nb, 1);
    struct plan_peak pk = {.at_peak = malloc(nb * sizeof(int32_t))};
    enum qc_status st = QC_OK;
    if (!owner || !alive || !cur_live || !ab || !counted || !pk.at_peak) {
        st = qc_errorf(QC_ERR_NOMEM, "plan explain: %d allocations", prog->nalloc);
        goto out;
    }
    for (size_t i = 0; i < na; i++)
        owner[i] = -1;
    for (int32_t b = 0; b < s.nb; b++)
        for (uint32_t j = 0; j < prog->blocks[b].nstash; j++)
            owner[prog->blocks[b].stash_id[j]] = b;
    plan_sim_peak(&s, r->policy, &pk);
    out->peak = pk.peak;
    out->block = pk.block;
    out->phase = pk.phase;
    out->recompute = pk.cause == PLAN_PEAK_REDO;
    out->fetch = pk.cause == PLAN_PEAK_FETCH;
    const uint64_t rd = pw.round ? pw.round : 1;
    uint64_t peak_ev = 0;
    int32_t peak_ev_block = -1;
    live_at_peak(prog, &pk, owner, rd, cur_live, alive, ab, &peak_ev, &peak_ev_block);
    int32_t cap = 0;
    char name[QC_PLAN_NAME_MAX + 48];
    if (s.fixed && (st = hold(out, &cap, QC_PLAN_HOLD_FIXED,
                              "parameters, gradients, optimizer state, batch", s.fixed)) != QC_OK)
        goto out;
    /* the stashes the block at the peak reads (itself and what it uses) */
    uint8_t *reads = counted + s.nb; /* second half of the same buffer */
    if (pk.block >= 0)
        for (int32_t i = s.need_off[pk.block]; i < s.need_off[pk.block + 1]; i++)
            reads[s.need[i]] = 1;
    for (int32_t i = 0; i < pk.nat_peak; i++) {
        const int32_t b = pk.at_peak[i];
        counted[b] = 1;
        snprintf(name, sizeof name, "stash of %s", prog->blocks[b].name);
        if ((st = hold(out, &cap, reads[b] ? QC_PLAN_HOLD_STASH_READ : QC_PLAN_HOLD_STASH, name,
                       s.stash[b])) != QC_OK)
            goto out;
    }
    if (out->recompute && pk.block >= 0) {
        const int32_t k = pk.block;
        if (!counted[k]) { /* counted by the simulation as it recomputes, not yet live */
            snprintf(name, sizeof name, "stash of %s", prog->blocks[k].name);
            if ((st = hold(out, &cap, QC_PLAN_HOLD_STASH_READ, name, s.stash[k])) != QC_OK)
                goto out;
        }
        snprintf(name, sizeof name, "recompute of %s (its scratch and output)",
                 prog->blocks[k].name);
        if ((st = hold(out, &cap, QC_PLAN_HOLD_RECOMPUTE, name, s.sf[k] + s.redo[k])) != QC_OK)
            goto out;
    }
    for (int32_t id = 0; id < prog->nalloc; id++) {
        if (!alive[id])
            continue;
        st = hold(out, &cap, alive[id] == 2 ? QC_PLAN_HOLD_WORKING : QC_PLAN_HOLD_TENSOR,
                  qc_plan_program_tag_of(prog, id), ab[id]);
        if (st != QC_OK)
            goto out;
    }
    if (peak_ev) {
        snprintf(name, sizeof name, "transient of %s",
                 peak_ev_block >= 0 ? prog->blocks[peak_ev_block].name : "a block");
        if ((st = hold(out, &cap, QC_PLAN_HOLD_WORKING, name, peak_ev)) != QC_OK)
            goto out;
    }
    if (out->n > 1)
        qsort(out->h, (size_t)out->n, sizeof *out->h, holder_cmp);
    uint64_t sum = 0;
    for (int k = 0; k < QC_PLAN_HOLD_COUNT; k++)
        sum += out->by_kind[k];
    if (sum != out->peak)
        st = qc_errorf(QC_ERR_INVALID,
                       "plan explain: the holders sum to %llu bytes, the peak is %llu (position "
                       "%d, block %d): the replay and the simulation disagree",
                       (unsigned long long)sum, (unsigned long long)out->peak, pk.pos, pk.block);
out:
    free(owner);
    free(alive);
    free(cur_live);
    free(ab);
    free(counted);
    free(pk.at_peak);
    plan_sim_free(&s);
    if (st != QC_OK)
        qc_plan_explain_free(out);
    return st;
}

/* "1.23 GiB" style. */
static const char *fmt_bytes(uint64_t b, char *buf, size_t n)
{
    const double v = (double)b;
    if (v >= 1073741824.0)
        snprintf(buf, n, "%.2f GiB", v / 1073741824.0);
    else if (v >= 1048576.0)
        snprintf(buf, n, "%.1f MiB", v / 1048576.0);
    else if (v >= 1024.0)
        snprintf(buf, n, "%.1f KiB", v / 1024.0);
    else
        snprintf(buf, n, "%llu B", (unsigned long long)b);
    return buf;
}

void qc_plan_explain_print(FILE *out, const struct qc_plan_program *prog,
                           const struct qc_plan_explain *e, int top)
{
    char a[32], b[32];
    const char *where = e->block >= 0 ? prog->blocks[e->block].name : "between blocks";
    fprintf(out, "at the peak (%s, %s%s%s), held by:\n", fmt_bytes(e->peak, a, sizeof a), where,
            e->block < 0   ? ""
            : e->recompute ? "'s recompute before a backward"
            : e->phase     ? "'s backward"
                           : "'s forward",
            e->fetch ? ", fetching stashes back" : "");
    for (int k = 0; k < QC_PLAN_HOLD_COUNT; k++)
        if (e->by_kind[k])
            fprintf(out, "  %-12s %10s  %5.1f %%\n", qc_plan_hold_str((enum qc_plan_hold)k),
                    fmt_bytes(e->by_kind[k], a, sizeof a),
                    100.0 * (double)e->by_kind[k] / (double)(e->peak ? e->peak : 1));
    uint64_t rest = 0;
    int32_t nrest = 0;
    for (int32_t i = 0; i < e->n; i++) {
        const struct qc_plan_holder *h = &e->h[i];
        if (i >= top) {
            rest += h->bytes;
            nrest++;
            continue;
        }
        snprintf(b, sizeof b, "%s", qc_plan_hold_str(h->kind));
        if (h->count > 1)
            fprintf(out, "  %10s  %-11s %s (%d allocations)\n", fmt_bytes(h->bytes, a, sizeof a), b,
                    h->name, h->count);
        else
            fprintf(out, "  %10s  %-11s %s\n", fmt_bytes(h->bytes, a, sizeof a), b, h->name);
    }
    if (nrest)
        fprintf(out, "  %10s  %d more holders\n", fmt_bytes(rest, a, sizeof a), nrest);
}
