/*
 * file.c — opening regular input files without blocking on FIFOs (qc_file.h).
 */
#include "qc_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *qc_file_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    if (S_ISDIR(mode))
        return "a folder";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return "an unknown file type";
}

static enum qc_status not_regular(const char *path, const char *what, mode_t mode)
{
    return qc_errorf(QC_ERR_INVALID,
                     "%s %s: is %s, not a regular file\nhint: give the path of a %s file (reading "
                     "a FIFO or a device would block or consume it)",
                     what, path, qc_file_kind(mode), what);
}

enum qc_status qc_file_open_regular(const char *path, const char *what, int *fd_out,
                                    uint64_t *size_out)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return qc_errorf(QC_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return not_regular(path, what, sb.st_mode);
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        return qc_errorf(QC_ERR_IO, "%s %s: cannot stat: %s", what, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) { /* replaced between the stat and the open */
        close(fd);
        return not_regular(path, what, sb.st_mode);
    }
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        const int e = errno;
        close(fd);
        return qc_errorf(QC_ERR_IO, "%s %s: fcntl failed: %s", what, path, strerror(e));
    }
    *fd_out = fd;
    if (size_out)
        *size_out = (uint64_t)sb.st_size;
    return QC_OK;
}

bool qc_file_exe_share(const char *sub, char *out, size_t cap)
{
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (cap > 0)
        out[0] = '\0';
    if (n <= 0 || cap == 0)
        return false;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return false;
    *slash = '\0'; /* the folder of the executable (bin/) */
    const int w = snprintf(out, cap, "%s/../share/qctrain/%s", exe, sub);
    if (w < 0 || (size_t)w >= cap) {
        out[0] = '\0';
        return false;
    }
    return true;
}
