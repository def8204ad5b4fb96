/*
 * staging.c — the engine state every path shares, under the engine mutex: the handle table, the
 * staging slots (with the bytes prefetch holds in them) and the record of a chunk's failure.
 * offload.c (put, get, release) and prefetch.c (reads) build on it; it calls neither.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload_internal.h"

/* snprintf for messages that may be cut at cap (paths can be long); never overflows. */
static void msg_printf(char *dst, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void msg_printf(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

// ---- handle table (mu held) ----------------------------------------------------------------

enum qc_status offload_handle_insert(struct qc_offload *o, struct offload_handle *h)
{
    uint32_t idx;
    if (o->tab_nfree > 0) {
        idx = o->tab_free[--o->tab_nfree];
    } else {
        if (o->tab_used == o->tab_cap) {
            uint32_t cap = o->tab_cap ? o->tab_cap * 2 : 256;
            struct offload_table_entry *tab = realloc(o->tab, cap * sizeof *tab);
            if (!tab)
                return qc_errorf(QC_ERR_NOMEM, "offload: handle table: out of memory");
            o->tab = tab;
            uint32_t *fr = realloc(o->tab_free, cap * sizeof *fr);
            if (!fr)
                return qc_errorf(QC_ERR_NOMEM, "offload: handle table: out of memory");
            o->tab_free = fr;
            memset(tab + o->tab_cap, 0, (cap - o->tab_cap) * sizeof *tab);
            o->tab_cap = cap;
        }
        idx = o->tab_used++;
    }
    struct offload_table_entry *e = &o->tab[idx];
    e->gen = e->gen + 1 ? e->gen + 1 : 1;
    e->h = h;
    h->id = (uint64_t)e->gen << 32 | (uint64_t)(idx + 1);
    return QC_OK;
}

void offload_handle_remove(struct qc_offload *o, struct offload_handle *h)
{
    uint32_t idx = (uint32_t)(h->id & 0xffffffffu) - 1;
    o->tab[idx].h = NULL;
    o->tab_free[o->tab_nfree++] = idx;
}

struct offload_handle *offload_handle_find(struct qc_offload *o, uint64_t id)
{
    uint32_t idx = (uint32_t)(id & 0xffffffffu);
    if (idx == 0 || idx > o->tab_used)
        return NULL;
    struct offload_table_entry *e = &o->tab[idx - 1];
    if (!e->h || e->gen != (uint32_t)(id >> 32) || e->h->released)
        return NULL;
    return e->h;
}

// ---- staging slots and errors (mu held) ----------------------------------------------------

/* A prefetch-held chunk left its slot (consumed, failed or released): pf.bytes follows. */
void offload_prefetch_chunk_done(struct qc_offload *o, struct offload_chunk *c)
{
    if (!c->by_prefetch)
        return;
    c->by_prefetch = false;
    o->pf.bytes -= c->len;
    if (--c->h->pf_chunks == 0)
        o->pf.active--;
}

struct offload_slot *offload_slot_take(struct qc_offload *o, struct offload_chunk *c)
{
    struct offload_slot *s = o->free_slots;
    QC_ASSERT(s != NULL, "offload: no free staging slot (nfree %u)", o->nfree);
    o->free_slots = s->next_free;
    o->nfree--;
    s->next_free = NULL;
    s->chunk = c;
    c->slot = s;
    c->h->busy++;
    return s;
}

void offload_slot_give_back(struct qc_offload *o, struct offload_chunk *c)
{
    struct offload_slot *s = c->slot;
    QC_ASSERT(s != NULL, "offload: block %u of '%s' holds no slot", c->index, c->h->tag);
    offload_prefetch_chunk_done(o, c);
    c->slot = NULL;
    s->chunk = NULL;
    s->next_free = o->free_slots;
    o->free_slots = s;
    o->nfree++;
    c->h->busy--;
}

/* Records the handle's (and the engine's) first error; the chunk becomes FAILED. */
void offload_chunk_fail(struct qc_offload *o, struct offload_chunk *c, const char *what)
{
    struct offload_handle *h = c->h;
    if (h->err == QC_OK) {
        h->err = QC_ERR_IO;
        msg_printf(h->errmsg, sizeof h->errmsg,
                   "offload: %s: file %s, offset %llu, %zu bytes, tensor '%s' (block %u of %u)",
                   what, o->nvme.path, (unsigned long long)offload_chunk_file_off(o, c), c->len,
                   h->tag, c->index + 1, h->nchunks);
    }
    /* quiesce reports what no caller has seen: write errors and failed prefetch reads (a get's
     * own reads are reported by the get) */
    bool unseen = c->state == CHUNK_WRITING || c->by_prefetch;
    c->state = CHUNK_FAILED;
    if (unseen && o->first_err == QC_OK) {
        o->first_err = h->err;
        snprintf(o->first_errmsg, sizeof o->first_errmsg, "%s", h->errmsg);
    }
}

void offload_chunk_fail_io(struct qc_offload *o, struct offload_chunk *c,
                           const struct offload_io *io)
{
    const char *op = io->op == OFFLOAD_READ ? "read" : "write";
    char what[256];
    o->st.io_errors++;
    if (io->res == -ENODATA)
        snprintf(what, sizeof what, "short %s: %zu of %zu bytes, then no progress", op, io->done,
                 io->len);
    else if (io->res == -EINVAL && io->done > 0)
        snprintf(what, sizeof what,
                 "short %s: %zu of %zu bytes left an unaligned O_DIRECT remainder", op, io->done,
                 io->len);
    else
        snprintf(what, sizeof what, "%s failed: %s", op, strerror(-io->res));
    offload_chunk_fail(o, c, what);
    if (io->res == -ENOSPC && c->h->err == QC_ERR_IO && strstr(c->h->errmsg, "No space"))
        snprintf(c->h->errmsg + strlen(c->h->errmsg), sizeof c->h->errmsg - strlen(c->h->errmsg),
                 "\nhint: the spill directory's filesystem is full; free space or lower "
                 "offload.nvme_capacity");
    else if (io->res == -EIO && c->h->err == QC_ERR_IO && strstr(c->h->errmsg, "I/O error"))
        snprintf(c->h->errmsg + strlen(c->h->errmsg), sizeof c->h->errmsg - strlen(c->h->errmsg),
                 "\nhint: the disk reported an I/O error (see dmesg)");
}
