/*
 * qc_pinned.h — the pinned host allocator: a jemalloc arena whose extents come from our own
 * extent hooks, which map host memory; each extent is pinned once (cudaHostRegister on a CUDA
 * device, outside jemalloc's hooks and locks, before any allocation in it is returned; plain
 * memory on the CPU backend). Offload staging buffers and loader batches come
 * from here, so no tensor pays for a cudaHostAlloc. Extents are kept for the arena's lifetime
 * (never unpinned in between); the budget caps the bytes mapped by the hooks.
 *
 * Devices: an arena belongs to one device (a rank's). Each pin and unpin selects that device on
 * the calling thread first (cudaSetDevice; the emulated one on EMU), so allocating from any
 * thread, a loader worker that never chose a device included, registers the memory with the
 * rank's own GPU, never with device 0. The calling thread's current device is left at the
 * arena's.
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef QC_ALLOC_QC_PINNED_H
#define QC_ALLOC_QC_PINNED_H

#include <stddef.h>
#include <stdint.h>

#include "qc_device.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_pinned;

/* dev NULL or CPU: plain memory; CUDA: extents are cudaHostRegister'ed with dev's device
 * (qc_device_ordinal). budget: cap on bytes mapped by the arena's hooks (0 = unlimited). */
enum qc_status qc_pinned_create(struct qc_device *dev, size_t budget, struct qc_pinned **out);
/* The EMU backend's: extents are registered with the emulated device of emu (qc_emu.h:
 * qc_emu_ordinal, the thread selection and registration rules of CUDA), which must outlive
 * the arena. */
struct qc_emu;
enum qc_status qc_pinned_create_emu(struct qc_emu *emu, size_t budget, struct qc_pinned **out);
/* Frees every allocation still live, unpins and unmaps all extents. NULL is a no-op. */
void qc_pinned_destroy(struct qc_pinned *p);
/* align: 0 or a power of two (at most 1 MiB); size 0 is served as 1 byte. Returns QC_ERR_NOMEM
 * (message with requested, reserved, budget) when the arena cannot grow within the budget. */
enum qc_status qc_pinned_malloc(struct qc_pinned *p, size_t size, size_t align, const char *tag,
                                void **out);
void qc_pinned_free(struct qc_pinned *p, void *ptr); /* NULL is a no-op */

struct qc_pinned_stats {
    size_t bytes_allocated; /* Σ usable sizes of live allocations */
    size_t bytes_allocated_peak;
    size_t bytes_reserved; /* mapped by the extent hooks */
    size_t bytes_reserved_peak;
    size_t bytes_pinned; /* of bytes_reserved, pinned (cudaHostRegister'ed; 0 on the CPU) */
    size_t bytes_budget;
    uint64_t n_allocs;
    uint64_t n_frees;
    uint64_t n_live;
    uint64_t n_extents; /* extents mapped by the hooks */
    uint64_t n_ooms;
    uint64_t n_pin_failures; /* allocations refused because their extent could not be pinned */
    double fragmentation;    /* bytes_reserved_peak / bytes_allocated_peak (1 if none) */
    int device;              /* the device extents are registered with; -1: plain memory */
};

void qc_pinned_stats_get(struct qc_pinned *p, struct qc_pinned_stats *out);
void qc_pinned_reset_peak(struct qc_pinned *p);

#ifdef __cplusplus
}
#endif

#endif /* QC_ALLOC_QC_PINNED_H */
