/*
 * bench_util.c — helpers the benchmarks share (bench_util.h).
 */
#include "bench_util.h"

#include <errno.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void qc_bench_rm_tree(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

enum qc_status qc_bench_copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (!in)
        return qc_errorf(QC_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        const int e = errno;
        fclose(in);
        return qc_errorf(QC_ERR_IO, "%s: cannot create: %s", dst, strerror(e));
    }
    char buf[1 << 16];
    size_t n;
    bool ok = true;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = ok && fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0 || !ok)
        return qc_errorf(QC_ERR_IO, "copying %s to %s failed", src, dst);
    return QC_OK;
}
