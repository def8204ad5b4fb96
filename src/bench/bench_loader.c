/*
 * bench_loader.c — `qctrain bench loader [--json]`: loader throughput (batches/s, scenes/s) for
 * batches of dense and typical synthetic scenes on all cores, and the build time of every edge
 * set. A benchmark, never a test: it prints figures and gates nothing.
 *
 * For each profile, N scenes are generated once into a temporary qcshard file, then the loader
 * (threads = all cores unless --threads, prefetch = 2 × threads) reads, collates and builds
 * every graph of --batches batches into the pinned host arena (qc_pinned.h; plain memory on the
 * CPU backend); the clock runs from start_epoch to the last batch consumed.
 * A second figure runs the same loader on scenes generated on the fly (no file).
 * Besides wall-clock rates it reports the process CPU time per batch, which stays meaningful on
 * a machine shared with other work: all-core throughput ≈ cores / CPU time per batch.
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "qc_loader.h"
#include "qc_pinned.h"
#include "qc_qcshard.h"
#include "qc_synth.h"

static const char bench_usage[] =
    "[--json] [--batches N] [--batch-size B] [--threads T] [--profiles dense,typical]";
static const char bench_summary[] =
    "Loader throughput (batches/s, scenes/s) and per-edge-set graph build time.";

struct lb_result {
    int64_t batches, scenes;
    double seconds;     /* wall */
    double cpu_seconds; /* process CPU time (all threads) over the same interval */
    double build_s[QC_EDGE_SET_COUNT];
    int64_t edges;
};

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static enum qc_status run_loader(const char *path, const struct qc_loader_opts *o, int64_t nbatch,
                                 struct lb_result *r)
{
    struct qc_loader *l = NULL;
    const char *paths[1] = {path};
    /* batches in the pinned host arena (plain memory on the CPU backend), as in training */
    struct qc_pinned *pin = NULL;
    QC_TRY(qc_pinned_create(NULL, 0, &pin));
    struct qc_loader_opts lo = *o;
    qc_host_alloc_pinned(pin, &lo.alloc);
    enum qc_status cst = qc_loader_create(path ? paths : NULL, path ? 1 : 0, &lo, &l);
    if (cst != QC_OK) {
        qc_pinned_destroy(pin);
        return cst;
    }
    memset(r, 0, sizeof(*r));
    /* warm-up batch (page faults, thread start), not timed */
    enum qc_status st = qc_loader_start_epoch(l, 0);
    struct qc_batch *b = NULL;
    if (st == QC_OK)
        st = qc_loader_next(l, &b);
    qc_loader_release(l, b);
    double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    if (st == QC_OK)
        st = qc_loader_start_epoch(l, 1);
    while (st == QC_OK && r->batches < nbatch) {
        b = NULL;
        st = qc_loader_next(l, &b);
        if (st != QC_OK || !b)
            break;
        r->batches++;
        r->scenes += b->num_scenes;
        r->edges += qc_graph_total_layer_edges(&b->graph);
        for (int k = 0; k < QC_EDGE_SET_COUNT; k++)
            r->build_s[k] += b->graph.build_seconds[k];
        qc_loader_release(l, b);
    }
    r->seconds = clock_s(CLOCK_MONOTONIC) - t0;
    r->cpu_seconds = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    qc_loader_destroy(l);
    qc_pinned_destroy(pin);
    return st;
}

static cJSON *result_json(const struct lb_result *r)
{
    cJSON *j = cJSON_CreateObject();
    double bps = r->seconds > 0 ? (double)r->batches / r->seconds : 0;
    cJSON_AddNumberToObject(j, "batches", (double)r->batches);
    cJSON_AddNumberToObject(j, "seconds", r->seconds);
    cJSON_AddNumberToObject(j, "batches_per_s", bps);
    cJSON_AddNumberToObject(j, "scenes_per_s", r->seconds > 0 ? (double)r->scenes / r->seconds : 0);
    cJSON_AddNumberToObject(j, "cpu_ms_per_batch",
                            r->batches ? 1e3 * r->cpu_seconds / (double)r->batches : 0);
    cJSON_AddNumberToObject(j, "batches_per_cpu_s",
                            r->cpu_seconds > 0 ? (double)r->batches / r->cpu_seconds : 0);
    cJSON_AddNumberToObject(j, "edges_per_batch",
                            r->batches ? (double)r->edges / (double)r->batches : 0);
    cJSON *ms = cJSON_AddObjectToObject(j, "build_ms_per_batch");
    double tot = 0;
    for (int k = 0; k < QC_EDGE_SET_COUNT; k++) {
        double v = r->batches ? 1e3 * r->build_s[k] / (double)r->batches : 0;
        tot += v;
        cJSON_AddNumberToObject(ms, qc_edge_set_name((enum qc_edge_set)k), v);
    }
    cJSON_AddNumberToObject(ms, "all", tot);
    return j;
}

static void result_text(const char *what, const struct lb_result *r)
{
    printf("%-24s %6" PRId64 " batches in %7.3f s: %8.2f batches/s, %8.2f scenes/s, %10.0f "
           "edges/batch\n",
           what, r->batches, r->seconds, r->seconds > 0 ? (double)r->batches / r->seconds : 0,
           r->seconds > 0 ? (double)r->scenes / r->seconds : 0,
           r->batches ? (double)r->edges / (double)r->batches : 0);
    printf("%-24s CPU %.1f ms/batch (%.1f batches per CPU-second); graph build CPU ms/batch:", "",
           r->batches ? 1e3 * r->cpu_seconds / (double)r->batches : 0,
           r->cpu_seconds > 0 ? (double)r->batches / r->cpu_seconds : 0);
    for (int k = 0; k < QC_EDGE_SET_COUNT; k++)
        printf(" %s %.2f", qc_edge_set_name((enum qc_edge_set)k),
               r->batches ? 1e3 * r->build_s[k] / (double)r->batches : 0);
    printf("\n");
}

enum qc_status qc_bench_loader(struct qc_cli *cli, int argc, char **argv)
{
    bool json = false;
    int64_t nbatch = 40, bsize = 4, threads = 0;
    const char *profiles = "dense,typical";
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "false", "print one JSON object"},
        {"batches", QC_CLI_INT, &nbatch, "40", "timed batches per profile"},
        {"batch-size", QC_CLI_INT, &bsize, "4", "scenes per batch"},
        {"threads", QC_CLI_INT, &threads, "0", "loader threads (0 = all cores)"},
        {"profiles", QC_CLI_STRING, &profiles, "dense,typical", "synthetic scene profiles"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench loader", bench_usage, bench_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    if (nbatch < 1 || nbatch > 1000000)
        return qc_errorf(QC_ERR_INVALID, "bench loader: --batches %" PRId64 ": expected 1..1000000",
                         nbatch);
    if (bsize < 1 || bsize > 4096)
        return qc_errorf(QC_ERR_INVALID, "bench loader: --batch-size %" PRId64 ": expected 1..4096",
                         bsize);
    if (threads < 0 || threads > 1024)
        return qc_errorf(QC_ERR_INVALID,
                         "bench loader: --threads %" PRId64 ": expected 0 (all cores) to 1024",
                         threads);
    {
        /* Check every profile name before the first (slow) run. */
        char check[256];
        snprintf(check, sizeof(check), "%s", profiles);
        for (char *save = NULL, *name = strtok_r(check, ",", &save); name;
             name = strtok_r(NULL, ",", &save)) {
            enum qc_synth_profile prof;
            enum qc_status pst = qc_synth_profile_parse(name, &prof);
            if (pst != QC_OK)
                return qc_error_wrap(pst, "bench loader: --profiles");
        }
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t nth = threads > 0 ? threads : (ncpu > 0 ? ncpu : 1);

    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "threads", (double)nth);
    cJSON_AddNumberToObject(root, "batch_size", (double)bsize);
    enum qc_status st = QC_OK;
    bool first = true;
    char list[256];
    snprintf(list, sizeof(list), "%s", profiles);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name && st == QC_OK;
         name = strtok_r(NULL, ",", &save)) {
        enum qc_synth_profile prof;
        st = qc_synth_profile_parse(name, &prof);
        if (st != QC_OK) {
            st = qc_error_wrap(st, "bench loader: --profiles");
            break;
        }
        /* enough distinct scenes for the warm-up and the timed batches */
        int64_t nsc = (nbatch + 1) * bsize;
        char path[512];
        const char *tmpdir = getenv("TMPDIR");
        snprintf(path, sizeof(path), "%s/qctrain-bench-loader-%d-%s.qcshard",
                 tmpdir && tmpdir[0] ? tmpdir : "/tmp", (int)getpid(), name);
        struct qc_qcshard_writer *w = NULL;
        st = qc_qcshard_writer_create(path, &w);
        for (int64_t i = 0; i < nsc && st == QC_OK; i++) {
            struct qc_scene s;
            st = qc_synth_scene((uint64_t)cli->cfg.seed, i, prof, &s);
            if (st == QC_OK) {
                st = qc_qcshard_writer_append(w, &s);
                qc_scene_free(&s);
            }
        }
        if (st == QC_OK)
            st = qc_qcshard_writer_finish(w);
        qc_qcshard_writer_destroy(w);
        if (st != QC_OK)
            break;

        struct qc_loader_opts o;
        qc_loader_opts_default(&o);
        o.batch_size = bsize;
        o.threads = nth;
        o.prefetch_batches = 2 * nth;
        o.shuffle = false;
        o.seed = (uint64_t)cli->cfg.seed;
        o.graph.pl2pl_radius = cli->cfg.pl2pl_radius;
        o.graph.pl2a_radius = cli->cfg.pl2a_radius;
        o.graph.a2a_radius = cli->cfg.a2a_radius;
        o.graph.pl2m_radius = cli->cfg.pl2m_radius;
        o.graph.a2m_radius = cli->cfg.a2m_radius;
        o.graph.time_span = cli->cfg.time_span;
        o.graph.num_t2m_steps = cli->cfg.num_t2m_steps;
        o.graph.num_modes = cli->cfg.num_modes;
        o.graph.max_num_neighbors = cli->cfg.max_num_neighbors;
        struct lb_result rf, rs;
        st = run_loader(path, &o, nbatch, &rf);
        unlink(path);
        if (st != QC_OK)
            break;
        o.synthetic_scenes = nsc;
        o.synthetic_profile = prof;
        o.synthetic_seed = (uint64_t)cli->cfg.seed;
        st = run_loader(NULL, &o, nbatch, &rs);
        if (st != QC_OK)
            break;
        cJSON *pj = result_json(&rf);
        cJSON_AddNumberToObject(pj, "on_the_fly_batches_per_s",
                                rs.seconds > 0 ? (double)rs.batches / rs.seconds : 0);
        cJSON_AddItemToObject(root, name, pj);
        if (first) {
            /* the headline figures: the first profile (dense by default) from a file */
            cJSON_AddStringToObject(root, "profile", name);
            cJSON_AddNumberToObject(root, "batches_per_s",
                                    rf.seconds > 0 ? (double)rf.batches / rf.seconds : 0);
            cJSON_AddNumberToObject(root, "scenes_per_s",
                                    rf.seconds > 0 ? (double)rf.scenes / rf.seconds : 0);
            first = false;
        }
        if (!json) {
            char what[64];
            snprintf(what, sizeof(what), "%s (qcshard)", name);
            result_text(what, &rf);
            snprintf(what, sizeof(what), "%s (on the fly)", name);
            result_text(what, &rs);
        }
    }
    if (st == QC_OK && first)
        st = qc_errorf(QC_ERR_INVALID,
                       "bench loader: --profiles '%s': no profile given\nhint: --profiles "
                       "dense,typical",
                       profiles);
    if (st == QC_OK && json) {
        char *txt = cJSON_Print(root);
        if (txt) {
            printf("%s\n", txt);
            free(txt);
        } else {
            st = qc_errorf(QC_ERR_NOMEM, "bench loader: out of memory printing JSON");
        }
    }
    cJSON_Delete(root);
    return st;
}
