/*
 * test_report.c — the HTML report's data and limits (src/report), and the step traces train
 * keeps for it (src/train/memory/steptrace.c):
 *   - a 100,000-step run (qc_bench_report_make_run) gives a page under 5 MB whose data has
 *     1000 curve buckets, every eval line, and a timeline whose stacked groups sum to the
 *     allocator's bytes at every point;
 *   - the planner's "plan" object of memory.json reaches the page (and a malformed one is
 *     refused), a memory.json without one gives measured bytes alone;
 *   - missing libraries give a page anyway (tables), missing inputs clear errors;
 *   - the step-trace recorder keeps the first, peak and every-N steps within its bound;
 *   - "What holds the peak": the peak step's live bytes by owner sum to its measured peak, byte
 *     for byte, each holder with its kind and knob (r and dL/dr with model.edge_mode).
 * tests/test_report_run.py renders real pages in a browser.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qc_alloc.h"
#include "qc_cli.h" /* qc_bench_report_make_run */
#include "qc_plan_owners.h"
#include "qc_report.h"
#include "qc_steptrace.h"
#include "testutil.h"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b)
        b[len] = '\0';
    if (n)
        *n = (size_t)len;
    return b;
}

static void put(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        T_FATAL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* The page's data document, parsed. */
static cJSON *page_data(const char *html_path)
{
    char *html = slurp(html_path, NULL);
    if (!html)
        return NULL;
    static const char open[] = "<script type=\"application/json\" id=\"qc-data\">";
    char *a = strstr(html, open);
    char *b = a ? strstr(a, "</script>") : NULL;
    cJSON *d = NULL;
    if (a && b) {
        *b = '\0';
        d = cJSON_Parse(a + sizeof open - 1);
    }
    free(html);
    return d;
}

static const cJSON *at(const cJSON *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cur;
}

static void mkdir_fresh(char *dir, size_t n, const char *name)
{
    snprintf(dir, n, "%s/test_report_%s_%d", QC_BINARY_DIR, name, (int)getpid());
    t_rm_rf(dir);
    if (mkdir(dir, 0755) != 0)
        T_FATAL("mkdir %s", dir);
}

/* Every timeline point: Σ stack = allocated. */
static void check_timeline_identity(const cJSON *tl)
{
    const cJSON *stack = at(tl, "stack"), *alloc = at(tl, "allocated");
    T_EXPECT(cJSON_GetArraySize(stack) == cJSON_GetArraySize(alloc) &&
                 cJSON_GetArraySize(stack) > 0,
             "stack and allocated series (%d, %d points)", cJSON_GetArraySize(stack),
             cJSON_GetArraySize(alloc));
    int bad = 0;
    for (int i = 0; i < cJSON_GetArraySize(stack); i++) {
        double sum = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, cJSON_GetArrayItem(stack, i))
        {
            sum += v->valuedouble;
        }
        if (sum != cJSON_GetArrayItem(alloc, i)->valuedouble)
            bad++;
    }
    T_EXPECT_EQ_I64(bad, 0, "points whose stacked groups do not sum to the allocated bytes");
}

static void test_long_run(void)
{
    char dir[512];
    mkdir_fresh(dir, sizeof dir, "long");
    T_EXPECT(qc_bench_report_make_run(dir, 100000, 40000) == QC_OK, "make run: %s",
             qc_error_last());
    struct qc_report_info info;
    const struct qc_report_opts o = {.run_dir = dir, .step = -1};
    T_EXPECT(qc_report_write(&o, &info) == QC_OK, "report: %s", qc_error_last());
    T_EXPECT(info.bytes < 5u * 1000 * 1000, "the page of a 100,000-step run is %zu bytes (< 5 MB)",
             info.bytes);
    T_EXPECT_EQ_I64(info.metric_lines, 100000, "step lines read");
    T_EXPECT_EQ_I64(info.curve_points, QC_REPORT_CURVE_POINTS, "points per curve");
    T_EXPECT(info.has_plan, "the plan is seen");
    T_EXPECT_EQ_I64(info.timeline_step, 1, "the traced step");
    struct stat sb;
    T_EXPECT(stat(info.path, &sb) == 0 && (size_t)sb.st_size == info.bytes, "file size = info");
    cJSON *d = page_data(info.path);
    T_EXPECT(d != NULL, "the page's data parses as JSON");
    if (!d)
        return;
    T_EXPECT_EQ_I64(cJSON_GetArraySize(at(d, "curves.x")), QC_REPORT_CURVE_POINTS, "buckets");
    T_EXPECT_EQ_I64((int64_t)at(d, "curves.bucket")->valuedouble, 100, "steps per bucket");
    T_EXPECT_EQ_I64((int64_t)at(d, "curves.eval.lines")->valuedouble, 100, "eval lines");
    const cJSON *loss0 = cJSON_GetArrayItem(at(d, "curves.series.loss"), 0);
    T_EXPECT(cJSON_GetArraySize(loss0) == 3 &&
                 cJSON_GetArrayItem(loss0, 0)->valuedouble <=
                     cJSON_GetArrayItem(loss0, 1)->valuedouble &&
                 cJSON_GetArrayItem(loss0, 1)->valuedouble <=
                     cJSON_GetArrayItem(loss0, 2)->valuedouble,
             "a bucket is [min, mean, max]");
    T_EXPECT(at(d, "curves.series.offload_host_bytes") && at(d, "curves.series.recompute_bytes"),
             "the memory fields of the metrics contract are drawn");
    T_EXPECT(at(d, "memory.steps") == NULL, "memory.json's per-step list is not copied");
    T_EXPECT(cJSON_IsObject(at(d, "memory.plan")), "the plan is in the data");
    const cJSON *tl = at(d, "timeline");
    T_EXPECT(cJSON_GetArraySize(at(tl, "x")) <= QC_REPORT_TIMELINE_POINTS, "timeline points");
    T_EXPECT((int64_t)at(tl, "merged")->valuedouble > 1, "40,000 events are merged");
    check_timeline_identity(tl);
    cJSON_Delete(d);
    t_rm_rf(dir);
}

static const char memory_json_head[] =
    "{\"format\": \"qctrain-memory-report\", \"version\": 1, \"device\": \"cuda\", \"step\": 3, "
    "\"total_steps\": 3, \"budget_bytes\": 1073741824, \"params_grads_bytes\": 1000, "
    "\"peak_rss_bytes\": 5000,\n\"allocator\": {\"bytes_allocated_peak\": 900000000, "
    "\"bytes_reserved_peak\": 950000000, \"fragmentation\": 1.055556, \"n_ooms\": 0},\n"
    "\"peak\": {\"step\": 2, \"bytes_allocated_peak\": 900000000, \"snapshot_bytes_allocated\": "
    "900000000, \"blocks\": 2, \"tags\": 2, \"by_block\": [{\"name\": \"decoder\", \"bytes\": "
    "600000000, \"allocations\": 4, \"share\": 0.666667, \"other\": false}, {\"name\": "
    "\"encoder.agent_encoder.a2a_attn_layers.0\", \"bytes\": 300000000, \"allocations\": 2, "
    "\"share\": 0.333333, \"other\": false}], \"by_tag\": []}";

static void test_plan(void)
{
    char dir[512];
    mkdir_fresh(dir, sizeof dir, "plan");
    char mem[4096];
    snprintf(mem, sizeof mem, "%s,\n\"plan\": %s}\n", memory_json_head,
             "{\"step\": 2, \"predicted_peak_bytes\": 880000000, \"measured_peak_bytes\": "
             "900000000, \"blocks\": [{\"name\": \"decoder\", \"policy\": \"recompute\", "
             "\"bytes\": 590000000, \"predicted_time_s\": 0.012}, {\"name\": "
             "\"encoder.agent_encoder.a2a_attn_layers.0\", \"policy\": \"offload_host\", "
             "\"bytes\": 290000000, \"predicted_time_s\": 0.004}]}");
    put(dir, "memory.json", mem);
    struct qc_report_info info;
    const struct qc_report_opts o = {.run_dir = dir, .step = -1, .js_dir = "/nonexistent"};
    T_EXPECT(qc_report_write(&o, &info) == QC_OK, "report: %s", qc_error_last());
    T_EXPECT(info.has_plan, "has_plan");
    T_EXPECT(!info.dygraphs && !info.chartjs, "no libraries under /nonexistent");
    T_EXPECT_EQ_I64(info.timeline_step, -1, "no trace, no timeline");
    cJSON *d = page_data(info.path);
    T_EXPECT(d != NULL, "data parses");
    if (d) {
        const cJSON *b1 = cJSON_GetArrayItem(at(d, "memory.plan.blocks"), 1);
        T_EXPECT(b1 && strcmp(at(b1, "policy")->valuestring, "offload_host") == 0 &&
                     at(b1, "bytes")->valuedouble == 290000000.0,
                 "the plan's blocks reach the page");
        T_EXPECT(!cJSON_IsTrue(at(d, "libs.dygraphs.found")), "libs.dygraphs.found false");
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(
            at(d, "groups_of_blocks"), "encoder.agent_encoder.a2a_attn_layers.0");
        T_EXPECT(cJSON_IsString(g) && strcmp(g->valuestring, "agent encoder: a2a") == 0,
                 "block group of an a2a layer");
        cJSON_Delete(d);
    }
    /* no plan: measured bytes alone */
    snprintf(mem, sizeof mem, "%s}\n", memory_json_head);
    put(dir, "memory.json", mem);
    T_EXPECT(qc_report_write(&o, &info) == QC_OK && !info.has_plan, "no plan: %s", qc_error_last());
    /* a malformed plan is refused, naming the file */
    snprintf(mem, sizeof mem, "%s, \"plan\": {\"step\": 2}}\n", memory_json_head);
    put(dir, "memory.json", mem);
    T_EXPECT(qc_report_write(&o, &info) == QC_ERR_INVALID, "plan without blocks refused");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "memory.json");
    t_rm_rf(dir);
}

static void test_errors(void)
{
    char dir[512];
    mkdir_fresh(dir, sizeof dir, "errors");
    struct qc_report_info info;
    const struct qc_report_opts o = {.run_dir = dir, .step = -1};
    T_EXPECT(qc_report_write(&o, &info) == QC_ERR_INVALID, "no memory.json");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "memory.json not found");
    put(dir, "memory.json", "{\"format\": \"qctrain-memory-report\", \"peak\": ");
    T_EXPECT(qc_report_write(&o, &info) == QC_ERR_INVALID, "cut memory.json");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "not valid JSON");
    put(dir, "memory.json", "{\"format\": \"something else\"}");
    T_EXPECT(qc_report_write(&o, &info) == QC_ERR_INVALID, "not a memory report");
    char mem[4096];
    snprintf(mem, sizeof mem, "%s}\n", memory_json_head);
    put(dir, "memory.json", mem);
    const struct qc_report_opts o7 = {.run_dir = dir, .step = 7};
    T_EXPECT(qc_report_write(&o7, &info) == QC_ERR_INVALID, "--step without a trace");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "no allocation trace");
    /* a cut metrics line (a crash) is skipped, the rest drawn */
    put(dir, "metrics.jsonl",
        "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":2.25}\n{\"step\":3,\"lo");
    T_EXPECT(qc_report_write(&o, &info) == QC_OK, "report: %s", qc_error_last());
    T_EXPECT_EQ_I64(info.metric_lines, 2, "whole lines read");
    t_rm_rf(dir);
}

/* Steps 1..10 of a host allocator; the step's allocation grows to a peak at step `peak_at`. */
static void run_steps(struct qc_alloc *a, struct qc_steptrace *tr, int from, int to, int peak_at,
                      size_t big)
{
    for (int s = from; s <= to; s++) {
        qc_alloc_set_step(a, s);
        qc_alloc_reset_peak(a);
        qc_steptrace_begin(tr, s);
        void *p = NULL, *q = NULL;
        T_EXPECT(qc_alloc_malloc(a, (size_t)s * 4096, NULL, "decoder/x", &p) == QC_OK, "alloc");
        T_EXPECT(qc_alloc_malloc(a, s == peak_at ? big : 4096, NULL, "scratch/y", &q) == QC_OK,
                 "alloc");
        qc_alloc_free(a, q, NULL);
        qc_alloc_free(a, p, NULL);
        struct qc_alloc_stats st;
        qc_alloc_stats_get(a, &st);
        T_EXPECT(qc_steptrace_end(tr, st.bytes_allocated_peak, st.bytes_reserved_peak) == QC_OK,
                 "end: %s", qc_error_last());
    }
}

static bool has_file(const char *dir, int step)
{
    char p[600];
    snprintf(p, sizeof p, "%s/trace/step-%06d.qctrace", dir, step);
    return access(p, F_OK) == 0;
}

static void test_steptrace(void)
{
    char dir[512];
    mkdir_fresh(dir, sizeof dir, "trace");
    struct qc_alloc_params p;
    qc_alloc_params_default(&p);
    p.trace = true;
    struct qc_alloc *a = NULL;
    T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_OK, "allocator");
    void *params = NULL;
    T_EXPECT(qc_alloc_malloc(a, 1 << 20, NULL, "params", &params) == QC_OK, "params");
    struct qc_steptrace *tr = NULL;
    T_EXPECT(qc_steptrace_create(a, dir, 4, 64ull << 20, &tr) == QC_OK, "create");
    run_steps(a, tr, 1, 10, 6, 8 << 20);
    /* first: 1, 2; every 4: 4, 8; peak: 6 */
    const int kept[] = {1, 2, 4, 6, 8};
    for (int s = 1; s <= 10; s++) {
        bool want = false;
        for (int i = 0; i < 5; i++)
            want |= kept[i] == s;
        T_EXPECT(has_file(dir, s) == want, "step %d %s", s, want ? "kept" : "not kept");
    }
    /* a higher peak at step 11 replaces 6 */
    run_steps(a, tr, 11, 11, 11, 16 << 20);
    T_EXPECT(!has_file(dir, 6) && has_file(dir, 11), "the peak moved from step 6 to 11");
    char path[600];
    snprintf(path, sizeof path, "%s/trace/index.json", dir);
    char *idx = slurp(path, NULL);
    cJSON *j = idx ? cJSON_Parse(idx) : NULL;
    T_EXPECT(cJSON_GetArraySize(at(j, "steps")) == 5, "index lists 5 steps");
    const cJSON *last = cJSON_GetArrayItem(at(j, "steps"), 4);
    T_EXPECT(last && at(last, "step")->valuedouble == 11 &&
                 at(last, "bytes_allocated_at_begin")->valuedouble == (double)(1 << 20),
             "step 11: what was live at its start (the params)");
    const cJSON *live = cJSON_GetArrayItem(at(last, "live_at_begin"), 0);
    T_EXPECT(live && strcmp(at(live, "name")->valuestring, "params") == 0, "live block: params");
    cJSON_Delete(j);
    free(idx);
    /* the step file holds that step's events, in the documented format */
    snprintf(path, sizeof path, "%s/trace/step-000011.qctrace", dir);
    struct qc_alloc_event *ev = NULL;
    size_t n = 0;
    T_EXPECT(qc_alloc_trace_load(path, &ev, &n) == QC_OK, "load: %s", qc_error_last());
    int allocs = 0, wrong = 0;
    for (size_t i = 0; i < n; i++) {
        allocs += ev[i].kind == QC_ALLOC_EV_ALLOC;
        wrong += ev[i].step != 11;
    }
    T_EXPECT(allocs == 2 && wrong == 0, "step 11's file: %d allocs, %d events of other steps",
             allocs, wrong);
    free(ev);
    /* the report of this folder: a timeline of step 11 whose stack sums to the allocated bytes */
    char mem[4096];
    snprintf(mem, sizeof mem, "%s}\n", memory_json_head);
    put(dir, "memory.json", mem);
    struct qc_report_info info;
    const struct qc_report_opts o = {.run_dir = dir, .step = -1};
    T_EXPECT(qc_report_write(&o, &info) == QC_OK && info.timeline_step == 11, "peak step shown");
    const struct qc_report_opts o4 = {.run_dir = dir, .step = 4};
    T_EXPECT(qc_report_write(&o4, &info) == QC_OK && info.timeline_step == 4, "--step 4");
    cJSON *d = page_data(info.path);
    if (d)
        check_timeline_identity(at(d, "timeline"));
    cJSON_Delete(d);
    const struct qc_report_opts o5 = {.run_dir = dir, .step = 5};
    T_EXPECT(qc_report_write(&o5, &info) == QC_ERR_INVALID, "--step 5 has no trace");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "1, 2, 4, 8, 11");
    /* a step file gone missing: the default page goes without a timeline, --step fails */
    snprintf(path, sizeof path, "%s/trace/step-000011.qctrace", dir);
    unlink(path);
    T_EXPECT(qc_report_write(&o, &info) == QC_OK && info.timeline_step == -1,
             "missing peak trace: page without a timeline (%s)", qc_error_last());
    const struct qc_report_opts o11 = {.run_dir = dir, .step = 11};
    T_EXPECT(qc_report_write(&o11, &info) == QC_ERR_IO, "--step 11 without its file");
    T_EXPECT_STR_CONTAINS(qc_error_last(), "step-000011.qctrace");
    qc_steptrace_destroy(tr);
    /* the bound: with room for about two step files, the oldest "every" steps go first and the
     * first and peak steps stay */
    char dir2[512];
    mkdir_fresh(dir2, sizeof dir2, "bound");
    T_EXPECT(qc_steptrace_create(a, dir2, 1, 64 + 4 * 128 * 4 + 600, &tr) == QC_OK, "create");
    run_steps(a, tr, 1, 6, 1, 8 << 20);
    T_EXPECT(has_file(dir2, 1) && has_file(dir2, 2) && has_file(dir2, 6) && !has_file(dir2, 3),
             "steps 1 (first, peak), 2 (first) and 6 (the newest every-step) kept, 3 dropped");
    qc_steptrace_destroy(tr);
    qc_alloc_free(a, params, NULL);
    qc_alloc_destroy(a);
    t_rm_rf(dir);
    t_rm_rf(dir2);
}

/* A tensor tag of 60 bytes (QCNet's longest are about that) is kept whole by the statistics
 * and by the trace (it was cut at 47). */
static void test_long_tag(void)
{
    char dir[512];
    mkdir_fresh(dir, sizeof dir, "tag");
    struct qc_alloc_params p;
    qc_alloc_params_default(&p);
    p.trace = true;
    struct qc_alloc *a = NULL;
    T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_OK, "allocator");
    static const char tag[] = "encoder.agent_encoder.pl2a_attn_layers.0/backward_post.scratch";
    T_EXPECT(strlen(tag) == 62, "a 62-byte tag (%zu)", strlen(tag));
    struct qc_steptrace *tr = NULL;
    T_EXPECT(qc_steptrace_create(a, dir, 0, 64ull << 20, &tr) == QC_OK, "create");
    qc_alloc_set_step(a, 1);
    qc_alloc_reset_peak(a);
    qc_steptrace_begin(tr, 1);
    void *q = NULL;
    T_EXPECT(qc_alloc_malloc(a, 1 << 20, NULL, tag, &q) == QC_OK, "alloc");
    struct qc_alloc_peak_snapshot snap;
    qc_alloc_peak_snapshot(a, &snap);
    bool found = false;
    for (uint32_t i = 0; i < snap.ntop_tags; i++)
        found |= strcmp(snap.tags[i].name, tag) == 0;
    T_EXPECT(found, "the peak snapshot names the whole tag");
    qc_alloc_free(a, q, NULL);
    struct qc_alloc_stats st;
    qc_alloc_stats_get(a, &st);
    T_EXPECT(qc_steptrace_end(tr, st.bytes_allocated_peak, st.bytes_reserved_peak) == QC_OK, "end");
    char path[600];
    snprintf(path, sizeof path, "%s/trace/step-000001.qctrace", dir);
    struct qc_alloc_event *ev = NULL;
    size_t n = 0;
    T_EXPECT(qc_alloc_trace_load(path, &ev, &n) == QC_OK, "load: %s", qc_error_last());
    int whole = 0;
    for (size_t i = 0; i < n; i++)
        whole += ev[i].kind == QC_ALLOC_EV_ALLOC && strcmp(ev[i].tag, tag) == 0;
    T_EXPECT(whole == 1, "the trace's alloc event holds the whole tag (%d)", whole);
    free(ev);
    qc_steptrace_destroy(tr);
    qc_alloc_destroy(a);
    t_rm_rf(dir);
}

/* Steps that ran out of memory keep their trace whatever alloc.trace_every says, and the
 * report opens on the worst of them (then on the step a run failed at), listing the others. */
static void test_steptrace_oom(void)
{
    char dir[512];
    mkdir_fresh(dir, sizeof dir, "oom");
    struct qc_alloc_params p;
    qc_alloc_params_default(&p);
    p.trace = true;
    struct qc_alloc *a = NULL;
    T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_OK, "allocator");
    struct qc_steptrace *tr = NULL;
    T_EXPECT(qc_steptrace_create(a, dir, 0, 64ull << 20, &tr) == QC_OK, "create");
    /* steps 1..6, the peak at step 3; steps 4 and 5 re-planned 1 and 3 groups */
    for (int s = 1; s <= 6; s++) {
        qc_alloc_set_step(a, s);
        qc_alloc_reset_peak(a);
        qc_steptrace_begin(tr, s);
        void *q = NULL;
        T_EXPECT(qc_alloc_malloc(a, s == 3 ? 8 << 20 : 4096, NULL, "scratch/y", &q) == QC_OK,
                 "alloc");
        qc_alloc_free(a, q, NULL);
        qc_steptrace_mark_replans(tr, s == 4 ? 1 : s == 5 ? 3 : 0);
        struct qc_alloc_stats st;
        qc_alloc_stats_get(a, &st);
        T_EXPECT(qc_steptrace_end(tr, st.bytes_allocated_peak, st.bytes_reserved_peak) == QC_OK,
                 "end: %s", qc_error_last());
    }
    for (int s = 1; s <= 6; s++)
        T_EXPECT(has_file(dir, s) == (s != 6), "step %d %s (trace_every 0)", s,
                 s != 6 ? "kept" : "not kept");
    char mem[4096];
    snprintf(mem, sizeof mem, "%s}\n", memory_json_head);
    put(dir, "memory.json", mem);
    struct qc_report_info info;
    const struct qc_report_opts o = {.run_dir = dir, .step = -1};
    T_EXPECT(qc_report_write(&o, &info) == QC_OK && info.timeline_step == 5,
             "the page opens on step 5, the worst out-of-memory step, not the peak step 3 (%lld)",
             (long long)info.timeline_step);
    cJSON *d = page_data(info.path);
    int ooms = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, at(at(d, "timeline"), "available"))
    {
        const cJSON *r;
        cJSON_ArrayForEach(r, at(e, "reasons")) ooms += strcmp(r->valuestring, "oom") == 0;
    }
    T_EXPECT(ooms == 2, "steps 4 and 5 listed as out of memory (%d)", ooms);
    T_EXPECT(
        at(cJSON_GetArrayItem(at(at(d, "timeline"), "available"), 4), "replans") &&
            at(cJSON_GetArrayItem(at(at(d, "timeline"), "available"), 4), "replans")->valuedouble ==
                3,
        "step 5: 3 re-plans");
    cJSON_Delete(d);
    /* a step that fails: kept, and shown first */
    qc_alloc_set_step(a, 7);
    qc_alloc_reset_peak(a);
    qc_steptrace_begin(tr, 7);
    struct qc_alloc_stats st;
    qc_alloc_stats_get(a, &st);
    T_EXPECT(qc_steptrace_end_failed(tr, st.bytes_allocated_peak, st.bytes_reserved_peak) == QC_OK,
             "end failed");
    T_EXPECT(qc_report_write(&o, &info) == QC_OK && info.timeline_step == 7,
             "the page opens on the failed step 7 (%lld)", (long long)info.timeline_step);
    qc_steptrace_destroy(tr);
    qc_alloc_destroy(a);
    t_rm_rf(dir);
}

/* The row of the holders named name, or NULL. */
static const cJSON *holder(const cJSON *h, const char *name)
{
    const cJSON *r;
    cJSON_ArrayForEach(r, at(h, "rows"))
    {
        const cJSON *nm = at(r, "name");
        if (cJSON_IsString(nm) && strcmp(nm->valuestring, name) == 0)
            return r;
    }
    return NULL;
}

static bool str_is(const cJSON *o, const char *key, const char *want)
{
    const cJSON *v = at(o, key);
    return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

/* The knob the page shows for an owner key. */
static const char *owner_knob(const cJSON *h, const char *owner)
{
    const cJSON *o;
    cJSON_ArrayForEach(o, at(h, "owners"))
    {
        if (str_is(o, "key", owner))
            return cJSON_GetStringValue(at(o, "knob"));
    }
    return "";
}

static double sum_of(const cJSON *arr_or_obj, const char *key)
{
    double s = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr_or_obj)
    {
        s += key ? cJSON_GetNumberValue(at(e, key)) : cJSON_GetNumberValue(e);
    }
    return s;
}

/* What holds the peak: the peak step's live bytes by owner add up to the step's measured peak,
 * byte for byte, and the edge set's r and dL/dr are named with model.edge_mode. */
static void test_holders(void)
{
    char dir[512];
    mkdir_fresh(dir, sizeof dir, "holders");
    struct qc_alloc_params p;
    qc_alloc_params_default(&p);
    p.trace = true;
    struct qc_alloc *a = NULL;
    T_EXPECT(qc_alloc_create(NULL, &p, &a) == QC_OK, "allocator");
    /* before the step: parameters, gradients, moments, and a spare the step frees */
    void *params = NULL, *grads = NULL, *moments = NULL, *spare = NULL;
    T_EXPECT(qc_alloc_malloc(a, 1 << 20, NULL, "params", &params) == QC_OK, "params");
    T_EXPECT(qc_alloc_malloc(a, 1 << 20, NULL, "grads", &grads) == QC_OK, "grads");
    T_EXPECT(qc_alloc_malloc(a, 2 << 20, NULL, "optim/exp_avg", &moments) == QC_OK, "moments");
    T_EXPECT(qc_alloc_malloc(a, 64 << 10, NULL, "optim/spare", &spare) == QC_OK, "spare");
    struct qc_steptrace *tr = NULL;
    T_EXPECT(qc_steptrace_create(a, dir, 0, 64ull << 20, &tr) == QC_OK, "create");
    qc_alloc_set_step(a, 1);
    qc_alloc_reset_peak(a);
    qc_steptrace_begin(tr, 1);
    qc_alloc_free(a, spare, NULL); /* a block of before the step, freed in it */
    static const struct {
        const char *tag;
        size_t bytes;
    } step[] = {
        {"batch/nodes", 300000},
        {"edges/pl2a.r", 3 << 20},
        {"edges.pl2a/edges.dr", 3 << 20},
        {"enc.l0/app0.stash", 2 << 20},
        {"enc.l0/kv", 1 << 20},
        {"dec.l1/app5.stash", 512 << 10},
        {"grad/x_a", 256 << 10},
        {"dec.l1/out.tmp", 1 << 20}, /* freed before the peak */
        {"dec.l1/fused_tile.scratch", 4 << 20},
    };
    enum { NSTEP = sizeof step / sizeof step[0] };
    void *ptr[NSTEP] = {0};
    for (int i = 0; i < NSTEP; i++) {
        T_EXPECT(qc_alloc_malloc(a, step[i].bytes, NULL, step[i].tag, &ptr[i]) == QC_OK, "%s",
                 step[i].tag);
        if (i == NSTEP - 2)
            qc_alloc_free(a, ptr[i], NULL), ptr[i] = NULL;
    }
    struct qc_alloc_stats st;
    qc_alloc_stats_get(a, &st);
    const uint64_t peak = st.bytes_allocated_peak;
    const uint64_t usable_params = qc_alloc_usable_size(a, params);
    const uint64_t usable_moments = qc_alloc_usable_size(a, moments);
    for (int i = NSTEP - 1; i >= 0; i--)
        if (ptr[i])
            qc_alloc_free(a, ptr[i], NULL);
    qc_alloc_stats_get(a, &st);
    T_EXPECT(qc_steptrace_end(tr, st.bytes_allocated_peak, st.bytes_reserved_peak) == QC_OK,
             "end: %s", qc_error_last());
    char mem[4096];
    snprintf(mem, sizeof mem,
             "{\"format\": \"qctrain-memory-report\", \"version\": 1, \"device\": \"cpu\", "
             "\"step\": 1, \"total_steps\": 1, \"allocator\": {\"bytes_allocated_peak\": %llu}, "
             "\"peak\": {\"step\": 1, \"by_block\": [], \"by_tag\": []}}\n",
             (unsigned long long)peak);
    put(dir, "memory.json", mem);
    struct qc_report_info info;
    const struct qc_report_opts o = {.run_dir = dir, .step = -1, .js_dir = "/nonexistent"};
    T_EXPECT(qc_report_write(&o, &info) == QC_OK, "report: %s", qc_error_last());
    cJSON *d = page_data(info.path);
    const cJSON *h = at(d, "holders");
    T_EXPECT(cJSON_IsObject(h), "the page's data has the holders of the peak step");
    if (!cJSON_IsObject(h)) {
        cJSON_Delete(d);
        return;
    }
    T_EXPECT(at(h, "step")->valuedouble == 1, "step 1");
    T_EXPECT_EQ_U64((uint64_t)at(h, "peak_bytes")->valuedouble, peak,
                    "the holders' peak is the step's allocator peak");
    T_EXPECT_EQ_U64((uint64_t)at(h, "step_peak_bytes")->valuedouble, peak, "index's step peak");
    /* the total check: every owner class is in the sum, and nothing else */
    T_EXPECT_EQ_U64((uint64_t)sum_of(at(h, "rows"), "bytes"), peak, "Σ rows = the measured peak");
    T_EXPECT_EQ_U64((uint64_t)sum_of(at(h, "by_kind"), NULL), peak, "Σ by kind = the peak");
    T_EXPECT_EQ_U64((uint64_t)sum_of(at(h, "by_owner"), NULL), peak, "Σ by owner = the peak");
    T_EXPECT(str_is(h, "block", "dec.l1") && str_is(h, "tag", "dec.l1/fused_tile.scratch"),
             "the op running at the peak");
    const cJSON *r = holder(h, "r of edge set pl2a");
    T_EXPECT(r && str_is(r, "owner", "edge_r") && str_is(r, "kind", "stash") &&
                 cJSON_IsTrue(at(r, "movable")) && at(r, "bytes")->valuedouble == (double)(3 << 20),
             "r of edge set pl2a: a stash of 3 MiB a policy can move");
    T_EXPECT_STR_CONTAINS(owner_knob(h, "edge_r"), "model.edge_mode=tiled");
    r = holder(h, "dL/dr of edge set pl2a");
    T_EXPECT(r && str_is(r, "owner", "edge_dr") && str_is(r, "kind", "tensor") &&
                 cJSON_IsFalse(at(r, "movable")),
             "dL/dr of edge set pl2a: a tensor no policy moves");
    T_EXPECT_STR_CONTAINS(owner_knob(h, "edge_dr"), "model.edge_mode=tiled");
    r = holder(h, "parameters");
    T_EXPECT(r && str_is(r, "kind", "fixed") &&
                 (uint64_t)at(r, "bytes")->valuedouble == usable_params,
             "parameters: fixed, their bytes");
    T_EXPECT_STR_CONTAINS(owner_knob(h, "parameters"), "model.");
    r = holder(h, "AdamW moments");
    T_EXPECT(r && (uint64_t)at(r, "bytes")->valuedouble == usable_moments,
             "moments: the spare freed in the step is not counted");
    T_EXPECT_STR_CONTAINS(owner_knob(h, "moments"), "dist.zero_stage");
    r = holder(h, "staged batch");
    T_EXPECT(r && str_is(r, "kind", "fixed"), "the staged batch is fixed");
    T_EXPECT_STR_CONTAINS(owner_knob(h, "batch"), "train.batch_size");
    r = holder(h, "dec.l1/fused_tile.scratch");
    T_EXPECT(r && str_is(r, "owner", "working_set") && str_is(r, "kind", "working_set"),
             "the op's scratch is its working set");
    r = holder(h, "stash of dec.l1/app5");
    T_EXPECT(r && str_is(r, "kind", "stash_read") && cJSON_IsFalse(at(r, "movable")),
             "the running block's stash is read there: no policy moves it");
    r = holder(h, "stash of enc.l0/app0");
    T_EXPECT(r && str_is(r, "kind", "stash") && cJSON_IsTrue(at(r, "movable")),
             "another block's stash: a policy moves it");
    T_EXPECT(holder(h, "stash of enc.l0/kv") != NULL, "a source context's kv is a stash");
    r = holder(h, "grad/x_a");
    T_EXPECT(r && str_is(r, "owner", "activation_gradients"), "activation gradients");
    T_EXPECT(holder(h, "dec.l1/out.tmp") == NULL, "freed before the peak: not a holder");
    cJSON_Delete(d);
    /* the tag reader: a tag cut at 63 bytes inside ".stash" is still a stash */
    char name[128];
    static const char cut[] = "encoder.agent_encoder.pl2a_attn_layers.0/app3456789012345678.st";
    T_EXPECT(strlen(cut) == 63, "a 63-byte tag");
    T_EXPECT(qc_plan_owner_of_tag(cut, name, sizeof name) == QC_PLAN_OWNER_STASH &&
                 strstr(name, "stash of encoder.agent_encoder.pl2a_attn_layers.0/app3"),
             "a cut stash tag: %s", name);
    T_EXPECT(qc_plan_owner_of_tag("", name, sizeof name) == QC_PLAN_OWNER_TENSOR, "untagged");
    /* no trace of the peak step: no holders, a note, and the page still written */
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/trace/step-000001.qctrace");
    unlink(dir);
    dir[strlen(dir) - strlen("/trace/step-000001.qctrace")] = '\0';
    T_EXPECT(qc_report_write(&o, &info) == QC_OK, "report without the trace: %s", qc_error_last());
    d = page_data(info.path);
    T_EXPECT(cJSON_IsNull(at(d, "holders")), "no trace: holders null");
    cJSON_Delete(d);
    qc_steptrace_destroy(tr);
    qc_alloc_free(a, moments, NULL);
    qc_alloc_free(a, grads, NULL);
    qc_alloc_free(a, params, NULL);
    qc_alloc_destroy(a);
    t_rm_rf(dir);
}

int main(void)
{
    QC_TEST ("report: a 100,000-step run gives a page under 5 MB, data within its bounds")
        test_long_run();
    QC_TEST ("report: the plan of memory.json reaches the page; none, or malformed")
        test_plan();
    QC_TEST ("report: missing and malformed inputs")
        test_errors();
    QC_TEST ("report: step traces kept (first, peak, every N) within the bound")
        test_steptrace();
    QC_TEST ("report: out-of-memory steps kept whatever trace_every; the page opens on the worst, "
             "then on a failed step")
        test_steptrace_oom();
    QC_TEST ("report: tensor tags up to 63 bytes are kept whole (statistics and trace)")
        test_long_tag();
    QC_TEST ("report: what holds the peak: the peak step's bytes by owner sum to its measured "
             "peak; r and dL/dr of an edge set named with model.edge_mode")
        test_holders();
    return qc_test_summary();
}
