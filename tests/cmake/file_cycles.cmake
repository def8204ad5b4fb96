# test_file_cycles: inside each library below, calls between its files go one way (a lower file
# exports, a higher one calls; issue 24): tests/file_cycles.py reads the libraries' objects with
# nm and fails on any cycle of files, naming the symbols of each edge.
# Not yet listed, each for the cycle it still has: qcmodel (qcnet_model.c's allocation helpers,
# qcnet_tape.c <-> qcnet_policy.c, attention_common.c <-> attention_{fused,unfused}.c). A
# library freed of its cycles joins the list.
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed for tests/file_cycles.py (tools/install-deps)")
endif()
set(qc_cycle_free_libs qcalloc qcoffload qckernels qcconfig qcdata qcplan qcmem qcreport qcdist
    qctrainer qcprof qctune qcsrc qcbase)
set(qc_cycle_free_files)
foreach(lib ${qc_cycle_free_libs})
    list(APPEND qc_cycle_free_files $<TARGET_FILE:${lib}>)
endforeach()
add_test(NAME test_file_cycles
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/file_cycles.py ${CMAKE_NM}
                 ${qc_cycle_free_files})
set_tests_properties(test_file_cycles PROPERTIES LABELS cpu TIMEOUT 60)
