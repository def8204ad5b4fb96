/*
 * kernels_internal.h — helpers shared by the CPU ops (kernels/cpu) and the CUDA ops
 * (kernels/cuda), so both backends compute the very same host-side scalars. Private to
 * kernels/.
 */
#ifndef QC_KERNELS_KERNELS_INTERNAL_H
#define QC_KERNELS_KERNELS_INTERNAL_H

#include <math.h>

#include "qc_kernels.h"
#include "qc_status.h"

/* The fp32 scalars of one AdamW step, formed in double (as Python does) and rounded once. */
struct adamw_scalars {
    float decay;    /* 1 − lr·wd */
    float w1;       /* 1 − β1 (lerp weight) */
    float beta2;    /* β2 */
    float w2;       /* 1 − β2 */
    float bc2_sqrt; /* sqrt(1 − β2ⁿ) */
    float eps;
    float neg_step; /* −lr / (1 − β1ⁿ) */
};

static inline struct adamw_scalars adamw_scalars_make(const struct qc_adamw_hparams *hp, double wd)
{
    QC_ASSERT(hp->step >= 1, "adamw: step %lld must be >= 1", (long long)hp->step);
    double bc1 = 1.0 - pow(hp->beta1, (double)hp->step);
    double bc2 = 1.0 - pow(hp->beta2, (double)hp->step);
    struct adamw_scalars s;
    s.decay = (float)(1.0 - hp->lr * wd);
    s.w1 = (float)(1.0 - hp->beta1);
    s.beta2 = (float)hp->beta2;
    s.w2 = (float)(1.0 - hp->beta2);
    s.bc2_sqrt = (float)sqrt(bc2);
    s.eps = (float)hp->eps;
    s.neg_step = (float)(-(hp->lr / bc1));
    return s;
}

#endif /* QC_KERNELS_KERNELS_INTERNAL_H */
