# The offload engine (offload/). The threaded executables are labelled tsan (CI runs them under
# ThreadSanitizer); the ones doing spill-file I/O are labelled nvme. They use a private temp dir
# under $TMPDIR or /tmp and skip (77 / per case) only the io_uring rungs a machine cannot do.
qc_add_test(test_offload SOURCES test_offload.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme tsan TIMEOUT 300)
qc_add_test(test_offload_nvme SOURCES test_offload_nvme.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme tsan TIMEOUT 300)
qc_add_test(test_offload_faults SOURCES test_offload_faults.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme tsan TIMEOUT 300)
qc_add_test(test_offload_spill SOURCES test_offload_spill.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme TIMEOUT 120)
