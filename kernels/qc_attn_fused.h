/*
 * qc_attn_fused.h — the fused edge attention of QCNet's AttentionLayer (QCNET.md §3.3 steps 2
 * and 4–8, §8.8 "fused edge attention") as one op on any backend: no per-edge hidden tensor
 * outlives a tile.
 *
 * Per attention edge set (base edges as CSR by base destination, Q queries per base
 * destination; src/model/qc_attention.h has the whole contract):
 *   r  = FE(feat [+ cat])   per base edge (qc_fourier_embed.h)
 *   r̂  = LN_r(r);  k̃ = k[src] + r̂·W_krᵀ;  ṽ = v[src] + r̂·W_vrᵀ + b_vr   (has_pos; else k[src],
 *                                                                       v[src])
 *   s  = (q_i·k̃)·scale per head;  M = max s;  S = Σ exp(s − M) + 1e-16;  α = exp(s − M)/S
 *   u_i = Σ_e dropout(α)·ṽ   (dropout element (k·E + e)·H + h of the site, as the unfused path)
 * and the backward of all of it: dq, dk and dv per source row, and the parameter gradients of
 * to_k_r, to_v_r, attn_prenorm_r, the FourierEmbedding and the categorical table. Kept between
 * forward and backward (by the caller): q and the softmax statistics M, S per query row.
 *
 * Tiles (qc_attn_fused_tiles_init): base destinations are cut into tiles of whole CSR rows
 * holding at least tile_edges base edges, so every softmax row is complete inside its tile.
 * For a tile, r, r̂, k̃, ṽ are computed once for its base edges and serve all Q queries of each
 * base destination (the decoder's modes). Backward recomputes the tile (same ops, same shapes:
 * the same bits), then runs the row backward and the tile's edge backward.
 *
 * Shared r (CPU, EMU): the caller computes r = FE(feat [+ cat]) once per edge set
 * (qc_op_fe_forward_tiled, no FE tensor kept) and passes it to every layer on the set; the
 * tiles start from r̂ = LN_r(r) and the backward accumulates dr, from which the caller runs the
 * FE backward once (qc_op_fe_backward_tiled). The FE then costs one forward, one recompute and
 * one backward per edge set instead of two forwards and one backward per layer application;
 * r costs E·D floats, kept from forward to backward. The CUDA launchers compute the FE in every
 * tile instead (qc_attn_fused_takes_r is false there).
 *
 * Backends:
 * - CPU (and EMU, with the emulated device open for the whole call): qc_attn_fused_*_cpu,
 *   kernels/cpu/attn_fused.c. Tiles are spread over OpenMP threads, one parallel region per
 *   pass; inside a tile the sub-ops run on the calling thread (nested OpenMP off, OpenBLAS set
 *   to one thread for the call). Forward tiles write disjoint query rows. Backward tile t goes
 *   to the gradient lane t mod threads (private dk, dv, parameter and table gradients), and the
 *   lanes are summed in lane order at the end: bit-reproducible for a given thread count.
 * - CUDA: the launchers of qc_attn_fused_cuda.h (same stash, same dropout keying, the CPU path
 *   as their oracle), dispatched by kernels/attn_fused.c with the descriptors below as given.
 *
 * Scratch: the op never allocates; the caller passes qc_attn_fused_scratch_numel floats of the
 * backend's memory. CPU: per thread one tile's buffers (r̂, k̃, ṽ and, in backward, their
 * gradients) plus, in backward, one gradient lane (2·n_src·D + the parameter slices); about
 * threads × (cap × 6·D·4 bytes + lane). CUDA: O(cap × D).
 */
#ifndef QC_KERNELS_QC_ATTN_FUSED_H
#define QC_KERNELS_QC_ATTN_FUSED_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_fourier_embed.h"
#include "qc_kernels.h" /* struct qc_csr, struct qc_dropout */
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_exec;

#define QC_ATTN_FUSED_TILE_EDGES_CPU 512 /* one OpenMP thread's working set */
#define QC_ATTN_FUSED_TILE_EDGES_CUDA                                                              \
    8192 /* the CUDA launchers' tile: every launch fills the GPU */

/* ---- tiles (host plan) ------------------------------------------------------------------ */

/* Tile t covers base destinations [b0[t], b0[t+1]) and base edges [e0[t], e0[t+1]),
 * e0[t] = row_ptr[b0[t]]. Every tile but the last holds at least tile_edges edges (a row is
 * never split). Invariants: b0[0] = 0, b0[ntile] = n_bdst, e0[ntile] = E,
 * cap = max_t (e0[t+1] − e0[t]), max_deg = the largest row. */
struct qc_attn_fused_tiles {
    int64_t ntile;   /* tiles (0 when n_bdst = 0) */
    int64_t *b0;     /* host (ntile+1) first base destination of each tile */
    int64_t *e0;     /* host (ntile+1) first base edge of each tile */
    int64_t cap;     /* most base edges in one tile: sizes the scratch */
    int64_t max_deg; /* most base edges of one base destination */
};

/* Plans the tiles from a HOST copy of the CSR (row_ptr (n_bdst+1), checked monotone).
 * tile_edges < 1 counts as 1. QC_ERR_NOMEM, QC_ERR_INVALID (bad row_ptr, with the index).
 * t is written only on QC_OK; release with _deinit. */
enum qc_status qc_attn_fused_tiles_init(struct qc_attn_fused_tiles *t, const int64_t *row_ptr,
                                        int64_t n_bdst, int64_t tile_edges);
/* Frees the arrays and zeroes t. NULL and zeroed structs are no-ops. */
void qc_attn_fused_tiles_deinit(struct qc_attn_fused_tiles *t);

/* ---- descriptors -------------------------------------------------------------------------- */
/* Every backend takes these (qc_attn_fused_cuda.h says which fields CUDA reads). */

/* The slice of one AttentionLayer the edge part reads (backend pointers into the layer's
 * parameter and gradient buffers; Linear weights are (out, in)). */
struct qc_attn_fused_layer {
    int64_t D, H, Dh;                /* hidden, heads, per-head width: H·Dh = D (CUDA: Dh <= 32) */
    float scale;                     /* Dh^-0.5 */
    bool has_pos;                    /* positional r: FE, LN_r, to_k_r, to_v_r */
    const float *w_kr, *w_vr, *b_vr; /* (D,D), (D,D), (D); has_pos only */
    const float *ln_r_w, *ln_r_b;    /* (D), (D); has_pos only */
    float *dw_kr, *dw_vr, *db_vr;    /* ACCUM; backward with has_pos */
    float *dln_r_w, *dln_r_b;        /* ACCUM; backward with has_pos */
};

/* One edge set (backend pointers unless "host"). */
struct qc_attn_fused_edges {
    int64_t n_src;            /* rows of k, v */
    int64_t n_dst;            /* rows of q, u, M, S */
    int64_t n_bdst;           /* base destinations */
    int64_t n_query;          /* Q >= 1 queries per base destination */
    int64_t n_edge;           /* base edges E = row_ptr[n_bdst] */
    const int64_t *row_ptr;   /* (n_bdst+1) CSR over base destinations */
    const int64_t *src;       /* (E) source row of each base edge, in [0, n_src) */
    const int64_t *query_row; /* (n_bdst·Q) x_dst row of query (b,k), distinct; NULL = b·Q+k */
    struct qc_csr by_src;     /* backward where qc_attn_fused_wants_by_src: the base edges
                                 grouped by source (qc_csr_build_cpu order); else unused */
    const float *r;           /* (E,D) the edge embeddings FE(feat [+ cat]), computed once by the
                                 caller for every layer on the set: required on CPU and EMU for
                                 a positional layer (qc_attn_fused_takes_r); NULL on CUDA, whose
                                 tiles compute them from fe, feat and cat */
    float *dr;                /* (E,D) ACCUM, backward with r: dL/dr of this layer's tiles (the
                                 FE and categorical gradients are then the caller's) */
    const struct qc_fe *fe;   /* host struct (backend buffers); NULL iff the layer has no pos;
                                 read on CUDA only (the CPU reads r) */
    const float *feat;        /* (E,d) raw relative features (d > 0) */
    const float *cat_table;   /* (ncat,D) categorical table added before FE's output LN, or NULL */
    const int64_t *cat_idx;   /* (E) categories in [0,ncat) */
    int64_t ncat;
    float *dcat_table;                       /* (ncat,D) ACCUM, may be NULL */
    const struct qc_attn_fused_tiles *tiles; /* host plan over row_ptr */
};

/* ---- the op ------------------------------------------------------------------------------- */

/* Floats of scratch one forward (backward = false) or backward call on ex needs. */
int64_t qc_attn_fused_scratch_numel(const struct qc_exec *ex, const struct qc_attn_fused_layer *l,
                                    const struct qc_attn_fused_edges *ed, bool backward);
/* True when the backward on ex reads ed->by_src (CUDA). */
bool qc_attn_fused_wants_by_src(const struct qc_exec *ex);
/* True when the op on ex takes the edge embeddings r precomputed (CPU, EMU); the CUDA launchers
 * compute them per tile. */
bool qc_attn_fused_takes_r(const struct qc_exec *ex);

/* u (n_dst,D) OVERWRITE: the aggregation (0 on rows no query names or with no edge).
 * smax, ssum (n_dst,H) OVERWRITE: M and S per query row and head (0 and 1e-16 on empty rows).
 * q (n_dst,D) queries; k, v (n_src,D) the layer's per-source keys and values. drop: attention
 * dropout (p = 0 = off). scratch: qc_attn_fused_scratch_numel(ex, l, ed, false) floats.
 * Re-running with the same inputs reproduces every output bit for bit. */
void qc_op_attn_fused_forward(const struct qc_exec *ex, float *u, float *smax, float *ssum,
                              const float *q, const float *k, const float *v,
                              const struct qc_attn_fused_layer *l,
                              const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                              float *scratch);
/* dq (n_dst,D) OVERWRITE (0 on rows no query names); dk, dv (n_src,D) ACCUM; the parameter
 * gradients in l (has_pos), ed->fe->dw and ed->dcat_table ACCUM. du (n_dst,D) the gradient of
 * u; smax, ssum, q, k, v, drop as given to (or produced by) the forward. scratch:
 * qc_attn_fused_scratch_numel(ex, l, ed, true) floats. */
void qc_op_attn_fused_backward(const struct qc_exec *ex, float *dq, float *dk, float *dv,
                               const float *du, const float *smax, const float *ssum,
                               const float *q, const float *k, const float *v,
                               const struct qc_attn_fused_layer *l,
                               const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                               float *scratch);

/* ---- the CPU backend (kernels/cpu/attn_fused.c) ------------------------------------------- */

/* Threads the CPU op runs on for this plan: min(OpenMP threads, tiles), at least 1. */
int qc_attn_fused_cpu_threads(const struct qc_attn_fused_tiles *t);
int64_t qc_attn_fused_scratch_numel_cpu(const struct qc_attn_fused_layer *l,
                                        const struct qc_attn_fused_edges *ed, bool backward);
void qc_attn_fused_forward_cpu(float *u, float *smax, float *ssum, const float *q, const float *k,
                               const float *v, const struct qc_attn_fused_layer *l,
                               const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                               float *scratch);
void qc_attn_fused_backward_cpu(float *dq, float *dk, float *dv, const float *du, const float *smax,
                                const float *ssum, const float *q, const float *k, const float *v,
                                const struct qc_attn_fused_layer *l,
                                const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                                float *scratch);

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_ATTN_FUSED_H */
