/*
 * nonfinite_fixture.h — a qcshard whose chosen scenes make the training loss non-finite, for the
 * train.nonfinite tests (tests/test_reliability.c with one rank, tests/test_dist_faults.c with
 * a NaN on one rank only). Header-only; needs qcdata.
 *
 * Scenes are synthetic typical scenes (qc_synth_scene of `seed`, indices 0..n-1); in a poisoned
 * scene the focal agent jumps between ±3e38 m at every observed or predicted step (finite, as
 * the format requires), so every sum over it overflows: a batch holding it has a non-finite loss.
 */
#ifndef QC_TESTS_NONFINITE_FIXTURE_H
#define QC_TESTS_NONFINITE_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "qc_qcshard.h"
#include "qc_synth.h"
#include "testutil.h"

/* Writes n scenes to path; those i with poisoned(i) true get the overflowing focal agent. */
static inline void t_write_nonfinite_qcshard(const char *path, uint64_t seed, int n,
                                             bool (*poisoned)(int i))
{
    struct qc_scene *sc = calloc((size_t)n, sizeof(*sc));
    T_EXPECT(sc != NULL, "out of memory");
    if (!sc)
        return;
    for (int i = 0; i < n; i++) {
        T_EXPECT(qc_synth_scene(seed, i, QC_SYNTH_TYPICAL, &sc[i]) == QC_OK, "%s", qc_error_last());
        if (!poisoned(i))
            continue;
        struct qc_scene bad;
        T_EXPECT(qc_scene_copy(&sc[i], &bad) == QC_OK, "%s", qc_error_last());
        float *pos = (float *)(uintptr_t)bad.position; /* an owned copy: writable */
        for (int64_t a = 0; a < bad.num_agents; a++)
            if (bad.agent_category[a] == 3)
                for (int t = 0; t < QC_SCENE_STEPS; t++)
                    if (bad.valid_mask[a * QC_SCENE_STEPS + t] ||
                        bad.predict_mask[a * QC_SCENE_STEPS + t])
                        pos[(a * QC_SCENE_STEPS + t) * 3] = t % 2 ? 3e38f : -3e38f;
        T_EXPECT(qc_scene_validate(&bad, NULL, 1) == QC_OK, "%s", qc_error_last());
        qc_scene_free(&sc[i]);
        sc[i] = bad;
    }
    T_EXPECT(qc_qcshard_write_file(path, sc, n) == QC_OK, "%s", qc_error_last());
    for (int i = 0; i < n; i++)
        qc_scene_free(&sc[i]);
    free(sc);
}

#endif /* QC_TESTS_NONFINITE_FIXTURE_H */
