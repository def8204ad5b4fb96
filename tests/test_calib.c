/*
 * test_calib.c — the cost model's calibration of this machine (src/plan/qc_plan_calib.h,
 * src/train/memory/calib.c; src/plan/README.md, "Calibration"):
 *   - the cache round trip: the first get probes and writes the cache, the second reads it
 *     (no probe), with the rates, dates, keys and per-block coefficients unchanged;
 *   - a corrupt cache (not JSON, a truncated file, no calibration record) and a foreign one
 *     (another machine, build or model) are refused, each with its reason, and probed again;
 *   - the prediction with a calibration uses its rates: halving every rate doubles each block's
 *     time and the glue, and differs from the built-in coefficients; a run's measured
 *     coefficients win over the rates;
 *   - `qctrain plan` says which calibration it used and how old it is: probed (then read from
 *     the cache, not probed again), refreshed from a training run after `qctrain train`,
 *     built-in under plan.calibration=builtin and from a --cost file; and its predicted step
 *     follows the cache's rates (a cache with every rate halved predicts twice the step).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "proc_testlib.h"
#include "qc_plan.h"
#include "qc_plan_calib.h"
#include "testutil.h"

static char tmp_root[256], cache_dir[300];
static const char qctrain[] = QC_BINARY_DIR "/qctrain";

static int probes;

static enum qc_status fake_probe(void *user, struct qc_plan_calib *cal)
{
    const double *scale = user;
    probes++;
    cal->gemm_fwd_flops = 2e9 * *scale;
    cal->gemm_bwd_flops = 1.5e9 * *scale;
    cal->mem_bps = 3e9 * *scale;
    cal->copy_bps = 10e9 * *scale;
    return QC_OK;
}

static void key_init(struct qc_plan_calib *k, const char *machine)
{
    memset(k, 0, sizeof *k);
    snprintf(k->machine, sizeof k->machine, "%s", machine);
    snprintf(k->build, sizeof k->build, "test build 1");
    snprintf(k->model, sizeof k->model, "cpu fp32; D 32; test");
    k->hidden_dim = 32;
    k->freq_bands = 8;
    k->nparams = 100000;
}

/* A two-block program: an FE over 1000 rows and an attention over 500 rows, 4000 edges, 500
 * sources; each with a 1 MiB stash. */
static void program(struct qc_plan_program *p)
{
    qc_plan_program_init(p);
    qc_plan_program_block(p, "fe", QC_PLAN_FE);
    qc_plan_program_block(p, "attn", QC_PLAN_ATTN);
    p->blocks[0].rows = 1000;
    p->blocks[1].rows = 500;
    p->blocks[1].edges = 4000;
    p->blocks[1].srcs = 500;
    int32_t sid[2];
    for (int b = 0; b < 2; b++) {
        qc_plan_program_event(p, QC_PLAN_OP_FWD, b, -1, 0, 0, 0);
        sid[b] = qc_plan_program_event(p, QC_PLAN_OP_ALLOC, -1, -1, (uint64_t)1 << 20, 1, 0);
        qc_plan_program_event(p, QC_PLAN_OP_STASH, b, sid[b], 0, 0, 0);
        qc_plan_program_event(p, QC_PLAN_OP_FWD_END, b, -1, 0, 0, 0);
    }
    for (int b = 1; b >= 0; b--) {
        qc_plan_program_event(p, QC_PLAN_OP_BWD, b, -1, 0, 0, 1);
        qc_plan_program_event(p, QC_PLAN_OP_FREE, -1, sid[b], 0, 0, 0);
        qc_plan_program_event(p, QC_PLAN_OP_BWD_END, b, -1, 0, 0, 1);
    }
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        T_FATAL("write %s", path);
    fputs(text, f);
    fclose(f);
}

static void test_cache(void)
{
    QC_TEST ("calibration cache: probed once, then read back whole (rates, dates, keys, "
             "per-block coefficients)") {
        setenv("QC_CACHE_DIR", cache_dir, 1);
        struct qc_plan_calib key;
        key_init(&key, "machine A");
        char path[4200];
        T_EXPECT(qc_plan_calib_path(&key, path, sizeof path) == QC_OK, "%s", qc_error_last());
        T_EXPECT(strncmp(path, cache_dir, strlen(cache_dir)) == 0, "cache %s not under %s", path,
                 cache_dir);
        double scale = 1.0;
        probes = 0;
        struct qc_plan_cost *c1 = NULL, *c2 = NULL;
        bool probed = false;
        T_EXPECT(qc_plan_calib_get(&key, fake_probe, &scale, &c1, &probed) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(probed && probes == 1 && t_exists(path), "probed %d, %d probes", probed, probes);
        T_EXPECT(qc_plan_calib_get(&key, fake_probe, &scale, &c2, &probed) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(!probed && probes == 1, "the cache was not used: %d probes", probes);
        if (c1 && c2) {
            const struct qc_plan_calib *a = qc_plan_cost_calib(c1), *b = qc_plan_cost_calib(c2);
            T_EXPECT(b->source == QC_PLAN_CALIB_PROBE && a->source == QC_PLAN_CALIB_PROBE,
                     "source %d", (int)b->source);
            T_EXPECT(a->gemm_fwd_flops == b->gemm_fwd_flops &&
                         a->gemm_bwd_flops == b->gemm_bwd_flops && a->mem_bps == b->mem_bps &&
                         a->copy_bps == b->copy_bps && a->date == b->date &&
                         a->probe_date == b->probe_date && a->hidden_dim == b->hidden_dim &&
                         a->freq_bands == b->freq_bands && a->nparams == b->nparams,
                     "the record changed through the cache");
            T_EXPECT(strcmp(a->machine, b->machine) == 0 && strcmp(a->build, b->build) == 0 &&
                         strcmp(a->model, b->model) == 0,
                     "keys changed");
            T_EXPECT(b->gemm_fwd_flops == 2e9 && b->date > 0, "rate %g, date %lld",
                     b->gemm_fwd_flops, (long long)b->date);
        }
        /* a run's measured blocks refresh it: source run, the probe's rates kept, the blocks'
         * coefficients read back */
        struct qc_plan_program p;
        program(&p);
        struct qc_plan_cost *run = NULL, *c3 = NULL;
        T_EXPECT(qc_plan_cost_create(&run) == QC_OK, "%s", qc_error_last());
        const struct qc_plan_measure m[2] = {{.t_fwd = 0.01, .t_bwd = 0.02},
                                             {.t_fwd = 0.03, .t_bwd = 0.05}};
        if (run && qc_plan_program_finish(&p) == QC_OK) {
            qc_plan_cost_update(run, &p, m, 0.2, true);
            T_EXPECT(qc_plan_calib_refresh(run, &key) == QC_OK, "%s", qc_error_last());
            T_EXPECT(qc_plan_calib_get(&key, fake_probe, &scale, &c3, &probed) == QC_OK, "%s",
                     qc_error_last());
            T_EXPECT(!probed && probes == 1, "refreshed cache not used");
            if (c3) {
                const struct qc_plan_calib *k3 = qc_plan_cost_calib(c3);
                T_EXPECT(k3->source == QC_PLAN_CALIB_RUN && k3->gemm_fwd_flops == 2e9,
                         "source %d, rate %g", (int)k3->source, k3->gemm_fwd_flops);
                T_EXPECT_NEAR(qc_plan_cost_time(c3, &p, 1, 1), 0.05, 1e-12, 1e-9,
                              "the run's block time");
                T_EXPECT_NEAR(qc_plan_cost_time(c3, &p, 0, 0), 0.01, 1e-12, 1e-9,
                              "the run's block time");
            }
        } else {
            T_EXPECT(false, "program: %s", qc_error_last());
        }
        qc_plan_program_free(&p);
        qc_plan_cost_destroy(run);
        qc_plan_cost_destroy(c1);
        qc_plan_cost_destroy(c2);
        qc_plan_cost_destroy(c3);
    }

    QC_TEST ("calibration cache: corrupt, truncated, foreign (machine, build, model) or "
             "record-less files refused with their reason, then probed again") {
        setenv("QC_CACHE_DIR", cache_dir, 1);
        struct qc_plan_calib key, other;
        key_init(&key, "machine B");
        char path[4200];
        T_EXPECT(qc_plan_calib_path(&key, path, sizeof path) == QC_OK, "%s", qc_error_last());
        double scale = 1.0;
        struct qc_plan_cost *c = NULL;
        bool probed = false;
        /* what each bad file is, and what the refusal must say */
        enum { GARBAGE, TRUNCATED, MACHINE, BUILD, MODEL, NO_RECORD, NCASE };
        static const char *const says[NCASE] = {"not a qctrain plan cost file",
                                                "not a qctrain plan cost file",
                                                "another machine",
                                                "another build",
                                                "another model",
                                                "without a calibration record"};
        for (int k = 0; k < NCASE; k++) {
            unlink(path);
            if (k == GARBAGE) {
                write_text(path, "\x01\x02 not json at all");
            } else if (k == TRUNCATED) {
                probes = 0;
                T_EXPECT(qc_plan_calib_get(&key, fake_probe, &scale, &c, NULL) == QC_OK, "%s",
                         qc_error_last());
                qc_plan_cost_destroy(c);
                c = NULL;
                size_t n = 0;
                char *text = t_read_file(path, &n);
                if (text && n > 40) {
                    text[n / 2] = '\0';
                    write_text(path, text);
                }
                free(text);
            } else if (k == NO_RECORD) {
                struct qc_plan_cost *bare = NULL;
                if (qc_plan_cost_create(&bare) == QC_OK)
                    T_EXPECT(qc_plan_cost_save(bare, path) == QC_OK, "%s", qc_error_last());
                qc_plan_cost_destroy(bare);
            } else { /* a valid calibration of other keys, at this key's path */
                other = key;
                other.source = QC_PLAN_CALIB_PROBE;
                other.date = other.probe_date = 1000;
                other.gemm_fwd_flops = other.gemm_bwd_flops = other.mem_bps = 1e9;
                snprintf(k == MACHINE ? other.machine
                         : k == BUILD ? other.build
                                      : other.model,
                         QC_PLAN_CALIB_KEY_MAX, "somewhere else");
                struct qc_plan_cost *f = NULL;
                if (qc_plan_cost_create(&f) == QC_OK) {
                    qc_plan_cost_set_calib(f, &other);
                    T_EXPECT(qc_plan_cost_save(f, path) == QC_OK, "%s", qc_error_last());
                }
                qc_plan_cost_destroy(f);
            }
            const enum qc_status st = qc_plan_calib_load(path, &key, &c);
            T_EXPECT(st == QC_ERR_INVALID, "case %d: loaded (status %d)", k, (int)st);
            const char *why = qc_error_last();
            T_EXPECT(why && strstr(why, says[k]) && strstr(why, path), "case %d: '%s'", k,
                     why ? why : "");
            if (st == QC_OK)
                qc_plan_cost_destroy(c);
            c = NULL;
            probes = 0;
            T_EXPECT(qc_plan_calib_get(&key, fake_probe, &scale, &c, &probed) == QC_OK, "%s",
                     qc_error_last());
            T_EXPECT(probed && probes == 1, "case %d: not probed again", k);
            qc_plan_cost_destroy(c);
            c = NULL;
            /* the probe replaced the bad file: the next get reads it */
            T_EXPECT(qc_plan_calib_load(path, &key, &c) == QC_OK, "case %d: %s", k,
                     qc_error_last());
            qc_plan_cost_destroy(c);
            c = NULL;
        }
    }
}

static void test_prediction(void)
{
    QC_TEST ("a calibration's rates price the blocks: half the rates, twice the time; not the "
             "built-in coefficients") {
        struct qc_plan_program p;
        program(&p);
        T_EXPECT(qc_plan_program_finish(&p) == QC_OK, "%s", qc_error_last());
        struct qc_plan_calib key;
        key_init(&key, "machine C");
        key.source = QC_PLAN_CALIB_PROBE;
        key.date = key.probe_date = 1000;
        double scale = 1.0;
        struct qc_plan_cost *builtin = NULL, *fast = NULL, *slow = NULL;
        T_EXPECT(qc_plan_cost_create(&builtin) == QC_OK && qc_plan_cost_create(&fast) == QC_OK &&
                     qc_plan_cost_create(&slow) == QC_OK,
                 "%s", qc_error_last());
        T_EXPECT(builtin && qc_plan_cost_calib(builtin)->source == QC_PLAN_CALIB_BUILTIN,
                 "a new cost model is the built-in one");
        if (builtin && fast && slow) {
            fake_probe(&scale, &key);
            qc_plan_cost_set_calib(fast, &key);
            scale = 0.5;
            fake_probe(&scale, &key);
            qc_plan_cost_set_calib(slow, &key);
            for (int32_t b = 0; b < p.nblocks; b++)
                for (int ph = 0; ph < 2; ph++) {
                    const double t0 = qc_plan_cost_time(builtin, &p, b, ph);
                    const double t1 = qc_plan_cost_time(fast, &p, b, ph);
                    const double t2 = qc_plan_cost_time(slow, &p, b, ph);
                    T_EXPECT(t1 > 0 && fabs(t1 - t0) > 1e-3 * t0,
                             "block %d phase %d: %g, as the built-in %g", (int)b, ph, t1, t0);
                    T_EXPECT_NEAR(t2, 2.0 * t1, 0, 1e-12, "block %d phase %d", (int)b, ph);
                }
            /* the plan's step: twice the blocks and twice the optimizer's sweep */
            struct qc_plan_hw hw = {0};
            struct qc_plan_params par;
            qc_plan_params_default(&par);
            par.mode = QC_PLAN_MODE_KEEP;
            struct qc_plan_result r1 = {0}, r2 = {0};
            T_EXPECT(qc_plan_make(&p, fast, &hw, &par, &r1) == QC_OK &&
                         qc_plan_make(&p, slow, &hw, &par, &r2) == QC_OK,
                     "%s", qc_error_last());
            T_EXPECT(r1.step_s > 0, "step %g", r1.step_s);
            T_EXPECT_NEAR(r2.step_s, 2.0 * r1.step_s, 0, 1e-9, "the step");
            qc_plan_result_free(&r1);
            qc_plan_result_free(&r2);
        }
        qc_plan_program_free(&p);
        qc_plan_cost_destroy(builtin);
        qc_plan_cost_destroy(fast);
        qc_plan_cost_destroy(slow);
    }
}

/* Runs qctrain; returns the exit code; *json the output's JSON object (from its first '{'), or
 * NULL; *text the whole output. */
static int cli(const char *const *args, cJSON **json, char **text)
{
    char log[512];
    snprintf(log, sizeof log, "%s/cli.out", tmp_root);
    char *out = NULL;
    const int rc = t_run_output(qctrain, args, log, &out);
    if (json) {
        const char *brace = out ? strchr(out, '{') : NULL;
        *json = brace ? cJSON_Parse(brace) : NULL;
    }
    if (text)
        *text = out;
    else
        free(out);
    return rc;
}

static const cJSON *calib_of(const cJSON *j)
{
    return cJSON_GetObjectItemCaseSensitive(j, "calibration");
}

static const char *str_of(const cJSON *o, const char *key)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static void test_cli(void)
{
    QC_TEST ("qctrain plan says its calibration: probed (then cached), refreshed from a run, "
             "built-in, a --cost file; its step follows the cache's rates") {
        setenv("QC_CACHE_DIR", cache_dir, 1);
        t_rm_rf(cache_dir);
        static const char *const plan[] = {"--preset", "cpu-smoke", "plan", "--max-batch",
                                           "2",        "--json",    NULL};
        cJSON *j = NULL;
        char *text = NULL;
        int rc = cli(plan, &j, NULL);
        T_EXPECT(rc == 0 && j, "plan exit %d", rc);
        const cJSON *cal = calib_of(j);
        T_EXPECT(str_of(cal, "source") && strcmp(str_of(cal, "source"), "probe") == 0, "source %s",
                 str_of(cal, "source") ? str_of(cal, "source") : "(none)");
        T_EXPECT(str_of(cal, "date") && cJSON_IsNumber(cJSON_GetObjectItem(cal, "age_s")) &&
                     cJSON_GetObjectItem(cal, "age_s")->valuedouble >= 0,
                 "date and age");
        char cache[4200] = "";
        if (str_of(cal, "cache"))
            snprintf(cache, sizeof cache, "%s", str_of(cal, "cache"));
        T_EXPECT(strncmp(cache, cache_dir, strlen(cache_dir)) == 0 && t_exists(cache), "cache '%s'",
                 cache);
        const double step1 = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "predicted_step_s"));
        const char *date1 = str_of(cal, "date");
        char d1[64] = "";
        snprintf(d1, sizeof d1, "%s", date1 ? date1 : "");
        cJSON_Delete(j);

        /* the cache is read, not probed again: the same date; halve every rate in it and the
         * predicted step doubles (blocks and the optimizer's sweep) */
        struct qc_plan_cost *c = NULL;
        T_EXPECT(qc_plan_cost_create(&c) == QC_OK && qc_plan_cost_load(c, cache) == QC_OK, "%s",
                 qc_error_last());
        if (c) {
            struct qc_plan_calib k = *qc_plan_cost_calib(c);
            k.gemm_fwd_flops /= 2;
            k.gemm_bwd_flops /= 2;
            k.mem_bps /= 2;
            qc_plan_cost_set_calib(c, &k);
            T_EXPECT(qc_plan_cost_save(c, cache) == QC_OK, "%s", qc_error_last());
        }
        qc_plan_cost_destroy(c);
        rc = cli(plan, &j, NULL);
        cal = calib_of(j);
        T_EXPECT(rc == 0 && str_of(cal, "source") && strcmp(str_of(cal, "source"), "probe") == 0,
                 "exit %d", rc);
        T_EXPECT(str_of(cal, "date") && strcmp(str_of(cal, "date"), d1) == 0,
                 "probed again: %s vs %s", str_of(cal, "date") ? str_of(cal, "date") : "", d1);
        const double step2 = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "predicted_step_s"));
        T_EXPECT_NEAR(step2, 2.0 * step1, 0, 1e-6, "the cache's rates are not used: %g vs %g",
                      step2, step1);
        cJSON_Delete(j);

        /* the text says it, with its age */
        static const char *const plan_text[] = {"--preset",    "cpu-smoke", "plan",
                                                "--max-batch", "2",         NULL};
        rc = cli(plan_text, NULL, &text);
        T_EXPECT(rc == 0 && text && strstr(text, "calibration: probed on this machine at ") &&
                     strstr(text, " ago)"),
                 "text: %s", text ? text : "");
        free(text);

        /* built-in when asked: no date */
        static const char *const builtin[] = {
            "--preset", "cpu-smoke", "--set", "plan.calibration=builtin", "plan", "--max-batch",
            "2",        "--json",    NULL};
        rc = cli(builtin, &j, NULL);
        cal = calib_of(j);
        T_EXPECT(rc == 0 && str_of(cal, "source") &&
                     strcmp(str_of(cal, "source"), "builtin") == 0 &&
                     cJSON_IsNull(cJSON_GetObjectItem(cal, "date")),
                 "builtin: exit %d", rc);
        cJSON_Delete(j);

        /* a training run refreshes it */
        char out_dir[512], set_out[600];
        snprintf(out_dir, sizeof out_dir, "%s/run", tmp_root);
        snprintf(set_out, sizeof set_out, "train.out_dir=%s", out_dir);
        static const char *const small[] = {"model.pl2pl_radius=10", "model.pl2a_radius=10",
                                            "model.a2a_radius=10",   "model.pl2m_radius=10",
                                            "model.a2m_radius=10",   "train.batch_size=1",
                                            "log.report=false",      "log.tensorboard=false"};
        const char *train[40];
        int n = 0;
        train[n++] = "--quiet";
        train[n++] = "--preset";
        train[n++] = "cpu-smoke";
        for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
            train[n++] = "--set";
            train[n++] = small[i];
        }
        train[n++] = "--set";
        train[n++] = set_out;
        train[n++] = "train";
        train[n++] = "--steps";
        train[n++] = "1";
        train[n] = NULL;
        rc = cli(train, NULL, &text);
        T_EXPECT(rc == 0, "train exit %d: %s", rc, text ? text : "");
        free(text);
        /* the same model (the radii and batch do not enter the key) */
        rc = cli(plan, &j, NULL);
        cal = calib_of(j);
        T_EXPECT(rc == 0 && str_of(cal, "source") && strcmp(str_of(cal, "source"), "run") == 0,
                 "after a run: exit %d, source %s", rc,
                 str_of(cal, "source") ? str_of(cal, "source") : "(none)");
        cJSON_Delete(j);

        /* a --cost file: its own */
        char cost_file[600];
        snprintf(cost_file, sizeof cost_file, "%s/plan_cost.json", out_dir);
        const char *with_cost[] = {"--preset", "cpu-smoke", "plan",   "--max-batch", "2",
                                   "--cost",   cost_file,   "--json", NULL};
        rc = cli(with_cost, &j, NULL);
        cal = calib_of(j);
        T_EXPECT(rc == 0 && str_of(cal, "source") && strcmp(str_of(cal, "source"), "file") == 0,
                 "--cost: exit %d", rc);
        cJSON_Delete(j);
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-calib-%d", (int)getpid());
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", tmp_root);
    t_rm_rf(tmp_root);
    mkdir(tmp_root, 0755);
    test_cache();
    test_prediction();
    test_cli();
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
