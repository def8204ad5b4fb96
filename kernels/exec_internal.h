/*
 * exec_internal.h — the dispatch's EMU bracket and profiler span (exec.c), shared with the
 * composite ops of kernels/ that dispatch outside exec.c (attn_fused.c). Private to kernels/.
 */
#ifndef QC_KERNELS_EXEC_INTERNAL_H
#define QC_KERNELS_EXEC_INTERNAL_H

struct qc_exec;
struct qc_prof_mark;
struct qc_prof_op;

/* Opens the emulated device of an EMU exec for the duration of a CPU op (nesting is fine: ops
 * called from ops); no-op for CPU and NULL. */
void kernels_exec_enter(const struct qc_exec *x);
void kernels_exec_leave(const struct qc_exec *x);

/* The profiler's op span (qc_prof.h) on x's backend: a cudaEvent pair on the op's stream on
 * CUDA, the host clock otherwise. Call only when qc_prof_on(). */
void kernels_prof_begin(struct qc_prof_mark *m, const struct qc_exec *x);
void kernels_prof_end(const struct qc_prof_mark *m, const struct qc_exec *x,
                      const struct qc_prof_op *op);

#endif /* QC_KERNELS_EXEC_INTERNAL_H */
