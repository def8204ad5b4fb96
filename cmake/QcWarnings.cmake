# Compile flags of STYLE.md §11, applied per target through qc_target_warnings().
set(QC_C_WARNINGS
    -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla
    -Wformat=2 -Wundef -Wdouble-promotion -Wcast-qual)

# qc_target_warnings(target [CONVERSION]): the project's C warnings (+ -Wconversion when asked).
function(qc_target_warnings target)
    cmake_parse_arguments(ARG "CONVERSION" "" "" ${ARGN})
    set(flags ${QC_C_WARNINGS})
    if(ARG_CONVERSION)
        list(APPEND flags -Wconversion)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C>:${flags}>)
    target_compile_definitions(${target} PRIVATE QC_DEBUG=${QC_DEBUG} _GNU_SOURCE)
endfunction()

if(QC_SANITIZE)
    if(QC_SANITIZE STREQUAL "thread")
        set(QC_SAN_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
    else()
        set(QC_SAN_FLAGS -fsanitize=${QC_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    endif()
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${QC_SAN_FLAGS}>")
    add_link_options(${QC_SAN_FLAGS})
endif()

# QC_FUZZ=ON: libFuzzer targets (tests/cmake/00_fuzz.cmake). Every library is instrumented for
# coverage and AddressSanitizer so the fuzzers see into the code they call.
if(QC_FUZZ)
    if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
        message(FATAL_ERROR "QC_FUZZ=ON needs clang\nhint: configure with CC=clang CXX=clang++")
    endif()
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address;-fno-omit-frame-pointer>")
    # fuzz-only counters of how deep inputs get (qc_qcshard_fuzz_counters)
    add_compile_definitions(QC_FUZZ_BUILD=1)
    add_link_options(-fsanitize=address)
endif()
