/*
 * qcshard_read.c — the hardened mmap reader of qcshard files (docs/QCSHARD.md).
 *
 * Trust nothing: every count, offset and size is checked against the mapping with overflow-safe
 * arithmetic before any byte it names is touched. Opening checks the header and the whole index;
 * a record is checked the first time it is opened (checksum, record header, layout, zero padding
 * and the value rules of qc_scene_validate) and the result is cached per record, so later opens
 * are a few pointer assignments. Scenes are zero-copy views into the mapping.
 */
#include "qc_qcshard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h> /* XXH3_64bits */

#include "qc_file.h"
#include "qcshard_internal.h"

struct qc_qcshard_reader {
    char *path;                       /* file name for messages */
    const unsigned char *data;        /* the file bytes (mapping or heap copy) */
    uint64_t size;                    /* bytes at data */
    void *map;                        /* mmap base to munmap, or NULL */
    void *heap;                       /* heap copy to free, or NULL */
    int64_t n;                        /* scenes */
    struct qc_qcshard_entry *entries; /* (n) decoded and checked index */
    atomic_uchar *checked;            /* (n) 1 once record i passed validation */
};

// ---- header and index -----------------------------------------------------------------------

static enum qc_status read_header_and_index(struct qc_qcshard_reader *r)
{
    const char *f = r->path;
    const unsigned char *d = r->data;
    if (r->size < QC_QCSHARD_HEADER_SIZE)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: file is %" PRIu64 " bytes, shorter than the %d-byte "
                         "header: truncated or not a qcshard file",
                         f, r->size, QC_QCSHARD_HEADER_SIZE);
    if (memcmp(d, qcshard_magic, 8) != 0) {
        char shown[8 * 4 + 1];
        for (int i = 0; i < 8; i++)
            snprintf(shown + 4 * i, 5, "\\x%02x", d[i]);
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field magic: value \"%s\", expected \"QCSHARD\\0\": "
                         "not a qcshard file",
                         f, shown);
    }
    const uint32_t version = qcshard_get_u32(d + 8);
    if (version != QC_QCSHARD_VERSION)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field version: value %" PRIu32 " is not supported "
                         "(this build reads version %d)\nhint: %s",
                         f, version, QC_QCSHARD_VERSION,
                         version > QC_QCSHARD_VERSION
                             ? "the file was written by a newer qctrain; upgrade this one"
                             : "regenerate the file with this qctrain");
    const uint64_t hsum = qcshard_get_u64(d + 56), hcomp = XXH3_64bits(d, 56);
    if (hsum != hcomp)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field header_checksum: value 0x%016" PRIx64 ", but the "
                         "header hashes to 0x%016" PRIx64 ": corrupted header",
                         f, hsum, hcomp);
    const uint32_t flags = qcshard_get_u32(d + 12);
    if (flags != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field flags: value 0x%08" PRIx32 " has bits this "
                         "version does not define",
                         f, flags);
    if (qcshard_get_u64(d + 40) != 0 || qcshard_get_u64(d + 48) != 0)
        return qc_errorf(QC_ERR_INVALID, "%s: field reserved: non-zero", f);
    const uint64_t count = qcshard_get_u64(d + 16);
    const uint64_t index_offset = qcshard_get_u64(d + 24);
    if (count > (uint64_t)QC_QCSHARD_MAX_SCENES)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field scene_count: value %" PRIu64 " out of range "
                         "[0, %lld]",
                         f, count, QC_QCSHARD_MAX_SCENES);
    if (index_offset < QC_QCSHARD_HEADER_SIZE || index_offset % 8 != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field index_offset: value %" PRIu64 " must be a "
                         "multiple of 8 and at least %d",
                         f, index_offset, QC_QCSHARD_HEADER_SIZE);
    /* count <= 2^32, so the product fits; the sum is checked against overflow. */
    const uint64_t index_bytes = count * QC_QCSHARD_ENTRY_SIZE;
    if (index_offset > r->size || index_bytes > r->size - index_offset)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field index_offset: index of %" PRIu64 " entries at "
                         "byte %" PRIu64 " ends past the end of the file (%" PRIu64
                         " bytes): truncated file or bad index_offset",
                         f, count, index_offset, r->size);
    if (index_offset + index_bytes != r->size)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field index_offset: index ends at byte %" PRIu64
                         " but the file has %" PRIu64 " bytes: trailing bytes",
                         f, index_offset + index_bytes, r->size);
    const uint64_t isum = qcshard_get_u64(d + 32),
                   icomp = XXH3_64bits(d + index_offset, index_bytes);
    if (isum != icomp)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: field index_checksum: value 0x%016" PRIx64 ", but the "
                         "index hashes to 0x%016" PRIx64 ": corrupted index",
                         f, isum, icomp);

    r->n = (int64_t)count;
    r->entries = calloc(count ? count : 1, sizeof(*r->entries));
    r->checked = calloc(count ? count : 1, sizeof(*r->checked));
    if (!r->entries || !r->checked)
        return qc_errorf(QC_ERR_NOMEM, "%s: cannot allocate the index of %" PRIu64 " scenes", f,
                         count);
    uint64_t prev_end = QC_QCSHARD_HEADER_SIZE;
    for (uint64_t i = 0; i < count; i++) {
        const unsigned char *b = d + index_offset + i * QC_QCSHARD_ENTRY_SIZE;
        struct qc_qcshard_entry *e = &r->entries[i];
        e->offset = qcshard_get_u64(b);
        e->size = qcshard_get_u64(b + 8);
        e->checksum = qcshard_get_u64(b + 16);
        e->num_agents = qcshard_get_u32(b + 24);
        e->num_polygons = qcshard_get_u32(b + 28);
        e->num_points = qcshard_get_u32(b + 32);
        e->num_pl2pl = qcshard_get_u32(b + 36);
        if (e->offset % 8 != 0)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: record %" PRIu64 ": field offset: value %" PRIu64
                             " is not a multiple of 8",
                             f, i, e->offset);
        if (e->offset < prev_end)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: record %" PRIu64 ": field offset: value %" PRIu64
                             " overlaps the %s (which ends at byte %" PRIu64 ")",
                             f, i, e->offset, i ? "previous record" : "header", prev_end);
        if (e->offset > index_offset || e->size > index_offset - e->offset)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: record %" PRIu64 ": field offset: record of %" PRIu64
                             " bytes at byte %" PRIu64 " runs past the end of the "
                             "records (index at byte %" PRIu64 ")",
                             f, i, e->size, e->offset, index_offset);
        if (e->size < QC_QCSHARD_RECORD_HEAD)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: record %" PRIu64 ": field size: value %" PRIu64
                             " is smaller than the %d-byte record header",
                             f, i, e->size, QC_QCSHARD_RECORD_HEAD);
        prev_end = e->offset + e->size;
    }
    return QC_OK;
}

static enum qc_status reader_new(const char *path, struct qc_qcshard_reader **out)
{
    if (!qcshard_host_is_le())
        return qc_errorf(QC_ERR_UNSUPPORTED, "%s: qcshard reading needs a little-endian host",
                         path);
    struct qc_qcshard_reader *r = calloc(1, sizeof(*r));
    const size_t len = strlen(path);
    if (r)
        r->path = malloc(len + 1);
    if (!r || !r->path) {
        free(r);
        return qc_errorf(QC_ERR_NOMEM, "%s: cannot allocate the reader", path);
    }
    memcpy(r->path, path, len + 1);
    *out = r;
    return QC_OK;
}

static enum qc_status reader_finish_open(struct qc_qcshard_reader *r,
                                         struct qc_qcshard_reader **out)
{
    enum qc_status st = read_header_and_index(r);
    if (st != QC_OK) {
        qc_qcshard_reader_destroy(r);
        return st;
    }
    *out = r;
    return QC_OK;
}

enum qc_status qc_qcshard_reader_create(const char *path, struct qc_qcshard_reader **out)
{
    struct qc_qcshard_reader *r = NULL;
    QC_TRY(reader_new(path, &r));
    int fd = -1;
    uint64_t size = 0;
    const enum qc_status ost = qc_file_open_regular(path, "qcshard", &fd, &size);
    if (ost != QC_OK) {
        qc_qcshard_reader_destroy(r);
        return ost;
    }
    r->size = size;
    if (r->size >= QC_QCSHARD_HEADER_SIZE) {
        void *m = mmap(NULL, (size_t)r->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int err = errno;
            close(fd);
            qc_qcshard_reader_destroy(r);
            return qc_errorf(QC_ERR_IO, "%s: cannot map %" PRIu64 " bytes: %s", path, size,
                             strerror(err));
        }
        r->map = m;
        r->data = m;
    } else {
        /* Too short for a header: read what is there so the check reports it. */
        static const unsigned char none[1] = {0};
        r->data = none;
    }
    close(fd);
    return reader_finish_open(r, out);
}

enum qc_status qc_qcshard_reader_create_memory(const void *data, size_t size, const char *name,
                                               struct qc_qcshard_reader **out)
{
    struct qc_qcshard_reader *r = NULL;
    QC_TRY(reader_new(name, &r));
    r->heap = malloc(size ? size : 1);
    if (!r->heap) {
        qc_qcshard_reader_destroy(r);
        return qc_errorf(QC_ERR_NOMEM, "%s: cannot copy %zu bytes", name, size);
    }
    if (size)
        memcpy(r->heap, data, size);
    r->data = r->heap;
    r->size = size;
    return reader_finish_open(r, out);
}

void qc_qcshard_reader_destroy(struct qc_qcshard_reader *r)
{
    if (!r)
        return;
    if (r->map)
        munmap(r->map, (size_t)r->size);
    free(r->heap);
    free(r->entries);
    free(r->checked);
    free(r->path);
    free(r);
}

int64_t qc_qcshard_reader_count(const struct qc_qcshard_reader *r)
{
    return r->n;
}

const char *qc_qcshard_reader_path(const struct qc_qcshard_reader *r)
{
    return r->path;
}

enum qc_status qc_qcshard_reader_entry(const struct qc_qcshard_reader *r, int64_t i,
                                       struct qc_qcshard_entry *out)
{
    if (i < 0 || i >= r->n)
        return qc_errorf(QC_ERR_INVALID, "%s: scene %" PRId64 " out of range [0, %" PRId64 ")",
                         r->path, i, r->n);
    *out = r->entries[i];
    return QC_OK;
}

// ---- records --------------------------------------------------------------------------------

/* Points the scene's arrays into the record body at rec (layout computed with base 144). */
static void scene_view(struct qc_scene *s, const unsigned char *rec,
                       const struct qc_scene_layout *lay)
{
#define AT(k) (const void *)(rec + lay->offset[k])
    s->valid_mask = AT(QC_SCENE_VALID_MASK);
    s->predict_mask = AT(QC_SCENE_PREDICT_MASK);
    s->agent_type = AT(QC_SCENE_AGENT_TYPE);
    s->agent_category = AT(QC_SCENE_AGENT_CATEGORY);
    s->position = AT(QC_SCENE_POSITION);
    s->heading = AT(QC_SCENE_HEADING);
    s->velocity = AT(QC_SCENE_VELOCITY);
    {
        /* C11 treats a pointer to an array of const char as dropping const in a cast; go through
         * a union instead (same representation). */
        union {
            const void *v;
            const char (*ids)[QC_AGENT_ID_MAX];
        } u = {.v = rec + lay->offset[QC_SCENE_AGENT_ID]};
        s->agent_id = u.ids;
    }
    s->pl_position = AT(QC_SCENE_PL_POSITION);
    s->pl_orientation = AT(QC_SCENE_PL_ORIENTATION);
    s->pl_height = AT(QC_SCENE_PL_HEIGHT);
    s->pl_type = AT(QC_SCENE_PL_TYPE);
    s->pl_is_intersection = AT(QC_SCENE_PL_IS_INTERSECTION);
    s->pt_position = AT(QC_SCENE_PT_POSITION);
    s->pt_orientation = AT(QC_SCENE_PT_ORIENTATION);
    s->pt_magnitude = AT(QC_SCENE_PT_MAGNITUDE);
    s->pt_height = AT(QC_SCENE_PT_HEIGHT);
    s->pt_type = AT(QC_SCENE_PT_TYPE);
    s->pt_side = AT(QC_SCENE_PT_SIDE);
    s->pt2pl = AT(QC_SCENE_PT2PL);
    s->pl2pl_edge = AT(QC_SCENE_PL2PL_EDGE);
    s->pl2pl_type = AT(QC_SCENE_PL2PL_TYPE);
#undef AT
}

#ifdef QC_FUZZ_BUILD
/* fuzz builds: how deep the inputs got (qc_qcshard_fuzz_counters) */
static _Atomic uint64_t fuzz_records_opened, fuzz_records_validated;
#endif

void qc_qcshard_fuzz_counters(uint64_t *records_opened, uint64_t *records_validated)
{
#ifdef QC_FUZZ_BUILD
    *records_opened = atomic_load(&fuzz_records_opened);
    *records_validated = atomic_load(&fuzz_records_validated);
#else
    *records_opened = *records_validated = 0;
#endif
}

/* Decodes record i's header and builds the view; when full, checks checksum, layout, padding
 * and every value first. */
static enum qc_status record_open(const struct qc_qcshard_reader *r, int64_t i, int full,
                                  struct qc_scene *out)
{
    const char *f = r->path;
    const struct qc_qcshard_entry *e = &r->entries[i];
    const unsigned char *rec = r->data + e->offset; /* e->offset + e->size <= r->size (index) */
#ifdef QC_FUZZ_BUILD
    if (full)
        atomic_fetch_add(&fuzz_records_opened, 1);
#endif
    if (full) {
        const uint64_t sum = XXH3_64bits(rec, (size_t)e->size);
        if (sum != e->checksum)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: record %" PRId64 ": field checksum: value 0x%016" PRIx64
                             ", but the record hashes to 0x%016" PRIx64 ": corrupted record",
                             f, i, e->checksum, sum);
        if (memcmp(rec, qcshard_record_magic, 4) != 0 || qcshard_get_u32(rec + 4) != 0)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: record %" PRId64 ": field record_magic: bad "
                             "record header (expected \"QCSC\" and reserved 0)",
                             f, i);
    }
    const char *names[4] = {"num_agents", "num_polygons", "num_points", "num_pl2pl"};
    const int64_t index_counts[4] = {e->num_agents, e->num_polygons, e->num_points, e->num_pl2pl};
    int64_t c[4];
    for (int k = 0; k < 4; k++) {
        const uint64_t v = qcshard_get_u64(rec + 8 + 8 * k);
        c[k] = v > (uint64_t)INT64_MAX ? -1 : (int64_t)v;
        if (full && c[k] != index_counts[k])
            return qc_errorf(QC_ERR_INVALID,
                             "%s: record %" PRId64 ": field %s: value %" PRIu64
                             " disagrees with the index (%" PRId64 ")",
                             f, i, names[k], v, index_counts[k]);
    }
    struct qc_scene_layout lay;
    {
        enum qc_status st =
            qc_scene_layout_compute(c[0], c[1], c[2], c[3], QC_QCSHARD_RECORD_HEAD, &lay);
        if (st != QC_OK)
            return qc_error_wrap(st, "%s: record %" PRId64, f, i);
    }
    if (lay.size != e->size)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: record %" PRId64 ": field size: value %" PRIu64
                         ", but its counts (A %" PRId64 ", P %" PRId64 ", Pt %" PRId64
                         ", Et %" PRId64 ") lay out %" PRIu64 " bytes",
                         f, i, e->size, c[0], c[1], c[2], c[3], lay.size);
    if (full) {
        for (int k = 0; k < QC_SCENE_ARRAY_COUNT; k++) {
            const uint64_t from = lay.offset[k] + lay.bytes[k];
            const uint64_t to = k + 1 < QC_SCENE_ARRAY_COUNT ? lay.offset[k + 1] : lay.size;
            for (uint64_t b = from; b < to; b++)
                if (rec[b] != 0)
                    return qc_errorf(QC_ERR_INVALID,
                                     "%s: record %" PRId64 ": field %s: padding "
                                     "byte %" PRIu64 " after it is 0x%02x, not 0",
                                     f, i, qc_scene_array_name((enum qc_scene_array)k), b - from,
                                     rec[b]);
        }
    }
    struct qc_scene s;
    memset(&s, 0, sizeof(s));
    s.num_agents = c[0];
    s.num_polygons = c[1];
    s.num_points = c[2];
    s.num_pl2pl = c[3];
    const uint64_t av = qcshard_get_u64(rec + 40);
    s.av_index = av > (uint64_t)INT64_MAX ? -1 : (int64_t)av;
    if (!memchr(rec + 48, 0, QC_SCENE_ID_MAX))
        return qc_errorf(QC_ERR_INVALID,
                         "%s: record %" PRId64 ": field scenario_id: not "
                         "NUL-terminated within %d bytes",
                         f, i, QC_SCENE_ID_MAX);
    if (!memchr(rec + 112, 0, QC_SCENE_CITY_MAX))
        return qc_errorf(QC_ERR_INVALID,
                         "%s: record %" PRId64 ": field city: not NUL-terminated "
                         "within %d bytes",
                         f, i, QC_SCENE_CITY_MAX);
    memcpy(s.scenario_id, rec + 48, QC_SCENE_ID_MAX);
    memcpy(s.city, rec + 112, QC_SCENE_CITY_MAX);
    scene_view(&s, rec, &lay);
#ifdef QC_FUZZ_BUILD
    if (full)
        atomic_fetch_add(&fuzz_records_validated, 1);
#endif
    if (full)
        QC_TRY(qc_scene_validate(&s, f, i));
    *out = s;
    return QC_OK;
}

enum qc_status qc_qcshard_reader_scene(struct qc_qcshard_reader *r, int64_t i, struct qc_scene *out)
{
    if (i < 0 || i >= r->n)
        return qc_errorf(QC_ERR_INVALID, "%s: scene %" PRId64 " out of range [0, %" PRId64 ")",
                         r->path, i, r->n);
    const int full = !atomic_load_explicit(&r->checked[i], memory_order_acquire);
    QC_TRY(record_open(r, i, full, out));
    if (full)
        atomic_store_explicit(&r->checked[i], 1, memory_order_release);
    return QC_OK;
}

enum qc_status qc_qcshard_reader_validate_all(struct qc_qcshard_reader *r)
{
    for (int64_t i = 0; i < r->n; i++) {
        struct qc_scene s;
        QC_TRY(qc_qcshard_reader_scene(r, i, &s));
    }
    return QC_OK;
}
