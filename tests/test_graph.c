/*
 * test_graph.c — the graph builder against the official QCNet edge sets and against a literal
 * all-pairs re-statement of the Python rules.
 *
 * 1. Parity: tests/data/qcnet-parity-tiny/batch.safetensors (2 scenes collated by PyG) is
 *    read into a qc_batch; every edge set is built and compared with the edge_index the
 *    official model handed to each attention layer (outputs.safetensors), as sets of
 *    (src, dst) pairs, and also in exact order.
 * 2. Reference: random batches (with tiny caps so the 300-neighbour rule binds) are checked
 *    edge by edge and feature by feature against an O(n²) implementation written straight from
 *    QCNET.md §4–5, with no grid.
 * 3. Invariants: CSR order, dst_ptr, perm, the ×K layer views, fp32 helper edge cases.
 */
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "qc_batch.h"
#include "qc_graph.h"
#include "qc_safetensors.h"
#include "testutil.h"

#define PARITY_DIR QC_TEST_DATA_DIR "/qcnet-parity-tiny"
#define S_ALL      QC_SCENE_STEPS
#define T_HIST     QC_SCENE_HIST_STEPS

static const char *const layer_names[QC_EDGE_SET_COUNT] = {
    "encoder.map_encoder.pt2pl_layers.0",      "encoder.map_encoder.pl2pl_layers.0",
    "encoder.agent_encoder.t_attn_layers.0",   "encoder.agent_encoder.pl2a_attn_layers.0",
    "encoder.agent_encoder.a2a_attn_layers.0", "decoder.t2m_propose_attn_layers.0",
    "decoder.pl2m_propose_attn_layers.0",      "decoder.a2m_propose_attn_layers.0",
    "decoder.m2m_propose_attn_layer",
};

static int cmp_i64_plain(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_pair(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Sorted (src, dst) pairs of a (2, E) edge_index. */
static int64_t *sorted_pairs(const int64_t *ei, int64_t E)
{
    int64_t *p = malloc((size_t)(2 * E + 2) * sizeof(int64_t));
    for (int64_t i = 0; i < E; i++) {
        p[2 * i] = ei[i];
        p[2 * i + 1] = ei[E + i];
    }
    qsort(p, (size_t)E, 2 * sizeof(int64_t), cmp_pair);
    return p;
}

/* Checks the CSR invariants of one built set. */
static void check_csr(const struct qc_graph *g, enum qc_edge_set s)
{
    const struct qc_edges *e = &g->e[s];
    const char *nm = qc_edge_set_name(s);
    T_EXPECT_EQ_I64(e->dst_ptr[0], 0, "%s dst_ptr[0]", nm);
    T_EXPECT_EQ_I64(e->dst_ptr[e->num_dst], e->num_edges, "%s dst_ptr[end]", nm);
    int bad = 0;
    for (int64_t d = 0; d < e->num_dst && bad < 3; d++)
        for (int64_t i = e->dst_ptr[d]; i < e->dst_ptr[d + 1]; i++) {
            if (e->dst[i] != d || e->src[i] < 0 || e->src[i] >= e->num_src ||
                (i > e->dst_ptr[d] && e->src[i] <= e->src[i - 1])) {
                T_EXPECT(0, "%s: CSR edge %lld (%lld -> %lld) breaks dst %lld order", nm,
                         (long long)i, (long long)e->src[i], (long long)e->dst[i], (long long)d);
                bad++;
                break;
            }
        }
    if (e->perm) {
        char *seen = calloc((size_t)e->num_edges + 1, 1);
        for (int64_t i = 0; i < e->num_edges; i++) {
            int64_t j = e->perm[i];
            if (j < 0 || j >= e->num_edges || seen[j]) {
                T_EXPECT(0, "%s: perm[%lld] = %lld is not a permutation", nm, (long long)i,
                         (long long)j);
                break;
            }
            seen[j] = 1;
        }
        free(seen);
    }
}

/* Layer CSR view and official view must describe the same edges. */
static void check_layer_views(const struct qc_graph *g, enum qc_edge_set s)
{
    int64_t EL = qc_graph_layer_num_edges(g, s), ND = qc_graph_layer_num_dst(g, s);
    int64_t *src = malloc((size_t)(EL + 1) * sizeof(int64_t));
    int64_t *dst = malloc((size_t)(EL + 1) * sizeof(int64_t));
    int64_t *base = malloc((size_t)(EL + 1) * sizeof(int64_t));
    int64_t *ptr = malloc((size_t)(ND + 1) * sizeof(int64_t));
    int64_t *ei = malloc((size_t)(2 * EL + 2) * sizeof(int64_t));
    int64_t *obase = malloc((size_t)(EL + 1) * sizeof(int64_t));
    qc_graph_layer_csr(g, s, src, dst, base, ptr);
    qc_graph_layer_official(g, s, ei, obase);
    T_EXPECT_EQ_I64(ptr[ND], EL, "%s layer dst_ptr end", qc_edge_set_name(s));
    int64_t *csr_ei = malloc((size_t)(2 * EL + 2) * sizeof(int64_t));
    for (int64_t i = 0; i < EL; i++) {
        csr_ei[i] = src[i];
        csr_ei[EL + i] = dst[i];
    }
    for (int64_t d = 0; d < ND; d++)
        for (int64_t i = ptr[d]; i < ptr[d + 1]; i++)
            if (dst[i] != d) {
                T_EXPECT(0, "%s layer CSR edge %lld not under dst %lld", qc_edge_set_name(s),
                         (long long)i, (long long)d);
                d = ND;
                break;
            }
    int64_t *a = sorted_pairs(csr_ei, EL), *b = sorted_pairs(ei, EL);
    T_EXPECT(memcmp(a, b, (size_t)(2 * EL) * sizeof(int64_t)) == 0,
             "%s: layer CSR and official views differ as sets", qc_edge_set_name(s));
    /* the base edge of each layer edge must carry the same base (src, dst) */
    const struct qc_edges *e = &g->e[s];
    int bad = 0;
    for (int64_t j = 0; j < EL && bad < 3; j++) {
        int64_t i = obase[j];
        int64_t bs = e->src[i], bd = e->dst[i];
        int64_t K = g->num_modes;
        int64_t ls = ei[j], ld = ei[EL + j];
        bool ok;
        if (s == QC_EDGE_T2M)
            ok = ls == bs && ld / K == bd;
        else if (s == QC_EDGE_PL2M)
            ok = ls % g->num_polygons == bs && ld % g->num_agents == bd &&
                 ls / g->num_polygons == ld / g->num_agents;
        else if (s == QC_EDGE_A2M)
            ok = ls % g->num_agents == bs && ld % g->num_agents == bd &&
                 ls / g->num_agents == ld / g->num_agents;
        else
            ok = ls == bs && ld == bd;
        if (!ok) {
            T_EXPECT(0, "%s: official edge %lld (%lld -> %lld) has base %lld (%lld -> %lld)",
                     qc_edge_set_name(s), (long long)j, (long long)ls, (long long)ld, (long long)i,
                     (long long)bs, (long long)bd);
            bad++;
        }
    }
    free(a);
    free(b);
    free(csr_ei);
    free(src);
    free(dst);
    free(base);
    free(ptr);
    free(ei);
    free(obase);
}

// ---- a literal O(n²) re-statement of the Python rules --------------------------------------

struct elist {
    int64_t *v; /* (src, dst) pairs */
    int64_t n, cap;
};

static void el_push(struct elist *l, int64_t s, int64_t d)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->v = realloc(l->v, (size_t)l->cap * 2 * sizeof(int64_t));
    }
    l->v[2 * l->n] = s;
    l->v[2 * l->n + 1] = d;
    l->n++;
}

/* Queries of ref_radius whose cap bound: k candidates kept and at least one more within the
 * radius left out. The cap tests require it non-zero, so they test the cap rule, not a graph
 * in which it never applies. */
static int64_t ref_cap_bound;

/* torch-cluster radius (GPU): for each y in order, x of the same example ascending, strict
 * fp32 d² < (float)(r·r), first k kept. Emits (y, x). */
static void ref_radius(const float *x, int64_t nx, const int64_t *bx, const float *y, int64_t ny,
                       const int64_t *by, double r, int64_t k, struct elist *out)
{
    float r2 = (float)(r * r);
    for (int64_t j = 0; j < ny; j++) {
        int64_t cnt = 0, left_out = 0;
        for (int64_t i = 0; i < nx && left_out == 0; i++) {
            if (bx[i] != by[j])
                continue;
            float dx = x[2 * i] - y[2 * j], dy = x[2 * i + 1] - y[2 * j + 1];
            float d2 = 0.0f;
            d2 += dx * dx;
            d2 += dy * dy;
            if (d2 < r2) {
                if (cnt == k) {
                    left_out = 1;
                    continue;
                }
                el_push(out, j, i);
                cnt++;
            }
        }
        ref_cap_bound += left_out;
    }
}

/* radius_graph(loop=False): radius(x, x, k + 1), [row, col] = [x, y], self pairs removed. */
static void ref_radius_graph(const float *x, int64_t n, const int64_t *b, double r, int64_t k,
                             struct elist *out)
{
    struct elist e = {0};
    ref_radius(x, n, b, x, n, b, r, k + 1, &e);
    for (int64_t i = 0; i < e.n; i++)
        if (e.v[2 * i] != e.v[2 * i + 1])
            el_push(out, e.v[2 * i + 1], e.v[2 * i]);
    free(e.v);
}

/* Reference edge lists in official order for every set (features computed separately). */
static void ref_edges(const struct qc_batch *bt, const struct qc_graph_params *p,
                      struct elist out[QC_EDGE_SET_COUNT])
{
    const int64_t A = bt->num_agents, P = bt->num_polygons, Pt = bt->num_points, B = bt->num_scenes;
    const int64_t K = p->num_modes, k = p->max_num_neighbors;
    memset(out, 0, sizeof(struct elist) * QC_EDGE_SET_COUNT);
    float *plpos = malloc((size_t)(2 * P * T_HIST + 2) * sizeof(float));
    int64_t *plb = malloc((size_t)(P * T_HIST + 1) * sizeof(int64_t));
    float *xs = malloc((size_t)(2 * A * T_HIST + 2) * sizeof(float));
    int64_t *bs = malloc((size_t)(A * T_HIST + 1) * sizeof(int64_t));
    uint8_t *ms = malloc((size_t)(A * T_HIST + 1));
    uint8_t *mdst = malloc((size_t)A + 1);
    for (int64_t i = 0; i < Pt; i++)
        el_push(&out[QC_EDGE_PT2PL], bt->pt2pl[i], bt->pt2pl[Pt + i]);
    /* pl2pl */
    for (int64_t i = 0; i < P; i++) {
        plpos[2 * i] = bt->pl_position[3 * i];
        plpos[2 * i + 1] = bt->pl_position[3 * i + 1];
    }
    struct elist rg = {0};
    ref_radius_graph(plpos, P, bt->pl_batch, p->pl2pl_radius, k, &rg);
    int64_t nall = rg.n + bt->num_pl2pl;
    int64_t *keys = malloc((size_t)(nall + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < rg.n; i++)
        keys[i] = (rg.v[2 * i] * P + rg.v[2 * i + 1]) * 8;
    for (int64_t i = 0; i < bt->num_pl2pl; i++)
        keys[rg.n + i] =
            (bt->pl2pl_edge[i] * P + bt->pl2pl_edge[bt->num_pl2pl + i]) * 8 + bt->pl2pl_type[i];
    qsort(keys, (size_t)nall, sizeof(int64_t), cmp_i64_plain);
    for (int64_t i = 0; i < nall; i++)
        if (i + 1 == nall || keys[i + 1] / 8 != keys[i] / 8) /* last of a run = max type */
            el_push(&out[QC_EDGE_PL2PL], keys[i] / 8 / P, keys[i] / 8 % P);
    free(keys);
    free(rg.v);
    /* t */
    for (int64_t a = 0; a < A; a++)
        for (int64_t s = 0; s < T_HIST; s++)
            for (int64_t t = 0; t < T_HIST; t++) {
                int64_t src = a * T_HIST + s, dst = a * T_HIST + t;
                if (bt->valid_mask[a * S_ALL + s] && bt->valid_mask[a * S_ALL + t] && dst > src &&
                    dst - src <= p->time_span)
                    el_push(&out[QC_EDGE_T], src, dst);
            }
    /* spatial batching, time-major */
    for (int64_t t = 0; t < T_HIST; t++) {
        for (int64_t a = 0; a < A; a++) {
            xs[2 * (t * A + a)] = bt->position[(a * S_ALL + t) * 3];
            xs[2 * (t * A + a) + 1] = bt->position[(a * S_ALL + t) * 3 + 1];
            bs[t * A + a] = bt->agent_batch[a] + B * t;
            ms[t * A + a] = bt->valid_mask[a * S_ALL + t];
        }
        for (int64_t q = 0; q < P; q++) {
            plpos[2 * (t * P + q)] = bt->pl_position[3 * q];
            plpos[2 * (t * P + q) + 1] = bt->pl_position[3 * q + 1];
            plb[t * P + q] = bt->pl_batch[q] + B * t;
        }
    }
    struct elist e = {0};
    ref_radius(xs, A * T_HIST, bs, plpos, P * T_HIST, plb, p->pl2a_radius, k, &e);
    for (int64_t i = 0; i < e.n; i++)
        if (ms[e.v[2 * i + 1]])
            el_push(&out[QC_EDGE_PL2A], e.v[2 * i], e.v[2 * i + 1]);
    e.n = 0;
    ref_radius_graph(xs, A * T_HIST, bs, p->a2a_radius, k, &e);
    for (int64_t i = 0; i < e.n; i++)
        if (ms[e.v[2 * i]] && ms[e.v[2 * i + 1]])
            el_push(&out[QC_EDGE_A2A], e.v[2 * i], e.v[2 * i + 1]);
    /* decoder */
    for (int64_t a = 0; a < A; a++) {
        mdst[a] = 0;
        for (int64_t t = 0; t < S_ALL; t++)
            mdst[a] |= bt->predict_mask[a * S_ALL + t];
    }
    for (int64_t a = 0; a < A; a++)
        for (int64_t t = T_HIST - p->num_t2m_steps; t < T_HIST; t++)
            if (bt->valid_mask[a * S_ALL + t] && mdst[a])
                el_push(&out[QC_EDGE_T2M], a * T_HIST + t, a);
    float *xm = xs + 2 * (T_HIST - 1) * A; /* time-major slab t = 49 is pos_m */
    for (int64_t i = 0; i < P; i++) {
        plpos[2 * i] = bt->pl_position[3 * i];
        plpos[2 * i + 1] = bt->pl_position[3 * i + 1];
    }
    e.n = 0;
    ref_radius(xm, A, bt->agent_batch, plpos, P, bt->pl_batch, p->pl2m_radius, k, &e);
    for (int64_t i = 0; i < e.n; i++)
        if (mdst[e.v[2 * i + 1]])
            el_push(&out[QC_EDGE_PL2M], e.v[2 * i], e.v[2 * i + 1]);
    e.n = 0;
    ref_radius_graph(xm, A, bt->agent_batch, p->a2m_radius, k, &e);
    for (int64_t i = 0; i < e.n; i++)
        if (bt->valid_mask[e.v[2 * i] * S_ALL + T_HIST - 1] && mdst[e.v[2 * i + 1]])
            el_push(&out[QC_EDGE_A2M], e.v[2 * i], e.v[2 * i + 1]);
    for (int64_t a = 0; a < A; a++)
        for (int64_t i = 0; i < K && mdst[a]; i++)
            for (int64_t j = 0; j < K; j++)
                el_push(&out[QC_EDGE_M2M], a * K + i, a * K + j);
    free(e.v);
    free(plpos);
    free(plb);
    free(xs);
    free(bs);
    free(ms);
    free(mdst);
}

/* The reference feature row of an official edge, from QCNET.md §5 (positions of the nodes as
 * each set numbers them). */
static void ref_feat(const struct qc_batch *bt, enum qc_edge_set s, int64_t src, int64_t dst,
                     float *f)
{
    const int64_t A = bt->num_agents, P = bt->num_polygons;
    float sx = 0, sy = 0, dx = 0, dy = 0, sang = 0, dang = 0;
#define APOS(a, t, c) bt->position[((a)*S_ALL + (t)) * 3 + (c)]
#define AHEAD(a, t)   bt->heading[(a)*S_ALL + (t)]
    switch (s) {
    case QC_EDGE_PT2PL:
        sx = bt->pt_position[3 * src], sy = bt->pt_position[3 * src + 1];
        sang = bt->pt_orientation[src];
        dx = bt->pl_position[3 * dst], dy = bt->pl_position[3 * dst + 1];
        dang = bt->pl_orientation[dst];
        break;
    case QC_EDGE_PL2PL:
        sx = bt->pl_position[3 * src], sy = bt->pl_position[3 * src + 1];
        sang = bt->pl_orientation[src];
        dx = bt->pl_position[3 * dst], dy = bt->pl_position[3 * dst + 1];
        dang = bt->pl_orientation[dst];
        break;
    case QC_EDGE_T:
    case QC_EDGE_T2M: {
        int64_t a = src / T_HIST, t = src % T_HIST;
        int64_t da = s == QC_EDGE_T ? dst / T_HIST : dst;
        int64_t dt = s == QC_EDGE_T ? dst % T_HIST : T_HIST - 1;
        sx = APOS(a, t, 0), sy = APOS(a, t, 1), sang = AHEAD(a, t);
        dx = APOS(da, dt, 0), dy = APOS(da, dt, 1), dang = AHEAD(da, dt);
        break;
    }
    case QC_EDGE_PL2A: {
        int64_t q = src % P, t = dst / A, a = dst % A;
        sx = bt->pl_position[3 * q], sy = bt->pl_position[3 * q + 1];
        sang = bt->pl_orientation[q];
        dx = APOS(a, t, 0), dy = APOS(a, t, 1), dang = AHEAD(a, t);
        break;
    }
    case QC_EDGE_A2A: {
        int64_t t = dst / A, a = dst % A, b = src % A;
        sx = APOS(b, t, 0), sy = APOS(b, t, 1), sang = AHEAD(b, t);
        dx = APOS(a, t, 0), dy = APOS(a, t, 1), dang = AHEAD(a, t);
        break;
    }
    case QC_EDGE_PL2M:
        sx = bt->pl_position[3 * src], sy = bt->pl_position[3 * src + 1];
        sang = bt->pl_orientation[src];
        dx = APOS(dst, T_HIST - 1, 0), dy = APOS(dst, T_HIST - 1, 1);
        dang = AHEAD(dst, T_HIST - 1);
        break;
    case QC_EDGE_A2M:
        sx = APOS(src, T_HIST - 1, 0), sy = APOS(src, T_HIST - 1, 1);
        sang = AHEAD(src, T_HIST - 1);
        dx = APOS(dst, T_HIST - 1, 0), dy = APOS(dst, T_HIST - 1, 1);
        dang = AHEAD(dst, T_HIST - 1);
        break;
    default:
        return;
    }
#undef APOS
#undef AHEAD
    float rx = sx - dx, ry = sy - dy;
    f[0] = graph_norm2(rx, ry);
    f[1] = graph_angle_between(cosf(dang), sinf(dang), rx, ry);
    f[2] = graph_wrap_angle(sang - dang);
    if (s == QC_EDGE_T)
        f[3] = (float)(src - dst);
    if (s == QC_EDGE_T2M)
        f[3] = (float)(src % T_HIST - T_HIST + 1);
}

// ---- random scenes ---------------------------------------------------------------------------

static double urand(uint64_t *st)
{
    return (double)(qc_test_rand(st) >> 11) * (1.0 / 9007199254740992.0);
}

struct rscene {
    struct qc_scene s;
    uint8_t *vm, *pm, *aty, *acat, *plty, *plint, *ptty, *ptside, *eety;
    float *pos, *head, *vel, *plpos, *plor, *plh, *ptpos, *ptor, *ptmag, *pth;
    int64_t *pt2pl, *pl2pl;
};

/* A random scene: agents clustered in a box near a city-scale origin, with gaps in their
 * tracks (unobserved steps at (0, 0)), coincident agents, a pair exactly one radius apart,
 * polygons with 1–4 points each and typed edges (duplicates and far pairs included). */
static void rscene_make(struct rscene *r, uint64_t *st, int64_t A, int64_t P, double box)
{
    memset(r, 0, sizeof(*r));
    const double ox = 3000.0 + 100.0 * urand(st), oy = -2000.0 + 100.0 * urand(st);
    r->vm = calloc((size_t)(A * S_ALL), 1);
    r->pm = calloc((size_t)(A * S_ALL), 1);
    r->aty = calloc((size_t)A + 1, 1);
    r->acat = calloc((size_t)A + 1, 1);
    r->pos = calloc((size_t)(A * S_ALL * 3), sizeof(float));
    r->head = calloc((size_t)(A * S_ALL), sizeof(float));
    r->vel = calloc((size_t)(A * S_ALL * 3), sizeof(float));
    uint8_t *raw = calloc((size_t)S_ALL, 1);
    for (int64_t a = 0; a < A; a++) {
        double x = ox + box * urand(st), y = oy + box * urand(st);
        double h = (urand(st) * 2 - 1) * 3.14159, v = urand(st) < 0.3 ? 0.0 : 10 * urand(st);
        int64_t first = (int64_t)(urand(st) * 45), last = first + (int64_t)(urand(st) * 110);
        if (a < 2) /* the AV and the focal agent: fully observed */
            first = 0, last = S_ALL;
        for (int64_t t = 0; t < S_ALL; t++) {
            raw[t] = t >= first && t < last && urand(st) > 0.05;
            x += v * 0.1 * cos(h);
            y += v * 0.1 * sin(h);
            h += 0.05 * (urand(st) - 0.5);
            if (!raw[t])
                continue;
            float *p = r->pos + (a * S_ALL + t) * 3;
            p[0] = (float)x;
            p[1] = (float)y;
            r->head[a * S_ALL + t] = urand(st) < 0.1 ? 3.14159265f : (float)h;
            r->vel[(a * S_ALL + t) * 3] = (float)(v * cos(h));
            r->vel[(a * S_ALL + t) * 3 + 1] = (float)(v * sin(h));
        }
        /* vector_repr validity and the predict mask (QCNET.md §7.2) */
        for (int64_t t = 1; t < T_HIST; t++)
            r->vm[a * S_ALL + t] = raw[t - 1] && raw[t];
        for (int64_t t = T_HIST; t < S_ALL; t++) {
            r->vm[a * S_ALL + t] = raw[t];
            r->pm[a * S_ALL + t] = raw[t] && raw[T_HIST - 1];
        }
        r->aty[a] = (uint8_t)(qc_test_rand(st) % QC_AGENT_TYPES);
        r->acat[a] = a == 1 ? 3 : (uint8_t)(qc_test_rand(st) % 3);
    }
    free(raw);
    if (A >= 4) {
        /* agent 3 coincides with agent 2, agent 2 is exactly 50 m from agent 0 at some steps */
        for (int64_t t = 0; t < S_ALL; t++) {
            float *p2 = r->pos + (2 * S_ALL + t) * 3, *p3 = r->pos + (3 * S_ALL + t) * 3;
            const float *p0 = r->pos + t * 3;
            if (t % 3 == 0) {
                p2[0] = p0[0] + 30.0f;
                p2[1] = p0[1] + 40.0f;
            }
            p3[0] = p2[0];
            p3[1] = p2[1];
        }
    }
    r->plpos = calloc((size_t)(P * 3) + 1, sizeof(float));
    r->plor = calloc((size_t)P + 1, sizeof(float));
    r->plh = calloc((size_t)P + 1, sizeof(float));
    r->plty = calloc((size_t)P + 1, 1);
    r->plint = calloc((size_t)P + 1, 1);
    int64_t *npt = calloc((size_t)P + 1, sizeof(int64_t));
    int64_t Pt = 0;
    for (int64_t q = 0; q < P; q++) {
        r->plpos[3 * q] = (float)(ox + (box + 200.0) * urand(st) - 100.0);
        r->plpos[3 * q + 1] = (float)(oy + (box + 200.0) * urand(st) - 100.0);
        r->plor[q] = (float)((urand(st) * 2 - 1) * 3.2);
        r->plty[q] = (uint8_t)(qc_test_rand(st) % QC_POLYGON_TYPES);
        r->plint[q] = (uint8_t)(qc_test_rand(st) % QC_POLYGON_INT);
        npt[q] = 1 + (int64_t)(qc_test_rand(st) % 4);
        Pt += npt[q];
    }
    if (P >= 2) { /* a polygon on top of another: zero relative vector */
        r->plpos[3] = r->plpos[0];
        r->plpos[4] = r->plpos[1];
    }
    r->ptpos = calloc((size_t)(Pt * 3) + 1, sizeof(float));
    r->ptor = calloc((size_t)Pt + 1, sizeof(float));
    r->ptmag = calloc((size_t)Pt + 1, sizeof(float));
    r->pth = calloc((size_t)Pt + 1, sizeof(float));
    r->ptty = calloc((size_t)Pt + 1, 1);
    r->ptside = calloc((size_t)Pt + 1, 1);
    r->pt2pl = calloc((size_t)(2 * Pt) + 1, sizeof(int64_t));
    int64_t q = 0;
    for (int64_t pl = 0; pl < P; pl++)
        for (int64_t k = 0; k < npt[pl]; k++, q++) {
            r->ptpos[3 * q] = r->plpos[3 * pl] + (float)(5 * k);
            r->ptpos[3 * q + 1] = r->plpos[3 * pl + 1];
            r->ptor[q] = (float)urand(st);
            r->ptmag[q] = 5.0f;
            r->ptty[q] = (uint8_t)(qc_test_rand(st) % QC_POINT_TYPES);
            r->ptside[q] = (uint8_t)(k % 3);
            r->pt2pl[q] = q;
            r->pt2pl[Pt + q] = pl;
        }
    free(npt);
    int64_t Et = P > 1 ? 2 * P : 0;
    r->pl2pl = calloc((size_t)(2 * Et) + 1, sizeof(int64_t));
    r->eety = calloc((size_t)Et + 1, 1);
    for (int64_t k = 0; k < Et; k++) {
        r->pl2pl[k] = (int64_t)(qc_test_rand(st) % (uint64_t)P);
        r->pl2pl[Et + k] = k % 7 == 0 ? r->pl2pl[k] : (int64_t)(qc_test_rand(st) % (uint64_t)P);
        r->eety[k] = (uint8_t)(1 + qc_test_rand(st) % 4);
    }
    struct qc_scene *s = &r->s;
    snprintf(s->scenario_id, sizeof(s->scenario_id), "rand-%lld", (long long)A);
    snprintf(s->city, sizeof(s->city), "testcity");
    s->num_agents = A;
    s->num_polygons = P;
    s->num_points = Pt;
    s->num_pl2pl = Et;
    s->av_index = 0;
    s->valid_mask = r->vm;
    s->predict_mask = r->pm;
    s->agent_type = r->aty;
    s->agent_category = r->acat;
    s->position = r->pos;
    s->heading = r->head;
    s->velocity = r->vel;
    s->pl_position = r->plpos;
    s->pl_orientation = r->plor;
    s->pl_height = r->plh;
    s->pl_type = r->plty;
    s->pl_is_intersection = r->plint;
    s->pt_position = r->ptpos;
    s->pt_orientation = r->ptor;
    s->pt_magnitude = r->ptmag;
    s->pt_height = r->pth;
    s->pt_type = r->ptty;
    s->pt_side = r->ptside;
    s->pt2pl = r->pt2pl;
    s->pl2pl_edge = r->pl2pl;
    s->pl2pl_type = r->eety;
}

static void rscene_free(struct rscene *r)
{
    void *ptrs[] = {r->vm,     r->pm,    r->aty,  r->acat,  r->plty, r->plint, r->ptty,
                    r->ptside, r->eety,  r->pos,  r->head,  r->vel,  r->plpos, r->plor,
                    r->plh,    r->ptpos, r->ptor, r->ptmag, r->pth,  r->pt2pl, r->pl2pl};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
        free(ptrs[i]);
}

/* Builds the graph of a random batch and checks every set against the reference. */
static void check_against_reference(uint64_t seed, const struct qc_graph_params *p, double box,
                                    int64_t scale)
{
    uint64_t st = seed;
    enum { NS = 3 };
    struct rscene rs[NS];
    const struct qc_scene *sp[NS];
    for (int i = 0; i < NS; i++) {
        int64_t A = (i == 1 ? 2 : 8 + (int64_t)(qc_test_rand(&st) % 20)) * scale;
        int64_t P = (i == 2 ? 1 : 5 + (int64_t)(qc_test_rand(&st) % 30)) * scale;
        rscene_make(&rs[i], &st, A, P, box);
        sp[i] = &rs[i].s;
    }
    struct qc_batch bt;
    enum qc_status rc = qc_batch_collate(sp, NS, NULL, true, &bt);
    T_EXPECT(rc == QC_OK, "collate: %s", qc_error_last());
    struct qc_graph_builder *gb = NULL;
    qc_graph_builder_create(&gb);
    rc = qc_batch_build_graph(&bt, gb, p);
    T_EXPECT(rc == QC_OK, "build: %s", qc_error_last());
    struct elist ref[QC_EDGE_SET_COUNT];
    ref_edges(&bt, p, ref);
    const struct qc_graph *g = &bt.graph;
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
        const struct qc_edges *e = &g->e[s];
        const char *nm = qc_edge_set_name((enum qc_edge_set)s);
        T_EXPECT_EQ_I64(e->num_edges, ref[s].n, "%s edges (seed %llu, cap %lld)", nm,
                        (unsigned long long)seed, (long long)p->max_num_neighbors);
        check_csr(g, (enum qc_edge_set)s);
        check_layer_views(g, (enum qc_edge_set)s);
        if (e->num_edges != ref[s].n)
            continue;
        int bad = 0;
        for (int64_t i = 0; i < e->num_edges && bad < 3; i++) {
            int64_t j = e->perm ? e->perm[i] : i;
            int64_t rsrc = ref[s].v[2 * j], rdst = ref[s].v[2 * j + 1];
            if (e->src[i] != rsrc || e->dst[i] != rdst) {
                T_EXPECT(0, "%s: CSR edge %lld (%lld -> %lld) official %lld is (%lld -> %lld)", nm,
                         (long long)i, (long long)e->src[i], (long long)e->dst[i], (long long)j,
                         (long long)rsrc, (long long)rdst);
                bad++;
                continue;
            }
            float f[4] = {0, 0, 0, 0};
            ref_feat(&bt, (enum qc_edge_set)s, rsrc, rdst, f);
            for (int c = 0; c < e->num_feat; c++)
                if (memcmp(&f[c], &e->attr[i * e->num_feat + c], sizeof(float)) != 0) {
                    T_EXPECT(0, "%s: edge %lld feature %d: %.9g, reference %.9g", nm, (long long)i,
                             c, (double)e->attr[i * e->num_feat + c], (double)f[c]);
                    bad++;
                }
        }
        free(ref[s].v);
    }
    /* pl2pl types: a typed pair keeps its (max) type, radius-only pairs are 0 */
    const struct qc_edges *pe = &g->e[QC_EDGE_PL2PL];
    for (int64_t i = 0; i < pe->num_edges; i++) {
        uint8_t want = 0;
        for (int64_t k = 0; k < bt.num_pl2pl; k++)
            if (bt.pl2pl_edge[k] == pe->src[i] && bt.pl2pl_edge[bt.num_pl2pl + k] == pe->dst[i] &&
                bt.pl2pl_type[k] > want)
                want = bt.pl2pl_type[k];
        if (pe->type[i] != want) {
            T_EXPECT(0, "pl2pl edge %lld (%lld -> %lld): type %u, expected %u", (long long)i,
                     (long long)pe->src[i], (long long)pe->dst[i], pe->type[i], want);
            break;
        }
    }
    qc_graph_builder_destroy(gb);
    qc_batch_release(&bt);
    for (int i = 0; i < NS; i++)
        rscene_free(&rs[i]);
}

static void test_collate_offsets(void)
{
    uint64_t st = qc_test_seed();
    struct rscene rs[2];
    rscene_make(&rs[0], &st, 5, 4, 100);
    rscene_make(&rs[1], &st, 7, 6, 100);
    const struct qc_scene *sp[2] = {&rs[0].s, &rs[1].s};
    struct qc_batch bt;
    T_EXPECT(qc_batch_collate(sp, 2, NULL, true, &bt) == QC_OK, "%s", qc_error_last());
    T_EXPECT_EQ_I64(bt.num_agents, 12, "agents");
    T_EXPECT_EQ_I64(bt.agent_ptr[1], 5, "agent_ptr");
    T_EXPECT_EQ_I64(bt.pl_ptr[2], 10, "pl_ptr");
    T_EXPECT_EQ_I64(bt.agent_batch[4], 0, "batch");
    T_EXPECT_EQ_I64(bt.agent_batch[5], 1, "batch");
    T_EXPECT_EQ_I64(bt.av_index[1], 0, "av_index is not shifted");
    int64_t Pt0 = rs[0].s.num_points, Pt = bt.num_points;
    T_EXPECT_EQ_I64(bt.pt2pl[Pt0], rs[1].s.pt2pl[0] + Pt0, "pt2pl src shifted by ΣPt");
    T_EXPECT_EQ_I64(bt.pt2pl[Pt + Pt0], rs[1].s.pt2pl[rs[1].s.num_points] + 4,
                    "pt2pl dst shifted by ΣP");
    int64_t E0 = rs[0].s.num_pl2pl, Et = bt.num_pl2pl;
    T_EXPECT_EQ_I64(bt.pl2pl_edge[E0], rs[1].s.pl2pl_edge[0] + 4, "pl2pl src shifted");
    T_EXPECT_EQ_I64(bt.pl2pl_edge[Et + E0], rs[1].s.pl2pl_edge[rs[1].s.num_pl2pl] + 4,
                    "pl2pl dst shifted");
    T_EXPECT(memcmp(bt.position + 5 * S_ALL * 3, rs[1].s.position, 7 * S_ALL * 3 * sizeof(float)) ==
                 0,
             "positions concatenated");
    /* target of agent 0 at future step 3, by hand */
    const float *o = rs[0].s.position + (T_HIST - 1) * 3, *q = rs[0].s.position + (T_HIST + 3) * 3;
    double th = (double)rs[0].s.heading[T_HIST - 1];
    double x = (double)(q[0] - o[0]) * cos(th) + (double)(q[1] - o[1]) * sin(th);
    double y = -(double)(q[0] - o[0]) * sin(th) + (double)(q[1] - o[1]) * cos(th);
    T_EXPECT_NEAR(bt.target[3 * 4 + 0], x, 1e-3, 1e-5, "target x");
    T_EXPECT_NEAR(bt.target[3 * 4 + 1], y, 1e-3, 1e-5, "target y");
    qc_batch_release(&bt);
    rscene_free(&rs[0]);
    rscene_free(&rs[1]);
}

static void test_helpers(void)
{
    /* wrap_angle(π) = −π_f; results in [−π_f, π_f) */
    T_EXPECT(graph_wrap_angle(GRAPH_PI_F) == -GRAPH_PI_F, "wrap(pi) = %.9g",
             (double)graph_wrap_angle(GRAPH_PI_F));
    T_EXPECT(graph_wrap_angle(0.0f) == 0.0f, "wrap(0)");
    T_EXPECT_NEAR(graph_wrap_angle(7.0f), 7.0 - 2 * 3.14159265358979, 1e-5, 0, "wrap(7)");
    T_EXPECT_NEAR(graph_wrap_angle(-7.0f), -7.0 + 2 * 3.14159265358979, 1e-5, 0, "wrap(-7)");
    for (float a = -20.0f; a < 20.0f; a += 0.37f) {
        float w = graph_wrap_angle(a);
        if (!(w >= -GRAPH_PI_F && w < GRAPH_PI_F)) {
            T_EXPECT(0, "wrap(%g) = %g out of range", (double)a, (double)w);
            break;
        }
    }
    /* zero vector from a third-quadrant heading: +0 dot, angle ±0 (not ±π) */
    float th = -2.5f;
    float c0 = cosf(th), c1 = sinf(th);
    float ang = graph_angle_between(c0, c1, 0.0f, 0.0f);
    T_EXPECT(ang == 0.0f, "angle of a zero vector = %g", (double)ang);
    volatile float zero = 0.0f;
    float naive = atan2f(c0 * zero - c1 * zero, c0 * zero + c1 * zero);
    T_EXPECT(fabsf(naive) > 3.0f, "naive dot gives ±pi here (%g), which the +0 start avoids",
             (double)naive);
    T_EXPECT_NEAR(graph_angle_between(1, 0, 0, 1), 1.5707963, 1e-6, 0, "90 degrees ccw");
    T_EXPECT(graph_norm2(3, 4) == 5.0f, "norm");
    T_EXPECT(strcmp(qc_edge_set_name(QC_EDGE_A2M), "a2m") == 0, "names");
    T_EXPECT(qc_edge_set_from_name("pl2a") == QC_EDGE_PL2A, "from name");
    T_EXPECT(qc_edge_set_from_name("x") == -1, "unknown name");
}

// ---- parity with the official model ------------------------------------------------------

static void test_parity(void)
{
    struct qc_safetensors *bst = NULL, *ost = NULL;
    enum qc_status rc = qc_safetensors_open(PARITY_DIR "/batch.safetensors", &bst);
    T_EXPECT(rc == QC_OK, "open batch: %s", qc_error_last());
    rc = qc_safetensors_open(PARITY_DIR "/outputs.safetensors", &ost);
    T_EXPECT(rc == QC_OK, "open outputs: %s", qc_error_last());
    if (!bst || !ost) {
        qc_safetensors_close(bst);
        qc_safetensors_close(ost);
        return;
    }
    struct qc_batch batch;
    rc = qc_batch_from_safetensors(bst, NULL, &batch);
    T_EXPECT(rc == QC_OK, "batch: %s", qc_error_last());
    if (rc != QC_OK)
        goto out;
    T_EXPECT_EQ_I64(batch.num_scenes, 2, "scenes");
    T_EXPECT_EQ_I64(batch.num_agents, 80, "agents");
    T_EXPECT_EQ_I64(batch.num_polygons, 172, "polygons");
    T_EXPECT_EQ_I64(batch.num_points, 2504, "points");

    /* TargetBuilder against the reference pipeline's agent.target (valid future steps only:
     * elsewhere it is garbage by design, but computed by the same ops, so compare all). */
    float *tgt = malloc((size_t)batch.num_agents * 60 * 4 * sizeof(float));
    qc_batch_target(&batch, 0, batch.num_agents, tgt);
    double maxerr = 0, maxref = 0;
    for (int64_t i = 0; i < batch.num_agents * 60 * 4; i++) {
        double d = fabs((double)tgt[i] - (double)batch.target[i]);
        maxerr = d > maxerr ? d : maxerr;
        maxref = fabs((double)batch.target[i]) > maxref ? fabs((double)batch.target[i]) : maxref;
    }
    T_EXPECT(maxerr <= 1e-5 * maxref, "target: max |ours - ref| = %g (max |ref| %g)", maxerr,
             maxref);
    free(tgt);

    struct qc_graph_builder *gb = NULL;
    T_EXPECT(qc_graph_builder_create(&gb) == QC_OK, "builder");
    struct qc_graph_params p;
    qc_graph_params_default(&p);
    rc = qc_batch_build_graph(&batch, gb, &p);
    T_EXPECT(rc == QC_OK, "build: %s", qc_error_last());
    if (rc == QC_OK) {
        const struct qc_graph *g = &batch.graph;
        for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
            char name[160];
            snprintf(name, sizeof(name), "edge_index.%s.call0", layer_names[s]);
            const struct qc_st_tensor *ref = qc_safetensors_find(ost, name);
            T_EXPECT(ref != NULL, "reference %s missing", name);
            if (!ref)
                continue;
            int64_t EL = qc_graph_layer_num_edges(g, (enum qc_edge_set)s);
            int64_t ER = ref->shape[1];
            T_EXPECT_EQ_I64(EL, ER, "%s: edge count", qc_edge_set_name((enum qc_edge_set)s));
            int64_t *ei = malloc((size_t)(2 * EL + 2) * sizeof(int64_t));
            qc_graph_layer_official(g, (enum qc_edge_set)s, ei, NULL);
            if (EL == ER) {
                int64_t *a = sorted_pairs(ei, EL), *b = sorted_pairs(ref->data, ER);
                int64_t diff = 0;
                for (int64_t i = 0; i < EL; i++)
                    diff += a[2 * i] != b[2 * i] || a[2 * i + 1] != b[2 * i + 1];
                T_EXPECT(diff == 0, "%s: %lld pairs differ from the official set",
                         qc_edge_set_name((enum qc_edge_set)s), (long long)diff);
                /* beyond the contract: the official order itself */
                T_EXPECT(memcmp(ei, ref->data, (size_t)(2 * EL) * sizeof(int64_t)) == 0,
                         "%s: same set but not the official order",
                         qc_edge_set_name((enum qc_edge_set)s));
                free(a);
                free(b);
            }
            free(ei);
            check_csr(g, (enum qc_edge_set)s);
            check_layer_views(g, (enum qc_edge_set)s);
        }
    }
    qc_graph_builder_destroy(gb);
    qc_batch_release(&batch);
out:
    qc_safetensors_close(bst);
    qc_safetensors_close(ost);
}

int main(void)
{
    QC_TEST ("graph: parity with the official edge sets (qcnet-parity-tiny)") {
        test_parity();
    }
    QC_TEST ("graph: fp32 helpers (wrap_angle, angle_between +0 rule, norm)") {
        test_helpers();
    }
    QC_TEST ("graph: collation offsets and TargetBuilder") {
        test_collate_offsets();
    }
    QC_TEST ("graph: every set equals the all-pairs reference (official caps)") {
        struct qc_graph_params p;
        qc_graph_params_default(&p);
        for (uint64_t k = 0; k < 4; k++)
            check_against_reference(qc_test_seed() + k, &p, 120.0, 1);
    }
    QC_TEST ("graph: the 300-neighbour rule where the cap binds (cap 3 and 1)") {
        struct qc_graph_params p;
        qc_graph_params_default(&p);
        p.max_num_neighbors = 3;
        ref_cap_bound = 0;
        for (uint64_t k = 0; k < 3; k++)
            check_against_reference(qc_test_seed() + 100 + k, &p, 60.0, 1);
        T_EXPECT(ref_cap_bound > 0, "cap 3 never bound");
        printf("  cap 3 bound for %lld queries\n", (long long)ref_cap_bound);
        p.max_num_neighbors = 1;
        ref_cap_bound = 0;
        check_against_reference(qc_test_seed() + 200, &p, 60.0, 1);
        T_EXPECT(ref_cap_bound > 0, "cap 1 never bound");
    }
    QC_TEST ("graph: small radii, long time span, few t2m steps") {
        struct qc_graph_params p;
        qc_graph_params_default(&p);
        p.pl2pl_radius = 20;
        p.pl2a_radius = 7.5;
        p.a2a_radius = 12;
        p.pl2m_radius = 33;
        p.a2m_radius = 0.5;
        p.time_span = 49;
        p.num_t2m_steps = 3;
        p.num_modes = 2;
        check_against_reference(qc_test_seed() + 300, &p, 200.0, 1);
    }
    QC_TEST ("graph: dense scenes beyond the official cap (cap 300 binds)") {
        struct qc_graph_params p;
        qc_graph_params_default(&p);
        T_EXPECT_EQ_I64(p.max_num_neighbors, 300, "the official cap");
        ref_cap_bound = 0;
        /* 100-680 polygons and 160-540 agents a scene in an 80 m square: more than 300
         * candidates within every radius */
        for (uint64_t k = 0; k < 2; k++)
            check_against_reference(qc_test_seed() + 400 + k, &p, 80.0, 20);
        printf("  cap 300 bound for %lld queries\n", (long long)ref_cap_bound);
        T_EXPECT(ref_cap_bound > 0, "the cap of 300 never bound: the scenes are not dense enough");
    }
    return qc_test_summary();
}
