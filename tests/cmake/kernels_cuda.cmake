# kernels (CUDA): every CUDA op against the CPU reference, a case table per op (label gpu).
# Built only with the CUDA backend; exits 77 (skipped) where no GPU is present.
if(QC_HAVE_CUDA)
    qc_add_test(test_kernels_cuda SOURCES test_kernels_cuda.c LIBS qckernels qcalloc m
                LABELS gpu TIMEOUT 600)
endif()
