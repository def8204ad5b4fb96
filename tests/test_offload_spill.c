/*
 * test_offload_spill.c — the spill file never stays behind:
 *   - by default its name is unlinked right after open (the directory stays empty while the
 *     engine runs, and SIGKILL leaves nothing);
 *   - with spill_visible the file is there while the engine runs and is removed by destroy, and
 *     by SIGTERM / SIGINT (a forked child is killed; the handler unlinks and re-raises, so the
 *     child still dies of the signal).
 * Children are forked before this process creates any thread.
 */
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "test_offload_common.h"

/* Child: engine with a visible (or not) spill file, one NVMe put, then report and wait. */
static void child_main(int fd_ready, bool visible)
{
    /* a background job inherits SIGINT ignored; act like a foreground program */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    struct qc_device *dev = ot_device();
    struct qc_offload_params p;
    ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
    p.spill_visible = visible;
    p.nvme_capacity = 8 * OT_MIB;
    struct qc_offload *o = NULL;
    char ok = 'n';
    if (qc_offload_create(dev, &p, &o) == QC_OK) {
        unsigned char buf[5000];
        memset(buf, 7, sizeof buf);
        uint64_t h;
        if (qc_offload_put(o, buf, sizeof buf, qc_device_compute_stream(dev), QC_OFFLOAD_PLACE_NVME,
                           "child", &h) == QC_OK &&
            qc_offload_quiesce(o) == QC_OK)
            ok = 'y';
    }
    if (write(fd_ready, &ok, 1) != 1)
        _exit(3);
    for (;;)
        pause();
}

/* Forks a child, waits until its engine runs, checks the directory, sends sig. */
static void kill_child_case(int sig, bool visible)
{
    char name[96];
    snprintf(name, sizeof name, "offload spill: %s spill file, child killed by %s",
             visible ? "visible" : "unlinked", strsignal(sig));
    QC_TEST (name) {
        int fds[2];
        T_EXPECT(pipe(fds) == 0, "pipe: %s", strerror(errno));
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            child_main(fds[1], visible);
        }
        close(fds[1]);
        char ok = 0;
        ssize_t r = read(fds[0], &ok, 1);
        close(fds[0]);
        T_EXPECT(r == 1 && ok == 'y', "child engine did not start");
        char first[256] = "";
        int n = ot_dir_entries(ot_dir, first, sizeof first);
        if (visible) {
            T_EXPECT(n == 1, "%d entries while the child runs", n);
            T_EXPECT(strncmp(first, "qctrain-spill-", 14) == 0, "unexpected file %s", first);
        } else {
            T_EXPECT(n == 0, "unlinked spill file visible: %s", first);
        }
        kill(pid, sig);
        int status = 0;
        waitpid(pid, &status, 0);
        T_EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == sig,
                 "child did not die of the signal (status 0x%x)", status);
        n = ot_dir_entries(ot_dir, first, sizeof first);
        T_EXPECT(n == 0, "spill file left behind after %s: %s", strsignal(sig), first);
    }
}

static volatile sig_atomic_t child_stop;

static void child_on_term(int sig)
{
    (void)sig;
    child_stop = 1;
}

/* A program with its own SIGTERM handler (a graceful stop) keeps it: the engine's handler
 * chains to it instead of killing the process, and destroy removes the file. */
static void graceful_child_case(void)
{
    QC_TEST ("offload spill: a program's own SIGTERM handler still runs; destroy cleans up") {
        int fds[2];
        T_EXPECT(pipe(fds) == 0, "pipe: %s", strerror(errno));
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = child_on_term;
            sigemptyset(&sa.sa_mask);
            sigaction(SIGTERM, &sa, NULL);
            sigset_t block, old;
            sigemptyset(&block);
            sigaddset(&block, SIGTERM);
            sigprocmask(SIG_BLOCK, &block, &old); /* no lost wake-up before sigsuspend */
            struct qc_device *cdev = ot_device();
            struct qc_offload_params p;
            ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
            p.spill_visible = true;
            p.nvme_capacity = 4 * OT_MIB;
            struct qc_offload *o = NULL;
            char ok = qc_offload_create(cdev, &p, &o) == QC_OK ? 'y' : 'n';
            if (write(fds[1], &ok, 1) != 1)
                _exit(3);
            while (!child_stop)
                sigsuspend(&old);
            qc_offload_destroy(o);
            qc_device_destroy(cdev);
            _exit(0);
        }
        close(fds[1]);
        char ok = 0;
        ssize_t r = read(fds[0], &ok, 1);
        close(fds[0]);
        T_EXPECT(r == 1 && ok == 'y', "child engine did not start");
        T_EXPECT(ot_dir_entries(ot_dir, NULL, 0) == 1, "visible spill file missing");
        kill(pid, SIGTERM);
        int status = 0;
        waitpid(pid, &status, 0);
        T_EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                 "child did not stop gracefully (status 0x%x)", status);
        T_EXPECT(ot_dir_entries(ot_dir, NULL, 0) == 0, "spill file left behind");
    }
}

int main(void)
{
    ot_dir_make();
    graceful_child_case();
    kill_child_case(SIGTERM, true);
    kill_child_case(SIGINT, true);
    kill_child_case(SIGKILL, false);
    kill_child_case(SIGTERM, false);

    struct qc_device *dev = ot_device();
    QC_TEST ("offload spill: unlinked by default, visible one removed by destroy") {
        for (int visible = 0; visible < 2; visible++) {
            struct qc_offload_params p;
            ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
            p.spill_visible = visible != 0;
            p.nvme_capacity = 4 * OT_MIB;
            struct qc_offload *o = NULL;
            T_EXPECT(qc_offload_create(dev, &p, &o) == QC_OK, "%s", qc_error_last());
            if (!o)
                continue;
            size_t diff = 0;
            T_EXPECT(ot_roundtrip(o, dev, 70000, QC_OFFLOAD_PLACE_NVME, 1, true, &diff) == QC_OK,
                     "%s", qc_error_last());
            int n = ot_dir_entries(ot_dir, NULL, 0);
            T_EXPECT(n == visible, "visible %d: %d entries while running", visible, n);
            struct stat sb;
            T_EXPECT((stat(qc_offload_spill_path(o), &sb) == 0) == (visible != 0), "stat of %s",
                     qc_offload_spill_path(o));
            qc_offload_destroy(o);
            n = ot_dir_entries(ot_dir, NULL, 0);
            T_EXPECT(n == 0, "visible %d: %d entries after destroy", visible, n);
        }
    }
    QC_TEST ("offload spill: a full spill file is QC_ERR_NOMEM with a hint") {
        struct qc_offload_params p;
        ot_params(&p, QC_OFFLOAD_RUNG_AUTO, 4, true);
        p.nvme_capacity = 1 * OT_MIB;
        struct qc_offload *o = NULL;
        T_EXPECT(qc_offload_create(dev, &p, &o) == QC_OK, "%s", qc_error_last());
        if (!o)
            continue; /* ends the QC_TEST */
        unsigned char *buf = calloc(1, 2 * OT_MIB);
        uint64_t h1 = 0, h2 = 0;
        struct qc_stream *cs = qc_device_compute_stream(dev);
        T_EXPECT(qc_offload_put(o, buf, 600 * OT_KIB, cs, QC_OFFLOAD_PLACE_NVME, "a", &h1) == QC_OK,
                 "%s", qc_error_last());
        enum qc_status st =
            qc_offload_put(o, buf, 600 * OT_KIB, cs, QC_OFFLOAD_PLACE_NVME, "b", &h2);
        T_EXPECT(st == QC_ERR_NOMEM, "second put: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "spill file full");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "'b'");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "hint:");
        qc_offload_release(o, h1);
        /* freed extents coalesce: the whole file is usable again */
        T_EXPECT(qc_offload_put(o, buf, OT_MIB, cs, QC_OFFLOAD_PLACE_NVME, "c", &h2) == QC_OK,
                 "after release: %s", qc_error_last());
        qc_offload_release(o, h2);
        free(buf);
        qc_offload_destroy(o);
    }
    qc_device_destroy(dev);
    ot_dir_remove();
    return qc_test_summary();
}
