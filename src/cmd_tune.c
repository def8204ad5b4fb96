/*
 * cmd_tune.c — `qctrain tune`: writes the fastest preset that fits a memory budget, measured,
 * not guessed (src/tune/README.md). Prints the candidates predicted against measured (text, or
 * one JSON object with --json) and then writes the preset atomically (the output path is
 * checked before the search), shows a progress bar over the candidates measured, and on Ctrl-C
 * writes the best so far and exits 130.
 */
#include "qc_cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qc_cleanup.h"
#include "qc_file.h"
#include "qc_half.h"
#include "qc_progress.h"
#include "qc_train.h"
#include "qc_tune.h"

static const char tune_usage[] =
    "[--preset BASE] [--data FILE...] [--budget SIZE] [--time-limit DURATION] [--out PRESET.json] "
    "[--json] [--dry-run] [--allow-precision]";
static const char tune_summary[] =
    "Writes the fastest preset that fits a memory budget: searches micro-batch x accumulation "
    "for the global batch, plan margin and policy, prefetch window, attention, loader and compute "
    "threads (and NVMe queue depth and block size when the plan uses NVMe); prunes with the "
    "planner's "
    "predictions on the heaviest scenes (nothing predicted over the budget is run), measures "
    "the best few with a few training steps each (on --data, or generated mixed scenes), and "
    "writes a preset inheriting BASE (default qcnet-av2) that sets only what differs. "
    "--dry-run predicts from the preset's hw.* figures and runs nothing. --allow-precision also "
    "searches train.precision (fp32, bf16, fp16), which changes results (docs/PRECISION.md).";

/* "90", "90s", "2.5m", "1h": seconds. */
static enum qc_status parse_duration(const char *s, double *out)
{
    char *end = NULL;
    const double v = strtod(s, &end);
    double unit = 1;
    if (end && strcmp(end, "m") == 0)
        unit = 60;
    else if (end && strcmp(end, "h") == 0)
        unit = 3600;
    else if (!end || (end[0] && strcmp(end, "s") != 0))
        unit = -1;
    if (end == s || unit < 0 || !(v > 0) || !isfinite(v))
        return qc_errorf(QC_ERR_INVALID,
                         "tune: --time-limit: expected a positive duration, got \"%s\"\nhint: "
                         "seconds, or with a unit: 90s, 10m, 1.5h",
                         s);
    *out = v * unit;
    return QC_OK;
}

static const char *attention_str(enum qc_attention_impl a)
{
    return a == QC_ATTENTION_FUSED ? "fused" : "unfused";
}

static const char *state_str(enum qc_tune_state s)
{
    static const char *const n[] = {"pruned", "fits", "same-plan", "measured"};
    return (unsigned)s < 4 ? n[s] : "?";
}

struct bar {
    struct qc_progress *p;
};

/* The bar counts candidates measured of those the search means to measure. */
static void on_progress(void *user, const char *what, int64_t done, int64_t total)
{
    struct bar *b = user;
    if (!b->p)
        return;
    qc_progress_set(b->p, "now", "%s", what);
    qc_progress_set_total(b->p, (uint64_t)(total > 0 ? total : 0));
    qc_progress_update(b->p, (uint64_t)(done > 0 ? done : 0));
}

/* Refuses an --out the preset could not be written to, before the search runs: a folder, or a
 * file in a folder that does not exist or is not writable. */
static enum qc_status check_out_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return qc_errorf(QC_ERR_INVALID,
                         "tune: --out %s is a folder; the preset is one .json file\nhint: --out "
                         "%s/tuned.json",
                         path, path);
    char dir[PATH_MAX];
    qc_file_dir_of(path, dir, sizeof dir);
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return qc_errorf(QC_ERR_INVALID,
                         "tune: --out %s: the folder %s does not exist\nhint: mkdir -p %s, or "
                         "give a path in an existing folder",
                         path, dir, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return qc_errorf(QC_ERR_INVALID, "tune: --out %s: the folder %s is not writable (%s)", path,
                         dir, strerror(errno));
    return QC_OK;
}

static bool on_stop(void *user)
{
    (void)user;
    return qc_cleanup_stop_signal() != 0;
}

/* The measured step times' spread: (slowest - fastest) / median, in %. */
static double spread_pct(const struct qc_tune_candidate *c)
{
    return c->m.step_s > 0 ? 100.0 * (c->m.step_s_max - c->m.step_s_min) / c->m.step_s : 0.0;
}

/* The rows of the text table: measured candidates in run order, then the best predicted
 * unmeasured ones. */
static void print_row(FILE *out, const struct qc_tune_result *r, int64_t i)
{
    const struct qc_tune_candidate *c = &r->cand[i];
    char pk[32], mp[32], win[32];
    qc_format_bytes(c->peak, pk, sizeof pk);
    qc_format_bytes(c->set.prefetch_window, win, sizeof win);
    fprintf(out,
            "%c%4" PRId64 " %5" PRId64 " %5" PRId64 " %-8s %-4s %-9s %5.2f %-10s %7" PRId64
            " %7" PRId64 " %10s %9.4f",
            i == r->best ? '*' : ' ', i, c->set.batch_size, c->set.grad_accum,
            attention_str(c->set.attention), qc_precision_str((enum qc_precision)c->set.precision),
            qc_config_plan_policy_str(c->set.policy), c->set.margin, win, c->set.loader_threads,
            c->set.cpu_threads, pk, c->samples_per_s);
    if (c->state == QC_TUNE_MEASURED) {
        qc_format_bytes(c->m.peak_bytes, mp, sizeof mp);
        fprintf(out, " %9.4f %6.1f%% %10s %7" PRId64 "%s%s\n", c->measured_sps, spread_pct(c), mp,
                c->m.replans, c->m.failed ? "  FAILED: " : "", c->m.failed ? c->m.note : "");
    } else {
        fprintf(out, " %9s %7s %10s %7s  %s\n", "-", "-", "-", "-", state_str(c->state));
    }
}

static void print_text(FILE *out, const struct qc_tune_result *r, const char *desc)
{
    int64_t pruned = 0;
    for (int64_t i = 0; i < r->ncand; i++)
        pruned += r->cand[i].state == QC_TUNE_PRUNED;
    char el[32];
    qc_format_duration(r->seconds, el, sizeof el);
    fprintf(out,
            "%" PRId64 " candidates: %" PRId64 " predicted over the budget (never run), %" PRId64
            " measured, in %s%s\n\n",
            r->ncand, pruned, r->runs, el, r->stopped ? " (stopped early)" : "");
    fprintf(out, "%5s %5s %5s %-8s %-4s %-9s %5s %-10s %7s %7s %10s %9s %9s %7s %10s %7s\n", "#",
            "batch", "accum", "attn", "prec", "policy", "margn", "window", "loaders", "threads",
            "pred peak", "pred sps", "meas sps", "spread", "meas peak", "replans");
    for (int64_t k = 1; k <= r->runs; k++)
        for (int64_t i = 0; i < r->ncand; i++)
            if (r->cand[i].state == QC_TUNE_MEASURED && r->cand[i].order == k)
                print_row(out, r, i);
    /* then the five best predicted that did not run */
    int64_t shown = 0;
    bool *done = calloc((size_t)(r->ncand ? r->ncand : 1), sizeof *done);
    while (done && shown < 5) {
        int64_t b = -1;
        for (int64_t i = 0; i < r->ncand; i++) {
            const struct qc_tune_candidate *c = &r->cand[i];
            if (done[i] || c->state == QC_TUNE_MEASURED || c->state == QC_TUNE_PRUNED)
                continue;
            const struct qc_tune_candidate *x = b < 0 ? NULL : &r->cand[b];
            if (!x || c->samples_per_s > x->samples_per_s ||
                (c->samples_per_s == x->samples_per_s && c->peak < x->peak))
                b = i; /* the search's order: faster, then smaller peak, then earlier */
        }
        if (b < 0)
            break;
        done[b] = true;
        print_row(out, r, b);
        shown++;
    }
    free(done);
    fprintf(out, "\nchosen (*): %s\n", desc);
    if (r->within_noise_of >= 0) {
        const struct qc_tune_candidate *b = &r->cand[r->best], *o = &r->cand[r->within_noise_of];
        fprintf(out,
                "not a clear winner: #%" PRId64 " measured %.4g samples/s against %.4g, within "
                "the noise of the step times (spread %.1f %% and %.1f %%); more "
                "--measure-steps would tell them apart\n",
                r->within_noise_of, o->measured_sps, b->measured_sps, spread_pct(o), spread_pct(b));
    }
}

static cJSON *candidate_json(const struct qc_tune_result *r, int64_t i)
{
    const struct qc_tune_candidate *c = &r->cand[i];
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "index", (double)i);
    cJSON_AddStringToObject(o, "state", state_str(c->state));
    cJSON_AddNumberToObject(o, "batch_size", (double)c->set.batch_size);
    cJSON_AddNumberToObject(o, "grad_accum", (double)c->set.grad_accum);
    cJSON_AddStringToObject(o, "attention", attention_str(c->set.attention));
    cJSON_AddStringToObject(o, "precision", qc_precision_str((enum qc_precision)c->set.precision));
    cJSON_AddStringToObject(o, "policy", qc_config_plan_policy_str(c->set.policy));
    cJSON_AddNumberToObject(o, "margin", c->set.margin);
    cJSON_AddNumberToObject(o, "prefetch_window", (double)c->set.prefetch_window);
    cJSON_AddNumberToObject(o, "loader_threads", (double)c->set.loader_threads);
    cJSON_AddNumberToObject(o, "cpu_threads", (double)c->set.cpu_threads);
    cJSON_AddNumberToObject(o, "queue_depth", (double)c->set.queue_depth);
    cJSON_AddNumberToObject(o, "block_size", (double)c->set.block_size);
    cJSON_AddNumberToObject(o, "predicted_peak_bytes", (double)c->peak);
    cJSON_AddNumberToObject(o, "predicted_step_s", c->step_s);
    cJSON_AddNumberToObject(o, "predicted_samples_per_s", c->samples_per_s);
    cJSON_AddNumberToObject(o, "offload_bytes", (double)c->offload_bytes);
    cJSON_AddNumberToObject(o, "recompute_bytes", (double)c->recompute_bytes);
    if (c->state == QC_TUNE_MEASURED) {
        cJSON_AddNumberToObject(o, "run", (double)c->order);
        cJSON_AddNumberToObject(o, "predicted_step_s_at_run", c->predicted_at_run_s);
        cJSON_AddNumberToObject(o, "measured_step_s", c->m.step_s);
        cJSON_AddNumberToObject(o, "measured_step_s_min", c->m.step_s_min);
        cJSON_AddNumberToObject(o, "measured_step_s_max", c->m.step_s_max);
        cJSON_AddNumberToObject(o, "measured_samples_per_s", c->measured_sps);
        cJSON_AddNumberToObject(o, "measured_peak_bytes", (double)c->m.peak_bytes);
        cJSON_AddNumberToObject(o, "measured_steps", (double)c->m.steps);
        cJSON_AddNumberToObject(o, "replans", (double)c->m.replans);
        cJSON_AddNumberToObject(o, "splits", (double)c->m.splits);
        cJSON_AddBoolToObject(o, "failed", c->m.failed);
        if (c->m.note[0])
            cJSON_AddStringToObject(o, "note", c->m.note);
    }
    return o;
}

static enum qc_status print_json(FILE *out, const struct qc_tune_result *r, uint64_t budget,
                                 int64_t G, const char *base, const char *path, bool dry,
                                 const char *preset)
{
    cJSON *o = cJSON_CreateObject(), *cands = cJSON_CreateArray(), *heavy = cJSON_CreateArray();
    cJSON *p = cJSON_Parse(preset);
    bool ok = o && cands && heavy && p;
    for (int64_t i = 0; ok && i < r->ncand; i++) {
        cJSON *c = candidate_json(r, i);
        ok = c && cJSON_AddItemToArray(cands, c);
    }
    for (int64_t i = 0; ok && i < r->weighed && i < 8; i++)
        ok = cJSON_AddItemToArray(heavy, cJSON_CreateNumber((double)r->heavy_scenes[i]));
    if (ok) {
        cJSON_AddStringToObject(o, "base", base);
        cJSON_AddStringToObject(o, "out", path);
        cJSON_AddBoolToObject(o, "dry_run", dry);
        cJSON_AddNumberToObject(o, "budget_bytes", (double)budget);
        cJSON_AddNumberToObject(o, "global_batch", (double)G);
        cJSON_AddNumberToObject(o, "seconds", r->seconds);
        cJSON_AddBoolToObject(o, "stopped", r->stopped);
        cJSON_AddNumberToObject(o, "runs", (double)r->runs);
        cJSON_AddNumberToObject(o, "fitting", (double)r->fitting);
        cJSON_AddNumberToObject(o, "scenes_weighed", (double)r->weighed);
        cJSON_AddItemToObject(o, "heaviest_scenes", heavy);
        heavy = NULL;
        cJSON_AddNumberToObject(o, "chosen", (double)r->best);
        cJSON_AddBoolToObject(o, "chosen_measured", r->best_measured);
        if (r->within_noise_of >= 0)
            cJSON_AddNumberToObject(o, "within_noise_of", (double)r->within_noise_of);
        else
            cJSON_AddNullToObject(o, "within_noise_of");
        cJSON_AddItemToObject(o, "candidates", cands);
        cands = NULL;
        cJSON_AddItemToObject(o, "preset", p);
        p = NULL;
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    cJSON_Delete(cands);
    cJSON_Delete(heavy);
    cJSON_Delete(p);
    if (!text)
        return qc_errorf(QC_ERR_NOMEM, "tune: out of memory");
    fprintf(out, "%s\n", text);
    cJSON_free(text);
    return QC_OK;
}

/* The description of the written preset: how it was found. */
static void describe(char *buf, size_t n, const struct qc_tune_result *r,
                     const struct qc_config *cfg, uint64_t budget, int64_t G,
                     const struct qc_cli_strings *data, bool dry)
{
    const struct qc_tune_candidate *c = &r->cand[r->best];
    char b[32], pk[32], mp[32], date[32];
    qc_format_bytes(budget, b, sizeof b);
    qc_format_bytes(c->peak, pk, sizeof pk);
    const time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%d", &tm);
    char src[512];
    if (data->n > 0)
        snprintf(src, sizeof src, "%s%s", data->v[0], data->n > 1 ? " and more" : "");
    else
        snprintf(src, sizeof src, "generated mixed scenes");
    const int w = snprintf(
        buf, n,
        "qctrain tune, %s: the global batch of %" PRId64 " as %" PRId64 " x %" PRId64
        " (%s attention, %s, plan.policy %s) "
        "under a %s budget on the %s device, data: %s; ",
        date, G, c->set.batch_size, c->set.grad_accum, attention_str(c->set.attention),
        qc_precision_str((enum qc_precision)c->set.precision),
        qc_config_plan_policy_str(c->set.policy), b, qc_train_device_str(cfg->device_kind), src);
    if (w < 0 || (size_t)w >= n)
        return;
    if (r->best_measured) {
        qc_format_bytes(c->m.peak_bytes, mp, sizeof mp);
        snprintf(buf + w, n - (size_t)w,
                 "measured %.4g samples/s, peak %s (predicted %.4g samples/s, heavy-tail peak "
                 "%s); %" PRId64 " of %" PRId64 " candidates run%s%s.",
                 c->measured_sps, mp, c->samples_per_s, pk, r->runs, r->ncand,
                 r->stopped ? ", stopped early" : "",
                 r->within_noise_of >= 0 ? "; not a clear winner: another candidate measured "
                                           "within the noise of the step times"
                                         : "");
    } else {
        snprintf(buf + w, n - (size_t)w,
                 "predicted only (%s), not measured: %.4g samples/s, heavy-tail peak %s.",
                 dry ? "--dry-run, from the hw.* figures" : "stopped before any run",
                 c->samples_per_s, pk);
    }
}

enum qc_status qc_cmd_tune(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0};
    bool json = false, dry = false, allow_precision = false;
    uint64_t budget = cfg.device_budget;
    const char *limit_s = "10m", *out_path = "tuned.json";
    int64_t steps = 4, runs = 3, tail = 32, G = cfg.global_batch;
    const int64_t ranks = cfg.world_size > 0 ? cfg.world_size : 1;
    if (G == 0)
        G = cfg.batch_size * cfg.grad_accum * ranks;
    char d_budget[32], d_g[96];
    snprintf(d_budget, sizeof d_budget, "%" PRIu64, budget);
    if (cfg.global_batch > 0)
        snprintf(d_g, sizeof d_g, "%" PRId64 ", the base's train.global_batch", G);
    else
        snprintf(d_g, sizeof d_g, "%" PRId64 ", the base's batch_size x grad_accum x ranks", G);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "",
         "qcshard file(s) to tune on; none: generated mixed scenes"},
        {"budget", QC_CLI_SIZE, &budget, d_budget, "device bytes every step must fit"},
        {"time-limit", QC_CLI_STRING, &limit_s, "10m",
         "no measurement starts past it: 90s, 10m, 1h"},
        {"out", QC_CLI_STRING, &out_path, "tuned.json", "the preset written"},
        {"global-batch", QC_CLI_INT, &G, d_g,
         "scenes per optimizer step over all ranks (train.global_batch)"},
        {"measure-steps", QC_CLI_INT, &steps, "4",
         "optimizer steps per measured candidate, at least 3: the first is a warm-up, the "
         "others are timed (two or more give the spread that tells two candidates apart)"},
        {"max-runs", QC_CLI_INT, &runs, "3",
         "best predicted candidates measured (then loader-thread variants of the fastest)"},
        {"tail-scenes", QC_CLI_INT, &tail, "32", "scenes weighed to find the heaviest"},
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
        {"dry-run", QC_CLI_FLAG, &dry, "", "predict from the hw.* figures only; run nothing"},
        {"allow-precision", QC_CLI_FLAG, &allow_precision, "",
         "also search train.precision (fp32, bf16, fp16): changes results, off by default"},
    };
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("tune", tune_usage, tune_summary, opts, (int)(sizeof opts / sizeof opts[0]),
                        argc, argv, pos, QC_CLI_STRINGS_MAX, &npos, &help));
    if (help)
        return QC_OK;
    QC_TRY(qc_train_cli_finish("tune", pos, npos, &data, NULL, &cfg));
    double limit = 0;
    QC_TRY(parse_duration(limit_s, &limit));
    if (runs < 1 || tail < 1 || G < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "tune: --max-runs, --tail-scenes and --global-batch must be >= 1");
    if (steps < 3)
        return qc_errorf(QC_ERR_INVALID,
                         "tune: --measure-steps %" PRId64 ": at least 3 (a warm-up step, then two "
                         "timed ones: one timed step has no spread, and without a spread two "
                         "candidates cannot be told apart)",
                         steps);
    if (G % ranks != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "tune: --global-batch %" PRId64 " does not split over %" PRId64
                         " ranks (dist.world_size)",
                         G, ranks);
    if (!dry && ranks > 1)
        return qc_errorf(QC_ERR_INVALID,
                         "tune: the base runs on %" PRId64 " ranks (dist.world_size) but tune "
                         "measures on this one process\nhint: --dry-run predicts for those "
                         "ranks; or tune one rank's share with --set dist.world_size=1 "
                         "--global-batch %" PRId64,
                         ranks, G / ranks);
    if (!out_path[0])
        return qc_errorf(QC_ERR_INVALID, "tune: --out: empty path");
    QC_TRY(check_out_path(out_path));
    QC_TRY(qc_config_validate(&cfg));
    if (data.n == 0)
        cfg.synthetic_profile = QC_SCENE_MIXED; /* the heavy tail without data */

    /* the base the preset inherits, alone, by the absolute path of its file: a name resolves
     * only where the same profiles/ folder is searched, a path works wherever the file is */
    const char *base_name = cli->preset ? cli->preset : "qcnet-av2";
    char found[PATH_MAX], inherits[PATH_MAX];
    QC_TRY(qc_config_preset_path(base_name, found, sizeof found));
    if (!realpath(found, inherits))
        return qc_errorf(QC_ERR_INVALID, "tune: --preset %s: %s: %s", base_name, found,
                         strerror(errno));
    struct qc_config base;
    qc_config_defaults(&base);
    QC_TRY(qc_config_apply_preset(&base, base_name));

    struct bar bar = {0};
    struct qc_progress_opts po;
    qc_progress_opts_init(&po);
    po.label = "tune";
    po.unit = "candidates";
    po.total = dry ? 0 : (uint64_t)runs;
    po.quiet = cli->quiet || cfg.quiet;
    QC_TRY(qc_progress_create(&po, &bar.p));

    struct qc_tune_opts to;
    qc_tune_opts_init(&to);
    to.cfg = &cfg;
    to.data = data.v;
    to.ndata = data.n;
    to.budget = budget;
    to.global_batch = G;
    to.dry_run = dry;
    to.allow_precision = allow_precision;
    to.time_limit_s = limit;
    to.max_measured = runs;
    to.tail_scenes = tail;
    to.measure_user = &steps;
    to.progress = on_progress;
    to.progress_user = &bar;
    to.stop = on_stop;
    qc_cleanup_stop_begin(); /* Ctrl-C: finish the step, write the best so far */
    struct qc_tune_result r;
    enum qc_status st = qc_tune_run(&to, &r);
    qc_cleanup_stop_end();
    if (st == QC_OK && bar.p) {
        qc_progress_set_total(bar.p, (uint64_t)r.runs);
        qc_progress_update(bar.p, (uint64_t)r.runs);
    }
    qc_progress_finish(bar.p);
    qc_progress_destroy(bar.p);
    if (st != QC_OK) {
        qc_tune_result_free(&r);
        return st;
    }
    /* the preset: the base, the budget, the global batch and the chosen settings */
    struct qc_config tuned = cli->cfg;
    tuned.device_budget = budget;
    tuned.global_batch = G;
    tuned.quiet = base.quiet; /* --quiet and --log-level are this command's, not the preset's */
    tuned.log_level = base.log_level;
    qc_tune_settings_apply(&r.cand[r.best].set, &tuned);
    char desc[1024];
    describe(desc, sizeof desc, &r, &cfg, budget, G, &data, dry);
    char *preset = NULL;
    st = qc_tune_preset_json(&base, inherits, &tuned, desc, &preset);
    /* the table first: a search's result is shown even when the file cannot be written */
    if (st == QC_OK) {
        if (json)
            st = print_json(stdout, &r, budget, G, inherits, out_path, dry, preset);
        else
            print_text(stdout, &r, desc);
        fflush(stdout);
    }
    if (st == QC_OK) {
        const struct qc_file_part parts[2] = {{preset, strlen(preset)}, {"\n", 1}};
        st = qc_file_write_atomic(out_path, parts, 2, "tuned preset");
    }
    if (st == QC_OK && !json)
        printf("wrote %s\n", out_path);
    free(preset);
    qc_tune_result_free(&r);
    return st;
}
