/*
 * qc_qcshard.h — the qcshard scene container: a hardened mmap reader and an atomic, streaming
 * writer. docs/QCSHARD.md defines every byte.
 *
 * Reader: opening checks the header and the whole index eagerly (cheap); each record is checked
 * (checksum, layout, every value rule) the first time it is opened, then served as a zero-copy
 * view into the mapping. Nothing in a file is trusted: a hostile file makes a call fail with
 * QC_ERR_INVALID and a message naming file, record, field and value; it never makes the reader
 * crash or read out of bounds (short of another process truncating a mapped file: SIGBUS).
 *
 * Writer: scenes go to FILE.tmp as they are appended (records stream out, the index is written
 * at the end); finish fsyncs, renames FILE.tmp to FILE and fsyncs the directory. On any error
 * (ENOSPC, EIO, ...) or when destroyed unfinished, FILE.tmp is removed and FILE is untouched.
 */
#ifndef QC_DATA_QC_QCSHARD_H
#define QC_DATA_QC_QCSHARD_H

#include <stddef.h>
#include <stdint.h>

#include "qc_scene.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_QCSHARD_VERSION     1
#define QC_QCSHARD_HEADER_SIZE 64
#define QC_QCSHARD_ENTRY_SIZE  40
#define QC_QCSHARD_RECORD_HEAD 144 /* record header bytes before the arrays */
#define QC_QCSHARD_MAX_SCENES  (1ll << 32)

/* One index entry, decoded (docs/QCSHARD.md "Index entry"). */
struct qc_qcshard_entry {
    uint64_t offset;      /* file offset of the record */
    uint64_t size;        /* record bytes */
    uint64_t checksum;    /* XXH3-64 of the record */
    int64_t num_agents;   /* A */
    int64_t num_polygons; /* P */
    int64_t num_points;   /* Pt */
    int64_t num_pl2pl;    /* Et */
};

// ---- reader ---------------------------------------------------------------------------------

struct qc_qcshard_reader;

/* Maps `path` read-only and checks its header and index. *out is set only on QC_OK; destroy it
 * with qc_qcshard_reader_destroy(). Errors: QC_ERR_IO (cannot open/stat/map, with strerror),
 * QC_ERR_INVALID (malformed header or index: message names the file, the field and the value),
 * QC_ERR_UNSUPPORTED (big-endian host), QC_ERR_NOMEM. */
enum qc_status qc_qcshard_reader_create(const char *path, struct qc_qcshard_reader **out);

/* Same, over `size` bytes in memory (copied, so data needs no alignment and may be freed after
 * the call); `name` stands for the file name in messages. For tests and the fuzzer. */
enum qc_status qc_qcshard_reader_create_memory(const void *data, size_t size, const char *name,
                                               struct qc_qcshard_reader **out);

/* Unmaps and frees. Scene views handed out become invalid. NULL is a no-op. */
void qc_qcshard_reader_destroy(struct qc_qcshard_reader *reader);

/* Number of scenes (records). */
int64_t qc_qcshard_reader_count(const struct qc_qcshard_reader *reader);

/* The file name given at creation. */
const char *qc_qcshard_reader_path(const struct qc_qcshard_reader *reader);

/* Index entry i (checked when the reader was created). QC_ERR_INVALID when i is out of range. */
enum qc_status qc_qcshard_reader_entry(const struct qc_qcshard_reader *reader, int64_t index,
                                       struct qc_qcshard_entry *out);

/* Scene i as a zero-copy view into the mapping (scene->owned == NULL; valid until the reader is
 * destroyed; qc_scene_free on it only zeroes it). The record is validated in full the first
 * time it is opened (checksum, layout, every value rule); later opens reuse the result.
 * *out is written only on QC_OK. Thread-safe: any number of threads may open scenes at once. */
enum qc_status qc_qcshard_reader_scene(struct qc_qcshard_reader *reader, int64_t index,
                                       struct qc_scene *out);

/* Opens (and so validates) every record; returns the first error. */
enum qc_status qc_qcshard_reader_validate_all(struct qc_qcshard_reader *reader);

// ---- writer ---------------------------------------------------------------------------------

struct qc_qcshard_writer;

/* Creates `path`.tmp (truncating a stale one) and writes a placeholder header. *out is set only
 * on QC_OK. Errors: QC_ERR_IO naming the file and strerror (with a hint for a missing
 * directory), QC_ERR_NOMEM. */
enum qc_status qc_qcshard_writer_create(const char *path, struct qc_qcshard_writer **out);

/* Validates the scene (qc_scene_validate: an invalid scene is never written; QC_ERR_INVALID)
 * and appends it as the next record. A write error (QC_ERR_IO: "<path>.tmp: write failed: No
 * space left on device" + hint) poisons the writer: later calls fail and destroy removes the
 * temporary file. */
enum qc_status qc_qcshard_writer_append(struct qc_qcshard_writer *writer,
                                        const struct qc_scene *scene);

/* Scenes appended so far. */
int64_t qc_qcshard_writer_count(const struct qc_qcshard_writer *writer);

/* Writes the index and the final header, fsyncs, renames `path`.tmp to `path` and fsyncs the
 * directory. After QC_OK the file is complete and durable; on error the temporary file is
 * removed and `path` is left as it was. Either way only destroy may follow. */
enum qc_status qc_qcshard_writer_finish(struct qc_qcshard_writer *writer);

/* Frees the writer; if it was not finished successfully, closes and removes `path`.tmp.
 * NULL is a no-op. */
void qc_qcshard_writer_destroy(struct qc_qcshard_writer *writer);

/* Convenience: writes n scenes to path (create, append each, finish, destroy). */
enum qc_status qc_qcshard_write_file(const char *path, const struct qc_scene *scenes, int64_t n);

/* Fuzz builds only (-DQC_FUZZ=ON defines QC_FUZZ_BUILD): records whose record-level checks
 * began (checksum, header, counts, layout, padding) and records that passed them and reached
 * the value checks (qc_scene_validate), since the process started. Both 0 in other builds.
 * tests/fuzz/fuzz_qcshard.c requires them non-zero: proof that its inputs get past the header
 * and index checks. */
void qc_qcshard_fuzz_counters(uint64_t *records_opened, uint64_t *records_validated);

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_QCSHARD_H */
