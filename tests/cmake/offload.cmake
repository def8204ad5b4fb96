# The offload engine (offload/). The threaded executables are labelled tsan (CI runs them under
# ThreadSanitizer); the ones doing spill-file I/O are labelled nvme. They use a private temp dir
# under $TMPDIR or /tmp and skip (77 / per case) only the cases a machine cannot do (io_uring,
# O_DIRECT); under CI=true (.ci/run) those are failures unless the runner opts out explicitly
# (QC_CI_NO_URING=1, QC_CI_NO_O_DIRECT=1; tests/test_offload_common.h, OT_IO_UNAVAILABLE).
# QC_TEST_SIM_NO_URING=1 / QC_TEST_SIM_NO_O_DIRECT=1 make a machine behave as one without.
qc_add_test(test_offload SOURCES test_offload.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme tsan TIMEOUT 300)
qc_add_test(test_offload_nvme SOURCES test_offload_nvme.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme tsan TIMEOUT 300)
qc_add_test(test_offload_faults SOURCES test_offload_faults.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme tsan TIMEOUT 300)
qc_add_test(test_offload_spill SOURCES test_offload_spill.c LIBS qcoffload qcalloc qcbase
            LABELS cpu nvme TIMEOUT 120)
