/*
 * test_offload_nvme.c — byte-exact NVMe round trips over the matrix
 *   {O_DIRECT on, off} x {registered buffers on, off} x {queue depth 1, 32}
 * on the io_uring rungs, with sizes from 1 byte to 64 MiB (unaligned ones included; the 64 MiB
 * one in two configurations only), plus the thread-pool rung with and without O_DIRECT.
 * A configuration this machine cannot run (io_uring blocked, no O_DIRECT, also a thread-pool
 * O_DIRECT case that fell back to buffered I/O) is reported as a skipped case with the reason,
 * and under CI=true as a failure unless the runner opts out (OT_IO_UNAVAILABLE); the thread-pool
 * buffered case always runs.
 */
#include "test_offload_common.h"

static struct qc_device *dev;

/* A few sizes per configuration: tiny, around one 4 KiB page, around one block, multi-block. */
static const size_t sizes[] = {1, 4095, 4097, OT_MIB - 1, OT_MIB, 3 * OT_MIB + 17};

static void run_config(enum qc_offload_rung rung, bool direct, bool registered, int qd, bool big)
{
    char name[128];
    snprintf(name, sizeof name, "offload nvme: %s%s, registered %s, queue depth %d%s",
             qc_offload_rung_str(rung),
             rung == QC_OFFLOAD_RUNG_THREADS ? (direct ? " (O_DIRECT)" : " (buffered)") : "",
             registered ? "on" : "off", qd, big ? ", + 64 MiB" : "");
    QC_TEST (name) {
        struct qc_offload_params p;
        ot_params(&p, rung, qd, registered);
        p.direct = direct;
        struct qc_offload *o = NULL;
        ot_log_start();
        enum qc_status st = qc_offload_create(dev, &p, &o);
        const char *log = ot_log_stop();
        /* the thread-pool rung falls back to buffered I/O where O_DIRECT is refused (the
         * probe line says "O_DIRECT no (...)"): then this case would not test what it names */
        if (st == QC_OK && rung == QC_OFFLOAD_RUNG_THREADS && direct &&
            !strstr(log, "O_DIRECT yes")) {
            const char *probe = strstr(log, "offload: probe:");
            char why[512];
            snprintf(why, sizeof why, "the thread-pool rung fell back to buffered I/O: %.*s",
                     probe ? (int)strcspn(probe, "\n") : 9, probe ? probe : "(no probe)");
            qc_offload_destroy(o);
            OT_IO_UNAVAILABLE(true, why);
            continue; /* ends the QC_TEST */
        }
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
        T_EXPECT(qc_offload_rung_active(o) == rung, "active %s",
                 qc_offload_rung_str(qc_offload_rung_active(o)));
        if (rung != QC_OFFLOAD_RUNG_THREADS && registered && !qc_offload_registered(o))
            printf("  note: the kernel refused buffer registration; ran unregistered\n");
        if (!registered)
            T_EXPECT(!qc_offload_registered(o), "registered though not asked");
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t diff = 0;
            st = ot_roundtrip(o, dev, sizes[i], QC_OFFLOAD_PLACE_NVME,
                              qc_test_seed() + i * 31 + (uint64_t)qd, i % 2 == 0, &diff);
            T_EXPECT(st == QC_OK, "size %zu: %s", sizes[i], qc_error_last());
            T_EXPECT_EQ_U64(diff, sizes[i], "size %zu: first difference at byte %zu", sizes[i],
                            diff);
        }
        if (big) {
            size_t n = 64 * OT_MIB, diff = 0;
            st =
                ot_roundtrip(o, dev, n, QC_OFFLOAD_PLACE_NVME, qc_test_seed() ^ 0x64, false, &diff);
            T_EXPECT(st == QC_OK, "64 MiB: %s", qc_error_last());
            T_EXPECT_EQ_U64(diff, n, "64 MiB: first difference at byte %zu", diff);
        }
        struct qc_offload_stats s;
        qc_offload_stats_get(o, &s);
        T_EXPECT_EQ_U64(s.bytes_nvme_used, 0, "spill bytes after release");
        T_EXPECT_EQ_U64(s.short_ios, 0, "short I/O without a fault");
        T_EXPECT(s.bytes_written == s.bytes_read && s.bytes_written > 0, "written %llu, read %llu",
                 (unsigned long long)s.bytes_written, (unsigned long long)s.bytes_read);
        qc_offload_destroy(o);
    }
}

int main(void)
{
    dev = ot_device();
    ot_dir_make();
    ot_rung_report(dev);
    enum qc_offload_rung rungs[] = {QC_OFFLOAD_RUNG_URING_DIRECT, QC_OFFLOAD_RUNG_URING_BUFFERED};
    for (int r = 0; r < 2; r++)
        for (int reg = 1; reg >= 0; reg--)
            for (int q = 0; q < 2; q++) {
                int qd = q ? 32 : 1;
                bool big = (r == 0 && reg == 1 && qd == 32) || (r == 1 && reg == 0 && qd == 1);
                run_config(rungs[r], r == 0, reg != 0, qd, big);
            }
    /* the thread-pool rung reads O_DIRECT from params.direct: both ways */
    run_config(QC_OFFLOAD_RUNG_THREADS, true, false, 1, false);
    run_config(QC_OFFLOAD_RUNG_THREADS, false, false, 32, true);
    qc_device_destroy(dev);
    ot_dir_remove();
    return qc_test_summary();
}
