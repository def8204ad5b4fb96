/*
 * report_timeline.c — the "timeline" object of the report: allocated and reserved bytes over
 * one training step, from RUN/trace/index.json and the step's trace file (docs/TRACE.md): by
 * default the step the run failed at, else the step that ran out of memory worst (failed
 * allocations + re-plans), else the peak step.
 *
 * Attribution: every allocator block (the tag's prefix, qc_alloc_tag_block) belongs to one
 * display group (report_block_group). The step starts with the index's live_at_begin bytes per
 * block (what earlier steps left live: parameters, gradients, AdamW moments, a staged batch);
 * an alloc event adds its rounded size to its block's group, a free subtracts the size recorded
 * at its alloc, or, for a block allocated before the step, the size the free event carries from
 * the group of its tag (free events carry the tag). The stacked groups then sum to the event's
 * bytes_allocated; "unattributed" holds any difference (live_at_begin keeps 32 blocks by name
 * and the rest as "other": their frees cannot be told apart), so the stack always sums to the
 * allocator's figure.
 *
 * Points: one per alloc / free / map / unmap / oom event (and any later kind), x = ms since the
 * step began. Beyond QC_REPORT_TIMELINE_POINTS, consecutive events are merged into one point
 * per bucket: the event with the most allocated bytes (peaks stay visible). Output:
 *   "timeline": {"step": S, "reasons": [...],
 *     "available": [{"step", "oom_events", "replans", "bytes_allocated_peak", "reasons"}...],
 *     "budget": B, "events": E, "events_lost": L, "merged": M, "duration_ms": D,
 *     "groups": [...], "x": [ms...], "stack": [[bytes per group]...], "allocated": [...],
 *     "reserved": [...], "ev": [[kind, tag index, size]...], "tags": [...],
 *     "marks": [{"x": ms, "kind": "oom", "tag": "...", "size": N}...],
 *     "live_at_begin": [{"name","bytes"}...]}
 */
#include "report_internal.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_alloc.h"

// ---- block groups -----------------------------------------------------------------------------

static const char *const groups[] = {
    "parameters + gradients",
    "optimizer",
    "batch + graph",
    "map encoder",
    "agent encoder: embedding",
    "agent encoder: t",
    "agent encoder: pl2a",
    "agent encoder: a2a",
    "decoder",
    "loss",
    "activation gradients",
    "scratch",
    "other",
    "unattributed",
};
#define NGROUPS            ((int)(sizeof groups / sizeof groups[0]))
#define GROUP_OTHER        (NGROUPS - 2)
#define GROUP_UNATTRIBUTED (NGROUPS - 1)

const char *const *report_block_groups(int *n)
{
    *n = NGROUPS;
    return groups;
}

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int group_index(const char *block)
{
    static const char agent[] = "encoder.agent_encoder.";
    if (strcmp(block, "params") == 0 || strcmp(block, "grads") == 0)
        return 0;
    if (starts(block, "optim"))
        return 1;
    if (starts(block, "batch") || starts(block, "graph") || starts(block, "edges"))
        return 2;
    if (starts(block, "encoder.map_encoder"))
        return 3;
    if (starts(block, agent)) {
        const char *r = block + sizeof agent - 1;
        if (starts(r, "t_attn"))
            return 5;
        if (starts(r, "pl2a"))
            return 6;
        if (starts(r, "a2a"))
            return 7;
        return 4;
    }
    if (starts(block, "decoder"))
        return 8;
    if (starts(block, "loss"))
        return 9;
    if (strcmp(block, "grad") == 0)
        return 10;
    if (starts(block, "scratch"))
        return 11;
    return GROUP_OTHER;
}

const char *report_block_group(const char *block)
{
    return groups[group_index(block)];
}

static int group_of_tag(const char *tag)
{
    char blk[QC_ALLOC_TAG_MAX];
    qc_alloc_tag_block(tag[0] ? tag : "(untagged)", blk);
    return group_index(blk);
}

// ---- live blocks of the step ------------------------------------------------------------------

/* addr -> (group, size) of the blocks allocated during the step: open addressing. */
struct live_map {
    uint64_t *addr; /* 0 = empty slot, UINT64_MAX = deleted */
    int32_t *group;
    uint64_t *size;
    size_t cap;
};

static bool live_init(struct live_map *m, size_t n)
{
    m->cap = 64;
    while (m->cap < 2 * n + 16)
        m->cap *= 2;
    m->addr = calloc(m->cap, sizeof *m->addr);
    m->group = calloc(m->cap, sizeof *m->group);
    m->size = calloc(m->cap, sizeof *m->size);
    return m->addr && m->group && m->size;
}

static void live_free(struct live_map *m)
{
    free(m->addr);
    free(m->group);
    free(m->size);
}

static size_t live_slot(const struct live_map *m, uint64_t addr, bool for_insert)
{
    size_t i = (size_t)((addr >> 9) * 0x9e3779b97f4a7c15ull) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        if (m->addr[i] == addr || m->addr[i] == 0 || (for_insert && m->addr[i] == UINT64_MAX))
            return i;
    }
}

// ---- the document -----------------------------------------------------------------------------

/* Reads RUN/trace/index.json; NULL (and a note) when there is none. */
static enum qc_status load_index(const char *run_dir, struct report_notes *notes, cJSON **out)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/trace/index.json", run_dir);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno != ENOENT)
            return qc_errorf(QC_ERR_IO, "report: %s: %s", path, strerror(errno));
        report_note(notes, "No allocation trace in the run folder (trace/index.json): no "
                           "timeline. train keeps one unless alloc.trace=false or "
                           "alloc.trace_max_bytes=0.");
        return QC_OK;
    }
    char *text = NULL;
    size_t len = 0;
    char chunk[8192];
    size_t got;
    enum qc_status st = QC_OK;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        char *p = realloc(text, len + got + 1);
        if (!p) {
            st = qc_errorf(QC_ERR_NOMEM, "report: out of memory reading %s", path);
            break;
        }
        text = p;
        memcpy(text + len, chunk, got);
        len += got;
    }
    fclose(f);
    if (st != QC_OK) {
        free(text);
        return st;
    }
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, "steps"))) {
        cJSON_Delete(root);
        return qc_errorf(QC_ERR_INVALID,
                         "report: %s: not a trace index (no \"steps\" array)\nhint: remove the "
                         "trace folder, or run train again to write it",
                         path);
    }
    *out = root;
    return QC_OK;
}

static bool has_reason(const cJSON *entry, const char *reason)
{
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(entry, "reasons"))
    {
        if (cJSON_IsString(r) && strcmp(r->valuestring, reason) == 0)
            return true;
    }
    return false;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : 0.0;
}

/* Interned tags of the shown events. */
struct tags {
    char (*name)[64]; /* struct qc_alloc_event.tag */
    int n, cap;
};

static int tag_index(struct tags *t, const char *tag)
{
    for (int i = t->n - 1; i >= 0; i--) /* recent tags repeat: search from the end */
        if (strcmp(t->name[i], tag) == 0)
            return i;
    if (t->n == t->cap) {
        const int cap = t->cap ? 2 * t->cap : 256;
        char(*p)[64] = realloc(t->name, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        t->name = p;
        t->cap = cap;
    }
    snprintf(t->name[t->n], sizeof t->name[t->n], "%s", tag);
    return t->n++;
}

static bool shown_kind(uint16_t kind)
{
    return kind != QC_ALLOC_EV_READY && kind != QC_ALLOC_EV_STEP;
}

/* The points and marks of one step's events. */
static enum qc_status timeline_points(const struct qc_alloc_event *ev, size_t n, uint64_t t0,
                                      const cJSON *live_at_begin, struct qc_strbuf *b)
{
    int64_t g[NGROUPS] = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, live_at_begin)
    {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (cJSON_IsString(nm))
            g[group_index(nm->valuestring)] += (int64_t)num(e, "bytes");
    }
    size_t nshown = 0;
    for (size_t i = 0; i < n; i++)
        nshown += shown_kind(ev[i].kind);
    const size_t per = nshown > QC_REPORT_TIMELINE_POINTS
                           ? (nshown + QC_REPORT_TIMELINE_POINTS - 1) / QC_REPORT_TIMELINE_POINTS
                           : 1;
    struct live_map live;
    struct tags tags = {0};
    struct qc_strbuf x = {0}, stack = {0}, alloc = {0}, resv = {0}, evj = {0}, marks = {0};
    enum qc_status st = QC_OK;
    if (!live_init(&live, n))
        st = qc_errorf(QC_ERR_NOMEM, "report: out of memory (timeline of %zu events)", n);
    size_t in_bucket = 0, npoints = 0, nmarks = 0, seen = 0;
    int64_t best_alloc = -1;
    int64_t best_g[NGROUPS];
    const struct qc_alloc_event *best = NULL;
    for (size_t i = 0; i < n && st == QC_OK; i++) {
        const struct qc_alloc_event *a = &ev[i];
        const int grp = group_of_tag(a->tag);
        if (a->kind == QC_ALLOC_EV_ALLOC) {
            const size_t s = live_slot(&live, a->addr, true);
            live.addr[s] = a->addr;
            live.group[s] = grp;
            live.size[s] = a->size;
            g[grp] += (int64_t)a->size;
        } else if (a->kind == QC_ALLOC_EV_FREE) {
            const size_t s = live_slot(&live, a->addr, false);
            if (live.addr[s] == a->addr) {
                g[live.group[s]] -= (int64_t)live.size[s];
                live.addr[s] = UINT64_MAX;
            } else {
                g[grp] -= (int64_t)a->size; /* allocated before the step */
            }
        }
        if (!shown_kind(a->kind))
            continue;
        if (a->kind != QC_ALLOC_EV_ALLOC && a->kind != QC_ALLOC_EV_FREE &&
            a->kind != QC_ALLOC_EV_MAP) {
            qc_strbuf_puts(&marks, nmarks++ ? ",{\"x\": " : "{\"x\": ");
            qc_strbuf_json_num(&marks, (double)(a->t_ns - t0) * 1e-6, 6);
            qc_strbuf_printf(&marks, ", \"kind\": \"%s\", \"size\": %" PRIu64 ", \"tag\": ",
                             qc_alloc_event_kind_str(a->kind), a->size);
            qc_strbuf_json_str(&marks, a->tag);
            qc_strbuf_puts(&marks, "}");
        }
        /* the bucket keeps its event with the most allocated bytes */
        if ((int64_t)a->bytes_allocated > best_alloc) {
            best_alloc = (int64_t)a->bytes_allocated;
            best = a;
            memcpy(best_g, g, sizeof g);
        }
        ++seen;
        if (++in_bucket < per && seen < nshown)
            continue;
        /* the unattributed remainder makes the stack sum to the allocator's figure */
        int64_t sum = 0;
        for (int k = 0; k < GROUP_UNATTRIBUTED; k++)
            sum += best_g[k];
        best_g[GROUP_UNATTRIBUTED] = (int64_t)best->bytes_allocated - sum;
        const char *sep = npoints++ ? "," : "";
        qc_strbuf_printf(&x, "%s", sep);
        qc_strbuf_json_num(&x, (double)(best->t_ns - t0) * 1e-6, 7);
        qc_strbuf_printf(&stack, "%s[", sep);
        for (int k = 0; k < NGROUPS; k++)
            qc_strbuf_printf(&stack, k ? ",%" PRId64 : "%" PRId64, best_g[k]);
        qc_strbuf_puts(&stack, "]");
        qc_strbuf_printf(&alloc, "%s%" PRIu64, sep, best->bytes_allocated);
        qc_strbuf_printf(&resv, "%s%" PRIu64, sep, best->bytes_reserved);
        const int ti = tag_index(&tags, best->tag);
        if (ti < 0)
            st = qc_errorf(QC_ERR_NOMEM, "report: out of memory (timeline tags)");
        qc_strbuf_printf(&evj, "%s[%u,%d,%" PRIu64 "]", sep, (unsigned)best->kind, ti, best->size);
        in_bucket = 0;
        best_alloc = -1;
    }
    if (st == QC_OK) {
        qc_strbuf_printf(b, ", \"merged\": %zu, \"points\": %zu,\n  \"x\": [", per, npoints);
        qc_strbuf_add(b, x.p ? x.p : "", x.len);
        qc_strbuf_puts(b, "],\n  \"stack\": [");
        qc_strbuf_add(b, stack.p ? stack.p : "", stack.len);
        qc_strbuf_puts(b, "],\n  \"allocated\": [");
        qc_strbuf_add(b, alloc.p ? alloc.p : "", alloc.len);
        qc_strbuf_puts(b, "],\n  \"reserved\": [");
        qc_strbuf_add(b, resv.p ? resv.p : "", resv.len);
        qc_strbuf_puts(b, "],\n  \"ev\": [");
        qc_strbuf_add(b, evj.p ? evj.p : "", evj.len);
        qc_strbuf_puts(b, "],\n  \"marks\": [");
        qc_strbuf_add(b, marks.p ? marks.p : "", marks.len);
        qc_strbuf_puts(b, "],\n  \"tags\": [");
        for (int i = 0; i < tags.n; i++) {
            if (i)
                qc_strbuf_puts(b, ",");
            qc_strbuf_json_str(b, tags.name[i]);
        }
        qc_strbuf_puts(b, "]");
        const enum qc_status s1 = qc_strbuf_status(&x, "report timeline");
        st = s1 != QC_OK ? s1 : qc_strbuf_status(&stack, "report timeline");
    }
    free(tags.name);
    qc_strbuf_free(&x);
    qc_strbuf_free(&stack);
    qc_strbuf_free(&alloc);
    qc_strbuf_free(&resv);
    qc_strbuf_free(&evj);
    qc_strbuf_free(&marks);
    live_free(&live);
    return st;
}

enum qc_status report_timeline_json(const char *run_dir, int64_t step, struct qc_strbuf *b,
                                    struct report_notes *notes, int64_t *shown)
{
    *shown = -1;
    cJSON *index = NULL;
    QC_TRY(load_index(run_dir, notes, &index));
    if (!index) {
        if (step >= 0)
            return qc_errorf(QC_ERR_INVALID,
                             "report: --step %" PRId64 ": the run folder %s has no allocation "
                             "trace (trace/index.json)",
                             step, run_dir);
        qc_strbuf_puts(b, "\"timeline\": null");
        return QC_OK;
    }
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(index, "steps");
    /* the default view explains the worst first: the step the run failed at, else the step
     * with the most failed allocations (out of memory, re-planned), else the peak step */
    const cJSON *chosen = NULL, *e, *failed = NULL, *oom = NULL;
    char avail[1024] = "";
    size_t alen = 0;
    cJSON_ArrayForEach(e, steps)
    {
        const int64_t s = (int64_t)num(e, "step");
        if (step >= 0 ? s == step : has_reason(e, "peak"))
            chosen = e;
        if (has_reason(e, "failed"))
            failed = e;
        const double bad = num(e, "oom_events") + num(e, "replans");
        const double worst = oom ? num(oom, "oom_events") + num(oom, "replans") : -1;
        if (has_reason(e, "oom") &&
            (bad > worst ||
             (bad == worst && num(e, "bytes_allocated_peak") > num(oom, "bytes_allocated_peak"))))
            oom = e;
        if (alen < sizeof avail - 24)
            alen += (size_t)snprintf(avail + alen, sizeof avail - alen, "%s%" PRId64,
                                     alen ? ", " : "", s);
    }
    if (step < 0 && (failed || oom))
        chosen = failed ? failed : oom;
    if (!chosen && step < 0)
        chosen = cJSON_GetArrayItem(steps, cJSON_GetArraySize(steps) - 1);
    if (!chosen) {
        cJSON_Delete(index);
        if (step >= 0)
            return qc_errorf(QC_ERR_INVALID,
                             "report: --step %" PRId64 ": no trace of that step in %s/trace\n"
                             "hint: the steps with a trace are: %s",
                             step, run_dir, alen ? avail : "(none)");
        report_note(notes, "The trace index lists no step: no timeline.");
        qc_strbuf_puts(b, "\"timeline\": null");
        return QC_OK;
    }
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(chosen, "file");
    char path[4400];
    snprintf(path, sizeof path, "%s/trace/%s", run_dir,
             cJSON_IsString(file) ? file->valuestring : "?");
    struct qc_alloc_event *ev = NULL;
    size_t n = 0;
    enum qc_status st = qc_alloc_trace_load(path, &ev, &n);
    if (st != QC_OK && step < 0) { /* the default view: the rest of the page is still worth it */
        report_note(notes, "The trace of step %" PRId64 " could not be read (%s): no timeline.",
                    (int64_t)num(chosen, "step"), qc_error_last());
        cJSON_Delete(index);
        qc_strbuf_puts(b, "\"timeline\": null");
        return QC_OK;
    }
    if (st != QC_OK) {
        const int64_t failed_step = (int64_t)num(chosen, "step"); /* chosen lives in index */
        cJSON_Delete(index);
        return qc_error_wrap(st, "report: the trace of step %" PRId64, failed_step);
    }
    *shown = (int64_t)num(chosen, "step");
    const uint64_t t0 = (uint64_t)num(chosen, "t_begin_ns");
    const uint64_t t1 = (uint64_t)num(chosen, "t_end_ns");
    qc_strbuf_printf(b, "\"timeline\": {\"step\": %" PRId64 ", \"reasons\": ", *shown);
    char *r = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(chosen, "reasons"));
    qc_strbuf_puts(b, r ? r : "[]");
    cJSON_free(r);
    qc_strbuf_puts(b, ", \"available\": [");
    int k = 0;
    cJSON_ArrayForEach(e, steps)
    {
        qc_strbuf_printf(b,
                         "%s{\"step\": %" PRId64 ", \"oom_events\": %" PRId64
                         ", \"replans\": %" PRId64 ", \"bytes_allocated_peak\": %" PRIu64
                         ", \"reasons\": ",
                         k++ ? ", " : "", (int64_t)num(e, "step"), (int64_t)num(e, "oom_events"),
                         (int64_t)num(e, "replans"), (uint64_t)num(e, "bytes_allocated_peak"));
        r = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "reasons"));
        qc_strbuf_puts(b, r ? r : "[]");
        cJSON_free(r);
        qc_strbuf_puts(b, "}");
    }
    qc_strbuf_printf(
        b,
        "],\n  \"events\": %zu, \"events_lost\": %" PRIu64 ", \"bytes_allocated_peak\": %" PRIu64
        ", \"bytes_reserved_peak\": %" PRIu64 ", \"duration_ms\": ",
        n, (uint64_t)num(chosen, "events_lost"), (uint64_t)num(chosen, "bytes_allocated_peak"),
        (uint64_t)num(chosen, "bytes_reserved_peak"));
    qc_strbuf_json_num(b, t1 > t0 ? (double)(t1 - t0) * 1e-6 : 0.0, 7);
    qc_strbuf_puts(b, ", \"groups\": [");
    for (int i = 0; i < NGROUPS; i++) {
        if (i)
            qc_strbuf_puts(b, ",");
        qc_strbuf_json_str(b, groups[i]);
    }
    qc_strbuf_puts(b, "], \"live_at_begin\": ");
    const cJSON *lab = cJSON_GetObjectItemCaseSensitive(chosen, "live_at_begin");
    r = cJSON_PrintUnformatted(lab);
    qc_strbuf_puts(b, r ? r : "[]");
    cJSON_free(r);
    st = timeline_points(ev, n, t0, lab, b);
    qc_strbuf_puts(b, "}");
    free(ev);
    cJSON_Delete(index);
    return st;
}
