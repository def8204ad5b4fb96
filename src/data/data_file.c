/*
 * data_file.c — file-output helpers shared by the writers of src/data (data_internal.h).
 */
#include "data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define DATA_WRITE_CHUNK ((size_t)1 << 30) /* per write(2) call; Linux caps one at ~2 GiB */

int data_write_all(int fd, const void *p, size_t n)
{
    const unsigned char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n > DATA_WRITE_CHUNK ? DATA_WRITE_CHUNK : n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (k == 0)
            return ENOSPC;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

const char *data_io_hint(int err)
{
    switch (err) {
    case ENOENT:
    case ENOTDIR:
        return "\nhint: does the output directory exist?";
    case EACCES:
    case EPERM:
    case EROFS:
        return "\nhint: the output directory is not writable; write the file elsewhere";
    case EISDIR:
        return "\nhint: the output path names a directory; give a file name";
    case ENOSPC:
    case EDQUOT:
        return "\nhint: free space on that file system, or write the file elsewhere (--out)";
    case EFBIG:
        return "\nhint: the file size limit was reached (ulimit -f)";
    default:
        return "";
    }
}

enum qc_status data_fsync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) {
        dir[0] = '.';
        dir[1] = '\0';
    } else {
        size_t n = (size_t)(slash - path);
        if (n == 0)
            n = 1; /* "/file" -> "/" */
        if (n >= sizeof(dir))
            return qc_errorf(QC_ERR_IO, "%s: directory name too long", path);
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO, "%s: cannot open directory to fsync: %s", dir, strerror(errno));
    int rc = fsync(fd);
    const int err = errno;
    close(fd);
    /* Some file systems do not support fsync on directories (EINVAL); that is not a failure. */
    if (rc != 0 && err != EINVAL)
        return qc_errorf(QC_ERR_IO, "%s: fsync of directory failed: %s", dir, strerror(err));
    return QC_OK;
}
