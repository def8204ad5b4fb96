# The stash policies of a step (test_stash_policy.c): keep, offload to the host and NVMe tiers,
# recompute and random mixes give the same bits on the CPU and the emulated device, fused and
# unfused; NVMe read failures inside a step are repaired by recompute.
# The sanitized builds run the lighter form (the same code, fewer numbers: the release build
# checks them all): one seeded mix per case instead of three, and not the fp32 (emu, unfused)
# case (143 s of CI's asan step alone; its bf16 twin and test_train_memory's (emu, unfused)
# run there).
set(qc_sp_env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
if(QC_SANITIZE)
    list(APPEND qc_sp_env QC_STASH_POLICY_MIXES=1 "QC_TEST_EXCLUDE=every policy (emu, unfused)")
endif()
qc_add_test(test_stash_policy SOURCES test_stash_policy.c
    LIBS qcmodel qcdata qcplan qcoffload qcalloc qckernels m LABELS cpu TIMEOUT 600
    ENV ${qc_sp_env})
