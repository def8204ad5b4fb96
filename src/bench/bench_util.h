/*
 * bench_util.h — helpers the benchmarks share: scratch run folders and files.
 */
#ifndef QC_BENCH_BENCH_UTIL_H
#define QC_BENCH_BENCH_UTIL_H

#include "qc_status.h"

/* Removes dir and everything in it (checkpoint folders included), deepest first; best effort. */
void qc_bench_rm_tree(const char *dir);
/* Copies the file src to dst (created or truncated). QC_ERR_IO naming the file. */
enum qc_status qc_bench_copy_file(const char *src, const char *dst);

#endif /* QC_BENCH_BENCH_UTIL_H */
