# The fused attention's edge modes (test_edge_mode.c): tiled against materialised r and dL/dr on
# the CPU and the emulated device (same step-1 loss and gradients but the edge FE's, those within
# a stated tolerance, weights after 3 steps within tolerance), and the configuration checks.
qc_add_test(test_edge_mode SOURCES test_edge_mode.c LIBS qcmodel qcdata qckernels m LABELS cpu
    TIMEOUT 600 ENV OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1)
