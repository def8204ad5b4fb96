/*
 * backend.c — where a run's model executes (device.kind), set up once for train, eval and the
 * benches: the device, the caching allocator under every model and optimizer byte, the op
 * backend (struct qc_exec) and, on CUDA, the ops' context and the loader's pinned memory; plus
 * the staging of loader batches into device memory (train_internal.h).
 *
 *   cpu   a CPU device (inline compute stream, worker-thread copy streams) and the allocator's
 *         host backend on it; ops inline (exec backend CPU, the model's NULL).
 *   cuda  device device.ordinal; its allocator (device.budget, alloc.*); a reduction workspace
 *         of QC_KERNELS_CUDA_WORKSPACE_BYTES from it for the ops' context (TF32 = device.tf32,
 *         off by default: fp32 like QCNet), made current for the creating thread; ops on the
 *         device's compute stream; a copy stream for batches; a pinned host allocator for the
 *         loader. CUDA-only calls are behind #ifdef QC_HAVE_CUDA and go through qc_device,
 *         qc_alloc, qc_pinned and qc_kernels_cuda only.
 *   emu   a CPU device and an emulated-device arena (qc_emu.h) of ordinal device.ordinal, from
 *         which the allocator maps its segments: the model runs the CUDA path's host logic on
 *         the CPU ops, and a host access of device memory faults (tests and debugging). The
 *         loader's batches come from a pinned arena registered with the emulated device, as on
 *         CUDA (a registration from a thread on another device is refused). Results equal cpu
 *         bit for bit.
 */
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>

#include "qc_loader.h"
#include "qc_offload.h"
#include "qc_oom.h"

#ifdef QC_HAVE_CUDA
#    include "qc_kernels_cuda.h"
#endif

/* Address space reserved for the EMU arena when device.budget is 0 (PROT_NONE and
 * MAP_NORESERVE: nothing is committed until the allocator maps a segment). */
#define TRAIN_EMU_RESERVE ((size_t)64 << 30)

const char *qc_train_device_str(int64_t kind)
{
    switch (kind) {
    case QC_CONFIG_DEVICE_CPU:
        return "cpu";
    case QC_CONFIG_DEVICE_CUDA:
        return "cuda";
    case QC_CONFIG_DEVICE_EMU:
        return "emu";
    default:
        return "?";
    }
}

/* The allocator parameters of cfg (device.budget, alloc.*). */
static void alloc_params_from_config(const struct qc_config *cfg, struct qc_alloc_params *p)
{
    qc_alloc_params_default(p);
    p->budget = (size_t)cfg->device_budget;
    p->round = (size_t)cfg->alloc_round;
    p->small_max = (size_t)cfg->alloc_small_max;
    p->small_segment = (size_t)cfg->alloc_small_segment;
    p->large_segment = (size_t)cfg->alloc_large_segment;
    p->split_limit = (size_t)cfg->alloc_split_limit;
    p->expandable = cfg->alloc_expandable;
    p->trace = cfg->alloc_trace;
    p->trace_file = cfg->alloc_trace_file[0] ? cfg->alloc_trace_file : NULL;
}

#ifdef QC_HAVE_CUDA
/* The CUDA part of create: workspace, pinned memory (the loader's, and the ops' upload staging
 * ring), op context (made current), copy stream. */
static enum qc_status backend_cuda_init(struct qc_train_backend *b, const struct qc_config *cfg)
{
    QC_TRY(qc_alloc_malloc(b->alloc, QC_KERNELS_CUDA_WORKSPACE_BYTES, NULL, "kernels/workspace",
                           &b->workspace));
    QC_TRY(qc_pinned_create(b->dev, 0, &b->pinned));
    QC_TRY(qc_pinned_malloc(b->pinned, QC_KERNELS_CUDA_STAGING_BYTES, 4096, "kernels/staging",
                            &b->staging));
    const struct qc_kernels_cuda_params kp = {
        .device = (int)cfg->device_ordinal,
        .tf32 = cfg->tf32,
        .workspace = b->workspace,
        .workspace_bytes = QC_KERNELS_CUDA_WORKSPACE_BYTES,
        .staging = b->staging, /* uploads of pageable memory do not stall the stream */
        .staging_bytes = QC_KERNELS_CUDA_STAGING_BYTES,
    };
    QC_TRY(qc_kernels_cuda_create(&kp, &b->kctx));
    qc_kernels_cuda_set_current(b->kctx);
    QC_TRY(qc_stream_create(b->dev, QC_STREAM_COPY, &b->copy));
    b->exec = (struct qc_exec){
        .backend = QC_EXEC_CUDA,
        .stream = qc_stream_native(qc_device_compute_stream(b->dev)),
        .emu = NULL,
    };
    return QC_OK;
}
#endif

static enum qc_status backend_init(struct qc_train_backend *b, const struct qc_config *cfg)
{
    struct qc_alloc_params ap;
    alloc_params_from_config(cfg, &ap);
    switch (b->kind) {
    case QC_CONFIG_DEVICE_CPU:
        b->exec = (struct qc_exec){.backend = QC_EXEC_CPU};
        QC_TRY(qc_device_create(QC_DEVICE_CPU, 0, &b->dev));
        return qc_alloc_create(b->dev, &ap, &b->alloc);
    case QC_CONFIG_DEVICE_EMU: {
        const size_t reserve =
            cfg->device_budget > 0 && 2 * (size_t)cfg->device_budget < TRAIN_EMU_RESERVE
                ? 2 * (size_t)cfg->device_budget + ((size_t)64 << 20)
                : TRAIN_EMU_RESERVE;
        const int ordinal = (int)cfg->device_ordinal;
        QC_TRY(qc_device_create(QC_DEVICE_CPU, ordinal, &b->dev));
        QC_TRY(qc_emu_create(reserve, &b->emu));
        qc_emu_set_ordinal(b->emu, ordinal);
        qc_emu_device_set(ordinal); /* this thread works for the device, as on CUDA */
        ap.emu = b->emu;
        QC_TRY(qc_alloc_create(b->dev, &ap, &b->alloc));
        /* the loader's batches: pinned on the emulated device from the loader's workers */
        QC_TRY(qc_pinned_create_emu(b->emu, 0, &b->pinned));
        b->exec = (struct qc_exec){.backend = QC_EXEC_EMU, .stream = NULL, .emu = b->emu};
        return QC_OK;
    }
    case QC_CONFIG_DEVICE_CUDA:
#ifdef QC_HAVE_CUDA
        QC_TRY(qc_device_create(QC_DEVICE_CUDA, (int)cfg->device_ordinal, &b->dev));
        QC_TRY(qc_alloc_create(b->dev, &ap, &b->alloc));
        return backend_cuda_init(b, cfg);
#else
        return qc_errorf(QC_ERR_UNSUPPORTED,
                         "--device cuda: this qctrain was built without CUDA support\n"
                         "hint: rebuild with -DQC_CUDA=ON (needs the CUDA toolkit), or run with "
                         "--device cpu");
#endif
    case QC_CONFIG_DEVICE_COUNT:
        break;
    }
    return qc_errorf(QC_ERR_INVALID, "device.kind %d is not one of cpu, cuda, emu", (int)b->kind);
}

enum qc_status qc_train_backend_create(const struct qc_config *cfg, struct qc_train_backend **out)
{
    struct qc_train_backend *b = calloc(1, sizeof(*b));
    if (!b)
        return qc_errorf(QC_ERR_NOMEM, "backend: out of memory");
    b->kind = (enum qc_config_device)cfg->device_kind;
    enum qc_status st = backend_init(b, cfg);
    b->exec.precision = cfg->precision; /* the ops round to it (docs/PRECISION.md) */
    if (st == QC_OK) {
        const struct qc_memctx_params mp = {
            .alloc = b->alloc,
            .compute = qc_device_compute_stream(b->dev),
        };
        st = qc_memctx_create(&mp, &b->mc);
    }
    if (st != QC_OK) {
        qc_train_backend_destroy(b);
        return st;
    }
    *out = b;
    return QC_OK;
}

void qc_train_backend_destroy(struct qc_train_backend *b)
{
    if (!b)
        return;
#ifdef QC_HAVE_CUDA
    if (b->kctx) {
        if (qc_kernels_cuda_current() == b->kctx)
            qc_kernels_cuda_set_current(NULL);
        qc_kernels_cuda_destroy(b->kctx);
    }
#endif
    qc_memctx_destroy(b->mc);
    qc_offload_destroy(b->offload); /* waits for its I/O; no put is outstanding after a step */
    qc_stream_destroy(b->copy_in);
    if (b->workspace)
        qc_alloc_free(b->alloc, b->workspace, NULL);
    if (b->staging) /* the context that copied from it is gone (it synchronized the device) */
        qc_pinned_free(b->pinned, b->staging);
    qc_alloc_destroy(b->alloc); /* synchronizes the device: no copy is in flight after it */
    qc_stream_destroy(b->copy);
    qc_pinned_destroy(b->pinned);
    qc_device_destroy(b->dev); /* its streams and events are gone by now */
    qc_emu_destroy(b->emu);    /* after the allocator: its segments live in the arena */
    free(b);
}

const struct qc_exec *qc_train_backend_exec(const struct qc_train_backend *b)
{
    return b->kind == QC_CONFIG_DEVICE_CPU && b->exec.precision == 0 ? NULL : &b->exec;
}

struct qc_alloc *qc_train_backend_alloc(struct qc_train_backend *b)
{
    return b->alloc;
}

enum qc_status qc_train_backend_offload(struct qc_train_backend *b, const struct qc_config *cfg)
{
    if (b->offload)
        return QC_OK;
    struct qc_offload_params op;
    qc_offload_params_default(&op);
    op.host_capacity = cfg->offload_placement == QC_PLACE_NVME ? 0 : qc_train_host_tier_bytes(cfg);
    op.nvme_dir = cfg->offload_nvme_dir[0] ? cfg->offload_nvme_dir : NULL;
    op.nvme_capacity = qc_train_nvme_tier_bytes(cfg);
    op.queue_depth = (int)cfg->offload_queue_depth;
    op.block_size = cfg->offload_block_size;
    op.max_inflight = cfg->offload_max_inflight;
    op.prefetch_window = cfg->offload_prefetch_window;
    op.direct = cfg->offload_direct;
    op.pinned = b->pinned;
    if (b->emu) /* the engine's copies move arena memory: they open it */
        qc_device_cpu_set_emu(b->dev, b->emu);
    /* cpu / emu: the copies are memcpy on the cores the ops' OpenMP threads use; run inline
     * between the blocks (on 2 cores a copy thread beside them made AV2 steps 4x slower) */
    if (b->kind != QC_CONFIG_DEVICE_CUDA)
        qc_device_cpu_set_inline_streams(b->dev, true);
    enum qc_status st = qc_stream_create(b->dev, QC_STREAM_COPY, &b->copy_in);
    if (st == QC_OK)
        st = qc_offload_create(b->dev, &op, &b->offload);
    if (st == QC_OK)
        st = qc_memctx_set_offload(b->mc, b->offload, b->copy_in);
    if (st == QC_OK) /* an out-of-memory hint names why offload.nvme_dir gave no tier */
        qc_oom_set_nvme_unusable(qc_offload_nvme_unusable(b->offload));
    if (st != QC_OK) {
        qc_offload_destroy(b->offload);
        qc_stream_destroy(b->copy_in);
        b->offload = NULL;
        b->copy_in = NULL;
        return qc_error_wrap(st, "offload tier");
    }
    return QC_OK;
}

struct qc_offload *qc_train_backend_offload_engine(struct qc_train_backend *b)
{
    return b->offload;
}

struct qc_memctx *qc_train_backend_memctx(struct qc_train_backend *b)
{
    return b->mc;
}

struct qc_device *qc_train_backend_device(struct qc_train_backend *b)
{
    return b->dev;
}

const char *qc_train_backend_name(const struct qc_train_backend *b)
{
    return qc_train_device_str(b->kind);
}

enum qc_status qc_train_backend_model(struct qc_train_backend *b, const struct qc_config *cfg,
                                      struct qc_qcnet **out)
{
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    /* parameters, gradients and every activation come from the caching allocator, under
     * device.budget */
    return qc_qcnet_create_on(&mc, b->mc, qc_train_backend_exec(b), out);
}

void qc_train_backend_loader_opts(const struct qc_train_backend *b, const struct qc_config *cfg,
                                  struct qc_loader_opts *o)
{
    qc_train_loader_opts(cfg, o);
    if (b->pinned) /* CUDA (EMU: emulated): batches ready for an asynchronous copy */
        qc_host_alloc_pinned(b->pinned, &o->alloc);
}

// ---- staging batches -----------------------------------------------------------------------

/* Device block for `bytes` of a batch block (NULL when the block is absent or empty). */
static enum qc_status stage_block(struct qc_train_backend *be, const void *host, size_t bytes,
                                  const char *tag, void **out)
{
    *out = NULL;
    if (!host || bytes == 0)
        return QC_OK;
    void *p = NULL;
    QC_TRY(qc_alloc_malloc(be->alloc, bytes, be->copy, tag, &p));
    enum qc_status st = QC_OK;
    if (be->kind == QC_CONFIG_DEVICE_CUDA) {
        st = qc_memcpy_async(be->copy, p, host, bytes, QC_COPY_H2D);
        /* the compute stream reads it too: its free waits for the model's work */
        if (st == QC_OK)
            st = qc_alloc_record_stream(be->alloc, p, qc_device_compute_stream(be->dev));
    } else {
        st = qc_op_upload(&be->exec, p, host, bytes);
    }
    if (st != QC_OK) {
        qc_alloc_free(be->alloc, p, be->copy);
        return st;
    }
    *out = p;
    return QC_OK;
}

enum qc_status train_stage_put(struct qc_train_backend *be, struct train_stage *s,
                               struct qc_batch *b)
{
    QC_ASSERT(!s->host, "train_stage_put: the stage is in use");
    if (be->kind == QC_CONFIG_DEVICE_CPU) {
        s->host = b;
        return QC_OK;
    }
    enum qc_status st = stage_block(be, b->node_mem, b->node_bytes, "batch/nodes", &s->node_dev);
    if (st == QC_OK)
        st = stage_block(be, b->graph_mem, b->graph_bytes, "batch/graph", &s->graph_dev);
    if (st == QC_OK && be->kind == QC_CONFIG_DEVICE_CUDA) {
        if (!s->ev)
            st = qc_event_create(be->dev, &s->ev);
        if (st == QC_OK)
            st = qc_event_record(s->ev, be->copy);
    }
    if (st != QC_OK) {
        if (be->copy) /* b goes back to the caller: no copy may still read it */
            (void)qc_stream_synchronize(be->copy);
        qc_alloc_free(be->alloc, s->node_dev, be->copy);
        qc_alloc_free(be->alloc, s->graph_dev, be->copy);
        s->node_dev = s->graph_dev = NULL;
        return st;
    }
    qc_batch_rebase(b, s->node_dev, s->graph_dev, &s->view);
    s->host = b;
    return QC_OK;
}

enum qc_status train_stage_use(struct qc_train_backend *be, struct train_stage *s,
                               const struct qc_batch **batch_dev)
{
    *batch_dev = NULL;
    if (be->kind == QC_CONFIG_DEVICE_CPU)
        return QC_OK;
    if (be->kind == QC_CONFIG_DEVICE_CUDA)
        QC_TRY(qc_stream_wait_event(qc_device_compute_stream(be->dev), s->ev));
    *batch_dev = &s->view;
    return QC_OK;
}

struct qc_batch *train_stage_drop(struct qc_train_backend *be, struct train_stage *s)
{
    struct qc_batch *b = s->host;
    /* CUDA: the host batch goes back to the loader's pinned memory, so its copies must be done
     * (they are whenever the model used the batch; not for a prefetched batch dropped unused) */
    if (b && s->ev && be->kind == QC_CONFIG_DEVICE_CUDA)
        (void)qc_event_synchronize(s->ev);
    if (s->node_dev)
        qc_alloc_free(be->alloc, s->node_dev, be->copy);
    if (s->graph_dev)
        qc_alloc_free(be->alloc, s->graph_dev, be->copy);
    s->node_dev = s->graph_dev = NULL;
    memset(&s->view, 0, sizeof(s->view));
    s->host = NULL;
    return b;
}

void train_stage_deinit(struct train_stage *s)
{
    QC_ASSERT(!s->host, "train_stage_deinit: the stage still holds a batch");
    qc_event_destroy(s->ev);
    s->ev = NULL;
}
