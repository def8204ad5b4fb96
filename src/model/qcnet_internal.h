/*
 * qcnet_internal.h — the model object behind qc_qcnet.h, shared by the qcnet_*.c files of
 * src/model (never included from outside this folder).
 *
 * Files: qcnet_config.c (config), qcnet_params.c (key table, init, safetensors, groups),
 * qcnet_model.c (create/destroy, forward / loss / backward entry points), qcnet_buffers.c
 * (activation memory), qcnet_inputs.c (the batch as op arguments and the graph views),
 * qcnet_entry.c (the tape's table of block applications: adding, finding, an entry's stashes
 * and what its backward reads), qcnet_recompute.c (an entry's forward again), qcnet_policy.c
 * (the stash policies), qcnet_tape.c (the forward / backward of each kind of entry),
 * qcnet_encoder.c (map and agent encoders), qcnet_decoder.c (decoder), qcnet_loss.c (loss and
 * metrics).
 *
 * Calls between these files go one way (tests/file_cycles.py): qcnet_buffers.c is the lowest;
 * then qcnet_entry.c < qcnet_recompute.c < qcnet_policy.c < qcnet_tape.c < the encoders and the
 * decoder < qcnet_model.c, which calls inputs, loss and tape too.
 *
 * Glossary.
 *   entry   one block application: one row of the tape, in forward order (struct qcnet_entry).
 *           Its kind says which block ran: a FourierEmbedding (FE) on a set of rows, the edge
 *           context of an edge set (EDGES), the source/edge context of a bipartite layer (KV),
 *           an application of an AttentionLayer to one set of queries (ATTN; a self-attention
 *           application carries its own source context), an MLP head (MLP), the trajectory
 *           GRU (GRU). It holds the stash tables its backward reads and whatever its forward
 *           needs to run again (recompute).
 *   app     an ATTN entry; applications are numbered in forward order (app<n> in tags).
 *   layer   one AttentionLayer's parameters (struct qc_attn); its KV entry is shared by the
 *           applications that see the same sources (the decoder's 3 recurrent proposal steps).
 *   occ     the occurrence of a block in one forward (0-based): the decoder's proposal layers
 *           run R times; the backward finds an entry by (kind, block, occ).
 *   site    dropout site ids: application n of a forward uses sites 2n (attention weights) and
 *           2n + 1 (FFN). Its elements are keyed by scene (qcnet_inputs.c: each row's dataset
 *           scene index and rank within its scene), so the groups and sub-groups of a step, which
 *           hold different scenes, draw independent masks, and a scene draws the same mask in
 *           any batch.
 *
 * Invariants of the tape (checked by qcnet_tape_check in tests): entries appear in forward
 * order; (kind, block, occ) is unique; an ATTN entry's kv index names an earlier KV entry of the
 * same layer; Σ over entries of the bound stash payload = bytes_stash of the forward.
 */
#ifndef QC_MODEL_QCNET_INTERNAL_H
#define QC_MODEL_QCNET_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_attention.h"
#include "qc_exec.h"
#include "qc_fourier.h"
#include "qc_memctx.h"
#include "qc_mlp.h"
#include "qc_qcnet.h"
#include "qc_stash.h"
#include "qc_status.h"

#include "qc_batch.h"

#define QCNET_MAX_LAYERS 8   /* per layer list (map, agent, decoder) */
#define QCNET_MAX_APPS   256 /* attention applications of one forward */
#define QCNET_MAX_RSTEPS 16  /* recurrent proposal steps */
#define QCNET_T          50  /* history steps fixed by the data layout */
#define QCNET_S          60  /* future steps fixed by the data layout */
#define QCNET_STEPS      110

/* Edge-set slots of a forward pass (the qc_edge_set order of qc_graph.h). */
enum { NSET = 9 };

/* One live activation obtained from the memory context. */
struct qcnet_buf {
    void *p;
    size_t bytes;
};

/* Where an entry's stash is (qcnet_policy.c). */
enum qcnet_res {
    QCNET_RES_LIVE = 0, /* bound to device memory */
    QCNET_RES_OUT,      /* offloaded: in the tier, handles in entry.handle */
    QCNET_RES_FETCH,    /* being copied back: bound to fresh memory, wait before use */
    QCNET_RES_DROPPED,  /* freed for recompute */
};

/* The categorical embeddings an FE adds before its output LayerNorm: cat = Σ_j table_j[idx_j]
 * (ascending j), table j at parameter offset off[j] with vocab[j] rows. n = 0: none. */
struct qcnet_cat {
    int n;
    int64_t off[2], vocab[2];
    const int64_t *idx[2];
    const char *tag; /* of the (N,D) temporary */
};

/* What a tape entry is (glossary). */
enum qcnet_kind { QCNET_FE = 0, QCNET_EDGES, QCNET_KV, QCNET_ATTN, QCNET_MLP, QCNET_GRU };
/* Its name in messages ("?" out of range). */
static inline const char *qcnet_kind_str(enum qcnet_kind k)
{
    static const char *const names[] = {"fe", "edges", "kv", "attn", "mlp", "gru"};
    return (int)k >= 0 && k <= QCNET_GRU ? names[k] : "?";
}

#define QCNET_ENTRY_NAME  (QC_QCNET_KEY_MAX + 32)
#define QCNET_MAX_ENTRIES 384 /* block applications of one forward */

/* One block application (glossary): one row of the tape. */
struct qcnet_entry {
    char name[QCNET_ENTRY_NAME]; /* "<block key prefix>" or "<layer key prefix>/app<n>" */
    enum qcnet_kind kind;
    const void *block;     /* the qcnet_layer (KV, ATTN), qc_fourier (FE) or qc_mlp (MLP); NULL for
                              EDGES and GRU */
    int occ;               /* occurrence of (kind, block) in this forward */
    int set;               /* EDGES, KV, ATTN: the edge set (qc_edge_set) */
    int kv;                /* ATTN: the entry index of its KV (bipartite), or -1 (self-attention: kv
                              below is its own) */
    struct qc_stash st;    /* ATTN, FE, MLP, GRU: the stash (memory from the memory context) */
    struct qc_attn_kv kvc; /* KV and self-attention ATTN: the source/edge context */
    bool kv_live;          /* kvc initialised and not yet freed */
    const float *x;        /* ATTN: input rows x_dst (n_dst,D); FE, MLP: the input rows */
    const float *x_src;    /* ATTN: the sources (== x for self-attention) */
    float *out;            /* ATTN: output rows (n_dst,D) */
    struct qc_attn_ctx ctx; /* ATTN: dropout keying */
    int64_t rows;           /* FE, MLP, GRU: rows N */
    struct qcnet_cat cat;   /* FE: its categorical embeddings */
    int64_t steps;          /* GRU: time steps */
    /* the step's stash policy (qc_qcnet_set_plan; qcnet_policy.c) */
    uint8_t policy;     /* enum qc_stash_policy; KEEP without a plan */
    uint8_t res;        /* enum qcnet_res */
    uint64_t handle[3]; /* offloaded: the handles of its stash arenas (by slot) */
    /* measured in the last forward / backward of this entry (the cost model's calibration) */
    double t_fwd, t_bwd; /* wall seconds (host time: the CPU and EMU backends) */
};

struct qcnet_layer {
    struct qc_attn attn;
    int64_t offset; /* of the layer's parameter table in the flat buffer */
    char prefix[QC_QCNET_KEY_MAX];
};

/* The forward tape: everything one forward leaves for loss and backward. */
struct qcnet_tape {
    bool active;   /* a forward ran and has not been released */
    bool has_loss; /* qc_qcnet_loss ran */
    bool need_backward;
    bool training; /* dropout on */
    uint64_t seed; /* dropout key */
    uint32_t step;
    const struct qc_batch *batch;     /* host batch: what host code reads (index prep, features) */
    const struct qc_batch *dbatch;    /* the same batch as op arguments: == batch on CPU, a device
                                         view (qc_batch_rebase) on device backends */
    struct qc_batch dbatch_view;      /* storage of that view */
    void *dbatch_node, *dbatch_graph; /* device copies the model made (NULL when the caller
                                         passed ctx.batch_dev, or on CPU) */
    int64_t A, P, Pt, K, S;

    /* graph views for the attention layers: the arrays of dbatch->graph (op arguments), with
     * host mirrors (qc_attn_graph *_host) at batch->graph's on device backends */
    struct qc_attn_graph g[NSET];
    struct qc_attn_edges ed[NSET];
    bool ed_init[NSET];
    /* index arrays the model derives from the graph on the host (op arguments: device memory
     * on device backends, from the memory context, recorded in bufs) ... */
    int64_t *pl2a_src;   /* (E_pl2a) polygon of each pl2a source: src mod P */
    int64_t *pl2m_query; /* (A*K) mode-major query rows k*A + a */
    int64_t *pl2pl_type; /* (E_pl2pl) int64 copies of the edge types, checked in [0, 5) */
    /* ... and their host copies, for host code on EVERY backend: == the arrays above on CPU,
     * malloc'ed mirrors on device backends (freed by release) */
    int64_t *pl2a_src_host, *pl2m_query_host, *pl2pl_type_host;
    /* dropout keys (qc_attn_ctx.edge_key / row_key; training with dropout only, else NULL; op
     * arguments from the memory context): per edge set its base edges' keys and its x_dst rows'
     * keys (sets with the same x_dst rows share one array) */
    int64_t *drop_edge_key[NSET];
    int64_t *drop_row_key[NSET];

    /* the tape: block applications in forward order (glossary) */
    struct qcnet_entry *e; /* [QCNET_MAX_ENTRIES], allocated with the model */
    int n_entries;
    int n_app;      /* ATTN entries so far (their dropout sites and tags) */
    double t_entry; /* when the entry being timed began */

    /* map encoder */
    int64_t *idx_pt_type, *idx_pt_side, *idx_pl_type, *idx_pl_int; /* (Pt), (Pt), (P), (P) */
    float *x_pt;                                                   /* (Pt,D) */
    float *x_pl0;                                                  /* (P,D) FE(0) output */
    float *x_pl;                                                   /* (P,D) encoder output */

    /* agent encoder */
    float *c_a;          /* (50A,4) agent-step features, agent-major */
    int64_t *idx_a_type; /* (50A) */
    float *x_a0;         /* (50A,D) FE output, agent-major */
    float *x_a;          /* (50A,D) encoder output, agent-major */

    /* decoder */
    float *xa49;        /* (A,D) x_a[:, 49] */
    float *m0;          /* (KA,D) mode_emb tiled, agent-major */
    int64_t R;          /* recurrent steps */
    float *lp_cat;      /* (A,K,S*2) concatenated proposal loc increments */
    float *sp_elu;      /* (A,K,S*2) ELU(concatenated proposal scale head) */
    float *loc_propose; /* (A,K,S,2) */
    float *scale_propose;
    float *m_ref_in;     /* (KA,D) refine queries before the layers (GRU final state) */
    float *m_ref;        /* (KA,D) after m2m_refine */
    float *head_loc_r;   /* (KA,S*2) to_loc_refine_pos output */
    float *sr_elu;       /* (KA,S*2) ELU(to_scale_refine_pos) */
    float *loc_refine;   /* (A,K,S,2) */
    float *scale_refine; /* (A,K,S,2) */
    float *pi;           /* (A,K) */

    /* loss */
    float *target_own; /* (A,S,4) when the batch had none */
    const float *target;
    uint8_t *reg_mask;           /* (A,S) */
    uint8_t *cls_mask;           /* (A) */
    int64_t *best_mode;          /* (A) */
    const float *loss_norm_host; /* ctx.loss_norm (S+1 host floats), or NULL */
    float *loss_norm;            /* its device copy, made by the loss */
    struct qc_qcnet_loss loss;
};

struct qc_qcnet {
    struct qc_qcnet_config cfg;
    enum qc_attn_edge_mode edge_mode[QC_QCNET_EDGE_SETS];     /* per edge set: the next forwards'
                                                                (qc_qcnet_set_edge_modes) */
    enum qc_attn_edge_mode edge_mode_run[QC_QCNET_EDGE_SETS]; /* what the last forward resolved
                                                                each to (qc_qcnet_edge_mode) */
    const struct qc_exec *ex; /* backend of every op (NULL = CPU); see qc_qcnet_create_on */
    /* dry run (qc_qcnet_create_dry): ex is DRY, mc hands out no memory, the blocks do not run
     * and the host does none of the batch's index work; qc_qcnet_describe records the step */
    bool dry;
    struct qc_exec dry_exec; /* dry: the DRY backend (ex points here), its target the backend
                                whose blocks' memory the program describes (qc_qcnet_describe) */
    int64_t D, H, F, K, R, NL_map, NL_agent, NL_dec;
    int64_t head_out; /* Tf * 2 / R: outputs of a proposal head */

    /* parameters */
    float *params,
        *grads; /* (nparams) each, from the memory context: device memory on device backends */
    float *params_lp; /* cfg.precision != fp32: params + nparams (one allocation of 2 nparams):
                         the parameters the blocks read, every Linear and GRU weight rounded to
                         the precision (docs/PRECISION.md), refreshed by each forward; else NULL */
    int64_t nparams;
    struct qc_qcnet_key *keys;
    int nkeys, cap_keys;
    int64_t *seg_off; /* (nseg+1) host */
    uint8_t *seg_decay;
    int64_t nseg;
    /* device backends only (NULL on CPU): copies of seg_off / seg_decay from the memory context
     * (tag "params/groups", bytes seg_dev_bytes) for qc_op_adamw_step_segments, and a host mirror
     * of the parameters (nparams floats, malloc) that qc_qcnet_add_to_writer downloads into */
    int64_t *seg_off_dev;
    uint8_t *seg_decay_dev; /* inside the seg_off_dev block */
    size_t seg_dev_bytes;
    float *params_host;

    /* map encoder */
    int64_t o_type_pt, o_side_pt, o_type_pl, o_int_pl, o_type_pl2pl; /* Embedding offsets */
    struct qc_fourier x_pt_emb, x_pl_emb, r_pt2pl_emb, r_pl2pl_emb;
    struct qcnet_layer pt2pl[QCNET_MAX_LAYERS], pl2pl[QCNET_MAX_LAYERS];
    /* agent encoder */
    int64_t o_type_a;
    struct qc_fourier x_a_emb, r_t_emb, r_pl2a_emb, r_a2a_emb;
    struct qcnet_layer t_attn[QCNET_MAX_LAYERS], pl2a_attn[QCNET_MAX_LAYERS],
        a2a_attn[QCNET_MAX_LAYERS];
    /* decoder */
    int64_t o_h0, o_mode_emb, o_gru_wih, o_gru_whh, o_gru_bih, o_gru_bhh;
    struct qc_fourier r_t2m_emb, r_pl2m_emb, r_a2m_emb, y_emb;
    struct qcnet_layer t2m_p[QCNET_MAX_LAYERS], pl2m_p[QCNET_MAX_LAYERS], a2m_p[QCNET_MAX_LAYERS];
    struct qcnet_layer m2m_p;
    struct qcnet_layer t2m_r[QCNET_MAX_LAYERS], pl2m_r[QCNET_MAX_LAYERS], a2m_r[QCNET_MAX_LAYERS];
    struct qcnet_layer m2m_r;
    struct qc_mlp to_loc_p, to_scale_p, to_loc_r, to_scale_r, to_pi;

    /* memory: every allocation goes through mc (the caller's, or a host-malloc context of the
     * model's own, own_mc). The model's buffers are class QC_MEM_MODEL and recorded in bufs;
     * the blocks' scratch is class QC_MEM_BLOCK (the blocks free it themselves); parameters,
     * gradients and the AdamW segments are QC_MEM_PARAM. */
    struct qc_memctx *mc;
    bool own_mc;
    struct qcnet_buf *bufs;
    int nbufs, cap_bufs;
    size_t bytes_bufs;  /* Σ bufs bytes */
    size_t bytes_stash; /* Σ stash payload bound by the last forward */

    struct qcnet_tape tape;
    struct qcnet_plan *plan; /* the step's stash policies (NULL = keep everything) */
    /* since create: stash bytes recomputed, recomputes, offloaded stashes repaired by recompute
     * after a read failure (qcnet_policy.c) */
    uint64_t recompute_bytes;
    int64_t recomputes, repaired;

    /* qc_qcnet_set_grads_ready: told as backward finishes each part's gradients (or NULL) */
    qc_qcnet_grads_ready_fn grads_ready;
    void *grads_ready_ctx;
};

// ---- qcnet_params.c -----------------------------------------------------------------------

/* Builds the key table and binds every block (called by qc_qcnet_create). */
enum qc_status qcnet_params_build(struct qc_qcnet *m);
void qcnet_params_free(struct qc_qcnet *m);
/* The parameters the blocks and the GRU read: m->params_lp with a 16-bit precision, else
 * m->params. qcnet_params_refresh rounds the master weights' Linear and GRU weight matrices
 * into m->params_lp (a no-op in fp32); every forward calls it first. */
float *qcnet_params_compute(const struct qc_qcnet *m);
void qcnet_params_refresh(struct qc_qcnet *m);
/* Binds every block to m->params / m->grads (after the buffers exist). */
void qcnet_params_bind(struct qc_qcnet *m);

// ---- qcnet_buffers.c: activation memory ----------------------------------------------------

/* n floats (or bytes) from the memory context, recorded for release; NULL + error status on
 * failure. */
enum qc_status qcnet_falloc(struct qc_qcnet *m, int64_t n, const char *tag, float **out);
enum qc_status qcnet_zalloc(struct qc_qcnet *m, int64_t n, const char *tag, float **out);
enum qc_status qcnet_ialloc(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **out);
enum qc_status qcnet_balloc(struct qc_qcnet *m, size_t bytes, const char *tag, void **out);
/* Device backends: host data computed from the batch (indices, features, masks) copied into
 * a fresh recorded buffer of `bytes` from the memory context (tag). On CPU the same (a copy into
 * context memory), so callers need no branch. */
enum qc_status qcnet_upload(struct qc_qcnet *m, const void *host, size_t bytes, const char *tag,
                            void **out);
/* A host temporary of bytes (at least one byte) for data derived from the batch; NULL with
 * QC_ERR_NOMEM set (naming what) on failure. */
void *qcnet_host_tmp(size_t bytes, const char *what);
/* qcnet_upload of a qcnet_host_tmp buffer, which is freed either way. */
enum qc_status qcnet_upload_tmp(struct qc_qcnet *m, void *host, size_t bytes, const char *tag,
                                void **out);
/* An input the host computes from the batch for the ops (features, indices, masks, dropout
 * keys): `bytes` of recorded context memory under tag, written by the host between
 * qcnet_input_begin and qcnet_input_end. One path for every backend, so the dry run's allocation
 * is the real one, at the same place in the sequence as long as nothing else is allocated
 * between a begin and its end but other inputs begun and ended in the same order:
 *   CPU     begin allocates the buffer and *host is the buffer itself (no copy);
 *   device  *host is a host temporary; end allocates the buffer and uploads into it;
 *   dry     *host is NULL (nothing to compute: the caller skips its host work); end allocates.
 * end gives the buffer (*out) and frees a host temporary unless keep (then *host stays the
 * caller's, freed with free(); on CPU and dry nothing is kept apart from the buffer). After a
 * failure between the two, qcnet_input_drop(m, host) frees what begin gave. */
enum qc_status qcnet_input_begin(struct qc_qcnet *m, size_t bytes, const char *tag, void **host);
enum qc_status qcnet_input_end(struct qc_qcnet *m, void *host, size_t bytes, const char *tag,
                               bool keep, void **out);
void qcnet_input_drop(struct qc_qcnet *m, void *host);
/* Scalars and small results back to the host (synchronizing on device backends). */
enum qc_status qcnet_download(struct qc_qcnet *m, void *host, const void *dev, size_t bytes);

/* Gives one recorded buffer back early (NULL is a no-op). */
void qcnet_free(struct qc_qcnet *m, void *p);
/* Gives every recorded buffer back (qc_qcnet_release). */
void qcnet_bufs_free_all(struct qc_qcnet *m);
/* Detaches buffer p from the model's list (its memory stays allocated; the caller now owns it)
 * / attaches a buffer of bytes to it (the stash policies' offload and fetch). */
size_t qcnet_buf_detach(struct qc_qcnet *m, void *p);
enum qc_status qcnet_buf_attach(struct qc_qcnet *m, void *p, size_t bytes);
/* Binds a planned stash table of entry `entry` to memory-context memory (tag = its block
 * label); a recording program learns that the arena is the entry's stash. */
enum qc_status qcnet_stash_bind(struct qc_qcnet *m, int entry, struct qc_stash *st,
                                const char *tag);
/* Releases a stash's memory back to the memory context and empties the table. */
void qcnet_stash_free(struct qc_qcnet *m, struct qc_stash *st);

// ---- qcnet_inputs.c ------------------------------------------------------------------------

/* tape.batch / tape.dbatch for batch (ctx.batch_dev or a copy made here on device backends). */
enum qc_status qcnet_tape_batch(struct qc_qcnet *m, const struct qc_batch *batch,
                                const struct qc_qcnet_ctx *ctx);
/* The batch as op arguments: tape.dbatch (asserts it is set on device backends), else the
 * host batch. */
const struct qc_batch *qcnet_op_batch(const struct qc_qcnet *m);
/* Checks every edge set's sizes and builds tape.g with the host-derived index arrays. */
enum qc_status qcnet_tape_graphs(struct qc_qcnet *m);

// ---- qcnet_encoder.c / qcnet_decoder.c ---------------------------------------------------

enum qc_status qcnet_map_forward(struct qc_qcnet *m);
enum qc_status qcnet_agent_forward(struct qc_qcnet *m);
enum qc_status qcnet_decoder_forward(struct qc_qcnet *m);
/* dx_pl (P,D), dx_a (50A,D): gradients w.r.t. the encoders' outputs (consumed). */
enum qc_status qcnet_decoder_backward(struct qc_qcnet *m, const float *dloc_p,
                                      const float *dscale_p, const float *dloc_r,
                                      const float *dscale_r, const float *dpi, float *dx_pl,
                                      float *dx_a);
enum qc_status qcnet_agent_backward(struct qc_qcnet *m, float *dx_a, float *dx_pl);
enum qc_status qcnet_map_backward(struct qc_qcnet *m, float *dx_pl);

// ---- qcnet_entry.c: the tape's entries as a table --------------------------------------------

/* A new entry (kind, block, name) at the end of the tape; its index. block may be NULL (EDGES,
 * GRU); occ counts the earlier entries of the same (kind, block). */
int qcnet_entry_add(struct qc_qcnet *m, enum qcnet_kind kind, const void *block, const char *name);
/* The index of the entry (kind, block, occ); asserts it is on the tape. */
int qcnet_entry_find(const struct qc_qcnet *m, enum qcnet_kind kind, const void *block, int occ);
/* The index of the EDGES entry of edge set s; asserts it is on the tape. */
int qcnet_entry_find_edges(const struct qc_qcnet *m, int s);
/* The stash tables of entry n (up to 3: a self-attention's kv then its own; an edge context's
 * FE stash then r) and the tags their arenas were bound under; the count. */
int qcnet_entry_stashes(struct qc_qcnet *m, int n, struct qc_stash *st[3], char tag[3][160]);
/* Tape entries whose stash entry n's backward reads (its own, its layer's source context, the
 * edge context whose r an unfused source context or a fused application with the shared r
 * reads); the count (<= 3). */
int qcnet_entry_needs(const struct qc_qcnet *m, int n, int out[3]);

// ---- qcnet_recompute.c ----------------------------------------------------------------------

/* Recompute: binds fresh memory to entry n's stash tables (not counted in bytes_stash) and runs
 * its forward again into a temporary output; its inputs must be resident. */
enum qc_status qcnet_entry_redo(struct qc_qcnet *m, int n);
/* out (N,D) = Σ_j table_j[idx_j] of cat (stack + sum order: ascending j): an FE entry's
 * categorical embeddings, in its forward (qcnet_tape.c) and its recompute. */
enum qc_status qcnet_cat_sum(struct qc_qcnet *m, float *out, const struct qcnet_cat *cat,
                             int64_t N);

// ---- qcnet_tape.c: the block applications ---------------------------------------------------

/* Checks the tape's invariants (qcnet_internal.h); QC_ERR_INVALID naming the first violation. */
enum qc_status qcnet_tape_check(const struct qc_qcnet *m);

/* FE / MLP forward as a new entry (named tag) with a fresh stash (tag "<tag>/stash"); *out
 * allocated (N, D|O) ("<tag>/out"). c / x stay the caller's until backward; the FE's
 * categorical embeddings (cat, NULL = none) are summed into a temporary of the entry. */
enum qc_status qcnet_fe_forward(struct qc_qcnet *m, const struct qc_fourier *fe, const char *tag,
                                const float *c, const struct qcnet_cat *cat, int64_t N,
                                float **out);
enum qc_status qcnet_mlp_forward(struct qc_qcnet *m, const struct qc_mlp *mlp, const char *tag,
                                 const float *x, int64_t N, float **out);
/* Their backward (qc_fourier_backward / qc_mlp_backward of the entry); frees the stash. An FE
 * block or MLP head runs occ-th for the occ-th time (the encoders' FE blocks once, y_emb once
 * per refinement chunk). */
enum qc_status qcnet_fe_backward(struct qc_qcnet *m, const struct qc_fourier *fe, int occ,
                                 float *dc, float *dcat, const float *dout);
enum qc_status qcnet_mlp_backward(struct qc_qcnet *m, const struct qc_mlp *mlp, int occ, float *dx,
                                  const float *dout);

/* Edge context of set (qc_edge_set) on the tape's graph view as a new entry: init, stash
 * memory, forward. fe == NULL for m2m. */
enum qc_status qcnet_edges_setup(struct qc_qcnet *m, int set, const struct qc_fourier *fe,
                                 const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                 float *dcat_table);
/* Edge backward (FE gradients) of set, after every layer on it; frees its stashes. */
enum qc_status qcnet_edges_backward(struct qc_qcnet *m, int set);
/* A bipartite layer's source/edge context as a new KV entry (*entry): init on edge set `set`,
 * stash memory, forward over x_src (kept by the caller until backward). */
enum qc_status qcnet_kv_setup(struct qc_qcnet *m, const struct qcnet_layer *layer, int set,
                              const float *x_src, int *entry);
/* kv backward of layer's KV entry (dx_src ACCUM) after all of its applications; frees it. */
enum qc_status qcnet_kv_backward(struct qc_qcnet *m, const struct qcnet_layer *layer,
                                 float *dx_src);
/* Eval: frees layer's KV entry once its applications ran. */
void qcnet_kv_drop(struct qc_qcnet *m, const struct qcnet_layer *layer);

/* One application of layer to x_dst (n_dst,D) on the KV entry kv, as a new ATTN entry; *out
 * is its output (n_dst,D). */
enum qc_status qcnet_attn_apply(struct qc_qcnet *m, const struct qcnet_layer *layer, int kv,
                                const float *x_dst, float **out);
/* Self-attention on edge set `set` over x (n,D): the entry carries its own kv. */
enum qc_status qcnet_attn_self(struct qc_qcnet *m, const struct qcnet_layer *layer, int set,
                               const float *x, float **out);
/* Backward of layer's occ-th application: dx_dst (n_dst,D) OVERWRITE from dout; for a
 * self-attention application also adds the kv's source gradient into dx_dst (and runs kv
 * backward). Frees the application's stash. */
enum qc_status qcnet_attn_backward(struct qc_qcnet *m, const struct qcnet_layer *layer, int occ,
                                   float *dx_dst, const float *dout);

/* The refinement chunks (qcnet_decoder.c): y_emb and the trajectory GRU run as one application
 * each per chunk of qcnet_refine_rows(KA) (agent, mode) sequences: QCNET_REFINE_ROWS, or more
 * when that would make more than QCNET_REFINE_CHUNKS chunks. A function of the batch only, so
 * the bits do not depend on the budget or the plan. */
#define QCNET_REFINE_ROWS   128
#define QCNET_REFINE_CHUNKS 32
static inline int64_t qcnet_refine_rows(int64_t KA)
{
    const int64_t r = (KA + QCNET_REFINE_CHUNKS - 1) / QCNET_REFINE_CHUNKS;
    return r > QCNET_REFINE_ROWS ? r : QCNET_REFINE_ROWS;
}
/* The GRU's block identity on the tape (it has no block struct: its parameters are offsets). */
#define QCNET_GRU_BLOCK(m) ((const void *)&(m)->o_gru_wih)

/* The trajectory GRU over x (L,N,D), time-major, from h0 = traj_emb_h0, as a new entry (named
 * tag) whose stash holds hs (L+1,N,D) and gates (L,N,4D); last (N,D) receives a copy of the
 * final state. x is allocated by the caller (qcnet_falloc) and handed over: the entry's
 * backward frees it. */
enum qc_status qcnet_gru_forward(struct qc_qcnet *m, float *x, int64_t L, int64_t N,
                                 const char *tag, float *last);
/* The backward of the occ-th GRU application: dx (L,N,D) OVERWRITE, dh0 (N,D) OVERWRITE, GRU
 * parameter gradients ACCUM, from dh_last (N,D); frees the stash and the input. */
enum qc_status qcnet_gru_backward(struct qc_qcnet *m, int occ, int64_t L, float *dx, float *dh0,
                                  const float *dh_last);

/* Frees every entry's contexts and stashes and every edge context. */
void qcnet_tape_free_contexts(struct qc_qcnet *m);

// ---- qcnet_policy.c: the stash policies of a step ------------------------------------------

struct qcnet_plan; /* qcnet_policy.c */
/* After entry n's forward: offloads or drops the stashes whose last forward use it was. */
enum qc_status qcnet_policy_after_forward(struct qc_qcnet *m, int n);
/* Before entry n's backward: every stash it reads is resident (fetched or recomputed), and the
 * next offloaded stashes of the backward order are being fetched within the window. */
enum qc_status qcnet_policy_before_backward(struct qc_qcnet *m, int n);
/* Forgets the step's offload handles (release, and failed steps). */
void qcnet_policy_release(struct qc_qcnet *m);

// ---- qcnet_loss.c ---------------------------------------------------------------------------

/* The batch's targets (A,S,4): batch->target or computed into the tape. */
enum qc_status qcnet_targets(struct qc_qcnet *m);
/* Gradients of dloss_scale · loss w.r.t. the outputs, each OVERWRITE: dloc_p, dscale_p,
 * dloc_r, dscale_r (A,K,S,2), dpi (A,K). */
enum qc_status qcnet_loss_backward(struct qc_qcnet *m, float dloss_scale, float *dloc_p,
                                   float *dscale_p, float *dloc_r, float *dscale_r, float *dpi);

#endif /* QC_MODEL_QCNET_INTERNAL_H */
