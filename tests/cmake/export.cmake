# The way back to the official tooling (issue 30; docs/EXPORT.md): tools/export_lightning's
# checkpoint read as torch.load and Lightning read it, and eval --predictions +
# tools/av2_submission read back with pyarrow as av2's ChallengeSubmission does, checked against
# AV2's own scenario file (tests/test_export.py). pyarrow comes from tools/install-deps.
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed for tests/test_export.py (tools/install-deps)")
endif()
foreach(case lightning submission)
    add_test(NAME test_export_${case}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_export.py
                     $<TARGET_FILE:qctrain> ${PROJECT_BINARY_DIR}/test_export/${case}
                     ${PROJECT_SOURCE_DIR} ${case})
    set_tests_properties(test_export_${case} PROPERTIES LABELS cpu TIMEOUT 600
        ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
