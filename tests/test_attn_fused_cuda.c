/*
 * test_attn_fused_cuda.c — the fused edge attention on CUDA (kernels/qc_attn_fused_cuda.h)
 * against the CPU fused path (kernels/cpu/attn_fused.c, the oracle) on the same inputs.
 *
 * Every case builds one attention edge set at QCNet's widths (D 128, H 8, Dh 16, F 64) with
 * destinations of degree 0, 1 and "many", runs the CPU layer forward through the blocks API
 * (qc_attn_forward, FUSED) and the CPU edge backward (attn_fused_edge_backward, with a random
 * du: the edge part has no public entry of its own, so this test reaches into
 * blocks_internal.h), and reads the oracle from the stashes: q, k, v (inputs), u, M, S, dq, dk,
 * dv and the parameter gradients (outputs).
 *
 * Two executables from this file:
 *   test_attn_fused_cuda_host (ARGS --host, label cpu; no GPU needed):
 *     - the tile plan (the CPU's tiling rule) and its invariants, bad CSRs rejected;
 *     - scratch is O(largest tile × D), independent of E (nothing of size E × D);
 *     - the tile kernels' own bodies (the *_host seams) inside a host replay of the launchers'
 *       tile loop, per-tile edge work by the CPU ops: u, M, S and dq must equal the CPU fused
 *       path BIT FOR BIT, and dk, dv too (OMP_NUM_THREADS=1 makes the CPU's lane sums the
 *       ascending-edge order the kernels use).
 *   test_attn_fused_cuda (label gpu; exits 77 without a CUDA device):
 *     - the launchers on the device vs the oracle within the tolerances below, two runs give
 *       identical bits, 1 KiB guard bands around every device buffer stay untouched, dq is
 *       OVERWRITE (starts as garbage), the accumulators ACCUM from zero;
 *     - 16-bit runs (docs/PRECISION.md): the oracle's tiles round nothing in a bf16 / fp16 exec
 *       (the host executable checks the CPU op gives the fp32 exec's bits there), so the CUDA
 *       op through a bf16 / fp16 (and fp32) exec must give the launchers' fp32 bits: the same
 *       tolerances against the oracle then hold in every precision.
 *
 * Tolerances (device vs CPU), per tensor: |gpu − cpu| <= atol·max|cpu| + rtol·|cpu| for every
 * element, and Σ(gpu − cpu)² / Σ cpu² <= nmse. Why: the per-edge k̃, ṽ come from cuBLAS GEMMs
 * (K = 129 and 128, fp32, another summation order than OpenBLAS) and the CUDA LayerNorm
 * (double statistics), so k̃, ṽ differ by ~1e-6 relative; expf differs from glibc by a few ulp.
 * The row math itself follows the CPU's order (checked bit for bit by the host executable).
 * Forward (u, M, S): atol 5e-5, rtol 5e-4, nmse 1e-8. Activation gradients (dq, dk, dv):
 * atol 2e-4, rtol 2e-3, nmse 1e-7 (softmax backward cancels: dα − Σαdα). Parameter gradients
 * (sums over every edge with cancellation, dfreqs through sin/cos): atol 1e-3, rtol 1e-2,
 * nmse 1e-6.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h> /* execv */

#include <cuda_runtime.h>

#include "blocks_internal.h" /* attn_app_index, attn_fused_edge_backward, fourier_desc */
#include "qc_alloc.h"
#include "qc_attention.h"
#include "qc_attn_fused_cuda.h"
#include "qc_device.h"
#include "qc_exec.h"
#include "qc_fourier.h"
#include "qc_half.h"
#include "qc_kernels.h"
#include "qc_kernels_cuda.h"
#include "qc_stash.h"
#include "qc_status.h"
#include "cuda_probe.h"
#include "kernels_cuda_testlib.h"
#include "testutil.h"

#define D_MODEL   128
#define H_MODEL   8
#define F_MODEL   64
#define MAX_SHOWN 8 /* mismatches printed per tensor */

static uint64_t g_rng;

static double urand(void)
{
    return (double)(qc_test_rand(&g_rng) >> 11) * (1.0 / 9007199254740992.0);
}

static float *fnew(int64_t n)
{
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p)
        T_FATAL("out of host memory (%" PRId64 " floats)", n);
    return p;
}

static int64_t *inew(int64_t n)
{
    int64_t *p = calloc((size_t)(n > 0 ? n : 1), sizeof(int64_t));
    if (!p)
        T_FATAL("out of host memory (%" PRId64 " indices)", n);
    return p;
}

static void fill(float *x, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)urand();
}

/* Parameters spread enough that every path matters (freqs far from 0: the sinusoids vary). */
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

struct fcase {
    const char *name;
    bool pos, cat, training;
    int64_t d;          /* FE inputs (pos) */
    int64_t Q;          /* queries per base destination */
    int64_t nb, Ns;     /* base destinations, sources */
    int64_t maxdeg;     /* "many" degrees are 2..maxdeg; 0 = every destination empty */
    int64_t tile_edges; /* both paths */
    bool no_qrow;       /* Q > 1 with query_row NULL (query (b,k) is x_dst row b*Q + k) */
};

static const struct fcase cases[] = {
    {"pos d=3, several tiles", true, false, false, 3, 1, 40, 25, 9, 16, false},
    {"pos d=4, dropout, tiles of >= 7 edges", true, false, true, 4, 1, 30, 20, 8, 7, false},
    {"pos d=3 + edge types, Q=3 with query_row, dropout", true, true, true, 3, 3, 20, 30, 7, 12,
     false},
    {"no pos (m2m-like), dropout", false, false, true, 0, 1, 24, 24, 6, 10, false},
    {"pos d=4, one tile holds everything", true, false, true, 4, 1, 25, 15, 10, 1 << 20, false},
    {"FE(0): edge types only, dropout", true, true, true, 0, 1, 16, 12, 5, 9, false},
    {"every destination empty (E = 0)", true, false, false, 3, 2, 9, 5, 0, 4, false},
    {"Q=2 without query_row, dropout", true, false, true, 3, 2, 18, 14, 6, 11, true},
    {"large: 1500 destinations, degrees up to 40, tiles of 4096", true, false, true, 4, 1, 1500,
     900, 40, 4096, false},
};

/* One case's CPU side: the oracle and everything the device side uploads. */
struct fstate {
    const struct fcase *fc;
    int64_t D, H, Dh, F, d, Q, nb, Ns, Nd, E, ncat;
    int64_t *row_ptr, *src, *qrow, *cat_idx; /* graph; qrow NULL when Q = 1 */
    int64_t *sptr, *sperm;                   /* by-source CSR */
    struct qc_attn_graph g;
    struct qc_attn l;
    struct qc_fourier fe;
    float *w, *dw, *few, *fedw, *feat, *cat_table, *dcat, *xs, *xd, *out, *du, *dq;
    struct qc_attn_edges ed;
    struct qc_attn_kv kv;
    struct qc_stash app;
    struct attn_app_idx ix;
    struct qc_attn_ctx ctx;
    struct qc_dropout drop;       /* the attention dropout the CPU path uses (attn_drop) */
    const float *q, *k, *v;       /* inputs of the edge part (CPU stash views) */
    const float *r;               /* the edge set's shared r = FE(feat [+ cat]) (pos only) */
    const float *u, *smax, *ssum; /* oracle forward (stash views) */
};

static void fstate_make(struct fstate *s, const struct fcase *fc)
{
    memset(s, 0, sizeof *s);
    s->fc = fc;
    s->D = D_MODEL, s->H = H_MODEL, s->Dh = D_MODEL / H_MODEL, s->F = F_MODEL;
    s->d = fc->pos ? fc->d : 0;
    s->Q = fc->Q, s->nb = fc->nb, s->Ns = fc->Ns;
    s->Nd = s->nb * s->Q + (s->Q > 1 ? 3 : 0);
    s->row_ptr = inew(s->nb + 1);
    for (int64_t b = 0; b < s->nb; b++) {
        int64_t deg = fc->maxdeg == 0 ? 0
                      : b % 4 == 0    ? 0
                      : b % 4 == 1    ? 1
                                      : 2 + (int64_t)(urand() * (double)(fc->maxdeg - 1));
        s->row_ptr[b + 1] = s->row_ptr[b] + deg;
    }
    s->E = s->row_ptr[s->nb];
    s->src = inew(s->E);
    for (int64_t e = 0; e < s->E; e++)
        s->src[e] = (int64_t)(urand() * (double)s->Ns);
    if (s->Q > 1 &&
        !fc->no_qrow) { /* a random permutation of x_dst rows; queries take the first nb*Q */
        s->qrow = inew(s->Nd);
        for (int64_t i = 0; i < s->Nd; i++)
            s->qrow[i] = i;
        for (int64_t i = s->Nd - 1; i > 0; i--) {
            int64_t j = (int64_t)(urand() * (double)(i + 1)), t = s->qrow[i];
            s->qrow[i] = s->qrow[j];
            s->qrow[j] = t;
        }
    }
    s->sptr = inew(s->Ns + 1);
    s->sperm = inew(s->E);
    qc_csr_build_cpu(s->sptr, s->sperm, s->src, s->E, s->Ns);
    s->g = (struct qc_attn_graph){s->Ns,  s->Nd,   s->nb, s->Q, s->E, s->row_ptr,
                                  s->src, s->qrow, NULL,  NULL, NULL};

    qc_attn_init(&s->l, s->D, s->H, true, fc->pos);
    s->l.tile_edges = fc->tile_edges;
    s->w = fnew(s->l.params.numel);
    s->dw = fnew(s->l.params.numel);
    param_fill(&s->l.params, s->w);
    qc_attn_bind(&s->l, s->w, s->dw);
    if (fc->pos) {
        qc_fourier_init(&s->fe, s->d, s->F, s->D);
        s->few = fnew(s->fe.params.numel);
        s->fedw = fnew(s->fe.params.numel);
        param_fill(&s->fe.params, s->few);
        qc_fourier_bind(&s->fe, s->few, s->fedw);
        s->feat = fnew(s->E * s->d);
        fill(s->feat, s->E * s->d, -2.0f, 2.0f);
        if (fc->cat) {
            s->ncat = 3;
            s->cat_table = fnew(s->ncat * s->D);
            s->dcat = fnew(s->ncat * s->D);
            fill(s->cat_table, s->ncat * s->D, -0.5f, 0.5f);
            s->cat_idx = inew(s->E);
            for (int64_t e = 0; e < s->E; e++)
                s->cat_idx[e] = (int64_t)(urand() * (double)s->ncat);
        }
    }
    s->xs = fnew(s->Ns * s->D);
    s->xd = fnew(s->Nd * s->D);
    s->out = fnew(s->Nd * s->D);
    s->du = fnew(s->Nd * s->D);
    s->dq = fnew(s->Nd * s->D);
    fill(s->xs, s->Ns * s->D, -1.5f, 1.5f);
    fill(s->xd, s->Nd * s->D, -1.5f, 1.5f);
    fill(s->du, s->Nd * s->D, -1.0f, 1.0f);
    s->ctx = (struct qc_attn_ctx){fc->training, 0.25f, 0x1234abcdull, 7, 40, NULL, NULL};
    s->drop = attn_drop_site(&s->ctx, 0, NULL, 0, 0, 0);
}

/* The CPU oracle: layer forward (FUSED) and the edge backward from du. */
static void fstate_run_cpu(struct fstate *s)
{
    const struct fcase *fc = s->fc;
    if (qc_attn_edges_init(&s->ed, QC_ATTN_FUSED, &s->g, fc->pos ? &s->fe : NULL, s->feat,
                           s->cat_table, s->cat_idx, s->ncat, s->dcat) != QC_OK)
        T_FATAL("edges_init: %s", qc_error_last());
    if (qc_stash_alloc(&s->ed.fe_stash) != QC_OK || qc_stash_alloc(&s->ed.stash) != QC_OK)
        T_FATAL("stash alloc");
    T_EXPECT(qc_attn_edges_forward(&s->ed) == QC_OK, "%s", qc_error_last());
    if (fc->pos && s->E > 0) {
        const int ir = qc_stash_find(&s->ed.stash, "r");
        if (ir < 0)
            T_FATAL("the CPU fused edge context keeps no shared r");
        s->r = qc_stash_f32(&s->ed.stash, ir);
    }
    qc_attn_kv_init(&s->kv, &s->l, &s->ed);
    if (qc_stash_alloc(&s->kv.stash) != QC_OK)
        T_FATAL("stash alloc");
    T_EXPECT(qc_attn_kv_forward(&s->kv, s->xs) == QC_OK, "%s", qc_error_last());
    qc_stash_init(&s->app, "attn_fused.app");
    qc_attn_stash_plan(&s->kv, &s->app);
    if (qc_stash_alloc(&s->app) != QC_OK)
        T_FATAL("stash alloc");
    T_EXPECT(qc_attn_forward(&s->kv, s->out, &s->app, s->xd, &s->ctx) == QC_OK, "%s",
             qc_error_last());
    attn_app_index(&s->app, &s->ix);
    int ik = qc_stash_find(&s->kv.stash, "k"), iv = qc_stash_find(&s->kv.stash, "v");
    if (ik < 0 || iv < 0 || s->ix.q < 0 || s->ix.smax < 0 || s->ix.ssum < 0 || s->ix.u < 0)
        T_FATAL("the CPU fused stash lacks k, v, q, softmax.max, softmax.sum or u");
    s->k = qc_stash_f32(&s->kv.stash, ik);
    s->v = qc_stash_f32(&s->kv.stash, iv);
    s->q = qc_stash_f32(&s->app, s->ix.q);
    s->u = qc_stash_f32(&s->app, s->ix.u);
    s->smax = qc_stash_f32(&s->app, s->ix.smax);
    s->ssum = qc_stash_f32(&s->app, s->ix.ssum);
    /* edge backward from du: dq OVERWRITE, kv->dk/dv and the gradients ACCUM from zero */
    memset(s->dw, 0, (size_t)s->l.params.numel * sizeof(float));
    if (s->fedw)
        memset(s->fedw, 0, (size_t)s->fe.params.numel * sizeof(float));
    if (s->dcat)
        memset(s->dcat, 0, (size_t)(s->ncat * s->D) * sizeof(float));
    struct qc_memspec ms; /* the edge part of the application's backward alone */
    qc_memspec_init(&ms);
    attn_edge_backward_spec(&s->kv, &ms);
    T_EXPECT(attn_fused_edge_backward(&s->kv, s->dq, s->du, &s->app, &s->ix, &s->ctx, &ms) == QC_OK,
             "%s", qc_error_last());
    if (!s->kv.dk || !s->kv.dv)
        T_FATAL("the CPU fused backward left kv->dk / kv->dv unset");
    /* The CPU tiles accumulate dL/dr into the edge context (shared r); the FourierEmbedding and
     * categorical-table gradients come from the edge context's backward, once per edge set. The
     * CUDA tiles compute both themselves, so the oracle of fe.dw and dcat_table needs this. */
    T_EXPECT(qc_attn_edges_backward(&s->ed) == QC_OK, "%s", qc_error_last());
    /* the oracle has teeth: with edges, the FE and table gradients are not all zero (the first
     * GPU run compared CUDA's against an oracle that had skipped the line above) */
    if (s->E > 0) {
        double sf = 0.0, sc = 0.0;
        for (int64_t i = 0; s->fedw && i < s->fe.params.numel; i++)
            sf += fabs((double)s->fedw[i]);
        for (int64_t i = 0; s->dcat && i < s->ncat * s->D; i++)
            sc += fabs((double)s->dcat[i]);
        T_EXPECT(!s->fedw || sf > 0.0, "CPU oracle: fe.dw is all zero");
        T_EXPECT(!s->dcat || sc > 0.0, "CPU oracle: dcat_table is all zero");
    }
}

/* The case's state with the CPU oracle run, and the tile plan of its edge set (the fused
 * path's tiling rule at the case's tile_edges). */
static void fstate_ready(struct fstate *s, struct qc_attn_fused_tiles *t, const struct fcase *fc)
{
    fstate_make(s, fc);
    fstate_run_cpu(s);
    if (qc_attn_fused_tiles_init(t, s->row_ptr, s->nb, fc->tile_edges) != QC_OK)
        T_FATAL("tiles: %s", qc_error_last());
}

static void fstate_free(struct fstate *s)
{
    qc_stash_deinit(&s->app);
    qc_attn_kv_deinit(&s->kv);
    qc_attn_edges_deinit(&s->ed);
    free(s->row_ptr);
    free(s->src);
    free(s->qrow);
    free(s->cat_idx);
    free(s->sptr);
    free(s->sperm);
    free(s->w);
    free(s->dw);
    free(s->few);
    free(s->fedw);
    free(s->feat);
    free(s->cat_table);
    free(s->dcat);
    free(s->xs);
    free(s->xd);
    free(s->out);
    free(s->du);
    free(s->dq);
}

// ---- comparisons ------------------------------------------------------------------------------

struct tol {
    double atol, rtol, nmse;
};

static const struct tol TOL_FWD = {5e-5, 5e-4, 1e-8};
static const struct tol TOL_ACT = {2e-4, 2e-3, 1e-7};
static const struct tol TOL_PARAM = {1e-3, 1e-2, 1e-6};

/* got vs ref within tol (atol relative to max|ref|); NaN/Inf must agree. */
static void expect_close(const char *what, const float *got, const float *ref, int64_t n,
                         struct tol t)
{
    double maxref = 0.0, se = 0.0, sr = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs((double)ref[i]) > maxref)
            maxref = fabs((double)ref[i]);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = (double)got[i], r = (double)ref[i];
        bool ok;
        if (!isfinite(r) || !isfinite(g)) {
            ok = (isnan(r) && isnan(g)) || g == r;
        } else {
            ok = fabs(g - r) <= t.atol * maxref + t.rtol * fabs(r);
            se += (g - r) * (g - r);
            sr += r * r;
        }
        if (!ok && bad++ < MAX_SHOWN)
            printf("    %s[%" PRId64 "]: got %.9g, want %.9g (max|ref| %.3g)\n", what, i, g, r,
                   maxref);
    }
    T_EXPECT(bad == 0, "%s: %" PRId64 " of %" PRId64 " elements outside tolerance", what, bad, n);
    double nmse = sr > 0.0 ? se / sr : se;
    T_EXPECT(nmse <= t.nmse, "%s: nmse %.3g > %.3g", what, nmse, t.nmse);
}

/* got and ref bit for bit. */
static void expect_bits(const char *what, const float *got, const float *ref, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t g, r;
        memcpy(&g, &got[i], sizeof g);
        memcpy(&r, &ref[i], sizeof r);
        if (g != r && bad++ < MAX_SHOWN)
            printf("    %s[%" PRId64 "]: %.9g (0x%08" PRIx32 ") vs %.9g (0x%08" PRIx32 ")\n", what,
                   i, (double)got[i], g, (double)ref[i], r);
    }
    T_EXPECT(bad == 0, "%s: %" PRId64 " of %" PRId64 " elements differ in bits", what, bad, n);
}

// ---- host replay of the launchers' tile loop ---------------------------------------------------

/* k̃, ṽ of base edges [e0, e0+te) by the CPU ops: the CPU fused path's ftile_edges, from the
 * tile's rows of the edge set's r = FE(feat [+ cat]), which the CPU computes once per set (the
 * CUDA launchers recompute FE per tile with cuBLAS: the FE itself is not a tile kernel body, and
 * an FE over the tile's few rows may round differently from the set's, as OpenBLAS picks its
 * small-matrix path by shape). */
static void host_tile_edges(const struct fstate *s, float *kt, float *vt, int64_t e0, int64_t te)
{
    const int64_t D = s->D;
    const float *w = s->w;
    const struct qc_attn *l = &s->l;
    qc_gather_rows_forward_cpu(kt, s->k, s->src + e0, te, D, false);
    qc_gather_rows_forward_cpu(vt, s->v, s->src + e0, te, D, false);
    if (!s->fc->pos || te == 0)
        return;
    float *rhat = fnew(te * D), *mean = fnew(te), *rstd = fnew(te);
    const float *r = s->r + e0 * D;
    qc_layernorm_forward_cpu(rhat, mean, rstd, r, w + l->o_ln_r_w, w + l->o_ln_r_b, te, D);
    qc_linear_forward_cpu(kt, rhat, D, w + l->o_wkr, NULL, te, D, D, true);
    qc_linear_forward_cpu(vt, rhat, D, w + l->o_wvr, w + l->o_bvr, te, D, D, true);
    free(rhat);
    free(mean);
    free(rstd);
}

static void test_host_replay(const struct fcase *fc)
{
    struct fstate s;
    struct qc_attn_fused_tiles t;
    fstate_ready(&s, &t, fc);
    const int64_t D = s.D, H = s.H, Nd = s.Nd, cap = t.cap;
    float *u = fnew(Nd * D), *M = fnew(Nd * H), *S = fnew(Nd * H), *dq = fnew(Nd * D);
    float *dk = fnew(s.Ns * D), *dv = fnew(s.Ns * D);
    float *kt = fnew(cap * D), *vt = fnew(cap * D), *dkt = fnew(cap * D), *dvt = fnew(cap * D);
    for (int64_t i = 0; i < Nd * H; i++) {
        M[i] = 0.0f;
        S[i] = QC_SOFTMAX_EPS;
    }
    /* the launchers' initialisation: rows no query names keep u = 0, M = 0, S = eps, dq = 0 */
    struct qc_csr by_src = {s.sptr, s.sperm, s.src, s.Ns, s.E};
    for (int64_t ti = 0; ti < t.ntile; ti++) {
        const int64_t b0 = t.b0[ti], nb = t.b0[ti + 1] - b0, e0 = t.e0[ti];
        const int64_t te = t.e0[ti + 1] - e0;
        if (te == 0)
            continue;
        host_tile_edges(&s, kt, vt, e0, te);
        qc_attn_fused_tile_forward_host(u, M, S, s.q, kt, vt, s.row_ptr, s.qrow, b0, nb, e0, s.Q,
                                        s.E, H, s.Dh, s.l.scale, &s.drop);
        memset(dkt, 0, (size_t)(te * D) * sizeof(float));
        memset(dvt, 0, (size_t)(te * D) * sizeof(float));
        qc_attn_fused_tile_backward_host(dq, dkt, dvt, s.du, s.smax, s.ssum, s.q, kt, vt, s.row_ptr,
                                         s.qrow, b0, nb, e0, s.Q, s.E, H, s.Dh, s.l.scale, &s.drop);
        qc_attn_fused_tile_scatter_host(dk, dv, dkt, dvt, by_src, e0, e0 + te, D);
    }
    expect_bits("u", u, s.u, Nd * D);
    expect_bits("softmax.max", M, s.smax, Nd * H);
    expect_bits("softmax.sum", S, s.ssum, Nd * H);
    expect_bits("dq", dq, s.dq, Nd * D);
    expect_bits("dk", dk, s.kv.dk, s.Ns * D);
    expect_bits("dv", dv, s.kv.dv, s.Ns * D);
    /* the check has teeth: outputs are not trivially zero where edges exist */
    if (s.E > 0) {
        double su = 0.0, sk = 0.0;
        for (int64_t i = 0; i < Nd * D; i++)
            su += fabs((double)u[i]);
        for (int64_t i = 0; i < s.Ns * D; i++)
            sk += fabs((double)dk[i]);
        T_EXPECT(su > 0.0 && sk > 0.0, "u and dk are all zero (|u| %g, |dk| %g)", su, sk);
    }
    free(u), free(M), free(S), free(dq), free(dk), free(dv);
    free(kt), free(vt), free(dkt), free(dvt);
    qc_attn_fused_tiles_deinit(&t);
    fstate_free(&s);
}

// ---- the op in a 16-bit exec (host) ---------------------------------------------------------

/* The fused op's generic descriptors over the case's HOST buffers (the CPU fused path, r shared):
 * dw, dr, fe_dw and dcat are the caller's zeroed accumulators. */
static void host_descs(const struct fstate *s, const struct qc_attn_fused_tiles *t,
                       struct qc_attn_fused_layer *l, struct qc_attn_fused_edges *ed,
                       struct qc_fe *fe, float *dw, float *dr, float *fe_dw, float *dcat)
{
    const struct qc_attn *a = &s->l;
    memset(l, 0, sizeof *l);
    memset(ed, 0, sizeof *ed);
    memset(fe, 0, sizeof *fe);
    l->D = s->D, l->H = s->H, l->Dh = s->Dh, l->scale = a->scale, l->has_pos = s->fc->pos;
    if (s->fc->pos) {
        l->w_kr = s->w + a->o_wkr, l->w_vr = s->w + a->o_wvr, l->b_vr = s->w + a->o_bvr;
        l->ln_r_w = s->w + a->o_ln_r_w, l->ln_r_b = s->w + a->o_ln_r_b;
        l->dw_kr = dw + a->o_wkr, l->dw_vr = dw + a->o_wvr, l->db_vr = dw + a->o_bvr;
        l->dln_r_w = dw + a->o_ln_r_w, l->dln_r_b = dw + a->o_ln_r_b;
        fe->D = s->fe.D, fe->F = s->fe.F, fe->d = s->fe.d, fe->o_freqs = s->fe.o_freqs;
        for (int64_t i = 0; i < s->fe.d; i++) {
            fe->o_w1[i] = s->fe.o_w1[i], fe->o_b1[i] = s->fe.o_b1[i];
            fe->o_lnw[i] = s->fe.o_lnw[i], fe->o_lnb[i] = s->fe.o_lnb[i];
            fe->o_w2[i] = s->fe.o_w2[i], fe->o_b2[i] = s->fe.o_b2[i];
        }
        fe->o_out_lnw = s->fe.o_out_lnw, fe->o_out_lnb = s->fe.o_out_lnb;
        fe->o_out_w = s->fe.o_out_w, fe->o_out_b = s->fe.o_out_b;
        fe->w = s->few, fe->dw = fe_dw;
    }
    ed->n_src = s->Ns, ed->n_dst = s->Nd, ed->n_bdst = s->nb, ed->n_query = s->Q;
    ed->n_edge = s->E, ed->row_ptr = s->row_ptr, ed->src = s->src, ed->query_row = s->qrow;
    ed->r = s->fc->pos && s->E > 0 ? s->r : NULL;
    ed->dr = ed->r ? dr : NULL;
    ed->fe = s->fc->pos ? fe : NULL;
    ed->feat = s->feat, ed->cat_table = s->cat_table, ed->cat_idx = s->cat_idx;
    ed->ncat = s->ncat, ed->dcat_table = s->cat_table ? dcat : NULL;
    ed->tiles = t;
}

/* In a bf16 / fp16 run the oracle's tiles round nothing (kernels/cpu/attn_fused.c runs the
 * tile's ops with ex = NULL: r, r̂, k̃, ṽ, the scores and α are fp32; only the weights, read
 * from the model's rounded copy, hold 16-bit values): the CPU op in a 16-bit exec gives the
 * fp32 exec's bits. So the CUDA tiles must not round either (docs/PRECISION.md); test_device
 * checks that the CUDA op in a 16-bit exec gives the launchers' fp32 bits. */
static void test_host_precision(const struct fcase *fc)
{
    struct fstate s;
    struct qc_attn_fused_tiles t;
    fstate_ready(&s, &t, fc);
    const int64_t D = s.D, H = s.H, Nd = s.Nd, Ns = s.Ns, E = s.E;
    const int64_t nw = s.l.params.numel, nfe = fc->pos ? s.fe.params.numel : 0;
    enum { NOUT = 9 };
    float *out[QC_PREC_COUNT][NOUT];
    int64_t n[NOUT] = {Nd * D, Nd * H, Nd * H, Nd * D, Ns * D, Ns * D, nw, E * D, nfe};
    for (int p = 0; p < QC_PREC_COUNT; p++) {
        for (int o = 0; o < NOUT; o++)
            out[p][o] = fnew(n[o]);
        float *fe_dw = fnew(nfe), *dcat = fnew(s.ncat * D);
        struct qc_attn_fused_layer l;
        struct qc_attn_fused_edges ed;
        struct qc_fe fe;
        host_descs(&s, &t, &l, &ed, &fe, out[p][6], out[p][7], fe_dw, dcat);
        const struct qc_exec ex = {
            .backend = QC_EXEC_CPU, .stream = NULL, .emu = NULL, .precision = p};
        float *scr = fnew(qc_attn_fused_scratch_numel(&ex, &l, &ed, true));
        qc_op_attn_fused_forward(&ex, out[p][0], out[p][1], out[p][2], s.q, s.k, s.v, &l, &ed,
                                 &s.drop, scr);
        qc_op_attn_fused_backward(&ex, out[p][3], out[p][4], out[p][5], s.du, out[p][1], out[p][2],
                                  s.q, s.k, s.v, &l, &ed, &s.drop, scr);
        memcpy(out[p][8], fe_dw, (size_t)nfe * sizeof(float)); /* untouched: r is shared */
        free(scr);
        free(fe_dw);
        free(dcat);
    }
    static const char *const names[NOUT] = {"u",  "softmax.max", "softmax.sum", "dq",   "dk",
                                            "dv", "layer.dw",    "dr",          "fe.dw"};
    for (int p = QC_PREC_BF16; p < QC_PREC_COUNT; p++)
        for (int o = 0; o < NOUT; o++) {
            char what[96];
            snprintf(what, sizeof what, "%s (%s exec vs fp32 exec)", names[o],
                     qc_precision_str((enum qc_precision)p));
            expect_bits(what, out[p][o], out[QC_PREC_FP32][o], n[o]);
        }
    /* and the fp32 exec is the oracle the rest of this test compares against */
    expect_bits("u (fp32 exec vs the blocks' forward)", out[QC_PREC_FP32][0], s.u, Nd * D);
    expect_bits("dq (fp32 exec vs the blocks' backward)", out[QC_PREC_FP32][3], s.dq, Nd * D);
    for (int p = 0; p < QC_PREC_COUNT; p++)
        for (int o = 0; o < NOUT; o++)
            free(out[p][o]);
    qc_attn_fused_tiles_deinit(&t);
    fstate_free(&s);
}

// ---- tile plan and scratch (host) --------------------------------------------------------------

static void test_tiles(void)
{
    const int64_t nb = 200;
    int64_t *rp = inew(nb + 1);
    int64_t maxdeg = 0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t deg = b % 5 == 0 ? 0 : b % 5 == 1 ? 1 : (int64_t)(urand() * 40.0);
        maxdeg = deg > maxdeg ? deg : maxdeg;
        rp[b + 1] = rp[b] + deg;
    }
    const int64_t want_list[] = {0, 1, 5, 64, 1000, (int64_t)1 << 40};
    for (size_t w = 0; w < sizeof want_list / sizeof want_list[0]; w++) {
        const int64_t want = want_list[w] > 0 ? want_list[w] : 1;
        struct qc_attn_fused_tiles t;
        T_EXPECT(qc_attn_fused_tiles_init(&t, rp, nb, want_list[w]) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(t.ntile >= 1 && t.b0[0] == 0 && t.b0[t.ntile] == nb && t.e0[t.ntile] == rp[nb],
                 "tile_edges %" PRId64 ": ends %" PRId64 " %" PRId64, want, t.b0[t.ntile],
                 t.e0[t.ntile]);
        int64_t cap = 0;
        for (int64_t i = 0; i < t.ntile; i++) {
            const int64_t b0 = t.b0[i], b1 = t.b0[i + 1], te = rp[b1] - rp[b0];
            T_EXPECT(b1 > b0 && t.e0[i] == rp[b0],
                     "tile %" PRId64 ": rows [%" PRId64 ", %" PRId64 ") e0 %" PRId64, i, b0, b1,
                     t.e0[i]);
            if (i + 1 < t.ntile) /* at least `want`, and minimal: one row fewer is below it */
                T_EXPECT(te >= want && rp[b1 - 1] - rp[b0] < want,
                         "tile %" PRId64 " holds %" PRId64 " edges for tile_edges %" PRId64, i, te,
                         want);
            cap = te > cap ? te : cap;
        }
        T_EXPECT_EQ_I64(t.cap, cap, "cap, tile_edges %" PRId64, want);
        T_EXPECT_EQ_I64(t.max_deg, maxdeg, "max_deg, tile_edges %" PRId64, want);
        qc_attn_fused_tiles_deinit(&t);
        qc_attn_fused_tiles_deinit(&t); /* deinit of a zeroed plan is a no-op */
        T_EXPECT(t.b0 == NULL && t.ntile == 0, "deinit leaves the plan zeroed");
    }
    struct qc_attn_fused_tiles t;
    T_EXPECT(qc_attn_fused_tiles_init(&t, rp, 0, 16) == QC_OK && t.ntile == 0 && t.cap == 0,
             "no base destination: no tile");
    qc_attn_fused_tiles_deinit(&t);
    rp[7] = rp[6] - 1;
    T_EXPECT(qc_attn_fused_tiles_init(&t, rp, nb, 16) == QC_ERR_INVALID,
             "a decreasing row_ptr is rejected");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "decreases at 6");
    rp[0] = 3;
    T_EXPECT(qc_attn_fused_tiles_init(&t, rp, nb, 16) == QC_ERR_INVALID,
             "row_ptr[0] != 0 is rejected");
    free(rp);
}

/* Scratch depends on the largest tile, not on E: the fused path writes nothing of E × D. */
static void test_scratch(void)
{
    static float dummy[4];
    struct qc_fe fe;
    memset(&fe, 0, sizeof fe);
    fe.D = D_MODEL, fe.F = F_MODEL, fe.d = 4, fe.w = dummy;
    struct qc_attn_fused_layer l;
    memset(&l, 0, sizeof l);
    l.D = D_MODEL, l.H = H_MODEL, l.Dh = D_MODEL / H_MODEL, l.scale = 0.25f, l.has_pos = true;
    l.w_kr = l.w_vr = l.b_vr = l.ln_r_w = l.ln_r_b = dummy;
    const int64_t deg = 32, tile = 512;
    int64_t numel[2][2]; /* [small E, large E][forward, backward] */
    const int64_t nbs[2] = {64, 64 * 1000};
    for (int i = 0; i < 2; i++) {
        int64_t *rp = inew(nbs[i] + 1);
        for (int64_t b = 0; b < nbs[i]; b++)
            rp[b + 1] = rp[b] + deg;
        struct qc_attn_fused_tiles t;
        if (qc_attn_fused_tiles_init(&t, rp, nbs[i], tile) != QC_OK)
            T_FATAL("tiles: %s", qc_error_last());
        T_EXPECT_EQ_I64(t.cap, tile, "cap with rows of %" PRId64, deg);
        struct qc_attn_fused_edges ed;
        memset(&ed, 0, sizeof ed);
        ed.n_src = ed.n_dst = ed.n_bdst = nbs[i];
        ed.n_query = 1;
        ed.n_edge = rp[nbs[i]];
        ed.row_ptr = rp, ed.src = rp, ed.feat = dummy; /* never dereferenced on the host */
        ed.fe = &fe;
        ed.tiles = &t;
        numel[i][0] = qc_attn_fused_cuda_scratch_numel(&l, &ed, false);
        numel[i][1] = qc_attn_fused_cuda_scratch_numel(&l, &ed, true);
        if (i == 1) {
            const int64_t ED = ed.n_edge * D_MODEL;
            T_EXPECT(numel[i][1] * 20 < ED, "backward scratch %" PRId64 " floats vs E*D %" PRId64,
                     numel[i][1], ED);
            l.has_pos = false;
            ed.fe = NULL;
            T_EXPECT(qc_attn_fused_cuda_scratch_numel(&l, &ed, true) < numel[i][1],
                     "no positional input needs less scratch");
            l.has_pos = true;
        }
        qc_attn_fused_tiles_deinit(&t);
        free(rp);
    }
    T_EXPECT_EQ_I64(numel[0][0], numel[1][0], "forward scratch independent of E");
    T_EXPECT_EQ_I64(numel[0][1], numel[1][1], "backward scratch independent of E");
    T_EXPECT(numel[0][1] > numel[0][0] && numel[0][0] >= 2 * tile * D_MODEL,
             "forward %" PRId64 ", backward %" PRId64, numel[0][0], numel[0][1]);
}

// ---- device ---------------------------------------------------------------------------------

/* A device buffer with guard bands (kernels_cuda_testlib.h): data d at base + KT_GUARD. */
struct dbuf {
    const char *name;
    size_t bytes;
    char *base;
    void *d;
};

static struct dbuf dnew(struct kt_gpu *x, const char *name, size_t bytes, const void *host)
{
    struct dbuf b = {name, bytes, NULL, NULL};
    b.base = kt_dalloc_guarded(x, name, bytes);
    b.d = b.base + KT_GUARD;
    if (host)
        kt_dcopy(x, b.d, host, bytes, cudaMemcpyHostToDevice);
    else
        kt_cuda_ok(cudaMemsetAsync(b.d, 0, bytes, x->s), "memset");
    return b;
}

static void dfree(struct kt_gpu *x, struct dbuf *b)
{
    kt_dguard_check(x, b->name, b->base, b->bytes);
    qc_alloc_free(x->alloc, b->base, NULL);
    b->base = NULL;
}

#define FB(n) ((size_t)((n) > 0 ? (n) : 0) * sizeof(float))
#define IB(n) ((size_t)((n) > 0 ? (n) : 0) * sizeof(int64_t))

static void test_device(struct kt_gpu *x, const struct fcase *fc)
{
    struct fstate s;
    struct qc_attn_fused_tiles t;
    fstate_ready(&s, &t, fc);
    const int64_t D = s.D, H = s.H, Nd = s.Nd, Ns = s.Ns, E = s.E;

    /* inputs */
    struct dbuf d_rp = dnew(x, "row_ptr", IB(s.nb + 1), s.row_ptr);
    struct dbuf d_src = dnew(x, "src", IB(E), s.src);
    struct dbuf d_qrow = dnew(x, "query_row", s.qrow ? IB(s.Nd) : 0, s.qrow);
    struct dbuf d_sptr = dnew(x, "by_src.ptr", IB(Ns + 1), s.sptr);
    struct dbuf d_sperm = dnew(x, "by_src.perm", IB(E), s.sperm);
    struct dbuf d_q = dnew(x, "q", FB(Nd * D), s.q);
    struct dbuf d_k = dnew(x, "k", FB(Ns * D), s.k);
    struct dbuf d_v = dnew(x, "v", FB(Ns * D), s.v);
    struct dbuf d_du = dnew(x, "du", FB(Nd * D), s.du);
    struct dbuf d_w = dnew(x, "layer.w", FB(s.l.params.numel), s.w);
    struct dbuf d_few = dnew(x, "fe.w", fc->pos ? FB(s.fe.params.numel) : 0, s.few);
    struct dbuf d_feat = dnew(x, "feat", FB(E * s.d), s.feat);
    struct dbuf d_cidx = dnew(x, "cat_idx", s.cat_idx ? IB(E) : 0, s.cat_idx);
    struct dbuf d_ctab = dnew(x, "cat_table", FB(s.ncat * D), s.cat_table);
    /* outputs and accumulators */
    struct dbuf d_u = dnew(x, "u", FB(Nd * D), NULL);
    struct dbuf d_M = dnew(x, "softmax.max", FB(Nd * H), NULL);
    struct dbuf d_S = dnew(x, "softmax.sum", FB(Nd * H), NULL);
    struct dbuf d_dq = dnew(x, "dq", FB(Nd * D), NULL);
    struct dbuf d_dk = dnew(x, "dk", FB(Ns * D), NULL);
    struct dbuf d_dv = dnew(x, "dv", FB(Ns * D), NULL);
    struct dbuf d_dw = dnew(x, "layer.dw", FB(s.l.params.numel), NULL);
    struct dbuf d_fedw = dnew(x, "fe.dw", fc->pos ? FB(s.fe.params.numel) : 0, NULL);
    struct dbuf d_dcat = dnew(x, "dcat_table", FB(s.ncat * D), NULL);

    const float *w = d_w.d;
    float *dw = d_dw.d;
    struct qc_attn_fused_layer l = {D,    H,    s.Dh, s.l.scale, fc->pos, NULL, NULL, NULL,
                                    NULL, NULL, NULL, NULL,      NULL,    NULL, NULL};
    if (fc->pos) {
        l.w_kr = w + s.l.o_wkr, l.w_vr = w + s.l.o_wvr, l.b_vr = w + s.l.o_bvr;
        l.ln_r_w = w + s.l.o_ln_r_w, l.ln_r_b = w + s.l.o_ln_r_b;
        l.dw_kr = dw + s.l.o_wkr, l.dw_vr = dw + s.l.o_wvr, l.db_vr = dw + s.l.o_bvr;
        l.dln_r_w = dw + s.l.o_ln_r_w, l.dln_r_b = dw + s.l.o_ln_r_b;
    }
    struct qc_fe fe;
    memset(&fe, 0, sizeof fe);
    if (fc->pos) { /* the CPU block's layout (the model's own translation), device buffers */
        fourier_desc(&s.fe, &fe);
        fe.w = d_few.d;
        fe.dw = d_fedw.d;
    }
    struct qc_attn_fused_edges ed;
    memset(&ed, 0, sizeof ed);
    ed.n_src = Ns, ed.n_dst = Nd, ed.n_bdst = s.nb, ed.n_query = s.Q, ed.n_edge = E;
    ed.row_ptr = d_rp.d, ed.src = d_src.d, ed.query_row = s.qrow ? d_qrow.d : NULL;
    ed.by_src = (struct qc_csr){d_sptr.d, d_sperm.d, NULL, Ns, E};
    ed.fe = fc->pos ? &fe : NULL;
    ed.feat = s.d > 0 ? d_feat.d : NULL;
    ed.cat_table = s.cat_table ? d_ctab.d : NULL;
    ed.cat_idx = s.cat_idx ? d_cidx.d : NULL;
    ed.ncat = s.ncat;
    ed.dcat_table = s.dcat ? d_dcat.d : NULL;
    ed.tiles = &t;
    const int64_t nscr = qc_attn_fused_cuda_scratch_numel(&l, &ed, true);
    T_EXPECT(nscr >= qc_attn_fused_cuda_scratch_numel(&l, &ed, false), "scratch fwd <= bwd");
    struct dbuf d_scr = dnew(x, "scratch", FB(nscr), NULL);

    /* forward twice: the oracle within tolerance, the two runs bit-identical */
    float *got[2][3];
    for (int r = 0; r < 2; r++) {
        kt_cuda_ok(cudaMemsetAsync(d_u.d, 0xff, d_u.bytes, x->s), "poison u");
        kt_cuda_ok(cudaMemsetAsync(d_M.d, 0xff, d_M.bytes, x->s), "poison M");
        kt_cuda_ok(cudaMemsetAsync(d_S.d, 0xff, d_S.bytes, x->s), "poison S");
        qc_attn_fused_forward_cuda(d_u.d, d_M.d, d_S.d, d_q.d, d_k.d, d_v.d, &l, &ed, &s.drop,
                                   d_scr.d, x->s);
        got[r][0] = fnew(Nd * D), got[r][1] = fnew(Nd * H), got[r][2] = fnew(Nd * H);
        kt_dcopy(x, got[r][0], d_u.d, d_u.bytes, cudaMemcpyDeviceToHost);
        kt_dcopy(x, got[r][1], d_M.d, d_M.bytes, cudaMemcpyDeviceToHost);
        kt_dcopy(x, got[r][2], d_S.d, d_S.bytes, cudaMemcpyDeviceToHost);
    }
    expect_close("u", got[0][0], s.u, Nd * D, TOL_FWD);
    expect_close("softmax.max", got[0][1], s.smax, Nd * H, TOL_FWD);
    expect_close("softmax.sum", got[0][2], s.ssum, Nd * H, TOL_FWD);
    expect_bits("u (run 2 vs 1)", got[1][0], got[0][0], Nd * D);
    expect_bits("softmax.max (run 2 vs 1)", got[1][1], got[0][1], Nd * H);
    expect_bits("softmax.sum (run 2 vs 1)", got[1][2], got[0][2], Nd * H);

    /* backward twice from the device's own M, S: dq poisoned (OVERWRITE), the rest from 0 */
    struct {
        struct dbuf *b;
        const float *ref;
        int64_t n;
        const struct tol *tol;
    } outs[] = {
        {&d_dq, s.dq, Nd * D, &TOL_ACT},
        {&d_dk, s.kv.dk, Ns * D, &TOL_ACT},
        {&d_dv, s.kv.dv, Ns * D, &TOL_ACT},
        {&d_dw, s.dw, s.l.params.numel, &TOL_PARAM},
        {&d_fedw, s.fedw, fc->pos ? s.fe.params.numel : 0, &TOL_PARAM},
        {&d_dcat, s.dcat, s.dcat ? s.ncat * D : 0, &TOL_PARAM},
    };
    const int nout = (int)(sizeof outs / sizeof outs[0]);
    float *bgot[2][6];
    for (int r = 0; r < 2; r++) {
        kt_cuda_ok(cudaMemsetAsync(d_dq.d, 0xff, d_dq.bytes, x->s), "poison dq");
        for (int o = 1; o < nout; o++)
            kt_cuda_ok(cudaMemsetAsync(outs[o].b->d, 0, outs[o].b->bytes, x->s), "zero grads");
        qc_attn_fused_backward_cuda(d_dq.d, d_dk.d, d_dv.d, d_du.d, d_M.d, d_S.d, d_q.d, d_k.d,
                                    d_v.d, &l, &ed, &s.drop, d_scr.d, x->s);
        for (int o = 0; o < nout; o++) {
            bgot[r][o] = fnew(outs[o].n);
            kt_dcopy(x, bgot[r][o], outs[o].b->d, FB(outs[o].n), cudaMemcpyDeviceToHost);
        }
    }
    for (int o = 0; o < nout; o++) {
        if (outs[o].n == 0)
            continue;
        char name[64];
        expect_close(outs[o].b->name, bgot[0][o], outs[o].ref, outs[o].n, *outs[o].tol);
        snprintf(name, sizeof name, "%s (run 2 vs 1)", outs[o].b->name);
        expect_bits(name, bgot[1][o], bgot[0][o], outs[o].n);
    }
    kt_cuda_ok(cudaStreamSynchronize(x->s), "sync");
    kt_cuda_ok(cudaGetLastError(), "sticky error");

    /* Through the exec in every precision: the launchers' fp32 bits (the oracle's tiles round
     * nothing in a 16-bit run, test_host_precision; so the CUDA tiles must not either) */
    struct qc_fe feg;
    memset(&feg, 0, sizeof feg);
    if (fc->pos) {
        feg.D = fe.D, feg.F = fe.F, feg.d = fe.d, feg.o_freqs = fe.o_freqs;
        for (int64_t i = 0; i < fe.d; i++) {
            feg.o_w1[i] = fe.o_w1[i], feg.o_b1[i] = fe.o_b1[i];
            feg.o_lnw[i] = fe.o_lnw[i], feg.o_lnb[i] = fe.o_lnb[i];
            feg.o_w2[i] = fe.o_w2[i], feg.o_b2[i] = fe.o_b2[i];
        }
        feg.o_out_lnw = fe.o_out_lnw, feg.o_out_lnb = fe.o_out_lnb;
        feg.o_out_w = fe.o_out_w, feg.o_out_b = fe.o_out_b;
        feg.w = fe.w, feg.dw = fe.dw;
    }
    const struct qc_attn_fused_layer lg = {.D = D,
                                           .H = H,
                                           .Dh = s.Dh,
                                           .scale = l.scale,
                                           .has_pos = l.has_pos,
                                           .w_kr = l.w_kr,
                                           .w_vr = l.w_vr,
                                           .b_vr = l.b_vr,
                                           .ln_r_w = l.ln_r_w,
                                           .ln_r_b = l.ln_r_b,
                                           .dw_kr = l.dw_kr,
                                           .dw_vr = l.dw_vr,
                                           .db_vr = l.db_vr,
                                           .dln_r_w = l.dln_r_w,
                                           .dln_r_b = l.dln_r_b};
    struct qc_attn_fused_edges eg;
    memset(&eg, 0, sizeof eg);
    eg.n_src = Ns, eg.n_dst = Nd, eg.n_bdst = s.nb, eg.n_query = s.Q, eg.n_edge = E;
    eg.row_ptr = ed.row_ptr, eg.src = ed.src, eg.query_row = ed.query_row, eg.by_src = ed.by_src;
    eg.fe = fc->pos ? &feg : NULL;
    eg.feat = ed.feat, eg.cat_table = ed.cat_table, eg.cat_idx = ed.cat_idx, eg.ncat = ed.ncat;
    eg.dcat_table = ed.dcat_table;
    eg.tiles = &t;
    for (int p = 0; p < QC_PREC_COUNT; p++) {
        const struct qc_exec ex = {
            .backend = QC_EXEC_CUDA, .stream = x->s, .emu = NULL, .precision = p};
        const int64_t nx = qc_attn_fused_scratch_numel(&ex, &lg, &eg, true);
        struct dbuf d_scx = dnew(x, "exec scratch", FB(nx), NULL);
        char what[96];
        kt_cuda_ok(cudaMemsetAsync(d_u.d, 0xff, d_u.bytes, x->s), "poison u");
        kt_cuda_ok(cudaMemsetAsync(d_M.d, 0xff, d_M.bytes, x->s), "poison M");
        kt_cuda_ok(cudaMemsetAsync(d_S.d, 0xff, d_S.bytes, x->s), "poison S");
        qc_op_attn_fused_forward(&ex, d_u.d, d_M.d, d_S.d, d_q.d, d_k.d, d_v.d, &lg, &eg, &s.drop,
                                 d_scx.d);
        struct dbuf *fo[3] = {&d_u, &d_M, &d_S};
        for (int i = 0; i < 3; i++) {
            float *h = fnew((int64_t)(fo[i]->bytes / sizeof(float)));
            kt_dcopy(x, h, fo[i]->d, fo[i]->bytes, cudaMemcpyDeviceToHost);
            snprintf(what, sizeof what, "%s (%s exec vs the launcher)", fo[i]->name,
                     qc_precision_str((enum qc_precision)p));
            expect_bits(what, h, got[0][i], (int64_t)(fo[i]->bytes / sizeof(float)));
            free(h);
        }
        kt_cuda_ok(cudaMemsetAsync(d_dq.d, 0xff, d_dq.bytes, x->s), "poison dq");
        for (int o = 1; o < nout; o++)
            kt_cuda_ok(cudaMemsetAsync(outs[o].b->d, 0, outs[o].b->bytes, x->s), "zero grads");
        qc_op_attn_fused_backward(&ex, d_dq.d, d_dk.d, d_dv.d, d_du.d, d_M.d, d_S.d, d_q.d, d_k.d,
                                  d_v.d, &lg, &eg, &s.drop, d_scx.d);
        for (int o = 0; o < nout; o++) {
            float *h = fnew(outs[o].n);
            kt_dcopy(x, h, outs[o].b->d, FB(outs[o].n), cudaMemcpyDeviceToHost);
            snprintf(what, sizeof what, "%s (%s exec vs the launcher)", outs[o].b->name,
                     qc_precision_str((enum qc_precision)p));
            expect_bits(what, h, bgot[0][o], outs[o].n);
            free(h);
        }
        kt_cuda_ok(cudaStreamSynchronize(x->s), "sync");
        dfree(x, &d_scx);
    }

    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 3; i++)
            free(got[r][i]);
        for (int o = 0; o < nout; o++)
            free(bgot[r][o]);
    }
    struct dbuf *all[] = {&d_rp, &d_src, &d_qrow, &d_sptr, &d_sperm, &d_q,    &d_k,    &d_v,
                          &d_du, &d_w,   &d_few,  &d_feat, &d_cidx,  &d_ctab, &d_u,    &d_M,
                          &d_S,  &d_dq,  &d_dk,   &d_dv,   &d_dw,    &d_fedw, &d_dcat, &d_scr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dfree(x, all[i]);
    qc_attn_fused_tiles_deinit(&t);
    fstate_free(&s);
}

// ---- main -----------------------------------------------------------------------------------

int main(int argc, char **argv)
{
    const bool host = argc > 1 && strcmp(argv[1], "--host") == 0;
    g_rng = qc_test_seed();
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    if (host) {
        /* One thread (OpenMP and OpenBLAS): the CPU ops' per-element results depend on the
         * thread count, and the CPU's lane sums then follow the kernels' ascending-edge order.
         * OpenBLAS reads its thread count at load time, so re-run with the variables set. */
        const char *omp = getenv("OMP_NUM_THREADS"), *blas = getenv("OPENBLAS_NUM_THREADS");
        if (!omp || strcmp(omp, "1") != 0 || !blas || strcmp(blas, "1") != 0) {
            setenv("OMP_NUM_THREADS", "1", 1);
            setenv("OPENBLAS_NUM_THREADS", "1", 1);
            execv("/proc/self/exe", argv);
            printf("FATAL: re-exec with one thread: %s\n", strerror(errno));
            return 1;
        }
        QC_TEST ("attn fused cuda: tile plan") {
            test_tiles();
        }
        QC_TEST ("attn fused cuda: scratch is O(tile x D), not O(E x D)") {
            test_scratch();
        }
        for (int i = 0; i < ncases; i++) {
            char name[160];
            snprintf(name, sizeof name, "attn fused cuda: kernel bodies on the host == CPU: %s",
                     cases[i].name);
            QC_TEST (name) {
                test_host_replay(&cases[i]);
            }
            snprintf(name, sizeof name,
                     "attn fused cuda: the CPU op in a bf16 / fp16 exec gives the fp32 bits: %s",
                     cases[i].name);
            QC_TEST (name) {
                test_host_precision(&cases[i]);
            }
        }
        return qc_test_summary();
    }

    const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
    if (probe != 0)
        return probe;
    struct kt_gpu x;
    if (kt_gpu_open(&x, 0x5A) != 0)
        return 1;
    for (int i = 0; i < ncases; i++) {
        char name[160];
        snprintf(name, sizeof name, "attn fused cuda vs cpu: %s", cases[i].name);
        QC_TEST (name) {
            test_device(&x, &cases[i]);
        }
    }
    kt_gpu_close(&x);
    return qc_test_summary();
}
