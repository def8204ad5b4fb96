/*
 * run_info.c — RUN/run.json: what the report's `run` section shows besides memory.json
 * (qc_report_write_run_info). Written by train when it starts, atomically.
 *   {"format": "qctrain-run", "version": 1, "started": "...", "first_step": N, "resumed": b,
 *    "machine": {"host", "os", "cpu", "cores", "memory_bytes"},
 *    "device": {"kind", "name"},
 *    "versions": {"qctrain", "compiler", "build", "cuda", "cjson"},
 *    "config": {the effective configuration, as `qctrain config --config-dump` prints it}}
 */
#include "qc_report.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "qc_file.h"
#include "qc_strbuf.h"

#ifndef QC_VERSION
#    define QC_VERSION "unknown"
#endif
#ifndef QC_BUILD_TYPE
#    define QC_BUILD_TYPE ""
#endif

/* The first "model name" of /proc/cpuinfo (Linux), else the machine name. */
static void cpu_model(char *out, size_t n, const char *machine)
{
    snprintf(out, n, "%s", machine);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *colon = strchr(line, ':');
        if (!colon)
            break;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        snprintf(out, n, "%s", colon);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    fclose(f);
}

static void put_kv(struct qc_strbuf *b, const char *key, const char *value, bool last)
{
    qc_strbuf_printf(b, "\"%s\": ", key);
    qc_strbuf_json_str(b, value);
    qc_strbuf_puts(b, last ? "" : ", ");
}

enum qc_status qc_report_write_run_info(const char *run_dir, const char *config_json,
                                        const char *device_kind, const char *device_name,
                                        int64_t first_step, bool resumed)
{
    struct qc_strbuf b = {0};
    char when[64];
    const time_t now = time(NULL);
    struct tm tmv;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&now, &tmv));
    qc_strbuf_printf(&b,
                     "{\n  \"format\": \"qctrain-run\",\n  \"version\": 1,\n  \"started\": "
                     "\"%s\",\n  \"first_step\": %" PRId64 ",\n  \"resumed\": %s,\n",
                     when, first_step, resumed ? "true" : "false");
    struct utsname u;
    if (uname(&u) != 0)
        memset(&u, 0, sizeof u);
    char host[256] = "";
    if (gethostname(host, sizeof host) != 0)
        host[0] = '\0';
    host[sizeof host - 1] = '\0';
    char cpu[256], os[600];
    cpu_model(cpu, sizeof cpu, u.machine);
    snprintf(os, sizeof os, "%s %s %s", u.sysname, u.release, u.machine);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    qc_strbuf_puts(&b, "  \"machine\": {");
    put_kv(&b, "host", host, false);
    put_kv(&b, "os", os, false);
    put_kv(&b, "cpu", cpu, false);
    qc_strbuf_printf(&b, "\"cores\": %ld, \"memory_bytes\": %" PRIu64 "},\n", cores,
                     pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0);
    qc_strbuf_puts(&b, "  \"device\": {");
    put_kv(&b, "kind", device_kind ? device_kind : "cpu", false);
    put_kv(&b, "name", device_name ? device_name : "", true);
    qc_strbuf_puts(&b, "},\n  \"versions\": {");
    char compiler[64];
#if defined(__clang__)
    snprintf(compiler, sizeof compiler, "clang %d.%d.%d", __clang_major__, __clang_minor__,
             __clang_patchlevel__);
#elif defined(__GNUC__)
    snprintf(compiler, sizeof compiler, "gcc %d.%d.%d", __GNUC__, __GNUC_MINOR__,
             __GNUC_PATCHLEVEL__);
#else
    snprintf(compiler, sizeof compiler, "unknown C11 compiler");
#endif
    put_kv(&b, "qctrain", QC_VERSION, false);
    put_kv(&b, "compiler", compiler, false);
    put_kv(&b, "build", QC_BUILD_TYPE, false);
#ifdef QC_HAVE_CUDA
    put_kv(&b, "cuda", "yes", false);
#else
    put_kv(&b, "cuda", "no (CPU-only build)", false);
#endif
    put_kv(&b, "cjson", cJSON_Version(), true);
    qc_strbuf_puts(&b, "},\n  \"config\": ");
    qc_strbuf_puts(&b, config_json && config_json[0] ? config_json : "null");
    qc_strbuf_puts(&b, "\n}\n");
    enum qc_status st = qc_strbuf_status(&b, "run.json");
    if (st == QC_OK) {
        char path[4200];
        snprintf(path, sizeof path, "%s/run.json", run_dir);
        const struct qc_file_part part = {b.p, b.len};
        st = qc_file_write_atomic(path, &part, 1, "run description");
    }
    qc_strbuf_free(&b);
    return st;
}
