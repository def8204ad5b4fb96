/*
 * test_dist_mpi.c — data-parallel training with real ranks: the qctrain binary under `mpirun`
 * (Open MPI, oversubscribed on a small machine), on the CPU backend, a tiny model (cpu-smoke's
 * sizes, 1 scene per group, 8 synthetic scenes, small radii):
 *   - N ranks x 1 group == 1 rank x N groups (N = 2, 3) after 4 steps, for ZeRO stages 0, 1 and
 *     2: the weights and the AdamW moments (exp_avg, exp_avg_sq) within a bound per rank count
 *     measured and derived below ("comparing checkpoints"), the stages giving identical bytes
 *     (the reduction is the same rank-order sum, AdamW is elementwise); a small case of it
 *     (2 ranks, ZeRO 2) is its own ctest entry, test_dist_mpi_small, which CI's sanitized
 *     builds run;
 *   - two identical multi-rank runs give identical bytes; the bytes do not depend on
 *     dist.bucket_bytes;
 *   - resume across world sizes: 2 ranks -> 1 rank x 2 groups, and 1 rank x 2 groups -> 2 ranks
 *     with ZeRO 1 (moments gathered into the checkpoint, read back into shards);
 *   - a rank killed (kill -9) or stopped (SIGSTOP) mid-run: the others stop within
 *     dist.timeout with an error naming it, mpirun exits non-zero; with mpirun's own
 *     abort-on-failure on, mpirun names it;
 *   - a configuration that differs between ranks is refused at start-up, naming the rank and
 *     the key; dist.world_size must match the launch;
 *   - the rtx3090x8 preset runs 8 ranks when launched with 8 (device.kind cpu, tiny model);
 *   - under device.budget every rank plans its own groups: 2 ranks under a budget that makes
 *     the planner recompute give the bytes of the unconstrained run, also with an OOM injected
 *     after a rank handed its first gradient range to the reduction (rolled back, re-planned:
 *     QC_FAULT_OOM_AFTER_REPORT); with groups of 4 scenes under a budget that splits them
 *     (dropout off: the split moves no dropout mask), the weights of 1 rank x 2 unsplit
 *     groups within the 2-rank bounds.
 * `test_dist_mpi cuda` (label gpu, ctest's test_dist_mpi_cuda): the same equivalence with NCCL,
 * 2 ranks x 1 group vs 1 rank x 2 groups on device.kind cuda, ZeRO 0, 1, 2, one rank per GPU.
 * Exit 77 without a GPU (tests/cuda_probe.h: a GPU that does not work fails) and with one GPU
 * ("skip: one GPU": NCCL refuses two ranks of a communicator on one GPU, "Duplicate GPU";
 * test_dist_nccl runs the NCCL code in one process there).
 *
 * The comparisons, their measured figures and bounds, and the elements set aside as noise-decided
 * (only where the exact gradient is zero) are explained at "comparing checkpoints" below. The
 * test prints the figures.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_probe.h"
#include "dist_testlib.h"
#include "qc_device.h" /* qc_device_cuda_probe */
#include "qc_safetensors.h"
#include "testutil.h"

#include "kernels_testlib.h"

extern char **environ;

#define QCTRAIN  QC_BINARY_DIR "/qctrain"
#define LR       0.002 /* cpu-smoke's */
#define STEPS    4
#define CMP_STEP 1 /* N ranks x 1 group against 1 rank x N groups: the checkpoint compared */

static char tmp_root[256];
static char tag[64]; /* QC_TEST_TAG of this process's runs: finds their ranks in /proc */

// ---- running mpirun -----------------------------------------------------------------------------

struct cmd {
    const char *argv[160];
    int n;
};

static void cmd_add(struct cmd *c, const char *a)
{
    if (c->n >= 158)
        T_FATAL("command too long");
    c->argv[c->n++] = a;
    c->argv[c->n] = NULL;
}

/* "mpirun --oversubscribe [extra mpirun args] -np N qctrain train <tiny> " */
static void cmd_mpirun(struct cmd *c, int np, const char *const *mpi_extra)
{
    static char npbuf[8][16];
    static int k;
    c->n = 0;
    cmd_add(c, QC_MPIEXEC);
    cmd_add(c, "--oversubscribe");
    for (int i = 0; mpi_extra && mpi_extra[i]; i++)
        cmd_add(c, mpi_extra[i]);
    cmd_add(c, "-np");
    char *b = npbuf[k++ % 8];
    snprintf(b, 16, "%d", np);
    cmd_add(c, b);
    cmd_add(c, QCTRAIN);
}

static void cmd_train(struct cmd *c)
{
    cmd_add(c, "train");
    for (int i = 0; i < T_TINY_TRAIN_NARGS; i++)
        cmd_add(c, t_tiny_train_args[i]);
}

/* Starts the command with stdout+stderr into log; returns the pid. */
static pid_t spawn(const struct cmd *c, const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    char *argv[160];
    for (int i = 0; i <= c->n; i++)
        memcpy(&argv[i], &c->argv[i], sizeof(argv[i])); /* exec's argv is char *const[] */
    const int st = posix_spawnp(&pid, c->argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (st != 0)
        T_FATAL("cannot run %s: %s", c->argv[0], strerror(st));
    return pid;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits up to limit_s for pid; returns the exit code (128 + signal when killed), or -1 after
 * killing it when it did not end in time. */
static int wait_for(pid_t pid, double limit_s)
{
    const double t0 = now_s();
    for (;;) {
        int status = 0;
        const pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (now_s() - t0 > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(20000);
    }
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return calloc(1, 1);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    if (s && n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n)
        s[0] = '\0';
    fclose(f);
    return s;
}

/* Runs to completion (at most 300 s); returns the exit code, prints the log on failure. */
static int run(const struct cmd *c, const char *name)
{
    char log[512];
    snprintf(log, sizeof(log), "%s/%s.log", tmp_root, name);
    const double t0 = now_s();
    const int rc = wait_for(spawn(c, log), 300);
    printf("  %-14s %5.1f s\n", name, now_s() - t0);
    if (rc != 0) {
        char *s = slurp(log);
        printf("  %s: exit %d\n%s\n", name, rc, s);
        free(s);
    }
    return rc;
}

static void out_dir(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmp_root, name);
    t_rm_rf(buf);
}

// ---- comparing checkpoints ----------------------------------------------------------------------

/* N ranks x 1 group against 1 rank x N groups: the same N group gradients summed in another
 * order (rank order after each group's backward, against one buffer accumulated as backward
 * goes), so every figure below is rounding. Compared: the weights (model.safetensors) and the
 * AdamW moments exp_avg and exp_avg_sq (optim.safetensors) after step CMP_STEP = 1, each as
 * ‖a − b‖ / ‖a‖ over its elements, with the noise-decided elements (below) set aside. After one
 * step exp_avg = (1 − β1)·g and exp_avg_sq = (1 − β2)·g² of the reduced gradient g: the moments
 * are the reduction itself. (The runs go on to STEPS, where ZeRO 0, 1 and 2 must still be
 * bit-identical.) Why not later: AdamW's first step moves every element by about lr·sign(g), so an
 * element whose reduced gradient is rounding noise (a near-cancelling sum, not only the exact
 * zeros below) moves ±lr, and the steps after it compound that: with dropout keyed by scene
 * (issue 25) seed 2023 with 3 ranks is apart by 3.6e-5 (weights), 4.0e-4 (exp_avg) and 20
 * elements > lr/10 after 4 steps, 2.3e-5 after 2; of eight seeds (2023, 1-7) x {2 ranks, 3 ranks,
 * the split group below}, 13 of 24 leave rounding by step 4 (Intel Xeon VM, 2026-12-06).
 *
 * Measured after step 1 (CPU backend, Intel Xeon VM, 2026-12-06, keyed dropout; seed 2023, in
 * brackets the largest of eight seeds, 2023 and 1-7, ZeRO 0, whose bytes ZeRO 1 and 2 equal):
 *                 weights             exp_avg             exp_avg_sq
 *   2 ranks       1.6e-8  [1.7e-7]    1.7e-7 [1.7e-7]     4.4e-7 [5.5e-7]
 *   3 ranks       3.6e-8  [1.2e-7]    1.4e-7 [1.6e-7]     3.2e-7 [5.8e-7]
 * The bounds below were measured after 4 steps on seeds that stayed rounding there (2 ranks:
 * 1.07e-7 [6.2e-7], 2.0e-7 [1.43e-6], 5.1e-7 [5.2e-7]; 3 ranks: 8.1e-8 [1.8e-7], 2.0e-7 [1.35e-6],
 * 5.2e-7 [1.9e-6], AMD EPYC VM) and are kept: every step-1 figure is inside them.
 * The seed's figure on another machine (other OpenBLAS kernels, other FMA contraction) is
 * another draw of the same rounding: the six draws spread over a factor of up to 14. The bound
 * is twice the largest draw, rounded up to one digit. The moments see what the weights do not:
 * a reduction off by a uniform factor of 1.001 (a wrong averaging or loss-scale factor) moves
 * exp_avg by 1e-3 and exp_avg_sq by 2e-3, while the weights, AdamW being scale-invariant, move
 * by 2.0e-7, inside their bound (and inside the 1e-5 this test had).
 * (Seed 2 with 3 ranks does not stay rounding: the noise-decided steps below, of about lr each,
 * move the model, and by step 4 four elements outside the two tensors are apart by more than
 * lr/10 and exp_avg differs by 1.3e-3. The test keeps its seed.) The resumes across world sizes
 * (2 of the 4 steps on the other side) measure at most 3.3e-8, 1.1e-7 and 2.7e-8 and take the
 * 2-rank bounds.
 *
 * Noise-decided elements: where a gradient is zero in exact arithmetic what is left is rounding
 * noise whose sign depends on the summation order, and AdamW turns any nonzero gradient into a
 * step of about lr whatever its size. Only these can be zero here: log_softmax is shift-invariant,
 * so Σ_k dL/dpi_k = 0 over the K mode logits of an agent, and
 *   - decoder.to_pi.mlp.3.bias, added to every logit alike, gets exactly that sum: zero;
 *   - an element c of decoder.to_pi.mlp.1.bias (the LayerNorm before to_pi's ReLU and last
 *     Linear) adds w_c to every logit alike where channel c passes the ReLU for all K modes of
 *     every agent: zero there (seeds 1-5 have one to three such elements, 2023 none).
 * An element of these two tensors is noise-decided when its exp_avg in both runs is at rounding
 * level, at most NOISE_M times the run's largest |exp_avg|: such elements measure up to 1.9e-8 of
 * it, the other elements of the two tensors at least 1.7e-6 (twelve runs: 2 and 3 ranks and
 * their references, six seeds), and NOISE_M sits between them, a factor of about 10 from each.
 * A noise-decided element's weights may differ up to 2·lr·steps; its moments are left out of the
 * relative figures. Anywhere else an element of the weights moved apart by more than lr/10 (an
 * outlier) fails: outside the two tensors no element moved apart by more than 3.6e-5 (lr/55) in
 * the eleven comparisons that stayed rounding (seed 2023: 4.2e-6), although some 20,000 other
 * elements have moments at rounding level too (embedding rows no scene uses, whose gradient is
 * exactly zero on both sides; key projections, which softmax barely sees). */
#define OUTLIER (LR / 10)
#define NOISE_M 2e-7

struct tol {
    double w, m, v; /* bounds on the relative figures of the weights, exp_avg, exp_avg_sq */
};

/* N ranks x 1 group against 1 rank x N groups on the CPU backend (above). */
static const struct tol tol_cpu[4] = {[2] = {2e-6, 3e-6, 2e-6}, [3] = {4e-7, 3e-6, 4e-6}};

/* 2 ranks x 1 group of 4 scenes split 2 + 2 under a budget (an OOM rolled back) against 1 rank x
 * 2 unsplit groups: each rank's group also sums its two parts in another order. Measured (seed
 * 2023): weights 6.6e-7, exp_avg 2.9e-6, exp_avg_sq 6.4e-7; seeds 1 and 3: at most 1.4e-6, 1.5e-5,
 * 1.6e-6. Seeds 2, 4 and 5 do not stay rounding: noise-decided steps of step 1 and 2 move the
 * model, and by step 4 elements outside the two tensors below are apart by more than lr/10
 * (seed 4: 130 of them, exp_avg 5.6e-3 relative); the test keeps its seed. Twice the largest of
 * the three that stayed rounding: */
static const struct tol tol_split = {3e-6, 3e-5, 4e-6};
/* The same where the CPU GEMM gives a row other bits in a GEMM of another row count
 * (kt_gemm_rows_exact: OpenBLAS on this workplace's Intel Xeon VM), so that every GEMM of a split
 * group rounds otherwise, not only its accumulation: seed 2023 then leaves rounding as seeds 2, 4
 * and 5 do above. Measured there: weights 1.38e-5, exp_avg 2.04e-4, exp_avg_sq 9.12e-6, 16
 * elements apart by more than lr/10 (max 7.7e-4); twice each, and at most 32 such elements, each
 * within 2 lr steps (below). Both were measured after 4 steps and are kept for the step-1
 * comparison: there (rows not exact, 2026-12-06) seed 2023 measures 4.3e-7, 7.5e-7, 8.3e-7, and
 * six of seeds 1-7 stay under 3.6e-6, 5.6e-6, 2.8e-6; seed 6 does not (7.3e-5 weights, 4.1e-5
 * exp_avg): a split group's GEMMs round otherwise from step 1 on such a BLAS. */
static const struct tol tol_split_rows = {3e-5, 4e-4, 2e-5};
#define SPLIT_ROWS_OUTLIERS 32

/* NCCL (test_dist_mpi cuda): NCCL's summation order and the CUDA kernels' rounding, not yet
 * measured (no machine with two GPUs has run it): the weights keep the bound this test had before
 * the CPU's were measured, the moments get ten times it (on the CPU the moments' figures are up
 * to 13x the weights'). To be set from the first two-GPU run's printed figures. */
static const struct tol tol_nccl = {1e-5, 1e-4, 1e-4};

static const char *const shift_invariant[] = {"decoder.to_pi.mlp.3.bias",
                                              "decoder.to_pi.mlp.1.bias"};

struct rel {
    double num, den; /* Σ (a − b)², Σ a² */
};

static void rel_add(struct rel *r, float a, float b)
{
    const double x = (double)a, y = (double)b;
    r->num += (x - y) * (x - y);
    r->den += x * x;
}

static double rel_of(const struct rel *r)
{
    return r->den > 0 ? sqrt(r->num / r->den) : (r->num > 0 ? (double)INFINITY : 0);
}

struct cmp {
    bool opened;
    bool identical, identical_optim; /* every tensor's bytes equal (model, optim) */
    double w, m, v;                  /* relative figures, noise-decided elements set aside */
    double maxabs;                   /* the weights' largest |a − b| outside them */
    int64_t nout;                    /* outliers: |a − b| > OUTLIER outside them */
    double out_max;                  /* their largest |a − b| */
    char out_name[160];              /* the first one's tensor and index */
    int64_t nnoise;                  /* noise-decided elements */
    double noise_max;                /* their weights' largest |a − b| */
    int64_t nelem, nmoments;         /* weight elements compared; moment tensors compared */
    int64_t ntensors, noptim;        /* weight tensors compared; tensors in a's optim file */
};

/* The largest |x| over the exp_avg.* tensors of an optimizer file. */
static double exp_avg_max(const struct qc_safetensors *o)
{
    double mx = 0;
    for (int64_t i = 0; i < qc_safetensors_count(o); i++) {
        const struct qc_st_tensor *t = qc_safetensors_at(o, i);
        if (strncmp(t->name, "exp_avg.", 8) != 0 || t->dtype != QC_ST_F32)
            continue;
        const float *x = t->data;
        for (int64_t k = 0; k < t->numel; k++)
            mx = fmax(mx, fabs((double)x[k]));
    }
    return mx;
}

/* tensor prefix+name of an optimizer file, F32 of numel elements, or NULL */
static const float *moment(const struct qc_safetensors *o, const char *prefix, const char *name,
                           int64_t numel)
{
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    const struct qc_st_tensor *t = qc_safetensors_find(o, key);
    return t && t->dtype == QC_ST_F32 && t->numel == numel ? t->data : NULL;
}

static bool bytes_equal(const struct qc_safetensors *a, const struct qc_safetensors *b)
{
    if (qc_safetensors_count(a) != qc_safetensors_count(b))
        return false;
    for (int64_t i = 0; i < qc_safetensors_count(a); i++) {
        const struct qc_st_tensor *ta = qc_safetensors_at(a, i);
        const struct qc_st_tensor *tb = qc_safetensors_find(b, ta->name);
        if (!tb || tb->nbytes != ta->nbytes || memcmp(ta->data, tb->data, ta->nbytes) != 0)
            return false;
    }
    return true;
}

/* Compares the weights and AdamW moments of DIR_A/ckpt-STEP and DIR_B/ckpt-STEP. */
static struct cmp compare(const char *dir_a, const char *dir_b, int step)
{
    struct cmp c = {0};
    struct qc_safetensors *f[4] = {NULL, NULL, NULL, NULL}; /* model a, b, optim a, b */
    for (int i = 0; i < 4; i++) {
        char p[600];
        snprintf(p, sizeof(p), "%s/ckpt-%06d/%s", i % 2 ? dir_b : dir_a, step,
                 i < 2 ? "model.safetensors" : "optim.safetensors");
        if (qc_safetensors_open(p, &f[i]) != QC_OK) {
            T_EXPECT(false, "cannot open %s: %s", p, qc_error_last());
            for (int k = 0; k < i; k++)
                qc_safetensors_close(f[k]);
            c.w = c.m = c.v = (double)INFINITY;
            return c;
        }
    }
    c.opened = true;
    c.identical = bytes_equal(f[0], f[1]);
    c.identical_optim = bytes_equal(f[2], f[3]);
    c.noptim = qc_safetensors_count(f[2]);
    const double mmax[2] = {exp_avg_max(f[2]), exp_avg_max(f[3])};
    struct rel w = {0}, m = {0}, v = {0};
    for (int64_t i = 0; i < qc_safetensors_count(f[0]); i++) {
        const struct qc_st_tensor *ta = qc_safetensors_at(f[0], i);
        const struct qc_st_tensor *tb = qc_safetensors_find(f[1], ta->name);
        T_EXPECT(tb != NULL && tb->nbytes == ta->nbytes && ta->dtype == QC_ST_F32 &&
                     tb->dtype == QC_ST_F32,
                 "%s: tensor %s missing, resized or not F32", dir_b, ta->name);
        if (!tb || tb->nbytes != ta->nbytes || ta->dtype != QC_ST_F32 || tb->dtype != QC_ST_F32)
            continue;
        c.ntensors++;
        /* the moments, when the tensor is a distinct parameter (not an alias of one) */
        const float *ma = moment(f[2], "exp_avg.", ta->name, ta->numel);
        const float *mb = moment(f[3], "exp_avg.", ta->name, ta->numel);
        const float *va = moment(f[2], "exp_avg_sq.", ta->name, ta->numel);
        const float *vb = moment(f[3], "exp_avg_sq.", ta->name, ta->numel);
        const bool moments = ma && mb && va && vb;
        c.nmoments += moments;
        bool named = false;
        for (size_t s = 0; s < sizeof shift_invariant / sizeof shift_invariant[0]; s++)
            named = named || strcmp(ta->name, shift_invariant[s]) == 0;
        const float *x = ta->data, *y = tb->data;
        for (int64_t k = 0; k < ta->numel; k++) {
            const double d = fabs((double)x[k] - (double)y[k]);
            c.nelem++;
            if (named && moments && fabs((double)ma[k]) <= NOISE_M * mmax[0] &&
                fabs((double)mb[k]) <= NOISE_M * mmax[1]) {
                c.nnoise++;
                c.noise_max = fmax(c.noise_max, d);
                continue;
            }
            rel_add(&w, x[k], y[k]);
            c.maxabs = fmax(c.maxabs, d);
            if (d > OUTLIER) {
                if (c.nout++ == 0)
                    snprintf(c.out_name, sizeof c.out_name, "%s[%lld]", ta->name, (long long)k);
                c.out_max = fmax(c.out_max, d);
            }
            if (moments) {
                rel_add(&m, ma[k], mb[k]);
                rel_add(&v, va[k], vb[k]);
            }
        }
    }
    c.w = rel_of(&w);
    c.m = rel_of(&m);
    c.v = rel_of(&v);
    for (int i = 0; i < 4; i++)
        qc_safetensors_close(f[i]);
    return c;
}

/* ref and got within t: the relative figures, at most max_out outliers outside the
 * noise-decided elements (0 but for a split group on a GEMM whose rows are not exact), those
 * within 2 lr steps. */
static void expect_close_tol_n(const char *what, const char *ref, const char *got, int step,
                               struct tol t, long long max_out)
{
    const struct cmp c = compare(ref, got, step);
    printf("  %s: relative weights %.3g, exp_avg %.3g, exp_avg_sq %.3g (bounds %.0e %.0e %.0e); "
           "weights max |diff| %.3g; %lld noise-decided element(s) (max |diff| %.3g)\n",
           what, c.w, c.m, c.v, t.w, t.m, t.v, c.maxabs, (long long)c.nnoise, c.noise_max);
    if (!c.opened)
        return;
    T_EXPECT(c.ntensors > 0 && c.nelem > 0, "%s: nothing compared", what);
    /* every moment tensor of the optimizer file belongs to a weight compared */
    T_EXPECT(c.nmoments > 0 && 2 * c.nmoments == c.noptim,
             "%s: %lld moment pairs compared of %lld optimizer tensors", what,
             (long long)c.nmoments, (long long)c.noptim);
    T_EXPECT(c.w <= t.w, "%s: weights differ by %.3g relative (> %.0e)", what, c.w, t.w);
    T_EXPECT(c.m <= t.m, "%s: exp_avg differs by %.3g relative (> %.0e)", what, c.m, t.m);
    T_EXPECT(c.v <= t.v, "%s: exp_avg_sq differs by %.3g relative (> %.0e)", what, c.v, t.v);
    T_EXPECT((long long)c.nout <= max_out && (c.nout == 0 || c.out_max <= 2 * LR * step),
             "%s: %lld element(s) moved apart by > lr/10 (max %.3g; %lld allowed), the first %s: "
             "not a tensor whose exact gradient can be zero, or its moments are above rounding "
             "level",
             what, (long long)c.nout, c.out_max, max_out, c.out_name);
    T_EXPECT(c.noise_max <= 2 * LR * step,
             "%s: a noise-decided element moved apart by %.3g (> 2 lr steps)", what, c.noise_max);
}

static void expect_close_tol(const char *what, const char *ref, const char *got, int step,
                             struct tol t)
{
    expect_close_tol_n(what, ref, got, step, t, 0);
}

static void expect_close(const char *what, const char *ref, const char *got, int step, int ranks)
{
    expect_close_tol(what, ref, got, step, tol_cpu[ranks]);
}

static void expect_identical(const char *what, const char *ref, const char *got)
{
    const struct cmp c = compare(ref, got, STEPS);
    T_EXPECT(c.ntensors > 0 && c.identical, "%s: weights not bit-identical (relative %.3g)", what,
             c.w);
    T_EXPECT(c.noptim > 0 && c.identical_optim,
             "%s: AdamW moments not bit-identical (relative %.3g, %.3g)", what, c.m, c.v);
}

// ---- named training runs -----------------------------------------------------------------------

/* ranks 0: qctrain alone; else mpirun -np ranks. args (NULL-terminated) follow the tiny ones. */
static void cmd_run(struct cmd *c, int ranks, const char *const *args)
{
    if (ranks > 0) {
        cmd_mpirun(c, ranks, NULL);
    } else {
        c->n = 0;
        cmd_add(c, QCTRAIN);
    }
    cmd_train(c);
    for (int i = 0; args[i]; i++)
        cmd_add(c, args[i]);
}

/* The folder of the named run, trained (into tmp_root/name, --out added) the first time it is
 * asked for in this process: the tests share runs. NULL when the run failed. */
static const char *trained(const char *name, int ranks, const char *const *args)
{
    static struct {
        char name[64];
        char dir[400];
        bool ok;
    } done[32];
    static int ndone;
    for (int i = 0; i < ndone; i++)
        if (strcmp(done[i].name, name) == 0)
            return done[i].ok ? done[i].dir : NULL;
    if (ndone == 32)
        T_FATAL("too many runs");
    const int k = ndone++;
    snprintf(done[k].name, sizeof(done[k].name), "%s", name);
    out_dir(done[k].dir, sizeof(done[k].dir), name);
    struct cmd c;
    cmd_run(&c, ranks, args);
    cmd_add(&c, "--out");
    cmd_add(&c, done[k].dir);
    done[k].ok = run(&c, name) == 0;
    T_EXPECT(done[k].ok, "run %s", name);
    return done[k].ok ? done[k].dir : NULL;
}

/* 1 rank x N groups (N 2: plain groups; 3: cost-balanced). */
static const char *ref_run(int N)
{
    static const char *const a2[] = {"--steps", "4",     "--save-every",      "1", "--grad-accum",
                                     "2",       "--set", "data.balance=none", NULL};
    static const char *const a3[] = {"--steps", "4",     "--save-every",      "1", "--grad-accum",
                                     "3",       "--set", "data.balance=cost", NULL};
    return trained(N == 2 ? "ref2" : "ref3", 0, N == 2 ? a2 : a3);
}

/* N ranks x 1 group with ZeRO stage z. */
static const char *dp_run(int N, int z)
{
    static const char *const zs[3] = {"dist.zero_stage=0", "dist.zero_stage=1",
                                      "dist.zero_stage=2"};
    const char *args[] = {"--steps", "4",     "--save-every",
                          "1",       "--set", N == 2 ? "data.balance=none" : "data.balance=cost",
                          "--set",   zs[z],   NULL};
    char name[32];
    snprintf(name, sizeof(name), "np%d-zero%d", N, z);
    return trained(name, N, args);
}

/* The bytes of a file (malloc'd, *len), or NULL. */
static char *read_file(const char *path, size_t *len)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return NULL;
    *len = (size_t)sb.st_size;
    char *buf = malloc(*len + 1);
    FILE *f = fopen(path, "rb");
    const bool ok = buf && f && fread(buf, 1, *len, f) == *len;
    if (f)
        fclose(f);
    if (!ok) {
        free(buf);
        return NULL;
    }
    return buf;
}

// ---- equivalence, determinism, buckets ----------------------------------------------------------

/* N ranks x 1 group (ZeRO stages zmin..zmax) against 1 rank x N groups; the stages after the
 * first give its bytes. */
static void test_equivalence(int N, int zmin, int zmax)
{
    const char *ref = ref_run(N);
    const char *dirs[3] = {NULL, NULL, NULL};
    bool ok = ref != NULL;
    for (int z = zmin; z <= zmax; z++)
        ok = (dirs[z] = dp_run(N, z)) != NULL && ok;
    if (!ok)
        return;
    for (int z = zmin; z <= zmax; z++) {
        char what[96];
        snprintf(what, sizeof(what), "%d ranks x 1 vs 1 rank x %d groups, ZeRO %d", N, N, z);
        expect_close(what, ref, dirs[z], CMP_STEP, N);
        if (z > zmin) {
            snprintf(what, sizeof(what), "%d ranks: ZeRO %d vs ZeRO %d", N, z, zmin);
            expect_identical(what, dirs[zmin], dirs[z]);
        }
    }
    /* the logged losses: one rank x N groups and N ranks x 1 group add the same groups in the
     * same order */
    char la[600], lb[600];
    snprintf(la, sizeof(la), "%s/metrics.jsonl", ref);
    snprintf(lb, sizeof(lb), "%s/metrics.jsonl", dirs[zmin]);
    char *x = slurp(la), *y = slurp(lb);
    const char *px = strstr(x, "\"loss\":"), *py = strstr(y, "\"loss\":");
    T_EXPECT(px && py && strncmp(px, py, 20) == 0, "first step's loss: %.20s vs %.20s",
             px ? px : "-", py ? py : "-");
    T_EXPECT(strstr(y, "\"rank_time_ratio\":") != NULL, "metrics.jsonl has rank_time_ratio");
    free(x);
    free(y);
}

static void test_repeat_and_buckets(void)
{
    const char *z0 = dp_run(2, 0), *z2 = dp_run(2, 2);
    if (!z0 || !z2)
        return;
    /* the same command again, into the same folder: the same bytes */
    char path[2][600];
    char *first[2];
    size_t len[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        snprintf(path[k], sizeof(path[k]), "%s/ckpt-%06d/%s", z0, STEPS,
                 k ? "optim.safetensors" : "model.safetensors");
        first[k] = read_file(path[k], &len[k]);
        T_EXPECT(first[k] != NULL, "read %s", path[k]);
    }
    /* dp_run's command again; the folder holds the first run */
    const char *args[] = {"--steps",           "4",     "--save-every",      "1",     "--set",
                          "data.balance=none", "--set", "dist.zero_stage=0", "--out", z0,
                          "--overwrite",       NULL};
    struct cmd c;
    cmd_run(&c, 2, args);
    T_EXPECT(run(&c, "np2-zero0-again") == 0, "the same 2-rank run again");
    for (int k = 0; k < 2; k++) {
        size_t n2 = 0;
        char *again = read_file(path[k], &n2);
        T_EXPECT(first[k] && again && n2 == len[k] && memcmp(first[k], again, n2) == 0,
                 "two identical 2-rank runs: %s differs", path[k]);
        free(again);
        free(first[k]);
    }
    /* pieces of 4 KiB instead of 8 MiB (one piece per model part): the same bits */
    const char *a4k[] = {"--steps", "4",
                         "--set",   "data.balance=none",
                         "--set",   "dist.zero_stage=2",
                         "--set",   "dist.bucket_bytes=4KiB",
                         NULL};
    const char *k4 = trained("np2-zero2-4k", 2, a4k);
    if (k4)
        expect_identical("2 ranks, ZeRO 2: 4 KiB pieces vs 8 MiB", z2, k4);
}

// ---- under a device budget ----------------------------------------------------------------------

/* Rank 0's metrics.jsonl of run dir: sums of "key" over the steps, and the largest
 * peak_device_bytes. */
static double metric_sum(const char *dir, const char *key, double *peak)
{
    char p[600], k[64];
    snprintf(p, sizeof(p), "%s/metrics.jsonl", dir);
    snprintf(k, sizeof(k), "\"%s\":", key);
    char *s = slurp(p);
    double sum = 0;
    *peak = 0;
    for (const char *q = s; (q = strstr(q, k)) != NULL; q += strlen(k))
        sum += strtod(q + strlen(k), NULL);
    for (const char *q = s; (q = strstr(q, "\"peak_device_bytes\":")) != NULL; q++) {
        const double v = strtod(q + strlen("\"peak_device_bytes\":"), NULL);
        *peak = v > *peak ? v : *peak;
    }
    free(s);
    return sum;
}

static void test_budget(void)
{
    /* batch 1 under 96 MiB (unconstrained steps peak at 115-143 MiB, the smallest plans at
     * 30-40 MiB), every rank's group of step 2 running out after its first reported range. Not
     * lower: at 64 MiB a CI run failed when the small pool's fragmentation (33 of 62 MiB
     * reserved) ran a 72-agent scene out four times and the raised margin (37.5 %) left no
     * plan of it under the budget; at 96 MiB even the largest margin (50 %) holds every
     * scene's smallest plan (src/plan/README.md on fragmentation at this model's sizes). */
    const char *z0 = dp_run(2, 0);
    const char *a[] = {"--steps", "4",
                       "--set",   "data.balance=none",
                       "--set",   "dist.zero_stage=0",
                       "--set",   "device.budget=96MiB",
                       NULL};
    setenv("QC_FAULT_OOM_AFTER_REPORT", "2", 1);
    const char *b96 = trained("np2-budget96", 2, a);
    unsetenv("QC_FAULT_OOM_AFTER_REPORT");
    if (z0 && b96) {
        expect_identical("2 ranks: 96 MiB budget with an OOM after a reported range vs none", z0,
                         b96);
        double peak = 0;
        const double moved = metric_sum(b96, "recompute_bytes", &peak) +
                             metric_sum(b96, "offload_host_bytes", &peak);
        const double replans = metric_sum(b96, "replans", &peak);
        printf("  budget 96 MiB: rank 0 moved %.0f stash bytes, %.0f re-plans, peak %.0f B\n",
               moved, replans, peak);
        T_EXPECT(moved > 0, "the planner recomputed or offloaded nothing under 96 MiB");
        T_EXPECT(replans >= 1, "the injected OOM was not rolled back and re-planned");
        T_EXPECT(peak > 0 && peak <= 96.0 * 1048576, "peak %.0f B over the budget", peak);
    }
    /* groups of 4 scenes under 90 MiB: split into 2 + 2 (each half's smallest plan is 54-70
     * MiB), the first part's reports held, the injected OOM rolling back the last part. (At 100
     * MiB, since edge modes are no longer chosen by a plan that fits only with nothing fetched
     * ahead, the groups ran unsplit: 2026-12-06.) (Budgets near one scene's smallest plan are not
     * used here: at this tiny model's sizes most tensors sit in the allocator's small pool, whose
     * fragmentation can fail a scene at 1.5x its smallest plan: src/plan/README.md.) */
    const char *r[] = {"--steps",
                       "4",
                       "--save-every",
                       "1",
                       "--grad-accum",
                       "2",
                       "--set",
                       "data.balance=none",
                       "--set",
                       "train.batch_size=4",
                       "--set",
                       "model.dropout=0",
                       NULL};
    const char *ref = trained("ref2-b4", 0, r);
    const char *s[] = {"--steps",
                       "4",
                       "--save-every",
                       "1",
                       "--set",
                       "data.balance=none",
                       "--set",
                       "train.batch_size=4",
                       "--set",
                       "model.dropout=0",
                       "--set",
                       "device.budget=90MiB",
                       NULL};
    setenv("QC_FAULT_OOM_AFTER_REPORT", "2", 1);
    const char *split = trained("np2-budget90-split", 2, s);
    unsetenv("QC_FAULT_OOM_AFTER_REPORT");
    if (ref && split) {
        const bool rows_exact = kt_gemm_rows_exact(16) && kt_gemm_rows_exact(64);
        if (!rows_exact)
            printf("  this CPU's GEMM gives a row other bits in a GEMM of another row count: the "
                   "split group's bounds for such a BLAS\n");
        expect_close_tol_n("2 ranks x 1 split group under 90 MiB vs 1 rank x 2 groups", ref, split,
                           CMP_STEP, rows_exact ? tol_split : tol_split_rows,
                           rows_exact ? 0 : SPLIT_ROWS_OUTLIERS);
        double peak = 0;
        const double splits = metric_sum(split, "splits", &peak);
        const double replans = metric_sum(split, "replans", &peak);
        printf("  budget 90 MiB, groups of 4: rank 0 split %.0f times, %.0f re-plans, peak %.0f "
               "B\n",
               splits, replans, peak);
        T_EXPECT(splits >= 1, "no group was split under 90 MiB");
        T_EXPECT(replans >= 1, "the injected OOM was not rolled back and re-planned");
        T_EXPECT(peak > 0 && peak <= 90.0 * 1048576, "peak %.0f B over the budget", peak);
    }
}

// ---- resume across world sizes ------------------------------------------------------------------

static void test_resume_across_world_sizes(void)
{
    const char *full2 = dp_run(2, 0), *full1 = ref_run(2);
    struct cmd c;
    /* 2 ranks for 2 steps, then 1 rank x 2 groups to step 4 */
    const char *h2[] = {"--steps", "2", "--set", "data.balance=none", NULL};
    const char *a = trained("res-2to1", 2, h2);
    if (a && full2) {
        const char *r[] = {"--steps", "4", "--grad-accum", "2", "--resume", a, NULL};
        cmd_run(&c, 0, r);
        T_EXPECT(run(&c, "res-2to1-b") == 0, "resumed on 1 rank x 2 groups");
        expect_close("2 ranks -> resumed on 1 rank x 2 groups vs 2 ranks throughout", full2, a,
                     STEPS, 2);
    }
    /* 1 rank x 2 groups for 2 steps, then 2 ranks with ZeRO 1 to step 4 */
    const char *h1[] = {"--steps", "2", "--grad-accum", "2", "--set", "data.balance=none", NULL};
    const char *b = trained("res-1to2", 0, h1);
    if (b && full1) {
        const char *r[] = {"--steps", "4", "--set", "dist.zero_stage=1", "--resume", b, NULL};
        cmd_run(&c, 2, r);
        T_EXPECT(run(&c, "res-1to2-b") == 0, "resumed on 2 ranks, ZeRO 1");
        expect_close("1 rank x 2 groups -> resumed on 2 ranks (ZeRO 1) vs 1 rank throughout", full1,
                     b, STEPS, 2);
    }
    /* ranks x groups must stay equal: 1 rank x 1 group cannot resume a 2-group run (without
     * --grad-accum the resume keeps the run's 2 groups) */
    if (b) {
        const char *r[] = {"--steps", "5", "--grad-accum", "1", "--resume", b, NULL};
        cmd_run(&c, 0, r);
        char log[512];
        snprintf(log, sizeof(log), "%s/res-bad.log", tmp_root);
        const int rc = wait_for(spawn(&c, log), 120);
        char *s = slurp(log);
        T_EXPECT(rc == 2, "resume with other groups per step: exit %d", rc);
        T_EXPECT_STR_CONTAINS(s, "groups per step");
        free(s);
    }
}

// ---- failures -----------------------------------------------------------------------------------

/* The pid of rank `rank` of the runs of this test process (QC_TEST_TAG in its environment), or
 * -1. */
static pid_t find_rank(int rank)
{
    char want_tag[96], want_rank[64];
    snprintf(want_tag, sizeof(want_tag), "QC_TEST_TAG=%s", tag);
    snprintf(want_rank, sizeof(want_rank), "OMPI_COMM_WORLD_RANK=%d", rank);
    const char *env[2] = {want_tag, want_rank};
    return t_find_process(-1, "qctrain", env, 2);
}

/* Waits until RUN/metrics.jsonl shows a step (the ranks are training). */
static bool wait_training(const char *dir, double limit_s)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/metrics.jsonl", dir);
    const double t0 = now_s();
    while (now_s() - t0 < limit_s) {
        char *s = slurp(p);
        const bool ok = strstr(s, "\"step\":1,") != NULL;
        free(s);
        if (ok)
            return true;
        usleep(100000);
    }
    return false;
}

/* Starts 3 ranks for many steps (dist.timeout 3 s), hits rank 1 with sig once training, and
 * checks how the job ends. launcher_aborts: mpirun kills the job when a process dies (its
 * default; off: it waits, as srun without --kill-on-bad-exit does). ours: the survivors' watchdog
 * names the rank (else mpirun's message does). */
static void test_rank_failure(int sig, bool launcher_aborts, bool ours, const char *name)
{
    char dir[400], log[512];
    out_dir(dir, sizeof(dir), name);
    snprintf(log, sizeof(log), "%s/%s.log", tmp_root, name);
    const char *keep_going[] = {"--mca", "orte_abort_on_non_zero_status", "0", NULL};
    struct cmd c;
    cmd_mpirun(&c, 3, launcher_aborts ? NULL : keep_going);
    cmd_train(&c);
    const char *t[] = {"--steps", "1000", "--set", "dist.timeout=3", "--out", dir};
    for (size_t k = 0; k < 6; k++)
        cmd_add(&c, t[k]);
    const pid_t job = spawn(&c, log);
    const bool training = wait_training(dir, 120);
    T_EXPECT(training, "%s: the ranks never reached step 1", name);
    const pid_t victim = training ? find_rank(1) : -1;
    T_EXPECT(victim > 0, "%s: rank 1's process not found", name);
    if (victim > 0)
        kill(victim, sig);
    /* the job must end on its own: within dist.timeout plus start-up slack, never hang */
    const double t0 = now_s();
    const int rc = wait_for(job, 90);
    const double took = now_s() - t0;
    if (victim > 0 && sig == SIGSTOP)
        kill(victim, SIGKILL); /* mpirun kills it too; make sure */
    char *s = slurp(log);
    printf("  %s: the job ended %.1f s after the signal, exit %d\n", name, took, rc);
    T_EXPECT(rc != -1, "%s: the job hung (killed after 90 s)\n%s", name, s);
    T_EXPECT(rc != 0, "%s: mpirun exited 0", name);
    if (!ours) {
        T_EXPECT(strstr(s, "rank 1") != NULL, "%s: no message names rank 1:\n%s", name, s);
    } else {
        T_EXPECT(strstr(s, "dist: rank 1 (pid") != NULL && strstr(s, "went away") != NULL,
                 "%s: no 'dist: rank 1 ... went away' error:\n%s", name, s);
        T_EXPECT(strstr(s, "dist.timeout") != NULL, "%s: the message names dist.timeout", name);
    }
    free(s);
}

// ---- start-up errors and the 8-rank preset ------------------------------------------------------

static void test_config_mismatch(void)
{
    char dir[400];
    out_dir(dir, sizeof(dir), "mismatch");
    struct cmd c;
    cmd_mpirun(&c, 1, NULL);
    cmd_train(&c);
    const char *t[] = {"--steps", "2", "--out", dir, ":", "-np", "1", QCTRAIN};
    for (size_t k = 0; k < 8; k++)
        cmd_add(&c, t[k]);
    cmd_train(&c);
    const char *t2[] = {"--steps", "2", "--out", dir, "--set", "train.lr=1e-3"};
    for (size_t k = 0; k < 6; k++)
        cmd_add(&c, t2[k]);
    char log[512];
    snprintf(log, sizeof(log), "%s/mismatch.log", tmp_root);
    const int rc = wait_for(spawn(&c, log), 120);
    char *s = slurp(log);
    T_EXPECT(rc != 0 && rc != -1, "config mismatch: exit %d", rc);
    T_EXPECT_STR_CONTAINS(s, "train.lr is 0.001 on rank 1, 0.002 on rank 0");
    free(s);

    /* dist.world_size against the launch */
    cmd_mpirun(&c, 2, NULL);
    cmd_train(&c);
    const char *t3[] = {"--steps", "2", "--out", dir, "--set", "dist.world_size=3"};
    for (size_t k = 0; k < 6; k++)
        cmd_add(&c, t3[k]);
    snprintf(log, sizeof(log), "%s/worldsize.log", tmp_root);
    const int rc2 = wait_for(spawn(&c, log), 120);
    s = slurp(log);
    T_EXPECT(rc2 != 0 && rc2 != -1, "world size mismatch: exit %d", rc2);
    T_EXPECT_STR_CONTAINS(s, "dist.world_size is 3 but mpirun started 2 ranks");
    free(s);
}

static void test_rtx3090x8(void)
{
    char dir[400];
    out_dir(dir, sizeof(dir), "rtx3090x8");
    struct cmd c;
    cmd_mpirun(&c, 8, NULL);
    cmd_add(&c, "train");
    /* the preset (8 ranks, ZeRO 1, cuda) with the tiny model on the CPU backend */
    const char *t[] = {"--preset", "rtx3090x8",
                       "--device", "cpu",
                       "--set",    "device.budget=0",
                       "--set",    "model.hidden_dim=32",
                       "--set",    "model.num_heads=2",
                       "--set",    "model.head_dim=16",
                       "--set",    "model.num_freq_bands=8",
                       "--set",    "data.synthetic_scenes=8"};
    for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++)
        cmd_add(&c, t[k]);
    for (int i = 2; i < T_TINY_TRAIN_NARGS;
         i++) /* t_tiny_train_args without "--preset cpu-smoke" */
        cmd_add(&c, t_tiny_train_args[i]);
    const char *t2[] = {"--steps", "1", "--out", dir};
    for (size_t k = 0; k < 4; k++)
        cmd_add(&c, t2[k]);
    T_EXPECT(run(&c, "rtx3090x8") == 0, "8 ranks of the rtx3090x8 preset");
    char p[600];
    snprintf(p, sizeof(p), "%s/metrics.jsonl", dir);
    char *s = slurp(p);
    T_EXPECT(strstr(s, "\"ranks\":8,") != NULL && strstr(s, "\"samples\":8,") != NULL,
             "one step of 8 ranks x 1 scene: %s", s);
    free(s);
    snprintf(p, sizeof(p), "%s/memory.json", dir);
    s = slurp(p);
    T_EXPECT(strstr(s, "\"world_size\": 8") && strstr(s, "\"zero_stage\": 1"),
             "memory.json's per-rank section");
    free(s);
    snprintf(p, sizeof(p), "%s/ckpt-000001/optim.safetensors", dir);
    struct stat sb;
    T_EXPECT(stat(p, &sb) == 0, "rank 0 wrote the checkpoint (moments gathered)");
}

// ---- NCCL (GPU)
// ------------------------------------------------------------------------------------

/* Two ranks on two GPUs (main has checked that there are two). */
static void test_nccl(int ngpu)
{
    const char *ref_args[] = {"--device", "cuda",         "--steps", "4",     "--save-every",
                              "1",        "--grad-accum", "2",       "--set", "data.balance=none",
                              NULL};
    const char *ref = trained("cuda-ref2", 0, ref_args);
    if (!ref)
        return;
    for (int z = 0; z < 3; z++) {
        char zs[32], name[32], dir[400], log[512];
        snprintf(zs, sizeof(zs), "dist.zero_stage=%d", z);
        snprintf(name, sizeof(name), "cuda-np2-zero%d", z);
        out_dir(dir, sizeof(dir), name);
        const char *args[] = {"--device",
                              "cuda",
                              "--steps",
                              "4",
                              "--save-every",
                              "1",
                              "--set",
                              "data.balance=none",
                              "--set",
                              zs,
                              "--out",
                              dir,
                              NULL};
        struct cmd c;
        cmd_run(&c, 2, args);
        snprintf(log, sizeof(log), "%s/%s.log", tmp_root, name);
        const int rc = wait_for(spawn(&c, log), 600);
        char *s = slurp(log);
        T_EXPECT(rc == 0, "2 ranks on cuda (%d GPU(s)), ZeRO %d: exit %d\n%s", ngpu, z, rc, s);
        free(s);
        if (rc != 0)
            return;
        char what[96];
        snprintf(what, sizeof(what), "NCCL, %d GPU(s): 2 ranks x 1 vs 1 rank x 2 groups, ZeRO %d",
                 ngpu, z);
        expect_close_tol(what, ref, dir, CMP_STEP, tol_nccl);
    }
}

int main(int argc, char **argv)
{
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/qctrain-test-dist-%d", (int)getpid());
    t_rm_rf(tmp_root);
    mkdir(tmp_root, 0755);
    snprintf(tag, sizeof(tag), "dist-%d", (int)getpid());
    setenv("QC_TEST_TAG", tag, 1);
    t_dist_mpi_env();
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
        const int probe = qc_test_cuda_probe(); /* skip only without a GPU; fail on a broken one */
        if (probe != 0) {
            t_rm_rf(tmp_root);
            return probe;
        }
        int ngpu = 0;
        (void)qc_device_cuda_probe(&ngpu);
        QC_TEST ("dist: NCCL: 2 ranks x 1 group == 1 rank x 2 groups on cuda, ZeRO 0/1/2") {
            if (ngpu < 2)
                T_SKIP("one GPU: NCCL refuses two ranks on one GPU (\"Duplicate GPU\"); this test "
                       "needs 2 (test_dist_nccl runs the NCCL code in one process)");
            else
                test_nccl(ngpu);
        }
        t_rm_rf(tmp_root);
        return qc_test_summary();
    }
    /* the small case (its own ctest entry, test_dist_mpi_small, which the sanitized builds run) */
    QC_TEST ("dist (small): 2 ranks x 1 group == 1 rank x 2 groups under ZeRO 2, weights and "
             "AdamW moments") {
        test_equivalence(2, 2, 2);
    }
    QC_TEST ("dist: 2 ranks x 1 group == 1 rank x 2 groups, ZeRO 0/1/2") {
        test_equivalence(2, 0, 2);
    }
    QC_TEST ("dist: 3 ranks x 1 group == 1 rank x 3 groups, ZeRO 0/1/2 (cost-balanced groups)") {
        test_equivalence(3, 0, 2);
    }
    QC_TEST ("dist: identical runs give identical bytes, whatever dist.bucket_bytes") {
        test_repeat_and_buckets();
    }
    QC_TEST ("dist: resume across world sizes (2 -> 1 x 2 groups, 1 x 2 groups -> 2 with ZeRO 1)") {
        test_resume_across_world_sizes();
    }
    QC_TEST ("dist: a rank killed (kill -9) stops the job within dist.timeout, naming it") {
        test_rank_failure(SIGKILL, false, true, "kill9");
    }
    QC_TEST ("dist: a rank stopped (SIGSTOP) stops the job within dist.timeout, naming it") {
        test_rank_failure(SIGSTOP, true, true, "sigstop");
    }
    QC_TEST ("dist: with mpirun's own abort, a killed rank ends the job non-zero, named") {
        test_rank_failure(SIGKILL, true, false, "kill9-mpirun");
    }
    QC_TEST ("dist: configuration and world size mismatches are refused at start-up") {
        test_config_mismatch();
    }
    QC_TEST ("dist: the rtx3090x8 preset runs 8 ranks when launched with 8") {
        test_rtx3090x8();
    }
    QC_TEST ("dist: under device.budget every rank plans its own groups; rollbacks after reported "
             "ranges and split groups keep the result") {
        test_budget();
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
