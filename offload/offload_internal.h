/*
 * offload_internal.h — what the files of offload/ share. Never included outside offload/.
 *
 * Glossary
 *   block    block_size bytes of a tensor: the unit of I/O, of staging and of checksums.
 *   chunk    the per-block record of a handle: checksum, state, the slot it occupies.
 *   slot     one block of the staging ring (pinned memory registered with io_uring). A slot
 *            belongs to exactly one chunk while it is being written, read, held by prefetch or
 *            copied to the device; otherwise it is on the free list.
 *   extent   a handle's contiguous range of the spill file: round_up(size, 4096) bytes at a
 *            4096-aligned offset, block i at extent + i * block_size.
 *   backend  the I/O engine of the active rung (uring.c or io_threads.c): takes requests
 *            without blocking and calls their completion from its own thread.
 *
 * Locking: one engine mutex (qc_offload.mu) guards handles, chunks, slots, tiers, prefetch and
 * stats. Lock order: mu -> backend lock. Backends never hold their lock while calling an I/O's
 * completion, and completions take mu, so completions may submit new I/O.
 *
 * Invariants (under mu):
 *   staging.nfree + #slots owned by chunks == staging.nslots
 *   pf.bytes == sum of len over chunks with by_prefetch set
 *   h->writes_left == #chunks of h in CHUNK_WRITING
 *   h->busy == #chunks of h holding a slot
 */
#ifndef QC_OFFLOAD_OFFLOAD_INTERNAL_H
#define QC_OFFLOAD_OFFLOAD_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_offload.h"

#define OFFLOAD_ALIGN       4096u /* O_DIRECT alignment of offsets, lengths and buffers */
#define OFFLOAD_TAG_MAX     64
#define OFFLOAD_ERR_MAX     512
#define OFFLOAD_LOG_MAX     1024 /* prefetch issue log entries */
#define OFFLOAD_MAX_RETRIES 64   /* consecutive EAGAIN/EINTR before an I/O fails */

static inline size_t offload_round_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

// ---- I/O requests and backends -----------------------------------------------------------

enum offload_op { OFFLOAD_READ = 0, OFFLOAD_WRITE = 1 };

/* One request; it lives in its staging slot, so the data path allocates nothing per I/O. */
struct offload_io {
    enum offload_op op;
    unsigned char *buf; /* start of the transfer (inside the staging ring) */
    size_t len;         /* bytes to transfer (4096-multiple under O_DIRECT) */
    uint64_t off;       /* file offset of buf[0] */
    size_t done;        /* bytes transferred so far; the next submission covers [done, len) */
    int res;            /* final: 0 or -errno (-ENODATA: short I/O that made no progress) */
    unsigned retries;   /* consecutive EAGAIN/EINTR */
    void (*complete)(struct offload_io *io); /* once, from a backend thread, no lock held */
    void *user;                              /* the staging slot */
    struct offload_io *next;                 /* backend pending queue */
};

struct offload_counters {
    atomic_uint_fast64_t ios_submitted;
    atomic_uint_fast64_t short_ios;
    atomic_uint_fast64_t retries;
};

struct offload_fault {
    pthread_mutex_t mu;
    enum qc_offload_fault kind;
    enum qc_offload_fault_op op;
    uint64_t nth;  /* fire on this matching completion (1-based) */
    uint64_t seen; /* matching completions since armed */
    bool fired;
};

/* What a backend needs from the engine. */
struct offload_io_env {
    int fd;              /* the spill file */
    bool direct;         /* fd has O_DIRECT */
    const char *path;    /* for messages */
    unsigned char *ring; /* staging ring, for buffer registration */
    size_t ring_bytes;
    bool register_buffers; /* io_uring: fixed buffers and fixed file */
    int queue_depth;
    int sim_uring_errno; /* testing: io_uring_queue_init fails with this */
    struct offload_fault *fault;
    struct offload_counters *ctr;
};

struct offload_backend {
    const char *name;
    bool registered; /* io_uring fixed buffers + fixed file in use */
    /* Queues io (io->done == 0 or a resubmission); never blocks on I/O. */
    void (*submit)(struct offload_backend *b, struct offload_io *io);
    /* All submitted I/O must have completed. Frees b. */
    void (*destroy)(struct offload_backend *b);
};

/* uring.c (the only file that includes liburing.h). UNSUPPORTED with the reason in the message
 * when io_uring cannot be used here (EPERM/ENOSYS in containers, missing opcodes). */
enum qc_status offload_uring_create(const struct offload_io_env *env, struct offload_backend **out);
/* io_threads.c: a pool of min(queue_depth, 16) threads doing pread/pwrite. */
enum qc_status offload_threads_create(const struct offload_io_env *env,
                                      struct offload_backend **out);

/* fault.c: feeds one raw result (bytes transferred, or -errno) into io, after the fault hook.
 * Returns true when io is finished (io->res final), false when io must be submitted again for
 * the rest ([io->done, io->len)): a short transfer that made progress, EAGAIN or EINTR. */
bool offload_io_result(const struct offload_io_env *env, struct offload_io *io, long res);
void offload_fault_init(struct offload_fault *f);
void offload_fault_deinit(struct offload_fault *f);

// ---- spill file (nvme_store.c) -----------------------------------------------------------

struct offload_extent {
    uint64_t off;
    uint64_t len;
    struct offload_extent *next; /* sorted by offset, never adjacent (coalesced) */
};

struct offload_nvme {
    int fd;         /* -1 when there is no NVMe tier */
    bool direct;    /* fd has O_DIRECT and aligned I/O works */
    bool visible;   /* the name stays until close */
    int spill_slot; /* signal-cleanup registration, -1 when none */
    char path[PATH_MAX];
    char fs_name[32];     /* "ext4", "tmpfs", ... */
    char direct_why[160]; /* why O_DIRECT is off ("" when on or not asked) */
    const char *prealloc; /* "fallocate" or "ftruncate+writes" */
    char dir[PATH_MAX];   /* the spill directory, for messages */
    uint64_t capacity;    /* the most bytes the file may grow to, 4096-multiple; lowered to
                             size when a growth fails (the disk is full) */
    uint64_t size;        /* bytes the file holds now (allocated), 4096-multiple */
    uint64_t size_peak;   /* the largest size it reached */
    uint64_t grow_step;   /* growth granularity, 4096-multiple */
    uint64_t grows;       /* growths after the first allocation */
    int sim_grow_errno;   /* testing: growth fails with this errno (0 = off) */
    char grow_why[160];   /* why the last growth failed ("" when none did) */
    uint64_t used;        /* bytes in live extents */
    uint64_t peak;
    struct offload_extent *free_list; /* within [0, size) */
};

/* Creates the spill file in dir (unlinking the name at once unless visible), allocates its first
 * `initial` bytes (at least 4096, at most capacity) and probes O_DIRECT when want_direct. The file
 * then grows in steps of grow_step (offload_nvme_alloc, offload_nvme_reserve) up to capacity.
 * On failure n->fd == -1 and the message says why. sim_* simulate failures (testing; 0 = off). */
enum qc_status offload_nvme_open(struct offload_nvme *n, const char *dir, uint64_t capacity,
                                 uint64_t initial, uint64_t grow_step, bool want_direct,
                                 bool visible, int sim_direct_errno, int sim_fallocate_errno);
void offload_nvme_close(struct offload_nvme *n);
/* First fit, growing the file when no free extent is large enough; QC_ERR_NOMEM (message set)
 * when the file is at its capacity or cannot grow (the disk is full: the capacity is then
 * lowered to the size the file has, so that later allocations fail at once). */
enum qc_status offload_nvme_alloc(struct offload_nvme *n, uint64_t len, uint64_t *off);
/* Grows the file to hold `bytes` (rounded up to grow_step, at most capacity). QC_ERR_NOMEM as
 * offload_nvme_alloc when it cannot. */
enum qc_status offload_nvme_reserve(struct offload_nvme *n, uint64_t bytes);
void offload_nvme_free(struct offload_nvme *n, uint64_t off, uint64_t len);
uint64_t offload_checksum(const void *p, size_t n);

// ---- engine state ------------------------------------------------------------------------

enum offload_chunk_state {
    CHUNK_EMPTY = 0, /* nothing on disk yet */
    CHUNK_WRITING,   /* D2H into the slot, then the write */
    CHUNK_ON_DISK,   /* on disk, no slot */
    CHUNK_READING,   /* read into the slot in flight */
    CHUNK_READY,     /* read and verified, in the slot */
    CHUNK_COPYING,   /* slot being copied to the device by a get */
    CHUNK_FAILED,    /* I/O error or checksum mismatch; the handle carries the error */
};

struct offload_handle;

struct offload_chunk {
    struct offload_handle *h;
    struct offload_slot *slot; /* while holding one */
    uint64_t sum;              /* xxh3-64 of the len valid bytes, set before the write */
    size_t len;                /* valid bytes */
    uint32_t index;
    enum offload_chunk_state state;
    bool by_prefetch; /* the slot counts in pf.bytes */
};

struct offload_slot {
    struct qc_offload *o;
    unsigned char *buf; /* block_size bytes, 4096-aligned */
    struct offload_chunk *chunk;
    struct offload_slot *next_free;
    struct offload_io io;
};

struct offload_handle {
    struct qc_offload *o;
    uint64_t id;
    char tag[OFFLOAD_TAG_MAX];
    size_t size;
    enum qc_offload_place where; /* HOST or NVME */
    void *host_buf;              /* host tier: size bytes, pinned */
    struct qc_event *ev_in;      /* put: captured on the caller's stream */
    struct qc_event *ev_out;     /* put: the D2H of the source is done (copy stream) */
    uint64_t file_off;           /* NVMe extent */
    uint64_t file_len;
    uint32_t nchunks;
    struct offload_chunk *chunks;
    uint32_t writes_left; /* chunks in CHUNK_WRITING */
    uint32_t busy;        /* chunks holding a slot */
    uint32_t pf_chunks;   /* chunks with by_prefetch */
    uint32_t getting;     /* gets in progress: they read the blocks themselves */
    bool consumed;        /* a get completed: prefetch skips it */
    bool released;
    bool pf_logged;     /* in the prefetch issue log */
    bool pf_wanted;     /* qc_offload_prefetch came before the writes finished */
    enum qc_status err; /* sticky: the first I/O error of this handle */
    char errmsg[OFFLOAD_ERR_MAX];
};

struct offload_table_entry {
    struct offload_handle *h;
    uint32_t gen;
};

struct offload_prefetch {
    uint64_t *order; /* backward order */
    size_t n;
    size_t cursor; /* next order entry to start */
    size_t bytes;  /* staging bytes held by prefetch */
    int active;    /* handles with pf_chunks > 0 */
    uint64_t log[OFFLOAD_LOG_MAX];
    size_t nlog;
};

struct qc_offload {
    struct qc_device *dev;
    struct qc_stream *copy; /* D2H copies and the write hand-off */
    struct qc_offload_params p;
    enum qc_offload_rung rung;
    char nvme_unusable[OFFLOAD_ERR_MAX]; /* why offload.nvme_dir gave no NVMe tier; "" when it
                                            did or none was given (qc_offload_nvme_unusable) */
    struct qc_pinned *pinned;
    bool own_pinned;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every slot, chunk and handle change */

    struct offload_table_entry *tab; /* handle id = gen << 32 | (index + 1) */
    uint32_t tab_cap;
    uint32_t *tab_free; /* free indices (stack) */
    uint32_t tab_nfree;
    uint32_t tab_used; /* indices ever handed out */

    size_t host_used; /* host tier bytes */
    size_t host_peak;

    struct offload_nvme nvme;
    unsigned char *ring; /* staging ring: nslots * block_size, pinned */
    struct offload_slot *slots;
    uint32_t nslots;
    uint32_t nfree;
    uint32_t reserve; /* slots prefetch leaves for puts and gets */
    struct offload_slot *free_slots;

    struct offload_backend *io;
    struct offload_io_env env;
    struct offload_fault fault;
    struct offload_counters ctr;
    struct offload_prefetch pf;
    uint32_t writes_inflight; /* chunks in CHUNK_WRITING, all handles */
    uint32_t reads_inflight;  /* chunks in CHUNK_READING, all handles */

    struct qc_offload_stats st; /* counters kept under mu (the atomics are merged on read) */
    enum qc_status first_err;   /* first I/O error since the last quiesce */
    char first_errmsg[OFFLOAD_ERR_MAX];
};

/* host_tier.c (mu held): bounded pinned allocations. QC_ERR_NOMEM (message set) when full. */
enum qc_status offload_host_alloc(struct qc_offload *o, size_t size, const char *tag, void **out);
void offload_host_free(struct qc_offload *o, void *p, size_t size);

/* A chunk's place in the spill file, and the bytes its I/O moves (the block rounded up to the
 * O_DIRECT alignment when the file has it). */
static inline uint64_t offload_chunk_file_off(const struct qc_offload *o,
                                              const struct offload_chunk *c)
{
    return c->h->file_off + (uint64_t)c->index * o->p.block_size;
}

static inline size_t offload_chunk_io_len(const struct qc_offload *o, const struct offload_chunk *c)
{
    return o->nvme.direct ? offload_round_up(c->len, OFFLOAD_ALIGN) : c->len;
}

/* staging.c (mu held): the state the put, get and read paths share; it calls none of them.
 * The handle table: insert gives h its id (QC_ERR_NOMEM); find gives NULL for an unknown,
 * stale or released id. */
enum qc_status offload_handle_insert(struct qc_offload *o, struct offload_handle *h);
void offload_handle_remove(struct qc_offload *o, struct offload_handle *h);
struct offload_handle *offload_handle_find(struct qc_offload *o, uint64_t id);
/* A free slot for c (one must be free); giving it back also ends c's prefetch claim. */
struct offload_slot *offload_slot_take(struct qc_offload *o, struct offload_chunk *c);
void offload_slot_give_back(struct qc_offload *o, struct offload_chunk *c);
/* A prefetch-held chunk left its slot (consumed, failed or released): pf.bytes follows. */
void offload_prefetch_chunk_done(struct qc_offload *o, struct offload_chunk *c);
/* Records the handle's (and, when no caller will see it, the engine's) first error, naming the
 * file, offset, tensor and block; the chunk becomes FAILED. _io: from a failed I/O, with a hint
 * for a full disk or an I/O error. */
void offload_chunk_fail(struct qc_offload *o, struct offload_chunk *c, const char *what);
void offload_chunk_fail_io(struct qc_offload *o, struct offload_chunk *c,
                           const struct offload_io *io);

/* prefetch.c (mu held): the read side. issue_read reads chunk c (ON_DISK) into a slot, for a
 * get or (by_prefetch) ahead of one; its completion verifies the checksum and pumps. */
void offload_issue_read(struct qc_offload *o, struct offload_chunk *c, bool by_prefetch);
/* Issues reads for the next handles of the order within the window. */
void offload_prefetch_pump(struct qc_offload *o);
/* h's writes finished: issue the explicit prefetch that was asked for meanwhile. */
void offload_prefetch_wanted(struct qc_offload *o, struct offload_handle *h);
void offload_prefetch_deinit(struct offload_prefetch *pf);

#endif /* QC_OFFLOAD_OFFLOAD_INTERNAL_H */
