/*
 * config_preset.c — presets: finding profiles/<name>.json, reading it, resolving "inherits"
 * chains (parents first, cycles detected) and applying its keys, flat or nested.
 *
 * A preset file is one JSON object:
 *   { "description": "...", "inherits": "qcnet-av2",
 *     "device.budget": "24GiB",                  flat keys ...
 *     "dist": { "world_size": 8 } }              ... or nested by section
 * A reference with a '/' or ending in ".json" is a path (relative to the folder of the file that
 * names it; on the command line, to the working directory); anything else is a NAME searched
 * as NAME.json in $QC_PROFILES_DIR, then the source tree's profiles/, then the installed ones.
 * Applying is all or nothing: the caller's configuration changes only when the whole chain
 * applied cleanly.
 */
#include "qc_config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_internal.h"
#include "qc_edit_distance.h"
#include "qc_file.h"

#define PRESET_MAX_BYTES (1u << 20) /* a preset is a few hundred bytes; refuse anything huge */
#define PRESET_MAX_DEPTH 16         /* inheritance levels */
#define PRESET_KEY_MAX   256

#ifndef QC_SOURCE_DIR
#    define QC_SOURCE_DIR "."
#endif
#ifndef QC_INSTALL_PROFILES
#    define QC_INSTALL_PROFILES "/usr/local/share/qctrain/profiles"
#endif

/* The files being applied, outermost first, for cycle detection and its message. */
struct preset_chain {
    int n;
    const char *name[PRESET_MAX_DEPTH]; /* as referenced; borrowed */
    char *real[PRESET_MAX_DEPTH];       /* realpath(), owned; NULL for an in-memory preset */
};

static enum qc_status apply_ref(struct qc_config *cfg, const char *ref, const char *base_dir,
                                struct preset_chain *chain);

// ---- finding a preset ----------------------------------------------------------------------

static bool is_path(const char *ref)
{
    size_t n = strlen(ref);
    return strchr(ref, '/') || (n >= 5 && strcmp(ref + n - 5, ".json") == 0);
}

/* The search folders, in order; returns how many (the env one only when set; the installed
 * ones beside the executable, for any install prefix, then under the configured prefix). */
static int search_dirs(const char *dirs[4])
{
    static char beside[4200];
    int n = 0;
    const char *env = getenv("QC_PROFILES_DIR");
    if (env && env[0])
        dirs[n++] = env;
    dirs[n++] = QC_SOURCE_DIR "/profiles";
    if (qc_file_exe_share("profiles", beside, sizeof beside))
        dirs[n++] = beside;
    dirs[n++] = QC_INSTALL_PROFILES;
    return n;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "preset 'x' not found", with a near name or the list of available presets as the hint. */
static enum qc_status preset_not_found(const char *name)
{
    const char *dirs[4];
    int ndirs = search_dirs(dirs);
    char *names[128];
    int nnames = 0;
    for (int d = 0; d < ndirs; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir)
            continue;
        struct dirent *e;
        while ((e = readdir(dir)) && nnames < (int)(sizeof names / sizeof names[0])) {
            size_t len = strlen(e->d_name);
            if (len <= 5 || strcmp(e->d_name + len - 5, ".json") != 0)
                continue;
            char *stem = strndup(e->d_name, len - 5);
            if (!stem)
                break;
            bool dup = false;
            for (int i = 0; i < nnames && !dup; i++)
                dup = strcmp(names[i], stem) == 0;
            if (dup)
                free(stem);
            else
                names[nnames++] = stem;
        }
        closedir(dir);
    }
    qsort(names, (size_t)nnames, sizeof names[0], cmp_str);

    char where[1024];
    size_t used = 0;
    where[0] = '\0';
    for (int d = 0; d < ndirs && used < sizeof where; d++) {
        int w = snprintf(where + used, sizeof where - used, "%s%s", d ? ", " : "", dirs[d]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; i < nnames; i++) {
        int dist = qc_edit_distance(name, names[i]);
        if (dist < best_d) {
            best_d = dist;
            best = names[i];
        }
    }
    enum qc_status st;
    if (best) {
        st = qc_errorf(QC_ERR_INVALID,
                       "preset '%s' not found (searched %s)\nhint: did you mean '%s'?", name, where,
                       best);
    } else {
        char avail[1024];
        used = 0;
        avail[0] = '\0';
        for (int i = 0; i < nnames && used < sizeof avail; i++) {
            int w = snprintf(avail + used, sizeof avail - used, "%s%s", i ? ", " : "", names[i]);
            if (w < 0)
                break;
            used += (size_t)w;
        }
        st = qc_errorf(QC_ERR_INVALID,
                       "preset '%s' not found (searched %s)\nhint: presets available: %s", name,
                       where, nnames ? avail : "none");
    }
    for (int i = 0; i < nnames; i++)
        free(names[i]);
    return st;
}

/* ref -> file path. Paths resolve against base_dir (NULL: the working directory). */
static enum qc_status resolve(const char *ref, const char *base_dir, char *out, size_t n)
{
    if (ref[0] == '\0')
        return qc_errorf(QC_ERR_INVALID, "empty preset name");
    if (is_path(ref)) {
        int w = (ref[0] == '/' || !base_dir) ? snprintf(out, n, "%s", ref)
                                             : snprintf(out, n, "%s/%s", base_dir, ref);
        if (w < 0 || (size_t)w >= n)
            return qc_errorf(QC_ERR_INVALID, "preset path too long: %.80s...", ref);
        return QC_OK;
    }
    const char *dirs[4];
    int ndirs = search_dirs(dirs);
    for (int d = 0; d < ndirs; d++) {
        int w = snprintf(out, n, "%s/%s.json", dirs[d], ref);
        if (w < 0 || (size_t)w >= n)
            continue;
        struct stat sb;
        if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode))
            return QC_OK;
    }
    return preset_not_found(ref);
}

enum qc_status qc_config_preset_path(const char *name_or_path, char *out, size_t n)
{
    char path[PATH_MAX];
    QC_TRY(resolve(name_or_path, NULL, path, sizeof path));
    struct stat sb;
    if (stat(path, &sb) != 0)
        return qc_errorf(QC_ERR_INVALID, "%s: cannot open: %s", path, strerror(errno));
    if (snprintf(out, n, "%s", path) >= (int)n)
        return qc_errorf(QC_ERR_INVALID, "preset path too long: %.80s...", path);
    return QC_OK;
}

// ---- reading -------------------------------------------------------------------------------

/* Reads a whole regular file (at most PRESET_MAX_BYTES) into a malloc'd NUL-terminated buffer. */
static enum qc_status read_file(const char *path, char **out, size_t *out_len)
{
    /* never open a FIFO or a device (qc_file.h); every preset error is bad input (exit 2) */
    int fd = -1;
    if (qc_file_open_regular(path, "preset", &fd, NULL) != QC_OK)
        return QC_ERR_INVALID; /* the message is set */
    char *buf = malloc(PRESET_MAX_BYTES + 1);
    if (!buf) {
        close(fd);
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory reading the preset", path);
    }
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd, buf + len, PRESET_MAX_BYTES + 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return qc_errorf(QC_ERR_INVALID, "%s: cannot read: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len > PRESET_MAX_BYTES) {
            free(buf);
            close(fd);
            return qc_errorf(QC_ERR_INVALID, "%s: larger than %u bytes; not a preset", path,
                             PRESET_MAX_BYTES);
        }
    }
    close(fd);
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return QC_OK;
}

// ---- applying ------------------------------------------------------------------------------

static char *printed(const cJSON *item, char *buf, size_t n)
{
    char *text = cJSON_PrintUnformatted(item);
    if (text && strlen(text) > 80)
        snprintf(buf, n, "%.77s...", text);
    else
        snprintf(buf, n, "%s", text ? text : "?");
    cJSON_free(text);
    return buf;
}

/* The option keys one preset file has set, to refuse a key given twice (flat and nested
 * spellings of one key included): last-wins would hide a mistake. */
struct preset_seen {
    const struct qc_config_option *opt[256];
    int n;
};

/* A JSON object with two members of the same name, anywhere in the tree: refused (cJSON keeps
 * both and a lookup would silently take one). */
static enum qc_status check_duplicate_members(const cJSON *obj, const char *path,
                                              const char *origin)
{
    for (const cJSON *a = obj->child; a; a = a->next) {
        for (const cJSON *b = a->next; b && a->string; b = b->next)
            if (b->string && strcmp(a->string, b->string) == 0)
                return qc_errorf(QC_ERR_INVALID,
                                 "%s: key '%s%s%.80s' appears twice\nhint: keep one of them (a "
                                 "preset states each setting once)",
                                 origin, path, path[0] ? "." : "", a->string);
        if (cJSON_IsObject(a) && a->string) {
            char sub[PRESET_KEY_MAX];
            snprintf(sub, sizeof sub, "%s%s%.80s", path, path[0] ? "." : "", a->string);
            QC_TRY(check_duplicate_members(a, sub, origin));
        }
    }
    return QC_OK;
}

/* A "\u0000" escape anywhere in a string of the JSON text: it would end the C string there
 * and silently truncate the value (or key). Escaped backslashes ("\\u0000") are text. */
static enum qc_status check_nul_escape(const char *text, size_t len, const char *origin)
{
    bool in_string = false;
    int line = 1;
    for (size_t i = 0; i < len; i++) {
        const char c = text[i];
        if (c == '\n')
            line++;
        if (!in_string) {
            in_string = c == '"';
            continue;
        }
        if (c == '"') {
            in_string = false;
        } else if (c == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 5 < len && strncmp(text + i + 2, "0000", 4) == 0)
                return qc_errorf(QC_ERR_INVALID,
                                 "%s: line %d: a string holds \\u0000 (a NUL character), which "
                                 "would cut it short\nhint: remove it",
                                 origin, line);
            i++; /* the escaped character */
        }
    }
    return QC_OK;
}

/* One member of the preset object: a known key, or a section object to descend into. */
static enum qc_status apply_member(struct qc_config *cfg, const cJSON *item, const char *prefix,
                                   const char *origin, struct preset_seen *seen)
{
    char key[PRESET_KEY_MAX];
    const char *name = item->string ? item->string : "";
    int w = prefix[0] ? snprintf(key, sizeof key, "%s.%s", prefix, name)
                      : snprintf(key, sizeof key, "%s", name);
    if (w < 0 || (size_t)w >= sizeof key)
        return qc_errorf(QC_ERR_INVALID, "%s: key '%.80s...': unknown key", origin, key);
    const struct qc_config_option *opt = qc_config_option_find(key);
    if (opt) {
        for (int i = 0; i < seen->n; i++)
            if (seen->opt[i] == opt)
                return qc_errorf(QC_ERR_INVALID,
                                 "%s: key '%s' is set twice (flat and nested spellings count as "
                                 "one key)\nhint: keep one of them",
                                 origin, key);
        if (seen->n < (int)(sizeof seen->opt / sizeof seen->opt[0]))
            seen->opt[seen->n++] = opt;
        return config_set_json(cfg, opt, item, origin);
    }
    if (cJSON_IsObject(item)) {
        for (const cJSON *c = item->child; c; c = c->next)
            QC_TRY(apply_member(cfg, c, key, origin, seen));
        return QC_OK;
    }
    return config_unknown_key(origin, key);
}

/* The base folder for relative "inherits" paths of the file at origin. */
static void dir_of(const char *origin, char *out, size_t n)
{
    const char *slash = strrchr(origin, '/');
    if (!slash)
        snprintf(out, n, ".");
    else if (slash == origin)
        snprintf(out, n, "/");
    else
        snprintf(out, n, "%.*s", (int)(slash - origin), origin);
}

static enum qc_status apply_text(struct qc_config *cfg, const char *text, size_t len,
                                 const char *origin, struct preset_chain *chain)
{
    if (memchr(text, '\0', len))
        return qc_errorf(QC_ERR_INVALID, "%s: malformed JSON: contains a NUL byte", origin);
    QC_TRY(check_nul_escape(text, len, origin));
    /* A NUL-terminated copy: the caller's buffer need not be terminated, and cJSON flags
     * trailing garbage only when it can see the terminator (len + 1 below). */
    char *copy = malloc(len + 1);
    if (!copy)
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory parsing the preset", origin);
    memcpy(copy, text, len);
    copy[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(copy, len + 1, &end, 1);
    size_t pos = len; /* where cJSON stopped (it reports about one past the bad character) */
    if (end && end >= copy && end <= copy + len)
        pos = (size_t)(end - copy);
    free(copy);
    if (!root) {
        int line = 1, col = 1;
        for (size_t i = 0; i < pos; i++) {
            if (text[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        return qc_errorf(QC_ERR_INVALID, "%s: malformed JSON near line %d, column %d", origin, line,
                         col);
    }
    enum qc_status st = QC_OK;
    char shown[100];
    struct preset_seen seen = {.n = 0};
    if (!cJSON_IsObject(root)) {
        st = qc_errorf(QC_ERR_INVALID, "%s: expected a JSON object of keys, got %s", origin,
                       printed(root, shown, sizeof shown));
        goto out;
    }
    st = check_duplicate_members(root, "", origin);
    if (st != QC_OK)
        goto out;
    /* Parents first, so this file's keys override what it inherits. */
    const cJSON *inh = cJSON_GetObjectItemCaseSensitive(root, "inherits");
    if (inh) {
        if (!cJSON_IsString(inh) || inh->valuestring[0] == '\0') {
            st = qc_errorf(QC_ERR_INVALID,
                           "%s: key 'inherits': expected a preset name or path, got %s", origin,
                           printed(inh, shown, sizeof shown));
            goto out;
        }
        char base[PATH_MAX];
        dir_of(origin, base, sizeof base);
        st = apply_ref(cfg, inh->valuestring, base, chain);
        if (st != QC_OK)
            goto out;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c->string && strcmp(c->string, "inherits") == 0)
            continue;
        if (c->string && strcmp(c->string, "description") == 0) {
            if (!cJSON_IsString(c)) {
                st = qc_errorf(QC_ERR_INVALID, "%s: key 'description': expected a string, got %s",
                               origin, printed(c, shown, sizeof shown));
                goto out;
            }
            continue;
        }
        st = apply_member(cfg, c, "", origin, &seen);
        if (st != QC_OK)
            goto out;
    }
out:
    cJSON_Delete(root);
    return st;
}

static enum qc_status cycle_error(const struct preset_chain *chain, const char *ref)
{
    char msg[2048];
    size_t used = 0;
    msg[0] = '\0';
    for (int i = 0; i < chain->n && used < sizeof msg; i++) {
        int w = snprintf(msg + used, sizeof msg - used, "%s -> ", chain->name[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return qc_errorf(QC_ERR_INVALID, "preset inheritance cycle: %s%s", msg, ref);
}

static enum qc_status apply_ref(struct qc_config *cfg, const char *ref, const char *base_dir,
                                struct preset_chain *chain)
{
    char path[PATH_MAX];
    QC_TRY(resolve(ref, base_dir, path, sizeof path));
    char *real = realpath(path, NULL);
    if (!real)
        return qc_errorf(QC_ERR_INVALID, "%s: cannot open: %s", path, strerror(errno));
    for (int i = 0; i < chain->n; i++) {
        if (chain->real[i] && strcmp(chain->real[i], real) == 0) {
            free(real);
            return cycle_error(chain, ref);
        }
    }
    if (chain->n == PRESET_MAX_DEPTH) {
        free(real);
        return qc_errorf(QC_ERR_INVALID, "%s: preset inheritance deeper than %d levels", path,
                         PRESET_MAX_DEPTH);
    }
    char *text = NULL;
    size_t len = 0;
    enum qc_status st = read_file(path, &text, &len);
    if (st != QC_OK) {
        free(real);
        return st;
    }
    chain->name[chain->n] = ref;
    chain->real[chain->n] = real;
    chain->n++;
    st = apply_text(cfg, text, len, path, chain);
    chain->n--;
    free(real);
    free(text);
    return st;
}

enum qc_status qc_config_apply_preset(struct qc_config *cfg, const char *name_or_path)
{
    struct qc_config tmp = *cfg;
    struct preset_chain chain = {0};
    QC_TRY(apply_ref(&tmp, name_or_path, NULL, &chain));
    *cfg = tmp;
    return QC_OK;
}

enum qc_status qc_config_apply_preset_json(struct qc_config *cfg, const char *json, size_t len,
                                           const char *origin)
{
    struct qc_config tmp = *cfg;
    struct preset_chain chain = {0};
    chain.name[0] = origin;
    chain.real[0] = realpath(origin, NULL); /* NULL when origin is not a file: no self-cycle */
    chain.n = 1;
    enum qc_status st = apply_text(&tmp, json, len, origin, &chain);
    free(chain.real[0]);
    if (st == QC_OK)
        *cfg = tmp;
    return st;
}
