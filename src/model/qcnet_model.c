/*
 * qcnet_model.c — the model object (qc_qcnet.h): create/destroy, activation memory through the
 * allocation hook, the attention-application tape, and the forward / loss / backward
 * orchestration over the encoders and the decoder (qcnet_encoder.c, qcnet_decoder.c,
 * qcnet_loss.c).
 *
 * Invariant: every activation of a forward is in m->bufs, every stash table's arena is one of
 * them, and qc_qcnet_release returns all of them to the hook; the blocks' scratch and gradient
 * buffers go through m->blk_hook (counted, freed by the blocks or their contexts' deinit):
 * bytes_live = Σ bufs bytes + bytes_blk. Parameters and gradients come from the hook too
 * (tags "params", "grads"; not in bytes_live).
 */
#include "qc_qcnet.h"

#include <stdlib.h>
#include <string.h>

#include "qc_batch.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qcnet_internal.h"

// ---- allocation hook ----------------------------------------------------------------------

static void count_live(struct qc_qcnet *m, size_t bytes)
{
    m->n_allocs++;
    m->bytes_live += bytes;
    if (m->bytes_live > m->bytes_peak)
        m->bytes_peak = m->bytes_live;
}

/* The blocks' hook: m->hook, counted. */
static void *model_blk_alloc(void *ctx, size_t bytes, const char *tag)
{
    struct qc_qcnet *m = ctx;
    void *p = m->hook.alloc(m->hook.ctx, bytes, tag);
    if (p) {
        m->bytes_blk += bytes;
        count_live(m, bytes);
    }
    return p;
}

static void model_blk_free(void *ctx, void *p, size_t bytes)
{
    struct qc_qcnet *m = ctx;
    m->hook.free(m->hook.ctx, p, bytes);
    QC_ASSERT(m->bytes_blk >= bytes, "model: block scratch freed twice (%zu > %zu live)", bytes,
              m->bytes_blk);
    m->bytes_blk -= bytes;
    m->bytes_live -= bytes;
}

static size_t params_bytes(const struct qc_qcnet *m)
{
    return (size_t)m->nparams * sizeof(float);
}

enum qc_status qcnet_balloc(struct qc_qcnet *m, size_t bytes, const char *tag, void **out)
{
    if (m->nbufs == m->cap_bufs) {
        int cap = m->cap_bufs ? 2 * m->cap_bufs : 256;
        struct qcnet_buf *b = realloc(m->bufs, (size_t)cap * sizeof *b);
        if (!b)
            return qc_errorf(QC_ERR_NOMEM, "model: activation list of %d entries", cap);
        m->bufs = b;
        m->cap_bufs = cap;
    }
    void *p = m->hook.alloc(m->hook.ctx, bytes, tag);
    if (!p)
        return qc_errorf(QC_ERR_NOMEM,
                         "model: allocation of %zu bytes for %s failed (%zu bytes live)\n"
                         "hint: a smaller batch, --attention fused, or a larger device budget",
                         bytes, tag, m->bytes_live);
    m->bufs[m->nbufs].p = p;
    m->bufs[m->nbufs].bytes = bytes;
    m->nbufs++;
    count_live(m, bytes);
    *out = p;
    return QC_OK;
}

enum qc_status qcnet_falloc(struct qc_qcnet *m, int64_t n, const char *tag, float **out)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, (size_t)(n > 0 ? n : 0) * sizeof(float), tag, &p));
    *out = p;
    return QC_OK;
}

enum qc_status qcnet_zalloc(struct qc_qcnet *m, int64_t n, const char *tag, float **out)
{
    QC_TRY(qcnet_falloc(m, n, tag, out));
    if (n > 0)
        memset(*out, 0, (size_t)n * sizeof(float));
    return QC_OK;
}

enum qc_status qcnet_ialloc(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **out)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, (size_t)(n > 0 ? n : 0) * sizeof(int64_t), tag, &p));
    *out = p;
    return QC_OK;
}

void qcnet_free(struct qc_qcnet *m, void *p)
{
    if (!p)
        return;
    for (int i = m->nbufs - 1; i >= 0; i--) {
        if (m->bufs[i].p != p)
            continue;
        m->hook.free(m->hook.ctx, p, m->bufs[i].bytes);
        m->bytes_live -= m->bufs[i].bytes;
        m->bufs[i] = m->bufs[--m->nbufs];
        return;
    }
    QC_ASSERT(false, "model: freeing %p, not an activation of this model", p);
}

static void free_all_bufs(struct qc_qcnet *m)
{
    for (int i = m->nbufs - 1; i >= 0; i--) {
        m->hook.free(m->hook.ctx, m->bufs[i].p, m->bufs[i].bytes);
        m->bytes_live -= m->bufs[i].bytes;
    }
    m->nbufs = 0;
}

enum qc_status qcnet_stash_bind(struct qc_qcnet *m, struct qc_stash *st, const char *tag)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, qc_stash_arena_bytes(st), tag, &p));
    qc_stash_bind(st, p);
    m->bytes_stash += qc_stash_bytes(st);
    return QC_OK;
}

void qcnet_stash_free(struct qc_qcnet *m, struct qc_stash *st)
{
    if (st->arena && !st->owned)
        qcnet_free(m, st->arena);
    st->arena = NULL;
    qc_stash_deinit(st);
}

// ---- lifecycle ----------------------------------------------------------------------------

/* Parameter and gradient buffers from hook h (tags "params", "grads"); none on failure. */
static enum qc_status params_alloc(struct qc_qcnet *m, const struct qc_qcnet_alloc *h,
                                   float **params, float **grads)
{
    const size_t bytes = params_bytes(m);
    float *p = h->alloc(h->ctx, bytes, "params");
    float *g = p ? h->alloc(h->ctx, bytes, "grads") : NULL;
    if (!g) {
        if (p)
            h->free(h->ctx, p, bytes);
        return qc_errorf(QC_ERR_NOMEM,
                         "model: allocation of %zu bytes for %s failed (%lld parameters)\n"
                         "hint: a larger device budget or a smaller model",
                         bytes, p ? "grads" : "params", (long long)m->nparams);
    }
    *params = p;
    *grads = g;
    return QC_OK;
}

static void params_free(struct qc_qcnet *m, const struct qc_qcnet_alloc *h, float *params,
                        float *grads)
{
    if (grads)
        h->free(h->ctx, grads, params_bytes(m));
    if (params)
        h->free(h->ctx, params, params_bytes(m));
}

enum qc_status qc_qcnet_create(const struct qc_qcnet_config *cfg, struct qc_qcnet **out)
{
    return qc_qcnet_create_with_alloc(cfg, NULL, out);
}

enum qc_status qc_qcnet_create_with_alloc(const struct qc_qcnet_config *cfg,
                                          const struct qc_qcnet_alloc *a, struct qc_qcnet **out)
{
    QC_TRY(qc_qcnet_config_validate(cfg));
    struct qc_qcnet *m = calloc(1, sizeof *m);
    if (!m)
        return qc_errorf(QC_ERR_NOMEM, "model: %zu bytes", sizeof *m);
    m->cfg = *cfg;
    m->D = cfg->hidden_dim;
    m->H = cfg->num_heads;
    m->F = cfg->num_freq_bands;
    m->K = cfg->num_modes;
    m->R = cfg->num_recurrent_steps;
    m->NL_map = cfg->num_map_layers;
    m->NL_agent = cfg->num_agent_layers;
    m->NL_dec = cfg->num_dec_layers;
    m->head_out = cfg->num_future_steps * 2 / cfg->num_recurrent_steps;
    m->hook = a ? *a : qc_qcnet_alloc_malloc;
    m->blk_hook.alloc = model_blk_alloc;
    m->blk_hook.free = model_blk_free;
    m->blk_hook.ctx = m;
    enum qc_status s = qcnet_params_build(m);
    if (s == QC_OK)
        s = params_alloc(m, &m->hook, &m->params, &m->grads);
    if (s != QC_OK) {
        qc_qcnet_destroy(m);
        return s;
    }
    memset(m->params, 0, (size_t)m->nparams * sizeof(float));
    memset(m->grads, 0, (size_t)m->nparams * sizeof(float));
    qcnet_params_bind(m);
    *out = m;
    return QC_OK;
}

void qc_qcnet_destroy(struct qc_qcnet *m)
{
    if (!m)
        return;
    qc_qcnet_release(m);
    free(m->bufs);
    params_free(m, &m->hook, m->params, m->grads);
    qcnet_params_free(m);
    free(m);
}

const struct qc_qcnet_config *qc_qcnet_config(const struct qc_qcnet *m)
{
    return &m->cfg;
}

enum qc_status qc_qcnet_set_alloc(struct qc_qcnet *m, const struct qc_qcnet_alloc *a)
{
    QC_ASSERT(m->nbufs == 0 && m->bytes_blk == 0,
              "model: allocation hook changed with %d live activations", m->nbufs);
    const struct qc_qcnet_alloc h = a ? *a : qc_qcnet_alloc_malloc;
    if (h.alloc == m->hook.alloc && h.free == m->hook.free && h.ctx == m->hook.ctx)
        return QC_OK; /* same hook: nothing to re-home */
    /* re-home the parameters and gradients: new copies from the new hook, old ones back */
    float *p = NULL, *g = NULL;
    QC_TRY(params_alloc(m, &h, &p, &g));
    memcpy(p, m->params, params_bytes(m));
    memcpy(g, m->grads, params_bytes(m));
    params_free(m, &m->hook, m->params, m->grads);
    m->hook = h;
    m->params = p;
    m->grads = g;
    qcnet_params_bind(m);
    return QC_OK;
}

void qc_qcnet_set_attention(struct qc_qcnet *m, enum qc_attn_impl impl)
{
    QC_ASSERT(!m->tape.active, "model: attention implementation changed inside a step");
    m->cfg.attention = impl;
}

// ---- memory accounting --------------------------------------------------------------------

void qc_qcnet_mem_get(const struct qc_qcnet *m, struct qc_qcnet_mem *out)
{
    memset(out, 0, sizeof *out);
    out->bytes_live = m->bytes_live;
    out->bytes_peak = m->bytes_peak;
    out->bytes_stash = m->bytes_stash;
    out->bytes_params = 2 * params_bytes(m);
    out->n_allocs = m->n_allocs;
}

void qc_qcnet_mem_reset_peak(struct qc_qcnet *m)
{
    m->bytes_peak = m->bytes_live;
}

void qc_qcnet_stash_report(const struct qc_qcnet *m, FILE *out)
{
    const struct qcnet_tape *t = &m->tape;
    size_t total = 0;
    for (int i = 0; i < t->n_app; i++) {
        size_t b = qc_stash_bytes(&t->app[i].st);
        if (t->app[i].own_kv && t->app[i].kv)
            b += qc_stash_bytes(&t->app[i].kv->stash);
        fprintf(out, "%-64s %12zu\n", t->app[i].name, b);
        total += b;
    }
    fprintf(out, "%-64s %12zu\n", "attention applications (live)", total);
    fprintf(out, "%-64s %12zu\n", "all stashes of the last forward", m->bytes_stash);
}

// ---- attention applications ---------------------------------------------------------------

enum qc_status qcnet_attn_apply(struct qc_qcnet *m, const struct qcnet_layer *layer,
                                struct qc_attn_kv *kv, bool own_kv, const float *x_dst,
                                const float *x_src, const char *tag, float **out)
{
    struct qcnet_tape *t = &m->tape;
    QC_ASSERT(t->n_app < QCNET_MAX_APPS, "model: more than %d attention applications",
              QCNET_MAX_APPS);
    QC_ASSERT(kv->l == &layer->attn, "model: kv of another layer for %s", tag);
    const int n = t->n_app++;
    struct qcnet_app *ap = &t->app[n];
    memset(ap, 0, sizeof *ap);
    ap->kv = kv;
    ap->own_kv = own_kv;
    ap->x_dst = x_dst;
    ap->x_src = x_src;
    snprintf(ap->name, sizeof ap->name, "%s/app%d", tag, n);
    ap->ctx.training = t->training;
    ap->ctx.dropout = (float)m->cfg.dropout;
    ap->ctx.seed = t->seed;
    ap->ctx.step = t->step;
    ap->ctx.site = (t->micro << 16) + 2u * (uint32_t)n;
    const int64_t Nd = kv->ed->g->n_dst;
    qc_stash_init(&ap->st, "attn.app");
    qc_attn_stash_plan(kv, &ap->st);
    char name[128];
    snprintf(name, sizeof name, "%s.stash", ap->name);
    QC_TRY(qcnet_stash_bind(m, &ap->st, name));
    snprintf(name, sizeof name, "%s.out", ap->name);
    QC_TRY(qcnet_falloc(m, Nd * m->D, name, &ap->out));
    QC_TRY(qc_attn_forward(kv, ap->out, &ap->st, x_dst, &ap->ctx));
    if (!t->need_backward) { /* eval: nothing of this application is read again */
        qcnet_stash_free(m, &ap->st);
        if (own_kv) {
            qcnet_stash_free(m, &kv->stash);
            qc_attn_kv_deinit(kv);
            free(kv);
            ap->kv = NULL;
        }
    }
    *out = ap->out;
    return QC_OK;
}

enum qc_status qcnet_attn_self(struct qc_qcnet *m, const struct qcnet_layer *layer,
                               struct qc_attn_edges *ed, const float *x, const char *tag,
                               float **out)
{
    struct qc_attn_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return qc_errorf(QC_ERR_NOMEM, "model: kv context for %s", tag);
    qc_attn_kv_init(kv, &layer->attn, ed);
    char name[128];
    snprintf(name, sizeof name, "%s/kv", tag);
    enum qc_status s = qcnet_stash_bind(m, &kv->stash, name);
    if (s == QC_OK)
        s = qc_attn_kv_forward(kv, x);
    if (s != QC_OK) {
        qcnet_stash_free(m, &kv->stash);
        qc_attn_kv_deinit(kv);
        free(kv);
        return s;
    }
    /* from here the application owns kv (freed by release even when apply fails) */
    s = qcnet_attn_apply(m, layer, kv, true, x, x, tag, out);
    return s;
}

enum qc_status qcnet_attn_app_backward(struct qc_qcnet *m, int n, float *dx_dst, const float *dout)
{
    struct qcnet_app *ap = &m->tape.app[n];
    QC_ASSERT(ap->kv && ap->st.arena, "model: backward of %s without its stash", ap->name);
    QC_TRY(qc_attn_backward(ap->kv, dx_dst, dout, &ap->st, ap->x_dst, &ap->ctx));
    if (ap->own_kv) {
        QC_TRY(qc_attn_kv_backward(ap->kv, dx_dst, ap->x_src, true));
        qcnet_stash_free(m, &ap->kv->stash);
        qc_attn_kv_deinit(ap->kv);
        free(ap->kv);
        ap->kv = NULL;
    }
    qcnet_stash_free(m, &ap->st);
    return QC_OK;
}

/* Frees a kv context (stash memory back to the hook) if it was initialised. */
static void kv_free(struct qc_qcnet *m, struct qc_attn_kv *kv)
{
    if (!kv->l)
        return;
    qcnet_stash_free(m, &kv->stash);
    qc_attn_kv_deinit(kv);
}

void qcnet_tape_free_contexts(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    for (int i = 0; i < t->n_app; i++) {
        struct qcnet_app *ap = &t->app[i];
        if (ap->own_kv && ap->kv) {
            kv_free(m, ap->kv);
            free(ap->kv);
        }
        ap->kv = NULL;
        qcnet_stash_free(m, &ap->st);
    }
    t->n_app = 0;
    for (int i = 0; i < QCNET_MAX_LAYERS; i++) {
        kv_free(m, &t->kv_pt2pl[i]);
        kv_free(m, &t->kv_pl2a[i]);
        kv_free(m, &t->kv_t2m_p[i]);
        kv_free(m, &t->kv_pl2m_p[i]);
        kv_free(m, &t->kv_a2m_p[i]);
        kv_free(m, &t->kv_t2m_r[i]);
        kv_free(m, &t->kv_pl2m_r[i]);
        kv_free(m, &t->kv_a2m_r[i]);
    }
    for (int s = 0; s < NSET; s++) {
        if (!t->ed_init[s])
            continue;
        qcnet_stash_free(m, &t->ed[s].fe_stash);
        qcnet_stash_free(m, &t->ed[s].stash);
        qc_attn_edges_deinit(&t->ed[s]);
        t->ed_init[s] = false;
    }
}

// ---- graph views --------------------------------------------------------------------------

static enum qc_status check_set(const struct qc_graph *g, enum qc_edge_set s, int64_t nsrc,
                                int64_t ndst)
{
    const struct qc_edges *e = &g->e[s];
    if (e->num_src != nsrc || e->num_dst != ndst || (!e->dst_ptr && ndst > 0))
        return qc_errorf(QC_ERR_INVALID,
                         "model: edge set %s: %lld sources / %lld destinations, expected %lld / "
                         "%lld",
                         qc_edge_set_name(s), (long long)e->num_src, (long long)e->num_dst,
                         (long long)nsrc, (long long)ndst);
    return QC_OK;
}

static void view(struct qc_attn_graph *v, const struct qc_edges *e, int64_t n_src, int64_t n_dst,
                 int64_t n_bdst, int64_t Q, const int64_t *src, const int64_t *query_row)
{
    memset(v, 0, sizeof *v);
    v->n_src = n_src;
    v->n_dst = n_dst;
    v->n_bdst = n_bdst;
    v->n_query = Q;
    v->n_edge = e->num_edges;
    v->row_ptr = e->dst_ptr;
    v->src = src ? src : e->src;
    v->query_row = query_row;
}

static enum qc_status tape_graphs(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_graph *g = &t->batch->graph;
    const int64_t A = t->A, P = t->P, Pt = t->Pt, K = t->K, T = QCNET_T;
    QC_TRY(check_set(g, QC_EDGE_PT2PL, Pt, P));
    QC_TRY(check_set(g, QC_EDGE_PL2PL, P, P));
    QC_TRY(check_set(g, QC_EDGE_T, T * A, T * A));
    QC_TRY(check_set(g, QC_EDGE_PL2A, T * P, T * A));
    QC_TRY(check_set(g, QC_EDGE_A2A, T * A, T * A));
    QC_TRY(check_set(g, QC_EDGE_T2M, T * A, A));
    QC_TRY(check_set(g, QC_EDGE_PL2M, P, A));
    QC_TRY(check_set(g, QC_EDGE_A2M, A, A));
    QC_TRY(check_set(g, QC_EDGE_M2M, K * A, K * A));
    /* pl2a sources are polygon-steps t·P + p whose features are x_pl[p] at every t: read the
     * polygon row directly (QCNET.md §8.8 polygon time-broadcast) */
    const struct qc_edges *pl2a = &g->e[QC_EDGE_PL2A];
    QC_TRY(qcnet_ialloc(m, pl2a->num_edges, "graph/pl2a.src_polygon", &t->pl2a_src));
    for (int64_t e = 0; e < pl2a->num_edges; e++)
        t->pl2a_src[e] = pl2a->src[e] % P;
    /* pl2m and a2m queries are mode-major rows k·A + a */
    QC_TRY(qcnet_ialloc(m, A * K, "graph/mode_major_query", &t->pl2m_query));
    for (int64_t a = 0; a < A; a++)
        for (int64_t k = 0; k < K; k++)
            t->pl2m_query[a * K + k] = k * A + a;
    const struct qc_edges *pl2pl = &g->e[QC_EDGE_PL2PL];
    QC_TRY(qcnet_ialloc(m, pl2pl->num_edges, "graph/pl2pl.type", &t->pl2pl_type));
    for (int64_t e = 0; e < pl2pl->num_edges; e++)
        t->pl2pl_type[e] = pl2pl->type ? (int64_t)pl2pl->type[e] : 0;

    view(&t->g[QC_EDGE_PT2PL], &g->e[QC_EDGE_PT2PL], Pt, P, P, 1, NULL, NULL);
    view(&t->g[QC_EDGE_PL2PL], pl2pl, P, P, P, 1, NULL, NULL);
    view(&t->g[QC_EDGE_T], &g->e[QC_EDGE_T], T * A, T * A, T * A, 1, NULL, NULL);
    view(&t->g[QC_EDGE_PL2A], pl2a, P, T * A, T * A, 1, t->pl2a_src, NULL);
    view(&t->g[QC_EDGE_A2A], &g->e[QC_EDGE_A2A], T * A, T * A, T * A, 1, NULL, NULL);
    view(&t->g[QC_EDGE_T2M], &g->e[QC_EDGE_T2M], T * A, K * A, A, K, NULL, NULL);
    view(&t->g[QC_EDGE_PL2M], &g->e[QC_EDGE_PL2M], P, K * A, A, K, NULL, t->pl2m_query);
    view(&t->g[QC_EDGE_A2M], &g->e[QC_EDGE_A2M], A, K * A, A, K, NULL, t->pl2m_query);
    view(&t->g[QC_EDGE_M2M], &g->e[QC_EDGE_M2M], K * A, K * A, K * A, 1, NULL, NULL);
    return QC_OK;
}

enum qc_status qcnet_edges_setup(struct qc_qcnet *m, int set, const struct qc_fourier *fe,
                                 const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                 float *dcat_table)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_edges *e = &t->batch->graph.e[set];
    struct qc_attn_edges *ed = &t->ed[set];
    enum qc_attn_impl impl = m->cfg.attention;
    struct qc_block_mem mem;
    char name[96];
    snprintf(name, sizeof name, "edges.%s", qc_edge_set_name((enum qc_edge_set)set));
    qc_block_mem_set(&mem, &m->blk_hook, name);
    QC_TRY(qc_attn_edges_init_mem(ed, &mem, impl, &t->g[set], fe, fe ? e->attr : NULL, cat_table,
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
    QC_TRY(qc_attn_edges_backward(&t->ed[set]));
    qcnet_stash_free(m, &t->ed[set].fe_stash);
    qcnet_stash_free(m, &t->ed[set].stash);
    return QC_OK;
}

enum qc_status qcnet_kv_setup(struct qc_qcnet *m, struct qc_attn_kv *kv,
                              const struct qcnet_layer *layer, int set, const float *x_src)
{
    qc_attn_kv_init(kv, &layer->attn, &m->tape.ed[set]);
    char name[128];
    snprintf(name, sizeof name, "%s/kv", layer->prefix);
    QC_TRY(qcnet_stash_bind(m, &kv->stash, name));
    return qc_attn_kv_forward(kv, x_src);
}

enum qc_status qcnet_kv_backward(struct qc_qcnet *m, struct qc_attn_kv *kv, float *dx_src,
                                 const float *x_src)
{
    QC_TRY(qc_attn_kv_backward(kv, dx_src, x_src, true));
    qcnet_stash_free(m, &kv->stash);
    qc_attn_kv_deinit(kv);
    return QC_OK;
}

enum qc_status qcnet_fe_forward(struct qc_qcnet *m, const struct qc_fourier *fe,
                                struct qc_stash *st, const char *tag, const float *c,
                                const float *cat, int64_t N, float **out)
{
    qc_stash_init(st, "fe");
    qc_fourier_stash_plan(fe, N, st);
    char name[128];
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, st, name));
    snprintf(name, sizeof name, "%s/out", tag);
    QC_TRY(qcnet_falloc(m, N * fe->D, name, out));
    return qc_fourier_forward(fe, *out, st, c, cat, N);
}

enum qc_status qcnet_mlp_forward(struct qc_qcnet *m, const struct qc_mlp *mlp, struct qc_stash *st,
                                 const char *tag, const float *x, int64_t N, float **out)
{
    qc_stash_init(st, "mlp");
    qc_mlp_stash_plan(mlp, N, st);
    char name[128];
    snprintf(name, sizeof name, "%s/stash", tag);
    QC_TRY(qcnet_stash_bind(m, st, name));
    snprintf(name, sizeof name, "%s/out", tag);
    QC_TRY(qcnet_falloc(m, N * mlp->O, name, out));
    return qc_mlp_forward(mlp, *out, st, x, N);
}

// ---- forward / loss / backward --------------------------------------------------------------

void qc_qcnet_release(struct qc_qcnet *m)
{
    qcnet_tape_free_contexts(m);
    free_all_bufs(m);
    /* the stash tables' arenas were in the buffers: forget them */
    struct qcnet_tape *t = &m->tape;
    memset(t, 0, sizeof *t);
}

enum qc_status qc_qcnet_forward(struct qc_qcnet *m, const struct qc_batch *batch,
                                const struct qc_qcnet_ctx *ctx, struct qc_qcnet_output *out)
{
    qc_qcnet_release(m);
    if (!batch->has_graph)
        return qc_errorf(QC_ERR_INVALID, "model forward: the batch has no graph\n"
                                         "hint: qc_batch_build_graph() first");
    if (batch->graph.num_modes != m->K)
        return qc_errorf(QC_ERR_INVALID,
                         "model forward: the graph was built for %lld modes, the model has %lld",
                         (long long)batch->graph.num_modes, (long long)m->K);
    if (batch->num_agents < 1)
        return qc_errorf(QC_ERR_INVALID, "model forward: the batch has no agents");
    struct qcnet_tape *t = &m->tape;
    t->active = true;
    t->batch = batch;
    t->A = batch->num_agents;
    t->P = batch->num_polygons;
    t->Pt = batch->num_points;
    t->K = m->K;
    t->S = QCNET_S;
    t->training = ctx && ctx->training;
    t->need_backward = !ctx || ctx->need_backward;
    t->seed = ctx ? ctx->seed : 0;
    t->step = ctx ? ctx->step : 0;
    t->micro = ctx ? ctx->micro : 0;
    m->bytes_stash = 0;
    enum qc_status s = tape_graphs(m);
    if (s == QC_OK)
        s = qcnet_map_forward(m);
    if (s == QC_OK)
        s = qcnet_agent_forward(m);
    if (s == QC_OK)
        s = qcnet_decoder_forward(m);
    if (s != QC_OK) {
        qc_qcnet_release(m);
        return s;
    }
    if (out) {
        memset(out, 0, sizeof *out);
        out->A = t->A;
        out->K = t->K;
        out->S = t->S;
        out->D = m->D;
        out->P = t->P;
        out->Pt = t->Pt;
        out->loc_propose_pos = t->loc_propose;
        out->scale_propose_pos = t->scale_propose;
        out->loc_refine_pos = t->loc_refine;
        out->scale_refine_pos = t->scale_refine;
        out->pi = t->pi;
        out->x_pt = t->x_pt;
        out->x_pl = t->x_pl;
        out->x_a = t->x_a;
    }
    return QC_OK;
}

enum qc_status qc_qcnet_backward(struct qc_qcnet *m, float dloss_scale)
{
    struct qcnet_tape *t = &m->tape;
    if (!t->active || !t->need_backward)
        return qc_errorf(QC_ERR_INVALID, "model backward: no forward with need_backward");
    if (!t->has_loss)
        return qc_errorf(QC_ERR_INVALID, "model backward: call qc_qcnet_loss first");
    const int64_t A = t->A, K = t->K, S = t->S, D = m->D, P = t->P;
    const int64_t n = A * K * S * 2;
    float *dloc_p, *dscale_p, *dloc_r, *dscale_r, *dpi, *dx_pl, *dx_a;
    QC_TRY(qcnet_falloc(m, n, "loss/dloc_propose", &dloc_p));
    QC_TRY(qcnet_falloc(m, n, "loss/dscale_propose", &dscale_p));
    QC_TRY(qcnet_falloc(m, n, "loss/dloc_refine", &dloc_r));
    QC_TRY(qcnet_falloc(m, n, "loss/dscale_refine", &dscale_r));
    QC_TRY(qcnet_falloc(m, A * K, "loss/dpi", &dpi));
    QC_TRY(qcnet_loss_backward(m, dloss_scale, dloc_p, dscale_p, dloc_r, dscale_r, dpi));
    QC_TRY(qcnet_zalloc(m, P * D, "grad/x_pl", &dx_pl));
    QC_TRY(qcnet_zalloc(m, QCNET_T * A * D, "grad/x_a", &dx_a));
    QC_TRY(qcnet_decoder_backward(m, dloc_p, dscale_p, dloc_r, dscale_r, dpi, dx_pl, dx_a));
    qcnet_free(m, dloc_p);
    qcnet_free(m, dscale_p);
    qcnet_free(m, dloc_r);
    qcnet_free(m, dscale_r);
    qcnet_free(m, dpi);
    QC_TRY(qcnet_agent_backward(m, dx_a, dx_pl));
    qcnet_free(m, dx_a);
    QC_TRY(qcnet_map_backward(m, dx_pl));
    qcnet_free(m, dx_pl);
    t->need_backward = false; /* one backward per forward */
    return QC_OK;
}
