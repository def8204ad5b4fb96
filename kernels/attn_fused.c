/*
 * attn_fused.c — the fused edge attention's dispatch (qc_attn_fused.h): the tile plan, the
 * scratch size per backend, and qc_op_attn_fused_*: the CPU tile loop (kernels/cpu/attn_fused.c)
 * on CPU and, with the emulated device open, on EMU; on CUDA the launchers of
 * qc_attn_fused_cuda.h, which take the same descriptors.
 */
#include "qc_attn_fused.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_fused_internal.h"
#include "exec_internal.h"
#include "qc_exec.h"
#include "qc_prof.h"
#include "qc_status.h"

#ifdef QC_HAVE_CUDA
#    include "qc_attn_fused_cuda.h"
#endif

// ---- tiles ------------------------------------------------------------------------------

enum qc_status qc_attn_fused_tiles_init(struct qc_attn_fused_tiles *t, const int64_t *row_ptr,
                                        int64_t n_bdst, int64_t tile_edges)
{
    QC_ASSERT(t, "attn fused tiles: NULL plan");
    if (n_bdst < 0 || (n_bdst > 0 && !row_ptr))
        return qc_errorf(QC_ERR_INVALID, "attn fused tiles: n_bdst %lld, row_ptr %s",
                         (long long)n_bdst, row_ptr ? "given" : "missing");
    if (n_bdst > 0 && row_ptr[0] != 0)
        return qc_errorf(QC_ERR_INVALID, "attn fused tiles: row_ptr[0] = %lld, expected 0",
                         (long long)row_ptr[0]);
    for (int64_t b = 0; b < n_bdst; b++)
        if (row_ptr[b + 1] < row_ptr[b])
            return qc_errorf(QC_ERR_INVALID, "attn fused tiles: row_ptr decreases at %lld",
                             (long long)b);
    const int64_t want = tile_edges > 0 ? tile_edges : 1;
    struct qc_attn_fused_tiles p = {0, NULL, NULL, 0, 0};
    p.b0 = malloc((size_t)(n_bdst + 1) * sizeof *p.b0);
    p.e0 = malloc((size_t)(n_bdst + 1) * sizeof *p.e0);
    if (!p.b0 || !p.e0) {
        free(p.b0);
        free(p.e0);
        return qc_errorf(QC_ERR_NOMEM, "attn fused tiles: %lld base destinations",
                         (long long)n_bdst);
    }
    /* add rows while the tile holds fewer than `want` edges */
    int64_t b = 0;
    while (b < n_bdst) {
        const int64_t e0 = row_ptr[b];
        p.b0[p.ntile] = b;
        p.e0[p.ntile] = e0;
        p.ntile++;
        while (b < n_bdst && row_ptr[b] - e0 < want) {
            const int64_t deg = row_ptr[b + 1] - row_ptr[b];
            p.max_deg = deg > p.max_deg ? deg : p.max_deg;
            b++;
        }
        const int64_t te = row_ptr[b] - e0;
        p.cap = te > p.cap ? te : p.cap;
    }
    p.b0[p.ntile] = n_bdst;
    p.e0[p.ntile] = n_bdst > 0 ? row_ptr[n_bdst] : 0;
    *t = p;
    return QC_OK;
}

void qc_attn_fused_tiles_deinit(struct qc_attn_fused_tiles *t)
{
    if (!t)
        return;
    free(t->b0);
    free(t->e0);
    memset(t, 0, sizeof *t);
}

// ---- CUDA ---------------------------------------------------------------------------------

#ifdef QC_HAVE_CUDA
/* The launchers want 256-byte aligned scratch; the caller's block is rounded up (the 64 extra
 * floats of qc_attn_fused_scratch_numel). */
static float *fused_cuda_scratch(float *scratch)
{
    return (float *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
}
#endif

#ifndef QC_HAVE_CUDA
static void fused_no_cuda(void)
{
    QC_ASSERT(false, "attn fused: the CUDA backend in a build without CUDA");
}
#endif

// ---- dispatch -----------------------------------------------------------------------------

/* What an op allocates and takes depends on the backend it runs on, or that a dry run's plan
 * describes (qc_exec_target_of). */
bool qc_attn_fused_wants_by_src(const struct qc_exec *ex)
{
    return qc_exec_target_of(ex) == QC_EXEC_CUDA;
}

bool qc_attn_fused_takes_r(const struct qc_exec *ex)
{
    return qc_exec_target_of(ex) != QC_EXEC_CUDA;
}

int64_t qc_attn_fused_scratch_numel(const struct qc_exec *ex, const struct qc_attn_fused_layer *l,
                                    const struct qc_attn_fused_edges *ed, bool backward)
{
    if (qc_exec_target_of(ex) != QC_EXEC_CUDA)
        return qc_attn_fused_scratch_numel_cpu(l, ed, backward);
    /* the CUDA launchers' layout (attn_fused_internal.h: the same arithmetic in every build, so
     * a CPU-only build plans a CUDA target exactly), plus 64 floats to align the caller's block
     * to 256 bytes (fused_cuda_scratch) */
    QC_ASSERT(ed->tiles, "attn fused: scratch without a tile plan");
    const struct qc_fe *fe = l->has_pos ? ed->fe : NULL;
    return qc_attn_fused_layout_make(ed->tiles->cap, l->D, l->has_pos, fe ? fe->d : 0,
                                     fe ? fe->F : 0, backward)
               .total +
           64;
}

static void fused_forward(const struct qc_exec *ex, float *u, float *smax, float *ssum,
                          const float *q, const float *k, const float *v,
                          const struct qc_attn_fused_layer *l, const struct qc_attn_fused_edges *ed,
                          const struct qc_dropout *drop, float *scratch)
{
    if (qc_exec_backend_of(ex) == QC_EXEC_CUDA) {
#ifdef QC_HAVE_CUDA
        qc_attn_fused_forward_cuda(u, smax, ssum, q, k, v, l, ed, drop, fused_cuda_scratch(scratch),
                                   (cudaStream_t)ex->stream);
#else
        fused_no_cuda();
#endif
        return;
    }
    kernels_exec_enter(ex);
    qc_attn_fused_forward_cpu(u, smax, ssum, q, k, v, l, ed, drop, scratch);
    kernels_exec_leave(ex);
}

static void fused_backward(const struct qc_exec *ex, float *dq, float *dk, float *dv,
                           const float *du, const float *smax, const float *ssum, const float *q,
                           const float *k, const float *v, const struct qc_attn_fused_layer *l,
                           const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                           float *scratch)
{
    if (qc_exec_backend_of(ex) == QC_EXEC_CUDA) {
#ifdef QC_HAVE_CUDA
        qc_attn_fused_backward_cuda(dq, dk, dv, du, smax, ssum, q, k, v, l, ed, drop,
                                    fused_cuda_scratch(scratch), (cudaStream_t)ex->stream);
#else
        fused_no_cuda();
#endif
        return;
    }
    kernels_exec_enter(ex);
    qc_attn_fused_backward_cpu(dq, dk, dv, du, smax, ssum, q, k, v, l, ed, drop, scratch);
    kernels_exec_leave(ex);
}

/* The profiler's description of one call: edges, queries per base destination, width; FLOPs and
 * bytes are the nested ops' (on CPU) or not defined (CUDA). */
static struct qc_prof_op fused_prof(const char *name, const struct qc_attn_fused_edges *ed,
                                    const struct qc_attn_fused_layer *l)
{
    return (struct qc_prof_op){name, "E,Q,D", {ed->n_edge, ed->n_query, l->D, 0}, 0, 0};
}

void qc_op_attn_fused_forward(const struct qc_exec *ex, float *u, float *smax, float *ssum,
                              const float *q, const float *k, const float *v,
                              const struct qc_attn_fused_layer *l,
                              const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                              float *scratch)
{
    if (!qc_prof_on()) {
        fused_forward(ex, u, smax, ssum, q, k, v, l, ed, drop, scratch);
        return;
    }
    struct qc_prof_mark m;
    kernels_prof_begin(&m, ex);
    fused_forward(ex, u, smax, ssum, q, k, v, l, ed, drop, scratch);
    const struct qc_prof_op po = fused_prof("attn_fused_forward", ed, l);
    kernels_prof_end(&m, ex, &po);
}

void qc_op_attn_fused_backward(const struct qc_exec *ex, float *dq, float *dk, float *dv,
                               const float *du, const float *smax, const float *ssum,
                               const float *q, const float *k, const float *v,
                               const struct qc_attn_fused_layer *l,
                               const struct qc_attn_fused_edges *ed, const struct qc_dropout *drop,
                               float *scratch)
{
    if (!qc_prof_on()) {
        fused_backward(ex, dq, dk, dv, du, smax, ssum, q, k, v, l, ed, drop, scratch);
        return;
    }
    struct qc_prof_mark m;
    kernels_prof_begin(&m, ex);
    fused_backward(ex, dq, dk, dv, du, smax, ssum, q, k, v, l, ed, drop, scratch);
    const struct qc_prof_op po = fused_prof("attn_fused_backward", ed, l);
    kernels_prof_end(&m, ex, &po);
}
