/*
 * test_kernels_cpu.c — the CPU reference ops (kernels/qc_kernels.h) against double-precision
 * references: forward values, central-difference gradient checks of every backward (see
 * kernels_testlib.h), exact checks for the layout / gather / scatter ops, Philox known-answer
 * vectors, dropout determinism and keep rate, AdamW against a hand-computed double step, GRU
 * against a double reference, and bit-for-bit determinism across thread counts.
 *
 * Tolerances (why): the fp32 backward is compared with the exact derivative of the double
 * forward at the same inputs. Its rounding error is about (terms summed) × 6e-8 relative to the
 * magnitudes summed; the sums here have ≤ 40 terms of magnitude ≤ ~5, and the worst observed
 * error over 40 seeds is ~2e-6 absolute / 1e-5 relative (the Fourier gradients, whose θ reaches
 * ~6 rad). atol 5e-5 + rtol 2e-4 keeps a 10× margin over that while a wrong formula (sign,
 * missing term, wrong index, a 0.1% scale error) is caught. Forward checks reason the same way.
 * Kinks (ReLU at 0, |y − μ| at 0) are kept ≥ 0.05 away from the inputs by construction.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h> /* omp_set_num_threads: determinism across thread counts */

#include "kernels_testlib.h"
#include "qc_kernels.h"
#include "qc_philox.h"

#define ATOL 5e-5
#define RTOL 2e-4

/* ==== Philox and dropout =================================================================== */

static void test_philox(void)
{
    QC_TEST ("philox: Random123 known-answer vectors for philox4x32-10") {
        static const uint32_t kat[3][10] = {
            {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
            {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
             0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
            {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
             0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
        };
        for (int t = 0; t < 3; t++) {
            struct qc_philox_u4 c = {{kat[t][0], kat[t][1], kat[t][2], kat[t][3]}};
            struct qc_philox_u4 r = qc_philox4x32_10(c, kat[t][4], kat[t][5]);
            for (int w = 0; w < 4; w++)
                T_EXPECT(r.v[w] == kat[t][6 + w], "vector %d word %d: %08x != %08x", t, w,
                         (unsigned)r.v[w], (unsigned)kat[t][6 + w]);
        }
    }

    QC_TEST ("philox: (seed, step, block, index) -> counter, key and uniform mapping") {
        uint64_t seed = 0x0123456789abcdefull;
        uint32_t step = 77, block = 5;
        int64_t idx[4] = {0, 6, 4 * 1000003 + 3, ((int64_t)1 << 36) + 9};
        for (int t = 0; t < 4; t++) {
            uint64_t q = (uint64_t)idx[t];
            struct qc_philox_u4 c = {{(uint32_t)(q >> 2), (uint32_t)(q >> 34), block, step}};
            struct qc_philox_u4 r = qc_philox4x32_10(c, 0x89abcdefu, 0x01234567u);
            float want = (float)(r.v[q & 3] >> 8) / 16777216.0f;
            float got = qc_philox_uniform(seed, step, block, idx[t]);
            T_EXPECT(got == want, "index %lld: %.9g != %.9g", (long long)idx[t], (double)got,
                     (double)want);
            T_EXPECT(got >= 0.0f && got < 1.0f, "uniform out of range");
        }
    }

    QC_TEST ("dropout keyed by scene: element (q, r, c) has index s*2^34 + (l_r*reps + q)*row_len "
             "+ c; a scene's rows keep their mask wherever they sit in the site; tiles agree") {
        enum { REPS = 2, ROWS = 5, LEN = 7, N = REPS * ROWS * LEN };
        /* rows of scenes 10, 10, 3, 3, 10: ranks 0, 1, 0, 1, 2 within their scenes */
        const int64_t scene[ROWS] = {10, 10, 3, 3, 10}, rank[ROWS] = {0, 1, 0, 1, 2};
        int64_t key[ROWS], key10[3];
        for (int r = 0; r < ROWS; r++)
            key[r] = (scene[r] << QC_DROPOUT_SCENE_SHIFT) + rank[r];
        for (int r = 0; r < 3; r++) /* scene 10 alone */
            key10[r] = ((int64_t)10 << QC_DROPOUT_SCENE_SHIFT) + r;
        float x[N], y[N], yt[N], y10[REPS * 3 * LEN];
        for (int i = 0; i < N; i++)
            x[i] = 1.0f;
        struct qc_dropout d = {0.5f, 2023, 11, 3, 0, key, ROWS, REPS, LEN};
        T_EXPECT(qc_dropout_valid(&d), "a valid keyed site refused");
        qc_dropout_forward_cpu(y, x, N, &d);
        int64_t bad = 0, kept = 0;
        for (int q = 0; q < REPS; q++)
            for (int r = 0; r < ROWS; r++)
                for (int c = 0; c < LEN; c++) {
                    const int64_t index =
                        (scene[r] << QC_DROPOUT_SCENE_SHIFT) + (rank[r] * REPS + q) * LEN + c;
                    const float want = qc_dropout_keep(2023, 11, 3, index, 0.5f) ? 2.0f : 0.0f;
                    bad += y[(q * ROWS + r) * LEN + c] != want;
                    kept += want != 0.0f;
                }
        T_EXPECT(bad == 0 && kept > 0 && kept < N,
                 "%lld of %d elements off the mapping (%lld kept)", (long long)bad, N,
                 (long long)kept);
        struct qc_dropout d10 = {0.5f, 2023, 11, 3, 0, key10, 3, REPS, LEN};
        qc_dropout_forward_cpu(y10, x, REPS * 3 * LEN, &d10);
        const int at[3] = {0, 1, 4}; /* scene 10's rows in the mixed site */
        bad = 0;
        for (int q = 0; q < REPS; q++)
            for (int r = 0; r < 3; r++)
                for (int c = 0; c < LEN; c++)
                    bad += y10[(q * 3 + r) * LEN + c] != y[(q * ROWS + at[r]) * LEN + c];
        T_EXPECT(bad == 0, "scene 10 alone drew %lld other elements than in the mixed site",
                 (long long)bad);
        for (int off = 0; off < N; off += 3) { /* tiles that start mid-row */
            struct qc_dropout dt = d;
            dt.index_base = off;
            qc_dropout_forward_cpu(yt + off, x + off, off + 3 <= N ? 3 : N - off, &dt);
        }
        T_EXPECT(memcmp(y, yt, sizeof y) == 0, "tiles of a keyed site differ");
        struct qc_dropout big = d;
        big.rows = QC_DROPOUT_LOCAL_MAX / REPS / LEN + 1;
        T_EXPECT(!qc_dropout_valid(&big), "a site over 2^34 elements per scene accepted");
    }

    QC_TEST ("dropout: keep rate, scale, determinism and tiling") {
        const int64_t n = 200000;
        float *x = kt_zeros(n), *y = kt_zeros(n), *y2 = kt_zeros(n), *yt = kt_zeros(n);
        for (int64_t i = 0; i < n; i++)
            x[i] = 1.0f + (float)(i % 7);
        struct qc_dropout d = {0.1f, 2023, 11, 3, 0, NULL, 0, 0, 0};
        qc_dropout_forward_cpu(y, x, n, &d);
        qc_dropout_forward_cpu(y2, x, n, &d);
        int64_t kept = 0;
        int scale_ok = 1;
        float scale = 1.0f / (1.0f - 0.1f);
        for (int64_t i = 0; i < n; i++) {
            if (y[i] != 0.0f) {
                kept++;
                scale_ok &= y[i] == x[i] * scale;
            }
        }
        double rate = (double)kept / (double)n;
        /* binomial sd sqrt(0.09/2e5) = 6.7e-4; 6 sd */
        T_EXPECT(fabs(rate - 0.9) < 0.004, "keep rate %.5f", rate);
        T_EXPECT(scale_ok, "kept elements are not x / (1 - p)");
        T_EXPECT(memcmp(y, y2, (size_t)n * sizeof(float)) == 0, "same key gave a different mask");
        /* every flag is qc_dropout_keep's (the op draws 64 counters side by side) */
        int64_t off_map = 0;
        for (int64_t i = 0; i < n; i++)
            off_map += (y[i] != 0.0f) != qc_dropout_keep(2023, 11, 3, i, 0.1f);
        T_EXPECT(off_map == 0, "%lld of %lld flags differ from qc_dropout_keep", (long long)off_map,
                 (long long)n);
        /* tiles with index_base reproduce the whole-tensor mask */
        for (int64_t off = 0; off < n; off += 1237) {
            int64_t len = off + 1237 <= n ? 1237 : n - off;
            struct qc_dropout dt = d;
            dt.index_base = off;
            qc_dropout_forward_cpu(yt + off, x + off, len, &dt);
        }
        T_EXPECT(memcmp(y, yt, (size_t)n * sizeof(float)) == 0, "tiled mask differs");
        /* every key field changes the mask */
        struct qc_dropout v[3] = {d, d, d};
        v[0].seed++;
        v[1].step++;
        v[2].block++;
        for (int t = 0; t < 3; t++) {
            qc_dropout_forward_cpu(y2, x, n, &v[t]);
            int64_t same = 0;
            for (int64_t i = 0; i < n; i++)
                same += (y[i] != 0.0f) == (y2[i] != 0.0f);
            /* independent masks agree on 0.81 + 0.01 = 0.82 of the elements */
            T_EXPECT(fabs((double)same / (double)n - 0.82) < 0.01, "field %d: agreement %.4f", t,
                     (double)same / (double)n);
        }
        /* p = 0 is the identity; backward equals forward map */
        struct qc_dropout off = {0.0f, 1, 2, 3, 0, NULL, 0, 0, 0};
        qc_dropout_forward_cpu(y2, x, n, &off);
        T_EXPECT(memcmp(y2, x, (size_t)n * sizeof(float)) == 0, "p = 0 is not the identity");
        qc_dropout_backward_cpu(y2, x, n, &d);
        T_EXPECT(memcmp(y2, y, (size_t)n * sizeof(float)) == 0, "backward mask differs");
        free(x);
        free(y);
        free(y2);
        free(yt);
    }
}

/* ==== geometry ============================================================================= */

static void test_geometry(void)
{
    QC_TEST ("geometry: wrap_angle and angle_between_2d_vectors") {
        T_EXPECT(qc_wrap_anglef(QC_PI_F) == -QC_PI_F, "wrap(pi) = %.9g",
                 (double)qc_wrap_anglef(QC_PI_F));
        T_EXPECT(qc_wrap_anglef(0.0f) == 0.0f, "wrap(0)");
        uint64_t st = qc_test_seed();
        float a[1000], w[1000];
        for (int i = 0; i < 1000; i++)
            a[i] = kt_uniform(&st, -20.0f, 20.0f);
        qc_wrap_angle_forward_cpu(w, a, 1000);
        for (int i = 0; i < 1000; i++) {
            T_EXPECT(w[i] >= -QC_PI_F && w[i] < QC_PI_F, "wrap(%.9g) = %.9g out of range",
                     (double)a[i], (double)w[i]);
            double k = ((double)a[i] - (double)w[i]) / (2.0 * M_PI);
            T_EXPECT(fabs(k - round(k)) < 1e-5, "wrap(%.9g) = %.9g is not a 2π shift", (double)a[i],
                     (double)w[i]);
        }
        /* zero vector: dot starts at +0, so a third-quadrant heading gives ±0, never ±π */
        float c0 = cosf(-2.5f), c1 = sinf(-2.5f);
        float z = qc_angle_between_2df(c0, c1, 0.0f, 0.0f);
        T_EXPECT(z == 0.0f, "angle to the zero vector = %.9g", (double)z);
        float ctr[4] = {1.0f, 0.0f, 0.0f, 1.0f}, vec[4] = {0.0f, 2.0f, 1.0f, 0.0f}, out[2];
        qc_angle_between_2d_forward_cpu(out, ctr, vec, 2);
        T_EXPECT_NEAR(out[0], M_PI / 2, 1e-6, 0, "ccw quarter turn");
        T_EXPECT_NEAR(out[1], -M_PI / 2, 1e-6, 0, "cw quarter turn");
    }
}

/* ==== linear =============================================================================== */

static void linear_fwd_d(struct gc *g)
{
    int64_t N = g->dim[0], IC = g->dim[1], OC = g->dim[2], ldi = g->dim[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double s = g->in[2] ? g->in[2][o] : 0.0;
            for (int64_t i = 0; i < IC; i++)
                s += g->in[0][n * ldi + i] * g->in[1][o * IC + i];
            g->out[n * OC + o] = s;
        }
}

static void test_linear(void)
{
    QC_TEST ("linear: forward and gradients, strided input, with and without bias") {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            uint64_t st = qc_test_seed() + (uint64_t)with_bias;
            int64_t N = 7, IC = 5, OC = 6, ldi = 9; /* a strided view: 4 gap floats per row */
            float *x = kt_rand(N * ldi, -1, 1, &st), *W = kt_rand(OC * IC, -1, 1, &st);
            float *b = with_bias ? kt_rand(OC, -1, 1, &st) : NULL;
            float *y = kt_zeros(N * OC);
            struct gc g = {0};
            g.dim[0] = N, g.dim[1] = IC, g.dim[2] = OC, g.dim[3] = ldi;
            g.in[0] = kt_to_d(x, N * ldi), g.n_in[0] = N * ldi;
            g.in[1] = kt_to_d(W, OC * IC), g.n_in[1] = OC * IC;
            if (b)
                g.in[2] = kt_to_d(b, OC), g.n_in[2] = OC;
            g.fwd = linear_fwd_d;
            float *dy = gc_setup(&g, N * OC, &st);
            qc_linear_forward_cpu(y, x, ldi, W, b, N, IC, OC, false);
            gc_loss(&g);
            T_EXPECT(kt_maxdiff(y, g.out, N * OC) < 1e-5, "forward");
            /* accumulate: y += x·Wᵀ + b doubles the result */
            qc_linear_forward_cpu(y, x, ldi, W, b, N, IC, OC, true);
            for (int64_t i = 0; i < N * OC; i++)
                g.out[i] *= 2.0;
            T_EXPECT(kt_maxdiff(y, g.out, N * OC) < 2e-5, "accumulating forward");
            float *dx = kt_zeros(N * ldi), *dW = kt_rand(OC * IC, -1, 1, &st);
            float *dW0 = kt_zeros(OC * IC), *db = kt_zeros(OC);
            memcpy(dW0, dW, (size_t)(OC * IC) * sizeof(float));
            qc_linear_backward_cpu(dx, ldi, dW, b ? db : NULL, dy, x, ldi, W, N, IC, OC, false);
            for (int64_t i = 0; i < OC * IC; i++)
                dW[i] -= dW0[i]; /* ACCUM: remove the prior content */
            gc_check(&g, 0, dx, ATOL, RTOL, "linear dx (gaps must stay 0)");
            gc_check(&g, 1, dW, ATOL, RTOL, "linear dW");
            if (b)
                gc_check(&g, 2, db, ATOL, RTOL, "linear db");
            /* dx ACCUM */
            float *dx2 = kt_zeros(N * ldi);
            memcpy(dx2, dx, (size_t)(N * ldi) * sizeof(float));
            qc_linear_backward_cpu(dx2, ldi, NULL, NULL, dy, x, ldi, W, N, IC, OC, true);
            for (int64_t i = 0; i < N * ldi; i++)
                T_EXPECT(dx2[i] == 2.0f * dx[i], "dx accum at %lld", (long long)i);
            gc_free(&g);
            free(x), free(W), free(b), free(y), free(dy), free(dx), free(dx2), free(dW), free(dW0),
                free(db);
        }
    }
}

/* ==== layernorm ============================================================================ */

static void layernorm_fwd_d(struct gc *g)
{
    int64_t N = g->dim[0], C = g->dim[1];
    for (int64_t n = 0; n < N; n++) {
        const double *x = g->in[0] + n * C;
        double mu = 0, var = 0;
        for (int64_t c = 0; c < C; c++)
            mu += x[c];
        mu /= (double)C;
        for (int64_t c = 0; c < C; c++)
            var += (x[c] - mu) * (x[c] - mu);
        var /= (double)C;
        double r = 1.0 / sqrt(var + 1e-5);
        for (int64_t c = 0; c < C; c++)
            g->out[n * C + c] = (x[c] - mu) * r * g->in[1][c] + g->in[2][c];
    }
}

static void test_layernorm(void)
{
    QC_TEST ("layernorm: forward, saved statistics and gradients") {
        uint64_t st = qc_test_seed() + 10;
        int64_t N = 6, C = 24;
        float *x = kt_rand(N * C, -2, 2, &st), *w = kt_rand(C, 0.5f, 1.5f, &st);
        float *b = kt_rand(C, -0.5f, 0.5f, &st);
        float *y = kt_zeros(N * C), *mean = kt_zeros(N), *rstd = kt_zeros(N);
        struct gc g = {0};
        g.dim[0] = N, g.dim[1] = C;
        g.in[0] = kt_to_d(x, N * C), g.n_in[0] = N * C;
        g.in[1] = kt_to_d(w, C), g.n_in[1] = C;
        g.in[2] = kt_to_d(b, C), g.n_in[2] = C;
        g.fwd = layernorm_fwd_d;
        float *dy = gc_setup(&g, N * C, &st);
        qc_layernorm_forward_cpu(y, mean, rstd, x, w, b, N, C);
        gc_loss(&g);
        T_EXPECT(kt_maxdiff(y, g.out, N * C) < 1e-5, "forward");
        float *dx = kt_zeros(N * C), *dw = kt_zeros(C), *db = kt_zeros(C);
        qc_layernorm_backward_cpu(dx, dw, db, dy, x, mean, rstd, w, N, C, false);
        gc_check(&g, 0, dx, ATOL, RTOL, "layernorm dx");
        gc_check(&g, 1, dw, ATOL, RTOL, "layernorm dw");
        gc_check(&g, 2, db, ATOL, RTOL, "layernorm db");
        float *dx2 = kt_zeros(N * C);
        memcpy(dx2, dx, (size_t)(N * C) * sizeof(float));
        qc_layernorm_backward_cpu(dx2, NULL, NULL, dy, x, mean, rstd, w, N, C, true);
        for (int64_t i = 0; i < N * C; i++)
            T_EXPECT(dx2[i] == 2.0f * dx[i], "dx accum at %lld", (long long)i);
        /* in place forward gives the same bits */
        qc_layernorm_forward_cpu(x, NULL, NULL, x, w, b, N, C);
        T_EXPECT(memcmp(x, y, (size_t)(N * C) * sizeof(float)) == 0, "in-place forward differs");
        gc_free(&g);
        free(x), free(w), free(b), free(y), free(mean), free(rstd), free(dy), free(dx), free(dw),
            free(db), free(dx2);
    }
}

/* ==== elementwise activations ============================================================== */

static double act_d(int which, double x)
{
    switch (which) {
    case 0:
        return x > 0 ? x : 0;
    case 1:
        return x > 0 ? x : expm1(x);
    case 2:
        return 1.0 / (1.0 + exp(-x));
    default:
        return tanh(x);
    }
}

static void act_fwd_d(struct gc *g)
{
    for (int64_t i = 0; i < g->n_in[0]; i++)
        g->out[i] = act_d((int)g->dim[0], g->in[0][i]);
}

static void test_activations(void)
{
    QC_TEST ("activations: relu, elu, sigmoid, tanh forward and gradients") {
        static const char *names[4] = {"relu", "elu", "sigmoid", "tanh"};
        for (int which = 0; which < 4; which++) {
            uint64_t st = qc_test_seed() + 20 + (uint64_t)which;
            int64_t n = 97;
            float *x = kt_rand_away0(n, 0.05f, 3.0f, &st), *y = kt_zeros(n), *dx = kt_zeros(n);
            struct gc g = {0};
            g.dim[0] = which;
            g.in[0] = kt_to_d(x, n), g.n_in[0] = n;
            g.fwd = act_fwd_d;
            float *dy = gc_setup(&g, n, &st);
            switch (which) {
            case 0:
                qc_relu_forward_cpu(y, x, n);
                qc_relu_backward_cpu(dx, dy, y, n);
                break;
            case 1:
                qc_elu_forward_cpu(y, x, n);
                qc_elu_backward_cpu(dx, dy, y, n);
                break;
            case 2:
                qc_sigmoid_forward_cpu(y, x, n);
                qc_sigmoid_backward_cpu(dx, dy, y, n);
                break;
            default:
                qc_tanh_forward_cpu(y, x, n);
                qc_tanh_backward_cpu(dx, dy, y, n);
                break;
            }
            gc_loss(&g);
            T_EXPECT(kt_maxdiff(y, g.out, n) < 1e-6, "%s forward", names[which]);
            gc_check(&g, 0, dx, ATOL, RTOL, names[which]);
            gc_free(&g);
            free(x), free(y), free(dx), free(dy);
        }
    }
}

static void gate_fwd_d(struct gc *g)
{
    for (int64_t i = 0; i < g->n_out; i++)
        g->out[i] = g->in[0][i] + g->in[1][i] * (g->in[2][i] - g->in[0][i]);
}

static void test_gate_update(void)
{
    QC_TEST ("gate_update and add: forward and gradients") {
        uint64_t st = qc_test_seed() + 30;
        int64_t n = 50;
        float *u = kt_rand(n, -2, 2, &st), *gg = kt_rand(n, 0, 1, &st), *s = kt_rand(n, -2, 2, &st);
        float *y = kt_zeros(n), *du = kt_zeros(n), *dg = kt_zeros(n), *ds = kt_zeros(n);
        struct gc g = {0};
        g.in[0] = kt_to_d(u, n), g.n_in[0] = n;
        g.in[1] = kt_to_d(gg, n), g.n_in[1] = n;
        g.in[2] = kt_to_d(s, n), g.n_in[2] = n;
        g.fwd = gate_fwd_d;
        float *dy = gc_setup(&g, n, &st);
        qc_gate_update_forward_cpu(y, u, gg, s, n);
        gc_loss(&g);
        T_EXPECT(kt_maxdiff(y, g.out, n) < 1e-6, "forward");
        qc_gate_update_backward_cpu(du, dg, ds, dy, u, gg, s, n);
        gc_check(&g, 0, du, ATOL, RTOL, "gate du");
        gc_check(&g, 1, dg, ATOL, RTOL, "gate dg");
        gc_check(&g, 2, ds, ATOL, RTOL, "gate ds");
        qc_add_forward_cpu(y, u, s, n);
        qc_add_scalar_forward_cpu(du, u, 0.1f, n);
        for (int64_t i = 0; i < n; i++) {
            T_EXPECT(y[i] == u[i] + s[i], "add at %lld", (long long)i);
            T_EXPECT(du[i] == u[i] + 0.1f, "add_scalar at %lld", (long long)i);
        }
        gc_free(&g);
        free(u), free(gg), free(s), free(y), free(du), free(dg), free(ds), free(dy);
    }
}

/* ==== embedding, cumsum, layout ============================================================ */

static void test_embedding(void)
{
    QC_TEST ("embedding: lookup and deterministic scatter-add backward") {
        uint64_t st = qc_test_seed() + 40;
        int64_t N = 40, C = 20, V = 5;
        int64_t idx[40];
        for (int64_t n = 0; n < N; n++)
            idx[n] = (int64_t)(qc_test_rand(&st) % 4); /* row 4 never used */
        float *table = kt_rand(V * C, -1, 1, &st), *out = kt_zeros(N * C);
        qc_embedding_forward_cpu(out, idx, table, N, C, V);
        for (int64_t n = 0; n < N; n++)
            T_EXPECT(memcmp(out + n * C, table + idx[n] * C, (size_t)C * sizeof(float)) == 0,
                     "row %lld", (long long)n);
        float *dout = kt_rand(N * C, -1, 1, &st), *dt = kt_rand(V * C, -1, 1, &st);
        float *dt0 = kt_zeros(V * C);
        memcpy(dt0, dt, (size_t)(V * C) * sizeof(float));
        qc_embedding_backward_cpu(dt, dout, idx, N, C, V);
        for (int64_t v = 0; v < V; v++)
            for (int64_t c = 0; c < C; c++) {
                float want = dt0[v * C + c]; /* same ascending order as the contract */
                for (int64_t n = 0; n < N; n++)
                    if (idx[n] == v)
                        want += dout[n * C + c];
                T_EXPECT(dt[v * C + c] == want, "dtable[%lld,%lld]", (long long)v, (long long)c);
            }
        free(table), free(out), free(dout), free(dt), free(dt0);
    }
}

static void cumsum_fwd_d(struct gc *g)
{
    int64_t O = g->dim[0], L = g->dim[1], I = g->dim[2];
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
            double s = 0;
            for (int64_t l = 0; l < L; l++) {
                s += g->in[0][(o * L + l) * I + i];
                g->out[(o * L + l) * I + i] = s;
            }
        }
}

static void test_cumsum(void)
{
    QC_TEST ("cumsum: forward and gradient") {
        uint64_t st = qc_test_seed() + 50;
        int64_t O = 3, L = 9, I = 2, n = O * L * I;
        float *x = kt_rand(n, -1, 1, &st), *y = kt_zeros(n), *dx = kt_zeros(n);
        struct gc g = {0};
        g.dim[0] = O, g.dim[1] = L, g.dim[2] = I;
        g.in[0] = kt_to_d(x, n), g.n_in[0] = n;
        g.fwd = cumsum_fwd_d;
        float *dy = gc_setup(&g, n, &st);
        qc_cumsum_forward_cpu(y, x, O, L, I);
        gc_loss(&g);
        T_EXPECT(kt_maxdiff(y, g.out, n) < 1e-6, "forward");
        qc_cumsum_backward_cpu(dx, dy, O, L, I);
        gc_check(&g, 0, dx, ATOL, RTOL, "cumsum dx");
        gc_free(&g);
        free(x), free(y), free(dx), free(dy);
    }
}

/* Linear layout maps: the backward is the adjoint, <dy, f(x)> = <f*(dy), x>, and the forward is
 * an exact copy. */
static void test_layout(void)
{
    QC_TEST ("layout: copy2d (concat/split), repeat_interleave, tile, transpose") {
        uint64_t st = qc_test_seed() + 60;
        int64_t N = 5, R = 3, C = 4;
        float *x = kt_rand(N * C, -1, 1, &st), *y = kt_zeros(N * R * C);
        float *dy = kt_rand(N * R * C, -1, 1, &st), *dx = kt_zeros(N * C);
        /* repeat_interleave */
        qc_repeat_interleave_forward_cpu(y, x, N, R, C);
        for (int64_t n = 0; n < N; n++)
            for (int64_t r = 0; r < R; r++)
                T_EXPECT(memcmp(y + (n * R + r) * C, x + n * C, (size_t)C * 4) == 0,
                         "repeat_interleave row %lld,%lld", (long long)n, (long long)r);
        qc_repeat_interleave_backward_cpu(dx, dy, N, R, C, false);
        T_EXPECT_NEAR(kt_dot_ff(dy, y, N * R * C), kt_dot_ff(dx, x, N * C), 1e-5, 1e-5,
                      "repeat_interleave adjoint");
        qc_repeat_interleave_backward_cpu(dx, dy, N, R, C, true);
        T_EXPECT_NEAR(kt_dot_ff(dx, x, N * C), 2 * kt_dot_ff(dy, y, N * R * C), 1e-5, 1e-5,
                      "repeat_interleave accum");
        /* tile */
        qc_tile_forward_cpu(y, x, N, R, C);
        for (int64_t r = 0; r < R; r++)
            T_EXPECT(memcmp(y + r * N * C, x, (size_t)(N * C) * 4) == 0, "tile block %lld",
                     (long long)r);
        qc_tile_backward_cpu(dx, dy, N, R, C, false);
        T_EXPECT_NEAR(kt_dot_ff(dy, y, N * R * C), kt_dot_ff(dx, x, N * C), 1e-5, 1e-5,
                      "tile adjoint");
        /* transpose (D0,D1,C) = (N,R,C) */
        float *t = kt_zeros(N * R * C), *u = kt_rand(N * R * C, -1, 1, &st),
              *du = kt_zeros(N * R * C);
        qc_transpose01_forward_cpu(t, u, N, R, C);
        for (int64_t a = 0; a < N; a++)
            for (int64_t b = 0; b < R; b++)
                T_EXPECT(memcmp(t + (b * N + a) * C, u + (a * R + b) * C, (size_t)C * 4) == 0,
                         "transpose %lld,%lld", (long long)a, (long long)b);
        qc_transpose01_backward_cpu(du, t, N, R, C);
        T_EXPECT(memcmp(du, u, (size_t)(N * R * C) * 4) == 0, "transpose round trip");
        /* copy2d: concat [x | x2] then split back */
        float *x2 = kt_rand(N * 2, -1, 1, &st), *cat = kt_zeros(N * (C + 2)),
              *back = kt_zeros(N * 2);
        qc_copy2d_cpu(cat, C + 2, x, C, N, C, false);
        qc_copy2d_cpu(cat + C, C + 2, x2, 2, N, 2, false);
        qc_copy2d_cpu(back, 2, cat + C, C + 2, N, 2, false);
        T_EXPECT(memcmp(back, x2, (size_t)(N * 2) * 4) == 0, "concat/split round trip");
        qc_copy2d_cpu(back, 2, cat + C, C + 2, N, 2, true);
        for (int64_t i = 0; i < N * 2; i++)
            T_EXPECT(back[i] == 2.0f * x2[i], "copy2d accum");
        for (int64_t n = 0; n < N; n++)
            T_EXPECT(memcmp(cat + n * (C + 2), x + n * C, (size_t)C * 4) == 0, "concat left");
        free(x), free(y), free(dy), free(dx), free(t), free(u), free(du), free(x2), free(cat),
            free(back);
    }
}

/* ==== CSR, gather, scatter and attention ==================================================== */

/* A test graph: segment sizes {0, 1, 7, 0, 2, 5} (empty, single, many), edges in shuffled order
 * (so perm is not the identity), plus the same graph sorted by destination (perm = NULL). */
#define G_NSEG 6
#define G_E    15
struct test_graph {
    int64_t dst[G_E], ptr[G_NSEG + 1], perm[G_E];
    int64_t sdst[G_E], sptr[G_NSEG + 1]; /* sorted copy */
    int64_t src[G_E];                    /* source node of each edge, in [0, 4) */
    struct qc_csr csr, scsr;
};

static void test_graph_init(struct test_graph *tg, uint64_t *st)
{
    static const int64_t sizes[G_NSEG] = {0, 1, 7, 0, 2, 5};
    int64_t e = 0;
    for (int64_t s = 0; s < G_NSEG; s++)
        for (int64_t k = 0; k < sizes[s]; k++)
            tg->sdst[e++] = s;
    memcpy(tg->dst, tg->sdst, sizeof(tg->dst));
    for (int64_t i = G_E - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)(qc_test_rand(st) % (uint64_t)(i + 1));
        int64_t t = tg->dst[i];
        tg->dst[i] = tg->dst[j];
        tg->dst[j] = t;
    }
    for (int64_t i = 0; i < G_E; i++)
        tg->src[i] = (int64_t)(qc_test_rand(st) % 4);
    int64_t sperm[G_E];
    qc_csr_build_cpu(tg->ptr, tg->perm, tg->dst, G_E, G_NSEG);
    qc_csr_build_cpu(tg->sptr, sperm, tg->sdst, G_E, G_NSEG);
    tg->csr = (struct qc_csr){tg->ptr, tg->perm, tg->dst, G_NSEG, G_E};
    tg->scsr = (struct qc_csr){tg->sptr, NULL, tg->sdst, G_NSEG, G_E};
}

static void test_csr_gather_scatter(void)
{
    QC_TEST ("csr: build is a stable counting sort with empty segments") {
        uint64_t st = qc_test_seed() + 70;
        struct test_graph tg;
        test_graph_init(&tg, &st);
        static const int64_t want_ptr[G_NSEG + 1] = {0, 0, 1, 8, 8, 10, 15};
        for (int s = 0; s <= G_NSEG; s++)
            T_EXPECT_EQ_I64(tg.ptr[s], want_ptr[s], "ptr[%d]", s);
        for (int64_t s = 0; s < G_NSEG; s++)
            for (int64_t k = tg.ptr[s]; k < tg.ptr[s + 1]; k++) {
                T_EXPECT_EQ_I64(tg.dst[tg.perm[k]], s, "perm[%lld] in segment %lld", (long long)k,
                                (long long)s);
                if (k > tg.ptr[s])
                    T_EXPECT(tg.perm[k] > tg.perm[k - 1], "not ascending within segment");
            }
    }

    QC_TEST ("gather / scatter_add: exact forward, adjoint backward, sorted == permuted") {
        uint64_t st = qc_test_seed() + 71;
        struct test_graph tg;
        test_graph_init(&tg, &st);
        int64_t C = 3, Ns = 4;
        /* gather rows of a (Ns,C) source table by src */
        float *tab = kt_rand(Ns * C, -1, 1, &st), *ge = kt_zeros(G_E * C);
        qc_gather_rows_forward_cpu(ge, tab, tg.src, G_E, C, false);
        for (int64_t e = 0; e < G_E; e++)
            T_EXPECT(memcmp(ge + e * C, tab + tg.src[e] * C, (size_t)C * 4) == 0, "gather %lld",
                     (long long)e);
        int64_t sptr[5], sperm[G_E];
        qc_csr_build_cpu(sptr, sperm, tg.src, G_E, Ns);
        struct qc_csr by_src = {sptr, sperm, tg.src, Ns, G_E};
        float *dge = kt_rand(G_E * C, -1, 1, &st), *dtab = kt_rand(Ns * C, -1, 1, &st);
        qc_gather_rows_backward_cpu(dtab, dge, by_src, C, false);
        T_EXPECT_NEAR(kt_dot_ff(dge, ge, G_E * C), kt_dot_ff(dtab, tab, Ns * C), 1e-5, 1e-5,
                      "gather adjoint");
        for (int64_t n = 0; n < Ns; n++)
            for (int64_t c = 0; c < C; c++) {
                float want = 0.0f;
                for (int64_t e = 0; e < G_E; e++)
                    if (tg.src[e] == n)
                        want += dge[e * C + c];
                T_EXPECT(dtab[n * C + c] == want, "gather bwd order at %lld,%lld", (long long)n,
                         (long long)c);
            }
        /* scatter-add over destinations */
        float *msg = kt_rand(G_E * C, -1, 1, &st), *agg = kt_rand(G_NSEG * C, -1, 1, &st);
        qc_scatter_add_forward_cpu(agg, msg, tg.csr, C, false);
        for (int64_t c = 0; c < C; c++) {
            T_EXPECT(agg[0 * C + c] == 0.0f && agg[3 * C + c] == 0.0f, "empty segments are 0");
            float one = 0;
            for (int64_t e = 0; e < G_E; e++)
                if (tg.dst[e] == 1)
                    one = msg[e * C + c];
            T_EXPECT(agg[1 * C + c] == one, "single-edge segment");
        }
        float *dmsg = kt_zeros(G_E * C), *dagg = kt_rand(G_NSEG * C, -1, 1, &st);
        qc_scatter_add_backward_cpu(dmsg, dagg, tg.csr, C, false);
        T_EXPECT_NEAR(kt_dot_ff(dagg, agg, G_NSEG * C), kt_dot_ff(dmsg, msg, G_E * C), 1e-5, 1e-5,
                      "scatter adjoint");
        /* the sorted graph with perm = NULL: permute msg into sorted order, same sums */
        float *smsg = kt_zeros(G_E * C), *sagg = kt_zeros(G_NSEG * C);
        for (int64_t k = 0; k < G_E; k++)
            memcpy(smsg + k * C, msg + tg.perm[k] * C, (size_t)C * 4);
        qc_scatter_add_forward_cpu(sagg, smsg, tg.scsr, C, false);
        T_EXPECT(memcmp(sagg, agg, (size_t)(G_NSEG * C) * 4) == 0, "sorted vs permuted CSR");
        free(tab), free(ge), free(dge), free(dtab), free(msg), free(agg), free(dmsg), free(dagg),
            free(smsg), free(sagg);
    }
}

static void score_fwd_d(struct gc *g)
{
    const int64_t *dst = g->aux[0];
    int64_t E = g->dim[0], H = g->dim[1], Dh = g->dim[2], D = H * Dh;
    for (int64_t e = 0; e < E; e++)
        for (int64_t h = 0; h < H; h++) {
            double s = 0;
            for (int64_t c = 0; c < Dh; c++)
                s += g->in[0][dst[e] * D + h * Dh + c] * g->in[1][e * D + h * Dh + c];
            g->out[e * H + h] = s * (double)g->fparam[0];
        }
}

static void softmax_fwd_d(struct gc *g)
{
    const int64_t *dst = g->aux[0];
    int64_t E = g->dim[0], H = g->dim[1], nseg = g->dim[3];
    for (int64_t s = 0; s < nseg; s++)
        for (int64_t h = 0; h < H; h++) {
            double mx = -(double)INFINITY, sum = 0;
            for (int64_t e = 0; e < E; e++)
                if (dst[e] == s && g->in[0][e * H + h] > mx)
                    mx = g->in[0][e * H + h];
            for (int64_t e = 0; e < E; e++)
                if (dst[e] == s)
                    sum += exp(g->in[0][e * H + h] - mx);
            for (int64_t e = 0; e < E; e++)
                if (dst[e] == s)
                    g->out[e * H + h] = exp(g->in[0][e * H + h] - mx) / (sum + 1e-16);
        }
}

static void aggregate_fwd_d(struct gc *g)
{
    const int64_t *dst = g->aux[0];
    const struct qc_dropout *d = g->aux[1];
    int64_t E = g->dim[0], H = g->dim[1], Dh = g->dim[2], D = H * Dh, nseg = g->dim[3];
    memset(g->out, 0, (size_t)(nseg * D) * sizeof(double));
    for (int64_t e = 0; e < E; e++)
        for (int64_t h = 0; h < H; h++) {
            double f = 1.0;
            if (d && d->p > 0.0f)
                f = qc_dropout_keep(d->seed, d->step, d->block, d->index_base + e * H + h, d->p)
                        ? 1.0 / (1.0 - (double)d->p)
                        : 0.0;
            for (int64_t c = 0; c < Dh; c++)
                g->out[dst[e] * D + h * Dh + c] +=
                    g->in[0][e * H + h] * f * g->in[1][e * D + h * Dh + c];
        }
}

static void test_attention_ops(void)
{
    QC_TEST ("attn_score: forward and gradients (empty, single, many-edge destinations)") {
        uint64_t st = qc_test_seed() + 80;
        struct test_graph tg;
        test_graph_init(&tg, &st);
        int64_t H = 2, Dh = 4, D = H * Dh;
        float *q = kt_rand(G_NSEG * D, -1, 1, &st), *k = kt_rand(G_E * D, -1, 1, &st);
        float *s = kt_zeros(G_E * H), *dq = kt_zeros(G_NSEG * D), *dk = kt_zeros(G_E * D);
        struct gc g = {0};
        g.dim[0] = G_E, g.dim[1] = H, g.dim[2] = Dh, g.dim[3] = G_NSEG;
        g.aux[0] = tg.dst;
        g.fparam[0] = 0.25f;
        g.in[0] = kt_to_d(q, G_NSEG * D), g.n_in[0] = G_NSEG * D;
        g.in[1] = kt_to_d(k, G_E * D), g.n_in[1] = G_E * D;
        g.fwd = score_fwd_d;
        float *ds = gc_setup(&g, G_E * H, &st);
        qc_attn_score_forward_cpu(s, q, k, tg.csr, H, Dh, 0.25f);
        gc_loss(&g);
        T_EXPECT(kt_maxdiff(s, g.out, G_E * H) < 1e-6, "forward");
        qc_attn_score_backward_cpu(dq, dk, ds, q, k, tg.csr, H, Dh, 0.25f, false);
        gc_check(&g, 0, dq, ATOL, RTOL, "score dq (empty destinations get 0)");
        gc_check(&g, 1, dk, ATOL, RTOL, "score dk");
        gc_free(&g);
        free(q), free(k), free(s), free(dq), free(dk), free(ds);
    }

    /* Scores near 0, and in the hundreds both ways: without the max subtraction expf overflows
     * (above ~88) or every term underflows to 0 (below ~-103), so only these ranges test it. */
    static const float score_range[4][2] = {{-4, 4}, {100, 400}, {-400, -100}, {-300, 300}};
    for (int r = 0; r < 4; r++) {
        char name[128];
        snprintf(name, sizeof name,
                 "segment_softmax: forward, statistics and gradient, scores in [%g, %g]",
                 (double)score_range[r][0], (double)score_range[r][1]);
        QC_TEST (name) {
            uint64_t st = qc_test_seed() + 81;
            struct test_graph tg;
            test_graph_init(&tg, &st);
            int64_t H = 3;
            float *s = kt_rand(G_E * H, score_range[r][0], score_range[r][1], &st),
                  *a = kt_zeros(G_E * H), *ds = kt_zeros(G_E * H);
            float mx[G_NSEG * 3], sm[G_NSEG * 3];
            struct gc g = {0};
            g.dim[0] = G_E, g.dim[1] = H, g.dim[3] = G_NSEG;
            g.aux[0] = tg.dst;
            g.in[0] = kt_to_d(s, G_E * H), g.n_in[0] = G_E * H;
            g.fwd = softmax_fwd_d;
            float *da = gc_setup(&g, G_E * H, &st);
            qc_segment_softmax_forward_cpu(a, mx, sm, s, tg.csr, H);
            gc_loss(&g);
            T_EXPECT(kt_maxdiff(a, g.out, G_E * H) < 1e-6, "forward");
            for (int64_t h = 0; h < H; h++) {
                T_EXPECT(mx[0 * H + h] == 0.0f && sm[0 * H + h] == QC_SOFTMAX_EPS, "empty stats");
                for (int64_t e = 0; e < G_E; e++)
                    if (tg.dst[e] == 1)
                        T_EXPECT(a[e * H + h] == 1.0f, "single edge α = %.9g",
                                 (double)a[e * H + h]);
                double tot = 0;
                for (int64_t e = 0; e < G_E; e++)
                    if (tg.dst[e] == 2)
                        tot += (double)a[e * H + h];
                T_EXPECT_NEAR(tot, 1.0, 1e-6, 0, "α sums to 1 over a segment");
            }
            qc_segment_softmax_backward_cpu(ds, da, a, tg.csr, H);
            gc_check(&g, 0, ds, ATOL, RTOL, "softmax dscore");
            /* a recomputation from the saved statistics gives the same bits (fused-path contract)
             */
            for (int64_t e = 0; e < G_E; e++)
                for (int64_t h = 0; h < H; h++) {
                    int64_t d = tg.dst[e];
                    float re = expf(s[e * H + h] - mx[d * H + h]) / sm[d * H + h];
                    T_EXPECT(re == a[e * H + h], "recompute from stats at %lld,%lld", (long long)e,
                             (long long)h);
                }
            for (int64_t i = 0; i < G_E * H; i++)
                if (!isfinite(a[i]) || !isfinite(ds[i])) {
                    T_FAIL_AT("non-finite α or dscore at %lld: %g, %g", (long long)i, (double)a[i],
                              (double)ds[i]);
                    break;
                }
            gc_free(&g);
            free(s), free(a), free(ds), free(da);
        }
    }

    QC_TEST ("attn_aggregate: forward and gradients, dropout off and on") {
        for (int drop_on = 0; drop_on < 2; drop_on++) {
            uint64_t st = qc_test_seed() + 82 + (uint64_t)drop_on;
            struct test_graph tg;
            test_graph_init(&tg, &st);
            int64_t H = 2, Dh = 3, D = H * Dh;
            struct qc_dropout drop = {0.3f, 99, 4, 17, 1000, NULL, 0, 0, 0};
            const struct qc_dropout *dp = drop_on ? &drop : NULL;
            float *al = kt_rand(G_E * H, 0, 1, &st), *v = kt_rand(G_E * D, -1, 1, &st);
            float *o = kt_zeros(G_NSEG * D), *dal = kt_zeros(G_E * H), *dv = kt_zeros(G_E * D);
            struct gc g = {0};
            g.dim[0] = G_E, g.dim[1] = H, g.dim[2] = Dh, g.dim[3] = G_NSEG;
            g.aux[0] = tg.dst, g.aux[1] = dp;
            g.in[0] = kt_to_d(al, G_E * H), g.n_in[0] = G_E * H;
            g.in[1] = kt_to_d(v, G_E * D), g.n_in[1] = G_E * D;
            g.fwd = aggregate_fwd_d;
            float *dout = gc_setup(&g, G_NSEG * D, &st);
            qc_attn_aggregate_forward_cpu(o, al, v, tg.csr, H, Dh, dp);
            gc_loss(&g);
            T_EXPECT(kt_maxdiff(o, g.out, G_NSEG * D) < 1e-5, "forward (dropout %d)", drop_on);
            qc_attn_aggregate_backward_cpu(dal, dv, dout, al, v, tg.csr, H, Dh, dp);
            gc_check(&g, 0, dal, ATOL, RTOL,
                     drop_on ? "aggregate dalpha (dropout)" : "aggregate dalpha");
            gc_check(&g, 1, dv, ATOL, RTOL, drop_on ? "aggregate dv (dropout)" : "aggregate dv");
            if (drop_on) {
                /* equals dropout op + plain aggregation */
                float *al2 = kt_zeros(G_E * H), *o2 = kt_zeros(G_NSEG * D);
                qc_dropout_forward_cpu(al2, al, G_E * H, &drop);
                qc_attn_aggregate_forward_cpu(o2, al2, v, tg.csr, H, Dh, NULL);
                T_EXPECT(memcmp(o, o2, (size_t)(G_NSEG * D) * 4) == 0,
                         "fused dropout differs from dropout op then aggregate");
                int64_t zeros = 0;
                for (int64_t i = 0; i < G_E * H; i++)
                    zeros += al2[i] == 0.0f;
                T_EXPECT(zeros > 0 && zeros < G_E * H, "dropout dropped %lld of %lld",
                         (long long)zeros, (long long)(G_E * H));
                free(al2), free(o2);
            }
            gc_free(&g);
            free(al), free(v), free(o), free(dal), free(dv), free(dout);
        }
    }
}

/* ==== Fourier features ===================================================================== */

static void fourier_fwd_d(struct gc *g)
{
    int64_t N = g->dim[0], D = g->dim[1], F = g->dim[2], W = 2 * F + 1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < D; i++) {
            double c = g->in[0][n * D + i];
            for (int64_t f = 0; f < F; f++) {
                double th = c * g->in[1][i * F + f] * 2.0 * (double)QC_PI_F;
                g->out[(n * D + i) * W + f] = cos(th);
                g->out[(n * D + i) * W + F + f] = sin(th);
            }
            g->out[(n * D + i) * W + 2 * F] = c;
        }
}

static void test_fourier(void)
{
    QC_TEST ("fourier_features: forward and gradients (dc, dfreqs)") {
        uint64_t st = qc_test_seed() + 90;
        int64_t N = 5, D = 3, F = 20, W = 2 * F + 1;
        float *c = kt_rand(N * D, -3, 3, &st), *fr = kt_rand(D * F, -0.3f, 0.3f, &st);
        float *phi = kt_zeros(N * D * W), *dc = kt_zeros(N * D), *dfr = kt_zeros(D * F);
        struct gc g = {0};
        g.dim[0] = N, g.dim[1] = D, g.dim[2] = F;
        g.in[0] = kt_to_d(c, N * D), g.n_in[0] = N * D;
        g.in[1] = kt_to_d(fr, D * F), g.n_in[1] = D * F;
        g.fwd = fourier_fwd_d;
        float *dphi = gc_setup(&g, N * D * W, &st);
        qc_fourier_features_forward_cpu(phi, c, fr, N, D, F);
        gc_loss(&g);
        /* θ up to ~6 rad rounded to fp32 (~5e-7) before cos/sin */
        T_EXPECT(kt_maxdiff(phi, g.out, N * D * W) < 2e-6, "forward");
        qc_fourier_features_backward_cpu(dc, dfr, dphi, c, fr, N, D, F);
        gc_check(&g, 0, dc, ATOL, RTOL, "fourier dc");
        gc_check(&g, 1, dfr, ATOL, RTOL, "fourier dfreqs");
        /* the variant reading cos/sin from the saved φ gives the same bits */
        float *dc2 = kt_zeros(N * D), *dfr2 = kt_zeros(D * F);
        qc_fourier_features_backward_saved_cpu(dc2, dfr2, dphi, phi, c, fr, N, D, F);
        T_EXPECT(memcmp(dc, dc2, (size_t)(N * D) * 4) == 0, "saved-φ dc differs");
        T_EXPECT(memcmp(dfr, dfr2, (size_t)(D * F) * 4) == 0, "saved-φ dfreqs differs");
        free(dc2), free(dfr2);
        gc_free(&g);
        free(c), free(fr), free(phi), free(dc), free(dfr), free(dphi);
    }
}

/* |got − exact| in units of the fp32 spacing at the exact value (an ulp of the result). */
static double ulps_from(float got, double exact)
{
    float e = fabsf((float)exact);
    double ulp = (double)nextafterf(e, INFINITY) - (double)e;
    return fabs((double)got - exact) / ulp;
}

static void test_fourier_sincos(void)
{
    QC_TEST ("fourier_features: cos θ and sin θ correctly rounded for the fp32 θ (sincos)") {
        /* AV2-size arguments: c up to ±300 m, learnt frequencies up to ±4, so |θ| up to ~7,500;
         * plus zeros, a sign, NaN, ±inf and |θ| beyond the fast path's 1e6. F = 70 cuts the
         * bands into chunks of 32, 32, 6. */
        uint64_t st = qc_test_seed() + 91;
        int64_t N = 4000, D = 3, F = 70, W = 2 * F + 1;
        float *c = kt_rand(N * D, -300.0f, 300.0f, &st), *fr = kt_rand(D * F, -4.0f, 4.0f, &st);
        c[0] = 0.0f, c[1] = -0.0f, c[2] = NAN, c[3] = INFINITY, c[4] = -1.0e6f, c[5] = 3.0e5f;
        c[6] = 1e-30f;
        float *phi = kt_zeros(N * D * W);
        qc_fourier_features_forward_cpu(phi, c, fr, N, D, F);
        double worst = 0.0;
        int64_t bad_special = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < D; i++) {
                const float ci = c[n * D + i], *p = phi + (n * D + i) * W;
                for (int64_t f = 0; f < F; f++) {
                    const float th = ((ci * fr[i * F + f]) * 2.0f) * QC_PI_F; /* PyTorch's θ */
                    if (!isfinite(th)) {
                        bad_special += !(isnan(p[f]) && isnan(p[F + f]));
                        continue;
                    }
                    const double uc = ulps_from(p[f], cos((double)th));
                    const double us = ulps_from(p[F + f], sin((double)th));
                    worst = uc > worst ? uc : worst;
                    worst = us > worst ? us : worst;
                }
                bad_special += memcmp(&p[2 * F], &ci, sizeof ci) != 0 && !isnan(ci);
            }
        printf("      worst error %.6f ulp over %lld values\n", worst, (long long)(2 * N * D * F));
        /* correctly rounded but within ~1e-13 relative of a rounding boundary: ≤ 0.5 ulp + ε
         * (glibc's sincosf reaches 0.56; the Taylor series one term shorter, 0.50009; an
         * argument reduction without the low part of π/2, 1.6e6 near the zeros) */
        T_EXPECT(worst <= 0.5 + 1e-5, "worst %.6f ulp > 0.5", worst);
        T_EXPECT(bad_special == 0, "%lld non-finite θ not NaN, or c not passed through",
                 (long long)bad_special);
        /* the backward's recompute of cos / sin equals the saved φ bit for bit across chunks */
        float *dphi = kt_rand(N * D * W, -1.0f, 1.0f, &st);
        float *dc = kt_zeros(N * D), *dfr = kt_zeros(D * F);
        float *dc2 = kt_zeros(N * D), *dfr2 = kt_zeros(D * F);
        c[2] = 1.0f, c[3] = 2.0f; /* finite gradients to compare */
        qc_fourier_features_forward_cpu(phi, c, fr, N, D, F);
        qc_fourier_features_backward_cpu(dc, dfr, dphi, c, fr, N, D, F);
        qc_fourier_features_backward_saved_cpu(dc2, dfr2, dphi, phi, c, fr, N, D, F);
        T_EXPECT(memcmp(dc, dc2, (size_t)(N * D) * 4) == 0, "recomputed-φ dc differs");
        T_EXPECT(memcmp(dfr, dfr2, (size_t)(D * F) * 4) == 0, "recomputed-φ dfreqs differs");
        free(c), free(fr), free(phi), free(dphi), free(dc), free(dfr), free(dc2), free(dfr2);
    }
}

/* ==== GRU ================================================================================== */

static double sigm_d(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* One GRU step in double: h_out from x (N,IC), h (N,C). */
static void gru_cell_d(double *h_out, const double *x, const double *h, const double *wih,
                       const double *bih, const double *whh, const double *bhh, int64_t N,
                       int64_t IC, int64_t C)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double xg[3], hg[3];
            for (int gi = 0; gi < 3; gi++) {
                int64_t row = gi * C + c;
                xg[gi] = bih[row];
                for (int64_t i = 0; i < IC; i++)
                    xg[gi] += wih[row * IC + i] * x[n * IC + i];
                hg[gi] = bhh[row];
                for (int64_t j = 0; j < C; j++)
                    hg[gi] += whh[row * C + j] * h[n * C + j];
            }
            double r = sigm_d(xg[0] + hg[0]), z = sigm_d(xg[1] + hg[1]);
            double nn = tanh(xg[2] + r * hg[2]);
            h_out[n * C + c] = (1 - z) * nn + z * h[n * C + c];
        }
}

/* in: 0 x (L,N,IC), 1 h0 (N,C), 2 w_ih, 3 b_ih, 4 w_hh, 5 b_hh; out: h_L (N,C). */
static void gru_seq_fwd_d(struct gc *g)
{
    int64_t L = g->dim[0], N = g->dim[1], IC = g->dim[2], C = g->dim[3];
    double *h = malloc((size_t)(N * C) * sizeof(double));
    double *hn = malloc((size_t)(N * C) * sizeof(double));
    memcpy(h, g->in[1], (size_t)(N * C) * sizeof(double));
    for (int64_t t = 0; t < L; t++) {
        gru_cell_d(hn, g->in[0] + t * N * IC, h, g->in[2], g->in[3], g->in[4], g->in[5], N, IC, C);
        memcpy(h, hn, (size_t)(N * C) * sizeof(double));
    }
    memcpy(g->out, h, (size_t)(N * C) * sizeof(double));
    free(h);
    free(hn);
}

static void test_gru(void)
{
    QC_TEST ("gru: cell and sequence against a double reference, gradients") {
        for (int seq = 0; seq < 2; seq++) {
            uint64_t st = qc_test_seed() + 100 + (uint64_t)seq;
            int64_t L = seq ? 4 : 1, N = 3, IC = 5, C = 4;
            float *x = kt_rand(L * N * IC, -1, 1, &st), *h0 = kt_rand(N * C, -1, 1, &st);
            float *wih = kt_rand(3 * C * IC, -0.7f, 0.7f, &st),
                  *bih = kt_rand(3 * C, -0.3f, 0.3f, &st);
            float *whh = kt_rand(3 * C * C, -0.7f, 0.7f, &st),
                  *bhh = kt_rand(3 * C, -0.3f, 0.3f, &st);
            struct gc g = {0};
            g.dim[0] = L, g.dim[1] = N, g.dim[2] = IC, g.dim[3] = C;
            float *ins[6] = {x, h0, wih, bih, whh, bhh};
            int64_t ns[6] = {L * N * IC, N * C, 3 * C * IC, 3 * C, 3 * C * C, 3 * C};
            for (int i = 0; i < 6; i++)
                g.in[i] = kt_to_d(ins[i], ns[i]), g.n_in[i] = ns[i];
            g.fwd = gru_seq_fwd_d;
            float *dh = gc_setup(&g, N * C, &st);
            gc_loss(&g);
            float *dx = kt_zeros(ns[0]), *dh0 = kt_zeros(ns[1]), *dwih = kt_zeros(ns[2]);
            float *dbih = kt_zeros(ns[3]), *dwhh = kt_zeros(ns[4]), *dbhh = kt_zeros(ns[5]);
            const float *hlast;
            float *hs = kt_zeros((L + 1) * N * C), *gates = kt_zeros(L * N * 4 * C);
            if (seq) {
                float *sf = kt_zeros(qc_gru_forward_scratch_numel(L, N, C));
                float *sb = kt_zeros(qc_gru_backward_scratch_numel(L, N, C));
                qc_gru_forward_cpu(hs, gates, x, h0, wih, bih, whh, bhh, L, N, IC, C, sf);
                hlast = hs + L * N * C;
                qc_gru_backward_cpu(dx, dh0, dwih, dbih, dwhh, dbhh, dh, hs, gates, x, wih, whh, L,
                                    N, IC, C, sb);
                /* eval (gates NULL) gives the same states */
                float *hs2 = kt_zeros((L + 1) * N * C);
                qc_gru_forward_cpu(hs2, NULL, x, h0, wih, bih, whh, bhh, L, N, IC, C, sf);
                T_EXPECT(memcmp(hs, hs2, (size_t)((L + 1) * N * C) * 4) == 0, "eval states");
                free(hs2), free(sf), free(sb);
            } else {
                float *sc = kt_zeros(qc_gru_cell_scratch_numel(N, C));
                qc_gru_cell_forward_cpu(hs, gates, x, h0, wih, bih, whh, bhh, N, IC, C, sc);
                hlast = hs;
                qc_gru_cell_backward_cpu(dx, dh0, dwih, dbih, dwhh, dbhh, dh, gates, x, h0, wih,
                                         whh, N, IC, C, sc);
                free(sc);
            }
            T_EXPECT(kt_maxdiff(hlast, g.out, N * C) < 2e-6, "%s forward vs double",
                     seq ? "sequence" : "cell");
            static const char *names[2][6] = {
                {"cell dx", "cell dh", "cell dw_ih", "cell db_ih", "cell dw_hh", "cell db_hh"},
                {"seq dx", "seq dh0", "seq dw_ih", "seq db_ih", "seq dw_hh", "seq db_hh"}};
            float *grads[6] = {dx, dh0, dwih, dbih, dwhh, dbhh};
            for (int i = 0; i < 6; i++)
                gc_check(&g, i, grads[i], ATOL, RTOL, names[seq][i]);
            gc_free(&g);
            free(x), free(h0), free(wih), free(bih), free(whh), free(bhh), free(dh), free(dx),
                free(dh0), free(dwih), free(dbih), free(dwhh), free(dbhh), free(hs), free(gates);
        }
    }
}

/* The sequence's rows run in blocks, one per thread (gru.c): with 1 and 3 threads (257 rows:
 * blocks of 85/86) the states, gates, dx and dh0 have the same bits, and the forward's states
 * and gates are those of L cell steps over all rows at once. */
static void test_gru_row_blocks(void)
{
    QC_TEST ("gru: row blocks on 1 and 3 threads give the bits of the whole-row cell steps") {
        uint64_t st = qc_test_seed() + 120;
        const int64_t L = 5, N = 257, IC = 24, C = 16;
        float *x = kt_rand(L * N * IC, -1, 1, &st), *h0 = kt_rand(N * C, -1, 1, &st);
        float *wih = kt_rand(3 * C * IC, -0.5f, 0.5f, &st), *bih = kt_rand(3 * C, -0.3f, 0.3f, &st);
        float *whh = kt_rand(3 * C * C, -0.5f, 0.5f, &st), *bhh = kt_rand(3 * C, -0.3f, 0.3f, &st);
        float *dh = kt_rand(N * C, -1, 1, &st);
        const int64_t n[7] = {(L + 1) * N * C, L * N * 4 * C, L * N * IC, N * C,
                              3 * C * IC,      3 * C,         3 * C * C};
        static const char *names[7] = {"states", "gates", "dx", "dh0", "dw_ih", "db_ih", "dw_hh"};
        float *res[2][7];
        for (int run = 0; run < 2; run++) {
            omp_set_num_threads(run ? 3 : 1);
            for (int i = 0; i < 7; i++)
                res[run][i] = kt_zeros(n[i]);
            float *dbhh = kt_zeros(3 * C);
            float *sf = kt_zeros(qc_gru_forward_scratch_numel(L, N, C));
            float *sb = kt_zeros(qc_gru_backward_scratch_numel(L, N, C));
            qc_gru_forward_cpu(res[run][0], res[run][1], x, h0, wih, bih, whh, bhh, L, N, IC, C,
                               sf);
            qc_gru_backward_cpu(res[run][2], res[run][3], res[run][4], res[run][5], res[run][6],
                                dbhh, dh, res[run][0], res[run][1], x, wih, whh, L, N, IC, C, sb);
            free(dbhh), free(sf), free(sb);
        }
        omp_set_num_threads(2);
        /* the weight gradients are one OpenBLAS GEMM over all L·N rows, whose bits depend on
         * OpenBLAS's own thread count: not compared */
        for (int i = 0; i < 4; i++)
            T_EXPECT(memcmp(res[0][i], res[1][i], (size_t)n[i] * 4) == 0, "%s: 1 vs 3 threads",
                     names[i]);
        /* L cell steps over all N rows (one GEMM of N rows per step) */
        float *h = kt_zeros(N * C), *hn = kt_zeros(N * C), *g = kt_zeros(N * 4 * C);
        float *sc = kt_zeros(qc_gru_cell_scratch_numel(N, C));
        memcpy(h, h0, (size_t)(N * C) * 4);
        for (int64_t t = 0; t < L; t++) {
            qc_gru_cell_forward_cpu(hn, g, x + t * N * IC, h, wih, bih, whh, bhh, N, IC, C, sc);
            T_EXPECT(memcmp(hn, res[1][0] + (t + 1) * N * C, (size_t)(N * C) * 4) == 0,
                     "step %lld: states differ from the cell's", (long long)t);
            T_EXPECT(memcmp(g, res[1][1] + t * N * 4 * C, (size_t)(N * 4 * C) * 4) == 0,
                     "step %lld: gates differ from the cell's", (long long)t);
            memcpy(h, hn, (size_t)(N * C) * 4);
        }
        free(h), free(hn), free(g), free(sc);
        for (int run = 0; run < 2; run++)
            for (int i = 0; i < 7; i++)
                free(res[run][i]);
        free(x), free(h0), free(wih), free(bih), free(whh), free(bhh), free(dh);
    }
}

/* ==== log_softmax / logsumexp / losses ===================================================== */

static void lsm_fwd_d(struct gc *g)
{
    int64_t N = g->dim[0], K = g->dim[1];
    for (int64_t n = 0; n < N; n++) {
        double m = -(double)INFINITY, s = 0;
        for (int64_t k = 0; k < K; k++)
            m = fmax(m, g->in[0][n * K + k]);
        for (int64_t k = 0; k < K; k++)
            s += exp(g->in[0][n * K + k] - m);
        if (g->dim[2]) /* logsumexp */
            g->out[n] = log(s) + m;
        else
            for (int64_t k = 0; k < K; k++)
                g->out[n * K + k] = g->in[0][n * K + k] - m - log(s);
    }
}

static void test_softmax_rows(void)
{
    QC_TEST ("log_softmax and logsumexp: forward and gradients") {
        for (int lse = 0; lse < 2; lse++) {
            uint64_t st = qc_test_seed() + 110 + (uint64_t)lse;
            int64_t N = 5, K = 6, no = lse ? N : N * K;
            float *x = kt_rand(N * K, -3, 3, &st), *y = kt_zeros(no), *dx = kt_zeros(N * K);
            struct gc g = {0};
            g.dim[0] = N, g.dim[1] = K, g.dim[2] = lse;
            g.in[0] = kt_to_d(x, N * K), g.n_in[0] = N * K;
            g.fwd = lsm_fwd_d;
            float *dy = gc_setup(&g, no, &st);
            gc_loss(&g);
            if (lse) {
                qc_logsumexp_forward_cpu(y, x, N, K);
                qc_logsumexp_backward_cpu(dx, dy, x, y, N, K);
            } else {
                qc_log_softmax_forward_cpu(y, x, N, K);
                qc_log_softmax_backward_cpu(dx, dy, y, N, K);
            }
            T_EXPECT(kt_maxdiff(y, g.out, no) < 2e-6, "%s forward",
                     lse ? "logsumexp" : "log_softmax");
            gc_check(&g, 0, dx, ATOL, RTOL, lse ? "logsumexp dx" : "log_softmax dx");
            gc_free(&g);
            free(x), free(y), free(dx), free(dy);
        }
    }
}

static double laplace_d(double mu, double sc, double y)
{
    double s = sc > 1e-6 ? sc : (double)QC_LAPLACE_SCALE_MIN;
    return log(2 * s) + fabs(y - mu) / s;
}

static void laplace_fwd_d(struct gc *g)
{
    const float *y = g->aux[0];
    for (int64_t i = 0; i < g->n_out; i++)
        g->out[i] = laplace_d(g->in[0][i], g->in[1][i], (double)y[i]);
}

static void test_laplace(void)
{
    QC_TEST ("laplace_nll: forward, gradients and the invisible clamp") {
        uint64_t st = qc_test_seed() + 120;
        int64_t n = 40;
        float *mu = kt_rand(n, -2, 2, &st), *sc = kt_rand(n, 0.1f, 2.0f, &st);
        float *off = kt_rand_away0(n, 0.05f, 2.0f, &st), *y = kt_zeros(n);
        for (int64_t i = 0; i < n; i++)
            y[i] = mu[i] + off[i];
        float *nll = kt_zeros(n), *dmu = kt_zeros(n), *dsc = kt_zeros(n);
        struct gc g = {0};
        g.aux[0] = y;
        g.in[0] = kt_to_d(mu, n), g.n_in[0] = n;
        g.in[1] = kt_to_d(sc, n), g.n_in[1] = n;
        g.fwd = laplace_fwd_d;
        float *dn = gc_setup(&g, n, &st);
        qc_laplace_nll_forward_cpu(nll, mu, sc, y, n);
        gc_loss(&g);
        T_EXPECT(kt_maxdiff(nll, g.out, n) < 1e-5, "forward");
        qc_laplace_nll_backward_cpu(dmu, dsc, dn, mu, sc, y, n);
        gc_check(&g, 0, dmu, ATOL, RTOL, "laplace dmu");
        gc_check(&g, 1, dsc, ATOL, RTOL, "laplace dscale");
        /* clamp: σ = 1e-9 is treated as 1e-6 in value and gradient, and the gradient reaches σ
         * (QCNET.md §6.1: the clamp is invisible to autograd). |y − μ| = 3e-6 makes the
         * expected dscale = 1/σ − |y − μ|/σ² = 1e6 − 3e6 = −2e6, far from 0, so a gradient
         * stopped at the clamp (0) fails; relative tolerance only. */
        float m1 = 0.0f, s1 = 1e-9f, y1 = 3e-6f, one = 1.0f, v, a, b;
        qc_laplace_nll_forward_cpu(&v, &m1, &s1, &y1, 1);
        qc_laplace_nll_backward_cpu(&a, &b, &one, &m1, &s1, &y1, 1);
        const double sc1 = 1e-6, d1 = (double)y1;
        T_EXPECT_NEAR(v, log(2.0 * sc1) + d1 / sc1, 0.0, 1e-5, "clamped value");
        T_EXPECT_NEAR(b, 1.0 / sc1 - d1 / (sc1 * sc1), 0.0, 1e-5, "clamped dscale");
        T_EXPECT_NEAR(a, -1.0 / sc1, 0.0, 1e-5, "clamped dmu");
        T_EXPECT((double)b < -1e6, "clamped dscale %g: the gradient must reach σ", (double)b);
        gc_free(&g);
        free(mu), free(sc), free(off), free(y), free(nll), free(dmu), free(dsc), free(dn);
    }
}

/* A small §6.1 problem: A agents, K modes, S steps, gt stride 3, masks with an agent that has
 * no valid step, a step valid for no agent and an agent without the classification mask. */
struct loss_case {
    int64_t A, K, S;
    float *loc, *scale, *gt, *pi;
    uint8_t *mask, *cls;
    int64_t best[8];
};

static void loss_case_init(struct loss_case *lc, uint64_t *st)
{
    lc->A = 5, lc->K = 3, lc->S = 6;
    int64_t A = lc->A, K = lc->K, S = lc->S;
    lc->gt = kt_rand(A * S * 3, -3, 3, st);
    lc->loc = kt_zeros(A * K * S * 2);
    float *off = kt_rand_away0(A * K * S * 2, 0.05f, 1.5f, st);
    for (int64_t a = 0; a < A; a++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t d = 0; d < 2; d++) {
                    int64_t o = ((a * K + k) * S + s) * 2 + d;
                    lc->loc[o] = lc->gt[(a * S + s) * 3 + d] + off[o];
                }
    free(off);
    lc->scale = kt_rand(A * K * S * 2, 0.1f, 2.0f, st);
    lc->pi = kt_rand(A * K, -2, 2, st);
    lc->mask = calloc((size_t)(A * S), 1);
    lc->cls = calloc((size_t)A, 1);
    for (int64_t a = 0; a < A; a++) {
        for (int64_t s = 0; s < S; s++)
            lc->mask[a * S + s] = (uint8_t)(a != 2 && s != 3 && ((a + s) % 4 != 1));
        lc->cls[a] = lc->mask[a * S + S - 1] || a == 0;
    }
    lc->cls[4] = 0;
    qc_best_mode_cpu(lc->best, lc->loc, lc->gt, 3, lc->mask, A, K, S);
}

static void loss_case_free(struct loss_case *lc)
{
    free(lc->loc), free(lc->scale), free(lc->gt), free(lc->pi), free(lc->mask), free(lc->cls);
}

/* in: 0 loc, 1 scale. aux: 0 lc. out: the loss. */
static void reg_loss_fwd_d(struct gc *g)
{
    const struct loss_case *lc = g->aux[0];
    int64_t A = lc->A, K = lc->K, S = lc->S;
    double total = 0;
    for (int64_t s = 0; s < S; s++) {
        double sum = 0, cnt = 0;
        for (int64_t a = 0; a < A; a++) {
            int64_t o = ((a * K + lc->best[a]) * S + s) * 2;
            const float *y = lc->gt + (a * S + s) * 3;
            double l = laplace_d(g->in[0][o], g->in[1][o], (double)y[0]) +
                       laplace_d(g->in[0][o + 1], g->in[1][o + 1], (double)y[1]);
            sum += l * lc->mask[a * S + s];
            cnt += lc->mask[a * S + s];
        }
        total += sum / fmax(1.0, cnt);
    }
    g->out[0] = total / (double)S;
}

/* in: 0 pi. aux: 0 lc. */
static void mixture_fwd_d(struct gc *g)
{
    const struct loss_case *lc = g->aux[0];
    int64_t A = lc->A, K = lc->K, S = lc->S;
    double sum = 0, cnt = 0;
    for (int64_t a = 0; a < A; a++) {
        double t[8], m = -(double)INFINITY, se = 0, mt = -(double)INFINITY, st = 0;
        for (int64_t k = 0; k < K; k++)
            m = fmax(m, g->in[0][a * K + k]);
        for (int64_t k = 0; k < K; k++)
            se += exp(g->in[0][a * K + k] - m);
        double msk = lc->mask[a * S + S - 1];
        const float *y = lc->gt + (a * S + S - 1) * 3;
        for (int64_t k = 0; k < K; k++) {
            int64_t o = ((a * K + k) * S + S - 1) * 2;
            double n =
                laplace_d((double)lc->loc[o], (double)lc->scale[o], (double)y[0]) * msk +
                laplace_d((double)lc->loc[o + 1], (double)lc->scale[o + 1], (double)y[1]) * msk;
            t[k] = g->in[0][a * K + k] - m - log(se) - n;
            mt = fmax(mt, t[k]);
        }
        for (int64_t k = 0; k < K; k++)
            st += exp(t[k] - mt);
        sum += -(log(st) + mt) * lc->cls[a];
        cnt += lc->cls[a];
    }
    g->out[0] = sum / fmax(1.0, cnt);
}

static void test_losses(void)
{
    QC_TEST ("best_mode: masked L2 sum, ties to the first mode, no valid step gives 0") {
        int64_t A = 2, K = 4, S = 2;
        float loc[2 * 4 * 2 * 2] = {0}, gt[2 * 2 * 3] = {0};
        uint8_t mask[4] = {1, 1, 0, 0};
        /* agent 0: modes 1 and 3 equally best (distance 1 per step), others 2 */
        for (int64_t k = 0; k < K; k++)
            for (int64_t s = 0; s < S; s++)
                loc[((0 * K + k) * S + s) * 2] = (k == 1 || k == 3) ? 1.0f : 2.0f;
        for (int64_t k = 0; k < K; k++) /* agent 1: mode 2 closest but no valid step */
            loc[((1 * K + k) * S) * 2] = k == 2 ? 0.0f : 5.0f;
        int64_t best[2] = {-1, -1};
        qc_best_mode_cpu(best, loc, gt, 3, mask, A, K, S);
        T_EXPECT_EQ_I64(best[0], 1, "tie goes to the first index");
        T_EXPECT_EQ_I64(best[1], 0, "no valid step gives mode 0");
    }

    QC_TEST ("reg_loss: per-step normalised Laplace NLL of the best mode, value and gradients") {
        uint64_t st = qc_test_seed() + 130;
        struct loss_case lc;
        loss_case_init(&lc, &st);
        int64_t n = lc.A * lc.K * lc.S * 2;
        float *scr = kt_zeros(qc_reg_loss_scratch_numel(lc.A, lc.S));
        struct gc g = {0};
        g.aux[0] = &lc;
        g.in[0] = kt_to_d(lc.loc, n), g.n_in[0] = n;
        g.in[1] = kt_to_d(lc.scale, n), g.n_in[1] = n;
        g.fwd = reg_loss_fwd_d;
        float *dl = gc_setup(&g, 1, &st);
        float loss, *dloc = kt_zeros(n), *dsc = kt_zeros(n);
        qc_reg_loss_forward_cpu(&loss, lc.loc, lc.scale, lc.best, lc.gt, 3, lc.mask, NULL, lc.A,
                                lc.K, lc.S, scr);
        gc_loss(&g);
        T_EXPECT_NEAR(loss, g.out[0], 1e-5, 1e-5, "loss value");
        qc_reg_loss_backward_cpu(dloc, dsc, dl, lc.loc, lc.scale, lc.best, lc.gt, 3, lc.mask, NULL,
                                 lc.A, lc.K, lc.S, scr);
        gc_check(&g, 0, dloc, ATOL, RTOL, "reg_loss dloc");
        gc_check(&g, 1, dsc, ATOL, RTOL, "reg_loss dscale");
        gc_free(&g);
        free(scr), free(dl), free(dloc), free(dsc);
        loss_case_free(&lc);
    }

    QC_TEST ("losses with the denominators of a larger group: the parts add up to the whole") {
        uint64_t st = qc_test_seed() + 177;
        struct loss_case lc;
        loss_case_init(&lc, &st);
        const int64_t A = lc.A, K = lc.K, S = lc.S, h = 2; /* agents [0, 2) and [2, 5) */
        float *scr = kt_zeros(qc_reg_loss_scratch_numel(A, S));
        float cnt[8], ccls = 0;
        for (int64_t s = 0; s < S; s++) {
            int64_t c = 0;
            for (int64_t a = 0; a < A; a++)
                c += lc.mask[a * S + s];
            cnt[s] = (float)(c > 1 ? c : 1);
        }
        for (int64_t a = 0; a < A; a++)
            ccls += lc.cls[a];
        ccls = ccls > 1 ? ccls : 1;
        float whole, w2, part[2], cw, cp[2];
        qc_reg_loss_forward_cpu(&whole, lc.loc, lc.scale, lc.best, lc.gt, 3, lc.mask, NULL, A, K, S,
                                scr);
        qc_reg_loss_forward_cpu(&w2, lc.loc, lc.scale, lc.best, lc.gt, 3, lc.mask, cnt, A, K, S,
                                scr);
        T_EXPECT(whole == w2, "its own counts given explicitly: the same bits");
        const int64_t a0[2] = {0, h}, na[2] = {h, A - h};
        float *dloc = kt_zeros(A * K * S * 2), *dpart = kt_zeros(A * K * S * 2);
        float *dpi = kt_zeros(A * K), *dpip = kt_zeros(A * K), one = 1.0f;
        qc_reg_loss_backward_cpu(dloc, NULL, &one, lc.loc, lc.scale, lc.best, lc.gt, 3, lc.mask,
                                 NULL, A, K, S, scr);
        qc_mixture_nll_forward_cpu(&cw, lc.pi, lc.loc, lc.scale, lc.gt, 3, lc.mask, lc.cls, NULL, A,
                                   K, S);
        qc_mixture_nll_backward_cpu(dpi, &one, lc.pi, lc.loc, lc.scale, lc.gt, 3, lc.mask, lc.cls,
                                    NULL, A, K, S);
        for (int p = 0; p < 2; p++) {
            const int64_t o = a0[p];
            qc_reg_loss_forward_cpu(&part[p], lc.loc + o * K * S * 2, lc.scale + o * K * S * 2,
                                    lc.best + o, lc.gt + o * S * 3, 3, lc.mask + o * S, cnt, na[p],
                                    K, S, scr);
            qc_reg_loss_backward_cpu(dpart + o * K * S * 2, NULL, &one, lc.loc + o * K * S * 2,
                                     lc.scale + o * K * S * 2, lc.best + o, lc.gt + o * S * 3, 3,
                                     lc.mask + o * S, cnt, na[p], K, S, scr);
            qc_mixture_nll_forward_cpu(&cp[p], lc.pi + o * K, lc.loc + o * K * S * 2,
                                       lc.scale + o * K * S * 2, lc.gt + o * S * 3, 3,
                                       lc.mask + o * S, lc.cls + o, &ccls, na[p], K, S);
            qc_mixture_nll_backward_cpu(dpip + o * K, &one, lc.pi + o * K, lc.loc + o * K * S * 2,
                                        lc.scale + o * K * S * 2, lc.gt + o * S * 3, 3,
                                        lc.mask + o * S, lc.cls + o, &ccls, na[p], K, S);
        }
        T_EXPECT_NEAR(part[0] + part[1], whole, 1e-6, 1e-6, "regression parts add up");
        T_EXPECT_NEAR(cp[0] + cp[1], cw, 1e-6, 1e-6, "classification parts add up");
        T_EXPECT(memcmp(dloc, dpart, (size_t)(A * K * S * 2) * sizeof(float)) == 0,
                 "regression gradients of the parts are the whole's, bit for bit");
        T_EXPECT(memcmp(dpi, dpip, (size_t)(A * K) * sizeof(float)) == 0,
                 "classification gradients of the parts are the whole's, bit for bit");
        free(scr), free(dloc), free(dpart), free(dpi), free(dpip);
        loss_case_free(&lc);
    }

    QC_TEST ("mixture_nll: classification loss value and gradient w.r.t. pi") {
        uint64_t st = qc_test_seed() + 131;
        struct loss_case lc;
        loss_case_init(&lc, &st);
        struct gc g = {0};
        g.aux[0] = &lc;
        g.in[0] = kt_to_d(lc.pi, lc.A * lc.K), g.n_in[0] = lc.A * lc.K;
        g.fwd = mixture_fwd_d;
        float *dl = gc_setup(&g, 1, &st);
        float loss, *dpi = kt_zeros(lc.A * lc.K);
        qc_mixture_nll_forward_cpu(&loss, lc.pi, lc.loc, lc.scale, lc.gt, 3, lc.mask, lc.cls, NULL,
                                   lc.A, lc.K, lc.S);
        gc_loss(&g);
        T_EXPECT_NEAR(loss, g.out[0], 1e-5, 1e-5, "loss value");
        qc_mixture_nll_backward_cpu(dpi, dl, lc.pi, lc.loc, lc.scale, lc.gt, 3, lc.mask, lc.cls,
                                    NULL, lc.A, lc.K, lc.S);
        gc_check(&g, 0, dpi, ATOL, RTOL, "mixture dpi");
        for (int64_t k = 0; k < lc.K; k++)
            T_EXPECT(dpi[4 * lc.K + k] == 0.0f, "agent without cls mask has zero gradient");
        gc_free(&g);
        free(dl), free(dpi);
        loss_case_free(&lc);
    }
}

/* ==== AdamW ================================================================================ */

static void test_adamw(void)
{
    QC_TEST ("adamw: five steps against a hand-computed double-precision update") {
        uint64_t st = qc_test_seed() + 140;
        int64_t n = 64;
        float *p = kt_rand(n, -1, 1, &st), *m = kt_zeros(n), *v = kt_zeros(n);
        double *pd = kt_to_d(p, n), *md = calloc((size_t)n, sizeof(double));
        double *vd = calloc((size_t)n, sizeof(double));
        struct qc_adamw_hparams hp = {1e-2, 0.9, 0.999, 1e-8, 0.05, 0};
        for (int step = 1; step <= 5; step++) {
            float *gr = kt_rand(n, -1, 1, &st);
            hp.step = step;
            qc_adamw_step_cpu(p, m, v, gr, n, &hp);
            double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.999, step);
            for (int64_t i = 0; i < n; i++) {
                double g = (double)gr[i];
                pd[i] *= 1 - hp.lr * hp.weight_decay;
                md[i] = 0.9 * md[i] + 0.1 * g;
                vd[i] = 0.999 * vd[i] + 0.001 * g * g;
                pd[i] -= hp.lr / bc1 * md[i] / (sqrt(vd[i]) / sqrt(bc2) + 1e-8);
            }
            free(gr);
        }
        /* each step moves p by ≤ lr·~3 with fp32 rounding ~1e-7 relative per op */
        T_EXPECT(kt_maxdiff(p, pd, n) < 2e-6, "param max diff %.3g", kt_maxdiff(p, pd, n));
        T_EXPECT(kt_maxdiff(m, md, n) < 1e-6, "m max diff %.3g", kt_maxdiff(m, md, n));
        T_EXPECT(kt_maxdiff(v, vd, n) < 1e-7, "v max diff %.3g", kt_maxdiff(v, vd, n));
        free(p), free(m), free(v), free(pd), free(md), free(vd);
    }

    QC_TEST ("adamw: segments with per-tensor decay flags equal per-tensor steps") {
        uint64_t st = qc_test_seed() + 141;
        int64_t off[4] = {0, 10, 13, 30};
        uint8_t decay[3] = {1, 0, 1};
        int64_t n = 30;
        float *p = kt_rand(n, -1, 1, &st), *m = kt_rand(n, -0.1f, 0.1f, &st);
        float *v = kt_rand(n, 0, 0.01f, &st), *gr = kt_rand(n, -1, 1, &st);
        float *p2 = kt_zeros(n), *m2 = kt_zeros(n), *v2 = kt_zeros(n);
        memcpy(p2, p, (size_t)n * 4), memcpy(m2, m, (size_t)n * 4), memcpy(v2, v, (size_t)n * 4);
        struct qc_adamw_hparams hp = {5e-4, 0.9, 0.999, 1e-8, 0.5, 3};
        qc_adamw_step_segments_cpu(p, m, v, gr, off, decay, 3, &hp);
        for (int s = 0; s < 3; s++) {
            struct qc_adamw_hparams h = hp;
            h.weight_decay = decay[s] ? hp.weight_decay : 0.0;
            qc_adamw_step_cpu(p2 + off[s], m2 + off[s], v2 + off[s], gr + off[s],
                              off[s + 1] - off[s], &h);
        }
        T_EXPECT(memcmp(p, p2, (size_t)n * 4) == 0, "segment params differ");
        T_EXPECT(memcmp(m, m2, (size_t)n * 4) == 0 && memcmp(v, v2, (size_t)n * 4) == 0,
                 "segment moments differ");
        free(p), free(m), free(v), free(gr), free(p2), free(m2), free(v2);
    }
}

/* ==== determinism across thread counts ====================================================== */

static void test_determinism(void)
{
    QC_TEST ("determinism: reductions give the same bits with 1 and 3 threads") {
        uint64_t st = qc_test_seed() + 150;
        int64_t Nd = 300, E = 5000, H = 8, Dh = 16, D = H * Dh;
        int64_t *dst = malloc((size_t)E * sizeof(int64_t)), *ptr = malloc((size_t)(Nd + 1) * 8);
        int64_t *perm = malloc((size_t)E * sizeof(int64_t));
        for (int64_t e = 0; e < E; e++)
            dst[e] = (int64_t)(qc_test_rand(&st) % (uint64_t)Nd);
        qc_csr_build_cpu(ptr, perm, dst, E, Nd);
        struct qc_csr csr = {ptr, perm, dst, Nd, E};
        float *q = kt_rand(Nd * D, -1, 1, &st), *k = kt_rand(E * D, -1, 1, &st);
        float *vv = kt_rand(E * D, -1, 1, &st), *ln_w = kt_rand(D, 0.5f, 1.5f, &st);
        struct qc_dropout drop = {0.1f, 5, 6, 7, 0, NULL, 0, 0, 0};
        float *res[2][6];
        for (int run = 0; run < 2; run++) {
            omp_set_num_threads(run ? 3 : 1);
            float *s = kt_zeros(E * H), *a = kt_zeros(E * H), *o = kt_zeros(Nd * D);
            float *dq = kt_zeros(Nd * D), *dlnw = kt_zeros(D), *dlnb = kt_zeros(D);
            float *mean = kt_zeros(E), *rstd = kt_zeros(E), *y = kt_zeros(E * D);
            qc_attn_score_forward_cpu(s, q, k, csr, H, Dh, 0.25f);
            qc_segment_softmax_forward_cpu(a, NULL, NULL, s, csr, H);
            qc_attn_aggregate_forward_cpu(o, a, vv, csr, H, Dh, &drop);
            qc_attn_score_backward_cpu(dq, NULL, a, q, k, csr, H, Dh, 0.25f, false);
            qc_layernorm_forward_cpu(y, mean, rstd, k, ln_w, ln_w, E, D);
            qc_layernorm_backward_cpu(NULL, dlnw, dlnb, vv, k, mean, rstd, ln_w, E, D, false);
            qc_linear_backward_cpu(NULL, D, NULL, dlnb, vv, k, D, ln_w, E, D, D, false);
            res[run][0] = a, res[run][1] = o, res[run][2] = dq, res[run][3] = dlnw;
            res[run][4] = dlnb, res[run][5] = y;
            free(s), free(mean), free(rstd);
        }
        omp_set_num_threads(2);
        int64_t sizes[6] = {E * H, Nd * D, Nd * D, D, D, E * D};
        static const char *names[6] = {
            "softmax", "aggregate", "dq", "ln dweight", "ln dbias + linear dbias", "layernorm fwd"};
        for (int i = 0; i < 6; i++) {
            T_EXPECT(memcmp(res[0][i], res[1][i], (size_t)sizes[i] * 4) == 0, "%s differs",
                     names[i]);
            free(res[0][i]), free(res[1][i]);
        }
        free(dst), free(ptr), free(perm), free(q), free(k), free(vv), free(ln_w);
    }
}

int main(void)
{
    test_philox();
    test_geometry();
    test_linear();
    test_layernorm();
    test_activations();
    test_gate_update();
    test_embedding();
    test_cumsum();
    test_layout();
    test_csr_gather_scatter();
    test_attention_ops();
    test_fourier();
    test_fourier_sincos();
    test_gru();
    test_gru_row_blocks();
    test_softmax_rows();
    test_laplace();
    test_losses();
    test_adamw();
    test_determinism();
    return qc_test_summary();
}
