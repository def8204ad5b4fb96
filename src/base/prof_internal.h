/*
 * prof_internal.h — what the recorder (prof.c), its CUDA half (prof_cuda.c) and the session
 * (prof_session.c) share.
 * Private to src/base.
 */
#ifndef QC_BASE_PROF_INTERNAL_H
#define QC_BASE_PROF_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "qc_prof.h"

/* A new event slot of the calling thread's buffer, zeroed but for track, block, pass and
 * weight (1); NULL when out of memory (the event is lost, counted). */
struct qc_prof_event *prof_event_new(void);
/* The calling thread's newest event (NULL when none). */
struct qc_prof_event *prof_event_last(void);
/* The track of a CUDA stream (created on first use, named "cuda stream <n>"). */
int32_t prof_stream_track(void *stream);
/* Calls fn for every event still waiting for its device times. */
void prof_foreach_pending(void (*fn)(struct qc_prof_event *e, void *ctx), void *ctx);

/* The host half of a session (prof.c): the main thread noted at start; every buffer, track,
 * interned name and counter released at reset. prof_session.c calls them. */
void prof_host_start(void);
void prof_host_reset(void);

/* prof_cuda.c (CUDA builds; prof_session.c's no-ops otherwise): the reference point of the
 * device clock, taken at start, and the release of the event pool at reset. */
void prof_cuda_start(void);
void prof_cuda_reset(void);

#endif /* QC_BASE_PROF_INTERNAL_H */
