/*
 * cmd_version.c — `qctrain version [--json]`: the version and what this build contains (build
 * type, CUDA with its architectures, MPI and NCCL (from src/dist, the only place that sees their
 * headers), compiler, sanitizers), and in a CUDA build what the machine has: the number of CUDA
 * devices and cudaGetDeviceCount's answer (qc_device_cuda_probe), which is what the GPU tests
 * run by script (tests/test_precision_run.py) decide on, by the rule of tests/cuda_probe.h.
 *
 * --json prints one object:
 *   {"version", "build", "cuda": {"built", "runtime" ("12.4"; null in a CPU-only build),
 *    "architectures", "devices", "probe_error" (cudaError_t of cudaGetDeviceCount, 0 = success,
 *    -1 in a CPU-only build), "probe_error_name"}, "mpi", "nccl", "compiler", "sanitize"}
 *
 * QC_BUILD_TYPE, QC_CUDA_ARCHS and QC_SANITIZE_FLAGS come from src/CMakeLists.txt.
 */
#include "qc_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "qc_device.h" /* qc_device_cuda_probe */
#include "qc_dist.h"   /* qc_dist_build_info */
#ifdef QC_HAVE_CUDA
#    include <cuda_runtime_api.h> /* CUDART_VERSION */
#endif

#ifndef QC_VERSION
#    define QC_VERSION "unknown"
#endif
#ifndef QC_BUILD_TYPE
#    define QC_BUILD_TYPE ""
#endif
#ifndef QC_CUDA_ARCHS
#    define QC_CUDA_ARCHS ""
#endif
#ifndef QC_SANITIZE_FLAGS
#    define QC_SANITIZE_FLAGS ""
#endif

static void compiler_str(char *buf, size_t n)
{
#if defined(__clang__)
    snprintf(buf, n, "clang %d.%d.%d", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    snprintf(buf, n, "gcc %d.%d.%d", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    snprintf(buf, n, "unknown C11 compiler");
#endif
}

/* What the machine has: the device count and cudaGetDeviceCount's error (name, "" when the
 * build has no CUDA). */
struct version_cuda {
    int devices;
    int err; /* cudaError_t; -1: a CPU-only build */
    const char *err_name;
};

static void probe_cuda(struct version_cuda *c)
{
    c->err = qc_device_cuda_probe(&c->devices);
#ifdef QC_HAVE_CUDA
    c->err_name = cudaGetErrorName((cudaError_t)c->err);
#else
    c->err_name = "";
#endif
}

/* The "key: value" lines of qc_dist_build_info as string members of o. */
static bool add_dist_lines(cJSON *o, char *text)
{
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *colon = strstr(line, ": ");
        if (!colon)
            continue;
        *colon = '\0';
        if (!cJSON_AddStringToObject(o, line, colon + 2))
            return false;
    }
    return true;
}

static enum qc_status print_json(const struct version_cuda *c, char *dist, const char *compiler)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *cu = NULL;
    bool ok = root && cJSON_AddStringToObject(root, "version", QC_VERSION) &&
              cJSON_AddStringToObject(root, "build", QC_BUILD_TYPE) &&
              (cu = cJSON_AddObjectToObject(root, "cuda")) != NULL;
#ifdef QC_HAVE_CUDA
    char runtime[32];
    snprintf(runtime, sizeof runtime, "%d.%d", CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    ok = ok && cJSON_AddTrueToObject(cu, "built") &&
         cJSON_AddStringToObject(cu, "runtime", runtime) &&
         cJSON_AddStringToObject(cu, "architectures", QC_CUDA_ARCHS[0] ? QC_CUDA_ARCHS : "default");
#else
    ok = ok && cJSON_AddFalseToObject(cu, "built") && cJSON_AddNullToObject(cu, "runtime") &&
         cJSON_AddNullToObject(cu, "architectures");
#endif
    ok = ok && cJSON_AddNumberToObject(cu, "devices", c->devices) &&
         cJSON_AddNumberToObject(cu, "probe_error", c->err) &&
         cJSON_AddStringToObject(cu, "probe_error_name", c->err_name) &&
         add_dist_lines(root, dist) && cJSON_AddStringToObject(root, "compiler", compiler) &&
         cJSON_AddStringToObject(root, "sanitize",
                                 QC_SANITIZE_FLAGS[0] ? QC_SANITIZE_FLAGS : "none");
    char *txt = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!txt)
        return qc_errorf(QC_ERR_NOMEM, "version --json: out of memory");
    printf("%s\n", txt);
    free(txt);
    return QC_OK;
}

enum qc_status qc_cmd_version(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    bool help = false, json = false;
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object (the CUDA device count included)"},
    };
    QC_TRY(qc_cli_parse("version", "[--json]", "Prints the version and the build's backends.", opts,
                        1, argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    struct version_cuda c;
    probe_cuda(&c);
    char dist[256], compiler[64];
    qc_dist_build_info(dist, sizeof(dist));
    compiler_str(compiler, sizeof compiler);
    if (json)
        return print_json(&c, dist, compiler);
    printf("qctrain %s\n", QC_VERSION);
    printf("build: %s\n", QC_BUILD_TYPE[0] ? QC_BUILD_TYPE : "(none)");
#ifdef QC_HAVE_CUDA
    printf("cuda: yes (CUDA runtime %d.%d, architectures: %s)\n", CUDART_VERSION / 1000,
           (CUDART_VERSION % 1000) / 10, QC_CUDA_ARCHS[0] ? QC_CUDA_ARCHS : "default");
    if (c.err == 0)
        printf("cuda devices: %d\n", c.devices);
    else
        printf("cuda devices: 0 (cudaGetDeviceCount: %s, error %d)\n", c.err_name, c.err);
#else
    printf("cuda: no (CPU-only build)\n");
#endif
    fputs(dist, stdout);
    printf("compiler: %s\n", compiler);
    printf("sanitize: %s\n", QC_SANITIZE_FLAGS[0] ? QC_SANITIZE_FLAGS : "none");
    return QC_OK;
}
