/*
 * cmd_inspect.c — `qctrain inspect FILE... [--json]`: what a qcshard file holds and the graphs
 * QCNet would build from it.
 *
 * Per scene: agents, predicted agents (any predict_mask), polygons, points, and the edge count
 * of every edge set at the configured radii (model.pl2pl_radius etc. of the effective config),
 * counted as the attention layers see them (decoder sets ×K modes, as QCNET.md §8.1 does).
 * Per file: scenes and min / median / max total edges per scene. Each scene is built alone
 * (graphs are block-diagonal, so a batch's counts are the sums); scenes run in parallel.
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <omp.h>

#include "qc_batch.h"
#include "qc_graph.h"
#include "qc_qcshard.h"

static const char inspect_usage[] = "FILE... [--json]";
static const char inspect_summary[] =
    "Per-scene counts (agents, polygons, points) and the edge count of every QCNet edge set.";

struct scene_stats {
    char scenario_id[QC_SCENE_ID_MAX];
    char city[QC_SCENE_CITY_MAX];
    int64_t agents, predicted, polygons, points;
    int64_t edges[QC_EDGE_SET_COUNT];
    int64_t total;
    enum qc_status st;
    char *err;
};

static void graph_params_from_config(const struct qc_config *c, struct qc_graph_params *p)
{
    qc_graph_params_default(p);
    p->pl2pl_radius = c->pl2pl_radius;
    p->pl2a_radius = c->pl2a_radius;
    p->a2a_radius = c->a2a_radius;
    p->pl2m_radius = c->pl2m_radius;
    p->a2m_radius = c->a2m_radius;
    p->time_span = c->time_span;
    p->num_t2m_steps = c->num_t2m_steps;
    p->num_modes = c->num_modes;
    p->max_num_neighbors = c->max_num_neighbors;
}

static enum qc_status stats_one(struct qc_qcshard_reader *r, int64_t i, struct qc_graph_builder *gb,
                                const struct qc_graph_params *p, struct scene_stats *out)
{
    struct qc_scene s;
    QC_TRY(qc_qcshard_reader_scene(r, i, &s));
    snprintf(out->scenario_id, sizeof(out->scenario_id), "%s", s.scenario_id);
    snprintf(out->city, sizeof(out->city), "%s", s.city);
    out->agents = s.num_agents;
    out->polygons = s.num_polygons;
    out->points = s.num_points;
    out->predicted = 0;
    for (int64_t a = 0; a < s.num_agents; a++) {
        int any = 0;
        for (int64_t t = 0; t < QC_SCENE_STEPS; t++)
            any |= s.predict_mask[a * QC_SCENE_STEPS + t];
        out->predicted += any != 0;
    }
    const struct qc_scene *sp = &s;
    struct qc_batch b;
    QC_TRY(qc_batch_collate(&sp, 1, NULL, false, &b));
    struct qc_graph g;
    enum qc_status rc = qc_graph_build(gb, p, &b, &g);
    if (rc == QC_OK) {
        out->total = 0;
        for (int k = 0; k < QC_EDGE_SET_COUNT; k++) {
            out->edges[k] = qc_graph_layer_num_edges(&g, (enum qc_edge_set)k);
            out->total += out->edges[k];
        }
    }
    qc_batch_release(&b);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Builds the stats of every scene of one file (parallel). */
static enum qc_status inspect_file(const char *path, const struct qc_graph_params *p,
                                   struct scene_stats **out, int64_t *n_out)
{
    struct qc_qcshard_reader *r = NULL;
    QC_TRY(qc_qcshard_reader_create(path, &r));
    int64_t n = qc_qcshard_reader_count(r);
    struct scene_stats *ss = calloc((size_t)(n > 0 ? n : 1), sizeof(*ss));
    if (!ss) {
        qc_qcshard_reader_destroy(r);
        return qc_errorf(QC_ERR_NOMEM, "qctrain inspect: out of memory");
    }
#pragma omp parallel
    {
        struct qc_graph_builder *gb = NULL;
        enum qc_status bst = qc_graph_builder_create(&gb);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            ss[i].st = bst == QC_OK ? stats_one(r, i, gb, p, &ss[i]) : bst;
            if (ss[i].st != QC_OK) {
                const char *m = qc_error_last();
                ss[i].err = malloc(strlen(m) + 1);
                if (ss[i].err)
                    memcpy(ss[i].err, m, strlen(m) + 1);
            }
        }
        qc_graph_builder_destroy(gb);
    }
    enum qc_status st = QC_OK;
    for (int64_t i = 0; i < n; i++) {
        if (ss[i].st == QC_OK || st != QC_OK)
            continue;
        const char *m = ss[i].err ? ss[i].err : "(no message)";
        if (strncmp(m, path, strlen(path)) == 0) /* the reader's messages name the file already */
            st = qc_errorf(ss[i].st, "%s", m);
        else
            st = qc_errorf(ss[i].st, "%s: scene %" PRId64 ": %s", path, i, m);
    }
    for (int64_t i = 0; i < n; i++)
        free(ss[i].err);
    qc_qcshard_reader_destroy(r);
    if (st != QC_OK) {
        free(ss);
        return st;
    }
    *out = ss;
    *n_out = n;
    return QC_OK;
}

static void summary(const struct scene_stats *ss, int64_t n, int64_t *mn, int64_t *med, int64_t *mx)
{
    *mn = *med = *mx = 0;
    if (n == 0)
        return;
    int64_t *t = malloc((size_t)n * sizeof(int64_t));
    if (!t)
        return;
    for (int64_t i = 0; i < n; i++)
        t[i] = ss[i].total;
    qsort(t, (size_t)n, sizeof(int64_t), cmp_i64);
    *mn = t[0];
    *mx = t[n - 1];
    *med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
    free(t);
}

static cJSON *json_file(const char *path, const struct scene_stats *ss, int64_t n)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "path", path);
    cJSON *arr = cJSON_AddArrayToObject(f, "scenes");
    for (int64_t i = 0; i < n; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "index", (double)i);
        cJSON_AddStringToObject(s, "scenario_id", ss[i].scenario_id);
        cJSON_AddStringToObject(s, "city", ss[i].city);
        cJSON_AddNumberToObject(s, "agents", (double)ss[i].agents);
        cJSON_AddNumberToObject(s, "predicted_agents", (double)ss[i].predicted);
        cJSON_AddNumberToObject(s, "polygons", (double)ss[i].polygons);
        cJSON_AddNumberToObject(s, "points", (double)ss[i].points);
        cJSON *e = cJSON_AddObjectToObject(s, "edges");
        for (int k = 0; k < QC_EDGE_SET_COUNT; k++)
            cJSON_AddNumberToObject(e, qc_edge_set_name((enum qc_edge_set)k),
                                    (double)ss[i].edges[k]);
        cJSON_AddNumberToObject(s, "total_edges", (double)ss[i].total);
        cJSON_AddItemToArray(arr, s);
    }
    int64_t mn, med, mx;
    summary(ss, n, &mn, &med, &mx);
    cJSON *sum = cJSON_AddObjectToObject(f, "summary");
    cJSON_AddNumberToObject(sum, "scenes", (double)n);
    cJSON_AddNumberToObject(sum, "edges_min", (double)mn);
    cJSON_AddNumberToObject(sum, "edges_median", (double)med);
    cJSON_AddNumberToObject(sum, "edges_max", (double)mx);
    return f;
}

static void print_text(const char *path, const struct scene_stats *ss, int64_t n)
{
    printf("%s: %" PRId64 " scene%s\n", path, n, n == 1 ? "" : "s");
    printf("%6s  %-36s %6s %5s %6s %7s", "scene", "scenario_id", "agents", "pred", "polys",
           "points");
    for (int k = 0; k < QC_EDGE_SET_COUNT; k++)
        printf(" %8s", qc_edge_set_name((enum qc_edge_set)k));
    printf(" %9s\n", "total");
    for (int64_t i = 0; i < n; i++) {
        printf("%6" PRId64 "  %-36.36s %6" PRId64 " %5" PRId64 " %6" PRId64 " %7" PRId64, i,
               ss[i].scenario_id, ss[i].agents, ss[i].predicted, ss[i].polygons, ss[i].points);
        for (int k = 0; k < QC_EDGE_SET_COUNT; k++)
            printf(" %8" PRId64, ss[i].edges[k]);
        printf(" %9" PRId64 "\n", ss[i].total);
    }
    int64_t mn, med, mx;
    summary(ss, n, &mn, &med, &mx);
    printf("summary: %" PRId64 " scenes, edges per scene min %" PRId64 " / median %" PRId64
           " / max %" PRId64 "\n",
           n, mn, med, mx);
}

enum qc_status qc_cmd_inspect(struct qc_cli *cli, int argc, char **argv)
{
    bool json = false;
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "false", "print one JSON object instead of tables"},
    };
    const char *files[QC_CLI_STRINGS_MAX];
    int nfiles = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("inspect", inspect_usage, inspect_summary, opts, 1, argc, argv, files,
                        QC_CLI_STRINGS_MAX, &nfiles, &help));
    if (help)
        return QC_OK;
    if (nfiles == 0)
        return qc_errorf(QC_ERR_INVALID, "qctrain inspect: no FILE given\nhint: qctrain inspect "
                                         "scenes.qcshard [--json]");
    struct qc_graph_params p;
    graph_params_from_config(&cli->cfg, &p);
    cJSON *root = json ? cJSON_CreateObject() : NULL;
    cJSON *jfiles = NULL;
    if (root) {
        cJSON *par = cJSON_AddObjectToObject(root, "params");
        cJSON_AddNumberToObject(par, "pl2pl_radius", p.pl2pl_radius);
        cJSON_AddNumberToObject(par, "pl2a_radius", p.pl2a_radius);
        cJSON_AddNumberToObject(par, "a2a_radius", p.a2a_radius);
        cJSON_AddNumberToObject(par, "pl2m_radius", p.pl2m_radius);
        cJSON_AddNumberToObject(par, "a2m_radius", p.a2m_radius);
        cJSON_AddNumberToObject(par, "time_span", (double)p.time_span);
        cJSON_AddNumberToObject(par, "num_t2m_steps", (double)p.num_t2m_steps);
        cJSON_AddNumberToObject(par, "num_modes", (double)p.num_modes);
        cJSON_AddNumberToObject(par, "max_num_neighbors", (double)p.max_num_neighbors);
        jfiles = cJSON_AddArrayToObject(root, "files");
    }
    enum qc_status st = QC_OK;
    for (int f = 0; f < nfiles && st == QC_OK; f++) {
        struct scene_stats *ss = NULL;
        int64_t n = 0;
        st = inspect_file(files[f], &p, &ss, &n);
        if (st != QC_OK)
            break;
        if (root)
            cJSON_AddItemToArray(jfiles, json_file(files[f], ss, n));
        else
            print_text(files[f], ss, n);
        free(ss);
    }
    if (root) {
        if (st == QC_OK) {
            char *txt = cJSON_Print(root);
            if (txt) {
                printf("%s\n", txt);
                free(txt);
            } else {
                st = qc_errorf(QC_ERR_NOMEM, "qctrain inspect: out of memory printing JSON");
            }
        }
        cJSON_Delete(root);
    }
    return st;
}
