/*
 * test_headers.c — every public header compiles on its own.
 *
 * tests/cmake/headers.cmake generates one .c per public header (including only that header,
 * twice, and checking its guard name) and test_headers_list.h, the X-macro list of them. The
 * compile is the real test; at run time we check that every generated unit is linked in and that
 * the list matches the headers on disk (a header added without re-running cmake is caught).
 * In a CPU-only build, headers that include the CUDA runtime are listed as skipped instead.
 */
#include <dirent.h>
#include <string.h>

#include "testutil.h"
#include "test_headers_list.h" /* QC_HEADER_LIST, QC_HEADER_COUNT (generated) */

#define X(id, path) int qc_header_check_##id(void);
QC_HEADER_LIST
#undef X

static const char *const header_paths[] = {
#define X(id, path) path,
    QC_HEADER_LIST
#undef X
};

static const char *const skipped_paths[] = {
#define X(path) path,
    QC_HEADER_SKIPPED_LIST
#undef X
        NULL};

static bool listed(const char *rel)
{
    for (size_t i = 0; i < sizeof header_paths / sizeof header_paths[0]; i++)
        if (strcmp(header_paths[i], rel) == 0)
            return true;
    return false;
}

static bool skipped(const char *rel)
{
    for (size_t i = 0; skipped_paths[i]; i++)
        if (strcmp(skipped_paths[i], rel) == 0)
            return true;
    return false;
}

/* Counts qc_*.h in QC_SOURCE_DIR/<folder> and expects each in the generated list. */
static int check_folder(const char *folder)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", QC_SOURCE_DIR, folder);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "qc_", 3) != 0 || len < 3 || strcmp(e->d_name + len - 2, ".h") != 0)
            continue;
        char rel[4096];
        snprintf(rel, sizeof rel, "%s/%s", folder, e->d_name);
        if (skipped(rel))
            continue;
        T_EXPECT(listed(rel), "%s is not in the generated list: re-run cmake", rel);
        n++;
    }
    closedir(d);
    return n;
}

/* check_folder over QC_SOURCE_DIR/<folder> and, depth > 0, each folder below it (files are
 * skipped: check_folder of a file finds nothing). */
static int check_tree(const char *folder, int depth)
{
    int n = check_folder(folder);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", QC_SOURCE_DIR, folder);
    DIR *d = depth > 0 ? opendir(path) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char sub[1024];
        if ((size_t)snprintf(sub, sizeof sub, "%s/%s", folder, e->d_name) < sizeof sub)
            n += check_tree(sub, depth - 1);
    }
    if (d)
        closedir(d);
    return n;
}

int main(void)
{
    QC_TEST ("headers: every generated unit is linked and returns 1") {
        int n = 0;
#define X(id, path)                                                                                \
    T_EXPECT(qc_header_check_##id() == 1, "%s", path);                                             \
    n++;
        QC_HEADER_LIST
#undef X
        T_EXPECT_EQ_I64(n, QC_HEADER_COUNT, "headers in the generated list");
        T_EXPECT(n >= 5, "only %d public headers found", n);
    }
    QC_TEST ("headers: the list matches the headers on disk") {
        /* src/, src/<folder>/ and src/<folder>/<sub>/ (src/train/memory/) */
        const int n = check_folder("alloc") + check_folder("offload") + check_folder("kernels") +
                      check_tree("src", 2);
        T_EXPECT_EQ_I64(n, QC_HEADER_COUNT, "public headers on disk vs generated list");
    }
    return qc_test_summary();
}
