# kernels: the CPU reference ops against double-precision references and gradient checks.
qc_add_test(test_kernels_cpu SOURCES test_kernels_cpu.c LIBS qckernels OpenMP::OpenMP_C m
            LABELS cpu TIMEOUT 120)
