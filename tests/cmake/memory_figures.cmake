# The memory figures docs/BENCHMARKS.md states, held as tests: the fused step's allocator peak
# vs the unfused one's on a fixed scene, and the fragmentation of the fixed-seed allocator
# replay (`qctrain bench alloc`).
qc_add_test(test_memory_figures SOURCES test_memory_figures.c
    LIBS qctrainer qcmodel qcdata qcconfig PkgConfig::CJSON LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_EXCLUDE=run:")
add_dependencies(test_memory_figures qctrain)
# test_memory_figures_run: the same figures of real qctrain runs (the cases named "run:"): the
# README's cpu-smoke run, every step predicted (step 1 included), and 50 cpu-smoke steps on
# mixed scenes, fragmentation <= 1.05. About 2 minutes of training on one core, so `slow`: the
# main build runs it, the sanitized builds (whose allocator is the same code) do not.
set(qc_memfig_run_timeout 900)
if(QC_SANITIZE)
    math(EXPR qc_memfig_run_timeout "${qc_memfig_run_timeout} * 4")
endif()
add_test(NAME test_memory_figures_run COMMAND test_memory_figures)
set_tests_properties(test_memory_figures_run PROPERTIES LABELS "cpu;slow" SKIP_RETURN_CODE 77
    TIMEOUT ${qc_memfig_run_timeout} ENVIRONMENT
    "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_WAIT_POLICY=passive;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;QC_TEST_FILTER=run:")
