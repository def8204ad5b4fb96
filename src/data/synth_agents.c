/*
 * synth_agents.c — agents of a synthetic scene: who they are (AV2 types and categories), where
 * they move (lane routes through successors with optional lane changes, bike lanes, crosswalks
 * and sidewalks, or nowhere), how fast (a smooth, jerk-limited speed profile), and when they are
 * observed (full tracks, late starts, early ends, gaps), written out with the masks of
 * QCNET.md §7.2.
 *
 * Motion is the path position at the integrated arc length; heading is the path tangent and
 * velocity is speed times tangent, so the three agree with each other by construction.
 */
#include "synth_internal.h"

#include <math.h> /* sqrt: correctly rounded */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_STEPS QC_SCENE_STEPS
#define DT      0.1

enum {
    AT_VEHICLE = 0,
    AT_PEDESTRIAN,
    AT_MOTORCYCLIST,
    AT_CYCLIST,
    AT_BUS,
    AT_STATIC,
    AT_BACKGROUND,
    AT_CONSTRUCTION,
    AT_RIDERLESS_BICYCLE,
    AT_UNKNOWN
};

struct path {
    struct synth_vec *p; /* (n) vertices */
    double *cum;         /* (n) arc length at each vertex */
    double *vcap;        /* (n) m/s, speed that keeps lateral acceleration <= SYNTH_LAT_ACC */
    int n, cap;
};

#define SYNTH_LAT_ACC 2.5 /* m/s^2, comfortable cornering */

struct agent {
    uint8_t type, category;
    int t0, t1;     /* observed steps t0..t1 inclusive ... */
    int gap0, gap1; /* ... except gap0..gap1-1 (empty when equal) */
    uint64_t key;   /* tie-break of the output order */
    struct synth_vec pos[S_STEPS], vel[S_STEPS];
    double heading[S_STEPS];
};

// ---- paths ----------------------------------------------------------------------------------

static enum qc_status path_push(struct path *pa, struct synth_vec v)
{
    if (pa->n > 0) {
        const struct synth_vec d = synth_sub(v, pa->p[pa->n - 1]);
        if (d.x * d.x + d.y * d.y < 1e-8)
            return QC_OK; /* joints of consecutive lanes coincide */
    }
    if (pa->n == pa->cap) {
        const int cap = pa->cap ? 2 * pa->cap : 256;
        struct synth_vec *p = realloc(pa->p, (size_t)cap * sizeof(*p));
        if (!p)
            return qc_errorf(QC_ERR_NOMEM, "synth: out of memory building a path");
        pa->p = p;
        pa->cap = cap;
    }
    pa->p[pa->n++] = v;
    return QC_OK;
}

static void path_free(struct path *pa)
{
    free(pa->p);
    free(pa->cum);
    free(pa->vcap);
    memset(pa, 0, sizeof(*pa));
}

/* Two rounds of Chaikin corner cutting (keeps both ends), then arc lengths. */
static enum qc_status path_finish(struct path *pa)
{
    for (int round = 0; round < 2 && pa->n >= 3; round++) {
        struct path q = {0};
        enum qc_status st = path_push(&q, pa->p[0]);
        for (int i = 0; i + 1 < pa->n && st == QC_OK; i++) {
            if (i > 0)
                st = path_push(&q, synth_lerp(pa->p[i], pa->p[i + 1], 0.25));
            if (st == QC_OK && i + 2 < pa->n)
                st = path_push(&q, synth_lerp(pa->p[i], pa->p[i + 1], 0.75));
        }
        if (st == QC_OK)
            st = path_push(&q, pa->p[pa->n - 1]);
        if (st != QC_OK) {
            path_free(&q);
            return st;
        }
        free(pa->p);
        *pa = q;
    }
    pa->cum = malloc((size_t)(pa->n ? pa->n : 1) * sizeof(double));
    pa->vcap = malloc((size_t)(pa->n ? pa->n : 1) * sizeof(double));
    if (!pa->cum || !pa->vcap)
        return qc_errorf(QC_ERR_NOMEM, "synth: out of memory building a path");
    double s = 0;
    for (int i = 0; i < pa->n; i++) {
        if (i > 0)
            s += synth_norm(synth_sub(pa->p[i], pa->p[i - 1]));
        pa->cum[i] = s;
    }
    /* curvature at interior vertices: turn angle over the mean adjacent segment length; the
     * speed cap is sqrt(a_lat * radius) */
    for (int i = 0; i < pa->n; i++) {
        pa->vcap[i] = 1e9;
        if (i == 0 || i + 1 >= pa->n)
            continue;
        const struct synth_vec u0 = synth_unit(synth_sub(pa->p[i], pa->p[i - 1]));
        const struct synth_vec u1 = synth_unit(synth_sub(pa->p[i + 1], pa->p[i]));
        double turn = synth_atan2(u0.x * u1.y - u0.y * u1.x, synth_dot(u0, u1));
        turn = turn < 0 ? -turn : turn;
        const double ds = 0.5 * (pa->cum[i + 1] - pa->cum[i - 1]);
        if (turn > 1e-9 && ds > 0)
            pa->vcap[i] = sqrt(SYNTH_LAT_ACC * ds / turn);
    }
    return QC_OK;
}

/* Position and unit tangent at arc length s; beyond the end the last direction continues. */
static void path_eval(const struct path *pa, double s, int *hint, struct synth_vec *pos,
                      struct synth_vec *tan)
{
    int i = *hint;
    while (i + 2 < pa->n && pa->cum[i + 1] <= s)
        i++;
    *hint = i;
    const struct synth_vec a = pa->p[i], b = pa->p[i + 1];
    const double seg = pa->cum[i + 1] - pa->cum[i];
    *tan = synth_unit(synth_sub(b, a));
    *pos = synth_add(a, synth_scale(*tan, s - pa->cum[i]));
    (void)seg;
}

static int lane_is_straight_link(const struct synth_map *m, int32_t id)
{
    const struct synth_lane *l = &m->lanes[id];
    const struct synth_vec *v = m->verts + l->c0;
    const struct synth_vec u0 = synth_unit(synth_sub(v[1], v[0]));
    const struct synth_vec u1 = synth_unit(synth_sub(v[l->nc - 1], v[l->nc - 2]));
    return synth_dot(u0, u1) > 0.9;
}

static int lane_class_ok(const struct synth_map *m, int32_t id, int bike)
{
    return bike ? m->lanes[id].type == 1 : m->lanes[id].type != 1;
}

/* A lane route from `start` long enough for `need` metres, through random successors (straight
 * preferred), with at most one lane change blended over two segments. */
static enum qc_status route_path(const struct synth_map *m, int32_t start, double need, int bike,
                                 double lane_change_p, struct synth_rng *rng, struct path *out)
{
    struct item {
        int32_t a, b;
        double u0, u1;
    } items[96];
    int ni = 0, lc_done = 0;
    int32_t lane = start;
    double total = 0;
    while (total < need && ni + 2 < 96) {
        const struct synth_lane *L = &m->lanes[lane];
        int changed = 0;
        if (!lc_done && ni > 0 && L->is_intersection == 1 && synth_rng_chance(rng, lane_change_p)) {
            const int left = synth_rng_chance(rng, 0.5);
            const int32_t b = left ? L->left_nb : L->right_nb, next = L->next_in_section;
            const int32_t b2 =
                next >= 0 ? (left ? m->lanes[next].left_nb : m->lanes[next].right_nb) : -1;
            if (b >= 0 && b2 >= 0 && lane_class_ok(m, b, bike) && lane_class_ok(m, b2, bike) &&
                m->lanes[b].nc == L->nc && m->lanes[b2].nc == m->lanes[next].nc) {
                items[ni++] = (struct item){lane, b, 0.0, 0.5};
                items[ni++] = (struct item){next, b2, 0.5, 1.0};
                total += L->length + m->lanes[next].length;
                lane = b2;
                lc_done = changed = 1;
            }
        }
        if (!changed) {
            items[ni++] = (struct item){lane, -1, 0, 0};
            total += L->length;
        }
        /* next lane: straight-through links weigh 4, turns 1 */
        const struct synth_lane *C = &m->lanes[lane];
        double wsum = 0, w[SYNTH_MAX_LINKS];
        for (int k = 0; k < C->nsucc; k++) {
            w[k] = lane_class_ok(m, C->succ[k], bike)
                       ? (lane_is_straight_link(m, C->succ[k]) ? 4.0 : 1.0)
                       : 0.0;
            wsum += w[k];
        }
        if (wsum <= 0)
            break;
        double x = synth_rng_unit(rng) * wsum;
        int pick = 0;
        while (pick + 1 < C->nsucc && (x >= w[pick] || w[pick] == 0)) {
            x -= w[pick];
            pick++;
        }
        lane = C->succ[pick];
    }
    for (int k = 0; k < ni; k++) {
        const struct synth_lane *A = &m->lanes[items[k].a];
        for (int i = 0; i < A->nc; i++) {
            struct synth_vec v = m->verts[A->c0 + i];
            if (items[k].b >= 0) {
                const struct synth_lane *B = &m->lanes[items[k].b];
                const double u = items[k].u0 + (items[k].u1 - items[k].u0) * i / (A->nc - 1);
                const double sm = u * u * (3.0 - 2.0 * u); /* smoothstep */
                v = synth_lerp(v, m->verts[B->c0 + i], sm);
            }
            QC_TRY(path_push(out, v));
        }
    }
    return path_finish(out);
}

// ---- speed ----------------------------------------------------------------------------------

struct motion {
    double vmax, amax, dmax, jerk, tau, p_stop;
};

static const struct motion motion_vehicle = {16.0, 2.5, 4.0, 5.0, 1.5, 0.12};
static const struct motion motion_bus = {12.0, 1.5, 3.0, 3.0, 2.0, 0.15};
static const struct motion motion_moto = {17.0, 3.0, 4.5, 6.0, 1.2, 0.08};
static const struct motion motion_cyclist = {7.0, 1.2, 2.5, 3.0, 1.5, 0.08};
static const struct motion motion_ped = {1.8, 0.8, 1.5, 2.5, 1.0, 0.15};

/* Lowest curvature speed cap on the path within [s, s + look]. */
static double path_cap(const struct path *pa, double s, double look, int *hint)
{
    int i = *hint;
    while (i + 1 < pa->n && pa->cum[i] < s)
        i++;
    *hint = i > 0 ? i - 1 : 0;
    double cap = 1e9;
    for (; i < pa->n && pa->cum[i] <= s + look; i++)
        cap = pa->vcap[i] < cap ? pa->vcap[i] : cap;
    return cap;
}

/* Arc length s[t] and speed v[t] for t in [0, 110), starting at s0; slows for curves ahead so
 * lateral acceleration stays comfortable. */
static void speed_profile(const struct motion *mo, const struct path *pa, double s0, double vmax,
                          int start_stopped, struct synth_rng *rng, double *s, double *v)
{
    int hint = 0;
    const double cap0 = path_cap(pa, s0, 30.0, &hint);
    double vel = start_stopped ? 0.0 : synth_rng_range(rng, 0.4, 1.0) * vmax;
    vel = vel < cap0 ? vel : cap0;
    double target = start_stopped ? synth_rng_range(rng, 0.4, 1.0) * vmax : vel;
    int ev_t[2] = {S_STEPS, S_STEPS};
    double ev_v[2] = {0, 0};
    const int nev = (int)synth_rng_int(rng, 0, 2);
    for (int e = 0; e < nev; e++) {
        ev_t[e] = (int)synth_rng_int(rng, start_stopped ? 5 : 0, S_STEPS - 1);
        ev_v[e] = synth_rng_chance(rng, mo->p_stop) ? 0.0 : synth_rng_range(rng, 0.3, 1.0) * vmax;
    }
    if (start_stopped && ev_t[0] == S_STEPS)
        ev_t[0] = (int)synth_rng_int(rng, 0, 60);
    double acc = 0, pos = s0;
    for (int t = 0; t < S_STEPS; t++) {
        s[t] = pos;
        v[t] = vel;
        for (int e = 0; e < 2; e++)
            if (ev_t[e] == t)
                target = ev_v[e];
        if (start_stopped && t == ev_t[0] && target == 0.0)
            target = synth_rng_range(rng, 0.4, 1.0) * vmax;
        const double look = vel * vel / (2.0 * 0.6 * mo->dmax) + 3.0;
        const double cap = path_cap(pa, pos, look, &hint);
        const double goal = target < cap ? target : cap;
        double cmd = (goal - vel) / mo->tau;
        cmd = cmd > mo->amax ? mo->amax : (cmd < -mo->dmax ? -mo->dmax : cmd);
        double da = cmd - acc;
        const double jmax = mo->jerk * DT;
        da = da > jmax ? jmax : (da < -jmax ? -jmax : da);
        acc += da;
        double nv = vel + acc * DT;
        if (nv <= 0.0) {
            nv = 0.0;
            acc = 0.0;
        }
        pos += 0.5 * (vel + nv) * DT;
        vel = nv;
    }
}

// ---- placing agents -------------------------------------------------------------------------

/* Kept lanes within radius r of the centre that suit the class; falls back to all kept lanes. */
static int32_t pick_lane(const struct synth_map *m, struct synth_vec c, double r, int bike,
                         int need_straight_road, struct synth_rng *rng)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        int64_t cand = 0;
        for (int pass = 0; pass < 2; pass++) {
            int64_t pickn = pass ? synth_rng_int(rng, 0, cand - 1) : -1;
            int64_t k = 0;
            for (int64_t i = 0; i < m->nkept_lanes; i++) {
                const int32_t id = m->lane_order[i];
                const struct synth_lane *l = &m->lanes[id];
                if (!lane_class_ok(m, id, bike) || (need_straight_road && l->is_intersection == 0))
                    continue;
                const struct synth_vec mid = synth_sub(m->verts[l->c0 + l->nc / 2], c);
                if (mid.x * mid.x + mid.y * mid.y > r * r)
                    continue;
                if (pass && k == pickn)
                    return id;
                k++;
            }
            cand = k;
            if (cand == 0)
                break;
        }
        r *= 2.0;
        if (attempt == 1)
            bike = 0;
    }
    return m->lane_order[synth_rng_int(rng, 0, m->nkept_lanes - 1)];
}

static void still(struct agent *a, struct synth_vec p, double heading)
{
    for (int t = 0; t < S_STEPS; t++) {
        a->pos[t] = p;
        a->vel[t] = synth_v(0, 0);
        a->heading[t] = heading;
    }
}

static enum qc_status follow(struct agent *a, const struct path *pa, const struct motion *mo,
                             double s0, double vmax, int start_stopped, struct synth_rng *rng)
{
    double s[S_STEPS], v[S_STEPS];
    speed_profile(mo, pa, s0, vmax, start_stopped, rng, s, v);
    int hint = 0;
    for (int t = 0; t < S_STEPS; t++) {
        struct synth_vec p, u;
        path_eval(pa, s[t], &hint, &p, &u);
        a->pos[t] = p;
        a->vel[t] = synth_scale(u, v[t]);
        a->heading[t] = synth_atan2(u.y, u.x);
    }
    return QC_OK;
}

/* A moving road user on a lane route. */
static enum qc_status drive(const struct synth_map *m, struct agent *a, struct synth_vec c,
                            double r, const struct motion *mo, int bike, struct synth_rng *rng)
{
    const int32_t lane = pick_lane(m, c, r, bike, 0, rng);
    const double vmax = synth_rng_range(rng, 0.45, 1.0) * mo->vmax;
    const double s0 = synth_rng_range(rng, 0.0, m->lanes[lane].length);
    struct path pa = {0};
    enum qc_status st =
        route_path(m, lane, s0 + vmax * 11.5 + 10.0, bike, bike ? 0.0 : 0.25, rng, &pa);
    if (st == QC_OK)
        st = follow(a, &pa, mo, s0, vmax, synth_rng_chance(rng, 0.08), rng);
    path_free(&pa);
    return st;
}

/* A pedestrian walking along a crosswalk or sidewalk stretch (either way), or standing there. */
static enum qc_status walk(const struct synth_map *m, struct agent *a, struct synth_vec c, double r,
                           int moving, struct synth_rng *rng)
{
    int64_t best = -1;
    for (int tries = 0; tries < 16 && m->nwalks > 0; tries++) {
        const int64_t w = synth_rng_int(rng, 0, m->nwalks - 1);
        const struct synth_vec mid = synth_scale(synth_add(m->walks[w].a, m->walks[w].b), 0.5);
        best = w;
        if (synth_norm(synth_sub(mid, c)) < r)
            break;
    }
    struct synth_vec pa0 = best >= 0 ? m->walks[best].a : c,
                     pb0 = best >= 0 ? m->walks[best].b : synth_add(c, synth_v(10, 0));
    if (synth_rng_chance(rng, 0.5)) {
        const struct synth_vec t = pa0;
        pa0 = pb0;
        pb0 = t;
    }
    const struct synth_vec u = synth_unit(synth_sub(pb0, pa0));
    const double len = synth_norm(synth_sub(pb0, pa0));
    const double lat = synth_rng_range(rng, -0.8, 0.8);
    const struct synth_vec side = synth_scale(synth_left(u), lat);
    if (!moving) {
        const struct synth_vec p = synth_add(synth_lerp(pa0, pb0, synth_rng_unit(rng)), side);
        still(a, p, synth_atan2(u.y, u.x) + synth_rng_range(rng, -1.0, 1.0));
        return QC_OK;
    }
    struct path pa = {0};
    enum qc_status st = path_push(&pa, synth_add(pa0, side));
    if (st == QC_OK)
        st = path_push(&pa, synth_add(pb0, side));
    if (st == QC_OK)
        st = path_finish(&pa);
    if (st == QC_OK) {
        const double vmax = synth_rng_range(rng, 0.6, 1.0) * motion_ped.vmax;
        const double s0 = synth_rng_range(rng, 0.0, 0.6) * len; /* one draw per statement */
        const int stopped = synth_rng_chance(rng, 0.1);
        st = follow(a, &pa, &motion_ped, s0, vmax, stopped, rng);
    }
    path_free(&pa);
    return st;
}

/* A vehicle parked at the kerb of an outermost lane. */
static void park(const struct synth_map *m, struct agent *a, struct synth_vec c, double r,
                 struct synth_rng *rng)
{
    int32_t lane = pick_lane(m, c, r, 0, 1, rng);
    for (int hop = 0;
         hop < 4 && m->lanes[lane].right_nb >= 0 && m->lanes[m->lanes[lane].right_nb].type != 1;
         hop++)
        lane = m->lanes[lane].right_nb;
    const struct synth_lane *l = &m->lanes[lane];
    const int i = (int)synth_rng_int(rng, 0, l->nc - 2);
    const struct synth_vec p0 = m->verts[l->c0 + i], p1 = m->verts[l->c0 + i + 1];
    const struct synth_vec u = synth_unit(synth_sub(p1, p0));
    double off = 0.5 * l->width + 1.1;
    if (l->right_nb >= 0)
        off += m->lanes[l->right_nb].width;
    const struct synth_vec p =
        synth_add(synth_lerp(p0, p1, synth_rng_unit(rng)), synth_scale(synth_left(u), -off));
    still(a, p, synth_atan2(u.y, u.x));
}

/* Static objects stand beside the road (sidewalks) with an arbitrary heading. */
static void object(const struct synth_map *m, struct agent *a, struct synth_vec c, double r,
                   struct synth_rng *rng)
{
    (void)walk(m, a, c, r, 0, rng); /* never fails without a path */
    const double h = synth_rng_range(rng, -SYNTH_PI, SYNTH_PI);
    for (int t = 0; t < S_STEPS; t++)
        a->heading[t] = h;
}

static uint8_t draw_type(struct synth_rng *rng, int dynamic_only)
{
    static const struct {
        uint8_t type;
        double w;
    } mix[] = {{AT_VEHICLE, 0.58},    {AT_PEDESTRIAN, 0.18},   {AT_STATIC, 0.07},
               {AT_BACKGROUND, 0.04}, {AT_CYCLIST, 0.04},      {AT_RIDERLESS_BICYCLE, 0.03},
               {AT_BUS, 0.02},        {AT_CONSTRUCTION, 0.02}, {AT_MOTORCYCLIST, 0.01},
               {AT_UNKNOWN, 0.01}};
    double total = 0;
    for (size_t i = 0; i < sizeof(mix) / sizeof(mix[0]); i++)
        total += (!dynamic_only || mix[i].type <= AT_BUS) ? mix[i].w : 0.0;
    double x = synth_rng_unit(rng) * total;
    for (size_t i = 0; i < sizeof(mix) / sizeof(mix[0]); i++) {
        const double w = (!dynamic_only || mix[i].type <= AT_BUS) ? mix[i].w : 0.0;
        if (x < w)
            return mix[i].type;
        x -= w;
    }
    return AT_VEHICLE;
}

/* Trajectory for an agent of a given type; full tracks move more often than fragments. */
static enum qc_status animate(const struct synth_map *m, struct agent *a, struct synth_vec c,
                              double r, int full, struct synth_rng *rng)
{
    switch (a->type) {
    case AT_VEHICLE:
        if (synth_rng_chance(rng, full ? 0.7 : 0.45))
            return drive(m, a, c, r, &motion_vehicle, 0, rng);
        park(m, a, c, r, rng);
        return QC_OK;
    case AT_BUS:
        return drive(m, a, c, r, &motion_bus, 0, rng);
    case AT_MOTORCYCLIST:
        return drive(m, a, c, r, &motion_moto, 0, rng);
    case AT_CYCLIST:
        return drive(m, a, c, r, &motion_cyclist, 1, rng);
    case AT_PEDESTRIAN:
        return walk(m, a, c, r, synth_rng_chance(rng, 0.7), rng);
    default:
        object(m, a, c, r, rng);
        return QC_OK;
    }
}

static void observe_window(struct agent *a, int full, struct synth_rng *rng)
{
    a->gap0 = a->gap1 = 0;
    if (full) {
        a->t0 = 0;
        a->t1 = S_STEPS - 1;
        return;
    }
    a->t0 = synth_rng_chance(rng, 0.35) ? 0 : (int)synth_rng_int(rng, 1, QC_SCENE_HIST_STEPS - 1);
    const int len = synth_rng_chance(rng, 0.3) ? (int)synth_rng_int(rng, 3, 15)
                                               : (int)synth_rng_int(rng, 10, S_STEPS);
    a->t1 = a->t0 + len - 1 < S_STEPS - 1 ? a->t0 + len - 1 : S_STEPS - 1;
    if (a->t1 - a->t0 > 12 && synth_rng_chance(rng, 0.1)) {
        a->gap0 = (int)synth_rng_int(rng, a->t0 + 1, a->t1 - 6);
        a->gap1 = a->gap0 + (int)synth_rng_int(rng, 1, 4);
    }
}

static int observed(const struct agent *a, int t)
{
    return t >= a->t0 && t <= a->t1 && !(t >= a->gap0 && t < a->gap1);
}

static int agent_cmp(const void *pa, const void *pb)
{
    const struct agent *a = *(const struct agent *const *)pa, *b = *(const struct agent *const *)pb;
    if (a->t0 != b->t0)
        return a->t0 - b->t0;
    return (a->key > b->key) - (a->key < b->key);
}

enum qc_status synth_agents_build(const struct synth_map *m, const struct synth_params *p,
                                  struct synth_rng *rng, struct synth_vec origin,
                                  struct synth_vec rot, struct qc_scene *scene,
                                  struct qc_scene_mut *out)
{
    const int64_t A = p->num_agents;
    struct agent *ag = calloc((size_t)A, sizeof(*ag));
    struct agent **order = calloc((size_t)A, sizeof(*order));
    if (!ag || !order) {
        free(ag);
        free(order);
        return qc_errorf(QC_ERR_NOMEM, "synth: out of memory for %lld agents", (long long)A);
    }
    const double R = m->crop_radius > 20.0 ? m->crop_radius : 20.0;
    const struct synth_vec c = m->centre;
    /* categories: [0] AV, [1] focal, then scored, unscored, fragments */
    const int64_t n_scored = synth_rng_int(rng, 1, 2 + A / 20);
    const int64_t n_unscored = synth_rng_int(rng, 2, 3 + A / 12);
    enum qc_status st = QC_OK;
    for (int64_t i = 0; i < A && st == QC_OK; i++) {
        struct agent *a = &ag[i];
        a->key = synth_rng_u64(rng);
        int full = 1;
        if (i == 0) { /* the AV: a vehicle driving through the middle */
            a->type = AT_VEHICLE;
            a->category = 1;
            st = drive(m, a, c, 0.3 * R, &motion_vehicle, 0, rng);
        } else if (i == 1) { /* focal: a moving agent near the centre, observed throughout */
            const double x = synth_rng_unit(rng);
            a->type = x < 0.9 ? AT_VEHICLE : (x < 0.95 ? AT_CYCLIST : AT_PEDESTRIAN);
            a->category = 3;
            if (a->type == AT_PEDESTRIAN)
                st = walk(m, a, c, 0.4 * R, 1, rng);
            else
                st = drive(m, a, c, 0.3 * R,
                           a->type == AT_CYCLIST ? &motion_cyclist : &motion_vehicle,
                           a->type == AT_CYCLIST, rng);
        } else if (i < 2 + n_scored) {
            a->type = draw_type(rng, 1);
            a->category = 2;
            st = animate(m, a, c, 0.5 * R, 1, rng);
        } else if (i < 2 + n_scored + n_unscored) {
            a->type = draw_type(rng, 0);
            a->category = 1;
            st = animate(m, a, c, 0.6 * R, 1, rng);
        } else {
            a->type = draw_type(rng, 0);
            a->category = 0;
            full = 0;
            st = animate(m, a, c, 0.6 * R, 0, rng);
        }
        observe_window(a, full, rng);
    }
    if (st != QC_OK) {
        free(ag);
        free(order);
        return st;
    }
    /* Output order: first appearance (the AV2 parquet's track-id order), the AV last. */
    for (int64_t i = 0; i < A - 1; i++)
        order[i] = &ag[i + 1];
    qsort(order, (size_t)(A - 1), sizeof(*order), agent_cmp);
    order[A - 1] = &ag[0];
    int64_t id = synth_rng_int(rng, 100000, 400000);
    for (int64_t i = 0; i < A; i++) {
        const struct agent *a = order[i];
        if (i == A - 1)
            snprintf(out->agent_id[i], QC_AGENT_ID_MAX, "AV");
        else
            snprintf(out->agent_id[i], QC_AGENT_ID_MAX, "%lld", (long long)id);
        id += synth_rng_int(rng, 1, 12);
        out->agent_type[i] = a->type;
        out->agent_category[i] = a->category;
        const int now = observed(a, QC_SCENE_HIST_STEPS - 1);
        for (int t = 0; t < S_STEPS; t++) {
            const int64_t k = i * S_STEPS + t;
            const int raw = observed(a, t);
            if (t == 0)
                out->valid_mask[k] = 0;
            else if (t < QC_SCENE_HIST_STEPS)
                out->valid_mask[k] = (uint8_t)(raw && observed(a, t - 1));
            else
                out->valid_mask[k] = (uint8_t)raw;
            out->predict_mask[k] = (uint8_t)(t >= QC_SCENE_HIST_STEPS && now && raw);
            if (!raw)
                continue; /* unobserved steps stay 0 (the block is zero-filled) */
            const struct synth_vec lp = a->pos[t], lv = a->vel[t];
            out->position[3 * k + 0] = (float)(origin.x + rot.x * lp.x - rot.y * lp.y);
            out->position[3 * k + 1] = (float)(origin.y + rot.y * lp.x + rot.x * lp.y);
            out->velocity[3 * k + 0] = (float)(rot.x * lv.x - rot.y * lv.y);
            out->velocity[3 * k + 1] = (float)(rot.y * lv.x + rot.x * lv.y);
            /* heading + global rotation, wrapped to (-pi, pi] */
            double h = a->heading[t] + synth_atan2(rot.y, rot.x);
            while (h > SYNTH_PI)
                h -= 2.0 * SYNTH_PI;
            while (h <= -SYNTH_PI)
                h += 2.0 * SYNTH_PI;
            out->heading[k] = (float)h;
        }
    }
    scene->av_index = A - 1;
    free(ag);
    free(order);
    return QC_OK;
}
