/*
 * helper_thread.h — a thread that runs one job at a time for its owner: the planning helpers
 * beside admission (plan_beside.c) and ahead of the next group (plan_ahead.c).
 *
 * States: IDLE -> RUNNING (helper_thread_start) -> DONE (the job returned) -> IDLE (the owner
 * sets state back once it has read or dropped the result). The owner writes the job's inputs and
 * reads its results only with the lock held and the helper not RUNNING (helper_thread_lock_idle);
 * the job runs without the lock and writes its results into the owner.
 */
#ifndef QC_TRAIN_MEMORY_HELPER_THREAD_H
#define QC_TRAIN_MEMORY_HELPER_THREAD_H

#include <pthread.h>
#include <stdbool.h>

#include "qc_status.h"

enum helper_state { HELPER_IDLE = 0, HELPER_RUNNING, HELPER_DONE };

struct helper_thread {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the helper waits for a job or the end; the owner for not RUNNING */
    enum helper_state state;
    bool quit;
    void (*job)(void *owner);
    void *owner;
};

/* Starts the thread, IDLE. QC_ERR_NOMEM naming `what` when it cannot. */
enum qc_status helper_thread_init(struct helper_thread *h, void (*job)(void *owner), void *owner,
                                  const char *what);
/* Ends the thread (not RUNNING, the owner's result freed: helper_thread_lock_idle first). */
void helper_thread_deinit(struct helper_thread *h);
/* Locks h and waits until no job runs: the state is IDLE or DONE when it returns. */
void helper_thread_lock_idle(struct helper_thread *h);
void helper_thread_unlock(struct helper_thread *h);
/* Lock held, not RUNNING: runs the job on the helper (RUNNING). */
void helper_thread_start(struct helper_thread *h);

#endif /* QC_TRAIN_MEMORY_HELPER_THREAD_H */
