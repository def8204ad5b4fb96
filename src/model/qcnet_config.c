/*
 * qcnet_config.c — the model configuration (qc_qcnet.h): defaults, the parity-tiny preset,
 * validation and the JSON line written into checkpoints.
 */
#include <stdio.h>
#include <string.h>

#include "qc_json.h"
#include "qc_kernels.h"
#include "qc_qcnet.h"
#include "qcnet_internal.h"

void qc_qcnet_config_default(struct qc_qcnet_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->hidden_dim = 128;
    cfg->num_heads = 8;
    cfg->head_dim = 16;
    cfg->num_freq_bands = 64;
    cfg->num_historical_steps = QCNET_T;
    cfg->num_future_steps = QCNET_S;
    cfg->num_modes = 6;
    cfg->num_recurrent_steps = 3;
    cfg->num_map_layers = 1;
    cfg->num_agent_layers = 2;
    cfg->num_dec_layers = 2;
    cfg->dropout = 0.1;
    cfg->attention = QC_ATTN_UNFUSED;
}

void qc_qcnet_config_parity_tiny(struct qc_qcnet_config *cfg)
{
    qc_qcnet_config_default(cfg);
    cfg->hidden_dim = 32;
    cfg->num_heads = 2;
    cfg->head_dim = 16;
    cfg->num_freq_bands = 8;
}

enum qc_status qc_qcnet_config_validate(const struct qc_qcnet_config *c)
{
    if (c->hidden_dim < 1 || c->hidden_dim > 4096)
        return qc_errorf(QC_ERR_INVALID, "model config: hidden_dim %lld not in [1, 4096]",
                         (long long)c->hidden_dim);
    if (c->num_heads < 1 || c->head_dim < 1 || c->num_heads * c->head_dim != c->hidden_dim)
        return qc_errorf(QC_ERR_INVALID,
                         "model config: num_heads %lld x head_dim %lld != hidden_dim %lld\n"
                         "hint: QCNet requires num_heads * head_dim == hidden_dim",
                         (long long)c->num_heads, (long long)c->head_dim, (long long)c->hidden_dim);
    if (c->num_freq_bands < 1 || c->num_freq_bands > 1024)
        return qc_errorf(QC_ERR_INVALID, "model config: num_freq_bands %lld not in [1, 1024]",
                         (long long)c->num_freq_bands);
    if (c->num_historical_steps != QCNET_T || c->num_future_steps != QCNET_S)
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "model config: num_historical_steps %lld / num_future_steps %lld: only "
                         "50 / 60 (the Argoverse 2 layout of the data) are supported",
                         (long long)c->num_historical_steps, (long long)c->num_future_steps);
    if (c->num_modes < 1 || c->num_modes > QC_KERNELS_MAX_MODES)
        return qc_errorf(QC_ERR_INVALID, "model config: num_modes %lld not in [1, %d]",
                         (long long)c->num_modes, QC_KERNELS_MAX_MODES);
    if (c->num_recurrent_steps < 1 || c->num_recurrent_steps > 16 ||
        (c->num_future_steps * 2) % c->num_recurrent_steps != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "model config: num_recurrent_steps %lld must be in [1, 16] and divide "
                         "2 * num_future_steps (%lld)",
                         (long long)c->num_recurrent_steps, (long long)(2 * c->num_future_steps));
    if (c->num_map_layers < 1 || c->num_map_layers > QCNET_MAX_LAYERS || c->num_agent_layers < 1 ||
        c->num_agent_layers > QCNET_MAX_LAYERS || c->num_dec_layers < 1 ||
        c->num_dec_layers > QCNET_MAX_LAYERS)
        return qc_errorf(QC_ERR_INVALID,
                         "model config: layers (map %lld, agent %lld, decoder %lld) must be in "
                         "[1, %d]",
                         (long long)c->num_map_layers, (long long)c->num_agent_layers,
                         (long long)c->num_dec_layers, QCNET_MAX_LAYERS);
    if (!(c->dropout >= 0.0 && c->dropout < 1.0))
        return qc_errorf(QC_ERR_INVALID, "model config: dropout %g not in [0, 1)", c->dropout);
    if (c->attention != QC_ATTN_UNFUSED && c->attention != QC_ATTN_FUSED)
        return qc_errorf(QC_ERR_INVALID, "model config: attention %d is not fused|unfused",
                         (int)c->attention);
    if (c->edge_mode != QC_ATTN_EDGE_AUTO && c->edge_mode != QC_ATTN_EDGE_MATERIALISED &&
        c->edge_mode != QC_ATTN_EDGE_TILED)
        return qc_errorf(QC_ERR_INVALID,
                         "model config: edge_mode %d is not auto|materialised|tiled",
                         (int)c->edge_mode);
    if (c->edge_mode == QC_ATTN_EDGE_TILED && c->attention != QC_ATTN_FUSED)
        return qc_errorf(QC_ERR_INVALID,
                         "model config: edge_mode tiled needs the fused attention (unfused "
                         "materialises r)\nhint: --set model.attention=fused, or "
                         "model.edge_mode=auto");
    /* Attention applications of one forward must fit the tape. */
    int64_t apps = 2 * c->num_map_layers + 3 * c->num_agent_layers +
                   (c->num_recurrent_steps + 1) * (3 * c->num_dec_layers + 1);
    if (apps > QCNET_MAX_APPS)
        return qc_errorf(QC_ERR_INVALID,
                         "model config: %lld attention applications per forward "
                         "(more than %d)",
                         (long long)apps, QCNET_MAX_APPS);
    return QC_OK;
}

void qc_qcnet_official_default(struct qc_qcnet_official *o)
{
    o->time_span = 10;
    o->num_t2m_steps = 30;
    o->pl2pl_radius = 150.0;
    o->pl2a_radius = 50.0;
    o->a2a_radius = 50.0;
    o->pl2m_radius = 150.0;
    o->a2m_radius = 150.0;
    o->lr = 5e-4;
    o->weight_decay = 1e-4;
    o->t_max = 64;
}

size_t qc_qcnet_config_json(const struct qc_qcnet_config *c, char *buf, size_t n)
{
    struct qc_qcnet_official o;
    qc_qcnet_official_default(&o);
    return qc_qcnet_config_json_official(c, &o, buf, n);
}

/* Every constructor argument of the official QCNet (predictors/qcnet.py, QCNET.md §1), in its
 * order, so that QCNet(**json.loads(meta["qcnet_config"])) builds the model; "attention" is
 * qctrain's own (the official __init__ takes it into **kwargs). */
size_t qc_qcnet_config_json_official(const struct qc_qcnet_config *c,
                                     const struct qc_qcnet_official *o, char *buf, size_t n)
{
    int len = snprintf(
        buf, n,
        "{\"dataset\": \"argoverse_v2\", \"input_dim\": 2, \"hidden_dim\": %lld, "
        "\"output_dim\": 2, \"output_head\": false, \"num_historical_steps\": %lld, "
        "\"num_future_steps\": %lld, \"num_modes\": %lld, \"num_recurrent_steps\": %lld, "
        "\"num_freq_bands\": %lld, \"num_map_layers\": %lld, \"num_agent_layers\": %lld, "
        "\"num_dec_layers\": %lld, \"num_heads\": %lld, \"head_dim\": %lld, \"dropout\": %s, "
        "\"pl2pl_radius\": %s, \"time_span\": %lld, \"pl2a_radius\": %s, \"a2a_radius\": %s, "
        "\"num_t2m_steps\": %lld, \"pl2m_radius\": %s, \"a2m_radius\": %s, \"lr\": %s, "
        "\"weight_decay\": %s, \"T_max\": %lld, \"submission_dir\": \"./\", "
        "\"submission_file_name\": \"submission\", \"attention\": \"%s\"}",
        (long long)c->hidden_dim, (long long)c->num_historical_steps,
        (long long)c->num_future_steps, (long long)c->num_modes, (long long)c->num_recurrent_steps,
        (long long)c->num_freq_bands, (long long)c->num_map_layers, (long long)c->num_agent_layers,
        (long long)c->num_dec_layers, (long long)c->num_heads, (long long)c->head_dim,
        QC_JSON_NUM("%.17g", c->dropout), QC_JSON_NUM("%.17g", o->pl2pl_radius),
        (long long)o->time_span, QC_JSON_NUM("%.17g", o->pl2a_radius),
        QC_JSON_NUM("%.17g", o->a2a_radius), (long long)o->num_t2m_steps,
        QC_JSON_NUM("%.17g", o->pl2m_radius), QC_JSON_NUM("%.17g", o->a2m_radius),
        QC_JSON_NUM("%.17g", o->lr), QC_JSON_NUM("%.17g", o->weight_decay), (long long)o->t_max,
        c->attention == QC_ATTN_FUSED ? "fused" : "unfused");
    return len < 0 ? 0 : (size_t)len;
}
