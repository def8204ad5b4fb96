/*
 * qc_edit_distance.h — the Levenshtein distance behind every "did you mean" hint (config keys
 * and values, presets, command-line options, subcommands, bench targets). In base because the
 * config layer and the command line both use it and config must not depend on cli.
 */
#ifndef QC_BASE_QC_EDIT_DISTANCE_H
#define QC_BASE_QC_EDIT_DISTANCE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Insertions, deletions and substitutions that turn a into b. Strings longer than 256 bytes
 * are "far" from everything: the result is then the longer length. */
int qc_edit_distance(const char *a, const char *b);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_EDIT_DISTANCE_H */
