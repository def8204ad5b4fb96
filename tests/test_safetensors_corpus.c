/*
 * test_safetensors_corpus.c — the fuzz seeds of the safetensors reader (tests/fuzz/
 * corpus_safetensors/, made by tests/fuzz/make_corpus_safetensors.py and the fuzz target) as
 * regression tests in every build, named for the behaviour: each ok_* file opens (the mmap
 * path, qc_safetensors_open) and every tensor is found by its name; each bad_* file is refused
 * with QC_ERR_INVALID, a message naming the file and the check in the table below. A seed
 * without an entry in the table, or an entry without its seed, fails.
 *
 * And the header the fuzzer's slowness pointed at (src/data/safetensors.c): 100,000 tensors are
 * found by name and a duplicate at the end of them is named. A linear search per entry made
 * such a header quadratic: 9 s of CPU at 100,000 entries, most of an hour at the 100 MB limit.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_safetensors.h"
#include "testutil.h"

#define CORPUS QC_SOURCE_DIR "/tests/fuzz/corpus_safetensors"

/* Each bad_* seed and what its error must say. */
static const struct {
    const char *seed;
    const char *msg;
} refusals[] = {
    {"bad_bytes_overflow", "byte size overflows"},
    {"bad_data_trailing", "tensors cover 1 data bytes but the file holds 2"},
    {"bad_data_truncated", "tensors cover 4 data bytes but the file holds 2"},
    {"bad_dtype_not_string", "field dtype is not a string"},
    {"bad_dtype_unknown", "unsupported value 'F8'"},
    {"bad_entry_extra_field", "unexpected or repeated field 'x'"},
    {"bad_entry_missing_offsets", "missing field 'data_offsets'"},
    {"bad_entry_not_object", "header entry is not a JSON object"},
    {"bad_header_length_past_end", "header length 1000 is impossible"},
    {"bad_header_length_zero", "header length 0 is impossible"},
    {"bad_header_not_json", "header is not valid JSON"},
    {"bad_header_not_object_start", "header does not start with '{'"},
    {"bad_header_nul_byte", "header contains a NUL byte"},
    {"bad_header_trailing_byte", "trailing byte 0x78"},
    {"bad_metadata_key_twice", "__metadata__ key 'k' appears twice"},
    {"bad_metadata_not_object", "__metadata__ is not a JSON object"},
    {"bad_metadata_twice", "__metadata__ appears twice"},
    {"bad_metadata_value_not_string", "value is not a string"},
    {"bad_name_empty", "a tensor has an empty name"},
    {"bad_name_twice", "tensor 'a' appears twice"},
    {"bad_name_twice_after_nul", "tensor 'a' appears twice"},
    {"bad_offsets_hole", "begins at 1, expected 0"},
    {"bad_offsets_not_pair", "is not [begin, end]"},
    {"bad_offsets_overlap", "begins at 1, expected 2"},
    {"bad_offsets_reversed", "end 0 < begin 1"},
    {"bad_offsets_wrong_length", "4 bytes, but dtype F32 and shape need 8"},
    /* 2^53 + 1 reads as the double 2^53: refused, not read as another extent */
    {"bad_shape_2p53_plus_1", "field shape[0] is not a non-negative integer below 2^53"},
    {"bad_shape_fraction", "field shape[0] is not a non-negative integer"},
    {"bad_shape_negative", "field shape[0] is not a non-negative integer"},
    {"bad_shape_nine_dims", "9 dimensions (max 8)"},
    {"bad_shape_not_array", "field shape is not an array"},
    {"bad_shape_overflow", "element count overflows"},
    {"bad_too_short", "too short for a safetensors file"},
};
#define NREFUSALS ((int)(sizeof refusals / sizeof refusals[0]))

static void check_seed(const char *name, bool *seen)
{
    char path[1024], stem[256];
    snprintf(path, sizeof path, "%s/%s", CORPUS, name);
    snprintf(stem, sizeof stem, "%.*s", (int)(strlen(name) - strlen(".safetensors")), name);
    struct qc_safetensors *st = NULL;
    qc_error_clear();
    const enum qc_status s = qc_safetensors_open(path, &st);
    if (strncmp(name, "ok_", 3) == 0) {
        T_EXPECT(s == QC_OK, "%s: %s", name, qc_error_last());
        for (int64_t i = 0; st && i < qc_safetensors_count(st); i++) {
            const struct qc_st_tensor *t = qc_safetensors_at(st, i);
            T_EXPECT(qc_safetensors_find(st, t->name) == t, "%s: tensor %s not found", name,
                     t->name);
        }
        qc_safetensors_close(st);
        return;
    }
    T_EXPECT(strncmp(name, "bad_", 4) == 0, "%s: a seed is named ok_* or bad_*", name);
    int k = 0;
    while (k < NREFUSALS && strcmp(refusals[k].seed, stem) != 0)
        k++;
    T_EXPECT(k < NREFUSALS, "%s has no expected message in the table", name);
    T_EXPECT(s == QC_ERR_INVALID && st == NULL, "%s: status %s", name, qc_status_str(s));
    if (k < NREFUSALS) {
        seen[k] = true;
        T_EXPECT_STR_CONTAINS(qc_error_last(), refusals[k].msg);
    }
    T_EXPECT_STR_CONTAINS(qc_error_last(), path);
    qc_safetensors_close(st);
}

static void test_corpus(void)
{
    QC_TEST ("safetensors corpus: ok_* seeds open, bad_* seeds are refused naming the check") {
        bool seen[NREFUSALS] = {false};
        DIR *d = opendir(CORPUS);
        T_EXPECT(d != NULL, "%s", CORPUS);
        int ok = 0, bad = 0;
        for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
            const size_t n = strlen(e->d_name);
            if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0)
                continue;
            check_seed(e->d_name, seen);
            ok += strncmp(e->d_name, "ok_", 3) == 0;
            bad += strncmp(e->d_name, "bad_", 4) == 0;
        }
        if (d)
            closedir(d);
        for (int k = 0; k < NREFUSALS; k++)
            T_EXPECT(seen[k], "seed %s.safetensors is missing", refusals[k].seed);
        printf("  %d accepted, %d refused\n", ok, bad);
        T_EXPECT(ok >= 10 && bad == NREFUSALS, "%d ok, %d bad", ok, bad);
    }
}

/* A header of n empty U8 tensors "t0000000".."t<n-1>", then (dup) "t0000000" again. */
static char *many_tensors(int64_t n, bool dup, size_t *len)
{
    const size_t per = 64, cap = 8 + 2 + (size_t)(n + 1) * per;
    char *img = malloc(cap);
    if (!img)
        return NULL;
    size_t at = 8;
    img[at++] = '{';
    for (int64_t i = 0; i <= n; i++) {
        if (i == n && !dup)
            break;
        at += (size_t)snprintf(img + at, cap - at,
                               "%s\"t%07lld\":{\"dtype\":\"U8\",\"shape\":[0],"
                               "\"data_offsets\":[0,0]}",
                               i ? "," : "", (long long)(i == n ? 0 : i));
    }
    img[at++] = '}';
    const uint64_t h = at - 8;
    for (int b = 0; b < 8; b++)
        img[b] = (char)(h >> (8 * b));
    *len = at;
    return img;
}

static void test_many(void)
{
    QC_TEST ("safetensors: 100,000 tensors are found by name, and a duplicate after them is "
             "named") {
        const int64_t n = 100000;
        size_t len = 0;
        char *img = many_tensors(n, false, &len);
        struct qc_safetensors *st = NULL;
        T_EXPECT(img && qc_safetensors_open_memory(img, len, "many", &st) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(st && qc_safetensors_count(st) == n, "count");
        int64_t wrong = 0;
        for (int64_t i = 0; st && i < n; i += 7) {
            char name[16];
            snprintf(name, sizeof name, "t%07lld", (long long)i);
            const struct qc_st_tensor *t = qc_safetensors_find(st, name);
            wrong += !t || t != qc_safetensors_at(st, i);
        }
        T_EXPECT(wrong == 0, "%lld names not found as themselves", (long long)wrong);
        T_EXPECT(st && !qc_safetensors_find(st, "t") && !qc_safetensors_find(st, "t10000000") &&
                     !qc_safetensors_metadata(st, "t0000000"),
                 "absent names");
        qc_safetensors_close(st);
        free(img);
        img = many_tensors(n, true, &len);
        st = NULL;
        T_EXPECT(img && qc_safetensors_open_memory(img, len, "many", &st) == QC_ERR_INVALID,
                 "the duplicate accepted");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "tensor 't0000000' appears twice");
        free(img);
    }
}

int main(void)
{
    test_corpus();
    test_many();
    return qc_test_summary();
}
