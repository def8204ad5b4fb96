/*
 * test_blocks_device.c — FourierEmbedding and MLPLayer on the device backends of qc_exec.h.
 *
 *   test_blocks_device            CPU vs EMU (the emulated device, qc_emu.h): every block input
 *                                 lives in the protected arena and is uploaded with qc_op_upload,
 *                                 the blocks' scratch comes from a memory context over the arena,
 * and the outputs, input gradients, parameter gradients (accumulated onto non-zero values) and
 * every stash entry must be memcmp-identical to the CPU run. A host dereference of device memory
 * anywhere in the blocks faults; the arena must be empty after every case. test_blocks_device cuda
 * CUDA vs CPU (label gpu): the same cases on a CUDA device (memory from qc_alloc, ops through this
 * thread's qc_kernels_cuda context, TF32 off), compared within TOL_CUDA below. Exits 77 without a
 * GPU or in a CPU-only build.
 *
 * Cases: FE(d) for d = 0..4, with and without the categorical input (FE(0) needs it), with and
 * without dc; MLP with O = 1, 12 and 40, with and without dx. Output buffers start as 0xFF bytes
 * (NaN) on every backend, so an OVERWRITE output that is not fully written shows up.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_testlib.h"
#include "testutil.h"

#include "qc_emu.h"
#include "qc_exec.h"
#include "qc_fourier.h"
#include "qc_mlp.h"
#include "qc_stash.h"

#ifdef QC_HAVE_CUDA
#    include "qc_alloc.h"
#    include "qc_device.h"
#    include "qc_kernels_cuda.h"
#endif

/* CUDA vs CPU: max |cuda − cpu| over a tensor <= TOL_CUDA · max(max |cpu|, 1e-3). Why: cuBLAS
 * fp32 GEMMs (TF32 off) sum in another order, cosf/sinf differ from glibc by a few ulp and the
 * column reductions (bias, LayerNorm and Fourier parameter gradients) use a fixed two-level
 * order with double accumulators: observed errors are ~1e-6 of a tensor's scale; the LayerNorm
 * backward's cancellation and the θ = c·W·2·π_f phase (|θ| up to ~20) can amplify a few ulp of
 * an input, so the bound keeps a 100x margin. */
#define TOL_CUDA 1e-4

// ---- backends: tests/device_testlib.h ---------------------------------------------------

/* Backend memory of bytes holding host (bytes), or 0xFF bytes when host is NULL. */
static void *dev_new(struct qc_test_backend *b, const void *host, size_t bytes, const char *tag)
{
    void *p = qc_memctx_alloc(b->mc, QC_MEM_MODEL, bytes ? bytes : 1, tag);
    if (!p)
        T_FATAL("%s: allocation of %zu bytes for %s", b->name, bytes, tag);
    void *nan = NULL;
    if (!host) {
        nan = malloc(bytes ? bytes : 1);
        if (!nan)
            T_FATAL("out of memory");
        memset(nan, 0xFF, bytes);
        host = nan;
    }
    if (qc_op_upload(&b->ex, p, host, bytes) != QC_OK)
        T_FATAL("%s: upload of %s: %s", b->name, tag, qc_error_last());
    free(nan);
    return p;
}

static void dev_free(struct qc_test_backend *b, void *p, size_t bytes)
{
    if (p)
        qc_memctx_free(b->mc, QC_MEM_MODEL, p, bytes ? bytes : 1);
}

/* A fresh host copy of n floats of backend memory p (NULL when p is). */
static float *dev_get(struct qc_test_backend *b, const void *p, int64_t n)
{
    if (!p)
        return NULL;
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    if (!h)
        T_FATAL("out of memory");
    if (qc_op_download(&b->ex, h, p, (size_t)n * sizeof *h) != QC_OK)
        T_FATAL("%s: download: %s", b->name, qc_error_last());
    return h;
}

// ---- inputs -----------------------------------------------------------------------------------

static float frand(uint64_t *s, float lo, float hi)
{
    double u = (double)(qc_test_rand(s) >> 11) * 0x1.0p-53;
    return (float)((double)lo + ((double)hi - (double)lo) * u);
}

static float *host_rand(uint64_t *s, int64_t n, float lo, float hi)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    if (!x)
        T_FATAL("out of memory");
    for (int64_t i = 0; i < n; i++)
        x[i] = frand(s, lo, hi);
    return x;
}

/* Parameters away from QCNet's initial values (LayerNorm weight 1 and zero biases hide bugs). */
static float *host_params(uint64_t *s, const struct qc_param_table *t)
{
    float *w = host_rand(s, t->numel, -0.5f, 0.5f);
    for (int i = 0; i < t->n; i++) {
        const struct qc_param_spec *p = &t->p[i];
        float *x = w + p->offset;
        if (p->init == QC_INIT_LINEAR_W) {
            float a = (float)sqrt(6.0 / (double)(p->ne[0] + p->ne[1]));
            for (int64_t j = 0; j < p->numel; j++)
                x[j] = frand(s, -a, a);
        } else if (p->init == QC_INIT_ONE) {
            for (int64_t j = 0; j < p->numel; j++)
                x[j] = frand(s, 0.7f, 1.3f);
        }
    }
    return w;
}

// ---- results ----------------------------------------------------------------------------------

#define RES_MAX 6

/* Host copies of what one run produced: named float tensors. */
struct result {
    int n;
    const char *name[RES_MAX];
    float *x[RES_MAX];
    int64_t numel[RES_MAX];
};

static void result_add(struct result *r, const char *name, float *x, int64_t numel)
{
    if (!x)
        return;
    if (r->n == RES_MAX)
        T_FATAL("result table full");
    r->name[r->n] = name;
    r->x[r->n] = x;
    r->numel[r->n] = numel;
    r->n++;
}

/* Every entry of a (float-only) stash, concatenated. */
static float *stash_get(struct qc_test_backend *b, const struct qc_stash *st, int64_t *numel)
{
    int64_t n = 0;
    for (int i = 0; i < st->n; i++)
        n += (int64_t)(st->e[i].bytes / sizeof(float));
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    if (!h)
        T_FATAL("out of memory");
    int64_t o = 0;
    for (int i = 0; i < st->n; i++) {
        if (qc_op_download(&b->ex, h + o, qc_stash_f32(st, i), st->e[i].bytes) != QC_OK)
            T_FATAL("%s: stash download: %s", b->name, qc_error_last());
        o += (int64_t)(st->e[i].bytes / sizeof(float));
    }
    *numel = n;
    return h;
}

static void result_free(struct result *r)
{
    for (int i = 0; i < r->n; i++)
        free(r->x[i]);
    memset(r, 0, sizeof *r);
}

/* Bit-identical, tensor by tensor. */
static void expect_identical(const struct result *a, const struct result *ref, const char *what)
{
    T_EXPECT_EQ_I64(a->n, ref->n, "%s: tensors", what);
    for (int i = 0; i < a->n && i < ref->n; i++) {
        if (memcmp(a->x[i], ref->x[i], (size_t)ref->numel[i] * sizeof(float)) == 0)
            continue;
        int64_t j = 0;
        while (memcmp(&a->x[i][j], &ref->x[i][j], sizeof(float)) == 0)
            j++;
        T_FAIL_AT("%s: %s differs from cpu first at [%lld]: %.9g vs %.9g", what, ref->name[i],
                  (long long)j, (double)a->x[i][j], (double)ref->x[i][j]);
    }
}

/* Within TOL_CUDA of the tensor's scale (NaN anywhere fails). */
static void expect_close(const struct result *a, const struct result *ref, const char *what)
{
    T_EXPECT_EQ_I64(a->n, ref->n, "%s: tensors", what);
    for (int i = 0; i < a->n && i < ref->n; i++) {
        double scale = 1e-3, err = 0.0;
        int64_t worst = 0;
        bool nan = false;
        for (int64_t j = 0; j < ref->numel[i]; j++)
            scale = fmax(scale, fabs((double)ref->x[i][j]));
        for (int64_t j = 0; j < ref->numel[i]; j++) {
            double e = fabs((double)a->x[i][j] - (double)ref->x[i][j]);
            nan |= isnan(a->x[i][j]) || isnan(ref->x[i][j]);
            if (e > err) {
                err = e;
                worst = j;
            }
        }
        T_EXPECT(!nan && err <= TOL_CUDA * scale,
                 "%s: %s: max error %.3g at [%lld] (%.9g vs %.9g), scale %.3g%s", what,
                 ref->name[i], err, (long long)worst, (double)a->x[i][worst],
                 (double)ref->x[i][worst], scale, nan ? ", NaN" : "");
    }
}

// ---- FourierEmbedding -------------------------------------------------------------------------

struct fe_case {
    int64_t d;
    bool cat, dc, dcat;
    int64_t N, F, D;
};

/* One forward + backward of FE(c->d) on backend b from seed; host copies into r. */
static void fe_run(struct qc_test_backend *b, const struct fe_case *c, uint64_t seed,
                   struct result *r)
{
    const int64_t N = c->N, D = c->D, d = c->d;
    struct qc_fourier fe;
    qc_fourier_init(&fe, d, c->F, D);
    qc_block_mem_set(&fe.mem, b->mc, "fe");
    fe.mem.ex = &b->ex;
    const int64_t np = fe.params.numel;
    uint64_t s = seed;
    float *hw = host_params(&s, &fe.params);
    float *hdw = host_rand(&s, np, -1.0f, 1.0f); /* backward accumulates onto these */
    float *hc = host_rand(&s, N * d, -2.0f, 2.0f);
    float *hcat = host_rand(&s, N * D, -1.0f, 1.0f);
    float *hdout = host_rand(&s, N * D, -1.0f, 1.0f);
    const size_t fb = sizeof(float);

    float *w = dev_new(b, hw, (size_t)np * fb, "w");
    float *dw = dev_new(b, hdw, (size_t)np * fb, "dw");
    float *cc = d > 0 ? dev_new(b, hc, (size_t)(N * d) * fb, "c") : NULL;
    float *cat = c->cat ? dev_new(b, hcat, (size_t)(N * D) * fb, "cat") : NULL;
    float *dout = dev_new(b, hdout, (size_t)(N * D) * fb, "dout");
    float *out = dev_new(b, NULL, (size_t)(N * D) * fb, "out");
    float *dc = c->dc ? dev_new(b, NULL, (size_t)(N * d) * fb, "dc") : NULL;
    float *dcat = c->dcat ? dev_new(b, NULL, (size_t)(N * D) * fb, "dcat") : NULL;
    qc_fourier_bind(&fe, w, dw);
    struct qc_stash st;
    qc_stash_init(&st, "fe");
    qc_fourier_stash_plan(&fe, N, &st);
    void *arena = dev_new(b, NULL, qc_stash_arena_bytes(&st), "stash");
    qc_stash_bind(&st, arena);

    T_EXPECT(qc_fourier_forward(&fe, out, &st, cc, cat, N) == QC_OK, "%s: FE forward: %s", b->name,
             qc_error_last());
    T_EXPECT(qc_fourier_backward(&fe, dc, dcat, dout, &st, cc, N) == QC_OK, "%s: FE backward: %s",
             b->name, qc_error_last());

    memset(r, 0, sizeof *r);
    result_add(r, "out", dev_get(b, out, N * D), N * D);
    result_add(r, "dc", dev_get(b, dc, N * d), N * d);
    result_add(r, "dcat", dev_get(b, dcat, N * D), N * D);
    result_add(r, "dw", dev_get(b, dw, np), np);
    int64_t ns = 0;
    float *hs = stash_get(b, &st, &ns);
    result_add(r, "stash", hs, ns);

    qc_stash_release(&st);
    dev_free(b, arena, qc_stash_arena_bytes(&st));
    qc_stash_deinit(&st);
    dev_free(b, dcat, (size_t)(N * D) * fb);
    dev_free(b, dc, (size_t)(N * d) * fb);
    dev_free(b, out, (size_t)(N * D) * fb);
    dev_free(b, dout, (size_t)(N * D) * fb);
    dev_free(b, cat, (size_t)(N * D) * fb);
    dev_free(b, cc, (size_t)(N * d) * fb);
    dev_free(b, dw, (size_t)np * fb);
    dev_free(b, w, (size_t)np * fb);
    free(hw);
    free(hdw);
    free(hc);
    free(hcat);
    free(hdout);
}

// ---- MLPLayer ---------------------------------------------------------------------------------

struct mlp_case {
    int64_t D, O, N;
    bool dx;
};

static void mlp_run(struct qc_test_backend *b, const struct mlp_case *c, uint64_t seed,
                    struct result *r)
{
    const int64_t N = c->N, D = c->D, O = c->O;
    struct qc_mlp m;
    qc_mlp_init(&m, D, O);
    qc_block_mem_set(&m.mem, b->mc, "mlp");
    m.mem.ex = &b->ex;
    const int64_t np = m.params.numel;
    uint64_t s = seed;
    float *hw = host_params(&s, &m.params);
    float *hdw = host_rand(&s, np, -1.0f, 1.0f);
    float *hx = host_rand(&s, N * D, -2.0f, 2.0f);
    float *hdout = host_rand(&s, N * O, -1.0f, 1.0f);
    const size_t fb = sizeof(float);

    float *w = dev_new(b, hw, (size_t)np * fb, "w");
    float *dw = dev_new(b, hdw, (size_t)np * fb, "dw");
    float *x = dev_new(b, hx, (size_t)(N * D) * fb, "x");
    float *dout = dev_new(b, hdout, (size_t)(N * O) * fb, "dout");
    float *out = dev_new(b, NULL, (size_t)(N * O) * fb, "out");
    float *dx = c->dx ? dev_new(b, NULL, (size_t)(N * D) * fb, "dx") : NULL;
    qc_mlp_bind(&m, w, dw);
    struct qc_stash st;
    qc_stash_init(&st, "mlp");
    qc_mlp_stash_plan(&m, N, &st);
    void *arena = dev_new(b, NULL, qc_stash_arena_bytes(&st), "stash");
    qc_stash_bind(&st, arena);

    T_EXPECT(qc_mlp_forward(&m, out, &st, x, N) == QC_OK, "%s: MLP forward: %s", b->name,
             qc_error_last());
    T_EXPECT(qc_mlp_backward(&m, dx, dout, &st, x, N) == QC_OK, "%s: MLP backward: %s", b->name,
             qc_error_last());

    memset(r, 0, sizeof *r);
    result_add(r, "out", dev_get(b, out, N * O), N * O);
    result_add(r, "dx", dev_get(b, dx, N * D), N * D);
    result_add(r, "dw", dev_get(b, dw, np), np);
    int64_t ns = 0;
    float *hs = stash_get(b, &st, &ns);
    result_add(r, "stash", hs, ns);

    qc_stash_release(&st);
    dev_free(b, arena, qc_stash_arena_bytes(&st));
    qc_stash_deinit(&st);
    dev_free(b, dx, (size_t)(N * D) * fb);
    dev_free(b, out, (size_t)(N * O) * fb);
    dev_free(b, dout, (size_t)(N * O) * fb);
    dev_free(b, x, (size_t)(N * D) * fb);
    dev_free(b, dw, (size_t)np * fb);
    dev_free(b, w, (size_t)np * fb);
    free(hw);
    free(hdw);
    free(hx);
    free(hdout);
}

// ---- cases ------------------------------------------------------------------------------------

static const struct fe_case fe_cases[] = {
    /* d  cat    dc     dcat   N    F  D */
    {0, true, false, true, 37, 6, 24},      {1, false, true, false, 37, 6, 24},
    {1, true, true, true, 37, 6, 24},       {2, false, false, true, 37, 6, 24},
    {2, true, true, true, 37, 6, 24},       {3, false, true, true, 37, 6, 24},
    {3, true, true, false, 37, 6, 24},      {4, false, true, true, 37, 6, 24},
    {4, true, true, true, 37, 6, 24},       {4, true, true, true, 301, 8, 32},
    {2, false, false, false, 513, 64, 128}, /* y_emb's shape at D = 128 */
};

static const struct mlp_case mlp_cases[] = {
    /* D  O   N    dx */
    {24, 12, 37, true},
    {24, 1, 37, true},
    {32, 40, 301, false},
    {128, 120, 97, true},
};

#define NCASES(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Runs every case on b and compares with CPU: identical (EMU) or close (CUDA). */
static void run_all(struct qc_test_backend *b)
{
    struct qc_test_backend cpu;
    qc_test_backend_cpu(&cpu);
    const bool exact = b->ex.backend == QC_EXEC_EMU;
    const uint64_t seed = qc_test_seed();
    char name[160];
    for (int i = 0; i < NCASES(fe_cases); i++) {
        const struct fe_case *c = &fe_cases[i];
        snprintf(name, sizeof name,
                 "blocks %s: FE(%lld)%s forward + backward (dc %s, dcat %s), N %lld, F %lld, "
                 "D %lld",
                 b->name, (long long)c->d, c->cat ? "+cat" : "", c->dc ? "on" : "off",
                 c->dcat ? "on" : "off", (long long)c->N, (long long)c->F, (long long)c->D);
        QC_TEST (name) {
            struct result ref, got;
            fe_run(&cpu, c, seed + (uint64_t)i, &ref);
            fe_run(b, c, seed + (uint64_t)i, &got);
            if (exact)
                expect_identical(&got, &ref, name);
            else
                expect_close(&got, &ref, name);
            if (b->emu)
                T_EXPECT_EQ_U64(qc_emu_bytes_live(b->emu), 0, "arena bytes left after the case");
            result_free(&ref);
            result_free(&got);
        }
    }
    for (int i = 0; i < NCASES(mlp_cases); i++) {
        const struct mlp_case *c = &mlp_cases[i];
        snprintf(name, sizeof name,
                 "blocks %s: MLP forward + backward (dx %s), D %lld, O %lld, N %lld", b->name,
                 c->dx ? "on" : "off", (long long)c->D, (long long)c->O, (long long)c->N);
        QC_TEST (name) {
            struct result ref, got;
            mlp_run(&cpu, c, seed + 100 + (uint64_t)i, &ref);
            mlp_run(b, c, seed + 100 + (uint64_t)i, &got);
            if (exact)
                expect_identical(&got, &ref, name);
            else
                expect_close(&got, &ref, name);
            if (b->emu)
                T_EXPECT_EQ_U64(qc_emu_bytes_live(b->emu), 0, "arena bytes left after the case");
            result_free(&ref);
            result_free(&got);
        }
    }
    qc_test_backend_destroy(&cpu);
}

int main(int argc, char **argv)
{
    const bool cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    struct qc_test_backend b;
    if (cuda) {
        const int rc = qc_test_backend_cuda(&b);
        if (rc != 0) {
            qc_test_backend_destroy(&b);
            return rc;
        }
    } else if (!qc_test_backend_emu(&b, (size_t)1 << 30)) {
        return 1;
    }
    run_all(&b);
    qc_test_backend_destroy(&b);
    return qc_test_summary();
}
