/*
 * qcnet_entry.c — the tape's entries as rows of a table (qcnet_internal.h, glossary): adding one
 * (and its block to a recording program), finding one by (kind, block, occ) or an edge set's
 * EDGES entry, an entry's stash tables with the tags their arenas are bound under, and the
 * entries whose stashes its backward reads. Nothing here runs a block.
 *
 * Below qcnet_recompute.c, qcnet_policy.c and qcnet_tape.c, which read the table through it.
 */
#include <stdio.h>
#include <string.h>

#include "qc_graph.h"
#include "qc_plan.h"
#include "blocks_internal.h"
#include "qcnet_internal.h"

// ---- adding and finding entries -------------------------------------------------------------

int qcnet_entry_add(struct qc_qcnet *m, enum qcnet_kind kind, const void *block, const char *name)
{
    struct qcnet_tape *t = &m->tape;
    QC_ASSERT(t->n_entries < QCNET_MAX_ENTRIES, "model: more than %d block applications",
              QCNET_MAX_ENTRIES);
    int occ = 0;
    for (int i = 0; i < t->n_entries; i++)
        occ += t->e[i].kind == kind && t->e[i].block == block && block;
    const int n = t->n_entries++;
    struct qcnet_entry *e = &t->e[n];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    e->block = block;
    e->occ = occ;
    e->set = -1;
    e->kv = -1;
    struct qc_plan_program *rec = qc_memctx_recording(m->mc);
    if (rec) {
        const int32_t b = qc_plan_program_block(rec, name, (enum qc_plan_kind)kind);
        QC_ASSERT(b == n, "model: recording out of step with the tape (block %d, entry %d)", b, n);
    }
    return n;
}

_Static_assert((int)QCNET_FE == (int)QC_PLAN_FE && (int)QCNET_EDGES == (int)QC_PLAN_EDGES &&
                   (int)QCNET_KV == (int)QC_PLAN_KV && (int)QCNET_ATTN == (int)QC_PLAN_ATTN &&
                   (int)QCNET_MLP == (int)QC_PLAN_MLP && (int)QCNET_GRU == (int)QC_PLAN_GRU,
               "tape kinds are the planner's kinds");

int qcnet_entry_find(const struct qc_qcnet *m, enum qcnet_kind kind, const void *block, int occ)
{
    const struct qcnet_tape *t = &m->tape;
    for (int i = 0; i < t->n_entries; i++)
        if (t->e[i].kind == kind && t->e[i].block == block && t->e[i].occ == occ)
            return i;
    QC_ASSERT(false, "model: no %s entry of occurrence %d on the tape", qcnet_kind_str(kind), occ);
    return -1;
}

int qcnet_entry_find_edges(const struct qc_qcnet *m, int s)
{
    const struct qcnet_tape *t = &m->tape;
    for (int i = 0; i < t->n_entries; i++)
        if (t->e[i].kind == QCNET_EDGES && t->e[i].set == s)
            return i;
    QC_ASSERT(false, "model: no edge context of set %d on the tape", s);
    return -1;
}

// ---- what the stash policies need (qcnet_policy.c) -------------------------------------------

int qcnet_entry_stashes(struct qc_qcnet *m, int n, struct qc_stash *st[3], char tag[3][160])
{
    struct qcnet_tape *t = &m->tape;
    struct qcnet_entry *e = &t->e[n];
    const struct qcnet_layer *layer = e->block;
    int k = 0;
    switch (e->kind) {
    case QCNET_FE:
    case QCNET_MLP:
    case QCNET_GRU:
        st[k] = &e->st;
        snprintf(tag[k++], 160, "%s/stash", e->name);
        break;
    case QCNET_KV:
        st[k] = &e->kvc.stash;
        snprintf(tag[k++], 160, "%s", e->name);
        break;
    case QCNET_ATTN:
        if (e->kv < 0) {
            st[k] = &e->kvc.stash;
            snprintf(tag[k++], 160, "%s/kv", layer->prefix);
        }
        st[k] = &e->st;
        snprintf(tag[k++], 160, "%s.stash", e->name);
        break;
    case QCNET_EDGES:
        st[k] = &t->ed[e->set].fe_stash;
        snprintf(tag[k++], 160, "edges/%s.fe", qc_edge_set_name((enum qc_edge_set)e->set));
        st[k] = &t->ed[e->set].stash;
        snprintf(tag[k++], 160, "edges/%s.r", qc_edge_set_name((enum qc_edge_set)e->set));
        break;
    }
    return k;
}

int qcnet_entry_needs(const struct qc_qcnet *m, int n, int out[3])
{
    const struct qcnet_tape *t = &m->tape;
    const struct qcnet_entry *e = &t->e[n];
    int k = 0;
    out[k++] = n;
    if (e->kind == QCNET_ATTN && e->kv >= 0)
        out[k++] = e->kv;
    /* the edge context's r (use_edges): an unfused source context's, a fused application's */
    if (e->kind != QCNET_KV && e->kind != QCNET_ATTN)
        return k;
    const struct qc_attn_edges *ed = &t->ed[e->set];
    const bool owns_kv = e->kind == QCNET_KV || e->kv < 0;
    const bool reads_r = attn_edges_shares_r(ed) ? e->kind == QCNET_ATTN : owns_kv;
    if (reads_r && ed->stash.n > 0)
        out[k++] = qcnet_entry_find_edges(m, e->set);
    return k;
}
