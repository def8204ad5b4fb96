/*
 * qc_emu.h — emulated device memory for tests: host memory that behaves like a device's for
 * the code around the ops. One PROT_NONE address-space reservation handed out in page-granular
 * blocks; it becomes readable and writable only between qc_emu_enter and qc_emu_leave, which
 * the op dispatch (kernels/qc_exec.h, backend EMU) calls around every op and memory move. Host
 * code that dereferences "device" memory anywhere else faults at once. Fresh and freed blocks
 * hold 0xFF bytes (a NaN pattern), as device memory holds garbage.
 *
 * The caching allocator can take its raw segments from an arena (so budgets, tags and the
 * memory report work unchanged on the EMU backend).
 *
 * The arena is the memory of one emulated device, of an ordinal (0 unless set), and the module
 * emulates the two pieces of the CUDA runtime that bind host threads to devices: the calling
 * thread's current device (cudaSetDevice / cudaGetDevice: per thread, 0 on a thread that never
 * chose one) and host-memory registration (cudaHostRegister / Unregister), which happens in
 * the context of the calling thread's current device. The emulated devices run in
 * exclusive-process mode: a registration made from a thread whose current device is not the
 * arena's is refused, as a GPU owned by another rank refuses the context a stray thread would
 * open on it; it is counted, so a test sees where every registration ran.
 *
 * Thread safety: every function may be called from any thread (one lock). Protection is
 * process-wide: while any thread is inside enter/leave the whole arena is open.
 */
#ifndef QC_BASE_QC_EMU_H
#define QC_BASE_QC_EMU_H

#include <stddef.h>
#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_emu; /* the arena (opaque) */

/* Reserves `reserve` bytes (rounded up to 2 MiB) of address space (PROT_NONE, not committed,
 * 2 MiB aligned and advised for transparent huge pages, which keeps the protection changes
 * around every op cheap) for the arena.
 * QC_ERR_NOMEM when the reservation fails. */
enum qc_status qc_emu_create(size_t reserve, struct qc_emu **out);
/* Unmaps the arena (live blocks included). NULL is a no-op. */
void qc_emu_destroy(struct qc_emu *e);
/* bytes (0 = one page) of arena memory, page aligned, filled with 0xFF; NULL when the
 * reservation is exhausted. */
void *qc_emu_alloc(struct qc_emu *e, size_t bytes);
/* Gives back a block of qc_emu_alloc (bytes as asked; refilled with 0xFF). NULL is a no-op; a
 * pointer not from the arena, or a double free, aborts. */
void qc_emu_free(struct qc_emu *e, void *p, size_t bytes);
/* Opens (enter) and closes (leave) the arena for host access; nested calls count. Used by the
 * dispatch; tests call them to inspect device memory directly. */
void qc_emu_enter(struct qc_emu *e);
void qc_emu_leave(struct qc_emu *e);
/* Bytes handed out now, and the most at once. */
size_t qc_emu_bytes_live(const struct qc_emu *e);
size_t qc_emu_bytes_peak(const struct qc_emu *e);

// ---- the emulated device's ordinal, thread binding and host registration ------------------

/* The ordinal of the device e emulates (>= 0; qc_emu_create gives 0). Set it before any
 * registration. */
void qc_emu_set_ordinal(struct qc_emu *e, int ordinal);
int qc_emu_ordinal(const struct qc_emu *e);
/* The calling thread's current emulated device (cudaSetDevice / cudaGetDevice): thread-local,
 * 0 on a thread that never set one. ordinal >= 0. */
void qc_emu_device_set(int ordinal);
int qc_emu_device_get(void);
/* cudaHostRegister, emulated: registers the host range [base, base + size) with e's device,
 * from the calling thread's current device. QC_ERR_CUDA (naming both ordinals) when that is
 * not e's ordinal (exclusive-process mode), or when base is already registered; QC_ERR_NOMEM
 * out of host memory. The range is only recorded, never touched. */
enum qc_status qc_emu_host_register(struct qc_emu *e, void *base, size_t size);
/* cudaHostUnregister, emulated: the same device rule; QC_ERR_CUDA for a base never
 * registered. */
enum qc_status qc_emu_host_unregister(struct qc_emu *e, void *base);

struct qc_emu_host_stats {
    uint64_t registers;      /* registrations accepted (made on e's device) */
    uint64_t unregisters;    /* unregistrations accepted */
    uint64_t refused;        /* (un)registrations refused: made from another current device */
    int refused_device;      /* the current device of the last refused one (-1: none) */
    size_t bytes_registered; /* Σ sizes of the ranges registered now */
    uint64_t n_registered;   /* ranges registered now */
};
void qc_emu_host_stats_get(struct qc_emu *e, struct qc_emu_host_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_EMU_H */
