/*
 * cuda_check.c — CUDA runtime error conversion (compiled only when QC_HAVE_CUDA).
 */
#include "qc_cuda_check.h"

enum qc_status qc_cuda_check(cudaError_t err, const char *call, const char *file, int line)
{
    if (err == cudaSuccess)
        return QC_OK;
    enum qc_status st = err == cudaErrorMemoryAllocation ? QC_ERR_NOMEM : QC_ERR_CUDA;
    /* The error now travels as a status: clear the runtime's last-error slot, or a handled
     * non-sticky error (a cudaMalloc that ran out of memory, which the allocator answers by
     * releasing its cache and retrying) would trip the next launcher's
     * QC_CUDA_ASSERT(cudaGetLastError()). Sticky errors keep failing every later call anyway. */
    (void)cudaGetLastError();
    return qc_errorf(st, "%s failed: %s (%s) | %s:%d", call, cudaGetErrorString(err),
                     cudaGetErrorName(err), file, line);
}

void qc_cuda_assert(cudaError_t err, const char *call, const char *file, int line)
{
    if (err != cudaSuccess)
        qc_assert_fail(file, line, call, "%s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
}
