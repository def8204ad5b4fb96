# The memory figures docs/BENCHMARKS.md states, held as tests: the fused step's allocator peak
# vs the unfused one's on a fixed scene, and the fragmentation of the fixed-seed allocator
# replay (`qctrain bench alloc`).
qc_add_test(test_memory_figures SOURCES test_memory_figures.c
    LIBS qctrainer qcmodel qcdata qcconfig PkgConfig::CJSON LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_memory_figures qctrain)
