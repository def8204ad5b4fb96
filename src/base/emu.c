/*
 * emu.c — emulated device memory (qc_emu.h): one PROT_NONE reservation, page-granular
 * first-fit blocks with coalescing, opened (PROT_READ|PROT_WRITE up to the high-water mark)
 * only while an op or a memory move runs. Fresh and freed blocks are filled with 0xFF bytes
 * (a NaN pattern), as device memory holds garbage: a read of memory nobody wrote shows up as
 * NaN in the results rather than as a lucky zero.
 *
 * Host registration (the pinned arena on EMU) keeps a list of the registered ranges under the
 * same lock; the thread's current device is a thread-local int, as the CUDA runtime keeps it.
 */
#include "qc_emu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qc_status.h"

#define EMU_FILL 0xFF
#define EMU_HUGE ((size_t)2 << 20) /* protection granule: one transparent huge page */

struct emu_range {
    size_t off, len; /* bytes from base; multiples of the page size */
};

struct emu_host_range {
    void *base;
    size_t size;
};

struct qc_emu {
    int ordinal; /* the emulated device's ordinal (qc_emu_set_ordinal) */
    unsigned char *base;
    size_t reserve; /* bytes reserved */
    size_t page;
    size_t hw; /* high-water mark: [0, hw) has been handed out at some point */
    int open;  /* nesting count of enter */
    size_t live, peak;
    struct emu_range *free_r; /* free ranges below hw, sorted by off, coalesced */
    int nfree, capfree;
    struct emu_host_range *host; /* registered host ranges [nhost] of [caphost] */
    size_t nhost, caphost;
    struct qc_emu_host_stats hst;
    pthread_mutex_t mu;
};

static _Thread_local int emu_current_device; /* cudaSetDevice's per-thread state; 0 at first */

/* The used range rounded up to whole huge pages: every protection change covers [0, emu_hwp)
 * so the kernel never splits a huge page into 4 KiB entries. */
static size_t emu_hwp(const struct qc_emu *e)
{
    return (e->hw + EMU_HUGE - 1) / EMU_HUGE * EMU_HUGE;
}

static void emu_protect(struct qc_emu *e, size_t off, size_t len, int prot)
{
    if (len == 0)
        return;
    QC_ASSERT(mprotect(e->base + off, len, prot) == 0, "emu: mprotect(%zu bytes) failed", len);
}

enum qc_status qc_emu_create(size_t reserve, struct qc_emu **out)
{
    struct qc_emu *e = calloc(1, sizeof *e);
    if (!e)
        return qc_errorf(QC_ERR_NOMEM, "emu: out of host memory");
    e->page = (size_t)sysconf(_SC_PAGESIZE);
    e->reserve = (reserve + e->page - 1) / e->page * e->page;
    /* 2 MiB aligned and advised for transparent huge pages: enter/leave mprotect the whole
     * used range around every op, and that costs per page table entry (~20 ms per op at
     * 220 MiB with 4 KiB pages, ~0.07 ms with 2 MiB pages). Best effort: without THP it is
     * only slower. */
    const size_t huge = EMU_HUGE;
    e->reserve = (e->reserve + huge - 1) / huge * huge;
    void *raw = mmap(NULL, e->reserve + huge, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        size_t want = e->reserve;
        free(e);
        return qc_errorf(QC_ERR_NOMEM, "emu: cannot reserve %zu bytes of address space", want);
    }
    unsigned char *r = raw;
    unsigned char *p = (unsigned char *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
    if (p > r)
        munmap(r, (size_t)(p - r));
    size_t tail = (size_t)((r + e->reserve + huge) - (p + e->reserve));
    if (tail)
        munmap(p + e->reserve, tail);
    (void)madvise(p, e->reserve, MADV_HUGEPAGE);
    e->base = p;
    e->hst.refused_device = -1;
    pthread_mutex_init(&e->mu, NULL);
    *out = e;
    return QC_OK;
}

void qc_emu_destroy(struct qc_emu *e)
{
    if (!e)
        return;
    munmap(e->base, e->reserve);
    pthread_mutex_destroy(&e->mu);
    free(e->free_r);
    free(e->host);
    free(e);
}

static void emu_fill(struct qc_emu *e, size_t off, size_t len)
{
    if (!e->open)
        emu_protect(e, 0, emu_hwp(e), PROT_READ | PROT_WRITE);
    memset(e->base + off, EMU_FILL, len);
    if (!e->open)
        emu_protect(e, 0, emu_hwp(e), PROT_NONE);
}

void *qc_emu_alloc(struct qc_emu *e, size_t bytes)
{
    size_t len = bytes == 0 ? e->page : (bytes + e->page - 1) / e->page * e->page;
    pthread_mutex_lock(&e->mu);
    size_t off = SIZE_MAX;
    for (int i = 0; i < e->nfree; i++) {
        if (e->free_r[i].len < len)
            continue;
        off = e->free_r[i].off;
        e->free_r[i].off += len;
        e->free_r[i].len -= len;
        if (e->free_r[i].len == 0) {
            memmove(&e->free_r[i], &e->free_r[i + 1],
                    (size_t)(e->nfree - i - 1) * sizeof *e->free_r);
            e->nfree--;
        }
        break;
    }
    if (off == SIZE_MAX) {
        if (len > e->reserve - e->hw) {
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        off = e->hw;
        size_t old = emu_hwp(e);
        e->hw += len;
        if (e->open && emu_hwp(e) > old) /* the open window must cover the new pages too */
            emu_protect(e, old, emu_hwp(e) - old, PROT_READ | PROT_WRITE);
    }
    emu_fill(e, off, len);
    e->live += len;
    if (e->live > e->peak)
        e->peak = e->live;
    pthread_mutex_unlock(&e->mu);
    return e->base + off;
}

void qc_emu_free(struct qc_emu *e, void *p, size_t bytes)
{
    if (!p)
        return;
    unsigned char *q = p;
    QC_ASSERT(q >= e->base && q < e->base + e->hw && (size_t)(q - e->base) % e->page == 0,
              "emu: free of %p, not an arena block", p);
    size_t off = (size_t)(q - e->base);
    size_t len = bytes == 0 ? e->page : (bytes + e->page - 1) / e->page * e->page;
    pthread_mutex_lock(&e->mu);
    emu_fill(e, off, len);
    if (e->nfree == e->capfree) {
        int cap = e->capfree ? 2 * e->capfree : 64;
        struct emu_range *r = realloc(e->free_r, (size_t)cap * sizeof *r);
        QC_ASSERT(r, "emu: out of host memory for the free list");
        e->free_r = r;
        e->capfree = cap;
    }
    int i = 0;
    while (i < e->nfree && e->free_r[i].off < off)
        i++;
    QC_ASSERT(i == e->nfree || off + len <= e->free_r[i].off, "emu: double free of %p", p);
    QC_ASSERT(i == 0 || e->free_r[i - 1].off + e->free_r[i - 1].len <= off,
              "emu: double free of %p", p);
    memmove(&e->free_r[i + 1], &e->free_r[i], (size_t)(e->nfree - i) * sizeof *e->free_r);
    e->free_r[i] = (struct emu_range){off, len};
    e->nfree++;
    if (i + 1 < e->nfree && e->free_r[i].off + e->free_r[i].len == e->free_r[i + 1].off) {
        e->free_r[i].len += e->free_r[i + 1].len;
        memmove(&e->free_r[i + 1], &e->free_r[i + 2],
                (size_t)(e->nfree - i - 2) * sizeof *e->free_r);
        e->nfree--;
    }
    if (i > 0 && e->free_r[i - 1].off + e->free_r[i - 1].len == e->free_r[i].off) {
        e->free_r[i - 1].len += e->free_r[i].len;
        memmove(&e->free_r[i], &e->free_r[i + 1], (size_t)(e->nfree - i - 1) * sizeof *e->free_r);
        e->nfree--;
    }
    /* A free range that reaches the high-water mark goes back to the untouched tail, so a later
     * request larger than any hole still fits the reservation. Whole huge pages above the new
     * mark are closed even while the arena is open: nobody owns them. */
    if (e->nfree > 0 && e->free_r[e->nfree - 1].off + e->free_r[e->nfree - 1].len == e->hw) {
        size_t old = emu_hwp(e);
        e->hw = e->free_r[--e->nfree].off;
        if (emu_hwp(e) < old)
            emu_protect(e, emu_hwp(e), old - emu_hwp(e), PROT_NONE);
    }
    e->live -= len;
    pthread_mutex_unlock(&e->mu);
}

void qc_emu_enter(struct qc_emu *e)
{
    pthread_mutex_lock(&e->mu);
    if (e->open++ == 0)
        emu_protect(e, 0, emu_hwp(e), PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&e->mu);
}

void qc_emu_leave(struct qc_emu *e)
{
    pthread_mutex_lock(&e->mu);
    QC_ASSERT(e->open > 0, "emu: leave without enter");
    if (--e->open == 0)
        emu_protect(e, 0, emu_hwp(e), PROT_NONE);
    pthread_mutex_unlock(&e->mu);
}

size_t qc_emu_bytes_live(const struct qc_emu *e)
{
    return e->live;
}

size_t qc_emu_bytes_peak(const struct qc_emu *e)
{
    return e->peak;
}

// ---- the emulated device's ordinal, thread binding and host registration ------------------

void qc_emu_set_ordinal(struct qc_emu *e, int ordinal)
{
    QC_ASSERT(ordinal >= 0, "emu: device ordinal %d < 0", ordinal);
    pthread_mutex_lock(&e->mu);
    e->ordinal = ordinal;
    pthread_mutex_unlock(&e->mu);
}

int qc_emu_ordinal(const struct qc_emu *e)
{
    return e->ordinal;
}

void qc_emu_device_set(int ordinal)
{
    QC_ASSERT(ordinal >= 0, "emu: device ordinal %d < 0", ordinal);
    emu_current_device = ordinal;
}

int qc_emu_device_get(void)
{
    return emu_current_device;
}

/* Refuses a call from a thread whose current device is not e's (lock held). */
static enum qc_status emu_host_check_device(struct qc_emu *e, const char *what, const void *base)
{
    const int cur = emu_current_device;
    if (cur == e->ordinal)
        return QC_OK;
    e->hst.refused++;
    e->hst.refused_device = cur;
    return qc_errorf(QC_ERR_CUDA,
                     "emulated %s of host range %p for device %d from a thread whose current "
                     "device is %d (exclusive-process mode: device %d is not this rank's)",
                     what, base, e->ordinal, cur, cur);
}

enum qc_status qc_emu_host_register(struct qc_emu *e, void *base, size_t size)
{
    pthread_mutex_lock(&e->mu);
    enum qc_status st = emu_host_check_device(e, "cudaHostRegister", base);
    for (size_t i = 0; st == QC_OK && i < e->nhost; i++)
        if (e->host[i].base == base)
            st =
                qc_errorf(QC_ERR_CUDA, "emulated cudaHostRegister: %p is already registered", base);
    if (st == QC_OK && e->nhost == e->caphost) {
        const size_t cap = e->caphost ? 2 * e->caphost : 16;
        struct emu_host_range *r = realloc(e->host, cap * sizeof *r);
        if (r) {
            e->host = r;
            e->caphost = cap;
        } else {
            st = qc_errorf(QC_ERR_NOMEM, "emu: out of host memory for the registered ranges");
        }
    }
    if (st == QC_OK) {
        e->host[e->nhost++] = (struct emu_host_range){base, size};
        e->hst.registers++;
        e->hst.n_registered++;
        e->hst.bytes_registered += size;
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

enum qc_status qc_emu_host_unregister(struct qc_emu *e, void *base)
{
    pthread_mutex_lock(&e->mu);
    enum qc_status st = emu_host_check_device(e, "cudaHostUnregister", base);
    if (st == QC_OK) {
        size_t i = 0;
        while (i < e->nhost && e->host[i].base != base)
            i++;
        if (i == e->nhost) {
            st = qc_errorf(QC_ERR_CUDA, "emulated cudaHostUnregister: %p is not registered", base);
        } else {
            e->hst.bytes_registered -= e->host[i].size;
            e->hst.n_registered--;
            e->hst.unregisters++;
            e->host[i] = e->host[--e->nhost];
        }
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

void qc_emu_host_stats_get(struct qc_emu *e, struct qc_emu_host_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->hst;
    pthread_mutex_unlock(&e->mu);
}
