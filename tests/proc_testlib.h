/*
 * proc_testlib.h — running the built qctrain binary from a test: the arguments of a tiny run,
 * spawn with output to files, signals, waiting with a watchdog, small file helpers. For the
 * reliability, crash and multi-rank tests (tests/test_reliability.c, tests/test_kill.c,
 * tests/test_dist_*.c). Header-only.
 *
 * A child starts with SIGINT and SIGTERM at their defaults (a test runner may hand them down
 * ignored) and an alarm() watchdog: a child that hangs (a FIFO opened for reading, a lock
 * waited on) dies of SIGALRM, which the test then reports, instead of hanging the suite.
 */
#ifndef QC_TESTS_PROC_TESTLIB_H
#define QC_TESTS_PROC_TESTLIB_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define T_PROC_ARGS_MAX 96

/* `qctrain train` arguments of a tiny run: cpu-smoke's model, one scene per group, 8 synthetic
 * scenes, one loader thread, small radii (a step takes well under a second). */
static const char *const t_tiny_train_args[] = {
    "--preset",
    "cpu-smoke",
    "--quiet",
    "--set",
    "train.batch_size=1",
    "--set",
    "data.synthetic_scenes=8",
    "--set",
    "data.loader_threads=1",
    "--set",
    "model.pl2pl_radius=30",
    "--set",
    "model.pl2a_radius=15",
    "--set",
    "model.a2a_radius=15",
    "--set",
    "model.pl2m_radius=30",
    "--set",
    "model.a2m_radius=30",
    "--set",
    "model.time_span=3",
    "--set",
    "model.num_t2m_steps=6",
};
#define T_TINY_TRAIN_NARGS ((int)(sizeof(t_tiny_train_args) / sizeof(t_tiny_train_args[0])))

/* An argument list under construction. */
struct t_args {
    const char *v[T_PROC_ARGS_MAX + 1];
    int n;
};

static inline void t_args_add(struct t_args *a, const char *s)
{
    if (a->n >= T_PROC_ARGS_MAX) {
        printf("too many arguments\n");
        exit(1);
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

/* Starts `argv` with stdout and stderr appended to log (NULL: /dev/null) and, when env is not
 * NULL, the extra "NAME=value" setting. The child has watchdog_s seconds (alarm). Returns the
 * pid, or -1. */
static inline pid_t t_spawn(const struct t_args *a, const char *log, const char *env,
                            unsigned watchdog_s)
{
    fflush(stdout);
    const pid_t pid = fork();
    if (pid != 0)
        return pid;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    const int fd = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    static char envbuf[512];
    if (env) {
        snprintf(envbuf, sizeof envbuf, "%s", env);
        putenv(envbuf); /* the child's own copy of the environment */
    }
    char *argv[T_PROC_ARGS_MAX + 1];
    for (int i = 0; i <= a->n; i++)
        argv[i] = a->v[i] ? strdup(a->v[i]) : NULL;
    alarm(watchdog_s);
    execv(argv[0], argv);
    _exit(127);
}

/* Waits for pid; returns its wait status. */
static inline int t_wait(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}

/* Runs `argv` to its end (watchdog 600 s: ctest's timeout is the real bound); returns the wait
 * status. */
static inline int t_run(const struct t_args *a, const char *log, const char *env)
{
    const pid_t pid = t_spawn(a, log, env, 600);
    return pid < 0 ? -1 : t_wait(pid);
}

/* "exit N" / "signal NAME" of a wait status, for messages. */
static inline const char *t_status_str(int status, char *buf, size_t n)
{
    if (WIFEXITED(status))
        snprintf(buf, n, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "signal %s", strsignal(WTERMSIG(status)));
    else
        snprintf(buf, n, "status 0x%x", (unsigned)status);
    return buf;
}

static inline bool t_exited(int status, int code)
{
    return WIFEXITED(status) && WEXITSTATUS(status) == code;
}

static inline void t_sleep_ms(long ms)
{
    const struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline bool t_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The whole file, NUL-terminated, malloc'ed (NULL when unreadable); *n its length. */
static inline char *t_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4097 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        const size_t k = fread(buf + len, 1, 4096, f);
        len += k;
        if (k < 4096)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    if (n)
        *n = len;
    return buf;
}

/* Runs `binary args...` (args NULL-terminated) with stdout and stderr to log; returns its exit
 * code (128 when it died of a signal) and its output in *out (malloc'd, NULL if unreadable). */
static inline int t_run_output(const char *binary, const char *const *args, const char *log,
                               char **out)
{
    unlink(log);
    struct t_args a = {{0}, 0};
    t_args_add(&a, binary);
    for (int i = 0; args[i]; i++)
        t_args_add(&a, args[i]);
    const int st = t_run(&a, log, NULL);
    *out = t_read_file(log, NULL);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Lines of a file (0 when missing). */
static inline int t_count_lines(const char *path)
{
    char *t = t_read_file(path, NULL);
    int n = 0;
    for (const char *p = t; p && *p; p++)
        n += *p == '\n';
    free(t);
    return n;
}

/* True when pid has ended (not reaped: t_wait still gives its status). */
static inline bool t_ended(pid_t pid)
{
    siginfo_t info;
    memset(&info, 0, sizeof info);
    return waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

/* Polls (every 5 ms) until cond(user) holds, pid (when > 0) has ended, or timeout_ms passed;
 * true when cond holds. */
static inline bool t_poll(bool (*cond)(void *), void *user, pid_t pid, long timeout_ms)
{
    for (long waited = 0; waited <= timeout_ms; waited += 5) {
        if (cond(user))
            return true;
        if (pid > 0 && t_ended(pid))
            return cond(user);
        t_sleep_ms(5);
    }
    return false;
}

#endif /* QC_TESTS_PROC_TESTLIB_H */
