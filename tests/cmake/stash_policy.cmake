# The stash policies of a step (test_stash_policy.c): keep, offload to the host and NVMe tiers,
# recompute and random mixes give the same bits on the CPU and the emulated device, fused and
# unfused; NVMe read failures inside a step are repaired by recompute.
qc_add_test(test_stash_policy SOURCES test_stash_policy.c
    LIBS qcmodel qcdata qcplan qcoffload qcalloc qckernels m LABELS cpu TIMEOUT 600
    ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
