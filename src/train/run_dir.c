/*
 * run_dir.c — one writer per run folder, and what a crash leaves in it (docs/RELIABILITY.md).
 *
 * The lock is an exclusive flock() on RUN/.lock, taken before a trainer reads or writes
 * anything in RUN and held until it ends. The kernel drops it when its holder dies, kill -9
 * included, so a stale lock cannot exist. The holder writes its PID into the file, so a second
 * trainer names it. The file is never unlinked: unlinking a lock file lets two processes lock
 * two different inodes of the same name.
 *
 * With the lock held nothing else writes RUN, so whatever an earlier, killed writer left
 * half-done is garbage and is recovered here:
 *   ckpt-<step>.tmp/        a checkpoint being assembled: removed whole, whatever it holds;
 *   ckpt-<step>.old/        a checkpoint moved aside to be replaced: put back when the new one
 *                           never arrived (ckpt-<step>/ missing), else removed;
 *   *.tmp, *.tmp.XXXXXX     temporary files of the atomic writers (metrics.jsonl.tmp,
 *                           memory.json.tmp, ...): removed.
 */
#include "qc_train.h"
#include "train_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h> /* nanosleep */
#include <unistd.h>

struct qc_run_lock {
    int fd;          /* RUN/.lock, flock(LOCK_EX) held */
    char path[4200]; /* RUN/.lock, for messages */
};

enum qc_status qc_run_lock_acquire(const char *run_dir, struct qc_run_lock **out)
{
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/.lock", run_dir) >= sizeof path)
        return qc_errorf(QC_ERR_INVALID, "run folder path too long: %s", run_dir);
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO,
                         "run folder %s: cannot open its lock file %s: %s\nhint: choose a "
                         "writable --out folder",
                         run_dir, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        char pid[32] = "";
        const ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        close(fd);
        if (e != EWOULDBLOCK)
            return qc_errorf(QC_ERR_IO,
                             "run folder %s: cannot lock %s: %s\nhint: the run folder must be "
                             "on a file system with file locks (flock)",
                             run_dir, path, strerror(e));
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        return qc_errorf(QC_ERR_INVALID,
                         "run folder %s is in use by another trainer (PID %s)\nhint: wait for "
                         "it to end or stop it (kill %s), or train into another --out folder",
                         run_dir, pid[0] ? pid : "unknown", pid[0] ? pid : "<pid>");
    }
    char pid[32];
    const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        const int e = errno;
        close(fd);
        return qc_errorf(QC_ERR_IO, "run folder %s: cannot write %s: %s", run_dir, path,
                         strerror(e));
    }
    struct qc_run_lock *l = malloc(sizeof *l);
    if (!l) {
        close(fd);
        return qc_errorf(QC_ERR_NOMEM, "run lock: out of memory");
    }
    l->fd = fd;
    snprintf(l->path, sizeof l->path, "%s", path);
    *out = l;
    return QC_OK;
}

void qc_run_lock_release(struct qc_run_lock *l)
{
    if (!l)
        return;
    /* no PID: nobody holds it. A failure only leaves a stale PID in the file, which nobody
     * reads while the lock is free (a holder rewrites it), so it is reported, not fatal. */
    if (ftruncate(l->fd, 0) != 0)
        qc_log(QC_LOG_WARN,
               "run folder: cannot clear the PID in %s: %s (the lock is released "
               "anyway)",
               l->path, strerror(errno));
    close(l->fd); /* drops the flock */
    free(l);
}

// ---- recovery ----------------------------------------------------------------------------------

/* Test hook (docs/RELIABILITY.md; train_internal.h). Read once; unset or invalid: no delay. Here,
 * below checkpoint.c, which calls it too. */
void train_fault_delay(void)
{
    static long delay_ms = -1;
    if (delay_ms < 0) {
        const char *e = getenv("QC_FAULT_CKPT_DELAY_MS");
        char *end = NULL;
        const long v = e ? strtol(e, &end, 10) : 0;
        delay_ms = e && end != e && *end == '\0' && v > 0 && v < 60000 ? v : 0;
    }
    if (delay_ms > 0) {
        const struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

enum qc_status train_remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? QC_OK
                               : qc_errorf(QC_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return qc_errorf(QC_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return QC_OK;
}

/* "ckpt-<digits>" followed by exactly `suffix` ("" for a checkpoint). */
static bool ckpt_name(const char *name, const char *suffix)
{
    if (strncmp(name, "ckpt-", 5) != 0)
        return false;
    const char *p = name + 5;
    const char *d = p;
    while (*p >= '0' && *p <= '9')
        p++;
    return p > d && strcmp(p, suffix) == 0;
}

/* A temporary file name of the atomic writers: "*.tmp" or "*.tmp.XXXXXX". */
static bool tmp_file_name(const char *name)
{
    const size_t n = strlen(name);
    if (n > 4 && strcmp(name + n - 4, ".tmp") == 0)
        return true;
    const char *t = strstr(name, ".tmp.");
    return t && t != name && strlen(t + 5) == 6 && !strchr(t + 5, '.');
}

enum qc_status qc_run_dir_recover(const char *run_dir, int64_t *recovered)
{
    int64_t count = 0;
    DIR *d = opendir(run_dir);
    if (!d)
        return qc_errorf(QC_ERR_IO, "run folder %s: cannot open: %s", run_dir, strerror(errno));
    enum qc_status st = QC_OK;
    struct dirent *de;
    while (st == QC_OK && (de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        char p[4400], fin[4400];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", run_dir, name) >= sizeof p)
            continue;
        struct stat sb;
        if (lstat(p, &sb) != 0)
            continue;
        const bool tmp_dir = S_ISDIR(sb.st_mode) && ckpt_name(name, ".tmp");
        const bool old_dir = S_ISDIR(sb.st_mode) && ckpt_name(name, ".old");
        if (tmp_dir || old_dir || (S_ISREG(sb.st_mode) && tmp_file_name(name)))
            train_fault_delay();
        if (tmp_dir) {
            st = train_remove_tree(p);
            count++;
        } else if (old_dir) {
            snprintf(fin, sizeof fin, "%.*s", (int)(strlen(p) - 4), p);
            if (lstat(fin, &sb) == 0) {
                st = train_remove_tree(p);
            } else if (rename(p, fin) != 0) {
                st = qc_errorf(QC_ERR_IO, "run folder %s: cannot put %s back as %s: %s", run_dir, p,
                               fin, strerror(errno));
            }
            count++;
        } else if (S_ISREG(sb.st_mode) && tmp_file_name(name)) {
            if (unlink(p) != 0 && errno != ENOENT)
                st = qc_errorf(QC_ERR_IO, "run folder %s: cannot remove %s: %s", run_dir, p,
                               strerror(errno));
            count++;
        }
    }
    closedir(d);
    if (st != QC_OK)
        return st;
    if (count > 0)
        qc_log(QC_LOG_INFO,
               "run folder %s: recovered %" PRId64 " leftover(s) of an interrupted writer", run_dir,
               count);
    if (recovered)
        *recovered = count;
    return QC_OK;
}
