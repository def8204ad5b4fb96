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
 * Thread safety: register and unregister may be called from any thread.
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

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_CLEANUP_H */
