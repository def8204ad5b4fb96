/*
 * test_kernels_cuda.c — every CUDA op (kernels/qc_kernels_cuda.h) against the CPU reference
 * (kernels/qc_kernels.h) on the same inputs: a case table {op, dims, atol, rtol, nmse, why}
 * with the main dimension 1, 7, 769 and one realistic AV2 size (batch of 4 scenes) per op,
 * fixed seed (QC_TEST_SEED).
 *
 * Each case: inputs random on the host and uploaded; every output starts from the same random
 * content on both backends (so an ACCUM output is checked as +=, and an OVERWRITE element the
 * CUDA op forgot to write mismatches); the CPU op runs on the host copies, the CUDA op runs
 * TWICE on the device copies. Pass when, for every output element,
 *     |gpu − ref| <= atol + rtol·|ref|,   nmse = Σ(gpu − ref)² / Σ ref² <= bound,
 * NaN/Inf agree, the two CUDA runs are bit-identical (determinism: no atomics), inputs are
 * unchanged on the device, and the 4 KiB byte-pattern guard bands before and after every device
 * buffer are intact. The first 10 mismatches of an output are printed.
 *
 * Device memory comes from the caching allocator (alloc/qc_alloc.h) on the CUDA device; the
 * kernels run on the device's compute stream. Without a CUDA device the test exits 77
 * (skipped). Build: part of ctest (label gpu); run: ./test_kernels_cuda [filter substring].
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_kernels.h"
#include "qc_kernels_cuda.h"
#include "qc_pinned.h"
#include "qc_status.h"
#include "cuda_probe.h"
#include "kernels_cuda_testlib.h"
#include "testutil.h"

#define GUARD     4096 /* bytes of byte pattern before and after every device buffer */
#define MAX_BUFS  32
#define C_MODEL   128 /* hidden width D */
#define H_MODEL   8   /* heads */
#define DH_MODEL  16  /* width per head */
#define MAX_SHOWN 10  /* mismatches printed per output */

// ---- buffers
// ----------------------------------------------------------------------------------------

enum tb_kind { TB_F32, TB_I64, TB_U8 };
enum tb_role { TB_IN, TB_OUT, TB_SCRATCH };

struct tbuf {
    const char *name;
    enum tb_kind kind;
    enum tb_role role;
    int64_t n;
    size_t bytes;
    void *h;      /* host: the input, or the CPU op's output (the reference) */
    void *init;   /* OUT: initial content, uploaded before each CUDA run */
    void *got[2]; /* OUT: the two CUDA runs' results */
    char *dbase;  /* device allocation: guard | data | guard */
    void *d;      /* device data */
};

struct tcase;

struct tctx {
    struct kt_gpu g; /* device, allocator, op context, stream */
    uint64_t rng;
    struct tbuf bufs[MAX_BUFS];
    int nbufs;
    unsigned char pattern[GUARD];
    const struct tcase *tc;
    int bad; /* failures in the current case */
};

/* One row of the case table. n is the op's main dimension (rows, edges, agents, elements);
 * d1, d2 are secondary dims where the op has them (documented per runner). */
struct tcase {
    const char *op;
    void (*run)(struct tctx *x, const struct tcase *tc);
    int64_t n, d1, d2;
    double atol, rtol, nmse;
    const char *why;
};

/* Every copy runs on the compute stream the kernels use (a non-blocking stream: a plain
 * cudaMemcpy on the legacy stream would not be ordered with it) and is waited for. */
static cudaStream_t g_stream;

static void copy_sync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                      const char *what)
{
    if (bytes == 0)
        return;
    kt_cuda_ok(cudaMemcpyAsync(dst, src, bytes, kind, g_stream), what);
    kt_cuda_ok(cudaStreamSynchronize(g_stream), what);
}

static size_t kind_size(enum tb_kind k)
{
    return k == TB_F32 ? sizeof(float) : k == TB_I64 ? sizeof(int64_t) : 1;
}

static struct tbuf *tb_new(struct tctx *x, const char *name, enum tb_kind kind, enum tb_role role,
                           int64_t n)
{
    if (x->nbufs >= MAX_BUFS)
        T_FATAL("too many buffers in one case");
    struct tbuf *b = &x->bufs[x->nbufs++];
    memset(b, 0, sizeof(*b));
    b->name = name;
    b->kind = kind;
    b->role = role;
    b->n = n;
    b->bytes = (size_t)(n > 0 ? n : 0) * kind_size(kind);
    size_t hb = b->bytes ? b->bytes : 1;
    b->h = calloc(1, hb);
    if (role == TB_OUT) {
        b->init = calloc(1, hb);
        b->got[0] = calloc(1, hb);
        b->got[1] = calloc(1, hb);
    }
    void *p = NULL;
    if (qc_alloc_malloc(x->g.alloc, b->bytes + 2 * GUARD, NULL, name, &p) != QC_OK)
        T_FATAL("device alloc of %zu bytes for %s: %s", b->bytes, name, qc_error_last());
    b->dbase = (char *)p;
    b->d = b->dbase + GUARD;
    copy_sync(b->dbase, x->pattern, GUARD, cudaMemcpyHostToDevice, "guard upload");
    copy_sync(b->dbase + GUARD + b->bytes, x->pattern, GUARD, cudaMemcpyHostToDevice,
              "guard upload");
    return b;
}

static void tb_upload(struct tbuf *b, const void *src)
{
    copy_sync(b->d, src, b->bytes, cudaMemcpyHostToDevice, "upload");
}

static float urand(struct tctx *x, float lo, float hi)
{
    double u = (double)(qc_test_rand(&x->rng) >> 11) * 0x1p-53;
    return lo + (float)u * (hi - lo);
}

/* Random fp32 input in [lo, hi). */
static struct tbuf *in_f32(struct tctx *x, const char *name, int64_t n, float lo, float hi)
{
    struct tbuf *b = tb_new(x, name, TB_F32, TB_IN, n);
    float *h = (float *)b->h;
    for (int64_t i = 0; i < n; i++)
        h[i] = urand(x, lo, hi);
    tb_upload(b, b->h);
    return b;
}

/* fp32 input with given host content (copied). */
static struct tbuf *in_f32_from(struct tctx *x, const char *name, const float *src, int64_t n)
{
    struct tbuf *b = tb_new(x, name, TB_F32, TB_IN, n);
    if (n > 0)
        memcpy(b->h, src, (size_t)n * sizeof(float));
    tb_upload(b, b->h);
    return b;
}

static struct tbuf *in_i64_from(struct tctx *x, const char *name, const int64_t *src, int64_t n)
{
    struct tbuf *b = tb_new(x, name, TB_I64, TB_IN, n);
    if (n > 0)
        memcpy(b->h, src, (size_t)n * sizeof(int64_t));
    tb_upload(b, b->h);
    return b;
}

/* Random 0/1 mask with P(1) = p1. */
static struct tbuf *in_mask(struct tctx *x, const char *name, int64_t n, float p1)
{
    struct tbuf *b = tb_new(x, name, TB_U8, TB_IN, n);
    uint8_t *h = (uint8_t *)b->h;
    for (int64_t i = 0; i < n; i++)
        h[i] = urand(x, 0.0f, 1.0f) < p1 ? 1 : 0;
    tb_upload(b, b->h);
    return b;
}

/* Output with random initial content in [lo, hi) on both backends. */
static struct tbuf *out_f32(struct tctx *x, const char *name, int64_t n, float lo, float hi)
{
    struct tbuf *b = tb_new(x, name, TB_F32, TB_OUT, n);
    float *init = (float *)b->init;
    for (int64_t i = 0; i < n; i++)
        init[i] = urand(x, lo, hi);
    if (b->bytes)
        memcpy(b->h, b->init, b->bytes);
    return b;
}

static struct tbuf *out_i64(struct tctx *x, const char *name, int64_t n)
{
    struct tbuf *b = tb_new(x, name, TB_I64, TB_OUT, n);
    int64_t *init = (int64_t *)b->init;
    for (int64_t i = 0; i < n; i++)
        init[i] = -7; /* never a valid mode */
    if (b->bytes)
        memcpy(b->h, b->init, b->bytes);
    return b;
}

/* Scratch: separate host and device memory; only its guard bands are checked. */
static struct tbuf *scratch_f32(struct tctx *x, const char *name, int64_t n)
{
    return tb_new(x, name, TB_F32, TB_SCRATCH, n);
}

#define F(b)  ((float *)(b)->h)
#define DF(b) ((float *)(b)->d)
#define I(b)  ((int64_t *)(b)->h)
#define DI(b) ((int64_t *)(b)->d)
#define U(b)  ((uint8_t *)(b)->h)
#define DU(b) ((uint8_t *)(b)->d)

static void cuda_run_begin(struct tctx *x)
{
    for (int i = 0; i < x->nbufs; i++)
        if (x->bufs[i].role == TB_OUT)
            tb_upload(&x->bufs[i], x->bufs[i].init);
}

static void cuda_run_end(struct tctx *x, int rep)
{
    kt_cuda_ok(cudaStreamSynchronize(x->g.s), "kernel execution");
    for (int i = 0; i < x->nbufs; i++) {
        struct tbuf *b = &x->bufs[i];
        if (b->role == TB_OUT && b->bytes)
            copy_sync(b->got[rep], b->d, b->bytes, cudaMemcpyDeviceToHost, "download");
    }
}

/* Runs the CUDA statement twice from the same initial outputs. */
#define CUDA_TWICE(x, call)                                                                        \
    do {                                                                                           \
        for (int rep_ = 0; rep_ < 2; rep_++) {                                                     \
            cuda_run_begin(x);                                                                     \
            call;                                                                                  \
            cuda_run_end(x, rep_);                                                                 \
        }                                                                                          \
    } while (0)

// ---- checks
// ------------------------------------------------------------------------------------------

static void case_fail(struct tctx *x, const char *buf, const char *what)
{
    x->bad++;
    qc_test_st.failed_in_test = 1;
    printf("  [%s n=%" PRId64 "] %s: %s\n", x->tc->op, x->tc->n, buf, what);
}

static void compare_f32(struct tctx *x, const struct tbuf *b)
{
    const struct tcase *tc = x->tc;
    const float *got = (const float *)b->got[0], *ref = (const float *)b->h;
    int64_t errs = 0;
    double se = 0.0, sr = 0.0, worst = 0.0;
    for (int64_t i = 0; i < b->n; i++) {
        double g = (double)got[i], r = (double)ref[i];
        bool ok;
        if (!isfinite(g) || !isfinite(r)) {
            ok = (isnan(g) && isnan(r)) || (isinf(g) && isinf(r) && g == r);
        } else {
            double d = fabs(g - r);
            ok = d <= tc->atol + tc->rtol * fabs(r);
            se += d * d;
            sr += r * r;
            if (d > worst)
                worst = d;
        }
        if (!ok) {
            if (errs < MAX_SHOWN)
                printf("  [%s n=%" PRId64 "] %s[%" PRId64
                       "]: gpu %.9g ref %.9g (|d| %.3g > %.3g)\n",
                       tc->op, tc->n, b->name, i, g, r, fabs(g - r), tc->atol + tc->rtol * fabs(r));
            errs++;
        }
    }
    double nmse = sr > 0.0 ? se / sr : se;
    if (errs) {
        x->bad++;
        qc_test_st.failed_in_test = 1;
        printf("  [%s n=%" PRId64 "] %s: %" PRId64 " of %" PRId64
               " elements out of tolerance (atol %g rtol %g: %s)\n",
               tc->op, tc->n, b->name, errs, b->n, tc->atol, tc->rtol, tc->why);
    }
    if (!(nmse <= tc->nmse)) {
        x->bad++;
        qc_test_st.failed_in_test = 1;
        printf("  [%s n=%" PRId64 "] %s: nmse %.3g > bound %.3g (max |d| %.3g)\n", tc->op, tc->n,
               b->name, nmse, tc->nmse, worst);
    }
}

static void compare_exact(struct tctx *x, const struct tbuf *b)
{
    if (b->bytes && memcmp(b->got[0], b->h, b->bytes) != 0) {
        int shown = 0;
        for (int64_t i = 0; i < b->n && shown < MAX_SHOWN; i++) {
            if (b->kind == TB_I64 && ((int64_t *)b->got[0])[i] != ((int64_t *)b->h)[i]) {
                printf("  [%s n=%" PRId64 "] %s[%" PRId64 "]: gpu %" PRId64 " ref %" PRId64 "\n",
                       x->tc->op, x->tc->n, b->name, i, ((int64_t *)b->got[0])[i],
                       ((int64_t *)b->h)[i]);
                shown++;
            }
        }
        case_fail(x, b->name, "integer output differs from the CPU's");
    }
}

static void check_guards(struct tctx *x, const struct tbuf *b)
{
    unsigned char g[GUARD];
    copy_sync(g, b->dbase, GUARD, cudaMemcpyDeviceToHost, "guard download");
    if (memcmp(g, x->pattern, GUARD) != 0)
        case_fail(x, b->name, "guard band BEFORE the buffer was overwritten");
    copy_sync(g, b->dbase + GUARD + b->bytes, GUARD, cudaMemcpyDeviceToHost, "guard download");
    if (memcmp(g, x->pattern, GUARD) != 0)
        case_fail(x, b->name, "guard band AFTER the buffer was overwritten");
}

static void check_case(struct tctx *x)
{
    for (int i = 0; i < x->nbufs; i++) {
        struct tbuf *b = &x->bufs[i];
        check_guards(x, b);
        if (b->role == TB_OUT) {
            if (b->kind == TB_F32)
                compare_f32(x, b);
            else
                compare_exact(x, b);
            if (b->bytes && memcmp(b->got[0], b->got[1], b->bytes) != 0)
                case_fail(x, b->name, "two CUDA runs differ (nondeterministic)");
        } else if (b->role == TB_IN && b->bytes) {
            void *now = malloc(b->bytes);
            copy_sync(now, b->d, b->bytes, cudaMemcpyDeviceToHost, "input download");
            if (memcmp(now, b->h, b->bytes) != 0)
                case_fail(x, b->name, "input modified on the device");
            free(now);
        }
    }
}

static void free_case(struct tctx *x)
{
    kt_cuda_ok(cudaStreamSynchronize(x->g.s), "sync before free");
    for (int i = 0; i < x->nbufs; i++) {
        struct tbuf *b = &x->bufs[i];
        free(b->h);
        free(b->init);
        free(b->got[0]);
        free(b->got[1]);
        qc_alloc_free(x->g.alloc, b->dbase, NULL);
    }
    x->nbufs = 0;
}

// ---- CSR fixtures
// --------------------------------------------------------------------------------------

struct tcsr {
    struct tbuf *ptr, *perm, *seg;
    struct qc_csr h, d; /* host view (for the CPU op) and device view */
};

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* E items over nseg segments with random destinations (some segments empty); sorted = true
 * gives items already grouped by segment and perm = NULL. */
static struct tcsr make_csr(struct tctx *x, int64_t E, int64_t nseg, bool sorted)
{
    int64_t *seg = malloc((size_t)(E > 0 ? E : 1) * sizeof(int64_t));
    for (int64_t e = 0; e < E; e++)
        seg[e] = (int64_t)(qc_test_rand(&x->rng) % (uint64_t)nseg);
    if (sorted) /* items grouped by ascending segment */
        qsort(seg, (size_t)E, sizeof(int64_t), cmp_i64);
    int64_t *ptr = malloc((size_t)(nseg + 1) * sizeof(int64_t));
    int64_t *perm = malloc((size_t)(E > 0 ? E : 1) * sizeof(int64_t));
    qc_csr_build_cpu(ptr, perm, seg, E, nseg);
    struct tcsr c;
    c.ptr = in_i64_from(x, "csr.ptr", ptr, nseg + 1);
    c.perm = sorted ? NULL : in_i64_from(x, "csr.perm", perm, E);
    c.seg = in_i64_from(x, "csr.seg", seg, E);
    c.h.ptr = I(c.ptr);
    c.h.perm = sorted ? NULL : I(c.perm);
    c.h.seg = I(c.seg);
    c.h.nseg = nseg;
    c.h.nitem = E;
    c.d = c.h;
    c.d.ptr = DI(c.ptr);
    c.d.perm = sorted ? NULL : DI(c.perm);
    c.d.seg = DI(c.seg);
    free(seg);
    free(ptr);
    free(perm);
    return c;
}

/* Destinations for E edges: about 8 edges per destination, at least one destination. */
static int64_t nseg_for(int64_t E)
{
    return E / 8 + 1;
}

// ---- runners: elementwise
// ----------------------------------------------------------------------------

enum unary_op { U_RELU, U_ELU, U_SIGMOID, U_TANH, U_WRAP };

static void run_unary(struct tctx *x, const struct tcase *tc, enum unary_op op)
{
    int64_t n = tc->n;
    float lo = op == U_WRAP ? -20.0f : -6.0f, hi = -lo;
    struct tbuf *in = in_f32(x, "inp", n, lo, hi);
    struct tbuf *out = out_f32(x, "out", n, -1.0f, 1.0f);
    /* backward: dout random, `y` = the CPU forward output */
    struct tbuf *dout = in_f32(x, "dout", n, -1.0f, 1.0f);
    struct tbuf *din = out_f32(x, "dinp", n, -1.0f, 1.0f);
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    switch (op) {
    case U_RELU:
        qc_relu_forward_cpu(F(out), F(in), n);
        break;
    case U_ELU:
        qc_elu_forward_cpu(F(out), F(in), n);
        break;
    case U_SIGMOID:
        qc_sigmoid_forward_cpu(F(out), F(in), n);
        break;
    case U_TANH:
        qc_tanh_forward_cpu(F(out), F(in), n);
        break;
    case U_WRAP:
        qc_wrap_angle_forward_cpu(F(out), F(in), n);
        break;
    }
    memcpy(y, F(out), (size_t)n * sizeof(float));
    struct tbuf *yb = in_f32_from(x, "y", y, n);
    switch (op) {
    case U_RELU:
        qc_relu_backward_cpu(F(din), F(dout), F(yb), n);
        CUDA_TWICE(x, (qc_relu_forward_cuda(DF(out), DF(in), n, x->g.s),
                       qc_relu_backward_cuda(DF(din), DF(dout), DF(yb), n, x->g.s)));
        break;
    case U_ELU:
        qc_elu_backward_cpu(F(din), F(dout), F(yb), n);
        CUDA_TWICE(x, (qc_elu_forward_cuda(DF(out), DF(in), n, x->g.s),
                       qc_elu_backward_cuda(DF(din), DF(dout), DF(yb), n, x->g.s)));
        break;
    case U_SIGMOID:
        qc_sigmoid_backward_cpu(F(din), F(dout), F(yb), n);
        CUDA_TWICE(x, (qc_sigmoid_forward_cuda(DF(out), DF(in), n, x->g.s),
                       qc_sigmoid_backward_cuda(DF(din), DF(dout), DF(yb), n, x->g.s)));
        break;
    case U_TANH:
        qc_tanh_backward_cpu(F(din), F(dout), F(yb), n);
        CUDA_TWICE(x, (qc_tanh_forward_cuda(DF(out), DF(in), n, x->g.s),
                       qc_tanh_backward_cuda(DF(din), DF(dout), DF(yb), n, x->g.s)));
        break;
    case U_WRAP:
        memcpy(F(din), din->init, din->bytes); /* no backward: dinp stays at its init */
        CUDA_TWICE(x, qc_wrap_angle_forward_cuda(DF(out), DF(in), n, x->g.s));
        break;
    }
    free(y);
}

static void run_relu(struct tctx *x, const struct tcase *tc)
{
    run_unary(x, tc, U_RELU);
}
static void run_elu(struct tctx *x, const struct tcase *tc)
{
    run_unary(x, tc, U_ELU);
}
static void run_sigmoid(struct tctx *x, const struct tcase *tc)
{
    run_unary(x, tc, U_SIGMOID);
}
static void run_tanh(struct tctx *x, const struct tcase *tc)
{
    run_unary(x, tc, U_TANH);
}
static void run_wrap_angle(struct tctx *x, const struct tcase *tc)
{
    run_unary(x, tc, U_WRAP);
}

static void run_angle_between(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n;
    float *ctr = malloc((size_t)(2 * N + 2) * sizeof(float));
    float *vec = malloc((size_t)(2 * N + 2) * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        float th = urand(x, -QC_PI_F, QC_PI_F);
        ctr[2 * i] = cosf(th);
        ctr[2 * i + 1] = sinf(th);
        bool zero = i % 5 == 0; /* n = (0,0): must give ±0, never ±π */
        vec[2 * i] = zero ? (i % 10 == 0 ? -0.0f : 0.0f) : urand(x, -10.0f, 10.0f);
        vec[2 * i + 1] = zero ? 0.0f : urand(x, -10.0f, 10.0f);
    }
    struct tbuf *c = in_f32_from(x, "ctr", ctr, 2 * N);
    struct tbuf *v = in_f32_from(x, "vec", vec, 2 * N);
    struct tbuf *out = out_f32(x, "out", N, 5.0f, 6.0f);
    qc_angle_between_2d_forward_cpu(F(out), F(c), F(v), N);
    CUDA_TWICE(x, qc_angle_between_2d_forward_cuda(DF(out), DF(c), DF(v), N, x->g.s));
    free(ctr);
    free(vec);
}

static void run_arith(struct tctx *x, const struct tcase *tc)
{
    int64_t n = tc->n;
    struct tbuf *a = in_f32(x, "a", n, -2.0f, 2.0f);
    struct tbuf *b = in_f32(x, "b", n, -2.0f, 2.0f);
    struct tbuf *g = in_f32(x, "g", n, 0.0f, 1.0f);
    struct tbuf *dout = in_f32(x, "dout", n, -1.0f, 1.0f);
    struct tbuf *sum = out_f32(x, "add", n, -1.0f, 1.0f);
    struct tbuf *sc = out_f32(x, "add_scalar", n, -1.0f, 1.0f);
    struct tbuf *gu = out_f32(x, "gate", n, -1.0f, 1.0f);
    struct tbuf *du = out_f32(x, "du", n, -1.0f, 1.0f);
    struct tbuf *dg = out_f32(x, "dg", n, -1.0f, 1.0f);
    struct tbuf *ds = out_f32(x, "ds", n, -1.0f, 1.0f);
    qc_add_forward_cpu(F(sum), F(a), F(b), n);
    qc_add_scalar_forward_cpu(F(sc), F(a), 0.1f, n);
    qc_gate_update_forward_cpu(F(gu), F(a), F(g), F(b), n);
    qc_gate_update_backward_cpu(F(du), F(dg), F(ds), F(dout), F(a), F(g), F(b), n);
    CUDA_TWICE(x, (qc_add_forward_cuda(DF(sum), DF(a), DF(b), n, x->g.s),
                   qc_add_scalar_forward_cuda(DF(sc), DF(a), 0.1f, n, x->g.s),
                   qc_gate_update_forward_cuda(DF(gu), DF(a), DF(g), DF(b), n, x->g.s),
                   qc_gate_update_backward_cuda(DF(du), DF(dg), DF(ds), DF(dout), DF(a), DF(g),
                                                DF(b), n, x->g.s)));
}

static void run_dropout(struct tctx *x, const struct tcase *tc)
{
    int64_t n = tc->n;
    struct tbuf *in = in_f32(x, "inp", n, -2.0f, 2.0f);
    struct tbuf *out = out_f32(x, "out", n, -1.0f, 1.0f);
    struct tbuf *din = out_f32(x, "dinp", n, -1.0f, 1.0f);
    struct tbuf *off = out_f32(x, "out_p0", n, -1.0f, 1.0f);
    struct qc_dropout d = {0.1f, 0x0123456789abcdefull, 977, 31, 123457, NULL, 0, 0, 0};
    struct qc_dropout d0 = {0.0f, 1, 1, 1, 0, NULL, 0, 0, 0};
    qc_dropout_forward_cpu(F(out), F(in), n, &d);
    qc_dropout_backward_cpu(F(din), F(in), n, &d);
    qc_dropout_forward_cpu(F(off), F(in), n, &d0);
    CUDA_TWICE(x, (qc_dropout_forward_cuda(DF(out), DF(in), n, &d, x->g.s),
                   qc_dropout_backward_cuda(DF(din), DF(in), n, &d, x->g.s),
                   qc_dropout_forward_cuda(DF(off), DF(in), n, &d0, x->g.s)));
}

// ---- runners: linear, layernorm
// ----------------------------------------------------------------------

/* d1 = IC, d2 = OC. Forward twice: OVERWRITE with bias, then ACCUM without bias from a strided
 * input (ldi = IC + 3). Backward: dinp ACCUM into a strided buffer (lddi = IC + 5; the columns
 * past IC must stay untouched), dweight and dbias ACCUM. */
static void run_linear(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, IC = tc->d1, OC = tc->d2, ldi = IC + 3, lddi = IC + 5;
    struct tbuf *in = in_f32(x, "inp", N * ldi, -1.0f, 1.0f);
    struct tbuf *w = in_f32(x, "weight", OC * IC, -0.2f, 0.2f);
    struct tbuf *b = in_f32(x, "bias", OC, -1.0f, 1.0f);
    struct tbuf *dout = in_f32(x, "dout", N * OC, -1.0f, 1.0f);
    struct tbuf *o1 = out_f32(x, "out", N * OC, -1.0f, 1.0f);
    struct tbuf *o2 = out_f32(x, "out_accum", N * OC, -1.0f, 1.0f);
    struct tbuf *dinp = out_f32(x, "dinp", N * lddi, -1.0f, 1.0f);
    struct tbuf *dw = out_f32(x, "dweight", OC * IC, -1.0f, 1.0f);
    struct tbuf *db = out_f32(x, "dbias", OC, -1.0f, 1.0f);
    qc_linear_forward_cpu(F(o1), F(in), IC, F(w), F(b), N, IC, OC, false);
    qc_linear_forward_cpu(F(o2), F(in), ldi, F(w), NULL, N, IC, OC, true);
    qc_linear_backward_cpu(F(dinp), lddi, F(dw), F(db), F(dout), F(in), ldi, F(w), N, IC, OC, true);
    CUDA_TWICE(x,
               (qc_linear_forward_cuda(DF(o1), DF(in), IC, DF(w), DF(b), N, IC, OC, false, x->g.s),
                qc_linear_forward_cuda(DF(o2), DF(in), ldi, DF(w), NULL, N, IC, OC, true, x->g.s),
                qc_linear_backward_cuda(DF(dinp), lddi, DF(dw), DF(db), DF(dout), DF(in), ldi,
                                        DF(w), N, IC, OC, true, x->g.s)));
}

/* d1 = C. Forward (out, mean, rstd), backward dinp OVERWRITE, dweight / dbias ACCUM. */
static void run_layernorm(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, C = tc->d1;
    struct tbuf *in = in_f32(x, "inp", N * C, -3.0f, 5.0f);
    struct tbuf *w = in_f32(x, "weight", C, 0.5f, 1.5f);
    struct tbuf *b = in_f32(x, "bias", C, -1.0f, 1.0f);
    struct tbuf *dout = in_f32(x, "dout", N * C, -1.0f, 1.0f);
    struct tbuf *out = out_f32(x, "out", N * C, -1.0f, 1.0f);
    struct tbuf *mean = out_f32(x, "mean", N, -1.0f, 1.0f);
    struct tbuf *rstd = out_f32(x, "rstd", N, -1.0f, 1.0f);
    /* the backward reads the saved statistics: give both backends the CPU's */
    float *m = malloc((size_t)(N + 1) * sizeof(float)),
          *r = malloc((size_t)(N + 1) * sizeof(float));
    float *tmp = malloc((size_t)(N * C + 1) * sizeof(float));
    qc_layernorm_forward_cpu(tmp, m, r, F(in), F(w), F(b), N, C);
    struct tbuf *sm = in_f32_from(x, "saved_mean", m, N);
    struct tbuf *sr = in_f32_from(x, "saved_rstd", r, N);
    struct tbuf *dinp = out_f32(x, "dinp", N * C, -1.0f, 1.0f);
    struct tbuf *dw = out_f32(x, "dweight", C, -1.0f, 1.0f);
    struct tbuf *db = out_f32(x, "dbias", C, -1.0f, 1.0f);
    qc_layernorm_forward_cpu(F(out), F(mean), F(rstd), F(in), F(w), F(b), N, C);
    qc_layernorm_backward_cpu(F(dinp), F(dw), F(db), F(dout), F(in), F(sm), F(sr), F(w), N, C,
                              false);
    CUDA_TWICE(x, (qc_layernorm_forward_cuda(DF(out), DF(mean), DF(rstd), DF(in), DF(w), DF(b), N,
                                             C, x->g.s),
                   qc_layernorm_backward_cuda(DF(dinp), DF(dw), DF(db), DF(dout), DF(in), DF(sm),
                                              DF(sr), DF(w), N, C, false, x->g.s)));
    free(m);
    free(r);
    free(tmp);
}

// ---- runners: embedding, layout
// ----------------------------------------------------------------------

/* d1 = V (table rows), d2 = C. */
static void run_embedding(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, V = tc->d1, C = tc->d2;
    int64_t *idx = malloc((size_t)(N + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++)
        idx[i] = (int64_t)(qc_test_rand(&x->rng) % (uint64_t)V);
    struct tbuf *ib = in_i64_from(x, "idx", idx, N);
    struct tbuf *table = in_f32(x, "table", V * C, -1.0f, 1.0f);
    struct tbuf *dout = in_f32(x, "dout", N * C, -1.0f, 1.0f);
    struct tbuf *out = out_f32(x, "out", N * C, -1.0f, 1.0f);
    struct tbuf *dt = out_f32(x, "dtable", V * C, -1.0f, 1.0f);
    qc_embedding_forward_cpu(F(out), I(ib), F(table), N, C, V);
    qc_embedding_backward_cpu(F(dt), F(dout), I(ib), N, C, V);
    CUDA_TWICE(x, (qc_embedding_forward_cuda(DF(out), DI(ib), DF(table), N, C, V, x->g.s),
                   qc_embedding_backward_cuda(DF(dt), DF(dout), DI(ib), N, C, V, x->g.s)));
    free(idx);
}

/* outer = n, d1 = L, d2 = inner. */
static void run_cumsum(struct tctx *x, const struct tcase *tc)
{
    int64_t O = tc->n, L = tc->d1, In = tc->d2, n = O * L * In;
    struct tbuf *in = in_f32(x, "inp", n, -1.0f, 1.0f);
    struct tbuf *out = out_f32(x, "out", n, -1.0f, 1.0f);
    struct tbuf *din = out_f32(x, "dinp", n, -1.0f, 1.0f);
    qc_cumsum_forward_cpu(F(out), F(in), O, L, In);
    qc_cumsum_backward_cpu(F(din), F(in), O, L, In);
    CUDA_TWICE(x, (qc_cumsum_forward_cuda(DF(out), DF(in), O, L, In, x->g.s),
                   qc_cumsum_backward_cuda(DF(din), DF(in), O, L, In, x->g.s)));
}

/* rows = n, d1 = R (repeats), d2 = C. copy2d both ways, repeat_interleave, tile, transpose01. */
static void run_layout(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, R = tc->d1, C = tc->d2, ld = 2 * C + 1;
    struct tbuf *src = in_f32(x, "src", N * ld, -1.0f, 1.0f);
    struct tbuf *rep = in_f32(x, "rep_in", N * R * C, -1.0f, 1.0f);
    struct tbuf *cp = out_f32(x, "copy2d", N * ld, -1.0f, 1.0f);
    struct tbuf *cpa = out_f32(x, "copy2d_accum", N * C, -1.0f, 1.0f);
    struct tbuf *ri = out_f32(x, "repeat_interleave", N * R * C, -1.0f, 1.0f);
    struct tbuf *rib = out_f32(x, "repeat_interleave_bwd", N * C, -1.0f, 1.0f);
    struct tbuf *ti = out_f32(x, "tile", N * R * C, -1.0f, 1.0f);
    struct tbuf *tib = out_f32(x, "tile_bwd", N * C, -1.0f, 1.0f);
    struct tbuf *tr = out_f32(x, "transpose01", N * R * C, -1.0f, 1.0f);
    struct tbuf *trb = out_f32(x, "transpose01_bwd", N * R * C, -1.0f, 1.0f);
    qc_copy2d_cpu(F(cp) + 1, ld, F(src), ld, N, C, false);
    qc_copy2d_cpu(F(cpa), C, F(src) + 3, ld, N, C, true);
    qc_repeat_interleave_forward_cpu(F(ri), F(src), N, R, C); /* rows of width C: src as (N',C) */
    qc_repeat_interleave_backward_cpu(F(rib), F(rep), N, R, C, true);
    qc_tile_forward_cpu(F(ti), F(src), N, R, C);
    qc_tile_backward_cpu(F(tib), F(rep), N, R, C, false);
    qc_transpose01_forward_cpu(F(tr), F(rep), N, R, C);
    qc_transpose01_backward_cpu(F(trb), F(rep), N, R, C);
    CUDA_TWICE(x, (qc_copy2d_cuda(DF(cp) + 1, ld, DF(src), ld, N, C, false, x->g.s),
                   qc_copy2d_cuda(DF(cpa), C, DF(src) + 3, ld, N, C, true, x->g.s),
                   qc_repeat_interleave_forward_cuda(DF(ri), DF(src), N, R, C, x->g.s),
                   qc_repeat_interleave_backward_cuda(DF(rib), DF(rep), N, R, C, true, x->g.s),
                   qc_tile_forward_cuda(DF(ti), DF(src), N, R, C, x->g.s),
                   qc_tile_backward_cuda(DF(tib), DF(rep), N, R, C, false, x->g.s),
                   qc_transpose01_forward_cuda(DF(tr), DF(rep), N, R, C, x->g.s),
                   qc_transpose01_backward_cuda(DF(trb), DF(rep), N, R, C, x->g.s)));
}

// ---- runners: CSR ops
// ---------------------------------------------------------------------------------

/* E = n edges, d1 = C, d2 = 1: items pre-sorted (perm NULL), else a permuted CSR. */
static void run_gather_scatter(struct tctx *x, const struct tcase *tc)
{
    int64_t E = tc->n, C = tc->d1, N = nseg_for(E);
    struct tcsr c = make_csr(x, E, N, tc->d2 == 1);
    struct tbuf *nodes = in_f32(x, "nodes", N * C, -1.0f, 1.0f);
    struct tbuf *edges = in_f32(x, "edges", E * C, -1.0f, 1.0f);
    struct tbuf *g = out_f32(x, "gather", E * C, -1.0f, 1.0f);
    struct tbuf *ga = out_f32(x, "gather_accum", E * C, -1.0f, 1.0f);
    struct tbuf *gb = out_f32(x, "gather_bwd_accum", N * C, -1.0f, 1.0f);
    struct tbuf *sf = out_f32(x, "scatter", N * C, -1.0f, 1.0f);
    struct tbuf *sb = out_f32(x, "scatter_bwd", E * C, -1.0f, 1.0f);
    qc_gather_rows_forward_cpu(F(g), F(nodes), c.h.seg, E, C, false);
    qc_gather_rows_forward_cpu(F(ga), F(nodes), c.h.seg, E, C, true);
    qc_gather_rows_backward_cpu(F(gb), F(edges), c.h, C, true);
    qc_scatter_add_forward_cpu(F(sf), F(edges), c.h, C, false);
    qc_scatter_add_backward_cpu(F(sb), F(nodes), c.h, C, false);
    CUDA_TWICE(x, (qc_gather_rows_forward_cuda(DF(g), DF(nodes), c.d.seg, E, C, false, x->g.s),
                   qc_gather_rows_forward_cuda(DF(ga), DF(nodes), c.d.seg, E, C, true, x->g.s),
                   qc_gather_rows_backward_cuda(DF(gb), DF(edges), c.d, C, true, x->g.s),
                   qc_scatter_add_forward_cuda(DF(sf), DF(edges), c.d, C, false, x->g.s),
                   qc_scatter_add_backward_cuda(DF(sb), DF(nodes), c.d, C, false, x->g.s)));
}

/* E = n edges over nseg_for(E) destinations, H = 8, Dh = 16: score, softmax, aggregate with
 * attention dropout p = 0.1, forward and backward. */
static void run_attention(struct tctx *x, const struct tcase *tc)
{
    int64_t E = tc->n, Nd = nseg_for(E), H = H_MODEL, Dh = DH_MODEL, D = H * Dh;
    float scale = 0.25f;
    struct tcsr c = make_csr(x, E, Nd, false);
    struct qc_dropout drop = {0.1f, 2023, 5, 17, 40, NULL, 0, 0, 0};
    struct tbuf *q = in_f32(x, "q", Nd * D, -1.0f, 1.0f);
    struct tbuf *k = in_f32(x, "k", E * D, -1.0f, 1.0f);
    struct tbuf *v = in_f32(x, "v", E * D, -1.0f, 1.0f);
    struct tbuf *dsc = in_f32(x, "dscore", E * H, -1.0f, 1.0f);
    struct tbuf *dal = in_f32(x, "dalpha_in", E * H, -1.0f, 1.0f);
    struct tbuf *dagg = in_f32(x, "dagg", Nd * D, -1.0f, 1.0f);
    /* alpha for the backward: the CPU softmax of the CPU score */
    float *sc = malloc((size_t)(E * H + 1) * sizeof(float));
    float *al = malloc((size_t)(E * H + 1) * sizeof(float));
    qc_attn_score_forward_cpu(sc, F(q), F(k), c.h, H, Dh, scale);
    qc_segment_softmax_forward_cpu(al, NULL, NULL, sc, c.h, H);
    struct tbuf *alpha = in_f32_from(x, "alpha", al, E * H);
    struct tbuf *score = out_f32(x, "score", E * H, -1.0f, 1.0f);
    struct tbuf *sm = out_f32(x, "softmax", E * H, -1.0f, 1.0f);
    struct tbuf *smax = out_f32(x, "seg_max", Nd * H, -1.0f, 1.0f);
    struct tbuf *ssum = out_f32(x, "seg_sum", Nd * H, -1.0f, 1.0f);
    struct tbuf *dsm = out_f32(x, "softmax_bwd", E * H, -1.0f, 1.0f);
    struct tbuf *dq = out_f32(x, "dq_accum", Nd * D, -1.0f, 1.0f);
    struct tbuf *dk = out_f32(x, "dk", E * D, -1.0f, 1.0f);
    struct tbuf *agg = out_f32(x, "aggregate", Nd * D, -1.0f, 1.0f);
    struct tbuf *agg0 = out_f32(x, "aggregate_nodrop", Nd * D, -1.0f, 1.0f);
    struct tbuf *dalpha = out_f32(x, "dalpha", E * H, -1.0f, 1.0f);
    struct tbuf *dv = out_f32(x, "dv", E * D, -1.0f, 1.0f);
    qc_attn_score_forward_cpu(F(score), F(q), F(k), c.h, H, Dh, scale);
    qc_segment_softmax_forward_cpu(F(sm), F(smax), F(ssum), F(score), c.h, H);
    qc_segment_softmax_backward_cpu(F(dsm), F(dal), F(alpha), c.h, H);
    qc_attn_score_backward_cpu(F(dq), F(dk), F(dsc), F(q), F(k), c.h, H, Dh, scale, true);
    qc_attn_aggregate_forward_cpu(F(agg), F(alpha), F(v), c.h, H, Dh, &drop);
    qc_attn_aggregate_forward_cpu(F(agg0), F(alpha), F(v), c.h, H, Dh, NULL);
    qc_attn_aggregate_backward_cpu(F(dalpha), F(dv), F(dagg), F(alpha), F(v), c.h, H, Dh, &drop);
    CUDA_TWICE(
        x, (qc_attn_score_forward_cuda(DF(score), DF(q), DF(k), c.d, H, Dh, scale, x->g.s),
            qc_segment_softmax_forward_cuda(DF(sm), DF(smax), DF(ssum), DF(score), c.d, H, x->g.s),
            qc_segment_softmax_backward_cuda(DF(dsm), DF(dal), DF(alpha), c.d, H, x->g.s),
            qc_attn_score_backward_cuda(DF(dq), DF(dk), DF(dsc), DF(q), DF(k), c.d, H, Dh, scale,
                                        true, x->g.s),
            qc_attn_aggregate_forward_cuda(DF(agg), DF(alpha), DF(v), c.d, H, Dh, &drop, x->g.s),
            qc_attn_aggregate_forward_cuda(DF(agg0), DF(alpha), DF(v), c.d, H, Dh, NULL, x->g.s),
            qc_attn_aggregate_backward_cuda(DF(dalpha), DF(dv), DF(dagg), DF(alpha), DF(v), c.d, H,
                                            Dh, &drop, x->g.s)));
    free(sc);
    free(al);
}

// ---- runners: Fourier, GRU
// ---------------------------------------------------------------------------

/* N = n rows, d1 = D inputs, d2 = F bands. */
static void run_fourier(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, D = tc->d1, Fb = tc->d2, W = 2 * Fb + 1;
    struct tbuf *c = in_f32(x, "c", N * D, -5.0f, 5.0f);
    struct tbuf *fr = in_f32(x, "freqs", D * Fb, -1.0f, 1.0f);
    struct tbuf *dphi = in_f32(x, "dphi", N * D * W, -1.0f, 1.0f);
    struct tbuf *phi = out_f32(x, "phi", N * D * W, -1.0f, 1.0f);
    struct tbuf *dc = out_f32(x, "dc", N * D, -1.0f, 1.0f);
    struct tbuf *dfr = out_f32(x, "dfreqs_accum", D * Fb, -1.0f, 1.0f);
    qc_fourier_features_forward_cpu(F(phi), F(c), F(fr), N, D, Fb);
    qc_fourier_features_backward_cpu(F(dc), F(dfr), F(dphi), F(c), F(fr), N, D, Fb);
    CUDA_TWICE(x, (qc_fourier_features_forward_cuda(DF(phi), DF(c), DF(fr), N, D, Fb, x->g.s),
                   qc_fourier_features_backward_cuda(DF(dc), DF(dfr), DF(dphi), DF(c), DF(fr), N, D,
                                                     Fb, x->g.s)));
}

/* N = n sequences, d1 = L steps, d2 = C (= IC). The sequence forward and backward, and one cell
 * step forward and backward. The backward reads the CPU forward's saved hs / gates. */
static void run_gru(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, L = tc->d1, C = tc->d2, IC = C;
    struct tbuf *xs = in_f32(x, "x", L * N * IC, -1.0f, 1.0f);
    struct tbuf *h0 = in_f32(x, "h0", N * C, -1.0f, 1.0f);
    struct tbuf *wih = in_f32(x, "w_ih", 3 * C * IC, -0.15f, 0.15f);
    struct tbuf *bih = in_f32(x, "b_ih", 3 * C, -0.1f, 0.1f);
    struct tbuf *whh = in_f32(x, "w_hh", 3 * C * C, -0.15f, 0.15f);
    struct tbuf *bhh = in_f32(x, "b_hh", 3 * C, -0.1f, 0.1f);
    struct tbuf *dlast = in_f32(x, "dh_last", N * C, -1.0f, 1.0f);
    int64_t fs = qc_gru_forward_scratch_numel(L, N, C), bs = qc_gru_backward_scratch_numel(L, N, C);
    int64_t cs = qc_gru_cell_scratch_numel(N, C);
    float *hscpu = malloc((size_t)((L + 1) * N * C) * sizeof(float));
    float *gcpu = malloc((size_t)(L * N * 4 * C + 1) * sizeof(float));
    float *scr = malloc((size_t)((fs > bs ? fs : bs) + cs + 1) * sizeof(float));
    qc_gru_forward_cpu(hscpu, gcpu, F(xs), F(h0), F(wih), F(bih), F(whh), F(bhh), L, N, IC, C, scr);
    struct tbuf *shs = in_f32_from(x, "saved_hs", hscpu, (L + 1) * N * C);
    struct tbuf *sg = in_f32_from(x, "saved_gates", gcpu, L * N * 4 * C);
    struct tbuf *hs = out_f32(x, "hs", (L + 1) * N * C, -1.0f, 1.0f);
    struct tbuf *gates = out_f32(x, "gates", L * N * 4 * C, -1.0f, 1.0f);
    struct tbuf *dx = out_f32(x, "dx", L * N * IC, -1.0f, 1.0f);
    struct tbuf *dh0 = out_f32(x, "dh0", N * C, -1.0f, 1.0f);
    struct tbuf *dwih = out_f32(x, "dw_ih", 3 * C * IC, -1.0f, 1.0f);
    struct tbuf *dbih = out_f32(x, "db_ih", 3 * C, -1.0f, 1.0f);
    struct tbuf *dwhh = out_f32(x, "dw_hh", 3 * C * C, -1.0f, 1.0f);
    struct tbuf *dbhh = out_f32(x, "db_hh", 3 * C, -1.0f, 1.0f);
    struct tbuf *ch = out_f32(x, "cell_h", N * C, -1.0f, 1.0f);
    struct tbuf *cg = out_f32(x, "cell_gates", N * 4 * C, -1.0f, 1.0f);
    struct tbuf *cdx = out_f32(x, "cell_dx", N * IC, -1.0f, 1.0f);
    struct tbuf *cdh = out_f32(x, "cell_dh", N * C, -1.0f, 1.0f);
    struct tbuf *cdw = out_f32(x, "cell_dw_hh", 3 * C * C, -1.0f, 1.0f);
    struct tbuf *dscr = scratch_f32(x, "scratch", (fs > bs ? fs : bs) + cs);
    qc_gru_forward_cpu(F(hs), F(gates), F(xs), F(h0), F(wih), F(bih), F(whh), F(bhh), L, N, IC, C,
                       scr);
    qc_gru_backward_cpu(F(dx), F(dh0), F(dwih), F(dbih), F(dwhh), F(dbhh), F(dlast), F(shs), F(sg),
                        F(xs), F(wih), F(whh), L, N, IC, C, scr);
    /* cell: step 0 of the sequence (x_0, h0), backward from dh_last into its own outputs */
    qc_gru_cell_forward_cpu(F(ch), F(cg), F(xs), F(h0), F(wih), F(bih), F(whh), F(bhh), N, IC, C,
                            scr);
    qc_gru_cell_backward_cpu(F(cdx), F(cdh), NULL, NULL, F(cdw), NULL, F(dlast), F(sg), F(xs),
                             F(h0), F(wih), F(whh), N, IC, C, scr);
    float *ds = DF(dscr);
    CUDA_TWICE(
        x,
        (qc_gru_forward_cuda(DF(hs), DF(gates), DF(xs), DF(h0), DF(wih), DF(bih), DF(whh), DF(bhh),
                             L, N, IC, C, ds, x->g.s),
         qc_gru_backward_cuda(DF(dx), DF(dh0), DF(dwih), DF(dbih), DF(dwhh), DF(dbhh), DF(dlast),
                              DF(shs), DF(sg), DF(xs), DF(wih), DF(whh), L, N, IC, C, ds, x->g.s),
         qc_gru_cell_forward_cuda(DF(ch), DF(cg), DF(xs), DF(h0), DF(wih), DF(bih), DF(whh),
                                  DF(bhh), N, IC, C, ds, x->g.s),
         qc_gru_cell_backward_cuda(DF(cdx), DF(cdh), NULL, NULL, DF(cdw), NULL, DF(dlast), DF(sg),
                                   DF(xs), DF(h0), DF(wih), DF(whh), N, IC, C, ds, x->g.s)));
    free(hscpu);
    free(gcpu);
    free(scr);
}

/* The cuDNN GRU (extra path): N = n sequences, d1 = L, d2 = C. Forward states y = hs[1..L] and
 * h_last; backward dx, dh0 and the four parameter gradients (ACCUM), against the CPU op. */
static void run_gru_cudnn(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, L = tc->d1, C = tc->d2, IC = C;
    struct qc_gru_cudnn *g = NULL;
    if (qc_gru_cudnn_create(L, N, IC, C, x->g.s, &g) != QC_OK) {
        case_fail(x, "qc_gru_cudnn_create", qc_error_last());
        return;
    }
    size_t wb, kb, rb;
    qc_gru_cudnn_sizes(g, &wb, &kb, &rb);
    struct tbuf *xs = in_f32(x, "x", L * N * IC, -1.0f, 1.0f);
    struct tbuf *h0 = in_f32(x, "h0", N * C, -1.0f, 1.0f);
    struct tbuf *wih = in_f32(x, "w_ih", 3 * C * IC, -0.15f, 0.15f);
    struct tbuf *bih = in_f32(x, "b_ih", 3 * C, -0.1f, 0.1f);
    struct tbuf *whh = in_f32(x, "w_hh", 3 * C * C, -0.15f, 0.15f);
    struct tbuf *bhh = in_f32(x, "b_hh", 3 * C, -0.1f, 0.1f);
    struct tbuf *dlast = in_f32(x, "dh_last", N * C, -1.0f, 1.0f);
    struct tbuf *y = out_f32(x, "y", L * N * C, -1.0f, 1.0f);
    struct tbuf *hl = out_f32(x, "h_last", N * C, -1.0f, 1.0f);
    struct tbuf *dx = out_f32(x, "dx", L * N * IC, -1.0f, 1.0f);
    struct tbuf *dh0 = out_f32(x, "dh0", N * C, -1.0f, 1.0f);
    struct tbuf *dwih = out_f32(x, "dw_ih", 3 * C * IC, -1.0f, 1.0f);
    struct tbuf *dbih = out_f32(x, "db_ih", 3 * C, -1.0f, 1.0f);
    struct tbuf *dwhh = out_f32(x, "dw_hh", 3 * C * C, -1.0f, 1.0f);
    struct tbuf *dbhh = out_f32(x, "db_hh", 3 * C, -1.0f, 1.0f);
    struct tbuf *ws = scratch_f32(x, "wspace", (int64_t)(wb / sizeof(float)) + 64);
    struct tbuf *dws = scratch_f32(x, "dwspace", (int64_t)(wb / sizeof(float)) + 64);
    struct tbuf *work = scratch_f32(x, "work", (int64_t)(kb / sizeof(float)) + 64);
    struct tbuf *res = scratch_f32(x, "reserve", (int64_t)(rb / sizeof(float)) + 64);
    int64_t fs = qc_gru_forward_scratch_numel(L, N, C), bs = qc_gru_backward_scratch_numel(L, N, C);
    float *scr = malloc((size_t)(fs > bs ? fs : bs) * sizeof(float));
    float *hs = malloc((size_t)((L + 1) * N * C) * sizeof(float));
    float *gates = malloc((size_t)(L * N * 4 * C) * sizeof(float));
    qc_gru_forward_cpu(hs, gates, F(xs), F(h0), F(wih), F(bih), F(whh), F(bhh), L, N, IC, C, scr);
    memcpy(F(y), hs + N * C, (size_t)(L * N * C) * sizeof(float));
    memcpy(F(hl), hs + L * N * C, (size_t)(N * C) * sizeof(float));
    qc_gru_backward_cpu(F(dx), F(dh0), F(dwih), F(dbih), F(dwhh), F(dbhh), F(dlast), hs, gates,
                        F(xs), F(wih), F(whh), L, N, IC, C, scr);
    enum qc_status st[3] = {QC_OK, QC_OK, QC_OK};
    CUDA_TWICE(
        x, (st[0] = qc_gru_cudnn_pack_weights(g, ws->d, DF(wih), DF(bih), DF(whh), DF(bhh), x->g.s),
            st[1] = qc_gru_forward_cudnn(g, DF(y), DF(hl), DF(xs), DF(h0), ws->d, work->d, res->d,
                                         x->g.s),
            st[2] = qc_gru_backward_cudnn(g, DF(dx), DF(dh0), DF(dwih), DF(dbih), DF(dwhh),
                                          DF(dbhh), DF(dlast), DF(y), DF(xs), DF(h0), ws->d, dws->d,
                                          work->d, res->d, x->g.s)));
    for (int i = 0; i < 3; i++)
        if (st[i] != QC_OK)
            case_fail(x, "cuDNN call", qc_error_last());
    qc_gru_cudnn_destroy(g);
    free(scr);
    free(hs);
    free(gates);
}

// ---- runners: losses, AdamW
// ----------------------------------------------------------------------------

/* N = n rows, d1 = K. log_softmax and logsumexp, forward and backward. */
static void run_rowwise(struct tctx *x, const struct tcase *tc)
{
    int64_t N = tc->n, K = tc->d1;
    struct tbuf *in = in_f32(x, "inp", N * K, -8.0f, 8.0f);
    struct tbuf *dout = in_f32(x, "dout", N * K, -1.0f, 1.0f);
    struct tbuf *dout1 = in_f32(x, "dout_row", N, -1.0f, 1.0f);
    float *ls = malloc((size_t)(N * K + 1) * sizeof(float)), *lse = malloc((size_t)(N + 1) * 4);
    qc_log_softmax_forward_cpu(ls, F(in), N, K);
    qc_logsumexp_forward_cpu(lse, F(in), N, K);
    struct tbuf *sls = in_f32_from(x, "saved_log_softmax", ls, N * K);
    struct tbuf *slse = in_f32_from(x, "saved_logsumexp", lse, N);
    struct tbuf *o1 = out_f32(x, "log_softmax", N * K, -1.0f, 1.0f);
    struct tbuf *d1 = out_f32(x, "log_softmax_bwd", N * K, -1.0f, 1.0f);
    struct tbuf *o2 = out_f32(x, "logsumexp", N, -1.0f, 1.0f);
    struct tbuf *d2 = out_f32(x, "logsumexp_bwd", N * K, -1.0f, 1.0f);
    qc_log_softmax_forward_cpu(F(o1), F(in), N, K);
    qc_log_softmax_backward_cpu(F(d1), F(dout), F(sls), N, K);
    qc_logsumexp_forward_cpu(F(o2), F(in), N, K);
    qc_logsumexp_backward_cpu(F(d2), F(dout1), F(in), F(slse), N, K);
    CUDA_TWICE(x, (qc_log_softmax_forward_cuda(DF(o1), DF(in), N, K, x->g.s),
                   qc_log_softmax_backward_cuda(DF(d1), DF(dout), DF(sls), N, K, x->g.s),
                   qc_logsumexp_forward_cuda(DF(o2), DF(in), N, K, x->g.s),
                   qc_logsumexp_backward_cuda(DF(d2), DF(dout1), DF(in), DF(slse), N, K, x->g.s)));
    free(ls);
    free(lse);
}

static void run_laplace(struct tctx *x, const struct tcase *tc)
{
    int64_t n = tc->n;
    struct tbuf *mu = in_f32(x, "mu", n, -5.0f, 5.0f);
    struct tbuf *sc = in_f32(x, "scale", n, 0.1f, 3.0f);
    struct tbuf *y = in_f32(x, "y", n, -5.0f, 5.0f);
    struct tbuf *dn = in_f32(x, "dnll", n, -1.0f, 1.0f);
    struct tbuf *nll = out_f32(x, "nll", n, -1.0f, 1.0f);
    struct tbuf *dmu = out_f32(x, "dmu", n, -1.0f, 1.0f);
    struct tbuf *dsc = out_f32(x, "dscale", n, -1.0f, 1.0f);
    qc_laplace_nll_forward_cpu(F(nll), F(mu), F(sc), F(y), n);
    qc_laplace_nll_backward_cpu(F(dmu), F(dsc), F(dn), F(mu), F(sc), F(y), n);
    CUDA_TWICE(x, (qc_laplace_nll_forward_cuda(DF(nll), DF(mu), DF(sc), DF(y), n, x->g.s),
                   qc_laplace_nll_backward_cuda(DF(dmu), DF(dsc), DF(dn), DF(mu), DF(sc), DF(y), n,
                                                x->g.s)));
}

/* A = n agents, d1 = K modes, d2 = S steps; gt stride 3. best mode, regression loss and the
 * mixture NLL, forward and backward. */
static void run_losses(struct tctx *x, const struct tcase *tc)
{
    int64_t A = tc->n, K = tc->d1, S = tc->d2, gs = 3;
    struct tbuf *loc = in_f32(x, "loc", A * K * S * 2, -20.0f, 20.0f);
    struct tbuf *scl = in_f32(x, "scale", A * K * S * 2, 0.1f, 4.0f);
    struct tbuf *gt = in_f32(x, "gt", A * S * gs, -20.0f, 20.0f);
    struct tbuf *pi = in_f32(x, "pi", A * K, -3.0f, 3.0f);
    struct tbuf *mask = in_mask(x, "reg_mask", A * S, 0.8f);
    struct tbuf *cmask = in_mask(x, "cls_mask", A, 0.7f);
    float one = 1.0f;
    struct tbuf *dloss = in_f32_from(x, "dloss", &one, 1);
    int64_t *bcpu = malloc((size_t)(A + 1) * sizeof(int64_t));
    qc_best_mode_cpu(bcpu, F(loc), F(gt), gs, U(mask), A, K, S);
    struct tbuf *sbest = in_i64_from(x, "saved_best", bcpu, A);
    struct tbuf *best = out_i64(x, "best", A);
    struct tbuf *lreg = out_f32(x, "reg_loss", 1, -1.0f, 1.0f);
    struct tbuf *dloc = out_f32(x, "dloc", A * K * S * 2, -1.0f, 1.0f);
    struct tbuf *dscl = out_f32(x, "dscale", A * K * S * 2, -1.0f, 1.0f);
    struct tbuf *lcls = out_f32(x, "cls_loss", 1, -1.0f, 1.0f);
    struct tbuf *dpi = out_f32(x, "dpi", A * K, -1.0f, 1.0f);
    int64_t rs = qc_reg_loss_scratch_numel(A, S);
    float *scr = malloc((size_t)(rs + 1) * sizeof(float));
    struct tbuf *dscr = scratch_f32(x, "scratch", rs);
    qc_best_mode_cpu(I(best), F(loc), F(gt), gs, U(mask), A, K, S);
    qc_reg_loss_forward_cpu(F(lreg), F(loc), F(scl), I(sbest), F(gt), gs, U(mask), NULL, A, K, S,
                            scr);
    qc_reg_loss_backward_cpu(F(dloc), F(dscl), F(dloss), F(loc), F(scl), I(sbest), F(gt), gs,
                             U(mask), NULL, A, K, S, scr);
    qc_mixture_nll_forward_cpu(F(lcls), F(pi), F(loc), F(scl), F(gt), gs, U(mask), U(cmask), NULL,
                               A, K, S);
    qc_mixture_nll_backward_cpu(F(dpi), F(dloss), F(pi), F(loc), F(scl), F(gt), gs, U(mask),
                                U(cmask), NULL, A, K, S);
    CUDA_TWICE(
        x, (qc_best_mode_cuda(DI(best), DF(loc), DF(gt), gs, DU(mask), A, K, S, x->g.s),
            qc_reg_loss_forward_cuda(DF(lreg), DF(loc), DF(scl), DI(sbest), DF(gt), gs, DU(mask),
                                     NULL, A, K, S, DF(dscr), x->g.s),
            qc_reg_loss_backward_cuda(DF(dloc), DF(dscl), DF(dloss), DF(loc), DF(scl), DI(sbest),
                                      DF(gt), gs, DU(mask), NULL, A, K, S, DF(dscr), x->g.s),
            qc_mixture_nll_forward_cuda(DF(lcls), DF(pi), DF(loc), DF(scl), DF(gt), gs, DU(mask),
                                        DU(cmask), NULL, A, K, S, x->g.s),
            qc_mixture_nll_backward_cuda(DF(dpi), DF(dloss), DF(pi), DF(loc), DF(scl), DF(gt), gs,
                                         DU(mask), DU(cmask), NULL, A, K, S, x->g.s)));
    free(bcpu);
    free(scr);
}

/* n elements, d1 = segments. Flat step, segmented step, multi-tensor step over the segments
 * as separate tensors (the decay flags alternate). State (m, v, param) starts random. */
static void run_adamw(struct tctx *x, const struct tcase *tc)
{
    int64_t n = tc->n, nseg = tc->d1 < n ? tc->d1 : n;
    struct qc_adamw_hparams hp = {5e-4, 0.9, 0.999, 1e-8, 1e-4, 7};
    struct tbuf *g = in_f32(x, "grad", n, -1.0f, 1.0f);
    int64_t *off = malloc((size_t)(nseg + 1) * sizeof(int64_t));
    uint8_t *dec = malloc((size_t)(nseg + 1));
    off[0] = 0;
    for (int64_t s = 1; s < nseg; s++) /* sorted random cut points; empty segments possible */
        off[s] = (int64_t)(qc_test_rand(&x->rng) % (uint64_t)(n + 1));
    off[nseg] = n;
    for (int64_t s = 1; s < nseg; s++)
        for (int64_t j = s; j > 1 && off[j - 1] > off[j]; j--) {
            int64_t t = off[j];
            off[j] = off[j - 1];
            off[j - 1] = t;
        }
    for (int64_t s = 0; s < nseg; s++)
        dec[s] = (uint8_t)(s & 1);
    struct tbuf *offb = in_i64_from(x, "offsets", off, nseg + 1);
    struct tbuf *decb = tb_new(x, "decay", TB_U8, TB_IN, nseg);
    memcpy(decb->h, dec, (size_t)nseg);
    tb_upload(decb, decb->h);
    struct tbuf *p1 = out_f32(x, "param", n, -1.0f, 1.0f);
    struct tbuf *m1 = out_f32(x, "m", n, -0.1f, 0.1f);
    struct tbuf *v1 = out_f32(x, "v", n, 0.0f, 0.01f);
    struct tbuf *p2 = out_f32(x, "param_seg", n, -1.0f, 1.0f);
    struct tbuf *m2 = out_f32(x, "m_seg", n, -0.1f, 0.1f);
    struct tbuf *v2 = out_f32(x, "v_seg", n, 0.0f, 0.01f);
    struct tbuf *p3 = out_f32(x, "param_multi", n, -1.0f, 1.0f);
    struct tbuf *m3 = out_f32(x, "m_multi", n, -0.1f, 0.1f);
    struct tbuf *v3 = out_f32(x, "v_multi", n, 0.0f, 0.01f);
    qc_adamw_step_cpu(F(p1), F(m1), F(v1), F(g), n, &hp);
    qc_adamw_step_segments_cpu(F(p2), F(m2), F(v2), F(g), off, dec, nseg, &hp);
    qc_adamw_step_segments_cpu(F(p3), F(m3), F(v3), F(g), off, dec, nseg, &hp);
    struct qc_adamw_tensor *list = malloc((size_t)(nseg + 1) * sizeof(*list));
    for (int64_t s = 0; s < nseg; s++) {
        list[s].param = DF(p3) + off[s];
        list[s].m = DF(m3) + off[s];
        list[s].v = DF(v3) + off[s];
        list[s].grad = DF(g) + off[s];
        list[s].n = off[s + 1] - off[s];
        list[s].decay = dec[s] != 0;
    }
    CUDA_TWICE(x, (qc_adamw_step_cuda(DF(p1), DF(m1), DF(v1), DF(g), n, &hp, x->g.s),
                   qc_adamw_step_segments_cuda(DF(p2), DF(m2), DF(v2), DF(g), DI(offb), DU(decb),
                                               nseg, &hp, x->g.s),
                   qc_adamw_step_multi_cuda(list, nseg, &hp, x->g.s)));
    free(off);
    free(dec);
    free(list);
}

// ---- the case table
// ------------------------------------------------------------------------------------

/* Four rows per op: main dimension 1, 7, 769 and the AV2-size value. */
#define CASES(op, fn, av2, d1, d2, atol, rtol, nmse, why)                                          \
    {op, fn, 1, d1, d2, atol, rtol, nmse, why}, {op, fn, 7, d1, d2, atol, rtol, nmse, why},        \
        {op, fn, 769, d1, d2, atol, rtol, nmse, why},                                              \
    {                                                                                              \
        op, fn, av2, d1, d2, atol, rtol, nmse, why                                                 \
    }

#define EXACT "bit-identical: same operations in the CPU's order, no transcendental"

static const struct tcase cases[] = {
    /* AV2 batch of 4 scenes: ~240 agents x 50 steps x 128 = 1.5M activations per tensor */
    CASES("relu", run_relu, 1536000, 0, 0, 0.0, 0.0, 0.0, EXACT),
    CASES("elu", run_elu, 1536000, 0, 0, 1e-6, 4e-7, 1e-12,
          "expm1f: CUDA <= 1 ulp vs glibc <= 1 ulp of |y| <= 1"),
    CASES("sigmoid", run_sigmoid, 1536000, 0, 0, 1e-6, 4e-7, 1e-12,
          "expf and the division: a few ulp of y in (0,1)"),
    CASES("tanh", run_tanh, 1536000, 0, 0, 1e-6, 4e-7, 1e-12, "tanhf: CUDA 2 ulp vs glibc 1 ulp"),
    CASES("wrap_angle", run_wrap_angle, 1536000, 0, 0, 0.0, 0.0, 0.0,
          "bit-identical: one add, an exact fmodf, one add"),
    CASES("angle_between_2d", run_angle_between, 288000, 0, 0, 1e-6, 4e-7, 1e-12,
          "products rounded as on CPU (no FMA); atan2f differs by <= 2 ulp of |angle| <= pi"),
    CASES("add/add_scalar/gate_update", run_arith, 1536000, 0, 0, 1e-6, 1e-6, 1e-12,
          "add exact; u + g*(s-u) may contract to one FMA: 1 ulp of |values| <= 4"),
    CASES("dropout", run_dropout, 1536000, 0, 0, 0.0, 0.0, 0.0,
          "same Philox mask bit for bit and the same x*scale product"),
    /* rows = agent-steps of a batch; IC 128 -> OC 512 is the FFN's first layer */
    CASES("linear", run_linear, 48000, 128, 512, 2e-3, 2e-5, 1e-11,
          "cuBLAS and OpenBLAS sum the K terms in different orders: |err| ~ sqrt(K)*eps*|terms|;"
          " dweight sums N = 48000 rows of |terms| <= 1 (atol)"),
    CASES("layernorm", run_layernorm, 48000, 128, 0, 2e-5, 2e-5, 1e-11,
          "statistics in double on both (tree vs sequential order): ~1 ulp; FMA in the affine"),
    CASES("embedding", run_embedding, 12000, 17, 128, 0.0, 0.0, 0.0,
          "bit-identical: lookups, and the table gradient summed in ascending n as on CPU"),
    CASES("cumsum", run_cumsum, 1440, 60, 2, 0.0, 0.0, 0.0,
          "bit-identical: fp32 scans in the CPU's order"),
    CASES("copy2d/repeat/tile/transpose", run_layout, 1440, 6, 128, 0.0, 0.0, 0.0,
          "bit-identical: copies, and repeat sums in ascending r"),
    /* edges of a batch: a2a / pl2a / t2m sets reach a few 1e5 */
    CASES("gather/scatter (csr perm)", run_gather_scatter, 400000, 128, 0, 0.0, 0.0, 0.0,
          "bit-identical: per-segment sums in CSR order, no FMA possible"),
    CASES("gather/scatter (sorted)", run_gather_scatter, 400000, 128, 1, 0.0, 0.0, 0.0,
          "bit-identical: per-segment sums in CSR order, no FMA possible"),
    CASES("attention score/softmax/aggregate", run_attention, 400000, 0, 0, 2e-6, 2e-5, 1e-11,
          "sums of 16 products and of ~8 edges in the CPU's order, FMA-contracted on GPU; expf"
          " a few ulp"),
    /* Fourier: edge features (d = 3 for pl2a / a2a) */
    CASES("fourier features", run_fourier, 50000, 3, 64, 1e-4, 1e-5, 1e-11,
          "sincosf vs sinf/cosf: 2 ulp at |theta| <= 32; dc, dfreqs are double sums of 64 / N "
          "terms of magnitude <= 60 (atol)"),
    /* decoder GRU: N = K*A = 6 x 240 sequences, L = 60 steps */
    CASES("gru", run_gru, 1440, 60, 128, 2e-4, 1e-3, 1e-9,
          "60 recurrent cuBLAS GEMMs (sum order differs from OpenBLAS) compound through the "
          "gates; dW sums L*N = 86400 rows (atol)"),
    CASES("gru (cuDNN)", run_gru_cudnn, 1440, 60, 128, 5e-4, 2e-3, 1e-8,
          "cuDNN's own GEMM / gate kernels (FMA math, no TF32) vs OpenBLAS over 60 recurrent "
          "steps; dW sums L*N = 86400 rows (atol)"),
    CASES("log_softmax/logsumexp", run_rowwise, 1440, 6, 0, 2e-6, 2e-6, 1e-12,
          "expf / logf: a few ulp over K = 6 terms"),
    CASES("laplace_nll", run_laplace, 576000, 0, 0, 2e-6, 2e-6, 1e-12,
          "logf: <= 1 ulp; divisions IEEE on both"),
    CASES("best_mode/reg_loss/mixture_nll", run_losses, 240, 6, 60, 1e-5, 1e-5, 1e-10,
          "logf/expf ulps inside double sums in the CPU's order; best mode exact (distances "
          "without FMA)"),
    /* the full model: 7,660,673 parameters in 935 tensors */
    CASES("adamw (flat/segments/multi)", run_adamw, 7660673, 935, 0, 1e-7, 2e-6, 1e-12,
          "same fp32 operation order; FMA contraction of the lerp / update: 1 ulp of p"),
};

// ---- the op context: streams and uploads -------------------------------------------------------

static void *dev_buf(struct tctx *x, size_t bytes)
{
    void *p = NULL;
    if (qc_alloc_malloc(x->g.alloc, bytes, NULL, "test", &p) != QC_OK)
        T_FATAL("device allocation of %zu bytes: %s", bytes, qc_error_last());
    return p;
}

/* A GEMM on a stream that is then destroyed, then one on the compute stream: the context must
 * have forgotten the dead stream (before the fix it recorded its join event there). */
static void test_context_streams(struct tctx *x)
{
    QC_TEST ("cuda: the op context forgets a destroyed stream") {
        enum { N = 4, IC = 8, OC = 3 };
        float in[N * IC], w[OC * IC], ref[N * OC], out[N * OC];
        for (int i = 0; i < N * IC; i++)
            in[i] = (float)(i % 5) - 2.0f;
        for (int i = 0; i < OC * IC; i++)
            w[i] = (float)(i % 3) - 1.0f;
        qc_linear_forward_cpu(ref, in, IC, w, NULL, N, IC, OC, false); /* small integers: exact */
        float *din = dev_buf(x, sizeof in), *dw = dev_buf(x, sizeof w);
        float *dout = dev_buf(x, sizeof out);
        T_EXPECT(cudaMemcpy(din, in, sizeof in, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
        T_EXPECT(cudaMemcpy(dw, w, sizeof w, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
        struct qc_stream *tmp = NULL;
        T_EXPECT(qc_stream_create(x->g.dev, QC_STREAM_COMPUTE, &tmp) == QC_OK, "%s",
                 qc_error_last());
        qc_linear_forward_cuda(dout, din, IC, dw, NULL, N, IC, OC, false,
                               (cudaStream_t)qc_stream_native(tmp));
        qc_stream_destroy(tmp); /* drains, then the context forgets it */
        T_EXPECT(cudaMemsetAsync(dout, 0, sizeof out, x->g.s) == cudaSuccess, "memset");
        qc_linear_forward_cuda(dout, din, IC, dw, NULL, N, IC, OC, false, x->g.s);
        T_EXPECT(cudaStreamSynchronize(x->g.s) == cudaSuccess, "%s",
                 cudaGetErrorString(cudaGetLastError()));
        T_EXPECT(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess,
                 "download");
        for (int i = 0; i < N * OC; i++)
            T_EXPECT(out[i] == ref[i], "out[%d] = %g, expected %g", i, (double)out[i],
                     (double)ref[i]);
        qc_alloc_free(x->g.alloc, dout, NULL);
        qc_alloc_free(x->g.alloc, dw, NULL);
        qc_alloc_free(x->g.alloc, din, NULL);
    }
}

/* qc_upload_cuda through a context with a staging ring: pageable sources (several chunks, the
 * ring wrapping) are reusable on return; a pinned source goes straight. */
static void test_upload_ring(struct tctx *x)
{
    QC_TEST ("cuda: uploads stage pageable memory through the pinned ring") {
        struct qc_pinned *pin = NULL;
        void *ring = NULL;
        struct qc_kernels_cuda *k = NULL;
        T_EXPECT(qc_pinned_create(x->g.dev, 0, &pin) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_pinned_malloc(pin, QC_KERNELS_CUDA_STAGING_BYTES, 4096, "ring", &ring) == QC_OK,
                 "%s", qc_error_last());
        const struct qc_kernels_cuda_params kp = {.device = 0,
                                                  .tf32 = false,
                                                  .workspace = x->g.ws,
                                                  .workspace_bytes =
                                                      QC_KERNELS_CUDA_WORKSPACE_BYTES,
                                                  .staging = ring,
                                                  .staging_bytes = QC_KERNELS_CUDA_STAGING_BYTES};
        T_EXPECT(qc_kernels_cuda_create(&kp, &k) == QC_OK, "%s", qc_error_last());
        qc_kernels_cuda_set_current(k);
        const size_t sizes[] = {1, 4097, 5 * ((size_t)1 << 20) + 3, 40 * ((size_t)1 << 20) + 7};
        for (int i = 0; i < 4; i++) {
            const size_t n = sizes[i];
            unsigned char *src = malloc(n), *back = malloc(n);
            unsigned char *d = dev_buf(x, n);
            if (!src || !back)
                T_FATAL("out of host memory");
            for (size_t j = 0; j < n; j++)
                src[j] = (unsigned char)(j * 131u + (unsigned)i);
            T_EXPECT(qc_upload_cuda(d, src, n, x->g.s) == QC_OK, "%s", qc_error_last());
            memset(src, 0xEE, n); /* pageable: reusable as soon as the call returns */
            T_EXPECT(cudaMemcpyAsync(back, d, n, cudaMemcpyDeviceToHost, x->g.s) == cudaSuccess &&
                         cudaStreamSynchronize(x->g.s) == cudaSuccess,
                     "download");
            size_t bad = 0;
            for (size_t j = 0; j < n; j++)
                bad += back[j] != (unsigned char)(j * 131u + (unsigned)i);
            T_EXPECT_EQ_U64(bad, 0, "bytes wrong after a staged upload of %zu bytes", n);
            qc_alloc_free(x->g.alloc, d, NULL);
            free(back);
            free(src);
        }
        /* a pinned source: straight copy */
        unsigned char *ps = NULL;
        T_EXPECT(qc_pinned_malloc(pin, 1 << 20, 64, "src", (void **)&ps) == QC_OK, "%s",
                 qc_error_last());
        memset(ps, 0x5A, 1 << 20);
        unsigned char *d = dev_buf(x, 1 << 20), *back = malloc(1 << 20);
        T_EXPECT(qc_upload_cuda(d, ps, 1 << 20, x->g.s) == QC_OK, "%s", qc_error_last());
        T_EXPECT(cudaMemcpyAsync(back, d, 1 << 20, cudaMemcpyDeviceToHost, x->g.s) == cudaSuccess &&
                     cudaStreamSynchronize(x->g.s) == cudaSuccess,
                 "download");
        T_EXPECT(back && back[0] == 0x5A && back[(1 << 20) - 1] == 0x5A, "pinned upload");
        free(back);
        qc_alloc_free(x->g.alloc, d, NULL);
        qc_kernels_cuda_set_current(x->g.kctx);
        qc_kernels_cuda_destroy(k);
        qc_pinned_destroy(pin); /* the ring and ps with it */
    }
}

// ---- main
// ----------------------------------------------------------------------------------------------

int main(int argc, char **argv)
{
    const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
    if (probe != 0)
        return probe;
    const char *filter = argc > 1 ? argv[1] : NULL;
    struct tctx x;
    memset(&x, 0, sizeof(x));
    for (int i = 0; i < GUARD; i++)
        x.pattern[i] = (unsigned char)(0xA5 ^ (i * 37 + 11));
    if (kt_gpu_open(&x.g, 0xA5) != 0)
        return 1;
    g_stream = x.g.s;
    x.rng = qc_test_seed();

    int64_t ncases = (int64_t)(sizeof(cases) / sizeof(cases[0]));
    for (int64_t i = 0; i < ncases; i++) {
        const struct tcase *tc = &cases[i];
        if (filter && !strstr(tc->op, filter))
            continue;
        char name[160];
        snprintf(name, sizeof(name), "cuda vs cpu: %s, n = %" PRId64, tc->op, tc->n);
        QC_TEST (name) {
            x.tc = tc;
            x.bad = 0;
            tc->run(&x, tc);
            check_case(&x);
            free_case(&x);
        }
    }

    QC_TEST ("cuda: context rejects a missing workspace") {
        struct qc_kernels_cuda_params bad = {.device = 0, .tf32 = false, .workspace = NULL};
        struct qc_kernels_cuda *k = NULL;
        T_EXPECT(qc_kernels_cuda_create(&bad, &k) == QC_ERR_INVALID && k == NULL,
                 "create without workspace must fail");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "hint:");
    }

    test_context_streams(&x);
    test_upload_ring(&x);

    kt_gpu_close(&x.g);
    return qc_test_summary();
}
