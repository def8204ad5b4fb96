/*
 * qc_attention.h — QCNet's AttentionLayer (QCNET.md §3.3) in two implementations behind one
 * interface: UNFUSED (materialises the per-edge tensors as PyTorch does: r, r̂, k̃, ṽ, q_i, α;
 * the reference) and FUSED (keeps only the raw per-edge features and per-destination softmax
 * statistics and recomputes the per-edge work in tiles, forward and backward; QCNET.md §8.8).
 *
 * Three objects, so that whatever serves several layers or applications is computed once:
 *
 *   struct qc_attn_graph   the edge set: base edges as CSR by base destination, each with its
 *                          source row; Q queries per base destination (the decoder's K modes
 *                          share every base edge, §8.8 "mode redundancy"). Source rows may be
 *                          de-duplicated by the caller (pl2a: polygon p = src mod P, §8.8
 *                          "polygon time-broadcast").
 *   struct qc_attn_edges   the edge context of one edge set in one forward pass: the positional
 *                          embedding FE(d) of the raw edge features (+ an optional categorical
 *                          table, the pl2pl edge type). UNFUSED computes r = FE(feat) once and
 *                          shares it with every layer on the set; FUSED keeps only feat.
 *   struct qc_attn_kv      the source/edge context of one layer on one edge set: LN_src, k, v
 *                          per source row, and (UNFUSED) r̂ = LN_r(r), k̃ = k[src] + r̂·W_krᵀ,
 *                          ṽ = v[src] + r̂·W_vrᵀ + b_vr per base edge. Computed once and used by
 *                          every application of the layer on the same sources (the decoder's 3
 *                          recurrent proposal steps, §8.8 "recurrence redundancy").
 *   application            qc_attn_forward / qc_attn_backward: one set of queries x_dst.
 *
 * Order of calls for one training step:
 *   edges_forward; kv_forward (per layer); forward (per application)
 *   … loss …
 *   backward (per application, reverse order); kv_backward (per layer, after all of its
 *   applications); edges_backward (after every layer on the set).
 *
 * Attention edges. Query k of base destination b is x_dst row query_row[b*Q + k]; it receives
 * the base edges row_ptr[b] .. row_ptr[b+1]-1 in that order (the official per-destination
 * order). Attention edge (k, e) has id k*E + e (E base edges), and its attention-dropout
 * element of head h is element (k, e, h) of site ctx->site, a (Q, E, H) site keyed by
 * ctx->edge_key (Philox index s·2^34 + (l_e·Q + k)·H + h, l_e the rank of e among its scene s's
 * base edges; (k*E + e)*H + h without keys). FFN dropout uses site ctx->site + 1, element
 * (row, j) of a (1, n_dst, FF) site keyed by ctx->row_key (row*FF + j without keys). x_dst rows
 * that no query names (or queries with no edges) get u = 0 and still run the gate, out projection
 * and FFN (QCNET.md §9.2).
 *
 * Self-attention (bipartite = false): the caller passes the same x to kv_forward (as x_src)
 * and forward (as x_dst). One LayerNorm (attn_prenorm_x_src) serves both sides; the input
 * gradient is the sum of the application's dx_dst and the kv's dx_src (kv_backward with
 * accum = true adds into the application's dx_dst).
 *
 * Gradients: parameter gradients (layer->dw, fe->dw, dcat_table) ACCUMULATE; activation
 * gradients (dx_dst, dx_src) OVERWRITE unless stated. Reductions follow fixed orders (CSR,
 * ascending edge, ascending mode), so results are deterministic for a fixed thread count.
 *
 * Backends (kernels/qc_exec.h). A layer runs its ops on the backend of its mem
 * (qc_block_exec(&layer->mem)), an edge context on that of its own mem, and the FourierEmbedding
 * on that of fe->mem; all three must name the same backend. On a device backend (CUDA, EMU)
 * every tensor argument (x, out, gradients, feat, cat_*, stash memory, parameters) and the
 * graph's three index arrays are device memory, and the graph must carry host mirrors of its
 * index arrays (row_ptr_host, src_host, query_row_host): the host side of the layers (graph
 * check, CSR builds, the tile plan) reads only those and uploads what it derives (through the
 * hook). EMU gives the CPU's bits; CUDA agrees with the CPU within tolerance (both checked by
 * tests/test_attn_device.c). FUSED runs its edge part as one op, qc_op_attn_fused_forward /
 * _backward (kernels/qc_attn_fused.h), with tiles of tile_edges base edges on CPU/EMU and of
 * tile_edges_cuda on CUDA.
 */
#ifndef QC_MODEL_QC_ATTENTION_H
#define QC_MODEL_QC_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_fourier.h"
#include "qc_memspec.h"
#include "qc_stash.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum qc_attn_impl { QC_ATTN_UNFUSED = 0, QC_ATTN_FUSED };

/* Where the FUSED layers of a positional edge set get its relative embeddings r = FE(feat [+
 * cat]) and where dL/dr goes (qc_attn_edges_set_mode; UNFUSED always materialises r with the FE's
 * stash):
 *   MATERIALISED  the edge context computes r (E,D) once per step in tiles (no FE tensor kept)
 *                 and keeps it as its stash, read by every application on the set; the
 *                 applications' backward sum dL/dr (E,D), from which the edge backward runs the
 *                 FE backward once. Fast: one FE forward, one recompute and one backward per set.
 *                 CPU and EMU only (the CUDA fused launchers compute r in their tiles).
 *   TILED         no tensor of E rows: every attention tile computes its r tile (FE of its
 *                 edges) in forward and again in backward, where it pushes its dL/dr tile
 *                 straight back through the FE, accumulating the FE's (and the categorical
 *                 table's) gradients. Small: costs an FE forward per application forward and an
 *                 FE forward + backward per application backward. Every backend.
 *   AUTO          the backend's default: MATERIALISED on CPU and EMU, TILED on CUDA.
 * Both run the same op sequence per row to compute r, over different groups of rows: the
 * materialised FE in fixed chunks of QC_ATTN_FUSED_TILE_EDGES_CPU rows (kept as it was, so a
 * materialised run has the bits it always had), a tiled layer per attention tile (whole CSR
 * rows). With the CPU's OpenBLAS a row's result does not depend on its group, so both give the
 * same r bits and so the same forward and every gradient but the FE's and the categorical
 * table's, which differ in summation order only ((Σ_layers dr)·x against Σ_layers (dr·x)):
 * tests/test_edge_mode.c asserts the bit-identical part, so a BLAS for which a row's bits
 * depend on the GEMM's row count fails it there. */
enum qc_attn_edge_mode { QC_ATTN_EDGE_AUTO = 0, QC_ATTN_EDGE_MATERIALISED, QC_ATTN_EDGE_TILED };

/* "auto", "materialised", "tiled" ("?" out of range). */
const char *qc_attn_edge_mode_str(enum qc_attn_edge_mode mode);

struct qc_attn_fused_tiles; /* kernels/qc_attn_fused.h */

/* Default tile of the CUDA fused path (= QC_ATTN_FUSED_TILE_EDGES_CUDA of
 * kernels/qc_attn_fused.h). The CPU's 512 edges would cut a batch into hundreds of tiles
 * of a few small GEMMs and kernel launches each; 8192 keeps the scratch near 110 MB at D 128,
 * d 4 (backward) while every launch has work for the whole device. */
#define QC_ATTN_CUDA_TILE_EDGES 8192

/* ---- the layer (parameters) ------------------------------------------------------------- */

struct qc_attn {
    int64_t D, H, Dh, FF; /* hidden, heads, per-head width (H*Dh = D), FFN width (4D) */
    bool bipartite;       /* separate LN for x_dst (attn_prenorm_x_dst) */
    bool has_pos;         /* positional r with LN_r, to_k_r, to_v_r */
    float scale;          /* Dh^-0.5 (0.25 for Dh = 16) */
    struct qc_param_table params;
    /* element offsets (-1 when absent); Linear weights are (out, in) */
    int64_t o_wq, o_bq, o_wk, o_wv, o_bv, o_wkr, o_wvr, o_bvr, o_ws, o_bs, o_wg, o_bg, o_wo, o_bo;
    int64_t o_ff0w, o_ff0b, o_ff3w, o_ff3b;
    int64_t o_ln_src_w, o_ln_src_b, o_ln_dst_w, o_ln_dst_b, o_ln_r_w, o_ln_r_b;
    int64_t o_ln_post_w, o_ln_post_b, o_ln_ffpre_w, o_ln_ffpre_b, o_ln_ffpost_w, o_ln_ffpost_b;
    const float *w;          /* parameters (params.numel), bound by the caller */
    float *dw;               /* gradients, same layout; ACCUMULATED */
    int64_t tile_edges;      /* FUSED on CPU/EMU: minimum base edges per tile (whole rows per
                                tile), 512: one OpenMP thread's working set */
    int64_t tile_edges_cuda; /* FUSED on CUDA: the same for the device launchers,
                                QC_ATTN_CUDA_TILE_EDGES (<= 0: that default) */
    int64_t post_rows;       /* destination rows per chunk of the node-level half (steps
                                9–13); <= 0: attn_post_rows(D, FF), at most 16 MiB of backward
                                scratch (blocks_internal.h). Tests set small ones */
    struct qc_block_mem mem; /* backend of the layer's ops, hook of its scratch, tiles and kv
                                gradient buffers (dk, dv, dkt, dvt); zero after init = malloc,
                                CPU */
};

/* Builds the parameter table (state_dict suffixes and order of QCNET.md §2.1; for a
 * self-attention layer attn_prenorm_x_dst is an alias of attn_prenorm_x_src and is not listed). */
void qc_attn_init(struct qc_attn *l, int64_t D, int64_t H, bool bipartite, bool has_pos);
void qc_attn_bind(struct qc_attn *l, const float *w, float *dw);

/* ---- the edge set ----------------------------------------------------------------------- */

struct qc_attn_graph {
    int64_t n_src;            /* rows of x_src */
    int64_t n_dst;            /* rows of x_dst */
    int64_t n_bdst;           /* base destinations */
    int64_t n_query;          /* Q >= 1 queries per base destination */
    int64_t n_edge;           /* base edges E = row_ptr[n_bdst] */
    const int64_t *row_ptr;   /* (n_bdst+1) CSR over base destinations */
    const int64_t *src;       /* (E) source row of each base edge, in [0, n_src) */
    const int64_t *query_row; /* (n_bdst*Q) x_dst row of query (b,k); NULL = b*Q + k */
    /* Host copies of the three arrays above, for the host side of the layers (graph checks,
     * the fused tile plan, CSR builds). NULL = the arrays above are host memory (CPU backend);
     * on a device backend (qc_exec_is_device) the caller must set row_ptr_host and src_host,
     * and query_row_host iff query_row != NULL. */
    const int64_t *row_ptr_host, *src_host, *query_row_host;
};

/* Checks the graph (sizes, monotone row_ptr, indices in range, no x_dst row named twice) on
 * its host copies (the *_host mirrors where set, else the arrays themselves).
 * QC_ERR_INVALID with the offending index on failure. */
enum qc_status qc_attn_graph_check(const struct qc_attn_graph *g);

/* ---- the edge context ------------------------------------------------------------------- */

struct qc_attn_edges {
    enum qc_attn_impl impl;
    const struct qc_attn_graph *g;
    const struct qc_fourier *fe; /* FE(d) of the edge features; NULL = no positional input */
    const float *feat;           /* (E,d) raw relative features; caller-owned until backward */
    const float *cat_table; /* (ncat,D) categorical table added before FE's output LN, or NULL */
    const int64_t *cat_idx; /* (E) categories in [0,ncat) */
    int64_t ncat;
    float *dcat_table; /* (ncat,D) ACCUM, may be NULL */
    /* owned; index arrays are built on the host from the graph's host copies and uploaded */
    int64_t *bdst;            /* (E) base destination of each base edge (CSR segment array) */
    int64_t *qindex;          /* UNFUSED: (Q*n_bdst + n_dst + E + 1) the query index arrays of
                                 attn_edges_query_index (blocks_internal.h) */
    int64_t *by_src;          /* (n_src + 1 + E) ptr then perm of the base edges grouped by
                                 source (qc_csr_build_cpu order), built by the first backward
                                 that needs it; NULL until then */
    struct qc_stash fe_stash; /* UNFUSED: FE's stash over E rows (empty when FUSED) */
    struct qc_stash stash;    /* "r" (E,D): UNFUSED, and FUSED where the layers share it
                                 (attn_edges_shares_r); else empty */
    float *dr;                /* (E,D) dL/dr summed over layers (UNFUSED, FUSED with shared r),
                                 live during backward */
    struct qc_attn_fused_tiles *tiles; /* FUSED: the tile plan over row_ptr (host), made by the
                                          first call that needs it, for tiles_edges */
    int64_t tiles_edges;
    enum qc_attn_edge_mode mode; /* FUSED with an FE: MATERIALISED (attn_edges_shares_r) or
                                    TILED, resolved by qc_attn_edges_set_mode; else AUTO */
    struct qc_block_mem mem;     /* hook and backend of the arrays above and the edge scratch */
};

/* The passes of a block call whose memory a spec describes (qc_attn_*_memspec). */
enum qc_attn_pass { QC_ATTN_PASS_INIT = 0, QC_ATTN_PASS_FORWARD, QC_ATTN_PASS_BACKWARD };

/* Sets up the context without building anything: the fields, the argument checks and the stash
 * tables (bind them before edges_forward). No allocation, no host work over the graph: the
 * planner's dry run uses it with the INIT spec replayed (qc_attn_edges_memspec).
 * QC_ERR_INVALID. */
enum qc_status qc_attn_edges_setup(struct qc_attn_edges *ed, const struct qc_block_mem *mem,
                                   enum qc_attn_impl impl, const struct qc_attn_graph *g,
                                   const struct qc_fourier *fe, const float *feat,
                                   const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                   float *dcat_table);
/* Chooses the edge mode of a context set up (qc_attn_edges_setup / _init*) and not yet bound
 * or run: AUTO resolves to the backend's default (qc_exec_target_of, so a dry run for CUDA
 * resolves as CUDA); the stash table then holds r (MATERIALISED) or nothing (TILED). A context
 * without an FE, or UNFUSED with MATERIALISED or AUTO, is unchanged. QC_ERR_UNSUPPORTED: TILED
 * with UNFUSED, MATERIALISED on CUDA (the message names the context and the fix). */
enum qc_status qc_attn_edges_set_mode(struct qc_attn_edges *ed, enum qc_attn_edge_mode mode);
/* The memory spec (qc_memspec.h) of the context's INIT (its index arrays, kept until deinit),
 * FORWARD (UNFUSED: r = FE(feat [+ cat]); FUSED with shared r: the tiled FE) or BACKWARD (the FE
 * backward from dL/dr, which it frees) in the context's present state. */
void qc_attn_edges_memspec(struct qc_attn_edges *ed, enum qc_attn_pass pass, struct qc_memspec *s);
/* Sets up the context (qc_attn_edges_setup), checks the graph and builds its index arrays.
 * fe, feat, cat_*: as above; fe == NULL for layers without positional input.
 * QC_ERR_NOMEM / QC_ERR_INVALID. */
enum qc_status qc_attn_edges_init(struct qc_attn_edges *ed, enum qc_attn_impl impl,
                                  const struct qc_attn_graph *g, const struct qc_fourier *fe,
                                  const float *feat, const float *cat_table, const int64_t *cat_idx,
                                  int64_t ncat, float *dcat_table);
/* The same with the context's memory (index arrays, dr, scratch) and backend from mem (NULL =
 * malloc, CPU). On a device backend the graph must carry its host mirrors (an assertion). */
enum qc_status qc_attn_edges_init_mem(struct qc_attn_edges *ed, const struct qc_block_mem *mem,
                                      enum qc_attn_impl impl, const struct qc_attn_graph *g,
                                      const struct qc_fourier *fe, const float *feat,
                                      const float *cat_table, const int64_t *cat_idx, int64_t ncat,
                                      float *dcat_table);
void qc_attn_edges_deinit(struct qc_attn_edges *ed);
/* UNFUSED: r = FE(feat [+ cat]) into the stash. FUSED: nothing. */
enum qc_status qc_attn_edges_forward(struct qc_attn_edges *ed);
/* UNFUSED: FE backward from the accumulated dr (fe->dw, dcat_table ACCUM). FUSED: nothing (the
 * FE gradients were accumulated by each application's backward). */
enum qc_status qc_attn_edges_backward(struct qc_attn_edges *ed);

/* ---- the source/edge context of one layer ----------------------------------------------- */

struct qc_attn_kv {
    const struct qc_attn *l;
    struct qc_attn_edges *ed;
    struct qc_stash stash; /* see qc_attn_kv_init */
    /* gradients accumulated by the applications' backward, freed by kv_backward */
    float *dk, *dv;   /* FUSED: (n_src,D) */
    float *dkt, *dvt; /* UNFUSED: (E,D) dL/dk̃, dL/dṽ */
};

/* Plans the stash: x̂_s and LN_src statistics (n_src rows), plus
 * FUSED: k, v (n_src,D);  UNFUSED: r̂ and LN_r statistics, k̃, ṽ (E rows each).
 * Bind kv->stash before kv_forward. */
void qc_attn_kv_init(struct qc_attn_kv *kv, const struct qc_attn *l, struct qc_attn_edges *ed);
void qc_attn_kv_deinit(struct qc_attn_kv *kv);
/* The memory spec of kv_forward (backward = false) or kv_backward in kv's present state. */
void qc_attn_kv_memspec(struct qc_attn_kv *kv, bool backward, struct qc_memspec *s);
/* x_src (n_src,D), caller-owned until kv_backward. */
enum qc_status qc_attn_kv_forward(struct qc_attn_kv *kv, const float *x_src);
/* dx_src (n_src,D): OVERWRITE, or ACCUM when accum (self-attention). x_src as in forward.
 * Call once, after every application's backward. UNFUSED: adds dL/dr into ed->dr. */
enum qc_status qc_attn_kv_backward(struct qc_attn_kv *kv, float *dx_src, const float *x_src,
                                   bool accum);

/* ---- one application -------------------------------------------------------------------- */

/* Dropout keying of one application (qc_philox.h; struct qc_dropout in qc_kernels.h). With the
 * keys, the mask of a scene's elements depends only on the scene (the model passes each row's
 * dataset scene index and rank within its scene); NULL keys give flat indices. */
struct qc_attn_ctx {
    bool training;           /* dropout on */
    float dropout;           /* p (0.1) */
    uint64_t seed;           /* run seed */
    uint32_t step;           /* optimizer step */
    uint32_t site;           /* attention-dropout site; the FFN uses site + 1 */
    const int64_t *edge_key; /* (E) scene key of each base edge (memory of the layer's backend:
                                s·2^34 + its rank among the base edges of scene s), or NULL */
    const int64_t *row_key; /* (n_dst) scene key of each x_dst row (rank among s's rows), or NULL */
};

/* Plans the application's stash (node-level tensors for both implementations; UNFUSED adds
 * q_i (Q*E,D) and α (Q*E,H); FUSED adds q (n_dst,D) and the softmax max and sum (n_dst,H)). */
void qc_attn_stash_plan(const struct qc_attn_kv *kv, struct qc_stash *st);
/* The memory spec of one application's forward (backward = false) or backward on kv, in the
 * present state of kv and its edge context (the first backward makes their gradient buffers). */
void qc_attn_memspec(struct qc_attn_kv *kv, bool backward, struct qc_memspec *s);
/* out (n_dst,D) OVERWRITE; st planned and bound, filled; x_dst (n_dst,D) caller-owned until
 * backward. Re-running with the same inputs and ctx reproduces out and st bit for bit. */
enum qc_status qc_attn_forward(const struct qc_attn_kv *kv, float *out, struct qc_stash *st,
                               const float *x_dst, const struct qc_attn_ctx *ctx);
/* dx_dst (n_dst,D) OVERWRITE; layer->dw ACCUM; the source/edge gradients accumulate in kv
 * (and, FUSED, into fe->dw and ed->dcat_table). dout (n_dst,D). st, x_dst, ctx as in forward. */
enum qc_status qc_attn_backward(struct qc_attn_kv *kv, float *dx_dst, const float *dout,
                                const struct qc_stash *st, const float *x_dst,
                                const struct qc_attn_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif /* QC_MODEL_QC_ATTENTION_H */
