/*
 * data_internal.h — file-output helpers shared by the writers of src/data (qcshard_write.c,
 * safetensors.c): both write a temporary file, fsync it, rename it over the final name and fsync
 * the directory, and both report errors with the same hints. Never included outside src/data.
 */
#ifndef QC_DATA_DATA_INTERNAL_H
#define QC_DATA_DATA_INTERNAL_H

#include <stddef.h>

#include "qc_status.h"

/* Writes all n bytes of p at fd's file offset, retrying EINTR and short writes. Returns 0, or
 * the errno value of the failure (ENOSPC for a write that made no progress). */
int data_write_all(int fd, const void *p, size_t n);

/* The hint line ("\nhint: ...", or "" when there is none) for an errno value from creating or
 * writing an output file: missing or unwritable directory, full disk, file size limit. */
const char *data_io_hint(int err);

/* fsyncs the directory holding path, so that a rename into it is durable. QC_ERR_IO (message
 * names the directory) when it cannot be opened or synced; EINVAL from fsync (file systems
 * without directory fsync) counts as success. */
enum qc_status data_fsync_dir(const char *path);

#endif /* QC_DATA_DATA_INTERNAL_H */
