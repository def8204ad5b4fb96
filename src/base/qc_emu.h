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
 * Thread safety: every function may be called from any thread (one lock). Protection is
 * process-wide: while any thread is inside enter/leave the whole arena is open.
 */
#ifndef QC_BASE_QC_EMU_H
#define QC_BASE_QC_EMU_H

#include <stddef.h>

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

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_EMU_H */
