/*
 * test_progress.c — the progress reporter and the byte/duration formatters.
 *
 * Output goes to an open_memstream with the terminal decision forced and a fake clock, so the
 * exact text is checked without sleeping.
 */
#include <math.h>

#include "testutil.h"

#include "qc_progress.h"

#define T_EXPECT_STR_EQ(a, b)                                                                      \
    do {                                                                                           \
        const char *qc_sa_ = (a), *qc_sb_ = (b);                                                   \
        if (strcmp(qc_sa_, qc_sb_) != 0)                                                           \
            T_FAIL_AT("got      \"%s\"\n    expected \"%s\"", qc_sa_, qc_sb_);                     \
    } while (0)

struct fake_clock {
    double now;
};

static double fake_now(void *user)
{
    return ((struct fake_clock *)user)->now;
}

/* An in-memory output stream; text() returns everything written so far. */
struct capture {
    FILE *f;
    char *buf;
    size_t len;
    size_t seen; /* text already returned by take() */
};

static void capture_open(struct capture *c)
{
    memset(c, 0, sizeof *c);
    c->f = open_memstream(&c->buf, &c->len);
    if (!c->f)
        T_FATAL("open_memstream failed");
}

/* Text written since the last take(). */
static const char *take(struct capture *c)
{
    fflush(c->f);
    const char *t = c->buf + c->seen;
    c->seen = c->len;
    return t;
}

static void capture_close(struct capture *c)
{
    fclose(c->f);
    free(c->buf);
}

static struct qc_progress *make(struct capture *cap, struct fake_clock *clk, const char *label,
                                const char *unit, uint64_t total, enum qc_progress_tty tty)
{
    struct qc_progress_opts o;
    qc_progress_opts_init(&o);
    o.label = label;
    o.unit = unit;
    o.total = total;
    o.out = cap->f;
    o.tty = tty;
    o.clock = fake_now;
    o.clock_user = clk;
    o.bar_width = 10;
    struct qc_progress *p = NULL;
    enum qc_status st = qc_progress_create(&o, &p);
    if (st != QC_OK)
        T_FATAL("qc_progress_create: %s", qc_error_last());
    return p;
}

static void test_format(void)
{
    QC_TEST ("progress: qc_format_bytes") {
        static const struct {
            uint64_t bytes;
            const char *want;
        } cases[] = {
            {0, "0 B"},
            {1, "1 B"},
            {1023, "1023 B"},
            {1024, "1.00 KiB"},
            {1536, "1.50 KiB"},
            {10 * 1024 + 512, "10.5 KiB"},
            {100ull << 20, "100 MiB"},
            {3435973837ull, "3.20 GiB"},
            {24ull << 30, "24.0 GiB"},
            {25769803776ull, "24.0 GiB"},
            {(1ull << 40) * 3 / 2, "1.50 TiB"},
            {UINT64_MAX, "16.0 EiB"},
        };
        char buf[32];
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            qc_format_bytes(cases[i].bytes, buf, sizeof buf);
            T_EXPECT_STR_EQ(buf, cases[i].want);
        }
        /* 1023 MiB would print as "1023 MiB"; shown as a fraction of the next unit instead. */
        qc_format_bytes(1023ull << 20, buf, sizeof buf);
        T_EXPECT_STR_EQ(buf, "1.00 GiB");
        qc_format_bytes(999ull << 20, buf, sizeof buf);
        T_EXPECT_STR_EQ(buf, "999 MiB");
        /* Truncation: snprintf convention. */
        char small[5];
        size_t n = qc_format_bytes(3435973837ull, small, sizeof small);
        T_EXPECT_EQ_U64(n, 8, "length of \"3.20 GiB\"");
        T_EXPECT_STR_EQ(small, "3.20");
    }
    QC_TEST ("progress: qc_format_duration") {
        static const struct {
            double s;
            const char *want;
        } cases[] = {
            {0.0, "00:00"},        {59.4, "00:59"},          {59.6, "01:00"},
            {754.0, "12:34"},      {3599.0, "59:59"},        {3600.0, "1:00:00"},
            {86399.0, "23:59:59"}, {90061.0, "1d 01:01:01"}, {-1.0, "--:--"},
        };
        char buf[32];
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            qc_format_duration(cases[i].s, buf, sizeof buf);
            T_EXPECT_STR_EQ(buf, cases[i].want);
        }
        qc_format_duration((double)NAN, buf, sizeof buf);
        T_EXPECT_STR_EQ(buf, "--:--");
        qc_format_duration((double)INFINITY, buf, sizeof buf);
        T_EXPECT_STR_EQ(buf, "--:--");
    }
}

static void test_eta(void)
{
    QC_TEST ("progress: a resumed run's rate counts from where it started (opts.start)") {
        struct capture cap;
        capture_open(&cap);
        struct fake_clock clk = {50.0};
        struct qc_progress_opts o;
        qc_progress_opts_init(&o);
        o.total = 6;
        o.start = 4; /* resumed at step 4 of 6 */
        o.out = cap.f;
        o.tty = QC_PROGRESS_TTY_OFF;
        o.clock = fake_now;
        o.clock_user = &clk;
        struct qc_progress *p = NULL;
        T_EXPECT(qc_progress_create(&o, &p) == QC_OK, "%s", qc_error_last());
        double rate = -1.0;
        clk.now = 50.00001;
        qc_progress_update(p, 4); /* the loop shows where it starts */
        T_EXPECT(!qc_progress_rate(p, &rate) || rate < 1.0,
                 "no step run yet: no rate, not 4 steps in 10 us (%g)", rate);
        clk.now = 52.0;
        qc_progress_update(p, 5);
        T_EXPECT(qc_progress_rate(p, &rate), "a rate after one step");
        T_EXPECT_NEAR(rate, 0.5, 1e-9, 0.0, "1 step in 2 s, not 5 steps in 2 s");
        qc_progress_destroy(p);
        capture_close(&cap);
    }

    QC_TEST ("progress: rate and ETA math") {
        struct capture cap;
        capture_open(&cap);
        struct fake_clock clk = {100.0}; /* the clock's origin is arbitrary */
        struct qc_progress *p = make(&cap, &clk, "train", "steps", 1000, QC_PROGRESS_TTY_OFF);
        double rate = -1.0, eta = -1.0;
        qc_progress_update(p, 0);
        T_EXPECT(!qc_progress_rate(p, &rate), "rate known before any time passed");
        T_EXPECT(!qc_progress_eta(p, &eta), "ETA known before any time passed");

        clk.now = 110.0;
        qc_progress_update(p, 100);
        T_EXPECT(qc_progress_rate(p, &rate), "rate unknown after 10 s");
        T_EXPECT_NEAR(rate, 10.0, 1e-9, 0.0, "100 steps in 10 s");
        T_EXPECT(qc_progress_eta(p, &eta), "ETA unknown");
        T_EXPECT_NEAR(eta, 90.0, 1e-9, 0.0, "900 steps left at 10/s");

        clk.now = 120.0;
        qc_progress_update(p, 300);
        qc_progress_rate(p, &rate);
        qc_progress_eta(p, &eta);
        T_EXPECT_NEAR(rate, 15.0, 1e-9, 0.0, "300 steps in 20 s");
        T_EXPECT_NEAR(eta, 700.0 / 15.0, 1e-9, 0.0, "700 steps left at 15/s");

        qc_progress_update(p, 1000);
        T_EXPECT(qc_progress_eta(p, &eta) && eta == 0.0, "ETA at the end is %g", eta);
        qc_progress_update(p, 1200); /* past the total: still 0, never negative */
        T_EXPECT(qc_progress_eta(p, &eta) && eta == 0.0, "ETA past the end is %g", eta);
        qc_progress_destroy(p);

        /* The rate follows the recent speed: a window of QC_PROGRESS_WINDOW 1-s samples. */
        clk.now = 0.0;
        p = make(&cap, &clk, "train", "steps", 100000, QC_PROGRESS_TTY_OFF);
        uint64_t done = 0;
        for (int t = 1; t <= 40; t++) {
            clk.now = t;
            done += 10;
            qc_progress_update(p, done);
        }
        qc_progress_rate(p, &rate);
        T_EXPECT_NEAR(rate, 10.0, 1e-9, 0.0, "steady 10/s");
        for (int t = 41; t <= 40 + QC_PROGRESS_WINDOW; t++) {
            clk.now = t;
            done += 20;
            qc_progress_update(p, done);
        }
        qc_progress_rate(p, &rate);
        T_EXPECT_NEAR(rate, 20.0, 1e-9, 0.0, "after a full window at 20/s");
        qc_progress_eta(p, &eta);
        T_EXPECT_NEAR(eta, (double)(100000 - done) / 20.0, 1e-9, 0.0, "ETA at the new speed");
        /* Updates closer than a second apart do not evict samples. */
        for (int i = 1; i <= 1000; i++) {
            clk.now = 40 + QC_PROGRESS_WINDOW + i * 1e-4;
            qc_progress_update(p, done);
        }
        qc_progress_rate(p, &rate);
        T_EXPECT(rate > 19.0 && rate < 20.0, "rate %g after a burst of same-count updates", rate);
        qc_progress_destroy(p);

        /* Unknown total: a rate but no ETA. */
        clk.now = 0.0;
        p = make(&cap, &clk, "gen", "scenes", 0, QC_PROGRESS_TTY_OFF);
        clk.now = 4.0;
        qc_progress_update(p, 10);
        T_EXPECT(qc_progress_rate(p, &rate) && rate == 2.5, "rate %g", rate);
        T_EXPECT(!qc_progress_eta(p, &eta), "ETA without a total");
        qc_progress_set_total(p, 20);
        T_EXPECT(qc_progress_eta(p, &eta) && eta == 4.0, "ETA %g once the total is known", eta);
        qc_progress_destroy(p);
        capture_close(&cap);
    }
}

static void test_plain(void)
{
    QC_TEST ("progress: plain periodic lines") {
        struct capture cap;
        capture_open(&cap);
        struct fake_clock clk = {0.0};
        struct qc_progress *p = make(&cap, &clk, "train", "steps", 1000, QC_PROGRESS_TTY_OFF);
        qc_progress_set(p, "loss", "%.3f", 1.2344);
        qc_progress_set_bytes(p, "mem", 3435973837ull);
        qc_progress_set_bytes(p, "peak", 4ull << 30);
        int printed = 0;
        for (int t = 1; t <= 25; t++) {
            clk.now = t;
            if (t == 15)
                qc_progress_set(p, "loss", "%.3f", 0.5); /* replaced in place, order kept */
            printed += qc_progress_update(p, (uint64_t)t * 10);
        }
        T_EXPECT_EQ_I64(printed, 2, "lines in 25 s at one per 10 s");
        T_EXPECT_STR_EQ(take(&cap),
                        "train 100/1000 (10%) elapsed 00:10 eta 01:30 10.0 steps/s loss=1.234 "
                        "mem=3.20GiB peak=4.00GiB\n"
                        "train 200/1000 (20%) elapsed 00:20 eta 01:20 10.0 steps/s loss=0.500 "
                        "mem=3.20GiB peak=4.00GiB\n");
        qc_progress_finish(p);
        T_EXPECT_STR_EQ(take(&cap),
                        "train 250/1000 (25%) elapsed 00:25 eta 01:15 10.0 steps/s loss=0.500 "
                        "mem=3.20GiB peak=4.00GiB\n");
        qc_progress_finish(p);
        clk.now = 100.0;
        T_EXPECT(!qc_progress_update(p, 900), "update after finish printed");
        T_EXPECT_STR_EQ(take(&cap), "");
        qc_progress_destroy(p);

        /* interval 0: every update; the final line is not repeated when nothing changed. */
        struct qc_progress_opts o;
        qc_progress_opts_init(&o);
        o.label = "gen";
        o.unit = "scenes";
        o.out = cap.f;
        o.tty = QC_PROGRESS_TTY_OFF;
        o.interval_s = 0.0;
        o.clock = fake_now;
        o.clock_user = &clk;
        clk.now = 0.0;
        T_EXPECT(qc_progress_create(&o, &p) == QC_OK, "create: %s", qc_error_last());
        clk.now = 2.0;
        qc_progress_update(p, 5);
        clk.now = 4.0;
        qc_progress_update(p, 10);
        qc_progress_finish(p);
        T_EXPECT_STR_EQ(take(&cap), "gen 5 scenes elapsed 00:02 2.50 scenes/s\n"
                                    "gen 10 scenes elapsed 00:04 2.50 scenes/s\n");
        qc_progress_destroy(p);

        /* AUTO on a file that is not a terminal gives plain lines. */
        o.tty = QC_PROGRESS_TTY_AUTO;
        o.out = tmpfile();
        T_EXPECT(o.out != NULL, "tmpfile");
        clk.now = 0.0;
        T_EXPECT(qc_progress_create(&o, &p) == QC_OK, "create: %s", qc_error_last());
        clk.now = 1.0;
        qc_progress_update(p, 3);
        qc_progress_finish(p);
        rewind(o.out);
        char line[256] = "";
        T_EXPECT(fgets(line, sizeof line, o.out) != NULL, "nothing written");
        T_EXPECT_STR_EQ(line, "gen 3 scenes elapsed 00:01 3.00 scenes/s\n");
        fclose(o.out);
        qc_progress_destroy(p);
        capture_close(&cap);
    }
}

static void test_tty(void)
{
    QC_TEST ("progress: terminal line") {
        struct capture cap;
        capture_open(&cap);
        struct fake_clock clk = {0.0};
        struct qc_progress *p = make(&cap, &clk, "train", "steps", 1000, QC_PROGRESS_TTY_ON);
        T_EXPECT(qc_progress_update(p, 0), "the first update draws");
        T_EXPECT_STR_EQ(take(&cap), "\rtrain   0% |----------|    0/1000 [00:00<--:--, ? steps/s]"
                                    "\x1b[K");
        clk.now = 0.05;
        T_EXPECT(!qc_progress_update(p, 5), "redrawn within 0.1 s");
        T_EXPECT_STR_EQ(take(&cap), "");
        clk.now = 10.0;
        qc_progress_set(p, "loss", "%.3f", 0.5);
        qc_progress_set_bytes(p, "mem", 1536ull << 20);
        T_EXPECT(qc_progress_update(p, 420), "no redraw after 10 s");
        T_EXPECT_STR_EQ(take(&cap),
                        "\rtrain  42% |####------|  420/1000 [00:10<00:14, 42.0 steps/s]"
                        " loss=0.500 mem=1.50GiB\x1b[K");
        /* clear erases the line; the next update redraws even within the redraw interval */
        qc_progress_clear(p);
        T_EXPECT_STR_EQ(take(&cap), "\r\x1b[K");
        clk.now = 10.01;
        T_EXPECT(qc_progress_update(p, 421), "no redraw after clear");
        take(&cap);
        /* reaching the total always draws */
        clk.now = 10.02;
        T_EXPECT(qc_progress_update(p, 1000), "no draw at 100%%");
        T_EXPECT_STR_EQ(take(&cap),
                        "\rtrain 100% |##########| 1000/1000 [00:10<00:00, 99.8 steps/s]"
                        " loss=0.500 mem=1.50GiB\x1b[K");
        qc_progress_finish(p);
        T_EXPECT_STR_EQ(take(&cap),
                        "\rtrain 100% |##########| 1000/1000 [00:10<00:00, 99.8 steps/s]"
                        " loss=0.500 mem=1.50GiB\x1b[K\n");
        qc_progress_clear(p); /* after finish: nothing */
        T_EXPECT_STR_EQ(take(&cap), "");
        qc_progress_destroy(p);

        /* unknown total: no bar, no percent, no ETA */
        clk.now = 0.0;
        p = make(&cap, &clk, "gen", "scenes", 0, QC_PROGRESS_TTY_ON);
        clk.now = 2.0;
        qc_progress_update(p, 5);
        T_EXPECT_STR_EQ(take(&cap), "\rgen 5 scenes [00:02, 2.50 scenes/s]\x1b[K");
        qc_progress_destroy(p);
        capture_close(&cap);
    }
}

static void test_quiet_and_errors(void)
{
    QC_TEST ("progress: quiet prints nothing") {
        struct capture cap;
        capture_open(&cap);
        struct fake_clock clk = {0.0};
        for (int tty = 0; tty < 2; tty++) {
            clk.now = 0.0;
            struct qc_progress_opts o;
            qc_progress_opts_init(&o);
            o.out = cap.f;
            o.tty = tty ? QC_PROGRESS_TTY_ON : QC_PROGRESS_TTY_OFF;
            o.quiet = true;
            o.interval_s = 0.0;
            o.total = 10;
            o.clock = fake_now;
            o.clock_user = &clk;
            struct qc_progress *p = NULL;
            T_EXPECT(qc_progress_create(&o, &p) == QC_OK, "create: %s", qc_error_last());
            qc_progress_set(p, "loss", "%d", 1);
            for (int i = 1; i <= 10; i++) {
                clk.now = i;
                T_EXPECT(!qc_progress_update(p, (uint64_t)i), "quiet update printed");
            }
            qc_progress_clear(p);
            qc_progress_finish(p);
            double rate = 0.0;
            T_EXPECT(qc_progress_rate(p, &rate) && rate > 0.0, "quiet still measures");
            qc_progress_destroy(p);
        }
        T_EXPECT_STR_EQ(take(&cap), "");
        capture_close(&cap);
    }
    QC_TEST ("progress: field limit and bad options") {
        struct capture cap;
        capture_open(&cap);
        struct fake_clock clk = {0.0};
        struct qc_progress *p = make(&cap, &clk, "x", "steps", 0, QC_PROGRESS_TTY_OFF);
        for (int i = 0; i < QC_PROGRESS_MAX_FIELDS; i++) {
            char name[16];
            snprintf(name, sizeof name, "f%d", i);
            T_EXPECT(qc_progress_set(p, name, "%d", i) == QC_OK, "field %d", i);
        }
        T_EXPECT(qc_progress_set(p, "f3", "%s", "again") == QC_OK, "replacing a field");
        enum qc_status st = qc_progress_set(p, "one_too_many", "%d", 1);
        T_EXPECT(st == QC_ERR_INVALID, "field %d: %s", QC_PROGRESS_MAX_FIELDS + 1,
                 qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "one_too_many");
        qc_progress_destroy(p);
        qc_progress_destroy(NULL);

        struct qc_progress_opts o;
        qc_progress_opts_init(&o);
        o.interval_s = -1.0;
        p = NULL;
        st = qc_progress_create(&o, &p);
        T_EXPECT(st == QC_ERR_INVALID && p == NULL, "negative interval: %s", qc_status_str(st));
        T_EXPECT_STR_CONTAINS(qc_error_last(), "must not be negative");
        capture_close(&cap);
    }
}

int main(void)
{
    test_format();
    test_eta();
    test_plain();
    test_tty();
    test_quiet_and_errors();
    return qc_test_summary();
}
