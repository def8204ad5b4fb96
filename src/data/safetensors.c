/*
 * safetensors.c — strict safetensors reader (mmap) and atomic writer. See qc_safetensors.h for
 * the format and the checks.
 *
 * Names and metadata keys are looked up through an index sorted by strcmp (duplicates are
 * neighbours there), so a header of n entries costs O(n log n). A linear search per entry made
 * it O(n^2): 100,000 empty tensors (a 5.9 MB header) took 9 s of CPU and 20,000 took 0.4 s, so
 * a crafted header at the 100 MB limit (~1.7 million entries) would have held --init-from or
 * --resume for most of an hour before any check failed.
 */
#include "qc_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "data_internal.h"
#include "qc_cleanup.h"
#include "qc_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#    error "qc_safetensors assumes a little-endian host"
#endif

/* A header larger than this is refused (the reference implementation uses 100 MB). */
#define ST_HEADER_MAX (100u * 1000u * 1000u)
/* JSON integers are doubles; offsets and extents must stay exactly representable: below 2^53,
 * since every integer literal from 2^53 up reads as a double >= 2^53 (2^53 + 1 reads as 2^53). */
#define ST_INT_LIMIT 9007199254740992.0 /* 2^53 */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[QC_ST_DTYPE_COUNT] = {
    [QC_ST_BOOL] = {"BOOL", 1}, [QC_ST_U8] = {"U8", 1},   [QC_ST_I8] = {"I8", 1},
    [QC_ST_I16] = {"I16", 2},   [QC_ST_U16] = {"U16", 2}, [QC_ST_F16] = {"F16", 2},
    [QC_ST_BF16] = {"BF16", 2}, [QC_ST_I32] = {"I32", 4}, [QC_ST_U32] = {"U32", 4},
    [QC_ST_F32] = {"F32", 4},   [QC_ST_I64] = {"I64", 8}, [QC_ST_U64] = {"U64", 8},
    [QC_ST_F64] = {"F64", 8},
};

const char *qc_st_dtype_name(enum qc_st_dtype dtype)
{
    if ((int)dtype < 0 || dtype >= QC_ST_DTYPE_COUNT)
        return NULL;
    return st_dtypes[dtype].name;
}

size_t qc_st_dtype_size(enum qc_st_dtype dtype)
{
    if ((int)dtype < 0 || dtype >= QC_ST_DTYPE_COUNT)
        return 0;
    return st_dtypes[dtype].size;
}

// ---- reader --------------------------------------------------------------------------------

/* An entry of a sorted index: a name and the position it belongs to. */
struct st_name {
    const char *name; /* borrowed from names / meta_keys */
    int64_t idx;
};

/* strcmp order, then position: equal names are neighbours, the first in the header first. */
static int st_name_cmp(const void *a, const void *b)
{
    const struct st_name *x = a, *y = b;
    const int c = strcmp(x->name, y->name);
    if (c)
        return c;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int st_name_find_cmp(const void *key, const void *e)
{
    return strcmp(key, ((const struct st_name *)e)->name);
}

/* Sorts the index of n names; the first name found twice (the later of the two in the header
 * goes to *dup), or NULL. */
static const char *st_index_sort(struct st_name *ix, int64_t n, int64_t *dup)
{
    qsort(ix, (size_t)n, sizeof *ix, st_name_cmp);
    const char *first = NULL;
    for (int64_t k = 1; k < n; k++)
        if (strcmp(ix[k - 1].name, ix[k].name) == 0 && (!first || ix[k].idx < *dup)) {
            first = ix[k].name;
            *dup = ix[k].idx;
        }
    return first;
}

struct qc_safetensors {
    char *path;
    const uint8_t *base;          /* whole file image */
    size_t len;                   /* bytes of the image */
    bool mapped;                  /* base is an mmap (else malloc'd) */
    int64_t n;                    /* tensors */
    struct qc_st_tensor *tensors; /* (n) in header order */
    char **names;                 /* (n) owned */
    void **copies;                /* (n) aligned private copies, or NULL entries */
    int64_t nmeta;
    char **meta_keys;            /* (nmeta) owned */
    char **meta_vals;            /* (nmeta) owned */
    struct st_name *by_name;     /* (n) the tensors sorted by name */
    struct st_name *meta_by_key; /* (nmeta) the metadata entries sorted by key */
};

void qc_safetensors_close(struct qc_safetensors *st)
{
    if (!st)
        return;
    for (int64_t i = 0; i < st->n; i++) {
        if (st->names)
            free(st->names[i]);
        if (st->copies)
            free(st->copies[i]);
    }
    for (int64_t i = 0; i < st->nmeta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_vals[i]);
    }
    free(st->meta_keys);
    free(st->meta_vals);
    free(st->by_name);
    free(st->meta_by_key);
    free(st->names);
    free(st->copies);
    free(st->tensors);
    if (st->base) {
        if (st->mapped)
            munmap((void *)(uintptr_t)st->base, st->len);
        else
            free((void *)(uintptr_t)st->base);
    }
    free(st->path);
    free(st);
}

/* A JSON number that is a non-negative integer below 2^53. */
static bool st_json_uint(const cJSON *j, int64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v >= ST_INT_LIMIT || floor(v) != v)
        return false;
    *out = (int64_t)v;
    return true;
}

struct st_span {
    int64_t begin, end, idx;
};

static int st_span_cmp(const void *a, const void *b)
{
    const struct st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

static enum qc_status st_parse_tensor(struct qc_safetensors *st, const cJSON *item,
                                      struct qc_st_tensor *t, struct st_span *span)
{
    const char *nm = item->string;
    if (!cJSON_IsObject(item))
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': header entry is not a JSON object",
                         st->path, nm);
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    for (const cJSON *f = item->child; f; f = f->next) {
        if (strcmp(f->string, "dtype") == 0 && !jd)
            jd = f;
        else if (strcmp(f->string, "shape") == 0 && !js)
            js = f;
        else if (strcmp(f->string, "data_offsets") == 0 && !jo)
            jo = f;
        else
            return qc_errorf(QC_ERR_INVALID,
                             "%s: tensor '%s': unexpected or repeated field '%s'\n"
                             "hint: an entry holds exactly dtype, shape and data_offsets",
                             st->path, nm, f->string);
    }
    if (!jd || !js || !jo)
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': missing field '%s'", st->path, nm,
                         !jd   ? "dtype"
                         : !js ? "shape"
                               : "data_offsets");
    if (!cJSON_IsString(jd))
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': field dtype is not a string", st->path,
                         nm);
    int dt = -1;
    for (int d = 0; d < QC_ST_DTYPE_COUNT; d++)
        if (strcmp(jd->valuestring, st_dtypes[d].name) == 0)
            dt = d;
    if (dt < 0)
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': field dtype: unsupported value '%s'",
                         st->path, nm, jd->valuestring);
    t->dtype = (enum qc_st_dtype)dt;

    if (!cJSON_IsArray(js))
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': field shape is not an array", st->path,
                         nm);
    int nd = cJSON_GetArraySize(js);
    if (nd > QC_ST_MAX_DIMS)
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': field shape: %d dimensions (max %d)",
                         st->path, nm, nd, QC_ST_MAX_DIMS);
    t->ndim = nd;
    int64_t numel = 1;
    int d = 0;
    for (const cJSON *e = js->child; e; e = e->next, d++) {
        int64_t ext;
        if (!st_json_uint(e, &ext))
            return qc_errorf(
                QC_ERR_INVALID,
                "%s: tensor '%s': field shape[%d] is not a non-negative integer below 2^53",
                st->path, nm, d);
        t->shape[d] = ext;
        if (ext != 0 && numel > INT64_MAX / ext)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: tensor '%s': field shape: element count overflows", st->path, nm);
        numel *= ext;
    }
    t->numel = numel;
    size_t es = st_dtypes[dt].size;
    if ((uint64_t)numel > (uint64_t)SIZE_MAX / es)
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': field shape: byte size overflows",
                         st->path, nm);
    t->nbytes = (size_t)numel * es;

    int64_t b, e;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !st_json_uint(jo->child, &b) ||
        !st_json_uint(jo->child->next, &e))
        return qc_errorf(QC_ERR_INVALID,
                         "%s: tensor '%s': field data_offsets is not [begin, end] of "
                         "non-negative integers below 2^53",
                         st->path, nm);
    if (e < b)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: tensor '%s': field data_offsets: end %lld < begin %lld", st->path, nm,
                         (long long)e, (long long)b);
    if ((uint64_t)(e - b) != (uint64_t)t->nbytes)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: tensor '%s': field data_offsets: %lld bytes, but dtype %s and shape "
                         "need %zu",
                         st->path, nm, (long long)(e - b), st_dtypes[dt].name, t->nbytes);
    span->begin = b;
    span->end = e;
    return QC_OK;
}

static enum qc_status st_parse_metadata(struct qc_safetensors *st, const cJSON *item)
{
    if (!cJSON_IsObject(item))
        return qc_errorf(QC_ERR_INVALID, "%s: __metadata__ is not a JSON object", st->path);
    int n = cJSON_GetArraySize(item);
    st->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    st->meta_vals = calloc((size_t)n + 1, sizeof(char *));
    st->meta_by_key = calloc((size_t)n + 1, sizeof(*st->meta_by_key));
    if (!st->meta_keys || !st->meta_vals || !st->meta_by_key)
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory reading __metadata__", st->path);
    for (const cJSON *m = item->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return qc_errorf(QC_ERR_INVALID, "%s: __metadata__ key '%s': value is not a string",
                             st->path, m->string);
        st->meta_keys[st->nmeta] = strdup(m->string);
        st->meta_vals[st->nmeta] = strdup(m->valuestring);
        st->nmeta++;
        if (!st->meta_keys[st->nmeta - 1] || !st->meta_vals[st->nmeta - 1])
            return qc_errorf(QC_ERR_NOMEM, "%s: out of memory reading __metadata__", st->path);
        st->meta_by_key[st->nmeta - 1] =
            (struct st_name){.name = st->meta_keys[st->nmeta - 1], .idx = st->nmeta - 1};
    }
    int64_t dup = 0;
    const char *twice = st_index_sort(st->meta_by_key, st->nmeta, &dup);
    if (twice)
        return qc_errorf(QC_ERR_INVALID, "%s: __metadata__ key '%s' appears twice", st->path,
                         twice);
    return QC_OK;
}

static enum qc_status st_parse_header(struct qc_safetensors *st, const cJSON *root, size_t data_len)
{
    int nitems = cJSON_GetArraySize(root);
    st->tensors = calloc((size_t)nitems + 1, sizeof(*st->tensors));
    st->names = calloc((size_t)nitems + 1, sizeof(char *));
    st->copies = calloc((size_t)nitems + 1, sizeof(void *));
    st->by_name = calloc((size_t)nitems + 1, sizeof(*st->by_name));
    struct st_span *spans = calloc((size_t)nitems + 1, sizeof(*spans));
    if (!st->tensors || !st->names || !st->copies || !st->by_name || !spans) {
        free(spans);
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory reading the header", st->path);
    }
    enum qc_status rc = QC_OK;
    bool have_meta = false;
    for (const cJSON *item = root->child; item && rc == QC_OK; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (have_meta)
                rc = qc_errorf(QC_ERR_INVALID, "%s: __metadata__ appears twice", st->path);
            else
                rc = st_parse_metadata(st, item);
            have_meta = true;
            continue;
        }
        if (item->string[0] == '\0') {
            rc = qc_errorf(QC_ERR_INVALID, "%s: a tensor has an empty name", st->path);
            break;
        }
        int64_t i = st->n;
        st->names[i] = strdup(item->string);
        if (!st->names[i]) {
            rc = qc_errorf(QC_ERR_NOMEM, "%s: out of memory", st->path);
            break;
        }
        st->n++;
        st->tensors[i].name = st->names[i];
        st->by_name[i] = (struct st_name){.name = st->names[i], .idx = i};
        spans[i].idx = i;
        rc = st_parse_tensor(st, item, &st->tensors[i], &spans[i]);
    }
    if (rc == QC_OK) {
        int64_t dup = 0;
        const char *twice = st_index_sort(st->by_name, st->n, &dup);
        if (twice)
            rc = qc_errorf(QC_ERR_INVALID, "%s: tensor '%s' appears twice", st->path, twice);
    }
    if (rc == QC_OK) {
        /* The tensors must tile the data buffer exactly: no holes, no overlaps. */
        qsort(spans, (size_t)st->n, sizeof(*spans), st_span_cmp);
        int64_t at = 0;
        for (int64_t k = 0; k < st->n && rc == QC_OK; k++) {
            if (spans[k].begin != at)
                rc = qc_errorf(QC_ERR_INVALID,
                               "%s: tensor '%s': field data_offsets: begins at %lld, expected "
                               "%lld (tensors must cover the data without holes or overlaps)",
                               st->path, st->names[spans[k].idx], (long long)spans[k].begin,
                               (long long)at);
            at = spans[k].end;
        }
        if (rc == QC_OK && (uint64_t)at != (uint64_t)data_len)
            rc = qc_errorf(QC_ERR_INVALID,
                           "%s: tensors cover %lld data bytes but the file holds %zu after the "
                           "header (truncated or trailing bytes)",
                           st->path, (long long)at, data_len);
    }
    const uint8_t *data = st->base + (st->len - data_len);
    for (int64_t k = 0; k < st->n && rc == QC_OK; k++) {
        struct qc_st_tensor *t = &st->tensors[spans[k].idx];
        if (t->nbytes == 0) {
            t->data = NULL;
            continue;
        }
        const uint8_t *p = data + spans[k].begin;
        size_t es = st_dtypes[t->dtype].size;
        if ((uintptr_t)p % es != 0) {
            /* Misaligned for its type: serve an aligned private copy. */
            size_t cap = (t->nbytes + 63) / 64 * 64;
            void *c = aligned_alloc(64, cap);
            if (!c) {
                rc = qc_errorf(QC_ERR_NOMEM, "%s: out of memory copying tensor '%s'", st->path,
                               t->name);
                break;
            }
            memcpy(c, p, t->nbytes);
            st->copies[spans[k].idx] = c;
            p = c;
        }
        t->data = p;
    }
    free(spans);
    return rc;
}

static enum qc_status st_parse(struct qc_safetensors *st)
{
    if (st->len < 8)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: %zu bytes: too short for a safetensors file (8-byte header length)",
                         st->path, st->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | st->base[i];
    if (hlen == 0 || hlen > ST_HEADER_MAX || hlen > st->len - 8)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: header length %llu is impossible for a file of %zu bytes "
                         "(limit %u)\nhint: the file is truncated or not a safetensors file",
                         st->path, (unsigned long long)hlen, st->len, ST_HEADER_MAX);
    const char *hdr = (const char *)st->base + 8;
    if (hdr[0] != '{')
        return qc_errorf(QC_ERR_INVALID, "%s: header does not start with '{'", st->path);
    if (memchr(hdr, '\0', (size_t)hlen))
        return qc_errorf(QC_ERR_INVALID, "%s: header contains a NUL byte", st->path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root)
        return qc_errorf(QC_ERR_INVALID, "%s: header is not valid JSON (near byte %lld)", st->path,
                         (long long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - hdr : 0));
    enum qc_status rc = QC_OK;
    for (const char *p = end; p < hdr + hlen; p++)
        if (*p != ' ') {
            rc = qc_errorf(QC_ERR_INVALID,
                           "%s: header has trailing byte 0x%02x after the JSON object "
                           "(only space padding is allowed)",
                           st->path, (unsigned)(unsigned char)*p);
            break;
        }
    if (rc == QC_OK && !cJSON_IsObject(root))
        rc = qc_errorf(QC_ERR_INVALID, "%s: header is not a JSON object", st->path);
    if (rc == QC_OK)
        rc = st_parse_header(st, root, st->len - 8 - (size_t)hlen);
    cJSON_Delete(root);
    return rc;
}

static enum qc_status st_alloc(const char *path, struct qc_safetensors **out)
{
    struct qc_safetensors *st = calloc(1, sizeof(*st));
    if (!st)
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory", path);
    st->path = strdup(path);
    if (!st->path) {
        free(st);
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory", path);
    }
    *out = st;
    return QC_OK;
}

enum qc_status qc_safetensors_open(const char *path, struct qc_safetensors **out)
{
    struct qc_safetensors *st = NULL;
    QC_TRY(st_alloc(path, &st));
    int fd = -1;
    uint64_t size = 0;
    const enum qc_status ost = qc_file_open_regular(path, "safetensors", &fd, &size);
    if (ost != QC_OK) {
        qc_safetensors_close(st);
        return ost;
    }
    st->len = (size_t)size;
    if (st->len > 0) {
        void *m = mmap(NULL, st->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            enum qc_status rc = qc_errorf(QC_ERR_IO, "%s: mmap of %zu bytes failed: %s", path,
                                          st->len, strerror(errno));
            close(fd);
            qc_safetensors_close(st);
            return rc;
        }
        st->base = m;
        st->mapped = true;
    }
    close(fd);
    enum qc_status rc = st_parse(st);
    if (rc != QC_OK) {
        qc_safetensors_close(st);
        return rc;
    }
    *out = st;
    return QC_OK;
}

enum qc_status qc_safetensors_open_memory(const void *buf, size_t len, const char *name,
                                          struct qc_safetensors **out)
{
    struct qc_safetensors *st = NULL;
    QC_TRY(st_alloc(name ? name : "(memory)", &st));
    if (len > 0) {
        /* 64-byte aligned, like a mapping, so alignment behaves as for a file. */
        void *c = aligned_alloc(64, (len + 63) / 64 * 64);
        if (!c) {
            qc_safetensors_close(st);
            return qc_errorf(QC_ERR_NOMEM, "%s: out of memory (%zu bytes)", name, len);
        }
        memcpy(c, buf, len);
        st->base = c;
        st->len = len;
    }
    enum qc_status rc = st_parse(st);
    if (rc != QC_OK) {
        qc_safetensors_close(st);
        return rc;
    }
    *out = st;
    return QC_OK;
}

int64_t qc_safetensors_count(const struct qc_safetensors *st)
{
    return st->n;
}

const struct qc_st_tensor *qc_safetensors_at(const struct qc_safetensors *st, int64_t i)
{
    QC_ASSERT(i >= 0 && i < st->n, "tensor index %lld of %lld", (long long)i, (long long)st->n);
    return &st->tensors[i];
}

const struct qc_st_tensor *qc_safetensors_find(const struct qc_safetensors *st, const char *name)
{
    const struct st_name *e =
        st->n ? bsearch(name, st->by_name, (size_t)st->n, sizeof *e, st_name_find_cmp) : NULL;
    return e ? &st->tensors[e->idx] : NULL;
}

const char *qc_safetensors_metadata(const struct qc_safetensors *st, const char *key)
{
    const struct st_name *e =
        st->nmeta ? bsearch(key, st->meta_by_key, (size_t)st->nmeta, sizeof *e, st_name_find_cmp)
                  : NULL;
    return e ? st->meta_vals[e->idx] : NULL;
}

const char *qc_safetensors_path(const struct qc_safetensors *st)
{
    return st->path;
}

static void st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t at = 0;
    at += (size_t)snprintf(buf + at, cap - at, "[");
    for (int d = 0; d < ndim && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

enum qc_status qc_safetensors_get(const struct qc_safetensors *st, const char *name,
                                  enum qc_st_dtype dtype, int ndim, const int64_t *shape,
                                  const struct qc_st_tensor **out)
{
    const struct qc_st_tensor *t = qc_safetensors_find(st, name);
    if (!t)
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s' is missing", st->path, name);
    if (t->dtype != dtype)
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': dtype %s, expected %s", st->path, name,
                         st_dtypes[t->dtype].name, qc_st_dtype_name(dtype));
    bool ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = shape[d] < 0 || shape[d] == t->shape[d];
    if (!ok) {
        char have[128], want[128];
        st_shape_str(have, sizeof(have), t->ndim, t->shape);
        st_shape_str(want, sizeof(want), ndim, shape);
        return qc_errorf(QC_ERR_INVALID, "%s: tensor '%s': shape %s, expected %s (-1 = any)",
                         st->path, name, have, want);
    }
    *out = t;
    return QC_OK;
}

// ---- writer --------------------------------------------------------------------------------

struct st_wentry {
    char *name;
    enum qc_st_dtype dtype;
    int ndim;
    int64_t shape[QC_ST_MAX_DIMS];
    size_t nbytes;
    const void *data;
};

struct qc_st_writer {
    struct st_wentry *e;
    int64_t n, cap;
    char **mkey, **mval;
    int64_t nmeta, capmeta;
};

enum qc_status qc_st_writer_create(struct qc_st_writer **out)
{
    struct qc_st_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return qc_errorf(QC_ERR_NOMEM, "safetensors writer: out of memory");
    *out = w;
    return QC_OK;
}

void qc_st_writer_destroy(struct qc_st_writer *w)
{
    if (!w)
        return;
    for (int64_t i = 0; i < w->n; i++)
        free(w->e[i].name);
    for (int64_t i = 0; i < w->nmeta; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->e);
    free(w->mkey);
    free(w->mval);
    free(w);
}

enum qc_status qc_st_writer_add(struct qc_st_writer *w, const char *name, enum qc_st_dtype dtype,
                                int ndim, const int64_t *shape, const void *data)
{
    if (!name || !name[0] || strcmp(name, "__metadata__") == 0)
        return qc_errorf(QC_ERR_INVALID, "safetensors writer: invalid tensor name '%s'",
                         name ? name : "(null)");
    if ((int)dtype < 0 || dtype >= QC_ST_DTYPE_COUNT)
        return qc_errorf(QC_ERR_INVALID, "safetensors writer: tensor '%s': bad dtype %d", name,
                         (int)dtype);
    if (ndim < 0 || ndim > QC_ST_MAX_DIMS)
        return qc_errorf(QC_ERR_INVALID, "safetensors writer: tensor '%s': ndim %d", name, ndim);
    for (int64_t i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0)
            return qc_errorf(QC_ERR_INVALID, "safetensors writer: tensor '%s' added twice", name);
    size_t nbytes = st_dtypes[dtype].size;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return qc_errorf(QC_ERR_INVALID, "safetensors writer: tensor '%s': shape[%d] = %lld",
                             name, d, (long long)shape[d]);
        if (shape[d] != 0 && nbytes > SIZE_MAX / (size_t)shape[d])
            return qc_errorf(QC_ERR_INVALID, "safetensors writer: tensor '%s': size overflows",
                             name);
        nbytes *= (size_t)shape[d];
    }
    if (nbytes > 0 && !data)
        return qc_errorf(QC_ERR_INVALID, "safetensors writer: tensor '%s': NULL data", name);
    if (w->n == w->cap) {
        int64_t nc = w->cap ? 2 * w->cap : 16;
        struct st_wentry *ne = realloc(w->e, (size_t)nc * sizeof(*ne));
        if (!ne)
            return qc_errorf(QC_ERR_NOMEM, "safetensors writer: out of memory");
        w->e = ne;
        w->cap = nc;
    }
    struct st_wentry *e = &w->e[w->n];
    memset(e, 0, sizeof(*e));
    e->name = strdup(name);
    if (!e->name)
        return qc_errorf(QC_ERR_NOMEM, "safetensors writer: out of memory");
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        e->shape[d] = shape[d];
    e->nbytes = nbytes;
    e->data = data;
    w->n++;
    return QC_OK;
}

enum qc_status qc_st_writer_set_metadata(struct qc_st_writer *w, const char *key, const char *value)
{
    for (int64_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->mkey[i], key) == 0) {
            char *v = strdup(value);
            if (!v)
                return qc_errorf(QC_ERR_NOMEM, "safetensors writer: out of memory");
            free(w->mval[i]);
            w->mval[i] = v;
            return QC_OK;
        }
    if (w->nmeta == w->capmeta) {
        int64_t nc = w->capmeta ? 2 * w->capmeta : 8;
        char **nk = realloc(w->mkey, (size_t)nc * sizeof(char *));
        if (!nk)
            return qc_errorf(QC_ERR_NOMEM, "safetensors writer: out of memory");
        w->mkey = nk;
        char **nv = realloc(w->mval, (size_t)nc * sizeof(char *));
        if (!nv)
            return qc_errorf(QC_ERR_NOMEM, "safetensors writer: out of memory");
        w->mval = nv;
        w->capmeta = nc;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return qc_errorf(QC_ERR_NOMEM, "safetensors writer: out of memory");
    }
    w->mkey[w->nmeta] = k;
    w->mval[w->nmeta] = v;
    w->nmeta++;
    return QC_OK;
}

/* A growable string for the JSON header. */
struct st_buf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void st_buf_put(struct st_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void st_buf_puts(struct st_buf *b, const char *s)
{
    st_buf_put(b, s, strlen(s));
}

static void st_buf_json_str(struct st_buf *b, const char *s)
{
    st_buf_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            st_buf_put(b, esc, 2);
        } else if (*c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", (unsigned)*c);
            st_buf_put(b, esc, 6);
        } else {
            st_buf_put(b, (const char *)c, 1);
        }
    }
    st_buf_put(b, "\"", 1);
}

static enum qc_status st_write_all(int fd, const void *p, size_t n, const char *path)
{
    const int err = data_write_all(fd, p, n);
    if (err)
        return qc_errorf(QC_ERR_IO, "%s: write failed: %s%s", path, strerror(err),
                         data_io_hint(err));
    return QC_OK;
}

static enum qc_status st_write_file(int fd, const char *tmp, const struct st_buf *hdr,
                                    const struct qc_st_writer *w, const int64_t *order)
{
    uint8_t len8[8];
    uint64_t hl = hdr->len;
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(hl >> (8 * i));
    QC_TRY(st_write_all(fd, len8, 8, tmp));
    QC_TRY(st_write_all(fd, hdr->p, hdr->len, tmp));
    for (int64_t k = 0; k < w->n; k++) {
        const struct st_wentry *e = &w->e[order[k]];
        if (e->nbytes)
            QC_TRY(st_write_all(fd, e->data, e->nbytes, tmp));
    }
    if (fsync(fd) != 0)
        return qc_errorf(QC_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    return QC_OK;
}

enum qc_status qc_st_writer_write(const struct qc_st_writer *w, const char *path)
{
    /* Layout order: decreasing element size, then insertion order (stable), so every tensor
     * starts aligned to its element size once the header is padded to 8 bytes. */
    int64_t *order = malloc(((size_t)w->n + 1) * sizeof(int64_t));
    if (!order)
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory", path);
    int64_t k = 0;
    for (size_t es = 8; es >= 1; es /= 2)
        for (int64_t i = 0; i < w->n; i++)
            if (st_dtypes[w->e[i].dtype].size == es)
                order[k++] = i;
    QC_ASSERT(k == w->n, "writer layout lost tensors");

    struct st_buf b = {0};
    char num[64];
    st_buf_puts(&b, "{");
    bool first = true;
    if (w->nmeta > 0) {
        st_buf_puts(&b, "\"__metadata__\":{");
        for (int64_t i = 0; i < w->nmeta; i++) {
            if (i)
                st_buf_puts(&b, ",");
            st_buf_json_str(&b, w->mkey[i]);
            st_buf_puts(&b, ":");
            st_buf_json_str(&b, w->mval[i]);
        }
        st_buf_puts(&b, "}");
        first = false;
    }
    size_t off = 0;
    for (int64_t j = 0; j < w->n; j++) {
        const struct st_wentry *e = &w->e[order[j]];
        if (!first)
            st_buf_puts(&b, ",");
        first = false;
        st_buf_json_str(&b, e->name);
        st_buf_puts(&b, ":{\"dtype\":\"");
        st_buf_puts(&b, st_dtypes[e->dtype].name);
        st_buf_puts(&b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof(num), d ? ",%lld" : "%lld", (long long)e->shape[d]);
            st_buf_puts(&b, num);
        }
        snprintf(num, sizeof(num), "],\"data_offsets\":[%zu,%zu]}", off, off + e->nbytes);
        st_buf_puts(&b, num);
        off += e->nbytes;
    }
    st_buf_puts(&b, "}");
    while ((8 + b.len) % 8 != 0)
        st_buf_puts(&b, " ");
    if (b.oom) {
        free(b.p);
        free(order);
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory building the header", path);
    }

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(b.p);
        free(order);
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    /* SIGINT/SIGTERM remove the temporary file until it is renamed or unlinked. */
    int cleanup_slot = fd >= 0 ? qc_cleanup_register(tmp) : -1;
    enum qc_status rc = QC_OK;
    if (fd < 0) {
        const int err = errno;
        rc = qc_errorf(QC_ERR_IO, "%s: cannot create a temporary file %s: %s%s", path, tmp,
                       strerror(err), data_io_hint(err));
    } else {
        (void)fchmod(fd, 0644); /* mkstemp makes 0600; a checkpoint is an ordinary file */
        rc = st_write_file(fd, tmp, &b, w, order);
        if (close(fd) != 0 && rc == QC_OK)
            rc = qc_errorf(QC_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        if (rc == QC_OK && rename(tmp, path) != 0)
            rc = qc_errorf(QC_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
        if (rc != QC_OK)
            unlink(tmp);
    }
    qc_cleanup_unregister(cleanup_slot);
    /* fsync the folder so the rename itself is durable. Best effort: the file is complete and
     * in place, so a failure here does not fail the write. */
    if (rc == QC_OK)
        (void)data_fsync_dir(path);
    free(tmp);
    free(b.p);
    free(order);
    return rc;
}
