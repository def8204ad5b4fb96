/*
 * run_dir.c — one writer per run folder, and what a crash leaves in it (docs/RELIABILITY.md).
 *
 * The lock is an exclusive flock() on RUN/.lock, taken before a trainer reads or writes
 * anything in RUN and held until it ends. The kernel drops it when its holder dies, kill -9
 * included, so a stale lock cannot exist. The holder writes its PID into the file, so a second
 * trainer names it. The file is never unlinked: unlinking a lock file lets two processes lock
 * two different inodes of the same name.
 *
 * With the lock held nothing else writes RUN, so whatever an earlier, killed writer left
 * half-done is garbage and is recovered here:
 *   ckpt-<step>.tmp/        a checkpoint being assembled: removed whole, whatever it holds;
 *   ckpt-<step>.old/        a checkpoint moved aside to be replaced: put back when the new one
 *                           never arrived (ckpt-<step>/ missing), else removed;
 *   ckpt-<step>.del/        a checkpoint that retention (train.keep_last / keep_best) was
 *                           removing: removed whole;
 *   *.tmp, *.tmp.XXXXXX     temporary files of the atomic writers (metrics.jsonl.tmp,
 *                           memory.json.tmp, ...): removed.
 */
#include "qc_train.h"
#include "train_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h> /* nanosleep */
#include <unistd.h>

#include <cJSON.h>
#include <xxhash.h> /* XXH3_64bits streaming */

#include "qc_file.h"

struct qc_run_lock {
    int fd;          /* RUN/.lock, flock(LOCK_EX) held */
    char path[4200]; /* RUN/.lock, for messages */
};

enum qc_status qc_run_lock_acquire(const char *run_dir, struct qc_run_lock **out)
{
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/.lock", run_dir) >= sizeof path)
        return qc_errorf(QC_ERR_INVALID, "run folder path too long: %s", run_dir);
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO,
                         "run folder %s: cannot open its lock file %s: %s\nhint: choose a "
                         "writable --out folder",
                         run_dir, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        char pid[32] = "";
        const ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        close(fd);
        if (e != EWOULDBLOCK)
            return qc_errorf(QC_ERR_IO,
                             "run folder %s: cannot lock %s: %s\nhint: the run folder must be "
                             "on a file system with file locks (flock)",
                             run_dir, path, strerror(e));
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        return qc_errorf(QC_ERR_INVALID,
                         "run folder %s is in use by another trainer (PID %s)\nhint: wait for "
                         "it to end or stop it (kill %s), or train into another --out folder",
                         run_dir, pid[0] ? pid : "unknown", pid[0] ? pid : "<pid>");
    }
    char pid[32];
    const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        const int e = errno;
        close(fd);
        return qc_errorf(QC_ERR_IO, "run folder %s: cannot write %s: %s", run_dir, path,
                         strerror(e));
    }
    struct qc_run_lock *l = malloc(sizeof *l);
    if (!l) {
        close(fd);
        return qc_errorf(QC_ERR_NOMEM, "run lock: out of memory");
    }
    l->fd = fd;
    snprintf(l->path, sizeof l->path, "%s", path);
    *out = l;
    return QC_OK;
}

void qc_run_lock_release(struct qc_run_lock *l)
{
    if (!l)
        return;
    /* no PID: nobody holds it. A failure only leaves a stale PID in the file, which nobody
     * reads while the lock is free (a holder rewrites it), so it is reported, not fatal. */
    if (ftruncate(l->fd, 0) != 0)
        qc_log(QC_LOG_WARN,
               "run folder: cannot clear the PID in %s: %s (the lock is released "
               "anyway)",
               l->path, strerror(errno));
    close(l->fd); /* drops the flock */
    free(l);
}

// ---- recovery ----------------------------------------------------------------------------------

/* Test hook (docs/RELIABILITY.md; train_internal.h). Read once; unset or invalid: no delay. Here,
 * below checkpoint.c, which calls it too. */
void train_fault_delay(void)
{
    static long delay_ms = -1;
    if (delay_ms < 0) {
        const char *e = getenv("QC_FAULT_CKPT_DELAY_MS");
        char *end = NULL;
        const long v = e ? strtol(e, &end, 10) : 0;
        delay_ms = e && end != e && *end == '\0' && v > 0 && v < 60000 ? v : 0;
    }
    if (delay_ms > 0) {
        const struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

enum qc_status train_remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? QC_OK
                               : qc_errorf(QC_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return qc_errorf(QC_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return QC_OK;
}

/* "ckpt-<digits>" followed by exactly `suffix` ("" for a checkpoint). */
static bool ckpt_name(const char *name, const char *suffix)
{
    if (strncmp(name, "ckpt-", 5) != 0)
        return false;
    const char *p = name + 5;
    const char *d = p;
    while (*p >= '0' && *p <= '9')
        p++;
    return p > d && strcmp(p, suffix) == 0;
}

/* A temporary file name of the atomic writers: "*.tmp" or "*.tmp.XXXXXX". */
static bool tmp_file_name(const char *name)
{
    const size_t n = strlen(name);
    if (n > 4 && strcmp(name + n - 4, ".tmp") == 0)
        return true;
    const char *t = strstr(name, ".tmp.");
    return t && t != name && strlen(t + 5) == 6 && !strchr(t + 5, '.');
}

enum qc_status qc_run_dir_recover(const char *run_dir, int64_t *recovered)
{
    int64_t count = 0;
    DIR *d = opendir(run_dir);
    if (!d)
        return qc_errorf(QC_ERR_IO, "run folder %s: cannot open: %s", run_dir, strerror(errno));
    enum qc_status st = QC_OK;
    struct dirent *de;
    while (st == QC_OK && (de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        char p[4400], fin[4400];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", run_dir, name) >= sizeof p)
            continue;
        struct stat sb;
        if (lstat(p, &sb) != 0)
            continue;
        const bool tmp_dir =
            S_ISDIR(sb.st_mode) && (ckpt_name(name, ".tmp") || ckpt_name(name, ".del"));
        const bool old_dir = S_ISDIR(sb.st_mode) && ckpt_name(name, ".old");
        if (tmp_dir || old_dir || (S_ISREG(sb.st_mode) && tmp_file_name(name)))
            train_fault_delay();
        if (tmp_dir) {
            st = train_remove_tree(p);
            count++;
        } else if (old_dir) {
            snprintf(fin, sizeof fin, "%.*s", (int)(strlen(p) - 4), p);
            if (lstat(fin, &sb) == 0) {
                st = train_remove_tree(p);
            } else if (rename(p, fin) != 0) {
                st = qc_errorf(QC_ERR_IO, "run folder %s: cannot put %s back as %s: %s", run_dir, p,
                               fin, strerror(errno));
            }
            count++;
        } else if (S_ISREG(sb.st_mode) && tmp_file_name(name)) {
            if (unlink(p) != 0 && errno != ENOENT)
                st = qc_errorf(QC_ERR_IO, "run folder %s: cannot remove %s: %s", run_dir, p,
                               strerror(errno));
            count++;
        }
    }
    closedir(d);
    if (st != QC_OK)
        return st;
    if (count > 0)
        qc_log(QC_LOG_INFO,
               "run folder %s: recovered %" PRId64 " leftover(s) of an interrupted writer", run_dir,
               count);
    if (recovered)
        *recovered = count;
    return QC_OK;
}

// ---- what a run folder holds: new runs, --overwrite -------------------------------------------

enum qc_status qc_check_utf8(const char *what, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned c = *p;
        int len = c < 0x80             ? 1
                  : (c & 0xE0) == 0xC0 ? 2
                  : (c & 0xF0) == 0xE0 ? 3
                  : (c & 0xF8) == 0xF0 ? 4
                                       : 0;
        unsigned cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xC0) != 0x80) {
                len = 0;
                break;
            }
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        /* overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either */
        if (len == 0 || (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return qc_errorf(QC_ERR_INVALID,
                             "%s: byte %td (0x%02x) is not valid UTF-8\nhint: run folders, "
                             "checkpoints and data files are recorded in JSON (run.json, the "
                             "checkpoint metadata): name them in UTF-8",
                             what, (const char *)p - s, c);
        p += len;
    }
    return QC_OK;
}

enum qc_status qc_run_dir_check_new(const char *run_dir, bool overwrite)
{
    DIR *d = opendir(run_dir);
    if (!d)
        return errno == ENOENT ? QC_OK
                               : qc_errorf(QC_ERR_IO, "run folder %s: cannot open: %s", run_dir,
                                           strerror(errno));
    int64_t entries = 0;
    char first[256] = "";
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, ".lock"))
            continue; /* .lock: an empty folder a failed start left locked once */
        if (entries++ == 0)
            snprintf(first, sizeof first, "%s", name);
    }
    closedir(d);
    if (entries == 0)
        return QC_OK;
    /* a trainer running there is named first (its PID); --overwrite then holds the lock, so
     * a run is never cleared from under its trainer */
    struct qc_run_lock *lock = NULL;
    QC_TRY(qc_run_lock_acquire(run_dir, &lock));
    if (!overwrite) {
        qc_run_lock_release(lock);
        return qc_errorf(QC_ERR_INVALID,
                         "run folder %s is not empty (%" PRId64 " entries, e.g. %s): it holds an "
                         "earlier run\nhint: continue it with --resume %s, train into a new "
                         "--out folder, or add --overwrite to clear it first",
                         run_dir, entries, first, run_dir);
    }
    /* --overwrite: renamed away in one step, then removed; a crash in between leaves
     * RUN.overwritten-<pid>/ beside it, never a mix of two runs */
    char away[4200];
    size_t len = strlen(run_dir);
    while (len > 1 && run_dir[len - 1] == '/')
        len--;
    if ((size_t)snprintf(away, sizeof away, "%.*s.overwritten-%ld", (int)len, run_dir,
                         (long)getpid()) >= sizeof away) {
        qc_run_lock_release(lock);
        return qc_errorf(QC_ERR_INVALID, "run folder path too long: %s", run_dir);
    }
    enum qc_status st = train_remove_tree(away);
    if (st == QC_OK && rename(run_dir, away) != 0)
        st = qc_errorf(QC_ERR_IO, "--overwrite: cannot move run folder %s aside to %s: %s", run_dir,
                       away, strerror(errno));
    qc_run_lock_release(lock);
    if (st == QC_OK)
        st = train_remove_tree(away);
    if (st == QC_OK)
        qc_log(QC_LOG_INFO,
               "run folder %s: the earlier run (%" PRId64 " entries) removed "
               "(--overwrite)",
               run_dir, entries);
    return st;
}

// ---- the run's data: RUN/run.json "data" --------------------------------------------------------

void qc_run_data_free(struct qc_run_data *d)
{
    if (!d)
        return;
    free(d->f);
    d->f = NULL;
    d->n = 0;
    free(d->val);
    d->val = NULL;
    d->nval = 0;
}

enum qc_status qc_run_data_set_val(struct qc_run_data *d, int64_t eval_every, int64_t val_scenes,
                                   const char *const *paths, int n)
{
    free(d->val);
    d->val = calloc((size_t)(n > 0 ? n : 1), sizeof *d->val);
    d->nval = 0;
    if (!d->val)
        return qc_errorf(QC_ERR_NOMEM, "run data: out of memory");
    for (int i = 0; i < n; i++) {
        QC_TRY(qc_check_utf8("validation file path", paths[i]));
        if (!realpath(paths[i], d->val[i]))
            return qc_errorf(QC_ERR_IO, "validation file %s: %s", paths[i], strerror(errno));
        d->nval = i + 1;
    }
    d->val_recorded = true;
    d->eval_every = eval_every;
    d->val_scenes = val_scenes;
    return QC_OK;
}

enum qc_status qc_run_val_check(const char *run_dir, const struct qc_run_data *rec,
                                int64_t eval_every, int64_t val_scenes, const char *const *paths,
                                int n, bool change_data)
{
    if (!rec->val_recorded || change_data)
        return QC_OK;
    static const char hint[] = "\nhint: leave it out to validate as the run did, or add "
                               "--change-data to change the run's validation";
    if (eval_every >= 0 && eval_every != rec->eval_every)
        return qc_errorf(QC_ERR_INVALID,
                         "run %s was trained with --eval-every %" PRId64
                         ", this run has --eval-every %" PRId64 "%s",
                         run_dir, rec->eval_every, eval_every, hint);
    if (val_scenes >= 0 && val_scenes != rec->val_scenes)
        return qc_errorf(QC_ERR_INVALID,
                         "run %s was trained with --val-scenes %" PRId64
                         ", this run has --val-scenes %" PRId64 "%s",
                         run_dir, rec->val_scenes, val_scenes, hint);
    if (n <= 0)
        return QC_OK;
    char now[4096];
    bool same = n == rec->nval;
    for (int i = 0; same && i < n; i++)
        same = realpath(paths[i], now) && strcmp(now, rec->val[i]) == 0;
    if (same)
        return QC_OK;
    char a[1024] = "", b[1024] = "";
    size_t la = 0, lb = 0;
    for (int i = 0; i < rec->nval && la < sizeof a; i++)
        la += (size_t)snprintf(a + la, sizeof a - la, "%s%s", i ? " " : "", rec->val[i]);
    for (int i = 0; i < n && lb < sizeof b; i++)
        lb += (size_t)snprintf(b + lb, sizeof b - lb, "%s%s", i ? " " : "",
                               realpath(paths[i], now) ? now : paths[i]);
    return qc_errorf(QC_ERR_INVALID,
                     "run %s was trained with --val-data %s, this run has --val-data %s%s", run_dir,
                     rec->nval ? a : "(none: generated scenes)", b, hint);
}

static enum qc_status run_data_alloc(struct qc_run_data *d, int n)
{
    d->n = n;
    d->f = calloc((size_t)(n > 0 ? n : 1), sizeof(*d->f));
    return d->f ? QC_OK : qc_errorf(QC_ERR_NOMEM, "run data: out of memory");
}

/* Size and XXH3-64 of the file's content, read in 4 MiB pieces. */
static enum qc_status hash_file(const char *path, uint64_t *bytes, uint64_t *hash)
{
    struct stat sb; /* never open() a FIFO: it would block */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return qc_errorf(QC_ERR_INVALID, "data file %s: is %s, not a qcshard file", path,
                         qc_file_kind(sb.st_mode));
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO, "data file %s: cannot open: %s", path, strerror(errno));
    XXH3_state_t *xs = XXH3_createState();
    const size_t cap = (size_t)4 << 20;
    char *buf = malloc(cap);
    enum qc_status st =
        !xs || !buf ? qc_errorf(QC_ERR_NOMEM, "data file %s: out of memory", path) : QC_OK;
    uint64_t total = 0;
    if (st == QC_OK)
        XXH3_64bits_reset(xs);
    while (st == QC_OK) {
        const ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            st = qc_errorf(QC_ERR_IO, "data file %s: read failed: %s", path, strerror(errno));
        if (r <= 0)
            break;
        XXH3_64bits_update(xs, buf, (size_t)r);
        total += (uint64_t)r;
    }
    if (st == QC_OK) {
        *bytes = total;
        *hash = XXH3_64bits_digest(xs);
    }
    free(buf);
    if (xs)
        XXH3_freeState(xs);
    close(fd);
    return st;
}

enum qc_status qc_run_data_describe(const char *const *paths, int n, struct qc_run_data *out)
{
    memset(out, 0, sizeof *out);
    QC_TRY(run_data_alloc(out, n));
    out->recorded = true;
    enum qc_status st = QC_OK;
    for (int i = 0; i < n && st == QC_OK; i++) {
        struct qc_run_data_file *f = &out->f[i];
        st = qc_check_utf8("data file path", paths[i]);
        if (st == QC_OK && !realpath(paths[i], f->path))
            st = qc_errorf(QC_ERR_IO, "data file %s: %s", paths[i], strerror(errno));
        if (st == QC_OK)
            st = hash_file(f->path, &f->bytes, &f->xxh3);
    }
    if (st != QC_OK)
        qc_run_data_free(out);
    return st;
}

/* Reads the open file fp (closed here) as JSON into *out; path names it in errors. */
static enum qc_status read_json(FILE *fp, const char *path, cJSON **out)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    char buf[65536];
    size_t r;
    while (mem && (r = fread(buf, 1, sizeof buf, fp)) > 0)
        fwrite(buf, 1, r, mem);
    fclose(fp);
    if (!mem)
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory", path);
    fclose(mem);
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j)
        return qc_errorf(QC_ERR_INVALID, "%s: not valid JSON", path);
    *out = j;
    return QC_OK;
}

enum qc_status qc_run_data_read(const char *run_dir, struct qc_run_data *out)
{
    memset(out, 0, sizeof *out);
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", run_dir);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return errno == ENOENT ? QC_OK /* a run of before run.json: nothing recorded */
                               : qc_errorf(QC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    cJSON *j = NULL;
    QC_TRY(read_json(fp, path, &j));
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(data, "files");
    enum qc_status st = QC_OK;
    if (data && !cJSON_IsArray(files))
        st = qc_errorf(QC_ERR_INVALID, "%s: \"data\" has no \"files\" list", path);
    else if (data) {
        st = run_data_alloc(out, cJSON_GetArraySize(files));
        out->recorded = st == QC_OK;
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, files)
        {
            if (st != QC_OK)
                break;
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "path");
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bytes");
            const cJSON *h = cJSON_GetObjectItemCaseSensitive(e, "xxh3_64");
            char *end = NULL;
            struct qc_run_data_file *f = &out->f[i++];
            if (!cJSON_IsString(p) || !cJSON_IsNumber(b) || !cJSON_IsString(h) ||
                strlen(p->valuestring) >= sizeof f->path || strlen(h->valuestring) != 16)
                st = qc_errorf(QC_ERR_INVALID, "%s: data file %d: expected path, bytes, xxh3_64",
                               path, i);
            if (st == QC_OK) {
                snprintf(f->path, sizeof f->path, "%s", p->valuestring);
                f->bytes = (uint64_t)b->valuedouble;
                f->xxh3 = strtoull(h->valuestring, &end, 16);
                if (!end || *end)
                    st = qc_errorf(QC_ERR_INVALID, "%s: data file %s: xxh3_64 \"%s\" is not hex",
                                   path, f->path, h->valuestring);
            }
        }
    }
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(j, "validation");
    if (st == QC_OK && val) {
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(val, "eval_every");
        const cJSON *vs = cJSON_GetObjectItemCaseSensitive(val, "val_scenes");
        const cJSON *vf = cJSON_GetObjectItemCaseSensitive(val, "files");
        if (!cJSON_IsNumber(ev) || !cJSON_IsNumber(vs) || !cJSON_IsArray(vf) ||
            ev->valuedouble < 0 || vs->valuedouble < 1)
            st = qc_errorf(QC_ERR_INVALID,
                           "%s: \"validation\": expected eval_every >= 0, val_scenes >= 1 and "
                           "a files list",
                           path);
        const int nv = st == QC_OK ? cJSON_GetArraySize(vf) : 0;
        if (st == QC_OK && !(out->val = calloc((size_t)(nv > 0 ? nv : 1), sizeof *out->val)))
            st = qc_errorf(QC_ERR_NOMEM, "run data: out of memory");
        const cJSON *e;
        cJSON_ArrayForEach(e, vf)
        {
            if (st != QC_OK)
                break;
            if (!cJSON_IsString(e) || strlen(e->valuestring) >= sizeof out->val[0])
                st = qc_errorf(QC_ERR_INVALID, "%s: validation file %d: expected a path", path,
                               out->nval + 1);
            else
                snprintf(out->val[out->nval++], sizeof out->val[0], "%s", e->valuestring);
        }
        if (st == QC_OK) {
            out->val_recorded = true;
            out->eval_every = (int64_t)ev->valuedouble;
            out->val_scenes = (int64_t)vs->valuedouble;
        }
    }
    cJSON_Delete(j);
    if (st != QC_OK)
        qc_run_data_free(out);
    return st;
}

enum qc_status qc_run_data_record(const char *run_dir, const struct qc_run_data *d)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", run_dir);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return qc_errorf(QC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    cJSON *j = NULL;
    QC_TRY(read_json(fp, path, &j));
    cJSON_DeleteItemFromObjectCaseSensitive(j, "data");
    cJSON *data = cJSON_AddObjectToObject(j, "data");
    cJSON *files = data ? cJSON_AddArrayToObject(data, "files") : NULL;
    bool ok = files && cJSON_AddBoolToObject(data, "synthetic", d->n == 0);
    for (int i = 0; ok && i < d->n; i++) {
        cJSON *e = cJSON_CreateObject();
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, d->f[i].xxh3);
        ok = e && cJSON_AddItemToArray(files, e) &&
             cJSON_AddStringToObject(e, "path", d->f[i].path) &&
             cJSON_AddNumberToObject(e, "bytes", (double)d->f[i].bytes) &&
             cJSON_AddStringToObject(e, "xxh3_64", hex);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(j, "validation");
    if (ok && d->val_recorded) {
        cJSON *val = cJSON_AddObjectToObject(j, "validation");
        cJSON *vf = NULL;
        ok = val && cJSON_AddNumberToObject(val, "eval_every", (double)d->eval_every) &&
             cJSON_AddNumberToObject(val, "val_scenes", (double)d->val_scenes) &&
             (vf = cJSON_AddArrayToObject(val, "files"));
        for (int i = 0; ok && i < d->nval; i++) {
            cJSON *e = cJSON_CreateString(d->val[i]);
            ok = e && cJSON_AddItemToArray(vf, e);
        }
    }
    char *out = ok ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!out)
        return qc_errorf(QC_ERR_NOMEM, "%s: out of memory", path);
    const size_t n = strlen(out);
    out[n] = '\0';
    const struct qc_file_part parts[2] = {{out, n}, {"\n", 1}};
    const enum qc_status st = qc_file_write_atomic(path, parts, 2, "run description");
    free(out);
    return st;
}

enum qc_status qc_run_data_check(const char *run_dir, const struct qc_run_data *rec,
                                 const struct qc_run_data *now, bool change_data)
{
    if (!rec->recorded || change_data)
        return QC_OK;
    bool same = rec->n == now->n;
    for (int i = 0; same && i < rec->n; i++)
        same = strcmp(rec->f[i].path, now->f[i].path) == 0;
    if (!same) {
        char a[1024] = "", b[1024] = "";
        size_t la = 0, lb = 0;
        for (int i = 0; i < rec->n && la < sizeof a; i++)
            la += (size_t)snprintf(a + la, sizeof a - la, "%s%s", i ? " " : "", rec->f[i].path);
        for (int i = 0; i < now->n && lb < sizeof b; i++)
            lb += (size_t)snprintf(b + lb, sizeof b - lb, "%s%s", i ? " " : "", now->f[i].path);
        return qc_errorf(QC_ERR_INVALID,
                         "run %s was trained on data %s, this run has data %s\nhint: leave out "
                         "--data to train on the run's own data, or add --change-data to "
                         "continue on other data",
                         run_dir, rec->n ? a : "(generated scenes)",
                         now->n ? b : "(generated scenes)");
    }
    for (int i = 0; i < rec->n; i++)
        if (rec->f[i].bytes != now->f[i].bytes || rec->f[i].xxh3 != now->f[i].xxh3)
            return qc_errorf(QC_ERR_INVALID,
                             "data file %s changed since run %s started: xxh3_64 %016" PRIx64
                             " (%" PRIu64 " bytes) then, %016" PRIx64 " (%" PRIu64
                             " bytes) now\nhint: restore the file, or add --change-data to "
                             "continue on the file as it is",
                             rec->f[i].path, run_dir, rec->f[i].xxh3, rec->f[i].bytes,
                             now->f[i].xxh3, now->f[i].bytes);
    return QC_OK;
}
