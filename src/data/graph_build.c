/*
 * graph_build.c — builds every QCNet edge set of a collated batch (qc_graph.h) in CSR order
 * with its raw relative features.
 *
 * Every graph is block-diagonal per scene (and per step for pl2a/a2a), so each set is built
 * example by example, destinations ascending, which yields the global CSR order directly.
 * Sets whose official order is (src, dst) get a permutation by a stable counting sort on src.
 */
#include "qc_graph.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph_internal.h"
#include "qc_batch.h"

#define T_HIST QC_SCENE_HIST_STEPS /* 50 */
#define S_ALL  QC_SCENE_STEPS      /* 110 */

void qc_graph_params_default(struct qc_graph_params *p)
{
    p->pl2pl_radius = 150.0;
    p->pl2a_radius = 50.0;
    p->a2a_radius = 50.0;
    p->pl2m_radius = 150.0;
    p->a2m_radius = 150.0;
    p->time_span = 10;
    p->num_t2m_steps = 30;
    p->num_modes = 6;
    p->max_num_neighbors = 300;
}

// ---- growable edge buffers ---------------------------------------------------------------

struct ebuf {
    int64_t *src, *dst;
    float *attr;
    uint8_t *type;
    int64_t *dst_ptr;
    int64_t *perm;
    int64_t n, cap, cap_ptr, cap_perm;
    int nf;
};

struct qc_graph_builder {
    struct ebuf e[QC_EDGE_SET_COUNT];
    struct graph_grid grid;
    float *hc, *hs; /* (A·50) cos / sin of heading, agent-major */
    float *uc, *us; /* (P) cos / sin of polygon orientation */
    int64_t cap_polys;
    uint8_t *mask_dst; /* (A) any(predict_mask) */
    int64_t cap_agents;
    int64_t *hits; /* query results */
    int64_t cap_hits;
    int64_t *pairs; /* (src, dst) pairs awaiting transposition */
    int64_t cap_pairs;
    int64_t *count; /* per-destination counters / per-source counters */
    int64_t cap_count;
    float *qbuf; /* packed query positions */
    int64_t cap_qbuf;
    int64_t *qidx; /* query index → node index */
    int64_t cap_qidx;
    int64_t *typed; /* typed pl2pl keys of one scene */
    int64_t cap_typed;
};

static enum qc_status grow(void **p, int64_t *cap, int64_t need, size_t elem, const char *what)
{
    if (need <= *cap)
        return QC_OK;
    int64_t nc = *cap ? *cap : 1024;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, (size_t)nc * elem);
    if (!np)
        return qc_errorf(QC_ERR_NOMEM, "graph: out of memory growing %s to %lld entries", what,
                         (long long)nc);
    *p = np;
    *cap = nc;
    return QC_OK;
}

static enum qc_status ebuf_reserve(struct ebuf *e, int64_t extra)
{
    int64_t need = e->n + extra;
    if (need <= e->cap)
        return QC_OK;
    int64_t nc = e->cap ? e->cap : 4096;
    while (nc < need)
        nc *= 2;
    int64_t *s = realloc(e->src, (size_t)nc * sizeof(int64_t));
    if (!s)
        return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for %lld edges", (long long)nc);
    e->src = s;
    int64_t *d = realloc(e->dst, (size_t)nc * sizeof(int64_t));
    if (!d)
        return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for %lld edges", (long long)nc);
    e->dst = d;
    if (e->nf > 0) {
        float *a = realloc(e->attr, (size_t)nc * (size_t)e->nf * sizeof(float));
        if (!a)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for %lld edge features",
                             (long long)nc);
        e->attr = a;
    }
    if (e->type || e == NULL) {
        /* handled by the caller through ebuf_reserve_type */
    }
    e->cap = nc;
    return QC_OK;
}

/* pl2pl also carries a type per edge; its capacity follows the edge capacity. */
static enum qc_status ebuf_reserve_typed(struct ebuf *e, int64_t extra)
{
    int64_t old = e->cap;
    QC_TRY(ebuf_reserve(e, extra));
    if (e->cap != old || !e->type) {
        uint8_t *t = realloc(e->type, (size_t)e->cap);
        if (!t)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for edge types");
        e->type = t;
    }
    return QC_OK;
}

static inline float *ebuf_push(struct ebuf *e, int64_t src, int64_t dst)
{
    int64_t i = e->n++;
    e->src[i] = src;
    e->dst[i] = dst;
    return e->attr ? e->attr + i * e->nf : NULL;
}

enum qc_status qc_graph_builder_create(struct qc_graph_builder **out)
{
    struct qc_graph_builder *b = calloc(1, sizeof(*b));
    if (!b)
        return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for a builder");
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++)
        b->e[s].nf = qc_edge_set_num_feat((enum qc_edge_set)s);
    *out = b;
    return QC_OK;
}

void qc_graph_builder_destroy(struct qc_graph_builder *b)
{
    if (!b)
        return;
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
        struct ebuf *e = &b->e[s];
        free(e->src);
        free(e->dst);
        free(e->attr);
        free(e->type);
        free(e->dst_ptr);
        free(e->perm);
    }
    graph_grid_deinit(&b->grid);
    free(b->hc);
    free(b->hs);
    free(b->uc);
    free(b->us);
    free(b->mask_dst);
    free(b->hits);
    free(b->pairs);
    free(b->count);
    free(b->qbuf);
    free(b->qidx);
    free(b->typed);
    free(b);
}

// ---- CSR pointers and the official permutation --------------------------------------------

/* dst_ptr from edges sorted by dst. */
static enum qc_status finish_ptr(struct ebuf *e, int64_t num_dst)
{
    QC_TRY(grow((void **)&e->dst_ptr, &e->cap_ptr, num_dst + 1, sizeof(int64_t), "dst_ptr"));
    memset(e->dst_ptr, 0, (size_t)(num_dst + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < e->n; i++)
        e->dst_ptr[e->dst[i] + 1]++;
    for (int64_t d = 0; d < num_dst; d++)
        e->dst_ptr[d + 1] += e->dst_ptr[d];
    return QC_OK;
}

/* perm[i] = position of CSR edge i in (src, dst) lexicographic order: a stable counting sort
 * by src of edges already ordered by dst (then src). */
static enum qc_status finish_perm_src_major(struct qc_graph_builder *b, struct ebuf *e,
                                            int64_t num_src)
{
    QC_TRY(grow((void **)&e->perm, &e->cap_perm, e->n > 0 ? e->n : 1, sizeof(int64_t), "perm"));
    QC_TRY(grow((void **)&b->count, &b->cap_count, num_src + 1, sizeof(int64_t), "counters"));
    int64_t *cnt = b->count;
    memset(cnt, 0, (size_t)(num_src + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < e->n; i++)
        cnt[e->src[i] + 1]++;
    for (int64_t s = 0; s < num_src; s++)
        cnt[s + 1] += cnt[s];
    for (int64_t i = 0; i < e->n; i++)
        e->perm[i] = cnt[e->src[i]]++;
    return QC_OK;
}

/* CPU time of this thread: what a set costs, unaffected by other processes on the machine. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- the builder's per-batch context ----------------------------------------------------------

struct gctx {
    struct qc_graph_builder *b;
    const struct qc_graph_params *p;
    const struct qc_batch *bt;
    int64_t B, A, P, Pt, K;
};

static inline const float *apos(const struct gctx *c, int64_t a, int64_t t)
{
    return c->bt->position + (a * S_ALL + t) * 3;
}

static inline float ahead(const struct gctx *c, int64_t a, int64_t t)
{
    return c->bt->heading[a * S_ALL + t];
}

static inline bool avalid(const struct gctx *c, int64_t a, int64_t t)
{
    return c->bt->valid_mask[a * S_ALL + t] != 0;
}

/* The three-column feature of a relative position r = src − dst seen from dst's heading. */
static inline void feat3(float *f, float rx, float ry, float c0, float c1, float dangle)
{
    f[0] = graph_norm2(rx, ry);
    f[1] = graph_angle_between(c0, c1, rx, ry);
    f[2] = graph_wrap_angle(dangle);
}

// ---- pt2pl: the stored membership ---------------------------------------------------------

static enum qc_status build_pt2pl(struct gctx *c)
{
    struct qc_graph_builder *b = c->b;
    struct ebuf *e = &b->e[QC_EDGE_PT2PL];
    const struct qc_batch *bt = c->bt;
    int64_t Pt = c->Pt, P = c->P;
    const int64_t *srow = bt->pt2pl, *drow = bt->pt2pl + Pt;
    QC_TRY(ebuf_reserve(e, Pt));
    QC_TRY(grow((void **)&e->perm, &e->cap_perm, Pt > 0 ? Pt : 1, sizeof(int64_t), "perm"));
    QC_TRY(grow((void **)&b->count, &b->cap_count, P + 1, sizeof(int64_t), "counters"));
    int64_t *cnt = b->count;
    memset(cnt, 0, (size_t)(P + 1) * sizeof(int64_t));
    for (int64_t j = 0; j < Pt; j++) {
        if (srow[j] < 0 || srow[j] >= Pt || drow[j] < 0 || drow[j] >= P)
            return qc_errorf(QC_ERR_INVALID,
                             "graph: pt2pl edge %lld (%lld -> %lld) out of range (Pt %lld, P %lld)",
                             (long long)j, (long long)srow[j], (long long)drow[j], (long long)Pt,
                             (long long)P);
        cnt[drow[j] + 1]++;
    }
    for (int64_t d = 0; d < P; d++)
        cnt[d + 1] += cnt[d];
    /* Counting sort by dst; inv (stored in perm for now) is the CSR slot of stored edge j. */
    for (int64_t j = 0; j < Pt; j++) {
        int64_t i = cnt[drow[j]]++;
        e->src[i] = srow[j];
        e->dst[i] = drow[j];
        e->perm[i] = j;
    }
    e->n = Pt;
    /* Within a destination the sources must ascend (CSR order). Stored membership is in point
     * order, so this holds unless a writer reordered points; fix it up if so. */
    for (int64_t i = 0; i < Pt; i++) {
        if (i > 0 && e->dst[i] == e->dst[i - 1] && e->src[i] < e->src[i - 1]) {
            /* insertion step keeps (src, perm) pairs together */
            int64_t s = e->src[i], pj = e->perm[i], k = i;
            while (k > 0 && e->dst[k - 1] == e->dst[i] && e->src[k - 1] > s) {
                e->src[k] = e->src[k - 1];
                e->perm[k] = e->perm[k - 1];
                k--;
            }
            e->src[k] = s;
            e->perm[k] = pj;
        }
    }
    for (int64_t i = 0; i < Pt; i++) {
        int64_t q = e->src[i], p = e->dst[i];
        const float *pq = bt->pt_position + q * 3, *pp = bt->pl_position + p * 3;
        float phi = bt->pl_orientation[p];
        feat3(e->attr + i * 3, pq[0] - pp[0], pq[1] - pp[1], b->uc[p], b->us[p],
              bt->pt_orientation[q] - phi);
    }
    /* official order = stored order; the driver drops perm when it is the identity */
    return finish_ptr(e, P);
}

// ---- pl2pl: radius_graph ∪ typed, coalesced with max ------------------------------------------

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static enum qc_status build_pl2pl(struct gctx *c)
{
    struct qc_graph_builder *b = c->b;
    struct ebuf *e = &b->e[QC_EDGE_PL2PL];
    const struct qc_batch *bt = c->bt;
    const float r2 = graph_radius2(c->p->pl2pl_radius);
    const int64_t cap = c->p->max_num_neighbors + 1; /* radius_graph asks for k + 1 */
    const int64_t Et = bt->num_pl2pl;
    for (int64_t s = 0; s < c->B; s++) {
        int64_t p0 = bt->pl_ptr[s], p1 = bt->pl_ptr[s + 1], np = p1 - p0;
        if (np == 0)
            continue;
        /* typed edges of this scene as keys ((dst·np + src)·8 + type), sorted */
        int64_t e0 = bt->pl2pl_ptr[s], e1 = bt->pl2pl_ptr[s + 1], nt = e1 - e0;
        QC_TRY(grow((void **)&b->typed, &b->cap_typed, nt + 1, sizeof(int64_t), "typed edges"));
        for (int64_t k = 0; k < nt; k++) {
            int64_t js = bt->pl2pl_edge[e0 + k] - p0, jd = bt->pl2pl_edge[Et + e0 + k] - p0;
            if (js < 0 || js >= np || jd < 0 || jd >= np)
                return qc_errorf(
                    QC_ERR_INVALID,
                    "graph: scene %lld: typed pl2pl edge %lld (%lld -> %lld) "
                    "leaves the scene's polygons [%lld, %lld)",
                    (long long)s, (long long)(e0 + k), (long long)bt->pl2pl_edge[e0 + k],
                    (long long)bt->pl2pl_edge[Et + e0 + k], (long long)p0, (long long)p1);
            if (bt->pl2pl_type[e0 + k] >= QC_PL2PL_TYPES)
                return qc_errorf(QC_ERR_INVALID, "graph: scene %lld: pl2pl edge %lld: type %u > %d",
                                 (long long)s, (long long)(e0 + k),
                                 (unsigned)bt->pl2pl_type[e0 + k], QC_PL2PL_TYPES - 1);
            b->typed[k] = (jd * np + js) * 8 + bt->pl2pl_type[e0 + k];
        }
        qsort(b->typed, (size_t)nt, sizeof(int64_t), cmp_i64);

        const float *pts = bt->pl_position + p0 * 3;
        QC_TRY(graph_grid_build(&b->grid, pts, 3, np, pts, 3, np, c->p->pl2pl_radius));
        QC_TRY(grow((void **)&b->hits, &b->cap_hits, np, sizeof(int64_t), "query results"));
        int64_t tk = 0;
        for (int64_t i = 0; i < np; i++) {
            int64_t nh = graph_grid_query(&b->grid, pts, 3, pts[i * 3], pts[i * 3 + 1], r2, cap,
                                          true, b->hits);
            QC_TRY(ebuf_reserve_typed(e, nh + nt));
            /* merge the radius sources (type 0, self removed) with the typed ones of dst i */
            int64_t h = 0;
            for (;;) {
                while (h < nh && b->hits[h] == i)
                    h++;
                bool have_t = tk < nt && b->typed[tk] / 8 / np == i;
                int64_t ts = have_t ? (b->typed[tk] / 8) % np : INT64_MAX;
                int64_t rs = h < nh ? b->hits[h] : INT64_MAX;
                if (!have_t && h >= nh)
                    break;
                int64_t j = ts < rs ? ts : rs;
                uint8_t ty = 0;
                if (rs == j)
                    h++;
                while (tk < nt && b->typed[tk] / 8 / np == i && (b->typed[tk] / 8) % np == j) {
                    uint8_t t = (uint8_t)(b->typed[tk] % 8);
                    ty = t > ty ? t : ty; /* coalesce(reduce='max') */
                    tk++;
                }
                int64_t gi = p0 + i, gj = p0 + j;
                e->type[e->n] = ty;
                float *f = ebuf_push(e, gj, gi);
                const float *pj = bt->pl_position + gj * 3, *pi = bt->pl_position + gi * 3;
                float phi = bt->pl_orientation[gi];
                feat3(f, pj[0] - pi[0], pj[1] - pi[1], b->uc[gi], b->us[gi],
                      bt->pl_orientation[gj] - phi);
            }
        }
    }
    QC_TRY(finish_ptr(e, c->P));
    return finish_perm_src_major(b, e, c->P);
}

// ---- t: temporal edges within an agent ----------------------------------------------------

static enum qc_status build_t(struct gctx *c)
{
    struct qc_graph_builder *b = c->b;
    struct ebuf *e = &b->e[QC_EDGE_T];
    const int64_t span = c->p->time_span;
    for (int64_t a = 0; a < c->A; a++) {
        QC_TRY(ebuf_reserve(e, T_HIST * (span < T_HIST ? span : T_HIST)));
        for (int64_t t = 0; t < T_HIST; t++) {
            if (!avalid(c, a, t))
                continue;
            const float *pt = apos(c, a, t);
            float c0 = b->hc[a * T_HIST + t], c1 = b->hs[a * T_HIST + t], th = ahead(c, a, t);
            int64_t s0 = t - span < 0 ? 0 : t - span;
            for (int64_t s = s0; s < t; s++) {
                if (!avalid(c, a, s))
                    continue;
                const float *ps = apos(c, a, s);
                float *f = ebuf_push(e, a * T_HIST + s, a * T_HIST + t);
                feat3(f, ps[0] - pt[0], ps[1] - pt[1], c0, c1, ahead(c, a, s) - th);
                f[3] = (float)((a * T_HIST + s) - (a * T_HIST + t));
            }
        }
    }
    QC_TRY(finish_ptr(e, T_HIST * c->A));
    return finish_perm_src_major(b, e, T_HIST * c->A);
}

// ---- radius(x = agents, y = polygons): pl2a and pl2m ----------------------------------------

/* One radius example: candidates are agents [a0, a1) at step t, queries polygons [p0, p1).
 * Accepted (polygon, agent) pairs whose agent passes keep() are transposed to CSR by agent and
 * appended to e with src = src_base + p, dst = dst_base + a. */
static enum qc_status radius_pl_to_agents(struct gctx *c, struct ebuf *e, int64_t t, int64_t a0,
                                          int64_t a1, int64_t p0, int64_t p1, double r,
                                          int64_t src_base, int64_t dst_base, bool decoder)
{
    struct qc_graph_builder *b = c->b;
    const struct qc_batch *bt = c->bt;
    int64_t na = a1 - a0, np = p1 - p0;
    if (na == 0 || np == 0)
        return QC_OK;
    const float *apts = apos(c, a0, t);
    const int64_t astride = S_ALL * 3;
    const float *ppts = bt->pl_position + p0 * 3;
    QC_TRY(graph_grid_build(&b->grid, apts, astride, na, ppts, 3, np, r));
    QC_TRY(grow((void **)&b->hits, &b->cap_hits, na, sizeof(int64_t), "query results"));
    QC_TRY(grow((void **)&b->count, &b->cap_count, na + 1, sizeof(int64_t), "counters"));
    int64_t *cnt = b->count;
    memset(cnt, 0, (size_t)(na + 1) * sizeof(int64_t));
    const float r2 = graph_radius2(r);
    const int64_t cap = c->p->max_num_neighbors;
    int64_t npairs = 0;
    for (int64_t p = 0; p < np; p++) {
        int64_t nh = graph_grid_query(&b->grid, apts, astride, ppts[p * 3], ppts[p * 3 + 1], r2,
                                      cap, false, b->hits);
        QC_TRY(grow((void **)&b->pairs, &b->cap_pairs, 2 * (npairs + nh), sizeof(int64_t),
                    "edge pairs"));
        for (int64_t h = 0; h < nh; h++) {
            int64_t al = b->hits[h], a = a0 + al;
            /* the mask applies after the cap (QCNET.md §4.1) */
            bool keep = decoder ? b->mask_dst[a] != 0 : avalid(c, a, t);
            if (!keep)
                continue;
            b->pairs[2 * npairs] = p;
            b->pairs[2 * npairs + 1] = al;
            npairs++;
            cnt[al + 1]++;
        }
    }
    for (int64_t al = 0; al < na; al++)
        cnt[al + 1] += cnt[al];
    QC_TRY(ebuf_reserve(e, npairs));
    int64_t base = e->n;
    /* Polygons were visited in ascending order, so each agent's sources come out ascending. */
    for (int64_t k = 0; k < npairs; k++) {
        int64_t p = b->pairs[2 * k], al = b->pairs[2 * k + 1];
        int64_t i = base + cnt[al]++;
        int64_t a = a0 + al, gp = p0 + p;
        e->src[i] = src_base + gp;
        e->dst[i] = dst_base + a;
        const float *pa = apos(c, a, t), *pp = bt->pl_position + gp * 3;
        feat3(e->attr + i * 3, pp[0] - pa[0], pp[1] - pa[1], b->hc[a * T_HIST + t],
              b->hs[a * T_HIST + t], bt->pl_orientation[gp] - ahead(c, a, t));
    }
    e->n += npairs;
    return QC_OK;
}

static enum qc_status build_pl2a(struct gctx *c)
{
    struct ebuf *e = &c->b->e[QC_EDGE_PL2A];
    const struct qc_batch *bt = c->bt;
    for (int64_t t = 0; t < T_HIST; t++)
        for (int64_t s = 0; s < c->B; s++)
            QC_TRY(radius_pl_to_agents(c, e, t, bt->agent_ptr[s], bt->agent_ptr[s + 1],
                                       bt->pl_ptr[s], bt->pl_ptr[s + 1], c->p->pl2a_radius,
                                       t * c->P, t * c->A, false));
    QC_TRY(finish_ptr(e, T_HIST * c->A));
    return finish_perm_src_major(c->b, e, T_HIST * c->P);
}

static enum qc_status build_pl2m(struct gctx *c)
{
    struct ebuf *e = &c->b->e[QC_EDGE_PL2M];
    const struct qc_batch *bt = c->bt;
    for (int64_t s = 0; s < c->B; s++)
        QC_TRY(radius_pl_to_agents(c, e, T_HIST - 1, bt->agent_ptr[s], bt->agent_ptr[s + 1],
                                   bt->pl_ptr[s], bt->pl_ptr[s + 1], c->p->pl2m_radius, 0, 0,
                                   true));
    QC_TRY(finish_ptr(e, c->A));
    return finish_perm_src_major(c->b, e, c->P);
}

// ---- radius_graph over agents at one step: a2a and a2m --------------------------------------

/* radius_graph(x = agents [a0, a1) at step t, r, loop = False, k) restricted to the queries
 * that survive the destination mask, then the source mask. Appends in CSR order with
 * src = base + b, dst = base + a; writes features (decoder sets use heading at t = 49). */
static enum qc_status radius_graph_agents(struct gctx *c, struct ebuf *e, int64_t t, int64_t a0,
                                          int64_t a1, double r, int64_t base, bool decoder)
{
    struct qc_graph_builder *b = c->b;
    int64_t na = a1 - a0;
    if (na == 0)
        return QC_OK;
    const float *apts = apos(c, a0, t);
    const int64_t astride = S_ALL * 3;
    /* queries: the agents whose edges survive the destination mask (the cap is per query, so
     * dropping the others changes nothing) */
    QC_TRY(grow((void **)&b->qbuf, &b->cap_qbuf, 2 * na, sizeof(float), "queries"));
    QC_TRY(grow((void **)&b->qidx, &b->cap_qidx, na, sizeof(int64_t), "queries"));
    int64_t nq = 0;
    for (int64_t al = 0; al < na; al++) {
        int64_t a = a0 + al;
        bool q = decoder ? b->mask_dst[a] != 0 : avalid(c, a, t);
        if (!q)
            continue;
        b->qbuf[2 * nq] = apts[al * astride];
        b->qbuf[2 * nq + 1] = apts[al * astride + 1];
        b->qidx[nq++] = al;
    }
    if (nq == 0)
        return QC_OK;
    QC_TRY(graph_grid_build(&b->grid, apts, astride, na, b->qbuf, 2, nq, r));
    QC_TRY(grow((void **)&b->hits, &b->cap_hits, na, sizeof(int64_t), "query results"));
    const float r2 = graph_radius2(r);
    const int64_t cap = c->p->max_num_neighbors + 1;
    for (int64_t q = 0; q < nq; q++) {
        int64_t al = b->qidx[q], a = a0 + al;
        int64_t nh = graph_grid_query(&b->grid, apts, astride, b->qbuf[2 * q], b->qbuf[2 * q + 1],
                                      r2, cap, true, b->hits);
        QC_TRY(ebuf_reserve(e, nh));
        const float *pa = apos(c, a, t);
        float c0 = b->hc[a * T_HIST + t], c1 = b->hs[a * T_HIST + t], th = ahead(c, a, t);
        for (int64_t h = 0; h < nh; h++) {
            int64_t bl = b->hits[h], bb = a0 + bl;
            if (bl == al || !avalid(c, bb, t)) /* self removed; source mask (subgraph) */
                continue;
            const float *pb = apos(c, bb, t);
            float *f = ebuf_push(e, base + bb, base + a);
            feat3(f, pb[0] - pa[0], pb[1] - pa[1], c0, c1, ahead(c, bb, t) - th);
        }
    }
    return QC_OK;
}

static enum qc_status build_a2a(struct gctx *c)
{
    struct ebuf *e = &c->b->e[QC_EDGE_A2A];
    for (int64_t t = 0; t < T_HIST; t++)
        for (int64_t s = 0; s < c->B; s++)
            QC_TRY(radius_graph_agents(c, e, t, c->bt->agent_ptr[s], c->bt->agent_ptr[s + 1],
                                       c->p->a2a_radius, t * c->A, false));
    return finish_ptr(e, T_HIST * c->A);
}

static enum qc_status build_a2m(struct gctx *c)
{
    struct ebuf *e = &c->b->e[QC_EDGE_A2M];
    for (int64_t s = 0; s < c->B; s++)
        QC_TRY(radius_graph_agents(c, e, T_HIST - 1, c->bt->agent_ptr[s], c->bt->agent_ptr[s + 1],
                                   c->p->a2m_radius, 0, true));
    return finish_ptr(e, c->A);
}

// ---- t2m and m2m: dense masks ----------------------------------------------------------------

static enum qc_status build_t2m(struct gctx *c)
{
    struct qc_graph_builder *b = c->b;
    struct ebuf *e = &b->e[QC_EDGE_T2M];
    const int64_t t0 = T_HIST - c->p->num_t2m_steps;
    for (int64_t a = 0; a < c->A; a++) {
        if (!b->mask_dst[a])
            continue;
        QC_TRY(ebuf_reserve(e, T_HIST));
        const float *pm = apos(c, a, T_HIST - 1);
        float c0 = b->hc[a * T_HIST + T_HIST - 1], c1 = b->hs[a * T_HIST + T_HIST - 1];
        float thm = ahead(c, a, T_HIST - 1);
        for (int64_t t = t0; t < T_HIST; t++) {
            if (!avalid(c, a, t))
                continue;
            int64_t src = a * T_HIST + t;
            const float *pt = apos(c, a, t);
            float *f = ebuf_push(e, src, a);
            feat3(f, pt[0] - pm[0], pt[1] - pm[1], c0, c1, ahead(c, a, t) - thm);
            f[3] = (float)((src % T_HIST) - T_HIST + 1);
        }
    }
    return finish_ptr(e, c->A);
}

static enum qc_status build_m2m(struct gctx *c)
{
    struct qc_graph_builder *b = c->b;
    struct ebuf *e = &b->e[QC_EDGE_M2M];
    const int64_t K = c->K;
    for (int64_t a = 0; a < c->A; a++) {
        if (!b->mask_dst[a])
            continue;
        QC_TRY(ebuf_reserve(e, K * K));
        for (int64_t j = 0; j < K; j++)
            for (int64_t i = 0; i < K; i++)
                ebuf_push(e, a * K + i, a * K + j);
    }
    QC_TRY(finish_ptr(e, K * c->A));
    return finish_perm_src_major(b, e, K * c->A);
}

// ---- driver --------------------------------------------------------------------------------

static enum qc_status check_params(const struct qc_graph_params *p)
{
    if (p->time_span < 1 || p->num_t2m_steps < 1 || p->num_t2m_steps > T_HIST || p->num_modes < 1 ||
        p->max_num_neighbors < 1 || !(p->pl2pl_radius >= 0) || !(p->pl2a_radius >= 0) ||
        !(p->a2a_radius >= 0) || !(p->pl2m_radius >= 0) || !(p->a2m_radius >= 0))
        return qc_errorf(QC_ERR_INVALID,
                         "graph: bad parameters (time_span %lld, num_t2m_steps %lld in [1, %d], "
                         "num_modes %lld, max_num_neighbors %lld, radii >= 0)",
                         (long long)p->time_span, (long long)p->num_t2m_steps, T_HIST,
                         (long long)p->num_modes, (long long)p->max_num_neighbors);
    return QC_OK;
}

enum qc_status qc_graph_build(struct qc_graph_builder *b, const struct qc_graph_params *p,
                              const struct qc_batch *batch, struct qc_graph *out)
{
    QC_TRY(check_params(p));
    struct gctx c = {.b = b,
                     .p = p,
                     .bt = batch,
                     .B = batch->num_scenes,
                     .A = batch->num_agents,
                     .P = batch->num_polygons,
                     .Pt = batch->num_points,
                     .K = p->num_modes};
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++)
        b->e[s].n = 0;
    /* per agent-step heading vectors and the decoder destination mask */
    if (c.A > b->cap_agents) {
        float *hc = realloc(b->hc, (size_t)(c.A * T_HIST) * sizeof(float));
        if (hc)
            b->hc = hc;
        float *hs = realloc(b->hs, (size_t)(c.A * T_HIST) * sizeof(float));
        if (hs)
            b->hs = hs;
        uint8_t *md = realloc(b->mask_dst, (size_t)c.A);
        if (md)
            b->mask_dst = md;
        if (!hc || !hs || !md)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for %lld agents", (long long)c.A);
        b->cap_agents = c.A;
    }
    if (c.P > b->cap_polys) {
        float *uc = realloc(b->uc, (size_t)c.P * sizeof(float));
        if (uc)
            b->uc = uc;
        float *us = realloc(b->us, (size_t)c.P * sizeof(float));
        if (us)
            b->us = us;
        if (!uc || !us)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for %lld polygons",
                             (long long)c.P);
        b->cap_polys = c.P;
    }
    for (int64_t q = 0; q < c.P; q++) {
        b->uc[q] = cosf(batch->pl_orientation[q]);
        b->us[q] = sinf(batch->pl_orientation[q]);
    }
    for (int64_t a = 0; a < c.A; a++) {
        for (int64_t t = 0; t < T_HIST; t++) {
            float th = ahead(&c, a, t);
            b->hc[a * T_HIST + t] = cosf(th);
            b->hs[a * T_HIST + t] = sinf(th);
        }
        uint8_t any = 0;
        for (int64_t t = 0; t < S_ALL; t++)
            any |= batch->predict_mask[a * S_ALL + t];
        b->mask_dst[a] = any ? 1 : 0;
    }

    static enum qc_status (*const builders[QC_EDGE_SET_COUNT])(struct gctx *) = {
        [QC_EDGE_PT2PL] = build_pt2pl, [QC_EDGE_PL2PL] = build_pl2pl, [QC_EDGE_T] = build_t,
        [QC_EDGE_PL2A] = build_pl2a,   [QC_EDGE_A2A] = build_a2a,     [QC_EDGE_T2M] = build_t2m,
        [QC_EDGE_PL2M] = build_pl2m,   [QC_EDGE_A2M] = build_a2m,     [QC_EDGE_M2M] = build_m2m,
    };
    static const bool has_perm[QC_EDGE_SET_COUNT] = {
        [QC_EDGE_PL2PL] = true, [QC_EDGE_T] = true,   [QC_EDGE_PL2A] = true,
        [QC_EDGE_PL2M] = true,  [QC_EDGE_M2M] = true,
    };
    memset(out, 0, sizeof(*out));
    out->num_scenes = c.B;
    out->num_agents = c.A;
    out->num_polygons = c.P;
    out->num_points = c.Pt;
    out->num_modes = c.K;
    const int64_t nsrc[QC_EDGE_SET_COUNT] = {
        c.Pt, c.P, T_HIST * c.A, T_HIST * c.P, T_HIST * c.A, T_HIST * c.A, c.P, c.A, c.K * c.A};
    const int64_t ndst[QC_EDGE_SET_COUNT] = {c.P, c.P, T_HIST * c.A, T_HIST * c.A, T_HIST * c.A,
                                             c.A, c.A, c.A,          c.K * c.A};
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
        double t0 = now_s();
        QC_TRY(builders[s](&c));
        out->build_seconds[s] = now_s() - t0;
        struct ebuf *e = &b->e[s];
        struct qc_edges *o = &out->e[s];
        o->num_edges = e->n;
        o->num_src = nsrc[s];
        o->num_dst = ndst[s];
        o->num_feat = e->nf;
        o->src = e->src;
        o->dst = e->dst;
        o->dst_ptr = e->dst_ptr;
        o->attr = e->nf > 0 ? e->attr : NULL;
        o->type = s == QC_EDGE_PL2PL ? e->type : NULL;
        o->perm = NULL;
        if (has_perm[s] || s == QC_EDGE_PT2PL) {
            bool identity = true;
            for (int64_t i = 0; identity && i < e->n; i++)
                identity = e->perm[i] == i;
            o->perm = identity ? NULL : e->perm;
        }
    }
    return QC_OK;
}
