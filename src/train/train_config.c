/*
 * train_config.c — the configuration translated into the options of the modules a run uses:
 * the model (model.*), the graph builder (the radii and spans) and the loader (data.*, the graph,
 * synthetic scenes). Shared by the loop, the backend, evaluation, the planner and the benches;
 * below all of them, it calls nothing else in src/train.
 */
#include "qc_train.h"

#include "qc_config.h"
#include "qc_graph.h"
#include "qc_loader.h"

void qc_train_official_args(const struct qc_config *cfg, struct qc_qcnet_official *o)
{
    qc_qcnet_official_default(o);
    if (!cfg)
        return;
    o->time_span = cfg->time_span;
    o->num_t2m_steps = cfg->num_t2m_steps;
    o->pl2pl_radius = cfg->pl2pl_radius;
    o->pl2a_radius = cfg->pl2a_radius;
    o->a2a_radius = cfg->a2a_radius;
    o->pl2m_radius = cfg->pl2m_radius;
    o->a2m_radius = cfg->a2m_radius;
    o->lr = cfg->lr;
    o->weight_decay = cfg->weight_decay;
    o->t_max = cfg->t_max;
}

void qc_train_model_config(const struct qc_config *cfg, struct qc_qcnet_config *out)
{
    qc_qcnet_config_default(out);
    out->hidden_dim = cfg->hidden_dim;
    out->num_heads = cfg->num_heads;
    out->head_dim = cfg->head_dim;
    out->num_freq_bands = cfg->num_freq_bands;
    out->num_historical_steps = cfg->num_historical_steps;
    out->num_future_steps = cfg->num_future_steps;
    out->num_modes = cfg->num_modes;
    out->num_recurrent_steps = cfg->num_recurrent_steps;
    out->num_map_layers = cfg->num_map_layers;
    out->num_agent_layers = cfg->num_agent_layers;
    out->num_dec_layers = cfg->num_dec_layers;
    out->dropout = cfg->dropout;
    out->attention = cfg->attention == QC_ATTENTION_FUSED ? QC_ATTN_FUSED : QC_ATTN_UNFUSED;
    _Static_assert((int)QC_EDGE_MODE_AUTO == (int)QC_ATTN_EDGE_AUTO &&
                       (int)QC_EDGE_MODE_MATERIALISED == (int)QC_ATTN_EDGE_MATERIALISED &&
                       (int)QC_EDGE_MODE_TILED == (int)QC_ATTN_EDGE_TILED,
                   "model.edge_mode is enum qc_attn_edge_mode");
    out->edge_mode = (enum qc_attn_edge_mode)cfg->edge_mode;
    out->precision = cfg->precision;
}

void qc_train_graph_params(const struct qc_config *cfg, struct qc_graph_params *p)
{
    qc_graph_params_default(p);
    p->pl2pl_radius = cfg->pl2pl_radius;
    p->pl2a_radius = cfg->pl2a_radius;
    p->a2a_radius = cfg->a2a_radius;
    p->pl2m_radius = cfg->pl2m_radius;
    p->a2m_radius = cfg->a2m_radius;
    p->time_span = cfg->time_span;
    p->num_t2m_steps = cfg->num_t2m_steps;
    p->num_modes = cfg->num_modes;
    p->max_num_neighbors = cfg->max_num_neighbors;
}

void qc_train_loader_opts(const struct qc_config *cfg, struct qc_loader_opts *o)
{
    qc_loader_opts_default(o);
    o->batch_size = cfg->batch_size;
    o->threads = cfg->loader_threads;
    o->prefetch_batches = cfg->prefetch_batches;
    o->shuffle = cfg->shuffle;
    o->balance_cost = cfg->balance == QC_BALANCE_COST;
    o->with_target = true;
    o->build_graph = true;
    o->seed = (uint64_t)cfg->seed;
    qc_train_graph_params(cfg, &o->graph);
    o->synthetic_scenes = cfg->synthetic_scenes;
    o->synthetic_profile = (int)cfg->synthetic_profile;
    o->synthetic_seed = (uint64_t)cfg->seed;
}
