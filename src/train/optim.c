/*
 * optim.c — the cosine LR schedule (PyTorch's recursion) and AdamW over a flat parameter buffer
 * with QCNet's two parameter groups (QCNET.md §1, §2.5).
 *
 * The groups are segments of the flat buffer (one per distinct parameter tensor) flagged decay
 * or no_decay; the update itself is the kernels op qc_adamw_step_segments, dispatched on the
 * optimizer's backend (qc_exec.h: the CPU op, the CUDA launcher, or the CPU op on the emulated
 * device), which applies decoupled decay only to decay segments. On a device backend the
 * moments and the op's copies of the segment arrays are device memory; host code (checkpoints)
 * moves the moments through qc_optim_moments_download / _upload. PyTorch orders the groups by
 * sorted name, which affects only where each tensor's state lives, not the values: every element's
 * update is independent of every other.
 *
 * Sharding (ZeRO stages 1 and 2, qc_optim_create_shard): an optimizer may own only the element
 * range [lo, hi) of the flat buffer. Its segments are the model's cut at lo and hi (a tensor
 * straddling a boundary is split, both parts keeping its decay flag), its moments hold hi − lo
 * floats, and qc_optim_step updates param[lo, hi) from grad[lo, hi) only. Because every
 * element's update is independent, the shards of W optimizers together give exactly the bits of
 * one optimizer over the whole buffer.
 */
#include "qc_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qc_alloc.h"
#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_oom.h"
#include "qc_prof.h"
#include "qc_progress.h" /* qc_format_bytes */

// ---- schedule --------------------------------------------------------------------------------

double qc_lr_cosine(double base_lr, int64_t t_max, int64_t epoch)
{
    QC_ASSERT(t_max >= 1 && epoch >= 0, "lr_cosine: t_max %lld epoch %lld", (long long)t_max,
              (long long)epoch);
    const double pi = 3.141592653589793; /* math.pi */
    const double T = (double)t_max;
    double lr = base_lr; /* last_epoch == 0: the group's lr, i.e. the base */
    for (int64_t e = 1; e <= epoch; e++) {
        const int64_t r = ((e - 1 - t_max) % (2 * t_max) + 2 * t_max) % (2 * t_max);
        if (r == 0) {
            /* group['lr'] + (base_lr - eta_min) * (1 - cos(pi / T_max)) / 2 */
            lr = lr + (base_lr - 0.0) * (1.0 - cos(pi / T)) / 2.0;
        } else {
            /* (1 + cos(pi*e/T)) / (1 + cos(pi*(e-1)/T)) * (lr - eta_min) + eta_min */
            const double num = 1.0 + cos(pi * (double)e / T);
            const double den = 1.0 + cos(pi * (double)(e - 1) / T);
            lr = num / den * (lr - 0.0) + 0.0;
        }
    }
    return lr;
}

// ---- AdamW -----------------------------------------------------------------------------------

struct qc_optim {
    struct qc_alloc *alloc;   /* NULL: moments from malloc (CPU only) */
    const struct qc_exec *ex; /* backend of the step (NULL = CPU) */
    struct qc_optim_params hp;
    int64_t numel;      /* floats this optimizer owns (hi − lo) */
    int64_t lo;         /* first element of the flat buffer it owns (0 unless sharded) */
    int64_t numel_full; /* floats in the whole flat buffer */
    int64_t nseg;       /* tensors */
    int64_t *offsets;   /* (nseg+1) host */
    uint8_t *decay;     /* (nseg) host */
    int64_t *d_offsets; /* (nseg+1) device copy on a device backend, else NULL */
    uint8_t *d_decay;   /* (nseg) device copy on a device backend, else NULL */
    float *m;           /* (numel) exp_avg, backend memory */
    float *v;           /* (numel) exp_avg_sq, backend memory */
    int64_t steps;      /* state['step'] */
};

void qc_optim_params_default(struct qc_optim_params *p)
{
    p->lr = 5e-4;
    p->beta1 = 0.9;
    p->beta2 = 0.999;
    p->eps = 1e-8;
    p->weight_decay = 1e-4;
}

/* bytes of backend memory (tag) from the allocator, or malloc without one. */
static enum qc_status optim_alloc(struct qc_optim *o, size_t bytes, const char *tag, void **out)
{
    void *p = NULL;
    if (o->alloc) {
        const enum qc_status st = qc_alloc_malloc(o->alloc, bytes, NULL, tag, &p);
        if (st == QC_ERR_NOMEM) { /* fixed bytes: no batch size or plan can help (qc_oom.h) */
            char moments[32];
            qc_format_bytes(2 * (size_t)o->numel * sizeof(float), moments, sizeof moments);
            return qc_oom_fixed_errorf("optimizer: allocation of %zu bytes for %s failed: "
                                       "AdamW's two moments of %lld parameters need %s on the "
                                       "device through every step, beside the parameters and "
                                       "their gradients",
                                       bytes, tag, (long long)o->numel, moments);
        }
        QC_TRY(st);
    } else {
        p = malloc(bytes ? bytes : 1);
        if (!p)
            return qc_errorf(QC_ERR_NOMEM, "optimizer: out of memory for %s (%zu bytes)", tag,
                             bytes);
    }
    *out = p;
    return QC_OK;
}

static void optim_free(struct qc_optim *o, void *p)
{
    if (o->alloc)
        qc_alloc_free(o->alloc, p, NULL);
    else
        free(p);
}

/* A zeroed moment buffer. */
static enum qc_status optim_buffer(struct qc_optim *o, const char *tag, float **out)
{
    const size_t bytes = (size_t)o->numel * sizeof(float);
    void *p = NULL;
    QC_TRY(optim_alloc(o, bytes, tag, &p));
    qc_op_zero(o->ex, p, bytes);
    *out = p;
    return QC_OK;
}

/* A device copy of a host array (device backends). */
static enum qc_status optim_upload(struct qc_optim *o, const void *host, size_t bytes,
                                   const char *tag, void **out)
{
    void *p = NULL;
    QC_TRY(optim_alloc(o, bytes, tag, &p));
    const enum qc_status st = qc_op_upload(o->ex, p, host, bytes);
    if (st != QC_OK) {
        optim_free(o, p);
        return st;
    }
    *out = p;
    return QC_OK;
}

enum qc_status qc_optim_create(struct qc_alloc *alloc, int64_t numel, const int64_t *offsets,
                               const uint8_t *decay, int64_t nseg,
                               const struct qc_optim_params *params, struct qc_optim **out)
{
    return qc_optim_create_on(alloc, NULL, numel, offsets, decay, nseg, params, out);
}

enum qc_status qc_optim_create_on(struct qc_alloc *alloc, const struct qc_exec *ex, int64_t numel,
                                  const int64_t *offsets, const uint8_t *decay, int64_t nseg,
                                  const struct qc_optim_params *params, struct qc_optim **out)
{
    if (numel < 0 || nseg < 0 || !offsets || (nseg > 0 && !decay) || offsets[0] != 0 ||
        offsets[nseg] != numel)
        return qc_errorf(QC_ERR_INVALID,
                         "optimizer: segments do not cover the parameter buffer (numel %lld, "
                         "%lld segments)",
                         (long long)numel, (long long)nseg);
    for (int64_t s = 0; s < nseg; s++)
        if (offsets[s + 1] < offsets[s])
            return qc_errorf(QC_ERR_INVALID, "optimizer: segment %lld has negative size",
                             (long long)s);
    const bool device = qc_exec_is_device(ex);
    if (device && !alloc)
        return qc_errorf(QC_ERR_INVALID,
                         "optimizer: the %s backend needs an allocator of its memory",
                         qc_exec_backend_str(qc_exec_backend_of(ex)));
    struct qc_optim *o = calloc(1, sizeof(*o));
    if (!o)
        return qc_errorf(QC_ERR_NOMEM, "optimizer: out of memory");
    o->alloc = alloc;
    o->ex = device ? ex : NULL;
    if (params)
        o->hp = *params;
    else
        qc_optim_params_default(&o->hp);
    o->numel = numel;
    o->numel_full = numel;
    o->nseg = nseg;
    o->offsets = malloc((size_t)(nseg + 1) * sizeof(int64_t));
    o->decay = calloc((size_t)(nseg > 0 ? nseg : 1), 1);
    if (!o->offsets || !o->decay) {
        qc_optim_destroy(o);
        return qc_errorf(QC_ERR_NOMEM, "optimizer: out of memory");
    }
    memcpy(o->offsets, offsets, (size_t)(nseg + 1) * sizeof(int64_t));
    if (nseg > 0)
        memcpy(o->decay, decay, (size_t)nseg);
    enum qc_status st = optim_buffer(o, "optim/exp_avg", &o->m);
    if (st == QC_OK)
        st = optim_buffer(o, "optim/exp_avg_sq", &o->v);
    if (st == QC_OK && device) {
        void *p = NULL;
        st = optim_upload(o, o->offsets, (size_t)(nseg + 1) * sizeof(int64_t), "optim/offsets", &p);
        o->d_offsets = p;
        if (st == QC_OK) {
            p = NULL;
            st = optim_upload(o, o->decay, (size_t)(nseg > 0 ? nseg : 1), "optim/decay", &p);
            o->d_decay = p;
        }
    }
    if (st != QC_OK) {
        qc_optim_destroy(o);
        return st;
    }
    *out = o;
    return QC_OK;
}

void qc_optim_destroy(struct qc_optim *o)
{
    if (!o)
        return;
    if (o->m)
        optim_free(o, o->m);
    if (o->v)
        optim_free(o, o->v);
    if (o->d_offsets)
        optim_free(o, o->d_offsets);
    if (o->d_decay)
        optim_free(o, o->d_decay);
    free(o->offsets);
    free(o->decay);
    free(o);
}

void qc_optim_step(struct qc_optim *o, float *param, const float *grad, double lr)
{
    o->steps++;
    const struct qc_adamw_hparams hp = {
        .lr = lr,
        .beta1 = o->hp.beta1,
        .beta2 = o->hp.beta2,
        .eps = o->hp.eps,
        .weight_decay = o->hp.weight_decay,
        .step = o->steps,
    };
    /* the op reads the segment arrays as tensors: the device copies on a device backend */
    const int64_t *offsets = o->d_offsets ? o->d_offsets : o->offsets;
    const uint8_t *decay = o->d_decay ? o->d_decay : o->decay;
    struct qc_prof_mark pm;
    const bool prof = qc_prof_on();
    if (prof) /* the profiler's optimizer span: parameters, gradients and both moments */
        qc_prof_span_begin(&pm, QC_PROF_CAT_OPTIM, "optimizer", QC_PROF_PASS_NONE);
    qc_op_adamw_step_segments(o->ex, param + o->lo, o->m, o->v, grad + o->lo, offsets, decay,
                              o->nseg, &hp);
    if (prof)
        qc_prof_span_end(&pm, QC_PROF_CAT_OPTIM, "adamw", 28.0 * (double)o->numel);
}

enum qc_status qc_optim_create_shard(struct qc_alloc *alloc, const struct qc_exec *ex,
                                     int64_t numel, const int64_t *offsets, const uint8_t *decay,
                                     int64_t nseg, int64_t lo, int64_t hi,
                                     const struct qc_optim_params *params, struct qc_optim **out)
{
    if (lo < 0 || hi < lo || hi > numel || !offsets || offsets[nseg] != numel)
        return qc_errorf(QC_ERR_INVALID,
                         "optimizer: shard [%lld, %lld) is not inside the buffer of %lld",
                         (long long)lo, (long long)hi, (long long)numel);
    /* the segments intersecting [lo, hi), cut at its ends and rebased to lo */
    int64_t *so = malloc((size_t)(nseg + 1) * sizeof(int64_t));
    uint8_t *sd = malloc((size_t)(nseg > 0 ? nseg : 1));
    if (!so || !sd) {
        free(so);
        free(sd);
        return qc_errorf(QC_ERR_NOMEM, "optimizer: out of memory");
    }
    int64_t k = 0;
    so[0] = 0;
    for (int64_t s = 0; s < nseg; s++) {
        const int64_t a = offsets[s] > lo ? offsets[s] : lo;
        const int64_t b = offsets[s + 1] < hi ? offsets[s + 1] : hi;
        if (b <= a)
            continue;
        sd[k] = decay[s];
        so[++k] = b - lo;
    }
    enum qc_status st = qc_optim_create_on(alloc, ex, hi - lo, so, sd, k, params, out);
    free(so);
    free(sd);
    if (st == QC_OK) {
        (*out)->lo = lo;
        (*out)->numel_full = numel;
    }
    return st;
}

void qc_optim_range(const struct qc_optim *o, int64_t *lo, int64_t *hi)
{
    *lo = o->lo;
    *hi = o->lo + o->numel;
}

int64_t qc_optim_numel_full(const struct qc_optim *o)
{
    return o->numel_full;
}

int64_t qc_optim_steps(const struct qc_optim *o)
{
    return o->steps;
}

void qc_optim_set_steps(struct qc_optim *o, int64_t steps)
{
    QC_ASSERT(steps >= 0, "optimizer: negative step count %lld", (long long)steps);
    o->steps = steps;
}

float *qc_optim_exp_avg(struct qc_optim *o)
{
    return o->m;
}

float *qc_optim_exp_avg_sq(struct qc_optim *o)
{
    return o->v;
}

enum qc_status qc_optim_moments_download(const struct qc_optim *o, float *exp_avg,
                                         float *exp_avg_sq)
{
    const size_t bytes = (size_t)o->numel * sizeof(float);
    if (exp_avg)
        QC_TRY(qc_op_download(o->ex, exp_avg, o->m, bytes));
    if (exp_avg_sq)
        QC_TRY(qc_op_download(o->ex, exp_avg_sq, o->v, bytes));
    return QC_OK;
}

enum qc_status qc_optim_moments_upload(struct qc_optim *o, const float *exp_avg,
                                       const float *exp_avg_sq)
{
    const size_t bytes = (size_t)o->numel * sizeof(float);
    if (exp_avg)
        QC_TRY(qc_op_upload(o->ex, o->m, exp_avg, bytes));
    if (exp_avg_sq)
        QC_TRY(qc_op_upload(o->ex, o->v, exp_avg_sq, bytes));
    /* the sources may be pageable temporaries the caller frees next: let the copies land */
    return qc_op_sync(o->ex);
}

const struct qc_exec *qc_optim_exec(const struct qc_optim *o)
{
    return o->ex;
}

int64_t qc_optim_numel(const struct qc_optim *o)
{
    return o->numel;
}

int64_t qc_optim_decay_numel(const struct qc_optim *o, int64_t *nseg_decay)
{
    int64_t n = 0, k = 0;
    for (int64_t s = 0; s < o->nseg; s++)
        if (o->decay[s]) {
            n += o->offsets[s + 1] - o->offsets[s];
            k++;
        }
    if (nseg_decay)
        *nseg_decay = k;
    return n;
}
