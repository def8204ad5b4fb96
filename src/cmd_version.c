/*
 * cmd_version.c — `qctrain version`: the version and what this build contains (build type,
 * CUDA with its architectures, MPI and NCCL (from src/dist, the only place that sees their
 * headers), compiler, sanitizers).
 *
 * QC_BUILD_TYPE, QC_CUDA_ARCHS and QC_SANITIZE_FLAGS come from src/CMakeLists.txt.
 */
#include "qc_cli.h"

#include <stdio.h>

#include "qc_dist.h" /* qc_dist_build_info */
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

static void print_compiler(FILE *out)
{
#if defined(__clang__)
    fprintf(out, "compiler: clang %d.%d.%d\n", __clang_major__, __clang_minor__,
            __clang_patchlevel__);
#elif defined(__GNUC__)
    fprintf(out, "compiler: gcc %d.%d.%d\n", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    fprintf(out, "compiler: unknown C11 compiler\n");
#endif
}

enum qc_status qc_cmd_version(struct qc_cli *cli, int argc, char **argv)
{
    (void)cli;
    bool help = false;
    QC_TRY(qc_cli_parse("version", "", "Prints the version and the build's backends.", NULL, 0,
                        argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    printf("qctrain %s\n", QC_VERSION);
    printf("build: %s\n", QC_BUILD_TYPE[0] ? QC_BUILD_TYPE : "(none)");
#ifdef QC_HAVE_CUDA
    printf("cuda: yes (CUDA runtime %d.%d, architectures: %s)\n", CUDART_VERSION / 1000,
           (CUDART_VERSION % 1000) / 10, QC_CUDA_ARCHS[0] ? QC_CUDA_ARCHS : "default");
#else
    printf("cuda: no (CPU-only build)\n");
#endif
    char dist[256];
    qc_dist_build_info(dist, sizeof(dist));
    fputs(dist, stdout);
    print_compiler(stdout);
    printf("sanitize: %s\n", QC_SANITIZE_FLAGS[0] ? QC_SANITIZE_FLAGS : "none");
    return QC_OK;
}
