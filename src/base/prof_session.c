/*
 * prof_session.c — a profiling session (qc_prof_start / qc_prof_stop / qc_prof_reset,
 * qc_prof.h): the recorder's host half (prof.c) and its CUDA half (prof_cuda.c, or the no-ops
 * below in a build without CUDA) started and reset together. Above both, so the calls go one
 * way: prof_session.c -> prof_cuda.c -> prof.c (tests/file_cycles.py).
 */
#include "qc_prof.h"

#include "prof_internal.h"

void qc_prof_start(void)
{
    prof_host_start();
    prof_cuda_start();
    qc_prof_active = 1;
}

void qc_prof_stop(void)
{
    qc_prof_active = 0;
}

void qc_prof_reset(void)
{
    prof_host_reset();
    prof_cuda_reset();
}

#ifndef QC_HAVE_CUDA
void prof_cuda_start(void)
{
}

void prof_cuda_reset(void)
{
}

enum qc_status qc_prof_resolve(void)
{
    return QC_OK;
}
#endif
