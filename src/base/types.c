/*
 * types.c — the names of qc_types.h's enums, one table each.
 */
#include "qc_types.h"

const char *const qc_precision_names[QC_PREC_COUNT + 1] = {
    [QC_PREC_FP32] = "fp32",
    [QC_PREC_BF16] = "bf16",
    [QC_PREC_FP16] = "fp16",
    [QC_PREC_COUNT] = NULL,
};
