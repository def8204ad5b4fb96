/*
 * qc_device.h — the device layer: devices, streams, events and asynchronous copies, with a CPU
 * and a CUDA implementation behind one interface.
 *
 * CPU semantics (so ordering and event logic are exercised for real by CPU tests):
 * - the compute stream (qc_device_compute_stream) runs inline: work enqueued on it executes in
 *   the calling thread before the call returns;
 * - every other stream (QC_STREAM_COPY, or extra QC_STREAM_COMPUTE streams) is a worker thread
 *   with a FIFO: copies, host functions and event records run in enqueue order;
 * - an event recorded on a stream completes when the stream reaches it; qc_stream_wait_event
 *   makes later work of the waiting stream start only after the event completed (the inline
 *   stream blocks the caller until then).
 * CUDA semantics are CUDA's: qc_stream wraps cudaStream_t, qc_event wraps cudaEvent_t
 * (timing disabled), copies are cudaMemcpyAsync.
 *
 * Thread safety: a stream may be used from several threads (enqueue is serialised); events may
 * be recorded on one thread and waited on from others. Destroying a stream first drains it.
 * "Device memory" on the CPU backend is ordinary host memory (the allocator maps it).
 */
#ifndef QC_BASE_QC_DEVICE_H
#define QC_BASE_QC_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_status.h"
#include "qc_types.h" /* enum qc_device_kind */

#ifdef __cplusplus
extern "C" {
#endif

enum qc_stream_kind {
    QC_STREAM_COMPUTE = 0, /* kernels; extra compute streams are workers on CPU */
    QC_STREAM_COPY,        /* H2D / D2H / D2D transfers */
};

enum qc_copy_kind { QC_COPY_H2D = 0, QC_COPY_D2H, QC_COPY_D2D, QC_COPY_H2H };

struct qc_device;
struct qc_stream;
struct qc_event;

struct qc_device_props {
    enum qc_device_kind kind;
    char name[256];     /* "cpu (x86_64, 2 threads)" or cudaDeviceProp.name */
    size_t total_bytes; /* device memory (CPU: physical RAM) */
    size_t free_bytes;  /* at the time of the call */
    int cc_major;       /* compute capability; 0 on CPU */
    int cc_minor;
    int multiprocessors; /* SMs on CUDA; online CPUs on CPU */
};

/* "cpu" / "cuda" <-> enum. parse returns QC_ERR_INVALID with a message on anything else. */
const char *qc_device_kind_str(enum qc_device_kind kind);
enum qc_status qc_device_kind_parse(const char *s, enum qc_device_kind *out);

/* Opens device `ordinal` of `kind`. CUDA in a CPU-only build, or with no GPU present, returns
 * QC_ERR_UNSUPPORTED with a hint. The device owns its compute stream. */
enum qc_status qc_device_create(enum qc_device_kind kind, int ordinal, struct qc_device **out);
void qc_device_destroy(struct qc_device *dev); /* NULL is a no-op; streams/events must be gone */
enum qc_device_kind qc_device_kind_of(const struct qc_device *dev);
/* The ordinal dev was created with (CUDA: the runtime's device number, what cudaSetDevice
 * takes; a thread that works for dev on CUDA selects it first, e.g. the pinned arena's
 * registrations from loader threads, qc_pinned.h). */
int qc_device_ordinal(const struct qc_device *dev);
enum qc_status qc_device_props_get(struct qc_device *dev, struct qc_device_props *out);
/* Blocks until all work on all of the device's streams is done. */
enum qc_status qc_device_synchronize(struct qc_device *dev);
/* Number of CUDA devices visible (0 in a CPU-only build or without a GPU). Never fails. */
int qc_device_cuda_count(void);
/* The host CPU's model ("AMD EPYC 7B13": /proc/cpuinfo's "model name", else uname's machine)
 * into buf, NUL-terminated. Never fails. */
void qc_host_cpu_model(char *buf, size_t n);
/* CPU devices only (the emulated device of the EMU backend, qc_emu.h): every copy and memset
 * its streams run opens emu while it runs, as the ops do, so an offload engine or a copy stream
 * can move "device" memory of the arena. emu (NULL: none) must outlive the device's use. */
struct qc_emu;
void qc_device_cpu_set_emu(struct qc_device *dev, struct qc_emu *emu);
/* CPU devices only: streams created from now on run inline, like the compute stream (each
 * command in the calling thread before the call returns), instead of on a worker thread. For a
 * process whose ops already use every core (OpenMP): a copy thread beside them takes a core
 * that the ops' barriers wait on, which costs far more than the copy itself. */
void qc_device_cpu_set_inline_streams(struct qc_device *dev, bool on);
/* The raw answer behind qc_device_cuda_count, for callers that must tell "no GPU here" from "a
 * GPU that fails" (the GPU tests: tests/cuda_probe.h): returns cudaGetDeviceCount's
 * cudaError_t as an int (0 = success) and sets *count (0 on failure). A CPU-only build returns
 * -1 and *count = 0. The error is cleared, not left for the next CUDA call. */
int qc_device_cuda_probe(int *count);
/* CUDA builds: fn(native) is called with a CUDA stream's native handle (cudaStream_t) when the
 * stream has drained and is about to be destroyed, from the destroying thread, so that a layer
 * above that caches stream handles (the CUDA op contexts, kernels/cuda/handles.cu) forgets it
 * before the handle dies. One listener per process: a second call replaces it, NULL removes
 * it. CPU streams are never reported. */
void qc_device_set_stream_destroy_listener(void (*fn)(void *native));

/* ---- streams ---------------------------------------------------------------------------- */

/* The device's default compute stream (inline on CPU). Owned by the device. */
struct qc_stream *qc_device_compute_stream(struct qc_device *dev);
enum qc_status qc_stream_create(struct qc_device *dev, enum qc_stream_kind kind,
                                struct qc_stream **out);
void qc_stream_destroy(struct qc_stream *s); /* drains first; NULL is a no-op */
struct qc_device *qc_stream_device(const struct qc_stream *s);
/* Blocks until everything enqueued on s so far has completed. Returns the first error a
 * worker hit (a failed copy), if any. */
enum qc_status qc_stream_synchronize(struct qc_stream *s);
/* Work enqueued on s after this call starts only after ev has completed. ev must have been
 * recorded (an unrecorded event counts as complete, as in CUDA). */
enum qc_status qc_stream_wait_event(struct qc_stream *s, struct qc_event *ev);
/* Enqueues fn(user) on s (CPU: runs in the stream's thread; CUDA: cudaLaunchHostFunc). fn
 * must not call into the device layer on the same stream. fn may block (e.g. on a condition
 * another thread signals); later work of s waits for it. */
enum qc_status qc_stream_host_func(struct qc_stream *s, void (*fn)(void *user), void *user);
/* The native handle: cudaStream_t on CUDA, NULL on CPU. */
void *qc_stream_native(struct qc_stream *s);
/* A small process-unique id, for traces and per-stream free lists. Compute stream of a device
 * is 0. */
uint32_t qc_stream_id(const struct qc_stream *s);

/* ---- events ----------------------------------------------------------------------------- */

enum qc_status qc_event_create(struct qc_device *dev, struct qc_event **out);
void qc_event_destroy(struct qc_event *ev); /* NULL is a no-op */
/* Captures the work enqueued on s so far; re-recording replaces the previous capture. */
enum qc_status qc_event_record(struct qc_event *ev, struct qc_stream *s);
/* *done = whether the captured work has completed (never-recorded: true). */
enum qc_status qc_event_query(struct qc_event *ev, bool *done);
enum qc_status qc_event_synchronize(struct qc_event *ev);

/* ---- copies ----------------------------------------------------------------------------- */

/* Enqueues a copy of n bytes on s. Host buffers should come from the pinned allocator for real
 * asynchrony on CUDA. On CPU every kind is a memcpy run by the stream. n == 0 is a no-op. */
enum qc_status qc_memcpy_async(struct qc_stream *s, void *dst, const void *src, size_t n,
                               enum qc_copy_kind kind);
/* Enqueues memset(dst, byte, n) of device memory on s. */
enum qc_status qc_memset_async(struct qc_stream *s, void *dst, int byte, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_DEVICE_H */
