/*
 * qc_batch.h — B scenes collated the way PyG 2.3.0 collates QCNet's HeteroData (QCNET.md §4.5),
 * with the TargetBuilder output (§7.4) and, once built, every edge set (qc_graph.h).
 *
 * Node fields are concatenated along the node dimension; batch vectors (scene id per node) and
 * ptr vectors (B + 1 offsets) are added per node type; the topology edges are shifted by the
 * node counts of the scenes before them (pt2pl by [ΣPt; ΣP], pl2pl by [ΣP; ΣP]); av_index is
 * NOT shifted (PyG collates a Python int without offset).
 *
 * Memory: every array lives in at most two blocks obtained from a caller-supplied host
 * allocator (struct qc_host_alloc; the loader passes the pinned allocator so batches are ready
 * for an asynchronous copy), one for the node fields and one for the packed graph.
 * qc_batch_release() gives both back. Field invariants: agent_ptr[B] == num_agents,
 * agent_batch[a] == b for agent_ptr[b] <= a < agent_ptr[b+1]; likewise for polygons and
 * points; pl2pl_ptr gives each scene's slice of the typed edges.
 */
#ifndef QC_DATA_QC_BATCH_H
#define QC_DATA_QC_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_graph.h"
#include "qc_scene.h"
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_safetensors;

#define QC_BATCH_FUTURE_STEPS 60 /* TargetBuilder(50, 60) */

/* A host allocator hook. alloc returns memory aligned to at least 64 bytes or NULL; free
 * receives the pointer and the size that was asked for. Must be thread-safe (loader threads
 * call it concurrently). */
struct qc_host_alloc {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p, size_t bytes);
    void *ctx;
};

/* The default hook: aligned_alloc / free. */
extern const struct qc_host_alloc qc_host_alloc_malloc;

struct qc_batch {
    int64_t num_scenes;   /* B */
    int64_t num_agents;   /* A = Σ A_b */
    int64_t num_polygons; /* P */
    int64_t num_points;   /* Pt */
    int64_t num_pl2pl;    /* Et, typed pl2pl edges */

    int64_t *agent_ptr;                   /* (B+1) */
    int64_t *pl_ptr;                      /* (B+1) */
    int64_t *pt_ptr;                      /* (B+1) */
    int64_t *pl2pl_ptr;                   /* (B+1) typed-edge offsets per scene */
    int64_t *av_index;                    /* (B) scene-local, not shifted (PyG int collation) */
    int64_t *scene_index;                 /* (B) dataset index of each scene (loader), or -1 */
    char (*scenario_id)[QC_SCENE_ID_MAX]; /* (B) */
    char (*city)[QC_SCENE_CITY_MAX];      /* (B) */

    uint8_t *valid_mask;               /* (A,110) */
    uint8_t *predict_mask;             /* (A,110) */
    uint8_t *agent_type;               /* (A) */
    uint8_t *agent_category;           /* (A) */
    float *position;                   /* (A,110,3) */
    float *heading;                    /* (A,110) */
    float *velocity;                   /* (A,110,3) */
    float *target;                     /* (A,60,4) TargetBuilder output; NULL when not built */
    int64_t *agent_batch;              /* (A) */
    char (*agent_id)[QC_AGENT_ID_MAX]; /* (A) */

    float *pl_position;          /* (P,3) */
    float *pl_orientation;       /* (P) */
    float *pl_height;            /* (P) */
    uint8_t *pl_type;            /* (P) */
    uint8_t *pl_is_intersection; /* (P) */
    int64_t *pl_batch;           /* (P) */

    float *pt_position;    /* (Pt,3) */
    float *pt_orientation; /* (Pt) */
    float *pt_magnitude;   /* (Pt) */
    float *pt_height;      /* (Pt) */
    uint8_t *pt_type;      /* (Pt) */
    uint8_t *pt_side;      /* (Pt) */
    int64_t *pt_batch;     /* (Pt) */
    int64_t *pt2pl;        /* (2,Pt) shifted */
    int64_t *pl2pl_edge;   /* (2,Et) shifted */
    uint8_t *pl2pl_type;   /* (Et) */

    bool has_graph;        /* graph below is built */
    struct qc_graph graph; /* arrays in graph_mem */

    /* storage */
    struct qc_host_alloc alloc;
    void *node_mem;
    size_t node_bytes;
    void *graph_mem;
    size_t graph_bytes;
};

/* Collates scenes[0..B) into *out (node fields, batch/ptr vectors, shifted topology, and the
 * TargetBuilder target when with_target). Memory from alloc (NULL = qc_host_alloc_malloc).
 * QC_ERR_NOMEM when the hook fails; QC_ERR_INVALID when a scene is inconsistent. */
enum qc_status qc_batch_collate(const struct qc_scene *const *scenes, int64_t B,
                                const struct qc_host_alloc *alloc, bool with_target,
                                struct qc_batch *out);

/* Builds the collated batch from a safetensors file holding QCNet's own collated field names
 * (`agent.position`, `map_polygon.ptr`, `map_point__to__map_polygon.edge_index`, ...; the layout
 * of tests/data/qcnet-parity-tiny/batch.safetensors). Checks every shape, dtype and index
 * range. `agent.target` is read when present. QC_ERR_INVALID naming the field on mismatch. */
enum qc_status qc_batch_from_safetensors(const struct qc_safetensors *st,
                                         const struct qc_host_alloc *alloc, struct qc_batch *out);

/* Builds every edge set with builder b and packs it into one block from the batch's
 * allocator (sets batch->has_graph). */
enum qc_status qc_batch_build_graph(struct qc_batch *batch, struct qc_graph_builder *b,
                                    const struct qc_graph_params *p);

/* Writes the TargetBuilder output (QCNET.md §7.4) for agents [a0, a1) of the batch into target
 * ((a1 − a0), 60, 4), using the exact fp32 operation order of the Python. */
void qc_batch_target(const struct qc_batch *batch, int64_t a0, int64_t a1, float *target);

/* A view of batch for a device: counts copied, every array pointer moved from batch's two
 * storage blocks onto node_dev / graph_dev, which hold (or will hold once a copy completes)
 * byte-for-byte copies of batch->node_mem (node_bytes) and batch->graph_mem (graph_bytes). The
 * view owns nothing (its storage fields are zero: never release it). NULL arrays stay NULL; an
 * empty array may point one past the end of its block; an array outside both blocks aborts
 * (programmer error). Host-only: it computes addresses and never touches node_dev/graph_dev. */
void qc_batch_rebase(const struct qc_batch *batch, void *node_dev, void *graph_dev,
                     struct qc_batch *view);

/* Gives back both blocks; NULL or an empty batch is a no-op. */
void qc_batch_release(struct qc_batch *batch);

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_BATCH_H */
