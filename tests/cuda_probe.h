/*
 * cuda_probe.h — whether a GPU test runs, skips (exit 77) or fails, for every test labelled gpu.
 * Header-only, for tests.
 *
 * Skip only where there is no GPU to test: a CPU-only build, no CUDA device, or no NVIDIA
 * driver at all. A machine with a device that cannot be used (a driver too old for the
 * runtime, a device busy or in a bad state, an initialisation error) fails the test: on a GPU
 * machine, a skip would hide exactly what the run is there to find.
 *
 *   qc_test_cuda_verdict(err, count, driver)  the decision, a pure function of
 *                                             cudaGetDeviceCount's error code and count and
 *                                             whether the driver library is installed (tested
 *                                             on the CPU by test_device);
 *   qc_test_cuda_probe()                      asks the machine, prints the reason, and returns
 *                                             0 (run), 77 (skip) or 1 (fail).
 *
 * GPU tests driven by a script (tests/test_precision_run.py) apply the same rule to what the
 * binary reports: `qctrain version --json` gives cudaGetDeviceCount's error and count.
 */
#ifndef QC_TESTS_CUDA_PROBE_H
#define QC_TESTS_CUDA_PROBE_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>

#include "qc_device.h"

#ifdef QC_HAVE_CUDA
#    include <cuda_runtime.h>
#endif

/* cudaError_t values the verdict names (checked against the CUDA headers in CUDA builds). */
#define QC_TEST_CUDA_SUCCESS              0
#define QC_TEST_CUDA_ERR_STUB_LIBRARY     34  /* cudaErrorStubLibrary: the toolkit's stub libcuda */
#define QC_TEST_CUDA_ERR_INSUFFICIENT_DRV 35  /* cudaErrorInsufficientDriver */
#define QC_TEST_CUDA_ERR_NO_DEVICE        100 /* cudaErrorNoDevice */
#define QC_TEST_CUDA_NOT_BUILT            (-1) /* qc_device_cuda_probe in a CPU-only build */

#ifdef QC_HAVE_CUDA
_Static_assert(QC_TEST_CUDA_ERR_STUB_LIBRARY == (int)cudaErrorStubLibrary, "cudaErrorStubLibrary");
_Static_assert(QC_TEST_CUDA_ERR_INSUFFICIENT_DRV == (int)cudaErrorInsufficientDriver,
               "cudaErrorInsufficientDriver");
_Static_assert(QC_TEST_CUDA_ERR_NO_DEVICE == (int)cudaErrorNoDevice, "cudaErrorNoDevice");
#endif

enum qc_test_cuda_outcome {
    QC_TEST_CUDA_RUN = 0,   /* a device is there: run (and fail on any setup error) */
    QC_TEST_CUDA_SKIP = 77, /* no GPU here: the ctest skip code */
    QC_TEST_CUDA_FAIL = 1,  /* a GPU (or its driver) is there but unusable */
};

/* err: cudaGetDeviceCount's cudaError_t as an int (QC_TEST_CUDA_NOT_BUILT in a CPU-only build);
 * count: its device count; driver: libcuda.so.1 (the NVIDIA driver's library) can be loaded.
 * *why (optional) gets a one-line reason. */
static inline enum qc_test_cuda_outcome qc_test_cuda_verdict(int err, int count, bool driver,
                                                             const char **why)
{
    const char *w;
    enum qc_test_cuda_outcome o;
    if (err == QC_TEST_CUDA_NOT_BUILT) {
        w = "a CPU-only build has no CUDA backend";
        o = QC_TEST_CUDA_SKIP;
    } else if (err == QC_TEST_CUDA_SUCCESS) {
        w = count > 0 ? "CUDA device present" : "no CUDA device";
        o = count > 0 ? QC_TEST_CUDA_RUN : QC_TEST_CUDA_SKIP;
    } else if (err == QC_TEST_CUDA_ERR_NO_DEVICE) {
        w = "no CUDA device (cudaErrorNoDevice)";
        o = QC_TEST_CUDA_SKIP;
    } else if (err == QC_TEST_CUDA_ERR_STUB_LIBRARY) {
        w = "no NVIDIA driver: the toolkit's stub libcuda answered (cudaErrorStubLibrary)";
        o = QC_TEST_CUDA_SKIP;
    } else if (err == QC_TEST_CUDA_ERR_INSUFFICIENT_DRV && !driver) {
        w = "no NVIDIA driver installed (libcuda.so.1 not found)";
        o = QC_TEST_CUDA_SKIP;
    } else if (err == QC_TEST_CUDA_ERR_INSUFFICIENT_DRV) {
        w = "the NVIDIA driver is older than the CUDA runtime (cudaErrorInsufficientDriver)";
        o = QC_TEST_CUDA_FAIL;
    } else {
        w = "the CUDA runtime cannot initialise the GPU (see the error code)";
        o = QC_TEST_CUDA_FAIL;
    }
    if (why)
        *why = w;
    return o;
}

/* True when the NVIDIA driver's library is installed (whether or not it works). */
static inline bool qc_test_cuda_driver_installed(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h)
        return false;
    dlclose(h);
    return true;
}

/* 0: run; 77: skip (reason printed as "skip: ..."); 1: fail (reason printed as "FATAL: ..."). */
static inline int qc_test_cuda_probe(void)
{
    int count = 0;
    const int err = qc_device_cuda_probe(&count);
    const bool driver = err == QC_TEST_CUDA_ERR_INSUFFICIENT_DRV && qc_test_cuda_driver_installed();
    const char *why = NULL;
    const enum qc_test_cuda_outcome o = qc_test_cuda_verdict(err, count, driver, &why);
    if (o == QC_TEST_CUDA_SKIP)
        printf("skip: %s\n", why);
    else if (o == QC_TEST_CUDA_FAIL)
#ifdef QC_HAVE_CUDA
        printf("FATAL: %s: cudaGetDeviceCount returned %s (%d)\n", why,
               cudaGetErrorName((cudaError_t)err), err);
#else
        printf("FATAL: %s (error %d)\n", why, err);
#endif
    return (int)o;
}

#endif /* QC_TESTS_CUDA_PROBE_H */
