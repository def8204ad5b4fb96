/*
 * fault.c — the completion policy every backend shares, and the fault hook tests arm.
 *
 * A raw completion (bytes transferred or -errno) goes through offload_io_result():
 *   1. the armed fault, if this is its nth matching completion, rewrites the result (short, zero,
 *      EIO, ENOSPC, EAGAIN) or flips one byte of what was just written, on disk;
 *   2. EAGAIN/EINTR are resubmitted (at most OFFLOAD_MAX_RETRIES in a row);
 *   3. a short transfer that made progress is resubmitted for the rest; one that made none ends
 *      the I/O with -ENODATA; under O_DIRECT a remainder that is not 4096-aligned ends it with
 *      -EINVAL. Short I/O is never ignored.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offload_internal.h"

void offload_fault_init(struct offload_fault *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
}

void offload_fault_deinit(struct offload_fault *f)
{
    pthread_mutex_destroy(&f->mu);
}

void qc_offload_fault_set(struct qc_offload *o, enum qc_offload_fault fault,
                          enum qc_offload_fault_op op, uint64_t nth)
{
    struct offload_fault *f = &o->fault;
    pthread_mutex_lock(&f->mu);
    f->kind = fault;
    f->op = op;
    f->nth = nth ? nth : 1;
    f->seen = 0;
    f->fired = false;
    pthread_mutex_unlock(&f->mu);
}

bool qc_offload_fault_fired(struct qc_offload *o)
{
    pthread_mutex_lock(&o->fault.mu);
    bool fired = o->fault.fired;
    pthread_mutex_unlock(&o->fault.mu);
    return fired;
}

/* Returns the fault to apply to this completion (NONE almost always). */
static enum qc_offload_fault fault_take(struct offload_fault *f, enum offload_op op)
{
    enum qc_offload_fault kind = QC_OFFLOAD_FAULT_NONE;
    pthread_mutex_lock(&f->mu);
    bool match = f->op == QC_OFFLOAD_FAULT_ANY ||
                 (f->op == QC_OFFLOAD_FAULT_READ && op == OFFLOAD_READ) ||
                 (f->op == QC_OFFLOAD_FAULT_WRITE && op == OFFLOAD_WRITE);
    if (f->kind != QC_OFFLOAD_FAULT_NONE && !f->fired && match && ++f->seen == f->nth) {
        kind = f->kind;
        f->fired = true;
    }
    pthread_mutex_unlock(&f->mu);
    return kind;
}

/* Flips the byte at file offset off, through the engine's own descriptor (aligned bounce
 * buffer, so it works under O_DIRECT). Best effort: the test checks that it took. */
static void fault_flip_on_disk(const struct offload_io_env *env, uint64_t off)
{
    void *bounce = NULL;
    if (posix_memalign(&bounce, OFFLOAD_ALIGN, OFFLOAD_ALIGN) != 0)
        return;
    uint64_t base = off / OFFLOAD_ALIGN * OFFLOAD_ALIGN;
    if (pread(env->fd, bounce, OFFLOAD_ALIGN, (off_t)base) == (ssize_t)OFFLOAD_ALIGN) {
        ((unsigned char *)bounce)[off - base] ^= 0x5a;
        if (pwrite(env->fd, bounce, OFFLOAD_ALIGN, (off_t)base) != (ssize_t)OFFLOAD_ALIGN)
            (void)0; /* the checksum test will report that the flip did not happen */
    }
    free(bounce);
}

bool offload_io_result(const struct offload_io_env *env, struct offload_io *io, long res)
{
    size_t left = io->len - io->done;
    size_t align = env->direct ? OFFLOAD_ALIGN : 1;

    switch (fault_take(env->fault, io->op)) {
    case QC_OFFLOAD_FAULT_NONE:
        break;
    case QC_OFFLOAD_FAULT_SHORT:
        if (res > 0)
            res = (long)(left / 2 / align * align);
        break;
    case QC_OFFLOAD_FAULT_ZERO:
        res = 0;
        break;
    case QC_OFFLOAD_FAULT_EIO:
        res = -EIO;
        break;
    case QC_OFFLOAD_FAULT_ENOSPC:
        res = -ENOSPC;
        break;
    case QC_OFFLOAD_FAULT_EAGAIN:
        res = -EAGAIN;
        break;
    case QC_OFFLOAD_FAULT_FLIP:
        if (io->op == OFFLOAD_WRITE && res > 0)
            fault_flip_on_disk(env, io->off + io->done + (uint64_t)(res - 1) / 2);
        break;
    }

    if (res == -EAGAIN || res == -EINTR) {
        if (++io->retries <= OFFLOAD_MAX_RETRIES) {
            atomic_fetch_add(&env->ctr->retries, 1);
            return false;
        }
        io->res = (int)res;
        return true;
    }
    io->retries = 0;
    if (res < 0) {
        io->res = (int)res;
        return true;
    }
    if ((size_t)res >= left) {
        io->done = io->len;
        io->res = 0;
        return true;
    }
    if (res == 0) {
        io->res = -ENODATA; /* no progress: the caller reports it as a short transfer */
        return true;
    }
    io->done += (size_t)res;
    if (io->done % align != 0) {
        io->res = -EINVAL; /* an O_DIRECT remainder must stay aligned */
        return true;
    }
    atomic_fetch_add(&env->ctr->short_ios, 1);
    return false;
}
