/*
 * qcnet_tape.c — the tape: the block applications one forward leaves for backward
 * (qcnet_internal.h, glossary), the forward and backward of each kind of entry. The table of
 * entries itself (adding, finding, an entry's stashes) is qcnet_entry.c's; the recompute of an
 * entry is qcnet_recompute.c's.
 *
 * The encoders and the decoder (qcnet_encoder.c, qcnet_decoder.c) call the *_forward
 * functions here in forward order; each adds one entry, binds its stash tables to memory from
 * the memory context (class QC_MEM_MODEL, tag "<entry>/stash" or the block's own) and runs the
 * block. Their backward calls name the entry by (kind, block, occurrence) and run its backward,
 * which frees its stash. qc_qcnet_release frees whatever is left (a failed or eval step).
 *
 * Each forward and backward is bracketed by entry_fwd / entry_fwd_end and entry_bwd /
 * entry_bwd_end: they time it (the cost model's calibration) and, when the memory context records
 * (qc_qcnet_describe, qc_qcnet_record), write the program's markers, with the uses (an application
 * reads its layer's source context; an unfused source context reads its edge context) and each
 * stash arena's owner.
 *
 * Dry run (m->dry): the blocks do not run. Each block call's memory spec (qc_memspec.h: the
 * function the block's real code takes its memory from) is replayed through the dry memory
 * context instead, so the program holds every allocation and free of every block, transients
 * and the buffers that outlive a call (index arrays, gradient buffers, dL/dr, the CSR by
 * source) alike, with the same tags, sizes and order as a real step. Each block call of the
 * tape is "if (m->dry) replay its spec, else run it"; no block knows about dry runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qc_attn_fused.h" /* QC_ATTN_FUSED_TILE_EDGES_CPU */
#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qc_plan.h"
#include "blocks_internal.h"
#include "qcnet_internal.h"

// ---- brackets of an entry's forward and backward; the tape's check ------------------------

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A program marker (or transient) of entry n when recording. */
static enum qc_status mark(struct qc_qcnet *m, enum qc_plan_op op, int n, uint64_t bytes, int phase)
{
    struct qc_plan_program *rec = qc_memctx_recording(m->mc);
    if (rec && qc_plan_program_event(rec, op, n, -1, bytes, 0, phase) < 0)
        return QC_ERR_NOMEM;
    return QC_OK;
}

/* Entry n reads entry `used`'s stash in its forward and backward (recorded). */
static enum qc_status use(struct qc_qcnet *m, int n, int used)
{
    struct qc_plan_program *rec = qc_memctx_recording(m->mc);
    return rec ? qc_plan_program_use(rec, n, used) : QC_OK;
}

/* The size drivers of entry n for the cost model (recorded). */
static void drivers(struct qc_qcnet *m, int n, int64_t rows, int64_t edges, int64_t srcs,
                    uint64_t redo_bytes)
{
    struct qc_plan_program *rec = qc_memctx_recording(m->mc);
    if (!rec)
        return;
    struct qc_plan_block *b = &rec->blocks[n];
    b->fused = m->cfg.attention == QC_ATTN_FUSED;
    b->rows = rows;
    b->edges = edges;
    b->srcs = srcs;
    b->can_recompute = true;
    b->redo_bytes = redo_bytes;
}

_Static_assert((int)QC_ATTN_EDGE_AUTO == (int)QC_PLAN_EDGE_NONE &&
                   (int)QC_ATTN_EDGE_MATERIALISED == (int)QC_PLAN_EDGE_MATERIALISED &&
                   (int)QC_ATTN_EDGE_TILED == (int)QC_PLAN_EDGE_TILED,
               "edge modes are the planner's");

/* The edge set of entry n and, for an edge context or an application, the mode its r runs in
 * (recorded: the planner prices a tiled set's FE work and chooses the modes, src/plan). */
static void edge_drivers(struct qc_qcnet *m, int n, int set)
{
    struct qc_plan_program *rec = qc_memctx_recording(m->mc);
    if (!rec)
        return;
    struct qc_plan_block *b = &rec->blocks[n];
    b->edge_set = set;
    b->edge_mode = b->kind == QC_PLAN_KV ? QC_PLAN_EDGE_NONE : (uint8_t)m->tape.ed[set].mode;
}

/* Brackets of entry n's forward and backward (module comment). */
static enum qc_status entry_fwd(struct qc_qcnet *m, int n)
{
    QC_TRY(mark(m, QC_PLAN_OP_FWD, n, 0, 0));
    m->tape.t_entry = now_s();
    return QC_OK;
}

/* 16-bit stashes (docs/PRECISION.md): after its forward, an entry's own stash is rounded in
 * place and packed into a fresh arena of half the bytes of its F32 activations (the stash arena
 * the planner sees: its STASH event), the fp32 arena freed; before its backward it is unpacked
 * into a fresh fp32 arena. Rounding first makes the round trip exact, and a recompute rounds
 * the same way, so keep, offload and recompute read the same bits. */
static enum qc_status stash_pack(struct qc_qcnet *m, int n)
{
    struct qcnet_entry *e = &m->tape.e[n];
    struct qc_stash *st = &e->st;
    if (!st->precision || !st->arena || st->packed || !m->tape.need_backward)
        return QC_OK;
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/stash16", e->name);
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, st->packed_arena_bytes, name, &p));
    struct qc_plan_program *rec = qc_memctx_recording(m->mc);
    if (rec &&
        qc_plan_program_event(rec, QC_PLAN_OP_STASH, n, qc_memctx_alloc_id(m->mc, p), 0, 0, 0) < 0)
        return QC_ERR_NOMEM;
    void *old = st->arena;
    m->bytes_stash -= qc_stash_bytes(st);
    qc_stash_round(st, m->ex);
    qc_stash_pack(st, m->ex, p);
    m->bytes_stash += qc_stash_bytes(st);
    qcnet_free(m, old);
    return QC_OK;
}

static enum qc_status stash_unpack(struct qc_qcnet *m, int n)
{
    struct qcnet_entry *e = &m->tape.e[n];
    struct qc_stash *st = &e->st;
    if (!st->packed || !st->arena)
        return QC_OK;
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/stash32", e->name);
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, st->arena_bytes, name, &p));
    void *old = st->arena;
    m->bytes_stash -= qc_stash_bytes(st);
    qc_stash_unpack(st, m->ex, p);
    m->bytes_stash += qc_stash_bytes(st);
    qcnet_free(m, old);
    return QC_OK;
}

static enum qc_status entry_fwd_end(struct qc_qcnet *m, int n)
{
    struct qcnet_entry *e = &m->tape.e[n];
    QC_TRY(stash_pack(m, n));
    if (!m->tape.need_backward) /* eval: no backward reads the stash (its outputs are apart) */
        qcnet_stash_free(m, &e->st);
    e->t_fwd = now_s() - m->tape.t_entry;
    QC_TRY(mark(m, QC_PLAN_OP_FWD_END, n, 0, 0));
    return qcnet_policy_after_forward(m, n);
}

static enum qc_status entry_bwd(struct qc_qcnet *m, int n)
{
    QC_TRY(mark(m, QC_PLAN_OP_BWD, n, 0, 1));
    QC_TRY(qcnet_policy_before_backward(m, n));
    QC_TRY(stash_unpack(m, n));
    m->tape.t_entry = now_s();
    return QC_OK;
}

static enum qc_status entry_bwd_end(struct qc_qcnet *m, int n)
{
    struct qcnet_entry *e = &m->tape.e[n];
    e->t_bwd = now_s() - m->tape.t_entry;
    return mark(m, QC_PLAN_OP_BWD_END, n, 0, 1);
}

enum qc_status qcnet_tape_check(const struct qc_qcnet *m)
{
    const struct qcnet_tape *t = &m->tape;
    size_t stash = 0;
    int apps = 0;
    for (int i = 0; i < t->n_entries; i++) {
        const struct qcnet_entry *e = &t->e[i];
        for (int j = 0; j < i; j++)
            if (t->e[j].kind == e->kind && t->e[j].block == e->block && t->e[j].occ == e->occ &&
                e->block)
                return qc_errorf(QC_ERR_INVALID, "tape: entries %d and %d are both %s occ %d", j, i,
                                 qcnet_kind_str(e->kind), e->occ);
        if (e->kind == QCNET_ATTN) {
            apps++;
            if (e->kv >= 0 &&
                (e->kv >= i || t->e[e->kv].kind != QCNET_KV || t->e[e->kv].block != e->block))
                return qc_errorf(QC_ERR_INVALID, "tape: %s: kv entry %d is not its layer's",
                                 e->name, e->kv);
        }
        if (e->st.arena)
            stash += qc_stash_bytes(&e->st);
        if (e->kv_live && e->kvc.stash.arena)
            stash += qc_stash_bytes(&e->kvc.stash);
        if (e->kind == QCNET_EDGES && t->ed_init[e->set])
            stash += qc_stash_bytes(&t->ed[e->set].fe_stash) + qc_stash_bytes(&t->ed[e->set].stash);
    }
    if (apps != t->n_app)
        return qc_errorf(QC_ERR_INVALID, "tape: %d applications counted, %d on the tape", t->n_app,
                         apps);
    if (t->need_backward && !t->has_loss && stash != m->bytes_stash)
        return qc_errorf(QC_ERR_INVALID, "tape: %zu stash bytes bound, %zu counted", stash,
                         m->bytes_stash);
    return QC_OK;
}

void qc_qcnet_stash_report(const struct qc_qcnet *m, FILE *out)
{
    const struct qcnet_tape *t = &m->tape;
    size_t total = 0;
    for (int i = 0; i < t->n_entries; i++) {
        const struct qcnet_entry *e = &t->e[i];
        if (e->kind != QCNET_ATTN)
            continue;
        size_t b = qc_stash_bytes(&e->st);
        if (e->kv < 0 && e->kv_live)
            b += qc_stash_bytes(&e->kvc.stash);
        fprintf(out, "%-64s %12zu\n", e->name, b);
        total += b;
    }
    fprintf(out, "%-64s %12zu\n", "attention applications (live)", total);
    fprintf(out, "%-64s %12zu\n", "all stashes of the last forward", m->bytes_stash);
}

// ---- FE, MLP ------------------------------------------------------------------------------

enum qc_status qcnet_fe_forward(struct qc_qcnet *m, const struct qc_fourier *fe, const char *tag,
                                const float *c, const struct qcnet_cat *cat, int64_t N, float **out)
{
    const int n = qcnet_entry_add(m, QCNET_FE, fe, tag);
    struct qcnet_entry *e = &m->tape.e[n];
    e->x = c;
    e->rows = N;
    if (cat)
        e->cat = *cat;
    QC_TRY(entry_fwd(m, n));
    drivers(m, n, N, 0, 0,
            (uint64_t)(e->cat.n > 0 ? 2 : 1) * (uint64_t)(N * fe->D) * sizeof(float));
    qc_stash_init(&e->st, "fe");
    qc_fourier_stash_plan(fe, N, &e->st);
    qc_stash_set_precision(&e->st, m->cfg.precision);
    char name[QCNET_ENTRY_NAME + 16];
    float *catbuf = NULL;
    if (e->cat.n > 0) { /* before the stash, as the memory of the first forward was laid out */
        QC_TRY(qcnet_falloc(m, N * fe->D, e->cat.tag, &catbuf));
        QC_TRY(qcnet_cat_sum(m, catbuf, &e->cat, N));
    }
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, n, &e->st, name));
    snprintf(name, sizeof name, "%s/out", tag);
    QC_TRY(qcnet_falloc(m, N * fe->D, name, out));
    if (m->dry) {
        struct qc_memspec ms;
        qc_fourier_memspec(fe, N, false, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_fourier_forward(fe, *out, &e->st, c, catbuf, N));
    }
    qcnet_free(m, catbuf);
    return entry_fwd_end(m, n);
}

enum qc_status qcnet_fe_backward(struct qc_qcnet *m, const struct qc_fourier *fe, int occ,
                                 float *dc, float *dcat, const float *dout)
{
    const int n = qcnet_entry_find(m, QCNET_FE, fe, occ);
    struct qcnet_entry *e = &m->tape.e[n];
    QC_TRY(entry_bwd(m, n));
    if (m->dry) {
        struct qc_memspec ms;
        qc_fourier_memspec(fe, e->rows, true, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_fourier_backward(fe, dc, dcat, dout, &e->st, e->x, e->rows));
    }
    qcnet_stash_free(m, &e->st);
    return entry_bwd_end(m, n);
}

enum qc_status qcnet_mlp_forward(struct qc_qcnet *m, const struct qc_mlp *mlp, const char *tag,
                                 const float *x, int64_t N, float **out)
{
    const int n = qcnet_entry_add(m, QCNET_MLP, mlp, tag);
    struct qcnet_entry *e = &m->tape.e[n];
    e->x = x;
    e->rows = N;
    QC_TRY(entry_fwd(m, n));
    drivers(m, n, N, 0, 0, (uint64_t)(N * mlp->O) * sizeof(float));
    qc_stash_init(&e->st, "mlp");
    qc_mlp_stash_plan(mlp, N, &e->st);
    qc_stash_set_precision(&e->st, m->cfg.precision);
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, n, &e->st, name));
    snprintf(name, sizeof name, "%s/out", tag);
    QC_TRY(qcnet_falloc(m, N * mlp->O, name, out));
    if (m->dry) {
        struct qc_memspec ms;
        qc_mlp_memspec(mlp, N, false, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_mlp_forward(mlp, *out, &e->st, x, N));
    }
    return entry_fwd_end(m, n);
}

enum qc_status qcnet_mlp_backward(struct qc_qcnet *m, const struct qc_mlp *mlp, int occ, float *dx,
                                  const float *dout)
{
    const int n = qcnet_entry_find(m, QCNET_MLP, mlp, occ);
    struct qcnet_entry *e = &m->tape.e[n];
    QC_TRY(entry_bwd(m, n));
    if (m->dry) {
        struct qc_memspec ms;
        qc_mlp_memspec(mlp, e->rows, true, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_mlp_backward(mlp, dx, dout, &e->st, e->x, e->rows));
    }
    qcnet_stash_free(m, &e->st);
    return entry_bwd_end(m, n);
}

// ---- edge contexts, source/edge contexts ----------------------------------------------------

enum qc_status qcnet_edges_setup(struct qc_qcnet *m, int set, const struct qc_fourier *fe,
                                 const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                 float *dcat_table)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_edges *ge = &t->dbatch->graph.e[set]; /* attr: an op argument */
    struct qc_attn_edges *ed = &t->ed[set];
    enum qc_attn_impl impl = m->cfg.attention;
    struct qc_block_mem mem;
    memset(&mem, 0, sizeof mem);
    char name[96];
    snprintf(name, sizeof name, "edges.%s", qc_edge_set_name((enum qc_edge_set)set));
    const int n = qcnet_entry_add(m, QCNET_EDGES, NULL, name);
    t->e[n].set = set;
    QC_TRY(entry_fwd(m, n));
    drivers(m, n, t->g[set].n_dst, t->g[set].n_edge, t->g[set].n_src, 0);
    qc_block_mem_set(&mem, m->mc, name);
    mem.ex = m->ex;
    const float *feat = fe ? ge->attr : NULL;
    if (m->dry) { /* the context without the host work over the graph, its INIT memory */
        struct qc_memspec ms;
        QC_TRY(qc_attn_edges_setup(ed, &mem, impl, &t->g[set], fe, feat, cat_table, cat_idx, ncat,
                                   dcat_table));
        QC_TRY(qc_attn_edges_set_mode(ed, m->edge_mode[set]));
        qc_attn_edges_memspec(ed, QC_ATTN_PASS_INIT, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_attn_edges_init_mem(ed, &mem, impl, &t->g[set], fe, feat, cat_table, cat_idx,
                                      ncat, dcat_table));
    }
    t->ed_init[set] = true; /* deinit gives back what init built, whatever happens next */
    if (!m->dry)
        QC_TRY(qc_attn_edges_set_mode(ed, m->edge_mode[set]));
    m->edge_mode_run[set] = ed->mode;
    edge_drivers(m, n, set);
    snprintf(name, sizeof name, "edges/%s.fe", qc_edge_set_name((enum qc_edge_set)set));
    QC_TRY(qcnet_stash_bind(m, n, &ed->fe_stash, name));
    snprintf(name, sizeof name, "edges/%s.r", qc_edge_set_name((enum qc_edge_set)set));
    QC_TRY(qcnet_stash_bind(m, n, &ed->stash, name));
    if (m->dry) {
        struct qc_memspec ms;
        qc_attn_edges_memspec(ed, QC_ATTN_PASS_FORWARD, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_attn_edges_forward(ed));
    }
    return entry_fwd_end(m, n);
}

enum qc_status qcnet_edges_backward(struct qc_qcnet *m, int set)
{
    struct qcnet_tape *t = &m->tape;
    if (!t->ed_init[set])
        return QC_OK;
    const int n = qcnet_entry_find_edges(m, set);
    struct qc_attn_edges *ed = &t->ed[set];
    QC_TRY(entry_bwd(m, n));
    if (m->dry) {
        struct qc_memspec ms;
        qc_attn_edges_memspec(ed, QC_ATTN_PASS_BACKWARD, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_attn_edges_backward(ed));
    }
    qcnet_stash_free(m, &ed->fe_stash);
    qcnet_stash_free(m, &ed->stash);
    return entry_bwd_end(m, n);
}

/* Entry n reads the edge context of its set when that context has a stash (positional input):
 * unfused, a source context reads r to make k~ and v~; fused with the shared r
 * (attn_edges_shares_r), every application reads r in its forward and backward. */
static enum qc_status use_edges(struct qc_qcnet *m, int n, int set)
{
    if (m->tape.ed[set].stash.n == 0)
        return QC_OK;
    return use(m, n, qcnet_entry_find_edges(m, set));
}

/* kvc of entry e (index n) initialised on layer's edge set, stash bound (tag "<prefix>/kv"),
 * forwarded. */
static enum qc_status kv_forward(struct qc_qcnet *m, int n, const struct qcnet_layer *layer)
{
    struct qcnet_entry *e = &m->tape.e[n];
    qc_attn_kv_init(&e->kvc, &layer->attn, &m->tape.ed[e->set]);
    e->kv_live = true;
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/kv", layer->prefix);
    QC_TRY(qcnet_stash_bind(m, n, &e->kvc.stash, name));
    if (!attn_edges_shares_r(&m->tape.ed[e->set]))
        QC_TRY(use_edges(m, n, e->set));
    if (m->dry) {
        struct qc_memspec ms;
        qc_attn_kv_memspec(&e->kvc, false, &ms);
        return qc_memspec_replay(&ms);
    }
    return qc_attn_kv_forward(&e->kvc, e->x_src);
}

/* Frees entry e's source/edge context (stash memory back to the context) if it is live. */
static void kv_free(struct qc_qcnet *m, struct qcnet_entry *e)
{
    if (!e->kv_live)
        return;
    qcnet_stash_free(m, &e->kvc.stash);
    qc_attn_kv_deinit(&e->kvc);
    e->kv_live = false;
}

/* Dry run: kv_backward's memory (the source context's spec). */
static enum qc_status dry_kv_backward(struct qc_attn_kv *kv)
{
    struct qc_memspec ms;
    qc_attn_kv_memspec(kv, true, &ms);
    return qc_memspec_replay(&ms);
}

enum qc_status qcnet_kv_setup(struct qc_qcnet *m, const struct qcnet_layer *layer, int set,
                              const float *x_src, int *entry)
{
    char name[QCNET_ENTRY_NAME];
    snprintf(name, sizeof name, "%s/kv", layer->prefix);
    const int n = qcnet_entry_add(m, QCNET_KV, layer, name);
    struct qcnet_entry *e = &m->tape.e[n];
    e->set = set;
    e->x_src = x_src;
    *entry = n;
    QC_TRY(entry_fwd(m, n));
    const struct qc_attn_graph *g = &m->tape.g[set];
    drivers(m, n, g->n_dst, g->n_edge, g->n_src, 0);
    edge_drivers(m, n, set);
    QC_TRY(kv_forward(m, n, layer));
    return entry_fwd_end(m, n);
}

enum qc_status qcnet_kv_backward(struct qc_qcnet *m, const struct qcnet_layer *layer, float *dx_src)
{
    const int n = qcnet_entry_find(m, QCNET_KV, layer, 0);
    struct qcnet_entry *e = &m->tape.e[n];
    QC_ASSERT(e->kv_live, "model: backward of %s without its context", e->name);
    QC_TRY(entry_bwd(m, n));
    if (m->dry)
        QC_TRY(dry_kv_backward(&e->kvc));
    else
        QC_TRY(qc_attn_kv_backward(&e->kvc, dx_src, e->x_src, true));
    kv_free(m, e);
    return entry_bwd_end(m, n);
}

void qcnet_kv_drop(struct qc_qcnet *m, const struct qcnet_layer *layer)
{
    kv_free(m, &m->tape.e[qcnet_entry_find(m, QCNET_KV, layer, 0)]);
}

// ---- attention applications ---------------------------------------------------------------

/* Runs application n (its kv resolved) and binds its stash; out allocated. */
static enum qc_status app_forward(struct qc_qcnet *m, int n)
{
    struct qcnet_tape *t = &m->tape;
    struct qcnet_entry *e = &t->e[n];
    struct qc_attn_kv *kv = e->kv >= 0 ? &t->e[e->kv].kvc : &e->kvc;
    const int64_t Nd = kv->ed->g->n_dst;
    if (attn_edges_shares_r(kv->ed))
        QC_TRY(use_edges(m, n, e->set));
    qc_stash_init(&e->st, "attn.app");
    qc_attn_stash_plan(kv, &e->st);
    qc_stash_set_precision(&e->st, m->cfg.precision);
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s.stash", e->name);
    QC_TRY(qcnet_stash_bind(m, n, &e->st, name));
    snprintf(name, sizeof name, "%s.out", e->name);
    QC_TRY(qcnet_falloc(m, Nd * m->D, name, &e->out));
    if (m->dry) {
        struct qc_memspec ms;
        qc_attn_memspec(kv, false, &ms);
        QC_TRY(qc_memspec_replay(&ms));
    } else {
        QC_TRY(qc_attn_forward(kv, e->out, &e->st, e->x, &e->ctx));
    }
    if (!t->need_backward) { /* eval: nothing of this application is read again */
        qcnet_stash_free(m, &e->st);
        if (e->kv < 0)
            kv_free(m, e);
    }
    return QC_OK;
}

/* A new ATTN entry of layer over x_dst on edge set `set`: name, set, dropout keying; its
 * index. */
static int app_add(struct qc_qcnet *m, const struct qcnet_layer *layer, const float *x_dst, int set)
{
    struct qcnet_tape *t = &m->tape;
    const int napp = t->n_app++;
    char name[QCNET_ENTRY_NAME];
    snprintf(name, sizeof name, "%s/app%d", layer->prefix, napp);
    const int n = qcnet_entry_add(m, QCNET_ATTN, layer, name);
    struct qcnet_entry *e = &t->e[n];
    e->x = x_dst;
    e->ctx.training = t->training;
    e->ctx.dropout = (float)m->cfg.dropout;
    e->ctx.seed = t->seed;
    e->ctx.step = t->step;
    e->ctx.site = 2u * (uint32_t)napp;
    e->ctx.edge_key = t->drop_edge_key[set]; /* NULL unless training with dropout */
    e->ctx.row_key = t->drop_row_key[set];
    e->set = set;
    return n;
}

/* The drivers of application n on edge set `set`. */
static void app_drivers(struct qc_qcnet *m, int n, int set)
{
    const struct qc_attn_graph *g = &m->tape.g[set];
    drivers(m, n, g->n_dst, g->n_edge * g->n_query, g->n_src,
            (uint64_t)(g->n_dst * m->D) * sizeof(float));
    edge_drivers(m, n, set);
}

enum qc_status qcnet_attn_apply(struct qc_qcnet *m, const struct qcnet_layer *layer, int kv,
                                const float *x_dst, float **out)
{
    struct qcnet_tape *t = &m->tape;
    QC_ASSERT(kv >= 0 && kv < t->n_entries && t->e[kv].kind == QCNET_KV &&
                  t->e[kv].block == layer && t->e[kv].kv_live,
              "model: kv entry %d is not a live context of %s", kv, layer->prefix);
    const int n = app_add(m, layer, x_dst, t->e[kv].set);
    struct qcnet_entry *e = &t->e[n];
    e->kv = kv;
    e->x_src = t->e[kv].x_src;
    QC_TRY(entry_fwd(m, n));
    app_drivers(m, n, e->set);
    QC_TRY(use(m, n, kv));
    QC_TRY(app_forward(m, n));
    *out = e->out;
    return entry_fwd_end(m, n);
}

enum qc_status qcnet_attn_self(struct qc_qcnet *m, const struct qcnet_layer *layer, int set,
                               const float *x, float **out)
{
    const int n = app_add(m, layer, x, set);
    struct qcnet_entry *e = &m->tape.e[n];
    e->x_src = x;
    QC_TRY(entry_fwd(m, n));
    app_drivers(m, n, set);
    /* the application owns its kv (freed by release even when a step fails) */
    QC_TRY(kv_forward(m, n, layer));
    QC_TRY(app_forward(m, n));
    *out = e->out;
    return entry_fwd_end(m, n);
}

enum qc_status qcnet_attn_backward(struct qc_qcnet *m, const struct qcnet_layer *layer, int occ,
                                   float *dx_dst, const float *dout)
{
    struct qcnet_tape *t = &m->tape;
    const int n = qcnet_entry_find(m, QCNET_ATTN, layer, occ);
    struct qcnet_entry *e = &t->e[n];
    struct qc_attn_kv *kv = e->kv >= 0 ? &t->e[e->kv].kvc : &e->kvc;
    QC_TRY(entry_bwd(m, n)); /* its stashes are resident from here */
    QC_ASSERT((e->kv >= 0 ? t->e[e->kv].kv_live : e->kv_live) && e->st.arena,
              "model: backward of %s without its stash", e->name);
    if (m->dry) {
        struct qc_memspec ms;
        qc_attn_memspec(kv, true, &ms);
        QC_TRY(qc_memspec_replay(&ms));
        if (e->kv < 0)
            QC_TRY(dry_kv_backward(kv));
    } else {
        QC_TRY(qc_attn_backward(kv, dx_dst, dout, &e->st, e->x, &e->ctx));
        if (e->kv < 0)
            QC_TRY(qc_attn_kv_backward(kv, dx_dst, e->x_src, true));
    }
    if (e->kv < 0)
        kv_free(m, e);
    qcnet_stash_free(m, &e->st);
    return entry_bwd_end(m, n);
}

// ---- the trajectory GRU ---------------------------------------------------------------------

enum qc_status qcnet_gru_forward(struct qc_qcnet *m, float *x, int64_t L, int64_t N,
                                 const char *tag, float *last)
{
    const int64_t D = m->D;
    const int n = qcnet_entry_add(m, QCNET_GRU, QCNET_GRU_BLOCK(m), tag);
    struct qcnet_entry *e = &m->tape.e[n];
    e->x = x;
    e->rows = N;
    e->steps = L;
    QC_TRY(entry_fwd(m, n));
    const int64_t ns = qc_gru_forward_scratch_numel(L, N, D);
    drivers(m, n, N, L, 0, (uint64_t)(N * D + ns) * sizeof(float));
    qc_stash_init(&e->st, "gru");
    const int ihs = qc_stash_add(&e->st, "hs", QC_STASH_F32, 3, L + 1, N, D, 1);
    const int igates = qc_stash_add(&e->st, "gates", QC_STASH_F32, 3, L, N, 4 * D, 1);
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, n, &e->st, name));
    float *h0, *scratch;
    snprintf(name, sizeof name, "%s/h0", tag);
    QC_TRY(qcnet_falloc(m, N * D, name, &h0));
    qc_op_tile_forward(m->ex, h0, m->params + m->o_h0, 1, N, D);
    QC_TRY(qcnet_falloc(m, ns, "scratch/gru", &scratch));
    const float *w = qcnet_params_compute(m);
    float *hs = qc_stash_f32(&e->st, ihs), *gates = qc_stash_f32(&e->st, igates);
    qc_op_gru_forward(m->ex, hs, gates, x, h0, w + m->o_gru_wih, w + m->o_gru_bih, w + m->o_gru_whh,
                      w + m->o_gru_bhh, L, N, D, D, scratch);
    qcnet_free(m, scratch);
    qcnet_free(m, h0);
    /* the final state, a copy of its own: the stash may leave the device after this entry */
    qc_op_copy(m->ex, last, hs + L * N * D, (size_t)(N * D) * sizeof(float));
    return entry_fwd_end(m, n);
}

enum qc_status qcnet_gru_backward(struct qc_qcnet *m, int occ, int64_t L, float *dx, float *dh0,
                                  const float *dh_last)
{
    const int64_t D = m->D;
    const int n = qcnet_entry_find(m, QCNET_GRU, QCNET_GRU_BLOCK(m), occ);
    struct qcnet_entry *e = &m->tape.e[n];
    const int64_t N = e->rows;
    QC_TRY(entry_bwd(m, n));
    float *scratch;
    QC_TRY(
        qcnet_falloc(m, qc_gru_backward_scratch_numel(L, N, D), "scratch/gru_backward", &scratch));
    float *g = m->grads;
    const float *w = qcnet_params_compute(m);
    qc_op_gru_backward(m->ex, dx, dh0, g + m->o_gru_wih, g + m->o_gru_bih, g + m->o_gru_whh,
                       g + m->o_gru_bhh, dh_last, qc_stash_f32(&e->st, 0), qc_stash_f32(&e->st, 1),
                       e->x, w + m->o_gru_wih, w + m->o_gru_whh, L, N, D, D, scratch);
    qcnet_free(m, scratch);
    qcnet_stash_free(m, &e->st);
    qcnet_free(m, (float *)(uintptr_t)e->x); /* the input, handed over by the forward */
    e->x = NULL;
    return entry_bwd_end(m, n);
}

enum qc_status qc_qcnet_measure(const struct qc_qcnet *m, struct qc_plan_measure *out, int32_t n)
{
    const struct qcnet_tape *t = &m->tape;
    if (n != t->n_entries)
        return qc_errorf(QC_ERR_INVALID, "model measure: %d block applications asked, %d ran", n,
                         t->n_entries);
    for (int32_t i = 0; i < n; i++) {
        const struct qcnet_entry *e = &t->e[i];
        out[i] = (struct qc_plan_measure){e->t_fwd, e->t_bwd};
    }
    return QC_OK;
}

// ---- release ------------------------------------------------------------------------------

void qcnet_tape_free_contexts(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    qcnet_policy_release(m);
    for (int i = 0; i < t->n_entries; i++) {
        struct qcnet_entry *e = &t->e[i];
        kv_free(m, e);
        qcnet_stash_free(m, &e->st);
    }
    t->n_entries = 0;
    t->n_app = 0;
    for (int s = 0; s < NSET; s++) {
        if (!t->ed_init[s])
            continue;
        qcnet_stash_free(m, &t->ed[s].fe_stash);
        qcnet_stash_free(m, &t->ed[s].stash);
        qc_attn_edges_deinit(&t->ed[s]);
        t->ed_init[s] = false;
    }
}
