/*
 * config_testlib.h — the configuration most tests train: the cpu-smoke preset with small radii
 * and time spans (far fewer edges than AV2's, the same code paths; a step of one scene in
 * about a second). The `qctrain` argument form of the same model is t_tiny_train_args in
 * proc_testlib.h. Header-only.
 */
#ifndef QC_TESTS_CONFIG_TESTLIB_H
#define QC_TESTS_CONFIG_TESTLIB_H

#include "qc_config.h"
#include "testutil.h"

/* cfg = the defaults, the cpu-smoke preset, and the small radii and time spans. */
static inline void t_small_smoke_config(struct qc_config *cfg)
{
    qc_config_defaults(cfg);
    if (qc_config_apply_preset(cfg, "cpu-smoke") != QC_OK)
        T_FATAL("preset cpu-smoke: %s", qc_error_last());
    cfg->pl2pl_radius = 30;
    cfg->pl2a_radius = 15;
    cfg->a2a_radius = 15;
    cfg->pl2m_radius = 30;
    cfg->a2m_radius = 30;
    cfg->time_span = 3;
    cfg->num_t2m_steps = 6;
}

#endif /* QC_TESTS_CONFIG_TESTLIB_H */
