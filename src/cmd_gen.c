/*
 * cmd_gen.c — `qctrain gen --scenes N --seed S --out FILE [--profile typical|dense|mixed]`:
 * writes N synthetic AV2-like scenes (qc_synth.h) to a qcshard file (docs/QCSHARD.md).
 *
 * Scenes are generated in parallel chunks (OpenMP) and appended in index order, so the file is
 * the same bytes for the same (seed, scenes, profile) on any machine and thread count. The
 * writer is atomic: an interrupted or failed run leaves no FILE behind (only the old one).
 */
#include "qc_cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qc_qcshard.h"
#include "qc_synth.h"

#define GEN_CHUNK 64

static const char gen_usage[] = "--scenes N --out FILE [--seed S] [--profile typical|dense|mixed]";
static const char gen_summary[] =
    "Writes N synthetic Argoverse-2-like scenes (deterministic from the seed) to a qcshard file.";

enum qc_status qc_cmd_gen(struct qc_cli *cli, int argc, char **argv)
{
    int64_t scenes = INT64_MIN, seed = cli->cfg.seed; /* INT64_MIN: --scenes not given */
    const char *out = NULL;
    const char *profile_name =
        qc_synth_profile_name((enum qc_synth_profile)cli->cfg.synthetic_profile);
    char seed_def[32];
    snprintf(seed_def, sizeof(seed_def), "%" PRId64, seed);
    const struct qc_cli_opt opts[] = {
        {"scenes", QC_CLI_INT, &scenes, "", "number of scenes to generate (required, >= 1)"},
        {"out", QC_CLI_STRING, &out, "", "output qcshard file (written atomically)"},
        {"seed", QC_CLI_INT, &seed, seed_def, "seed; the same seed gives the same bytes"},
        {"profile", QC_CLI_STRING, &profile_name, profile_name,
         "scene sizes: typical (A 50-70, P 150-200), dense (A 150-250, P 350-600), mixed "
         "(typical with a heavy tail)"},
    };
    bool help = false;
    QC_TRY(qc_cli_parse("gen", gen_usage, gen_summary, opts, (int)(sizeof(opts) / sizeof(opts[0])),
                        argc, argv, NULL, 0, NULL, &help));
    if (help)
        return QC_OK;
    if (scenes == INT64_MIN)
        return qc_errorf(QC_ERR_INVALID, "qctrain gen: --scenes N is required\nhint: qctrain gen "
                                         "--scenes 100 --out scenes.qcshard");
    if (scenes < 1)
        return qc_errorf(QC_ERR_INVALID,
                         "qctrain gen: --scenes must be at least 1 (got %" PRId64
                         ")\nhint: qctrain gen --scenes 100 --out scenes.qcshard",
                         scenes);
    if (!out || !out[0])
        return qc_errorf(QC_ERR_INVALID,
                         "qctrain gen: --out FILE is required\nhint: qctrain gen "
                         "--scenes %" PRId64 " --out scenes.qcshard",
                         scenes);
    enum qc_synth_profile profile;
    {
        const enum qc_status st = qc_synth_profile_parse(profile_name, &profile);
        if (st != QC_OK)
            return qc_error_wrap(st, "qctrain gen: --profile");
    }

    struct qc_qcshard_writer *w = NULL;
    QC_TRY(qc_qcshard_writer_create(out, &w));
    struct qc_scene *chunk = calloc(GEN_CHUNK, sizeof(*chunk));
    enum qc_status *sts = calloc(GEN_CHUNK, sizeof(*sts));
    if (!chunk || !sts) {
        free(chunk);
        free(sts);
        qc_qcshard_writer_destroy(w);
        return qc_errorf(QC_ERR_NOMEM, "qctrain gen: out of memory");
    }
    enum qc_status st = QC_OK;
    int64_t sum_a = 0, sum_p = 0, sum_pt = 0, max_a = 0, max_p = 0;
    for (int64_t base = 0; base < scenes && st == QC_OK; base += GEN_CHUNK) {
        const int64_t n = scenes - base < GEN_CHUNK ? scenes - base : GEN_CHUNK;
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++)
            sts[i] = qc_synth_scene((uint64_t)seed, base + i, profile, &chunk[i]);
        for (int64_t i = 0; i < n; i++) {
            if (st == QC_OK && sts[i] != QC_OK)
                st = qc_errorf(sts[i], "qctrain gen: scene %" PRId64 " failed to generate",
                               base + i);
            if (st == QC_OK) {
                st = qc_qcshard_writer_append(w, &chunk[i]);
                sum_a += chunk[i].num_agents;
                sum_p += chunk[i].num_polygons;
                sum_pt += chunk[i].num_points;
                max_a = chunk[i].num_agents > max_a ? chunk[i].num_agents : max_a;
                max_p = chunk[i].num_polygons > max_p ? chunk[i].num_polygons : max_p;
            }
            if (sts[i] == QC_OK)
                qc_scene_free(&chunk[i]);
        }
        /* progress about every 10% on big runs */
        const int64_t every = scenes / 10 > GEN_CHUNK ? scenes / 10 : GEN_CHUNK;
        if (!cli->quiet && scenes >= 1000 && st == QC_OK && (base + n) / every != base / every)
            qc_log(QC_LOG_INFO, "gen: %" PRId64 " / %" PRId64 " scenes", base + n, scenes);
    }
    free(chunk);
    free(sts);
    if (st == QC_OK)
        st = qc_qcshard_writer_finish(w);
    qc_qcshard_writer_destroy(w);
    if (st != QC_OK)
        return st;
    if (!cli->quiet)
        printf("wrote %" PRId64 " %s scenes (seed %" PRId64 ") to %s: mean A %.1f (max %" PRId64
               "), mean P %.1f (max %" PRId64 "), Pt/P %.1f\n",
               scenes, qc_synth_profile_name(profile), seed, out, (double)sum_a / (double)scenes,
               max_a, (double)sum_p / (double)scenes, max_p,
               sum_p ? (double)sum_pt / (double)sum_p : 0.0);
    return QC_OK;
}
