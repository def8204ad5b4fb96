/*
 * kernels_cuda_testlib.h — what the CUDA op tests share (test_kernels_cuda.c, test_exec.c,
 * test_half_cuda.c, test_attn_fused_cuda.c): the GPU context they run in and device buffers
 * with guard bands.
 *
 * The context: CUDA device 0, an allocator of plain cudaMalloc segments (not expandable: the
 * tests are about the ops, not VMM), the device's compute stream, QC_KERNELS_CUDA_WORKSPACE_BYTES
 * of op workspace and an op context with TF32 off (the CPU oracle's GEMMs are exact fp32, and a
 * 16-bit run's fp32 GEMMs are fp32 too), current on the calling thread.
 *
 * Guard bands: a guarded buffer is base | KT_GUARD pattern bytes | data | KT_GUARD pattern bytes;
 * an op that writes outside its data changes a band.
 */
#ifndef QC_TESTS_KERNELS_CUDA_TESTLIB_H
#define QC_TESTS_KERNELS_CUDA_TESTLIB_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_kernels_cuda.h"
#include "qc_status.h"
#include "testutil.h"

#define KT_GUARD 1024 /* bytes of pattern before and after every guarded device buffer */

struct kt_gpu {
    struct qc_device *dev;           /* CUDA device 0 */
    struct qc_alloc *alloc;          /* plain cudaMalloc segments */
    struct qc_kernels_cuda *kctx;    /* TF32 off, current on the opening thread */
    void *ws;                        /* the op context's workspace, from alloc */
    cudaStream_t s;                  /* the device's compute stream */
    unsigned char pattern[KT_GUARD]; /* the guard bands' bytes */
};

/* A failed CUDA runtime call ends the test (T_FATAL) with the error's name. */
static inline void kt_cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        T_FATAL("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Opens the context into g; salt varies the guard pattern between tests. Returns 0, or prints
 * "FATAL: <what>: <error>" and returns 1 (the caller's exit status). */
static inline int kt_gpu_open(struct kt_gpu *g, unsigned char salt)
{
    memset(g, 0, sizeof *g);
    for (int i = 0; i < KT_GUARD; i++)
        g->pattern[i] = (unsigned char)(salt ^ (i * 37 + 11));
    if (qc_device_create(QC_DEVICE_CUDA, 0, &g->dev) != QC_OK) {
        printf("FATAL: device: %s\n", qc_error_last());
        return 1;
    }
    struct qc_alloc_params ap;
    qc_alloc_params_default(&ap);
    ap.expandable = false;
    if (qc_alloc_create(g->dev, &ap, &g->alloc) != QC_OK) {
        printf("FATAL: allocator: %s\n", qc_error_last());
        return 1;
    }
    g->s = (cudaStream_t)qc_stream_native(qc_device_compute_stream(g->dev));
    if (qc_alloc_malloc(g->alloc, QC_KERNELS_CUDA_WORKSPACE_BYTES, NULL, "kernels/workspace",
                        &g->ws) != QC_OK) {
        printf("FATAL: workspace: %s\n", qc_error_last());
        return 1;
    }
    const struct qc_kernels_cuda_params kp = {.device = 0,
                                              .tf32 = false,
                                              .workspace = g->ws,
                                              .workspace_bytes = QC_KERNELS_CUDA_WORKSPACE_BYTES};
    if (qc_kernels_cuda_create(&kp, &g->kctx) != QC_OK) {
        printf("FATAL: op context: %s\n", qc_error_last());
        return 1;
    }
    qc_kernels_cuda_set_current(g->kctx);
    return 0;
}

/* Releases what kt_gpu_open made, in reverse order. */
static inline void kt_gpu_close(struct kt_gpu *g)
{
    qc_kernels_cuda_set_current(NULL);
    qc_kernels_cuda_destroy(g->kctx);
    if (g->ws)
        qc_alloc_free(g->alloc, g->ws, NULL);
    qc_alloc_destroy(g->alloc);
    qc_device_destroy(g->dev);
    memset(g, 0, sizeof *g);
}

/* A synchronous copy on g's stream (bytes = 0: nothing). */
static inline void kt_dcopy(const struct kt_gpu *g, void *dst, const void *src, size_t bytes,
                            enum cudaMemcpyKind kind)
{
    if (bytes == 0)
        return;
    kt_cuda_ok(cudaMemcpyAsync(dst, src, bytes, kind, g->s), "copy");
    kt_cuda_ok(cudaStreamSynchronize(g->s), "copy sync");
}

/* A guarded buffer of `bytes` data bytes from g's allocator (ends the test when out of memory):
 * returns the base; the data starts at base + KT_GUARD. */
static inline char *kt_dalloc_guarded(const struct kt_gpu *g, const char *name, size_t bytes)
{
    void *p = NULL;
    if (qc_alloc_malloc(g->alloc, bytes + 2 * KT_GUARD, NULL, name, &p) != QC_OK)
        T_FATAL("device alloc %s (%zu bytes): %s", name, bytes, qc_error_last());
    char *base = p;
    kt_dcopy(g, base, g->pattern, KT_GUARD, cudaMemcpyHostToDevice);
    kt_dcopy(g, base + KT_GUARD + bytes, g->pattern, KT_GUARD, cudaMemcpyHostToDevice);
    return base;
}

/* Expects both guard bands of the buffer at base (bytes of data) unchanged. */
static inline void kt_dguard_check(const struct kt_gpu *g, const char *name, const char *base,
                                   size_t bytes)
{
    unsigned char got[KT_GUARD];
    kt_dcopy(g, got, base, KT_GUARD, cudaMemcpyDeviceToHost);
    T_EXPECT(memcmp(got, g->pattern, KT_GUARD) == 0, "%s: guard band before the buffer written",
             name);
    kt_dcopy(g, got, base + KT_GUARD + bytes, KT_GUARD, cudaMemcpyDeviceToHost);
    T_EXPECT(memcmp(got, g->pattern, KT_GUARD) == 0, "%s: guard band after the buffer written",
             name);
}

#endif /* QC_TESTS_KERNELS_CUDA_TESTLIB_H */
