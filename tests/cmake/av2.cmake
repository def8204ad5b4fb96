# The AV2 converter (tools/av2_to_qcshard) on the real sample scenario, checked through
# `qctrain inspect --json` against QCNET.md §8.1. Uses pyarrow for the parquet tracks when it is
# installed (pip install pyarrow), else the JSON-lines rendering shipped with the sample; under
# CI=true (.ci/run) a missing pyarrow fails it (tools/install-deps fails first, saying why).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
    add_test(NAME test_av2_convert
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_av2_convert.py
                     $<TARGET_FILE:qctrain> ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests/data)
    set_tests_properties(test_av2_convert PROPERTIES LABELS cpu TIMEOUT 300)
else()
    message(WARNING "python3 not found: test_av2_convert is not registered")
endif()
