/*
 * qcshard_write.c — the atomic, streaming qcshard writer (docs/QCSHARD.md).
 *
 * Records stream into PATH.tmp through a 1 MiB buffer as scenes are appended; the index goes at
 * the end and the real header replaces the placeholder at offset 0. finish() fsyncs, renames
 * PATH.tmp to PATH and fsyncs the directory, so PATH is either the old file (or absent) or the
 * complete new one. Every failed write names the file (PATH, the name the caller gave; its
 * temporary name in parentheses) and errno; the writer is then poisoned and
 * its temporary file removed.
 */
#include "qc_qcshard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h> /* XXH3_64bits, XXH3 streaming state */

#include "data_internal.h"
#include "qc_cleanup.h"
#include "qcshard_internal.h"

#define WRITER_BUF_SIZE (1u << 20)

struct qc_qcshard_writer {
    char *path;                       /* final name */
    char *tmp_path;                   /* path + ".tmp" */
    int fd;                           /* open on tmp_path, -1 once closed */
    int cleanup_slot;                 /* tmp_path's qc_cleanup registration, -1 when none */
    uint64_t pos;                     /* bytes written so far (flushed + buffered) */
    unsigned char *buf;               /* WRITER_BUF_SIZE bytes */
    size_t buf_len;                   /* bytes buffered, not yet written */
    struct qc_qcshard_entry *entries; /* (cap) entries, n used */
    int64_t n, cap;
    XXH3_state_t *hash; /* record checksum in progress */
    int failed;         /* a write failed: every later call fails */
    int finished;       /* finish() succeeded */
};

static enum qc_status writer_io_error(struct qc_qcshard_writer *w, const char *what, int err)
{
    w->failed = 1;
    /* the output's name, which the user gave: the temporary file is removed with the writer */
    return qc_errorf(QC_ERR_IO, "%s: %s failed: %s (writing its temporary file %s)%s", w->path,
                     what, strerror(err), w->tmp_path, data_io_hint(err));
}

static enum qc_status write_all(struct qc_qcshard_writer *w, const void *data, size_t n)
{
    const int err = data_write_all(w->fd, data, n);
    return err ? writer_io_error(w, "write", err) : QC_OK;
}

static enum qc_status writer_flush(struct qc_qcshard_writer *w)
{
    if (w->buf_len == 0)
        return QC_OK;
    const size_t n = w->buf_len;
    w->buf_len = 0;
    return write_all(w, w->buf, n);
}

/* Appends bytes to the output (and to the record checksum when hash is set). */
static enum qc_status writer_put(struct qc_qcshard_writer *w, const void *data, size_t n, int hash)
{
    if (n == 0)
        return QC_OK;
    if (hash)
        XXH3_64bits_update(w->hash, data, n);
    w->pos += n;
    if (w->buf_len + n > WRITER_BUF_SIZE) {
        QC_TRY(writer_flush(w));
        if (n >= WRITER_BUF_SIZE / 2)
            return write_all(w, data, n);
    }
    memcpy(w->buf + w->buf_len, data, n);
    w->buf_len += n;
    return QC_OK;
}

static enum qc_status writer_pad(struct qc_qcshard_writer *w, uint64_t upto, int hash)
{
    static const unsigned char zeros[8] = {0};
    QC_ASSERT(upto >= w->pos && upto - w->pos < 8, "bad padding %" PRIu64 " -> %" PRIu64, w->pos,
              upto);
    return writer_put(w, zeros, (size_t)(upto - w->pos), hash);
}

enum qc_status qc_qcshard_writer_create(const char *path, struct qc_qcshard_writer **out)
{
    if (!qcshard_host_is_le())
        return qc_errorf(QC_ERR_UNSUPPORTED, "%s: qcshard writing needs a little-endian host",
                         path);
    struct qc_qcshard_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return qc_errorf(QC_ERR_NOMEM, "%s: cannot allocate the writer", path);
    w->fd = -1;
    w->cleanup_slot = -1;
    const size_t len = strlen(path);
    w->path = malloc(len + 1);
    w->tmp_path = malloc(len + 5);
    w->buf = malloc(WRITER_BUF_SIZE);
    w->hash = XXH3_createState();
    if (!w->path || !w->tmp_path || !w->buf || !w->hash) {
        qc_qcshard_writer_destroy(w);
        return qc_errorf(QC_ERR_NOMEM, "%s: cannot allocate the writer", path);
    }
    memcpy(w->path, path, len + 1);
    memcpy(w->tmp_path, path, len);
    memcpy(w->tmp_path + len, ".tmp", 5);
    /* A directory at path would only fail the final rename, after all the work: fail now. */
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        free(w->tmp_path);
        w->tmp_path = NULL; /* nothing to remove */
        qc_qcshard_writer_destroy(w);
        return qc_errorf(QC_ERR_IO, "%s: cannot write: Is a directory%s", path,
                         data_io_hint(EISDIR));
    }
    w->cleanup_slot = qc_cleanup_register(w->tmp_path); /* SIGINT/SIGTERM remove it */
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        const int err = errno;
        qc_cleanup_unregister(w->cleanup_slot);
        w->cleanup_slot = -1;
        enum qc_status st = qc_errorf(QC_ERR_IO, "%s: cannot create: %s (its temporary file %s)%s",
                                      w->path, strerror(err), w->tmp_path, data_io_hint(err));
        free(w->tmp_path);
        w->tmp_path = NULL; /* nothing to remove */
        qc_qcshard_writer_destroy(w);
        return st;
    }
    /* Placeholder header; finish() rewrites it. */
    unsigned char header[QC_QCSHARD_HEADER_SIZE] = {0};
    enum qc_status st = writer_put(w, header, sizeof(header), 0);
    if (st != QC_OK) {
        qc_qcshard_writer_destroy(w);
        return st;
    }
    *out = w;
    return QC_OK;
}

int64_t qc_qcshard_writer_count(const struct qc_qcshard_writer *w)
{
    return w->n;
}

enum qc_status qc_qcshard_writer_append(struct qc_qcshard_writer *w, const struct qc_scene *s)
{
    if (w->failed || w->finished || w->fd < 0)
        return qc_errorf(QC_ERR_INVALID, "%s: writer is %s", w->tmp_path,
                         w->finished ? "finished" : "in a failed state after an earlier error");
    if (w->n >= QC_QCSHARD_MAX_SCENES)
        return qc_errorf(QC_ERR_INVALID, "%s: too many scenes (at most %lld per file)", w->path,
                         QC_QCSHARD_MAX_SCENES);
    {
        enum qc_status st = qc_scene_validate(s, NULL, 0);
        if (st != QC_OK)
            return qc_error_wrap(st, "%s: scene %" PRId64 " (\"%.64s\") not written", w->path, w->n,
                                 s->scenario_id);
    }
    struct qc_scene_layout lay;
    QC_TRY(qc_scene_layout_compute(s->num_agents, s->num_polygons, s->num_points, s->num_pl2pl,
                                   QC_QCSHARD_RECORD_HEAD, &lay));
    if (w->n == w->cap) {
        const int64_t cap = w->cap ? 2 * w->cap : 64;
        struct qc_qcshard_entry *e = realloc(w->entries, (size_t)cap * sizeof(*e));
        if (!e)
            return qc_errorf(QC_ERR_NOMEM, "%s: cannot grow the index", w->path);
        w->entries = e;
        w->cap = cap;
    }

    // record header (144 bytes)
    unsigned char head[QC_QCSHARD_RECORD_HEAD] = {0};
    memcpy(head, qcshard_record_magic, 4);
    qcshard_put_u64(head + 8, (uint64_t)s->num_agents);
    qcshard_put_u64(head + 16, (uint64_t)s->num_polygons);
    qcshard_put_u64(head + 24, (uint64_t)s->num_points);
    qcshard_put_u64(head + 32, (uint64_t)s->num_pl2pl);
    qcshard_put_u64(head + 40, (uint64_t)s->av_index);
    /* strings zero-filled after their NUL (validated to be terminated) */
    memcpy(head + 48, s->scenario_id, strnlen(s->scenario_id, QC_SCENE_ID_MAX));
    memcpy(head + 112, s->city, strnlen(s->city, QC_SCENE_CITY_MAX));

    const uint64_t start = w->pos;
    XXH3_64bits_reset(w->hash);
    QC_TRY(writer_put(w, head, sizeof(head), 1));

    const void *arrays[QC_SCENE_ARRAY_COUNT] = {
        s->valid_mask,         s->predict_mask,   s->agent_type,     s->agent_category,
        s->position,           s->heading,        s->velocity,       NULL /* agent_id below */,
        s->pl_position,        s->pl_orientation, s->pl_height,      s->pl_type,
        s->pl_is_intersection, s->pt_position,    s->pt_orientation, s->pt_magnitude,
        s->pt_height,          s->pt_type,        s->pt_side,        s->pt2pl,
        s->pl2pl_edge,         s->pl2pl_type,
    };
    for (int k = 0; k < QC_SCENE_ARRAY_COUNT; k++) {
        QC_ASSERT(start + lay.offset[k] == w->pos, "record layout drift at array %d", k);
        if (k == QC_SCENE_AGENT_ID) {
            /* ids zero-filled after their NUL, so equal scenes give equal bytes */
            for (int64_t a = 0; a < s->num_agents; a++) {
                char id[QC_AGENT_ID_MAX] = {0};
                memcpy(id, s->agent_id[a], strnlen(s->agent_id[a], QC_AGENT_ID_MAX));
                QC_TRY(writer_put(w, id, sizeof(id), 1));
            }
        } else {
            QC_TRY(writer_put(w, arrays[k], (size_t)lay.bytes[k], 1));
        }
        QC_TRY(writer_pad(w, start + ((lay.offset[k] + lay.bytes[k] + 7u) & ~(uint64_t)7u), 1));
    }
    QC_ASSERT(w->pos - start == lay.size, "record size %" PRIu64 " != layout %" PRIu64,
              w->pos - start, lay.size);

    struct qc_qcshard_entry *e = &w->entries[w->n++];
    e->offset = start;
    e->size = lay.size;
    e->checksum = XXH3_64bits_digest(w->hash);
    e->num_agents = s->num_agents;
    e->num_polygons = s->num_polygons;
    e->num_points = s->num_points;
    e->num_pl2pl = s->num_pl2pl;
    return QC_OK;
}

static enum qc_status writer_finish(struct qc_qcshard_writer *w)
{
    if (w->failed || w->finished || w->fd < 0)
        return qc_errorf(QC_ERR_INVALID, "%s: writer is %s", w->tmp_path,
                         w->finished ? "already finished" : "in a failed state");
    const uint64_t index_offset = w->pos;
    QC_ASSERT(index_offset % 8 == 0, "index offset %" PRIu64 " not aligned", index_offset);
    XXH3_64bits_reset(w->hash);
    for (int64_t i = 0; i < w->n; i++) {
        const struct qc_qcshard_entry *e = &w->entries[i];
        unsigned char b[QC_QCSHARD_ENTRY_SIZE];
        qcshard_put_u64(b, e->offset);
        qcshard_put_u64(b + 8, e->size);
        qcshard_put_u64(b + 16, e->checksum);
        qcshard_put_u32(b + 24, (uint32_t)e->num_agents);
        qcshard_put_u32(b + 28, (uint32_t)e->num_polygons);
        qcshard_put_u32(b + 32, (uint32_t)e->num_points);
        qcshard_put_u32(b + 36, (uint32_t)e->num_pl2pl);
        QC_TRY(writer_put(w, b, sizeof(b), 1));
    }
    const uint64_t index_checksum = XXH3_64bits_digest(w->hash);
    QC_TRY(writer_flush(w));

    unsigned char h[QC_QCSHARD_HEADER_SIZE] = {0};
    memcpy(h, qcshard_magic, 8);
    qcshard_put_u32(h + 8, QC_QCSHARD_VERSION);
    qcshard_put_u32(h + 12, 0);
    qcshard_put_u64(h + 16, (uint64_t)w->n);
    qcshard_put_u64(h + 24, index_offset);
    qcshard_put_u64(h + 32, index_checksum);
    qcshard_put_u64(h + 56, XXH3_64bits(h, 56));
    for (size_t done = 0; done < sizeof(h);) {
        ssize_t k = pwrite(w->fd, h + done, sizeof(h) - done, (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return writer_io_error(w, "header write", k < 0 ? errno : ENOSPC);
        done += (size_t)k;
    }
    if (fsync(w->fd) != 0)
        return writer_io_error(w, "fsync", errno);
    const int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0)
        return writer_io_error(w, "close", errno);
    if (rename(w->tmp_path, w->path) != 0) {
        const int err = errno;
        w->failed = 1;
        return qc_errorf(QC_ERR_IO, "%s: cannot rename to %s: %s", w->tmp_path, w->path,
                         strerror(err));
    }
    w->finished = 1;
    qc_cleanup_unregister(w->cleanup_slot); /* the name is the real output now */
    w->cleanup_slot = -1;
    return data_fsync_dir(w->path);
}

enum qc_status qc_qcshard_writer_finish(struct qc_qcshard_writer *w)
{
    enum qc_status st = writer_finish(w);
    if (st != QC_OK && !w->finished)
        w->failed = 1;
    return st;
}

void qc_qcshard_writer_destroy(struct qc_qcshard_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (!w->finished && w->tmp_path)
        unlink(w->tmp_path);
    qc_cleanup_unregister(w->cleanup_slot);
    if (w->hash)
        XXH3_freeState(w->hash);
    free(w->entries);
    free(w->buf);
    free(w->tmp_path);
    free(w->path);
    free(w);
}

enum qc_status qc_qcshard_write_file(const char *path, const struct qc_scene *scenes, int64_t n)
{
    struct qc_qcshard_writer *w;
    QC_TRY(qc_qcshard_writer_create(path, &w));
    enum qc_status st = QC_OK;
    for (int64_t i = 0; i < n && st == QC_OK; i++)
        st = qc_qcshard_writer_append(w, &scenes[i]);
    if (st == QC_OK)
        st = qc_qcshard_writer_finish(w);
    qc_qcshard_writer_destroy(w);
    return st;
}
