/*
 * bench_dist.c — `mpirun -np N qctrain bench dist [--preset P] [--json] [--steps N]
 * [--warmup N] [--batch B]`: data-parallel training steps, the code path of `qctrain train`
 * (qc_trainer on the backend of --device, N ranks of the launcher), on `mixed` synthetic scenes
 * (typical and dense AV2 sizes interleaved, so ranks get unequal work unless the groups are
 * balanced), once with data.balance none and once with cost. A benchmark, never a test: it
 * prints figures and gates nothing; without a launcher it runs (and says) one rank.
 *
 * Per configuration, over the timed steps (after --warmup untimed ones):
 *   bytes_reduced_per_step     the gradient buffer summed across ranks (numel x 4)
 *   bytes_sent_per_step        what rank 0 sent (gradient pieces, parameter shards)
 *   grads_coll_s               the gradient reduction's duration per step: from its first
 *                              piece's start to its last piece's end
 *   grads_exposed_s            what rank 0 waited for it after its own backward
 *   hidden_share               1 − exposed / collective: the part that overlapped backward
 *   params_allgather_s         the ZeRO parameter all-gather per step (stages 1, 2)
 *   step_s                     rank 0's step time (median)
 *   rank_time_ratio_median     slowest / mean rank compute time (forward + backward), per step
 *   rank_time_ratio_mean
 *   rank_edge_ratio_mean       most / mean graph edges of the ranks' groups per step: the
 *                              balance of the work itself, free of the machine's timing noise
 * and, free of any timing, the plan itself ("plan"): over an epoch of --plan-scenes mixed scenes
 * split as this run splits them (ranks x --batch), the mean over steps of the most loaded rank's
 * estimated cost (qc_loader_cost_estimate, what the balancer uses) over the mean, for none and
 * cost.
 * Rank 0 prints (one JSON object with --json; the other ranks print nothing); each rank trains
 * in a scratch folder of its own, removed afterwards.
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_common.h"
#include "qc_config.h"
#include "qc_dist.h"
#include "qc_loader.h"
#include "qc_qcnet.h"
#include "qc_scene.h"
#include "qc_synth.h"
#include "qc_train.h"

static const char dist_usage[] = "[--json] [--steps N] [--warmup N] [--batch B]";
static const char dist_summary[] =
    "Data-parallel training steps under mpirun / srun on mixed synthetic scenes, without and with "
    "cost-balanced groups: gradient bytes reduced per step, the collectives' time and the share "
    "hidden behind backward, and the slowest-to-mean rank compute time. Use a small preset on a "
    "CPU (--preset cpu-smoke).";

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct dist_result {
    int world;
    int64_t params;
    double step_s, ratio_median, ratio_mean, edge_ratio_mean;
    struct qc_dist_stats s; /* over the timed steps */
    int64_t steps;
};

static enum qc_status bench_one(const struct qc_config *base, enum qc_balance balance,
                                int64_t batch, int64_t warmup, int64_t steps, struct dist_result *r)
{
    struct qc_config cfg = *base;
    cfg.balance = balance;
    cfg.batch_size = batch;
    cfg.grad_accum = 1;
    cfg.synthetic_profile = QC_SCENE_MIXED;
    cfg.steps = warmup + steps;
    cfg.save_every = 0;
    const int64_t ranks = qc_dist_world_size() > 1 ? qc_dist_world_size() : 1;
    cfg.synthetic_scenes = ranks * batch * (warmup + steps);
    memset(r, 0, sizeof(*r));
    struct qc_bench_run run;
    enum qc_status st = qc_bench_run_start(&cfg, "dist", NULL, 0, warmup, &run);
    struct qc_trainer *t = run.t;
    double edge_sum = 0;
    double *ratio = calloc((size_t)steps, sizeof(double));
    double *secs = calloc((size_t)steps, sizeof(double));
    if (st == QC_OK && (!ratio || !secs))
        st = qc_errorf(QC_ERR_NOMEM, "bench dist: out of memory");
    if (st == QC_OK)
        qc_trainer_dist_stats_reset(t);
    for (int64_t i = 0; st == QC_OK && i < steps; i++) {
        struct qc_step_metrics m;
        st = qc_trainer_step(t, &m);
        ratio[i] = m.rank_time_ratio > 0 ? m.rank_time_ratio : 1.0;
        edge_sum += m.rank_edge_ratio > 0 ? m.rank_edge_ratio : 1.0;
        secs[i] = m.step_s;
    }
    if (st == QC_OK) {
        r->world = qc_trainer_world(t);
        r->params = qc_qcnet_num_params(qc_trainer_model(t));
        r->steps = steps;
        qc_trainer_dist_stats(t, &r->s);
        double sum = 0;
        for (int64_t i = 0; i < steps; i++)
            sum += ratio[i];
        r->ratio_mean = sum / (double)steps;
        r->edge_ratio_mean = edge_sum / (double)steps;
        qsort(ratio, (size_t)steps, sizeof(double), cmp_double);
        qsort(secs, (size_t)steps, sizeof(double), cmp_double);
        r->ratio_median = ratio[steps / 2];
        r->step_s = secs[steps / 2];
    }
    free(ratio);
    free(secs);
    qc_bench_run_end(&run);
    return st;
}

/* The mean over the epoch's full steps of (most loaded rank's estimated cost) / (mean over
 * ranks), for balance off and on (ratio[0], ratio[1]). */
static enum qc_status plan_balance(int64_t nscenes, uint64_t seed, int64_t world, int64_t batch,
                                   double ratio[2])
{
    int64_t *cost = malloc((size_t)nscenes * sizeof(int64_t));
    int64_t *ptr = malloc((size_t)(nscenes + 2) * sizeof(int64_t));
    int64_t *idx = malloc((size_t)(nscenes + 2) * sizeof(int64_t));
    double *load = calloc((size_t)world * (size_t)(nscenes / batch + 2), sizeof(double));
    enum qc_status st = QC_OK;
    if (!cost || !ptr || !idx || !load)
        st = qc_errorf(QC_ERR_NOMEM, "bench dist: out of memory");
    for (int64_t i = 0; st == QC_OK && i < nscenes; i++) {
        struct qc_scene sc;
        st = qc_synth_scene(seed, i, QC_SYNTH_MIXED, &sc);
        if (st == QC_OK) {
            cost[i] = qc_loader_cost_estimate(sc.num_agents, sc.num_polygons, sc.num_points,
                                              sc.num_pl2pl);
            qc_scene_free(&sc);
        }
    }
    for (int b = 0; st == QC_OK && b < 2; b++) {
        const int64_t nsteps = nscenes / (world * batch); /* full steps only */
        memset(load, 0, (size_t)world * (size_t)(nsteps + 1) * sizeof(double));
        for (int64_t r = 0; r < world; r++) {
            const int64_t nb = qc_loader_plan_epoch(nscenes, cost, seed, 0, true, batch, 1, r,
                                                    world, b == 1, false, ptr, idx);
            for (int64_t k = 0; k < nb && k < nsteps; k++)
                for (int64_t i = ptr[k]; i < ptr[k + 1]; i++)
                    load[k * world + r] += (double)cost[idx[i]];
        }
        double sum = 0;
        for (int64_t k = 0; k < nsteps; k++) {
            double mx = 0, mean = 0;
            for (int64_t r = 0; r < world; r++) {
                mx = load[k * world + r] > mx ? load[k * world + r] : mx;
                mean += load[k * world + r] / (double)world;
            }
            sum += mean > 0 ? mx / mean : 1.0;
        }
        ratio[b] = nsteps > 0 ? sum / (double)nsteps : 1.0;
    }
    free(cost);
    free(ptr);
    free(idx);
    free(load);
    return st;
}

enum qc_status qc_bench_dist(struct qc_cli *cli, int argc, char **argv)
{
    bool json = false;
    int64_t steps = 6, warmup = 1, batch = 4, plan_scenes = 1024;
    const struct qc_cli_opt opts[] = {
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object (rank 0)"},
        {"steps", QC_CLI_INT, &steps, "6", "timed steps per configuration"},
        {"warmup", QC_CLI_INT, &warmup, "1", "untimed steps first"},
        {"plan-scenes", QC_CLI_INT, &plan_scenes, "1024",
         "mixed scenes of the epoch whose plan is measured (estimated costs)"},
        {"batch", QC_CLI_INT, &batch, "4",
         "scenes per rank per step (QCNet: 4; balancing needs more than 1)"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench dist", dist_usage, dist_summary, opts,
                        (int)(sizeof(opts) / sizeof(opts[0])), argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    if (steps < 1 || warmup < 0 || batch < 1 || plan_scenes < 1)
        return qc_errorf(QC_ERR_INVALID, "bench dist: --steps, --batch and --plan-scenes must be "
                                         ">= 1, --warmup >= 0");
    QC_TRY(qc_dist_world_init());
    const bool rank0 = qc_dist_world_rank() == 0;
    FILE *o = json ? stderr : stdout;
    if (rank0 && qc_dist_world_size() < 2)
        fprintf(o, "bench dist: one rank (no mpirun or srun): no collective to measure\n");
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "dist");
    cJSON_AddStringToObject(root, "preset", cli->preset ? cli->preset : "(defaults)");
    cJSON_AddStringToObject(root, "device", qc_train_device_str(cli->cfg.device_kind));
    cJSON_AddStringToObject(root, "launcher", qc_dist_world_launcher());
    cJSON_AddNumberToObject(root, "ranks", (double)qc_dist_world_size());
    cJSON_AddNumberToObject(root, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(root, "zero_stage", (double)cli->cfg.zero_stage);
    cJSON_AddNumberToObject(root, "bucket_bytes", (double)cli->cfg.bucket_bytes);
    cJSON_AddNumberToObject(root, "batch_per_rank", (double)batch);
    cJSON_AddNumberToObject(root, "warmup", (double)warmup);
    cJSON_AddNumberToObject(root, "steps", (double)steps);
    enum qc_status st = QC_OK;
    {
        const int64_t W = qc_dist_world_size();
        double pr[2] = {1, 1};
        QC_TRY(plan_balance(plan_scenes, (uint64_t)cli->cfg.seed, W, batch, pr));
        cJSON *plan = cJSON_AddObjectToObject(root, "plan");
        cJSON_AddNumberToObject(plan, "scenes", (double)plan_scenes);
        cJSON_AddNumberToObject(plan, "cost_ratio_none", pr[0]);
        cJSON_AddNumberToObject(plan, "cost_ratio_cost", pr[1]);
        if (rank0) {
            fprintf(o,
                    "dist plan of %" PRId64 " mixed scenes, %" PRId64 " ranks x %" PRId64
                    " scenes: most/mean rank estimated cost per step %.3f (none), %.3f (cost)\n",
                    plan_scenes, W, batch, pr[0], pr[1]);
            fflush(o);
        }
    }
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    static const enum qc_balance bal[2] = {QC_BALANCE_NONE, QC_BALANCE_COST};
    static const char *const bal_name[2] = {"none", "cost"};
    for (int b = 0; b < 2 && st == QC_OK; b++) {
        struct dist_result r;
        st = bench_one(&cli->cfg, bal[b], batch, warmup, steps, &r);
        if (st != QC_OK)
            break;
        const double n = (double)r.steps;
        const double coll = r.s.grads_coll_s / n, exposed = r.s.grads_wait_s / n;
        const double hidden = coll > 0 ? 1.0 - (exposed < coll ? exposed : coll) / coll : 0.0;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "balance", bal_name[b]);
        cJSON_AddNumberToObject(j, "params", (double)r.params);
        cJSON_AddNumberToObject(j, "bytes_reduced_per_step", (double)r.s.bytes_reduced / n);
        cJSON_AddNumberToObject(j, "bytes_sent_per_step", (double)r.s.bytes_sent / n);
        cJSON_AddNumberToObject(j, "grads_coll_s", coll);
        cJSON_AddNumberToObject(j, "grads_exposed_s", exposed);
        cJSON_AddNumberToObject(j, "hidden_share", hidden);
        cJSON_AddNumberToObject(j, "params_allgather_s", r.s.params_s / n);
        cJSON_AddNumberToObject(j, "step_s", r.step_s);
        cJSON_AddNumberToObject(j, "rank_time_ratio_median", r.ratio_median);
        cJSON_AddNumberToObject(j, "rank_time_ratio_mean", r.ratio_mean);
        cJSON_AddNumberToObject(j, "rank_edge_ratio_mean", r.edge_ratio_mean);
        cJSON_AddItemToArray(arr, j);
        if (rank0) {
            fprintf(o,
                    "dist %d ranks balance %-4s  %8.2f MB reduced/step  collectives %.3f s/step "
                    "(%.0f %% hidden)  step %.2f s  slowest/mean rank %.3f (median)\n",
                    r.world, bal_name[b], (double)r.s.bytes_reduced / n / 1e6, coll, 100.0 * hidden,
                    r.step_s, r.ratio_median);
            fflush(o);
        }
    }
    if (st == QC_OK && json && rank0) {
        char *s = cJSON_PrintUnformatted(root);
        if (s) {
            printf("%s\n", s);
            free(s);
        }
    }
    cJSON_Delete(root);
    return st;
}
