/*
 * program.c — the program of one step (qc_plan.h): building it event by event and deriving
 * the per-block fields the planner reads (qc_plan_program_finish), with its invariants checked.
 */
#include "qc_plan.h"

#include <stdlib.h>
#include <string.h>

const char *qc_plan_kind_str(enum qc_plan_kind k)
{
    static const char *const names[QC_PLAN_KIND_COUNT] = {"fe",   "edges", "kv",
                                                          "attn", "mlp",   "gru"};
    return (int)k >= 0 && k < QC_PLAN_KIND_COUNT ? names[k] : "?";
}

const char *qc_plan_policy_str(enum qc_stash_policy p)
{
    static const char *const names[QC_POLICY_COUNT] = {"keep", "offload_host", "offload_nvme",
                                                       "recompute"};
    return (int)p >= 0 && p < QC_POLICY_COUNT ? names[p] : "?";
}

const char *qc_plan_edge_mode_str(enum qc_plan_edge_mode m)
{
    static const char *const names[] = {"none", "materialised", "tiled"};
    return (int)m >= 0 && m <= QC_PLAN_EDGE_TILED ? names[m] : "?";
}

void qc_plan_program_init(struct qc_plan_program *p)
{
    memset(p, 0, sizeof *p);
}

void qc_plan_program_free(struct qc_plan_program *p)
{
    free(p->blocks);
    free(p->ev);
    free(p->uses);
    free(p->bwd_order);
    free(p->tag_off);
    free(p->tags);
    memset(p, 0, sizeof *p);
}

void qc_plan_program_reset(struct qc_plan_program *p)
{
    p->nblocks = 0;
    p->nev = 0;
    p->nuses = 0;
    p->nalloc = 0;
    p->tags_len = 0;
    p->nbwd = 0;
    p->fixed_bytes = 0;
    p->finished = false;
}

/* Grows *arr (elem bytes each, *cap of them) to hold need. */
static bool grow(void **arr, int32_t *cap, int32_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    int32_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *n = realloc(*arr, (size_t)c * elem);
    if (!n)
        return false;
    *arr = n;
    *cap = c;
    return true;
}

int32_t qc_plan_program_block(struct qc_plan_program *p, const char *name, enum qc_plan_kind kind)
{
    if (!grow((void **)&p->blocks, &p->cap_blocks, p->nblocks + 1, sizeof *p->blocks)) {
        (void)qc_errorf(QC_ERR_NOMEM, "plan: program of %d blocks", p->nblocks + 1);
        return -1;
    }
    struct qc_plan_block *b = &p->blocks[p->nblocks];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->kind = kind;
    b->fwd_ev = b->fwd_end_ev = b->bwd_ev = b->bwd_end_ev = -1;
    b->fwd_last = b->bwd_first = -1;
    b->edge_set = b->edges_block = -1;
    return p->nblocks++;
}

_Static_assert(sizeof(struct qc_plan_event) == 24, "struct qc_plan_event has no padding bytes");

enum qc_status qc_plan_program_tag(struct qc_plan_program *p, int32_t id, const char *tag)
{
    if (id < 0 || id >= p->nalloc)
        return qc_errorf(QC_ERR_INVALID, "plan: tag of allocation %d of %d", id, p->nalloc);
    if (!grow((void **)&p->tag_off, &p->cap_tag_off, p->nalloc, sizeof *p->tag_off))
        return qc_errorf(QC_ERR_NOMEM, "plan: tags of %d allocations", p->nalloc);
    size_t n = strlen(tag);
    if (n > 127)
        n = 127;
    if (p->tags_len + (int64_t)n + 1 > p->tags_cap) {
        int64_t c = p->tags_cap ? p->tags_cap : 4096;
        while (c < p->tags_len + (int64_t)n + 1)
            c *= 2;
        char *t = realloc(p->tags, (size_t)c);
        if (!t)
            return qc_errorf(QC_ERR_NOMEM, "plan: %lld bytes of tags", (long long)c);
        p->tags = t;
        p->tags_cap = c;
    }
    p->tag_off[id] = p->tags_len;
    memcpy(p->tags + p->tags_len, tag, n);
    p->tags[p->tags_len + (int64_t)n] = '\0';
    p->tags_len += (int64_t)n + 1;
    return QC_OK;
}

const char *qc_plan_program_tag_of(const struct qc_plan_program *p, int32_t id)
{
    if (id < 0 || id >= p->nalloc || id >= p->cap_tag_off || !p->tag_off || !p->tags)
        return "";
    const int64_t o = p->tag_off[id];
    return o >= 0 && o < p->tags_len ? p->tags + o : "";
}

enum qc_status qc_plan_program_lives(const struct qc_plan_program *p, uint8_t *life)
{
    /* span[id]: the block markers before its ALLOC */
    int32_t *span = malloc((size_t)(p->nalloc > 0 ? p->nalloc : 1) * sizeof *span);
    if (!span)
        return qc_errorf(QC_ERR_NOMEM, "plan: lifetimes of %d allocations", p->nalloc);
    int32_t markers = 0;
    for (int32_t i = 0; i < p->nev; i++)
        if (p->ev[i].op <= QC_PLAN_OP_BWD_END)
            markers++;
    for (int32_t id = 0; id < p->nalloc; id++)
        life[id] = QC_PLAN_LIFE_LONG;
    int32_t seen = 0;
    for (int32_t i = 0; i < p->nev; i++) {
        const struct qc_plan_event *e = &p->ev[i];
        if (e->op <= QC_PLAN_OP_BWD_END)
            seen++;
        else if (e->op == QC_PLAN_OP_ALLOC && e->id >= 0 && e->id < p->nalloc)
            span[e->id] = seen;
        else if (e->op == QC_PLAN_OP_FREE && e->id >= 0 && e->id < p->nalloc)
            life[e->id] = span[e->id] == seen ? QC_PLAN_LIFE_SPAN
                          : seen == markers   ? QC_PLAN_LIFE_LONG
                                              : QC_PLAN_LIFE_PHASE;
    }
    free(span);
    return QC_OK;
}

int32_t qc_plan_program_event(struct qc_plan_program *p, enum qc_plan_op op, int32_t block,
                              int32_t id, uint64_t bytes, int cls, int phase)
{
    if (!grow((void **)&p->ev, &p->cap_ev, p->nev + 1, sizeof *p->ev)) {
        (void)qc_errorf(QC_ERR_NOMEM, "plan: program of %d events", p->nev + 1);
        return -1;
    }
    if (op == QC_PLAN_OP_ALLOC) {
        id = p->nalloc++;
        if (!grow((void **)&p->tag_off, &p->cap_tag_off, p->nalloc, sizeof *p->tag_off)) {
            (void)qc_errorf(QC_ERR_NOMEM, "plan: tags of %d allocations", p->nalloc);
            p->nalloc--;
            return -1;
        }
        p->tag_off[id] = -1;
    }
    p->ev[p->nev++] = (struct qc_plan_event){.op = (uint8_t)op,
                                             .cls = (uint8_t)cls,
                                             .phase = (uint8_t)phase,
                                             .block = block,
                                             .id = id,
                                             .bytes = bytes};
    p->finished = false;
    return op == QC_PLAN_OP_ALLOC ? id : p->nev - 1;
}

enum qc_status qc_plan_program_use(struct qc_plan_program *p, int32_t user, int32_t used)
{
    for (int32_t i = 0; i < p->nuses; i++)
        if (p->uses[i].user == user && p->uses[i].used == used)
            return QC_OK;
    if (!grow((void **)&p->uses, &p->cap_uses, p->nuses + 1, sizeof *p->uses))
        return qc_errorf(QC_ERR_NOMEM, "plan: program of %d uses", p->nuses + 1);
    p->uses[p->nuses++] = (struct qc_plan_use){user, used};
    return QC_OK;
}

/* The event index of block b's backward begin for the order of backwards (INT32_MAX: none). */
static int32_t bwd_key(const struct qc_plan_program *p, int32_t b)
{
    return p->blocks[b].bwd_ev >= 0 ? p->blocks[b].bwd_ev : INT32_MAX;
}

enum qc_status qc_plan_program_finish(struct qc_plan_program *p)
{
    const int32_t nb = p->nblocks;
    uint64_t *abytes = calloc((size_t)(p->nalloc ? p->nalloc : 1), sizeof *abytes);
    int32_t *astate = calloc((size_t)(p->nalloc ? p->nalloc : 1), sizeof *astate); /* 1 live */
    int32_t *owner = malloc((size_t)(p->nalloc ? p->nalloc : 1) * sizeof *owner);
    free(p->bwd_order);
    p->bwd_order = malloc((size_t)(nb ? nb : 1) * sizeof *p->bwd_order);
    p->nbwd = 0;
    enum qc_status st = QC_OK;
    if (!abytes || !astate || !owner || !p->bwd_order) {
        st = qc_errorf(QC_ERR_NOMEM, "plan: finishing a program of %d allocations", p->nalloc);
        goto out;
    }
    for (int32_t i = 0; i < p->nalloc; i++)
        owner[i] = -1;
    for (int32_t b = 0; b < nb; b++) {
        struct qc_plan_block *k = &p->blocks[b];
        k->nstash = 0;
        k->stash_bytes = 0;
        k->fwd_ev = k->fwd_end_ev = k->bwd_ev = k->bwd_end_ev = -1;
        /* the edge context of its set (the tiled mode's FE is priced from it: cost.c) */
        k->edges_block = -1;
        for (int32_t j = 0; k->edge_set >= 0 && j < nb && k->edges_block < 0; j++)
            if (p->blocks[j].kind == QC_PLAN_EDGES && p->blocks[j].edge_set == k->edge_set)
                k->edges_block = j;
    }
    int32_t open = -1, open_op = -1, last_fwd = -1;
    for (int32_t i = 0; i < p->nev && st == QC_OK; i++) {
        const struct qc_plan_event *e = &p->ev[i];
        const bool marker = e->op <= QC_PLAN_OP_BWD_END;
        if ((marker || e->op == QC_PLAN_OP_STASH || e->op == QC_PLAN_OP_PEAK) &&
            (e->block < 0 || e->block >= nb)) {
            st = qc_errorf(QC_ERR_INVALID, "plan program: event %d names block %d of %d", i,
                           e->block, nb);
            break;
        }
        struct qc_plan_block *k = marker || e->op == QC_PLAN_OP_STASH ? &p->blocks[e->block] : NULL;
        switch ((enum qc_plan_op)e->op) {
        case QC_PLAN_OP_FWD:
        case QC_PLAN_OP_BWD:
            if (open >= 0)
                st = qc_errorf(QC_ERR_INVALID, "plan program: event %d: %s begins inside %s", i,
                               k->name, p->blocks[open].name);
            else if (e->op == QC_PLAN_OP_FWD && (k->fwd_ev >= 0 || e->block <= last_fwd))
                st = qc_errorf(QC_ERR_INVALID,
                               "plan program: event %d: forward of %s twice or out of order", i,
                               k->name);
            else if (e->op == QC_PLAN_OP_BWD && (k->bwd_ev >= 0 || k->fwd_end_ev < 0))
                st = qc_errorf(QC_ERR_INVALID,
                               "plan program: event %d: backward of %s twice or before its "
                               "forward",
                               i, k->name);
            if (st != QC_OK)
                break;
            open = e->block;
            open_op = e->op;
            if (e->op == QC_PLAN_OP_FWD) {
                k->fwd_ev = i;
                last_fwd = e->block;
            } else {
                k->bwd_ev = i;
                p->bwd_order[p->nbwd++] = e->block;
            }
            break;
        case QC_PLAN_OP_FWD_END:
        case QC_PLAN_OP_BWD_END:
            if (open != e->block || open_op != e->op - 1) {
                st = qc_errorf(QC_ERR_INVALID,
                               "plan program: event %d: %s ends what it did not "
                               "begin",
                               i, k->name);
                break;
            }
            if (e->op == QC_PLAN_OP_FWD_END)
                k->fwd_end_ev = i;
            else
                k->bwd_end_ev = i;
            open = -1;
            break;
        case QC_PLAN_OP_ALLOC:
            if (e->id < 0 || e->id >= p->nalloc || astate[e->id] != 0) {
                st = qc_errorf(QC_ERR_INVALID, "plan program: event %d: allocation %d twice", i,
                               e->id);
                break;
            }
            astate[e->id] = 1;
            abytes[e->id] = e->bytes;
            break;
        case QC_PLAN_OP_FREE:
            if (e->id < 0 || e->id >= p->nalloc || astate[e->id] != 1) {
                st = qc_errorf(QC_ERR_INVALID,
                               "plan program: event %d: free of allocation %d "
                               "that is not live",
                               i, e->id);
                break;
            }
            astate[e->id] = 2;
            if (owner[e->id] >= 0) {
                const int32_t o = owner[e->id];
                if (open != o || open_op != QC_PLAN_OP_BWD)
                    st = qc_errorf(QC_ERR_INVALID,
                                   "plan program: event %d: the stash of %s freed outside its "
                                   "backward",
                                   i, p->blocks[o].name);
            }
            break;
        case QC_PLAN_OP_STASH:
            if (e->id < 0 || e->id >= p->nalloc || astate[e->id] != 1 || owner[e->id] >= 0 ||
                k->nstash == QC_PLAN_STASH_MAX || open != e->block || open_op != QC_PLAN_OP_FWD) {
                st = qc_errorf(QC_ERR_INVALID,
                               "plan program: event %d: allocation %d is not a fresh stash arena "
                               "of %s in its forward",
                               i, e->id, k->name);
                break;
            }
            owner[e->id] = e->block;
            k->stash_id[k->nstash++] = e->id;
            k->stash_bytes += abytes[e->id];
            break;
        case QC_PLAN_OP_PEAK:
            if (open != e->block)
                st = qc_errorf(QC_ERR_INVALID,
                               "plan program: event %d: a transient of %s outside "
                               "it",
                               i, p->blocks[e->block].name);
            break;
        case QC_PLAN_OP_COUNT:
            st = qc_errorf(QC_ERR_INVALID, "plan program: event %d: op %d", i, e->op);
            break;
        }
    }
    if (st == QC_OK && open >= 0)
        st = qc_errorf(QC_ERR_INVALID, "plan program: %s never ends", p->blocks[open].name);
    for (int32_t b = 0; b < nb && st == QC_OK; b++)
        if (p->blocks[b].fwd_ev < 0)
            st = qc_errorf(QC_ERR_INVALID, "plan program: block %s has no forward",
                           p->blocks[b].name);
    /* fwd_last: the last forward among the block and its users; bwd_first: the first backward */
    for (int32_t b = 0; b < nb && st == QC_OK; b++) {
        struct qc_plan_block *k = &p->blocks[b];
        k->fwd_last = b;
        k->bwd_first = k->bwd_ev >= 0 ? b : -1;
    }
    for (int32_t i = 0; i < p->nuses && st == QC_OK; i++) {
        const struct qc_plan_use *u = &p->uses[i];
        if (u->user < 0 || u->user >= nb || u->used < 0 || u->used >= nb || u->user <= u->used) {
            st =
                qc_errorf(QC_ERR_INVALID, "plan program: use %d: %d reads %d", i, u->user, u->used);
            break;
        }
        struct qc_plan_block *k = &p->blocks[u->used];
        if (u->user > k->fwd_last)
            k->fwd_last = u->user;
        if (p->blocks[u->user].bwd_ev >= 0 &&
            (k->bwd_first < 0 || bwd_key(p, u->user) < bwd_key(p, k->bwd_first)))
            k->bwd_first = u->user;
    }
    if (st == QC_OK)
        p->finished = true;
out:
    free(abytes);
    free(astate);
    free(owner);
    return st;
}
