# The op dispatch (kernels/qc_exec.h) and the emulated device (src/base/qc_emu.h): the arena,
# the memory moves, and a case table of ops through qc_op_* on EMU, bit-identical to the CPU ops.
qc_add_test(test_exec SOURCES test_exec.c LIBS qckernels qcalloc m LABELS cpu TIMEOUT 300)

# The same case table and memory moves on CUDA device 0, within test_kernels_cuda.c's
# tolerances; exits 77 (skipped) without a GPU or in a CPU-only build.
add_test(NAME test_exec_cuda COMMAND test_exec --cuda)
set_tests_properties(test_exec_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
