/*
 * tb_event.c — TensorBoard's event-file encoding, written by hand (no protobuf library).
 *
 * Where the formats are specified:
 *   framing  tensorflow/core/lib/io/record_writer.cc (now tsl/lib/io/record_writer.cc),
 *            RecordWriter::WriteRecord: u64 length, u32 masked CRC-32C of the 8 length bytes,
 *            the data, u32 masked CRC-32C of the data, all little-endian; the mask is
 *            tensorflow/core/lib/hash/crc32c.h Mask(): ((crc >> 15) | (crc << 17)) + 0xa282ead8.
 *   Event    tensorflow/core/util/event.proto (tensorboard/compat/proto/event.proto):
 *            double wall_time = 1; int64 step = 2; string file_version = 3;
 *            Summary summary = 5; SessionLog session_log = 7.
 *            SessionLog { SessionStatus status = 1; } with START = 1.
 *   Summary  tensorflow/core/framework/summary.proto (tensorboard/compat/proto/summary.proto):
 *            repeated Value value = 1; Value { string tag = 1; float simple_value = 2; }.
 *   wire     protobuf encoding: key = (field << 3) | wire type (0 varint, 1 fixed64,
 *            2 length-delimited, 5 fixed32); proto3 omits fields at their default.
 * The field numbers were checked against the protos of the tensorboard 2.21 pip package, and
 * tests/test_tb.c compares these bytes with a record that package's own writer produced.
 */
#include "qc_report.h"

#include <string.h>

// ---- CRC-32C and framing ------------------------------------------------------------------------

static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1; /* Castagnoli, reflected */
        crc_table[i] = c;
    }
    __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
}

uint32_t qc_tb_crc32c(const void *data, size_t n)
{
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE))
        crc_init(); /* idempotent: two threads compute the same table */
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t qc_tb_masked_crc(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

size_t qc_tb_record_frame(const void *data, size_t n, uint8_t *out)
{
    put_le(out, n, 8);
    put_le(out + 8, qc_tb_masked_crc(qc_tb_crc32c(out, 8)), 4);
    memcpy(out + 12, data, n);
    put_le(out + 12 + n, qc_tb_masked_crc(qc_tb_crc32c(data, n)), 4);
    return n + 16;
}

// ---- protobuf wire encoding ---------------------------------------------------------------------

/* A bounded writer: counts every byte, stores those that fit. */
struct pb {
    uint8_t *out;
    size_t cap, len;
};

static void pb_byte(struct pb *w, uint8_t b)
{
    if (w->len < w->cap)
        w->out[w->len] = b;
    w->len++;
}

static void pb_varint(struct pb *w, uint64_t v)
{
    while (v >= 0x80) {
        pb_byte(w, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    pb_byte(w, (uint8_t)v);
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void pb_key(struct pb *w, unsigned field, unsigned wire)
{
    pb_varint(w, (uint64_t)(field << 3 | wire));
}

static void pb_fixed(struct pb *w, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        pb_byte(w, (uint8_t)(v >> (8 * i)));
}

static void pb_bytes(struct pb *w, unsigned field, const void *data, size_t n)
{
    pb_key(w, field, 2);
    pb_varint(w, n);
    for (size_t i = 0; i < n; i++)
        pb_byte(w, ((const uint8_t *)data)[i]);
}

/* Event fields 1 (wall_time, fixed64 double) and 2 (step, varint; omitted when 0). */
static void event_head(struct pb *w, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    if (bits) { /* proto3: 0.0 is the default and is not written */
        pb_key(w, 1, 1);
        pb_fixed(w, bits, 8);
    }
    if (step) {
        pb_key(w, 2, 0);
        pb_varint(w, (uint64_t)step); /* int64: negative values as 10-byte two's complement */
    }
}

size_t qc_tb_event_file_version(double wall_time, uint8_t *out, size_t cap)
{
    struct pb w = {out, cap, 0};
    event_head(&w, wall_time, 0);
    static const char version[] = "brain.Event:2";
    pb_bytes(&w, 3, version, sizeof version - 1);
    return w.len;
}

size_t qc_tb_event_session_start(double wall_time, int64_t step, uint8_t *out, size_t cap)
{
    struct pb w = {out, cap, 0};
    event_head(&w, wall_time, step);
    pb_key(&w, 7, 2); /* session_log */
    pb_varint(&w, 2); /* its length: one varint field */
    pb_key(&w, 1, 0); /* status */
    pb_varint(&w, 1); /* START */
    return w.len;
}

/* Length of one Summary.Value { tag = 1; simple_value = 2 }. */
static size_t value_len(const struct qc_tb_scalar *v)
{
    const size_t t = strlen(v->tag);
    return 1 + varint_len(t) + t + 1 + 4;
}

size_t qc_tb_event_scalars(double wall_time, int64_t step, const struct qc_tb_scalar *v, int n,
                           uint8_t *out, size_t cap)
{
    struct pb w = {out, cap, 0};
    event_head(&w, wall_time, step);
    size_t summary_len = 0;
    for (int i = 0; i < n; i++)
        summary_len += 1 + varint_len(value_len(&v[i])) + value_len(&v[i]);
    pb_key(&w, 5, 2); /* summary */
    pb_varint(&w, summary_len);
    for (int i = 0; i < n; i++) {
        pb_key(&w, 1, 2); /* value */
        pb_varint(&w, value_len(&v[i]));
        pb_bytes(&w, 1, v[i].tag, strlen(v[i].tag));
        uint32_t bits;
        memcpy(&bits, &v[i].value, sizeof bits);
        pb_key(&w, 2, 5); /* simple_value, fixed32 float */
        pb_fixed(&w, bits, 4);
    }
    return w.len;
}
