/*
 * qc_cleanup.h — files removed if the process ends early: on SIGINT/SIGTERM and at exit().
 *
 * Writers register the temporary or spill files they create (the offload engine's spill file,
 * the `.tmp` files of the qcshard and safetensors writers) and unregister them once the name is
 * gone or has become the real output (after unlink or rename). A registered path is unlinked by
 * an async-signal-safe SIGINT/SIGTERM handler, which then restores the previous disposition and
 * re-raises so the process still dies of the signal; if the program had installed a handler of
 * its own (a graceful stop), that handler is called instead and the owner cleans up as usual.
 * An atexit() hook unlinks whatever is still registered at exit(). SIGKILL cannot be caught:
 * files that must never stay behind are unlinked right after open (the offload engine does).
 *
 * Graceful stop (the trainer, docs/RELIABILITY.md): between qc_cleanup_stop_begin and
 * qc_cleanup_stop_end the FIRST SIGINT or SIGTERM only records itself (async-signal-safe: one
 * atomic store) and the process goes on; its owner polls qc_cleanup_stop_signal() at safe
 * points, finishes its unit of work, saves, and exits with 128 + signal (130 / 143). A second
 * signal ends the process at once through the path above (registered files unlinked, the
 * signal re-raised), so whatever the owner had completed stays.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef QC_BASE_QC_CLEANUP_H
#define QC_BASE_QC_CLEANUP_H

#ifdef __cplusplus
extern "C" {
#endif

#define QC_CLEANUP_MAX 32 /* paths registered at once */

/* Registers path (copied; at most PATH_MAX - 1 bytes) and, on the first call, installs the
 * handlers. Returns the slot to unregister, or -1 when all QC_CLEANUP_MAX slots are in use (the
 * path is then not removed on a signal: the caller may warn). */
int qc_cleanup_register(const char *path);
/* Forgets a slot from qc_cleanup_register (does not unlink). -1 is a no-op. */
void qc_cleanup_unregister(int slot);

/* Arms the graceful stop (installing the handlers if needed) and forgets any earlier request. */
void qc_cleanup_stop_begin(void);
/* Disarms it: later signals take the ordinary path. The recorded signal stays readable. */
void qc_cleanup_stop_end(void);
/* The signal that requested a graceful stop since the last qc_cleanup_stop_begin (SIGINT or
 * SIGTERM), or 0; after qc_cleanup_stop_agree, the agreed one. */
int qc_cleanup_stop_signal(void);
/* The owner stops for sig although this process may not have received it (several ranks agree
 * on one rank's signal, so that every rank stops alike and exits 128 + sig): from now on
 * qc_cleanup_stop_signal() returns sig. It does not count as a received signal: the first
 * SIGINT / SIGTERM that arrives afterwards still only records itself. */
void qc_cleanup_stop_agree(int sig);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_CLEANUP_H */
