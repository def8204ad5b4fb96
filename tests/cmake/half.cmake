# The 16-bit formats of mixed precision (kernels/qc_half.h) against a double reference, by class
# and over a strided sweep of every fp32 pattern; the round / pack / unpack array ops.
qc_add_test(test_half SOURCES test_half.c LIBS qckernels m LABELS cpu TIMEOUT 120)
