/*
 * embedding.c — embedding lookup and its scatter-add backward into the table. The backward is
 * parallel over column chunks and loops the N lookups in ascending order inside each, so every
 * table element is summed in the same order whatever the thread count (no atomics).
 */
#include "qc_kernels.h"

#include <string.h>

#include "qc_status.h"

#define EMB_COL_CHUNK 16

void qc_embedding_forward_cpu(float *out, const int64_t *idx, const float *table, int64_t N,
                              int64_t C, int64_t V)
{
    QC_ASSERT(N >= 0 && C > 0 && V > 0, "embedding fwd: N %lld C %lld V %lld", (long long)N,
              (long long)C, (long long)V);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        QC_DASSERT(idx[n] >= 0 && idx[n] < V, "embedding: idx[%lld] = %lld", (long long)n,
                   (long long)idx[n]);
        memcpy(out + n * C, table + idx[n] * C, (size_t)C * sizeof(float));
    }
}

void qc_embedding_backward_cpu(float *dtable, const float *dout, const int64_t *idx, int64_t N,
                               int64_t C, int64_t V)
{
    QC_ASSERT(N >= 0 && C > 0 && V > 0, "embedding bwd: N %lld C %lld V %lld", (long long)N,
              (long long)C, (long long)V);
    int64_t nchunk = (C + EMB_COL_CHUNK - 1) / EMB_COL_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < nchunk; ch++) {
        int64_t c0 = ch * EMB_COL_CHUNK;
        int64_t c1 = c0 + EMB_COL_CHUNK < C ? c0 + EMB_COL_CHUNK : C;
        for (int64_t n = 0; n < N; n++) {
            float *t = dtable + idx[n] * C;
            const float *g = dout + n * C;
            for (int64_t c = c0; c < c1; c++)
                t[c] += g[c];
        }
    }
}
