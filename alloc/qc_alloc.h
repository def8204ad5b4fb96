/*
 * qc_alloc.h — the caching device allocator: every byte of device memory qctrain uses comes
 * from here (alloc/README.md has the glossary and the invariants as equations).
 *
 * Design in one paragraph: requests are rounded (512 B) and served best-fit from the free
 * blocks of their stream and lifetime class (qc_alloc_malloc_life) in two pools (small <= 1 MiB
 * in 2 MiB segments; large in 20 MiB+ segments, or in one expandable segment per stream and
 * class that grows and shrinks in place). Free neighbours coalesce.
 * Frees are stream-ordered: a block freed on its own stream is reusable by that stream at once;
 * a block also used by other streams (qc_alloc_record_stream, or freed on another stream) is
 * reused only after events recorded on those streams complete. Reserved memory is capped by a
 * budget; a request that does not fit releases the cache and retries once, then fails with
 * QC_ERR_NOMEM and an OOM report (qc_error_last()). Every event can go to a trace ring and file
 * (docs/TRACE.md).
 *
 * Thread safety: every function may be called from any thread (one internal lock). Host
 * functions enqueued on device streams must not call into the allocator (the allocator may wait
 * for streams while holding its lock).
 */
#ifndef QC_ALLOC_QC_ALLOC_H
#define QC_ALLOC_QC_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_device.h"
#include "qc_emu.h"
#include "qc_pinned.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_alloc; /* caching device allocator (opaque) */

#define QC_ALLOC_TAG_MAX                                                                           \
    64 /* bytes kept of a tag, NUL included (= struct qc_alloc_event.tag:                          \
          the statistics and the trace keep the same 63 bytes); longer tags                        \
          are truncated */

/* Every block starts at a multiple of QC_ALLOC_ALIGN bytes (the stash lays its entries out at
 * 64-byte offsets from a block's start, src/mem/qc_stash.h; vector loads need at least 16). A
 * rounding below it (params.round 1..32, alloc.round) therefore acts as QC_ALLOC_ALIGN: requests
 * are rounded to qc_alloc_round_effective(round), which a simulation of the allocator (the
 * planner) must use too. */
#define QC_ALLOC_ALIGN ((size_t)64)

static inline size_t qc_alloc_round_effective(size_t round)
{
    return round < QC_ALLOC_ALIGN ? QC_ALLOC_ALIGN : round;
}

struct qc_alloc_params {
    size_t budget;          /* hard cap on reserved bytes; 0 = unlimited (device memory) */
    size_t round;           /* request rounding, bytes (512); a power of two; below
                               QC_ALLOC_ALIGN it acts as QC_ALLOC_ALIGN */
    size_t small_max;       /* requests <= this go to the small pool (1 MiB) */
    size_t small_segment;   /* small-pool segment size (2 MiB); also the large-segment rounding */
    size_t large_segment;   /* minimum large-pool segment (20 MiB), used for requests below half
                               of it when segments are not expandable */
    size_t split_limit;     /* free blocks larger than this are not split; 0 = no limit */
    bool expandable;        /* large pool: one expandable segment per stream (CUDA: VMM;
                               host: a PROT_NONE reservation committed with mprotect) */
    bool trace;             /* record events in the trace ring */
    size_t trace_capacity;  /* ring entries (65536) */
    const char *trace_file; /* NULL = ring only; else every event is also appended here */
    struct qc_emu *emu;     /* host backend only: raw segments come from this emulated-device
                               arena (qc_emu.h) instead of mmap, so an EMU model's memory is
                               protected between ops; NULL = mmap. Expandable segments are then
                               served as plain segments. */
};

/* Defaults: no budget, 512 B rounding, 1 MiB / 2 MiB / 20 MiB, no split limit, expandable
 * segments on, trace off (capacity 65536). */
void qc_alloc_params_default(struct qc_alloc_params *p);
/* The PyTorch-like configuration used for comparison (defaults with expandable off). */
void qc_alloc_params_pytorch_like(struct qc_alloc_params *p);

/* Creates an allocator for dev (CPU: host mmap backend, or the params.emu arena; CUDA:
 * cudaMalloc / VMM). dev may be NULL: host backend, streams must then be NULL. params NULL =
 * defaults. params.emu must outlive the allocator. Returns QC_ERR_INVALID for inconsistent
 * params (params.emu with a CUDA device included), QC_ERR_IO if the trace file cannot be
 * opened, QC_ERR_UNSUPPORTED for CUDA in a CPU-only build. */
enum qc_status qc_alloc_create(struct qc_device *dev, const struct qc_alloc_params *params,
                               struct qc_alloc **out);
/* Synchronizes the device, unmaps everything and frees the allocator (live blocks included).
 * NULL is a no-op. */
void qc_alloc_destroy(struct qc_alloc *a);

/* Stream-ordered: the block may be used by `stream` right away (NULL = the device's compute
 * stream). size 0 is served as the minimum block. tag names the tensor ("block/tensor"), may
 * be NULL. Returns QC_ERR_NOMEM with the OOM report as qc_error_last() when the request does
 * not fit the budget even after releasing the cache; *out is written only on QC_OK. */
enum qc_status qc_alloc_malloc(struct qc_alloc *a, size_t size, struct qc_stream *stream,
                               const char *tag, void **out);
/* How long a block will live, as its caller knows it (the memory context, from the step's
 * program): blocks of one class share segments, so what a step frees together leaves whole
 * segments free together, and a block that outlives its neighbours pins no segment of theirs.
 * A request goes to a segment of another class only when the budget allows no new one for its
 * own. qc_alloc_malloc is QC_ALLOC_LIFE_LONG. */
enum qc_alloc_life {
    QC_ALLOC_LIFE_LONG = 0, /* outlives the step's work, or not known */
    QC_ALLOC_LIFE_PHASE,    /* freed later in the step (activations, stashes, gradients) */
    QC_ALLOC_LIFE_SPAN,     /* freed inside the span that allocated it (a block's scratch) */
    QC_ALLOC_LIFE_COUNT
};
/* qc_alloc_malloc for a block of lifetime class life. */
enum qc_status qc_alloc_malloc_life(struct qc_alloc *a, size_t size, struct qc_stream *stream,
                                    enum qc_alloc_life life, const char *tag, void **out);
/* Frees p in the order of `stream` (NULL = compute stream): the memory becomes reusable once
 * the work enqueued so far on `stream` and on every stream recorded for p has completed.
 * NULL p is a no-op; a pointer not from this allocator aborts (programmer error). */
void qc_alloc_free(struct qc_alloc *a, void *p, struct qc_stream *stream);
/* Marks p as used by an extra stream: its free waits for that stream's work too. */
enum qc_status qc_alloc_record_stream(struct qc_alloc *a, void *p, struct qc_stream *stream);

/* Bytes usable at p (the rounded block size), 0 if p is not a live block. */
size_t qc_alloc_usable_size(struct qc_alloc *a, const void *p);
/* Waits for pending frees, synchronizes the device and unmaps every cached free segment (and
 * every free granule of expandable segments). */
enum qc_status qc_alloc_empty_cache(struct qc_alloc *a);
/* Sets the step number carried by later trace events (and records a step event). */
void qc_alloc_set_step(struct qc_alloc *a, int64_t step);
/* Checks every internal invariant (alloc/README.md); QC_ERR_INVALID with the first violation.
 * O(blocks): for tests and benchmarks that verify as they measure. */
enum qc_status qc_alloc_check(struct qc_alloc *a);

// ---- statistics ------------------------------------------------------------------------------

/* One snapshot. allocated = Σ rounded sizes of live blocks; requested = Σ their requested
 * sizes; active = allocated + blocks freed but waiting on stream events; reserved = bytes
 * mapped from the raw backend. Peaks are since creation or the last qc_alloc_reset_peak(). */
struct qc_alloc_stats {
    size_t bytes_allocated;
    size_t bytes_allocated_peak;
    size_t bytes_requested;
    size_t bytes_requested_peak;
    size_t bytes_active;
    size_t bytes_active_peak;
    size_t bytes_reserved;
    size_t bytes_reserved_peak;
    size_t bytes_reserved_small; /* of bytes_reserved, in the small pool */
    size_t bytes_budget;         /* params.budget (0 = unlimited) */
    size_t bytes_largest_free;   /* largest mapped free block (any stream) */
    uint64_t n_allocs;           /* successful qc_alloc_malloc calls */
    uint64_t n_frees;            /* qc_alloc_free calls */
    uint64_t n_live;             /* live blocks now */
    uint64_t n_pending;          /* freed blocks waiting on events now */
    uint64_t n_segments;         /* segments now (expandable ones count once) */
    uint64_t n_maps;             /* raw map/commit calls */
    uint64_t n_unmaps;           /* raw unmap/decommit calls */
    uint64_t n_retries;          /* cache releases followed by a retry */
    uint64_t n_ooms;             /* requests that failed with QC_ERR_NOMEM */
    double fragmentation;        /* bytes_reserved_peak / bytes_allocated_peak (1 if none) */
    int64_t step;                /* last qc_alloc_set_step */
};

void qc_alloc_stats_get(struct qc_alloc *a, struct qc_alloc_stats *out);
/* Sets every peak to its current value (call at the start of a step for per-step peaks) and
 * restarts the step peak snapshot from what is live now (O(distinct tags)); run-wide peaks and
 * the run-wide snapshot are kept. */
void qc_alloc_reset_peak(struct qc_alloc *a);
/* Statistics with every peak taken since creation: qc_alloc_reset_peak does not reset these
 * (it folds the step's peaks into them). fragmentation is from the run-wide peaks. */
void qc_alloc_stats_get_run(struct qc_alloc *a, struct qc_alloc_stats *out);

// ---- peak snapshot ---------------------------------------------------------------------------

#define QC_ALLOC_PEAK_TOP 32 /* tags (and blocks) kept by name in a peak snapshot */

/* Live bytes of one tag (or one block: the tag's prefix before its first '/'; a tag without
 * '/' is its own block, less a trailing ".stash" or ".out"). Untagged allocations count as
 * "(untagged)"; the remainder bucket of a snapshot is named "other". */
struct qc_alloc_tag_bytes {
    char name[QC_ALLOC_TAG_MAX]; /* NUL-terminated */
    size_t bytes;                /* Σ rounded sizes of its live blocks, bytes */
    uint64_t blocks;             /* its live allocations */
};

/* Who held the memory at the peak. The allocator takes a snapshot whenever bytes_allocated
 * exceeds the last snapshot's bytes_allocated by more than 1 % (allocated > snap + snap/100,
 * integer division), so between snapshots:
 *   bytes_allocated <= bytes_allocated_peak <= bytes_allocated + bytes_allocated / 100,
 * Live bytes by tag and by block are running totals (one hash of the tag per allocation, O(1)
 * per free), so a snapshot costs O(distinct tags + blocks), only on those events. Exact
 * identities:
 *   bytes_allocated = Σ tags[i].bytes + tag_other.bytes = Σ blocks[i].bytes + block_other.bytes.
 * Two windows: the run-wide one (since creation) and the step one (since the last
 * qc_alloc_reset_peak, which takes a snapshot of the live blocks at once). */
struct qc_alloc_peak_snapshot {
    int64_t step;                /* qc_alloc_set_step value when taken; -1: none taken yet */
    size_t bytes_allocated;      /* allocated when taken, bytes */
    size_t bytes_reserved;       /* reserved when taken, bytes */
    size_t bytes_reserved_live;  /* of those, the segments (fixed) and granules (expandable)
                                    holding a live or pending block: reserved less the cache,
                                    so bytes_reserved_live / bytes_allocated is the
                                    fragmentation at the peak, whatever earlier steps left
                                    cached; bytes_allocated <= it <= bytes_reserved */
    size_t bytes_allocated_peak; /* the window's true allocated peak (filled on read), bytes */
    uint64_t n_snapshots;        /* snapshots taken in the window */
    uint64_t n_tags;             /* distinct tags live when taken */
    uint64_t n_blocks;           /* distinct blocks live when taken */
    uint32_t ntop_tags;          /* entries used in tags[], largest first (ties by name) */
    uint32_t ntop_blocks;        /* entries used in blocks[], largest first */
    struct qc_alloc_tag_bytes tags[QC_ALLOC_PEAK_TOP];
    struct qc_alloc_tag_bytes tag_other; /* tags beyond the top QC_ALLOC_PEAK_TOP */
    struct qc_alloc_tag_bytes blocks[QC_ALLOC_PEAK_TOP];
    struct qc_alloc_tag_bytes block_other; /* blocks beyond the top QC_ALLOC_PEAK_TOP */
};

/* The run-wide snapshot (since creation). */
void qc_alloc_peak_snapshot(struct qc_alloc *a, struct qc_alloc_peak_snapshot *out);
/* The step snapshot (since the last qc_alloc_reset_peak, or creation). */
void qc_alloc_peak_snapshot_step(struct qc_alloc *a, struct qc_alloc_peak_snapshot *out);
/* The block name of a tag (rule above) into out (QC_ALLOC_TAG_MAX bytes). Returns out. */
char *qc_alloc_tag_block(const char *tag, char *out);

/* Formats a memory report into buf (always NUL-terminated; truncated to cap): requested (when
 * requested > 0: the OOM header), budget, reserved, allocated, active, largest free block,
 * fragmentation, then the 10 tags holding the most live bytes. Returns the length it needed. */
size_t qc_alloc_report_format(struct qc_alloc *a, size_t requested, char *buf, size_t cap);
/* "1.50 GiB" style bytes into buf (cap >= 16). Returns buf. */
const char *qc_alloc_bytes_str(size_t bytes, char *buf, size_t cap);

// ---- trace -----------------------------------------------------------------------------------

enum qc_alloc_event_kind {
    QC_ALLOC_EV_ALLOC = 1, /* addr/size: the block; requested: asked bytes */
    QC_ALLOC_EV_FREE,      /* qc_alloc_free was called */
    QC_ALLOC_EV_READY,     /* a deferred free's events completed; the block is reusable */
    QC_ALLOC_EV_MAP,       /* raw memory mapped (segment created or expanded) */
    QC_ALLOC_EV_UNMAP,     /* raw memory unmapped */
    QC_ALLOC_EV_OOM,       /* a request failed; size: rounded request */
    QC_ALLOC_EV_STEP,      /* qc_alloc_set_step */
    /* marks of the memory system (qc_alloc_trace_mark): they change no allocator figure */
    QC_ALLOC_EV_OFFLOAD_PUT, /* a stash's copy to an offload tier was issued; pool: the tier */
    QC_ALLOC_EV_OFFLOAD_GET, /* its fetch back was issued (addr: the new block) */
    QC_ALLOC_EV_RECOMPUTE,   /* a block's forward re-runs to rebuild its stash (size: bytes) */
};

/* The tier of an offload mark's pool field. */
enum { QC_ALLOC_TIER_HOST = 0, QC_ALLOC_TIER_NVME = 1 };

/* One trace record, exactly as stored in the ring and written to the file (docs/TRACE.md). */
struct qc_alloc_event {
    uint64_t t_ns;            /* CLOCK_MONOTONIC, ns */
    uint64_t addr;            /* block or mapping address */
    uint64_t size;            /* block or mapping bytes */
    uint64_t requested;       /* ALLOC: bytes asked for; else 0 */
    int64_t step;             /* qc_alloc_set_step value */
    uint64_t bytes_allocated; /* after the event */
    uint64_t bytes_reserved;  /* after the event */
    uint32_t stream;          /* qc_stream_id */
    uint16_t kind;            /* enum qc_alloc_event_kind */
    uint16_t pool;            /* 0 small, 1 large */
    char tag[64];             /* NUL-terminated */
};

const char *qc_alloc_event_kind_str(enum qc_alloc_event_kind kind);
/* Records a mark of the memory system in the trace (no-op when tracing is off): an offload put
 * or get (addr/size: the device block, stream: the copy stream's id, tier: QC_ALLOC_TIER_*) or
 * a recompute (addr 0, size: the stash bytes rebuilt, tier 0), tag: the tensor or block. The
 * allocator's totals are the current ones. */
void qc_alloc_trace_mark(struct qc_alloc *a, enum qc_alloc_event_kind kind, const void *addr,
                         size_t size, uint32_t stream, int tier, const char *tag);
/* Copies the newest min(max, available) ring events, oldest first, into out; *n = count.
 * Returns the number of events recorded since creation (those overwritten included). */
uint64_t qc_alloc_trace_read(struct qc_alloc *a, struct qc_alloc_event *out, size_t max, size_t *n);
/* Flushes the trace file (also done by destroy). */
enum qc_status qc_alloc_trace_flush(struct qc_alloc *a);
/* Writes n events (e.g. one step's, from qc_alloc_trace_read) as a trace file of the documented
 * format (docs/TRACE.md; header from a's parameters and creation time), atomically: PATH.tmp,
 * fsync, rename. Works whether or not a has a trace file of its own. QC_ERR_IO naming the file. */
enum qc_status qc_alloc_trace_write_file(struct qc_alloc *a, const char *path,
                                         const struct qc_alloc_event *ev, size_t n);
/* Reads a whole trace file (docs/TRACE.md) into a malloc'ed array the caller frees. */
enum qc_status qc_alloc_trace_load(const char *path, struct qc_alloc_event **events, size_t *n);

#ifdef __cplusplus
}
#endif

#endif /* QC_ALLOC_QC_ALLOC_H */
