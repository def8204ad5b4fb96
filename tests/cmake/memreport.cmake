# The memory report of a training run (src/train/memory/memreport.c, qc_memreport.h): the formatters
# on a synthetic report, and a tiny 2-step training run whose memory.json / memory.txt must agree
# with the allocator.
qc_add_test(test_memreport SOURCES test_memreport.c
    LIBS qctrainer qcmodel qcdata qcconfig PkgConfig::CJSON LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
