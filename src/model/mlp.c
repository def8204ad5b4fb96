/*
 * mlp.c — MLPLayer MLP(o): forward, backward and stash plan (qc_mlp.h).
 */
#include "qc_mlp.h"

#include <string.h>

#include "blocks_internal.h"
#include "qc_exec.h" /* every op on the block's backend (m->mem.ex) */
#include "qc_kernels.h"

enum { MLP_LN_IN = 0, MLP_LN_MEAN, MLP_LN_RSTD, MLP_RELU, MLP_NSTASH };
enum { MS_BWD_SCRATCH = 0 }; /* memory spec ids */

void qc_mlp_init(struct qc_mlp *m, int64_t D, int64_t O)
{
    QC_ASSERT(D > 0 && O > 0, "MLP: D %lld, O %lld", (long long)D, (long long)O);
    memset(m, 0, sizeof *m);
    m->D = D;
    m->O = O;
    struct qc_param_table *t = &m->params;
    qc_param_table_init(t);
    m->o_w1 = qc_param_table_add(t, "mlp.0.weight", 2, D, D, QC_INIT_LINEAR_W);
    m->o_b1 = qc_param_table_add(t, "mlp.0.bias", 1, D, 0, QC_INIT_ZERO);
    m->o_lnw = qc_param_table_add(t, "mlp.1.weight", 1, D, 0, QC_INIT_ONE);
    m->o_lnb = qc_param_table_add(t, "mlp.1.bias", 1, D, 0, QC_INIT_ZERO);
    m->o_w2 = qc_param_table_add(t, "mlp.3.weight", 2, O, D, QC_INIT_LINEAR_W);
    m->o_b2 = qc_param_table_add(t, "mlp.3.bias", 1, O, 0, QC_INIT_ZERO);
}

void qc_mlp_bind(struct qc_mlp *m, const float *w, float *dw)
{
    m->w = w;
    m->dw = dw;
}

void qc_mlp_stash_plan(const struct qc_mlp *m, int64_t N, struct qc_stash *st)
{
    QC_ASSERT(st->n == 0, "MLP stash plan into a non-empty table %s", st->block);
    qc_stash_add(st, "ln_in", QC_STASH_F32, 2, N, m->D, 1, 1);
    qc_stash_add(st, "ln_mean", QC_STASH_F32, 1, N, 1, 1, 1);
    qc_stash_add(st, "ln_rstd", QC_STASH_F32, 1, N, 1, 1, 1);
    qc_stash_add(st, "relu", QC_STASH_F32, 2, N, m->D, 1, 1);
}

void qc_mlp_memspec(const struct qc_mlp *m, int64_t N, bool backward, struct qc_memspec *s)
{
    qc_memspec_init(s);
    if (backward && N > 0) {
        qc_memspec_alloc(s, MS_BWD_SCRATCH, &m->mem, "mlp_backward.scratch",
                         qc_memspec_floats(2 * N * m->D), 0, QC_MEMSPEC_LOCAL);
        qc_memspec_free(s, MS_BWD_SCRATCH);
    }
}

static void mlp_check_stash(const struct qc_mlp *m, const struct qc_stash *st, int64_t N)
{
    QC_ASSERT(st->n == MLP_NSTASH && st->e[MLP_RELU].ne[0] == N && st->e[MLP_RELU].ne[1] == m->D,
              "MLP: stash %s not planned for %lld rows", st->block, (long long)N);
}

static enum qc_status mlp_forward(const struct qc_mlp *m, float *out, struct qc_stash *st,
                                  const float *x, int64_t N)
{
    const int64_t D = m->D, O = m->O;
    const float *w = m->w;
    const struct qc_exec *ex = qc_block_exec(&m->mem);
    QC_ASSERT(w, "MLP: parameters not bound");
    mlp_check_stash(m, st, N);
    if (N == 0)
        return QC_OK;
    float *z = qc_stash_f32(st, MLP_LN_IN), *a = qc_stash_f32(st, MLP_RELU);
    qc_op_linear_forward(ex, z, x, D, w + m->o_w1, w + m->o_b1, N, D, D, false);
    qc_op_layernorm_forward(ex, a, qc_stash_f32(st, MLP_LN_MEAN), qc_stash_f32(st, MLP_LN_RSTD), z,
                            w + m->o_lnw, w + m->o_lnb, N, D);
    qc_op_relu_forward(ex, a, a, N * D);
    qc_op_linear_forward(ex, out, a, D, w + m->o_w2, w + m->o_b2, N, D, O, false);
    return QC_OK;
}

static enum qc_status mlp_backward(const struct qc_mlp *m, float *dx, const float *dout,
                                   const struct qc_stash *st, const float *x, int64_t N)
{
    const int64_t D = m->D, O = m->O;
    const float *w = m->w;
    float *dw = m->dw;
    const struct qc_exec *ex = qc_block_exec(&m->mem);
    QC_ASSERT(w && dw, "MLP: parameters or gradients not bound");
    mlp_check_stash(m, st, N);
    if (N == 0)
        return QC_OK;
    struct qc_memspec ms;
    qc_mlp_memspec(m, N, true, &ms);
    float *t;
    QC_TRY(qc_memspec_take_f32(&ms, MS_BWD_SCRATCH, &t));
    float *da = t, *dz = t + N * D;
    const float *a = qc_stash_f32(st, MLP_RELU);
    qc_op_linear_backward(ex, da, D, dw + m->o_w2, dw + m->o_b2, dout, a, D, w + m->o_w2, N, D, O,
                          false);
    qc_op_relu_backward(ex, da, da, a, N * D);
    qc_op_layernorm_backward(ex, dz, dw + m->o_lnw, dw + m->o_lnb, da, qc_stash_f32(st, MLP_LN_IN),
                             qc_stash_f32(st, MLP_LN_MEAN), qc_stash_f32(st, MLP_LN_RSTD),
                             w + m->o_lnw, N, D, false);
    qc_op_linear_backward(ex, dx, D, dw + m->o_w1, dw + m->o_b1, dz, x, D, w + m->o_w1, N, D, D,
                          false);
    qc_memspec_give(&ms, MS_BWD_SCRATCH);
    return QC_OK;
}

enum qc_status qc_mlp_forward(const struct qc_mlp *m, float *out, struct qc_stash *st,
                              const float *x, int64_t N)
{
    if (!qc_prof_on())
        return mlp_forward(m, out, st, x, N);
    struct qc_prof_mark pm;
    blk_prof_begin(&pm, &m->mem, "", QC_PROF_PASS_FORWARD);
    const enum qc_status s = mlp_forward(m, out, st, x, N);
    blk_prof_end(&pm);
    return s;
}

enum qc_status qc_mlp_backward(const struct qc_mlp *m, float *dx, const float *dout,
                               const struct qc_stash *st, const float *x, int64_t N)
{
    if (!qc_prof_on())
        return mlp_backward(m, dx, dout, st, x, N);
    struct qc_prof_mark pm;
    blk_prof_begin(&pm, &m->mem, "", QC_PROF_PASS_BACKWARD);
    const enum qc_status s = mlp_backward(m, dx, dout, st, x, N);
    blk_prof_end(&pm);
    return s;
}
