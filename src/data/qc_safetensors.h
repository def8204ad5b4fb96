/*
 * qc_safetensors.h — a strict safetensors reader and an atomic writer.
 *
 * The format (huggingface/safetensors): an 8-byte little-endian u64 N, then N bytes of UTF-8
 * JSON, then the data buffer. The JSON is one object: each key a tensor name mapping to
 * {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} (offsets relative to the
 * data buffer, end - begin == numel * dtype size), plus an optional "__metadata__" object of
 * string -> string. The header may be padded with trailing spaces.
 *
 * The reader trusts nothing: every length, offset, shape product, dtype name and JSON type is
 * checked; the tensors must cover the data buffer exactly, without holes or overlaps (as the
 * reference implementation requires), names must be unique. Any violation is QC_ERR_INVALID
 * naming the file, the tensor and the field. Files are mapped read-only; a tensor whose data is
 * not aligned to its element size is copied into an aligned private buffer, so tensor->data can
 * always be dereferenced as its type.
 *
 * The writer collects (name, dtype, shape, data pointer) entries and metadata, then writes
 * atomically: a temporary file in the target's folder, fsync, rename over the target, fsync of
 * the folder. Tensors are laid out by decreasing element size (then insertion order) and the
 * header is padded to a multiple of 8 bytes, so every tensor of a written file is aligned.
 */
#ifndef QC_DATA_QC_SAFETENSORS_H
#define QC_DATA_QC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_ST_MAX_DIMS 8

enum qc_st_dtype {
    QC_ST_BOOL = 0,
    QC_ST_U8,
    QC_ST_I8,
    QC_ST_I16,
    QC_ST_U16,
    QC_ST_F16,
    QC_ST_BF16,
    QC_ST_I32,
    QC_ST_U32,
    QC_ST_F32,
    QC_ST_I64,
    QC_ST_U64,
    QC_ST_F64,
    QC_ST_DTYPE_COUNT /* must be last */
};

struct qc_st_tensor {
    const char *name; /* NUL-terminated, owned by the file object */
    enum qc_st_dtype dtype;
    int ndim; /* 0 (scalar) .. QC_ST_MAX_DIMS */
    int64_t shape[QC_ST_MAX_DIMS];
    int64_t numel;    /* product of shape (1 for a scalar) */
    size_t nbytes;    /* numel * qc_st_dtype_size(dtype) */
    const void *data; /* aligned to the element size; NULL when nbytes == 0 */
};

/* "F32", "I64", ...; NULL for an out-of-range value. */
const char *qc_st_dtype_name(enum qc_st_dtype dtype);
/* Bytes per element (1 for BOOL). */
size_t qc_st_dtype_size(enum qc_st_dtype dtype);

// ---- reader --------------------------------------------------------------------------------

struct qc_safetensors;

/* Maps and validates path. On QC_OK *out owns the mapping; release with qc_safetensors_close.
 * QC_ERR_IO when the file cannot be opened or mapped, QC_ERR_INVALID for a malformed file,
 * QC_ERR_NOMEM. */
enum qc_status qc_safetensors_open(const char *path, struct qc_safetensors **out);
/* Validates a file image in memory (bytes are copied; the caller keeps buf). name labels the
 * messages. Same statuses as qc_safetensors_open. For fuzzing and embedded blobs. */
enum qc_status qc_safetensors_open_memory(const void *buf, size_t len, const char *name,
                                          struct qc_safetensors **out);
/* NULL is a no-op. Invalidates every tensor pointer obtained from st. */
void qc_safetensors_close(struct qc_safetensors *st);

/* Number of tensors, and the i-th in file-header order (0 <= i < count). */
int64_t qc_safetensors_count(const struct qc_safetensors *st);
const struct qc_st_tensor *qc_safetensors_at(const struct qc_safetensors *st, int64_t i);
/* The tensor called name, or NULL. */
const struct qc_st_tensor *qc_safetensors_find(const struct qc_safetensors *st, const char *name);
/* A __metadata__ value, or NULL when absent. */
const char *qc_safetensors_metadata(const struct qc_safetensors *st, const char *key);
/* The path or label the file was opened with. */
const char *qc_safetensors_path(const struct qc_safetensors *st);

/* Looks up name and checks its dtype and shape (ndim entries; a shape entry of -1 matches any
 * extent). QC_ERR_INVALID naming the file, tensor and mismatch when absent or different. */
enum qc_status qc_safetensors_get(const struct qc_safetensors *st, const char *name,
                                  enum qc_st_dtype dtype, int ndim, const int64_t *shape,
                                  const struct qc_st_tensor **out);

// ---- writer --------------------------------------------------------------------------------

struct qc_st_writer;

enum qc_status qc_st_writer_create(struct qc_st_writer **out);
/* NULL is a no-op. */
void qc_st_writer_destroy(struct qc_st_writer *w);
/* Adds a tensor. name is copied; data is referenced (it must stay valid until
 * qc_st_writer_write returns) and holds numel * dtype size bytes in native (little-endian)
 * order. QC_ERR_INVALID for a duplicate or empty name, a bad dtype, ndim or negative extent. */
enum qc_status qc_st_writer_add(struct qc_st_writer *w, const char *name, enum qc_st_dtype dtype,
                                int ndim, const int64_t *shape, const void *data);
/* Adds or replaces a __metadata__ entry (both strings copied). */
enum qc_status qc_st_writer_set_metadata(struct qc_st_writer *w, const char *key,
                                         const char *value);
/* Writes everything to path atomically (temp file + fsync + rename + fsync of the folder).
 * QC_ERR_IO naming the path and the failing call; the target is untouched on failure. */
enum qc_status qc_st_writer_write(const struct qc_st_writer *w, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_SAFETENSORS_H */
