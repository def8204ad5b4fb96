/*
 * test_exec.c — the op dispatch (kernels/qc_exec.h) and the emulated device (base/qc_emu.h).
 *
 *   test_exec          (label cpu) the emu arena: fresh and freed blocks hold 0xFF, reuse after
 *                      free, coalescing, exhaustion, nested enter/leave, and a host touch outside
 *                      enter that faults (a forked child must die of SIGSEGV); the memory moves
 *                      (zero, copy, upload, download, sync) on CPU and EMU; a case table of ops
 *                      run through qc_op_* on EMU against the _cpu op on CPU: memcmp-identical.
 *   test_exec --cuda   (label gpu, ctest name test_exec_cuda) the memory moves and the same case
 *                      table through qc_op_* on CUDA against the _cpu op, within the tolerances
 *                      of tests/test_kernels_cuda.c. Exits 77 without a GPU or in a CPU-only
 *                      build.
 *
 * Each case: inputs random on the host and uploaded with qc_op_upload into allocator memory
 * (an allocator over an emu arena on EMU; cudaMalloc segments on CUDA); every output starts from
 * the same random content on both sides (so an ACCUM output is checked as +=, and an OVERWRITE
 * element the backend forgot to write mismatches). The case body is written once: OP(name,
 * args) calls qc_<name>_cpu on the host copies in the CPU phase and qc_op_<name>(ex, ...) on
 * the device copies in the device phase, so a wrapper of exec.c that passes an argument wrong
 * shows up as a mismatch. Outputs come back with qc_op_download. Also checked: inputs unchanged
 * on the device, 4 KiB byte-pattern guard bands before and after every device buffer, and (EMU)
 * that device memory is closed again after the op.
 *
 * Run: ./test_exec [--cuda] (QC_TEST_FILTER=substring selects tests; QC_TEST_SEED the inputs).
 */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef QC_HAVE_CUDA
#    include <cuda_runtime.h>
#endif

#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_emu.h"
#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_status.h"
#include "cuda_probe.h"
#include "testutil.h"

#ifdef QC_HAVE_CUDA
#    include "kernels_cuda_testlib.h"
#endif

#define GUARD     4096 /* bytes of byte pattern before and after every device buffer */
#define MAX_BUFS  40
#define MAX_SHOWN 10 /* mismatches printed per output */

// ---- emulated device memory: a touch outside enter faults ---------------------------------

/* True when reading the byte at p kills a forked child with SIGSEGV (p is PROT_NONE). The
 * child restores the default action first, so a sanitizer's handler does not turn the fault
 * into an exit code. */
static bool touch_faults(const void *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        T_FATAL("fork failed");
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        volatile const unsigned char *q = p;
        unsigned char c = *q;
        _exit(c == 0x5A ? 3 : 2); /* reached only when the read did not fault */
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        T_FATAL("waitpid failed");
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

/* Every byte of p[0..n) equals b. */
static bool all_bytes(const void *p, size_t n, unsigned char b)
{
    const unsigned char *q = p;
    for (size_t i = 0; i < n; i++)
        if (q[i] != b)
            return false;
    return true;
}

static void test_emu_arena(void)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);

    QC_TEST ("emu: fresh and freed blocks hold 0xFF; a freed block is reused") {
        struct qc_emu *e = NULL;
        if (qc_emu_create(16 * pg, &e) != QC_OK)
            T_FATAL("qc_emu_create: %s", qc_error_last());
        unsigned char *a = qc_emu_alloc(e, 100);
        T_EXPECT(a && (uintptr_t)a % pg == 0, "page-aligned block, got %p", (void *)a);
        T_EXPECT_EQ_U64(qc_emu_bytes_live(e), pg, "100 bytes take one page");
        qc_emu_enter(e);
        T_EXPECT(all_bytes(a, pg, 0xFF), "fresh block is not all 0xFF");
        memset(a, 0x11, pg);
        qc_emu_leave(e);
        qc_emu_free(e, a, 100);
        T_EXPECT_EQ_U64(qc_emu_bytes_live(e), 0, "live after free");
        unsigned char *b = qc_emu_alloc(e, pg);
        T_EXPECT(b == a, "freed block not reused: %p vs %p", (void *)b, (void *)a);
        qc_emu_enter(e);
        T_EXPECT(all_bytes(b, pg, 0xFF), "freed block not refilled with 0xFF");
        qc_emu_leave(e);
        unsigned char *z = qc_emu_alloc(e, 0);
        T_EXPECT(z == a + pg, "size 0 is one page after the first: %p", (void *)z);
        T_EXPECT_EQ_U64(qc_emu_bytes_peak(e), 2 * pg, "peak");
        qc_emu_free(e, z, 0);
        qc_emu_free(e, b, pg);
        qc_emu_free(e, NULL, 0);
        qc_emu_destroy(e);
        qc_emu_destroy(NULL);
    }

    QC_TEST ("emu: a free range at the high-water mark returns to the reservation") {
        struct qc_emu *e = NULL;
        const size_t res = (size_t)2 << 20, npg = res / pg;
        if (qc_emu_create(res, &e) != QC_OK)
            T_FATAL("qc_emu_create: %s", qc_error_last());
        unsigned char *a = qc_emu_alloc(e, pg), *b = qc_emu_alloc(e, 2 * pg);
        T_EXPECT(a && b == a + pg, "two adjacent blocks");
        qc_emu_free(e, b, 2 * pg); /* the tail first, then the rest: nothing left below hw */
        qc_emu_free(e, a, pg);
        /* Without the merge into the tail the 3-page hole could not serve the whole arena. */
        unsigned char *all = qc_emu_alloc(e, npg * pg);
        T_EXPECT(all == a, "the whole reservation after freeing the top: %p vs %p", (void *)all,
                 (void *)a);
        qc_emu_enter(e);
        T_EXPECT(all && all_bytes(all, npg * pg, 0xFF), "the whole arena holds 0xFF");
        qc_emu_leave(e);
        qc_emu_free(e, all, npg * pg);
        qc_emu_destroy(e);
    }

    QC_TEST ("emu: freed neighbours coalesce; exhaustion returns NULL") {
        struct qc_emu *e = NULL;
        /* The reservation is rounded up to whole 2 MiB huge pages: ask for exactly one. */
        const size_t res = (size_t)2 << 20, npg = res / pg;
        if (qc_emu_create(res, &e) != QC_OK)
            T_FATAL("qc_emu_create: %s", qc_error_last());
        unsigned char *a = qc_emu_alloc(e, pg), *b = qc_emu_alloc(e, pg);
        unsigned char *c = qc_emu_alloc(e, pg), *d = qc_emu_alloc(e, pg);
        T_EXPECT(b == a + pg && c == b + pg && d == c + pg, "blocks not adjacent");
        /* Free c, then a, then b: one 3-page range [a, d) from both sides. */
        qc_emu_free(e, c, pg);
        qc_emu_free(e, a, pg);
        qc_emu_free(e, b, pg);
        unsigned char *abc = qc_emu_alloc(e, 3 * pg);
        T_EXPECT(abc == a, "3 pages not served from the coalesced range: %p vs %p", (void *)abc,
                 (void *)a);
        qc_emu_enter(e);
        T_EXPECT(all_bytes(abc, 3 * pg, 0xFF), "coalesced range not 0xFF");
        qc_emu_leave(e);
        /* 4 pages used of npg: npg - 4 more fit, then NULL. */
        T_EXPECT(qc_emu_alloc(e, (npg - 3) * pg) == NULL, "one page past the reservation");
        unsigned char *rest = qc_emu_alloc(e, (npg - 4) * pg);
        T_EXPECT(rest == d + pg, "the rest of the reservation: %p", (void *)rest);
        T_EXPECT(qc_emu_alloc(e, 1) == NULL, "a full arena returns NULL");
        T_EXPECT_EQ_U64(qc_emu_bytes_live(e), npg * pg, "live");
        qc_emu_free(e, rest, (npg - 4) * pg);
        qc_emu_free(e, abc, 3 * pg);
        qc_emu_free(e, d, pg);
        T_EXPECT_EQ_U64(qc_emu_bytes_live(e), 0, "live after freeing everything");
        unsigned char *all = qc_emu_alloc(e, npg * pg);
        T_EXPECT(all == a, "the whole arena again after full coalescing: %p", (void *)all);
        qc_emu_free(e, all, npg * pg);
        qc_emu_destroy(e);
    }

    QC_TEST ("emu: closed outside enter (a touch faults), nested enter/leave") {
        struct qc_emu *e = NULL;
        if (qc_emu_create(16 * pg, &e) != QC_OK)
            T_FATAL("qc_emu_create: %s", qc_error_last());
        unsigned char *a = qc_emu_alloc(e, pg);
        T_EXPECT(touch_faults(a), "a host read outside enter did not fault");
        qc_emu_enter(e);
        T_EXPECT(!touch_faults(a), "a read inside enter faulted");
        qc_emu_enter(e);
        qc_emu_leave(e);
        T_EXPECT(!touch_faults(a), "closed by the inner leave of a nested pair");
        /* A block allocated while open is open too, and closes with the rest. */
        unsigned char *b = qc_emu_alloc(e, 2 * pg);
        b[2 * pg - 1] = 0x5A;
        T_EXPECT(!touch_faults(b + 2 * pg - 1), "block allocated while open is closed");
        qc_emu_leave(e);
        T_EXPECT(touch_faults(a), "open after the outer leave");
        T_EXPECT(touch_faults(b + 2 * pg - 1), "block allocated while open stays open");
        qc_emu_free(e, b, 2 * pg);
        T_EXPECT(touch_faults(b), "a freed block is readable");
        qc_emu_free(e, a, pg);
        qc_emu_destroy(e);
    }
}

// ---- the memory moves ----------------------------------------------------------------------

/* upload, device-to-device copy, zero of a middle range, download, sync: on ex's backend.
 * d1, d2 hold n bytes of device memory (host memory on CPU). */
static void check_moves(const struct qc_exec *ex, void *d1, void *d2, size_t n, const char *what)
{
    unsigned char *src = malloc(n), *h1 = malloc(n), *h2 = malloc(n), *want = malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131 + 7);
    T_EXPECT(qc_op_upload(ex, d1, src, n) == QC_OK, "%s: upload: %s", what, qc_error_last());
    qc_op_copy(ex, d2, d1, n);
    qc_op_zero(ex, (char *)d1 + 16, n / 2);
    qc_op_copy(ex, d1, d1, n); /* dst == src: no-op */
    qc_op_zero(ex, d1, 0);     /* 0 bytes: no-op */
    qc_op_copy(ex, d2, d1, 0); /* 0 bytes: no-op */
    T_EXPECT(qc_op_upload(ex, d1, src, 0) == QC_OK, "%s: upload of 0 bytes", what);
    T_EXPECT(qc_op_sync(ex) == QC_OK, "%s: sync: %s", what, qc_error_last());
    T_EXPECT(qc_op_download(ex, h1, d1, n) == QC_OK, "%s: download: %s", what, qc_error_last());
    T_EXPECT(qc_op_download(ex, h2, d2, n) == QC_OK, "%s: download: %s", what, qc_error_last());
    T_EXPECT(qc_op_download(ex, h2, d2, 0) == QC_OK, "%s: download of 0 bytes", what);
    memcpy(want, src, n);
    memset(want + 16, 0, n / 2);
    T_EXPECT(memcmp(h1, want, n) == 0, "%s: upload + zero of the middle", what);
    T_EXPECT(memcmp(h2, src, n) == 0, "%s: copy", what);
    free(src);
    free(h1);
    free(h2);
    free(want);
}

static void test_moves_host(void)
{
    QC_TEST ("exec: backend names and kinds") {
        struct qc_exec cpu = {.backend = QC_EXEC_CPU}, emu = {.backend = QC_EXEC_EMU};
        struct qc_exec cuda = {.backend = QC_EXEC_CUDA};
        T_EXPECT(strcmp(qc_exec_backend_str(QC_EXEC_CPU), "cpu") == 0, "cpu");
        T_EXPECT(strcmp(qc_exec_backend_str(QC_EXEC_CUDA), "cuda") == 0, "cuda");
        T_EXPECT(strcmp(qc_exec_backend_str(QC_EXEC_EMU), "emu") == 0, "emu");
        T_EXPECT(qc_exec_backend_of(NULL) == QC_EXEC_CPU && !qc_exec_is_device(NULL), "NULL");
        T_EXPECT(!qc_exec_is_device(&cpu), "cpu is host memory");
        T_EXPECT(qc_exec_is_device(&emu) && qc_exec_is_device(&cuda), "emu, cuda are devices");
    }

    QC_TEST ("exec: memory moves on CPU (NULL and a zeroed exec)") {
        const size_t n = 10000;
        void *d1 = malloc(n), *d2 = malloc(n);
        check_moves(NULL, d1, d2, n, "cpu (NULL)");
        struct qc_exec zero;
        memset(&zero, 0, sizeof zero);
        check_moves(&zero, d1, d2, n, "cpu (zeroed)");
        free(d1);
        free(d2);
    }

    QC_TEST ("exec: memory moves on EMU leave the arena closed") {
        const size_t n = 3 * 4096 + 123;
        struct qc_emu *e = NULL;
        if (qc_emu_create((size_t)1 << 24, &e) != QC_OK)
            T_FATAL("qc_emu_create: %s", qc_error_last());
        struct qc_exec ex = {.backend = QC_EXEC_EMU, .emu = e};
        void *d1 = qc_emu_alloc(e, n), *d2 = qc_emu_alloc(e, n);
        check_moves(&ex, d1, d2, n, "emu");
        T_EXPECT(touch_faults(d1) && touch_faults((char *)d2 + n - 1),
                 "device memory open after the moves");
        qc_emu_free(e, d1, n);
        qc_emu_free(e, d2, n);
        qc_emu_destroy(e);
    }
}

// ---- case harness --------------------------------------------------------------------------

enum xb_kind { XB_F32, XB_I64, XB_U8 };
enum xb_role { XB_IN, XB_OUT, XB_SCRATCH };

struct xbuf {
    const char *name;
    enum xb_kind kind;
    enum xb_role role;
    int64_t n;
    size_t bytes;
    void *h;     /* host: the input, or the CPU op's output (the reference) */
    void *init;  /* OUT: initial content, uploaded before the device run */
    void *got;   /* OUT: the device run's result */
    char *dbase; /* device allocation: guard | data | guard */
    void *d;     /* device data */
};

struct xcase;

struct xctx {
    struct qc_exec ex;      /* the backend under test (EMU or CUDA) */
    struct qc_alloc *alloc; /* its device memory */
    struct qc_emu *emu;     /* EMU: the arena under alloc */
    bool exact;             /* EMU: outputs must be bit-identical to the CPU's */
    bool device_phase;      /* true while the case body runs on the device */
    uint64_t rng;
    struct xbuf bufs[MAX_BUFS];
    int nbufs;
    unsigned char pattern[GUARD];
    const struct xcase *tc;
};

/* One row of the case table. n is the op's main dimension (rows, edges, agents, elements); d1,
 * d2 are secondary dims where the op has them (documented per runner). The tolerances apply on
 * CUDA only (EMU is exact): test_kernels_cuda.c's for the same op. */
struct xcase {
    const char *op;
    void (*run)(struct xctx *x, const struct xcase *tc);
    int64_t n, d1, d2;
    double atol, rtol, nmse;
};

static void dev_upload(struct xctx *x, void *dst, const void *src, size_t bytes)
{
    if (qc_op_upload(&x->ex, dst, src, bytes) != QC_OK)
        T_FATAL("qc_op_upload(%zu bytes): %s", bytes, qc_error_last());
}

static void dev_download(struct xctx *x, void *dst, const void *src, size_t bytes)
{
    if (qc_op_download(&x->ex, dst, src, bytes) != QC_OK)
        T_FATAL("qc_op_download(%zu bytes): %s", bytes, qc_error_last());
}

static size_t kind_size(enum xb_kind k)
{
    return k == XB_F32 ? sizeof(float) : k == XB_I64 ? sizeof(int64_t) : 1;
}

static struct xbuf *xb_new(struct xctx *x, const char *name, enum xb_kind kind, enum xb_role role,
                           int64_t n)
{
    if (x->nbufs >= MAX_BUFS)
        T_FATAL("too many buffers in one case");
    struct xbuf *b = &x->bufs[x->nbufs++];
    memset(b, 0, sizeof *b);
    b->name = name;
    b->kind = kind;
    b->role = role;
    b->n = n;
    b->bytes = (size_t)(n > 0 ? n : 0) * kind_size(kind);
    size_t hb = b->bytes ? b->bytes : 1;
    b->h = calloc(1, hb);
    if (role == XB_OUT) {
        b->init = calloc(1, hb);
        b->got = calloc(1, hb);
    }
    void *p = NULL;
    if (qc_alloc_malloc(x->alloc, b->bytes + 2 * GUARD, NULL, name, &p) != QC_OK)
        T_FATAL("device alloc of %zu bytes for %s: %s", b->bytes, name, qc_error_last());
    b->dbase = p;
    b->d = b->dbase + GUARD;
    dev_upload(x, b->dbase, x->pattern, GUARD);
    dev_upload(x, b->dbase + GUARD + b->bytes, x->pattern, GUARD);
    return b;
}

static float urand(struct xctx *x, float lo, float hi)
{
    double u = (double)(qc_test_rand(&x->rng) >> 11) * 0x1p-53;
    return lo + (float)u * (hi - lo);
}

/* Random fp32 input in [lo, hi). */
static struct xbuf *in_f32(struct xctx *x, const char *name, int64_t n, float lo, float hi)
{
    struct xbuf *b = xb_new(x, name, XB_F32, XB_IN, n);
    float *h = b->h;
    for (int64_t i = 0; i < n; i++)
        h[i] = urand(x, lo, hi);
    dev_upload(x, b->d, b->h, b->bytes);
    return b;
}

/* Input with given host content (copied). */
static struct xbuf *in_from(struct xctx *x, const char *name, enum xb_kind kind, const void *src,
                            int64_t n)
{
    struct xbuf *b = xb_new(x, name, kind, XB_IN, n);
    if (b->bytes)
        memcpy(b->h, src, b->bytes);
    dev_upload(x, b->d, b->h, b->bytes);
    return b;
}

/* Random 0/1 mask with P(1) = p1. */
static struct xbuf *in_mask(struct xctx *x, const char *name, int64_t n, float p1)
{
    struct xbuf *b = xb_new(x, name, XB_U8, XB_IN, n);
    uint8_t *h = b->h;
    for (int64_t i = 0; i < n; i++)
        h[i] = urand(x, 0.0f, 1.0f) < p1 ? 1 : 0;
    dev_upload(x, b->d, b->h, b->bytes);
    return b;
}

/* Output with random initial content in [lo, hi) on both sides. */
static struct xbuf *out_f32(struct xctx *x, const char *name, int64_t n, float lo, float hi)
{
    struct xbuf *b = xb_new(x, name, XB_F32, XB_OUT, n);
    float *init = b->init;
    for (int64_t i = 0; i < n; i++)
        init[i] = urand(x, lo, hi);
    if (b->bytes)
        memcpy(b->h, b->init, b->bytes);
    return b;
}

static struct xbuf *out_i64(struct xctx *x, const char *name, int64_t n)
{
    struct xbuf *b = xb_new(x, name, XB_I64, XB_OUT, n);
    int64_t *init = b->init;
    for (int64_t i = 0; i < n; i++)
        init[i] = -7; /* never a valid index */
    if (b->bytes)
        memcpy(b->h, b->init, b->bytes);
    return b;
}

/* Scratch: separate host and device memory; only its guard bands are checked. */
static struct xbuf *scratch_f32(struct xctx *x, const char *name, int64_t n)
{
    return xb_new(x, name, XB_F32, XB_SCRATCH, n);
}

/* The side of a buffer the current phase works on. */
static void *xb_ptr(const struct xctx *x, const struct xbuf *b)
{
    return x->device_phase ? b->d : b->h;
}

#define F(b) ((float *)xb_ptr(x, b))
#define I(b) ((int64_t *)xb_ptr(x, b))
#define U(b) ((uint8_t *)xb_ptr(x, b))

/* One op call, written once for both phases: the _cpu op on the host copies, or the dispatch
 * on the device copies. */
#define OP(name, ...)                                                                              \
    (x->device_phase ? qc_op_##name(&x->ex, __VA_ARGS__) : qc_##name##_cpu(__VA_ARGS__))

static void phase_begin(struct xctx *x, int phase)
{
    x->device_phase = phase == 1;
    if (!x->device_phase)
        return; /* host outputs were set to init when created */
    for (int i = 0; i < x->nbufs; i++)
        if (x->bufs[i].role == XB_OUT)
            dev_upload(x, x->bufs[i].d, x->bufs[i].init, x->bufs[i].bytes);
}

static void phase_end(struct xctx *x, int phase)
{
    if (phase == 0)
        return;
    if (qc_op_sync(&x->ex) != QC_OK)
        T_FATAL("qc_op_sync after the ops: %s", qc_error_last());
    for (int i = 0; i < x->nbufs; i++) {
        struct xbuf *b = &x->bufs[i];
        if (b->role == XB_OUT)
            dev_download(x, b->got, b->d, b->bytes);
    }
    x->device_phase = false;
}

/* Runs the body on CPU (host copies, _cpu ops), then on the device (qc_op_* dispatch). */
#define BOTH(x, ...)                                                                               \
    do {                                                                                           \
        for (int phase_ = 0; phase_ < 2; phase_++) {                                               \
            phase_begin(x, phase_);                                                                \
            __VA_ARGS__;                                                                           \
            phase_end(x, phase_);                                                                  \
        }                                                                                          \
    } while (0)

// ---- checks --------------------------------------------------------------------------------

static void case_fail(struct xctx *x, const char *buf, const char *what)
{
    qc_test_st.failed_in_test = 1;
    printf("  [%s n=%" PRId64 "] %s: %s\n", x->tc->op, x->tc->n, buf, what);
}

/* EMU: the bytes must agree; the first mismatches are printed as values. */
static void compare_exact(struct xctx *x, const struct xbuf *b)
{
    if (!b->bytes || memcmp(b->got, b->h, b->bytes) == 0)
        return;
    int shown = 0;
    for (int64_t i = 0; i < b->n && shown < MAX_SHOWN; i++) {
        if (b->kind == XB_F32 && memcmp((const float *)b->got + i, (const float *)b->h + i, 4)) {
            printf("  [%s n=%" PRId64 "] %s[%" PRId64 "]: dev %.9g cpu %.9g\n", x->tc->op, x->tc->n,
                   b->name, i, (double)((const float *)b->got)[i],
                   (double)((const float *)b->h)[i]);
            shown++;
        } else if (b->kind == XB_I64 &&
                   ((const int64_t *)b->got)[i] != ((const int64_t *)b->h)[i]) {
            printf("  [%s n=%" PRId64 "] %s[%" PRId64 "]: dev %" PRId64 " cpu %" PRId64 "\n",
                   x->tc->op, x->tc->n, b->name, i, ((const int64_t *)b->got)[i],
                   ((const int64_t *)b->h)[i]);
            shown++;
        }
    }
    case_fail(x, b->name, "output differs from the CPU op's (must be bit-identical)");
}

/* CUDA: |dev − ref| <= atol + rtol·|ref| per element, nmse bound, NaN/Inf agree. */
static void compare_tol(struct xctx *x, const struct xbuf *b)
{
    const struct xcase *tc = x->tc;
    const float *got = b->got, *ref = b->h;
    int64_t errs = 0;
    double se = 0.0, sr = 0.0;
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
        }
        if (!ok) {
            if (errs < MAX_SHOWN)
                printf("  [%s n=%" PRId64 "] %s[%" PRId64 "]: dev %.9g cpu %.9g (|d| %.3g)\n",
                       tc->op, tc->n, b->name, i, g, r, fabs(g - r));
            errs++;
        }
    }
    double nmse = sr > 0.0 ? se / sr : se;
    if (errs)
        case_fail(x, b->name, "elements out of tolerance");
    if (!(nmse <= tc->nmse)) {
        printf("  [%s n=%" PRId64 "] %s: nmse %.3g > %.3g\n", tc->op, tc->n, b->name, nmse,
               tc->nmse);
        case_fail(x, b->name, "nmse over its bound");
    }
}

static void check_case(struct xctx *x)
{
    unsigned char g[GUARD];
    for (int i = 0; i < x->nbufs; i++) {
        struct xbuf *b = &x->bufs[i];
        dev_download(x, g, b->dbase, GUARD);
        if (memcmp(g, x->pattern, GUARD) != 0)
            case_fail(x, b->name, "guard band BEFORE the buffer was overwritten");
        dev_download(x, g, b->dbase + GUARD + b->bytes, GUARD);
        if (memcmp(g, x->pattern, GUARD) != 0)
            case_fail(x, b->name, "guard band AFTER the buffer was overwritten");
        if (b->role == XB_OUT) {
            if (x->exact || b->kind != XB_F32)
                compare_exact(x, b);
            else
                compare_tol(x, b);
        } else if (b->role == XB_IN && b->bytes) {
            void *now = malloc(b->bytes);
            dev_download(x, now, b->d, b->bytes);
            if (memcmp(now, b->h, b->bytes) != 0)
                case_fail(x, b->name, "input modified on the device");
            free(now);
        }
    }
    /* EMU: the dispatch closed the arena again after every op. */
    if (x->emu && x->nbufs > 0 && !touch_faults(x->bufs[0].dbase))
        case_fail(x, x->bufs[0].name, "device memory readable after the ops");
}

static void free_case(struct xctx *x)
{
    (void)qc_op_sync(&x->ex);
    for (int i = 0; i < x->nbufs; i++) {
        struct xbuf *b = &x->bufs[i];
        free(b->h);
        free(b->init);
        free(b->got);
        qc_alloc_free(x->alloc, b->dbase, NULL);
    }
    x->nbufs = 0;
}

// ---- CSR fixtures --------------------------------------------------------------------------

struct xcsr {
    struct qc_csr h, d; /* host view (CPU phase) and device view */
};

#define CSR(c) (x->device_phase ? (c).d : (c).h)

static int cmp_i64(const void *a, const void *b)
{
    int64_t p = *(const int64_t *)a, q = *(const int64_t *)b;
    return (p > q) - (p < q);
}

/* E items over nseg segments with random destinations (some segments empty); sorted = true
 * gives items already grouped by segment and perm = NULL. */
static struct xcsr make_csr(struct xctx *x, int64_t E, int64_t nseg, bool sorted)
{
    int64_t *seg = malloc((size_t)(E + 1) * sizeof(int64_t));
    for (int64_t e = 0; e < E; e++)
        seg[e] = (int64_t)(qc_test_rand(&x->rng) % (uint64_t)nseg);
    if (sorted)
        qsort(seg, (size_t)E, sizeof(int64_t), cmp_i64);
    int64_t *ptr = malloc((size_t)(nseg + 1) * sizeof(int64_t));
    int64_t *perm = malloc((size_t)(E + 1) * sizeof(int64_t));
    qc_csr_build_cpu(ptr, perm, seg, E, nseg);
    struct xbuf *bp = in_from(x, "csr.ptr", XB_I64, ptr, nseg + 1);
    struct xbuf *bperm = sorted ? NULL : in_from(x, "csr.perm", XB_I64, perm, E);
    struct xbuf *bseg = in_from(x, "csr.seg", XB_I64, seg, E);
    struct xcsr c;
    c.h.ptr = bp->h;
    c.h.perm = sorted ? NULL : bperm->h;
    c.h.seg = bseg->h;
    c.h.nseg = nseg;
    c.h.nitem = E;
    c.d = c.h;
    c.d.ptr = bp->d;
    c.d.perm = sorted ? NULL : bperm->d;
    c.d.seg = bseg->d;
    free(seg);
    free(ptr);
    free(perm);
    return c;
}

// ---- runners -------------------------------------------------------------------------------

/* n elements: relu, elu, sigmoid, tanh forward and backward (the backward reads the CPU
 * forward's output as an input), add / add_scalar / gate_update. */
static void run_elementwise(struct xctx *x, const struct xcase *tc)
{
    int64_t n = tc->n;
    size_t nb = (size_t)(n + 1) * sizeof(float);
    struct xbuf *in = in_f32(x, "inp", n, -6.0f, 6.0f);
    struct xbuf *a = in_f32(x, "a", n, -2.0f, 2.0f);
    struct xbuf *g = in_f32(x, "g", n, 0.0f, 1.0f);
    struct xbuf *dout = in_f32(x, "dout", n, -1.0f, 1.0f);
    float *y = malloc(nb), *ys = malloc(nb), *yt = malloc(nb);
    qc_elu_forward_cpu(y, in->h, n);
    qc_sigmoid_forward_cpu(ys, in->h, n);
    qc_tanh_forward_cpu(yt, in->h, n);
    struct xbuf *ye = in_from(x, "y_elu", XB_F32, y, n);
    struct xbuf *ysb = in_from(x, "y_sigmoid", XB_F32, ys, n);
    struct xbuf *ytb = in_from(x, "y_tanh", XB_F32, yt, n);
    struct xbuf *o[4], *d[4], *ar[6];
    const char *on[4] = {"relu", "elu", "sigmoid", "tanh"};
    const char *dn[4] = {"relu_bwd", "elu_bwd", "sigmoid_bwd", "tanh_bwd"};
    for (int i = 0; i < 4; i++) {
        o[i] = out_f32(x, on[i], n, -1.0f, 1.0f);
        d[i] = out_f32(x, dn[i], n, -1.0f, 1.0f);
    }
    const char *an[6] = {"add", "add_scalar", "gate", "du", "dg", "ds"};
    for (int i = 0; i < 6; i++)
        ar[i] = out_f32(x, an[i], n, -1.0f, 1.0f);
    BOTH(x, {
        OP(relu_forward, F(o[0]), F(in), n);
        OP(relu_backward, F(d[0]), F(dout), F(o[0]), n);
        OP(elu_forward, F(o[1]), F(in), n);
        OP(elu_backward, F(d[1]), F(dout), F(ye), n);
        OP(sigmoid_forward, F(o[2]), F(in), n);
        OP(sigmoid_backward, F(d[2]), F(dout), F(ysb), n);
        OP(tanh_forward, F(o[3]), F(in), n);
        OP(tanh_backward, F(d[3]), F(dout), F(ytb), n);
        OP(add_forward, F(ar[0]), F(a), F(in), n);
        OP(add_scalar_forward, F(ar[1]), F(a), 0.1f, n);
        OP(gate_update_forward, F(ar[2]), F(a), F(g), F(in), n);
        OP(gate_update_backward, F(ar[3]), F(ar[4]), F(ar[5]), F(dout), F(a), F(g), F(in), n);
    });
    free(y);
    free(ys);
    free(yt);
}

/* n elements: dropout forward / backward at p = 0.1 and the identity at p = 0. */
static void run_dropout(struct xctx *x, const struct xcase *tc)
{
    int64_t n = tc->n;
    struct xbuf *in = in_f32(x, "inp", n, -2.0f, 2.0f);
    struct xbuf *out = out_f32(x, "out", n, -1.0f, 1.0f);
    struct xbuf *din = out_f32(x, "dinp", n, -1.0f, 1.0f);
    struct xbuf *off = out_f32(x, "out_p0", n, -1.0f, 1.0f);
    struct qc_dropout dr = {0.1f, 0x0123456789abcdefull, 977, 31, 123457, NULL, 0, 0, 0};
    struct qc_dropout d0 = {0.0f, 1, 1, 1, 0, NULL, 0, 0, 0};
    BOTH(x, {
        OP(dropout_forward, F(out), F(in), n, &dr);
        OP(dropout_backward, F(din), F(in), n, &dr);
        OP(dropout_forward, F(off), F(in), n, &d0);
    });
}

/* d1 = IC, d2 = OC. Forward OVERWRITE with bias, then ACCUM without bias from a strided input
 * (ldi = IC + 3); backward dinp ACCUM into a strided buffer (lddi = IC + 5), dweight and dbias
 * ACCUM. */
static void run_linear(struct xctx *x, const struct xcase *tc)
{
    int64_t N = tc->n, IC = tc->d1, OC = tc->d2, ldi = IC + 3, lddi = IC + 5;
    struct xbuf *in = in_f32(x, "inp", N * ldi, -1.0f, 1.0f);
    struct xbuf *w = in_f32(x, "weight", OC * IC, -0.2f, 0.2f);
    struct xbuf *b = in_f32(x, "bias", OC, -1.0f, 1.0f);
    struct xbuf *dout = in_f32(x, "dout", N * OC, -1.0f, 1.0f);
    struct xbuf *o1 = out_f32(x, "out", N * OC, -1.0f, 1.0f);
    struct xbuf *o2 = out_f32(x, "out_accum", N * OC, -1.0f, 1.0f);
    struct xbuf *dinp = out_f32(x, "dinp", N * lddi, -1.0f, 1.0f);
    struct xbuf *dw = out_f32(x, "dweight", OC * IC, -1.0f, 1.0f);
    struct xbuf *db = out_f32(x, "dbias", OC, -1.0f, 1.0f);
    BOTH(x, {
        OP(linear_forward, F(o1), F(in), IC, F(w), F(b), N, IC, OC, false);
        OP(linear_forward, F(o2), F(in), ldi, F(w), NULL, N, IC, OC, true);
        OP(linear_backward, F(dinp), lddi, F(dw), F(db), F(dout), F(in), ldi, F(w), N, IC, OC,
           true);
    });
}

/* d1 = C. Forward (out, mean, rstd); backward from the CPU forward's statistics: dinp
 * OVERWRITE, dweight / dbias ACCUM. */
static void run_layernorm(struct xctx *x, const struct xcase *tc)
{
    int64_t N = tc->n, C = tc->d1;
    struct xbuf *in = in_f32(x, "inp", N * C, -3.0f, 5.0f);
    struct xbuf *w = in_f32(x, "weight", C, 0.5f, 1.5f);
    struct xbuf *b = in_f32(x, "bias", C, -1.0f, 1.0f);
    struct xbuf *dout = in_f32(x, "dout", N * C, -1.0f, 1.0f);
    float *m = malloc((size_t)(N + 1) * sizeof(float)), *r = malloc((size_t)(N + 1) * 4);
    float *tmp = malloc((size_t)(N * C + 1) * sizeof(float));
    qc_layernorm_forward_cpu(tmp, m, r, in->h, w->h, b->h, N, C);
    struct xbuf *sm = in_from(x, "saved_mean", XB_F32, m, N);
    struct xbuf *sr = in_from(x, "saved_rstd", XB_F32, r, N);
    struct xbuf *out = out_f32(x, "out", N * C, -1.0f, 1.0f);
    struct xbuf *mean = out_f32(x, "mean", N, -1.0f, 1.0f);
    struct xbuf *rstd = out_f32(x, "rstd", N, -1.0f, 1.0f);
    struct xbuf *dinp = out_f32(x, "dinp", N * C, -1.0f, 1.0f);
    struct xbuf *dw = out_f32(x, "dweight", C, -1.0f, 1.0f);
    struct xbuf *db = out_f32(x, "dbias", C, -1.0f, 1.0f);
    BOTH(x, {
        OP(layernorm_forward, F(out), F(mean), F(rstd), F(in), F(w), F(b), N, C);
        OP(layernorm_backward, F(dinp), F(dw), F(db), F(dout), F(in), F(sm), F(sr), F(w), N, C,
           false);
    });
    free(m);
    free(r);
    free(tmp);
}

/* E = n edges over E/8 + 1 nodes, d1 = C, d2 = 1: items pre-sorted (perm NULL), else a
 * permuted CSR. gather forward (= and +=), gather backward, scatter-add forward / backward. */
static void run_gather_scatter(struct xctx *x, const struct xcase *tc)
{
    int64_t E = tc->n, C = tc->d1, N = E / 8 + 1;
    struct xcsr c = make_csr(x, E, N, tc->d2 == 1);
    struct xbuf *nodes = in_f32(x, "nodes", N * C, -1.0f, 1.0f);
    struct xbuf *edges = in_f32(x, "edges", E * C, -1.0f, 1.0f);
    struct xbuf *g = out_f32(x, "gather", E * C, -1.0f, 1.0f);
    struct xbuf *ga = out_f32(x, "gather_accum", E * C, -1.0f, 1.0f);
    struct xbuf *gb = out_f32(x, "gather_bwd_accum", N * C, -1.0f, 1.0f);
    struct xbuf *sf = out_f32(x, "scatter", N * C, -1.0f, 1.0f);
    struct xbuf *sb = out_f32(x, "scatter_bwd", E * C, -1.0f, 1.0f);
    BOTH(x, {
        OP(gather_rows_forward, F(g), F(nodes), CSR(c).seg, E, C, false);
        OP(gather_rows_forward, F(ga), F(nodes), CSR(c).seg, E, C, true);
        OP(gather_rows_backward, F(gb), F(edges), CSR(c), C, true);
        OP(scatter_add_forward, F(sf), F(edges), CSR(c), C, false);
        OP(scatter_add_backward, F(sb), F(nodes), CSR(c), C, false);
    });
}

/* E = n edges over E/8 + 1 destinations, H = 4, Dh = 8: score, segment softmax (forward with
 * statistics, backward from the CPU's alpha), aggregate with attention dropout, backward. */
static void run_attention(struct xctx *x, const struct xcase *tc)
{
    int64_t E = tc->n, Nd = E / 8 + 1, H = 4, Dh = 8, D = H * Dh;
    float scale = 0.35355339f;
    struct xcsr c = make_csr(x, E, Nd, false);
    struct qc_dropout drop = {0.1f, 2023, 5, 17, 40, NULL, 0, 0, 0};
    struct xbuf *q = in_f32(x, "q", Nd * D, -1.0f, 1.0f);
    struct xbuf *k = in_f32(x, "k", E * D, -1.0f, 1.0f);
    struct xbuf *v = in_f32(x, "v", E * D, -1.0f, 1.0f);
    struct xbuf *dsc = in_f32(x, "dscore", E * H, -1.0f, 1.0f);
    struct xbuf *dal = in_f32(x, "dalpha_in", E * H, -1.0f, 1.0f);
    struct xbuf *dagg = in_f32(x, "dagg", Nd * D, -1.0f, 1.0f);
    float *sc = malloc((size_t)(E * H + 1) * sizeof(float));
    float *al = malloc((size_t)(E * H + 1) * sizeof(float));
    qc_attn_score_forward_cpu(sc, q->h, k->h, c.h, H, Dh, scale);
    qc_segment_softmax_forward_cpu(al, NULL, NULL, sc, c.h, H);
    struct xbuf *alpha = in_from(x, "alpha", XB_F32, al, E * H);
    struct xbuf *score = out_f32(x, "score", E * H, -1.0f, 1.0f);
    struct xbuf *sm = out_f32(x, "softmax", E * H, -1.0f, 1.0f);
    struct xbuf *smax = out_f32(x, "seg_max", Nd * H, -1.0f, 1.0f);
    struct xbuf *ssum = out_f32(x, "seg_sum", Nd * H, -1.0f, 1.0f);
    struct xbuf *dsm = out_f32(x, "softmax_bwd", E * H, -1.0f, 1.0f);
    struct xbuf *dq = out_f32(x, "dq_accum", Nd * D, -1.0f, 1.0f);
    struct xbuf *dk = out_f32(x, "dk", E * D, -1.0f, 1.0f);
    struct xbuf *agg = out_f32(x, "aggregate", Nd * D, -1.0f, 1.0f);
    struct xbuf *dalpha = out_f32(x, "dalpha", E * H, -1.0f, 1.0f);
    struct xbuf *dv = out_f32(x, "dv", E * D, -1.0f, 1.0f);
    BOTH(x, {
        OP(attn_score_forward, F(score), F(q), F(k), CSR(c), H, Dh, scale);
        OP(segment_softmax_forward, F(sm), F(smax), F(ssum), F(score), CSR(c), H);
        OP(segment_softmax_backward, F(dsm), F(dal), F(alpha), CSR(c), H);
        OP(attn_score_backward, F(dq), F(dk), F(dsc), F(q), F(k), CSR(c), H, Dh, scale, true);
        OP(attn_aggregate_forward, F(agg), F(alpha), F(v), CSR(c), H, Dh, &drop);
        OP(attn_aggregate_backward, F(dalpha), F(dv), F(dagg), F(alpha), F(v), CSR(c), H, Dh,
           &drop);
    });
    free(sc);
    free(al);
}

/* N = n rows, d1 = D inputs, d2 = F bands: forward, backward, backward from the saved phi
 * (on CUDA the recomputing backward; the CPU's saved variant is bit-identical to its own). */
static void run_fourier(struct xctx *x, const struct xcase *tc)
{
    int64_t N = tc->n, D = tc->d1, Fb = tc->d2, W = 2 * Fb + 1;
    struct xbuf *c = in_f32(x, "c", N * D, -5.0f, 5.0f);
    struct xbuf *fr = in_f32(x, "freqs", D * Fb, -1.0f, 1.0f);
    struct xbuf *dphi = in_f32(x, "dphi", N * D * W, -1.0f, 1.0f);
    float *ph = malloc((size_t)(N * D * W + 1) * sizeof(float));
    qc_fourier_features_forward_cpu(ph, c->h, fr->h, N, D, Fb);
    struct xbuf *sphi = in_from(x, "saved_phi", XB_F32, ph, N * D * W);
    struct xbuf *phi = out_f32(x, "phi", N * D * W, -1.0f, 1.0f);
    struct xbuf *dc = out_f32(x, "dc", N * D, -1.0f, 1.0f);
    struct xbuf *dfr = out_f32(x, "dfreqs_accum", D * Fb, -1.0f, 1.0f);
    struct xbuf *dc2 = out_f32(x, "dc_saved", N * D, -1.0f, 1.0f);
    struct xbuf *dfr2 = out_f32(x, "dfreqs_saved_accum", D * Fb, -1.0f, 1.0f);
    BOTH(x, {
        OP(fourier_features_forward, F(phi), F(c), F(fr), N, D, Fb);
        OP(fourier_features_backward, F(dc), F(dfr), F(dphi), F(c), F(fr), N, D, Fb);
        OP(fourier_features_backward_saved, F(dc2), F(dfr2), F(dphi), F(sphi), F(c), F(fr), N, D,
           Fb);
    });
    free(ph);
}

/* N = n sequences, d1 = L steps, d2 = C (= IC). The sequence forward and backward (from the
 * CPU forward's saved hs / gates) and one cell step forward and backward. */
static void run_gru(struct xctx *x, const struct xcase *tc)
{
    int64_t N = tc->n, L = tc->d1, C = tc->d2, IC = C;
    struct xbuf *xs = in_f32(x, "x", L * N * IC, -1.0f, 1.0f);
    struct xbuf *h0 = in_f32(x, "h0", N * C, -1.0f, 1.0f);
    struct xbuf *wih = in_f32(x, "w_ih", 3 * C * IC, -0.15f, 0.15f);
    struct xbuf *bih = in_f32(x, "b_ih", 3 * C, -0.1f, 0.1f);
    struct xbuf *whh = in_f32(x, "w_hh", 3 * C * C, -0.15f, 0.15f);
    struct xbuf *bhh = in_f32(x, "b_hh", 3 * C, -0.1f, 0.1f);
    struct xbuf *dlast = in_f32(x, "dh_last", N * C, -1.0f, 1.0f);
    int64_t fs = qc_gru_forward_scratch_numel(L, N, C), bs = qc_gru_backward_scratch_numel(L, N, C);
    int64_t cs = qc_gru_cell_scratch_numel(N, C);
    int64_t ns = (fs > bs ? fs : bs) + cs;
    float *hscpu = malloc((size_t)((L + 1) * N * C) * sizeof(float));
    float *gcpu = malloc((size_t)(L * N * 4 * C + 1) * sizeof(float));
    float *scr = malloc((size_t)(ns + 1) * sizeof(float));
    qc_gru_forward_cpu(hscpu, gcpu, xs->h, h0->h, wih->h, bih->h, whh->h, bhh->h, L, N, IC, C, scr);
    free(scr);
    struct xbuf *shs = in_from(x, "saved_hs", XB_F32, hscpu, (L + 1) * N * C);
    struct xbuf *sg = in_from(x, "saved_gates", XB_F32, gcpu, L * N * 4 * C);
    struct xbuf *hs = out_f32(x, "hs", (L + 1) * N * C, -1.0f, 1.0f);
    struct xbuf *gates = out_f32(x, "gates", L * N * 4 * C, -1.0f, 1.0f);
    struct xbuf *dx = out_f32(x, "dx", L * N * IC, -1.0f, 1.0f);
    struct xbuf *dh0 = out_f32(x, "dh0", N * C, -1.0f, 1.0f);
    struct xbuf *dwih = out_f32(x, "dw_ih", 3 * C * IC, -1.0f, 1.0f);
    struct xbuf *dbih = out_f32(x, "db_ih", 3 * C, -1.0f, 1.0f);
    struct xbuf *dwhh = out_f32(x, "dw_hh", 3 * C * C, -1.0f, 1.0f);
    struct xbuf *dbhh = out_f32(x, "db_hh", 3 * C, -1.0f, 1.0f);
    struct xbuf *ch = out_f32(x, "cell_h", N * C, -1.0f, 1.0f);
    struct xbuf *cg = out_f32(x, "cell_gates", N * 4 * C, -1.0f, 1.0f);
    struct xbuf *cdx = out_f32(x, "cell_dx", N * IC, -1.0f, 1.0f);
    struct xbuf *cdh = out_f32(x, "cell_dh", N * C, -1.0f, 1.0f);
    struct xbuf *cdw = out_f32(x, "cell_dw_hh", 3 * C * C, -1.0f, 1.0f);
    struct xbuf *s = scratch_f32(x, "scratch", ns);
    BOTH(x, {
        OP(gru_forward, F(hs), F(gates), F(xs), F(h0), F(wih), F(bih), F(whh), F(bhh), L, N, IC, C,
           F(s));
        OP(gru_backward, F(dx), F(dh0), F(dwih), F(dbih), F(dwhh), F(dbhh), F(dlast), F(shs), F(sg),
           F(xs), F(wih), F(whh), L, N, IC, C, F(s));
        OP(gru_cell_forward, F(ch), F(cg), F(xs), F(h0), F(wih), F(bih), F(whh), F(bhh), N, IC, C,
           F(s));
        OP(gru_cell_backward, F(cdx), F(cdh), NULL, NULL, F(cdw), NULL, F(dlast), F(sg), F(xs),
           F(h0), F(wih), F(whh), N, IC, C, F(s));
    });
    free(hscpu);
    free(gcpu);
}

/* A = n agents, d1 = K modes, d2 = S steps; gt stride 3. best mode, regression loss (from the
 * CPU's best mode) and the mixture NLL, forward and backward; log_softmax / logsumexp of pi. */
static void run_losses(struct xctx *x, const struct xcase *tc)
{
    int64_t A = tc->n, K = tc->d1, S = tc->d2, gs = 3;
    struct xbuf *loc = in_f32(x, "loc", A * K * S * 2, -20.0f, 20.0f);
    struct xbuf *scl = in_f32(x, "scale", A * K * S * 2, 0.1f, 4.0f);
    struct xbuf *gt = in_f32(x, "gt", A * S * gs, -20.0f, 20.0f);
    struct xbuf *pi = in_f32(x, "pi", A * K, -3.0f, 3.0f);
    struct xbuf *dpik = in_f32(x, "dout_pi", A * K, -1.0f, 1.0f);
    struct xbuf *mask = in_mask(x, "reg_mask", A * S, 0.8f);
    struct xbuf *cmask = in_mask(x, "cls_mask", A, 0.7f);
    float one = 1.0f;
    struct xbuf *dloss = in_from(x, "dloss", XB_F32, &one, 1);
    int64_t *bcpu = malloc((size_t)(A + 1) * sizeof(int64_t));
    qc_best_mode_cpu(bcpu, loc->h, gt->h, gs, mask->h, A, K, S);
    struct xbuf *sbest = in_from(x, "saved_best", XB_I64, bcpu, A);
    float *ls = malloc((size_t)(A * K + 1) * sizeof(float));
    qc_log_softmax_forward_cpu(ls, pi->h, A, K);
    struct xbuf *sls = in_from(x, "saved_log_softmax", XB_F32, ls, A * K);
    struct xbuf *best = out_i64(x, "best", A);
    struct xbuf *lreg = out_f32(x, "reg_loss", 1, -1.0f, 1.0f);
    struct xbuf *dloc = out_f32(x, "dloc", A * K * S * 2, -1.0f, 1.0f);
    struct xbuf *dscl = out_f32(x, "dscale", A * K * S * 2, -1.0f, 1.0f);
    struct xbuf *lcls = out_f32(x, "cls_loss", 1, -1.0f, 1.0f);
    struct xbuf *dpi = out_f32(x, "dpi", A * K, -1.0f, 1.0f);
    struct xbuf *lsm = out_f32(x, "log_softmax", A * K, -1.0f, 1.0f);
    struct xbuf *dlsm = out_f32(x, "log_softmax_bwd", A * K, -1.0f, 1.0f);
    struct xbuf *s = scratch_f32(x, "scratch", qc_reg_loss_scratch_numel(A, S));
    BOTH(x, {
        OP(best_mode, I(best), F(loc), F(gt), gs, U(mask), A, K, S);
        OP(reg_loss_forward, F(lreg), F(loc), F(scl), I(sbest), F(gt), gs, U(mask), NULL, A, K, S,
           F(s));
        OP(reg_loss_backward, F(dloc), F(dscl), F(dloss), F(loc), F(scl), I(sbest), F(gt), gs,
           U(mask), NULL, A, K, S, F(s));
        OP(mixture_nll_forward, F(lcls), F(pi), F(loc), F(scl), F(gt), gs, U(mask), U(cmask), NULL,
           A, K, S);
        OP(mixture_nll_backward, F(dpi), F(dloss), F(pi), F(loc), F(scl), F(gt), gs, U(mask),
           U(cmask), NULL, A, K, S);
        OP(log_softmax_forward, F(lsm), F(pi), A, K);
        OP(log_softmax_backward, F(dlsm), F(dpik), F(sls), A, K);
    });
    free(bcpu);
    free(ls);
}

/* n elements, d1 = segments: a flat AdamW step and the segmented step (decay flags alternate,
 * random cut points, empty segments possible). State (param, m, v) starts random. */
static void run_adamw(struct xctx *x, const struct xcase *tc)
{
    int64_t n = tc->n, nseg = tc->d1 < n ? tc->d1 : n;
    struct qc_adamw_hparams hp = {5e-4, 0.9, 0.999, 1e-8, 1e-4, 7};
    struct xbuf *g = in_f32(x, "grad", n, -1.0f, 1.0f);
    int64_t *off = malloc((size_t)(nseg + 1) * sizeof(int64_t));
    uint8_t *dec = malloc((size_t)(nseg + 1));
    off[0] = 0;
    for (int64_t i = 1; i < nseg; i++)
        off[i] = (int64_t)(qc_test_rand(&x->rng) % (uint64_t)(n + 1));
    off[nseg] = n;
    qsort(off + 1, (size_t)(nseg > 1 ? nseg - 1 : 0), sizeof(int64_t), cmp_i64);
    for (int64_t i = 0; i < nseg; i++)
        dec[i] = (uint8_t)(i & 1);
    struct xbuf *offb = in_from(x, "offsets", XB_I64, off, nseg + 1);
    struct xbuf *decb = in_from(x, "decay", XB_U8, dec, nseg);
    struct xbuf *p1 = out_f32(x, "param", n, -1.0f, 1.0f);
    struct xbuf *m1 = out_f32(x, "m", n, -0.1f, 0.1f);
    struct xbuf *v1 = out_f32(x, "v", n, 0.0f, 0.01f);
    struct xbuf *p2 = out_f32(x, "param_seg", n, -1.0f, 1.0f);
    struct xbuf *m2 = out_f32(x, "m_seg", n, -0.1f, 0.1f);
    struct xbuf *v2 = out_f32(x, "v_seg", n, 0.0f, 0.01f);
    BOTH(x, {
        OP(adamw_step, F(p1), F(m1), F(v1), F(g), n, &hp);
        OP(adamw_step_segments, F(p2), F(m2), F(v2), F(g), I(offb), U(decb), nseg, &hp);
    });
    free(off);
    free(dec);
}

/* rows = n, d1 = R, d2 = C: embedding, cumsum, copy2d, repeat_interleave, tile, transpose01. */
static void run_layout(struct xctx *x, const struct xcase *tc)
{
    int64_t N = tc->n, R = tc->d1, C = tc->d2, ld = 2 * C + 1, V = 17;
    int64_t *idx = malloc((size_t)(N + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++)
        idx[i] = (int64_t)(qc_test_rand(&x->rng) % (uint64_t)V);
    struct xbuf *ib = in_from(x, "idx", XB_I64, idx, N);
    struct xbuf *table = in_f32(x, "table", V * C, -1.0f, 1.0f);
    struct xbuf *src = in_f32(x, "src", N * ld, -1.0f, 1.0f);
    struct xbuf *rep = in_f32(x, "rep_in", N * R * C, -1.0f, 1.0f);
    struct xbuf *emb = out_f32(x, "embedding", N * C, -1.0f, 1.0f);
    struct xbuf *demb = out_f32(x, "dtable", V * C, -1.0f, 1.0f);
    struct xbuf *cs = out_f32(x, "cumsum", N * R * C, -1.0f, 1.0f);
    struct xbuf *dcs = out_f32(x, "cumsum_bwd", N * R * C, -1.0f, 1.0f);
    struct xbuf *cp = out_f32(x, "copy2d", N * ld, -1.0f, 1.0f);
    struct xbuf *cpa = out_f32(x, "copy2d_accum", N * C, -1.0f, 1.0f);
    struct xbuf *ri = out_f32(x, "repeat_interleave", N * R * C, -1.0f, 1.0f);
    struct xbuf *rib = out_f32(x, "repeat_interleave_bwd", N * C, -1.0f, 1.0f);
    struct xbuf *ti = out_f32(x, "tile", N * R * C, -1.0f, 1.0f);
    struct xbuf *tib = out_f32(x, "tile_bwd", N * C, -1.0f, 1.0f);
    struct xbuf *tr = out_f32(x, "transpose01", N * R * C, -1.0f, 1.0f);
    struct xbuf *trb = out_f32(x, "transpose01_bwd", N * R * C, -1.0f, 1.0f);
    BOTH(x, {
        OP(embedding_forward, F(emb), I(ib), F(table), N, C, V);
        OP(embedding_backward, F(demb), F(rep), I(ib), N, C, V);
        OP(cumsum_forward, F(cs), F(rep), N, R, C);
        OP(cumsum_backward, F(dcs), F(rep), N, R, C);
        OP(copy2d, F(cp) + 1, ld, F(src), ld, N, C, false);
        OP(copy2d, F(cpa), C, F(src) + 3, ld, N, C, true);
        OP(repeat_interleave_forward, F(ri), F(src), N, R, C);
        OP(repeat_interleave_backward, F(rib), F(rep), N, R, C, true);
        OP(tile_forward, F(ti), F(src), N, R, C);
        OP(tile_backward, F(tib), F(rep), N, R, C, false);
        OP(transpose01_forward, F(tr), F(rep), N, R, C);
        OP(transpose01_backward, F(trb), F(rep), N, R, C);
    });
    free(idx);
}

// ---- the case table ------------------------------------------------------------------------

/* Three rows per op: main dimension 1, 7 and 769. Tolerances (CUDA only) and their reasons are
 * test_kernels_cuda.c's for the same ops at these sizes. */
#define CASES(op, fn, d1, d2, atol, rtol, nmse)                                                    \
    {op, fn, 1, d1, d2, atol, rtol, nmse}, {op, fn, 7, d1, d2, atol, rtol, nmse},                  \
    {                                                                                              \
        op, fn, 769, d1, d2, atol, rtol, nmse                                                      \
    }

static const struct xcase cases[] = {
    CASES("relu/elu/sigmoid/tanh/add/gate_update", run_elementwise, 0, 0, 1e-6, 1e-6, 1e-12),
    CASES("dropout", run_dropout, 0, 0, 0.0, 0.0, 0.0),
    CASES("linear", run_linear, 24, 40, 2e-3, 2e-5, 1e-11),
    CASES("layernorm", run_layernorm, 32, 0, 2e-5, 2e-5, 1e-11),
    CASES("gather/scatter (csr perm)", run_gather_scatter, 24, 0, 0.0, 0.0, 0.0),
    CASES("gather/scatter (sorted)", run_gather_scatter, 24, 1, 0.0, 0.0, 0.0),
    CASES("attention score/segment softmax/aggregate", run_attention, 0, 0, 2e-6, 2e-5, 1e-11),
    CASES("fourier features", run_fourier, 3, 8, 1e-4, 1e-5, 1e-11),
    CASES("gru (sequence and cell)", run_gru, 5, 16, 2e-4, 1e-3, 1e-9),
    CASES("best_mode/reg_loss/mixture_nll/log_softmax", run_losses, 6, 12, 1e-5, 1e-5, 1e-10),
    CASES("adamw (flat, segments)", run_adamw, 9, 0, 1e-7, 2e-6, 1e-12),
    CASES("embedding/cumsum/copy2d/repeat/tile/transpose", run_layout, 3, 8, 0.0, 0.0, 0.0),
};

static void run_table(struct xctx *x, const char *backend)
{
    x->rng = qc_test_seed();
    for (int i = 0; i < GUARD; i++)
        x->pattern[i] = (unsigned char)(0xA5 ^ (i * 37 + 11));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct xcase *tc = &cases[i];
        char name[160];
        snprintf(name, sizeof name, "%s vs cpu: %s, n = %" PRId64, backend, tc->op, tc->n);
        QC_TEST (name) {
            x->tc = tc;
            tc->run(x, tc);
            check_case(x);
            free_case(x);
        }
    }
}

// ---- backends ------------------------------------------------------------------------------

static int main_emu(void)
{
    test_emu_arena();
    test_moves_host();
    struct xctx *x = calloc(1, sizeof *x);
    if (!x || qc_emu_create((size_t)1 << 32, &x->emu) != QC_OK)
        T_FATAL("emu arena: %s", qc_error_last());
    struct qc_alloc_params ap;
    qc_alloc_params_default(&ap);
    ap.emu = x->emu;
    if (qc_alloc_create(NULL, &ap, &x->alloc) != QC_OK)
        T_FATAL("allocator over the arena: %s", qc_error_last());
    x->ex = (struct qc_exec){.backend = QC_EXEC_EMU, .emu = x->emu};
    x->exact = true;
    run_table(x, "emu");
    QC_TEST ("emu: the allocator gives the arena everything back") {
        qc_alloc_destroy(x->alloc);
        x->alloc = NULL;
        T_EXPECT_EQ_U64(qc_emu_bytes_live(x->emu), 0, "arena bytes live after destroy");
    }
    qc_alloc_destroy(x->alloc);
    qc_emu_destroy(x->emu);
    free(x);
    return qc_test_summary();
}

#ifdef QC_HAVE_CUDA
static int main_cuda(void)
{
    const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
    if (probe != 0)
        return probe;
    struct xctx *x = calloc(1, sizeof *x);
    struct kt_gpu g;
    if (!x || kt_gpu_open(&g, 0x69) != 0) {
        free(x);
        return 1;
    }
    x->alloc = g.alloc; /* the case table's buffers: from the GPU context's allocator */
    x->ex = (struct qc_exec){.backend = QC_EXEC_CUDA, .stream = g.s};

    QC_TEST ("cuda: memory moves") {
        const size_t n = 3 * 4096 + 123;
        void *d1 = NULL, *d2 = NULL;
        if (qc_alloc_malloc(x->alloc, n, NULL, "moves/d1", &d1) != QC_OK ||
            qc_alloc_malloc(x->alloc, n, NULL, "moves/d2", &d2) != QC_OK)
            T_FATAL("alloc: %s", qc_error_last());
        check_moves(&x->ex, d1, d2, n, "cuda");
        qc_alloc_free(x->alloc, d1, NULL);
        qc_alloc_free(x->alloc, d2, NULL);
    }
    x->exact = false;
    run_table(x, "cuda");

    kt_gpu_close(&g); /* x->alloc with it */
    free(x);
    return qc_test_summary();
}
#endif

int main(int argc, char **argv)
{
    bool cuda = argc > 1 && strcmp(argv[1], "--cuda") == 0;
    if (!cuda)
        return main_emu();
#ifdef QC_HAVE_CUDA
    return main_cuda();
#else
    printf("skip: a CPU-only build (configure with -DQC_CUDA=ON)\n");
    return 77;
#endif
}
