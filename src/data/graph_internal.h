/*
 * graph_internal.h — shared between the graph_*.c files of src/data: the uniform grid that
 * answers radius queries with the torch-cluster GPU rule, and the fp32 geometry helpers in
 * PyTorch's operation order (QCNET.md §3.0).
 */
#ifndef QC_DATA_GRAPH_INTERNAL_H
#define QC_DATA_GRAPH_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "qc_status.h"

// ---- fp32 geometry, PyTorch operation order -------------------------------------------------

#define GRAPH_PI_F     3.14159274101257324f /* float(math.pi) */
#define GRAPH_TWO_PI_F 6.28318548202514648f /* float(2 * math.pi) */

/* utils/geometry.py wrap_angle: −π + remainder(α + π, 2π), each one fp32 op; remainder is
 * PyTorch's floating remainder (fmod, then + divisor when the signs differ). */
static inline float graph_wrap_angle(float a)
{
    float x = a + GRAPH_PI_F;
    /* fmod(x, y) is x itself when |x| < y: skip the libm call on the common path */
    float m = fabsf(x) < GRAPH_TWO_PI_F ? x : fmodf(x, GRAPH_TWO_PI_F);
    if (m != 0.0f && (m < 0.0f) != (GRAPH_TWO_PI_F < 0.0f))
        m = m + GRAPH_TWO_PI_F;
    return -GRAPH_PI_F + m;
}

/* angle_between_2d_vectors(ctr, nbr) = atan2(c0·n1 − c1·n0, sum(c ⊙ n)); the sum reduction
 * starts from +0, so a zero nbr gives a +0 dot and an angle of ±0, never ±π. */
static inline float graph_angle_between(float c0, float c1, float n0, float n1)
{
    float p0 = c0 * n1;
    float p1 = c1 * n0;
    float cross = p0 - p1;
    float dot = 0.0f;
    dot += c0 * n0;
    dot += c1 * n1;
    return atan2f(cross, dot);
}

/* torch.norm(v[:, :2], p=2, dim=-1): sqrt of a +0-started fp32 sum of squares. */
static inline float graph_norm2(float x, float y)
{
    float s = 0.0f;
    s += x * x;
    s += y * y;
    return sqrtf(s);
}

// ---- radius grid -----------------------------------------------------------------------------

/* A uniform grid over n candidate points (x at pts[i*stride], y at pts[i*stride+1]), sized
 * from the bounding box of the queries it will answer, with cells of at least the radius (a
 * little more, so an fp32 d² that rounds below r² for a point just beyond r is still found in
 * the 3×3 neighbourhood). Points farther than one cell from every query are left out. */
struct graph_grid {
    double ox, oy;    /* origin: one cell below the queries' minimum */
    double cell;      /* cell size, ≥ r·(1 + 1e-5) */
    int64_t ncx, ncy; /* cells per axis */
    int64_t n;        /* candidate points */
    int64_t *start;   /* (ncx·ncy + 1) first item of each cell */
    int64_t *items;   /* point indices by cell, ascending within a cell */
    int64_t *cellof;  /* (n) cell of each point, or −1 */
    uint8_t *flag;    /* (n) scratch of graph_grid_query, all zero between calls */
    int64_t cap_cells, cap_pts;
    bool empty; /* no query can accept anything */
};

void graph_grid_deinit(struct graph_grid *g);
/* Builds the grid over pts (n points) for queries qpts (nq points) at radius r. */
enum qc_status graph_grid_build(struct graph_grid *g, const float *pts, int64_t stride, int64_t n,
                                const float *qpts, int64_t qstride, int64_t nq, double r);
/* The torch-cluster radius kernel for one query (qx, qy): candidates in ascending index,
 * accepted when 0 + dx² + dy² < r2 in fp32 (dx = candidate − query), keeping the first cap
 * accepted. Writes the kept indices to out (room for n) and returns how many. They are in
 * ascending order when sorted is true or when the cap bound; otherwise in grid order. */
int64_t graph_grid_query(const struct graph_grid *g, const float *pts, int64_t stride, float qx,
                         float qy, float r2, int64_t cap, bool sorted, int64_t *out);

/* (float)(r·r), the threshold torch-cluster compares against. */
static inline float graph_radius2(double r)
{
    return (float)(r * r);
}

#endif /* QC_DATA_GRAPH_INTERNAL_H */
