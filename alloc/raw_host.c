/*
 * raw_host.c — the host raw backend: the CPU device's "device memory".
 *
 * Fixed segments are anonymous private mappings (MAP_NORESERVE: untouched pages cost nothing,
 * so a benchmark can model a 20 GiB batch without the RAM). Expandable segments are the host
 * analogue of CUDA VMM: a PROT_NONE reservation whose granules are committed with mprotect
 * (read/write) and decommitted with madvise(MADV_DONTNEED) + mprotect(PROT_NONE), which gives
 * the pages back to the kernel while the address range stays reserved.
 */
#include "alloc_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HOST_GRANULE ((size_t)2 << 20)  /* 2 MiB, the CUDA VMM granularity on current GPUs */
#define HOST_VA_MIN  ((size_t)16 << 30) /* address space of one expandable segment without a */
#define HOST_VA_MAX  ((size_t)1 << 40)  /* budget: 4 x physical RAM, clamped to [16 GiB, 1 TiB] */

struct host_reservation {
    char *base;
    size_t size;
};

static enum qc_status host_map(struct alloc_raw *raw, size_t size, void **out)
{
    (void)raw;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        return qc_errorf(e == ENOMEM ? QC_ERR_NOMEM : QC_ERR_IO, "mmap(%zu bytes) failed: %s", size,
                         strerror(e));
    }
    *out = p;
    return QC_OK;
}

static void host_unmap(struct alloc_raw *raw, void *ptr, size_t size)
{
    (void)raw;
    int rc = munmap(ptr, size);
    QC_ASSERT(rc == 0, "munmap(%p, %zu): %s", ptr, size, strerror(errno));
}

static enum qc_status host_reserve(struct alloc_raw *raw, size_t size, void **base, void **handle)
{
    (void)raw;
    struct host_reservation *r = malloc(sizeof *r);
    if (!r)
        return qc_errorf(QC_ERR_NOMEM, "host reservation: out of host memory");
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        free(r);
        return qc_errorf(e == ENOMEM ? QC_ERR_NOMEM : QC_ERR_IO,
                         "mmap(PROT_NONE, %zu bytes) reservation failed: %s", size, strerror(e));
    }
    r->base = p;
    r->size = size;
    *base = p;
    *handle = r;
    return QC_OK;
}

static enum qc_status host_commit(struct alloc_raw *raw, void *handle, size_t offset, size_t size)
{
    (void)raw;
    struct host_reservation *r = handle;
    QC_ASSERT(offset + size <= r->size, "commit past the reservation");
    if (mprotect(r->base + offset, size, PROT_READ | PROT_WRITE) != 0) {
        int e = errno;
        return qc_errorf(e == ENOMEM ? QC_ERR_NOMEM : QC_ERR_IO,
                         "mprotect(commit %zu bytes at +%zu) failed: %s", size, offset,
                         strerror(e));
    }
    return QC_OK;
}

static enum qc_status host_decommit(struct alloc_raw *raw, void *handle, size_t offset, size_t size)
{
    (void)raw;
    struct host_reservation *r = handle;
    QC_ASSERT(offset + size <= r->size, "decommit past the reservation");
    if (madvise(r->base + offset, size, MADV_DONTNEED) != 0 ||
        mprotect(r->base + offset, size, PROT_NONE) != 0) {
        return qc_errorf(QC_ERR_IO, "decommit %zu bytes at +%zu failed: %s", size, offset,
                         strerror(errno));
    }
    return QC_OK;
}

static void host_release(struct alloc_raw *raw, void *handle)
{
    (void)raw;
    struct host_reservation *r = handle;
    int rc = munmap(r->base, r->size);
    QC_ASSERT(rc == 0, "munmap(reservation %p, %zu): %s", (void *)r->base, r->size,
              strerror(errno));
    free(r);
}

static void host_deinit(struct alloc_raw *raw)
{
    (void)raw;
}

static const struct alloc_raw_ops host_ops = {
    .map = host_map,
    .unmap = host_unmap,
    .reserve = host_reserve,
    .commit = host_commit,
    .decommit = host_decommit,
    .release = host_release,
    .deinit = host_deinit,
};

enum qc_status alloc_raw_host_init(struct alloc_raw *raw)
{
    memset(raw, 0, sizeof *raw);
    raw->ops = &host_ops;
    raw->name = "host";
    raw->granularity = HOST_GRANULE;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : HOST_VA_MIN;
    size_t va = ram > HOST_VA_MAX / 4 ? HOST_VA_MAX : 4 * ram;
    if (va < HOST_VA_MIN)
        va = HOST_VA_MIN;
    raw->va_default = va / HOST_GRANULE * HOST_GRANULE;
    return QC_OK;
}
