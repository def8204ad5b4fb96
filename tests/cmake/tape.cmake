# The model's tape as the memory planner sees it (test_tape.c): the dry run's program
# (qc_qcnet_describe: every block's memory spec replayed) against programs recorded from real
# steps, event for event, and the program checker of src/plan.
#   test_tape (cpu): the CPU and the emulated device, fused and unfused, fp32 and bf16.
#   test_tape_cuda (gpu): a real CUDA step against a dry run for the CUDA target (fused and
#     unfused, fp32 and bf16); exits 77 without a GPU or in a CPU-only build.
qc_add_test(test_tape SOURCES test_tape.c LIBS qcmodel qcdata qcplan qckernels m LABELS cpu
    TIMEOUT 300 ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
qc_add_test(test_tape_cuda SOURCES test_tape.c LIBS qcmodel qcdata qcplan qckernels m LABELS gpu
    TIMEOUT 300 ARGS cuda)
