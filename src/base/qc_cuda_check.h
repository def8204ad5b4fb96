/*
 * qc_cuda_check.h — converting CUDA runtime errors at the seam (CUDA builds only).
 * `QC_TRY(QC_CUDA(cudaMemcpyAsync(...)));` records "<call> failed: <cudaGetErrorString> |
 * file:line". QC_CUDA_ASSERT aborts: for sticky errors and the launch-error check after every
 * kernel launch.
 */
#ifndef QC_BASE_QC_CUDA_CHECK_H
#define QC_BASE_QC_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum qc_status qc_cuda_check(cudaError_t err, const char *call, const char *file, int line);
void qc_cuda_assert(cudaError_t err, const char *call, const char *file, int line);

#define QC_CUDA(call)        QC_CHECK_GEN(call, qc_cuda_check)
#define QC_CUDA_ASSERT(call) qc_cuda_assert((call), #call, __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_CUDA_CHECK_H */
