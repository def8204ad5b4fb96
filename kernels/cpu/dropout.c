/*
 * dropout.c — dropout drawn from Philox-4x32-10 (qc_philox.h has the exact (seed, step, block,
 * index) -> keep mapping; qc_dropout_index maps a scene-keyed site's elements to their indices).
 * Nothing is saved: the backward redraws the mask.
 */
#include "qc_kernels.h"

#include <string.h>

#include "cpu_internal.h"
#include "qc_status.h"

#define DROPOUT_CHUNK 1024 /* elements per work item (a multiple of 4: one Philox per 4) */

void qc_dropout_forward_cpu(float *out, const float *inp, int64_t n, const struct qc_dropout *d)
{
    QC_ASSERT(n >= 0 && d && qc_dropout_valid(d), "dropout fwd: n %lld", (long long)n);
    if (d->p == 0.0f) {
        if (out != inp && n > 0)
            memcpy(out, inp, (size_t)n * sizeof(float));
        return;
    }
    const float scale = 1.0f / (1.0f - d->p);
    const int64_t nchunk = (n + DROPOUT_CHUNK - 1) / DROPOUT_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < nchunk; ch++) {
        const int64_t i0 = ch * DROPOUT_CHUNK;
        const int64_t m = n - i0 < DROPOUT_CHUNK ? n - i0 : DROPOUT_CHUNK;
        uint8_t keep[DROPOUT_CHUNK];
        cpu_dropout_keep_range(keep, d, d->index_base + i0, m);
        for (int64_t j = 0; j < m; j++)
            out[i0 + j] = cpu_keep_or_zero(inp[i0 + j] * scale, keep[j]);
    }
}

void qc_dropout_backward_cpu(float *dinp, const float *dout, int64_t n, const struct qc_dropout *d)
{
    /* y = x * mask * scale, so dx = dy * mask * scale: the same map as the forward. */
    qc_dropout_forward_cpu(dinp, dout, n, d);
}
