# The whole QCNet model (src/model/qc_qcnet.h): state_dict table, parity with the official
# PyTorch numbers on tests/data/qcnet-parity-tiny (both attention implementations),
# checkpoints, initialisation, allocation hook, metrics, deterministic training. One thread:
# the tiny config's ops (D 32) are dominated by OpenMP fork/join on a loaded 2-core machine.
# The allocation-failure cases (~80% of the time) run as their own ctest entries, so ctest -j2
# runs them beside the rest; the sanitized builds try fewer failure points (QC_MODEL_HOOK_POINTS).
qc_add_test(test_model SOURCES test_model.c LIBS qcmodel qcdata m LABELS cpu TIMEOUT 600
    ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "QC_TEST_EXCLUDE=failure at each point")
set(qc_model_hook_points 96)
set(qc_model_hook_timeout 600)
if(QC_SANITIZE)
    set(qc_model_hook_points 24)
    set(qc_model_hook_timeout 2400)
endif()
foreach(impl unfused fused)
    add_test(NAME test_model_hook_${impl} COMMAND test_model)
    set_tests_properties(test_model_hook_${impl} PROPERTIES LABELS cpu SKIP_RETURN_CODE 77
        TIMEOUT ${qc_model_hook_timeout} ENVIRONMENT
        "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_WAIT_POLICY=passive;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_FILTER=failure at each point (${impl});QC_MODEL_HOOK_POINTS=${qc_model_hook_points}")
endforeach()
