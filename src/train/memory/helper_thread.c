/*
 * helper_thread.c — a thread that runs one job at a time for its owner (helper_thread.h).
 */
#include "helper_thread.h"

#include <string.h>

static void *helper_main(void *arg)
{
    struct helper_thread *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->quit && h->state != HELPER_RUNNING)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->quit)
            break;
        pthread_mutex_unlock(&h->mu);
        h->job(h->owner); /* the job's inputs are the owner's to change only after DONE */
        pthread_mutex_lock(&h->mu);
        h->state = HELPER_DONE;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

enum qc_status helper_thread_init(struct helper_thread *h, void (*job)(void *owner), void *owner,
                                  const char *what)
{
    *h = (struct helper_thread){.state = HELPER_IDLE, .job = job, .owner = owner};
    int e = pthread_mutex_init(&h->mu, NULL);
    if (e == 0) {
        e = pthread_cond_init(&h->cv, NULL);
        if (e != 0)
            pthread_mutex_destroy(&h->mu);
    }
    if (e == 0) {
        e = pthread_create(&h->th, NULL, helper_main, h);
        if (e != 0) {
            pthread_cond_destroy(&h->cv);
            pthread_mutex_destroy(&h->mu);
        }
    }
    if (e != 0)
        return qc_errorf(QC_ERR_NOMEM, "train: cannot start %s: %s", what, strerror(e));
    return QC_OK;
}

void helper_thread_deinit(struct helper_thread *h)
{
    pthread_mutex_lock(&h->mu);
    h->quit = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->th, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

void helper_thread_lock_idle(struct helper_thread *h)
{
    pthread_mutex_lock(&h->mu);
    while (h->state == HELPER_RUNNING)
        pthread_cond_wait(&h->cv, &h->mu);
}

void helper_thread_unlock(struct helper_thread *h)
{
    pthread_mutex_unlock(&h->mu);
}

void helper_thread_start(struct helper_thread *h)
{
    h->state = HELPER_RUNNING;
    pthread_cond_broadcast(&h->cv);
}
