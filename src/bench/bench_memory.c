/*
 * bench_memory.c — `qctrain bench memory [--data FILE...] [--batch-size N] [--budgets LIST]
 * [--warmup N] [--repeats N] [--rounds N] [--json]`: training steps under device budgets, the
 * memory system's benchmark (src/train/memory/stepmem.c, src/plan). A benchmark, never a test:
 * it prints figures and gates nothing.
 *
 * Every budget is a fresh training run (qc_trainer, the code path of `qctrain train`, plan.policy
 * auto) on the same scenes in the same order (train.shuffle off): --warmup untimed steps, then
 * --repeats timed ones, one group of --batch-size scenes per step. The unconstrained run (budget
 * 0) goes first; its calibrated cost model (RUN/plan_cost.json) seeds every other run, as a
 * resumed run would be. LIST holds sizes (0.48GiB, 4GiB; 0 = unconstrained), fractions of the
 * unconstrained run's measured peak (1/8) and `min`, the smallest budget the planner finds a
 * plan for (the minimum plan's peak over the timed batches, over 1 − the planner's margin),
 * raised by 5 % at a time (up to 6 times, "min_raised") while the allocator's fragmentation
 * makes the run fail.
 * Default: 0,1/2,1/4,1/8,1/16,min. Without 0 in the list no unconstrained run happens and
 * time_ratio is null (e.g. a batch whose unconstrained step would not fit this machine).
 *
 * Per run ("runs"): budget_bytes, measured_peak_bytes (the allocator's active peak, the most of
 * the timed steps), predicted_peak_bytes (the planner's, same steps), step_s (mean of the timed
 * steps), time_ratio (step_s over the unconstrained run's, in this process), host_bytes,
 * nvme_bytes and recomputed_bytes (per timed step, mean), and cpu_s (process CPU seconds per
 * timed step, every thread) with cpu_ratio, reserved_peak_bytes, prefetch_stall_s, plan_ms,
 * replans, splits, and the allocator's cache releases and raw maps over the run
 * (alloc_retries, alloc_maps). --rounds N runs the whole list N times, unconstrained and budgets
 * alternating: step_s is then the median over the rounds and time_ratio the median of the
 * rounds' ratios (step_s_rounds lists them), the other figures are the first round's; a run that
 * fails (a scene that does not fit even alone) is reported with "error" and the bench goes on. The
 * tiers are the configuration's:
 * `--set offload.nvme_dir=DIR` gives the planner an NVMe tier.
 */
#include "qc_cli.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_common.h"
#include "qc_alloc.h"
#include "qc_plan.h"
#include "qc_progress.h" /* qc_format_bytes */
#include "qc_train.h"

static const char memory_usage[] =
    "[--data FILE...] [--batch-size N] [--budgets LIST] [--warmup N] [--repeats N] [--rounds N] "
    "[--json]";
static const char memory_summary[] =
    "Training steps under device budgets: measured and predicted peak, step time against the "
    "unconstrained run, bytes offloaded to the host and NVMe tiers and recomputed, per budget. "
    "LIST: sizes (0 = unconstrained), fractions of the unconstrained peak (1/8) and min (the "
    "smallest plan); default 0,1/2,1/4,1/8,1/16,min.";

#define MAX_BUDGETS 16
#define MAX_ROUNDS  9
#define MIN_TRIES   6

/* One entry of LIST. */
struct budget_spec {
    enum { B_BYTES, B_FRACTION, B_MIN } kind;
    uint64_t bytes;
    int64_t num, den;
    char text[32];
};

static enum qc_status parse_budgets(const char *s, struct budget_spec *v, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || len >= sizeof v->text || *n >= MAX_BUDGETS)
            return qc_errorf(QC_ERR_INVALID,
                             "bench memory: --budgets '%s': expected up to %d entries like "
                             "0,1/8,min,0.48GiB",
                             s, MAX_BUDGETS);
        struct budget_spec *b = &v[(*n)++];
        memset(b, 0, sizeof *b);
        memcpy(b->text, p, len);
        long long num = 0, den = 0;
        char tail = 0;
        if (strcmp(b->text, "min") == 0) {
            b->kind = B_MIN;
        } else if (sscanf(b->text, "%lld/%lld%c", &num, &den, &tail) == 2) {
            if (num < 1 || den < 1)
                return qc_errorf(QC_ERR_INVALID, "bench memory: --budgets: bad fraction '%s'",
                                 b->text);
            b->kind = B_FRACTION;
            b->num = num;
            b->den = den;
        } else {
            b->kind = B_BYTES;
            QC_TRY(qc_parse_size(b->text, &b->bytes));
        }
        p = end ? end + 1 : p + len;
    }
    if (*n == 0)
        return qc_errorf(QC_ERR_INVALID, "bench memory: --budgets is empty");
    return QC_OK;
}

struct run_result {
    uint64_t budget, measured_peak, predicted_peak, reserved_peak;
    double step_s, cpu_s, host, nvme, recomputed, stall_s, plan_ms;
    int64_t replans, splits;
    uint64_t retries, maps; /* the allocator's cache releases and raw maps, the whole run */
};

/* CPU seconds the process has used (every thread). */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* One run of cfg under budget in a fresh folder (cost: a plan_cost.json to start from, or
 * NULL); keep_cost: where to copy the run's calibrated cost model (or NULL). */
static enum qc_status run_one(const struct qc_config *base, const char *const *data, int ndata,
                              uint64_t budget, int64_t warmup, int64_t repeats, const char *cost,
                              const char *keep_cost, struct run_result *r)
{
    struct qc_config cfg = *base;
    cfg.device_budget = budget;
    memset(r, 0, sizeof *r);
    r->budget = budget;
    struct qc_bench_run run;
    QC_TRY(qc_bench_run_folder("memory", &run));
    char path[256];
    snprintf(path, sizeof path, "%s/plan_cost.json", run.dir);
    enum qc_status st = cost ? qc_bench_copy_file(cost, path) : QC_OK;
    const struct qc_train_opts to = {.cfg = &cfg, .data = data, .ndata = ndata};
    if (st == QC_OK)
        st = qc_bench_run_trainer(&run, &to, 0);
    struct qc_trainer *t = run.t;
    for (int64_t i = 0; st == QC_OK && i < warmup + repeats; i++) {
        struct qc_step_metrics m;
        const double c0 = cpu_seconds();
        st = qc_trainer_step(t, &m);
        if (st != QC_OK || i < warmup)
            continue;
        r->cpu_s += (cpu_seconds() - c0) / (double)repeats;
        r->step_s += m.step_s / (double)repeats;
        r->host += (double)m.offload_host_bytes / (double)repeats;
        r->nvme += (double)m.offload_nvme_bytes / (double)repeats;
        r->recomputed += (double)m.recompute_bytes / (double)repeats;
        r->stall_s += m.prefetch_stall_s / (double)repeats;
        r->plan_ms += m.plan_ms / (double)repeats;
        r->replans += m.replans;
        r->splits += m.splits;
        if (m.peak_active_bytes > r->measured_peak)
            r->measured_peak = m.peak_active_bytes;
        if (m.predicted_peak_bytes > r->predicted_peak)
            r->predicted_peak = m.predicted_peak_bytes;
    }
    if (st == QC_OK) {
        struct qc_alloc_stats as;
        qc_alloc_stats_get(qc_trainer_alloc(t), &as);
        r->reserved_peak = as.bytes_reserved_peak;
        r->retries = as.n_retries;
        r->maps = as.n_maps;
        if (keep_cost)
            st = qc_plan_cost_save(qc_trainer_plan_cost(t), keep_cost);
    }
    qc_bench_run_end(&run);
    return st;
}

/* The smallest plan's peak over the timed batches (planner session, cost from cost_path). */
static enum qc_status min_plan(const struct qc_config *cfg, const char *const *data, int ndata,
                               const char *cost_path, int64_t warmup, int64_t repeats,
                               uint64_t *out)
{
    struct qc_config c = *cfg;
    c.device_budget = 1; /* nothing fits: the search ends at its smallest peak */
    c.plan_policy = QC_PLAN_AUTO;
    struct qc_train_planner *pl = NULL;
    QC_TRY(qc_train_planner_create(&c, data, ndata, cost_path, &pl));
    const int64_t nscenes = qc_train_planner_scenes(pl);
    enum qc_status st = QC_OK;
    *out = 0;
    for (int64_t s = warmup; s < warmup + repeats && st == QC_OK; s++) {
        /* the unshuffled run's batch s (the files cycle by epochs of whole batches) */
        int64_t first = s * cfg->batch_size;
        if (nscenes > 0) {
            const int64_t per_epoch = nscenes / cfg->batch_size;
            first = per_epoch > 0 ? (s % per_epoch) * cfg->batch_size : 0;
        }
        struct qc_plan_result r;
        st = qc_train_planner_plan_at(pl, first, cfg->batch_size, &r, NULL);
        if (st == QC_OK) {
            if (r.peak > *out)
                *out = r.peak;
            qc_plan_result_free(&r);
        }
    }
    qc_train_planner_destroy(pl);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0 .. n) (NaN for none). */
static double median(const double *v, int64_t n)
{
    double t[MAX_ROUNDS];
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i]))
            t[k++] = v[i];
    if (k == 0)
        return (double)NAN;
    qsort(t, (size_t)k, sizeof t[0], cmp_double);
    return k % 2 ? t[k / 2] : 0.5 * (t[k / 2 - 1] + t[k / 2]);
}

static void add_num_or_null(cJSON *o, const char *key, double v, bool present)
{
    if (present && isfinite(v))
        cJSON_AddNumberToObject(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

enum qc_status qc_bench_memory(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_config cfg = cli->cfg;
    struct qc_cli_strings data = {0};
    bool json = false;
    int64_t batch_size = cfg.batch_size, warmup = 1, repeats = 1, rounds = 1;
    const char *budgets = "0,1/2,1/4,1/8,1/16,min";
    char d_bs[32];
    snprintf(d_bs, sizeof d_bs, "%" PRId64, batch_size);
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "", "qcshard file(s); none: generated scenes"},
        {"batch-size", QC_CLI_INT, &batch_size, d_bs, "scenes per step (one group)"},
        {"budgets", QC_CLI_STRING, &budgets, "0,1/2,1/4,1/8,1/16,min",
         "device budgets: sizes (0 = unconstrained), fractions of the unconstrained peak, min"},
        {"warmup", QC_CLI_INT, &warmup, "1", "untimed steps first (the first plans calibrate)"},
        {"repeats", QC_CLI_INT, &repeats, "1", "timed steps per budget"},
        {"rounds", QC_CLI_INT, &rounds, "1",
         "times the whole list runs (unconstrained and budgets alternating); times are medians"},
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench memory", memory_usage, memory_summary, opts,
                        (int)(sizeof opts / sizeof opts[0]), argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    if (batch_size < 1 || warmup < 0 || repeats < 1 || rounds < 1 || rounds > MAX_ROUNDS)
        return qc_errorf(QC_ERR_INVALID,
                         "bench memory: --batch-size and --repeats must be >= 1, --warmup >= 0, "
                         "--rounds 1 to %d",
                         MAX_ROUNDS);
    struct budget_spec spec[MAX_BUDGETS];
    int nspec = 0;
    QC_TRY(parse_budgets(budgets, spec, &nspec));
    cfg.batch_size = batch_size;
    cfg.grad_accum = 1;
    cfg.shuffle = false;
    cfg.plan_policy = QC_PLAN_AUTO;
    cfg.steps = warmup + repeats;
    cfg.epochs = 0;
    cfg.save_every = 0;
    cfg.synthetic_scenes = batch_size * (warmup + repeats);

    bool want_unconstrained = false;
    for (int i = 0; i < nspec; i++)
        if ((spec[i].kind == B_BYTES && spec[i].bytes == 0) || spec[i].kind == B_FRACTION)
            want_unconstrained = true;
    FILE *o = json ? stderr : stdout;
    char cost_path[] = "/tmp/qctrain-bench-memory-cost-XXXXXX";
    const int fd = mkstemp(cost_path);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO, "bench memory: cannot create a temporary file in /tmp");
    close(fd);
    bool have_cost = false;
    /* per round: the unconstrained run and every budget's; figures from the first round,
     * times the medians over the rounds (budget and unconstrained runs alternate, so a change
     * of the machine's load hits both) */
    struct run_result base[MAX_ROUNDS] = {{0}}, res[MAX_BUDGETS][MAX_ROUNDS];
    uint64_t budget[MAX_BUDGETS] = {0};
    int min_tries[MAX_BUDGETS] = {0}; /* budgets raised by 5 % before min ran */
    char err[MAX_BUDGETS][512];
    memset(res, 0, sizeof res);
    memset(err, 0, sizeof err);
    uint64_t min_peak = 0;
    struct qc_plan_params pp;
    qc_train_plan_params(&cfg, &pp);
    enum qc_status st = QC_OK;
    for (int64_t round = 0; round < rounds && st == QC_OK; round++) {
        if (want_unconstrained) {
            st = run_one(&cfg, data.v, data.n, 0, warmup, repeats, NULL,
                         round == 0 ? cost_path : NULL, &base[round]);
            have_cost = have_cost || st == QC_OK;
            if (st == QC_OK) {
                char a[32];
                qc_format_bytes(base[round].measured_peak, a, sizeof a);
                fprintf(o, "memory round %" PRId64 " unconstrained: peak %s, %.3f s/step\n",
                        round + 1, a, base[round].step_s);
                fflush(o);
            }
        }
        for (int i = 0; round == 0 && i < nspec && st == QC_OK; i++)
            if (spec[i].kind == B_MIN && min_peak == 0)
                st = min_plan(&cfg, data.v, data.n, have_cost ? cost_path : NULL, warmup, repeats,
                              &min_peak);
        for (int i = 0; i < nspec && st == QC_OK; i++) {
            if (round == 0) {
                budget[i] = spec[i].bytes;
                if (spec[i].kind == B_FRACTION)
                    budget[i] =
                        base[0].measured_peak * (uint64_t)spec[i].num / (uint64_t)spec[i].den;
                else if (spec[i].kind == B_MIN)
                    budget[i] = (uint64_t)ceil((double)min_peak / (1.0 - pp.margin));
            }
            if (err[i][0])
                continue;
            if (budget[i] == 0 && spec[i].kind == B_BYTES) {
                res[i][round] = base[round];
                continue;
            }
            st = run_one(&cfg, data.v, data.n, budget[i], warmup, repeats,
                         have_cost ? cost_path : NULL, NULL, &res[i][round]);
            /* min: the minimum plan's budget may not hold what the allocator's fragmentation
             * adds; the smallest budget that runs, in steps of 5 % */
            for (int k = 0;
                 round == 0 && spec[i].kind == B_MIN && st == QC_ERR_NOMEM && k < MIN_TRIES; k++) {
                budget[i] = (uint64_t)ceil((double)budget[i] * 1.05);
                min_tries[i]++;
                st = run_one(&cfg, data.v, data.n, budget[i], warmup, repeats,
                             have_cost ? cost_path : NULL, NULL, &res[i][round]);
            }
            if (st == QC_ERR_NOMEM || st == QC_ERR_INVALID) {
                /* a scene that does not fit even alone: a figure too, not a failure */
                snprintf(err[i], sizeof err[i], "%s", qc_error_last());
                st = QC_OK;
                continue;
            }
            if (st == QC_OK) {
                char b[32];
                qc_format_bytes(budget[i], b, sizeof b);
                fprintf(o, "memory round %" PRId64 " budget %s: %.3f s/step\n", round + 1, b,
                        res[i][round].step_s);
                fflush(o);
            }
        }
    }

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "memory");
    cJSON_AddStringToObject(root, "preset", cli->preset ? cli->preset : "(defaults)");
    cJSON_AddStringToObject(root, "device", qc_train_device_str(cfg.device_kind));
    cJSON_AddNumberToObject(root, "batch_size", (double)batch_size);
    cJSON_AddNumberToObject(root, "warmup", (double)warmup);
    cJSON_AddNumberToObject(root, "repeats", (double)repeats);
    cJSON_AddNumberToObject(root, "rounds", (double)rounds);
    cJSON_AddStringToObject(root, "data", data.n ? data.v[0] : "generated");
    cJSON_AddStringToObject(root, "nvme_dir", cfg.offload_nvme_dir);
    add_num_or_null(root, "unconstrained_peak_bytes", (double)base[0].measured_peak,
                    want_unconstrained);
    add_num_or_null(root, "min_plan_peak_bytes", (double)min_peak, min_peak > 0);
    cJSON *arr = cJSON_AddArrayToObject(root, "runs");
    for (int i = 0; i < nspec && st == QC_OK; i++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "budget", spec[i].text);
        cJSON_AddNumberToObject(j, "budget_bytes", (double)budget[i]);
        if (spec[i].kind == B_MIN)
            cJSON_AddNumberToObject(j, "min_raised", (double)min_tries[i]);
        char b[32];
        qc_format_bytes(budget[i], b, sizeof b);
        if (err[i][0]) {
            cJSON_AddStringToObject(j, "error", err[i]);
            cJSON_AddItemToArray(arr, j);
            fprintf(o, "memory budget %-8s (%s): %s\n", spec[i].text, budget[i] ? b : "none",
                    err[i]);
            continue;
        }
        const struct run_result *r = &res[i][0];
        double step[MAX_ROUNDS], cpu[MAX_ROUNDS], ratio[MAX_ROUNDS], cratio[MAX_ROUNDS];
        for (int64_t k = 0; k < rounds; k++) {
            step[k] = res[i][k].step_s;
            cpu[k] = res[i][k].cpu_s;
            ratio[k] = base[k].step_s > 0 ? res[i][k].step_s / base[k].step_s : (double)NAN;
            cratio[k] = base[k].cpu_s > 0 ? res[i][k].cpu_s / base[k].cpu_s : (double)NAN;
        }
        const double step_s = median(step, rounds), time_ratio = median(ratio, rounds);
        cJSON_AddNumberToObject(j, "measured_peak_bytes", (double)r->measured_peak);
        cJSON_AddNumberToObject(j, "predicted_peak_bytes", (double)r->predicted_peak);
        cJSON_AddNumberToObject(j, "step_s", step_s);
        add_num_or_null(j, "time_ratio", time_ratio, want_unconstrained);
        cJSON_AddNumberToObject(j, "host_bytes", r->host);
        cJSON_AddNumberToObject(j, "nvme_bytes", r->nvme);
        cJSON_AddNumberToObject(j, "recomputed_bytes", r->recomputed);
        cJSON_AddNumberToObject(j, "cpu_s", median(cpu, rounds));
        add_num_or_null(j, "cpu_ratio", median(cratio, rounds), want_unconstrained);
        cJSON *steps = cJSON_AddArrayToObject(j, "step_s_rounds");
        for (int64_t k = 0; k < rounds; k++)
            cJSON_AddItemToArray(steps, cJSON_CreateNumber(step[k]));
        cJSON_AddNumberToObject(j, "reserved_peak_bytes", (double)r->reserved_peak);
        cJSON_AddNumberToObject(j, "prefetch_stall_s", r->stall_s);
        cJSON_AddNumberToObject(j, "plan_ms", r->plan_ms);
        cJSON_AddNumberToObject(j, "replans", (double)r->replans);
        cJSON_AddNumberToObject(j, "splits", (double)r->splits);
        cJSON_AddNumberToObject(j, "alloc_retries", (double)r->retries);
        cJSON_AddNumberToObject(j, "alloc_maps", (double)r->maps);
        cJSON_AddItemToArray(arr, j);
        char mp[32], ps[32], h[32], n[32], rc[32];
        qc_format_bytes(r->measured_peak, mp, sizeof mp);
        qc_format_bytes(r->predicted_peak, ps, sizeof ps);
        qc_format_bytes((uint64_t)r->host, h, sizeof h);
        qc_format_bytes((uint64_t)r->nvme, n, sizeof n);
        qc_format_bytes((uint64_t)r->recomputed, rc, sizeof rc);
        fprintf(o,
                "memory budget %-8s (%s): peak %s (predicted %s, %+.1f %%), %.3f s/step (%.2fx), "
                "host %s, NVMe %s, recomputed %s, re-plans %" PRId64 ", splits %" PRId64 "\n",
                spec[i].text, budget[i] ? b : "none", mp, ps,
                r->measured_peak
                    ? 100.0 * ((double)r->predicted_peak / (double)r->measured_peak - 1)
                    : 0.0,
                step_s, isfinite(time_ratio) ? time_ratio : 0.0, h, n, rc, r->replans, r->splits);
        fflush(o);
    }
    if (st == QC_OK && json) {
        char *s = cJSON_PrintUnformatted(root);
        if (s) {
            printf("%s\n", s);
            free(s);
        }
    }
    cJSON_Delete(root);
    remove(cost_path);
    return st;
}
