# The memory system in the training step (test_train_memory.c): policy invariance through the
# trainer on CPU and EMU, budgets down to the minimum plan (the predicted peak within 3 %),
# admission control (splits, the scene that never fits), OOM rollback and re-plan, a mixed epoch
# under a tight budget, NVMe faults.
# test_train_memory_cuda (label gpu): the invariance on CUDA; exit 77 only without a GPU or a
# CUDA build (tests/cuda_probe.h), a GPU that cannot be used fails. The EMU runs use emulated
# device 1, so the loader's workers must pin their batches there.
# The sanitized builds leave out two of the four invariance cases through the trainer, (cpu,
# unfused) and (emu, fused) (about 150 s of CI's asan step): the same trainer code as (cpu,
# fused) and (emu, unfused), which run, with model paths test_stash_policy runs there; the
# release build runs all four.
set(qc_tm_exclude "threads together")
if(QC_SANITIZE)
    string(APPEND qc_tm_exclude "|checkpoint bytes (cpu, unfused)|checkpoint bytes (emu, fused)")
endif()
qc_add_test(test_train_memory SOURCES test_train_memory.c
    LIBS qctrainer qcmodel qcplan qcoffload qcdata qcconfig m LABELS cpu TIMEOUT 900
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_EXCLUDE=${qc_tm_exclude}")
add_test(NAME test_train_memory_cuda COMMAND test_train_memory cuda)
set_tests_properties(test_train_memory_cuda PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
    TIMEOUT 900 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
# test_train_memory_tsan: its small case of the trainer's threads together (emu: loader threads,
# copy streams, offload prefetch to host and NVMe, recompute; 2 runs of 2 steps), labelled tsan:
# CI's tsan step runs it under ThreadSanitizer (and builds it by its test name: the custom target
# of the same name builds test_train_memory).
set(qc_tm_tsan_timeout 300)
if(QC_SANITIZE)
    math(EXPR qc_tm_tsan_timeout "${qc_tm_tsan_timeout} * 4")
endif()
add_test(NAME test_train_memory_tsan COMMAND test_train_memory)
set_tests_properties(test_train_memory_tsan PROPERTIES LABELS "cpu;tsan" SKIP_RETURN_CODE 77
    TIMEOUT ${qc_tm_tsan_timeout} ENVIRONMENT
    "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_WAIT_POLICY=passive;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_FILTER=threads together")
add_custom_target(test_train_memory_tsan)
add_dependencies(test_train_memory_tsan test_train_memory)
# test_train_memory_beside_tsan: the calibrated plan made on the planning helper thread beside
# admission (its case of test_train_memory, 2 steps of 2 tiny scenes, one compute thread: the
# test hook starts the helper), labelled tsan too.
add_test(NAME test_train_memory_beside_tsan COMMAND test_train_memory)
set_tests_properties(test_train_memory_beside_tsan PROPERTIES LABELS "cpu;tsan" SKIP_RETURN_CODE 77
    TIMEOUT ${qc_tm_tsan_timeout} ENVIRONMENT
    "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_WAIT_POLICY=passive;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_FILTER=beside admission")
add_custom_target(test_train_memory_beside_tsan)
add_dependencies(test_train_memory_beside_tsan test_train_memory)
