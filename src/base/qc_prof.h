/*
 * qc_prof.h — the profiler's recorder: timed events from every layer (op dispatch, blocks,
 * step phases, loader, offload, allocator, optimizer) into per-thread buffers, for
 * `qctrain profile` (src/prof: the Chrome trace writer and the summary).
 *
 * Off by default. Every call site tests qc_prof_on() first: one load and one predictable
 * branch, nothing else, when profiling is off. When on:
 * - CPU: an event is [t0, t1) on CLOCK_MONOTONIC around the work, recorded by the thread that
 *   did it into its own buffer (no lock on the hot path), on that thread's track.
 * - CUDA: the op dispatch records a cudaEvent pair around the launch on the op's stream; the
 *   device times are resolved after the step (qc_prof_resolve) onto the stream's track.
 *
 * Glossary:
 *   span     an event with a duration: op, block, phase, loader wait, offload put/get, optimizer.
 *   op       one dispatch of a kernels op (kernels/exec.c), with its shape, bytes and FLOPs.
 *   block    one block application (an attention layer on one set of queries, an FE, an MLP),
 *            named by the model; ops inside it carry its name and pass.
 *   nested   an op that runs inside another op (the fused attention's tiles): it belongs to the
 *            top-level op `parent`. Inside a parallel team of n threads (qc_prof_team_begin) a
 *            nested op counts weight = 1/n of its duration toward the parent's wall time, so
 *            that Σ over a top-level op's nested ops (weighted) + its self time = its duration.
 *   track    a timeline: one per host thread, one per CUDA stream.
 *
 * Thread safety: events may be recorded from any thread. Start, stop, reset, resolve and the
 * readers run while no op runs (between steps). Blocks, phases and teams are begun and ended by
 * the thread that dispatches the model's ops.
 */
#ifndef QC_BASE_QC_PROF_H
#define QC_BASE_QC_PROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum qc_prof_cat {
    QC_PROF_CAT_OP = 0,  /* a kernels op (or a memory move) */
    QC_PROF_CAT_BLOCK,   /* a block application */
    QC_PROF_CAT_PHASE,   /* a step phase: step, forward, loss, backward */
    QC_PROF_CAT_LOADER,  /* waiting for the loader's next batch */
    QC_PROF_CAT_OFFLOAD, /* an offload put or get */
    QC_PROF_CAT_ALLOC,   /* an allocator event (instant) */
    QC_PROF_CAT_OPTIM,   /* the optimizer step */
    QC_PROF_CAT_COUNT
};

enum qc_prof_pass {
    QC_PROF_PASS_NONE = 0,
    QC_PROF_PASS_FORWARD,
    QC_PROF_PASS_BACKWARD,
    QC_PROF_PASS_RECOMPUTE, /* a forward re-run before its backward */
    QC_PROF_PASS_COUNT
};

/* The one table of each: "op", "block", "phase", "loader", "offload", "alloc", "optim"; and "",
 * "forward", "backward", "recompute" (the trace's "cat" and "pass", the summary's pass column).
 * "?" for a value out of range. */
const char *qc_prof_cat_str(enum qc_prof_cat cat);
const char *qc_prof_pass_str(enum qc_prof_pass pass);

/* What the dispatch knows about one op call. */
struct qc_prof_op {
    const char *name; /* static: "linear_forward" */
    const char *dims; /* static: the names of d[], comma-separated ("N,IC,OC"); "" = none */
    int64_t d[4];     /* the shape */
    double bytes;     /* bytes read + written, compulsory traffic (0 = not defined) */
    double flops;     /* floating-point operations (0 = not defined) */
};

/* One recorded event. */
struct qc_prof_event {
    int64_t t0, t1;     /* ns, CLOCK_MONOTONIC (device events: resolved onto the same clock) */
    const char *name;   /* static or interned */
    const char *dims;   /* ops: as struct qc_prof_op; else NULL */
    const char *block;  /* interned block application name at the time, or NULL */
    const char *detail; /* allocator tag, loader batch, offload tier (interned), or NULL */
    int64_t d[4];
    double bytes, flops;
    double value;    /* allocator: bytes allocated after the event */
    float weight;    /* nested ops: 1 / team threads; else 1 */
    int32_t id;      /* top-level ops: this op's id (> 0); else 0 */
    int32_t parent;  /* nested ops: the top-level op's id; else 0 */
    int32_t track;   /* qc_prof_track_info */
    uint8_t cat;     /* enum qc_prof_cat */
    uint8_t pass;    /* enum qc_prof_pass */
    uint8_t instant; /* no duration (t1 = t0) */
    uint8_t pending; /* device times not resolved yet */
    void *dev[2];    /* CUDA: the cudaEvent_t pair (pooled) */
};

/* A span in progress (the caller's stack). */
struct qc_prof_mark {
    int64_t t0;
    int32_t id, parent;      /* ops: as the event's */
    float weight;            /* ops: as the event's */
    const char *name;        /* spans: the interned name */
    const char *saved_block; /* spans: block and pass to restore at the end */
    uint8_t saved_pass;
    void *dev0;   /* CUDA: the begin event */
    void *stream; /* CUDA: the op's stream */
};

/* ---- the hot-path test ---------------------------------------------------------------------- */

extern int qc_prof_active; /* 0 = off; written only by qc_prof_start / qc_prof_stop */

static inline bool qc_prof_on(void)
{
    return __builtin_expect(qc_prof_active != 0, 0);
}

/* ---- session -------------------------------------------------------------------------------- */

/* Starts recording (the calling thread's track is "main"). Events of an earlier session stay
 * until qc_prof_reset. */
void qc_prof_start(void);
/* Stops recording (events stay readable). */
void qc_prof_stop(void);
/* Drops every event and track (recording must be stopped). */
void qc_prof_reset(void);
/* Resolves the device times of CUDA ops recorded so far (synchronizes each event; call after
 * the step's device work). QC_ERR_CUDA on a failed event query. No-op without CUDA. */
enum qc_status qc_prof_resolve(void);
/* Monotonic clock, ns. */
int64_t qc_prof_now_ns(void);

/* ---- recording (call only when qc_prof_on()) ------------------------------------------------ */

/* An op: begin before the work, end after it with its description. */
void qc_prof_op_begin(struct qc_prof_mark *m);
void qc_prof_op_end(const struct qc_prof_mark *m, const struct qc_prof_op *op);
/* The same for an op enqueued on a CUDA stream (cudaStream_t as void *): the device executes it
 * between two recorded events. Only in CUDA builds. */
void qc_prof_op_begin_stream(struct qc_prof_mark *m, void *stream);
void qc_prof_op_end_stream(const struct qc_prof_mark *m, const struct qc_prof_op *op);

/* A block, phase, loader, offload or optimizer span: name is interned (any lifetime). Block
 * spans make name the current block; block and phase spans with a pass other than NONE make it
 * the current pass, for the ops inside; the end restores both. detail may be NULL. */
void qc_prof_span_begin(struct qc_prof_mark *m, enum qc_prof_cat cat, const char *name,
                        enum qc_prof_pass pass);
void qc_prof_span_end(const struct qc_prof_mark *m, enum qc_prof_cat cat, const char *detail,
                      double bytes);

/* An instant event (allocator): name static, detail interned; value = bytes in use after it. */
void qc_prof_instant(enum qc_prof_cat cat, const char *name, const char *detail, double bytes,
                     double value);

/* Brackets a parallel region of n threads run by the calling thread inside an op: the ops
 * recorded by any thread until the end are nested in the current top-level op with weight
 * 1/n. */
void qc_prof_team_begin(int n);
void qc_prof_team_end(void);

/* ---- reading (recording stopped) ------------------------------------------------------------ */

struct qc_prof_track_info {
    int32_t id;
    bool device; /* a CUDA stream (else a host thread) */
    char name[48];
};

/* Tracks recorded so far, in id order; *n set. The array is owned by the recorder and valid
 * until the next start or reset. */
const struct qc_prof_track_info *qc_prof_tracks(int *n);
/* True when track is a CUDA stream's. */
bool qc_prof_track_is_device(int32_t track);
/* Calls fn for every event (any order across threads; in recording order within a thread). */
void qc_prof_foreach(void (*fn)(const struct qc_prof_event *e, void *ctx), void *ctx);
/* Events recorded so far, and events lost for want of memory. */
int64_t qc_prof_count(void);
int64_t qc_prof_lost(void);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_PROF_H */
