# libFuzzer targets (STYLE.md §7). Included before every other tests/cmake/*.cmake file, so any
# module can register its own fuzzer:
#   qc_add_fuzzer(fuzz_<name> SOURCES fuzz/fuzz_<name>.c LIBS <libs>)
# Fuzzers are built only with -DQC_FUZZ=ON and clang (CC=clang), which also instruments every
# library (cmake/QcWarnings.cmake). Each lands in <build>/fuzz/; the target `qc_fuzzers` builds
# them all. A seed corpus lives in tests/fuzz/corpus_<name>/: ctest replays it once (label
# fuzz), and .ci/run fuzzes from it for a bounded number of runs.
if(QC_FUZZ)
    add_custom_target(qc_fuzzers)
endif()

function(qc_add_fuzzer name)
    if(NOT QC_FUZZ)
        return()
    endif()
    cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
    add_executable(${name} ${ARG_SOURCES})
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    target_link_libraries(${name} PRIVATE ${ARG_LIBS})
    target_compile_definitions(${name} PRIVATE
        QC_SOURCE_DIR="${PROJECT_SOURCE_DIR}" QC_BINARY_DIR="${PROJECT_BINARY_DIR}")
    qc_target_warnings(${name})
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer,address)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/fuzz)
    add_dependencies(qc_fuzzers ${name})
    string(REGEX REPLACE "^fuzz_" "" short ${name})
    set(corpus ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus_${short})
    if(EXISTS ${corpus})
        # Replays every seed once (no mutation): the corpus doubles as a regression suite, and
        # the target must report that its inputs reached the checks past the header and index
        # (QC_FUZZ_REQUIRE_RECORD_CHECKS, see tests/fuzz/fuzz_qcshard.c).
        file(GLOB seeds CONFIGURE_DEPENDS ${corpus}/*)
        add_test(NAME ${name}_corpus COMMAND ${name} -runs=0 ${seeds})
        set_tests_properties(${name}_corpus PROPERTIES LABELS "fuzz" TIMEOUT 300
            ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;QC_FUZZ_REQUIRE_RECORD_CHECKS=1")
    endif()
endfunction()
