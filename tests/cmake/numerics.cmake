# fp32 against float64 (issue 29; docs/NUMERICS.md): tools/qcnet_f64.py (NumPy, from Debian's
# python3-numpy via tools/install-deps) checked against the official fp32 outputs and the
# fixture's float64 file, and `qctrain bench numerics` (tests/test_numerics.py).
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed for tests/test_numerics.py (tools/install-deps)")
endif()
foreach(case reference bench)
    add_test(NAME test_numerics_${case}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_numerics.py
                     $<TARGET_FILE:qctrain> ${PROJECT_BINARY_DIR}/test_numerics/${case}
                     ${PROJECT_SOURCE_DIR} ${case})
    set_tests_properties(test_numerics_${case} PROPERTIES LABELS cpu TIMEOUT 600
        ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles")
endforeach()
