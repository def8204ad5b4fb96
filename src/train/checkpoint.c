/*
 * checkpoint.c — training checkpoints: RUN/ckpt-<step>/{model,optim}.safetensors
 * (docs/CHECKPOINTS.md).
 *
 * model.safetensors holds exactly QCNet's state_dict keys (alias keys as copies), so PyTorch's
 * strict load_state_dict accepts it; optim.safetensors is the sidecar: the AdamW moments as
 * "exp_avg.<key>" / "exp_avg_sq.<key>" for every distinct parameter, and in its metadata the
 * loop position (step, epoch, batch within the epoch, samples), the seed and the effective
 * configuration. Both files are written by the atomic safetensors writer into
 * ckpt-<step>.tmp/, which is then renamed to ckpt-<step>/ and the run folder fsynced: a
 * checkpoint folder under its final name is always complete. A ckpt-<step>.tmp/ left by a
 * killed save is removed whole by the next save of that step and, under the run lock, when a
 * trainer opens the run folder (run_dir.c).
 *
 * Device independence: the files are the same bytes whatever device.kind ran the model. On a
 * device backend the parameters (inside the model) and the moments (here) travel through host
 * buffers: downloaded to save, read then uploaded to load. The saved configuration has
 * device.kind and device.ordinal at their defaults (cpu, 0): where a run executed is not part
 * of what it computed, and a checkpoint resumes on any device.
 */
#include "qc_train.h"
#include "train_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "qc_config.h"
#include "qc_exec.h"
#include "qc_file.h"
#include "qc_qcnet.h"
#include "qc_safetensors.h"

#define CKPT_FORMAT     "qctrain-optim v1"
#define CKPT_MODEL_FILE "model.safetensors"
#define CKPT_OPTIM_FILE "optim.safetensors"

// ---- paths -----------------------------------------------------------------------------------

#define CKPT_PATH_MAX 4096

/* out = dir + "/" + name; QC_ERR_INVALID when it does not fit in n bytes. */
static enum qc_status path_join(char *out, size_t n, const char *dir, const char *name)
{
    const int k = snprintf(out, n, "%s/%s", dir, name);
    if (k < 0 || (size_t)k >= n)
        return qc_errorf(QC_ERR_INVALID, "path too long: %s/%s", dir, name);
    return QC_OK;
}

enum qc_status qc_train_mkdir(const char *path)
{
    char buf[4096];
    const size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf))
        return qc_errorf(QC_ERR_INVALID, "folder path '%s' is empty or too long", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        const char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return qc_errorf(QC_ERR_IO,
                             "cannot create folder %s: %s\nhint: choose a writable --out folder",
                             buf, strerror(errno));
        buf[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return qc_errorf(QC_ERR_IO, "%s exists and is not a folder\nhint: choose another --out",
                         path);
    if (access(path, W_OK) != 0)
        return qc_errorf(QC_ERR_IO, "folder %s is not writable: %s\nhint: choose another --out",
                         path, strerror(errno));
    return QC_OK;
}

static enum qc_status fsync_dir(const char *path)
{
    const int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return qc_errorf(QC_ERR_IO, "cannot open folder %s: %s", path, strerror(errno));
    const int rc = fsync(fd);
    const int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL)
        return qc_errorf(QC_ERR_IO, "fsync of folder %s failed: %s", path, strerror(e));
    return QC_OK;
}

/* Removes a checkpoint folder of ours (.tmp or .old) whole: whatever an interrupted save left
 * in it too (a writer's temporary file). Best effort: a failure shows in the next step. */
static void remove_ckpt_dir(const char *dir)
{
    if (train_remove_tree(dir) != QC_OK)
        qc_error_clear();
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Step number of a folder name "ckpt-<digits>", or -1. */
static int64_t ckpt_name_step(const char *name)
{
    if (strncmp(name, "ckpt-", 5) != 0 || !name[5])
        return -1;
    int64_t s = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9' || s > INT64_MAX / 10 - 10)
            return -1;
        s = s * 10 + (*c - '0');
    }
    return s;
}

/* --resume, --weights, --init-from and eval --weights all resolve folders here: the hint names
 * no one option */
#define CKPT_FOLDER_HINT                                                                           \
    "give a checkpoint folder (RUN/ckpt-000100), a run folder that holds one, or (--weights, "     \
    "--init-from) a model.safetensors file"

enum qc_status qc_checkpoint_resolve(const char *dir, char *out, size_t n)
{
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) /* never opendir() a FIFO */
        return qc_errorf(QC_ERR_INVALID,
                         "checkpoint %s: is %s, not a folder\nhint: " CKPT_FOLDER_HINT, dir,
                         qc_file_kind(sb.st_mode));
    char p[CKPT_PATH_MAX];
    QC_TRY(path_join(p, sizeof(p), dir, CKPT_MODEL_FILE));
    if (file_exists(p)) {
        if ((size_t)snprintf(out, n, "%s", dir) >= n)
            return qc_errorf(QC_ERR_INVALID, "checkpoint path too long: %s", dir);
        return QC_OK;
    }
    DIR *d = opendir(dir);
    if (!d)
        return qc_errorf(QC_ERR_IO, "checkpoint %s: cannot open: %s\nhint: " CKPT_FOLDER_HINT, dir,
                         strerror(errno));
    int64_t best = -1;
    char best_name[256] = "";
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const int64_t s = ckpt_name_step(de->d_name);
        if (s < 0 || s <= best)
            continue;
        char sub[CKPT_PATH_MAX];
        if (path_join(sub, sizeof(sub), dir, de->d_name) != QC_OK ||
            path_join(p, sizeof(p), sub, CKPT_OPTIM_FILE) != QC_OK || !file_exists(p))
            continue;
        best = s;
        snprintf(best_name, sizeof(best_name), "%s", de->d_name);
    }
    closedir(d);
    if (best < 0)
        return qc_errorf(
            QC_ERR_INVALID,
            "checkpoint %s: the folder holds no checkpoint: looked for %s/%s and for "
            "%s/ckpt-<step>/ holding %s and %s, found neither\nhint: " CKPT_FOLDER_HINT,
            dir, dir, CKPT_MODEL_FILE, dir, CKPT_MODEL_FILE, CKPT_OPTIM_FILE);
    return path_join(out, n, dir, best_name);
}

enum qc_status qc_checkpoint_weights_path(const char *path, char *out, size_t n)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char ckpt[CKPT_PATH_MAX];
        QC_TRY(qc_checkpoint_resolve(path, ckpt, sizeof(ckpt)));
        return path_join(out, n, ckpt, CKPT_MODEL_FILE);
    }
    if ((size_t)snprintf(out, n, "%s", path) >= n)
        return qc_errorf(QC_ERR_INVALID, "path too long: %s", path);
    return QC_OK;
}

// ---- save ------------------------------------------------------------------------------------

static enum qc_status meta_i64(struct qc_st_writer *w, const char *key, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    return qc_st_writer_set_metadata(w, key, buf);
}

static enum qc_status write_model_file(const struct qc_qcnet *m, const struct qc_train_state *s,
                                       const struct qc_config *cfg, const char *path)
{
    struct qc_st_writer *w = NULL;
    QC_TRY(qc_st_writer_create(&w));
    char cfgjson[2048];
    struct qc_qcnet_official off;
    qc_train_official_args(cfg, &off);
    qc_qcnet_config_json_official(qc_qcnet_config(m), &off, cfgjson, sizeof(cfgjson));
    enum qc_status st = qc_qcnet_add_to_writer(m, w, NULL, true);
    if (st == QC_OK)
        st = qc_st_writer_set_metadata(w, "format", "pt");
    if (st == QC_OK)
        st = qc_st_writer_set_metadata(w, "qcnet_config", cfgjson);
    if (st == QC_OK)
        st = meta_i64(w, "step", s->step);
    if (st == QC_OK)
        st = qc_st_writer_write(w, path);
    qc_st_writer_destroy(w);
    return st;
}

/* Host buffers holding the moments: the optimizer's own on CPU, downloaded copies (*owned, to
 * free) on a device backend. */
static enum qc_status moments_host(struct qc_optim *o, const float **m, const float **v,
                                   float **owned)
{
    *owned = NULL;
    if (!qc_exec_is_device(qc_optim_exec(o))) {
        *m = qc_optim_exp_avg(o);
        *v = qc_optim_exp_avg_sq(o);
        return QC_OK;
    }
    const int64_t n = qc_optim_numel(o);
    float *buf = malloc((size_t)(2 * n > 0 ? 2 * n : 1) * sizeof(float));
    if (!buf)
        return qc_errorf(QC_ERR_NOMEM,
                         "checkpoint: out of host memory for the AdamW moments "
                         "(%lld floats)",
                         (long long)(2 * n));
    const enum qc_status st = qc_optim_moments_download(o, buf, buf + n);
    if (st != QC_OK) {
        free(buf);
        return st;
    }
    *m = buf;
    *v = buf + n;
    *owned = buf;
    return QC_OK;
}

static enum qc_status write_optim_file(struct qc_qcnet *m, struct qc_optim *o, const float *given_m,
                                       const float *given_v, const struct qc_train_state *s,
                                       const struct qc_config *cfg, const char *path)
{
    const float *hm = given_m, *hv = given_v;
    float *owned = NULL;
    if (!hm || !hv) {
        if (qc_optim_numel(o) != qc_qcnet_num_params(m))
            return qc_errorf(QC_ERR_INVALID, "checkpoint: a sharded optimizer's moments must be "
                                             "gathered first (qc_checkpoint_save_moments)");
        QC_TRY(moments_host(o, &hm, &hv, &owned));
    }
    struct qc_st_writer *w = NULL;
    enum qc_status st = qc_st_writer_create(&w);
    if (st != QC_OK) {
        free(owned);
        return st;
    }
    char *cfgjson = NULL;
    /* the writer references the buffers: they live until it has written */
    st = qc_qcnet_add_buffer_to_writer(m, w, "exp_avg.", hm);
    if (st == QC_OK)
        st = qc_qcnet_add_buffer_to_writer(m, w, "exp_avg_sq.", hv);
    if (st == QC_OK)
        st = qc_st_writer_set_metadata(w, "format", CKPT_FORMAT);
    if (st == QC_OK)
        st = meta_i64(w, "step", s->step);
    if (st == QC_OK)
        st = meta_i64(w, "adam_step", qc_optim_steps(o));
    if (st == QC_OK)
        st = meta_i64(w, "epoch", s->epoch);
    if (st == QC_OK) /* fp16 loss scaling: a power of 2, saved as its exponent */
        st = meta_i64(w, "loss_scale_log2", s->loss_scale > 0 ? ilogb(s->loss_scale) : 0);
    if (st == QC_OK)
        st = meta_i64(w, "loss_scale_good", s->loss_scale_good);
    if (st == QC_OK)
        st = meta_i64(w, "batch_in_epoch", s->batch_in_epoch);
    if (st == QC_OK)
        st = meta_i64(w, "samples", s->samples);
    if (st == QC_OK)
        st = meta_i64(w, "seed", (int64_t)s->seed);
    if (st == QC_OK && cfg) {
        /* the device section's "where" keys at their defaults (module comment) */
        struct qc_config saved = *cfg;
        saved.device_kind = QC_CONFIG_DEVICE_CPU;
        saved.device_ordinal = 0;
        st = qc_config_to_json(&saved, &cfgjson);
        if (st == QC_OK)
            st = qc_st_writer_set_metadata(w, "config", cfgjson);
    }
    if (st == QC_OK)
        st = qc_st_writer_write(w, path);
    free(cfgjson);
    qc_st_writer_destroy(w);
    free(owned);
    return st;
}

enum qc_status qc_checkpoint_save(const char *run_dir, struct qc_qcnet *m, struct qc_optim *o,
                                  const struct qc_train_state *s, const struct qc_config *cfg,
                                  char *path_out, size_t n)
{
    return qc_checkpoint_save_moments(run_dir, m, o, NULL, NULL, s, cfg, path_out, n);
}

enum qc_status qc_checkpoint_save_moments(const char *run_dir, struct qc_qcnet *m,
                                          struct qc_optim *o, const float *exp_avg,
                                          const float *exp_avg_sq, const struct qc_train_state *s,
                                          const struct qc_config *cfg, char *path_out, size_t n)
{
    char final[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX], old[CKPT_PATH_MAX], p[CKPT_PATH_MAX];
    char name[64];
    snprintf(name, sizeof(name), "ckpt-%06" PRId64, s->step);
    QC_TRY(path_join(final, sizeof(final), run_dir, name));
    snprintf(name, sizeof(name), "ckpt-%06" PRId64 ".tmp", s->step);
    QC_TRY(path_join(tmp, sizeof(tmp), run_dir, name));
    snprintf(name, sizeof(name), "ckpt-%06" PRId64 ".old", s->step);
    QC_TRY(path_join(old, sizeof(old), run_dir, name));
    remove_ckpt_dir(tmp); /* a leftover of an interrupted save, whatever it holds */
    if (mkdir(tmp, 0777) != 0) {
        const int e = errno;
        const bool fixable = e == ENOSPC || e == EACCES || e == EROFS || e == EDQUOT;
        return qc_errorf(QC_ERR_IO, "checkpoint %s: cannot create folder: %s%s%s%s", tmp,
                         strerror(e), fixable ? "\nhint: is " : "", fixable ? run_dir : "",
                         fixable ? " writable and not full?" : "");
    }
    train_fault_delay();
    enum qc_status st = path_join(p, sizeof(p), tmp, CKPT_MODEL_FILE);
    if (st == QC_OK)
        st = write_model_file(m, s, cfg, p);
    if (st == QC_OK)
        train_fault_delay();
    if (st == QC_OK)
        st = path_join(p, sizeof(p), tmp, CKPT_OPTIM_FILE);
    if (st == QC_OK)
        st = write_optim_file(m, o, exp_avg, exp_avg_sq, s, cfg, p);
    if (st == QC_OK)
        train_fault_delay();
    if (st != QC_OK) {
        remove_ckpt_dir(tmp);
        return qc_error_wrap(st, "checkpoint %s not written", final);
    }
    /* Replace an existing checkpoint of the same step (a rerun): move it aside first, since
     * rename() cannot replace a non-empty folder. */
    bool had_old = false;
    struct stat sb;
    if (stat(final, &sb) == 0) {
        remove_ckpt_dir(old);
        if (rename(final, old) != 0) {
            const int e = errno;
            remove_ckpt_dir(tmp);
            return qc_errorf(QC_ERR_IO, "checkpoint %s: cannot move the old one aside: %s", final,
                             strerror(e));
        }
        had_old = true;
    }
    if (rename(tmp, final) != 0) {
        const int e = errno;
        remove_ckpt_dir(tmp);
        if (had_old)
            (void)rename(old, final);
        return qc_errorf(QC_ERR_IO, "checkpoint %s: rename failed: %s", final, strerror(e));
    }
    if (had_old)
        remove_ckpt_dir(old);
    QC_TRY(fsync_dir(run_dir));
    if (path_out && n)
        snprintf(path_out, n, "%s", final);
    return QC_OK;
}

// ---- retention: train.keep_last, train.keep_best ---------------------------------------------

struct kept_ckpt {
    int64_t step;
    double metric; /* the keep_best metric of the validation at this step; NAN: none */
    bool keep;
};

static int cmp_step(const void *a, const void *b)
{
    const int64_t x = ((const struct kept_ckpt *)a)->step, y = ((const struct kept_ckpt *)b)->step;
    return x < y ? -1 : x > y;
}

/* Fills c[i].metric from the "eval" lines of RUN/metrics.jsonl (the last line of a step wins;
 * a missing file or a torn line gives no value). */
static void read_eval_metrics(const char *run_dir, const char *metric, struct kept_ckpt *c,
                              int64_t n)
{
    char p[CKPT_PATH_MAX];
    if (path_join(p, sizeof(p), run_dir, "metrics.jsonl") != QC_OK) {
        qc_error_clear();
        return;
    }
    FILE *f = fopen(p, "r");
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        if (!strstr(line, "\"eval\""))
            continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "eval");
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(ev, metric);
        if (cJSON_IsNumber(st) && cJSON_IsNumber(v))
            for (int64_t i = 0; i < n; i++)
                if (c[i].step == (int64_t)st->valuedouble)
                    c[i].metric = v->valuedouble;
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
}

enum qc_status qc_checkpoint_retain(const char *run_dir, const struct qc_config *cfg,
                                    int64_t *removed)
{
    if (removed)
        *removed = 0;
    if (cfg->keep_last <= 0 && cfg->keep_best <= 0)
        return QC_OK;
    DIR *d = opendir(run_dir);
    if (!d)
        return qc_errorf(QC_ERR_IO, "run folder %s: cannot open: %s", run_dir, strerror(errno));
    struct kept_ckpt *c = NULL;
    int64_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const int64_t s = ckpt_name_step(de->d_name);
        if (s < 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            struct kept_ckpt *g = realloc(c, (size_t)cap * sizeof(*c));
            if (!g) {
                free(c);
                closedir(d);
                return qc_errorf(QC_ERR_NOMEM, "checkpoint retention: out of memory");
            }
            c = g;
        }
        c[n++] = (struct kept_ckpt){.step = s, .metric = (double)NAN, .keep = false};
    }
    closedir(d);
    if (n == 0) {
        free(c);
        return QC_OK;
    }
    qsort(c, (size_t)n, sizeof(*c), cmp_step);
    /* the newest always (resume takes it), then the keep_last newest */
    for (int64_t i = n - 1, k = 0; i >= 0; i--, k++)
        if (k == 0 || k < cfg->keep_last)
            c[i].keep = true;
    if (cfg->keep_best > 0) {
        const struct qc_config_option *opt = qc_config_option_find("train.keep_best_metric");
        char metric[64] = "minFDE";
        if (opt)
            qc_config_format_value(cfg, opt, metric, sizeof(metric));
        read_eval_metrics(run_dir, metric, c, n);
        /* keep_best times the lowest value not yet taken (ties: the newer step) */
        for (int64_t b = 0; b < cfg->keep_best; b++) {
            int64_t best = -1;
            for (int64_t i = 0; i < n; i++) {
                if (isnan(c[i].metric) || c[i].metric == (double)INFINITY)
                    continue;
                if (best < 0 || c[i].metric <= c[best].metric)
                    best = i;
            }
            if (best < 0)
                break;
            c[best].keep = true;
            c[best].metric = (double)INFINITY; /* taken */
        }
    }
    enum qc_status st = QC_OK;
    int64_t count = 0;
    for (int64_t i = 0; i < n && st == QC_OK; i++) {
        if (c[i].keep)
            continue;
        /* atomically out of sight (a resume never finds a half-removed checkpoint), then
         * removed; a crash in between leaves ckpt-<step>.del/, which run_dir.c removes */
        char name[64], from[CKPT_PATH_MAX], to[CKPT_PATH_MAX];
        snprintf(name, sizeof(name), "ckpt-%06" PRId64, c[i].step);
        st = path_join(from, sizeof(from), run_dir, name);
        snprintf(name, sizeof(name), "ckpt-%06" PRId64 ".del", c[i].step);
        if (st == QC_OK)
            st = path_join(to, sizeof(to), run_dir, name);
        if (st == QC_OK && rename(from, to) != 0)
            st = qc_errorf(QC_ERR_IO, "checkpoint retention: cannot move %s aside: %s", from,
                           strerror(errno));
        if (st == QC_OK)
            st = train_remove_tree(to);
        if (st == QC_OK)
            count++;
    }
    free(c);
    if (st == QC_OK && count > 0)
        st = fsync_dir(run_dir);
    if (removed)
        *removed = count;
    return st;
}

// ---- load ------------------------------------------------------------------------------------

static enum qc_status meta_get_i64(const struct qc_safetensors *st, const char *key, int64_t *out)
{
    const char *v = qc_safetensors_metadata(st, key);
    if (!v)
        return qc_errorf(QC_ERR_INVALID, "checkpoint %s: metadata '%s' missing",
                         qc_safetensors_path(st), key);
    char *end = NULL;
    errno = 0;
    const long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 0)
        return qc_errorf(QC_ERR_INVALID, "checkpoint %s: metadata '%s' = \"%s\" is not a count",
                         qc_safetensors_path(st), key, v);
    *out = (int64_t)x;
    return QC_OK;
}

enum qc_status qc_checkpoint_read_state(const char *ckpt_dir, struct qc_train_state *s,
                                        struct qc_config *saved_cfg)
{
    char p[CKPT_PATH_MAX];
    QC_TRY(path_join(p, sizeof(p), ckpt_dir, CKPT_OPTIM_FILE));
    struct qc_safetensors *st = NULL;
    QC_TRY(qc_safetensors_open(p, &st));
    enum qc_status rc = QC_OK;
    const char *fmt = qc_safetensors_metadata(st, "format");
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0)
        rc = qc_errorf(QC_ERR_INVALID, "checkpoint %s: metadata format is \"%s\", expected \"%s\"",
                       p, fmt ? fmt : "(none)", CKPT_FORMAT);
    struct qc_train_state t = {0};
    int64_t seed = 0;
    if (rc == QC_OK)
        rc = meta_get_i64(st, "step", &t.step);
    if (rc == QC_OK)
        rc = meta_get_i64(st, "adam_step", &t.adam_step);
    if (rc == QC_OK)
        rc = meta_get_i64(st, "epoch", &t.epoch);
    int64_t scale_log2 = 0; /* absent in checkpoints older than train.precision: scale 1 */
    if (rc == QC_OK && qc_safetensors_metadata(st, "loss_scale_log2"))
        rc = meta_get_i64(st, "loss_scale_log2", &scale_log2);
    if (rc == QC_OK && qc_safetensors_metadata(st, "loss_scale_good"))
        rc = meta_get_i64(st, "loss_scale_good", &t.loss_scale_good);
    if (rc == QC_OK && scale_log2 > 126)
        rc = qc_errorf(QC_ERR_INVALID, "checkpoint %s: loss_scale_log2 %lld out of range [0, 126]",
                       ckpt_dir, (long long)scale_log2);
    t.loss_scale = ldexp(1.0, (int)scale_log2);
    if (rc == QC_OK)
        rc = meta_get_i64(st, "batch_in_epoch", &t.batch_in_epoch);
    if (rc == QC_OK)
        rc = meta_get_i64(st, "samples", &t.samples);
    if (rc == QC_OK)
        rc = meta_get_i64(st, "seed", &seed);
    t.seed = (uint64_t)seed;
    if (rc == QC_OK && saved_cfg) {
        const char *cj = qc_safetensors_metadata(st, "config");
        if (!cj)
            rc = qc_errorf(QC_ERR_INVALID, "checkpoint %s: metadata 'config' missing", p);
        else {
            qc_config_defaults(saved_cfg);
            rc = qc_config_apply_preset_json(saved_cfg, cj, strlen(cj), p);
        }
    }
    qc_safetensors_close(st);
    if (rc == QC_OK)
        *s = t;
    return rc;
}

enum qc_status qc_checkpoint_load(const char *ckpt_dir, struct qc_qcnet *m, struct qc_optim *o,
                                  struct qc_train_state *s)
{
    struct qc_train_state t;
    QC_TRY(qc_checkpoint_read_state(ckpt_dir, &t, NULL));
    char p[CKPT_PATH_MAX];
    QC_TRY(path_join(p, sizeof(p), ckpt_dir, CKPT_MODEL_FILE));
    struct qc_safetensors *st = NULL;
    QC_TRY(qc_safetensors_open(p, &st));
    enum qc_status rc = qc_qcnet_load_st(m, st, "");
    qc_safetensors_close(st);
    if (rc != QC_OK)
        return rc;
    if (o) {
        /* into host buffers: the optimizer's own on CPU, else temporaries of the whole buffer
         * whose owned range (all of it unless sharded) is uploaded */
        const int64_t n = qc_qcnet_num_params(m);
        int64_t lo = 0, hi = 0;
        qc_optim_range(o, &lo, &hi);
        const bool direct = !qc_exec_is_device(qc_optim_exec(o)) && lo == 0 && hi == n;
        float *buf = NULL;
        if (!direct) {
            buf = malloc((size_t)(2 * n > 0 ? 2 * n : 1) * sizeof(float));
            if (!buf)
                return qc_errorf(QC_ERR_NOMEM,
                                 "checkpoint: out of host memory for the AdamW moments "
                                 "(%lld floats)",
                                 (long long)(2 * n));
        }
        float *hm = direct ? qc_optim_exp_avg(o) : buf;
        float *hv = direct ? qc_optim_exp_avg_sq(o) : buf + n;
        rc = path_join(p, sizeof(p), ckpt_dir, CKPT_OPTIM_FILE);
        if (rc == QC_OK)
            rc = qc_safetensors_open(p, &st);
        if (rc == QC_OK) {
            rc = qc_qcnet_read_buffer(m, st, "exp_avg.", hm);
            if (rc == QC_OK)
                rc = qc_qcnet_read_buffer(m, st, "exp_avg_sq.", hv);
            qc_safetensors_close(st);
        }
        if (rc == QC_OK && !direct)
            rc = qc_optim_moments_upload(o, hm + lo, hv + lo);
        free(buf);
        if (rc != QC_OK)
            return rc;
        qc_optim_set_steps(o, t.adam_step);
    }
    *s = t;
    return QC_OK;
}

// ---- configuration compatibility ---------------------------------------------------------------

/* Options that decide what a resumed run computes: the model, the optimizer, the schedule, the
 * batches and the seed. Others (steps, epochs, save_every, out_dir, threads, logging) may
 * change between the saved and the resumed run. */
static const char *const resume_keys[] = {
    "model.hidden_dim",
    "model.num_heads",
    "model.head_dim",
    "model.num_freq_bands",
    "model.num_historical_steps",
    "model.num_future_steps",
    "model.num_modes",
    "model.num_recurrent_steps",
    "model.num_map_layers",
    "model.num_agent_layers",
    "model.num_dec_layers",
    "model.time_span",
    "model.num_t2m_steps",
    "model.max_num_neighbors",
    "model.dropout",
    "model.pl2pl_radius",
    "model.pl2a_radius",
    "model.a2a_radius",
    "model.pl2m_radius",
    "model.a2m_radius",
    "train.lr",
    "train.weight_decay",
    "train.t_max",
    "train.batch_size",
    "train.seed",
    "data.synthetic_profile",
    "data.synthetic_scenes",
    "data.shuffle",
};

/* The resume_keys that start with prefix must be equal in both configurations. */
static enum qc_status check_keys(const struct qc_config *saved, const struct qc_config *now,
                                 const char *ckpt_dir, const char *prefix)
{
    for (size_t i = 0; i < sizeof(resume_keys) / sizeof(resume_keys[0]); i++) {
        if (strncmp(resume_keys[i], prefix, strlen(prefix)) != 0)
            continue;
        const struct qc_config_option *opt = qc_config_option_find(resume_keys[i]);
        if (!opt)
            continue; /* the option table does not have it (renamed): nothing to compare */
        char a[256], b[256];
        qc_config_format_value(saved, opt, a, sizeof(a));
        qc_config_format_value(now, opt, b, sizeof(b));
        if (strcmp(a, b) != 0)
            return qc_errorf(QC_ERR_INVALID,
                             "checkpoint %s was saved with %s = %s, this run has %s = %s\nhint: "
                             "the run's configuration comes from the checkpoint: leave out the "
                             "--preset/--set/option that changes %s (or set %s=%s), or use "
                             "--init-from %s/%s to start a new run from its weights",
                             ckpt_dir, opt->key, a, opt->key, b, opt->key, opt->key, a, ckpt_dir,
                             CKPT_MODEL_FILE);
    }
    return QC_OK;
}

/* Groups of batch_size scenes per optimizer step over all ranks (a checkpoint of before ranks
 * were recorded has dist.world_size 0 or its preset's: 1 unless it says more). */
static int64_t global_groups(const struct qc_config *c)
{
    return c->grad_accum * (c->world_size > 0 ? c->world_size : 1);
}

enum qc_status qc_checkpoint_check_config(const struct qc_config *saved,
                                          const struct qc_config *now, const char *ckpt_dir)
{
    /* the data plan: the same groups per step whatever the split between ranks and
     * accumulation (2 ranks x 1 group resumes as 1 rank x 2 groups), and the same sampler
     * (auto takes the saved run's) */
    if (global_groups(saved) != global_groups(now))
        return qc_errorf(QC_ERR_INVALID,
                         "checkpoint %s was saved with %lld groups per step (train.grad_accum "
                         "%lld x %lld ranks), this run has %lld (train.grad_accum %lld x %lld "
                         "ranks)\nhint: resume with ranks x train.grad_accum = %lld (e.g. "
                         "--grad-accum %lld on one rank)",
                         ckpt_dir, (long long)global_groups(saved), (long long)saved->grad_accum,
                         (long long)(saved->world_size > 0 ? saved->world_size : 1),
                         (long long)global_groups(now), (long long)now->grad_accum,
                         (long long)(now->world_size > 0 ? now->world_size : 1),
                         (long long)global_groups(saved), (long long)global_groups(saved));
    if (now->balance != QC_BALANCE_AUTO && saved->balance != QC_BALANCE_AUTO &&
        now->balance != saved->balance) {
        const struct qc_config_option *opt = qc_config_option_find("data.balance");
        char a[64], b[64];
        qc_config_format_value(saved, opt, a, sizeof(a));
        qc_config_format_value(now, opt, b, sizeof(b));
        return qc_errorf(QC_ERR_INVALID,
                         "checkpoint %s was saved with data.balance = %s, this run has "
                         "data.balance = %s\nhint: resume with --set data.balance=%s (or auto)",
                         ckpt_dir, a, b, a);
    }
    return check_keys(saved, now, ckpt_dir, "");
}

enum qc_status qc_checkpoint_check_model_config(const struct qc_config *saved,
                                                const struct qc_config *now, const char *ckpt_dir)
{
    return check_keys(saved, now, ckpt_dir, "model.");
}
