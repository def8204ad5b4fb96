/*
 * memctx.c — the memory context (qc_memctx.h): allocation and stream-ordered frees through the
 * caching allocator or host malloc, per-class accounting, fault injection for tests.
 */
#include "qc_memctx.h"

#include <stdlib.h>
#include <string.h>

#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_emu.h"

struct qc_memctx {
    struct qc_alloc *alloc;
    struct qc_emu *emu;
    struct qc_stream *compute;
    struct qc_memctx_stats st;
    int64_t fail_k, fail_count; /* next failing allocation (1-based from arming), run length */
    int64_t seen;               /* allocation calls since arming */
    void (*observe)(void *user, const char *tag, enum qc_mem_class cls, size_t bytes, bool alloc);
    void *observe_user;
};

enum qc_status qc_memctx_create(const struct qc_memctx_params *p, struct qc_memctx **out)
{
    struct qc_memctx *mc = calloc(1, sizeof *mc);
    if (!mc)
        return qc_errorf(QC_ERR_NOMEM, "memory context: %zu bytes", sizeof *mc);
    if (p) {
        mc->alloc = p->alloc;
        mc->emu = p->alloc ? NULL : p->emu;
        mc->compute = p->compute;
    }
    *out = mc;
    return QC_OK;
}

void qc_memctx_destroy(struct qc_memctx *mc)
{
    if (!mc)
        return;
    for (int c = 0; c < QC_MEM_CLASS_COUNT; c++)
        QC_ASSERT(mc->st.nlive[c] == 0, "memory context destroyed with %lld live allocations",
                  (long long)mc->st.nlive[c]);
    free(mc);
}

static void *host_alloc(size_t bytes)
{
    const size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

/* Whether this allocation call is one the armed fault makes fail. */
static bool injected_failure(struct qc_memctx *mc)
{
    if (mc->fail_k <= 0)
        return false;
    mc->seen++;
    if (mc->seen < mc->fail_k)
        return false;
    if (mc->seen - mc->fail_k >= mc->fail_count) {
        mc->fail_k = 0; /* the run of failures is over */
        return false;
    }
    return true;
}

void *qc_memctx_alloc(struct qc_memctx *mc, enum qc_mem_class cls, size_t bytes, const char *tag)
{
    if (bytes == 0)
        bytes = 1;
    if (!mc) {
        void *p = host_alloc(bytes);
        if (!p)
            (void)qc_errorf(QC_ERR_NOMEM, "host allocation of %zu bytes for %s failed", bytes,
                            tag ? tag : "(untagged)");
        return p;
    }
    QC_ASSERT(cls >= 0 && cls < QC_MEM_CLASS_COUNT, "memory context: class %d", (int)cls);
    void *p = NULL;
    if (injected_failure(mc)) {
        mc->st.n_fail++;
        (void)qc_errorf(QC_ERR_NOMEM, "allocation of %zu bytes for %s failed (injected)", bytes,
                        tag ? tag : "(untagged)");
        return NULL;
    }
    if (mc->alloc) {
        if (qc_alloc_malloc(mc->alloc, bytes, mc->compute, tag, &p) != QC_OK)
            p = NULL; /* the allocator's OOM report is the error */
    } else if (mc->emu) {
        p = qc_emu_alloc(mc->emu, bytes);
        if (!p)
            (void)qc_errorf(QC_ERR_NOMEM, "emulated-device allocation of %zu bytes for %s failed",
                            bytes, tag ? tag : "(untagged)");
    } else {
        p = host_alloc(bytes);
        if (!p)
            (void)qc_errorf(QC_ERR_NOMEM, "host allocation of %zu bytes for %s failed", bytes,
                            tag ? tag : "(untagged)");
    }
    if (!p) {
        mc->st.n_fail++;
        return NULL;
    }
    mc->st.live[cls] += bytes;
    mc->st.nlive[cls]++;
    mc->st.n_allocs[cls]++;
    const size_t work = mc->st.live[QC_MEM_MODEL] + mc->st.live[QC_MEM_BLOCK];
    if (work > mc->st.work_peak)
        mc->st.work_peak = work;
    if (mc->observe)
        mc->observe(mc->observe_user, tag, cls, bytes, true);
    return p;
}

void qc_memctx_free(struct qc_memctx *mc, enum qc_mem_class cls, void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes == 0)
        bytes = 1;
    if (!mc) {
        free(p);
        return;
    }
    QC_ASSERT(mc->st.live[cls] >= bytes && mc->st.nlive[cls] > 0,
              "memory context: freeing %zu bytes of class %d with %zu live", bytes, (int)cls,
              mc->st.live[cls]);
    if (mc->observe)
        mc->observe(mc->observe_user, NULL, cls, bytes, false);
    mc->st.live[cls] -= bytes;
    mc->st.nlive[cls]--;
    if (mc->alloc)
        qc_alloc_free(mc->alloc, p, mc->compute);
    else if (mc->emu)
        qc_emu_free(mc->emu, p, bytes);
    else
        free(p);
}

struct qc_alloc *qc_memctx_allocator(const struct qc_memctx *mc)
{
    return mc ? mc->alloc : NULL;
}

bool qc_memctx_is_device(const struct qc_memctx *mc)
{
    return mc && (mc->alloc || mc->emu);
}

struct qc_stream *qc_memctx_compute_stream(const struct qc_memctx *mc)
{
    return mc ? mc->compute : NULL;
}

void qc_memctx_stats_get(const struct qc_memctx *mc, struct qc_memctx_stats *out)
{
    if (!mc) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = mc->st;
}

void qc_memctx_reset_peak(struct qc_memctx *mc)
{
    if (mc)
        mc->st.work_peak = mc->st.live[QC_MEM_MODEL] + mc->st.live[QC_MEM_BLOCK];
}

void qc_memctx_fail_at(struct qc_memctx *mc, int64_t k, int64_t count)
{
    mc->fail_k = k > 0 ? k : 0;
    mc->fail_count = count > 0 ? count : 1;
    mc->seen = 0;
}

void qc_memctx_set_observer(struct qc_memctx *mc,
                            void (*fn)(void *user, const char *tag, enum qc_mem_class cls,
                                       size_t bytes, bool alloc),
                            void *user)
{
    mc->observe = fn;
    mc->observe_user = user;
}
