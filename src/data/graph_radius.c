/*
 * graph_radius.c — radius queries through a uniform grid with torch-cluster 1.6.1's GPU
 * semantics (QCNET.md §4.1): the accepted set of a query is exactly the set the CUDA kernel
 * produces, including which candidates the max_num_neighbors cap keeps (the lowest indices).
 */
#include "graph_internal.h"

#include <stdlib.h>
#include <string.h>

void graph_grid_deinit(struct graph_grid *g)
{
    free(g->start);
    free(g->items);
    free(g->cellof);
    free(g->flag);
    memset(g, 0, sizeof(*g));
}

static bool grid_finite2(const float *p)
{
    return isfinite(p[0]) && isfinite(p[1]);
}

/* Cells along one axis for the span [lo, hi], in double: the span of far-flung (but finite)
 * coordinates can exceed any integer, so it is converted only once it is known to be small. */
static double grid_cells(double lo, double hi, double cell)
{
    /* Query cells lie in [1, nc − 2], so the 3×3 neighbourhood never leaves the grid. */
    return floor((hi - (lo - cell)) / cell) + 2.0;
}

enum qc_status graph_grid_build(struct graph_grid *g, const float *pts, int64_t stride, int64_t n,
                                const float *qpts, int64_t qstride, int64_t nq, double r)
{
    g->n = n;
    g->empty = true;
    double xmin = HUGE_VAL, ymin = HUGE_VAL, xmax = -HUGE_VAL, ymax = -HUGE_VAL;
    for (int64_t q = 0; q < nq; q++) {
        const float *p = qpts + q * qstride;
        if (!grid_finite2(p))
            continue;
        xmin = fmin(xmin, (double)p[0]);
        xmax = fmax(xmax, (double)p[0]);
        ymin = fmin(ymin, (double)p[1]);
        ymax = fmax(ymax, (double)p[1]);
    }
    if (n == 0 || !(r > 0.0) || !(xmin <= xmax))
        return QC_OK;
    g->cell = r * (1.0 + 1e-5);
    /* Keep the grid proportional to the work: widen the cells of sparse, far-flung scenes. */
    const double limit = 4.0 * (double)(n + nq) + 64.0;
    while (grid_cells(xmin, xmax, g->cell) * grid_cells(ymin, ymax, g->cell) > limit)
        g->cell *= 2.0;
    g->ox = xmin - g->cell;
    g->oy = ymin - g->cell;
    g->ncx = (int64_t)grid_cells(xmin, xmax, g->cell);
    g->ncy = (int64_t)grid_cells(ymin, ymax, g->cell);
    int64_t ncell = g->ncx * g->ncy;
    if (ncell + 1 > g->cap_cells) {
        int64_t *s = realloc(g->start, (size_t)(ncell + 1) * sizeof(int64_t));
        if (!s)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for a %lld-cell grid",
                             (long long)ncell);
        g->start = s;
        g->cap_cells = ncell + 1;
    }
    if (n > g->cap_pts) {
        int64_t *it = realloc(g->items, (size_t)n * sizeof(int64_t));
        if (!it)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for grid items");
        g->items = it;
        int64_t *co = realloc(g->cellof, (size_t)n * sizeof(int64_t));
        if (!co)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for grid items");
        g->cellof = co;
        uint8_t *fl = realloc(g->flag, (size_t)n);
        if (!fl)
            return qc_errorf(QC_ERR_NOMEM, "graph: out of memory for grid items");
        g->flag = fl;
        memset(g->flag, 0, (size_t)n);
        g->cap_pts = n;
    }
    memset(g->start, 0, (size_t)(ncell + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        const float *p = pts + i * stride;
        g->cellof[i] = -1;
        if (!grid_finite2(p))
            continue;
        double fx = floor(((double)p[0] - g->ox) / g->cell);
        double fy = floor(((double)p[1] - g->oy) / g->cell);
        if (fx < 0.0 || fy < 0.0 || fx >= (double)g->ncx || fy >= (double)g->ncy)
            continue;
        int64_t c = (int64_t)fy * g->ncx + (int64_t)fx;
        g->cellof[i] = c;
        g->start[c + 1]++;
    }
    for (int64_t c = 0; c < ncell; c++)
        g->start[c + 1] += g->start[c];
    /* Stable counting sort: indices stay ascending within each cell. start[c] serves as the
     * fill cursor and is shifted back afterwards. */
    for (int64_t i = 0; i < n; i++) {
        int64_t c = g->cellof[i];
        if (c < 0)
            continue;
        g->items[g->start[c]++] = i;
    }
    for (int64_t c = ncell; c > 0; c--)
        g->start[c] = g->start[c - 1];
    g->start[0] = 0;
    g->empty = false;
    return QC_OK;
}

static int grid_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void grid_sort(int64_t *v, int64_t n)
{
    if (n <= 24) {
        for (int64_t i = 1; i < n; i++) {
            int64_t x = v[i], j = i;
            while (j > 0 && v[j - 1] > x) {
                v[j] = v[j - 1];
                j--;
            }
            v[j] = x;
        }
    } else {
        qsort(v, (size_t)n, sizeof(int64_t), grid_cmp_i64);
    }
}

int64_t graph_grid_query(const struct graph_grid *g, const float *pts, int64_t stride, float qx,
                         float qy, float r2, int64_t cap, bool sorted, int64_t *out)
{
    if (g->empty || !isfinite(qx) || !isfinite(qy))
        return 0;
    int64_t cx = (int64_t)floor(((double)qx - g->ox) / g->cell);
    int64_t cy = (int64_t)floor(((double)qy - g->oy) / g->cell);
    int64_t cnt = 0;
    for (int64_t y = cy - 1; y <= cy + 1; y++) {
        if (y < 0 || y >= g->ncy)
            continue;
        for (int64_t x = cx - 1; x <= cx + 1; x++) {
            if (x < 0 || x >= g->ncx)
                continue;
            int64_t c = y * g->ncx + x;
            for (int64_t k = g->start[c]; k < g->start[c + 1]; k++) {
                int64_t i = g->items[k];
                const float *p = pts + i * stride;
                /* torch-cluster: dist = 0; dist += (x_d − y_d)²; strict dist < r². */
                float dx = p[0] - qx;
                float dy = p[1] - qy;
                float d2 = 0.0f;
                d2 += dx * dx;
                d2 += dy * dy;
                if (d2 < r2)
                    out[cnt++] = i;
            }
        }
    }
    if ((cnt > cap || sorted) && cnt > 1) {
        if (cnt <= 16) {
            grid_sort(out, cnt);
        } else {
            /* many hits: mark and sweep the candidates in index order, O(n) */
            for (int64_t k = 0; k < cnt; k++)
                g->flag[out[k]] = 1;
            int64_t o = 0;
            for (int64_t i = 0; o < cnt; i++)
                if (g->flag[i]) {
                    g->flag[i] = 0;
                    out[o++] = i;
                }
        }
    }
    /* The kernel scans in ascending index and stops at cap: the lowest cap indices survive. */
    return cnt > cap ? cap : cnt;
}
