/*
 * qc_json.h — JSON numbers: the one rule every JSON writer in qctrain follows.
 *
 * JSON has no NaN and no infinity, so `printf("%g")` of a non-finite double ("nan", "-nan",
 * "inf") makes a line no JSON reader accepts. Every number qctrain writes into JSON goes through
 * qc_json_number (or the QC_JSON_NUM shorthand), which writes a finite value with the caller's
 * conversion and a non-finite one as `null` ("not available"):
 *   metrics.jsonl (src/train/metrics.c), eval --json and the "eval" lines (src/train/eval.c),
 *   memory.json (src/train/memory/memreport.c), the model config metadata of checkpoints
 *   (src/model/qcnet_config.c), bench alloc / offload --json (src/bench/).
 * Documents built with cJSON (bench step / ops / loader --json, inspect --json) follow the
 * same rule through cJSON's printer, which writes null for NaN and ±Inf; tests/test_json.c
 * holds both the helper and the installed cJSON to it. The configuration dump writes a
 * non-finite float key as null too (src/config/config_value.c). docs/RELIABILITY.md states the
 * promise.
 */
#ifndef QC_BASE_QC_JSON_H
#define QC_BASE_QC_JSON_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QC_JSON_NUM_MAX 40 /* bytes that hold any number qc_json_number writes ("%.17g") */

/* Writes one double, the only variadic argument, into buf (cap bytes, NUL-terminated, cut like
 * snprintf): with fmt (one floating conversion: "%.9g", "%.6f", ...) when it is finite, as
 * "null" when it is NaN or ±Inf. Returns buf, so it can sit in a printf argument list. */
const char *qc_json_number(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* qc_json_number into a temporary that lives until the end of the enclosing full expression's
 * block: printf("\"loss\":%s", QC_JSON_NUM("%.9g", loss)). */
#define QC_JSON_NUM(fmt, v) qc_json_number((char[QC_JSON_NUM_MAX]){0}, QC_JSON_NUM_MAX, fmt, v)

/* True when text[0, n) is exactly one complete JSON value (object, array, string, number,
 * true, false, null) with nothing but whitespace around it. A strict RFC 8259 check: no NaN,
 * no trailing comma, no control characters in strings. Used to keep only whole records of a
 * log (metrics.jsonl on resume) and by the tests. */
bool qc_json_valid(const char *text, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_JSON_H */
