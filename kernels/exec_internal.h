/*
 * exec_internal.h — the dispatch's EMU bracket (exec.c), shared with the composite ops of
 * kernels/ that dispatch outside exec.c (attn_fused.c). Private to kernels/.
 */
#ifndef QC_KERNELS_EXEC_INTERNAL_H
#define QC_KERNELS_EXEC_INTERNAL_H

struct qc_exec;

/* Opens the emulated device of an EMU exec for the duration of a CPU op (nesting is fine: ops
 * called from ops); no-op for CPU and NULL. */
void kernels_exec_enter(const struct qc_exec *x);
void kernels_exec_leave(const struct qc_exec *x);

#endif /* QC_KERNELS_EXEC_INTERNAL_H */
