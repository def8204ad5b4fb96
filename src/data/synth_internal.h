/*
 * synth_internal.h — shared by the synthetic-scene generator's files (synth_*.c); never leaves
 * src/data. The layers call downwards only: synth.c (qc_synth.h: the profile, the scene) uses
 * synth_map.c and synth_agents.c, which use synth_math.c; none of them includes qc_synth.h.
 *
 * Glossary:
 *   local frame  metres around the scene centre, roads axis-aligned; the global (city) frame is
 *                origin + rotation(local), applied when the scene is written out.
 *   road         a straight two-way street (axis 0: along x at y = c; axis 1: along y at x = c)
 *                with k vehicle lanes per direction and an optional bike lane on the outside.
 *   section      the part of a road between two intersection boxes (or a box and the map edge),
 *                split into lane segments of ~20 m; parallel lanes share the split points, so
 *                their segments have equal vertex counts (lane changes blend them vertex-wise).
 *   connector    an intersection lane segment (straight line or quadratic Bezier turn).
 *   path         the polyline an agent follows; route -> vertices -> Chaikin-smoothed.
 *
 * Determinism rules (qc_synth.h): integer PRNG, double arithmetic with + - * / sqrt only, own
 * atan2 (synth_atan2); every sort has a total order (ties broken by index); at most one PRNG
 * draw per expression (C leaves the evaluation order of arguments and operands unspecified:
 * gcc and clang differ); float rounding that feeds later arithmetic goes through a volatile
 * (synth_map.c round_f32).
 */
#ifndef QC_DATA_SYNTH_INTERNAL_H
#define QC_DATA_SYNTH_INTERNAL_H

#include <stdint.h>

#include "qc_scene.h"
#include "qc_status.h"

#ifdef __clang__
#    pragma STDC FP_CONTRACT OFF /* gcc: off already in ISO C mode (-std=c11) */
#endif

#define SYNTH_PI 3.14159265358979323846

// ---- numbers --------------------------------------------------------------------------------

struct synth_rng {
    uint64_t s[4]; /* xoshiro256** state */
};

struct synth_vec {
    double x, y;
};

void synth_rng_seed(struct synth_rng *r, uint64_t a, uint64_t b, uint64_t c);
uint64_t synth_rng_u64(struct synth_rng *r);
double synth_rng_unit(struct synth_rng *r);                         /* [0, 1) */
double synth_rng_range(struct synth_rng *r, double lo, double hi);  /* [lo, hi) */
int64_t synth_rng_int(struct synth_rng *r, int64_t lo, int64_t hi); /* [lo, hi] */
int synth_rng_chance(struct synth_rng *r, double p);

double synth_atan2(double y, double x); /* (-pi, pi], 0 for (0, 0); |error| < 1e-14 */
double synth_norm(struct synth_vec v);
struct synth_vec synth_unit(struct synth_vec v); /* v / |v|, (1, 0) for a zero vector */

static inline struct synth_vec synth_v(double x, double y)
{
    struct synth_vec v = {x, y};
    return v;
}
static inline struct synth_vec synth_add(struct synth_vec a, struct synth_vec b)
{
    return synth_v(a.x + b.x, a.y + b.y);
}
static inline struct synth_vec synth_sub(struct synth_vec a, struct synth_vec b)
{
    return synth_v(a.x - b.x, a.y - b.y);
}
static inline struct synth_vec synth_scale(struct synth_vec a, double k)
{
    return synth_v(a.x * k, a.y * k);
}
static inline struct synth_vec synth_lerp(struct synth_vec a, struct synth_vec b, double t)
{
    return synth_v(a.x + (b.x - a.x) * t, a.y + (b.y - a.y) * t);
}
static inline struct synth_vec synth_left(struct synth_vec u) /* rotate +90 degrees */
{
    return synth_v(-u.y, u.x);
}
static inline double synth_dot(struct synth_vec a, struct synth_vec b)
{
    return a.x * b.x + a.y * b.y;
}

// ---- the road network (synth_map.c) ---------------------------------------------------------

#define SYNTH_MAX_LINKS 6

enum synth_mark { /* QCNET.md §7.3 point types */
                  SYNTH_MARK_DASHED_WHITE = 2,
                  SYNTH_MARK_DASHED_YELLOW = 3,
                  SYNTH_MARK_DOUBLE_SOLID_YELLOW = 4,
                  SYNTH_MARK_SOLID_WHITE = 9,
                  SYNTH_MARK_NONE = 13,
};

struct synth_lane {
    uint8_t type;            /* 0 VEHICLE, 1 BIKE, 2 BUS */
    uint8_t is_intersection; /* 0 True (connector), 1 False */
    uint8_t left_mark, right_mark;
    int32_t c0, nc; /* centre vertices: map->verts[c0 .. c0+nc) */
    int32_t l0, nl; /* left boundary vertices */
    int32_t r0, nr; /* right boundary vertices */
    double length;  /* m, centre polyline */
    double width;   /* m */
    int32_t pred[SYNTH_MAX_LINKS], npred;
    int32_t succ[SYNTH_MAX_LINKS], nsucc;
    int32_t left_nb, right_nb; /* same-direction neighbours, -1 if none */
    int32_t next_in_section;   /* the successor in the same road section, -1 if none */
    int32_t out_index;         /* polygon index in the scene, -1 when cropped away */
};

struct synth_crosswalk {
    struct synth_vec e1[2], e2[2]; /* the two long edges, as AV2 edge1 / edge2 */
    int32_t out_index;             /* forward polygon index, -1 when cropped away */
};

/* A straight pedestrian path (sidewalk stretch or crosswalk crossing). */
struct synth_walk {
    struct synth_vec a, b;
};

struct synth_map {
    struct synth_vec *verts;
    int64_t nverts, cap_verts;
    struct synth_lane *lanes;
    int64_t nlanes, cap_lanes;
    struct synth_crosswalk *cws;
    int64_t ncws, cap_cws;
    struct synth_walk *walks;
    int64_t nwalks, cap_walks;
    struct synth_vec centre; /* scene centre (local) */
    double crop_radius;      /* m, distance of the farthest kept polygon */
    int64_t num_polygons;    /* kept lanes + 2 * kept crosswalks */
    int32_t *lane_order;     /* (kept lanes) lane index of output polygon i */
    int64_t nkept_lanes;
    int32_t *cw_order; /* (kept crosswalks) crosswalk index of output crosswalk c */
    int64_t nkept_cws;
};

/* Size targets drawn per scene from the profile. */
struct synth_params {
    int64_t num_agents;   /* A */
    int64_t num_polygons; /* P target */
    double half_extent;   /* m, half size of the generated network */
    int lanes_min, lanes_max;
    double bike_p;
};

enum qc_status synth_map_build(struct synth_map *m, const struct synth_params *p,
                               struct synth_rng *rng);
void synth_map_free(struct synth_map *m);
/* Writes polygons, points, pt2pl and typed pl2pl of the kept map into the scene, in the global
 * frame g = origin + [c -s; s c] local with rot = (c, s). With out == NULL only counts:
 * *points and *pl2pl receive Pt and Et (num_points is ignored then; otherwise it must be Pt). */
void synth_map_export(const struct synth_map *m, struct synth_vec origin, struct synth_vec rot,
                      struct qc_scene_mut *out, int64_t num_points, int64_t *points,
                      int64_t *pl2pl);

// ---- agents (synth_agents.c) ----------------------------------------------------------------

/* Generates p->num_agents agents on the map and writes every agent array of the scene
 * (allocated for that many agents), ids and av_index included. */
enum qc_status synth_agents_build(const struct synth_map *m, const struct synth_params *p,
                                  struct synth_rng *rng, struct synth_vec origin,
                                  struct synth_vec rot, struct qc_scene *scene,
                                  struct qc_scene_mut *out);

#endif /* QC_DATA_SYNTH_INTERNAL_H */
