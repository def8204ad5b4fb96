/*
 * bench_offload.c — `qctrain bench offload --dir DIR [--json] [options]`.
 *
 * Figures of the offload engine (docs/BENCHMARKS.md, "Offload"), all through the public API,
 * on the device given by the global --device (cpu: "device memory" is host memory):
 * - write_gibps / read_gibps: the NVMe tier at --block (1 MiB) and --qd (16): --size bytes put
 *   as --tensor-sized tensors (device -> staging -> spill file, until quiesce), then got back in
 *   reverse order with prefetch (spill file -> staging -> device, until the stream is done);
 * - a queue-depth sweep of the same at --sweep-size bytes per point;
 * - host_write_gibps / host_read_gibps: the pinned host tier (device <-> pinned copies);
 * - a device -> host -> NVMe -> host -> device round trip of one --roundtrip-sized tensor,
 *   verified byte for byte;
 * - when fio is installed (and not --no-fio): `fio --ioengine=io_uring --direct=1` with the same
 *   block size, queue depth and size on the same directory: fio_write_gibps, fio_read_gibps, and
 *   our ratio to it. fio's file is removed afterwards.
 * GiB/s are 2^30 bytes per second. A benchmark never gates anything.
 */
#include "qc_cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "qc_alloc.h"
#include "qc_device.h"
#include "qc_json.h"
#include "qc_offload.h"
#include "qc_progress.h" /* qc_format_bytes */

#define MIB       ((size_t)1 << 20)
#define GIB_D     (1024.0 * 1024.0 * 1024.0)
#define SWEEP_MAX 16

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct bench_env {
    struct qc_device *dev;
    struct qc_alloc *alloc;
    struct qc_stream *cs;
    const char *dir;
    size_t block;
    enum qc_offload_rung rung;
    void *src; /* device, tensor bytes */
    void *dst;
    size_t tensor;
    bool direct; /* offload.direct: try O_DIRECT on the spill file */
};

struct bw {
    double write_gibps;
    double read_gibps;
    uint64_t stalls;
    enum qc_offload_rung rung;
    bool registered;
};

/* Puts `total` bytes as tensors of env->tensor on `place`, quiesces, then gets them back in
 * reverse order with prefetch. */
static enum qc_status measure(struct bench_env *e, size_t total, int qd,
                              enum qc_offload_place place, struct bw *out)
{
    struct qc_offload_params p;
    qc_offload_params_default(&p);
    p.block_size = e->block;
    p.queue_depth = qd;
    p.max_inflight = (size_t)qd * e->block * 2 > 64 * MIB ? (size_t)qd * e->block * 2 : 64 * MIB;
    p.prefetch_window = p.max_inflight;
    p.force_rung = e->rung;
    p.direct = e->direct;
    if (place == QC_OFFLOAD_PLACE_HOST) {
        p.host_capacity = total + MIB;
        p.nvme_dir = NULL;
        p.force_rung = QC_OFFLOAD_RUNG_AUTO;
    } else {
        p.host_capacity = 0;
        p.nvme_dir = e->dir;
        p.nvme_capacity = total + 64 * MIB;
    }
    struct qc_offload *o = NULL;
    QC_TRY(qc_offload_create(e->dev, &p, &o));
    size_t n = (total + e->tensor - 1) / e->tensor;
    uint64_t *h = calloc(n, sizeof *h), *order = calloc(n, sizeof *order);
    enum qc_status st = h && order ? QC_OK : qc_errorf(QC_ERR_NOMEM, "bench offload: no memory");
    /* warm-up, not timed: first touch of the staging ring (NVMe) or of the pinned arena's
     * extents (host tier; the arena keeps them for reuse) */
    size_t nwarm = place == QC_OFFLOAD_PLACE_HOST ? n : 1;
    for (size_t i = 0; i < nwarm && st == QC_OK; i++)
        st = qc_offload_put(o, e->src, e->tensor, e->cs, place, "bench/warm-up", &h[i]);
    for (size_t i = 0; i < nwarm && st == QC_OK; i++)
        st = qc_offload_get(o, h[i], e->dst, e->cs);
    if (st == QC_OK)
        st = qc_stream_synchronize(e->cs);
    for (size_t i = 0; i < nwarm; i++) {
        qc_offload_release(o, h[i]);
        h[i] = 0;
    }
    double t0 = now_s();
    for (size_t i = 0; i < n && st == QC_OK; i++)
        st = qc_offload_put(o, e->src, e->tensor, e->cs, place, "bench", &h[i]);
    if (st == QC_OK)
        st = qc_offload_quiesce(o);
    double t1 = now_s();
    for (size_t i = 0; i < n; i++)
        order[i] = h[n - 1 - i];
    double t2 = now_s();
    if (st == QC_OK)
        st = qc_offload_set_order(o, order, n);
    for (size_t i = 0; i < n && st == QC_OK; i++)
        st = qc_offload_get(o, order[i], e->dst, e->cs);
    if (st == QC_OK)
        st = qc_stream_synchronize(e->cs);
    double t3 = now_s();
    struct qc_offload_stats s;
    qc_offload_stats_get(o, &s);
    out->write_gibps = (double)(n * e->tensor) / (t1 - t0) / GIB_D;
    out->read_gibps = (double)(n * e->tensor) / (t3 - t2) / GIB_D;
    out->stalls = s.stall_count;
    out->rung = qc_offload_rung_active(o);
    out->registered = qc_offload_registered(o);
    for (size_t i = 0; i < n && h; i++)
        if (h[i])
            qc_offload_release(o, h[i]);
    free(h);
    free(order);
    qc_offload_destroy(o);
    return st;
}

/* One tensor device -> host -> NVMe -> host -> device, verified. */
static enum qc_status roundtrip(struct bench_env *e, size_t bytes, double *ms, bool *ok)
{
    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    void *src = NULL, *dst = NULL;
    enum qc_status st = host && back ? QC_OK : qc_errorf(QC_ERR_NOMEM, "bench offload: no memory");
    if (st == QC_OK)
        st = qc_alloc_malloc(e->alloc, bytes, e->cs, "bench/roundtrip-src", &src);
    if (st == QC_OK)
        st = qc_alloc_malloc(e->alloc, bytes, e->cs, "bench/roundtrip-dst", &dst);
    uint64_t x = 0x2026120200000001ull;
    for (size_t i = 0; host && i < bytes; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        host[i] = (unsigned char)x;
    }
    if (st == QC_OK)
        st = qc_memcpy_async(e->cs, src, host, bytes, QC_COPY_H2D);
    if (st == QC_OK)
        st = qc_memset_async(e->cs, dst, 0, bytes);
    if (st == QC_OK)
        st = qc_stream_synchronize(e->cs);
    struct qc_offload_params p;
    qc_offload_params_default(&p);
    p.block_size = e->block;
    p.host_capacity = 0;
    p.nvme_dir = e->dir;
    p.nvme_capacity = bytes + 64 * MIB;
    p.force_rung = e->rung;
    p.direct = e->direct;
    struct qc_offload *o = NULL;
    if (st == QC_OK)
        st = qc_offload_create(e->dev, &p, &o);
    uint64_t h = 0;
    double t0 = now_s();
    if (st == QC_OK)
        st = qc_offload_put(o, src, bytes, e->cs, QC_OFFLOAD_PLACE_NVME, "bench/roundtrip", &h);
    if (st == QC_OK)
        st = qc_offload_get(o, h, dst, e->cs);
    if (st == QC_OK)
        st = qc_stream_synchronize(e->cs);
    *ms = (now_s() - t0) * 1e3;
    if (st == QC_OK)
        st = qc_memcpy_async(e->cs, back, dst, bytes, QC_COPY_D2H);
    if (st == QC_OK)
        st = qc_stream_synchronize(e->cs);
    *ok = st == QC_OK && memcmp(host, back, bytes) == 0;
    if (o)
        qc_offload_release(o, h);
    qc_offload_destroy(o);
    if (src)
        qc_alloc_free(e->alloc, src, e->cs);
    if (dst)
        qc_alloc_free(e->alloc, dst, e->cs);
    free(host);
    free(back);
    return st;
}

// ---- fio -----------------------------------------------------------------------------------

/* Runs one fio job and returns its bandwidth in GiB/s (negative when fio failed). */
static double fio_run(const char *dir, const char *rw, size_t block, int qd, size_t size)
{
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd,
                     "fio --name=qcbench --directory='%s' --filename=qcbench-fio.dat "
                     "--ioengine=io_uring --direct=1 --bs=%zu --iodepth=%d --rw=%s --size=%zu "
                     "--numjobs=1 --output-format=json 2>/dev/null",
                     dir, block, qd, rw, size);
    if (n < 0 || (size_t)n >= sizeof cmd || strchr(dir, '\''))
        return -1;
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 4096 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        if (r == 0)
            break;
        len += r;
    }
    int rc = pclose(f);
    double gibps = -1;
    if (buf && rc == 0) {
        buf[len] = '\0';
        char *start = strchr(buf, '{'); /* fio may print notes before the JSON */
        cJSON *root = start ? cJSON_Parse(start) : NULL;
        cJSON *jobs = root ? cJSON_GetObjectItem(root, "jobs") : NULL;
        cJSON *job = jobs ? cJSON_GetArrayItem(jobs, 0) : NULL;
        cJSON *dirn =
            job ? cJSON_GetObjectItem(job, strcmp(rw, "write") == 0 ? "write" : "read") : NULL;
        cJSON *bw = dirn ? cJSON_GetObjectItem(dirn, "bw_bytes") : NULL;
        if (cJSON_IsNumber(bw))
            gibps = bw->valuedouble / GIB_D;
        cJSON_Delete(root);
    }
    free(buf);
    return gibps;
}

static bool fio_present(void)
{
    return system("command -v fio >/dev/null 2>&1") == 0;
}

// ---- command -------------------------------------------------------------------------------

static enum qc_status parse_sweep(const char *s, int *qds, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 4096 || *n >= SWEEP_MAX)
            return qc_errorf(QC_ERR_INVALID,
                             "bench offload: --sweep '%s': expected up to %d queue depths "
                             "1..4096 separated by commas",
                             s, SWEEP_MAX);
        qds[(*n)++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return qc_errorf(QC_ERR_INVALID, "bench offload: --sweep '%s': bad character '%c'", s,
                             *end);
    }
    return QC_OK;
}

static enum qc_status parse_rung(const char *s, enum qc_offload_rung *out)
{
    for (int r = 0; r < QC_OFFLOAD_RUNG_COUNT; r++) {
        static const char *const names[] = {"auto", "uring-direct", "uring-buffered", "threads",
                                            "host"};
        if (r != QC_OFFLOAD_RUNG_HOST_ONLY && strcmp(s, names[r]) == 0) {
            *out = (enum qc_offload_rung)r;
            return QC_OK;
        }
    }
    return qc_errorf(QC_ERR_INVALID,
                     "bench offload: --rung '%s': expected auto, uring-direct, "
                     "uring-buffered or threads",
                     s);
}

/* The engine's errors name the trainer's options (offload.nvme_dir, offload.nvme_capacity);
 * here the folder is --dir and the bytes are --size / --roundtrip / --sweep-size: rewrite the
 * last error's option names to the bench's own. Returns st. */
static enum qc_status bench_own_options(enum qc_status st)
{
    static const char *const from[] = {"offload.nvme_dir", "offload.nvme_capacity"};
    static const char *const to[] = {"--dir", "--size (and --roundtrip, --sweep-size)"};
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", qc_error_last());
    for (int k = 0; k < 2; k++) {
        char *at;
        while ((at = strstr(msg, from[k])) != NULL) {
            char rest[4096];
            snprintf(rest, sizeof rest, "%s", at + strlen(from[k]));
            snprintf(at, sizeof msg - (size_t)(at - msg), "%s%s", to[k], rest);
        }
    }
    return qc_errorf(st, "bench offload: %s", msg);
}

enum qc_status qc_bench_offload(struct qc_cli *cli, int argc, char **argv)
{
    bool json = false, no_fio = false;
    const char *dir = NULL, *sweep = "1,4,16,32,64", *rung_s = "auto";
    uint64_t size = 1024 * MIB, tensor = 64 * MIB, block = MIB, sweep_size = 256 * MIB,
             rt_size = 256 * MIB;
    int64_t qd = 16;
    const struct qc_cli_opt opts[] = {
        {"dir", QC_CLI_STRING, &dir, "", "spill directory to measure (required)"},
        {"json", QC_CLI_FLAG, &json, "", "print one JSON object"},
        {"size", QC_CLI_SIZE, &size, "1G", "bytes written and read per direction"},
        {"tensor", QC_CLI_SIZE, &tensor, "64M", "bytes per put"},
        {"block", QC_CLI_SIZE, &block, "1M", "I/O block size"},
        {"qd", QC_CLI_INT, &qd, "16", "queue depth of the main figures"},
        {"sweep", QC_CLI_STRING, &sweep, "1,4,16,32,64", "queue depths of the sweep"},
        {"sweep-size", QC_CLI_SIZE, &sweep_size, "256M", "bytes per direction per sweep point"},
        {"roundtrip", QC_CLI_SIZE, &rt_size, "256M", "bytes of the round-trip tensor"},
        {"rung", QC_CLI_STRING, &rung_s, "auto", "auto|uring-direct|uring-buffered|threads"},
        {"no-fio", QC_CLI_FLAG, &no_fio, "", "skip the fio comparison"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("bench offload", "--dir DIR [--json] [options]",
                        "Offload engine bandwidth: NVMe tier (vs fio when installed), queue-depth "
                        "sweep, pinned host tier, device->host->NVMe->host->device round trip.",
                        opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, NULL, 0, NULL,
                        &help));
    if (help)
        return QC_OK;
    if (!dir || !dir[0])
        return qc_errorf(QC_ERR_INVALID, "bench offload: --dir is required\nhint: give a "
                                         "directory on the disk to measure, e.g. --dir /tmp");
    if (qd < 1 || qd > 4096)
        return qc_errorf(QC_ERR_INVALID, "bench offload: --qd %" PRId64 ": expected 1..4096", qd);
    if (tensor == 0 || size < tensor)
        return qc_errorf(QC_ERR_INVALID,
                         "bench offload: --tensor %" PRIu64 " with --size %" PRIu64
                         ": need 0 < --tensor <= --size",
                         tensor, size);
    if (block == 0 || block % 4096)
        return qc_errorf(QC_ERR_INVALID,
                         "bench offload: --block %" PRIu64 ": expected a multiple of 4096 "
                         "(O_DIRECT alignment)\nhint: --block 1M",
                         block);
    {
        struct stat sb;
        const char *why = NULL;
        if (stat(dir, &sb) != 0)
            why = strerror(errno);
        else if (!S_ISDIR(sb.st_mode))
            why = "not a directory";
        else if (access(dir, W_OK | X_OK) != 0)
            why = strerror(errno);
        if (why)
            return qc_errorf(QC_ERR_IO,
                             "bench offload: --dir %s: %s\nhint: give an existing, writable "
                             "directory on the disk to measure",
                             dir, why);
    }
    int qds[SWEEP_MAX], nsweep = 0;
    QC_TRY(parse_sweep(sweep, qds, &nsweep));
    struct bench_env e;
    memset(&e, 0, sizeof e);
    QC_TRY(parse_rung(rung_s, &e.rung));
    e.direct = cli->cfg.offload_direct;
    if (!e.direct && e.rung == QC_OFFLOAD_RUNG_URING_DIRECT)
        return qc_errorf(QC_ERR_INVALID, "bench offload: --rung uring-direct with "
                                         "offload.direct=false\nhint: drop one of the two");
    {
        /* the largest spill file the bench makes, before any is made: a full folder is an
         * error naming --dir, not a failure half-way */
        uint64_t need = size > sweep_size ? size : sweep_size;
        need = (need > rt_size ? need : rt_size) + 64 * MIB;
        struct statvfs vfs;
        if (statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < need) {
            char have_s[32], need_s[32];
            qc_format_bytes((uint64_t)vfs.f_bavail * vfs.f_frsize, have_s, sizeof have_s);
            qc_format_bytes(need, need_s, sizeof need_s);
            return qc_errorf(QC_ERR_IO,
                             "bench offload: --dir %s has %s free, the benchmark needs %s\nhint: "
                             "free space there, give another --dir, or lower --size",
                             dir, have_s, need_s);
        }
    }
    e.dir = dir;
    e.block = (size_t)block;
    e.tensor = (size_t)tensor;
    enum qc_device_kind kind = (enum qc_device_kind)cli->cfg.device_kind;
    QC_TRY(qc_device_create(kind, (int)cli->cfg.device_ordinal, &e.dev));
    e.cs = qc_device_compute_stream(e.dev);
    enum qc_status st = qc_alloc_create(e.dev, NULL, &e.alloc);
    if (st == QC_OK)
        st = qc_alloc_malloc(e.alloc, e.tensor, e.cs, "bench/src", &e.src);
    if (st == QC_OK)
        st = qc_alloc_malloc(e.alloc, e.tensor, e.cs, "bench/dst", &e.dst);
    if (st == QC_OK)
        st = qc_memset_async(e.cs, e.src, 0x5a, e.tensor);
    if (st == QC_OK)
        st = qc_stream_synchronize(e.cs);

    struct bw main_bw = {0}, host_bw = {0}, sw[SWEEP_MAX];
    memset(sw, 0, sizeof sw);
    double rt_ms = 0, fio_w = -1, fio_r = -1;
    bool rt_ok = false, have_fio = !no_fio && fio_present();
    if (st == QC_OK)
        st = measure(&e, (size_t)size, (int)qd, QC_OFFLOAD_PLACE_NVME, &main_bw);
    if (st == QC_OK)
        st = measure(&e, (size_t)size < 512 * MIB ? (size_t)size : 512 * MIB, (int)qd,
                     QC_OFFLOAD_PLACE_HOST, &host_bw);
    for (int i = 0; i < nsweep && st == QC_OK; i++)
        st = measure(&e, (size_t)sweep_size, qds[i], QC_OFFLOAD_PLACE_NVME, &sw[i]);
    if (st == QC_OK)
        st = roundtrip(&e, (size_t)rt_size, &rt_ms, &rt_ok);
    if (st == QC_OK && have_fio) {
        fio_w = fio_run(dir, "write", e.block, (int)qd, (size_t)size);
        fio_r = fio_run(dir, "read", e.block, (int)qd, (size_t)size);
        char path[4096];
        snprintf(path, sizeof path, "%s/qcbench-fio.dat", dir);
        unlink(path);
    }
    if (e.src)
        qc_alloc_free(e.alloc, e.src, e.cs);
    if (e.dst)
        qc_alloc_free(e.alloc, e.dst, e.cs);
    qc_alloc_destroy(e.alloc);
    qc_device_destroy(e.dev);
    if (st != QC_OK)
        return bench_own_options(st);

    double rt_gibps = (double)rt_size / (rt_ms / 1e3) / GIB_D;
    if (json) {
        /* The directory as a JSON string (quotes and backslashes escaped). */
        cJSON *jdir_item = cJSON_CreateString(dir);
        char *jdir = jdir_item ? cJSON_PrintUnformatted(jdir_item) : NULL;
        cJSON_Delete(jdir_item);
        if (!jdir)
            return qc_errorf(QC_ERR_NOMEM, "bench offload: out of memory");
        printf("{\"bench\": \"offload\", \"device\": \"%s\", \"dir\": %s, \"rung\": \"%s\", "
               "\"registered\": %s, \"block_bytes\": %zu, \"queue_depth\": %" PRId64
               ", \"size_bytes\": %" PRIu64 ", \"tensor_bytes\": %zu, "
               "\"write_gibps\": %s, \"read_gibps\": %s, \"read_stalls\": %" PRIu64 ", "
               "\"host_write_gibps\": %s, \"host_read_gibps\": %s, \"sweep\": [",
               qc_device_kind_str(kind), jdir, qc_offload_rung_str(main_bw.rung),
               main_bw.registered ? "true" : "false", e.block, qd, size, e.tensor,
               QC_JSON_NUM("%.3f", main_bw.write_gibps), QC_JSON_NUM("%.3f", main_bw.read_gibps),
               main_bw.stalls, QC_JSON_NUM("%.3f", host_bw.write_gibps),
               QC_JSON_NUM("%.3f", host_bw.read_gibps));
        for (int i = 0; i < nsweep; i++)
            printf("%s{\"queue_depth\": %d, \"write_gibps\": %s, \"read_gibps\": %s}",
                   i ? ", " : "", qds[i], QC_JSON_NUM("%.3f", sw[i].write_gibps),
                   QC_JSON_NUM("%.3f", sw[i].read_gibps));
        printf("], \"roundtrip_bytes\": %" PRIu64 ", \"roundtrip_ms\": %s, "
               "\"roundtrip_gibps\": %s, \"roundtrip_check\": \"%s\"",
               rt_size, QC_JSON_NUM("%.1f", rt_ms), QC_JSON_NUM("%.3f", rt_gibps),
               rt_ok ? "ok" : "MISMATCH");
        if (fio_w > 0 && fio_r > 0)
            printf(", \"fio_write_gibps\": %s, \"fio_read_gibps\": %s, "
                   "\"write_vs_fio\": %s, \"read_vs_fio\": %s",
                   QC_JSON_NUM("%.3f", fio_w), QC_JSON_NUM("%.3f", fio_r),
                   QC_JSON_NUM("%.3f", main_bw.write_gibps / fio_w),
                   QC_JSON_NUM("%.3f", main_bw.read_gibps / fio_r));
        else
            printf(", \"fio\": \"%s\"", have_fio ? "failed" : "not run");
        printf("}\n");
        free(jdir);
    } else {
        printf("offload benchmark on %s (%s, %s%s), %zu KiB blocks\n", dir,
               qc_device_kind_str(kind), qc_offload_rung_str(main_bw.rung),
               main_bw.registered ? ", registered buffers" : "", e.block >> 10);
        printf("  NVMe tier, qd %-4" PRId64 "     write %7.3f GiB/s   read %7.3f GiB/s\n", qd,
               main_bw.write_gibps, main_bw.read_gibps);
        if (fio_w > 0 && fio_r > 0)
            printf("  fio io_uring direct    write %7.3f GiB/s   read %7.3f GiB/s   (ours "
                   "%.2fx / %.2fx)\n",
                   fio_w, fio_r, main_bw.write_gibps / fio_w, main_bw.read_gibps / fio_r);
        printf("  host tier              put   %7.3f GiB/s   get  %7.3f GiB/s\n",
               host_bw.write_gibps, host_bw.read_gibps);
        for (int i = 0; i < nsweep; i++)
            printf("  sweep qd %-4d          write %7.3f GiB/s   read %7.3f GiB/s\n", qds[i],
                   sw[i].write_gibps, sw[i].read_gibps);
        printf("  round trip %" PRIu64 " MiB     %.1f ms (%.3f GiB/s), data %s\n", rt_size >> 20,
               rt_ms, rt_gibps, rt_ok ? "verified" : "MISMATCH");
    }
    return rt_ok ? QC_OK
                 : qc_errorf(QC_ERR_IO, "bench offload: the round trip returned different data");
}
