/*
 * dist_testlib.h — what the multi-rank tests share (tests/test_dist_*.c): the environment of
 * their mpirun jobs and finding the rank processes of a job (every rank runs the tiny settings
 * of proc_testlib.h). Header-only.
 */
#ifndef QC_TESTS_DIST_TESTLIB_H
#define QC_TESTS_DIST_TESTLIB_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "proc_testlib.h"

/* The environment every mpirun of a test gets (inherited by its local ranks): Open MPI as root
 * (CI), shared memory without process_vm_readv (containers often forbid it), one thread per rank
 * (several ranks share 2 cores). In AddressSanitizer builds the ranks run without leak
 * detection: Open MPI's components leak at MPI_Finalize and are unloaded (dlclose) before
 * LeakSanitizer looks, so those leaks cannot be suppressed by module; the code of the ranks runs
 * leak-checked in the single-rank tests. The test process itself keeps its own options. */
static inline void t_dist_mpi_env(void)
{
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    const char *asan = getenv("ASAN_OPTIONS");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%sdetect_leaks=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", buf, 1);
}

/* The parent pid of process pid (from /proc/pid/stat), or -1. */
static inline pid_t t_parent_pid(pid_t pid)
{
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* the command name may hold spaces */
    char state = 0;
    int ppid = -1;
    if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2)
        return -1;
    return (pid_t)ppid;
}

/* True when process pid's environment holds the string kv ("NAME=value"). */
static inline bool t_env_has(pid_t pid, const char *kv)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(p, "rb");
    if (!f)
        return false;
    static char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (strcmp(buf + i, kv) == 0)
            return true;
    return false;
}

/* A process whose environment holds the nenv strings env ("NAME=value"), whose parent is
 * `parent` (-1: any) and whose command name starts with comm (NULL: any); its pid, or -1. */
static inline pid_t t_find_process(pid_t parent, const char *comm, const char *const *env, int nenv)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    pid_t found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d)) != NULL) {
        const pid_t pid = (pid_t)atoi(e->d_name);
        bool ok = pid > 0 && (parent < 0 || t_parent_pid(pid) == parent);
        for (int i = 0; ok && i < nenv; i++)
            ok = t_env_has(pid, env[i]);
        if (ok && comm) {
            char p[64], name[64] = "";
            snprintf(p, sizeof p, "/proc/%d/comm", (int)pid); /* size 0 to stat: read it */
            FILE *f = fopen(p, "r");
            if (f) {
                if (!fgets(name, sizeof name, f))
                    name[0] = '\0';
                fclose(f);
            }
            ok = strncmp(name, comm, strlen(comm)) == 0;
        }
        if (ok)
            found = pid;
    }
    closedir(d);
    return found;
}

/* The pid of rank `rank` of the job of the mpirun process `job` (a child of it, on this node),
 * or -1. */
static inline pid_t t_rank_pid(pid_t job, int rank)
{
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    const char *env[1] = {want};
    return t_find_process(job, NULL, env, 1);
}

#endif /* QC_TESTS_DIST_TESTLIB_H */
