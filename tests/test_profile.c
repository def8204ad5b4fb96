/*
 * test_profile.c — the profiler (src/base/qc_prof.h) and `qctrain profile`'s trace and summary
 * (src/prof/qc_profile.h), on training steps of a tiny model (cpu-smoke sizes, small radii):
 *   - profiling changes no bits: the same steps with the recorder on and off give the same
 *     weights and AdamW state, fused and unfused;
 *   - with the recorder off nothing is recorded;
 *   - the trace is valid JSON (parsed back with cJSON) in the Chrome trace-event format: the
 *     expected events of a step (ops with shape, bytes and FLOPs; blocks with pass; the step's
 *     phases; the loader wait; the optimizer; allocator instants and the allocated-bytes
 *     counter; a "main" thread track), each complete event with ts >= 0 and dur >= 0;
 *   - the nesting invariant: a top-level op's nested ops (weighted) fit in its duration, every
 *     nested op names an existing top-level op, and the fused attention's tile ops are nested;
 *   - the summary's attribution: the ops' wall time fits in the step, GEMM's share is in (0, 1).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "config_testlib.h"
#include "qc_config.h"
#include "qc_prof.h"
#include "qc_profile.h"
#include "qc_qcnet.h"
#include "qc_train.h"
#include "testutil.h"

static char tmp_root[256];

static void tiny_config(struct qc_config *cfg, enum qc_attention_impl attn)
{
    t_small_smoke_config(cfg);
    cfg->batch_size = 2;
    cfg->grad_accum = 1;
    cfg->synthetic_scenes = 4;
    cfg->steps = 2;
    cfg->save_every = 0;
    cfg->attention = attn;
}

/* Runs cfg->steps steps (each a "step" phase span when profiling) in a fresh folder; copies the
 * weights and AdamW moments into *w (3 × params floats, caller frees). */
static void run_steps(const struct qc_config *cfg, const char *name, bool profile, float **w,
                      int64_t *n)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, name);
    t_rm_rf(dir);
    const struct qc_train_opts to = {.cfg = cfg, .out_dir = dir, .quiet = true};
    struct qc_trainer *t = NULL;
    if (qc_trainer_create(&to, &t) != QC_OK)
        T_FATAL("trainer: %s", qc_error_last());
    if (profile) {
        qc_prof_reset();
        qc_prof_start();
    }
    for (int64_t i = 0; i < cfg->steps; i++) {
        struct qc_prof_mark m;
        if (profile)
            qc_prof_span_begin(&m, QC_PROF_CAT_PHASE, "step", QC_PROF_PASS_NONE);
        if (qc_trainer_step(t, NULL) != QC_OK)
            T_FATAL("step: %s", qc_error_last());
        if (profile)
            qc_prof_span_end(&m, QC_PROF_CAT_PHASE, NULL, 0);
    }
    if (profile)
        qc_prof_stop();
    *n = qc_qcnet_num_params(qc_trainer_model(t));
    const size_t bytes = (size_t)*n * sizeof(float);
    *w = malloc(3 * bytes);
    if (!*w)
        T_FATAL("out of memory");
    memcpy(*w, qc_qcnet_params(qc_trainer_model(t)), bytes);
    memcpy(*w + *n, qc_optim_exp_avg(qc_trainer_optim(t)), bytes);
    memcpy(*w + 2 * *n, qc_optim_exp_avg_sq(qc_trainer_optim(t)), bytes);
    qc_trainer_destroy(t);
    t_rm_rf(dir);
}

// ---- the recorder's invariants ----------------------------------------------------------------

struct nest_check {
    int64_t nid;
    double *dur, *child; /* per top-level op id */
    int64_t nested, orphans, fused_nested;
};

static void nest_ids(const struct qc_prof_event *e, void *ctx)
{
    struct nest_check *c = ctx;
    if (e->cat == QC_PROF_CAT_OP && e->id > 0 && e->id < c->nid)
        c->dur[e->id] = 1e-9 * (double)(e->t1 - e->t0);
}

static void nest_children(const struct qc_prof_event *e, void *ctx)
{
    struct nest_check *c = ctx;
    if (e->cat != QC_PROF_CAT_OP || !e->parent)
        return;
    c->nested++;
    if (e->parent >= c->nid || c->dur[e->parent] < 0) {
        c->orphans++;
        return;
    }
    c->child[e->parent] += 1e-9 * (double)(e->t1 - e->t0) * (double)e->weight;
    if (strcmp(e->name, "attn_fused_rows_forward") == 0 ||
        strcmp(e->name, "attn_fused_rows_backward") == 0)
        c->fused_nested++;
}

static void max_id(const struct qc_prof_event *e, void *ctx)
{
    int64_t *n = ctx;
    *n = e->id + 1 > *n ? e->id + 1 : *n;
}

static void test_nesting(bool fused)
{
    struct nest_check c = {0};
    qc_prof_foreach(max_id, &c.nid);
    c.dur = malloc((size_t)c.nid * sizeof *c.dur);
    c.child = calloc((size_t)c.nid, sizeof *c.child);
    if (!c.dur || !c.child)
        T_FATAL("out of memory");
    for (int64_t i = 0; i < c.nid; i++)
        c.dur[i] = -1;
    qc_prof_foreach(nest_ids, &c);
    qc_prof_foreach(nest_children, &c);
    int64_t over = 0;
    for (int64_t i = 1; i < c.nid; i++) /* 2 % and 50 µs slack: clock reads around the loop */
        if (c.dur[i] >= 0 && c.child[i] > 1.02 * c.dur[i] + 50e-6)
            over++;
    printf("  %lld top-level ops, %lld nested (%lld fused row ops)\n", (long long)c.nid - 1,
           (long long)c.nested, (long long)c.fused_nested);
    T_EXPECT(c.nid > 100, "only %lld top-level ops recorded", (long long)c.nid - 1);
    T_EXPECT_EQ_I64(c.orphans, 0, "nested ops naming no top-level op");
    T_EXPECT_EQ_I64(over, 0, "top-level ops whose nested ops outlast them");
    if (fused)
        T_EXPECT(c.fused_nested > 0, "the fused attention's row ops are not nested");
    free(c.dur);
    free(c.child);
}

// ---- the trace file ---------------------------------------------------------------------------

struct seen {
    int ops_with_shape, blocks_fwd, blocks_bwd, step, forward, backward, loader, optim, alloc,
        counter, main_track, bad_time;
    int linear_flops, fused_op;
};

static void scan_event(const cJSON *e, struct seen *s)
{
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
    const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
    const char *cat = cJSON_GetStringValue(cJSON_GetObjectItem(e, "cat"));
    const cJSON *args = cJSON_GetObjectItem(e, "args");
    if (!name || !ph)
        return;
    if (strcmp(ph, "M") == 0) {
        const char *tn = cJSON_GetStringValue(cJSON_GetObjectItem(args, "name"));
        if (strcmp(name, "thread_name") == 0 && tn && strcmp(tn, "main") == 0)
            s->main_track++;
        return;
    }
    if (strcmp(ph, "C") == 0) {
        s->counter += cJSON_IsNumber(cJSON_GetObjectItem(args, "bytes"));
        return;
    }
    const cJSON *ts = cJSON_GetObjectItem(e, "ts"), *dur = cJSON_GetObjectItem(e, "dur");
    if (!cJSON_IsNumber(ts) || ts->valuedouble < 0 ||
        (strcmp(ph, "X") == 0 && (!cJSON_IsNumber(dur) || dur->valuedouble < 0)))
        s->bad_time++;
    if (!cat)
        return;
    const char *pass = cJSON_GetStringValue(cJSON_GetObjectItem(args, "pass"));
    if (strcmp(cat, "op") == 0) {
        s->ops_with_shape += cJSON_IsString(cJSON_GetObjectItem(args, "shape")) &&
                             cJSON_IsNumber(cJSON_GetObjectItem(args, "bytes"));
        if (strcmp(name, "linear_forward") == 0 &&
            cJSON_IsNumber(cJSON_GetObjectItem(args, "flops")) &&
            cJSON_IsString(cJSON_GetObjectItem(args, "block")) && pass)
            s->linear_flops++;
        s->fused_op += strcmp(name, "attn_fused_forward") == 0;
    } else if (strcmp(cat, "block") == 0 && pass) {
        s->blocks_fwd += strcmp(pass, "forward") == 0;
        s->blocks_bwd += strcmp(pass, "backward") == 0;
    } else if (strcmp(cat, "phase") == 0) {
        s->step += strcmp(name, "step") == 0;
        s->forward += strcmp(name, "forward") == 0;
        s->backward += strcmp(name, "backward") == 0;
    } else if (strcmp(cat, "loader") == 0) {
        s->loader++;
    } else if (strcmp(cat, "optim") == 0) {
        s->optim++;
    } else if (strcmp(cat, "alloc") == 0 && strcmp(ph, "i") == 0) {
        s->alloc++;
    }
}

static void test_trace(bool fused)
{
    char path[512];
    snprintf(path, sizeof path, "%s/trace.json", tmp_root);
    if (qc_profile_trace_write(path) != QC_OK)
        T_FATAL("trace: %s", qc_error_last());
    FILE *f = fopen(path, "rb");
    if (!f)
        T_FATAL("cannot read %s", path);
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len)
        T_FATAL("cannot read %s", path);
    buf[len] = '\0';
    fclose(f);
    cJSON *root = cJSON_Parse(buf);
    T_EXPECT(root != NULL, "the trace is not valid JSON (%ld bytes)", len);
    const cJSON *evs = cJSON_GetObjectItem(root, "traceEvents");
    T_EXPECT(cJSON_IsArray(evs), "no traceEvents array");
    struct seen s = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        scan_event(e, &s);
    }
    printf("  trace: %d events, %d ops with a shape, %d blocks fwd / %d bwd, %d alloc\n",
           cJSON_GetArraySize(evs), s.ops_with_shape, s.blocks_fwd, s.blocks_bwd, s.alloc);
    T_EXPECT_EQ_I64(s.bad_time, 0, "events without a valid ts/dur");
    T_EXPECT(s.main_track == 1, "no \"main\" thread track");
    T_EXPECT(s.ops_with_shape > 100, "ops with shape and bytes: %d", s.ops_with_shape);
    T_EXPECT(s.linear_flops > 10, "linear_forward with FLOPs, block and pass: %d", s.linear_flops);
    T_EXPECT(s.blocks_fwd > 10 && s.blocks_bwd > 10, "blocks fwd %d bwd %d", s.blocks_fwd,
             s.blocks_bwd);
    T_EXPECT(s.step == 2 && s.forward == 2 && s.backward == 2, "phases: step %d fwd %d bwd %d",
             s.step, s.forward, s.backward);
    T_EXPECT(s.loader >= 2, "loader waits: %d", s.loader);
    T_EXPECT(s.optim == 2, "optimizer spans: %d", s.optim);
    T_EXPECT(s.alloc > 10 && s.counter == s.alloc, "allocator events %d, counter points %d",
             s.alloc, s.counter);
    T_EXPECT(fused ? s.fused_op > 0 : s.fused_op == 0, "attn_fused_forward ops: %d", s.fused_op);
    cJSON_Delete(root);
    free(buf);
    remove(path);
}

static void test_summary(void)
{
    const struct qc_profile_peaks pk = {
        .threads = 1, .gemm_n = 1, .gemm_gflops_1 = 1, .gemm_gflops_n = 1, .copy_gbs = 1};
    struct qc_profile_summary *s = NULL;
    if (qc_profile_summary_create(&pk, 2, &s) != QC_OK)
        T_FATAL("summary: %s", qc_error_last());
    cJSON *j = qc_profile_summary_json(s, 10);
    const double step = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "step_s"));
    const double ops = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "ops_s"));
    const double share = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "gemm_share"));
    printf("  summary: step %.3f s, ops %.3f s, GEMM share %.2f\n", step, ops, share);
    T_EXPECT(step > 0 && ops > 0 && ops <= 1.001 * step, "ops %g s in a step of %g s", ops, step);
    T_EXPECT(share > 0 && share < 1, "GEMM share %g", share);
    T_EXPECT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "gemm_shapes")) > 0, "no GEMM shapes");
    cJSON_Delete(j);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
        qc_profile_summary_print(s, devnull, 10);
        fclose(devnull);
    }
    qc_profile_summary_destroy(s);
}

static void test_profile(enum qc_attention_impl attn)
{
    const bool fused = attn == QC_ATTENTION_FUSED;
    struct qc_config cfg;
    tiny_config(&cfg, attn);
    float *off = NULL, *on = NULL;
    int64_t n = 0, n2 = 0;
    qc_prof_reset();
    run_steps(&cfg, "off", false, &off, &n);
    T_EXPECT_EQ_I64(qc_prof_count(), 0, "events recorded with the profiler off");
    run_steps(&cfg, "on", true, &on, &n2);
    T_EXPECT_EQ_I64(n, n2, "parameter counts");
    T_EXPECT(memcmp(off, on, (size_t)(3 * n) * sizeof *off) == 0,
             "profiling changed the bits of the weights or the AdamW state");
    T_EXPECT_EQ_I64(qc_prof_lost(), 0, "events lost");
    test_nesting(fused);
    test_trace(fused);
    test_summary();
    qc_prof_reset();
    free(off);
    free(on);
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/qctrain-test-profile-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        printf("cannot create a temporary folder\n");
        return 1;
    }
    QC_TEST ("profile: fused steps: same bits, trace, nesting, summary") {
        test_profile(QC_ATTENTION_FUSED);
    }
    QC_TEST ("profile: unfused steps: same bits, trace, nesting, summary") {
        test_profile(QC_ATTENTION_UNFUSED);
    }
    t_rm_rf(tmp_root);
    return qc_test_summary();
}
