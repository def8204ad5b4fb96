/*
 * scene.c — struct qc_scene ownership (one block per owned scene), the array layout shared with
 * the qcshard record format, and the value rules every scene must satisfy (docs/QCSHARD.md).
 *
 * Invariant: an owned scene's block is laid out by qc_scene_layout_compute(.., base 0, ..), so
 * it is byte-for-byte the body of the qcshard record that holds the same scene.
 */
#include "qc_scene.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- layout ---------------------------------------------------------------------------------

enum scene_dim { DIM_A = 0, DIM_P, DIM_PT, DIM_ET };

struct scene_array_info {
    const char *name;
    enum scene_dim dim;     /* which count the array scales with */
    uint64_t bytes_per_row; /* bytes per unit of that count */
};

static const struct scene_array_info scene_arrays[QC_SCENE_ARRAY_COUNT] = {
    [QC_SCENE_VALID_MASK] = {"valid_mask", DIM_A, QC_SCENE_STEPS},
    [QC_SCENE_PREDICT_MASK] = {"predict_mask", DIM_A, QC_SCENE_STEPS},
    [QC_SCENE_AGENT_TYPE] = {"agent_type", DIM_A, 1},
    [QC_SCENE_AGENT_CATEGORY] = {"agent_category", DIM_A, 1},
    [QC_SCENE_POSITION] = {"position", DIM_A, QC_SCENE_STEPS * 3 * 4},
    [QC_SCENE_HEADING] = {"heading", DIM_A, QC_SCENE_STEPS * 4},
    [QC_SCENE_VELOCITY] = {"velocity", DIM_A, QC_SCENE_STEPS * 3 * 4},
    [QC_SCENE_AGENT_ID] = {"agent_id", DIM_A, QC_AGENT_ID_MAX},
    [QC_SCENE_PL_POSITION] = {"pl_position", DIM_P, 12},
    [QC_SCENE_PL_ORIENTATION] = {"pl_orientation", DIM_P, 4},
    [QC_SCENE_PL_HEIGHT] = {"pl_height", DIM_P, 4},
    [QC_SCENE_PL_TYPE] = {"pl_type", DIM_P, 1},
    [QC_SCENE_PL_IS_INTERSECTION] = {"pl_is_intersection", DIM_P, 1},
    [QC_SCENE_PT_POSITION] = {"pt_position", DIM_PT, 12},
    [QC_SCENE_PT_ORIENTATION] = {"pt_orientation", DIM_PT, 4},
    [QC_SCENE_PT_MAGNITUDE] = {"pt_magnitude", DIM_PT, 4},
    [QC_SCENE_PT_HEIGHT] = {"pt_height", DIM_PT, 4},
    [QC_SCENE_PT_TYPE] = {"pt_type", DIM_PT, 1},
    [QC_SCENE_PT_SIDE] = {"pt_side", DIM_PT, 1},
    [QC_SCENE_PT2PL] = {"pt2pl", DIM_PT, 16},
    [QC_SCENE_PL2PL_EDGE] = {"pl2pl_edge", DIM_ET, 16},
    [QC_SCENE_PL2PL_TYPE] = {"pl2pl_type", DIM_ET, 1},
};

static uint64_t pad8(uint64_t n)
{
    return (n + 7u) & ~(uint64_t)7u;
}

const char *qc_scene_array_name(enum qc_scene_array k)
{
    if ((int)k < 0 || k >= QC_SCENE_ARRAY_COUNT)
        return "?";
    return scene_arrays[k].name;
}

enum qc_status qc_scene_layout_compute(int64_t num_agents, int64_t num_polygons, int64_t num_points,
                                       int64_t num_pl2pl, uint64_t base,
                                       struct qc_scene_layout *out)
{
    const struct {
        const char *name;
        int64_t v, lo, hi;
    } counts[4] = {
        {"num_agents", num_agents, 1, QC_SCENE_MAX_AGENTS},
        {"num_polygons", num_polygons, 0, QC_SCENE_MAX_POLYGONS},
        {"num_points", num_points, 0, QC_SCENE_MAX_POINTS},
        {"num_pl2pl", num_pl2pl, 0, QC_SCENE_MAX_PL2PL},
    };
    for (int i = 0; i < 4; i++)
        if (counts[i].v < counts[i].lo || counts[i].v > counts[i].hi)
            return qc_errorf(QC_ERR_INVALID,
                             "field %s: value %" PRId64 " out of range [%" PRId64 ", %" PRId64 "]",
                             counts[i].name, counts[i].v, counts[i].lo, counts[i].hi);
    QC_ASSERT(base % 8 == 0, "layout base %" PRIu64 " not 8-aligned", base);
    /* Counts are bounded above, so no product or sum below can overflow 64 bits. */
    uint64_t off = base;
    for (int k = 0; k < QC_SCENE_ARRAY_COUNT; k++) {
        uint64_t n = (uint64_t)counts[scene_arrays[k].dim].v;
        out->offset[k] = off;
        out->bytes[k] = n * scene_arrays[k].bytes_per_row;
        off = pad8(off + out->bytes[k]);
    }
    out->size = off;
    return QC_OK;
}

// ---- ownership ------------------------------------------------------------------------------

enum qc_status qc_scene_alloc(struct qc_scene *scene, struct qc_scene_mut *mut, int64_t num_agents,
                              int64_t num_polygons, int64_t num_points, int64_t num_pl2pl)
{
    struct qc_scene_layout lay;
    QC_TRY(qc_scene_layout_compute(num_agents, num_polygons, num_points, num_pl2pl, 0, &lay));
    char *block = calloc(1, lay.size);
    if (!block)
        return qc_errorf(QC_ERR_NOMEM, "scene: cannot allocate %" PRIu64 " bytes", lay.size);
    struct qc_scene_mut m;
#define AT(k) (void *)(block + lay.offset[k])
    m.valid_mask = AT(QC_SCENE_VALID_MASK);
    m.predict_mask = AT(QC_SCENE_PREDICT_MASK);
    m.agent_type = AT(QC_SCENE_AGENT_TYPE);
    m.agent_category = AT(QC_SCENE_AGENT_CATEGORY);
    m.position = AT(QC_SCENE_POSITION);
    m.heading = AT(QC_SCENE_HEADING);
    m.velocity = AT(QC_SCENE_VELOCITY);
    m.agent_id = AT(QC_SCENE_AGENT_ID);
    m.pl_position = AT(QC_SCENE_PL_POSITION);
    m.pl_orientation = AT(QC_SCENE_PL_ORIENTATION);
    m.pl_height = AT(QC_SCENE_PL_HEIGHT);
    m.pl_type = AT(QC_SCENE_PL_TYPE);
    m.pl_is_intersection = AT(QC_SCENE_PL_IS_INTERSECTION);
    m.pt_position = AT(QC_SCENE_PT_POSITION);
    m.pt_orientation = AT(QC_SCENE_PT_ORIENTATION);
    m.pt_magnitude = AT(QC_SCENE_PT_MAGNITUDE);
    m.pt_height = AT(QC_SCENE_PT_HEIGHT);
    m.pt_type = AT(QC_SCENE_PT_TYPE);
    m.pt_side = AT(QC_SCENE_PT_SIDE);
    m.pt2pl = AT(QC_SCENE_PT2PL);
    m.pl2pl_edge = AT(QC_SCENE_PL2PL_EDGE);
    m.pl2pl_type = AT(QC_SCENE_PL2PL_TYPE);
#undef AT
    memset(scene, 0, sizeof(*scene));
    scene->num_agents = num_agents;
    scene->num_polygons = num_polygons;
    scene->num_points = num_points;
    scene->num_pl2pl = num_pl2pl;
    scene->valid_mask = m.valid_mask;
    scene->predict_mask = m.predict_mask;
    scene->agent_type = m.agent_type;
    scene->agent_category = m.agent_category;
    scene->position = m.position;
    scene->heading = m.heading;
    scene->velocity = m.velocity;
    scene->agent_id = (const char(*)[QC_AGENT_ID_MAX])m.agent_id;
    scene->pl_position = m.pl_position;
    scene->pl_orientation = m.pl_orientation;
    scene->pl_height = m.pl_height;
    scene->pl_type = m.pl_type;
    scene->pl_is_intersection = m.pl_is_intersection;
    scene->pt_position = m.pt_position;
    scene->pt_orientation = m.pt_orientation;
    scene->pt_magnitude = m.pt_magnitude;
    scene->pt_height = m.pt_height;
    scene->pt_type = m.pt_type;
    scene->pt_side = m.pt_side;
    scene->pt2pl = m.pt2pl;
    scene->pl2pl_edge = m.pl2pl_edge;
    scene->pl2pl_type = m.pl2pl_type;
    scene->owned = block;
    if (mut)
        *mut = m;
    return QC_OK;
}

void qc_scene_free(struct qc_scene *scene)
{
    if (!scene)
        return;
    free(scene->owned);
    memset(scene, 0, sizeof(*scene));
}

/* Base pointers of a scene's arrays, in enum order. */
static void scene_array_ptrs(const struct qc_scene *s, const void *p[QC_SCENE_ARRAY_COUNT])
{
    p[QC_SCENE_VALID_MASK] = s->valid_mask;
    p[QC_SCENE_PREDICT_MASK] = s->predict_mask;
    p[QC_SCENE_AGENT_TYPE] = s->agent_type;
    p[QC_SCENE_AGENT_CATEGORY] = s->agent_category;
    p[QC_SCENE_POSITION] = s->position;
    p[QC_SCENE_HEADING] = s->heading;
    p[QC_SCENE_VELOCITY] = s->velocity;
    p[QC_SCENE_AGENT_ID] = s->agent_id;
    p[QC_SCENE_PL_POSITION] = s->pl_position;
    p[QC_SCENE_PL_ORIENTATION] = s->pl_orientation;
    p[QC_SCENE_PL_HEIGHT] = s->pl_height;
    p[QC_SCENE_PL_TYPE] = s->pl_type;
    p[QC_SCENE_PL_IS_INTERSECTION] = s->pl_is_intersection;
    p[QC_SCENE_PT_POSITION] = s->pt_position;
    p[QC_SCENE_PT_ORIENTATION] = s->pt_orientation;
    p[QC_SCENE_PT_MAGNITUDE] = s->pt_magnitude;
    p[QC_SCENE_PT_HEIGHT] = s->pt_height;
    p[QC_SCENE_PT_TYPE] = s->pt_type;
    p[QC_SCENE_PT_SIDE] = s->pt_side;
    p[QC_SCENE_PT2PL] = s->pt2pl;
    p[QC_SCENE_PL2PL_EDGE] = s->pl2pl_edge;
    p[QC_SCENE_PL2PL_TYPE] = s->pl2pl_type;
}

enum qc_status qc_scene_copy(const struct qc_scene *src, struct qc_scene *dst)
{
    struct qc_scene out;
    QC_TRY(qc_scene_alloc(&out, NULL, src->num_agents, src->num_polygons, src->num_points,
                          src->num_pl2pl));
    struct qc_scene_layout lay;
    QC_TRY(qc_scene_layout_compute(src->num_agents, src->num_polygons, src->num_points,
                                   src->num_pl2pl, 0, &lay));
    const void *p[QC_SCENE_ARRAY_COUNT];
    scene_array_ptrs(src, p);
    for (int k = 0; k < QC_SCENE_ARRAY_COUNT; k++)
        if (lay.bytes[k])
            memcpy((char *)out.owned + lay.offset[k], p[k], lay.bytes[k]);
    memcpy(out.scenario_id, src->scenario_id, sizeof(out.scenario_id));
    memcpy(out.city, src->city, sizeof(out.city));
    out.av_index = src->av_index;
    *dst = out;
    return QC_OK;
}

// ---- validation -----------------------------------------------------------------------------

/* Records "<file>: record <r>: field <field>: <what>" as QC_ERR_INVALID. */
static enum qc_status scene_fail(const char *file, int64_t record, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum qc_status scene_fail(const char *file, int64_t record, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (file)
        return qc_errorf(QC_ERR_INVALID, "%s: record %" PRId64 ": field %s", file, record, msg);
    return qc_errorf(QC_ERR_INVALID, "field %s", msg);
}

static int str_terminated(const char *s, size_t n)
{
    return memchr(s, 0, n) != NULL;
}

/* IEEE-754 binary32 non-finite test on the bits (exponent all ones), immune to fast-math. */
static int f32_bad(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return (u & 0x7f800000u) == 0x7f800000u;
}

/* Index of the first non-finite float in x[0, n), or -1. */
static int64_t f32_first_bad(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (f32_bad(x[i]))
            return i;
    return -1;
}

static const char *f32_str(float v, char buf[32])
{
    snprintf(buf, 32, "%g", (double)v);
    return buf;
}

static enum qc_status check_enum(const uint8_t *x, int64_t n, unsigned lo, unsigned hi,
                                 const char *name, const char *file, int64_t record)
{
    for (int64_t i = 0; i < n; i++)
        if (x[i] < lo || x[i] > hi)
            return scene_fail(file, record, "%s[%" PRId64 "]: value %u out of range [%u, %u]", name,
                              i, x[i], lo, hi);
    return QC_OK;
}

static enum qc_status check_agent_floats(const struct qc_scene *s, const float *x, int per_step,
                                         const char *name, const char *file, int64_t record)
{
    const int64_t n = s->num_agents * QC_SCENE_STEPS * per_step;
    const int64_t i = f32_first_bad(x, n);
    if (i < 0)
        return QC_OK;
    char buf[32];
    const int64_t a = i / (QC_SCENE_STEPS * per_step), t = (i / per_step) % QC_SCENE_STEPS;
    const int valid =
        s->valid_mask[a * QC_SCENE_STEPS + t] || s->predict_mask[a * QC_SCENE_STEPS + t];
    if (per_step > 1)
        return scene_fail(file, record,
                          "%s[%" PRId64 "][%" PRId64 "][%" PRId64 "]: value %s at a step the masks "
                          "mark %s",
                          name, a, t, i % per_step, f32_str(x[i], buf),
                          valid ? "valid"
                                : "unobserved (must still be finite: QCNet masks by "
                                  "multiplication)");
    return scene_fail(file, record,
                      "%s[%" PRId64 "][%" PRId64 "]: value %s at a step the masks "
                      "mark %s",
                      name, a, t, f32_str(x[i], buf),
                      valid ? "valid"
                            : "unobserved (must still be finite: QCNet masks by multiplication)");
}

static enum qc_status check_floats(const float *x, int64_t rows, int per_row, const char *name,
                                   const char *file, int64_t record)
{
    const int64_t i = f32_first_bad(x, rows * per_row);
    if (i < 0)
        return QC_OK;
    char buf[32];
    if (per_row > 1)
        return scene_fail(file, record, "%s[%" PRId64 "][%" PRId64 "]: value %s is not finite",
                          name, i / per_row, i % per_row, f32_str(x[i], buf));
    return scene_fail(file, record, "%s[%" PRId64 "]: value %s is not finite", name, i,
                      f32_str(x[i], buf));
}

enum qc_status qc_scene_validate(const struct qc_scene *s, const char *file, int64_t record)
{
    struct qc_scene_layout lay;
    enum qc_status st = qc_scene_layout_compute(s->num_agents, s->num_polygons, s->num_points,
                                                s->num_pl2pl, 0, &lay);
    if (st != QC_OK)
        return file ? qc_error_wrap(st, "%s: record %" PRId64, file, record) : st;
    const int64_t A = s->num_agents, P = s->num_polygons, Pt = s->num_points, Et = s->num_pl2pl;
    const int64_t S = QC_SCENE_STEPS;

    // strings and the AV
    if (!str_terminated(s->scenario_id, sizeof(s->scenario_id)))
        return scene_fail(file, record, "scenario_id: not NUL-terminated within %d bytes",
                          QC_SCENE_ID_MAX);
    if (!str_terminated(s->city, sizeof(s->city)))
        return scene_fail(file, record, "city: not NUL-terminated within %d bytes",
                          QC_SCENE_CITY_MAX);
    for (int64_t a = 0; a < A; a++)
        if (!str_terminated(s->agent_id[a], QC_AGENT_ID_MAX))
            return scene_fail(file, record,
                              "agent_id[%" PRId64 "]: not NUL-terminated within %d "
                              "bytes",
                              a, QC_AGENT_ID_MAX);
    if (s->av_index < 0 || s->av_index >= A)
        return scene_fail(file, record, "av_index: value %" PRId64 " out of range [0, %" PRId64 ")",
                          s->av_index, A);
    if (strcmp(s->agent_id[s->av_index], "AV") != 0)
        return scene_fail(file, record,
                          "agent_id[%" PRId64 "]: value \"%s\" at av_index, "
                          "expected \"AV\"",
                          s->av_index, s->agent_id[s->av_index]);

    // masks (QCNET.md §7.2)
    for (int64_t i = 0; i < A * S; i++) {
        if (s->valid_mask[i] > 1)
            return scene_fail(file, record,
                              "valid_mask[%" PRId64 "][%" PRId64 "]: value %u is not "
                              "a boolean",
                              i / S, i % S, s->valid_mask[i]);
        if (s->predict_mask[i] > 1)
            return scene_fail(file, record,
                              "predict_mask[%" PRId64 "][%" PRId64 "]: value %u is "
                              "not a boolean",
                              i / S, i % S, s->predict_mask[i]);
    }
    for (int64_t a = 0; a < A; a++) {
        if (s->valid_mask[a * S])
            return scene_fail(file, record,
                              "valid_mask[%" PRId64 "][0]: value 1, but step 0 is "
                              "never valid under vector_repr",
                              a);
        for (int64_t t = 0; t < QC_SCENE_HIST_STEPS; t++)
            if (s->predict_mask[a * S + t])
                return scene_fail(file, record,
                                  "predict_mask[%" PRId64 "][%" PRId64 "]: value 1 "
                                  "at a history step (must be 0 for t < 50)",
                                  a, t);
    }

    // enumerations
    QC_TRY(check_enum(s->agent_type, A, 0, QC_AGENT_TYPES - 1, "agent_type", file, record));
    QC_TRY(check_enum(s->agent_category, A, 0, QC_AGENT_CATEGORIES - 1, "agent_category", file,
                      record));
    QC_TRY(check_enum(s->pl_type, P, 0, QC_POLYGON_TYPES - 1, "pl_type", file, record));
    QC_TRY(check_enum(s->pl_is_intersection, P, 0, QC_POLYGON_INT - 1, "pl_is_intersection", file,
                      record));
    QC_TRY(check_enum(s->pt_type, Pt, 0, QC_POINT_TYPES - 1, "pt_type", file, record));
    QC_TRY(check_enum(s->pt_side, Pt, 0, QC_POINT_SIDES - 1, "pt_side", file, record));
    QC_TRY(check_enum(s->pl2pl_type, Et, 1, QC_PL2PL_TYPES - 1, "pl2pl_type", file, record));

    // floats
    QC_TRY(check_agent_floats(s, s->position, 3, "position", file, record));
    QC_TRY(check_agent_floats(s, s->heading, 1, "heading", file, record));
    QC_TRY(check_agent_floats(s, s->velocity, 3, "velocity", file, record));
    QC_TRY(check_floats(s->pl_position, P, 3, "pl_position", file, record));
    QC_TRY(check_floats(s->pl_orientation, P, 1, "pl_orientation", file, record));
    QC_TRY(check_floats(s->pl_height, P, 1, "pl_height", file, record));
    QC_TRY(check_floats(s->pt_position, Pt, 3, "pt_position", file, record));
    QC_TRY(check_floats(s->pt_orientation, Pt, 1, "pt_orientation", file, record));
    QC_TRY(check_floats(s->pt_magnitude, Pt, 1, "pt_magnitude", file, record));
    QC_TRY(check_floats(s->pt_height, Pt, 1, "pt_height", file, record));
    for (int64_t i = 0; i < Pt; i++)
        if (s->pt_magnitude[i] < 0.0f) {
            char buf[32];
            return scene_fail(file, record, "pt_magnitude[%" PRId64 "]: value %s is negative", i,
                              f32_str(s->pt_magnitude[i], buf));
        }

    // topology
    for (int64_t i = 0; i < Pt; i++) {
        if (s->pt2pl[i] != i)
            return scene_fail(file, record,
                              "pt2pl[0][%" PRId64 "]: value %" PRId64 ", expected %" PRId64
                              " (row 0 is arange(Pt))",
                              i, s->pt2pl[i], i);
        const int64_t pl = s->pt2pl[Pt + i];
        if (pl < 0 || pl >= P)
            return scene_fail(file, record,
                              "pt2pl[1][%" PRId64 "]: index %" PRId64 " out of range "
                              "[0, %" PRId64 ")",
                              i, pl, P);
        if (i > 0 && pl < s->pt2pl[Pt + i - 1])
            return scene_fail(file, record,
                              "pt2pl[1][%" PRId64 "]: index %" PRId64 " after %" PRId64
                              ": destinations must be sorted",
                              i, pl, s->pt2pl[Pt + i - 1]);
    }
    for (int64_t r = 0; r < 2; r++)
        for (int64_t e = 0; e < Et; e++) {
            const int64_t v = s->pl2pl_edge[r * Et + e];
            if (v < 0 || v >= P)
                return scene_fail(file, record,
                                  "pl2pl_edge[%" PRId64 "][%" PRId64 "]: index %" PRId64
                                  " out of range [0, %" PRId64 ")",
                                  r, e, v, P);
        }
    return QC_OK;
}
