# cmake --install into a prefix of the test's own: the binary, the presets and the submission
# tool land under it, and the installed qctrain finds a preset of that prefix by name whatever
# the prefix (tests/test_install.py; README, "Install").
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed for tests/test_install.py (tools/install-deps)")
endif()
add_test(NAME test_install
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/test_install.py
                 ${PROJECT_BINARY_DIR} ${PROJECT_BINARY_DIR}/test_install)
set_tests_properties(test_install PROPERTIES LABELS cpu TIMEOUT 300)
