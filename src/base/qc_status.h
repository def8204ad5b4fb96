/*
 * qc_status.h — the one status type, error propagation, assertions and logging.
 *
 * Every fallible function returns enum qc_status. A failing function records what went wrong
 * (with context and, where the user can fix it, a "hint:" line) through qc_errorf(), which sets
 * a thread-local message and returns the status; callers propagate with QC_TRY. Only
 * src/main.c turns a status into an exit code and prints qc_error_last().
 *
 * Foreign error codes are converted at the seam with macros built from QC_CHECK_GEN:
 * QC_ERRNO (negative errno, liburing/syscalls) here, QC_CUDA in qc_cuda_check.h.
 */
#ifndef QC_BASE_QC_STATUS_H
#define QC_BASE_QC_STATUS_H

#include <stdarg.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

enum qc_status {
    QC_OK = 0,
    QC_ERR_NOMEM,       /* out of (budgeted) memory; the caller may re-plan */
    QC_ERR_IO,          /* a file, disk or I/O failure */
    QC_ERR_CUDA,        /* a CUDA/cuBLAS/cuDNN/NCCL failure */
    QC_ERR_INVALID,     /* bad input: malformed file, bad option, wrong shape */
    QC_ERR_UNSUPPORTED, /* not available in this build or on this machine */
    QC_STATUS_COUNT     /* must be last */
};

/* Short name of a status ("ok", "out of memory", ...). Never NULL. */
const char *qc_status_str(enum qc_status st);

/* ---- last error ------------------------------------------------------------------------- */

/* Records a formatted message as this thread's last error and returns st unchanged, so a
 * failure site reads `return qc_errorf(QC_ERR_INVALID, "%s: key '%s': ...", path, key);`.
 * Append "\nhint: ..." when the user can fix it. Thread-safe (thread-local storage). */
enum qc_status qc_errorf(enum qc_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
enum qc_status qc_verrorf(enum qc_status st, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* Prefixes this thread's last error with "context: " (for callers that add a file name etc.);
 * returns st. */
enum qc_status qc_error_wrap(enum qc_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* This thread's last error message; "" when none. Valid until the next qc_errorf on the thread. */
const char *qc_error_last(void);
void qc_error_clear(void);

/* ---- logging ---------------------------------------------------------------------------- */

enum qc_log_level { QC_LOG_ERROR = 0, QC_LOG_WARN, QC_LOG_INFO, QC_LOG_DEBUG, QC_LOG_LEVEL_COUNT };

/* Writes "qc <level>: message\n" to stderr when level <= the current level (default INFO).
 * Thread-safe. */
void qc_log(enum qc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qc_log_set_level(enum qc_log_level level);
enum qc_log_level qc_log_get_level(void);
/* Parses "error|warn|info|debug"; returns QC_ERR_INVALID (message set) on anything else. */
enum qc_status qc_log_level_parse(const char *s, enum qc_log_level *out);
const char *qc_log_level_str(enum qc_log_level level);
/* Redirects log lines (tests capture them). NULL restores stderr. */
typedef void (*qc_log_sink_fn)(enum qc_log_level level, const char *line, void *user);
void qc_log_set_sink(qc_log_sink_fn fn, void *user);

/* ---- propagation and assertions --------------------------------------------------------- */

#define QC_TRY(expr)                                                                               \
    do {                                                                                           \
        enum qc_status qc_try_st_ = (expr);                                                        \
        if (qc_try_st_ != QC_OK) {                                                                 \
            qc_log(QC_LOG_DEBUG, ".. at %s:%d", __FILE__, __LINE__);                               \
            return qc_try_st_;                                                                     \
        }                                                                                          \
    } while (0)

/* Aborts with context. For programmer errors only, never for bad input. */
void qc_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

#define QC_ASSERT(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            qc_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                \
    } while (0)

#if QC_DEBUG >= 1
#    define QC_DASSERT(cond, ...) QC_ASSERT(cond, __VA_ARGS__)
#else
#    define QC_DASSERT(cond, ...) ((void)0)
#endif
#if QC_DEBUG >= 2
#    define QC_XASSERT(cond, ...) QC_ASSERT(cond, __VA_ARGS__)
#else
#    define QC_XASSERT(cond, ...) ((void)0)
#endif

/* Generator for converting a foreign error code at the seam: checkfn(code, call_text, file,
 * line) converts the code to a status, recording "<call> failed: <why> | file:line" as the last
 * error on failure. Each foreign API gets one checkfn and one macro built from this:
 * QC_ERRNO here, QC_CUDA / QC_CUBLAS / QC_CUDNN / QC_NCCL in qc_cuda_check.h. Use inside QC_TRY. */
#define QC_CHECK_GEN(call, checkfn) checkfn((call), #call, __FILE__, __LINE__)

/* Negative-errno convention (liburing, our own syscall wrappers): ret < 0 is -errno -> QC_ERR_IO.
 */
enum qc_status qc_errno_check(long ret, const char *call, const char *file, int line);
const char *qc_errno_str(int neg_errno);
#define QC_ERRNO(ret) QC_CHECK_GEN(ret, qc_errno_check)

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_STATUS_H */
