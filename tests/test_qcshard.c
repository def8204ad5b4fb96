/*
 * test_qcshard.c — the qcshard container: round trips (tiny and synthetic scenes, empty file),
 * every hand-broken case with its exact error (a test each, from memory and from the checked-in
 * files in tests/data/qcshard_broken/), lazy per-record validation, and the writer's atomicity
 * and error reporting (RLIMIT_FSIZE makes writes fail with EFBIG in a child process), and that a
 * writer killed by SIGINT/SIGTERM leaves no file (a forked child).
 *
 *   test_qcshard                      run the tests
 *   test_qcshard --write-broken DIR   (re)write DIR/<case>.qcshard for every broken case plus
 *                                     valid.qcshard: tests/data/qcshard_broken/ and the fuzz
 *                                     seeds tests/fuzz/corpus_qcshard/ come from this
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qc_qcshard.h"
#include "qc_synth.h"
#include "qcshard_fixtures.h"
#include "testutil.h"

static char tmpdir[256];

static const char *tmp_path(const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof(buf), "%s/%s", tmpdir, name);
    return buf;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* The valid base file every broken case starts from: the tiny scene twice. */
static unsigned char *valid_file(size_t *size)
{
    struct qc_scene s[2];
    fixture_tiny_scene(&s[0]);
    fixture_tiny_scene(&s[1]);
    const char *p = tmp_path("base.qcshard");
    if (qc_qcshard_write_file(p, s, 2) != QC_OK) {
        printf("cannot write base file: %s\n", qc_error_last());
        exit(1);
    }
    qc_scene_free(&s[0]);
    qc_scene_free(&s[1]);
    return fx_read_file(p, size);
}

// ---- the broken cases -----------------------------------------------------------------------

struct broken {
    const char *name;
    void (*mutate)(unsigned char *f, size_t *size);
    int at_scene;       /* -1: opening fails; else opening scene at_scene fails */
    const char *expect; /* exact message after "<file>: " */
};

static void m_truncated(unsigned char *f, size_t *size)
{
    (void)f;
    *size = *size / 2;
}
static void m_short(unsigned char *f, size_t *size)
{
    (void)f;
    *size = 40;
}
static void m_magic(unsigned char *f, size_t *size)
{
    (void)size;
    memcpy(f, "PK\x03\x04", 4);
}
static void m_version(unsigned char *f, size_t *size)
{
    (void)size;
    fx_put32(f + 8, 2);
}
static void m_header_checksum(unsigned char *f, size_t *size)
{
    (void)size;
    f[16] ^= 0x01; /* scene_count 2 -> 3, header not resealed */
}
static void m_record_checksum(unsigned char *f, size_t *size)
{
    (void)size;
    f[fx_array(f, 1, QC_SCENE_POSITION) + 5] ^= 0x40;
}
static void m_index_past_end(unsigned char *f, size_t *size)
{
    (void)size;
    fx_put64(f + fx_entry(f, 1), 1ull << 40);
    fx_reseal(f, -1);
}
static void m_edge_index(unsigned char *f, size_t *size)
{
    (void)size;
    fx_put64(f + fx_array(f, 0, QC_SCENE_PL2PL_EDGE) + 8 * (3 + 1), 912);
    fx_reseal(f, 0);
}
static void m_enum(unsigned char *f, size_t *size)
{
    (void)size;
    f[fx_array(f, 1, QC_SCENE_AGENT_TYPE) + 1] = 10;
    fx_reseal(f, 1);
}
static void m_nan(unsigned char *f, size_t *size)
{
    (void)size;
    const float nan = NAN;
    memcpy(f + fx_array(f, 0, QC_SCENE_POSITION) + 4 * ((1 * QC_SCENE_STEPS + 17) * 3 + 0), &nan,
           4);
    fx_reseal(f, 0);
}
static void m_pt2pl_unsorted(unsigned char *f, size_t *size)
{
    (void)size;
    fx_put64(f + fx_array(f, 0, QC_SCENE_PT2PL) + 8 * (6 + 3), 0); /* polygon 1 -> 0 after 1 */
    fx_reseal(f, 0);
}
static void m_counts(unsigned char *f, size_t *size)
{
    (void)size;
    const uint64_t rec = fx_get64(f + fx_entry(f, 0));
    fx_put64(f + rec + 24, 7); /* Pt 6 -> 7 in the record header only */
    fx_reseal(f, 0);
}
static void m_padding(unsigned char *f, size_t *size)
{
    (void)size;
    f[fx_array(f, 0, QC_SCENE_AGENT_TYPE) + 3] = 0x5a; /* 3 agent types, then padding */
    fx_reseal(f, 0);
}
static void m_av(unsigned char *f, size_t *size)
{
    (void)size;
    const uint64_t rec = fx_get64(f + fx_entry(f, 0));
    fx_put64(f + rec + 40, 1);
    fx_reseal(f, 0);
}
static void m_predict_history(unsigned char *f, size_t *size)
{
    (void)size;
    f[fx_array(f, 0, QC_SCENE_PREDICT_MASK) + QC_SCENE_STEPS + 20] = 1;
    fx_reseal(f, 0);
}

static const struct broken broken_cases[] = {
    {"truncated", m_truncated, -1, "field index_offset: index of 2 entries at byte"},
    {"short", m_short, -1, "file is 40 bytes, shorter than the 64-byte header"},
    {"bad_magic", m_magic, -1, "field magic: value \"\\x50\\x4b\\x03\\x04\\x41\\x52\\x44\\x00\""},
    {"bad_version", m_version, -1,
     "field version: value 2 is not supported (this build reads "
     "version 1)"},
    {"bad_header_checksum", m_header_checksum, -1, "field header_checksum: value 0x"},
    {"bad_checksum", m_record_checksum, 1, "record 1: field checksum: value 0x"},
    {"index_past_end", m_index_past_end, -1, "record 1: field offset: record of"},
    {"edge_index", m_edge_index, 0,
     "record 0: field pl2pl_edge[1][1]: index 912 out of range "
     "[0, 3)"},
    {"bad_enum", m_enum, 1, "record 1: field agent_type[1]: value 10 out of range [0, 9]"},
    {"nan_position", m_nan, 0,
     "record 0: field position[1][17][0]: value nan at a step the masks "
     "mark valid"},
    {"pt2pl_unsorted", m_pt2pl_unsorted, 0,
     "record 0: field pt2pl[1][3]: index 0 after 1: "
     "destinations must be sorted"},
    {"count_mismatch", m_counts, 0,
     "record 0: field num_points: value 7 disagrees with the index "
     "(6)"},
    {"nonzero_padding", m_padding, 0,
     "record 0: field agent_type: padding byte 0 after it is "
     "0x5a, not 0"},
    {"av_index", m_av, 0,
     "record 0: field agent_id[1]: value \"1002\" at av_index, expected "
     "\"AV\""},
    {"predict_history", m_predict_history, 0,
     "record 0: field predict_mask[1][20]: value 1 at a "
     "history step"},
};
#define NUM_BROKEN (sizeof(broken_cases) / sizeof(broken_cases[0]))

/* Opens the broken bytes (from memory, or from path when path != NULL) and checks that the
 * failure happens at the right stage with "<name>: <expect>" at the start of the message. */
static void check_broken(const struct broken *b, const unsigned char *f, size_t size,
                         const char *path)
{
    const char *name = path ? path : "broken.qcshard";
    struct qc_qcshard_reader *r = NULL;
    enum qc_status st = path ? qc_qcshard_reader_create(path, &r)
                             : qc_qcshard_reader_create_memory(f, size, name, &r);
    char want[2048];
    snprintf(want, sizeof(want), "%s: %s", name, b->expect);
    if (b->at_scene < 0) {
        T_EXPECT(st == QC_ERR_INVALID, "%s: open gave %s", b->name, qc_status_str(st));
        T_EXPECT(strncmp(qc_error_last(), want, strlen(want)) == 0,
                 "%s:\n      got  %s\n      want %s...", b->name, qc_error_last(), want);
        qc_qcshard_reader_destroy(r);
        return;
    }
    T_EXPECT(st == QC_OK, "%s: open failed: %s", b->name, qc_error_last());
    if (st != QC_OK)
        return;
    struct qc_scene s;
    /* the other record still opens: validation is per record */
    st = qc_qcshard_reader_scene(r, 1 - b->at_scene, &s);
    T_EXPECT(st == QC_OK, "%s: intact record failed: %s", b->name, qc_error_last());
    st = qc_qcshard_reader_scene(r, b->at_scene, &s);
    T_EXPECT(st == QC_ERR_INVALID, "%s: scene open gave %s", b->name, qc_status_str(st));
    T_EXPECT(strncmp(qc_error_last(), want, strlen(want)) == 0,
             "%s:\n      got  %s\n      want %s...", b->name, qc_error_last(), want);
    /* a failed record stays failed (nothing cached) */
    T_EXPECT(qc_qcshard_reader_scene(r, b->at_scene, &s) == QC_ERR_INVALID, "%s: second open",
             b->name);
    T_EXPECT(qc_qcshard_reader_validate_all(r) == QC_ERR_INVALID, "%s: validate_all", b->name);
    qc_qcshard_reader_destroy(r);
}

static int write_broken(const char *dir)
{
    size_t size;
    unsigned char *base = valid_file(&size);
    char p[1024];
    snprintf(p, sizeof(p), "%s/valid.qcshard", dir);
    if (fx_write_file(p, base, size) != 0)
        return 1;
    for (size_t i = 0; i < NUM_BROKEN; i++) {
        unsigned char *f = malloc(size);
        memcpy(f, base, size);
        size_t n = size;
        broken_cases[i].mutate(f, &n);
        snprintf(p, sizeof(p), "%s/%s.qcshard", dir, broken_cases[i].name);
        if (fx_write_file(p, f, n) != 0)
            return 1;
        free(f);
    }
    free(base);
    /* small seeds (a few KiB): libFuzzer's -max_len keeps them whole, so mutations reach the
     * record-level checks */
    static const int64_t shapes[3][2][2] = {
        {{1, 0}, {0, 0}}, {{2, 3}, {0, 0}}, {{1, 2}, {1, 0}}}; /* {A, P} per record, A 0 = none */
    for (int k = 0; k < 3; k++) {
        struct qc_scene sc[2];
        int n = 0;
        for (int j = 0; j < 2 && shapes[k][j][0] > 0; j++, n++)
            fixture_small_scene(&sc[j], shapes[k][j][0], shapes[k][j][1], 10 * k + j);
        snprintf(p, sizeof(p), "%s/small_%d.qcshard", dir, k);
        const enum qc_status st = qc_qcshard_write_file(p, sc, n);
        for (int j = 0; j < n; j++)
            qc_scene_free(&sc[j]);
        if (st != QC_OK) {
            printf("%s\n", qc_error_last());
            return 1;
        }
    }
    printf("wrote %zu broken files, valid.qcshard and 3 small seeds to %s\n", NUM_BROKEN, dir);
    return 0;
}

// ---- round trips ----------------------------------------------------------------------------

static int scenes_equal(const struct qc_scene *a, const struct qc_scene *b, char *why, size_t n)
{
    if (a->num_agents != b->num_agents || a->num_polygons != b->num_polygons ||
        a->num_points != b->num_points || a->num_pl2pl != b->num_pl2pl ||
        a->av_index != b->av_index) {
        snprintf(why, n, "counts differ");
        return 0;
    }
    if (strcmp(a->scenario_id, b->scenario_id) || strcmp(a->city, b->city)) {
        snprintf(why, n, "strings differ");
        return 0;
    }
    struct qc_scene_layout lay;
    qc_scene_layout_compute(a->num_agents, a->num_polygons, a->num_points, a->num_pl2pl, 0, &lay);
    const void *pa[QC_SCENE_ARRAY_COUNT] = {
        a->valid_mask,         a->predict_mask,   a->agent_type,     a->agent_category,
        a->position,           a->heading,        a->velocity,       a->agent_id,
        a->pl_position,        a->pl_orientation, a->pl_height,      a->pl_type,
        a->pl_is_intersection, a->pt_position,    a->pt_orientation, a->pt_magnitude,
        a->pt_height,          a->pt_type,        a->pt_side,        a->pt2pl,
        a->pl2pl_edge,         a->pl2pl_type};
    const void *pb[QC_SCENE_ARRAY_COUNT] = {
        b->valid_mask,         b->predict_mask,   b->agent_type,     b->agent_category,
        b->position,           b->heading,        b->velocity,       b->agent_id,
        b->pl_position,        b->pl_orientation, b->pl_height,      b->pl_type,
        b->pl_is_intersection, b->pt_position,    b->pt_orientation, b->pt_magnitude,
        b->pt_height,          b->pt_type,        b->pt_side,        b->pt2pl,
        b->pl2pl_edge,         b->pl2pl_type};
    for (int k = 0; k < QC_SCENE_ARRAY_COUNT; k++)
        if (lay.bytes[k] && memcmp(pa[k], pb[k], lay.bytes[k]) != 0) {
            snprintf(why, n, "array %s differs", qc_scene_array_name((enum qc_scene_array)k));
            return 0;
        }
    return 1;
}

static void test_round_trip(void)
{
    struct qc_scene in[4];
    fixture_tiny_scene(&in[0]);
    for (int i = 1; i < 4; i++)
        T_EXPECT(qc_synth_scene(7, i, (enum qc_synth_profile)(i - 1), &in[i]) == QC_OK,
                 "synth %d: %s", i, qc_error_last());
    char p[600];
    snprintf(p, sizeof(p), "%s", tmp_path("rt.qcshard"));
    T_EXPECT(qc_qcshard_write_file(p, in, 4) == QC_OK, "write: %s", qc_error_last());
    T_EXPECT(!file_exists(tmp_path("rt.qcshard.tmp")), "temporary file left behind");
    struct qc_qcshard_reader *r = NULL;
    T_EXPECT(qc_qcshard_reader_create(p, &r) == QC_OK, "open: %s", qc_error_last());
    if (!r)
        return;
    T_EXPECT_EQ_I64(qc_qcshard_reader_count(r), 4, "scenes");
    for (int i = 0; i < 4; i++) {
        struct qc_scene out;
        struct qc_qcshard_entry e;
        T_EXPECT(qc_qcshard_reader_scene(r, i, &out) == QC_OK, "scene %d: %s", i, qc_error_last());
        T_EXPECT(qc_qcshard_reader_entry(r, i, &e) == QC_OK, "entry %d", i);
        char why[128] = "";
        T_EXPECT(scenes_equal(&in[i], &out, why, sizeof(why)), "scene %d: %s", i, why);
        T_EXPECT(out.owned == NULL, "scene %d is a view", i);
        T_EXPECT((uintptr_t)out.position % 8 == 0 && (uintptr_t)out.pt2pl % 8 == 0,
                 "aligned views");
        T_EXPECT_EQ_I64(e.num_agents, in[i].num_agents, "index A");
        T_EXPECT_EQ_I64(e.num_pl2pl, in[i].num_pl2pl, "index Et");
        /* second open: cached validation, same view */
        struct qc_scene again;
        T_EXPECT(qc_qcshard_reader_scene(r, i, &again) == QC_OK && again.position == out.position,
                 "reopen %d", i);
        /* a deep copy owns its data and equals the view */
        struct qc_scene copy;
        T_EXPECT(qc_scene_copy(&out, &copy) == QC_OK && copy.owned, "copy %d", i);
        T_EXPECT(scenes_equal(&copy, &out, why, sizeof(why)), "copy %d: %s", i, why);
        qc_scene_free(&copy);
    }
    struct qc_scene bad;
    T_EXPECT(qc_qcshard_reader_scene(r, 4, &bad) == QC_ERR_INVALID, "scene 4 out of range");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "scene 4 out of range [0, 4)");
    qc_qcshard_reader_destroy(r);
    for (int i = 0; i < 4; i++)
        qc_scene_free(&in[i]);

    /* same scenes, same bytes */
    size_t n1 = 0, n2 = 0;
    unsigned char *b1 = fx_read_file(p, &n1);
    struct qc_scene again[1];
    fixture_tiny_scene(&again[0]);
    T_EXPECT(qc_qcshard_write_file(tmp_path("rt2.qcshard"), again, 1) == QC_OK, "write 2");
    unsigned char *b2 = fx_read_file(tmp_path("rt2.qcshard"), &n2);
    T_EXPECT(b1 && b2 && n1 > n2, "sizes %zu %zu", n1, n2);
    qc_scene_free(&again[0]);
    free(b1);
    free(b2);
}

static void test_empty(void)
{
    const char *p = tmp_path("empty.qcshard");
    T_EXPECT(qc_qcshard_write_file(p, NULL, 0) == QC_OK, "write: %s", qc_error_last());
    size_t n = 0;
    unsigned char *b = fx_read_file(p, &n);
    T_EXPECT_EQ_U64(n, QC_QCSHARD_HEADER_SIZE, "empty file is a bare header");
    free(b);
    struct qc_qcshard_reader *r = NULL;
    T_EXPECT(qc_qcshard_reader_create(p, &r) == QC_OK, "open: %s", qc_error_last());
    T_EXPECT(r && qc_qcshard_reader_count(r) == 0, "no scenes");
    qc_qcshard_reader_destroy(r);
}

// ---- writer ---------------------------------------------------------------------------------

static void test_writer_atomic(void)
{
    const char *p = tmp_path("atomic.qcshard");
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    struct qc_scene s;
    fixture_tiny_scene(&s);
    struct qc_qcshard_writer *w = NULL;
    T_EXPECT(qc_qcshard_writer_create(p, &w) == QC_OK, "create: %s", qc_error_last());
    T_EXPECT(qc_qcshard_writer_append(w, &s) == QC_OK, "append: %s", qc_error_last());
    T_EXPECT(file_exists(tmp) && !file_exists(p), "only the temporary file exists while writing");
    qc_qcshard_writer_destroy(w); /* abandoned: nothing may remain */
    T_EXPECT(!file_exists(tmp) && !file_exists(p), "abandoned writer left files");

    /* an existing file is replaced only on finish */
    T_EXPECT(qc_qcshard_write_file(p, &s, 1) == QC_OK, "first write");
    size_t n0 = 0;
    free(fx_read_file(p, &n0));
    T_EXPECT(qc_qcshard_writer_create(p, &w) == QC_OK, "create 2");
    T_EXPECT(qc_qcshard_writer_append(w, &s) == QC_OK && qc_qcshard_writer_append(w, &s) == QC_OK,
             "append 2");
    size_t n1 = 0;
    free(fx_read_file(p, &n1));
    T_EXPECT_EQ_U64(n1, n0, "old file intact before finish");
    T_EXPECT(qc_qcshard_writer_finish(w) == QC_OK, "finish: %s", qc_error_last());
    T_EXPECT_EQ_I64(qc_qcshard_writer_count(w), 2, "count");
    qc_qcshard_writer_destroy(w);
    free(fx_read_file(p, &n1));
    T_EXPECT(n1 > n0 && !file_exists(tmp), "new file in place (%zu > %zu)", n1, n0);
    qc_scene_free(&s);
}

/* A writer killed by SIGTERM or SIGINT mid-file leaves neither the output nor its .tmp (a forked
 * child holds the writer open; the cleanup handler unlinks and re-raises, so the child still
 * dies of the signal). Runs before this process creates any writer: the handlers are installed
 * by the first registration, which must happen in the child after it resets the signal to
 * SIG_DFL (a background job inherits SIGINT ignored, and an ignored signal gets no handler). */
static void test_writer_signal(int sig)
{
    char p[600], tmp[610];
    snprintf(p, sizeof(p), "%s", tmp_path(sig == SIGINT ? "sigint.qcshard" : "sigterm.qcshard"));
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    int fds[2];
    T_EXPECT(pipe(fds) == 0, "pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        signal(sig, SIG_DFL); /* a background job inherits SIGINT ignored */
        struct qc_scene s;
        fixture_tiny_scene(&s);
        struct qc_qcshard_writer *w = NULL;
        char ok =
            qc_qcshard_writer_create(p, &w) == QC_OK && qc_qcshard_writer_append(w, &s) == QC_OK
                ? 'y'
                : 'n';
        if (write(fds[1], &ok, 1) != 1)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    char ok = 0;
    T_EXPECT(read(fds[0], &ok, 1) == 1 && ok == 'y', "child could not start writing");
    T_EXPECT(file_exists(tmp), "the temporary file exists while the child writes");
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    close(fds[0]);
    T_EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == sig, "child did not die of signal %d", sig);
    T_EXPECT(!file_exists(tmp), "%s left behind after signal %d", tmp, sig);
    T_EXPECT(!file_exists(p), "%s appeared after signal %d", p, sig);
}

/* An output path naming a directory fails at create, before any scene is generated. */
static void test_writer_directory(void)
{
    struct qc_qcshard_writer *w = NULL;
    enum qc_status st = qc_qcshard_writer_create(tmpdir, &w);
    T_EXPECT(st == QC_ERR_IO && w == NULL, "create on a directory: %s", qc_status_str(st));
    T_EXPECT_STR_CONTAINS(qc_error_last(), "Is a directory");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "hint: the output path names a directory");
    char tmp[300];
    snprintf(tmp, sizeof(tmp), "%s.tmp", tmpdir);
    T_EXPECT(!file_exists(tmp), "temporary file created for a directory output");
}

static void test_writer_rejects_invalid(void)
{
    struct qc_scene s;
    fixture_tiny_scene(&s);
    /* tiny scene's block is ours: poke a NaN into a valid step through the layout */
    struct qc_scene_layout lay;
    qc_scene_layout_compute(3, 3, 6, 3, 0, &lay);
    float *pos = (float *)((char *)s.owned + lay.offset[QC_SCENE_POSITION]);
    pos[(1 * QC_SCENE_STEPS + 60) * 3 + 1] = INFINITY;
    const char *p = tmp_path("reject.qcshard");
    struct qc_qcshard_writer *w = NULL;
    T_EXPECT(qc_qcshard_writer_create(p, &w) == QC_OK, "create");
    T_EXPECT(qc_qcshard_writer_append(w, &s) == QC_ERR_INVALID, "invalid scene accepted");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "field position[1][60][1]: value inf");
    T_EXPECT_EQ_I64(qc_qcshard_writer_count(w), 0, "nothing appended");
    qc_qcshard_writer_destroy(w);
    T_EXPECT(!file_exists(p), "no file");
    qc_scene_free(&s);
}

static void test_writer_missing_dir(void)
{
    struct qc_qcshard_writer *w = NULL;
    const char *p = tmp_path("no/such/dir/x.qcshard");
    T_EXPECT(qc_qcshard_writer_create(p, &w) == QC_ERR_IO, "create in a missing directory");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "x.qcshard: cannot create: No such file or directory");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "hint: does the output directory exist?");
    T_EXPECT(w == NULL, "no writer");
}

/* A write that fails half way (file size limit -> EFBIG, like ENOSPC) must report the file and
 * leave nothing behind. Runs in a child so the limit does not leak. */
static void test_writer_write_error(void)
{
    const char *p = tmp_path("limited.qcshard");
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    int fds[2];
    T_EXPECT(pipe(fds) == 0, "pipe");
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {200 * 1024, 200 * 1024};
        setrlimit(RLIMIT_FSIZE, &rl);
        struct qc_scene s[4];
        for (int i = 0; i < 4; i++)
            if (qc_synth_scene(3, i, QC_SYNTH_TYPICAL, &s[i]) != QC_OK)
                _exit(3);
        const enum qc_status st = qc_qcshard_write_file(p, s, 4);
        const char *msg = qc_error_last();
        if (write(fds[1], msg, strlen(msg)) < 0)
            _exit(4);
        _exit(st == QC_ERR_IO ? 0 : 2);
    }
    close(fds[1]);
    char msg[1024] = "";
    ssize_t n = 0, k;
    while ((k = read(fds[0], msg + n, sizeof(msg) - 1 - (size_t)n)) > 0)
        n += k;
    msg[n] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    T_EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d: %s", status, msg);
    /* the name the caller gave first, not its temporary name */
    T_EXPECT_STR_CONTAINS(msg, "limited.qcshard: write failed: File too large");
    T_EXPECT_STR_CONTAINS(msg, "hint: the file size limit was reached");
    T_EXPECT(!file_exists(tmp) && !file_exists(p), "partial file left behind");
}

static void test_checked_in_files(void)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/tests/data/qcshard_broken", QC_SOURCE_DIR);
    char p[1024];
    snprintf(p, sizeof(p), "%s/valid.qcshard", dir);
    struct qc_qcshard_reader *r = NULL;
    T_EXPECT(qc_qcshard_reader_create(p, &r) == QC_OK, "valid.qcshard: %s", qc_error_last());
    T_EXPECT(r && qc_qcshard_reader_validate_all(r) == QC_OK, "valid.qcshard records: %s",
             qc_error_last());
    qc_qcshard_reader_destroy(r);
    for (size_t i = 0; i < NUM_BROKEN; i++) {
        snprintf(p, sizeof(p), "%s/%s.qcshard", dir, broken_cases[i].name);
        T_EXPECT(file_exists(p), "missing %s (regenerate with test_qcshard --write-broken)", p);
        if (file_exists(p))
            check_broken(&broken_cases[i], NULL, 0, p);
    }
}

int main(int argc, char **argv)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_qcshard.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "--write-broken") == 0)
        return write_broken(argv[2]);

    /* First: the children must be the first in this process to register a cleanup path, so
     * that the handlers are installed over their SIG_DFL (see test_writer_signal). */
    QC_TEST ("qcshard: SIGTERM mid-write leaves no file")
        test_writer_signal(SIGTERM);
    QC_TEST ("qcshard: SIGINT mid-write leaves no file")
        test_writer_signal(SIGINT);
    QC_TEST ("qcshard: round trip (tiny + typical + dense + mixed)")
        test_round_trip();
    QC_TEST ("qcshard: empty file")
        test_empty();
    size_t size = 0;
    unsigned char *base = valid_file(&size);
    QC_TEST ("qcshard: base file is valid") {
        struct qc_qcshard_reader *r = NULL;
        T_EXPECT(qc_qcshard_reader_create_memory(base, size, "base", &r) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(r && qc_qcshard_reader_validate_all(r) == QC_OK, "%s", qc_error_last());
        qc_qcshard_reader_destroy(r);
    }
    for (size_t i = 0; i < NUM_BROKEN; i++) {
        char name[128];
        snprintf(name, sizeof(name), "qcshard: broken: %s", broken_cases[i].name);
        QC_TEST (name) {
            unsigned char *f = malloc(size);
            memcpy(f, base, size);
            size_t n = size;
            broken_cases[i].mutate(f, &n);
            check_broken(&broken_cases[i], f, n, NULL);
            free(f);
        }
    }
    free(base);
    QC_TEST ("qcshard: checked-in broken files")
        test_checked_in_files();
    QC_TEST ("qcshard: writer is atomic")
        test_writer_atomic();
    QC_TEST ("qcshard: output path that is a directory fails at once")
        test_writer_directory();
    QC_TEST ("qcshard: writer rejects invalid scenes")
        test_writer_rejects_invalid();
    QC_TEST ("qcshard: writer names a missing directory")
        test_writer_missing_dir();
    QC_TEST ("qcshard: write error reported, nothing left")
        test_writer_write_error();
    QC_TEST ("qcshard: every byte flip is caught or harmless") {
        /* flip every byte of the tiny file in turn: open + validate must fail cleanly (never
         * crash); flips inside records are always caught by a checksum */
        size_t n = 0;
        unsigned char *b = valid_file(&n);
        int missed = 0;
        for (size_t i = 0; i < n; i++) {
            b[i] ^= 0xff;
            struct qc_qcshard_reader *r = NULL;
            enum qc_status st = qc_qcshard_reader_create_memory(b, n, "flip", &r);
            if (st == QC_OK)
                st = qc_qcshard_reader_validate_all(r);
            qc_qcshard_reader_destroy(r);
            missed += st == QC_OK;
            b[i] ^= 0xff;
        }
        T_EXPECT_EQ_I64(missed, 0, "byte flips that went unnoticed");
        free(b);
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", tmpdir);
    return qc_test_summary();
}
