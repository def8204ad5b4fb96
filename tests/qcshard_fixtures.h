/*
 * qcshard_fixtures.h — a tiny hand-made scene and a byte-level toolkit for breaking qcshard
 * files on purpose (tests/test_qcshard.c, tests/fuzz/fuzz_qcshard.c seeds).
 *
 * tiny scene: A 3 (fragment observed 5..30, focal, AV last), P 3 lanes, Pt 6 (two points per
 * polygon), Et 3 typed edges (0->1 PRED, 1->0 SUCC, 2->1 LEFT).
 */
#ifndef QC_TESTS_QCSHARD_FIXTURES_H
#define QC_TESTS_QCSHARD_FIXTURES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "qc_qcshard.h"

static inline void fixture_tiny_scene(struct qc_scene *s)
{
    struct qc_scene_mut m;
    if (qc_scene_alloc(s, &m, 3, 3, 6, 3) != QC_OK)
        abort();
    snprintf(s->scenario_id, sizeof(s->scenario_id), "tiny-0000");
    snprintf(s->city, sizeof(s->city), "austin");
    s->av_index = 2;
    const char *ids[3] = {"1001", "1002", "AV"};
    const uint8_t cat[3] = {0, 3, 1};
    for (int a = 0; a < 3; a++) {
        snprintf(m.agent_id[a], QC_AGENT_ID_MAX, "%s", ids[a]);
        m.agent_type[a] = 0;
        m.agent_category[a] = cat[a];
        const int t0 = a == 0 ? 5 : 0, t1 = a == 0 ? 30 : 109;
        for (int t = 0; t < QC_SCENE_STEPS; t++) {
            const int raw = t >= t0 && t <= t1, prev = t - 1 >= t0 && t - 1 <= t1;
            const int k = a * QC_SCENE_STEPS + t;
            m.valid_mask[k] = (uint8_t)(t == 0 ? 0 : (t < 50 ? raw && prev : raw));
            m.predict_mask[k] = (uint8_t)(t >= 50 && raw && (49 >= t0 && 49 <= t1));
            if (!raw)
                continue;
            m.position[3 * k + 0] = 1000.0f + 0.5f * (float)t;
            m.position[3 * k + 1] = 2000.0f + 3.0f * (float)a;
            m.heading[k] = 0.0f;
            m.velocity[3 * k + 0] = 5.0f;
        }
    }
    for (int p = 0; p < 3; p++) {
        m.pl_position[3 * p + 0] = 1000.0f;
        m.pl_position[3 * p + 1] = 2000.0f + 3.5f * (float)p;
        m.pl_type[p] = 0;
        m.pl_is_intersection[p] = 1;
        for (int j = 0; j < 2; j++) {
            const int i = 2 * p + j;
            m.pt_position[3 * i + 0] = 1000.0f + 10.0f * (float)j;
            m.pt_position[3 * i + 1] = 2000.0f + 3.5f * (float)p;
            m.pt_magnitude[i] = 10.0f;
            m.pt_type[i] = (uint8_t)(j ? 16 : 2);
            m.pt_side[i] = (uint8_t)(j ? 2 : 0);
            m.pt2pl[i] = i;
            m.pt2pl[6 + i] = p;
        }
    }
    const int64_t src[3] = {0, 1, 2}, dst[3] = {1, 0, 1};
    const uint8_t typ[3] = {1, 2, 3};
    for (int e = 0; e < 3; e++) {
        m.pl2pl_edge[e] = src[e];
        m.pl2pl_edge[3 + e] = dst[e];
        m.pl2pl_type[e] = typ[e];
    }
}

/* A small valid scene for the fuzz seeds (a few KiB a record, so libFuzzer's -max_len reaches
 * the record-level checks): A agents (the last one the AV, agent 0 focal when A > 1), all
 * observed over the 110 steps and predicted; P lanes of 2 points, a SUCC chain between them. */
static inline void fixture_small_scene(struct qc_scene *s, int64_t A, int64_t P, int seed)
{
    struct qc_scene_mut m;
    if (qc_scene_alloc(s, &m, A, P, 2 * P, P > 1 ? P - 1 : 0) != QC_OK)
        abort();
    snprintf(s->scenario_id, sizeof(s->scenario_id), "small-%d", seed);
    snprintf(s->city, sizeof(s->city), "miami");
    s->av_index = A - 1;
    for (int64_t a = 0; a < A; a++) {
        snprintf(m.agent_id[a], QC_AGENT_ID_MAX, a == A - 1 ? "AV" : "%d", (int)(100 + a));
        m.agent_type[a] = (uint8_t)(a % 3);
        m.agent_category[a] = (uint8_t)(a == A - 1 ? 1 : a == 0 ? 3 : 2);
        for (int t = 0; t < QC_SCENE_STEPS; t++) {
            const int64_t k = a * QC_SCENE_STEPS + t;
            m.valid_mask[k] = (uint8_t)(t > 0);
            m.predict_mask[k] = (uint8_t)(t >= 50);
            m.position[3 * k + 0] = 500.0f + (float)seed + 0.8f * (float)t;
            m.position[3 * k + 1] = 700.0f + 4.0f * (float)a;
            m.heading[k] = 0.05f * (float)a;
            m.velocity[3 * k + 0] = 8.0f;
        }
    }
    for (int64_t p = 0; p < P; p++) {
        m.pl_position[3 * p + 0] = 500.0f + 20.0f * (float)p;
        m.pl_position[3 * p + 1] = 700.0f;
        m.pl_type[p] = (uint8_t)(p % 4);
        m.pl_is_intersection[p] = (uint8_t)(p % 3);
        for (int j = 0; j < 2; j++) {
            const int64_t i = 2 * p + j;
            m.pt_position[3 * i + 0] = m.pl_position[3 * p] + 10.0f * (float)j;
            m.pt_position[3 * i + 1] = 700.0f;
            m.pt_magnitude[i] = 10.0f;
            m.pt_type[i] = 16;
            m.pt_side[i] = 2;
            m.pt2pl[i] = i;
            m.pt2pl[2 * P + i] = p;
        }
    }
    for (int64_t e = 0; e + 1 < P; e++) {
        m.pl2pl_edge[e] = e;
        m.pl2pl_edge[(P - 1) + e] = e + 1;
        m.pl2pl_type[e] = 2;
    }
}

// ---- byte surgery on a whole file in memory -------------------------------------------------

static inline uint64_t fx_get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline void fx_put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void fx_put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Byte offset of index entry i. */
static inline uint64_t fx_entry(const unsigned char *f, uint64_t i)
{
    return fx_get64(f + 24) + i * QC_QCSHARD_ENTRY_SIZE;
}

/* File offset of array k of record i (layout from the record's own counts). */
static inline uint64_t fx_array(const unsigned char *f, uint64_t i, enum qc_scene_array k)
{
    const uint64_t rec = fx_get64(f + fx_entry(f, i));
    struct qc_scene_layout lay;
    if (qc_scene_layout_compute((int64_t)fx_get64(f + rec + 8), (int64_t)fx_get64(f + rec + 16),
                                (int64_t)fx_get64(f + rec + 24), (int64_t)fx_get64(f + rec + 32),
                                QC_QCSHARD_RECORD_HEAD, &lay) != QC_OK)
        abort();
    return rec + lay.offset[k];
}

/* Recomputes record i's checksum (when i >= 0), then the index and header checksums, so that a
 * deliberate corruption reaches the check it targets instead of tripping a checksum. */
static inline void fx_reseal(unsigned char *f, int64_t i)
{
    const uint64_t n = fx_get64(f + 16);
    if (i >= 0) {
        const unsigned char *e = f + fx_entry(f, (uint64_t)i);
        const uint64_t off = fx_get64(e), size = fx_get64(e + 8);
        fx_put64(f + fx_entry(f, (uint64_t)i) + 16, XXH3_64bits(f + off, size));
    }
    fx_put64(f + 32, XXH3_64bits(f + fx_get64(f + 24), n * QC_QCSHARD_ENTRY_SIZE));
    fx_put64(f + 56, XXH3_64bits(f, 56));
}

static inline unsigned char *fx_read_file(const char *path, size_t *size)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    const long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, fp) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    *size = (size_t)n;
    return b;
}

static inline int fx_write_file(const char *path, const unsigned char *b, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    const int ok = fwrite(b, 1, n, fp) == n;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

#endif /* QC_TESTS_QCSHARD_FIXTURES_H */
