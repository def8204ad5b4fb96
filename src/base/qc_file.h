/*
 * qc_file.h — files in and out without surprises: opening an input that must be a regular file,
 * and whole-file writes that never leave half a file under the final name.
 *
 * Reading (file.c): an input that must be a regular file (a qcshard, a safetensors, a preset) is
 * opened without ever blocking on a FIFO or touching a device (docs/RELIABILITY.md, "input
 * validation"). The path is checked with stat() before the open, and the open itself is
 * O_NONBLOCK (so a FIFO swapped in between the two still cannot block it) followed by fstat();
 * anything but a regular file is refused with a message naming the path and what it is ("is a
 * FIFO").
 *
 * Writing (file_atomic.c): qc_file_write_atomic writes PATH.tmp in the same folder (registered
 * with qc_cleanup, so SIGINT/SIGTERM remove it), fsyncs it, renames it over PATH and fsyncs the
 * folder. A crash or a full disk at any point leaves either the previous PATH or the new one,
 * whole, and no temporary behind (except after SIGKILL, where PATH.tmp may stay: it is
 * overwritten next time). Used by the memory report, the trace step files, the run description
 * and the HTML report.
 */
#ifndef QC_BASE_QC_FILE_H
#define QC_BASE_QC_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- reading ------------------------------------------------------------------------------

/* What a file of this st_mode is, as an error names it: "a FIFO", "a folder", "a socket", "a
 * character device", "a block device", "a regular file", "a symbolic link", "an unknown file
 * type". */
const char *qc_file_kind(mode_t mode);

/* Opens path read-only (O_CLOEXEC) when it is a regular file; *fd_out is the descriptor (in
 * blocking mode) and *size_out (may be NULL) its size. `what` names the input in errors
 * ("qcshard", "weights", "preset"). QC_ERR_INVALID "<what> PATH: is a FIFO, not a regular file"
 * with a hint for anything else; QC_ERR_IO when it is missing or cannot be opened; the
 * message names the path. */
enum qc_status qc_file_open_regular(const char *path, const char *what, int *fd_out,
                                    uint64_t *size_out);

/* The installed data folder beside the running executable, whatever prefix it was installed
 * under (cmake --install --prefix P puts bin/qctrain and share/qctrain/ side by side):
 * "<folder of /proc/self/exe>/../share/qctrain/<sub>" into out (cap bytes). False (out empty)
 * when the executable's path cannot be read or does not fit. */
bool qc_file_exe_share(const char *sub, char *out, size_t cap);

// ---- writing ------------------------------------------------------------------------------

/* One piece of the file's content. */
struct qc_file_part {
    const void *data;
    size_t len;
};

/* Writes the concatenation of parts[0..n) to path atomically (module comment). what names the
 * document in errors ("memory report", "trace"). QC_ERR_IO naming the file and the reason
 * (folder missing or not writable, disk full), with a hint; QC_ERR_INVALID for a path too long. */
enum qc_status qc_file_write_atomic(const char *path, const struct qc_file_part *parts, int n,
                                    const char *what);
/* The folder holding path into dir (cap bytes): "." for a bare name, "/" for a file in the root. */
void qc_file_dir_of(const char *path, char *dir, size_t cap);
/* fsyncs the folder holding path (file systems without directory fsync, EINVAL, are fine). */
enum qc_status qc_file_fsync_dir_of(const char *path, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_FILE_H */
