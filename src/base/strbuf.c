/*
 * strbuf.c — the growable text buffer (qc_strbuf.h).
 */
#include "qc_strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for n more bytes plus the NUL; false (and failed set) when out of memory. */
static bool reserve(struct qc_strbuf *b, size_t n)
{
    if (b->failed)
        return false;
    if (b->len + n + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void qc_strbuf_add(struct qc_strbuf *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void qc_strbuf_puts(struct qc_strbuf *b, const char *s)
{
    qc_strbuf_add(b, s, strlen(s));
}

void qc_strbuf_printf(struct qc_strbuf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        qc_strbuf_add(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void qc_strbuf_json_str(struct qc_strbuf *b, const char *s)
{
    qc_strbuf_add(b, "\"", 1);
    const char *run = s;
    for (const char *p = s;; p++) {
        const unsigned char c = (unsigned char)*p;
        const bool esc =
            c == '"' || c == '\\' || (c < 0x20 && c) || (c == '/' && p > s && p[-1] == '<');
        if (!c || esc) {
            qc_strbuf_add(b, run, (size_t)(p - run));
            if (!c)
                break;
            if (c == '"' || c == '\\' || c == '/')
                qc_strbuf_printf(b, "\\%c", c);
            else
                qc_strbuf_printf(b, "\\u%04x", c);
            run = p + 1;
        }
    }
    qc_strbuf_add(b, "\"", 1);
}

void qc_strbuf_json_num(struct qc_strbuf *b, double v, int digits)
{
    if (!isfinite(v))
        qc_strbuf_add(b, "null", 4);
    else
        qc_strbuf_printf(b, "%.*g", digits, v);
}

void qc_strbuf_html(struct qc_strbuf *b, const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const char *rep = NULL;
        switch (s[i]) {
        case '&':
            rep = "&amp;";
            break;
        case '<':
            rep = "&lt;";
            break;
        case '>':
            rep = "&gt;";
            break;
        case '"':
            rep = "&quot;";
            break;
        case '\'':
            rep = "&#39;";
            break;
        default:
            continue;
        }
        qc_strbuf_add(b, s + run, i - run);
        qc_strbuf_puts(b, rep);
        run = i + 1;
    }
    qc_strbuf_add(b, s + run, n - run);
}

enum qc_status qc_strbuf_status(const struct qc_strbuf *b, const char *what)
{
    if (b->failed)
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory (%zu bytes built)", what, b->len);
    return QC_OK;
}

void qc_strbuf_free(struct qc_strbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
