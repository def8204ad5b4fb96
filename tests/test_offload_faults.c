/*
 * test_offload_faults.c — the fault hook: the nth I/O comes back short, makes no progress,
 * fails with EIO, ENOSPC or EAGAIN, or a byte of a written block is flipped on disk. Recoverable
 * faults (short with progress, EAGAIN) must give byte-exact data; the others must give
 * QC_ERR_IO naming the spill file, the block's file offset and the tensor's tag, and must never
 * hand back wrong data (the failing block's bytes in dst stay untouched).
 *
 * Queue depth 1 keeps completions in block order, so "the nth I/O" is block n and the expected
 * offset is exact. Each case runs on the thread-pool rung and, when available, on io_uring.
 */
#include "test_offload_common.h"

static struct qc_device *dev;

#define BS    ((size_t)64 * 1024)
#define NBLK  5
#define TSIZE (4 * BS + 100) /* 5 blocks, the last one short */

struct fault_case {
    const char *name;
    enum qc_offload_fault fault;
    enum qc_offload_fault_op op;
    uint64_t nth;
    bool recoverable;
    const char *msg; /* expected in the error */
};

static const struct fault_case cases[] = {
    {"short write", QC_OFFLOAD_FAULT_SHORT, QC_OFFLOAD_FAULT_WRITE, 2, true, NULL},
    {"short read", QC_OFFLOAD_FAULT_SHORT, QC_OFFLOAD_FAULT_READ, 3, true, NULL},
    {"EAGAIN on read", QC_OFFLOAD_FAULT_EAGAIN, QC_OFFLOAD_FAULT_READ, 1, true, NULL},
    {"EAGAIN on write", QC_OFFLOAD_FAULT_EAGAIN, QC_OFFLOAD_FAULT_WRITE, 4, true, NULL},
    {"zero-byte write", QC_OFFLOAD_FAULT_ZERO, QC_OFFLOAD_FAULT_WRITE, 2, false, "short write"},
    {"zero-byte read", QC_OFFLOAD_FAULT_ZERO, QC_OFFLOAD_FAULT_READ, 2, false, "short read"},
    {"EIO on write", QC_OFFLOAD_FAULT_EIO, QC_OFFLOAD_FAULT_WRITE, 2, false,
     "write failed: Input/output error"},
    {"EIO on read", QC_OFFLOAD_FAULT_EIO, QC_OFFLOAD_FAULT_READ, 2, false,
     "read failed: Input/output error"},
    {"ENOSPC on write", QC_OFFLOAD_FAULT_ENOSPC, QC_OFFLOAD_FAULT_WRITE, 2, false,
     "write failed: No space left on device"},
    {"flipped byte on disk", QC_OFFLOAD_FAULT_FLIP, QC_OFFLOAD_FAULT_WRITE, 2, false,
     "checksum mismatch"},
};

static void run_case(enum qc_offload_rung rung, const struct fault_case *fc)
{
    char name[128];
    snprintf(name, sizeof name, "offload fault: %s (%s)", fc->name, qc_offload_rung_str(rung));
    QC_TEST (name) {
        struct qc_offload_params p;
        ot_params(&p, rung, 1, true);
        p.block_size = BS;
        p.max_inflight = 8 * BS;
        struct qc_offload *o = NULL;
        enum qc_status st = qc_offload_create(dev, &p, &o);
        if (st == QC_ERR_UNSUPPORTED) {
            if (rung == QC_OFFLOAD_RUNG_THREADS)
                T_SKIP("%s", qc_error_last());
            else
                OT_URING_UNAVAILABLE(rung, qc_error_last());
            continue; /* ends the QC_TEST */
        }
        T_EXPECT(st == QC_OK, "create: %s", qc_error_last());
        if (st != QC_OK)
            continue; /* ends the QC_TEST */
        struct qc_stream *cs = qc_device_compute_stream(dev);
        unsigned char *src = malloc(TSIZE), *dst = malloc(TSIZE);
        ot_fill(src, TSIZE, 4242);
        memset(dst, 0xee, TSIZE);

        qc_offload_fault_set(o, fc->fault, fc->op, fc->nth);
        uint64_t h = 0;
        st = qc_offload_put(o, src, TSIZE, cs, QC_OFFLOAD_PLACE_NVME, "faulty", &h);
        T_EXPECT(st == QC_OK, "put: %s", qc_error_last());
        enum qc_status qst = qc_offload_quiesce(o);
        enum qc_status gst = qc_offload_get(o, h, dst, cs);
        char gmsg[1024];
        snprintf(gmsg, sizeof gmsg, "%s", qc_error_last());
        qc_stream_synchronize(cs);
        T_EXPECT(qc_offload_fault_fired(o), "the fault never fired");
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);

        if (fc->recoverable) {
            T_EXPECT(qst == QC_OK && gst == QC_OK, "recoverable fault failed: %s", gmsg);
            size_t d = ot_first_diff(src, dst, TSIZE);
            T_EXPECT_EQ_U64(d, TSIZE, "data differs at %zu", d);
            if (fc->fault == QC_OFFLOAD_FAULT_SHORT)
                T_EXPECT(s.short_ios >= 1, "short I/O not counted");
            else
                T_EXPECT(s.retries >= 1, "EAGAIN not retried");
            T_EXPECT(qc_offload_release(o, h) == QC_OK, "%s", qc_error_last());
        } else {
            /* the block that failed: write faults hit block nth; read faults the nth read */
            uint64_t blk = fc->nth - 1;
            char off[64];
            snprintf(off, sizeof off, "offset %llu,", (unsigned long long)(blk * BS));
            T_EXPECT(gst == QC_ERR_IO, "get returned %s", qc_status_str(gst));
            T_EXPECT_STR_CONTAINS(gmsg, fc->msg);
            T_EXPECT_STR_CONTAINS(gmsg, qc_offload_spill_path(o));
            T_EXPECT_STR_CONTAINS(gmsg, off);
            T_EXPECT_STR_CONTAINS(gmsg, "tensor 'faulty'");
            if (fc->op == QC_OFFLOAD_FAULT_WRITE && fc->fault != QC_OFFLOAD_FAULT_FLIP)
                T_EXPECT(qst == QC_ERR_IO, "quiesce did not report the write error: %s",
                         qc_status_str(qst));
            if (fc->fault == QC_OFFLOAD_FAULT_ENOSPC)
                T_EXPECT_STR_CONTAINS(gmsg, "hint:");
            if (fc->fault == QC_OFFLOAD_FAULT_FLIP)
                T_EXPECT_EQ_U64(s.checksum_failures, 1, "checksum failures");
            else
                T_EXPECT(s.io_errors >= 1, "I/O error not counted");
            /* nothing wrong handed back: the failing block and all after it are untouched */
            for (size_t i = blk * BS; i < TSIZE; i++) {
                if (dst[i] != 0xee) {
                    T_EXPECT(false, "dst byte %zu was written after the failure", i);
                    break;
                }
            }
            /* the error is sticky: a second get fails the same way, release reports it */
            T_EXPECT(qc_offload_get(o, h, dst, cs) == QC_ERR_IO, "second get succeeded");
            T_EXPECT(qc_offload_release(o, h) == QC_ERR_IO, "release hid the error");
            /* and the engine stays usable */
            size_t diff = 0;
            st = ot_roundtrip(o, dev, TSIZE, QC_OFFLOAD_PLACE_NVME, 17, true, &diff);
            T_EXPECT(st == QC_OK && diff == TSIZE, "round trip after the fault: %s",
                     qc_error_last());
        }
        free(src);
        free(dst);
        qc_offload_destroy(o);
    }
}

int main(void)
{
    dev = ot_device();
    ot_dir_make();
    ot_rung_report(dev);
    enum qc_offload_rung rungs[] = {QC_OFFLOAD_RUNG_THREADS, QC_OFFLOAD_RUNG_URING_DIRECT};
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            run_case(rungs[r], &cases[i]);
    qc_device_destroy(dev);
    ot_dir_remove();
    return qc_test_summary();
}
