/*
 * testutil.h — the tiny test harness every tests/test_<module>.c uses.
 *
 *   int main(void) {
 *       QC_TEST("config: preset inheritance") {
 *           T_EXPECT(x == 3, "x is %d", x);
 *           T_EXPECT_EQ_U64(a, b, "bytes of %s", name);
 *       }
 *       return qc_test_summary();   // 0 all passed, 1 any failed, 77 all skipped
 *   }
 *
 * A failed expectation prints file:line and the message, marks the current test failed and
 * carries on. T_FATAL ends the process (exit 1). T_SKIP marks the test skipped and leaves it.
 * QC_TEST_FILTER=substring runs only matching tests; QC_TEST_EXCLUDE=substring[|substring...]
 * leaves the tests matching any of them out (at most 16). A run in which no test ran, a filter that
 * matched nothing or an exclusion that left nothing out is a failure (exit 1): a renamed case must
 * not silently empty the ctest entries that select cases by substring (tests/cmake). qc_test_seed()
 * returns QC_TEST_SEED (or a fixed default) and the seed is printed with every failure so it can be
 * replayed.
 */
#ifndef QC_TESTS_TESTUTIL_H
#define QC_TESTS_TESTUTIL_H

#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct qc_test_state {
    const char *name;
    int failed_in_test;
    int skipped_in_test;
    int passed;
    int failed;
    int skipped;
    int excluded;          /* cases QC_TEST_EXCLUDE left out */
    unsigned exclude_hits; /* bit i: QC_TEST_EXCLUDE's substring i matched a case */
    uint64_t seed;
    int seed_read;
};

static struct qc_test_state qc_test_st;

static inline uint64_t qc_test_seed(void)
{
    if (!qc_test_st.seed_read) {
        const char *s = getenv("QC_TEST_SEED");
        qc_test_st.seed = s ? strtoull(s, NULL, 0) : 0x5eed2023u;
        qc_test_st.seed_read = 1;
    }
    return qc_test_st.seed;
}

/* The i-th '|'-separated substring of QC_TEST_EXCLUDE (0 <= i < 16) into buf; false past the
 * last one. */
static inline bool qc_test_exclude_part(const char *exclude, int i, char *buf, size_t n)
{
    const char *p = exclude;
    for (int k = 0; k < i && p; k++) {
        p = strchr(p, '|');
        if (p)
            p++;
    }
    if (!p || i >= 16)
        return false;
    const char *e = strchr(p, '|');
    const size_t len = e ? (size_t)(e - p) : strlen(p);
    snprintf(buf, n, "%.*s", (int)len, p);
    return true;
}

static inline int qc_test_begin(const char *name)
{
    const char *filter = getenv("QC_TEST_FILTER");
    if (filter && !strstr(name, filter))
        return 0;
    const char *exclude = getenv("QC_TEST_EXCLUDE");
    if (exclude && *exclude) {
        char part[256];
        bool out = false;
        for (int i = 0; qc_test_exclude_part(exclude, i, part, sizeof part); i++)
            if (*part && strstr(name, part)) {
                qc_test_st.exclude_hits |= 1u << i;
                out = true;
            }
        if (out) {
            qc_test_st.excluded++;
            return 0;
        }
    }
    qc_test_st.name = name;
    qc_test_st.failed_in_test = 0;
    qc_test_st.skipped_in_test = 0;
    fflush(stdout);
    return 1;
}

static inline int qc_test_end(void)
{
    if (qc_test_st.failed_in_test) {
        qc_test_st.failed++;
        printf("FAIL  %s (QC_TEST_SEED=%" PRIu64 ")\n", qc_test_st.name, qc_test_seed());
    } else if (qc_test_st.skipped_in_test) {
        qc_test_st.skipped++;
        printf("SKIP  %s\n", qc_test_st.name);
    } else {
        qc_test_st.passed++;
        printf("ok    %s\n", qc_test_st.name);
    }
    fflush(stdout);
    return 0;
}

/* for-loop trick: the body runs once when the filter matches, then qc_test_end() reports. */
#define QC_TEST(name)                                                                              \
    for (int qc_test_once_ = qc_test_begin(name); qc_test_once_; qc_test_once_ = qc_test_end())

static inline int qc_test_summary(void)
{
    printf("%d passed, %d failed, %d skipped\n", qc_test_st.passed, qc_test_st.failed,
           qc_test_st.skipped);
    const char *filter = getenv("QC_TEST_FILTER"), *exclude = getenv("QC_TEST_EXCLUDE");
    if (qc_test_st.passed + qc_test_st.failed + qc_test_st.skipped == 0) {
        printf("FAIL  no test case ran (QC_TEST_FILTER=\"%s\", QC_TEST_EXCLUDE=\"%s\")\n"
               "  hint: a filter that matches no case name selects nothing; was a case renamed?\n",
               filter ? filter : "", exclude ? exclude : "");
        return 1;
    }
    if (exclude && *exclude) {
        char part[256];
        for (int i = 0; qc_test_exclude_part(exclude, i, part, sizeof part); i++)
            if (!(qc_test_st.exclude_hits & (1u << i))) {
                printf("FAIL  QC_TEST_EXCLUDE=\"%s\": \"%s\" matched no case name\n"
                       "  hint: the exclusion is stale (was a case renamed?): fix it where it is "
                       "set\n",
                       exclude, part);
                return 1;
            }
    }
    if (qc_test_st.failed)
        return 1;
    if (qc_test_st.passed == 0 && qc_test_st.skipped > 0)
        return 77;
    return 0;
}

#define T_FAIL_AT(...)                                                                             \
    do {                                                                                           \
        qc_test_st.failed_in_test = 1;                                                             \
        printf("  %s:%d: ", __FILE__, __LINE__);                                                   \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
    } while (0)

#define T_EXPECT(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            T_FAIL_AT("expected %s: ", #cond);                                                     \
            printf("    ");                                                                        \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#define T_EXPECT_EQ_U64(a, b, ...)                                                                 \
    do {                                                                                           \
        uint64_t qc_ta_ = (uint64_t)(a), qc_tb_ = (uint64_t)(b);                                   \
        if (qc_ta_ != qc_tb_) {                                                                    \
            T_FAIL_AT("%s == %s: %" PRIu64 " != %" PRIu64, #a, #b, qc_ta_, qc_tb_);                \
            printf("    ");                                                                        \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#define T_EXPECT_EQ_I64(a, b, ...)                                                                 \
    do {                                                                                           \
        int64_t qc_ta_ = (int64_t)(a), qc_tb_ = (int64_t)(b);                                      \
        if (qc_ta_ != qc_tb_) {                                                                    \
            T_FAIL_AT("%s == %s: %" PRId64 " != %" PRId64, #a, #b, qc_ta_, qc_tb_);                \
            printf("    ");                                                                        \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#define T_EXPECT_STR_CONTAINS(hay, needle)                                                         \
    do {                                                                                           \
        const char *qc_th_ = (hay), *qc_tn_ = (needle);                                            \
        if (!qc_th_ || !strstr(qc_th_, qc_tn_))                                                    \
            T_FAIL_AT("expected \"%s\" in \"%s\"", qc_tn_, qc_th_ ? qc_th_ : "(null)");            \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define T_EXPECT_NEAR(a, b, atol, rtol, ...)                                                       \
    do {                                                                                           \
        double qc_ta_ = (double)(a), qc_tb_ = (double)(b);                                         \
        if (!(fabs(qc_ta_ - qc_tb_) <= (atol) + (rtol)*fabs(qc_tb_))) {                            \
            T_FAIL_AT("%s ~ %s: %.9g vs %.9g", #a, #b, qc_ta_, qc_tb_);                            \
            printf("    ");                                                                        \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#define T_FATAL(...)                                                                               \
    do {                                                                                           \
        T_FAIL_AT(__VA_ARGS__);                                                                    \
        printf("FATAL in %s (QC_TEST_SEED=%" PRIu64 ")\n", qc_test_st.name, qc_test_seed());       \
        exit(1);                                                                                   \
    } while (0)

/* Marks the current test skipped (use as the last statement reached in the body). */
#define T_SKIP(...)                                                                                \
    do {                                                                                           \
        qc_test_st.skipped_in_test = 1;                                                            \
        printf("  skip: ");                                                                        \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
    } while (0)

/* splitmix64: the tests' seeded generator. */
static inline uint64_t qc_test_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline int qc_test_rm_entry(const char *path, const struct stat *sb, int flag,
                                   struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* rm -rf path (a test's temporary folder); missing paths are fine. */
static inline void t_rm_rf(const char *path)
{
    nftw(path, qc_test_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif /* QC_TESTS_TESTUTIL_H */
