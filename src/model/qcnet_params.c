/*
 * qcnet_params.c — QCNet's parameters (QCNET.md §2): the state_dict key table in QCNet's order
 * (with the 14 alias keys of the self-attention pre-norms), the flat parameter/gradient
 * buffers every block is bound into, the AdamW groups (§2.5), initialisation (§2.4) and
 * safetensors loading and saving by key.
 *
 * Invariants: keys without alias_of are the distinct tensors, in state_dict order, and tile the
 * flat buffer: offset(key i+1) = offset(key i) + numel(key i); alias keys repeat the offset of
 * the key they alias. seg_off/seg_decay list the distinct tensors (the AdamW segments).
 *
 * Backends: m->params / m->grads are device memory on device backends (qc_exec.h). The host
 * side of this file (initialisation, checkpoints) then works on host data and moves it with
 * qc_op_upload / qc_op_download; nothing here dereferences the flat buffers except on CPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_qcnet.h"
#include "qc_safetensors.h"
#include "qcnet_internal.h"

// ---- key table --------------------------------------------------------------------------

static enum qc_status key_push(struct qc_qcnet *m, struct qc_qcnet_key **out)
{
    if (m->nkeys == m->cap_keys) {
        int cap = m->cap_keys ? 2 * m->cap_keys : 1024;
        struct qc_qcnet_key *k = realloc(m->keys, (size_t)cap * sizeof *k);
        if (!k)
            return qc_errorf(QC_ERR_NOMEM, "model: key table of %d entries", cap);
        m->keys = k;
        m->cap_keys = cap;
    }
    *out = &m->keys[m->nkeys++];
    memset(*out, 0, sizeof **out);
    (*out)->alias_of = -1;
    return QC_OK;
}

static enum qc_status key_name(char *dst, const char *prefix, const char *suffix)
{
    int n = snprintf(dst, QC_QCNET_KEY_MAX, "%s%s%s", prefix, *suffix ? "." : "", suffix);
    if (n < 0 || n >= QC_QCNET_KEY_MAX)
        return qc_errorf(QC_ERR_INVALID, "model: state_dict key too long: %s.%s", prefix, suffix);
    return QC_OK;
}

/* A bare tensor (Embedding weight, traj_emb_h0, GRU matrices) at the end of the buffer. */
static enum qc_status add_tensor(struct qc_qcnet *m, const char *name, int ndim, int64_t ne0,
                                 int64_t ne1, enum qc_qcnet_init init, bool decay, int64_t *offset)
{
    struct qc_qcnet_key *k = NULL;
    QC_TRY(key_push(m, &k));
    QC_TRY(key_name(k->name, name, ""));
    k->ndim = ndim;
    k->shape[0] = ne0;
    k->shape[1] = ndim == 2 ? ne1 : 1;
    k->numel = ne0 * k->shape[1];
    k->offset = m->nparams;
    k->init = init;
    k->decay = decay;
    m->nparams += k->numel;
    if (offset)
        *offset = k->offset;
    return QC_OK;
}

static enum qc_qcnet_init init_from_block(enum qc_param_init in)
{
    switch (in) {
    case QC_INIT_LINEAR_W:
        return QC_QCNET_INIT_XAVIER;
    case QC_INIT_ZERO:
        return QC_QCNET_INIT_ZERO;
    case QC_INIT_ONE:
        return QC_QCNET_INIT_ONE;
    case QC_INIT_EMBEDDING:
        return QC_QCNET_INIT_NORMAL002;
    }
    return QC_QCNET_INIT_ZERO;
}

/* A block's parameter table under prefix. For a self-attention layer, the alias keys
 * attn_prenorm_x_dst.{weight,bias} follow attn_prenorm_x_src.bias (QCNET.md §2.1 ‡). Decay:
 * exactly the Linear weights (§2.5). */
static enum qc_status add_block(struct qc_qcnet *m, const char *prefix,
                                const struct qc_param_table *t, bool self_alias, int64_t *offset)
{
    const int64_t base = m->nparams;
    for (int i = 0; i < t->n; i++) {
        const struct qc_param_spec *p = &t->p[i];
        struct qc_qcnet_key *k = NULL;
        QC_TRY(key_push(m, &k));
        QC_TRY(key_name(k->name, prefix, p->name));
        k->ndim = p->ndim;
        k->shape[0] = p->ne[0];
        k->shape[1] = p->ndim == 2 ? p->ne[1] : 1;
        k->numel = p->numel;
        k->offset = base + p->offset;
        k->init = init_from_block(p->init);
        k->decay = p->init == QC_INIT_LINEAR_W;
        QC_ASSERT(k->offset == m->nparams, "block %s: table not contiguous at %s", prefix, p->name);
        m->nparams += p->numel;
        if (self_alias && strcmp(p->name, "attn_prenorm_x_src.bias") == 0) {
            const int iw = m->nkeys - 2, ib = m->nkeys - 1; /* x_src.weight, x_src.bias */
            const char *suf[2] = {"attn_prenorm_x_dst.weight", "attn_prenorm_x_dst.bias"};
            const int src[2] = {iw, ib};
            for (int j = 0; j < 2; j++) {
                struct qc_qcnet_key *a = NULL;
                QC_TRY(key_push(m, &a));
                const struct qc_qcnet_key *s = &m->keys[src[j]];
                *a = *s;
                QC_TRY(key_name(a->name, prefix, suf[j]));
                a->alias_of = src[j];
            }
        }
    }
    QC_ASSERT(m->nparams == base + t->numel, "block %s: %lld params, table says %lld", prefix,
              (long long)(m->nparams - base), (long long)t->numel);
    if (offset)
        *offset = base;
    return QC_OK;
}

/* A block's memory: the model's memory context, the block's tag prefix and the model's
 * backend. */
static void block_mem(struct qc_qcnet *m, struct qc_block_mem *bm, const char *prefix)
{
    qc_block_mem_set(bm, m->mc, prefix);
    bm->ex = m->ex;
}

static enum qc_status add_layer(struct qc_qcnet *m, struct qcnet_layer *L, const char *prefix,
                                bool bipartite, bool has_pos)
{
    qc_attn_init(&L->attn, m->D, m->H, bipartite, has_pos);
    block_mem(m, &L->attn.mem, prefix);
    snprintf(L->prefix, sizeof L->prefix, "%s", prefix);
    return add_block(m, prefix, &L->attn.params, !bipartite, &L->offset);
}

static enum qc_status add_fourier(struct qc_qcnet *m, struct qc_fourier *fe, const char *prefix,
                                  int64_t d)
{
    qc_fourier_init(fe, d, m->F, m->D);
    block_mem(m, &fe->mem, prefix);
    return add_block(m, prefix, &fe->params, false, NULL);
}

static enum qc_status add_mlp(struct qc_qcnet *m, struct qc_mlp *mlp, const char *prefix, int64_t O)
{
    qc_mlp_init(mlp, m->D, O);
    block_mem(m, &mlp->mem, prefix);
    return add_block(m, prefix, &mlp->params, false, NULL);
}

/* Offsets of the blocks that are not qcnet_layer: recovered from the first key of the block. */
static int64_t block_offset(const struct qc_qcnet *m, const char *first_key)
{
    for (int i = 0; i < m->nkeys; i++)
        if (strcmp(m->keys[i].name, first_key) == 0)
            return m->keys[i].offset;
    QC_ASSERT(false, "model: key %s not found", first_key);
    return -1;
}

#define PFX_MAP "encoder.map_encoder"
#define PFX_AG  "encoder.agent_encoder"
#define PFX_DEC "decoder"

enum qc_status qcnet_params_build(struct qc_qcnet *m)
{
    const int64_t D = m->D, K = m->K;
    char p[QC_QCNET_KEY_MAX];
    m->nparams = 0;
    /* map encoder (QCNET.md §2.2) */
    QC_TRY(add_tensor(m, PFX_MAP ".type_pt_emb.weight", 2, 17, D, QC_QCNET_INIT_NORMAL002, false,
                      &m->o_type_pt));
    QC_TRY(add_tensor(m, PFX_MAP ".side_pt_emb.weight", 2, 3, D, QC_QCNET_INIT_NORMAL002, false,
                      &m->o_side_pt));
    QC_TRY(add_tensor(m, PFX_MAP ".type_pl_emb.weight", 2, 4, D, QC_QCNET_INIT_NORMAL002, false,
                      &m->o_type_pl));
    QC_TRY(add_tensor(m, PFX_MAP ".int_pl_emb.weight", 2, 3, D, QC_QCNET_INIT_NORMAL002, false,
                      &m->o_int_pl));
    QC_TRY(add_tensor(m, PFX_MAP ".type_pl2pl_emb.weight", 2, 5, D, QC_QCNET_INIT_NORMAL002, false,
                      &m->o_type_pl2pl));
    QC_TRY(add_fourier(m, &m->x_pt_emb, PFX_MAP ".x_pt_emb", 1));
    QC_TRY(add_fourier(m, &m->x_pl_emb, PFX_MAP ".x_pl_emb", 0));
    QC_TRY(add_fourier(m, &m->r_pt2pl_emb, PFX_MAP ".r_pt2pl_emb", 3));
    QC_TRY(add_fourier(m, &m->r_pl2pl_emb, PFX_MAP ".r_pl2pl_emb", 3));
    for (int64_t i = 0; i < m->NL_map; i++) {
        snprintf(p, sizeof p, PFX_MAP ".pt2pl_layers.%lld", (long long)i);
        QC_TRY(add_layer(m, &m->pt2pl[i], p, true, true));
    }
    for (int64_t i = 0; i < m->NL_map; i++) {
        snprintf(p, sizeof p, PFX_MAP ".pl2pl_layers.%lld", (long long)i);
        QC_TRY(add_layer(m, &m->pl2pl[i], p, false, true));
    }
    /* agent encoder */
    QC_TRY(add_tensor(m, PFX_AG ".type_a_emb.weight", 2, 10, D, QC_QCNET_INIT_NORMAL002, false,
                      &m->o_type_a));
    QC_TRY(add_fourier(m, &m->x_a_emb, PFX_AG ".x_a_emb", 4));
    QC_TRY(add_fourier(m, &m->r_t_emb, PFX_AG ".r_t_emb", 4));
    QC_TRY(add_fourier(m, &m->r_pl2a_emb, PFX_AG ".r_pl2a_emb", 3));
    QC_TRY(add_fourier(m, &m->r_a2a_emb, PFX_AG ".r_a2a_emb", 3));
    for (int64_t i = 0; i < m->NL_agent; i++) {
        snprintf(p, sizeof p, PFX_AG ".t_attn_layers.%lld", (long long)i);
        QC_TRY(add_layer(m, &m->t_attn[i], p, false, true));
    }
    for (int64_t i = 0; i < m->NL_agent; i++) {
        snprintf(p, sizeof p, PFX_AG ".pl2a_attn_layers.%lld", (long long)i);
        QC_TRY(add_layer(m, &m->pl2a_attn[i], p, true, true));
    }
    for (int64_t i = 0; i < m->NL_agent; i++) {
        snprintf(p, sizeof p, PFX_AG ".a2a_attn_layers.%lld", (long long)i);
        QC_TRY(add_layer(m, &m->a2a_attn[i], p, false, true));
    }
    /* decoder: its own Parameter first, then the submodules */
    QC_TRY(add_tensor(m, PFX_DEC ".traj_emb_h0", 2, 1, D, QC_QCNET_INIT_ZERO, false, &m->o_h0));
    QC_TRY(add_tensor(m, PFX_DEC ".mode_emb.weight", 2, K, D, QC_QCNET_INIT_NORMAL002, false,
                      &m->o_mode_emb));
    QC_TRY(add_fourier(m, &m->r_t2m_emb, PFX_DEC ".r_t2m_emb", 4));
    QC_TRY(add_fourier(m, &m->r_pl2m_emb, PFX_DEC ".r_pl2m_emb", 3));
    QC_TRY(add_fourier(m, &m->r_a2m_emb, PFX_DEC ".r_a2m_emb", 3));
    QC_TRY(add_fourier(m, &m->y_emb, PFX_DEC ".y_emb", 2));
    QC_TRY(add_tensor(m, PFX_DEC ".traj_emb.weight_ih_l0", 2, 3 * D, D, QC_QCNET_INIT_GRU_IH, true,
                      &m->o_gru_wih));
    QC_TRY(add_tensor(m, PFX_DEC ".traj_emb.weight_hh_l0", 2, 3 * D, D, QC_QCNET_INIT_GRU_HH, true,
                      &m->o_gru_whh));
    QC_TRY(add_tensor(m, PFX_DEC ".traj_emb.bias_ih_l0", 1, 3 * D, 0, QC_QCNET_INIT_ZERO, false,
                      &m->o_gru_bih));
    QC_TRY(add_tensor(m, PFX_DEC ".traj_emb.bias_hh_l0", 1, 3 * D, 0, QC_QCNET_INIT_ZERO, false,
                      &m->o_gru_bhh));
    static const char *const stage[2] = {"propose", "refine"};
    for (int s = 0; s < 2; s++) {
        struct qcnet_layer *t2m = s ? m->t2m_r : m->t2m_p, *pl2m = s ? m->pl2m_r : m->pl2m_p;
        struct qcnet_layer *a2m = s ? m->a2m_r : m->a2m_p;
        for (int64_t i = 0; i < m->NL_dec; i++) {
            snprintf(p, sizeof p, PFX_DEC ".t2m_%s_attn_layers.%lld", stage[s], (long long)i);
            QC_TRY(add_layer(m, &t2m[i], p, true, true));
        }
        for (int64_t i = 0; i < m->NL_dec; i++) {
            snprintf(p, sizeof p, PFX_DEC ".pl2m_%s_attn_layers.%lld", stage[s], (long long)i);
            QC_TRY(add_layer(m, &pl2m[i], p, true, true));
        }
        for (int64_t i = 0; i < m->NL_dec; i++) {
            snprintf(p, sizeof p, PFX_DEC ".a2m_%s_attn_layers.%lld", stage[s], (long long)i);
            QC_TRY(add_layer(m, &a2m[i], p, true, true));
        }
        snprintf(p, sizeof p, PFX_DEC ".m2m_%s_attn_layer", stage[s]);
        QC_TRY(add_layer(m, s ? &m->m2m_r : &m->m2m_p, p, false, false));
    }
    QC_TRY(add_mlp(m, &m->to_loc_p, PFX_DEC ".to_loc_propose_pos", m->head_out));
    QC_TRY(add_mlp(m, &m->to_scale_p, PFX_DEC ".to_scale_propose_pos", m->head_out));
    QC_TRY(add_mlp(m, &m->to_loc_r, PFX_DEC ".to_loc_refine_pos", QCNET_S * 2));
    QC_TRY(add_mlp(m, &m->to_scale_r, PFX_DEC ".to_scale_refine_pos", QCNET_S * 2));
    QC_TRY(add_mlp(m, &m->to_pi, PFX_DEC ".to_pi", 1));

    /* AdamW segments: the distinct tensors */
    int64_t n = 0;
    for (int i = 0; i < m->nkeys; i++)
        n += m->keys[i].alias_of < 0;
    m->seg_off = malloc((size_t)(n + 1) * sizeof *m->seg_off);
    m->seg_decay = malloc((size_t)(n > 0 ? n : 1));
    if (!m->seg_off || !m->seg_decay)
        return qc_errorf(QC_ERR_NOMEM, "model: parameter groups");
    m->nseg = 0;
    for (int i = 0; i < m->nkeys; i++) {
        if (m->keys[i].alias_of >= 0)
            continue;
        m->seg_off[m->nseg] = m->keys[i].offset;
        m->seg_decay[m->nseg] = m->keys[i].decay ? 1 : 0;
        m->nseg++;
    }
    m->seg_off[m->nseg] = m->nparams;
    return QC_OK;
}

void qcnet_params_free(struct qc_qcnet *m)
{
    free(m->keys);
    free(m->seg_off);
    free(m->seg_decay);
    m->keys = NULL;
    m->seg_off = NULL;
    m->seg_decay = NULL;
}

/* The bind functions also point the block at the model's memory context (it changes with
 * qc_qcnet_set_memctx). */
static void bind_layer(struct qc_qcnet *m, struct qcnet_layer *L)
{
    qc_attn_bind(&L->attn, qcnet_params_compute(m) + L->offset, m->grads + L->offset);
    L->attn.mem.mc = m->mc;
}

static void bind_fourier(struct qc_qcnet *m, struct qc_fourier *fe, const char *first)
{
    int64_t o = block_offset(m, first);
    qc_fourier_bind(fe, qcnet_params_compute(m) + o, m->grads + o);
    fe->mem.mc = m->mc;
}

static void bind_mlp(struct qc_qcnet *m, struct qc_mlp *mlp, const char *first)
{
    int64_t o = block_offset(m, first);
    qc_mlp_bind(mlp, qcnet_params_compute(m) + o, m->grads + o);
    mlp->mem.mc = m->mc;
}

void qcnet_params_bind(struct qc_qcnet *m)
{
    m->params_lp = m->cfg.precision ? m->params + m->nparams : NULL;
    /* FE(0) has no freqs: its first key is to_out.0.weight */
    bind_fourier(m, &m->x_pt_emb, PFX_MAP ".x_pt_emb.freqs.weight");
    bind_fourier(m, &m->x_pl_emb, PFX_MAP ".x_pl_emb.to_out.0.weight");
    bind_fourier(m, &m->r_pt2pl_emb, PFX_MAP ".r_pt2pl_emb.freqs.weight");
    bind_fourier(m, &m->r_pl2pl_emb, PFX_MAP ".r_pl2pl_emb.freqs.weight");
    bind_fourier(m, &m->x_a_emb, PFX_AG ".x_a_emb.freqs.weight");
    bind_fourier(m, &m->r_t_emb, PFX_AG ".r_t_emb.freqs.weight");
    bind_fourier(m, &m->r_pl2a_emb, PFX_AG ".r_pl2a_emb.freqs.weight");
    bind_fourier(m, &m->r_a2a_emb, PFX_AG ".r_a2a_emb.freqs.weight");
    bind_fourier(m, &m->r_t2m_emb, PFX_DEC ".r_t2m_emb.freqs.weight");
    bind_fourier(m, &m->r_pl2m_emb, PFX_DEC ".r_pl2m_emb.freqs.weight");
    bind_fourier(m, &m->r_a2m_emb, PFX_DEC ".r_a2m_emb.freqs.weight");
    bind_fourier(m, &m->y_emb, PFX_DEC ".y_emb.freqs.weight");
    bind_mlp(m, &m->to_loc_p, PFX_DEC ".to_loc_propose_pos.mlp.0.weight");
    bind_mlp(m, &m->to_scale_p, PFX_DEC ".to_scale_propose_pos.mlp.0.weight");
    bind_mlp(m, &m->to_loc_r, PFX_DEC ".to_loc_refine_pos.mlp.0.weight");
    bind_mlp(m, &m->to_scale_r, PFX_DEC ".to_scale_refine_pos.mlp.0.weight");
    bind_mlp(m, &m->to_pi, PFX_DEC ".to_pi.mlp.0.weight");
    for (int64_t i = 0; i < m->NL_map; i++) {
        bind_layer(m, &m->pt2pl[i]);
        bind_layer(m, &m->pl2pl[i]);
    }
    for (int64_t i = 0; i < m->NL_agent; i++) {
        bind_layer(m, &m->t_attn[i]);
        bind_layer(m, &m->pl2a_attn[i]);
        bind_layer(m, &m->a2a_attn[i]);
    }
    for (int64_t i = 0; i < m->NL_dec; i++) {
        bind_layer(m, &m->t2m_p[i]);
        bind_layer(m, &m->pl2m_p[i]);
        bind_layer(m, &m->a2m_p[i]);
        bind_layer(m, &m->t2m_r[i]);
        bind_layer(m, &m->pl2m_r[i]);
        bind_layer(m, &m->a2m_r[i]);
    }
    bind_layer(m, &m->m2m_p);
    bind_layer(m, &m->m2m_r);
}

// ---- accessors --------------------------------------------------------------------------

int64_t qc_qcnet_num_params(const struct qc_qcnet *m)
{
    return m->nparams;
}

float *qc_qcnet_params(struct qc_qcnet *m)
{
    return m->params;
}

float *qc_qcnet_grads(struct qc_qcnet *m)
{
    return m->grads;
}

void qc_qcnet_zero_grad(struct qc_qcnet *m)
{
    qc_op_zero(m->ex, m->grads, (size_t)m->nparams * sizeof *m->grads);
}

enum qc_status qc_qcnet_params_download(const struct qc_qcnet *m, float *host)
{
    return qc_op_download(m->ex, host, m->params, (size_t)m->nparams * sizeof(float));
}

enum qc_status qc_qcnet_params_upload(struct qc_qcnet *m, const float *host)
{
    QC_TRY(qc_op_upload(m->ex, m->params, host, (size_t)m->nparams * sizeof(float)));
    /* pageable sources are staged by the upload, but a pinned one must not change before the
     * copy has run: make host reusable on return on every backend */
    return qc_op_sync(m->ex);
}

enum qc_status qc_qcnet_grads_download(const struct qc_qcnet *m, float *host)
{
    return qc_op_download(m->ex, host, m->grads, (size_t)m->nparams * sizeof(float));
}

enum qc_status qc_qcnet_grads_upload(struct qc_qcnet *m, const float *host)
{
    QC_TRY(qc_op_upload(m->ex, m->grads, host, (size_t)m->nparams * sizeof(float)));
    return qc_op_sync(m->ex); /* host may be reused at once */
}

int qc_qcnet_num_keys(const struct qc_qcnet *m)
{
    return m->nkeys;
}

const struct qc_qcnet_key *qc_qcnet_key_at(const struct qc_qcnet *m, int i)
{
    QC_ASSERT(i >= 0 && i < m->nkeys, "key index %d of %d", i, m->nkeys);
    return &m->keys[i];
}

int qc_qcnet_key_find(const struct qc_qcnet *m, const char *name)
{
    for (int i = 0; i < m->nkeys; i++)
        if (strcmp(m->keys[i].name, name) == 0)
            return i;
    return -1;
}

void qc_qcnet_param_groups(const struct qc_qcnet *m, const int64_t **offsets, const uint8_t **decay,
                           int64_t *num_tensors)
{
    *offsets = m->seg_off;
    *decay = m->seg_decay;
    *num_tensors = m->nseg;
}

void qc_qcnet_adamw_step(struct qc_qcnet *m, float *adam_m, float *adam_v, double lr,
                         double weight_decay, double beta1, double beta2, double eps, int64_t step)
{
    struct qc_adamw_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.lr = lr;
    hp.beta1 = beta1;
    hp.beta2 = beta2;
    hp.eps = eps;
    hp.weight_decay = weight_decay;
    hp.step = step;
    /* the segment arrays where the op reads them: host on CPU, the device copies otherwise */
    const int64_t *off = m->seg_off_dev ? m->seg_off_dev : m->seg_off;
    const uint8_t *dec = m->seg_decay_dev ? m->seg_decay_dev : m->seg_decay;
    qc_op_adamw_step_segments(m->ex, m->params, adam_m, adam_v, m->grads, off, dec, m->nseg, &hp);
}

// ---- initialisation ---------------------------------------------------------------------

static uint64_t init_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double init_uniform(uint64_t *s) /* [0, 1) */
{
    return (double)(init_next(s) >> 11) * 0x1.0p-53;
}

static double init_normal(uint64_t *s)
{
    double u1 = init_uniform(s), u2 = init_uniform(s);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

/* An orthogonal n x n matrix into out (row-major): Gram–Schmidt (twice, for stability) on the
 * columns of a Gaussian matrix, signs fixed so that R has a positive diagonal (as PyTorch's
 * orthogonal_ does with its QR). */
static void init_orthogonal(float *out, int64_t n, uint64_t *s, double *a /* n*n scratch */)
{
    for (int64_t i = 0; i < n * n; i++)
        a[i] = init_normal(s);
    for (int64_t j = 0; j < n; j++) { /* column j */
        for (int pass = 0; pass < 2; pass++) {
            for (int64_t k = 0; k < j; k++) { /* remove the projection on column k */
                double dot = 0.0;
                for (int64_t i = 0; i < n; i++)
                    dot += a[i * n + k] * a[i * n + j];
                for (int64_t i = 0; i < n; i++)
                    a[i * n + j] -= dot * a[i * n + k];
            }
        }
        double nrm = 0.0;
        for (int64_t i = 0; i < n; i++)
            nrm += a[i * n + j] * a[i * n + j];
        nrm = sqrt(nrm);
        for (int64_t i = 0; i < n; i++)
            a[i * n + j] = nrm > 0.0 ? a[i * n + j] / nrm : (i == j ? 1.0 : 0.0);
    }
    for (int64_t i = 0; i < n * n; i++)
        out[i] = (float)a[i];
}

void qc_qcnet_init_params(struct qc_qcnet *m, uint64_t seed)
{
    uint64_t s = seed ^ 0x9c7e2023u;
    const int64_t D = m->D;
    const size_t bytes = (size_t)m->nparams * sizeof(float);
    double *scratch = NULL;
    /* generated on the host: into the parameters on CPU, else into a host buffer (the distinct
     * tensors tile the flat buffer, so every element is written) that is uploaded */
    const bool device = qc_exec_is_device(m->ex);
    float *base = device ? malloc(bytes > 0 ? bytes : 1) : m->params;
    QC_ASSERT(base, "model init: out of memory (%zu bytes of host staging)", bytes);
    for (int i = 0; i < m->nkeys; i++) {
        const struct qc_qcnet_key *k = &m->keys[i];
        if (k->alias_of >= 0)
            continue;
        float *x = base + k->offset;
        switch (k->init) {
        case QC_QCNET_INIT_XAVIER: {
            double a = sqrt(6.0 / (double)(k->shape[0] + k->shape[1]));
            for (int64_t j = 0; j < k->numel; j++)
                x[j] = (float)((2.0 * init_uniform(&s) - 1.0) * a);
            break;
        }
        case QC_QCNET_INIT_ZERO:
            memset(x, 0, (size_t)k->numel * sizeof *x);
            break;
        case QC_QCNET_INIT_ONE:
            for (int64_t j = 0; j < k->numel; j++)
                x[j] = 1.0f;
            break;
        case QC_QCNET_INIT_NORMAL002:
            for (int64_t j = 0; j < k->numel; j++)
                x[j] = (float)(0.02 * init_normal(&s));
            break;
        case QC_QCNET_INIT_GRU_IH: {
            double a = sqrt(6.0 / (double)(2 * D)); /* each [D,D] block: fan_in = fan_out = D */
            for (int64_t j = 0; j < k->numel; j++)
                x[j] = (float)((2.0 * init_uniform(&s) - 1.0) * a);
            break;
        }
        case QC_QCNET_INIT_GRU_HH:
            if (!scratch)
                scratch = malloc((size_t)(D * D) * sizeof *scratch);
            QC_ASSERT(scratch, "model init: out of memory (%lld doubles)", (long long)(D * D));
            for (int64_t b = 0; b < k->shape[0] / D; b++)
                init_orthogonal(x + b * D * D, D, &s, scratch);
            break;
        }
    }
    free(scratch);
    if (device) {
        enum qc_status st = qc_op_upload(m->ex, m->params, base, bytes);
        if (st == QC_OK)
            st = qc_op_sync(m->ex);
        QC_ASSERT(st == QC_OK, "model init: upload of the parameters failed: %s", qc_error_last());
        free(base);
    }
}

// ---- safetensors ------------------------------------------------------------------------

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

/* Checks that st holds key k (under prefix) as F32 of the model's shape. */
static enum qc_status check_key(const struct qc_safetensors *st, const char *prefix,
                                const struct qc_qcnet_key *k, const struct qc_st_tensor **out)
{
    char name[2 * QC_QCNET_KEY_MAX];
    snprintf(name, sizeof name, "%s%s", prefix, k->name);
    const struct qc_st_tensor *t = qc_safetensors_find(st, name);
    char ms[64], fs[64];
    shape_str(ms, sizeof ms, k->ndim, k->shape);
    if (!t)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: tensor %s: missing (model expects F32 %s)\n"
                         "hint: the file was written for another model configuration, or is "
                         "not a QCNet state_dict",
                         qc_safetensors_path(st), name, ms);
    shape_str(fs, sizeof fs, t->ndim, t->shape);
    bool same = t->ndim == k->ndim;
    for (int i = 0; same && i < k->ndim; i++)
        same = t->shape[i] == k->shape[i];
    if (!same)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: tensor %s: shape mismatch: checkpoint %s vs model %s\n"
                         "hint: the checkpoint comes from another configuration (hidden_dim, "
                         "num_heads, num_freq_bands, num_modes, layers...)",
                         qc_safetensors_path(st), name, fs, ms);
    if (t->dtype != QC_ST_F32)
        return qc_errorf(QC_ERR_INVALID, "%s: tensor %s: dtype %s, expected F32",
                         qc_safetensors_path(st), name, qc_st_dtype_name(t->dtype));
    *out = t;
    return QC_OK;
}

enum qc_status qc_qcnet_load_st(struct qc_qcnet *m, const struct qc_safetensors *st,
                                const char *prefix)
{
    if (!prefix)
        prefix = "";
    /* pass 1: every model key, in state_dict order */
    for (int i = 0; i < m->nkeys; i++) {
        const struct qc_qcnet_key *k = &m->keys[i];
        char name[2 * QC_QCNET_KEY_MAX];
        snprintf(name, sizeof name, "%s%s", prefix, k->name);
        const struct qc_st_tensor *t;
        if (k->alias_of >= 0 && !qc_safetensors_find(st, name))
            continue; /* alias keys may be dropped */
        QC_TRY(check_key(st, prefix, k, &t));
    }
    /* pass 2: keys of a model part this configuration does not have */
    const size_t lp = strlen(prefix);
    for (int64_t i = 0; i < qc_safetensors_count(st); i++) {
        const char *name = qc_safetensors_at(st, i)->name;
        if (strncmp(name, prefix, lp) != 0)
            continue;
        const char *key = name + lp;
        if (strncmp(key, "encoder.", 8) != 0 && strncmp(key, "decoder.", 8) != 0)
            continue;
        if (qc_qcnet_key_find(m, key) < 0)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: tensor %s: not a parameter of this model\n"
                             "hint: the checkpoint comes from a configuration with more layers "
                             "or other heads",
                             qc_safetensors_path(st), name);
    }
    /* pass 3: copy (everything is checked: the parameters change only now). On device
     * backends each tensor is uploaded from the file's host data. */
    for (int i = 0; i < m->nkeys; i++) {
        const struct qc_qcnet_key *k = &m->keys[i];
        if (k->alias_of >= 0)
            continue;
        const struct qc_st_tensor *t;
        QC_TRY(check_key(st, prefix, k, &t));
        QC_TRY(
            qc_op_upload(m->ex, m->params + k->offset, t->data, (size_t)k->numel * sizeof(float)));
    }
    /* the file's data may be unmapped once this returns */
    return qc_op_sync(m->ex);
}

enum qc_status qc_qcnet_load(struct qc_qcnet *m, const char *path)
{
    struct qc_safetensors *st;
    QC_TRY(qc_safetensors_open(path, &st));
    enum qc_status s = qc_qcnet_load_st(m, st, "");
    qc_safetensors_close(st);
    return s;
}

static enum qc_status add_keys(const struct qc_qcnet *m, struct qc_st_writer *w, const char *prefix,
                               const float *buf, bool with_aliases)
{
    if (!prefix)
        prefix = "";
    for (int i = 0; i < m->nkeys; i++) {
        const struct qc_qcnet_key *k = &m->keys[i];
        if (k->alias_of >= 0 && !with_aliases)
            continue;
        char name[2 * QC_QCNET_KEY_MAX];
        snprintf(name, sizeof name, "%s%s", prefix, k->name);
        QC_TRY(qc_st_writer_add(w, name, QC_ST_F32, k->ndim, k->shape, buf + k->offset));
    }
    return QC_OK;
}

enum qc_status qc_qcnet_add_to_writer(const struct qc_qcnet *m, struct qc_st_writer *w,
                                      const char *prefix, bool with_aliases)
{
    if (!qc_exec_is_device(m->ex))
        return add_keys(m, w, prefix, m->params, with_aliases);
    /* the writer references host data: the model's host mirror, refreshed now */
    QC_TRY(qc_qcnet_params_download(m, m->params_host));
    return add_keys(m, w, prefix, m->params_host, with_aliases);
}

enum qc_status qc_qcnet_add_buffer_to_writer(const struct qc_qcnet *m, struct qc_st_writer *w,
                                             const char *prefix, const float *buf)
{
    return add_keys(m, w, prefix, buf, false);
}

enum qc_status qc_qcnet_read_buffer(const struct qc_qcnet *m, const struct qc_safetensors *st,
                                    const char *prefix, float *buf)
{
    if (!prefix)
        prefix = "";
    for (int i = 0; i < m->nkeys; i++) {
        const struct qc_qcnet_key *k = &m->keys[i];
        if (k->alias_of >= 0)
            continue;
        const struct qc_st_tensor *t;
        QC_TRY(check_key(st, prefix, k, &t));
    }
    for (int i = 0; i < m->nkeys; i++) {
        const struct qc_qcnet_key *k = &m->keys[i];
        if (k->alias_of >= 0)
            continue;
        const struct qc_st_tensor *t;
        QC_TRY(check_key(st, prefix, k, &t));
        memcpy(buf + k->offset, t->data, (size_t)k->numel * sizeof(float));
    }
    return QC_OK;
}

enum qc_status qc_qcnet_save(const struct qc_qcnet *m, const char *path)
{
    struct qc_st_writer *w;
    QC_TRY(qc_st_writer_create(&w));
    char cfg[2048];
    qc_qcnet_config_json(&m->cfg, cfg, sizeof cfg);
    enum qc_status s = qc_qcnet_add_to_writer(m, w, "", true);
    if (s == QC_OK)
        s = qc_st_writer_set_metadata(w, "format", "pt");
    if (s == QC_OK)
        s = qc_st_writer_set_metadata(w, "qcnet_config", cfg);
    if (s == QC_OK)
        s = qc_st_writer_write(w, path);
    qc_st_writer_destroy(w);
    return s;
}

// ---- 16-bit precision: the rounded weights the blocks read ---------------------------------

float *qcnet_params_compute(const struct qc_qcnet *m)
{
    return m->params_lp ? m->params_lp : m->params;
}

void qcnet_params_refresh(struct qc_qcnet *m)
{
    if (!m->params_lp)
        return;
    qc_op_copy(m->ex, m->params_lp, m->params, (size_t)m->nparams * sizeof(float));
    for (int i = 0; i < m->nkeys; i++) {
        const struct qc_qcnet_key *k = &m->keys[i];
        if (k->alias_of >= 0 ||
            (k->init != QC_QCNET_INIT_XAVIER && k->init != QC_QCNET_INIT_GRU_IH &&
             k->init != QC_QCNET_INIT_GRU_HH))
            continue;
        float *w = m->params_lp + k->offset;
        qc_op_round(m->ex, w, w, k->numel, m->cfg.precision);
    }
}
