/*
 * test_half_cuda.c — the 16-bit CUDA ops (train.precision bf16 / fp16, docs/PRECISION.md) against
 * the CPU oracle, op by op: the round / pack16 / unpack16 / scale kernels (bit for bit), the
 * linear op's 16-bit GEMMs (forward, input gradient, weight gradient, bias gradient; at the
 * launcher and through the exec) and the GRU (sequence and cell, forward and backward), in bf16
 * and in fp16, each at a tolerance computed per element from the inputs.
 *
 * The tolerance (one fp32 dot product of K terms plus an initial value c0):
 *   Both sides multiply the same operands: the ones the oracle rounds (kernels/exec.c) rounded
 *   to the precision by both. A 16-bit × 16-bit product is exact in fp32 (8+8 or 11+11
 *   significant bits <= 24); an fp32 × 16-bit product (the GRU's h·W_hh, dhg·W_hh, dxg·W_ih,
 *   x·dxg) is exact inside an FMA and otherwise rounded once. So the two sides differ only by
 *   the rounding of their sums. With u = 2^-24 and S = |c0| + Σ|a_k·b_k|:
 *     CPU (OpenBLAS, round to nearest): |err| <= (K + 1)·u·S (K − 1 additions, the product
 *       roundings, the initial value);
 *     GPU: the tensor cores align the products to the largest exponent and truncate (Fasi et
 *       al., "Numerical behavior of NVIDIA tensor cores", 2021): up to 2u per addition, which we
 *       take as 4u (unknown internals); one more rounding per chunk partial added into the
 *       output (the weight gradient over `nchunk` row chunks, qc_lowp_gemm.h) and for α/β:
 *       |err| <= 4·(K + 2·nchunk + 2)·u·S, any summation order (split-K included).
 *   bound(K, nchunk, S) = (K + 1 + 4·(K + 2·nchunk + 2))·u·S + 2^-140 (an underflowing term).
 *   The exec's forward then rounds the output to 16 bits: one more spacing of the precision at
 *   |ref| + bound. Elementwise steps (the GRU's gates): each fp32 operation of either side rounds
 *   once (or is fused into an FMA on the GPU): 4u of its result's magnitude per operation; expf
 *   and tanhf of the GPU and of glibc differ by a few ulp: 64u absolute (their values are <= 1);
 *   σ and tanh are Lipschitz (1/4 and 1), so input differences carry through exactly bounded.
 *   Checked: |gpu − cpu| <= bound, NaN/Inf agree, two GPU runs give the same bits, inputs stay
 *   unchanged, 1 KiB guard bands around every device buffer stay intact. The first 10
 *   mismatches of a tensor are printed, with nmse (Σ d² / Σ ref²) and the worst |d| / bound.
 *
 * The GRU is checked without compounding its recurrence into the bound: the forward step by
 * step from the GPU's own state (hs[t] in, hs[t+1] and the gates out, against the CPU cell on
 * the same state: "teacher forcing"); the backward, which is linear in the gradient for given
 * saved tensors, by propagating the bound through the steps (against the oracle's per-step gate
 * gradients, left in its scratch, and the oracle's running state gradient, recomputed bit for
 * bit from them), and its final GEMMs (dx, dW_ih, dW_hh, the biases) from the GPU's own gate
 * gradients.
 *
 * Two input families per case: "signed" (uniform with random signs, the realistic one) and
 * "coherent" (positive, each value between two 16-bit values at 0.3–0.45 or 0.55–0.7 of the
 * spacing; the GRU backward's saved gates set so that the gate gradients equal dh itself): there
 * an operand that is not rounded, rounded by truncation, or rounded where the oracle keeps fp32
 * shifts every term of a sum the same way, far past the bound.
 *
 * Two executables from this file:
 *   test_half_cuda_host (ARGS --host, label cpu, every build): the chunk plan
 *     (qc_lowp_gemm.h) and the tolerance machinery, with a host simulation of the CUDA
 *     algorithm (the rounding, the chunks, other summation orders) in place of the device: it
 *     must pass, and each of its mutations (an operand not rounded, truncation instead of
 *     nearest-even, h or dhg rounded, a skipped chunk, a lost bias) must fail.
 *   test_half_cuda (label gpu, CUDA builds; exits 77 without a GPU): the same checks with the
 *     CUDA ops.
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_exec.h"
#include "qc_half.h"
#include "qc_kernels.h"
#include "qc_lowp_gemm.h"
#include "testutil.h"

#ifdef QC_HAVE_CUDA
#    include <cuda_runtime.h>

#    include "qc_alloc.h"
#    include "qc_device.h"
#    include "qc_kernels_cuda.h"
#    include "cuda_probe.h"
#    include "kernels_cuda_testlib.h"
#endif

#define U24       0x1p-24
#define MAX_SHOWN 10
#define WS_BYTES                                                                                   \
    ((size_t)16 << 20) /* the op context's workspace (QC_KERNELS_CUDA_WORKSPACE_BYTES) */

static uint64_t g_rng;
static bool g_quiet; /* mutation runs: count violations, print nothing */

// ---- host helpers -----------------------------------------------------------------------------

static float *fnew(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p)
        T_FATAL("out of host memory (%" PRId64 " floats)", n);
    return p;
}

static float *fdup(const float *src, int64_t n)
{
    float *p = fnew(n);
    if (n > 0)
        memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

static double urand(void)
{
    return (double)(qc_test_rand(&g_rng) >> 11) * 0x1p-53;
}

/* The spacing of prec's values at magnitude |x| (the ulp of the 16-bit format there). */
static double spacing16(double x, int prec)
{
    const double a = fabs(x);
    int e = 0;
    if (a > 0.0)
        (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
    const int E = a > 0.0 ? e - 1 : -1000;
    if (prec == QC_PREC_BF16)
        return ldexp(1.0, (E < -126 ? -126 : E) - 7);
    return ldexp(1.0, (E < -14 ? -14 : E) - 10);
}

/* x rounded toward zero to prec (the mutation "truncation instead of nearest-even"). */
static float trunc16(float x, int prec)
{
    const float r = qc_round_prec(x, prec);
    if (!isfinite(x) || fabsf(r) <= fabsf(x))
        return r;
    const uint16_t h = qc_half_from_f32(r, prec);
    return qc_f32_from_half((uint16_t)(h - 1), prec); /* one step toward zero, same sign */
}

enum fam { FAM_SIGNED = 0, FAM_COHERENT, FAM_COUNT };
static const char *const fam_name[FAM_COUNT] = {"signed", "coherent"};

/* One input value in [lo, hi] (signed family) or, coherent, a positive value in [hi/2, hi]
 * between two 16-bit values: RNE, truncation and no rounding give three different results. */
static float gen(enum fam f, float lo, float hi, int prec)
{
    if (f == FAM_SIGNED)
        return lo + (float)urand() * (hi - lo);
    const float q = qc_round_prec(0.5f * hi + 0.5f * hi * (float)urand(), prec);
    const double fr = (qc_test_rand(&g_rng) & 1) ? 0.3 + 0.15 * urand() : 0.55 + 0.15 * urand();
    return (float)((double)q + fr * spacing16((double)q, prec));
}

static float *fgen(int64_t n, enum fam f, float lo, float hi, int prec)
{
    float *p = fnew(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = gen(f, lo, hi, prec);
    return p;
}

/* A (rows, cols) copy of src (leading dimension ld) rounded to prec: the oracle's operand. */
static float *rounded(const float *src, int64_t rows, int64_t cols, int64_t ld, int prec)
{
    float *d = fnew(rows * cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            d[r * cols + c] = qc_round_prec(src[r * ld + c], prec);
    return d;
}

static float *fabs_copy(const float *src, int64_t n)
{
    float *d = fnew(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = fabsf(src[i]);
    return d;
}

/* bound(K, nchunk, S) of the file comment; S computed in fp32 by OpenBLAS from |operands|, so
 * it is inflated by 2^-10 to cover its own rounding. */
static double dot_bound(int64_t K, int64_t nchunk, double S)
{
    const double steps = (double)(K + 1) + 4.0 * (double)(K + 2 * nchunk + 2);
    return steps * U24 * S * (1.0 + 0x1p-10) + 0x1p-140;
}

// ---- comparison -------------------------------------------------------------------------------

/* got vs ref, |got − ref| <= bound[i] (NaN/Inf must agree). Returns the violations; prints the
 * first MAX_SHOWN and a summary unless g_quiet, and marks the test failed on any. */
static int64_t expect_within(const char *what, const float *got, const float *ref,
                             const double *bound, int64_t n)
{
    int64_t bad = 0;
    double se = 0.0, sr = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = (double)got[i], r = (double)ref[i];
        bool ok;
        double d = 0.0;
        if (!isfinite(g) || !isfinite(r)) {
            ok = (isnan(g) && isnan(r)) || (isinf(g) && isinf(r) && g == r);
        } else {
            d = fabs(g - r);
            ok = d <= bound[i];
            se += d * d;
            sr += r * r;
            if (bound[i] > 0.0 && d / bound[i] > worst)
                worst = d / bound[i];
        }
        if (!ok) {
            if (bad < MAX_SHOWN && !g_quiet)
                printf("    %s[%" PRId64 "]: got %.9g ref %.9g |d| %.3g > bound %.3g\n", what, i, g,
                       r, d, bound[i]);
            bad++;
        }
    }
    if (!g_quiet && (bad || getenv("QC_TEST_VERBOSE")))
        printf("    %s: %" PRId64 " of %" PRId64 " out of bound; nmse %.3g; worst |d|/bound %.3g\n",
               what, bad, n, sr > 0.0 ? se / sr : se, worst);
    if (bad && !g_quiet)
        T_FAIL_AT("%s: %" PRId64 " elements past the fp32-accumulation bound", what, bad);
    return bad;
}

static int64_t expect_bits(const char *what, const float *got, const float *ref, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &ref[i], sizeof(float)) != 0) {
            if (bad < MAX_SHOWN && !g_quiet)
                printf("    %s[%" PRId64 "]: got %.9g (%08x) ref %.9g (%08x)\n", what, i,
                       (double)got[i], (unsigned)qc_f32_bits(got[i]), (double)ref[i],
                       (unsigned)qc_f32_bits(ref[i]));
            bad++;
        }
    }
    if (bad && !g_quiet)
        T_FAIL_AT("%s: %" PRId64 " of %" PRId64 " elements not bit-identical", what, bad, n);
    return bad;
}

// ---- the implementations under test -------------------------------------------------------------
/* Host pointers in and out; outputs hold their initial content on entry (ACCUM outputs add to
 * it). The CUDA implementation uploads, runs twice and downloads; the simulation computes on
 * the host what the CUDA launchers are documented to compute, optionally broken (mut). */

enum mut {
    MUT_NONE = 0,
    MUT_NO_ROUND_INP,  /* linear / GRU: the input rows (x) not rounded */
    MUT_NO_ROUND_W,    /* the weight(s) not rounded */
    MUT_NO_ROUND_DOUT, /* linear backward: the output gradient not rounded */
    MUT_TRUNC,         /* every rounding toward zero instead of to nearest even */
    MUT_ROUND_H,       /* GRU: the hidden state rounded (the oracle keeps it fp32) */
    MUT_ROUND_DHG,     /* GRU backward: the gate gradients rounded before W_hh */
    MUT_SKIP_CHUNK,    /* the last row chunk of a 16-bit GEMM not computed */
    MUT_NO_BIAS,       /* linear forward: the bias lost */
    MUT_COUNT
};
static const char *const mut_name[MUT_COUNT] = {
    "none",      "input not rounded",  "weight not rounded", "dout not rounded", "truncation",
    "h rounded", "gate grads rounded", "last chunk skipped", "bias lost"};

struct impl {
    const char *name;
    int64_t area; /* floats of the rounding area (the dW bound's chunk count) */
    enum mut mut; /* simulation only */
    /* exec: through qc_op_linear_forward (the output rounded); else the _prec launcher */
    void (*lin_fwd)(const struct impl *im, float *out, const float *inp, int64_t ldi,
                    const float *w, const float *b, int64_t N, int64_t IC, int64_t OC, bool accum,
                    int prec, bool exec);
    void (*lin_bwd)(const struct impl *im, float *dinp, int64_t lddi, float *dw, float *db,
                    const float *dout, const float *inp, int64_t ldi, const float *w, int64_t N,
                    int64_t IC, int64_t OC, bool accum, int prec);
    /* the GRU through the exec; cell = the cell ops (L = 1, hs = [h, h_out]) */
    void (*gru_fwd)(const struct impl *im, bool cell, float *hs, float *gates, const float *x,
                    const float *h0, const float *wih, const float *bih, const float *whh,
                    const float *bhh, int64_t L, int64_t N, int64_t IC, int64_t C, int prec);
    /* scr (out): the op's scratch afterwards (6LNC + NC floats; the cell's 6NC) */
    void (*gru_bwd)(const struct impl *im, bool cell, float *dx, float *dh0, float *dwih,
                    float *dbih, float *dwhh, float *dbhh, const float *dlast, const float *hs,
                    const float *gates, const float *x, const float *wih, const float *whh,
                    int64_t L, int64_t N, int64_t IC, int64_t C, int prec, float *scr);
};

// ---- the simulation -----------------------------------------------------------------------------

static float sim_round(const struct impl *im, float x, int prec)
{
    return im->mut == MUT_TRUNC ? trunc16(x, prec) : qc_round_prec(x, prec);
}

static float *sim_rounded(const struct impl *im, const float *src, int64_t rows, int64_t cols,
                          int64_t ld, int prec, bool skip)
{
    float *d = fnew(rows * cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            d[r * cols + c] = skip ? src[r * ld + c] : sim_round(im, src[r * ld + c], prec);
    return d;
}

/* Σ_k a[k·sa]·b[k·sb] in fp32, descending k (another order than OpenBLAS's). */
static float sim_dot(const float *a, int64_t sa, const float *b, int64_t sb, int64_t K)
{
    float acc = 0.0f;
    for (int64_t k = K - 1; k >= 0; k--)
        acc += a[k * sa] * b[k * sb];
    return acc;
}

static struct qc_lowp_plan sim_plan(const struct impl *im, int64_t N, int64_t IC, int64_t OC,
                                    bool w, bool inp, bool dout)
{
    struct qc_lowp_plan p;
    if (!qc_lowp_plan_make(im->area, N, IC, OC, w, inp, dout, &p))
        T_FATAL("simulation: area of %" PRId64 " floats too small", im->area);
    return p;
}

static void sim_lin_fwd(const struct impl *im, float *out, const float *inp, int64_t ldi,
                        const float *w, const float *b, int64_t N, int64_t IC, int64_t OC,
                        bool accum, int prec, bool exec)
{
    const struct qc_lowp_plan p = sim_plan(im, N, IC, OC, true, true, false);
    float *wr = sim_rounded(im, w, OC, IC, IC, prec, im->mut == MUT_NO_ROUND_W);
    float *xr = sim_rounded(im, inp, N, IC, ldi, prec, im->mut == MUT_NO_ROUND_INP);
    const int64_t n_end = im->mut == MUT_SKIP_CHUNK ? (p.nchunk - 1) * p.rows : N;
    for (int64_t n = 0; n < n_end; n++)
        for (int64_t o = 0; o < OC; o++) {
            float *y = out + n * OC + o;
            float c0 = accum ? *y : 0.0f;
            if (b && im->mut != MUT_NO_BIAS)
                c0 = accum ? *y + b[o] : b[o];
            *y = sim_dot(xr + n * IC, 1, wr + o * IC, 1, IC) + c0;
        }
    if (exec)
        for (int64_t i = 0; i < N * OC; i++)
            out[i] = qc_round_prec(out[i], prec);
    free(wr);
    free(xr);
}

static void sim_lin_bwd(const struct impl *im, float *dinp, int64_t lddi, float *dw, float *db,
                        const float *dout, const float *inp, int64_t ldi, const float *w, int64_t N,
                        int64_t IC, int64_t OC, bool accum, int prec)
{
    const struct qc_lowp_plan p = sim_plan(im, N, IC, OC, dinp != NULL, dw != NULL, true);
    float *wr = dinp ? sim_rounded(im, w, OC, IC, IC, prec, im->mut == MUT_NO_ROUND_W) : NULL;
    float *xr = dw ? sim_rounded(im, inp, N, IC, ldi, prec, im->mut == MUT_NO_ROUND_INP) : NULL;
    float *gr = sim_rounded(im, dout, N, OC, OC, prec, im->mut == MUT_NO_ROUND_DOUT);
    const int64_t nch = im->mut == MUT_SKIP_CHUNK ? p.nchunk - 1 : p.nchunk;
    for (int64_t ch = 0; ch < nch; ch++) {
        const int64_t n0 = ch * p.rows, nc = N - n0 < p.rows ? N - n0 : p.rows;
        for (int64_t n = n0; dinp && n < n0 + nc; n++)
            for (int64_t i = 0; i < IC; i++) {
                float *y = dinp + n * lddi + i;
                *y = sim_dot(gr + n * OC, 1, wr + i, IC, OC) + (accum ? *y : 0.0f);
            }
        for (int64_t o = 0; dw && o < OC; o++)
            for (int64_t i = 0; i < IC; i++)
                dw[o * IC + i] += sim_dot(gr + n0 * OC + o, OC, xr + n0 * IC + i, IC, nc);
    }
    for (int64_t o = 0; db && o < OC; o++) {
        double s = 0.0;
        for (int64_t n = 0; n < N; n++)
            s += (double)dout[n * OC + o];
        db[o] += (float)s;
    }
    free(wr);
    free(xr);
    free(gr);
}

static inline float sim_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static void sim_gru_fwd(const struct impl *im, bool cell, float *hs, float *gates, const float *x,
                        const float *h0, const float *wih, const float *bih, const float *whh,
                        const float *bhh, int64_t L, int64_t N, int64_t IC, int64_t C, int prec)
{
    (void)cell;
    float *xr = sim_rounded(im, x, L * N, IC, IC, prec, im->mut == MUT_NO_ROUND_INP);
    float *wi = sim_rounded(im, wih, 3 * C, IC, IC, prec, im->mut == MUT_NO_ROUND_W);
    float *wh = sim_rounded(im, whh, 3 * C, C, C, prec, im->mut == MUT_NO_ROUND_W);
    float *hq = fnew(C), *xg = fnew(3 * C), *hg = fnew(3 * C);
    memcpy(hs, h0, (size_t)(N * C) * sizeof(float));
    for (int64_t t = 0; t < L; t++)
        for (int64_t n = 0; n < N; n++) {
            const float *h = hs + (t * N + n) * C;
            for (int64_t c = 0; c < C; c++)
                hq[c] = im->mut == MUT_ROUND_H ? sim_round(im, h[c], prec) : h[c];
            for (int64_t j = 0; j < 3 * C; j++) {
                xg[j] = sim_dot(xr + (t * N + n) * IC, 1, wi + j * IC, 1, IC) + bih[j];
                hg[j] = sim_dot(hq, 1, wh + j * C, 1, C) + bhh[j];
            }
            float *g = gates + (t * N + n) * 4 * C, *ho = hs + ((t + 1) * N + n) * C;
            for (int64_t c = 0; c < C; c++) {
                const float r = sim_sigmoid(xg[c] + hg[c]), z = sim_sigmoid(xg[C + c] + hg[C + c]);
                const float hn = hg[2 * C + c], nn = tanhf(xg[2 * C + c] + r * hn);
                ho[c] = (h[c] - nn) * z + nn;
                g[c] = r, g[C + c] = z, g[2 * C + c] = nn, g[3 * C + c] = hn;
            }
        }
    free(xr);
    free(wi);
    free(wh);
    free(hq);
    free(xg);
    free(hg);
}

static void sim_gru_bwd(const struct impl *im, bool cell, float *dx, float *dh0, float *dwih,
                        float *dbih, float *dwhh, float *dbhh, const float *dlast, const float *hs,
                        const float *gates, const float *x, const float *wih, const float *whh,
                        int64_t L, int64_t N, int64_t IC, int64_t C, int prec, float *scr)
{
    float *xr = sim_rounded(im, x, L * N, IC, IC, prec, im->mut == MUT_NO_ROUND_INP);
    float *wi = sim_rounded(im, wih, 3 * C, IC, IC, prec, im->mut == MUT_NO_ROUND_W);
    float *wh = sim_rounded(im, whh, 3 * C, C, C, prec, im->mut == MUT_NO_ROUND_W);
    float *dxg = scr, *dhg = scr + 3 * L * N * C;
    float *dh = fdup(dlast, N * C), *dq = fnew(3 * C);
    for (int64_t t = L - 1; t >= 0; t--)
        for (int64_t n = 0; n < N; n++) {
            const float *g = gates + (t * N + n) * 4 * C, *hp = hs + (t * N + n) * C;
            float *xo = dxg + (t * N + n) * 3 * C, *ho = dhg + (t * N + n) * 3 * C;
            float *d = dh + n * C;
            for (int64_t c = 0; c < C; c++) {
                const float r = g[c], z = g[C + c], nn = g[2 * C + c], hn = g[3 * C + c];
                const float dz = d[c] * (hp[c] - nn), dn = d[c] * (1.0f - z);
                const float dpn = dn * (1.0f - nn * nn), dr = dpn * hn;
                xo[c] = ho[c] = dr * r * (1.0f - r);
                xo[C + c] = ho[C + c] = dz * z * (1.0f - z);
                xo[2 * C + c] = dpn;
                ho[2 * C + c] = dpn * r;
                d[c] = d[c] * z;
            }
            for (int64_t j = 0; j < 3 * C; j++)
                dq[j] = im->mut == MUT_ROUND_DHG ? sim_round(im, ho[j], prec) : ho[j];
            for (int64_t c = 0; c < C; c++)
                d[c] += sim_dot(dq, 1, wh + c, C, 3 * C);
        }
    if (!cell)
        memcpy(scr + 6 * L * N * C, dh, (size_t)(N * C) * sizeof(float));
    if (dh0)
        memcpy(dh0, dh, (size_t)(N * C) * sizeof(float));
    const int64_t R = L * N;
    const struct qc_lowp_plan p = sim_plan(im, R, IC, 3 * C, dx != NULL, dwih != NULL, false);
    const int64_t nch = im->mut == MUT_SKIP_CHUNK ? p.nchunk - 1 : p.nchunk;
    for (int64_t n = 0; dx && n < R; n++)
        for (int64_t i = 0; i < IC; i++)
            dx[n * IC + i] = sim_dot(dxg + n * 3 * C, 1, wi + i, IC, 3 * C);
    for (int64_t ch = 0; ch < nch; ch++) {
        const int64_t n0 = ch * p.rows, nc = R - n0 < p.rows ? R - n0 : p.rows;
        for (int64_t j = 0; dwih && j < 3 * C; j++)
            for (int64_t i = 0; i < IC; i++)
                dwih[j * IC + i] += sim_dot(dxg + n0 * 3 * C + j, 3 * C, xr + n0 * IC + i, IC, nc);
    }
    for (int64_t j = 0; j < 3 * C; j++) {
        double sx = 0.0, sh = 0.0;
        for (int64_t n = 0; n < R; n++) {
            sx += (double)dxg[n * 3 * C + j];
            sh += (double)dhg[n * 3 * C + j];
        }
        if (dbih)
            dbih[j] += (float)sx;
        if (dbhh)
            dbhh[j] += (float)sh;
        for (int64_t i = 0; dwhh && i < C; i++)
            dwhh[j * C + i] += sim_dot(dhg + j, 3 * C, hs + i, C, R);
    }
    free(xr);
    free(wi);
    free(wh);
    free(dh);
    free(dq);
}

static const struct impl sim_impl = {"host simulation", 0,           MUT_NONE,   sim_lin_fwd,
                                     sim_lin_bwd,       sim_gru_fwd, sim_gru_bwd};

// ---- the linear op ------------------------------------------------------------------------------

struct lcase {
    const char *name;
    int64_t N, IC, OC, ld_pad; /* ldi = lddi = IC + ld_pad */
    bool accum, bias;
};

/* One linear case in one precision and family: forward at the launcher (no output rounding:
 * the tight check) and through the exec, backward through the exec. Returns the violations. */
static int64_t linear_case(const struct impl *im, const struct lcase *lc, int prec, enum fam f)
{
    const int64_t N = lc->N, IC = lc->IC, OC = lc->OC, ld = IC + lc->ld_pad;
    const float wmax = f == FAM_SIGNED ? 0.2f : 2.0f / (float)IC;
    float *inp = fgen(N * ld, f, -1.0f, 1.0f, prec);
    float *w = fgen(OC * IC, f, -wmax, wmax, prec);
    float *b = lc->bias ? fgen(OC, f, -0.5f, 0.5f, prec) : NULL;
    float *dout = fgen(N * OC, f, -1.0f, 1.0f, prec);
    float *init_out = fgen(N * OC, FAM_SIGNED, -1.0f, 1.0f, prec);
    float *init_dinp = fgen(N * ld, FAM_SIGNED, -1.0f, 1.0f, prec);
    float *init_dw = fgen(OC * IC, FAM_SIGNED, -1.0f, 1.0f, prec);
    float *init_db = fgen(OC, FAM_SIGNED, -1.0f, 1.0f, prec);
    /* the oracle's operands and the magnitudes |a|, |b| for S */
    float *ir = rounded(inp, N, IC, ld, prec), *wr = rounded(w, OC, IC, IC, prec);
    float *dr = rounded(dout, N, OC, OC, prec);
    float *air = fabs_copy(ir, N * IC), *awr = fabs_copy(wr, OC * IC), *adr = fabs_copy(dr, N * OC);
    float *adout = fabs_copy(dout, N * OC);
    int64_t bad = 0;
    char what[160];

    /* ---- forward: c0 = bias (+ out), both sides form it alike; S = |c0| + Σ|x·w| */
    float *c0 = fnew(N * OC), *S = fnew(N * OC);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            const float yi = init_out[n * OC + o];
            c0[n * OC + o] = b ? (lc->accum ? yi + b[o] : b[o]) : (lc->accum ? yi : 0.0f);
        }
    qc_linear_forward_cpu(S, air, IC, awr, NULL, N, IC, OC, false);
    double *bound = malloc((size_t)(N * (OC > ld ? OC : ld) + OC * IC + 1) * sizeof(double));
    for (int64_t i = 0; i < N * OC; i++)
        bound[i] = dot_bound(IC, 1, (double)fabsf(c0[i]) + (double)S[i]);
    /* launcher: the oracle's GEMM on the rounded operands, unrounded output */
    float *ref = fdup(init_out, N * OC), *got = fdup(init_out, N * OC);
    qc_linear_forward_cpu(ref, ir, IC, wr, b, N, IC, OC, lc->accum);
    im->lin_fwd(im, got, inp, ld, w, b, N, IC, OC, lc->accum, prec, false);
    snprintf(what, sizeof what, "%s %s %s: forward (launcher)", lc->name, qc_precision_str(prec),
             fam_name[f]);
    bad += expect_within(what, got, ref, bound, N * OC);
    /* exec: the oracle rounds copies and the output; one more spacing at |ref| + bound */
    const struct qc_exec cpu = {
        .backend = QC_EXEC_CPU, .stream = NULL, .emu = NULL, .precision = prec};
    memcpy(ref, init_out, (size_t)(N * OC) * sizeof(float));
    memcpy(got, init_out, (size_t)(N * OC) * sizeof(float));
    qc_op_linear_forward(&cpu, ref, inp, ld, w, b, N, IC, OC, lc->accum);
    im->lin_fwd(im, got, inp, ld, w, b, N, IC, OC, lc->accum, prec, true);
    for (int64_t i = 0; i < N * OC; i++)
        bound[i] += spacing16(fabs((double)ref[i]) + bound[i], prec);
    snprintf(what, sizeof what, "%s %s %s: forward (exec)", lc->name, qc_precision_str(prec),
             fam_name[f]);
    bad += expect_within(what, got, ref, bound, N * OC);
    free(ref);
    free(got);

    /* ---- backward through the exec: dinp (K = OC), dW (K = N, in the plan's chunks), db */
    float *rdi = fdup(init_dinp, N * ld), *gdi = fdup(init_dinp, N * ld);
    float *rdw = fdup(init_dw, OC * IC), *gdw = fdup(init_dw, OC * IC);
    float *rdb = fdup(init_db, OC), *gdb = fdup(init_db, OC);
    qc_op_linear_backward(&cpu, rdi, ld, rdw, rdb, dout, inp, ld, w, N, IC, OC, lc->accum);
    im->lin_bwd(im, gdi, ld, gdw, gdb, dout, inp, ld, w, N, IC, OC, lc->accum, prec);
    /* dinp: S = |init| (accum) + Σ_o |w_r·dout_r|; the padding columns stay untouched */
    float *Sd = fnew(N * IC);
    qc_linear_backward_cpu(Sd, IC, NULL, NULL, adr, NULL, IC, awr, N, IC, OC, false);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < ld; i++)
            bound[n * ld + i] =
                i < IC ? dot_bound(OC, 1,
                                   (lc->accum ? fabs((double)init_dinp[n * ld + i]) : 0.0) +
                                       (double)Sd[n * IC + i])
                       : 0.0;
    snprintf(what, sizeof what, "%s %s %s: dinp", lc->name, qc_precision_str(prec), fam_name[f]);
    bad += expect_within(what, gdi, rdi, bound, N * ld);
    /* dW: ACCUM; the chunks of the plan the launcher makes (w, inp, dout rounded) */
    struct qc_lowp_plan p = {0, 0, 0, 0, 0, 0};
    if (!qc_lowp_plan_make(im->area, N, IC, OC, true, true, true, &p))
        T_FATAL("linear %s: no plan in %" PRId64 " floats", lc->name, im->area);
    float *Sw = fnew(OC * IC);
    qc_linear_backward_cpu(NULL, IC, Sw, NULL, adr, air, IC, NULL, N, IC, OC, false);
    for (int64_t i = 0; i < OC * IC; i++)
        bound[i] = dot_bound(N, p.nchunk, fabs((double)init_dw[i]) + (double)Sw[i]);
    snprintf(what, sizeof what, "%s %s %s: dweight", lc->name, qc_precision_str(prec), fam_name[f]);
    bad += expect_within(what, gdw, rdw, bound, OC * IC);
    /* db: the fp32 dout summed in double by both */
    float *Sb = fnew(OC);
    qc_linear_backward_cpu(NULL, IC, NULL, Sb, adout, NULL, IC, NULL, N, IC, OC, false);
    for (int64_t o = 0; o < OC; o++)
        bound[o] = dot_bound(N, 1, fabs((double)init_db[o]) + (double)Sb[o]);
    snprintf(what, sizeof what, "%s %s %s: dbias", lc->name, qc_precision_str(prec), fam_name[f]);
    bad += expect_within(what, gdb, rdb, bound, OC);

    float *all[] = {inp, w,   b,   dout, init_out, init_dinp, init_dw, init_db, ir,
                    wr,  dr,  air, awr,  adr,      adout,     c0,      S,       rdi,
                    gdi, rdw, gdw, rdb,  gdb,      Sd,        Sw,      Sb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    free(bound);
    return bad;
}

// ---- the GRU ------------------------------------------------------------------------------------

/* |a·b| error bound of a product computed by both sides from a (error Ea) and b (error Eb):
 * the difference of the exact products plus each side's rounding (4u of the product). */
static double prod_err(double a, double Ea, double b, double Eb)
{
    const double ma = fabs(a) + Ea, mb = fabs(b) + Eb;
    return fabs(b) * Ea + fabs(a) * Eb + Ea * Eb + 4.0 * U24 * ma * mb;
}

#define TRANS_EPS (64.0 * U24) /* expf / tanhf of the GPU vs glibc, values <= 1 */

struct gru_dims {
    int64_t L, N, IC, C;
};

/* Forward, one step from state h (N,C): the oracle's cell on the GPU's own state. got_h (N,C),
 * got_g (N,4C) vs the CPU cell. xr_t, wir, whr: the oracle's rounded operands. */
static int64_t gru_step_check(const char *tag, const float *got_h, const float *got_g,
                              const float *h, const float *xr_t, const float *wir, const float *bih,
                              const float *whr, const float *bhh, int64_t N, int64_t IC, int64_t C)
{
    float *rh = fnew(N * C), *rg = fnew(N * 4 * C), *scr = fnew(qc_gru_cell_scratch_numel(N, C));
    qc_gru_cell_forward_cpu(rh, rg, xr_t, h, wir, bih, whr, bhh, N, IC, C, scr);
    const float *xg = scr, *hg = scr + 3 * N * C; /* the cell's pre-activations */
    float *ax = fabs_copy(xr_t, N * IC), *aw = fabs_copy(wir, 3 * C * IC);
    float *ah = fabs_copy(h, N * C), *au = fabs_copy(whr, 3 * C * C);
    float *Sx = fnew(N * 3 * C), *Sh = fnew(N * 3 * C);
    qc_linear_forward_cpu(Sx, ax, IC, aw, NULL, N, IC, 3 * C, false);
    qc_linear_forward_cpu(Sh, ah, C, au, NULL, N, C, 3 * C, false);
    double *bh = malloc((size_t)(N * C) * sizeof(double));
    double *bg = malloc((size_t)(N * 4 * C) * sizeof(double));
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double Bx[3], Bh[3];
            for (int k = 0; k < 3; k++) {
                const int64_t j = k * C + c;
                Bx[k] = dot_bound(IC, 1, fabs((double)bih[j]) + (double)Sx[n * 3 * C + j]);
                Bh[k] = dot_bound(C, 1, fabs((double)bhh[j]) + (double)Sh[n * 3 * C + j]);
            }
            const float *x3 = xg + n * 3 * C, *h3 = hg + n * 3 * C, *g = rg + n * 4 * C;
            const double r = (double)g[c], z = (double)g[C + c], nn = (double)g[2 * C + c],
                         hn = (double)g[3 * C + c];
            /* σ(xg + hg): the add rounds on each side (4u), σ is 1/4-Lipschitz */
            const double Ear =
                Bx[0] + Bh[0] +
                4.0 * U24 * (fabs((double)x3[c]) + fabs((double)h3[c]) + Bx[0] + Bh[0]);
            const double Eaz =
                Bx[1] + Bh[1] +
                4.0 * U24 * (fabs((double)x3[C + c]) + fabs((double)h3[C + c]) + Bx[1] + Bh[1]);
            const double Er = Ear / 4.0 + TRANS_EPS, Ez = Eaz / 4.0 + TRANS_EPS;
            const double Ehn = Bh[2];
            /* n = tanh(xg_n + r·hn) */
            const double Erh = prod_err(r, Er, hn, Ehn);
            const double Earg =
                Bx[2] + Erh +
                4.0 * U24 * (fabs((double)x3[2 * C + c]) + Bx[2] + fabs(r * hn) + Erh);
            const double En = Earg + TRANS_EPS;
            /* h' = (h − n)·z + n: h is the same input on both sides */
            const double hp = (double)h[n * C + c], d = hp - nn;
            const double Eh = prod_err(d, En, z, Ez) + En +
                              4.0 * U24 * (fabs(d * z) + fabs(nn) + En + Ez + fabs(hp));
            bh[n * C + c] = Eh;
            double *gb = bg + n * 4 * C;
            gb[c] = Er, gb[C + c] = Ez, gb[2 * C + c] = En, gb[3 * C + c] = Ehn;
        }
    char what[256];
    snprintf(what, sizeof what, "%s: gates", tag);
    int64_t bad = expect_within(what, got_g, rg, bg, N * 4 * C);
    snprintf(what, sizeof what, "%s: h", tag);
    bad += expect_within(what, got_h, rh, bh, N * C);
    float *all[] = {rh, rg, scr, ax, aw, ah, au, Sx, Sh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    free(bh);
    free(bg);
    return bad;
}

/* One GRU case (sequence, or the cell with L = 1) in one precision and family. */
static int64_t gru_case(const struct impl *im, const char *name, bool cell,
                        const struct gru_dims *dm, int prec, enum fam f)
{
    const int64_t L = cell ? 1 : dm->L, N = dm->N, IC = dm->IC, C = dm->C, R = L * N;
    /* coherent: pre-activations of order 1 (σ' near its 1/4), every rounding one-sided */
    const float wmax = f == FAM_SIGNED ? 0.15f : 1.0f / (float)(IC > C ? IC : C);
    float *x = fgen(R * IC, f, -1.0f, 1.0f, prec), *h0 = fgen(N * C, f, -1.0f, 1.0f, prec);
    float *wih = fgen(3 * C * IC, f, -wmax, wmax, prec),
          *whh = fgen(3 * C * C, f, -wmax, wmax, prec);
    float *bih = fgen(3 * C, FAM_SIGNED, -0.1f, 0.1f, prec);
    float *bhh = fgen(3 * C, FAM_SIGNED, -0.1f, 0.1f, prec);
    float *dlast = fgen(N * C, f, -1.0f, 1.0f, prec);
    float *xr = rounded(x, R, IC, IC, prec), *wir = rounded(wih, 3 * C, IC, IC, prec);
    float *whr = rounded(whh, 3 * C, C, C, prec);
    const struct qc_exec cpu = {
        .backend = QC_EXEC_CPU, .stream = NULL, .emu = NULL, .precision = prec};
    int64_t bad = 0;
    char tag[200];

    /* ---- forward, step by step from the implementation's own states */
    float *hs = fnew((R + N) * C), *gates = fnew(R * 4 * C);
    for (int64_t i = 0; i < (R + N) * C; i++)
        hs[i] = NAN; /* every output element must be written */
    for (int64_t i = 0; i < R * 4 * C; i++)
        gates[i] = NAN;
    im->gru_fwd(im, cell, hs, gates, x, h0, wih, bih, whh, bhh, L, N, IC, C, prec);
    if (!cell) {
        snprintf(tag, sizeof tag, "%s %s %s: hs[0] = h0", name, qc_precision_str(prec),
                 fam_name[f]);
        bad += expect_bits(tag, hs, h0, N * C);
    }
    for (int64_t t = 0; t < L; t++) {
        snprintf(tag, sizeof tag, "%s %s %s: forward step %" PRId64, name, qc_precision_str(prec),
                 fam_name[f], t);
        const float *h = cell ? h0 : hs + t * N * C;
        bad += gru_step_check(tag, hs + (t + 1) * N * C, gates + t * N * 4 * C, h, xr + t * N * IC,
                              wir, bih, whr, bhh, N, IC, C);
    }

    /* ---- backward from the oracle's saved tensors (or, coherent, gates r = 1, z = n = 0: the
     * gate gradients are then dh itself, one-sided) */
    float *shs = fnew((R + N) * C), *sg = fnew(R * 4 * C);
    {
        float *sc = fnew(qc_gru_forward_scratch_numel(L, N, C) + 1);
        qc_op_gru_forward(&cpu, shs, sg, x, h0, wih, bih, whh, bhh, L, N, IC, C, sc);
        free(sc);
    }
    if (f == FAM_COHERENT)
        for (int64_t i = 0; i < R; i++)
            for (int64_t c = 0; c < C; c++) {
                float *g = sg + i * 4 * C;
                g[c] = 1.0f, g[C + c] = 0.0f, g[2 * C + c] = 0.0f;
            }
    if (cell)
        memcpy(shs, h0, (size_t)(N * C) * sizeof(float));
    float *init[6], *rout[6], *gout[6];
    const int64_t nout[6] = {R * IC, N * C, 3 * C * IC, 3 * C, 3 * C * C, 3 * C};
    for (int k = 0; k < 6; k++) {
        init[k] = fgen(nout[k], FAM_SIGNED, -1.0f, 1.0f, prec);
        rout[k] = fdup(init[k], nout[k]);
        gout[k] = fdup(init[k], nout[k]);
    }
    const int64_t nscr = cell ? 6 * N * C : 6 * R * C + N * C;
    float *rscr = fnew(nscr > qc_gru_backward_scratch_numel(L, N, C)
                           ? nscr
                           : qc_gru_backward_scratch_numel(L, N, C));
    float *gscr = fnew(nscr);
    if (cell)
        qc_op_gru_cell_backward(&cpu, rout[0], rout[1], rout[2], rout[3], rout[4], rout[5], dlast,
                                sg, x, shs, wih, whh, N, IC, C, rscr);
    else
        qc_op_gru_backward(&cpu, rout[0], rout[1], rout[2], rout[3], rout[4], rout[5], dlast, shs,
                           sg, x, wih, whh, L, N, IC, C, rscr);
    im->gru_bwd(im, cell, gout[0], gout[1], gout[2], gout[3], gout[4], gout[5], dlast, shs, sg, x,
                wih, whh, L, N, IC, C, prec, gscr);
    const float *rdxg = rscr, *rdhg = rscr + 3 * R * C, *gdxg = gscr, *gdhg = gscr + 3 * R * C;

    /* (a) the gate gradients step by step against the oracle's, the bound propagated through
     * the recursion: d (the oracle's running dh, recomputed bit for bit from its dhg), E (its
     * bound on the implementation's) */
    float *d = fdup(dlast, N * C), *dd = fnew(N * C);
    double *E = calloc((size_t)(N * C), sizeof(double));
    double *Exg = malloc((size_t)(N * 3 * C) * sizeof(double));
    double *Ehg = malloc((size_t)(N * 3 * C) * sizeof(double));
    double *Edd = malloc((size_t)(N * C) * sizeof(double));
    float *fe = fnew(N * 3 * C), *fw = fnew(N * C), *Sg = fnew(N * C), *am = fnew(N * 3 * C);
    float *awh = fabs_copy(whr, 3 * C * C);
    for (int64_t t = L - 1; t >= 0; t--) {
        const float *hst = shs + t * N * C, *gt = sg + t * N * 4 * C;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t i = n * C + c;
                const float *g = gt + n * 4 * C;
                const double r = (double)g[c], z = (double)g[C + c], nn = (double)g[2 * C + c],
                             hn = (double)g[3 * C + c];
                const double dv = (double)d[i], Ed = E[i];
                /* hp − nn, 1 − z, 1 − r: the same inputs, the same bits on both sides;
                 * 1 − nn·nn may be one FMA on the GPU: u apart */
                const double hpn = (double)hst[i] - nn, omz = 1.0 - z, omr = 1.0 - r;
                const double omn2 = 1.0 - nn * nn, Eomn2 = 2.0 * U24;
                const double dz = dv * hpn, Edz = prod_err(dv, Ed, hpn, 0.0);
                const double dn = dv * omz, Edn = prod_err(dv, Ed, omz, 0.0);
                const double dpn = dn * omn2, Edpn = prod_err(dn, Edn, omn2, Eomn2);
                const double dr = dpn * hn, Edr = prod_err(dpn, Edpn, hn, 0.0);
                const double dr1 = dr * r, Edr1 = prod_err(dr, Edr, r, 0.0);
                const double Edpr = prod_err(dr1, Edr1, omr, 0.0);
                const double dz1 = dz * z, Edz1 = prod_err(dz, Edz, z, 0.0);
                const double Edpz = prod_err(dz1, Edz1, omz, 0.0);
                const double Edpnr = prod_err(dpn, Edpn, r, 0.0);
                double *xe = Exg + n * 3 * C, *he = Ehg + n * 3 * C;
                xe[c] = he[c] = Edpr;
                xe[C + c] = he[C + c] = Edpz;
                xe[2 * C + c] = Edpn;
                he[2 * C + c] = Edpnr;
                Edd[i] = prod_err(dv, Ed, z, 0.0);
                dd[i] = d[i] * g[C + c]; /* the oracle's dh_direct, in fp32 as it computes it */
            }
        snprintf(tag, sizeof tag, "%s %s %s: dxg step %" PRId64, name, qc_precision_str(prec),
                 fam_name[f], t);
        bad += expect_within(tag, gdxg + t * N * 3 * C, rdxg + t * N * 3 * C, Exg, N * 3 * C);
        snprintf(tag, sizeof tag, "%s %s %s: dhg step %" PRId64, name, qc_precision_str(prec),
                 fam_name[f], t);
        bad += expect_within(tag, gdhg + t * N * 3 * C, rdhg + t * N * 3 * C, Ehg, N * 3 * C);
        /* the running dh: dd + dhg·W_hh (the oracle's op, bit for bit); the bound: the carried
         * errors through |W_hh| plus this GEMM's own */
        const float *rdhg_t = rdhg + t * N * 3 * C;
        qc_linear_backward_cpu(dd, C, NULL, NULL, rdhg_t, NULL, C, whr, N, C, 3 * C, true);
        for (int64_t i = 0; i < N * 3 * C; i++) {
            fe[i] = (float)Ehg[i];
            am[i] = fabsf(rdhg_t[i]) + (float)Ehg[i];
        }
        qc_linear_backward_cpu(fw, C, NULL, NULL, fe, NULL, C, awh, N, C, 3 * C, false);
        qc_linear_backward_cpu(Sg, C, NULL, NULL, am, NULL, C, awh, N, C, 3 * C, false);
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t i = n * C + c;
                const double direct =
                    fabs((double)d[i] * (double)sg[t * N * 4 * C + n * 4 * C + C + c]);
                E[i] = Edd[i] + (double)fw[i] * (1.0 + 0x1p-10) +
                       dot_bound(3 * C, 1, direct + Edd[i] + (double)Sg[i]);
            }
        memcpy(d, dd, (size_t)(N * C) * sizeof(float));
    }
    snprintf(tag, sizeof tag, "%s %s %s: oracle running dh recomputed", name,
             qc_precision_str(prec), fam_name[f]);
    if (!g_quiet) /* the recomputation is the oracle's own ops: bit for bit */
        bad += expect_bits(tag, d, rout[1], N * C);
    snprintf(tag, sizeof tag, "%s %s %s: %s", name, qc_precision_str(prec), fam_name[f],
             cell ? "dh" : "dh0");
    bad += expect_within(tag, gout[1], rout[1], E, N * C);

    /* (b) the final GEMMs from the implementation's own gate gradients */
    {
        double *bd = malloc((size_t)(R * IC + 9 * C * C + 3 * C * IC + 1) * sizeof(double));
        const int64_t nref = R * IC + 3 * C * (IC > C ? IC : C);
        float *ref = fnew(nref), *S = fnew(nref);
        float *agx = fabs_copy(gdxg, R * 3 * C), *agh = fabs_copy(gdhg, R * 3 * C);
        float *awi = fabs_copy(wir, 3 * C * IC), *axr = fabs_copy(xr, R * IC);
        float *ahs = fabs_copy(shs, R * C);
        /* dx = dxg·W_ih (OVERWRITE) */
        qc_linear_backward_cpu(ref, IC, NULL, NULL, gdxg, NULL, IC, wir, R, IC, 3 * C, false);
        qc_linear_backward_cpu(S, IC, NULL, NULL, agx, NULL, IC, awi, R, IC, 3 * C, false);
        for (int64_t i = 0; i < R * IC; i++)
            bd[i] = dot_bound(3 * C, 1, (double)S[i]);
        snprintf(tag, sizeof tag, "%s %s %s: dx", name, qc_precision_str(prec), fam_name[f]);
        bad += expect_within(tag, gout[0], ref, bd, R * IC);
        /* dW_ih += dxgᵀ·x_r, in the plan's row chunks */
        struct qc_lowp_plan p = {0, 0, 0, 0, 0, 0};
        if (!qc_lowp_plan_make(im->area, R, IC, 3 * C, true, true, false, &p))
            T_FATAL("gru: no plan");
        memcpy(ref, init[2], (size_t)(3 * C * IC) * sizeof(float));
        memset(S, 0, (size_t)(3 * C * IC) * sizeof(float));
        qc_linear_backward_cpu(NULL, IC, ref, NULL, gdxg, xr, IC, NULL, R, IC, 3 * C, false);
        qc_linear_backward_cpu(NULL, IC, S, NULL, agx, axr, IC, NULL, R, IC, 3 * C, false);
        for (int64_t i = 0; i < 3 * C * IC; i++)
            bd[i] = dot_bound(R, p.nchunk, fabs((double)init[2][i]) + (double)S[i]);
        snprintf(tag, sizeof tag, "%s %s %s: dw_ih", name, qc_precision_str(prec), fam_name[f]);
        bad += expect_within(tag, gout[2], ref, bd, 3 * C * IC);
        /* dW_hh += dhgᵀ·hs (fp32 operands) */
        memcpy(ref, init[4], (size_t)(3 * C * C) * sizeof(float));
        memset(S, 0, (size_t)(3 * C * C) * sizeof(float));
        qc_linear_backward_cpu(NULL, C, ref, NULL, gdhg, shs, C, NULL, R, C, 3 * C, false);
        qc_linear_backward_cpu(NULL, C, S, NULL, agh, ahs, C, NULL, R, C, 3 * C, false);
        for (int64_t i = 0; i < 3 * C * C; i++)
            bd[i] = dot_bound(R, 1, fabs((double)init[4][i]) + (double)S[i]);
        snprintf(tag, sizeof tag, "%s %s %s: dw_hh", name, qc_precision_str(prec), fam_name[f]);
        bad += expect_within(tag, gout[4], ref, bd, 3 * C * C);
        /* the biases: Σ over rows of the gate gradients (double on both) */
        for (int k = 3; k <= 5; k += 2) {
            const float *gg = k == 3 ? gdxg : gdhg, *ag = k == 3 ? agx : agh;
            memcpy(ref, init[k], (size_t)(3 * C) * sizeof(float));
            memset(S, 0, (size_t)(3 * C) * sizeof(float));
            qc_linear_backward_cpu(NULL, C, NULL, ref, gg, NULL, C, NULL, R, C, 3 * C, false);
            qc_linear_backward_cpu(NULL, C, NULL, S, ag, NULL, C, NULL, R, C, 3 * C, false);
            for (int64_t j = 0; j < 3 * C; j++)
                bd[j] = dot_bound(R, 1, fabs((double)init[k][j]) + (double)S[j]);
            snprintf(tag, sizeof tag, "%s %s %s: %s", name, qc_precision_str(prec), fam_name[f],
                     k == 3 ? "db_ih" : "db_hh");
            bad += expect_within(tag, gout[k], ref, bd, 3 * C);
        }
        float *all[] = {ref, S, agx, agh, awi, axr, ahs};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
        free(bd);
    }

    for (int k = 0; k < 6; k++) {
        free(init[k]);
        free(rout[k]);
        free(gout[k]);
    }
    float *all[] = {x,   h0, wih,  whh,  bih, bhh, dlast, xr, wir, whr, hs, gates,
                    shs, sg, rscr, gscr, d,   dd,  fe,    fw, Sg,  am,  awh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    free(E);
    free(Exg);
    free(Ehg);
    free(Edd);
    return bad;
}

// ---- host mode: the plan, and the checks against the simulation and its mutations ---------------

static void test_plan(void)
{
    int64_t tried = 0;
    const int64_t areas[] = {0, 63, 200, 4096, 5000, 65536, 2 * 1024 * 1024};
    const int64_t Ns[] = {0, 1, 7, 769, 48000};
    const int64_t dims[][2] = {{1, 1}, {7, 3}, {16, 48}, {128, 384}, {128, 512}, {512, 128}};
    for (size_t a = 0; a < sizeof areas / sizeof areas[0]; a++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
                for (int fl = 0; fl < 8; fl++) {
                    const int64_t area = areas[a], N = Ns[ni], IC = dims[di][0], OC = dims[di][1];
                    const bool w = fl & 1, inp = fl & 2, dout = fl & 4;
                    struct qc_lowp_plan p = {0, 0, 0, 0, 0, 0};
                    const bool ok = qc_lowp_plan_make(area, N, IC, OC, w, inp, dout, &p);
                    const int64_t per_row = (inp ? IC : 0) + (dout ? OC : 0);
                    /* the documented condition: the weight and one row of each (aligned) fit */
                    const int64_t wn = w ? OC * IC : 0;
                    const int64_t need1 = per_row == 0 ? wn
                                          : N == 0     ? qc_lowp_align(wn)
                                                   : qc_lowp_align(wn) + QC_LOWP_ALIGN + per_row;
                    tried++;
                    T_EXPECT(ok == (need1 <= area),
                             "area %" PRId64 " N %" PRId64 " IC %" PRId64 " OC %" PRId64
                             " flags %d: plan %d, need %" PRId64,
                             area, N, IC, OC, fl, ok, need1);
                    if (!ok)
                        continue;
                    T_EXPECT(p.used <= area && p.rows <= N && (N == 0 || p.rows >= 1),
                             "used %" PRId64 " rows %" PRId64, p.used, p.rows);
                    T_EXPECT(N == 0 ? p.nchunk == 0
                                    : p.nchunk * p.rows >= N && (p.nchunk - 1) * p.rows < N,
                             "chunks %" PRId64 " x %" PRId64 " rows cover N %" PRId64, p.nchunk,
                             p.rows, N);
                    T_EXPECT(per_row > 0 || p.rows == N, "nothing chunked: one chunk");
                    /* the pieces: aligned, in order, disjoint */
                    T_EXPECT((p.w_off == 0) == w && (p.inp_off >= 0) == inp &&
                                 (p.dout_off >= 0) == dout,
                             "pieces present as asked");
                    if (inp)
                        T_EXPECT(p.inp_off % QC_LOWP_ALIGN == 0 && p.inp_off >= (w ? OC * IC : 0),
                                 "inp_off %" PRId64, p.inp_off);
                    if (dout)
                        T_EXPECT(p.dout_off % QC_LOWP_ALIGN == 0 &&
                                     p.dout_off >=
                                         (inp ? p.inp_off + p.rows * IC : (w ? OC * IC : 0)),
                                 "dout_off %" PRId64, p.dout_off);
                }
    T_EXPECT(tried == 7 * 5 * 6 * 8, "cases");
    /* the workspace split, and QCNet's shapes fit the real workspace */
    const size_t ws[] = {(size_t)256 << 10, WS_BYTES, WS_BYTES + 100};
    for (int i = 0; i < 3; i++) {
        const size_t blas = qc_lowp_blas_bytes(ws[i]);
        const int64_t an = qc_lowp_area_numel(ws[i]);
        T_EXPECT(blas % 256 == 0 && blas + (size_t)an * sizeof(float) <= ws[i] &&
                     (size_t)an * sizeof(float) + 256 + sizeof(float) > ws[i] - blas &&
                     blas >= ws[i] / 2 - 255,
                 "split of %zu bytes: cuBLAS %zu, area %" PRId64 " floats", ws[i], blas, an);
    }
    struct qc_lowp_plan p = {0, 0, 0, 0, 0, 0};
    const int64_t an = qc_lowp_area_numel(WS_BYTES);
    T_EXPECT(qc_lowp_plan_make(an, 1000000, 512, 128, true, true, true, &p) && p.rows > 1000,
             "FFN backward at 1e6 rows: %" PRId64 " rows per chunk", p.rows);
    T_EXPECT(qc_lowp_plan_make(an, 86400, 128, 384, true, true, false, &p) && p.rows > 1000,
             "GRU input projection: %" PRId64 " rows per chunk", p.rows);
}

static const struct lcase host_lcases[] = {
    {"linear N1", 1, 7, 3, 0, false, true},
    {"linear N300 strided accum", 300, 64, 48, 5, true, true},
    {"linear N257 no bias", 257, 33, 20, 0, false, false},
};
static const struct gru_dims host_gru = {4, 9, 12, 16};

/* The simulation passes (every family and precision); each mutation fails under some family. */
static void test_sim(void)
{
    struct impl im = sim_impl;
    im.area = 5000; /* small: the 300-row cases run in several chunks */
    for (int prec = QC_PREC_BF16; prec <= QC_PREC_FP16; prec++)
        for (int f = 0; f < FAM_COUNT; f++) {
            for (size_t i = 0; i < sizeof host_lcases / sizeof host_lcases[0]; i++)
                T_EXPECT(linear_case(&im, &host_lcases[i], prec, (enum fam)f) == 0,
                         "simulation within the bound");
            T_EXPECT(gru_case(&im, "gru", false, &host_gru, prec, (enum fam)f) == 0, "gru sim");
            T_EXPECT(gru_case(&im, "gru cell", true, &host_gru, prec, (enum fam)f) == 0,
                     "gru cell sim");
        }
    struct qc_lowp_plan p = {0, 0, 0, 0, 0, 0};
    T_EXPECT(qc_lowp_plan_make(im.area, 300, 64, 48, true, true, true, &p) && p.nchunk > 2,
             "the 300-row case runs in %" PRId64 " chunks", p.nchunk);
}

/* Which ops a mutation concerns. */
static void test_mutation(enum mut m)
{
    struct impl im = sim_impl;
    im.area = 5000;
    im.mut = m;
    const bool lin = m != MUT_ROUND_H && m != MUT_ROUND_DHG;
    const bool gru = m != MUT_NO_ROUND_DOUT && m != MUT_NO_BIAS;
    for (int prec = QC_PREC_BF16; prec <= QC_PREC_FP16; prec++) {
        int64_t bad_lin = 0, bad_gru = 0;
        g_quiet = true;
        for (int f = 0; f < FAM_COUNT; f++) {
            if (lin)
                bad_lin += linear_case(&im, &host_lcases[1], prec, (enum fam)f);
            if (gru) {
                bad_gru += gru_case(&im, "gru", false, &host_gru, prec, (enum fam)f);
                if (m != MUT_SKIP_CHUNK) /* the cell's 9 rows fit one chunk */
                    bad_gru += gru_case(&im, "gru cell", true, &host_gru, prec, (enum fam)f);
            }
        }
        g_quiet = false;
        if (lin)
            T_EXPECT(bad_lin > 0, "%s: mutation '%s' passes the linear checks",
                     qc_precision_str(prec), mut_name[m]);
        if (gru)
            T_EXPECT(bad_gru > 0, "%s: mutation '%s' passes the GRU checks", qc_precision_str(prec),
                     mut_name[m]);
        if (getenv("QC_TEST_VERBOSE"))
            printf("    %s %s: %" PRId64 " linear, %" PRId64 " gru violations\n",
                   qc_precision_str(prec), mut_name[m], bad_lin, bad_gru);
    }
}

// ---- device mode --------------------------------------------------------------------------------

#ifdef QC_HAVE_CUDA

#    define MAX_DBUF 24

static struct kt_gpu g_dev;

static void dcopy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    kt_dcopy(&g_dev, dst, src, bytes, kind);
}

/* One op call's device buffers: inputs (checked unchanged afterwards), outputs (their host
 * content is the initial value, uploaded before each of the two runs; the first run's result
 * is written back to the host, the second must have the same bits), guard bands around each. */
struct dbuf {
    const char *name;
    size_t bytes;
    char *base;
    void *d;
    float *host;   /* the caller's buffer */
    float *init;   /* outputs: the initial content */
    float *got[2]; /* outputs: the two runs */
    bool out;
};
struct dset {
    struct dbuf b[MAX_DBUF];
    int n;
};

static float *dset_add(struct dset *s, const char *name, const float *host, int64_t n, bool out)
{
    if (s->n >= MAX_DBUF)
        T_FATAL("too many device buffers");
    if (!host)
        return NULL;
    struct dbuf *b = &s->b[s->n++];
    memset(b, 0, sizeof *b);
    b->name = name;
    b->bytes = (size_t)(n > 0 ? n : 0) * sizeof(float);
    b->host = (float *)(uintptr_t)host;
    b->out = out;
    b->base = kt_dalloc_guarded(&g_dev, name, b->bytes);
    b->d = b->base + KT_GUARD;
    dcopy(b->d, host, b->bytes, cudaMemcpyHostToDevice);
    if (out) {
        b->init = fdup(host, n);
        b->got[0] = fnew(n);
        b->got[1] = fnew(n);
    }
    return (float *)b->d;
}

static void dset_begin(struct dset *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->b[i].out)
            dcopy(s->b[i].d, s->b[i].init, s->b[i].bytes, cudaMemcpyHostToDevice);
}

static void dset_end(struct dset *s, int rep)
{
    kt_cuda_ok(cudaStreamSynchronize(g_dev.s), "op execution");
    kt_cuda_ok(cudaGetLastError(), "op execution (sticky)");
    for (int i = 0; i < s->n; i++)
        if (s->b[i].out)
            dcopy(s->b[i].got[rep], s->b[i].d, s->b[i].bytes, cudaMemcpyDeviceToHost);
}

static void dset_finish(struct dset *s)
{
    for (int i = 0; i < s->n; i++) {
        struct dbuf *b = &s->b[i];
        const int64_t n = (int64_t)(b->bytes / sizeof(float));
        kt_dguard_check(&g_dev, b->name, b->base, b->bytes);
        if (b->out) {
            char what[96];
            snprintf(what, sizeof what, "%s: run 2 vs run 1 (determinism)", b->name);
            expect_bits(what, b->got[1], b->got[0], n);
            memcpy(b->host, b->got[0], b->bytes);
            free(b->init);
            free(b->got[0]);
            free(b->got[1]);
        } else {
            float *now = fnew(n);
            dcopy(now, b->d, b->bytes, cudaMemcpyDeviceToHost);
            T_EXPECT(memcmp(now, b->host, b->bytes) == 0, "%s: input modified on the device",
                     b->name);
            free(now);
        }
        qc_alloc_free(g_dev.alloc, b->base, NULL);
    }
    s->n = 0;
}

#    define TWICE(s, call)                                                                         \
        do {                                                                                       \
            for (int rep_ = 0; rep_ < 2; rep_++) {                                                 \
                dset_begin(s);                                                                     \
                call;                                                                              \
                dset_end(s, rep_);                                                                 \
            }                                                                                      \
            dset_finish(s);                                                                        \
        } while (0)

static void cuda_lin_fwd(const struct impl *im, float *out, const float *inp, int64_t ldi,
                         const float *w, const float *b, int64_t N, int64_t IC, int64_t OC,
                         bool accum, int prec, bool exec)
{
    (void)im;
    struct dset s = {.n = 0};
    const float *dinp = dset_add(&s, "inp", inp, (N - 1) * ldi + IC, false);
    const float *dw = dset_add(&s, "weight", w, OC * IC, false);
    const float *db = dset_add(&s, "bias", b, OC, false);
    float *dout = dset_add(&s, "out", out, N * OC, true);
    const struct qc_exec ex = {
        .backend = QC_EXEC_CUDA, .stream = g_dev.s, .emu = NULL, .precision = prec};
    if (exec)
        TWICE(&s, qc_op_linear_forward(&ex, dout, dinp, ldi, dw, db, N, IC, OC, accum));
    else
        TWICE(&s, qc_linear_forward_prec_cuda(dout, dinp, ldi, dw, db, N, IC, OC, accum, prec,
                                              g_dev.s));
}

static void cuda_lin_bwd(const struct impl *im, float *dinp, int64_t lddi, float *dw, float *db,
                         const float *dout, const float *inp, int64_t ldi, const float *w,
                         int64_t N, int64_t IC, int64_t OC, bool accum, int prec)
{
    (void)im;
    struct dset s = {.n = 0};
    const float *ddout = dset_add(&s, "dout", dout, N * OC, false);
    const float *dinp_in = dset_add(&s, "inp", inp, (N - 1) * ldi + IC, false);
    const float *dwt = dset_add(&s, "weight", w, OC * IC, false);
    float *ddinp = dset_add(&s, "dinp", dinp, N * lddi, true);
    float *ddw = dset_add(&s, "dweight", dw, OC * IC, true);
    float *ddb = dset_add(&s, "dbias", db, OC, true);
    const struct qc_exec ex = {
        .backend = QC_EXEC_CUDA, .stream = g_dev.s, .emu = NULL, .precision = prec};
    TWICE(&s, qc_op_linear_backward(&ex, ddinp, lddi, ddw, ddb, ddout, dinp_in, ldi, dwt, N, IC, OC,
                                    accum));
}

static void cuda_gru_fwd(const struct impl *im, bool cell, float *hs, float *gates, const float *x,
                         const float *h0, const float *wih, const float *bih, const float *whh,
                         const float *bhh, int64_t L, int64_t N, int64_t IC, int64_t C, int prec)
{
    (void)im;
    struct dset s = {.n = 0};
    const float *dx = dset_add(&s, "x", x, L * N * IC, false);
    const float *dh0 = dset_add(&s, "h0", h0, N * C, false);
    const float *dwih = dset_add(&s, "w_ih", wih, 3 * C * IC, false);
    const float *dbih = dset_add(&s, "b_ih", bih, 3 * C, false);
    const float *dwhh = dset_add(&s, "w_hh", whh, 3 * C * C, false);
    const float *dbhh = dset_add(&s, "b_hh", bhh, 3 * C, false);
    const int64_t ns =
        cell ? qc_gru_cell_scratch_numel(N, C) : qc_gru_forward_scratch_numel(L, N, C);
    float *scr_h = fnew(ns);
    float *dscr = dset_add(&s, "scratch", scr_h, ns, true); /* deterministic too */
    const struct qc_exec ex = {
        .backend = QC_EXEC_CUDA, .stream = g_dev.s, .emu = NULL, .precision = prec};
    if (cell) { /* hs = [h0 (the input state), h_out] */
        float *dho = dset_add(&s, "h_out", hs + N * C, N * C, true);
        float *dg = dset_add(&s, "gates", gates, N * 4 * C, true);
        TWICE(&s, qc_op_gru_cell_forward(&ex, dho, dg, dx, dh0, dwih, dbih, dwhh, dbhh, N, IC, C,
                                         dscr));
        memcpy(hs, h0, (size_t)(N * C) * sizeof(float));
    } else {
        float *dhs = dset_add(&s, "hs", hs, (L + 1) * N * C, true);
        float *dg = dset_add(&s, "gates", gates, L * N * 4 * C, true);
        TWICE(&s,
              qc_op_gru_forward(&ex, dhs, dg, dx, dh0, dwih, dbih, dwhh, dbhh, L, N, IC, C, dscr));
    }
    free(scr_h);
}

static void cuda_gru_bwd(const struct impl *im, bool cell, float *dx, float *dh0, float *dwih,
                         float *dbih, float *dwhh, float *dbhh, const float *dlast, const float *hs,
                         const float *gates, const float *x, const float *wih, const float *whh,
                         int64_t L, int64_t N, int64_t IC, int64_t C, int prec, float *scr)
{
    (void)im;
    struct dset s = {.n = 0};
    const float *ddl = dset_add(&s, "dh_last", dlast, N * C, false);
    const float *dhs = dset_add(&s, "hs", hs, (cell ? 1 : L + 1) * N * C, false);
    const float *dg = dset_add(&s, "gates", gates, L * N * 4 * C, false);
    const float *dxx = dset_add(&s, "x", x, L * N * IC, false);
    const float *dwi = dset_add(&s, "w_ih", wih, 3 * C * IC, false);
    const float *dwh = dset_add(&s, "w_hh", whh, 3 * C * C, false);
    float *o[6];
    o[0] = dset_add(&s, "dx", dx, L * N * IC, true);
    o[1] = dset_add(&s, cell ? "dh" : "dh0", dh0, N * C, true);
    o[2] = dset_add(&s, "dw_ih", dwih, 3 * C * IC, true);
    o[3] = dset_add(&s, "db_ih", dbih, 3 * C, true);
    o[4] = dset_add(&s, "dw_hh", dwhh, 3 * C * C, true);
    o[5] = dset_add(&s, "db_hh", dbhh, 3 * C, true);
    const int64_t ns =
        cell ? qc_gru_cell_scratch_numel(N, C) : qc_gru_backward_scratch_numel(L, N, C);
    memset(scr, 0, (size_t)ns * sizeof(float));
    float *dscr = dset_add(&s, "scratch", scr, ns, true);
    const struct qc_exec ex = {
        .backend = QC_EXEC_CUDA, .stream = g_dev.s, .emu = NULL, .precision = prec};
    if (cell)
        TWICE(&s, qc_op_gru_cell_backward(&ex, o[0], o[1], o[2], o[3], o[4], o[5], ddl, dg, dxx,
                                          dhs, dwi, dwh, N, IC, C, dscr));
    else
        TWICE(&s, qc_op_gru_backward(&ex, o[0], o[1], o[2], o[3], o[4], o[5], ddl, dhs, dg, dxx,
                                     dwi, dwh, L, N, IC, C, dscr));
}

static const struct impl cuda_impl = {
    "cuda", 0, MUT_NONE, cuda_lin_fwd, cuda_lin_bwd, cuda_gru_fwd, cuda_gru_bwd};

/* round / pack16 / unpack16 / scale by a power of 2: bit for bit against the CPU ops. */
static void test_exact_ops(int prec)
{
    /* every sign x exponent with edge and random mantissas, the fp16 overflow edge, NaN, Inf */
    const int64_t n = 2 * 256 * 12 + 16;
    float *x = fnew(n);
    int64_t k = 0;
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t e = 0; e < 256; e++) {
            const uint32_t mant[12] = {
                0u,      1u,      0x7FFFu,   0x8000u,
                0x8001u, 0xFFFFu, 0x17FFFu,  0x18000u,
                0x0FFFu, 0x1000u, 0x7FFFFFu, (uint32_t)(qc_test_rand(&g_rng) & 0x7FFFFFu)};
            for (int m = 0; m < 12; m++)
                x[k++] = qc_f32_from_bits((s << 31) | (e << 23) | mant[m]);
        }
    const float edge[16] = {65504.0f,   65519.996f, 65520.0f,     -65520.0f, 0x1p-24f, 0x1p-25f,
                            0x1.8p-25f, 0x1p-14f,   0x1.ffcp-15f, 1.0f,      -0.0f,    0.0f,
                            INFINITY,   -INFINITY,  NAN,          3.0e38f};
    for (int i = 0; i < 16; i++)
        x[k++] = edge[i];
    float *ref_r = fnew(n), *got_r = fnew(n), *ref_u = fnew(n), *got_u = fnew(n);
    uint16_t *ref_p = calloc((size_t)n, 2), *got_p = calloc((size_t)n, 2);
    float *ref_s = fdup(x, n), *got_s = fnew(n);
    qc_round_forward_cpu(ref_r, x, n, prec);
    qc_pack16_cpu(ref_p, x, n, prec);
    qc_unpack16_cpu(ref_u, ref_p, n, prec);
    qc_scale_inplace_cpu(ref_s, 0x1p-16f, n);
    const struct qc_exec ex = {
        .backend = QC_EXEC_CUDA, .stream = g_dev.s, .emu = NULL, .precision = prec};
    float *dx = NULL, *dr = NULL, *du = NULL;
    uint16_t *dp = NULL;
    if (qc_alloc_malloc(g_dev.alloc, (size_t)n * 4, NULL, "x", (void **)&dx) != QC_OK ||
        qc_alloc_malloc(g_dev.alloc, (size_t)n * 4, NULL, "r", (void **)&dr) != QC_OK ||
        qc_alloc_malloc(g_dev.alloc, (size_t)n * 4, NULL, "u", (void **)&du) != QC_OK ||
        qc_alloc_malloc(g_dev.alloc, (size_t)n * 2, NULL, "p", (void **)&dp) != QC_OK)
        T_FATAL("device alloc: %s", qc_error_last());
    dcopy(dx, x, (size_t)n * 4, cudaMemcpyHostToDevice);
    qc_op_round(&ex, dr, dx, n, prec);
    qc_op_pack16(&ex, dp, dx, n, prec);
    qc_op_unpack16(&ex, du, dp, n, prec);
    dcopy(got_r, dr, (size_t)n * 4, cudaMemcpyDeviceToHost);
    dcopy(got_p, dp, (size_t)n * 2, cudaMemcpyDeviceToHost);
    dcopy(got_u, du, (size_t)n * 4, cudaMemcpyDeviceToHost);
    qc_op_round(&ex, dr, dr, n, prec); /* in place: idempotent */
    dcopy(got_s, dr, (size_t)n * 4, cudaMemcpyDeviceToHost);
    expect_bits("round in place (idempotent)", got_s, ref_r, n);
    qc_op_scale_inplace(&ex, dx, 0x1p-16f, n);
    dcopy(got_s, dx, (size_t)n * 4, cudaMemcpyDeviceToHost);
    kt_cuda_ok(cudaGetLastError(), "sticky error");
    expect_bits("round", got_r, ref_r, n);
    T_EXPECT(memcmp(got_p, ref_p, (size_t)n * 2) == 0, "pack16 differs from the CPU's bits");
    expect_bits("unpack16", got_u, ref_u, n);
    /* scale: bit for bit but for NaN, which the GPU's multiply returns as its canonical NaN
     * (payload and signalling bit are the hardware's; the CPU keeps the payload): NaN as NaN */
    int64_t nan_bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (isnan(ref_s[i]) || isnan(got_s[i])) {
            nan_bad += !(isnan(ref_s[i]) && isnan(got_s[i]));
            got_s[i] = ref_s[i];
        }
    T_EXPECT(nan_bad == 0, "scale: %" PRId64 " NaN / non-NaN mismatches", nan_bad);
    expect_bits("scale by 2^-16", got_s, ref_s, n);
    qc_alloc_free(g_dev.alloc, dx, NULL);
    qc_alloc_free(g_dev.alloc, dr, NULL);
    qc_alloc_free(g_dev.alloc, du, NULL);
    qc_alloc_free(g_dev.alloc, dp, NULL);
    free(x);
    free(ref_r);
    free(got_r);
    free(ref_u);
    free(got_u);
    free(ref_p);
    free(got_p);
    free(ref_s);
    free(got_s);
}

static const struct lcase gpu_lcases[] = {
    {"linear N1", 1, 7, 3, 0, false, true},
    {"linear N769 strided accum", 769, 128, 512, 3, true, true},
    {"linear N769 no bias", 769, 512, 128, 0, false, false},
    /* QCNet's FFN first layer over 48000 rows: 16 row chunks in the workspace's area */
    {"linear N48000 (chunked)", 48000, 128, 512, 0, false, true},
};
static const struct gru_dims gpu_gru[] = {{3, 7, 16, 16}, {60, 240, 128, 128}};

static int main_gpu(void)
{
    const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
    if (probe != 0)
        return probe;
    if (kt_gpu_open(&g_dev, 0x3C) != 0)
        return 1;
    struct impl im = cuda_impl;
    im.area = qc_lowp_area_numel(QC_KERNELS_CUDA_WORKSPACE_BYTES);
    for (int prec = QC_PREC_BF16; prec <= QC_PREC_FP16; prec++) {
        char name[200];
        snprintf(name, sizeof name, "cuda %s: round / pack16 / unpack16 / scale, bit for bit",
                 qc_precision_str(prec));
        QC_TEST (name) {
            test_exact_ops(prec);
        }
        for (int f = 0; f < FAM_COUNT; f++) {
            for (size_t i = 0; i < sizeof gpu_lcases / sizeof gpu_lcases[0]; i++) {
                snprintf(name, sizeof name, "cuda %s vs cpu: %s, %s inputs", qc_precision_str(prec),
                         gpu_lcases[i].name, fam_name[f]);
                QC_TEST (name) {
                    linear_case(&im, &gpu_lcases[i], prec, (enum fam)f);
                }
            }
            for (size_t i = 0; i < sizeof gpu_gru / sizeof gpu_gru[0]; i++)
                for (int cell = 0; cell < 2; cell++) {
                    const struct gru_dims *dm = &gpu_gru[i];
                    snprintf(name, sizeof name,
                             "cuda %s vs cpu: gru %s L %" PRId64 " N %" PRId64 " C %" PRId64
                             ", %s inputs",
                             qc_precision_str(prec), cell ? "cell" : "sequence", dm->L, dm->N,
                             dm->C, fam_name[f]);
                    QC_TEST (name) {
                        gru_case(&im, cell ? "gru cell" : "gru", cell != 0, dm, prec, (enum fam)f);
                    }
                }
        }
    }
    kt_gpu_close(&g_dev);
    return qc_test_summary();
}
#endif /* QC_HAVE_CUDA */

int main(int argc, char **argv)
{
    g_rng = qc_test_seed();
    if (argc > 1 && strcmp(argv[1], "--host") == 0) {
        QC_TEST ("half cuda host: the 16-bit GEMM chunk plan (qc_lowp_gemm.h)") {
            test_plan();
        }
        QC_TEST ("half cuda host: the simulated CUDA algorithm is within every bound") {
            test_sim();
        }
        for (int m = 1; m < MUT_COUNT; m++) {
            char name[160];
            snprintf(name, sizeof name, "half cuda host: the checks catch '%s'", mut_name[m]);
            QC_TEST (name) {
                test_mutation((enum mut)m);
            }
        }
        return qc_test_summary();
    }
#ifdef QC_HAVE_CUDA
    return main_gpu();
#else
    printf("skip: a CPU-only build has no CUDA backend (run with --host for the host checks)\n");
    return 77;
#endif
}
