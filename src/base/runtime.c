/*
 * runtime.c — process-wide runtime defaults (qc_runtime.h).
 */
#include "qc_runtime.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

/* Set in the re-executed process: never re-exec twice. */
#define QC_RUNTIME_REEXEC_ENV "QC_RUNTIME_REEXEC"

/* Spins before a waiting thread sleeps (qc_runtime.h): a few tens of µs at most */
#define QC_RUNTIME_SPINCOUNT "10000"

void qc_runtime_defaults_apply(char **argv)
{
    /* A file size limit (ulimit -f) makes a write fail with EFBIG, which the writer reports
     * naming the file; SIGXFSZ's default would kill the process without a word (exit 153). */
    signal(SIGXFSZ, SIG_IGN);
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv(QC_RUNTIME_REEXEC_ENV))
        return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0 ||
        setenv("GOMP_SPINCOUNT", QC_RUNTIME_SPINCOUNT, 1) != 0 ||
        setenv(QC_RUNTIME_REEXEC_ENV, "1", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    /* no exec (no /proc, no permission): go on with the OpenMP runtime as it loaded */
}
