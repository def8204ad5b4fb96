/*
 * alloc_internal.h — shared inside alloc/ only: the raw-memory seam, the allocator's data
 * structures, statistics and trace helpers.
 *
 * Glossary (README.md has the long version):
 *   segment  one mapping from the raw backend: a fixed cudaMalloc/mmap range, or an expandable
 *            VA reservation whose granules are committed on demand;
 *   block    a contiguous piece of a segment; the blocks of a segment tile it exactly, in
 *            address order (prev/next);
 *   pool     small (requests <= small_max) or large; free mapped blocks of a pool sit in one
 *            treap ordered by (place, size, address);
 *   stream   every segment belongs to one stream; its blocks are only handed to that stream;
 *   life     every segment belongs to one lifetime class (enum qc_alloc_life); its free blocks
 *            go to requests of another class only when the budget allows no new segment;
 *   place    (stream id, life): the treap's first key.
 *
 * Invariants (checked by alloc_check_invariants):
 *   Σ_{b in seg} b.size = seg.size and b.next.ptr = b.ptr + b.size;
 *   no two neighbours are both FREE with the same mapped state;
 *   FREE && mapped  <=>  in the pool treap;  LIVE  <=>  in the pointer map;
 *   bytes_allocated = Σ_{LIVE} size;  bytes_active = bytes_allocated + Σ_{PENDING} size;
 *   bytes_reserved = Σ_seg mapped(seg) <= budget (when budget > 0);  peak >= current.
 */
#ifndef QC_ALLOC_ALLOC_INTERNAL_H
#define QC_ALLOC_ALLOC_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_status.h"

// ---- raw memory seam -------------------------------------------------------------------------

struct alloc_raw;

/* Each backend implements these; every call reports failures through qc_errorf (NOMEM for "no
 * memory", CUDA/IO otherwise). The seam is the only place that touches mmap or the CUDA memory
 * API (raw_host.c, raw_cuda.c). */
struct alloc_raw_ops {
    /* A fixed segment of `size` bytes (a multiple of the granularity), readable and writable. */
    enum qc_status (*map)(struct alloc_raw *raw, size_t size, void **out);
    void (*unmap)(struct alloc_raw *raw, void *ptr, size_t size);
    /* Reserves `size` bytes of address space with nothing committed; *handle is the backend's. */
    enum qc_status (*reserve)(struct alloc_raw *raw, size_t size, void **base, void **handle);
    /* Commits / decommits [offset, offset + size) of a reservation (granule-aligned). */
    enum qc_status (*commit)(struct alloc_raw *raw, void *handle, size_t offset, size_t size);
    enum qc_status (*decommit)(struct alloc_raw *raw, void *handle, size_t offset, size_t size);
    void (*release)(struct alloc_raw *raw, void *handle); /* everything decommitted first */
    void (*deinit)(struct alloc_raw *raw);
};

struct alloc_raw {
    const struct alloc_raw_ops *ops;
    const char *name;   /* "host", "emu" or "cuda" */
    size_t granularity; /* commit unit of expandable segments, bytes (2 MiB on both) */
    size_t va_default;  /* reservation of one expandable segment when there is no budget */
    void *ctx;          /* backend state */
};

/* Host backend: mmap with MAP_NORESERVE; reservations are PROT_NONE and commit by mprotect. */
enum qc_status alloc_raw_host_init(struct alloc_raw *raw);
/* Emulated-device backend (params.emu): fixed segments are blocks of the arena emu (the
 * caller's; it must outlive the allocator). No reservations: expandable segments are served as
 * fixed ones (qc_alloc_create turns params.expandable off). */
enum qc_status alloc_raw_emu_init(struct alloc_raw *raw, struct qc_emu *emu);

#ifdef QC_HAVE_CUDA
/* CUDA backend for the current device: cudaMalloc/cudaFree for fixed segments, VMM
 * (cuMemAddressReserve + cuMemCreate/Map/SetAccess per granule) for reservations. */
enum qc_status alloc_raw_cuda_init(struct alloc_raw *raw);
/* The pinned arena's CUDA registration ops: cudaSetDevice(device) on the calling thread, and
 * cudaHostRegister / cudaHostUnregister of a host range (in the current device's context).
 * Every call checked: QC_ERR_CUDA with the runtime's message. */
enum qc_status alloc_raw_cuda_set_device(int device);
enum qc_status alloc_raw_cuda_host_register(void *ptr, size_t size);
enum qc_status alloc_raw_cuda_host_unregister(void *ptr);
#endif

// ---- the pinned arena's registration seam (pinned.c) -------------------------------------------

/* How the pinned arena pins and unpins its extents, and on which device. qc_pinned_create uses
 * cudaSetDevice + cudaHostRegister / cudaHostUnregister on a CUDA device, qc_pinned_create_emu
 * the emulated ones (qc_emu.h), and no ops (plain memory) on the CPU. Tests pass their own
 * (alloc_pinned_create_with) to see on a CPU build when and where pinning happens.
 *
 * The arena calls select(ctx, device) on the calling thread right before every pin and every
 * unpin: registration happens in the context of the thread's current device, and the threads
 * that allocate (the loader's workers, offload threads) never chose one, so without it every
 * rank would register on device 0 (a context there; refused in exclusive-process mode). pin
 * runs outside every jemalloc hook and lock (it may allocate: the CUDA runtime does), once per
 * extent, before any allocation in that extent is returned. */
struct qc_pinned;
struct alloc_pin_ops {
    enum qc_status (*select)(void *ctx, int device);           /* cudaSetDevice; NULL: no devices */
    enum qc_status (*pin)(void *ctx, void *base, size_t size); /* NULL: plain memory */
    enum qc_status (*unpin)(void *ctx, void *base);
    void *ctx;
    int device; /* the device the extents are registered with (what select gets) */
};
/* qc_pinned_create with explicit registration ops (NULL: none). */
enum qc_status alloc_pinned_create_with(const struct alloc_pin_ops *ops, size_t budget,
                                        struct qc_pinned **out);
/* True while the calling thread is inside one of the pinned arena's jemalloc extent hooks. */
bool alloc_pinned_in_hook(void);

// ---- blocks, segments, pools -----------------------------------------------------------------

enum alloc_block_state {
    ALLOC_BLOCK_FREE = 0, /* reusable (if mapped) by the segment's stream */
    ALLOC_BLOCK_LIVE,     /* handed out */
    ALLOC_BLOCK_PENDING,  /* freed, waiting on events of other streams */
};

enum { ALLOC_POOL_SMALL = 0, ALLOC_POOL_LARGE = 1, ALLOC_POOL_COUNT = 2 };

struct alloc_segment;

struct alloc_block {
    /* First cache line: what a treap walk reads. */
    struct alloc_block *tl, *tr; /* treap children (FREE && mapped) */
    uint64_t khi;                /* treap key, high word: stream id << 48 | size (set on
                                    insertion; the key never changes while in the treap) */
    char *ptr;                   /* first byte; the key's low word */
    uint32_t prio;               /* treap priority */
    uint8_t state;               /* enum alloc_block_state */
    bool mapped;                 /* every byte is committed (always for fixed segments) */
    size_t size;                 /* bytes; multiple of params.round */
    struct alloc_segment *seg;   /* owner */
    struct alloc_block *hnext;   /* pointer-map chain (LIVE and PENDING) */
    /* Second cache line. */
    struct alloc_block *prev; /* address-order neighbours in seg (NULL at the ends) */
    struct alloc_block *next;
    size_t requested; /* LIVE: bytes asked for; else 0 */
    uint32_t nevents; /* PENDING: events still outstanding */
    uint32_t nuses;   /* extra streams recorded (record_stream / foreign free) */
    uint32_t cap_uses;
    uint32_t tag_id;            /* LIVE: id in a->tags (its live bytes are counted there) */
    struct qc_stream **uses;    /* [cap_uses] */
    char tag[QC_ALLOC_TAG_MAX]; /* LIVE: tag */
};

struct alloc_segment {
    char *base;               /* VA start */
    size_t size;              /* VA bytes (fixed: = mapped) */
    size_t mapped;            /* committed bytes */
    int pool;                 /* ALLOC_POOL_* */
    bool expandable;          /* a reservation with granules committed on demand */
    void *handle;             /* raw reservation handle (expandable) */
    struct qc_stream *stream; /* owner stream (NULL = compute stream) */
    uint32_t stream_id;
    uint8_t life;              /* enum qc_alloc_life: its free blocks serve this class only
                                  (while the budget allows a segment of the request's own) */
    struct alloc_block *first; /* lowest-address block */
    struct alloc_segment *prev, *next;
};

/* A deferred free: ev recorded on a stream that used the block. */
struct alloc_pending {
    struct qc_event *ev;
    struct alloc_block *block;
};

struct alloc_trace {
    struct qc_alloc_event *ring; /* [capacity] */
    size_t capacity;
    uint64_t count;  /* events recorded so far; ring index = count % capacity */
    FILE *file;      /* NULL = ring only */
    bool file_error; /* a write failed once (logged once) */
    uint64_t t0_ns;  /* CLOCK_MONOTONIC at creation: the header's t0_ns (docs/TRACE.md) */
};

/* Peaks folded in by qc_alloc_reset_peak: max over the finished windows (stats.c). */
struct alloc_run_peaks {
    size_t allocated, requested, active, reserved;
};

/* Live bytes of one name (a tag or a block), kept up to date as allocations come and go. */
struct alloc_name_total {
    char name[QC_ALLOC_TAG_MAX]; /* NUL-terminated */
    size_t bytes;                /* Σ sizes of its live blocks */
    uint64_t blocks;             /* its live allocations */
    uint32_t parent;             /* tags: id of their block; blocks: unused */
};

/* An interning table (stats.c): ids are indices into v; slots hash names to id + 1. Names are
 * never removed (a tag whose blocks are all freed keeps its entry at 0 bytes), so its size is
 * the number of distinct names seen, which the model's code bounds. */
struct alloc_names {
    struct alloc_name_total *v; /* [n] of [cap] */
    uint32_t n, cap;
    uint32_t *slots; /* [nslots]: 0 = empty, else id + 1 */
    uint32_t nslots; /* a power of two >= 2 * cap */
};

struct qc_alloc {
    pthread_mutex_t lock;
    struct qc_device *dev;     /* may be NULL (host backend, no streams) */
    struct qc_stream *compute; /* dev's compute stream or NULL */
    struct qc_alloc_params params;
    struct alloc_raw raw;
    size_t va_size; /* reservation bytes of one expandable segment */

    struct alloc_block *free_root[ALLOC_POOL_COUNT]; /* treaps of FREE mapped blocks */
    struct alloc_segment *segments;                  /* all segments, newest first */
    struct alloc_block **buckets;                    /* pointer map of LIVE and PENDING blocks */
    size_t nbuckets;                                 /* power of two */
    size_t nmapped_blocks;                           /* blocks in the pointer map */
    struct alloc_block *spare;                       /* recycled block structs (linked by next) */

    struct alloc_pending *pending; /* [npending], deferred frees */
    size_t npending, cap_pending;
    struct qc_event **event_pool; /* idle events [nevent_pool] */
    size_t nevent_pool, cap_event_pool;

    struct qc_alloc_stats st;         /* counters; largest_free/fragmentation filled on read */
    struct alloc_run_peaks run_peaks; /* peaks of the windows closed by reset_peak */
    struct qc_alloc_peak_snapshot snap_run;  /* since creation */
    struct qc_alloc_peak_snapshot snap_step; /* since the last reset_peak */
    size_t snap_trigger;                     /* snapshot when bytes_allocated > this (the lower
                                                of the two windows' snap + snap / 100) */
    struct alloc_names tags;                 /* live bytes by tag; id 0 = "(untagged)" */
    struct alloc_names blocks;               /* live bytes by block; id 0 = "(untagged)" */
    struct alloc_trace trace;
    uint32_t rng; /* treap priorities */
};

// ---- pool.c ----------------------------------------------------------------------------------

/* Checks every invariant above; returns QC_ERR_INVALID with the first violation described.
 * O(blocks). Takes the lock. */
enum qc_status alloc_check_invariants(struct qc_alloc *a);

// ---- stats.c ---------------------------------------------------------------------------------

static inline void alloc_stat_add(size_t *cur, size_t *peak, size_t delta)
{
    *cur += delta;
    if (*cur > *peak)
        *peak = *cur;
}

static inline void alloc_stat_sub(size_t *cur, size_t delta)
{
    *cur -= delta;
}

/* Sets up the tag tables and the peak snapshots of a new allocator (none taken).
 * QC_ERR_NOMEM. */
enum qc_status alloc_peak_init(struct qc_alloc *a);
/* Frees the tag tables. */
void alloc_peak_deinit(struct qc_alloc *a);
/* Counts a new LIVE block of `size` bytes under its tag (b->tag, "" = untagged) and sets
 * b->tag_id (lock held; one hash of the tag). Out of host memory for a new tag: counted as
 * "(untagged)". */
void alloc_tag_add(struct qc_alloc *a, struct alloc_block *b);
/* Uncounts a LIVE block being freed (lock held; O(1)). */
void alloc_tag_sub(struct qc_alloc *a, const struct alloc_block *b);
/* Takes a snapshot for every window whose trigger bytes_allocated passed (force_step: the step
 * window in any case). Lock held; O(distinct tags + blocks) from the running totals. */
void alloc_peak_take(struct qc_alloc *a, bool force_step);

/* Checks both snapshots (within 1 % below their window's peak, tags and blocks summing to
 * their bytes_allocated) and the running totals (Σ tags = Σ blocks = bytes_allocated, each
 * block the sum of its tags). Lock held; O(distinct tags). */
enum qc_status alloc_peak_check(const struct qc_alloc *a);

/* Called after bytes_allocated grew (lock held): a snapshot when it passed the trigger. */
static inline void alloc_peak_note(struct qc_alloc *a)
{
    if (a->st.bytes_allocated > a->snap_trigger)
        alloc_peak_take(a, false);
}

/* The report of qc_alloc_report_format with the lock already held. */
size_t alloc_report_format_locked(struct qc_alloc *a, size_t requested, char *buf, size_t cap);

// ---- trace.c ---------------------------------------------------------------------------------

enum qc_status alloc_trace_init(struct alloc_trace *t, const struct qc_alloc_params *p);
void alloc_trace_deinit(struct alloc_trace *t);
/* Records one event (lock held). No-op when tracing is off. */
void alloc_trace_event(struct qc_alloc *a, enum qc_alloc_event_kind kind, const void *addr,
                       size_t size, size_t requested, uint32_t stream, int pool, const char *tag);

#endif /* QC_ALLOC_ALLOC_INTERNAL_H */
