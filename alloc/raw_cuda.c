/*
 * raw_cuda.c — the CUDA raw backend; the ONLY file that calls cudaMalloc*, cuMem* or
 * cudaHostRegister (CI greps for strays). Compiled only when QC_HAVE_CUDA.
 *
 * Fixed segments: cudaMalloc / cudaFree. Expandable segments (VMM): cuMemAddressReserve of the
 * whole range once; each granule is backed on demand by its own physical allocation
 * (cuMemCreate + cuMemMap + cuMemSetAccess) so any granule, in the middle too, can be given
 * back (cuMemUnmap + cuMemRelease) without moving the blocks around it.
 * Driver (CUresult) codes are converted here with raw_cu_check, built on QC_CHECK_GEN.
 */
#include "alloc_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* PFN_cu* driver entry-point types */

#include "qc_cuda_check.h"

/* The driver API is reached through the runtime's entry-point query, not by linking
 * libcuda: binaries of a CUDA build must load (and report "no GPU") on machines without a
 * driver, like CI. */
static struct {
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuGetErrorString_v6000 GetErrorString;
    PFN_cuMemAddressReserve_v10020 MemAddressReserve;
    PFN_cuMemUnmap_v10020 MemUnmap;
    PFN_cuMemRelease_v10020 MemRelease;
    PFN_cuMemCreate_v10020 MemCreate;
    PFN_cuMemMap_v10020 MemMap;
    PFN_cuMemSetAccess_v10020 MemSetAccess;
    PFN_cuMemAddressFree_v10020 MemAddressFree;
    PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
    int loaded;
} drv;

/* The driver's entry point sym, as the CUDA 12.0 ABI declares it (the PFN_*_v<N> types above).
 * cudaGetDriverEntryPointByVersion exists from CUDA 12.5 on (and is the only one left in 13);
 * 12.0 - 12.4 have cudaGetDriverEntryPoint, which returns the version matching the toolkit
 * the binary was built with (CUDART_VERSION, here 12.0 - 12.4): for the entry points above,
 * the versions their PFN types name. */
static cudaError_t drv_entry_point(const char *sym, void **fn,
                                   enum cudaDriverEntryPointQueryResult *q)
{
#if CUDART_VERSION >= 12050
    return cudaGetDriverEntryPointByVersion(sym, fn, 12000, cudaEnableDefault, q);
#else
    return cudaGetDriverEntryPoint(sym, fn, cudaEnableDefault, q);
#endif
}

static enum qc_status drv_load(void)
{
    if (drv.loaded)
        return QC_OK;
    struct {
        const char *sym;
        void **fn;
    } want[] = {
        {"cuGetErrorName", (void **)&drv.GetErrorName},
        {"cuGetErrorString", (void **)&drv.GetErrorString},
        {"cuMemAddressReserve", (void **)&drv.MemAddressReserve},
        {"cuMemUnmap", (void **)&drv.MemUnmap},
        {"cuMemRelease", (void **)&drv.MemRelease},
        {"cuMemCreate", (void **)&drv.MemCreate},
        {"cuMemMap", (void **)&drv.MemMap},
        {"cuMemSetAccess", (void **)&drv.MemSetAccess},
        {"cuMemAddressFree", (void **)&drv.MemAddressFree},
        {"cuMemGetAllocationGranularity", (void **)&drv.MemGetAllocationGranularity},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
        QC_TRY(QC_CUDA(drv_entry_point(want[i].sym, want[i].fn, &q)));
        if (q != cudaDriverEntryPointSuccess || !*want[i].fn)
            return qc_errorf(QC_ERR_UNSUPPORTED,
                             "cuda raw backend: driver entry point %s not found (status %d)\n"
                             "hint: update the NVIDIA driver (CUDA 12.0 or newer)",
                             want[i].sym, (int)q);
    }
    drv.loaded = 1;
    return QC_OK;
}

static enum qc_status raw_cu_check(CUresult r, const char *call, const char *file, int line)
{
    if (r == CUDA_SUCCESS)
        return QC_OK;
    const char *name = NULL, *why = NULL;
    if (!drv.loaded || drv.GetErrorName(r, &name) != CUDA_SUCCESS)
        name = "?";
    if (!drv.loaded || drv.GetErrorString(r, &why) != CUDA_SUCCESS)
        why = "unknown driver error";
    enum qc_status st = r == CUDA_ERROR_OUT_OF_MEMORY ? QC_ERR_NOMEM : QC_ERR_CUDA;
    return qc_errorf(st, "%s failed: %s (%s) | %s:%d", call, why, name, file, line);
}

#define RAW_CU(call) QC_CHECK_GEN(call, raw_cu_check)

struct cuda_ctx {
    int device;               /* runtime ordinal */
    CUmemAllocationProp prop; /* pinned device memory on `device` */
    CUmemAccessDesc access;   /* read/write for `device` */
};

struct cuda_reservation {
    CUdeviceptr base;
    size_t size;
    size_t granule;
    CUmemGenericAllocationHandle *handles; /* [size / granule]; 0 = not mapped */
};

static uintptr_t dptr_to_uintptr(CUdeviceptr p)
{
    return (uintptr_t)p;
}

static enum qc_status cuda_map(struct alloc_raw *raw, size_t size, void **out)
{
    (void)raw;
    void *p = NULL;
    QC_TRY(QC_CUDA(cudaMalloc(&p, size)));
    *out = p;
    return QC_OK;
}

static void cuda_unmap(struct alloc_raw *raw, void *ptr, size_t size)
{
    (void)raw;
    (void)size;
    if (QC_CUDA(cudaFree(ptr)) != QC_OK)
        qc_log(QC_LOG_ERROR, "alloc: %s", qc_error_last());
}

static enum qc_status cuda_reserve(struct alloc_raw *raw, size_t size, void **base, void **handle)
{
    struct cuda_reservation *r = calloc(1, sizeof *r);
    if (!r)
        return qc_errorf(QC_ERR_NOMEM, "VMM reservation: out of host memory");
    r->granule = raw->granularity;
    r->size = size;
    r->handles = calloc(size / r->granule, sizeof *r->handles);
    if (!r->handles) {
        free(r);
        return qc_errorf(QC_ERR_NOMEM, "VMM reservation: out of host memory");
    }
    enum qc_status st = RAW_CU(drv.MemAddressReserve(&r->base, size, r->granule, 0, 0));
    if (st != QC_OK) {
        free(r->handles);
        free(r);
        return st;
    }
    *base = (void *)dptr_to_uintptr(r->base);
    *handle = r;
    return QC_OK;
}

static enum qc_status cuda_decommit(struct alloc_raw *raw, void *handle, size_t offset, size_t size)
{
    (void)raw;
    struct cuda_reservation *r = handle;
    enum qc_status first = QC_OK;
    for (size_t off = offset; off < offset + size; off += r->granule) {
        size_t i = off / r->granule;
        if (!r->handles[i])
            continue;
        enum qc_status st = RAW_CU(drv.MemUnmap(r->base + off, r->granule));
        if (st == QC_OK)
            st = RAW_CU(drv.MemRelease(r->handles[i]));
        r->handles[i] = 0;
        if (st != QC_OK && first == QC_OK)
            first = st;
    }
    return first;
}

static enum qc_status cuda_commit(struct alloc_raw *raw, void *handle, size_t offset, size_t size)
{
    struct cuda_ctx *c = raw->ctx;
    struct cuda_reservation *r = handle;
    QC_ASSERT(offset % r->granule == 0 && size % r->granule == 0 && offset + size <= r->size,
              "commit [%zu, +%zu) not granule-aligned in %zu", offset, size, r->size);
    for (size_t off = offset; off < offset + size; off += r->granule) {
        size_t i = off / r->granule;
        QC_ASSERT(r->handles[i] == 0, "granule %zu committed twice", i);
        CUmemGenericAllocationHandle h = 0;
        enum qc_status st = RAW_CU(drv.MemCreate(&h, r->granule, &c->prop, 0));
        if (st == QC_OK) {
            st = RAW_CU(drv.MemMap(r->base + off, r->granule, 0, h, 0));
            if (st != QC_OK)
                (void)RAW_CU(drv.MemRelease(h));
        }
        if (st == QC_OK) {
            r->handles[i] = h;
            st = RAW_CU(drv.MemSetAccess(r->base + off, r->granule, &c->access, 1));
        }
        if (st != QC_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", qc_error_last());
            (void)cuda_decommit(raw, handle, offset, off + r->granule - offset);
            return qc_errorf(st, "%s", msg);
        }
    }
    return QC_OK;
}

static void cuda_release(struct alloc_raw *raw, void *handle)
{
    struct cuda_reservation *r = handle;
    if (cuda_decommit(raw, handle, 0, r->size) != QC_OK ||
        RAW_CU(drv.MemAddressFree(r->base, r->size)) != QC_OK)
        qc_log(QC_LOG_ERROR, "alloc: releasing a VMM reservation: %s", qc_error_last());
    free(r->handles);
    free(r);
}

static void cuda_deinit(struct alloc_raw *raw)
{
    free(raw->ctx);
    raw->ctx = NULL;
}

static const struct alloc_raw_ops cuda_ops = {
    .map = cuda_map,
    .unmap = cuda_unmap,
    .reserve = cuda_reserve,
    .commit = cuda_commit,
    .decommit = cuda_decommit,
    .release = cuda_release,
    .deinit = cuda_deinit,
};

enum qc_status alloc_raw_cuda_init(struct alloc_raw *raw)
{
    memset(raw, 0, sizeof *raw);
    struct cuda_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return qc_errorf(QC_ERR_NOMEM, "cuda raw backend: out of host memory");
    enum qc_status st = drv_load();
    if (st == QC_OK)
        st = QC_CUDA(cudaGetDevice(&c->device));
    if (st == QC_OK)
        st = QC_CUDA(cudaFree(NULL)); /* makes the primary context current for the driver API */
    size_t granule = 0;
    if (st == QC_OK) {
        c->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        c->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        c->prop.location.id = c->device;
        c->access.location = c->prop.location;
        c->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        st = RAW_CU(drv.MemGetAllocationGranularity(&granule, &c->prop,
                                                    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    }
    size_t free_b = 0, total_b = 0;
    if (st == QC_OK)
        st = QC_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (st != QC_OK) {
        free(c);
        return st;
    }
    /* Granule: at least 2 MiB, a multiple of the driver's. */
    size_t g = (size_t)2 << 20;
    if (granule > g)
        g = granule;
    else if (granule && g % granule)
        g = granule * ((g + granule - 1) / granule);
    raw->ops = &cuda_ops;
    raw->name = "cuda";
    raw->granularity = g;
    raw->va_default = 2 * ((total_b + g - 1) / g) * g;
    raw->ctx = c;
    return QC_OK;
}

enum qc_status alloc_raw_cuda_set_device(int device)
{
    return QC_CUDA(cudaSetDevice(device));
}

enum qc_status alloc_raw_cuda_host_register(void *ptr, size_t size)
{
    return QC_CUDA(cudaHostRegister(ptr, size, cudaHostRegisterDefault));
}

enum qc_status alloc_raw_cuda_host_unregister(void *ptr)
{
    return QC_CUDA(cudaHostUnregister(ptr));
}
