# The device layer (src/base/device_*.c) and the progress reporter (src/base/progress.c).
# test_device is threaded: label tsan so CI also runs it under ThreadSanitizer. Its device and
# pinned buffers come from the allocator (qcalloc).
qc_add_test(test_device SOURCES test_device.c LIBS qcalloc qcbase LABELS cpu tsan TIMEOUT 120)
qc_add_test(test_progress SOURCES test_progress.c LIBS qcbase LABELS cpu TIMEOUT 60)

# The same generic suite on CUDA device 0; exits 77 (skipped) without a GPU.
add_test(NAME test_device_cuda COMMAND test_device --cuda)
set_tests_properties(test_device_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
