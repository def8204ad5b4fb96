/*
 * qc_profile.h — what `qctrain profile` makes of the recorder's events (src/base/qc_prof.h):
 * the machine's reference rates, the Chrome trace file, and the summary.
 *
 *   peaks    one large SGEMM (1 thread and all threads on the CPU; the device on CUDA) and one
 *            large copy, timed on the backend the step runs on: the physical limits the ops are
 *            measured against.
 *   trace    Chrome trace-event JSON ({"traceEvents": [...]}) that Perfetto (ui.perfetto.dev)
 *            and chrome://tracing open as they are: process 1 = the host, one track per thread;
 *            process 2 = the device, one track per CUDA stream; ops, blocks, phases, loader,
 *            offload and optimizer as complete events ("X") with their shape, bytes, FLOPs,
 *            block and pass as args; allocator events as instants plus an "allocated bytes"
 *            counter track.
 *   summary  per step: the top ops and blocks by time, GEMM's share of the step, achieved
 *            GFLOP/s per GEMM shape against the SGEMM peak, memory-bound ops' GB/s against the
 *            copy rate.
 *
 * Time attribution ("wall" in the summary): a top-level op counts its duration minus its nested
 * ops' weighted durations (qc_prof.h); a nested op counts duration × weight, so the ops of a
 * parallel tile loop on n threads share the loop's wall time. Σ wall over all ops = the time
 * the dispatching thread spent inside ops; the rest of the step is host code (graph build
 * waits, bookkeeping), shown as "outside ops".
 */
#ifndef QC_PROF_QC_PROFILE_H
#define QC_PROF_QC_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_exec;
struct qc_alloc;

/* The reference rates of the backend. */
struct qc_profile_peaks {
    bool device;          /* measured on a CUDA device (else the CPU) */
    int threads;          /* CPU: OpenMP / BLAS threads of the "all" figure */
    int64_t gemm_n;       /* the SGEMM's size: n × n × n */
    double gemm_gflops_1; /* CPU: one thread (0 on the device) */
    double gemm_gflops_n; /* all threads, or the device */
    double copy_gbs;      /* one large copy: (bytes read + bytes written) / s */
};

/* Times the SGEMM (n = gemm_n, best of 3) and a 64 MiB copy (best of 5) on ex, with buffers
 * from a (the backend's memory). QC_ERR_NOMEM, QC_ERR_CUDA. */
enum qc_status qc_profile_peaks_measure(const struct qc_exec *ex, struct qc_alloc *a,
                                        int64_t gemm_n, struct qc_profile_peaks *out);

/* Writes the recorded events as Chrome trace JSON to path, atomically (path.tmp, then rename):
 * the file is whole or absent. QC_ERR_IO naming the file. */
enum qc_status qc_profile_trace_write(const char *path);

struct qc_profile_summary; /* aggregated from the recorded events (opaque) */

/* Aggregates the recorded events of `steps` profiled steps (each inside a "step" phase span).
 * QC_ERR_NOMEM. */
enum qc_status qc_profile_summary_create(const struct qc_profile_peaks *peaks, int64_t steps,
                                         struct qc_profile_summary **out);
void qc_profile_summary_destroy(struct qc_profile_summary *s);
/* The GEMMs (linear_* ops) per profiled step: FLOPs and attributed wall seconds (the summary's
 * "GEMM (linear_*)" line). */
void qc_profile_summary_gemm(const struct qc_profile_summary *s, double *flops, double *wall_s);
/* The text summary, `top` rows per table. */
void qc_profile_summary_print(const struct qc_profile_summary *s, FILE *f, int top);
/* The same as one JSON object (caller deletes). NULL on allocation failure. */
cJSON *qc_profile_summary_json(const struct qc_profile_summary *s, int top);

#ifdef __cplusplus
}
#endif

#endif /* QC_PROF_QC_PROFILE_H */
