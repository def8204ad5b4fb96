/*
 * test_loss_scale.c — fp16 dynamic loss scaling (src/train/loss_scale.c, docs/PRECISION.md) as a
 * unit, on the CPU exec: the first scale, the resume rule, the gradient seed, the decision after
 * the step's exchange (overflow: skipped, scale halved, gradients untouched; applied: exactly
 * grads[lo, hi) multiplied by 1/scale, nothing outside), the doubling after the window and its
 * cap, the no-op under fp32 / bf16, and the overflow test hook. The end-to-end run of the same
 * logic is test_precision_scaling; this one names the function that is wrong.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loss_scale.h"
#include "qc_config.h"
#include "qc_exec.h"
#include "qc_half.h"
#include "qc_train.h"
#include "train_dist.h"
#include "testutil.h"

#define N_GRADS 64

static struct qc_config config_of(int precision)
{
    struct qc_config cfg;
    qc_config_defaults(&cfg);
    cfg.precision = precision;
    cfg.loss_scale_window = 3;
    return cfg;
}

/* Finite loss terms and no bad gradient: an ordinary step's exchanged figures. */
static struct train_dist_sums finite_sums(void)
{
    struct train_dist_sums s;
    memset(&s, 0, sizeof s);
    s.loss = 3.0;
    s.reg_loss_propose = 1.0;
    s.reg_loss_refine = 1.5;
    s.cls_loss = 0.5;
    s.bad_grad = -1;
    s.bad_grad_rank = -1;
    return s;
}

/* Gradients of varied magnitudes and signs, a few near fp32's extremes, so a unscale that is not
 * the exact power of 2 shows in the bits. */
static void fill_grads(float *g, int n)
{
    uint64_t r = qc_test_seed();
    for (int i = 0; i < n; i++) {
        const double u = (double)(qc_test_rand(&r) >> 11) / 9007199254740992.0; /* [0, 1) */
        g[i] = (float)((i % 2 ? -1.0 : 1.0) * ldexp(1.0 + u, (i % 40) - 20));
    }
    g[1] = 1.0e30f;
    g[2] = -1.0e-30f;
}

static bool same_bits(const float *a, const float *b, int n)
{
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

int main(void)
{
    const struct qc_exec cpu = {.backend = QC_EXEC_CPU};

    QC_TEST ("loss scale: starts at 2^16 under fp16 only; the seed is the scale, else 1") {
        struct qc_config f16 = config_of(QC_PREC_FP16), f32 = config_of(QC_PREC_FP32),
                         b16 = config_of(QC_PREC_BF16);
        T_EXPECT(train_loss_scale_initial(&f16) == 65536.0, "fp16: %g",
                 train_loss_scale_initial(&f16));
        T_EXPECT(train_loss_scale_initial(&f32) == 0.0, "fp32: %g", train_loss_scale_initial(&f32));
        T_EXPECT(train_loss_scale_initial(&b16) == 0.0, "bf16: %g", train_loss_scale_initial(&b16));
        struct qc_train_state st = {.loss_scale = 65536.0};
        T_EXPECT(train_loss_scale_seed(&st) == 65536.0f, "seed %g",
                 (double)train_loss_scale_seed(&st));
        st.loss_scale = 0.0;
        T_EXPECT(train_loss_scale_seed(&st) == 1.0f, "no scale: seed %g",
                 (double)train_loss_scale_seed(&st));
    }

    QC_TEST (
        "loss scale: a resume keeps an fp16 checkpoint's scale, restarts another precision's") {
        struct qc_config f16 = config_of(QC_PREC_FP16), f32 = config_of(QC_PREC_FP32);
        struct qc_train_state st = {.loss_scale = 1024.0, .loss_scale_good = 0};
        train_loss_scale_resumed(&f16, &st);
        T_EXPECT(st.loss_scale == 1024.0, "fp16 checkpoint's scale kept: %g", st.loss_scale);
        st = (struct qc_train_state){.loss_scale = 1.0, .loss_scale_good = 5};
        train_loss_scale_resumed(&f16, &st);
        T_EXPECT(st.loss_scale == 1.0, "scale 1 with counted steps is fp16's own: %g",
                 st.loss_scale);
        st = (struct qc_train_state){.loss_scale = 0.0, .loss_scale_good = 0};
        train_loss_scale_resumed(&f16, &st);
        T_EXPECT(st.loss_scale == 65536.0, "fp32 checkpoint under fp16: %g", st.loss_scale);
        st = (struct qc_train_state){.loss_scale = 0.0, .loss_scale_good = 0};
        train_loss_scale_resumed(&f32, &st);
        T_EXPECT(st.loss_scale == 0.0, "fp32 run: untouched, %g", st.loss_scale);
    }

    QC_TEST ("loss scale: finite gradients are unscaled exactly, in [lo, hi) only") {
        struct qc_config cfg = config_of(QC_PREC_FP16);
        struct train_dist_sums sums = finite_sums();
        const double scales[] = {65536.0, 2.0, 16777216.0, 1.0};
        for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
            float g[N_GRADS], want[N_GRADS];
            fill_grads(g, N_GRADS);
            memcpy(want, g, sizeof g);
            const int64_t lo = 5, hi = 50;
            for (int64_t i = lo; i < hi; i++)
                want[i] = (float)((double)want[i] / scales[k]); /* a power of 2: exact */
            struct qc_train_state st = {.step = 7, .loss_scale = scales[k], .loss_scale_good = 2};
            const bool overflow = train_loss_scale_check(&cfg, &st, &sums, &cpu, g, lo, hi);
            T_EXPECT(!overflow, "scale %g: finite step taken for an overflow", scales[k]);
            T_EXPECT(same_bits(g, want, N_GRADS),
                     "scale %g: gradients not unscaled to the bit "
                     "in [5, 50) and untouched elsewhere",
                     scales[k]);
            for (int i = 0; i < N_GRADS; i++)
                if (g[i] != want[i]) {
                    printf("  first difference: g[%d] = %a, want %a\n", i, (double)g[i],
                           (double)want[i]);
                    break;
                }
            T_EXPECT(st.loss_scale == scales[k] && st.loss_scale_good == 2,
                     "the decision alone changed the scale: %g, good %" PRId64, st.loss_scale,
                     st.loss_scale_good);
        }
    }

    QC_TEST ("loss scale: an overflow skips, halves the scale, restarts the window, keeps grads") {
        struct qc_config cfg = config_of(QC_PREC_FP16);
        struct train_dist_sums sums = finite_sums();
        sums.bad_grad = 17;
        sums.bad_grad_rank = 1;
        float g[N_GRADS], want[N_GRADS];
        fill_grads(g, N_GRADS);
        g[17] = INFINITY;
        memcpy(want, g, sizeof g);
        struct qc_train_state st = {.step = 3, .loss_scale = 65536.0, .loss_scale_good = 2};
        T_EXPECT(train_loss_scale_check(&cfg, &st, &sums, &cpu, g, 0, N_GRADS), "no overflow");
        T_EXPECT(st.loss_scale == 32768.0, "scale %g, want 32768", st.loss_scale);
        T_EXPECT(st.loss_scale_good == 0, "good steps %" PRId64 ", want 0", st.loss_scale_good);
        T_EXPECT(same_bits(g, want, N_GRADS), "an overflowed step's gradients were changed");
        /* halving goes on down to 2, then 1; at 1 a bad gradient is the non-finite policy's */
        st.loss_scale = 2.0;
        T_EXPECT(train_loss_scale_check(&cfg, &st, &sums, &cpu, g, 0, N_GRADS) &&
                     st.loss_scale == 1.0,
                 "scale 2: overflow to 1, got %g", st.loss_scale);
        T_EXPECT(!train_loss_scale_check(&cfg, &st, &sums, &cpu, g, 0, N_GRADS),
                 "scale 1: a non-finite gradient taken for an overflow");
        T_EXPECT(st.loss_scale == 1.0 && same_bits(g, want, N_GRADS),
                 "scale 1: scale %g or gradients changed", st.loss_scale);
    }

    QC_TEST ("loss scale: a non-finite loss term is no overflow and unscales nothing") {
        struct qc_config cfg = config_of(QC_PREC_FP16);
        for (int which = 0; which < 3; which++) {
            struct train_dist_sums sums = finite_sums();
            double *term[] = {&sums.reg_loss_propose, &sums.reg_loss_refine, &sums.cls_loss};
            *term[which] = which == 1 ? (double)NAN : (double)INFINITY;
            sums.bad_grad = 0; /* the gradients are non-finite too, as they would be */
            float g[N_GRADS], want[N_GRADS];
            fill_grads(g, N_GRADS);
            memcpy(want, g, sizeof g);
            struct qc_train_state st = {.loss_scale = 65536.0, .loss_scale_good = 1};
            T_EXPECT(!train_loss_scale_check(&cfg, &st, &sums, &cpu, g, 0, N_GRADS),
                     "term %d: taken for an overflow", which);
            T_EXPECT(st.loss_scale == 65536.0 && st.loss_scale_good == 1,
                     "term %d: scale %g good %" PRId64, which, st.loss_scale, st.loss_scale_good);
            T_EXPECT(same_bits(g, want, N_GRADS), "term %d: gradients changed", which);
        }
    }

    QC_TEST ("loss scale: the window doubles the scale, up to 2^24") {
        struct qc_config cfg = config_of(QC_PREC_FP16); /* window 3 */
        struct qc_train_state st = {.loss_scale = 1024.0};
        train_loss_scale_applied(&cfg, &st);
        train_loss_scale_applied(&cfg, &st);
        T_EXPECT(st.loss_scale == 1024.0 && st.loss_scale_good == 2,
                 "2 of 3 steps: scale %g good %" PRId64, st.loss_scale, st.loss_scale_good);
        train_loss_scale_applied(&cfg, &st);
        T_EXPECT(st.loss_scale == 2048.0 && st.loss_scale_good == 0,
                 "3 of 3 steps: scale %g good %" PRId64, st.loss_scale, st.loss_scale_good);
        st = (struct qc_train_state){.loss_scale = 8388608.0}; /* 2^23 */
        for (int i = 0; i < 9; i++)
            train_loss_scale_applied(&cfg, &st);
        T_EXPECT(st.loss_scale == 16777216.0, "capped at 2^24: %g", st.loss_scale);
    }

    QC_TEST ("loss scale: fp32 and bf16 are untouched by every call") {
        const int precs[] = {QC_PREC_FP32, QC_PREC_BF16};
        for (int k = 0; k < 2; k++) {
            struct qc_config cfg = config_of(precs[k]);
            struct train_dist_sums sums = finite_sums();
            float g[N_GRADS], want[N_GRADS];
            fill_grads(g, N_GRADS);
            memcpy(want, g, sizeof g);
            struct qc_train_state st = {.loss_scale = 0.0};
            T_EXPECT(!train_loss_scale_check(&cfg, &st, &sums, &cpu, g, 0, N_GRADS), "%d", k);
            sums.bad_grad = 3;
            T_EXPECT(!train_loss_scale_check(&cfg, &st, &sums, &cpu, g, 0, N_GRADS),
                     "prec %d: a bad gradient is the non-finite policy's", k);
            for (int i = 0; i < 5; i++)
                train_loss_scale_applied(&cfg, &st);
            setenv("QC_FAULT_GRAD_OVERFLOW_STEP", "1", 1);
            T_EXPECT(train_loss_scale_fault(&cfg, &st, &cpu, g) == QC_OK, "fault hook");
            unsetenv("QC_FAULT_GRAD_OVERFLOW_STEP");
            T_EXPECT(st.loss_scale == 0.0 && st.loss_scale_good == 0 && same_bits(g, want, N_GRADS),
                     "prec %d: scale %g good %" PRId64 " or gradients changed", k, st.loss_scale,
                     st.loss_scale_good);
        }
    }

    QC_TEST ("loss scale: QC_FAULT_GRAD_OVERFLOW_STEP=k puts +Inf in element 0 at step k only") {
        struct qc_config cfg = config_of(QC_PREC_FP16);
        float g[4] = {1.0f, 2.0f, 3.0f, 4.0f};
        struct qc_train_state st = {.step = 0, .loss_scale = 65536.0};
        setenv("QC_FAULT_GRAD_OVERFLOW_STEP", "2", 1);
        T_EXPECT(train_loss_scale_fault(&cfg, &st, &cpu, g) == QC_OK && g[0] == 1.0f,
                 "step 1: g[0] = %g", (double)g[0]);
        st.step = 1; /* the step being run is step + 1 = 2 */
        T_EXPECT(train_loss_scale_fault(&cfg, &st, &cpu, g) == QC_OK && isinf(g[0]) && g[0] > 0,
                 "step 2: g[0] = %g", (double)g[0]);
        T_EXPECT(g[1] == 2.0f && g[2] == 3.0f && g[3] == 4.0f, "other elements changed");
        unsetenv("QC_FAULT_GRAD_OVERFLOW_STEP");
    }

    return qc_test_summary();
}
