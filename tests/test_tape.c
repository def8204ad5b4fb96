/*
 * test_tape.c — the model's tape as the planner sees it (src/model/qc_qcnet.h,
 * qc_qcnet_describe; src/plan/qc_plan.h, the program).
 *
 *   dry == real   the program of a dry run (qc_qcnet_describe on the DRY backend, nothing
 *                 computed: every block call's memory spec replayed, qc_memspec.h) equals the
 *                 program recorded from a real training step on the CPU and on the emulated
 *                 device, fused (with r materialised, tiled, or every other edge set tiled as
 *                 the planner may choose them, qc_attention.h) and unfused,
 *                 fp32 and bf16: the same block applications with the
 *                 same size drivers, stash arenas and uses, and the same allocations and frees
 *                 in the same order, event for event, transients included. The specs are the one
 *                 source both read; this test guards that the real code takes its memory from
 *                 them.
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
#include "qc_half.h"
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

/* Compares the real program with the dry one, event for event (module comment): the blocks
 * (names, kinds, size drivers, stash bytes, first and last readers), the uses, the backward order,
 * and every event with allocation ids renumbered by appearance: markers, stash arenas, and every
 * allocation and free (the model's, and the blocks' whether they outlive a call or not) with its
 * class and bytes. The dry run has no estimated transients (no PEAK events). */
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
            r->nstash != d->nstash || r->fwd_last != d->fwd_last || r->bwd_first != d->bwd_first ||
            r->edge_set != d->edge_set || r->edge_mode != d->edge_mode ||
            r->edges_block != d->edges_block) {
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
    int32_t *rmap = malloc(((size_t)real->nalloc + 1) * sizeof *rmap);
    int32_t *dmap = malloc(((size_t)dry->nalloc + 1) * sizeof *dmap);
    if (!rmap || !dmap)
        T_FATAL("out of memory");
    int32_t nr = 0, nd = 0, block_allocs = 0, peaks = 0;
    int32_t n = real->nev < dry->nev ? real->nev : dry->nev;
    for (int32_t i = 0; i < dry->nev; i++)
        peaks += dry->ev[i].op == QC_PLAN_OP_PEAK;
    T_EXPECT_EQ_I64(peaks, 0, "%s: estimated transients (PEAK events) in the dry program", what);
    int32_t i = 0, span = -1; /* the block of the last marker */
    for (; i < n; i++) {
        const struct qc_plan_event *a = &real->ev[i], *b = &dry->ev[i];
        bool same = a->op == b->op && a->block == b->block;
        if (a->op <= QC_PLAN_OP_BWD_END)
            span = a->block;
        if (same && a->op == QC_PLAN_OP_ALLOC) {
            same = a->cls == b->cls && a->bytes == b->bytes;
            rmap[a->id] = nr++;
            dmap[b->id] = nd++;
            block_allocs += a->cls == QC_PLAN_CLS_BLOCK;
        } else if (same && (a->op == QC_PLAN_OP_FREE || a->op == QC_PLAN_OP_STASH)) {
            same = rmap[a->id] == dmap[b->id];
        }
        if (!same) {
            T_FAIL_AT("%s: event %d (in or after %s): op %d/%d block %d/%d cls %d/%d bytes "
                      "%llu/%llu (real/dry)",
                      what, i, span >= 0 ? real->blocks[span].name : "the start", a->op, b->op,
                      a->block, b->block, a->cls, b->cls, (unsigned long long)a->bytes,
                      (unsigned long long)b->bytes);
            break;
        }
    }
    if (i == n) {
        T_EXPECT(real->nev == dry->nev, "%s: programs of different lengths (%d real, %d dry)", what,
                 real->nev, dry->nev);
        /* the check has teeth: the blocks' own allocations are in both */
        T_EXPECT(block_allocs > 0, "%s: no block allocation in the programs", what);
        printf("  %s: %d blocks, %d events equal, %d of them block allocations\n", what,
               real->nblocks, n, block_allocs);
    }
    free(rmap);
    free(dmap);
}

/* The program of one real step of cfg on backend be, its edge sets in modes (NULL: cfg's). */
static bool record_real(struct qc_test_backend *be, const struct qc_qcnet_config *cfg,
                        const enum qc_attn_edge_mode *modes, struct qc_plan_program *prog)
{
    struct qc_qcnet *m = NULL;
    if (qc_qcnet_create_on(cfg, be->mc, qc_test_backend_exec(be), &m) != QC_OK) {
        T_FAIL_AT("create on %s: %s", be->name, qc_error_last());
        return false;
    }
    if (qc_qcnet_set_edge_modes(m, modes) != QC_OK) {
        T_FAIL_AT("edge modes: %s", qc_error_last());
        qc_qcnet_destroy(m);
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

enum tape_backend { TAPE_CPU = 0, TAPE_EMU, TAPE_CUDA };

/* Tiled edge mode (qc_attention.h): no edge context keeps r (no stash), nobody allocates dL/dr;
 * materialised on CPU/EMU: the positional edge contexts keep r. The program must say so, per
 * edge set (modes: NULL = mode for all), and name each block's set and mode for the planner. */
static void check_edge_mode(const struct qc_plan_program *p, enum qc_attn_edge_mode mode,
                            const enum qc_attn_edge_mode *modes, const char *what)
{
    int with_r = 0, placed = 0;
    for (int32_t b = 0; b < p->nblocks; b++) { /* an empty stash table is a 1-byte arena */
        const struct qc_plan_block *k = &p->blocks[b];
        if (k->kind != QC_PLAN_EDGES || k->edge_mode == QC_PLAN_EDGE_NONE)
            continue;
        placed++;
        const bool r = k->stash_bytes > 64;
        with_r += r;
        const enum qc_attn_edge_mode want = modes ? modes[k->edge_set] : mode;
        const bool tiled = want == QC_ATTN_EDGE_TILED;
        T_EXPECT(r == !tiled &&
                     k->edge_mode == (tiled ? QC_PLAN_EDGE_TILED : QC_PLAN_EDGE_MATERIALISED),
                 "%s: %s asked %s: %s, keeps r %d", what, k->name, qc_attn_edge_mode_str(want),
                 qc_plan_edge_mode_str((enum qc_plan_edge_mode)k->edge_mode), (int)r);
    }
    T_EXPECT(placed > 0, "%s: no edge context has an r to place", what);
    if (!modes && mode == QC_ATTN_EDGE_TILED)
        T_EXPECT(with_r == 0, "%s: %d edge contexts keep r in the tiled mode", what, with_r);
    else
        T_EXPECT(with_r > 0, "%s: no edge context keeps r", what);
    /* every application on a set carries its set and mode, and names its edge context */
    for (int32_t b = 0; b < p->nblocks; b++) {
        const struct qc_plan_block *k = &p->blocks[b];
        if (k->kind != QC_PLAN_ATTN)
            continue;
        const int32_t e = k->edges_block;
        T_EXPECT(k->edge_set >= 0 && e >= 0 && p->blocks[e].edge_set == k->edge_set &&
                     p->blocks[e].edge_mode == k->edge_mode,
                 "%s: %s: edge set %d, context %d", what, k->name, k->edge_set, e);
    }
}

static void test_dry_equals_real(enum qc_attn_impl impl, enum tape_backend kind, int precision,
                                 enum qc_attn_edge_mode mode, bool mixed)
{
    /* mixed: every other edge set tiled (with cfg AUTO: materialised), as the planner may
     * choose them (qc_qcnet_set_edge_modes) */
    enum qc_attn_edge_mode modes[QC_QCNET_EDGE_SETS];
    for (int e = 0; e < QC_QCNET_EDGE_SETS; e++)
        modes[e] = e % 2 ? QC_ATTN_EDGE_TILED : QC_ATTN_EDGE_MATERIALISED;
    if (!make_batch()) {
        T_FAIL_AT("batch");
        return;
    }
    struct qc_qcnet_config cfg;
    small_config(&cfg, impl);
    cfg.precision = precision;
    cfg.edge_mode = mode;
    struct qc_test_backend be;
    if (kind == TAPE_EMU) {
        if (!qc_test_backend_emu(&be, EMU_RESERVE)) {
            T_FAIL_AT("emu arena");
            return;
        }
    } else if (kind == TAPE_CUDA) {
        if (qc_test_backend_cuda(&be) != 0) { /* probed by main: a GPU is there */
            T_FAIL_AT("cuda backend: %s", qc_error_last());
            qc_test_backend_destroy(&be);
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
    if (dm && mixed)
        T_EXPECT(qc_qcnet_set_edge_modes(dm, modes) == QC_OK, "%s", qc_error_last());
    bool ok = dm && record_real(&be, &cfg, mixed ? modes : NULL, &real);
    if (ok) {
        T_EXPECT(qc_qcnet_describe(dm, &g_batch, kind == TAPE_CUDA, &dry) == QC_OK, "describe: %s",
                 qc_error_last());
        char what[64];
        snprintf(what, sizeof what, "%s %s %s %s", be.name,
                 impl == QC_ATTN_FUSED ? "fused" : "unfused", precision ? "bf16" : "fp32",
                 mixed ? "mixed" : qc_attn_edge_mode_str(mode));
        compare(&real, &dry, what);
        if (impl == QC_ATTN_FUSED && kind != TAPE_CUDA)
            check_edge_mode(&dry, mode, mixed ? modes : NULL, what);
        /* a second describe of the same batch gives the same program */
        struct qc_plan_program again;
        qc_plan_program_init(&again);
        T_EXPECT(qc_qcnet_describe(dm, &g_batch, kind == TAPE_CUDA, &again) == QC_OK, "%s",
                 qc_error_last());
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

int main(int argc, char **argv)
{
    const bool cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (cuda) { /* test_tape_cuda: a real CUDA step against a dry run for the CUDA target */
        struct qc_test_backend probe;
        const int rc = qc_test_backend_cuda(&probe);
        qc_test_backend_destroy(&probe);
        if (rc != 0)
            return rc; /* 77 without a GPU or CUDA build; a failing probe with a GPU fails */
    }
    static const struct {
        const char *name;
        enum qc_attn_impl impl;
        enum tape_backend kind;
        int precision;
        enum qc_attn_edge_mode mode;
        bool mixed; /* every other edge set tiled */
    } cases[] = {
        {"cpu, fused, fp32", QC_ATTN_FUSED, TAPE_CPU, QC_PREC_FP32, QC_ATTN_EDGE_AUTO, false},
        {"cpu, unfused, fp32", QC_ATTN_UNFUSED, TAPE_CPU, QC_PREC_FP32, QC_ATTN_EDGE_AUTO, false},
        {"emu, fused, fp32", QC_ATTN_FUSED, TAPE_EMU, QC_PREC_FP32, QC_ATTN_EDGE_AUTO, false},
        {"emu, unfused, fp32", QC_ATTN_UNFUSED, TAPE_EMU, QC_PREC_FP32, QC_ATTN_EDGE_AUTO, false},
        {"cpu, fused, bf16", QC_ATTN_FUSED, TAPE_CPU, QC_PREC_BF16, QC_ATTN_EDGE_AUTO, false},
        {"cpu, unfused, bf16", QC_ATTN_UNFUSED, TAPE_CPU, QC_PREC_BF16, QC_ATTN_EDGE_AUTO, false},
        {"cpu, fused tiled edges, fp32", QC_ATTN_FUSED, TAPE_CPU, QC_PREC_FP32, QC_ATTN_EDGE_TILED,
         false},
        {"emu, fused tiled edges, fp32", QC_ATTN_FUSED, TAPE_EMU, QC_PREC_FP32, QC_ATTN_EDGE_TILED,
         false},
        {"cpu, fused tiled edges, bf16", QC_ATTN_FUSED, TAPE_CPU, QC_PREC_BF16, QC_ATTN_EDGE_TILED,
         false},
        {"cpu, fused, every other edge set tiled, fp32", QC_ATTN_FUSED, TAPE_CPU, QC_PREC_FP32,
         QC_ATTN_EDGE_AUTO, true},
        {"emu, fused, every other edge set tiled, bf16", QC_ATTN_FUSED, TAPE_EMU, QC_PREC_BF16,
         QC_ATTN_EDGE_AUTO, true},
        {"cuda, fused, fp32", QC_ATTN_FUSED, TAPE_CUDA, QC_PREC_FP32, QC_ATTN_EDGE_AUTO, false},
        {"cuda, unfused, fp32", QC_ATTN_UNFUSED, TAPE_CUDA, QC_PREC_FP32, QC_ATTN_EDGE_AUTO, false},
        {"cuda, fused, bf16", QC_ATTN_FUSED, TAPE_CUDA, QC_PREC_BF16, QC_ATTN_EDGE_AUTO, false},
    };
    if (!cuda) {
        QC_TEST ("tape: program invariants")
            test_program_invariants();
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if ((cases[i].kind == TAPE_CUDA) != cuda)
            continue;
        char name[128];
        snprintf(name, sizeof name, "tape: the dry run's program equals a real step's (%s)",
                 cases[i].name);
        QC_TEST (name)
            test_dry_equals_real(cases[i].impl, cases[i].kind, cases[i].precision, cases[i].mode,
                                 cases[i].mixed);
    }
    return qc_test_summary();
}
