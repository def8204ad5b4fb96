/*
 * fuzz_qcshard.c — libFuzzer target for the qcshard reader (src/data/qcshard_read.c).
 *
 * Build and run (clang only):
 *   CC=clang cmake -S . -B build-fuzz -DQC_FUZZ=ON -DQC_CUDA=OFF && cmake --build build-fuzz
 *       --target fuzz_qcshard && build-fuzz/fuzz/fuzz_qcshard -runs=20000 tests/fuzz/corpus_qcshard
 *
 * Every input is read twice: as given, and "resealed" (record, index and header checksums
 * recomputed wherever the bytes they cover are in range), because random mutations almost never
 * survive the checksums and the interesting checks sit behind them. Beyond "no crash, no
 * out-of-bounds read" (ASan), it checks the reader's contract: failures are QC_ERR_INVALID with
 * a message that names the input; an accepted scene passes qc_scene_validate and its arrays lie
 * inside the input.
 *
 * Depth: at exit it prints how many records got past the header and index checks into the
 * record-level checks, and how many passed those into the value checks (qc_qcshard_fuzz_counters,
 * counted in fuzz builds only). With QC_FUZZ_REQUIRE_RECORD_CHECKS=1 (ctest's corpus replay and
 * .ci/run) it exits 1 when either is 0: the inputs never reached the checks that matter. Seeds
 * must fit the run's -max_len whole (corpus_qcshard/small_*.qcshard are a few KiB).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "qc_qcshard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static void report_depth(void)
{
    uint64_t opened = 0, validated = 0;
    qc_qcshard_fuzz_counters(&opened, &validated);
    fprintf(stderr,
            "fuzz_qcshard: record-level checks reached: %llu records opened, %llu "
            "validated\n",
            (unsigned long long)opened, (unsigned long long)validated);
    const char *req = getenv("QC_FUZZ_REQUIRE_RECORD_CHECKS");
    if (req && strcmp(req, "1") == 0 && (opened == 0 || validated == 0)) {
        fprintf(stderr, "fuzz_qcshard: error: no input reached the record-level checks "
                        "(seeds longer than -max_len?)\n");
        _Exit(1);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    atexit(report_depth);
    return 0;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_qcshard: %s\n%s\n", what, detail ? detail : "");
    abort();
}

/* Recomputes every checksum whose bytes are in range (the fuzzer's own bounds checks). */
static void reseal(uint8_t *f, size_t size)
{
    if (size < QC_QCSHARD_HEADER_SIZE)
        return;
    const uint64_t n = get64(f + 16), io = get64(f + 24);
    if (n <= 4096 && io <= size && n * QC_QCSHARD_ENTRY_SIZE <= size - io) {
        for (uint64_t i = 0; i < n; i++) {
            uint8_t *e = f + io + i * QC_QCSHARD_ENTRY_SIZE;
            const uint64_t off = get64(e), sz = get64(e + 8);
            if (off <= size && sz <= size - off)
                put64(e + 16, XXH3_64bits(f + off, sz));
        }
        put64(f + 32, XXH3_64bits(f + io, n * QC_QCSHARD_ENTRY_SIZE));
    }
    put64(f + 56, XXH3_64bits(f, 56));
}

static void check(const uint8_t *data, size_t size)
{
    struct qc_qcshard_reader *r = NULL;
    qc_error_clear();
    enum qc_status st = qc_qcshard_reader_create_memory(data, size, "fuzz.qcshard", &r);
    if (st != QC_OK) {
        if (st != QC_ERR_INVALID || strncmp(qc_error_last(), "fuzz.qcshard: ", 14) != 0)
            fail("open failed without a proper message", qc_error_last());
        return;
    }
    const int64_t n = qc_qcshard_reader_count(r);
    for (int64_t i = 0; i < n && i < 64; i++) {
        struct qc_scene s;
        qc_error_clear();
        st = qc_qcshard_reader_scene(r, i, &s);
        if (st != QC_OK) {
            if (st != QC_ERR_INVALID || strncmp(qc_error_last(), "fuzz.qcshard: record ", 21) != 0)
                fail("scene failed without a proper message", qc_error_last());
            continue;
        }
        if (qc_scene_validate(&s, NULL, 0) != QC_OK)
            fail("accepted scene fails validation", qc_error_last());
        struct qc_qcshard_entry e;
        if (qc_qcshard_reader_entry(r, i, &e) != QC_OK || e.offset + e.size > size ||
            s.num_agents != e.num_agents)
            fail("entry disagrees with the scene", NULL);
        /* touch the last byte of the biggest arrays: ASan flags any out-of-bounds view */
        volatile uint8_t sink = s.valid_mask[s.num_agents * QC_SCENE_STEPS - 1];
        if (s.num_pl2pl)
            sink = s.pl2pl_type[s.num_pl2pl - 1];
        if (s.num_points)
            sink = (uint8_t)s.pt2pl[2 * s.num_points - 1];
        (void)sink;
        /* a second open is served from the cache and must give the same view */
        struct qc_scene again;
        if (qc_qcshard_reader_scene(r, i, &again) != QC_OK || again.position != s.position)
            fail("second open differs", NULL);
    }
    qc_qcshard_reader_destroy(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size);
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    reseal(copy, size);
    check(copy, size);
    free(copy);
    return 0;
}
