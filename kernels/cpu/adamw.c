/*
 * adamw.c — the AdamW step in PyTorch 2.0's order (QCNET.md §1): decoupled decay first, then
 * the moments (m as a lerp, v as mul + addcmul), then the bias-corrected update
 * p ← p + (−lr/bc1)·(m / (sqrt(v)/sqrt(bc2) + eps)). Scalars are formed in double (as Python
 * does) and rounded to fp32 once, as PyTorch passes them to its fp32 kernels.
 */
#include "qc_kernels.h"
#include "kernels_internal.h"

#include <math.h>

#include "qc_status.h"

#define ADAMW_CHUNK 16384 /* elements per work item of one flat tensor */

/* Elements [i0, i1) on the calling thread. Every element's update is independent of the others:
 * any split over threads gives the same bits. */
static void adamw_range(float *param, float *m, float *v, const float *grad, int64_t i0, int64_t i1,
                        const struct adamw_scalars *s)
{
    for (int64_t i = i0; i < i1; i++) {
        float g = grad[i];
        float p = param[i] * s->decay;
        float mi = m[i];
        /* torch.lerp with weight < 0.5: self + weight·(end − self) */
        mi = mi + s->w1 * (g - mi);
        float vi = v[i] * s->beta2 + s->w2 * g * g;
        float denom = sqrtf(vi) / s->bc2_sqrt + s->eps;
        p = p + s->neg_step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
    }
}

void qc_adamw_step_cpu(float *param, float *m, float *v, const float *grad, int64_t n,
                       const struct qc_adamw_hparams *hp)
{
    QC_ASSERT(n >= 0 && hp, "adamw: n %lld", (long long)n);
    struct adamw_scalars s = adamw_scalars_make(hp, hp->weight_decay);
    const int64_t nchunk = (n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < nchunk; ch++)
        adamw_range(param, m, v, grad, ch * ADAMW_CHUNK,
                    n - ch * ADAMW_CHUNK < ADAMW_CHUNK ? n : (ch + 1) * ADAMW_CHUNK, &s);
}

void qc_adamw_step_segments_cpu(float *param, float *m, float *v, const float *grad,
                                const int64_t *offsets, const uint8_t *decay, int64_t nseg,
                                const struct qc_adamw_hparams *hp)
{
    QC_ASSERT(nseg >= 0 && hp && offsets && (nseg == 0 || decay), "adamw segments: nseg %lld",
              (long long)nseg);
    struct adamw_scalars with = adamw_scalars_make(hp, hp->weight_decay);
    struct adamw_scalars without = adamw_scalars_make(hp, 0.0);
    for (int64_t sgi = 0; sgi < nseg; sgi++) {
        QC_ASSERT(offsets[sgi] <= offsets[sgi + 1], "adamw segments: offsets not sorted at %lld",
                  (long long)sgi);
    }
    /* one team for every segment (a team per segment cost more than the update: QCNet has ~900
     * parameter tensors, most of them small) */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t sgi = 0; sgi < nseg; sgi++)
        adamw_range(param, m, v, grad, offsets[sgi], offsets[sgi + 1],
                    decay[sgi] ? &with : &without);
}
