/*
 * test_memreport.c — the memory report (src/train/memory/qc_memreport.h, docs/MEMORY_REPORT.md):
 *   - the JSON formatter escapes names and parses (cJSON); the text names the top block;
 *     writing into a missing folder fails naming the file;
 *   - a tiny training run (cpu-smoke sizes, 1 scene per group, 2 steps, a checkpoint each
 *     step) writes RUN/memory.json and RUN/memory.txt, and:
 *       allocator.*      == qc_alloc_stats_get_run() of the trainer's allocator, field by field;
 *       peak.bytes_allocated_peak == allocator.bytes_allocated_peak == max of steps[] peaks;
 *       Σ by_tag bytes == Σ by_block bytes == peak.snapshot_bytes_allocated exactly (the
 *         "other" entry included), and snapshot <= peak <= snapshot + snapshot / 100 (the
 *         allocator's 1 % snapshot rule: the breakdown is of a moment within 1 % of the peak);
 *       memory.txt names by_block[0] and the step of the peak; no .tmp file is left.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_testlib.h"
#include "qc_alloc.h"
#include "qc_config.h"
#include "qc_memreport.h"
#include "qc_qcnet.h"
#include "qc_train.h"
#include "testutil.h"

// ---- helpers -----------------------------------------------------------------------------------

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

static cJSON *parse_file(const char *path)
{
    char *s = read_all(path);
    if (!s)
        return NULL;
    cJSON *j = cJSON_Parse(s);
    free(s);
    return j;
}

/* An integer field of obj (exact below 2^53); -1 when missing. */
static double num(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1.0;
}

static uint64_t u64(const cJSON *obj, const char *key)
{
    return (uint64_t)num(obj, key);
}

/* Σ bytes of a breakdown array; also checks the order (largest first, "other" last). */
static uint64_t breakdown_sum(const cJSON *arr, const char *what)
{
    uint64_t sum = 0, prev = UINT64_MAX;
    bool seen_other = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        const uint64_t b = u64(e, "bytes");
        const bool other = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "other"));
        T_EXPECT(!seen_other, "%s: \"other\" is the last entry", what);
        if (!other) {
            T_EXPECT(b <= prev, "%s: largest first (%" PRIu64 " after %" PRIu64 ")", what, b, prev);
            prev = b;
        }
        seen_other = seen_other || other;
        sum += b;
    }
    return sum;
}

// ---- the formatters ----------------------------------------------------------------------------

static void test_format(const char *dir)
{
    QC_TEST ("memreport: JSON escapes names and parses; the text names the top block") {
        struct qc_memreport r = {0};
        r.device = "cpu";
        r.step = 5;
        r.total_steps = 9;
        r.stats.bytes_allocated_peak = 3000;
        r.stats.bytes_reserved_peak = 4096;
        r.stats.bytes_budget = 8192;
        r.stats.fragmentation = 4096.0 / 3000.0;
        r.peak.step = 4;
        r.peak.bytes_allocated = 3000;
        r.peak.bytes_allocated_peak = 3000;
        r.peak.ntop_blocks = 2;
        snprintf(r.peak.blocks[0].name, QC_ALLOC_TAG_MAX, "enc\"odd\\name");
        r.peak.blocks[0].bytes = 2000;
        r.peak.blocks[0].blocks = 3;
        snprintf(r.peak.blocks[1].name, QC_ALLOC_TAG_MAX, "dec");
        r.peak.blocks[1].bytes = 600;
        snprintf(r.peak.block_other.name, QC_ALLOC_TAG_MAX, "other");
        r.peak.block_other.bytes = 400;
        r.peak.n_blocks = 40;
        const struct qc_memreport_step steps[2] = {{4, 3000, 4096}, {5, 2500, 4096}};
        r.steps = steps;
        r.nsteps = 2;
        struct qc_memreport_plan_block pb[2] = {
            {.name = "enc/a\"pp", .policy = "offload_host", .bytes = 1000, .predicted_time_s = 0.5},
            {.name = "dec", .policy = "recompute", .bytes = 24, .predicted_time_s = 0.25},
        };
        const struct qc_memreport_plan plan = {4, 2900, 3000, pb, 2};
        r.plan = &plan;
        const size_t need = qc_memreport_format_json(&r, NULL, 0);
        char *buf = malloc(need + 1);
        T_EXPECT(buf && qc_memreport_format_json(&r, buf, need + 1) == need, "two passes agree");
        cJSON *j = buf ? cJSON_Parse(buf) : NULL;
        T_EXPECT(j != NULL, "parses: %s", buf ? buf : "(null)");
        if (j) {
            const cJSON *peak = cJSON_GetObjectItemCaseSensitive(j, "peak");
            const cJSON *bb = cJSON_GetObjectItemCaseSensitive(peak, "by_block");
            T_EXPECT_EQ_U64((uint64_t)cJSON_GetArraySize(bb), 3, "2 blocks + other");
            const cJSON *n0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(bb, 0), "name");
            T_EXPECT(cJSON_IsString(n0) && strcmp(n0->valuestring, "enc\"odd\\name") == 0,
                     "escaped name round-trips");
            T_EXPECT_EQ_U64(breakdown_sum(bb, "by_block"), 3000, "blocks sum to the snapshot");
            T_EXPECT_EQ_U64(
                (uint64_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "steps")), 2,
                "steps");
            T_EXPECT_EQ_U64(
                (uint64_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(peak, "by_tag")), 0,
                "no tags");
            const cJSON *pl = cJSON_GetObjectItemCaseSensitive(j, "plan");
            T_EXPECT(num(pl, "step") == 4 && num(pl, "predicted_peak_bytes") == 2900 &&
                         num(pl, "measured_peak_bytes") == 3000,
                     "plan figures");
            const cJSON *b0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pl, "blocks"), 0);
            const cJSON *bn = cJSON_GetObjectItemCaseSensitive(b0, "name");
            const cJSON *bp = cJSON_GetObjectItemCaseSensitive(b0, "policy");
            T_EXPECT(cJSON_IsString(bn) && strcmp(bn->valuestring, "enc/a\"pp") == 0 &&
                         cJSON_IsString(bp) && strcmp(bp->valuestring, "offload_host") == 0 &&
                         num(b0, "bytes") == 1000 && num(b0, "predicted_time_s") == 0.5,
                     "plan block round-trips");
        }
        cJSON_Delete(j);
        free(buf);
        char text[4096];
        const size_t tn = qc_memreport_format_text(&r, text, sizeof text);
        T_EXPECT(tn < sizeof text, "text fits");
        T_EXPECT_STR_CONTAINS(text, "enc\"odd\\name");
        T_EXPECT_STR_CONTAINS(text, "at step 4");
        T_EXPECT_STR_CONTAINS(text, "66.7 %"); /* 2000 of 3000 */
        T_EXPECT_STR_CONTAINS(text, "50.0 % of the budget");
        T_EXPECT_STR_CONTAINS(text, "plan of the peak step (step 4)");
        T_EXPECT_STR_CONTAINS(text, "recompute        1 blocks");
        char small[16];
        T_EXPECT(qc_memreport_format_text(&r, small, sizeof small) == tn &&
                     strlen(small) == sizeof small - 1,
                 "truncated, NUL-terminated, full length returned");

        char missing[512];
        snprintf(missing, sizeof missing, "%s/no/such/folder", dir);
        T_EXPECT(qc_memreport_write(missing, &r, NULL, 0) == QC_ERR_IO, "missing folder fails");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "no/such/folder/memory.json");
    }
}

// ---- a tiny training run -----------------------------------------------------------------------

static void tiny_config(struct qc_config *cfg)
{
    t_small_smoke_config(cfg);
    cfg->batch_size = 1;
    cfg->grad_accum = 1;
    cfg->synthetic_scenes = 3;
    cfg->steps = 2;
    cfg->save_every = 1;
    cfg->loader_threads = 1;
    cfg->prefetch_batches = 1;
}

static void test_training(const char *root)
{
    QC_TEST ("memreport: a 2-step run writes memory.json and memory.txt agreeing with the "
             "allocator") {
        struct qc_config cfg;
        tiny_config(&cfg);
        char dir[512];
        snprintf(dir, sizeof dir, "%s/run", root);
        const struct qc_train_opts to = {.cfg = &cfg, .out_dir = dir, .quiet = true};
        struct qc_trainer *t = NULL;
        if (qc_trainer_create(&to, &t) != QC_OK)
            T_FATAL("trainer: %s", qc_error_last());
        if (qc_trainer_run(t) != QC_OK)
            T_FATAL("run: %s", qc_error_last());
        struct qc_alloc_stats as;
        qc_alloc_stats_get_run(qc_trainer_alloc(t), &as);
        struct qc_qcnet_mem mm;
        qc_qcnet_mem_get(qc_trainer_model(t), &mm);

        char path[600];
        snprintf(path, sizeof path, "%s/memory.json", dir);
        cJSON *j = parse_file(path);
        T_EXPECT(j != NULL, "memory.json parses");
        if (!j) {
            qc_trainer_destroy(t);
            return;
        }
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
        T_EXPECT(cJSON_IsString(fmt) && strcmp(fmt->valuestring, "qctrain-memory-report") == 0 &&
                     num(j, "version") == 1,
                 "format and version");
        T_EXPECT(num(j, "step") == 2 && num(j, "total_steps") == 2, "step 2 of 2");
        T_EXPECT_EQ_U64(u64(j, "budget_bytes"), (uint64_t)cfg.device_budget, "budget");
        T_EXPECT_EQ_U64(u64(j, "params_grads_bytes"), mm.bytes_params, "params+grads");
        T_EXPECT(num(j, "peak_rss_bytes") > 0, "peak RSS");

        /* every field of struct qc_alloc_stats, run-wide */
        const cJSON *al = cJSON_GetObjectItemCaseSensitive(j, "allocator");
        const struct {
            const char *key;
            uint64_t want;
        } fields[] = {
            {"bytes_allocated", as.bytes_allocated},
            {"bytes_allocated_peak", as.bytes_allocated_peak},
            {"bytes_requested", as.bytes_requested},
            {"bytes_requested_peak", as.bytes_requested_peak},
            {"bytes_active", as.bytes_active},
            {"bytes_active_peak", as.bytes_active_peak},
            {"bytes_reserved", as.bytes_reserved},
            {"bytes_reserved_peak", as.bytes_reserved_peak},
            {"bytes_reserved_small", as.bytes_reserved_small},
            {"bytes_budget", as.bytes_budget},
            {"bytes_largest_free", as.bytes_largest_free},
            {"n_allocs", as.n_allocs},
            {"n_frees", as.n_frees},
            {"n_live", as.n_live},
            {"n_pending", as.n_pending},
            {"n_segments", as.n_segments},
            {"n_maps", as.n_maps},
            {"n_unmaps", as.n_unmaps},
            {"n_retries", as.n_retries},
            {"n_ooms", as.n_ooms},
            {"step", (uint64_t)as.step},
        };
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            T_EXPECT_EQ_U64(u64(al, fields[i].key), fields[i].want, "allocator.%s", fields[i].key);
        T_EXPECT_NEAR(num(al, "fragmentation"), as.fragmentation, 1e-6, 0, "fragmentation");
        T_EXPECT(as.bytes_allocated_peak > 0 && as.n_allocs > 0, "the run allocated");

        /* the peak and its breakdown */
        const cJSON *pk = cJSON_GetObjectItemCaseSensitive(j, "peak");
        const uint64_t peak = u64(pk, "bytes_allocated_peak");
        const uint64_t snap = u64(pk, "snapshot_bytes_allocated");
        T_EXPECT_EQ_U64(peak, as.bytes_allocated_peak, "peak == the allocator's");
        T_EXPECT(snap <= peak && peak <= snap + snap / 100,
                 "snapshot %" PRIu64 " within 1 %% below the peak %" PRIu64, snap, peak);
        const cJSON *by_tag = cJSON_GetObjectItemCaseSensitive(pk, "by_tag");
        const cJSON *by_block = cJSON_GetObjectItemCaseSensitive(pk, "by_block");
        T_EXPECT(cJSON_GetArraySize(by_tag) > 0 && cJSON_GetArraySize(by_block) > 0,
                 "breakdowns present");
        T_EXPECT_EQ_U64(breakdown_sum(by_tag, "by_tag"), snap, "tags sum to the snapshot");
        T_EXPECT_EQ_U64(breakdown_sum(by_block, "by_block"), snap, "blocks sum to the snapshot");
        const int64_t peak_step = (int64_t)num(pk, "step");
        T_EXPECT(peak_step >= 1 && peak_step <= 2, "peak step %" PRId64, peak_step);

        /* the per-step series */
        const cJSON *steps = cJSON_GetObjectItemCaseSensitive(j, "steps");
        T_EXPECT_EQ_U64((uint64_t)cJSON_GetArraySize(steps), 2, "one entry per step");
        uint64_t max_step_peak = 0;
        int64_t k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, steps)
        {
            T_EXPECT(num(e, "step") == (double)++k, "steps in order");
            const uint64_t sp = u64(e, "bytes_allocated_peak");
            T_EXPECT(u64(e, "bytes_reserved_peak") >= sp, "reserved >= allocated");
            max_step_peak = sp > max_step_peak ? sp : max_step_peak;
        }
        T_EXPECT_EQ_U64(max_step_peak, peak, "the run peak is the largest step peak");

        /* the plan of the peak step (the contract: step, predicted and measured peaks, blocks
         * with name, policy, bytes, predicted_time_s) */
        const cJSON *plan = cJSON_GetObjectItemCaseSensitive(j, "plan");
        T_EXPECT(cJSON_IsObject(plan), "a plan object");
        if (cJSON_IsObject(plan)) {
            const uint64_t pstep = u64(plan, "step");
            T_EXPECT(pstep >= 1 && pstep <= 2, "plan of step %" PRIu64, pstep);
            const uint64_t meas = u64(plan, "measured_peak_bytes");
            const uint64_t pred = u64(plan, "predicted_peak_bytes");
            T_EXPECT(meas > 0 && meas <= as.bytes_active_peak, "measured %" PRIu64, meas);
            /* the planner's stated accuracy, 3 % (docs/MEMORY_REPORT.md) */
            T_EXPECT(pred >= meas - meas * 3 / 100 && pred <= meas + meas * 3 / 100,
                     "predicted %" PRIu64 " within 3 %% of measured %" PRIu64, pred, meas);
            const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(plan, "blocks");
            T_EXPECT(cJSON_GetArraySize(blocks) > 20, "every block application");
            int bad = 0;
            cJSON_ArrayForEach(e, blocks)
            {
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *pol = cJSON_GetObjectItemCaseSensitive(e, "policy");
                bad += !cJSON_IsString(n) || !cJSON_IsString(pol) ||
                       strcmp(pol->valuestring, "keep") != 0 || num(e, "bytes") < 0 ||
                       !(num(e, "predicted_time_s") >= 0);
            }
            T_EXPECT(bad == 0, "%d malformed blocks (an unlimited run keeps everything)", bad);
        }

        /* memory.txt names the top block and the peak's step */
        snprintf(path, sizeof path, "%s/memory.txt", dir);
        char *txt = read_all(path);
        T_EXPECT(txt != NULL, "memory.txt written");
        const cJSON *top =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(by_block, 0), "name");
        if (txt && cJSON_IsString(top)) {
            T_EXPECT_STR_CONTAINS(txt, top->valuestring);
            char at[64];
            snprintf(at, sizeof at, "at step %" PRId64, peak_step);
            T_EXPECT_STR_CONTAINS(txt, at);
            T_EXPECT_STR_CONTAINS(txt, "peak reserved");
            T_EXPECT_STR_CONTAINS(txt, "fragmentation");
            T_EXPECT_STR_CONTAINS(txt, "plan of the peak step");
        }
        free(txt);
        cJSON_Delete(j);

        /* nothing temporary left */
        DIR *d = opendir(dir);
        int ntmp = 0;
        for (struct dirent *de; d && (de = readdir(d));)
            ntmp += strstr(de->d_name, ".tmp") != NULL;
        if (d)
            closedir(d);
        T_EXPECT(ntmp == 0, "%d temporary files left", ntmp);
        qc_trainer_destroy(t);
    }
}

int main(void)
{
    char root[] = "/tmp/qctrain-test-memreport-XXXXXX";
    if (!mkdtemp(root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    test_format(root);
    test_training(root);
    t_rm_rf(root);
    return qc_test_summary();
}
