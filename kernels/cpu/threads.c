/*
 * threads.c — the host ops' thread counts (qc_kernels_cpu_set_threads, qc_kernels.h): OpenMP
 * and OpenBLAS set together, and the process's own counts restored on 0.
 */
#include <omp.h>
#include <pthread.h>

#include "qc_kernels.h"
#include "qc_status.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static int omp_initial, blas_initial; /* the counts before the first call */

static void threads_record(void)
{
    omp_initial = omp_get_max_threads();
    blas_initial = qc_kernels_cpu_blas_threads();
}

void qc_kernels_cpu_set_threads(int n)
{
    QC_ASSERT(n >= 0, "cpu threads %d", n);
    QC_ASSERT(!omp_in_parallel(), "cpu threads set inside a parallel region");
    pthread_once(&threads_once, threads_record);
    /* BLAS first: an OpenMP build of OpenBLAS sets the OpenMP count with its own (under
     * clang's libomp its own count was 1, and every host op of the process ran on one thread) */
    qc_kernels_cpu_set_blas_threads(n > 0 ? n : (blas_initial > 0 ? blas_initial : 1));
    omp_set_num_threads(n > 0 ? n : omp_initial);
}
