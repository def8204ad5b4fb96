/*
 * bench_step.c — `qctrain bench step [--preset qcnet-av2] [--device cpu|cuda|emu] [--json]
 * [--quick]`: whole training steps (loader → forward → loss → backward → AdamW) on synthetic
 * scenes, for batches of 1 and 4 typical and dense scenes and both attention implementations:
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
 * --quick: 0 + 1); treat the figures as one sample each. peak_rss_bytes is the process's high
 * water mark since the configuration started (reset through /proc/self/clear_refs where the
 * kernel allows it, else the process-wide maximum, flagged "rss_reset": false).
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

#include <cjson/cJSON.h>

#include "bench_common.h"
#include "qc_alloc.h"
#include "qc_config.h"
#include "qc_device.h"
#include "qc_exec.h"
#include "qc_progress.h"
#include "qc_train.h"

static const char step_usage[] =
    "[--device cpu|cuda|emu] [--json] [--quick] [--repeats N] [--warmup N] [--batch-sizes 1,4] "
    "[--profiles typical,dense] [--attention fused,unfused]";
static const char step_summary[] =
    "Whole training steps on synthetic scenes: samples/s, allocator peak and peak RSS for each "
    "batch size x scene profile x attention implementation (use --preset qcnet-av2 for AV2 "
    "size) on the backend of --device.";

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

/* Parses a comma-separated list of names (each of names[0..nnames)) into their indices. */
static enum qc_status parse_names(const char *s, const char *opt, const char *const *names,
                                  int nnames, int *v, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < nnames; i++)
            if (strlen(names[i]) == len && strncmp(p, names[i], len) == 0)
                found = i;
        if (found < 0 || *n >= nnames)
            return qc_errorf(QC_ERR_INVALID, "bench step: --%s '%s': unknown or repeated entry",
                             opt, s);
        v[(*n)++] = found;
        p = end ? end + 1 : p + len;
    }
    if (*n == 0)
        return qc_errorf(QC_ERR_INVALID, "bench step: --%s is empty", opt);
    return QC_OK;
}

struct step_result {
    double samples_per_s, step_s, loss;
    uint64_t peak_device_bytes, reserved_peak_bytes, peak_rss_bytes;
    int64_t params;
};

static enum qc_status bench_one(const struct qc_config *base, enum qc_scene_profile profile,
                                int64_t batch, enum qc_attention_impl attn, int64_t warmup,
                                int64_t repeats, bool *rss_was_reset, struct step_result *r)
{
    struct qc_config cfg = *base;
    cfg.batch_size = batch;
    cfg.grad_accum = 1;
    cfg.synthetic_profile = profile;
    cfg.synthetic_scenes = batch * (warmup + repeats);
    cfg.attention = attn;
    cfg.steps = warmup + repeats;
    cfg.save_every = 0;
    *rss_was_reset = rss_reset();
    memset(r, 0, sizeof(*r));
    struct qc_bench_run run;
    enum qc_status st = qc_bench_run_start(&cfg, "step", warmup, &run);
    struct qc_trainer *t = run.t;
    double secs = 0, loss = 0;
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
        secs += qc_exec_is_device(ex) ? wall_s() - t0 : m.step_s;
        loss = m.loss;
        r->peak_device_bytes =
            m.peak_device_bytes > r->peak_device_bytes ? m.peak_device_bytes : r->peak_device_bytes;
    }
    if (st == QC_OK) {
        struct qc_alloc_stats as;
        qc_alloc_stats_get(qc_trainer_alloc(t), &as);
        r->reserved_peak_bytes = as.bytes_reserved_peak;
        r->params = qc_qcnet_num_params(qc_trainer_model(t));
        r->step_s = secs / (double)repeats;
        r->samples_per_s = secs > 0 ? (double)(batch * repeats) / secs : 0;
        r->loss = loss;
        r->peak_rss_bytes = rss_peak();
    }
    qc_bench_run_end(&run);
    return st;
}

enum qc_status qc_bench_step(struct qc_cli *cli, int argc, char **argv)
{
    bool json = false, quick = false;
    const bool cuda = cli->cfg.device_kind == QC_CONFIG_DEVICE_CUDA;
    uint64_t budget = cli->cfg.device_budget;
    if (budget == 0 && !cuda) /* "device" memory is host RAM here: keep the machine alive */
        budget = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) / 2;
    int64_t repeats = 2, warmup = 1;
    const char *bs_list = "1,4", *prof_list = "typical,dense", *attn_list = "fused,unfused";
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
        {"quick", QC_CLI_FLAG, &quick, "", "no warm-up step and one timed step per configuration"},
        {"repeats", QC_CLI_INT, &repeats, "2", "timed steps per configuration"},
        {"warmup", QC_CLI_INT, &warmup, "1", "untimed steps first"},
        {"batch-sizes", QC_CLI_STRING, &bs_list, "1,4", "scenes per batch, comma-separated"},
        {"profiles", QC_CLI_STRING, &prof_list, "typical,dense", "scene profiles"},
        {"attention", QC_CLI_STRING, &attn_list, "fused,unfused", "attention implementations"},
        {"budget", QC_CLI_SIZE, &budget, "device.budget, or half the RAM on cpu/emu",
         "allocator budget; a configuration that does not fit is reported as out of memory"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench step", step_usage, step_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    if (quick) {
        repeats = 1;
        warmup = 0;
    }
    if (repeats < 1 || warmup < 0)
        return qc_errorf(QC_ERR_INVALID, "bench step: --repeats must be >= 1, --warmup >= 0");
    int64_t bsz[8];
    int nbs = 0;
    QC_TRY(parse_ints(bs_list, "batch-sizes", bsz, 8, &nbs));
    static const char *const prof_names[] = {"typical", "dense", "mixed"};
    static const char *const attn_names[] = {"fused", "unfused"}; /* enum qc_attention_impl */
    int profs[3], attns[2];
    int nprof = 0, nattn = 0;
    QC_TRY(parse_names(prof_list, "profiles", prof_names, 3, profs, &nprof));
    QC_TRY(parse_names(attn_list, "attention", attn_names, 2, attns, &nattn));

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
    cJSON_AddNumberToObject(root, "hidden_dim", (double)cli->cfg.hidden_dim);
    cJSON_AddNumberToObject(root, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(root, "warmup", (double)warmup);
    cJSON_AddNumberToObject(root, "repeats", (double)repeats);
    cJSON_AddNumberToObject(root, "budget_bytes", (double)budget);
    struct qc_config base = cli->cfg;
    base.device_budget = budget;
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    enum qc_status st = QC_OK;
    for (int ip = 0; ip < nprof && st == QC_OK; ip++)
        for (int ib = 0; ib < nbs && st == QC_OK; ib++)
            for (int ia = 0; ia < nattn && st == QC_OK; ia++) {
                struct step_result r;
                bool reset = false;
                st = bench_one(&base, (enum qc_scene_profile)profs[ip], bsz[ib],
                               (enum qc_attention_impl)attns[ia], warmup, repeats, &reset, &r);
                const char *pname = prof_names[profs[ip]];
                const char *aname = attn_names[attns[ia]];
                cJSON *j = cJSON_CreateObject();
                cJSON_AddStringToObject(j, "profile", pname);
                cJSON_AddNumberToObject(j, "batch", (double)bsz[ib]);
                cJSON_AddStringToObject(j, "attention", aname);
                if (st == QC_ERR_NOMEM) {
                    /* does not fit the budget: a figure too, not a failure of the bench */
                    char b[32];
                    if (budget)
                        qc_format_bytes(budget, b, sizeof(b));
                    else
                        snprintf(b, sizeof(b), "device's");
                    cJSON_AddStringToObject(j, "error", "out of memory under the budget");
                    cJSON_AddItemToArray(arr, j);
                    fprintf(json ? stderr : stdout,
                            "step %-7s B=%-2" PRId64 " %-7s out of memory under the %s budget\n",
                            pname, bsz[ib], aname, b);
                    st = QC_OK;
                    continue;
                }
                if (st != QC_OK) {
                    cJSON_Delete(j);
                    break;
                }
                cJSON_AddNumberToObject(j, "samples_per_s", r.samples_per_s);
                cJSON_AddNumberToObject(j, "step_s", r.step_s);
                cJSON_AddNumberToObject(j, "peak_device_bytes", (double)r.peak_device_bytes);
                cJSON_AddNumberToObject(j, "reserved_peak_bytes", (double)r.reserved_peak_bytes);
                cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)r.peak_rss_bytes);
                cJSON_AddBoolToObject(j, "rss_reset", reset);
                cJSON_AddNumberToObject(j, "loss", r.loss);
                cJSON_AddItemToArray(arr, j);
                {
                    /* one line per configuration as it completes (stderr under --json) */
                    FILE *o = json ? stderr : stdout;
                    char a[32], b[32];
                    qc_format_bytes(r.peak_device_bytes, a, sizeof(a));
                    qc_format_bytes(r.peak_rss_bytes, b, sizeof(b));
                    fprintf(o,
                            "step %-7s B=%-2" PRId64 " %-7s %8.3f samples/s  %7.2f s/step  "
                            "device peak %-10s RSS peak %s\n",
                            pname, bsz[ib], aname, r.samples_per_s, r.step_s, a, b);
                    fflush(o);
                }
            }
    if (st == QC_OK && json) {
        char *s = cJSON_PrintUnformatted(root);
        if (s) {
            printf("%s\n", s);
            free(s);
        }
    }
    cJSON_Delete(root);
    return st;
}
