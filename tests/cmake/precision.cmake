# Mixed precision end to end (docs/PRECISION.md) through the qctrain binary: 20 cpu-smoke steps
# in fp32, bf16 and fp16 (loss within 5 % of fp32's, peak device bytes net of the planner's
# fixed bytes <= 0.75x fp32's), and fp16 loss scaling (a forced overflow skips the step bit for
# bit and halves the scale, the window doubles it, checkpoints and resume keep it; the first
# step's AdamW moments of fp16 equal fp32's within a bound derived from fp16's rounding, so a
# gradient AdamW reads scaled fails). The unit tests of loss_scale.c are test_loss_scale; the
# parity-tiny forward in bf16 / fp16 is in test_model, policy invariance in bf16 in
# test_stash_policy.
find_package(Python3 COMPONENTS Interpreter)
# test_precision_smoke is labelled slow: under ASan its 60 training steps took 796 s of CI's
# asan step (2026-12-03) and run no code that test_precision_scaling, test_stash_policy (bf16)
# and test_model (bf16, fp16) do not; the main build runs it.
foreach(what smoke scaling)
    if(what STREQUAL "smoke")
        set(labels "cpu;slow")
    else()
        set(labels "cpu")
    endif()
    add_test(NAME test_precision_${what}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_precision_run.py ${what}
                     $<TARGET_FILE:qctrain> ${PROJECT_BINARY_DIR}/test_precision_run)
    set_tests_properties(test_precision_${what} PROPERTIES LABELS "${labels}" TIMEOUT 1800
        ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
    # the same on the CUDA device (the tensor-core GEMMs, loss scaling with a forced overflow);
    # exit 77 only without a GPU or a CUDA build (`qctrain version --json`, the rule of
    # tests/cuda_probe.h); a GPU that cannot be used fails
    add_test(NAME test_precision_${what}_cuda
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_precision_run.py ${what}
                     $<TARGET_FILE:qctrain> ${PROJECT_BINARY_DIR}/test_precision_run_cuda cuda)
    set_tests_properties(test_precision_${what}_cuda PROPERTIES LABELS gpu TIMEOUT 900
        SKIP_RETURN_CODE 77 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles")
endforeach()
