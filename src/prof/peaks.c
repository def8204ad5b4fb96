/*
 * peaks.c — the reference rates of `qctrain profile` (qc_profile.h): one large SGEMM through
 * the same op the model's GEMMs use (qc_op_linear_forward: OpenBLAS on the CPU, cuBLAS on
 * CUDA) and one large copy (qc_op_copy), on the step's backend and memory.
 */
#include "qc_profile.h"

#include <omp.h>

#include "qc_alloc.h"
#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_prof.h"

/* Best seconds of `reps` runs of one SGEMM out = a·bᵀ (n × n × n). */
static enum qc_status time_gemm(const struct qc_exec *ex, float *out, const float *a,
                                const float *b, int64_t n, int reps, double *best)
{
    *best = 0;
    for (int i = 0; i < reps; i++) {
        const int64_t t0 = qc_prof_now_ns();
        qc_op_linear_forward(ex, out, a, n, b, NULL, n, n, n, false);
        QC_TRY(qc_op_sync(ex));
        const double s = 1e-9 * (double)(qc_prof_now_ns() - t0);
        if (i == 0 || s < *best)
            *best = s;
    }
    return QC_OK;
}

enum qc_status qc_profile_peaks_measure(const struct qc_exec *ex, struct qc_alloc *a,
                                        int64_t gemm_n, struct qc_profile_peaks *out)
{
    const int64_t n = gemm_n > 0 ? gemm_n : 2048;
    const size_t mat = (size_t)(n * n) * sizeof(float), copy = (size_t)64 << 20;
    struct qc_profile_peaks pk = {.device = qc_exec_backend_of(ex) == QC_EXEC_CUDA,
                                  .threads = omp_get_max_threads(),
                                  .gemm_n = n};
    void *buf = NULL;
    const size_t bytes = 3 * mat > 2 * copy ? 3 * mat : 2 * copy;
    QC_TRY(qc_alloc_malloc(a, bytes, NULL, "profile/peaks", &buf));
    float *x = buf, *w = (float *)((char *)buf + mat), *y = (float *)((char *)buf + 2 * mat);
    qc_op_zero(ex, buf, bytes); /* zeros: no denormals, the same speed as data */
    const double flops = 2.0 * (double)n * (double)n * (double)n;
    double s = 0;
    enum qc_status st = time_gemm(ex, y, x, w, n, 1, &s); /* warm-up: BLAS threads, pages */
    if (st == QC_OK)
        st = time_gemm(ex, y, x, w, n, 3, &s);
    if (st == QC_OK)
        pk.gemm_gflops_n = s > 0 ? flops / s * 1e-9 : 0;
    if (st == QC_OK && !pk.device) {
        const int blas = qc_kernels_cpu_blas_threads();
        qc_kernels_cpu_set_blas_threads(1);
        st = time_gemm(ex, y, x, w, n, 2, &s);
        qc_kernels_cpu_set_blas_threads(blas);
        if (st == QC_OK)
            pk.gemm_gflops_1 = s > 0 ? flops / s * 1e-9 : 0;
    }
    for (int i = 0; st == QC_OK && i < 5; i++) {
        const int64_t t0 = qc_prof_now_ns();
        qc_op_copy(ex, (char *)buf + copy, buf, copy);
        st = qc_op_sync(ex);
        const double c = 1e-9 * (double)(qc_prof_now_ns() - t0);
        const double gbs = c > 0 ? 2.0 * (double)copy / c * 1e-9 : 0;
        pk.copy_gbs = gbs > pk.copy_gbs ? gbs : pk.copy_gbs;
    }
    qc_alloc_free(a, buf, NULL);
    if (st == QC_OK)
        *out = pk;
    return st;
}
