/*
 * edge_mode.c — the planner's choice of the edge mode per edge set (qc_plan.h, "the edge
 * modes"; README.md, "The edge modes"): the fused attention keeps an edge set's relative
 * embeddings r and dL/dr materialised (E x D each: fast) or computes them per attention tile
 * (nothing of E rows: an FE forward per application forward, an FE forward + backward per
 * application backward). A program is one assignment of modes (the model's dry run writes
 * it), so the choice is made over programs: the caller's describer writes the program of a
 * mask of tiled sets, and each is planned with the stash policies (qc_plan_make).
 *
 *   1. the default modes (mask 0): when their plan fits (or nothing is to be chosen), done;
 *   2. else the materialised sets of that program, ordered by the bytes tiling saves per second
 *      it adds (qc_plan_edge_order: a function of the program and the cost model), go tiled one
 *      at a time, the new program planned each time, until one fits;
 *      (in 1 and 2 a plan that fits only by fetching nothing ahead fits only with room:
 *      qc_plan_make_room, qc_plan_room's plan in the same search)
 *   3. no fit with every set tiled (tried right after 1 when 1 does not fit, so that a batch
 *      that cannot fit costs two descriptions): that plan, fits false (the caller splits the
 *      batch).
 *
 * Above plan.c and cost.c (it calls both; neither calls it).
 */
#include "qc_plan.h"
#include "plan_internal.h"

#include <stdlib.h>
#include <string.h>

int qc_plan_edge_order(const struct qc_plan_program *p, const struct qc_plan_cost *c,
                       struct qc_plan_edge_gain *out, int cap)
{
    int n = 0;
    for (int32_t e = 0; e < p->nblocks && n < cap; e++) {
        const struct qc_plan_block *k = &p->blocks[e];
        if (k->kind != QC_PLAN_EDGES || k->edge_mode != QC_PLAN_EDGE_MATERIALISED ||
            k->edge_set < 0 || k->edge_set >= QC_PLAN_EDGE_SETS_MAX)
            continue;
        const double fe_f = qc_plan_cost_time_materialised(c, p, e, 0);
        const double fe_b = qc_plan_cost_time_materialised(c, p, e, 1);
        double extra = -(fe_f + fe_b); /* the context no longer computes r, nor its backward */
        for (int32_t b = 0; b < p->nblocks; b++)
            if (p->blocks[b].kind == QC_PLAN_ATTN && p->blocks[b].edge_set == k->edge_set)
                extra += fe_f + (fe_f + fe_b);
        struct qc_plan_edge_gain g = {
            .set = k->edge_set, .block = e, .bytes = 2 * k->stash_bytes, .extra_s = extra};
        /* insertion by bytes per extra second, largest first; a set that adds no time first */
        int i = n++;
        for (; i > 0; i--) {
            const struct qc_plan_edge_gain *q = &out[i - 1];
            const double lhs = (double)g.bytes * (q->extra_s > 0 ? q->extra_s : 0.0);
            const double rhs = (double)q->bytes * (g.extra_s > 0 ? g.extra_s : 0.0);
            const bool better = g.extra_s <= 0    ? q->extra_s > 0 || g.set < q->set
                                : q->extra_s <= 0 ? false
                                : lhs != rhs      ? lhs > rhs
                                                  : g.set < q->set;
            if (!better)
                break;
            out[i] = out[i - 1];
        }
        out[i] = g;
    }
    return n;
}

enum qc_status qc_plan_room(const struct qc_plan_program *pr, const struct qc_plan_cost *cost,
                            const struct qc_plan_hw *hw, const struct qc_plan_params *p,
                            struct qc_plan_result *r, bool *ok)
{
    /* fetching ahead, or the room already there (the last move went well under the target):
     * no second search */
    *ok = qc_plan_has_room(p, r);
    if (*ok || !r->fits)
        return QC_OK;
    struct qc_plan_params p2 = *p;
    p2.margin = plan_room_margin(p);
    struct qc_plan_result r2 = {0};
    QC_TRY(qc_plan_make(pr, cost, hw, &p2, &r2));
    if (!r2.fits) {
        qc_plan_result_free(&r2);
        return QC_OK;
    }
    /* r2 fits the target of twice the margin, so it fits the caller's: report that target */
    r2.target = r->target;
    qc_plan_result_free(r);
    *r = r2;
    *ok = true;
    return QC_OK;
}

enum qc_status qc_plan_make_edges(const struct qc_plan_describer *d, bool choose,
                                  const struct qc_plan_cost *cost, const struct qc_plan_hw *hw,
                                  const struct qc_plan_params *p, uint32_t *tiled,
                                  const struct qc_plan_program **prog, struct qc_plan_result *out)
{
    const struct qc_plan_program *pr = NULL;
    QC_TRY(d->describe(d->user, 0, &pr));
    struct qc_plan_result r = {0};
    bool done = true;
    if (choose) {
        QC_TRY(qc_plan_make_room(pr, cost, hw, p, NULL, &r, &done));
        done = done || !r.fits;
    } else {
        QC_TRY(qc_plan_make(pr, cost, hw, p, &r));
    }
    uint32_t mask = 0;
    struct qc_plan_edge_gain order[QC_PLAN_EDGE_SETS_MAX];
    const int n = choose && (!r.fits || !done)
                      ? qc_plan_edge_order(pr, cost, order, QC_PLAN_EDGE_SETS_MAX)
                      : 0;
    if (n > 0 && !r.fits) { /* every set tiled first: when even that does not fit, it is the
                               answer (the smallest program; one description instead of n). Not
                               when the default modes fit fetching nothing ahead: a fit exists,
                               and the loop below ends at every set tiled anyway */
        uint32_t all = 0;
        for (int i = 0; i < n; i++)
            all |= (uint32_t)1 << order[i].set;
        qc_plan_result_free(&r);
        QC_TRY(d->describe(d->user, all, &pr));
        QC_TRY(qc_plan_make(pr, cost, hw, p, &r));
        if (!r.fits || n == 1) {
            *tiled = all;
            *prog = pr;
            *out = r;
            return QC_OK;
        }
        qc_plan_result_free(&r);
        r.fits = false;
    }
    done = false;
    for (int i = 0; i < n && !done; i++) {
        mask |= (uint32_t)1 << order[i].set;
        qc_plan_result_free(&r);
        QC_TRY(d->describe(d->user, mask, &pr));
        if (i + 1 < n) /* with every set tiled, the plan is taken as it is */
            QC_TRY(qc_plan_make_room(pr, cost, hw, p, NULL, &r, &done));
        else
            QC_TRY(qc_plan_make(pr, cost, hw, p, &r));
    }
    *tiled = mask;
    *prog = pr;
    *out = r;
    return QC_OK;
}
