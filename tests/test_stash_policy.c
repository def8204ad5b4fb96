/*
 * test_stash_policy.c — the stash policies of a step change where bytes live, never the bits
 * (src/model/qc_qcnet.h: qc_qcnet_set_plan; src/model/qcnet_policy.c).
 *
 * One training step (forward, loss, backward) of a small model on two synthetic scenes, on the
 * CPU and on the emulated device (an allocator over the arena, a CPU device whose copy streams
 * open it, the offload engine with a host tier and an NVMe tier in a folder of the build tree),
 * fused and unfused, under: no plan; every block kept; every block offloaded to the host tier;
 * to the NVMe tier; recomputed; and seeded random mixes of the four. The outputs, the loss and
 * every gradient must equal the reference's bit for bit, the offloaded and recomputed bytes
 * must be what the policy says (a tier that fills up keeps the rest on the device, with a
 * warning: the unfused cases fill the 256 MiB tiers), and nothing may be left live after
 * release. Then an NVMe read
 * that fails (EIO, a flipped byte) is repaired by recompute: the same bits, counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "batch_testlib.h"
#include "qc_alloc.h"
#include "qc_batch.h"
#include "qc_device.h"
#include "qc_emu.h"
#include "qc_exec.h"
#include "qc_graph.h"
#include "qc_half.h"
#include "qc_memctx.h"
#include "qc_offload.h"
#include "qc_plan.h"
#include "qc_qcnet.h"
#include "qc_synth.h"

static struct qc_batch g_batch;
static char g_dir[512];
static int g_prec; /* enum qc_precision of the model and its ops (0: fp32) */
/* cases where fetching nothing ahead lowered the peak below fetching ahead: a step whose peak
 * is not a prefetch's (emu unfused bf16: the unfused attention's working set) keeps its peak,
 * but the cases together must show the lower peak the last resort is for */
static int g_none_lower, g_none_cases;

static bool make_batch(void)
{
    static bool tried, ok;
    if (tried)
        return ok;
    tried = true;
    enum qc_status rc = t_synth_batch2(91, &g_batch);
    ok = rc == QC_OK;
    if (!ok)
        printf("  batch: %s\n", qc_error_last());
    return ok;
}

/* A backend with an offload tier: device, (arena), allocator, copy-in stream, engine, memory
 * context, exec. */
struct stack {
    bool emu_backend;
    struct qc_device *dev;
    struct qc_emu *emu;
    struct qc_alloc *alloc;
    struct qc_stream *copy_in;
    struct qc_offload *off;
    struct qc_memctx *mc;
    struct qc_exec ex;
};

static bool stack_make(struct stack *s, bool emu)
{
    memset(s, 0, sizeof *s);
    s->emu_backend = emu;
    struct qc_alloc_params ap;
    qc_alloc_params_default(&ap);
    struct qc_offload_params op;
    qc_offload_params_default(&op);
    op.host_capacity = (size_t)256 << 20;
    op.nvme_dir = g_dir;
    op.nvme_capacity = (size_t)256 << 20;
    op.block_size = (size_t)64 << 10;
    op.max_inflight = (size_t)4 << 20;
    enum qc_status rc = qc_device_create(QC_DEVICE_CPU, 0, &s->dev);
    if (rc == QC_OK && emu) {
        rc = qc_emu_create((size_t)8 << 30, &s->emu);
        ap.emu = s->emu;
        if (rc == QC_OK)
            qc_device_cpu_set_emu(s->dev, s->emu);
    }
    if (rc == QC_OK)
        rc = qc_alloc_create(s->dev, &ap, &s->alloc);
    if (rc == QC_OK)
        rc = qc_stream_create(s->dev, QC_STREAM_COPY, &s->copy_in);
    if (rc == QC_OK)
        rc = qc_offload_create(s->dev, &op, &s->off);
    if (rc == QC_OK) {
        const struct qc_memctx_params mp = {.alloc = s->alloc,
                                            .compute = qc_device_compute_stream(s->dev),
                                            .offload = s->off,
                                            .copy_in = s->copy_in};
        rc = qc_memctx_create(&mp, &s->mc);
    }
    s->ex = (struct qc_exec){.backend = emu ? QC_EXEC_EMU : QC_EXEC_CPU,
                             .stream = NULL,
                             .emu = s->emu,
                             .precision = g_prec};
    if (rc != QC_OK)
        printf("  stack: %s\n", qc_error_last());
    return rc == QC_OK;
}

static void stack_free(struct stack *s)
{
    qc_memctx_destroy(s->mc);
    qc_offload_destroy(s->off);
    qc_stream_destroy(s->copy_in);
    qc_alloc_destroy(s->alloc);
    qc_device_destroy(s->dev);
    qc_emu_destroy(s->emu);
    memset(s, 0, sizeof *s);
}

static const struct qc_exec *stack_exec(const struct stack *s)
{
    return s->emu_backend || g_prec ? &s->ex : NULL;
}

static void small_config(struct qc_qcnet_config *cfg, enum qc_attn_impl impl)
{
    qc_qcnet_config_parity_tiny(cfg);
    cfg->hidden_dim = 16;
    cfg->num_heads = 2;
    cfg->head_dim = 8;
    cfg->num_freq_bands = 4;
    cfg->attention = impl;
    cfg->precision = g_prec;
}

/* What one step leaves on the host. */
struct result {
    float loss[4];
    float *loc, *grads;
    int64_t nloc, np;
};

static void result_free(struct result *r)
{
    free(r->loc);
    free(r->grads);
    memset(r, 0, sizeof *r);
}

static bool result_same(const struct result *a, const struct result *b)
{
    return a->np == b->np && a->nloc == b->nloc && memcmp(a->loss, b->loss, sizeof a->loss) == 0 &&
           memcmp(a->loc, b->loc, (size_t)a->nloc * sizeof(float)) == 0 &&
           memcmp(a->grads, b->grads, (size_t)a->np * sizeof(float)) == 0;
}

/* One step of m on the batch (device backends: the batch staged into the context's memory). */
static enum qc_status step(struct stack *s, struct qc_qcnet *m, struct result *r)
{
    memset(r, 0, sizeof *r);
    struct qc_qcnet_ctx ctx = {.training = true, .need_backward = true, .seed = 11, .step = 4};
    void *nd = NULL, *gd = NULL;
    struct qc_batch view;
    if (s->emu_backend) {
        nd = qc_memctx_alloc(s->mc, QC_MEM_MODEL, g_batch.node_bytes, "test/batch.nodes");
        gd = qc_memctx_alloc(s->mc, QC_MEM_MODEL, g_batch.graph_bytes, "test/batch.graph");
        if (!nd || !gd || qc_op_upload(&s->ex, nd, g_batch.node_mem, g_batch.node_bytes) ||
            qc_op_upload(&s->ex, gd, g_batch.graph_mem, g_batch.graph_bytes))
            T_FATAL("device batch: %s", qc_error_last());
        qc_batch_rebase(&g_batch, nd, gd, &view);
        ctx.batch_dev = &view;
    }
    qc_qcnet_zero_grad(m);
    struct qc_qcnet_output o;
    struct qc_qcnet_loss l;
    enum qc_status rc = qc_qcnet_forward(m, &g_batch, &ctx, &o);
    if (rc == QC_OK)
        rc = qc_qcnet_loss(m, &l);
    if (rc == QC_OK)
        rc = qc_qcnet_backward(m, 1.0f);
    if (rc == QC_OK) {
        r->loss[0] = l.loss;
        r->loss[1] = l.reg_loss_propose;
        r->loss[2] = l.reg_loss_refine;
        r->loss[3] = l.cls_loss;
        r->nloc = o.A * o.K * o.S * 2;
        r->np = qc_qcnet_num_params(m);
        r->loc = malloc((size_t)r->nloc * sizeof(float));
        r->grads = malloc((size_t)r->np * sizeof(float));
        if (!r->loc || !r->grads)
            T_FATAL("out of memory");
        rc = qc_op_download(stack_exec(s), r->loc, o.loc_refine_pos,
                            (size_t)r->nloc * sizeof(float));
        if (rc == QC_OK)
            rc = qc_qcnet_grads_download(m, r->grads);
    }
    qc_qcnet_release(m);
    qc_memctx_free(s->mc, QC_MEM_MODEL, nd, g_batch.node_bytes);
    qc_memctx_free(s->mc, QC_MEM_MODEL, gd, g_batch.graph_bytes);
    return rc;
}

/* Policies: all p, or (p < 0) a seeded random mix. */
static void policies(const struct qc_plan_program *prog, int p, uint64_t seed, uint8_t *out)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int32_t b = 0; b < prog->nblocks; b++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[b] = (uint8_t)(p >= 0 ? p : (int)(x % QC_POLICY_COUNT));
    }
}

/* Live context allocations of class cls. */
static int64_t nlive(const struct qc_memctx *mc, enum qc_mem_class cls)
{
    struct qc_memctx_stats st;
    qc_memctx_stats_get(mc, &st);
    return st.nlive[cls];
}

static void test_invariance(bool emu, enum qc_attn_impl impl)
{
    if (!make_batch()) {
        T_FAIL_AT("batch");
        return;
    }
    struct stack s;
    if (!stack_make(&s, emu)) {
        T_FAIL_AT("backend");
        return;
    }
    struct qc_qcnet_config cfg;
    small_config(&cfg, impl);
    struct qc_qcnet *m = NULL, *dm = NULL;
    T_EXPECT(qc_qcnet_create_on(&cfg, s.mc, stack_exec(&s), &m) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_qcnet_create_dry(&cfg, &dm) == QC_OK, "%s", qc_error_last());
    struct qc_plan_program prog;
    qc_plan_program_init(&prog);
    if (!m || !dm || qc_qcnet_describe(dm, &g_batch, false, &prog) != QC_OK) {
        T_FAIL_AT("setup: %s", qc_error_last());
        goto out;
    }
    qc_qcnet_init_params(m, 17);
    struct result ref;
    T_EXPECT(step(&s, m, &ref) == QC_OK, "reference step: %s", qc_error_last());
    const int64_t base = nlive(s.mc, QC_MEM_MODEL) + nlive(s.mc, QC_MEM_BLOCK);
    uint8_t *pol = malloc((size_t)prog.nblocks);
    if (!pol)
        T_FATAL("out of memory");
    uint64_t stash_total = 0;
    for (int32_t b = 0; b < prog.nblocks; b++)
        stash_total += prog.blocks[b].stash_bytes;
    if (g_prec) { /* the planner sees the 16-bit stashes: compare with an fp32 description */
        struct qc_qcnet_config c32 = cfg;
        c32.precision = 0;
        struct qc_qcnet *d32 = NULL;
        struct qc_plan_program p32;
        qc_plan_program_init(&p32);
        uint64_t total32 = 0;
        if (qc_qcnet_create_dry(&c32, &d32) == QC_OK &&
            qc_qcnet_describe(d32, &g_batch, false, &p32) == QC_OK)
            for (int32_t b = 0; b < p32.nblocks; b++)
                total32 += p32.blocks[b].stash_bytes;
        printf("  stash bytes the planner sees: %llu in 16 bits, %llu in fp32\n",
               (unsigned long long)stash_total, (unsigned long long)total32);
        /* observed: 0.69x fused, 0.84x unfused (its source/edge contexts stay fp32) */
        const double bound = impl == QC_ATTN_FUSED ? 0.75 : 0.9;
        T_EXPECT(total32 > 0 && (double)stash_total <= bound * (double)total32,
                 "16-bit stashes %llu vs fp32 %llu", (unsigned long long)stash_total,
                 (unsigned long long)total32);
        qc_plan_program_free(&p32);
        qc_qcnet_destroy(d32);
    }
    const char *names[] = {"keep",  "offload host", "offload nvme", "recompute",
                           "mix 1", "mix 2",        "mix 3"};
    /* QC_STASH_POLICY_MIXES (1..3, default 3): the seeded mixes run; the sanitized builds run
     * one (tests/cmake/stash_policy.cmake), the release build all three */
    const char *mixes_env = getenv("QC_STASH_POLICY_MIXES");
    const int mixes = mixes_env ? atoi(mixes_env) : 3;
    if (mixes < 1 || mixes > 3)
        T_FATAL("QC_STASH_POLICY_MIXES=%s: want 1, 2 or 3", mixes_env);
    /* the last case: everything offloaded to the host, nothing fetched ahead (each stash at
     * its own backward: the planner's last resort, qc_plan_result.prefetch_none) */
    size_t host_peak = 0; /* the offload host case's peak */
    for (int c = 0; c < 5 + mixes; c++) {
        const bool none = c == 4 + mixes;
        const char *name = none ? "offload host, nothing fetched ahead" : names[c];
        policies(&prog,
                 none    ? QC_POLICY_OFFLOAD_HOST
                 : c < 4 ? c
                         : -1,
                 (uint64_t)c * 7919u + qc_test_seed(), pol);
        T_EXPECT(qc_qcnet_set_plan(m, &prog, pol, (size_t)1 << 20, none) == QC_OK, "%s: %s", name,
                 qc_error_last());
        struct qc_memctx_stats m0, m1;
        struct qc_qcnet_mem q0, q1;
        qc_qcnet_mem_reset_peak(m);
        qc_memctx_stats_get(s.mc, &m0);
        qc_qcnet_mem_get(m, &q0);
        struct result r;
        enum qc_status rc = step(&s, m, &r);
        qc_memctx_stats_get(s.mc, &m1);
        qc_qcnet_mem_get(m, &q1);
        T_EXPECT(rc == QC_OK, "%s step: %s", name, qc_error_last());
        if (rc == QC_OK)
            T_EXPECT(result_same(&r, &ref), "%s: the step's bits differ from keeping everything",
                     name);
        const uint64_t host = m1.put_host_bytes - m0.put_host_bytes;
        const uint64_t nvme = m1.put_nvme_bytes - m0.put_nvme_bytes;
        const uint64_t rec = q1.recompute_bytes - q0.recompute_bytes;
        printf("  %s %s %-12s offloaded host %llu, nvme %llu, recomputed %llu of %llu stash "
               "bytes; stall %.4f s\n",
               emu ? "emu" : "cpu", impl == QC_ATTN_FUSED ? "fused" : "unfused", name,
               (unsigned long long)host, (unsigned long long)nvme, (unsigned long long)rec,
               (unsigned long long)stash_total, m1.stall_s - m0.stall_s);
        if (c == 0)
            T_EXPECT(host + nvme + rec == 0, "keep moved bytes");
        if (c == 1)
            T_EXPECT(host > stash_total / 2 && nvme == 0, "offload host: %llu",
                     (unsigned long long)host);
        if (c == 2)
            T_EXPECT(nvme > stash_total / 2 && host == 0, "offload nvme: %llu",
                     (unsigned long long)nvme);
        if (c == 3)
            T_EXPECT(rec > stash_total / 2 && host + nvme == 0, "recompute: %llu",
                     (unsigned long long)rec);
        if (c >= 4 && !none)
            T_EXPECT(host > 0 && nvme > 0 && rec > 0, "a mix uses every policy");
        if (c == 1)
            host_peak = q1.bytes_peak;
        if (none) { /* the next backward's stashes not fetched during this one: a lower peak */
            T_EXPECT(host > stash_total / 2 && nvme + rec == 0, "%s: %llu", name,
                     (unsigned long long)host);
            T_EXPECT(q1.bytes_peak <= host_peak, "%s: peak %zu, fetched ahead %zu", name,
                     q1.bytes_peak, host_peak);
            g_none_cases++;
            g_none_lower += q1.bytes_peak < host_peak;
        }
        T_EXPECT_EQ_I64(nlive(s.mc, QC_MEM_MODEL) + nlive(s.mc, QC_MEM_BLOCK), base,
                        "%s: allocations left after release", name);
        result_free(&r);
    }
    free(pol);
    T_EXPECT(qc_offload_quiesce(s.off) == QC_OK, "%s", qc_error_last());
    struct qc_offload_stats os;
    qc_offload_stats_get(s.off, &os);
    T_EXPECT(os.bytes_host_used == 0 && os.bytes_nvme_used == 0,
             "tier bytes left: host %llu, nvme %llu", (unsigned long long)os.bytes_host_used,
             (unsigned long long)os.bytes_nvme_used);
    result_free(&ref);
out:
    qc_plan_program_free(&prog);
    qc_qcnet_destroy(m);
    qc_qcnet_destroy(dm);
    stack_free(&s);
}

/* An NVMe read that fails inside the step is repaired by recompute: same bits, counted. */
static void test_nvme_fault(enum qc_offload_fault fault)
{
    if (!make_batch()) {
        T_FAIL_AT("batch");
        return;
    }
    struct stack s;
    if (!stack_make(&s, false)) {
        T_FAIL_AT("backend");
        return;
    }
    if (qc_offload_rung_active(s.off) == QC_OFFLOAD_RUNG_HOST_ONLY) {
        T_FAIL_AT("no NVMe tier in %s", g_dir);
        stack_free(&s);
        return;
    }
    struct qc_qcnet_config cfg;
    small_config(&cfg, QC_ATTN_FUSED);
    struct qc_qcnet *m = NULL, *dm = NULL;
    struct qc_plan_program prog;
    qc_plan_program_init(&prog);
    T_EXPECT(qc_qcnet_create_on(&cfg, s.mc, NULL, &m) == QC_OK, "%s", qc_error_last());
    T_EXPECT(qc_qcnet_create_dry(&cfg, &dm) == QC_OK, "%s", qc_error_last());
    if (!m || !dm || qc_qcnet_describe(dm, &g_batch, false, &prog) != QC_OK) {
        T_FAIL_AT("setup: %s", qc_error_last());
        goto out;
    }
    qc_qcnet_init_params(m, 23);
    struct result ref, r;
    T_EXPECT(step(&s, m, &ref) == QC_OK, "reference: %s", qc_error_last());
    uint8_t *pol = malloc((size_t)prog.nblocks);
    policies(&prog, QC_POLICY_OFFLOAD_NVME, 0, pol);
    T_EXPECT(qc_qcnet_set_plan(m, &prog, pol, 0, false) == QC_OK, "%s", qc_error_last());
    free(pol);
    /* the 3rd read of the step fails (or its block was flipped on disk by the 3rd write) */
    qc_offload_fault_set(
        s.off, fault,
        fault == QC_OFFLOAD_FAULT_FLIP ? QC_OFFLOAD_FAULT_WRITE : QC_OFFLOAD_FAULT_READ, 3);
    struct qc_qcnet_mem q0, q1;
    qc_qcnet_mem_get(m, &q0);
    enum qc_status rc = step(&s, m, &r);
    qc_qcnet_mem_get(m, &q1);
    T_EXPECT(rc == QC_OK, "step with a failing read: %s", qc_error_last());
    T_EXPECT(qc_offload_fault_fired(s.off), "the fault fired");
    T_EXPECT_EQ_I64(q1.repaired - q0.repaired, 1, "one stash repaired by recompute");
    if (rc == QC_OK)
        T_EXPECT(result_same(&r, &ref), "the repaired step's bits differ");
    result_free(&r);
    result_free(&ref);
out:
    qc_plan_program_free(&prog);
    qc_qcnet_destroy(m);
    qc_qcnet_destroy(dm);
    stack_free(&s);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/stash-policy-%d", QC_BINARY_DIR, (int)getpid());
    if (mkdir(g_dir, 0700) != 0) {
        printf("cannot create %s\n", g_dir);
        return 1;
    }
    QC_TEST ("stash policies: same bits under every policy (cpu, fused)")
        test_invariance(false, QC_ATTN_FUSED);
    QC_TEST ("stash policies: same bits under every policy (cpu, unfused)")
        test_invariance(false, QC_ATTN_UNFUSED);
    QC_TEST ("stash policies: same bits under every policy (emu, fused)")
        test_invariance(true, QC_ATTN_FUSED);
    QC_TEST ("stash policies: same bits under every policy (emu, unfused)")
        test_invariance(true, QC_ATTN_UNFUSED);
    /* bf16 (docs/PRECISION.md): the blocks' own stashes packed to 16 bits after forward, the
     * ops rounding; the policies still give the same bits */
    g_prec = QC_PREC_BF16;
    QC_TEST ("stash policies: same bits under every policy in bf16 (cpu, fused)")
        test_invariance(false, QC_ATTN_FUSED);
    QC_TEST ("stash policies: same bits under every policy in bf16 (emu, unfused)")
        test_invariance(true, QC_ATTN_UNFUSED);
    g_prec = 0;
    QC_TEST ("stash policies: fetching nothing ahead lowers the peak (most cases above)")
        T_EXPECT(g_none_cases > 0 && 2 * g_none_lower > g_none_cases, "lower in %d of %d cases",
                 g_none_lower, g_none_cases);
    QC_TEST ("stash policies: an NVMe read error inside a step is repaired by recompute")
        test_nvme_fault(QC_OFFLOAD_FAULT_EIO);
    QC_TEST ("stash policies: a flipped byte on NVMe inside a step is repaired by recompute")
        test_nvme_fault(QC_OFFLOAD_FAULT_FLIP);
    t_rm_rf(g_dir);
    return qc_test_summary();
}
