# Fused edge attention on CUDA (kernels/qc_attn_fused_cuda.h) against the CPU fused path
# (kernels/cpu/attn_fused.c). CUDA builds only.
#   test_attn_fused_cuda_host (cpu): tile plan, O(tile) scratch, and the tile kernels' bodies
#     run on the host, bit for bit against the CPU (one OpenMP thread: the CPU's lane sums then
#     follow the kernels' ascending-edge order).
#   test_attn_fused_cuda (gpu): the launchers on the device; exits 77 without a GPU.
if(QC_HAVE_CUDA)
    qc_add_test(test_attn_fused_cuda SOURCES test_attn_fused_cuda.c
                LIBS qcmodel qckernels qcalloc m LABELS gpu TIMEOUT 300)
    qc_add_test(test_attn_fused_cuda_host SOURCES test_attn_fused_cuda.c
                LIBS qcmodel qckernels qcalloc m LABELS cpu TIMEOUT 300
                ARGS --host ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
endif()
