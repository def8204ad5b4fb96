/*
 * test_tape.c — the model's tape as the planner sees it (src/model/qc_qcnet.h,
 * qc_qcnet_describe; src/plan/qc_plan.h, the program).
 *
 *   dry == real   the program of a dry run (qc_qcnet_describe on the DRY backend, nothing
 *                 computed) equals the program recorded from a real training step on the CPU and
 *                 on the emulated device, fused and unfused: the same block applications with
 *                 the same size drivers, stash arenas and uses, and the same allocations and
 *                 frees in the same order (the model's, and the blocks' that outlive one call);
 *                 the transient scratch the dry run states exactly (FE, MLP, edge contexts)
 *                 equals the real one. The attention blocks' transients (left to the cost
 *                 model) are printed.
 *   invariants    qc_plan_program_finish accepts both and rejects broken programs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "device_testlib.h"
#include "batch_testlib.h"
#include "qc_batch.h"
#include "qc_graph.h"
#include "qc_memctx.h"
#include "qc_plan.h"
#include "qc_qcnet.h"
#include "qc_synth.h"

#define EMU_RESERVE ((size_t)8 << 30)

static struct qc_batch g_batch;

static bool make_batch(void)
{
    static bool tried, ok;
    if (tried)
        return ok;
    tried = true;
    enum qc_status rc = t_synth_batch2(77, &g_batch);
    ok = rc == QC_OK;
    if (!ok)
        printf("  batch: %s\n", qc_error_last());
    return ok;
}

static void small_config(struct qc_qcnet_config *cfg, enum qc_attn_impl impl)
{
    qc_qcnet_config_parity_tiny(cfg);
    cfg->hidden_dim = 16;
    cfg->num_heads = 2;
    cfg->head_dim = 8;
    cfg->num_freq_bands = 4;
    cfg->attention = impl;
}

/* Per event: whether it belongs to a block allocation that lives and dies inside one marker
 * span (a transient), and per span (the marker event index of its begin) the peak of those. */
struct split {
    bool *transient;  /* [nev] */
    uint64_t *peak;   /* [nev]: at span-begin events, the span's transient peak (with PEAKs) */
    int32_t *span_of; /* [nalloc]: span-begin event of the allocation, -1 outside spans */
};

static void split_free(struct split *s)
{
    free(s->transient);
    free(s->peak);
    free(s->span_of);
}

static void split_program(const struct qc_plan_program *p, struct split *s)
{
    s->transient = calloc((size_t)p->nev + 1, sizeof *s->transient);
    s->peak = calloc((size_t)p->nev + 1, sizeof *s->peak);
    s->span_of = malloc(((size_t)p->nalloc + 1) * sizeof *s->span_of);
    int32_t *aev = malloc(((size_t)p->nalloc + 1) * sizeof *aev);
    uint64_t *abytes = calloc((size_t)p->nalloc + 1, sizeof *abytes);
    if (!s->transient || !s->peak || !s->span_of || !aev || !abytes)
        T_FATAL("out of memory");
    int32_t span = -1;
    uint64_t live = 0;
    for (int32_t i = 0; i < p->nev; i++) {
        const struct qc_plan_event *e = &p->ev[i];
        if (e->op == QC_PLAN_OP_FWD || e->op == QC_PLAN_OP_BWD) {
            span = i;
            live = 0;
        } else if (e->op == QC_PLAN_OP_FWD_END || e->op == QC_PLAN_OP_BWD_END) {
            span = -1;
        } else if (e->op == QC_PLAN_OP_ALLOC) {
            s->span_of[e->id] = e->cls == QC_PLAN_CLS_BLOCK ? span : -1;
            aev[e->id] = i;
            abytes[e->id] = e->bytes;
            if (s->span_of[e->id] >= 0) {
                live += e->bytes;
                if (live > s->peak[span])
                    s->peak[span] = live;
            }
        } else if (e->op == QC_PLAN_OP_FREE) {
            if (span >= 0 && s->span_of[e->id] == span) {
                s->transient[i] = s->transient[aev[e->id]] = true;
                live -= abytes[e->id];
            }
        } else if (e->op == QC_PLAN_OP_PEAK && span >= 0) {
            if (live + e->bytes > s->peak[span])
                s->peak[span] = live + e->bytes;
        }
    }
    free(aev);
    free(abytes);
}

/* Compares the real program with the dry one (module comment); prints the attention blocks'
 * real transients. */
static void compare(const struct qc_plan_program *real, const struct qc_plan_program *dry,
                    const char *what)
{
    T_EXPECT_EQ_I64(real->nblocks, dry->nblocks, "%s: block applications", what);
    if (real->nblocks != dry->nblocks)
        return;
    for (int32_t b = 0; b < real->nblocks; b++) {
        const struct qc_plan_block *r = &real->blocks[b], *d = &dry->blocks[b];
        if (strcmp(r->name, d->name) != 0 || r->kind != d->kind || r->rows != d->rows ||
            r->edges != d->edges || r->srcs != d->srcs || r->stash_bytes != d->stash_bytes ||
            r->nstash != d->nstash || r->fwd_last != d->fwd_last || r->bwd_first != d->bwd_first) {
            T_FAIL_AT("%s: block %d: real %s (%s, %lld rows, %lld edges, %llu stash bytes) vs dry "
                      "%s (%s, %lld rows, %lld edges, %llu stash bytes)",
                      what, b, r->name, qc_plan_kind_str(r->kind), (long long)r->rows,
                      (long long)r->edges, (unsigned long long)r->stash_bytes, d->name,
                      qc_plan_kind_str(d->kind), (long long)d->rows, (long long)d->edges,
                      (unsigned long long)d->stash_bytes);
            return;
        }
    }
    T_EXPECT_EQ_I64(real->nuses, dry->nuses, "%s: uses", what);
    for (int32_t i = 0; i < real->nuses && i < dry->nuses; i++)
        T_EXPECT(real->uses[i].user == dry->uses[i].user && real->uses[i].used == dry->uses[i].used,
                 "%s: use %d", what, i);
    T_EXPECT_EQ_I64(real->nbwd, dry->nbwd, "%s: backwards", what);
    for (int32_t i = 0; i < real->nbwd && i < dry->nbwd; i++)
        T_EXPECT_EQ_I64(real->bwd_order[i], dry->bwd_order[i], "%s: backward %d", what, i);
    struct split rs, ds;
    split_program(real, &rs);
    split_program(dry, &ds);
    /* the non-transient events, in order, with allocation ids renumbered by appearance */
    int32_t *rmap = malloc(((size_t)real->nalloc + 1) * sizeof *rmap);
    int32_t *dmap = malloc(((size_t)dry->nalloc + 1) * sizeof *dmap);
    if (!rmap || !dmap)
        T_FATAL("out of memory");
    int32_t i = 0, j = 0, nr = 0, nd = 0, compared = 0;
    bool ok = true;
    uint64_t kinds_real[QC_PLAN_KIND_COUNT][2] = {{0}};
    for (;;) {
        while (i < real->nev && (rs.transient[i] || real->ev[i].op == QC_PLAN_OP_PEAK))
            i++;
        while (j < dry->nev && (ds.transient[j] || dry->ev[j].op == QC_PLAN_OP_PEAK))
            j++;
        if (i >= real->nev || j >= dry->nev)
            break;
        const struct qc_plan_event *a = &real->ev[i], *b = &dry->ev[j];
        bool same = a->op == b->op && a->block == b->block;
        if (same && a->op == QC_PLAN_OP_ALLOC) {
            same = a->cls == b->cls && a->bytes == b->bytes;
            rmap[a->id] = nr++;
            dmap[b->id] = nd++;
        } else if (same && (a->op == QC_PLAN_OP_FREE || a->op == QC_PLAN_OP_STASH)) {
            same = rmap[a->id] == dmap[b->id];
        }
        if (same && (a->op == QC_PLAN_OP_FWD || a->op == QC_PLAN_OP_BWD)) {
            const struct qc_plan_block *k = &real->blocks[a->block];
            const int ph = a->op == QC_PLAN_OP_BWD;
            if (k->scratch_known && rs.peak[i] != ds.peak[j]) {
                T_FAIL_AT("%s: %s %s: transient %llu real, %llu stated by the dry run", what,
                          k->name, ph ? "backward" : "forward", (unsigned long long)rs.peak[i],
                          (unsigned long long)ds.peak[j]);
                ok = false;
            }
            if (!k->scratch_known && rs.peak[i] > kinds_real[k->kind][ph])
                kinds_real[k->kind][ph] = rs.peak[i];
        }
        if (!same) {
            T_FAIL_AT("%s: event %d (real) / %d (dry): op %d/%d block %d/%d cls %d/%d bytes "
                      "%llu/%llu",
                      what, i, j, a->op, b->op, a->block, b->block, a->cls, b->cls,
                      (unsigned long long)a->bytes, (unsigned long long)b->bytes);
            ok = false;
            break;
        }
        compared++;
        i++;
        j++;
    }
    if (ok) {
        T_EXPECT(i >= real->nev && j >= dry->nev, "%s: programs of different lengths (%d, %d)",
                 what, i, j);
        printf("  %s: %d blocks, %d events compared (%d real, %d dry); attention transients "
               "(largest): kv %llu / %llu, attn %llu / %llu (fwd / bwd)\n",
               what, real->nblocks, compared, real->nev, dry->nev,
               (unsigned long long)kinds_real[QC_PLAN_KV][0],
               (unsigned long long)kinds_real[QC_PLAN_KV][1],
               (unsigned long long)kinds_real[QC_PLAN_ATTN][0],
               (unsigned long long)kinds_real[QC_PLAN_ATTN][1]);
    }
    free(rmap);
    free(dmap);
    split_free(&rs);
    split_free(&ds);
}

/* The program of one real step of cfg on backend be. */
static bool record_real(struct qc_test_backend *be, const struct qc_qcnet_config *cfg,
                        struct qc_plan_program *prog)
{
    struct qc_qcnet *m = NULL;
    if (qc_qcnet_create_on(cfg, be->mc, qc_test_backend_exec(be), &m) != QC_OK) {
        T_FAIL_AT("create on %s: %s", be->name, qc_error_last());
        return false;
    }
    qc_qcnet_init_params(m, 5);
    struct qc_qcnet_ctx ctx = {.training = true, .need_backward = true, .seed = 3};
    /* device backends: the batch staged by the caller, as the trainer does (the dry run's
     * program leaves the batch's storage out) */
    void *nd = NULL, *gd = NULL;
    struct qc_batch view;
    if (be->kind != QC_EXEC_CPU) {
        nd = qc_memctx_alloc(be->mc, QC_MEM_MODEL, g_batch.node_bytes, "test/batch.nodes");
        gd = qc_memctx_alloc(be->mc, QC_MEM_MODEL, g_batch.graph_bytes, "test/batch.graph");
        if (!nd || !gd ||
            qc_op_upload(qc_test_backend_exec(be), nd, g_batch.node_mem, g_batch.node_bytes) !=
                QC_OK ||
            qc_op_upload(qc_test_backend_exec(be), gd, g_batch.graph_mem, g_batch.graph_bytes) !=
                QC_OK)
            T_FATAL("device batch: %s", qc_error_last());
        qc_batch_rebase(&g_batch, nd, gd, &view);
        ctx.batch_dev = &view;
    }
    enum qc_status rc = qc_qcnet_record(m, prog);
    if (rc == QC_OK)
        rc = qc_qcnet_forward(m, &g_batch, &ctx, NULL);
    if (rc == QC_OK)
        rc = qc_qcnet_loss(m, NULL);
    if (rc == QC_OK)
        rc = qc_qcnet_backward(m, 1.0f);
    qc_qcnet_release(m);
    if (rc == QC_OK)
        rc = qc_qcnet_record(m, NULL);
    if (rc == QC_OK)
        rc = qc_plan_program_finish(prog);
    T_EXPECT(rc == QC_OK, "%s: recorded step: %s", be->name, qc_error_last());
    qc_qcnet_destroy(m);
    qc_memctx_free(be->mc, QC_MEM_MODEL, nd, g_batch.node_bytes);
    qc_memctx_free(be->mc, QC_MEM_MODEL, gd, g_batch.graph_bytes);
    return rc == QC_OK;
}

static void test_dry_equals_real(enum qc_attn_impl impl, bool emu)
{
    if (!make_batch()) {
        T_FAIL_AT("batch");
        return;
    }
    struct qc_qcnet_config cfg;
    small_config(&cfg, impl);
    struct qc_test_backend be;
    if (emu) {
        if (!qc_test_backend_emu(&be, EMU_RESERVE)) {
            T_FAIL_AT("emu arena");
            return;
        }
    } else {
        qc_test_backend_cpu(&be);
    }
    struct qc_plan_program real, dry;
    qc_plan_program_init(&real);
    qc_plan_program_init(&dry);
    struct qc_qcnet *dm = NULL;
    T_EXPECT(qc_qcnet_create_dry(&cfg, &dm) == QC_OK, "%s", qc_error_last());
    bool ok = dm && record_real(&be, &cfg, &real);
    if (ok) {
        T_EXPECT(qc_qcnet_describe(dm, &g_batch, false, &dry) == QC_OK, "describe: %s",
                 qc_error_last());
        char what[64];
        snprintf(what, sizeof what, "%s %s", be.name, impl == QC_ATTN_FUSED ? "fused" : "unfused");
        compare(&real, &dry, what);
        /* a second describe of the same batch gives the same program */
        struct qc_plan_program again;
        qc_plan_program_init(&again);
        T_EXPECT(qc_qcnet_describe(dm, &g_batch, false, &again) == QC_OK, "%s", qc_error_last());
        T_EXPECT(again.nev == dry.nev &&
                     memcmp(again.ev, dry.ev, (size_t)dry.nev * sizeof *dry.ev) == 0,
                 "two dry runs differ");
        qc_plan_program_free(&again);
    }
    qc_qcnet_destroy(dm);
    qc_plan_program_free(&real);
    qc_plan_program_free(&dry);
    qc_test_backend_destroy(&be);
}

/* qc_plan_program_finish rejects what the planner could not trust. */
static void test_program_invariants(void)
{
    struct qc_plan_program p;
    qc_plan_program_init(&p);
    const int32_t a = qc_plan_program_block(&p, "a", QC_PLAN_FE);
    const int32_t b = qc_plan_program_block(&p, "b", QC_PLAN_ATTN);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD, a, -1, 0, 0, 0);
    const int32_t s = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 4096, 1, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_STASH, a, s, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD_END, a, -1, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD, b, -1, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD_END, b, -1, 0, 0, 0);
    T_EXPECT(qc_plan_program_use(&p, b, a) == QC_OK, "use");
    qc_plan_program_event(&p, QC_PLAN_OP_BWD, b, -1, 0, 0, 1);
    qc_plan_program_event(&p, QC_PLAN_OP_BWD_END, b, -1, 0, 0, 1);
    qc_plan_program_event(&p, QC_PLAN_OP_BWD, a, -1, 0, 0, 1);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, s, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_BWD_END, a, -1, 0, 0, 1);
    T_EXPECT(qc_plan_program_finish(&p) == QC_OK, "%s", qc_error_last());
    T_EXPECT_EQ_I64(p.blocks[a].stash_bytes, 4096, "stash bytes");
    T_EXPECT_EQ_I64(p.blocks[a].fwd_last, b, "a's stash is read by b's forward last");
    T_EXPECT_EQ_I64(p.blocks[a].bwd_first, b, "and first by b's backward");
    T_EXPECT(p.nbwd == 2 && p.bwd_order[0] == b && p.bwd_order[1] == a, "backward order");
    /* a stash freed outside its block's backward */
    const struct qc_plan_event free_ev = p.ev[9]; /* the FREE after the end: swap the last two */
    p.ev[9] = p.ev[10];
    p.ev[10] = free_ev;
    T_EXPECT(qc_plan_program_finish(&p) == QC_ERR_INVALID, "stash freed outside its backward");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "outside its backward");
    /* a double free */
    qc_plan_program_reset(&p);
    qc_plan_program_block(&p, "a", QC_PLAN_FE);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD, 0, -1, 0, 0, 0);
    const int32_t x = qc_plan_program_event(&p, QC_PLAN_OP_ALLOC, -1, -1, 64, 1, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, x, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FREE, -1, x, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD_END, 0, -1, 0, 0, 0);
    T_EXPECT(qc_plan_program_finish(&p) == QC_ERR_INVALID, "double free");
    /* nested markers */
    qc_plan_program_reset(&p);
    qc_plan_program_block(&p, "a", QC_PLAN_FE);
    qc_plan_program_block(&p, "b", QC_PLAN_FE);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD, 0, -1, 0, 0, 0);
    qc_plan_program_event(&p, QC_PLAN_OP_FWD, 1, -1, 0, 0, 0);
    T_EXPECT(qc_plan_program_finish(&p) == QC_ERR_INVALID, "a forward inside another");
    qc_plan_program_free(&p);
}

int main(void)
{
    QC_TEST ("tape: program invariants")
        test_program_invariants();
    QC_TEST ("tape: the dry run's program equals a real step's (cpu, fused)")
        test_dry_equals_real(QC_ATTN_FUSED, false);
    QC_TEST ("tape: the dry run's program equals a real step's (cpu, unfused)")
        test_dry_equals_real(QC_ATTN_UNFUSED, false);
    QC_TEST ("tape: the dry run's program equals a real step's (emu, fused)")
        test_dry_equals_real(QC_ATTN_FUSED, true);
    QC_TEST ("tape: the dry run's program equals a real step's (emu, unfused)")
        test_dry_equals_real(QC_ATTN_UNFUSED, true);
    return qc_test_summary();
}
