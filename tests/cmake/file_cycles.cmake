# test_file_cycles: inside each library below, calls between its files go one way (a lower file
# exports, a higher one calls; issue 24): tests/file_cycles.py reads the libraries' objects with
# nm and fails on any cycle of files, naming the symbols of each edge.
# Every folder library is listed: qcmodel was the last (its cycles were qcnet_model.c's
# allocation helpers, now qcnet_buffers.c; qcnet_tape.c <-> qcnet_policy.c, now through
# qcnet_entry.c and qcnet_recompute.c below both; attention_common.c <->
# attention_{fused,unfused}.c, now through attention_index.c). A new library joins the list.
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
    message(FATAL_ERROR "python3 is needed for tests/file_cycles.py (tools/install-deps)")
endif()
set(qc_cycle_free_libs qcalloc qcoffload qckernels qcconfig qcdata qcplan qcmem qcmodel qcreport
    qcdist qctrainer qcprof qctune qcsrc qcbase)
set(qc_cycle_free_files)
foreach(lib ${qc_cycle_free_libs})
    list(APPEND qc_cycle_free_files $<TARGET_FILE:${lib}>)
endforeach()
add_test(NAME test_file_cycles
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/file_cycles.py ${CMAKE_NM}
                 ${qc_cycle_free_files})
set_tests_properties(test_file_cycles PROPERTIES LABELS cpu TIMEOUT 60)
