/*
 * report_plan.c — the measured bytes of every planned block application (the report's plan
 * table), from the allocation trace of the plan's step.
 *
 * One naming: the planner names a block application the way the model tags the tensors it
 * stashes, so a measured tag belongs to the planned row whose name it starts with, followed by
 * the stash's own name (stash_rest):
 *   plan row                                        allocator tags of its stash
 *   encoder.agent_encoder.a2a_attn_layers.0/app4    .../app4.stash (cut: .../app4.st)
 *   decoder.y_emb/c0                                decoder.y_emb/c0/stash
 *   decoder.t2m_propose_attn_layers.0/kv            decoder.t2m_propose_attn_layers.0/kv
 *   edges.pl2a                                      edges/pl2a.r, edges/pl2a.fe (the loader's
 *                                                   edge tensors: "edges/" reads "edges.")
 * A row's measured bytes are the most its stash tensors held live at once during the step
 * (bytes asked for, as the planner counts them). Other tensors (outputs, scratch, backward
 * buffers, parameters) are not counted. Each plan block gains "measured_bytes" (null when the
 * step has no trace) and the plan "measured_from".
 */
#include "report_internal.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "qc_alloc.h"

/* The plan name a tag reads as ("edges/x" -> "edges.x"). */
static void tag_key(const char *tag, char *out, size_t n)
{
    if (strncmp(tag, "edges/", 6) == 0)
        snprintf(out, n, "edges.%s", tag + 6);
    else
        snprintf(out, n, "%s", tag);
}

/* What follows a row's name in a tag of its stash: nothing (the row is the tensor: ".../kv"),
 * or a separator and "stash" (".../app4.stash", "decoder.y_emb/c0/stash"; a prefix of it when
 * the allocator cut the tag), or the loader's edge tensors "r" and "fe". Other tensors of the
 * block (outputs, scratch, backward buffers) are not its stash. */
static bool stash_rest(const char *rest)
{
    if (rest[0] == '\0')
        return true;
    if (rest[0] != '/' && rest[0] != '.')
        return false;
    const char *w = rest + 1;
    const size_t n = strlen(w);
    return (n > 0 && strncmp(w, "stash", n < 5 ? n : 5) == 0 && n <= 5) || strcmp(w, "r") == 0 ||
           strcmp(w, "fe") == 0;
}

/* The row of rows[nrows] whose stash key is: the longest row name that key starts with at a
 * separator, with a stash rest; -1 none. */
static int row_of(const char *key, const char *const *rows, int nrows)
{
    int best = -1;
    size_t best_len = 0;
    for (int i = 0; i < nrows; i++) {
        const size_t len = strlen(rows[i]);
        if (len <= best_len || strncmp(key, rows[i], len) != 0)
            continue;
        if (stash_rest(key + len)) {
            best = i;
            best_len = len;
        }
    }
    return best;
}

int report_plan_row_of_tag(const char *tag, const char *const *rows, int nrows)
{
    char key[QC_ALLOC_TAG_MAX + 16];
    tag_key(tag, key, sizeof key);
    return row_of(key, rows, nrows);
}

/* tag -> row, remembered (a step repeats a few hundred tags over many events) */
struct tag_rows {
    char (*tag)[64];
    int *row;
    size_t cap; /* power of two; empty slot: tag[0] == '\0' */
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int tag_row(struct tag_rows *m, const char *tag, const char *const *rows, int nrows)
{
    if (!tag[0])
        return -1;
    size_t i = (size_t)hash_str(tag) & (m->cap - 1);
    for (size_t probes = 0; probes < m->cap; probes++, i = (i + 1) & (m->cap - 1)) {
        if (m->tag[i][0] == '\0') {
            snprintf(m->tag[i], sizeof m->tag[i], "%s", tag);
            m->row[i] = report_plan_row_of_tag(tag, rows, nrows);
            return m->row[i];
        }
        if (strcmp(m->tag[i], tag) == 0)
            return m->row[i];
    }
    return report_plan_row_of_tag(tag, rows, nrows); /* full: not remembered */
}

/* addr -> (row, bytes) of the blocks the step allocated under a planned row */
struct live {
    uint64_t *addr; /* 0 empty, UINT64_MAX deleted */
    int *row;
    uint64_t *bytes;
    size_t cap;
};

static size_t live_slot(const struct live *l, uint64_t addr, bool insert)
{
    size_t i = (size_t)((addr >> 6) * 0x9e3779b97f4a7c15ull) & (l->cap - 1);
    for (;; i = (i + 1) & (l->cap - 1))
        if (l->addr[i] == addr || l->addr[i] == 0 || (insert && l->addr[i] == UINT64_MAX))
            return i;
}

/* Fills max_live[nrows] from the events. QC_ERR_NOMEM. */
static enum qc_status measure_rows(const struct qc_alloc_event *ev, size_t n,
                                   const char *const *rows, int nrows, uint64_t *max_live)
{
    struct tag_rows tr = {.cap = 4096};
    struct live l = {.cap = 64};
    while (l.cap < 2 * n + 16)
        l.cap *= 2;
    tr.tag = calloc(tr.cap, sizeof *tr.tag);
    tr.row = calloc(tr.cap, sizeof *tr.row);
    l.addr = calloc(l.cap, sizeof *l.addr);
    l.row = calloc(l.cap, sizeof *l.row);
    l.bytes = calloc(l.cap, sizeof *l.bytes);
    uint64_t *cur = calloc((size_t)nrows + 1, sizeof *cur);
    enum qc_status st = QC_OK;
    if (!tr.tag || !tr.row || !l.addr || !l.row || !l.bytes || !cur)
        st = qc_errorf(QC_ERR_NOMEM, "report: out of memory (plan vs measured, %zu events)", n);
    /* a self-attention layer's keys and values ("<layer>/kv" with no row of that name) are
     * computed inside its application: they count with the layer's next application */
    struct {
        uint64_t addr;
        char layer[64];
    } pend[16];
    int npend = 0;
    for (size_t i = 0; i < n && st == QC_OK; i++) {
        const struct qc_alloc_event *e = &ev[i];
        if (e->kind == QC_ALLOC_EV_ALLOC) {
            const int r = tag_row(&tr, e->tag, rows, nrows);
            if (e->addr == 0 || e->addr == UINT64_MAX)
                continue;
            const uint64_t b = e->requested ? e->requested : e->size;
            const size_t len = strlen(e->tag);
            if (r < 0 && len > 3 && strcmp(e->tag + len - 3, "/kv") == 0 && npend < 16) {
                pend[npend].addr = e->addr;
                snprintf(pend[npend].layer, sizeof pend[npend].layer, "%.*s", (int)(len - 2),
                         e->tag); /* "<layer>/" */
                npend++;
                const size_t s = live_slot(&l, e->addr, true);
                l.addr[s] = e->addr;
                l.row[s] = nrows; /* nobody's yet (cur[nrows] is a spare) */
                l.bytes[s] = b;
                continue;
            }
            if (r < 0)
                continue;
            const size_t s = live_slot(&l, e->addr, true);
            l.addr[s] = e->addr;
            l.row[s] = r;
            l.bytes[s] = b;
            cur[r] += b;
            for (int k = 0; k < npend; k++) {
                if (strncmp(rows[r], pend[k].layer, strlen(pend[k].layer)) != 0)
                    continue;
                const size_t q = live_slot(&l, pend[k].addr, false);
                if (l.addr[q] == pend[k].addr && l.row[q] == nrows) {
                    l.row[q] = r;
                    cur[r] += l.bytes[q];
                }
                pend[k--] = pend[--npend];
            }
            if (cur[r] > max_live[r])
                max_live[r] = cur[r];
        } else if (e->kind == QC_ALLOC_EV_FREE) {
            const size_t s = live_slot(&l, e->addr, false);
            if (l.addr[s] != e->addr)
                continue; /* allocated before the step, or under no planned row */
            if (l.row[s] < nrows)
                cur[l.row[s]] -= l.bytes[s];
            for (int k = 0; k < npend; k++) /* a kv freed before any application took it */
                if (pend[k].addr == e->addr)
                    pend[k--] = pend[--npend];
            l.addr[s] = UINT64_MAX;
        }
    }
    free(tr.tag);
    free(tr.row);
    free(l.addr);
    free(l.row);
    free(l.bytes);
    free(cur);
    return st;
}

enum qc_status report_plan_measure(const char *run_dir, cJSON *mem, struct report_notes *notes)
{
    cJSON *plan = cJSON_GetObjectItemCaseSensitive(mem, "plan");
    cJSON *blocks = cJSON_GetObjectItemCaseSensitive(plan, "blocks");
    const int nrows = cJSON_GetArraySize(blocks);
    if (!cJSON_IsObject(plan) || nrows == 0)
        return QC_OK;
    const cJSON *pstep = cJSON_GetObjectItemCaseSensitive(plan, "step");
    const int64_t step = cJSON_IsNumber(pstep) ? (int64_t)pstep->valuedouble : -1;
    /* the trace of the plan's step */
    char path[4400];
    snprintf(path, sizeof path, "%s/trace/index.json", run_dir);
    cJSON *index = NULL;
    QC_TRY(report_load_json(path, &index));
    const cJSON *e, *found = NULL;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(index, "steps"))
    {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "step");
        if (cJSON_IsNumber(s) && (int64_t)s->valuedouble == step)
            found = e;
    }
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(found, "file");
    struct qc_alloc_event *ev = NULL;
    size_t n = 0;
    enum qc_status st = QC_OK;
    if (cJSON_IsString(file)) {
        snprintf(path, sizeof path, "%s/trace/%s", run_dir, file->valuestring);
        st = qc_alloc_trace_load(path, &ev, &n);
        if (st != QC_OK) {
            report_note(notes,
                        "The trace of the plan's step %" PRId64 " could not be read (%s): the "
                        "plan table has no measured bytes.",
                        step, qc_error_last());
            st = QC_OK;
            ev = NULL;
        }
    } else {
        report_note(notes,
                    "No trace of the plan's step %" PRId64 " was kept (trace/index.json): the plan "
                    "table has no measured bytes.",
                    step);
    }
    cJSON_Delete(index);
    const char **rows = calloc((size_t)nrows, sizeof *rows);
    uint64_t *max_live = calloc((size_t)nrows + 1, sizeof *max_live);
    if (!rows || !max_live)
        st = qc_errorf(QC_ERR_NOMEM, "report: out of memory (plan of %d blocks)", nrows);
    int i = 0;
    cJSON_ArrayForEach(e, blocks)
    {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (rows)
            rows[i++] = cJSON_IsString(nm) ? nm->valuestring : "";
    }
    if (st == QC_OK && ev)
        st = measure_rows(ev, n, rows, nrows, max_live);
    if (st == QC_OK) {
        i = 0;
        cJSON *w;
        cJSON_ArrayForEach(w, blocks)
        {
            cJSON_DeleteItemFromObjectCaseSensitive(w, "measured_bytes");
            cJSON *v = ev ? cJSON_CreateNumber((double)max_live[i]) : cJSON_CreateNull();
            if (!v || !cJSON_AddItemToObject(w, "measured_bytes", v)) {
                cJSON_Delete(v);
                st = qc_errorf(QC_ERR_NOMEM, "report: out of memory (plan rows)");
                break;
            }
            i++;
        }
        char from[96];
        snprintf(from, sizeof from, "trace of step %" PRId64, step);
        cJSON_DeleteItemFromObjectCaseSensitive(plan, "measured_from");
        if (st == QC_OK && !(ev ? cJSON_AddStringToObject(plan, "measured_from", from)
                                : cJSON_AddNullToObject(plan, "measured_from")))
            st = qc_errorf(QC_ERR_NOMEM, "report: out of memory (plan rows)");
    }
    free(rows);
    free(max_live);
    free(ev);
    return st;
}
