/*
 * qcshard_internal.h — byte helpers shared by qcshard_read.c and qcshard_write.c (never leaves
 * src/data). All multi-byte integers of the format are little-endian; these helpers encode and
 * decode them byte by byte so the code is correct on any host, and qcshard_host_is_le() lets the
 * array paths (which copy raw host floats and int64s) refuse big-endian hosts.
 */
#ifndef QC_DATA_QCSHARD_INTERNAL_H
#define QC_DATA_QCSHARD_INTERNAL_H

#include <stdint.h>
#include <string.h>

static const char qcshard_magic[8] = {'Q', 'C', 'S', 'H', 'A', 'R', 'D', '\0'};
static const char qcshard_record_magic[4] = {'Q', 'C', 'S', 'C'};

static inline void qcshard_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void qcshard_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t qcshard_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t qcshard_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline int qcshard_host_is_le(void)
{
    const uint32_t one = 1;
    unsigned char b[4];
    memcpy(b, &one, 4);
    return b[0] == 1;
}

#endif /* QC_DATA_QCSHARD_INTERNAL_H */
