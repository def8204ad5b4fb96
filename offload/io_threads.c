/*
 * io_threads.c — the thread-pool backend: the ladder's rung below io_uring, for machines where
 * io_uring is blocked. min(queue_depth, 16) workers take requests from one FIFO and do
 * pread/pwrite until the request is complete or has failed (offload_io_result decides), then
 * call its completion with no lock held.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offload_internal.h"

#define THREADS_MAX 16

struct threads_backend {
    struct offload_backend base; /* first: cast back */
    struct offload_io_env env;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct offload_io *head; /* pending FIFO */
    struct offload_io *tail;
    bool stopping;
    int nthreads;
    pthread_t threads[THREADS_MAX];
};

static void threads_submit(struct offload_backend *b, struct offload_io *io)
{
    struct threads_backend *t = (struct threads_backend *)b;
    pthread_mutex_lock(&t->mu);
    io->next = NULL;
    if (t->tail)
        t->tail->next = io;
    else
        t->head = io;
    t->tail = io;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static long threads_do_io(const struct threads_backend *t, struct offload_io *io)
{
    unsigned char *buf = io->buf + io->done;
    size_t n = io->len - io->done;
    off_t off = (off_t)(io->off + io->done);
    atomic_fetch_add(&t->env.ctr->ios_submitted, 1);
    ssize_t ret =
        io->op == OFFLOAD_READ ? pread(t->env.fd, buf, n, off) : pwrite(t->env.fd, buf, n, off);
    return ret < 0 ? -(long)errno : (long)ret;
}

static void *threads_worker(void *arg)
{
    struct threads_backend *t = arg;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (!t->head && !t->stopping)
            pthread_cond_wait(&t->cv, &t->mu);
        struct offload_io *io = t->head;
        if (!io) {
            pthread_mutex_unlock(&t->mu);
            return NULL;
        }
        t->head = io->next;
        if (!t->head)
            t->tail = NULL;
        pthread_mutex_unlock(&t->mu);
        while (!offload_io_result(&t->env, io, threads_do_io(t, io)))
            ;
        io->complete(io);
    }
}

static void threads_destroy(struct offload_backend *b)
{
    struct threads_backend *t = (struct threads_backend *)b;
    pthread_mutex_lock(&t->mu);
    t->stopping = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->nthreads; i++)
        pthread_join(t->threads[i], NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

enum qc_status offload_threads_create(const struct offload_io_env *env,
                                      struct offload_backend **out)
{
    struct threads_backend *t = calloc(1, sizeof *t);
    if (!t)
        return qc_errorf(QC_ERR_NOMEM, "offload: thread-pool backend: out of memory");
    t->env = *env;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->base.name = "threads";
    t->base.registered = false;
    t->base.submit = threads_submit;
    t->base.destroy = threads_destroy;
    int want = env->queue_depth < 1             ? 1
               : env->queue_depth > THREADS_MAX ? THREADS_MAX
                                                : env->queue_depth;
    for (int i = 0; i < want; i++) {
        int ret = pthread_create(&t->threads[i], NULL, threads_worker, t);
        if (ret != 0) {
            if (t->nthreads > 0)
                break; /* run with fewer workers */
            threads_destroy(&t->base);
            return qc_errorf(QC_ERR_NOMEM, "offload: I/O thread: %s", strerror(ret));
        }
        t->nthreads++;
    }
    *out = &t->base;
    return QC_OK;
}
