/*
 * memreport.c — RUN/memory.json and RUN/memory.txt (qc_memreport.h; fields and units in
 * docs/MEMORY_REPORT.md).
 *
 * Both documents are formatted into memory first (two passes: the length, then the text) and
 * written through one atomic helper (qc_file_write_atomic): FILE.tmp in the same folder
 * (registered for removal on SIGINT/SIGTERM), fsync, rename over FILE, fsync of the folder. JSON
 * integers are printed as exact unsigned decimals (byte counts can pass 2^53 only on machines we do
 * not have, but a reader using doubles still gets every figure below 8 PiB exactly).
 */

#include "qc_memreport.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_json.h"
#include "qc_file.h"
#include "qc_plan.h"     /* qc_plan_policy_str: the stash policies' names */
#include "qc_progress.h" /* qc_format_bytes */

#define TEXT_TOP_BLOCKS 10

// ---- formatting helpers ------------------------------------------------------------------------

struct sbuf {
    char *buf;
    size_t cap;
    size_t len; /* length needed so far (may exceed cap) */
};

static void __attribute__((format(printf, 2, 3))) sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const size_t room = b->len < b->cap ? b->cap - b->len : 0;
    const int n = vsnprintf(room ? b->buf + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len += (size_t)n;
}

/* A JSON string literal of s (quotes included). */
static void sb_json_str(struct sbuf *b, const char *s)
{
    sb_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            sb_printf(b, "\\%c", *p);
        else if (*p < 0x20)
            sb_printf(b, "\\u%04x", *p);
        else
            sb_printf(b, "%c", *p);
    }
    sb_printf(b, "\"");
}

static double share(uint64_t part, uint64_t whole)
{
    return whole ? (double)part / (double)whole : 0.0;
}

static void sb_finish(struct sbuf *b)
{
    if (b->cap)
        b->buf[b->len < b->cap ? b->len : b->cap - 1] = '\0';
}

// ---- memory.json -------------------------------------------------------------------------------

/* A breakdown array: the top entries, then the "other" bucket when it holds bytes. */
static void json_breakdown(struct sbuf *b, const char *key, const struct qc_alloc_tag_bytes *top,
                           uint32_t ntop, const struct qc_alloc_tag_bytes *other, uint64_t whole)
{
    sb_printf(b, "    \"%s\": [", key);
    const uint32_t n = ntop + (other->bytes ? 1u : 0u);
    for (uint32_t i = 0; i < n; i++) {
        const struct qc_alloc_tag_bytes *e = i < ntop ? &top[i] : other;
        sb_printf(b, "%s\n      {\"name\": ", i ? "," : "");
        sb_json_str(b, e->name);
        sb_printf(b,
                  ", \"bytes\": %zu, \"allocations\": %" PRIu64 ", \"share\": %s, \"other\": %s}",
                  e->bytes, e->blocks, QC_JSON_NUM("%.6f", share(e->bytes, whole)),
                  i < ntop ? "false" : "true");
    }
    sb_printf(b, "%s]", n ? "\n    " : "");
}

size_t qc_memreport_format_json(const struct qc_memreport *r, char *buf, size_t cap)
{
    struct sbuf b = {buf, cap, 0};
    const struct qc_alloc_stats *s = &r->stats;
    const struct qc_alloc_peak_snapshot *p = &r->peak;
    sb_printf(&b, "{\n  \"format\": \"qctrain-memory-report\",\n  \"version\": 1,\n");
    sb_printf(&b, "  \"device\": ");
    sb_json_str(&b, r->device ? r->device : "cpu");
    sb_printf(&b,
              ",\n  \"step\": %" PRId64 ",\n  \"total_steps\": %" PRId64
              ",\n  \"budget_bytes\": %zu,\n  \"params_grads_bytes\": %" PRIu64
              ",\n  \"peak_rss_bytes\": %" PRIu64 ",\n",
              r->step, r->total_steps, s->bytes_budget, r->bytes_params_grads, r->bytes_peak_rss);
    sb_printf(&b,
              "  \"allocator\": {\n"
              "    \"bytes_allocated\": %zu,\n    \"bytes_allocated_peak\": %zu,\n"
              "    \"bytes_requested\": %zu,\n    \"bytes_requested_peak\": %zu,\n"
              "    \"bytes_active\": %zu,\n    \"bytes_active_peak\": %zu,\n"
              "    \"bytes_reserved\": %zu,\n    \"bytes_reserved_peak\": %zu,\n"
              "    \"bytes_reserved_small\": %zu,\n    \"bytes_budget\": %zu,\n"
              "    \"bytes_largest_free\": %zu,\n",
              s->bytes_allocated, s->bytes_allocated_peak, s->bytes_requested,
              s->bytes_requested_peak, s->bytes_active, s->bytes_active_peak, s->bytes_reserved,
              s->bytes_reserved_peak, s->bytes_reserved_small, s->bytes_budget,
              s->bytes_largest_free);
    sb_printf(&b,
              "    \"n_allocs\": %" PRIu64 ",\n    \"n_frees\": %" PRIu64
              ",\n    \"n_live\": %" PRIu64 ",\n    \"n_pending\": %" PRIu64
              ",\n    \"n_segments\": %" PRIu64 ",\n    \"n_maps\": %" PRIu64
              ",\n    \"n_unmaps\": %" PRIu64 ",\n    \"n_retries\": %" PRIu64
              ",\n    \"n_ooms\": %" PRIu64 ",\n    \"fragmentation\": %s,\n    \"step\": %" PRId64
              "\n  },\n",
              s->n_allocs, s->n_frees, s->n_live, s->n_pending, s->n_segments, s->n_maps,
              s->n_unmaps, s->n_retries, s->n_ooms, QC_JSON_NUM("%.6f", s->fragmentation), s->step);
    sb_printf(&b,
              "  \"peak\": {\n    \"step\": %" PRId64 ",\n    \"bytes_allocated_peak\": %zu,\n"
              "    \"snapshot_bytes_allocated\": %zu,\n    \"snapshot_bytes_reserved\": %zu,\n"
              "    \"snapshots\": %" PRIu64 ",\n    \"tags\": %" PRIu64
              ",\n    \"blocks\": %" PRIu64 ",\n",
              p->step, p->bytes_allocated_peak, p->bytes_allocated, p->bytes_reserved,
              p->n_snapshots, p->n_tags, p->n_blocks);
    json_breakdown(&b, "by_block", p->blocks, p->ntop_blocks, &p->block_other, p->bytes_allocated);
    sb_printf(&b, ",\n");
    json_breakdown(&b, "by_tag", p->tags, p->ntop_tags, &p->tag_other, p->bytes_allocated);
    sb_printf(&b, "\n  },\n  \"steps\": [");
    for (int64_t i = 0; i < r->nsteps; i++) {
        const struct qc_memreport_step *e = &r->steps[i];
        sb_printf(&b,
                  "%s\n    {\"step\": %" PRId64 ", \"bytes_allocated_peak\": %" PRIu64
                  ", \"bytes_reserved_peak\": %" PRIu64 "}",
                  i ? "," : "", e->step, e->bytes_allocated_peak, e->bytes_reserved_peak);
    }
    sb_printf(&b, "%s]", r->nsteps ? "\n  " : "");
    if (r->plan) {
        const struct qc_memreport_plan *pl = r->plan;
        sb_printf(&b,
                  ",\n  \"plan\": {\n    \"step\": %" PRId64
                  ",\n    \"predicted_peak_bytes\": %" PRIu64
                  ",\n    \"measured_peak_bytes\": %" PRIu64 ",\n    \"blocks\": [",
                  pl->step, pl->predicted_peak_bytes, pl->measured_peak_bytes);
        for (int32_t i = 0; i < pl->nblocks; i++) {
            const struct qc_memreport_plan_block *e = &pl->blocks[i];
            sb_printf(&b, "%s\n      {\"name\": ", i ? "," : "");
            sb_json_str(&b, e->name);
            sb_printf(&b, ", \"policy\": ");
            sb_json_str(&b, e->policy);
            sb_printf(&b, ", \"bytes\": %" PRIu64 ", \"predicted_time_s\": %s}", e->bytes,
                      QC_JSON_NUM("%.6g", e->predicted_time_s));
        }
        sb_printf(&b, "%s]\n  }", pl->nblocks ? "\n    " : "");
    }
    if (r->stopped) {
        sb_printf(&b, ",\n  \"stopped\": {\"reason\": ");
        sb_json_str(&b, r->stopped->reason ? r->stopped->reason : "error");
        sb_printf(&b, ", \"step\": %" PRId64 ", \"message\": ", r->stopped->step);
        sb_json_str(&b, r->stopped->message ? r->stopped->message : "");
        if (r->stopped->world > 1)
            sb_printf(&b, ", \"rank\": %d, \"failed_ranks\": %d, \"world_size\": %d",
                      r->stopped->rank, r->stopped->failed_ranks, r->stopped->world);
        sb_printf(&b, "}");
    }
    if (r->nranks > 0) {
        sb_printf(&b,
                  ",\n  \"dist\": {\n    \"world_size\": %" PRId64 ",\n    \"zero_stage\": %" PRId64
                  ",\n    \"ranks\": [",
                  r->nranks, r->zero_stage);
        for (int64_t i = 0; i < r->nranks; i++) {
            const struct qc_memreport_rank *e = &r->ranks[i];
            sb_printf(&b,
                      "%s\n      {\"rank\": %" PRId64 ", \"params_bytes\": %" PRIu64
                      ", \"grads_bytes\": %" PRIu64 ", \"grads_reduced_bytes\": %" PRIu64
                      ", \"moments_bytes\": %" PRIu64 ", \"comm_bytes\": %" PRIu64
                      ", \"peak_allocated_bytes\": %" PRIu64 "}",
                      i ? "," : "", e->rank, e->params_bytes, e->grads_bytes,
                      e->grads_reduced_bytes, e->moments_bytes, e->comm_bytes,
                      e->peak_allocated_bytes);
        }
        sb_printf(&b, "\n    ]\n  }");
    }
    sb_printf(&b, "\n}\n");
    sb_finish(&b);
    return b.len;
}

// ---- memory.txt --------------------------------------------------------------------------------

/* The plan's summary: peaks, bytes per policy, and the blocks not kept (the first few). */
static void text_plan(struct sbuf *b, const struct qc_memreport_plan *pl)
{
    char b1[32], b2[32];
    qc_format_bytes(pl->predicted_peak_bytes, b1, sizeof b1);
    qc_format_bytes(pl->measured_peak_bytes, b2, sizeof b2);
    sb_printf(b, "\nplan of the peak step (step %" PRId64 "): predicted peak %s, measured %s\n",
              pl->step, b1, b2);
    for (int k = 0; k < QC_POLICY_COUNT; k++) {
        const char *name = qc_plan_policy_str((enum qc_stash_policy)k);
        uint64_t bytes = 0;
        int32_t n = 0;
        for (int32_t i = 0; i < pl->nblocks; i++)
            if (strcmp(pl->blocks[i].policy, name) == 0)
                bytes += pl->blocks[i].bytes, n++;
        qc_format_bytes(bytes, b1, sizeof b1);
        sb_printf(b, "  %-13s %4d blocks  %10s\n", name, (int)n, b1);
    }
    int32_t shown = 0, rest = 0;
    for (int32_t i = 0; i < pl->nblocks; i++) {
        const struct qc_memreport_plan_block *e = &pl->blocks[i];
        if (strcmp(e->policy, qc_plan_policy_str(QC_POLICY_KEEP)) == 0)
            continue;
        if (shown == TEXT_TOP_BLOCKS) {
            rest++;
            continue;
        }
        qc_format_bytes(e->bytes, b1, sizeof b1);
        sb_printf(b, "    %-13s %10s  %s\n", e->policy, b1, e->name);
        shown++;
    }
    if (rest)
        sb_printf(b, "    (%d more not kept)\n", (int)rest);
}

size_t qc_memreport_format_text(const struct qc_memreport *r, char *buf, size_t cap)
{
    struct sbuf b = {buf, cap, 0};
    const struct qc_alloc_stats *s = &r->stats;
    const struct qc_alloc_peak_snapshot *p = &r->peak;
    char b1[32], b2[32], b3[32];
    sb_printf(&b, "qctrain memory report: step %" PRId64 " of %" PRId64 " (%s)\n\n", r->step,
              r->total_steps, r->device ? r->device : "cpu");
    if (r->stopped) {
        char on[96] = "";
        if (r->stopped->world > 1 && r->stopped->rank >= 0)
            snprintf(on, sizeof on, " on rank %d of %d%s", r->stopped->rank, r->stopped->world,
                     r->stopped->failed_ranks > 1 ? ", the first of those that failed" : "");
        else if (r->stopped->world > 1)
            snprintf(on, sizeof on, " of %d ranks", r->stopped->world);
        sb_printf(&b, "STOPPED at step %" PRId64 " (%s%s)%s%s\n\n", r->stopped->step,
                  r->stopped->reason ? r->stopped->reason : "error", on,
                  r->stopped->message && r->stopped->message[0] ? ": " : "",
                  r->stopped->message ? r->stopped->message : "");
    }
    /* several ranks: the largest rank's peak decides whether the job fits */
    int64_t top = -1;
    for (int64_t i = 0; i < r->nranks; i++)
        if (top < 0 || r->ranks[i].peak_allocated_bytes > r->ranks[top].peak_allocated_bytes)
            top = i;
    if (r->nranks > 1) {
        qc_format_bytes(r->ranks[top].peak_allocated_bytes, b1, sizeof b1);
        qc_format_bytes(s->bytes_allocated_peak, b2, sizeof b2);
        sb_printf(&b,
                  "peak allocated   %10s  on rank %" PRId64 ", the largest of %" PRId64
                  " ranks (rank 0: %s at step %" PRId64 "; the rest is rank 0's)\n",
                  b1, r->ranks[top].rank, r->nranks, b2, p->step);
    } else {
        qc_format_bytes(s->bytes_allocated_peak, b1, sizeof b1);
        sb_printf(&b, "peak allocated   %10s  at step %" PRId64 "\n", b1, p->step);
    }
    qc_format_bytes(s->bytes_reserved_peak, b1, sizeof b1);
    sb_printf(&b, "peak reserved    %10s", b1);
    if (s->bytes_budget)
        sb_printf(&b, "  (%.1f %% of the budget)",
                  100.0 * share(s->bytes_reserved_peak, s->bytes_budget));
    sb_printf(&b, "\n");
    if (s->bytes_budget) {
        qc_format_bytes(s->bytes_budget, b1, sizeof b1);
        sb_printf(&b, "budget           %10s\n", b1);
    } else {
        sb_printf(&b, "budget           %10s\n", "unlimited");
    }
    sb_printf(&b, "fragmentation    %10.3f  (peak reserved / peak allocated; 1 = none)\n",
              s->fragmentation);
    qc_format_bytes(r->bytes_params_grads, b1, sizeof b1);
    qc_format_bytes(r->bytes_peak_rss, b2, sizeof b2);
    sb_printf(&b, "params+grads     %10s  (in the allocator, tags \"params\" and \"grads\")\n", b1);
    sb_printf(&b, "peak RSS         %10s\n", b2);
    sb_printf(&b,
              "allocator        %" PRIu64 " allocations, %" PRIu64 " maps, %" PRIu64
              " unmaps, %" PRIu64 " cache releases, %" PRIu64 " OOMs\n\n",
              s->n_allocs, s->n_maps, s->n_unmaps, s->n_retries, s->n_ooms);
    qc_format_bytes(p->bytes_allocated, b1, sizeof b1);
    sb_printf(&b, "top blocks at the peak (step %" PRId64 ", %s live in %" PRIu64 " blocks):\n",
              p->step, b1, p->n_blocks);
    const uint32_t ntop = p->ntop_blocks < TEXT_TOP_BLOCKS ? p->ntop_blocks : TEXT_TOP_BLOCKS;
    size_t rest = p->block_other.bytes;
    for (uint32_t i = ntop; i < p->ntop_blocks; i++)
        rest += p->blocks[i].bytes;
    for (uint32_t i = 0; i < ntop; i++) {
        const struct qc_alloc_tag_bytes *e = &p->blocks[i];
        qc_format_bytes(e->bytes, b3, sizeof b3);
        sb_printf(&b, "  %2u. %10s  %5.1f %%  %s\n", i + 1, b3,
                  100.0 * share(e->bytes, p->bytes_allocated), e->name);
    }
    if (rest) {
        qc_format_bytes(rest, b3, sizeof b3);
        sb_printf(&b, "      %10s  %5.1f %%  (the other %" PRIu64 " blocks)\n", b3,
                  100.0 * share(rest, p->bytes_allocated), p->n_blocks - ntop);
    }
    if (!p->ntop_blocks)
        sb_printf(&b, "  (nothing was allocated)\n");
    if (r->plan)
        text_plan(&b, r->plan);
    if (r->nranks > 0) {
        sb_printf(&b,
                  "\nper rank (%" PRId64 " ranks, ZeRO stage %" PRId64
                  "): params, grads (reduced), AdamW moments, comm buffers, peak\n",
                  r->nranks, r->zero_stage);
        for (int64_t i = 0; i < r->nranks; i++) {
            const struct qc_memreport_rank *e = &r->ranks[i];
            char p1[32], p2[32], p3[32], p4[32], p5[32], p6[32];
            qc_format_bytes(e->params_bytes, p1, sizeof p1);
            qc_format_bytes(e->grads_bytes, p2, sizeof p2);
            qc_format_bytes(e->grads_reduced_bytes, p3, sizeof p3);
            qc_format_bytes(e->moments_bytes, p4, sizeof p4);
            qc_format_bytes(e->comm_bytes, p5, sizeof p5);
            qc_format_bytes(e->peak_allocated_bytes, p6, sizeof p6);
            sb_printf(&b, "  rank %-3" PRId64 " %10s  %10s (%s)  %10s  %10s  %10s\n", e->rank, p1,
                      p2, p3, p4, p5, p6);
        }
    }
    sb_printf(&b, "\nevery figure: memory.json (docs/MEMORY_REPORT.md)\n");
    sb_finish(&b);
    return b.len;
}

// ---- writing -----------------------------------------------------------------------------------

/* Formats with fmt into a malloc'ed string and writes it to DIR/name atomically. */
static enum qc_status write_doc(const char *dir, const char *name,
                                size_t (*fmt)(const struct qc_memreport *, char *, size_t),
                                const struct qc_memreport *r, char *path, size_t n)
{
    const int pn = snprintf(path, n, "%s/%s", dir, name);
    if (pn < 0 || (size_t)pn >= n)
        return qc_errorf(QC_ERR_INVALID, "memory report: path too long: %s/%s", dir, name);
    const size_t len = fmt(r, NULL, 0);
    char *text = malloc(len + 1);
    if (!text)
        return qc_errorf(QC_ERR_NOMEM, "memory report: out of memory (%zu bytes)", len + 1);
    fmt(r, text, len + 1);
    const struct qc_file_part part = {text, len};
    const enum qc_status st = qc_file_write_atomic(path, &part, 1, "memory report");
    free(text);
    return st;
}

enum qc_status qc_memreport_write(const char *dir, const struct qc_memreport *r, char *txt_path,
                                  size_t n)
{
    char path[4096];
    QC_TRY(write_doc(dir, "memory.json", qc_memreport_format_json, r, path, sizeof path));
    QC_TRY(write_doc(dir, "memory.txt", qc_memreport_format_text, r, path, sizeof path));
    if (txt_path && n)
        snprintf(txt_path, n, "%s", path);
    return QC_OK;
}

void qc_memreport_from_alloc(struct qc_alloc *a, struct qc_memreport *r)
{
    qc_alloc_stats_get_run(a, &r->stats);
    qc_alloc_peak_snapshot(a, &r->peak);
}

// ---- the per-step series ------------------------------------------------------------------------

enum qc_status qc_memreport_series_add(struct qc_memreport_series *s,
                                       const struct qc_memreport_step *step)
{
    if (s->n == s->cap) {
        const int64_t cap = s->cap ? 2 * s->cap : 64;
        struct qc_memreport_step *ns = realloc(s->steps, (size_t)cap * sizeof(*ns));
        if (!ns)
            return qc_errorf(QC_ERR_NOMEM, "train: out of memory (memory series)");
        s->steps = ns;
        s->cap = cap;
    }
    s->steps[s->n++] = *step;
    return QC_OK;
}

void qc_memreport_series_free(struct qc_memreport_series *s)
{
    free(s->steps);
    *s = (struct qc_memreport_series){0};
}
