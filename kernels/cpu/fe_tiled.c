/*
 * fe_tiled.c — the FourierEmbedding over row tiles on the CPU (qc_fourier_embed.h): the fused
 * attention's edge embeddings r = FE(feat [+ cat]), computed once per edge set with no FE
 * tensor kept, and their backward (each tile recomputed, then differentiated).
 *
 * Tiles of rows.tile rows go to OpenMP threads; inside a tile the ops run on the tile's thread
 * (ex = NULL; OpenBLAS set to one thread for the call). Forward tiles write disjoint rows.
 * Backward tile t goes to lane t mod threads (cpu_internal.h): the FE parameter gradients and the
 * categorical table gradient of a lane are summed in lane order at the end.
 *
 * Scratch, per thread: the FE tensors of one tile (saved), the FE scratch, the tile's
 * categorical rows and, in backward, the categorical gradient rows (the recompute stops before
 * the output Linear, which the backward does not read);
 * then, in backward, per thread a lane: the FE parameter gradients and the categorical table.
 */
#include "qc_fourier_embed.h"

#include <string.h>

#include <omp.h>

#include "cpu_internal.h"
#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_status.h"

struct fet_layout {
    int nthreads;
    int64_t ntile, cap;            /* tiles, rows of the largest tile */
    int64_t saved_n, ws_n, rows_n; /* per thread: FE tensors, FE scratch, cat/out/dcat rows */
    int64_t thread_n;              /* one thread's workspace */
    int64_t dfe_n, dcat_n;         /* per lane (backward) */
    int64_t lane_n;
    int64_t total;
};

static struct fet_layout fet_layout_make(const struct qc_fe *fe, const struct qc_fe_rows *rows,
                                         bool backward)
{
    struct fet_layout y;
    memset(&y, 0, sizeof y);
    const int64_t tile = rows->tile > 0 ? rows->tile : 1, D = fe->D;
    const int64_t cap = rows->N < tile ? rows->N : tile;
    y.cap = cap;
    y.ntile = rows->N > 0 ? (rows->N + tile - 1) / tile : 0;
    y.nthreads = omp_get_max_threads();
    if (y.nthreads > y.ntile)
        y.nthreads = y.ntile > 0 ? (int)y.ntile : 1;
    y.saved_n = cpu_round16(qc_fe_saved_numel(fe, cap));
    const int64_t nf = qc_fe_scratch_numel(fe, cap, false);
    const int64_t nb = backward ? qc_fe_scratch_numel(fe, cap, true) : 0;
    y.ws_n = cpu_round16(nf > nb ? nf : nb);
    y.rows_n = cpu_round16((backward ? 2 : 1) * cap * D); /* cat [, dcat] */
    y.thread_n = y.saved_n + y.ws_n + y.rows_n;
    if (backward) {
        y.dfe_n = cpu_round16(qc_fe_params_numel(fe));
        y.dcat_n = rows->cat_table && rows->dcat_table ? cpu_round16(rows->ncat * D) : 0;
        y.lane_n = y.dfe_n + y.dcat_n;
    }
    y.total = (int64_t)y.nthreads * (y.thread_n + y.lane_n);
    return y;
}

int64_t qc_fe_tiled_scratch_numel_cpu(const struct qc_fe *fe, const struct qc_fe_rows *rows,
                                      bool backward)
{
    return fet_layout_make(fe, rows, backward).total;
}

/* One tile's forward: rows [r0, r0+n) of out, the tile's FE tensors in sv. */
static void fet_tile_forward(const struct qc_fe *fe, float *out, const struct qc_fe_rows *rows,
                             int64_t r0, int64_t n, struct qc_fe_saved *sv, float *saved, float *ws,
                             float *cat)
{
    const int64_t D = fe->D;
    if (rows->cat_table)
        qc_op_embedding_forward(NULL, cat, rows->cat_idx + r0, rows->cat_table, n, D, rows->ncat);
    qc_fe_saved_pack(fe, n, saved, sv);
    qc_op_fe_forward(NULL, fe, out, sv, fe->d > 0 ? rows->c + r0 * fe->d : NULL,
                     rows->cat_table ? cat : NULL, n, ws);
}

void qc_fe_forward_tiled_cpu(const struct qc_fe *fe, float *out, const struct qc_fe_rows *rows,
                             float *scratch)
{
    const struct fet_layout y = fet_layout_make(fe, rows, false);
    const int64_t tile = rows->tile > 0 ? rows->tile : 1, D = fe->D;
    if (y.ntile == 0)
        return;
    const struct cpu_team tm = cpu_team_begin(y.nthreads);
    /* tiles write disjoint rows: any schedule gives the same bits */
#pragma omp parallel for schedule(dynamic, 1) num_threads(y.nthreads)
    for (int64_t t = 0; t < y.ntile; t++) {
        float *w = scratch + (int64_t)omp_get_thread_num() * y.thread_n;
        const int64_t r0 = t * tile, n = rows->N - r0 < tile ? rows->N - r0 : tile;
        struct qc_fe_saved sv;
        fet_tile_forward(fe, out + r0 * D, rows, r0, n, &sv, w, w + y.saved_n,
                         w + y.saved_n + y.ws_n);
    }
    cpu_team_end(tm);
}

void qc_fe_backward_tiled_cpu(const struct qc_fe *fe, const float *dout,
                              const struct qc_fe_rows *rows, float *scratch)
{
    const struct fet_layout y = fet_layout_make(fe, rows, true);
    const int64_t tile = rows->tile > 0 ? rows->tile : 1, D = fe->D;
    if (y.ntile == 0)
        return;
    float *lanes0 = scratch + (int64_t)y.nthreads * y.thread_n;
    memset(lanes0, 0, (size_t)(y.nthreads * y.lane_n) * sizeof *lanes0);
    const struct cpu_team tm = cpu_team_begin(y.nthreads);
    /* static round-robin: tile t always lands in lane t mod nthreads (cpu_internal.h) */
#pragma omp parallel for schedule(static, 1) num_threads(y.nthreads)
    for (int64_t t = 0; t < y.ntile; t++) {
        const int tid = omp_get_thread_num();
        float *w = scratch + (int64_t)tid * y.thread_n, *lane = lanes0 + (int64_t)tid * y.lane_n;
        float *saved = w, *ws = w + y.saved_n, *cat = ws + y.ws_n;
        float *dcat = cat + y.cap * D;
        const int64_t r0 = t * tile, n = rows->N - r0 < tile ? rows->N - r0 : tile;
        struct qc_fe_saved sv;
        fet_tile_forward(fe, NULL, rows, r0, n, &sv, saved, ws, cat); /* no output: sv only */
        struct qc_fe lfe = *fe; /* this lane's gradient buffer */
        lfe.dw = lane;
        const bool want_dcat = y.dcat_n > 0;
        qc_op_fe_backward(NULL, &lfe, NULL, want_dcat ? dcat : NULL, dout + r0 * D, &sv,
                          fe->d > 0 ? rows->c + r0 * fe->d : NULL, n, ws);
        if (want_dcat)
            qc_op_embedding_backward(NULL, lane + y.dfe_n, dcat, rows->cat_idx + r0, n, D,
                                     rows->ncat);
    }
    cpu_team_end(tm);
    cpu_lanes_reduce(fe->dw, lanes0, y.nthreads, y.lane_n, 0, qc_fe_params_numel(fe));
    if (y.dcat_n)
        cpu_lanes_reduce(rows->dcat_table, lanes0, y.nthreads, y.lane_n, y.dfe_n, rows->ncat * D);
}
