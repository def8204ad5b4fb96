/*
 * dropout.c — dropout drawn from Philox-4x32-10 (qc_philox.h has the exact (seed, step, block,
 * index) -> keep mapping). Nothing is saved: the backward redraws the mask.
 */
#include "qc_kernels.h"

#include <string.h>

#include "qc_status.h"

void qc_dropout_forward_cpu(float *out, const float *inp, int64_t n, const struct qc_dropout *d)
{
    QC_ASSERT(n >= 0 && d && d->p >= 0.0f && d->p < 1.0f && d->index_base >= 0,
              "dropout fwd: n %lld", (long long)n);
    if (d->p == 0.0f) {
        if (out != inp && n > 0)
            memcpy(out, inp, (size_t)n * sizeof(float));
        return;
    }
    float scale = 1.0f / (1.0f - d->p);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = qc_dropout_keep(d->seed, d->step, d->block, d->index_base + i, d->p)
                     ? inp[i] * scale
                     : 0.0f;
}

void qc_dropout_backward_cpu(float *dinp, const float *dout, int64_t n, const struct qc_dropout *d)
{
    /* y = x * mask * scale, so dx = dy * mask * scale: the same map as the forward. */
    qc_dropout_forward_cpu(dinp, dout, n, d);
}
