/*
 * qc_attn_fused_cuda.h — the fused edge attention of QCNet's AttentionLayer on CUDA (QCNET.md
 * §3.3 steps 2 and 4–8, §8.8 "fused edge attention"): the edge part of the CPU fused path
 * (kernels/cpu/attn_fused.c) with the same inputs, outputs, stash and dropout keying, so the
 * CPU is its oracle.
 *
 * What it computes, per attention edge set (base edges as CSR by base destination, Q queries per
 * base destination; see src/model/qc_attention.h for the full contract):
 *   r  = FE(feat [+ cat])              per base edge (FourierEmbedding, QCNET.md §3.1)
 *   r̂  = LN_r(r);  k̃ = k[src] + r̂·W_krᵀ;  ṽ = v[src] + r̂·W_vrᵀ + b_vr    (has_pos; else k[src],
 *                                                                         v[src])
 *   s  = (q_i·k̃)·scale per head;  M = max s;  S = Σ exp(s − M) + 1e-16;  α = exp(s − M)/S
 *   u_i = Σ_e dropout(α)·ṽ            (dropout element (k·E + e)·H + h of the site)
 * and the backward of all of it: dq, dk and dv per source row, and the parameter gradients of
 * to_k_r, to_v_r, attn_prenorm_r, the FourierEmbedding and the categorical table.
 *
 * Memory: O(tile × D), never O(E × D). Base destinations are cut into tiles of whole CSR rows
 * holding at least tile_edges base edges (the CPU's rule, qc_attn_fused_tiles_init). For
 * a tile, r, r̂, k̃, ṽ and the FE intermediates are computed into the caller's scratch (sized by
 * qc_attn_fused_cuda_scratch_numel from the largest tile), GEMMs through cuBLAS; they serve all
 * Q queries of the tile's base destinations and are dropped when the next tile starts. Backward
 * recomputes the same tile bit for bit. Kept between forward and backward: q (n_dst,D) and the
 * softmax statistics M, S (n_dst,H): the CPU fused stash entries "q", "softmax.max",
 * "softmax.sum" (and "u").
 *
 * Determinism: no atomics. A softmax row never spans tiles; one thread owns one (query row,
 * head) and walks its edges in CSR order with the CPU's fp32 operation order (max, then the sum
 * of exp in ascending edge, then the weighted sum; no FMA contraction in these sums). dk̃, dṽ of
 * a base edge sum the Q queries in ascending k; dk[j], dv[j] add the edges of source j in
 * ascending edge id (walking the by-source CSR), tiles in ascending order; parameter gradients
 * accumulate tile by tile in ascending order (cuBLAS GEMMs with beta = 1, deterministic column
 * sums). Two runs with the same inputs, tiles and device model give the same bits.
 *
 * Pointers: every tensor and index array is a DEVICE pointer unless it says "host"; the
 * structs themselves are host memory read before the launcher returns (the tiles' arrays are
 * host memory read while enqueuing). Launchers are asynchronous on `stream`, never allocate or
 * synchronize, use this thread's op context (qc_kernels_cuda_set_current: cuBLAS handle and
 * reduction workspace), abort on shape errors (QC_ASSERT) and check every launch
 * (QC_CUDA_ASSERT(cudaGetLastError())).
 */
#ifndef QC_KERNELS_QC_ATTN_FUSED_CUDA_H
#define QC_KERNELS_QC_ATTN_FUSED_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime.h> /* cudaStream_t */

#include "qc_attn_fused.h" /* the descriptors: tiles, layer slice, edge set */
#include "qc_kernels.h"    /* struct qc_csr, struct qc_dropout */
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_ATTN_FUSED_CUDA_MAX_DH 32 /* per-head width bound (QCNet: 16) */

/* The tiles, the layer slice and the edge set are the descriptors of qc_attn_fused.h, as every
 * backend takes them (struct qc_attn_fused_tiles, qc_attn_fused_layer, qc_attn_fused_edges):
 * equal tile_edges give equal tiles on both backends. What CUDA reads of them:
 * - l: every field; the gradient pointers in backward only.
 * - ed: n_src, n_dst, n_bdst, n_query, n_edge, row_ptr, src, query_row, tiles; by_src in
 *   backward (nseg = n_src, nitem = E, perm ascending within a source as qc_csr_build_cpu builds
 *   it; seg unused); with a positional layer (l->has_pos, then ed->fe != NULL) fe (a host
 *   struct over DEVICE parameter buffers; fe->dw in backward), feat when fe->d > 0, cat_table,
 *   cat_idx, ncat, and dcat_table in backward. r must be NULL (the tiles compute the edge
 *   embeddings themselves, qc_attn_fused_takes_r) and dr is not read. */

/* ---- scratch ---------------------------------------------------------------------------- */

/* Device floats of scratch one forward (backward = false) or backward call needs: O(cap × D),
 * independent of E. Pass a 256-byte aligned buffer of at least this many floats. Per tile edge
 * (P = 2F+1): forward 7D + 4 + d·(P + 2D + 2) floats, backward 3D + d·P more; at D 128, d 4:
 * 9.8 KB and 13.4 KB per edge, so ~110 MB for a backward tile of 8192 edges. It is transient
 * (one tile at a time), unlike the unfused path's per-edge tensors, which live from forward to
 * backward for every edge. */
int64_t qc_attn_fused_cuda_scratch_numel(const struct qc_attn_fused_layer *l,
                                         const struct qc_attn_fused_edges *ed, bool backward);

/* ---- forward / backward ----------------------------------------------------------------- */

/* u (n_dst,D) OVERWRITE: the aggregation (0 on x_dst rows no query names or with no edge).
 * smax, ssum (n_dst,H) OVERWRITE: M and S per query row and head (0 and 1e-16 on empty rows):
 * saved for backward. q (n_dst,D) queries; k, v (n_src,D) the layer's per-source keys and
 * values. drop: attention dropout (host; NULL or p = 0 = off); element index
 * drop->index_base + (k·E + e)·H + h. scratch: qc_attn_fused_cuda_scratch_numel(l, ed, false).
 * Re-running with the same inputs reproduces every output bit for bit. */
void qc_attn_fused_forward_cuda(float *u, float *smax, float *ssum, const float *q, const float *k,
                                const float *v, const struct qc_attn_fused_layer *l,
                                const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                                float *scratch, cudaStream_t stream);

/* dq (n_dst,D) OVERWRITE (0 on rows no query names); dk, dv (n_src,D) ACCUM (several
 * applications of a layer share them); the parameter gradients in l (has_pos), ed->fe->dw and
 * ed->dcat_table ACCUM. du (n_dst,D) the gradient of u; smax, ssum, q, k, v, drop as given to
 * (or produced by) the forward. scratch: qc_attn_fused_cuda_scratch_numel(l, ed, true). */
void qc_attn_fused_backward_cuda(float *dq, float *dk, float *dv, const float *du,
                                 const float *smax, const float *ssum, const float *q,
                                 const float *k, const float *v,
                                 const struct qc_attn_fused_layer *l,
                                 const struct qc_attn_fused_edges *ed,
                                 const struct qc_dropout *drop, float *scratch,
                                 cudaStream_t stream);

/* ---- test seam: the tile kernels' bodies on the host ------------------------------------ */
/* The per-thread bodies of the row and scatter kernels are __host__ __device__ code; these run
 * them on the CPU over HOST buffers (work items in order), so their index math, dropout keying
 * and operation order can be checked against the CPU fused path bit for bit on machines
 * without a GPU. Not for production use (single-threaded).
 *
 * One tile: base destinations [b0, b0+nb) whose edges start at base edge e0; kt, vt (tile
 * edges, H*Dh) are the tile's k̃, ṽ (edge e at row e − e0). row_ptr (n_bdst+1), query_row
 * (n_bdst*Q) or NULL, E the set's base edges (dropout index), drop as for the launchers.
 * forward:  u, smax, ssum of the tile's query rows OVERWRITE.
 * backward: dq of the tile's query rows OVERWRITE; dkt, dvt ACCUM.
 * scatter:  dk[j], dv[j] (H*Dh = D wide) += dkt, dvt of source j's edges in [e0, e1),
 *           ascending edge, for each source j with an edge in the tile, found as the kernel
 *           does from the tile's edges (by_src.seg: the source of each edge, required). */
void qc_attn_fused_tile_forward_host(float *u, float *smax, float *ssum, const float *q,
                                     const float *kt, const float *vt, const int64_t *row_ptr,
                                     const int64_t *query_row, int64_t b0, int64_t nb, int64_t e0,
                                     int64_t Q, int64_t E, int64_t H, int64_t Dh, float scale,
                                     const struct qc_dropout *drop);
void qc_attn_fused_tile_backward_host(float *dq, float *dkt, float *dvt, const float *du,
                                      const float *smax, const float *ssum, const float *q,
                                      const float *kt, const float *vt, const int64_t *row_ptr,
                                      const int64_t *query_row, int64_t b0, int64_t nb, int64_t e0,
                                      int64_t Q, int64_t E, int64_t H, int64_t Dh, float scale,
                                      const struct qc_dropout *drop);
void qc_attn_fused_tile_scatter_host(float *dk, float *dv, const float *dkt, const float *dvt,
                                     struct qc_csr by_src, int64_t e0, int64_t e1, int64_t D);

#ifdef __cplusplus
}
#endif

#endif /* QC_KERNELS_QC_ATTN_FUSED_CUDA_H */
