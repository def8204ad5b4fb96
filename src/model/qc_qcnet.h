/*
 * qc_qcnet.h — the whole QCNet model (QCNET.md §2, §5, §6): map encoder, agent encoder,
 * decoder, loss and metrics, forward and backward on any backend of qc_exec.h (CPU, CUDA, and
 * the emulated device of the tests).
 *
 * One model object is built from a struct qc_qcnet_config (any preset's sizes). It owns
 *   - one flat parameter buffer and one flat gradient buffer of qc_qcnet_num_params() floats,
 *     laid out in QCNet's state_dict order with the alias keys left out (every block's
 *     parameter table is bound at an offset into them), so AdamW runs over flat arrays;
 *   - the key table: every state_dict key (alias keys included) with its shape, offset into
 *     the flat buffer, weight-decay group (QCNET.md §2.5) and alias target;
 *   - the activations and stashes of one forward pass, obtained through its memory context
 *     (qc_memctx.h; default host malloc) with a tag per allocation, so the trainer can put
 *     the caching allocator, its streams and the offload engine under them. They live from
 *     qc_qcnet_forward until qc_qcnet_release (or the next forward).
 *
 * One training step:
 *     qc_qcnet_forward(m, batch, &ctx, &out);     predictions (views valid until release)
 *     qc_qcnet_loss(m, &loss);                    QCNet's training loss on that forward
 *     qc_qcnet_backward(m, scale);                d(scale·loss)/dparam ACCUMULATED in grads
 *     qc_qcnet_release(m);                        activations back to the memory context
 *     ... AdamW over qc_qcnet_params() / qc_qcnet_grads() with qc_qcnet_param_groups() ...
 *     qc_qcnet_zero_grad(m);
 * Gradient accumulation = several forward/loss/backward/release rounds before the optimizer
 * step (scale = 1/number of micro-batches gives the mean of their losses).
 *
 * Faithfulness (QCNET.md §9): every agent-step and every query is computed, valid or not;
 * detaches, cumsums, mode-major/agent-major reorders and mask copies follow the Python.
 * Dropout (train mode only) is drawn from Philox keyed by (ctx.seed, ctx.step, site, scene,
 * element within the scene), with the sites assigned deterministically by the model
 * (qc_attention.h): two runs give the same bits. The scene is the batch's scene_index (the
 * dataset index the loader sets; the scene's position in the batch where it is -1) and the
 * element is counted within that scene's rows or edges only, so a scene draws the same mask
 * whatever batch, group, micro-batch or rank it is computed in: a group split into sub-groups
 * gives the whole group's masks, and the groups of a step (distinct scenes) draw independent
 * ones. Scene indices must be below 2^29 (QC_ERR_INVALID otherwise).
 * The attention implementation (config.attention) is fused or unfused behind one interface;
 * unfused materialises the per-edge tensors like PyTorch (the reference path).
 *
 * Thread safety: one model is used from one thread at a time; the CPU ops use OpenMP inside.
 */
#ifndef QC_MODEL_QC_QCNET_H
#define QC_MODEL_QC_QCNET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_attention.h" /* enum qc_attn_impl */
#include "qc_status.h"
#include "qc_types.h" /* enum qc_precision */

#ifdef __cplusplus
extern "C" {
#endif

struct qc_batch;       /* qc_batch.h: the collated batch with its graph (has_graph) */
struct qc_safetensors; /* qc_safetensors.h: an open file */
struct qc_st_writer;   /* qc_safetensors.h: a writer */
struct qc_exec;        /* qc_exec.h: the backend ops run on */

// ---- configuration ------------------------------------------------------------------------

/* The model's hyper-parameters (QCNET.md §1). Field names are those of struct qc_config
 * (src/config/qc_config.h), which the trainer copies over; the graph hyper-parameters (radii,
 * time_span, num_t2m_steps, max_num_neighbors) belong to qc_graph_params, not to the model. */
struct qc_qcnet_config {
    int64_t hidden_dim;               /* D, 128 */
    int64_t num_heads;                /* H, 8 */
    int64_t head_dim;                 /* Dh, 16; H*Dh == D */
    int64_t num_freq_bands;           /* F, 64 */
    int64_t num_historical_steps;     /* T, 50 (the data layout fixes it: only 50 is supported) */
    int64_t num_future_steps;         /* Tf, 60 (only 60 is supported) */
    int64_t num_modes;                /* K, 6 */
    int64_t num_recurrent_steps;      /* R, 3; must divide Tf */
    int64_t num_map_layers;           /* 1 */
    int64_t num_agent_layers;         /* 2 */
    int64_t num_dec_layers;           /* 2 */
    double dropout;                   /* 0.1: attention weights and every FFN, train mode only */
    enum qc_attn_impl attention;      /* QC_ATTN_UNFUSED (reference) or QC_ATTN_FUSED */
    enum qc_attn_edge_mode edge_mode; /* FUSED: where every positional edge set's r and dL/dr
                                         live (qc_attention.h); AUTO = the backend's default.
                                         qc_qcnet_set_edge_modes chooses per edge set */
    /* the blocks' own stashes (FourierEmbedding, MLP, attention application) are rounded and
     * packed to 16 bits after their forward and unpacked before their backward
     * (docs/PRECISION.md); fp32 = none */
    enum qc_precision precision;
};

/* The official AV2 configuration (QCNET.md §1), unfused attention. */
void qc_qcnet_config_default(struct qc_qcnet_config *cfg);
/* The configuration of tests/data/qcnet-parity-tiny: D 32, 2 heads x 16, F 8, rest AV2. */
void qc_qcnet_config_parity_tiny(struct qc_qcnet_config *cfg);
/* Checks ranges and cross-field constraints. QC_ERR_INVALID naming the field. */
enum qc_status qc_qcnet_config_validate(const struct qc_qcnet_config *cfg);

// ---- memory context -------------------------------------------------------------------------

/* struct qc_memctx (qc_memctx.h) serves every allocation of the model: activations, stashes,
 * the blocks' scratch and gradient buffers, and the parameters and gradients (tags "params",
 * "grads", class QC_MEM_PARAM). NULL = host malloc. */
struct qc_memctx;

// ---- lifecycle ----------------------------------------------------------------------------

struct qc_qcnet;

/* Builds the model: key table, block tables, parameter and gradient buffers (zeroed; call
 * qc_qcnet_init_params or a load before use) from host malloc.
 * QC_ERR_INVALID for a bad config, QC_ERR_NOMEM. */
enum qc_status qc_qcnet_create(const struct qc_qcnet_config *cfg, struct qc_qcnet **out);
/* The same on backend ex (qc_exec.h; NULL = CPU) with every allocation from memory context mc
 * (NULL = host malloc, CPU only), the parameter and gradient buffers included: every op of the
 * model runs on ex and mc must hand out that backend's memory (CUDA: the caching allocator on
 * a CUDA device; EMU: an allocator over the emulated arena). ex and mc must outlive the
 * model. On a device backend (qc_exec_is_device):
 *   - qc_qcnet_params() / qc_qcnet_grads(), the views of struct qc_qcnet_output and
 *     qc_qcnet_loss.best_mode are DEVICE pointers; host code reads and writes the parameters
 *     through qc_qcnet_params_download / qc_qcnet_params_upload;
 *   - init, load and save go through host buffers inside the model (same files, same bits);
 *   - the Adam moments given to qc_qcnet_adamw_step are device buffers too;
 *   - qc_qcnet_forward copies the batch in (or uses the caller's copy, ctx.batch_dev), prepares
 *     the index arrays and features it derives from the batch on the host and uploads them;
 *     qc_qcnet_loss downloads the four loss values (one synchronization per call).
 * Device backends also get the AdamW segment arrays from mc (tag "params/groups") and a host
 * mirror of the parameters (qc_qcnet_add_to_writer). QC_ERR_UNSUPPORTED for CUDA in a build
 * without it; QC_ERR_INVALID for a device backend without an allocator in mc (or EMU without
 * its arena). */
enum qc_status qc_qcnet_create_on(const struct qc_qcnet_config *cfg, struct qc_memctx *mc,
                                  const struct qc_exec *ex, struct qc_qcnet **out);
/* The memory context the model allocates from (NULL = host malloc). */
struct qc_memctx *qc_qcnet_memctx(const struct qc_qcnet *m);
/* The backend the model runs on (NULL = CPU). */
const struct qc_exec *qc_qcnet_exec(const struct qc_qcnet *m);

// ---- the step's program (the memory planner's input, src/plan/qc_plan.h) --------------------

struct qc_plan_program;

/* A model that computes nothing, for planning: cfg's blocks on the DRY backend (qc_exec.h) with
 * a memory context that hands out addresses but no memory. Only qc_qcnet_describe and destroy
 * apply to it. QC_ERR_INVALID for a bad config. */
enum qc_status qc_qcnet_create_dry(const struct qc_qcnet_config *cfg, struct qc_qcnet **out);
/* Writes the program of one training step of dry model m on batch (forward with training on,
 * loss, backward at scale 1, release) into prog (reset first, then qc_plan_program_finish):
 * every block application with its size drivers, stash arenas and uses, every allocation of
 * the model and of the blocks that outlives a block call, and the blocks' transient scratch as
 * PEAK events (exact for FE, MLP, GRU and edge contexts; estimated by the planner's cost model
 * for attention). The batch's sizes and edge counts are all it reads (the graph must be built,
 * as for a forward); cuda: the allocations of the CUDA backend's blocks (the fused attention's
 * CSR by source). The batch's own storage is not in the program (the trainer stages it). Costs
 * O(block applications + allocations), no host work on the batch's arrays. */
enum qc_status qc_qcnet_describe(struct qc_qcnet *m, const struct qc_batch *batch, bool cuda,
                                 struct qc_plan_program *prog);
/* The stash policies of the next steps: policy[b] (enum qc_stash_policy) for block application
 * b of prog, the program of this model's step on the batch to come (qc_qcnet_describe of a dry
 * model of the same config); NULL prog or policy: keep everything. keep leaves a stash on the
 * device; offload puts it to the memory context's offload tier after its last forward use and
 * fetches it back before the first backward that reads it, prefetching in the backward order
 * within prefetch_window bytes (the next backward's always; with prefetch_none nothing: each
 * at its own backward); recompute frees it and runs the block's forward again before
 * that backward. Every policy gives the same bits (dropout is keyed). A stash whose fetch fails
 * with QC_ERR_IO is recomputed (a warning names it; qc_qcnet_mem_get's repaired counts it). A
 * forward whose blocks are not the program's fails with QC_ERR_INVALID. Only between steps;
 * the plan stays until replaced. QC_ERR_UNSUPPORTED for offload without an offload engine. */
enum qc_status qc_qcnet_set_plan(struct qc_qcnet *m, const struct qc_plan_program *prog,
                                 const uint8_t *policy, size_t prefetch_window, bool prefetch_none);
struct qc_plan_measure;
/* What the last forward and backward measured per block application (host seconds of each
 * forward and backward, the blocks' transient memory), in the program's block order, for the
 * planner's cost model (qc_plan_cost_update). n: the program's block count; QC_ERR_INVALID
 * when the last forward had another count. Call before qc_qcnet_release. */
enum qc_status qc_qcnet_measure(const struct qc_qcnet *m, struct qc_plan_measure *out, int32_t n);
/* Records a real step (tests, the checker of the dry run): prog non-NULL releases the last
 * step, resets prog and appends every allocation, free and marker of the next forward, loss,
 * backward and release to it; NULL stops (call qc_plan_program_finish then). QC_ERR_NOMEM. */
enum qc_status qc_qcnet_record(struct qc_qcnet *m, struct qc_plan_program *prog);
/* Host copies of the parameters / gradients (qc_qcnet_num_params floats): download copies out
 * (synchronizing), upload copies in. Work on every backend (plain copies on CPU). QC_ERR_CUDA. */
enum qc_status qc_qcnet_params_download(const struct qc_qcnet *m, float *host);
enum qc_status qc_qcnet_params_upload(struct qc_qcnet *m, const float *host);
enum qc_status qc_qcnet_grads_download(const struct qc_qcnet *m, float *host);
/* Host copy in of the gradients (a rollback of a failed step), synchronizing. */
enum qc_status qc_qcnet_grads_upload(struct qc_qcnet *m, const float *host);
/* Frees everything (activations included). NULL is a no-op. */
void qc_qcnet_destroy(struct qc_qcnet *m);
/* The configuration the model was built with. */
const struct qc_qcnet_config *qc_qcnet_config(const struct qc_qcnet *m);
/* Replaces the memory context (NULL = host malloc). Only between steps (no live activations).
 * Re-homes the parameters and gradients: copies from the new context (values kept), the old
 * buffers back to the old one, so qc_qcnet_params() / qc_qcnet_grads() return NEW pointers.
 * The same context again is a no-op. QC_ERR_NOMEM when the new context cannot hold them (the
 * model keeps the old context and buffers). The old context must stay alive until this
 * returns; the new one until the model is destroyed or re-homed again. On a device backend the
 * new context hands out the same backend's memory: the copies are device to device
 * (qc_op_copy), synchronized before the old buffers are freed. */
enum qc_status qc_qcnet_set_memctx(struct qc_qcnet *m, struct qc_memctx *mc);
/* Switches the attention implementation (the parameters are the same). Only between steps. */
void qc_qcnet_set_attention(struct qc_qcnet *m, enum qc_attn_impl impl);
#define QC_QCNET_EDGE_SETS 9 /* QC_EDGE_SET_COUNT of qc_graph.h */
/* The edge mode of each edge set (enum qc_edge_set order, QC_QCNET_EDGE_SETS entries) for the
 * next steps; NULL = the configuration's edge_mode for every set. Only between steps. A mode the
 * backend or the attention implementation cannot run fails the next forward (QC_ERR_UNSUPPORTED,
 * qc_attn_edges_set_mode); QC_ERR_INVALID for a value out of range. */
enum qc_status qc_qcnet_set_edge_modes(struct qc_qcnet *m, const enum qc_attn_edge_mode *modes);
/* The edge mode edge set `set` resolved to in the last forward (MATERIALISED or TILED for a
 * FUSED positional set; AUTO for UNFUSED or a set without positional input or not run). */
enum qc_attn_edge_mode qc_qcnet_edge_mode(const struct qc_qcnet *m, int set);

// ---- parameters ---------------------------------------------------------------------------

#define QC_QCNET_KEY_MAX 96 /* bytes of a state_dict key, NUL included */

/* Initialisation rule of a tensor (QCNET.md §2.4). */
enum qc_qcnet_init {
    QC_QCNET_INIT_XAVIER = 0, /* Linear weight: U(−a, a), a = sqrt(6 / (fan_in + fan_out)) */
    QC_QCNET_INIT_ZERO,       /* biases, LayerNorm bias, traj_emb_h0 */
    QC_QCNET_INIT_ONE,        /* LayerNorm weight */
    QC_QCNET_INIT_NORMAL002,  /* Embedding and Fourier freqs: N(0, 0.02²) */
    QC_QCNET_INIT_GRU_IH,     /* GRU weight_ih: Xavier per [D,D] row block (a = sqrt(6/2D)) */
    QC_QCNET_INIT_GRU_HH,     /* GRU weight_hh: an orthogonal matrix per [D,D] row block */
};

/* One state_dict key. Alias keys (attn_prenorm_x_dst.* of the self-attention layers) have
 * alias_of >= 0 (the index of the key they share storage with) and the same offset. */
struct qc_qcnet_key {
    char name[QC_QCNET_KEY_MAX]; /* e.g. "decoder.m2m_refine_attn_layer.to_q.weight" */
    int ndim;                    /* 1 or 2 */
    int64_t shape[2];            /* PyTorch shape ([out, in] for Linear weights; [1,D] h0) */
    int64_t offset;              /* elements from the start of the flat parameter buffer */
    int64_t numel;
    bool decay; /* AdamW decay group (QCNET.md §2.5) */
    enum qc_qcnet_init init;
    int alias_of; /* -1, or the index of the key this one aliases */
};

/* Total distinct parameters (7,660,673 for the AV2 config). */
int64_t qc_qcnet_num_params(const struct qc_qcnet *m);
/* The flat buffers (qc_qcnet_num_params floats each; device pointers on device backends). grads
 * are ACCUMULATED by backward; zero_grad clears them (an op on the model's backend). */
float *qc_qcnet_params(struct qc_qcnet *m);
float *qc_qcnet_grads(struct qc_qcnet *m);
void qc_qcnet_zero_grad(struct qc_qcnet *m);

/* Every state_dict key in QCNet's order (949 for the AV2 config, 14 of them aliases). */
int qc_qcnet_num_keys(const struct qc_qcnet *m);
const struct qc_qcnet_key *qc_qcnet_key_at(const struct qc_qcnet *m, int i);
/* Index of the key called name, or -1. */
int qc_qcnet_key_find(const struct qc_qcnet *m, const char *name);

/* The AdamW parameter groups as segments of the flat buffer: tensor s (distinct tensors only,
 * in state_dict order) covers [offsets[s], offsets[s+1]) and is in the decay group iff
 * decay[s]. Host arrays owned by the model on every backend (qc_qcnet_adamw_step uses device
 * copies of its own); the shape of qc_adamw_step_segments_cpu's arguments. */
void qc_qcnet_param_groups(const struct qc_qcnet *m, const int64_t **offsets, const uint8_t **decay,
                           int64_t *num_tensors);

/* Initialises every parameter by QCNet's rules (QCNET.md §2.4) from seed (a splitmix/Box-Muller
 * stream in key order: the distributions of PyTorch, not its values). Deterministic; the same
 * bits on every backend (generated on the host, then uploaded on device backends, where a
 * failed upload aborts). */
void qc_qcnet_init_params(struct qc_qcnet *m, uint64_t seed);

/* Loads every parameter from an open safetensors file whose names are QCNet's state_dict keys
 * (prefix, e.g. "" or "model.", is prepended to every key looked up). Alias keys may be present
 * (ignored; the storage comes from the aliased key) or absent. Tensors must be F32 with exactly
 * the model's shape. Errors (QC_ERR_INVALID), naming the first offending key in state_dict order:
 * missing key; shape mismatch (both shapes, "checkpoint [128,129] vs model [32,17]"); wrong
 * dtype; and a key under "<prefix>encoder." / "<prefix>decoder." that this model does not have
 * (a checkpoint of a deeper configuration). Other tensors are ignored (optimizer state). The
 * parameters are unchanged on error (every check runs before the first copy; on device backends
 * the tensors are uploaded from the file's host data, QC_ERR_CUDA if that fails). */
enum qc_status qc_qcnet_load_st(struct qc_qcnet *m, const struct qc_safetensors *st,
                                const char *prefix);
/* qc_qcnet_load_st on the file at path (opened and closed here), prefix "". */
enum qc_status qc_qcnet_load(struct qc_qcnet *m, const char *path);

/* Adds the parameters to a writer under prefix + key (prefix may be NULL): every distinct
 * tensor, and the alias keys as copies when with_aliases (PyTorch's load_state_dict needs them
 * in strict mode). The data are referenced, not copied: keep the model unchanged until the
 * writer has written. On device backends the writer references a host mirror owned by the
 * model, downloaded by this call (QC_ERR_CUDA): valid until the next call or destroy. */
enum qc_status qc_qcnet_add_to_writer(const struct qc_qcnet *m, struct qc_st_writer *w,
                                      const char *prefix, bool with_aliases);
/* Adds a float buffer laid out like the parameters (gradients, Adam moments) under
 * prefix + key for every distinct tensor. buf is HOST memory on every backend (download device
 * buffers first, e.g. qc_qcnet_grads_download); referenced until the writer has written. */
enum qc_status qc_qcnet_add_buffer_to_writer(const struct qc_qcnet *m, struct qc_st_writer *w,
                                             const char *prefix, const float *buf);
/* Reads such a buffer back (every distinct key under prefix, F32, the model's shapes) into buf,
 * HOST memory on every backend (upload it to the device afterwards). */
enum qc_status qc_qcnet_read_buffer(const struct qc_qcnet *m, const struct qc_safetensors *st,
                                    const char *prefix, float *buf);
/* Writes the parameters (with alias copies) plus metadata "format" = "pt" and "qcnet_config"
 * (JSON of the config) to path atomically. */
enum qc_status qc_qcnet_save(const struct qc_qcnet *m, const char *path);

/* Config as a one-line JSON object with QCNet's hyper-parameter names (hidden_dim, ...), for
 * checkpoint metadata. Writes at most n bytes (NUL included); returns the length needed. */
size_t qc_qcnet_config_json(const struct qc_qcnet_config *cfg, char *buf, size_t n);

/* The official QCNet's constructor arguments that are not the model's sizes (graph building,
 * optimizer, schedule: QCNET.md §1); the run's configuration holds them (model.*, train.*). */
struct qc_qcnet_official {
    int64_t time_span;     /* steps, 10 */
    int64_t num_t2m_steps; /* steps, 30 */
    double pl2pl_radius;   /* m, 150 */
    double pl2a_radius;    /* m, 50 */
    double a2a_radius;     /* m, 50 */
    double pl2m_radius;    /* m, 150 */
    double a2m_radius;     /* m, 150 */
    double lr;             /* 5e-4 */
    double weight_decay;   /* 1e-4 */
    int64_t t_max;         /* epochs, 64 */
};
/* The values of the official AV2 configuration (QCNET.md §1). */
void qc_qcnet_official_default(struct qc_qcnet_official *o);
/* qc_qcnet_config_json with every constructor argument of the official QCNet (dataset ...
 * submission_file_name, docs/CHECKPOINTS.md), so QCNet(**cfg) builds the model;
 * qc_qcnet_config_json writes o's defaults. */
size_t qc_qcnet_config_json_official(const struct qc_qcnet_config *cfg,
                                     const struct qc_qcnet_official *o, char *buf, size_t n);

/* One AdamW step over the whole model (qc_adamw_step_segments with the two groups, on the
 * model's backend): params updated from grads; adam_m, adam_v (num_params each) the moments,
 * updated: memory of the model's backend (device buffers on device backends). */
void qc_qcnet_adamw_step(struct qc_qcnet *m, float *adam_m, float *adam_v, double lr,
                         double weight_decay, double beta1, double beta2, double eps, int64_t step);

// ---- forward ------------------------------------------------------------------------------

struct qc_qcnet_ctx {
    bool training;      /* dropout on (config.dropout); off = eval mode */
    bool need_backward; /* keep what backward needs (false: eval, stashes may be dropped early) */
    uint64_t seed;      /* run seed (dropout key) */
    uint32_t step;      /* optimizer step (dropout counter) */
    /* Device backends only (ignored on CPU): the batch already copied to the device, as
     * qc_batch_rebase describes (e.g. by the trainer on a copy stream, the model's stream then
     * waiting for it), or NULL to let the forward copy it in on the model's stream. It must
     * stay alive and unchanged until qc_qcnet_release, like the host batch. */
    const struct qc_batch *batch_dev;
    /* NULL, or the loss denominators of a larger group this batch is a part of (the trainer's
     * admission control runs a group that does not fit as sub-groups): S + 1 host floats, the
     * per-step regression denominators max(1, Σ_a reg_mask[a,s]) then the classification one
     * max(1, Σ_a cls_mask[a]), over the whole group (qc_qcnet_loss_norm). qc_qcnet_loss then
     * gives this batch's share, and the shares of the parts add up to the group's loss (and
     * their gradients to its gradients) within fp32 rounding. Read at the loss; kept by the
     * caller until then. */
    const float *loss_norm;
};

/* The model's outputs (QCNet's names and shapes; A agents, K modes, S = 60 future steps).
 * Views into model memory, valid until qc_qcnet_release / the next forward. */
struct qc_qcnet_output {
    int64_t A, K, S, D;
    int64_t P, Pt;                  /* polygons, points */
    const float *loc_propose_pos;   /* (A,K,S,2) cumulative, agent frame */
    const float *scale_propose_pos; /* (A,K,S,2) */
    const float *loc_refine_pos;    /* (A,K,S,2) */
    const float *scale_refine_pos;  /* (A,K,S,2) */
    const float *pi;                /* (A,K) logits */
    const float *x_pt;              /* (Pt,D) map-encoder point features */
    const float *x_pl;              /* (P,D) map-encoder polygon features (x_pl[:, t], any t) */
    const float *x_a;               /* (A,T,D) agent-encoder output */
};

/* Runs the encoders and the decoder on batch (which must hold its graph: has_graph). The batch
 * must stay alive and unchanged until qc_qcnet_release. Frees the previous step's activations
 * first. QC_ERR_INVALID when the batch does not fit the model (graph missing, K differs),
 * QC_ERR_NOMEM from the allocation hook (everything allocated so far is released). */
enum qc_status qc_qcnet_forward(struct qc_qcnet *m, const struct qc_batch *batch,
                                const struct qc_qcnet_ctx *ctx, struct qc_qcnet_output *out);

// ---- loss ---------------------------------------------------------------------------------

/* QCNet's training loss (QCNET.md §6.1). */
struct qc_qcnet_loss {
    float loss; /* reg_loss_propose + reg_loss_refine + cls_loss */
    float reg_loss_propose;
    float reg_loss_refine;
    float cls_loss;
    const int64_t *best_mode; /* (A) chosen on the proposal; valid until release */
    int64_t num_agents;
};

/* The loss denominators of batch b (QCNET.md §6.1) into norm (61 floats: the 60 per-step
 * regression denominators, then the classification one), from its predict_mask: what the
 * sub-groups of b pass as qc_qcnet_ctx.loss_norm. */
#define QC_QCNET_LOSS_NORM 61
void qc_qcnet_loss_norm(const struct qc_batch *b, float *norm);
/* Computes the loss of the last forward against the batch's targets (batch->target, or the
 * TargetBuilder output computed here when the batch has none). */
enum qc_status qc_qcnet_loss(struct qc_qcnet *m, struct qc_qcnet_loss *out);

// ---- backward -----------------------------------------------------------------------------

/* Back-propagates dloss_scale · loss (the last qc_qcnet_loss) through the whole model and
 * ACCUMULATES the parameter gradients into qc_qcnet_grads(). Requires a forward with
 * need_backward and a loss. Stashes are freed as backward passes them. */
enum qc_status qc_qcnet_backward(struct qc_qcnet *m, float dloss_scale);

/* Told that gradients [lo, hi) of the flat buffer are final for this backward: on the CPU
 * computed; on a device backend all the work producing them is enqueued on the model's stream.
 * Called on the thread running backward. */
typedef void (*qc_qcnet_grads_ready_fn)(void *ctx, int64_t lo, int64_t hi);
/* Sets (fn NULL: clears) the callback of qc_qcnet_backward. Parameters are laid out in
 * state_dict order (map encoder, agent encoder, decoder) and backward runs decoder → agent
 * encoder → map encoder, so each backward reports three ranges from the top of the buffer down,
 * each starting where the previous one ended: [decoder, n), [agent encoder, decoder),
 * [0, agent encoder) (data-parallel training starts reducing each as soon as it is reported). */
void qc_qcnet_set_grads_ready(struct qc_qcnet *m, qc_qcnet_grads_ready_fn fn, void *ctx);
/* Where those ranges meet (the first parameter of the agent encoder, of the decoder), known
 * before any backward: writes up to cap offsets into out and returns how many there are (2). */
int qc_qcnet_grads_cuts(const struct qc_qcnet *m, int64_t *out, int cap);

/* Gives every activation and stash back to the allocation hook. Idempotent. */
void qc_qcnet_release(struct qc_qcnet *m);

// ---- memory accounting ----------------------------------------------------------------------

struct qc_qcnet_mem {
    size_t bytes_live;   /* activations, stashes and block scratch held now (memory context) */
    size_t bytes_peak;   /* peak of bytes_live since creation or the last reset */
    size_t bytes_stash;  /* Σ stash-table payload of the last forward (what backward reads) */
    size_t bytes_params; /* parameters + gradients (also from the context; not in bytes_live) */
    int64_t n_allocs;    /* successful allocations for bytes_live since creation */
    uint64_t recompute_bytes; /* stash bytes rebuilt by recompute since creation */
    int64_t recomputes;       /* block applications recomputed */
    int64_t repaired;         /* offloaded stashes that failed to read back, recomputed */
};
void qc_qcnet_mem_get(const struct qc_qcnet *m, struct qc_qcnet_mem *out);
void qc_qcnet_mem_reset_peak(struct qc_qcnet *m);
/* One line per block of the last forward: "<block> <stash bytes>" in forward order, then the
 * total. */
void qc_qcnet_stash_report(const struct qc_qcnet *m, FILE *out);

// ---- metrics (QCNET.md §6.2) ------------------------------------------------------------------

/* Sums over agents, merged across batches (and ranks) by adding. */
struct qc_qcnet_metrics {
    double sum_min_ade;
    double sum_min_fde;
    double sum_miss;  /* agents with minFDE > 2 m */
    double sum_brier; /* Σ (1 − p_k̂)² */
    double sum_ahe;   /* Σ over agents of the mean |wrap(heading error)| of mode k̂, radians */
    double sum_fhe;   /* Σ |wrap(heading error)| of mode k̂ at the last valid step, radians */
    int64_t count;    /* focal agents with at least one valid future step */
};

struct qc_qcnet_metric_values {
    double min_ade, min_fde, miss_rate, brier, brier_min_fde; /* brier_min_fde = minFDE + Brier */
    double min_ahe, min_fhe; /* heading errors of the FDE-best mode, radians in [0, π] */
    int64_t count;
};

void qc_qcnet_metrics_reset(struct qc_qcnet_metrics *mt);
/* Adds the focal agents (category == 3) of one batch: loc (A,K,S,2) refined locations,
 * pi (A,K) logits, target (A,S,4) (x, y, z, heading: TargetBuilder), predict_mask (A,T+S),
 * category (A). k̂ = argmin_k FDE_k at the last valid step s*. Headings as the official
 * validation_step derives them without a heading head: step s of a mode points along its
 * motion from step s−1 (from the origin for s = 0), h_s = atan2(Δy, Δx) (0 for no motion);
 * minAHE averages |wrap(h_{k̂,s} − target_s.heading)| over the valid steps, minFHE takes it at
 * s*; wrap(a) = −π + ((a + π) mod 2π), floor modulo, as QCNet's wrap_angle. */
void qc_qcnet_metrics_update(struct qc_qcnet_metrics *mt, const float *loc, const float *pi,
                             const float *target, const uint8_t *predict_mask,
                             const uint8_t *category, int64_t A, int64_t K, int64_t T, int64_t S);
/* The same from the last forward of m and its batch (targets as in qc_qcnet_loss). */
enum qc_status qc_qcnet_metrics_update_model(struct qc_qcnet_metrics *mt, struct qc_qcnet *m);
void qc_qcnet_metrics_merge(struct qc_qcnet_metrics *dst, const struct qc_qcnet_metrics *src);
/* Means (0 when count == 0). */
void qc_qcnet_metrics_compute(const struct qc_qcnet_metrics *mt, struct qc_qcnet_metric_values *v);

#ifdef __cplusplus
}
#endif

#endif /* QC_MODEL_QC_QCNET_H */
