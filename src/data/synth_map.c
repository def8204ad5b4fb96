/*
 * synth_map.c — the synthetic road network: a grid of straight two-way roads with intersection
 * boxes, lane segments of ~20 m, straight and turning connectors, crosswalks and pedestrian
 * paths; cropped to the polygons nearest the scene centre (as AV2 maps are cropped around the
 * scenario) and exported as QCNet map polygons and points (QCNET.md §7.3).
 *
 * Invariants: parallel lanes of one road section share the section's split points, so their
 * segments have equal centre-vertex counts; every link (pred/succ/left/right) joins two lanes;
 * crosswalks never get typed edges.
 */
#include "synth_internal.h"

#include <math.h> /* sqrt, floor: exact or correctly rounded */
#include <stdlib.h>
#include <string.h>

struct road {
    int axis;          /* 0: along x at y = c; 1: along y at x = c */
    double c;          /* m */
    int k;             /* vehicle lanes per direction */
    double w;          /* m, vehicle lane width */
    int bike;          /* 1: a bike lane outside the vehicle lanes, each direction */
    double bw;         /* m, bike lane width */
    double half_width; /* m, centre line to the outer edge */
    uint8_t centre_mark;
    int bus; /* 1: the outermost vehicle lane is a BUS lane */
};

struct box {
    int road[2];    /* [0] the axis-0 road, [1] the axis-1 road */
    double t[2];    /* centre along road[0] (x) and road[1] (y) */
    double half[2]; /* half extent along road[0] and along road[1] */
    double cw_w;    /* crosswalk width, m */
};

struct section {
    int road;
    double lo, hi;      /* along the road axis */
    int box_lo, box_hi; /* box at each end, -1 at the map edge */
    int32_t base;       /* first lane index */
    int nseg, nl;       /* segments per lane, lanes per direction */
};

struct net {
    struct road roads[16];
    int nroads;
    struct box boxes[64];
    int nboxes;
    struct section secs[128];
    int nsecs;
};

static struct synth_vec road_dir(const struct road *r)
{
    return r->axis == 0 ? synth_v(1, 0) : synth_v(0, 1);
}

static struct synth_vec road_pt(const struct road *r, double t, double lat)
{
    /* lat is along the road's left normal (+90 degrees from its axis direction) */
    return r->axis == 0 ? synth_v(t, r->c + lat) : synth_v(r->c - lat, t);
}

// ---- growable arrays ------------------------------------------------------------------------

static enum qc_status grow(void **p, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap)
        return QC_OK;
    int64_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q)
        return qc_errorf(QC_ERR_NOMEM, "synth: out of memory building the road network");
    *p = q;
    *cap = c;
    return QC_OK;
}

static enum qc_status add_vert(struct synth_map *m, struct synth_vec v)
{
    QC_TRY(grow((void **)&m->verts, &m->cap_verts, m->nverts + 1, sizeof(*m->verts)));
    m->verts[m->nverts++] = v;
    return QC_OK;
}

static enum qc_status new_lane(struct synth_map *m, int32_t *out)
{
    QC_TRY(grow((void **)&m->lanes, &m->cap_lanes, m->nlanes + 1, sizeof(*m->lanes)));
    struct synth_lane *l = &m->lanes[m->nlanes];
    memset(l, 0, sizeof(*l));
    l->left_nb = l->right_nb = l->next_in_section = l->out_index = -1;
    l->is_intersection = 1;
    *out = (int32_t)m->nlanes++;
    return QC_OK;
}

static void link(struct synth_map *m, int32_t from, int32_t to)
{
    struct synth_lane *a = &m->lanes[from], *b = &m->lanes[to];
    if (a->nsucc < SYNTH_MAX_LINKS)
        a->succ[a->nsucc++] = to;
    if (b->npred < SYNTH_MAX_LINKS)
        b->pred[b->npred++] = from;
}

static double polyline_length(const struct synth_vec *v, int n)
{
    double len = 0;
    for (int i = 1; i < n; i++)
        len += synth_norm(synth_sub(v[i], v[i - 1]));
    return len;
}

static int count_for(double len, double spacing, int min)
{
    const int n = (int)floor(len / spacing + 0.5) + 1;
    return n < min ? min : n;
}

// ---- straight lane segments -----------------------------------------------------------------

/* One straight segment of road r from t = ta to tb (travel direction), centre at lateral
 * offset `lat` (along the road's left normal), width w. */
static enum qc_status straight_segment(struct synth_map *m, const struct road *r, double ta,
                                       double tb, double lat, double w, int nc,
                                       struct synth_rng *rng, int32_t *out)
{
    int32_t id;
    QC_TRY(new_lane(m, &id));
    const double dir = tb > ta ? 1.0 : -1.0; /* left of travel is +normal when dir > 0 */
    const double seglen = dir * (tb - ta);
    struct synth_lane *l = &m->lanes[id];
    l->width = w;
    l->c0 = (int32_t)m->nverts;
    l->nc = nc;
    for (int i = 0; i < nc; i++)
        QC_TRY(add_vert(m, road_pt(r, ta + (tb - ta) * i / (nc - 1), lat)));
    for (int side = 0; side < 2; side++) {
        const int nb = count_for(seglen, synth_rng_range(rng, 4.5, 7.5), 2);
        const double blat = lat + (side == 0 ? 0.5 : -0.5) * w * dir;
        l = &m->lanes[id];
        if (side == 0) {
            l->l0 = (int32_t)m->nverts;
            l->nl = nb;
        } else {
            l->r0 = (int32_t)m->nverts;
            l->nr = nb;
        }
        for (int i = 0; i < nb; i++)
            QC_TRY(add_vert(m, road_pt(r, ta + (tb - ta) * i / (nb - 1), blat)));
    }
    l = &m->lanes[id];
    l->length = seglen;
    *out = id;
    return QC_OK;
}

/* Lane index of (direction index di: 0 = +axis, 1 = -axis; lane m; travel segment j). */
static int32_t sec_lane(const struct section *s, int di, int mi, int j)
{
    if (mi < 0 || mi >= s->nl || j < 0 || j >= s->nseg)
        return -1;
    return s->base + (int32_t)((di * s->nl + mi) * s->nseg + j);
}

static enum qc_status build_section(struct synth_map *m, struct net *n, struct section *s,
                                    struct synth_rng *rng)
{
    const struct road *r = &n->roads[s->road];
    const double len = s->hi - s->lo;
    const double target = synth_rng_range(rng, 16.0, 24.0);
    s->nseg = (int)floor(len / target + 0.5);
    if (s->nseg < 1)
        s->nseg = 1;
    s->nl = r->k + r->bike;
    s->base = (int32_t)m->nlanes;
    const double seglen = len / s->nseg;
    const int nc = count_for(seglen, 1.8, 2);
    for (int di = 0; di < 2; di++) {
        const double sign = di == 0 ? 1.0 : -1.0;
        for (int mi = 0; mi < s->nl; mi++) {
            const int is_bike = mi == r->k;
            const double w = is_bike ? r->bw : r->w;
            const double off = is_bike ? -(r->k * r->w + 0.5 * r->bw) : -(mi + 0.5) * r->w;
            for (int j = 0; j < s->nseg; j++) {
                double ta, tb;
                if (di == 0) {
                    ta = s->lo + seglen * j;
                    tb = s->lo + seglen * (j + 1);
                } else {
                    ta = s->hi - seglen * j;
                    tb = s->hi - seglen * (j + 1);
                }
                int32_t id;
                QC_TRY(straight_segment(m, r, ta, tb, sign * off, w, nc, rng, &id));
                struct synth_lane *l = &m->lanes[id];
                l->type = is_bike ? 1 : (r->bus && mi == r->k - 1 ? 2 : 0);
                l->left_mark = is_bike ? SYNTH_MARK_SOLID_WHITE
                                       : (mi == 0 ? r->centre_mark : SYNTH_MARK_DASHED_WHITE);
                l->right_mark =
                    is_bike
                        ? SYNTH_MARK_NONE
                        : (mi + 1 < r->k ? SYNTH_MARK_DASHED_WHITE
                                         : (r->bike ? SYNTH_MARK_SOLID_WHITE : SYNTH_MARK_NONE));
            }
        }
    }
    for (int di = 0; di < 2; di++)
        for (int mi = 0; mi < s->nl; mi++)
            for (int j = 0; j < s->nseg; j++) {
                struct synth_lane *l = &m->lanes[sec_lane(s, di, mi, j)];
                l->left_nb = sec_lane(s, di, mi - 1, j);
                l->right_nb = sec_lane(s, di, mi + 1, j);
                l->next_in_section = sec_lane(s, di, mi, j + 1);
                if (j + 1 < s->nseg)
                    link(m, sec_lane(s, di, mi, j), sec_lane(s, di, mi, j + 1));
            }
    return QC_OK;
}

// ---- intersections --------------------------------------------------------------------------

/* The section of road ri whose hi end (want_hi) or lo end touches box b. */
static const struct section *section_at(const struct net *n, int ri, int b, int want_hi)
{
    for (int i = 0; i < n->nsecs; i++) {
        const struct section *s = &n->secs[i];
        if (s->road == ri && (want_hi ? s->box_hi : s->box_lo) == b)
            return s;
    }
    return NULL;
}

/* Lane m of road ri, direction sign d, that enters (in = 1) or leaves box b. */
static int32_t box_lane(const struct net *n, int b, int ri, int d, int mi, int in)
{
    /* +axis travel enters from the section below (its hi end) and leaves into the one above;
     * -axis travel the other way round. */
    const int want_hi = (d > 0) == (in != 0);
    const struct section *s = section_at(n, ri, b, want_hi);
    if (!s)
        return -1;
    return sec_lane(s, d > 0 ? 0 : 1, mi, in ? s->nseg - 1 : 0);
}

static struct synth_vec bezier(struct synth_vec p0, struct synth_vec p1, struct synth_vec p2,
                               double t)
{
    const double a = (1 - t) * (1 - t), b = 2 * (1 - t) * t, c = t * t;
    return synth_v(a * p0.x + b * p1.x + c * p2.x, a * p0.y + b * p1.y + c * p2.y);
}

static struct synth_vec bezier_tangent(struct synth_vec p0, struct synth_vec p1,
                                       struct synth_vec p2, double t)
{
    return synth_add(synth_scale(synth_sub(p1, p0), 2 * (1 - t)),
                     synth_scale(synth_sub(p2, p1), 2 * t));
}

/* A connector lane from the end of lane `from` to the start of lane `to`: a straight line or a
 * quadratic Bezier whose control point is where the two travel lines cross. */
static enum qc_status connector(struct synth_map *m, int32_t from, int32_t to)
{
    const struct synth_lane *a = &m->lanes[from], *b = &m->lanes[to];
    const struct synth_vec p0 = m->verts[a->c0 + a->nc - 1], p2 = m->verts[b->c0];
    const struct synth_vec u_in = synth_unit(synth_sub(p0, m->verts[a->c0 + a->nc - 2]));
    const struct synth_vec p1 =
        synth_add(p0, synth_scale(u_in, synth_dot(synth_sub(p2, p0), u_in)));
    const double w = a->width;
    const uint8_t type = a->type;
    struct synth_vec probe[33];
    for (int i = 0; i <= 32; i++)
        probe[i] = bezier(p0, p1, p2, i / 32.0);
    const double len = polyline_length(probe, 33);
    int32_t id;
    QC_TRY(new_lane(m, &id));
    const int nc = count_for(len, 1.8, 3);
    const int nb = count_for(len, 6.0, 3);
    m->lanes[id].c0 = (int32_t)m->nverts;
    m->lanes[id].nc = nc;
    for (int i = 0; i < nc; i++)
        QC_TRY(add_vert(m, bezier(p0, p1, p2, (double)i / (nc - 1))));
    for (int side = 0; side < 2; side++) {
        if (side == 0) {
            m->lanes[id].l0 = (int32_t)m->nverts;
            m->lanes[id].nl = nb;
        } else {
            m->lanes[id].r0 = (int32_t)m->nverts;
            m->lanes[id].nr = nb;
        }
        for (int i = 0; i < nb; i++) {
            const double t = (double)i / (nb - 1);
            const struct synth_vec nrm = synth_left(synth_unit(bezier_tangent(p0, p1, p2, t)));
            QC_TRY(add_vert(m, synth_add(bezier(p0, p1, p2, t),
                                         synth_scale(nrm, (side == 0 ? 0.5 : -0.5) * w))));
        }
    }
    struct synth_lane *l = &m->lanes[id];
    l->type = type;
    l->is_intersection = 0;
    l->left_mark = l->right_mark = SYNTH_MARK_NONE;
    l->width = w;
    l->length = polyline_length(m->verts + l->c0, nc);
    link(m, from, id);
    link(m, id, to);
    return QC_OK;
}

static enum qc_status build_box(struct synth_map *m, struct net *n, int bi, struct synth_rng *rng)
{
    const struct box *b = &n->boxes[bi];
    for (int ax = 0; ax < 2; ax++) {
        const int ri = b->road[ax], qi = b->road[1 - ax];
        const struct road *r = &n->roads[ri], *q = &n->roads[qi];
        for (int d = -1; d <= 1; d += 2) {
            const struct synth_vec u = synth_scale(road_dir(r), d);
            /* straight through, vehicle lanes and the bike lane */
            for (int mi = 0; mi < r->k + r->bike; mi++) {
                const int32_t in = box_lane(n, bi, ri, d, mi, 1),
                              out = box_lane(n, bi, ri, d, mi, 0);
                if (in >= 0 && out >= 0)
                    QC_TRY(connector(m, in, out));
            }
            /* right turn: outermost vehicle lane to the crossing road's outermost; left turn:
             * innermost to innermost (most AV2 intersections allow both) */
            const struct synth_vec right = synth_v(u.y, -u.x), left = synth_left(u);
            const int d_right = synth_dot(road_dir(q), right) > 0 ? 1 : -1;
            const int d_left = synth_dot(road_dir(q), left) > 0 ? 1 : -1;
            const int32_t in_r = box_lane(n, bi, ri, d, r->k - 1, 1);
            const int32_t out_r = box_lane(n, bi, qi, d_right, q->k - 1, 0);
            if (in_r >= 0 && out_r >= 0)
                QC_TRY(connector(m, in_r, out_r));
            const int32_t in_l = box_lane(n, bi, ri, d, 0, 1);
            const int32_t out_l = box_lane(n, bi, qi, d_left, 0, 0);
            if (in_l >= 0 && out_l >= 0 && synth_rng_chance(rng, 0.85))
                QC_TRY(connector(m, in_l, out_l));
        }
        /* crosswalks across road r on both arms, inside the box beyond the crossing road */
        for (int side = -1; side <= 1; side += 2) {
            if (!synth_rng_chance(rng, 0.85))
                continue;
            const double tc = b->t[ax] + side * (q->half_width + 2.0 + 0.5 * b->cw_w);
            const double t1 = tc - 0.5 * b->cw_w, t2 = tc + 0.5 * b->cw_w;
            const double wl = r->half_width + 0.5;
            QC_TRY(grow((void **)&m->cws, &m->cap_cws, m->ncws + 1, sizeof(*m->cws)));
            struct synth_crosswalk *c = &m->cws[m->ncws++];
            const double flip = synth_rng_chance(rng, 0.5) ? 1.0 : -1.0;
            c->e1[0] = road_pt(r, t1, -flip * wl);
            c->e1[1] = road_pt(r, t1, flip * wl);
            c->e2[0] = road_pt(r, t2, -flip * wl);
            c->e2[1] = road_pt(r, t2, flip * wl);
            if (synth_rng_chance(rng, 0.5)) {
                struct synth_vec t0 = c->e1[0], tt = c->e1[1];
                c->e1[0] = c->e2[0];
                c->e1[1] = c->e2[1];
                c->e2[0] = t0;
                c->e2[1] = tt;
            }
            c->out_index = -1;
            QC_TRY(grow((void **)&m->walks, &m->cap_walks, m->nwalks + 1, sizeof(*m->walks)));
            m->walks[m->nwalks].a = road_pt(r, tc, -(r->half_width + 2.5));
            m->walks[m->nwalks].b = road_pt(r, tc, r->half_width + 2.5);
            m->nwalks++;
        }
    }
    return QC_OK;
}

// ---- the network ----------------------------------------------------------------------------

static void place_roads(struct net *n, const struct synth_params *p, struct synth_rng *rng)
{
    const double E = p->half_extent;
    n->nroads = 0;
    for (int axis = 0; axis < 2; axis++) {
        const double spacing_lo = 85.0, spacing_hi = 170.0;
        double c = -E + synth_rng_range(rng, 35.0, 90.0);
        int placed = 0;
        while ((c < E - 35.0 || placed == 0) && n->nroads < 16) {
            struct road *r = &n->roads[n->nroads++];
            r->axis = axis;
            r->c = c < E - 35.0 ? c : synth_rng_range(rng, -E / 2, E / 2);
            r->k = (int)synth_rng_int(rng, p->lanes_min, p->lanes_max);
            r->w = synth_rng_range(rng, 3.2, 3.8);
            r->bike = synth_rng_chance(rng, p->bike_p);
            r->bw = synth_rng_range(rng, 1.5, 2.0);
            r->half_width = r->k * r->w + (r->bike ? r->bw : 0.0);
            r->centre_mark = synth_rng_chance(rng, 0.6) ? SYNTH_MARK_DOUBLE_SOLID_YELLOW
                                                        : SYNTH_MARK_DASHED_YELLOW;
            r->bus = r->k >= 2 && synth_rng_chance(rng, 0.1);
            placed++;
            c += synth_rng_range(rng, spacing_lo, spacing_hi);
        }
    }
}

static enum qc_status build_network(struct synth_map *m, const struct synth_params *p,
                                    struct synth_rng *rng, struct net *n)
{
    const double E = p->half_extent;
    place_roads(n, p, rng);
    n->nboxes = 0;
    for (int h = 0; h < n->nroads; h++)
        for (int v = 0; v < n->nroads; v++) {
            if (n->roads[h].axis != 0 || n->roads[v].axis != 1 || n->nboxes >= 64)
                continue;
            struct box *b = &n->boxes[n->nboxes++];
            b->road[0] = h;
            b->road[1] = v;
            b->t[0] = n->roads[v].c;
            b->t[1] = n->roads[h].c;
            b->cw_w = synth_rng_range(rng, 3.4, 4.7);
            b->half[0] = n->roads[v].half_width + 3.0 + b->cw_w;
            b->half[1] = n->roads[h].half_width + 3.0 + b->cw_w;
        }
    /* sections: each road cut by its boxes, in increasing axis coordinate */
    n->nsecs = 0;
    for (int ri = 0; ri < n->nroads; ri++) {
        const int ax = n->roads[ri].axis;
        int ids[64], nb = 0;
        for (int bi = 0; bi < n->nboxes; bi++)
            if (n->boxes[bi].road[ax] == ri)
                ids[nb++] = bi;
        for (int i = 1; i < nb; i++) /* insertion sort by position (distinct roads: no ties) */
            for (int j = i; j > 0 && n->boxes[ids[j]].t[ax] < n->boxes[ids[j - 1]].t[ax]; j--) {
                const int t = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = t;
            }
        double lo = -E;
        int box_lo = -1;
        for (int i = 0; i <= nb && n->nsecs < 128; i++) {
            const double hi = i < nb ? n->boxes[ids[i]].t[ax] - n->boxes[ids[i]].half[ax] : E;
            if (hi - lo > 6.0) {
                struct section *s = &n->secs[n->nsecs++];
                s->road = ri;
                s->lo = lo;
                s->hi = hi;
                s->box_lo = box_lo;
                s->box_hi = i < nb ? ids[i] : -1;
                QC_TRY(build_section(m, n, s, rng));
            }
            if (i < nb) {
                lo = n->boxes[ids[i]].t[ax] + n->boxes[ids[i]].half[ax];
                box_lo = ids[i];
            }
        }
        /* sidewalks along every section, both sides */
        for (int i = 0; i < n->nsecs; i++) {
            const struct section *s = &n->secs[i];
            if (s->road != ri)
                continue;
            for (int side = -1; side <= 1; side += 2) {
                QC_TRY(grow((void **)&m->walks, &m->cap_walks, m->nwalks + 1, sizeof(*m->walks)));
                const double lat = side * (n->roads[ri].half_width + 2.5);
                m->walks[m->nwalks].a = road_pt(&n->roads[ri], s->lo, lat);
                m->walks[m->nwalks].b = road_pt(&n->roads[ri], s->hi, lat);
                m->nwalks++;
            }
        }
    }
    for (int bi = 0; bi < n->nboxes; bi++)
        QC_TRY(build_box(m, n, bi, rng));
    /* scene centre: near a random intersection */
    const struct box *b = &n->boxes[synth_rng_int(rng, 0, n->nboxes - 1)];
    const double cx = b->t[0] + synth_rng_range(rng, -25, 25); /* one draw per statement */
    const double cy = b->t[1] + synth_rng_range(rng, -25, 25);
    m->centre = synth_v(cx, cy);
    return QC_OK;
}

// ---- crop -----------------------------------------------------------------------------------

struct crop_item {
    double d2;
    int32_t kind; /* 0 lane, 1 crosswalk */
    int32_t idx;
};

static int crop_cmp(const void *pa, const void *pb)
{
    const struct crop_item *a = pa, *b = pb;
    if (a->d2 != b->d2)
        return a->d2 < b->d2 ? -1 : 1;
    if (a->kind != b->kind)
        return a->kind - b->kind;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

static double dist2(struct synth_vec a, struct synth_vec b)
{
    const struct synth_vec d = synth_sub(a, b);
    return d.x * d.x + d.y * d.y;
}

static enum qc_status crop(struct synth_map *m, int64_t target, struct synth_rng *rng)
{
    const int64_t n = m->nlanes + m->ncws;
    struct crop_item *it = malloc((size_t)(n ? n : 1) * sizeof(*it));
    m->lane_order = malloc((size_t)(m->nlanes ? m->nlanes : 1) * sizeof(int32_t));
    m->cw_order = malloc((size_t)(m->ncws ? m->ncws : 1) * sizeof(int32_t));
    if (!it || !m->lane_order || !m->cw_order) {
        free(it);
        return qc_errorf(QC_ERR_NOMEM, "synth: out of memory cropping the map");
    }
    for (int64_t i = 0; i < m->nlanes; i++) {
        const struct synth_lane *l = &m->lanes[i];
        it[i].d2 = dist2(m->verts[l->c0 + l->nc / 2], m->centre);
        it[i].kind = 0;
        it[i].idx = (int32_t)i;
    }
    for (int64_t c = 0; c < m->ncws; c++) {
        const struct synth_crosswalk *w = &m->cws[c];
        const struct synth_vec mid = synth_scale(
            synth_add(synth_add(w->e1[0], w->e1[1]), synth_add(w->e2[0], w->e2[1])), 0.25);
        it[m->nlanes + c].d2 = dist2(mid, m->centre);
        it[m->nlanes + c].kind = 1;
        it[m->nlanes + c].idx = (int32_t)c;
    }
    qsort(it, (size_t)n, sizeof(*it), crop_cmp); /* total order: no ties left */
    int64_t count = 0;
    m->nkept_lanes = m->nkept_cws = 0;
    double d2max = 0;
    for (int64_t i = 0; i < n && count < target; i++) {
        if (it[i].kind == 1) {
            if (count + 2 > target)
                continue;
            m->cw_order[m->nkept_cws++] = it[i].idx;
            count += 2;
        } else {
            m->lane_order[m->nkept_lanes++] = it[i].idx;
            count += 1;
        }
        d2max = it[i].d2;
    }
    free(it);
    m->crop_radius = sqrt(d2max);
    m->num_polygons = count;
    /* AV2 lists lanes in map-file order, unrelated to geometry: shuffle (Fisher-Yates). */
    for (int64_t i = m->nkept_lanes - 1; i > 0; i--) {
        const int64_t j = synth_rng_int(rng, 0, i);
        const int32_t t = m->lane_order[i];
        m->lane_order[i] = m->lane_order[j];
        m->lane_order[j] = t;
    }
    for (int64_t i = m->nkept_cws - 1; i > 0; i--) {
        const int64_t j = synth_rng_int(rng, 0, i);
        const int32_t t = m->cw_order[i];
        m->cw_order[i] = m->cw_order[j];
        m->cw_order[j] = t;
    }
    for (int64_t i = 0; i < m->nkept_lanes; i++)
        m->lanes[m->lane_order[i]].out_index = (int32_t)i;
    for (int64_t c = 0; c < m->nkept_cws; c++)
        m->cws[m->cw_order[c]].out_index = (int32_t)(m->nkept_lanes + c);
    return QC_OK;
}

void synth_map_free(struct synth_map *m)
{
    free(m->verts);
    free(m->lanes);
    free(m->cws);
    free(m->walks);
    free(m->lane_order);
    free(m->cw_order);
    memset(m, 0, sizeof(*m));
}

enum qc_status synth_map_build(struct synth_map *m, const struct synth_params *p,
                               struct synth_rng *rng)
{
    struct net *n = malloc(sizeof(*n));
    if (!n)
        return qc_errorf(QC_ERR_NOMEM, "synth: out of memory");
    struct synth_params q = *p;
    enum qc_status st = QC_OK;
    /* Grow the network until it holds comfortably more polygons than the target. */
    for (int attempt = 0; attempt < 6; attempt++) {
        memset(m, 0, sizeof(*m));
        st = build_network(m, &q, rng, n);
        if (st != QC_OK)
            break;
        if (m->nlanes + 2 * m->ncws >= p->num_polygons + p->num_polygons / 4 || attempt == 5)
            break;
        synth_map_free(m);
        q.half_extent *= 1.3;
    }
    free(n);
    if (st == QC_OK)
        st = crop(m, p->num_polygons, rng);
    if (st != QC_OK)
        synth_map_free(m);
    return st;
}

// ---- export ---------------------------------------------------------------------------------

struct exporter {
    struct qc_scene_mut *out;
    struct synth_vec origin, rot;
    int64_t pt; /* next point index */
    int64_t Pt; /* total points (row stride of pt2pl) */
};

/* x rounded to binary32 and widened back. The volatile store is deliberate: gcc 12's SLP
 * vectoriser was seen to drop a plain (double)(float)x round trip at -O2, which made the output
 * depend on the optimisation level. */
static double round_f32(double x)
{
    volatile float f = (float)x;
    return (double)f;
}

/* Global f32 position of a local point, as AV2 stores map vertices (then widened back). */
static struct synth_vec to_global(const struct exporter *ex, struct synth_vec v)
{
    return synth_v(round_f32(ex->origin.x + ex->rot.x * v.x - ex->rot.y * v.y),
                   round_f32(ex->origin.y + ex->rot.y * v.x + ex->rot.x * v.y));
}

/* Emits the n - 1 vector-points of a polyline of global f32 vertices. */
static void emit_group(struct exporter *ex, const struct synth_vec *g, int n, uint8_t type,
                       uint8_t side, int64_t polygon)
{
    for (int i = 0; i + 1 < n; i++) {
        const int64_t k = ex->pt++;
        const struct synth_vec d = synth_sub(g[i + 1], g[i]);
        ex->out->pt_position[3 * k + 0] = (float)g[i].x;
        ex->out->pt_position[3 * k + 1] = (float)g[i].y;
        ex->out->pt_position[3 * k + 2] = 0.0f;
        ex->out->pt_orientation[k] = (float)synth_atan2(d.y, d.x);
        ex->out->pt_magnitude[k] = (float)synth_norm(d);
        ex->out->pt_height[k] = 0.0f;
        ex->out->pt_type[k] = type;
        ex->out->pt_side[k] = side;
        ex->out->pt2pl[k] = k;
        ex->out->pt2pl[ex->Pt + k] = polygon;
    }
}

static void set_polygon(struct exporter *ex, int64_t p, struct synth_vec a, struct synth_vec b,
                        uint8_t type, uint8_t is_int)
{
    ex->out->pl_position[3 * p + 0] = (float)a.x;
    ex->out->pl_position[3 * p + 1] = (float)a.y;
    ex->out->pl_position[3 * p + 2] = 0.0f;
    ex->out->pl_orientation[p] = (float)synth_atan2(b.y - a.y, b.x - a.x);
    ex->out->pl_height[p] = 0.0f;
    ex->out->pl_type[p] = type;
    ex->out->pl_is_intersection[p] = is_int;
}

/* Crosswalk centre-line vertex count of QCNET.md §7.3: ceil(|end - start| / 2) + 1. */
static int crosswalk_nc(struct synth_vec start, struct synth_vec end)
{
    const double h = synth_norm(synth_sub(end, start)) / 2.0;
    double c = floor(h);
    if (c < h)
        c += 1.0;
    return (int)c + 1;
}

#define EXPORT_MAX_VERTS 512

static void export_lane(struct exporter *ex, const struct synth_map *m, const struct synth_lane *l,
                        int64_t p)
{
    struct synth_vec g[EXPORT_MAX_VERTS];
    const int32_t first[3] = {l->l0, l->r0, l->c0}, count[3] = {l->nl, l->nr, l->nc};
    const uint8_t types[3] = {l->left_mark, l->right_mark, 16};
    for (int grp = 0; grp < 3; grp++) {
        const int n = count[grp] < EXPORT_MAX_VERTS ? count[grp] : EXPORT_MAX_VERTS;
        if (!ex->out) {
            ex->pt += n - 1;
            continue;
        }
        for (int i = 0; i < n; i++)
            g[i] = to_global(ex, m->verts[first[grp] + i]);
        if (grp == 2)
            set_polygon(ex, p, g[0], g[1], l->type, l->is_intersection);
        emit_group(ex, g, n, types[grp], (uint8_t)grp, p);
    }
}

/* One polygon of a crosswalk (forward when reverse == 0), exactly as QCNET.md §7.3 builds it
 * from edge1 and edge2. */
static void export_crosswalk(struct exporter *ex, const struct synth_crosswalk *c, int64_t p,
                             int reverse)
{
    struct synth_vec e1[2] = {to_global(ex, c->e1[0]), to_global(ex, c->e1[1])};
    struct synth_vec e2[2] = {to_global(ex, c->e2[0]), to_global(ex, c->e2[1])};
    const struct synth_vec start = synth_scale(synth_add(e1[0], e2[0]), 0.5);
    const struct synth_vec end = synth_scale(synth_add(e1[1], e2[1]), 0.5);
    const struct synth_vec mid1 = synth_scale(synth_add(e1[0], e1[1]), 0.5);
    const struct synth_vec se = synth_sub(end, start), sm = synth_sub(mid1, start);
    const int e1_left = se.x * sm.y - se.y * sm.x > 0;
    const struct synth_vec *left = e1_left ? e1 : e2, *right = e1_left ? e2 : e1;
    int n = crosswalk_nc(start, end);
    if (n > EXPORT_MAX_VERTS)
        n = EXPORT_MAX_VERTS;
    if (n < 2)
        n = 2; /* degenerate crosswalk (never generated): keep one centre vector */
    if (!ex->out) {
        ex->pt += 1 + 1 + (n - 1);
        return;
    }
    struct synth_vec centre[EXPORT_MAX_VERTS];
    for (int k = 0; k < n; k++) {
        /* av2 compute_midpoint_line: both 2-vertex boundaries resampled to n points equally
         * spaced in arc length (linear here), then averaged */
        const double t = (double)k / (n - 1);
        const struct synth_vec a = synth_lerp(left[0], left[1], t),
                               b = synth_lerp(right[0], right[1], t);
        const struct synth_vec mid = synth_scale(synth_add(a, b), 0.5);
        centre[k] = synth_v(round_f32(mid.x), round_f32(mid.y));
    }
    if (!reverse) {
        set_polygon(ex, p, start, end, 3, 2);
        emit_group(ex, left, 2, 15, 0, p);
        emit_group(ex, right, 2, 15, 1, p);
        emit_group(ex, centre, n, 16, 2, p);
        return;
    }
    /* reverse polygon: reversed right boundary (side 0), reversed left (side 1), reversed
     * centre line (side 2) */
    struct synth_vec rev[EXPORT_MAX_VERTS];
    for (int k = 0; k < n; k++)
        rev[k] = centre[n - 1 - k];
    const struct synth_vec rright[2] = {right[1], right[0]}, rleft[2] = {left[1], left[0]};
    set_polygon(ex, p, end, start, 3, 2);
    emit_group(ex, rright, 2, 15, 0, p);
    emit_group(ex, rleft, 2, 15, 1, p);
    emit_group(ex, rev, n, 16, 2, p);
}

void synth_map_export(const struct synth_map *m, struct synth_vec origin, struct synth_vec rot,
                      struct qc_scene_mut *out, int64_t num_points, int64_t *points, int64_t *pl2pl)
{
    struct exporter ex = {out, origin, rot, 0, num_points};
    for (int64_t i = 0; i < m->nkept_lanes; i++)
        export_lane(&ex, m, &m->lanes[m->lane_order[i]], i);
    for (int reverse = 0; reverse < 2; reverse++)
        for (int64_t c = 0; c < m->nkept_cws; c++)
            export_crosswalk(&ex, &m->cws[m->cw_order[c]],
                             m->nkept_lanes + reverse * m->nkept_cws + c, reverse);
    *points = ex.pt;
    /* typed edges, per lane in polygon order: preds, succs, left, right (QCNET.md §7.3) */
    int64_t e = 0, Et = 0;
    for (int pass = 0; pass < 2; pass++) {
        e = 0;
        for (int64_t i = 0; i < m->nkept_lanes; i++) {
            const struct synth_lane *l = &m->lanes[m->lane_order[i]];
            int32_t src[2 * SYNTH_MAX_LINKS + 2];
            uint8_t typ[2 * SYNTH_MAX_LINKS + 2];
            int ns = 0;
            for (int k = 0; k < l->npred; k++) {
                src[ns] = l->pred[k];
                typ[ns++] = 1;
            }
            for (int k = 0; k < l->nsucc; k++) {
                src[ns] = l->succ[k];
                typ[ns++] = 2;
            }
            src[ns] = l->left_nb;
            typ[ns++] = 3;
            src[ns] = l->right_nb;
            typ[ns++] = 4;
            for (int k = 0; k < ns; k++) {
                if (src[k] < 0 || m->lanes[src[k]].out_index < 0)
                    continue;
                if (pass == 1 && out) {
                    out->pl2pl_edge[e] = m->lanes[src[k]].out_index;
                    out->pl2pl_edge[Et + e] = i;
                    out->pl2pl_type[e] = typ[k];
                }
                e++;
            }
        }
        Et = e;
        if (!out)
            break;
    }
    *pl2pl = e;
}
