# The memory system in the training step (test_train_memory.c): policy invariance through the
# trainer on CPU and EMU, budgets down to the minimum plan, admission control (splits, the scene
# that never fits), OOM rollback and re-plan, a mixed epoch under a tight budget, NVMe faults.
# test_train_memory_cuda (label gpu): the invariance on CUDA; exit 77 only without a GPU or a
# CUDA build (tests/cuda_probe.h), a GPU that cannot be used fails. The EMU runs use emulated
# device 1, so the loader's workers must pin their batches there.
qc_add_test(test_train_memory SOURCES test_train_memory.c
    LIBS qctrainer qcmodel qcplan qcoffload qcdata qcconfig m LABELS cpu TIMEOUT 900
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_test(NAME test_train_memory_cuda COMMAND test_train_memory cuda)
set_tests_properties(test_train_memory_cuda PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
    TIMEOUT 900 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
