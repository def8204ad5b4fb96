# The smaller faults of issue 25 (docs/RELIABILITY.md): alloc.round below the stash's 64-byte
# alignment, a file size limit (SIGXFSZ), byte-size parsing, report --step, and the messages of
# --weights on a folder without a checkpoint, a budget below the fixed bytes and an unusable
# offload.nvme_dir. Runs the qctrain binary on a 1-scene cpu-smoke configuration.
qc_add_test(test_faults SOURCES test_faults.c LIBS qcconfig qcbase LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_faults qctrain)
if(QC_HAVE_MPI)
    # the ranks-of-one-node case runs 2 ranks under mpirun
    target_compile_definitions(test_faults PRIVATE QC_MPIEXEC="${MPIEXEC_EXECUTABLE}")
endif()
