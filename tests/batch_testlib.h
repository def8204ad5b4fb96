/*
 * batch_testlib.h — a batch of generated scenes with its graphs built, as the model tests
 * feed it (tests/test_tape.c, test_stash_policy.c, test_plan.c). Header-only.
 */
#ifndef QC_TESTS_BATCH_TESTLIB_H
#define QC_TESTS_BATCH_TESTLIB_H

#include <stdint.h>

#include "qc_batch.h"
#include "qc_graph.h"
#include "qc_synth.h"

/* Two typical generated scenes of `seed` (scenes 0 and 1) collated into b, with every edge
 * set built (default graph parameters). QC_OK, or the first failure (b then unusable). */
static inline enum qc_status t_synth_batch2(uint64_t seed, struct qc_batch *b)
{
    struct qc_scene sc[2];
    const struct qc_scene *ptr[2] = {&sc[0], &sc[1]};
    enum qc_status rc = QC_OK;
    int made = 0;
    for (; made < 2 && rc == QC_OK; made++)
        rc = qc_synth_scene(seed, made, QC_SYNTH_TYPICAL, &sc[made]);
    if (rc != QC_OK)
        made--; /* the failed one holds nothing */
    if (rc == QC_OK)
        rc = qc_batch_collate(ptr, 2, NULL, true, b);
    for (int i = 0; i < made; i++)
        qc_scene_free(&sc[i]);
    struct qc_graph_builder *gb = NULL;
    struct qc_graph_params gp;
    qc_graph_params_default(&gp);
    if (rc == QC_OK)
        rc = qc_graph_builder_create(&gb);
    if (rc == QC_OK)
        rc = qc_batch_build_graph(b, gb, &gp);
    qc_graph_builder_destroy(gb);
    return rc;
}

#endif /* QC_TESTS_BATCH_TESTLIB_H */
