/*
 * qcnet_tape.c — the tape: the table of block applications one forward leaves for backward
 * (qcnet_internal.h, glossary), and the forward and backward of each kind of entry.
 *
 * The encoders and the decoder (qcnet_encoder.c, qcnet_decoder.c) call the *_forward
 * functions here in forward order; each adds one entry, binds its stash tables to memory from
 * the memory context (class QC_MEM_MODEL, tag "<entry>/stash" or the block's own) and runs the
 * block. Their backward calls name the entry by (kind, block, occurrence) and run its backward,
 * which frees its stash. qc_qcnet_release frees whatever is left (a failed or eval step).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qcnet_internal.h"

// ---- entries ------------------------------------------------------------------------------

static const char *kind_str(enum qcnet_kind k)
{
    static const char *const names[] = {"fe", "edges", "kv", "attn", "mlp", "gru"};
    return (int)k >= 0 && k <= QCNET_GRU ? names[k] : "?";
}

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
    return n;
}

int qcnet_entry_find(const struct qc_qcnet *m, enum qcnet_kind kind, const void *block, int occ)
{
    const struct qcnet_tape *t = &m->tape;
    for (int i = 0; i < t->n_entries; i++)
        if (t->e[i].kind == kind && t->e[i].block == block && t->e[i].occ == occ)
            return i;
    QC_ASSERT(false, "model: no %s entry of occurrence %d on the tape", kind_str(kind), occ);
    return -1;
}

/* The EDGES entry of set s. */
static int edges_entry(const struct qc_qcnet *m, int s)
{
    const struct qcnet_tape *t = &m->tape;
    for (int i = 0; i < t->n_entries; i++)
        if (t->e[i].kind == QCNET_EDGES && t->e[i].set == s)
            return i;
    QC_ASSERT(false, "model: no edge context of set %d on the tape", s);
    return -1;
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
                                 kind_str(e->kind), e->occ);
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
                                const float *c, const float *cat, int64_t N, float **out)
{
    const int n = qcnet_entry_add(m, QCNET_FE, fe, tag);
    struct qcnet_entry *e = &m->tape.e[n];
    e->x = c;
    e->rows = N;
    qc_stash_init(&e->st, "fe");
    qc_fourier_stash_plan(fe, N, &e->st);
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, &e->st, name));
    snprintf(name, sizeof name, "%s/out", tag);
    QC_TRY(qcnet_falloc(m, N * fe->D, name, out));
    return qc_fourier_forward(fe, *out, &e->st, c, cat, N);
}

enum qc_status qcnet_fe_backward(struct qc_qcnet *m, const struct qc_fourier *fe, float *dc,
                                 float *dcat, const float *dout)
{
    struct qcnet_entry *e = &m->tape.e[qcnet_entry_find(m, QCNET_FE, fe, 0)];
    QC_TRY(qc_fourier_backward(fe, dc, dcat, dout, &e->st, e->x, e->rows));
    qcnet_stash_free(m, &e->st);
    return QC_OK;
}

enum qc_status qcnet_mlp_forward(struct qc_qcnet *m, const struct qc_mlp *mlp, const char *tag,
                                 const float *x, int64_t N, float **out)
{
    const int n = qcnet_entry_add(m, QCNET_MLP, mlp, tag);
    struct qcnet_entry *e = &m->tape.e[n];
    e->x = x;
    e->rows = N;
    qc_stash_init(&e->st, "mlp");
    qc_mlp_stash_plan(mlp, N, &e->st);
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, &e->st, name));
    snprintf(name, sizeof name, "%s/out", tag);
    QC_TRY(qcnet_falloc(m, N * mlp->O, name, out));
    return qc_mlp_forward(mlp, *out, &e->st, x, N);
}

enum qc_status qcnet_mlp_backward(struct qc_qcnet *m, const struct qc_mlp *mlp, int occ, float *dx,
                                  const float *dout)
{
    struct qcnet_entry *e = &m->tape.e[qcnet_entry_find(m, QCNET_MLP, mlp, occ)];
    QC_TRY(qc_mlp_backward(mlp, dx, dout, &e->st, e->x, e->rows));
    qcnet_stash_free(m, &e->st);
    return QC_OK;
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
    qc_block_mem_set(&mem, m->mc, name);
    mem.ex = m->ex;
    QC_TRY(qc_attn_edges_init_mem(ed, &mem, impl, &t->g[set], fe, fe ? ge->attr : NULL, cat_table,
                                  cat_idx, ncat, dcat_table));
    t->ed_init[set] = true;
    snprintf(name, sizeof name, "edges/%s.fe", qc_edge_set_name((enum qc_edge_set)set));
    QC_TRY(qcnet_stash_bind(m, &ed->fe_stash, name));
    snprintf(name, sizeof name, "edges/%s.r", qc_edge_set_name((enum qc_edge_set)set));
    QC_TRY(qcnet_stash_bind(m, &ed->stash, name));
    return qc_attn_edges_forward(ed);
}

enum qc_status qcnet_edges_backward(struct qc_qcnet *m, int set)
{
    struct qcnet_tape *t = &m->tape;
    if (!t->ed_init[set])
        return QC_OK;
    (void)edges_entry(m, set);
    QC_TRY(qc_attn_edges_backward(&t->ed[set]));
    qcnet_stash_free(m, &t->ed[set].fe_stash);
    qcnet_stash_free(m, &t->ed[set].stash);
    return QC_OK;
}

/* kvc of entry e initialised on layer's edge set, stash bound (tag "<prefix>/kv"), forwarded. */
static enum qc_status kv_forward(struct qc_qcnet *m, struct qcnet_entry *e,
                                 const struct qcnet_layer *layer)
{
    qc_attn_kv_init(&e->kvc, &layer->attn, &m->tape.ed[e->set]);
    e->kv_live = true;
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/kv", layer->prefix);
    QC_TRY(qcnet_stash_bind(m, &e->kvc.stash, name));
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
    return kv_forward(m, e, layer);
}

enum qc_status qcnet_kv_backward(struct qc_qcnet *m, const struct qcnet_layer *layer, float *dx_src)
{
    struct qcnet_entry *e = &m->tape.e[qcnet_entry_find(m, QCNET_KV, layer, 0)];
    QC_ASSERT(e->kv_live, "model: backward of %s without its context", e->name);
    QC_TRY(qc_attn_kv_backward(&e->kvc, dx_src, e->x_src, true));
    kv_free(m, e);
    return QC_OK;
}

void qcnet_kv_drop(struct qc_qcnet *m, const struct qcnet_layer *layer)
{
    kv_free(m, &m->tape.e[qcnet_entry_find(m, QCNET_KV, layer, 0)]);
}

// ---- attention applications ---------------------------------------------------------------

/* Runs application e (its kv resolved) and binds its stash; out allocated. */
static enum qc_status app_forward(struct qc_qcnet *m, struct qcnet_entry *e)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_attn_kv *kv = e->kv >= 0 ? &t->e[e->kv].kvc : &e->kvc;
    const int64_t Nd = kv->ed->g->n_dst;
    qc_stash_init(&e->st, "attn.app");
    qc_attn_stash_plan(kv, &e->st);
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s.stash", e->name);
    QC_TRY(qcnet_stash_bind(m, &e->st, name));
    snprintf(name, sizeof name, "%s.out", e->name);
    QC_TRY(qcnet_falloc(m, Nd * m->D, name, &e->out));
    QC_TRY(qc_attn_forward(kv, e->out, &e->st, e->x, &e->ctx));
    if (!t->need_backward) { /* eval: nothing of this application is read again */
        qcnet_stash_free(m, &e->st);
        if (e->kv < 0)
            kv_free(m, e);
    }
    return QC_OK;
}

/* A new ATTN entry of layer over x_dst: name, dropout keying. */
static struct qcnet_entry *app_add(struct qc_qcnet *m, const struct qcnet_layer *layer,
                                   const float *x_dst)
{
    struct qcnet_tape *t = &m->tape;
    const int napp = t->n_app++;
    char name[QCNET_ENTRY_NAME];
    snprintf(name, sizeof name, "%s/app%d", layer->prefix, napp);
    struct qcnet_entry *e = &t->e[qcnet_entry_add(m, QCNET_ATTN, layer, name)];
    e->x = x_dst;
    e->ctx.training = t->training;
    e->ctx.dropout = (float)m->cfg.dropout;
    e->ctx.seed = t->seed;
    e->ctx.step = t->step;
    e->ctx.site = (t->micro << 16) + 2u * (uint32_t)napp;
    return e;
}

enum qc_status qcnet_attn_apply(struct qc_qcnet *m, const struct qcnet_layer *layer, int kv,
                                const float *x_dst, float **out)
{
    struct qcnet_tape *t = &m->tape;
    QC_ASSERT(kv >= 0 && kv < t->n_entries && t->e[kv].kind == QCNET_KV &&
                  t->e[kv].block == layer && t->e[kv].kv_live,
              "model: kv entry %d is not a live context of %s", kv, layer->prefix);
    struct qcnet_entry *e = app_add(m, layer, x_dst);
    e->kv = kv;
    e->set = t->e[kv].set;
    e->x_src = t->e[kv].x_src;
    QC_TRY(app_forward(m, e));
    *out = e->out;
    return QC_OK;
}

enum qc_status qcnet_attn_self(struct qc_qcnet *m, const struct qcnet_layer *layer, int set,
                               const float *x, float **out)
{
    struct qcnet_entry *e = app_add(m, layer, x);
    e->set = set;
    e->x_src = x;
    /* the application owns its kv (freed by release even when a step fails) */
    QC_TRY(kv_forward(m, e, layer));
    QC_TRY(app_forward(m, e));
    *out = e->out;
    return QC_OK;
}

enum qc_status qcnet_attn_backward(struct qc_qcnet *m, const struct qcnet_layer *layer, int occ,
                                   float *dx_dst, const float *dout)
{
    struct qcnet_tape *t = &m->tape;
    struct qcnet_entry *e = &t->e[qcnet_entry_find(m, QCNET_ATTN, layer, occ)];
    struct qc_attn_kv *kv = e->kv >= 0 ? &t->e[e->kv].kvc : &e->kvc;
    QC_ASSERT((e->kv >= 0 ? t->e[e->kv].kv_live : e->kv_live) && e->st.arena,
              "model: backward of %s without its stash", e->name);
    QC_TRY(qc_attn_backward(kv, dx_dst, dout, &e->st, e->x, &e->ctx));
    if (e->kv < 0) {
        QC_TRY(qc_attn_kv_backward(kv, dx_dst, e->x_src, true));
        kv_free(m, e);
    }
    qcnet_stash_free(m, &e->st);
    return QC_OK;
}

// ---- the trajectory GRU ---------------------------------------------------------------------

enum qc_status qcnet_gru_forward(struct qc_qcnet *m, const float *x, int64_t L, int64_t N,
                                 const char *tag, float **hs, float **gates)
{
    const int64_t D = m->D;
    const int n = qcnet_entry_add(m, QCNET_GRU, NULL, tag);
    struct qcnet_entry *e = &m->tape.e[n];
    e->x = x;
    e->rows = N;
    qc_stash_init(&e->st, "gru");
    const int ihs = qc_stash_add(&e->st, "hs", QC_STASH_F32, 3, L + 1, N, D, 1);
    const int igates = qc_stash_add(&e->st, "gates", QC_STASH_F32, 3, L, N, 4 * D, 1);
    char name[QCNET_ENTRY_NAME + 16];
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, &e->st, name));
    float *h0, *scratch;
    snprintf(name, sizeof name, "%s/h0", tag);
    QC_TRY(qcnet_falloc(m, N * D, name, &h0));
    qc_op_tile_forward(m->ex, h0, m->params + m->o_h0, 1, N, D);
    QC_TRY(qcnet_falloc(m, qc_gru_forward_scratch_numel(L, N, D), "scratch/gru", &scratch));
    const float *w = m->params;
    *hs = qc_stash_f32(&e->st, ihs);
    *gates = qc_stash_f32(&e->st, igates);
    qc_op_gru_forward(m->ex, *hs, *gates, x, h0, w + m->o_gru_wih, w + m->o_gru_bih,
                      w + m->o_gru_whh, w + m->o_gru_bhh, L, N, D, D, scratch);
    qcnet_free(m, scratch);
    qcnet_free(m, h0);
    return QC_OK;
}

enum qc_status qcnet_gru_backward(struct qc_qcnet *m, int64_t L, float *dx, float *dh0,
                                  const float *dh_last)
{
    const int64_t D = m->D;
    struct qcnet_entry *e = &m->tape.e[qcnet_entry_find(m, QCNET_GRU, NULL, 0)];
    const int64_t N = e->rows;
    float *scratch;
    QC_TRY(
        qcnet_falloc(m, qc_gru_backward_scratch_numel(L, N, D), "scratch/gru_backward", &scratch));
    float *g = m->grads;
    const float *w = m->params;
    qc_op_gru_backward(m->ex, dx, dh0, g + m->o_gru_wih, g + m->o_gru_bih, g + m->o_gru_whh,
                       g + m->o_gru_bhh, dh_last, qc_stash_f32(&e->st, 0), qc_stash_f32(&e->st, 1),
                       e->x, w + m->o_gru_wih, w + m->o_gru_whh, L, N, D, D, scratch);
    qcnet_free(m, scratch);
    qcnet_stash_free(m, &e->st);
    return QC_OK;
}

// ---- release ------------------------------------------------------------------------------

void qcnet_tape_free_contexts(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
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
