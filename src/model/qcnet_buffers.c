/*
 * qcnet_buffers.c — the model's activation memory: every buffer of a forward comes from the
 * memory context (qc_memctx.h, class QC_MEM_MODEL, under a tag) and is recorded in m->bufs until
 * qcnet_free gives it back early or qc_qcnet_release (qcnet_bufs_free_all) gives back the rest;
 * stash tables are bound to such buffers (qcnet_stash_bind). Also the host side of data derived
 * from the batch: the inputs the host computes (qcnet_input_begin / _end: one path for every
 * backend, the dry run's included, so no caller restates an allocation for the dry run), host
 * temporaries, uploads into recorded buffers, downloads.
 *
 * Invariant: bytes_bufs = Σ bufs bytes. The lowest of the qcnet_*.c files: it calls none of them.
 */
#include <stdlib.h>

#include "qc_exec.h"
#include "qc_kernels.h"
#include "qc_oom.h"
#include "qc_plan.h"
#include "qcnet_internal.h"

static enum qc_status bufs_reserve(struct qc_qcnet *m);

enum qc_status qcnet_balloc(struct qc_qcnet *m, size_t bytes, const char *tag, void **out)
{
    QC_TRY(bufs_reserve(m));
    void *p = qc_memctx_alloc(m->mc, QC_MEM_MODEL, bytes, tag);
    if (!p) /* the figures and the hint: qc_oom.h */
        return qc_oom_errorf(m->cfg.attention == QC_ATTN_FUSED ? QC_OOM_ATTENTION_FUSED
                                                               : QC_OOM_ATTENTION_UNFUSED,
                             "model: allocation of %zu bytes for %s failed (%zu bytes live)", bytes,
                             tag, m->bytes_bufs);
    m->bufs[m->nbufs].p = p;
    m->bufs[m->nbufs].bytes = bytes;
    m->nbufs++;
    m->bytes_bufs += bytes;
    *out = p;
    return QC_OK;
}

enum qc_status qcnet_falloc(struct qc_qcnet *m, int64_t n, const char *tag, float **out)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, (size_t)(n > 0 ? n : 0) * sizeof(float), tag, &p));
    *out = p;
    return QC_OK;
}

enum qc_status qcnet_zalloc(struct qc_qcnet *m, int64_t n, const char *tag, float **out)
{
    QC_TRY(qcnet_falloc(m, n, tag, out));
    if (n > 0)
        qc_op_zero(m->ex, *out, (size_t)n * sizeof(float));
    return QC_OK;
}

enum qc_status qcnet_ialloc(struct qc_qcnet *m, int64_t n, const char *tag, int64_t **out)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, (size_t)(n > 0 ? n : 0) * sizeof(int64_t), tag, &p));
    *out = p;
    return QC_OK;
}

enum qc_status qcnet_upload(struct qc_qcnet *m, const void *host, size_t bytes, const char *tag,
                            void **out)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, bytes, tag, &p));
    enum qc_status st = qc_op_upload(m->ex, p, host, bytes);
    if (st != QC_OK) {
        qcnet_free(m, p);
        return st;
    }
    *out = p;
    return QC_OK;
}

void *qcnet_host_tmp(size_t bytes, const char *what)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        (void)qc_errorf(QC_ERR_NOMEM, "model: host buffer of %zu bytes for %s", bytes, what);
    return p;
}

enum qc_status qcnet_upload_tmp(struct qc_qcnet *m, void *host, size_t bytes, const char *tag,
                                void **out)
{
    enum qc_status s = qcnet_upload(m, host, bytes, tag, out);
    free(host);
    return s;
}

enum qc_status qcnet_input_begin(struct qc_qcnet *m, size_t bytes, const char *tag, void **host)
{
    *host = NULL;
    if (m->dry) /* nothing to compute; the allocation comes at the end, as on a device */
        return QC_OK;
    if (!qc_exec_is_device(m->ex)) /* the context memory is host memory: written in place */
        return qcnet_balloc(m, bytes, tag, host);
    *host = qcnet_host_tmp(bytes, tag);
    return *host ? QC_OK : QC_ERR_NOMEM;
}

enum qc_status qcnet_input_end(struct qc_qcnet *m, void *host, size_t bytes, const char *tag,
                               bool keep, void **out)
{
    if (m->dry)
        return qcnet_balloc(m, bytes, tag, out);
    if (!qc_exec_is_device(m->ex)) {
        *out = host;
        return QC_OK;
    }
    if (keep)
        return qcnet_upload(m, host, bytes, tag, out);
    return qcnet_upload_tmp(m, host, bytes, tag, out);
}

void qcnet_input_drop(struct qc_qcnet *m, void *host)
{
    if (!host)
        return;
    if (qc_exec_is_device(m->ex))
        free(host);
    else
        qcnet_free(m, host);
}

enum qc_status qcnet_download(struct qc_qcnet *m, void *host, const void *dev, size_t bytes)
{
    return qc_op_download(m->ex, host, dev, bytes);
}

void qcnet_free(struct qc_qcnet *m, void *p)
{
    if (!p)
        return;
    for (int i = m->nbufs - 1; i >= 0; i--) {
        if (m->bufs[i].p != p)
            continue;
        qc_memctx_free(m->mc, QC_MEM_MODEL, p, m->bufs[i].bytes);
        m->bytes_bufs -= m->bufs[i].bytes;
        m->bufs[i] = m->bufs[--m->nbufs];
        return;
    }
    QC_ASSERT(false, "model: freeing %p, not an activation of this model", p);
}

/* Room for one more buffer in the list. */
static enum qc_status bufs_reserve(struct qc_qcnet *m)
{
    if (m->nbufs < m->cap_bufs)
        return QC_OK;
    int cap = m->cap_bufs ? 2 * m->cap_bufs : 256;
    struct qcnet_buf *b = realloc(m->bufs, (size_t)cap * sizeof *b);
    if (!b)
        return qc_errorf(QC_ERR_NOMEM, "model: activation list of %d entries", cap);
    m->bufs = b;
    m->cap_bufs = cap;
    return QC_OK;
}

size_t qcnet_buf_detach(struct qc_qcnet *m, void *p)
{
    for (int i = m->nbufs - 1; i >= 0; i--) {
        if (m->bufs[i].p != p)
            continue;
        const size_t bytes = m->bufs[i].bytes;
        m->bytes_bufs -= bytes;
        m->bufs[i] = m->bufs[--m->nbufs];
        return bytes;
    }
    QC_ASSERT(false, "model: detaching %p, not an activation of this model", p);
    return 0;
}

enum qc_status qcnet_buf_attach(struct qc_qcnet *m, void *p, size_t bytes)
{
    QC_TRY(bufs_reserve(m));
    m->bufs[m->nbufs].p = p;
    m->bufs[m->nbufs].bytes = bytes;
    m->nbufs++;
    m->bytes_bufs += bytes;
    return QC_OK;
}

void qcnet_bufs_free_all(struct qc_qcnet *m)
{
    for (int i = m->nbufs - 1; i >= 0; i--) {
        qc_memctx_free(m->mc, QC_MEM_MODEL, m->bufs[i].p, m->bufs[i].bytes);
        m->bytes_bufs -= m->bufs[i].bytes;
    }
    m->nbufs = 0;
}

enum qc_status qcnet_stash_bind(struct qc_qcnet *m, int entry, struct qc_stash *st, const char *tag)
{
    void *p = NULL;
    QC_TRY(qcnet_balloc(m, qc_stash_arena_bytes(st), tag, &p));
    qc_stash_bind(st, p);
    m->bytes_stash += qc_stash_bytes(st);
    struct qc_plan_program *rec = qc_memctx_recording(m->mc);
    if (st->precision) /* a 16-bit stash: its packed arena is the stash (qcnet_tape.c) */
        rec = NULL;
    if (rec && qc_plan_program_event(rec, QC_PLAN_OP_STASH, entry, qc_memctx_alloc_id(m->mc, p), 0,
                                     0, 0) < 0)
        return QC_ERR_NOMEM;
    return QC_OK;
}

void qcnet_stash_free(struct qc_qcnet *m, struct qc_stash *st)
{
    if (st->arena && !st->owned)
        qcnet_free(m, st->arena);
    st->arena = NULL;
    qc_stash_deinit(st);
}
