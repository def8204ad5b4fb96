/*
 * config_value.c — converting values into fields of struct qc_config (text from --set and
 * preset strings, numbers and booleans from preset JSON), the defaults (the option table's text,
 * parsed as --set is), range checks, cross-field validation and the JSON dump.
 *
 * Every error names where the value came from (origin), the key and the value:
 *   profiles/x.json: key 'model.hidden_dim': expected an integer, got "abc"
 *   --set: key 'model.hidden_dim': out of range [1, 4096]: 0
 * The dump prints every key in table order, nested by section, sizes in bytes, choices by
 * name and floats in their shortest round-trip form, so a dump applied as a preset gives back
 * the same configuration.
 */
#include "qc_config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_internal.h"
#include "qc_edit_distance.h"

#define SIZE_HINT                                                                                  \
    "hint: units are B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"

/* A parsed value before it is stored; which member is live follows the option's type. */
union config_value {
    int64_t i;
    double f;
    bool b;
    uint64_t s;
    int64_t choice;
    const char *str;
};

// ---- sizes ---------------------------------------------------------------------------------

struct size_unit {
    const char *name;
    uint64_t mult;
};

static const struct size_unit size_units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},
    {"ki", 1ull << 10},
    {"kib", 1ull << 10},
    {"m", 1ull << 20},
    {"mi", 1ull << 20},
    {"mib", 1ull << 20},
    {"g", 1ull << 30},
    {"gi", 1ull << 30},
    {"gib", 1ull << 30},
    {"t", 1ull << 40},
    {"ti", 1ull << 40},
    {"tib", 1ull << 40},
    {"kb", 1000ull},
    {"mb", 1000000ull},
    {"gb", 1000000000ull},
    {"tb", 1000000000000ull},
};

/* The rule (README.md, "Configuration"): whitespace around the value is ignored; a number
 * (digits, or a decimal / exponent form), then optionally one space, then a unit (case ignored).
 * "1GiB", " 1GiB ", "1 GiB" are the same; "1  GiB" (two spaces) and "1\tGiB" are refused. */
int config_size_parse(const char *s, uint64_t *out)
{
    if (!s)
        return -1;
    while (isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        len--;
    char buf[128];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (!(isdigit((unsigned char)buf[0]) || buf[0] == '.'))
        return -1;
    /* Plain integers go through strtoull so values above 2^53 stay exact. */
    size_t ndig = strspn(buf, "0123456789");
    if (buf[ndig] == '\0') {
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno == ERANGE)
            return -1;
        *out = (uint64_t)v;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (end == buf || errno == ERANGE || !isfinite(v) || v < 0)
        return -1;
    if (*end == ' ') { /* one space, then a unit */
        end++;
        if (!isalpha((unsigned char)*end))
            return -1;
    }
    for (size_t i = 0; i < sizeof size_units / sizeof size_units[0]; i++) {
        if (strcasecmp(end, size_units[i].name) != 0)
            continue;
        double bytes = v * (double)size_units[i].mult;
        /* a fraction of a byte is an error, of a larger unit it rounds down (0.48GiB) */
        if (bytes >= 18446744073709551616.0 || (size_units[i].mult == 1 && bytes != floor(bytes)))
            return -1;
        bytes = floor(bytes);
        *out = (uint64_t)bytes;
        return 0;
    }
    return -1;
}

enum qc_status qc_parse_size(const char *s, uint64_t *out)
{
    uint64_t v;
    if (config_size_parse(s, &v) != 0)
        return qc_errorf(
            QC_ERR_INVALID,
            "expected a size such as 24GiB, 512MiB, 1e9 or 4096, got \"%.80s\"\n" SIZE_HINT,
            s ? s : "");
    *out = v;
    return QC_OK;
}

// ---- text values ---------------------------------------------------------------------------

static int parse_int_text(const char *s, int64_t *out)
{
    if (!s[0] || isspace((unsigned char)s[0]))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end == '\0' && errno == 0) {
        *out = v;
        return 0;
    }
    /* "1e6": an integral number written in floating-point notation. */
    errno = 0;
    double d = strtod(s, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(d) || d != floor(d) ||
        d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return -1;
    *out = (int64_t)d;
    return 0;
}

static int parse_float_text(const char *s, double *out)
{
    if (!s[0] || isspace((unsigned char)s[0]))
        return -1;
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(d))
        return -1;
    *out = d;
    return 0;
}

static int parse_bool_text(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/* "fused, unfused" into buf. */
static void choices_list(const struct qc_config_option *opt, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (const char *const *c = opt->choices; *c; c++) {
        int w = snprintf(buf + used, n - used, "%s%s", c == opt->choices ? "" : ", ", *c);
        if (w < 0 || (size_t)w >= n - used)
            return;
        used += (size_t)w;
    }
}

/* The "expected ..., got <shown>" error of opt's type; shown is already quoted when text. */
static enum qc_status type_error(const struct qc_config_option *opt, const char *origin,
                                 const char *shown)
{
    switch (opt->type) {
    case QC_CONFIG_INT:
        return qc_errorf(QC_ERR_INVALID, "%s: key '%s': expected an integer, got %s", origin,
                         opt->key, shown);
    case QC_CONFIG_FLOAT:
        return qc_errorf(QC_ERR_INVALID, "%s: key '%s': expected a number, got %s", origin,
                         opt->key, shown);
    case QC_CONFIG_BOOL:
        return qc_errorf(QC_ERR_INVALID, "%s: key '%s': expected true or false, got %s", origin,
                         opt->key, shown);
    case QC_CONFIG_SIZE:
        return qc_errorf(QC_ERR_INVALID,
                         "%s: key '%s': expected a size such as 24GiB, 512MiB, 1e9 or 4096, "
                         "got %s\n" SIZE_HINT,
                         origin, opt->key, shown);
    case QC_CONFIG_STRING:
        return qc_errorf(QC_ERR_INVALID, "%s: key '%s': expected a string, got %s", origin,
                         opt->key, shown);
    case QC_CONFIG_CHOICE: {
        char list[256];
        choices_list(opt, list, sizeof list);
        return qc_errorf(QC_ERR_INVALID, "%s: key '%s': expected one of %s, got %s", origin,
                         opt->key, list, shown);
    }
    case QC_CONFIG_TYPE_COUNT:
        break;
    }
    qc_assert_fail(__FILE__, __LINE__, "type", "option %s has type %d", opt->key, (int)opt->type);
}

static enum qc_status choice_error(const struct qc_config_option *opt, const char *origin,
                                   const char *text)
{
    char list[256];
    choices_list(opt, list, sizeof list);
    const char *best = NULL;
    int best_d = 3;
    for (const char *const *c = opt->choices; *c; c++) {
        int d = qc_edit_distance(text, *c);
        if (d < best_d) {
            best_d = d;
            best = *c;
        }
    }
    if (best)
        return qc_errorf(QC_ERR_INVALID,
                         "%s: key '%s': expected one of %s, got \"%.80s\"\nhint: did you mean "
                         "'%s'?",
                         origin, opt->key, list, text, best);
    return qc_errorf(QC_ERR_INVALID, "%s: key '%s': expected one of %s, got \"%.80s\"", origin,
                     opt->key, list, text);
}

static enum qc_status parse_text(const struct qc_config_option *opt, const char *text,
                                 const char *origin, union config_value *v)
{
    char shown[100];
    snprintf(shown, sizeof shown, "\"%.80s\"", text);
    switch (opt->type) {
    case QC_CONFIG_INT:
        return parse_int_text(text, &v->i) == 0 ? QC_OK : type_error(opt, origin, shown);
    case QC_CONFIG_FLOAT:
        return parse_float_text(text, &v->f) == 0 ? QC_OK : type_error(opt, origin, shown);
    case QC_CONFIG_BOOL:
        return parse_bool_text(text, &v->b) == 0 ? QC_OK : type_error(opt, origin, shown);
    case QC_CONFIG_SIZE:
        return config_size_parse(text, &v->s) == 0 ? QC_OK : type_error(opt, origin, shown);
    case QC_CONFIG_STRING:
        v->str = text;
        return QC_OK;
    case QC_CONFIG_CHOICE:
        for (int64_t i = 0; opt->choices[i]; i++) {
            if (strcmp(opt->choices[i], text) == 0) {
                v->choice = i;
                return QC_OK;
            }
        }
        return choice_error(opt, origin, text);
    case QC_CONFIG_TYPE_COUNT:
        break;
    }
    qc_assert_fail(__FILE__, __LINE__, "type", "option %s has type %d", opt->key, (int)opt->type);
}

// ---- range check and store -----------------------------------------------------------------

static enum qc_status check_and_store(struct qc_config *cfg, const struct qc_config_option *opt,
                                      const union config_value *v, const char *origin)
{
    char *field = (char *)cfg + opt->offset;
    switch (opt->type) {
    case QC_CONFIG_INT:
        if (v->i < opt->imin || v->i > opt->imax)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: key '%s': out of range [%" PRId64 ", %" PRId64 "]: %" PRId64,
                             origin, opt->key, opt->imin, opt->imax, v->i);
        QC_ASSERT(opt->size == sizeof(int64_t), "%s: int field of %zu bytes", opt->key, opt->size);
        memcpy(field, &v->i, sizeof v->i);
        return QC_OK;
    case QC_CONFIG_FLOAT:
        if (!(v->f >= opt->fmin && v->f <= opt->fmax))
            return qc_errorf(QC_ERR_INVALID, "%s: key '%s': out of range [%g, %g]: %g", origin,
                             opt->key, opt->fmin, opt->fmax, v->f);
        QC_ASSERT(opt->size == sizeof(double), "%s: float field of %zu bytes", opt->key, opt->size);
        memcpy(field, &v->f, sizeof v->f);
        return QC_OK;
    case QC_CONFIG_BOOL:
        QC_ASSERT(opt->size == sizeof(bool), "%s: bool field of %zu bytes", opt->key, opt->size);
        memcpy(field, &v->b, sizeof v->b);
        return QC_OK;
    case QC_CONFIG_SIZE:
        if (v->s < opt->smin || v->s > opt->smax)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: key '%s': out of range [%" PRIu64 ", %" PRIu64 "]: %" PRIu64,
                             origin, opt->key, opt->smin, opt->smax, v->s);
        QC_ASSERT(opt->size == sizeof(uint64_t), "%s: size field of %zu bytes", opt->key,
                  opt->size);
        memcpy(field, &v->s, sizeof v->s);
        return QC_OK;
    case QC_CONFIG_STRING: {
        size_t len = strlen(v->str);
        if (len >= opt->size)
            return qc_errorf(QC_ERR_INVALID, "%s: key '%s': longer than %zu bytes: \"%.40s...\"",
                             origin, opt->key, opt->size - 1, v->str);
        memcpy(field, v->str, len + 1);
        return QC_OK;
    }
    case QC_CONFIG_CHOICE:
        if (opt->size == sizeof(int64_t)) {
            memcpy(field, &v->choice, sizeof v->choice);
        } else {
            QC_ASSERT(opt->size == sizeof(int), "%s: choice field of %zu bytes", opt->key,
                      opt->size);
            int c = (int)v->choice;
            memcpy(field, &c, sizeof c);
        }
        return QC_OK;
    case QC_CONFIG_TYPE_COUNT:
        break;
    }
    qc_assert_fail(__FILE__, __LINE__, "type", "option %s has type %d", opt->key, (int)opt->type);
}

enum qc_status qc_config_set(struct qc_config *cfg, const char *key, const char *value,
                             const char *origin)
{
    const struct qc_config_option *opt = qc_config_option_find(key);
    if (!opt)
        return config_unknown_key(origin, key);
    union config_value v;
    QC_TRY(parse_text(opt, value, origin, &v));
    return check_and_store(cfg, opt, &v, origin);
}

void qc_config_defaults(struct qc_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    const int n = qc_config_option_count();
    for (int i = 0; i < n; i++) {
        const struct qc_config_option *opt = qc_config_option_at(i);
        enum qc_status st = qc_config_set(cfg, opt->key, opt->def, "defaults");
        QC_ASSERT(st == QC_OK, "bad default in the option table: %s", qc_error_last());
    }
}

enum qc_status qc_config_apply_set(struct qc_config *cfg, const char *key_eq_value)
{
    const char *eq = strchr(key_eq_value, '=');
    if (!eq || eq == key_eq_value)
        return qc_errorf(QC_ERR_INVALID,
                         "--set: expected key=value, got \"%.80s\"\nhint: e.g. --set "
                         "device.budget=24GiB",
                         key_eq_value);
    char key[256];
    size_t klen = (size_t)(eq - key_eq_value);
    if (klen >= sizeof key)
        return config_unknown_key("--set", key_eq_value);
    memcpy(key, key_eq_value, klen);
    key[klen] = '\0';
    return qc_config_set(cfg, key, eq + 1, "--set");
}

// ---- JSON values (presets) -----------------------------------------------------------------

enum qc_status config_set_json(struct qc_config *cfg, const struct qc_config_option *opt,
                               const cJSON *item, const char *origin)
{
    union config_value v;
    if (cJSON_IsString(item))
        QC_TRY(parse_text(opt, item->valuestring, origin, &v));
    else if (cJSON_IsNumber(item) && opt->type == QC_CONFIG_FLOAT)
        v.f = item->valuedouble;
    else if (cJSON_IsNumber(item) && opt->type == QC_CONFIG_INT && isfinite(item->valuedouble) &&
             item->valuedouble == floor(item->valuedouble) &&
             item->valuedouble >= -9223372036854775808.0 &&
             item->valuedouble < 9223372036854775808.0)
        v.i = (int64_t)item->valuedouble;
    else if (cJSON_IsNumber(item) && opt->type == QC_CONFIG_SIZE && item->valuedouble >= 0 &&
             item->valuedouble < 18446744073709551616.0 &&
             item->valuedouble == floor(item->valuedouble))
        v.s = (uint64_t)item->valuedouble;
    else if (cJSON_IsBool(item) && opt->type == QC_CONFIG_BOOL)
        v.b = cJSON_IsTrue(item);
    else {
        char *text = cJSON_PrintUnformatted(item);
        char shown[100];
        if (text && strlen(text) > 80)
            snprintf(shown, sizeof shown, "%.77s...", text);
        else
            snprintf(shown, sizeof shown, "%s", text ? text : "?");
        cJSON_free(text);
        return type_error(opt, origin, shown);
    }
    return check_and_store(cfg, opt, &v, origin);
}

// ---- formatting and the dump ---------------------------------------------------------------

/* The shortest %.Ng (N = 15..17) that reads back as the same double. */
static void format_double(double d, char *buf, size_t n)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

void qc_config_format_value(const struct qc_config *cfg, const struct qc_config_option *opt,
                            char *buf, size_t n)
{
    const char *field = (const char *)cfg + opt->offset;
    switch (opt->type) {
    case QC_CONFIG_INT: {
        int64_t v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%" PRId64, v);
        return;
    }
    case QC_CONFIG_FLOAT: {
        double v;
        memcpy(&v, field, sizeof v);
        format_double(v, buf, n);
        return;
    }
    case QC_CONFIG_BOOL: {
        bool v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%s", v ? "true" : "false");
        return;
    }
    case QC_CONFIG_SIZE: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%" PRIu64, v);
        return;
    }
    case QC_CONFIG_STRING:
        snprintf(buf, n, "%s", field);
        return;
    case QC_CONFIG_CHOICE: {
        int64_t v;
        if (opt->size == sizeof(int64_t)) {
            memcpy(&v, field, sizeof v);
        } else {
            int c;
            memcpy(&c, field, sizeof c);
            v = c;
        }
        int64_t nchoices = 0;
        while (opt->choices[nchoices])
            nchoices++;
        snprintf(buf, n, "%s", v >= 0 && v < nchoices ? opt->choices[v] : "?");
        return;
    }
    case QC_CONFIG_TYPE_COUNT:
        break;
    }
    qc_assert_fail(__FILE__, __LINE__, "type", "option %s has type %d", opt->key, (int)opt->type);
}

static void write_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", out);
            break;
        case '\\':
            fputs("\\\\", out);
            break;
        case '\n':
            fputs("\\n", out);
            break;
        case '\t':
            fputs("\\t", out);
            break;
        case '\r':
            fputs("\\r", out);
            break;
        default:
            if (*p < 0x20)
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

/* Length of the section part of a key ("model" of "model.hidden_dim"). */
static size_t section_len(const char *key)
{
    const char *dot = strchr(key, '.');
    return dot ? (size_t)(dot - key) : strlen(key);
}

enum qc_status qc_config_dump_json(const struct qc_config *cfg, FILE *out)
{
    int n = qc_config_option_count();
    bool done[256] = {false};
    QC_ASSERT(n <= (int)(sizeof done / sizeof done[0]), "%d options", n);
    fputs("{\n", out);
    bool first_section = true;
    /* Sections in order of first appearance; a section's keys in table order. */
    for (int i = 0; i < n; i++) {
        if (done[i])
            continue;
        const char *sec = qc_config_option_at(i)->key;
        size_t slen = section_len(sec);
        fprintf(out, "%s  \"%.*s\": {\n", first_section ? "" : ",\n", (int)slen, sec);
        first_section = false;
        bool first = true;
        for (int j = i; j < n; j++) {
            const struct qc_config_option *o = qc_config_option_at(j);
            if (section_len(o->key) != slen || strncmp(o->key, sec, slen) != 0)
                continue;
            done[j] = true;
            char val[QC_CONFIG_STR_MAX + 32];
            qc_config_format_value(cfg, o, val, sizeof val);
            fprintf(out, "%s    \"%s\": ", first ? "" : ",\n", o->key + slen + 1);
            first = false;
            if (o->type == QC_CONFIG_STRING || o->type == QC_CONFIG_CHOICE)
                write_json_string(out, val);
            else if (o->type == QC_CONFIG_FLOAT && strpbrk(val, "ni")) /* inf, nan */
                fputs("null", out);
            else
                fputs(val, out);
        }
        fputs("\n  }", out);
    }
    fputs("\n}\n", out);
    if (ferror(out))
        return qc_errorf(QC_ERR_IO, "writing the configuration dump failed");
    return QC_OK;
}

enum qc_status qc_config_to_json(const struct qc_config *cfg, char **out)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return qc_errorf(QC_ERR_NOMEM, "open_memstream for the configuration dump failed");
    enum qc_status st = qc_config_dump_json(cfg, f);
    if (fclose(f) != 0 && st == QC_OK)
        st = qc_errorf(QC_ERR_NOMEM, "configuration dump: out of memory");
    if (st != QC_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    return QC_OK;
}

// ---- cross-field validation ----------------------------------------------------------------

enum qc_status qc_config_validate(const struct qc_config *cfg)
{
    if (cfg->num_heads * cfg->head_dim != cfg->hidden_dim)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: model.num_heads * model.head_dim = %" PRId64
                         " * %" PRId64 " = %" PRId64 " but model.hidden_dim = %" PRId64
                         "\nhint: they must be equal, e.g. --set model.head_dim=%" PRId64,
                         cfg->num_heads, cfg->head_dim, cfg->num_heads * cfg->head_dim,
                         cfg->hidden_dim,
                         cfg->hidden_dim % cfg->num_heads == 0 ? cfg->hidden_dim / cfg->num_heads
                                                               : cfg->head_dim);
    if (cfg->num_future_steps % cfg->num_recurrent_steps != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: model.num_recurrent_steps = %" PRId64
                         " does not divide model.num_future_steps = %" PRId64,
                         cfg->num_recurrent_steps, cfg->num_future_steps);
    if (cfg->num_t2m_steps > cfg->num_historical_steps)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: model.num_t2m_steps = %" PRId64
                         " exceeds model.num_historical_steps = %" PRId64,
                         cfg->num_t2m_steps, cfg->num_historical_steps);
    if (cfg->global_batch > 0) {
        const int64_t ranks = cfg->world_size > 0 ? cfg->world_size : 1;
        if (cfg->batch_size * cfg->grad_accum * ranks != cfg->global_batch)
            return qc_errorf(QC_ERR_INVALID,
                             "invalid configuration: train.global_batch = %" PRId64
                             " but train.batch_size x train.grad_accum x dist.world_size = %" PRId64
                             " x %" PRId64 " x %" PRId64 " = %" PRId64
                             "\nhint: change one of them, or set train.global_batch=0",
                             cfg->global_batch, cfg->batch_size, cfg->grad_accum, ranks,
                             cfg->batch_size * cfg->grad_accum * ranks);
    }
    if (!(cfg->dropout < 1.0))
        return qc_errorf(QC_ERR_INVALID, "invalid configuration: model.dropout = %g must be < 1",
                         cfg->dropout);
    if (cfg->alloc_round == 0 || (cfg->alloc_round & (cfg->alloc_round - 1)) != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: alloc.round = %" PRIu64 " is not a power of two",
                         cfg->alloc_round);
    if (cfg->alloc_small_max > cfg->alloc_small_segment)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: alloc.small_max = %" PRIu64
                         " exceeds alloc.small_segment = %" PRIu64,
                         cfg->alloc_small_max, cfg->alloc_small_segment);
    if (cfg->alloc_small_segment > cfg->alloc_large_segment)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: alloc.small_segment = %" PRIu64
                         " exceeds alloc.large_segment = %" PRIu64,
                         cfg->alloc_small_segment, cfg->alloc_large_segment);
    if (cfg->offload_block_size % 4096 != 0)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: offload.block_size = %" PRIu64
                         " is not a multiple of 4096",
                         cfg->offload_block_size);
    if (cfg->offload_max_inflight < cfg->offload_block_size)
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: offload.max_inflight = %" PRIu64
                         " is less than offload.block_size = %" PRIu64,
                         cfg->offload_max_inflight, cfg->offload_block_size);
    if (cfg->offload_placement == QC_PLACE_NVME && cfg->offload_nvme_dir[0] == '\0')
        return qc_errorf(QC_ERR_INVALID,
                         "invalid configuration: offload.placement = nvme needs offload.nvme_dir"
                         "\nhint: --set offload.nvme_dir=/path/on/nvme");
    return QC_OK;
}
