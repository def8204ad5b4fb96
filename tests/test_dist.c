/*
 * test_dist.c — the parts of data-parallel training that need no second process (the ranks
 * themselves are in test_dist_mpi.c):
 *   - shards: contiguous, in rank order, covering the buffer, near-equal, aligned;
 *   - the static pieces of a reduction: the same for every rank, top down, never straddling
 *     the model's cuts, at most bucket_bytes;
 *   - the rank-order sum is bit for bit the sequential float sum, in place too;
 *   - launch detection from mpirun / PMI / srun environments, and one rank otherwise (an
 *     sbatch script's environment included);
 *   - W sharded AdamW optimizers give the bits of one over the whole buffer;
 *   - the model reports its gradient ranges top down at qc_qcnet_grads_cuts, each final when
 *     reported;
 *   - the resume check counts groups per step over ranks; metrics and memory report lines of a
 *     data-parallel run; a plain `qctrain train` refuses dist.world_size 2 with a hint.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "qc_batch.h"
#include "qc_config.h"
#include "qc_dist.h"
#include "qc_loader.h"
#include "qc_memreport.h"
#include "qc_qcnet.h"
#include "qc_train.h"
#include "testutil.h"

#define QCTRAIN QC_BINARY_DIR "/qctrain"

static void test_shards(void)
{
    const int64_t sizes[] = {0, 1, 15, 16, 17, 1000, 488201, 7660673};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        for (int W = 1; W <= 9; W++) {
            const int64_t n = sizes[i];
            int64_t prev = 0;
            for (int r = 0; r < W; r++) {
                int64_t lo, hi;
                qc_dist_shard_range(n, W, r, &lo, &hi);
                T_EXPECT(lo == prev && hi >= lo, "n %lld W %d rank %d: [%lld, %lld) after %lld",
                         (long long)n, W, r, (long long)lo, (long long)hi, (long long)prev);
                T_EXPECT(r == 0 || lo % 16 == 0 || lo == n, "rank %d starts at %lld", r,
                         (long long)lo);
                const int64_t ideal = n / W;
                T_EXPECT(hi - lo <= ideal + 32 && (n < 32 * W || hi - lo >= ideal - 32),
                         "n %lld W %d rank %d holds %lld", (long long)n, W, r,
                         (long long)(hi - lo));
                prev = hi;
            }
            T_EXPECT_EQ_I64(prev, n, "shards cover n %lld W %d", (long long)n, W);
        }
    }
}

static void test_pieces(void)
{
    const int64_t n = 10000, cuts[2] = {6000, 1234}; /* any order */
    const int64_t maxes[] = {1, 7, 1000, 4096, 100000};
    for (size_t m = 0; m < sizeof(maxes) / sizeof(maxes[0]); m++) {
        const int64_t np = qc_dist_pieces(n, cuts, 2, maxes[m], NULL, 0);
        int64_t *p = malloc((size_t)(2 * np) * sizeof(int64_t));
        T_EXPECT(qc_dist_pieces(n, cuts, 2, maxes[m], p, np) == np, "count stable");
        int64_t top = n;
        for (int64_t k = 0; k < np; k++) {
            const int64_t lo = p[2 * k], hi = p[2 * k + 1];
            T_EXPECT(hi == top && lo < hi && hi - lo <= maxes[m], "piece %lld: [%lld, %lld)",
                     (long long)k, (long long)lo, (long long)hi);
            for (int c = 0; c < 2; c++)
                T_EXPECT(!(lo < cuts[c] && cuts[c] < hi), "piece [%lld, %lld) straddles %lld",
                         (long long)lo, (long long)hi, (long long)cuts[c]);
            top = lo;
        }
        T_EXPECT_EQ_I64(top, 0, "pieces cover the buffer (max %lld)", (long long)maxes[m]);
        free(p);
    }
    T_EXPECT_EQ_I64(qc_dist_pieces(0, NULL, 0, 8, NULL, 0), 0, "empty buffer");
}

static void test_sum(void)
{
    enum { W = 5, N = 3001 };
    float *src[W], *ref = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));
    uint64_t s = qc_test_seed();
    for (int q = 0; q < W; q++) {
        src[q] = malloc(N * sizeof(float));
        for (int i = 0; i < N; i++)
            src[q][i] = (float)((int64_t)(qc_test_rand(&s) % 2000001) - 1000000) *
                        (q % 2 ? 1e-3f : 7.31e-7f);
    }
    for (int i = 0; i < N; i++) {
        float acc = src[0][i];
        for (int q = 1; q < W; q++)
            acc += src[q][i];
        ref[i] = acc;
    }
    const float *cs[W];
    for (int q = 0; q < W; q++)
        cs[q] = src[q];
    qc_dist_sum_rank_order(out, cs, W, N);
    T_EXPECT(memcmp(out, ref, N * sizeof(float)) == 0, "rank-order sum == sequential sum");
    qc_dist_sum_rank_order(src[2], cs, W, N); /* in place into one of the sources */
    T_EXPECT(memcmp(src[2], ref, N * sizeof(float)) == 0, "in place");
    for (int q = 0; q < W; q++)
        free(src[q]);
    free(ref);
    free(out);
}

static const char *const launch_vars[] = {"OMPI_COMM_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "PMI_SIZE",
                                          "PMI_RANK",
                                          "MPI_LOCALRANKID",
                                          "MPI_LOCALNRANKS",
                                          "SLURM_STEP_NUM_TASKS",
                                          "SLURM_PROCID",
                                          "SLURM_LOCALID",
                                          "SLURM_NTASKS",
                                          "PMIX_RANK"};

static void clear_launch_env(void)
{
    for (size_t i = 0; i < sizeof(launch_vars) / sizeof(launch_vars[0]); i++)
        unsetenv(launch_vars[i]);
}

static void test_launch(void)
{
    struct qc_dist_launch l;
    clear_launch_env();
    qc_dist_launch_detect(&l);
    T_EXPECT(l.size == 1 && l.rank == 0 && strcmp(l.launcher, "none") == 0, "no launcher");
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    qc_dist_launch_detect(&l);
    T_EXPECT(l.size == 4 && l.rank == 2 && l.local_rank == 0 && l.local_size == 2 &&
                 strcmp(l.launcher, "mpirun") == 0,
             "mpirun: %d of %d, local %d of %d, %s", l.rank, l.size, l.local_rank, l.local_size,
             l.launcher);
    clear_launch_env();
    setenv("PMI_SIZE", "3", 1);
    setenv("PMI_RANK", "1", 1);
    qc_dist_launch_detect(&l);
    T_EXPECT(l.size == 3 && l.rank == 1 && strcmp(l.launcher, "pmi") == 0, "hydra");
    clear_launch_env();
    /* an sbatch script: the allocation's task count, but no job step */
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_PROCID", "0", 1);
    qc_dist_launch_detect(&l);
    T_EXPECT(l.size == 1 && strcmp(l.launcher, "none") == 0, "sbatch script: one rank");
    setenv("SLURM_STEP_NUM_TASKS", "8", 1);
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_LOCALID", "1", 1);
    qc_dist_launch_detect(&l);
    T_EXPECT(l.size == 8 && l.rank == 5 && l.local_rank == 1 && strcmp(l.launcher, "srun") == 0,
             "srun: %d of %d, local %d", l.rank, l.size, l.local_rank);
    clear_launch_env();
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_RANK", "7", 1); /* nonsense: not a launch */
    qc_dist_launch_detect(&l);
    T_EXPECT(l.size == 1 && strcmp(l.launcher, "none") == 0, "rank >= size is ignored");
    clear_launch_env();
}

/* W optimizers over shards of one buffer give the bits of one over the whole. */
static void test_sharded_optim(void)
{
    enum { N = 1000, NSEG = 7, W = 3, STEPS = 3 };
    const int64_t offsets[NSEG + 1] = {0, 10, 130, 131, 500, 777, 900, N};
    const uint8_t decay[NSEG] = {1, 0, 1, 1, 0, 1, 0};
    float *p_full = malloc(N * sizeof(float)), *p_sh = malloc(N * sizeof(float));
    float *g = malloc(N * sizeof(float));
    uint64_t s = qc_test_seed() ^ 77;
    for (int i = 0; i < N; i++)
        p_full[i] = p_sh[i] = (float)((int64_t)(qc_test_rand(&s) % 2001) - 1000) * 1e-3f;
    struct qc_optim_params hp;
    qc_optim_params_default(&hp);
    struct qc_optim *full = NULL, *sh[W] = {NULL};
    T_EXPECT(qc_optim_create(NULL, N, offsets, decay, NSEG, &hp, &full) == QC_OK, "%s",
             qc_error_last());
    for (int r = 0; r < W; r++) {
        int64_t lo, hi;
        qc_dist_shard_range(N, W, r, &lo, &hi);
        T_EXPECT(qc_optim_create_shard(NULL, NULL, N, offsets, decay, NSEG, lo, hi, &hp, &sh[r]) ==
                     QC_OK,
                 "%s", qc_error_last());
        int64_t a = -1, b = -1;
        if (sh[r])
            qc_optim_range(sh[r], &a, &b);
        T_EXPECT(a == lo && b == hi && sh[r] && qc_optim_numel(sh[r]) == hi - lo &&
                     qc_optim_numel_full(sh[r]) == N,
                 "shard %d range", r);
    }
    for (int t = 0; t < STEPS && full; t++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)((int64_t)(qc_test_rand(&s) % 2001) - 1000) * 1e-4f;
        qc_optim_step(full, p_full, g, 1e-2);
        for (int r = 0; r < W; r++)
            if (sh[r])
                qc_optim_step(sh[r], p_sh, g, 1e-2);
    }
    T_EXPECT(memcmp(p_full, p_sh, N * sizeof(float)) == 0, "sharded AdamW == whole AdamW");
    int64_t dn_full = full ? qc_optim_decay_numel(full, NULL) : 0, dn_sh = 0;
    for (int r = 0; r < W; r++)
        dn_sh += sh[r] ? qc_optim_decay_numel(sh[r], NULL) : 0;
    T_EXPECT_EQ_I64(dn_sh, dn_full, "decay elements kept across the cuts");
    if (full && sh[1]) { /* the moments of shard 1 are the whole's range */
        int64_t lo, hi;
        qc_optim_range(sh[1], &lo, &hi);
        T_EXPECT(memcmp(qc_optim_exp_avg(sh[1]), qc_optim_exp_avg(full) + lo,
                        (size_t)(hi - lo) * sizeof(float)) == 0,
                 "exp_avg of shard 1");
    }
    struct qc_optim *bad = NULL;
    T_EXPECT(qc_optim_create_shard(NULL, NULL, N, offsets, decay, NSEG, 10, N + 1, &hp, &bad) ==
                 QC_ERR_INVALID,
             "a shard past the buffer is refused");
    qc_optim_destroy(full);
    for (int r = 0; r < W; r++)
        qc_optim_destroy(sh[r]);
    free(p_full);
    free(p_sh);
    free(g);
}

// ---- the model's grads-ready reports
// ----------------------------------------------------------------

struct report {
    int n;
    int64_t lo[8], hi[8];
    float *snap[8]; /* the gradients of the range when reported */
    const float *grads;
};

static void on_ready(void *ctx, int64_t lo, int64_t hi)
{
    struct report *r = ctx;
    if (r->n >= 8)
        return;
    r->lo[r->n] = lo;
    r->hi[r->n] = hi;
    r->snap[r->n] = malloc((size_t)(hi - lo + 1) * sizeof(float));
    memcpy(r->snap[r->n], r->grads + lo, (size_t)(hi - lo) * sizeof(float));
    r->n++;
}

static void test_grads_ready(void)
{
    struct qc_config cfg;
    qc_config_defaults(&cfg);
    T_EXPECT(qc_config_apply_preset(&cfg, "cpu-smoke") == QC_OK, "%s", qc_error_last());
    cfg.batch_size = 1;
    cfg.synthetic_scenes = 2;
    cfg.pl2pl_radius = cfg.pl2m_radius = cfg.a2m_radius = 30;
    cfg.pl2a_radius = cfg.a2a_radius = 15;
    cfg.time_span = 3;
    cfg.num_t2m_steps = 6;
    struct qc_loader_opts lo;
    qc_train_loader_opts(&cfg, &lo);
    lo.threads = 1;
    struct qc_loader *ld = NULL;
    struct qc_qcnet_config mc;
    qc_train_model_config(&cfg, &mc);
    struct qc_qcnet *m = NULL;
    T_EXPECT(qc_loader_create(NULL, 0, &lo, &ld) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_qcnet_create(&mc, &m) == QC_OK, "%s", qc_error_last());
    if (!m || !ld) {
        qc_loader_destroy(ld);
        qc_qcnet_destroy(m);
        return;
    }
    qc_qcnet_init_params(m, 7);
    const int64_t n = qc_qcnet_num_params(m);
    int64_t cuts[4];
    T_EXPECT_EQ_I64(qc_qcnet_grads_cuts(m, cuts, 4), 2, "two cuts");
    T_EXPECT(0 < cuts[0] && cuts[0] < cuts[1] && cuts[1] < n, "cuts %lld < %lld inside %lld",
             (long long)cuts[0], (long long)cuts[1], (long long)n);
    T_EXPECT_EQ_I64(
        cuts[0],
        qc_qcnet_key_at(m, qc_qcnet_key_find(m, "encoder.agent_encoder.type_a_emb.weight"))->offset,
        "the agent encoder's first parameter");
    struct report r = {.grads = qc_qcnet_grads(m)};
    qc_qcnet_set_grads_ready(m, on_ready, &r);
    T_EXPECT(qc_loader_start_epoch(ld, 0) == QC_OK, "%s", qc_error_last());
    struct qc_batch *b = NULL;
    T_EXPECT(qc_loader_next(ld, &b) == QC_OK && b, "%s", qc_error_last());
    if (b) {
        const struct qc_qcnet_ctx ctx = {.training = true, .need_backward = true, .seed = 1};
        struct qc_qcnet_output o;
        struct qc_qcnet_loss l;
        qc_qcnet_zero_grad(m);
        T_EXPECT(qc_qcnet_forward(m, b, &ctx, &o) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_qcnet_loss(m, &l) == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_qcnet_backward(m, 1.0f) == QC_OK, "%s", qc_error_last());
        qc_qcnet_release(m);
        qc_loader_release(ld, b);
    }
    T_EXPECT_EQ_I64(r.n, 3, "three reports");
    const int64_t want[3][2] = {{cuts[1], n}, {cuts[0], cuts[1]}, {0, cuts[0]}};
    for (int k = 0; k < r.n && k < 3; k++) {
        T_EXPECT(r.lo[k] == want[k][0] && r.hi[k] == want[k][1], "report %d: [%lld, %lld)", k,
                 (long long)r.lo[k], (long long)r.hi[k]);
        T_EXPECT(memcmp(r.snap[k], qc_qcnet_grads(m) + r.lo[k],
                        (size_t)(r.hi[k] - r.lo[k]) * sizeof(float)) == 0,
                 "report %d: the range was final when reported", k);
        int64_t nz = 0;
        for (int64_t i = 0; i < r.hi[k] - r.lo[k]; i++)
            nz += r.snap[k][i] != 0.0f;
        T_EXPECT(nz > 0, "report %d: gradients were computed", k);
    }
    for (int k = 0; k < r.n; k++)
        free(r.snap[k]);
    qc_qcnet_set_grads_ready(m, NULL, NULL);
    qc_qcnet_destroy(m);
    qc_loader_destroy(ld);
}

// ---- resume check, metrics, memory report, the CLI
// --------------------------------------------------

static void test_resume_check(void)
{
    struct qc_config saved, now;
    qc_config_defaults(&saved);
    saved.world_size = 2;
    saved.grad_accum = 1;
    saved.balance = QC_BALANCE_COST;
    now = saved;
    now.world_size = 1;
    now.grad_accum = 2;
    now.balance = QC_BALANCE_AUTO;
    T_EXPECT(qc_checkpoint_check_config(&saved, &now, "CK") == QC_OK, "2 x 1 resumes as 1 x 2: %s",
             qc_error_last());
    now.grad_accum = 1;
    T_EXPECT(qc_checkpoint_check_config(&saved, &now, "CK") == QC_ERR_INVALID, "1 x 1 refused");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "2 groups per step");
    now.grad_accum = 2;
    now.balance = QC_BALANCE_NONE;
    T_EXPECT(qc_checkpoint_check_config(&saved, &now, "CK") == QC_ERR_INVALID,
             "another data.balance refused");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "data.balance");
}

static void test_reports(void)
{
    struct qc_step_metrics s = {.step = 3, .loss = 1.5, .lr = 1e-3};
    char buf[1024];
    qc_metrics_format_step(&s, buf, sizeof(buf));
    T_EXPECT(strstr(buf, "rank_time_ratio") == NULL, "one rank: no rank keys: %s", buf);
    s.ranks = 4;
    s.rank_time_ratio = 1.25;
    s.rank_edge_ratio = 1.125;
    s.comm_wait_s = 0.5;
    const size_t need = qc_metrics_format_step(&s, buf, sizeof(buf));
    T_EXPECT(need == strlen(buf) && buf[need - 1] == '}', "well formed: %s", buf);
    T_EXPECT_STR_CONTAINS(
        buf, "\"ranks\":4,\"rank_time_ratio\":1.25,\"rank_edge_ratio\":1.125,\"comm_wait_s\":0.5}");
    char small[16];
    T_EXPECT_EQ_U64(qc_metrics_format_step(&s, small, sizeof(small)), need, "length past cap");

    const struct qc_memreport_rank ranks[2] = {{.rank = 0,
                                                .params_bytes = 4000,
                                                .grads_bytes = 4000,
                                                .grads_reduced_bytes = 2000,
                                                .moments_bytes = 4000,
                                                .comm_bytes = 100,
                                                .peak_allocated_bytes = 9000},
                                               {.rank = 1,
                                                .params_bytes = 4000,
                                                .grads_bytes = 4000,
                                                .grads_reduced_bytes = 2000,
                                                .moments_bytes = 4000,
                                                .comm_bytes = 100,
                                                .peak_allocated_bytes = 9100}};
    struct qc_memreport r = {.device = "cpu", .step = 1, .total_steps = 1};
    r.zero_stage = 2;
    r.ranks = ranks;
    r.nranks = 2;
    const size_t jn = qc_memreport_format_json(&r, NULL, 0);
    char *j = malloc(jn + 1);
    qc_memreport_format_json(&r, j, jn + 1);
    T_EXPECT_STR_CONTAINS(j, "\"dist\": {\n    \"world_size\": 2,\n    \"zero_stage\": 2");
    T_EXPECT_STR_CONTAINS(j, "\"rank\": 1, \"params_bytes\": 4000, \"grads_bytes\": 4000, "
                             "\"grads_reduced_bytes\": 2000, \"moments_bytes\": 4000");
    free(j);
    const size_t tn = qc_memreport_format_text(&r, NULL, 0);
    char *t = malloc(tn + 1);
    qc_memreport_format_text(&r, t, tn + 1);
    T_EXPECT_STR_CONTAINS(t, "per rank (2 ranks, ZeRO stage 2)");
    free(t);
}

/* Runs a shell command line; returns its exit code and its output in out (n bytes). */
static int sh(const char *cmd, char *out, size_t n)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    const size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_one_rank(void)
{
    clear_launch_env();
    char out[4096];
    int rc = sh(QCTRAIN " train --preset cpu-smoke --set dist.world_size=2 --steps 1 --out "
                        "/tmp/qctrain-test-dist-none 2>&1",
                out, sizeof(out));
    T_EXPECT(rc == 2, "dist.world_size 2 without a launcher: exit %d", rc);
    T_EXPECT_STR_CONTAINS(out, "dist.world_size is 2 but qctrain was started as one rank");
    T_EXPECT_STR_CONTAINS(out, "hint: mpirun -np 2");
    rc = sh(QCTRAIN " version", out, sizeof(out));
    T_EXPECT(rc == 0, "version");
    T_EXPECT_STR_CONTAINS(out, "\nnccl: ");
}

int main(void)
{
    QC_TEST ("dist: shards cover the buffer in rank order, near-equal and aligned") {
        test_shards();
    }
    QC_TEST ("dist: the pieces of a reduction are static, top down, within the cuts") {
        test_pieces();
    }
    QC_TEST ("dist: the rank-order sum is the sequential float sum, bit for bit") {
        test_sum();
    }
    QC_TEST ("dist: launch detection (mpirun, PMI, srun; one rank otherwise)") {
        test_launch();
    }
    QC_TEST ("dist: W sharded AdamW optimizers give the bits of one over the whole buffer") {
        test_sharded_optim();
    }
    QC_TEST ("dist: backward reports its gradient ranges top down, each final when reported") {
        test_grads_ready();
    }
    QC_TEST ("dist: resume checks ranks x groups; metrics and memory report of a DP run") {
        test_resume_check();
        test_reports();
    }
    QC_TEST ("dist: a plain qctrain train is one rank: dist.world_size 2 is refused") {
        test_cli_one_rank();
    }
    return qc_test_summary();
}
