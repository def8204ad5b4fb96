/*
 * calibrate.c — the cost model's calibration cache (qc_plan_calib.h): where it lives, what it
 * is keyed by, loading with its checks, probing when the cache has nothing valid, the refresh
 * from a training run. Runs no kernel: the probe is the caller's.
 */
#define _POSIX_C_SOURCE 200809L
#include "qc_plan_calib.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qc_device.h"

#ifndef QC_VERSION
#    define QC_VERSION "unknown"
#endif

enum qc_status qc_plan_calib_dir(char *buf, size_t n)
{
    const char *e = getenv("QC_CACHE_DIR");
    int w;
    if (e && e[0])
        w = snprintf(buf, n, "%s", e);
    else if ((e = getenv("XDG_CACHE_HOME")) && e[0])
        w = snprintf(buf, n, "%s/qctrain", e);
    else if ((e = getenv("HOME")) && e[0])
        w = snprintf(buf, n, "%s/.cache/qctrain", e);
    else
        return qc_errorf(QC_ERR_IO, "plan calibration: no cache folder (set QC_CACHE_DIR, "
                                    "XDG_CACHE_HOME or HOME)");
    if (w < 0 || (size_t)w >= n)
        return qc_errorf(QC_ERR_INVALID, "plan calibration: the cache folder's path is too long");
    return QC_OK;
}

void qc_plan_calib_machine(char *buf, size_t n)
{
    char host[128] = "unknown-host", cpu[128];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown-host");
    host[sizeof host - 1] = '\0';
    qc_host_cpu_model(cpu, sizeof cpu);
    snprintf(buf, n, "%s; %s; %ld CPUs", host, cpu, sysconf(_SC_NPROCESSORS_ONLN));
}

void qc_plan_calib_build(char *buf, size_t n)
{
    char comp[48];
#if defined(__clang__)
    snprintf(comp, sizeof comp, "clang %d.%d", __clang_major__, __clang_minor__);
#elif defined(__GNUC__)
    snprintf(comp, sizeof comp, "gcc %d.%d", __GNUC__, __GNUC_MINOR__);
#else
    snprintf(comp, sizeof comp, "cc");
#endif
    struct stat sb;
    if (stat("/proc/self/exe", &sb) == 0)
        snprintf(buf, n, "qctrain %s; %s; executable %lld bytes, %lld", QC_VERSION, comp,
                 (long long)sb.st_size, (long long)sb.st_mtime);
    else
        snprintf(buf, n, "qctrain %s; %s", QC_VERSION, comp);
}

static uint64_t fnv(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return (h ^ 0xff) * 0x100000001b3ull; /* a separator: ("ab","c") != ("a","bc") */
}

enum qc_status qc_plan_calib_path(const struct qc_plan_calib *key, char *buf, size_t n)
{
    char dir[4096];
    QC_TRY(qc_plan_calib_dir(dir, sizeof dir));
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(fnv(fnv(h, key->machine), key->build), key->model);
    const int w = snprintf(buf, n, "%s/plan-calib-%016llx.json", dir, (unsigned long long)h);
    if (w < 0 || (size_t)w >= n)
        return qc_errorf(QC_ERR_INVALID, "plan calibration: the cache file's path is too long");
    return QC_OK;
}

enum qc_status qc_plan_calib_load(const char *path, const struct qc_plan_calib *key,
                                  struct qc_plan_cost **out)
{
    struct qc_plan_cost *c = NULL;
    QC_TRY(qc_plan_cost_create(&c));
    enum qc_status st = qc_plan_cost_load(c, path);
    const struct qc_plan_calib *k = qc_plan_cost_calib(c);
    if (st == QC_OK && k->source == QC_PLAN_CALIB_BUILTIN)
        st = qc_errorf(QC_ERR_INVALID,
                       "plan calibration %s: a cost model without a calibration record", path);
    else if (st == QC_OK && strcmp(k->machine, key->machine) != 0)
        st = qc_errorf(QC_ERR_INVALID,
                       "plan calibration %s: made on another machine ('%s'; this is '%s')", path,
                       k->machine, key->machine);
    else if (st == QC_OK && strcmp(k->build, key->build) != 0)
        st = qc_errorf(QC_ERR_INVALID,
                       "plan calibration %s: made by another build ('%s'; this is '%s')", path,
                       k->build, key->build);
    else if (st == QC_OK && strcmp(k->model, key->model) != 0)
        st = qc_errorf(QC_ERR_INVALID,
                       "plan calibration %s: made for another model ('%s'; this is '%s')", path,
                       k->model, key->model);
    else if (st == QC_OK && k->source == QC_PLAN_CALIB_PROBE &&
             (!(k->gemm_fwd_flops > 0) || !(k->gemm_bwd_flops > 0) || !(k->mem_bps > 0)))
        st = qc_errorf(QC_ERR_INVALID, "plan calibration %s: a rate is 0 (no probe behind it)",
                       path);
    if (st != QC_OK) {
        qc_plan_cost_destroy(c);
        return st;
    }
    *out = c;
    return QC_OK;
}

/* mkdir -p of path's folder. */
static enum qc_status make_dirs(const char *path)
{
    char d[4096];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash || slash == d)
        return QC_OK;
    *slash = '\0';
    for (char *p = d + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(d, 0755) != 0 && errno != EEXIST)
            return qc_errorf(QC_ERR_IO, "plan calibration: mkdir %s: %s", d, strerror(errno));
        *p = '/';
    }
    if (mkdir(d, 0755) != 0 && errno != EEXIST)
        return qc_errorf(QC_ERR_IO, "plan calibration: mkdir %s: %s", d, strerror(errno));
    return QC_OK;
}

static enum qc_status save(const struct qc_plan_cost *c, const char *path)
{
    QC_TRY(make_dirs(path));
    return qc_plan_cost_save(c, path);
}

enum qc_status qc_plan_calib_get(const struct qc_plan_calib *key, qc_plan_calib_probe_fn probe,
                                 void *user, struct qc_plan_cost **out, bool *probed)
{
    char path[4200];
    QC_TRY(qc_plan_calib_path(key, path, sizeof path));
    if (probed)
        *probed = false;
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (qc_plan_calib_load(path, key, out) == QC_OK)
            return QC_OK;
        qc_log(QC_LOG_WARN, "%s; refused, probing this machine again", qc_error_last());
    }
    struct qc_plan_calib cal = *key;
    cal.source = QC_PLAN_CALIB_PROBE;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    QC_TRY(probe(user, &cal));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cal.probe_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cal.date = cal.probe_date = (int64_t)time(NULL);
    if (!(cal.gemm_fwd_flops > 0) || !(cal.gemm_bwd_flops > 0) || !(cal.mem_bps > 0))
        return qc_errorf(QC_ERR_INVALID, "plan calibration: the probe measured no rate");
    struct qc_plan_cost *c = NULL;
    QC_TRY(qc_plan_cost_create(&c));
    qc_plan_cost_set_calib(c, &cal);
    if (save(c, path) != QC_OK)
        qc_log(QC_LOG_WARN, "plan calibration: not cached (%s); the next plan probes again",
               qc_error_last());
    qc_log(QC_LOG_INFO, "plan: probed this machine in %.2f s, cached in %s", cal.probe_s, path);
    if (probed)
        *probed = true;
    *out = c;
    return QC_OK;
}

enum qc_status qc_plan_calib_refresh(const struct qc_plan_cost *run,
                                     const struct qc_plan_calib *key)
{
    if (qc_plan_cost_steps(run) < 1)
        return QC_OK; /* nothing measured */
    char path[4200];
    QC_TRY(qc_plan_calib_path(key, path, sizeof path));
    struct qc_plan_calib cal = *key;
    struct qc_plan_cost *old = NULL;
    struct stat sb;
    if (stat(path, &sb) == 0 && qc_plan_calib_load(path, key, &old) == QC_OK) {
        const struct qc_plan_calib *o = qc_plan_cost_calib(old);
        cal.probe_date = o->probe_date;
        cal.gemm_fwd_flops = o->gemm_fwd_flops;
        cal.gemm_bwd_flops = o->gemm_bwd_flops;
        cal.mem_bps = o->mem_bps;
        cal.copy_bps = o->copy_bps;
        cal.probe_s = o->probe_s;
        if (cal.nparams == 0)
            cal.nparams = o->nparams;
        qc_plan_cost_destroy(old);
    }
    /* no probe yet: the run's blocks alone (rates 0: a block the run did not run falls back
     * to its kind's mean) */
    cal.source = QC_PLAN_CALIB_RUN;
    cal.date = (int64_t)time(NULL);
    struct qc_plan_cost *c = NULL;
    QC_TRY(qc_plan_cost_clone(run, &c));
    qc_plan_cost_set_calib(c, &cal);
    const enum qc_status st = save(c, path);
    qc_plan_cost_destroy(c);
    return st;
}

static void age_str(int64_t s, char *buf, size_t n)
{
    if (s < 0)
        s = 0;
    if (s < 120)
        snprintf(buf, n, "%lld s ago", (long long)s);
    else if (s < 7200)
        snprintf(buf, n, "%lld min ago", (long long)(s / 60));
    else if (s < 2 * 86400)
        snprintf(buf, n, "%lld h ago", (long long)(s / 3600));
    else
        snprintf(buf, n, "%lld days ago", (long long)(s / 86400));
}

const char *qc_plan_calib_describe(const struct qc_plan_calib *cal, int64_t now, char *buf,
                                   size_t n)
{
    if (cal->source == QC_PLAN_CALIB_BUILTIN) {
        snprintf(buf, n, "built-in coefficients (not this machine's)");
        return buf;
    }
    char date[40] = "?", age[40];
    const time_t t = (time_t)cal->date;
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
    age_str(now - cal->date, age, sizeof age);
    snprintf(buf, n, "%s at %s (%s)",
             cal->source == QC_PLAN_CALIB_PROBE ? "probed on this machine"
                                                : "refreshed from a training run",
             date, age);
    return buf;
}
