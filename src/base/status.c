/*
 * status.c — status names, the thread-local last error, logging and assertion failure.
 */
#include "qc_status.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[QC_STATUS_COUNT] = {
    [QC_OK] = "ok",
    [QC_ERR_NOMEM] = "out of memory",
    [QC_ERR_IO] = "I/O error",
    [QC_ERR_CUDA] = "CUDA error",
    [QC_ERR_INVALID] = "invalid input",
    [QC_ERR_UNSUPPORTED] = "unsupported",
};

const char *qc_status_str(enum qc_status st)
{
    if ((int)st < 0 || st >= QC_STATUS_COUNT)
        return "unknown status";
    return status_names[st];
}

// ---- last error ----------------------------------------------------------------------------

#define QC_ERROR_MAX 4096
static _Thread_local char error_buf[QC_ERROR_MAX];

enum qc_status qc_verrorf(enum qc_status st, const char *fmt, va_list ap)
{
    vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    return st;
}

enum qc_status qc_errorf(enum qc_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    qc_verrorf(st, fmt, ap);
    va_end(ap);
    return st;
}

enum qc_status qc_error_wrap(enum qc_status st, const char *fmt, ...)
{
    char prefix[1024];
    char old[QC_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_buf, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof error_buf - 3)
        n = sizeof error_buf - 3;
    memcpy(error_buf, prefix, n);
    memcpy(error_buf + n, ": ", 2);
    size_t room = sizeof error_buf - n - 3;
    size_t m = strnlen(old, room);
    memcpy(error_buf + n + 2, old, m);
    error_buf[n + 2 + m] = '\0';
    return st;
}

const char *qc_error_last(void)
{
    return error_buf;
}

void qc_error_clear(void)
{
    error_buf[0] = '\0';
}

const char *qc_errno_str(int neg_errno)
{
    return strerror(neg_errno < 0 ? -neg_errno : neg_errno);
}

enum qc_status qc_errno_check(long ret, const char *call, const char *file, int line)
{
    if (ret >= 0)
        return QC_OK;
    return qc_errorf(QC_ERR_IO, "%s failed: %s | %s:%d", call, qc_errno_str((int)ret), file, line);
}

// ---- logging -------------------------------------------------------------------------------

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static enum qc_log_level log_level = QC_LOG_INFO;
static qc_log_sink_fn log_sink;
static void *log_sink_user;

static const char *const level_names[QC_LOG_LEVEL_COUNT] = {"error", "warn", "info", "debug"};

const char *qc_log_level_str(enum qc_log_level level)
{
    return (int)level >= 0 && level < QC_LOG_LEVEL_COUNT ? level_names[level] : "?";
}

void qc_log_set_level(enum qc_log_level level)
{
    __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
}

enum qc_log_level qc_log_get_level(void)
{
    return __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

enum qc_status qc_log_level_parse(const char *s, enum qc_log_level *out)
{
    for (int i = 0; i < QC_LOG_LEVEL_COUNT; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum qc_log_level)i;
            return QC_OK;
        }
    }
    return qc_errorf(QC_ERR_INVALID, "log level '%s' is not one of error, warn, info, debug", s);
}

void qc_log_set_sink(qc_log_sink_fn fn, void *user)
{
    pthread_mutex_lock(&log_lock);
    log_sink = fn;
    log_sink_user = user;
    pthread_mutex_unlock(&log_lock);
}

void qc_log(enum qc_log_level level, const char *fmt, ...)
{
    if (level > qc_log_get_level())
        return;
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_lock);
    if (log_sink)
        log_sink(level, line, log_sink_user);
    else
        fprintf(stderr, "qc %s: %s\n", level_names[level], line);
    pthread_mutex_unlock(&log_lock);
}

// ---- assertions ----------------------------------------------------------------------------

void qc_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "qc assert: %s failed: %s | %s:%d\n", cond, msg, file, line);
    abort();
}
