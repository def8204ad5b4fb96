# The report module (src/report): the TensorBoard encoding against TensorBoard's own bytes
# (test_tb), the HTML report's data and limits (test_report), and, with python3, a real
# training run rendered by a real browser and read by TensorBoard's EventAccumulator
# (tests/test_report_run.py; chromium-headless-shell and the tensorboard pip package come from
# tools/install-deps, so these run in CI and fail, not skip, when those are missing).
qc_add_test(test_tb SOURCES test_tb.c LIBS qcreport LABELS cpu TIMEOUT 60)
qc_add_test(test_report SOURCES test_report.c LIBS qcsrc PkgConfig::CJSON LABELS cpu TIMEOUT 300)
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed for tests/test_report_run.py (tools/install-deps)")
endif()
set(QC_REPORT_RUN ${PROJECT_BINARY_DIR}/test_report_run)
add_test(NAME test_report_run_setup
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_report_run.py setup
                 $<TARGET_FILE:qctrain> ${QC_REPORT_RUN})
add_test(NAME test_report_browser
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_report_run.py browser
                 $<TARGET_FILE:qctrain> ${QC_REPORT_RUN})
add_test(NAME test_report_tensorboard
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_report_run.py tensorboard
                 ${QC_REPORT_RUN})
set_tests_properties(test_report_run_setup PROPERTIES LABELS cpu TIMEOUT 900
    FIXTURES_SETUP qc_report_run
    ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
set_tests_properties(test_report_browser test_report_tensorboard PROPERTIES LABELS cpu
    TIMEOUT 300 FIXTURES_REQUIRED qc_report_run)
