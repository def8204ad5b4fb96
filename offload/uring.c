/*
 * uring.c — the io_uring backend; the ONLY file that includes liburing.h.
 *
 * Any thread submits (under sq_mu): requests go to a FIFO and are moved into the submission
 * queue while fewer than queue_depth are in flight. One reaper thread waits for completions,
 * feeds each into offload_io_result() (short I/O and EAGAIN are resubmitted for the rest) and
 * calls the request's completion with no lock held. The staging ring is registered as one fixed
 * buffer and the spill file as fixed file 0 when params ask for it; if the kernel refuses
 * (RLIMIT_MEMLOCK, old kernels) the backend runs unregistered and says so.
 *
 * The submit side and the reap side of a ring may be used from two different threads (liburing's
 * SQ and CQ are independent); only submission needs the lock. A NOP whose user_data is NULL
 * tells the reaper to stop.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <liburing.h>

#include "offload_internal.h"

struct uring_backend {
    struct offload_backend base; /* first: cast back */
    struct offload_io_env env;
    struct io_uring ring;
    bool fixed_buf;
    bool fixed_file;
    pthread_mutex_t sq_mu;   /* guards the SQ, pending and inflight */
    struct offload_io *head; /* pending FIFO */
    struct offload_io *tail;
    unsigned inflight; /* SQEs submitted and not reaped */
    unsigned depth;    /* max in flight */
    bool stopping;
    pthread_t reaper;
};

/* sq_mu held: moves pending requests into the SQ while there is room, then submits. */
static void uring_flush_locked(struct uring_backend *u)
{
    unsigned queued = 0;
    while (u->head && u->inflight < u->depth) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe)
            break;
        struct offload_io *io = u->head;
        u->head = io->next;
        if (!u->head)
            u->tail = NULL;
        io->next = NULL;
        unsigned char *buf = io->buf + io->done;
        unsigned n = (unsigned)(io->len - io->done);
        uint64_t off = io->off + io->done;
        int fd = u->fixed_file ? 0 : u->env.fd;
        if (io->op == OFFLOAD_READ) {
            if (u->fixed_buf)
                io_uring_prep_read_fixed(sqe, fd, buf, n, off, 0);
            else
                io_uring_prep_read(sqe, fd, buf, n, off);
        } else {
            if (u->fixed_buf)
                io_uring_prep_write_fixed(sqe, fd, buf, n, off, 0);
            else
                io_uring_prep_write(sqe, fd, buf, n, off);
        }
        if (u->fixed_file)
            sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data(sqe, io);
        u->inflight++;
        queued++;
        atomic_fetch_add(&u->env.ctr->ios_submitted, 1);
    }
    if (queued || u->stopping) {
        /* io_uring_submit only fails on a broken ring (EBADF, EFAULT); retry on EAGAIN/EINTR
         * (kernel short of memory) so requests are never lost. */
        int ret;
        do
            ret = io_uring_submit(&u->ring);
        while (ret == -EAGAIN || ret == -EINTR);
        QC_ASSERT(ret >= 0, "io_uring_submit: %s", strerror(-ret));
    }
}

static void uring_submit(struct offload_backend *b, struct offload_io *io)
{
    struct uring_backend *u = (struct uring_backend *)b;
    pthread_mutex_lock(&u->sq_mu);
    io->next = NULL;
    if (u->tail)
        u->tail->next = io;
    else
        u->head = io;
    u->tail = io;
    uring_flush_locked(u);
    pthread_mutex_unlock(&u->sq_mu);
}

static void *uring_reaper(void *arg)
{
    struct uring_backend *u = arg;
    for (;;) {
        struct io_uring_cqe *cqe = NULL;
        int ret = io_uring_wait_cqe(&u->ring, &cqe);
        if (ret == -EINTR || ret == -EAGAIN)
            continue;
        QC_ASSERT(ret == 0, "io_uring_wait_cqe: %s", strerror(-ret));
        struct offload_io *io = io_uring_cqe_get_data(cqe);
        long res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        pthread_mutex_lock(&u->sq_mu);
        u->inflight--;
        uring_flush_locked(u); /* room for one more */
        pthread_mutex_unlock(&u->sq_mu);
        if (!io)
            break; /* the stop NOP */
        if (offload_io_result(&u->env, io, res))
            io->complete(io);
        else
            uring_submit(&u->base, io);
    }
    return NULL;
}

static void uring_destroy(struct offload_backend *b)
{
    struct uring_backend *u = (struct uring_backend *)b;
    pthread_mutex_lock(&u->sq_mu);
    u->stopping = true;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    QC_ASSERT(sqe != NULL, "io_uring: no SQE for the stop request");
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    u->inflight++;
    uring_flush_locked(u);
    pthread_mutex_unlock(&u->sq_mu);
    pthread_join(u->reaper, NULL);
    QC_ASSERT(u->head == NULL, "io_uring backend destroyed with I/O pending");
    io_uring_queue_exit(&u->ring);
    pthread_mutex_destroy(&u->sq_mu);
    free(u);
}

enum qc_status offload_uring_create(const struct offload_io_env *env, struct offload_backend **out)
{
    struct uring_backend *u = calloc(1, sizeof *u);
    if (!u)
        return qc_errorf(QC_ERR_NOMEM, "offload: io_uring backend: out of memory");
    u->env = *env;
    u->depth = (unsigned)(env->queue_depth > 0 ? env->queue_depth : 1);
    int ret = env->sim_uring_errno ? -env->sim_uring_errno
                                   : io_uring_queue_init(u->depth + 1, &u->ring, 0);
    if (ret < 0) {
        free(u);
        return qc_errorf(QC_ERR_UNSUPPORTED, "io_uring_queue_init: %s%s", strerror(-ret),
                         ret == -EPERM || ret == -ENOSYS
                             ? " (io_uring blocked by a seccomp policy, "
                               "kernel.io_uring_disabled or an old kernel)"
                             : "");
    }
    struct io_uring_probe *probe = io_uring_get_probe_ring(&u->ring);
    bool ops_ok = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
                  io_uring_opcode_supported(probe, IORING_OP_WRITE);
    if (probe)
        io_uring_free_probe(probe);
    if (!ops_ok) {
        io_uring_queue_exit(&u->ring);
        free(u);
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "io_uring lacks IORING_OP_READ/WRITE (kernel older than 5.6)");
    }
    if (env->register_buffers) {
        struct iovec iov = {.iov_base = env->ring, .iov_len = env->ring_bytes};
        u->fixed_buf = env->ring && io_uring_register_buffers(&u->ring, &iov, 1) == 0;
        u->fixed_file = io_uring_register_files(&u->ring, &env->fd, 1) == 0;
        if (!u->fixed_buf || !u->fixed_file)
            qc_log(QC_LOG_INFO,
                   "offload: io_uring registration refused (buffers %s, file %s); running "
                   "unregistered\nhint: raise RLIMIT_MEMLOCK (ulimit -l) for fixed buffers",
                   u->fixed_buf ? "ok" : "no", u->fixed_file ? "ok" : "no");
    }
    pthread_mutex_init(&u->sq_mu, NULL);
    u->base.name = "io_uring";
    u->base.registered = u->fixed_buf && u->fixed_file;
    u->base.submit = uring_submit;
    u->base.destroy = uring_destroy;
    ret = pthread_create(&u->reaper, NULL, uring_reaper, u);
    if (ret != 0) {
        pthread_mutex_destroy(&u->sq_mu);
        io_uring_queue_exit(&u->ring);
        free(u);
        return qc_errorf(QC_ERR_NOMEM, "offload: io_uring reaper thread: %s", strerror(ret));
    }
    *out = &u->base;
    return QC_OK;
}
