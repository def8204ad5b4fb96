/*
 * config_internal.h — shared between the files of src/config (never included from outside).
 *
 * config_options.c holds the table (each key's default as text) and its lookups; config_value.c
 * converts text and JSON values into fields (with range checks), fills the defaults from the
 * table and writes the dump; config_preset.c finds and reads preset files and resolves their
 * inheritance. Calls go one way: value and preset use the table, the table uses neither.
 */
#ifndef QC_CONFIG_CONFIG_INTERNAL_H
#define QC_CONFIG_CONFIG_INTERNAL_H

#include <cJSON.h>

#include "qc_config.h"

/* Stores a JSON value (a preset leaf) into opt's field of cfg. Errors name origin and key. */
enum qc_status config_set_json(struct qc_config *cfg, const struct qc_config_option *opt,
                               const cJSON *item, const char *origin);

/* Parses a size without recording an error: 0 on success, -1 on bad syntax or overflow. */
int config_size_parse(const char *s, uint64_t *out);

/* The message of an unknown key, with a "did you mean" hint when one is close. */
enum qc_status config_unknown_key(const char *origin, const char *key);

#endif /* QC_CONFIG_CONFIG_INTERNAL_H */
