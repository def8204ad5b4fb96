# Crash consistency (docs/RELIABILITY.md): SIGKILL a training run (the qctrain binary, a small
# cpu-smoke configuration, --save-every 1) at least 10 times at fixed-seed moments, some inside
# checkpoint writes, resume each time; the final checkpoint must equal an uninterrupted run's.
# test_kill_budget: the same under device.budget in fp16, 2 scenes a group (issue 25), its own
# entry labelled slow (minutes; the sanitized builds run the unbudgeted case, the same code).
qc_add_test(test_kill SOURCES test_kill.c LIBS qcbase LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_EXCLUDE=under device.budget")
add_dependencies(test_kill qctrain)
add_test(NAME test_kill_budget COMMAND test_kill)
set_tests_properties(test_kill_budget PROPERTIES LABELS "cpu;slow" TIMEOUT 900 ENVIRONMENT
    "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_WAIT_POLICY=passive;QC_CACHE_DIR=${PROJECT_BINARY_DIR}/test-cache;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_FILTER=under device.budget")
