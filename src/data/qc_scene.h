/*
 * qc_scene.h — one preprocessed scene in memory: the fields of QCNET.md §7.5, exactly what
 * QCNet's ArgoverseV2Dataset pickles hold (minus the TargetBuilder output, which the loader
 * computes). A scene is either a read-only view into a mapped qcshard record or owned by a
 * generator/converter; qc_scene_free() releases an owned one.
 *
 * Shapes use A agents, P polygons (lanes + 2*crosswalks), Pt map points, Et typed pl2pl edges
 * and S = QC_SCENE_STEPS = 110 time steps (50 history + 60 future, 10 Hz). Booleans are uint8_t
 * 0/1; categorical values are uint8_t; indices int64_t; floats fp32, row-major.
 */
#ifndef QC_DATA_QC_SCENE_H
#define QC_DATA_QC_SCENE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QC_SCENE_STEPS      110 /* 50 history + 60 future */
#define QC_SCENE_HIST_STEPS 50
#define QC_SCENE_ID_MAX     64 /* scenario id, NUL-terminated */
#define QC_SCENE_CITY_MAX   32
#define QC_AGENT_ID_MAX     32 /* AV2 track id ("AV", "138951"), NUL-terminated */

/* Vocabulary sizes (QCNET.md §7.2–7.3). */
#define QC_AGENT_TYPES     10 /* vehicle .. unknown */
#define QC_AGENT_CATEGORIES 4 /* 0 fragment, 1 unscored, 2 scored, 3 focal */
#define QC_POLYGON_TYPES    4 /* VEHICLE, BIKE, BUS, PEDESTRIAN */
#define QC_POLYGON_INT      3 /* True, False, None */
#define QC_POINT_TYPES     17 /* lane-mark types .., CROSSWALK 15, CENTERLINE 16 */
#define QC_POINT_SIDES      3 /* LEFT, RIGHT, CENTER */
#define QC_PL2PL_TYPES      5 /* NONE, PRED, SUCC, LEFT, RIGHT */

struct qc_scene {
    char scenario_id[QC_SCENE_ID_MAX];
    char city[QC_SCENE_CITY_MAX];
    int64_t num_agents;   /* A */
    int64_t num_polygons; /* P */
    int64_t num_points;   /* Pt */
    int64_t num_pl2pl;    /* Et, typed lane-topology edges */
    int64_t av_index;     /* index of track "AV" */

    /* agents */
    const uint8_t *valid_mask;     /* (A,S) vector_repr validity for t < 50, raw after */
    const uint8_t *predict_mask;   /* (A,S) */
    const uint8_t *agent_type;     /* (A) 0..9 */
    const uint8_t *agent_category; /* (A) 0..3 */
    const float *position;         /* (A,S,3) city frame, z = 0; 0 where unobserved */
    const float *heading;          /* (A,S) radians */
    const float *velocity;         /* (A,S,3) m/s, z = 0 */
    const char (*agent_id)[QC_AGENT_ID_MAX]; /* (A) */

    /* map polygons */
    const float *pl_position;       /* (P,3) */
    const float *pl_orientation;    /* (P) */
    const float *pl_height;         /* (P) */
    const uint8_t *pl_type;         /* (P) 0..3 */
    const uint8_t *pl_is_intersection; /* (P) 0..2 */

    /* map points */
    const float *pt_position;    /* (Pt,3) */
    const float *pt_orientation; /* (Pt) */
    const float *pt_magnitude;   /* (Pt) */
    const float *pt_height;      /* (Pt) */
    const uint8_t *pt_type;      /* (Pt) 0..16 */
    const uint8_t *pt_side;      /* (Pt) 0..2 */
    const int64_t *pt2pl;        /* (2,Pt) row 0 point index, row 1 polygon index; dst sorted */

    /* typed polygon topology */
    const int64_t *pl2pl_edge;   /* (2,Et) row 0 source (related lane), row 1 destination */
    const uint8_t *pl2pl_type;   /* (Et) 1..4 */

    void *owned; /* non-NULL when the arrays live in one allocation owned by this scene */
};

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_SCENE_H */
