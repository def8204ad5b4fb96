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

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_SCENE_STEPS      110 /* 50 history + 60 future */
#define QC_SCENE_HIST_STEPS 50
#define QC_SCENE_ID_MAX     64 /* scenario id, NUL-terminated */
#define QC_SCENE_CITY_MAX   32
#define QC_AGENT_ID_MAX     32 /* AV2 track id ("AV", "138951"), NUL-terminated */

/* Vocabulary sizes (QCNET.md §7.2–7.3). */
#define QC_AGENT_TYPES      10 /* vehicle .. unknown */
#define QC_AGENT_CATEGORIES 4  /* 0 fragment, 1 unscored, 2 scored, 3 focal */
#define QC_POLYGON_TYPES    4  /* VEHICLE, BIKE, BUS, PEDESTRIAN */
#define QC_POLYGON_INT      3  /* True, False, None */
#define QC_POINT_TYPES      17 /* lane-mark types .., CROSSWALK 15, CENTERLINE 16 */
#define QC_POINT_SIDES      3  /* LEFT, RIGHT, CENTER */
#define QC_PL2PL_TYPES      5  /* NONE, PRED, SUCC, LEFT, RIGHT */

struct qc_scene {
    char scenario_id[QC_SCENE_ID_MAX];
    char city[QC_SCENE_CITY_MAX];
    int64_t num_agents;   /* A */
    int64_t num_polygons; /* P */
    int64_t num_points;   /* Pt */
    int64_t num_pl2pl;    /* Et, typed lane-topology edges */
    int64_t av_index;     /* index of track "AV" */

    /* agents */
    const uint8_t *valid_mask;               /* (A,S) vector_repr validity for t < 50, raw after */
    const uint8_t *predict_mask;             /* (A,S) */
    const uint8_t *agent_type;               /* (A) 0..9 */
    const uint8_t *agent_category;           /* (A) 0..3 */
    const float *position;                   /* (A,S,3) city frame, z = 0; 0 where unobserved */
    const float *heading;                    /* (A,S) radians */
    const float *velocity;                   /* (A,S,3) m/s, z = 0 */
    const char (*agent_id)[QC_AGENT_ID_MAX]; /* (A) */

    /* map polygons */
    const float *pl_position;          /* (P,3) */
    const float *pl_orientation;       /* (P) */
    const float *pl_height;            /* (P) */
    const uint8_t *pl_type;            /* (P) 0..3 */
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
    const int64_t *pl2pl_edge; /* (2,Et) row 0 source (related lane), row 1 destination */
    const uint8_t *pl2pl_type; /* (Et) 1..4 */

    void *owned; /* non-NULL when the arrays live in one allocation owned by this scene */
};

// ---- ownership, layout and validation (scene.c) ------------------------------------------

/* The 22 arrays of a scene, in qcshard record order (docs/QCSHARD.md). */
enum qc_scene_array {
    QC_SCENE_VALID_MASK = 0,
    QC_SCENE_PREDICT_MASK,
    QC_SCENE_AGENT_TYPE,
    QC_SCENE_AGENT_CATEGORY,
    QC_SCENE_POSITION,
    QC_SCENE_HEADING,
    QC_SCENE_VELOCITY,
    QC_SCENE_AGENT_ID,
    QC_SCENE_PL_POSITION,
    QC_SCENE_PL_ORIENTATION,
    QC_SCENE_PL_HEIGHT,
    QC_SCENE_PL_TYPE,
    QC_SCENE_PL_IS_INTERSECTION,
    QC_SCENE_PT_POSITION,
    QC_SCENE_PT_ORIENTATION,
    QC_SCENE_PT_MAGNITUDE,
    QC_SCENE_PT_HEIGHT,
    QC_SCENE_PT_TYPE,
    QC_SCENE_PT_SIDE,
    QC_SCENE_PT2PL,
    QC_SCENE_PL2PL_EDGE,
    QC_SCENE_PL2PL_TYPE,
    QC_SCENE_ARRAY_COUNT /* must be last */
};

/* Where each array sits in one contiguous block (the qcshard record body, and the block an
 * owned scene allocates): offsets from the block start, each a multiple of 8, and the bytes of
 * each array without padding. size = total block bytes (a multiple of 8). */
struct qc_scene_layout {
    uint64_t offset[QC_SCENE_ARRAY_COUNT]; /* bytes from the block start */
    uint64_t bytes[QC_SCENE_ARRAY_COUNT];  /* array bytes, excluding padding */
    uint64_t size;                         /* total bytes, pad8(last offset + last bytes) */
};

/* Largest counts a scene may have (docs/QCSHARD.md); they keep every size below 2^40. */
#define QC_SCENE_MAX_AGENTS   65536
#define QC_SCENE_MAX_POLYGONS (1ll << 24)
#define QC_SCENE_MAX_POINTS   (1ll << 28)
#define QC_SCENE_MAX_PL2PL    (1ll << 28)

/* Fills *out for the counts, laid out from byte `base` on (base is a multiple of 8: 0 for an
 * owned block, 144 for a qcshard record whose header precedes the arrays). Returns
 * QC_ERR_INVALID (message names the count) when a count is negative or above its maximum. */
enum qc_status qc_scene_layout_compute(int64_t num_agents, int64_t num_polygons, int64_t num_points,
                                       int64_t num_pl2pl, uint64_t base,
                                       struct qc_scene_layout *out);

/* Name of an array as errors print it ("pl2pl_edge"). */
const char *qc_scene_array_name(enum qc_scene_array k);

/* Writable views of an owned scene's arrays (same shapes as struct qc_scene). */
struct qc_scene_mut {
    uint8_t *valid_mask, *predict_mask, *agent_type, *agent_category;
    float *position, *heading, *velocity;
    char (*agent_id)[QC_AGENT_ID_MAX];
    float *pl_position, *pl_orientation, *pl_height;
    uint8_t *pl_type, *pl_is_intersection;
    float *pt_position, *pt_orientation, *pt_magnitude, *pt_height;
    uint8_t *pt_type, *pt_side;
    int64_t *pt2pl, *pl2pl_edge;
    uint8_t *pl2pl_type;
};

/* Allocates one zero-filled block for a scene with these counts, sets the counts and the const
 * views of *scene (scenario_id, city, av_index zeroed) and, when mut != NULL, the writable
 * views. scene->owned holds the block; release it with qc_scene_free(). On error *scene is
 * untouched. Returns QC_ERR_INVALID (bad count) or QC_ERR_NOMEM. */
enum qc_status qc_scene_alloc(struct qc_scene *scene, struct qc_scene_mut *mut, int64_t num_agents,
                              int64_t num_polygons, int64_t num_points, int64_t num_pl2pl);

/* Releases an owned scene's block and zeroes *scene. A view into a qcshard mapping (owned ==
 * NULL) is only zeroed; NULL is a no-op. */
void qc_scene_free(struct qc_scene *scene);

/* Deep copy of any scene (view or owned) into a new owned scene. */
enum qc_status qc_scene_copy(const struct qc_scene *src, struct qc_scene *dst);

/* Checks every value rule of docs/QCSHARD.md ("value rules", items 3-8) on a scene: strings
 * terminated, av_index names "AV", booleans 0/1 with the §7.2 mask rules, enumerations in
 * range, floats finite, pt2pl and pl2pl indices in range with pt2pl sorted. On failure returns
 * QC_ERR_INVALID with "<file>: record <record>: field <name>[i][j]: <what>" (the "file: record
 * N: " prefix is left out when file is NULL). Read-only; thread-safe. */
enum qc_status qc_scene_validate(const struct qc_scene *scene, const char *file, int64_t record);

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_SCENE_H */
