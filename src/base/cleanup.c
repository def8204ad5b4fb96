/*
 * cleanup.c — files removed on SIGINT/SIGTERM and at exit (qc_cleanup.h).
 *
 * A static table of paths, each with an atomic "in use" flag. The handler only reads the table
 * and calls async-signal-safe functions (unlink, sigaction, raise); a path is written before its
 * flag is set and its flag cleared before the slot is reused, so the handler never sees a path
 * half-written.
 *
 * Graceful stop: while stop_armed is set, the first SIGINT/SIGTERM only stores its number in
 * stop_sig (a lock-free atomic: the handler does nothing else) and returns; the owner polls
 * qc_cleanup_stop_signal() between units of work. A second signal takes the ordinary path:
 * registered files unlinked, the default disposition restored, the signal re-raised.
 * stop_recv (what the handler received) is kept apart from stop_sig (what the owner stops for,
 * which qc_cleanup_stop_agree may set without a signal), so an agreed stop never makes a later
 * first signal count as a second one.
 */
#include "qc_cleanup.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char cleanup_paths[QC_CLEANUP_MAX][PATH_MAX];
static atomic_int cleanup_used[QC_CLEANUP_MAX]; /* 1: cleanup_paths[i] is registered */
static pthread_mutex_t cleanup_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t cleanup_once = PTHREAD_ONCE_INIT;
static struct sigaction cleanup_old_int;
static struct sigaction cleanup_old_term;
static atomic_int stop_armed; /* 1: the next SIGINT/SIGTERM requests a graceful stop */
static atomic_int stop_sig;   /* the signal the owner stops for, 0 when none */
static atomic_int stop_recv;  /* the first SIGINT/SIGTERM received while armed, 0 when none */

static void cleanup_unlink_all(void)
{
    for (int i = 0; i < QC_CLEANUP_MAX; i++)
        if (atomic_load(&cleanup_used[i]))
            unlink(cleanup_paths[i]);
}

static void cleanup_on_signal(int sig, siginfo_t *info, void *ctx)
{
    int none = 0;
    if (atomic_load(&stop_armed) && atomic_compare_exchange_strong(&stop_recv, &none, sig)) {
        none = 0; /* an agreed stop keeps its signal */
        atomic_compare_exchange_strong(&stop_sig, &none, sig);
        return; /* the first signal of a graceful stop: the owner finishes and exits */
    }
    const struct sigaction *old = sig == SIGINT ? &cleanup_old_int : &cleanup_old_term;
    if (old->sa_flags & SA_SIGINFO) {
        old->sa_sigaction(sig, info, ctx);
        return;
    }
    if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    cleanup_unlink_all();
    sigaction(sig, old, NULL);
    raise(sig);
}

static void cleanup_install(int sig, struct sigaction *old)
{
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0 || cur.sa_handler == SIG_IGN)
        return; /* an ignored signal does not end the process: nothing to clean up */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = cleanup_on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    *old = cur;
    sigaction(sig, &sa, NULL);
}

static void cleanup_install_once(void)
{
    cleanup_install(SIGINT, &cleanup_old_int);
    cleanup_install(SIGTERM, &cleanup_old_term);
    atexit(cleanup_unlink_all);
}

int qc_cleanup_register(const char *path)
{
    pthread_once(&cleanup_once, cleanup_install_once);
    int slot = -1;
    pthread_mutex_lock(&cleanup_mu);
    for (int i = 0; i < QC_CLEANUP_MAX && slot < 0; i++) {
        if (!atomic_load(&cleanup_used[i])) {
            snprintf(cleanup_paths[i], sizeof cleanup_paths[i], "%s", path);
            atomic_store(&cleanup_used[i], 1);
            slot = i;
        }
    }
    pthread_mutex_unlock(&cleanup_mu);
    return slot;
}

void qc_cleanup_unregister(int slot)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&cleanup_mu);
    atomic_store(&cleanup_used[slot], 0);
    pthread_mutex_unlock(&cleanup_mu);
}

void qc_cleanup_stop_begin(void)
{
    pthread_once(&cleanup_once, cleanup_install_once);
    atomic_store(&stop_sig, 0);
    atomic_store(&stop_recv, 0);
    atomic_store(&stop_armed, 1);
}

void qc_cleanup_stop_end(void)
{
    atomic_store(&stop_armed, 0);
}

int qc_cleanup_stop_signal(void)
{
    return atomic_load(&stop_sig);
}

void qc_cleanup_stop_agree(int sig)
{
    atomic_store(&stop_sig, sig);
}
