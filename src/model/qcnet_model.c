/*
 * qcnet_model.c — the model object (qc_qcnet.h): create/destroy, activation memory through the
 * memory context (qc_memctx.h), the attention-application tape, and the forward / loss /
 * backward orchestration over the encoders and the decoder (qcnet_encoder.c, qcnet_decoder.c,
 * qcnet_loss.c).
 *
 * Invariant: every activation of a forward is in m->bufs (class QC_MEM_MODEL), every stash
 * table's arena is one of them, and qc_qcnet_release returns all of them to the context; the
 * blocks' scratch and gradient buffers are class QC_MEM_BLOCK (freed by the blocks or their
 * contexts' deinit): bytes_live = Σ bufs bytes + live BLOCK bytes. Parameters and gradients
 * come from the context too (tags "params", "grads", class QC_MEM_PARAM; not in bytes_live),
 * and on device backends the AdamW segment arrays
 * ("params/groups").
 *
 * Backends (qc_exec.h): every op runs on m->ex and every block's qc_block_mem carries it. On a
 * device backend the host reads only the host batch (tape.batch) and host mirrors; the ops get
 * tape.dbatch (the caller's device copy, or the model's copy "batch/nodes" + "batch/graph"
 * rebased with qc_batch_rebase) and the index arrays derived on the host, uploaded.
 */
#include "qc_qcnet.h"

#include <stdlib.h>
#include <string.h>

#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qcnet_internal.h"

// ---- activation memory --------------------------------------------------------------------

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
    void *p = qc_memctx_alloc(m->mc, QC_MEM_MODEL, bytes, tag);
    if (!p)
        return qc_errorf(QC_ERR_NOMEM,
                         "model: allocation of %zu bytes for %s failed (%zu bytes live)\n"
                         "hint: a smaller batch, --attention fused, or a larger device budget",
                         bytes, tag, m->bytes_bufs);
    m->bufs[m->nbufs].p = p;
    m->bufs[m->nbufs].bytes = bytes;
    m->nbufs++;
    m->bytes_bufs += bytes;
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
        qc_op_zero(m->ex, *out, (size_t)n * sizeof(float));
    return QC_OK;
}

enum qc_status qcnet_ialloc(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **out)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, (size_t)(n > 0 ? n : 0) * sizeof(int64_t), tag, &p));
    *out = p;
    return QC_OK;
}

enum qc_status qcnet_upload(struct qc_qcnet *m, const void *host, size_t bytes, const char *tag,
                            void **out)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, bytes, tag, &p));
    enum qc_status st = qc_op_upload(m->ex, p, host, bytes);
    if (st != QC_OK) {
        qcnet_free(m, p);
        return st;
    }
    *out = p;
    return QC_OK;
}

const struct qc_batch *qcnet_op_batch(const struct qc_qcnet *m)
{
    const struct qcnet_tape *t = &m->tape;
    QC_ASSERT(t->dbatch || !qc_exec_is_device(m->ex), "model: no device view of the batch");
    return t->dbatch ? t->dbatch : t->batch;
}

void *qcnet_host_tmp(size_t bytes, const char *what)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        (void)qc_errorf(QC_ERR_NOMEM, "model: host buffer of %zu bytes for %s", bytes, what);
    return p;
}

enum qc_status qcnet_upload_tmp(struct qc_qcnet *m, void *host, size_t bytes, const char *tag,
                                void **out)
{
    enum qc_status s = qcnet_upload(m, host, bytes, tag, out);
    free(host);
    return s;
}

enum qc_status qcnet_download(struct qc_qcnet *m, void *host, const void *dev, size_t bytes)
{
    return qc_op_download(m->ex, host, dev, bytes);
}

void qcnet_free(struct qc_qcnet *m, void *p)
{
    if (!p)
        return;
    for (int i = m->nbufs - 1; i >= 0; i--) {
        if (m->bufs[i].p != p)
            continue;
        qc_memctx_free(m->mc, QC_MEM_MODEL, p, m->bufs[i].bytes);
        m->bytes_bufs -= m->bufs[i].bytes;
        m->bufs[i] = m->bufs[--m->nbufs];
        return;
    }
    QC_ASSERT(false, "model: freeing %p, not an activation of this model", p);
}

static void free_all_bufs(struct qc_qcnet *m)
{
    for (int i = m->nbufs - 1; i >= 0; i--) {
        qc_memctx_free(m->mc, QC_MEM_MODEL, m->bufs[i].p, m->bufs[i].bytes);
        m->bytes_bufs -= m->bufs[i].bytes;
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

/* Parameter and gradient buffers from context mc (tags "params", "grads"); none on failure. */
static enum qc_status params_alloc(struct qc_qcnet *m, struct qc_memctx *mc, float **params,
                                   float **grads)
{
    const size_t bytes = params_bytes(m);
    float *p = qc_memctx_alloc(mc, QC_MEM_PARAM, bytes, "params");
    float *g = p ? qc_memctx_alloc(mc, QC_MEM_PARAM, bytes, "grads") : NULL;
    if (!g) {
        if (p)
            qc_memctx_free(mc, QC_MEM_PARAM, p, bytes);
        return qc_errorf(QC_ERR_NOMEM,
                         "model: allocation of %zu bytes for %s failed (%lld parameters)\n"
                         "hint: a larger device budget or a smaller model",
                         bytes, p ? "grads" : "params", (long long)m->nparams);
    }
    *params = p;
    *grads = g;
    return QC_OK;
}

static void params_free(struct qc_qcnet *m, struct qc_memctx *mc, float *params, float *grads)
{
    qc_memctx_free(mc, QC_MEM_PARAM, grads, params_bytes(m));
    qc_memctx_free(mc, QC_MEM_PARAM, params, params_bytes(m));
}

/* Bytes of the device copy of the AdamW segments: offsets (nseg+1) int64, then at the next
 * 64-byte boundary the decay flags (nseg). */
static size_t groups_decay_offset(const struct qc_qcnet *m)
{
    return ((size_t)(m->nseg + 1) * sizeof(int64_t) + 63) / 64 * 64;
}

/* Device backends: the AdamW segment arrays in one block from context mc ("params/groups"),
 * uploaded from seg_off / seg_decay. */
static enum qc_status groups_alloc(struct qc_qcnet *m, struct qc_memctx *mc, int64_t **out)
{
    const size_t off = groups_decay_offset(m), bytes = off + (size_t)m->nseg;
    unsigned char *p = qc_memctx_alloc(mc, QC_MEM_PARAM, bytes, "params/groups");
    if (!p)
        return qc_errorf(QC_ERR_NOMEM, "model: allocation of %zu bytes for params/groups failed",
                         bytes);
    enum qc_status s = qc_op_upload(m->ex, p, m->seg_off, (size_t)(m->nseg + 1) * sizeof(int64_t));
    if (s == QC_OK)
        s = qc_op_upload(m->ex, p + off, m->seg_decay, (size_t)m->nseg);
    if (s != QC_OK) {
        qc_memctx_free(mc, QC_MEM_PARAM, p, bytes);
        return s;
    }
    m->seg_dev_bytes = bytes;
    *out = (int64_t *)(void *)p;
    return QC_OK;
}

static void groups_free(struct qc_qcnet *m, struct qc_memctx *mc, int64_t *p)
{
    if (p)
        qc_memctx_free(mc, QC_MEM_PARAM, p, m->seg_dev_bytes);
}

static void groups_set(struct qc_qcnet *m, int64_t *p)
{
    m->seg_off_dev = p;
    m->seg_decay_dev = p ? (uint8_t *)(void *)p + groups_decay_offset(m) : NULL;
}

/* The backend and the memory context can serve a model. */
static enum qc_status check_exec(const struct qc_exec *ex, const struct qc_memctx *mc)
{
    const enum qc_exec_backend b = qc_exec_backend_of(ex);
    if ((int)b < 0 || b >= QC_EXEC_BACKEND_COUNT)
        return qc_errorf(QC_ERR_INVALID, "model: backend %d is not cpu|cuda|emu", (int)b);
#ifndef QC_HAVE_CUDA
    if (b == QC_EXEC_CUDA)
        return qc_errorf(QC_ERR_UNSUPPORTED, "model: the CUDA backend in a build without CUDA\n"
                                             "hint: rebuild with -DQC_CUDA=ON, or run on the CPU");
#endif
    if (b == QC_EXEC_EMU && !ex->emu)
        return qc_errorf(QC_ERR_INVALID, "model: the emu backend without its arena");
    if (qc_exec_is_device(ex) && !qc_memctx_is_device(mc))
        return qc_errorf(QC_ERR_INVALID,
                         "model: the %s backend needs a memory context over an allocator of its "
                         "memory (host malloc cannot serve it)",
                         qc_exec_backend_str(b));
    return QC_OK;
}

enum qc_status qc_qcnet_create(const struct qc_qcnet_config *cfg, struct qc_qcnet **out)
{
    return qc_qcnet_create_on(cfg, NULL, NULL, out);
}

enum qc_status qc_qcnet_create_on(const struct qc_qcnet_config *cfg, struct qc_memctx *mc,
                                  const struct qc_exec *ex, struct qc_qcnet **out)
{
    QC_TRY(qc_qcnet_config_validate(cfg));
    QC_TRY(check_exec(ex, mc));
    struct qc_qcnet *m = calloc(1, sizeof *m);
    if (!m)
        return qc_errorf(QC_ERR_NOMEM, "model: %zu bytes", sizeof *m);
    if (!mc) { /* host malloc, counted in a context of the model's own */
        enum qc_status s = qc_memctx_create(NULL, &mc);
        if (s != QC_OK) {
            free(m);
            return s;
        }
        m->own_mc = true;
    }
    m->mc = mc;
    m->cfg = *cfg;
    m->ex = ex; /* before the blocks are built: their qc_block_mem take it */
    m->D = cfg->hidden_dim;
    m->H = cfg->num_heads;
    m->F = cfg->num_freq_bands;
    m->K = cfg->num_modes;
    m->R = cfg->num_recurrent_steps;
    m->NL_map = cfg->num_map_layers;
    m->NL_agent = cfg->num_agent_layers;
    m->NL_dec = cfg->num_dec_layers;
    m->head_out = cfg->num_future_steps * 2 / cfg->num_recurrent_steps;
    enum qc_status s = qcnet_params_build(m);
    if (s == QC_OK)
        s = params_alloc(m, m->mc, &m->params, &m->grads);
    if (s == QC_OK && qc_exec_is_device(ex)) {
        int64_t *g = NULL;
        s = groups_alloc(m, m->mc, &g);
        groups_set(m, g);
        if (s == QC_OK) {
            m->params_host = malloc(params_bytes(m) > 0 ? params_bytes(m) : 1);
            if (!m->params_host)
                s = qc_errorf(QC_ERR_NOMEM, "model: host mirror of %zu bytes", params_bytes(m));
        }
    }
    if (s != QC_OK) {
        qc_qcnet_destroy(m);
        return s;
    }
    qc_op_zero(ex, m->params, params_bytes(m));
    qc_op_zero(ex, m->grads, params_bytes(m));
    qcnet_params_bind(m);
    *out = m;
    return QC_OK;
}

const struct qc_exec *qc_qcnet_exec(const struct qc_qcnet *m)
{
    return m->ex;
}

void qc_qcnet_destroy(struct qc_qcnet *m)
{
    if (!m)
        return;
    qc_qcnet_release(m);
    free(m->bufs);
    params_free(m, m->mc, m->params, m->grads);
    groups_free(m, m->mc, m->seg_off_dev);
    free(m->params_host);
    qcnet_params_free(m);
    if (m->own_mc)
        qc_memctx_destroy(m->mc);
    free(m);
}

const struct qc_qcnet_config *qc_qcnet_config(const struct qc_qcnet *m)
{
    return &m->cfg;
}

struct qc_memctx *qc_qcnet_memctx(const struct qc_qcnet *m)
{
    return m->own_mc ? NULL : m->mc;
}

enum qc_status qc_qcnet_set_memctx(struct qc_qcnet *m, struct qc_memctx *mc)
{
    struct qc_memctx_stats ms;
    qc_memctx_stats_get(m->mc, &ms);
    QC_ASSERT(m->nbufs == 0 && ms.live[QC_MEM_BLOCK] == 0,
              "model: memory context changed with %d live activations", m->nbufs);
    if (mc == m->mc || (!mc && m->own_mc))
        return QC_OK; /* the same context: nothing to re-home */
    QC_TRY(check_exec(m->ex, mc));
    struct qc_memctx *own = NULL;
    if (!mc) {
        QC_TRY(qc_memctx_create(NULL, &own));
        mc = own;
    }
    /* re-home the parameters and gradients (and the device AdamW segments): new copies from
     * the new context, old ones back */
    float *p = NULL, *g = NULL;
    int64_t *seg = NULL;
    enum qc_status s = params_alloc(m, mc, &p, &g);
    if (s == QC_OK && m->seg_off_dev) {
        s = groups_alloc(m, mc, &seg);
        if (s != QC_OK)
            params_free(m, mc, p, g);
    }
    if (s == QC_OK) {
        qc_op_copy(m->ex, p, m->params, params_bytes(m));
        qc_op_copy(m->ex, g, m->grads, params_bytes(m));
        /* the old buffers go back to the old context only once the copies have read them */
        s = qc_op_sync(m->ex);
        if (s != QC_OK) {
            groups_free(m, mc, seg);
            params_free(m, mc, p, g);
        }
    }
    if (s != QC_OK) {
        qc_memctx_destroy(own);
        return s;
    }
    params_free(m, m->mc, m->params, m->grads);
    groups_free(m, m->mc, m->seg_off_dev);
    if (m->own_mc)
        qc_memctx_destroy(m->mc);
    m->mc = mc;
    m->own_mc = own != NULL;
    m->params = p;
    m->grads = g;
    groups_set(m, seg);
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
    struct qc_memctx_stats ms;
    qc_memctx_stats_get(m->mc, &ms);
    memset(out, 0, sizeof *out);
    out->bytes_live = ms.live[QC_MEM_MODEL] + ms.live[QC_MEM_BLOCK];
    out->bytes_peak = ms.work_peak;
    out->bytes_stash = m->bytes_stash;
    out->bytes_params = 2 * params_bytes(m);
    out->n_allocs = ms.n_allocs[QC_MEM_MODEL] + ms.n_allocs[QC_MEM_BLOCK];
}

void qc_qcnet_mem_reset_peak(struct qc_qcnet *m)
{
    qc_memctx_reset_peak(m->mc);
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

/* Frees a kv context (stash memory back to the context) if it was initialised. */
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

/* The attention graph of edge set s: arrays of the device graph (op arguments) and, on device
 * backends, host mirrors from the host graph. src / query_row replace the set's source rows /
 * give the query rows (NULL: the set's own / b*Q + k), with their host copies. */
static void view(const struct qc_qcnet *m, struct qc_attn_graph *v, enum qc_edge_set s,
                 int64_t n_src, int64_t n_dst, int64_t n_bdst, int64_t Q, const int64_t *src,
                 const int64_t *src_host, const int64_t *query_row, const int64_t *query_row_host)
{
    const struct qcnet_tape *t = &m->tape;
    const struct qc_edges *he = &t->batch->graph.e[s], *de = &t->dbatch->graph.e[s];
    memset(v, 0, sizeof *v);
    v->n_src = n_src;
    v->n_dst = n_dst;
    v->n_bdst = n_bdst;
    v->n_query = Q;
    v->n_edge = he->num_edges;
    v->row_ptr = de->dst_ptr;
    v->src = src ? src : de->src;
    v->query_row = query_row;
    if (qc_exec_is_device(m->ex)) {
        v->row_ptr_host = he->dst_ptr;
        v->src_host = src ? src_host : he->src;
        v->query_row_host = query_row ? query_row_host : NULL;
    }
}

/* n int64 the host computes for the ops: on CPU straight into context memory (tag), which is
 * also the host copy; on a device backend a malloc'ed host buffer (*host, the mirror, freed by
 * release) that index_commit uploads into context memory (same tag and bytes). */
static enum qc_status index_host(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **dev,
                                 int64_t **host)
{
    if (!qc_exec_is_device(m->ex)) {
        QC_TRY(qcnet_ialloc(m, n, tag, dev));
        *host = *dev;
        return QC_OK;
    }
    *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!*host)
        return qc_errorf(QC_ERR_NOMEM, "model: host copy of %s (%lld entries)", tag, (long long)n);
    return QC_OK;
}

static enum qc_status index_commit(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **dev,
                                   const int64_t *host)
{
    if (!qc_exec_is_device(m->ex))
        return QC_OK;
    void *p = NULL;
    QC_TRY(qcnet_upload(m, host, (size_t)(n > 0 ? n : 0) * sizeof(int64_t), tag, &p));
    *dev = p;
    return QC_OK;
}

static enum qc_status tape_graphs(struct qc_qcnet *m)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_graph *g = &t->batch->graph; /* host: counts and the arrays read here */
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
    const char *tag = "graph/pl2a.src_polygon";
    QC_TRY(index_host(m, pl2a->num_edges, tag, &t->pl2a_src, &t->pl2a_src_host));
    for (int64_t e = 0; e < pl2a->num_edges; e++)
        t->pl2a_src_host[e] = pl2a->src[e] % P;
    QC_TRY(index_commit(m, pl2a->num_edges, tag, &t->pl2a_src, t->pl2a_src_host));
    /* pl2m and a2m queries are mode-major rows k·A + a */
    tag = "graph/mode_major_query";
    QC_TRY(index_host(m, A * K, tag, &t->pl2m_query, &t->pl2m_query_host));
    for (int64_t a = 0; a < A; a++)
        for (int64_t k = 0; k < K; k++)
            t->pl2m_query_host[a * K + k] = k * A + a;
    QC_TRY(index_commit(m, A * K, tag, &t->pl2m_query, t->pl2m_query_host));
    const struct qc_edges *pl2pl = &g->e[QC_EDGE_PL2PL];
    tag = "graph/pl2pl.type";
    QC_TRY(index_host(m, pl2pl->num_edges, tag, &t->pl2pl_type, &t->pl2pl_type_host));
    for (int64_t e = 0; e < pl2pl->num_edges; e++) {
        const int64_t ty = pl2pl->type ? (int64_t)pl2pl->type[e] : 0;
        if (ty < 0 || ty >= 5) /* the type_pl2pl_emb vocabulary */
            return qc_errorf(QC_ERR_INVALID, "model forward: pl2pl edge %lld: type %lld",
                             (long long)e, (long long)ty);
        t->pl2pl_type_host[e] = ty;
    }
    QC_TRY(index_commit(m, pl2pl->num_edges, tag, &t->pl2pl_type, t->pl2pl_type_host));

    view(m, &t->g[QC_EDGE_PT2PL], QC_EDGE_PT2PL, Pt, P, P, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_PL2PL], QC_EDGE_PL2PL, P, P, P, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_T], QC_EDGE_T, T * A, T * A, T * A, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_PL2A], QC_EDGE_PL2A, P, T * A, T * A, 1, t->pl2a_src, t->pl2a_src_host,
         NULL, NULL);
    view(m, &t->g[QC_EDGE_A2A], QC_EDGE_A2A, T * A, T * A, T * A, 1, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_T2M], QC_EDGE_T2M, T * A, K * A, A, K, NULL, NULL, NULL, NULL);
    view(m, &t->g[QC_EDGE_PL2M], QC_EDGE_PL2M, P, K * A, A, K, NULL, NULL, t->pl2m_query,
         t->pl2m_query_host);
    view(m, &t->g[QC_EDGE_A2M], QC_EDGE_A2M, A, K * A, A, K, NULL, NULL, t->pl2m_query,
         t->pl2m_query_host);
    view(m, &t->g[QC_EDGE_M2M], QC_EDGE_M2M, K * A, K * A, K * A, 1, NULL, NULL, NULL, NULL);
    return QC_OK;
}

/* The batch as op arguments (tape.dbatch): the host batch on CPU; on a device backend the
 * caller's device copy, or copies of the batch's two blocks made here and rebased. */
static enum qc_status tape_batch(struct qc_qcnet *m, const struct qc_batch *batch,
                                 const struct qc_qcnet_ctx *ctx)
{
    struct qcnet_tape *t = &m->tape;
    t->batch = batch;
    if (!qc_exec_is_device(m->ex)) {
        t->dbatch = batch;
        return QC_OK;
    }
    if (ctx && ctx->batch_dev) {
        const struct qc_batch *d = ctx->batch_dev;
        if (d->num_agents != batch->num_agents || d->num_polygons != batch->num_polygons ||
            d->num_points != batch->num_points || d->has_graph != batch->has_graph)
            return qc_errorf(QC_ERR_INVALID,
                             "model forward: ctx.batch_dev is not a copy of the batch (%lld "
                             "agents, %lld polygons vs %lld, %lld)",
                             (long long)d->num_agents, (long long)d->num_polygons,
                             (long long)batch->num_agents, (long long)batch->num_polygons);
        t->dbatch = d;
        return QC_OK;
    }
    void *nodes = NULL, *graph = NULL;
    if (batch->node_mem)
        QC_TRY(qcnet_upload(m, batch->node_mem, batch->node_bytes, "batch/nodes", &nodes));
    t->dbatch_node = nodes;
    if (batch->graph_mem)
        QC_TRY(qcnet_upload(m, batch->graph_mem, batch->graph_bytes, "batch/graph", &graph));
    t->dbatch_graph = graph;
    qc_batch_rebase(batch, nodes, graph, &t->dbatch_view);
    t->dbatch = &t->dbatch_view;
    return QC_OK;
}

enum qc_status qcnet_edges_setup(struct qc_qcnet *m, int set, const struct qc_fourier *fe,
                                 const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                 float *dcat_table)
{
    struct qcnet_tape *t = &m->tape;
    const struct qc_edges *e = &t->dbatch->graph.e[set]; /* attr: an op argument */
    struct qc_attn_edges *ed = &t->ed[set];
    enum qc_attn_impl impl = m->cfg.attention;
    struct qc_block_mem mem;
    memset(&mem, 0, sizeof mem);
    char name[96];
    snprintf(name, sizeof name, "edges.%s", qc_edge_set_name((enum qc_edge_set)set));
    qc_block_mem_set(&mem, m->mc, name);
    mem.ex = m->ex;
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
    /* the stash tables' arenas (and the device batch) were in the buffers: forget them */
    struct qcnet_tape *t = &m->tape;
    if (qc_exec_is_device(m->ex)) { /* the host mirrors of the index arrays */
        free(t->pl2a_src_host);
        free(t->pl2m_query_host);
        free(t->pl2pl_type_host);
    }
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
    enum qc_status s = tape_batch(m, batch, ctx);
    if (s == QC_OK)
        s = tape_graphs(m);
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
