/*
 * fuzz_config.c — libFuzzer target for the preset parser (qc_config_apply_preset_json).
 *
 * Build and run (clang only):
 *   CC=clang cmake -S . -B build-fuzz -DQC_FUZZ=ON -DQC_CUDA=OFF && cmake --build build-fuzz
 *       --target fuzz_config && build-fuzz/fuzz/fuzz_config -runs=20000 tests/fuzz/corpus_config
 *
 * Beyond "no crash, no leak" (ASan), it checks the parser's contract:
 * - a rejected preset leaves the configuration byte-for-byte unchanged, with QC_ERR_INVALID and a
 *   non-empty message;
 * - an accepted one dumps to JSON that, applied as a preset to the defaults, gives the same dump.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static unsigned long long accepted, rejected; /* inputs that reached each branch */

/* At exit: how many inputs were accepted (got through parsing and every key check) and
 * rejected; with QC_FUZZ_REQUIRE_RECORD_CHECKS=1, exit 1 when none was accepted. */
static void report_depth(void)
{
    fprintf(stderr, "fuzz_config: presets accepted: %llu, rejected: %llu\n", accepted, rejected);
    const char *req = getenv("QC_FUZZ_REQUIRE_RECORD_CHECKS");
    if (req && strcmp(req, "1") == 0 && accepted == 0) {
        fprintf(stderr, "fuzz_config: error: no input was accepted\n");
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

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_config: %s\n%s\n", what, detail ? detail : "");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct qc_config cfg, before, again;
    qc_config_defaults(&cfg);
    memcpy(&before, &cfg, sizeof cfg);
    qc_error_clear();
    enum qc_status st = qc_config_apply_preset_json(&cfg, (const char *)data, size, "fuzz.json");
    if (st != QC_OK) {
        rejected++;
        if (st != QC_ERR_INVALID && st != QC_ERR_NOMEM)
            fail("unexpected status", qc_status_str(st));
        if (memcmp(&cfg, &before, sizeof cfg) != 0)
            fail("a rejected preset changed the configuration", qc_error_last());
        if (qc_error_last()[0] == '\0')
            fail("a rejected preset left no message", NULL);
        return 0;
    }
    accepted++;
    (void)qc_config_validate(&cfg);
    char *dump = NULL, *dump2 = NULL;
    if (qc_config_to_json(&cfg, &dump) != QC_OK)
        fail("dump failed", qc_error_last());
    qc_config_defaults(&again);
    if (qc_config_apply_preset_json(&again, dump, strlen(dump), "dump.json") != QC_OK)
        fail("the dump of an accepted preset does not parse back", qc_error_last());
    if (qc_config_to_json(&again, &dump2) != QC_OK)
        fail("dump failed", qc_error_last());
    if (strcmp(dump, dump2) != 0)
        fail("dump -> preset -> dump changed the configuration", dump);
    free(dump);
    free(dump2);
    return 0;
}
