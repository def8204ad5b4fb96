/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader (src/data/safetensors.c) and
 * what `--init-from` and `--resume` do with a file it accepts: those read untrusted files.
 *
 * Build and run (clang only):
 *   CC=clang cmake -S . -B build-fuzz -DQC_FUZZ=ON -DQC_CUDA=OFF && cmake --build build-fuzz
 *       --target fuzz_safetensors && build-fuzz/fuzz/fuzz_safetensors -max_total_time=60
 *       -max_len=262144 tests/fuzz/corpus_safetensors
 *
 * Each input is a file image. Beyond "no crash, no out-of-bounds access, no leak" (ASan):
 * - rejected (qc_safetensors_open_memory): QC_ERR_INVALID (or NOMEM) with a message naming the
 *   input;
 * - accepted: the reader's contract, checked against the test's own reading of the header (the
 *   8-byte length and the JSON parsed here with cJSON): the tensors are exactly the header's
 *   entries, each found by name as itself, its dtype, shape, element count and byte size
 *   consistent, its data aligned to the element size and equal to the input's bytes at its
 *   data_offsets, the byte sizes summing to the data buffer; every __metadata__ entry readable
 *   with its value; qc_safetensors_get agrees with find and refuses a wrong dtype;
 * - then a round trip through the writer (every tensor and metadata entry to a file of a folder
 *   of its own, under /dev/shm when it exists) and qc_safetensors_open (the mmap path) on it:
 *   the same tensors, bytes and metadata;
 * - --resume: qc_checkpoint_read_state on that folder (the file as the checkpoint's
 *   optim.safetensors: its metadata, the saved configuration's JSON) and the AdamW moments read
 *   as qc_checkpoint_load reads them (qc_qcnet_read_buffer, prefixes exp_avg. / exp_avg_sq.);
 * - --init-from: qc_qcnet_load_st into a tiny CPU model (D 4, one layer each): QC_OK or
 *   QC_ERR_INVALID with a message; on QC_OK every parameter equals the file's tensor (alias keys
 *   excepted: the contract ignores them, and a file whose alias copy differs still loads).
 * The seeds (tests/fuzz/corpus_safetensors/, made by make_corpus_safetensors.py, and the tiny
 * model's state_dict and optimizer file, written by this target when QC_FUZZ_WRITE_SEEDS=<dir>)
 * reach each of these.
 *
 * QC_FUZZ_VERBOSE=1 prints why each rejected input was rejected (to check what a seed hits).
 *
 * Depth: at exit it prints how many inputs were accepted, loaded into the model and read as a
 * checkpoint's state; with QC_FUZZ_REQUIRE_RECORD_CHECKS=1 (ctest's corpus replay and .ci/run)
 * it exits 1 when any of them is 0: the inputs never reached the checks that matter.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "qc_config.h"
#include "qc_qcnet.h"
#include "qc_safetensors.h"
#include "qc_train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char input_name[] = "fuzz.safetensors";
static char dir[256];          /* this process's folder: optim.safetensors */
static char file[512];         /* dir/optim.safetensors */
static struct qc_qcnet *model; /* the tiny model --init-from loads into */
static float *moments;         /* qc_qcnet_num_params floats */
static unsigned long long accepted, rejected, loaded, resumed;
static bool verbose; /* QC_FUZZ_VERBOSE=1: print why each rejected input was */

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_safetensors: %s\n%s\n", what, detail ? detail : "");
    abort();
}

static void report_depth(void)
{
    fprintf(stderr,
            "fuzz_safetensors: files accepted: %llu, rejected: %llu; loaded as the model's "
            "weights (--init-from): %llu; read as a checkpoint's state (--resume): %llu\n",
            accepted, rejected, loaded, resumed);
    if (file[0])
        unlink(file);
    if (dir[0])
        rmdir(dir);
    const char *req = getenv("QC_FUZZ_REQUIRE_RECORD_CHECKS");
    if (req && strcmp(req, "1") == 0 && (accepted == 0 || loaded == 0 || resumed == 0)) {
        fprintf(stderr, "fuzz_safetensors: error: no input reached the %s\n",
                accepted == 0 ? "reader's accepted path"
                : loaded == 0 ? "model load (--init-from)"
                              : "checkpoint state (--resume)");
        _Exit(1);
    }
}

/* The tiny model: every kind of block, a few thousand parameters, so its state_dict is a seed
 * of a few tens of KiB. */
static void tiny_config(struct qc_qcnet_config *c)
{
    qc_qcnet_config_default(c);
    c->hidden_dim = 4;
    c->num_heads = 1;
    c->head_dim = 4;
    c->num_freq_bands = 1;
    c->num_modes = 2;
    c->num_recurrent_steps = 1;
    c->num_map_layers = 1;
    c->num_agent_layers = 1;
    c->num_dec_layers = 1;
    c->dropout = 0.0;
}

// ---- seeds ----------------------------------------------------------------------------------

/* out/ok_init_from.safetensors: the tiny model's state_dict (aliases included), as --init-from
 * reads it; out/ok_resume_optim.safetensors: a checkpoint's optimizer file's metadata as
 * qc_checkpoint_save writes it (format, counters, the configuration's JSON) with one small
 * moment tensor each (the moments' reading is the same key check as --init-from's, which the
 * first seed reaches; the whole moments would double a seed that is already ~100 KiB). */
static void write_seeds(const char *out)
{
    char path[768];
    int64_t n = qc_qcnet_num_params(model);
    for (int64_t i = 0; i < n; i++)
        qc_qcnet_params(model)[i] = 0.25f * (float)(i % 7) - 0.5f;
    struct qc_st_writer *w = NULL;
    if (qc_st_writer_create(&w) != QC_OK || qc_qcnet_add_to_writer(model, w, "", true) != QC_OK ||
        qc_st_writer_set_metadata(w, "format", "pt") != QC_OK)
        fail("seed: model writer", qc_error_last());
    snprintf(path, sizeof path, "%s/ok_init_from.safetensors", out);
    if (qc_st_writer_write(w, path) != QC_OK)
        fail("seed: write", qc_error_last());
    qc_st_writer_destroy(w);

    struct qc_config cfg;
    qc_config_defaults(&cfg);
    char *cj = NULL;
    if (qc_config_to_json(&cfg, &cj) != QC_OK)
        fail("seed: config", qc_error_last());
    static const char *const meta[][2] = {
        {"format", "qctrain-optim v1"},
        {"step", "12"},
        {"adam_step", "12"},
        {"epoch", "1"},
        {"loss_scale_log2", "0"},
        {"loss_scale_good", "0"},
        {"batch_in_epoch", "3"},
        {"samples", "24"},
        {"seed", "1234"},
    };
    const float m[4] = {1e-3f, 2e-3f, 0.0f, -1e-3f}, v[4] = {1e-6f, 4e-6f, 0.0f, 1e-6f};
    const int64_t shape[1] = {4};
    if (qc_st_writer_create(&w) != QC_OK ||
        qc_st_writer_add(w, "exp_avg.decoder.to_pi.weight", QC_ST_F32, 1, shape, m) != QC_OK ||
        qc_st_writer_add(w, "exp_avg_sq.decoder.to_pi.weight", QC_ST_F32, 1, shape, v) != QC_OK ||
        qc_st_writer_set_metadata(w, "config", cj) != QC_OK)
        fail("seed: optim writer", qc_error_last());
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++)
        if (qc_st_writer_set_metadata(w, meta[i][0], meta[i][1]) != QC_OK)
            fail("seed: metadata", qc_error_last());
    snprintf(path, sizeof path, "%s/ok_resume_optim.safetensors", out);
    if (qc_st_writer_write(w, path) != QC_OK)
        fail("seed: write", qc_error_last());
    qc_st_writer_destroy(w);
    free(cj);
    fprintf(stderr, "fuzz_safetensors: seeds written to %s (%lld parameters)\n", out, (long long)n);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    struct qc_qcnet_config c;
    tiny_config(&c);
    if (qc_qcnet_create(&c, &model) != QC_OK)
        fail("tiny model", qc_error_last());
    moments = calloc((size_t)qc_qcnet_num_params(model), sizeof *moments);
    if (!moments)
        fail("out of memory", NULL);
    const char *vb = getenv("QC_FUZZ_VERBOSE");
    verbose = vb && strcmp(vb, "1") == 0;
    const char *seeds = getenv("QC_FUZZ_WRITE_SEEDS");
    if (seeds && seeds[0]) {
        write_seeds(seeds);
        exit(0);
    }
    struct stat sb;
    const char *tmp = getenv("TMPDIR");
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm"
                       : tmp && tmp[0]                                   ? tmp
                                                                         : "/tmp";
    snprintf(dir, sizeof dir, "%s/qc-fuzz-safetensors-%d", base, (int)getpid());
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        fail("mkdir", dir);
    snprintf(file, sizeof file, "%s/optim.safetensors", dir);
    atexit(report_depth);
    return 0;
}

// ---- the reader's contract ------------------------------------------------------------------

/* The tensor of st named like the header's entry e, checked against e and the input. */
static void check_tensor(const struct qc_safetensors *st, const cJSON *e, const uint8_t *buf,
                         size_t data_off, size_t size)
{
    const struct qc_st_tensor *t = qc_safetensors_find(st, e->string);
    if (!t)
        fail("a header entry is not a tensor", e->string);
    if (strcmp(t->name, e->string) != 0)
        fail("find returned another tensor", e->string);
    const char *dt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "dtype"));
    if (!dt || !qc_st_dtype_name(t->dtype) || strcmp(dt, qc_st_dtype_name(t->dtype)) != 0)
        fail("dtype differs from the header's", e->string);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (t->ndim != cJSON_GetArraySize(sh) || t->ndim < 0 || t->ndim > QC_ST_MAX_DIMS)
        fail("ndim differs from the header's", e->string);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        const double v = cJSON_GetArrayItem(sh, d)->valuedouble;
        if ((double)t->shape[d] != v || t->shape[d] < 0)
            fail("shape differs from the header's", e->string);
        numel *= t->shape[d];
    }
    const size_t es = qc_st_dtype_size(t->dtype);
    if (t->numel != numel || t->nbytes != (size_t)numel * es)
        fail("numel or nbytes inconsistent with the shape", e->string);
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    const double b = cJSON_GetArrayItem(off, 0)->valuedouble;
    const double en = cJSON_GetArrayItem(off, 1)->valuedouble;
    if (!(b >= 0 && en - b == (double)t->nbytes && (double)data_off + en <= (double)size))
        fail("data_offsets differ from the tensor or lie outside the input", e->string);
    if (t->nbytes == 0) {
        if (t->data)
            fail("an empty tensor has data", e->string);
        return;
    }
    if (!t->data || (uintptr_t)t->data % es != 0)
        fail("data missing or misaligned", e->string);
    if (memcmp(t->data, buf + data_off + (size_t)b, t->nbytes) != 0)
        fail("data differ from the input's bytes at data_offsets", e->string);
    const struct qc_st_tensor *g = NULL;
    if (qc_safetensors_get(st, t->name, t->dtype, t->ndim, t->shape, &g) != QC_OK || g != t)
        fail("get refuses what find returns", qc_error_last());
    const enum qc_st_dtype other = t->dtype == QC_ST_F32 ? QC_ST_I32 : QC_ST_F32;
    if (qc_safetensors_get(st, t->name, other, t->ndim, t->shape, &g) != QC_ERR_INVALID)
        fail("get accepts a wrong dtype", e->string);
}

/* The header as the test reads it (the reader accepted it, so it is well formed); checks st
 * against it. */
static void check_accepted(const struct qc_safetensors *st, const uint8_t *data, size_t size)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | data[i];
    if (hlen == 0 || hlen > size - 8)
        fail("accepted an impossible header length", NULL);
    cJSON *h = cJSON_ParseWithLength((const char *)data + 8, (size_t)hlen);
    if (!cJSON_IsObject(h))
        fail("accepted a header that is not a JSON object", NULL);
    const size_t data_off = 8 + (size_t)hlen;
    int64_t ntensors = 0;
    size_t bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, h)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            const cJSON *m;
            cJSON_ArrayForEach(m, e)
            {
                const char *v = qc_safetensors_metadata(st, m->string);
                if (!v || !cJSON_IsString(m) || strcmp(v, m->valuestring) != 0)
                    fail("metadata differs from the header's", m->string);
            }
            continue;
        }
        check_tensor(st, e, data, data_off, size);
        bytes += qc_safetensors_find(st, e->string)->nbytes;
        ntensors++;
    }
    cJSON_Delete(h);
    if (ntensors != qc_safetensors_count(st))
        fail("tensor count differs from the header's", NULL);
    if (bytes != size - data_off)
        fail("the tensors do not cover the data buffer exactly", NULL);
    for (int64_t i = 0; i < qc_safetensors_count(st); i++)
        if (qc_safetensors_find(st, qc_safetensors_at(st, i)->name) != qc_safetensors_at(st, i))
            fail("at(i) is not found by its name", qc_safetensors_at(st, i)->name);
}

// ---- round trip through the writer ------------------------------------------------------------

/* Writes every tensor and metadata entry of st (data: its input) to `file`; reopens it with
 * qc_safetensors_open (mmap); the same tensors, bytes and metadata. Returns the reopened file. */
static struct qc_safetensors *round_trip(const struct qc_safetensors *st, const uint8_t *data)
{
    struct qc_st_writer *w = NULL;
    if (qc_st_writer_create(&w) != QC_OK)
        fail("writer", qc_error_last());
    for (int64_t i = 0; i < qc_safetensors_count(st); i++) {
        const struct qc_st_tensor *t = qc_safetensors_at(st, i);
        if (qc_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data) != QC_OK)
            fail("the writer refuses an accepted tensor", qc_error_last());
    }
    /* metadata: the header's keys (the API has no enumeration) */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | data[i];
    cJSON *h = cJSON_ParseWithLength((const char *)data + 8, (size_t)hlen);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__"), *m;
    cJSON_ArrayForEach(m, meta)
    {
        if (qc_st_writer_set_metadata(w, m->string, qc_safetensors_metadata(st, m->string)) !=
            QC_OK)
            fail("the writer refuses accepted metadata", qc_error_last());
    }
    if (qc_st_writer_write(w, file) != QC_OK)
        fail("the writer fails on an accepted file", qc_error_last());
    qc_st_writer_destroy(w);
    struct qc_safetensors *back = NULL;
    if (qc_safetensors_open(file, &back) != QC_OK)
        fail("the written file does not read back", qc_error_last());
    if (qc_safetensors_count(back) != qc_safetensors_count(st))
        fail("round trip: tensor count", NULL);
    for (int64_t i = 0; i < qc_safetensors_count(st); i++) {
        const struct qc_st_tensor *a = qc_safetensors_at(st, i);
        const struct qc_st_tensor *b = qc_safetensors_find(back, a->name);
        if (!b || b->dtype != a->dtype || b->ndim != a->ndim || b->nbytes != a->nbytes ||
            memcmp(b->shape, a->shape, (size_t)a->ndim * sizeof a->shape[0]) != 0 ||
            (a->nbytes && memcmp(a->data, b->data, a->nbytes) != 0))
            fail("round trip: a tensor differs", a->name);
    }
    cJSON_ArrayForEach(m, meta)
    {
        const char *v = qc_safetensors_metadata(back, m->string);
        if (!v || strcmp(v, qc_safetensors_metadata(st, m->string)) != 0)
            fail("round trip: metadata differs", m->string);
    }
    cJSON_Delete(h);
    return back;
}

// ---- --init-from and --resume -----------------------------------------------------------------

static void init_from(const struct qc_safetensors *st)
{
    qc_error_clear();
    const enum qc_status s = qc_qcnet_load_st(model, st, "");
    if (s != QC_OK) {
        if (s != QC_ERR_INVALID || qc_error_last()[0] == '\0')
            fail("--init-from: unexpected status or no message", qc_status_str(s));
        return;
    }
    loaded++;
    const float *p = qc_qcnet_params(model);
    for (int i = 0; i < qc_qcnet_num_keys(model); i++) {
        const struct qc_qcnet_key *k = qc_qcnet_key_at(model, i);
        if (k->alias_of >= 0)
            continue; /* ignored when present (qc_qcnet_load_st's contract): its data may differ */
        const struct qc_st_tensor *t = qc_safetensors_find(st, k->name);
        if (!t || t->dtype != QC_ST_F32 || t->numel != k->numel ||
            memcmp(p + k->offset, t->data, (size_t)k->numel * sizeof(float)) != 0)
            fail("--init-from: a loaded parameter differs from the file", k->name);
    }
}

static void resume(const struct qc_safetensors *back)
{
    struct qc_train_state s;
    struct qc_config cfg;
    qc_error_clear();
    enum qc_status r = qc_checkpoint_read_state(dir, &s, &cfg);
    if (r != QC_OK) {
        if (r != QC_ERR_INVALID || qc_error_last()[0] == '\0')
            fail("--resume: unexpected status or no message", qc_status_str(r));
        return;
    }
    if (s.step < 0 || s.epoch < 0 || !(s.loss_scale >= 1.0) || !isfinite(s.loss_scale))
        fail("--resume: an accepted state out of range", NULL);
    resumed++;
    const char *pre[2] = {"exp_avg.", "exp_avg_sq."};
    for (int k = 0; k < 2; k++) {
        r = qc_qcnet_read_buffer(model, back, pre[k], moments);
        if (r != QC_OK && (r != QC_ERR_INVALID || qc_error_last()[0] == '\0'))
            fail("--resume: moments: unexpected status or no message", qc_status_str(r));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct qc_safetensors *st = NULL;
    qc_error_clear();
    const enum qc_status s = qc_safetensors_open_memory(data, size, input_name, &st);
    if (s != QC_OK) {
        rejected++;
        if (s != QC_ERR_INVALID && s != QC_ERR_NOMEM)
            fail("unexpected status", qc_status_str(s));
        if (!strstr(qc_error_last(), input_name))
            fail("the message does not name the input", qc_error_last());
        if (st)
            fail("out-param written on failure", NULL);
        if (verbose)
            fprintf(stderr, "fuzz_safetensors: rejected: %s\n", qc_error_last());
        return 0;
    }
    accepted++;
    check_accepted(st, data, size);
    struct qc_safetensors *back = round_trip(st, data);
    init_from(st);
    resume(back);
    qc_safetensors_close(back);
    qc_safetensors_close(st);
    return 0;
}
