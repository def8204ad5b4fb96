# The training module (src/train): schedule, AdamW parity, metrics log, determinism, resume,
# checkpoints, eval; a tiny model on synthetic scenes. test_train_learn (slow): a short run must
# improve held-out minADE clearly.
qc_add_test(test_train SOURCES test_train.c LIBS qctrainer qcmodel qcdata qcconfig LABELS cpu
    TIMEOUT 600 ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_test(NAME test_train_learn COMMAND test_train --learn)
set_tests_properties(test_train_learn PROPERTIES LABELS "cpu;slow" SKIP_RETURN_CODE 77
    TIMEOUT 1200 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
