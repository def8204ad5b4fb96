/*
 * qc_types.h — the enums that structs of several layers store: a run's precision and the
 * device layer's kinds. Here, at the bottom, so that a struct of any library (the configuration,
 * the model's config, the stash, the exec, the tuner's settings) holds the enum itself rather
 * than an int with a comment naming it. Only enums and their names (the name tables in types.c).
 */
#ifndef QC_BASE_QC_TYPES_H
#define QC_BASE_QC_TYPES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The precision of a run's activations and stashes (train.precision, docs/PRECISION.md; the
 * formats and their rounding: kernels/qc_half.h). Master weights, gradients and optimizer
 * moments are fp32 in every precision. */
enum qc_precision {
    QC_PREC_FP32 = 0, /* no rounding */
    QC_PREC_BF16,     /* activations and GEMM inputs rounded to bf16 */
    QC_PREC_FP16,     /* ... to fp16, with dynamic loss scaling */
    QC_PREC_COUNT
};

/* "fp32", "bf16", "fp16", indexed by enum qc_precision and NULL-terminated (types.c): the one
 * list of these names, read by train.precision's choices (config_options.c), qc_precision_str
 * and bench step's --precision. */
extern const char *const qc_precision_names[QC_PREC_COUNT + 1];

/* "fp32" / "bf16" / "fp16" ("?" out of range). */
static inline const char *qc_precision_str(enum qc_precision p)
{
    return (unsigned)p < QC_PREC_COUNT ? qc_precision_names[p] : "?";
}

/* Bytes of one stored activation element: 4 for fp32, 2 for the 16-bit formats. */
static inline size_t qc_precision_elem_bytes(enum qc_precision p)
{
    return p == QC_PREC_FP32 ? 4 : 2;
}

/* The device layer's kinds (qc_device.h). device.kind adds the tests' emulated device to them
 * (enum qc_config_device, qc_config.h). */
enum qc_device_kind { QC_DEVICE_CPU = 0, QC_DEVICE_CUDA, QC_DEVICE_KIND_COUNT };

#ifdef __cplusplus
}
#endif

#endif /* QC_BASE_QC_TYPES_H */
