/*
 * test_tune.c — `qctrain tune` (src/tune, src/cmd_tune.c) on a small QCNet (cpu-smoke with small
 * radii) and generated mixed scenes:
 *   - the tuned preset loads (--config-dump), inherits its base and changes only tuned keys;
 *   - training with it stays under the budget over a mixed epoch, no step failing;
 *   - the search never runs a candidate predicted over the budget (every run is counted and
 *     re-planned by a session of the test's own on the heaviest scenes, which the test finds
 *     itself by planning every scene alone, not on the tuner's heavy tail);
 *   - the choice is a function of the measurements (injected: no timing), the same twice, and
 *     follows them; a measured peak over the budget is never chosen;
 *   - a budget too small for anything: the error names the least budget, which the test pins to
 *     its own figure (every scene planned alone at its smallest peak, the heaviest taken, over
 *     1 - the space's smallest margin) within the planner's stated 5 %, and which does fit;
 *   - --allow-precision: only then does precision vary; a 16-bit plan keeps fewer bytes; the
 *     measurements choose the precision like any other setting;
 *   - --dry-run on rtx3090x8 runs nothing; bad arguments are refused.
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
#include "qc_config.h"
#include "qc_half.h"
#include "qc_plan.h"
#include "qc_train.h"
#include "qc_tune.h"
#include "testutil.h"

#define MIB ((uint64_t)1 << 20)

static char tmp_root[256], base_path[512];
static const char qctrain[] = QC_BINARY_DIR "/qctrain";
static const uint64_t budget = 160 * MIB; /* batch 1 fits (offloading), a dense pair does not */
static const int64_t scenes = 8;          /* the base's data.synthetic_scenes */

/* The base preset: cpu-smoke with small radii, 8 generated mixed scenes, batch 2; the built-in
 * cost coefficients (plan.calibration=builtin): the predictions this test pins do not change
 * with the machine. */
static void write_base(void)
{
    snprintf(base_path, sizeof base_path, "%s/base.json", tmp_root);
    FILE *f = fopen(base_path, "w");
    if (!f)
        T_FATAL("cannot write %s", base_path);
    fprintf(f,
            "{\"description\": \"test base\", \"inherits\": \"cpu-smoke\",\n"
            " \"model.pl2pl_radius\": 30, \"model.pl2a_radius\": 15, \"model.a2a_radius\": 15,\n"
            " \"model.pl2m_radius\": 30, \"model.a2m_radius\": 30, \"model.time_span\": 3,\n"
            " \"model.num_t2m_steps\": 6, \"data.synthetic_scenes\": %d,\n"
            " \"data.synthetic_profile\": \"mixed\", \"data.loader_threads\": 1,\n"
            " \"data.shuffle\": false, \"alloc.trace\": false, \"log.report\": false,\n"
            " \"log.tensorboard\": false, \"train.batch_size\": 2, \"train.grad_accum\": 1,\n"
            " \"plan.calibration\": \"builtin\"}\n",
            (int)scenes);
    fclose(f);
}

static void base_config(struct qc_config *cfg)
{
    qc_config_defaults(cfg);
    if (qc_config_apply_preset(cfg, base_path) != QC_OK)
        T_FATAL("base preset: %s", qc_error_last());
    if (cfg->synthetic_scenes != scenes)
        T_FATAL("base preset: %" PRId64 " scenes", (int64_t)cfg->synthetic_scenes);
}

/* Runs qctrain with args; returns the exit code and the output (malloc'd). */
static int cli(const char *const *args, char **out)
{
    char log[512];
    snprintf(log, sizeof log, "%s/cli.out", tmp_root);
    return t_run_output(qctrain, args, log, out);
}

/* The output's line that starts with '{' (warnings may come before it), parsed. */
static cJSON *json_line(const char *out)
{
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (*l == '{')
            return cJSON_Parse(l);
    return NULL;
}

/* `qctrain --preset P --config-dump` parsed. */
static cJSON *config_dump(const char *preset)
{
    const char *args[] = {"--preset", preset, "--config-dump", NULL};
    char *out = NULL;
    const int rc = cli(args, &out);
    cJSON *j = rc == 0 && out ? cJSON_Parse(out) : NULL;
    T_EXPECT(j != NULL, "--config-dump of %s: exit %d: %s", preset, rc, out ? out : "");
    free(out);
    return j;
}

/* The dumped value of a dotted key (the dump nests by section). */
static const cJSON *dumped(const cJSON *j, const char *key)
{
    char sec[64];
    const char *dot = strchr(key, '.');
    snprintf(sec, sizeof sec, "%.*s", (int)(dot - key), key);
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, sec), dot + 1);
}

static bool tuned_key(const char *k)
{
    static const char *const keys[] = {
        "train.batch_size",        "train.grad_accum",   "train.global_batch",
        "device.budget",           "plan.margin",        "plan.policy",
        "offload.prefetch_window", "model.attention",    "data.loader_threads",
        "offload.queue_depth",     "offload.block_size", "train.cpu_threads"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(k, keys[i]) == 0)
            return true;
    return false;
}

static void test_preset(void)
{
    char out_path[512], budget_s[32];
    snprintf(out_path, sizeof out_path, "%s/tuned.json", tmp_root);
    snprintf(budget_s, sizeof budget_s, "%" PRIu64, budget);
    QC_TEST ("tune writes a preset that loads, inherits its base and changes only tuned keys") {
        const char *args[] = {"--quiet",         "--preset", base_path,       "tune",
                              "--budget",        budget_s,   "--max-runs",    "1",
                              "--measure-steps", "3",        "--tail-scenes", "8",
                              "--out",           out_path,   "--json",        NULL};
        char *out = NULL;
        const int rc = cli(args, &out);
        T_EXPECT(rc == 0, "exit %d: %s", rc, out ? out : "");
        cJSON *j = json_line(out);
        T_EXPECT(j != NULL, "one JSON object: %s", out ? out : "");
        free(out);
        const double runs = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "runs"));
        T_EXPECT(runs >= 1, "at least one candidate measured: %g", runs);
        T_EXPECT(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "chosen_measured")),
                 "chosen by measurement");
        cJSON_Delete(j);
        /* the file: description, inherits the base's path, only tuned keys */
        char *text = t_read_file(out_path, NULL);
        cJSON *p = text ? cJSON_Parse(text) : NULL;
        free(text);
        T_EXPECT(p != NULL, "%s is JSON", out_path);
        const char *inh = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "inherits"));
        char real_base[4096];
        T_EXPECT(inh && realpath(base_path, real_base) && strcmp(inh, real_base) == 0,
                 "inherits %s", inh ? inh : "(none)");
        const char *desc = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "description"));
        T_EXPECT(desc && strstr(desc, "samples/s") && strstr(desc, "budget") &&
                     strstr(desc, "mixed"),
                 "description: %s", desc ? desc : "(none)");
        const cJSON *k;
        cJSON_ArrayForEach(k, p)
        {
            if (strcmp(k->string, "description") == 0 || strcmp(k->string, "inherits") == 0)
                continue;
            T_EXPECT(tuned_key(k->string), "the preset sets %s, not a tuned key", k->string);
        }
        cJSON_Delete(p);
        /* loaded: every key that differs from the base is a tuned one; the budget is set */
        cJSON *dt = config_dump(out_path), *db = config_dump(base_path);
        for (int i = 0; dt && db && i < qc_config_option_count(); i++) {
            const char *key = qc_config_option_at(i)->key;
            const cJSON *a = dumped(dt, key), *b = dumped(db, key);
            T_EXPECT(a && b, "%s dumped", key);
            if (a && b && !cJSON_Compare(a, b, true))
                T_EXPECT(tuned_key(key), "%s differs from the base", key);
        }
        T_EXPECT(dt && cJSON_GetNumberValue(dumped(dt, "device.budget")) == (double)budget,
                 "device.budget");
        T_EXPECT(dt && cJSON_GetNumberValue(dumped(dt, "train.batch_size")) *
                               cJSON_GetNumberValue(dumped(dt, "train.grad_accum")) ==
                           2,
                 "the base's global batch of 2");
        cJSON_Delete(dt);
        cJSON_Delete(db);
    }

    QC_TEST ("training with the tuned preset stays under the budget over a mixed epoch, no step "
             "failing") {
        struct qc_config cfg;
        qc_config_defaults(&cfg);
        if (qc_config_apply_preset(&cfg, out_path) != QC_OK) {
            T_EXPECT(false, "tuned preset: %s", qc_error_last());
            continue;
        }
        cfg.steps = 0;
        cfg.epochs = 1;
        cfg.synthetic_profile = QC_SCENE_MIXED;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/run", tmp_root);
        const struct qc_train_opts to = {.cfg = &cfg, .out_dir = dir, .quiet = true};
        struct qc_trainer *t = NULL;
        T_EXPECT(qc_trainer_create(&to, &t) == QC_OK, "%s", qc_error_last());
        const int64_t total = t ? qc_trainer_total_steps(t) : 0;
        T_EXPECT(total * cfg.batch_size * cfg.grad_accum >= 8, "an epoch of 8 scenes: %" PRId64,
                 total);
        uint64_t peak = 0;
        for (int64_t s = 0; t && s < total; s++) {
            struct qc_step_metrics m = {0};
            const enum qc_status st = qc_trainer_step(t, &m);
            T_EXPECT(st == QC_OK, "step %" PRId64 ": %s", s + 1, qc_error_last());
            if (st != QC_OK)
                break;
            T_EXPECT(m.peak_device_bytes <= budget, "step %" PRId64 ": peak %" PRIu64, s + 1,
                     m.peak_device_bytes);
            peak = m.peak_device_bytes > peak ? m.peak_device_bytes : peak;
        }
        printf("  %" PRId64 " steps, peak %" PRIu64 " of %" PRIu64 "\n", total, peak, budget);
        qc_trainer_destroy(t);
        t_rm_rf(dir);
    }
}

// ---- injected measurements ----------------------------------------------------------------

struct fake {
    int64_t calls;
    struct qc_tune_settings ran[64];
    int favour; /* 0: larger micro-batches are faster; 1: smaller ones; 2: as 0, bf16 2x faster;
                   3: as 0, bf16 and fp16 2x slower (as on a CPU) */
    const struct qc_tune_settings *over; /* these settings measure over the budget */
    double noise; /* the step times' spread: fastest step_s (1 - noise), slowest (1 + noise) */
    /* the progress callback's calls: done and total, and the measurements made by then */
    int64_t nprog, prog_done[256], prog_total[256], prog_calls[256];
};

static void fake_progress(void *user, const char *what, int64_t done, int64_t total)
{
    (void)what;
    struct fake *f = user;
    if (f->nprog < 256) {
        f->prog_done[f->nprog] = done;
        f->prog_total[f->nprog] = total;
        f->prog_calls[f->nprog] = f->calls;
    }
    f->nprog++;
}

/* step time a pure function of the settings: no clock */
static enum qc_status fake_measure(void *user, const struct qc_config *cfg, const char *const *data,
                                   int ndata, const char *cost_path, bool *cost_written,
                                   struct qc_tune_measure *out)
{
    (void)data;
    (void)ndata;
    (void)cost_path;
    struct fake *f = user;
    struct qc_tune_settings s;
    qc_tune_settings_of(cfg, &s);
    if (f->calls < 64)
        f->ran[f->calls] = s;
    f->calls++;
    memset(out, 0, sizeof *out);
    /* a micro-batch of b scenes costs 1/b (favour 0: the step, grad_accum x 1/b, falls with b)
     * or b^2 (favour 1: the step, grad_accum x b^2 = global x b, grows with b). b alone would
     * tie every split of the global batch and leave the choice to the loader-thread and
     * attention terms below, which the search measures in an order set by this machine's
     * measured copy bandwidths */
    const double b = (double)s.batch_size;
    const double micro = f->favour == 1 ? b * b : 1.0 / b;
    out->step_s = (double)s.grad_accum * micro + 0.01 * (double)s.loader_threads +
                  (s.attention == QC_ATTENTION_UNFUSED ? 0.001 : 0.0);
    if (f->favour == 2 && s.precision == QC_PREC_BF16)
        out->step_s *= 0.5;
    if (f->favour == 3 && s.precision != QC_PREC_FP32)
        out->step_s *= 2.0;
    out->step_s_min = out->step_s * (1.0 - f->noise);
    out->step_s_max = out->step_s * (1.0 + f->noise);
    out->steps = 3;
    out->peak_bytes = f->over && memcmp(f->over, &s, sizeof s) == 0 ? budget + 1 : budget / 2;
    *cost_written = false;
    return QC_OK;
}

static enum qc_status run_fake_prec(struct fake *f, uint64_t b, bool dry, bool allow_precision,
                                    struct qc_tune_result *r)
{
    struct qc_config cfg;
    base_config(&cfg);
    struct qc_tune_opts o;
    qc_tune_opts_init(&o);
    o.cfg = &cfg;
    o.budget = b;
    o.global_batch = 4;
    o.dry_run = dry;
    o.allow_precision = allow_precision;
    o.tail_scenes = scenes; /* every scene weighed: the test's own heaviest is among them */
    o.max_measured = 3;
    o.measure = fake_measure;
    o.measure_user = f;
    o.progress = fake_progress;
    o.progress_user = f;
    o.scratch = tmp_root;
    return qc_tune_run(&o, r);
}

static enum qc_status run_fake(struct fake *f, uint64_t b, bool dry, struct qc_tune_result *r)
{
    return run_fake_prec(f, b, dry, false, r);
}

/* s is a point of the search space, not a measured-only variant (loader threads, NVMe queue
 * depth or block size changed from the base's). */
static bool is_space_point(const struct qc_tune_settings *s, const struct qc_config *base)
{
    return s->loader_threads == base->loader_threads && s->cpu_threads == base->cpu_threads &&
           s->queue_depth == base->offload_queue_depth && s->block_size == base->offload_block_size;
}

/* The candidate of r with c's settings but precision q; -1 when none. */
static int64_t same_but_precision(const struct qc_tune_result *r, const struct qc_tune_candidate *c,
                                  int q)
{
    struct qc_tune_settings s = c->set;
    s.precision = q;
    for (int64_t i = 0; i < r->ncand; i++)
        if (memcmp(&r->cand[i].set, &s, sizeof s) == 0)
            return i;
    return -1;
}

// ---- the test's own heavy tail ------------------------------------------------------------

struct weight {
    int64_t scene;
    uint64_t bytes;
};

static int heaviest_first(const void *a, const void *b)
{
    const struct weight *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return (x->scene > y->scene) - (x->scene < y->scene);
}

/* Every scene of pl (the base's generated scenes) planned alone under par; w[i] = {scene, its
 * planned peak}, heaviest first. */
static bool weigh_scenes(struct qc_train_planner *pl, const struct qc_plan_params *par,
                         struct weight *w)
{
    for (int64_t i = 0; i < scenes; i++) {
        struct qc_plan_result r = {0};
        w[i].scene = i;
        if (qc_train_planner_plan_scenes(pl, &i, 1, NULL, par, &r, NULL) != QC_OK) {
            T_EXPECT(false, "scene %" PRId64 " alone: %s", i, qc_error_last());
            return false;
        }
        w[i].bytes = r.peak;
        qc_plan_result_free(&r);
    }
    qsort(w, (size_t)scenes, sizeof *w, heaviest_first);
    return true;
}

/* The least budget as the test works it out, without the tuner: for each attention
 * implementation, every scene planned alone under a 1-byte budget (the planner's smallest peak
 * for it) and the heaviest taken; the smaller of the two, over 1 - 2 % (the space's smallest
 * margin). *scene: the heaviest scene of that implementation, *attention: the implementation. */
static double least_budget_figure(const struct qc_config *base, int64_t *scene, int *attention)
{
    double best = 0;
    for (int a = 0; a < 2; a++) {
        struct qc_config c = *base;
        c.attention = (enum qc_attention_impl)a;
        struct qc_train_planner *pl = NULL;
        if (qc_train_planner_create(&c, NULL, 0, NULL, &pl) != QC_OK) {
            T_EXPECT(false, "planner: %s", qc_error_last());
            return 0;
        }
        struct qc_plan_params par;
        qc_train_plan_params(&c, &par);
        par.mode = QC_PLAN_MODE_AUTO;
        par.margin = 0.02;
        par.budget = 1;
        struct weight w[64];
        const bool ok = weigh_scenes(pl, &par, w);
        qc_train_planner_destroy(pl);
        if (!ok)
            return 0;
        const double need = (double)w[0].bytes / (1.0 - par.margin);
        printf("  %s attention: heaviest scene %" PRId64 " needs %.2f MiB (lightest, scene %" PRId64
               ": %.2f MiB)\n",
               a == QC_ATTENTION_UNFUSED ? "unfused" : "fused", w[0].scene, need / (double)MIB,
               w[scenes - 1].scene, (double)w[scenes - 1].bytes / (1.0 - par.margin) / (double)MIB);
        if (best == 0 || need < best) {
            best = need;
            *scene = w[0].scene;
            *attention = a;
        }
    }
    return best;
}

static void test_search(void)
{
    QC_TEST ("the search never runs a candidate predicted over the budget") {
        struct fake f = {0};
        struct qc_tune_result r;
        T_EXPECT(run_fake(&f, budget, false, &r) == QC_OK, "%s", qc_error_last());
        int64_t pruned = 0;
        for (int64_t i = 0; i < r.ncand; i++)
            pruned += r.cand[i].state == QC_TUNE_PRUNED;
        printf("  %" PRId64 " candidates, %" PRId64 " pruned, %" PRId64 " run\n", r.ncand, pruned,
               f.calls);
        T_EXPECT(pruned > 0 && r.fitting > 0, "the budget prunes some: %" PRId64, pruned);
        T_EXPECT(f.calls == r.runs && f.calls >= 3, "runs counted: %" PRId64 " vs %" PRId64,
                 f.calls, r.runs);
        /* every run: a fresh session of the test's weighs every scene alone (kept whole, the
         * run's attention and precision) and plans the run on the batch_size heaviest under
         * the budget: it fits */
        struct qc_config cfg;
        base_config(&cfg);
        for (int64_t k = 0; k < f.calls && k < 64; k++) {
            struct qc_config c = cfg;
            qc_tune_settings_apply(&f.ran[k], &c);
            c.device_budget = budget;
            struct qc_train_planner *pl = NULL;
            T_EXPECT(qc_train_planner_create(&c, NULL, 0, NULL, &pl) == QC_OK, "%s",
                     qc_error_last());
            struct qc_plan_params keep;
            qc_train_plan_params(&c, &keep);
            keep.mode = QC_PLAN_MODE_KEEP;
            keep.budget = 0;
            struct weight w[64];
            int64_t heavy[64];
            const bool weighed = pl && weigh_scenes(pl, &keep, w);
            for (int64_t i = 0; i < scenes; i++)
                heavy[i] = w[i].scene;
            T_EXPECT(c.batch_size <= scenes, "batch %" PRId64, c.batch_size);
            struct qc_plan_result pr = {0};
            T_EXPECT(weighed && c.batch_size <= scenes &&
                         qc_train_planner_plan_scenes(pl, heavy, c.batch_size, NULL, NULL, &pr,
                                                      NULL) == QC_OK,
                     "%s", qc_error_last());
            T_EXPECT(pr.fits && pr.peak <= budget,
                     "run %" PRId64 " (batch %" PRId64 ", %s): heavy-tail peak %" PRIu64, k + 1,
                     c.batch_size, c.attention ? "unfused" : "fused", pr.peak);
            bool found = false;
            for (int64_t i = 0; i < r.ncand && !found; i++)
                found = memcmp(&r.cand[i].set, &f.ran[k], sizeof f.ran[k]) == 0 &&
                        r.cand[i].state == QC_TUNE_MEASURED;
            T_EXPECT(found, "run %" PRId64 " is a measured candidate", k + 1);
            qc_plan_result_free(&pr);
            qc_train_planner_destroy(pl);
        }
        qc_tune_result_free(&r);
    }

    QC_TEST ("the progress bar counts candidates measured, of those the search means to "
             "measure") {
        struct fake f = {0};
        struct qc_tune_result r;
        T_EXPECT(run_fake(&f, budget, false, &r) == QC_OK, "%s", qc_error_last());
        T_EXPECT(f.nprog > f.calls && f.nprog <= 256,
                 "%" PRId64 " progress calls, %" PRId64 " measured", f.nprog, f.calls);
        bool counts = true;
        for (int64_t i = 0; i < f.nprog && i < 256; i++) {
            /* done = the candidates measured when it is called (never seconds), total >= done
             * and never shrinking below it */
            counts &= f.prog_done[i] == f.prog_calls[i] && f.prog_total[i] >= f.prog_done[i] &&
                      (i == 0 || f.prog_done[i] >= f.prog_done[i - 1]);
            if (!counts)
                printf("  call %" PRId64 ": done %" PRId64 " of %" PRId64 ", %" PRId64
                       " measured by then\n",
                       i, f.prog_done[i], f.prog_total[i], f.prog_calls[i]);
        }
        T_EXPECT(counts, "the progress counts measured candidates");
        T_EXPECT(f.prog_total[f.nprog - 1] >= r.runs && r.runs == f.calls,
                 "the last total %" PRId64 " covers the %" PRId64 " runs",
                 f.prog_total[f.nprog - 1], r.runs);
        qc_tune_result_free(&r);
    }

    QC_TEST ("the choice is a function of the measurements: the same twice, following them") {
        struct fake f1 = {0}, f2 = {0}, f3 = {.favour = 1};
        struct qc_tune_result r1, r2, r3;
        T_EXPECT(run_fake(&f1, budget, false, &r1) == QC_OK, "%s", qc_error_last());
        T_EXPECT(run_fake(&f2, budget, false, &r2) == QC_OK, "%s", qc_error_last());
        T_EXPECT(r1.best >= 0 && r1.best == r2.best && r1.best_measured,
                 "the same choice: %" PRId64 " and %" PRId64, r1.best, r2.best);
        T_EXPECT(f1.calls == f2.calls &&
                     memcmp(f1.ran, f2.ran,
                            (size_t)(f1.calls < 64 ? f1.calls : 64) * sizeof f1.ran[0]) == 0,
                 "the same runs in the same order");
        /* the fastest measured is chosen, whatever the prediction said */
        double fastest = 0;
        for (int64_t i = 0; i < r1.ncand; i++)
            if (r1.cand[i].state == QC_TUNE_MEASURED && r1.cand[i].measured_sps > fastest)
                fastest = r1.cand[i].measured_sps;
        T_EXPECT(r1.best >= 0 && r1.cand[r1.best].measured_sps == fastest, "the fastest measured");
        /* the compute threads are tried on the fastest: 1 thread, besides every core (0) */
        bool ran_one_thread = false;
        for (int64_t k = 0; k < f1.calls && k < 64; k++)
            ran_one_thread |= f1.ran[k].cpu_threads == 1;
        T_EXPECT(ran_one_thread || sysconf(_SC_NPROCESSORS_ONLN) < 2,
                 "a run with train.cpu_threads=1");
        /* measurements favouring small micro-batches move the choice there */
        T_EXPECT(run_fake(&f3, budget, false, &r3) == QC_OK, "%s", qc_error_last());
        int64_t smallest = INT64_MAX;
        for (int64_t i = 0; i < r3.ncand; i++)
            if (r3.cand[i].state == QC_TUNE_MEASURED && r3.cand[i].set.batch_size < smallest)
                smallest = r3.cand[i].set.batch_size;
        T_EXPECT(r3.best >= 0 && r3.cand[r3.best].set.batch_size == smallest,
                 "favouring small batches: chose %" PRId64 ", smallest measured %" PRId64,
                 r3.best >= 0 ? r3.cand[r3.best].set.batch_size : -1, smallest);
        /* a measured peak over the budget is never chosen */
        struct fake f4 = {.favour = 1, .over = r3.best >= 0 ? &r3.cand[r3.best].set : NULL};
        struct qc_tune_result r4;
        T_EXPECT(run_fake(&f4, budget, false, &r4) == QC_OK, "%s", qc_error_last());
        T_EXPECT(r4.best >= 0 && f4.over &&
                     memcmp(&r4.cand[r4.best].set, f4.over, sizeof *f4.over) != 0,
                 "over the budget when measured: not chosen");
        qc_tune_result_free(&r1);
        qc_tune_result_free(&r2);
        qc_tune_result_free(&r3);
        qc_tune_result_free(&r4);
    }

    QC_TEST ("a winner within the measurement noise is named as such") {
        struct fake quiet = {0}, noisy = {.noise = 0.9};
        struct qc_tune_result r1, r2;
        T_EXPECT(run_fake(&quiet, budget, false, &r1) == QC_OK, "%s", qc_error_last());
        T_EXPECT(run_fake(&noisy, budget, false, &r2) == QC_OK, "%s", qc_error_last());
        /* without noise, a tie is only an equal speed (the compute-thread variants of the fake
         * measure the same) */
        T_EXPECT(r1.within_noise_of < 0 ||
                     r1.cand[r1.within_noise_of].measured_sps == r1.cand[r1.best].measured_sps,
                 "noise-free: no tie or an exact one (%" PRId64 ")", r1.within_noise_of);
        T_EXPECT(r2.best == r1.best, "the same choice with noise");
        T_EXPECT(r2.within_noise_of >= 0 &&
                     r2.cand[r2.within_noise_of].measured_sps < r2.cand[r2.best].measured_sps,
                 "+-90 %% spread: the winner is within the noise of a slower candidate (%" PRId64
                 ")",
                 r2.within_noise_of);
        qc_tune_result_free(&r1);
        qc_tune_result_free(&r2);
    }

    QC_TEST ("--allow-precision: precision varies only then, 16-bit plans keep fewer bytes, and "
             "the measurements choose it") {
        struct fake f1 = {.favour = 2}, f2 = {.favour = 2};
        struct qc_tune_result r1, r2;
        T_EXPECT(run_fake_prec(&f1, budget, false, false, &r1) == QC_OK, "%s", qc_error_last());
        T_EXPECT(run_fake_prec(&f2, budget, false, true, &r2) == QC_OK, "%s", qc_error_last());
        struct qc_config cfg;
        base_config(&cfg);
        for (int64_t i = 0; i < r1.ncand; i++)
            T_EXPECT(r1.cand[i].set.precision == cfg.precision,
                     "not allowed: candidate %" PRId64 " keeps the base precision", i);
        /* the space's points (the measured-only variants of loader threads, queue depth and
         * block size that the search appends left out) */
        int64_t per[QC_PREC_COUNT] = {0}, without = 0;
        for (int64_t i = 0; i < r1.ncand; i++)
            without += is_space_point(&r1.cand[i].set, &cfg);
        for (int64_t i = 0; i < r2.ncand; i++)
            if ((unsigned)r2.cand[i].set.precision < QC_PREC_COUNT)
                per[r2.cand[i].set.precision] += is_space_point(&r2.cand[i].set, &cfg);
        T_EXPECT(without > 0 && per[0] == without && per[1] == without && per[2] == without,
                 "allowed: each precision once per point (%" PRId64 "/%" PRId64 "/%" PRId64
                 ", without %" PRId64 ")",
                 per[0], per[1], per[2], without);
        /* everything kept: the 16-bit stashes are packed, so the heavy-tail peak is lower */
        int64_t compared = 0;
        for (int64_t i = 0; i < r2.ncand; i++) {
            const struct qc_tune_candidate *c = &r2.cand[i];
            if (c->set.precision != QC_PREC_FP32 || c->set.policy != QC_PLAN_KEEP)
                continue;
            for (int q = QC_PREC_BF16; q <= QC_PREC_FP16; q++) {
                const int64_t j = same_but_precision(&r2, c, q);
                T_EXPECT(j >= 0 && r2.cand[j].peak < c->peak,
                         "batch %" PRId64 " kept, %s: peak %" PRIu64 " vs fp32 %" PRIu64,
                         c->set.batch_size, q == QC_PREC_BF16 ? "bf16" : "fp16",
                         j >= 0 ? r2.cand[j].peak : 0, c->peak);
                compared++;
            }
        }
        T_EXPECT(compared > 0, "kept candidates compared: %" PRId64, compared);
        /* bf16 measures twice as fast: it is chosen, and it was really run as bf16 */
        T_EXPECT(r2.best >= 0 && r2.best_measured && r2.cand[r2.best].set.precision == QC_PREC_BF16,
                 "chose %s",
                 r2.best >= 0 ? (r2.cand[r2.best].set.precision == QC_PREC_BF16 ? "bf16" : "other")
                              : "nothing");
        bool ran_bf16 = false;
        for (int64_t k = 0; k < f2.calls && k < 64; k++)
            ran_bf16 |= f2.ran[k].precision == QC_PREC_BF16;
        T_EXPECT(ran_bf16, "a bf16 configuration was measured");
        /* 16-bit measures slower (a CPU): the predictions rank the smaller 16-bit peaks first,
         * yet every precision is measured and fp32 is chosen */
        struct fake f3 = {.favour = 3};
        struct qc_tune_result r3;
        T_EXPECT(run_fake_prec(&f3, budget, false, true, &r3) == QC_OK, "%s", qc_error_last());
        bool ran[QC_PREC_COUNT] = {false, false, false};
        for (int64_t k = 0; k < f3.calls && k < 64; k++)
            if ((unsigned)f3.ran[k].precision < QC_PREC_COUNT)
                ran[f3.ran[k].precision] = true;
        T_EXPECT(ran[0] && ran[1] && ran[2], "every precision measured: fp32 %d bf16 %d fp16 %d",
                 ran[0], ran[1], ran[2]);
        T_EXPECT(r3.best >= 0 && r3.cand[r3.best].set.precision == QC_PREC_FP32,
                 "16-bit measured slower: fp32 chosen");
        qc_tune_result_free(&r1);
        qc_tune_result_free(&r2);
        qc_tune_result_free(&r3);
    }

    QC_TEST ("a budget too small for anything names the least budget: the heaviest scene's, "
             "which fits") {
        struct fake f = {0};
        struct qc_tune_result r;
        const enum qc_status st = run_fake(&f, 16 * MIB, false, &r);
        T_EXPECT(st == QC_ERR_INVALID, "status %d", (int)st);
        const char *msg = qc_error_last();
        char want[64];
        snprintf(want, sizeof want, "--budget %" PRIu64 "MiB", r.min_budget >> 20);
        T_EXPECT(strstr(msg, "at least") && strstr(msg, want), "message: %s", msg);
        T_EXPECT(f.calls == 0, "nothing run: %" PRId64, f.calls);
        const uint64_t least = r.min_budget;
        qc_tune_result_free(&r);
        /* the test's own figure: the heaviest scene alone at its smallest peak. The least
         * budget covers it (less, and a tuned preset at that budget fails on that scene) and
         * is no more than the planner's stated error over it (the predicted peak within 5 %), plus
         * the MiB it is rounded up to */
        struct qc_config cfg;
        base_config(&cfg);
        int64_t heaviest = -1;
        int attention = 0;
        const double figure = least_budget_figure(&cfg, &heaviest, &attention);
        printf("  least budget %.2f MiB, the test's figure %.2f MiB (scene %" PRId64 ", %s)\n",
               (double)least / (double)MIB, figure / (double)MIB, heaviest,
               attention == QC_ATTENTION_UNFUSED ? "unfused" : "fused");
        T_EXPECT(figure > 16.0 * (double)MIB && (double)least >= figure,
                 "the least budget %.2f MiB is below the heaviest scene's %.2f MiB",
                 (double)least / (double)MIB, figure / (double)MIB);
        T_EXPECT((double)least <= figure * 1.05 + (double)MIB,
                 "the least budget %.2f MiB is more than 5 %% over the heaviest scene's %.2f MiB",
                 (double)least / (double)MIB, figure / (double)MIB);
        /* that scene, planned alone under the least budget by a session of the test's: fits */
        struct qc_config c = cfg;
        c.attention = (enum qc_attention_impl)attention;
        c.device_budget = least;
        struct qc_train_planner *pl = NULL;
        struct qc_plan_params par;
        qc_train_plan_params(&c, &par);
        par.mode = QC_PLAN_MODE_AUTO;
        par.margin = 0.02;
        struct qc_plan_result pr = {0};
        T_EXPECT(heaviest >= 0 && qc_train_planner_create(&c, NULL, 0, NULL, &pl) == QC_OK &&
                     qc_train_planner_plan_scenes(pl, &heaviest, 1, NULL, &par, &pr, NULL) == QC_OK,
                 "%s", qc_error_last());
        T_EXPECT(pr.fits,
                 "scene %" PRId64 " under the least budget: peak %" PRIu64 ", target %" PRIu64,
                 heaviest, pr.peak, pr.target);
        qc_plan_result_free(&pr);
        qc_train_planner_destroy(pl);
        T_EXPECT(least > 16 * MIB && run_fake(&f, least, true, &r) == QC_OK && r.fitting > 0,
                 "the least budget fits: %s", qc_error_last());
        qc_tune_result_free(&r);
    }
}

static void test_cli(void)
{
    QC_TEST ("tune --preset rtx3090x8 --dry-run: predicted from the hw figures, nothing run") {
        char out_path[512];
        snprintf(out_path, sizeof out_path, "%s/3090.json", tmp_root);
        const char *args[] = {"--quiet",   "--preset",      "rtx3090x8", "tune",
                              "--dry-run", "--tail-scenes", "4",         "--out",
                              out_path,    "--json",        NULL};
        char *out = NULL;
        const int rc = cli(args, &out);
        T_EXPECT(rc == 0, "exit %d: %s", rc, out ? out : "");
        cJSON *j = json_line(out);
        free(out);
        T_EXPECT(j && cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "runs")) == 0 &&
                     cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "chosen_measured")) &&
                     cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "global_batch")) ==
                         32,
                 "no run, global batch 32");
        cJSON_Delete(j);
        /* a base named by name is written as the absolute path of its file: the preset works
         * wherever it is copied, not only where the same profiles/ folder is searched */
        char *text = t_read_file(out_path, NULL);
        cJSON *p = text ? cJSON_Parse(text) : NULL;
        free(text);
        const char *inh = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p, "inherits"));
        T_EXPECT(inh && inh[0] == '/' && strstr(inh, "/profiles/rtx3090x8.json") && t_exists(inh),
                 "inherits the resolved path of rtx3090x8: %s", inh ? inh : "(none)");
        cJSON_Delete(p);
        cJSON *d = config_dump(out_path);
        T_EXPECT(d && cJSON_GetNumberValue(dumped(d, "train.batch_size")) *
                              cJSON_GetNumberValue(dumped(d, "train.grad_accum")) * 8 ==
                          32,
                 "32 scenes a step over 8 ranks");
        cJSON_Delete(d);
    }

    QC_TEST ("tune --allow-precision --dry-run: every precision predicted, the preset loads") {
        char out_path[512];
        snprintf(out_path, sizeof out_path, "%s/prec.json", tmp_root);
        const char *args[] = {
            "--quiet",           "--preset",  base_path, "tune",   "--budget", "160MiB",
            "--allow-precision", "--dry-run", "--out",   out_path, "--json",   NULL};
        char *out = NULL;
        const int rc = cli(args, &out);
        T_EXPECT(rc == 0, "exit %d: %s", rc, out ? out : "");
        cJSON *j = json_line(out);
        free(out);
        bool seen[3] = {false, false, false};
        const cJSON *c = NULL, *cands = cJSON_GetObjectItemCaseSensitive(j, "candidates");
        cJSON_ArrayForEach(c, cands)
        {
            const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "precision"));
            for (int q = 0; p && q < 3; q++)
                seen[q] |= strcmp(p, qc_precision_str((enum qc_precision)q)) == 0;
        }
        T_EXPECT(seen[0] && seen[1] && seen[2], "candidates of fp32, bf16 and fp16");
        cJSON_Delete(j);
        cJSON *d = config_dump(out_path);
        const char *p = d ? cJSON_GetStringValue(dumped(d, "train.precision")) : NULL;
        T_EXPECT(p && (!strcmp(p, "fp32") || !strcmp(p, "bf16") || !strcmp(p, "fp16")),
                 "the preset's train.precision: %s", p ? p : "(none)");
        cJSON_Delete(d);
    }

    QC_TEST ("tune refuses bad arguments, exit 2, nothing written") {
        char out_path[512];
        snprintf(out_path, sizeof out_path, "%s/bad.json", tmp_root);
        static const char *const bad[][8] = {
            {"tune", "--budget", "0", "--dry-run", NULL},
            {"tune", "--time-limit", "soon", "--dry-run", NULL},
            {"tune", "--budget", "1GiB", "--global-batch", "0", "--dry-run", NULL},
            {"tune", "--set", "dist.world_size=2", "--budget", "1GiB", NULL},
            {"tune", "--data", "/nonexistent.qcshard", "--budget", "1GiB", NULL},
            {"tune", "--budget", "1GiB", "--measure-steps", "2", NULL},
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            const char *args[12];
            int n = 0;
            args[n++] = "--preset";
            args[n++] = base_path;
            for (int i = 0; bad[k][i]; i++)
                args[n++] = bad[k][i];
            args[n++] = "--out";
            args[n++] = out_path;
            args[n] = NULL;
            char *out = NULL;
            const int rc = cli(args, &out);
            T_EXPECT((rc == 2 || (k == 4 && rc == 1)) && out && strstr(out, "error"),
                     "%s %s: exit %d: %s", bad[k][1], bad[k][2] ? bad[k][2] : "", rc,
                     out ? out : "");
            T_EXPECT(!t_exists(out_path), "nothing written");
            free(out);
        }
    }

    QC_TEST ("tune --out into a missing folder or onto a folder fails at once, before the "
             "search, exit 2") {
        char missing[512];
        snprintf(missing, sizeof missing, "%s/no-such-folder/tuned.json", tmp_root);
        const char *const outs[2] = {missing, tmp_root};
        for (int k = 0; k < 2; k++) {
            /* no --dry-run: a search would measure for minutes; the check comes first */
            const char *args[] = {"--preset", base_path, "tune",  "--budget",
                                  "1GiB",     "--out",   outs[k], NULL};
            char *out = NULL;
            const int rc = cli(args, &out);
            T_EXPECT(rc == 2 && out &&
                         strstr(out, k ? "is a folder" : "no-such-folder does not exist") &&
                         !strstr(out, "candidates"),
                     "--out %s: exit %d: %s", outs[k], rc, out ? out : "");
            free(out);
        }
    }
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-tune-%d", (int)getpid());
    t_rm_rf(tmp_root);
    mkdir(tmp_root, 0755);
    write_base();
    test_preset();
    test_search();
    test_cli();
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
