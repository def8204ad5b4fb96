# docs/RELIABILITY.md's promises (issue 17): the run folder lock, leftovers of a killed save,
# torn metrics records, SIGINT/SIGTERM, non-finite numbers, FIFOs, the saved run folder. Runs
# the qctrain binary (and the trainer in process) on a small cpu-smoke configuration.
qc_add_test(test_reliability SOURCES test_reliability.c
    LIBS qctrainer qcmodel qcdata qcconfig m LABELS cpu TIMEOUT 600
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_reliability qctrain)
