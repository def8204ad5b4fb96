/*
 * file_atomic.c — atomic whole-file writes (qc_file.h).
 */
#include "qc_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "qc_cleanup.h"

void qc_file_dir_of(const char *path, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, cap, ".");
}

enum qc_status qc_file_fsync_dir_of(const char *path, const char *what)
{
    char dir[4096];
    qc_file_dir_of(path, dir, sizeof dir);
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO, "%s: folder %s: %s", what, dir, strerror(errno));
    const int rc = fsync(fd);
    const int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL)
        return qc_errorf(QC_ERR_IO, "%s: fsync of folder %s: %s", what, dir, strerror(e));
    return QC_OK;
}

enum qc_status qc_file_write_atomic(const char *path, const struct qc_file_part *parts, int n,
                                    const char *what)
{
    char tmp[4200];
    const int tn = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (tn < 0 || (size_t)tn >= sizeof tmp)
        return qc_errorf(QC_ERR_INVALID, "%s %s: path too long", what, path);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO,
                         "%s %s: cannot write: %s\nhint: check that the folder exists and is "
                         "writable",
                         what, tmp, strerror(errno));
    const int slot = qc_cleanup_register(tmp);
    int err = 0;
    for (int i = 0; i < n && !err; i++) {
        const char *p = parts[i].data;
        for (size_t off = 0; off < parts[i].len && !err;) {
            const ssize_t w = write(fd, p + off, parts[i].len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                err = w < 0 ? errno : EIO;
            else
                off += (size_t)w;
        }
    }
    if (!err && fsync(fd) != 0)
        err = errno;
    if (close(fd) != 0 && !err)
        err = errno;
    if (!err && rename(tmp, path) != 0)
        err = errno;
    if (err) {
        unlink(tmp);
        qc_cleanup_unregister(slot);
        return qc_errorf(QC_ERR_IO, "%s %s: write failed: %s", what, path, strerror(err));
    }
    qc_cleanup_unregister(slot);
    return qc_file_fsync_dir_of(path, what);
}
