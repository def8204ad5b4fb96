# Run folders that remember themselves (issue 30; docs/CHECKPOINTS.md): new runs refuse a
# non-empty folder (--overwrite), --resume and eval --weights RUN take the run's configuration
# and data (run.json) and refuse contradictions and changed data, checkpoint retention
# (train.keep_last / keep_best), the official constructor arguments in qcnet_config, UTF-8
# paths, a stopped run's report; through the built binary (tests/test_runs.py, one ctest test
# per case).
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed for tests/test_runs.py (tools/install-deps)")
endif()
foreach(case new-run resume validation recovered-oom retention metadata utf8 eval stopped)
    add_test(NAME test_runs_${case}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_runs.py
                     $<TARGET_FILE:qctrain> ${PROJECT_BINARY_DIR}/test_runs/${case} ${case})
    set_tests_properties(test_runs_${case} PROPERTIES LABELS cpu TIMEOUT 600
        ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
