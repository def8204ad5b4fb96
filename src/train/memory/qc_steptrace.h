/*
 * qc_steptrace.h — the allocation trace of a few chosen training steps, kept in the run folder
 * for `qctrain report`: RUN/trace/step-<step, 6+ digits>.qctrace (the trace file format of
 * docs/TRACE.md, one step's events) and RUN/trace/index.json (which steps, why, and what was
 * live when each began). docs/TRACE.md documents both.
 *
 * Which steps (of the steps this process runs):
 *   first   the first QC_STEPTRACE_FIRST steps (warm-up: the cache is filled there);
 *   peak    the step with the largest allocated peak so far (replaced when a later step peaks
 *           higher; the previous one's file goes unless it is kept for another reason);
 *   every   steps that are multiples of alloc.trace_every (0 = none);
 *   oom     steps that ran out of memory (an allocation failed, or the trainer re-planned:
 *           qc_steptrace_mark_replans), whatever alloc.trace_every says; index.json gives each
 *           "oom_events" (failed allocations) and "replans";
 *   failed  the step the run stopped at with an error (qc_steptrace_end_failed).
 * Bound: the files together stay within alloc.trace_max_bytes. When a new step would pass it,
 * the oldest "every" steps are dropped first; the other steps are never dropped (a
 * step that still does not fit is skipped and logged once). A step with more events than the
 * allocator's trace ring (65536) keeps its newest events and says how many were lost.
 *
 * The events come from the allocator's ring (qc_alloc_trace_read), so this needs alloc.trace
 * (on by default). A new process run (fresh or resumed) replaces the previous run's step traces
 * when it records its first step, like memory.json.
 */
#ifndef QC_MEMORY_QC_STEPTRACE_H
#define QC_MEMORY_QC_STEPTRACE_H

#include <stdint.h>

#include "qc_alloc.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_STEPTRACE_FIRST 2 /* steps of a process run always kept */

struct qc_steptrace; /* the recorder of one process run (opaque) */

/* A recorder writing into RUN/trace/ (created on the first write) from allocator a, which must
 * have its trace ring on. every: alloc.trace_every; max_bytes: alloc.trace_max_bytes (> 0).
 * QC_ERR_NOMEM, QC_ERR_INVALID for a path too long. */
enum qc_status qc_steptrace_create(struct qc_alloc *a, const char *run_dir, int64_t every,
                                   uint64_t max_bytes, struct qc_steptrace **out);
/* NULL is a no-op. Keeps the files. */
void qc_steptrace_destroy(struct qc_steptrace *s);

/* Marks the start of step `step` (1 for the first): call right after qc_alloc_set_step and
 * qc_alloc_reset_peak, before the step allocates (it records what is live then). */
void qc_steptrace_begin(struct qc_steptrace *s, int64_t step);
/* Ends the step begun last: bytes_allocated_peak / bytes_reserved_peak are the step's peaks
 * (qc_alloc_stats_get after the step). Writes the step's file and the index when the step is
 * kept. QC_ERR_IO naming the file (the run folder not writable, disk full). */
enum qc_status qc_steptrace_end(struct qc_steptrace *s, uint64_t bytes_allocated_peak,
                                uint64_t bytes_reserved_peak);

/* Notes that the step in progress rolled back and re-planned `replans` groups after running
 * out of memory (the trainer knows; an allocator failure is seen without it): such a step is
 * kept with the reason "oom", and index.json gives its "replans". NULL is a no-op. */
void qc_steptrace_mark_replans(struct qc_steptrace *s, int64_t replans);
/* Ends the step begun last as the one the run stops at (an error in the step): kept, with the
 * reason "failed" (and "oom" when an allocation failed), so the report can show it. No step
 * begun: a no-op. Same errors. */
enum qc_status qc_steptrace_end_failed(struct qc_steptrace *s, uint64_t bytes_allocated_peak,
                                       uint64_t bytes_reserved_peak);

#ifdef __cplusplus
}
#endif

#endif /* QC_MEMORY_QC_STEPTRACE_H */
