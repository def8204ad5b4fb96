/*
 * linear.c — y = x·Wᵀ + b with OpenBLAS (every GEMM of the CPU backend goes through
 * cblas_sgemm). W is (OC,IC) as in PyTorch. The input may be a strided row view (ldi >= IC).
 * The bias-gradient column sums loop rows in ascending order per column (deterministic for any
 * thread count), accumulated in double and added once.
 */
#include "qc_kernels.h"

#include <limits.h>
#include <string.h>

#include <cblas.h> /* cblas_sgemm, openblas_{get,set}_num_threads (OpenBLAS) */

#include "cpu_internal.h"
#include "qc_status.h"

/* Columns per OpenMP work item in column reductions: a cache line of floats. */
#define LINEAR_COL_CHUNK 16

int qc_kernels_cpu_blas_threads(void)
{
    return openblas_get_num_threads();
}

void qc_kernels_cpu_set_blas_threads(int n)
{
    QC_ASSERT(n >= 1, "BLAS threads %d", n);
    openblas_set_num_threads(n);
}

static void check_blas_dims(int64_t a, int64_t b, int64_t c, int64_t ld)
{
    QC_ASSERT(a <= INT_MAX && b <= INT_MAX && c <= INT_MAX && ld <= INT_MAX,
              "linear: dims %lld x %lld x %lld (ld %lld) exceed the BLAS int range", (long long)a,
              (long long)b, (long long)c, (long long)ld);
}

void qc_linear_forward_cpu(float *out, const float *inp, int64_t ldi, const float *weight,
                           const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC,
              "linear fwd: N %lld IC %lld OC %lld ldi %lld", (long long)N, (long long)IC,
              (long long)OC, (long long)ldi);
    QC_ASSERT(N == 0 || (out && inp && weight), "linear fwd: NULL tensor");
    if (N == 0)
        return;
    check_blas_dims(N, IC, OC, ldi);
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if (N * OC >= CPU_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            float *o = out + n * OC;
            if (accum) {
                for (int64_t c = 0; c < OC; c++)
                    o[c] += bias[c];
            } else {
                memcpy(o, bias, (size_t)OC * sizeof(float));
            }
        }
        beta = 1.0f;
    } else if (accum) {
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)IC, 1.0f, inp,
                (int)ldi, weight, (int)IC, beta, out, (int)OC);
}

void qc_linear_backward_cpu(float *dinp, int64_t lddi, float *dweight, float *dbias,
                            const float *dout, const float *inp, int64_t ldi, const float *weight,
                            int64_t N, int64_t IC, int64_t OC, bool accum)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC && (!dinp || lddi >= IC),
              "linear bwd: N %lld IC %lld OC %lld ldi %lld lddi %lld", (long long)N, (long long)IC,
              (long long)OC, (long long)ldi, (long long)lddi);
    if (N == 0)
        return;
    QC_ASSERT(dout, "linear bwd: NULL dout");
    check_blas_dims(N, IC, OC, ldi);
    if (dinp) {
        QC_ASSERT(weight, "linear bwd: dinp needs weight");
        check_blas_dims(N, IC, OC, lddi);
        /* dinp (N,IC) = dout (N,OC) · W (OC,IC) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)IC, (int)OC, 1.0f, dout,
                    (int)OC, weight, (int)IC, accum ? 1.0f : 0.0f, dinp, (int)lddi);
    }
    if (dweight) {
        QC_ASSERT(inp, "linear bwd: dweight needs inp");
        /* dW (OC,IC) += doutᵀ (OC,N) · inp (N,IC) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)IC, (int)N, 1.0f, dout,
                    (int)OC, inp, (int)ldi, 1.0f, dweight, (int)IC);
    }
    if (dbias) {
        int64_t nchunk = (OC + LINEAR_COL_CHUNK - 1) / LINEAR_COL_CHUNK;
#pragma omp parallel for schedule(static) if (N * OC >= CPU_PAR_MIN)
        for (int64_t ch = 0; ch < nchunk; ch++) {
            int64_t c0 = ch * LINEAR_COL_CHUNK;
            int64_t c1 = c0 + LINEAR_COL_CHUNK < OC ? c0 + LINEAR_COL_CHUNK : OC;
            double acc[LINEAR_COL_CHUNK] = {0};
            if (c1 - c0 == LINEAR_COL_CHUNK) /* a constant trip count: the adds vectorize */
                for (int64_t n = 0; n < N; n++)
                    for (int j = 0; j < LINEAR_COL_CHUNK; j++)
                        acc[j] += (double)dout[n * OC + c0 + j];
            else
                for (int64_t n = 0; n < N; n++)
                    for (int64_t c = c0; c < c1; c++)
                        acc[c - c0] += (double)dout[n * OC + c];
            for (int64_t c = c0; c < c1; c++)
                dbias[c] += (float)acc[c - c0];
        }
    }
}
