# Issue 3's "the motion must be learnable": the constant-velocity baseline of eval on hand-made
# agents (test_learnable, cpu), and test_learnable_slow (cpu;slow): a small model trained on
# generated typical scenes beats constant velocity on held-out minADE (docs/BENCHMARKS.md,
# "Learnability").
qc_add_test(test_learnable SOURCES test_learnable.c LIBS qctrainer qcmodel qcdata qcconfig m
    LABELS cpu TIMEOUT 300 ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_test(NAME test_learnable_slow COMMAND test_learnable --learn)
set_tests_properties(test_learnable_slow PROPERTIES LABELS "cpu;slow" SKIP_RETURN_CODE 77
    TIMEOUT 1200 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
