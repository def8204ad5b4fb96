/*
 * qcnet_model.c — the model object (qc_qcnet.h): create/destroy, the parameters' and gradients'
 * memory, and the forward / loss / backward orchestration over the encoders and the decoder
 * (qcnet_encoder.c, qcnet_decoder.c, qcnet_loss.c). The activations' memory is qcnet_buffers.c's.
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

#include "qc_attn_fused.h" /* qc_attn_fused_takes_r */
#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_kernels.h"
#include "qc_plan.h"
#include "qc_oom.h"
#include "qc_progress.h" /* qc_format_bytes */
#include "qcnet_internal.h"

// ---- lifecycle ----------------------------------------------------------------------------

static size_t params_bytes(const struct qc_qcnet *m)
{
    return (size_t)m->nparams * sizeof(float);
}

/* Parameter and gradient buffers from context mc (tags "params", "grads"); none on failure. */
/* Bytes of the parameter allocation: twice the parameters with a 16-bit precision (the rounded
 * copy the blocks read follows the master weights, m->params_lp). */
static size_t params_alloc_bytes(const struct qc_qcnet *m)
{
    return params_bytes(m) * (m->cfg.precision ? 2 : 1);
}

static enum qc_status params_alloc(struct qc_qcnet *m, struct qc_memctx *mc, float **params,
                                   float **grads)
{
    const size_t bytes = params_bytes(m);
    float *p = qc_memctx_alloc(mc, QC_MEM_PARAM, params_alloc_bytes(m), "params");
    float *g = p ? qc_memctx_alloc(mc, QC_MEM_PARAM, bytes, "grads") : NULL;
    if (!g) {
        if (p)
            qc_memctx_free(mc, QC_MEM_PARAM, p, params_alloc_bytes(m));
        /* the fixed bytes: what a run holds whatever its batch and plan (qc_oom.h) */
        char need[32], all[32];
        qc_format_bytes(params_alloc_bytes(m) + bytes, need, sizeof need);
        qc_format_bytes(params_alloc_bytes(m) + 3 * bytes, all, sizeof all);
        return qc_oom_fixed_errorf("model: allocation of %zu bytes for %s failed: the %lld "
                                   "parameters and their gradients need %s on the device, %s "
                                   "with AdamW's two moments when training (before any step's "
                                   "activations)",
                                   p ? bytes : params_alloc_bytes(m), p ? "grads" : "params",
                                   (long long)m->nparams, need, all);
    }
    *params = p;
    *grads = g;
    return QC_OK;
}

static void params_free(struct qc_qcnet *m, struct qc_memctx *mc, float *params, float *grads)
{
    qc_memctx_free(mc, QC_MEM_PARAM, grads, params_bytes(m));
    qc_memctx_free(mc, QC_MEM_PARAM, params, params_alloc_bytes(m));
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
        return qc_errorf(QC_ERR_INVALID, "model: backend %d is not cpu|cuda|emu|dry", (int)b);
    if (!qc_exec_backend_built(b))
        return qc_errorf(QC_ERR_UNSUPPORTED, "model: the CUDA backend in a build without CUDA\n"
                                             "hint: rebuild with -DQC_CUDA=ON, or run on the CPU");
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
    if (cfg->attention == QC_ATTN_FUSED && cfg->edge_mode == QC_ATTN_EDGE_MATERIALISED &&
        qc_exec_backend_of(ex) != QC_EXEC_DRY && !qc_attn_fused_takes_r(ex))
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "model: edge_mode materialised is not available on the %s backend: its "
                         "fused attention computes r in its tiles\nhint: --set "
                         "model.edge_mode=tiled (or auto)",
                         qc_exec_backend_str(qc_exec_backend_of(ex)));
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
    m->tape.e = calloc(QCNET_MAX_ENTRIES, sizeof *m->tape.e);
    if (!m->tape.e) {
        if (m->own_mc)
            qc_memctx_destroy(mc);
        free(m);
        return qc_errorf(QC_ERR_NOMEM, "model: tape of %d entries", QCNET_MAX_ENTRIES);
    }
    m->cfg = *cfg;
    for (int i = 0; i < QC_QCNET_EDGE_SETS; i++)
        m->edge_mode[i] = cfg->edge_mode;
    m->ex = ex; /* before the blocks are built: their qc_block_mem take it */
    if (qc_exec_backend_of(ex) == QC_EXEC_DRY) { /* its own, whose target describe sets */
        m->dry_exec = *ex;
        m->ex = &m->dry_exec;
    }
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
        if (s == QC_OK && qc_exec_backend_of(ex) != QC_EXEC_DRY) { /* a dry model has no data */
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

enum qc_status qc_qcnet_create_dry(const struct qc_qcnet_config *cfg, struct qc_qcnet **out)
{
    static const struct qc_exec dry_exec = {.backend = QC_EXEC_DRY, .target = QC_EXEC_CPU};
    const struct qc_memctx_params mp = {.dry = true};
    struct qc_memctx *mc = NULL;
    QC_TRY(qc_memctx_create(&mp, &mc));
    struct qc_qcnet *m = NULL;
    enum qc_status s = qc_qcnet_create_on(cfg, mc, &dry_exec, &m);
    if (s != QC_OK) {
        qc_memctx_destroy(mc);
        return s;
    }
    m->own_mc = true;
    m->dry = true;
    *out = m;
    return QC_OK;
}

enum qc_status qc_qcnet_describe(struct qc_qcnet *m, const struct qc_batch *batch, bool cuda,
                                 struct qc_plan_program *prog)
{
    if (!m->dry)
        return qc_errorf(QC_ERR_INVALID, "model describe: not a dry model (qc_qcnet_create_dry)");
    qc_qcnet_release(m);
    qc_plan_program_reset(prog);
    m->dry_exec.target = cuda ? QC_EXEC_CUDA : QC_EXEC_CPU;
    QC_TRY(qc_memctx_record(m->mc, prog));
    const struct qc_qcnet_ctx ctx = {.training = true, .need_backward = true};
    enum qc_status s = qc_qcnet_forward(m, batch, &ctx, NULL);
    if (s == QC_OK)
        s = qc_qcnet_loss(m, NULL);
    if (s == QC_OK)
        s = qc_qcnet_backward(m, 1.0f);
    qc_qcnet_release(m);
    (void)qc_memctx_record(m->mc, NULL);
    if (s == QC_OK)
        s = qc_plan_program_finish(prog);
    return s;
}

enum qc_status qc_qcnet_record(struct qc_qcnet *m, struct qc_plan_program *prog)
{
    if (prog) {
        qc_qcnet_release(m);
        qc_plan_program_reset(prog);
    }
    return qc_memctx_record(m->mc, prog);
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
    free(m->tape.e);
    free(m->plan);
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

_Static_assert(QC_QCNET_EDGE_SETS == QC_EDGE_SET_COUNT, "one edge mode per edge set");

enum qc_status qc_qcnet_set_edge_modes(struct qc_qcnet *m, const enum qc_attn_edge_mode *modes)
{
    QC_ASSERT(!m->tape.active, "model: edge modes changed inside a step");
    for (int i = 0; i < QC_QCNET_EDGE_SETS; i++) {
        const enum qc_attn_edge_mode e = modes ? modes[i] : m->cfg.edge_mode;
        if (e != QC_ATTN_EDGE_AUTO && e != QC_ATTN_EDGE_MATERIALISED && e != QC_ATTN_EDGE_TILED)
            return qc_errorf(QC_ERR_INVALID, "model: edge mode %d of edge set %s", (int)e,
                             qc_edge_set_name((enum qc_edge_set)i));
    }
    for (int i = 0; i < QC_QCNET_EDGE_SETS; i++)
        m->edge_mode[i] = modes ? modes[i] : m->cfg.edge_mode;
    return QC_OK;
}

enum qc_attn_edge_mode qc_qcnet_edge_mode(const struct qc_qcnet *m, int set)
{
    if (set < 0 || set >= QC_QCNET_EDGE_SETS)
        return QC_ATTN_EDGE_AUTO;
    return m->edge_mode_run[set];
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
    out->recompute_bytes = m->recompute_bytes;
    out->recomputes = m->recomputes;
    out->repaired = m->repaired;
}

void qc_qcnet_mem_reset_peak(struct qc_qcnet *m)
{
    qc_memctx_reset_peak(m->mc);
}

// ---- forward / loss / backward --------------------------------------------------------------

void qc_qcnet_release(struct qc_qcnet *m)
{
    qcnet_tape_free_contexts(m);
    qcnet_bufs_free_all(m);
    /* the stash tables' arenas (and the device batch) were in the buffers: forget them */
    struct qcnet_tape *t = &m->tape;
    if (qc_exec_is_device(m->ex)) { /* the host mirrors of the index arrays */
        free(t->pl2a_src_host);
        free(t->pl2m_query_host);
        free(t->pl2pl_type_host);
    }
    struct qcnet_entry *e = t->e; /* the table's storage stays with the model */
    memset(t, 0, sizeof *t);
    t->e = e;
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
    qcnet_params_refresh(m); /* 16-bit precision: the weights the blocks read, rounded */
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
    t->loss_norm_host = ctx ? ctx->loss_norm : NULL;
    m->bytes_stash = 0;
    enum qc_status s = qcnet_tape_batch(m, batch, ctx);
    if (s == QC_OK)
        s = qcnet_tape_graphs(m);
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

void qc_qcnet_set_grads_ready(struct qc_qcnet *m, qc_qcnet_grads_ready_fn fn, void *ctx)
{
    m->grads_ready = fn;
    m->grads_ready_ctx = ctx;
}

/* Offset of the first parameter whose key starts with prefix (n when none does). */
static int64_t first_offset_of(const struct qc_qcnet *m, const char *prefix)
{
    const size_t len = strlen(prefix);
    for (int i = 0; i < m->nkeys; i++)
        if (m->keys[i].alias_of < 0 && strncmp(m->keys[i].name, prefix, len) == 0)
            return m->keys[i].offset;
    return m->nparams;
}

int qc_qcnet_grads_cuts(const struct qc_qcnet *m, int64_t *out, int cap)
{
    const int64_t cuts[2] = {first_offset_of(m, "encoder.agent_encoder."),
                             first_offset_of(m, "decoder.")};
    for (int i = 0; i < 2 && i < cap; i++)
        out[i] = cuts[i];
    return 2;
}

/* Reports [lo, hi) final to the grads-ready callback, if any. */
static void grads_ready(struct qc_qcnet *m, int64_t lo, int64_t hi)
{
    if (m->grads_ready)
        m->grads_ready(m->grads_ready_ctx, lo, hi);
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
    const int64_t o_dec = first_offset_of(m, "decoder.");
    const int64_t o_agent = first_offset_of(m, "encoder.agent_encoder.");
    grads_ready(m, o_dec, m->nparams);
    qcnet_free(m, dloc_p);
    qcnet_free(m, dscale_p);
    qcnet_free(m, dloc_r);
    qcnet_free(m, dscale_r);
    qcnet_free(m, dpi);
    QC_TRY(qcnet_agent_backward(m, dx_a, dx_pl));
    grads_ready(m, o_agent, o_dec);
    qcnet_free(m, dx_a);
    QC_TRY(qcnet_map_backward(m, dx_pl));
    grads_ready(m, 0, o_agent);
    qcnet_free(m, dx_pl);
    t->need_backward = false; /* one backward per forward */
    return QC_OK;
}
