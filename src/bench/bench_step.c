/*
 * bench_step.c — `qctrain bench step [--preset qcnet-av2] [--device cpu|cuda|emu] [--data
 * FILE...] [--json] [--quick] [--threads 1,2] [--rounds N]`: whole training steps (loader →
 * forward → loss → backward → AdamW) on synthetic scenes (batches of 1 and 4 typical and dense
 * scenes) or on the scenes of --data, for both attention implementations: step time,
 * samples/s, the allocator's peak (parameters, activations, stashes and AdamW state: device
 * memory on cuda, host RAM standing in for it on cpu) and the process's peak RSS. A benchmark,
 * never a test: it prints figures and gates nothing.
 *
 * Each configuration is a fresh training run (qc_trainer, the code path of `qctrain train`,
 * on the backend of --device / device.kind) in a temporary folder: `--warmup` untimed steps,
 * then `--repeats` timed ones. On cuda a timed step is the wall time of qc_trainer_step up to
 * the end of its device work (the model's stream synchronized after the step); emu runs the
 * device path on the CPU ops for checking, not for figures. At AV2 size a
 * step takes many seconds on a small CPU, so the repeat counts are small (default 1 + 2;
 * --quick: 0 + 1). peak_rss_bytes is the process's high water mark since the configuration
 * started (reset through /proc/self/clear_refs where the kernel allows it, else the
 * process-wide maximum, flagged "rss_reset": false).
 *
 * On a machine shared with other work, one run of each configuration says little: --rounds N
 * repeats the whole sweep N times, the configurations interleaved (round 1: A, B, C; round 2:
 * A, B, C; ...), and each figure is the median of every timed step of its configuration
 * (step_s; step_s_min/max and steps_timed beside it). --threads runs each configuration with
 * each OpenMP / OpenBLAS thread count of the list (CPU); the summary then gives the scaling
 * efficiency t(1) / (n · t(n)) and, where both ran, the fused / unfused step-time ratio.
 * --precision fp32,bf16,fp16 runs each configuration in each train.precision
 * (docs/PRECISION.md); the summary then gives each one's peak device bytes and samples/s
 * relative to fp32's.
 *
 * GEMM efficiency and the floor (issue 29): after the timed steps of each configuration and
 * round, one more step runs with the profiler on (qc_prof), and its GEMMs' FLOPs and wall time
 * are set against an SGEMM of 2048^3 timed on the same backend and threads (the reference rate
 * of `qctrain profile`, measured once per configuration): gemm_efficiency = achieved GEMM
 * GFLOP/s / that peak, floor_s = the step's GEMM FLOPs at the peak (the step if nothing but its
 * GEMMs ran, at the peak), floor_ratio = step_s / floor_s. The profiled step is not a timed one.
 *
 * "Device" memory is host RAM on the cpu and emu backends, so the allocator runs under a
 * budget (--budget; default device.budget, or half the physical RAM); on cuda the default is
 * device.budget (0 = the whole device). A configuration that does not fit is reported as
 * {"error": "out of memory under the budget"} and the bench goes on. Under --json the
 * per-configuration lines go to stderr as they complete, the object to stdout; the object's
 * "device" names the backend (and "gpu" the CUDA device).
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <omp.h>

#include <cjson/cJSON.h>

#include "bench_common.h"
#include "qc_alloc.h"
#include "qc_config.h"
#include "qc_device.h"
#include "qc_exec.h"
#include "qc_half.h"
#include "qc_kernels.h" /* qc_kernels_cpu_set_blas_threads */
#include "qc_prof.h"
#include "qc_profile.h" /* the SGEMM peak, the profiled step's GEMMs */
#include "qc_progress.h"
#include "qc_train.h"

static const char step_usage[] =
    "[--device cpu|cuda|emu] [--data FILE...] [--json] [--quick] [--repeats N] [--warmup N] "
    "[--rounds N] [--threads 1,2] [--batch-sizes 1,4] [--profiles typical,dense] "
    "[--attention fused,unfused] [--precision fp32,bf16,fp16]";
static const char step_summary[] =
    "Whole training steps on synthetic scenes, or on the scenes of --data: step time (median), "
    "samples/s, the GEMMs' share of the SGEMM peak (one more step, profiled) and the step over "
    "its GEMM floor, allocator peak and peak RSS for each batch size x scene profile x attention "
    "implementation x thread count (use --preset qcnet-av2 for AV2 size) on the backend of "
    "--device; --rounds repeats the sweep with the configurations interleaved.";

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Resets the kernel's peak-RSS counter (VmHWM); false when not possible. */
static bool rss_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return false;
    const bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* VmHWM in bytes (ru_maxrss when /proc is not there). */
static uint64_t rss_peak(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof(line), f)) {
            unsigned long long kb;
            if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
                fclose(f);
                return (uint64_t)kb * 1024u;
            }
        }
        fclose(f);
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_maxrss * 1024u;
}

/* Parses "1,4" into up to max positive integers. */
static enum qc_status parse_ints(const char *s, const char *opt, int64_t *v, int max, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        const long long x = strtoll(p, &end, 10);
        if (end == p || x < 1 || *n >= max || (*end && *end != ','))
            return qc_errorf(QC_ERR_INVALID, "bench step: --%s '%s': expected a list like 1,4", opt,
                             s);
        v[(*n)++] = x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0)
        return qc_errorf(QC_ERR_INVALID, "bench step: --%s is empty", opt);
    return QC_OK;
}

/* The choices of the configuration's option `key` (NULL-terminated, index = the enum's value). */
static const char *const *config_choices(const char *key)
{
    const struct qc_config_option *o = qc_config_option_find(key);
    QC_ASSERT(o && o->choices, "bench step: %s is not a choice of the configuration", key);
    return o->choices;
}

/* Parses a comma-separated list of names of `names` (NULL-terminated, index = the enum's value)
 * into v[cap] (their indices, at most cap of them). */
static enum qc_status parse_names(const char *s, const char *opt, const char *const *names, int cap,
                                  int *v, int *n)
{
    int nnames = 0;
    while (names[nnames])
        nnames++;
    *n = 0;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < nnames; i++)
            if (strlen(names[i]) == len && strncmp(p, names[i], len) == 0)
                found = i;
        if (found < 0 || *n >= cap)
            return qc_errorf(QC_ERR_INVALID, "bench step: --%s '%s': unknown or repeated entry",
                             opt, s);
        v[(*n)++] = found;
        p = end ? end + 1 : p + len;
    }
    if (*n == 0)
        return qc_errorf(QC_ERR_INVALID, "bench step: --%s is empty", opt);
    return QC_OK;
}

#define STEP_MAX_TIMED 256 /* timed steps kept per configuration (rounds x repeats) */

struct step_result {
    double loss;
    uint64_t peak_device_bytes, reserved_peak_bytes, peak_rss_bytes;
    int64_t params;
    bool rss_reset, oom;
    int ntimed;
    double timed[STEP_MAX_TIMED]; /* s, every timed step of every round */
    double sgemm_gflops;          /* the SGEMM peak on this configuration's threads */
    double gemm_flops;            /* GEMM FLOPs of one step (the profiled step) */
    int ngemm;
    double gemm_s[STEP_MAX_TIMED]; /* the profiled step's GEMM wall seconds, one per round */
};

/* The scenes of one run: --data files, or none (synthetic). */
struct step_data {
    const char *const *files;
    int n;
};

/* Sets the OpenMP and OpenBLAS thread counts of the ops (0: leave them). */
static void set_threads(int64_t n)
{
    if (n <= 0)
        return;
    omp_set_num_threads((int)n);
    qc_kernels_cpu_set_blas_threads((int)n);
}

/* One profiled step of an open trainer: its GEMMs' FLOPs and wall seconds into r (and the SGEMM
 * peak, the first time). */
static enum qc_status gemm_measure(struct qc_trainer *t, const struct qc_exec *ex,
                                   struct step_result *r)
{
    struct qc_profile_peaks pk = {0};
    if (r->sgemm_gflops <= 0) {
        QC_TRY(qc_profile_peaks_measure(ex, qc_trainer_alloc(t), 2048, &pk));
        r->sgemm_gflops = pk.gemm_gflops_n;
    }
    enum qc_status st = qc_bench_profiled_steps(t, 0, 1);
    struct qc_profile_summary *sum = NULL;
    if (st == QC_OK)
        st = qc_profile_summary_create(&pk, 1, &sum);
    if (st == QC_OK) {
        double secs = 0;
        qc_profile_summary_gemm(sum, &r->gemm_flops, &secs);
        if (r->ngemm < STEP_MAX_TIMED)
            r->gemm_s[r->ngemm++] = secs;
    }
    qc_profile_summary_destroy(sum);
    qc_prof_reset();
    return st;
}

static enum qc_status bench_one(const struct qc_config *base, const struct step_data *data,
                                enum qc_scene_profile profile, int64_t batch,
                                enum qc_attention_impl attn, int prec, int64_t warmup,
                                int64_t repeats, struct step_result *r)
{
    struct qc_config cfg = *base;
    cfg.precision = prec;
    cfg.batch_size = batch;
    cfg.grad_accum = 1;
    cfg.synthetic_profile = profile;
    cfg.synthetic_scenes = batch * (warmup + repeats + 1);
    cfg.attention = attn;
    cfg.steps = warmup + repeats + 1; /* + the profiled step */
    cfg.save_every = 0;
    r->rss_reset = rss_reset();
    struct qc_bench_run run;
    enum qc_status st = qc_bench_run_start(&cfg, "step", data->files, data->n, warmup, &run);
    struct qc_trainer *t = run.t;
    double loss = 0;
    const struct qc_exec *ex = st == QC_OK ? qc_qcnet_exec(qc_trainer_model(t)) : NULL;
    if (st == QC_OK && qc_exec_is_device(ex))
        st = qc_op_sync(ex); /* the warm-up's device work is not timed */
    for (int64_t i = 0; st == QC_OK && i < repeats; i++) {
        struct qc_step_metrics m;
        const double t0 = wall_s();
        st = qc_trainer_step(t, &m);
        if (st == QC_OK && qc_exec_is_device(ex))
            st = qc_op_sync(ex); /* up to the end of the step's device work (AdamW included) */
        if (st != QC_OK)
            break;
        if (r->ntimed < STEP_MAX_TIMED)
            r->timed[r->ntimed++] = qc_exec_is_device(ex) ? wall_s() - t0 : m.step_s;
        loss = m.loss;
        r->peak_device_bytes =
            m.peak_device_bytes > r->peak_device_bytes ? m.peak_device_bytes : r->peak_device_bytes;
    }
    if (st == QC_OK) {
        struct qc_alloc_stats as;
        qc_alloc_stats_get(qc_trainer_alloc(t), &as);
        r->reserved_peak_bytes = as.bytes_reserved_peak > r->reserved_peak_bytes
                                     ? as.bytes_reserved_peak
                                     : r->reserved_peak_bytes;
        r->params = qc_qcnet_num_params(qc_trainer_model(t));
        r->loss = loss;
        const uint64_t rss = rss_peak();
        r->peak_rss_bytes = rss > r->peak_rss_bytes ? rss : r->peak_rss_bytes;
    }
    /* after the memory figures (the SGEMM's buffers are no part of a step); an SGEMM that does
     * not fit the budget leaves the configuration without GEMM figures, not out of memory */
    if (st == QC_OK) {
        const enum qc_status gs = gemm_measure(t, ex, r);
        st = gs == QC_ERR_NOMEM ? QC_OK : gs;
    }
    qc_bench_run_end(&run);
    return st;
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    if (n == 0)
        return 0;
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One configuration of the sweep and what its rounds measured. */
struct step_cfg {
    int prof;               /* index into prof_names (-1: --data) */
    int64_t batch;          /* scenes per step */
    int attn;               /* enum qc_attention_impl */
    int64_t threads;        /* OpenMP / BLAS threads (0: as set) */
    enum qc_precision prec; /* train.precision */
    struct step_result r;
    double step_s; /* median of r.timed */
};

/* A configuration's GEMM figures (file comment); ok false when nothing was measured. */
struct gemm_figures {
    bool ok;
    double gemm_s;  /* median over rounds of the profiled step's GEMM wall seconds */
    double gflops;  /* achieved GEMM GFLOP/s */
    double eff;     /* gflops / the SGEMM peak */
    double floor_s; /* the step's GEMM FLOPs at the SGEMM peak */
    double ratio;   /* step_s / floor_s */
};

static struct gemm_figures gemm_figures_of(const struct step_cfg *c)
{
    struct gemm_figures g = {0};
    double tmp[STEP_MAX_TIMED];
    memcpy(tmp, c->r.gemm_s, (size_t)c->r.ngemm * sizeof *tmp);
    g.gemm_s = median(tmp, c->r.ngemm);
    if (g.gemm_s <= 0 || c->r.gemm_flops <= 0 || c->r.sgemm_gflops <= 0 || c->step_s <= 0)
        return g;
    g.ok = true;
    g.gflops = c->r.gemm_flops / g.gemm_s * 1e-9;
    g.eff = g.gflops / c->r.sgemm_gflops;
    g.floor_s = c->r.gemm_flops * 1e-9 / c->r.sgemm_gflops;
    g.ratio = c->step_s / g.floor_s;
    return g;
}

static void add_result_json(cJSON *arr, const struct step_cfg *c, const char *pname,
                            const char *aname)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "profile", pname);
    cJSON_AddNumberToObject(j, "batch", (double)c->batch);
    cJSON_AddStringToObject(j, "attention", aname);
    cJSON_AddStringToObject(j, "precision", qc_precision_str(c->prec));
    if (c->threads > 0)
        cJSON_AddNumberToObject(j, "threads", (double)c->threads);
    if (c->r.oom) {
        cJSON_AddStringToObject(j, "error", "out of memory under the budget");
        cJSON_AddItemToArray(arr, j);
        return;
    }
    double lo = c->r.timed[0], hi = c->r.timed[0];
    for (int i = 1; i < c->r.ntimed; i++) {
        lo = c->r.timed[i] < lo ? c->r.timed[i] : lo;
        hi = c->r.timed[i] > hi ? c->r.timed[i] : hi;
    }
    cJSON_AddNumberToObject(j, "samples_per_s", c->step_s > 0 ? (double)c->batch / c->step_s : 0);
    cJSON_AddNumberToObject(j, "step_s", c->step_s);
    cJSON_AddNumberToObject(j, "step_s_min", lo);
    cJSON_AddNumberToObject(j, "step_s_max", hi);
    cJSON_AddNumberToObject(j, "steps_timed", c->r.ntimed);
    cJSON_AddNumberToObject(j, "peak_device_bytes", (double)c->r.peak_device_bytes);
    cJSON_AddNumberToObject(j, "reserved_peak_bytes", (double)c->r.reserved_peak_bytes);
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)c->r.peak_rss_bytes);
    cJSON_AddBoolToObject(j, "rss_reset", c->r.rss_reset);
    cJSON_AddNumberToObject(j, "loss", c->r.loss);
    const struct gemm_figures g = gemm_figures_of(c);
    if (g.ok) {
        cJSON_AddNumberToObject(j, "gemm_flops", c->r.gemm_flops);
        cJSON_AddNumberToObject(j, "gemm_s", g.gemm_s);
        cJSON_AddNumberToObject(j, "gemm_gflops", g.gflops);
        cJSON_AddNumberToObject(j, "sgemm_peak_gflops", c->r.sgemm_gflops);
        cJSON_AddNumberToObject(j, "gemm_efficiency", g.eff);
        cJSON_AddNumberToObject(j, "floor_s", g.floor_s);
        cJSON_AddNumberToObject(j, "floor_ratio", g.ratio);
    }
    cJSON_AddItemToArray(arr, j);
}

/* The configuration of (prof, batch, attn, threads, prec), or NULL. */
static const struct step_cfg *find_cfg(const struct step_cfg *v, int n, int prof, int64_t batch,
                                       int attn, int64_t threads, enum qc_precision prec)
{
    for (int i = 0; i < n; i++)
        if (v[i].prof == prof && v[i].batch == batch && v[i].attn == attn &&
            v[i].threads == threads && v[i].prec == prec && !v[i].r.oom && v[i].r.ntimed > 0)
            return &v[i];
    return NULL;
}

enum qc_status qc_bench_step(struct qc_cli *cli, int argc, char **argv)
{
    bool json = false, quick = false;
    const bool cuda = cli->cfg.device_kind == QC_CONFIG_DEVICE_CUDA;
    uint64_t budget = cli->cfg.device_budget;
    if (budget == 0 && !cuda) /* "device" memory is host RAM here: keep the machine alive */
        budget = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) / 2;
    int64_t repeats = 2, warmup = 1, rounds = 1;
    const char *bs_list = "1,4", *prof_list = "typical,dense", *attn_list = "fused,unfused";
    const char *thr_list = "";
    char prec_default[8];
    snprintf(prec_default, sizeof prec_default, "%s", qc_precision_str(cli->cfg.precision));
    const char *prec_list = prec_default;
    struct qc_cli_strings data = {0};
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
        {"quick", QC_CLI_FLAG, &quick, "", "no warm-up step and one timed step per configuration"},
        {"data", QC_CLI_STRINGS, &data, "",
         "qcshard file(s): their scenes instead of synthetic ones (--profiles is then unused)"},
        {"repeats", QC_CLI_INT, &repeats, "2", "timed steps per configuration and round"},
        {"warmup", QC_CLI_INT, &warmup, "1", "untimed steps first"},
        {"rounds", QC_CLI_INT, &rounds, "1",
         "sweeps of every configuration, interleaved; figures are medians over all rounds"},
        {"threads", QC_CLI_STRING, &thr_list, "the OpenMP default",
         "OpenMP / OpenBLAS thread counts, comma-separated (cpu): a configuration each"},
        {"batch-sizes", QC_CLI_STRING, &bs_list, "1,4", "scenes per batch, comma-separated"},
        {"profiles", QC_CLI_STRING, &prof_list, "typical,dense", "scene profiles"},
        {"attention", QC_CLI_STRING, &attn_list, "fused,unfused", "attention implementations"},
        {"precision", QC_CLI_STRING, &prec_list, "train.precision",
         "train.precision values, comma-separated (fp32,bf16,fp16): a configuration each"},
        {"budget", QC_CLI_SIZE, &budget, "device.budget, or half the RAM on cpu/emu",
         "allocator budget; a configuration that does not fit is reported as out of memory"},
    };
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("bench step", step_usage, step_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, pos, QC_CLI_STRINGS_MAX,
                        &npos, &help));
    if (help)
        return QC_OK;
    struct qc_config scratch_cfg = cli->cfg;
    QC_TRY(qc_train_cli_finish("bench step", pos, npos, &data, NULL, &scratch_cfg));
    if (quick) {
        repeats = 1;
        warmup = 0;
    }
    if (repeats < 1 || warmup < 0 || rounds < 1 || rounds * repeats > STEP_MAX_TIMED)
        return qc_errorf(QC_ERR_INVALID,
                         "bench step: --repeats and --rounds must be >= 1 (at "
                         "most %d timed steps in all), --warmup >= 0",
                         STEP_MAX_TIMED);
    int64_t bsz[8], thr[8] = {0};
    int nbs = 0, nthr = 1;
    QC_TRY(parse_ints(bs_list, "batch-sizes", bsz, 8, &nbs));
    if (thr_list[0]) {
        if (cuda)
            return qc_errorf(QC_ERR_INVALID, "bench step: --threads is for the CPU backends");
        QC_TRY(parse_ints(thr_list, "threads", thr, 8, &nthr));
    }
    /* the configuration's names: train.precision, data.synthetic_profile, model.attention */
    const char *const *prof_names = config_choices("data.synthetic_profile");
    const char *const *attn_names = config_choices("model.attention");
    int profs[3], attns[2], precs[QC_PREC_COUNT];
    int nprof = 0, nattn = 0, nprec = 0;
    QC_TRY(parse_names(prec_list, "precision", qc_precision_names, QC_PREC_COUNT, precs, &nprec));
    QC_TRY(parse_names(prof_list, "profiles", prof_names, 3, profs, &nprof));
    QC_TRY(parse_names(attn_list, "attention", attn_names, 2, attns, &nattn));
    const struct step_data sd = {data.v, data.n};
    if (data.n > 0) { /* the files' scenes: one "profile" */
        nprof = 1;
        profs[0] = -1;
    }

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "step");
    cJSON_AddStringToObject(root, "preset", cli->preset ? cli->preset : "(defaults)");
    cJSON_AddStringToObject(root, "device", qc_train_device_str(cli->cfg.device_kind));
    if (cuda) { /* which GPU the figures are of */
        struct qc_device *dev = NULL;
        struct qc_device_props props;
        enum qc_status dst = qc_device_create(QC_DEVICE_CUDA, (int)cli->cfg.device_ordinal, &dev);
        if (dst == QC_OK)
            dst = qc_device_props_get(dev, &props);
        qc_device_destroy(dev);
        if (dst != QC_OK) {
            cJSON_Delete(root);
            return dst;
        }
        cJSON_AddStringToObject(root, "gpu", props.name);
        cJSON_AddNumberToObject(root, "gpu_bytes", (double)props.total_bytes);
    }
    if (data.n > 0) {
        cJSON *files = cJSON_AddArrayToObject(root, "data");
        for (int i = 0; i < data.n; i++)
            cJSON_AddItemToArray(files, cJSON_CreateString(data.v[i]));
    }
    const char *wait = getenv("OMP_WAIT_POLICY");
    cJSON_AddNumberToObject(root, "hidden_dim", (double)cli->cfg.hidden_dim);
    cJSON_AddNumberToObject(root, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(root, "omp_threads", (double)omp_get_max_threads());
    cJSON_AddStringToObject(root, "omp_wait_policy", wait ? wait : "");
    cJSON_AddNumberToObject(root, "warmup", (double)warmup);
    cJSON_AddNumberToObject(root, "repeats", (double)repeats);
    cJSON_AddNumberToObject(root, "rounds", (double)rounds);
    cJSON_AddNumberToObject(root, "budget_bytes", (double)budget);
    struct qc_config base = cli->cfg;
    base.device_budget = budget;

    const int ncfg = nprof * nbs * nthr * nattn * nprec;
    struct step_cfg *cfgs = calloc((size_t)ncfg, sizeof *cfgs);
    if (!cfgs) {
        cJSON_Delete(root);
        return qc_errorf(QC_ERR_NOMEM, "bench step: %d configurations", ncfg);
    }
    int k = 0;
    for (int ip = 0; ip < nprof; ip++)
        for (int ib = 0; ib < nbs; ib++)
            for (int it = 0; it < nthr; it++)
                for (int ia = 0; ia < nattn; ia++)
                    for (int iq = 0; iq < nprec; iq++, k++) {
                        cfgs[k].prof = profs[ip];
                        cfgs[k].batch = bsz[ib];
                        cfgs[k].threads = thr[it];
                        cfgs[k].attn = attns[ia];
                        cfgs[k].prec = precs[iq];
                    }
    const int omp0 = omp_get_max_threads(), blas0 = cuda ? 1 : qc_kernels_cpu_blas_threads();
    enum qc_status st = QC_OK;
    FILE *o = json ? stderr : stdout; /* one line per configuration and round as it completes */
    for (int64_t rd = 0; rd < rounds && st == QC_OK; rd++)
        for (int i = 0; i < ncfg && st == QC_OK; i++) {
            struct step_cfg *c = &cfgs[i];
            if (c->r.oom)
                continue;
            const char *pname = c->prof < 0 ? "data" : prof_names[c->prof];
            const char *aname = attn_names[c->attn];
            set_threads(c->threads);
            const int n0 = c->r.ntimed;
            st = bench_one(&base, &sd, c->prof < 0 ? QC_SCENE_TYPICAL : c->prof, c->batch,
                           (enum qc_attention_impl)c->attn, c->prec, warmup, repeats, &c->r);
            if (!cuda) {
                omp_set_num_threads(omp0);
                qc_kernels_cpu_set_blas_threads(blas0);
            }
            if (st == QC_ERR_NOMEM) { /* does not fit: a figure too, not a failure */
                char b[32];
                if (budget)
                    qc_format_bytes(budget, b, sizeof(b));
                else
                    snprintf(b, sizeof(b), "device's");
                c->r.oom = true;
                fprintf(o, "step %-7s B=%-2" PRId64 " %-7s %s out of memory under the %s budget\n",
                        pname, c->batch, aname, qc_precision_str(c->prec), b);
                st = QC_OK;
                continue;
            }
            if (st != QC_OK)
                break;
            double sum = 0;
            for (int j = n0; j < c->r.ntimed; j++)
                sum += c->r.timed[j];
            const double mean = c->r.ntimed > n0 ? sum / (double)(c->r.ntimed - n0) : 0;
            char a[32], b[32];
            qc_format_bytes(c->r.peak_device_bytes, a, sizeof(a));
            qc_format_bytes(c->r.peak_rss_bytes, b, sizeof(b));
            fprintf(o,
                    "step %-7s B=%-2" PRId64 " %-7s %s thr %-2" PRId64 " round %" PRId64
                    " %8.3f samples/s %7.2f s/step  device peak %-10s RSS peak %s\n",
                    pname, c->batch, aname, qc_precision_str(c->prec),
                    c->threads > 0 ? c->threads : (int64_t)omp0, rd + 1,
                    mean > 0 ? (double)c->batch / mean : 0, mean, a, b);
            fflush(o);
        }
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    cJSON *ratios = cJSON_AddArrayToObject(root, "summary");
    for (int i = 0; st == QC_OK && i < ncfg; i++) {
        struct step_cfg *c = &cfgs[i];
        double tmp[STEP_MAX_TIMED];
        memcpy(tmp, c->r.timed, (size_t)c->r.ntimed * sizeof *tmp);
        c->step_s = median(tmp, c->r.ntimed);
        add_result_json(arr, c, c->prof < 0 ? "data" : prof_names[c->prof], attn_names[c->attn]);
    }
    /* the medians, the fused/unfused ratios and the thread scaling */
    if (st == QC_OK)
        fprintf(o, "\nmedians over %" PRId64 " round(s) x %" PRId64 " step(s):\n", rounds, repeats);
    for (int i = 0; st == QC_OK && i < ncfg; i++) {
        const struct step_cfg *c = &cfgs[i];
        if (c->r.oom || c->r.ntimed == 0)
            continue;
        const char *pname = c->prof < 0 ? "data" : prof_names[c->prof];
        const int64_t nt = c->threads > 0 ? c->threads : (int64_t)omp0;
        char pk[32];
        qc_format_bytes(c->r.peak_device_bytes, pk, sizeof pk);
        fprintf(o,
                "  %-7s B=%-2" PRId64 " %-7s %s thr %-2" PRId64 " %7.3f s/step %8.3f samples/s "
                "peak %s",
                pname, c->batch, attn_names[c->attn], qc_precision_str(c->prec), nt, c->step_s,
                c->step_s > 0 ? (double)c->batch / c->step_s : 0.0, pk);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "profile", pname);
        cJSON_AddNumberToObject(j, "batch", (double)c->batch);
        cJSON_AddStringToObject(j, "attention", attn_names[c->attn]);
        cJSON_AddNumberToObject(j, "threads", (double)nt);
        cJSON_AddStringToObject(j, "precision", qc_precision_str(c->prec));
        cJSON_AddNumberToObject(j, "step_s", c->step_s);
        const struct step_cfg *f32 =
            find_cfg(cfgs, ncfg, c->prof, c->batch, c->attn, c->threads, QC_PREC_FP32);
        if (c->prec != QC_PREC_FP32 && f32 && f32->r.peak_device_bytes > 0 && c->step_s > 0) {
            const double mem = (double)c->r.peak_device_bytes / (double)f32->r.peak_device_bytes;
            fprintf(o, "  peak %.2fx fp32's, samples/s %.2fx", mem, f32->step_s / c->step_s);
            cJSON_AddNumberToObject(j, "peak_over_fp32", mem);
            cJSON_AddNumberToObject(j, "samples_per_s_over_fp32", f32->step_s / c->step_s);
        }
        const struct step_cfg *u = find_cfg(cfgs, ncfg, c->prof, c->batch, 1, c->threads, c->prec);
        if (c->attn == 0 && u && u->step_s > 0) {
            fprintf(o, "  fused/unfused %.2fx", c->step_s / u->step_s);
            cJSON_AddNumberToObject(j, "fused_over_unfused", c->step_s / u->step_s);
        }
        const struct gemm_figures g = gemm_figures_of(c);
        if (g.ok) {
            fprintf(o,
                    "  GEMM %.1f GFLOP at %.1f GFLOP/s (%.0f %% of the SGEMM peak), step %.2fx the "
                    "GEMM floor %.3f s",
                    c->r.gemm_flops * 1e-9, g.gflops, 100.0 * g.eff, g.ratio, g.floor_s);
            cJSON_AddNumberToObject(j, "gemm_efficiency", g.eff);
            cJSON_AddNumberToObject(j, "floor_s", g.floor_s);
            cJSON_AddNumberToObject(j, "floor_ratio", g.ratio);
        }
        const struct step_cfg *one = find_cfg(cfgs, ncfg, c->prof, c->batch, c->attn, 1, c->prec);
        if (nt > 1 && one && c->step_s > 0) {
            const double eff = one->step_s / ((double)nt * c->step_s);
            fprintf(o, "  speedup over 1 thread %.2fx, efficiency %.0f %%", one->step_s / c->step_s,
                    100.0 * eff);
            cJSON_AddNumberToObject(j, "scaling_efficiency", eff);
        }
        fprintf(o, "\n");
        cJSON_AddItemToArray(ratios, j);
    }
    free(cfgs);
    if (st == QC_OK && json) {
        char *str = cJSON_PrintUnformatted(root);
        if (str) {
            printf("%s\n", str);
            free(str);
        }
    }
    cJSON_Delete(root);
    return st;
}
