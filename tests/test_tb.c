/*
 * test_tb.c — the TensorBoard event files (src/report/tb_event.c, tb_writer.c): CRC-32C on its
 * check value, the record framing and Event encoding byte for byte against records made by
 * TensorBoard's own code (tests/data/tb_fixture.tfevents, tests/data/make_tb_fixture.py), and
 * the writer: file names that sort after older files, metrics lines mapped to tags, null and
 * unknown keys skipped, bad lines refused. tests/test_report_run.py reads a training run's
 * files with TensorBoard's EventAccumulator.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qc_report.h"
#include "testutil.h"

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        T_FATAL("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len)
        T_FATAL("cannot read %s", path);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void test_crc(void)
{
    /* the CRC-32C check value (RFC 3720 B.4 and every CRC catalogue) */
    T_EXPECT_EQ_U64(qc_tb_crc32c("123456789", 9), 0xe3069283u, "crc32c(\"123456789\")");
    T_EXPECT_EQ_U64(qc_tb_crc32c("", 0), 0u, "crc32c of nothing");
    uint8_t zeros[32] = {0};
    T_EXPECT_EQ_U64(qc_tb_crc32c(zeros, 32), 0x8a9136aau, "32 zero bytes (RFC 3720 B.4)");
    T_EXPECT_EQ_U64(qc_tb_masked_crc(0), 0xa282ead8u, "mask of 0 is the delta");
}

/* Our encoding of the fixture's four events, framed, must equal TensorBoard's bytes. */
static void test_fixture(void)
{
    size_t n = 0;
    uint8_t *want = read_file(QC_SOURCE_DIR "/tests/data/tb_fixture.tfevents", &n);
    uint8_t got[1024], ev[512];
    size_t len = 0, e;
    e = qc_tb_event_file_version(1700000000.5, ev, sizeof ev);
    len += qc_tb_record_frame(ev, e, got + len);
    e = qc_tb_event_session_start(1700000001.25, 101, ev, sizeof ev);
    len += qc_tb_record_frame(ev, e, got + len);
    const struct qc_tb_scalar v[4] = {{"train/loss", 26.1272f},
                                      {"train/lr", 0.002f},
                                      {"memory/peak_device_bytes", 288384512.0f},
                                      {"train/cls_loss", 0.0f}};
    e = qc_tb_event_scalars(1700000002.0, 102, v, 4, ev, sizeof ev);
    len += qc_tb_record_frame(ev, e, got + len);
    const struct qc_tb_scalar w = {"eval/minFHE", -1.5f};
    e = qc_tb_event_scalars(1700000003.0, 399872, &w, 1, ev, sizeof ev);
    len += qc_tb_record_frame(ev, e, got + len);
    T_EXPECT_EQ_U64(len, n, "bytes: ours vs TensorBoard's");
    size_t first = n;
    for (size_t i = 0; i < n && i < len; i++)
        if (got[i] != want[i]) {
            first = i;
            break;
        }
    T_EXPECT(first == n, "first differing byte at %zu", first);
    /* the encoders report the length they need when the buffer is short */
    T_EXPECT_EQ_U64(qc_tb_event_scalars(1700000002.0, 102, v, 4, ev, 3),
                    qc_tb_event_scalars(1700000002.0, 102, v, 4, ev, sizeof ev), "length needed");
    free(want);
}

/* Walks the records of a file: count, and the CRCs hold. */
static int count_records(const char *path)
{
    size_t n = 0;
    uint8_t *b = read_file(path, &n);
    int records = 0;
    size_t off = 0;
    while (off + 12 <= n) {
        uint64_t len = 0;
        for (int i = 0; i < 8; i++)
            len |= (uint64_t)b[off + (size_t)i] << (8 * i);
        uint32_t c1 = 0, c2 = 0;
        memcpy(&c1, b + off + 8, 4);
        T_EXPECT_EQ_U64(c1, qc_tb_masked_crc(qc_tb_crc32c(b + off, 8)), "length crc, record %d",
                        records);
        if (off + 16 + len > n)
            break;
        memcpy(&c2, b + off + 12 + len, 4);
        T_EXPECT_EQ_U64(c2, qc_tb_masked_crc(qc_tb_crc32c(b + off + 12, len)), "data crc");
        off += 16 + len;
        records++;
    }
    T_EXPECT_EQ_U64(off, n, "the file ends on a record boundary");
    free(b);
    return records;
}

static void test_writer(void)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s/test_tb_%d", QC_BINARY_DIR, (int)getpid());
    t_rm_rf(dir);
    T_EXPECT(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    /* an "older" file from the future: the new one must still sort after it */
    char old[512];
    snprintf(old, sizeof old, "%s/tb", dir);
    mkdir(old, 0755);
    snprintf(old, sizeof old, "%s/tb/events.out.tfevents.4000000000.other.1.qctrain", dir);
    FILE *f = fopen(old, "wb");
    T_EXPECT(f != NULL, "create %s", old);
    if (f)
        fclose(f);
    struct qc_tb *tb = NULL;
    T_EXPECT(qc_tb_open(dir, 5, &tb) == QC_OK, "open: %s", qc_error_last());
    if (!tb)
        return;
    const char *path = qc_tb_path(tb);
    T_EXPECT(strcmp(strrchr(path, '/') + 1, strrchr(old, '/') + 1) > 0, "%s sorts after %s", path,
             old);
    T_EXPECT(qc_tb_write_metrics_line(tb, "{\"step\":5,\"loss\":1.5,\"lr\":0.001,\"bogus\":3,"
                                          "\"recompute_bytes\":null}") == QC_OK,
             "step line: %s", qc_error_last());
    T_EXPECT(qc_tb_write_metrics_line(tb, "{\"step\":5,\"eval\":{\"minADE\":0.7,\"minAHE\":0.1,"
                                          "\"scenes\":8}}") == QC_OK,
             "eval line: %s", qc_error_last());
    T_EXPECT(qc_tb_write_metrics_line(tb, "{\"step\":6,\"bogus\":1}") == QC_OK,
             "a line with nothing known writes nothing");
    T_EXPECT(qc_tb_write_metrics_line(tb, "{\"loss\":1}") == QC_ERR_INVALID, "no step");
    T_EXPECT(qc_tb_write_metrics_line(tb, "{\"step\":7,\"lo") == QC_ERR_INVALID, "cut line");
    T_EXPECT(qc_tb_sync(tb) == QC_OK, "sync");
    char mine[4400];
    snprintf(mine, sizeof mine, "%s", path);
    qc_tb_close(tb);
    /* file version, START, the step line, the eval line */
    T_EXPECT_EQ_I64(count_records(mine), 4, "records in %s", mine);
    /* the step line's event holds exactly loss and lr, as float32 */
    uint8_t ev[256];
    const struct qc_tb_scalar v[2] = {{"train/loss", 1.5f}, {"train/lr", 0.001f}};
    const size_t e = qc_tb_event_scalars(1.0, 5, v, 2, ev, sizeof ev);
    size_t n = 0;
    uint8_t *b = read_file(mine, &n);
    /* skip the first two records; the third's payload after wall_time (9 bytes) must match */
    size_t off = 0;
    for (int r = 0; r < 2; r++) {
        uint64_t len = 0;
        for (int i = 0; i < 8; i++)
            len |= (uint64_t)b[off + (size_t)i] << (8 * i);
        off += 16 + len;
    }
    uint64_t len3 = 0;
    for (int i = 0; i < 8; i++)
        len3 |= (uint64_t)b[off + (size_t)i] << (8 * i);
    T_EXPECT_EQ_U64(len3, e, "the step event's length");
    T_EXPECT(len3 == e && memcmp(b + off + 12 + 9, ev + 9, e - 9) == 0,
             "the step event holds train/loss and train/lr only");
    free(b);
    t_rm_rf(dir);
}

int main(void)
{
    QC_TEST ("tb: CRC-32C check values and the TFRecord mask")
        test_crc();
    QC_TEST ("tb: framing and Event encoding == TensorBoard's own bytes (fixture)")
        test_fixture();
    QC_TEST ("tb: writer file naming, metrics lines to tags, nulls and bad lines")
        test_writer();
    return qc_test_summary();
}
