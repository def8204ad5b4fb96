/*
 * synth.c — qc_synth_scene(): draws a scene's size from its profile, builds the road network,
 * the agents and the global placement (city-scale origin, random orientation), and fills an
 * owned struct qc_scene. See qc_synth.h for the determinism contract.
 */
#include "qc_synth.h"

#include <stdio.h>
#include <string.h>

#include "synth_internal.h"

static const char *const profile_names[QC_SYNTH_PROFILE_COUNT] = {"typical", "dense", "mixed"};

enum qc_status qc_synth_profile_parse(const char *name, enum qc_synth_profile *out)
{
    for (int i = 0; i < QC_SYNTH_PROFILE_COUNT; i++)
        if (strcmp(name, profile_names[i]) == 0) {
            *out = (enum qc_synth_profile)i;
            return QC_OK;
        }
    return qc_errorf(QC_ERR_INVALID,
                     "unknown scene profile '%s'\nhint: use typical, dense or mixed", name);
}

const char *qc_synth_profile_name(enum qc_synth_profile p)
{
    return (int)p >= 0 && p < QC_SYNTH_PROFILE_COUNT ? profile_names[p] : "?";
}

/* Scene sizes (QCNET.md §8.6): typical A 50-70 / P 150-200, dense (the large column)
 * A 150-250 / P 350-600; mixed adds a heavy tail of ~4% scenes with ~2x A and P, which gives
 * them 3-5x the median edge count (edges grow like A*P and P^2). */
static void draw_params(enum qc_synth_profile profile, struct synth_rng *rng,
                        struct synth_params *p)
{
    int heavy = 0;
    if (profile == QC_SYNTH_MIXED)
        heavy = synth_rng_chance(rng, 0.04) ? 1 : 0;
    if (profile == QC_SYNTH_DENSE) {
        p->num_agents = synth_rng_int(rng, 150, 250);
        p->num_polygons = synth_rng_int(rng, 350, 600);
        p->half_extent = 260.0;
        p->lanes_min = 2;
        p->lanes_max = 3;
    } else if (heavy) {
        p->num_agents = synth_rng_int(rng, 150, 200);
        p->num_polygons = synth_rng_int(rng, 380, 480);
        p->half_extent = 240.0;
        p->lanes_min = 1;
        p->lanes_max = 3;
    } else {
        p->num_agents = synth_rng_int(rng, 48, 72);
        p->num_polygons = synth_rng_int(rng, 150, 205);
        p->half_extent = 170.0;
        p->lanes_min = 1;
        p->lanes_max = 2;
    }
    p->bike_p = 0.5;
}

/* A random unit vector, by rejection from the square (no trigonometry). */
static struct synth_vec random_direction(struct synth_rng *rng)
{
    for (;;) {
        /* one draw per statement: argument evaluation order is unspecified in C */
        const double x = synth_rng_range(rng, -1, 1);
        const double y = synth_rng_range(rng, -1, 1);
        const struct synth_vec v = synth_v(x, y);
        const double n2 = v.x * v.x + v.y * v.y;
        if (n2 > 0.01 && n2 <= 1.0)
            return synth_unit(v);
    }
}

enum qc_status qc_synth_scene(uint64_t seed, int64_t index, enum qc_synth_profile profile,
                              struct qc_scene *out)
{
    if ((int)profile < 0 || profile >= QC_SYNTH_PROFILE_COUNT)
        return qc_errorf(QC_ERR_INVALID, "synth: bad profile %d", (int)profile);
    if (index < 0)
        return qc_errorf(QC_ERR_INVALID, "synth: negative scene index %lld", (long long)index);
    struct synth_rng rng;
    synth_rng_seed(&rng, seed, (uint64_t)index, (uint64_t)profile);
    struct synth_params p;
    draw_params(profile, &rng, &p);

    /* global placement: thousands of metres from the city origin, any orientation */
    static const char *const cities[] = {"austin",     "dearborn",  "miami",
                                         "pittsburgh", "palo-alto", "washington-dc"};
    const char *city = cities[synth_rng_int(&rng, 0, 5)];
    const struct synth_vec rot = random_direction(&rng);
    const struct synth_vec odir = random_direction(&rng);
    const double orad = synth_rng_range(&rng, 1500.0, 8000.0);
    /* round the origin to 1 cm so printed coordinates stay tidy */
    const struct synth_vec origin = synth_v((double)(int64_t)(odir.x * orad * 100.0) / 100.0,
                                            (double)(int64_t)(odir.y * orad * 100.0) / 100.0);
    char scenario_id[QC_SCENE_ID_MAX];
    {
        const uint64_t a = synth_rng_u64(&rng), b = synth_rng_u64(&rng);
        snprintf(scenario_id, sizeof(scenario_id), "%08llx-%04llx-4%03llx-%04llx-%012llx",
                 (unsigned long long)(a >> 32), (unsigned long long)((a >> 16) & 0xffff),
                 (unsigned long long)(a & 0xfff),
                 (unsigned long long)(0x8000 | ((b >> 48) & 0x3fff)),
                 (unsigned long long)(b & 0xffffffffffffull));
    }

    struct synth_map m;
    QC_TRY(synth_map_build(&m, &p, &rng));
    int64_t Pt = 0, Et = 0;
    synth_map_export(&m, origin, rot, NULL, 0, &Pt, &Et);
    struct qc_scene s;
    memset(&s, 0, sizeof(s));
    struct qc_scene_mut mut;
    enum qc_status st = qc_scene_alloc(&s, &mut, p.num_agents, m.num_polygons, Pt, Et);
    if (st == QC_OK) {
        int64_t pt_check = 0, et_check = 0;
        synth_map_export(&m, origin, rot, &mut, Pt, &pt_check, &et_check);
        QC_ASSERT(pt_check == Pt && et_check == Et, "synth: export counts drifted");
        st = synth_agents_build(&m, &p, &rng, origin, rot, &s, &mut);
    }
    synth_map_free(&m);
    if (st != QC_OK) {
        qc_scene_free(&s);
        return st;
    }
    snprintf(s.scenario_id, sizeof(s.scenario_id), "%s", scenario_id);
    snprintf(s.city, sizeof(s.city), "%s", city);
    *out = s;
    return QC_OK;
}
