/*
 * test_safetensors.c — the strict safetensors reader and the atomic writer: round trips, the
 * official parity files, and one hand-broken file per rule the reader enforces.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qc_safetensors.h"
#include "testutil.h"

#define PARITY_DIR QC_TEST_DATA_DIR "/qcnet-parity-tiny"

/* A file image: 8-byte length + header (as given) + data bytes. */
static size_t make_file(unsigned char *buf, const char *header, const void *data, size_t nd)
{
    size_t hl = strlen(header);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (nd)
        memcpy(buf + 8 + hl, data, nd);
    return 8 + hl + nd;
}

/* Expects the image to be rejected with QC_ERR_INVALID and a message containing want. */
static void expect_bad(const char *what, const unsigned char *img, size_t n, const char *want)
{
    struct qc_safetensors *st = NULL;
    enum qc_status rc = qc_safetensors_open_memory(img, n, what, &st);
    T_EXPECT(rc == QC_ERR_INVALID && st == NULL, "%s: status %d", what, (int)rc);
    if (rc == QC_ERR_INVALID && !strstr(qc_error_last(), want))
        T_EXPECT(0, "%s: message '%s' lacks '%s'", what, qc_error_last(), want);
    qc_safetensors_close(st);
}

static void test_round_trip(void)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/test_st_%d.safetensors", QC_BINARY_DIR, (int)getpid());
    float f[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e30f};
    int64_t i8[4] = {-1, 0, INT64_MAX, INT64_MIN};
    uint8_t u[5] = {1, 2, 3, 250, 0};
    uint8_t bo = 1;
    double d = 3.141592653589793;
    struct qc_st_writer *w = NULL;
    T_EXPECT(qc_st_writer_create(&w) == QC_OK, "create");
    /* u8 first: the writer must still align the wider types */
    T_EXPECT(qc_st_writer_add(w, "u", QC_ST_U8, 1, (int64_t[]){5}, u) == QC_OK, "%s",
             qc_error_last());
    T_EXPECT(qc_st_writer_add(w, "a.f", QC_ST_F32, 2, (int64_t[]){2, 3}, f) == QC_OK, "add");
    T_EXPECT(qc_st_writer_add(w, "i", QC_ST_I64, 1, (int64_t[]){4}, i8) == QC_OK, "add");
    T_EXPECT(qc_st_writer_add(w, "flag", QC_ST_BOOL, 0, NULL, &bo) == QC_OK, "add");
    T_EXPECT(qc_st_writer_add(w, "empty", QC_ST_F32, 2, (int64_t[]){0, 3}, NULL) == QC_OK, "add");
    T_EXPECT(qc_st_writer_add(w, "q\"uote\\d", QC_ST_F64, 0, NULL, &d) == QC_OK, "add");
    T_EXPECT(qc_st_writer_add(w, "u", QC_ST_U8, 1, (int64_t[]){5}, u) == QC_ERR_INVALID,
             "duplicate name refused");
    T_EXPECT(qc_st_writer_add(w, "neg", QC_ST_U8, 1, (int64_t[]){-1}, u) == QC_ERR_INVALID,
             "negative extent refused");
    qc_st_writer_set_metadata(w, "format", "pt");
    qc_st_writer_set_metadata(w, "config", "{\"a\": 1}\n");
    qc_st_writer_set_metadata(w, "format", "qctrain");
    enum qc_status rc = qc_st_writer_write(w, path);
    T_EXPECT(rc == QC_OK, "write: %s", qc_error_last());
    char bad[300];
    snprintf(bad, sizeof(bad), "%s/no/such/dir/x.safetensors", QC_BINARY_DIR);
    rc = qc_st_writer_write(w, bad);
    T_EXPECT(rc == QC_ERR_IO, "write into a missing folder fails");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "no/such/dir");
    qc_st_writer_destroy(w);

    struct qc_safetensors *st = NULL;
    rc = qc_safetensors_open(path, &st);
    T_EXPECT(rc == QC_OK, "open: %s", qc_error_last());
    if (rc != QC_OK)
        return;
    T_EXPECT_EQ_I64(qc_safetensors_count(st), 6, "count");
    const struct qc_st_tensor *t = NULL;
    T_EXPECT(qc_safetensors_get(st, "a.f", QC_ST_F32, 2, (int64_t[]){2, 3}, &t) == QC_OK, "%s",
             qc_error_last());
    T_EXPECT(t && memcmp(t->data, f, sizeof(f)) == 0, "f32 bytes");
    T_EXPECT(t && (uintptr_t)t->data % 4 == 0, "f32 aligned");
    t = qc_safetensors_find(st, "i");
    T_EXPECT(t && t->dtype == QC_ST_I64 && memcmp(t->data, i8, sizeof(i8)) == 0, "i64");
    T_EXPECT(t && (uintptr_t)t->data % 8 == 0, "i64 aligned");
    t = qc_safetensors_find(st, "u");
    T_EXPECT(t && t->numel == 5 && memcmp(t->data, u, 5) == 0, "u8");
    t = qc_safetensors_find(st, "flag");
    T_EXPECT(t && t->ndim == 0 && t->numel == 1 && *(const uint8_t *)t->data == 1, "scalar bool");
    t = qc_safetensors_find(st, "empty");
    T_EXPECT(t && t->numel == 0 && t->nbytes == 0 && t->shape[1] == 3, "empty tensor");
    t = qc_safetensors_find(st, "q\"uote\\d");
    T_EXPECT(t && *(const double *)t->data == d, "escaped name, f64");
    const char *m = qc_safetensors_metadata(st, "format");
    T_EXPECT(m && strcmp(m, "qctrain") == 0, "metadata replaced: %s", m ? m : "(null)");
    m = qc_safetensors_metadata(st, "config");
    T_EXPECT(m && strcmp(m, "{\"a\": 1}\n") == 0, "metadata escapes");
    T_EXPECT(qc_safetensors_metadata(st, "nope") == NULL, "absent metadata");
    rc = qc_safetensors_get(st, "a.f", QC_ST_F32, 2, (int64_t[]){3, 2}, &t);
    T_EXPECT(rc == QC_ERR_INVALID, "shape mismatch");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "shape [2, 3], expected [3, 2]");
    rc = qc_safetensors_get(st, "a.f", QC_ST_I32, 2, (int64_t[]){-1, -1}, &t);
    T_EXPECT(rc == QC_ERR_INVALID, "dtype mismatch");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "dtype F32, expected I32");
    rc = qc_safetensors_get(st, "zzz", QC_ST_I32, 0, NULL, &t);
    T_EXPECT_STR_CONTAINS(qc_error_last(), "'zzz' is missing");
    qc_safetensors_close(st);
    /* no temporary file left behind */
    char tmpl[300];
    snprintf(tmpl, sizeof(tmpl), "%s.tmp", path);
    struct stat sb;
    T_EXPECT(stat(tmpl, &sb) != 0, "no plain .tmp left");
    unlink(path);
}

static void test_parity_files(void)
{
    struct qc_safetensors *st = NULL;
    enum qc_status rc = qc_safetensors_open(PARITY_DIR "/weights.safetensors", &st);
    T_EXPECT(rc == QC_OK, "weights: %s", qc_error_last());
    if (rc == QC_OK) {
        T_EXPECT(qc_safetensors_count(st) > 100, "weights hold %lld tensors",
                 (long long)qc_safetensors_count(st));
        T_EXPECT(qc_safetensors_metadata(st, "aliases") != NULL, "aliases metadata");
        for (int64_t i = 0; i < qc_safetensors_count(st); i++) {
            const struct qc_st_tensor *t = qc_safetensors_at(st, i);
            if (t->dtype != QC_ST_F32) {
                T_EXPECT(0, "%s: dtype %s", t->name, qc_st_dtype_name(t->dtype));
                break;
            }
        }
        qc_safetensors_close(st);
    }
    rc = qc_safetensors_open(PARITY_DIR "/batch.safetensors", &st);
    T_EXPECT(rc == QC_OK, "batch: %s", qc_error_last());
    if (rc == QC_OK) {
        const struct qc_st_tensor *t = NULL;
        T_EXPECT(qc_safetensors_get(st, "agent.position", QC_ST_F32, 3, (int64_t[]){80, 110, 3},
                                    &t) == QC_OK,
                 "%s", qc_error_last());
        T_EXPECT(qc_safetensors_get(st, "agent.num_nodes", QC_ST_I64, 0, NULL, &t) == QC_OK &&
                     *(const int64_t *)t->data == 80,
                 "scalar num_nodes");
        qc_safetensors_close(st);
    }
    rc = qc_safetensors_open(PARITY_DIR "/no-such.safetensors", &st);
    T_EXPECT(rc == QC_ERR_IO, "missing file is an I/O error");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "no-such.safetensors");
}

static void test_hostile(void)
{
    static unsigned char img[4096];
    const float f2[2] = {1, 2};
    size_t n;
    const char *ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    n = make_file(img, ok, f2, 8);
    struct qc_safetensors *st = NULL;
    T_EXPECT(qc_safetensors_open_memory(img, n, "ok", &st) == QC_OK, "control case: %s",
             qc_error_last());
    qc_safetensors_close(st);

    expect_bad("short", img, 5, "too short");
    n = make_file(img, ok, f2, 8);
    img[0] = 0xff, img[1] = 0xff; /* header length beyond the file */
    expect_bad("hugelen", img, n, "header length");
    n = make_file(img, ok, f2, 8);
    expect_bad("truncated", img, n - 3, "truncated or trailing");
    n = make_file(img, ok, f2, 8);
    img[n] = 0;
    expect_bad("trailing data", img, n + 1, "truncated or trailing");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}   ", f2,
                  8);
    T_EXPECT(qc_safetensors_open_memory(img, n, "padded", &st) == QC_OK, "space padding: %s",
             qc_error_last());
    qc_safetensors_close(st);
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", f2, 8);
    expect_bad("garbage", img, n, "trailing byte");
    n = make_file(img, "[1,2]", NULL, 0);
    expect_bad("not object", img, n, "does not start with '{'");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", f2, 8);
    expect_bad("bad json", img, n, "not valid JSON");
    n = make_file(img, "{\"x\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", f2, 8);
    expect_bad("dtype", img, n, "unsupported value 'F33'");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", f2, 8);
    expect_bad("size", img, n, "need 12");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", f2, 8);
    expect_bad("negative", img, n, "shape[0]");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.5,8]}}", f2, 8);
    expect_bad("fraction", img, n, "data_offsets");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", f2, 8);
    expect_bad("reversed", img, n, "end 0 < begin 8");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"q\":1}}",
                  f2, 8);
    expect_bad("extra field", img, n, "unexpected or repeated field 'q'");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", f2, 8);
    expect_bad("missing field", img, n, "missing field 'data_offsets'");
    n = make_file(img,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                  f2, 8);
    expect_bad("duplicate", img, n, "appears twice");
    n = make_file(img,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                  f2, 8);
    expect_bad("overlap", img, n, "holes or overlaps");
    n = make_file(img, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", f2, 8);
    expect_bad("hole", img, n, "begins at 4, expected 0");
    n = make_file(img,
                  "{\"__metadata__\":{\"a\":1},"
                  "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                  f2, 8);
    expect_bad("metadata type", img, n, "value is not a string");
    n = make_file(img,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                  "\"data_offsets\":[0,8]}}",
                  f2, 8);
    expect_bad("overflow", img, n, "shape");

    /* a misaligned F32 (after one U8) is served from an aligned copy */
    unsigned char data[5] = {7, 0, 0, 0x80, 0x3f}; /* u8 7, then 1.0f */
    n = make_file(img,
                  "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"f\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}",
                  data, 5);
    enum qc_status rc = qc_safetensors_open_memory(img, n, "misaligned", &st);
    T_EXPECT(rc == QC_OK, "misaligned: %s", qc_error_last());
    if (rc == QC_OK) {
        const struct qc_st_tensor *t = qc_safetensors_find(st, "f");
        T_EXPECT(t && (uintptr_t)t->data % 4 == 0 && *(const float *)t->data == 1.0f,
                 "aligned copy of a misaligned tensor");
        qc_safetensors_close(st);
    }

    /* every truncation of a valid file is refused, never a crash */
    n = make_file(img, ok, f2, 8);
    int refused = 0;
    for (size_t k = 0; k < n; k++) {
        st = NULL;
        if (qc_safetensors_open_memory(img, k, "cut", &st) != QC_OK)
            refused++;
        qc_safetensors_close(st);
    }
    T_EXPECT_EQ_I64(refused, (int64_t)n, "all %zu truncations refused", n);
}

int main(void)
{
    QC_TEST ("safetensors: writer/reader round trip, metadata, alignment, atomic write") {
        test_round_trip();
    }
    QC_TEST ("safetensors: the official parity files open and check") {
        test_parity_files();
    }
    QC_TEST ("safetensors: hostile files are refused with a clear error") {
        test_hostile();
    }
    return qc_test_summary();
}
