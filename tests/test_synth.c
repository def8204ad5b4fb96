/*
 * test_synth.c — synthetic scenes: byte determinism (and a golden checksum that catches drift
 * across compilers and machines), statistics per profile against QCNET.md §8.6, the heavy tail
 * of `mixed`, and structure: every scene passes the strict reader; masks follow QCNET.md §7.2;
 * the focal agent and the AV are observed throughout; typed edges join lanes only; crosswalks
 * come as forward/reverse polygon pairs; motion is smooth and self-consistent.
 *
 * Edge counts here are an uncapped proxy (pl2pl radius 150 + pl2a + a2a radius 50, §8.1), enough
 * to compare scene sizes; the graph builder's tests own the exact counts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "qc_qcshard.h"
#include "qc_synth.h"
#include "testutil.h"

#define S QC_SCENE_STEPS

/* Raw observation flag: observed positions are thousands of metres from the city origin, and
 * unobserved ones are exactly 0. */
static int raw_obs(const struct qc_scene *s, int64_t a, int t)
{
    const float *p = &s->position[(a * S + t) * 3];
    return p[0] != 0.0f || p[1] != 0.0f;
}

static double edge_proxy(const struct qc_scene *s)
{
    double e = (double)s->num_points;
    const int64_t A = s->num_agents, P = s->num_polygons;
    for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < P; q++) {
            const double dx = (double)s->pl_position[3 * p] - (double)s->pl_position[3 * q];
            const double dy = (double)s->pl_position[3 * p + 1] - (double)s->pl_position[3 * q + 1];
            e += p != q && dx * dx + dy * dy < 150.0 * 150.0;
        }
    for (int t = 0; t < QC_SCENE_HIST_STEPS; t++)
        for (int64_t a = 0; a < A; a++) {
            if (!s->valid_mask[a * S + t])
                continue;
            const float *x = &s->position[(a * S + t) * 3];
            for (int64_t p = 0; p < P; p++) {
                const double dx = (double)s->pl_position[3 * p] - (double)x[0],
                             dy = (double)s->pl_position[3 * p + 1] - (double)x[1];
                e += dx * dx + dy * dy < 2500.0;
            }
            for (int64_t b = 0; b < A; b++) {
                if (b == a || !s->valid_mask[b * S + t])
                    continue;
                const float *y = &s->position[(b * S + t) * 3];
                const double dx = (double)y[0] - (double)x[0], dy = (double)y[1] - (double)x[1];
                e += dx * dx + dy * dy < 2500.0;
            }
        }
    return e;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t file_hash(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n);
    const size_t got = b ? fread(b, 1, (size_t)n, f) : 0;
    fclose(f);
    const uint64_t h = got == (size_t)n ? XXH3_64bits(b, (size_t)n) : 0;
    free(b);
    *size = (size_t)n;
    return h;
}

static uint64_t gen_file(const char *path, uint64_t seed, int n, enum qc_synth_profile prof,
                         size_t *size)
{
    struct qc_qcshard_writer *w = NULL;
    if (qc_qcshard_writer_create(path, &w) != QC_OK)
        return 0;
    for (int i = 0; i < n; i++) {
        struct qc_scene s;
        if (qc_synth_scene(seed, i, prof, &s) != QC_OK ||
            qc_qcshard_writer_append(w, &s) != QC_OK) {
            printf("  gen: %s\n", qc_error_last());
            qc_qcshard_writer_destroy(w);
            return 0;
        }
        qc_scene_free(&s);
    }
    const enum qc_status st = qc_qcshard_writer_finish(w);
    qc_qcshard_writer_destroy(w);
    return st == QC_OK ? file_hash(path, size) : 0;
}

/* ---- structure ----------------------------------------------------------------------------- */

static void check_structure(const struct qc_scene *s, int idx)
{
    const int64_t A = s->num_agents, P = s->num_polygons, Pt = s->num_points;
    T_EXPECT(qc_scene_validate(s, "synth", idx) == QC_OK, "%s", qc_error_last());
    int focal = 0;
    for (int64_t a = 0; a < A; a++) {
        int any_hist = 0;
        for (int t = 0; t < S; t++) {
            const int raw = raw_obs(s, a, t), k = (int)(a * S + t);
            any_hist |= raw && t < QC_SCENE_HIST_STEPS;
            const int want_valid =
                t == 0 ? 0 : (t < QC_SCENE_HIST_STEPS ? raw && raw_obs(s, a, t - 1) : raw);
            const int want_pred =
                t >= QC_SCENE_HIST_STEPS && raw && raw_obs(s, a, QC_SCENE_HIST_STEPS - 1);
            if (s->valid_mask[k] != want_valid || s->predict_mask[k] != want_pred) {
                T_EXPECT(0, "scene %d agent %lld step %d: masks %d/%d, want %d/%d", idx,
                         (long long)a, t, s->valid_mask[k], s->predict_mask[k], want_valid,
                         want_pred);
                return;
            }
            if (!raw && ((double)s->heading[k] != 0.0 || (double)s->velocity[3 * k] != 0.0 ||
                         (double)s->velocity[3 * k + 1] != 0.0)) {
                T_EXPECT(0, "scene %d agent %lld step %d: unobserved but non-zero", idx,
                         (long long)a, t);
                return;
            }
            if (raw) {
                const float *p = &s->position[3 * k];
                if (!(fabs((double)p[0]) + fabs((double)p[1]) > 800.0)) {
                    T_EXPECT(0, "scene %d agent %lld: not city-scale (%g, %g)", idx, (long long)a,
                             (double)p[0], (double)p[1]);
                    return;
                }
            }
        }
        T_EXPECT(any_hist, "scene %d agent %lld never observed in history", idx, (long long)a);
        if (s->agent_category[a] >= 1) /* AV, scored and focal tracks: all 110 steps */
            for (int t = 0; t < S; t++)
                if (!raw_obs(s, a, t)) {
                    T_EXPECT(0, "scene %d agent %lld (category %d) unobserved at %d", idx,
                             (long long)a, s->agent_category[a], t);
                    break;
                }
        focal += s->agent_category[a] == 3;
        /* motion: finite differences agree with the stored velocity; heading follows motion */
        for (int t = 0; t + 1 < S; t++) {
            const int k = (int)(a * S + t);
            if (!raw_obs(s, a, t) || !raw_obs(s, a, t + 1))
                continue;
            const double dx = (double)s->position[3 * (k + 1)] - (double)s->position[3 * k];
            const double dy = (double)s->position[3 * (k + 1) + 1] - (double)s->position[3 * k + 1];
            const double vx = 0.5 * ((double)s->velocity[3 * k] + (double)s->velocity[3 * (k + 1)]);
            const double vy =
                0.5 * ((double)s->velocity[3 * k + 1] + (double)s->velocity[3 * (k + 1) + 1]);
            const double err = hypot(dx / 0.1 - vx, dy / 0.1 - vy);
            const double speed = hypot((double)s->velocity[3 * k], (double)s->velocity[3 * k + 1]);
            const double acc =
                hypot((double)s->velocity[3 * (k + 1)] - (double)s->velocity[3 * k],
                      (double)s->velocity[3 * (k + 1) + 1] - (double)s->velocity[3 * k + 1]) /
                0.1;
            if (err > 0.6 || speed > 20.0 || acc > 9.0) {
                T_EXPECT(0, "scene %d agent %lld step %d: |dp/dt - v| %.3f, speed %.2f, accel %.2f",
                         idx, (long long)a, t, err, speed, acc);
                break;
            }
            if (speed > 1.0) {
                double dh = atan2((double)s->velocity[3 * k + 1], (double)s->velocity[3 * k]) -
                            (double)s->heading[k];
                while (dh > M_PI)
                    dh -= 2 * M_PI;
                while (dh < -M_PI)
                    dh += 2 * M_PI;
                if (fabs(dh) > 0.05) {
                    T_EXPECT(0, "scene %d agent %lld step %d: heading %.3f vs motion (off %.3f)",
                             idx, (long long)a, t, (double)s->heading[k], dh);
                    break;
                }
            }
        }
    }
    T_EXPECT_EQ_I64(focal, 1, "scene %d focal agents", idx);
    T_EXPECT(s->agent_category[s->av_index] == 1 && s->agent_type[s->av_index] == 0,
             "scene %d: AV category %d type %d", idx, s->agent_category[s->av_index],
             s->agent_type[s->av_index]);

    /* map: lanes first, then forward crosswalks, then reverse crosswalks (P = L + 2C) */
    int64_t L = 0;
    while (L < P && s->pl_type[L] != 3)
        L++;
    const int64_t C2 = P - L;
    T_EXPECT(C2 % 2 == 0, "scene %d: %lld crosswalk polygons, not pairs", idx, (long long)C2);
    for (int64_t p = L; p < P; p++)
        T_EXPECT(s->pl_type[p] == 3 && s->pl_is_intersection[p] == 2, "scene %d polygon %lld", idx,
                 (long long)p);
    for (int64_t p = 0; p < L; p++)
        T_EXPECT(s->pl_type[p] <= 2 && s->pl_is_intersection[p] <= 1, "scene %d lane %lld", idx,
                 (long long)p);
    int64_t *first = calloc((size_t)P + 1, sizeof(int64_t));
    for (int64_t p = 0; p <= P; p++)
        first[p] = Pt;
    for (int64_t i = Pt - 1; i >= 0; i--)
        first[s->pt2pl[Pt + i]] = i;
    for (int64_t p = P - 1; p >= 0; p--) /* polygons with no point (none expected) */
        if (first[p] == Pt)
            first[p] = first[p + 1];
    for (int64_t p = 0; p < P; p++) {
        const int64_t b = first[p], e = first[p + 1];
        T_EXPECT(e - b >= 3, "scene %d polygon %lld has %lld points", idx, (long long)p,
                 (long long)(e - b));
        int side = 0;
        for (int64_t i = b; i < e; i++) {
            /* sides come in groups 0.., 1.., 2..; centre points are type 16 */
            if (s->pt_side[i] < side || (s->pt_side[i] == 2) != (s->pt_type[i] == 16)) {
                T_EXPECT(0, "scene %d polygon %lld point %lld: side %d type %d", idx, (long long)p,
                         (long long)i, s->pt_side[i], s->pt_type[i]);
                break;
            }
            side = s->pt_side[i];
            if (p >= L && s->pt_side[i] < 2)
                T_EXPECT(s->pt_type[i] == 15, "crosswalk boundary type %d", s->pt_type[i]);
        }
    }
    const int64_t C = C2 / 2;
    for (int64_t c = 0; c < C; c++) {
        const int64_t f = L + c, r = L + C + c;
        T_EXPECT_EQ_I64(first[f + 1] - first[f], first[r + 1] - first[r],
                        "scene %d crosswalk %lld points", idx, (long long)c);
        double dh = (double)s->pl_orientation[f] - (double)s->pl_orientation[r];
        dh = fabs(fabs(dh) - M_PI);
        T_EXPECT(dh < 1e-3, "scene %d crosswalk %lld: orientations not opposite", idx,
                 (long long)c);
        /* the reverse polygon starts where the forward centre line ends */
        const int64_t last = first[f + 1] - 1;
        const double ex = (double)s->pt_position[3 * last] +
                          (double)s->pt_magnitude[last] * cos((double)s->pt_orientation[last]);
        const double ey = (double)s->pt_position[3 * last + 1] +
                          (double)s->pt_magnitude[last] * sin((double)s->pt_orientation[last]);
        T_EXPECT(hypot(ex - (double)s->pl_position[3 * r], ey - (double)s->pl_position[3 * r + 1]) <
                     0.01,
                 "scene %d crosswalk %lld: reverse start off", idx, (long long)c);
    }
    free(first);
    int types[5] = {0};
    for (int64_t e = 0; e < s->num_pl2pl; e++) {
        const int64_t a = s->pl2pl_edge[e], b = s->pl2pl_edge[s->num_pl2pl + e];
        T_EXPECT(a < L && b < L && a != b, "scene %d typed edge %lld joins %lld -> %lld (L %lld)",
                 idx, (long long)e, (long long)a, (long long)b, (long long)L);
        types[s->pl2pl_type[e]]++;
    }
    T_EXPECT(types[1] > 0 && types[2] > 0 && types[3] > 0 && types[4] > 0,
             "scene %d edge types %d/%d/%d/%d", idx, types[1], types[2], types[3], types[4]);
    T_EXPECT_EQ_I64(types[1], types[2], "scene %d: PRED and SUCC edges pair up", idx);
}

/* ---- statistics ---------------------------------------------------------------------------- */

struct stats {
    double a, p, ptp, v, ap, spacing, lane_len;
    int64_t a_min, a_max, p_min, p_max;
};

static void scene_stats(const struct qc_scene *s, struct stats *st)
{
    const int64_t A = s->num_agents, P = s->num_polygons, Pt = s->num_points;
    int64_t V = 0, Ap = 0;
    for (int64_t a = 0; a < A; a++) {
        for (int t = 0; t < QC_SCENE_HIST_STEPS; t++)
            V += s->valid_mask[a * S + t];
        Ap += s->predict_mask[a * S + 60] || raw_obs(s, a, QC_SCENE_HIST_STEPS - 1);
    }
    double cl = 0, nc = 0;
    for (int64_t i = 0; i < Pt; i++)
        if (s->pt_side[i] == 2 && s->pl_type[s->pt2pl[Pt + i]] != 3) {
            cl += (double)s->pt_magnitude[i];
            nc++;
        }
    int64_t lanes = 0;
    for (int64_t p = 0; p < P; p++)
        lanes += s->pl_type[p] != 3;
    st->a += (double)A;
    st->p += (double)P;
    st->ptp += (double)Pt / (double)P;
    st->v += (double)V / (50.0 * (double)A);
    st->ap += (double)Ap / (double)A;
    st->spacing += cl / nc;
    st->lane_len += cl / (double)lanes;
    st->a_min = A < st->a_min ? A : st->a_min;
    st->a_max = A > st->a_max ? A : st->a_max;
    st->p_min = P < st->p_min ? P : st->p_min;
    st->p_max = P > st->p_max ? P : st->p_max;
}

static void check_profile_stats(enum qc_synth_profile prof, int n, double a_lo, double a_hi,
                                double p_lo, double p_hi)
{
    struct stats st = {0, 0, 0, 0, 0, 0, 0, 1 << 30, 0, 1 << 30, 0};
    for (int i = 0; i < n; i++) {
        struct qc_scene s;
        T_EXPECT(qc_synth_scene(2024, i, prof, &s) == QC_OK, "%s", qc_error_last());
        scene_stats(&s, &st);
        qc_scene_free(&s);
    }
    const double k = 1.0 / n;
    printf("  %s: mean A %.1f [%lld, %lld], P %.1f [%lld, %lld], Pt/P %.2f, V/50A %.2f, Ap/A %.2f, "
           "centre spacing %.2f m, lane length %.1f m\n",
           qc_synth_profile_name(prof), st.a * k, (long long)st.a_min, (long long)st.a_max,
           st.p * k, (long long)st.p_min, (long long)st.p_max, st.ptp * k, st.v * k, st.ap * k,
           st.spacing * k, st.lane_len * k);
    T_EXPECT(st.a * k >= a_lo && st.a * k <= a_hi, "mean A %.1f not in [%g, %g]", st.a * k, a_lo,
             a_hi);
    T_EXPECT(st.p * k >= p_lo && st.p * k <= p_hi, "mean P %.1f not in [%g, %g]", st.p * k, p_lo,
             p_hi);
    T_EXPECT(st.ptp * k >= 16.0 && st.ptp * k <= 20.5, "Pt/P %.2f", st.ptp * k);
    T_EXPECT(st.v * k >= 0.45 && st.v * k <= 0.7, "V/50A %.2f", st.v * k);
    T_EXPECT(st.ap * k >= 0.45 && st.ap * k <= 0.75, "Ap/A %.2f", st.ap * k);
    T_EXPECT(st.spacing * k >= 1.6 && st.spacing * k <= 2.0, "centre spacing %.2f", st.spacing * k);
    T_EXPECT(st.lane_len * k >= 15.0 && st.lane_len * k <= 26.0, "lane length %.1f",
             st.lane_len * k);
}

int main(void)
{
    char dir[] = "/tmp/test_synth.XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char p1[64], p2[64], p3[64];
    snprintf(p1, sizeof(p1), "%s/a.qcshard", dir);
    snprintf(p2, sizeof(p2), "%s/b.qcshard", dir);
    snprintf(p3, sizeof(p3), "%s/c.qcshard", dir);

    QC_TEST ("synth: same seed, same bytes; other seed, other bytes") {
        for (int prof = 0; prof < QC_SYNTH_PROFILE_COUNT; prof++) {
            size_t n1 = 0, n2 = 0, n3 = 0;
            const uint64_t h1 = gen_file(p1, 11, 3, (enum qc_synth_profile)prof, &n1);
            const uint64_t h2 = gen_file(p2, 11, 3, (enum qc_synth_profile)prof, &n2);
            const uint64_t h3 = gen_file(p3, 12, 3, (enum qc_synth_profile)prof, &n3);
            T_EXPECT(h1 != 0 && h1 == h2 && n1 == n2, "%s: runs differ",
                     qc_synth_profile_name(prof));
            T_EXPECT(h3 != h1, "%s: seeds 11 and 12 gave the same file",
                     qc_synth_profile_name(prof));
        }
    }
    QC_TEST ("synth: a scene depends only on (seed, index, profile)") {
        struct qc_scene a, b, c;
        T_EXPECT(qc_synth_scene(5, 9, QC_SYNTH_MIXED, &a) == QC_OK, "a");
        T_EXPECT(qc_synth_scene(5, 3, QC_SYNTH_MIXED, &c) == QC_OK, "c"); /* in between */
        T_EXPECT(qc_synth_scene(5, 9, QC_SYNTH_MIXED, &b) == QC_OK, "b");
        T_EXPECT(memcmp(a.owned, b.owned, 64) == 0 && a.num_points == b.num_points &&
                     memcmp(a.position, b.position, (size_t)a.num_agents * S * 12) == 0 &&
                     memcmp(a.pt_position, b.pt_position, (size_t)a.num_points * 12) == 0,
                 "scene 9 differs between calls");
        T_EXPECT(strcmp(a.scenario_id, c.scenario_id) != 0, "scenes 9 and 3 share an id");
        qc_scene_free(&a);
        qc_scene_free(&b);
        qc_scene_free(&c);
    }
    QC_TEST ("synth: golden checksum (machine- and compiler-independent bytes)") {
        /* If the generator changes on purpose, update this value (printed below) and say so in
         * the commit: files generated by older builds differ from then on. A change without a
         * generator change means float results now depend on the compiler or machine. */
        const uint64_t golden = 0x95554b1eeee61527ull;
        size_t n = 0;
        const uint64_t h = gen_file(p1, 1, 3, QC_SYNTH_TYPICAL, &n);
        printf("  gen --seed 1 --scenes 3 --profile typical: %zu bytes, xxh3 0x%016llx\n", n,
               (unsigned long long)h);
        T_EXPECT(h == golden, "checksum 0x%016llx, golden 0x%016llx", (unsigned long long)h,
                 (unsigned long long)golden);
    }
    QC_TEST ("synth: profile names") {
        enum qc_synth_profile p;
        T_EXPECT(qc_synth_profile_parse("dense", &p) == QC_OK && p == QC_SYNTH_DENSE, "dense");
        T_EXPECT(qc_synth_profile_parse("huge", &p) == QC_ERR_INVALID, "huge");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "unknown scene profile 'huge'");
        struct qc_scene s;
        T_EXPECT(qc_synth_scene(1, -1, QC_SYNTH_TYPICAL, &s) == QC_ERR_INVALID, "negative index");
    }
    QC_TEST ("synth: structure (typical, dense, mixed)") {
        for (int prof = 0; prof < QC_SYNTH_PROFILE_COUNT; prof++)
            for (int i = 0; i < (prof == QC_SYNTH_DENSE ? 3 : 12); i++) {
                struct qc_scene s;
                T_EXPECT(qc_synth_scene(77, i, (enum qc_synth_profile)prof, &s) == QC_OK, "%s",
                         qc_error_last());
                check_structure(&s, i);
                qc_scene_free(&s);
            }
    }
    QC_TEST ("synth: generated files pass the strict reader") {
        for (int prof = 0; prof < QC_SYNTH_PROFILE_COUNT; prof++) {
            size_t n = 0;
            T_EXPECT(gen_file(p1, 99, 4, (enum qc_synth_profile)prof, &n) != 0, "gen");
            struct qc_qcshard_reader *r = NULL;
            T_EXPECT(qc_qcshard_reader_create(p1, &r) == QC_OK, "%s", qc_error_last());
            T_EXPECT(r && qc_qcshard_reader_count(r) == 4, "count");
            T_EXPECT(r && qc_qcshard_reader_validate_all(r) == QC_OK, "%s", qc_error_last());
            qc_qcshard_reader_destroy(r);
        }
    }
    QC_TEST ("synth: typical statistics (QCNET.md §8.6)")
        check_profile_stats(QC_SYNTH_TYPICAL, 40, 50, 70, 150, 200);
    QC_TEST ("synth: dense statistics")
        check_profile_stats(QC_SYNTH_DENSE, 6, 150, 250, 350, 600);
    QC_TEST ("synth: mixed has a heavy tail (3-5x the median edges)") {
        enum { N = 300 };
        static double e[N], sorted[N];
        for (int i = 0; i < N; i++) {
            struct qc_scene s;
            T_EXPECT(qc_synth_scene(2024, i, QC_SYNTH_MIXED, &s) == QC_OK, "%s", qc_error_last());
            e[i] = edge_proxy(&s);
            sorted[i] = e[i];
            qc_scene_free(&s);
        }
        qsort(sorted, N, sizeof(double), cmp_double);
        const double median = sorted[N / 2];
        int tail = 0;
        double tail_sum = 0, max_ratio = 0;
        for (int i = 0; i < N; i++) {
            const double r = e[i] / median;
            max_ratio = r > max_ratio ? r : max_ratio;
            if (r >= 2.5) {
                tail++;
                tail_sum += r;
            }
        }
        printf("  mixed: median edges %.0f, %d of %d scenes >= 2.5x (mean %.2fx), max %.2fx\n",
               median, tail, N, tail ? tail_sum / tail : 0.0, max_ratio);
        T_EXPECT(tail >= N / 100 && tail <= N / 10, "tail of %d scenes", tail);
        T_EXPECT(tail && tail_sum / tail >= 3.0 && tail_sum / tail <= 5.0, "tail mean ratio %.2f",
                 tail ? tail_sum / tail : 0.0);
        T_EXPECT(max_ratio <= 6.0, "max ratio %.2f", max_ratio);
        T_EXPECT(sorted[N / 10] > 0.5 * median, "a light tail below the median");
    }
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", dir);
    return qc_test_summary();
}
