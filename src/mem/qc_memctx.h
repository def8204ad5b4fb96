/*
 * qc_memctx.h — the memory context of a model: where every byte of its working memory comes
 * from and in which stream order it is used and given back.
 *
 * A model (qc_qcnet.h) and every block it runs (qc_stash.h: struct qc_block_mem) allocate
 * through one memory context:
 *   - the caching allocator (alloc/qc_alloc.h) of the model's backend, on the model's compute
 *     stream (frees are stream-ordered on it); or host malloc (64-byte aligned) when the context
 *     has no allocator (a block used alone, the CPU reference of the tests), or, for tests, an
 *     emulated-device arena directly (qc_emu.h). A NULL context means host malloc, uncounted;
 *   - the streams: compute (the model's ops), and, for the stash policies of the training
 *     step, the offload engine's copy stream (device -> host) and a copy stream of its own for
 *     the gets (host -> device), each a worker thread on the CPU device;
 *   - the offload engine (offload/qc_offload.h) and the step's policy table: see
 *     qc_qcnet_set_policies (qc_qcnet.h) and the tape (qcnet_internal.h), which call
 *     qc_memctx_put / _get / _wait around each block application's forward and backward.
 *
 * Accounting. Every allocation has a class: PARAM (parameters, gradients, optimizer-side
 * buffers the model owns), MODEL (activations and stash arenas of the model) or BLOCK (the
 * blocks' scratch, tiles and gradient buffers). The context keeps, per class, the live bytes
 * (as asked, not rounded) and the number of live allocations, and the peak of the working set
 * MODEL + BLOCK:
 *   live[c] = Σ bytes of the live allocations of class c,   work = live[MODEL] + live[BLOCK],
 *   work_peak ≥ work (reset by qc_memctx_reset_peak),   n_allocs[c] counts successful calls.
 *
 * Fault injection (tests): qc_memctx_fail_at makes the k-th allocation from now (and the
 * following count - 1) fail with QC_ERR_NOMEM, as an exhausted budget would. An observer
 * callback sees every allocation and free with its tag (tests that check tagging).
 *
 * Thread safety: one context serves one model, used from one thread (blocks allocate before
 * their parallel loops); the allocator and the offload engine below are thread-safe.
 */
#ifndef QC_MEM_QC_MEMCTX_H
#define QC_MEM_QC_MEMCTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_alloc;        /* alloc/qc_alloc.h */
struct qc_emu;          /* base/qc_emu.h */
struct qc_stream;       /* base/qc_device.h */
struct qc_memctx;       /* opaque */
struct qc_plan_program; /* plan/qc_plan.h */

enum qc_mem_class { QC_MEM_PARAM = 0, QC_MEM_MODEL, QC_MEM_BLOCK, QC_MEM_CLASS_COUNT };

struct qc_memctx_params {
    bool dry;                  /* no memory at all: every allocation gets a distinct address
                                  that must never be dereferenced (a model on the DRY backend,
                                  qc_qcnet_describe); alloc and emu are ignored */
    struct qc_alloc *alloc;    /* the caching allocator; NULL = host malloc, or emu below */
    struct qc_emu *emu;        /* tests, with alloc NULL: every allocation straight from this
                                  emulated-device arena (fresh and freed memory hold 0xFF) */
    struct qc_stream *compute; /* stream the model's ops run on; NULL = the allocator's compute
                                  stream (the device's default) */
    /* the offload tier of the stash policies (with alloc and compute only): */
    struct qc_offload *offload; /* NULL = none: qc_memctx_put is refused */
    struct qc_stream *copy_in;  /* the stream of the gets (host -> device); required with an
                                   offload engine (the puts use the engine's copy stream) */
};

/* Creates a context over p (NULL = host malloc). QC_ERR_NOMEM. */
enum qc_status qc_memctx_create(const struct qc_memctx_params *p, struct qc_memctx **out);
/* NULL is a no-op. Every allocation must have been given back. */
void qc_memctx_destroy(struct qc_memctx *mc);

/* bytes (0 counts as 1) of class cls for tensor tag ("block/tensor"), at least 64-byte aligned;
 * NULL on failure with QC_ERR_NOMEM set naming the tag (the allocator's OOM report below).
 * mc NULL = host malloc. */
void *qc_memctx_alloc(struct qc_memctx *mc, enum qc_mem_class cls, size_t bytes, const char *tag);
/* Gives p (NULL is a no-op) back, stream-ordered on the compute stream; bytes and cls must be
 * those of its allocation. */
void qc_memctx_free(struct qc_memctx *mc, enum qc_mem_class cls, void *p, size_t bytes);

/* Where the caching allocator places the context's blocks (qc_alloc.h, enum qc_alloc_life):
 * an allocation whose tag prog names gets the longest lifetime class of that tag's allocations
 * in prog (qc_plan_program_lives: a block's scratch, what a later span frees, what outlives the
 * step's blocks), so the blocks a step frees together share segments; other tags, and every
 * tag after prog NULL, QC_ALLOC_LIFE_LONG. The table is the context's own copy. A no-op
 * without a caching allocator. QC_ERR_NOMEM (the table is then empty). */
enum qc_status qc_memctx_set_lives(struct qc_memctx *mc, const struct qc_plan_program *prog);

/* The allocator (NULL for host malloc or a bare arena) and the compute stream (NULL when there
 * is none). */
struct qc_alloc *qc_memctx_allocator(const struct qc_memctx *mc);
/* Whether the context hands out device memory of a device backend (an allocator or an arena). */
bool qc_memctx_is_device(const struct qc_memctx *mc);
struct qc_stream *qc_memctx_compute_stream(const struct qc_memctx *mc);

struct qc_memctx_stats {
    size_t live[QC_MEM_CLASS_COUNT];      /* live bytes per class (as asked) */
    int64_t nlive[QC_MEM_CLASS_COUNT];    /* live allocations per class */
    size_t work_peak;                     /* peak of live[MODEL] + live[BLOCK] */
    int64_t n_allocs[QC_MEM_CLASS_COUNT]; /* successful allocations per class since create */
    int64_t n_fail;                       /* allocations that failed (injected or not) */
    /* the last failure: bytes asked for, and the allocator's allocated and reserved bytes
     * then (0 without an allocator); reserved − allocated is what fragmentation held */
    size_t fail_bytes, fail_allocated, fail_reserved, fail_reserved_small;
    /* offload: bytes put to each tier and fetched back, and host seconds spent waiting for
     * fetches (the prefetch stall), since create */
    uint64_t put_host_bytes, put_nvme_bytes, fetch_bytes;
    int64_t puts, fetches;
    double stall_s;
};
/* All zero for mc NULL. */
void qc_memctx_stats_get(const struct qc_memctx *mc, struct qc_memctx_stats *out);
/* work_peak = the working set now. */
void qc_memctx_reset_peak(struct qc_memctx *mc);

/* Recording: from now on every allocation (QC_PLAN_OP_ALLOC with the program's next id, the
 * class and the bytes asked for) and every free (QC_PLAN_OP_FREE) is appended to prog, until
 * qc_memctx_record(mc, NULL). The model adds its markers to the same program
 * (qc_memctx_recording). QC_ERR_NOMEM when the id table cannot be made. */
enum qc_status qc_memctx_record(struct qc_memctx *mc, struct qc_plan_program *prog);
struct qc_plan_program *qc_memctx_recording(const struct qc_memctx *mc);
/* The program id of live allocation p while recording; -1 when it has none (made before the
 * recording started). */
int32_t qc_memctx_alloc_id(const struct qc_memctx *mc, const void *p);

// ---- offload (the stash policies of a training step) ------------------------------------------

/* Where qc_memctx_put sends data (= enum qc_offload_place). */
enum qc_memctx_place { QC_MEMCTX_AUTO = 0, QC_MEMCTX_HOST, QC_MEMCTX_NVME };

/* Gives the context an offload tier after creation (offload, copy_in as in the params; NULL
 * offload removes it: no put may be outstanding). QC_ERR_INVALID without an allocator and a
 * compute stream, QC_ERR_NOMEM. */
enum qc_status qc_memctx_set_offload(struct qc_memctx *mc, struct qc_offload *offload,
                                     struct qc_stream *copy_in);
/* Whether puts can go anywhere (an offload engine). */
bool qc_memctx_can_offload(const struct qc_memctx *mc);
/* Offloads bytes at p (a live allocation of class cls from mc) to the tier: the copy starts
 * once the work enqueued on the compute stream so far is done (it runs on the engine's copy
 * stream), and p is freed at once, stream-ordered: its memory goes back to the allocator when
 * the copy's event completes. *handle names the data for qc_memctx_fetch / _drop. tag names the
 * tensor in errors. QC_ERR_UNSUPPORTED without an offload engine; QC_ERR_NOMEM when the tier is
 * full (p is then still live and the caller's). */
enum qc_status qc_memctx_put(struct qc_memctx *mc, enum qc_mem_class cls, void *p, size_t bytes,
                             enum qc_memctx_place place, const char *tag, uint64_t *handle);
/* Allocates bytes of class cls (tag) and starts copying handle's data into it on the copy-in
 * stream, after the compute stream's earlier work; *p is the destination. The data is there
 * for the compute stream only after qc_memctx_wait(handle). QC_ERR_NOMEM (nothing allocated);
 * QC_ERR_IO for NVMe data that cannot be read or fails its checksum (the error names file,
 * offset and tag; nothing allocated). */
enum qc_status qc_memctx_fetch(struct qc_memctx *mc, enum qc_mem_class cls, uint64_t handle,
                               size_t bytes, const char *tag, void **p);
/* Makes the compute stream wait for handle's fetch (a no-op when it has none in flight). The
 * host time blocked here is counted as stall (stats.stall_s). */
enum qc_status qc_memctx_wait(struct qc_memctx *mc, uint64_t handle);
/* Marks in the allocator's trace (docs/TRACE.md) that block application name's forward re-runs
 * now to rebuild bytes of stash (a no-op without a caching allocator or its trace). Puts and
 * fetches mark themselves. */
void qc_memctx_mark_recompute(struct qc_memctx *mc, const char *name, size_t bytes);
/* Gives the tier memory of handle back (after the last fetch was waited for). 0: no-op. */
void qc_memctx_drop(struct qc_memctx *mc, uint64_t handle);

/* Tests: allocation number k (1-based, counted from this call) and the count - 1 after it fail
 * with QC_ERR_NOMEM ("injected"); k <= 0 disarms. count may be INT64_MAX (all after k). */
void qc_memctx_fail_at(struct qc_memctx *mc, int64_t k, int64_t count);
/* Tests: fn(user, tag, cls, bytes, alloc) after every successful allocation (alloc true) and
 * before every free (tag NULL). NULL fn removes it. */
void qc_memctx_set_observer(struct qc_memctx *mc,
                            void (*fn)(void *user, const char *tag, enum qc_mem_class cls,
                                       size_t bytes, bool alloc),
                            void *user);

#ifdef __cplusplus
}
#endif

#endif /* QC_MEM_QC_MEMCTX_H */
