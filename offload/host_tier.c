/*
 * host_tier.c — the pinned host tier: tensors kept whole in pinned memory from the pinned
 * allocator, bounded by params.host_capacity (counted in requested bytes; the arena's own
 * rounding is its business). Called with the engine lock held.
 *
 * Invariant: o->host_used == sum of size over live host-tier handles <= host_capacity.
 */
#include "offload_internal.h"
#include "qc_pinned.h"

enum qc_status offload_host_alloc(struct qc_offload *o, size_t size, const char *tag, void **out)
{
    if (o->p.host_capacity == 0)
        return qc_errorf(QC_ERR_NOMEM, "offload: no host tier (host_capacity is 0)");
    if (size > o->p.host_capacity - o->host_used)
        return qc_errorf(QC_ERR_NOMEM,
                         "offload: host tier full: tensor '%s' needs %zu bytes, %zu of %zu in "
                         "use\nhint: raise offload.host_capacity or give offload.nvme_dir",
                         tag, size, o->host_used, o->p.host_capacity);
    void *p = NULL;
    QC_TRY(qc_pinned_malloc(o->pinned, size, 64, tag, &p));
    o->host_used += size;
    if (o->host_used > o->host_peak)
        o->host_peak = o->host_used;
    *out = p;
    return QC_OK;
}

void offload_host_free(struct qc_offload *o, void *p, size_t size)
{
    if (!p)
        return;
    qc_pinned_free(o->pinned, p);
    o->host_used -= size;
}
