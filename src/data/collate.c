/*
 * collate.c — PyG-style collation of B scenes (QCNET.md §4.5), the TargetBuilder (§7.4), a
 * batch read back from QCNet's own collated field names in a safetensors file, and packing the
 * built graph next to the batch.
 */
#include "qc_batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "graph_internal.h"
#include "qc_safetensors.h"

#define S_ALL  QC_SCENE_STEPS
#define T_HIST QC_SCENE_HIST_STEPS
#define T_FUT  QC_BATCH_FUTURE_STEPS

static void *malloc_hook_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void malloc_hook_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(p);
}

const struct qc_host_alloc qc_host_alloc_malloc = {malloc_hook_alloc, malloc_hook_free, NULL};

// ---- layout of the node block ------------------------------------------------------------

struct lay {
    unsigned char *base; /* NULL while sizing */
    size_t off;
};

static void *lay_take(struct lay *l, size_t bytes)
{
    void *p = l->base ? l->base + l->off : NULL;
    l->off += (bytes + 63) / 64 * 64;
    return p;
}

/* Assigns every node-field pointer of b inside l (sizes from b's counts). Returns the bytes. */
static size_t batch_layout(struct qc_batch *b, unsigned char *base, bool with_target)
{
    struct lay l = {base, 0};
    size_t B = (size_t)b->num_scenes, A = (size_t)b->num_agents, P = (size_t)b->num_polygons,
           Pt = (size_t)b->num_points, Et = (size_t)b->num_pl2pl;
    const size_t i8 = sizeof(int64_t), f4 = sizeof(float);
    b->agent_ptr = lay_take(&l, (B + 1) * i8);
    b->pl_ptr = lay_take(&l, (B + 1) * i8);
    b->pt_ptr = lay_take(&l, (B + 1) * i8);
    b->pl2pl_ptr = lay_take(&l, (B + 1) * i8);
    b->av_index = lay_take(&l, B * i8);
    b->scene_index = lay_take(&l, B * i8);
    b->scenario_id = lay_take(&l, B * QC_SCENE_ID_MAX);
    b->city = lay_take(&l, B * QC_SCENE_CITY_MAX);
    b->valid_mask = lay_take(&l, A * S_ALL);
    b->predict_mask = lay_take(&l, A * S_ALL);
    b->agent_type = lay_take(&l, A);
    b->agent_category = lay_take(&l, A);
    b->position = lay_take(&l, A * S_ALL * 3 * f4);
    b->heading = lay_take(&l, A * S_ALL * f4);
    b->velocity = lay_take(&l, A * S_ALL * 3 * f4);
    b->target = with_target ? lay_take(&l, A * T_FUT * 4 * f4) : NULL;
    b->agent_batch = lay_take(&l, A * i8);
    b->agent_id = lay_take(&l, A * QC_AGENT_ID_MAX);
    b->pl_position = lay_take(&l, P * 3 * f4);
    b->pl_orientation = lay_take(&l, P * f4);
    b->pl_height = lay_take(&l, P * f4);
    b->pl_type = lay_take(&l, P);
    b->pl_is_intersection = lay_take(&l, P);
    b->pl_batch = lay_take(&l, P * i8);
    b->pt_position = lay_take(&l, Pt * 3 * f4);
    b->pt_orientation = lay_take(&l, Pt * f4);
    b->pt_magnitude = lay_take(&l, Pt * f4);
    b->pt_height = lay_take(&l, Pt * f4);
    b->pt_type = lay_take(&l, Pt);
    b->pt_side = lay_take(&l, Pt);
    b->pt_batch = lay_take(&l, Pt * i8);
    b->pt2pl = lay_take(&l, 2 * Pt * i8);
    b->pl2pl_edge = lay_take(&l, 2 * Et * i8);
    b->pl2pl_type = lay_take(&l, Et);
    return l.off;
}

static enum qc_status batch_alloc(struct qc_batch *b, const struct qc_host_alloc *alloc,
                                  bool with_target)
{
    b->alloc = alloc ? *alloc : qc_host_alloc_malloc;
    size_t bytes = batch_layout(b, NULL, with_target);
    if (bytes == 0)
        bytes = 64;
    unsigned char *mem = b->alloc.alloc(b->alloc.ctx, bytes);
    if (!mem)
        return qc_errorf(QC_ERR_NOMEM,
                         "batch: host allocator refused %zu bytes for %lld scenes (%lld agents, "
                         "%lld polygons, %lld points)",
                         bytes, (long long)b->num_scenes, (long long)b->num_agents,
                         (long long)b->num_polygons, (long long)b->num_points);
    batch_layout(b, mem, with_target);
    b->node_mem = mem;
    b->node_bytes = bytes;
    return QC_OK;
}

void qc_batch_release(struct qc_batch *b)
{
    if (!b)
        return;
    if (b->node_mem)
        b->alloc.free(b->alloc.ctx, b->node_mem, b->node_bytes);
    if (b->graph_mem)
        b->alloc.free(b->alloc.ctx, b->graph_mem, b->graph_bytes);
    memset(b, 0, sizeof(*b));
}

// ---- TargetBuilder -------------------------------------------------------------------------

void qc_batch_target(const struct qc_batch *b, int64_t a0, int64_t a1, float *target)
{
    for (int64_t a = a0; a < a1; a++) {
        const float *o = b->position + (a * S_ALL + T_HIST - 1) * 3;
        float th = b->heading[a * S_ALL + T_HIST - 1];
        float c = cosf(th), s = sinf(th), ns = -s;
        float *out = target + (a - a0) * T_FUT * 4;
        for (int64_t k = 0; k < T_FUT; k++) {
            const float *p = b->position + (a * S_ALL + T_HIST + k) * 3;
            float dx = p[0] - o[0], dy = p[1] - o[1];
            /* bmm([dx, dy], [[c, −s], [s, c]]): a +0-started fp32 dot per output column */
            float x = 0.0f, y = 0.0f;
            x += dx * c;
            x += dy * s;
            y += dx * ns;
            y += dy * c;
            out[k * 4 + 0] = x;
            out[k * 4 + 1] = y;
            out[k * 4 + 2] = p[2] - o[2];
            out[k * 4 + 3] = graph_wrap_angle(b->heading[a * S_ALL + T_HIST + k] - th);
        }
    }
}

// ---- collation of scenes -------------------------------------------------------------------

static enum qc_status check_scene(const struct qc_scene *s, int64_t idx)
{
    const char *id = s->scenario_id;
    if (s->num_agents < 0 || s->num_polygons < 0 || s->num_points < 0 || s->num_pl2pl < 0)
        return qc_errorf(QC_ERR_INVALID, "batch: scene %lld (%s): negative count", (long long)idx,
                         id);
    for (int64_t q = 0; q < s->num_points; q++) {
        int64_t src = s->pt2pl[q], dst = s->pt2pl[s->num_points + q];
        if (src < 0 || src >= s->num_points || dst < 0 || dst >= s->num_polygons)
            return qc_errorf(QC_ERR_INVALID,
                             "batch: scene %lld (%s): pt2pl edge %lld (%lld -> %lld) out of range",
                             (long long)idx, id, (long long)q, (long long)src, (long long)dst);
    }
    for (int64_t k = 0; k < s->num_pl2pl; k++) {
        int64_t src = s->pl2pl_edge[k], dst = s->pl2pl_edge[s->num_pl2pl + k];
        if (src < 0 || src >= s->num_polygons || dst < 0 || dst >= s->num_polygons)
            return qc_errorf(QC_ERR_INVALID,
                             "batch: scene %lld (%s): pl2pl edge %lld (%lld -> %lld) out of range",
                             (long long)idx, id, (long long)k, (long long)src, (long long)dst);
    }
    return QC_OK;
}

enum qc_status qc_batch_collate(const struct qc_scene *const *scenes, int64_t B,
                                const struct qc_host_alloc *alloc, bool with_target,
                                struct qc_batch *out)
{
    struct qc_batch b;
    memset(&b, 0, sizeof(b));
    b.num_scenes = B;
    for (int64_t i = 0; i < B; i++) {
        QC_TRY(check_scene(scenes[i], i));
        b.num_agents += scenes[i]->num_agents;
        b.num_polygons += scenes[i]->num_polygons;
        b.num_points += scenes[i]->num_points;
        b.num_pl2pl += scenes[i]->num_pl2pl;
    }
    QC_TRY(batch_alloc(&b, alloc, with_target));
    int64_t A = 0, P = 0, Pt = 0, Et = 0;
    const int64_t Pt_all = b.num_points, Et_all = b.num_pl2pl;
    for (int64_t i = 0; i < B; i++) {
        const struct qc_scene *s = scenes[i];
        int64_t na = s->num_agents, np = s->num_polygons, nq = s->num_points, ne = s->num_pl2pl;
        b.agent_ptr[i] = A;
        b.pl_ptr[i] = P;
        b.pt_ptr[i] = Pt;
        b.pl2pl_ptr[i] = Et;
        b.av_index[i] = s->av_index;
        b.scene_index[i] = -1;
        snprintf(b.scenario_id[i], QC_SCENE_ID_MAX, "%s", s->scenario_id);
        snprintf(b.city[i], QC_SCENE_CITY_MAX, "%s", s->city);
        size_t nas = (size_t)(na * S_ALL);
        if (na > 0) {
            memcpy(b.valid_mask + A * S_ALL, s->valid_mask, nas);
            memcpy(b.predict_mask + A * S_ALL, s->predict_mask, nas);
            memcpy(b.agent_type + A, s->agent_type, (size_t)na);
            memcpy(b.agent_category + A, s->agent_category, (size_t)na);
            memcpy(b.position + A * S_ALL * 3, s->position, nas * 3 * sizeof(float));
            memcpy(b.heading + A * S_ALL, s->heading, nas * sizeof(float));
            memcpy(b.velocity + A * S_ALL * 3, s->velocity, nas * 3 * sizeof(float));
            if (s->agent_id)
                memcpy(b.agent_id + A, s->agent_id, (size_t)na * QC_AGENT_ID_MAX);
            else
                memset(b.agent_id + A, 0, (size_t)na * QC_AGENT_ID_MAX);
        }
        for (int64_t a = 0; a < na; a++)
            b.agent_batch[A + a] = i;
        if (np > 0) {
            memcpy(b.pl_position + P * 3, s->pl_position, (size_t)np * 3 * sizeof(float));
            memcpy(b.pl_orientation + P, s->pl_orientation, (size_t)np * sizeof(float));
            memcpy(b.pl_height + P, s->pl_height, (size_t)np * sizeof(float));
            memcpy(b.pl_type + P, s->pl_type, (size_t)np);
            memcpy(b.pl_is_intersection + P, s->pl_is_intersection, (size_t)np);
        }
        for (int64_t p = 0; p < np; p++)
            b.pl_batch[P + p] = i;
        if (nq > 0) {
            memcpy(b.pt_position + Pt * 3, s->pt_position, (size_t)nq * 3 * sizeof(float));
            memcpy(b.pt_orientation + Pt, s->pt_orientation, (size_t)nq * sizeof(float));
            memcpy(b.pt_magnitude + Pt, s->pt_magnitude, (size_t)nq * sizeof(float));
            memcpy(b.pt_height + Pt, s->pt_height, (size_t)nq * sizeof(float));
            memcpy(b.pt_type + Pt, s->pt_type, (size_t)nq);
            memcpy(b.pt_side + Pt, s->pt_side, (size_t)nq);
        }
        for (int64_t q = 0; q < nq; q++) {
            b.pt_batch[Pt + q] = i;
            b.pt2pl[Pt + q] = s->pt2pl[q] + Pt;              /* + ΣPt_prev */
            b.pt2pl[Pt_all + Pt + q] = s->pt2pl[nq + q] + P; /* + ΣP_prev */
        }
        for (int64_t k = 0; k < ne; k++) {
            b.pl2pl_edge[Et + k] = s->pl2pl_edge[k] + P;
            b.pl2pl_edge[Et_all + Et + k] = s->pl2pl_edge[ne + k] + P;
            b.pl2pl_type[Et + k] = s->pl2pl_type[k];
        }
        A += na;
        P += np;
        Pt += nq;
        Et += ne;
    }
    b.agent_ptr[B] = A;
    b.pl_ptr[B] = P;
    b.pt_ptr[B] = Pt;
    b.pl2pl_ptr[B] = Et;
    if (with_target)
        qc_batch_target(&b, 0, A, b.target);
    *out = b;
    return QC_OK;
}

// ---- graph ---------------------------------------------------------------------------------

enum qc_status qc_batch_build_graph(struct qc_batch *batch, struct qc_graph_builder *b,
                                    const struct qc_graph_params *p)
{
    struct qc_graph g;
    QC_TRY(qc_graph_build(b, p, batch, &g));
    size_t bytes = qc_graph_packed_bytes(&g);
    if (bytes == 0)
        bytes = 64;
    if (batch->graph_mem) {
        batch->alloc.free(batch->alloc.ctx, batch->graph_mem, batch->graph_bytes);
        batch->graph_mem = NULL;
        batch->has_graph = false;
    }
    void *mem = batch->alloc.alloc(batch->alloc.ctx, bytes);
    if (!mem)
        return qc_errorf(QC_ERR_NOMEM,
                         "batch: host allocator refused %zu bytes for the graph "
                         "(%lld layer edges)",
                         bytes, (long long)qc_graph_total_layer_edges(&g));
    qc_graph_pack(&g, mem, &batch->graph);
    batch->graph_mem = mem;
    batch->graph_bytes = bytes;
    batch->has_graph = true;
    return QC_OK;
}

// ---- from QCNet's collated fields ------------------------------------------------------------

struct stget {
    const struct qc_safetensors *st;
    enum qc_status rc;
};

static const void *stg(struct stget *g, const char *name, enum qc_st_dtype dt, int nd, int64_t d0,
                       int64_t d1, int64_t d2)
{
    if (g->rc != QC_OK)
        return NULL;
    const int64_t shape[3] = {d0, d1, d2};
    const struct qc_st_tensor *t = NULL;
    g->rc = qc_safetensors_get(g->st, name, dt, nd, shape, &t);
    return g->rc == QC_OK ? t->data : NULL;
}

/* Checks a ptr vector (B+1) against its batch vector (N) and copies both. */
static enum qc_status copy_ptr(const char *path, const char *what, const int64_t *ptr,
                               const int64_t *batch, int64_t B, int64_t N, int64_t *optr,
                               int64_t *obatch)
{
    if (ptr[0] != 0 || ptr[B] != N)
        return qc_errorf(QC_ERR_INVALID, "%s: %s.ptr: [%lld .. %lld], expected [0 .. %lld]", path,
                         what, (long long)ptr[0], (long long)ptr[B], (long long)N);
    for (int64_t b = 0; b < B; b++) {
        if (ptr[b + 1] < ptr[b])
            return qc_errorf(QC_ERR_INVALID, "%s: %s.ptr: decreases at %lld", path, what,
                             (long long)b);
        for (int64_t i = ptr[b]; i < ptr[b + 1]; i++)
            if (batch[i] != b)
                return qc_errorf(QC_ERR_INVALID, "%s: %s.batch[%lld] = %lld, ptr says %lld", path,
                                 what, (long long)i, (long long)batch[i], (long long)b);
    }
    memcpy(optr, ptr, (size_t)(B + 1) * sizeof(int64_t));
    if (N > 0)
        memcpy(obatch, batch, (size_t)N * sizeof(int64_t));
    return QC_OK;
}

static void copy_bool(uint8_t *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] != 0;
}

/* Reads agent ids and scenario ids from the __metadata__ "non_tensor" JSON, when present. */
static void read_non_tensor(const struct qc_safetensors *st, struct qc_batch *b)
{
    const char *nt = qc_safetensors_metadata(st, "non_tensor");
    cJSON *root = nt ? cJSON_Parse(nt) : NULL;
    if (!root)
        return;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "agent.id");
    if (cJSON_IsArray(ids) && cJSON_GetArraySize(ids) == b->num_scenes) {
        int64_t s = 0;
        for (const cJSON *l = ids->child; l; l = l->next, s++) {
            if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != b->agent_ptr[s + 1] - b->agent_ptr[s])
                continue;
            int64_t a = b->agent_ptr[s];
            for (const cJSON *x = l->child; x; x = x->next, a++)
                if (cJSON_IsString(x))
                    snprintf(b->agent_id[a], QC_AGENT_ID_MAX, "%s", x->valuestring);
        }
    }
    const char *keys[2] = {"scenario_id", "city"};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != b->num_scenes)
            continue;
        int64_t s = 0;
        for (const cJSON *x = v->child; x; x = x->next, s++) {
            if (!cJSON_IsString(x))
                continue;
            if (k == 0)
                snprintf(b->scenario_id[s], QC_SCENE_ID_MAX, "%s", x->valuestring);
            else
                snprintf(b->city[s], QC_SCENE_CITY_MAX, "%s", x->valuestring);
        }
    }
    cJSON_Delete(root);
}

enum qc_status qc_batch_from_safetensors(const struct qc_safetensors *st,
                                         const struct qc_host_alloc *alloc, struct qc_batch *out)
{
    const char *path = qc_safetensors_path(st);
    struct stget g = {st, QC_OK};
    const struct qc_st_tensor *t = qc_safetensors_find(st, "agent.ptr");
    if (!t || t->ndim != 1 || t->shape[0] < 1 || t->dtype != QC_ST_I64)
        return qc_errorf(QC_ERR_INVALID, "%s: agent.ptr: missing or not an I64 vector", path);
    const int64_t B = t->shape[0] - 1;
    const int64_t *aptr = stg(&g, "agent.ptr", QC_ST_I64, 1, B + 1, 0, 0);
    const int64_t *plptr = stg(&g, "map_polygon.ptr", QC_ST_I64, 1, B + 1, 0, 0);
    const int64_t *ptptr = stg(&g, "map_point.ptr", QC_ST_I64, 1, B + 1, 0, 0);
    const int64_t *pl2pl =
        stg(&g, "map_polygon__to__map_polygon.edge_index", QC_ST_I64, 2, 2, -1, 0);
    QC_TRY(g.rc);
    struct qc_batch b;
    memset(&b, 0, sizeof(b));
    b.num_scenes = B;
    b.num_agents = aptr[B];
    b.num_polygons = plptr[B];
    b.num_points = ptptr[B];
    b.num_pl2pl = qc_safetensors_find(st, "map_polygon__to__map_polygon.edge_index")->shape[1];
    if (b.num_agents < 0 || b.num_polygons < 0 || b.num_points < 0)
        return qc_errorf(QC_ERR_INVALID, "%s: negative node count in a ptr vector", path);
    const int64_t A = b.num_agents, P = b.num_polygons, Pt = b.num_points, Et = b.num_pl2pl;

    const int64_t *av = stg(&g, "agent.av_index", QC_ST_I64, 1, B, 0, 0);
    const uint8_t *vm = stg(&g, "agent.valid_mask", QC_ST_BOOL, 2, A, S_ALL, 0);
    const uint8_t *pm = stg(&g, "agent.predict_mask", QC_ST_BOOL, 2, A, S_ALL, 0);
    const uint8_t *aty = stg(&g, "agent.type", QC_ST_U8, 1, A, 0, 0);
    const uint8_t *acat = stg(&g, "agent.category", QC_ST_U8, 1, A, 0, 0);
    const float *apos = stg(&g, "agent.position", QC_ST_F32, 3, A, S_ALL, 3);
    const float *ahead = stg(&g, "agent.heading", QC_ST_F32, 2, A, S_ALL, 0);
    const float *avel = stg(&g, "agent.velocity", QC_ST_F32, 3, A, S_ALL, 3);
    const int64_t *abatch = stg(&g, "agent.batch", QC_ST_I64, 1, A, 0, 0);
    const float *plpos = stg(&g, "map_polygon.position", QC_ST_F32, 2, P, 3, 0);
    const float *plor = stg(&g, "map_polygon.orientation", QC_ST_F32, 1, P, 0, 0);
    const float *plh = stg(&g, "map_polygon.height", QC_ST_F32, 1, P, 0, 0);
    const uint8_t *plty = stg(&g, "map_polygon.type", QC_ST_U8, 1, P, 0, 0);
    const uint8_t *plint = stg(&g, "map_polygon.is_intersection", QC_ST_U8, 1, P, 0, 0);
    const int64_t *plbatch = stg(&g, "map_polygon.batch", QC_ST_I64, 1, P, 0, 0);
    const float *ptpos = stg(&g, "map_point.position", QC_ST_F32, 2, Pt, 3, 0);
    const float *ptor = stg(&g, "map_point.orientation", QC_ST_F32, 1, Pt, 0, 0);
    const float *ptmag = stg(&g, "map_point.magnitude", QC_ST_F32, 1, Pt, 0, 0);
    const float *pth = stg(&g, "map_point.height", QC_ST_F32, 1, Pt, 0, 0);
    const uint8_t *ptty = stg(&g, "map_point.type", QC_ST_U8, 1, Pt, 0, 0);
    const uint8_t *ptside = stg(&g, "map_point.side", QC_ST_U8, 1, Pt, 0, 0);
    const int64_t *ptbatch = stg(&g, "map_point.batch", QC_ST_I64, 1, Pt, 0, 0);
    const int64_t *pt2pl = stg(&g, "map_point__to__map_polygon.edge_index", QC_ST_I64, 2, 2, Pt, 0);
    const uint8_t *pl2plty = stg(&g, "map_polygon__to__map_polygon.type", QC_ST_U8, 1, Et, 0, 0);
    QC_TRY(g.rc);
    const float *target = NULL;
    if (qc_safetensors_find(st, "agent.target"))
        target = stg(&g, "agent.target", QC_ST_F32, 3, A, T_FUT, 4);
    QC_TRY(g.rc);

    QC_TRY(batch_alloc(&b, alloc, true));
    enum qc_status rc = copy_ptr(path, "agent", aptr, abatch, B, A, b.agent_ptr, b.agent_batch);
    if (rc == QC_OK)
        rc = copy_ptr(path, "map_polygon", plptr, plbatch, B, P, b.pl_ptr, b.pl_batch);
    if (rc == QC_OK)
        rc = copy_ptr(path, "map_point", ptptr, ptbatch, B, Pt, b.pt_ptr, b.pt_batch);
    /* topology: every edge within its scene; pl2pl scene slices from the source polygons */
    for (int64_t q = 0; rc == QC_OK && q < Pt; q++) {
        int64_t s = pt2pl[q], d = pt2pl[Pt + q];
        if (s < 0 || s >= Pt || d < 0 || d >= P || b.pl_batch[d] != b.pt_batch[s])
            rc = qc_errorf(QC_ERR_INVALID,
                           "%s: map_point__to__map_polygon.edge_index: edge %lld (%lld -> %lld) "
                           "out of range or across scenes",
                           path, (long long)q, (long long)s, (long long)d);
    }
    int64_t scene = 0;
    for (int64_t k = 0; rc == QC_OK && k < Et; k++) {
        int64_t s = pl2pl[k], d = pl2pl[Et + k];
        if (s < 0 || s >= P || d < 0 || d >= P || b.pl_batch[s] != b.pl_batch[d] ||
            b.pl_batch[s] < scene) {
            rc = qc_errorf(QC_ERR_INVALID,
                           "%s: map_polygon__to__map_polygon.edge_index: edge %lld (%lld -> %lld) "
                           "out of range, across scenes or out of scene order",
                           path, (long long)k, (long long)s, (long long)d);
            break;
        }
        while (scene < b.pl_batch[s])
            b.pl2pl_ptr[++scene] = k;
    }
    if (rc != QC_OK) {
        qc_batch_release(&b);
        return rc;
    }
    b.pl2pl_ptr[0] = 0;
    while (scene < B)
        b.pl2pl_ptr[++scene] = Et;
    for (int64_t s = 0; s < B; s++) {
        b.av_index[s] = av[s];
        b.scene_index[s] = -1;
        b.scenario_id[s][0] = '\0';
        b.city[s][0] = '\0';
    }
    size_t as = (size_t)(A * S_ALL);
    copy_bool(b.valid_mask, vm, as);
    copy_bool(b.predict_mask, pm, as);
    memcpy(b.agent_type, aty, (size_t)A);
    memcpy(b.agent_category, acat, (size_t)A);
    memcpy(b.position, apos, as * 3 * sizeof(float));
    memcpy(b.heading, ahead, as * sizeof(float));
    memcpy(b.velocity, avel, as * 3 * sizeof(float));
    memset(b.agent_id, 0, (size_t)A * QC_AGENT_ID_MAX);
    memcpy(b.pl_position, plpos, (size_t)P * 3 * sizeof(float));
    memcpy(b.pl_orientation, plor, (size_t)P * sizeof(float));
    memcpy(b.pl_height, plh, (size_t)P * sizeof(float));
    memcpy(b.pl_type, plty, (size_t)P);
    memcpy(b.pl_is_intersection, plint, (size_t)P);
    memcpy(b.pt_position, ptpos, (size_t)Pt * 3 * sizeof(float));
    memcpy(b.pt_orientation, ptor, (size_t)Pt * sizeof(float));
    memcpy(b.pt_magnitude, ptmag, (size_t)Pt * sizeof(float));
    memcpy(b.pt_height, pth, (size_t)Pt * sizeof(float));
    memcpy(b.pt_type, ptty, (size_t)Pt);
    memcpy(b.pt_side, ptside, (size_t)Pt);
    memcpy(b.pt2pl, pt2pl, 2 * (size_t)Pt * sizeof(int64_t));
    memcpy(b.pl2pl_edge, pl2pl, 2 * (size_t)Et * sizeof(int64_t));
    memcpy(b.pl2pl_type, pl2plty, (size_t)Et);
    if (target)
        memcpy(b.target, target, (size_t)A * T_FUT * 4 * sizeof(float));
    else
        qc_batch_target(&b, 0, A, b.target);
    read_non_tensor(st, &b);
    *out = b;
    return QC_OK;
}
