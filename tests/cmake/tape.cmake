# The model's tape as the memory planner sees it (test_tape.c): the dry run's program
# (qc_qcnet_describe) against programs recorded from real steps on the CPU and the emulated
# device, fused and unfused, and the program checker of src/plan.
qc_add_test(test_tape SOURCES test_tape.c LIBS qcmodel qcdata qcplan qckernels m LABELS cpu
    TIMEOUT 300 ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
