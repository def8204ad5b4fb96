# QCNet blocks (src/model): gradient checks, fused vs unfused attention, recompute == store.
qc_add_test(test_blocks SOURCES test_blocks.c LIBS qcmodel m LABELS cpu TIMEOUT 300)
