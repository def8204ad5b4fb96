/*
 * raw_emu.c — the emulated-device raw backend (params.emu): fixed segments are blocks of a
 * qc_emu arena (src/base/qc_emu.h) instead of mmap, so the memory an EMU model gets from the
 * allocator is PROT_NONE except while an op runs, and a host dereference outside an op faults.
 *
 * The arena has no reserve-and-commit, so the allocator serves expandable segments as plain
 * segments on this backend (qc_alloc_create clears params.expandable); reserve/commit/decommit
 * are never reached and say so. Like every raw backend this one never reads or writes segment
 * contents: the allocator's metadata lives in host structs outside the segments (pool.c), which
 * is what makes it a device allocator, and what lets it run over a protected arena.
 */
#include "alloc_internal.h"

#include <stdint.h>
#include <string.h>

#include "qc_emu.h"

#define EMU_GRANULE ((size_t)2 << 20) /* same unit as the host and CUDA backends */

static enum qc_status emu_map(struct alloc_raw *raw, size_t size, void **out)
{
    struct qc_emu *e = raw->ctx;
    void *p = qc_emu_alloc(e, size);
    if (!p)
        return qc_errorf(QC_ERR_NOMEM,
                         "emulated device arena exhausted (%zu bytes asked, %zu live, %zu peak)",
                         size, qc_emu_bytes_live(e), qc_emu_bytes_peak(e));
    *out = p;
    return QC_OK;
}

static void emu_unmap(struct alloc_raw *raw, void *ptr, size_t size)
{
    qc_emu_free(raw->ctx, ptr, size);
}

static enum qc_status emu_reserve(struct alloc_raw *raw, size_t size, void **base, void **handle)
{
    (void)raw;
    (void)base;
    (void)handle;
    return qc_errorf(QC_ERR_UNSUPPORTED,
                     "emulated device: no expandable segments (reservation of %zu bytes)", size);
}

static enum qc_status emu_commit(struct alloc_raw *raw, void *handle, size_t offset, size_t size)
{
    (void)raw;
    (void)handle;
    return qc_errorf(QC_ERR_UNSUPPORTED, "emulated device: no commit (%zu bytes at +%zu)", size,
                     offset);
}

static enum qc_status emu_decommit(struct alloc_raw *raw, void *handle, size_t offset, size_t size)
{
    (void)raw;
    (void)handle;
    return qc_errorf(QC_ERR_UNSUPPORTED, "emulated device: no decommit (%zu bytes at +%zu)", size,
                     offset);
}

static void emu_release(struct alloc_raw *raw, void *handle)
{
    (void)raw;
    QC_ASSERT(handle == NULL, "emulated device: release of reservation %p it never made", handle);
}

static void emu_deinit(struct alloc_raw *raw)
{
    (void)raw; /* the arena is the caller's */
}

static const struct alloc_raw_ops emu_ops = {
    .map = emu_map,
    .unmap = emu_unmap,
    .reserve = emu_reserve,
    .commit = emu_commit,
    .decommit = emu_decommit,
    .release = emu_release,
    .deinit = emu_deinit,
};

enum qc_status alloc_raw_emu_init(struct alloc_raw *raw, struct qc_emu *emu)
{
    memset(raw, 0, sizeof *raw);
    raw->ops = &emu_ops;
    raw->name = "emu";
    raw->granularity = EMU_GRANULE;
    raw->va_default = EMU_GRANULE; /* unused: no reservations */
    raw->ctx = emu;
    return QC_OK;
}
