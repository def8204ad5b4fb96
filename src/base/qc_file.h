/*
 * qc_file.h — opening an input that must be a regular file (a qcshard, a safetensors, a preset)
 * without ever blocking on a FIFO or touching a device (docs/RELIABILITY.md, "input
 * validation").
 *
 * The path is checked with stat() before the open, and the open itself is O_NONBLOCK (so a
 * FIFO swapped in between the two still cannot block it) followed by fstat(); anything but a
 * regular file is refused with a message naming the path and what it is ("is a FIFO").
 */
#ifndef QC_BASE_QC_FILE_H
#define QC_BASE_QC_FILE_H

#include <stdint.h>
#include <sys/types.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_FILE_H */
