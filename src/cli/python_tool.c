/*
 * python_tool.c — the Python scripts of tools/ that commands run (eval --submission's
 * av2_submission, bench numerics' qcnet_f64.py): where one is found and how it is run.
 *
 * A script is looked for in the source tree (a build run where it was made), beside the
 * executable (cmake --install, any prefix: PREFIX/share/qctrain/tools) and under the configured
 * prefix, in that order. It runs as `python3 SCRIPT ARGS...` with the caller's environment and
 * standard streams, and the caller waits for it: the script prints its own errors.
 */
#include "qc_cli.h"

#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qc_file.h"

#ifndef QC_SOURCE_DIR
#    define QC_SOURCE_DIR "."
#endif
#ifndef QC_INSTALL_TOOLS
#    define QC_INSTALL_TOOLS "/usr/local/share/qctrain/tools"
#endif

extern char **environ;

const char *qc_cli_tool_find(const char *name, char *buf, size_t cap)
{
    char beside[4200];
    const char *dirs[] = {QC_SOURCE_DIR "/tools",
                          qc_file_exe_share("tools", beside, sizeof beside) ? beside : NULL,
                          QC_INSTALL_TOOLS};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i])
            continue;
        snprintf(buf, cap, "%s/%s", dirs[i], name);
        if (access(buf, R_OK) == 0)
            return buf;
    }
    return NULL;
}

enum qc_status qc_cli_tool_run(const char *what, const char *name, const char *const *args,
                               int nargs)
{
    char tool[4096];
    if (!qc_cli_tool_find(name, tool, sizeof tool))
        return qc_errorf(QC_ERR_IO, "%s: tools/%s is in neither %s/tools nor %s", what, name,
                         QC_SOURCE_DIR, QC_INSTALL_TOOLS);
    enum { MAX_ARGS = 16 };
    if (nargs > MAX_ARGS)
        return qc_errorf(QC_ERR_INVALID, "%s: %d arguments for tools/%s (at most %d)", what, nargs,
                         name, MAX_ARGS);
    char py[] = "python3";
    char *argv[MAX_ARGS + 3] = {py, tool};
    for (int i = 0; i < nargs; i++) /* posix_spawn takes char *: copies */
        if (!(argv[2 + i] = strdup(args[i]))) {
            for (int j = 0; j < i; j++)
                free(argv[2 + j]);
            return qc_errorf(QC_ERR_NOMEM, "%s: out of memory", what);
        }
    pid_t pid;
    fflush(NULL);
    const int rc = posix_spawnp(&pid, "python3", NULL, NULL, argv, environ);
    for (int i = 0; i < nargs; i++)
        free(argv[2 + i]);
    if (rc != 0)
        return qc_errorf(QC_ERR_IO, "%s: cannot run python3 %s: %s", what, tool, strerror(rc));
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return qc_errorf(QC_ERR_IO, "%s: waiting for python3 %s: %s", what, tool,
                             strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return QC_OK;
    if (WIFEXITED(status))
        return qc_errorf(QC_ERR_IO, "%s: python3 %s exited %d (its message above)", what, tool,
                         WEXITSTATUS(status));
    return qc_errorf(QC_ERR_IO, "%s: python3 %s was killed by signal %d", what, tool,
                     WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
