/*
 * test_blocks.c — QCNet's blocks on the CPU backend: FourierEmbedding, MLPLayer and
 * AttentionLayer (unfused and fused).
 *
 * - Gradient checks: a double-precision reference forward written here from QCNET.md §3 (not
 *   from the block code) gives central differences of L = Σ out ⊙ R for every parameter and
 *   every differentiable input; the fp32 backward (dout = R) must match. Dropout on: the masks
 *   are a fixed function of (seed, step, site, index), so the reference applies the same ones.
 * - Fused vs unfused: same outputs and gradients within stated tolerances, on graphs with empty,
 *   one-edge and many-edge destinations, one query and several queries (modes) per base
 *   destination.
 * - Mode sharing: Q queries sharing base edges == the plain graph with every edge, source row
 *   and feature row copied per mode (as PyTorch materialises them).
 * - Recompute == store: re-running forward fills every stash entry with the same bytes (memcmp);
 *   backward is deterministic.
 * - The fused stash grows with the edges by the shared edge embeddings r alone (D per edge).
 *
 * Small shapes (D 8, 2 heads × 4, F 3) keep the central differences cheap; the agreement
 * tests use the parity config (D 32, 2 × 16, F 8).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "qc_attention.h"
#include "qc_fourier.h"
#include "qc_kernels.h"
#include "qc_mlp.h"
#include "qc_stash.h"

// ---- random helpers -------------------------------------------------------------------------

static uint64_t rng_state;

static double urand(void) /* [0, 1) */
{
    return (double)(qc_test_rand(&rng_state) >> 11) * 0x1.0p-53;
}

static float frand(float lo, float hi)
{
    return (float)((double)lo + ((double)hi - (double)lo) * urand());
}

static void fill(float *x, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = frand(lo, hi);
}

static float *fnew(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p)
        T_FATAL("out of memory");
    return p;
}

static double *dnew(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p)
        T_FATAL("out of memory");
    return p;
}

static double *to_double(const float *x, int64_t n)
{
    double *d = dnew(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = (double)x[i];
    return d;
}

/* Parameters: Linear weights Xavier-like, everything else perturbed away from the QCNet
 * initial values (a LayerNorm weight of exactly 1 and zero biases would hide bugs). */
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

// ---- double-precision reference (QCNET.md §3) ---------------------------------------------

static void dlinear(double *out, const double *in, int64_t ldi, const double *W, const double *b,
                    int64_t N, int64_t IC, int64_t OC)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t i = 0; i < IC; i++)
                s += in[n * ldi + i] * W[o * IC + i];
            out[n * OC + o] = s;
        }
}

static void dlayernorm(double *out, const double *in, const double *w, const double *b, int64_t N,
                       int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        double mu = 0.0, var = 0.0;
        for (int64_t c = 0; c < C; c++)
            mu += in[n * C + c];
        mu /= (double)C;
        for (int64_t c = 0; c < C; c++)
            var += (in[n * C + c] - mu) * (in[n * C + c] - mu);
        var /= (double)C;
        double r = 1.0 / sqrt(var + 1e-5);
        for (int64_t c = 0; c < C; c++)
            out[n * C + c] = (in[n * C + c] - mu) * r * w[c] + b[c];
    }
}

static void drelu(double *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] > 0.0 ? x[i] : 0.0;
}

/* FE(d): out (N,D); P the block's parameters in double; c (N,d); cat (N,D) or NULL. */
static void dfourier(const struct qc_fourier *fe, const double *P, double *out, const double *c,
                     const double *cat, int64_t N)
{
    const int64_t D = fe->D, F = fe->F, d = fe->d, W1 = 2 * F + 1;
    double *phi = dnew(W1), *z = dnew(D), *h = dnew(D), *s = dnew(N * D);
    for (int64_t n = 0; n < N; n++) {
        double *sn = s + n * D;
        for (int64_t i = 0; i < d; i++) {
            double ci = c[n * d + i];
            for (int64_t f = 0; f < F; f++) {
                double th = ci * P[fe->o_freqs + i * F + f] * 2.0 * (double)QC_PI_F;
                phi[f] = cos(th);
                phi[F + f] = sin(th);
            }
            phi[2 * F] = ci;
            dlinear(z, phi, W1, P + fe->o_w1[i], P + fe->o_b1[i], 1, W1, D);
            dlayernorm(z, z, P + fe->o_lnw[i], P + fe->o_lnb[i], 1, D);
            drelu(z, D);
            dlinear(h, z, D, P + fe->o_w2[i], P + fe->o_b2[i], 1, D, D);
            for (int64_t j = 0; j < D; j++)
                sn[j] += h[j];
        }
        if (cat)
            for (int64_t j = 0; j < D; j++)
                sn[j] += cat[n * D + j];
    }
    dlayernorm(s, s, P + fe->o_out_lnw, P + fe->o_out_lnb, N, D);
    drelu(s, N * D);
    dlinear(out, s, D, P + fe->o_out_w, P + fe->o_out_b, N, D, D);
    free(phi);
    free(z);
    free(h);
    free(s);
}

static void dmlp(const struct qc_mlp *m, const double *P, double *out, const double *x, int64_t N)
{
    double *z = dnew(N * m->D);
    dlinear(z, x, m->D, P + m->o_w1, P + m->o_b1, N, m->D, m->D);
    dlayernorm(z, z, P + m->o_lnw, P + m->o_lnb, N, m->D);
    drelu(z, N * m->D);
    dlinear(out, z, m->D, P + m->o_w2, P + m->o_b2, N, m->D, m->O);
    free(z);
}

static double dsigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* The dropout multiplier of element `index` at `site`, as the fp32 code applies it. */
static double ddrop(const struct qc_attn_ctx *ctx, uint32_t site, int64_t index)
{
    if (!ctx->training || ctx->dropout == 0.0f)
        return 1.0;
    float scale = 1.0f / (1.0f - ctx->dropout);
    return qc_dropout_keep(ctx->seed, ctx->step, site, index, ctx->dropout) ? (double)scale : 0.0;
}

// ---- attention test case ------------------------------------------------------------------

struct acase {
    /* shape */
    int64_t D, H, F, d, Q, Ns, Nd, nb, E;
    bool bip, pos, cat;
    struct qc_attn_ctx ctx;
    /* graph */
    int64_t *row_ptr, *src, *qrow;
    struct qc_attn_graph g;
    /* blocks and fp32 tensors */
    struct qc_attn l;
    struct qc_fourier fe;
    float *w, *few, *xs, *xd, *feat, *cat_table, *R;
    int64_t *cat_idx, ncat;
    /* fp32 results */
    float *out, *dw, *fedw, *dcat, *dxs, *dxd;
    /* double copies for the reference */
    double *w64, *few64, *xs64, *xd64, *feat64, *cat64;
};

/* Degrees cycle through 0, 1 and "many" (2..maxdeg) so every test sees empty, single-edge and
 * multi-edge destinations. Self-attention: Ns = Nd. Extra x_dst rows (never named by a query)
 * exercise u = 0 rows when Q > 1. */
static void acase_make(struct acase *c, int64_t D, int64_t H, int64_t F, int64_t d, bool bip,
                       bool pos, bool cat, int64_t Q, int64_t nb, int64_t Ns, int64_t maxdeg,
                       bool training)
{
    memset(c, 0, sizeof *c);
    c->D = D, c->H = H, c->F = F, c->d = d, c->Q = Q, c->nb = nb, c->bip = bip, c->pos = pos,
    c->cat = cat;
    c->Nd = nb * Q + (Q > 1 ? 3 : 0);
    c->Ns = bip ? Ns : c->Nd;
    c->row_ptr = calloc((size_t)nb + 1, sizeof *c->row_ptr);
    for (int64_t b = 0; b < nb; b++) {
        int64_t deg = b % 4 == 0   ? 0
                      : b % 4 == 1 ? 1
                                   : 2 + (int64_t)(urand() * (double)(maxdeg - 1));
        c->row_ptr[b + 1] = c->row_ptr[b] + deg;
    }
    c->E = c->row_ptr[nb];
    c->src = calloc((size_t)(c->E > 0 ? c->E : 1), sizeof *c->src);
    for (int64_t e = 0; e < c->E; e++)
        c->src[e] = (int64_t)(urand() * (double)c->Ns);
    if (Q > 1 || !bip) {
        /* a random permutation of x_dst rows; queries take the first nb*Q */
        c->qrow = calloc((size_t)c->Nd, sizeof *c->qrow);
        for (int64_t i = 0; i < c->Nd; i++)
            c->qrow[i] = i;
        for (int64_t i = c->Nd - 1; i > 0; i--) {
            int64_t j = (int64_t)(urand() * (double)(i + 1)), t = c->qrow[i];
            c->qrow[i] = c->qrow[j];
            c->qrow[j] = t;
        }
    }
    c->g = (struct qc_attn_graph){c->Ns,  c->Nd,   nb,   Q,    c->E, c->row_ptr,
                                  c->src, c->qrow, NULL, NULL, NULL};
    qc_attn_init(&c->l, D, H, bip, pos);
    c->w = fnew(c->l.params.numel);
    param_fill(&c->l.params, c->w);
    if (pos) {
        qc_fourier_init(&c->fe, d, F, D);
        c->few = fnew(c->fe.params.numel);
        param_fill(&c->fe.params, c->few);
        c->feat = fnew(c->E * d);
        fill(c->feat, c->E * d, -2.0f, 2.0f);
        if (cat) {
            c->ncat = 3;
            c->cat_table = fnew(c->ncat * D);
            fill(c->cat_table, c->ncat * D, -0.5f, 0.5f);
            c->cat_idx = calloc((size_t)(c->E > 0 ? c->E : 1), sizeof *c->cat_idx);
            for (int64_t e = 0; e < c->E; e++)
                c->cat_idx[e] = (int64_t)(urand() * (double)c->ncat);
        }
    }
    c->xd = fnew(c->Nd * D);
    fill(c->xd, c->Nd * D, -1.5f, 1.5f);
    if (bip) {
        c->xs = fnew(c->Ns * D);
        fill(c->xs, c->Ns * D, -1.5f, 1.5f);
    } else {
        c->xs = c->xd;
    }
    c->R = fnew(c->Nd * D);
    fill(c->R, c->Nd * D, -1.0f, 1.0f);
    c->ctx = (struct qc_attn_ctx){training, 0.25f, 0x1234abcdull, 7, 40, NULL, NULL};
}

static void acase_free(struct acase *c)
{
    free(c->row_ptr);
    free(c->src);
    free(c->qrow);
    free(c->w);
    free(c->few);
    free(c->feat);
    free(c->cat_table);
    free(c->cat_idx);
    if (c->xs != c->xd)
        free(c->xs);
    free(c->xd);
    free(c->R);
    free(c->out);
    free(c->dw);
    free(c->fedw);
    free(c->dcat);
    if (c->dxs != c->dxd)
        free(c->dxs);
    free(c->dxd);
    free(c->w64);
    free(c->few64);
    if (c->xs64 != c->xd64)
        free(c->xs64);
    free(c->xd64);
    free(c->feat64);
    free(c->cat64);
}

/* Every stash the fp32 run fills, for the recompute and stash-size tests. */
struct arun {
    struct qc_attn_edges ed;
    struct qc_attn_kv kv;
    struct qc_stash app;
};

static void arun_free(struct arun *r)
{
    qc_stash_deinit(&r->app);
    qc_attn_kv_deinit(&r->kv);
    qc_attn_edges_deinit(&r->ed);
}

static size_t arun_stash_bytes(const struct arun *r)
{
    return qc_stash_bytes(&r->ed.fe_stash) + qc_stash_bytes(&r->ed.stash) +
           qc_stash_bytes(&r->kv.stash) + qc_stash_bytes(&r->app);
}

/* Plans and allocates every stash and runs the forward; out (Nd,D) OVERWRITE. */
static void acase_forward(struct acase *c, enum qc_attn_impl impl, struct arun *r, float *out)
{
    qc_attn_bind(&c->l, c->w, c->dw);
    if (c->pos)
        qc_fourier_bind(&c->fe, c->few, c->fedw);
    enum qc_status s = qc_attn_edges_init(&r->ed, impl, &c->g, c->pos ? &c->fe : NULL, c->feat,
                                          c->cat_table, c->cat_idx, c->ncat, c->dcat);
    if (s != QC_OK)
        T_FATAL("edges_init: %s", qc_error_last());
    if (qc_stash_alloc(&r->ed.fe_stash) || qc_stash_alloc(&r->ed.stash))
        T_FATAL("alloc");
    T_EXPECT(qc_attn_edges_forward(&r->ed) == QC_OK, "%s", qc_error_last());
    qc_attn_kv_init(&r->kv, &c->l, &r->ed);
    if (qc_stash_alloc(&r->kv.stash))
        T_FATAL("alloc");
    T_EXPECT(qc_attn_kv_forward(&r->kv, c->xs) == QC_OK, "%s", qc_error_last());
    qc_stash_init(&r->app, impl == QC_ATTN_FUSED ? "attn_fused.app" : "attn_unfused.app");
    qc_attn_stash_plan(&r->kv, &r->app);
    if (qc_stash_alloc(&r->app))
        T_FATAL("alloc");
    T_EXPECT(qc_attn_forward(&r->kv, out, &r->app, c->xd, &c->ctx) == QC_OK, "%s", qc_error_last());
}

/* Zeroes the gradients and runs the backward with dout = R. */
static void acase_backward(struct acase *c, struct arun *r)
{
    memset(c->dw, 0, (size_t)c->l.params.numel * sizeof *c->dw);
    if (c->pos)
        memset(c->fedw, 0, (size_t)c->fe.params.numel * sizeof *c->fedw);
    if (c->dcat)
        memset(c->dcat, 0, (size_t)(c->ncat * c->D) * sizeof *c->dcat);
    T_EXPECT(qc_attn_backward(&r->kv, c->dxd, c->R, &r->app, c->xd, &c->ctx) == QC_OK, "%s",
             qc_error_last());
    /* self-attention: the source path adds into the same input gradient */
    T_EXPECT(qc_attn_kv_backward(&r->kv, c->bip ? c->dxs : c->dxd, c->xs, !c->bip) == QC_OK, "%s",
             qc_error_last());
    T_EXPECT(qc_attn_edges_backward(&r->ed) == QC_OK, "%s", qc_error_last());
}

/* Full fp32 forward + backward into c->out and the gradient buffers. */
static void acase_run(struct acase *c, enum qc_attn_impl impl, int64_t tile_edges)
{
    if (!c->out) {
        c->out = fnew(c->Nd * c->D);
        c->dw = fnew(c->l.params.numel);
        c->fedw = c->pos ? fnew(c->fe.params.numel) : NULL;
        c->dcat = c->cat ? fnew(c->ncat * c->D) : NULL;
        c->dxd = fnew(c->Nd * c->D);
        c->dxs = c->bip ? fnew(c->Ns * c->D) : c->dxd;
    }
    c->l.tile_edges = tile_edges;
    struct arun r;
    acase_forward(c, impl, &r, c->out);
    acase_backward(c, &r);
    arun_free(&r);
}

/* The reference forward in double from the double copies; out (Nd,D). */
static void acase_ref(const struct acase *c, double *out)
{
    const struct qc_attn *l = &c->l;
    const double *P = c->w64;
    const int64_t D = c->D, H = c->H, Dh = D / H, FF = l->FF, Nd = c->Nd, Ns = c->Ns, E = c->E;
    const double *xs = c->xs64, *xd = c->xd64;
    double *xsh = dnew(Ns * D), *xdh = dnew(Nd * D), *q = dnew(Nd * D), *k = dnew(Ns * D),
           *v = dnew(Ns * D), *kr = dnew(E * D), *vr = dnew(E * D), *u = dnew(Nd * D);
    dlayernorm(xsh, xs, P + l->o_ln_src_w, P + l->o_ln_src_b, Ns, D);
    dlayernorm(xdh, xd, P + l->o_ln_dst_w, P + l->o_ln_dst_b, Nd, D);
    dlinear(q, xdh, D, P + l->o_wq, P + l->o_bq, Nd, D, D);
    dlinear(k, xsh, D, P + l->o_wk, NULL, Ns, D, D);
    dlinear(v, xsh, D, P + l->o_wv, P + l->o_bv, Ns, D, D);
    if (c->pos) {
        double *r = dnew(E * D), *cat = NULL;
        if (c->cat) {
            cat = dnew(E * D);
            for (int64_t e = 0; e < E; e++)
                memcpy(cat + e * D, c->cat64 + c->cat_idx[e] * D, (size_t)D * sizeof *cat);
        }
        dfourier(&c->fe, c->few64, r, c->feat64, cat, E);
        dlayernorm(r, r, P + l->o_ln_r_w, P + l->o_ln_r_b, E, D);
        dlinear(kr, r, D, P + l->o_wkr, NULL, E, D, D);
        dlinear(vr, r, D, P + l->o_wvr, P + l->o_bvr, E, D, D);
        free(r);
        free(cat);
    }
    double scale = 1.0 / sqrt((double)Dh);
    double *s = dnew(E * H + 1);
    for (int64_t b = 0; b < c->nb; b++) {
        int64_t e0 = c->row_ptr[b], n = c->row_ptr[b + 1] - e0;
        for (int64_t kk = 0; kk < c->Q; kk++) {
            int64_t i = c->qrow ? c->qrow[b * c->Q + kk] : b * c->Q + kk;
            for (int64_t h = 0; h < H; h++) {
                double m = -(double)INFINITY, sum = 0.0;
                for (int64_t e = 0; e < n; e++) {
                    double acc = 0.0;
                    for (int64_t x = 0; x < Dh; x++) {
                        int64_t j = h * Dh + x;
                        acc += q[i * D + j] * (k[c->src[e0 + e] * D + j] + kr[(e0 + e) * D + j]);
                    }
                    s[e] = acc * scale;
                    m = s[e] > m ? s[e] : m;
                }
                for (int64_t e = 0; e < n; e++)
                    sum += exp(s[e] - m);
                for (int64_t e = 0; e < n; e++) {
                    double a = exp(s[e] - m) / (sum + 1e-16);
                    a *= ddrop(&c->ctx, c->ctx.site, (kk * E + e0 + e) * H + h);
                    for (int64_t x = 0; x < Dh; x++) {
                        int64_t j = h * Dh + x;
                        u[i * D + j] += a * (v[c->src[e0 + e] * D + j] + vr[(e0 + e) * D + j]);
                    }
                }
            }
        }
    }
    double *cat = dnew(Nd * 2 * D), *gg = dnew(Nd * D), *sr = dnew(Nd * D), *a = dnew(Nd * D),
           *x1 = dnew(Nd * D), *y = dnew(Nd * D), *h1 = dnew(Nd * FF), *f = dnew(Nd * D);
    for (int64_t i = 0; i < Nd; i++) {
        memcpy(cat + i * 2 * D, u + i * D, (size_t)D * sizeof *cat);
        memcpy(cat + i * 2 * D + D, xdh + i * D, (size_t)D * sizeof *cat);
    }
    dlinear(gg, cat, 2 * D, P + l->o_wg, P + l->o_bg, Nd, 2 * D, D);
    dlinear(sr, xdh, D, P + l->o_ws, P + l->o_bs, Nd, D, D);
    for (int64_t j = 0; j < Nd * D; j++) {
        double g = dsigmoid(gg[j]);
        gg[j] = u[j] + g * (sr[j] - u[j]);
    }
    dlinear(a, gg, D, P + l->o_wo, P + l->o_bo, Nd, D, D);
    dlayernorm(a, a, P + l->o_ln_post_w, P + l->o_ln_post_b, Nd, D);
    for (int64_t j = 0; j < Nd * D; j++)
        x1[j] = xd[j] + a[j];
    dlayernorm(y, x1, P + l->o_ln_ffpre_w, P + l->o_ln_ffpre_b, Nd, D);
    dlinear(h1, y, D, P + l->o_ff0w, P + l->o_ff0b, Nd, D, FF);
    drelu(h1, Nd * FF);
    for (int64_t j = 0; j < Nd * FF; j++)
        h1[j] *= ddrop(&c->ctx, c->ctx.site + 1, j);
    dlinear(f, h1, FF, P + l->o_ff3w, P + l->o_ff3b, Nd, FF, D);
    dlayernorm(f, f, P + l->o_ln_ffpost_w, P + l->o_ln_ffpost_b, Nd, D);
    for (int64_t j = 0; j < Nd * D; j++)
        out[j] = x1[j] + f[j];
    free(xsh), free(xdh), free(q), free(k), free(v), free(kr), free(vr), free(u), free(s);
    free(cat), free(gg), free(sr), free(a), free(x1), free(y), free(h1), free(f);
}

/* The largest |score| of a case (double, as acase_ref computes them), to show a case reaches
 * the range it claims. Needs acase_doubles. */
static double acase_max_score(const struct acase *c)
{
    const struct qc_attn *l = &c->l;
    const double *P = c->w64;
    const int64_t D = c->D, H = c->H, Dh = D / H, Nd = c->Nd, Ns = c->Ns, E = c->E;
    double *xsh = dnew(Ns * D), *xdh = dnew(Nd * D), *q = dnew(Nd * D), *k = dnew(Ns * D),
           *kr = dnew(E * D), mx = 0.0;
    dlayernorm(xsh, c->xs64, P + l->o_ln_src_w, P + l->o_ln_src_b, Ns, D);
    dlayernorm(xdh, c->xd64, P + l->o_ln_dst_w, P + l->o_ln_dst_b, Nd, D);
    dlinear(q, xdh, D, P + l->o_wq, P + l->o_bq, Nd, D, D);
    dlinear(k, xsh, D, P + l->o_wk, NULL, Ns, D, D);
    if (c->pos) {
        double *r = dnew(E * D);
        dfourier(&c->fe, c->few64, r, c->feat64, NULL, E);
        dlayernorm(r, r, P + l->o_ln_r_w, P + l->o_ln_r_b, E, D);
        dlinear(kr, r, D, P + l->o_wkr, NULL, E, D, D);
        free(r);
    }
    for (int64_t b = 0; b < c->nb; b++)
        for (int64_t e = c->row_ptr[b]; e < c->row_ptr[b + 1]; e++)
            for (int64_t kk = 0; kk < c->Q; kk++) {
                const int64_t i = c->qrow ? c->qrow[b * c->Q + kk] : b * c->Q + kk;
                for (int64_t h = 0; h < H; h++) {
                    double acc = 0.0;
                    for (int64_t x = 0; x < Dh; x++)
                        acc += q[i * D + h * Dh + x] *
                               (k[c->src[e] * D + h * Dh + x] + kr[e * D + h * Dh + x]);
                    acc = fabs(acc / sqrt((double)Dh));
                    mx = acc > mx ? acc : mx;
                }
            }
    free(xsh), free(xdh), free(q), free(k), free(kr);
    return mx;
}

static double acase_loss(void *user)
{
    const struct acase *c = user;
    double *out = dnew(c->Nd * c->D), L = 0.0;
    acase_ref(c, out);
    for (int64_t j = 0; j < c->Nd * c->D; j++)
        L += out[j] * (double)c->R[j];
    free(out);
    return L;
}

static void acase_doubles(struct acase *c)
{
    c->w64 = to_double(c->w, c->l.params.numel);
    c->xd64 = to_double(c->xd, c->Nd * c->D);
    c->xs64 = c->bip ? to_double(c->xs, c->Ns * c->D) : c->xd64;
    if (c->pos) {
        c->few64 = to_double(c->few, c->fe.params.numel);
        c->feat64 = to_double(c->feat, c->E * c->d);
        if (c->cat)
            c->cat64 = to_double(c->cat_table, c->ncat * c->D);
    }
}

// ---- gradient check driver ------------------------------------------------------------------

struct gtensor {
    const char *name;
    double *p;      /* the double copy the reference reads (perturbed in place) */
    const float *g; /* the fp32 gradient */
    int64_t n;
};

/* Central differences of f over every element of every tensor, compared with the fp32
 * gradient: |g32 − gnum| <= atol·max|gnum over the tensor| + rtol·|gnum|. The step is 1e-6
 * (double: truncation ~1e-12, rounding ~1e-10·|L|), small enough not to cross a ReLU kink for
 * these random inputs. Returns the worst normalised error seen. */
static double gradcheck(const char *what, double (*f)(void *), void *user, struct gtensor *ts,
                        int nt, double atol, double rtol)
{
    const double h = 1e-6;
    double worst = 0.0;
    for (int t = 0; t < nt; t++) {
        double *num = dnew(ts[t].n), scale = 0.0;
        for (int64_t i = 0; i < ts[t].n; i++) {
            double p0 = ts[t].p[i];
            ts[t].p[i] = p0 + h;
            double lp = f(user);
            ts[t].p[i] = p0 - h;
            double lm = f(user);
            ts[t].p[i] = p0;
            num[i] = (lp - lm) / (2.0 * h);
            scale = fabs(num[i]) > scale ? fabs(num[i]) : scale;
        }
        scale = scale > 1e-3 ? scale : 1e-3;
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < ts[t].n; i++) {
            double err = fabs((double)ts[t].g[i] - num[i]);
            double lim = atol * scale + rtol * fabs(num[i]);
            double nerr = err / scale;
            worst = nerr > worst ? nerr : worst;
            if (!(err <= lim)) {
                if (first < 0)
                    first = i;
                bad++;
            }
        }
        T_EXPECT(bad == 0, "%s: %s: %lld of %lld elements off, first [%lld] fp32 %.9g vs %.9g",
                 what, ts[t].name, (long long)bad, (long long)ts[t].n, (long long)first,
                 first >= 0 ? (double)ts[t].g[first] : 0.0, first >= 0 ? num[first] : 0.0);
        free(num);
    }
    return worst;
}

/* max|a − b| / max(max|b|, floor): the agreement measure of the comparison tests. */
static double rel_diff(const float *a, const float *b, int64_t n)
{
    double m = 0.0, s = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m ? d : m;
        s = fabs((double)b[i]) > s ? fabs((double)b[i]) : s;
    }
    return m / s;
}

static bool stash_equal(const struct qc_stash *a, const struct qc_stash *b, char *why, size_t nwhy)
{
    if (a->n != b->n) {
        snprintf(why, nwhy, "%s: %d vs %d entries", a->block, a->n, b->n);
        return false;
    }
    for (int i = 0; i < a->n; i++)
        if (a->e[i].bytes != b->e[i].bytes ||
            (a->e[i].bytes && memcmp(a->e[i].data, b->e[i].data, a->e[i].bytes) != 0)) {
            snprintf(why, nwhy, "%s: entry %s differs", a->block, a->e[i].name);
            return false;
        }
    return true;
}

// ---- FourierEmbedding and MLP gradient checks ------------------------------------------------

struct fecase {
    struct qc_fourier fe;
    int64_t N;
    double *P, *c, *cat;
    float *R;
};

static double fe_loss(void *user)
{
    struct fecase *k = user;
    double *out = dnew(k->N * k->fe.D), L = 0.0;
    dfourier(&k->fe, k->P, out, k->c, k->cat, k->N);
    for (int64_t j = 0; j < k->N * k->fe.D; j++)
        L += out[j] * (double)k->R[j];
    free(out);
    return L;
}

static void test_fourier(int64_t d, bool with_cat)
{
    const int64_t N = 7, D = 8, F = 3;
    struct fecase k;
    qc_fourier_init(&k.fe, d, F, D);
    k.N = N;
    float *w = fnew(k.fe.params.numel), *dw = fnew(k.fe.params.numel);
    param_fill(&k.fe.params, w);
    qc_fourier_bind(&k.fe, w, dw);
    float *c = fnew(N * d), *cat = with_cat ? fnew(N * D) : NULL;
    fill(c, N * d, -2.0f, 2.0f);
    if (cat)
        fill(cat, N * D, -1.0f, 1.0f);
    k.R = fnew(N * D);
    fill(k.R, N * D, -1.0f, 1.0f);
    struct qc_stash st, st2;
    qc_stash_init(&st, "fe");
    qc_stash_init(&st2, "fe");
    qc_fourier_stash_plan(&k.fe, N, &st);
    qc_fourier_stash_plan(&k.fe, N, &st2);
    T_EXPECT(qc_stash_alloc(&st) == QC_OK && qc_stash_alloc(&st2) == QC_OK, "alloc");
    float *out = fnew(N * D), *out2 = fnew(N * D), *dc = fnew(N * d), *dcat = fnew(N * D);
    T_EXPECT(qc_fourier_forward(&k.fe, out, &st, c, cat, N) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_fourier_backward(&k.fe, d > 0 ? dc : NULL, cat ? dcat : NULL, k.R, &st, c, N) ==
                 QC_OK,
             "%s", qc_error_last());
    /* recompute == store */
    T_EXPECT(qc_fourier_forward(&k.fe, out2, &st2, c, cat, N) == QC_OK, "%s", qc_error_last());
    char why[128] = "";
    T_EXPECT(stash_equal(&st, &st2, why, sizeof why), "FE(%lld) recompute: %s", (long long)d, why);
    T_EXPECT(memcmp(out, out2, (size_t)(N * D) * sizeof *out) == 0, "FE recompute: output");
    /* stash size: F(d) = (4(2F+1) + 4·(2D+2))·d + 4·(2D+2) bytes per row */
    T_EXPECT_EQ_U64(qc_stash_bytes(&st),
                    (uint64_t)N * (uint64_t)(4 * (2 * F + 1) * d + 4 * (2 * D + 2) * (d + 1)),
                    "FE(%lld) stash bytes", (long long)d);

    k.P = to_double(w, k.fe.params.numel);
    k.c = to_double(c, N * d);
    k.cat = cat ? to_double(cat, N * D) : NULL;
    struct gtensor ts[3] = {{"params", k.P, dw, k.fe.params.numel},
                            {"c", k.c, dc, N * d},
                            {"cat", k.cat, dcat, cat ? N * D : 0}};
    char what[64];
    snprintf(what, sizeof what, "FE(%lld)%s", (long long)d, with_cat ? "+cat" : "");
    /* fp32 vs double: sums of ≤ 2F+1 or D terms of O(1) through two LayerNorms: errors ~1e-6
     * of the gradient scale; 2e-4 leaves a wide margin while catching any wrong term. */
    double worst = gradcheck(what, fe_loss, &k, ts, 3, 2e-4, 1e-3);
    printf("  %s: worst gradient error %.2e of scale\n", what, worst);
    qc_stash_deinit(&st);
    qc_stash_deinit(&st2);
    free(w), free(dw), free(c), free(cat), free(k.R), free(out), free(out2), free(dc), free(dcat);
    free(k.P), free(k.c), free(k.cat);
}

struct mlpcase {
    struct qc_mlp m;
    int64_t N;
    double *P, *x;
    float *R;
};

static double mlp_loss(void *user)
{
    struct mlpcase *k = user;
    double *out = dnew(k->N * k->m.O), L = 0.0;
    dmlp(&k->m, k->P, out, k->x, k->N);
    for (int64_t j = 0; j < k->N * k->m.O; j++)
        L += out[j] * (double)k->R[j];
    free(out);
    return L;
}

static void test_mlp(void)
{
    const int64_t N = 6, D = 8, O = 5;
    struct mlpcase k;
    qc_mlp_init(&k.m, D, O);
    k.N = N;
    float *w = fnew(k.m.params.numel), *dw = fnew(k.m.params.numel);
    param_fill(&k.m.params, w);
    qc_mlp_bind(&k.m, w, dw);
    float *x = fnew(N * D), *dx = fnew(N * D), *out = fnew(N * O), *out2 = fnew(N * O);
    fill(x, N * D, -1.5f, 1.5f);
    k.R = fnew(N * O);
    fill(k.R, N * O, -1.0f, 1.0f);
    struct qc_stash st, st2;
    qc_stash_init(&st, "mlp");
    qc_stash_init(&st2, "mlp");
    qc_mlp_stash_plan(&k.m, N, &st);
    qc_mlp_stash_plan(&k.m, N, &st2);
    T_EXPECT(qc_stash_alloc(&st) == QC_OK && qc_stash_alloc(&st2) == QC_OK, "alloc");
    T_EXPECT(qc_mlp_forward(&k.m, out, &st, x, N) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_mlp_backward(&k.m, dx, k.R, &st, x, N) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_mlp_forward(&k.m, out2, &st2, x, N) == QC_OK, "%s", qc_error_last());
    char why[128] = "";
    T_EXPECT(stash_equal(&st, &st2, why, sizeof why), "MLP recompute: %s", why);
    T_EXPECT(memcmp(out, out2, (size_t)(N * O) * sizeof *out) == 0, "MLP recompute: output");
    k.P = to_double(w, k.m.params.numel);
    k.x = to_double(x, N * D);
    struct gtensor ts[2] = {{"params", k.P, dw, k.m.params.numel}, {"x", k.x, dx, N * D}};
    double worst = gradcheck("MLP", mlp_loss, &k, ts, 2, 2e-4, 1e-3);
    printf("  MLP: worst gradient error %.2e of scale\n", worst);
    qc_stash_deinit(&st);
    qc_stash_deinit(&st2);
    free(w), free(dw), free(x), free(dx), free(out), free(out2), free(k.R), free(k.P), free(k.x);
}

// ---- attention gradient checks --------------------------------------------------------------

static void attn_gradcheck(const char *what, struct acase *c, enum qc_attn_impl impl)
{
    acase_run(c, impl, 3); /* tiles of ≥ 3 edges: several tiles even on these small graphs */
    acase_doubles(c);
    struct gtensor ts[6];
    int nt = 0;
    ts[nt++] = (struct gtensor){"layer params", c->w64, c->dw, c->l.params.numel};
    ts[nt++] = (struct gtensor){"x_dst", c->xd64, c->dxd, c->Nd * c->D};
    if (c->bip)
        ts[nt++] = (struct gtensor){"x_src", c->xs64, c->dxs, c->Ns * c->D};
    if (c->pos)
        ts[nt++] = (struct gtensor){"FE params", c->few64, c->fedw, c->fe.params.numel};
    if (c->cat)
        ts[nt++] = (struct gtensor){"cat table", c->cat64, c->dcat, c->ncat * c->D};
    /* fp32 vs double through ~10 chained ops (3 LayerNorms, softmax, gate) with D = 8:
     * observed errors are ~1e-6 of the gradient scale; 3e-4 is a wide, still sharp bound. */
    double worst = gradcheck(what, acase_loss, c, ts, nt, 3e-4, 2e-3);
    printf("  %s: worst gradient error %.2e of scale (E %lld, Nd %lld)\n", what, worst,
           (long long)c->E, (long long)c->Nd);
    /* the forward output matches the reference too */
    double *ref = dnew(c->Nd * c->D), m = 0.0, s = 1e-6;
    acase_ref(c, ref);
    for (int64_t j = 0; j < c->Nd * c->D; j++) {
        m = fabs(ref[j] - (double)c->out[j]) > m ? fabs(ref[j] - (double)c->out[j]) : m;
        s = fabs(ref[j]) > s ? fabs(ref[j]) : s;
    }
    T_EXPECT(m / s < 1e-5, "%s: forward differs from the double reference by %.3g", what, m / s);
    free(ref);
}

static void test_attention_grad(enum qc_attn_impl impl)
{
    const char *nm = impl == QC_ATTN_FUSED ? "fused" : "unfused";
    char what[96];
    struct acase c;
    /* bipartite with positional FE(3), dropout off and on (pl2a / pt2pl shape) */
    for (int drop = 0; drop < 2; drop++) {
        acase_make(&c, 8, 2, 3, 3, true, true, false, 1, 9, 5, 5, drop != 0);
        snprintf(what, sizeof what, "%s bipartite pos dropout %s", nm, drop ? "on" : "off");
        attn_gradcheck(what, &c, impl);
        acase_free(&c);
    }
    /* self-attention with positional FE(3) + categorical type (pl2pl shape), dropout on */
    acase_make(&c, 8, 2, 3, 3, false, true, true, 1, 8, 0, 4, true);
    snprintf(what, sizeof what, "%s self pos+cat dropout on", nm);
    attn_gradcheck(what, &c, impl);
    acase_free(&c);
    /* self-attention without positional input (m2m shape) */
    acase_make(&c, 8, 2, 3, 0, false, false, false, 1, 8, 0, 4, true);
    snprintf(what, sizeof what, "%s self no-pos dropout on", nm);
    attn_gradcheck(what, &c, impl);
    acase_free(&c);
    /* bipartite, 3 queries per base destination (decoder modes), FE(4), unnamed x_dst rows */
    acase_make(&c, 8, 2, 3, 4, true, true, false, 3, 6, 4, 4, true);
    snprintf(what, sizeof what, "%s bipartite modes=3 FE(4) dropout on", nm);
    attn_gradcheck(what, &c, impl);
    acase_free(&c);
}

/* An empty edge set (E = 0: no edge features, as a zero-byte allocation gives NULL), as a scene
 * without map polygons or without predicted agents makes them (issue 17): the layer is its
 * residual path alone (QCNET.md §3.3 step 8: u = 0, steps 9-13 run), checked against the double
 * reference with its gradients; the edge-only parameters get exactly zero gradient. */
static void test_attention_empty(enum qc_attn_impl impl)
{
    const char *nm = impl == QC_ATTN_FUSED ? "fused" : "unfused";
    struct acase c;
    for (int shape = 0; shape < 3; shape++) {
        /* 0: bipartite FE(3) (pl2a), 1: self FE(3)+cat (pl2pl), 2: bipartite modes FE(4) (t2m) */
        if (shape == 0)
            acase_make(&c, 8, 2, 3, 3, true, true, false, 1, 9, 5, 5, true);
        else if (shape == 1)
            acase_make(&c, 8, 2, 3, 3, false, true, true, 1, 8, 0, 4, true);
        else
            acase_make(&c, 8, 2, 3, 4, true, true, false, 3, 6, 4, 4, true);
        for (int64_t b = 0; b <= c.nb; b++)
            c.row_ptr[b] = 0;
        c.E = 0;
        c.g.n_edge = 0;
        free(c.feat);
        c.feat = NULL;
        char what[96];
        snprintf(what, sizeof what, "%s empty edge set, shape %d", nm, shape);
        attn_gradcheck(what, &c, impl);
        const struct qc_attn *l = &c.l;
        const int64_t D = c.D;
        const int64_t zero_w[] = {l->o_wk, l->o_wv, l->o_wkr, l->o_wvr}; /* D x D each */
        const int64_t zero_b[] = {l->o_bv, l->o_bvr, l->o_ln_r_w, l->o_ln_r_b};
        int64_t nonzero = 0;
        for (int i = 0; i < 4; i++) {
            for (int64_t j = 0; j < D * D; j++)
                nonzero += c.dw[zero_w[i] + j] != 0.0f;
            for (int64_t j = 0; j < D; j++)
                nonzero += c.dw[zero_b[i] + j] != 0.0f;
        }
        for (int64_t j = 0; j < c.fe.params.numel; j++)
            nonzero += c.fedw[j] != 0.0f;
        T_EXPECT(nonzero == 0, "%s: %lld nonzero gradients of edge-only parameters", what,
                 (long long)nonzero);
        acase_free(&c);
    }
}

// ---- fused vs unfused ----------------------------------------------------------------------

static void compare_runs(const char *what, struct acase *c)
{
    const int64_t D = c->D;
    acase_run(c, QC_ATTN_UNFUSED, 0);
    float *out = fnew(c->Nd * D), *dw = fnew(c->l.params.numel), *dxd = fnew(c->Nd * D);
    float *dxs = fnew(c->Ns * D), *fedw = c->pos ? fnew(c->fe.params.numel) : NULL;
    float *dcat = c->cat ? fnew(c->ncat * D) : NULL;
    memcpy(out, c->out, (size_t)(c->Nd * D) * sizeof *out);
    memcpy(dw, c->dw, (size_t)c->l.params.numel * sizeof *dw);
    memcpy(dxd, c->dxd, (size_t)(c->Nd * D) * sizeof *dxd);
    memcpy(dxs, c->dxs, (size_t)(c->Ns * D) * sizeof *dxs);
    if (fedw)
        memcpy(fedw, c->fedw, (size_t)c->fe.params.numel * sizeof *fedw);
    if (dcat)
        memcpy(dcat, c->dcat, (size_t)(c->ncat * D) * sizeof *dcat);
    acase_run(c, QC_ATTN_FUSED, 37);
    /* Both paths do the same fp32 operations; they differ only in GEMM shapes (tiles) and
     * in the order gradient sums are accumulated (per tile, then over tiles). Outputs: 1e-5
     * of their scale; gradients, summed over hundreds of edges: 1e-4 (the parity bound). */
    double e_out = rel_diff(c->out, out, c->Nd * D), e_dw = rel_diff(c->dw, dw, c->l.params.numel);
    double e_dxd = rel_diff(c->dxd, dxd, c->Nd * D), e_dxs = rel_diff(c->dxs, dxs, c->Ns * D);
    double e_fe = fedw ? rel_diff(c->fedw, fedw, c->fe.params.numel) : 0.0;
    double e_cat = dcat ? rel_diff(c->dcat, dcat, c->ncat * D) : 0.0;
    printf("  %s: out %.1e dW %.1e dx_dst %.1e dx_src %.1e dFE %.1e dcat %.1e\n", what, e_out, e_dw,
           e_dxd, e_dxs, e_fe, e_cat);
    T_EXPECT(e_out < 1e-5, "%s: outputs differ by %.3g", what, e_out);
    T_EXPECT(e_dw < 1e-4, "%s: layer gradients differ by %.3g", what, e_dw);
    T_EXPECT(e_dxd < 1e-4, "%s: dx_dst differ by %.3g", what, e_dxd);
    T_EXPECT(e_dxs < 1e-4, "%s: dx_src differ by %.3g", what, e_dxs);
    T_EXPECT(e_fe < 1e-4, "%s: FE gradients differ by %.3g", what, e_fe);
    T_EXPECT(e_cat < 1e-4, "%s: categorical gradients differ by %.3g", what, e_cat);
    free(out), free(dw), free(dxd), free(dxs), free(fedw), free(dcat);
}

static void test_fused_vs_unfused(void)
{
    struct acase c;
    /* parity config D 32, 2 heads × 16, F 8 */
    acase_make(&c, 32, 2, 8, 3, true, true, false, 1, 120, 40, 30, true);
    compare_runs("pl2a-like (Q 1, FE(3))", &c);
    acase_free(&c);
    acase_make(&c, 32, 2, 8, 3, false, true, true, 1, 90, 0, 25, true);
    compare_runs("pl2pl-like (self, FE(3)+type)", &c);
    acase_free(&c);
    acase_make(&c, 32, 2, 8, 3, true, true, false, 6, 30, 50, 40, true);
    compare_runs("pl2m-like (Q 6, FE(3))", &c);
    acase_free(&c);
    acase_make(&c, 32, 2, 8, 0, false, false, false, 1, 60, 0, 6, true);
    compare_runs("m2m-like (self, no pos)", &c);
    acase_free(&c);
    /* scores in the hundreds (to_q and to_k scaled up): the segment softmax's max subtraction
     * is what keeps both paths finite and equal to the double reference */
    acase_make(&c, 32, 2, 8, 3, true, true, false, 1, 120, 40, 30, false);
    for (int64_t i = 0; i < c.D * c.D; i++) {
        c.w[c.l.o_wq + i] *= 12.0f;
        c.w[c.l.o_wk + i] *= 12.0f;
    }
    compare_runs("pl2a-like, scores in the hundreds", &c);
    acase_doubles(&c);
    double *ref = dnew(c.Nd * c.D), m = 0.0, sc = 1e-6, smax = 0.0;
    acase_ref(&c, ref);
    for (int64_t j = 0; j < c.Nd * c.D; j++) {
        m = fabs(ref[j] - (double)c.out[j]) > m ? fabs(ref[j] - (double)c.out[j]) : m;
        sc = fabs(ref[j]) > sc ? fabs(ref[j]) : sc;
    }
    smax = acase_max_score(&c);
    printf("  largest |score| %.1f, forward vs double %.2e\n", smax, m / sc);
    T_EXPECT(smax > 100.0, "scores only reach %.1f", smax);
    T_EXPECT(m / sc < 1e-5, "fused forward vs the double reference: %.3g", m / sc);
    free(ref);
    acase_free(&c);
}

// ---- the node-level half in row chunks == in one piece ----------------------------------------

/* attn_node_forward_post / _backward_post run over the destination rows in chunks
 * (qc_attn.post_rows): every row's forward is the same operations whatever the chunk (outputs
 * and input gradients equal to 1e-6 of their scale; OpenBLAS may pick other kernels for other
 * row counts), and the parameter gradients are the same sums in another grouping (1e-5). The
 * FFN dropout is on: a chunk that drew its mask from the wrong rows of the site would differ
 * by the mask's scale. */
static void post_chunks_case(const char *what, struct acase *c, enum qc_attn_impl impl)
{
    const int64_t D = c->D;
    c->l.post_rows = 0; /* one chunk: Nd is far below the default */
    acase_run(c, impl, 37);
    float *out = fnew(c->Nd * D), *dw = fnew(c->l.params.numel), *dxd = fnew(c->Nd * D);
    float *dxs = fnew(c->Ns * D);
    memcpy(out, c->out, (size_t)(c->Nd * D) * sizeof *out);
    memcpy(dw, c->dw, (size_t)c->l.params.numel * sizeof *dw);
    memcpy(dxd, c->dxd, (size_t)(c->Nd * D) * sizeof *dxd);
    memcpy(dxs, c->dxs, (size_t)(c->Ns * D) * sizeof *dxs);
    c->l.post_rows = 13; /* 13-row chunks and a shorter last one */
    T_EXPECT(c->Nd % 13 != 0 && c->Nd > 3 * 13, "%s: %lld rows do not end in a partial chunk", what,
             (long long)c->Nd);
    acase_run(c, impl, 37);
    c->l.post_rows = 0;
    const double e_out = rel_diff(c->out, out, c->Nd * D);
    const double e_dw = rel_diff(c->dw, dw, c->l.params.numel);
    const double e_dxd = rel_diff(c->dxd, dxd, c->Nd * D), e_dxs = rel_diff(c->dxs, dxs, c->Ns * D);
    printf("  %s: 13-row chunks vs one: out %.1e dW %.1e dx_dst %.1e dx_src %.1e\n", what, e_out,
           e_dw, e_dxd, e_dxs);
    T_EXPECT(e_out < 1e-6, "%s: outputs differ by %.3g", what, e_out);
    T_EXPECT(e_dw < 1e-5, "%s: layer gradients differ by %.3g", what, e_dw);
    T_EXPECT(e_dxd < 1e-6, "%s: dx_dst differ by %.3g", what, e_dxd);
    T_EXPECT(e_dxs < 1e-6, "%s: dx_src differ by %.3g", what, e_dxs);
    free(out), free(dw), free(dxd), free(dxs);
}

static void test_post_chunks(void)
{
    struct acase c;
    acase_make(&c, 32, 2, 8, 3, true, true, false, 6, 30, 50, 40, true);
    T_EXPECT(c.ctx.training && c.ctx.dropout > 0.0f, "the case runs without dropout");
    post_chunks_case("pl2m-like (Q 6, FE(3)), fused", &c, QC_ATTN_FUSED);
    post_chunks_case("pl2m-like (Q 6, FE(3)), unfused", &c, QC_ATTN_UNFUSED);
    /* scene-keyed FFN dropout (the model's): rows of two scenes, 70 rows in the first */
    int64_t *row_key = calloc((size_t)c.Nd, sizeof *row_key);
    for (int64_t r = 0; r < c.Nd; r++)
        row_key[r] = r < 70 ? r : ((int64_t)1 << 34) + (r - 70);
    c.ctx.row_key = row_key;
    post_chunks_case("pl2m-like, scene-keyed dropout, fused", &c, QC_ATTN_FUSED);
    c.ctx.row_key = NULL;
    free(row_key);
    acase_free(&c);
    acase_make(&c, 32, 2, 8, 0, false, false, false, 1, 60, 0, 6, true);
    post_chunks_case("m2m-like (self, no pos), fused", &c, QC_ATTN_FUSED);
    acase_free(&c);
}

// ---- mode sharing == per-mode edges -------------------------------------------------------

/* The plain graph of a Q-query case, as PyTorch builds it: every base edge, its features and its
 * source row copied per mode (sources tiled: row k·Ns + j), Q = 1. Attention edge (k, e) keeps
 * its id k·E + e, so the dropout masks are the same. */
static void acase_expand(struct acase *x, const struct acase *c)
{
    const int64_t Q = c->Q, nb = c->nb, E = c->E, D = c->D, Ns = c->Ns;
    memset(x, 0, sizeof *x);
    *x = *c;
    x->Q = 1;
    x->nb = nb * Q;
    x->E = E * Q;
    x->Ns = Ns * Q;
    x->row_ptr = calloc((size_t)(nb * Q + 1), sizeof *x->row_ptr);
    x->src = calloc((size_t)(E * Q + 1), sizeof *x->src);
    x->qrow = calloc((size_t)(nb * Q + 1), sizeof *x->qrow);
    for (int64_t k = 0; k < Q; k++) {
        for (int64_t b = 0; b < nb; b++) {
            x->row_ptr[k * nb + b + 1] = k * E + c->row_ptr[b + 1];
            x->qrow[k * nb + b] = c->qrow ? c->qrow[b * Q + k] : b * Q + k;
        }
        for (int64_t e = 0; e < E; e++)
            x->src[k * E + e] = c->src[e] + k * Ns;
    }
    x->g = (struct qc_attn_graph){x->Ns,  x->Nd,   x->nb, 1,    x->E, x->row_ptr,
                                  x->src, x->qrow, NULL,  NULL, NULL};
    x->xs = fnew(x->Ns * D);
    x->feat = fnew(x->E * c->d);
    for (int64_t k = 0; k < Q; k++) {
        memcpy(x->xs + k * Ns * D, c->xs, (size_t)(Ns * D) * sizeof *x->xs);
        memcpy(x->feat + k * E * c->d, c->feat, (size_t)(E * c->d) * sizeof *x->feat);
    }
    /* own copies of everything acase_free releases */
    x->w = fnew(c->l.params.numel);
    memcpy(x->w, c->w, (size_t)c->l.params.numel * sizeof *x->w);
    x->few = fnew(c->fe.params.numel);
    memcpy(x->few, c->few, (size_t)c->fe.params.numel * sizeof *x->few);
    x->xd = fnew(c->Nd * D);
    memcpy(x->xd, c->xd, (size_t)(c->Nd * D) * sizeof *x->xd);
    x->R = fnew(c->Nd * D);
    memcpy(x->R, c->R, (size_t)(c->Nd * D) * sizeof *x->R);
    x->cat_table = NULL;
    x->cat_idx = NULL;
    x->out = x->dw = x->fedw = x->dcat = x->dxs = x->dxd = NULL;
    x->w64 = x->few64 = x->xs64 = x->xd64 = x->feat64 = x->cat64 = NULL;
}

static void test_mode_sharing(enum qc_attn_impl impl)
{
    struct acase c, x;
    acase_make(&c, 32, 2, 8, 3, true, true, false, 6, 24, 30, 20, true);
    acase_expand(&x, &c);
    acase_run(&c, impl, 50);
    acase_run(&x, impl, 50);
    const int64_t D = c.D;
    /* the expanded run's source gradient, summed over the K copies (repeat's backward) */
    float *dxs = fnew(c.Ns * D);
    for (int64_t k = 0; k < c.Q; k++)
        for (int64_t j = 0; j < c.Ns * D; j++)
            dxs[j] += x.dxs[k * c.Ns * D + j];
    double e_out = rel_diff(c.out, x.out, c.Nd * D), e_dw = rel_diff(c.dw, x.dw, c.l.params.numel);
    double e_dxd = rel_diff(c.dxd, x.dxd, c.Nd * D), e_dxs = rel_diff(c.dxs, dxs, c.Ns * D);
    double e_fe = rel_diff(c.fedw, x.fedw, c.fe.params.numel);
    const char *nm = impl == QC_ATTN_FUSED ? "fused" : "unfused";
    printf("  %s shared vs per-mode: out %.1e dW %.1e dx_dst %.1e dx_src %.1e dFE %.1e\n", nm,
           e_out, e_dw, e_dxd, e_dxs, e_fe);
    /* same math; only the order of sums over modes and GEMM shapes differ */
    T_EXPECT(e_out < 1e-5, "%s: outputs differ by %.3g", nm, e_out);
    T_EXPECT(e_dw < 1e-4 && e_dxd < 1e-4 && e_dxs < 1e-4 && e_fe < 1e-4,
             "%s: gradients differ: %.3g %.3g %.3g %.3g", nm, e_dw, e_dxd, e_dxs, e_fe);
    /* and the shared path keeps Q times fewer per-edge bytes (unfused) */
    if (impl == QC_ATTN_UNFUSED) {
        struct arun rc, rx;
        float *o = fnew(c.Nd * D);
        acase_forward(&c, impl, &rc, o);
        acase_forward(&x, impl, &rx, o);
        size_t bc = qc_stash_bytes(&rc.kv.stash) + qc_stash_bytes(&rc.ed.fe_stash) +
                    qc_stash_bytes(&rc.ed.stash);
        size_t bx = qc_stash_bytes(&rx.kv.stash) + qc_stash_bytes(&rx.ed.fe_stash) +
                    qc_stash_bytes(&rx.ed.stash);
        printf("  unfused source/edge stash: shared %zu B, per-mode %zu B\n", bc, bx);
        T_EXPECT(bx > 5 * bc, "mode sharing saves less than 5x: %zu vs %zu", bc, bx);
        arun_free(&rc);
        arun_free(&rx);
        free(o);
    }
    free(dxs);
    acase_free(&x);
    acase_free(&c);
}

// ---- recurrence sharing: one kv context, two applications -----------------------------------

static void test_recurrence_sharing(enum qc_attn_impl impl)
{
    struct acase c;
    acase_make(&c, 32, 2, 8, 3, true, true, false, 1, 40, 20, 12, true);
    const int64_t D = c.D, Nd = c.Nd;
    c.out = fnew(Nd * D), c.dw = fnew(c.l.params.numel), c.fedw = fnew(c.fe.params.numel);
    c.dxd = fnew(Nd * D), c.dxs = fnew(c.Ns * D);
    c.l.tile_edges = 64;
    float *y = fnew(Nd * D), *dy = fnew(Nd * D), *dx2 = fnew(Nd * D);
    float *dw_a = fnew(c.l.params.numel), *fedw_a = fnew(c.fe.params.numel),
          *dxs_a = fnew(c.Ns * D);
    struct qc_attn_ctx ctx2 = c.ctx;
    ctx2.site += 2;
    /* shared: y = app1(x_dst), out = app2(y), one kv for both (the decoder's recurrent steps) */
    for (int shared = 1; shared >= 0; shared--) {
        struct arun r;
        acase_forward(&c, impl, &r, y);
        struct qc_attn_kv kv2;
        struct qc_attn_kv *k2 = &r.kv;
        if (!shared) {
            qc_attn_kv_init(&kv2, &c.l, &r.ed);
            T_EXPECT(qc_stash_alloc(&kv2.stash) == QC_OK, "alloc");
            T_EXPECT(qc_attn_kv_forward(&kv2, c.xs) == QC_OK, "%s", qc_error_last());
            k2 = &kv2;
        }
        struct qc_stash app2;
        qc_stash_init(&app2, "app2");
        qc_attn_stash_plan(k2, &app2);
        T_EXPECT(qc_stash_alloc(&app2) == QC_OK, "alloc");
        T_EXPECT(qc_attn_forward(k2, c.out, &app2, y, &ctx2) == QC_OK, "%s", qc_error_last());
        memset(c.dw, 0, (size_t)c.l.params.numel * sizeof *c.dw);
        memset(c.fedw, 0, (size_t)c.fe.params.numel * sizeof *c.fedw);
        T_EXPECT(qc_attn_backward(k2, dy, c.R, &app2, y, &ctx2) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_attn_backward(&r.kv, dx2, dy, &r.app, c.xd, &c.ctx) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(qc_attn_kv_backward(&r.kv, c.dxs, c.xs, false) == QC_OK, "%s", qc_error_last());
        if (!shared) {
            T_EXPECT(qc_attn_kv_backward(&kv2, c.dxs, c.xs, true) == QC_OK, "%s", qc_error_last());
            qc_attn_kv_deinit(&kv2);
        }
        T_EXPECT(qc_attn_edges_backward(&r.ed) == QC_OK, "%s", qc_error_last());
        qc_stash_deinit(&app2);
        arun_free(&r);
        if (shared) {
            memcpy(dw_a, c.dw, (size_t)c.l.params.numel * sizeof *dw_a);
            memcpy(fedw_a, c.fedw, (size_t)c.fe.params.numel * sizeof *fedw_a);
            memcpy(dxs_a, c.dxs, (size_t)(c.Ns * D) * sizeof *dxs_a);
        }
    }
    double e_dw = rel_diff(dw_a, c.dw, c.l.params.numel);
    double e_fe = rel_diff(fedw_a, c.fedw, c.fe.params.numel);
    double e_dxs = rel_diff(dxs_a, c.dxs, c.Ns * D);
    printf("  %s one kv for 2 applications vs one each: dW %.1e dFE %.1e dx_src %.1e\n",
           impl == QC_ATTN_FUSED ? "fused" : "unfused", e_dw, e_fe, e_dxs);
    T_EXPECT(e_dw < 1e-5 && e_fe < 1e-5 && e_dxs < 1e-5,
             "shared kv gradients differ: %.3g %.3g %.3g", e_dw, e_fe, e_dxs);
    free(y), free(dy), free(dx2), free(dw_a), free(fedw_a), free(dxs_a);
    acase_free(&c);
}

// ---- recompute == store, determinism, stash growth --------------------------------------------

static void test_recompute(enum qc_attn_impl impl)
{
    struct acase c;
    acase_make(&c, 32, 2, 8, 3, false, true, true, 1, 70, 0, 20, true);
    const int64_t D = c.D;
    c.out = fnew(c.Nd * D), c.dw = fnew(c.l.params.numel), c.fedw = fnew(c.fe.params.numel);
    c.dcat = fnew(c.ncat * D), c.dxd = fnew(c.Nd * D), c.dxs = c.dxd;
    c.l.tile_edges = 40;
    struct arun a, b;
    float *out2 = fnew(c.Nd * D);
    acase_forward(&c, impl, &a, c.out);
    /* drop everything, recompute from the same inputs into fresh memory */
    acase_forward(&c, impl, &b, out2);
    char why[128] = "";
    T_EXPECT(memcmp(c.out, out2, (size_t)(c.Nd * D) * sizeof *out2) == 0, "output differs");
    T_EXPECT(stash_equal(&a.ed.fe_stash, &b.ed.fe_stash, why, sizeof why), "%s", why);
    T_EXPECT(stash_equal(&a.ed.stash, &b.ed.stash, why, sizeof why), "%s", why);
    T_EXPECT(stash_equal(&a.kv.stash, &b.kv.stash, why, sizeof why), "%s", why);
    T_EXPECT(stash_equal(&a.app, &b.app, why, sizeof why), "%s", why);
    /* backward from store and from recompute: the same gradient bits */
    acase_backward(&c, &a);
    float *dw1 = fnew(c.l.params.numel), *fe1 = fnew(c.fe.params.numel), *dx1 = fnew(c.Nd * D);
    memcpy(dw1, c.dw, (size_t)c.l.params.numel * sizeof *dw1);
    memcpy(fe1, c.fedw, (size_t)c.fe.params.numel * sizeof *fe1);
    memcpy(dx1, c.dxd, (size_t)(c.Nd * D) * sizeof *dx1);
    acase_backward(&c, &b);
    T_EXPECT(memcmp(dw1, c.dw, (size_t)c.l.params.numel * sizeof *dw1) == 0, "dW not bitwise");
    T_EXPECT(memcmp(fe1, c.fedw, (size_t)c.fe.params.numel * sizeof *fe1) == 0, "dFE not bitwise");
    T_EXPECT(memcmp(dx1, c.dxd, (size_t)(c.Nd * D) * sizeof *dx1) == 0, "dx not bitwise");
    arun_free(&a);
    arun_free(&b);
    free(out2), free(dw1), free(fe1), free(dx1);
    acase_free(&c);
}

static void test_stash_growth(void)
{
    /* same nodes, 4x the edges: the fused stash grows by exactly the shared edge embeddings r
     * (D floats per edge, kept once for every layer on the set: attn_edges_shares_r), the
     * unfused one by at least r and the per-edge tensors it materialises (r̂, k̃, ṽ: 4·D floats
     * per edge, plus the FE's stash) */
    size_t bytes[2][2];
    int64_t edges[2];
    for (int dense = 0; dense < 2; dense++) {
        struct acase c;
        rng_state = 99;
        acase_make(&c, 32, 2, 8, 3, true, true, false, 1, 60, 30, dense ? 40 : 10, true);
        edges[dense] = c.E;
        for (int f = 0; f < 2; f++) {
            struct arun r;
            float *o = fnew(c.Nd * c.D);
            acase_forward(&c, f ? QC_ATTN_FUSED : QC_ATTN_UNFUSED, &r, o);
            bytes[dense][f] = arun_stash_bytes(&r);
            arun_free(&r);
            free(o);
        }
        acase_free(&c);
    }
    printf("  stash bytes: E %lld -> %lld: unfused %zu -> %zu, fused %zu -> %zu\n",
           (long long)edges[0], (long long)edges[1], bytes[0][0], bytes[1][0], bytes[0][1],
           bytes[1][1]);
    T_EXPECT(edges[1] > 2 * edges[0], "the dense graph is not denser");
    T_EXPECT_EQ_U64(bytes[1][1] - bytes[0][1], (uint64_t)(edges[1] - edges[0]) * 32 * 4,
                    "fused stash grew by more than r per edge");
    T_EXPECT(bytes[1][0] - bytes[0][0] >= (size_t)(edges[1] - edges[0]) * 4 * 32 * 4,
             "unfused stash grew by less than r, r̂, k̃, ṽ per edge");
}

static void test_tables(void)
{
    /* parameter counts of QCNET.md §2.1 at D = 128, F = 64 */
    struct qc_attn l;
    qc_attn_init(&l, 128, 8, true, true);
    T_EXPECT_EQ_U64(l.params.numel, 281472, "ATT-b params");
    T_EXPECT(l.scale == 0.25f, "scale %g", (double)l.scale);
    qc_attn_init(&l, 128, 8, false, true);
    T_EXPECT_EQ_U64(l.params.numel, 281216, "ATT-s params");
    qc_attn_init(&l, 128, 8, false, false);
    T_EXPECT_EQ_U64(l.params.numel, 248064, "ATT-m params");
    T_EXPECT(qc_param_table_find(&l.params, "to_k_r.weight") < 0, "ATT-m has no to_k_r");
    T_EXPECT_EQ_U64(l.params.p[0].ne[0], 128, "to_q.weight rows");
    T_EXPECT(strcmp(l.params.p[l.params.n - 1].name, "ff_postnorm.bias") == 0, "last key %s",
             l.params.p[l.params.n - 1].name);
    static const int64_t fe_params[5] = {16768, 50240, 83712, 117184, 150656};
    for (int64_t d = 0; d <= 4; d++) {
        struct qc_fourier fe;
        qc_fourier_init(&fe, d, 64, 128);
        T_EXPECT_EQ_U64(fe.params.numel, fe_params[d], "FE(%lld) params", (long long)d);
        T_EXPECT_EQ_U64(fe.params.n, (d > 0) + 6 * d + 4, "FE(%lld) keys", (long long)d);
    }
    struct qc_mlp m;
    qc_mlp_init(&m, 128, 40);
    T_EXPECT_EQ_U64(m.params.numel, 21928, "MLP(40) params");
    qc_mlp_init(&m, 128, 1);
    T_EXPECT_EQ_U64(m.params.numel, 16897, "MLP(1) params");
    /* the stash table protocol */
    struct qc_stash st;
    qc_stash_init(&st, "t");
    int i0 = qc_stash_add(&st, "a", QC_STASH_F32, 2, 3, 5, 1, 1);
    int i1 = qc_stash_add(&st, "b", QC_STASH_U8, 1, 7, 1, 1, 1);
    T_EXPECT_EQ_U64(qc_stash_bytes(&st), 3 * 5 * 4 + 7, "payload bytes");
    T_EXPECT_EQ_U64(qc_stash_arena_bytes(&st), 128, "arena bytes (64-aligned slots)");
    T_EXPECT(qc_stash_alloc(&st) == QC_OK, "alloc");
    T_EXPECT(((uintptr_t)qc_stash_f32(&st, i0) % 64) == 0 &&
                 ((uintptr_t)qc_stash_u8(&st, i1) % 64) == 0,
             "entries aligned");
    T_EXPECT_EQ_I64(qc_stash_find(&st, "b"), i1, "find");
    qc_stash_release(&st);
    T_EXPECT(st.e[0].data == NULL && st.n == 2, "release keeps the table, drops the memory");
    qc_stash_deinit(&st);
    /* a malformed graph is refused */
    int64_t rp[3] = {0, 2, 1}, src[2] = {0, 5};
    struct qc_attn_graph g = {3, 2, 2, 1, 1, rp, src, NULL, NULL, NULL, NULL};
    T_EXPECT(qc_attn_graph_check(&g) == QC_ERR_INVALID, "decreasing row_ptr accepted");
    rp[2] = 2;
    g.n_edge = 2;
    T_EXPECT(qc_attn_graph_check(&g) == QC_ERR_INVALID, "source out of range accepted");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "edge 1");
    src[1] = 2;
    T_EXPECT(qc_attn_graph_check(&g) == QC_OK, "%s", qc_error_last());
}

int main(void)
{
    rng_state = qc_test_seed();
    QC_TEST ("blocks: parameter and stash tables") {
        test_tables();
    }
    QC_TEST ("blocks: FourierEmbedding gradient check, FE(0)+cat, FE(1), FE(3)+cat") {
        test_fourier(0, true);
        test_fourier(1, false);
        test_fourier(3, true);
    }
    QC_TEST ("blocks: MLPLayer gradient check") {
        test_mlp();
    }
    QC_TEST ("blocks: unfused attention gradient check (dropout off/on, self, modes)") {
        test_attention_grad(QC_ATTN_UNFUSED);
    }
    QC_TEST ("blocks: fused attention gradient check (dropout off/on, self, modes)") {
        test_attention_grad(QC_ATTN_FUSED);
    }
    QC_TEST ("blocks: attention over an empty edge set is its residual path (both)") {
        test_attention_empty(QC_ATTN_UNFUSED);
        test_attention_empty(QC_ATTN_FUSED);
    }
    QC_TEST ("blocks: fused == unfused (outputs and gradients)") {
        test_fused_vs_unfused();
    }
    QC_TEST ("blocks: the node-level half in row chunks == in one piece (dropout on)") {
        test_post_chunks();
    }
    QC_TEST ("blocks: mode sharing == per-mode edges (unfused)") {
        test_mode_sharing(QC_ATTN_UNFUSED);
    }
    QC_TEST ("blocks: mode sharing == per-mode edges (fused)") {
        test_mode_sharing(QC_ATTN_FUSED);
    }
    QC_TEST ("blocks: recurrence sharing: one kv context, two applications") {
        test_recurrence_sharing(QC_ATTN_UNFUSED);
        test_recurrence_sharing(QC_ATTN_FUSED);
    }
    QC_TEST ("blocks: recompute == store, bit for bit (unfused)") {
        test_recompute(QC_ATTN_UNFUSED);
    }
    QC_TEST ("blocks: recompute == store, bit for bit (fused)") {
        test_recompute(QC_ATTN_FUSED);
    }
    QC_TEST ("blocks: fused stash grows by r alone with the edges") {
        test_stash_growth();
    }
    return qc_test_summary();
}
