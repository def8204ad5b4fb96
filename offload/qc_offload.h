/*
 * qc_offload.h — the offload engine: moves stashed device tensors out to a pinned host tier or
 * an NVMe spill file and brings them back before backward needs them.
 *
 *   put(dev_ptr, size, stream, place, tag) -> handle     asynchronous: D2H on the copy stream
 *   prefetch(handle) / set_order(handles)                 NVMe -> staging reads ahead of use
 *   get(handle, dev_dst, stream)                          data is in dev_dst when stream gets there
 *   release(handle)                                       frees host memory / the spill extent
 *
 * Tiers: pinned host memory (bounded by host_capacity, from the pinned allocator) and NVMe (one
 * spill file in a user-given directory with its own extent allocator; it starts small and grows
 * in steps up to nvme_capacity as puts need it, see nvme_store.c). The NVMe path
 * is device -> staging ring (pinned, registered with io_uring) -> file, in blocks of block_size;
 * every block carries an xxh3 checksum verified on read. The I/O engine is chosen by a
 * capability probe at create time and printed (qc_log info), down a fallback ladder:
 *   io_uring + O_DIRECT -> io_uring buffered -> thread pool pread/pwrite -> host tier only ->
 * error.
 *
 * Thread safety: all functions may be called from any thread; one engine-wide lock serialises
 * bookkeeping (I/O itself runs outside it). Handles are process-local 64-bit ids; 0 is never a
 * valid handle.
 *
 * The spill file is unlinked right after it is opened (it vanishes even on SIGKILL) unless
 * params.spill_visible is set; a visible spill file is unlinked by destroy, at exit() and on
 * SIGINT/SIGTERM (see nvme_store.c).
 */
#ifndef QC_OFFLOAD_QC_OFFLOAD_H
#define QC_OFFLOAD_QC_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_device.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_offload;
struct qc_pinned; /* alloc/: the pinned host allocator */

/* The rungs of the fallback ladder, best first. */
enum qc_offload_rung {
    QC_OFFLOAD_RUNG_AUTO = 0,       /* probe and take the best rung that works */
    QC_OFFLOAD_RUNG_URING_DIRECT,   /* io_uring, O_DIRECT */
    QC_OFFLOAD_RUNG_URING_BUFFERED, /* io_uring, page cache */
    QC_OFFLOAD_RUNG_THREADS,        /* thread pool with pread/pwrite (O_DIRECT when it works) */
    QC_OFFLOAD_RUNG_HOST_ONLY,      /* no NVMe tier */
    QC_OFFLOAD_RUNG_COUNT
};

enum qc_offload_place {
    QC_OFFLOAD_PLACE_AUTO = 0, /* host tier until full, then NVMe */
    QC_OFFLOAD_PLACE_HOST,
    QC_OFFLOAD_PLACE_NVME,
};

struct qc_offload_params {
    size_t host_capacity;   /* bytes of the pinned host tier; 0 = no host tier */
    const char *nvme_dir;   /* spill directory; NULL or "" = no NVMe tier */
    size_t nvme_capacity;   /* the most bytes the spill file may grow to (rounded up to 4 KiB) */
    size_t nvme_initial;    /* bytes the spill file starts with (at least 4 KiB, at most
                               nvme_capacity); it grows when a put needs more */
    size_t nvme_grow_step;  /* the file grows in steps of this many bytes (rounded up to 4 KiB) */
    int queue_depth;        /* I/Os in flight (io_uring entries, or pool threads <= 16) */
    size_t block_size;      /* bytes per I/O and per checksum; multiple of 4096 */
    size_t max_inflight;    /* staging ring bytes = max bytes in flight; >= 2 blocks */
    size_t prefetch_window; /* bytes of reads kept in flight ahead of use; 0 = none */
    int prefetch_count;     /* max handles being prefetched at once; 0 = no limit */
    bool direct;            /* try O_DIRECT */
    bool register_buffers;  /* io_uring fixed buffers (staging ring) and fixed file */
    bool spill_visible;     /* keep the spill file's name until destroy (debugging) */
    enum qc_offload_rung force_rung; /* AUTO = probe; else exactly this rung or UNSUPPORTED */
    struct qc_pinned *pinned;        /* pinned allocator to use; NULL = the engine makes its own */
    /* testing: simulate a hostile machine (0 = off). The value is the errno to simulate. */
    int sim_uring_errno;     /* io_uring_queue_init fails with this (EPERM, ENOSYS) */
    int sim_direct_errno;    /* open(O_DIRECT) fails with this (EINVAL, as on tmpfs) */
    int sim_fallocate_errno; /* fallocate fails with this (EOPNOTSUPP) */
    int sim_grow_errno;      /* every growth of the spill file fails with this (ENOSPC) */
};

/* Defaults: host 1 GiB, no NVMe dir, NVMe up to 4 GiB starting at 4 KiB and growing in 64 MiB
 * steps, queue depth 16, 1 MiB blocks, 64 MiB in flight, prefetch window 64 MiB, O_DIRECT and
 * registered buffers on, rung AUTO. */
void qc_offload_params_default(struct qc_offload_params *p);

/* Creates the engine on dev: probes the machine, opens the spill file (nvme_initial bytes), sets up
 * the staging ring and the I/O engine, and logs the capabilities and the chosen rung.
 * Errors: QC_ERR_INVALID (bad params), QC_ERR_UNSUPPORTED (a forced rung that this machine or
 * filesystem cannot do, with the reason; or no tier at all), QC_ERR_IO (spill file), NOMEM. */
enum qc_status qc_offload_create(struct qc_device *dev, const struct qc_offload_params *params,
                                 struct qc_offload **out);
/* Waits for all I/O, frees every handle, removes the spill file. NULL is a no-op. */
void qc_offload_destroy(struct qc_offload *o);

enum qc_offload_rung qc_offload_rung_active(const struct qc_offload *o);
const char *qc_offload_rung_str(enum qc_offload_rung rung);
/* Grows the spill file to hold `bytes` now (rounded up to nvme_grow_step, at most
 * nvme_capacity), ahead of the puts that need them: the trainer passes its plan's NVMe bytes plus
 * a margin. QC_OK without an NVMe tier. QC_ERR_NOMEM when the disk refuses (the message names the
 * file, the sizes and the errno); the file keeps its size and data, and the tier's limit drops to
 * that size (qc_offload_nvme_limit). */
enum qc_status qc_offload_nvme_reserve(struct qc_offload *o, uint64_t bytes);
/* The most bytes the NVMe tier can hold now: nvme_capacity, or less once the disk refused a
 * growth; 0 without an NVMe tier. */
uint64_t qc_offload_nvme_limit(struct qc_offload *o);
/* Why the NVMe tier that nvme_dir asked for is not there (the folder is missing, not writable,
 * ...), for messages; "" when it works or no nvme_dir was given. */
const char *qc_offload_nvme_unusable(const struct qc_offload *o);
/* Whether io_uring fixed buffers / a fixed file are in use. */
bool qc_offload_registered(const struct qc_offload *o);
/* The copy stream used for device -> host copies (owned by the engine). */
struct qc_stream *qc_offload_copy_stream(struct qc_offload *o);
/* The spill file's path ("" without NVMe tier); the name is gone from the directory unless
 * spill_visible. */
const char *qc_offload_spill_path(const struct qc_offload *o);

/* ---- data path ------------------------------------------------------------------------- */

/* Offloads size bytes at src (device memory) as they are once the work enqueued on stream so
 * far is done. Returns at once with *handle (the copy runs on the copy stream); may block only
 * while the staging ring is full (counted in stats.put_stall_*). src must stay unchanged until
 * the copy is done: call qc_offload_put_done() before reusing or freeing it stream-ordered (or
 * record the copy stream on the block with the allocator). tag names the tensor in errors (copied).
 * Errors: QC_ERR_NOMEM when the chosen tier is full (message names tier, sizes and a hint),
 * QC_ERR_INVALID. */
enum qc_status qc_offload_put(struct qc_offload *o, const void *src, size_t size,
                              struct qc_stream *stream, enum qc_offload_place place,
                              const char *tag, uint64_t *handle);
/* Makes later work on stream wait until the put's device -> host copy of the source is done. */
enum qc_status qc_offload_put_done(struct qc_offload *o, uint64_t handle, struct qc_stream *stream);
/* Starts reading an NVMe handle back into the staging ring (non-blocking; no-op for host-tier
 * handles and for handles already being read). Bounded by the staging ring. */
enum qc_status qc_offload_prefetch(struct qc_offload *o, uint64_t handle);
/* The order in which gets will come (backward order). Prefetch then keeps reads for the next
 * handles in flight within prefetch_window bytes / prefetch_count handles. Replaces any earlier
 * order; handles are copied. */
enum qc_status qc_offload_set_order(struct qc_offload *o, const uint64_t *handles, size_t n);
/* Enqueues the copy of the handle's data into dst (device memory, >= size bytes) on stream: the
 * data is there when stream reaches this point. Host-tier gets never block the caller; NVMe gets
 * block until each block has been read and verified (time counted in stats.stall_*). The handle
 * stays valid (get may be repeated) until released.
 * Errors: QC_ERR_IO naming file, offset and tag for EIO, ENOSPC (at write time), short I/O that
 * cannot be completed and checksum mismatches; no unverified byte is ever copied to dst.
 * QC_ERR_INVALID for a bad handle. */
enum qc_status qc_offload_get(struct qc_offload *o, uint64_t handle, void *dst,
                              struct qc_stream *stream);
/* Size and tier of a handle (QC_ERR_INVALID for a bad handle). */
enum qc_status qc_offload_handle_info(struct qc_offload *o, uint64_t handle, size_t *size,
                                      enum qc_offload_place *where);
/* Frees the handle's host memory or spill extent once its I/O is done. Returns the handle's
 * pending error, if any (the handle is freed either way). 0 is a no-op. */
enum qc_status qc_offload_release(struct qc_offload *o, uint64_t handle);
/* Blocks until every put has reached its tier and every prefetch read has completed. Returns
 * the first I/O error seen since the last call, if any. */
enum qc_status qc_offload_quiesce(struct qc_offload *o);

/* ---- statistics ------------------------------------------------------------------------ */

struct qc_offload_stats {
    uint64_t puts_host;       /* puts placed in the host tier */
    uint64_t puts_nvme;       /* puts placed on NVMe */
    uint64_t gets;            /* gets completed */
    uint64_t bytes_host_used; /* live host-tier bytes */
    uint64_t bytes_host_peak;
    uint64_t bytes_nvme_used; /* live spill-file bytes (4 KiB granules) */
    uint64_t bytes_nvme_peak;
    uint64_t bytes_nvme_file;      /* bytes the spill file holds now (allocated on disk) */
    uint64_t bytes_nvme_file_peak; /* the most it held */
    uint64_t nvme_grows;           /* times it grew after create */
    uint64_t bytes_written;        /* to the spill file */
    uint64_t bytes_read;           /* from the spill file */
    uint64_t ios_submitted;        /* I/O requests handed to the engine (resubmissions included) */
    uint64_t short_ios;            /* short completions that were completed by resubmitting */
    uint64_t retries;              /* EAGAIN/EINTR resubmissions */
    uint64_t stall_count;          /* gets that had to wait for NVMe data */
    uint64_t stall_ns;             /* total time gets waited */
    uint64_t put_stall_count;      /* puts that waited for a staging slot */
    uint64_t put_stall_ns;
    uint64_t prefetch_reads;      /* blocks read ahead by prefetch */
    uint64_t prefetch_bytes_peak; /* most staging bytes held by prefetch at once */
    uint64_t checksum_failures;
    uint64_t io_errors;
};
void qc_offload_stats_get(struct qc_offload *o, struct qc_offload_stats *out);

/* ---- fault injection (tests) ----------------------------------------------------------- */

enum qc_offload_fault {
    QC_OFFLOAD_FAULT_NONE = 0,
    QC_OFFLOAD_FAULT_SHORT,  /* the I/O reports half its bytes (aligned); the engine must finish */
    QC_OFFLOAD_FAULT_ZERO,   /* the I/O reports 0 bytes: an uncompletable short I/O */
    QC_OFFLOAD_FAULT_EIO,    /* the I/O fails with EIO */
    QC_OFFLOAD_FAULT_ENOSPC, /* the I/O fails with ENOSPC */
    QC_OFFLOAD_FAULT_EAGAIN, /* the I/O fails with EAGAIN once (must be retried) */
    QC_OFFLOAD_FAULT_FLIP,   /* after the write completes, one byte of it is flipped on disk */
};
enum qc_offload_fault_op {
    QC_OFFLOAD_FAULT_ANY = 0,
    QC_OFFLOAD_FAULT_READ,
    QC_OFFLOAD_FAULT_WRITE
};
/* Arms one fault: the nth (1-based) I/O completion of kind op from now gets the fault. Replaces
 * an armed fault; FAULT_NONE disarms. */
void qc_offload_fault_set(struct qc_offload *o, enum qc_offload_fault fault,
                          enum qc_offload_fault_op op, uint64_t nth);
/* Whether the armed fault has fired. */
bool qc_offload_fault_fired(struct qc_offload *o);
/* The handles in the order prefetch first issued a read for them (up to cap); returns the
 * count recorded (at most 1024 are kept). */
size_t qc_offload_prefetch_log(struct qc_offload *o, uint64_t *handles, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* QC_OFFLOAD_QC_OFFLOAD_H */
