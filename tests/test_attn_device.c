/*
 * test_attn_device.c — the attention layer (src/model/qc_attention.h) on every backend: the same
 * cases run through the blocks API on the CPU (the reference: host memory, malloc) and on a
 * device backend (kernels/qc_exec.h), with every input uploaded, the graph's index arrays
 * uploaded and their host mirrors set, and every result downloaded:
 *
 *   test_attn_device (label cpu): the emulated device (src/base/qc_emu.h). Device memory is a
 *     PROT_NONE arena opened only while an op runs, so any host read of a tensor by the layers
 *     faults; the results must equal the CPU's BIT FOR BIT (memcmp): outputs, every stash entry
 *     (edge context, kv context, each application), input gradients and parameter gradients
 *     (layer, FourierEmbedding, categorical table). The arena must hold no more bytes after a
 *     case than before (the layers give back everything they allocated).
 *   test_attn_device_cuda (label gpu, ARGS cuda): the CUDA backend (memory from qc_alloc on a
 *     CUDA qc_device, ops on its compute stream, TF32 off) against the CPU within the
 *     tolerances below; exits 77 without a GPU or in a CPU-only build.
 *
 * Cases: FUSED and UNFUSED; self-attention and bipartite; with and without positional input
 * (FE(d), FE(0) + categorical table, edge types added to FE(d)); several queries per base
 * destination (with and without query_row, extra x_dst rows no query names); destinations of
 * degree 0, 1 and many, and a set with no edge at all; two applications sharing one kv context
 * (the decoder's recurrence); dropout on and off; several tiles (small tile_edges, on CUDA
 * tile_edges_cuda too).
 *
 * CUDA tolerances, per tensor: |gpu − cpu| <= rtol·|cpu| + atol·max(1, max|cpu|) for every
 * element, NaN/Inf identical. Activations and stash entries: rtol 1e-4, atol 1e-5. Why: the GEMMs
 * are cuBLAS (another fp32 summation order than OpenBLAS: ~1e-6 relative at these widths, K <=
 * 4D = 128), LayerNorm statistics are double on the device, expf/sinf/cosf differ from glibc by
 * a few ulp; one layer compounds a few such steps, which stays well below 1e-4 relative, and
 * values near zero (differences of O(1) terms) need the absolute part, scaled by the tensor's
 * size because its rounding is. Parameter gradients: rtol 1e-3, atol 1e-4: they are column sums
 * over every row or edge with cancellation (the kernels' own test, tests/test_attn_fused_cuda.c,
 * needs atol 1e-3, rtol 1e-2 for them at D 128 and 1,500 destinations; these cases are smaller).
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_attention.h"
#include "qc_attn_fused.h"
#include "qc_emu.h"
#include "qc_exec.h"
#include "qc_fourier.h"
#include "qc_stash.h"
#include "qc_status.h"
#include "device_testlib.h"
#include "testutil.h"

#ifdef QC_HAVE_CUDA
#    include "qc_alloc.h"
#    include "qc_device.h"
#    include "qc_kernels_cuda.h"
#endif

#define D_TEST    32
#define H_TEST    4
#define F_TEST    8
#define MAX_APPS  2
#define MAX_SHOWN 6 /* mismatches printed per tensor */

static uint64_t g_rng;

static double urand(void)
{
    return (double)(qc_test_rand(&g_rng) >> 11) * (1.0 / 9007199254740992.0);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n > 0 ? n : 1, size);
    if (!p)
        T_FATAL("out of host memory");
    return p;
}

static float *fnew(int64_t n)
{
    return xcalloc((size_t)(n > 0 ? n : 0), sizeof(float));
}

static void fill(float *x, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)urand();
}

/* Parameters spread enough that every path matters (biases and LN shifts non-zero). */
static void param_fill(const struct qc_param_table *t, float *w)
{
    for (int i = 0; i < t->n; i++) {
        const struct qc_param_spec *p = &t->p[i];
        float *x = w + p->offset;
        switch (p->init) {
        case QC_INIT_LINEAR_W: {
            float a = (float)sqrt(6.0 / (double)(p->ne[0] + p->ne[1]));
            fill(x, p->numel, -a, a);
            break;
        }
        case QC_INIT_ONE:
            fill(x, p->numel, 0.7f, 1.3f);
            break;
        case QC_INIT_ZERO:
            fill(x, p->numel, -0.2f, 0.2f);
            break;
        case QC_INIT_EMBEDDING:
            fill(x, p->numel, -0.5f, 0.5f);
            break;
        }
    }
}

// ---- cases ----------------------------------------------------------------------------------

struct tcase {
    const char *name;
    enum qc_attn_impl impl;
    bool bip, pos, cat, training;
    int64_t d;          /* FE inputs (pos); 0 needs cat */
    int64_t Q;          /* queries per base destination */
    bool qrow;          /* query_row given (Q > 1 or self-attention) */
    int64_t nb, Ns;     /* base destinations, sources (bipartite) */
    int64_t maxdeg;     /* degrees cycle 0, 1, 2..maxdeg; 0 = no edge at all */
    int64_t apps;       /* applications on one kv context (bipartite only when > 1) */
    int64_t tile_edges; /* FUSED: CPU tiles; CUDA tiles too when tile_cuda */
    bool tile_cuda;     /* CUDA: tile_edges_cuda = tile_edges (else the default) */
};

#define U QC_ATTN_UNFUSED
#define F QC_ATTN_FUSED
static const struct tcase cases[] = {
    {"fused, bipartite, FE(3), dropout, several tiles", F, true, true, false, true, 3, 1, false, 30,
     20, 7, 1, 12, true},
    {"fused, self, FE(2) + edge types, dropout", F, false, true, true, true, 2, 1, true, 26, 0, 6,
     1, 9, true},
    {"fused, bipartite, no positional input, dropout", F, true, false, false, true, 0, 1, false, 24,
     17, 6, 1, 10, true},
    {"fused, Q=3 with query_row, FE(3) + edge types, 2 applications", F, true, true, true, true, 3,
     3, true, 14, 19, 6, 2, 11, true},
    {"fused, Q=2 without query_row, FE(2), no dropout", F, true, true, false, false, 2, 2, false,
     15, 12, 5, 1, 7, false},
    {"fused, FE(0) + categorical table only", F, true, true, true, true, 0, 1, false, 16, 11, 5, 1,
     8, true},
    {"fused, no edge at all, Q=2", F, true, true, false, true, 3, 2, true, 9, 6, 0, 1, 4, true},
    {"unfused, bipartite, FE(3), dropout", U, true, true, false, true, 3, 1, false, 30, 20, 7, 1,
     12, false},
    {"unfused, self, FE(2) + edge types, dropout", U, false, true, true, true, 2, 1, true, 26, 0, 6,
     1, 9, false},
    {"unfused, bipartite, no positional input, dropout", U, true, false, false, true, 0, 1, false,
     24, 17, 6, 1, 10, false},
    {"unfused, Q=3 with query_row, FE(3) + edge types, 2 applications", U, true, true, true, true,
     3, 3, true, 14, 19, 6, 2, 11, false},
    {"unfused, Q=2 without query_row, FE(2), no dropout", U, true, true, false, false, 2, 2, false,
     15, 12, 5, 1, 7, false},
    {"unfused, FE(0) + categorical table only", U, true, true, true, true, 0, 1, false, 16, 11, 5,
     1, 8, false},
    {"unfused, no edge at all, Q=2", U, true, true, false, true, 3, 2, true, 9, 6, 0, 1, 4, false},
};
#undef U
#undef F

/* One case's host data (shared by both runs). */
struct hcase {
    const struct tcase *tc;
    int64_t D, Nd, Ns, nb, Q, E, ncat;
    int64_t *row_ptr, *src, *qrow, *cat_idx;
    struct qc_attn l; /* parameter table and offsets (bound per run) */
    struct qc_fourier fe;
    float *w, *few, *feat, *cat_table, *xs, *xd, *dout[MAX_APPS];
    struct qc_attn_ctx ctx[MAX_APPS];
};

static void hcase_make(struct hcase *h, const struct tcase *tc)
{
    memset(h, 0, sizeof *h);
    h->tc = tc;
    h->D = D_TEST;
    h->nb = tc->nb;
    h->Q = tc->Q;
    h->Nd = tc->nb * tc->Q + (tc->Q > 1 ? 3 : 0);
    h->Ns = tc->bip ? tc->Ns : h->Nd;
    h->row_ptr = xcalloc((size_t)h->nb + 1, sizeof(int64_t));
    for (int64_t b = 0; b < h->nb; b++) {
        int64_t deg = tc->maxdeg == 0 ? 0
                      : b % 4 == 0    ? 0
                      : b % 4 == 1    ? 1
                                      : 2 + (int64_t)(urand() * (double)(tc->maxdeg - 1));
        h->row_ptr[b + 1] = h->row_ptr[b] + deg;
    }
    h->E = h->row_ptr[h->nb];
    h->src = xcalloc((size_t)h->E, sizeof(int64_t));
    for (int64_t e = 0; e < h->E; e++)
        h->src[e] = (int64_t)(urand() * (double)h->Ns);
    if (tc->qrow) { /* a random permutation of x_dst rows; queries take the first nb*Q */
        h->qrow = xcalloc((size_t)h->Nd, sizeof(int64_t));
        for (int64_t i = 0; i < h->Nd; i++)
            h->qrow[i] = i;
        for (int64_t i = h->Nd - 1; i > 0; i--) {
            int64_t j = (int64_t)(urand() * (double)(i + 1)), t = h->qrow[i];
            h->qrow[i] = h->qrow[j];
            h->qrow[j] = t;
        }
    }
    qc_attn_init(&h->l, h->D, H_TEST, tc->bip, tc->pos);
    h->w = fnew(h->l.params.numel);
    param_fill(&h->l.params, h->w);
    if (tc->pos) {
        qc_fourier_init(&h->fe, tc->d, F_TEST, h->D);
        h->few = fnew(h->fe.params.numel);
        param_fill(&h->fe.params, h->few);
        h->feat = fnew(h->E * tc->d);
        fill(h->feat, h->E * tc->d, -2.0f, 2.0f);
        if (tc->cat) {
            h->ncat = 3;
            h->cat_table = fnew(h->ncat * h->D);
            fill(h->cat_table, h->ncat * h->D, -0.5f, 0.5f);
            h->cat_idx = xcalloc((size_t)h->E, sizeof(int64_t));
            for (int64_t e = 0; e < h->E; e++)
                h->cat_idx[e] = (int64_t)(urand() * (double)h->ncat);
        }
    }
    h->xd = fnew(h->Nd * h->D);
    fill(h->xd, h->Nd * h->D, -1.5f, 1.5f);
    h->xs = tc->bip ? fnew(h->Ns * h->D) : h->xd;
    if (tc->bip)
        fill(h->xs, h->Ns * h->D, -1.5f, 1.5f);
    for (int64_t a = 0; a < tc->apps; a++) {
        h->dout[a] = fnew(h->Nd * h->D);
        fill(h->dout[a], h->Nd * h->D, -1.0f, 1.0f);
        h->ctx[a] = (struct qc_attn_ctx){tc->training,         0.25f, 0x1234abcdull, 7,
                                         40 + 2 * (uint32_t)a, NULL,  NULL};
    }
}

static void hcase_free(struct hcase *h)
{
    free(h->row_ptr);
    free(h->src);
    free(h->qrow);
    free(h->cat_idx);
    free(h->w);
    free(h->few);
    free(h->feat);
    free(h->cat_table);
    if (h->xs != h->xd)
        free(h->xs);
    free(h->xd);
    for (int a = 0; a < MAX_APPS; a++)
        free(h->dout[a]);
}

// ---- backends: tests/device_testlib.h ---------------------------------------------------

// ---- one run --------------------------------------------------------------------------------

#define MAX_BUFS 64

/* Host copies of everything a run produces. */
struct result {
    float *out[MAX_APPS], *dxd[MAX_APPS], *dxs, *dw, *fedw, *dcat;
    /* stash arenas, entry by entry (contiguous payloads, no padding) */
    unsigned char *st_ed, *st_fe, *st_kv, *st_app[MAX_APPS];
    struct qc_stash plan_ed, plan_fe, plan_kv, plan_app[MAX_APPS]; /* tables (unbound) */
};

/* The device side of a run: memory-context allocations, freed together at the end. */
struct dmem {
    const struct qc_test_backend *b;
    int n;
    void *p[MAX_BUFS];
    size_t bytes[MAX_BUFS];
};

/* bytes of backend memory holding host (NULL: zeros; fill: 0xFF bytes). */
static void *dput(struct dmem *m, const void *host, size_t bytes, bool poison)
{
    if (m->n == MAX_BUFS)
        T_FATAL("too many test buffers");
    void *p = qc_memctx_alloc(m->b->mc, QC_MEM_MODEL, bytes ? bytes : 1, "test/input");
    if (!p)
        T_FATAL("backend allocation of %zu bytes failed", bytes);
    m->p[m->n] = p;
    m->bytes[m->n++] = bytes ? bytes : 1;
    if (bytes == 0)
        return p;
    if (host) {
        if (qc_op_upload(qc_test_backend_exec(m->b), p, host, bytes) != QC_OK)
            T_FATAL("upload: %s", qc_error_last());
    } else if (poison) {
        unsigned char *ff = malloc(bytes);
        if (!ff)
            T_FATAL("out of host memory");
        memset(ff, 0xFF, bytes);
        if (qc_op_upload(qc_test_backend_exec(m->b), p, ff, bytes) != QC_OK)
            T_FATAL("upload: %s", qc_error_last());
        if (qc_op_sync(qc_test_backend_exec(m->b)) != QC_OK)
            T_FATAL("sync: %s", qc_error_last());
        free(ff);
    } else {
        qc_op_zero(qc_test_backend_exec(m->b), p, bytes);
    }
    return p;
}

static void dmem_free(struct dmem *m)
{
    for (int i = m->n - 1; i >= 0; i--)
        qc_memctx_free(m->b->mc, QC_MEM_MODEL, m->p[i], m->bytes[i]);
    m->n = 0;
}

static float *fget(const struct qc_test_backend *b, const float *dev, int64_t n)
{
    float *h = fnew(n);
    if (n > 0 &&
        qc_op_download(qc_test_backend_exec(b), h, dev, (size_t)n * sizeof(float)) != QC_OK)
        T_FATAL("download: %s", qc_error_last());
    return h;
}

/* Binds st to fresh (poisoned: 0xFF) backend memory, unless it is empty. */
static void stash_bind(struct dmem *m, struct qc_stash *st)
{
    if (st->n > 0)
        qc_stash_bind(st, dput(m, NULL, qc_stash_arena_bytes(st), true));
}

/* The entries' payloads, downloaded one after another; plan keeps the table. */
static unsigned char *stash_get(const struct qc_test_backend *b, const struct qc_stash *st,
                                struct qc_stash *plan)
{
    *plan = *st;
    plan->arena = NULL;
    plan->owned = false;
    unsigned char *h = xcalloc(qc_stash_bytes(st), 1), *p = h;
    for (int i = 0; i < st->n; i++) {
        plan->e[i].data = NULL;
        if (st->e[i].bytes > 0 &&
            qc_op_download(qc_test_backend_exec(b), p, st->e[i].data, st->e[i].bytes) != QC_OK)
            T_FATAL("download: %s", qc_error_last());
        p += st->e[i].bytes;
    }
    return h;
}

static void run(const struct hcase *h, const struct qc_test_backend *b, struct result *r)
{
    const struct tcase *tc = h->tc;
    const int64_t D = h->D, Nd = h->Nd, Ns = h->Ns, E = h->E;
    const bool dev = b->kind != QC_EXEC_CPU;
    memset(r, 0, sizeof *r);
    struct dmem m = {b, 0, {0}, {0}};
#define FB(n) ((size_t)((n) > 0 ? (n) : 0) * sizeof(float))
#define IB(n) ((size_t)((n) > 0 ? (n) : 0) * sizeof(int64_t))
    /* graph: device arrays with host mirrors (the CPU run passes host arrays, no mirrors) */
    struct qc_attn_graph g = {Ns, Nd, h->nb, h->Q, E, NULL, NULL, NULL, NULL, NULL, NULL};
    g.row_ptr = dput(&m, h->row_ptr, IB(h->nb + 1), false);
    g.src = dput(&m, h->src, IB(E), false);
    g.query_row = h->qrow ? dput(&m, h->qrow, IB(h->nb * h->Q), false) : NULL;
    if (dev) {
        g.row_ptr_host = h->row_ptr;
        g.src_host = h->src;
        g.query_row_host = h->qrow;
    }
    /* blocks, parameters, inputs */
    struct qc_attn l = h->l;
    qc_block_mem_set(&l.mem, b->mc, "test.attn");
    l.mem.ex = qc_test_backend_exec(b);
    l.tile_edges = tc->tile_edges;
    if (tc->tile_cuda)
        l.tile_edges_cuda = tc->tile_edges;
    const int64_t np = l.params.numel;
    qc_attn_bind(&l, dput(&m, h->w, FB(np), false), dput(&m, NULL, FB(np), false));
    struct qc_fourier fe = h->fe;
    const float *feat = NULL, *cat_table = NULL;
    const int64_t *cat_idx = NULL;
    float *dcat = NULL;
    if (tc->pos) {
        qc_block_mem_set(&fe.mem, b->mc, "test.fe");
        fe.mem.ex = qc_test_backend_exec(b);
        const int64_t nf = fe.params.numel;
        qc_fourier_bind(&fe, dput(&m, h->few, FB(nf), false), dput(&m, NULL, FB(nf), false));
        feat = tc->d > 0 ? dput(&m, h->feat, FB(E * tc->d), false) : NULL;
        if (tc->cat) {
            cat_table = dput(&m, h->cat_table, FB(h->ncat * D), false);
            cat_idx = dput(&m, h->cat_idx, IB(E), false);
            dcat = dput(&m, NULL, FB(h->ncat * D), false);
        }
    }
    const float *xd = dput(&m, h->xd, FB(Nd * D), false);
    const float *xs = tc->bip ? dput(&m, h->xs, FB(Ns * D), false) : xd;
    float *out[MAX_APPS] = {NULL}, *dxd[MAX_APPS] = {NULL}, *dxs = NULL;
    const float *dout[MAX_APPS] = {NULL};
    for (int64_t a = 0; a < tc->apps; a++) {
        out[a] = dput(&m, NULL, FB(Nd * D), true);
        dxd[a] = dput(&m, NULL, FB(Nd * D), true);
        dout[a] = dput(&m, h->dout[a], FB(Nd * D), false);
    }
    dxs = tc->bip ? dput(&m, NULL, FB(Ns * D), true) : dxd[0];

    /* forward: edges, kv, applications; backward in reverse */
    struct qc_block_mem emem;
    memset(&emem, 0, sizeof emem);
    qc_block_mem_set(&emem, b->mc, "edges.test");
    emem.ex = qc_test_backend_exec(b);
    struct qc_attn_edges ed;
    if (qc_attn_edges_init_mem(&ed, &emem, tc->impl, &g, tc->pos ? &fe : NULL, feat, cat_table,
                               cat_idx, h->ncat, dcat) != QC_OK)
        T_FATAL("edges_init: %s", qc_error_last());
    stash_bind(&m, &ed.fe_stash);
    stash_bind(&m, &ed.stash);
    T_EXPECT(qc_attn_edges_forward(&ed) == QC_OK, "%s", qc_error_last());
    struct qc_attn_kv kv;
    qc_attn_kv_init(&kv, &l, &ed);
    stash_bind(&m, &kv.stash);
    T_EXPECT(qc_attn_kv_forward(&kv, xs) == QC_OK, "%s", qc_error_last());
    struct qc_stash app[MAX_APPS];
    for (int64_t a = 0; a < tc->apps; a++) {
        qc_stash_init(&app[a], tc->impl == QC_ATTN_FUSED ? "attn_fused.app" : "attn_unfused.app");
        qc_attn_stash_plan(&kv, &app[a]);
        stash_bind(&m, &app[a]);
        T_EXPECT(qc_attn_forward(&kv, out[a], &app[a], xd, &h->ctx[a]) == QC_OK, "%s",
                 qc_error_last());
    }
    for (int64_t a = tc->apps - 1; a >= 0; a--)
        T_EXPECT(qc_attn_backward(&kv, dxd[a], dout[a], &app[a], xd, &h->ctx[a]) == QC_OK, "%s",
                 qc_error_last());
    /* self-attention: the source path adds into the same input gradient */
    T_EXPECT(qc_attn_kv_backward(&kv, dxs, xs, !tc->bip) == QC_OK, "%s", qc_error_last());
    r->st_ed = stash_get(b, &ed.stash, &r->plan_ed);
    r->st_fe = stash_get(b, &ed.fe_stash, &r->plan_fe);
    r->st_kv = stash_get(b, &kv.stash, &r->plan_kv);
    for (int64_t a = 0; a < tc->apps; a++)
        r->st_app[a] = stash_get(b, &app[a], &r->plan_app[a]);
    T_EXPECT(qc_attn_edges_backward(&ed) == QC_OK, "%s", qc_error_last());

    for (int64_t a = 0; a < tc->apps; a++) {
        r->out[a] = fget(b, out[a], Nd * D);
        r->dxd[a] = fget(b, dxd[a], Nd * D);
    }
    r->dxs = tc->bip ? fget(b, dxs, Ns * D) : NULL;
    r->dw = fget(b, l.dw, np);
    r->fedw = tc->pos ? fget(b, fe.dw, fe.params.numel) : NULL;
    r->dcat = dcat ? fget(b, dcat, h->ncat * D) : NULL;
    if (qc_op_sync(qc_test_backend_exec(b)) != QC_OK)
        T_FATAL("sync: %s", qc_error_last());

    for (int64_t a = tc->apps - 1; a >= 0; a--)
        qc_stash_deinit(&app[a]);
    qc_attn_kv_deinit(&kv);
    qc_attn_edges_deinit(&ed);
    dmem_free(&m);
#undef FB
#undef IB
}

static void result_free(struct result *r)
{
    for (int a = 0; a < MAX_APPS; a++) {
        free(r->out[a]);
        free(r->dxd[a]);
        free(r->st_app[a]);
    }
    free(r->dxs);
    free(r->dw);
    free(r->fedw);
    free(r->dcat);
    free(r->st_ed);
    free(r->st_fe);
    free(r->st_kv);
}

// ---- comparisons ----------------------------------------------------------------------------

struct tol {
    double rtol, atol;
};

static const struct tol TOL_ACT = {1e-4, 1e-5};
static const struct tol TOL_PARAM = {1e-3, 1e-4};

/* got vs ref: bit for bit when t is NULL, else within t (NaN/Inf must agree). */
static void expect_f32(const char *what, const float *got, const float *ref, int64_t n,
                       const struct tol *t)
{
    if (n <= 0)
        return;
    if (!t) {
        if (memcmp(got, ref, (size_t)n * sizeof(float)) == 0)
            return;
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t gb, rb;
            memcpy(&gb, &got[i], sizeof gb);
            memcpy(&rb, &ref[i], sizeof rb);
            if (gb != rb && bad++ < MAX_SHOWN)
                printf("    %s[%" PRId64 "]: %.9g (0x%08" PRIx32 ") vs %.9g (0x%08" PRIx32 ")\n",
                       what, i, (double)got[i], gb, (double)ref[i], rb);
        }
        T_EXPECT(bad == 0, "%s: %" PRId64 " of %" PRId64 " elements differ in bits", what, bad, n);
        return;
    }
    double maxref = 1.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs((double)ref[i]) > maxref)
            maxref = fabs((double)ref[i]);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = (double)got[i], r = (double)ref[i];
        bool ok = (!isfinite(r) || !isfinite(g))
                      ? ((isnan(r) && isnan(g)) || g == r)
                      : fabs(g - r) <= t->rtol * fabs(r) + t->atol * maxref;
        if (!ok && bad++ < MAX_SHOWN)
            printf("    %s[%" PRId64 "]: got %.9g, want %.9g (max|ref| %.3g)\n", what, i, g, r,
                   maxref);
    }
    T_EXPECT(bad == 0, "%s: %" PRId64 " of %" PRId64 " elements outside tolerance", what, bad, n);
}

/* Byte offset of the entry named name in the packed download of plan, or -1. */
static int64_t stash_offset(const struct qc_stash *plan, const char *name, size_t *bytes)
{
    size_t off = 0;
    for (int i = 0; i < plan->n; i++) {
        if (strcmp(plan->e[i].name, name) == 0) {
            *bytes = plan->e[i].bytes;
            return (int64_t)off;
        }
        off += plan->e[i].bytes;
    }
    return -1;
}

/* Every entry of the reference's stash against the entry of the same name on the backend (all
 * entries are f32). An entry the backend does not keep fails, except the shared edge embeddings
 * "r" of a fused edge set where the backend's op computes r per tile instead of taking it
 * (qc_attn_fused_takes_r false: CUDA); the backend may keep no entry the reference lacks. */
static void expect_stash(const char *what, const struct qc_stash *ref_plan,
                         const struct qc_stash *got_plan, const unsigned char *got,
                         const unsigned char *ref, const struct tol *t, bool may_lack_r)
{
    size_t off = 0;
    for (int i = 0; i < ref_plan->n; i++) {
        const struct qc_stash_entry *e = &ref_plan->e[i];
        char name[128];
        snprintf(name, sizeof name, "%s.%s", what, e->name);
        T_EXPECT(e->dtype == QC_STASH_F32, "%s: not f32", name);
        size_t gbytes = 0;
        const int64_t goff = stash_offset(got_plan, e->name, &gbytes);
        if (goff < 0) {
            T_EXPECT(may_lack_r && strcmp(e->name, "r") == 0, "%s: not kept on the backend", name);
        } else {
            T_EXPECT_EQ_U64(gbytes, e->bytes, "%s: bytes", name);
            if (gbytes == e->bytes)
                expect_f32(name, (const float *)(const void *)(got + goff),
                           (const float *)(const void *)(ref + off),
                           (int64_t)(e->bytes / sizeof(float)), t);
        }
        off += e->bytes;
    }
    for (int i = 0; i < got_plan->n; i++) {
        size_t rbytes = 0;
        T_EXPECT(stash_offset(ref_plan, got_plan->e[i].name, &rbytes) >= 0,
                 "%s.%s: kept on the backend, not by the reference", what, got_plan->e[i].name);
    }
}

static void compare(const struct hcase *h, const struct result *got, const struct result *ref,
                    const struct qc_exec *got_ex, bool bits)
{
    const struct tcase *tc = h->tc;
    const int64_t D = h->D;
    const struct tol *ta = bits ? NULL : &TOL_ACT, *tp = bits ? NULL : &TOL_PARAM;
    /* CUDA's fused tiles compute r themselves (qc_attn_fused_takes_r): no shared r there */
    const bool lack_r = tc->impl == QC_ATTN_FUSED && !qc_attn_fused_takes_r(got_ex);
    expect_stash("edges", &ref->plan_ed, &got->plan_ed, got->st_ed, ref->st_ed, ta, lack_r);
    expect_stash("edges.fe", &ref->plan_fe, &got->plan_fe, got->st_fe, ref->st_fe, ta, false);
    expect_stash("kv", &ref->plan_kv, &got->plan_kv, got->st_kv, ref->st_kv, ta, false);
    for (int64_t a = 0; a < tc->apps; a++) {
        char name[32];
        snprintf(name, sizeof name, "app%d", (int)a);
        expect_stash(name, &ref->plan_app[a], &got->plan_app[a], got->st_app[a], ref->st_app[a], ta,
                     false);
        snprintf(name, sizeof name, "out%d", (int)a);
        expect_f32(name, got->out[a], ref->out[a], h->Nd * D, ta);
        snprintf(name, sizeof name, "dx_dst%d", (int)a);
        expect_f32(name, got->dxd[a], ref->dxd[a], h->Nd * D, ta);
    }
    if (tc->bip)
        expect_f32("dx_src", got->dxs, ref->dxs, h->Ns * D, ta);
    expect_f32("layer.dw", got->dw, ref->dw, h->l.params.numel, tp);
    if (tc->pos)
        expect_f32("fe.dw", got->fedw, ref->fedw, h->fe.params.numel, tp);
    if (ref->dcat)
        expect_f32("dcat_table", got->dcat, ref->dcat, h->ncat * D, tp);
    /* the check has teeth: the gradients are not all zero */
    double s = 0.0;
    for (int64_t i = 0; i < h->l.params.numel; i++)
        s += fabs((double)ref->dw[i]);
    T_EXPECT(s > 0.0 && isfinite(s), "reference layer gradient |dw|₁ = %g", s);
}

static void test_case(const struct tcase *tc, const struct qc_test_backend *cpu,
                      const struct qc_test_backend *b)
{
    struct hcase h;
    hcase_make(&h, tc);
    struct result ref, got;
    const size_t live0 = b->emu ? qc_emu_bytes_live(b->emu) : 0;
    run(&h, cpu, &ref);
    run(&h, b, &got);
    if (b->emu)
        T_EXPECT_EQ_U64(qc_emu_bytes_live(b->emu), live0, "arena bytes held after the case");
    compare(&h, &got, &ref, qc_test_backend_exec(b), b->kind == QC_EXEC_EMU);
    result_free(&ref);
    result_free(&got);
    hcase_free(&h);
}

int main(int argc, char **argv)
{
    const bool cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    g_rng = qc_test_seed();
    struct qc_test_backend cpu, dev;
    qc_test_backend_cpu(&cpu);
    if (cuda) {
        const int rc = qc_test_backend_cuda(&dev);
        if (rc != 0) {
            qc_test_backend_destroy(&dev);
            return rc;
        }
    } else if (!qc_test_backend_emu(&dev, (size_t)1 << 32)) {
        return 1;
    }
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < ncases; i++) {
        char name[192];
        snprintf(name, sizeof name, "attn on %s %s cpu: %s", qc_exec_backend_str(dev.kind),
                 cuda ? "~" : "==", cases[i].name);
        QC_TEST (name) {
            test_case(&cases[i], &cpu, &dev);
        }
    }
    qc_test_backend_destroy(&dev);
    return qc_test_summary();
}
