/*
 * qc_graph.h — every QCNet edge set of a collated batch (QCNET.md §4, §5), built on the CPU
 * with the official semantics, as CSR by destination with the raw relative edge features.
 *
 * Glossary.
 *   edge set   one of pt2pl, pl2pl, t, pl2a, a2a, t2m, pl2m, a2m, m2m (QCNET.md §5.5).
 *   base edges the edges built once per batch. For the decoder sets t2m, pl2m and a2m the
 *              attention layers see every base edge K times (one per mode); that expansion is
 *              a view computed by qc_graph_layer_csr()/qc_graph_layer_official().
 *   CSR order  edges sorted by destination, then by ascending source. Every set is stored in
 *              this order; the model aggregates in it, which makes reductions deterministic.
 *   official   the order in which QCNet hands the edges to its layers. For every set it is one
 *              of the two lexicographic orders of (src, dst) pairs: (dst, src) for pt2pl, a2a,
 *              t2m, a2m (equal to CSR) and (src, dst) for pl2pl, t, pl2a, pl2m, m2m. perm maps
 *              CSR positions to official positions.
 *
 * Node numbering of each set (A agents, P polygons, Pt points, T = 50, K modes, all summed
 * over the batch; agent-major a·T + t, time-major t·A + a):
 *   set    src                      dst                      features (raw, fp32)
 *   pt2pl  point q                  polygon p                |r|, ∠(u_p, r), wrap(φ_q − φ_p)
 *   pl2pl  polygon j                polygon i                same + type (0 NONE .. 4 RIGHT)
 *   t      a·T + s (agent-major)    a·T + t                  |r|, ∠(h_t, r), wrap(θ_s − θ_t), s − t
 *   pl2a   t·P + p (time-major)     t·A + a (time-major)     |r|, ∠(h_{a,t}, r), wrap(φ_p −
 * θ_{a,t}) a2a    t·A + b                  t·A + a                  |r|, ∠(h_{a,t}, r), wrap(θ_b −
 * θ_a) t2m    a·T + t                  base a; layer a·K + k    |r|, ∠(h_m, r), wrap(θ_t − θ_m), t
 * − 49 pl2m   base p; layer k·P + p    base a; layer k·A + a    |r|, ∠(h_m, r), wrap(φ_p − θ_m) a2m
 * base b; layer k·A + b    base a; layer k·A + a    |r|, ∠(h_m, r), wrap(θ_b − θ_m) m2m    a·K + i
 * a·K + j (self included)  none where r = source position − destination position (x, y), ∠ is
 * angle_between_2d_vectors and every operation is the fp32 operation PyTorch performs (QCNET.md
 * §3.0): the dot product of ∠ starts from +0, wrap_angle uses fp32 π and 2π and PyTorch's floating
 * remainder.
 *
 * Radius queries use a uniform grid (cell ≥ radius) per (scene[, step]) example, with the
 * torch-cluster GPU rule: candidates in ascending index, strict fp32 d² = 0 + dx² + dy² <
 * (float)(r·r), the first max_num_neighbors accepted kept (max_num_neighbors + 1 for
 * radius_graph, self removed afterwards), candidates counted before any mask filter.
 */
#ifndef QC_DATA_QC_GRAPH_H
#define QC_DATA_QC_GRAPH_H

#include <stdint.h>

#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct qc_batch;

enum qc_edge_set {
    QC_EDGE_PT2PL = 0,
    QC_EDGE_PL2PL,
    QC_EDGE_T,
    QC_EDGE_PL2A,
    QC_EDGE_A2A,
    QC_EDGE_T2M,
    QC_EDGE_PL2M,
    QC_EDGE_A2M,
    QC_EDGE_M2M,
    QC_EDGE_SET_COUNT /* must be last */
};

#define QC_GRAPH_MAX_FEAT 4

/* Graph hyper-parameters (QCNET.md §1); qc_graph_params_default() gives the official ones. */
struct qc_graph_params {
    double pl2pl_radius;       /* m, 150 */
    double pl2a_radius;        /* m, 50 */
    double a2a_radius;         /* m, 50 */
    double pl2m_radius;        /* m, 150 */
    double a2m_radius;         /* m, 150 */
    int64_t time_span;         /* 10: t edges connect s < t with t − s ≤ time_span */
    int64_t num_t2m_steps;     /* 30: t2m sources are steps 50 − num_t2m_steps .. 49 */
    int64_t num_modes;         /* K, 6 */
    int64_t max_num_neighbors; /* 300 */
};

void qc_graph_params_default(struct qc_graph_params *p);

/* One edge set, in CSR order. Arrays are owned by whoever built or packed the graph. */
struct qc_edges {
    int64_t num_edges; /* E: base edges */
    int64_t num_src;   /* source nodes in base numbering */
    int64_t num_dst;   /* destination nodes in base numbering */
    int num_feat;      /* feature columns (0 for m2m) */
    int64_t *src;      /* (E) sorted by dst, then src */
    int64_t *dst;      /* (E) */
    int64_t *dst_ptr;  /* (num_dst + 1): edges of dst d are [dst_ptr[d], dst_ptr[d+1]) */
    int64_t *perm;     /* (E) official position of CSR edge i; NULL when CSR == official */
    float *attr;       /* (E, num_feat) raw relative features; NULL when num_feat == 0 */
    uint8_t *type;     /* (E) pl2pl edge type 0..4; NULL for every other set */
};

struct qc_graph {
    int64_t num_scenes;   /* B */
    int64_t num_agents;   /* A */
    int64_t num_polygons; /* P */
    int64_t num_points;   /* Pt */
    int64_t num_modes;    /* K */
    struct qc_edges e[QC_EDGE_SET_COUNT];
    double build_seconds[QC_EDGE_SET_COUNT]; /* thread CPU time spent building each set */
};

/* "pt2pl", "pl2pl", "t", "pl2a", "a2a", "t2m", "pl2m", "a2m", "m2m". */
const char *qc_edge_set_name(enum qc_edge_set s);
/* The set called name, or -1. */
int qc_edge_set_from_name(const char *name);
/* Feature columns of a set: 3, 3, 4, 3, 3, 4, 3, 3, 0. */
int qc_edge_set_num_feat(enum qc_edge_set s);

/* Edges the attention layers see: E·K for t2m, pl2m, a2m; E for the others. This is also the
 * count QCNET.md §8.1 gives per scene. */
int64_t qc_graph_layer_num_edges(const struct qc_graph *g, enum qc_edge_set s);
/* Destination nodes of the layer: K·A for t2m/pl2m/a2m/m2m, the base count otherwise. */
int64_t qc_graph_layer_num_dst(const struct qc_graph *g, enum qc_edge_set s);

/* The layer's edges in CSR order of the layer's own destination numbering. Writes, for each of
 * the qc_graph_layer_num_edges() edges, src and dst (layer numbering) and base (the CSR index
 * of the base edge whose features and type apply), and dst_ptr (layer dsts + 1). Any output
 * may be NULL. For non-decoder sets this is a copy of the stored arrays (base = identity). */
void qc_graph_layer_csr(const struct qc_graph *g, enum qc_edge_set s, int64_t *src, int64_t *dst,
                        int64_t *base, int64_t *dst_ptr);
/* The layer's edge_index exactly as QCNet passes it: (2, E_layer) row 0 source, row 1
 * destination, in the official order; base as above (may be NULL). */
void qc_graph_layer_official(const struct qc_graph *g, enum qc_edge_set s, int64_t *edge_index,
                             int64_t *base);

// ---- building ------------------------------------------------------------------------------

/* Per-thread scratch for qc_graph_build. Not thread-safe: one builder per thread. */
struct qc_graph_builder;

enum qc_status qc_graph_builder_create(struct qc_graph_builder **out);
void qc_graph_builder_destroy(struct qc_graph_builder *b);

/* Builds every edge set of the collated batch. On QC_OK the arrays of *out live in the
 * builder's scratch and stay valid until the next build or destroy (qc_graph_pack copies them
 * out). QC_ERR_INVALID when the batch is inconsistent (e.g. a topology edge leaving its scene),
 * QC_ERR_NOMEM. */
enum qc_status qc_graph_build(struct qc_graph_builder *b, const struct qc_graph_params *p,
                              const struct qc_batch *batch, struct qc_graph *out);

/* Bytes qc_graph_pack needs for g (64-byte aligned arrays). */
size_t qc_graph_packed_bytes(const struct qc_graph *g);
/* Copies every array of g into mem (qc_graph_packed_bytes(g) bytes, 64-byte aligned) and
 * makes *out a graph whose arrays point there. g and out may be the same object. */
void qc_graph_pack(const struct qc_graph *g, void *mem, struct qc_graph *out);

/* Total layer edges over all sets (the batch's edge cost). */
int64_t qc_graph_total_layer_edges(const struct qc_graph *g);

#ifdef __cplusplus
}
#endif

#endif /* QC_DATA_QC_GRAPH_H */
