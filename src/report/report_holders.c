/*
 * report_holders.c — the "holders" object of the report ("What holds the peak"): every byte
 * live at the measured peak of the peak step, by owner, each holder named with its size, its
 * kind and whether a stash policy can move it, and the setting that moves it. Owners, kinds and
 * knobs are qc_plan_owners.h's: the table `qctrain plan` explains its floor with, so the plan's
 * floor and the measured peak are told in the same words.
 *
 * The step: memory.json's peak.step when the trace index (RUN/trace/index.json) has it, else
 * the index's "peak" step. Its trace is replayed as the timeline's is (report_timeline.c): the
 * step starts with the index's live_at_begin bytes per allocator block (parameters, gradients,
 * AdamW moments, a staged batch: what earlier steps left live); an alloc adds its block, a free
 * removes what its alloc added, or, for a block allocated before the step, the bytes its free
 * event carries from the begin block of its tag (the "other" bucket when that block is not
 * named). Pass 1 finds the first alloc event with the step's highest bytes_allocated (the
 * peak); pass 2 replays up to it. Each live allocation is given the owner of its tag
 * (qc_plan_owner_of_tag), each begin block the owner of its name; the block of the peak
 * event's tag is the op running at the peak: its stashes are "stash read" there (no policy
 * moves a stash its block reads) and its other tensors are its "working set".
 *
 * Identity (tests/test_report.c, tests/test_report_run.py):
 *   Σ rows.bytes = Σ by_kind = Σ by_owner = peak_bytes = the peak event's bytes_allocated
 *                = step_peak_bytes (the step's allocator peak, index.json)
 * A trace that lost events (the ring overflowed) cannot be replayed exactly: no holders, a note.
 * A sum that still differs (a begin block freed under a name the index does not keep) is a note
 * naming both figures, never hidden in a made-up row.
 *
 *   "holders": {"step": S, "from": "trace of step S", "peak_bytes": N, "step_peak_bytes": N,
 *     "block": "<allocator block at the peak>" | null, "tag": "<the peak event's tag>",
 *     "by_kind": {"fixed": N, "stash_read": N, ...}, "by_owner": {"parameters": N, ...},
 *     "kinds": [{"key", "name", "knob"}...], "owners": [{"key", "label", "kind", "movable",
 *     "knob"}...], "rows": [{"name", "owner", "kind", "bytes", "count", "movable"}...]}
 *   or "holders": null (no trace of the step; a note says why).
 */
#include "report_internal.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "qc_alloc.h"
#include "qc_plan_owners.h" /* owners, kinds and knobs: the plan's table */

/* One holder: a name under one owner and kind. */
struct row {
    char name[QC_ALLOC_TAG_MAX + 32];
    int owner; /* enum qc_plan_owner */
    int kind;  /* enum qc_plan_hold */
    uint64_t bytes;
    int64_t count;
};

struct rows {
    struct row *r;
    int n, cap;
};

/* Adds bytes to the row of (name, owner, kind). QC_ERR_NOMEM. */
static enum qc_status rows_add(struct rows *rs, const char *name, int owner, int kind,
                               uint64_t bytes, int64_t count)
{
    for (int i = 0; i < rs->n; i++)
        if (rs->r[i].owner == owner && rs->r[i].kind == kind && strcmp(rs->r[i].name, name) == 0) {
            rs->r[i].bytes += bytes;
            rs->r[i].count += count;
            return QC_OK;
        }
    if (rs->n == rs->cap) {
        const int cap = rs->cap ? 2 * rs->cap : 128;
        struct row *p = realloc(rs->r, (size_t)cap * sizeof *p);
        if (!p)
            return qc_errorf(QC_ERR_NOMEM, "report: out of memory (%d holders at the peak)", cap);
        rs->r = p;
        rs->cap = cap;
    }
    struct row *x = &rs->r[rs->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->owner = owner;
    x->kind = kind;
    x->bytes = bytes;
    x->count = count;
    return QC_OK;
}

static int row_cmp(const void *a, const void *b)
{
    const struct row *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The owner, kind and name of a tag live at the peak; running: the block of the op there. */
static void classify(const char *tag, const char *running, char *name, size_t n, int *owner,
                     int *kind)
{
    enum qc_plan_owner o = qc_plan_owner_of_tag(tag, name, n);
    char blk[QC_ALLOC_TAG_MAX];
    qc_alloc_tag_block(tag, blk);
    const bool at_op = running && running[0] && strcmp(blk, running) == 0;
    if (at_op && o == QC_PLAN_OWNER_TENSOR)
        o = QC_PLAN_OWNER_WORKING;
    *owner = (int)o;
    *kind = (int)qc_plan_owner_info(o)->kind;
    if (at_op && o == QC_PLAN_OWNER_STASH)
        *kind = QC_PLAN_HOLD_STASH_READ;
}

// ---- the replay -------------------------------------------------------------------------------

/* addr -> event index of its alloc, for the blocks the step allocated */
struct live {
    uint64_t *addr; /* 0 empty, UINT64_MAX deleted */
    size_t *ev;
    size_t cap;
};

static size_t live_slot(const struct live *l, uint64_t addr, bool insert)
{
    size_t i = (size_t)((addr >> 6) * 0x9e3779b97f4a7c15ull) & (l->cap - 1);
    for (;; i = (i + 1) & (l->cap - 1))
        if (l->addr[i] == addr || l->addr[i] == 0 || (insert && l->addr[i] == UINT64_MAX))
            return i;
}

/* A block live when the step began (index.json live_at_begin). */
struct begin {
    char name[QC_ALLOC_TAG_MAX];
    int64_t bytes;
};

static double num(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : 0.0;
}

/* The rows at the peak of ev[0..n) (the first alloc with the most bytes_allocated), from the
 * begin blocks; *peak its bytes_allocated, *at its event (-1: no alloc, the peak is the start),
 * *unmatched the bytes freed of begin blocks no entry held. QC_ERR_NOMEM. */
static enum qc_status replay(const struct qc_alloc_event *ev, size_t n, struct begin *bg, int nbg,
                             uint64_t begin_bytes, struct rows *rs, uint64_t *peak, int64_t *at,
                             int64_t *unmatched)
{
    *at = -1;
    *peak = begin_bytes;
    *unmatched = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == QC_ALLOC_EV_ALLOC && (*at < 0 || ev[i].bytes_allocated > *peak)) {
            *peak = ev[i].bytes_allocated;
            *at = (int64_t)i;
        }
    struct live l = {.cap = 64};
    while (l.cap < 2 * n + 16)
        l.cap *= 2;
    l.addr = calloc(l.cap, sizeof *l.addr);
    l.ev = calloc(l.cap, sizeof *l.ev);
    if (!l.addr || !l.ev) {
        free(l.addr);
        free(l.ev);
        return qc_errorf(QC_ERR_NOMEM, "report: out of memory (holders of %zu events)", n);
    }
    char blk[QC_ALLOC_TAG_MAX];
    for (int64_t i = 0; i <= *at; i++) {
        const struct qc_alloc_event *e = &ev[i];
        if (e->kind == QC_ALLOC_EV_ALLOC) {
            const size_t s = live_slot(&l, e->addr, true);
            l.addr[s] = e->addr;
            l.ev[s] = (size_t)i;
        } else if (e->kind == QC_ALLOC_EV_FREE) {
            const size_t s = live_slot(&l, e->addr, false);
            if (l.addr[s] == e->addr) {
                l.addr[s] = UINT64_MAX;
                continue;
            }
            /* a block allocated before the step: out of its begin block, else "other" */
            qc_alloc_tag_block(e->tag[0] ? e->tag : "(untagged)", blk);
            int k = -1;
            for (int j = 0; j < nbg && k < 0; j++)
                if (strcmp(bg[j].name, blk) == 0)
                    k = j;
            for (int j = 0; j < nbg && k < 0; j++)
                if (strcmp(bg[j].name, "other") == 0)
                    k = j;
            if (k >= 0)
                bg[k].bytes -= (int64_t)e->size;
            else
                *unmatched += (int64_t)e->size;
        }
    }
    const char *running = NULL;
    char run_blk[QC_ALLOC_TAG_MAX] = "";
    if (*at >= 0 && ev[*at].tag[0])
        running = qc_alloc_tag_block(ev[*at].tag, run_blk);
    enum qc_status st = QC_OK;
    char name[QC_ALLOC_TAG_MAX + 32], label[QC_ALLOC_TAG_MAX + 32];
    int owner, kind;
    for (int j = 0; j < nbg && st == QC_OK; j++) {
        if (bg[j].bytes < 0) /* more freed of it than the index says was live: named in a note */
            *unmatched -= bg[j].bytes;
        if (bg[j].bytes <= 0)
            continue;
        classify(bg[j].name, NULL, name, sizeof name, &owner, &kind);
        if (owner != QC_PLAN_OWNER_PARAMS && owner != QC_PLAN_OWNER_GRADS &&
            owner != QC_PLAN_OWNER_MOMENTS && owner != QC_PLAN_OWNER_BATCH) {
            snprintf(label, sizeof label, "%s (live when the step began)", bg[j].name);
            snprintf(name, sizeof name, "%s", label);
        }
        st = rows_add(rs, name, owner, kind, (uint64_t)bg[j].bytes, 0);
    }
    for (size_t s = 0; s < l.cap && st == QC_OK; s++) {
        if (l.addr[s] == 0 || l.addr[s] == UINT64_MAX)
            continue;
        const struct qc_alloc_event *e = &ev[l.ev[s]];
        classify(e->tag, running, name, sizeof name, &owner, &kind);
        st = rows_add(rs, name, owner, kind, e->size, 1);
    }
    free(l.addr);
    free(l.ev);
    if (st == QC_OK && rs->n > 1)
        qsort(rs->r, (size_t)rs->n, sizeof *rs->r, row_cmp);
    return st;
}

// ---- the document -----------------------------------------------------------------------------

static void put_tables(struct qc_strbuf *b)
{
    qc_strbuf_puts(b, ",\n  \"kinds\": [");
    for (int k = 0; k < QC_PLAN_HOLD_COUNT; k++) {
        qc_strbuf_puts(b, k ? ", {\"key\": " : "{\"key\": ");
        qc_strbuf_json_str(b, qc_plan_hold_key((enum qc_plan_hold)k));
        qc_strbuf_puts(b, ", \"name\": ");
        qc_strbuf_json_str(b, qc_plan_hold_str((enum qc_plan_hold)k));
        qc_strbuf_puts(b, ", \"knob\": ");
        qc_strbuf_json_str(b, qc_plan_hold_knob((enum qc_plan_hold)k));
        qc_strbuf_puts(b, "}");
    }
    qc_strbuf_puts(b, "],\n  \"owners\": [");
    for (int o = 0; o < QC_PLAN_OWNER_COUNT; o++) {
        const struct qc_plan_owner_info *w = qc_plan_owner_info((enum qc_plan_owner)o);
        qc_strbuf_puts(b, o ? ", {\"key\": " : "{\"key\": ");
        qc_strbuf_json_str(b, w->key);
        qc_strbuf_puts(b, ", \"label\": ");
        qc_strbuf_json_str(b, w->label);
        qc_strbuf_puts(b, ", \"kind\": ");
        qc_strbuf_json_str(b, qc_plan_hold_key(w->kind));
        qc_strbuf_printf(b, ", \"movable\": %s, \"knob\": ", w->movable ? "true" : "false");
        qc_strbuf_json_str(b, w->knob);
        qc_strbuf_puts(b, "}");
    }
    qc_strbuf_puts(b, "]");
}

/* The index entry of the step to explain: memory.json's peak step, else the "peak" step. */
static const cJSON *peak_entry(const cJSON *index, const cJSON *mem)
{
    const cJSON *ps =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mem, "peak"), "step");
    const int64_t want = cJSON_IsNumber(ps) ? (int64_t)ps->valuedouble : -1;
    const cJSON *e, *by_step = NULL, *by_reason = NULL;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(index, "steps"))
    {
        if ((int64_t)num(e, "step") == want)
            by_step = e;
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(e, "reasons"))
        {
            if (cJSON_IsString(r) && strcmp(r->valuestring, "peak") == 0)
                by_reason = e;
        }
    }
    return by_step ? by_step : by_reason;
}

enum qc_status report_holders_json(const char *run_dir, const cJSON *mem, struct qc_strbuf *b,
                                   struct report_notes *notes)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/trace/index.json", run_dir);
    cJSON *index = NULL;
    if (report_load_json(path, &index) != QC_OK) { /* the timeline says what is wrong with it */
        qc_strbuf_puts(b, "\"holders\": null");
        return QC_OK;
    }
    const cJSON *entry = peak_entry(index, mem);
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(entry, "file");
    if (!entry || !cJSON_IsString(file)) {
        if (index)
            report_note(notes, "The trace index keeps no trace of the peak step: the page does not "
                               "say what holds the peak.");
        else
            report_note(notes, "No allocation trace in the run folder: the page does not say what "
                               "holds the peak (train keeps the peak step's trace unless "
                               "alloc.trace=false or alloc.trace_max_bytes=0).");
        cJSON_Delete(index);
        qc_strbuf_puts(b, "\"holders\": null");
        return QC_OK;
    }
    const int64_t step = (int64_t)num(entry, "step");
    const uint64_t lost = (uint64_t)num(entry, "events_lost");
    if (lost) {
        report_note(notes,
                    "The trace of the peak step %" PRId64 " lost %" PRIu64 " events (the "
                    "allocator's ring overflowed): what holds the peak cannot be replayed exactly "
                    "and is not shown.",
                    step, lost);
        cJSON_Delete(index);
        qc_strbuf_puts(b, "\"holders\": null");
        return QC_OK;
    }
    snprintf(path, sizeof path, "%s/trace/%s", run_dir, file->valuestring);
    struct qc_alloc_event *ev = NULL;
    size_t n = 0;
    if (qc_alloc_trace_load(path, &ev, &n) != QC_OK) {
        report_note(notes,
                    "The trace of the peak step %" PRId64 " could not be read (%s): the page "
                    "does not say what holds the peak.",
                    step, qc_error_last());
        cJSON_Delete(index);
        qc_strbuf_puts(b, "\"holders\": null");
        return QC_OK;
    }
    const cJSON *lab = cJSON_GetObjectItemCaseSensitive(entry, "live_at_begin");
    const int nbg = cJSON_GetArraySize(lab);
    struct begin *bg = calloc((size_t)nbg + 1, sizeof *bg);
    struct rows rs = {0};
    enum qc_status st = QC_OK;
    if (!bg)
        st = qc_errorf(QC_ERR_NOMEM, "report: out of memory (%d blocks live at a step's start)",
                       nbg);
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, lab)
    {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (bg && cJSON_IsString(nm)) {
            snprintf(bg[k].name, sizeof bg[k].name, "%s", nm->valuestring);
            bg[k++].bytes = (int64_t)num(e, "bytes");
        }
    }
    uint64_t peak = 0;
    int64_t at = -1, unmatched = 0;
    if (st == QC_OK)
        st = replay(ev, n, bg, k, (uint64_t)num(entry, "bytes_allocated_at_begin"), &rs, &peak, &at,
                    &unmatched);
    if (st == QC_OK) {
        uint64_t by_kind[QC_PLAN_HOLD_COUNT] = {0}, by_owner[QC_PLAN_OWNER_COUNT] = {0}, sum = 0;
        for (int i = 0; i < rs.n; i++) {
            by_kind[rs.r[i].kind] += rs.r[i].bytes;
            by_owner[rs.r[i].owner] += rs.r[i].bytes;
            sum += rs.r[i].bytes;
        }
        const uint64_t step_peak = (uint64_t)num(entry, "bytes_allocated_peak");
        if (sum != peak || unmatched)
            report_note(notes,
                        "What holds the peak of step %" PRId64 ": the holders sum to %" PRIu64
                        " bytes, the allocator had %" PRIu64 " at the peak (%" PRId64
                        " bytes freed of blocks live at the step's start that the trace index "
                        "does not name).",
                        step, sum, peak, unmatched);
        if (step_peak && step_peak != peak)
            report_note(notes,
                        "The trace of step %" PRId64 " peaks at %" PRIu64 " bytes, the step's "
                        "allocator peak is %" PRIu64 ".",
                        step, peak, step_peak);
        char blk[QC_ALLOC_TAG_MAX];
        qc_strbuf_printf(b,
                         "\"holders\": {\"step\": %" PRId64 ", \"from\": \"trace of step %" PRId64
                         "\", \"peak_bytes\": %" PRIu64 ", \"step_peak_bytes\": %" PRIu64
                         ", \"block\": ",
                         step, step, peak, step_peak);
        if (at >= 0 && ev[at].tag[0]) {
            qc_strbuf_json_str(b, qc_alloc_tag_block(ev[at].tag, blk));
            qc_strbuf_puts(b, ", \"tag\": ");
            qc_strbuf_json_str(b, ev[at].tag);
        } else {
            qc_strbuf_puts(b, "null, \"tag\": null");
        }
        qc_strbuf_puts(b, ",\n  \"by_kind\": {");
        for (int j = 0; j < QC_PLAN_HOLD_COUNT; j++)
            qc_strbuf_printf(b, "%s\"%s\": %" PRIu64, j ? ", " : "",
                             qc_plan_hold_key((enum qc_plan_hold)j), by_kind[j]);
        qc_strbuf_puts(b, "}, \"by_owner\": {");
        for (int j = 0; j < QC_PLAN_OWNER_COUNT; j++)
            qc_strbuf_printf(b, "%s\"%s\": %" PRIu64, j ? ", " : "",
                             qc_plan_owner_info((enum qc_plan_owner)j)->key, by_owner[j]);
        qc_strbuf_puts(b, "}");
        put_tables(b);
        qc_strbuf_puts(b, ",\n  \"rows\": [");
        for (int i = 0; i < rs.n; i++) {
            const struct row *r = &rs.r[i];
            const struct qc_plan_owner_info *w = qc_plan_owner_info((enum qc_plan_owner)r->owner);
            qc_strbuf_puts(b, i ? ",\n   {\"name\": " : "\n   {\"name\": ");
            qc_strbuf_json_str(b, r->name);
            qc_strbuf_printf(b,
                             ", \"owner\": \"%s\", \"kind\": \"%s\", \"bytes\": %" PRIu64
                             ", \"count\": %" PRId64 ", \"movable\": %s}",
                             w->key, qc_plan_hold_key((enum qc_plan_hold)r->kind), r->bytes,
                             r->count,
                             w->movable && r->kind != QC_PLAN_HOLD_STASH_READ ? "true" : "false");
        }
        qc_strbuf_puts(b, "]}");
        st = qc_strbuf_status(b, "report holders");
    }
    free(rs.r);
    free(bg);
    free(ev);
    cJSON_Delete(index);
    return st;
}
