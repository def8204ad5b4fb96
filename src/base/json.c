/*
 * json.c — JSON numbers with the non-finite rule, and a strict validity check (qc_json.h).
 *
 * The check is a recursive descent over RFC 8259's grammar, bounded in depth (QC_JSON_DEPTH)
 * so a hostile line cannot exhaust the stack.
 */
#include "qc_json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define QC_JSON_DEPTH 64 /* nesting accepted by qc_json_valid */

const char *qc_json_number(char *buf, size_t cap, const char *fmt, ...)
{
    if (cap == 0)
        return buf;
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    const double v = va_arg(ap, double);
    va_end(ap);
    if (isfinite(v))
        vsnprintf(buf, cap, fmt, ap2);
    else
        snprintf(buf, cap, "null");
    va_end(ap2);
    return buf;
}

// ---- validity ----------------------------------------------------------------------------------

struct jv {
    const char *p, *end;
};

static void jv_ws(struct jv *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool jv_lit(struct jv *j, const char *word)
{
    const size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return false;
    j->p += n;
    return true;
}

static bool jv_digits(struct jv *j)
{
    const char *s = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > s;
}

static bool jv_number(struct jv *j)
{
    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (j->p < j->end && *j->p == '0')
        j->p++; /* no leading zeros */
    else if (!jv_digits(j))
        return false;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!jv_digits(j))
            return false;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (!jv_digits(j))
            return false;
    }
    return true;
}

static bool jv_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static bool jv_string(struct jv *j)
{
    if (j->p >= j->end || *j->p != '"')
        return false;
    j->p++;
    while (j->p < j->end) {
        const unsigned char c = (unsigned char)*j->p++;
        if (c == '"')
            return true;
        if (c < 0x20)
            return false;
        if (c != '\\')
            continue;
        if (j->p >= j->end)
            return false;
        const char e = *j->p++;
        if (e == 'u') {
            for (int i = 0; i < 4; i++)
                if (j->p >= j->end || !jv_hex(*j->p++))
                    return false;
        } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
            return false;
        }
    }
    return false;
}

static bool jv_value(struct jv *j, int depth);

/* A '[' or '{' container whose opening character was consumed. */
static bool jv_container(struct jv *j, int depth, char close, bool object)
{
    if (depth >= QC_JSON_DEPTH)
        return false;
    jv_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return true;
    }
    for (;;) {
        if (object) {
            jv_ws(j);
            if (!jv_string(j))
                return false;
            jv_ws(j);
            if (j->p >= j->end || *j->p != ':')
                return false;
            j->p++;
        }
        if (!jv_value(j, depth + 1))
            return false;
        jv_ws(j);
        if (j->p >= j->end)
            return false;
        const char c = *j->p++;
        if (c == close)
            return true;
        if (c != ',')
            return false;
    }
}

static bool jv_value(struct jv *j, int depth)
{
    jv_ws(j);
    if (j->p >= j->end)
        return false;
    switch (*j->p) {
    case '{':
        j->p++;
        return jv_container(j, depth, '}', true);
    case '[':
        j->p++;
        return jv_container(j, depth, ']', false);
    case '"':
        return jv_string(j);
    case 't':
        return jv_lit(j, "true");
    case 'f':
        return jv_lit(j, "false");
    case 'n':
        return jv_lit(j, "null");
    default:
        return jv_number(j);
    }
}

bool qc_json_valid(const char *text, size_t n)
{
    struct jv j = {text, text + n};
    if (!jv_value(&j, 0))
        return false;
    jv_ws(&j);
    return j.p == j.end;
}
