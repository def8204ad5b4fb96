/*
 * test_train_memory.c — the memory system in the training step (src/train/memory/stepmem.c,
 * train_internal.h "The step's memory"), through the trainer (qc_train.h), on a tiny model
 * (cpu-smoke's sizes, small radii), 3 steps unless said:
 *   - policy invariance, bit for bit, on the CPU and the emulated device, fused and unfused:
 *     plan.policy=keep, offload to the host tier, offload to the NVMe tier (a folder of the
 *     build tree), recompute, and seeded random per-block mixes (qc_trainer_set_plan_hook) give
 *     the same checkpoint bytes (the optimizer file's tensors: its metadata holds the config)
 *     and losses, and the metrics count the bytes each policy moved;
 *   - budgets from unlimited down to the minimum plan (1 scene per group, so nothing can be
 *     split): every run that fits gives the unlimited run's checkpoint bytes, every step's
 *     peak is at or under the budget and the predicted peak is within PLAN_ERR (3 %; the docs
 *     state 5 %) of the measured one (a step that re-planned excepted: its peak mixes two
 *     plans), the unlimited run's steps exactly; the first budget under the minimum plan fails
 *     with the error naming the scene, its edge counts and the bytes it needs;
 *     --skip-oversized skips it instead, counted;
 *   - admission control: a batch of 2 under a budget only 1 scene fits runs as 1 + 1 (counted)
 *     and its losses and gradients equal the unsplit step's within fp32 tolerance (dropout 0:
 *     with dropout the moved scene draws other masks);
 *   - an OOM injected at the k-th allocation of the first group and of the second (gradients
 *     restored from the host copy) is rolled back, re-planned (counted) and gives the bits of
 *     a run that never ran out (cpu and emu);
 *   - a whole epoch of `mixed` scenes under a budget that fits the median batch kept whole but
 *     not the tail finishes with no failed step, every step under the budget;
 *   - NVMe faults inside a step (a read error, a flipped byte on disk): the block is recomputed
 *     from its inputs, counted, and the checkpoint equals the kept run's;
 *   - the trainer's threads together, small enough for ThreadSanitizer (ctest's
 *     test_train_memory_tsan, label tsan): on the emulated device, loader threads, the copy
 *     streams, the offload engine's prefetch to and from the host and NVMe tiers and recompute
 *     in one run whose random per-block mix gives the kept run's bytes.
 * `test_train_memory cuda` (label gpu): the invariance on CUDA; exit 77 only where
 * tests/cuda_probe.h says there is no GPU (a CPU-only build, no device, no driver), a GPU that
 * cannot be used fails. The EMU runs use emulated device 1, so the loader's workers must pin
 * there.
 */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_testlib.h"
#include "cuda_probe.h"
#include "qc_config.h"
#include "qc_device.h"
#include "qc_memctx.h"
#include "qc_offload.h"
#include "qc_plan.h"
#include "qc_qcnet.h"
#include "qc_train.h"
#include "qc_trainer_test.h"
#include "testutil.h"

static char tmp_root[256];

/* The planner's accuracy as gated: a predicted peak within 3 % of the measured one (the docs
 * promise 5 %). Measured on the CPU: 0.0 % on every step that did not re-plan, at every budget
 * (the dry run replays every block's memory spec, src/plan/README.md). */
#define PLAN_ERR 0.03

static void tmp_dir(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmp_root, name);
    t_rm_rf(out);
}

/* cpu-smoke's model, small radii (few edges, the same code paths), batches of `batch` scenes,
 * 1 group per step, 6 synthetic scenes per epoch, 3 steps. */
static void tiny_config(struct qc_config *cfg, int64_t device, bool fused, int64_t batch)
{
    t_small_smoke_config(cfg);
    cfg->device_kind = device;
    /* EMU runs on emulated device 1: the loader's worker threads must pin its batches there,
     * not on device 0 (the emulated registration refuses another device) */
    cfg->device_ordinal = device == QC_CONFIG_DEVICE_EMU ? 1 : 0;
    cfg->attention = fused ? QC_ATTENTION_FUSED : QC_ATTENTION_UNFUSED;
    cfg->batch_size = batch;
    cfg->grad_accum = 1;
    cfg->synthetic_scenes = 6;
    cfg->steps = 3;
    cfg->save_every = 0;
    cfg->loader_threads = 1;
    cfg->prefetch_batches = 2;
    cfg->offload_host_capacity = (uint64_t)512 << 20;
    cfg->offload_nvme_capacity = (uint64_t)512 << 20;
    cfg->offload_block_size = (uint64_t)64 << 10;
}

static void set_nvme(struct qc_config *cfg)
{
    snprintf(cfg->offload_nvme_dir, sizeof cfg->offload_nvme_dir, "%s/nvme", tmp_root);
    mkdir(cfg->offload_nvme_dir, 0700);
}

// ---- runs and their results --------------------------------------------------------------------

#define MAX_STEPS 16

/* One metrics.jsonl line's figures. */
struct step_m {
    double loss, rp, rr, cls;
    double peak, active, reserved, predicted, host, nvme, recompute, replans, splits, skipped;
};

struct run {
    enum qc_status st;
    char err[2048];
    int nsteps;
    struct step_m m[MAX_STEPS];
    int64_t nparams;
    float *grads;                       /* the last step's gradients (CPU runs), when asked */
    int64_t beside_made, beside_differ; /* qc_trainer_plans_beside after the run */
    int64_t ahead_admitted, ahead_cal, ahead_differ; /* qc_trainer_plans_ahead after the run */
    int64_t parts_kept, parts_differ;                /* qc_trainer_parts_admitted */
};

static double field(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? strtod(p + strlen(k), NULL) : (double)NAN;
}

static void read_metrics(const char *dir, struct run *r)
{
    char path[512], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    r->nsteps = 0;
    while (f && fgets(line, sizeof line, f) && r->nsteps < MAX_STEPS) {
        if (!strstr(line, "\"loss\":"))
            continue;
        struct step_m *m = &r->m[r->nsteps++];
        m->loss = field(line, "loss");
        m->rp = field(line, "reg_loss_propose");
        m->rr = field(line, "reg_loss_refine");
        m->cls = field(line, "cls_loss");
        m->peak = field(line, "peak_device_bytes");
        m->active = field(line, "peak_active_bytes");
        m->reserved = field(line, "reserved_bytes");
        m->predicted = field(line, "predicted_peak_bytes");
        m->host = field(line, "offload_host_bytes");
        m->nvme = field(line, "offload_nvme_bytes");
        m->recompute = field(line, "recompute_bytes");
        m->replans = field(line, "replans");
        m->splits = field(line, "splits");
        m->skipped = field(line, "skipped_scenes");
    }
    if (f)
        fclose(f);
}

/* What a run does besides training: a plan hook, an injected OOM, an NVMe fault. */
struct extra {
    void (*hook)(void *user, const struct qc_plan_program *prog, uint8_t *policy);
    void *hook_user;
    int64_t fail_at;       /* the k-th allocation of the first step fails (0: none) */
    int64_t fail_in_group; /* ... of this group of the first step (0: the first) */
    enum qc_offload_fault fault;
    enum qc_offload_fault_op fault_op;
    bool keep_grads;
    bool skip_oversized;
    bool check_beside; /* every plan made beside admission also made on the trainer's thread */
};

/* Arms the injected OOM when the second group starts (its first allocation's tag seen again). */
struct arm {
    struct qc_memctx *mc;
    char first[128];
    int64_t seen;
    int64_t k;
    int64_t group;
    bool armed;
};

static void arm_observer(void *user, const char *tag, enum qc_mem_class cls, size_t bytes,
                         bool alloc)
{
    (void)cls;
    (void)bytes;
    struct arm *a = user;
    if (!alloc || !tag || cls != QC_MEM_MODEL || a->armed)
        return;
    if (!a->first[0])
        snprintf(a->first, sizeof a->first, "%s", tag);
    else if (strcmp(tag, a->first) == 0 && ++a->seen == a->group) {
        qc_memctx_fail_at(a->mc, a->k, 1);
        a->armed = true;
    }
}

static void run_train(const struct qc_config *cfg, const char *dir, const struct extra *x,
                      struct run *r)
{
    memset(r, 0, sizeof *r);
    const struct qc_train_opts to = {
        .cfg = cfg, .out_dir = dir, .quiet = true, .skip_oversized = x && x->skip_oversized};
    struct qc_trainer *t = NULL;
    struct arm arm = {0};
    r->st = qc_trainer_create(&to, &t);
    if (r->st == QC_OK && x) {
        if (x->hook)
            qc_trainer_set_plan_hook(t, x->hook, x->hook_user);
        if (x->fail_at > 0 && x->fail_in_group == 0)
            qc_memctx_fail_at(qc_trainer_memctx(t), x->fail_at, 1);
        if (x->fail_at > 0 && x->fail_in_group > 0) {
            arm.mc = qc_trainer_memctx(t);
            arm.k = x->fail_at;
            arm.group = x->fail_in_group;
            qc_memctx_set_observer(arm.mc, arm_observer, &arm);
        }
        if (x->check_beside &&
            qc_trainer_plans_beside(t, true, &r->beside_made, &r->beside_differ) != QC_OK)
            T_FATAL("the planning helper: %s", qc_error_last());
        if (x->fault != QC_OFFLOAD_FAULT_NONE) {
            struct qc_offload *o = qc_trainer_offload(t);
            if (!o)
                T_FATAL("the run has no offload engine");
            qc_offload_fault_set(o, x->fault, x->fault_op, 3);
        }
    }
    if (r->st == QC_OK)
        r->st = qc_trainer_run(t);
    if (r->st != QC_OK)
        snprintf(r->err, sizeof r->err, "%s", qc_error_last());
    if (t && x && x->check_beside) {
        T_EXPECT(qc_trainer_plans_beside(t, false, &r->beside_made, &r->beside_differ) == QC_OK,
                 "%s", qc_error_last());
        qc_trainer_plans_ahead(t, &r->ahead_admitted, &r->ahead_cal, &r->ahead_differ);
        qc_trainer_parts_admitted(t, &r->parts_kept, &r->parts_differ);
    }
    if (r->st == QC_OK && x && x->fault != QC_OFFLOAD_FAULT_NONE)
        T_EXPECT(qc_offload_fault_fired(qc_trainer_offload(t)), "the NVMe fault fired");
    if (r->st == QC_OK && x && x->fail_in_group > 0)
        T_EXPECT(arm.armed, "the OOM was armed in group %" PRId64, x->fail_in_group);
    if (r->st == QC_OK && x && x->keep_grads) {
        struct qc_qcnet *m = qc_trainer_model(t);
        r->nparams = qc_qcnet_num_params(m);
        r->grads = malloc((size_t)r->nparams * sizeof(float));
        if (!r->grads || qc_qcnet_grads_download(m, r->grads) != QC_OK)
            T_FATAL("gradients: %s", qc_error_last());
    }
    qc_trainer_destroy(t);
    read_metrics(dir, r);
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* The tensor bytes of a safetensors file (after its header, whose metadata holds the run's
 * configuration in optim.safetensors: plan.policy and offload.* differ between the runs). */
static const unsigned char *tensor_bytes(const unsigned char *f, size_t n, size_t *len)
{
    uint64_t h = 0;
    if (n < 8)
        return NULL;
    for (int i = 7; i >= 0; i--)
        h = h << 8 | f[i];
    if (h > n - 8)
        return NULL;
    *len = n - 8 - (size_t)h;
    return f + 8 + h;
}

/* The last checkpoint's model file and optimizer tensors of dirs a and b are the same bytes. */
static bool same_checkpoint(const char *a, const char *b, int64_t steps)
{
    bool same = true;
    const char *files[] = {"model.safetensors", "optim.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/ckpt-%06" PRId64 "/%s", a, steps, files[i]);
        snprintf(pb, sizeof pb, "%s/ckpt-%06" PRId64 "/%s", b, steps, files[i]);
        size_t na = 0, nb = 0, la = 0, lb = 0;
        unsigned char *x = slurp(pa, &na), *y = slurp(pb, &nb);
        const unsigned char *tx = x ? (i == 0 ? (la = na, x) : tensor_bytes(x, na, &la)) : NULL;
        const unsigned char *ty = y ? (i == 0 ? (lb = nb, y) : tensor_bytes(y, nb, &lb)) : NULL;
        if (!tx || !ty || la != lb || memcmp(tx, ty, la) != 0) {
            printf("  %s differs from %s\n", pb, pa);
            same = false;
        }
        free(x);
        free(y);
    }
    return same;
}

static bool same_losses(const struct run *a, const struct run *b)
{
    if (a->nsteps != b->nsteps)
        return false;
    for (int i = 0; i < a->nsteps; i++)
        if (a->m[i].loss != b->m[i].loss || a->m[i].rp != b->m[i].rp || a->m[i].rr != b->m[i].rr ||
            a->m[i].cls != b->m[i].cls)
            return false;
    return true;
}

static double sum_field(const struct run *r, size_t off)
{
    double s = 0;
    for (int i = 0; i < r->nsteps; i++)
        s += *(const double *)((const char *)&r->m[i] + off);
    return s;
}
#define SUM(r, f) sum_field((r), offsetof(struct step_m, f))

// ---- invariance ------------------------------------------------------------------------------

/* Seeded random policies per block application. */
struct mix {
    uint64_t rng;
    bool nvme;
};

static void mix_hook(void *user, const struct qc_plan_program *prog, uint8_t *policy)
{
    struct mix *x = user;
    for (int32_t b = 0; b < prog->nblocks; b++) {
        const uint64_t v = qc_test_rand(&x->rng) % 4;
        policy[b] = (uint8_t)(v == QC_POLICY_OFFLOAD_NVME && !x->nvme ? QC_POLICY_KEEP : v);
    }
}

static void test_invariance(int64_t device, bool fused)
{
    const char *dev = device == QC_CONFIG_DEVICE_CPU    ? "cpu"
                      : device == QC_CONFIG_DEVICE_CUDA ? "cuda"
                                                        : "emu";
    char name[160];
    snprintf(name, sizeof name,
             "train memory: keep, offload host/NVMe, recompute and random mixes give the same "
             "checkpoint bytes (%s, %s)",
             dev, fused ? "fused" : "unfused");
    QC_TEST (name) {
        struct qc_config cfg;
        tiny_config(&cfg, device, fused, 2);
        char ref[512];
        snprintf(ref, sizeof ref, "%s/inv-%s-%d-keep", tmp_root, dev, fused);
        t_rm_rf(ref);
        cfg.plan_policy = QC_PLAN_KEEP;
        struct run rk;
        run_train(&cfg, ref, NULL, &rk);
        T_EXPECT(rk.st == QC_OK && rk.nsteps == 3, "keep: %s", rk.err);
        T_EXPECT(SUM(&rk, host) + SUM(&rk, nvme) + SUM(&rk, recompute) == 0, "keep moves nothing");
        struct {
            const char *name;
            enum qc_plan_policy policy;
            enum qc_placement place;
            bool mix;
        } cases[] = {
            {"host", QC_PLAN_OFFLOAD, QC_PLACE_HOST, false},
            {"nvme", QC_PLAN_OFFLOAD, QC_PLACE_NVME, false},
            {"recompute", QC_PLAN_RECOMPUTE, QC_PLACE_AUTO, false},
            {"mix", QC_PLAN_OFFLOAD, QC_PLACE_AUTO, true},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            struct qc_config cc = cfg;
            cc.plan_policy = cases[c].policy;
            cc.offload_placement = cases[c].place;
            if (cases[c].place != QC_PLACE_HOST)
                set_nvme(&cc);
            char dir[512];
            snprintf(dir, sizeof dir, "%s/inv-%s-%d-%s", tmp_root, dev, fused, cases[c].name);
            t_rm_rf(dir);
            struct mix mx = {.rng = qc_test_seed() + c, .nvme = cc.offload_nvme_dir[0] != 0};
            struct extra x = {.hook = cases[c].mix ? mix_hook : NULL, .hook_user = &mx};
            struct run r;
            run_train(&cc, dir, &x, &r);
            T_EXPECT(r.st == QC_OK && r.nsteps == 3, "%s: %s", cases[c].name, r.err);
            if (r.st != QC_OK)
                continue;
            T_EXPECT(same_checkpoint(ref, dir, 3), "%s: checkpoint bytes equal keep's",
                     cases[c].name);
            T_EXPECT(same_losses(&rk, &r), "%s: losses equal keep's", cases[c].name);
            const double host = SUM(&r, host), nvme = SUM(&r, nvme), rec = SUM(&r, recompute);
            if (c == 0)
                T_EXPECT(host > 0 && nvme == 0 && rec == 0, "host: %g %g %g", host, nvme, rec);
            if (c == 1)
                T_EXPECT(nvme > 0 && host == 0 && rec == 0, "nvme: %g %g %g", host, nvme, rec);
            if (c == 2)
                T_EXPECT(rec > 0 && host == 0 && nvme == 0, "recompute: %g %g %g", host, nvme, rec);
            if (c == 3)
                T_EXPECT(host > 0 && rec > 0 && nvme > 0, "mix: %g %g %g", host, nvme, rec);
            t_rm_rf(dir);
        }
        t_rm_rf(ref);
    }
}

// ---- budgets -----------------------------------------------------------------------------------

static double max_active(const struct run *r)
{
    double p = 0;
    for (int i = 0; i < r->nsteps; i++)
        p = fmax(p, r->m[i].active);
    return p;
}

static void test_budgets(void)
{
    QC_TEST ("train memory: budgets down to the minimum plan: same bits, peaks under the "
             "budget, predicted within 3 %; under it, the scene that never fits is named") {
        struct qc_config cfg;
        tiny_config(&cfg, QC_CONFIG_DEVICE_CPU, true, 1);
        char ref[512];
        tmp_dir(ref, sizeof ref, "budget-unlimited");
        struct run r0;
        run_train(&cfg, ref, NULL, &r0);
        T_EXPECT(r0.st == QC_OK && r0.nsteps == 3, "unlimited: %s", r0.err);
        if (r0.st != QC_OK)
            continue;
        /* unlimited: everything kept, the dry run's program is the step's allocations */
        for (int s = 0; s < r0.nsteps; s++)
            T_EXPECT(r0.m[s].predicted == r0.m[s].active && r0.m[s].replans == 0,
                     "unlimited step %d: predicted %g vs measured %g", s + 1, r0.m[s].predicted,
                     r0.m[s].active);
        const double p0 = max_active(&r0);
        int fitted = 0, moved = 0, compared = 0;
        bool floor_found = false;
        double budget = p0;
        for (int i = 0; i < 16 && !floor_found; i++, budget *= 0.85) {
            struct qc_config cb = cfg;
            cb.device_budget = (uint64_t)budget / 4096 * 4096;
            char dir[512];
            snprintf(dir, sizeof dir, "%s/budget-%d", tmp_root, i);
            t_rm_rf(dir);
            struct run r;
            run_train(&cb, dir, NULL, &r);
            if (r.st != QC_OK) {
                /* under the minimum plan: the scene that never fits, named */
                T_EXPECT(r.st == QC_ERR_NOMEM, "budget %" PRIu64 ": %s", cb.device_budget, r.err);
                T_EXPECT_STR_CONTAINS(r.err, "does not fit the device budget even alone");
                T_EXPECT_STR_CONTAINS(r.err, "edges");
                T_EXPECT_STR_CONTAINS(r.err, "--skip-oversized");
                T_EXPECT_STR_CONTAINS(r.err, "dataset index");
                floor_found = true;
                /* --skip-oversized: skipped, counted */
                struct extra x = {.skip_oversized = true};
                t_rm_rf(dir);
                struct run rs;
                run_train(&cb, dir, &x, &rs);
                T_EXPECT(rs.st == QC_OK, "skip oversized: %s", rs.err);
                /* the scene is skipped, counted; or, when admission let it in (its smallest
                 * plan fits the target) and it ran out only on the allocator's fragmentation,
                 * the retries that follow may find it room in this process (issue 25's open
                 * gap: a runtime out-of-memory depends on the cache state). Skipping by
                 * admission is checked deterministically in tests/test_budget_repro.c. */
                T_EXPECT(SUM(&rs, skipped) > 0 || SUM(&rs, replans) > 0,
                         "scenes skipped: %g, re-plans %g", SUM(&rs, skipped), SUM(&rs, replans));
                t_rm_rf(dir);
                break;
            }
            fitted++;
            T_EXPECT(same_checkpoint(ref, dir, 3), "budget %" PRIu64 ": checkpoint bytes",
                     cb.device_budget);
            T_EXPECT(same_losses(&r0, &r), "budget %" PRIu64 ": losses", cb.device_budget);
            if (SUM(&r, host) + SUM(&r, recompute) > 0)
                moved++;
            for (int s = 0; s < r.nsteps; s++) {
                const struct step_m *m = &r.m[s];
                T_EXPECT(m->peak <= (double)cb.device_budget && m->reserved <= cb.device_budget,
                         "budget %" PRIu64 " step %d: peak %g, reserved %g", cb.device_budget,
                         s + 1, m->peak, m->reserved);
                /* a step with a re-plan peaked, maybe, in the attempt rolled back, which ran
                 * another plan part of the way: its prediction does not compare */
                compared += m->replans == 0;
                T_EXPECT(m->replans > 0 || fabs(m->predicted - m->active) <= PLAN_ERR * m->active,
                         "budget %" PRIu64 " step %d: predicted %g vs measured %g (%+.2f %%, "
                         "more than %.0f %%)",
                         cb.device_budget, s + 1, m->predicted, m->active,
                         100 * (m->predicted / m->active - 1), 100 * PLAN_ERR);
                T_EXPECT(m->splits == 0, "one scene per group: no split");
            }
            printf("  budget %.1f MiB: host %.1f MiB, recomputed %.1f MiB, re-plans %g; peak "
                   "(predicted; * re-planned, not compared) per step:",
                   (double)cb.device_budget / 1048576.0, SUM(&r, host) / 1048576.0,
                   SUM(&r, recompute) / 1048576.0, SUM(&r, replans));
            for (int s = 0; s < r.nsteps; s++)
                printf(" %.1f (%.1f)%s", r.m[s].active / 1048576.0, r.m[s].predicted / 1048576.0,
                       r.m[s].replans > 0 ? "*" : "");
            printf(" MiB\n");
            t_rm_rf(dir);
        }
        T_EXPECT(floor_found, "a budget under the minimum plan was reached");
        T_EXPECT(fitted >= 3 && moved >= 2, "%d budgets fitted, %d moved stashes", fitted, moved);
        /* at least one step per budget compared: a step re-planned after an in-step
         * out-of-memory is not, and how many a run takes depends on the allocator's placement
         * (issue 26's open gap; with lifetime placement step 1, on a cold cache, re-plans at
         * most budgets here: 13 to 15 of 21 steps compared in three runs, 2026-12-06) */
        T_EXPECT(compared >= fitted, "%d steps without a re-plan compared", compared);
        t_rm_rf(ref);
    }
}

// ---- admission control -------------------------------------------------------------------------

static void test_split(void)
{
    QC_TEST ("train memory: a batch that does not fit runs as sub-groups with the unsplit "
             "step's losses and gradients (fp32 tolerance)") {
        struct qc_config cfg;
        tiny_config(&cfg, QC_CONFIG_DEVICE_CPU, true, 2);
        cfg.dropout = 0;
        cfg.steps = 1;
        char ref[512], dir[512];
        tmp_dir(ref, sizeof ref, "split-ref");
        struct extra xg = {.keep_grads = true};
        struct run r0;
        run_train(&cfg, ref, &xg, &r0);
        T_EXPECT(r0.st == QC_OK, "unsplit: %s", r0.err);
        if (r0.st != QC_OK)
            continue;
        /* the largest budget (descending from the unlimited peak) that splits */
        bool split = false;
        double budget = max_active(&r0);
        for (int i = 0; i < 16 && !split; i++) {
            budget *= 0.9;
            struct qc_config cb = cfg;
            cb.device_budget = (uint64_t)budget / 4096 * 4096;
            tmp_dir(dir, sizeof dir, "split");
            struct run r;
            run_train(&cb, dir, &xg, &r);
            T_EXPECT(r.st == QC_OK, "budget %" PRIu64 ": %s", cb.device_budget, r.err);
            if (r.st != QC_OK || r.m[0].splits == 0) {
                free(r.grads);
                continue;
            }
            split = true;
            printf("  budget %.1f MiB (unsplit peak %.1f MiB): %g split(s), peak %.1f MiB\n",
                   (double)cb.device_budget / 1048576.0, max_active(&r0) / 1048576.0, r.m[0].splits,
                   r.m[0].active / 1048576.0);
            T_EXPECT(r.m[0].active <= (double)cb.device_budget, "peak under the budget");

            T_EXPECT_NEAR(r.m[0].loss, r0.m[0].loss, 0, 1e-5, "loss");
            T_EXPECT_NEAR(r.m[0].rp, r0.m[0].rp, 0, 1e-5, "reg_loss_propose");
            T_EXPECT_NEAR(r.m[0].rr, r0.m[0].rr, 0, 1e-5, "reg_loss_refine");
            T_EXPECT_NEAR(r.m[0].cls, r0.m[0].cls, 0, 1e-5, "cls_loss");
            double gmax = 0, dmax = 0;
            int64_t bad = 0;
            for (int64_t k = 0; k < r0.nparams; k++)
                gmax = fmax(gmax, fabs((double)r0.grads[k]));
            for (int64_t k = 0; k < r0.nparams; k++) {
                const double d = fabs((double)r.grads[k] - (double)r0.grads[k]);
                dmax = fmax(dmax, d);
                if (d > 1e-5 * gmax + 1e-4 * fabs((double)r0.grads[k]))
                    bad++;
            }
            printf("  gradients: max |diff| %.3g of max |g| %.3g\n", dmax, gmax);
            T_EXPECT(bad == 0, "%" PRId64 " gradients off (max diff %g, max |g| %g)", bad, dmax,
                     gmax);
            free(r.grads);
        }
        T_EXPECT(split, "a budget split the batch");
        free(r0.grads);
        t_rm_rf(ref);
        t_rm_rf(dir);
    }
}

/* A group that admission splits (its plan does not fit whole at the configured margin, each
 * part's does) runs each part with the batch admission built of it and the admission plan it
 * made (no second build, no second choice of edge modes): the same plan as admitting it again
 * (made again and compared), and the unsplit step's losses within fp32. A large configured
 * margin makes admission split before any run can run out. */
static void test_split_admitted(void)
{
    QC_TEST ("train memory: the parts of a group admission splits run with the batch and "
             "admission plan admission made of them") {
        struct qc_config cfg;
        tiny_config(&cfg, QC_CONFIG_DEVICE_CPU, true, 2);
        cfg.steps = 1;
        cfg.plan_margin = 0.3;
        char ref[512], dir[512];
        tmp_dir(ref, sizeof ref, "split-admitted-ref");
        struct run r0;
        run_train(&cfg, ref, NULL, &r0);
        T_EXPECT(r0.st == QC_OK, "unsplit: %s", r0.err);
        if (r0.st != QC_OK)
            continue;
        bool split = false;
        double budget = max_active(&r0);
        for (int i = 0; i < 24 && !split; i++) {
            budget *= 0.9;
            struct qc_config cb = cfg;
            cb.device_budget = (uint64_t)budget / 4096 * 4096;
            tmp_dir(dir, sizeof dir, "split-admitted");
            struct extra x = {.check_beside = true};
            struct run r;
            run_train(&cb, dir, &x, &r);
            if (r.st != QC_OK || r.m[0].splits == 0 || r.m[0].replans > 0)
                continue; /* whole, or split after running out: not admission's split */
            split = true;
            printf("  budget %.1f MiB: %g split(s); %" PRId64 " parts run with admission's batch "
                   "and plan (%" PRId64 " differ)\n",
                   (double)cb.device_budget / 1048576.0, r.m[0].splits, r.parts_kept,
                   r.parts_differ);
            T_EXPECT(r.parts_kept >= 2 && r.parts_differ == 0,
                     "parts with admission's batch and plan: %" PRId64 ", %" PRId64 " differ",
                     r.parts_kept, r.parts_differ);
            T_EXPECT_NEAR(r.m[0].loss, r0.m[0].loss, 0, 1e-5, "loss");
        }
        T_EXPECT(split, "a budget made admission split the batch");
        t_rm_rf(ref);
        t_rm_rf(dir);
    }
}

// ---- OOM, re-plan ------------------------------------------------------------------------------

static void test_oom(int64_t device)
{
    const char *dev = device == QC_CONFIG_DEVICE_CPU ? "cpu" : "emu";
    char name[160];
    snprintf(name, sizeof name,
             "train memory: an OOM at the k-th allocation of a group is rolled back, re-planned "
             "and gives the same bits (%s)",
             dev);
    QC_TEST (name) {
        struct qc_config cfg;
        tiny_config(&cfg, device, true, 1);
        cfg.grad_accum = 2;
        cfg.device_budget = (uint64_t)2 << 30;
        char ref[512], dir[512];
        tmp_dir(ref, sizeof ref, "oom-ref");
        struct run r0;
        run_train(&cfg, ref, NULL, &r0);
        T_EXPECT(r0.st == QC_OK, "reference: %s", r0.err);
        T_EXPECT(SUM(&r0, replans) == 0, "no re-plan without a fault");
        const int64_t ks[][2] = {{40, 0}, {25, 1}}; /* allocation, group */
        for (int c = 0; c < 2; c++) {
            tmp_dir(dir, sizeof dir, "oom");
            struct extra x = {.fail_at = ks[c][0], .fail_in_group = ks[c][1]};
            struct run r;
            run_train(&cfg, dir, &x, &r);
            T_EXPECT(r.st == QC_OK, "group %" PRId64 ": %s", ks[c][1], r.err);
            T_EXPECT(r.nsteps == 3 && r.m[0].replans == 1, "step 1 re-planned once (%g)",
                     r.m[0].replans);
            T_EXPECT(same_checkpoint(ref, dir, 3), "group %" PRId64 ": checkpoint bytes", ks[c][1]);
            T_EXPECT(same_losses(&r0, &r), "group %" PRId64 ": losses", ks[c][1]);
        }
        t_rm_rf(ref);
        t_rm_rf(dir);
    }
}

// ---- a mixed epoch under a tight budget --------------------------------------------------------

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_mixed_epoch(void)
{
    QC_TEST ("train memory: an epoch of mixed scenes under a budget that fits the median batch "
             "kept whole finishes with no failed step") {
        struct qc_config cfg;
        tiny_config(&cfg, QC_CONFIG_DEVICE_CPU, true, 2);
        cfg.synthetic_profile = QC_SCENE_MIXED;
        cfg.synthetic_scenes = 12;
        cfg.steps = 0;
        cfg.epochs = 1;
        cfg.dropout = 0;
        char ref[512], dir[512];
        tmp_dir(ref, sizeof ref, "mixed-ref");
        struct run r0;
        run_train(&cfg, ref, NULL, &r0);
        T_EXPECT(r0.st == QC_OK && r0.nsteps == 6, "unlimited: %s (%d steps)", r0.err, r0.nsteps);
        if (r0.st != QC_OK)
            continue;
        double peaks[MAX_STEPS];
        for (int i = 0; i < r0.nsteps; i++)
            peaks[i] = r0.m[i].active;
        qsort(peaks, (size_t)r0.nsteps, sizeof peaks[0], cmp_double);
        const double median = peaks[r0.nsteps / 2], top = peaks[r0.nsteps - 1];
        printf("  kept whole: median peak %.1f MiB, largest %.1f MiB\n", median / 1048576.0,
               top / 1048576.0);
        T_EXPECT(top > 1.1 * median, "the tail is heavier than the median");
        struct qc_config cb = cfg;
        cb.device_budget = (uint64_t)(median * 1.02) / 4096 * 4096;
        tmp_dir(dir, sizeof dir, "mixed");
        struct run r;
        run_train(&cb, dir, NULL, &r);
        T_EXPECT(r.st == QC_OK && r.nsteps == r0.nsteps, "under %" PRIu64 ": %s", cb.device_budget,
                 r.err);
        double moved = 0;
        for (int i = 0; i < r.nsteps; i++) {
            const struct step_m *m = &r.m[i];
            T_EXPECT(m->peak <= (double)cb.device_budget, "step %d: peak %g over %" PRIu64, i + 1,
                     m->peak, cb.device_budget);
            T_EXPECT_NEAR(m->loss, r0.m[i].loss, 0, 1e-5, "step %d loss", i + 1);
            moved += m->host + m->recompute + m->splits;
        }
        T_EXPECT(moved > 0, "the tail was offloaded, recomputed or split");
        t_rm_rf(ref);
        t_rm_rf(dir);
    }
}

// ---- NVMe faults inside a step -----------------------------------------------------------------

static void test_nvme_fault(void)
{
    QC_TEST ("train memory: an NVMe read error or a flipped byte inside a step is repaired by "
             "recompute: same checkpoint, counted") {
        struct qc_config cfg;
        tiny_config(&cfg, QC_CONFIG_DEVICE_CPU, true, 2);
        char ref[512], dir[512];
        tmp_dir(ref, sizeof ref, "fault-ref");
        cfg.plan_policy = QC_PLAN_KEEP;
        struct run r0;
        run_train(&cfg, ref, NULL, &r0);
        T_EXPECT(r0.st == QC_OK, "keep: %s", r0.err);
        cfg.plan_policy = QC_PLAN_OFFLOAD;
        cfg.offload_placement = QC_PLACE_NVME;
        set_nvme(&cfg);
        const enum qc_offload_fault faults[] = {QC_OFFLOAD_FAULT_EIO, QC_OFFLOAD_FAULT_FLIP};
        for (int f = 0; f < 2; f++) {
            tmp_dir(dir, sizeof dir, "fault");
            struct extra x = {.fault = faults[f],
                              .fault_op = faults[f] == QC_OFFLOAD_FAULT_FLIP
                                              ? QC_OFFLOAD_FAULT_WRITE
                                              : QC_OFFLOAD_FAULT_READ};
            struct run r;
            run_train(&cfg, dir, &x, &r);
            T_EXPECT(r.st == QC_OK, "%s: %s", f ? "flip" : "eio", r.err);
            T_EXPECT(SUM(&r, recompute) > 0, "%s: the block was recomputed", f ? "flip" : "eio");
            T_EXPECT(same_checkpoint(ref, dir, 3), "%s: checkpoint bytes", f ? "flip" : "eio");
            T_EXPECT(same_losses(&r0, &r), "%s: losses", f ? "flip" : "eio");
        }
        t_rm_rf(ref);
        t_rm_rf(dir);
    }
}

// ---- the calibrated plan beside admission ------------------------------------------------------

/* Under a budget the trainer plans each group while the group before runs, on a helper thread
 * (src/train/memory/plan_ahead.h: the description, the admission plan, the calibrated plan),
 * and with two compute threads it searches the calibrated plan of a group planned on its path
 * (the first) on another helper while admission searches its own (plan_beside.h; the test hook
 * starts it with one, so that ThreadSanitizer sees no OpenMP threads:
 * test_train_memory_beside_tsan). Under a budget that moves stashes, the first group's
 * calibrated plan must come from the beside helper, every later group's admission from the one
 * ahead and its calibrated plan too unless the margin moved over it, each equal to what the
 * trainer's thread makes of the same inputs, and the run's bits the unlimited run's. 7 steps of
 * 3 batches an epoch: the next epoch's first batch is fetched and planned during the last one's
 * (the loader starts that epoch early), and the batches must still come in the unlimited run's
 * order. */
static void test_beside(void)
{
    QC_TEST ("train memory: the plans made beside admission and ahead of each group on helper "
             "threads are the trainer's own, every group") {
        struct qc_config cfg;
        tiny_config(&cfg, QC_CONFIG_DEVICE_CPU, true, 2); /* 6 scenes: 3 batches an epoch */
        cfg.steps = 7;
        char ref[512], dir[512];
        tmp_dir(ref, sizeof ref, "beside-unlimited");
        struct run r0;
        run_train(&cfg, ref, NULL, &r0);
        T_EXPECT(r0.st == QC_OK && r0.nsteps == 7, "unlimited: %s", r0.err);
        if (r0.st != QC_OK)
            continue;
        struct qc_config cb = cfg;
        cb.device_budget = (uint64_t)(0.75 * max_active(&r0)) / 4096 * 4096;
        tmp_dir(dir, sizeof dir, "beside-budget");
        struct extra x = {.check_beside = true};
        struct run r;
        run_train(&cb, dir, &x, &r);
        T_EXPECT(r.st == QC_OK && r.nsteps == 7, "budget %" PRIu64 ": %s", cb.device_budget, r.err);
        printf("  budget %.1f MiB: %" PRId64 " calibrated plans made beside admission (%" PRId64
               " differ); %" PRId64 " groups admitted ahead, %" PRId64
               " calibrated plans made ahead (%" PRId64 " differ); host %.1f MiB, recomputed "
               "%.1f MiB\n",
               (double)cb.device_budget / 1048576.0, r.beside_made, r.beside_differ,
               r.ahead_admitted, r.ahead_cal, r.ahead_differ, SUM(&r, host) / 1048576.0,
               SUM(&r, recompute) / 1048576.0);
        T_EXPECT(r.beside_made >= 1 && r.beside_differ == 0,
                 "plans beside admission: %" PRId64 " made, %" PRId64 " differ", r.beside_made,
                 r.beside_differ);
        T_EXPECT(r.ahead_admitted >= r.nsteps - 1 && r.ahead_differ == 0,
                 "groups planned ahead: %" PRId64 " admitted in %d steps, %" PRId64 " differ",
                 r.ahead_admitted, r.nsteps, r.ahead_differ);
        /* a calibrated plan made ahead gives way when a miss raised the margin over its peak */
        T_EXPECT(r.ahead_cal >= 1, "no calibrated plan made ahead in %d steps", r.nsteps);
        T_EXPECT(SUM(&r, host) + SUM(&r, recompute) > 0, "the budget moved no stash");
        for (int i = 0; i < r.nsteps && i < r0.nsteps; i++)
            T_EXPECT(r.m[i].loss == r0.m[i].loss, "step %d: loss %.9g, unlimited %.9g", i + 1,
                     r.m[i].loss, r0.m[i].loss);
        T_EXPECT(same_checkpoint(ref, dir, 7), "checkpoint bytes equal the unlimited run's");
        t_rm_rf(ref);
        t_rm_rf(dir);
    }
}

// ---- the trainer's threads together (ThreadSanitizer) ------------------------------------------

/* Small on purpose (2 runs of 2 steps): ctest's test_train_memory_tsan runs it under
 * ThreadSanitizer, where a step is tens of times slower. */
static void test_threads(void)
{
    QC_TEST ("train memory: threads together (emu: loader threads, copy streams, offload "
             "prefetch host/NVMe, recompute): a random mix gives keep's bytes") {
        struct qc_config cfg;
        tiny_config(&cfg, QC_CONFIG_DEVICE_EMU, true, 2);
        cfg.steps = 2;
        cfg.loader_threads = 2;
        char ref[512], dir[512];
        tmp_dir(ref, sizeof ref, "threads-keep");
        cfg.plan_policy = QC_PLAN_KEEP;
        struct run rk;
        run_train(&cfg, ref, NULL, &rk);
        T_EXPECT(rk.st == QC_OK && rk.nsteps == 2, "keep: %s", rk.err);
        if (rk.st != QC_OK)
            continue;
        cfg.plan_policy = QC_PLAN_OFFLOAD;
        cfg.offload_placement = QC_PLACE_AUTO;
        set_nvme(&cfg);
        tmp_dir(dir, sizeof dir, "threads-mix");
        struct mix mx = {.rng = qc_test_seed(), .nvme = true};
        struct extra x = {.hook = mix_hook, .hook_user = &mx};
        struct run r;
        run_train(&cfg, dir, &x, &r);
        T_EXPECT(r.st == QC_OK && r.nsteps == 2, "mix: %s", r.err);
        if (r.st != QC_OK)
            continue;
        const double host = SUM(&r, host), nvme = SUM(&r, nvme), rec = SUM(&r, recompute);
        printf("  mix: host %.1f MiB, NVMe %.1f MiB, recomputed %.1f MiB\n", host / 1048576.0,
               nvme / 1048576.0, rec / 1048576.0);
        T_EXPECT(host > 0 && nvme > 0 && rec > 0, "mix: host %g, NVMe %g, recompute %g", host, nvme,
                 rec);
        T_EXPECT(same_checkpoint(ref, dir, 2), "mix: checkpoint bytes equal keep's");
        T_EXPECT(same_losses(&rk, &r), "mix: losses equal keep's");
        t_rm_rf(ref);
        t_rm_rf(dir);
    }
}

int main(int argc, char **argv)
{
    snprintf(tmp_root, sizeof tmp_root, "%s/test_train_memory.%d", QC_BINARY_DIR, (int)getpid());
    t_rm_rf(tmp_root);
    if (mkdir(tmp_root, 0700) != 0) {
        printf("cannot create %s\n", tmp_root);
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
        /* skip only without a GPU or a CUDA build; a GPU that fails to answer fails the test */
        const int probe = qc_test_cuda_probe();
        if (probe != 0) {
            t_rm_rf(tmp_root);
            return probe;
        }
        test_invariance(QC_CONFIG_DEVICE_CUDA, true);
        test_invariance(QC_CONFIG_DEVICE_CUDA, false);
    } else {
        test_invariance(QC_CONFIG_DEVICE_CPU, true);
        test_invariance(QC_CONFIG_DEVICE_CPU, false);
        test_invariance(QC_CONFIG_DEVICE_EMU, true);
        test_invariance(QC_CONFIG_DEVICE_EMU, false);
        test_budgets();
        test_split();
        test_split_admitted();
        test_oom(QC_CONFIG_DEVICE_CPU);
        test_oom(QC_CONFIG_DEVICE_EMU);
        test_mixed_epoch();
        test_nvme_fault();
        test_beside();
        test_threads();
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
