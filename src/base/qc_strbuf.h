/*
 * qc_strbuf.h — a growable text buffer for documents built piece by piece (JSON, HTML).
 *
 * Appends never fail on the spot: an allocation failure sets `failed`, later appends are
 * no-ops, and the writer checks once at the end (qc_strbuf_status). The text is always
 * NUL-terminated when len > 0.
 */
#ifndef QC_BASE_QC_STRBUF_H
#define QC_BASE_QC_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_strbuf {
    char *p;     /* the text (malloc'ed), NUL-terminated; NULL while empty */
    size_t len;  /* bytes of text */
    size_t cap;  /* bytes allocated */
    bool failed; /* an append ran out of memory: the text is incomplete */
};

/* Appends n bytes. */
void qc_strbuf_add(struct qc_strbuf *b, const char *s, size_t n);
/* Appends a NUL-terminated string. */
void qc_strbuf_puts(struct qc_strbuf *b, const char *s);
/* Appends printf-formatted text. */
void qc_strbuf_printf(struct qc_strbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string literal (quotes included; ", \ and control bytes escaped, and "</"
 * written "<\/" so the text can sit inside an HTML <script> element). */
void qc_strbuf_json_str(struct qc_strbuf *b, const char *s);
/* Appends a JSON number with %.*g (digits significant digits), or null when v is NaN or ±Inf
 * (JSON has neither). */
void qc_strbuf_json_num(struct qc_strbuf *b, double v, int digits);
/* Appends s with the HTML special characters (& < > " ') escaped. */
void qc_strbuf_html(struct qc_strbuf *b, const char *s, size_t n);
/* QC_OK, or QC_ERR_NOMEM naming what when an append failed. */
enum qc_status qc_strbuf_status(const struct qc_strbuf *b, const char *what);
/* Frees the text and empties the buffer. */
void qc_strbuf_free(struct qc_strbuf *b);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_STRBUF_H */
