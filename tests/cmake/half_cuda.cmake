# The 16-bit CUDA ops (train.precision bf16 / fp16, docs/PRECISION.md) op by op against the CPU
# oracle, at tolerances computed per element from the fp32-accumulation argument
# (tests/test_half_cuda.c):
#   test_half_cuda_host (cpu, every build): the chunk plan of the 16-bit GEMMs
#     (kernels/qc_lowp_gemm.h) and the tolerance machinery against a host simulation of the CUDA
#     algorithm, which must pass, and its mutations (an operand not rounded, truncation, h or
#     the gate gradients rounded, a chunk skipped, a bias lost), which must fail.
#   test_half_cuda (gpu, CUDA builds): the same checks on the CUDA ops: round / pack16 /
#     unpack16 / scale bit for bit, linear forward / dinp / dweight / dbias, GRU sequence and
#     cell forward and backward, bf16 and fp16; exits 77 without a GPU.
qc_add_test(test_half_cuda_host SOURCES test_half_cuda.c LIBS qckernels qcalloc m LABELS cpu TIMEOUT 300
            ARGS --host)
if(QC_HAVE_CUDA)
    qc_add_test(test_half_cuda SOURCES test_half_cuda.c LIBS qckernels qcalloc m LABELS gpu
                TIMEOUT 600)
endif()
