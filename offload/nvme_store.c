/*
 * nvme_store.c — the spill file: creation, preallocation, the O_DIRECT probe, the extent
 * allocator, block checksums, and removal on exit and on SIGINT/SIGTERM.
 *
 * Removal. The file is created with O_EXCL and, unless the caller wants it visible, unlinked at
 * once: the data lives as long as the descriptor, so even SIGKILL or a crash leaves nothing on
 * disk. (The design needs no name after open: every access goes through the descriptor,
 * including the fault hook and the O_DIRECT fallback, which clears the flag with fcntl.) While a
 * name exists — the instant between open and unlink, or for the whole run with spill_visible —
 * the path is registered with qc_cleanup (src/base/qc_cleanup.h), whose SIGINT/SIGTERM handler
 * and atexit() hook unlink it. If the program has a handler of its own (a graceful stop), that
 * handler runs instead and the file is removed by destroy.
 *
 * Size. The file does not take its whole capacity up front: it starts at `initial` bytes (the
 * engine's nvme_initial; the trainer gives the plan's NVMe bytes through qc_offload_nvme_reserve
 * as soon as a plan exists) and grows in grow_step steps when an allocation finds no free extent,
 * up to capacity. A growth that the disk refuses (ENOSPC, EFBIG, ...) leaves the file and every
 * extent in it as they were, lowers the capacity to the size the file has and fails the
 * allocation with QC_ERR_NOMEM naming the file, the sizes and the errno: the caller's
 * out-of-memory path (the trainer re-plans without the missing NVMe bytes) takes over. The file
 * is removed at the end (close, below).
 *
 * Extents are 4096-aligned and first fit on an offset-sorted, coalesced free list that covers
 * [0, size).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <xxhash.h> /* XXH3_64bits */

#include "offload_internal.h"
#include "qc_cleanup.h"

uint64_t offload_checksum(const void *p, size_t n)
{
    return (uint64_t)XXH3_64bits(p, n);
}

// ---- open, preallocate, probe --------------------------------------------------------------

static void fs_name_of(long type, char *out, size_t cap)
{
    static const struct {
        long magic;
        const char *name;
    } names[] = {
        {0xEF53, "ext4"},      {0x01021994, "tmpfs"},     {0x58465342, "xfs"},
        {0x9123683E, "btrfs"}, {0x794c7630, "overlayfs"}, {0x6969, "nfs"},
        {0x2fc12fc1, "zfs"},   {0xF2F52010, "f2fs"},      {0x65735546, "fuse"},
        {0x858458f6, "ramfs"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (names[i].magic == type) {
            snprintf(out, cap, "%s", names[i].name);
            return;
        }
    }
    snprintf(out, cap, "fs 0x%lx", (unsigned long)type);
}

/* ftruncate + zero writes of [from, to), for filesystems without fallocate. On failure the file
 * is cut back to `from`. */
static enum qc_status nvme_fill_zeros(int fd, uint64_t from, uint64_t to)
{
    if (ftruncate(fd, (off_t)to) != 0) {
        const int err = errno;
        if (ftruncate(fd, (off_t)from) != 0) { /* best effort: the size it had */
        }
        errno = err;
        return QC_ERR_IO;
    }
    const size_t chunk = (size_t)1 << 20;
    void *zeros = NULL;
    if (posix_memalign(&zeros, OFFLOAD_ALIGN, chunk) != 0) {
        errno = ENOMEM;
        return QC_ERR_NOMEM;
    }
    memset(zeros, 0, chunk);
    enum qc_status st = QC_OK;
    for (uint64_t off = from; off < to && st == QC_OK;) {
        size_t len = to - off < chunk ? (size_t)(to - off) : chunk;
        ssize_t w = pwrite(fd, zeros, len, (off_t)off);
        if (w <= 0) {
            const int err = w < 0 ? errno : ENOSPC;
            if (ftruncate(fd, (off_t)from) != 0) { /* best effort */
            }
            errno = err;
            st = QC_ERR_IO;
        } else {
            off += (uint64_t)w;
        }
    }
    free(zeros);
    return st;
}

/* Gives the file the bytes [n->size, to): fallocate, or zero writes where the filesystem has
 * none (n->prealloc says which). Returns 0, or an errno with the file's size unchanged. */
static int nvme_extend(struct offload_nvme *n, int fd, uint64_t to, int sim_errno)
{
    const uint64_t from = n->size;
    if (strcmp(n->prealloc, "fallocate") == 0) {
        int ret = -1;
        if (sim_errno)
            errno = sim_errno;
        else
            ret = fallocate(fd, 0, (off_t)from, (off_t)(to - from));
        if (ret == 0)
            return 0;
        const int err = errno;
        if (err != EOPNOTSUPP && err != ENOSYS) {
            if (!sim_errno && ftruncate(fd, (off_t)from) != 0) { /* a partial allocation */
            }
            return err;
        }
        n->prealloc = "ftruncate+writes";
    }
    if (sim_errno && sim_errno != EOPNOTSUPP)
        return sim_errno;
    return nvme_fill_zeros(fd, from, to) == QC_OK ? 0 : (errno ? errno : EIO);
}

/* Adds [off, off + len) to the free list, coalescing with its neighbours. */
static void extent_insert(struct offload_nvme *n, uint64_t off, uint64_t len);

/* Grows the file to hold `need` bytes: rounded up to grow_step, at most capacity. */
static enum qc_status nvme_grow(struct offload_nvme *n, uint64_t need)
{
    if (need <= n->size)
        return QC_OK;
    uint64_t to = offload_round_up(need, n->grow_step);
    to = to < n->capacity ? to : n->capacity;
    if (to < need)
        return QC_ERR_NOMEM; /* the caller says "full" */
    const int err = nvme_extend(n, n->fd, to, n->sim_grow_errno);
    if (err) {
        const uint64_t cap = n->capacity;
        n->capacity = n->size; /* the disk is full: no growth from now on */
        snprintf(n->grow_why, sizeof n->grow_why, "growing to %llu bytes failed: %s",
                 (unsigned long long)to, strerror(err));
        return qc_errorf(QC_ERR_NOMEM,
                         "offload: spill file %s: growing from %llu to %llu bytes (limit %llu) "
                         "failed: %s; the file keeps its %llu bytes and its data\nhint: free "
                         "space in %s or lower offload.nvme_capacity",
                         n->path, (unsigned long long)n->size, (unsigned long long)to,
                         (unsigned long long)cap, strerror(err), (unsigned long long)n->size,
                         n->dir);
    }
    extent_insert(n, n->size, to - n->size);
    n->size = to;
    n->grows++;
    if (n->size > n->size_peak)
        n->size_peak = n->size;
    return QC_OK;
}

/* Writes and reads back one aligned block under O_DIRECT; EINVAL means the filesystem accepts
 * the flag at open but not the I/O: clear it. */
static enum qc_status nvme_probe_direct(struct offload_nvme *n, int fd)
{
    void *buf = NULL;
    if (posix_memalign(&buf, OFFLOAD_ALIGN, OFFLOAD_ALIGN) != 0)
        return qc_errorf(QC_ERR_NOMEM, "spill file %s: out of memory", n->path);
    memset(buf, 0, OFFLOAD_ALIGN);
    int err = 0;
    if (pwrite(fd, buf, OFFLOAD_ALIGN, 0) != (ssize_t)OFFLOAD_ALIGN ||
        pread(fd, buf, OFFLOAD_ALIGN, 0) != (ssize_t)OFFLOAD_ALIGN)
        err = errno ? errno : EIO;
    free(buf);
    if (err == 0)
        return QC_OK;
    if (err != EINVAL)
        return qc_errorf(QC_ERR_IO, "spill file %s: O_DIRECT probe I/O: %s", n->path,
                         strerror(err));
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0)
        return qc_errorf(QC_ERR_IO, "spill file %s: clearing O_DIRECT: %s", n->path,
                         strerror(errno));
    n->direct = false;
    snprintf(n->direct_why, sizeof n->direct_why, "O_DIRECT I/O rejected by %s (EINVAL)",
             n->fs_name);
    return QC_OK;
}

enum qc_status offload_nvme_open(struct offload_nvme *n, const char *dir, uint64_t capacity,
                                 uint64_t initial, uint64_t grow_step, bool want_direct,
                                 bool visible, int sim_direct_errno, int sim_fallocate_errno)
{
    static atomic_uint seq;
    memset(n, 0, sizeof *n);
    n->fd = -1;
    n->spill_slot = -1;
    n->visible = visible;
    capacity = offload_round_up(capacity, OFFLOAD_ALIGN);
    grow_step = offload_round_up(grow_step ? grow_step : OFFLOAD_ALIGN, OFFLOAD_ALIGN);
    initial = offload_round_up(initial > OFFLOAD_ALIGN ? initial : OFFLOAD_ALIGN, OFFLOAD_ALIGN);
    initial = initial < capacity ? initial : capacity;
    snprintf(n->dir, sizeof n->dir, "%s", dir);
    if (capacity == 0)
        return qc_errorf(QC_ERR_INVALID, "offload: nvme_capacity is 0\nhint: set "
                                         "offload.nvme_capacity (e.g. 16G) or no nvme_dir");
    int len = snprintf(n->path, sizeof n->path, "%s/qctrain-spill-%ld-%u.bin", dir, (long)getpid(),
                       atomic_fetch_add(&seq, 1));
    if (len < 0 || (size_t)len >= sizeof n->path)
        return qc_errorf(QC_ERR_INVALID, "offload: spill directory path too long: %s", dir);
    struct statfs sfs;
    if (statfs(dir, &sfs) != 0)
        return qc_errorf(QC_ERR_IO,
                         "offload: spill directory %s: %s\nhint: create it or set "
                         "offload.nvme_dir to a writable directory on a fast disk",
                         dir, strerror(errno));
    fs_name_of((long)sfs.f_type, n->fs_name, sizeof n->fs_name);

    n->spill_slot = qc_cleanup_register(n->path);
    if (n->spill_slot < 0 && visible)
        qc_log(QC_LOG_WARN,
               "offload: more than %d visible spill files; %s will not be removed "
               "on SIGINT/SIGTERM",
               QC_CLEANUP_MAX, n->path);
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    int fd = -1;
    if (want_direct) {
        if (sim_direct_errno)
            errno = sim_direct_errno;
        else
            fd = open(n->path, flags | O_DIRECT, 0600);
        if (fd < 0)
            snprintf(n->direct_why, sizeof n->direct_why, "open(O_DIRECT) on %s: %s", n->fs_name,
                     strerror(errno));
        else
            n->direct = true;
    }
    if (fd < 0)
        fd = open(n->path, flags, 0600);
    if (fd < 0) {
        enum qc_status st = qc_errorf(QC_ERR_IO,
                                      "spill file %s: open: %s\nhint: make "
                                      "offload.nvme_dir a writable directory",
                                      n->path, strerror(errno));
        qc_cleanup_unregister(n->spill_slot);
        n->spill_slot = -1;
        return st;
    }
    if (!visible) {
        unlink(n->path);
        qc_cleanup_unregister(n->spill_slot);
        n->spill_slot = -1;
    }

    enum qc_status st = QC_OK;
    n->prealloc = "fallocate";
    n->size = 0;
    const int err = nvme_extend(n, fd, initial, sim_fallocate_errno);
    if (err == ENOSPC || err == EFBIG)
        st = qc_errorf(QC_ERR_IO,
                       "spill file %s: cannot allocate its first %llu bytes: %s\nhint: free "
                       "space in %s",
                       n->path, (unsigned long long)initial, strerror(err), dir);
    else if (err)
        st = qc_errorf(QC_ERR_IO, "spill file %s: allocating %llu bytes (%s): %s", n->path,
                       (unsigned long long)initial, n->prealloc, strerror(err));
    if (st == QC_OK && n->direct)
        st = nvme_probe_direct(n, fd);
    if (st == QC_OK) {
        n->free_list = malloc(sizeof *n->free_list);
        if (!n->free_list)
            st = qc_errorf(QC_ERR_NOMEM, "spill file %s: out of memory", n->path);
    }
    if (st != QC_OK) {
        close(fd);
        if (visible)
            unlink(n->path);
        qc_cleanup_unregister(n->spill_slot);
        n->spill_slot = -1;
        n->direct = false;
        return st;
    }
    n->free_list->off = 0;
    n->free_list->len = initial;
    n->free_list->next = NULL;
    n->capacity = capacity;
    n->size = n->size_peak = initial;
    n->grow_step = grow_step;
    n->fd = fd;
    return QC_OK;
}

void offload_nvme_close(struct offload_nvme *n)
{
    if (n->fd >= 0) {
        close(n->fd);
        if (n->visible)
            unlink(n->path);
    }
    qc_cleanup_unregister(n->spill_slot);
    n->spill_slot = -1;
    n->fd = -1;
    while (n->free_list) {
        struct offload_extent *e = n->free_list;
        n->free_list = e->next;
        free(e);
    }
}

// ---- extents -------------------------------------------------------------------------------

/* First fit in the free list; false when no extent holds len bytes. */
static bool first_fit(struct offload_nvme *n, uint64_t len, uint64_t *off)
{
    struct offload_extent **pp = &n->free_list;
    for (; *pp; pp = &(*pp)->next) {
        struct offload_extent *e = *pp;
        if (e->len < len)
            continue;
        *off = e->off;
        e->off += len;
        e->len -= len;
        if (e->len == 0) {
            *pp = e->next;
            free(e);
        }
        n->used += len;
        if (n->used > n->peak)
            n->peak = n->used;
        return true;
    }
    return false;
}

enum qc_status offload_nvme_alloc(struct offload_nvme *n, uint64_t len, uint64_t *off)
{
    len = offload_round_up(len, OFFLOAD_ALIGN);
    if (first_fit(n, len, off))
        return QC_OK;
    /* grow: a free extent at the end of the file counts towards len */
    uint64_t tail = 0;
    for (const struct offload_extent *e = n->free_list; e; e = e->next)
        if (!e->next && e->off + e->len == n->size)
            tail = e->len;
    const uint64_t need = n->size - tail + len;
    if (need <= n->capacity) {
        QC_TRY(nvme_grow(n, need));
        if (first_fit(n, len, off))
            return QC_OK;
    }
    if (n->grow_why[0])
        return qc_errorf(QC_ERR_NOMEM,
                         "offload: spill file full: %llu bytes wanted, %llu of %llu in use; "
                         "it cannot grow (%s)\nhint: free space in %s",
                         (unsigned long long)len, (unsigned long long)n->used,
                         (unsigned long long)n->capacity, n->grow_why, n->dir);
    return qc_errorf(QC_ERR_NOMEM,
                     "offload: spill file full: %llu bytes wanted, %llu of %llu in use "
                     "(or fragmented)\nhint: raise offload.nvme_capacity",
                     (unsigned long long)len, (unsigned long long)n->used,
                     (unsigned long long)n->capacity);
}

enum qc_status offload_nvme_reserve(struct offload_nvme *n, uint64_t bytes)
{
    bytes = offload_round_up(bytes, OFFLOAD_ALIGN);
    if (bytes <= n->size)
        return QC_OK;
    if (bytes > n->capacity)
        bytes = n->capacity; /* as much as it may take: allocations past it fail as "full" */
    return nvme_grow(n, bytes);
}

void offload_nvme_free(struct offload_nvme *n, uint64_t off, uint64_t len)
{
    len = offload_round_up(len, OFFLOAD_ALIGN);
    n->used -= len;
    extent_insert(n, off, len);
}

static void extent_insert(struct offload_nvme *n, uint64_t off, uint64_t len)
{
    struct offload_extent *prev = NULL, *next = n->free_list;
    while (next && next->off < off) {
        prev = next;
        next = next->next;
    }
    QC_ASSERT(!next || off + len <= next->off, "spill extent %llu+%llu double free",
              (unsigned long long)off, (unsigned long long)len);
    bool join_prev = prev && prev->off + prev->len == off;
    bool join_next = next && off + len == next->off;
    if (join_prev && join_next) {
        prev->len += len + next->len;
        prev->next = next->next;
        free(next);
    } else if (join_prev) {
        prev->len += len;
    } else if (join_next) {
        next->off = off;
        next->len += len;
    } else {
        struct offload_extent *e = malloc(sizeof *e);
        if (!e) {
            qc_log(QC_LOG_WARN,
                   "offload: out of memory freeing a spill extent; %llu bytes of "
                   "the spill file are lost for this run",
                   (unsigned long long)len);
            return;
        }
        e->off = off;
        e->len = len;
        e->next = next;
        if (prev)
            prev->next = e;
        else
            n->free_list = e;
    }
}
