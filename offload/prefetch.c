/*
 * prefetch.c — reading NVMe handles back into the staging ring: the read of one block (for a
 * get, or ahead of it) with its checksum check, and the prefetch window. A read's completion
 * pumps the window and the pump issues reads, so both live here, above staging.c (slots,
 * handles) and below offload.c (put, get).
 *
 * The trainer gives the order in which backward will ask for handles (qc_offload_set_order).
 * The pump walks that order from a cursor and issues reads for the next handles' blocks while
 *   pf.bytes + block <= prefetch_window,  handles being prefetched < prefetch_count (if set),
 *   and more than `reserve` staging slots stay free,
 * so puts and gets always find a slot and prefetch can never starve them. It runs (engine lock
 * held) whenever something frees room: after set_order, a write or read completion, a get's
 * copy, a release. A handle that is not on disk yet (writes in flight) stops the walk; its
 * last write completion pumps again. Handles already got (consumed), being got (the get reads
 * what it still needs; re-reading blocks it has copied would only waste the window), released,
 * failed or in the host tier are skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload_internal.h"

// ---- reading a block into its slot (mu held) -----------------------------------------------

/* The read's completion (backend thread): verifies the block's checksum before it becomes
 * READY, so an unverified byte never reaches a get; then pumps, as the slot may have freed. */
static void read_done(struct offload_io *io)
{
    struct offload_slot *s = io->user;
    struct qc_offload *o = s->o;
    struct offload_chunk *c = s->chunk; /* stable while the read owns the slot */
    uint64_t sum = io->res == 0 ? offload_checksum(s->buf, c->len) : 0;
    pthread_mutex_lock(&o->mu);
    o->reads_inflight--;
    if (io->res != 0) {
        offload_chunk_fail_io(o, c, io);
    } else if (sum != c->sum) {
        char what[160];
        o->st.checksum_failures++;
        snprintf(what, sizeof what, "checksum mismatch: xxh3 %016llx read, %016llx written",
                 (unsigned long long)sum, (unsigned long long)c->sum);
        offload_chunk_fail(o, c, what);
    } else {
        c->state = CHUNK_READY;
        o->st.bytes_read += c->len;
    }
    if (c->state == CHUNK_FAILED)
        offload_slot_give_back(o, c);
    offload_prefetch_pump(o);
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

void offload_issue_read(struct qc_offload *o, struct offload_chunk *c, bool by_prefetch)
{
    struct offload_slot *s = offload_slot_take(o, c);
    struct offload_handle *h = c->h;
    c->state = CHUNK_READING;
    o->reads_inflight++;
    if (by_prefetch) {
        c->by_prefetch = true;
        o->pf.bytes += c->len;
        if (h->pf_chunks++ == 0)
            o->pf.active++;
        if (o->pf.bytes > o->st.prefetch_bytes_peak)
            o->st.prefetch_bytes_peak = o->pf.bytes;
        o->st.prefetch_reads++;
    }
    s->io = (struct offload_io){.op = OFFLOAD_READ,
                                .buf = s->buf,
                                .len = offload_chunk_io_len(o, c),
                                .off = offload_chunk_file_off(o, c),
                                .complete = read_done,
                                .user = s};
    o->io->submit(o->io, &s->io);
}

// ---- the prefetch window (mu held) -----------------------------------------------------------

static void pf_log(struct offload_prefetch *pf, struct offload_handle *h)
{
    if (h->pf_logged)
        return;
    h->pf_logged = true;
    if (pf->nlog < OFFLOAD_LOG_MAX)
        pf->log[pf->nlog++] = h->id;
}

/* Issues reads for h's unread blocks while allowed. Returns true when none is left unread. */
static bool pf_issue_handle(struct qc_offload *o, struct offload_handle *h, bool windowed)
{
    struct offload_prefetch *pf = &o->pf;
    for (uint32_t i = 0; i < h->nchunks; i++) {
        struct offload_chunk *c = &h->chunks[i];
        if (c->state != CHUNK_ON_DISK)
            continue;
        if (o->nfree <= o->reserve)
            return false;
        if (windowed && pf->bytes + c->len > o->p.prefetch_window)
            return false;
        if (windowed && h->pf_chunks == 0 && o->p.prefetch_count > 0 &&
            pf->active >= o->p.prefetch_count)
            return false;
        pf_log(pf, h);
        offload_issue_read(o, c, true);
    }
    return true;
}

void offload_prefetch_pump(struct qc_offload *o)
{
    struct offload_prefetch *pf = &o->pf;
    if (!o->io || o->p.prefetch_window == 0)
        return;
    while (pf->cursor < pf->n) {
        struct offload_handle *h = offload_handle_find(o, pf->order[pf->cursor]);
        if (!h || h->where != QC_OFFLOAD_PLACE_NVME || h->consumed || h->released || h->getting ||
            h->err != QC_OK) {
            pf->cursor++;
            continue;
        }
        if (h->writes_left > 0)
            return;
        if (!pf_issue_handle(o, h, true))
            return;
        pf->cursor++;
    }
}

void offload_prefetch_deinit(struct offload_prefetch *pf)
{
    free(pf->order);
    pf->order = NULL;
    pf->n = pf->cursor = 0;
}

enum qc_status qc_offload_set_order(struct qc_offload *o, const uint64_t *handles, size_t n)
{
    uint64_t *copy = NULL;
    if (n > 0) {
        copy = malloc(n * sizeof *copy);
        if (!copy)
            return qc_errorf(QC_ERR_NOMEM,
                             "offload: prefetch order of %zu handles: out of "
                             "memory",
                             n);
        memcpy(copy, handles, n * sizeof *copy);
    }
    pthread_mutex_lock(&o->mu);
    free(o->pf.order);
    o->pf.order = copy;
    o->pf.n = n;
    o->pf.cursor = 0;
    offload_prefetch_pump(o);
    pthread_mutex_unlock(&o->mu);
    return QC_OK;
}

enum qc_status qc_offload_prefetch(struct qc_offload *o, uint64_t handle)
{
    pthread_mutex_lock(&o->mu);
    struct offload_handle *h = offload_handle_find(o, handle);
    if (!h) {
        pthread_mutex_unlock(&o->mu);
        return qc_errorf(QC_ERR_INVALID, "offload: prefetch: no such handle 0x%llx",
                         (unsigned long long)handle);
    }
    if (h->where == QC_OFFLOAD_PLACE_NVME && h->err == QC_OK && !h->getting) {
        if (h->writes_left > 0)
            h->pf_wanted = true; /* the last write completion issues it */
        else
            pf_issue_handle(o, h, false);
    }
    pthread_mutex_unlock(&o->mu);
    return QC_OK;
}

void offload_prefetch_wanted(struct qc_offload *o, struct offload_handle *h)
{
    if (h->pf_wanted && h->writes_left == 0 && h->err == QC_OK && !h->released) {
        h->pf_wanted = false;
        pf_issue_handle(o, h, false);
    }
}

size_t qc_offload_prefetch_log(struct qc_offload *o, uint64_t *handles, size_t cap)
{
    pthread_mutex_lock(&o->mu);
    size_t n = o->pf.nlog;
    for (size_t i = 0; i < n && i < cap; i++)
        handles[i] = o->pf.log[i];
    pthread_mutex_unlock(&o->mu);
    return n;
}
