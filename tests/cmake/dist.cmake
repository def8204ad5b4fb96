# Data-parallel training (src/dist). test_dist: the pieces that need no second process (shards,
# the static pieces of a reduction, the rank-order sum, launch detection, the sharded optimizer,
# the model's grads-ready reports, the world-size checks of a plain `qctrain train`).
# test_dist_mpi: the qctrain binary under Open MPI's mpirun (2, 3 and 8 oversubscribed ranks on
# the CPU backend): equivalence with gradient accumulation for ZeRO 0/1/2, determinism, bucket
# independence, resume across world sizes, killed and stopped ranks, start-up mismatches.
qc_add_test(test_dist SOURCES test_dist.c LIBS qctrainer qcdist qcmodel qcdata qcconfig
    LABELS cpu TIMEOUT 300 ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_dist qctrain)
if(QC_HAVE_MPI)
    # slow: about 100 s in a Release build and 455 s under AddressSanitizer, so CI's asan step
    # leaves it out; the multi-rank paths run under ASan in test_dist_faults and test_dist_comm
    qc_add_test(test_dist_mpi SOURCES test_dist_mpi.c LIBS qcdata qckernels qcbase LABELS cpu slow
        TIMEOUT 1200 ENV "QC_TEST_EXCLUDE=dist (small)")
    target_compile_definitions(test_dist_mpi PRIVATE QC_MPIEXEC="${MPIEXEC_EXECUTABLE}")
    add_dependencies(test_dist_mpi qctrain)
    # test_dist_mpi_small: its small case (2 ranks x 1 group == 1 rank x 2 groups under ZeRO 2,
    # weights and AdamW moments; two runs of 4 steps) without `slow`, so CI's asan step runs the
    # comparison under AddressSanitizer too
    set(qc_dist_small_timeout 300)
    if(QC_SANITIZE)
        math(EXPR qc_dist_small_timeout "${qc_dist_small_timeout} * 4")
    endif()
    add_test(NAME test_dist_mpi_small COMMAND test_dist_mpi)
    set_tests_properties(test_dist_mpi_small PROPERTIES LABELS cpu SKIP_RETURN_CODE 77
        TIMEOUT ${qc_dist_small_timeout} ENVIRONMENT
        "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_WAIT_POLICY=passive;QC_TEST_FILTER=dist (small)")
    # test_dist_comm: the communicator and its thread with real ranks, no trainer (reductions,
    # heartbeats, the watchdog, the deadline on the waiting phase, the start-up barrier); small
    # enough for ThreadSanitizer (tsan)
    qc_add_test(test_dist_comm SOURCES test_dist_comm.c LIBS qcdist qcbase LABELS cpu tsan
        TIMEOUT 300)
    target_compile_definitions(test_dist_comm PRIVATE QC_MPIEXEC="${MPIEXEC_EXECUTABLE}")
    # test_dist_faults: a run of several ranks when something happens to it (graceful stop on
    # one or every rank, a kill inside a save and the run folder's recovery, train.nonfinite
    # with a NaN on one rank, fp16 loss scaling with a NaN in one rank's shard, a rank that
    # leaves out a collective, only rank 0 writing)
    # The sanitized builds run its fp16 case's 2-rank worlds only (QC_DIST_FAULTS_MAX_RANKS=2:
    # the 3-rank runs were most of its 662 s in the asan step; the release build runs both).
    set(qc_df_env "QC_TEST_EXCLUDE=nonfinite=skip with a NaN loss on rank 1 only")
    if(QC_SANITIZE)
        list(APPEND qc_df_env "QC_DIST_FAULTS_MAX_RANKS=2")
    endif()
    qc_add_test(test_dist_faults SOURCES test_dist_faults.c LIBS qcdata qckernels qcbase LABELS cpu
        TIMEOUT 900 ENV ${qc_df_env})
    target_compile_definitions(test_dist_faults PRIVATE QC_MPIEXEC="${MPIEXEC_EXECUTABLE}")
    add_dependencies(test_dist_faults qctrain)
    # test_dist_faults_tsan: its case of a NaN loss on rank 1 under nonfinite=skip (2 ranks,
    # ZeRO 1, 3 steps saving each: the loader, the communication thread reducing while backward
    # runs, the parameter all-gather, the agreed skip), labelled tsan: CI's tsan step runs the
    # trainer's ranks under ThreadSanitizer (a report makes a rank exit 66, so the job fails).
    # Shared memory between the ranks, as test_dist_comm: Open MPI's TCP transport trips
    # ThreadSanitizer. The custom target of the same name builds it (the tsan step builds its
    # tests by name).
    set(qc_dist_faults_tsan_timeout 300)
    if(QC_SANITIZE)
        math(EXPR qc_dist_faults_tsan_timeout "${qc_dist_faults_tsan_timeout} * 4")
    endif()
    add_test(NAME test_dist_faults_tsan COMMAND test_dist_faults)
    set_tests_properties(test_dist_faults_tsan PROPERTIES LABELS "cpu;tsan" SKIP_RETURN_CODE 77
        TIMEOUT ${qc_dist_faults_tsan_timeout} ENVIRONMENT
        "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_WAIT_POLICY=passive;OMPI_MCA_btl=self,vader;QC_TEST_FILTER=nonfinite=skip with a NaN loss on rank 1 only")
    add_custom_target(test_dist_faults_tsan)
    add_dependencies(test_dist_faults_tsan test_dist_faults)
    # NCCL: 2 ranks on 2 GPUs; exit 77 without a GPU and with one ("skip: one GPU": NCCL refuses
    # two ranks on one GPU; test_dist_nccl covers nccl.c there)
    add_test(NAME test_dist_mpi_cuda COMMAND test_dist_mpi cuda)
    set_tests_properties(test_dist_mpi_cuda PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
        TIMEOUT 1800 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles")
    # test_dist_nccl: the communicator in a world of ONE rank (a singleton MPI), both backends in
    # one process: the NCCL backend on device memory against the MPI backend, error statuses
    # (label gpu; exit 77 without a GPU); test_dist_nccl_cpu: its MPI backend part and the errors
    # that need no GPU, for CI
    qc_add_test(test_dist_nccl SOURCES test_dist_nccl.c LIBS qcdist qcalloc qcbase LABELS gpu
        TIMEOUT 300)
    set(qc_dist_nccl_timeout 120)
    if(QC_SANITIZE)
        math(EXPR qc_dist_nccl_timeout "${qc_dist_nccl_timeout} * 4")
    endif()
    add_test(NAME test_dist_nccl_cpu COMMAND test_dist_nccl cpu)
    set_tests_properties(test_dist_nccl_cpu PROPERTIES LABELS "cpu" SKIP_RETURN_CODE 77
        TIMEOUT ${qc_dist_nccl_timeout})
endif()
