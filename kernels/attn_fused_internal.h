/*
 * attn_fused_internal.h — what the fused attention's CUDA launchers and their host side share
 * inside kernels/: the scratch layout of one tile, as plain host arithmetic, so that the CUDA
 * launchers (kernels/cuda/attn_fused.cu) place their pieces with it and the memory planner's dry
 * run (qc_attn_fused_scratch_numel for a CUDA target, kernels/attn_fused.c) sizes the scratch
 * with the same function in every build, CUDA or not.
 */
#ifndef QC_KERNELS_ATTN_FUSED_INTERNAL_H
#define QC_KERNELS_ATTN_FUSED_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#define QC_ATTN_FUSED_LAYOUT_ALIGN 64 /* floats: scratch pieces start on 256-byte boundaries */
#define QC_ATTN_FUSED_LAYOUT_MAX_D 8  /* continuous FE inputs (QC_FE_MAX_D) */

/* Offsets (floats) of every scratch piece of one tile; -1 when absent. total = the floats. */
struct qc_attn_fused_layout {
    int64_t kt, vt, r, rhat, tmp, rmean, rrstd;
    int64_t phi, z[QC_ATTN_FUSED_LAYOUT_MAX_D], a[QC_ATTN_FUSED_LAYOUT_MAX_D];
    int64_t mean[QC_ATTN_FUSED_LAYOUT_MAX_D], rstd[QC_ATTN_FUSED_LAYOUT_MAX_D];
    int64_t s, s_mean, s_rstd, o;
    int64_t dkt, dvt, drhat, dphi;
    int64_t total;
};

static inline int64_t qc_attn_fused_layout_take(int64_t *cursor, int64_t n)
{
    const int64_t off = *cursor;
    *cursor += (n + QC_ATTN_FUSED_LAYOUT_ALIGN - 1) / QC_ATTN_FUSED_LAYOUT_ALIGN *
               QC_ATTN_FUSED_LAYOUT_ALIGN;
    return off;
}

/* The layout for tiles of at most cap base edges, width D; with a positional input (has_pos) an
 * FE of fe_d continuous inputs (0 .. QC_ATTN_FUSED_LAYOUT_MAX_D) and fe_F frequency bands;
 * backward adds the gradient pieces:
 *   kt, vt (cap,D); with pos: r, rhat, tmp (cap,D), rmean, rrstd (cap), the FE stash (phi
 *   (cap,d,2F+1), per dim z, a (cap,D) and LN statistics (cap), s, o (cap,D) and statistics);
 *   backward adds dkt, dvt, drhat (cap,D) and dphi (cap,d,2F+1). */
static inline struct qc_attn_fused_layout qc_attn_fused_layout_make(int64_t cap, int64_t D,
                                                                    bool has_pos, int64_t fe_d,
                                                                    int64_t fe_F, bool backward)
{
    struct qc_attn_fused_layout L;
    int64_t cur = 0;
    L.r = L.rhat = L.tmp = L.rmean = L.rrstd = L.phi = L.s = L.s_mean = L.s_rstd = L.o = -1;
    L.dkt = L.dvt = L.drhat = L.dphi = -1;
    for (int i = 0; i < QC_ATTN_FUSED_LAYOUT_MAX_D; i++)
        L.z[i] = L.a[i] = L.mean[i] = L.rstd[i] = -1;
    L.kt = qc_attn_fused_layout_take(&cur, cap * D);
    L.vt = qc_attn_fused_layout_take(&cur, cap * D);
    if (backward) {
        L.dkt = qc_attn_fused_layout_take(&cur, cap * D);
        L.dvt = qc_attn_fused_layout_take(&cur, cap * D);
    }
    if (has_pos) {
        const int64_t P = 2 * fe_F + 1;
        L.r = qc_attn_fused_layout_take(&cur, cap * D);
        L.rhat = qc_attn_fused_layout_take(&cur, cap * D);
        L.tmp = qc_attn_fused_layout_take(&cur, cap * D);
        L.rmean = qc_attn_fused_layout_take(&cur, cap);
        L.rrstd = qc_attn_fused_layout_take(&cur, cap);
        if (fe_d > 0)
            L.phi = qc_attn_fused_layout_take(&cur, cap * fe_d * P);
        for (int64_t i = 0; i < fe_d && i < QC_ATTN_FUSED_LAYOUT_MAX_D; i++) {
            L.z[i] = qc_attn_fused_layout_take(&cur, cap * D);
            L.a[i] = qc_attn_fused_layout_take(&cur, cap * D);
            L.mean[i] = qc_attn_fused_layout_take(&cur, cap);
            L.rstd[i] = qc_attn_fused_layout_take(&cur, cap);
        }
        L.s = qc_attn_fused_layout_take(&cur, cap * D);
        L.o = qc_attn_fused_layout_take(&cur, cap * D);
        L.s_mean = qc_attn_fused_layout_take(&cur, cap);
        L.s_rstd = qc_attn_fused_layout_take(&cur, cap);
        if (backward) {
            L.drhat = qc_attn_fused_layout_take(&cur, cap * D);
            if (fe_d > 0)
                L.dphi = qc_attn_fused_layout_take(&cur, cap * fe_d * P);
        }
    }
    L.total = cur;
    return L;
}

#endif /* QC_KERNELS_ATTN_FUSED_INTERNAL_H */
