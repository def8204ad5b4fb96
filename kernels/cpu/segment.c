/*
 * segment.c — CSR construction, gather / scatter-add and the graph-attention edge ops (score,
 * segment softmax, weighted aggregation with attention dropout).
 *
 * Determinism: every reduction over edges runs per segment (destination) in CSR order, one
 * segment per OpenMP work item, so results do not depend on the thread count and no atomics
 * are needed. Per-edge outputs (no reduction) are parallel over edges.
 * Item k of segment s is edge csr_item(csr, k) = perm ? perm[k] : k.
 */
#include "qc_kernels.h"

#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "qc_status.h"

static inline int64_t csr_item(const struct qc_csr *csr, int64_t k)
{
    return csr->perm ? csr->perm[k] : k;
}

static void csr_check(const struct qc_csr *csr, const char *op)
{
    QC_ASSERT(csr->nseg >= 0 && csr->nitem >= 0 && csr->ptr, "%s: bad csr (nseg %lld nitem %lld)",
              op, (long long)csr->nseg, (long long)csr->nitem);
    QC_ASSERT(csr->ptr[0] == 0 && csr->ptr[csr->nseg] == csr->nitem,
              "%s: csr ptr[0] %lld ptr[nseg] %lld nitem %lld", op, (long long)csr->ptr[0],
              (long long)csr->ptr[csr->nseg], (long long)csr->nitem);
}

void qc_csr_build_cpu(int64_t *ptr, int64_t *perm, const int64_t *idx, int64_t nitem, int64_t nseg)
{
    QC_ASSERT(nitem >= 0 && nseg >= 0 && ptr && (nitem == 0 || (perm && idx)),
              "csr_build: nitem %lld nseg %lld", (long long)nitem, (long long)nseg);
    /* counting sort: counts into ptr[s+1], exclusive prefix, then a stable fill that uses
     * ptr[s] as the cursor of segment s; the cursors end at the next segment's start, so one
     * shift right restores the offsets. */
    memset(ptr, 0, (size_t)(nseg + 1) * sizeof(int64_t));
    for (int64_t e = 0; e < nitem; e++) {
        QC_ASSERT(idx[e] >= 0 && idx[e] < nseg, "csr_build: idx[%lld] = %lld outside [0,%lld)",
                  (long long)e, (long long)idx[e], (long long)nseg);
        ptr[idx[e] + 1]++;
    }
    for (int64_t s = 0; s < nseg; s++)
        ptr[s + 1] += ptr[s];
    for (int64_t e = 0; e < nitem; e++)
        perm[ptr[idx[e]]++] = e;
    for (int64_t s = nseg; s > 0; s--)
        ptr[s] = ptr[s - 1];
    ptr[0] = 0;
}

/* ---- gather / scatter-add ---------------------------------------------------------------- */

void qc_gather_rows_forward_cpu(float *out, const float *inp, const int64_t *idx, int64_t E,
                                int64_t C, bool accum)
{
    QC_ASSERT(E >= 0 && C >= 0, "gather fwd: E %lld C %lld", (long long)E, (long long)C);
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < E; e++) {
        QC_DASSERT(idx[e] >= 0, "gather: idx[%lld] = %lld", (long long)e, (long long)idx[e]);
        const float *src = inp + idx[e] * C;
        float *dst = out + e * C;
        if (accum) {
            for (int64_t c = 0; c < C; c++)
                dst[c] += src[c];
        } else {
            memcpy(dst, src, (size_t)C * sizeof(float));
        }
    }
}

/* out[s] (=|+=) Σ over the segment's items of inp[item], CSR order. */
static void segment_sum(float *out, const float *inp, const struct qc_csr *csr, int64_t C,
                        bool accum)
{
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t s = 0; s < csr->nseg; s++) {
        float *o = out + s * C;
        if (!accum)
            memset(o, 0, (size_t)C * sizeof(float));
        for (int64_t k = csr->ptr[s]; k < csr->ptr[s + 1]; k++) {
            const float *x = inp + csr_item(csr, k) * C;
            for (int64_t c = 0; c < C; c++)
                o[c] += x[c];
        }
    }
}

void qc_gather_rows_backward_cpu(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                 bool accum)
{
    csr_check(&csr, "gather bwd");
    segment_sum(dinp, dout, &csr, C, accum);
}

void qc_scatter_add_forward_cpu(float *out, const float *inp, struct qc_csr csr, int64_t C,
                                bool accum)
{
    csr_check(&csr, "scatter_add fwd");
    segment_sum(out, inp, &csr, C, accum);
}

void qc_scatter_add_backward_cpu(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                 bool accum)
{
    csr_check(&csr, "scatter_add bwd");
    QC_ASSERT(csr.seg || csr.nitem == 0, "scatter_add bwd: csr.seg is NULL");
    qc_gather_rows_forward_cpu(dinp, dout, csr.seg, csr.nitem, C, accum);
}

/* ---- attention score -------------------------------------------------------------------- */

void qc_attn_score_forward_cpu(float *score, const float *q, const float *k, struct qc_csr csr,
                               int64_t H, int64_t Dh, float scale)
{
    csr_check(&csr, "attn_score fwd");
    QC_ASSERT(H > 0 && Dh > 0 && (csr.seg || csr.nitem == 0), "attn_score fwd: H %lld Dh %lld",
              (long long)H, (long long)Dh);
    int64_t D = H * Dh;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < csr.nitem; e++) {
        const float *qi = q + csr.seg[e] * D;
        const float *ke = k + e * D;
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < Dh; c++)
                acc += qi[h * Dh + c] * ke[h * Dh + c];
            score[e * H + h] = acc * scale;
        }
    }
}

void qc_attn_score_backward_cpu(float *dq, float *dk, const float *dscore, const float *q,
                                const float *k, struct qc_csr csr, int64_t H, int64_t Dh,
                                float scale, bool accum)
{
    csr_check(&csr, "attn_score bwd");
    QC_ASSERT(H > 0 && Dh > 0, "attn_score bwd: H %lld Dh %lld", (long long)H, (long long)Dh);
    int64_t D = H * Dh;
    if (dk) {
        QC_ASSERT(csr.seg || csr.nitem == 0, "attn_score bwd: csr.seg is NULL");
#pragma omp parallel for schedule(static)
        for (int64_t e = 0; e < csr.nitem; e++) {
            const float *qi = q + csr.seg[e] * D;
            for (int64_t h = 0; h < H; h++) {
                float g = dscore[e * H + h] * scale;
                for (int64_t c = 0; c < Dh; c++)
                    dk[e * D + h * Dh + c] = g * qi[h * Dh + c];
            }
        }
    }
    if (dq) {
#pragma omp parallel for schedule(dynamic, 64)
        for (int64_t s = 0; s < csr.nseg; s++) {
            float *o = dq + s * D;
            if (!accum)
                memset(o, 0, (size_t)D * sizeof(float));
            for (int64_t kk = csr.ptr[s]; kk < csr.ptr[s + 1]; kk++) {
                int64_t e = csr_item(&csr, kk);
                for (int64_t h = 0; h < H; h++) {
                    float g = dscore[e * H + h] * scale;
                    for (int64_t c = 0; c < Dh; c++)
                        o[h * Dh + c] += g * k[e * D + h * Dh + c];
                }
            }
        }
    }
}

/* ---- segment softmax -------------------------------------------------------------------- */

void qc_segment_softmax_forward_cpu(float *out, float *seg_max, float *seg_sum, const float *score,
                                    struct qc_csr csr, int64_t H)
{
    csr_check(&csr, "segment_softmax fwd");
    QC_ASSERT(H > 0, "segment_softmax fwd: H %lld", (long long)H);
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t s = 0; s < csr.nseg; s++) {
        int64_t k0 = csr.ptr[s], k1 = csr.ptr[s + 1];
        for (int64_t h = 0; h < H; h++) {
            float mx = 0.0f; /* empty segment: PyG's scatter-max fill value */
            if (k1 > k0) {
                mx = -INFINITY;
                for (int64_t k = k0; k < k1; k++) {
                    float v = score[csr_item(&csr, k) * H + h];
                    mx = v > mx ? v : mx;
                }
            }
            float sum = 0.0f;
            for (int64_t k = k0; k < k1; k++) {
                int64_t e = csr_item(&csr, k);
                float ex = expf(score[e * H + h] - mx);
                out[e * H + h] = ex;
                sum += ex;
            }
            sum += QC_SOFTMAX_EPS;
            for (int64_t k = k0; k < k1; k++) {
                int64_t e = csr_item(&csr, k);
                out[e * H + h] = out[e * H + h] / sum;
            }
            if (seg_max)
                seg_max[s * H + h] = mx;
            if (seg_sum)
                seg_sum[s * H + h] = sum;
        }
    }
}

void qc_segment_softmax_backward_cpu(float *dscore, const float *dout, const float *out,
                                     struct qc_csr csr, int64_t H)
{
    csr_check(&csr, "segment_softmax bwd");
    QC_ASSERT(H > 0, "segment_softmax bwd: H %lld", (long long)H);
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t s = 0; s < csr.nseg; s++) {
        int64_t k0 = csr.ptr[s], k1 = csr.ptr[s + 1];
        for (int64_t h = 0; h < H; h++) {
            float dot = 0.0f;
            for (int64_t k = k0; k < k1; k++) {
                int64_t e = csr_item(&csr, k);
                dot += out[e * H + h] * dout[e * H + h];
            }
            for (int64_t k = k0; k < k1; k++) {
                int64_t e = csr_item(&csr, k);
                dscore[e * H + h] = out[e * H + h] * (dout[e * H + h] - dot);
            }
        }
    }
}

/* ---- weighted aggregation with attention dropout ----------------------------------------- */

#define AGG_MAX_H 64 /* heads handled per dropout draw (QCNet: 8) */

/* α' multipliers of edge e's H heads: f[h] = scale when kept, 0 when dropped (flat indices
 * e·H + h of the site, one Philox per 4). */
static inline void drop_factors(float *f, const struct qc_dropout *d, int64_t e, int64_t H,
                                float scale)
{
    uint8_t keep[AGG_MAX_H];
    cpu_dropout_keep_range(keep, d, d->index_base + e * H, H);
    for (int64_t h = 0; h < H; h++)
        f[h] = cpu_keep_or_zero(scale, keep[h]);
}

void qc_attn_aggregate_forward_cpu(float *out, const float *alpha, const float *v,
                                   struct qc_csr csr, int64_t H, int64_t Dh,
                                   const struct qc_dropout *drop)
{
    csr_check(&csr, "attn_aggregate fwd");
    QC_ASSERT(H > 0 && H <= AGG_MAX_H && Dh > 0, "attn_aggregate fwd: H %lld Dh %lld", (long long)H,
              (long long)Dh);
    QC_ASSERT(!drop || qc_dropout_valid(drop), "attn_aggregate fwd: bad dropout");
    int64_t D = H * Dh;
    bool dropping = drop && drop->p != 0.0f;
    float scale = dropping ? 1.0f / (1.0f - drop->p) : 1.0f;
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t s = 0; s < csr.nseg; s++) {
        float *o = out + s * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int64_t kk = csr.ptr[s]; kk < csr.ptr[s + 1]; kk++) {
            int64_t e = csr_item(&csr, kk);
            float f[AGG_MAX_H];
            if (dropping)
                drop_factors(f, drop, e, H, scale);
            for (int64_t h = 0; h < H; h++) {
                float a = alpha[e * H + h];
                if (dropping)
                    a = a * f[h];
                const float *ve = v + e * D + h * Dh;
                for (int64_t c = 0; c < Dh; c++)
                    o[h * Dh + c] += ve[c] * a;
            }
        }
    }
}

void qc_attn_aggregate_backward_cpu(float *dalpha, float *dv, const float *dout, const float *alpha,
                                    const float *v, struct qc_csr csr, int64_t H, int64_t Dh,
                                    const struct qc_dropout *drop)
{
    csr_check(&csr, "attn_aggregate bwd");
    QC_ASSERT(H > 0 && H <= AGG_MAX_H && Dh > 0 && (csr.seg || csr.nitem == 0),
              "attn_aggregate bwd: H %lld Dh %lld", (long long)H, (long long)Dh);
    QC_ASSERT(!drop || qc_dropout_valid(drop), "attn_aggregate bwd: bad dropout");
    int64_t D = H * Dh;
    bool dropping = drop && drop->p != 0.0f;
    float scale = dropping ? 1.0f / (1.0f - drop->p) : 1.0f;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < csr.nitem; e++) {
        const float *g = dout + csr.seg[e] * D;
        float fs[AGG_MAX_H];
        if (dropping)
            drop_factors(fs, drop, e, H, scale);
        for (int64_t h = 0; h < H; h++) {
            float f = dropping ? fs[h] : 1.0f;
            if (dalpha) {
                float acc = 0.0f;
                for (int64_t c = 0; c < Dh; c++)
                    acc += g[h * Dh + c] * v[e * D + h * Dh + c];
                dalpha[e * H + h] = dropping ? acc * f : acc;
            }
            if (dv) {
                float a = dropping ? alpha[e * H + h] * f : alpha[e * H + h];
                for (int64_t c = 0; c < Dh; c++)
                    dv[e * D + h * Dh + c] = g[h * Dh + c] * a;
            }
        }
    }
}
