/*
 * device_testlib.h — the backends of the device tests (test_*_device.c): where one run's
 * memory comes from and where its ops run. CPU (malloc, NULL exec), EMU (an emulated-device
 * arena, src/base/qc_emu.h, with a memory context straight over it) and CUDA (device 0, the
 * caching allocator, a workspace, a pinned upload staging ring and this thread's op context;
 * TF32 off, since the CPU reference is exact fp32; skip-or-fail by tests/cuda_probe.h).
 * Header-only, for tests.
 */
#ifndef QC_TESTS_DEVICE_TESTLIB_H
#define QC_TESTS_DEVICE_TESTLIB_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "qc_emu.h"
#include "qc_exec.h"
#include "qc_memctx.h"
#include "qc_status.h"
#include "cuda_probe.h"
#ifdef QC_HAVE_CUDA
#    include "qc_alloc.h"
#    include "qc_device.h"
#    include "qc_kernels.h"
#    include "qc_pinned.h"
#endif

struct qc_test_backend {
    const char *name; /* "cpu", "emu", "cuda" */
    enum qc_exec_backend kind;
    struct qc_exec ex;
    struct qc_memctx *mc; /* memory of the backend (NULL = host malloc on the CPU) */
    struct qc_emu *emu;   /* EMU */
#ifdef QC_HAVE_CUDA
    struct qc_device *dev; /* CUDA */
    struct qc_alloc *alloc;
    struct qc_kernels_cuda *kctx;
    void *ws;
    struct qc_pinned *pinned; /* the op context's upload staging ring */
    void *staging;
#endif
};

/* The exec a caller passes: NULL on the CPU, as the trainer does. */
static inline const struct qc_exec *qc_test_backend_exec(const struct qc_test_backend *b)
{
    return b->kind == QC_EXEC_CPU ? NULL : &b->ex;
}

static inline void qc_test_backend_cpu(struct qc_test_backend *b)
{
    memset(b, 0, sizeof *b);
    b->name = "cpu";
    b->kind = QC_EXEC_CPU;
}

/* An arena of `reserve` bytes of address space; false (with a message) when it cannot be had. */
static inline bool qc_test_backend_emu(struct qc_test_backend *b, size_t reserve)
{
    memset(b, 0, sizeof *b);
    b->name = "emu";
    b->kind = QC_EXEC_EMU;
    if (qc_emu_create(reserve, &b->emu) != QC_OK) {
        printf("  emu arena: %s\n", qc_error_last());
        return false;
    }
    b->ex = (struct qc_exec){.backend = QC_EXEC_EMU, .stream = NULL, .emu = b->emu, .precision = 0};
    const struct qc_memctx_params mp = {.emu = b->emu};
    if (qc_memctx_create(&mp, &b->mc) != QC_OK) {
        printf("  emu memory context: %s\n", qc_error_last());
        return false;
    }
    return true;
}

/* CUDA device 0 ready for ops: 0; 77 (skip, message printed) where there is no GPU, no driver
 * or a CPU-only build (tests/cuda_probe.h); 1 (message printed) when a GPU is there but the
 * setup fails, its initialisation included. */
static inline int qc_test_backend_cuda(struct qc_test_backend *b)
{
    memset(b, 0, sizeof *b);
    b->name = "cuda";
    b->kind = QC_EXEC_CUDA;
    const int probe = qc_test_cuda_probe();
    if (probe != 0)
        return probe;
#ifdef QC_HAVE_CUDA
    if (qc_device_create(QC_DEVICE_CUDA, 0, &b->dev) != QC_OK) {
        printf("FATAL: device: %s\n", qc_error_last());
        return 1;
    }
    /* pinned memory for the op context's upload ring: uploads run as in the trainer */
    if (qc_pinned_create(b->dev, 0, &b->pinned) != QC_OK ||
        qc_pinned_malloc(b->pinned, QC_KERNELS_CUDA_STAGING_BYTES, 4096, "kernels/staging",
                         &b->staging) != QC_OK) {
        printf("FATAL: pinned staging ring: %s\n", qc_error_last());
        return 1;
    }
    struct qc_alloc_params ap;
    qc_alloc_params_default(&ap);
    if (qc_alloc_create(b->dev, &ap, &b->alloc) != QC_OK) {
        printf("FATAL: allocator: %s\n", qc_error_last());
        return 1;
    }
    if (qc_alloc_malloc(b->alloc, QC_KERNELS_CUDA_WORKSPACE_BYTES, NULL, "kernels/workspace",
                        &b->ws) != QC_OK) {
        printf("FATAL: workspace: %s\n", qc_error_last());
        return 1;
    }
    const struct qc_kernels_cuda_params kp = {.device = 0,
                                              .tf32 = false,
                                              .workspace = b->ws,
                                              .workspace_bytes = QC_KERNELS_CUDA_WORKSPACE_BYTES,
                                              .staging = b->staging,
                                              .staging_bytes = QC_KERNELS_CUDA_STAGING_BYTES};
    if (qc_kernels_cuda_create(&kp, &b->kctx) != QC_OK) {
        printf("FATAL: op context: %s\n", qc_error_last());
        return 1;
    }
    qc_kernels_cuda_set_current(b->kctx);
    b->ex = (struct qc_exec){.backend = QC_EXEC_CUDA,
                             .stream = qc_stream_native(qc_device_compute_stream(b->dev)),
                             .emu = NULL,
                             .precision = 0};
    const struct qc_memctx_params mp = {.alloc = b->alloc,
                                        .compute = qc_device_compute_stream(b->dev)};
    if (qc_memctx_create(&mp, &b->mc) != QC_OK) {
        printf("FATAL: memory context: %s\n", qc_error_last());
        return 1;
    }
    return 0;
#else
    return 77; /* not reached: the probe skips a CPU-only build */
#endif
}

static inline void qc_test_backend_destroy(struct qc_test_backend *b)
{
    qc_memctx_destroy(b->mc);
    qc_emu_destroy(b->emu);
#ifdef QC_HAVE_CUDA
    if (b->kctx) {
        qc_kernels_cuda_set_current(NULL);
        qc_kernels_cuda_destroy(b->kctx);
    }
    if (b->ws)
        qc_alloc_free(b->alloc, b->ws, NULL);
    qc_alloc_destroy(b->alloc);
    qc_pinned_destroy(b->pinned); /* the staging ring with it */
    qc_device_destroy(b->dev);
#endif
    memset(b, 0, sizeof *b);
}

#endif /* QC_TESTS_DEVICE_TESTLIB_H */
