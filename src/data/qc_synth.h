/*
 * qc_synth.h — synthetic Argoverse-2-like scenes from a seed (`qctrain gen`, on-the-fly training
 * data, loader tests and benchmarks).
 *
 * A scene is a road network of lane segments (centre lines ~1.8 m between vertices, boundaries
 * with lane-mark types, typed predecessor/successor/left/right relations, intersections with
 * straight and turning connectors, crosswalks laid out as QCNET.md §7.3 builds them) around a
 * city-scale origin with a random global orientation, and agents of the AV2 types moving on it
 * for 110 steps at 10 Hz: vehicles following lanes with smooth speed profiles, lane changes and
 * turns; cyclists on bike lanes; pedestrians on crosswalks and sidewalks; parked vehicles and
 * static objects; fragments that start late, end early or have gaps; the AV (track "AV",
 * category 1); one focal track (category 3, all 110 steps); scored tracks (category 2). Masks
 * follow QCNET.md §7.2 exactly.
 *
 * Determinism: scene (seed, index, profile) is the same bytes on every machine and compiler.
 * The generator draws from its own integer PRNG and computes with +, -, *, / and sqrt only
 * (IEEE-754 correctly rounded, double precision, no FMA contraction: C11 mode plus
 * `#pragma STDC FP_CONTRACT OFF` for clang), with its own atan2 built from those; it never calls
 * libm's transcendental functions. Each scene depends only on (seed, index, profile), so scenes
 * can be generated in any order and in parallel.
 */
#ifndef QC_DATA_QC_SYNTH_H
#define QC_DATA_QC_SYNTH_H

#include <stdint.h>

#include "qc_scene.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scene-size profiles; the values equal enum qc_scene_profile of qc_config.h. */
enum qc_synth_profile {
    QC_SYNTH_TYPICAL = 0, /* QCNET.md §8.6 typical column: A 50-70, P 150-200 */
    QC_SYNTH_DENSE,       /* the large column: A 150-250, P 350-600 */
    QC_SYNTH_MIXED,       /* mostly typical, a few percent heavy scenes (3-5x the edges) */
    QC_SYNTH_PROFILE_COUNT
};

/* "typical" | "dense" | "mixed"; QC_ERR_INVALID (message lists the choices) otherwise. */
enum qc_status qc_synth_profile_parse(const char *name, enum qc_synth_profile *out);
const char *qc_synth_profile_name(enum qc_synth_profile profile);

/* Generates scene `index` of the stream `seed` into *out as an owned scene (free it with
 * qc_scene_free). *out is written only on QC_OK. Thread-safe and reentrant. Returns
 * QC_ERR_INVALID for a bad profile or a negative index, QC_ERR_NOMEM. */
enum qc_status qc_synth_scene(uint64_t seed, int64_t index, enum qc_synth_profile profile,
                              struct qc_scene *out);

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_SYNTH_H */
