# Tests of alloc/ (the caching device allocator, the pinned arena, the trace). The streams test
# is also labelled tsan: CI runs it under ThreadSanitizer.
qc_add_test(test_alloc SOURCES test_alloc.c LIBS qcalloc LABELS cpu TIMEOUT 300)
qc_add_test(test_alloc_streams SOURCES test_alloc_streams.c LIBS qcalloc LABELS "cpu;tsan" TIMEOUT 300)
qc_add_test(test_alloc_pinned SOURCES test_alloc_pinned.c LIBS qcalloc LABELS "cpu;tsan" TIMEOUT 300)
# The CUDA backends (cudaMalloc, VMM expandable segments, cudaHostRegister'ed pinned arena);
# skips without a GPU.
qc_add_test(test_alloc_gpu SOURCES test_alloc_gpu.c LIBS qcalloc LABELS gpu TIMEOUT 300)
