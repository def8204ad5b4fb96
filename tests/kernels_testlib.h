/*
 * kernels_testlib.h — helpers for tests/test_kernels_cpu.c: seeded random arrays, float<->double
 * copies and a central-difference gradient checker in double precision.
 *
 * Gradient check: the test writes the op's forward in double (struct gc.fwd, reading gc.in[] and
 * writing gc.out), picks random weights w, and compares the op's fp32 backward, called with
 * dout = w, against d(Σ w·out)/dx by central differences with step GC_STEP. The double forward
 * is evaluated at exactly the fp32 inputs the fp32 op saw, so the only differences are the fp32
 * rounding inside the backward (relative ~1e-6 .. 1e-5 for the sums here) and the difference
 * error (O(h²) truncation + O(1e-16/h) rounding ≈ 1e-10).
 */
#ifndef QC_TESTS_KERNELS_TESTLIB_H
#define QC_TESTS_KERNELS_TESTLIB_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_kernels.h"
#include "testutil.h"

#define GC_STEP   1e-5
#define GC_MAX_IN 8

struct gc {
    double *in[GC_MAX_IN]; /* double copies of the op's inputs (perturbed one element at a time) */
    int64_t n_in[GC_MAX_IN];
    double *out; /* (n_out) the double forward's output */
    double *w;   /* (n_out) weights of the linear functional Σ w·out */
    int64_t n_out;
    int64_t dim[8];     /* op dims, meaning per test */
    const void *aux[4]; /* index arrays and the like */
    float fparam[4];    /* op scalars */
    void (*fwd)(struct gc *g);
};

static inline float kt_uniform(uint64_t *st, float lo, float hi)
{
    double u = (double)(qc_test_rand(st) >> 11) * 0x1p-53;
    return lo + (float)u * (hi - lo);
}

static inline float *kt_rand(int64_t n, float lo, float hi, uint64_t *st)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = kt_uniform(st, lo, hi);
    return x;
}

/* Random values with |x| in [lo, hi] and a random sign: keeps kinks (ReLU, |y − μ|) at least
 * lo away, far beyond the difference step. */
static inline float *kt_rand_away0(int64_t n, float lo, float hi, uint64_t *st)
{
    float *x = kt_rand(n, lo, hi, st);
    for (int64_t i = 0; i < n; i++)
        if (qc_test_rand(st) & 1)
            x[i] = -x[i];
    return x;
}

static inline float *kt_zeros(int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

static inline double *kt_to_d(const float *x, int64_t n)
{
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        d[i] = (double)x[i];
    return d;
}

static inline float *kt_to_f(const double *x, int64_t n)
{
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)x[i];
    return f;
}

static inline double gc_loss(struct gc *g)
{
    g->fwd(g);
    double s = 0.0;
    for (int64_t i = 0; i < g->n_out; i++)
        s += g->w[i] * g->out[i];
    return s;
}

/* Allocates out and w (w random in [-1,1], returned as floats for dout too). */
static inline float *gc_setup(struct gc *g, int64_t n_out, uint64_t *st)
{
    g->n_out = n_out;
    g->out = calloc((size_t)(n_out > 0 ? n_out : 1), sizeof(double));
    float *wf = kt_rand(n_out, -1.0f, 1.0f, st);
    g->w = kt_to_d(wf, n_out);
    return wf;
}

static inline void gc_free(struct gc *g)
{
    for (int i = 0; i < GC_MAX_IN; i++)
        free(g->in[i]);
    free(g->out);
    free(g->w);
    memset(g, 0, sizeof(*g));
}

/* Compares grad (fp32 backward of input k) with central differences; |got − num| <= atol +
 * rtol·|num|. Prints the first 5 mismatches. Returns the number of mismatches. */
static inline int gc_check(struct gc *g, int k, const float *grad, double atol, double rtol,
                           const char *what)
{
    int bad = 0;
    double *x = g->in[k];
    for (int64_t j = 0; j < g->n_in[k]; j++) {
        double x0 = x[j];
        x[j] = x0 + GC_STEP;
        double lp = gc_loss(g);
        x[j] = x0 - GC_STEP;
        double lm = gc_loss(g);
        x[j] = x0;
        double num = (lp - lm) / (2.0 * GC_STEP);
        double got = (double)grad[j];
        if (!(fabs(got - num) <= atol + rtol * fabs(num))) {
            if (bad < 5)
                T_FAIL_AT("%s: grad[%lld] = %.9g, central difference %.9g", what, (long long)j, got,
                          num);
            bad++;
        }
    }
    if (bad)
        printf("    %s: %d of %lld gradient entries out of tolerance\n", what, bad,
               (long long)g->n_in[k]);
    return bad;
}

/* max |a − b| over n with a float, b double; used for forward checks. */
static inline double kt_maxdiff(const float *a, const double *b, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m))
            m = isnan(d) ? (double)INFINITY : d;
    }
    return m;
}

static inline double kt_dot_fd(const float *a, const double *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static inline double kt_dot_ff(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

/* Whether this machine's CPU GEMM gives a row the same bits whatever the GEMM's row count (the
 * modes run the same rows in groups of other sizes: qc_attention.h). OpenBLAS does on some CPUs;
 * where it does not (e.g. a small-matrix kernel for few rows), only the tolerances below can
 * hold, and the test says so. Probed for the forward and the backward's dx, at the model's width.
 */
static inline bool kt_gemm_rows_exact(int64_t D)
{
    enum { N = 600, FEW = 7 };
    float *w = malloc((size_t)(D * D) * sizeof *w), *x = malloc((size_t)(N * D) * sizeof *x);
    float *y = malloc((size_t)(N * D) * sizeof *y), *y7 = malloc((size_t)(FEW * D) * sizeof *y7);
    float *dx = malloc((size_t)(N * D) * sizeof *dx),
          *dx7 = malloc((size_t)(FEW * D) * sizeof *dx7);
    if (!(w && x && y && y7 && dx && dx7))
        T_FATAL("out of memory");
    uint64_t r = 12345;
    for (int64_t i = 0; i < N * D; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(r >> 40) / (double)(1ULL << 24) - 0.5);
        if (i < D * D)
            w[i] = x[i] * 0.3f;
    }
    qc_linear_forward_cpu(y, x, D, w, NULL, N, D, D, false);
    qc_linear_forward_cpu(y7, x, D, w, NULL, FEW, D, D, false);
    qc_linear_backward_cpu(dx, D, NULL, NULL, x, x, D, w, N, D, D, false);
    qc_linear_backward_cpu(dx7, D, NULL, NULL, x, x, D, w, FEW, D, D, false);
    const bool same = memcmp(y, y7, (size_t)(FEW * D) * sizeof *y) == 0 &&
                      memcmp(dx, dx7, (size_t)(FEW * D) * sizeof *dx) == 0;
    free(w), free(x), free(y), free(y7), free(dx), free(dx7);
    return same;
}

#endif /* QC_TESTS_KERNELS_TESTLIB_H */
