/*
 * fourier.c — FourierEmbedding FE(d): forward, backward, stash plan (qc_fourier.h), and the
 * scratch helpers shared by the block files (blocks_internal.h).
 */
#include "qc_fourier.h"

#include <stdio.h>
#include <string.h>

#include "blocks_internal.h"
#include "qc_exec.h"          /* every op and memory move on the block's backend (fe->mem.ex) */
#include "qc_fourier_embed.h" /* the op sequence (qc_op_fe_*) */
#include "qc_kernels.h"
#include "qc_oom.h"

// ---- scratch helpers (blocks_internal.h) ---------------------------------------------------

static size_t blk_bytes(int64_t n)
{
    return (size_t)(n > 0 ? n : 0) * sizeof(float);
}

float *blk_falloc(const struct qc_block_mem *bm, int64_t n, const char *tensor)
{
    return qc_block_alloc(bm, blk_bytes(n), tensor);
}

float *blk_fcalloc(const struct qc_block_mem *bm, int64_t n, const char *tensor)
{
    float *p = blk_falloc(bm, n, tensor);
    if (p)
        qc_op_zero(qc_block_exec(bm), p, blk_bytes(n)); /* hook memory: the block's backend */
    return p;
}

void blk_ffree(const struct qc_block_mem *bm, float *p, int64_t n)
{
    qc_block_free(bm, p, blk_bytes(n));
}

enum qc_status blk_nomem(const struct qc_block_mem *bm, const char *what, int64_t n)
{
    return qc_oom_errorf(QC_OOM_ATTENTION_UNKNOWN, "%s/%s: allocation of %lld floats failed",
                         bm && bm->name[0] ? bm->name : "block", what, (long long)n);
}

void blk_prof_begin(struct qc_prof_mark *m, const struct qc_block_mem *bm, const char *suffix,
                    enum qc_prof_pass pass)
{
    char name[QC_BLOCK_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s%s", bm && bm->name[0] ? bm->name : "block", suffix);
    qc_prof_span_begin(m, QC_PROF_CAT_BLOCK, name, pass);
}

// ---- parameters -------------------------------------------------------------------------

void qc_fourier_init(struct qc_fourier *fe, int64_t d, int64_t F, int64_t D)
{
    QC_ASSERT(d >= 0 && d <= QC_FOURIER_MAX_D, "FE(d): d = %lld", (long long)d);
    QC_ASSERT(F > 0 && D > 0, "FE: F %lld, D %lld", (long long)F, (long long)D);
    memset(fe, 0, sizeof *fe);
    fe->D = D;
    fe->F = F;
    fe->d = d;
    struct qc_param_table *t = &fe->params;
    qc_param_table_init(t);
    char name[QC_PARAM_NAME_MAX];
    fe->o_freqs = d > 0 ? qc_param_table_add(t, "freqs.weight", 2, d, F, QC_INIT_EMBEDDING) : -1;
    for (int64_t i = 0; i < d; i++) {
        snprintf(name, sizeof name, "mlps.%lld.0.weight", (long long)i);
        fe->o_w1[i] = qc_param_table_add(t, name, 2, D, 2 * F + 1, QC_INIT_LINEAR_W);
        snprintf(name, sizeof name, "mlps.%lld.0.bias", (long long)i);
        fe->o_b1[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ZERO);
        snprintf(name, sizeof name, "mlps.%lld.1.weight", (long long)i);
        fe->o_lnw[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ONE);
        snprintf(name, sizeof name, "mlps.%lld.1.bias", (long long)i);
        fe->o_lnb[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ZERO);
        snprintf(name, sizeof name, "mlps.%lld.3.weight", (long long)i);
        fe->o_w2[i] = qc_param_table_add(t, name, 2, D, D, QC_INIT_LINEAR_W);
        snprintf(name, sizeof name, "mlps.%lld.3.bias", (long long)i);
        fe->o_b2[i] = qc_param_table_add(t, name, 1, D, 0, QC_INIT_ZERO);
    }
    fe->o_out_lnw = qc_param_table_add(t, "to_out.0.weight", 1, D, 0, QC_INIT_ONE);
    fe->o_out_lnb = qc_param_table_add(t, "to_out.0.bias", 1, D, 0, QC_INIT_ZERO);
    fe->o_out_w = qc_param_table_add(t, "to_out.2.weight", 2, D, D, QC_INIT_LINEAR_W);
    fe->o_out_b = qc_param_table_add(t, "to_out.2.bias", 1, D, 0, QC_INIT_ZERO);
}

void qc_fourier_bind(struct qc_fourier *fe, const float *w, float *dw)
{
    fe->w = w;
    fe->dw = dw;
}

// ---- stash ------------------------------------------------------------------------------

/* Entry order (indices are positional): [phi], per dim i: z, mean, rstd, relu; then s, mean,
 * rstd, relu of the output part. */
struct fe_idx {
    int phi;
    int z[QC_FOURIER_MAX_D], mean[QC_FOURIER_MAX_D], rstd[QC_FOURIER_MAX_D], relu[QC_FOURIER_MAX_D];
    int s, s_mean, s_rstd, o;
};

static struct fe_idx fe_index(const struct qc_fourier *fe)
{
    struct fe_idx ix;
    int n = 0;
    ix.phi = fe->d > 0 ? n++ : -1;
    for (int64_t i = 0; i < fe->d; i++) {
        ix.z[i] = n++;
        ix.mean[i] = n++;
        ix.rstd[i] = n++;
        ix.relu[i] = n++;
    }
    ix.s = n++;
    ix.s_mean = n++;
    ix.s_rstd = n++;
    ix.o = n++;
    return ix;
}

void qc_fourier_stash_plan(const struct qc_fourier *fe, int64_t N, struct qc_stash *st)
{
    QC_ASSERT(st->n == 0, "FE stash plan into a non-empty table %s", st->block);
    char name[QC_STASH_NAME_MAX];
    if (fe->d > 0)
        qc_stash_add(st, "phi", QC_STASH_F32, 3, N, fe->d, 2 * fe->F + 1, 1);
    for (int64_t i = 0; i < fe->d; i++) {
        snprintf(name, sizeof name, "mlps.%lld.ln_in", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 2, N, fe->D, 1, 1);
        snprintf(name, sizeof name, "mlps.%lld.ln_mean", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 1, N, 1, 1, 1);
        snprintf(name, sizeof name, "mlps.%lld.ln_rstd", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 1, N, 1, 1, 1);
        snprintf(name, sizeof name, "mlps.%lld.relu", (long long)i);
        qc_stash_add(st, name, QC_STASH_F32, 2, N, fe->D, 1, 1);
    }
    qc_stash_add(st, "to_out.ln_in", QC_STASH_F32, 2, N, fe->D, 1, 1);
    qc_stash_add(st, "to_out.ln_mean", QC_STASH_F32, 1, N, 1, 1, 1);
    qc_stash_add(st, "to_out.ln_rstd", QC_STASH_F32, 1, N, 1, 1, 1);
    qc_stash_add(st, "to_out.relu", QC_STASH_F32, 2, N, fe->D, 1, 1);
}

// ---- forward / backward -------------------------------------------------------------------

void fourier_desc(const struct qc_fourier *fe, struct qc_fe *out)
{
    _Static_assert(QC_FOURIER_MAX_D == QC_FE_MAX_D, "FE input bound");
    *out = (struct qc_fe){.D = fe->D, .F = fe->F, .d = fe->d, .o_freqs = fe->o_freqs};
    for (int64_t i = 0; i < fe->d; i++) {
        out->o_w1[i] = fe->o_w1[i];
        out->o_b1[i] = fe->o_b1[i];
        out->o_lnw[i] = fe->o_lnw[i];
        out->o_lnb[i] = fe->o_lnb[i];
        out->o_w2[i] = fe->o_w2[i];
        out->o_b2[i] = fe->o_b2[i];
    }
    out->o_out_lnw = fe->o_out_lnw;
    out->o_out_lnb = fe->o_out_lnb;
    out->o_out_w = fe->o_out_w;
    out->o_out_b = fe->o_out_b;
    out->w = fe->w;
    out->dw = fe->dw;
}

/* The op's view of a stash table planned by qc_fourier_stash_plan for N rows. */
static struct qc_fe_saved fe_saved(const struct qc_fourier *fe, const struct qc_stash *st,
                                   int64_t N)
{
    struct fe_idx ix = fe_index(fe);
    QC_ASSERT(st->n == ix.o + 1 && st->e[ix.o].ne[0] == N, "FE: stash %s not planned for %lld rows",
              st->block, (long long)N);
    struct qc_fe_saved sv = {0};
    if (N == 0)
        return sv;
    sv.phi = fe->d > 0 ? qc_stash_f32(st, ix.phi) : NULL;
    for (int64_t i = 0; i < fe->d; i++) {
        sv.z[i] = qc_stash_f32(st, ix.z[i]);
        sv.mean[i] = qc_stash_f32(st, ix.mean[i]);
        sv.rstd[i] = qc_stash_f32(st, ix.rstd[i]);
        sv.relu[i] = qc_stash_f32(st, ix.relu[i]);
    }
    sv.s = qc_stash_f32(st, ix.s);
    sv.s_mean = qc_stash_f32(st, ix.s_mean);
    sv.s_rstd = qc_stash_f32(st, ix.s_rstd);
    sv.o = qc_stash_f32(st, ix.o);
    return sv;
}

int64_t fourier_scratch_floats(const struct qc_fourier *fe, int64_t N, bool backward)
{
    struct qc_fe desc;
    fourier_desc(fe, &desc);
    return N > 0 ? qc_fe_scratch_numel(&desc, N, backward) : 0;
}

enum { MS_SCRATCH = 0 }; /* memory spec ids */

void qc_fourier_memspec(const struct qc_fourier *fe, int64_t N, bool backward, struct qc_memspec *s)
{
    qc_memspec_init(s);
    const int64_t n = fourier_scratch_floats(fe, N, backward);
    if (n > 0) {
        qc_memspec_alloc(s, MS_SCRATCH, &fe->mem, backward ? "fe_backward.scratch" : "fe_forward.h",
                         qc_memspec_floats(n), 0, QC_MEMSPEC_LOCAL);
        qc_memspec_free(s, MS_SCRATCH);
    }
}

static enum qc_status fourier_forward(const struct qc_fourier *fe, float *out, struct qc_stash *st,
                                      const float *c, const float *cat, int64_t N)
{
    struct qc_fe desc;
    fourier_desc(fe, &desc);
    QC_ASSERT(fe->w, "FE: parameters not bound");
    const struct qc_fe_saved sv = fe_saved(fe, st, N);
    struct qc_memspec ms;
    qc_fourier_memspec(fe, N, false, &ms);
    float *ws;
    QC_TRY(qc_memspec_take_f32(&ms, MS_SCRATCH, &ws));
    qc_op_fe_forward(qc_block_exec(&fe->mem), &desc, out, &sv, c, cat, N, ws);
    qc_memspec_give(&ms, MS_SCRATCH);
    return QC_OK;
}

static enum qc_status fourier_backward(const struct qc_fourier *fe, float *dc, float *dcat,
                                       const float *dout, const struct qc_stash *st, const float *c,
                                       int64_t N)
{
    struct qc_fe desc;
    fourier_desc(fe, &desc);
    QC_ASSERT(fe->w && fe->dw, "FE: parameters or gradients not bound");
    const struct qc_fe_saved sv = fe_saved(fe, st, N);
    struct qc_memspec ms;
    qc_fourier_memspec(fe, N, true, &ms);
    float *ws;
    QC_TRY(qc_memspec_take_f32(&ms, MS_SCRATCH, &ws));
    qc_op_fe_backward(qc_block_exec(&fe->mem), &desc, dc, dcat, dout, &sv, c, N, ws);
    qc_memspec_give(&ms, MS_SCRATCH);
    return QC_OK;
}

enum qc_status qc_fourier_forward(const struct qc_fourier *fe, float *out, struct qc_stash *st,
                                  const float *c, const float *cat, int64_t N)
{
    if (!qc_prof_on())
        return fourier_forward(fe, out, st, c, cat, N);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &fe->mem, "", QC_PROF_PASS_FORWARD);
    const enum qc_status s = fourier_forward(fe, out, st, c, cat, N);
    blk_prof_end(&m);
    return s;
}

enum qc_status qc_fourier_backward(const struct qc_fourier *fe, float *dc, float *dcat,
                                   const float *dout, const struct qc_stash *st, const float *c,
                                   int64_t N)
{
    if (!qc_prof_on())
        return fourier_backward(fe, dc, dcat, dout, st, c, N);
    struct qc_prof_mark m;
    blk_prof_begin(&m, &fe->mem, "", QC_PROF_PASS_BACKWARD);
    const enum qc_status s = fourier_backward(fe, dc, dcat, dout, st, c, N);
    blk_prof_end(&m);
    return s;
}
