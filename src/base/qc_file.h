/*
 * qc_file.h — whole-file writes that never leave half a file under the final name.
 *
 * qc_file_write_atomic writes PATH.tmp in the same folder (registered with qc_cleanup, so
 * SIGINT/SIGTERM remove it), fsyncs it, renames it over PATH and fsyncs the folder. A crash or a
 * full disk at any point leaves either the previous PATH or the new one, whole, and no
 * temporary behind (except after SIGKILL, where PATH.tmp may stay: it is overwritten next time).
 * Used by the memory report, the trace step files, the run description and the HTML report.
 */
#ifndef QC_BASE_QC_FILE_H
#define QC_BASE_QC_FILE_H

#include <stddef.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

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
/* fsyncs the folder holding path (file systems without directory fsync, EINVAL, are fine). */
enum qc_status qc_file_fsync_dir_of(const char *path, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_FILE_H */
