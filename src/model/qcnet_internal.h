/*
 * qcnet_internal.h — the model object behind qc_qcnet.h, shared by the qcnet_*.c files of
 * src/model (never included from outside this folder).
 *
 * Files: qcnet_config.c (config), qcnet_params.c (key table, init, safetensors, groups),
 * qcnet_model.c (create/destroy, activation memory, forward/backward orchestration),
 * qcnet_encoder.c (map and agent encoders), qcnet_decoder.c (decoder), qcnet_loss.c (loss and
 * metrics).
 *
 * Glossary.
 *   app     one application of an AttentionLayer to one set of queries (qc_attention.h); it owns
 *           its stash and remembers its input x_dst and output, which backward needs.
 *   layer   one AttentionLayer's parameters (struct qc_attn) and its source/edge contexts
 *           (struct qc_attn_kv, one per set of sources: shared by the applications that see
 *           the same sources, as the decoder's 3 recurrent proposal steps do).
 *   site    dropout site ids: application n of a forward uses sites 2n (attention weights) and
 *           2n + 1 (FFN), offset by (micro << 16), so every site of a step is unique.
 */
#ifndef QC_MODEL_QCNET_INTERNAL_H
#define QC_MODEL_QCNET_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_attention.h"
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

/* One attention application: what backward needs. */
struct qcnet_app {
    struct qc_attn_kv *kv; /* the source/edge context (owned by the layer slot or the app) */
    bool own_kv;           /* self-attention: a kv per application, freed with it */
    struct qc_stash st;    /* the application's stash (memory from the memory context) */
    const float *x_dst;    /* input rows (n_dst,D) */
    float *out;            /* output rows (n_dst,D) */
    const float *x_src;    /* self-attention: == x_dst; bipartite: the kv's sources */
    struct qc_attn_ctx ctx;
    char name[80]; /* "<layer key prefix>/app<n>" */
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
    uint32_t step, micro;
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

    /* kv contexts of bipartite layers: one per layer (sources fixed in the forward) */
    struct qc_attn_kv kv_pt2pl[QCNET_MAX_LAYERS];
    struct qc_attn_kv kv_pl2a[QCNET_MAX_LAYERS];
    struct qc_attn_kv kv_t2m_p[QCNET_MAX_LAYERS], kv_pl2m_p[QCNET_MAX_LAYERS],
        kv_a2m_p[QCNET_MAX_LAYERS];
    struct qc_attn_kv kv_t2m_r[QCNET_MAX_LAYERS], kv_pl2m_r[QCNET_MAX_LAYERS],
        kv_a2m_r[QCNET_MAX_LAYERS];
    int n_kv_init; /* for cleanup: which kv have been initialised is tracked by kv.l != NULL */

    struct qcnet_app app[QCNET_MAX_APPS];
    int n_app;
    /* application indices, by layer (and recurrent step) */
    int app_pt2pl[QCNET_MAX_LAYERS], app_pl2pl[QCNET_MAX_LAYERS];
    int app_t[QCNET_MAX_LAYERS], app_pl2a[QCNET_MAX_LAYERS], app_a2a[QCNET_MAX_LAYERS];
    int app_t2m_p[QCNET_MAX_RSTEPS][QCNET_MAX_LAYERS],
        app_pl2m_p[QCNET_MAX_RSTEPS][QCNET_MAX_LAYERS],
        app_a2m_p[QCNET_MAX_RSTEPS][QCNET_MAX_LAYERS], app_m2m_p[QCNET_MAX_RSTEPS];
    int app_t2m_r[QCNET_MAX_LAYERS], app_pl2m_r[QCNET_MAX_LAYERS], app_a2m_r[QCNET_MAX_LAYERS],
        app_m2m_r;

    /* map encoder */
    int64_t *idx_pt_type, *idx_pt_side, *idx_pl_type, *idx_pl_int; /* (Pt), (Pt), (P), (P) */
    struct qc_stash st_x_pt, st_x_pl;                              /* FE stashes */
    float *x_pt;                                                   /* (Pt,D) */
    float *x_pl0;                                                  /* (P,D) FE(0) output */
    float *x_pl;                                                   /* (P,D) encoder output */

    /* agent encoder */
    float *c_a;          /* (50A,4) agent-step features, agent-major */
    int64_t *idx_a_type; /* (50A) */
    struct qc_stash st_x_a;
    float *x_a0; /* (50A,D) FE output, agent-major */
    float *x_a;  /* (50A,D) encoder output, agent-major */

    /* decoder */
    float *xa49;                         /* (A,D) x_a[:, 49] */
    float *m0;                           /* (KA,D) mode_emb tiled, agent-major */
    float *m_prop_out[QCNET_MAX_RSTEPS]; /* m after m2m_propose of each recurrent step */
    int64_t R;                           /* recurrent steps */
    struct qc_stash st_loc_p[QCNET_MAX_RSTEPS],
        st_scale_p[QCNET_MAX_RSTEPS]; /* MLP stashes per recurrent step */
    float *lp_cat;                    /* (A,K,S*2) concatenated proposal loc increments */
    float *sp_elu;                    /* (A,K,S*2) ELU(concatenated proposal scale head) */
    float *loc_propose;               /* (A,K,S,2) */
    float *scale_propose;
    struct qc_stash st_y; /* y_emb FE(2) stash over 360A rows */
    float *y;             /* (KA,S,D) y_emb output */
    float *y_tm;          /* (S,KA,D) time-major GRU input */
    float *gru_hs;        /* (S+1,KA,D) */
    float *gru_gates;     /* (S,KA,4D) */
    float *m_ref_in;      /* (KA,D) refine queries before the layers (GRU final state) */
    float *m_ref;         /* (KA,D) after m2m_refine */
    struct qc_stash st_loc_r, st_scale_r, st_pi;
    float *head_loc_r;   /* (KA,S*2) to_loc_refine_pos output */
    float *sr_elu;       /* (KA,S*2) ELU(to_scale_refine_pos) */
    float *loc_refine;   /* (A,K,S,2) */
    float *scale_refine; /* (A,K,S,2) */
    float *pi;           /* (A,K) */

    /* loss */
    float *target_own; /* (A,S,4) when the batch had none */
    const float *target;
    uint8_t *reg_mask;  /* (A,S) */
    uint8_t *cls_mask;  /* (A) */
    int64_t *best_mode; /* (A) */
    struct qc_qcnet_loss loss;
};

struct qc_qcnet {
    struct qc_qcnet_config cfg;
    const struct qc_exec *ex; /* backend of every op (NULL = CPU); see qc_qcnet_create_on */
    int64_t D, H, F, K, R, NL_map, NL_agent, NL_dec;
    int64_t head_out; /* Tf * 2 / R: outputs of a proposal head */

    /* parameters */
    float *params,
        *grads; /* (nparams) each, from the memory context: device memory on device backends */
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
};

// ---- qcnet_params.c -----------------------------------------------------------------------

/* Builds the key table and binds every block (called by qc_qcnet_create). */
enum qc_status qcnet_params_build(struct qc_qcnet *m);
void qcnet_params_free(struct qc_qcnet *m);
/* Binds every block to m->params / m->grads (after the buffers exist). */
void qcnet_params_bind(struct qc_qcnet *m);

// ---- qcnet_model.c: activation memory ------------------------------------------------------

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
/* The batch as op arguments: tape.dbatch (asserts it is set on device backends), else the
 * host batch. */
const struct qc_batch *qcnet_op_batch(const struct qc_qcnet *m);
/* A host temporary of bytes (at least one byte) for data derived from the batch; NULL with
 * QC_ERR_NOMEM set (naming what) on failure. */
void *qcnet_host_tmp(size_t bytes, const char *what);
/* qcnet_upload of a qcnet_host_tmp buffer, which is freed either way. */
enum qc_status qcnet_upload_tmp(struct qc_qcnet *m, void *host, size_t bytes, const char *tag,
                                void **out);
/* Scalars and small results back to the host (synchronizing on device backends). */
enum qc_status qcnet_download(struct qc_qcnet *m, void *host, const void *dev, size_t bytes);

/* Gives one recorded buffer back early (NULL is a no-op). */
void qcnet_free(struct qc_qcnet *m, void *p);
/* Binds a planned stash table to memory-context memory (tag = its block label). */
enum qc_status qcnet_stash_bind(struct qc_qcnet *m, struct qc_stash *st, const char *tag);
/* Releases a stash's memory back to the memory context and empties the table. */
void qcnet_stash_free(struct qc_qcnet *m, struct qc_stash *st);

/* Runs one attention application and records it on the tape. kv must be initialised and
 * forwarded. own_kv: the app owns kv (freed with it). */
enum qc_status qcnet_attn_apply(struct qc_qcnet *m, const struct qcnet_layer *layer,
                                struct qc_attn_kv *kv, bool own_kv, const float *x_dst,
                                const float *x_src, const char *tag, float **out);
/* Self-attention: kv of its own on edge context ed, over x (n,D). */
enum qc_status qcnet_attn_self(struct qc_qcnet *m, const struct qcnet_layer *layer,
                               struct qc_attn_edges *ed, const float *x, const char *tag,
                               float **out);
/* Backward of recorded application n: dx_dst (n_dst,D) OVERWRITE from dout; for a
 * self-attention app also adds the kv's source gradient into dx_dst (and runs kv backward).
 * Frees the application's stash. */
enum qc_status qcnet_attn_app_backward(struct qc_qcnet *m, int n, float *dx_dst, const float *dout);

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

/* Edge context of set (qc_edge_set) on the tape's graph view: init, stash memory, forward.
 * fe == NULL for m2m. */
enum qc_status qcnet_edges_setup(struct qc_qcnet *m, int set, const struct qc_fourier *fe,
                                 const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                 float *dcat_table);
/* Edge backward (FE gradients) of set, after every layer on it; frees its stashes. */
enum qc_status qcnet_edges_backward(struct qc_qcnet *m, int set);
/* A bipartite layer's source/edge context: init on edge set `set`, stash memory, forward. */
enum qc_status qcnet_kv_setup(struct qc_qcnet *m, struct qc_attn_kv *kv,
                              const struct qcnet_layer *layer, int set, const float *x_src);
/* kv backward (dx_src ACCUM) after all of its applications; frees the context. */
enum qc_status qcnet_kv_backward(struct qc_qcnet *m, struct qc_attn_kv *kv, float *dx_src,
                                 const float *x_src);
/* FE / MLP forward with a fresh stash bound to memory-context memory; *out allocated (N, D|O). */
enum qc_status qcnet_fe_forward(struct qc_qcnet *m, const struct qc_fourier *fe,
                                struct qc_stash *st, const char *tag, const float *c,
                                const float *cat, int64_t N, float **out);
enum qc_status qcnet_mlp_forward(struct qc_qcnet *m, const struct qc_mlp *mlp, struct qc_stash *st,
                                 const char *tag, const float *x, int64_t N, float **out);

/* Frees an initialised edge context slot and every kv of the tape. */
void qcnet_tape_free_contexts(struct qc_qcnet *m);

// ---- qcnet_loss.c ---------------------------------------------------------------------------

/* The batch's targets (A,S,4): batch->target or computed into the tape. */
enum qc_status qcnet_targets(struct qc_qcnet *m);
/* Gradients of dloss_scale · loss w.r.t. the outputs, each OVERWRITE: dloc_p, dscale_p,
 * dloc_r, dscale_r (A,K,S,2), dpi (A,K). */
enum qc_status qcnet_loss_backward(struct qc_qcnet *m, float dloss_scale, float *dloc_p,
                                   float *dscale_p, float *dloc_r, float *dscale_r, float *dpi);

#endif /* QC_MODEL_QCNET_INTERNAL_H */
